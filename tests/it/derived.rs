//! Format 5 of the SQLite ledger (`src/ledger/sqlite/derived.rs`): in a ledger this release
//! makes, an outbox row keeps its event while it waits for the relay and none once published,
//! a disbursement stores no time, and audit digests are raw bytes; a format-4 ledger keeps what
//! it stored and goes on in the new format. Either way the relay publishes, and publishes
//! again from the ledger, byte for byte the events a format-4 ledger stored; `verify` and
//! `audit verify` pass; and a stored value that differs from its claim still fails `verify`.
//! Real binary, real files, real Redis.

use crate::support::{self, World};
use claimgate::domain::event;

/// `(event_type, payload)` of every entry on `grants:events`, as published (raw text).
fn published(w: &World) -> Vec<(String, String)> {
    w.events()
        .into_iter()
        .map(|e| (e["event_type"].clone(), e["payload"].clone()))
        .collect()
}

/// The events submissions `range` announce, as the worker builds them at the claim.
fn expected(range: std::ops::Range<usize>) -> Vec<(String, String)> {
    range
        .map(|i| {
            let s = support::parsed(i);
            (
                event::DISBURSEMENT_RECORDED.to_owned(),
                event::payload(&s, &s.key.to_hex()),
            )
        })
        .collect()
}

/// Pays submissions `range` and publishes their events.
fn pay_and_publish(w: &World, range: std::ops::Range<usize>) {
    w.add(&range.map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
}

/// A ledger laid out as a format-4 release made it (`fixtures/schema-v4-effects.sql`).
fn format_4_ledger() -> World {
    let w = World::new();
    rusqlite::Connection::open(&w.db)
        .unwrap()
        .execute_batch(include_str!("fixtures/schema-v4-effects.sql"))
        .unwrap();
    w
}

#[test]
fn a_new_ledger_keeps_no_published_event_and_publishes_the_events_a_format_4_ledger_stored() {
    // 1. Six submissions paid into a ledger this release makes: each outbox row holds its
    //    event, as the worker built it, until the relay publishes it; then none holds an event
    //    type, payload or creation time. No disbursement stores its time (each its key, award
    //    and amount, as the contract names them), and every audit digest is 32 raw bytes.
    // 2. The events published are byte for byte those the worker builds at the claim (what a
    //    format-4 ledger stored), and the same as a format-4 ledger's relay publishes for the
    //    same submissions; published again after the events stream is lost, rebuilt from the
    //    claims, they are still those bytes.
    // 3. verify and audit verify pass; status counts six claims and an empty outbox backlog.
    let w = World::new();
    w.add(&(0..6).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    let stored: Vec<(String, String)> = {
        let db = rusqlite::Connection::open(&w.db).unwrap();
        let mut st = db
            .prepare("SELECT event_type, payload FROM outbox ORDER BY id")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    assert_eq!(stored, expected(0..6), "an unpublished row holds its event");
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM outbox
             WHERE event_type IS NOT NULL OR payload IS NOT NULL OR created_at IS NOT NULL"
        ),
        0
    );
    assert_eq!(w.count("outbox"), 6);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM disbursements WHERE recorded_at IS NOT NULL"),
        0
    );
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM disbursements d JOIN processed_messages p
             ON p.claim_id = d.claim_id AND p.idempotency_key = d.idempotency_key"
        ),
        6,
        "the contract's key is stored in every disbursement"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE typeof(hash) <> 'blob' OR length(hash) <> 32 OR typeof(prev_hash) <> 'blob'"),
        0
    );
    assert_eq!(published(&w), expected(0..6));

    let wide = format_4_ledger();
    pay_and_publish(&wide, 0..6);
    assert_eq!(
        wide.sql_i64("SELECT COUNT(*) FROM outbox WHERE payload IS NULL"),
        0,
        "a format-4 table is written in full"
    );
    assert_eq!(published(&wide), published(&w));

    // The events stream lost: published again from the ledger (`--republish-from 1`), each
    // event is rebuilt from its claim, byte for byte the one published first.
    let _: () = redis::cmd("DEL")
        .arg("grants:events")
        .arg("grants:events:published_upto")
        .query(&mut w.conn())
        .unwrap();
    w.run_ok(&["relay", "--exit-when-idle", "--republish-from", "1"]);
    assert_eq!(published(&w), expected(0..6), "republished from the claims");

    for l in [&w, &wide] {
        l.run_ok(&["verify"]);
        l.run_ok(&["audit", "verify"]);
        let status: serde_json::Value =
            serde_json::from_slice(&l.run_ok(&["status", "--json"]).stdout).unwrap();
        assert_eq!(status["ledger"]["claims"], 6, "{status}");
        assert_eq!(status["ledger"]["outbox_backlog"], 0, "{status}");
    }
}

