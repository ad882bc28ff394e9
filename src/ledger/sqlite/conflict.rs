//! Conflicting resubmissions: the same award at the same submission instant with a different
//! payload. "The same instant" is compared as `submission_instant` (UTC, one spelling), so
//! `…09:00:00Z` and `…11:00:00+02:00` conflict although their keys differ.
//!
//! By design such a resubmission has its own key and is not suppressed (the reference design:
//! a genuine resubmission must not be lost). It is made visible instead: a `conflict` audit
//! record links both keys, and under `--on-conflict hold` it is dead-lettered for review rather
//! than paid. Everything here runs inside the batch's open transaction; the batch (`batch.rs`)
//! writes the audit records, so this file knows nothing of it.

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

/// The earliest claim with a submission's award and instant but another key. Almost always
/// there is none, so this only probes the index that leads with exactly these two columns (the
/// claim's own in a ledger made by this release, `claim_instant` in an older one), which holds
/// the key and `claim_id` (the rowid): no table row is read and nothing is sorted.
pub(super) const EARLIEST_OTHER: &str = "SELECT MIN(claim_id) FROM processed_messages
     WHERE submission_instant = ?1 AND award_id = ?2 AND idempotency_key <> ?3";

/// The earliest claim with this submission's award and instant but another key, if any.
/// `earliest` is [`EARLIEST_OTHER`], prepared; the claim's row is read only on a hit.
pub(super) fn find(
    tx: &Transaction<'_>,
    earliest: &mut rusqlite::Statement<'_>,
    s: &crate::domain::submission::Submission,
) -> Result<Option<Other>> {
    let earliest: Option<i64> = earliest.query_row(
        params![
            s.submission_instant,
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

/// The `dead_letters` row that holds a conflicting submission for review.
pub(super) struct Held<'r> {
    /// The stream it arrived on.
    pub(super) stream: &'r str,
    /// The entry that carried it.
    pub(super) entry_id: &'r str,
    /// `domain::audit::detail::hold_reason`.
    pub(super) reason: &'r str,
    /// Its award.
    pub(super) award_id: &'r str,
    /// Deliveries so far.
    pub(super) delivery_count: u64,
    /// The batch's time.
    pub(super) now: &'r str,
}

/// Inserts the hold row, once per stream entry; true if this call inserted it (an earlier
/// delivery may already have held the entry).
pub(super) fn insert_hold(tx: &Transaction<'_>, held: &Held<'_>) -> Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code, reason,
             award_id, delivery_count, recorded_at) VALUES (?1, ?2, 'conflict_hold', ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            held.stream,
            held.entry_id,
            held.reason,
            held.award_id,
            held.delivery_count as i64,
            held.now
        ])?;
    Ok(inserted == 1)
}
