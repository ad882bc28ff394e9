//! An audit record read back from its row, the same on every backend: which column holds
//! which field, and what a `kind` no record can have means. Each backend reads its own rows
//! and answers [`Columns`] for them, so SQLite and PostgreSQL build a [`Record`] and name an
//! edited kind in the same words.
//!
//! Invariant: this module only reads what it is handed.

use crate::domain::audit::{Kind, Record};
use crate::error::{Error, Result};

/// One row of a backend, read column by column (0-based), each value as the type asked for.
pub trait Columns {
    /// An integer column.
    fn int(&self, i: usize) -> Result<i64>;
    /// An integer column that may be NULL.
    fn opt_int(&self, i: usize) -> Result<Option<i64>>;
    /// A text column.
    fn text(&self, i: usize) -> Result<String>;
    /// A text column that may be NULL.
    fn opt_text(&self, i: usize) -> Result<Option<String>>;
    /// A digest column (`prev_hash`, `hash`) as its hex: a text column, unless the backend
    /// stores digests another way (SQLite's raw bytes, `sqlite/derived.rs`).
    fn digest(&self, i: usize) -> Result<String> {
        self.text(i)
    }
    /// A record's key column (`idempotency_key`), NULL where the record has none, as its hex:
    /// a text column, unless the backend stores keys another way (SQLite's raw bytes).
    fn opt_key(&self, i: usize) -> Result<Option<String>> {
        self.opt_text(i)
    }
}

/// Implements [`Columns`] for a backend's row type `$row` through its own typed getter
/// `$get` (`row.$get::<_, T>(i)`), whose error converts into [`crate::Error`]: the same four
/// answers on every backend, written once. Items in braces after it (a backend's own
/// `digest`) go into the same `impl`.
macro_rules! columns_by {
    ($row:ty, $get:ident) => {
        $crate::ledger::records::columns_by!($row, $get, {});
    };
    ($row:ty, $get:ident, { $($own:item)* }) => {
        impl $crate::ledger::records::Columns for $row {
            $($own)*

            fn int(&self, i: usize) -> $crate::error::Result<i64> {
                Ok(self.$get(i)?)
            }

            fn opt_int(&self, i: usize) -> $crate::error::Result<Option<i64>> {
                Ok(self.$get(i)?)
            }

            fn text(&self, i: usize) -> $crate::error::Result<String> {
                Ok(self.$get(i)?)
            }

            fn opt_text(&self, i: usize) -> $crate::error::Result<Option<String>> {
                Ok(self.$get(i)?)
            }
        }
    };
}
pub(crate) use columns_by;

/// The record at `seq` whose `kind` stands in column `kind_at` of `row`, followed by the
/// ten columns after `kind` in [`Record`] order (`idempotency_key` … `hash`), with no
/// `batch_index` (a batch member's caller sets its own). A `kind` no record can have, and a
/// column that does not read as what claimgate writes there (a key or digest of 31 bytes, a
/// number where text belongs), are [`Error::Invariant`] naming the record: the row was edited.
pub fn record(row: &impl Columns, seq: i64, kind_at: usize) -> Result<Record> {
    // The row is already fetched, so a failure here is its value's type, never the connection.
    let edited = |column: &'static str| {
        move |e: Error| {
            Error::Invariant(format!(
                "audit record seq {seq}: its {column} does not read as claimgate writes it:                  {e} (edited)"
            ))
        }
    };
    let kind = row.text(kind_at).map_err(edited("kind"))?;
    let kind = Kind::parse(&kind).ok_or_else(|| {
        Error::Invariant(format!(
            "audit record seq {seq}: unknown kind {kind:?} (edited)"
        ))
    })?;
    let at = |n: usize| kind_at + n;
    Ok(Record {
        seq,
        kind,
        idempotency_key: row.opt_key(at(1)).map_err(edited("idempotency_key"))?,
        award_id: row.opt_text(at(2)).map_err(edited("award_id"))?,
        amount_cents: row.opt_int(at(3)).map_err(edited("amount_cents"))?,
        stream_entry_id: row.opt_text(at(4)).map_err(edited("stream_entry_id"))?,
        consumer: row.opt_text(at(5)).map_err(edited("consumer"))?,
        delivery_count: row.opt_int(at(6)).map_err(edited("delivery_count"))?,
        detail: row.opt_text(at(7)).map_err(edited("detail"))?,
        recorded_at: row.text(at(8)).map_err(edited("recorded_at"))?,
        prev_hash: row.digest(at(9)).map_err(edited("prev_hash"))?,
        hash: row.digest(at(10)).map_err(edited("hash"))?,
        batch_index: None,
    })
}

/// A record stored as its own row: `seq` first, then `kind` and the rest in [`Record`] order
/// (the columns of `audit_log` on SQLite and `audit_chain` on PostgreSQL).
pub fn sealed_row(row: &impl Columns) -> Result<Record> {
    record(row, row.int(0)?, 1)
}
