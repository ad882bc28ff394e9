//! A retention purge's export, the one procedure every backend's
//! [`Retention::export_purge`](super::Retention::export_purge) runs: find the prefix, hand its
//! plan to the caller to admit or refuse, then pass its rows on batch by batch. Each backend
//! answers [`Snapshot`]'s questions from read snapshots of its own tables (one per batch, or
//! one for all), so SQLite and PostgreSQL cut a prefix into the same batches and export them in
//! the same order.
//!
//! A purge batch's refusals are written here too, so both backends refuse in the same words.
//!
//! Invariant: this module only reads, through the snapshot it is handed.

use super::PurgePlan;
use crate::domain::audit::Record;
use crate::error::{Error, Result};

/// What a purge's export asks of one read snapshot of a ledger.
pub trait Snapshot {
    /// The first and last `seq` of the audit prefix recorded before `cutoff` (it ends before
    /// the first non-checkpoint record at or after `cutoff`, and at the edge of a batch), or
    /// `None` when nothing is that old.
    fn prefix(&mut self, cutoff: &str) -> Result<Option<(i64, i64)>>;
    /// Awards under legal hold that records `first..=last` name.
    fn held_in(&mut self, first: i64, last: i64) -> Result<Vec<String>>;
    /// Outbox rows not yet published of the claims records `first..=last` describe.
    ///
    /// May be read in steps, each a snapshot of its own, as the batches are: those rows only
    /// ever change by being published, which can only lower the count. A relay that starts on a
    /// new events stream meanwhile (its mark below them) is the race it would be right after a
    /// one-snapshot count, and a step read after it counts the rows that stream lacks.
    fn unpublished_in(&mut self, first: i64, last: i64) -> Result<u64>;
    /// The last `seq` of the batch starting at `first`: at most `count` records, not past
    /// `last`.
    fn batch_end(&mut self, first: i64, last: i64, count: usize) -> Result<i64>;
    /// The audit records `first..=last`, in chain order.
    fn records(&mut self, first: i64, last: i64) -> Result<Vec<Record>>;
    /// Every other row a purge of `first..=last` removes (claims, disbursements, outbox rows,
    /// dead letters), as `{"table": .., "row": ..}`.
    fn export_rows(&mut self, first: i64, last: i64) -> Result<Vec<serde_json::Value>>;
    /// Between two batches of the export: the snapshot may move on to a newer one ([`export`]
    /// says why that is safe). SQLite's does, so the WAL can be checkpointed while a long
    /// export runs; one that stays put loses nothing.
    fn between_batches(&mut self) -> Result<()> {
        Ok(())
    }
}

/// [`Retention::export_purge`](super::Retention::export_purge) inside `snapshot`: the plan,
/// which `admit` may refuse (then nothing is exported), then every row of the prefix to `row`,
/// in batches of at most `batch_records_max` records. Returns the plan and each batch's last
/// `seq`, or `None` when nothing is older than `cutoff`.
///
/// The plan and each batch are read in one snapshot each (the plan's unpublished rows perhaps
/// in several: [`Snapshot::unpublished_in`]), not necessarily the same one
/// ([`Snapshot::between_batches`]): what the export holds is immutable once the plan admits it
/// — audit records of a prefix, claims made before the cutoff with their disbursements, and
/// outbox rows the plan found published everywhere — and what can change meanwhile, a hold
/// placed on an award, each purge batch checks again in its own transaction. One SQLite
/// snapshot for a whole export kept every page the workers wrote in the WAL for as long as it
/// ran: exporting a year of a 10,000,000-claim ledger took minutes, the WAL grew by gigabytes
/// and every commit beside it slowed (BENCHMARKS.md, purge beside a worker).
pub fn export(
    snapshot: &mut impl Snapshot,
    cutoff: &str,
    batch_records_max: usize,
    admit: &mut dyn FnMut(&PurgePlan) -> Result<()>,
    row: &mut dyn FnMut(&serde_json::Value) -> Result<()>,
) -> Result<Option<(PurgePlan, Vec<i64>)>> {
    let Some((first, last)) = snapshot.prefix(cutoff)? else {
        return Ok(None);
    };
    let plan = PurgePlan {
        first,
        last,
        held: snapshot.held_in(first, last)?,
        unpublished: snapshot.unpublished_in(first, last)?,
    };
    admit(&plan)?;
    let mut ends = Vec::new();
    let mut lo = first;
    loop {
        let hi = snapshot.batch_end(lo, last, batch_records_max)?;
        // Each batch ends after it starts and inside the plan, so the loop ends at `last`.
        assert!(
            lo <= hi && hi <= last,
            "purge batch {lo}..={hi} is not inside the plan's {first}..={last}"
        );
        // Audit records first, as `audit_log` rows, so the export verifies with `audit verify
        // --file`; both read before any is passed on.
        let records = snapshot.records(lo, hi)?;
        let rows = snapshot.export_rows(lo, hi)?;
        for r in records {
            row(&serde_json::json!({ "table": "audit_log", "row": r }))?;
        }
        for value in &rows {
            row(value)?;
        }
        ends.push(hi);
        if hi >= last {
            break;
        }
        snapshot.between_batches()?;
        lo = hi + 1;
    }
    Ok(Some((plan, ends)))
}

/// A purge batch goes ahead only if no award its records name has come under hold since the
/// plan; `held` is those awards ([`Snapshot::held_in`] read in the batch's own transaction).
/// Refused is [`Error::Other`], naming them.
pub fn refuse_held(held: &[String]) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    Err(Error::Other(format!(
        "award {} came under legal hold during the purge; stopped",
        held.join(", ")
    )))
}

/// Each of the `records` `processed` records of batch `first..=last` must take its claim with
/// it: `found` of their claims were found among those made before the cutoff. A record whose
/// claim is not found would leave the claim behind without its evidence, so the batch is
/// refused ([`Error::Invariant`]) instead.
pub fn all_claims_found(records: i64, found: i64, first: i64, last: i64) -> Result<()> {
    if found == records {
        return Ok(());
    }
    Err(Error::Invariant(format!(
        "{records} processed records in seq {first}..={last} but only {found} of their claims \
         were found among the claims made before the cutoff; nothing was purged"
    )))
}
