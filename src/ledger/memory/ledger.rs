//! [`MemoryStore`]: the handle, and the ledger traits it implements over its [`State`]; and
//! [`MemoryLedger`], the store inside the contract checks.

use super::batch;
use super::state::State;
use super::verify;
use crate::config::OnConflict;
use crate::domain::audit::{Kind, Record};
use crate::domain::clock::age_seconds;
use crate::domain::key::to_hex;
use crate::error::{Error, Result};
use crate::ledger::{
    AuditLog, Checked, Inspect, Item, Ledger, Outbox, OutboxRow, Outcome, Since, Stats, Summary,
};
use std::sync::{Arc, Mutex, MutexGuard};

/// The in-memory ledger as handed out: the store inside the contract checks
/// (`ledger::checked`), as every ledger the open step makes is.
pub type MemoryLedger = Checked<MemoryStore>;

/// The in-memory ledger itself, unchecked. Clones are handles to the same ledger, like clones
/// of a connection pool.
#[derive(Clone, Default)]
pub struct MemoryStore {
    /// Everything committed, behind the one lock every call takes.
    state: Arc<Mutex<State>>,
    /// What `record` does with a conflicting resubmission (this handle's setting).
    on_conflict: OnConflict,
}

impl Checked<MemoryStore> {
    /// An empty ledger that records conflicting resubmissions and pays them (the default),
    /// inside the contract checks.
    pub fn new() -> Self {
        Checked::wrap(MemoryStore::default(), Some(OnConflict::Record))
    }

    /// Sets what `record` does with a conflicting resubmission, as `LedgerConfig::on_conflict`
    /// does for the ledgers the open step makes (and tells the checks).
    pub fn with_on_conflict(self, on_conflict: OnConflict) -> Self {
        let mut store = self.inner().clone();
        store.on_conflict = on_conflict;
        Checked::wrap(store, Some(on_conflict))
    }

    /// [`MemoryStore::fail_on_award`].
    pub fn fail_on_award(&self, award_id: &str) -> Result<()> {
        self.inner().fail_on_award(award_id)
    }

    /// [`MemoryStore::clear_fault`].
    pub fn clear_fault(&self) -> Result<()> {
        self.inner().clear_fault()
    }

    /// [`MemoryStore::purge_through`].
    pub fn purge_through(
        &self,
        last: i64,
        detail: &str,
        now: &str,
    ) -> Result<crate::ledger::Removed> {
        self.inner().purge_through(last, detail, now)
    }
}

impl Default for Checked<MemoryStore> {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// Fault injection for the contract tests: from now on, `record` fails with a permanent
    /// [`Error::Other`] when it is about to pay a new claim of `award_id` — after the batch's
    /// earlier items were staged, as a failing disbursement insert fails on SQLite — until
    /// [`MemoryStore::clear_fault`]. Affects every clone of this ledger.
    pub fn fail_on_award(&self, award_id: &str) -> Result<()> {
        self.lock()?.fail_on_award = Some(award_id.to_owned());
        Ok(())
    }

    /// Disarms the fault armed by [`MemoryStore::fail_on_award`].
    pub fn clear_fault(&self) -> Result<()> {
        self.lock()?.fail_on_award = None;
        Ok(())
    }

    /// The state, or an invariant error if a panic (a failed assertion) left it untrustworthy.
    pub(super) fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| {
            Error::Invariant(
                "in-memory ledger: a thread panicked while holding it; its state is not trusted"
                    .into(),
            )
        })
    }
}

impl Ledger for MemoryStore {
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>> {
        // One lock from reading the tail to publishing: batches never interleave.
        let mut state = self.lock()?;
        let ctx = batch::Context {
            consumer,
            stream,
            on_conflict: self.on_conflict,
        };
        let mut staged = batch::Staged::start(&state, &ctx, items.len());
        let outcomes = items
            .iter()
            .map(|item| staged.item(item))
            .collect::<Result<Vec<_>>>()?;
        assert_eq!(outcomes.len(), items.len(), "one outcome per item");
        let changes = staged.finish();
        state.apply(changes);
        Ok(outcomes)
    }

