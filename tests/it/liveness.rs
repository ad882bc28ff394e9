//! Never alive and doing nothing: a worker whose stage fails for good says why and exits 1
//! (unhealthy until it does), a stopped-and-continued worker reads on at once, transient read
//! errors count no deliveries, and an entry over the delivery cap is tried once more alone
//! before it is dead-lettered. Real redis-server, real SQLite files, the real binary.

use crate::ops::http_get;
use crate::support::{submission, wait_for, Logged, World};
use claimgate::support::localredis::free_port;
use std::time::{Duration, Instant};

/// Generous bound for anything the worker should do "soon": a loaded 2-core box.
const SOON: Duration = Duration::from_secs(60);

const STREAM: &str = "grants:submissions";
const GROUP: &str = "grant-workers";

/// Starts `claimgate run ARGS` logging at INFO. The ledger is created first, so the test can
/// query (or lock) it from the start.
fn start_worker(w: &World, args: &[&str]) -> Logged {
    w.create_ledger();
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    Logged::spawn(w.cmd(&all))
}

/// A free `127.0.0.1:PORT` for `--metrics-addr`.
fn metrics_addr() -> String {
    format!("127.0.0.1:{}", free_port().expect("a free port"))
}

/// A careless operator's `SET` where the dead-letter stream must be: every copy to it fails
/// with WRONGTYPE.
fn spoil_dead_letter_stream(w: &World) {
    let _: () = redis::cmd("SET")
        .arg("grants:submissions:dead")
        .arg("x")
        .query(&mut w.conn())
        .unwrap();
}

/// Starts `claimgate run ARGS --metrics-addr ADDR` and waits until `/healthz` answers 200;
/// the address and the worker.
fn start_healthy_worker(w: &World, args: &[&str]) -> (String, Logged) {
    let addr = metrics_addr();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--metrics-addr", &addr]);
    let worker = start_worker(w, &all);
    assert!(
        wait_for(SOON, || matches!(
            http_get(&addr, "/healthz"),
            Some((200, _))
        )),
        "never healthy:\n{}",
        worker.log_text()
    );
    (addr, worker)
}

