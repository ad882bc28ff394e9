//! What each item of a batch is, decided once for every ledger.
//!
//! A submission can be a new claim (with or without a conflicting earlier claim), a duplicate
//! of a claim, a duplicate of a purged claim, or under `--on-conflict hold` a conflict held for
//! review; an item without a submission is a dead letter or a vanished entry. Which one it is,
//! and exactly which audit records say so, is the rule of contract points 3, 4 and 6
//! (`ledger/mod.rs`), and it is written here only.
//!
//! The procedure is split where a ledger must touch its store:
//! 1. [`decide`] asks the ledger's [`Facts`] about the submission, in a fixed order, and returns
//!    a [`Verdict`]. The ledger answers inside its batch's transaction (SQLite by probing its
//!    indexes, PostgreSQL from what it read under its group locks, the memory ledger from its
//!    state and the batch's overlay); the one question that writes, [`Facts::claim`], is where
//!    the store's own uniqueness constraint stays the last line.
//! 2. The ledger stores the verdict: a claim's disbursement and outbox row, and the
//!    `dead_letters` row a dead letter or a hold writes ([`dead_row`]), once per stream entry,
//!    which says whether this delivery was the first.
//! 3. [`settle`] turns the verdict and that answer into the item's [`Outcome`] and its audit
//!    records, unsealed and in chain order; the ledger numbers, seals and writes them.
//!
//! Nothing here does I/O of its own: everything it learns comes through [`Facts`].
//!
//! A new rule (a third `--on-conflict` policy, say) is a new arm in [`decide_submission`] and,
//! if it needs one, a [`Verdict`] and its records in [`settle`]; a new fact a ledger must
//! answer is a new [`Facts`] method, which each ledger's batch then implements.

use crate::config::OnConflict;
use crate::domain::audit::{detail, Kind, Record};
use crate::domain::submission::Submission;
use crate::error::Result;
use crate::ledger::{Item, Outcome};
use std::borrow::Cow;

/// The earlier claim a submission conflicts with: same award, same submission instant, another
/// key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Other {
    /// Its key, in hex.
    pub(crate) key_hex: String,
    /// When it was claimed.
    pub(crate) claimed_at: String,
}

/// What a tombstone keeps of a purged claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Purged {
    /// When the key was claimed.
    pub(crate) claimed_at: String,
    /// When a retention purge removed the claim.
    pub(crate) purged_at: String,
}

/// One submission with its delivery facts, as a ledger claims it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivered<'a> {
    /// The validated submission.
    pub(crate) submission: &'a Submission,
    /// The stream entry that carried it.
    pub(crate) entry_id: &'a str,
    /// Deliveries so far.
    pub(crate) delivery_count: u64,
}

impl<'a> Delivered<'a> {
    /// The submission an item carries (a plain one, or a fast-filter hit), if it carries one.
    pub(crate) fn of(item: &Item<'a>) -> Option<Self> {
        match *item {
            Item::Submission {
                submission,
                entry_id,
                delivery_count,
            }
            | Item::KnownDuplicate {
                submission,
                entry_id,
                delivery_count,
                ..
            } => Some(Delivered {
                submission,
                entry_id,
                delivery_count,
            }),
            Item::DeadLetter { .. } | Item::Vanished { .. } => None,
        }
    }
}

