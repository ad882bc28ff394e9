//! The report's figures, counted from the audit chain one record at a time.
//!
//! Pure: it is handed records in chain order and keeps only bounded summaries — counts, a total
//! per day, dead letters per reason, and the first [`EXCEPTIONS_MAX`] exceptions and
//! [`PURGES_MAX`] checkpoints — so a ledger of any size is counted in constant memory. Every
//! count is kept twice: over the whole chain, and over the records written inside the report's
//! period.

use crate::domain::anchor::{check_checkpoint, checkpoint_signature};
use crate::domain::audit::{Kind, Record};
use crate::domain::signing::PublicKey;
use std::collections::BTreeMap;

/// Exceptions (conflicts, dead letters, holds, vanished entries) listed one by one; the rest
/// are counted.
pub const EXCEPTIONS_MAX: usize = 1_000;
/// Checkpoints listed one by one (a purge leaves one; a chain holds few).
pub const PURGES_MAX: usize = 100;
/// Distinct dead-letter reason codes listed; further codes are counted under one row.
pub const REASONS_MAX: usize = 64;
/// Distinct days kept for the chart (about 137 years); records on further days are counted
/// under one bucket.
pub const DAYS_MAX: usize = 50_000;
/// Characters of a record's detail shown in the exceptions table.
pub const DETAIL_CHARS_MAX: usize = 300;
/// The reason row and day bucket that collect what is past the limits above.
pub const OTHER: &str = "other";

/// The records a report counts: written at or after `since` and before `until` (ledger time,
/// which compares as text). `None` leaves that side open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Period {
    /// The first instant inside the period.
    pub since: Option<String>,
    /// The first instant after it.
    pub until: Option<String>,
}

impl Period {
    /// Whether a record written at `recorded_at` is inside the period.
    pub fn contains(&self, recorded_at: &str) -> bool {
        self.since.as_deref().is_none_or(|s| recorded_at >= s)
            && self.until.as_deref().is_none_or(|u| recorded_at < u)
    }

    /// Whether the period is the whole chain.
    pub fn is_all(&self) -> bool {
        self.since.is_none() && self.until.is_none()
    }
}

/// How many records of each kind, and what was paid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every record but batch links (links are seals, not events: `Verifier::count`).
    pub records: u64,
    /// `processed` records: submissions claimed and paid.
    pub processed: u64,
    /// The sum of the `processed` records' amounts.
    pub disbursed_cents: i128,
    /// `duplicate` records: deliveries suppressed.
    pub duplicates: u64,
    /// `conflict` records.
    pub conflicts: u64,
    /// `dead_letter` records.
    pub dead_letters: u64,
    /// `vanished` records.
    pub vanished: u64,
    /// `hold_added` records.
    pub holds_placed: u64,
    /// `hold_removed` records.
    pub holds_lifted: u64,
    /// `checkpoint` records: purges.
    pub checkpoints: u64,
    /// `restored` records.
    pub restored: u64,
    /// `conflict_approved` records: held conflicts a reviewer approved (and so paid).
    pub conflicts_approved: u64,
    /// `conflict_rejected` records: held conflicts a reviewer rejected.
    pub conflicts_rejected: u64,
}

impl Counts {
    fn add(&mut self, r: &Record) {
        if r.kind != Kind::Batch {
            self.records += 1;
        }
        match r.kind {
            Kind::Processed => {
                self.processed += 1;
                self.disbursed_cents += i128::from(r.amount_cents.unwrap_or(0));
            }
            Kind::Duplicate => self.duplicates += 1,
            Kind::Conflict => self.conflicts += 1,
            Kind::DeadLetter => self.dead_letters += 1,
            Kind::Vanished => self.vanished += 1,
            Kind::HoldAdded => self.holds_placed += 1,
            Kind::HoldRemoved => self.holds_lifted += 1,
            Kind::Checkpoint => self.checkpoints += 1,
            Kind::Restored => self.restored += 1,
            Kind::ConflictApproved => self.conflicts_approved += 1,
            Kind::ConflictRejected => self.conflicts_rejected += 1,
            Kind::Batch => {}
        }
    }
}

