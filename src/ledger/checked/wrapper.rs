//! [`Checked`]: every trait of `ledger/mod.rs` implemented by delegating to the inner ledger,
//! with the contract's promises checked on the way back.

use super::outcomes::{self, Known};
use crate::config::OnConflict;
use crate::domain::audit::{Kind, Record};
use crate::error::Result;
use crate::ledger::{
    AuditLog, Backup, BackupCopied, Decided, HeldConflict, Hold, HoldDecision, Inspect, Item,
    Ledger, LetterState, Outbox, OutboxRow, Outcome, PurgePlan, Removed, Retention, Review, Since,
    Stats, Summary, Verdict,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A ledger whose every answer is checked against the contract; see the module doc.
/// Clones share what was seen, as clones of the inner ledger share the ledger.
#[derive(Clone)]
pub struct Checked<L> {
    /// The ledger that answers.
    inner: L,
    /// The conflict policy `inner` was opened with, when known (a hold under `record` is a
    /// broken promise).
    on_conflict: Option<OnConflict>,
    /// What earlier answers said, for the checks that compare one answer with the next.
    seen: Arc<Seen>,
}

/// What a ledger's earlier answers said, through this handle (and its clones).
#[derive(Default)]
struct Seen {
    /// Each events stream's published mark, once this handle marked rows published to it
    /// (only ever raised from then on; before, a ledger of an earlier release answers from
    /// its rows, which another relay's first mark can lower).
    published: Mutex<HashMap<String, i64>>,
    /// The ledger's identity, once it was answered: never changes.
    ledger_id: OnceLock<String>,
    /// The highest `stats().tombstones` seen: tombstones are never removed.
    tombstones: AtomicU64,
    /// The highest claims plus tombstones seen: a purge turns claims into tombstones, one
    /// for one, and nothing else removes a claim.
    claimed_ever: AtomicU64,
}

impl<L> Checked<L> {
    /// Wraps `inner`, opened with the conflict policy `on_conflict` (`None`: not known).
    pub fn wrap(inner: L, on_conflict: Option<OnConflict>) -> Self {
        Checked {
            inner,
            on_conflict,
            seen: Arc::default(),
        }
    }

    /// The ledger inside, unchecked.
    pub fn inner(&self) -> &L {
        &self.inner
    }
}

impl<L: Ledger> Checked<L> {
    /// What the outcome checks need to know of the inner ledger.
    fn known(&self) -> Known {
        Known {
            writers: self.inner.writers(),
            on_conflict: self.on_conflict,
        }
    }
}

impl<L: Ledger> Ledger for Checked<L> {
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>> {
        let got = self.inner.record(items, consumer, stream)?;
        outcomes::check(items, &got, self.known());
        Ok(got)
    }

    fn writers(&self) -> usize {
        self.inner.writers()
    }

    fn record_in_turn(
        &self,
        items: &[Item<'_>],
        consumer: &str,
        stream: &str,
        locked: &mut dyn FnMut(bool),
    ) -> Result<Vec<Outcome>> {
        let mut said = None;
        let mut hook = |deferred_any: bool| {
            assert!(
                said.is_none(),
                "ledger contract point 9: a batch called its locked hook twice"
            );
            said = Some(deferred_any);
            locked(deferred_any)
        };
        let got = self
            .inner
            .record_in_turn(items, consumer, stream, &mut hook)?;
        outcomes::check(items, &got, self.known());
        outcomes::check_locked(said, &got);
        Ok(got)
    }

    fn stats(&self) -> Result<Stats> {
        let stats = self.inner.stats()?;
        assert!(
            stats.disbursed_cents_total >= 0,
            "ledger stats: disbursed total {} is negative, yet every amount is positive",
            stats.disbursed_cents_total
        );
        let before = self
            .seen
            .tombstones
            .fetch_max(stats.tombstones, Ordering::Relaxed);
        assert!(
            stats.tombstones >= before,
            "ledger contract point 6: tombstones fell from {before} to {}, yet none is ever \
             removed",
            stats.tombstones
        );
        let claimed = stats.claims + stats.tombstones;
        let before = self.seen.claimed_ever.fetch_max(claimed, Ordering::Relaxed);
        assert!(
            claimed >= before,
            "ledger contract point 6: claims plus tombstones fell from {before} to {claimed}, \
             yet a purge leaves a tombstone for every claim it removes"
        );
        Ok(stats)
    }
}

impl<L: Outbox> Outbox for Checked<L> {
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
        let rows = self.inner.rows_after(after_id, limit)?;
        assert!(
            rows.len() <= limit,
            "ledger contract point 5: asked for {limit} outbox rows, got {}",
            rows.len()
        );
        let mut last = after_id;
        for row in &rows {
            assert!(
                row.id > last,
                "ledger contract point 5: outbox rows after {after_id} came as id {} after {last}, \
                 not rising above the id asked",
                row.id
            );
            last = row.id;
        }
        Ok(rows)
    }

    fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64> {
        let changed = self.inner.mark_published(upto_id, now, events_stream)?;
        let mut published = self
            .seen
            .published
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        published.entry(events_stream.to_owned()).or_insert(0);
        Ok(changed)
    }

    fn ledger_id(&self) -> Result<String> {
        let id = self.inner.ledger_id()?;
        let first = self.seen.ledger_id.get_or_init(|| id.clone());
        assert_eq!(
            *first, id,
            "ledger contract: the ledger's identity changed from {first} to {id}"
        );
        Ok(id)
    }

    fn ledger_id_made(&self) -> Result<Option<String>> {
        let made = self.inner.ledger_id_made()?;
        if let Some(first) = self.seen.ledger_id.get() {
            assert_eq!(
                made.as_deref(),
                Some(first.as_str()),
                "ledger contract: the ledger's identity was {first}, now {made:?}"
            );
        }
        Ok(made)
    }

    fn published_id_max(&self, events_stream: &str) -> Result<i64> {
        let id = self.inner.published_id_max(events_stream)?;
        assert!(
            id >= 0,
            "ledger: published mark {id} of {events_stream} is negative"
        );
        let mut published = self
            .seen
            .published
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(before) = published.get_mut(events_stream) {
            assert!(
                id >= *before,
                "ledger: the published mark of {events_stream} fell from {before} to {id}, yet \
                 it is only ever raised"
            );
            *before = id;
        }
        Ok(id)
    }

    /// Not held to rising: on PostgreSQL a link commits without waiting for the disk, so a
    /// server crash takes back the ids it gave (and the rows a relay may have read), and the
    /// highest id falls to what was durable; the relay publishes only what is (its published
    /// mark, which is held to rising above, never falls). A panic here stopped a relay after
    /// every such crash (`chaos::on_postgres`).
    fn outbox_id_max(&self) -> Result<i64> {
        self.inner.outbox_id_max()
    }
}

impl<L: AuditLog> AuditLog for Checked<L> {
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        let mut last = i64::MIN;
        self.inner.for_each_record(since, &mut |r| {
            in_seq_order(&mut last, &r);
            f(r)
        })
    }

    fn for_each_dead_letter(&self, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let mut last = i64::MIN;
        self.inner.for_each_dead_letter(&mut |r| {
            assert!(
                r.kind == Kind::DeadLetter,
                "ledger: for_each_dead_letter passed a {:?} record (seq {})",
                r.kind,
                r.seq
            );
            in_seq_order(&mut last, &r);
            f(r)
        })
    }
}

