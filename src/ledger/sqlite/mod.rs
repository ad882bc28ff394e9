//! The embedded SQLite ledger: [`SqliteLedger`] implements every trait in `ledger/mod.rs`, one
//! file per side — `batch` (with `conflict` and `multirow`) for [`Ledger::record`], `outbox`,
//! `audit_store` ([`crate::ledger::AuditLog`]), `verify` ([`crate::ledger::Inspect`]), `purge`
//! ([`crate::ledger::Retention`]) and `backup` — and `error` turns SQLite's errors into
//! [`Error::Ledger`].
//!
//! WAL is set once on a plain connection before the pool exists; every pooled connection then
//! gets the busy timeout and `synchronous` level. Writers open their transactions with
//! `BEGIN IMMEDIATE`, so two processes never both read and then fail to upgrade to write.

pub mod audit_store;
mod backup;
mod batch;
mod checkpoint;
mod conflict;
mod dump;
mod error;
mod format;
mod identity;
mod lock;
mod migration;
mod multirow;
mod outbox;
mod purge;
mod raw;
mod restore;
mod review;
mod tally;
mod upgrade;
mod verify;

pub use checkpoint::Checkpointer;
pub use format::FORMAT_VERSION;
pub(crate) use restore::prepare as prepare_restore;

use crate::config::{LedgerConfig, OnConflict, SqliteSettings, WAL_AUTOCHECKPOINT_PAGES_DEFAULT};
use crate::domain::clock::age_seconds;
use crate::error::{Error, Result};
use crate::ledger::{Item, Ledger, Outcome, Stats};
use crate::support::failpoint;
use crate::support::Shutdown;
use batch::{Batch, Context};
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The schema, applied idempotently at every open.
pub const SCHEMA: &str = include_str!("../../../schema.sql");

/// Prepared statements kept per connection.
const STATEMENT_CACHE_MAX: usize = 64;

/// A pool of connections to one ledger file.
pub struct SqliteLedger {
    /// The background checkpointer, when the open asked for one (`background_checkpoints`).
    /// Declared first so it stops, leaving a short WAL, before the pool's connections close.
    _checkpointer: Option<Checkpointer>,
    /// Connections, each already configured (busy timeout, synchronous, cache).
    pool: Pool<SqliteConnectionManager>,
    /// The connection `Ledger::record` writes through, opened on the first batch.
    writer: Mutex<Option<Writer>>,
    /// How every connection is configured, for the writer's.
    settings: Settings,
    /// The file, for messages.
    path: PathBuf,
    /// What `record` does with a conflicting resubmission.
    on_conflict: OnConflict,
    /// The claim index leads with the timestamp as spelled: a ledger made by an earlier
    /// release (`upgrade::claims_by_spelling`).
    claims_by_spelling: bool,
    /// The retention purge under way: the connection holding its claim-key map, kept from
    /// `export_purge` to the `purge_batch` calls that follow it (see `purge.rs`).
    purge: Mutex<Option<purge::Session>>,
    /// What `stats` counted last time (`tally.rs`).
    tally: Mutex<Option<tally::Tally>>,
    /// The shared lock on `<ledger>.lock` (`lock.rs`) that tells `restore` this ledger is in
    /// use; declared last, so it is released after the connections close.
    _lock: Option<lock::LedgerLock>,
}

/// How an open ledger tells other claimgate processes it is in use (`lock.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locking {
    /// The shared lock every open ledger holds.
    Shared,
    /// The exclusive lock `migrate` holds: refused while any other process has it open.
    Exclusive,
}

impl SqliteLedger {
    /// Opens (creating if needed and `cfg.create`, mode 0600) the ledger in the file
    /// `cfg.backend.path`, applies the schema and, with `cfg.backend.background_checkpoints`,
    /// starts the checkpointer. A ledger `migrate` fenced is refused when `cfg.create` (`run`,
    /// `relay`, `init`): its rows live in PostgreSQL now (`migration.rs`).
    pub fn open(cfg: &LedgerConfig<SqliteSettings>) -> Result<Self> {
        Self::open_locked(cfg, Locking::Shared)
    }

