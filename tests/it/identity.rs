//! Money and identity: amounts are bounded and every total is exact; a payload that repeats a
//! JSON key is refused; one instant is one instant for conflict detection, however it is
//! spelled. Each test drives the real binary against a real redis-server and a SQLite file.

use crate::support::World;

/// A submission of `amount_cents` for `award` at 09:00 UTC on 1 July 2026.
fn paying(award: &str, amount_cents: &str) -> String {
    format!(
        r#"{{"award_id":"{award}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{amount_cents}}}"#
    )
}

/// The dead letters' `reason_code`s, keyed by original entry id.
fn reason_codes(world: &World) -> std::collections::HashMap<String, String> {
    world
        .dead_letters()
        .into_iter()
        .map(|d| {
            let text = |f: &str| String::from_utf8(d[f].clone()).unwrap();
            (text("original_id"), text("reason_code"))
        })
        .collect()
}

#[test]
fn amounts_over_the_limit_are_dead_lettered_and_totals_stay_exact_past_i64() {
    // 1. Under the default limit ($1 billion): amounts of i64::MAX and limit + 1 are dead-
    //    lettered as amount_too_large; exactly the limit is paid.
    // 2. An operator who raises the limit to i64::MAX (as a ledger written before the limit
    //    existed would hold) gets two i64::MAX payments: the sum is past i64.
    // 3. `status`, `status --json` and `verify` still answer, with the exact total.
    let world = World::new();
    let max = i64::MAX.to_string();
    let refused = world.add(&[
        paying("A-1", &max),
        paying("A-2", &max),
        paying("A-3", "100000000001"),
    ]);
    world.add(&[paying("A-4", "100000000000")]);
    world.drain(&[]);
    let codes = reason_codes(&world);
    for id in &refused {
        assert_eq!(codes[id], "amount_too_large", "entry {id}");
    }
    assert_eq!(world.count("disbursements"), 1);
    assert_eq!(world.count("dead_letters"), 3);
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE reason_code = 'amount_too_large'"),
        3
    );

    world.add(&[paying("B-1", &max), paying("B-2", &max)]);
    world.drain(&["--amount-cents-max", &max]);
    assert_eq!(world.count("disbursements"), 3);

    let exact = (2 * i128::from(i64::MAX) + 100_000_000_000).to_string();
    let json = String::from_utf8(world.run_ok(&["status", "--json"]).stdout).unwrap();
    assert!(
        json.contains(&format!("\"disbursed_cents_total\": {exact}")),
        "{json}"
    );
    let table = String::from_utf8(world.run_ok(&["status"]).stdout).unwrap();
    assert!(
        table.contains(&format!("$184,467,441,737,095,516.14 ({exact} cents)")),
        "{table}"
    );
    world.run_ok(&["verify"]);
}

#[test]
fn a_payload_repeating_a_json_key_is_dead_lettered_and_not_paid() {
    // serde_json alone keeps the last value: this entry would have paid 200000 cents while a
    // reader that keeps the first value saw 1.
    let world = World::new();
    let top = world.add(&[
        r#"{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1,"amount_cents":200000}"#.to_owned(),
    ]);
    let nested = world.add(&[
        r#"{"award_id":"A-2","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1,"bank":{"iban":"X","iban":"Y"}}"#.to_owned(),
    ]);
    world.add(&[paying("A-3", "7")]);
    world.drain(&[]);
    let codes = reason_codes(&world);
    assert_eq!(codes[&top[0]], "duplicate_key");
    assert_eq!(codes[&nested[0]], "duplicate_key");
    assert_eq!(world.count("disbursements"), 1);
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        7
    );
    assert_eq!(world.pending(), 0);
}

/// Award `T-1` at `timestamp`, 500 cents: each spelling is its own payload and key.
fn spelled(timestamp: &str) -> String {
    format!(r#"{{"award_id":"T-1","submission_timestamp":"{timestamp}","amount_cents":500}}"#)
}

/// One award at one instant, spelled four ways.
const SPELLINGS: [&str; 4] = [
    "2026-07-01T09:00:00Z",
    "2026-07-01T11:00:00+02:00",
    "2026-07-01t09:00:00z",
    "2026-07-01T09:00:00.000Z",
];

#[test]
fn one_instant_spelled_four_ways_is_paid_with_three_conflicts_recorded() {
    // Under --on-conflict record (the default) every spelling is paid — they are different
    // bytes, so different submissions — and each later one leaves a conflict record.
    let world = World::new();
    world.add(&SPELLINGS.map(spelled));
    world.drain(&[]);
    assert_eq!(world.count("disbursements"), 4);
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'"),
        3
    );
    assert_eq!(
        world.sql_i64(
            "SELECT COUNT(*) FROM processed_messages
             WHERE submission_instant = '2026-07-01T09:00:00.000000000Z'"
        ),
        4,
        "four spellings, one stored instant"
    );
    world.run_ok(&["verify"]);
}