/// Payments on one day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Day {
    /// `processed` records written that day.
    pub payments: u64,
    /// Their amounts.
    pub cents: i128,
}

/// One record an auditor would sample: a conflict, a dead letter, a hold placed or lifted, an
/// entry found vanished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exception {
    /// Its place in the chain.
    pub seq: i64,
    /// What it records.
    pub kind: Kind,
    /// When.
    pub recorded_at: String,
    /// The award, as the producer wrote it.
    pub award_id: Option<String>,
    /// The stream entry.
    pub stream_entry_id: Option<String>,
    /// The idempotency key, where there is one.
    pub idempotency_key: Option<String>,
    /// The detail, cut to [`DETAIL_CHARS_MAX`] characters.
    pub detail: String,
}

/// What a checkpoint's signature came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// Verified with the public key given.
    Verified(String),
    /// Checked with the public key given and refused, for this reason.
    Refused(String),
    /// Signed by this key id; no public key was given, so not checked.
    NotChecked(String),
    /// Not signed.
    Unsigned,
}

/// One purge, as the checkpoint it left says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purge {
    /// The checkpoint's seq: the last record the purge removed.
    pub seq: i64,
    /// When the purge ran.
    pub recorded_at: String,
    /// What it removed and where it was exported (the detail without its signature).
    pub text: String,
    /// Its signature.
    pub signature: Signature,
}

/// Everything counted so far.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// The period counted in `period`.
    pub window: Period,
    /// Over the whole chain.
    pub all: Counts,
    /// Over the records written inside the period.
    pub period: Counts,
    /// Payments per day (`YYYY-MM-DD`, UTC) inside the period.
    pub days: BTreeMap<String, Day>,
    /// Dead letters inside the period by reason code (the detail up to its first `: `).
    pub reasons: BTreeMap<String, u64>,
    /// The first exceptions inside the period, in chain order.
    pub exceptions: Vec<Exception>,
    /// Every exception inside the period, listed or not.
    pub exceptions_total: u64,
    /// The first checkpoints of the chain, in chain order (whatever the period: they are
    /// evidence about the chain, not events in it).
    pub purges: Vec<Purge>,
    /// The first record's seq and time.
    pub first: Option<(i64, String)>,
    /// The last record's seq and time.
    pub last: Option<(i64, String)>,
    /// The seq of the checkpoint the chain starts with, if a purge left one: anchors below it
    /// are covered by it, not matched.
    pub leading_checkpoint: Option<i64>,
}

impl Tally {
    /// A tally of the records written inside `window`.
    pub fn new(window: Period) -> Tally {
        Tally {
            window,
            ..Tally::default()
        }
    }

    /// Counts the next record of the chain; checkpoints' signatures are checked with `key`.
    pub fn push(&mut self, r: &Record, key: Option<&PublicKey>) {
        if self.first.is_none() {
            self.first = Some((r.seq, r.recorded_at.clone()));
            if r.kind == Kind::Checkpoint {
                self.leading_checkpoint = Some(r.seq);
            }
        }
        // Reusing the last one's buffer: this runs once per record of the chain.
        match &mut self.last {
            Some((seq, at)) => {
                *seq = r.seq;
                at.clone_from(&r.recorded_at);
            }
            None => self.last = Some((r.seq, r.recorded_at.clone())),
        }
        self.all.add(r);
        if r.kind == Kind::Checkpoint && self.purges.len() < PURGES_MAX {
            self.purges.push(purge(r, key));
        }
        if !self.window.contains(&r.recorded_at) {
            return;
        }
        self.period.add(r);
        match r.kind {
            Kind::Processed => self.paid(r),
            Kind::DeadLetter => {
                self.reason(r.detail.as_deref().unwrap_or(""));
                self.exception(r);
            }
            Kind::Conflict
            | Kind::ConflictApproved
            | Kind::ConflictRejected
            | Kind::HoldAdded
            | Kind::HoldRemoved
            | Kind::Vanished => self.exception(r),
            _ => {}
        }
    }

