//! The audit trail and the ledger's self-checks: counts, export, tampering caught and undone,
//! `verify`, conflicting resubmissions, retention and legal holds; every test on both ledgers,
//! each tampering done in SQL both dialects share.

use crate::support::{self, Store, World};
use claimgate::domain::audit::{detail, seal_batch, Kind, Record, GENESIS_HASH};
use std::process::Output;

on_both_ledgers!(
    audit_records_match_what_happened_and_every_tampering_is_caught_and_undone,
    verify_catches_an_edited_amount_and_a_deleted_outbox_row,
    a_conflicting_resubmission_is_recorded_and_under_hold_is_dead_lettered_unpaid,
    retention_refuses_the_window_held_awards_and_unpublished_events_and_keeps_the_chain_verifiable,
    a_purge_that_cannot_find_a_records_claim_removes_nothing,
    a_purge_batch_asked_for_without_a_plan_finds_its_claims_itself,
    a_processed_record_resealed_to_another_amount_fails_verify,
);

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `claimgate ARGS`, insists on exit 1, and returns stderr.
fn fails(w: &World, args: &[&str]) -> String {
    let out = w.run(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "claimgate {args:?} should fail: {}",
        stderr(&out)
    );
    stderr(&out)
}

fn kind_count(w: &World, kind: &str) -> i64 {
    w.sql_i64(&format!(
        "SELECT COUNT(*) FROM audit_log WHERE kind = '{kind}'"
    ))
}

/// Every column of one audit row except seq, to put back later.
const COLS: &str = "kind, idempotency_key, award_id, amount_cents, stream_entry_id, consumer, delivery_count, detail, recorded_at, prev_hash, hash";

