//! The demo's "ledger verified": what `claimgate verify` checks, taken from the ledger's own
//! [`Inspect::verify`] (the store's integrity, one claim and one outbox row per disbursement,
//! each agreeing with it, the audit chain), plus what only the demo knows — the totals its feed
//! promised — from the ledger's counts ([`Ledger::stats`]) and its audit trail ([`AuditLog`]).
//! Read-only, and through the traits only, like every other caller of the ledger.

use super::data::Expected;
use crate::domain::audit::{Kind, Record};
use crate::error::Result;
use crate::ledger::{AuditLog, Backend, Since, Stats, Summary};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One check and how it came out.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked, in words.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

fn check(what: &str, ok: bool, detail: String) -> Check {
    Check {
        what: what.to_owned(),
        ok,
        detail,
    }
}

/// What the demo learns from the audit trail, in one pass over it.
#[derive(Debug, Default)]
pub struct Trail {
    /// `processed` records.
    pub processed: u64,
    /// Keys with more than one `processed` record, each of which is a disbursement.
    pub keys_paid_twice: u64,
    /// Distinct stream entries with a `processed`, `duplicate` or `dead_letter` record.
    pub entries_accounted: u64,
    /// `duplicate` records.
    pub duplicates: u64,
    /// Distinct stream entries with a `duplicate` record and no `processed` one: resends by the
    /// producer (the content had already been paid), as opposed to redeliveries after the crash.
    pub duplicates_resent: u64,
    /// Dead letters by reason code: how many, and the least reason (one example).
    pub dead_letter_reasons: BTreeMap<String, (u64, String)>,
}

impl Trail {
    /// Walks the whole audit trail once.
    pub fn read(log: &dyn AuditLog) -> Result<Trail> {
        let mut trail = Trail::default();
        let mut paid: HashMap<String, u32> = HashMap::new();
        let (mut accounted, mut processed_entries, mut duplicate_entries) =
            (HashSet::new(), HashSet::new(), HashSet::new());
        log.for_each_record(&Since::All, &mut |r: Record| {
            let entry = r.stream_entry_id.clone();
            match r.kind {
                Kind::Processed => {
                    trail.processed += 1;
                    *paid
                        .entry(r.idempotency_key.unwrap_or_default())
                        .or_default() += 1;
                    processed_entries.extend(entry.clone());
                }
                Kind::Duplicate => {
                    trail.duplicates += 1;
                    duplicate_entries.extend(entry.clone());
                }
                Kind::DeadLetter => trail.dead_letter(r.detail.as_deref().unwrap_or_default()),
                Kind::Conflict
                | Kind::Checkpoint
                | Kind::Vanished
                | Kind::HoldAdded
                | Kind::HoldRemoved
                | Kind::Restored
                | Kind::ConflictApproved
                | Kind::ConflictRejected
                | Kind::Batch => return Ok(()),
            }
            accounted.extend(entry);
            Ok(())
        })?;
        trail.keys_paid_twice = paid.values().filter(|n| **n > 1).count() as u64;
        trail.entries_accounted = accounted.len() as u64;
        trail.duplicates_resent = duplicate_entries.difference(&processed_entries).count() as u64;
        Ok(trail)
    }

    /// Counts a dead letter by the reason its record gives, `<reason code>: <reason>`.
    fn dead_letter(&mut self, detail: &str) {
        let (code, reason) = detail.split_once(": ").unwrap_or((detail, ""));
        let (n, least) = self
            .dead_letter_reasons
            .entry(code.to_owned())
            .or_insert_with(|| (0, reason.to_owned()));
        *n += 1;
        if reason < least.as_str() {
            *least = reason.to_owned();
        }
    }

    /// Dead letters by reason code: (code, count, one example reason), most frequent first.
    pub fn dead_letters_by_reason(&self) -> Vec<(String, u64, String)> {
        let mut rows: Vec<(String, u64, String)> = self
            .dead_letter_reasons
            .iter()
            .map(|(code, (n, reason))| (code.clone(), *n, reason.clone()))
            .collect();
        // Stable, and the map iterates by code: ties stay in code order.
        rows.sort_by_key(|row| std::cmp::Reverse(row.1));
        rows
    }
}

