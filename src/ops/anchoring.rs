//! `claimgate run --anchor-every DURATION`: anchors taken on a schedule beside the worker,
//! appended to a file (`--anchor-out`) and/or added to a Redis stream (`--anchor-stream`), and
//! once more when the worker stops, so the last thing it committed is pinned too.
//!
//! A failed anchor is logged (one WARN line per episode, `retry::Episode`) and retried with the
//! shared backoff. A failure that will not clear stops the worker, which then exits 1: a
//! permanent error (the stream key holds another type, Redis refuses the permission, the chain
//! no longer verifies) at once; a transient one (disk full, Redis unreachable) once it has kept
//! anchors from being written for [`OVERDUE_INTERVALS_MAX`] intervals (at least
//! [`OVERDUE_MS_MIN`]). A worker never runs on
//! silently without the evidence it was told to keep.
//!
//! Invariant: this thread only reads the ledger (through `ops::evidence::take`) and writes
//! only the anchors file and the anchors stream.

use crate::broker::stream::{self, Conn};
use crate::domain::anchor::Anchor;
use crate::domain::signing::SigningKey;
use crate::error::{Error, Result};
use crate::ledger::Backend;
use crate::retry::Episode;
use crate::support::threads::spawn_named;
use crate::support::Shutdown;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How many intervals an anchor may stay unwritten through transient failures before the
/// worker is stopped (but never less than [`OVERDUE_MS_MIN`]).
pub const OVERDUE_INTERVALS_MAX: u32 = 3;
/// However short the interval, a transient failure is waited out this long first: a Redis
/// restart or a brief full disk should not stop a worker that anchors every second.
pub const OVERDUE_MS_MIN: u64 = 60_000;
/// Shortest interval accepted: an anchor walks the whole chain.
pub const EVERY_MS_MIN: u64 = 100;

/// What `run` was told about anchors. No `Debug`: it holds the Redis URL and the signing key.
pub struct Schedule {
    /// Time between anchors.
    pub every: Duration,
    /// `--anchor-out`: append each anchor to this file (0600, created if absent).
    pub out: Option<PathBuf>,
    /// `--anchor-stream`: XADD each anchor (field `anchor`) to this stream, never trimmed.
    pub stream: Option<String>,
    /// Redis URL for the stream (never logged whole).
    pub redis_url: String,
    /// `--signing-key`: sign every anchor.
    pub key: Option<SigningKey>,
}

/// Runs `work` (the worker) with anchors taken beside it on `schedule`, if any. A permanent
/// anchoring failure calls `on_failure` and asks the worker to stop (`shutdown`); `run`
/// then exits 1 with the anchoring error. Every anchor written calls `on_anchor` (the
/// metrics' "last anchor" time). When `work` returns, one last anchor is written.
pub fn alongside<T>(
    schedule: Option<&Schedule>,
    ledger: &dyn Backend,
    shutdown: &Shutdown,
    on_failure: &(dyn Fn(&Error) + Sync),
    on_anchor: &(dyn Fn() + Sync),
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(schedule) = schedule else {
        return work();
    };
    // Not the shutdown: a signal stops the worker, and only once it has returned (its last
    // commit made) is the last anchor taken, so that anchor pins everything it committed.
    let done = Shutdown::new();
    std::thread::scope(|s| {
        let anchors = spawn_named(s, "anchoring", || {
            let result = run(schedule, ledger, shutdown, &done, on_anchor);
            if let Err(e) = &result {
                on_failure(e);
                log::error!("anchoring failed: {e}; stopping the worker");
                shutdown.trigger();
            }
            result
        });
        let worked = work();
        done.trigger();
        let anchored = anchors
            .join()
            .unwrap_or_else(|_| Err(Error::Other("anchoring thread panicked".into())));
        let value = worked?;
        anchored.map(|()| value)
    })
}

/// The anchoring loop: one anchor per interval, one more once `done` (the worker has returned).
/// Its wait for the next anchor is on `done`, so the last anchor is taken at once.
fn run(
    schedule: &Schedule,
    ledger: &dyn Backend,
    shutdown: &Shutdown,
    done: &Shutdown,
    on_anchor: &(dyn Fn() + Sync),
) -> Result<()> {
    let mut conn = match &schedule.stream {
        Some(_) => Some(Conn::new(stream::client(&schedule.redis_url)?)),
        None => None,
    };
    let mut episode = Episode::new("writing an anchor");
    let mut due = Instant::now() + schedule.every;
    // After a failure: when to try again (the shared backoff), even once the worker is done.
    let mut retry_at: Option<Instant> = None;
    let mut last_written = Instant::now();
    let overdue_after =
        (schedule.every * OVERDUE_INTERVALS_MAX).max(Duration::from_millis(OVERDUE_MS_MIN));
    loop {
        let finishing = done.is_set();
        let next = match (finishing, retry_at) {
            (_, Some(at)) => Some(at),
            (false, None) => Some(due),
            (true, None) => None,
        };
        if let Some(at) = next.filter(|at| Instant::now() < *at) {
            if finishing {
                // A retry's backoff after the worker has returned: nothing left to wake for.
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
            } else {
                done.wait_until(at);
            }
            continue;
        }
        match write_one(schedule, ledger, conn.as_mut()) {
            Ok(anchor) => {
                episode.succeeded();
                log::info!(
                    "anchor written: seq {} hash {} ({} records)",
                    anchor.seq,
                    anchor.hash,
                    anchor.records
                );
                on_anchor();
                retry_at = None;
                last_written = Instant::now();
                due = last_written + schedule.every;
                if finishing {
                    return Ok(());
                }
            }
            Err(e) => {
                let overdue = last_written.elapsed() > overdue_after;
                // Once the worker has stopped (or is being stopped by a signal), a last anchor
                // gets the few tries shutdown grants every step, then its error stands.
                let stopping = finishing || shutdown.is_set();
                let tries_left = episode.failures() < crate::config::SHUTDOWN_FAILURES_MAX;
                if !e.is_transient() || overdue || (stopping && !tries_left) {
                    return Err(e);
                }
                retry_at = Some(Instant::now() + episode.failed(&e));
            }
        }
    }
}

/// Takes one anchor and writes it everywhere it goes.
fn write_one(schedule: &Schedule, ledger: &dyn Backend, conn: Option<&mut Conn>) -> Result<Anchor> {
    let anchor = crate::ops::evidence::take(ledger, schedule.key.as_ref())?;
    if let Some(path) = &schedule.out {
        crate::ops::evidence::append(path, &anchor)?;
    }
    if let (Some(conn), Some(key)) = (conn, &schedule.stream) {
        let _: String = conn.query(
            redis::cmd("XADD")
                .arg(key)
                .arg("*")
                .arg("anchor")
                .arg(anchor.to_line()),
        )?;
    }
    Ok(anchor)
}