#[test]
fn one_instant_spelled_four_ways_is_paid_once_and_held_three_times_under_hold() {
    // Under --on-conflict hold only the first spelling is paid; the other three are held for
    // review: dead-lettered as conflict_hold, nothing claimed for them.
    let world = World::new();
    let ids = world.add(&SPELLINGS.map(spelled));
    world.drain(&["--on-conflict", "hold"]);
    assert_eq!(world.count("disbursements"), 1);
    assert_eq!(world.count("processed_messages"), 1);
    let codes = reason_codes(&world);
    for id in &ids[1..] {
        assert_eq!(codes[id], "conflict_hold", "entry {id}");
    }
    assert_eq!(world.pending(), 0);
    world.run_ok(&["verify"]);
}

#[test]
fn a_ledger_from_before_instants_is_upgraded_in_place_and_then_sees_the_conflict() {
    // 1. A ledger made with the previous release's schema pays T-1 at 09:00:00Z.
    // 2. It is taken back to the shape of the release before that: no submission_instant column and
    //    no claim_instant index (what every ledger made before this change looks like).
    // 3. A worker opens it and is fed the same instant spelled +02:00: the open adds the
    //    column, backfills the old claim's instant, and the new claim conflicts with it.
    // 4. Opening again changes nothing; verify passes.
    let world = World::new();
    rusqlite::Connection::open(&world.db)
        .unwrap()
        .execute_batch(include_str!("fixtures/schema-v2.sql"))
        .unwrap();
    world.add(&[spelled(SPELLINGS[0])]);
    world.drain(&[]);
    {
        let conn = rusqlite::Connection::open(&world.db).unwrap();
        conn.execute_batch(
            "DROP INDEX claim_instant;
             ALTER TABLE processed_messages DROP COLUMN submission_instant;",
        )
        .unwrap();
    }
    assert_eq!(
        world.sql_i64(
            "SELECT COUNT(*) FROM pragma_table_info('processed_messages')
             WHERE name = 'submission_instant'"
        ),
        0
    );

    world.add(&[spelled(SPELLINGS[1])]);
    world.drain(&[]);
    assert_eq!(
        world.sql_i64(
            "SELECT COUNT(*) FROM processed_messages
             WHERE submission_instant = '2026-07-01T09:00:00.000000000Z'"
        ),
        2,
        "the old claim was backfilled and the new one stored its instant"
    );
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'"),
        1
    );
    assert_eq!(
        world.sql_i64(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'claim_instant'"
        ),
        1
    );
    let records = world.count("audit_log");
    world.run_ok(&["verify"]);
    world.drain(&[]);
    assert_eq!(
        world.count("audit_log"),
        records,
        "a second open changes nothing"
    );
    assert_eq!(world.count("disbursements"), 2);
}

#[test]
fn a_vanished_entry_is_recorded_once_a_locked_ledger_clears() {
    // 1. Three entries are pending on consumer `me`; two are then XDELed.
    // 2. Another process holds the ledger's write lock: the restarted `me` finds the two gone
    //    but cannot record them; it waits (a transient failure), recording nothing and paying
    //    nothing. (Redis 7's XAUTOCLAIM drops deleted ids from the pending list itself as it
    //    reports them, so whether they are still pending here depends on which read found
    //    them; the record is what must not be lost.)
    // 3. Once the lock is released it records both as vanished, one record each, pays the
    //    third and exits when idle with nothing pending.
    let world = World::new();
    world.create_ledger();
    world.drain(&["--consumer", "me"]);
    let ids = world.add(&[paying("V-1", "1"), paying("V-2", "2"), paying("V-3", "3")]);
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("grant-workers")
        .arg("me")
        .arg("STREAMS")
        .arg("grants:submissions")
        .arg(">")
        .query(&mut world.conn())
        .unwrap();
    let _: u64 = redis::cmd("XDEL")
        .arg("grants:submissions")
        .arg(&ids[0])
        .arg(&ids[2])
        .query(&mut world.conn())
        .unwrap();
    assert_eq!(world.pending(), 3);

    let locker = rusqlite::Connection::open(&world.db).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut worker = crate::support::Logged::spawn(world.cmd(&[
        "run",
        "--exit-when-idle",
        "--consumer",
        "me",
        "--claim-idle-ms",
        "600000",
    ]));
    worker.wait_log("recording vanished entries in the ledger failed");
    assert!(worker.alive());
    assert_eq!(world.count("disbursements"), 0);
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'vanished'"),
        0
    );
    locker.execute_batch("ROLLBACK").unwrap();

    let status = crate::support::wait_exit(&mut worker.child, std::time::Duration::from_secs(60));
    assert!(status.success(), "{}", worker.log_text());
    assert_eq!(world.pending(), 0);
    for gone in [&ids[0], &ids[2]] {
        assert_eq!(
            world.sql_i64(&format!(
                "SELECT COUNT(*) FROM audit_log WHERE kind = 'vanished'
                 AND stream_entry_id = '{gone}' AND consumer = 'me'"
            )),
            1,
            "entry {gone}"
        );
    }
    assert_eq!(world.count("disbursements"), 1);
    assert_eq!(
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        2
    );
    world.run_ok(&["verify"]);
}
