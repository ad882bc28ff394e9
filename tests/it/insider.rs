//! Edits that touch no hashed field, made as someone who can write the ledger would (their own
//! SQL on a drained ledger): each lets money move without a record, or stops a payment or a
//! hold, and must fail `verify` at once, naming what was changed, before the resend or the
//! relay round that would turn it into a second payment. Anchors cannot catch these
//! (`evidence.rs`): nothing they cover changed. Those in `on_both_ledgers!` run on both
//! ledgers; the rest are about SQLite's own file (its schema and its outbox numbering).

use crate::support::{self, Sql, Store, World};
use rusqlite::Connection;

on_both_ledgers!(
    a_claims_instant_moved_by_a_nanosecond_fails_verify_and_a_resend_paid_after_both_columns_moved_is_named,
    a_hold_lifted_or_placed_by_editing_the_table_fails_verify,
    an_event_spelled_differently_but_announcing_the_same_payment_verifies_and_one_announcing_another_amount_does_not,
    published_rows_made_to_read_as_unpublished_below_the_streams_mark_fail_verify,
);

/// A drained ledger of `n` submissions on `store` that verifies, and a connection to it.
fn drained_on(store: Store, n: usize) -> (World, Sql) {
    let w = World::on(store);
    w.add(&(0..n).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["verify"]);
    let db = w.sql();
    (w, db)
}

/// A drained SQLite ledger of `n` submissions that verifies, and a writable connection to it.
fn drained(n: usize) -> (World, Connection) {
    let (w, _) = drained_on(Store::Sqlite, n);
    let db = Connection::open(&w.db).unwrap();
    (w, db)
}