fn audit_records_match_what_happened_and_every_tampering_is_caught_and_undone(store: Store) {
    // Plan:
    // 1. 30 submissions, 3 of them sent twice, 2 malformed entries; drain.
    // 2. Counts of processed/duplicate/dead_letter records match; the chain verifies; an export
    //    verifies on its own.
    // 3. In the ledger: edit one byte, delete one record, swap two; each is caught at the right
    //    seq, and undoing it makes verify pass again.
    // 4. In the export file: the same three, caught and undone.
    let w = World::on(store);
    let mut payloads: Vec<String> = (0..30).map(support::submission).collect();
    payloads.extend((0..3).map(support::submission));
    w.add(&payloads);
    w.add_fields(&[("payload", b"{not json")]);
    w.add_fields(&[("other", b"x")]);
    w.drain(&[]);
    assert_eq!(
        (
            kind_count(&w, "processed"),
            kind_count(&w, "duplicate"),
            kind_count(&w, "dead_letter")
        ),
        (30, 3, 2)
    );
    assert_eq!(w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate' AND detail LIKE 'first claimed at %' AND delivery_count = 1 AND consumer IS NOT NULL"), 3);
    // A key is stored as its 32 bytes (format 6 of both ledgers).
    assert_eq!(w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed' AND amount_cents > 0 AND length(idempotency_key) = 32 AND stream_entry_id IS NOT NULL"), 30);
    w.run_ok(&["audit", "verify"]);
    let export = w.dir.path().join("audit.jsonl");
    w.run_ok(&["audit", "export", "--out", export.to_str().unwrap()]);
    let file_arg = ["audit", "verify", "--file", export.to_str().unwrap()];
    w.run_ok(&file_arg);

    // One session throughout: the saved rows live in its temporary tables (unqualified names
    // find a temporary table first in both dialects).
    let mut db = w.sql();
    let (table, at10) = record_row(store, 10);
    db.exec(&format!(
        "UPDATE {table} SET amount_cents = amount_cents + 1 WHERE {at10}"
    ));
    assert!(fails(&w, &["audit", "verify"]).contains("seq 10"));
    db.exec(&format!(
        "UPDATE {table} SET amount_cents = amount_cents - 1 WHERE {at10}"
    ));
    w.run_ok(&["audit", "verify"]);

    let (_, at12) = record_row(store, 12);
    db.exec(&format!(
        "CREATE TEMP TABLE saved AS SELECT * FROM {table} WHERE {at12};
         DELETE FROM {table} WHERE {at12};"
    ));
    assert!(fails(&w, &["audit", "verify"]).contains("seq 13"));
    db.exec(&format!(
        "INSERT INTO {table} SELECT * FROM saved; DROP TABLE saved;"
    ));
    w.run_ok(&["audit", "verify"]);

    // Records 5 and 6 trade places: each row keeps its place (seq, or place in its batch)
    // and takes the other's content.
    let swap = match store {
        Store::Sqlite => format!(
            "CREATE TEMP TABLE a AS SELECT {COLS} FROM audit_log WHERE seq = 5;
             CREATE TEMP TABLE b AS SELECT {COLS} FROM audit_log WHERE seq = 6;
             DELETE FROM audit_log WHERE seq IN (5, 6);
             INSERT INTO audit_log (seq, {COLS}) SELECT 5, * FROM b;
             INSERT INTO audit_log (seq, {COLS}) SELECT 6, * FROM a;
             DROP TABLE a; DROP TABLE b;"
        ),
        Store::Postgres => {
            let (_, at5) = record_row(store, 5);
            let (_, at6) = record_row(store, 6);
            format!(
                "CREATE TEMP TABLE a AS SELECT * FROM audit_members WHERE {at5};
                 CREATE TEMP TABLE b AS SELECT * FROM audit_members WHERE {at6};
                 UPDATE audit_members m SET ({COLS}) = (SELECT {COLS} FROM b)
                 FROM a WHERE (m.batch_id, m.batch_index) = (a.batch_id, a.batch_index);
                 UPDATE audit_members m SET ({COLS}) = (SELECT {COLS} FROM a)
                 FROM b WHERE (m.batch_id, m.batch_index) = (b.batch_id, b.batch_index);
                 DROP TABLE a; DROP TABLE b;"
            )
        }
    };
    db.exec(&swap);
    assert!(fails(&w, &["audit", "verify"]).contains("seq 5"));
    db.exec(&swap);
    w.run_ok(&["audit", "verify"]);

    let original = std::fs::read_to_string(&export).unwrap();
    let lines: Vec<&str> = original.lines().collect();
    let edited = original.replacen("\"consumer\":\"", "\"consumer\":\"X", 1);
    for tampered in [
        edited,
        lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 7)
            .map(|(_, l)| format!("{l}\n"))
            .collect::<String>(),
        {
            let mut swapped = lines.clone();
            swapped.swap(3, 4);
            swapped.iter().map(|l| format!("{l}\n")).collect::<String>()
        },
    ] {
        std::fs::write(&export, tampered).unwrap();
        assert!(fails(&w, &file_arg).contains("audit chain broken at seq"));
    }
    std::fs::write(&export, &original).unwrap();
    w.run_ok(&file_arg);

    // An increment exported with --since verifies against the hash its predecessor ended on.
    let tail = w.dir.path().join("since20.jsonl");
    w.run_ok(&[
        "audit",
        "export",
        "--since",
        "20",
        "--out",
        tail.to_str().unwrap(),
    ]);
    // What the tail continues from: the hash at seq 19 in the full export (on a shared
    // ledger, the link closing seq 19's batch when 19 ends one, else member 19's own).
    let prev = original
        .lines()
        .map(|l| serde_json::from_str::<Record>(l).unwrap())
        .rfind(|r| r.seq < 20)
        .unwrap()
        .hash;
    w.run_ok(&[
        "audit",
        "verify",
        "--file",
        tail.to_str().unwrap(),
        "--continuing-from",
        &prev,
    ]);
    assert!(fails(&w, &["audit", "verify", "--file", tail.to_str().unwrap()]).contains("seq 20"));
}

fn verify_catches_an_edited_amount_and_a_deleted_outbox_row(store: Store) {
    let w = World::on(store);
    w.add(&(0..10).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    let ok = w.run_ok(&["verify"]);
    assert!(String::from_utf8_lossy(&ok.stdout)
        .starts_with("ledger verified: 10 claims, 10 disbursements, 10 outbox rows"));

    let mut db = w.sql();
    // Edited behind the ledger's back in both places it is stored: only the audit record knows.
    db.exec(
        "UPDATE disbursements SET amount_cents = amount_cents + 5000 WHERE id = 3;
         UPDATE processed_messages SET amount_cents = amount_cents + 5000 WHERE claim_id = 3;",
    );
    let msg = fails(&w, &["verify"]);
    assert!(msg.contains("but disbursement 3 records"), "{msg}");
    db.exec("UPDATE processed_messages SET amount_cents = amount_cents - 5000 WHERE claim_id = 3");
    assert!(fails(&w, &["verify"]).contains("disbursement 3 (award"));
    db.exec("UPDATE disbursements SET amount_cents = amount_cents - 5000 WHERE id = 3");
    w.run_ok(&["verify"]);

    db.exec(&format!(
        "DELETE FROM {} WHERE claim_id = 4",
        outbox_table(store)
    ));
    let msg = fails(&w, &["verify"]);
    assert!(msg.contains("has no outbox row"), "{msg}");
}

fn a_conflicting_resubmission_is_recorded_and_under_hold_is_dead_lettered_unpaid(store: Store) {
    // Plan: 1. A, then B with A's award and time but another amount: both paid, one conflict
    // record naming A's key. 2. C likewise, under --on-conflict hold: not claimed or paid,
    // dead-lettered (ledger row, audit records, dead-letter stream), acknowledged.
    let w = World::on(store);
    let same = |cents: i64| {
        format!(
            r#"{{"award_id":"A-77","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{cents}}}"#
        )
    };
    w.add(&[same(100)]);
    w.drain(&[]);
    w.add(&[same(200)]);
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 2);
    let first_key = claimgate::domain::key::derive_idempotency_key(
        "A-77",
        "2026-07-01T09:00:00Z",
        same(100).as_bytes(),
    )
    .unwrap();
    let second_key = claimgate::domain::key::derive_idempotency_key(
        "A-77",
        "2026-07-01T09:00:00Z",
        same(200).as_bytes(),
    )
    .unwrap();
    assert_eq!(
        w.sql_i64(&format!(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict' AND {} = '{second_key}' AND detail LIKE '%{first_key}%'",
            w.audit_key_hex_sql("idempotency_key")
        )),
        1
    );
    let status: serde_json::Value =
        serde_json::from_slice(&w.run_ok(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["ledger"]["conflicts"], 1);

    let held_id = w.add(&[same(300)]).remove(0);
    w.drain(&["--on-conflict", "hold"]);
    assert_eq!(
        w.count("disbursements"),
        2,
        "the held submission is not paid"
    );
    assert_eq!(w.count("processed_messages"), 2, "nor claimed");
    assert_eq!(w.sql_i64(&format!("SELECT COUNT(*) FROM dead_letters WHERE reason_code = 'conflict_hold' AND stream_entry_id = '{held_id}'")), 1);
    assert_eq!(kind_count(&w, "conflict"), 2);
    assert_eq!(w.sql_i64(&format!("SELECT COUNT(*) FROM audit_log WHERE kind = 'dead_letter' AND stream_entry_id = '{held_id}'")), 1);
    let dead = w.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["original_id"], held_id.as_bytes());
    assert_eq!(dead[0]["reason_code"], b"conflict_hold");
    assert_eq!(dead[0]["original.payload"], same(300).as_bytes());
    assert_eq!(w.pending(), 0);
    w.run_ok(&["verify"]);
}

/// Moves the first `n` audit records (and the claims they describe) back to `old`, then re-seals
/// the chain (and, on PostgreSQL, moves the chain head with it), as a ledger that has really
/// been running that long would be. On PostgreSQL `n` must end a batch (a shared ledger's
/// batches are written, and purged, whole): drain with [`ONE_PER_BATCH`] to have every record
/// end one.
pub(crate) fn backdate(w: &World, n: i64, old: &str) {
    let mut db = w.sql();
    let (table, _) = record_row(w.store, 0);
    db.exec(&format!(
        "UPDATE processed_messages SET claimed_at = '{old}' WHERE idempotency_key IN
         (SELECT {} FROM audit_log WHERE seq <= {n} AND kind = 'processed')",
        w.audit_key_bytes_sql("idempotency_key")
    ));
    match w.store {
        Store::Sqlite => db.exec(&format!(
            "UPDATE audit_log SET recorded_at = '{old}' WHERE seq <= {n}"
        )),
        Store::Postgres => {
            assert_eq!(
                db.text(&format!(
                    "SELECT ((SELECT COUNT(*) FROM audit_batches WHERE link_seq = {n})
                            + (SELECT COUNT(*) FROM audit_chain WHERE seq = {n}))::text"
                )),
                "1",
                "seq {n} does not end a batch"
            );
            db.exec(&format!(
                "UPDATE audit_chain SET recorded_at = '{old}' WHERE seq <= {n};
                 UPDATE {table} m SET recorded_at = '{old}' FROM audit_batches b
                 WHERE b.batch_id = m.batch_id AND b.link_seq <= {n};
                 UPDATE audit_batches SET created_at = '{old}', linked_at = '{old}'
                 WHERE link_seq <= {n};"
            ))
        }
    }
    reseal_as_stored(w, &mut db);
}

