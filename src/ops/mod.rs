//! The library side of the operator commands: status, dead letters, verification, retention
//! and backup.
//!
//! **Invariant:** nothing under `ops/` runs in the worker's hot path; every command here either
//! only reads, or writes through the ledger's own transactions.

pub mod backup;
pub mod dlq;
pub mod reconcile;
pub mod retention;
pub mod status;
pub mod verify;
