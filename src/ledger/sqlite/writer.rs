//! The connection batches are recorded through ([`Writer`]), with what it keeps between
//! batches.

use super::settings::Settings;
use super::{conflict, raw};
use crate::error::Result;
use rusqlite::Connection;
use std::path::Path;

/// The connection batches are recorded through, with what it keeps between batches.
pub(super) struct Writer {
    /// Its statements, bound in place (`raw.rs`). Declared before `conn`, so they are
    /// finalized before it closes.
    pub(super) statements: raw::Statements,
    /// The (instant, award) groups holding a claim, so most new claims skip the conflict
    /// probe (`conflict::Groups`).
    pub(super) groups: conflict::Groups,
    /// The connection, configured like the pool's.
    pub(super) conn: Connection,
}

impl Writer {
    pub(super) fn open(path: &Path, settings: &Settings) -> Result<Self> {
        let conn = Connection::open(path)?;
        settings.apply(&conn)?;
        Ok(Writer {
            statements: raw::Statements::new(&conn),
            groups: conflict::Groups::new(Some((path.to_owned(), settings.clone()))),
            conn,
        })
    }
}
