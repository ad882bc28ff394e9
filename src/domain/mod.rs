//! The pure core: what a submission, its key, an audit record and an event are.
//!
//! **Invariant:** nothing under `domain/` does I/O — no Redis, no database, no files, no
//! threads. Time is read only by `clock::now_rfc3339`, which every other layer uses.

pub mod anchor;
pub mod audit;
pub mod clock;
pub mod event;
pub mod key;
pub(crate) mod money;
pub mod signing;
pub mod submission;