/// What a ledger knows about a submission, asked by [`decide`] inside the batch's transaction.
///
/// Every answer must count the batch's own earlier items: a key claimed by an earlier item of
/// the batch is claimed (contract point 3), and a claim it made is a conflict for a later one.
/// An error is the ledger's (a failed read or write) and fails the whole batch (point 1).
pub(crate) trait Facts<'a> {
    /// The tombstone of `s`'s key, if a retention purge removed its claim (point 6).
    fn tombstone(&mut self, s: &Submission) -> Result<Option<Purged>>;

    /// When `s`'s key was claimed, if it was.
    fn claimed_at(&mut self, s: &Submission) -> Result<Option<String>>;

    /// The earliest claim with `s`'s award and submission instant and another key: the lowest
    /// claim id, so one committed before the batch before any of the batch's own.
    fn earliest_other(&mut self, s: &Submission) -> Result<Option<Other>>;

    /// Claims `d`'s key unless a claim of it exists. `None` when this call claimed it (every
    /// later question sees it claimed, at the batch's time); otherwise when the existing claim
    /// was taken. [`decide`] calls it only for a key it found neither claimed (where it asked)
    /// nor tombstoned: a ledger whose store refuses the claim answers with that claim's time,
    /// and one that cannot find it then has an inconsistent store, an error.
    fn claim(&mut self, d: &Delivered<'a>) -> Result<Option<String>>;
}

/// What an item is, before anything of it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A new claim: pay it. `other` is the earlier conflicting claim, if any (never under
    /// `hold`, which holds such a submission instead).
    Claim {
        /// The earlier conflicting claim.
        other: Option<Other>,
    },
    /// The key is claimed, or its claim was purged: record the duplicate, pay nothing.
    Duplicate {
        /// When the key was first claimed.
        first_claimed_at: String,
        /// When its claim was purged, for a key found by its tombstone.
        purged_at: Option<String>,
        /// Found through a confirmed fast-filter marker (the record says so).
        via_filter: bool,
    },
    /// Under `--on-conflict hold`: a conflicting resubmission, dead-lettered for review and not
    /// claimed.
    Hold {
        /// The earlier claim it conflicts with.
        other: Other,
    },
    /// An entry that could not be read as a submission: dead-letter it.
    DeadLetter,
    /// A pending entry whose body is gone: record that it vanished.
    Vanished,
}

/// Decides what `item` is, asking `facts` in this order, the one every ledger shares:
/// - a fast-filter hit is confirmed by a claim of its key, then by a tombstone; a marker with
///   neither behind it is logged and the item decided as the plain submission it is;
/// - a submission whose key has a tombstone is a duplicate before anything else is asked;
/// - under `hold`, a conflicting submission whose key is not claimed is held;
/// - otherwise its key is claimed, or found claimed (a duplicate);
/// - under `record`, a new claim is then checked for a conflict (so a duplicate pays nothing
///   for the lookup).
pub(crate) fn decide<'a>(
    item: &Item<'a>,
    policy: OnConflict,
    facts: &mut impl Facts<'a>,
) -> Result<Verdict> {
    let d = match *item {
        Item::DeadLetter { .. } => return Ok(Verdict::DeadLetter),
        Item::Vanished { .. } => return Ok(Verdict::Vanished),
        Item::Submission { .. } => Delivered::of(item).expect("a submission"),
        Item::KnownDuplicate { .. } => {
            let d = Delivered::of(item).expect("a submission");
            if let Some(first_claimed_at) = facts.claimed_at(d.submission)? {
                return Ok(duplicate(first_claimed_at, None, true));
            }
            if let Some(t) = facts.tombstone(d.submission)? {
                return Ok(duplicate(t.claimed_at, Some(t.purged_at), true));
            }
            crate::ledger::warn_unconfirmed_marker(d.entry_id, &d.submission.key);
            d
        }
    };
    decide_submission(&d, policy, facts)
}

/// [`decide`] for a submission that is not a confirmed fast-filter hit.
fn decide_submission<'a>(
    d: &Delivered<'a>,
    policy: OnConflict,
    facts: &mut impl Facts<'a>,
) -> Result<Verdict> {
    let s = d.submission;
    if let Some(t) = facts.tombstone(s)? {
        return Ok(duplicate(t.claimed_at, Some(t.purged_at), false));
    }
    // Under hold a conflict must be known before claiming; under record it is looked up only
    // for a new claim, after it.
    let held = match policy {
        OnConflict::Hold => facts.earliest_other(s)?,
        OnConflict::Record => None,
    };
    if let Some(other) = held {
        return Ok(match facts.claimed_at(s)? {
            Some(first_claimed_at) => duplicate(first_claimed_at, None, false),
            None => Verdict::Hold { other },
        });
    }
    if let Some(first_claimed_at) = facts.claim(d)? {
        return Ok(duplicate(first_claimed_at, None, false));
    }
    let other = match policy {
        // Asked above and found none: a claim made now cannot have made one.
        OnConflict::Hold => None,
        OnConflict::Record => facts.earliest_other(s)?,
    };
    Ok(Verdict::Claim { other })
}

