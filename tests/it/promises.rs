//! Promises the docs made that no test held them to: each one here against real processes,
//! a real redis-server and a real SQLite file, named for what it proves.

use crate::audit::backdate;
use crate::ops::{http_get, sample};
use crate::support::{self, submission, wait_for, Logged, RunWithDeadline, World};
use claimgate::support::localredis::free_port;
use std::time::{Duration, Instant};

/// Generous bound for anything that should happen "soon" on a loaded 2-core box.
const SOON: Duration = Duration::from_secs(60);

/// A read-write connection to the ledger, from outside any claimgate process.
fn rw(w: &World) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(&w.db).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// Creates the ledger before the worker starts, so the test can lock or alter it first.
fn make_ledger(w: &World) {
    w.create_ledger();
}

#[test]
fn sigterm_while_the_ledger_is_locked_with_entries_read_exits_0_and_leaves_them_pending() {
    // 1. The ledger's write lock is held from outside; 20 submissions arrive and the worker
    //    reads them all (pending 20), its commit waiting on the lock.
    // 2. SIGTERM: the worker stops reading, tries its batch a bounded number of times more,
    //    and exits 0 — not hung on the lock, not exit 1 — leaving all 20 pending, none paid.
    // 3. The lock is released; a drain pays each of the 20 exactly once.
    let w = World::new();
    make_ledger(&w);
    let locker = rw(&w);
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    let mut worker = Logged::spawn(w.cmd(&["run", "--consumer", "t"]));
    assert!(
        wait_for(SOON, || w.pending() == 20),
        "the worker never read the entries:\n{}",
        worker.log_text()
    );
    // Give the writer time to reach the lock and start waiting on it.
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    support::signal(&worker.child, libc::SIGTERM);
    let status = support::wait_exit(&mut worker.child, SOON);
    assert!(
        status.success(),
        "exit after SIGTERM during a ledger outage: {status}\n{}",
        worker.log_text()
    );
    eprintln!("exited {:.1}s after SIGTERM", asked.elapsed().as_secs_f64());
    assert_eq!(
        w.pending(),
        20,
        "nothing acknowledged that was not committed"
    );
    locker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(w.count("disbursements"), 0);
    let left: usize = worker
        .lines_with("entries pending for redelivery")
        .iter()
        .filter_map(|l| {
            l.split("left ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(
        left,
        20,
        "the worker did not say what it left:\n{}",
        worker.log_text()
    );

    w.drain(&["--consumer", "t"]);
    assert_eq!(w.count("disbursements"), 20);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(20)
    );
    assert_eq!(w.pending(), 0);
}

#[test]
fn a_batch_the_ledger_refuses_is_retried_entry_by_entry_and_only_the_bad_one_waits() {
    // 1. A trigger (an operator's hand edit) makes the ledger refuse one award's disbursement.
    // 2. Ten submissions arrive in one read: the batch is refused, then tried entry by entry:
    //    nine are paid and acknowledged, the refused one stays pending, each step logged.
    // 3. The trigger is dropped; the waiting entry is paid on its next delivery, once.
    let w = World::new();
    make_ledger(&w);
    rw(&w)
        .execute_batch(
            "CREATE TRIGGER refuse_a3 BEFORE INSERT ON disbursements
             WHEN NEW.award_id = 'A-000003'
             BEGIN SELECT RAISE(ABORT, 'refused by a hand-made trigger'); END;",
        )
        .unwrap();
    w.add_atomically(&(0..10).map(submission).collect::<Vec<_>>());
    let worker = Logged::spawn(w.cmd(&["run", "--consumer", "r", "--claim-idle-ms", "60000"]));
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 9
            && w.pending() == 1),
        "nine paid and one pending expected:\n{}",
        worker.log_text()
    );
    assert_eq!(
        worker.lines_with("ledger refused a batch of 10").len(),
        1,
        "{}",
        worker.log_text()
    );
    assert!(
        worker
            .lines_with("ledger refused entry")
            .iter()
            .any(|l| l.contains("refused by a hand-made trigger")),
        "{}",
        worker.log_text()
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM disbursements WHERE award_id = 'A-000003'"),
        0
    );
    assert!(worker.stop().success());

    rw(&w).execute_batch("DROP TRIGGER refuse_a3").unwrap();
    w.drain(&["--consumer", "r"]);
    assert_eq!(w.count("disbursements"), 10);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(10)
    );
    assert_eq!(w.pending(), 0);
    w.run_ok(&["verify"]);
}