/// Waits until the worker exits (at most [`SOON`]); its exit code.
fn exit_code(worker: &mut Logged) -> Option<i32> {
    let deadline = Instant::now() + SOON;
    while worker.alive() {
        assert!(
            Instant::now() < deadline,
            "the worker did not exit:\n{}",
            worker.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.child.wait().unwrap().code()
}

#[test]
fn a_dead_letter_stream_of_the_wrong_type_stops_the_worker_with_exit_1_and_loses_nothing() {
    // 1. `grants:submissions:dead` holds a string (a careless SET); a worker serves /healthz,
    //    which answers 200.
    // 2. One malformed and five valid submissions arrive together, in one batch.
    // 3. Copying the malformed one fails with WRONGTYPE: the worker logs one ERROR line naming
    //    WRONGTYPE and the dead-letter stream and exits 1; no /healthz answer after that line
    //    is 200.
    // 4. Nothing was paid or acknowledged: all six are still pending.
    let w = World::new();
    spoil_dead_letter_stream(&w);
    let (addr, mut worker) = start_healthy_worker(&w, &[]);

    let valid: Vec<String> = (0..5).map(submission).collect();
    let mut payloads: Vec<&[u8]> = vec![b"{not json"];
    payloads.extend(valid.iter().map(|p| p.as_bytes()));
    w.add_atomically(&payloads);
    let mut after_failure = Vec::new();
    let deadline = Instant::now() + SOON;
    while worker.alive() && Instant::now() < deadline {
        let failed = !worker.lines_with("stopping the worker").is_empty();
        let answer = http_get(&addr, "/healthz");
        if failed {
            after_failure.push(answer);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(exit_code(&mut worker), Some(1), "{}", worker.log_text());

    worker.wait_log("stopping the worker");
    let errors = worker.lines_with("stopping the worker");
    assert_eq!(errors.len(), 1, "{}", worker.log_text());
    assert!(errors[0].contains("ERROR"), "{}", errors[0]);
    assert!(errors[0].contains("writer stopped"), "{}", errors[0]);
    assert!(errors[0].contains("WRONGTYPE"), "{}", errors[0]);
    assert!(
        errors[0].contains("dead-letter stream grants:submissions:dead"),
        "{}",
        errors[0]
    );
    for answer in &after_failure {
        assert!(
            !matches!(answer, Some((200, _))),
            "healthy after the failure: {answer:?}"
        );
    }
    assert_eq!(w.pending(), 6);
    assert_eq!(w.count("disbursements"), 0);
    assert_eq!(w.count("dead_letters"), 0);
}

#[test]
fn an_acknowledgement_step_that_fails_for_good_stops_the_worker_with_exit_1_and_pays_nothing_twice()
{
    // The acker (its own thread since the XACK left the writer) copies held entries and
    // acknowledges; a failure there that will not clear must stop the worker like any other
    // stage, after the commit and before any XACK of that batch.
    // 1. `grants:submissions:dead` holds a string; a worker runs under `--on-conflict hold`.
    // 2. One batch: A, then B with A's award and time and another amount, then C. The ledger
    //    commits A and C paid and B held; copying B to the dead-letter stream fails with
    //    WRONGTYPE: one ERROR line names the acker and WRONGTYPE, the process exits 1, and
    //    nothing of the batch was acknowledged (all three pending, committed).
    // 3. The key is fixed; a drain redelivers all three: A and C are duplicates, B is held
    //    again and copied this time; nothing is paid twice and nothing stays pending.
    let w = World::new();
    spoil_dead_letter_stream(&w);
    let same = |cents: i64| {
        format!(
            r#"{{"award_id":"A-77","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{cents}}}"#
        )
    };
    let (a, b, c) = (same(100), same(200), submission(3));
    let (_, mut worker) =
        start_healthy_worker(&w, &["--on-conflict", "hold", "--claim-idle-ms", "60000"]);
    w.add_atomically(&[a.as_bytes(), b.as_bytes(), c.as_bytes()]);
    assert_eq!(exit_code(&mut worker), Some(1), "{}", worker.log_text());
    let errors = worker.lines_with("stopping the worker");
    assert_eq!(errors.len(), 1, "{}", worker.log_text());
    assert!(errors[0].contains("ERROR"), "{}", errors[0]);
    assert!(errors[0].contains("acker stopped"), "{}", errors[0]);
    assert!(errors[0].contains("WRONGTYPE"), "{}", errors[0]);
    assert_eq!(w.pending(), 3, "nothing of the batch may be acknowledged");
    assert_eq!(w.count("disbursements"), 2, "A and C committed");
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE reason_code = 'conflict_hold'"),
        1
    );

    let _: () = redis::cmd("DEL")
        .arg("grants:submissions:dead")
        .query(&mut w.conn())
        .unwrap();
    w.drain(&["--on-conflict", "hold"]);
    assert_eq!(w.pending(), 0);
    assert_eq!(w.count("disbursements"), 2, "nothing paid twice");
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        2,
        "A and C redelivered as duplicates"
    );
    assert_eq!(w.xlen("grants:submissions:dead"), 1, "B copied once");
    w.run_ok(&["verify"]);
}

#[test]
fn a_reader_that_fails_for_good_is_unhealthy_at_once_while_the_writer_gives_up_its_batch() {
    // 1. The ledger is locked by another process (BEGIN IMMEDIATE); a worker with /healthz
    //    reads three submissions and starts waiting out the lock with them.
    // 2. At its first failed commit the stream key is replaced by a string: the reader's next
    //    read fails with WRONGTYPE, which no retry can clear.
    // 3. The ERROR line names the reader and WRONGTYPE. The writer still holds its batch (at
    //    least two more 5 s busy waits before it gives up), and /healthz, asked right after the
    //    line, is 503 naming the failure.
    // 4. The worker exits 1 and paid nothing.
    let w = World::new();
    w.create_ledger();
    let locker = rusqlite::Connection::open(&w.db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let addr = metrics_addr();
    let mut worker = start_worker(&w, &["--metrics-addr", &addr]);
    let valid: Vec<String> = (0..3).map(submission).collect();
    w.add_atomically(&valid.iter().map(|p| p.as_bytes()).collect::<Vec<_>>());
    worker.wait_log("committing to the ledger failed");
    assert_eq!(http_get(&addr, "/healthz").map(|a| a.0), Some(200));

    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("DEL")
        .arg(STREAM)
        .ignore()
        .cmd("SET")
        .arg(STREAM)
        .arg("x")
        .ignore();
    pipe.query::<()>(&mut w.conn()).unwrap();
    worker.wait_log("stopping the worker");
    let health = http_get(&addr, "/healthz");
    let errors = worker.lines_with("stopping the worker");
    assert_eq!(errors.len(), 1, "{}", worker.log_text());
    assert!(errors[0].contains("ERROR"), "{}", errors[0]);
    assert!(errors[0].contains("reader stopped"), "{}", errors[0]);
    assert!(errors[0].contains("WRONGTYPE"), "{}", errors[0]);
    match &health {
        Some((503, body)) => assert!(body.contains("worker failed: reader"), "{body}"),
        other => panic!(
            "/healthz after the failure: {other:?}\n{}",
            worker.log_text()
        ),
    }

    assert_eq!(exit_code(&mut worker), Some(1), "{}", worker.log_text());
    locker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(w.count("disbursements"), 0);
}

/// Each pending entry's delivery count, in id order (XPENDING's extended form).
fn delivery_counts(w: &World) -> Vec<u64> {
    let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(STREAM)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(10_000)
        .query(&mut w.conn())
        .unwrap();
    rows.into_iter().map(|(_, _, _, count)| count).collect()
}

/// True when every thread of process `pid` is in the stopped state (`T` in /proc).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|stat| {
                // The state follows the command name, which is in parentheses.
                let after = stat.rsplit_once(") ")?.1;
                after.chars().next()
            })
            .is_some_and(|state| state == 'T' || state == 't')
    })
}

