//! A reviewer's decision on a conflicting resubmission held for review (`run --on-conflict
//! hold`): the [`Review`] side of a ledger, and what every backend decides the same way.
//!
//! A held submission is a `dead_letters` row with reason code `conflict_hold` and its
//! `conflict` and `dead_letter` records; the entry itself is in the dead-letter stream in
//! Redis, which the ledger never reads. So the caller (`ops::review`) reads the entry there,
//! parses it, and hands the submission in; the ledger pays it only if its key is the key its
//! own `dead_letter` record of that entry names, so nothing but what was held can be paid
//! through a decision, whatever was written to Redis since.
//!
//! The decision is four columns of the `dead_letters` row (`decision`, `decided_by`,
//! `decided_reason`, `decided_at`), set once: a row already decided is never decided again,
//! and a purge that removes the row removes its decision with it.

use super::Outcome;
use crate::domain::audit::{detail, Kind, Record};
use crate::domain::submission::Submission;
use crate::error::Result;

/// The reason code of a `dead_letters` row that holds a conflicting resubmission for review.
pub const CONFLICT_HOLD: &str = "conflict_hold";

/// The `dead_letters` rows that hold a conflict no reviewer has decided yet, as SQL: the
/// predicate of each ledger's partial index `dead_letters_awaiting_review` (`schema.sql`,
/// `schema_postgres.sql`), spelled with [`CONFLICT_HOLD`] as a literal, not a parameter, so
/// both planners match the index (a parameter hides the value from a generic plan). Through
/// it, `status` and each `/metrics` scrape read as many rows as await review, not every dead
/// letter.
pub const AWAITING_REVIEW: &str = "reason_code = 'conflict_hold' AND decision IS NULL";

/// What a reviewer decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Pay it, once, as a new submission would have been.
    Approved,
    /// Never pay it.
    Rejected,
}

impl Verdict {
    /// The value stored in `dead_letters.decision`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Rejected => "rejected",
        }
    }

    /// The verdict a stored value names; `None` for anything else.
    pub fn parse(s: &str) -> Option<Verdict> {
        [Verdict::Approved, Verdict::Rejected]
            .into_iter()
            .find(|v| v.as_str() == s)
    }

    /// The kind of the audit record a decision of this verdict leaves.
    pub fn kind(self) -> Kind {
        match self {
            Verdict::Approved => Kind::ConflictApproved,
            Verdict::Rejected => Kind::ConflictRejected,
        }
    }

    /// That record's detail.
    pub fn detail(self, by: &str, reason: &str) -> String {
        match self {
            Verdict::Approved => detail::conflict_approved(by, reason),
            Verdict::Rejected => detail::conflict_rejected(by, reason),
        }
    }
}

/// A decision to record.
#[derive(Debug, Clone)]
pub struct HoldDecision<'a> {
    /// The submissions stream the held entry arrived on (`dead_letters.stream`).
    pub stream: &'a str,
    /// The held entry's id on that stream (`dead_letters.stream_entry_id`).
    pub entry_id: &'a str,
    /// Approve or reject.
    pub verdict: Verdict,
    /// Who decided (non-empty, one line; the command line checks it).
    pub by: &'a str,
    /// Why (non-empty, one line).
    pub reason: &'a str,
    /// The held submission as the dead-letter stream keeps it: paid on approval, named in the
    /// decision's record either way. Its key must be the held one's ([`Decided::Mismatch`]).
    pub submission: &'a Submission,
    /// The consumer name written into the records (and, on approval, the claim).
    pub consumer: &'a str,
}

/// A decision already recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PastDecision {
    /// Approved or rejected.
    pub verdict: Verdict,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (the ledger's time format).
    pub at: String,
}

/// Where one dead letter stands, as the ledger records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LetterState {
    /// The ledger has no dead letter of that entry on that stream.
    Unknown,
    /// A dead letter, not a held conflict: it cannot be decided.
    NotHeld {
        /// Its reason code (`not_json`, `max_deliveries`, …).
        reason_code: String,
    },
    /// A held conflict awaiting a decision.
    Awaiting {
        /// Its award.
        award_id: Option<String>,
        /// When it was held.
        held_at: String,
    },
    /// A held conflict already decided.
    Decided(PastDecision),
}

/// What [`Review::decide`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Approved: the decision and the payment were written in one transaction. The outcome
    /// of the payment: [`Outcome::Processed`] or [`Outcome::ProcessedConflicting`], or
    /// [`Outcome::Duplicate`] when its key was claimed since it was held (nothing paid again).
    Approved(Outcome),
    /// Rejected: the decision and its record written; nothing paid.
    Rejected,
    /// Nothing written: the letter is not a held conflict awaiting a decision; its state says
    /// what it is.
    Refused(LetterState),
    /// Nothing written: the submission handed in is not the one the ledger held (its key is
    /// not the key the ledger's `dead_letter` record of the entry names).
    Mismatch {
        /// The key the ledger holds for the entry, in hex (`None` when no record names one).
        held_key: Option<String>,
    },
}

