//! [`Inspect`] for SQLite: `claimgate verify`'s checks as SQL, `/healthz`'s ping, and the file
//! path as the ledger's description.
//!
//! Invariant: this module only reads. Every check of `verify` runs inside one read
//! transaction, the audit chain included, so a worker committing meanwhile cannot make a
//! consistent ledger look inconsistent.

use super::{audit_store, SqliteLedger};
use crate::domain::audit::Verifier;
use crate::error::{Error, Result};
use crate::ledger::{chain, checks, Inspect, Since, Summary};
use rusqlite::{Connection, OptionalExtension};

impl Inspect for SqliteLedger {
    fn verify(&self) -> Result<Summary> {
        ledger(&mut *self.conn()?)
    }

    fn ping(&self) -> Result<()> {
        // Reads the schema, so the answer needs the file's read lock: `SELECT 1` never touches
        // the database and would say "up" while another process holds the ledger exclusively.
        self.conn()?
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// Each check: a query returning one text column describing the first row that breaks it, or
/// nothing. Ordered so the most basic faults are named first.
const CHECKS: [(&str, &str); 15] = [
    (
        // The schema makes a claim unique on (time, award, key), which is uniqueness of the key
        // because the key is derived from that time and award (`schema.sql`); checked here
        // directly, on the key alone.
        "key claimed twice",
        "SELECT 'key ' || lower(hex(idempotency_key)) || ' has ' || COUNT(*) || ' claims'
         FROM processed_messages GROUP BY idempotency_key HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        "disbursement without a claim",
        "SELECT 'disbursement ' || d.id || ' refers to claim ' || d.claim_id || ', which does not exist'
         FROM disbursements d LEFT JOIN processed_messages p ON p.claim_id = d.claim_id
         WHERE p.claim_id IS NULL ORDER BY d.id LIMIT 1",
    ),
    (
        "claim without a disbursement",
        "SELECT 'claim ' || p.claim_id || ' (key ' || lower(hex(p.idempotency_key)) || ') has no disbursement'
         FROM processed_messages p LEFT JOIN disbursements d ON d.claim_id = p.claim_id
         WHERE d.id IS NULL ORDER BY p.claim_id LIMIT 1",
    ),
    (
        "disbursement differs from its claim",
        "SELECT 'disbursement ' || d.id || ' (award ' || d.award_id || ', ' || d.amount_cents
                || ' cents) differs from its claim ' || p.claim_id || ' (award ' || p.award_id || ', '
                || p.amount_cents || ' cents)'
         FROM disbursements d JOIN processed_messages p ON p.claim_id = d.claim_id
         WHERE d.idempotency_key <> p.idempotency_key OR d.award_id <> p.award_id
            OR d.amount_cents <> p.amount_cents
         ORDER BY d.id LIMIT 1",
    ),
    (
        // The schema makes the claim the disbursement's key ([`constraints`] checks it is
        // still there); this names the claim if a second disbursement got in anyway.
        "claim with more than one disbursement",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' disbursements'
         FROM disbursements GROUP BY claim_id HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // A second outbox row for a claim is a second event, which the relay would publish:
        // a second payment downstream.
        "claim with more than one outbox row",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' outbox rows'
         FROM outbox GROUP BY claim_id HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // One writer inserts a batch's claims and then its outbox rows in the same order, and
        // outbox ids only grow (AUTOINCREMENT), so outbox ids rise with claim ids. A row
        // renumbered past the relay's mark would be published again; one renumbered below it
        // would never be published at all.
        "outbox rows out of claim order",
        "SELECT 'outbox row ' || id || ' (claim ' || claim_id || ') is numbered at or below outbox row '
                || prev_id || ' of the earlier claim ' || prev_claim
         FROM (SELECT id, claim_id, LAG(id) OVER w AS prev_id, LAG(claim_id) OVER w AS prev_claim
               FROM outbox WINDOW w AS (ORDER BY claim_id))
         WHERE id <= prev_id ORDER BY claim_id LIMIT 1",
    ),
    (
        "disbursement without an outbox row",
        "SELECT 'disbursement ' || d.id || ' (claim ' || d.claim_id || ', key '
                || lower(hex(d.idempotency_key)) || ') has no outbox row'
         FROM disbursements d LEFT JOIN outbox o ON o.claim_id = d.claim_id
         WHERE o.id IS NULL ORDER BY d.id LIMIT 1",
    ),
    (
        "outbox row without a disbursement",
        "SELECT 'outbox row ' || o.id || ' refers to claim ' || o.claim_id || ', which has no disbursement'
         FROM outbox o LEFT JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE d.id IS NULL ORDER BY o.id LIMIT 1",
    ),
    (
        "outbox event differs from its disbursement",
        "SELECT 'outbox row ' || o.id || ' announces ' || ifnull(json_extract(o.payload, '$.amount_cents'), 'no amount')
                || ' cents but disbursement ' || d.id || ' records ' || d.amount_cents
         FROM outbox o JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE json_valid(o.payload) = 0
            OR json_extract(o.payload, '$.amount_cents') IS NOT d.amount_cents
            OR json_extract(o.payload, '$.award_id') IS NOT d.award_id
            OR json_extract(o.payload, '$.idempotency_key') IS NOT lower(hex(d.idempotency_key))
         ORDER BY o.id LIMIT 1",
    ),
    (
        "processed record without a matching disbursement",
        "SELECT 'audit record ' || a.seq || ' (processed, key ' || a.idempotency_key || ', '
                || ifnull(a.amount_cents, 'no') || ' cents) ' ||
                CASE WHEN d.id IS NULL THEN 'has no disbursement'
                     ELSE 'but disbursement ' || d.id || ' records award ' || d.award_id || ', '
                          || d.amount_cents || ' cents' END
         FROM audit_log a
         LEFT JOIN processed_messages p ON p.idempotency_key = unhex(a.idempotency_key)
         LEFT JOIN disbursements d ON d.claim_id = p.claim_id
         WHERE a.kind = 'processed'
           AND (d.id IS NULL OR d.amount_cents IS NOT a.amount_cents OR d.award_id IS NOT a.award_id)
         ORDER BY a.seq LIMIT 1",
    ),
    (
        "key processed twice in the audit log",
        "SELECT 'key ' || idempotency_key || ' has ' || COUNT(*) || ' processed records'
         FROM audit_log WHERE kind = 'processed' GROUP BY idempotency_key HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // A purged key claimed again would be a second payment of one submission.
        "key claimed after its claim was purged",
        "SELECT 'key ' || lower(hex(p.idempotency_key)) || ' is claimed (claim ' || p.claim_id
                || ') and has a tombstone'
         FROM claim_tombstones t JOIN processed_messages p ON p.idempotency_key = t.idempotency_key
         ORDER BY p.claim_id LIMIT 1",
    ),
    (
        // A duplicate record is evidence that something was paid before: it must name a claim
        // still here, or one a purge removed and tombstoned. Deleting a claim (and re-sealing
        // the chain) leaves its duplicate records pointing at nothing.
        "duplicate record without a claim or tombstone",
        "SELECT 'audit record ' || a.seq || ' (duplicate, key ' || ifnull(a.idempotency_key, 'none')
                || ') names a key with no claim and no tombstone'
         FROM audit_log a
         LEFT JOIN processed_messages p ON p.idempotency_key = unhex(a.idempotency_key)
         LEFT JOIN claim_tombstones t ON t.idempotency_key = unhex(a.idempotency_key)
         WHERE a.kind = 'duplicate' AND p.claim_id IS NULL AND t.idempotency_key IS NULL
         ORDER BY a.seq LIMIT 1",
    ),
    (
        // One `dead_letters` row per `dead_letter` record, counted per stream entry id (the
        // records carry no stream name; the entry id is what both sides share).
        "dead letters and dead_letter records disagree",
        "WITH r AS (SELECT ifnull(stream_entry_id, '') AS e, COUNT(*) AS n FROM audit_log
                    WHERE kind = 'dead_letter' GROUP BY 1),
              d AS (SELECT stream_entry_id AS e, COUNT(*) AS n FROM dead_letters GROUP BY 1)
         SELECT 'stream entry ' || e || ' has ' || rows || ' dead_letters rows but ' || records
                || ' dead_letter records'
         FROM (SELECT d.e AS e, d.n AS rows, ifnull(r.n, 0) AS records
               FROM d LEFT JOIN r ON r.e = d.e WHERE r.n IS NOT d.n
               UNION ALL
               SELECT r.e, 0, r.n FROM r LEFT JOIN d ON d.e = r.e WHERE d.e IS NULL)
         ORDER BY e LIMIT 1",
    ),
];

/// Checks everything; returns the summary, or `Error::Invariant` naming the first violation.
fn ledger(conn: &mut Connection) -> Result<Summary> {
    let tx = conn.transaction()?;
    integrity(&tx)?;
    constraints(&tx)?;
    for (what, sql) in CHECKS {
        if let Some(found) = tx
            .query_row(sql, [], |r| r.get::<_, String>(0))
            .optional()?
        {
            return Err(Error::Invariant(format!("{what}: {found}")));
        }
    }
    instants(&tx)?;
    let count =
        |sql: &str| -> Result<u64> { Ok(tx.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64) };
    let disbursements = count("SELECT COUNT(*) FROM disbursements")?;
    // Every processed record matches a distinct disbursement (checked above); equal counts then
    // mean every disbursement has its record.
    let processed = count("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'")?;
    if processed != disbursements {
        let found: Option<String> = tx.query_row(
            "SELECT 'disbursement ' || d.id || ' (key ' || lower(hex(d.idempotency_key)) || ') has no processed audit record'
             FROM disbursements d LEFT JOIN audit_log a
               ON a.kind = 'processed' AND a.idempotency_key = lower(hex(d.idempotency_key))
             WHERE a.seq IS NULL ORDER BY d.id LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
        // Every disbursement has a record, so the counts differ only if records are shared.
        return Err(Error::Invariant(format!(
            "disbursement without a processed record: {}",
            found.unwrap_or_else(|| format!(
                "{disbursements} disbursements but {processed} processed records"
            ))
        )));
    }
    let mut links = Verifier::default();
    let mut holds = checks::Holds::default();
    audit_store::for_each(&tx, &Since::All, |r| {
        holds.see(&r);
        chain::check(&mut links, &r)
    })?;
    chain::end(&links)?;
    holds.compare(&super::purge::holds(&tx)?)?;
    decisions(&tx)?;
    Ok(Summary {
        claims: count("SELECT COUNT(*) FROM processed_messages")?,
        disbursements,
        outbox_rows: count("SELECT COUNT(*) FROM outbox")?,
        audit_records: links.count,
        tombstones: count("SELECT COUNT(*) FROM claim_tombstones")?,
        head_hash: links.head().to_owned(),
        unlinked_batches: 0,
    })
}

/// The uniqueness each promise rests on, as sets of columns a table must have a unique,
/// non-partial index (or an integer primary key) on; any one set of a row will do, for
/// ledgers made by earlier releases (`schema.sql`). Someone who can write the file can rebuild
/// a table without its constraint; the rows may still look right until the second claim or
/// outbox row arrives, so the constraint itself is checked.
const UNIQUE: [(&str, &[&[&str]]); 8] = [
    (
        "processed_messages",
        &[
            &["submission_instant", "award_id", "idempotency_key"],
            &["submission_timestamp", "award_id", "idempotency_key"],
            &["idempotency_key"],
        ],
    ),
    ("processed_messages", &[&["claim_id"]]),
    ("disbursements", &[&["claim_id"]]),
    ("outbox", &[&["claim_id"]]),
    ("outbox", &[&["id"]]),
    ("claim_tombstones", &[&["idempotency_key"]]),
    ("dead_letters", &[&["stream", "stream_entry_id"]]),
    ("audit_log", &[&["seq"]]),
];

/// The schema still holds the constraints the checks below take for granted, and nothing
/// runs on its own inside it: `schema.sql` creates no trigger and no view, so any there were
/// put in by hand, and a trigger can copy every new outbox row (a second event per payment)
/// without a single row looking wrong when `verify` runs.
fn constraints(conn: &Connection) -> Result<()> {
    if let Some((kind, name)) = conn
        .query_row(
            "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view')
             ORDER BY name LIMIT 1",
            [],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )
        .optional()?
    {
        return Err(Error::Invariant(format!(
            "schema altered: {kind} {name} is not claimgate's (its schema has none)"
        )));
    }
    for (table, any_of) in UNIQUE {
        let unique = unique_column_sets(conn, table)?;
        if !any_of.iter().any(|cols| unique.iter().any(|u| u == cols)) {
            return Err(Error::Invariant(format!(
                "schema altered: {table} is no longer unique on ({})",
                any_of[0].join(", ")
            )));
        }
    }
    Ok(())
}

/// The column sets `table` is unique on: its integer primary key (the rowid itself), and each
/// unique index that is not partial (a partial one leaves rows outside it unchecked).
fn unique_column_sets(conn: &Connection, table: &str) -> Result<Vec<Vec<String>>> {
    let mut sets = Vec::new();
    let pk: Vec<(String, String)> = conn
        .prepare("SELECT name, upper(type) FROM pragma_table_info(?1) WHERE pk > 0")?
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    if let [(name, ty)] = pk.as_slice() {
        if ty == "INTEGER" {
            sets.push(vec![name.clone()]);
        }
    }
    let indexes: Vec<String> = conn
        .prepare("SELECT name FROM pragma_index_list(?1) WHERE \"unique\" = 1 AND partial = 0")?
        .query_map([table], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for index in indexes {
        let columns: Vec<String> = conn
            .prepare("SELECT ifnull(name, '') FROM pragma_index_info(?1) ORDER BY seqno")?
            .query_map([&index], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        sets.push(columns);
    }
    Ok(sets)
}

/// Every claim's instant agrees with its timestamp ([`checks::instant`] says why).
fn instants(conn: &Connection) -> Result<()> {
    let mut stmt = conn.prepare(
        "SELECT claim_id, submission_timestamp, submission_instant FROM processed_messages
         ORDER BY claim_id",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let (claim, timestamp, instant): (i64, String, Option<String>) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        checks::instant(claim, &timestamp, instant.as_deref())?;
    }
    Ok(())
}

/// SQLite's own consistency check of the file.
fn integrity(conn: &Connection) -> Result<()> {
    let mut stmt = conn.prepare("PRAGMA integrity_check")?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    match problems.first().map(String::as_str) {
        Some("ok") => Ok(()),
        _ => Err(Error::Invariant(format!(
            "SQLite integrity_check: {}",
            problems.join("; ")
        ))),
    }
}

/// Reviewers' decisions on held conflicts agree with their records ([`checks::decisions`]).
fn decisions(conn: &Connection) -> Result<()> {
    let rows = conn
        .prepare(
            "SELECT reason_code, stream_entry_id, decision, decided_by, decided_reason, decided_at
             FROM dead_letters WHERE reason_code = 'conflict_hold' OR decision IS NOT NULL
                OR decided_by IS NOT NULL OR decided_reason IS NOT NULL OR decided_at IS NOT NULL",
        )?
        .query_map([], |r| {
            Ok(checks::HeldRow {
                reason_code: r.get(0)?,
                entry_id: r.get(1)?,
                decision: [r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?],
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let records = conn
        .prepare(
            "SELECT kind, stream_entry_id, detail, recorded_at FROM audit_log
             WHERE kind IN ('conflict_approved', 'conflict_rejected') ORDER BY seq",
        )?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                checks::DecisionRecord {
                    kind: crate::domain::audit::Kind::ConflictApproved,
                    entry_id: r.get(1)?,
                    detail: r.get(2)?,
                    recorded_at: r.get(3)?,
                },
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(|(kind, mut r)| {
            r.kind = crate::domain::audit::Kind::parse(&kind).ok_or_else(|| {
                Error::Invariant(format!("an audit record of unknown kind {kind:?}"))
            })?;
            Ok(r)
        })
        .collect::<Result<Vec<_>>>()?;
    checks::decisions(&rows, &records)
}
