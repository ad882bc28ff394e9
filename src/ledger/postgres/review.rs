//! [`Review`] on PostgreSQL: a held conflict decided in one transaction, then linked into the
//! chain as any batch is.
//!
//! An approval is a batch of one recorded by `batch::record_with`, as a new submission is
//! under `--on-conflict record`, with its group waited for (never deferred); its last step,
//! under that group lock, locks the letter's `dead_letters` row (`FOR UPDATE`: the lock order
//! every batch keeps, groups before dead letters), reads it undecided, checks the key, decides
//! it and adds the decision's record to the batch's members, so the payment and the decision
//! commit together or not at all. A rejection pays nothing: the row locked, read, decided and
//! its record written as a batch of one member, in one transaction. Two decisions of one
//! letter queue on its row lock; the second reads it decided and writes nothing.

use super::batch::{self, Context};
use super::ledger::PgLedger;
use super::{link, write};
use crate::config::OnConflict;
use crate::domain::audit::Record;
use crate::error::{Error, Result};
use crate::ledger::review::{self, Decided, HeldConflict, HoldDecision, LetterState, Verdict};
use crate::ledger::{Item, Outcome, Review};
use std::collections::HashSet;
use std::sync::Mutex;

/// The row's reason code, award, time held, decision columns and delivery count.
const LETTER: &str = "SELECT reason_code, award_id, recorded_at, decision, decided_by,
        decided_reason, decided_at, delivery_count
     FROM dead_letters WHERE stream = $1 AND stream_entry_id = $2";

/// The key of the `dead_letter` records of an entry, linked or not, with their detail.
const HELD_KEYS: &str = "SELECT encode(idempotency_key, 'hex'), detail FROM audit_log
     WHERE kind = 'dead_letter' AND stream_entry_id = $1";

const DECIDE: &str = "UPDATE dead_letters SET decision = $3, decided_by = $4,
         decided_reason = $5, decided_at = $6
     WHERE stream = $1 AND stream_entry_id = $2 AND decision IS NULL";

impl Review for PgLedger {
    fn letter_state(&self, stream: &str, entry_id: &str) -> Result<LetterState> {
        let mut conn = self.conn()?;
        let row = conn.client.query_opt(LETTER, &[&stream, &entry_id])?;
        Ok(row.map_or(LetterState::Unknown, |r| state_of(&r)))
    }

    fn held_awaiting(&self, stream: &str, limit: usize) -> Result<(u64, Vec<HeldConflict>)> {
        let mut conn = self.conn()?;
        let mut tx = conn
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let count: i64 = tx
            .query_one(
                &format!(
                    "SELECT COUNT(*) FROM dead_letters
                     WHERE stream = $1 AND {}",
                    review::AWAITING_REVIEW
                ),
                &[&stream],
            )?
            .get(0);
        let first = tx
            .query(
                &format!(
                    "SELECT stream_entry_id, award_id, recorded_at FROM dead_letters
                     WHERE stream = $1 AND {}
                     ORDER BY recorded_at, stream_entry_id LIMIT $2",
                    review::AWAITING_REVIEW
                ),
                &[&stream, &(limit as i64)],
            )?
            .iter()
            .map(|r| HeldConflict {
                entry_id: r.get(0),
                award_id: r.get(1),
                held_at: r.get(2),
            })
            .collect();
        tx.commit()?;
        Ok((count as u64, first))
    }

    fn decide(&self, d: &HoldDecision<'_>) -> Result<Decided> {
        match d.verdict {
            Verdict::Approved => self.approve(d),
            Verdict::Rejected => self.reject(d),
        }
    }
}