/// `claimgate verify` exits 1; its stderr.
fn refused(w: &World) -> String {
    let out = w.run(&["verify"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "verify passed: {err}");
    err
}

fn a_claims_instant_moved_by_a_nanosecond_fails_verify_and_a_resend_paid_after_both_columns_moved_is_named(
    store: Store,
) {
    let (w, mut db) = drained_on(store, 3);
    db.exec(
        "UPDATE processed_messages SET submission_instant = '2026-07-01T09:00:00.000000001Z'
         WHERE award_id = 'A-000001'",
    );
    let err = refused(&w);
    assert!(
        err.contains("claim's instant differs from its timestamp")
            && err.contains("2026-07-01T09:00:00.000000001Z"),
        "{err}"
    );
    // Both columns moved together pass that check: nothing hashed repeats the time. The resend
    // then escapes the claim's uniqueness and is paid, and verify names the second claim of
    // the key at once (a limit ARCHITECTURE.md states).
    db.exec(
        "UPDATE processed_messages SET submission_timestamp = '2026-07-01T09:00:00.000000001Z'
         WHERE award_id = 'A-000001'",
    );
    w.add(&[support::submission(1)]);
    w.drain(&[]);
    let err = refused(&w);
    assert!(err.contains("claimed twice"), "{err}");
}

#[test]
fn an_outbox_row_renumbered_past_the_relays_mark_or_below_it_fails_verify() {
    let (w, db) = drained(4);
    // Past the mark: republished as a new event if the relay ran.
    db.execute_batch(
        "UPDATE outbox SET id = 100, published_at = NULL WHERE claim_id = 2;
         UPDATE sqlite_sequence SET seq = 100 WHERE name = 'outbox';",
    )
    .unwrap();
    let err = refused(&w);
    assert!(
        err.contains("outbox rows out of claim order") && err.contains("outbox row 3 (claim 3)"),
        "{err}"
    );
    // Below every other: never published at all.
    db.execute_batch(
        "UPDATE outbox SET id = 2 WHERE claim_id = 2;
                      UPDATE outbox SET id = -4 WHERE claim_id = 4;",
    )
    .unwrap();
    let err = refused(&w);
    assert!(err.contains("outbox row -4 (claim 4)"), "{err}");
    db.execute("UPDATE outbox SET id = 4 WHERE claim_id = 4", [])
        .unwrap();
    w.run_ok(&["verify"]);
}

#[test]
fn a_constraint_dropped_or_a_trigger_planted_fails_verify_before_any_row_is_wrong() {
    let (w, db) = drained(2);
    // A trigger that would copy every new outbox row: the second event of every payment.
    db.execute_batch(
        "CREATE TRIGGER copy_events AFTER INSERT ON outbox BEGIN
           SELECT 1;
         END;",
    )
    .unwrap();
    let err = refused(&w);
    assert!(
        err.contains("schema altered: trigger copy_events is not claimgate's"),
        "{err}"
    );
    db.execute_batch("DROP TRIGGER copy_events").unwrap();
    w.run_ok(&["verify"]);

    // The outbox rebuilt without UNIQUE (claim_id), every row as it was.
    let sql: String = db
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'outbox'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let loose = sql.replace("NOT NULL UNIQUE", "NOT NULL");
    assert_ne!(
        loose, sql,
        "the outbox's claim_id is declared UNIQUE: {sql}"
    );
    db.execute_batch(&format!(
        "PRAGMA foreign_keys = OFF;
         ALTER TABLE outbox RENAME TO outbox_old;
         {};
         INSERT INTO outbox SELECT * FROM outbox_old;
         DROP TABLE outbox_old;
         CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;",
        loose.replace("CREATE TABLE \"outbox\"", "CREATE TABLE outbox")
    ))
    .unwrap();
    assert_eq!(w.count("outbox"), 2, "every row kept");
    let err = refused(&w);
    assert!(
        err.contains("schema altered: outbox is no longer unique on (claim_id)"),
        "{err}"
    );
    // A unique index that leaves rows out (a partial one) is not the constraint either.
    db.execute_batch(
        "INSERT INTO outbox (claim_id, event_type, payload, created_at)
           SELECT claim_id, event_type, payload, created_at FROM outbox WHERE claim_id = 1;
         CREATE UNIQUE INDEX outbox_claim ON outbox (claim_id) WHERE id <= 2;",
    )
    .unwrap();
    let err = refused(&w);
    assert!(
        err.contains("outbox is no longer unique on (claim_id)"),
        "{err}"
    );
}

fn a_hold_lifted_or_placed_by_editing_the_table_fails_verify(store: Store) {
    let (w, mut db) = drained_on(store, 2);
    w.run_ok(&["hold", "add", "A-000001", "--reason", "case 7"]);
    w.run_ok(&["verify"]);
    db.exec("DELETE FROM legal_holds WHERE award_id = 'A-000001'");
    let err = refused(&w);
    assert!(
        err.contains("legal holds differ from the audit trail: award A-000001"),
        "{err}"
    );
    db.exec(
        "INSERT INTO legal_holds (award_id, reason, held_at)
         SELECT award_id, 'case 7', recorded_at FROM audit_log WHERE kind = 'hold_added'",
    );
    w.run_ok(&["verify"]);
    db.exec("UPDATE legal_holds SET reason = 'nothing'");
    let err = refused(&w);
    assert!(err.contains("its record says (\"case 7\""), "{err}");
    db.exec("UPDATE legal_holds SET reason = 'case 7'");
    db.exec("INSERT INTO legal_holds (award_id, reason, held_at) VALUES ('A-000000', 'x', 'y')");
    let err = refused(&w);
    assert!(
        err.contains("award A-000000 is held (placed y) but no record in force placed that hold"),
        "{err}"
    );
    // Lifted through claimgate: both agree again.
    db.exec("DELETE FROM legal_holds WHERE award_id = 'A-000000'");
    w.run_ok(&["hold", "remove", "A-000001"]);
    w.run_ok(&["verify"]);
}

fn an_event_spelled_differently_but_announcing_the_same_payment_verifies_and_one_announcing_another_amount_does_not(
    store: Store,
) {
    // verify reads plain events itself and hands any other spelling to the database's JSON
    // functions, the ones its named checks use: an escape, reordered fields, a field left out
    // (and on SQLite a fraction, which SQLite reads as the same number; PostgreSQL's check
    // compares the number as written) are still the same payment to both.
    let (w, mut db) = drained_on(store, 3);
    let claim = db.i64("SELECT claim_id FROM outbox ORDER BY id LIMIT 1 OFFSET 1");
    let payload = match store {
        // A ledger this release made stores no payload: the event is its claim's (format 5).
        Store::Sqlite => {
            let s = support::parsed(usize::try_from(claim - 1).unwrap());
            assert_eq!(
                db.text(&format!(
                    "SELECT lower(hex(idempotency_key)) FROM processed_messages
                     WHERE claim_id = {claim}"
                )),
                s.key.to_hex()
            );
            claimgate::domain::event::payload(&s, &s.key.to_hex())
        }
        Store::Postgres => db.text(&format!(
            "SELECT payload FROM outbox WHERE claim_id = {claim}"
        )),
    };
    let event: serde_json::Value = serde_json::from_str(&payload).unwrap();
    let award = event["award_id"].as_str().unwrap();
    assert!(award.starts_with('A'), "{award}");
    let fraction = match store {
        Store::Sqlite => ".0",
        Store::Postgres => "",
    };
    let respelled = format!(
        r#" {{ "idempotency_key": "{}", "amount_cents": {}{fraction}, "award_id": "\u0041{}" }}"#,
        event["idempotency_key"].as_str().unwrap(),
        event["amount_cents"],
        &award[1..]
    );
    // On PostgreSQL a batch's row stores no event (format 5): the edit stores one, which is
    // then read, and held to the claim, in place of the one the claim spells.
    let (table, event_type) = match store {
        Store::Sqlite => ("outbox", ""),
        Store::Postgres => ("outbox_rows", "event_type = 'disbursement.recorded', "),
    };
    let set = |db: &mut Sql, payload: &str| {
        db.exec(&format!(
            "UPDATE {table} SET {event_type}payload = '{payload}' WHERE claim_id = {claim}"
        ))
    };
    set(&mut db, &respelled);
    w.run_ok(&["verify"]);
    let other = respelled.replace(
        &format!("{}{fraction},", event["amount_cents"]),
        &format!("{}.5,", event["amount_cents"]),
    );
    assert_ne!(other, respelled);
    set(&mut db, &other);
    let err = refused(&w);
    assert!(
        err.contains("outbox event differs from its disbursement"),
        "{err}"
    );
    // An extra field is no longer claimgate's plain event: the database decides, and it is
    // the same payment.
    set(&mut db, &payload.replacen('{', r#"{"note":"re-sent", "#, 1));
    w.run_ok(&["verify"]);
}

#[test]
fn a_payment_whose_processed_record_names_another_claims_key_in_capitals_fails_verify() {
    // Each processed record must match its own claim: a record rewritten (and the chain
    // re-sealed) to name another claim's key, spelled in capitals so that no two records
    // spell one key alike, leaves a payment with no record of its own. Keys are compared as
    // the bytes they name (a format-6 record stores them so), so the capitals hide nothing:
    // verify names the key processed twice.
    let (w, db) = drained(2);
    let (key, award, amount): (String, String, i64) = db
        .query_row(
            "SELECT hex(idempotency_key), award_id, amount_cents FROM audit_log
             WHERE kind = 'processed' ORDER BY seq LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let seq: i64 = db
        .query_row(
            "SELECT MAX(seq) FROM audit_log WHERE kind = 'processed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    db.execute(
        "UPDATE audit_log SET idempotency_key = ?1, award_id = ?2, amount_cents = ?3
         WHERE seq = ?4",
        rusqlite::params![key, award, amount, seq],
    )
    .unwrap();
    crate::evidence::reseal_from(&db, seq);
    let err = refused(&w);
    assert!(
        err.contains("key processed twice in the audit log")
            && err.contains(&format!(
                "key {} has 2 processed records",
                key.to_lowercase()
            )),
        "{err}"
    );
}

#[test]
fn an_audit_column_edited_to_a_value_claimgate_never_writes_is_named_by_its_record() {
    // SQLite stores what it is given whatever a column's type. Each edit below makes one
    // record's column unreadable as claimgate writes it; `verify` and `audit verify` each exit
    // 1 naming the record (`audit verify` the column too; `verify` may name the first of its
    // checks the record fails instead), not a bare conversion error, and pass again once the
    // value is put back:
    // - record 2's key as 31 bytes (a key is 32 bytes, or hex text before format 6);
    // - record 3's hash as a number.
    let (w, db) = drained(3);
    for (seq, column, edit) in [(2, "idempotency_key", "zeroblob(31)"), (3, "hash", "7")] {
        let kept: Vec<u8> = db
            .query_row(
                &format!("SELECT {column} FROM audit_log WHERE seq = ?1"),
                [seq],
                |r| r.get(0),
            )
            .unwrap();
        db.execute(
            &format!("UPDATE audit_log SET {column} = {edit} WHERE seq = ?1"),
            [seq],
        )
        .unwrap();
        let named = format!("audit record seq {seq}: its {column} does not read as claimgate");
        let err = refused(&w);
        assert!(
            err.contains(&named) || err.contains(&format!("audit record {seq} (")),
            "verify: {err}"
        );
        let out = w.run(&["audit", "verify"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "audit verify: {err}");
        assert!(err.contains(&named), "audit verify: {err}");
        db.execute(
            &format!("UPDATE audit_log SET {column} = ?1 WHERE seq = ?2"),
            rusqlite::params![kept, seq],
        )
        .unwrap();
        w.run_ok(&["verify"]);
        w.run_ok(&["audit", "verify"]);
    }
}

#[test]
fn a_publication_recorded_above_the_last_outbox_id_fails_verify() {
    // Someone who can write the ledger records rows not written yet as published: the next
    // payments would read as published, and the backlog as empty, with none of them on the
    // events stream. verify names the publication; once it is removed, verify passes.
    let (w, mut db) = drained_on(Store::Postgres, 3);
    db.exec(
        "INSERT INTO outbox_published (upto_id, published_at)
         VALUES (1000, '2026-07-01T10:00:00.000000Z')",
    );
    let err = refused(&w);
    assert!(
        err.contains("rows up to id 1000 are recorded as published")
            && err.contains("last outbox id 3"),
        "{err}"
    );
    db.exec("DELETE FROM outbox_published WHERE upto_id = 1000");
    w.run_ok(&["verify"]);
}

fn published_rows_made_to_read_as_unpublished_below_the_streams_mark_fail_verify(store: Store) {
    // Someone who can write the ledger makes published rows read as unpublished: on SQLite by
    // clearing a row's `published_at`, on PostgreSQL by deleting the relays' publications. The
    // backlog (and its alert) rises with rows the events stream already holds. verify names the
    // first such row and the stream's mark. The next relay round marks them again from the
    // stream's position, publishing nothing twice, and verify passes.
    let (w, mut db) = drained_on(store, 3);
    w.run_ok(&["relay", "--exit-when-idle"]);
    w.run_ok(&["verify"]);
    let backlog = |w: &World| w.status_json()["ledger"]["outbox_backlog"].clone();
    assert_eq!(backlog(&w), 0);
    let (edit, first) = match store {
        Store::Sqlite => ("UPDATE outbox SET published_at = NULL WHERE id = 2", 2),
        Store::Postgres => ("DELETE FROM outbox_published", 1),
    };
    db.exec(edit);
    assert!(
        backlog(&w).as_u64().unwrap() > 0,
        "the edit is in the backlog"
    );
    let err = refused(&w);
    assert!(
        err.contains(&format!(
            "outbox publication: outbox row {first} reads as unpublished, but events stream \
             grants:events holds every row up to id 3 (its published_upto mark)"
        )),
        "{err}"
    );
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 3, "nothing is published twice");
    assert_eq!(backlog(&w), 0);
    w.run_ok(&["verify"]);
}