    /// [`SqliteLedger::open`], holding the lock `locking` says.
    fn open_locked(cfg: &LedgerConfig<SqliteSettings>, locking: Locking) -> Result<Self> {
        let cfg = &cfg.with_backend(SqliteSettings {
            path: real_file(&cfg.backend.path),
            ..cfg.backend.clone()
        });
        if !cfg.create && !cfg.backend.path.exists() {
            return Err(Error::Config(format!(
                "no ledger at {}",
                cfg.backend.path.display()
            )));
        }
        // Before anything is made or changed beside it (the lock file, a mode).
        refuse_what_is_not_a_ledger(&cfg.backend.path)?;
        // Before the file may be created: a restore holding the lock is putting a file here.
        let lock_was_there = lock::path(&cfg.backend.path).exists();
        let lock = match locking {
            Locking::Shared => lock::shared(&cfg.backend.path)?,
            Locking::Exclusive => Some(lock::exclusive(&cfg.backend.path, "migrate")?),
        };
        let existed = create_private(&cfg.backend.path)?;
        let sidecars_before = ledger_files(&cfg.backend.path).map(|f| f.exists());
        // Before any connection reads the file, which would merge the -wal into it.
        let lock_epoch = lock.as_ref().and_then(lock::LedgerLock::epoch);
        if existed {
            identity::refuse_a_stranger_to_its_wal(&cfg.backend.path, lock_epoch.as_deref())?;
        }
        let mut first = Connection::open(&cfg.backend.path).map_err(|e| {
            Error::Config(format!(
                "cannot open ledger {}: {e}",
                cfg.backend.path.display()
            ))
        })?;
        if existed {
            if let Err(e) = refuse_non_database(&first, &cfg.backend.path) {
                // Nothing left beside a file that is not ours (the lock file is flock'ed, not
                // fcntl-locked, so removing it drops no lock SQLite holds).
                drop((first, lock));
                if !lock_was_there {
                    std::fs::remove_file(lock::path(&cfg.backend.path)).ok();
                }
                return Err(e);
            }
            make_ledger_private(&cfg.backend.path, sidecars_before);
        }
        first.busy_timeout(Duration::from_millis(cfg.busy_timeout_ms))?;
        let format = prepare_file(&mut first, cfg)?;
        if cfg.create {
            if let Some((to, at)) = migration::fenced(&first)? {
                return Err(migration::refuse_fenced(&cfg.backend.path, &to, &at));
            }
        }
        if let (Some(lock), Some(epoch)) = (&lock, identity::epoch(&first, cfg.create)?) {
            if lock_epoch.as_deref() != Some(epoch.as_str()) {
                lock.record_epoch(&epoch)?;
            }
        }
        let claims_by_spelling = format == format::FORMAT_CLAIMS_BY_SPELLING;
        drop(first);
        let settings = Settings::of(cfg);
        let pool = pool(cfg, settings.clone())?;
        // Checkpoints then run on their own thread, so the writer's commits only append to the
        // WAL (see `checkpoint.rs`).
        let checkpointer = if cfg.backend.background_checkpoints {
            Some(Checkpointer::start(cfg)?)
        } else {
            None
        };
        Ok(SqliteLedger {
            _checkpointer: checkpointer,
            pool,
            writer: Mutex::new(None),
            settings,
            path: cfg.backend.path.clone(),
            on_conflict: cfg.on_conflict,
            claims_by_spelling,
            purge: Mutex::new(None),
            tally: Mutex::new(None),
            _lock: lock,
        })
    }

