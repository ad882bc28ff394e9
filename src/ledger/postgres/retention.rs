//! [`Retention`] for PostgreSQL: legal holds, and the purge batches of `claimgate retention
//! purge`, with the same rules as `sqlite/purge.rs` (read it for the shape of a purge).
//!
//! One node at a time: `export_purge` takes the session advisory lock [`PURGE_LOCK`]
//! (without waiting: a second purge is refused, naming the reason) on a connection kept for
//! the purge's `purge_batch` calls, and it is released when the ledger handle is dropped. Two
//! interleaved purges of one prefix would each leave a checkpoint, and the second would
//! continue from the first's hash instead of the purged record's, breaking the chain.
//!
//! Each batch is one transaction that removes records `first..=last` with the rows they
//! describe, leaves a tombstone for every claim it removes and a checkpoint at `last`; the
//! chain head is not touched (a checkpoint at the very end continues from the hash the head
//! already holds). A purge takes whole batches of the chain only: a range begins at a batch's
//! first member or a record sealed alone and ends at a batch's link or a record sealed alone,
//! so the checkpoint at `last` continues from a hash the next batch's link was sealed after.
//! Batches not linked yet are not in the chain, and nothing of theirs is purged.
//!
//! A hold placed or lifted leaves its `hold_added` / `hold_removed` record in the same
//! transaction, as a batch of one member (`write::write_members`), linked right after the
//! commit like a worker's batch.

use super::ledger::{PgLedger, PURGE_LOCK};
use super::{audit_store, connect::Manager, link, write};
use crate::domain::audit::{detail, Kind, Record};
use crate::error::{Error, Result};
use crate::ledger::{purge, Hold, PurgePlan, Removed, Retention};
use crate::support::failpoint;
use r2d2::PooledConnection;

impl Retention for PgLedger {
    fn hold_add(&self, award_id: &str, reason: &str, now: &str) -> Result<bool> {
        let mut conn = self.conn()?;
        let st = write::Statements::prepare(&mut conn)?;
        let mut tx = conn.client.transaction()?;
        // A concurrent hold of the same award waits on this row's unique index entry, then
        // finds it and writes nothing: one hold, one record.
        let n = tx.execute(
            "INSERT INTO legal_holds (award_id, reason, held_at) VALUES ($1, $2, $3)
             ON CONFLICT (award_id) DO NOTHING",
            &[&award_id, &reason, &now],
        )?;
        let written = if n == 1 {
            let text = detail::hold_added(reason);
            let r = Record::hold(Kind::HoldAdded, award_id, text, now);
            Some(hold_record(&mut tx, &st, r, now)?)
        } else {
            None
        };
        tx.commit()?;
        if let Some(b) = written {
            link::link_committed(&mut conn, b)?;
        }
        Ok(n == 1)
    }

    fn hold_remove(&self, award_id: &str, now: &str) -> Result<bool> {
        let mut conn = self.conn()?;
        let st = write::Statements::prepare(&mut conn)?;
        let mut tx = conn.client.transaction()?;
        let held = tx.query_opt(
            "DELETE FROM legal_holds WHERE award_id = $1 RETURNING reason, held_at",
            &[&award_id],
        )?;
        let written = match &held {
            Some(row) => {
                let text = detail::hold_removed(row.get(0), row.get(1));
                let r = Record::hold(Kind::HoldRemoved, award_id, text, now);
                Some(hold_record(&mut tx, &st, r, now)?)
            }
            None => None,
        };
        tx.commit()?;
        if let Some(b) = written {
            link::link_committed(&mut conn, b)?;
        }
        Ok(held.is_some())
    }

    fn holds(&self) -> Result<Vec<Hold>> {
        holds_in(&mut self.conn()?.client)
    }

    fn claims_of(&self, award_id: &str) -> Result<u64> {
        let n: i64 = self
            .conn()?
            .client
            .query_one(
                "SELECT COUNT(*) FROM processed_messages WHERE award_id = $1",
                &[&award_id],
            )?
            .get(0);
        Ok(n as u64)
    }

    fn export_purge(
        &self,
        cutoff: &str,
        batch_records_max: usize,
        admit: &mut dyn FnMut(&PurgePlan) -> Result<()>,
        row: &mut dyn FnMut(&serde_json::Value) -> Result<()>,
    ) -> Result<Option<(PurgePlan, Vec<i64>)>> {
        let mut session = self.purge.lock().unwrap_or_else(|p| p.into_inner());
        if session.is_none() {
            *session = Some(self.purge_session()?);
        }
        let conn = session.as_mut().expect("set just above");
        index_claim_keys(&mut conn.client, cutoff)?;
        let mut tx = super::ledger::snapshot(&mut conn.client)?;
        purge::export(&mut tx, cutoff, batch_records_max, admit, row)
    }

