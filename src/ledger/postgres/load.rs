//! Taking a whole ledger in, for `claimgate migrate` (`ledger/copy.rs`): every row as it was,
//! ids and audit records unchanged, into an empty PostgreSQL ledger, in one transaction that
//! holds the chain head from the start (no link can be made meanwhile), then the chain head and
//! the id sequences set to continue after what was copied. The copied records are sealed one
//! by one (`audit_chain`) and the outbox rows keep their ids (`outbox_rows.id`); batches written
//! afterwards chain after them. The ledger's counts are set from the copied rows before the
//! commit, and the tables analysed after it.

use super::ledger::PgLedger;
use crate::domain::audit::{Kind, GENESIS_HASH};
use crate::error::{Error, Result};
use crate::ledger::copy::{Counters, Row, Sink};
use postgres::binary_copy::BinaryCopyInWriter;

/// Rows buffered before they are written. Each buffer goes in table by table, claims first:
/// the dump sends every claim before any disbursement or outbox row, so every row that names a
/// claim reaches the database after that claim (the statement triggers check it).
const LOAD_BATCH_ROWS: usize = 10_000;

impl PgLedger {
    /// Loads what `dump` sends into this ledger, which must be empty (otherwise
    /// [`Error::Config`], nothing written). All or nothing: one transaction.
    pub fn load(&self, dump: &mut dyn FnMut(&mut Sink<'_>) -> Result<Counters>) -> Result<()> {
        let mut conn = self.conn()?;
        let mut tx = conn.client.transaction()?;
        tx.query_one("SELECT 1 FROM chain_head WHERE id = 1 FOR UPDATE", &[])?;
        let rows: i64 = tx
            .query_one(
                "SELECT (SELECT COUNT(*) FROM processed_messages) + (SELECT COUNT(*) FROM outbox_rows)
                      + (SELECT COUNT(*) FROM dead_letters) + (SELECT COUNT(*) FROM audit_chain)
                      + (SELECT COUNT(*) FROM audit_batches) + (SELECT COUNT(*) FROM audit_members)
                      + (SELECT COUNT(*) FROM legal_holds)
                      + (SELECT COUNT(*) FROM ledger_meta WHERE name <> 'format_version')
                      + (SELECT COUNT(*) FROM claim_tombstones)
                      + (SELECT COUNT(*) FROM outbox_published)
                      + (SELECT seq FROM chain_head WHERE id = 1)",
                &[],
            )?
            .get(0);
        if rows > 0 {
            return Err(Error::Config(format!(
                "the target ledger {} is not empty; migrate copies into an empty PostgreSQL \
                 ledger only (a fresh database)",
                self.redacted
            )));
        }
        let mut buf: Vec<Row> = Vec::with_capacity(LOAD_BATCH_ROWS);
        let counters = {
            let mut sink = |row: Row| -> Result<()> {
                buf.push(row);
                if buf.len() >= LOAD_BATCH_ROWS {
                    flush(&mut tx, &mut buf)?;
                }
                Ok(())
            };
            dump(&mut sink)?
        };
        flush(&mut tx, &mut buf)?;
        continue_after(&mut tx, counters)?;
        // The ledger's counts (`chain_head`), from what was copied, in this transaction: one
        // pass over each table, as the copy was.
        tx.execute("SELECT claimgate_recount()", &[])?;
        tx.commit()?;
        // Statistics for what was just copied, as after any bulk load (`pg_restore`'s advice):
        // until autovacuum came round, the planner took the tables for empty, or for any size,
        // and a stock server planned the first reads of a 10M ledger as parallel, JIT-compiled
        // scans (`status --json` 70 ms instead of 10: 21 ms of JIT and a parallel gather to
        // count no unpublished rows). A role that does not own a table gets a warning, not an
        // error, and the copy is committed either way.
        conn.client
            .batch_execute(&format!("ANALYZE {}", ANALYZED.join(", ")))?;
        Ok(())
    }
}

/// The tables `migrate` fills, analysed after the copy.
const ANALYZED: [&str; 9] = [
    "processed_messages",
    "disbursements",
    "outbox_rows",
    "dead_letters",
    "claim_tombstones",
    "legal_holds",
    "audit_chain",
    "audit_batches",
    "audit_members",
];

/// Writes the buffered rows: claims, disbursements, outbox rows and audit records (nearly all
/// of a ledger) by binary COPY, one per table per buffer, claims first; the rest (dead letters,
/// tombstones, holds, facts) one prepared INSERT each. Row by row, every disbursement and
/// outbox row ran its table's statement trigger once: a ledger of 1,000,000 claims took
/// 13 min 50 s to migrate (BENCHMARKS.md).
fn flush(tx: &mut postgres::Transaction<'_>, buf: &mut Vec<Row>) -> Result<()> {
    use postgres::types::Type;
    copy_in(
        tx,
        "COPY processed_messages (claim_id, idempotency_key, award_id, submission_timestamp,
             amount_cents, claimed_at, stream_entry_id, consumer, submission_instant)
         FROM STDIN (FORMAT binary)",
        &[
            Type::INT8,
            Type::BYTEA,
            Type::TEXT,
            Type::TEXT,
            Type::INT8,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
        ],
        buf,
        |w, row| match row {
            Row::Claim {
                claim_id,
                key,
                award_id,
                submission_timestamp,
                amount_cents,
                claimed_at,
                stream_entry_id,
                consumer,
                submission_instant,
            } => w.write(&[
                claim_id,
                &key.as_bytes().as_slice(),
                award_id,
                submission_timestamp,
                amount_cents,
                claimed_at,
                stream_entry_id,
                consumer,
                submission_instant,
            ]),
            _ => Ok(()),
        },
    )?;
    copy_in(
        tx,
        "COPY disbursements (id, claim_id, idempotency_key, award_id, amount_cents, recorded_at)
         FROM STDIN (FORMAT binary)",
        &[
            Type::INT8,
            Type::INT8,
            Type::BYTEA,
            Type::TEXT,
            Type::INT8,
            Type::TEXT,
        ],
        buf,
        |w, row| match row {
            Row::Disbursement {
                id,
                claim_id,
                key,
                award_id,
                amount_cents,
                recorded_at,
            } => w.write(&[
                id,
                claim_id,
                &key.as_bytes().as_slice(),
                award_id,
                amount_cents,
                recorded_at,
            ]),
            _ => Ok(()),
        },
    )?;
    copy_in(
        tx,
        "COPY outbox_rows (id, claim_id, event_type, payload, created_at, published_at)
         FROM STDIN (FORMAT binary)",
        &[
            Type::INT8,
            Type::INT8,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
        ],
        buf,
        |w, row| match row {
            // An event its claim spells is not stored: the view and the relay spell it
            // (`claimgate_event`), as for the rows a batch writes.
            Row::Outbox {
                id,
                claim_id,
                event_type,
                payload,
                spelled_by_claim,
                created_at,
                published_at,
            } => {
                let (event_type, payload) = if *spelled_by_claim {
                    (None, None)
                } else {
                    (Some(event_type), Some(payload))
                };
                w.write(&[
                    id,
                    claim_id,
                    &event_type,
                    &payload,
                    created_at,
                    published_at,
                ])
            }
            _ => Ok(()),
        },
    )?;
    copy_in(
        tx,
        &format!(
            "COPY audit_chain ({}) FROM STDIN (FORMAT binary)",
            super::audit_store::COLUMNS
        ),
        &super::audit_store::COLUMN_TYPES,
        buf,
        |w, row| match row {
            Row::Audit(r) => {
                let stored = super::audit_store::Stored::of(r)?;
                w.write(&super::audit_store::params(r, &stored, &r.kind.as_str()))?;
                Ok::<(), crate::error::Error>(())
            }
            _ => Ok(()),
        },
    )?;
    for row in buf.drain(..) {
        match row {
            Row::DeadLetter {
                stream,
                stream_entry_id,
                reason_code,
                reason,
                award_id,
                delivery_count,
                recorded_at,
                decision: [decision, decided_by, decided_reason, decided_at],
            } => tx.execute(
                "INSERT INTO dead_letters (stream, stream_entry_id, reason_code, reason,
                     award_id, delivery_count, recorded_at, decision, decided_by, decided_reason,
                     decided_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[
                    &stream,
                    &stream_entry_id,
                    &reason_code,
                    &reason,
                    &award_id,
                    &delivery_count,
                    &recorded_at,
                    &decision,
                    &decided_by,
                    &decided_reason,
                    &decided_at,
                ],
            )?,
            Row::Tombstone {
                key,
                claimed_at,
                purged_at,
            } => tx.execute(
                "INSERT INTO claim_tombstones (idempotency_key, claimed_at, purged_at)
                 VALUES ($1, $2, $3)",
                &[&key.as_bytes().as_slice(), &claimed_at, &purged_at],
            )?,
            Row::Hold(h) => tx.execute(
                "INSERT INTO legal_holds (award_id, reason, held_at) VALUES ($1, $2, $3)",
                &[&h.award_id, &h.reason, &h.held_at],
            )?,
            // The target's own format, not the source's.
            Row::Meta { name, .. } if name == "format_version" => 0,
            Row::Meta { name, value } => tx.execute(
                "INSERT INTO ledger_meta (name, value) VALUES ($1, $2)",
                &[&name, &value],
            )?,
            // Written by COPY above.
            Row::Claim { .. } | Row::Disbursement { .. } | Row::Outbox { .. } | Row::Audit(_) => 0,
        };
    }
    Ok(())
}

