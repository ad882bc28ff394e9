//! The embedded SQLite ledger: [`SqliteLedger`] implements every trait in `ledger/mod.rs`, one
//! file per side — `batch` (with `conflict` and `multirow`) for [`Ledger::record`], `outbox`,
//! `audit_store` ([`crate::ledger::AuditLog`]), `verify` ([`crate::ledger::Inspect`]), `purge`
//! ([`crate::ledger::Retention`]) and `backup` — and `error` turns SQLite's errors into
//! [`Error::Ledger`]. `derived` reads back what format 5 does not store because the claim
//! already says it (`format.rs`).
//!
//! WAL is set once on a plain connection before the pool exists; every pooled connection then
//! gets the busy timeout and `synchronous` level. Writers open their transactions with
//! `BEGIN IMMEDIATE`, so two processes never both read and then fail to upgrade to write.

mod audit_log;
pub mod audit_store;
mod backup;
mod batch;
mod checkpoint;
mod conflict;
mod counts;
mod derived;
mod dump;
mod error;
mod fence;
mod files;
mod format;
mod identity;
mod ledger;
mod lock;
mod migration;
mod multirow;
mod outbox;
mod purge;
mod raw;
mod restore;
mod review;
mod settings;
mod upgrade;
mod verify;
mod writer;

pub use checkpoint::Checkpointer;
pub use format::FORMAT_VERSION;
pub use ledger::{SqliteLedger, SCHEMA};
pub(crate) use restore::prepare as prepare_restore;
