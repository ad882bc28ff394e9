//! `claimgate demo`: the whole pipeline on one machine with nothing set up, then a summary.
//!
//! It starts a private `redis-server` from PATH on a free port with its data in a temporary
//! directory, puts the ledger in the same directory, feeds a few thousand realistic submissions
//! (with byte-identical resends, a conflicting resubmission and malformed entries of several
//! kinds), runs the real worker binary as a child process that crashes on purpose between a
//! commit and its XACK, restarts it as systemd would, relays the outbox to the events stream
//! (`claimgate relay`), checks the ledger (`claimgate verify`'s checks plus the totals the
//! feed promised), anchors it and ends by writing the audit report (`claimgate audit report`)
//! and printing its path.
//!
//! # Invariant
//! The demo never touches a Redis it did not start unless `--redis-url` is given on the command
//! line (an inherited `REDIS_URL` does not count), and then only keys under a fresh
//! `claimgate-demo-*` prefix, deleted at the end. Everything it starts (workers, redis-server,
//! the temporary directory) is stopped and removed when it returns, including on Ctrl-C. The
//! one file it leaves is the report, a new file (`--report`, or a name with the time in the
//! current directory), whose path it prints.

mod check;
mod data;
mod walkthrough;

pub use walkthrough::{run, DemoArgs};
