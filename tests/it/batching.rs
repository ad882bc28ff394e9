//! Correctness under group commit: many entries per transaction and one XACK per batch must
//! still pay each submission exactly once, whatever sits next to it in the batch and wherever
//! the process dies. Speed is measured in `examples/bench.rs`, never asserted here.

use crate::support::{amount_sum, submission, World};

/// Ledger facts every scenario checks together.
fn assert_ledger(w: &World, paid: usize, duplicates: i64) {
    assert_eq!(w.count("disbursements"), paid as i64, "disbursements");
    assert_eq!(w.count("processed_messages"), paid as i64, "claims");
    assert_eq!(w.count("outbox"), paid as i64, "outbox rows");
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(paid),
        "cents paid"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(DISTINCT claim_id) FROM disbursements"),
        paid as i64,
        "one per claim"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'"),
        paid as i64,
        "processed records"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        duplicates,
        "duplicate records"
    );
    assert_eq!(w.pending(), 0, "nothing left pending");
}

#[test]
fn duplicates_inside_one_batch_and_across_batches_are_each_paid_once() {
    // 1. Each of 40 submissions twice, side by side, all read in one batch.
    // 2. The same 40 again plus 10 new ones, read 7 at a time: duplicates across batches.
    let w = World::new();
    let first: Vec<String> = (0..40)
        .flat_map(|i| [submission(i), submission(i)])
        .collect();
    w.add(&first);
    w.drain(&[]);
    assert_ledger(&w, 40, 40);

    let second: Vec<String> = (0..50).map(submission).collect();
    w.add(&second);
    w.drain(&["--batch-count-max", "7"]);
    assert_ledger(&w, 50, 80);
}

#[test]
fn a_crash_between_a_batchs_commit_and_its_xack_pays_nothing_twice() {
    // 1. 30 submissions queued; the worker reads them in one batch, commits, and dies at the
    //    failpoint before XACK: all 30 are in the ledger and all 30 still pending.
    // 2. The same consumer restarts, re-reads its pending entries, finds every claim taken,
    //    acknowledges them as duplicates.
    let w = World::new();
    w.add(&(0..30).map(submission).collect::<Vec<_>>());
    let crashed = w.crash_at(
        w.cmd(&["run", "--exit-when-idle", "--consumer", "c1"]),
        "after_commit",
    );
    assert!(
        !crashed.status.success(),
        "the failpoint should have aborted the worker"
    );
    assert_eq!(
        w.count("disbursements"),
        30,
        "the batch committed before the crash"
    );
    assert_eq!(w.pending(), 30, "and none of it was acknowledged");

    w.drain(&["--consumer", "c1"]);
    assert_ledger(&w, 30, 30);
}

#[test]
fn a_malformed_entry_in_the_middle_of_a_batch_is_dead_lettered_and_the_rest_commits() {
    // 1. Five good submissions, one that is not JSON, five more good ones: one batch.
    // 2. Ten are paid, the bad one is on the dead-letter stream with its reason and leaves
    //    one dead-letter audit record; nothing stays pending.
    let w = World::new();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    let bad_id = w.add_fields(&[("payload", b"{not json")]);
    w.add(&(5..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);

    assert_ledger(&w, 10, 0);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), 1, "one dead letter");
    assert_eq!(
        dead[0].get("original_id").map(|v| v.as_slice()),
        Some(bad_id.as_bytes())
    );
    assert_eq!(
        dead[0].get("reason_code").map(|v| v.as_slice()),
        Some(&b"not_json"[..])
    );
    assert_eq!(w.count("dead_letters"), 1);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'dead_letter'"),
        1
    );
}

#[test]
fn the_fast_filter_skips_the_claim_lookup_only_for_keys_committed_earlier() {
    // 1. 20 submissions drained with --fast-filter: markers are written after the commit.
    // 2. The same 20 plus 5 new ones: the 20 are recognised from their markers and still
    //    leave duplicate audit records; the 5 new ones miss and are paid.
    let w = World::new();
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    w.drain(&["--fast-filter"]);
    assert_ledger(&w, 20, 0);

    w.add(&(0..25).map(submission).collect::<Vec<_>>());
    w.drain(&["--fast-filter"]);
    assert_ledger(&w, 25, 20);
    let vouched =
        "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate' AND detail LIKE '%(fast filter)'";
    assert_eq!(
        w.sql_i64(vouched),
        20,
        "every repeat was answered by its marker"
    );
}

#[test]
fn the_fast_filter_marks_nothing_before_the_commit_so_a_crash_loses_nothing() {
    // 1. 15 submissions; the worker dies just before its commit (the unsafe "SET NX first"
    //    design would already have marked them, and the restart would skip them all).
    // 2. The restart with the filter on finds no markers, asks the ledger, pays all 15.
    let w = World::new();
    w.add(&(0..15).map(submission).collect::<Vec<_>>());
    let crashed = w.crash_at(
        w.cmd(&[
            "run",
            "--exit-when-idle",
            "--consumer",
            "c1",
            "--fast-filter",
        ]),
        "before_commit",
    );
    assert!(
        !crashed.status.success(),
        "the failpoint should have aborted the worker"
    );
    assert_eq!(w.count("disbursements"), 0, "nothing committed");
    let markers: Vec<String> = redis::cmd("KEYS")
        .arg("grants:submissions:committed:*")
        .query(&mut w.conn())
        .unwrap();
    assert!(
        markers.is_empty(),
        "no marker may exist for an uncommitted key: {markers:?}"
    );

    w.drain(&["--consumer", "c1", "--fast-filter"]);
    assert_ledger(&w, 15, 0);
}