/// Reads the whole chain as `w`'s ledger now stores it and re-seals it ([`reseal`]).
fn reseal_as_stored(w: &World, db: &mut support::Sql) {
    let ledger = claimgate::ledger::open(&crate::support::ledger_config(&w.db)).unwrap();
    let mut records = Vec::new();
    ledger
        .for_each_record(&claimgate::ledger::Since::All, &mut |r| {
            records.push(r);
            Ok(())
        })
        .unwrap();
    drop(ledger);
    reseal(db, w.store, records);
}

/// Seals `records` (the whole chain, as read) again from the genesis hash and writes every
/// hash back: records sealed one by one after the head, a batch's members among themselves
/// and its link after the head, as the ledger seals them.
fn reseal(db: &mut support::Sql, store: Store, records: Vec<Record>) {
    // A record's digest as its table stores it: SQLite reads hex text too; PostgreSQL's
    // columns hold the 32 bytes (its format 6). A batch's link hashes stay hex text.
    let digest = |hex: &str| match store {
        Store::Sqlite => format!("'{hex}'"),
        Store::Postgres => format!("decode('{hex}', 'hex')"),
    };
    let mut prev = GENESIS_HASH.to_owned();
    let mut members: Vec<Record> = Vec::new();
    for mut r in records {
        if r.batch_index.is_some() {
            members.push(r);
            continue;
        }
        if r.kind != Kind::Batch {
            r.seal(&prev);
            let table = if store == Store::Postgres {
                "audit_chain"
            } else {
                "audit_log"
            };
            db.exec(&format!(
                "UPDATE {table} SET prev_hash = {}, hash = {} WHERE seq = {}",
                digest(&r.prev_hash),
                digest(&r.hash),
                r.seq
            ));
            prev = r.hash;
            continue;
        }
        let mut link = detail::parse_batch_link(r.detail.as_deref().unwrap()).unwrap();
        link.last_hash = seal_batch(&mut members);
        for m in members.drain(..) {
            db.exec(&format!(
                "UPDATE audit_members SET prev_hash = {}, hash = {}
                 WHERE batch_id = {} AND batch_index = {}",
                digest(&m.prev_hash),
                digest(&m.hash),
                link.batch_id,
                m.batch_index.unwrap()
            ));
        }
        let sealed = Record::link(r.seq, detail::batch_link(&link), &r.recorded_at, &prev);
        db.exec(&format!(
            "UPDATE audit_batches SET last_hash = '{}', prev_hash = '{}', hash = '{}'
             WHERE batch_id = {}",
            link.last_hash, sealed.prev_hash, sealed.hash, link.batch_id
        ));
        prev = sealed.hash;
    }
    assert!(members.is_empty(), "the chain ends inside a batch");
    if store == Store::Postgres {
        db.exec(&format!("UPDATE chain_head SET hash = '{prev}'"));
    }
}

