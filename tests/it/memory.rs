//! Memory is bounded by bytes, whatever the producer writes: the real worker's peak RSS
//! (VmHWM, read once it has drained the stream) stays within `--read-bytes-max` plus the
//! constant README.md states, for every shape issue 39 named — an ordinary load, oversize
//! payloads among valid ones, steady light entries and then a wall of heavy ones, one giant
//! entry of almost 512 MiB, entries of 300,000 fields. An entry over its limits never crosses
//! the wire whole: its dead letter keeps its size, SHA-1 and first bytes, computed by Redis, and
//! Redis holds no second full copy of it.

use crate::support::{amount_sum, signal, submission, wait_exit, wait_for, World};
use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

/// Longest wait for a drain (a condition, not a speed: it only bounds a hung test).
const DRAIN_WAIT: Duration = Duration::from_secs(300);

/// Size of each oversize payload: twice the default 1 MiB limit.
const OVERSIZE_BYTES: usize = 2 << 20;
/// What a dead letter keeps of an oversize field (`broker::dead_letter::DEAD_LETTER_PREFIX_BYTES`).
const PREFIX_BYTES: usize = 4 * 1024;

/// The bound README.md states on the worker's peak RSS, in MiB: `--read-bytes-max` plus the
/// constant (`MEMORY_CONSTANT_MIB`).
fn bound_mib(read_bytes_max: usize) -> f64 {
    read_bytes_max as f64 / (1 << 20) as f64 + MEMORY_CONSTANT_MIB
}

/// The default `--read-bytes-max`, 4 MiB.
const DEFAULT: usize = claimgate::config::READ_BYTES_MAX_DEFAULT;

/// The constant in README.md's bound: the binary, its threads, the allocator, SQLite's page
/// cache and what one entry of the largest accepted size costs beside its budgeted bytes while
/// it is parsed, copied to the dead letters or buffered by the Redis client (at the default
/// `--payload-bytes-max`).
const MEMORY_CONSTANT_MIB: f64 = 64.0;

/// Runs `claimgate run` as a child until the stream is drained (`n` entries recorded, none
/// pending), reads its peak RSS (VmHWM, in MiB), then stops it with SIGTERM, insisting on exit 0.
///
/// Why VmHWM and not wait4's `ru_maxrss`: the kernel folds the high-water mark of the address
/// space a process had before exec into `ru_maxrss`, and a child spawned from this test process
/// starts from this process's own (which holds the loads of every test running beside it), so
/// `ru_maxrss` measures the test harness as much as the worker. VmHWM is the worker's own
/// address space only, read while it is alive.
fn drain_measured(w: &World, n: u64, read_bytes_max: usize) -> f64 {
    let budget = read_bytes_max.to_string();
    let mut child = w
        .cmd(&["run", "--claim-idle-ms", "200", "--read-bytes-max", &budget])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn claimgate");
    let drained = || recorded(w) == n && w.pending() == 0;
    if !wait_for(DRAIN_WAIT, drained) {
        signal(&child, libc::SIGKILL);
        wait_exit(&mut child, DRAIN_WAIT);
        panic!(
            "the worker did not drain the stream: {} of {n} recorded",
            recorded(w)
        );
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

/// Asserts the worker's peak RSS for `shape`, drained under `--read-bytes-max
/// read_bytes_max`, is within the bound, after printing it.
fn assert_within_bound(shape: &str, rss_mib: f64, read_bytes_max: usize) {
    let bound = bound_mib(read_bytes_max);
    eprintln!("peak RSS, {shape}: {rss_mib:.1} MiB (bound {bound:.1} MiB)");
    assert!(
        rss_mib <= bound,
        "{shape}: peak RSS {rss_mib:.1} MiB over the bound of {bound:.1} MiB"
    );
}

/// An oversize but otherwise well-formed payload for award `BIG-{i}`.
fn oversize(i: usize) -> String {
    let head = format!(
        r#"{{"award_id":"BIG-{i:04}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":100,"note":""#
    );
    let pad = OVERSIZE_BYTES - head.len() - 2;
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// The lowercase hex SHA-1 of `text` (redis-rs computes a script's SHA-1 the way Redis does).
fn sha1_hex(text: &str) -> String {
    redis::Script::new(text).get_hash().to_owned()
}

/// A dead letter's field as text.
fn text(d: &HashMap<String, Vec<u8>>, k: &str) -> String {
    String::from_utf8(d.get(k).cloned().unwrap_or_else(|| panic!("no field {k}"))).unwrap()
}

/// XADDs `n` fields-lists built by `fields(i)`, a thousand per pipeline.
fn add_many(w: &World, n: usize, fields: impl Fn(usize) -> Vec<(String, Vec<u8>)>) {
    let mut conn = w.conn();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let cmd = pipe.cmd("XADD").arg("grants:submissions").arg("*");
            for (k, v) in fields(i) {
                cmd.arg(k).arg(v);
            }
            cmd.ignore();
        }
        pipe.query::<()>(&mut conn).unwrap();
    }
}

/// Bytes Redis holds for the dead-letter stream.
fn dead_letter_bytes(w: &World) -> u64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("grants:submissions:dead")
        .arg("SAMPLES")
        .arg(0)
        .query(&mut w.conn())
        .unwrap()
}

