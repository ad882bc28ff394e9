//! The benchmark's report mode (`--report N [--postgres]`): what the operator's and the
//! auditor's commands cost on a ledger of N claims (the pre-filled ledger `--prefill` builds,
//! or `--template`'s). The operator's side: bytes on disk per claim, `status --json`, a worker's
//! start to its exit on one entry, its first `/metrics` scrape and `/healthz`, the copy and its
//! return (`backup`/`restore`; `pg_dump`/`pg_restore` on PostgreSQL). The auditor's: `audit
//! anchor` (signed), then `audit report` against that anchor and key, `audit verify --anchors
//! --public-key`, `verify`, `audit export`, and the independent verifier
//! (`tools/verify-evidence.py`) on the export. With `--postgres` the same ledger is then
//! migrated (`claimgate migrate`, timed) into a private PostgreSQL 15 cluster and everything is
//! measured again there: the table for both ledgers in one sitting. Each command runs as a
//! child (this executable as `claimgate`, or `python3`, `pg_dump`, `pg_restore`), with its wall
//! time, CPU time and peak RSS from wait4(2). A report that does not say VERIFIED, or a
//! verifier that disagrees, fails the benchmark.

use super::{wait4, Opts, Res, AS_CLAIMGATE};
use claimgate::support::localpostgres::LocalPostgres;
use claimgate::support::localredis::{LocalRedis, Options};
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
        super::prefill_in_child(&template, n)?;
    }
    let db = dir.join("ledger.db");
    std::fs::copy(&template, &db).map_err(|e| format!("copying {}: {e}", template.display()))?;
    // On disk before anything is timed: else the first command to fsync the file (a worker's
    // last checkpoint) pays for the whole copy.
    std::fs::File::open(&db)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())?;
    let bytes = std::fs::metadata(&db).map_err(|e| e.to_string())?.len();
    println!("SQLite, on {} ({n} claims):", db.display());
    let sqlite = On {
        db: s(&db),
        dir: dir.join("sqlite"),
        postgres: None,
    };
    sqlite.report(o, n, bytes)?;
    if !o.postgres {
        return Ok(());
    }
    // The same ledger, migrated: what an agency that moves to PostgreSQL brings along. The
    // SQLite copy now holds one claim more (the one-entry worker run above).
    let pg = LocalPostgres::start().map_err(|e| e.to_string())?;
    let url = pg.create_database("report").map_err(|e| e.to_string())?;
    println!(
        "PostgreSQL, a private PostgreSQL 15 cluster on port {} (fsync=on, synchronous_commit=on):",
        pg.port()
    );
    claimgate(
        &sqlite.db,
        "migrate --to (the SQLite ledger above)",
        &["migrate", "--to", &url],
    )?;
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).map_err(|e| e.to_string())?;
    let size: i64 = admin
        .query_one("SELECT pg_database_size(current_database())", &[])
        .map_err(|e| e.to_string())?
        .get(0);
    drop(admin);
    let on_pg = On {
        db: url,
        dir: dir.join("postgres"),
        postgres: Some(&pg),
    };
    on_pg.report(o, n + 1, size as u64)
}

/// One ledger the report runs on, with a directory of its own for the files it writes.
struct On<'p> {
    /// `CLAIMGATE_DB` of every command: the SQLite file's path or the PostgreSQL URL.
    db: String,
    /// Where the anchors, keys, exports and backups go.
    dir: std::path::PathBuf,
    /// The private cluster, when the ledger is PostgreSQL.
    postgres: Option<&'p LocalPostgres>,
}

