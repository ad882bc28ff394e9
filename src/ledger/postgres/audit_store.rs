//! Reading the audit chain back out of PostgreSQL in chain order, one record at a time
//! ([`AuditLog`]), and writing a record sealed one by one exactly as given (a purge's
//! checkpoint, migrate).
//!
//! The chain is stored in two parts (`schema_postgres.sql`): records sealed one by one in
//! `audit_chain` (those of earlier releases and of migrated ledgers, and checkpoints), and
//! batches — members in `audit_members`, each batch's link in its `audit_batches` row. Every
//! record of the first part comes before every linked batch: batches are only ever linked
//! after the head, earlier releases' records and migrated ones were there before any batch
//! (migrate loads into an empty ledger only; an upgraded ledger starts batching at its head),
//! and a checkpoint takes the seq of the last record it replaced, at the front. So a walk reads
//! the first part in seq order, then the linked batches in link order, each batch's members in
//! their order followed by its link record (at the last member's seq). Batches not linked yet
//! are not in the chain.

use crate::domain::audit::{detail, BatchLink, Kind, Record};
use crate::error::{Error, Result};
use crate::ledger::{records, sweep, Since};
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::{ToSql, Type};
use postgres::{GenericClient, Row};

/// The columns of `audit_chain`, in `Record` order.
pub(super) const COLUMNS: &str = "seq, kind, idempotency_key, award_id, amount_cents, \
     stream_entry_id, consumer, delivery_count, detail, recorded_at, prev_hash, hash";

/// The columns of `audit_members`, for a batch's COPY.
pub(super) const MEMBER_COLUMNS: &str = "batch_id, batch_index, kind, idempotency_key, \
     award_id, amount_cents, stream_entry_id, consumer, delivery_count, detail, recorded_at, \
     prev_hash, hash";

/// A linked batch's link columns, then each of its members' columns (none, for a batch whose
/// members are gone: its link is still read, and the walk names what is missing).
pub(super) const BATCH_ROWS: &str = "SELECT b.link_seq, b.batch_id, b.record_count, b.last_hash,
        b.outbox_count, b.outbox_first, b.linked_at, b.prev_hash, b.hash,
        m.batch_index, m.kind, m.idempotency_key, m.award_id, m.amount_cents,
        m.stream_entry_id, m.consumer, m.delivery_count, m.detail, m.recorded_at, m.prev_hash,
        m.hash
     FROM audit_batches b LEFT JOIN audit_members m ON m.batch_id = b.batch_id";

/// Which records a walk reads.
#[derive(Debug, Clone)]
pub(super) enum Range<'a> {
    /// As [`AuditLog::for_each_record`] is asked. By time, a batch is read whole when its link
    /// was written at or after the time (its members were written a moment before its link).
    Since(&'a Since),
    /// Records with seqs in `first..=last`, which begins and ends at the edge of a batch
    /// (a retention purge's range).
    Seqs(i64, i64),
    /// The dead-letter records only.
    DeadLetters,
}

/// Calls `f` with each record of `range`, lowest seq first (inside the caller's transaction).
pub(super) fn for_each(
    client: &mut impl GenericClient,
    range: &Range<'_>,
    f: &mut dyn FnMut(Record) -> Result<()>,
) -> Result<()> {
    let base = format!("SELECT {COLUMNS} FROM audit_chain");
    let none = std::iter::empty::<i64>();
    let mut rows = match range {
        Range::Since(Since::All) => client.query_raw(&format!("{base} ORDER BY seq"), none)?,
        Range::Since(Since::Seq(n)) => {
            client.query_raw(&format!("{base} WHERE seq >= $1 ORDER BY seq"), [*n])?
        }
        Range::Since(Since::Time(t)) => client.query_raw(
            &format!("{base} WHERE recorded_at >= $1 ORDER BY seq"),
            [t.as_str()],
        )?,
        Range::Seqs(first, last) => client.query_raw(
            &format!("{base} WHERE seq BETWEEN $1 AND $2 ORDER BY seq"),
            [*first, *last],
        )?,
        Range::DeadLetters => client.query_raw(
            &format!("{base} WHERE kind = 'dead_letter' ORDER BY seq"),
            none,
        )?,
    };
    while let Some(row) = rows.next()? {
        f(record_of(&row)?)?;
    }
    drop(rows);
    for_each_batched(client, range, f)
}

