//! The writers: a thread (or, for a ledger that takes concurrent writers, several, taking
//! their turns: `Turns`) that takes parsed batches, merges what is waiting into one group
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
use super::parse::{Batch, Parsed};
use super::quarantine;
use super::record::{item_of, record};
use super::shared::Shared;
use crate::broker::stream::Conn;
use crate::config::{COMMIT_BYTES_MAX, COMMIT_ENTRIES_MAX};
use crate::error::Result;
use crate::ledger::{Item, Ledger, Outcome};
use crate::support::failpoint;
use crossbeam_channel::{Receiver, Sender};
use log::{debug, warn};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// The order in which a worker's writers take their batches' groups (ledger contract point
/// 9): batches are numbered as they are taken, in the order read, and batch `n` starts
/// recording only once batch `n - 1` has let its turn go — when its groups were taken and
/// nothing deferred, or when it is done, its deferred items offered again included.
#[derive(Default)]
pub(super) struct Turns {
    /// Handoffs back in the order read, and the next batch's number. Held while a batch is
    /// taken, so numbers follow the read order.
    order: Mutex<Order>,
    /// The number whose turn it is.
    serving: Mutex<u64>,
    turned: Condvar,
}

/// The parse pool's output put back in the order read (`Handoff::seq`).
#[derive(Default)]
struct Order {
    /// The seq of the next handoff due.
    due: u64,
    /// Handoffs parsed before the one due.
    early: BTreeMap<u64, Vec<Parsed>>,
    /// The next batch's number.
    ticket: u64,
}

impl Order {
    /// The handoff due, waiting for it; `None` once the parse pool hung up.
    fn next(&mut self, rx: &Receiver<Batch>) -> Option<Vec<Parsed>> {
        self.due_from(|| rx.recv().ok())
    }

    /// The handoff due if it was parsed already, without waiting for it.
    fn next_ready(&mut self, rx: &Receiver<Batch>) -> Option<Vec<Parsed>> {
        self.due_from(|| rx.try_recv().ok())
    }

    /// The handoff due, taking handoffs from `more` only until it turns up: whatever is taken
    /// waits here, outside the channel's bound, so draining the channel whole let the reader
    /// and parse pool buffer a second channel's worth of entries (peak RSS 60 -> 77-84 MiB on
    /// the bench's (a) load).
    fn due_from(&mut self, mut more: impl FnMut() -> Option<Batch>) -> Option<Vec<Parsed>> {
        loop {
            if let Some(batch) = self.early.remove(&self.due) {
                self.due += 1;
                return Some(batch);
            }
            let (seq, batch) = more()?;
            // The parse pool hands each seq over once; one below the seq due, or twice, would
            // be recorded out of read order or never.
            assert!(
                seq >= self.due,
                "handoff {seq} arrived after it was due ({})",
                self.due
            );
            let twice = self.early.insert(seq, batch);
            assert!(twice.is_none(), "handoff {seq} arrived twice");
        }
    }
}

impl Turns {
    /// The next batch (the handoff due, with those after it that are ready merged into it, as
    /// one group commit) and its turn, once it has come; `None` once the parse pool hung up.
    fn take(&self, rx: &Receiver<Batch>) -> Option<(Vec<Parsed>, Turn<'_>)> {
        let (batch, ticket) = {
            let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
            let first = order.next(rx)?;
            let batch = gather(first, &mut order, rx);
            order.ticket += 1;
            (batch, order.ticket - 1)
        };
        let mut serving = self.serving.lock().unwrap_or_else(|p| p.into_inner());
        while *serving < ticket {
            serving = self.turned.wait(serving).unwrap_or_else(|p| p.into_inner());
        }
        assert_eq!(*serving, ticket, "a batch's turn came twice");
        Some((
            batch,
            Turn {
                turns: self,
                ticket,
                passed: false,
            },
        ))
    }
}

/// A batch's turn; let go at the latest when dropped, so a writer that fails or panics
/// never holds up the others.
struct Turn<'t> {
    turns: &'t Turns,
    ticket: u64,
    passed: bool,
}

impl Turn<'_> {
    fn pass(&mut self) {
        if self.passed {
            return;
        }
        self.passed = true;
        let mut serving = self.turns.serving.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(
            *serving, self.ticket,
            "a turn let go by a batch not holding it"
        );
        *serving += 1;
        self.turns.turned.notify_all();
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.pass();
    }
}

/// Group commit: `first` and the handoffs after it that are already parsed, up to the caps
/// (entries and bytes), so a backlog drains in large transactions while a quiet stream still
/// commits at once, and heavy entries never pile up in one commit.
fn gather(mut batch: Vec<Parsed>, order: &mut Order, rx: &Receiver<Batch>) -> Vec<Parsed> {
    // The waiting batches are gathered first and moved into one vector of the right size
    // once: entries are a few hundred bytes each, and growing the vector batch by batch
    // copied each merged commit several times over (measured: ~4% of the writer's time).
    let mut bytes: usize = batch.iter().map(|p| p.bytes).sum();
    let (mut len, mut waiting) = (batch.len(), Vec::new());
    while len < COMMIT_ENTRIES_MAX && bytes < COMMIT_BYTES_MAX {
        match order.next_ready(rx) {
            Some(more) => {
                bytes += more.iter().map(|p| p.bytes).sum::<usize>();
                len += more.len();
                waiting.push(more);
            }
            None => break,
        }
    }
    batch.reserve_exact(len - batch.len());
    for more in waiting {
        batch.extend(more);
    }
    batch
}

