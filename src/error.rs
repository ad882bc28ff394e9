//! The crate's one error type, and the one question the worker asks of it: is this transient?
//!
//! Transient errors are the world's fault (Redis unreachable or restarting, the ledger busy,
//! locked or full, a pool timeout): the entry is left unacknowledged and retried later.
//! Everything else is permanent: either the entry itself is bad (it is dead-lettered) or the
//! configuration is (the command exits with status 2).
//!
//! A ledger backend's own errors arrive as [`Error::Ledger`], carrying the backend's answer to
//! the transient question; this file names no backend (SQLite's conversions live in
//! `ledger/sqlite/error.rs`).

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
    /// Talking to the ledger's store failed. The backend that raised it decides `transient`.
    #[error("{context}: {source}")]
    Ledger {
        /// What failed, for the operator: `ledger`, or `ledger connection pool` when no
        /// connection became free in time.
        context: &'static str,
        /// The backend's own error.
        source: Box<dyn std::error::Error + Send + Sync>,
        /// True when the backend says a later attempt can succeed (busy, locked, full, the
        /// connection lost, a serialization failure) and nothing was changed.
        transient: bool,
    },
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

    /// A ledger backend's error, shown as `ledger: {source}`; `transient` is the backend's
    /// answer to [`Error::is_transient`].
    pub fn ledger(
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        transient: bool,
    ) -> Self {
        Error::Ledger {
            context: "ledger",
            source: source.into(),
            transient,
        }
    }

    /// True when waiting and retrying can succeed: the entry must stay unacknowledged.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Redis(e) => redis_is_transient(e),
            Error::Ledger { transient, .. } => *transient,
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
