//! The in-memory ledger: the contract of `ledger/mod.rs` kept in a few vectors behind one lock.
//!
//! It exists for tests (the raft-rs `MemStorage` idea): the contract suite in
//! `tests/it/contract.rs` runs against it and against SQLite alike, so the two must agree on
//! every outcome and every audit record. It implements [`Ledger`], [`Outbox`], [`AuditLog`] and
//! [`Inspect`], but not [`crate::ledger::Retention`] or [`crate::ledger::Backup`]: it is not a
//! [`crate::ledger::Backend`], and the CLI never opens one. Of retention it has only what the
//! contract's tombstone point needs, [`MemoryStore::purge_through`] (`purge.rs`). Nothing
//! survives the process. What tests hold is a [`MemoryLedger`], the store inside the contract
//! checks (`ledger::checked`), so every contract test of it runs the checks too.
//!
//! How it keeps the contract:
//! - **Atomic batches.** `record` stages the whole batch in an overlay over the committed state
//!   (`batch.rs`) and publishes it with one infallible `apply` at the end; an error while
//!   staging drops the overlay, and nothing of the batch was ever visible.
//! - **A linear chain.** `record` holds the one lock from reading the chain's tail to publishing,
//!   so two batches never interleave; `apply` asserts each new `seq` is the previous one plus 1.
//! - **Outbox ids in commit order, never reused.** Ids come from a counter that only grows,
//!   assigned under the same lock as the commit.
//! - **No transient errors.** Nothing here can be busy or full. The only errors are a fault the
//!   contract tests arm ([`MemoryLedger::fail_on_award`]) and a lock poisoned by an earlier
//!   panic (an [`Error::Invariant`]: the state can no longer be trusted).

mod batch;
mod purge;
mod verify;

use crate::config::OnConflict;
use crate::domain::audit::{Kind, Record, GENESIS_HASH};
use crate::domain::clock::age_seconds;
use crate::domain::key::{to_hex, IdempotencyKey};
use crate::error::{Error, Result};
use crate::ledger::{
    AuditLog, Checked, Inspect, Item, Ledger, Outbox, OutboxRow, Outcome, Since, Stats, Summary,
};
use std::collections::{HashMap, HashSet};
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

/// A claim: one row of `processed_messages`.
#[derive(Debug, Clone)]
struct ClaimRow {
    /// `claim_id`: 1, 2, 3, ... in claim order.
    id: i64,
    /// The idempotency key, unique among claims.
    key: IdempotencyKey,
    /// The award, as in the payload.
    award_id: String,
    /// The instant the submission's timestamp names, in one spelling
    /// (`domain::clock::instant_utc`); the spelling itself is covered by the key.
    submission_instant: String,
    /// The amount the claim pays.
    amount_cents: i64,
    /// When the claim was taken: the batch's time.
    claimed_at: String,
}

/// What a purge leaves of a claim: one row of `claim_tombstones`.
#[derive(Debug, Clone)]
struct Tombstone {
    /// When the claim was taken.
    claimed_at: String,
    /// When the purge removed it.
    purged_at: String,
}

/// A disbursement: one row of `disbursements`.
#[derive(Debug, Clone)]
struct DisbursementRow {
    /// Its id, in insertion order.
    id: i64,
    /// The claim it pays.
    claim_id: i64,
    /// The claim's key (copied, as SQLite copies it).
    key: IdempotencyKey,
    /// The award paid.
    award_id: String,
    /// The amount paid.
    amount_cents: i64,
}

/// An outbox row.
#[derive(Debug, Clone)]
struct OutboxEntry {
    /// The event id: only ever growing, never reused.
    id: i64,
    /// The claim whose disbursement it announces.
    claim_id: i64,
    /// The event type.
    event_type: String,
    /// The event body (JSON).
    payload: String,
    /// When the row was written: the batch's time.
    created_at: String,
    /// When the relay marked it published; `None` until then.
    published_at: Option<String>,
}

/// Everything a committed ledger holds. Only `record` (through `apply`) adds rows.
#[derive(Debug, Default)]
struct State {
    /// Claims, in `claim_id` order.
    claims: Vec<ClaimRow>,
    /// Index into `claims` by key: the UNIQUE constraint on the claim.
    claim_by_key: HashMap<IdempotencyKey, usize>,
    /// Indexes into `claims` by (submission instant, award), ascending: the conflict lookup,
    /// as SQLite's `claim_instant` index.
    claims_by_award_time: HashMap<(String, String), Vec<usize>>,
    /// Disbursements, in id order.
    disbursements: Vec<DisbursementRow>,
    /// Outbox rows, in id order.
    outbox: Vec<OutboxEntry>,
    /// The highest outbox id ever handed out (0 before the first).
    outbox_id_last: i64,
    /// Dead-lettered entries as (stream, entry id): one row per entry, as in `dead_letters`.
    dead_letters: HashSet<(String, String)>,
    /// Tombstones of purged claims, by key: `claim_tombstones`.
    tombstones: HashMap<IdempotencyKey, Tombstone>,
    /// The audit chain, in `seq` order.
    audit: Vec<Record>,
    /// This ledger's random identity, once the first caller asked for it.
    ledger_id: Option<String>,
    /// Each events stream's mark: every row at or below it is on that stream.
    published_upto: HashMap<String, i64>,
    /// The armed fault: `record` fails when it would pay a new claim of this award.
    fail_on_award: Option<String>,
}

impl State {
    /// The chain's tail: the last `seq` (0 when empty) and the hash the next record links to.
    /// A checkpoint is transparent, as on SQLite: what follows links to the hash it continues.
    fn tail(&self) -> (i64, String) {
        match self.audit.last() {
            None => (0, GENESIS_HASH.to_owned()),
            Some(r) if r.kind == Kind::Checkpoint => (r.seq, r.prev_hash.clone()),
            Some(r) => (r.seq, r.hash.clone()),
        }
    }

    /// Rebuilds the claim indexes from `claims`, after a purge removed some.
    fn reindex(&mut self) {
        self.claim_by_key.clear();
        self.claims_by_award_time.clear();
        for (i, c) in self.claims.iter().enumerate() {
            self.claim_by_key.insert(c.key, i);
            self.claims_by_award_time
                .entry((c.submission_instant.clone(), c.award_id.clone()))
                .or_default()
                .push(i);
        }
    }

    /// The claim of `key`, if it is claimed.
    fn claim(&self, key: &IdempotencyKey) -> Option<&ClaimRow> {
        self.claim_by_key.get(key).map(|&i| &self.claims[i])
    }
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
    fn lock(&self) -> Result<MutexGuard<'_, State>> {
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
