//! One batch, staged in an overlay over the committed state and published all at once.
//!
//! This mirrors `sqlite/batch.rs` and `sqlite/conflict.rs` decision for decision, so both
//! ledgers give the same outcomes and the same audit records for the same items: claims are
//! taken in item order and every lookup (is this key claimed? is there an earlier claim with
//! this award and time? was this entry dead-lettered?) sees the committed state *and* the
//! batch's own earlier items. Nothing here touches the committed state: [`Staged::finish`]
//! hands back the batch's rows, and only [`State::apply`], which cannot fail, publishes them.

use super::{ClaimRow, DisbursementRow, OutboxEntry, State};
use crate::config::OnConflict;
use crate::domain::audit::{detail, Kind, Record};
use crate::domain::event::{self, DISBURSEMENT_RECORDED};
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::{Error, Result};
use crate::ledger::{Item, Outcome};
use std::collections::{HashMap, HashSet};

/// Who is recording, from where, under which conflict policy.
pub(super) struct Context<'a> {
    /// The consumer name, written into every audit record.
    pub(super) consumer: &'a str,
    /// The submissions stream (dead letters are keyed by stream and entry id).
    pub(super) stream: &'a str,
    /// What to do with a conflicting resubmission.
    pub(super) on_conflict: OnConflict,
}

/// One submission with its delivery facts.
struct Claim<'a> {
    /// The validated submission.
    submission: &'a Submission,
    /// The stream entry that carried it.
    entry_id: &'a str,
    /// Deliveries so far.
    delivery_count: u64,
}

/// The earlier claim a submission conflicts with.
struct Other {
    /// Its key, in hex.
    key_hex: String,
    /// When it was claimed.
    claimed_at: String,
}

/// What a batch adds, ready to publish.
pub(super) struct Changes {
    /// New claims, in claim order.
    claims: Vec<ClaimRow>,
    /// New disbursements, in id order.
    disbursements: Vec<DisbursementRow>,
    /// New outbox rows, in id order.
    outbox: Vec<OutboxEntry>,
    /// Newly dead-lettered (stream, entry id) pairs.
    dead_letters: Vec<(String, String)>,
    /// New sealed audit records, in chain order.
    audit: Vec<Record>,
}

/// A batch being staged over the committed state `base`, which the caller keeps locked.
pub(super) struct Staged<'s> {
    /// The committed state, read-only while the batch is staged.
    base: &'s State,
    /// Consumer, stream and conflict policy.
    ctx: &'s Context<'s>,
    /// The time every row of the batch is recorded at.
    now: String,
    /// The last `seq` given out (the chain's tail, then this batch's records).
    seq: i64,
    /// The hash the next record links to.
    hash: String,
    /// The batch's new claims.
    claims: Vec<ClaimRow>,
    /// Index into `claims` by key.
    claim_by_key: HashMap<IdempotencyKey, usize>,
    /// Indexes into `claims` by (submission instant, award), ascending.
    claims_by_award_time: HashMap<(String, String), Vec<usize>>,
    /// Entry ids dead-lettered by this batch (all on `ctx.stream`).
    dead_letters: HashSet<String>,
    /// The batch's new disbursements.
    disbursements: Vec<DisbursementRow>,
    /// The batch's new outbox rows.
    outbox: Vec<OutboxEntry>,
    /// The batch's sealed audit records.
    audit: Vec<Record>,
}

impl<'s> Staged<'s> {
    /// Starts a batch of `capacity` items after `base`'s chain tail, at the current time.
    pub(super) fn start(base: &'s State, ctx: &'s Context<'s>, capacity: usize) -> Self {
        let (seq, hash) = base.tail();
        Staged {
            base,
            ctx,
            now: crate::domain::clock::now_rfc3339(),
            seq,
            hash,
            claims: Vec::with_capacity(capacity),
            claim_by_key: HashMap::with_capacity(capacity),
            claims_by_award_time: HashMap::new(),
            dead_letters: HashSet::new(),
            disbursements: Vec::with_capacity(capacity),
            outbox: Vec::with_capacity(capacity),
            audit: Vec::with_capacity(capacity),
        }
    }