#[test]
fn oversize_entries_are_dead_lettered_as_digests_and_peak_rss_stays_within_the_bound() {
    // 1. 300 valid entries with 150 entries of 2 MiB among them (one after every second).
    // 2. Drain with the real binary; read its peak RSS.
    // 3. Every valid entry paid once; every oversize one dead-lettered once, as its size,
    //    SHA-1 and first 4 KiB, with no full copy in Redis; replay refuses it.
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
    let rss_mib = drain_measured(&w, (valid_n + big_n) as u64, DEFAULT);
    assert_within_bound(
        &format!("{valid_n} valid and {big_n} entries of 2 MiB"),
        rss_mib,
        DEFAULT,
    );

    assert_eq!(w.count("disbursements"), valid_n as i64);
    let paid = w.sql_i64("SELECT SUM(amount_cents) FROM disbursements");
    assert_eq!(paid, amount_sum(valid_n));
    assert_eq!(w.pending(), 0);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), big_n, "one dead letter per oversize entry");
    for d in &dead {
        let id = text(d, "original_id");
        let payload = oversize(big_ids[&id]);
        assert_eq!(text(d, "reason_code"), "payload_too_large");
        assert_eq!(
            text(d, "truncated.payload.bytes"),
            OVERSIZE_BYTES.to_string()
        );
        assert_eq!(text(d, "truncated.payload.sha1"), sha1_hex(&payload));
        assert_eq!(
            d["truncated.payload.prefix"],
            payload.as_bytes()[..PREFIX_BYTES]
        );
        assert_eq!(text(d, "original_fields_truncated"), "1");
        assert!(!d.contains_key("original.payload"), "no full copy of {id}");
    }
    let dead_bytes = dead_letter_bytes(&w);
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
    assert!(shown.contains("truncated.payload.sha1: "), "{shown}");
    assert!(shown.contains("not replayable"), "{shown}");
}

#[test]
fn an_ordinary_load_drains_within_the_bound() {
    // 1. 20,000 valid entries. 2. Drain with the real binary. 3. All paid once, RSS bounded.
    let w = World::new();
    let n = 20_000;
    add_many(&w, n, |i| {
        vec![("payload".into(), submission(i).into_bytes())]
    });
    let rss_mib = drain_measured(&w, n as u64, DEFAULT);
    assert_within_bound(&format!("{n} ordinary entries"), rss_mib, DEFAULT);
    assert_eq!(w.count("disbursements"), n as i64);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(n)
    );
    assert_eq!(w.pending(), 0);
}

#[test]
fn a_wall_of_heavy_entries_after_light_ones_drains_within_the_bound() {
    wall_of_heavy_entries(DEFAULT);
}

#[test]
fn a_wall_of_heavy_entries_drains_within_a_larger_budget_and_its_bound() {
    // The bound follows the budget: eight times the default, the same wall.
    wall_of_heavy_entries(8 * DEFAULT);
}

