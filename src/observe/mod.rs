//! Watching a running claimgate: counters, the commit-latency histogram, Prometheus text, the
//! `/metrics` and `/healthz` endpoints, and log lines.
//!
//! **Invariant:** nothing under `observe/` writes to Redis or the ledger; a scrape or a log line
//! can never change what the worker does.

pub(crate) mod http;
pub(crate) mod latency;
pub mod logging;
pub mod metrics;
pub(crate) mod prometheus;
