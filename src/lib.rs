//! claimgate turns Redis Streams' at-least-once delivery into exactly-once *effect* for grant
//! disbursements.
//!
//! A worker reads submissions through a consumer group, derives an idempotency key from each
//! submission's own content, and in one ledger transaction (the embedded SQLite ledger by
//! default) claims the key, records the disbursement, writes an outbox row and an audit record.
//! Only after that commit does it acknowledge the entry. A redelivery (after a crash between
//! commit and XACK, or a producer that sent twice) finds the key already claimed and is
//! acknowledged as a duplicate, with nothing paid twice.
//!
//! # Layout
//! One folder per kind of thing; dependencies point down this list, never up (checked by
//! `tests/it/layers.rs`; ARCHITECTURE.md has each module's invariant).
//! - [`domain`]: the pure core — the idempotency key, submissions, audit records, events, the
//!   ledger's clock, anchors and Ed25519 signatures over them. No I/O.
//! - `error`: the one error type and its transient question.
//! - [`support`]: the allocator, failpoints, owner-only files, URL redaction, a private
//!   `redis-server`.
//! - [`config`]: every limit and default, and where the ledger is (`LedgerLocation`: a file or
//!   a PostgreSQL URL, parsed once from `--db`). `retry`: the one retry policy (backoff with
//!   jitter, episode logging, stopping).
//! - [`broker`]: Redis only — streams, consumer groups, reads within a byte budget (in Lua, on
//!   the server), dead-letter copies, which ledger a group belongs to, the fast filter.
//! - [`ledger`]: the traits every caller sees a ledger through, their written contract and the
//!   one open step; the embedded SQLite file behind them in `ledger/sqlite/`, a PostgreSQL
//!   ledger shared by several nodes in `ledger/postgres/`, and an in-memory ledger for tests.
//! - `ops`: status, dead letters, verification, retention, backup and evidence (keys, anchors),
//!   for the operator commands.
//! - `relay`: outbox rows to the events stream, each event exactly once.
//! - [`observe`]: counters, the latency histogram, `/metrics` and `/healthz`, log lines.
//! - [`worker`]: `claimgate run`, the only place that holds both Redis and the ledger.
//! - `demo`: `claimgate demo`, the whole pipeline with no set-up.
//! - [`cli`]: the command line, one file per command group.
//!
//! What is public is what the binary, the integration tests and the benchmark use; the rest of
//! the crate is private to it.

pub mod broker;
pub mod cli;
pub mod config;
mod demo;
pub mod domain;
mod error;
pub mod ledger;
pub mod observe;
mod ops;
mod relay;
mod retry;
pub mod support;
pub mod worker;

pub use error::{Error, Result};