/// Panics unless `r` comes at or after the record before it (lowest `seq` first; a batch's
/// link shares its last member's `seq`).
fn in_seq_order(last: &mut i64, r: &Record) {
    assert!(
        r.seq >= *last,
        "ledger contract point 4: audit record {} came after record {last}, not lowest seq first",
        r.seq
    );
    *last = r.seq;
}

impl<L: Inspect> Inspect for Checked<L> {
    fn verify(&self) -> Result<Summary> {
        let s = self.inner.verify()?;
        assert!(
            s.claims == s.disbursements && s.disbursements == s.outbox_rows,
            "ledger: verify passed a ledger of {} claims, {} disbursements and {} outbox rows, \
             yet it checks one of each per payment",
            s.claims,
            s.disbursements,
            s.outbox_rows
        );
        Ok(s)
    }

    fn ping(&self) -> Result<()> {
        self.inner.ping()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

impl<L: Backup> Backup for Checked<L> {
    fn backup(&self, out: &std::path::Path) -> Result<BackupCopied> {
        self.inner.backup(out)
    }
}

impl<L: Retention> Retention for Checked<L> {
    fn hold_add(&self, award_id: &str, reason: &str, now: &str) -> Result<bool> {
        self.inner.hold_add(award_id, reason, now)
    }

    fn hold_remove(&self, award_id: &str, now: &str) -> Result<bool> {
        self.inner.hold_remove(award_id, now)
    }

    fn holds(&self) -> Result<Vec<Hold>> {
        self.inner.holds()
    }

    fn claims_of(&self, award_id: &str) -> Result<u64> {
        self.inner.claims_of(award_id)
    }

    fn export_purge(
        &self,
        cutoff: &str,
        batch_records_max: usize,
        admit: &mut dyn FnMut(&PurgePlan) -> Result<()>,
        row: &mut dyn FnMut(&serde_json::Value) -> Result<()>,
    ) -> Result<Option<(PurgePlan, Vec<i64>)>> {
        let got = self
            .inner
            .export_purge(cutoff, batch_records_max, admit, row)?;
        if let Some((plan, lasts)) = &got {
            purge_batches(plan, lasts);
        }
        Ok(got)
    }

    fn purge_batch(
        &self,
        first: i64,
        last: i64,
        cutoff: &str,
        detail: &str,
        now: &str,
    ) -> Result<Removed> {
        self.inner.purge_batch(first, last, cutoff, detail, now)
    }
}

/// Panics unless a purge's batches end in rising order inside its plan, the last at its end.
fn purge_batches(plan: &PurgePlan, lasts: &[i64]) {
    assert!(
        plan.first <= plan.last,
        "ledger: a purge plan from seq {} to {} is empty",
        plan.first,
        plan.last
    );
    let mut before = plan.first - 1;
    for &last in lasts {
        assert!(
            last > before && last <= plan.last,
            "ledger: purge batches ending at {lasts:?} do not rise inside the plan {}..={}",
            plan.first,
            plan.last
        );
        before = last;
    }
    assert_eq!(
        lasts.last(),
        Some(&plan.last),
        "ledger: purge batches ending at {lasts:?} do not end where the plan does ({})",
        plan.last
    );
}

impl<L: Review> Review for Checked<L> {
    fn letter_state(&self, stream: &str, entry_id: &str) -> Result<LetterState> {
        self.inner.letter_state(stream, entry_id)
    }

    fn held_awaiting(&self, stream: &str, limit: usize) -> Result<(u64, Vec<HeldConflict>)> {
        let (count, first) = self.inner.held_awaiting(stream, limit)?;
        assert!(
            first.len() <= limit && first.len() as u64 <= count,
            "ledger: held_awaiting({limit}) said {count} await and listed {}",
            first.len()
        );
        Ok((count, first))
    }

    fn decide(&self, d: &HoldDecision<'_>) -> Result<Decided> {
        let decided = self.inner.decide(d)?;
        let agrees = match (&decided, d.verdict) {
            (Decided::Approved(o), Verdict::Approved) => matches!(
                o,
                Outcome::Processed
                    | Outcome::ProcessedConflicting { .. }
                    | Outcome::Duplicate { .. }
            ),
            (Decided::Rejected, Verdict::Rejected) => true,
            (Decided::Approved(_) | Decided::Rejected, _) => false,
            (Decided::Refused(_) | Decided::Mismatch { .. }, _) => true,
        };
        assert!(
            agrees,
            "ledger: a decision to {} was recorded as {decided:?}",
            d.verdict.as_str()
        );
        Ok(decided)
    }
}
