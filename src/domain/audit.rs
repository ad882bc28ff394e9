//! The tamper-evident audit trail: what a record holds and how the chain is computed.
//!
//! Each record's hash covers its own content and the previous record's hash, starting from
//! [`GENESIS_HASH`]. Editing a record changes its hash; deleting or reordering records breaks the
//! link from the next one. The ledger writes records in the same transaction as the effect they
//! describe; this module is pure and never touches SQLite or Redis.

use crate::domain::key::to_hex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prev_hash` of the first record.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The log target audit lines are written under, so they can be routed on their own.
pub const LOG_TARGET: &str = "claimgate::audit";

/// What happened, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A submission was claimed and its disbursement recorded.
    Processed,
    /// A delivery was recognised as already processed and skipped.
    Duplicate,
    /// An entry was copied to the dead-letter stream.
    DeadLetter,
    /// A submission reused an award's timestamp with a different payload.
    Conflict,
    /// Records before this one were purged; the chain continues from `prev_hash`.
    Checkpoint,
    /// A pending entry was gone from the stream (trimmed or deleted before it was processed)
    /// and was acknowledged out of the pending list: nothing was paid or dead-lettered for it.
    /// Carries the entry id, the consumer that acknowledged it and when.
    Vanished,
    /// An award was placed under legal hold (`claimgate hold add`). Carries the award and the
    /// reason; written in the same transaction as the hold.
    HoldAdded,
    /// A legal hold was lifted (`claimgate hold remove`). Carries the award and the reason the
    /// hold had; written in the same transaction as the removal.
    HoldRemoved,
    /// The ledger was put in place from a backup by `claimgate restore`: which backup, and
    /// which outbox rows were marked published because the events stream already held them.
    Restored,
}

impl Kind {
    /// The name stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Processed => "processed",
            Kind::Duplicate => "duplicate",
            Kind::DeadLetter => "dead_letter",
            Kind::Conflict => "conflict",
            Kind::Checkpoint => "checkpoint",
            Kind::Vanished => "vanished",
            Kind::HoldAdded => "hold_added",
            Kind::HoldRemoved => "hold_removed",
            Kind::Restored => "restored",
        }
    }

    /// Parses a `kind` column value.
    pub fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Processed,
            Kind::Duplicate,
            Kind::DeadLetter,
            Kind::Conflict,
            Kind::Checkpoint,
            Kind::Vanished,
            Kind::HoldAdded,
            Kind::HoldRemoved,
            Kind::Restored,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One audit record. Field order is the canonical order the hash is computed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Position in the chain (1-based, never reused).
    pub seq: i64,
    /// What happened.
    pub kind: Kind,
    /// The submission's idempotency key in hex, where there is one.
    pub idempotency_key: Option<String>,
    /// The award, where known.
    pub award_id: Option<String>,
    /// The amount disbursed (processed records only).
    pub amount_cents: Option<i64>,
    /// The stream entry that carried it.
    pub stream_entry_id: Option<String>,
    /// The consumer that handled it.
    pub consumer: Option<String>,
    /// How many times the entry had been delivered.
    pub delivery_count: Option<i64>,
    /// Kind-specific detail: a dead letter's reason, when a duplicate's key was first claimed.
    pub detail: Option<String>,
    /// When the record was written (RFC 3339, UTC).
    pub recorded_at: String,
    /// The previous record's hash.
    pub prev_hash: String,
    /// This record's hash.
    pub hash: String,
}

impl Record {
    /// A record of `kind` written at `recorded_at` with every optional field empty and no
    /// place in the chain yet (`seq` 0, no hashes): the base the ledgers fill in (with struct
    /// update syntax) before they number and seal it.
    pub fn unsealed(kind: Kind, recorded_at: &str) -> Record {
        Record {
            seq: 0,
            kind,
            idempotency_key: None,
            award_id: None,
            amount_cents: None,
            stream_entry_id: None,
            consumer: None,
            delivery_count: None,
            detail: None,
            recorded_at: recorded_at.to_owned(),
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    /// A legal hold's record (`hold_added` / `hold_removed`), unsealed: the award and the
    /// detail, nothing else — the same on every ledger, since it is hashed evidence.
    pub fn hold(kind: Kind, award_id: &str, detail: String, recorded_at: &str) -> Record {
        Record {
            award_id: Some(award_id.to_owned()),
            detail: Some(detail),
            ..Record::unsealed(kind, recorded_at)
        }
    }

    /// The hash this record should carry, computed from its content and `prev_hash`:
    /// `sha256(prev_hash || canonical JSON)`, the JSON being this record as serde_json writes
    /// it with `hash` empty (field order as declared, `None` as `null`). The JSON is spelled by
    /// [`Record::canonical_json`] rather than by serde, because this runs once per record on
    /// the ledger's single writer thread: no clone of the record, no intermediate value.
    pub fn compute_hash(&self) -> String {
        let mut canonical = Vec::with_capacity(CANONICAL_BYTES_TYPICAL);
        self.canonical_json(&mut canonical);
        let mut h = Sha256::new();
        h.update(self.prev_hash.as_bytes());
        h.update(&canonical);
        to_hex(&h.finalize())
    }

    /// Appends the canonical JSON the hash is taken over to `out`: byte for byte what
    /// `serde_json::to_vec` writes for this record with `hash` set to `""` (a unit test holds
    /// the two equal over arbitrary records, and the vectors below pin both).
    pub fn canonical_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"seq\":");
        json::int(out, self.seq);
        out.extend_from_slice(b",\"kind\":");
        json::string(out, self.kind.as_str());
        out.extend_from_slice(b",\"idempotency_key\":");
        json::opt_string(out, self.idempotency_key.as_deref());
        out.extend_from_slice(b",\"award_id\":");
        json::opt_string(out, self.award_id.as_deref());
        out.extend_from_slice(b",\"amount_cents\":");
        json::opt_int(out, self.amount_cents);
        out.extend_from_slice(b",\"stream_entry_id\":");
        json::opt_string(out, self.stream_entry_id.as_deref());
        out.extend_from_slice(b",\"consumer\":");
        json::opt_string(out, self.consumer.as_deref());
        out.extend_from_slice(b",\"delivery_count\":");
        json::opt_int(out, self.delivery_count);
        out.extend_from_slice(b",\"detail\":");
        json::opt_string(out, self.detail.as_deref());
        out.extend_from_slice(b",\"recorded_at\":");
        json::string(out, &self.recorded_at);
        out.extend_from_slice(b",\"prev_hash\":");
        json::string(out, &self.prev_hash);
        out.extend_from_slice(b",\"hash\":\"\"}");
    }

    /// Sets `prev_hash` and `hash`, linking this record after `prev_hash`.
    pub fn seal(&mut self, prev_hash: &str) {
        self.prev_hash = prev_hash.to_owned();
        self.hash = self.compute_hash();
    }
}

/// Room for a typical record's canonical JSON, so spelling it allocates once.
const CANONICAL_BYTES_TYPICAL: usize = 512;

/// JSON values exactly as serde_json writes them (compact form).
mod json {
    /// A JSON string: `"`, `\\` and control characters escaped as serde_json escapes them
    /// (`\b \t \n \f \r` by name, the rest as `\u00xx` in lowercase hex), everything else,
    /// non-ASCII included, as it is.
    pub(super) fn string(out: &mut Vec<u8>, s: &str) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.push(b'"');
        let bytes = s.as_bytes();
        // Keys, ids, times and hashes never need escaping: one pass to see that, one copy.
        if !bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\') {
            out.extend_from_slice(bytes);
            out.push(b'"');
            return;
        }
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let named: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                0x08 => b"\\b",
                0x09 => b"\\t",
                0x0a => b"\\n",
                0x0c => b"\\f",
                0x0d => b"\\r",
                0x00..=0x1f => b"",
                _ => continue,
            };
            out.extend_from_slice(&bytes[start..i]);
            if named.is_empty() {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0x0f)]);
            } else {
                out.extend_from_slice(named);
            }
            start = i + 1;
        }
        out.extend_from_slice(&bytes[start..]);
        out.push(b'"');
    }

    /// A string or `null`.
    pub(super) fn opt_string(out: &mut Vec<u8>, s: Option<&str>) {
        match s {
            Some(s) => string(out, s),
            None => out.extend_from_slice(b"null"),
        }
    }

    /// An integer in decimal.
    pub(super) fn int(out: &mut Vec<u8>, n: i64) {
        use std::io::Write;
        write!(out, "{n}").expect("writing to a Vec cannot fail");
    }

    /// An integer or `null`.
    pub(super) fn opt_int(out: &mut Vec<u8>, n: Option<i64>) {
        match n {
            Some(n) => int(out, n),
            None => out.extend_from_slice(b"null"),
        }
    }
}

