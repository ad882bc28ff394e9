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
//! - **3**: the claim index leads with the submission instant.
//! - **4**: the ledger keeps its counts (`ledger_counts`, `counts.rs`), which every write moves
//!   in its own transaction. Its claim index is either of the above; the schema says which
//!   (`upgrade::claims_by_spelling`). A ledger of format 1, 2 or 3 becomes format 4 or later at
//!   its first open by a release that knows 4, which counts its rows once (about a second per
//!   million claims) in the transaction that records the number, so no batch commits between.
//!   An older release refuses it: it would write rows without counting them.
//! - **5**: made or opened by this release: new audit records store `prev_hash` and `hash` as
//!   32 raw bytes, and where the tables' declarations allow it (a ledger this release made)
//!   disbursements store no time and published outbox rows no event, both their claim's
//!   (`derived.rs`).
//!   Rows written before stay as they were, and every reader takes both forms, so a ledger of
//!   format 4 becomes format 5 at its first open by recording the number alone: nothing is
//!   rewritten or counted again. An older release refuses it: it would read a raw digest as
//!   text, and publish a published row again (after a loss of the events stream) with no
//!   payload.
//! - **6**: new audit records store their `idempotency_key` as 32 raw bytes too, as the claim
//!   does (`derived.rs`). As with 5, records written before stay as they were, every reader
//!   takes both forms, and a ledger of format 4 or 5 becomes format 6 at its first open by
//!   recording the number alone. An older release refuses it: it would read a raw key as text.
//!
//! A ledger of a number above [`FORMAT_VERSION`] was made by a newer claimgate and is refused
//! (exit 2) before anything is written to it; `verify` checks the number matches the shape.

use super::counts;
use crate::error::{Error, Result};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;
use std::time::Instant;

/// The newest format this build reads, and the one it makes.
pub const FORMAT_VERSION: i64 = 6;

/// The first format whose ledgers keep their counts: from it on, a new number is recorded
/// without counting the rows again.
const COUNTS_KEPT_SINCE: i64 = 4;

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

/// Brings the ledger to [`FORMAT_VERSION`] after the schema and its upgrades ran: a ledger that
/// stores it and has its counts row is only read; any other (just made, made by an earlier
/// release, or its counts row deleted) gets the row, counted from the rows (replacing any row a
/// ledger of an earlier format holds), and the number, in one `BEGIN IMMEDIATE` transaction
/// that looks again (two processes opening one ledger do this once).
pub(super) fn record(conn: &mut Connection, path: &Path) -> Result<i64> {
    if stored(conn, path)? == Some(FORMAT_VERSION) && counts::read(conn)?.is_some() {
        return Ok(FORMAT_VERSION);
    }
    let started = Instant::now();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let before = stored(&tx, path)?;
    if before.is_none_or(|v| v < COUNTS_KEPT_SINCE) {
        // A release before format 4 wrote rows without counting them: whatever counts row such
        // a ledger holds (a format set back by hand, then written by that release) is stale.
        tx.execute("DELETE FROM ledger_counts", [])?;
    }
    let installed = counts::install(&tx)?;
    if before != Some(FORMAT_VERSION) {
        tx.execute(
            "INSERT INTO ledger_meta (name, value) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            rusqlite::params![META_NAME, FORMAT_VERSION.to_string()],
        )?;
    }
    tx.commit()?;
    let Some(c) = installed else {
        if let Some(v) = before.filter(|v| *v != FORMAT_VERSION) {
            log::info!(
                "upgraded ledger {} from format {v} to {FORMAT_VERSION}: rows already written \
                 stay as they are; new rows are written in format {FORMAT_VERSION}",
                path.display()
            );
        }
        return Ok(FORMAT_VERSION);
    };
    let counted = format!(
        "{} claims, {} audit records, {} dead letters in {:.1}s",
        c.claims,
        c.audit_records,
        c.dead_letters,
        started.elapsed().as_secs_f64()
    );
    match before {
        Some(FORMAT_VERSION) => log::warn!(
            "ledger {}: its counts row was missing (deleted by hand?); counted the rows again: \
             {counted}",
            path.display()
        ),
        // A file just made has nothing to tell.
        None if c.claims == 0 && c.audit_records == 0 => {}
        _ => log::info!(
            "upgraded ledger {} from format {} to {FORMAT_VERSION} (counts kept): counted {counted}",
            path.display(),
            before.unwrap_or(1)
        ),
    }
    Ok(FORMAT_VERSION)
}