impl On<'_> {
    /// The operator's side, then the auditor's, on a ledger of `n` claims taking `bytes`.
    fn report(&self, o: &Opts, n: usize, bytes: u64) -> Res<()> {
        let dir = &self.dir;
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        println!(
            "  on disk: {:.1} MB, {:.0} bytes per claim",
            bytes as f64 / 1e6,
            bytes as f64 / n.max(1) as f64
        );
        self.operators_side()?;
        let db = self.db.as_str();
        let key = dir.join("audit-key");
        let (anchors, public, html, export) = (
            dir.join("anchors.jsonl"),
            dir.join("audit-key.pub"),
            dir.join("report.html"),
            dir.join("audit.jsonl"),
        );
        claimgate(db, "keygen", &["audit", "keygen", "--out", &s(&key)])?;
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
            claimgate(db, label, &args)?;
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
        if o.report_skip_verifier {
            return Ok(());
        }
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

    /// What the operator's commands cost on the ledger, each against a private redis-server:
    /// `status --json`, a worker's start to its exit on one entry, a worker's first `/metrics`
    /// scrape and a `/healthz` (after it answers at all), and the copy and its return: `backup`
    /// and `restore` on SQLite, `pg_dump --format=custom` and `pg_restore` into a new database
    /// on PostgreSQL (what `claimgate backup` points its operator to there). What issue 37 asks
    /// to be the same at any ledger size.
    fn operators_side(&self) -> Res<()> {
        let db = self.db.as_str();
        let redis = LocalRedis::start(Options::default()).map_err(|e| e.to_string())?;
        let url = redis.url();
        let with_redis = |cmd: &mut Command| {
            cmd.env("REDIS_URL", &url);
        };
        claimgate_with(db, "status --json", &["status", "--json"], &with_redis)?;
        let mut conn = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .map_err(|e| e.to_string())?;
        // A new award on each ledger: the PostgreSQL one is the SQLite one migrated, and the
        // same submission there would be a duplicate, not a payment.
        let award = if self.postgres.is_some() {
            "R-2"
        } else {
            "R-1"
        };
        redis::cmd("XADD")
            .arg("grants:submissions")
            .arg("*")
            .arg("payload")
            .arg(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":100}}"#
            ))
            .query::<String>(&mut conn)
            .map_err(|e| e.to_string())?;
        claimgate_with(
            db,
            "run --exit-when-idle (one entry)",
            &["run", "--exit-when-idle"],
            &with_redis,
        )?;
        let port = claimgate::support::localredis::free_port().map_err(|e| e.to_string())?;
        let addr = format!("127.0.0.1:{port}");
        let mut worker = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
        worker
            .arg(AS_CLAIMGATE)
            .args(["run", "--metrics-addr", &addr])
            .env_remove("CLAIMGATE_FAILPOINT")
            .env("RUST_LOG", "warn")
            .env("CLAIMGATE_DB", db)
            .env("REDIS_URL", &url)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let started = Instant::now();
        let mut child = worker.spawn().map_err(|e| e.to_string())?;
        let answered = loop {
            if get(&addr, "/healthz").is_ok() {
                break started.elapsed();
            }
            if started.elapsed() > std::time::Duration::from_secs(120) {
                child.kill().ok();
                return Err("the worker's /healthz never answered".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let scrape = Instant::now();
        let metrics = get(&addr, "/metrics");
        let scraped = scrape.elapsed();
        let probe = Instant::now();
        let health = get(&addr, "/healthz");
        let probed = probe.elapsed();
        // SIGTERM: a clean stop, so the file is left closed for `backup` and `restore`.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().map_err(|e| e.to_string())?;
        let metrics = metrics?;
        if !metrics.contains("claimgate_disbursed_cents") {
            return Err("the first scrape had no disbursed total".into());
        }
        health?;
        println!(
            "  run --metrics-addr: /healthz first answered {:>7.1} ms after the start; first /metrics scrape {:>6.1} ms; /healthz {:>5.1} ms",
            answered.as_secs_f64() * 1e3,
            scraped.as_secs_f64() * 1e3,
            probed.as_secs_f64() * 1e3
        );
        match self.postgres {
            None => {
                let copy = self.dir.join("backup.db");
                claimgate_with(db, "backup", &["backup", &s(&copy)], &with_redis)?;
                claimgate_with(db, "restore", &["restore", &s(&copy)], &with_redis)
            }
            Some(pg) => {
                let copy = self.dir.join("ledger.pgdump");
                let bin = pg.bin_dir();
                let mut dump = Command::new(bin.join("pg_dump"));
                dump.args(["--format=custom", "--file", &s(&copy), db]);
                timed("pg_dump --format=custom", dump)?;
                let into = pg.create_database("restored").map_err(|e| e.to_string())?;
                let mut restore = Command::new(bin.join("pg_restore"));
                restore.args(["--exit-on-error", "--dbname", &into, &s(&copy)]);
                timed("pg_restore (into a new database)", restore)
            }
        }
    }
}

/// One HTTP/1.0 GET of `path` from `addr`; the body, if the answer was 200.
fn get(addr: &str, path: &str) -> Res<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    if !answer.starts_with("HTTP/1.1 200") && !answer.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "GET {path}: {}",
            answer.lines().next().unwrap_or("")
        ));
    }
    Ok(answer)
}

/// Runs this executable as `claimgate ARGS` on `db` (a path or a URL) and prints its cost.
fn claimgate(db: &str, label: &str, args: &[&str]) -> Res<()> {
    claimgate_with(db, label, args, &|_| {})
}

/// [`claimgate`], with `more` setting more of the command first.
fn claimgate_with(db: &str, label: &str, args: &[&str], more: &dyn Fn(&mut Command)) -> Res<()> {
    let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    cmd.arg(AS_CLAIMGATE)
        .args(args)
        .env_remove("CLAIMGATE_FAILPOINT")
        .env("RUST_LOG", "warn")
        .env("CLAIMGATE_DB", db);
    more(&mut cmd);
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
            "  {label:<38} {wall:>6.3} s wall  {cpu_s:>6.2} s cpu  peak RSS {:>6.1} MiB",
            rss_kib as f64 / 1024.0
        );
    }
    Ok(())
}

/// A path as the UTF-8 string a command line takes.
fn s(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_owned()
}
