//! Memory is bounded by bytes, not by entry count: entries far over `--payload-bytes-max` neither
//! swell the worker (peak RSS: the real binary's VmHWM once it has drained the stream; reads are
//! sized by `--read-bytes-max`) nor double in Redis (an oversize dead letter keeps the size,
//! digest and first bytes, not a second full copy); an ordinary load stays small too.

use crate::support::{amount_sum, signal, submission, wait_exit, wait_for, World};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

/// Longest wait for a drain (a condition, not a speed: it only bounds a hung test).
const DRAIN_WAIT: Duration = Duration::from_secs(120);

/// Size of each oversize payload: twice the default 1 MiB limit.
const OVERSIZE_BYTES: usize = 2 << 20;
/// What a dead letter keeps of an oversize payload (`broker::stream::DEAD_LETTER_PREFIX_BYTES`).
const PREFIX_BYTES: usize = 4 * 1024;

/// Runs `claimgate run` as a child until the stream is drained (`n` entries recorded, none
/// pending), reads its peak RSS (VmHWM, in MiB), then stops it with SIGTERM, insisting on exit 0.
///
/// Why VmHWM and not wait4's `ru_maxrss`: the kernel folds the high-water mark of the address
/// space a process had before exec into `ru_maxrss`, and a child spawned from this test process
/// starts from this process's own (which holds the loads of every test running beside it), so
/// `ru_maxrss` measures the test harness as much as the worker. VmHWM is the worker's own
/// address space only, read while it is alive.
fn drain_measured(w: &World, n: u64) -> f64 {
    let mut child = w
        .cmd(&["run", "--claim-idle-ms", "200"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn claimgate");
    let drained = || recorded(w) == n && w.pending() == 0;
    if !wait_for(DRAIN_WAIT, drained) {
        signal(&child, libc::SIGKILL);
        wait_exit(&mut child, DRAIN_WAIT);
        panic!("the worker did not drain the stream");
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, DRAIN_WAIT);
    assert!(status.success(), "worker exit status {status}");
    hwm_kib / 1024.0
}

/// Entries the ledger has recorded, paid or dead-lettered.
fn recorded(w: &World) -> u64 {
    // Polled while the worker starts: 0 until it has made the ledger.
    (w.count_once_made("disbursements") + w.count_once_made("dead_letters")) as u64
}

/// An oversize but otherwise well-formed payload for award `BIG-{i}`.
fn oversize(i: usize) -> String {
    let head = format!(
        r#"{{"award_id":"BIG-{i:04}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":100,"note":""#
    );
    let pad = OVERSIZE_BYTES - head.len() - 2;
    format!("{head}{}\"}}", "x".repeat(pad))
}

#[test]
fn oversize_entries_are_dead_lettered_as_digests_and_peak_rss_stays_under_192_mib() {
    // 1. 300 valid entries with 150 entries of 2 MiB among them (one after every second).
    // 2. Drain with the real binary; read its peak RSS (reads are sized by --read-bytes-max).
    // 3. Every valid entry paid once; every oversize one dead-lettered once, as its size,
    //    SHA-256 and first 4 KiB, with no full copy in Redis; replay refuses it.
    let w = World::new();
    let (valid_n, big_n) = (300, 150);
    let mut big_ids = HashMap::new();
    for i in 0..valid_n {
        w.add(&[submission(i)]);
        if i % 2 == 1 && big_ids.len() < big_n {
            let id = w.add(&[oversize(i)]).pop().unwrap();
            big_ids.insert(id, i);
        }
    }
    let rss_mib = drain_measured(&w, (valid_n + big_n) as u64);
    eprintln!("peak RSS draining {valid_n} valid and {big_n} entries of 2 MiB: {rss_mib:.1} MiB");

    assert_eq!(w.count("disbursements"), valid_n as i64);
    let paid = w.sql_i64("SELECT SUM(amount_cents) FROM disbursements");
    assert_eq!(paid, amount_sum(valid_n));
    assert_eq!(w.pending(), 0);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), big_n, "one dead letter per oversize entry");
    let text = |d: &HashMap<String, Vec<u8>>, k: &str| String::from_utf8(d[k].clone()).unwrap();
    for d in &dead {
        let id = text(d, "original_id");
        let payload = oversize(big_ids[&id]);
        assert_eq!(text(d, "reason_code"), "payload_too_large");
        assert_eq!(
            text(d, "truncated.payload.bytes"),
            OVERSIZE_BYTES.to_string()
        );
        let digest: String = Sha256::digest(payload.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(text(d, "truncated.payload.sha256"), digest);
        assert_eq!(
            d["truncated.payload.prefix"],
            payload.as_bytes()[..PREFIX_BYTES]
        );
        assert_eq!(text(d, "original_fields_truncated"), "1");
        assert!(!d.contains_key("original.payload"), "no full copy of {id}");
    }
    let mut conn = w.conn();
    let dead_bytes: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("grants:submissions:dead")
        .arg("SAMPLES")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    eprintln!("dead-letter stream: {dead_bytes} bytes in Redis for {big_n} oversize entries");
    assert!(
        dead_bytes < (big_n * 16 * 1024) as u64,
        "the dead letters hold {dead_bytes} bytes: more than their summaries"
    );
    let first = text(&dead[0], "original_id");
    let out = w.run(&["dlq", "replay", &first]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be replayed"), "{err}");
    assert_eq!(w.xlen("grants:submissions"), (valid_n + big_n) as u64);
    let shown = String::from_utf8(w.run_ok(&["dlq", "show", &first]).stdout).unwrap();
    assert!(shown.contains("truncated.payload.sha256: "), "{shown}");
    assert!(shown.contains("not replayable"), "{shown}");
    assert!(rss_mib < 192.0, "peak RSS {rss_mib:.1} MiB");
}

#[test]
fn an_ordinary_load_drains_with_peak_rss_under_64_mib() {
    // 1. 20,000 valid entries. 2. Drain with the real binary. 3. All paid once, RSS bounded.
    let w = World::new();
    let n = 20_000;
    let mut conn = w.conn();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.cmd("XADD")
                .arg("grants:submissions")
                .arg("*")
                .arg("payload")
                .arg(submission(i))
                .ignore();
        }
        pipe.query::<()>(&mut conn).unwrap();
    }
    let rss_mib = drain_measured(&w, n as u64);
    eprintln!("peak RSS draining {n} ordinary entries: {rss_mib:.1} MiB");
    assert_eq!(w.count("disbursements"), n as i64);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(n)
    );
    assert_eq!(w.pending(), 0);
    assert!(rss_mib < 64.0, "peak RSS {rss_mib:.1} MiB");
}