/// Issue 39's first reproduction, made harder: light entries teach a reader that sizes its
/// COUNT from what it saw to ask for 1,024 at a time (64, 128, 256, 512, then 1,024 three
/// times: 4,032 entries); then the wall.
/// 1. 4,032 light submissions; then 400 submissions each with a tiny valid payload and a
///    second field of 900,000 bytes (under every limit: they are paid); then 32 entries whose
///    second field holds 16 MiB (over the field limit: dead-lettered, never read whole).
/// 2. Drain with the real binary under `--read-bytes-max read_bytes_max`: peak RSS within the
///    bound (377 MB for the 400 alone before issue 39).
/// 3. 4,432 paid once; 32 dead letters `field_too_large` keeping the big field as its size,
///    SHA-1 and first 4 KiB and the payload whole.
fn wall_of_heavy_entries(read_bytes_max: usize) {
    let w = World::new();
    let (light, heavy, huge) = (4_032, 400, 32);
    let note = vec![b'n'; 900_000];
    let blob = "b".repeat(16 << 20);
    add_many(&w, light, |i| {
        vec![("payload".into(), submission(i).into_bytes())]
    });
    add_many(&w, heavy, |i| {
        vec![
            ("payload".into(), submission(light + i).into_bytes()),
            ("note".into(), note.clone()),
        ]
    });
    add_many(&w, huge, |i| {
        vec![
            ("payload".into(), submission(light + heavy + i).into_bytes()),
            ("blob".into(), blob.clone().into_bytes()),
        ]
    });
    let rss_mib = drain_measured(&w, (light + heavy + huge) as u64, read_bytes_max);
    assert_within_bound(
        &format!(
            "{light} light entries, then {heavy} of 900 KB, then {huge} of 16 MiB, \
             --read-bytes-max {read_bytes_max}"
        ),
        rss_mib,
        read_bytes_max,
    );

    assert_eq!(w.count("disbursements"), (light + heavy) as i64);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(light + heavy)
    );
    assert_eq!(w.pending(), 0);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), huge);
    let digest = sha1_hex(&blob);
    for d in &dead {
        assert_eq!(text(d, "reason_code"), "field_too_large");
        assert!(text(d, "reason").starts_with("field \"blob\" is 16777216 bytes"));
        assert_eq!(text(d, "truncated.blob.bytes"), (16 << 20).to_string());
        assert_eq!(text(d, "truncated.blob.sha1"), digest);
        assert_eq!(d["truncated.blob.prefix"], blob.as_bytes()[..PREFIX_BYTES]);
        assert!(text(d, "original.payload").starts_with("{\"award_id\""));
    }
}

#[test]
fn one_giant_entry_of_almost_512_mib_drains_within_the_bound() {
    // 1. A valid submission, one entry whose payload is 512 MiB less 1 KiB (Redis takes up to
    //    512 MiB in one value), another valid submission.
    // 2. Drain with the real binary: peak RSS within the bound.
    // 3. Both valid ones paid; the giant dead-lettered `payload_too_large` as its size, SHA-1
    //    and first 4 KiB.
    let w = World::new();
    w.add(&[submission(0)]);
    let giant_bytes = (512 << 20) - 1024;
    let head = r#"{"award_id":"GIANT","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1,"pad":""#;
    let mut giant = String::with_capacity(giant_bytes);
    giant.push_str(head);
    giant.push_str(&"g".repeat(giant_bytes - head.len() - 2));
    giant.push_str("\"}");
    let digest = sha1_hex(&giant);
    let prefix = giant.as_bytes()[..PREFIX_BYTES].to_vec();
    w.add_fields(&[("payload", giant.as_bytes())]);
    drop(giant);
    w.add(&[submission(1)]);
    let rss_mib = drain_measured(&w, 3, DEFAULT);
    assert_within_bound("one entry of 512 MiB less 1 KiB", rss_mib, DEFAULT);

    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(w.pending(), 0);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(text(d, "reason_code"), "payload_too_large");
    assert_eq!(text(d, "truncated.payload.bytes"), giant_bytes.to_string());
    assert_eq!(text(d, "truncated.payload.sha1"), digest);
    assert_eq!(d["truncated.payload.prefix"], prefix);
    assert!(dead_letter_bytes(&w) < 64 * 1024);
}

#[test]
fn entries_of_300000_fields_drain_within_the_bound() {
    // 1. Valid submissions around four entries of 300,000 small fields each (the first field
    //    a valid payload).
    // 2. Drain with the real binary: peak RSS within the bound.
    // 3. The valid ones paid; each wide entry dead-lettered `too_many_fields`, its dead letter
    //    showing its first fields and saying how many it left out.
    let w = World::new();
    let (wide, fields) = (4, 300_000);
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    for i in 0..wide {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("grants:submissions").arg("*");
        cmd.arg("payload").arg(submission(100 + i));
        for f in 1..fields {
            cmd.arg(format!("f{f}")).arg("v");
        }
        let _: String = cmd.query(&mut w.conn()).unwrap();
    }
    w.add(&(10..20).map(submission).collect::<Vec<_>>());
    let rss_mib = drain_measured(&w, (20 + wide) as u64, DEFAULT);
    assert_within_bound(
        &format!("{wide} entries of {fields} fields"),
        rss_mib,
        DEFAULT,
    );

    assert_eq!(w.count("disbursements"), 20);
    assert_eq!(w.pending(), 0);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), wide);
    let shown = claimgate::config::CUT_FIELDS_SHOWN_MAX;
    for d in &dead {
        assert_eq!(text(d, "reason_code"), "too_many_fields");
        assert_eq!(
            text(d, "reason"),
            format!("entry has {fields} fields, over the limit of 1000")
        );
        assert!(text(d, "original.payload").starts_with("{\"award_id\""));
        assert_eq!(
            text(d, "original_fields_omitted"),
            (fields - shown).to_string()
        );
    }
}
