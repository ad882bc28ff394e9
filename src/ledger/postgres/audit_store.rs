//! Reading the audit log back out of PostgreSQL in chain order, one record at a time
//! ([`AuditLog`]), writing one record exactly as sealed (a purge's checkpoint, migrate), and
//! appending one record at the chain head outside a batch (legal holds).

use super::PgLedger;
use crate::domain::audit::{Kind, Record};
use crate::error::{Error, Result};
use crate::ledger::{AuditLog, Since};
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::{ToSql, Type};
use postgres::{GenericClient, Row};

/// The columns, in `Record` order.
pub(super) const COLUMNS: &str = "seq, kind, idempotency_key, award_id, amount_cents, \
     stream_entry_id, consumer, delivery_count, detail, recorded_at, prev_hash, hash";

impl AuditLog for PgLedger {
    /// One repeatable-read transaction around the whole walk: batches committing meanwhile add
    /// nothing to what `f` sees. Rows are streamed, one at a time.
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        let mut conn = self.conn()?;
        let mut tx = super::snapshot(&mut conn.client)?;
        for_each(&mut tx, since, f)
    }

    /// Through the partial index `audit_dead_letters` (`schema_postgres.sql`), streamed.
    fn for_each_dead_letter(&self, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let mut conn = self.conn()?;
        let mut tx = super::snapshot(&mut conn.client)?;
        let mut rows = tx.query_raw(
            &format!("SELECT {COLUMNS} FROM audit_log WHERE kind = 'dead_letter' ORDER BY seq"),
            std::iter::empty::<i64>(),
        )?;
        while let Some(row) = rows.next()? {
            f(record_of(&row)?)?;
        }
        Ok(())
    }
}

/// Calls `f` with each selected record, lowest seq first (inside the caller's transaction).
pub(super) fn for_each(
    client: &mut impl GenericClient,
    since: &Since,
    f: &mut dyn FnMut(Record) -> Result<()>,
) -> Result<()> {
    let base = format!("SELECT {COLUMNS} FROM audit_log");
    let mut rows = match since {
        Since::All => {
            client.query_raw(&format!("{base} ORDER BY seq"), std::iter::empty::<i64>())?
        }
        Since::Seq(n) => client.query_raw(&format!("{base} WHERE seq >= $1 ORDER BY seq"), [*n])?,
        Since::Time(t) => client.query_raw(
            &format!("{base} WHERE recorded_at >= $1 ORDER BY seq"),
            [t.as_str()],
        )?,
    };
    while let Some(row) = rows.next()? {
        f(record_of(&row)?)?;
    }
    Ok(())
}

/// Records with `seq` in `first..=last`, in order (bounded by the caller).
pub(super) fn range(client: &mut impl GenericClient, first: i64, last: i64) -> Result<Vec<Record>> {
    client
        .query(
            &format!("SELECT {COLUMNS} FROM audit_log WHERE seq BETWEEN $1 AND $2 ORDER BY seq"),
            &[&first, &last],
        )?
        .iter()
        .map(record_of)
        .collect()
}

/// Appends `r` to the chain inside the caller's transaction, exactly as a batch appends its
/// records (`batch.rs`, step 5): locks the chain head row (`SELECT … FOR UPDATE`, held until
/// the caller commits), seals `r` at the next `seq` after the head's hash, inserts it and
/// advances the head. The head is the last lock every writer takes, so the caller must have
/// made its other changes already and commit right after; concurrent batches then wait for
/// this commit and continue the chain after `r`. Returns the sealed record.
pub(super) fn append(tx: &mut postgres::Transaction<'_>, mut r: Record) -> Result<Record> {
    let head = tx.query_one(
        "SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE",
        &[],
    )?;
    let (seq, hash): (i64, String) = (head.get(0), head.get(1));
    r.seq = seq + 1;
    r.seal(&hash);
    insert(tx, &r)?;
    tx.execute(
        "UPDATE chain_head SET seq = $1, hash = $2 WHERE id = 1",
        &[&r.seq, &r.hash],
    )?;
    Ok(r)
}

/// Inserts a record exactly as given (seq included).
pub(super) fn insert(client: &mut impl GenericClient, r: &Record) -> Result<()> {
    client.execute(
        &format!(
            "INSERT INTO audit_log ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ),
        &params(r, &r.kind.as_str()),
    )?;
    Ok(())
}

/// A record's values in [`COLUMNS`] order, for an INSERT or a binary COPY; `kind` is
/// `r.kind.as_str()`, passed in so the caller's binding outlives the array.
pub(super) fn params<'a>(r: &'a Record, kind: &'a &'static str) -> [&'a (dyn ToSql + Sync); 12] {
    [
        &r.seq,
        kind,
        &r.idempotency_key,
        &r.award_id,
        &r.amount_cents,
        &r.stream_entry_id,
        &r.consumer,
        &r.delivery_count,
        &r.detail,
        &r.recorded_at,
        &r.prev_hash,
        &r.hash,
    ]
}

/// The types of [`COLUMNS`], for a binary COPY.
pub(super) const COLUMN_TYPES: [Type; 12] = [
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
];

fn record_of(row: &Row) -> Result<Record> {
    let seq: i64 = row.try_get(0)?;
    let kind: String = row.try_get(1)?;
    let kind = Kind::parse(&kind).ok_or_else(|| {
        Error::Invariant(format!(
            "audit record seq {seq}: unknown kind {kind:?} (edited)"
        ))
    })?;
    Ok(Record {
        seq,
        kind,
        idempotency_key: row.try_get(2)?,
        award_id: row.try_get(3)?,
        amount_cents: row.try_get(4)?,
        stream_entry_id: row.try_get(5)?,
        consumer: row.try_get(6)?,
        delivery_count: row.try_get(7)?,
        detail: row.try_get(8)?,
        recorded_at: row.try_get(9)?,
        prev_hash: row.try_get(10)?,
        hash: row.try_get(11)?,
        batch_index: None,
    })
}
