//! The one open step: the `--db` value chooses the backend, and the caller gets a
//! [`Backend`] without ever naming it.
//!
//! A file path is the embedded SQLite ledger. A `postgres://` or `postgresql://` URL is the
//! shared PostgreSQL ledger (`ledger/postgres/`), never a file of that name.

use super::{postgres, sqlite, Backend, Checked, Restoring};
use crate::config::LedgerConfig;
use crate::error::{Error, Result};
use crate::support::Shutdown;

/// Which kind of ledger a `--db` value names.
enum Location {
    /// A file: the embedded SQLite ledger.
    File,
    /// A PostgreSQL URL.
    Postgres,
}

impl Location {
    /// The kind of ledger `cfg` names. A value that is almost a PostgreSQL address (the scheme
    /// in capitals, spaces around it, or a `key=value` connection string) is refused without
    /// being repeated: taken as a file name it would become a local SQLite ledger, leaving the
    /// shared one, with its password in a file name anyone can list and in every message that
    /// names the ledger.
    fn of(cfg: &LedgerConfig) -> Result<Location> {
        let value = cfg.path.to_string_lossy();
        let schemes = ["postgres://", "postgresql://"];
        if schemes.iter().any(|scheme| value.starts_with(scheme)) {
            return Ok(Location::Postgres);
        }
        let lower = value.trim().to_ascii_lowercase();
        let almost_url = schemes.iter().any(|scheme| lower.starts_with(scheme));
        let conninfo = CONNINFO_KEYS
            .iter()
            .any(|key| lower.split_whitespace().any(|word| word.starts_with(key)));
        if almost_url || conninfo {
            return Err(Error::Config(
                "--db looks like a PostgreSQL address but is not a postgres:// or postgresql:// \
                 URL as written (lower-case scheme, no spaces around it, not key=value); it is \
                 not repeated here, as it may hold a password"
                    .into(),
            ));
        }
        if let Some(scheme) = url_scheme(&value) {
            return Err(Error::Config(format!(
                "--db is a URL of a kind claimgate does not take ({scheme}); a ledger is a file \
                 path or a postgres:// or postgresql:// URL. The value is not repeated here, as \
                 it may hold a password"
            )));
        }
        Ok(Location::File)
    }
}

/// The scheme of a value that is a URL of some kind — `scheme://…`, or `scheme:…@…` — as
/// something safe to print (`pg://`, or `a URL`); `None` for a plain path. A mistyped scheme
/// (`postgre://`, `pg://`, `postgres:/`) must never become a file name, nor be repeated in
/// the message that refuses it: what follows the scheme may hold a password.
fn url_scheme(value: &str) -> Option<String> {
    let (scheme, rest) = value.trim().split_once(':')?;
    let schemeish = !scheme.is_empty()
        && scheme.len() <= 32
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !(rest.starts_with("//") || (schemeish && rest.starts_with('/') && rest.contains('@'))) {
        return (schemeish && rest.contains('@')).then(|| "a URL".to_owned());
    }
    Some(if schemeish {
        format!("{scheme}://")
    } else {
        "a URL".to_owned()
    })
}

/// Words that begin a libpq `key=value` connection string's settings, as no file name does.
const CONNINFO_KEYS: [&str; 6] = [
    "host=",
    "hostaddr=",
    "user=",
    "password=",
    "dbname=",
    "port=",
];

/// Opens the ledger `cfg` names (creating it if `cfg.create` and it does not exist), honouring
/// every setting in `cfg`: the conflict policy, and background housekeeping for a long-running
/// writer. A ledger that cannot be opened now fails at once; see [`open_waiting`].
pub fn open(cfg: &LedgerConfig) -> Result<Box<dyn Backend>> {
    match Location::of(cfg)? {
        Location::File => Ok(checked(sqlite::SqliteLedger::open(cfg)?, cfg)),
        Location::Postgres => {
            sqlite_only_settings_unset(cfg)?;
            Ok(checked(postgres::PgLedger::open(cfg)?, cfg))
        }
    }
}

/// `ledger` inside the contract checks (`checked/`), as every ledger the open step hands out.
fn checked<L: Backend + 'static>(ledger: L, cfg: &LedgerConfig) -> Box<dyn Backend> {
    Box::new(Checked::wrap(ledger, Some(cfg.on_conflict)))
}

