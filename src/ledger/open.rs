//! The one open step: the `--db` value chooses the backend, and the caller gets a
//! [`Backend`] without ever naming it.
//!
//! A file path is the embedded SQLite ledger. A `postgres://` or `postgresql://` URL names a
//! PostgreSQL ledger, which this build cannot open yet: it is a configuration error (exit 2)
//! that says so, rather than a file of that name.

use super::{sqlite, Backend, Restoring};
use crate::config::LedgerConfig;
use crate::error::{Error, Result};
use std::sync::atomic::AtomicBool;

/// Which kind of ledger a `--db` value names.
enum Location {
    /// A file: the embedded SQLite ledger.
    File,
    /// A PostgreSQL URL.
    Postgres,
}

impl Location {
    fn of(cfg: &LedgerConfig) -> Location {
        let value = cfg.path.to_string_lossy();
        if ["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| value.starts_with(scheme))
        {
            Location::Postgres
        } else {
            Location::File
        }
    }
}

/// The refusal for a PostgreSQL URL. The URL itself is not repeated: it may hold a password.
fn postgres_not_built() -> Error {
    Error::Config(
        "--db names a PostgreSQL ledger (postgres://…), but the PostgreSQL ledger is not built \
         yet; give a file path for the embedded SQLite ledger"
            .into(),
    )
}

/// Opens the ledger `cfg` names (creating it if `cfg.create` and it does not exist), honouring
/// every setting in `cfg`: the conflict policy, and background housekeeping for a long-running
/// writer. A ledger that cannot be opened now fails at once; see [`open_waiting`].
pub fn open(cfg: &LedgerConfig) -> Result<Box<dyn Backend>> {
    match Location::of(cfg) {
        Location::File => Ok(Box::new(sqlite::SqliteLedger::open(cfg)?)),
        Location::Postgres => Err(postgres_not_built()),
    }
}

/// Opens the ledger like [`open`], but waits out transient failures with backoff, as a
/// long-running process (`run`, `relay`) must. Returns `None` if `stop` is set while waiting.
pub fn open_waiting(cfg: &LedgerConfig, stop: &AtomicBool) -> Result<Option<Box<dyn Backend>>> {
    match Location::of(cfg) {
        Location::File => {
            Ok(sqlite::SqliteLedger::open_waiting(cfg, stop)?
                .map(|l| Box::new(l) as Box<dyn Backend>))
        }
        Location::Postgres => Err(postgres_not_built()),
    }
}

/// Prepares `claimgate restore`: locks the ledger `cfg` names against every other claimgate
/// process and copies `backup` beside it (see [`Restoring`]). A PostgreSQL ledger is restored
/// with PostgreSQL's own tools, which this build does not drive: a configuration error.
pub fn prepare_restore(cfg: &LedgerConfig, backup: &std::path::Path) -> Result<Box<dyn Restoring>> {
    match Location::of(cfg) {
        Location::File => Ok(Box::new(sqlite::prepare_restore(&cfg.path, backup)?)),
        Location::Postgres => Err(postgres_not_built()),
    }
}
