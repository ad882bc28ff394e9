//! Safeguards the mutation sweep (docs/failure-handling.md, "Mutations tried") found that no
//! test held: each was broken on purpose, nothing went red, and the test here was written and
//! seen to fail under that mutation. Real processes, a real redis-server, real ledgers.

use crate::resilience::read_as;
use crate::support::{
    self, set_file_size_limit, spawn_ignoring_sigxfsz, submission, wait_for, Logged, World,
};
use std::time::Duration;

/// Generous bound for anything that should happen "soon" on a loaded 2-core box.
const SOON: Duration = Duration::from_secs(60);

/// Creates the SQLite ledger before any worker starts, so the test can lock it first.
fn make_ledger(w: &World) {
    w.create_ledger();
}

/// Audit records of `kind`.
fn audit(w: &World, kind: &str) -> i64 {
    w.sql_i64(&format!(
        "SELECT COUNT(*) FROM audit_log WHERE kind = '{kind}'"
    ))
}

#[test]
fn an_xack_that_fails_while_redis_is_down_is_retried_until_it_lands_and_nothing_is_paid_twice() {
    // The writer retries XACK under the shared policy; a failed XACK left to redelivery would
    // make every entry of the batch a duplicate of itself.
    // 1. The ledger's write lock is held from outside; 20 submissions arrive and the worker's
    //    writer holds them, failing to commit.
    // 2. Redis (AOF) is killed, then the lock released: the batch commits while Redis is down,
    //    and its XACK fails.
    // 3. Redis comes back with its data: the XACK lands as one episode (one WARN, one INFO),
    //    nothing is pending, all 20 are paid once and not one duplicate is recorded.
    let mut w = World::persistent();
    make_ledger(&w);
    let locker = rusqlite::Connection::open(&w.db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    let mut worker =
        Logged::spawn(w.cmd(&["run", "--consumer", "acker", "--claim-idle-ms", "600000"]));
    worker.wait_log("committing to the ledger failed");

    w.redis.kill();
    locker.execute_batch("ROLLBACK").unwrap();
    worker.wait_log("acknowledging entries failed");
    assert_eq!(
        w.count("disbursements"),
        20,
        "committed while Redis was down"
    );
    assert!(worker.alive(), "{}", worker.log_text());
    w.redis.restart().unwrap();

    assert!(
        wait_for(SOON, || w.pending() == 0
            && !worker
                .lines_with("acknowledging entries recovered")
                .is_empty()),
        "{}",
        worker.log_text()
    );
    worker.assert_one_episode("acknowledging entries");
    assert_eq!(w.count("disbursements"), 20);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(20)
    );
    assert_eq!(audit(&w, "processed"), 20);
    assert_eq!(audit(&w, "duplicate"), 0, "{}", worker.log_text());
    assert!(worker.stop().success());
}

#[test]
fn an_entry_past_the_cap_waits_until_everything_read_beside_it_is_committed_and_acknowledged() {
    // Its try alone must have nothing beside it in the pipeline: a crash during the try (the
    // reason it is past the cap) must not take healthy entries down with it.
    // 1. Entry X is delivered to consumer `me` six times without an ack (one read, five
    //    XCLAIMs); three healthy entries are then read by `me` once. All four are pending.
    // 2. A worker `me` armed to crash at the second non-empty read hand-off (`after_read:2`)
    //    starts: re-reading its pending history it finds X at delivery 7 > 5 and the three at
    //    delivery 2. It hands the three on first; X's try alone is handed on — and the worker
    //    dies — only once the three are committed and acknowledged.
    // 3. So after the crash the three are paid and acknowledged, and only X is pending.
    // 4. A worker drains: X is paid on its second try alone; nothing is dead-lettered.
    let w = World::new();
    w.add(&[submission(0)]);
    let stuck = read_as(&w, "me");
    assert_eq!(stuck.len(), 1);
    for _ in 0..5 {
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg("grants:submissions")
            .arg("grant-workers")
            .arg("me")
            .arg(0)
            .arg(&stuck)
            .query(&mut w.conn())
            .unwrap();
    }
    w.add(&(1..4).map(submission).collect::<Vec<_>>());
    assert_eq!(read_as(&w, "me").len(), 3);
    assert_eq!(w.pending(), 4);

    w.crash_at(
        w.cmd(&["run", "--consumer", "me", "--claim-idle-ms", "600000"]),
        "after_read:2",
    );
    assert_eq!(
        w.count("disbursements"),
        3,
        "the healthy entries were committed before the try alone began"
    );
    assert_eq!(w.pending(), 1, "only the entry on its try alone is pending");
    assert_eq!(
        w.sql_i64(&format!(
            "SELECT COUNT(*) FROM audit_log WHERE stream_entry_id = '{}'",
            stuck[0]
        )),
        0
    );

    w.drain(&["--consumer", "me"]);
    assert_eq!(w.count("disbursements"), 4);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(4)
    );
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.pending(), 0);
}

