//! The crate's one error type, and the one question the worker asks of it: is this transient?
//!
//! Transient errors are the world's fault (Redis unreachable or restarting, SQLite busy, locked
//! or full, a pool timeout): the entry is left unacknowledged and retried later. Everything else
//! is permanent: either the entry itself is bad (it is dead-lettered) or the configuration is
//! (the command exits with status 2).

use crate::domain::submission::Malformed;

/// Every way a claimgate operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The entry itself is bad; retrying cannot help.
    #[error("malformed entry: {0}")]
    Malformed(#[from] Malformed),
    /// Talking to Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Talking to the SQLite ledger failed.
    #[error("ledger: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// No ledger connection became free in time.
    #[error("ledger connection pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing when it failed, for the operator.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A flag, URL or path is unusable. Maps to exit status 2.
    #[error("configuration: {0}")]
    Config(String),
    /// The ledger or audit chain contradicts itself (found by `verify`).
    #[error("invariant violated: {0}")]
    Invariant(String),
    /// Anything else that is a plain, permanent failure with a message.
    #[error("{0}")]
    Other(String),
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with what we were doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// True when waiting and retrying can succeed: the entry must stay unacknowledged.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Redis(e) => redis_is_transient(e),
            Error::Sqlite(e) => sqlite_is_transient(e),
            Error::Pool(_) => true,
            Error::Io { .. } => true,
            Error::Malformed(_) | Error::Config(_) | Error::Invariant(_) | Error::Other(_) => false,
        }
    }

    /// True when Redis says the consumer group (or its stream) no longer exists, which happens
    /// after a Redis restart without persistence.
    pub fn is_no_group(&self) -> bool {
        matches!(self, Error::Redis(e) if e.code() == Some("NOGROUP"))
    }
}

/// Redis errors that go away by themselves: the connection, a restart, a failover.
pub fn redis_is_transient(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    // NOGROUP: the group went with a Redis restart and is recreated. OOM: Redis is at its
    // maxmemory, which is the world being full (like a full disk), not the entry being bad.
    // BUSY: a long-running script holds the server.
    if matches!(e.code(), Some("NOGROUP" | "OOM" | "BUSY")) {
        return true;
    }
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    )
}

/// SQLite errors that a later attempt can get past: another writer, a full disk, an I/O hiccup.
pub fn sqlite_is_transient(e: &rusqlite::Error) -> bool {
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