#[test]
fn a_stopped_and_continued_worker_reads_on_at_once_without_calling_it_an_outage() {
    // 1. A worker (--claim-idle-ms 600000: no stale-entry scan can help it) has paid three
    //    submissions and polls the idle stream.
    // 2. SIGSTOP; three more submissions arrive while it is stopped; SIGCONT. A read the stop
    //    interrupted comes back with EINTR, which must be read again at once ("a read was cut
    //    short"; no backoff, no WARN); a stop that landed between two reads (the polling
    //    reader sleeps most of the time) is not even that.
    // 3. Three more arrive after SIGCONT. All nine are paid once, nothing is pending or
    //    dead-lettered, and the reader logged no "reading from redis failed" line.
    let w = World::new();
    let worker = start_worker(&w, &["--claim-idle-ms", "600000"]);
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    assert!(wait_for(SOON, || w.count_once_made("disbursements") == 3
        && w.pending() == 0));

    crate::support::signal(&worker.child, libc::SIGSTOP);
    // kill(2) returns before the threads have stopped: on a loaded box the entries below could
    // otherwise reach the blocked read as data before the stop lands, and then no read is
    // interrupted at all. Wait until every thread is seen stopped.
    assert!(
        wait_for(SOON, || all_threads_stopped(worker.child.id())),
        "the worker never stopped"
    );
    w.add(&(3..6).map(submission).collect::<Vec<_>>());
    // Long enough for any read in flight to have been answered while the worker is stopped.
    std::thread::sleep(Duration::from_millis(1_000));
    crate::support::signal(&worker.child, libc::SIGCONT);
    w.add(&(6..9).map(submission).collect::<Vec<_>>());

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 9
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        crate::support::amount_sum(9)
    );
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    assert!(
        worker.lines_with("reading from redis failed").is_empty(),
        "{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
}

