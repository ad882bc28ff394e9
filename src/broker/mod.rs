//! The message broker side: Redis Streams only.
//!
//! **Invariant:** nothing under `broker/` touches the ledger. Every reply is parsed from raw
//! values, so an entry whose body was trimmed surfaces as "vanished", never as a parse error.

pub mod fastfilter;
pub mod stream;