fn a_processed_record_resealed_to_another_amount_fails_verify(store: Store) {
    // Someone who can write the ledger changes what a processed record says was paid and
    // seals the chain again, so the chain holds; the record no longer matches its payment,
    // and verify's one pass (which compares the records with the payments as multisets, not
    // row by row) must find it and the named check say which record.
    let w = World::on(store);
    w.add(&(0..3).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["verify"]);
    let mut db = w.sql();
    let seq = db.i64("SELECT MIN(seq) FROM audit_log WHERE kind = 'processed'");
    let (table, row) = record_row(store, seq);
    db.exec(&format!(
        "UPDATE {table} SET amount_cents = amount_cents + 1 WHERE {row}"
    ));
    reseal_as_stored(&w, &mut db);
    w.run_ok(&["audit", "verify"]);
    let err = fails(&w, &["verify"]);
    assert!(
        err.contains(&format!(
            "processed record without a matching disbursement: audit record {seq} (processed"
        )),
        "{err}"
    );
}

/// The table and the condition that find the stored row of the audit record at `seq`: its
/// `audit_log` row on SQLite; on PostgreSQL, its batch member's row (every record a worker or
/// a hold writes is one).
fn record_row(store: Store, seq: i64) -> (&'static str, String) {
    match store {
        Store::Sqlite => ("audit_log", format!("seq = {seq}")),
        Store::Postgres => (
            "audit_members",
            format!(
                "(batch_id, batch_index) = (SELECT batch_id, batch_index FROM audit_log \
                 WHERE seq = {seq})"
            ),
        ),
    }
}

