//! Reading the audit log back out of SQLite, in chain order, one record at a time
//! ([`AuditLog`]), and writing records exactly as sealed.
//!
//! `all` and `insert` are public for tests and the benchmark, which build and inspect ledger
//! files directly.

use super::derived::Digest;
use crate::domain::audit::Record;
use crate::error::Result;
use crate::ledger::records;
pub use crate::ledger::Since;
use rusqlite::{Connection, Row};

/// The columns, in `Record` order (a macro, so statements can be built with `concat!`).
macro_rules! columns {
    () => {
        "seq, kind, idempotency_key, award_id, amount_cents, stream_entry_id, consumer, \
         delivery_count, detail, recorded_at, prev_hash, hash"
    };
}
pub(super) const COLUMNS: &str = columns!();

/// The `dead_letter` records in chain order. Its `WHERE` is exactly the partial index's, so
/// SQLite reads that index (public so a test can ask SQLite for the plan).
pub const DEAD_LETTER_RECORDS: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM audit_log WHERE kind = 'dead_letter' ORDER BY seq"
);

/// Calls `f` with each selected record, lowest seq first. Call inside a read transaction for a
/// consistent snapshot. A `kind` no record can have is reported as an invariant violation.
pub fn for_each(
    conn: &Connection,
    since: &Since,
    mut f: impl FnMut(Record) -> Result<()>,
) -> Result<()> {
    let (filter, arg) = match since {
        Since::All => ("seq >= ?1", rusqlite::types::Value::Integer(i64::MIN)),
        Since::Seq(n) => ("seq >= ?1", rusqlite::types::Value::Integer(*n)),
        Since::Time(t) => ("recorded_at >= ?1", rusqlite::types::Value::Text(t.clone())),
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM audit_log WHERE {filter} ORDER BY seq"
    ))?;
    let mut rows = stmt.query([arg])?;
    while let Some(row) = rows.next()? {
        f(record_of(row)?)?;
    }
    Ok(())
}

/// Every record, in chain order. For small ledgers (the demo, tests); large ones use
/// [`for_each`], which holds one record at a time.
pub fn all(conn: &Connection) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for_each(conn, &Since::All, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Records with `seq` in `first..=last`, in order (bounded by the caller).
pub fn range(conn: &Connection, first: i64, last: i64) -> Result<Vec<Record>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM audit_log WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq"
    ))?;
    let mut rows = stmt.query([first, last])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(record_of(row)?);
    }
    Ok(out)
}

/// Inserts a record exactly as given (seq included).
pub fn insert(conn: &Connection, r: &Record) -> Result<()> {
    conn.prepare_cached(concat!(
        "INSERT INTO audit_log (",
        columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))?
    .execute(rusqlite::params![
        r.seq,
        r.kind.as_str(),
        r.idempotency_key.as_deref().map(Digest),
        r.award_id,
        r.amount_cents,
        r.stream_entry_id,
        r.consumer,
        r.delivery_count,
        r.detail,
        r.recorded_at,
        Digest(&r.prev_hash),
        Digest(&r.hash)
    ])?;
    Ok(())
}

/// Seals `r` after the chain's current tail and inserts it, inside the caller's write
/// transaction (which must hold the write lock, so no batch can take the same `seq`): for the
/// records written outside a batch — holds, a restore. Returns the record as sealed; the
/// caller moves the ledger's counts by it in the same transaction (`counts.rs`).
pub(super) fn append(conn: &Connection, mut r: Record) -> Result<Record> {
    let (seq, prev_hash) = tail(conn)?;
    assert!(
        seq >= 0,
        "the chain's tail has seq {seq}, below the first record's"
    );
    r.seq = seq + 1;
    r.seal(&prev_hash);
    insert(conn, &r)?;
    Ok(r)
}

/// The chain's tail: the last record's seq and the hash the next record links to; (0, the
/// genesis hash) for an empty chain. Read inside the writer's transaction.
pub(super) fn tail(conn: &Connection) -> Result<(i64, String)> {
    use rusqlite::OptionalExtension;
    Ok(conn
        // A checkpoint is transparent: what follows it links to the hash it continues from.
        .query_row(
            "SELECT seq, CASE kind WHEN 'checkpoint' THEN prev_hash ELSE hash END
             FROM audit_log ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, super::derived::digest_hex(row.get_ref(1)?)?)),
        )
        .optional()?
        .unwrap_or((0, crate::domain::audit::GENESIS_HASH.to_owned())))
}

/// Inserts records exactly as given, many per statement, through the writer's statements (a
/// batch's records, in chain order).
pub(super) fn insert_many(st: &mut super::raw::Statements, records: &[Record]) -> Result<()> {
    // Contract point 4: a batch's records take consecutive seqs, one after another.
    for pair in records.windows(2) {
        assert_eq!(
            pair[1].seq,
            pair[0].seq + 1,
            "a batch's audit records must take consecutive seqs"
        );
    }
    super::multirow::insert(
        st,
        concat!("INSERT INTO audit_log (", columns!(), ")"),
        12,
        records,
        |b, r| {
            b.int(r.seq)?;
            b.text(r.kind.as_str())?;
            b.opt_digest(r.idempotency_key.as_deref())?;
            b.opt_text(r.award_id.as_deref())?;
            b.opt_int(r.amount_cents)?;
            b.opt_text(r.stream_entry_id.as_deref())?;
            b.opt_text(r.consumer.as_deref())?;
            b.opt_int(r.delivery_count)?;
            b.opt_text(r.detail.as_deref())?;
            b.text(&r.recorded_at)?;
            b.digest(&r.prev_hash)?;
            b.digest(&r.hash)
        },
    )
}

pub(super) fn record_of(row: &Row<'_>) -> Result<Record> {
    records::sealed_row(row)
}

records::columns_by!(Row<'_>, get, {
    fn digest(&self, i: usize) -> Result<String> {
        Ok(super::derived::digest_hex(self.get_ref(i)?)?)
    }

    fn opt_key(&self, i: usize) -> Result<Option<String>> {
        Ok(super::derived::key_hex(self.get_ref(i)?)?)
    }
});
