//! A ledger migrated to PostgreSQL stays behind fenced: where it went and when are in its
//! `ledger_meta`, and every command that would write to it is refused, naming the new home.

use crate::error::{Error, Result};
use rusqlite::{Connection, OptionalExtension};

/// The fence of the ledger on `conn`: where it went and when, if it was migrated.
pub(super) fn fenced(conn: &Connection) -> Result<Option<(String, String)>> {
    let to: Option<String> = conn
        .query_row(
            "SELECT value FROM ledger_meta WHERE name = 'migrated_to'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let Some(to) = to else {
        return Ok(None);
    };
    let at: Option<String> = conn
        .query_row(
            "SELECT value FROM ledger_meta WHERE name = 'migrated_at'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(Some((to, at.unwrap_or_default())))
}

/// The refusal of a fenced ledger by a command that would write to it.
pub(super) fn refuse_fenced(path: &std::path::Path, to: &str, at: &str) -> Error {
    Error::Config(format!(
        "the ledger {} was migrated to {to} at {at}: its rows live there now; point --db \
         (CLAIMGATE_DB) at that URL. This file is kept as it was, fenced, for reference \
         (status, verify and audit still read it)",
        path.display()
    ))
}