#[test]
fn a_ledger_made_by_the_previous_schema_keeps_paying_each_submission_once() {
    // 1. A ledger created by the previous release's schema (claims unique on the key alone,
    //    plus the award/time index), holding 10 paid submissions' claims.
    // 2. The new worker opens it, applies today's schema (which changes nothing there) and
    //    drains the same 10 again plus 10 new ones, twice each: 20 paid, 30 duplicates.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    {
        let conn = rusqlite::Connection::open(&w.db).unwrap();
        conn.execute_batch(include_str!("fixtures/schema-v1.sql"))
            .unwrap();
    }
    w.drain(&[]);
    assert_ledger(&w, 10, 0);
    let indexes = w.sql_i64(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'processed_messages'",
    );
    assert_eq!(
        indexes, 3,
        "the old ledger keeps its own two indexes and gains the instant index"
    );

    let again: Vec<String> = (0..20)
        .flat_map(|i| [submission(i), submission(i)])
        .collect();
    w.add(&again);
    w.drain(&["--batch-count-max", "9"]);
    assert_ledger(&w, 20, 30);
    w.run_ok(&["verify"]);
}

#[test]
fn the_database_itself_refuses_a_second_claim_of_one_key() {
    // The claim is unique on (submission instant, award, key); the key is derived from exactly
    // that award and a timestamp naming that instant, so this is uniqueness of the key. Proved
    // on the real schema with raw SQL, outside any claimgate code path.
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let conn = rusqlite::Connection::open(&w.db).unwrap();
    let copy = "INSERT INTO processed_messages (idempotency_key, award_id, submission_timestamp,
                amount_cents, claimed_at, stream_entry_id, consumer, submission_instant)
                SELECT idempotency_key, award_id, submission_timestamp, amount_cents, 'now', 'x', 'y',
                       submission_instant
                FROM processed_messages";
    let refused = conn.execute(copy, []).unwrap_err().to_string();
    assert!(refused.contains("UNIQUE constraint failed"), "{refused}");
    assert_eq!(w.count("processed_messages"), 1, "still one claim");
}

/// The indexes SQLite keeps on `table` (its own automatic ones for UNIQUE included).
fn indexes_on(w: &World, table: &str) -> i64 {
    w.sql_i64(&format!(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}'"
    ))
}

#[test]
fn a_new_ledger_keeps_one_index_per_claim_and_none_beside_the_disbursements_key() {
    // The claim's one index (instant, award, key) is both the claim and the conflict probe;
    // disbursements are keyed by their claim. Fewer B-trees per submission, same guarantees:
    // a conflicting resubmission is still found, a second disbursement still refused.
    let w = World::new();
    let conflicting =
        r#"{"award_id":"A-000001","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":5}"#;
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.add(&[conflicting.to_owned()]);
    w.drain(&[]);
    assert_eq!(indexes_on(&w, "processed_messages"), 1);
    assert_eq!(indexes_on(&w, "disbursements"), 0);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'"),
        1
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM disbursements WHERE id = claim_id"),
        11,
        "a disbursement's number is its claim's"
    );
    let conn = rusqlite::Connection::open(&w.db).unwrap();
    let refused = conn
        .execute(
            "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents, recorded_at)
             SELECT claim_id, idempotency_key, award_id, 1, 'now' FROM processed_messages LIMIT 1",
            [],
        )
        .unwrap_err()
        .to_string();
    assert!(refused.contains("UNIQUE constraint failed"), "{refused}");
    w.run_ok(&["verify"]);
}

#[test]
fn a_ledger_made_by_the_release_before_keeps_its_indexes_and_pays_each_submission_once() {
    // 1. A ledger created with the previous release's schema (claims unique on the spelled
    //    timestamp, a separate claim_instant index, disbursements with their own id) holds ten
    //    paid submissions.
    // 2. This release opens it, changes none of its tables, and drains the ten again, ten new
    //    ones and a resubmission conflicting with one of the first: 21 paid, 10 duplicates, the
    //    conflict found through claim_instant; verify passes.
    let w = World::new();
    rusqlite::Connection::open(&w.db)
        .unwrap()
        .execute_batch(include_str!("fixtures/schema-v2.sql"))
        .unwrap();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_ledger(&w, 10, 0);
    assert_eq!(indexes_on(&w, "processed_messages"), 2);
    assert_eq!(indexes_on(&w, "disbursements"), 1);
    let conflicting =
        r#"{"award_id":"A-000003","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":5}"#;
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    w.add(&[conflicting.to_owned()]);
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 21);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        10
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'"),
        1
    );
    assert_eq!(indexes_on(&w, "processed_messages"), 2, "nothing added");
    w.run_ok(&["verify"]);
}