/// Where outbox rows are stored (on PostgreSQL `outbox` is a view over them).
fn outbox_table(store: Store) -> &'static str {
    match store {
        Store::Sqlite => "outbox",
        Store::Postgres => "outbox_rows",
    }
}

/// `run` flags that make every entry a batch of its own on a shared ledger, so that every
/// record ends a batch (for tests that back-date or purge a given number of records).
pub(crate) const ONE_PER_BATCH: [&str; 1] = ["--per-message"];

fn retention_refuses_the_window_held_awards_and_unpublished_events_and_keeps_the_chain_verifiable(
    store: Store,
) {
    // Plan:
    // 1. 20 submissions and one malformed entry; backdate the first 12 records to 2020.
    // 2. Refused: a date inside the 3-year window (exit 2); unpublished events; a held award.
    // 3. Publish, lift the hold, purge: exported first, rows gone, checkpoint left, both
    //    verifies pass, the export verifies on its own, and new work chains on after it.
    let w = World::on(store);
    w.add(&(0..10).map(support::submission).collect::<Vec<_>>());
    w.add_fields(&[("payload", b"[]")]);
    w.add(&(10..20).map(support::submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    backdate(&w, 12, "2020-03-01T12:00:00.000000Z");
    backdate(&w, 5, "2019-03-01T12:00:00.000000Z");
    w.run_ok(&["verify"]);

    let recent = w.run(&["retention", "purge", "--before", "2025-01-01"]);
    assert_eq!(recent.status.code(), Some(2));
    assert!(
        stderr(&recent).contains("retention window"),
        "{}",
        stderr(&recent)
    );
    assert!(
        fails(&w, &["retention", "purge", "--before", "2021-01-01"]).contains("not yet published")
    );
    w.run_ok(&["relay", "--exit-when-idle"]);
    w.run_ok(&["hold", "add", "A-000004", "--reason", "case 21-cv-0042"]);
    assert!(String::from_utf8_lossy(&w.run_ok(&["hold", "list"]).stdout).contains("A-000004"));
    assert!(fails(&w, &["retention", "purge", "--before", "2021-01-01"]).contains("A-000004"));
    assert_eq!(
        w.count("audit_log"),
        21 + 1,
        "a refused purge deletes nothing (the hold added its own record)"
    );

    w.run_ok(&["hold", "remove", "A-000004"]);
    // Two purges, in batches of 4 records: the second replaces the first one's checkpoint.
    let early = w.dir.path().join("purged-2019.jsonl");
    let purge = |before: &str, file: &std::path::Path| {
        w.run_ok(&[
            "retention",
            "purge",
            "--before",
            before,
            "--batch-records-max",
            "4",
            "--export",
            file.to_str().unwrap(),
        ]);
    };
    purge("2020-01-01", &early);
    assert_eq!(w.count("processed_messages"), 15);
    assert_eq!(
        w.sql_i64("SELECT seq FROM audit_log WHERE kind = 'checkpoint'"),
        5
    );
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
    let export = w.dir.path().join("purged.jsonl");
    purge("2021-01-01", &export);
    assert_eq!(
        w.count("processed_messages"),
        9,
        "11 of the first 12 records were claims (one dead letter)"
    );
    assert_eq!(w.count("disbursements"), 9);
    assert_eq!(w.count("outbox"), 9);
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(
        w.count("audit_log"),
        21 - 12 + 1 + 2,
        "the checkpoint, the 9 recent records and the hold's two records"
    );
    assert_eq!(
        w.sql_i64("SELECT seq FROM audit_log WHERE kind = 'checkpoint'"),
        12
    );
    w.run_ok(&["audit", "verify", "--file", early.to_str().unwrap()]);
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify", "--file", export.to_str().unwrap()]);
    let exported = std::fs::read_to_string(&export).unwrap();
    assert_eq!(
        exported
            .lines()
            .filter(|l| l.contains(r#""table":"audit_log""#) && !l.contains(r#""kind":"batch""#))
            .count(),
        12 - 5 + 1,
        "the second export holds the first checkpoint and records 6..=12"
    );
    assert_eq!(
        exported
            .lines()
            .filter(|l| l.contains(r#""table":"disbursements""#))
            .count(),
        6
    );

    w.add(&[support::submission(20), support::submission(21)]);
    w.drain(&[]);
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
}

fn a_purge_that_cannot_find_a_records_claim_removes_nothing(store: Store) {
    // 1. 6 submissions, published; every audit record moved back to 2019 and the chain
    //    re-sealed, but the claims keep their real claimed_at (as a hand-edited or clock-skewed
    //    ledger might): the purge's claim lookup, built from claims made before the cutoff,
    //    finds none of them.
    // 2. The purge refuses and names the problem; every row is still there; verify passes.
    let w = World::on(store);
    w.add(&(0..6).map(support::submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 6, "2019-03-01T12:00:00.000000Z");
    w.sql()
        .exec("UPDATE processed_messages SET claimed_at = '2026-07-01T00:00:00.000000Z'");
    w.run_ok(&["verify"]);

    // The export is written before the purge looks for claims; named here, because its
    // default on PostgreSQL (the database's name) is in the working directory.
    let export = w.dir.path().join("refused.jsonl");
    let refused = fails(
        &w,
        &[
            "retention",
            "purge",
            "--before",
            "2020-01-01",
            "--export",
            export.to_str().unwrap(),
        ],
    );
    assert!(refused.contains("nothing was purged"), "{refused}");
    assert_eq!(w.count("processed_messages"), 6);
    assert_eq!(w.count("disbursements"), 6);
    assert_eq!(w.count("audit_log"), 6);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'checkpoint'"),
        0
    );
    w.run_ok(&["verify"]);
}

fn a_purge_batch_asked_for_without_a_plan_finds_its_claims_itself(store: Store) {
    // 1. 6 submissions, published; the first 4 records (and their claims) moved back to 2019.
    // 2. `Retention::purge_batch` on a fresh ledger handle, no `export_purge` before it:
    //    records 1..=4 go with exactly their claims, a checkpoint takes seq 4, and both
    //    verifies pass.
    use claimgate::ledger::Removed;
    let w = World::on(store);
    w.add(&(0..6).map(support::submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 4, "2019-03-01T12:00:00.000000Z");
    let ledger = claimgate::ledger::open(&crate::support::ledger_config(&w.db)).unwrap();
    let removed = ledger
        .purge_batch(
            1,
            4,
            "2020-01-01T00:00:00.000000Z",
            "test purge",
            "2026-01-01T00:00:00.000000Z",
        )
        .unwrap();
    drop(ledger);
    assert_eq!(
        removed,
        Removed {
            records: 4,
            claims: 4,
            dead_letters: 0
        }
    );
    assert_eq!(w.count("processed_messages"), 2);
    assert_eq!(w.count("outbox"), 2);
    assert_eq!(
        w.sql_i64("SELECT seq FROM audit_log WHERE kind = 'checkpoint'"),
        4
    );
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
}

/// A purge batch kept from the write lock past the busy timeout (a worker's long commit,
/// another writer) waits and tries again, as a worker's batch does: nothing of it was
/// written. It used to stop the purge, exit 1 with "database is locked", beside a busy worker
/// on a 10,000,000-claim ledger (BENCHMARKS.md).
#[test]
fn a_purge_batch_kept_from_the_write_lock_past_the_busy_timeout_waits_and_finishes() {
    // 1. Four claims, published, one per batch, back-dated to 2019.
    // 2. Another connection holds the write lock for 7 s (the busy timeout is 5 s) while
    //    `retention purge --before 2020-01-01` runs: it exits 0 once the lock is let go,
    //    after one WARN that a purge batch failed and is retried; four tombstones; verify
    //    passes.
    let w = World::new();
    w.add(&(0..4).map(support::submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 4, "2019-03-01T12:00:00.000000Z");
    let holder = rusqlite::Connection::open(&w.db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let purge = w
        .cmd(&["retention", "purge", "--before", "2020-01-01"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(7));
    holder.execute_batch("ROLLBACK").unwrap();
    let out = purge.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    let warned: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(
        warned[0].contains("a purge batch failed") && warned[0].contains("retrying"),
        "{stderr}"
    );
    assert_eq!(w.count("claim_tombstones"), 4);
    assert_eq!(w.count("processed_messages"), 0);
    w.run_ok(&["verify"]);
}