fn duplicate(first_claimed_at: String, purged_at: Option<String>, via_filter: bool) -> Verdict {
    Verdict::Duplicate {
        first_claimed_at,
        purged_at,
        via_filter,
    }
}

/// The `dead_letters` row a dead letter or a held conflict writes: once per (stream, entry
/// id), so the ledger inserts it only if no row of the entry exists and tells [`settle`]
/// whether it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadRow<'a> {
    /// The stream entry.
    pub(crate) entry_id: &'a str,
    /// Its class: the parser's code, or [`crate::ledger::review::CONFLICT_HOLD`]'s spelling
    /// for a hold.
    pub(crate) reason_code: &'a str,
    /// The reason in words.
    pub(crate) reason: Cow<'a, str>,
    /// The award, where known.
    pub(crate) award_id: Option<&'a str>,
    /// Deliveries so far.
    pub(crate) delivery_count: u64,
}

/// The `dead_letters` row `item`'s verdict writes, if it writes one.
pub(crate) fn dead_row<'a>(item: &Item<'a>, verdict: &Verdict) -> Option<DeadRow<'a>> {
    match (item, verdict) {
        (
            &Item::DeadLetter {
                entry_id,
                reason_code,
                reason,
                award_id,
                delivery_count,
                ..
            },
            Verdict::DeadLetter,
        ) => Some(DeadRow {
            entry_id,
            reason_code,
            reason: Cow::Borrowed(reason),
            award_id,
            delivery_count,
        }),
        (item, Verdict::Hold { other }) => {
            let d = Delivered::of(item).expect("only a submission is held");
            Some(DeadRow {
                entry_id: d.entry_id,
                reason_code: crate::ledger::review::CONFLICT_HOLD,
                reason: Cow::Owned(detail::hold_reason(&other.key_hex)),
                award_id: Some(&d.submission.award_id),
                delivery_count: d.delivery_count,
            })
        }
        _ => None,
    }
}

/// Who records a batch, from where, and when: what every record of the batch carries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp<'s> {
    /// The consumer name.
    pub(crate) consumer: &'s str,
    /// The submissions stream.
    pub(crate) stream: &'s str,
    /// The batch's time.
    pub(crate) now: &'s str,
    /// Paying a held conflict a reviewer approved: its `conflict` record says so.
    pub(crate) approving: bool,
}

impl Stamp<'_> {
    /// An unsealed record of `kind` by this batch's consumer at this batch's time.
    fn record(&self, kind: Kind) -> Record {
        Record {
            consumer: Some(self.consumer.to_owned()),
            ..Record::unsealed(kind, self.now)
        }
    }

    /// An unsealed record of `kind` about the submission `d`.
    fn about(&self, kind: Kind, d: &Delivered<'_>) -> Record {
        let s = d.submission;
        Record {
            idempotency_key: Some(s.key.to_hex()),
            award_id: Some(s.award_id.clone()),
            stream_entry_id: Some(d.entry_id.to_owned()),
            delivery_count: Some(d.delivery_count as i64),
            ..self.record(kind)
        }
    }
}

