//! How every connection to a SQLite ledger is configured ([`Settings`]), and the pool that
//! makes them alike.

use crate::config::{LedgerConfig, SqliteSettings, WAL_AUTOCHECKPOINT_PAGES_DEFAULT};
use crate::error::Result;
use r2d2::Pool;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;
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