    fn purge_batch(
        &self,
        first: i64,
        last: i64,
        cutoff: &str,
        detail: &str,
        now: &str,
    ) -> Result<Removed> {
        let mut session = self.purge.lock().unwrap_or_else(|p| p.into_inner());
        if session.is_none() {
            let mut conn = self.purge_session()?;
            index_claim_keys(&mut conn.client, cutoff)?;
            *session = Some(conn);
        }
        let conn = session.as_mut().expect("set just above");
        match purge_batch(&mut conn.client, first, last, detail, now) {
            // Claims made since the map was built (before `cutoff` all the same) are not in it
            // yet: the batch rolled back; build it again and look once more.
            Err(Error::Invariant(_)) => {
                index_claim_keys(&mut conn.client, cutoff)?;
                purge_batch(&mut conn.client, first, last, detail, now)
            }
            done => done,
        }
    }
}

/// Writes a hold's record inside `tx` as a batch of one, to be linked after the commit;
/// returns the batch.
fn hold_record(
    tx: &mut postgres::Transaction<'_>,
    st: &write::Statements,
    record: Record,
    now: &str,
) -> Result<i64> {
    write::write_members(tx, st, &mut [record], &[], now)?
        .ok_or_else(|| Error::Invariant("a hold's record wrote no batch".into()))
}

impl PgLedger {
    /// A connection holding the purge lock, or a refusal when another purge holds it.
    fn purge_session(&self) -> Result<PooledConnection<Manager>> {
        let mut conn = self.conn()?;
        let got: bool = conn
            .client
            .query_one(
                "SELECT pg_try_advisory_lock($1, $2)",
                &[&PURGE_LOCK.0, &PURGE_LOCK.1],
            )?
            .get(0);
        if !got {
            return Err(Error::Other(format!(
                "another retention purge is running on {} (it holds the purge lock); run one at \
                 a time",
                self.redacted
            )));
        }
        Ok(conn)
    }
}

impl PgLedger {
    /// Releases the purge lock, if this handle took it: it is a session lock on a pooled
    /// connection, so it must never outlive the purge inside a pool that lives on.
    pub(super) fn end_purge(&mut self) {
        if let Some(mut conn) = self.purge.get_mut().ok().and_then(Option::take) {
            let _ = conn.client.simple_query("SELECT pg_advisory_unlock_all()");
        }
    }
}

/// Builds `claim_keys` (a temporary table, on this connection only): key → claim id for every
/// claim made before `cutoff`, the only claims a purge can reach; audit records name claims by
/// key, and the claim index leads with time and award (see `sqlite/purge.rs`).
fn index_claim_keys(client: &mut postgres::Client, cutoff: &str) -> Result<()> {
    client.batch_execute(
        "CREATE TEMP TABLE IF NOT EXISTS claim_keys (
             idempotency_key BYTEA PRIMARY KEY, claim_id BIGINT NOT NULL);
         TRUNCATE claim_keys;",
    )?;
    client.execute(
        "INSERT INTO claim_keys (idempotency_key, claim_id)
         SELECT idempotency_key, claim_id FROM processed_messages WHERE claimed_at < $1
         ON CONFLICT DO NOTHING",
        &[&cutoff],
    )?;
    client.batch_execute("ANALYZE claim_keys")?;
    Ok(())
}

/// The records with seqs in `$1..=$2` (a range of whole batches), the columns a purge asks
/// about: those sealed alone by their seq, a batch's members by their batch's link.
macro_rules! records_in {
    () => {
        "(SELECT kind, idempotency_key, award_id, stream_entry_id FROM audit_chain
          WHERE seq BETWEEN $1 AND $2
          UNION ALL
          SELECT m.kind, m.idempotency_key, m.award_id, m.stream_entry_id
          FROM audit_batches b JOIN audit_members m ON m.batch_id = b.batch_id
          WHERE b.link_seq BETWEEN $1 AND $2)"
    };
}

/// Claims whose `processed` record lies in `$1..=$2`.
const CLAIMS_IN: &str = concat!(
    "SELECT k.claim_id FROM ",
    records_in!(),
    " a JOIN claim_keys k ON k.idempotency_key = a.idempotency_key
     WHERE a.kind = 'processed'"
);

/// Dead-letter entries whose `dead_letter` record lies in `$1..=$2`.
const DEAD_IN: &str = concat!(
    "SELECT a.stream_entry_id FROM ",
    records_in!(),
    " a WHERE a.kind = 'dead_letter'"
);

