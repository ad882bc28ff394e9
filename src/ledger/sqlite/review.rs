//! [`Review`] on SQLite: a held conflict decided in one `BEGIN IMMEDIATE` transaction on the
//! writer's connection, so the letter is read, decided and (on approval) paid under the one
//! write lock every writer of the file takes — a second decision of the same letter, in this
//! process or another, reads it decided and is refused.
//!
//! The payment is a batch of one ([`Batch`]) recorded as the worker records a new submission
//! under `--on-conflict record`, so it is paid exactly as any submission is (its claim decided
//! by the unique index), then the decision's record is appended after the batch's records.

use super::batch::{Batch, Context};
use super::fence::{fenced, refuse_fenced};
use super::ledger::SqliteLedger;
use crate::config::OnConflict;
use crate::error::Result;
use crate::ledger::review::{self, Decided, HeldConflict, HoldDecision, LetterState, Verdict};
use crate::ledger::{Item, Review};
use crate::support::failpoint;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The row's reason code, award, time held and decision columns.
const LETTER: &str = "SELECT reason_code, award_id, recorded_at, decision, decided_by,
        decided_reason, decided_at
     FROM dead_letters WHERE stream = ?1 AND stream_entry_id = ?2";

impl Review for SqliteLedger {
    fn letter_state(&self, stream: &str, entry_id: &str) -> Result<LetterState> {
        letter_state(&*self.conn()?, stream, entry_id)
    }

    fn held_awaiting(&self, stream: &str, limit: usize) -> Result<(u64, Vec<HeldConflict>)> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let count: i64 = tx.query_row(
            &format!(
                "SELECT COUNT(*) FROM dead_letters WHERE stream = ?1 AND {}",
                review::AWAITING_REVIEW
            ),
            params![stream],
            |r| r.get(0),
        )?;
        let first = tx
            .prepare(&format!(
                "SELECT stream_entry_id, award_id, recorded_at FROM dead_letters
                 WHERE stream = ?1 AND {}
                 ORDER BY recorded_at, stream_entry_id LIMIT ?2",
                review::AWAITING_REVIEW
            ))?
            .query_map(params![stream, limit as i64], |r| {
                Ok(HeldConflict {
                    entry_id: r.get(0)?,
                    award_id: r.get(1)?,
                    held_at: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok((count as u64, first))
    }

    fn decide(&self, d: &HoldDecision<'_>) -> Result<Decided> {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.is_none() {
            *writer = Some(super::writer::Writer::open(&self.path, &self.settings)?);
        }
        let super::writer::Writer {
            statements,
            groups,
            conn,
        } = writer.as_mut().expect("just opened");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // A fenced ledger's rows live elsewhere now: a payment here would be lost to them.
        if let Some((to, at)) = fenced(&tx)? {
            return Err(refuse_fenced(&self.path, &to, &at));
        }
        let state = letter_state(&tx, d.stream, d.entry_id)?;
        if !review::admits(&state) {
            return Ok(Decided::Refused(state));
        }
        let held_key = held_key(&tx, d.entry_id)?;
        if held_key.as_deref() != Some(d.submission.key.to_hex().as_str()) {
            return Ok(Decided::Mismatch { held_key });
        }
        let delivery_count: i64 = tx.query_row(
            "SELECT delivery_count FROM dead_letters WHERE stream = ?1 AND stream_entry_id = ?2",
            params![d.stream, d.entry_id],
            |r| r.get(0),
        )?;
        let ctx = Context {
            consumer: d.consumer,
            stream: d.stream,
            on_conflict: OnConflict::Record,
            claims_by_spelling: self.claims_by_spelling,
            derives: self.derives,
            approving: true,
        };
        let mut batch = Batch::start(&tx, statements, groups, &ctx, 1)?;
        let outcome = match d.verdict {
            Verdict::Approved => Some(batch.item(&Item::Submission {
                submission: d.submission,
                entry_id: d.entry_id,
                // The deliveries it had when it was held: approval is no delivery of its own.
                delivery_count: delivery_count.max(1) as u64,
            })?),
            Verdict::Rejected => None,
        };
        let decided = tx
            .prepare_cached(
                "UPDATE dead_letters SET decision = ?3, decided_by = ?4, decided_reason = ?5,
                     decided_at = ?6
                 WHERE stream = ?1 AND stream_entry_id = ?2 AND decision IS NULL",
            )?
            .execute(params![
                d.stream,
                d.entry_id,
                d.verdict.as_str(),
                d.by,
                d.reason,
                batch.now()
            ])?;
        assert_eq!(
            decided, 1,
            "the letter was read undecided under the write lock"
        );
        let decision = review::decision_record(d, batch.now());
        batch.append(decision);
        let claim_id_max = batch.finish()?;
        failpoint::hit("before_decision_commit");
        tx.commit()?;
        groups.committed_through(claim_id_max);
        Ok(match outcome {
            Some(outcome) => Decided::Approved(outcome),
            None => Decided::Rejected,
        })
    }
}

/// Where the dead letter of `entry_id` on `stream` stands, read on `conn`.
fn letter_state(conn: &Connection, stream: &str, entry_id: &str) -> Result<LetterState> {
    let row = conn
        .prepare_cached(LETTER)?
        .query_row(params![stream, entry_id], |r| {
            Ok(review::state_of(
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                [r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?],
            ))
        })
        .optional()?;
    Ok(row.unwrap_or(LetterState::Unknown))
}

/// The key the `dead_letter` record that held `entry_id` names, if one does.
fn held_key(conn: &Connection, entry_id: &str) -> Result<Option<String>> {
    let mut st = conn.prepare_cached(
        "SELECT idempotency_key, detail FROM audit_log
         WHERE kind = 'dead_letter' AND stream_entry_id = ?1 ORDER BY seq",
    )?;
    let rows = st
        .query_map([entry_id], |r| {
            Ok((
                super::derived::key_hex(r.get_ref(0)?)?,
                r.get::<_, Option<String>>(1)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows
        .into_iter()
        .find(|(_, detail)| review::is_hold_record(detail.as_deref()))
        .and_then(|(key, _)| key))
}
