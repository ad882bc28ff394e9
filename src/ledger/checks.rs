//! Checks every backend's `verify` makes the same way, beyond the chain walk ([`super::chain`]):
//! facts a ledger's tables must agree with, where the tables are what the worker and `retention`
//! act on and an edit to them touches nothing hashed. Each backend reads its own rows and hands
//! them here, so SQLite and PostgreSQL name a violation in the same words.
//!
//! Invariant: this module only reads what it is handed.

use crate::domain::audit::Record;
use crate::domain::clock;
use crate::error::{Error, Result};
use crate::ledger::Hold;

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