#[test]
fn a_format_4_ledger_keeps_its_hex_rows_and_its_chain_goes_on_in_today_s_format() {
    // 1. A format-4 ledger (fixture tables, three claims, its digests and audit keys hex as
    //    that release wrote them, format 4 recorded) is opened by a worker paying three more:
    //    it records today's format and nothing else changes in the old rows.
    // 2. The first three records keep their hex digests and keys and the next three are raw
    //    bytes, and the chain runs across: verify, audit verify, an export verified as a file,
    //    whose keys are the claims' hex whichever form a record stores.
    // 3. All six events are published, each the one its claim announces.
    let w = format_4_ledger();
    pay_and_publish(&w, 0..3);
    w.sql().exec(
        "UPDATE audit_log SET prev_hash = lower(hex(prev_hash)), hash = lower(hex(hash)),
                              idempotency_key = lower(hex(idempotency_key));
         UPDATE ledger_meta SET value = '4' WHERE name = 'format_version';",
    );
    let old_rows = |w: &World| {
        w.sql_text(
            "SELECT group_concat(seq || ':' || typeof(prev_hash) || typeof(hash)
                                 || typeof(idempotency_key) || ':' || hash, ',')
             FROM (SELECT * FROM audit_log WHERE seq <= 3 ORDER BY seq)",
        )
    };
    let before = old_rows(&w);
    assert!(before.contains("3:texttexttext:"), "{before}");

    pay_and_publish(&w, 3..6);
    assert_eq!(
        w.sql_text("SELECT value FROM ledger_meta WHERE name = 'format_version'"),
        claimgate::ledger::sqlite::FORMAT_VERSION.to_string()
    );
    assert_eq!(old_rows(&w), before, "an old row was rewritten");
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM audit_log WHERE seq > 3 AND typeof(hash) = 'blob'
             AND typeof(idempotency_key) = 'blob' AND length(idempotency_key) = 32"
        ),
        3
    );
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    let export = w.dir.path().join("audit.jsonl");
    w.run_ok(&["audit", "export", "--out", export.to_str().unwrap()]);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    for pair in lines.windows(2) {
        assert_eq!(pair[1]["prev_hash"], pair[0]["hash"], "{pair:?}");
        assert_eq!(pair[1]["hash"].as_str().unwrap().len(), 64, "{pair:?}");
    }
    let exported_keys: Vec<&str> = lines
        .iter()
        .map(|l| l["idempotency_key"].as_str().unwrap())
        .collect();
    let claim_keys = w.sql_text(
        "SELECT group_concat(k, ',') FROM
           (SELECT lower(hex(idempotency_key)) AS k FROM processed_messages ORDER BY claim_id)",
    );
    assert_eq!(exported_keys.join(","), claim_keys);
    w.run_ok(&["audit", "verify", "--file", export.to_str().unwrap()]);
    assert_eq!(published(&w), expected(0..6));
}