/// Opens the ledger like [`open`], but waits out transient failures with backoff, as a
/// long-running process (`run`, `relay`) must. Returns `None` if `stop` is set while waiting.
pub fn open_waiting(cfg: &LedgerConfig, stop: &Shutdown) -> Result<Option<Box<dyn Backend>>> {
    match Location::of(cfg)? {
        Location::File => {
            Ok(sqlite::SqliteLedger::open_waiting(cfg, stop)?.map(|l| checked(l, cfg)))
        }
        Location::Postgres => {
            sqlite_only_settings_unset(cfg)?;
            Ok(postgres::PgLedger::open_waiting(cfg, stop)?.map(|l| checked(l, cfg)))
        }
    }
}

/// Refuses settings that only a SQLite ledger has, when they ask for something other than the
/// default: a PostgreSQL ledger would ignore them, and an operator who asked for a size cap or
/// another durability level must not believe they hold. (PostgreSQL's durability is the
/// server's `synchronous_commit`; its size, the server's disk and quotas.)
fn sqlite_only_settings_unset(cfg: &LedgerConfig) -> Result<()> {
    let mut set = Vec::new();
    if cfg.synchronous != crate::config::Synchronous::Full {
        set.push("--synchronous (CLAIMGATE_SYNCHRONOUS): a PostgreSQL ledger's durability is the server's synchronous_commit");
    }
    if cfg.pages_max.is_some() {
        set.push("--ledger-pages-max (CLAIMGATE_LEDGER_PAGES_MAX): size a PostgreSQL ledger with the server's disk and quotas");
    }
    if set.is_empty() {
        return Ok(());
    }
    Err(crate::error::Error::Config(format!(
        "these settings apply to a SQLite ledger only and --db is a PostgreSQL URL; unset them: {}",
        set.join("; ")
    )))
}

/// Prepares `claimgate restore`: locks the ledger `cfg` names against every other claimgate
/// process and copies `backup` beside it (see [`Restoring`]). A PostgreSQL ledger is restored
/// with PostgreSQL's own tools, which this build does not drive: a configuration error.
pub fn prepare_restore(cfg: &LedgerConfig, backup: &std::path::Path) -> Result<Box<dyn Restoring>> {
    match Location::of(cfg)? {
        Location::File => Ok(Box::new(sqlite::prepare_restore(&cfg.path, backup)?)),
        Location::Postgres => Err(crate::error::Error::Config(
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
pub fn migrate(from: &LedgerConfig, to: &LedgerConfig) -> Result<Migrated> {
    use super::Inspect;
    use crate::error::Error;
    if !matches!(Location::of(from)?, Location::File) {
        return Err(Error::Config(
            "migrate copies a SQLite ledger: --db must name its file".into(),
        ));
    }
    if !matches!(Location::of(to), Ok(Location::Postgres)) {
        return Err(Error::Config(
            "migrate copies into a PostgreSQL ledger: --to must be a postgres:// or \
             postgresql:// URL"
                .into(),
        ));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn location(value: &str) -> Result<Location> {
        Location::of(&LedgerConfig::new(value))
    }

    #[test]
    fn every_mistyped_url_is_refused_without_its_password() {
        for value in [
            "postgre://claimgate:PW-SECRET@db:5432/ledger",
            "pg://claimgate:PW-SECRET@db/ledger",
            "postgres:/claimgate:PW-SECRET@db/ledger",
            "postgres:claimgate:PW-SECRET@db/ledger",
            "mysql://claimgate:PW-SECRET@db/ledger",
            "redis://:PW-SECRET@127.0.0.1:6379",
            "Postgres://claimgate:PW-SECRET@db/ledger",
            " postgres://claimgate:PW-SECRET@db/ledger",
            "postgres ://claimgate:PW-SECRET@db/ledger",
            "host=db user=claimgate password=PW-SECRET",
            "://claimgate:PW-SECRET@db",
        ] {
            match location(value) {
                Err(Error::Config(m)) => {
                    assert!(!m.contains("PW-SECRET") && !m.contains("claimgate:"), "{m}")
                }
                Err(e) => panic!("{value}: {e}"),
                Ok(_) => panic!("{value}: taken as a ledger"),
            }
        }
        for path in [
            "./claimgate.db",
            "/var/lib/claimgate/claimgate.db",
            "ledger@2026.db",
            "C:ledger.db",
        ] {
            assert!(matches!(location(path), Ok(Location::File)), "{path}");
        }
        assert!(matches!(
            location("postgresql://u:p@h/db"),
            Ok(Location::Postgres)
        ));
    }
}
