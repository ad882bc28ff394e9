//! The writer: one thread that takes parsed batches, merges what is waiting into one group
//! commit, and for each commit copies dead letters, records the batch in one ledger
//! transaction, copies held entries, and acknowledges.
//!
//! **Invariant:** the XACK of an entry is sent only after the ledger transaction covering it
//! has committed, and after its dead-letter copy (if any) is in Redis — in that order, never
//! another. An entry the ledger did not commit is never acknowledged. An entry on its try
//! alone past the delivery cap (`Parsed::solo`) is committed in a transaction of its own; its
//! quarantine mark is cleared once it is acknowledged or left pending by a transient failure,
//! and kept when the ledger refused it, so its next delivery is dead-lettered. An entry a
//! shared ledger deferred (`Outcome::Deferred`) is neither acknowledged nor let go of: it stays
//! in flight and is offered again before anything that came after it.

use super::dead_letters;
use super::parse::Parsed;
use super::quarantine;
use super::record::{item_of, record};
use super::reporter::{self, Committed};
use super::Shared;
use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::{self, Conn};
use crate::config::{COMMIT_BYTES_MAX, COMMIT_ENTRIES_MAX};
use crate::domain::clock::now_rfc3339;
use crate::domain::key::IdempotencyKey;
use crate::error::Result;
use crate::ledger::{Item, Ledger, Outcome};
use crate::observe::metrics::StageTimes;
use crate::support::failpoint;
use crossbeam_channel::{Receiver, Sender};
use log::{debug, warn};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Commits batches until the parse pool hangs up; returns a permanent failure.
pub(super) fn run(
    rx: Receiver<Vec<Parsed>>,
    ledger: &dyn Ledger,
    mut conn: Conn,
    shared: &Shared<'_>,
    reports: Sender<Committed>,
) -> Result<()> {
    // Entries a shared ledger deferred (another node's batch holds their group), with
    // everything this round had not committed yet after them: offered again first, ahead of
    // anything read later and without waiting for the reader (ledger contract, point 8).
    let mut carried: Vec<Parsed> = Vec::new();
    loop {
        let mut batch = if carried.is_empty() {
            match rx.recv() {
                Ok(batch) => batch,
                Err(_) => break,
            }
        } else {
            std::mem::take(&mut carried)
        };
        // Group commit: take whatever else is already waiting, up to the caps (entries and
        // bytes), so a backlog drains in large transactions while a quiet stream still commits
        // at once, and heavy entries never pile up in one commit.
        let mut bytes: usize = batch.iter().map(|p| p.bytes).sum();
        while batch.len() < COMMIT_ENTRIES_MAX && bytes < COMMIT_BYTES_MAX {
            match rx.try_recv() {
                Ok(more) => {
                    bytes += more.iter().map(|p| p.bytes).sum::<usize>();
                    batch.extend(more);
                }
                Err(_) => break,
            }
        }
        // The reader hands an entry on its try alone on its own; kept apart here as well, so
        // no merge can ever put it in a transaction with anything else.
        let (solo, batch): (Vec<Parsed>, Vec<Parsed>) = batch.into_iter().partition(|p| p.solo);
        let mut commits: Vec<Vec<Parsed>> = if shared.wcfg.per_message {
            batch.into_iter().map(|one| vec![one]).collect()
        } else if batch.is_empty() {
            Vec::new()
        } else {
            vec![batch]
        };
        commits.extend(solo.into_iter().map(|one| vec![one]));
        let mut commits = commits.into_iter();
        for commit in commits.by_ref() {
            carried = commit_and_ack(commit, ledger, &mut conn, shared, &reports)?;
            if !carried.is_empty() {
                break;
            }
        }
        // After a deferral nothing later may commit first: it could be of the same group.
        carried.extend(commits.flatten());
    }
    Ok(())
}

