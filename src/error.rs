//! The crate's one error type, and the one question the worker asks of it: is this transient?
//!
//! Transient errors are the world's fault (Redis unreachable or restarting, the ledger busy,
//! locked or full, a pool timeout): the entry is left unacknowledged and retried later.
//! Everything else is permanent: either the entry itself is bad (it is dead-lettered) or the
//! configuration is (the command exits with status 2).
//!
//! Errors are judged by whom they concern. Only a failure the entry's own data caused
//! ([`Error::blames_entry`]: a malformed entry, a value the ledger's constraints refuse) may
//! count a delivery against an entry or dead-letter it. A failure of the ledger as a whole
//! ([`Fault::Ledger`]: a permission revoked, a read-only or damaged file, a missing schema, an
//! I/O error) is never the entry's: the worker waits it out for a bounded time, unhealthy
//! meanwhile, and then exits 1 with the entries still pending.
//!
//! A ledger backend's own errors arrive as [`Error::Ledger`], carrying the backend's answer
//! ([`Fault`]); this file names no backend (SQLite's conversions live in
//! `ledger/sqlite/error.rs`, PostgreSQL's in `ledger/postgres/error.rs`).

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
    /// Talking to the ledger's store failed. The backend that raised it decides whom the
    /// failure concerns (`fault`).
    #[error("{context}: {source}")]
    Ledger {
        /// What failed, for the operator: `ledger`, or `ledger connection pool` when no
        /// connection became free in time.
        context: &'static str,
        /// The backend's own error.
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Whom the failure concerns: the moment, the ledger as a whole, or the entry.
        fault: Fault,
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

/// Whom a ledger failure concerns, as the backend that raised it judges (each backend's
/// `error.rs` says which of its codes falls where; docs/failure-handling.md tabulates them).
/// Nothing was changed in the ledger by a failed statement whatever its fault: the transaction
/// it was part of rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Clears by itself (another writer holds the lock, the disk is full, the connection was
    /// lost, a serialization failure): retried with backoff for as long as the process runs.
    Transient,
    /// The ledger as a whole fails (a privilege revoked, a read-only or damaged file, a
    /// missing table or schema, an I/O error, or anything the entry's data does not explain):
    /// it is never counted against an entry. The worker waits it out with backoff, reported
    /// unhealthy, for at most `--ledger-outage-ms-max`, then exits 1 leaving its entries
    /// pending.
    Ledger,
    /// The entry's own data: a value the ledger's constraints refuse. Only this (and a
    /// malformed entry) may count a delivery against an entry or dead-letter it.
    Entry,
}

impl Error {
    /// Wraps an I/O error with what we were doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A ledger backend's error, shown as `ledger: {source}`, concerning whom `fault` says.
    pub fn ledger(
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        fault: Fault,
    ) -> Self {
        Error::Ledger {
            context: "ledger",
            source: source.into(),
            fault,
        }
    }

    /// True when waiting and retrying can succeed: the entry must stay unacknowledged.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Redis(e) => redis_is_transient(e),
            Error::Ledger { fault, .. } => *fault == Fault::Transient,
            Error::Io { .. } => true,
            Error::Malformed(_) | Error::Config(_) | Error::Invariant(_) | Error::Other(_) => false,
        }
    }

    /// True for a failure of the ledger as a whole ([`Fault::Ledger`]): waited out for a
    /// bounded time by the worker, never counted against an entry.
    pub fn is_ledger_outage(&self) -> bool {
        matches!(
            self,
            Error::Ledger {
                fault: Fault::Ledger,
                ..
            }
        )
    }

    /// True when the entry's own data caused the failure: the only errors that may count a
    /// delivery against an entry or dead-letter it.
    pub fn blames_entry(&self) -> bool {
        matches!(
            self,
            Error::Malformed(_)
                | Error::Ledger {
                    fault: Fault::Entry,
                    ..
                }
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The error redis-rs makes of a server's `-CODE text` reply.
    fn server_says(reply: &str) -> Error {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .expect("an error reply parses");
        Error::Redis(
            value
                .extract_error()
                .expect_err("an error reply is an error"),
        )
    }

    #[test]
    fn redis_replies_that_clear_by_themselves_are_transient() {
        for reply in [
            "NOGROUP No such key 'grants:submissions' or consumer group 'grant-workers'",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "BUSY Redis is busy running a script.",
            "LOADING Redis is loading the dataset in memory",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "READONLY You can't write against a read only replica.",
        ] {
            let e = server_says(reply);
            assert!(e.is_transient(), "{reply}: {e}");
        }
        let nogroup = server_says("NOGROUP No such key");
        assert!(nogroup.is_no_group());
        let io = Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset by peer",
        )));
        assert!(io.is_transient(), "{io}");
    }

    #[test]
    fn a_lost_connection_of_any_kind_is_transient() {
        // Each kind alone, not only the reset that is every one of them at once: a timed-out,
        // refused, dropped or otherwise broken connection clears by itself.
        for kind in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::Other,
        ] {
            let e = Error::Redis(redis::RedisError::from(std::io::Error::new(kind, "lost")));
            assert!(e.is_transient(), "{kind:?}: {e}");
        }
    }

    #[test]
    fn redis_replies_that_will_not_clear_are_permanent() {
        for reply in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOPERM User claimgate has no permissions to run the 'hmget' command",
            "ERR unknown command 'XAUTOCLAIM'",
            "NOSCRIPT No matching script.",
            "NOAUTH Authentication required.",
        ] {
            let e = server_says(reply);
            assert!(!e.is_transient(), "{reply}: {e}");
            assert!(!e.is_no_group(), "{reply}");
        }
    }

    #[test]
    fn every_other_kind_answers_for_itself() {
        assert!(Error::io("writing", std::io::Error::other("disk")).is_transient());
        assert!(Error::ledger("database is locked", Fault::Transient).is_transient());
        let constraint = Error::ledger("constraint failed", Fault::Entry);
        assert!(!constraint.is_transient() && constraint.blames_entry());
        assert!(!constraint.is_ledger_outage());
        let revoked = Error::ledger("permission denied", Fault::Ledger);
        assert!(!revoked.is_transient() && !revoked.blames_entry());
        assert!(revoked.is_ledger_outage());
        for e in [
            Error::Config("bad flag".into()),
            Error::Invariant("two claims".into()),
            Error::Other("no".into()),
            Error::Malformed(Malformed::NotAnObject),
        ] {
            assert!(!e.is_transient(), "{e}");
            assert!(!e.is_no_group(), "{e}");
        }
    }
}