    /// Stages one item and says what it did.
    pub(super) fn item(&mut self, item: &Item<'_>) -> Result<Outcome> {
        match item {
            Item::Submission {
                submission,
                entry_id,
                delivery_count,
            } => self.submission(&Claim {
                submission,
                entry_id,
                delivery_count: *delivery_count,
            }),
            Item::KnownDuplicate {
                submission,
                entry_id,
                delivery_count,
                committed_by: _,
            } => {
                // Confirmed as `sqlite/batch.rs` confirms it: claim, then tombstone, else a
                // warning and the submission recorded as what it is.
                let claim = Claim {
                    submission,
                    entry_id,
                    delivery_count: *delivery_count,
                };
                if let Some(first_claimed_at) = self.claimed_at(&submission.key) {
                    return Ok(self.duplicate(&claim, first_claimed_at, None, true));
                }
                if let Some(t) = self.base.tombstones.get(&submission.key) {
                    let (claimed, purged) = (t.claimed_at.clone(), t.purged_at.clone());
                    return Ok(self.duplicate(&claim, claimed, Some(purged), true));
                }
                crate::ledger::warn_unconfirmed_marker(entry_id, &submission.key);
                self.submission(&claim)
            }
            Item::DeadLetter {
                entry_id,
                reason_code,
                reason,
                award_id,
                key,
                delivery_count,
            } => {
                if !self.dead_letter(entry_id) {
                    return Ok(Outcome::AlreadyDeadLettered);
                }
                let mut r = self.record(Kind::DeadLetter);
                r.idempotency_key = key.map(|k| k.to_hex());
                r.award_id = award_id.map(str::to_owned);
                r.stream_entry_id = Some((*entry_id).to_owned());
                r.delivery_count = Some(*delivery_count as i64);
                r.detail = Some(detail::dead_letter(reason_code, reason));
                self.append(r);
                Ok(Outcome::DeadLettered)
            }
            Item::Vanished { entry_id, reason } => {
                let mut r = self.record(Kind::Vanished);
                r.stream_entry_id = Some((*entry_id).to_owned());
                r.detail = Some(detail::vanished(self.ctx.stream, reason));
                self.append(r);
                Ok(Outcome::Vanished)
            }
        }
    }

    /// Hands back what the batch adds, for [`State::apply`].
    pub(super) fn finish(self) -> Changes {
        let stream = self.ctx.stream;
        Changes {
            claims: self.claims,
            disbursements: self.disbursements,
            outbox: self.outbox,
            dead_letters: self
                .dead_letters
                .into_iter()
                .map(|entry| (stream.to_owned(), entry))
                .collect(),
            audit: self.audit,
        }
    }

    /// Claims the submission if its key is new and stages its effects; otherwise a duplicate.
    /// The order of decisions is `sqlite/batch.rs`'s: under hold, a conflict is looked for
    /// before claiming; under record, only after a new claim.
    fn submission(&mut self, claim: &Claim<'_>) -> Result<Outcome> {
        let s = claim.submission;
        if let Some(t) = self.base.tombstones.get(&s.key) {
            let (first_claimed_at, purged_at) = (t.claimed_at.clone(), t.purged_at.clone());
            return Ok(self.duplicate(claim, first_claimed_at, Some(purged_at), false));
        }
        let held_conflict = match self.ctx.on_conflict {
            OnConflict::Hold => self.conflict(s),
            OnConflict::Record => None,
        };
        if let Some(other) = &held_conflict {
            if self.claimed_at(&s.key).is_none() {
                return Ok(self.hold(claim, other));
            }
        }
        if let Some(first_claimed_at) = self.claimed_at(&s.key) {
            return Ok(self.duplicate(claim, first_claimed_at, None, false));
        }

        let claim_id = self.claim(s);
        if self.base.fail_on_award.as_deref() == Some(s.award_id.as_str()) {
            return Err(Error::Other(format!(
                "forced failure (fault injection): paying award {}",
                s.award_id
            )));
        }
        let mut r = self.claim_record(Kind::Processed, claim);
        let key_hex = r.idempotency_key.clone().unwrap_or_default();
        self.pay(claim_id, s, &key_hex);
        r.amount_cents = Some(s.amount_cents);
        self.append(r);
        let other = match self.ctx.on_conflict {
            OnConflict::Hold => held_conflict,
            OnConflict::Record => self.conflict(s),
        };
        let Some(other) = other else {
            return Ok(Outcome::Processed);
        };
        let mut c = self.conflict_record(claim);
        c.detail = Some(detail::conflict_paid(&other.key_hex, &other.claimed_at));
        self.append(c);
        Ok(Outcome::ProcessedConflicting {
            other_key: other.key_hex,
        })
    }

