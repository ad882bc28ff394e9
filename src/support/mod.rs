//! Process plumbing that is not claimgate's business logic: the allocator, crash points for
//! tests, owner-only files, named threads, the [`Shutdown`] signal threads stop and wait on,
//! text from outside escaped for printing, and a private `redis-server` for the demo, the
//! benchmark and the tests.
//!
//! **Invariant:** nothing under `support/` depends on any other claimgate module except
//! `error`; everything above may use it.

pub mod allocator;
pub mod escape;
pub mod failpoint;
pub(crate) mod files;
pub mod localpostgres;
pub mod localredis;
pub mod localsentinels;
pub mod redact;
pub mod shutdown;
pub mod threads;

pub use shutdown::Shutdown;