    fn paid(&mut self, r: &Record) {
        let day = day_of(&r.recorded_at);
        let key = if self.days.contains_key(day) || self.days.len() < DAYS_MAX {
            day
        } else {
            OTHER
        };
        let d = self.days.entry(key.to_owned()).or_default();
        d.payments += 1;
        d.cents += i128::from(r.amount_cents.unwrap_or(0));
    }

    fn reason(&mut self, detail: &str) {
        let code = detail.split_once(": ").map_or(detail, |(code, _)| code);
        let code = if self.reasons.contains_key(code) || self.reasons.len() < REASONS_MAX {
            code
        } else {
            OTHER
        };
        *self.reasons.entry(code.to_owned()).or_default() += 1;
    }

    fn exception(&mut self, r: &Record) {
        self.exceptions_total += 1;
        if self.exceptions.len() >= EXCEPTIONS_MAX {
            return;
        }
        self.exceptions.push(Exception {
            seq: r.seq,
            kind: r.kind,
            recorded_at: r.recorded_at.clone(),
            award_id: r.award_id.clone(),
            stream_entry_id: r.stream_entry_id.clone(),
            idempotency_key: r.idempotency_key.clone(),
            detail: r
                .detail
                .as_deref()
                .unwrap_or("")
                .chars()
                .take(DETAIL_CHARS_MAX)
                .collect(),
        });
    }
}

/// The UTC day a ledger time falls on (`YYYY-MM-DD`), or [`OTHER`] for a time not spelled as
/// the ledger spells times (only a hand-edited record has one).
pub fn day_of(recorded_at: &str) -> &str {
    let day = recorded_at.get(..10).unwrap_or("");
    let shaped = day.bytes().enumerate().all(|(i, b)| match i {
        4 | 7 => b == b'-',
        _ => b.is_ascii_digit(),
    });
    if day.len() == 10 && shaped {
        day
    } else {
        OTHER
    }
}

