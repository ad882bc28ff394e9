//! The benchmark's report mode (`--report N`): what the auditor's side costs on a ledger of N
//! claims (the pre-filled ledger `--prefill` builds, or `--template`'s): `audit anchor` (signed),
//! then `audit report` against that anchor and key, `audit verify --anchors --public-key`,
//! `verify`, `audit export`, and the independent verifier (`tools/verify-evidence.py`) on the
//! export. Each runs as a child (this executable as `claimgate`, or `python3`), with its wall
//! time, CPU time and peak RSS from wait4(2). A report that does not say VERIFIED, or a
//! verifier that disagrees, fails the benchmark.

use super::{prefill, wait4, Opts, Res, AS_CLAIMGATE};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The verifier as shipped.
const VERIFIER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/verify-evidence.py");

pub fn run(o: &Opts, n: usize) -> Res<()> {
    let work = tempfile::Builder::new()
        .prefix("claimgate-bench-report-")
        .tempdir_in(&o.dir)
        .map_err(|e| e.to_string())?;
    let dir = work.path();
    let template = o
        .template
        .clone()
        .unwrap_or_else(|| dir.join("report-template.db"));
    if !template.exists() {
        let started = Instant::now();
        prefill(&template, n)?;
        println!(
            "prefilled a ledger with {n} claims in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }
    let db = dir.join("ledger.db");
    std::fs::copy(&template, &db).map_err(|e| format!("copying {}: {e}", template.display()))?;
    let key = dir.join("audit-key");
    let s = |p: &Path| p.to_str().expect("a UTF-8 path").to_owned();
    let (anchors, public, html, export) = (
        dir.join("anchors.jsonl"),
        dir.join("audit-key.pub"),
        dir.join("report.html"),
        dir.join("audit.jsonl"),
    );
    println!("on {} ({n} claims):", db.display());
    claimgate(&db, "keygen", &["audit", "keygen", "--out", &s(&key)])?;
    let steps: [(&str, Vec<String>); 5] = [
        (
            "audit anchor --signing-key",
            vec![
                "audit".into(),
                "anchor".into(),
                "--out".into(),
                s(&anchors),
                "--signing-key".into(),
                s(&key),
            ],
        ),
        (
            "audit report --anchors --public-key",
            vec![
                "audit".into(),
                "report".into(),
                "--out".into(),
                s(&html),
                "--anchors".into(),
                s(&anchors),
                "--public-key".into(),
                s(&public),
            ],
        ),
        (
            "audit verify --anchors --public-key",
            vec![
                "audit".into(),
                "verify".into(),
                "--anchors".into(),
                s(&anchors),
                "--public-key".into(),
                s(&public),
            ],
        ),
        ("verify", vec!["verify".into()]),
        (
            "audit export",
            vec!["audit".into(), "export".into(), "--out".into(), s(&export)],
        ),
    ];
    for (label, args) in &steps {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        claimgate(&db, label, &args)?;
    }
    let page = std::fs::read_to_string(&html).map_err(|e| e.to_string())?;
    if !page.contains(r#"data-figure="verdict" data-value="verified""#) {
        return Err("the report does not say VERIFIED".into());
    }
    println!(
        "  report file: {:.1} KiB; export: {:.1} MiB",
        page.len() as f64 / 1024.0,
        std::fs::metadata(&export).map_err(|e| e.to_string())?.len() as f64 / 1048576.0
    );
    let mut verifier = Command::new("python3");
    verifier.arg(VERIFIER).args([
        "--export",
        &s(&export),
        "--anchors",
        &s(&anchors),
        "--public-key",
        &s(&public),
    ]);
    timed("verify-evidence.py (python3)", verifier)
}

/// Runs this executable as `claimgate ARGS` on `db` and prints its cost.
fn claimgate(db: &Path, label: &str, args: &[&str]) -> Res<()> {
    let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    cmd.arg(AS_CLAIMGATE)
        .args(args)
        .env_remove("CLAIMGATE_FAILPOINT")
        .env("RUST_LOG", "warn")
        .env("CLAIMGATE_DB", db);
    timed(label, cmd)
}

/// Runs `cmd` to completion and prints its wall time, CPU time and peak RSS; fails if it
/// exited non-zero.
fn timed(label: &str, mut cmd: Command) -> Res<()> {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("{label}: {e}"))?;
    let (status, rss_kib, cpu_s) = wait4(child.id())?;
    let wall = started.elapsed().as_secs_f64();
    if status != 0 {
        return Err(format!("{label} exited with status {status}"));
    }
    if label != "keygen" {
        println!(
            "  {label:<38} {wall:>6.2} s wall  {cpu_s:>6.2} s cpu  peak RSS {:>6.1} MiB",
            rss_kib as f64 / 1024.0
        );
    }
    Ok(())
}