    /// Opens the ledger like [`SqliteLedger::open`], but waits out transient failures (another
    /// process holding the write lock past the busy timeout, a full disk) with the shared retry
    /// policy (`crate::retry`: backoff, one WARN when the wait starts and one INFO when it
    /// clears, both naming "opening the ledger"), as a long-running process must: it never
    /// exits because the ledger is briefly unavailable. Returns `None` if `stop` is set while
    /// waiting.
    pub fn open_waiting(
        cfg: &LedgerConfig<SqliteSettings>,
        stop: &Shutdown,
    ) -> Result<Option<Self>> {
        match crate::retry::with_backoff("opening the ledger", stop, 0, || Self::open(cfg)) {
            Ok(ledger) => Ok(Some(ledger)),
            // The retry gives up on a transient failure only once `stop` is set.
            Err(e) if e.is_transient() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the ledger at `path` with default settings.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self> {
        Self::open(&LedgerConfig::new(path.as_ref()))
    }

    /// A pooled connection.
    fn conn(&self) -> Result<PooledConnection<SqliteConnectionManager>> {
        Ok(self.pool.get()?)
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// How every connection to the ledger is configured as it is opened.
#[derive(Debug, Clone)]
struct Settings {
    /// How long a writer waits for another's lock.
    busy: Duration,
    /// `PRAGMA synchronous`.
    synchronous: &'static str,
    /// `PRAGMA max_page_count` (per connection, not stored in the file), if capped.
    pages_max: Option<u64>,
    /// `PRAGMA wal_autocheckpoint`: 0 when the background checkpointer runs.
    autocheckpoint: u32,
    /// `PRAGMA cache_size`, in KiB.
    cache_kib: u32,
}

impl Settings {
    fn of(cfg: &LedgerConfig<SqliteSettings>) -> Self {
        Settings {
            busy: Duration::from_millis(cfg.busy_timeout_ms),
            synchronous: cfg.backend.synchronous.as_sql(),
            pages_max: cfg.backend.pages_max,
            autocheckpoint: if cfg.backend.background_checkpoints {
                0
            } else {
                WAL_AUTOCHECKPOINT_PAGES_DEFAULT
            },
            cache_kib: cfg.backend.cache_kib,
        }
    }

    fn apply(&self, c: &Connection) -> rusqlite::Result<()> {
        c.busy_timeout(self.busy)?;
        // A batch uses about twenty statements (four shapes per multi-row insert); the
        // default cache of 16 would re-prepare some of them in every batch.
        c.set_prepared_statement_cache_capacity(STATEMENT_CACHE_MAX);
        let pages_max = self
            .pages_max
            .map(|n| format!("PRAGMA max_page_count = {n};"))
            .unwrap_or_default();
        c.execute_batch(&format!(
            "PRAGMA synchronous = {};
             PRAGMA foreign_keys = ON;
             PRAGMA cache_size = -{};
             PRAGMA wal_autocheckpoint = {};
             PRAGMA temp_store = MEMORY;
             {pages_max}",
            self.synchronous, self.cache_kib, self.autocheckpoint
        ))
    }
}

/// The pool: every connection configured alike as it is made.
fn pool(
    cfg: &LedgerConfig<SqliteSettings>,
    settings: Settings,
) -> Result<Pool<SqliteConnectionManager>> {
    let manager =
        SqliteConnectionManager::file(&cfg.backend.path).with_init(move |c| settings.apply(c));
    Ok(Pool::builder()
        .max_size(cfg.pool_size_max)
        .connection_timeout(Duration::from_millis(cfg.busy_timeout_ms.max(1_000)))
        .build(manager)?)
}

/// The connection batches are recorded through, with what it keeps between batches.
struct Writer {
    /// Its statements, bound in place (`raw.rs`). Declared before `conn`, so they are
    /// finalized before it closes.
    statements: raw::Statements,
    /// The (instant, award) groups holding a claim, so most new claims skip the conflict
    /// probe (`conflict::Groups`).
    groups: conflict::Groups,
    /// The connection, configured like the pool's.
    conn: Connection,
}

impl Writer {
    fn open(path: &Path, settings: &Settings) -> Result<Self> {
        let conn = Connection::open(path)?;
        settings.apply(&conn)?;
        Ok(Writer {
            statements: raw::Statements::new(&conn),
            groups: conflict::Groups::new(Some((path.to_owned(), settings.clone()))),
            conn,
        })
    }
}

/// Refuses a ledger of a newer format before writing anything, sets WAL (a property of the
/// file: once, before any pooled connection exists), applies the schema and its upgrades and
/// returns the ledger's format, recorded if it was not (`format.rs`). Processes opening a
/// brand-new ledger at the same moment race to convert it, and SQLite settles that race by
/// failing one side with SQLITE_BUSY at once instead of waiting (waiting could deadlock); the
/// loser tries again, within the busy timeout.
fn prepare_file(conn: &mut Connection, cfg: &LedgerConfig<SqliteSettings>) -> Result<i64> {
    let deadline = std::time::Instant::now() + Duration::from_millis(cfg.busy_timeout_ms);
    let mut attempt = 0;
    loop {
        let result = (|| -> Result<i64> {
            format::refuse_newer(conn, &cfg.backend.path)?;
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(Error::Config(format!(
                    "ledger {} refused WAL mode (got {mode}); is it on a network filesystem?",
                    cfg.backend.path.display()
                )));
            }
            // A ledger from an earlier release gets today's columns first (see `upgrade.rs`).
            upgrade::before_schema(conn)?;
            let needs_tombstones = upgrade::needs_tombstones(conn)?;
            conn.execute_batch(SCHEMA)?;
            if needs_tombstones {
                upgrade::backfill_tombstones(conn)?;
            }
            upgrade::after_schema(conn)?;
            format::record(conn, &cfg.backend.path)
        })();
        match result {
            Err(Error::Ledger {
                fault: crate::error::Fault::Transient,
                ..
            }) if std::time::Instant::now() < deadline => {
                // The shared backoff, but no episode lines: losing this race is expected and
                // short. Still losing at the deadline fails `open`, and `open_waiting` logs that.
                std::thread::sleep(crate::retry::backoff(attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Creates the ledger file with mode 0600 if it does not exist, so it is never world-readable,
/// and turns "no such directory" or "permission denied" into a configuration error; true if it
/// existed already.
///
/// An existing ledger, or a `-wal`/`-shm` left beside it by an earlier process, that group or
/// others can read is then made owner-only by [`make_ledger_private`] (0644 becomes 0600), with
/// a WARN naming the file and the mode it had. Changing it rather than only warning is
/// deliberate: SQLite creates `-wal` and `-shm` with the main file's mode (overriding the
/// umask), so a loose ledger would keep producing loose WAL files holding the latest payments,
/// and a warning alone would leave them readable. Copies are taken with `claimgate backup`,
/// which needs no group access to the live file.
fn create_private(path: &Path) -> Result<bool> {
    match crate::support::files::create_private(path) {
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(true),
        Err(e) => Err(Error::Config(format!(
            "cannot create ledger {}: {e}",
            path.display()
        ))),
    }
}

/// Refuses (configuration error, exit 2) a `--db` path that exists but is not a file: a
/// directory or a device. Checked from its metadata alone, before anything is created beside
/// it. (A file is never opened here to look inside: closing any descriptor of a file drops
/// every POSIX lock this process holds on it, SQLite's included. SQLite itself says whether a
/// file is a database, in [`refuse_non_database`], before its mode is touched.)
///
/// A symlink to nothing is refused too: SQLite would create its target with the umask's mode,
/// not 0600. The `-wal` and `-shm` beside the ledger must be plain files or absent, never
/// symlinks: their modes are changed, and a planted link would have that done to its target.
fn refuse_what_is_not_a_ledger(path: &Path) -> Result<()> {
    let refuse = |why: String| Err(Error::Config(format!("ledger {}: {why}", path.display())));
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return refuse("not a file (a directory or a device?); name the ledger's file".into())
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return refuse(
                    "a symlink to nothing; make the ledger where it points, or name it".into(),
                );
            }
        }
        Err(e) => return refuse(format!("cannot use it: {e}")),
    }
    for file in &ledger_files(path)[1..] {
        match std::fs::symlink_metadata(file) {
            Ok(meta) if !meta.file_type().is_file() => {
                return refuse(format!(
                    "{} is not a plain file (a symlink?), as SQLite's own never are",
                    file.display()
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The ledger file `path` names, through symlinks: the target's path when `path` is a symlink
/// to something, else `path` itself (a symlink to nothing is refused later, by
/// [`refuse_what_is_not_a_ledger`]).
///
/// **Why:** the lock file sits beside the path it is given (`lock.rs`), and SQLite puts `-wal`
/// and `-shm` beside the symlink's target. A worker opening the ledger through a link and a
/// `restore` naming the real file would take locks on two different files, and the restore
/// would swap the ledger under the running worker; a restore through the link would put a
/// plain file in place of the link and leave the real ledger as it was. Every process resolves
/// the link first, so all of them lock, check and replace the one real file.
pub(crate) fn real_file(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
        }
        _ => path.to_owned(),
    }
}

/// Refuses (configuration error, exit 2) a file SQLite says is not a database, as its first
/// read of the header does: someone's text file named by a mistyped `--db`, left as it was.
fn refuse_non_database(conn: &Connection, path: &Path) -> Result<()> {
    match conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    }) {
        Err(rusqlite::Error::SqliteFailure(f, _))
            if f.code == rusqlite::ErrorCode::NotADatabase =>
        {
            Err(Error::Config(format!(
                "{} is not a SQLite database, so not a ledger; left as it is",
                path.display()
            )))
        }
        // Anything else (a lock held elsewhere, say) is for the steps after to meet and say.
        _ => Ok(()),
    }
}

/// A ledger's three files: itself, its `-wal` and its `-shm`.
fn ledger_files(path: &Path) -> [PathBuf; 3] {
    [
        path.to_owned(),
        sidecar(path, "-wal"),
        sidecar(path, "-shm"),
    ]
}

/// Makes an existing ledger and the `-wal` and `-shm` beside it owner-only ([`create_private`]
/// says why), once SQLite has said the ledger is a database. SQLite's first read made any
/// `-wal` or `-shm` that was missing, with the ledger's loose mode: those are changed without
/// a warning, as nobody left them loose; one that was there before (`existed`) is named.
fn make_ledger_private(path: &Path, existed: [bool; 3]) {
    for (file, existed) in ledger_files(path).iter().zip(existed) {
        if existed {
            make_private(file);
        } else if let Err(e) = crate::support::files::make_private(file) {
            log::warn!(
                "ledger file {}: could not make it owner-only ({e}); using it as it is",
                file.display()
            );
        }
    }
}

/// SQLite's name for a file beside the ledger: its path with `suffix` appended.
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes one existing ledger file owner-only, saying so; a file that cannot be changed (owned
/// by someone else) is named in a WARN and used as it is.
fn make_private(file: &Path) {
    match crate::support::files::make_private(file) {
        Ok(None) => {}
        Ok(Some((was, now))) => log::warn!(
            "ledger file {} had mode {was:04o} (readable beyond its owner); changed it to {now:04o}",
            file.display()
        ),
        Err(e) => log::warn!(
            "ledger file {}: could not check its mode or make it owner-only ({e}); using it as it is",
            file.display()
        ),
    }
}

impl Ledger for SqliteLedger {
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>> {
        // A batch that panicked left nothing behind (its transaction rolled back on unwinding,
        // its statements were reset), so the writer is taken over as it is.
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.is_none() {
            *writer = Some(Writer::open(&self.path, &self.settings)?);
        }
        let Writer {
            statements,
            groups,
            conn,
        } = writer.as_mut().expect("just opened");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ctx = Context {
            consumer,
            stream,
            on_conflict: self.on_conflict,
            claims_by_spelling: self.claims_by_spelling,
            approving: false,
        };
        let mut batch = Batch::start(&tx, statements, groups, &ctx, items.len())?;
        let outcomes = items
            .iter()
            .map(|item| batch.item(item))
            .collect::<Result<Vec<_>>>()?;
        let claim_id_max = batch.finish()?;
        failpoint::hit("before_commit");
        tx.commit()?;
        groups.committed_through(claim_id_max);
        Ok(outcomes)
    }

    /// Counts only what was added since the last call (`tally.rs`), in one read transaction.
    fn stats(&self) -> Result<Stats> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let mut last = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        let t = tally::Tally::of(&tx, last.take())?;
        *last = Some(t.clone());
        drop(last);
        // The unpublished rows have an index of their own; these stay cheap as the ledger grows.
        let (outbox_backlog, oldest): (i64, Option<String>) = tx.query_row(
            "SELECT COUNT(*), MIN(created_at) FROM outbox WHERE published_at IS NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(t.counts.stats(
            outbox_backlog as u64,
            oldest.as_deref().and_then(age_seconds),
        ))
    }
}
