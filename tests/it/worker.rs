//! The effectively-once worker, end to end: real redis-server, a real SQLite file or PostgreSQL
//! database (every test that touches a ledger runs on both), real processes.

use crate::support::{amount_sum, signal, submission, wait_exit, wait_for, Store, World};
use claimgate::domain::key::derive_idempotency_key;
use claimgate::ledger::{Backend, Item, Outcome};
use std::time::Duration;

/// The world's ledger through the library's one open step, whichever backend `--db` names.
fn ledger(world: &World) -> Box<dyn Backend> {
    claimgate::ledger::open(&crate::support::ledger_config(&world.db)).unwrap()
}

fn item<'a>(s: &'a claimgate::domain::submission::Submission, entry_id: &'a str) -> Item<'a> {
    Item::Submission {
        submission: s,
        entry_id,
        delivery_count: 1,
    }
}

on_both_ledgers!(
    reference_check_2_a_duplicate_claim_adds_no_row,
    reference_check_3_replay_after_commit_is_a_duplicate_with_one_disbursement,
    reference_check_4_a_failed_outbox_insert_leaves_no_disbursement_and_no_claim,
    the_database_refuses_a_second_disbursement_for_one_claim,
    the_same_payload_sent_twice_is_recorded_once,
    an_entry_left_pending_by_a_dead_consumer_is_taken_over_and_recorded_once,
    a_crash_after_commit_and_before_xack_is_absorbed_on_restart,
    a_crash_before_commit_loses_nothing_and_records_nothing_twice,
    two_worker_processes_on_one_stream_and_ledger_record_every_submission_once,
    sigterm_finishes_in_flight_work_and_exits_zero,
    redis_killed_and_restarted_mid_run_with_aof_loses_nothing_and_pays_nothing_twice,
    every_class_of_malformed_entry_is_dead_lettered_with_a_reason_and_the_rest_recorded_once,
    produce_and_key_agree_with_the_ledger,
);

// ----- The reference design's four checks, against the real ledger -----------------------------

// Pure: the key involves no ledger.
#[test]
fn reference_check_1_key_is_deterministic_and_payload_sensitive() {
    let a = derive_idempotency_key("A-2026-014", "2026-07-01T09:00:00Z", b"{...}").unwrap();
    let b = derive_idempotency_key("A-2026-014", "2026-07-01T09:00:00Z", b"{...}").unwrap();
    let c = derive_idempotency_key("A-2026-014", "2026-07-01T09:00:00Z", b"{..,}").unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_hex().len(), 64);
    assert_ne!(a, c, "one changed payload byte must give a different key");
}

fn reference_check_2_a_duplicate_claim_adds_no_row(store: Store) {
    let world = World::on(store);
    let ledger = ledger(&world);
    let s = crate::support::parsed(1);
    assert_eq!(
        ledger
            .record(&[item(&s, "1-0")], "c", "grants:submissions")
            .unwrap(),
        vec![Outcome::Processed]
    );
    let second = ledger
        .record(&[item(&s, "1-0")], "c", "grants:submissions")
        .unwrap();
    assert!(matches!(second[0], Outcome::Duplicate { .. }), "{second:?}");
    assert_eq!(world.count("processed_messages"), 1);
}

fn reference_check_3_replay_after_commit_is_a_duplicate_with_one_disbursement(store: Store) {
    let world = World::on(store);
    let ledger = ledger(&world);
    let s = crate::support::parsed(7);
    ledger
        .record(&[item(&s, "5-0")], "worker-a", "grants:submissions")
        .unwrap();
    // Redelivery under another entry id (a producer that sent twice) or the same one.
    let replay = ledger
        .record(
            &[item(&s, "9-0"), item(&s, "5-0")],
            "worker-b",
            "grants:submissions",
        )
        .unwrap();
    assert!(
        replay
            .iter()
            .all(|o| matches!(o, Outcome::Duplicate { .. })),
        "{replay:?}"
    );
    assert_eq!(world.count("disbursements"), 1);
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        107
    );
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        2
    );
}

