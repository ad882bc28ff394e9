//! Nothing stops the line: the worker waits out a world that is briefly broken (Redis down or
//! restarted, the ledger locked or full), dead-letters what can never succeed (the delivery
//! cap), acknowledges out what vanished, and an operator can replay a dead letter without
//! paying anything twice. Real redis-server, real SQLite files or PostgreSQL databases (every
//! test not about SQLite's own locks or size runs on both), the real binary.

use crate::support::RunWithDeadline;
use crate::support::{amount_sum, submission, wait_for, Logged, Store, World};
use std::time::Duration;

/// Generous bound for anything the worker should do "soon": a debug build on a loaded 2-core box.
const SOON: Duration = Duration::from_secs(60);

const STREAM: &str = "grants:submissions";
const GROUP: &str = "grant-workers";

on_both_ledgers!(
    redis_down_at_start_is_waited_out_then_everything_is_processed_once,
    redis_killed_mid_run_with_persistence_loses_nothing_and_pays_nothing_twice,
    redis_restarted_without_persistence_gets_its_group_back_and_rereads_are_absorbed,
    entries_claimed_over_and_over_without_ack_are_tried_alone_past_the_cap_and_paid,
    a_poison_entry_that_crashes_the_worker_stops_looping_at_the_cap,
    entries_deleted_while_pending_elsewhere_are_acknowledged_out_and_logged,
    own_pending_entries_deleted_before_a_restart_are_acknowledged_out_and_logged,
    dlq_replay_round_trip_puts_a_fixed_entry_back_once,
    replaying_a_dead_letter_that_was_in_fact_paid_is_a_duplicate_not_a_second_payment,
    redis_out_of_memory_holds_dead_letters_back_until_memory_is_freed,
    entries_whose_read_reply_was_lost_are_reread_on_reconnect,
    sigterm_during_an_outage_still_stops_the_worker_cleanly,
    dlq_list_pages_through_a_long_dead_letter_stream,
    a_long_ledger_outage_does_not_push_healthy_entries_over_the_delivery_cap,
);

/// Starts `claimgate run ARGS` logging at INFO, with extra environment variables. The ledger is
/// created first, so the test can query it from the start.
fn start_worker(w: &World, args: &[&str], envs: &[(&str, &str)]) -> Logged {
    w.create_ledger();
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    let mut cmd = w.cmd(&all);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Logged::spawn(cmd)
}

fn submissions(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(submission).collect()
}

/// True when the consumer group exists on the submissions stream.
fn group_exists(w: &World) -> bool {
    let groups: redis::RedisResult<Vec<redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(STREAM)
        .query(&mut w.conn());
    groups.map(|g| !g.is_empty()).unwrap_or(false)
}

/// Reads every new entry as consumer `consumer` (creating the group) and returns the ids.
pub(crate) fn read_as(w: &World, consumer: &str) -> Vec<String> {
    let mut conn = w.conn();
    let _: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(STREAM)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut conn);
    let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(1000)
        .arg("STREAMS")
        .arg(STREAM)
        .arg(">")
        .query(&mut conn)
        .unwrap();
    reply
        .keys
        .into_iter()
        .flat_map(|k| k.ids)
        .map(|e| e.id)
        .collect()
}

/// Audit records of one kind.
fn audit(w: &World, kind: &str) -> i64 {
    w.sql_i64(&format!(
        "SELECT COUNT(*) FROM audit_log WHERE kind = '{kind}'"
    ))
}

fn disbursed_cents(w: &World) -> i64 {
    w.sql_i64("SELECT SUM(amount_cents) FROM disbursements")
}

/// The number N in "recovered after N failed attempts" on a log line.
fn failed_attempts(line: &str) -> u32 {
    let after = line
        .split("recovered after ")
        .nth(1)
        .expect("a recovery line");
    after.split_whitespace().next().unwrap().parse().unwrap()
}

fn redis_down_at_start_is_waited_out_then_everything_is_processed_once(store: Store) {
    // 1. Queue 50 submissions on a persistent Redis, then kill it.
    // 2. Start the worker against the dead port: it must wait, not exit.
    // 3. Bring Redis back with its data: all 50 are paid once, and the outage is logged exactly
    //    once when it starts and once when it clears, however many retries it took.
    let mut w = World::persistent_on(store);
    w.add(&submissions(0..50));
    w.redis.kill();
    let mut worker = start_worker(&w, &[], &[]);
    worker.wait_log("reading from redis failed");
    // Keep Redis down for a while so the worker retries several times.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        worker.alive(),
        "the worker exited while Redis was down:\n{}",
        worker.log_text()
    );
    w.redis.restart().unwrap();

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 50
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(w.count("processed_messages"), 50);
    assert_eq!(disbursed_cents(&w), amount_sum(50));
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    worker.wait_log("reading from redis recovered");
    assert_eq!(
        worker.lines_with("reading from redis failed").len(),
        1,
        "{}",
        worker.log_text()
    );
    let recovered = worker.lines_with("reading from redis recovered");
    assert_eq!(recovered.len(), 1, "{}", worker.log_text());
    assert!(
        failed_attempts(&recovered[0]) >= 2,
        "one episode should span several retries: {}",
        recovered[0]
    );
    assert!(worker.stop().success());
}

