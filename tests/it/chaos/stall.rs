//! A stall is not a failure: entries a live worker is still committing stay with it.
//!
//! Found by the chaos run: while a commit waited on a locked ledger, the other workers took the
//! waiting entries over with XAUTOCLAIM every `claim_idle_ms`, each take-over counted as a
//! delivery and did the work again, and with enough workers valid submissions crossed
//! `--max-deliveries` and were dead-lettered although nothing had failed. The worker's
//! heartbeat (XCLAIM JUSTID of its in-flight entries) keeps them fresh instead.

use crate::support::{signal, submission, wait_exit, wait_for, World};
use std::time::Duration;

#[test]
fn a_ledger_stall_longer_than_claim_idle_hands_nothing_over_and_dead_letters_nothing() {
    // Plan:
    // 1. Four live workers, `--claim-idle-ms 1500`, `--max-deliveries 2`.
    // 2. Take the ledger's write lock, queue 200 submissions, hold the lock 4 s (over the
    //    claim idle time, under the 5 s busy timeout, so no worker even sees an error).
    // 3. Every submission is paid once on its first delivery: none was taken over by another
    //    worker (no redelivery, no duplicate record), none was dead-lettered.
    let world = World::new();
    let mut workers: Vec<_> = (0..4)
        .map(|i| {
            let consumer = format!("stall-{i}");
            let args = [
                "run",
                "--consumer",
                &consumer,
                "--threads",
                "1",
                "--claim-idle-ms",
                "1500",
            ];
            world.spawn(
                &[
                    &args[..],
                    &["--max-deliveries", "2", "--batch-count-max", "16"],
                ]
                .concat(),
            )
        })
        .collect();
    let consumers = || -> usize {
        let reply: redis::RedisResult<Vec<redis::Value>> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg("grants:submissions")
            .arg("grant-workers")
            .query(&mut world.conn());
        reply.map(|c| c.len()).unwrap_or(0)
    };
    assert!(
        wait_for(Duration::from_secs(30), || consumers() == 4),
        "the four workers never all joined the group"
    );

    let lock = rusqlite::Connection::open(&world.db).unwrap();
    lock.busy_timeout(Duration::from_secs(30)).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let payloads: Vec<String> = (0..200).map(submission).collect();
    world.add(&payloads);
    // The stall itself is what is under test: nothing to poll for while the lock is held.
    std::thread::sleep(Duration::from_secs(4));
    lock.execute_batch("ROLLBACK").unwrap();

    let settled = wait_for(Duration::from_secs(60), || {
        world.count_once_made("disbursements") == 200 && world.pending() == 0
    });
    for w in &workers {
        signal(w, libc::SIGTERM);
    }
    for w in &mut workers {
        let status = wait_exit(w, Duration::from_secs(30));
        assert!(
            status.success(),
            "worker after SIGTERM: {status}\n{}",
            w.log_text()
        );
    }
    let max_deliveries = world.sql_i64("SELECT MAX(delivery_count) FROM audit_log");
    let duplicates = world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'");
    assert!(
        settled,
        "{} of 200 paid, {} pending",
        world.count("disbursements"),
        world.pending()
    );
    assert_eq!(
        world.xlen("grants:submissions:dead"),
        0,
        "valid entries were dead-lettered after a stall (highest delivery count {max_deliveries})"
    );
    assert_eq!(world.count("dead_letters"), 0);
    assert_eq!(
        (max_deliveries, duplicates),
        (1, 0),
        "entries were taken over from a live worker: highest delivery count, duplicate records"
    );
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        crate::support::amount_sum(200)
    );
}

