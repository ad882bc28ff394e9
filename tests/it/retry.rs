//! The shared retry policy where the worker's tests do not reach it: the relay and the ledger's
//! open step wait out a broken world, log it as one episode (one WARN when it starts, one INFO
//! when it clears), and stop waiting when shutdown is asked for. Real redis-server, real SQLite
//! files, the real binary.

use crate::support::{submission, wait_for, Logged, World};
use claimgate::config::LedgerConfig;

use claimgate::support::Shutdown;
use std::time::{Duration, Instant};

/// Generous bound for anything that should happen "soon" on a loaded 2-core box.
const SOON: Duration = Duration::from_secs(60);

/// Holds the exclusive lock of a ledger file still in rollback-journal mode, so a process that
/// opens it cannot switch it to WAL (nor read it) until the lock is released.
fn lock_before_first_open(db: &std::path::Path) -> rusqlite::Connection {
    let locker = rusqlite::Connection::open(db).unwrap();
    locker
        .execute_batch("CREATE TABLE IF NOT EXISTS placeholder (x); BEGIN EXCLUSIVE;")
        .unwrap();
    locker
}

#[test]
fn a_relay_waits_out_redis_down_and_publishes_every_row_once() {
    // 1. A worker pays 20 submissions, leaving 20 unpublished outbox rows; Redis is killed.
    // 2. The relay starts against the dead Redis: it must wait, not exit, and log one WARN.
    // 3. Redis comes back with its data: every row is published once and marked, the recovery
    //    is logged once after several retries, and SIGTERM stops the relay with exit 0.
    let mut w = World::persistent();
    let payloads: Vec<String> = (0..20).map(submission).collect();
    w.add(&payloads);
    w.drain(&[]);
    assert_eq!(w.count("outbox"), 20);
    w.redis.kill();

    let mut relay = Logged::spawn(w.cmd(&["relay"]));
    relay.wait_log("relay failed: ");
    // Keep Redis down for a while so the relay retries several times.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        relay.child.try_wait().unwrap().is_none(),
        "{}",
        relay.log_text()
    );
    w.redis.restart().unwrap();

    let unpublished = "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL";
    assert!(
        wait_for(SOON, || w.sql_i64_once_made(unpublished) == 0),
        "not published:\n{}",
        relay.log_text()
    );
    assert_eq!(w.xlen("grants:events"), 20);
    relay.wait_log("relay recovered after ");
    assert!(
        relay.assert_one_episode("relay") >= 2,
        "{}",
        relay.log_text()
    );
    crate::support::signal(&relay.child, libc::SIGTERM);
    assert!(crate::support::wait_exit(&mut relay.child, SOON).success());
}

#[test]
fn a_ledger_locked_while_opening_is_waited_out_as_one_episode() {
    // 1. Another process holds the ledger's exclusive lock before its first open.
    // 2. `claimgate relay --exit-when-idle` starts: opening fails past the busy timeout, and it
    //    waits instead of exiting, with one WARN.
    // 3. The lock is released: the relay opens the ledger, logs one INFO, and exits 0.
    let w = World::new();
    let locker = lock_before_first_open(&w.db);
    let mut relay = Logged::spawn(w.cmd(&["relay", "--exit-when-idle"]));
    relay.wait_log("opening the ledger failed: ");
    assert!(
        relay.child.try_wait().unwrap().is_none(),
        "{}",
        relay.log_text()
    );
    locker.execute_batch("ROLLBACK").unwrap();

    assert!(crate::support::wait_exit(&mut relay.child, SOON).success());
    assert!(relay.assert_one_episode("opening the ledger") >= 1);
    assert_eq!(
        w.count("outbox"),
        0,
        "the schema was applied once the lock was gone"
    );
}

#[test]
fn opening_a_locked_ledger_stops_waiting_when_shutdown_is_asked_for() {
    // 1. The ledger is locked before its first open; `open_waiting` waits (busy timeout 100 ms).
    // 2. Shutdown is asked for after 500 ms: it returns `None` soon after, without an error.
    // 3. With the lock gone the same call opens the ledger.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LedgerConfig::new(dir.path().join("ledger.db"));
    cfg.busy_timeout_ms = 100;
    let locker = lock_before_first_open(&cfg.backend.path);
    let stop = Shutdown::new();
    let started = Instant::now();
    let opened = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            stop.trigger();
        });
        claimgate::ledger::open_waiting(&cfg.clone().into(), &stop)
    });
    assert!(opened.expect("a locked ledger is not an error").is_none());
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    locker.execute_batch("ROLLBACK").unwrap();
    let stop = Shutdown::new();
    assert!(claimgate::ledger::open_waiting(&cfg.clone().into(), &stop)
        .unwrap()
        .is_some());
}
