//! Step 6 of a PostgreSQL batch (`batch.rs`): placing committed batches in the audit chain,
//! one `claimgate_link` call each (`schema_postgres.sql`), and how long each held the chain
//! head.

use super::connect::Conn;
use crate::error::Result;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Step 6, on its own: one statement, so PostgreSQL commits it before it answers. `$2` is the
/// writer's own batch, or NULL for the oldest batch not linked yet that no writer holds.
const LINK: &str = "SELECT linked, waited_us, held_us FROM claimgate_link($1, $2)";

/// How long each link held the chain-head row lock, in microseconds: from its compare-and-set
/// inside `claimgate_link` to the end of the function's work, on the server's clock (the
/// commit after it writes no WAL to disk), and, as an upper bound of the whole hold, the call's
/// time less what came before that try (which also counts the round trip and this process's
/// scheduling). For the summary [`head_hold`] gives, the benchmark's figures. Bounded: past
/// [`HEAD_HOLDS_MAX`] samples the oldest half is dropped.
static HEAD_HOLDS_US: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());

/// Samples kept for [`head_hold`].
const HEAD_HOLDS_MAX: usize = 1 << 20;

/// Percentiles of one kind of duration, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    /// Median.
    pub p50: u32,
    /// 99th percentile.
    pub p99: u32,
    /// Largest.
    pub max: u32,
}

impl Spread {
    fn of(mut v: Vec<u32>) -> Spread {
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Spread {
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// The chain-head lock's hold time over the links this process made so far, on the server's
/// clock, and its upper bound seen from here: `(links, hold, bound)`, or `None` before the
/// first.
pub fn head_hold() -> Option<(usize, Spread, Spread)> {
    let v = HEAD_HOLDS_US
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    let (hold, bound) = v.into_iter().unzip();
    Some((n, Spread::of(hold), Spread::of(bound)))
}

fn note_head_hold(held: Duration, bound: Duration) {
    let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
    let mut v = HEAD_HOLDS_US.lock().unwrap_or_else(|p| p.into_inner());
    if v.len() >= HEAD_HOLDS_MAX {
        v.drain(..HEAD_HOLDS_MAX / 2);
    }
    v.push((us(held), us(bound)));
}

/// Step 6 for `batch`, which this process just committed: [`link`]. A transient failure
/// leaves the batch committed and unlinked — its outcomes stand — and says so: a node's start
/// or a relay round places it. A permanent one (the ledger's tables edited so that no link can
/// be sealed) is the caller's to report.
pub(super) fn link_committed(conn: &mut Conn, batch: i64) -> Result<()> {
    match link(conn, Some(batch)) {
        Ok(_) => Ok(()),
        Err(e) if e.is_transient() => {
            log::warn!(
                "batch {batch} is committed but could not be linked into the audit chain yet \
                 ({e}); its effects stand, and a node's start or a relay round links it"
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Links `batch`, or with `None` the committed batches not linked yet (`claimgate_link`, one
/// per call, oldest first, skipping those a writer is linking: as many calls as there were
/// such batches when it began, or until one finds none left), and notes how long each link
/// held the chain head. Returns how many it linked.
pub(super) fn link(conn: &mut Conn, batch: Option<i64>) -> Result<i32> {
    if batch.is_some() {
        return link_one(conn, batch);
    }
    let st = conn.prepared("SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL")?;
    let unlinked: i64 = conn.client.query_one(&st, &[])?.get(0);
    let mut linked = 0;
    for _ in 0..unlinked {
        match link_one(conn, None)? {
            0 => break,
            n => linked += n,
        }
    }
    Ok(linked)
}

/// One call of `claimgate_link`.
fn link_one(conn: &mut Conn, batch: Option<i64>) -> Result<i32> {
    let st = conn.prepared(LINK)?;
    let now = crate::domain::clock::now_rfc3339();
    let called = Instant::now();
    let row = conn.client.query_one(&st, &[&now, &batch])?;
    let elapsed = called.elapsed();
    let (linked, waited_us, held_us): (i32, i64, i64) = (row.get(0), row.get(1), row.get(2));
    if linked > 0 {
        // Held from the head's compare-and-set inside the call to the end of the statement's
        // commit, which writes no WAL to disk: the update itself (server clock) and a commit
        // record's insertion. Bounded above by the call's time less what came before that
        // try, which also counts the round trip and this process's scheduling.
        let waited = Duration::from_micros(waited_us.max(0) as u64);
        let in_function = Duration::from_micros(held_us.max(0) as u64);
        note_head_hold(in_function, elapsed.saturating_sub(waited));
    }
    Ok(linked)
}
