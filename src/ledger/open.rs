//! The one open step: the ledger's settings choose the backend, and the caller gets a
//! [`Backend`] without ever naming it.
//!
//! Which backend is decided before this, once, where `--db` is read
//! (`config::LedgerLocation::parse`): a file is the embedded SQLite ledger, a `postgres://` or
//! `postgresql://` URL the shared PostgreSQL ledger (`ledger/postgres/`), never a file of that
//! name. Here each kind only goes to its backend, with the settings only it has.

use super::{postgres, sqlite, Backend, Checked, Restoring};
use crate::config::{LedgerBackend, LedgerConfig, LedgerLocation, PgUrl, SqliteSettings};
use crate::error::{Error, Result};
use crate::support::Shutdown;

/// Opens the ledger `cfg` names (creating it if `cfg.create` and it does not exist), honouring
/// every setting in `cfg`: the conflict policy, and background housekeeping for a long-running
/// writer. A ledger that cannot be opened now fails at once; see [`open_waiting`].
pub fn open(cfg: &LedgerConfig) -> Result<Box<dyn Backend>> {
    match &cfg.backend {
        LedgerBackend::Sqlite(file) => Ok(checked(
            sqlite::SqliteLedger::open(&cfg.with_backend(file.clone()))?,
            cfg,
        )),
        LedgerBackend::Postgres(url) => Ok(checked(
            postgres::PgLedger::open(&cfg.with_backend(url.clone()))?,
            cfg,
        )),
    }
}

/// `ledger` inside the contract checks (`checked/`), as every ledger the open step hands out.
fn checked<L: Backend + 'static>(ledger: L, cfg: &LedgerConfig) -> Box<dyn Backend> {
    Box::new(Checked::wrap(ledger, Some(cfg.on_conflict)))
}

/// Opens the ledger like [`open`], but waits out transient failures with backoff, as a
/// long-running process (`run`, `relay`) must. Returns `None` if `stop` is set while waiting.
pub fn open_waiting(cfg: &LedgerConfig, stop: &Shutdown) -> Result<Option<Box<dyn Backend>>> {
    match &cfg.backend {
        LedgerBackend::Sqlite(file) => Ok(sqlite::SqliteLedger::open_waiting(
            &cfg.with_backend(file.clone()),
            stop,
        )?
        .map(|l| checked(l, cfg))),
        LedgerBackend::Postgres(url) => Ok(postgres::PgLedger::open_waiting(
            &cfg.with_backend(url.clone()),
            stop,
        )?
        .map(|l| checked(l, cfg))),
    }
}

/// Prepares `claimgate restore`: locks the ledger at `location` against every other claimgate
/// process and copies `backup` beside it (see [`Restoring`]). A PostgreSQL ledger is restored
/// with PostgreSQL's own tools, which this build does not drive: a configuration error.
pub fn prepare_restore(
    location: &LedgerLocation,
    backup: &std::path::Path,
) -> Result<Box<dyn Restoring>> {
    match location {
        LedgerLocation::File(path) => Ok(Box::new(sqlite::prepare_restore(path, backup)?)),
        LedgerLocation::Postgres(_) => Err(Error::Config(
            "a PostgreSQL ledger is restored with PostgreSQL's own tools (pg_restore, a base backup \
             and WAL); `claimgate restore` puts back the SQLite ledger's backups"
                .into(),
        )),
    }
}

/// What a migration copied: the source's and the target's `verify` summaries, equal in every
/// count and in the chain's head hash.
#[derive(Debug, Clone)]
pub struct Migrated {
    /// The SQLite ledger, verified before the copy.
    pub from: super::Summary,
    /// The PostgreSQL ledger, verified after it.
    pub to: super::Summary,
    /// Where the rows went: the target's URL, its password removed.
    pub target: String,
}

/// Moves the SQLite ledger `from` into the empty PostgreSQL ledger `to` (`claimgate migrate`),
/// as an operation, not a copy:
/// 1. the source is held with the exclusive lock `restore` takes: refused (exit 1) while any
///    claimgate process has it open, and no process can open it until this ends;
/// 2. a source already migrated is refused; so is one holding a row PostgreSQL could not
///    hold (a NUL, an award id too long to index: each named), before anything is copied;
/// 3. the source must verify; the copy is one transaction; the target must then verify with
///    the same counts and the same chain head, or the command fails saying what differs (the
///    copy stays, for inspection). A non-empty target is refused, nothing written;
/// 4. the source is fenced: `run`, `relay` and `init` on it exit 2 naming the target.
///
/// That the source is a file and the target a URL is in the types: the command line refuses
/// anything else where it reads `--db` and `--to`.
pub fn migrate(from: &LedgerConfig<SqliteSettings>, to: &LedgerConfig<PgUrl>) -> Result<Migrated> {
    use super::Inspect;
    let source = sqlite::SqliteLedger::open_exclusively(from)?;
    if let Some((went, at)) = source.migrated_to()? {
        return Err(Error::Config(format!(
            "{} was migrated to {went} at {at} already; its rows live there",
            source.path().display()
        )));
    }
    let refused = source.rows_postgres_refuses()?;
    if !refused.is_empty() {
        return Err(Error::Other(format!(
            "{} row(s) of {} cannot be held by a PostgreSQL ledger, so nothing was copied: {}. \
             The ledger stays on SQLite, unchanged",
            refused.len(),
            source.path().display(),
            refused.join("; ")
        )));
    }
    let before = source.verify()?;
    let target = postgres::PgLedger::open(to)?;
    target.load(&mut |sink| source.dump(sink))?;
    let after = target.verify()?;
    if after != before {
        return Err(Error::Invariant(format!(
            "the copy differs from its source: source {before:?}, copy {after:?}"
        )));
    }
    let target_url = target.describe();
    source.fence(&target_url, &crate::domain::clock::now_rfc3339())?;
    Ok(Migrated {
        from: before,
        to: after,
        target: target_url,
    })
}
