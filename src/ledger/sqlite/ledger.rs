//! [`SqliteLedger`]: a pool of connections to one ledger file, opened (its files checked, its
//! format refused or upgraded, WAL set once before the pool exists) and recording batches.

use super::batch::{Batch, Context};
use super::derived::Derives;
use super::files::{
    create_private, ledger_files, make_ledger_private, real_file, refuse_non_database,
    refuse_what_is_not_a_ledger,
};
use super::settings::{pool, Settings};
use super::writer::Writer;
use super::{checkpoint::Checkpointer, counts, fence, format, identity, lock, upgrade};
use crate::config::{LedgerConfig, OnConflict, SqliteSettings};
use crate::domain::clock::age_seconds;
use crate::error::{Error, Result};
use crate::ledger::{Item, Ledger, Outcome, Stats};
use crate::support::failpoint;
use crate::support::Shutdown;
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The schema, applied idempotently at every open.
pub const SCHEMA: &str = include_str!("../../../schema.sql");

/// A pool of connections to one ledger file.
pub struct SqliteLedger {
    /// The background checkpointer, when the open asked for one (`background_checkpoints`).
    /// Declared first so it stops, leaving a short WAL, before the pool's connections close.
    pub(super) _checkpointer: Option<Checkpointer>,
    /// Connections, each already configured (busy timeout, synchronous, cache).
    pub(super) pool: Pool<SqliteConnectionManager>,
    /// The connection `Ledger::record` writes through, opened on the first batch.
    pub(super) writer: Mutex<Option<Writer>>,
    /// How every connection is configured, for the writer's.
    pub(super) settings: Settings,
    /// The file, for messages.
    pub(super) path: PathBuf,
    /// What `record` does with a conflicting resubmission.
    pub(super) on_conflict: OnConflict,
    /// The claim index leads with the timestamp as spelled: a ledger made by an earlier
    /// release (`upgrade::claims_by_spelling`).
    pub(super) claims_by_spelling: bool,
    /// What the disbursements and outbox leave to be derived from the claim (`derived.rs`).
    pub(super) derives: Derives,
    /// The retention purge under way: the connection holding its claim-key map, kept from
    /// `export_purge` to the `purge_batch` calls that follow it (see `purge.rs`).
    pub(super) purge: Mutex<Option<Session>>,
    /// The shared lock on `<ledger>.lock` (`lock.rs`) that tells `restore` this ledger is in
    /// use; declared last, so it is released after the connections close.
    pub(super) _lock: Option<lock::LedgerLock>,
}

impl Drop for SqliteLedger {
    /// The writer goes first, before the checkpointer's last checkpoint (the fields' order):
    /// its claim-group filter's build, if one is still reading, is stopped with it and would
    /// otherwise hold that checkpoint until it had read every claim (`conflict::Groups`).
    fn drop(&mut self) {
        drop(
            self.writer
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }
}

/// The purge under way on this ledger handle.
pub(super) struct Session {
    /// The cutoff its claim-key map was built for.
    pub(super) cutoff: String,
    /// The connection whose `temp.claim_keys` holds the map (temporary tables are per
    /// connection, so every batch must run on this one).
    pub(super) conn: PooledConnection<SqliteConnectionManager>,
}

impl Drop for Session {
    /// The connection goes back to the pool as the pool made it: temporary tables in memory
    /// (`settings.rs`), the map (kept in a file, `purge.rs`) dropped with the setting.
    fn drop(&mut self) {
        if let Err(e) = self.conn.execute_batch("PRAGMA temp_store = MEMORY") {
            log::debug!("restoring a purge connection's temp_store: {e}");
        }
    }
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
    pub(super) fn open_locked(
        cfg: &LedgerConfig<SqliteSettings>,
        locking: Locking,
    ) -> Result<Self> {
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
        assert_eq!(
            format,
            format::FORMAT_VERSION,
            "every open records today's format"
        );
        if cfg.create {
            if let Some((to, at)) = fence::fenced(&first)? {
                return Err(fence::refuse_fenced(&cfg.backend.path, &to, &at));
            }
        }
        if let (Some(lock), Some(epoch)) = (&lock, identity::epoch(&first, cfg.create)?) {
            if lock_epoch.as_deref() != Some(epoch.as_str()) {
                lock.record_epoch(&epoch)?;
            }
        }
        let claims_by_spelling = upgrade::claims_by_spelling(&first)?;
        let derives = Derives::of(&first)?;
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
            derives,
            purge: Mutex::new(None),
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
        crate::retry::until_stopped("opening the ledger", stop, || Self::open(cfg))
    }

    /// Opens the ledger at `path` with default settings.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self> {
        Self::open(&LedgerConfig::new(path.as_ref()))
    }

    /// A pooled connection.
    pub(super) fn conn(&self) -> Result<PooledConnection<SqliteConnectionManager>> {
        Ok(self.pool.get()?)
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
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
            derives: self.derives,
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

    /// The counts the ledger keeps (`counts.rs`) and the outbox backlog, in one read
    /// transaction: one row and one index range, at any ledger size.
    fn stats(&self) -> Result<Stats> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let counts = match counts::read(&tx)? {
            Some(c) => c,
            None => {
                // Deleted under this process; its next open writes it again.
                log::warn!(
                    "ledger {}: its counts row is missing; counting the rows (the next open \
                     writes the row again)",
                    self.path.display()
                );
                counts::recount(&tx)?
            }
        };
        // The unpublished rows have an index of their own; these stay cheap as the ledger grows.
        // Rows are made in id order, so the oldest is the first; a row that stores no creation
        // time was made with its claim (`derived.rs`).
        let (outbox_backlog, oldest): (i64, Option<String>) = tx.query_row(
            "SELECT COUNT(*),
                    (SELECT ifnull(o.created_at, p.claimed_at)
                     FROM outbox o LEFT JOIN processed_messages p ON p.claim_id = o.claim_id
                     WHERE o.published_at IS NULL ORDER BY o.id LIMIT 1)
             FROM outbox WHERE published_at IS NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(counts.stats(
            outbox_backlog as u64,
            oldest.as_deref().and_then(age_seconds),
        ))
    }
}
