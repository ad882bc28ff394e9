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
