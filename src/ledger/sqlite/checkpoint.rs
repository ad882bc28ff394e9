//! WAL checkpoints on a thread of their own, off the writer's commit path.
//!
//! By default SQLite checkpoints inside whichever commit pushes the WAL past 1,000 pages. With
//! group commit nearly every commit does, so the writer spent about 30% of its time copying
//! pages back into the database file and fsyncing it (measured; see BENCHMARKS.md). Here the
//! worker's connections run with `wal_autocheckpoint = 0` and this thread checkpoints instead:
//! PASSIVE every [`CHECKPOINT_INTERVAL_MS`], which never blocks the writer, and, once the WAL
//! is past [`WAL_FRAMES_SOFT_MAX`] (under a steady writer a passive checkpoint never finds
//! the log fully copied, so the log would never start over), a RESTART right behind it when
//! it left little to copy, waiting at most [`RESTART_WAIT`]. Durability is
//! unchanged: commits still fsync the WAL (synchronous=FULL); a checkpoint only moves
//! already-durable pages.
//!
//! A checkpoint that fails (a full disk, an I/O error) is one episode of the shared retry
//! policy: one WARN when failures start, one INFO when a checkpoint works again, and the
//! backoff between tries (issue 39: a full disk logged a WARN every 250 ms, onto a journal that
//! is likely on the same disk).
//!
//! Invariant: this module never writes a row; it only moves committed pages.

use crate::config::{LedgerConfig, SqliteSettings};
use crate::error::{Error, Result};
use crate::retry::Episode;
use crate::support::Shutdown;
use log::debug;
use rusqlite::Connection;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the background thread runs a passive checkpoint.
pub const CHECKPOINT_INTERVAL_MS: u64 = 250;
/// WAL length, in frames (pages), above which a passive checkpoint is followed by a RESTART:
/// 16,384 frames is 64 MiB at the default 4 KiB page.
pub const WAL_FRAMES_SOFT_MAX: i64 = 16_384;
/// The most frames a passive checkpoint may leave uncopied for a RESTART to follow it: what
/// the RESTART copies while it holds the writer back (4 MiB at 4 KiB pages, tens of ms).
pub const RESTART_BEHIND_FRAMES_MAX: i64 = 1_024;
/// How long a RESTART waits, holding the writer back, for the writer's lock and for readers
/// still reading the log; busy after that, it is tried again at the next round.
pub const RESTART_WAIT: Duration = Duration::from_millis(50);

