//! The writer: one thread that takes parsed batches, merges what is waiting into one group
//! commit, and for each commit copies rejected entries to the dead-letter stream, records the
//! batch in one ledger transaction, and hands what committed to the acker (`acker.rs`), which
//! copies held entries and acknowledges while this thread records the next batch.
//!
//! **Invariant:** a batch reaches the acker only after the ledger transaction covering it has
//! committed, and its rejected entries' dead-letter copies were in Redis before that
//! transaction began; so every XACK follows its commit and its copy. An entry the ledger did
//! not commit is never acknowledged. An entry on its try alone past the delivery cap
//! (`Parsed::solo`) is committed in a transaction of its own; its quarantine mark is cleared
//! once it is acknowledged or left pending by a transient failure, and kept when the ledger
//! refused it, so its next delivery is dead-lettered. An entry a shared ledger deferred
//! (`Outcome::Deferred`) is neither acknowledged nor let go of: it stays in flight and is
//! offered again before anything that came after it.

use super::acker::Settled;
use super::dead_letters;
use super::parse::Parsed;
use super::quarantine;
use super::record::{item_of, record};
use super::Shared;
use crate::broker::stream::Conn;
use crate::config::{COMMIT_BYTES_MAX, COMMIT_ENTRIES_MAX};
use crate::error::Result;
use crate::ledger::{Item, Ledger, Outcome};
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
    acks: Sender<Settled>,
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
        // The waiting batches are gathered first and moved into one vector of the right size
        // once: entries are a few hundred bytes each, and growing the vector batch by batch
        // copied each merged commit several times over (measured: ~4% of the writer's time).
        let mut bytes: usize = batch.iter().map(|p| p.bytes).sum();
        let (mut len, mut waiting) = (batch.len(), Vec::new());
        while len < COMMIT_ENTRIES_MAX && bytes < COMMIT_BYTES_MAX {
            match rx.try_recv() {
                Ok(more) => {
                    bytes += more.iter().map(|p| p.bytes).sum::<usize>();
                    len += more.len();
                    waiting.push(more);
                }
                Err(_) => break,
            }
        }
        batch.reserve_exact(len - batch.len());
        for more in waiting {
            batch.extend(more);
        }
        // The reader hands an entry on its try alone on its own; kept apart here as well, so
        // no merge can ever put it in a transaction with anything else.
        let (solo, batch): (Vec<Parsed>, Vec<Parsed>) = if batch.iter().any(|p| p.solo) {
            batch.into_iter().partition(|p| p.solo)
        } else {
            (Vec::new(), batch)
        };
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
            match commit_and_hand_on(commit, ledger, &mut conn, shared, &acks)? {
                Some(deferred) => carried = deferred,
                None => return Ok(()),
            }
            if !carried.is_empty() {
                break;
            }
        }
        // After a deferral nothing later may commit first: it could be of the same group.
        carried.extend(commits.flatten());
    }
    Ok(())
}

/// The entries a shared ledger deferred, apart from the rest with their outcomes and commit
/// flags: (rest, their outcomes, their flags, deferred).
#[allow(clippy::type_complexity)]
fn split_deferred(
    batch: Vec<Parsed>,
    outcomes: Vec<Option<Outcome>>,
    committed: Vec<bool>,
) -> (Vec<Parsed>, Vec<Option<Outcome>>, Vec<bool>, Vec<Parsed>) {
    let (mut done, mut deferred) = (Vec::new(), Vec::new());
    let (mut done_outcomes, mut done_committed) = (Vec::new(), Vec::new());
    for ((p, o), c) in batch.into_iter().zip(outcomes).zip(committed) {
        if o == Some(Outcome::Deferred) {
            deferred.push(p);
        } else {
            done.push(p);
            done_outcomes.push(o);
            done_committed.push(c);
        }
    }
    (done, done_outcomes, done_committed, deferred)
}

/// Copies the batch's rejected entries to the dead-letter stream, commits it, and hands what
/// committed to the acker. A transient failure that outlasted shutdown leaves the batch
/// pending and is not an error. Returns the entries the ledger deferred, in order: still in
/// flight, to be offered again; `None` once the acker is gone (it failed for good and halted
/// the worker), when nothing more may be committed.
fn commit_and_hand_on(
    batch: Vec<Parsed>,
    ledger: &dyn Ledger,
    conn: &mut Conn,
    shared: &Shared<'_>,
    acks: &Sender<Settled>,
) -> Result<Option<Vec<Parsed>>> {
    let mut started = Instant::now();
    let result = dead_letters::copy_rejected(&batch, conn, shared).and_then(|()| {
        let items: Vec<Item<'_>> = batch.iter().map(item_of).collect();
        started = Instant::now();
        record(ledger, &items, shared)
    });
    let (outcomes, committed) = match result {
        Ok(recorded) => recorded,
        // Giving up during shutdown leaves the entries pending; they are redelivered later.
        Err(e) if e.is_transient() => {
            // A try alone cut short by a transient failure (at shutdown) did not fail.
            let solo: Vec<&str> = batch
                .iter()
                .filter(|p| p.solo)
                .map(|p| p.id.as_str())
                .collect();
            quarantine::unmark(conn, shared, &solo);
            shared.in_flight.release(batch.iter().map(|p| p.id.clone()));
            warn!("left {} entries pending for redelivery: {e}", batch.len());
            return Ok(Some(Vec::new()));
        }
        Err(e) => {
            shared.in_flight.release(batch.iter().map(|p| p.id.clone()));
            return Err(e);
        }
    };
    let committed_at = Instant::now();
    shared.metrics.observe_commit(committed_at - started);
    failpoint::hit("after_commit");
    // Only a shared ledger defers; the batch is split (its entries moved) only when it did.
    let (done, done_outcomes, done_committed, deferred) =
        if outcomes.contains(&Some(Outcome::Deferred)) {
            split_deferred(batch, outcomes, committed)
        } else {
            (batch, outcomes, committed, Vec::new())
        };
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
    let settled = Settled::new(done, done_outcomes, done_committed, started, committed_at);
    if let Err(unsent) = acks.send(settled) {
        // The acker stopped for good (it halted the worker): these stay pending, as after a
        // crash between commit and XACK, and are found claimed when redelivered.
        let unsent = unsent.into_inner();
        shared
            .in_flight
            .release(unsent.batch.iter().map(|p| p.id.clone()));
        shared
            .in_flight
            .release(deferred.iter().map(|p| p.id.clone()));
        return Ok(None);
    }
    Ok(Some(deferred))
}