fn reference_check_4_a_failed_outbox_insert_leaves_no_disbursement_and_no_claim(store: Store) {
    let world = World::on(store);
    let ledger = ledger(&world);
    // A real trigger in the database makes every outbox insert fail inside the transaction.
    let mut conn = world.sql();
    let (fail, unfail) = match store {
        Store::Sqlite => (
            "CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'forced outbox failure'); END;",
            "DROP TRIGGER fail_outbox",
        ),
        Store::Postgres => (
            "CREATE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'forced outbox failure'; END $$;
             CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox_rows
             FOR EACH ROW EXECUTE FUNCTION fail_outbox();",
            "DROP TRIGGER fail_outbox ON outbox_rows",
        ),
    };
    conn.exec(fail);
    let s = crate::support::parsed(3);
    let err = ledger
        .record(&[item(&s, "1-0")], "c", "grants:submissions")
        .unwrap_err();
    assert!(err.to_string().contains("forced outbox failure"), "{err}");
    assert_eq!(world.count("processed_messages"), 0);
    assert_eq!(world.count("disbursements"), 0);
    assert_eq!(world.count("audit_log"), 0);
    // Once the fault is gone the same submission is a first claim, not a duplicate.
    conn.exec(unfail);
    assert_eq!(
        ledger
            .record(&[item(&s, "1-0")], "c", "grants:submissions")
            .unwrap(),
        vec![Outcome::Processed]
    );
    assert_eq!(world.count("disbursements"), 1);
}

fn the_database_refuses_a_second_disbursement_for_one_claim(store: Store) {
    let world = World::on(store);
    let ledger = ledger(&world);
    let s = crate::support::parsed(1);
    ledger
        .record(&[item(&s, "1-0")], "c", "grants:submissions")
        .unwrap();
    let err = world
        .sql()
        .try_exec("INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents, recorded_at) SELECT claim_id, idempotency_key, award_id, 1, 'now' FROM processed_messages")
        .unwrap_err();
    // SQLite says "UNIQUE constraint failed", PostgreSQL "violates unique constraint (23505)".
    assert!(err.to_lowercase().contains("unique"), "{err}");
    assert_eq!(world.count("disbursements"), 1);
}

// ----- Redelivery ------------------------------------------------------------------------------

fn the_same_payload_sent_twice_is_recorded_once(store: Store) {
    let world = World::on(store);
    let payloads: Vec<String> = (0..50)
        .map(submission)
        .chain((0..50).map(submission))
        .collect();
    world.add(&payloads);
    world.drain(&[]);
    assert_eq!(world.count("disbursements"), 50);
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(50)
    );
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        50
    );
    assert_eq!(world.count("outbox"), 50);
    assert_eq!(world.pending(), 0);
}

fn an_entry_left_pending_by_a_dead_consumer_is_taken_over_and_recorded_once(store: Store) {
    // 1. Queue 20 submissions.
    // 2. A consumer reads them all and dies without acknowledging (a plain XREADGROUP, no ack).
    // 3. A worker with a short --claim-idle-ms takes them over with XAUTOCLAIM.
    // 4. Each is recorded once and nothing is left pending.
    let world = World::on(store);
    world.add(&(0..20).map(submission).collect::<Vec<_>>());
    let mut conn = world.conn();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("grants:submissions")
        .arg("grant-workers")
        .arg("0")
        .query(&mut conn)
        .unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("grant-workers")
        .arg("dead-consumer")
        .arg("COUNT")
        .arg(100)
        .arg("STREAMS")
        .arg("grants:submissions")
        .arg(">")
        .query(&mut conn)
        .unwrap();
    assert_eq!(world.pending(), 20);
    std::thread::sleep(Duration::from_millis(250));
    world.run_ok(&[
        "run",
        "--exit-when-idle",
        "--claim-idle-ms",
        "200",
        "--consumer",
        "rescuer",
    ]);
    assert_eq!(world.count("disbursements"), 20);
    assert_eq!(world.pending(), 0);
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM processed_messages WHERE consumer = 'rescuer'"),
        20
    );
    // The takeover shows in the audit trail as a second delivery.
    assert_eq!(
        world.sql_i64("SELECT MIN(delivery_count) FROM audit_log WHERE kind = 'processed'"),
        2
    );
}

// ----- The crash window ------------------------------------------------------------------------

fn a_crash_after_commit_and_before_xack_is_absorbed_on_restart(store: Store) {
    // 1. Queue 30 submissions.
    // 2. A worker aborts right after its first commit, before XACK (failpoint after_commit).
    // 3. The ledger holds the committed batch; the entries are still pending.
    // 4. The same consumer restarts, re-reads its pending entries: all duplicates, acked.
    let world = World::on(store);
    world.add(&(0..30).map(submission).collect::<Vec<_>>());
    let out = world.crash_at(
        world.cmd(&["run", "--consumer", "w1", "--exit-when-idle"]),
        "after_commit",
    );
    assert!(
        !out.status.success(),
        "the failpoint should have killed the worker"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("failpoint after_commit fired"));
    let committed = world.count("disbursements");
    assert!(committed > 0, "the batch committed before the crash");
    assert_eq!(world.pending(), 30, "nothing was acknowledged");

    world.run_ok(&["run", "--consumer", "w1", "--exit-when-idle"]);
    assert_eq!(world.count("disbursements"), 30);
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(30)
    );
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        committed
    );
    assert_eq!(world.pending(), 0);
}