    /// Stages the `duplicate` record of a delivery of a claimed (or purged) key, worded as
    /// `sqlite/batch.rs` words it (`via_filter`: a confirmed fast-filter hit).
    fn duplicate(
        &mut self,
        claim: &Claim<'_>,
        first_claimed_at: String,
        purged_at: Option<String>,
        via_filter: bool,
    ) -> Outcome {
        let mut r = self.claim_record(Kind::Duplicate, claim);
        r.detail = Some(detail::duplicate_record(
            &first_claimed_at,
            purged_at.as_deref(),
            via_filter,
        ));
        self.append(r);
        Outcome::Duplicate {
            first_claimed_at,
            purged_at,
        }
    }

    /// Stages a new claim of `s` (its key is known to be unclaimed) and returns its id.
    fn claim(&mut self, s: &Submission) -> i64 {
        let id = self.base.claims.last().map_or(0, |c| c.id) + self.claims.len() as i64 + 1;
        let index = self.claims.len();
        self.claims.push(ClaimRow {
            id,
            key: s.key,
            award_id: s.award_id.clone(),
            submission_instant: s.submission_instant.clone(),
            amount_cents: s.amount_cents,
            claimed_at: self.now.clone(),
        });
        self.claim_by_key.insert(s.key, index);
        self.claims_by_award_time
            .entry((s.submission_instant.clone(), s.award_id.clone()))
            .or_default()
            .push(index);
        id
    }

    /// Stages the disbursement and outbox row of the new claim `claim_id`.
    fn pay(&mut self, claim_id: i64, s: &Submission, key_hex: &str) {
        let base = self.base;
        let disbursement_id =
            base.disbursements.last().map_or(0, |d| d.id) + self.disbursements.len() as i64 + 1;
        self.disbursements.push(DisbursementRow {
            id: disbursement_id,
            claim_id,
            key: s.key,
            award_id: s.award_id.clone(),
            amount_cents: s.amount_cents,
        });
        self.outbox.push(OutboxEntry {
            id: base.outbox_id_last + self.outbox.len() as i64 + 1,
            claim_id,
            event_type: DISBURSEMENT_RECORDED.to_owned(),
            payload: event::payload(s, key_hex),
            created_at: self.now.clone(),
            published_at: None,
        });
    }

    /// When `key` was claimed, committed or earlier in this batch.
    fn claimed_at(&self, key: &IdempotencyKey) -> Option<String> {
        let staged = || self.claim_by_key.get(key).map(|&i| &self.claims[i]);
        let claim = self.base.claim(key).or_else(staged)?;
        Some(claim.claimed_at.clone())
    }

    /// The earliest claim (lowest id: committed ones first) with `s`'s award and submission
    /// instant but another key, as `sqlite/conflict.rs` finds it.
    fn conflict(&self, s: &Submission) -> Option<Other> {
        let at = (s.submission_instant.clone(), s.award_id.clone());
        let base = self.base;
        let committed = base.claims_by_award_time.get(&at).into_iter().flatten();
        let staged = self.claims_by_award_time.get(&at).into_iter().flatten();
        committed
            .map(|&i| &base.claims[i])
            .chain(staged.map(|&i| &self.claims[i]))
            .find(|c| c.key != s.key)
            .map(|c| Other {
                key_hex: c.key.to_hex(),
                claimed_at: c.claimed_at.clone(),
            })
    }

