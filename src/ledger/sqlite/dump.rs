//! Every row of a SQLite ledger, in one read transaction, for `claimgate migrate`
//! (`ledger/copy.rs`). Claims come before the rows that refer to them.

use super::audit_store;
use super::ledger::SqliteLedger;
use crate::domain::key::IdempotencyKey;
use crate::error::{Error, Result};
use crate::ledger::copy::{Counters, Row, Sink};
use crate::ledger::{Hold, Since};
use rusqlite::OptionalExtension;

/// The dump's ordered reads. Each is in the order of a key its table is stored or indexed by,
/// so none sorts: the pool's connections keep temporary B-trees in memory, and a sort of every
/// disbursement (`ORDER BY id`, a column computed from `claim_id` in this format) took
/// `migrate` to 1.3 GB at ten million claims. Disbursements go in claim order, which is their
/// id order in every format.
const CLAIMS: &str =
    "SELECT claim_id, idempotency_key, award_id, submission_timestamp, amount_cents,
                             claimed_at, stream_entry_id, consumer, submission_instant
                      FROM processed_messages ORDER BY claim_id";
/// A disbursement's time is its claim's where it stores none (`derived.rs`).
const DISBURSEMENTS: &str = "SELECT d.id, d.claim_id, d.idempotency_key,
                                    d.award_id, d.amount_cents, ifnull(d.recorded_at, p.claimed_at)
                             FROM disbursements d
                             LEFT JOIN processed_messages p ON p.claim_id = d.claim_id
                             ORDER BY d.claim_id";
const OUTBOX: &str = super::derived::OUTBOX_ROWS;
const DEAD_LETTERS: &str =
    "SELECT stream, stream_entry_id, reason_code, reason, award_id, delivery_count,
            recorded_at, decision, decided_by, decided_reason, decided_at
     FROM dead_letters ORDER BY stream, stream_entry_id";
const TOMBSTONES: &str = "SELECT idempotency_key, claimed_at, purged_at FROM claim_tombstones
                          ORDER BY idempotency_key";

impl SqliteLedger {
    /// Sends every row to `sink` (claims, disbursements, outbox, dead letters, audit records
    /// in seq order, tombstones, holds, meta) from one snapshot; returns the counters.
    pub fn dump(&self, sink: &mut Sink<'_>) -> Result<Counters> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let key = |bytes: Vec<u8>| {
            IdempotencyKey::from_slice(&bytes)
                .ok_or_else(|| Error::Invariant(format!("a stored key of {} bytes", bytes.len())))
        };
        {
            let mut st = tx.prepare(CLAIMS)?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sink(Row::Claim {
                    claim_id: r.get(0)?,
                    key: key(r.get(1)?)?,
                    award_id: r.get(2)?,
                    submission_timestamp: r.get(3)?,
                    amount_cents: r.get(4)?,
                    claimed_at: r.get(5)?,
                    stream_entry_id: r.get(6)?,
                    consumer: r.get(7)?,
                    submission_instant: r.get::<_, Option<String>>(8)?.ok_or_else(|| {
                        Error::Invariant("a claim without its submission instant".into())
                    })?,
                })?;
            }
        }
        {
            let mut st = tx.prepare(DISBURSEMENTS)?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sink(Row::Disbursement {
                    id: r.get(0)?,
                    claim_id: r.get(1)?,
                    key: key(r.get(2)?)?,
                    award_id: r.get(3)?,
                    amount_cents: r.get(4)?,
                    recorded_at: r.get::<_, Option<String>>(5)?.ok_or_else(|| {
                        Error::Invariant("a disbursement without its time or its claim".into())
                    })?,
                })?;
            }
        }
        {
            let mut st = tx.prepare(OUTBOX)?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                let o = super::derived::OutboxRow::read(r)?;
                let spelled_by_claim = o.spelled_by_claim(r)?;
                sink(Row::Outbox {
                    spelled_by_claim,
                    id: o.id,
                    claim_id: o.claim_id,
                    event_type: o.event_type,
                    payload: o.payload,
                    created_at: o.created_at.ok_or_else(|| {
                        Error::Invariant(format!("outbox row {} has no creation time", o.id))
                    })?,
                    published_at: o.published_at,
                })?;
            }
        }
        {
            let mut st = tx.prepare(DEAD_LETTERS)?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sink(Row::DeadLetter {
                    stream: r.get(0)?,
                    stream_entry_id: r.get(1)?,
                    reason_code: r.get(2)?,
                    reason: r.get(3)?,
                    award_id: r.get(4)?,
                    delivery_count: r.get(5)?,
                    recorded_at: r.get(6)?,
                    decision: [r.get(7)?, r.get(8)?, r.get(9)?, r.get(10)?],
                })?;
            }
        }
        audit_store::for_each(&tx, &Since::All, |r| sink(Row::Audit(r)))?;
        {
            let mut st = tx.prepare(TOMBSTONES)?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sink(Row::Tombstone {
                    key: key(r.get(0)?)?,
                    claimed_at: r.get(1)?,
                    purged_at: r.get(2)?,
                })?;
            }
        }
        {
            let mut st = tx.prepare("SELECT award_id, reason, held_at FROM legal_holds")?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sink(Row::Hold(Hold {
                    award_id: r.get(0)?,
                    reason: r.get(1)?,
                    held_at: r.get(2)?,
                }))?;
            }
        }
        {
            let mut st = tx.prepare("SELECT name, value FROM ledger_meta")?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sink(Row::Meta {
                    name: r.get(0)?,
                    value: r.get(1)?,
                })?;
            }
        }
        // AUTOINCREMENT's high-water mark survives a purge of the top rows; MAX(id) may not.
        let seq: Option<i64> = tx
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        let max: Option<i64> = tx.query_row("SELECT MAX(id) FROM outbox", [], |r| r.get(0))?;
        Ok(Counters {
            outbox_id_last: seq.unwrap_or(0).max(max.unwrap_or(0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No read of the dump sorts: on a ledger of today's format, and on one whose
    /// disbursements have an id of their own with a unique index on the claim (the first
    /// release's shape, `schema.sql`).
    #[test]
    fn the_dump_reads_every_table_in_an_order_it_is_kept_in() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::SCHEMA).unwrap();
        let sorts = |conn: &rusqlite::Connection, sql: &str| -> Vec<String> {
            let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let plan: Vec<String> = st
                .query_map([], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            plan.into_iter()
                .filter(|step| step.contains("TEMP B-TREE"))
                .collect()
        };
        for sql in [CLAIMS, DISBURSEMENTS, OUTBOX, DEAD_LETTERS, TOMBSTONES] {
            assert_eq!(sorts(&conn, sql), Vec::<String>::new(), "{sql}");
        }
        let audit = format!(
            "SELECT {} FROM audit_log ORDER BY seq",
            audit_store::COLUMNS
        );
        assert_eq!(sorts(&conn, &audit), Vec::<String>::new());
        conn.execute_batch(
            "DROP TABLE disbursements;
             CREATE TABLE disbursements (
                 id INTEGER PRIMARY KEY, claim_id INTEGER NOT NULL UNIQUE,
                 idempotency_key BLOB NOT NULL, award_id TEXT NOT NULL,
                 amount_cents INTEGER NOT NULL, recorded_at TEXT NOT NULL);",
        )
        .unwrap();
        assert_eq!(sorts(&conn, DISBURSEMENTS), Vec::<String>::new());
    }
}