/// Where a chain first goes wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    /// The `seq` of the first record that does not check out.
    pub seq: i64,
    /// What is wrong with it.
    pub reason: String,
}

/// Walks records in order and checks every link and hash. See [`Verifier`].
pub fn verify_chain<'a>(records: impl IntoIterator<Item = &'a Record>) -> Result<u64, Break> {
    let mut v = Verifier::default();
    for r in records {
        v.push(r)?;
    }
    Ok(v.count)
}

/// Checks a chain one record at a time, so a ledger of any size verifies in constant memory.
///
/// A chain starts at [`GENESIS_HASH`], or with a checkpoint left by a retention purge. A
/// leading checkpoint is transparent: its `prev_hash` is the hash of the last purged record, the
/// hash it continues from, and the next record must link to that; its own `hash` seals its
/// content (what was purged, and the export's digest). Anywhere else a checkpoint is an
/// ordinary link, so nothing can jump the chain mid-way.
#[derive(Debug, Default, Clone)]
pub struct Verifier {
    /// The `prev_hash` the next record must carry; `None` before the first record.
    expected_prev: Option<String>,
    /// The last record's seq, for the ordering check.
    last_seq: Option<i64>,
    /// Records checked so far.
    pub count: u64,
}

impl Verifier {
    /// A verifier whose first record must link to `prev_hash` (to check an export that starts
    /// mid-chain, against the hash its predecessor ended on).
    pub fn continuing_from(prev_hash: &str) -> Self {
        Verifier {
            expected_prev: Some(prev_hash.to_owned()),
            ..Verifier::default()
        }
    }