#[test]
fn a_purge_killed_between_batches_verifies_and_a_second_run_finishes_it() {
    // 1. 30 submissions, the first 24 records back-dated to 2020, published.
    // 2. A purge in batches of 5 records is killed after its second batch (failpoint
    //    purge_after_batch:2, SIGABRT): `verify` and `audit verify` pass on what it left.
    // 3. The purge run again finishes: the 24 records' claims are gone, the rest kept, and
    //    both verifies pass; the second export holds what the second run removed.
    let w = World::new();
    w.add(&(0..30).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 24, "2020-03-01T12:00:00.000000Z");
    w.run_ok(&["verify"]);

    let first = w.dir.path().join("purge-1.jsonl");
    let purge = |export: &std::path::Path| {
        let mut cmd = w.cmd(&[
            "retention",
            "purge",
            "--before",
            "2021-01-01",
            "--batch-records-max",
            "5",
            "--export",
            export.to_str().unwrap(),
        ]);
        cmd.env_remove(claimgate::support::failpoint::ENV);
        cmd
    };
    w.crash_at(purge(&first), "purge_after_batch:2");
    let left = w.count("processed_messages");
    assert!(
        left < 30 && left > 6,
        "two batches removed some but not all ({left} claims left)"
    );
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);

    let second = w.dir.path().join("purge-2.jsonl");
    let out = purge(&second).run_with_deadline();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.count("processed_messages"), 6);
    assert_eq!(w.count("disbursements"), 6);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'checkpoint'"),
        1
    );
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    assert!(std::fs::metadata(&second).unwrap().len() > 0);
}

