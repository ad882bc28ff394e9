//! Conflicting resubmissions: the same award and submission time with a different payload.
//!
//! By design such a resubmission has its own key and is not suppressed (the reference design:
//! a genuine resubmission must not be lost). It is made visible instead: a `conflict` audit
//! record links both keys, and under `--on-conflict hold` it is dead-lettered for review rather
//! than paid. Everything here runs inside the batch's open transaction.

use super::batch::{Batch, Claim};
use super::Outcome;
use crate::domain::audit::{Kind, Record};
use crate::domain::key::to_hex;
use crate::error::Result;
use rusqlite::{params, OptionalExtension, Transaction};

/// The earlier claim a submission conflicts with.
pub(super) struct Other {
    /// Its key, in hex.
    pub(super) key_hex: String,
    /// When it was claimed.
    pub(super) claimed_at: String,
}

/// The earliest claim with this submission's award and time but another key, if any.
/// Almost always there is none, so the first query only probes the claim's unique index, which
/// leads with exactly these two columns and ends with `claim_id` (the rowid): no table row is
/// read and nothing is sorted unless there is a conflict to describe.
pub(super) fn find(
    tx: &Transaction<'_>,
    s: &crate::domain::submission::Submission,
) -> Result<Option<Other>> {
    let earliest: Option<i64> = tx
        .prepare_cached(
            "SELECT MIN(claim_id) FROM processed_messages
             WHERE submission_timestamp = ?1 AND award_id = ?2 AND idempotency_key <> ?3",
        )?
        .query_row(
            params![
                s.submission_timestamp,
                s.award_id,
                s.key.as_bytes().as_slice()
            ],
            |r| r.get(0),
        )?;
    let Some(claim_id) = earliest else {
        return Ok(None);
    };
    let other = tx
        .prepare_cached(
            "SELECT idempotency_key, claimed_at FROM processed_messages WHERE claim_id = ?1",
        )?
        .query_row([claim_id], |r| {
            Ok(Other {
                key_hex: to_hex(&r.get::<_, Vec<u8>>(0)?),
                claimed_at: r.get(1)?,
            })
        })
        .optional()?;
    Ok(other)
}

/// The `conflict` record linking `claim` to the earlier claim `other`.
pub(super) fn record(batch: &Batch<'_, '_>, claim: &Claim<'_>, other: &Other) -> Record {
    let s = claim.submission;
    let mut r = batch.claim_record(Kind::Conflict, claim);
    r.amount_cents = Some(s.amount_cents);
    r.detail = Some(format!(
        "conflicts with key {} (claimed at {}): same award_id and submission_timestamp, different payload",
        other.key_hex, other.claimed_at
    ));
    r
}

/// Holds a conflicting submission for review: a `dead_letters` row plus `conflict` and
/// `dead_letter` records, once per stream entry. Nothing is claimed or paid.
pub(super) fn hold(batch: &mut Batch<'_, '_>, claim: &Claim<'_>, other: &Other) -> Result<Outcome> {
    let s = claim.submission;
    let reason = format!(
        "conflicts with key {} for the same award and submission time; held for review",
        other.key_hex
    );
    let inserted = batch
        .tx
        .prepare_cached(
            "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code, reason,
             award_id, delivery_count, recorded_at) VALUES (?1, ?2, 'conflict_hold', ?3, ?4, ?5, ?6)",
        )?
        .execute(params![batch.ctx.stream, claim.entry_id, reason, s.award_id, claim.delivery_count as i64, batch.now])?;
    if inserted == 1 {
        let mut c = record(batch, claim, other);
        c.detail = Some(format!(
            "{}; held for review, not paid (--on-conflict hold)",
            c.detail.unwrap_or_default()
        ));
        batch.append(c);
        let mut d = batch.claim_record(Kind::DeadLetter, claim);
        d.detail = Some(format!("conflict_hold: {reason}"));
        batch.append(d);
    }
    Ok(Outcome::Held {
        other_key: other.key_hex.clone(),
        first: inserted == 1,
    })
}