    /// The hash the next record must link to (the chain's head so far).
    pub fn head(&self) -> &str {
        self.expected_prev.as_deref().unwrap_or(GENESIS_HASH)
    }

    /// Checks the next record.
    pub fn push(&mut self, r: &Record) -> Result<(), Break> {
        if let Some(last) = self.last_seq {
            if r.seq <= last {
                return Err(Break {
                    seq: r.seq,
                    reason: format!("out of order after seq {last}"),
                });
            }
        }
        let leading_checkpoint = self.expected_prev.is_none() && r.kind == Kind::Checkpoint;
        if !leading_checkpoint && r.prev_hash != self.head() {
            return Err(Break {
                seq: r.seq,
                reason: "prev_hash does not match the previous record's hash (a record before it was edited, deleted or moved)".into(),
            });
        }
        if r.compute_hash() != r.hash {
            return Err(Break {
                seq: r.seq,
                reason: "content does not match its hash (edited)".into(),
            });
        }
        let next = if leading_checkpoint {
            &r.prev_hash
        } else {
            &r.hash
        };
        self.expected_prev = Some(next.clone());
        self.last_seq = Some(r.seq);
        self.count += 1;
        Ok(())
    }
}

/// The `detail` text of each kind of record, defined once for every ledger: it is hashed into
/// the chain, so two backends (or two releases) must never word the same event differently.
pub mod detail {
    /// A delivery of an already-claimed key.
    pub fn duplicate(first_claimed_at: &str) -> String {
        format!("first claimed at {first_claimed_at}")
    }

