//! The message broker side: Redis Streams only.
//!
//! - `stream`: the consumer-group commands (read, claim, acknowledge), the dead-letter copy
//!   ([`stream::DeadLetterCopy`]), and the reply parsing `dlq` and the relay share.
//! - `sentinel`: finding the primary behind a `redis+sentinel://` URL, and following it.
//! - `fastfilter`: `--fast-filter`'s markers for keys already committed.
//! - `mark`: the relay's high-water mark on the events stream, as `restore` and the relay read it.
//!
//! **Invariant:** nothing under `broker/` touches the ledger. Stream replies are parsed from raw
//! values, so an entry whose body was trimmed surfaces as "vanished", never as a parse error.

pub(crate) mod fastfilter;
pub mod mark;
pub mod sentinel;
pub mod stream;
