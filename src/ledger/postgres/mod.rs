//! The shared PostgreSQL ledger: [`PgLedger`] implements every trait in `ledger/mod.rs` for
//! several nodes writing one database — `batch` for [`Ledger::record`], `outbox`,
//! `audit_store` ([`crate::ledger::AuditLog`]), `verify` ([`crate::ledger::Inspect`]),
//! `retention` ([`crate::ledger::Retention`]) and [`Backup`] (which it leaves to PostgreSQL's
//! own tools); `connect` parses the URL, sets up TLS and pools connections, and `error` turns
//! PostgreSQL's errors into [`Error::Ledger`].
//!
//! Every open finds the ledger in the schema its URL pins (`connect.rs`); `schema.rs` makes or
//! upgrades it, and only for the commands that may (`LedgerConfig::create`): every other open
//! runs no DDL.

mod audit_log;
mod audit_store;
mod batch;
mod catalog;
pub mod connect;
mod error;
mod facts;
mod ledger;
mod link;
mod load;
mod outbox;
mod retention;
mod review;
mod schema;
mod stripes;
mod verify;
mod write;

pub use connect::SCHEMA_DEFAULT;
pub use ledger::PgLedger;
pub use link::head_hold;
pub use schema::{FORMAT_VERSION, SCHEMA};
pub use stripes::{group_stripe, CLAIM_STRIPES};
