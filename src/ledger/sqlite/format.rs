//! The ledger file's format, a number stored in it and read at every open.
//!
//! `ledger_meta.format_version` holds it, as on PostgreSQL (`postgres/schema.rs`), rather than
//! `PRAGMA user_version`: it is a row beside the file's other facts (`ledger_id`,
//! `file_epoch`, `migrated_to`), written in the same kind of transaction, seen by `sqlite3`
//! and by `migrate`'s dump like every other fact (PostgreSQL's loader keeps its own), and a
//! header field that any tool may set for its own purposes cannot be mistaken for it.
//!
//! The formats:
//! - **1**: no number stored: every ledger made by a release before the format was recorded.
//!   Its shape is looked at once, by the open that records its number (2 or 3).
//! - **2**: today's tables and columns, with the claim index an earlier release made: unique
//!   on the submission timestamp as spelled (or the key alone), beside a `claim_instant`
//!   index the upgrade added. Batches look a claim up through both (`batch.rs`).
//! - **3**: made by this release: the claim index leads with the submission instant.
//!
//! A ledger of a number above [`FORMAT_VERSION`] was made by a newer claimgate and is refused
//! (exit 2) before anything is written to it; `verify` checks the number matches the shape.

use crate::error::{Error, Result};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;

/// The newest format this build reads, and the one it makes.
pub const FORMAT_VERSION: i64 = 3;

/// The format of a ledger whose claim index an earlier release made (see the module doc).
pub(super) const FORMAT_CLAIMS_BY_SPELLING: i64 = 2;

/// The `ledger_meta` row holding the format.
const META_NAME: &str = "format_version";

/// The format stored in the ledger on `conn`; `None` when none is (format 1, or a new file).
/// A value that is not a format number is a configuration error naming the file.
pub(super) fn stored(conn: &Connection, path: &Path) -> Result<Option<i64>> {
    stored_text(conn)?
        .map(|v| {
            parse(&v).ok_or_else(|| {
                Error::Config(format!(
                    "ledger {}: its format_version is {v:?}, not a format number; left as it is",
                    path.display()
                ))
            })
        })
        .transpose()
}

/// The stored format as written, if the ledger has a `ledger_meta` holding one.
pub(super) fn stored_text(conn: &Connection) -> Result<Option<String>> {
    let has_meta: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ledger_meta')",
        [],
        |r| r.get(0),
    )?;
    if !has_meta {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT value FROM ledger_meta WHERE name = ?1",
            [META_NAME],
            |r| r.get(0),
        )
        .optional()?)
}

/// The format a stored value names: a number from 1 up, as `record` writes it.
pub(super) fn parse(value: &str) -> Option<i64> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 1 && n.to_string() == value)
}

/// Refuses (configuration error, exit 2) a ledger of a format newer than this build reads,
/// before anything is written to it.
pub(super) fn refuse_newer(conn: &Connection, path: &Path) -> Result<()> {
    match stored(conn, path)? {
        Some(v) if v > FORMAT_VERSION => Err(Error::Config(format!(
            "ledger {} is format {v}, made by a newer claimgate; this build reads formats up to \
             {FORMAT_VERSION}: upgrade claimgate (the ledger is left as it is)",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// The ledger's format after the schema and its upgrades ran: the stored one, or, for a
/// ledger that stores none (just made, or made by an earlier release), the one its claim index
/// says, stored now in a `BEGIN IMMEDIATE` transaction that looks again (two processes opening
/// one ledger record it once). A ledger that stores its format is only read.
pub(super) fn record(conn: &mut Connection, path: &Path) -> Result<i64> {
    if let Some(v) = stored(conn, path)? {
        return Ok(v);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some(v) = stored(&tx, path)? {
        return Ok(v);
    }
    let format = if super::upgrade::claims_by_spelling(&tx)? {
        FORMAT_CLAIMS_BY_SPELLING
    } else {
        FORMAT_VERSION
    };
    let claims: i64 = tx.query_row(
        "SELECT COUNT(*) FROM (SELECT 1 FROM processed_messages LIMIT 1)",
        [],
        |r| r.get(0),
    )?;
    tx.execute(
        "INSERT INTO ledger_meta (name, value) VALUES (?1, ?2)",
        rusqlite::params![META_NAME, format.to_string()],
    )?;
    tx.commit()?;
    if claims > 0 {
        log::info!("upgraded the ledger: recorded its format, {format}");
    }
    Ok(format)
}