fn purge(r: &Record, key: Option<&PublicKey>) -> Purge {
    let (text, signed) = checkpoint_signature(r.detail.as_deref().unwrap_or(""));
    let signature = match (key, signed) {
        (Some(k), _) => match check_checkpoint(r, k) {
            Ok(()) => Signature::Verified(k.key_id()),
            Err(reason) => Signature::Refused(reason),
        },
        (None, Some((signer, _))) => Signature::NotChecked(signer.to_owned()),
        (None, None) => Signature::Unsigned,
    };
    Purge {
        seq: r.seq,
        recorded_at: r.recorded_at.clone(),
        text: text.to_owned(),
        signature,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::anchor::sign_checkpoint_detail;
    use crate::domain::signing::SigningKey;

    fn record(seq: i64, kind: Kind, at: &str) -> Record {
        Record {
            seq,
            amount_cents: (kind == Kind::Processed).then_some(150),
            award_id: Some(format!("A-{seq}")),
            detail: (kind == Kind::DeadLetter).then(|| "not_json: payload is not JSON".into()),
            ..Record::unsealed(kind, at)
        }
    }

    #[test]
    fn counts_are_kept_for_the_whole_chain_and_for_the_period_and_links_are_not_records() {
        let mut t = Tally::new(Period {
            since: Some("2026-07-02T00:00:00.000000Z".into()),
            until: Some("2026-07-03T00:00:00.000000Z".into()),
        });
        let at = ["2026-07-01T10:00:00.000000Z", "2026-07-02T10:00:00.000000Z"];
        for (i, day) in at.iter().enumerate() {
            let seq = 10 * i as i64;
            for (n, kind) in [Kind::Processed, Kind::Processed, Kind::DeadLetter]
                .into_iter()
                .enumerate()
            {
                t.push(&record(seq + n as i64, kind, day), None);
            }
            t.push(&record(seq + 2, Kind::Batch, day), None);
        }
        assert_eq!(
            (t.all.records, t.all.processed, t.all.dead_letters),
            (6, 4, 2)
        );
        assert_eq!(t.all.disbursed_cents, 600);
        assert_eq!((t.period.records, t.period.processed), (3, 2));
        assert_eq!(t.days.len(), 1);
        assert_eq!(
            t.days["2026-07-02"],
            Day {
                payments: 2,
                cents: 300
            }
        );
        assert_eq!(t.reasons["not_json"], 1);
        assert_eq!((t.exceptions.len(), t.exceptions[0].seq), (1, 12));
        assert_eq!(t.first, Some((0, at[0].to_owned())));
        assert_eq!(t.last.as_ref().map(|l| l.0), Some(12));
    }

    #[test]
    fn reviewers_decisions_are_counted_and_listed_among_the_exceptions() {
        let mut t = Tally::new(Period::default());
        let at = "2026-07-02T10:00:00.000000Z";
        for (seq, kind) in [
            (1, Kind::Conflict),
            (2, Kind::DeadLetter),
            (3, Kind::Processed),
            (4, Kind::ConflictApproved),
            (5, Kind::ConflictRejected),
        ] {
            t.push(&record(seq, kind, at), None);
        }
        assert_eq!(
            (
                t.all.conflicts_approved,
                t.all.conflicts_rejected,
                t.all.records
            ),
            (1, 1, 5)
        );
        let listed: Vec<(i64, Kind)> = t.exceptions.iter().map(|e| (e.seq, e.kind)).collect();
        assert_eq!(
            listed,
            [
                (1, Kind::Conflict),
                (2, Kind::DeadLetter),
                (4, Kind::ConflictApproved),
                (5, Kind::ConflictRejected)
            ]
        );
    }

    #[test]
    fn lists_are_bounded_however_many_records_come() {
        let mut t = Tally::new(Period::default());
        for seq in 0..(EXCEPTIONS_MAX as i64 + 5) {
            let mut r = record(seq, Kind::DeadLetter, "2026-07-01T00:00:00.000000Z");
            r.detail = Some(format!("code{seq}: {}", "x".repeat(1_000)));
            t.push(&r, None);
        }
        assert_eq!(t.exceptions.len(), EXCEPTIONS_MAX);
        assert_eq!(t.exceptions_total, EXCEPTIONS_MAX as u64 + 5);
        assert_eq!(t.exceptions[0].detail.chars().count(), DETAIL_CHARS_MAX);
        assert_eq!(t.reasons.len(), REASONS_MAX + 1);
        assert_eq!(t.reasons[OTHER], (EXCEPTIONS_MAX + 5 - REASONS_MAX) as u64);
    }

    #[test]
    fn a_time_not_spelled_as_the_ledger_spells_it_has_no_day() {
        assert_eq!(day_of("2026-07-01T00:00:00.000000Z"), "2026-07-01");
        for odd in ["", "2026-7-01T", "<script>alert(1)", "2026/07/01T00"] {
            assert_eq!(day_of(odd), OTHER, "{odd:?}");
        }
    }

    #[test]
    fn a_checkpoints_signature_is_checked_with_the_key_or_named_without_it() {
        let key = SigningKey::from_seed([3; 32]);
        let mut r = record(4, Kind::Checkpoint, "2026-07-01T00:00:00.000000Z");
        r.prev_hash = "ab".repeat(32);
        r.detail = Some(sign_checkpoint_detail(
            "purged 1..=4",
            4,
            &r.prev_hash,
            &key,
        ));
        let id = key.public_key().key_id();
        let signed = purge(&r, Some(&key.public_key()));
        assert_eq!(
            (signed.text.as_str(), signed.signature),
            ("purged 1..=4", Signature::Verified(id.clone()))
        );
        assert_eq!(purge(&r, None).signature, Signature::NotChecked(id));
        let other = SigningKey::from_seed([4; 32]).public_key();
        assert!(matches!(
            purge(&r, Some(&other)).signature,
            Signature::Refused(_)
        ));
        r.detail = Some("purged 1..=4".into());
        assert_eq!(purge(&r, None).signature, Signature::Unsigned);
    }
}
