//! How every connection to a SQLite ledger is configured ([`Settings`]), and the pool that
//! makes them alike.

use crate::config::{LedgerConfig, SqliteSettings, WAL_AUTOCHECKPOINT_PAGES_DEFAULT};
use crate::error::Result;
use crate::support::failpoint;
use r2d2::Pool;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::trace::{TraceEvent, TraceEventCodes};
use rusqlite::Connection;
use std::cell::Cell;
use std::time::Duration;

/// Prepared statements kept per connection.
pub(super) const STATEMENT_CACHE_MAX: usize = 64;

/// How every connection to the ledger is configured as it is opened.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// How long a writer waits for another's lock.
    pub(super) busy: Duration,
    /// `PRAGMA synchronous`.
    pub(super) synchronous: &'static str,
    /// `PRAGMA max_page_count` (per connection, not stored in the file), if capped.
    pub(super) pages_max: Option<u64>,
    /// `PRAGMA wal_autocheckpoint`: 0 when the background checkpointer runs.
    pub(super) autocheckpoint: u32,
    /// `PRAGMA cache_size`, in KiB.
    pub(super) cache_kib: u32,
}

impl Settings {
    pub(super) fn of(cfg: &LedgerConfig<SqliteSettings>) -> Self {
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

    pub(super) fn apply(&self, c: &Connection) -> rusqlite::Result<()> {
        c.busy_timeout(self.busy)?;
        if failpoint::armed_at("write_statement") {
            c.trace_v2(TraceEventCodes::SQLITE_TRACE_STMT, Some(watch_writes));
        }
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

/// The `write_statement` failpoint (`support/failpoint.rs`): hit at the start of every
/// statement between a `BEGIN IMMEDIATE` and the `COMMIT` or `ROLLBACK` that ends it (each
/// thread runs its own connection's transaction), so a test can kill a process between any two
/// statements of any write it makes.
fn watch_writes(event: TraceEvent<'_>) {
    thread_local! {
        static IN_WRITE: Cell<bool> = const { Cell::new(false) };
    }
    let TraceEvent::Stmt(_, sql) = event else {
        return;
    };
    let sql = sql.trim_start();
    if sql.starts_with("BEGIN IMMEDIATE") {
        IN_WRITE.set(true);
        return;
    }
    if IN_WRITE.get() {
        failpoint::hit("write_statement");
    }
    if sql.starts_with("COMMIT") || sql.starts_with("ROLLBACK") {
        IN_WRITE.set(false);
    }
}

/// The pool: every connection configured alike as it is made.
pub(super) fn pool(
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