/// XADDs each payload, retrying while Redis is unreachable, as a producer that must not lose a
/// submission would. A retried XADD whose first attempt did land is a duplicate for the ledger.
/// Paced at about one entry per 2 ms so the stream is still being fed when Redis is killed.
/// Returns how many attempts failed.
fn produce_through_outages(url: String, payloads: Vec<String>) -> u32 {
    let client = redis::Client::open(url).unwrap();
    let deadline = std::time::Instant::now() + SOON;
    let mut failures = 0;
    let mut conn = None;
    for p in payloads {
        loop {
            if conn.is_none() {
                conn = client
                    .get_connection_with_timeout(Duration::from_millis(200))
                    .ok();
            }
            let sent = conn.as_mut().map(|c| {
                redis::cmd("XADD")
                    .arg(STREAM)
                    .arg("*")
                    .arg("payload")
                    .arg(p.as_bytes())
                    .query::<String>(c)
            });
            if let Some(Ok(_)) = sent {
                break;
            }
            conn = None;
            failures += 1;
            assert!(
                std::time::Instant::now() < deadline,
                "Redis never came back for the producer"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    failures
}

fn redis_killed_mid_run_with_persistence_loses_nothing_and_pays_nothing_twice(store: Store) {
    // 1. A producer sends 400 submissions one by one while a worker processes them.
    // 2. Once some are paid, the worker is paused (SIGSTOP) while 5 more arrive and a consumer
    //    that then dies reads them (or the paused worker's read already in flight takes some):
    //    at the kill, entries are pending (delivered, unacknowledged).
    //    Redis (AOF, fsync always) is SIGKILLed; the producer and the worker both keep
    //    retrying. Redis restarts with its data, pending list included.
    // 3. All 405 are paid exactly once (the 5 taken over from the dead consumer); nothing is
    //    left pending; the worker never exited.
    let mut w = World::persistent_on(store);
    let mut worker = start_worker(&w, &["--claim-idle-ms", "500"], &[]);
    let producer = {
        let url = w.redis.url();
        std::thread::spawn(move || produce_through_outages(url, submissions(0..400)))
    };
    assert!(wait_for(SOON, || w.count_once_made("processed_messages") >= 50));
    let pid = worker.child.id() as libc::pid_t;
    // SAFETY: signals to the worker this test spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    w.add(&submissions(400..405));
    // Read by a consumer that then goes away; a read the paused worker had already sent may
    // take some of them first (Redis serves it while the process is stopped). Either way each
    // of the five is delivered and unacknowledged at the kill.
    read_as(&w, "gone");
    let pending_at_kill = w.pending();
    assert!(
        pending_at_kill >= 5,
        "pending at the kill: {pending_at_kill}"
    );
    w.redis.kill();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    worker.wait_log("reading from redis failed");
    assert!(worker.alive());
    w.redis.restart().unwrap();
    assert!(
        producer.join().unwrap() > 0,
        "the producer never saw the outage: Redis was not killed mid-run"
    );

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 405
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(w.count("processed_messages"), 405);
    assert_eq!(audit(&w, "processed"), 405);
    assert_eq!(disbursed_cents(&w), amount_sum(405));
    assert_eq!(w.count("dead_letters"), 0);
    assert!(worker.alive());
    assert!(worker.stop().success());
}

fn redis_restarted_without_persistence_gets_its_group_back_and_rereads_are_absorbed(store: Store) {
    // 1. A producer is feeding 100 submissions to a worker when Redis, which keeps nothing, is
    //    killed and restarted empty; the producer carries on against the new server.
    // 2. The worker recreates the consumer group by itself and keeps going.
    // 3. The producer, unable to know what was lost, re-sends all 100 plus 50 new ones.
    // 4. 150 disbursements exactly; each one paid before the kill comes back as a duplicate.
    let mut w = World::on(store);
    let mut worker = start_worker(&w, &[], &[]);
    let producer = {
        let url = w.redis.url();
        std::thread::spawn(move || produce_through_outages(url, submissions(0..100)))
    };
    assert!(wait_for(SOON, || w.count_once_made("processed_messages") >= 20));
    let paid_before_kill = w.count("processed_messages");
    w.redis.kill();
    w.redis.restart().unwrap();
    assert!(
        wait_for(SOON, || group_exists(&w)),
        "the group was not recreated:\n{}",
        worker.log_text()
    );
    worker.wait_log("recreating it");
    assert!(worker.alive());
    producer.join().unwrap();
    w.add(&submissions(0..150));

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 150
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(w.count("processed_messages"), 150);
    assert_eq!(audit(&w, "processed"), 150);
    assert_eq!(disbursed_cents(&w), amount_sum(150));
    assert!(
        audit(&w, "duplicate") >= paid_before_kill,
        "every submission paid before the kill was re-sent"
    );
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(
        worker.lines_with("recreating it").len(),
        1,
        "{}",
        worker.log_text()
    );
    assert!(worker.alive());
    assert!(worker.stop().success());
}

// SQLite only: its file write lock and busy timeout (PostgreSQL has neither; its outage is the
// server restart in shared_ledger.rs and the chaos suite).
#[test]
fn a_ledger_locked_past_the_busy_timeout_delays_entries_but_loses_none() {
    // 1. The worker has paid 10 submissions.
    // 2. Another process takes the ledger's write lock (BEGIN IMMEDIATE) and keeps it past the
    //    worker's 5 s busy timeout while 20 more arrive.
    // 3. Meanwhile nothing is dead-lettered, acknowledged or paid; the worker stays up.
    // 4. After release all 20 are paid; the episode is logged once at start, once at clear.
    let w = World::new();
    let mut worker = start_worker(&w, &[], &[]);
    w.add(&submissions(0..10));
    assert!(wait_for(SOON, || w.count_once_made("disbursements") == 10
        && w.pending() == 0));

    let locker = rusqlite::Connection::open(&w.db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    w.add_atomically(&submissions(10..30));
    worker.wait_log("committing to the ledger failed");
    assert!(worker.alive());
    assert_eq!(w.count("disbursements"), 10);
    assert_eq!(w.pending(), 20);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    locker.execute_batch("ROLLBACK").unwrap();

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 30
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(disbursed_cents(&w), amount_sum(30));
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    worker.wait_log("committing to the ledger recovered");
    worker.assert_one_episode("committing to the ledger");
    assert!(worker.stop().success());
}

// SQLite only: SQLITE_FULL through `--ledger-pages-max`, a cap on the file's pages.
#[test]
fn a_full_ledger_keeps_entries_pending_until_room_is_made() {
    // 1. A ledger whose every page is in use (a filler table), capped at its current size with
    //    --ledger-pages-max, so the next commit fails with SQLITE_FULL as on a full disk.
    // 2. 40 submissions arrive together: they stay pending, nothing is dead-lettered, the worker
    //    keeps running.
    // 3. The operator makes room (drops the filler): all 40 are paid without a restart.
    let w = World::new();
    w.create_ledger();
    let admin = rusqlite::Connection::open(&w.db).unwrap();
    admin.busy_timeout(Duration::from_secs(10)).unwrap();
    admin
        .execute_batch(
            "CREATE TABLE filler (b BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
             INSERT INTO filler SELECT zeroblob(2000) FROM n;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    let pages: i64 = admin
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    let freelist: i64 = admin
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        freelist, 0,
        "the ledger must have no free pages for this test to mean anything"
    );

    let mut worker = start_worker(&w, &["--ledger-pages-max", &pages.to_string()], &[]);
    w.add_atomically(&submissions(0..40));
    worker.wait_log("committing to the ledger failed");
    assert!(
        worker.lines_with("committing to the ledger failed")[0].contains("full"),
        "{}",
        worker.log_text()
    );
    assert!(worker.alive());
    assert_eq!(w.count("processed_messages"), 0);
    assert_eq!(w.pending(), 40);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);

    admin.execute_batch("DROP TABLE filler").unwrap();
    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 40
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(disbursed_cents(&w), amount_sum(40));
    worker.wait_log("committing to the ledger recovered");
    assert_eq!(w.count("dead_letters"), 0);
    worker.assert_one_episode("committing to the ledger");
    assert!(worker.stop().success());
}

fn entries_claimed_over_and_over_without_ack_are_tried_alone_past_the_cap_and_paid(store: Store) {
    // The quarantine rule: past --max-deliveries an entry is tried alone (up to twice), and
    // dead-lettered only if those tries fail. (This test used to prove dead-lettering at the
    // cap; a poison entry still stops, see the next test.)
    // 1. Three valid entries are read by a consumer that never acknowledges, then claimed by it
    //    five more times (6 deliveries); two healthy entries wait beside them.
    // 2. A worker takes the three over (delivery 7 > --max-deliveries 5): it tries each once
    //    more in a transaction of its own, and all three are paid, as are the two.
    // 3. Nothing is dead-lettered or pending, and no quarantine mark is left behind.
    let w = World::on(store);
    w.add(&submissions(0..3));
    let stuck = read_as(&w, "never-acks");
    assert_eq!(stuck.len(), 3);
    let mut conn = w.conn();
    for _ in 0..5 {
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(STREAM)
            .arg(GROUP)
            .arg("never-acks")
            .arg(0)
            .arg(&stuck)
            .query(&mut conn)
            .unwrap();
    }
    w.add(&submissions(3..5));
    let out = w
        .cmd(&["run", "--exit-when-idle", "--claim-idle-ms", "200"])
        .env("RUST_LOG", "info")
        .run_with_deadline();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");

    let tried_alone: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("trying it alone (try 1 of 3)"))
        .collect();
    assert_eq!(tried_alone.len(), 3, "{log}");
    for (line, id) in tried_alone.iter().zip(&stuck) {
        assert!(
            line.contains(&format!("entry {id} was delivered 7 times")),
            "{line}"
        );
    }
    assert_eq!(w.count("disbursements"), 5);
    assert_eq!(disbursed_cents(&w), amount_sum(5));
    assert_eq!(audit(&w, "processed"), 5);
    assert_eq!(w.sql_i64("SELECT MAX(delivery_count) FROM audit_log"), 7);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.pending(), 0);
    assert_eq!(quarantine_marks(&w), 0);
}

/// Quarantine marks left in `<stream>:quarantine`.
fn quarantine_marks(w: &World) -> u64 {
    redis::cmd("HLEN")
        .arg("grants:submissions:quarantine")
        .query(&mut w.conn())
        .unwrap()
}

fn a_poison_entry_that_crashes_the_worker_stops_looping_at_the_cap(store: Store) {
    // 1. An entry crashes every worker that reads it (failpoint after_read): five runs die.
    // 2. Runs six to eight see deliveries 6 to 8 > 5 and, under the quarantine rule, try it
    //    alone (the mark counting tries 1 to 3 of QUARANTINE_TRIES_MAX = 3), each at least
    //    --quarantine-spacing-ms (here 100 ms), then twice that, after the one before: all
    //    crash.
    // 3. The ninth run sees delivery 9 > 5 and a mark that has used up its tries: at least
    //    400 ms after the third try began it dead-letters the entry instead of trying again —
    //    within cap + 4 deliveries and 7 spacings — and clears the mark.
    let w = World::on(store);
    w.add(&submissions(0..1));
    let spacing = ["--consumer", "crashy", "--quarantine-spacing-ms", "100"];
    let mut tried_at = Vec::new();
    for run in 1..=8 {
        let mut args = vec!["run"];
        args.extend_from_slice(&spacing);
        let out = w.crash_at(w.cmd(&args), "after_read");
        assert!(!out.status.success(), "run {run} should have crashed");
        assert_eq!(w.pending(), 1);
        if run > 5 {
            let marks: Vec<String> = redis::cmd("HVALS")
                .arg("grants:submissions:quarantine")
                .query(&mut w.conn())
                .unwrap();
            assert_eq!(marks.len(), 1, "run {run} left the marks {marks:?}");
            assert!(
                marks[0].starts_with(&format!("try {} by crashy at ", run - 5)),
                "run {run} left the mark {marks:?}"
            );
            // When the try began, on Redis's clock (the mark's ` ms <n>`), which the spacing
            // rule reads: the test's own clock would see each run's exit, not its try.
            let began: u64 = marks[0]
                .rsplit_once(" ms ")
                .and_then(|(_, ms)| ms.parse().ok())
                .unwrap_or_else(|| panic!("run {run}'s mark has no time: {marks:?}"));
            tried_at.push(began);
        }
    }
    let mut args = vec!["--quarantine-spacing-ms", "100"];
    args.extend_from_slice(&spacing[..2]);
    w.drain(&args);
    assert!(
        tried_at[1] - tried_at[0] >= 100 && tried_at[2] - tried_at[1] >= 200,
        "the three tries alone were not spaced 100 ms, then 200 ms: began at {tried_at:?} ms"
    );

    let dead = w.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        String::from_utf8_lossy(&dead[0]["reason"]),
        "max deliveries exceeded (9 > 5) and none of its 3 tries alone succeeded"
    );
    assert_eq!(dead[0]["deliveries"], b"9");
    assert_eq!(w.count("disbursements"), 0);
    assert_eq!(w.pending(), 0);
    assert_eq!(quarantine_marks(&w), 0);
}