/// The seqs a purge range may end at: records sealed alone and batches' links.
const ENDS: &str = "(SELECT seq AS e FROM audit_chain UNION ALL
     SELECT link_seq FROM audit_batches WHERE link_seq IS NOT NULL)";

/// A purge's export asks the read snapshot it runs in ([`purge::Snapshot`]).
impl purge::Snapshot for postgres::Transaction<'_> {
    /// The audit prefix a purge before `cutoff` may remove, as in `sqlite/purge.rs`: it ends
    /// before the first record at or after `cutoff` that is not a checkpoint, and a batch counts
    /// as at or after `cutoff` if any of its records is (its members were written when its row
    /// was, its link when it was linked).
    fn prefix(&mut self, cutoff: &str) -> Result<Option<(i64, i64)>> {
        let row = self.query_one(
            &format!(
                "SELECT (SELECT MIN(s) FROM (SELECT MIN(seq) AS s FROM audit_chain UNION ALL
                         SELECT MIN(link_seq - record_count + 1) FROM audit_batches) f),
                        (SELECT MAX(e) FROM {ENDS} x WHERE e < COALESCE(
                            (SELECT MIN(s) FROM (
                                SELECT MIN(seq) AS s FROM audit_chain
                                WHERE recorded_at >= $1 AND kind <> 'checkpoint'
                                UNION ALL
                                SELECT MIN(link_seq - record_count + 1) FROM audit_batches
                                WHERE link_seq IS NOT NULL
                                  AND (created_at >= $1 OR linked_at >= $1)) t),
                            9223372036854775807))"
            ),
            &[&cutoff],
        )?;
        let (Some(first), Some(last)): (Option<i64>, Option<i64>) = (row.get(0), row.get(1)) else {
            return Ok(None);
        };
        let only_checkpoint = self
            .query_opt(
                "SELECT 1 FROM audit_chain WHERE seq BETWEEN $1 AND $2 AND kind <> 'checkpoint'
                 UNION ALL
                 SELECT 1 FROM audit_batches WHERE link_seq BETWEEN $1 AND $2 LIMIT 1",
                &[&first, &last],
            )?
            .is_none();
        Ok(if last < first || only_checkpoint {
            None
        } else {
            Some((first, last))
        })
    }

    /// Held awards named by any record in `first..=last`.
    fn held_in(&mut self, first: i64, last: i64) -> Result<Vec<String>> {
        Ok(self
            .query(
                concat!(
                    "SELECT DISTINCT a.award_id FROM ",
                    records_in!(),
                    " a JOIN legal_holds h ON h.award_id = a.award_id ORDER BY a.award_id"
                ),
                &[&first, &last],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// Outbox rows among the claims of `first..=last` not yet published, or not yet on every
    /// events stream a relay has published this ledger to: above the lowest `published_upto:`
    /// mark (`outbox.rs`), or without an id yet. Either relay of two may set `published_at`; the
    /// other reads rows by id from its own stream's position, so a row above its mark must stay.
    fn unpublished_in(&mut self, first: i64, last: i64) -> Result<u64> {
        let n: i64 = self
            .query_one(
                &format!(
                    "SELECT COUNT(*) FROM outbox
                     WHERE (published_at IS NULL OR id IS NULL
                            OR id > (SELECT MIN(value::bigint) FROM ledger_meta
                                     WHERE name LIKE 'published\\_upto:%'))
                       AND claim_id IN ({CLAIMS_IN})"
                ),
                &[&first, &last],
            )?
            .get(0);
        Ok(n as u64)
    }

    /// The seq ending a purge batch of at most `count` records starting at `first`, within
    /// `..=last`, at the edge of a chain batch (a chain batch larger than `count` is taken whole).
    fn batch_end(&mut self, first: i64, last: i64, count: usize) -> Result<i64> {
        let end: Option<i64> = self
            .query_one(
                &format!(
                    "SELECT COALESCE(
                         (SELECT MAX(e) FROM {ENDS} x WHERE e BETWEEN $1 AND LEAST($2, $1 + $3 - 1)),
                         (SELECT MIN(e) FROM {ENDS} x WHERE e BETWEEN $1 AND $2))"
                ),
                &[&first, &last, &(count as i64)],
            )?
            .get(0);
        Ok(end.unwrap_or(last))
    }

    fn records(&mut self, first: i64, last: i64) -> Result<Vec<Record>> {
        audit_store::range(self, first, last)
    }

    /// The other tables' rows: keys in hex, columns in the same order and with the same names
    /// as the SQLite export.
    fn export_rows(&mut self, first: i64, last: i64) -> Result<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        let tables = [
            (
                "processed_messages",
                format!(
                    "SELECT claim_id, encode(idempotency_key, 'hex') AS idempotency_key, award_id,
                            submission_timestamp, amount_cents, claimed_at, stream_entry_id, consumer,
                            submission_instant
                     FROM processed_messages WHERE claim_id IN ({CLAIMS_IN})"
                ),
            ),
            (
                "disbursements",
                format!(
                    "SELECT id, claim_id, encode(idempotency_key, 'hex') AS idempotency_key, award_id,
                            amount_cents, recorded_at
                     FROM disbursements WHERE claim_id IN ({CLAIMS_IN})"
                ),
            ),
            (
                "outbox",
                format!(
                    "SELECT id, claim_id, event_type, payload, created_at, published_at
                     FROM outbox WHERE claim_id IN ({CLAIMS_IN})"
                ),
            ),
            (
                "dead_letters",
                format!("SELECT * FROM dead_letters WHERE stream_entry_id IN ({DEAD_IN})"),
            ),
        ];
        for (table, sql) in tables {
            let json_sql = format!("SELECT row_to_json(t)::text FROM ({sql}) t");
            for r in self.query(&json_sql, &[&first, &last])? {
                let row: serde_json::Value = serde_json::from_str(r.get(0))
                    .map_err(|e| Error::Other(format!("exporting {table}: {e}")))?;
                out.push(serde_json::json!({ "table": table, "row": row }));
            }
        }
        Ok(out)
    }
}