/// One binary COPY (`sql`, columns of `types`) of the rows of `buf` that `write` writes; it
/// passes over the rows of other tables (a COPY of no rows is one round trip).
fn copy_in<E>(
    tx: &mut postgres::Transaction<'_>,
    sql: &str,
    types: &[postgres::types::Type],
    buf: &[Row],
    write: impl Fn(&mut BinaryCopyInWriter<'_>, &Row) -> std::result::Result<(), E>,
) -> Result<()>
where
    crate::error::Error: From<E>,
{
    let mut w = BinaryCopyInWriter::new(tx.copy_in(sql)?, types);
    for row in buf {
        write(&mut w, row)?;
    }
    w.finish()?;
    Ok(())
}

/// Points the chain head at the copied chain's end (a checkpoint there is transparent, as on
/// SQLite) and past the highest outbox id ever used; moves the identity sequences past the
/// copied ids; records the rows copied as published as one publication (the relay goes on
/// from there: `outbox.rs`).
fn continue_after(tx: &mut postgres::Transaction<'_>, counters: Counters) -> Result<()> {
    let last = tx.query_opt(
        "SELECT seq, kind, prev_hash, hash FROM audit_chain ORDER BY seq DESC LIMIT 1",
        &[],
    )?;
    let (seq, hash) = match last {
        None => (0, GENESIS_HASH.to_owned()),
        Some(r) => {
            let kind: String = r.get(1);
            let hash = if kind == Kind::Checkpoint.as_str() {
                r.get(2)
            } else {
                r.get(3)
            };
            (r.get::<_, i64>(0), super::audit_store::hex_of(hash)?)
        }
    };
    tx.execute(
        "UPDATE chain_head SET seq = $1, hash = $2, outbox_id_last = $3 WHERE id = 1",
        &[&seq, &hash, &counters.outbox_id_last],
    )?;
    tx.batch_execute(
        "SELECT setval(pg_get_serial_sequence('processed_messages', 'claim_id'),
                       GREATEST(MAX(claim_id), 1), MAX(claim_id) IS NOT NULL)
         FROM processed_messages;
         SELECT setval(pg_get_serial_sequence('disbursements', 'id'),
                       GREATEST(MAX(id), 1), MAX(id) IS NOT NULL)
         FROM disbursements;
         SELECT claimgate_note_published();",
    )?;
    Ok(())
}