fn entries_deleted_while_pending_elsewhere_are_acknowledged_out_and_logged(store: Store) {
    // 1. Five entries are pending on a consumer that died; two are then XDELed.
    // 2. A worker taking the consumer's entries over (XAUTOCLAIM) acknowledges the two out of
    //    the pending list, logs each id, pays the other three and exits cleanly.
    // 3. Each of the two left a `vanished` audit record naming it; status counts them and the
    //    chain still verifies.
    let w = World::on(store);
    w.add(&submissions(0..5));
    let ids = read_as(&w, "died");
    let _: u64 = redis::cmd("XDEL")
        .arg(STREAM)
        .arg(&ids[1])
        .arg(&ids[3])
        .query(&mut w.conn())
        .unwrap();
    let out = w.drain(&[]);

    let log = String::from_utf8_lossy(&out.stderr);
    for gone in [&ids[1], &ids[3]] {
        assert!(
            log.contains(&format!(
                "entry {gone} was deleted from the stream while pending"
            )),
            "{log}"
        );
    }
    assert_eq!(w.pending(), 0);
    assert_eq!(w.count("disbursements"), 3);
    assert_eq!(disbursed_cents(&w), 100 + 102 + 104);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    for gone in [&ids[1], &ids[3]] {
        assert_eq!(vanished_records(&w, gone, None), 1, "entry {gone}");
    }
    assert_vanished_counted(&w, 2);
}