/// Removes batch `first..=last` and leaves a checkpoint at `last`, in one transaction.
fn purge_batch(
    client: &mut postgres::Client,
    first: i64,
    last: i64,
    detail: &str,
    now: &str,
) -> Result<Removed> {
    let mut tx = client.transaction()?;
    // Holds placed since the plan. A hold committed after this read is missed, as one
    // committed after SQLite's check would be: a hold stops the purges that start after it.
    purge::refuse_held(&purge::Snapshot::held_in(&mut tx, first, last)?)?;
    let continues_from: String = tx
        .query_one(
            "SELECT encode(hash, 'hex') FROM audit_chain WHERE seq = $1
             UNION ALL SELECT hash FROM audit_batches WHERE link_seq = $1",
            &[&last],
        )?
        .get(0);
    let gone = delete_claims(&mut tx, first, last, now)?;
    let dead_letters = tx.execute(
        &format!("DELETE FROM dead_letters WHERE stream_entry_id IN ({DEAD_IN})"),
        &[&first, &last],
    )?;
    failpoint::hit("purge_after_rows");
    let sealed_alone = deleted_records(
        &mut tx,
        "DELETE FROM audit_chain WHERE seq BETWEEN $1 AND $2 RETURNING kind",
        first,
        last,
    )?;
    let members = deleted_records(
        &mut tx,
        "DELETE FROM audit_members m USING audit_batches b
         WHERE m.batch_id = b.batch_id AND b.link_seq BETWEEN $1 AND $2 RETURNING m.kind",
        first,
        last,
    )?;
    // The links go with their batches; they are seals, not records, so not counted.
    tx.execute(
        "DELETE FROM audit_batches WHERE link_seq BETWEEN $1 AND $2",
        &[&first, &last],
    )?;
    let records = sealed_alone.n + members.n;
    let checkpoint = Record::checkpoint(last, detail, now, &continues_from);
    audit_store::insert(&mut tx, &checkpoint)?;
    failpoint::hit("purge_after_checkpoint");
    // Every purge batch moves the purge count, as SQLite's do (and `migrate` carries it).
    tx.execute(
        "INSERT INTO ledger_meta (name, value) VALUES ($1, '1')
         ON CONFLICT (name) DO UPDATE SET value = (ledger_meta.value::bigint + 1)::text",
        &[&PURGES_META],
    )?;
    // What this batch took off the ledger's counts, and the checkpoint and tombstones it left,
    // committed with the rows (`schema_postgres.sql`, `purge_counts`; never the chain head,
    // which links wait for).
    let i = |n: u64| n as i64;
    tx.execute(
        "UPDATE purge_counts SET claims = claims - $1, disbursements = disbursements - $2,
             disbursed_cents_total = disbursed_cents_total - $3::text::numeric,
             dead_letters = dead_letters - $4, duplicates = duplicates - $5,
             conflicts = conflicts - $6, vanished = vanished - $7,
             audit_records = audit_records - $8 + 1, tombstones = tombstones + $9
         WHERE id = 1",
        &[
            &i(gone.claims),
            &i(gone.disbursements),
            &gone.cents,
            &i(dead_letters),
            &i(sealed_alone.duplicates + members.duplicates),
            &i(sealed_alone.conflicts + members.conflicts),
            &i(sealed_alone.vanished + members.vanished),
            &i(records),
            &i(gone.tombstones),
        ],
    )?;
    tx.commit()?;
    Ok(Removed {
        records,
        claims: gone.claims,
        dead_letters,
    })
}

