//! How SQLite's and the connection pool's errors become [`Error::Ledger`], each carrying this
//! backend's answer to "whom does this failure concern?" ([`Fault`]). With these, `?` works on
//! rusqlite and r2d2 results throughout the SQLite code, and `crate::error` names neither.
//!
//! | SQLite result code | [`Fault`] | why |
//! | --- | --- | --- |
//! | `BUSY`, `LOCKED` | transient | another connection or process holds the lock |
//! | `FULL` | transient | the disk or `--ledger-pages-max` is full; room can be made |
//! | `NOMEM`, `CANTOPEN` | transient | memory; a file briefly unopenable (a restore's swap) |
//! | `CONSTRAINT`, `TOOBIG`, `MISMATCH`, `RANGE` | entry | the values one entry brought |
//! | everything else: `READONLY`, `IOERR`, `CORRUPT`, `NOTADB`, `PERM`, `AUTH`, `ERROR` (a table or column gone), `SCHEMA`, … | ledger | the file or its schema, not any entry |
//!
//! A rusqlite error that is not SQLite's own (a column of an unexpected type, a conversion) is
//! the ledger's too: the rows are not what claimgate wrote, which no entry explains.

use crate::error::{Error, Fault};

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        let fault = fault(&e);
        Error::ledger(e, fault)
    }
}

impl From<r2d2::Error> for Error {
    /// No pooled connection became free in time: other work holds them all, or the file
    /// cannot be opened just now. Both clear by themselves.
    fn from(e: r2d2::Error) -> Self {
        Error::Ledger {
            context: "ledger connection pool",
            source: Box::new(e),
            fault: Fault::Transient,
        }
    }
}

/// Whom a SQLite error concerns (the table at the top of this file).
pub(super) fn fault(e: &rusqlite::Error) -> Fault {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::DiskFull
            | ErrorCode::OutOfMemory
            | ErrorCode::CannotOpen,
        ) => Fault::Transient,
        Some(
            ErrorCode::ConstraintViolation
            | ErrorCode::TooBig
            | ErrorCode::TypeMismatch
            | ErrorCode::ParameterOutOfRange,
        ) => Fault::Entry,
        _ => Fault::Ledger,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;

    fn code(extended: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(extended), None)
    }

    #[test]
    fn a_damaged_read_only_or_unreadable_ledger_is_never_an_entrys_fault() {
        for (name, c) in [
            ("READONLY", ffi::SQLITE_READONLY),
            ("IOERR", ffi::SQLITE_IOERR),
            ("IOERR_FSYNC", ffi::SQLITE_IOERR_FSYNC),
            ("CORRUPT", ffi::SQLITE_CORRUPT),
            ("NOTADB", ffi::SQLITE_NOTADB),
            ("PERM", ffi::SQLITE_PERM),
            ("ERROR", ffi::SQLITE_ERROR),
        ] {
            let e = Error::from(code(c));
            assert!(e.is_ledger_outage(), "{name}: {e}");
            assert!(!e.blames_entry() && !e.is_transient(), "{name}");
        }
    }

    #[test]
    fn only_what_one_entry_brought_is_the_entrys_fault() {
        for c in [
            ffi::SQLITE_CONSTRAINT_UNIQUE,
            ffi::SQLITE_CONSTRAINT_TRIGGER,
            ffi::SQLITE_TOOBIG,
            ffi::SQLITE_MISMATCH,
        ] {
            assert!(Error::from(code(c)).blames_entry(), "{c}");
        }
        for c in [ffi::SQLITE_BUSY, ffi::SQLITE_LOCKED, ffi::SQLITE_FULL] {
            let e = Error::from(code(c));
            assert!(e.is_transient() && !e.blames_entry(), "{c}");
        }
        let conversion = Error::from(rusqlite::Error::InvalidColumnType(
            0,
            "amount_cents".into(),
            rusqlite::types::Type::Text,
        ));
        assert!(conversion.is_ledger_outage(), "{conversion}");
    }
}