/// A held conflict awaiting a decision, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldConflict {
    /// The held entry's id on the submissions stream (`dlq show` takes it).
    pub entry_id: String,
    /// Its award.
    pub award_id: Option<String>,
    /// When it was held.
    pub held_at: String,
}

/// Reviewing held conflicts: what `dlq approve`, `dlq reject`, `dlq list`/`show` and `status`
/// ask. SQLite and PostgreSQL implement it; the memory ledger, which is not a `Backend`, does
/// not.
pub trait Review: Send + Sync {
    /// Where the dead letter of `entry_id` on `stream` stands.
    fn letter_state(&self, stream: &str, entry_id: &str) -> Result<LetterState>;

    /// How many held conflicts of `stream` await a decision, and the first `limit` of them,
    /// oldest first.
    fn held_awaiting(&self, stream: &str, limit: usize) -> Result<(u64, Vec<HeldConflict>)>;

    /// Records `d` in one transaction: the decision on the `dead_letters` row, its
    /// `conflict_approved` / `conflict_rejected` record and, on approval, the payment exactly as
    /// a new submission's (claim, disbursement, outbox row, `processed` record, and a `conflict`
    /// record worded by `detail::conflict_paid_on_approval` when the earlier claim is still
    /// there) — all or nothing. The letter is read and decided under the lock that serializes
    /// writers of it, so two decisions of one letter, at once or one after the other, leave
    /// exactly one ([`Decided::Refused`] for the other), and the claim's uniqueness keeps any
    /// path from paying it twice. On PostgreSQL the records are then linked into the chain as
    /// any batch's are. An error wrote nothing.
    fn decide(&self, d: &HoldDecision<'_>) -> Result<Decided>;
}

/// Whether a letter in `state` may be decided now; every backend asks this, under its lock,
/// before writing anything.
pub(crate) fn admits(state: &LetterState) -> bool {
    matches!(state, LetterState::Awaiting { .. })
}

/// The state a `dead_letters` row's columns describe: reason code, award, recorded at, and
/// the four decision columns.
pub(crate) fn state_of(
    reason_code: String,
    award_id: Option<String>,
    recorded_at: String,
    decision: [Option<String>; 4],
) -> LetterState {
    if reason_code != CONFLICT_HOLD {
        return LetterState::NotHeld { reason_code };
    }
    match decision {
        [Some(verdict), by, reason, at] => LetterState::Decided(PastDecision {
            // A value this build does not know reads as a rejection: never as "awaiting",
            // which would let it be decided (and paid) again.
            verdict: Verdict::parse(&verdict).unwrap_or(Verdict::Rejected),
            by: by.unwrap_or_default(),
            reason: reason.unwrap_or_default(),
            at: at.unwrap_or_default(),
        }),
        _ => LetterState::Awaiting {
            award_id,
            held_at: recorded_at,
        },
    }
}

/// The record a decision leaves: kind by verdict, the held submission's key, award and entry,
/// the consumer, and who decided and why in its detail.
pub(crate) fn decision_record(d: &HoldDecision<'_>, now: &str) -> Record {
    Record {
        idempotency_key: Some(d.submission.key.to_hex()),
        award_id: Some(d.submission.award_id.clone()),
        stream_entry_id: Some(d.entry_id.to_owned()),
        consumer: Some(d.consumer.to_owned()),
        detail: Some(d.verdict.detail(d.by, d.reason)),
        ..Record::unsealed(d.verdict.kind(), now)
    }
}

/// Whether `detail` is the detail of the `dead_letter` record that holds a conflict.
pub(crate) fn is_hold_record(detail: Option<&str>) -> bool {
    detail.is_some_and(|d| d.starts_with(&format!("{CONFLICT_HOLD}: ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_awaiting_predicate_names_the_hold_reason_code() {
        assert!(AWAITING_REVIEW.contains(&format!("reason_code = '{CONFLICT_HOLD}'")));
    }

    #[test]
    fn only_a_conflict_hold_without_a_decision_may_be_decided() {
        let none = || [None, None, None, None];
        let awaiting = state_of(CONFLICT_HOLD.into(), Some("A".into()), "T".into(), none());
        assert!(admits(&awaiting));
        let other = state_of("not_json".into(), None, "T".into(), none());
        assert_eq!(
            other,
            LetterState::NotHeld {
                reason_code: "not_json".into()
            }
        );
        assert!(!admits(&other));
        let decided = state_of(
            CONFLICT_HOLD.into(),
            None,
            "T".into(),
            [
                Some("approved".into()),
                Some("ann".into()),
                Some("ok".into()),
                Some("T2".into()),
            ],
        );
        assert!(!admits(&decided));
        // An unknown stored verdict is never read back as awaiting.
        let odd = state_of(
            CONFLICT_HOLD.into(),
            None,
            "T".into(),
            [Some("maybe".into()), None, None, None],
        );
        assert!(!admits(&odd));
    }

    #[test]
    fn the_hold_record_is_recognised_by_its_reason_code() {
        let held = detail::conflict_hold(&detail::hold_reason("ab"));
        assert!(is_hold_record(Some(&held)));
        assert!(!is_hold_record(Some("not_json: payload is not JSON")));
        assert!(!is_hold_record(None));
    }
}