/// `vanished` audit records naming entry `id` (and, when given, written by `consumer`).
fn vanished_records(w: &World, id: &str, consumer: Option<&str>) -> i64 {
    w.sql_i64(&format!(
        "SELECT COUNT(*) FROM audit_log WHERE kind = 'vanished' AND stream_entry_id = '{id}'
         AND consumer IS NOT NULL AND consumer = coalesce({}, consumer) AND recorded_at <> ''",
        consumer.map_or("NULL".to_owned(), |c| format!("'{c}'"))
    ))
}

/// `status --json` counts `n` vanished entries, and `verify` (the audit chain) passes.
fn assert_vanished_counted(w: &World, n: u64) {
    let out = w.run_ok(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ledger"]["vanished"], n);
    assert_eq!(audit(w, "vanished"), n as i64);
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
}

fn own_pending_entries_deleted_before_a_restart_are_acknowledged_out_and_logged(store: Store) {
    // 1. A worker reads five entries and crashes before processing them (failpoint after_read).
    // 2. Two are XDELed: re-reading the consumer's pending list now returns them as nil bodies.
    // 3. The restarted worker acknowledges those two out, logs each id, and pays the other three;
    //    each of the two left a `vanished` audit record by consumer `me`, counted by status.
    //    (On Redis 7 its start-up XAUTOCLAIM scan purges deleted ids before checking idle time,
    //    so it meets them there; on older servers, or for an entry deleted between the scan and
    //    the re-read, the nil-body path of the re-read does the same.)
    let w = World::on(store);
    let ids = w.add(&submissions(0..5));
    let out = w.crash_at(w.cmd(&["run", "--consumer", "me"]), "after_read");
    assert!(!out.status.success());
    assert_eq!(w.pending(), 5);
    let _: u64 = redis::cmd("XDEL")
        .arg(STREAM)
        .arg(&ids[0])
        .arg(&ids[4])
        .query(&mut w.conn())
        .unwrap();
    let mut conn =
        claimgate::broker::stream::Conn::new(redis::Client::open(w.redis.url()).unwrap());
    let limits = claimgate::broker::read::Limits::for_payload(1 << 20);
    let history = claimgate::broker::read::read_group(
        &mut conn,
        STREAM,
        GROUP,
        "me",
        "0",
        100,
        limits.entry_weight_max(),
        &limits,
    )
    .unwrap();
    assert_eq!(history.vanished, vec![ids[0].clone(), ids[4].clone()]);
    assert_eq!(history.entries.len(), 3);
    let out = w.run_ok(&[
        "run",
        "--exit-when-idle",
        "--consumer",
        "me",
        "--claim-idle-ms",
        "600000",
    ]);

    let log = String::from_utf8_lossy(&out.stderr);
    for gone in [&ids[0], &ids[4]] {
        let logged = log.lines().any(|l| {
            l.contains(&format!("entry {gone} "))
                && l.contains("acknowledging it out of the pending list")
        });
        assert!(logged, "{log}");
    }
    assert_eq!(w.pending(), 0);
    assert_eq!(w.count("disbursements"), 3);
    assert_eq!(disbursed_cents(&w), 101 + 102 + 103);
    for gone in [&ids[0], &ids[4]] {
        assert_eq!(vanished_records(&w, gone, Some("me")), 1, "entry {gone}");
    }
    assert_vanished_counted(&w, 2);
}

/// `dlq list --json` as JSON values.
fn dlq_list(w: &World) -> Vec<serde_json::Value> {
    let out = w.run_ok(&["dlq", "list", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn dlq_replay_round_trip_puts_a_fixed_entry_back_once(store: Store) {
    // 1. A submission over a too-tight size limit is dead-lettered (payload_too_large).
    // 2. `dlq list` and `dlq show` name it, its award and its reason.
    // 3. `dlq replay` puts it back once; a second replay (by either id) is refused with exit 1.
    // 4. With the limit fixed, the worker pays it: one disbursement.
    let w = World::on(store);
    // Submission 7 with a program name long enough to be over the smallest limit a worker
    // takes (256 bytes).
    let big = submission(7).replace("rural-broadband", &format!("rural-{}", "b".repeat(200)));
    assert!(big.len() > 256);
    let original = w.add(std::slice::from_ref(&big)).remove(0);
    let audit_log = w.dir.path().join("audit.log");
    w.drain(&[
        "--payload-bytes-max",
        "256",
        "--audit-log",
        audit_log.to_str().unwrap(),
    ]);
    assert_eq!(w.count("disbursements"), 0);
    // The audit line names the award as `dlq list` does below (it said `award=-`).
    let lines = std::fs::read_to_string(&audit_log).unwrap();
    assert!(
        lines.contains(&format!(
            "dead_letter entry={original} award=A-000007 reason=payload_too_large"
        )),
        "{lines}"
    );

    let listed = dlq_list(&w);
    assert_eq!(listed.len(), 1);
    let dead_id = listed[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(listed[0]["original_id"], original.as_str());
    assert_eq!(listed[0]["reason_code"], "payload_too_large");
    let reason = format!(
        "payload is {} bytes, over the limit of 256 bytes",
        big.len()
    );
    assert_eq!(listed[0]["reason"], reason.as_str());
    assert_eq!(listed[0]["award_id"], "A-000007");
    assert!(listed[0]["replayed_as"].is_null());
    let text = String::from_utf8(w.run_ok(&["dlq", "list"]).stdout).unwrap();
    assert!(
        text.contains(&dead_id)
            && text.contains("award=A-000007")
            && text.contains("payload_too_large"),
        "{text}"
    );
    let shown = String::from_utf8(w.run_ok(&["dlq", "show", &original]).stdout).unwrap();
    assert!(
        shown.contains(&format!("dead letter {dead_id}"))
            && shown.contains(&format!("original.payload: {big}")),
        "{shown}"
    );

    let replayed = String::from_utf8(w.run_ok(&["dlq", "replay", &dead_id]).stdout).unwrap();
    assert!(replayed.contains("replayed dead letter"), "{replayed}");
    for id in [&dead_id, &original] {
        let again = w.run(&["dlq", "replay", id]);
        assert_eq!(again.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&again.stderr).contains("already replayed"));
    }
    assert_eq!(w.xlen(STREAM), 2);
    assert!(!dlq_list(&w)[0]["replayed_as"].is_null());

    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(disbursed_cents(&w), 107);
    assert_eq!(w.xlen("grants:submissions:dead"), 1);
    assert_eq!(w.pending(), 0);

    assert_eq!(w.run(&["dlq", "show", "not-an-id"]).status.code(), Some(2));
    assert_eq!(w.run(&["dlq", "replay", "1-0"]).status.code(), Some(1));
}

fn replaying_a_dead_letter_that_was_in_fact_paid_is_a_duplicate_not_a_second_payment(store: Store) {
    // 1. A worker commits a submission and crashes before XACK (failpoint after_commit).
    // 2. The next three runs, with --max-deliveries 1, see deliveries 2 to 4 and try it alone
    //    (the quarantine rule, tries 1 to 3, spaced by --quarantine-spacing-ms): the ledger
    //    finds it a duplicate each time, and each run crashes before XACK too.
    // 3. The fifth run sees delivery 5 and a mark with no tries left: it dead-letters the
    //    entry at the cap, although the ledger already paid it.
    // 4. The operator replays it: the worker finds the claim taken. Still one disbursement.
    let w = World::on(store);
    w.add(&submissions(3..4));
    for max_deliveries in ["5", "1", "1", "1"] {
        let out = w.crash_at(
            w.cmd(&[
                "run",
                "--consumer",
                "c1",
                "--max-deliveries",
                max_deliveries,
                "--quarantine-spacing-ms",
                "50",
            ]),
            "after_commit",
        );
        assert!(!out.status.success());
        assert_eq!((w.count("disbursements"), w.pending()), (1, 1));
    }
    w.drain(&[
        "--consumer",
        "c1",
        "--max-deliveries",
        "1",
        "--quarantine-spacing-ms",
        "50",
    ]);
    let listed = dlq_list(&w);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0]["reason"],
        "max deliveries exceeded (5 > 1) and none of its 3 tries alone succeeded"
    );

    w.run_ok(&["dlq", "replay", listed[0]["id"].as_str().unwrap()]);
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(disbursed_cents(&w), 103);
    // Three from the tries alone in step 2, one from the replay.
    assert_eq!(audit(&w, "duplicate"), 4);
    assert_eq!(w.pending(), 0);
}

fn redis_out_of_memory_holds_dead_letters_back_until_memory_is_freed(store: Store) {
    // 1. Redis starts out at its maxmemory (noeviction): even creating the consumer group is
    //    refused with OOM. The worker waits instead of exiting, and goes on once memory is freed.
    // 2. The limit bites again just after a batch of one malformed and two valid entries
    //    arrives: the dead-letter XADD is refused. The batch waits, unacknowledged; the worker
    //    stays up (OOM is the world being full, like a full disk, not a bad entry).
    // 3. Memory is freed: the bad entry is dead-lettered, the two are paid, nothing pending.
    let w = World::on(store);
    let set_maxmemory = |bytes: u64| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .query::<()>(&mut w.conn())
            .unwrap()
    };
    set_maxmemory(1);
    let mut worker = start_worker(&w, &[], &[]);
    worker.wait_log("reading from redis failed");
    assert!(
        worker.lines_with("reading from redis failed")[0].contains("OOM"),
        "{}",
        worker.log_text()
    );
    assert!(worker.alive());
    set_maxmemory(0);
    assert!(wait_for(SOON, || group_exists(&w)), "{}", worker.log_text());

    // One MULTI, so the entries land and the limit comes back before the worker can react.
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg("payload")
        .arg(submission(1))
        .ignore()
        .cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg("payload")
        .arg("{not json")
        .ignore()
        .cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg("payload")
        .arg(submission(2))
        .ignore()
        .cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .ignore();
    pipe.query::<()>(&mut w.conn()).unwrap();

    worker.wait_log("copying an entry to the dead-letter stream failed");
    assert!(
        worker.lines_with("copying an entry to the dead-letter stream failed")[0].contains("OOM"),
        "{}",
        worker.log_text()
    );
    assert!(worker.alive());
    assert_eq!(
        (
            w.pending(),
            w.count("disbursements"),
            w.xlen("grants:submissions:dead")
        ),
        (3, 0, 0)
    );

    set_maxmemory(0);
    assert!(
        wait_for(SOON, || w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(w.xlen("grants:submissions:dead"), 1);
    assert_eq!(w.count("dead_letters"), 1);
    assert!(worker.alive());
    assert!(worker.stop().success());
}

fn entries_whose_read_reply_was_lost_are_reread_on_reconnect(store: Store) {
    // 1. A worker (consumer `lost`) polls an idle stream. In one pipeline, three entries are
    //    added and a script delivers them to `lost` (XREADGROUP as that consumer: they enter
    //    its pending list, as a read whose reply is then lost would leave them) and holds the
    //    server for 6.5 s: the worker's next read waits past its 5.2 s response timeout and
    //    its connection is dropped.
    // 2. On reconnect the worker picks up its own pending entries (XPENDING, then their bodies
    //    by XRANGE) and pays all three, long before the stale-entry scan (--claim-idle-ms
    //    600000) would take them over, and without counting a second delivery.
    let w = World::on(store);
    let worker = start_worker(
        &w,
        &["--consumer", "lost", "--claim-idle-ms", "600000"],
        &[],
    );
    w.add(&submissions(0..1));
    assert!(wait_for(SOON, || w.count_once_made("disbursements") == 1
        && w.pending() == 0));
    let mut conn = w.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg(60_000)
        .query(&mut conn)
        .unwrap();
    let deliver_and_hold = r"
        redis.call('XREADGROUP', 'GROUP', ARGV[2], 'lost', 'COUNT', 10, 'STREAMS', KEYS[1], '>')
        local function us(t) return tonumber(t[1]) * 1000000 + tonumber(t[2]) end
        local start = us(redis.call('TIME'))
        while us(redis.call('TIME')) - start < tonumber(ARGV[1]) do end
        return 1";
    let mut pipe = redis::pipe();
    for p in submissions(1..4) {
        pipe.cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("payload")
            .arg(p)
            .ignore();
    }
    pipe.cmd("EVAL")
        .arg(deliver_and_hold)
        .arg(1)
        .arg(STREAM)
        .arg(6_500_000)
        .arg(claimgate::config::GROUP_DEFAULT)
        .ignore();
    pipe.query::<()>(&mut conn).unwrap();

    assert!(
        wait_for(SOON, || w.count_once_made("disbursements") == 4
            && w.pending() == 0),
        "not drained:\n{}",
        worker.log_text()
    );
    assert_eq!(disbursed_cents(&w), amount_sum(4));
    assert_eq!(
        worker.lines_with("reading from redis failed").len(),
        1,
        "{}",
        worker.log_text()
    );
    assert_eq!(
        worker
            .lines_with("picked up 3 entries of ours that were pending but not in hand")
            .len(),
        1,
        "{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
}

/// The ledger taken away from running workers, the way each backend loses it: SQLite's write
/// lock held by another connection (`BEGIN IMMEDIATE`), or the PostgreSQL server stopped at
/// once (immediate shutdown: connections cut) and later started again.
struct LedgerOutage {
    /// The world; on PostgreSQL its ledger is on `cluster`.
    world: World,
    /// PostgreSQL only: a cluster of the test's own, since the outage stops it.
    cluster: Option<claimgate::support::localpostgres::LocalPostgres>,
    /// SQLite only, during the outage: the connection holding the write lock.
    locker: Option<rusqlite::Connection>,
}

impl LedgerOutage {
    /// A world on `store` whose ledger can be taken away; the ledger exists.
    fn world(store: Store) -> LedgerOutage {
        let cluster = (store == Store::Postgres).then(crate::pg::own_cluster);
        let world = match &cluster {
            Some(pg) => World::on_postgres_url(&pg.create_database("outage").unwrap()),
            None => World::new(),
        };
        world.create_ledger();
        LedgerOutage {
            world,
            cluster,
            locker: None,
        }
    }

    /// Takes the ledger away.
    fn begin(&mut self) {
        match &mut self.cluster {
            Some(pg) => pg.stop_immediate().unwrap(),
            None => {
                let locker = rusqlite::Connection::open(&self.world.db).unwrap();
                locker.execute_batch("BEGIN IMMEDIATE").unwrap();
                self.locker = Some(locker);
            }
        }
    }

    /// Gives it back.
    fn end(&mut self) {
        match &mut self.cluster {
            Some(pg) => pg.start_again().unwrap(),
            None => self
                .locker
                .take()
                .expect("an outage under way")
                .execute_batch("ROLLBACK")
                .unwrap(),
        }
    }
}

fn a_long_ledger_outage_does_not_push_healthy_entries_over_the_delivery_cap(store: Store) {
    // 1. A worker (--claim-idle-ms 300) is up; the ledger is taken away (SQLite: its write
    //    lock held from outside; PostgreSQL: the server stopped); the worker reads five entries
    //    and waits out the outage with them in hand.
    // 2. It is SIGKILLed during the outage (an operator restarting a stuck-looking service),
    //    the ledger comes back, and a worker with the same name restarts.
    // 3. The restarted worker pays all five: the outage must not have counted as deliveries
    //    (the stale-entry scan must not keep re-claiming entries the worker itself holds).
    let mut outage = LedgerOutage::world(store);
    let mut worker = start_worker(
        &outage.world,
        &["--consumer", "held", "--claim-idle-ms", "300"],
        &[],
    );
    // Up and reading: on PostgreSQL a worker that could not open the ledger would not read.
    worker.wait_log("reading");
    outage.begin();
    let w = &outage.world;
    w.add_atomically(&submissions(0..5));
    worker.wait_log("committing to the ledger failed");
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    outage.end();
    let w = &outage.world;
    assert_eq!(w.pending(), 5);

    w.drain(&["--consumer", "held"]);
    assert_eq!(w.count("disbursements"), 5);
    assert_eq!(disbursed_cents(w), amount_sum(5));
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    assert_eq!(w.pending(), 0);
}

fn sigterm_during_an_outage_still_stops_the_worker_cleanly(store: Store) {
    // 1. Redis is down; the worker is waiting it out.
    // 2. SIGTERM: the worker stops waiting and exits 0 (nothing was read, so nothing is lost).
    let mut w = World::on(store);
    w.redis.kill();
    let worker = start_worker(&w, &[], &[]);
    worker.wait_log("reading from redis failed");
    assert!(worker.stop().success());
}

fn dlq_list_pages_through_a_long_dead_letter_stream(store: Store) {
    // 250 malformed entries (more than two listing pages) are all listed, oldest first, once.
    let w = World::on(store);
    let mut pipe = redis::pipe();
    for i in 0..250 {
        pipe.cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("payload")
            .arg(format!("bad {i}"))
            .ignore();
    }
    pipe.query::<()>(&mut w.conn()).unwrap();
    w.drain(&[]);
    assert_eq!(w.xlen("grants:submissions:dead"), 250);

    let listed = dlq_list(&w);
    let ids: Vec<&str> = listed.iter().map(|d| d["id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort_by_key(|id| {
        let (ms, seq) = id.split_once('-').unwrap();
        (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap())
    });
    sorted.dedup();
    assert_eq!(ids.len(), 250);
    assert_eq!(ids, sorted);
    assert!(listed.iter().all(|d| d["reason_code"] == "not_json"));
    let text = String::from_utf8(w.run_ok(&["dlq", "list"]).stdout).unwrap();
    assert_eq!(text.lines().count(), 251);
    assert!(
        text.ends_with("250 dead letters on grants:submissions:dead\n"),
        "{text}"
    );
}

#[test]
fn a_relay_whose_postgresql_restarts_before_its_first_read_waits_it_out_and_publishes_everything() {
    // 1. A PostgreSQL ledger (a cluster of the test's own) holds three unpublished rows.
    // 2. A relay opens it and is held with a pooled connection in hand, before its first
    //    statement (failpoint slow:pg_ledger_id, 1 s); meanwhile the server is stopped at once
    //    (connections cut) and, 2 s later, started again. (CI saw a relay exit 1 there: "error
    //    communicating with the server: Connection reset by peer".)
    // 3. The relay waits the outage out, publishes all three and exits 0.
    let mut outage = LedgerOutage::world(Store::Postgres);
    outage.world.add(&submissions(0..3));
    outage.world.drain(&[]);
    let mut cmd = outage.world.cmd(&["relay", "--exit-when-idle"]);
    cmd.env(claimgate::support::failpoint::ENV, "slow:pg_ledger_id");
    let mut relay = Logged::spawn_logging(cmd, "info");
    relay.wait_log("failpoint pg_ledger_id fired");
    outage.begin();
    std::thread::sleep(Duration::from_secs(2));
    outage.end();
    let status = crate::support::wait_exit(&mut relay.child, Duration::from_secs(60));
    assert!(status.success(), "{status}\n{}", relay.log_text());
    let w = &outage.world;
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0,
        "{}",
        relay.log_text()
    );
    assert_eq!(w.xlen("grants:events"), 3);
}