/// The linked batches' part of a walk.
pub(super) fn for_each_batched(
    client: &mut impl GenericClient,
    range: &Range<'_>,
    f: &mut dyn FnMut(Record) -> Result<()>,
) -> Result<()> {
    let order = "ORDER BY b.link_seq, m.batch_index";
    let linked = "b.link_seq IS NOT NULL";
    let none = std::iter::empty::<i64>();
    let mut from_seq = i64::MIN;
    let mut rows = match range {
        Range::Since(Since::All) => {
            client.query_raw(&format!("{BATCH_ROWS} WHERE {linked} {order}"), none)?
        }
        Range::Since(Since::Seq(n)) => {
            from_seq = *n;
            client.query_raw(
                &format!("{BATCH_ROWS} WHERE {linked} AND b.link_seq >= $1 {order}"),
                [*n],
            )?
        }
        Range::Since(Since::Time(t)) => client.query_raw(
            &format!("{BATCH_ROWS} WHERE {linked} AND b.linked_at >= $1 {order}"),
            [t.as_str()],
        )?,
        Range::Seqs(first, last) => client.query_raw(
            &format!("{BATCH_ROWS} WHERE b.link_seq BETWEEN $1 AND $2 {order}"),
            [*first, *last],
        )?,
        Range::DeadLetters => client.query_raw(
            "SELECT b.link_seq, b.batch_id, b.record_count, b.last_hash, b.outbox_count,
                    b.outbox_first, b.linked_at, b.prev_hash, b.hash,
                    m.batch_index, m.kind, m.idempotency_key, m.award_id, m.amount_cents,
                    m.stream_entry_id, m.consumer, m.delivery_count, m.detail, m.recorded_at,
                    m.prev_hash, m.hash
             FROM audit_members m JOIN audit_batches b ON b.batch_id = m.batch_id
             WHERE m.kind = 'dead_letter' AND b.link_seq IS NOT NULL
             ORDER BY b.link_seq, m.batch_index",
            none,
        )?,
    };
    let links = !matches!(range, Range::DeadLetters);
    let mut pending: Option<Record> = None;
    while let Some(row) = rows.next()? {
        // Every row of a batch repeats its link's columns: the link is built once, at the
        // batch's first row (building it per row was five strings and a formatted detail per
        // member, a tenth of `verify`'s chain walk).
        let link_seq: i64 = row.try_get(0)?;
        if pending.as_ref().is_some_and(|p| p.seq != link_seq) {
            f(pending.take().expect("checked"))?;
        }
        if let Some(member) = member_of(&row, link_seq)? {
            if member.seq >= from_seq {
                f(member)?;
            }
        }
        if links && pending.is_none() {
            pending = Some(link_of(&row)?);
        }
    }
    match pending {
        Some(link) => f(link),
        None => Ok(()),
    }
}

/// A linked batch's link record, from the first columns of a [`BATCH_ROWS`] row.
pub(super) fn link_of(row: &Row) -> Result<Record> {
    let seq: i64 = row.try_get(0)?;
    let link = BatchLink {
        batch_id: row.try_get(1)?,
        records: row.try_get::<_, i32>(2)?.into(),
        last_hash: row.try_get(3)?,
        outbox_rows: row.try_get::<_, i32>(4)?.into(),
        outbox_first: row.try_get(5)?,
    };
    Ok(Record {
        seq,
        detail: Some(detail::batch_link(&link)),
        prev_hash: row.try_get(7)?,
        hash: row.try_get(8)?,
        ..Record::unsealed(Kind::Batch, &row.try_get::<_, String>(6)?)
    })
}

/// The member of a [`BATCH_ROWS`] row (none for a batch without members), numbered in the
/// chain up to its link's `link_seq`, the seq of the batch's last member.
pub(super) fn member_of(row: &Row, link_seq: i64) -> Result<Option<Record>> {
    let Some(index) = row.try_get::<_, Option<i32>>(9)? else {
        return Ok(None);
    };
    let members: i32 = row.try_get(2)?;
    let seq = link_seq - i64::from(members) + i64::from(index);
    Ok(Some(Record {
        batch_index: Some(index.into()),
        ..records::record(row, seq, 10)?
    }))
}