    /// A delivery of a key whose claim a retention purge removed: its tombstone still
    /// suppresses it. Says when the key was claimed and when the claim was purged.
    pub fn duplicate_of_purged(first_claimed_at: &str, purged_at: &str) -> String {
        format!("first claimed at {first_claimed_at}; claim purged at {purged_at} (tombstone)")
    }

    /// A duplicate's detail (either of the above) when a fast-filter marker pointed at it and
    /// the ledger confirmed it: the same facts, and the route they were found by.
    pub fn via_fast_filter(duplicate_detail: &str) -> String {
        format!("{duplicate_detail} (fast filter)")
    }

    /// The whole detail of a `duplicate` record, as every backend writes it: the claim it
    /// repeats (or that claim's tombstone, `purged_at`), and whether a confirmed fast-filter
    /// marker found it.
    pub fn duplicate_record(
        first_claimed_at: &str,
        purged_at: Option<&str>,
        via_filter: bool,
    ) -> String {
        let text = match purged_at {
            None => duplicate(first_claimed_at),
            Some(purged) => duplicate_of_purged(first_claimed_at, purged),
        };
        if via_filter {
            via_fast_filter(&text)
        } else {
            text
        }
    }

    /// A legal hold placed.
    pub fn hold_added(reason: &str) -> String {
        format!("legal hold placed: {reason}")
    }

    /// A legal hold lifted; `reason` is the reason the hold had.
    pub fn hold_removed(reason: &str, held_at: &str) -> String {
        format!("legal hold lifted (placed at {held_at}: {reason})")
    }

    /// A ledger restored from `backup`, with the outbox rows at or below `mark_upto` (the
    /// events stream's high-water mark for this ledger) marked published, `marked` of them
    /// newly, and outbox ids continuing above `next_id_after`.
    pub fn restored(backup: &str, mark_upto: i64, marked: u64, next_id_after: i64) -> String {
        format!(
            "restored from backup {backup}; events stream mark at outbox id {mark_upto}: \
             {marked} restored rows at or below it marked published (already on the stream); \
             new outbox ids continue after {next_id_after}"
        )
    }

    /// A dead letter.
    pub fn dead_letter(reason_code: &str, reason: &str) -> String {
        format!("{reason_code}: {reason}")
    }

    /// An entry gone from `stream` while pending.
    pub fn vanished(stream: &str, reason: &str) -> String {
        format!("{stream} {reason}")
    }

    /// A conflicting resubmission that was paid (`--on-conflict record`).
    pub fn conflict_paid(other_key: &str, other_claimed_at: &str) -> String {
        format!(
            "{}; paid (--on-conflict record)",
            conflict(other_key, other_claimed_at)
        )
    }

    /// A conflicting resubmission that was held (`--on-conflict hold`).
    pub fn conflict_held(other_key: &str, other_claimed_at: &str) -> String {
        format!(
            "{}; held for review, not paid (--on-conflict hold)",
            conflict(other_key, other_claimed_at)
        )
    }

    /// Why a conflicting resubmission was held: its dead-letter row's reason.
    pub fn hold_reason(other_key: &str) -> String {
        format!(
            "conflicts with key {other_key} for the same award and submission time; held for review"
        )
    }

    /// The `dead_letter` record of a held conflicting resubmission.
    pub fn conflict_hold(reason: &str) -> String {
        dead_letter("conflict_hold", reason)
    }

