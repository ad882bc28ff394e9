//! claimgate turns Redis Streams' at-least-once delivery into exactly-once *effect* for grant
//! disbursements.
//!
//! A worker reads submissions through a consumer group, derives an idempotency key from each
//! submission's own content, and in one SQLite transaction claims the key, records the
//! disbursement, writes an outbox row and an audit record. Only after that commit does it
//! acknowledge the entry. A redelivery (after a crash between commit and XACK, or a producer
//! that sent twice) finds the key already claimed and is acknowledged as a duplicate, with
//! nothing paid twice.
//!
//! # Layout
//! - [`allocator`]: the process allocator and its settings.
//! - [`key`]: the idempotency key (pure).
//! - [`submission`]: parse and validate a stream entry (pure).
//! - [`audit`]: the hash-chained audit record and its verification (pure).
//! - [`config`]: every limit and default.
//! - [`error`]: the one error type and its transient/permanent question.
//! - [`retry`]: the one retry policy: backoff with jitter, episode logging, stopping.
//! - [`stream`]: Redis only.
//! - [`ledger`]: the traits every caller sees the ledger through, their written contract and
//!   the one open step; SQLite behind them, in `ledger/sqlite/` only.
//! - [`dlq`]: list, show and replay dead letters (Redis only).
//! - [`worker`]: the only place that holds both Redis and the ledger.
//! - [`relay`]: outbox rows to the events stream, each event exactly once.
//! - [`verify`]: the ledger checked against itself and its audit chain.
//! - [`retention`]: purging records past the retention window, and legal holds.
//! - [`metrics`]: counters the worker keeps.
//! - [`latency`]: a fixed-size histogram for commit-latency percentiles.
//! - [`failpoint`]: named crash points for tests.
//! - [`fastfilter`]: `--fast-filter`, Redis markers written only after commit.
//! - [`localredis`]: a private `redis-server` for the demo, benchmark and tests.
//! - [`status`]: ledger and stream state for `claimgate status` and the metrics gauges.
//! - [`exposition`]: the Prometheus text `/metrics` serves.
//! - [`serve`]: the `/metrics` and `/healthz` HTTP endpoints of `claimgate run`.
//! - [`logging`]: human or JSON log lines; audit lines routable on their own.
//! - [`demo`]: `claimgate demo`, the whole pipeline with no set-up.
//! - [`backup`]: a consistent copy of the ledger while workers run.
//! - [`cli`]: the command line, one file per command group.

pub mod broker;
pub mod cli;
pub mod config;
pub mod demo;
pub mod domain;
pub mod error;
pub mod ledger;
pub mod observe;
pub mod ops;
pub mod relay;
pub mod retry;
pub mod support;
pub mod worker;

pub use error::{Error, Result};