#[test]
fn redis_blips_while_the_ledger_is_locked_count_no_deliveries() {
    // 1. The ledger is locked by another process past the worker's 5 s busy timeout; the
    //    worker reads ten submissions and waits out the lock with them in hand.
    // 2. Redis drops every client connection (CLIENT KILL TYPE normal) four times; after each
    //    the reader reconnects and picks up its own pending entries.
    // 3. Still locked, XPENDING shows each of the ten at delivery count 1: the blips counted
    //    nothing (before the fix, each blip re-read them from 0 and counted one more: 5 each).
    // 4. Released: all ten are paid once, nothing is pending, nothing dead-lettered.
    let w = World::new();
    w.create_ledger();
    let locker = rusqlite::Connection::open(&w.db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let worker = start_worker(&w, &[]);
    let payloads: Vec<String> = (0..10).map(submission).collect();
    w.add_atomically(&payloads.iter().map(|p| p.as_bytes()).collect::<Vec<_>>());
    worker.wait_log("committing to the ledger failed");

    for blip in 1..=4 {
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut w.conn())
            .unwrap();
        assert!(
            wait_for(SOON, || worker
                .lines_with("reading from redis recovered")
                .len()
                == blip),
            "blip {blip} not recovered from:\n{}",
            worker.log_text()
        );
    }
    assert_eq!(delivery_counts(&w), vec![1; 10], "{}", worker.log_text());
    assert_eq!(w.count("disbursements"), 0);
    locker.execute_batch("ROLLBACK").unwrap();

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 10
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        crate::support::amount_sum(10)
    );
    assert_eq!(w.count("processed_messages"), 10);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    assert_eq!(w.count("dead_letters"), 0);
    assert!(worker.stop().success());
}

#[test]
fn an_in_process_relay_that_fails_for_good_makes_the_worker_unhealthy_at_once() {
    // 1. A ledger with three published and three unpublished events; the events stream's mark
    //    is then claimed by another ledger (a relay pointed at the wrong stream must stop).
    // 2. The ledger is locked, one more submission arrives, and `run --relay --metrics-addr`
    //    starts: its writer waits out the lock while its relay hits the foreign mark.
    // 3. Right after the relay's ERROR line, /healthz is 503 naming the relay, while the process
    //    is still winding down: after a failure the server answers for a bounded moment more
    //    (`observe/http.rs`), so a probe that saw the process running learns why.
    // 4. It exits 1 and published nothing for the foreign mark.
    let w = World::new();
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    w.add(&(3..6).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.xlen("grants:events"), 3);
    redis::cmd("HSET")
        .arg("grants:events:published_upto")
        .arg("ledger_id")
        .arg("another-ledger")
        .query::<()>(&mut w.conn())
        .unwrap();

    let locker = rusqlite::Connection::open(&w.db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    w.add(&[submission(6)]);
    let addr = metrics_addr();
    let mut worker = start_worker(&w, &["--relay", "--metrics-addr", &addr]);
    worker.wait_log("relay failed");
    let health = http_get(&addr, "/healthz");
    assert!(
        worker.alive(),
        "the worker exited before /healthz was asked"
    );
    match &health {
        Some((503, body)) => assert!(body.contains("relay"), "{body}"),
        other => panic!(
            "/healthz after the relay failed: {other:?}\n{}",
            worker.log_text()
        ),
    }
    locker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(exit_code(&mut worker), Some(1), "{}", worker.log_text());
    assert_eq!(w.xlen("grants:events"), 3);
}
