//! The parse pool: `--threads` threads that validate and hash entries, enforce the delivery
//! cap, and (with `--fast-filter`) look up which keys are already committed.
//!
//! **Invariant:** nothing here writes to Redis or the ledger. Every entry that comes in goes out,
//! in order, either valid or [`Rejected`] with a reason: none is dropped, none is processed.

use super::read_size::Held;
use crate::broker::entry::{Cut, PayloadSize};
use crate::broker::fastfilter::FastFilter;
use crate::broker::read::Limits;
use crate::broker::stream::{Conn, Entry};
use crate::config::{WorkerConfig, QUARANTINE_TRIES_MAX};
use crate::domain::event;
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::{self, Submission};
use crossbeam_channel::{Receiver, Sender};
use std::time::Instant;

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
    /// Past the delivery cap and on its one try alone: committed in a transaction of its own.
    pub(super) solo: bool,
    /// What the entry weighed as read (`Entry::size_bytes`): the writer's group commit is
    /// bounded by these.
    pub(super) bytes: usize,
    /// When the read that returned it came back (for the per-stage latency).
    pub(super) read_at: Instant,
    /// When it was parsed.
    pub(super) parsed_at: Instant,
    /// Its share of the worker's memory budget, let go when it is dropped.
    pub(super) held: Held,
}

/// What the reader hands the parse pool.
pub(super) struct Handoff {
    /// The entries, in stream order.
    pub(super) entries: Vec<Entry>,
    /// True for the one-entry handoff of an entry past the delivery cap on its try alone: the
    /// cap does not reject it. Otherwise an entry past the cap is dead-lettered (its try alone
    /// already happened).
    pub(super) solo: bool,
    /// When the read that returned the entries came back.
    pub(super) read_at: Instant,
    /// Its place among the handoffs, numbered by the reader as it hands them on: the parse
    /// threads finish them in any order, and the writers take them back in this one.
    pub(super) seq: u64,
}

/// A parsed handoff: its `Handoff::seq` and its entries, in stream order.
pub(super) type Batch = (u64, Vec<Parsed>);

