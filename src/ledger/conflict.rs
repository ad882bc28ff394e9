//! Conflicting resubmissions: the same award and submission time with a different payload.
//!
//! By design such a resubmission has its own key and is not suppressed (the reference design:
//! a genuine resubmission must not be lost). It is made visible instead: a `conflict` audit
//! record links both keys, and under `--on-conflict hold` it is dead-lettered for review rather
//! than paid. Everything here runs inside the batch's open transaction.

use super::sqlite::{blank_record, ChainTail, Claim, Context};
use super::Outcome;
use crate::audit::{Kind, Record};
use crate::error::Result;
use crate::key::to_hex;
use rusqlite::{params, OptionalExtension, Transaction};

/// The earlier claim a submission conflicts with.
pub(super) struct Other {
    /// Its key, in hex.
    pub(super) key_hex: String,
    /// When it was claimed.
    pub(super) claimed_at: String,
}

/// The earliest claim with this submission's award and time but another key, if any.
/// One lookup on the `processed_messages_award_ts` index.
pub(super) fn find(
    tx: &Transaction<'_>,
    s: &crate::submission::Submission,
) -> Result<Option<Other>> {
    let other = tx
        .prepare_cached(
            "SELECT idempotency_key, claimed_at FROM processed_messages
             WHERE award_id = ?1 AND submission_timestamp = ?2 AND idempotency_key <> ?3
             ORDER BY claim_id LIMIT 1",
        )?
        .query_row(
            params![
                s.award_id,
                s.submission_timestamp,
                s.key.as_bytes().as_slice()
            ],
            |r| {
                Ok(Other {
                    key_hex: to_hex(&r.get::<_, Vec<u8>>(0)?),
                    claimed_at: r.get(1)?,
                })
            },
        )
        .optional()?;
    Ok(other)
}

/// True when `key` is already claimed.
pub(super) fn is_claimed(tx: &Transaction<'_>, key: &[u8]) -> Result<bool> {
    let hit = tx
        .prepare_cached("SELECT 1 FROM processed_messages WHERE idempotency_key = ?1")?
        .query_row([key], |_| Ok(()))
        .optional()?;
    Ok(hit.is_some())
}

/// The `conflict` record linking `claim` to the earlier claim `other`.
pub(super) fn record(claim: &Claim<'_>, other: &Other, consumer: &str, now: &str) -> Record {
    let s = claim.submission;
    let mut r = blank_record(Kind::Conflict, consumer, now);
    r.idempotency_key = Some(s.key.to_hex());
    r.award_id = Some(s.award_id.clone());
    r.amount_cents = Some(s.amount_cents);
    r.stream_entry_id = Some(claim.entry_id.to_owned());
    r.delivery_count = Some(claim.delivery_count as i64);
    r.detail = Some(format!(
        "conflicts with key {} (claimed at {}): same award_id and submission_timestamp, different payload",
        other.key_hex, other.claimed_at
    ));
    r
}

/// Holds a conflicting submission for review: a `dead_letters` row plus `conflict` and
/// `dead_letter` records, once per stream entry. Nothing is claimed or paid.
pub(super) fn hold(
    tx: &Transaction<'_>,
    tail: &mut ChainTail,
    claim: &Claim<'_>,
    other: &Other,
    ctx: &Context<'_>,
    now: &str,
) -> Result<Outcome> {
    let s = claim.submission;
    let reason = format!(
        "conflicts with key {} for the same award and submission time; held for review",
        other.key_hex
    );
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code, reason,
             award_id, delivery_count, recorded_at) VALUES (?1, ?2, 'conflict_hold', ?3, ?4, ?5, ?6)",
        )?
        .execute(params![ctx.stream, claim.entry_id, reason, s.award_id, claim.delivery_count as i64, now])?;
    if inserted == 1 {
        let mut c = record(claim, other, ctx.consumer, now);
        c.detail = Some(format!(
            "{}; held for review, not paid (--on-conflict hold)",
            c.detail.unwrap_or_default()
        ));
        tail.append(tx, c)?;
        let mut d = blank_record(Kind::DeadLetter, ctx.consumer, now);
        d.idempotency_key = Some(s.key.to_hex());
        d.award_id = Some(s.award_id.clone());
        d.stream_entry_id = Some(claim.entry_id.to_owned());
        d.delivery_count = Some(claim.delivery_count as i64);
        d.detail = Some(format!("conflict_hold: {reason}"));
        tail.append(tx, d)?;
    }
    Ok(Outcome::Held {
        other_key: other.key_hex.clone(),
        first: inserted == 1,
    })
}
