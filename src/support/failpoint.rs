//! Crash points for tests: a process told to die at a named step dies there, for real.
//!
//! `CLAIMGATE_FAILPOINT=NAME` aborts the process the first time execution reaches `NAME`;
//! `CLAIMGATE_FAILPOINT=NAME:N` aborts on the N-th time. The abort is `std::process::abort`, so
//! nothing is flushed, acknowledged or rolled back politely: it is the crash the design must
//! survive. Unset, a hit costs one load of an already-initialised value.
//!
//! The points, in the order an entry meets them: `after_read`, `before_locks` (a shared
//! ledger's batch, before it takes its groups), `after_claim` (claim inserted,
//! transaction open), `before_commit`, `before_link` (a shared ledger's batch committed, not
//! yet linked into the audit chain), `after_commit` (committed, not yet acknowledged),
//! `write_statement` (a SQLite ledger: the start of each statement inside a write transaction,
//! its `COMMIT` included, on any of the process's ledger connections, so `write_statement:N`
//! dies between the (N-1)th and the Nth statement of the writes),
//! `relay_after_publish` (published, not yet marked); and `purge_after_batch` (a retention
//! purge between two committed batches). A shared (PostgreSQL) ledger's batch also has
//! `pg_after_dead_letters`, `pg_after_batch_row` and `pg_after_members` between its writes,
//! and its purge batch `purge_after_rows` and `purge_after_checkpoint`.
//!
//! `CLAIMGATE_FAILPOINT=panic:NAME[:N]` panics (unwinds) the thread that reaches the point
//! instead of aborting, to prove a stage that panics stops the worker.
//!
//! `CLAIMGATE_FAILPOINT=slow:NAME[:N]` instead holds the thread that reaches the point for
//! [`SLOW_FOR`], once, so a test can make one step of one batch lose a race it all but always
//! wins: `before_locks` (a shared ledger's batch, before it takes its groups),
//! `relay_idle` (a relay's round that read nothing, before it decides whether to stop), and
//! `pg_ledger_id` (a shared ledger's `ledger_id`, its pooled connection checked out and not
//! yet used: a server restart then cuts a connection the pool has already vouched for).
//!
//! `CLAIMGATE_FAILPOINT=off:NAME` instead switches off a safeguard named `NAME` for the
//! process's whole life, so a test can prove that another safeguard holds on its own:
//! `heartbeat` (the worker never refreshes its in-flight entries' idle time).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How long `slow:NAME` holds the thread: long past anything a batch's other writer does
/// while it waits.
pub const SLOW_FOR: Duration = Duration::from_secs(1);

/// The environment variable that arms a failpoint.
pub const ENV: &str = "CLAIMGATE_FAILPOINT";

struct Armed {
    name: String,
    fire_on_hit: u64,
    hits: AtomicU64,
    fire: Fire,
}

/// What an armed point does when it is due.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fire {
    /// Abort the process: the crash the design must survive.
    Abort,
    /// `panic:NAME[:N]`: unwind the thread that reaches the point instead, to prove a stage
    /// that panics takes the worker down with it.
    Panic,
    /// `slow:NAME[:N]`: hold the thread for [`SLOW_FOR`], and go on.
    Slow,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var(ENV).ok()?;
            let (fire, spec) = if let Some(rest) = spec.strip_prefix("panic:") {
                (Fire::Panic, rest.to_owned())
            } else if let Some(rest) = spec.strip_prefix("slow:") {
                (Fire::Slow, rest.to_owned())
            } else {
                (Fire::Abort, spec)
            };
            let (name, nth) = match spec.split_once(':') {
                Some(("off", _)) => (spec.clone(), 1),
                Some((name, n)) => (name.to_owned(), n.parse().unwrap_or(1)),
                None => (spec, 1),
            };
            Some(Armed {
                name,
                fire_on_hit: nth.max(1),
                hits: AtomicU64::new(0),
                fire,
            })
        })
        .as_ref()
}

/// True when `name` is the armed point, for a caller that must set something up for the
/// point to be reached at all (`write_statement`'s statement watch).
pub fn armed_at(name: &str) -> bool {
    armed().is_some_and(|a| a.name == name)
}

/// True when the safeguard `name` is switched off (`CLAIMGATE_FAILPOINT=off:NAME`).
pub fn off(name: &str) -> bool {
    armed().is_some_and(|a| a.name.strip_prefix("off:") == Some(name))
}

/// Marks that execution reached `name`; aborts the process if that point is armed and due.
pub fn hit(name: &str) {
    let Some(armed) = armed() else { return };
    if armed.name != name {
        return;
    }
    if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.fire_on_hit {
        match armed.fire {
            Fire::Panic => {
                eprintln!("claimgate: failpoint {name} fired; panicking");
                panic!("failpoint {name} fired");
            }
            Fire::Slow => {
                eprintln!("claimgate: failpoint {name} fired; holding this thread");
                std::thread::sleep(SLOW_FOR);
            }
            Fire::Abort => {
                eprintln!("claimgate: failpoint {name} fired; aborting");
                std::process::abort();
            }
        }
    }
}
