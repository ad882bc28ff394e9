//! The acker: one thread that takes the writer's committed batches and, for each, copies its
//! held entries to the dead-letter stream, acknowledges it, and lets go of its ids, while the
//! writer is already recording the next batch.
//!
//! Its own stage so that the writer's next transaction overlaps this batch's round trips to
//! Redis instead of waiting for them (BENCHMARKS.md, "The acknowledgement off the writer").
//!
//! **Invariant:** everything that arrives here was committed by the ledger before it was sent
//! (the writer sends nothing else), so an XACK sent here follows its commit; within a batch the
//! order is held copies out, then XACK, then the ids let go, then the reporter — never
//! another. Batches are acknowledged in the order they were committed. An entry the ledger
//! refused is not acknowledged; it is let go of (left pending, redelivered later).

use super::dead_letters;
use super::parse::Parsed;
use super::quarantine;
use super::reporter::{self, Committed};
use super::shared::Shared;
use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::{self, Conn};
use crate::domain::clock::now_rfc3339;
use crate::domain::key::IdempotencyKey;
use crate::error::Result;
use crate::ledger::Outcome;
use crate::observe::metrics::StageTimes;
use crossbeam_channel::{Receiver, Sender};
use log::warn;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A batch whose transaction has committed, on its way to be acknowledged.
pub(super) struct Settled {
    /// The entries, in stream order (none of them deferred).
    pub(super) batch: Vec<Parsed>,
    /// Each entry's outcome; `None` where the ledger refused it.
    pub(super) outcomes: Vec<Option<Outcome>>,
    /// Whether each entry was committed (and so is to be acknowledged).
    pub(super) committed: Vec<bool>,
    /// When its transaction began.
    pub(super) commit_began: Instant,
    /// When its transaction had committed.
    pub(super) committed_at: Instant,
}

impl Settled {
    /// Checks the shape every later step pairs entries with outcomes by.
    pub(super) fn new(
        batch: Vec<Parsed>,
        outcomes: Vec<Option<Outcome>>,
        committed: Vec<bool>,
        commit_began: Instant,
        committed_at: Instant,
    ) -> Self {
        assert!(
            batch.len() == outcomes.len() && batch.len() == committed.len(),
            "a settled batch pairs {} entries with {} outcomes and {} commit flags",
            batch.len(),
            outcomes.len(),
            committed.len()
        );
        assert!(
            outcomes.iter().all(|o| *o != Some(Outcome::Deferred)),
            "a deferred entry was handed to the acker: it is the writer's to offer again"
        );
        Settled {
            batch,
            outcomes,
            committed,
            commit_began,
            committed_at,
        }
    }
}

/// Acknowledges batches until the writer hangs up; returns a permanent failure.
pub(super) fn run(
    rx: Receiver<Settled>,
    mut conn: Conn,
    shared: &Shared<'_>,
    reports: Sender<Committed>,
) -> Result<()> {
    for settled in rx {
        settle(settled, &mut conn, shared, &reports)?;
    }
    Ok(())
}

/// Held copies out, XACK, quarantine marks cleared, ids let go, batch to the reporter. A
/// transient failure that outlasted shutdown leaves the batch pending and is not an error.
fn settle(
    s: Settled,
    conn: &mut Conn,
    shared: &Shared<'_>,
    reports: &Sender<Committed>,
) -> Result<()> {
    let result = dead_letters::copy_held(&s.batch, &s.outcomes, conn, shared)
        .and_then(|()| acknowledge(&s.batch, &s.committed, conn, shared));
    let unmark: Vec<&str> = match &result {
        // Acknowledged past the cap: paid, a duplicate or dead-lettered; the mark is done with.
        // Refused on its try alone: the mark stays and counts that try.
        Ok(()) => s
            .batch
            .iter()
            .zip(&s.committed)
            .filter(|(p, acked)| **acked && p.delivery_count > shared.wcfg.max_deliveries)
            .map(|(p, _)| p.id.as_str())
            .collect(),
        // A try alone cut short by a transient failure (at shutdown) did not fail.
        Err(e) if e.is_transient() => s
            .batch
            .iter()
            .filter(|p| p.solo)
            .map(|p| p.id.as_str())
            .collect(),
        Err(_) => Vec::new(),
    };
    quarantine::unmark(conn, shared.cfg, &unmark);
    shared
        .in_flight
        .release(s.batch.iter().map(|p| p.id.clone()));
    match result {
        Ok(()) => {
            let acked = Instant::now();
            for (p, _) in s.batch.iter().zip(&s.committed).filter(|(_, ok)| **ok) {
                shared.metrics.stages.observe(&StageTimes {
                    read: p.read_at,
                    parsed: p.parsed_at,
                    commit_began: s.commit_began,
                    committed: s.committed_at,
                    acked,
                });
            }
            if let Some(filter) = &shared.filter {
                mark_committed(filter, conn, &s.batch, &s.outcomes);
            }
            let committed = Committed {
                batch: s.batch,
                outcomes: s.outcomes,
            };
            reporter::send(reports, committed, shared.metrics);
            Ok(())
        }
        // Giving up during shutdown leaves the entries pending; they are redelivered later
        // and found claimed.
        Err(e) if e.is_transient() => {
            warn!(
                "left {} committed entries pending for redelivery: {e}",
                s.batch.len()
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// XACKs the entries whose transaction committed, retrying until Redis takes it.
fn acknowledge(
    batch: &[Parsed],
    committed: &[bool],
    conn: &mut Conn,
    shared: &Shared<'_>,
) -> Result<()> {
    let cfg = shared.cfg;
    let ack_ids: Vec<&str> = batch
        .iter()
        .zip(committed)
        .filter(|(_, ok)| **ok)
        .map(|(p, _)| p.id.as_str())
        .collect();
    shared.retry("acknowledging entries", || {
        stream::ack(conn, &cfg.stream, &cfg.group, &ack_ids)
    })?;
    shared
        .metrics
        .acked
        .fetch_add(ack_ids.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// After the commit: marks every key the ledger now holds that no marker vouched for yet.
fn mark_committed(
    filter: &FastFilter,
    conn: &mut Conn,
    batch: &[Parsed],
    outcomes: &[Option<Outcome>],
) {
    let keys: Vec<IdempotencyKey> = batch
        .iter()
        .zip(outcomes)
        .filter(|(p, o)| {
            p.committed_by.is_none()
                && matches!(o, Some(Outcome::Processed | Outcome::Duplicate { .. }))
        })
        .filter_map(|(p, _)| p.valid_key())
        .collect();
    filter.mark(conn, &keys, &now_rfc3339());
}