#[test]
fn with_the_heartbeat_off_the_scan_pause_alone_keeps_a_stalled_worker_from_reclaiming_its_entries()
{
    // The XAUTOCLAIM scan pause (`holding_claimable` in worker/reader.rs) is the second guard
    // behind the heartbeat; with the heartbeat working, nothing shows whether it holds. So:
    // 1. One worker, `--claim-idle-ms 1000`, its heartbeat switched off
    //    (CLAIMGATE_FAILPOINT=off:heartbeat); the ledger's write lock is held from outside.
    // 2. 50 submissions arrive; the worker reads them and its commit waits on the lock for
    //    4 s — four times the idle time, under the 5 s busy timeout. Its entries grow idle
    //    (nothing refreshes them) and its reader keeps coming round to its scan.
    // 3. Just before the lock is released, every entry has still been delivered exactly once:
    //    the reader did not XAUTOCLAIM its own in-flight entries (each claim would count a
    //    delivery and push healthy entries toward the cap). Then all 50 are paid once.
    let world = World::new();
    world.create_ledger();
    let lock = rusqlite::Connection::open(&world.db).unwrap();
    lock.busy_timeout(Duration::from_secs(30)).unwrap();
    let mut cmd = world.cmd(&["run", "--consumer", "solo", "--claim-idle-ms", "1000"]);
    cmd.env(claimgate::support::failpoint::ENV, "off:heartbeat");
    let worker = crate::support::Logged::spawn(cmd);
    worker.wait_log("reading");
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    world.add_atomically(&(0..50).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(Duration::from_secs(30), || world.pending() == 50),
        "{}",
        worker.log_text()
    );
    std::thread::sleep(Duration::from_secs(4));
    let deliveries: Vec<(String, String, i64, i64)> = redis::cmd("XPENDING")
        .arg("grants:submissions")
        .arg("grant-workers")
        .arg("-")
        .arg("+")
        .arg(100)
        .query(&mut world.conn())
        .unwrap();
    lock.execute_batch("ROLLBACK").unwrap();
    assert_eq!(deliveries.len(), 50);
    let counts: Vec<i64> = deliveries.iter().map(|d| d.3).collect();
    assert!(
        counts.iter().all(|&n| n == 1),
        "a stalled worker re-claimed its own entries: delivery counts {counts:?}"
    );
    assert!(
        deliveries.iter().all(|d| d.2 >= 3_000),
        "the entries were not left idle (was the heartbeat off?): {deliveries:?}"
    );
    assert!(wait_for(Duration::from_secs(60), || world
        .count_once_made("disbursements")
        == 50
        && world.pending() == 0));
    assert_eq!(
        world.sql_i64("SELECT MAX(delivery_count) FROM audit_log"),
        1
    );
    assert!(worker.stop().success());
}

/// Worker A holds 30 entries while the ledger's write lock is held from outside; worker B,
/// holding nothing (so its scans do not pause), scans for stale entries every half second.
/// Returns the pending entries' (owner, delivery count) just before the lock is released, and
/// the number paid in the end (all 30, once, either way).
fn stall_beside_an_idle_scanner(heartbeat_off: bool) -> (Vec<(String, i64)>, i64) {
    let world = World::new();
    world.create_ledger();
    let lock = rusqlite::Connection::open(&world.db).unwrap();
    lock.busy_timeout(Duration::from_secs(30)).unwrap();
    let mut a_cmd = world.cmd(&["run", "--consumer", "a", "--claim-idle-ms", "1000"]);
    if heartbeat_off {
        a_cmd.env(claimgate::support::failpoint::ENV, "off:heartbeat");
    }
    let a = crate::support::Logged::spawn(a_cmd);
    a.wait_log("reading");
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    world.add_atomically(&(0..30).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(Duration::from_secs(30), || world.pending() == 30),
        "{}",
        a.log_text()
    );
    let b = crate::support::Logged::spawn(world.cmd(&[
        "run",
        "--consumer",
        "b",
        "--claim-idle-ms",
        "1000",
    ]));
    b.wait_log("reading");
    // Four idle times under the 5 s busy timeout: long enough for B to scan several times.
    std::thread::sleep(Duration::from_secs(4));
    let pending: Vec<(String, String, i64, i64)> = redis::cmd("XPENDING")
        .arg("grants:submissions")
        .arg("grant-workers")
        .arg("-")
        .arg("+")
        .arg(100)
        .query(&mut world.conn())
        .unwrap();
    lock.execute_batch("ROLLBACK").unwrap();
    assert!(wait_for(Duration::from_secs(60), || world
        .count_once_made("disbursements")
        == 30
        && world.pending() == 0));
    let paid = world.count("disbursements");
    assert!(a.stop().success());
    assert!(b.stop().success());
    (
        pending
            .into_iter()
            .map(|(_, owner, _, n)| (owner, n))
            .collect(),
        paid,
    )
}

#[test]
fn a_stalled_workers_heartbeat_keeps_its_entries_from_an_idle_worker_that_scans() {
    // The heartbeat is what keeps a stalled worker's entries from looking abandoned; the scan
    // pause cannot help here (B holds nothing, so it scans). With the heartbeat on, every one
    // of A's 30 entries is still A's, delivered once, when the lock is released. The same run
    // with A's heartbeat switched off shows the test can see the difference: B takes entries
    // over, each take a delivery.
    let (with_heartbeat, paid) = stall_beside_an_idle_scanner(false);
    assert_eq!(paid, 30);
    assert_eq!(with_heartbeat.len(), 30);
    assert!(
        with_heartbeat
            .iter()
            .all(|(owner, n)| owner == "a" && *n == 1),
        "entries left A or were delivered again despite the heartbeat: {with_heartbeat:?}"
    );
    let (without, paid) = stall_beside_an_idle_scanner(true);
    assert_eq!(paid, 30, "nothing is paid twice either way");
    assert!(
        without.iter().any(|(owner, n)| owner == "b" && *n >= 2),
        "with A's heartbeat off, B should have taken stale entries over: {without:?}"
    );
}
