//! What a memory ledger holds: its rows, and the committed state they make up, which only a
//! batch's publication (`batch.rs`) and a purge (`purge.rs`) change.

use crate::domain::audit::{Kind, Record, GENESIS_HASH};
use crate::domain::key::IdempotencyKey;
use std::collections::{HashMap, HashSet};

/// A claim: one row of `processed_messages`.
#[derive(Debug, Clone)]
pub(super) struct ClaimRow {
    /// `claim_id`: 1, 2, 3, ... in claim order.
    pub(super) id: i64,
    /// The idempotency key, unique among claims.
    pub(super) key: IdempotencyKey,
    /// The award, as in the payload.
    pub(super) award_id: String,
    /// The instant the submission's timestamp names, in one spelling
    /// (`domain::clock::instant_utc`); the spelling itself is covered by the key.
    pub(super) submission_instant: String,
    /// The amount the claim pays.
    pub(super) amount_cents: i64,
    /// When the claim was taken: the batch's time.
    pub(super) claimed_at: String,
}

/// What a purge leaves of a claim: one row of `claim_tombstones`.
#[derive(Debug, Clone)]
pub(super) struct Tombstone {
    /// When the claim was taken.
    pub(super) claimed_at: String,
    /// When the purge removed it.
    pub(super) purged_at: String,
}

/// A disbursement: one row of `disbursements`.
#[derive(Debug, Clone)]
pub(super) struct DisbursementRow {
    /// Its id, in insertion order.
    pub(super) id: i64,
    /// The claim it pays.
    pub(super) claim_id: i64,
    /// The claim's key (copied, as SQLite copies it).
    pub(super) key: IdempotencyKey,
    /// The award paid.
    pub(super) award_id: String,
    /// The amount paid.
    pub(super) amount_cents: i64,
}

/// An outbox row.
#[derive(Debug, Clone)]
pub(super) struct OutboxEntry {
    /// The event id: only ever growing, never reused.
    pub(super) id: i64,
    /// The claim whose disbursement it announces.
    pub(super) claim_id: i64,
    /// The event type.
    pub(super) event_type: String,
    /// The event body (JSON).
    pub(super) payload: String,
    /// When the row was written: the batch's time.
    pub(super) created_at: String,
    /// When the relay marked it published; `None` until then.
    pub(super) published_at: Option<String>,
}

/// Everything a committed ledger holds. Only `record` (through `apply`) adds rows.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Claims, in `claim_id` order.
    pub(super) claims: Vec<ClaimRow>,
    /// Index into `claims` by key: the UNIQUE constraint on the claim.
    pub(super) claim_by_key: HashMap<IdempotencyKey, usize>,
    /// Indexes into `claims` by (submission instant, award), ascending: the conflict lookup,
    /// as SQLite's `claim_instant` index.
    pub(super) claims_by_award_time: HashMap<(String, String), Vec<usize>>,
    /// Disbursements, in id order.
    pub(super) disbursements: Vec<DisbursementRow>,
    /// Outbox rows, in id order.
    pub(super) outbox: Vec<OutboxEntry>,
    /// The highest outbox id ever handed out (0 before the first).
    pub(super) outbox_id_last: i64,
    /// Dead-lettered entries as (stream, entry id): one row per entry, as in `dead_letters`.
    pub(super) dead_letters: HashSet<(String, String)>,
    /// Tombstones of purged claims, by key: `claim_tombstones`.
    pub(super) tombstones: HashMap<IdempotencyKey, Tombstone>,
    /// The audit chain, in `seq` order.
    pub(super) audit: Vec<Record>,
    /// This ledger's random identity, once the first caller asked for it.
    pub(super) ledger_id: Option<String>,
    /// Each events stream's mark: every row at or below it is on that stream.
    pub(super) published_upto: HashMap<String, i64>,
    /// The armed fault: `record` fails when it would pay a new claim of this award.
    pub(super) fail_on_award: Option<String>,
}

impl State {
    /// The chain's tail: the last `seq` (0 when empty) and the hash the next record links to.
    /// A checkpoint is transparent, as on SQLite: what follows links to the hash it continues.
    pub(super) fn tail(&self) -> (i64, String) {
        match self.audit.last() {
            None => (0, GENESIS_HASH.to_owned()),
            Some(r) if r.kind == Kind::Checkpoint => (r.seq, r.prev_hash.clone()),
            Some(r) => (r.seq, r.hash.clone()),
        }
    }

    /// Rebuilds the claim indexes from `claims`, after a purge removed some.
    pub(super) fn reindex(&mut self) {
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
    pub(super) fn claim(&self, key: &IdempotencyKey) -> Option<&ClaimRow> {
        self.claim_by_key.get(key).map(|&i| &self.claims[i])
    }
}
