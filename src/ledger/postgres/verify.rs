//! [`Inspect`] for PostgreSQL: `claimgate verify`'s checks as SQL, `/healthz`'s ping, and the
//! URL (password removed) as the ledger's description.
//!
//! The schema itself is checked first (`catalog.rs`): the checks below take its constraints
//! for granted.
//!
//! Invariant: this module only reads. Every check runs inside one repeatable-read, read-only
//! transaction, the audit chain included, so nodes committing meanwhile cannot make a
//! consistent ledger look inconsistent. PostgreSQL has no whole-database `integrity_check`;
//! the checks that stand in for it are the ones only this backend needs: the chain head row
//! agrees with the chain, no outbox id is above the head's counter or given twice, every batch
//! member and batched outbox row belongs to a batch, each batch has exactly the outbox rows its
//! link names, and linked batches' outbox ids follow each other without a gap; and, last, the
//! ledger's stored counts (what `stats` reports) are what its rows give.
//!
//! The checks read the views `audit_log` and `outbox` (`schema_postgres.sql`), which show a
//! batch committed but not linked yet with its rows (records without a seq, outbox rows without
//! an id): its claims, disbursements and records are checked against each other like any
//! other. Only the chain walk, which checks what is linked, leaves it out.

use super::audit_store;
use super::ledger::{stored_counts, PgLedger, COUNTED};
use crate::domain::audit::Verifier;
use crate::error::{Error, Result};
use crate::ledger::{chain, checks, Inspect, Since, Summary};

impl Inspect for PgLedger {
    fn verify(&self) -> Result<Summary> {
        let mut conn = self.conn()?;
        // Durable, as the chain's head it reports may be written down as evidence.
        let mut tx = self.durable_snapshot(&mut conn.client)?;
        super::catalog::check(&mut tx, &self.target.schema)?;
        ledger(&mut tx)
    }

    fn ping(&self) -> Result<()> {
        self.conn()?.client.simple_query("SELECT 1")?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.redacted.clone()
    }
}