    fn stats(&self) -> Result<Stats> {
        let state = self.lock()?;
        let unpublished = || state.outbox.iter().filter(|o| o.published_at.is_none());
        let kind_count = |kind| state.audit.iter().filter(|r| r.kind == kind).count() as u64;
        let disbursed_cents_total = state
            .disbursements
            .iter()
            .map(|d| i128::from(d.amount_cents))
            .sum();
        Ok(Stats {
            claims: state.claims.len() as u64,
            disbursements: state.disbursements.len() as u64,
            disbursed_cents_total,
            outbox_backlog: unpublished().count() as u64,
            outbox_oldest_age_s: unpublished()
                .map(|o| o.created_at.as_str())
                .min()
                .and_then(age_seconds),
            dead_letters: state.dead_letters.len() as u64,
            duplicates_suppressed: kind_count(Kind::Duplicate),
            conflicts: kind_count(Kind::Conflict),
            vanished: kind_count(Kind::Vanished),
            audit_records: state.audit.len() as u64,
            tombstones: state.tombstones.len() as u64,
        })
    }
}

impl Outbox for MemoryStore {
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
        let state = self.lock()?;
        Ok(state
            .outbox
            .iter()
            .filter(|o| o.id > after_id)
            .take(limit)
            .map(|o| OutboxRow {
                id: o.id,
                event_type: o.event_type.clone(),
                payload: o.payload.clone(),
            })
            .collect())
    }

    fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64> {
        let mut state = self.lock()?;
        let given = state.outbox_id_last;
        let upto = state
            .published_upto
            .entry(events_stream.to_owned())
            .or_insert(0);
        *upto = (*upto).max(upto_id.min(given));
        let mut changed = 0;
        for o in state.outbox.iter_mut().take_while(|o| o.id <= upto_id) {
            if o.published_at.is_none() {
                o.published_at = Some(now.to_owned());
                changed += 1;
            }
        }
        Ok(changed)
    }

    fn outbox_id_max(&self) -> Result<i64> {
        Ok(self.lock()?.outbox_id_last)
    }

    fn published_id_max(&self, events_stream: &str) -> Result<i64> {
        let state = self.lock()?;
        if let Some(upto) = state.published_upto.get(events_stream) {
            return Ok(*upto);
        }
        if !state.published_upto.is_empty() {
            return Ok(0);
        }
        let published = state.outbox.iter().filter(|o| o.published_at.is_some());
        Ok(published.map(|o| o.id).max().unwrap_or(0))
    }

    fn ledger_id(&self) -> Result<String> {
        let mut state = self.lock()?;
        let id = state.ledger_id.get_or_insert_with(|| {
            let bytes: Vec<u8> = std::iter::repeat_with(|| fastrand::u8(..))
                .take(16)
                .collect();
            to_hex(&bytes)
        });
        Ok(id.clone())
    }

    fn ledger_id_made(&self) -> Result<Option<String>> {
        Ok(self.lock()?.ledger_id.clone())
    }
}

impl AuditLog for MemoryStore {
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        // The snapshot is a copy, so `f` runs without the lock and may call the ledger itself.
        let selected: Vec<Record> = {
            let state = self.lock()?;
            let keep = |r: &&Record| match since {
                Since::All => true,
                Since::Seq(n) => r.seq >= *n,
                Since::Time(t) => r.recorded_at.as_str() >= t.as_str(),
            };
            state.audit.iter().filter(keep).cloned().collect()
        };
        selected.into_iter().try_for_each(f)
    }
}

impl Inspect for MemoryStore {
    fn verify(&self) -> Result<Summary> {
        verify::state(&*self.lock()?)
    }

    fn ping(&self) -> Result<()> {
        self.lock().map(drop)
    }

    fn describe(&self) -> String {
        "in-memory ledger".to_owned()
    }
}