fn a_crash_before_commit_loses_nothing_and_records_nothing_twice(store: Store) {
    let world = World::on(store);
    world.add(&(0..30).map(submission).collect::<Vec<_>>());
    for point in ["after_claim", "before_commit"] {
        let out = world.crash_at(world.cmd(&["run", "--consumer", "w1"]), point);
        assert!(!out.status.success(), "{point} should have fired");
        assert_eq!(
            world.count("processed_messages"),
            0,
            "{point}: the open transaction rolled back"
        );
    }
    world.run_ok(&["run", "--consumer", "w1", "--exit-when-idle"]);
    assert_eq!(world.count("disbursements"), 30);
    assert_eq!(world.count("audit_log"), 30);
    assert_eq!(world.pending(), 0);
}

// ----- Concurrency -----------------------------------------------------------------------------

fn two_worker_processes_on_one_stream_and_ledger_record_every_submission_once(store: Store) {
    let world = World::on(store);
    let unique = 3_000;
    let mut payloads: Vec<String> = (0..unique).map(submission).collect();
    payloads.extend((0..unique).step_by(4).map(submission));
    world.add(&payloads);
    let mut a = world.spawn(&[
        "run",
        "--consumer",
        "a",
        "--exit-when-idle",
        "--batch-count-max",
        "50",
    ]);
    let mut b = world.spawn(&[
        "run",
        "--consumer",
        "b",
        "--exit-when-idle",
        "--batch-count-max",
        "50",
    ]);
    assert!(wait_exit(&mut a, Duration::from_secs(120)).success());
    assert!(wait_exit(&mut b, Duration::from_secs(120)).success());
    if store == Store::Sqlite {
        // Each SQLite batch opens with BEGIN IMMEDIATE, so a writer waits for the other inside
        // the busy timeout; a deferred transaction would read, then fail at once to upgrade
        // (SQLITE_BUSY_SNAPSHOT) whenever the other had committed meanwhile, and retry.
        for log in [a.log_text(), b.log_text()] {
            assert!(!log.contains("committing to the ledger failed"), "{log}");
        }
    }
    assert_eq!(world.count("disbursements"), unique as i64);
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(unique)
    );
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        (unique / 4) as i64
    );
    assert_eq!(world.pending(), 0);
    assert!(world.sql_i64("SELECT COUNT(DISTINCT consumer) FROM processed_messages") >= 1);
}

fn sigterm_finishes_in_flight_work_and_exits_zero(store: Store) {
    let world = World::on(store);
    world.add(&(0..2_000).map(submission).collect::<Vec<_>>());
    let mut worker = world.spawn(&["run", "--consumer", "t", "--batch-count-max", "100"]);
    assert!(wait_for(Duration::from_secs(30), || world
        .count_once_made("disbursements")
        > 0));
    signal(&worker, libc::SIGTERM);
    let status = wait_exit(&mut worker, Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM should end the worker with 0, got {status}"
    );
    // Whatever was committed was also acknowledged: pending + recorded = everything.
    let recorded = world.count("disbursements") as u64;
    assert_eq!(
        world.pending(),
        0,
        "in-flight entries were finished and acknowledged"
    );
    world.drain(&[]);
    assert_eq!(world.count("disbursements"), 2_000);
    assert!(recorded <= 2_000);
}

// ----- Redis goes away -------------------------------------------------------------------------