/// The outcome of `item` given its verdict, appending its audit records (unsealed, in chain
/// order) to `records`. `first_dead`: the item's `dead_letters` row ([`dead_row`]) was inserted
/// by this delivery (ignored for a verdict that writes none).
///
/// The records, by outcome: `processed` (with the amount) for a new claim, then a `conflict`
/// (with the amount) naming the earlier claim if there is one; `duplicate`; a first hold's
/// `conflict` and `dead_letter`; a first dead letter's `dead_letter`; `vanished`; and nothing
/// for a repeated hold or dead letter.
pub(crate) fn settle(
    item: &Item<'_>,
    verdict: Verdict,
    first_dead: bool,
    stamp: &Stamp<'_>,
    records: &mut Vec<Record>,
) -> Outcome {
    let Some(d) = Delivered::of(item) else {
        return settle_direct(item, &verdict, first_dead, stamp, records);
    };
    match verdict {
        Verdict::Duplicate {
            first_claimed_at,
            purged_at,
            via_filter,
        } => {
            let mut r = stamp.about(Kind::Duplicate, &d);
            r.detail = Some(detail::duplicate_record(
                &first_claimed_at,
                purged_at.as_deref(),
                via_filter,
            ));
            records.push(r);
            Outcome::Duplicate {
                first_claimed_at,
                purged_at,
            }
        }
        Verdict::Hold { other } => {
            if first_dead {
                let mut c = stamp.about(Kind::Conflict, &d);
                c.amount_cents = Some(d.submission.amount_cents);
                c.detail = Some(detail::conflict_held(&other.key_hex, &other.claimed_at));
                records.push(c);
                let mut r = stamp.about(Kind::DeadLetter, &d);
                r.detail = Some(detail::conflict_hold(&detail::hold_reason(&other.key_hex)));
                records.push(r);
            }
            Outcome::Held {
                other_key: other.key_hex,
                first: first_dead,
            }
        }
        Verdict::Claim { other } => {
            let mut r = stamp.about(Kind::Processed, &d);
            r.amount_cents = Some(d.submission.amount_cents);
            records.push(r);
            let Some(other) = other else {
                return Outcome::Processed;
            };
            let mut c = stamp.about(Kind::Conflict, &d);
            c.amount_cents = Some(d.submission.amount_cents);
            c.detail = Some(if stamp.approving {
                detail::conflict_paid_on_approval(&other.key_hex, &other.claimed_at)
            } else {
                detail::conflict_paid(&other.key_hex, &other.claimed_at)
            });
            records.push(c);
            Outcome::ProcessedConflicting {
                other_key: other.key_hex,
            }
        }
        Verdict::DeadLetter | Verdict::Vanished => {
            unreachable!("a submission's verdict is a claim, a duplicate or a hold")
        }
    }
}

/// [`settle`] for an item that carries no submission.
fn settle_direct(
    item: &Item<'_>,
    verdict: &Verdict,
    first_dead: bool,
    stamp: &Stamp<'_>,
    records: &mut Vec<Record>,
) -> Outcome {
    match (item, verdict) {
        (
            Item::DeadLetter {
                entry_id,
                reason_code,
                reason,
                award_id,
                key,
                delivery_count,
            },
            Verdict::DeadLetter,
        ) => {
            if !first_dead {
                return Outcome::AlreadyDeadLettered;
            }
            records.push(Record {
                idempotency_key: key.map(|k| k.to_hex()),
                award_id: award_id.map(str::to_owned),
                stream_entry_id: Some((*entry_id).to_owned()),
                delivery_count: Some(*delivery_count as i64),
                detail: Some(detail::dead_letter(reason_code, reason)),
                ..stamp.record(Kind::DeadLetter)
            });
            Outcome::DeadLettered
        }
        (Item::Vanished { entry_id, reason }, Verdict::Vanished) => {
            records.push(Record {
                stream_entry_id: Some((*entry_id).to_owned()),
                detail: Some(detail::vanished(stamp.stream, reason)),
                ..stamp.record(Kind::Vanished)
            });
            Outcome::Vanished
        }
        (item, verdict) => unreachable!("{verdict:?} is not the verdict of {item:?}"),
    }
}

#[cfg(test)]
mod tests;
