//! The ledger contract asserted where it lives: [`Checked`] wraps any ledger and implements the
//! same traits by delegation, checking on every call what the contract in `ledger/mod.rs`
//! promises and a caller can see from outside — one outcome per item and of a kind that item
//! may have, duplicates decided in batch order, no [`crate::ledger::Outcome::Deferred`] from a
//! ledger with one writer, no hold under `--on-conflict record`, the `locked` hook of point 9
//! told the truth, outbox rows rising above the id asked, the outbox sequence and a stream's
//! published mark never going back, counts that only grow never shrinking.
//!
//! A failed check is a programmer error in the backend (or a ledger changed under a running
//! process by something that is not claimgate): it panics, naming the contract point, so the
//! process stops loudly instead of acknowledging entries on a ledger that broke its word. The
//! worker turns a panicking stage into a halt (`worker::mod.rs`), and nothing is acknowledged
//! after it. What the stored data may break by itself (a hand-edited row) is not asserted
//! here: `verify` reports it, as an error, not a panic.
//!
//! The checks are always on: they cost a hash-set insert per item and a few comparisons per
//! call, within the benchmark's noise (BENCHMARKS.md, "The contract checks"), and, as in
//! TigerBeetle, an assertion that is off in production protects nothing there.
//!
//! Every ledger the open step hands out is wrapped (`open.rs`), and so is every
//! [`crate::ledger::MemoryLedger`] (its constructor makes a `Checked<MemoryStore>`).
//!
//! Invariant: a `Checked` ledger answers exactly what its inner ledger answers, or panics.

mod outcomes;
mod wrapper;

pub use wrapper::Checked;

#[cfg(test)]
mod tests;