    /// Marks `entry_id` dead-lettered, unless it already was (committed or in this batch):
    /// `INSERT OR IGNORE INTO dead_letters`. True if it was new.
    fn dead_letter(&mut self, entry_id: &str) -> bool {
        let committed = (self.ctx.stream.to_owned(), entry_id.to_owned());
        !self.base.dead_letters.contains(&committed) && self.dead_letters.insert(committed.1)
    }

    /// Holds a conflicting submission for review: a dead-letter row plus `conflict` and
    /// `dead_letter` records, once per stream entry. Nothing is claimed or paid.
    fn hold(&mut self, claim: &Claim<'_>, other: &Other) -> Outcome {
        let reason = detail::hold_reason(&other.key_hex);
        let first = self.dead_letter(claim.entry_id);
        if first {
            let mut c = self.conflict_record(claim);
            c.detail = Some(detail::conflict_held(&other.key_hex, &other.claimed_at));
            self.append(c);
            let mut d = self.claim_record(Kind::DeadLetter, claim);
            d.detail = Some(detail::conflict_hold(&reason));
            self.append(d);
        }
        Outcome::Held {
            other_key: other.key_hex.clone(),
            first,
        }
    }

    /// A record of `kind` by this batch's consumer at this batch's time, not yet sealed.
    fn record(&self, kind: Kind) -> Record {
        Record {
            consumer: Some(self.ctx.consumer.to_owned()),
            ..Record::unsealed(kind, &self.now)
        }
    }

    /// A record of `kind` about `claim`, not yet sealed.
    fn claim_record(&self, kind: Kind, claim: &Claim<'_>) -> Record {
        let s = claim.submission;
        let mut r = self.record(kind);
        r.idempotency_key = Some(s.key.to_hex());
        r.award_id = Some(s.award_id.clone());
        r.stream_entry_id = Some(claim.entry_id.to_owned());
        r.delivery_count = Some(claim.delivery_count as i64);
        r
    }

    /// A `conflict` record about `claim`, its detail still to be written.
    fn conflict_record(&self, claim: &Claim<'_>) -> Record {
        let mut r = self.claim_record(Kind::Conflict, claim);
        r.amount_cents = Some(claim.submission.amount_cents);
        r
    }

    /// Seals `record` after the current tail and stages it.
    fn append(&mut self, mut record: Record) {
        record.seq = self.seq + 1;
        record.seal(&self.hash);
        self.seq = record.seq;
        self.hash.clone_from(&record.hash);
        self.audit.push(record);
    }
}

impl State {
    /// Publishes a staged batch. Cannot fail; asserts the invariants a correct staging keeps
    /// (a failed assertion poisons the lock, so the ledger refuses every later call).
    pub(super) fn apply(&mut self, changes: Changes) {
        for claim in changes.claims {
            let last = self.claims.last().map_or(0, |c| c.id);
            assert_eq!(claim.id, last + 1, "claim ids are consecutive");
            let index = self.claims.len();
            let earlier = self.claim_by_key.insert(claim.key, index);
            assert!(
                earlier.is_none(),
                "key {} claimed twice",
                claim.key.to_hex()
            );
            self.claims_by_award_time
                .entry((claim.submission_instant.clone(), claim.award_id.clone()))
                .or_default()
                .push(index);
            self.claims.push(claim);
        }
        for d in changes.disbursements {
            let last = self.disbursements.last().map_or(0, |d| d.id);
            assert!(d.id > last, "disbursement ids only grow");
            self.disbursements.push(d);
        }
        for o in changes.outbox {
            assert!(o.id > self.outbox_id_last, "outbox ids only grow");
            self.outbox_id_last = o.id;
            self.outbox.push(o);
        }
        for entry in changes.dead_letters {
            let new = self.dead_letters.insert(entry);
            assert!(new, "an entry is dead-lettered once");
        }
        for r in changes.audit {
            let (seq, head) = self.tail();
            assert_eq!(r.seq, seq + 1, "each audit seq is the previous one plus 1");
            assert_eq!(
                r.prev_hash, head,
                "audit record {} links to the tail",
                r.seq
            );
            self.audit.push(r);
        }
    }
}
