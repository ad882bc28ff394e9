//! The message broker side: Redis Streams only.
//!
//! - `stream`: connections (`Conn`, following a Sentinel promotion), the consumer-group
//!   commands (create, acknowledge, pending), and the reply parsing `dlq` and the relay share.
//! - `entry`: one entry as held, whole or cut down on the server, and what it weighs.
//! - `read`: reading entries with a byte budget, in Lua on the server (XREADGROUP, XAUTOCLAIM,
//!   XRANGE): nothing over the budget or over an entry's limits crosses the wire.
//! - `dead_letter`: the dead-letter copy ([`dead_letter::DeadLetterCopy`]).
//! - `binding`: which ledger a consumer group belongs to.
//! - `fault`: what a Redis error means to the operator, with the address it came from.
//! - `url`: Redis URLs with their secrets hidden.
//! - `sentinel`: finding the primary behind a `redis+sentinel://` URL, and following it.
//! - `fastfilter`: `--fast-filter`'s markers for keys already committed.
//! - `mark`: the relay's high-water mark on the events stream, as `restore` and the relay read
//!   it, and what Redis says of the events stream's history.
//!
//! **Invariant:** nothing under `broker/` touches the ledger. Stream replies are parsed from raw
//! values, so an entry whose body was trimmed surfaces as "vanished", never as a parse error.

pub mod binding;
pub mod dead_letter;
pub mod entry;
pub(crate) mod fastfilter;
pub mod fault;
pub mod mark;
pub mod read;
pub mod sentinel;
pub mod stream;
pub mod url;
