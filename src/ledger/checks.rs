//! Checks every backend's `verify` makes the same way, beyond the chain walk ([`super::chain`]):
//! facts a ledger's tables must agree with, where the tables are what the worker and `retention`
//! act on and an edit to them touches nothing hashed. Each backend reads its own rows and hands
//! them here, so SQLite and PostgreSQL name a violation in the same words.
//!
//! Invariant: this module only reads what it is handed.

use crate::domain::audit::Record;
use crate::domain::clock;
use crate::error::{Error, Result};
use crate::ledger::records::Columns;
use crate::ledger::Hold;

/// The column sets a claim must be unique on, any one of which will do: its instant, award
/// and key (this release's constraint), its timestamp, award and key, or its key alone (those
/// of ledgers earlier releases made). Both backends' `verify` hold `processed_messages` to it.
pub const CLAIM_UNIQUE: &[&[&str]] = &[
    &["submission_instant", "award_id", "idempotency_key"],
    &["submission_timestamp", "award_id", "idempotency_key"],
    &["idempotency_key"],
];

/// Each table of `required` is still unique on one of its column sets, as `sets_of` reads
/// the column sets the schema makes it unique on (in order); the first one that is not is
/// [`Error::Invariant`], naming the table and its first set. Someone who can change the
/// schema can drop a constraint and every row may still look right until the second claim or
/// outbox row arrives, so the constraint itself is checked.
pub fn unique(
    required: &[(&str, &[&[&str]])],
    mut sets_of: impl FnMut(&str) -> Result<Vec<Vec<String>>>,
) -> Result<()> {
    for (table, any_of) in required {
        let sets = sets_of(table)?;
        let held = any_of.iter().any(|cols| {
            sets.iter()
                .any(|set| set.iter().map(String::as_str).eq(cols.iter().copied()))
        });
        if !held {
            return Err(Error::Invariant(format!(
                "schema altered: {table} is no longer unique on ({})",
                any_of[0].join(", ")
            )));
        }
    }
    Ok(())
}

/// Every disbursement has its `processed` record. Every `processed` record has been matched
/// to a disbursement already, so equal counts mean every disbursement has its record, unless
/// two records name one key; counts that differ are [`Error::Invariant`], naming the first
/// disbursement without a record as `unrecorded` finds it (asked only then), or the counts.
pub fn processed_records(
    disbursements: u64,
    processed: u64,
    unrecorded: impl FnOnce() -> Result<Option<String>>,
) -> Result<()> {
    if processed == disbursements {
        return Ok(());
    }
    // Every disbursement has a record, so the counts differ only if records are shared.
    Err(Error::Invariant(format!(
        "disbursement without a processed record: {}",
        unrecorded()?.unwrap_or_else(|| format!(
            "{disbursements} disbursements but {processed} processed records"
        ))
    )))
}

/// A claim's `submission_instant` is the instant its `submission_timestamp` names. The claim's
/// uniqueness leads with that column (`schema.sql`), so a claim whose instant was moved, by even
/// a nanosecond, no longer collides with a resend of its submission, which would be paid again.
/// Nothing hashed repeats the time, so the two columns are held to each other; both moved
/// together pass, and the resend's second claim of the key is then what `verify` names.
pub fn instant(claim: i64, timestamp: &str, instant: Option<&str>) -> Result<()> {
    // A leap second is refused now; a claim an earlier release made of one holds the instant
    // it stored then (the last nanosecond before the leap second), and still verifies.
    let expected = clock::instant_utc(timestamp)
        .ok()
        .or_else(|| clock::leap_second_stand_in(timestamp));
    if expected.is_some() && instant == expected.as_deref() {
        return Ok(());
    }
    Err(Error::Invariant(format!(
        "claim's instant differs from its timestamp: claim {claim} has submission_timestamp \
         {timestamp:?} but submission_instant {}",
        instant.map_or("NULL".to_owned(), |i| format!("{i:?}"))
    )))
}