/// Everything the summary is judged on, read from the ledger once the workers have stopped.
pub struct Evidence {
    /// What `claimgate verify` says.
    pub verified: Result<Summary>,
    /// The ledger's counts.
    pub stats: Stats,
    /// What the audit trail says.
    pub trail: Trail,
}

impl Evidence {
    /// Reads the ledger.
    pub fn read(ledger: &dyn Backend) -> Result<Evidence> {
        Ok(Evidence {
            verified: ledger.verify(),
            stats: ledger.stats()?,
            trail: Trail::read(ledger)?,
        })
    }

    /// Every check. `received` is the submissions stream's length in Redis, `events_on_stream`
    /// the events stream's. What `claimgate verify` covers is listed check by check when it
    /// passed; when it failed, its last line names the violation instead.
    pub fn checks(&self, expected: &Expected, received: u64, events_on_stream: u64) -> Vec<Check> {
        let (l, t) = (&self.stats, &self.trail);
        let verified = self.verified.as_ref().ok();
        let mut checks = Vec::new();
        if let Some(s) = verified {
            checks.push(check("SQLite integrity_check", true, "ok".into()));
            checks.push(check(
                "one disbursement and one outbox row per claim",
                s.claims == s.disbursements && s.claims == s.outbox_rows,
                format!(
                    "{} claims, {} disbursements, {} outbox rows",
                    s.claims, s.disbursements, s.outbox_rows
                ),
            ));
        }
        checks.push(check(
            "no submission paid twice",
            t.keys_paid_twice == 0,
            format!("{} keys with more than one disbursement", t.keys_paid_twice),
        ));
        if verified.is_some() {
            checks.push(check(
                "every disbursement matches its claim",
                true,
                "0 mismatches".into(),
            ));
        }
        checks.extend(self.totals(expected, received));
        if let Some(s) = verified {
            checks.push(check(
                "audit chain intact, one processed record per disbursement",
                t.processed == s.disbursements,
                format!("{} records, {} processed", s.audit_records, t.processed),
            ));
        }
        let rows = verified.map_or(l.disbursements, |s| s.outbox_rows);
        checks.push(check(
            "one event published per disbursement",
            l.outbox_backlog == 0 && events_on_stream == rows,
            format!(
                "{events_on_stream} events for {rows} outbox rows, {} unpublished",
                l.outbox_backlog
            ),
        ));
        checks.push(self.claimgate_verify());
        checks
    }

    /// The totals the feed promised.
    fn totals(&self, expected: &Expected, received: u64) -> [Check; 4] {
        let (l, t) = (&self.stats, &self.trail);
        let malformed = expected.malformed_codes.len() as u64;
        [
            check(
                "every distinct submission paid",
                l.claims == expected.unique,
                format!(
                    "{} paid, {} distinct submissions sent",
                    l.claims, expected.unique
                ),
            ),
            check(
                "total equals the sum of distinct submissions",
                l.disbursed_cents_total == i128::from(expected.cents_total),
                format!(
                    "{} cents paid, {} cents sent",
                    l.disbursed_cents_total, expected.cents_total
                ),
            ),
            check(
                "every malformed entry dead-lettered",
                l.dead_letters == malformed,
                format!(
                    "{} dead letters, {malformed} malformed entries sent",
                    l.dead_letters
                ),
            ),
            check(
                "every stream entry accounted for in the audit trail",
                t.entries_accounted == received,
                format!("{} of {received} entries", t.entries_accounted),
            ),
        ]
    }

    /// What `claimgate verify` says of the ledger (its own invariants and the audit chain).
    fn claimgate_verify(&self) -> Check {
        match &self.verified {
            Ok(s) => check(
                "claimgate verify",
                true,
                format!(
                    "{} claims, {} audit records, chain head {}",
                    s.claims,
                    s.audit_records,
                    &s.head_hash[..12.min(s.head_hash.len())]
                ),
            ),
            Err(e) => check("claimgate verify", false, e.to_string()),
        }
    }
}
