//! The writer's ledger side: parsed entries as ledger items, one transaction per batch, and
//! the item-by-item fallback when the ledger refuses a batch.
//!
//! **Invariant:** every call returns exactly one outcome slot per item, in item order
//! (asserted on what the ledger returns), and marks an item committed only if a transaction
//! covering it returned success and did not defer it.

use super::parse::{Parsed, Verdict};
use super::shared::Shared;
use crate::error::Result;
use crate::ledger::{Item, Ledger, Outcome};
use log::{error, warn};

/// The ledger item for one parsed entry.
pub(super) fn item_of(p: &Parsed) -> Item<'_> {
    match &p.verdict {
        Verdict::Valid(s) => match &p.committed_by {
            Some(at) => Item::KnownDuplicate {
                submission: s,
                entry_id: &p.id,
                delivery_count: p.delivery_count,
                committed_by: at,
            },
            None => Item::Submission {
                submission: s,
                entry_id: &p.id,
                delivery_count: p.delivery_count,
            },
        },
        Verdict::Rejected(r) => Item::DeadLetter {
            entry_id: &p.id,
            reason_code: r.code,
            reason: &r.reason,
            award_id: r.award_id.as_deref(),
            key: r.key,
            delivery_count: p.delivery_count,
        },
    }
}

/// Records the batch in one transaction, calling `locked` as the ledger does once the batch
/// holds its groups (contract point 9). If the ledger refuses the batch for a reason an
/// entry's data caused (`Error::blames_entry`), each item is tried alone so one bad item
/// cannot hold back the rest; an item the ledger refuses by itself is left pending (the
/// delivery cap dead-letters it eventually). Any other failure — transient, or of the ledger
/// itself past `--ledger-outage-ms-max` — is returned: it concerns no entry, so none is tried
/// alone, counted or dead-lettered for it. Returns each item's outcome and whether it
/// committed.
pub(super) fn record(
    ledger: &dyn Ledger,
    items: &[Item<'_>],
    shared: &Shared<'_>,
    locked: &mut dyn FnMut(bool),
) -> Result<(Vec<Option<Outcome>>, Vec<bool>)> {
    let (consumer, stream) = (shared.wcfg.consumer.as_str(), shared.cfg.stream.as_str());
    match shared.retry_ledger("committing to the ledger", || {
        ledger.record_in_turn(items, consumer, stream, &mut *locked)
    }) {
        Ok(outcomes) => {
            // Ledger contract, point 2. Everything after the commit (held copies, fast-filter
            // markers, audit lines, counters) pairs outcomes with entries by position: a list
            // of another length would pair an entry with some other entry's outcome.
            assert_eq!(
                outcomes.len(),
                items.len(),
                "the ledger returned {} outcomes for {} items",
                outcomes.len(),
                items.len()
            );
            // A deferred item (contract point 8) was not written: not committed, not to be
            // acknowledged; the writer offers it again.
            let committed = outcomes.iter().map(|o| *o != Outcome::Deferred).collect();
            Ok((outcomes.into_iter().map(Some).collect(), committed))
        }
        Err(e) if !e.blames_entry() => Err(e),
        Err(e) if items.len() == 1 => {
            error!(
                "ledger refused entry {}: {e}; leaving it pending",
                entry_id_of(&items[0])
            );
            Ok((vec![None], vec![false]))
        }
        Err(e) => {
            warn!(
                "ledger refused a batch of {} ({e}); retrying its entries one by one",
                items.len()
            );
            one_by_one(ledger, items, shared)
        }
    }
}

/// The fallback: each item in a transaction of its own, all of them in the batch's turn (the
/// writer lets the turn go once they are done).
fn one_by_one(
    ledger: &dyn Ledger,
    items: &[Item<'_>],
    shared: &Shared<'_>,
) -> Result<(Vec<Option<Outcome>>, Vec<bool>)> {
    let mut outcomes = Vec::with_capacity(items.len());
    let mut committed = Vec::with_capacity(items.len());
    for item in items {
        let (o, c) = record(ledger, std::slice::from_ref(item), shared, &mut |_| {})?;
        outcomes.extend(o);
        committed.extend(c);
    }
    Ok((outcomes, committed))
}

/// The stream entry an item came from.
fn entry_id_of<'a>(item: &Item<'a>) -> &'a str {
    match item {
        Item::Submission { entry_id, .. }
        | Item::KnownDuplicate { entry_id, .. }
        | Item::DeadLetter { entry_id, .. }
        | Item::Vanished { entry_id, .. } => entry_id,
    }
}