fn redis_killed_and_restarted_mid_run_with_aof_loses_nothing_and_pays_nothing_twice(store: Store) {
    // 1. A persistent Redis (AOF, appendfsync always) and a running worker.
    // 2. Submissions arrive in two waves; between them Redis is SIGKILLed and restarted.
    // 3. The worker reconnects by itself; the ledger is exact.
    let mut world = World::persistent_on(store);
    world.add(&(0..1_000).map(submission).collect::<Vec<_>>());
    let mut worker = world.spawn(&["run", "--consumer", "w", "--claim-idle-ms", "500"]);
    assert!(wait_for(Duration::from_secs(30), || world
        .count_once_made("disbursements")
        > 0));
    world.redis.kill();
    std::thread::sleep(Duration::from_millis(500));
    world.redis.restart().unwrap();
    world.add(&(1_000..2_000).map(submission).collect::<Vec<_>>());
    world.add(&(0..200).map(submission).collect::<Vec<_>>());
    let done = wait_for(Duration::from_secs(60), || {
        world.count_once_made("disbursements") == 2_000 && world.pending() == 0
    });
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker must not exit when Redis goes away"
    );
    signal(&worker, libc::SIGTERM);
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());
    assert!(
        done,
        "not drained: {} disbursements, {} pending",
        world.count("disbursements"),
        world.pending()
    );
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(2_000)
    );
}

// ----- Bad input -------------------------------------------------------------------------------