/// Each check: a query returning one text column describing the first row that breaks it, or
/// nothing; the same checks, in the same order, as `sqlite/verify.rs`, except that outbox ids
/// are held to the chain's batch links here (the last checks) rather than to claim order: two
/// writers number their batches' claims and outbox rows independently.
const CHECKS: [(&str, &str); 19] = [
    (
        "key claimed twice",
        "SELECT 'key ' || encode(idempotency_key, 'hex') || ' has ' || COUNT(*) || ' claims'
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
        "SELECT 'claim ' || p.claim_id || ' (key ' || encode(p.idempotency_key, 'hex') || ') has no disbursement'
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
        "claim with more than one disbursement",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' disbursements'
         FROM disbursements GROUP BY claim_id HAVING COUNT(*) > 1 ORDER BY claim_id LIMIT 1",
    ),
    (
        // A second outbox row for a claim is a second event, which the relay would publish.
        "claim with more than one outbox row",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' outbox rows'
         FROM outbox_rows GROUP BY claim_id HAVING COUNT(*) > 1 ORDER BY claim_id LIMIT 1",
    ),
    (
        "disbursement without an outbox row",
        "SELECT 'disbursement ' || d.id || ' (claim ' || d.claim_id || ', key '
                || encode(d.idempotency_key, 'hex') || ') has no outbox row'
         FROM disbursements d LEFT JOIN outbox_rows o ON o.claim_id = d.claim_id
         WHERE o.claim_id IS NULL ORDER BY d.id LIMIT 1",
    ),
    (
        "outbox row without a disbursement",
        "SELECT 'outbox row ' || COALESCE(o.id::text, o.batch_index || ' of batch ' || o.batch_id)
                || ' refers to claim ' || o.claim_id || ', which has no disbursement'
         FROM outbox o LEFT JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE d.id IS NULL ORDER BY o.id, o.batch_id, o.batch_index LIMIT 1",
    ),
    (
        "outbox event differs from its disbursement",
        "SELECT 'outbox row ' || COALESCE(o.id::text, o.batch_index || ' of batch ' || o.batch_id)
                || ' announces ' || COALESCE(j.v ->> 'amount_cents', 'no amount')
                || ' cents but disbursement ' || d.id || ' records ' || d.amount_cents
         FROM outbox o JOIN disbursements d ON d.claim_id = o.claim_id
         CROSS JOIN LATERAL (SELECT claimgate_json(o.payload) AS v) j
         WHERE j.v IS NULL
            OR jsonb_typeof(j.v -> 'amount_cents') IS DISTINCT FROM 'number'
            OR (j.v ->> 'amount_cents') IS DISTINCT FROM d.amount_cents::text
            OR (j.v ->> 'award_id') IS DISTINCT FROM d.award_id
            OR (j.v ->> 'idempotency_key') IS DISTINCT FROM encode(d.idempotency_key, 'hex')
         ORDER BY o.id, o.batch_id, o.batch_index LIMIT 1",
    ),
    (
        "processed record without a matching disbursement",
        "SELECT 'audit record ' || COALESCE(a.seq::text, a.batch_index || ' of batch ' || a.batch_id)
                || ' (processed, key ' || COALESCE(a.idempotency_key, 'none') || ', '
                || COALESCE(a.amount_cents::text, 'no') || ' cents) ' ||
                CASE WHEN d.id IS NULL THEN 'has no disbursement'
                     ELSE 'but disbursement ' || d.id || ' records award ' || d.award_id || ', '
                          || d.amount_cents || ' cents' END
         FROM audit_log a
         LEFT JOIN processed_messages p ON encode(p.idempotency_key, 'hex') = a.idempotency_key
         LEFT JOIN disbursements d ON d.claim_id = p.claim_id
         WHERE a.kind = 'processed'
           AND (d.id IS NULL OR d.amount_cents IS DISTINCT FROM a.amount_cents
                OR d.award_id IS DISTINCT FROM a.award_id)
         ORDER BY a.seq, a.batch_id, a.batch_index LIMIT 1",
    ),
    (
        "key processed twice in the audit log",
        "SELECT 'key ' || idempotency_key || ' has ' || COUNT(*) || ' processed records'
         FROM audit_log WHERE kind = 'processed' GROUP BY idempotency_key HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // A purged key claimed again would be a second payment of one submission.
        "key claimed after its claim was purged",
        "SELECT 'key ' || encode(p.idempotency_key, 'hex') || ' is claimed (claim ' || p.claim_id
                || ') and has a tombstone'
         FROM claim_tombstones t JOIN processed_messages p ON p.idempotency_key = t.idempotency_key
         ORDER BY p.claim_id LIMIT 1",
    ),
    (
        // A duplicate record is evidence that something was paid before: it must name a claim
        // still here, or one a purge removed and tombstoned. Keys are compared as hex text (as
        // the processed check above does), so an edited key that is not hex is named, not an
        // error.
        "duplicate record without a claim or tombstone",
        "SELECT 'audit record ' || COALESCE(a.seq::text, a.batch_index || ' of batch ' || a.batch_id)
                || ' (duplicate, key ' || COALESCE(a.idempotency_key, 'none')
                || ') names a key with no claim and no tombstone'
         FROM audit_log a
         WHERE a.kind = 'duplicate'
           AND NOT EXISTS (SELECT 1 FROM processed_messages p
                           WHERE encode(p.idempotency_key, 'hex') = a.idempotency_key)
           AND NOT EXISTS (SELECT 1 FROM claim_tombstones t
                           WHERE encode(t.idempotency_key, 'hex') = a.idempotency_key)
         ORDER BY a.seq, a.batch_id, a.batch_index LIMIT 1",
    ),
    (
        // One `dead_letters` row per `dead_letter` record, counted per stream entry id (the
        // records carry no stream name; the entry id is what both sides share). Ordered by
        // bytes, as SQLite orders text, so both name the same entry first.
        "dead letters and dead_letter records disagree",
        "WITH r AS (SELECT COALESCE(stream_entry_id, '') AS e, COUNT(*) AS n FROM audit_log
                    WHERE kind = 'dead_letter' GROUP BY 1),
              d AS (SELECT stream_entry_id AS e, COUNT(*) AS n FROM dead_letters GROUP BY 1)
         SELECT 'stream entry ' || e || ' has ' || rows || ' dead_letters rows but ' || records
                || ' dead_letter records'
         FROM (SELECT d.e AS e, d.n AS rows, COALESCE(r.n, 0) AS records
               FROM d LEFT JOIN r ON r.e = d.e WHERE r.n IS DISTINCT FROM d.n
               UNION ALL
               SELECT r.e, 0, r.n FROM r LEFT JOIN d ON d.e = r.e WHERE d.e IS NULL) x
         ORDER BY e COLLATE \"C\" LIMIT 1",
    ),
    (
        "batch member without its batch",
        "SELECT 'audit member ' || m.batch_index || ' of batch ' || m.batch_id
                || ' belongs to no batch'
         FROM audit_members m LEFT JOIN audit_batches b ON b.batch_id = m.batch_id
         WHERE b.batch_id IS NULL ORDER BY m.batch_id, m.batch_index LIMIT 1",
    ),
    (
        "batch outbox rows disagree with the batch",
        "SELECT 'batch ' || b.batch_id || ' has ' || b.outbox_count || ' outbox rows, but '
                || COALESCE(o.n, 0) || ' are numbered ' || COALESCE(o.lo || '..' || o.hi, 'none')
         FROM audit_batches b
         LEFT JOIN (SELECT batch_id, COUNT(*) AS n, MIN(batch_index) AS lo, MAX(batch_index) AS hi
                    FROM outbox_rows WHERE batch_id IS NOT NULL GROUP BY batch_id) o
           ON o.batch_id = b.batch_id
         WHERE COALESCE(o.n, 0) <> b.outbox_count
            OR (o.n > 0 AND (o.lo <> 1 OR o.hi <> b.outbox_count))
         ORDER BY b.batch_id LIMIT 1",
    ),
    (
        "outbox row without its batch",
        "SELECT 'outbox row ' || o.batch_index || ' of batch ' || o.batch_id || ' (claim '
                || o.claim_id || ') belongs to no batch'
         FROM outbox_rows o LEFT JOIN audit_batches b ON b.batch_id = o.batch_id
         WHERE o.batch_id IS NOT NULL AND b.batch_id IS NULL
         ORDER BY o.batch_id, o.batch_index LIMIT 1",
    ),
    (
        // The relay skips every id at or below the events stream's position: an id given
        // twice, or a gap a later link could fill, would lose or repeat an event.
        "outbox id given twice",
        "SELECT 'outbox id ' || id || ' is given to ' || COUNT(*) || ' rows'
         FROM outbox WHERE id IS NOT NULL GROUP BY id HAVING COUNT(*) > 1 ORDER BY id LIMIT 1",
    ),
    (
        "linked batches' outbox ids do not follow each other",
        "SELECT 'batch ' || batch_id || ' (linked at seq ' || link_seq || ') has outbox ids from '
                || outbox_first || ', but the batch linked before it ends at ' || (expected - 1)
         FROM (SELECT batch_id, link_seq, outbox_first,
                      LAG(outbox_first + outbox_count) OVER (ORDER BY link_seq) AS expected
               FROM audit_batches WHERE link_seq IS NOT NULL) x
         WHERE expected IS NOT NULL AND outbox_first <> expected
         ORDER BY link_seq LIMIT 1",
    ),
];