#[test]
fn verify_and_backup_while_a_worker_writes_both_pass_and_the_backup_verifies() {
    // 1. A worker pays a steady stream of submissions.
    // 2. Meanwhile `verify` and `backup` run five times each: every run exits 0, and every
    //    backup is a ledger that itself verifies, holding a consistent prefix of the work.
    // 3. The worker drains everything; nothing was disturbed.
    let w = World::new();
    make_ledger(&w);
    let mut worker = w.spawn(&["run", "--consumer", "v"]);
    let total = 1_500;
    let mut sent = 0;
    let mut backups = Vec::new();
    for round in 0..5 {
        w.add(&(sent..sent + total / 5).map(submission).collect::<Vec<_>>());
        sent += total / 5;
        std::thread::sleep(Duration::from_millis(50));
        let out = w.run(&["verify"]);
        assert!(
            out.status.success(),
            "verify during writes: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let copy = w.dir.path().join(format!("backup-{round}.db"));
        let out = w.run(&["backup", copy.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "backup during writes: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        backups.push(copy);
    }
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == total as i64
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    let mut claims_seen = Vec::new();
    for copy in &backups {
        let out = w
            .cmd(&["verify"])
            .env("CLAIMGATE_DB", copy)
            .run_with_deadline();
        assert!(
            out.status.success(),
            "a backup taken during writes does not verify: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let c = rusqlite::Connection::open(copy).unwrap();
        let claims: i64 = c
            .query_row("SELECT COUNT(*) FROM processed_messages", [], |r| r.get(0))
            .unwrap();
        let records: i64 = c
            .query_row("SELECT COUNT(*) FROM audit_log", [], |r| r.get(0))
            .unwrap();
        assert_eq!(claims, records, "one record per claim in a consistent copy");
        claims_seen.push(claims);
    }
    assert!(
        claims_seen.windows(2).all(|p| p[0] <= p[1]),
        "later backups hold at least as much: {claims_seen:?}"
    );
    support::signal(&worker.child, libc::SIGTERM);
    assert!(support::wait_exit(&mut worker.child, SOON).success());
}

#[test]
fn metrics_equal_the_ledger_for_two_workers_sharing_it_and_after_a_restart() {
    // 1. Two workers share the ledger and the group, each serving /metrics; 300 submissions
    //    and 30 resends arrive. One worker is SIGKILLed mid-way and started again.
    // 2. Once everything is paid, both workers' counters equal the ledger's totals (they are
    //    read from the ledger, not counted in the process, so a restart or a neighbour's work
    //    changes nothing).
    let w = World::new();
    make_ledger(&w);
    let addrs: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port().unwrap()))
        .collect();
    let start = |i: usize| {
        w.spawn(&[
            "run",
            "--consumer",
            &format!("m{i}"),
            "--metrics-addr",
            &addrs[i],
            "--claim-idle-ms",
            "500",
        ])
    };
    let mut workers = vec![start(0), start(1)];
    let payloads: Vec<String> = (0..300).map(submission).collect();
    w.add(&payloads[..150]);
    assert!(wait_for(SOON, || w.count_once_made("disbursements") >= 50));
    support::signal(&workers[1].child, libc::SIGKILL);
    let _ = support::wait_exit(&mut workers[1].child, SOON);
    w.add(&payloads[150..]);
    w.add(&payloads[..30]);
    workers[1] = start(1);
    // Pending 0 alone can hold while the resends are still unread (lag, not pending): the
    // wait is over once their duplicates are recorded too.
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 300
            && w.pending() == 0
            && w.sql_i64_once_made(
                "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"
            ) >= 30),
        "{}\n{}",
        workers[0].log_text(),
        workers[1].log_text()
    );
    let duplicates = w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'");
    assert!(duplicates >= 30);
    for addr in &addrs {
        let ok = wait_for(SOON, || {
            http_get(addr, "/metrics").is_some_and(|(code, text)| {
                code == 200
                    && sample(&text, "claimgate_submissions_processed_total") == Some(300.0)
                    && sample(&text, "claimgate_duplicates_suppressed_total")
                        == Some(duplicates as f64)
                    && sample(&text, "claimgate_pending_entries") == Some(0.0)
            })
        });
        assert!(ok, "{addr}: {:?}", http_get(addr, "/metrics"));
    }
    for mut worker in workers {
        support::signal(&worker.child, libc::SIGTERM);
        assert!(support::wait_exit(&mut worker.child, SOON).success());
    }
}

#[test]
fn healthz_turns_503_when_the_worker_loop_stops_going_round_and_200_when_it_does_again() {
    // 1. A worker with --metrics-addr reads one entry per read; the ledger's write lock is held
    //    from outside and a backlog arrives, so its commit waits, the stages' bounded channels
    //    fill, and the reader blocks handing on its next read: the loop stops going round.
    // 2. Past HEARTBEAT_STALE_MS (30 s) /healthz answers 503 saying so — the process is alive
    //    and doing nothing, which an orchestrator must be able to see.
    // 3. The lock is released: the backlog drains, paid once, and /healthz is 200 again.
    let w = World::new();
    make_ledger(&w);
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut worker = w.spawn(&[
        "run",
        "--consumer",
        "s",
        "--metrics-addr",
        &addr,
        "--batch-count-max",
        "1",
    ]);
    assert!(wait_for(SOON, || http_get(&addr, "/healthz").map(|r| r.0)
        == Some(200)));
    let locker = rw(&w);
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = Instant::now();
    w.add(&(0..60).map(submission).collect::<Vec<_>>());
    let stale = wait_for(
        Duration::from_secs(90),
        || matches!(http_get(&addr, "/healthz"), Some((503, body)) if body.contains("has not gone round")),
    );
    let after = held.elapsed();
    locker.execute_batch("ROLLBACK").unwrap();
    assert!(
        stale,
        "healthz never reported the stuck loop: {:?}\n{}",
        http_get(&addr, "/healthz"),
        worker.log_text()
    );
    // observe::http::HEARTBEAT_STALE_MS: not sooner, or a slow commit would flap it.
    assert!(
        after >= Duration::from_secs(30),
        "reported stale after only {after:?}"
    );
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 60
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(wait_for(SOON, || http_get(&addr, "/healthz").map(|r| r.0)
        == Some(200)));
    support::signal(&worker.child, libc::SIGTERM);
    assert!(support::wait_exit(&mut worker.child, SOON).success());
}

