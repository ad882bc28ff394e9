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
//! - [`key`]: the idempotency key (pure).
//! - [`submission`]: parse and validate a stream entry (pure).
//! - [`audit`]: the hash-chained audit record and its verification (pure).
//! - [`config`]: every limit and default.
//! - [`error`]: the one error type and its transient/permanent question.
//! - [`stream`]: Redis only.
//! - [`ledger`]: SQLite only, behind the [`ledger::Ledger`] trait.
//! - [`worker`]: the only place that holds both Redis and the ledger.
//! - [`metrics`]: counters the worker keeps.
//! - [`latency`]: a fixed-size histogram for commit-latency percentiles.
//! - [`failpoint`]: named crash points for tests.
//! - [`fastfilter`]: `--fast-filter`, Redis markers written only after commit.
//! - [`localredis`]: a private `redis-server` for the demo, benchmark and tests.
//! - [`cli`]: the command line.

pub mod audit;
pub mod cli;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod fastfilter;
pub mod key;
pub mod latency;
pub mod ledger;
pub mod localredis;
pub mod metrics;
pub mod stream;
pub mod submission;
pub mod worker;

pub use error::{Error, Result};
