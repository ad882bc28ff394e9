//! [`Inspect`] for SQLite: `claimgate verify`'s checks as SQL, `/healthz`'s ping, and the file
//! path as the ledger's description.
//!
//! Invariant: this module only reads. Every check of `verify` runs inside one read
//! transaction, the audit chain included, so a worker committing meanwhile cannot make a
//! consistent ledger look inconsistent.

use super::{audit_store, SqliteLedger};
use crate::domain::audit::Verifier;
use crate::error::{Error, Result};
use crate::ledger::{chain, Inspect, Since, Summary};
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
const CHECKS: [(&str, &str); 12] = [
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
    for (what, sql) in CHECKS {
        if let Some(found) = tx
            .query_row(sql, [], |r| r.get::<_, String>(0))
            .optional()?
        {
            return Err(Error::Invariant(format!("{what}: {found}")));
        }
    }
    let count =
        |sql: &str| -> Result<u64> { Ok(tx.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64) };
    let disbursements = count("SELECT COUNT(*) FROM disbursements")?;
    // Every processed record matches a distinct disbursement (checked above); equal counts then
    // mean every disbursement has its record.
    let processed = count("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'")?;
    if processed != disbursements {
        let found: String = tx.query_row(
            "SELECT 'disbursement ' || d.id || ' (key ' || lower(hex(d.idempotency_key)) || ') has no processed audit record'
             FROM disbursements d LEFT JOIN audit_log a
               ON a.kind = 'processed' AND a.idempotency_key = lower(hex(d.idempotency_key))
             WHERE a.seq IS NULL ORDER BY d.id LIMIT 1",
            [],
            |r| r.get(0),
        )?;
        return Err(Error::Invariant(format!(
            "disbursement without a processed record: {found}"
        )));
    }
    let mut links = Verifier::default();
    audit_store::for_each(&tx, &Since::All, |r| chain::check(&mut links, &r))?;
    chain::end(&links)?;
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