impl PgLedger {
    /// Pays the held submission and records the approval, in one batch.
    fn approve(&self, d: &HoldDecision<'_>) -> Result<Decided> {
        let mut conn = self.conn()?;
        // Named as deferred, so the batch waits for its group rather than deferring it.
        let deferred = Mutex::new(HashSet::from([d.entry_id.to_owned()]));
        let ctx = Context {
            consumer: d.consumer,
            stream: d.stream,
            on_conflict: OnConflict::Record,
            deferred: &deferred,
            approving: true,
        };
        // Read before the batch, for the processed record; the row is read again, locked, in
        // the batch's last step, which is what decides.
        let delivery_count = match conn.client.query_opt(LETTER, &[&d.stream, &d.entry_id])? {
            Some(r) => r.get::<_, i64>(7),
            None => return Ok(Decided::Refused(LetterState::Unknown)),
        };
        let items = [Item::Submission {
            submission: d.submission,
            entry_id: d.entry_id,
            // The deliveries it had when it was held: approval is no delivery of its own.
            delivery_count: delivery_count.max(1) as u64,
        }];
        let mut refused: Option<Decided> = None;
        let mut last = |tx: &mut postgres::Transaction<'_>,
                        outcomes: &[Outcome],
                        members: &mut Vec<Record>,
                        now: &str|
         -> Result<bool> {
            if outcomes.contains(&Outcome::Deferred) {
                return Err(Error::Invariant(
                    "an approval's batch was deferred although its group was waited for".into(),
                ));
            }
            if let Some(no) = lock_and_check(tx, d)? {
                refused = Some(no);
                return Ok(false);
            }
            decide_row(tx, d, now)?;
            members.push(review::decision_record(d, now));
            Ok(true)
        };
        let outcomes = batch::record_with(&mut conn, &ctx, &items, &mut |_| {}, &mut last)?;
        match (outcomes, refused) {
            (Some(mut outcomes), _) => Ok(Decided::Approved(
                outcomes.pop().expect("one outcome per item"),
            )),
            (None, Some(refused)) => Ok(refused),
            (None, None) => Err(Error::Invariant(
                "an approval's batch was given up without a reason".into(),
            )),
        }
    }

    /// Records the rejection: nothing paid.
    fn reject(&self, d: &HoldDecision<'_>) -> Result<Decided> {
        let mut conn = self.conn()?;
        let st = write::Statements::prepare(&mut conn)?;
        let mut tx = conn.client.transaction()?;
        if let Some(no) = lock_and_check(&mut tx, d)? {
            return Ok(no);
        }
        let now = crate::domain::clock::now_rfc3339();
        decide_row(&mut tx, d, &now)?;
        let mut members = [review::decision_record(d, &now)];
        let written = write::write_members(&mut tx, &st, &mut members, &[], &now)?
            .ok_or_else(|| Error::Invariant("a rejection's record wrote no batch".into()))?;
        crate::support::failpoint::hit("before_decision_commit");
        tx.commit()?;
        link::link_committed(&mut conn, written)?;
        Ok(Decided::Rejected)
    }
}

/// Locks the letter's row and says why it may not be decided, if it may not: not a held
/// conflict awaiting a decision, or not holding the submission `d` carries.
fn lock_and_check(
    tx: &mut postgres::Transaction<'_>,
    d: &HoldDecision<'_>,
) -> Result<Option<Decided>> {
    let row = tx.query_opt(&format!("{LETTER} FOR UPDATE"), &[&d.stream, &d.entry_id])?;
    let state = row.map_or(LetterState::Unknown, |r| state_of(&r));
    if !review::admits(&state) {
        return Ok(Some(Decided::Refused(state)));
    }
    let held_key = tx
        .query(HELD_KEYS, &[&d.entry_id])?
        .iter()
        .find(|r| review::is_hold_record(r.get::<_, Option<&str>>(1)))
        .and_then(|r| r.get::<_, Option<String>>(0));
    if held_key.as_deref() != Some(d.submission.key.to_hex().as_str()) {
        return Ok(Some(Decided::Mismatch { held_key }));
    }
    Ok(None)
}

/// Sets the decision on the row `lock_and_check` locked and read undecided.
fn decide_row(tx: &mut postgres::Transaction<'_>, d: &HoldDecision<'_>, now: &str) -> Result<()> {
    let n = tx.execute(
        DECIDE,
        &[
            &d.stream,
            &d.entry_id,
            &d.verdict.as_str(),
            &d.by,
            &d.reason,
            &now,
        ],
    )?;
    assert_eq!(n, 1, "the letter was read undecided under its row lock");
    Ok(())
}

/// The state a row of [`LETTER`] describes.
fn state_of(r: &postgres::Row) -> LetterState {
    review::state_of(
        r.get(0),
        r.get(1),
        r.get(2),
        [r.get(3), r.get(4), r.get(5), r.get(6)],
    )
}
