//! `claimgate run`: the only module that holds both a Redis connection and the ledger.
//!
//! Three stages joined by bounded channels, and two helpers beside them. Memory is bounded by
//! bytes: every entry counts against `--read-bytes-max` from the read that brings it in until
//! it is dropped after its XACK (`read_size.rs`), and the reader asks Redis for no more than
//! what is left (`broker/read.rs`), whatever the entries weigh.
//!
//! ```text
//! reader (reader.rs: 1 thread, read scripts within the memory budget, polling when idle)
//!   → parse pool (parse.rs, --threads: validate, hash, enforce the delivery cap)
//!     → writer (writer.rs, 1 thread: dead letters, one ledger transaction per batch)
//!       → acker (acker.rs, 1 thread: held copies, XACK, in-flight ids let go)
//!         → reporter (reporter.rs, 1 thread: audit log lines and counters)
//! heartbeat (heartbeat.rs, 1 thread: keeps our in-flight entries from looking abandoned)
//! ```
//!
//! An entry past `--max-deliveries` is tried alone, at most twice (quarantine.rs), before the cap
//! dead-letters it. A stage that fails for good stops all of them (`Shared::halt`).
//!
//! `run.rs` wires the threads and channels together; `shared.rs` holds the state they share.
//! This file only names them.
//!
//! **Invariant:** nothing under `worker/` sends XACK for an entry before the ledger transaction
//! covering it has committed. The acker acknowledges every entry the writer committed, and
//! only what the writer hands it after that commit; the reader acknowledges nothing but pending ids whose entries are gone from the
//! stream (there is nothing left to process). A crash anywhere before the XACK leaves the
//! entries pending; their redelivery finds the claims already taken and becomes a duplicate.

mod acker;
mod dead_letters;
mod heartbeat;
mod in_flight;
mod parse;
mod quarantine;
mod read_size;
mod reader;
mod record;
mod reporter;
mod run;
mod shared;
mod signals;
mod writer;

/// The name the reader's failures to reach Redis are logged under (`retry::Episode`); `run`
/// waits out Redis at start under it too.
pub use reader::WHAT as READING;

pub use run::run;
pub use shared::AfterFailover;