/// Commits and acknowledges one batch, then lets go of its ids and hands it to the reporter.
/// A transient failure that outlasted shutdown leaves the batch pending and is not an error.
/// Returns the entries the ledger deferred, in order: still in flight, to be offered again.
fn commit_and_ack(
    batch: Vec<Parsed>,
    ledger: &dyn Ledger,
    conn: &mut Conn,
    shared: &Shared<'_>,
    reports: &Sender<Committed>,
) -> Result<Vec<Parsed>> {
    let result = commit_in_order(&batch, ledger, conn, shared);
    let unmark: Vec<&str> = match &result {
        // Acknowledged past the cap: paid, a duplicate or dead-lettered; the mark is done with.
        // Refused on its try alone: the mark stays and counts that try.
        Ok((_, committed)) => batch
            .iter()
            .zip(committed)
            .filter(|(p, acked)| **acked && p.delivery_count > shared.wcfg.max_deliveries)
            .map(|(p, _)| p.id.as_str())
            .collect(),
        // A try alone cut short by a transient failure (at shutdown) did not fail.
        Err(e) if e.is_transient() => batch
            .iter()
            .filter(|p| p.solo)
            .map(|p| p.id.as_str())
            .collect(),
        Err(_) => Vec::new(),
    };
    quarantine::unmark(conn, shared, &unmark);
    match result {
        Ok((outcomes, _)) => {
            let (mut done, mut deferred) = (Vec::new(), Vec::new());
            let mut done_outcomes = Vec::new();
            for (p, o) in batch.into_iter().zip(outcomes) {
                if o == Some(Outcome::Deferred) {
                    deferred.push(p);
                } else {
                    done.push(p);
                    done_outcomes.push(o);
                }
            }
            if !deferred.is_empty() {
                debug!(
                    "{} entries deferred: another node's batch holds their group; offered again next",
                    deferred.len()
                );
                shared
                    .metrics
                    .deferred
                    .fetch_add(deferred.len() as u64, Ordering::Relaxed);
            }
            shared.in_flight.release(done.iter().map(|p| p.id.clone()));
            let committed = Committed {
                batch: done,
                outcomes: done_outcomes,
            };
            reporter::send(reports, committed, shared);
            Ok(deferred)
        }
        // Giving up during shutdown leaves the entries pending; they are redelivered later.
        Err(e) if e.is_transient() => {
            shared.in_flight.release(batch.iter().map(|p| p.id.clone()));
            warn!("left {} entries pending for redelivery: {e}", batch.len());
            Ok(Vec::new())
        }
        Err(e) => {
            shared.in_flight.release(batch.iter().map(|p| p.id.clone()));
            Err(e)
        }
    }
}

/// Dead letters out, one transaction in, held entries out, then XACK — in that order, never
/// another. Returns each entry's outcome (`None` where the ledger refused it) and whether it
/// was committed and acknowledged.
fn commit_in_order(
    batch: &[Parsed],
    ledger: &dyn Ledger,
    conn: &mut Conn,
    shared: &Shared<'_>,
) -> Result<(Vec<Option<Outcome>>, Vec<bool>)> {
    dead_letters::copy_rejected(batch, conn, shared)?;
    let items: Vec<Item<'_>> = batch.iter().map(item_of).collect();
    let started = Instant::now();
    let (outcomes, committed) = record(ledger, &items, shared)?;
    drop(items);
    let committed_at = Instant::now();
    shared.metrics.observe_commit(committed_at - started);
    failpoint::hit("after_commit");
    dead_letters::copy_held(batch, &outcomes, conn, shared)?;
    acknowledge(batch, &committed, conn, shared)?;
    let acked = Instant::now();
    for (p, _) in batch.iter().zip(&committed).filter(|(_, ok)| **ok) {
        shared.metrics.stages.observe(&StageTimes {
            read: p.read_at,
            parsed: p.parsed_at,
            commit_began: started,
            committed: committed_at,
            acked,
        });
    }
    if let Some(filter) = &shared.filter {
        mark_committed(filter, conn, batch, &outcomes);
    }
    Ok((outcomes, committed))
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
