//! The parse pool: `--threads` threads that validate and hash entries, enforce the delivery
//! cap, and (with `--fast-filter`) look up which keys are already committed.
//!
//! **Invariant:** nothing here writes to Redis or the ledger. Every entry that comes in goes out,
//! in order, either valid or [`Rejected`] with a reason: none is dropped, none is processed.

use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::{Conn, Entry};
use crate::config::WorkerConfig;
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::{self, Submission};
use crossbeam_channel::{Receiver, Sender};

/// An entry after the parse stage.
pub(super) struct Parsed {
    /// The stream entry id.
    pub(super) id: String,
    /// Deliveries so far.
    pub(super) delivery_count: u64,
    /// Valid, or why not.
    pub(super) verdict: Verdict,
    /// Set by the fast filter: when this valid submission's key was seen committed.
    pub(super) committed_by: Option<String>,
}

/// What the parse stage decided about an entry.
pub(super) enum Verdict {
    /// A valid submission, to be claimed in the ledger.
    Valid(Submission),
    /// A permanently bad entry, to be dead-lettered.
    Rejected(Rejected),
}

/// A permanently bad entry on its way to the dead-letter stream.
pub(super) struct Rejected {
    /// The whole original entry, copied into the dead letter.
    pub(super) entry: Entry,
    /// Short class, e.g. `not_json` or `max_deliveries`.
    pub(super) code: &'static str,
    /// The reason in words.
    pub(super) reason: String,
    /// The award, where readable.
    pub(super) award_id: Option<String>,
    /// The key, where derivable.
    pub(super) key: Option<IdempotencyKey>,
}

impl Parsed {
    /// The idempotency key of a valid submission; `None` for a rejected entry.
    pub(super) fn valid_key(&self) -> Option<IdempotencyKey> {
        match &self.verdict {
            Verdict::Valid(s) => Some(s.key),
            Verdict::Rejected(_) => None,
        }
    }
}

/// Parses batches from the reader until it hangs up or the writer is gone.
pub(super) fn run(
    rx: Receiver<Vec<Entry>>,
    tx: Sender<Vec<Parsed>>,
    wcfg: &WorkerConfig,
    mut filter: Option<(&FastFilter, Conn)>,
) {
    for batch in rx {
        let mut parsed: Vec<Parsed> = batch.into_iter().map(|e| parse_one(e, wcfg)).collect();
        if let Some((filter, conn)) = filter.as_mut() {
            look_up_committed(filter, conn, &mut parsed);
        }
        if tx.send(parsed).is_err() {
            return;
        }
    }
}

/// Asks the fast filter which valid submissions are already committed; here, on a parse
/// thread, so the writer never waits on the lookup.
fn look_up_committed(filter: &FastFilter, conn: &mut Conn, parsed: &mut [Parsed]) {
    let keys: Vec<IdempotencyKey> = parsed.iter().filter_map(Parsed::valid_key).collect();
    let mut found = filter.lookup(conn, &keys).into_iter();
    for p in parsed.iter_mut().filter(|p| p.valid_key().is_some()) {
        p.committed_by = found.next().flatten();
    }
}

/// Validates one entry, or says why it must be dead-lettered. Pure apart from its inputs.
fn parse_one(entry: Entry, wcfg: &WorkerConfig) -> Parsed {
    let (id, delivery_count) = (entry.id.clone(), entry.delivery_count);
    let hint = |entry: &Entry| {
        submission::payload_of(&entry.fields)
            .ok()
            .and_then(|p| submission::award_id_hint(p, wcfg.payload_bytes_max))
    };
    let verdict = if delivery_count > wcfg.max_deliveries {
        Verdict::Rejected(Rejected {
            code: "max_deliveries",
            reason: format!(
                "max deliveries exceeded ({delivery_count} > {})",
                wcfg.max_deliveries
            ),
            award_id: hint(&entry),
            key: submission::parse_entry(&entry.fields, wcfg.payload_bytes_max)
                .ok()
                .map(|s| s.key),
            entry,
        })
    } else {
        match submission::parse_entry(&entry.fields, wcfg.payload_bytes_max) {
            Ok(s) => Verdict::Valid(s),
            Err(m) => Verdict::Rejected(Rejected {
                code: m.code(),
                reason: m.to_string(),
                award_id: hint(&entry),
                key: None,
                entry,
            }),
        }
    };
    Parsed {
        id,
        delivery_count,
        verdict,
        committed_by: None,
    }
}