/// A running background checkpointer; stops (after one last checkpoint) when dropped.
pub struct Checkpointer {
    /// Asks the thread to finish (and wakes it from its wait between checkpoints).
    stop: Shutdown,
    /// The thread, joined on drop.
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens a connection of its own to the ledger in the file `cfg.backend.path` and starts
    /// checkpointing.
    pub fn start(cfg: &LedgerConfig<SqliteSettings>) -> Result<Checkpointer> {
        let conn = Connection::open(&cfg.backend.path)?;
        let busy = Duration::from_millis(cfg.busy_timeout_ms);
        conn.busy_timeout(busy)?;
        let stop = Shutdown::new();
        let asked = stop.clone();
        let thread = std::thread::Builder::new()
            .name("checkpointer".into())
            .spawn(move || run(&conn, &asked, busy))
            .map_err(|e| Error::io("starting the checkpoint thread", e))?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(conn: &Connection, stop: &Shutdown, busy: Duration) {
    let interval = Duration::from_millis(CHECKPOINT_INTERVAL_MS);
    let mut episode = Episode::new("checkpointing the ledger");
    while !stop.is_set() {
        let started = Instant::now();
        let result = round(conn, busy);
        let wait = match result {
            Ok(()) => {
                episode.succeeded();
                interval
            }
            // Never fatal: the WAL keeps every commit durable, so a missed checkpoint only
            // means a longer WAL until the next one. Failing, it waits longer between tries.
            Err(e) => episode.failed(&e).max(interval),
        };
        stop.wait_until(started + wait);
    }
    // Leave a short WAL behind for whoever opens the ledger next.
    if let Err(e) = checkpoint(conn, "TRUNCATE") {
        debug!("the last checkpoint failed: {e}");
    }
}

/// One round: a passive checkpoint and, when the WAL is long and that pass nearly caught up, a
/// RESTART right behind it, waiting at most [`RESTART_WAIT`]; `conn`'s busy timeout is `busy`
/// again afterwards. Run by the checkpointer every [`CHECKPOINT_INTERVAL_MS`], and by a long
/// read between its steps ([`Between`]).
pub(super) fn round(conn: &Connection, busy: Duration) -> Result<()> {
    // A passive checkpoint never blocks the writer, but under a steady stream of commits
    // it rarely finds the log fully copied, so the WAL would never start over. Once it is
    // long, a RESTART right behind the passive pass copies only the last commit or two,
    // briefly holding the writer back, and lets the next commit reuse the log from the top.
    //
    // Only right behind one that nearly caught up, and never waiting long: a RESTART holds
    // the writer back for all it copies and, the busy timeout long, for as long as a reader
    // still reads the log. A long read (a purge's export, `verify`, `backup`) keeps the
    // passive pass from copying past its snapshot; the RESTART that followed then copied
    // 25,000 frames (0.6-0.9 s) or waited out the reader (up to the 5 s busy timeout) with
    // every commit of the worker stopped behind it (BENCHMARKS.md, purge under load).
    let (wal_frames, copied) = checkpoint(conn, "PASSIVE")?;
    if wal_frames > WAL_FRAMES_SOFT_MAX && wal_frames - copied <= RESTART_BEHIND_FRAMES_MAX {
        conn.busy_timeout(RESTART_WAIT)?;
        let restarted = checkpoint(conn, "RESTART");
        conn.busy_timeout(busy)?;
        restarted?;
    }
    Ok(())
}

/// Checkpoint rounds for a long read made in steps, each step a read transaction of its own
/// (a purge's export and its key map). Steps back to back are always a reader of the log, so
/// the checkpointer's RESTART, which waits at most [`RESTART_WAIT`] for readers to leave it,
/// seldom found none: beside a worker, a purge of a year of a 10,000,000-claim ledger grew the
/// WAL to 3.8 GB, which stays that size on disk until the worker stops (BENCHMARKS.md). Between
/// two steps, the one moment it is sure to read nothing, the reader runs a round itself, at
/// most every [`CHECKPOINT_INTERVAL_MS`].
pub(super) struct Between {
    /// The connection's busy timeout, set again after a RESTART's shorter one.
    busy: Duration,
    /// When the last round ran (or the read began).
    last: Instant,
}

impl Between {
    pub(super) fn new(busy: Duration) -> Between {
        Between {
            busy,
            last: Instant::now(),
        }
    }

    /// Between two steps of the read on `conn`, which has no transaction open.
    pub(super) fn steps(&mut self, conn: &Connection) {
        assert!(
            conn.is_autocommit(),
            "a checkpoint round between steps ran inside a transaction, which would keep its \
             own snapshot in the log"
        );
        if self.last.elapsed() < Duration::from_millis(CHECKPOINT_INTERVAL_MS) {
            return;
        }
        // Never fatal, as in the checkpointer: a missed round only leaves a longer WAL. One
        // that found another checkpoint running reads busy, not an error.
        if let Err(e) = round(conn, self.busy) {
            debug!("a checkpoint between two steps of a read failed: {e}");
        }
        self.last = Instant::now();
    }
}

/// One checkpoint; returns the WAL's length in frames and how many of them are copied.
fn checkpoint(conn: &Connection, mode: &str) -> Result<(i64, i64)> {
    let started = Instant::now();
    let (busy, log_frames, copied_frames) =
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
    debug!(
        "checkpoint {mode}: busy={busy} wal_frames={log_frames} copied={copied_frames} in {:?}",
        started.elapsed()
    );
    Ok((log_frames, copied_frames))
}