#[test]
fn a_ledger_whose_writes_fail_with_an_io_error_keeps_entries_pending_until_it_clears() {
    // SQLite's IOERR (a failing disk, a file-size limit) is transient: the batch rolls back and
    // is retried, never refused as if the entries were bad. A real one, from outside: the
    // worker's RLIMIT_FSIZE is lowered while it runs, so every write to the ledger fails with
    // EFBIG, which SQLite reports as SQLITE_IOERR_WRITE.
    // 1. A worker, started with SIGXFSZ ignored (as a supervisor may start it: over the limit a
    //    write then fails instead of killing the process), pays 10 submissions.
    // 2. Its file-size limit is set to 1 byte: 10 more arrive and none is paid, all 10 stay
    //    pending, the worker stays up, and the commit's failure is logged.
    // 3. The limit is lifted: the 10 are paid once, as one episode, and the ledger verifies.
    let w = World::new();
    let mut worker =
        spawn_ignoring_sigxfsz(w.cmd(&["run", "--consumer", "io", "--claim-idle-ms", "600000"]));
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 10
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );

    set_file_size_limit(worker.child.id(), 1);
    // In one MULTI, so one read takes all ten into the batch that fails.
    w.add_atomically(&(10..20).map(submission).collect::<Vec<_>>());
    worker.wait_log("committing to the ledger failed");
    assert!(
        worker.lines_with("committing to the ledger failed")[0].contains("I/O error"),
        "{}",
        worker.log_text()
    );
    assert!(worker.alive(), "{}", worker.log_text());
    assert_eq!(w.count("disbursements"), 10);
    assert_eq!(w.pending(), 10);

    set_file_size_limit(worker.child.id(), libc::RLIM_INFINITY);
    assert!(
        wait_for(SOON, || w.count("disbursements") == 20 && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    worker.assert_one_episode("committing to the ledger");
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(20)
    );
    assert_eq!(audit(&w, "processed"), 20);
    assert_eq!(audit(&w, "duplicate"), 0);
    assert!(worker.stop().success());
    w.run_ok(&["verify"]);
}

/// Sets Redis's `maxmemory` (1 byte: every write is refused with OOM; 0: no limit).
fn set_maxmemory(w: &World, bytes: u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query(&mut w.conn())
        .unwrap();
}

#[test]
fn the_relay_marks_no_row_published_while_the_events_stream_refuses_its_writes() {
    // Rows are marked in the ledger only after the publish script has returned: marked first,
    // a publish that then fails leaves rows the ledger calls published and no stream holds.
    // 1. Five submissions are paid: five unpublished outbox rows.
    // 2. Redis is put at its maxmemory (noeviction): reads still answer, every write is
    //    refused with OOM. A relay starts and its publish fails, round after round.
    // 3. Meanwhile no row is marked published and the events stream is empty.
    // 4. Memory is freed: the relay publishes the five, each once, and marks them.
    let w = World::new();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("outbox"), 5);
    set_maxmemory(&w, 1);
    let relay = Logged::spawn(w.cmd(&["relay"]));
    relay.wait_log("relay failed: ");
    assert!(
        relay.lines_with("relay failed: ")[0].contains("OOM"),
        "{}",
        relay.log_text()
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL"),
        0,
        "marked published without being published"
    );
    assert_eq!(w.xlen("grants:events"), 0);

    set_maxmemory(&w, 0);
    assert!(
        wait_for(SOON, || w.sql_i64(
            "SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL"
        ) == 5),
        "{}",
        relay.log_text()
    );
    assert_eq!(w.xlen("grants:events"), 5);
    assert!(relay.stop().success());
}

#[test]
fn restore_refuses_a_backup_that_fails_sqlites_integrity_check_and_changes_nothing() {
    // A backup can be readable and still broken in a way `VACUUM INTO` copies as it is: a NULL
    // in a NOT NULL column (written around the constraint, as a hand edit of the schema
    // would). `integrity_check` on the copy is what refuses it.
    // 1. One submission paid; a backup is taken; in the backup, claim 1's consumer is set to
    //    NULL (the NOT NULL dropped from the schema text for the write, then put back).
    // 2. A second submission is paid into the live ledger.
    // 3. `restore` of that backup exits 1 naming the integrity check; the live ledger still
    //    holds both claims, nothing is left beside it, and it verifies.
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    let schema = |conn: &rusqlite::Connection, sql: &str| {
        conn.execute_batch("PRAGMA writable_schema = ON").unwrap();
        conn.execute(
            "UPDATE sqlite_master SET sql = ?1 WHERE type = 'table' AND name = 'processed_messages'",
            [sql],
        )
        .unwrap();
    };
    let original: String = rusqlite::Connection::open(&backup)
        .unwrap()
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'processed_messages'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let loose = original.replacen(
        "consumer             TEXT    NOT NULL",
        "consumer             TEXT",
        1,
    );
    assert_ne!(
        loose, original,
        "the claims' schema as schema.sql writes it"
    );
    schema(&rusqlite::Connection::open(&backup).unwrap(), &loose);
    let conn = rusqlite::Connection::open(&backup).unwrap();
    conn.execute(
        "UPDATE processed_messages SET consumer = NULL WHERE claim_id = 1",
        [],
    )
    .unwrap();
    schema(&conn, &original);
    drop(conn);
    w.add(&[submission(2)]);
    w.drain(&[]);

    let out = w.run(&["restore", backup.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("fails SQLite's integrity check"),
        "{stderr}"
    );
    assert_eq!(w.count("processed_messages"), 2);
    let names: Vec<String> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains("restore") && !n.contains("replaced")),
        "{names:?}"
    );
    w.run_ok(&["verify"]);
}