/// The legal holds the chain says are in force, replayed from its `hold_added` and
/// `hold_removed` records, to hold the holds table to them: a hold is what stops a retention
/// purge, so one lifted or placed by editing the table, with no record, must not pass `verify`.
///
/// A purge never removes a record naming a held award, so every hold in force has its
/// `hold_added` record in the chain, however much of the chain was purged.
#[derive(Default)]
pub struct Holds {
    /// Award → (reason, when placed) while the last record for it placed a hold; `None` once
    /// a later record lifted it.
    by_award: std::collections::BTreeMap<String, Option<(String, String)>>,
}

impl Holds {
    /// Takes one record of the chain, in chain order; records of other kinds are ignored.
    pub fn see(&mut self, r: &Record) {
        use crate::domain::audit::{detail, Kind};
        let Some(award) = &r.award_id else { return };
        match r.kind {
            Kind::HoldAdded => {
                let placed = detail::hold_added("");
                let reason = r.detail.as_deref().unwrap_or("");
                let reason = reason.strip_prefix(placed.as_str()).unwrap_or(reason);
                self.by_award.insert(
                    award.clone(),
                    Some((reason.to_owned(), r.recorded_at.clone())),
                );
            }
            Kind::HoldRemoved => {
                self.by_award.insert(award.clone(), None);
            }
            _ => {}
        }
    }

    /// Compares the holds table's rows with the chain's; the first difference is
    /// [`Error::Invariant`].
    pub fn compare(&self, table: &[Hold]) -> Result<()> {
        let in_force: Vec<(&String, &(String, String))> = self
            .by_award
            .iter()
            .filter_map(|(award, hold)| hold.as_ref().map(|h| (award, h)))
            .collect();
        for (award, (reason, held_at)) in &in_force {
            match table.iter().find(|h| &h.award_id == *award) {
                None => {
                    return Err(Error::Invariant(format!(
                        "legal holds differ from the audit trail: award {award} was placed on hold \
                         at {held_at} and no record lifts it, but the holds table has no hold for it"
                    )))
                }
                Some(h) if &h.reason != reason || &h.held_at != held_at => {
                    return Err(Error::Invariant(format!(
                        "legal holds differ from the audit trail: award {award}'s hold reads \
                         ({:?}, placed {}) but its record says ({reason:?}, placed {held_at})",
                        h.reason, h.held_at
                    )))
                }
                Some(_) => {}
            }
        }
        if let Some(h) = table
            .iter()
            .find(|h| !in_force.iter().any(|(award, _)| **award == h.award_id))
        {
            return Err(Error::Invariant(format!(
                "legal holds differ from the audit trail: award {} is held (placed {}) but no \
                 record in force placed that hold",
                h.award_id, h.held_at
            )));
        }
        Ok(())
    }
}

/// A held conflict's `dead_letters` row, as `verify` reads it for [`decisions`].
#[derive(Debug, Clone)]
pub struct HeldRow {
    /// The row's reason code.
    pub reason_code: String,
    /// Its stream entry id.
    pub entry_id: String,
    /// `decision`, `decided_by`, `decided_reason`, `decided_at`.
    pub decision: [Option<String>; 4],
}

impl HeldRow {
    /// From a row of `reason_code, stream_entry_id, decision, decided_by, decided_reason,
    /// decided_at`.
    pub fn read(row: &impl Columns) -> Result<HeldRow> {
        Ok(HeldRow {
            reason_code: row.text(0)?,
            entry_id: row.text(1)?,
            decision: [
                row.opt_text(2)?,
                row.opt_text(3)?,
                row.opt_text(4)?,
                row.opt_text(5)?,
            ],
        })
    }
}

/// A `conflict_approved` / `conflict_rejected` record, as `verify` reads it for [`decisions`]
/// (on PostgreSQL from every batch, linked or not, so a decision committed a moment before its
/// link is still seen).
#[derive(Debug, Clone)]
pub struct DecisionRecord {
    /// Its kind.
    pub kind: crate::domain::audit::Kind,
    /// The held entry it decides.
    pub entry_id: Option<String>,
    /// Who and why.
    pub detail: Option<String>,
    /// When.
    pub recorded_at: String,
}

