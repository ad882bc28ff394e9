//! The in-memory ledger: the contract of `ledger/mod.rs` kept in a few vectors behind one lock.
//!
//! It exists for tests (the raft-rs `MemStorage` idea): the contract suite in
//! `tests/it/contract.rs` runs against it and against SQLite alike, so the two must agree on
//! every outcome and every audit record. It implements [`Ledger`], [`Outbox`], [`AuditLog`] and
//! [`Inspect`], but not [`crate::ledger::Retention`] or [`crate::ledger::Backup`]: it is not a
//! [`crate::ledger::Backend`], and the CLI never opens one. Of retention it has only what the
//! contract's tombstone point needs, [`MemoryStore::purge_through`] (`purge.rs`). Nothing
//! survives the process. What tests hold is a [`MemoryLedger`], the store inside the contract
//! checks (`ledger::checked`), so every contract test of it runs the checks too.
//!
//! How it keeps the contract:
//! - **Atomic batches.** `record` stages the whole batch in an overlay over the committed state
//!   (`batch.rs`) and publishes it with one infallible `apply` at the end; an error while
//!   staging drops the overlay, and nothing of the batch was ever visible.
//! - **A linear chain.** `record` holds the one lock from reading the chain's tail to publishing,
//!   so two batches never interleave; `apply` asserts each new `seq` is the previous one plus 1.
//! - **Outbox ids in commit order, never reused.** Ids come from a counter that only grows,
//!   assigned under the same lock as the commit.
//! - **No transient errors.** Nothing here can be busy or full. The only errors are a fault the
//!   contract tests arm ([`MemoryLedger::fail_on_award`]) and a lock poisoned by an earlier
//!   panic (an [`Error::Invariant`]: the state can no longer be trusted).

mod batch;
mod ledger;
mod purge;
mod state;
mod verify;

pub use ledger::{MemoryLedger, MemoryStore};