    fn conflict(other_key: &str, other_claimed_at: &str) -> String {
        format!(
            "conflicts with key {other_key} (claimed at {other_claimed_at}): same award_id and submission instant, different payload"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: i64, award: &str) -> Record {
        Record {
            seq,
            kind: Kind::Processed,
            idempotency_key: Some("ab".repeat(32)),
            award_id: Some(award.into()),
            amount_cents: Some(100),
            stream_entry_id: Some(format!("{seq}-0")),
            consumer: Some("c".into()),
            delivery_count: Some(1),
            detail: None,
            recorded_at: "2026-11-29T00:00:00.000000Z".into(),
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    fn chain(n: i64) -> Vec<Record> {
        let mut prev = GENESIS_HASH.to_owned();
        (1..=n)
            .map(|i| {
                let mut r = record(i, &format!("A-{i}"));
                r.seal(&prev);
                prev = r.hash.clone();
                r
            })
            .collect()
    }

    #[test]
    fn every_kind_reads_back_from_its_column_value_and_nothing_else_reads_as_a_kind() {
        let kinds = [
            (Kind::Processed, "processed"),
            (Kind::Duplicate, "duplicate"),
            (Kind::DeadLetter, "dead_letter"),
            (Kind::Conflict, "conflict"),
            (Kind::Checkpoint, "checkpoint"),
            (Kind::Vanished, "vanished"),
            (Kind::HoldAdded, "hold_added"),
            (Kind::HoldRemoved, "hold_removed"),
            (Kind::Restored, "restored"),
        ];
        for (kind, column) in kinds {
            assert_eq!(kind.as_str(), column);
            assert_eq!(Kind::parse(column), Some(kind), "{column}");
        }
        for other in ["", "Processed", "dead-letter", "hold"] {
            assert_eq!(Kind::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_hold_record_carries_its_award_and_detail_and_nothing_else() {
        let r = Record::hold(Kind::HoldAdded, "A-1", "audit 2026-17".into(), "T");
        let expected = Record {
            award_id: Some("A-1".into()),
            detail: Some("audit 2026-17".into()),
            ..Record::unsealed(Kind::HoldAdded, "T")
        };
        assert_eq!(r, expected);
        assert_eq!(
            (r.idempotency_key, r.amount_cents, r.consumer),
            (None, None, None)
        );
    }

    #[test]
    fn each_detail_is_worded_exactly_as_ledgers_already_hold_it() {
        // Hashed evidence: a reworded detail would make two backends, or two releases, record
        // the same event differently. Spelled out, not built from the functions under test.
        let t = "2026-07-01T09:00:00.000000Z";
        assert_eq!(
            detail::duplicate_record(t, None, false),
            format!("first claimed at {t}")
        );
        assert_eq!(
            detail::duplicate_record(t, Some("2030-01-01"), true),
            format!("first claimed at {t}; claim purged at 2030-01-01 (tombstone) (fast filter)")
        );
        assert_eq!(
            detail::duplicate_record(t, None, true),
            format!("first claimed at {t} (fast filter)")
        );
        assert_eq!(detail::hold_added("audit"), "legal hold placed: audit");
        assert_eq!(
            detail::hold_removed("audit", t),
            format!("legal hold lifted (placed at {t}: audit)")
        );
        assert_eq!(
            detail::restored("b.db", 5, 3, 9),
            "restored from backup b.db; events stream mark at outbox id 5: 3 restored rows at \
             or below it marked published (already on the stream); new outbox ids continue \
             after 9"
        );
        assert_eq!(
            detail::dead_letter("not_json", "payload is not JSON"),
            "not_json: payload is not JSON"
        );
        assert_eq!(
            detail::vanished("grants:submissions", "was deleted"),
            "grants:submissions was deleted"
        );
        let conflict = format!(
            "conflicts with key k2 (claimed at {t}): same award_id and submission instant, \
             different payload"
        );
        assert_eq!(
            detail::conflict_paid("k2", t),
            format!("{conflict}; paid (--on-conflict record)")
        );
        assert_eq!(
            detail::conflict_held("k2", t),
            format!("{conflict}; held for review, not paid (--on-conflict hold)")
        );
        let reason =
            "conflicts with key k2 for the same award and submission time; held for review";
        assert_eq!(detail::hold_reason("k2"), reason);
        assert_eq!(
            detail::conflict_hold(reason),
            format!("conflict_hold: {reason}")
        );
    }

    #[test]
    fn a_verifier_continuing_from_a_hash_takes_the_chain_from_there_and_nothing_else() {
        let full = chain(5);
        let mut v = Verifier::continuing_from(&full[1].hash);
        for r in &full[2..] {
            v.push(r).expect("the rest of the chain links on");
        }
        assert_eq!((v.count, v.head()), (3, full[4].hash.as_str()));
        let mut wrong = Verifier::continuing_from(&full[0].hash);
        assert_eq!(wrong.push(&full[2]).map_err(|b| b.seq), Err(3));
        let mut fresh = Verifier::default();
        assert!(
            fresh.push(&full[2]).is_err(),
            "a fresh verifier starts at genesis"
        );
    }

    #[test]
    fn an_intact_chain_verifies() {
        assert_eq!(verify_chain(&chain(5)), Ok(5));
    }

    #[test]
    fn an_edit_a_deletion_and_a_swap_are_each_caught_at_the_right_record() {
        let mut edited = chain(5);
        edited[2].amount_cents = Some(101);
        assert_eq!(verify_chain(&edited).unwrap_err().seq, 3);

        let mut deleted = chain(5);
        deleted.remove(1);
        assert_eq!(verify_chain(&deleted).unwrap_err().seq, 3);

        let mut swapped = chain(5);
        swapped.swap(1, 2);
        assert_eq!(verify_chain(&swapped).unwrap_err().seq, 3);
    }

    #[test]
    fn a_leading_checkpoint_bridges_a_purged_prefix_and_is_itself_sealed() {
        let full = chain(5);
        let mut cp = record(2, "-");
        cp.kind = Kind::Checkpoint;
        cp.prev_hash = full[1].hash.clone();
        cp.hash = cp.compute_hash();
        let mut purged = vec![cp.clone()];
        purged.extend_from_slice(&full[2..]);
        assert_eq!(verify_chain(&purged), Ok(4));

        purged[0].detail = Some("edited".into());
        assert_eq!(verify_chain(&purged).unwrap_err().seq, 2);

        let mut mid = full.clone();
        mid[2].kind = Kind::Checkpoint;
        mid[2].prev_hash = full[0].hash.clone();
        mid[2].hash = mid[2].compute_hash();
        assert_eq!(
            verify_chain(&mid).unwrap_err().seq,
            3,
            "a checkpoint cannot bridge mid-chain"
        );
    }

    /// serde_json's spelling of `r` with `hash` empty: the definition `canonical_json` keeps.
    fn serde_canonical(r: &Record) -> Vec<u8> {
        let mut content = r.clone();
        content.hash = String::new();
        serde_json::to_vec(&content).unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]
        /// Over arbitrary text (control characters, quotes, backslashes, non-ASCII) and numbers,
        /// the hand-written canonical JSON is byte for byte serde_json's.
        #[test]
        fn the_canonical_json_is_exactly_serde_jsons(
            seq in proptest::num::i64::ANY,
            kind in 0usize..9,
            texts in proptest::collection::vec(proptest::option::of("(?s).{0,40}"), 5),
            amount in proptest::option::of(proptest::num::i64::ANY),
            deliveries in proptest::option::of(proptest::num::i64::ANY),
            recorded_at in "(?s).{0,30}",
            prev_hash in "[0-9a-f\"\\\\\u{0}-\u{1f}]{0,64}",
        ) {
            let kinds = [Kind::Processed, Kind::Duplicate, Kind::DeadLetter, Kind::Conflict,
                Kind::Checkpoint, Kind::Vanished, Kind::HoldAdded, Kind::HoldRemoved, Kind::Restored];
            let r = Record {
                seq,
                kind: kinds[kind],
                idempotency_key: texts[0].clone(),
                award_id: texts[1].clone(),
                amount_cents: amount,
                stream_entry_id: texts[2].clone(),
                consumer: texts[3].clone(),
                delivery_count: deliveries,
                detail: texts[4].clone(),
                recorded_at,
                prev_hash,
                hash: "ignored: the hash is spelled empty".into(),
            };
            let mut ours = Vec::new();
            r.canonical_json(&mut ours);
            proptest::prop_assert_eq!(String::from_utf8(ours).unwrap(),
                String::from_utf8(serde_canonical(&r)).unwrap());
        }
    }

    #[test]
    fn every_control_character_is_escaped_as_serde_json_escapes_it() {
        let all: String = (0u8..0x80)
            .map(char::from)
            .chain(['\u{7f}', 'é', '\u{2028}', '😀'])
            .collect();
        let mut r = record(1, &all);
        r.detail = Some(all.clone());
        let mut ours = Vec::new();
        r.canonical_json(&mut ours);
        assert_eq!(ours, serde_canonical(&r));
    }

    /// The hash rule pinned by vectors computed outside Rust (Python's `hashlib` over the
    /// canonical JSON spelled out here), so a change to field order, null handling or the
    /// prev-hash prefix cannot pass unnoticed by checking the code against itself:
    /// `sha256(prev_hash_hex_ascii || canonical_json_with_empty_hash)`.
    #[test]
    fn the_hash_matches_vectors_computed_outside_rust() {
        let mut first = Record {
            seq: 7,
            kind: Kind::Processed,
            idempotency_key: Some("ab".repeat(32)),
            award_id: Some("A-2026-014".into()),
            amount_cents: Some(125_000),
            stream_entry_id: Some("1719824400000-0".into()),
            consumer: Some("node-1".into()),
            delivery_count: Some(1),
            detail: None,
            recorded_at: "2026-07-01T09:00:00.123456Z".into(),
            prev_hash: String::new(),
            hash: String::new(),
        };
        first.seal(GENESIS_HASH);
        let mut content = first.clone();
        content.hash = String::new();
        let canonical = concat!(
            r#"{"seq":7,"kind":"processed","idempotency_key":"#,
            r#""abababababababababababababababababababababababababababababababab","#,
            r#""award_id":"A-2026-014","amount_cents":125000,"stream_entry_id":"1719824400000-0","#,
            r#""consumer":"node-1","delivery_count":1,"detail":null,"#,
            r#""recorded_at":"2026-07-01T09:00:00.123456Z","#,
            r#""prev_hash":"0000000000000000000000000000000000000000000000000000000000000000","#,
            r#""hash":""}"#
        );
        assert_eq!(serde_json::to_string(&content).unwrap(), canonical);
        assert_eq!(
            first.hash,
            "d1854f6a65a13ad6513cfe289f5115e8aae508bd91c1eeab4a1751c4e0fb9ce2"
        );

        let mut second = Record {
            seq: 8,
            kind: Kind::Duplicate,
            amount_cents: None,
            stream_entry_id: Some("1719824400001-0".into()),
            consumer: Some("node-2".into()),
            delivery_count: Some(2),
            detail: Some("first claimed at 2026-07-01T09:00:00.123456Z".into()),
            recorded_at: "2026-07-01T09:00:01.000000Z".into(),
            ..first.clone()
        };
        second.seal(&first.hash);
        assert_eq!(
            second.hash,
            "d185172245d4eb2b74870b9b15d92ca4be3cd4fabb970f966341d3a88c4b19b0"
        );
        assert_eq!(verify_chain([&first, &second]), Ok(2));
    }
}