/// The `ledger_meta` row every purge batch moves; the name SQLite uses, so `migrate` carries it.
const PURGES_META: &str = "claims_purged";

/// Records a purge batch deleted, by the kinds the ledger counts.
struct Deleted {
    n: u64,
    duplicates: u64,
    conflicts: u64,
    vanished: u64,
}

/// Runs `sql`, a `DELETE` of records in `first..=last` returning their kinds, and counts them.
fn deleted_records(
    tx: &mut postgres::Transaction<'_>,
    sql: &str,
    first: i64,
    last: i64,
) -> Result<Deleted> {
    let row = tx.query_one(
        &format!(
            "WITH gone AS ({sql}) SELECT COUNT(*),
                 COUNT(*) FILTER (WHERE kind = 'duplicate'),
                 COUNT(*) FILTER (WHERE kind = 'conflict'),
                 COUNT(*) FILTER (WHERE kind = 'vanished')
             FROM gone"
        ),
        &[&first, &last],
    )?;
    let n = |i: usize| row.get::<_, i64>(i) as u64;
    Ok(Deleted {
        n: n(0),
        duplicates: n(1),
        conflicts: n(2),
        vanished: n(3),
    })
}

/// What [`delete_claims`] removed and left.
struct Gone {
    claims: u64,
    disbursements: u64,
    /// Their cents, as NUMERIC text (exact).
    cents: String,
    tombstones: u64,
}

/// Deletes the claims (with their disbursements and outbox rows) of the batch's `processed`
/// records, leaving each claim's tombstone (key, claimed_at, purged at `now`) first; refuses,
/// as an invariant violation, when a record's claim is not found.
///
/// The tombstone and the claim's deletion commit together, so a worker's read of a key (claims
/// and tombstones in one statement, `batch.rs` step 2) sees one or the other, never neither:
/// a purge racing a claim of the same key cannot let the key be claimed again.
fn delete_claims(
    tx: &mut postgres::Transaction<'_>,
    first: i64,
    last: i64,
    now: &str,
) -> Result<Gone> {
    let ids: Vec<i64> = tx
        .query(CLAIMS_IN, &[&first, &last])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let records: i64 = tx
        .query_one(
            concat!(
                "SELECT COUNT(*) FROM ",
                records_in!(),
                " a WHERE a.kind = 'processed'"
            ),
            &[&first, &last],
        )?
        .get(0);
    purge::all_claims_found(records, ids.len() as i64, first, last)?;
    // ON CONFLICT DO NOTHING, as SQLite's OR IGNORE: a hand-edited ledger could hold a
    // tombstone of a key that is also claimed (`verify` names that); the earlier one is kept.
    let tombstones = tx.execute(
        "INSERT INTO claim_tombstones (idempotency_key, claimed_at, purged_at)
         SELECT idempotency_key, claimed_at, $2 FROM processed_messages WHERE claim_id = ANY($1)
         ON CONFLICT DO NOTHING",
        &[&ids, &now],
    )?;
    tx.execute("DELETE FROM outbox_rows WHERE claim_id = ANY($1)", &[&ids])?;
    let row = tx.query_one(
        "WITH gone AS (DELETE FROM disbursements WHERE claim_id = ANY($1) RETURNING amount_cents)
         SELECT COUNT(*), COALESCE(SUM(amount_cents), 0)::text FROM gone",
        &[&ids],
    )?;
    let claims = tx.execute(
        "DELETE FROM processed_messages WHERE claim_id = ANY($1)",
        &[&ids],
    )?;
    Ok(Gone {
        claims,
        disbursements: row.get::<_, i64>(0) as u64,
        cents: row.get(1),
        tombstones,
    })
}

/// Every hold, by award, as `client` (a connection or a transaction's snapshot) sees them.
pub(super) fn holds_in(client: &mut impl postgres::GenericClient) -> Result<Vec<Hold>> {
    Ok(client
        .query(
            "SELECT award_id, reason, held_at FROM legal_holds ORDER BY award_id",
            &[],
        )?
        .iter()
        .map(|r| Hold {
            award_id: r.get(0),
            reason: r.get(1),
            held_at: r.get(2),
        })
        .collect())
}