/// Records with `seq` in `first..=last`, in order (bounded by the caller; the range begins
/// and ends at the edge of a batch).
pub(super) fn range(client: &mut impl GenericClient, first: i64, last: i64) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for_each(client, &Range::Seqs(first, last), &mut |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Inserts a record sealed one by one exactly as given (seq included) into `audit_chain`.
pub(super) fn insert(client: &mut impl GenericClient, r: &Record) -> Result<()> {
    assert!(
        r.batch_index.is_none(),
        "a batch member goes in with its batch"
    );
    client.execute(
        &format!(
            "INSERT INTO audit_chain ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ),
        &params(r, &Stored::of(r)?, &r.kind.as_str()),
    )?;
    Ok(())
}

/// A record's key and digests as stored from format 6 on (`schema_postgres.sql`): their 32
/// bytes, decoded from the lowercase hex the record carries. Read back ([`Columns`] for
/// [`Row`], below) they are that hex again, so what a record says, exports and hashes is
/// unchanged.
pub(super) struct Stored {
    key: Option<Vec<u8>>,
    prev_hash: Vec<u8>,
    hash: Vec<u8>,
}

impl Stored {
    /// `r`'s, or [`Error::Invariant`] naming the record when one is not 64 lowercase hex
    /// digits: claimgate seals none such, so only a record read from an edited ledger is
    /// (`migrate` verifies its source first, so it never gets here).
    pub(super) fn of(r: &Record) -> Result<Stored> {
        let bytes = |column: &str, hex: &str| {
            sweep::unhex_lowercase(hex)
                .map(|k| k.to_vec())
                .ok_or_else(|| {
                    Error::Invariant(format!(
                        "audit record seq {}: its {column} {hex:?} is not 64 lowercase hex \
                         digits, as claimgate writes it (edited)",
                        r.seq
                    ))
                })
        };
        Ok(Stored {
            key: match r.idempotency_key.as_deref() {
                Some(key) => Some(bytes("idempotency_key", key)?),
                None => None,
            },
            prev_hash: bytes("prev_hash", &r.prev_hash)?,
            hash: bytes("hash", &r.hash)?,
        })
    }
}

/// A record's values in [`COLUMNS`] order, for an INSERT or a binary COPY, its key and digests
/// from `stored` (`Stored::of(r)`); `kind` is `r.kind.as_str()`, passed in so the caller's
/// binding outlives the array.
pub(super) fn params<'a>(
    r: &'a Record,
    stored: &'a Stored,
    kind: &'a &'static str,
) -> [&'a (dyn ToSql + Sync); 12] {
    [
        &r.seq,
        kind,
        &stored.key,
        &r.award_id,
        &r.amount_cents,
        &r.stream_entry_id,
        &r.consumer,
        &r.delivery_count,
        &r.detail,
        &r.recorded_at,
        &stored.prev_hash,
        &stored.hash,
    ]
}

/// A member's values in [`MEMBER_COLUMNS`] order, for a binary COPY: its batch and its place
/// in it, then the record's values after `seq` ([`params`]).
pub(super) fn member_params<'a>(
    r: &'a Record,
    stored: &'a Stored,
    batch_id: &'a i64,
    index: &'a i32,
    kind: &'a &'static str,
) -> [&'a (dyn ToSql + Sync); 13] {
    let record = params(r, stored, kind);
    std::array::from_fn(|i| match i {
        0 => batch_id as &(dyn ToSql + Sync),
        1 => index,
        _ => record[i - 1],
    })
}

/// The types of [`COLUMNS`], for a binary COPY.
pub(super) const COLUMN_TYPES: [Type; 12] = [
    Type::INT8,
    Type::TEXT,
    Type::BYTEA,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::BYTEA,
    Type::BYTEA,
];

/// The types of [`MEMBER_COLUMNS`], for a binary COPY.
pub(super) const MEMBER_COLUMN_TYPES: [Type; 13] = [
    Type::INT8,
    Type::INT4,
    Type::TEXT,
    Type::BYTEA,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::BYTEA,
    Type::BYTEA,
];

pub(super) fn record_of(row: &Row) -> Result<Record> {
    records::sealed_row(row)
}

records::columns_by!(Row, try_get, {
    fn digest(&self, i: usize) -> Result<String> {
        hex_of(self.try_get(i)?)
    }

    fn opt_key(&self, i: usize) -> Result<Option<String>> {
        self.try_get::<_, Option<&[u8]>>(i)?.map(hex_of).transpose()
    }
});

/// A key or digest column's 32 bytes ([`Stored`]) as the lowercase hex a record carries; any
/// other length is not what claimgate writes (the caller names the record and the column).
pub(super) fn hex_of(bytes: &[u8]) -> Result<String> {
    if bytes.len() != 32 {
        return Err(Error::Invariant(format!(
            "{} bytes where claimgate stores 32",
            bytes.len()
        )));
    }
    Ok(crate::domain::key::to_hex(bytes))
}
