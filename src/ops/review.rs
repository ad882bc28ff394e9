//! `claimgate dlq approve` and `claimgate dlq reject`: a reviewer's decision on a conflicting
//! resubmission the worker held for review (`run --on-conflict hold`).
//!
//! The held entry is read from the dead-letter stream (by its dead-letter id or its original
//! entry id, as `dlq show` finds it) and parsed as the worker parses a submission; the ledger
//! then decides it in one transaction (`ledger::Review::decide`): only a held conflict that
//! awaits a decision, and only with the very submission it held (same key), or nothing is
//! written. Nothing here touches the dead-letter stream: the letter stays there as evidence,
//! and `dlq list` / `dlq show` read its decision from the ledger.

use super::dlq::{self, DecideArgs, Letter};
use crate::broker::stream::Conn;
use crate::config::Config;
use crate::domain::money::dollars;
use crate::domain::submission::{self, Submission};
use crate::error::{Error, Result};
use crate::ledger::{Backend, Decided, HoldDecision, Inspect, LetterState, Outcome, Verdict};
use crate::support::escape;

/// The consumer name a decision's records (and an approved claim) carry: the reviewer is named
/// in the decision's detail.
pub const REVIEW_CONSUMER: &str = "dlq review";

/// Decides the held conflict `args.id` as `verdict`; returns what to tell the operator, or an
/// error naming why nothing was decided.
pub fn decide(
    cfg: &Config,
    ledger: &dyn Backend,
    conn: &mut Conn,
    verdict: Verdict,
    args: &DecideArgs,
) -> Result<String> {
    let letter = dlq::find(conn, cfg, &args.id)?.ok_or_else(|| {
        Error::Other(format!(
            "no dead letter {} on {} (neither a dead-letter id nor an original entry id)",
            args.id,
            cfg.dead_stream()
        ))
    })?;
    let what = name(&letter);
    let Some(original) = letter.original_id.clone() else {
        return Err(Error::Other(format!(
            "{what} does not name its original entry; it cannot be matched to the ledger"
        )));
    };
    // The ledger is the authority on what the letter is; asked first, so a letter that is not
    // a held conflict is refused for that, whatever its fields hold.
    let state = ledger.letter_state(&cfg.stream, &original)?;
    if !matches!(state, LetterState::Awaiting { .. }) {
        return Err(refusal(&what, &state, ledger));
    }
    let submission = held_submission(&letter, &what)?;
    let decision = HoldDecision {
        stream: &cfg.stream,
        entry_id: &original,
        verdict,
        by: &args.by,
        reason: &args.reason,
        submission: &submission,
        consumer: REVIEW_CONSUMER,
    };
    let award = escape::controls(&submission.award_id).into_owned();
    let by = &args.by;
    match ledger.decide(&decision)? {
        Decided::Approved(Outcome::Duplicate {
            first_claimed_at, ..
        }) => Ok(format!(
            "approved {what} (award {award}) as {by}: its key was already claimed at \
             {first_claimed_at}, so nothing was paid again; the approval is recorded"
        )),
        Decided::Approved(_) => Ok(format!(
            "approved {what} (award {award}) as {by}: paid {} ({} cents) once, recorded with its \
             outbox row for the relay; the approval is in the audit trail",
            dollars(i128::from(submission.amount_cents)),
            submission.amount_cents
        )),
        Decided::Rejected => Ok(format!(
            "rejected {what} (award {award}) as {by}: nothing paid; the rejection is in the \
             audit trail"
        )),
        Decided::Refused(state) => Err(refusal(&what, &state, ledger)),
        Decided::Mismatch { held_key } => Err(Error::Other(format!(
            "{what} on {} does not hold the submission the ledger held (its key {} is not the \
             held key {}): the dead-letter stream was changed since; nothing decided",
            cfg.dead_stream(),
            submission.key.to_hex(),
            held_key.as_deref().unwrap_or("(none recorded)")
        ))),
    }
}

/// "dead letter D (original entry E)", for messages.
fn name(letter: &Letter) -> String {
    format!(
        "dead letter {} (original entry {})",
        letter.id,
        letter.original_id.as_deref().unwrap_or("?")
    )
}

/// Why a letter in `state` cannot be decided.
fn refusal(what: &str, state: &LetterState, ledger: &dyn Inspect) -> Error {
    Error::Other(match state {
        LetterState::Unknown => format!(
            "{what} is not recorded in the ledger {} as a dead letter of this stream; only a \
             conflict held for review there can be decided (is --db the worker's ledger, and \
             --stream its stream?)",
            ledger.describe()
        ),
        LetterState::NotHeld { reason_code } => format!(
            "{what} is a {reason_code} dead letter, not a conflict held for review (run \
             --on-conflict hold); only a held conflict can be approved or rejected (dlq replay \
             puts an entry fixed upstream back)",
        ),
        LetterState::Decided(p) => format!(
            "{what} was already {} by {} at {} ({}); a held conflict is decided once",
            p.verdict.as_str(),
            escape::controls(&p.by),
            p.at,
            escape::controls(&p.reason)
        ),
        LetterState::Awaiting { .. } => {
            unreachable!("a letter awaiting a decision is not refused")
        }
    })
}

/// The held submission, parsed from the letter's original fields as the worker parsed it.
/// The limits are the largest any worker can be given, not the defaults: the worker accepted it
/// under its own, and the ledger pays it only if its key is the held one.
fn held_submission(letter: &Letter, what: &str) -> Result<Submission> {
    let original = letter.original_fields();
    let limits = submission::Limits {
        payload_bytes_max: crate::config::PAYLOAD_BYTES_MAX_MAX as usize,
        amount_cents_max: i64::MAX,
    };
    submission::parse_entry(&original, &limits).map_err(|why| {
        Error::Other(format!(
            "{what} does not hold a submission that can be paid ({why}); nothing decided"
        ))
    })
}
