//! The library side of the operator commands: status (and its live `--watch` view), dead
//! letters, verification, retention, backup and restore, and the evidence kept outside the
//! ledger (keys, anchors) and the report an auditor opens.
//!
//! **Invariant:** nothing under `ops/` runs in the worker's hot path; every command here either
//! only reads, or writes through the ledger's own transactions; beside the ledger it writes only
//! new 0600 files (exports, keys) and appends to an anchors file or stream.

pub mod anchoring;
pub mod backup;
pub mod dlq;
pub mod evidence;
pub mod reconcile;
pub mod report;
pub mod restore;
pub mod retention;
pub mod review;
pub mod scrape;
pub mod status;
pub mod verify;
pub mod watch;