/// What the reader sends the parse pool: a handoff, and what its entries hold of the memory
/// budget (split among the parsed entries, each letting go of its share when dropped).
pub(super) type Raw = (Handoff, Held);

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
    rx: Receiver<Raw>,
    tx: Sender<Batch>,
    wcfg: &WorkerConfig,
    mut filter: Option<(&FastFilter, Conn)>,
) {
    for (handoff, mut held) in rx {
        let (solo, read_at, seq) = (handoff.solo, handoff.read_at, handoff.seq);
        let mut parsed: Vec<Parsed> = (handoff.entries.into_iter())
            .map(|e| {
                let share = held.take(e.weight());
                let mut p = parse_one(e, wcfg, solo, read_at);
                p.held = share;
                p
            })
            .collect();
        // What is left is the weight of entries the reader kept back (past the delivery cap):
        // the reader reads nothing more until they are done with (quarantine.rs).
        drop(held);
        if let Some((filter, conn)) = filter.as_mut() {
            look_up_committed(filter, conn, &mut parsed);
        }
        if tx.send((seq, parsed)).is_err() {
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

/// Validates one entry, or says why it must be dead-lettered. Past the delivery cap it is
/// rejected unless this is its try alone (`solo`). Pure apart from its inputs and the clock
/// (`read_at` and the time it finishes, for the per-stage latency).
fn parse_one(entry: Entry, wcfg: &WorkerConfig, solo: bool, read_at: Instant) -> Parsed {
    let (id, delivery_count, bytes) = (entry.id.clone(), entry.delivery_count, entry.size_bytes());
    let limits = submission::Limits {
        payload_bytes_max: wcfg.payload_bytes_max,
        amount_cents_max: wcfg.amount_cents_max,
    };
    // A payload over the limit but no longer than a dead letter keeps whole is copied whole,
    // and `dlq list` names its award; so does this, reading at most that many bytes.
    let hint_bytes_max = wcfg
        .payload_bytes_max
        .max(crate::broker::dead_letter::DEAD_LETTER_PREFIX_BYTES);
    let hint = |entry: &Entry| {
        submission::payload_of(&entry.fields)
            .ok()
            .and_then(|p| submission::award_id_hint(p, hint_bytes_max))
    };
    let verdict = if let Some(cut) = entry.cut.as_deref() {
        let (code, reason) = too_large(cut, wcfg);
        Verdict::Rejected(Rejected {
            code,
            reason,
            // A payload small enough to be sent whole (4 KiB or less) still names its award.
            award_id: hint(&entry),
            key: None,
            entry,
        })
    } else if delivery_count > wcfg.max_deliveries && !solo {
        Verdict::Rejected(Rejected {
            code: "max_deliveries",
            reason: format!(
                "max deliveries exceeded ({delivery_count} > {}) and none of its {} tries alone \
                 succeeded",
                wcfg.max_deliveries, QUARANTINE_TRIES_MAX
            ),
            award_id: hint(&entry),
            key: submission::parse_entry(&entry.fields, &limits)
                .ok()
                .map(|s| s.key),
            entry,
        })
    } else {
        let parsed = match event::published_id(&entry.fields) {
            Some(event_id) => Err(submission::Malformed::OwnEvent { event_id }),
            None => submission::parse_entry(&entry.fields, &limits),
        };
        match parsed {
            Ok(s) => Verdict::Valid(s),
            Err(m) => Verdict::Rejected(Rejected {
                code: m.code(),
                // Quoted text from the entry (an event id) may hold a NUL: stored alike on
                // every ledger.
                reason: submission::storable(&m.to_string()).into_owned(),
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
        solo,
        bytes,
        read_at,
        parsed_at: Instant::now(),
        held: Held::default(),
    }
}

/// Why an entry Redis sent cut (too large to read whole: `broker/read.rs`) is dead-lettered,
/// as a code and words, first cause first: its payload over `--payload-bytes-max`, too many
/// fields, another field over that limit, or all of it over the entry limit. It is never
/// parsed: what came of it is not the entry.
fn too_large(cut: &Cut, wcfg: &WorkerConfig) -> (&'static str, String) {
    let limits = Limits::for_payload(wcfg.payload_bytes_max);
    let field_max = limits.field_bytes_max as u64;
    match cut.payload {
        PayloadSize::One(size) if size > field_max => {
            let m = submission::Malformed::PayloadTooLarge {
                size: size as usize,
                max: limits.field_bytes_max,
            };
            return (m.code(), m.to_string());
        }
        _ => {}
    }
    if cut.fields > limits.fields_max as u64 {
        let why = format!(
            "entry has {} fields, over the limit of {}",
            cut.fields, limits.fields_max
        );
        return ("too_many_fields", why);
    }
    if cut.largest_bytes > field_max {
        // A producer's bytes, kept printable and storable in any ledger (no NUL, no control).
        let name = String::from_utf8_lossy(&cut.largest_name);
        let why = format!(
            "field \"{}\" is {} bytes, over the limit of {field_max} bytes",
            crate::support::escape::controls(&name),
            cut.largest_bytes
        );
        return ("field_too_large", why);
    }
    let why = format!(
        "entry is {} bytes, over the limit of {} bytes",
        cut.bytes, limits.entry_bytes_max
    );
    ("entry_too_large", why)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &[u8] =
        br#"{"award_id":"A-7","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":125}"#;

    fn wcfg() -> WorkerConfig {
        let ledger = crate::config::LedgerName {
            id: "L".into(),
            shown: "ledger.db".into(),
        };
        WorkerConfig::new("c", ledger)
    }

    /// An entry the server cut down: `bytes` in all, `fields` fields, the payload's size
    /// `payload`, the largest value `largest` bytes.
    fn cut(bytes: u64, fields: u64, payload: PayloadSize, largest: u64) -> Entry {
        let mut e = Entry::whole("7-0", Vec::new(), 1);
        e.cut = Some(Box::new(Cut {
            bytes,
            fields,
            payload,
            largest_name: b"note\n\0".to_vec(),
            largest_bytes: largest,
            summaries: Vec::new(),
        }));
        e
    }

    #[test]
    fn an_entry_cut_on_the_server_is_rejected_with_its_first_cause() {
        let w = wcfg();
        let max = w.payload_bytes_max as u64;
        for (entry, code, reason) in [
            (
                cut(max + 10, 1, PayloadSize::One(max + 1), max + 1),
                "payload_too_large",
                format!(
                    "payload is {} bytes, over the limit of {max} bytes",
                    max + 1
                ),
            ),
            (
                cut(60_000, 1_001, PayloadSize::One(5), 5),
                "too_many_fields",
                "entry has 1001 fields, over the limit of 1000".to_owned(),
            ),
            (
                cut(max + 100, 2, PayloadSize::One(5), max + 1),
                "field_too_large",
                format!(
                    "field \"note\\n\\u{{0}}\" is {} bytes, over the limit of {max} bytes",
                    max + 1
                ),
            ),
            (
                cut(max + 70_000, 3, PayloadSize::Absent, max),
                "entry_too_large",
                format!(
                    "entry is {} bytes, over the limit of {} bytes",
                    max + 70_000,
                    max + 65_536
                ),
            ),
        ] {
            let p = parse_one(entry, &w, false, Instant::now());
            let Verdict::Rejected(r) = &p.verdict else {
                panic!("accepted a cut entry")
            };
            assert_eq!((r.code, r.reason.as_str()), (code, reason.as_str()));
        }
    }

    fn entry(payload: &[u8], delivery_count: u64) -> Entry {
        Entry::whole(
            "5-0",
            vec![(submission::PAYLOAD_FIELD.to_vec(), payload.to_vec())],
            delivery_count,
        )
    }

    #[test]
    fn a_valid_entry_under_the_cap_is_a_submission() {
        let wcfg = wcfg();
        let p = parse_one(
            entry(VALID, wcfg.max_deliveries),
            &wcfg,
            false,
            Instant::now(),
        );
        assert_eq!(
            (p.id.as_str(), p.delivery_count),
            ("5-0", wcfg.max_deliveries)
        );
        let Verdict::Valid(s) = &p.verdict else {
            panic!("rejected a valid entry")
        };
        assert_eq!((s.award_id.as_str(), s.amount_cents), ("A-7", 125));
        assert_eq!(p.valid_key(), Some(s.key));
    }

    #[test]
    fn over_the_cap_a_valid_entry_is_tried_alone_once() {
        let wcfg = wcfg();
        let p = parse_one(
            entry(VALID, wcfg.max_deliveries + 1),
            &wcfg,
            true,
            Instant::now(),
        );
        assert!(p.solo);
        assert!(matches!(p.verdict, Verdict::Valid(_)));
    }

    #[test]
    fn over_the_cap_after_its_try_alone_even_a_valid_entry_is_rejected_keeping_its_award_and_key() {
        let wcfg = wcfg();
        let over = wcfg.max_deliveries + 1;
        let p = parse_one(entry(VALID, over), &wcfg, false, Instant::now());
        let Verdict::Rejected(r) = &p.verdict else {
            panic!("accepted an entry over the delivery cap")
        };
        assert_eq!(r.code, "max_deliveries");
        assert_eq!(
            r.reason,
            format!(
                "max deliveries exceeded ({over} > {}) and none of its {} tries alone succeeded",
                wcfg.max_deliveries, QUARANTINE_TRIES_MAX
            )
        );
        assert_eq!(r.award_id.as_deref(), Some("A-7"));
        assert!(r.key.is_some());
        assert_eq!(
            r.entry,
            entry(VALID, over),
            "the whole original entry is kept"
        );
        assert_eq!(p.valid_key(), None);
    }

    #[test]
    fn a_malformed_entry_is_rejected_with_its_code_and_no_key() {
        let wcfg = wcfg();
        let p = parse_one(entry(b"{not json", 1), &wcfg, false, Instant::now());
        let Verdict::Rejected(r) = &p.verdict else {
            panic!("accepted a malformed entry")
        };
        assert_eq!(r.code, "not_json");
        assert_eq!((r.award_id.as_deref(), r.key), (None, None));
    }
}
