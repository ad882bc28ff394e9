//! How SQLite's and the connection pool's errors become [`Error::Ledger`], each carrying this
//! backend's answer to "can a later attempt succeed?". With these, `?` works on rusqlite and
//! r2d2 results throughout the SQLite code, and `crate::error` names neither.

use crate::error::Error;

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        let transient = is_transient(&e);
        Error::ledger(e, transient)
    }
}

impl From<r2d2::Error> for Error {
    /// No pooled connection became free in time: other work holds them all, or the file
    /// cannot be opened just now. Both clear by themselves.
    fn from(e: r2d2::Error) -> Self {
        Error::Ledger {
            context: "ledger connection pool",
            source: Box::new(e),
            transient: true,
        }
    }
}

/// SQLite errors that a later attempt can get past: another writer, a full disk, an I/O hiccup.
pub(super) fn is_transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::OutOfMemory
                | ErrorCode::CannotOpen,
        )
    )
}
