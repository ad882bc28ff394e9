//! The writer: one thread that takes parsed batches, merges what is waiting into one group
//! commit, and for each commit copies dead letters, records the batch in one ledger
//! transaction, copies held entries, and acknowledges.
//!
//! **Invariant:** the XACK of an entry is sent only after the ledger transaction covering it
//! has committed, and after its dead-letter copy (if any) is in Redis — in that order, never
//! another. An entry the ledger did not commit is never acknowledged. An entry on its try
//! alone past the delivery cap (`Parsed::solo`) is committed in a transaction of its own; its
//! quarantine mark is cleared once it is acknowledged or left pending by a transient failure,
//! and kept when the ledger refused it, so its next delivery is dead-lettered.

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
use log::warn;
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
    while let Ok(mut batch) = rx.recv() {
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
        if shared.wcfg.per_message {
            for one in batch {
                commit_and_ack(vec![one], ledger, &mut conn, shared, &reports)?;
            }
        } else if !batch.is_empty() {
            commit_and_ack(batch, ledger, &mut conn, shared, &reports)?;
        }
        for one in solo {
            commit_and_ack(vec![one], ledger, &mut conn, shared, &reports)?;
        }
    }
    Ok(())
}

/// Commits and acknowledges one batch, then lets go of its ids and hands it to the reporter.
/// A transient failure that outlasted shutdown leaves the batch pending and is not an error.
fn commit_and_ack(
    batch: Vec<Parsed>,
    ledger: &dyn Ledger,
    conn: &mut Conn,
    shared: &Shared<'_>,
    reports: &Sender<Committed>,
) -> Result<()> {
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
    shared.in_flight.release(batch.iter().map(|p| p.id.clone()));
    match result {
        Ok((outcomes, _)) => {
            reporter::send(reports, Committed { batch, outcomes }, shared);
            Ok(())
        }
        // Giving up during shutdown leaves the entries pending; they are redelivered later.
        Err(e) if e.is_transient() => {
            warn!("left {} entries pending for redelivery: {e}", batch.len());
            Ok(())
        }
        Err(e) => Err(e),
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
