//! The library side of the operator commands: status, dead letters, verification, retention,
//! backup and restore.
//!
//! **Invariant:** nothing under `ops/` runs in the worker's hot path; every command here either
//! only reads, or writes through the ledger's own transactions.

pub mod backup;
pub mod dlq;
pub mod restore;
pub mod retention;
pub mod status;
pub mod verify;
