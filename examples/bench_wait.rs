//! What WAIT costs behind Sentinel: `produce`, dead-letter copies and the relay, each with
//! `--redis-wait-replicas 0` and `1`, on a private primary + replica + three sentinels
//! (`claimgate::support::localsentinels`). Every command runs in this process through
//! `claimgate::cli`, as `src/main.rs` would run it, on fresh stream keys and a fresh ledger.
//!
//! `cargo run --release --example bench_wait [-- N]` (N submissions per round, default 20,000;
//! a tenth as many malformed entries for the dead-letter round). Prints entries per second.

use claimgate::support::localsentinels::LocalSentinels;
use clap::Parser;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N: a number of submissions"))
        .unwrap_or(20_000);
    let set = LocalSentinels::start().expect("a sentinel set-up (needs redis-server)");
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "WAIT cost through Sentinel, {n} submissions, {} dead letters per round",
        n / 10
    );
    // Three rounds, alternating, so warm-up and drift fall on both settings alike.
    for (round, wait) in (0..6).map(|i| (i / 2, ["0", "1"][i % 2])) {
        let stream = format!("bench:{round}:{wait}:submissions");
        let db = dir.path().join(format!("ledger-{round}-{wait}.db"));
        let common = |args: &[&str]| -> Vec<String> {
            let mut all: Vec<String> = vec![
                "--redis-url".into(),
                set.url(),
                "--db".into(),
                db.display().to_string(),
                "--stream".into(),
                stream.clone(),
                "--redis-wait-replicas".into(),
                wait.into(),
            ];
            all.extend(args.iter().map(|a| a.to_string()));
            all
        };
        let good = dir.path().join(format!("good-{round}-{wait}.jsonl"));
        let lines: Vec<String> = (0..n).map(submission).collect();
        std::fs::write(&good, lines.join("\n")).unwrap();
        let produce = timed(&common(&["produce", good.to_str().unwrap()]));
        timed(&common(&["run", "--exit-when-idle"]));
        let relay = timed(&common(&[
            "relay",
            "--exit-when-idle",
            "--events-stream",
            &format!("bench:{round}:{wait}:events"),
        ]));
        let bad = dir.path().join(format!("bad-{round}-{wait}.jsonl"));
        let lines: Vec<String> = (0..n / 10).map(|i| format!("not json {i}")).collect();
        std::fs::write(&bad, lines.join("\n")).unwrap();
        timed(&common(&["produce", bad.to_str().unwrap()]));
        let dead = timed(&common(&["run", "--exit-when-idle"]));
        println!(
            "round {round} wait {wait}: produce {:>9.0}/s   relay {:>9.0} events/s   dead letters {:>8.0}/s",
            n as f64 / produce,
            n as f64 / relay,
            (n / 10) as f64 / dead
        );
    }
}

/// Runs `claimgate ARGS` in this process; returns the seconds it took.
fn timed(args: &[String]) -> f64 {
    let cli = claimgate::cli::Cli::parse_from(
        std::iter::once("claimgate".to_owned()).chain(args.iter().cloned()),
    );
    let start = Instant::now();
    if let Err(e) = claimgate::cli::dispatch(cli) {
        panic!("claimgate {args:?}: {e}");
    }
    start.elapsed().as_secs_f64()
}

/// A valid submission, award `B-{i}`.
fn submission(i: usize) -> String {
    format!(
        r#"{{"award_id":"B-{i:07}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{}}}"#,
        100 + i
    )
}
