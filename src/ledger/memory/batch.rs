//! One batch, staged in an overlay over the committed state and published all at once.
//!
//! What each item is, and which records say so, is decided by `ledger/decide.rs`; the
//! [`Overlay`] answers its questions from the committed state *and* the batch's own earlier
//! items, and this file stores the answers in the overlay. Nothing here touches the committed
//! state: [`Staged::finish`] hands back the batch's rows, and only [`State::apply`], which
//! cannot fail, publishes them.

use super::state::{ClaimRow, DisbursementRow, OutboxEntry, State};
use crate::config::OnConflict;
use crate::domain::audit::Record;
use crate::domain::event::{self, DISBURSEMENT_RECORDED};
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::{Error, Result};
use crate::ledger::decide::{self, Delivered, Facts, Other, Purged, Stamp, Verdict};
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

/// The batch's claims over the committed state: what the memory ledger answers
/// [`decide`](decide::decide) with.
struct Overlay<'s> {
    /// The committed state, read-only while the batch is staged.
    base: &'s State,
    /// The time the batch's claims are made at.
    now: String,
    /// The batch's new claims.
    claims: Vec<ClaimRow>,
    /// Index into `claims` by key.
    claim_by_key: HashMap<IdempotencyKey, usize>,
    /// Indexes into `claims` by (submission instant, award), ascending.
    claims_by_award_time: HashMap<(String, String), Vec<usize>>,
}

impl<'a> Facts<'a> for Overlay<'_> {
    fn tombstone(&mut self, s: &Submission) -> Result<Option<Purged>> {
        Ok(self.base.tombstones.get(&s.key).map(|t| Purged {
            claimed_at: t.claimed_at.clone(),
            purged_at: t.purged_at.clone(),
        }))
    }

    fn claimed_at(&mut self, s: &Submission) -> Result<Option<String>> {
        let staged = || self.claim_by_key.get(&s.key).map(|&i| &self.claims[i]);
        Ok(self
            .base
            .claim(&s.key)
            .or_else(staged)
            .map(|c| c.claimed_at.clone()))
    }

    /// Committed claims first (lower ids), then the batch's own, each group in id order.
    fn earliest_other(&mut self, s: &Submission) -> Result<Option<Other>> {
        let at = (s.submission_instant.clone(), s.award_id.clone());
        let base = self.base;
        let committed = base.claims_by_award_time.get(&at).into_iter().flatten();
        let staged = self.claims_by_award_time.get(&at).into_iter().flatten();
        Ok(committed
            .map(|&i| &base.claims[i])
            .chain(staged.map(|&i| &self.claims[i]))
            .find(|c| c.key != s.key)
            .map(|c| Other {
                key_hex: c.key.to_hex(),
                claimed_at: c.claimed_at.clone(),
            }))
    }

    fn claim(&mut self, d: &Delivered<'a>) -> Result<Option<String>> {
        let s = d.submission;
        if let Some(at) = self.claimed_at(s)? {
            return Ok(Some(at));
        }
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
        Ok(None)
    }
}

/// A batch being staged over the committed state `base`, which the caller keeps locked.
pub(super) struct Staged<'s> {
    /// The batch's claims, and the committed state they are staged over.
    overlay: Overlay<'s>,
    /// Consumer, stream and conflict policy.
    ctx: &'s Context<'s>,
    /// Entry ids dead-lettered by this batch (all on `ctx.stream`).
    dead_letters: HashSet<String>,
    /// The batch's new disbursements.
    disbursements: Vec<DisbursementRow>,
    /// The batch's new outbox rows.
    outbox: Vec<OutboxEntry>,
    /// The batch's audit records, unsealed: `finish` numbers and seals them.
    audit: Vec<Record>,
}

impl<'s> Staged<'s> {
    /// Starts a batch of `capacity` items after `base`'s chain tail, at the current time.
    pub(super) fn start(base: &'s State, ctx: &'s Context<'s>, capacity: usize) -> Self {
        Staged {
            overlay: Overlay {
                base,
                now: crate::domain::clock::now_rfc3339(),
                claims: Vec::with_capacity(capacity),
                claim_by_key: HashMap::with_capacity(capacity),
                claims_by_award_time: HashMap::new(),
            },
            ctx,
            dead_letters: HashSet::new(),
            disbursements: Vec::with_capacity(capacity),
            outbox: Vec::with_capacity(capacity),
            audit: Vec::with_capacity(capacity),
        }
    }

    /// Stages one item and says what it did.
    pub(super) fn item(&mut self, item: &Item<'_>) -> Result<Outcome> {
        let verdict = decide::decide(item, self.ctx.on_conflict, &mut self.overlay)?;
        let first_dead = decide::dead_row(item, &verdict).is_some_and(|row| {
            let committed = (self.ctx.stream.to_owned(), row.entry_id.to_owned());
            // `INSERT OR IGNORE INTO dead_letters`: committed or earlier in this batch.
            !self.overlay.base.dead_letters.contains(&committed)
                && self.dead_letters.insert(committed.1)
        });
        if let (Verdict::Claim { .. }, Some(d)) = (&verdict, Delivered::of(item)) {
            self.pay(d.submission)?;
        }
        let stamp = Stamp {
            consumer: self.ctx.consumer,
            stream: self.ctx.stream,
            now: &self.overlay.now,
            approving: false,
        };
        Ok(decide::settle(
            item,
            verdict,
            first_dead,
            &stamp,
            &mut self.audit,
        ))
    }

    /// Hands back what the batch adds, its records numbered and sealed after the chain's
    /// tail, for [`State::apply`].
    pub(super) fn finish(self) -> Changes {
        let stream = self.ctx.stream;
        let (mut seq, mut hash) = self.overlay.base.tail();
        let mut audit = self.audit;
        for r in &mut audit {
            seq += 1;
            r.seq = seq;
            r.seal(&hash);
            hash.clone_from(&r.hash);
        }
        Changes {
            claims: self.overlay.claims,
            disbursements: self.disbursements,
            outbox: self.outbox,
            dead_letters: self
                .dead_letters
                .into_iter()
                .map(|entry| (stream.to_owned(), entry))
                .collect(),
            audit,
        }
    }

    /// Stages the disbursement and outbox row of the claim the overlay just made of `s`.
    fn pay(&mut self, s: &Submission) -> Result<()> {
        let base = self.overlay.base;
        if base.fail_on_award.as_deref() == Some(s.award_id.as_str()) {
            return Err(Error::Other(format!(
                "forced failure (fault injection): paying award {}",
                s.award_id
            )));
        }
        let claim_id = self.overlay.claims.last().expect("just claimed").id;
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
            payload: event::payload(s, &s.key.to_hex()),
            created_at: self.overlay.now.clone(),
            published_at: None,
        });
        Ok(())
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