impl DecisionRecord {
    /// From a row of `kind, stream_entry_id, detail, recorded_at`; a kind no record can have
    /// is [`Error::Invariant`].
    pub fn read(row: &impl Columns) -> Result<DecisionRecord> {
        let kind = row.text(0)?;
        Ok(DecisionRecord {
            kind: crate::domain::audit::Kind::parse(&kind).ok_or_else(|| {
                Error::Invariant(format!("an audit record of unknown kind {kind:?}"))
            })?,
            entry_id: row.opt_text(1)?,
            detail: row.opt_text(2)?,
            recorded_at: row.text(3)?,
        })
    }
}

/// Reviewers' decisions on held conflicts (`ledger::review`) agree with their records: every
/// decided row is a held conflict with exactly one record of its verdict, worded from its who
/// and why, written when it says it was decided; and no row of an entry a record decides is
/// undecided. The decision columns decide whether a held entry may be paid, and nothing hashed
/// covers them: a decision cleared by an edit (which would let the entry be paid again) or
/// made up without a record fails here. A purge removes a held row with the records before it,
/// so a record whose row is gone is no violation.
pub fn decisions(rows: &[HeldRow], records: &[DecisionRecord]) -> Result<()> {
    use crate::ledger::review::{Verdict, CONFLICT_HOLD};
    let mut by_entry: std::collections::HashMap<&str, Vec<&DecisionRecord>> =
        std::collections::HashMap::new();
    for r in records {
        by_entry
            .entry(r.entry_id.as_deref().unwrap_or(""))
            .or_default()
            .push(r);
    }
    for row in rows {
        let found = by_entry.get(row.entry_id.as_str()).map_or(&[][..], |v| v);
        let [verdict, by, reason, at] = &row.decision;
        let Some(verdict) = verdict else {
            if let Some(r) = found.first() {
                return Err(Error::Invariant(format!(
                    "held conflict decisions differ from the audit trail: entry {} has a {} \
                     record (at {}) but its dead letter row is undecided",
                    row.entry_id,
                    r.kind.as_str(),
                    r.recorded_at
                )));
            }
            continue;
        };
        let bad = |why: String| {
            Err(Error::Invariant(format!(
                "held conflict decisions differ from the audit trail: entry {}'s dead letter \
                 row says {verdict:?} by {:?} at {:?}, but {why}",
                row.entry_id,
                by.as_deref().unwrap_or(""),
                at.as_deref().unwrap_or("")
            )))
        };
        if row.reason_code != CONFLICT_HOLD {
            return bad(format!(
                "it is a {} dead letter, not a held conflict",
                row.reason_code
            ));
        }
        let Some(v) = Verdict::parse(verdict) else {
            return bad("that is no decision".into());
        };
        let r = match found {
            [] => return bad("no record decides it".into()),
            [one] => one,
            more => return bad(format!("{} records decide it", more.len())),
        };
        let detail = v.detail(by.as_deref().unwrap_or(""), reason.as_deref().unwrap_or(""));
        if r.kind != v.kind()
            || r.detail.as_deref() != Some(detail.as_str())
            || Some(&r.recorded_at) != at.as_ref()
        {
            return bad(format!(
                "its record reads {} {:?} at {}",
                r.kind.as_str(),
                r.detail.as_deref().unwrap_or(""),
                r.recorded_at
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_an_earlier_release_made_of_a_leap_second_still_verifies() {
        let leap = "2016-12-31T23:59:60.5Z";
        instant(1, leap, Some("2016-12-31T23:59:59.999999999Z")).unwrap();
        assert!(instant(1, leap, Some("2016-12-31T23:59:59.500000000Z")).is_err());
        assert!(instant(1, leap, None).is_err());
        instant(
            2,
            "2016-12-31T23:59:59Z",
            Some("2016-12-31T23:59:59.000000000Z"),
        )
        .unwrap();
    }
}