/// Commits batches until the parse pool hangs up; returns a permanent failure. Several
/// writers may share `rx` when the ledger takes them ([`crate::ledger::Ledger::writers`]);
/// `turns` keeps their batches' locking in the order read.
pub(super) fn run(
    rx: Receiver<Batch>,
    ledger: &dyn Ledger,
    mut conn: Conn,
    shared: &Shared<'_>,
    acks: Sender<Settled>,
    turns: &Turns,
) -> Result<()> {
    // Entries a shared ledger deferred (another batch holds their group), with everything
    // this round had not committed yet after them: offered again first, in the same turn,
    // ahead of anything read later and without waiting for the reader (ledger contract,
    // point 8). Nothing newer is merged into them: a batch read after them may be waiting
    // for its turn on another writer.
    let mut carried: Vec<Parsed> = Vec::new();
    let mut turn: Option<Turn<'_>> = None;
    loop {
        let batch = if carried.is_empty() {
            let Some((batch, taken)) = turns.take(&rx) else {
                break;
            };
            turn = Some(taken);
            batch
        } else {
            std::mem::take(&mut carried)
        };
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
        let count = commits.len();
        let mut commits = commits.into_iter();
        for (n, commit) in commits.by_ref().enumerate() {
            // The turn goes to the next batch as soon as the last commit of this one holds
            // its groups having deferred nothing; otherwise once this one is done.
            let last = n + 1 == count;
            let mut locked = |deferred: bool| {
                if last && !deferred {
                    if let Some(t) = turn.as_mut() {
                        t.pass();
                    }
                }
            };
            match commit_and_hand_on(commit, ledger, &mut conn, shared, &acks, &mut locked)? {
                Some(deferred) => carried = deferred,
                None => return Ok(()),
            }
            if !carried.is_empty() {
                break;
            }
        }
        // After a deferral nothing later may commit first: it could be of the same group.
        carried.extend(commits.flatten());
        if carried.is_empty() {
            turn = None;
        }
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
    locked: &mut dyn FnMut(bool),
) -> Result<Option<Vec<Parsed>>> {
    let mut started = Instant::now();
    let result = dead_letters::copy_rejected(&batch, conn, shared).and_then(|()| {
        let items: Vec<Item<'_>> = batch.iter().map(item_of).collect();
        started = Instant::now();
        record(ledger, &items, shared, &mut *locked)
    });
    let (outcomes, committed) = match result {
        Ok(recorded) => recorded,
        // Giving up during shutdown leaves the entries pending; they are redelivered later. A
        // ledger outage given up on because shutdown came is that too, not a failure.
        Err(e) if e.is_transient() || (shared.stopping() && e.is_ledger_outage()) => {
            // A try alone cut short by a transient failure (at shutdown) did not fail.
            let solo: Vec<&str> = batch
                .iter()
                .filter(|p| p.solo)
                .map(|p| p.id.as_str())
                .collect();
            quarantine::unmark(conn, shared.cfg, &solo);
            shared.in_flight.release(batch.iter().map(|p| p.id.clone()));
            warn!("left {} entries pending for redelivery: {e}", batch.len());
            return Ok(Some(Vec::new()));
        }
        // A failure that concerns no entry (the ledger's own, outlasting its limit): the worker
        // stops. An entry on its try alone did not fail, so its mark goes, or its next
        // delivery would count this try against it.
        Err(e) => {
            let solo: Vec<&str> = batch
                .iter()
                .filter(|p| p.solo)
                .map(|p| p.id.as_str())
                .collect();
            quarantine::unmark(conn, shared.cfg, &solo);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_handoff_is_taken_without_emptying_the_channel_behind_it() {
        // The parse threads finished handoff 1 before 0; 2 and 3 are parsed too. The writer
        // takes 1 and 0 to find the one due, and must leave 2 and 3 in the channel, whose
        // bound is what holds the reader back: taken, they would wait outside any bound.
        let (tx, rx) = crossbeam_channel::bounded::<Batch>(8);
        for seq in [1, 0, 2, 3] {
            tx.send((seq, Vec::new())).unwrap();
        }
        let mut order = Order::default();
        assert!(order.next_ready(&rx).is_some());
        assert_eq!(order.due, 1);
        assert_eq!(
            rx.len(),
            2,
            "only what came before the due handoff was taken"
        );
        assert_eq!(order.early.len(), 1, "handoff 1 waits, taken on the way");
        assert!(order.next_ready(&rx).is_some());
        assert_eq!((order.due, rx.len()), (2, 2));
        assert!(order.next_ready(&rx).is_some());
        assert!(order.next_ready(&rx).is_some());
        assert!(order.next_ready(&rx).is_none(), "nothing due left");
        assert_eq!(order.due, 4);
    }
}