#[test]
fn a_stored_value_that_differs_from_the_claim_it_stands_beside_fails_verify() {
    // On a format-5 ledger of three claims, each edit below fails verify (exit 1, naming it),
    // and verify passes again once it is undone (the key put back; the payload NULL again,
    // derived from the claim):
    // - claim 2's disbursement given claim 1's key, and no key at all (its NOT NULL dropped
    //   from the schema text for the write, as a hand edit would);
    // - claim 2's outbox row given a payload announcing one cent more;
    // - claim 2's outbox row given a payload that is not JSON.
    let w = World::new();
    pay_and_publish(&w, 0..3);
    w.run_ok(&["verify"]);
    let mut db = w.sql();
    let refused = |w: &World| {
        let out = w.run(&["verify"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "verify passed: {err}");
        err
    };
    db.exec(
        "UPDATE disbursements SET idempotency_key =
             (SELECT idempotency_key FROM processed_messages WHERE claim_id = 1)
         WHERE claim_id = 2",
    );
    let err = refused(&w);
    assert!(err.contains("disbursement differs from its claim"), "{err}");
    {
        let conn = rusqlite::Connection::open(&w.db).unwrap();
        let original: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'disbursements'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let loose = original.replacen("BLOB    NOT NULL", "BLOB", 1);
        assert_ne!(loose, original);
        let schema = |sql: &str| {
            conn.execute_batch("PRAGMA writable_schema = ON").unwrap();
            conn.execute(
                "UPDATE sqlite_master SET sql = ?1 WHERE name = 'disbursements'",
                [sql],
            )
            .unwrap();
            conn.execute_batch("PRAGMA writable_schema = RESET")
                .unwrap();
        };
        schema(&loose);
        conn.execute(
            "UPDATE disbursements SET idempotency_key = NULL WHERE claim_id = 2",
            [],
        )
        .unwrap();
        schema(&original);
    }
    // SQLite's own integrity check, which verify reports first, names it.
    let err = refused(&w);
    assert!(
        err.contains("NULL value in disbursements.idempotency_key"),
        "{err}"
    );
    db.exec(
        "UPDATE disbursements SET idempotency_key =
             (SELECT idempotency_key FROM processed_messages WHERE claim_id = 2)
         WHERE claim_id = 2",
    );
    w.run_ok(&["verify"]);

    let s = support::parsed(1);
    let raised = event::payload(
        &claimgate::domain::submission::Submission {
            amount_cents: s.amount_cents + 1,
            ..s.clone()
        },
        &s.key.to_hex(),
    );
    for payload in [raised.as_str(), "not json"] {
        rusqlite::Connection::open(&w.db)
            .unwrap()
            .execute(
                "UPDATE outbox SET payload = ?1 WHERE claim_id = 2",
                [payload],
            )
            .unwrap();
        let err = refused(&w);
        assert!(
            err.contains("outbox event differs from its disbursement"),
            "{payload}: {err}"
        );
    }
    db.exec("UPDATE outbox SET payload = NULL WHERE claim_id = 2");
    w.run_ok(&["verify"]);
}

#[test]
fn a_retention_export_holds_the_rows_as_stored_and_derived_alike() {
    // 1. A new ledger pays four submissions, publishes them (their rows keep no event), and
    //    the first three are back-dated to 2020.
    // 2. `retention purge --before 2021-01-01 --export FILE`: the file's disbursement and
    //    outbox rows of the three purged claims read as a format-4 ledger stored them — the
    //    disbursement's time is its claim's, the event type and payload are the events the
    //    relay published, the creation time is the claim's — and verify passes after.
    let w = World::new();
    pay_and_publish(&w, 0..4);
    crate::audit::backdate(&w, 3, "2020-03-01T12:00:00.000000Z");
    let export = w.dir.path().join("purged.jsonl");
    w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2021-01-01",
        "--export",
        export.to_str().unwrap(),
    ]);
    assert_eq!(w.count("processed_messages"), 1);
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |table: &str| -> Vec<&serde_json::Value> {
        rows.iter()
            .filter(|r| r["table"] == table)
            .map(|r| &r["row"])
            .collect()
    };
    let claims = of("processed_messages");
    assert_eq!(claims.len(), 3, "{rows:?}");
    let disbursements = of("disbursements");
    assert_eq!(disbursements.len(), 3, "{rows:?}");
    for (d, c) in disbursements.iter().zip(&claims) {
        assert_eq!(d["recorded_at"], c["claimed_at"], "{d} {c}");
        assert_eq!(d["idempotency_key"], c["idempotency_key"], "{d} {c}");
    }
    let outbox = of("outbox");
    let announced: Vec<(String, String)> = outbox
        .iter()
        .map(|o| {
            (
                o["event_type"].as_str().unwrap().to_owned(),
                o["payload"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(announced, expected(0..3));
    for (o, c) in outbox.iter().zip(&claims) {
        assert_eq!(o["created_at"], c["claimed_at"], "{o} {c}");
        assert!(o["published_at"].is_string(), "{o}");
    }
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
}