/// Checks everything inside the caller's snapshot; the summary, or the first violation.
fn ledger(tx: &mut postgres::Transaction<'_>) -> Result<Summary> {
    // Every check reads whole tables: hash joins. A nested loop chosen from stale statistics
    // (a ledger never analyzed since it was small) made one check quadratic: minutes at 160,000
    // claims.
    tx.batch_execute("SET LOCAL enable_nestloop = off")?;
    for (what, sql) in CHECKS {
        if let Some(row) = tx.query_opt(sql, &[])? {
            return Err(Error::Invariant(format!(
                "{what}: {}",
                row.get::<_, String>(0)
            )));
        }
    }
    instants(tx)?;
    let counts = tx.query_one(
        "SELECT (SELECT COUNT(*) FROM processed_messages), (SELECT COUNT(*) FROM disbursements),
                (SELECT COUNT(*) FROM outbox_rows),
                (SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'),
                (SELECT COUNT(*) FROM claim_tombstones)",
        &[],
    )?;
    let n = |i: usize| counts.get::<_, i64>(i) as u64;
    let (claims, disbursements, outbox_rows, processed, tombstones) =
        (n(0), n(1), n(2), n(3), n(4));
    checks::processed_records(disbursements, processed, || {
        Ok(tx.query_opt(
            "SELECT 'disbursement ' || d.id || ' (key ' || encode(d.idempotency_key, 'hex') || ') has no processed audit record'
             FROM disbursements d LEFT JOIN audit_log a
               ON a.kind = 'processed' AND a.idempotency_key = encode(d.idempotency_key, 'hex')
             WHERE a.kind IS NULL ORDER BY d.id LIMIT 1",
            &[],
        )?.map(|row| row.get(0)))
    })?;
    let mut links = Verifier::default();
    let mut holds = checks::Holds::default();
    let mut last_seq = 0;
    audit_store::for_each(tx, &audit_store::Range::Since(&Since::All), &mut |r| {
        last_seq = r.seq;
        holds.see(&r);
        chain::check(&mut links, &r)
    })?;
    let (records, head_hash) = chain::end(&links)?;
    head(tx, last_seq, &head_hash)?;
    holds.compare(&super::retention::holds_in(tx)?)?;
    decisions(tx)?;
    stored_counts(tx)?;
    let unlinked: i64 = tx
        .query_one(
            "SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL",
            &[],
        )?
        .get(0);
    Ok(Summary {
        claims,
        disbursements,
        outbox_rows,
        audit_records: records,
        tombstones,
        head_hash,
        unlinked_batches: unlinked as u64,
    })
}

/// Every claim's instant agrees with its timestamp ([`checks::instant`] says why). Rows are
/// streamed, not loaded: a ledger may hold millions.
fn instants(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    use postgres::fallible_iterator::FallibleIterator;
    let mut rows = tx.query_raw(
        "SELECT claim_id, submission_timestamp, submission_instant FROM processed_messages
         ORDER BY claim_id",
        std::iter::empty::<i64>(),
    )?;
    while let Some(row) = rows.next()? {
        let (claim, timestamp, instant): (i64, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        checks::instant(claim, &timestamp, instant.as_deref())?;
    }
    Ok(())
}

/// The chain head row agrees with the chain just walked (its last seq, the hash the next
/// record links to), and no outbox id is above its counter (the next batch would reuse it).
fn head(tx: &mut postgres::Transaction<'_>, last_seq: i64, head_hash: &str) -> Result<()> {
    let row = tx.query_one(
        "SELECT h.seq, h.hash, h.outbox_id_last, (SELECT MAX(id) FROM outbox)
         FROM chain_head h WHERE h.id = 1",
        &[],
    )?;
    let (seq, hash, outbox_last, outbox_max): (i64, String, i64, Option<i64>) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if seq != last_seq || hash != head_hash {
        return Err(Error::Invariant(format!(
            "chain head: the head row says seq {seq}, hash {hash}, but the chain ends at seq \
             {last_seq} linking to {head_hash}"
        )));
    }
    if let Some(max) = outbox_max.filter(|m| *m > outbox_last) {
        return Err(Error::Invariant(format!(
            "chain head: outbox row {max} is above the head's last outbox id {outbox_last}"
        )));
    }
    Ok(())
}

/// The ledger's counts as stored (`chain_head` plus `purge_counts`, what `stats` reports)
/// are the counts its rows give (`claimgate_counted`, in this snapshot); else the first that
/// differs, both values, and how to set them again.
fn stored_counts(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    let row = tx.query_one(
        concat!(
            "SELECT ",
            stored_counts!(),
            ", c.claims, c.disbursements, c.disbursed_cents_total::text, c.dead_letters,
                c.duplicates, c.conflicts, c.vanished, c.audit_records, c.tombstones
         FROM chain_head h, purge_counts p, claimgate_counted() c
         WHERE h.id = 1 AND p.id = 1"
        ),
        &[],
    )?;
    // As text, so a count a hand edit took below zero is named too, not refused as one.
    let text = |i: usize| -> String {
        match i {
            2 | 11 => row.get(i),
            _ => row.get::<_, i64>(i).to_string(),
        }
    };
    for (i, name) in COUNTED.iter().enumerate() {
        let (stored, rows) = (text(i), text(COUNTED.len() + i));
        if stored != rows {
            return Err(Error::Invariant(format!(
                "stored count differs from the rows: {name} is stored as {stored} \
                 (chain_head plus purge_counts) but the ledger holds {rows}; status and \
                 /metrics report the stored count: set every count from the rows with \
                 `SELECT claimgate_recount();`, run in the ledger's schema as the role that \
                 owns it, then verify again"
            )));
        }
    }
    Ok(())
}

/// Reviewers' decisions on held conflicts agree with their records ([`checks::decisions`]),
/// the records read from every batch, linked or not (`audit_log`).
fn decisions(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    let rows = tx
        .query(
            "SELECT reason_code, stream_entry_id, decision, decided_by, decided_reason, decided_at
             FROM dead_letters WHERE reason_code = 'conflict_hold' OR decision IS NOT NULL
                OR decided_by IS NOT NULL OR decided_reason IS NOT NULL OR decided_at IS NOT NULL",
            &[],
        )?
        .iter()
        .map(checks::HeldRow::read)
        .collect::<Result<Vec<_>>>()?;
    let records = tx
        .query(
            "SELECT kind, stream_entry_id, detail, recorded_at FROM audit_log
             WHERE kind IN ('conflict_approved', 'conflict_rejected')",
            &[],
        )?
        .iter()
        .map(checks::DecisionRecord::read)
        .collect::<Result<Vec<_>>>()?;
    checks::decisions(&rows, &records)
}