#[test]
fn a_dead_letter_copied_before_a_crash_is_not_copied_again_on_redelivery() {
    // 1. A malformed entry and a valid one arrive. The worker copies the malformed one to the
    //    dead-letter stream (copies go out before the transaction that records them), then
    //    dies at failpoint before_commit: nothing recorded, both entries still pending.
    // 2. The redelivery dead-letters it again — and finds the first copy (the index hash
    //    written with it in one script) instead of adding a second: one dead letter in the
    //    stream, one row in the ledger, the valid entry paid once.
    let w = World::new();
    w.add_fields(&[("payload", b"{not json")]);
    w.add(&[submission(1)]);
    w.crash_at(w.cmd(&["run", "--consumer", "d"]), "before_commit");
    assert_eq!(
        w.xlen("grants:submissions:dead"),
        1,
        "copied before the crash"
    );
    assert_eq!(w.pending(), 2);
    assert_eq!(w.count("dead_letters"), 0, "nothing committed");

    w.drain(&["--consumer", "d"]);
    assert_eq!(
        w.xlen("grants:submissions:dead"),
        1,
        "copied once, not twice"
    );
    assert_eq!(w.count("dead_letters"), 1);
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(w.pending(), 0);
    w.run_ok(&["verify"]);
}

#[test]
fn a_lock_held_shorter_than_the_busy_timeout_is_waited_out_inside_sqlite_without_an_episode() {
    // The busy timeout (5 s) is what lets a commit wait out a short lock — an operator's
    // `sqlite3` write, a backup's checkpoint — inside SQLite, without failing the batch.
    // 1. The write lock is held from outside for 1.5 s while ten submissions arrive.
    // 2. All ten are paid once, and the worker logged no "committing to the ledger failed"
    //    episode: it never saw the lock. (Without the busy timeout, SQLITE_BUSY comes back at
    //    once and every short lock becomes a retry episode.)
    let w = World::new();
    make_ledger(&w);
    let worker = Logged::spawn(w.cmd(&["run", "--consumer", "b"]));
    worker.wait_log("reading");
    let locker = rw(&w);
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    assert!(wait_for(SOON, || w.pending() == 10));
    std::thread::sleep(Duration::from_millis(1_500));
    locker.execute_batch("ROLLBACK").unwrap();
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 10
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(
        worker
            .lines_with("committing to the ledger failed")
            .is_empty(),
        "a lock shorter than the busy timeout became a retry episode:\n{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
}

#[test]
fn a_stage_thread_that_panics_stops_the_worker_with_exit_1_and_loses_nothing() {
    // 1. The reader thread panics right after its first read (CLAIMGATE_FAILPOINT=
    //    panic:after_read: an unwinding panic in that thread, not an abort of the process).
    // 2. The worker does not run on without its reader: it logs the stage and the cause, stops
    //    the other stages and exits 1. The entries read stay pending; nothing is paid.
    // 3. A worker without the failpoint pays them, once.
    let w = World::new();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    let out = w
        .cmd(&["run", "--consumer", "p"])
        .env(claimgate::support::failpoint::ENV, "panic:after_read")
        .run_with_deadline();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("failpoint after_read fired; panicking"),
        "{log}"
    );
    assert!(
        log.contains("stopped: the thread panicked; stopping the worker"),
        "{log}"
    );
    assert_eq!(w.pending(), 5);
    assert_eq!(w.count("disbursements"), 0);
    w.drain(&["--consumer", "p"]);
    assert_eq!(w.count("disbursements"), 5);
    assert_eq!(w.pending(), 0);
}