fn every_class_of_malformed_entry_is_dead_lettered_with_a_reason_and_the_rest_recorded_once(
    store: Store,
) {
    let world = World::on(store);
    let ts = "2026-07-01T09:00:00Z";
    world.add(&[submission(1)]);
    type Fields = Vec<(&'static str, Vec<u8>)>;
    let bad: Vec<(&str, Fields)> = vec![
        ("missing_payload", vec![("body", b"{}".to_vec())]),
        ("ambiguous_payload", vec![("payload", submission(90).into_bytes()), ("payload", submission(91).into_bytes())]),
        ("payload_too_large", vec![("payload", format!(r#"{{"award_id":"A-big","submission_timestamp":"{ts}","amount_cents":1,"pad":"{}"}}"#, "x".repeat(600)).into_bytes())]),
        ("not_json", vec![("payload", b"{not json".to_vec())]),
        ("not_json", vec![("payload", vec![0xff, 0xfe, 0x00])]),
        ("not_an_object", vec![("payload", b"[1,2,3]".to_vec())]),
        ("missing_field", vec![("payload", format!(r#"{{"award_id":"A-m","submission_timestamp":"{ts}"}}"#).into_bytes())]),
        ("wrong_type", vec![("payload", format!(r#"{{"award_id":12,"submission_timestamp":"{ts}","amount_cents":1}}"#).into_bytes())]),
        ("empty_award_id", vec![("payload", format!(r#"{{"award_id":"","submission_timestamp":"{ts}","amount_cents":1}}"#).into_bytes())]),
        ("bad_timestamp", vec![("payload", br#"{"award_id":"A-t","submission_timestamp":"July 1st","amount_cents":1}"#.to_vec())]),
        ("amount_not_positive", vec![("payload", format!(r#"{{"award_id":"A-z","submission_timestamp":"{ts}","amount_cents":0}}"#).into_bytes())]),
        ("amount_not_integer", vec![("payload", format!(r#"{{"award_id":"A-f","submission_timestamp":"{ts}","amount_cents":12.5}}"#).into_bytes())]),
        ("amount_out_of_range", vec![("payload", format!(r#"{{"award_id":"A-o","submission_timestamp":"{ts}","amount_cents":99999999999999999999}}"#).into_bytes())]),
    ];
    let mut bad_ids = Vec::new();
    for (_, fields) in &bad {
        let refs: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        bad_ids.push(world.add_fields(&refs));
    }
    world.add(&[submission(2), submission(1)]);
    world.drain(&["--payload-bytes-max", "512"]);

    assert_eq!(world.count("disbursements"), 2);
    assert_eq!(world.pending(), 0);
    let dead = world.dead_letters();
    assert_eq!(dead.len(), bad.len());
    for ((code, fields), id) in bad.iter().zip(&bad_ids) {
        let d = dead
            .iter()
            .find(|d| d["original_id"] == id.as_bytes())
            .unwrap_or_else(|| panic!("{id} ({code}) not dead-lettered"));
        assert_eq!(String::from_utf8_lossy(&d["reason_code"]), *code);
        assert!(!d["reason"].is_empty());
        // The map keeps the last of repeated names (the ambiguous case), so compare the last.
        let (name, value) = fields.last().unwrap();
        assert_eq!(
            &d[&format!("original.{name}")],
            value,
            "original fields are kept"
        );
    }
    assert_eq!(world.count("dead_letters"), bad.len() as i64);
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'dead_letter'"),
        bad.len() as i64
    );
}

// ----- Command line ----------------------------------------------------------------------------

// Flag parsing and a SQLite path; PostgreSQL's bad URLs are in shared_ledger.rs.
#[test]
fn bad_flags_and_configuration_exit_2_with_one_clear_line() {
    let world = World::new();
    let out = world.run(&["run", "--threads", "0"]);
    assert_eq!(out.status.code(), Some(2));
    // A payload limit no submission fits under would dead-letter every entry: refused before
    // anything is read. 256 is the floor and is accepted.
    world.add(&[submission(1)]);
    for bad in ["0", "255", "536870913"] {
        let out = world.run(&["run", "--exit-when-idle", "--payload-bytes-max", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--payload-bytes-max"), "{stderr}");
    }
    assert_eq!(world.pending(), 0);
    assert_eq!(world.xlen("grants:submissions:dead"), 0);
    world.drain(&["--payload-bytes-max", "256"]);
    assert_eq!(world.count("disbursements"), 1);
    let out = world.run(&["run", "--redis-url", "http://nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad --redis-url"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `run` creates its ledger, and cannot where there is no directory; `status` never creates
    // one, and says there is none.
    let out = world.run(&["run", "--db", "/nonexistent-dir/ledger.db"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot create ledger /nonexistent-dir/ledger.db"));
    let out = world.run(&["status", "--db", "/nonexistent-dir/ledger.db"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no ledger at /nonexistent-dir/ledger.db")
    );
    let out = world.run(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

// Flag parsing: `--synchronous` is SQLite's PRAGMA; `--on-conflict hold` on both is in
// audit.rs.
#[test]
fn synchronous_and_on_conflict_accept_exactly_their_values() {
    let world = World::new();
    for (flag, bad) in [("--synchronous", "off"), ("--on-conflict", "drop")] {
        let out = world.run(&["run", "--exit-when-idle", flag, bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {bad}: {stderr}");
        assert!(stderr.contains("possible values"), "{stderr}");
    }
    world.add(&[submission(1)]);
    world.drain(&["--synchronous", "normal", "--on-conflict", "hold"]);
    world.drain(&["--synchronous", "full", "--on-conflict", "record"]);
    assert_eq!(world.count("disbursements"), 1);
}

// `produce` never opens a ledger.
#[test]
fn unreachable_redis_is_a_clear_failure_for_one_shot_commands() {
    let world = World::new();
    let port = claimgate::support::localredis::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let input = world.dir.path().join("in.jsonl");
    std::fs::write(&input, submission(1)).unwrap();
    let out = world.run(&["produce", input.to_str().unwrap(), "--redis-url", &url]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("claimgate: redis:"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

fn produce_and_key_agree_with_the_ledger(store: Store) {
    let world = World::on(store);
    let input = world.dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        format!(
            "{}\n\n{}\n{}\n",
            submission(1),
            submission(2),
            submission(1)
        ),
    )
    .unwrap();
    let out = world.run_ok(&["produce", input.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "queued 3 submissions on grants:submissions"
    );
    world.drain(&[]);
    assert_eq!(world.count("disbursements"), 2);

    let payload_file = world.dir.path().join("payload.json");
    std::fs::write(&payload_file, submission(1)).unwrap();
    let out = world.run_ok(&[
        "key",
        "--award-id",
        "A-000001",
        "--timestamp",
        "2026-07-01T09:00:00Z",
        "--payload-file",
        payload_file.to_str().unwrap(),
    ]);
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(printed.len(), 64);
    let stored = world.sql_i64(&format!(
        "SELECT COUNT(*) FROM processed_messages WHERE {} = '{printed}'",
        world.hex_sql("idempotency_key")
    ));
    assert_eq!(stored, 1, "the printed key is the one the ledger claimed");
    // A file made with `echo` ends in a newline, which produce never sends: the same key, and
    // a note saying why; --exact hashes the newline too (another key).
    std::fs::write(&payload_file, format!("{}\n", submission(1))).unwrap();
    let key = |exact: bool| {
        let mut args = vec![
            "key",
            "--award-id",
            "A-000001",
            "--timestamp",
            "2026-07-01T09:00:00Z",
            "--payload-file",
            payload_file.to_str().unwrap(),
        ];
        if exact {
            args.push("--exact");
        }
        world.run_ok(&args)
    };
    let echoed = key(false);
    assert_eq!(String::from_utf8_lossy(&echoed.stdout).trim(), printed);
    assert!(String::from_utf8_lossy(&echoed.stderr).contains("line ending is not part"));
    assert_ne!(String::from_utf8_lossy(&key(true).stdout).trim(), printed);
}
