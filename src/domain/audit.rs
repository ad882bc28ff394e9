//! The tamper-evident audit trail: what a record holds and how the chain is computed.
//!
//! Each record's hash covers its own content and the previous record's hash, starting from
//! [`GENESIS_HASH`]. Editing a record changes its hash; deleting or reordering records breaks the
//! link from the next one. The ledger writes records in the same transaction as the effect they
//! describe; this module is pure and never touches SQLite or Redis.
//!
//! # Batches: records sealed before their place in the chain is known
//!
//! A ledger with one writer seals each record after the one before it (SQLite, the memory
//! ledger). A ledger with several writers (PostgreSQL) cannot: the previous record is decided
//! by the database when a batch is linked, and a batch's records are written before that, so
//! that no writer holds the chain's one lock while it writes rows. There a batch's records are
//! *members*: member `i` (from 1) is hashed exactly as a record whose `seq` is `i` and whose
//! `prev_hash` is member `i - 1`'s hash (the first member's is [`GENESIS_HASH`]), and it
//! carries `batch_index: i`. After the last member comes the batch's **link**, a record of kind
//! `batch` sealed like any other after the chain's head, whose detail names how many members the
//! batch has and the last one's hash ([`detail::batch_link`]). So the link pins every member
//! (an edit changes the last hash; a deletion, the count), and the links chain the batches in
//! the order the database linked them. A link is a seal, not an event: it carries the `seq` of
//! its batch's last member (which it closes) and is not counted among the records, so every
//! `seq` still names one record of what happened, numbered in the order the chain holds them,
//! and "the hash at seq `n`" is the link's when `n` ends a batch — the hash the next record
//! links to. [`Verifier`] checks both kinds of seal, in any mix: a ledger made by one writer
//! and later moved to a shared one (`claimgate migrate`) has record-by-record seals followed
//! by batches.

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
    /// The link of a batch of member records into the chain (shared ledgers; see the module
    /// doc): its detail names the batch, its member count, the last member's hash and the
    /// outbox ids the batch's rows were given ([`detail::batch_link`]).
    Batch,
    /// A reviewer approved a conflicting resubmission held for review (`claimgate dlq
    /// approve`): who and why ([`detail::conflict_approved`]). Written in the transaction that
    /// pays it, after its `processed` and `conflict` records.
    ConflictApproved,
    /// A reviewer rejected a conflicting resubmission held for review (`claimgate dlq
    /// reject`): who and why ([`detail::conflict_rejected`]). Nothing is paid.
    ConflictRejected,
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
            Kind::Batch => "batch",
            Kind::ConflictApproved => "conflict_approved",
            Kind::ConflictRejected => "conflict_rejected",
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
            Kind::Batch,
            Kind::ConflictApproved,
            Kind::ConflictRejected,
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
    /// For a member of a batch, its place in the batch (1 for the first): the `seq` its hash
    /// is taken with, while `seq` is its place in the chain. `None` for every other record,
    /// and then absent from its JSON, so records sealed one by one read and hash as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_index: Option<i64>,
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
            batch_index: None,
        }
    }

    /// The link record of a batch at `seq`, written at `recorded_at`, after the chain's head
    /// `prev_hash`, sealed; `detail` is [`detail::batch_link`]'s.
    pub fn link(seq: i64, detail: String, recorded_at: &str, prev_hash: &str) -> Record {
        let mut r = Record {
            seq,
            detail: Some(detail),
            ..Record::unsealed(Kind::Batch, recorded_at)
        };
        r.seal(prev_hash);
        r
    }

    /// The checkpoint a retention purge leaves at `seq`, the last record it removed, written at
    /// `recorded_at` and carrying `detail`, sealed after `continues_from` (the removed record's
    /// hash), so the records after it still link to it.
    pub fn checkpoint(seq: i64, detail: &str, recorded_at: &str, continues_from: &str) -> Record {
        let mut r = Record {
            seq,
            detail: Some(detail.to_owned()),
            ..Record::unsealed(Kind::Checkpoint, recorded_at)
        };
        r.seal(continues_from);
        r
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
    /// it with `hash` empty and no `batch_index` (field order as declared, `None` as `null`),
    /// and, for a batch member, `seq` replaced by its `batch_index`. The JSON is spelled by
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
    /// `serde_json::to_vec` writes for this record with `hash` set to `""`, `batch_index`
    /// absent and, for a batch member, `seq` set to its `batch_index` (a unit test holds the
    /// two equal over arbitrary records, and the vectors below pin both).
    pub fn canonical_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"seq\":");
        json::int(out, self.batch_index.unwrap_or(self.seq));
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
        // Every hash in a chain is sha256 in hex (the genesis hash too): anything else is a
        // column read into the wrong place.
        assert_eq!(
            prev_hash.len(),
            64,
            "record {} sealed after {prev_hash:?}, which is not a hash",
            self.seq
        );
        self.prev_hash = prev_hash.to_owned();
        self.hash = self.compute_hash();
    }
}

/// Seals `members` as one batch (see the module doc): member `i` gets `batch_index` `i + 1`
/// and links to the one before it, the first to [`GENESIS_HASH`]. Their `seq`s are left as
/// they are (the chain numbers them when the batch is linked). Returns the last member's
/// hash, which the batch's link names; the genesis hash for no members.
pub fn seal_batch(members: &mut [Record]) -> String {
    let mut prev = GENESIS_HASH.to_owned();
    for (i, r) in members.iter_mut().enumerate() {
        assert_ne!(r.kind, Kind::Batch, "a link is never a member of a batch");
        r.batch_index = Some(i as i64 + 1);
        r.seal(&prev);
        prev.clone_from(&r.hash);
    }
    prev
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
        // The pass is a fold with no early exit, which the compiler turns into vector
        // instructions (an `any` stopping at the first match was a byte at a time: 8% of
        // `audit verify`'s time, more than the copy).
        let plain = bytes.iter().fold(true, |plain, &b| {
            plain & (b >= 0x20) & (b != b'"') & (b != b'\\')
        });
        if plain {
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
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
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

/// Walks records in order and checks every link and hash, and that the chain does not end
/// inside a batch. See [`Verifier`].
pub fn verify_chain<'a>(records: impl IntoIterator<Item = &'a Record>) -> Result<u64, Break> {
    let mut v = Verifier::default();
    for r in records {
        v.push(r)?;
    }
    v.end()?;
    Ok(v.count)
}

/// Checks a chain one record at a time, so a ledger of any size verifies in constant memory.
///
/// A chain starts at [`GENESIS_HASH`], or with a checkpoint left by a retention purge. A
/// leading checkpoint is transparent: its `prev_hash` is the hash of the last purged record, the
/// hash it continues from, and the next record must link to that; its own `hash` seals its
/// content (what was purged, and the export's digest). Anywhere else a checkpoint is an
/// ordinary link, so nothing can jump the chain mid-way.
///
/// Records sealed one by one link to the chain's head. Batch members (see the module doc) link
/// to each other from the genesis hash, with consecutive `batch_index`es and `seq`s, and the
/// batch's link record must come right after the last one, carry that member's `seq`, name
/// exactly that many members and that member's hash, and link to the chain's head; the link
/// then is the head. Nothing else may come between a batch's first member and its link, and a
/// chain may not end inside a batch ([`Verifier::end`]). Links are not counted in `count`.
#[derive(Debug, Default, Clone)]
pub struct Verifier {
    /// The `prev_hash` the next record sealed after the chain's head must carry; `None` before
    /// the first.
    expected_prev: Option<String>,
    /// The last record's seq, for the ordering check.
    last_seq: Option<i64>,
    /// The batch whose members are being read and whose link has not come yet.
    open: Option<OpenBatch>,
    /// Records checked so far (links of batches are seals, not records: not counted).
    pub count: u64,
}

/// A batch between its first member and its link, as [`Verifier`] reads it.
#[derive(Debug, Clone)]
struct OpenBatch {
    /// The seq of the first member read.
    first_seq: i64,
    /// The last member read: its `batch_index` and hash.
    index: i64,
    running: String,
    /// The walk started inside this batch (a verifier continuing from a member's hash): the
    /// chain's head before the batch is unknown, so the link's `prev_hash` is taken as it is.
    partial: bool,
}

impl Verifier {
    /// A verifier whose first record must link to `prev_hash` (to check an export that starts
    /// mid-chain, against the hash its predecessor ended on). The predecessor may be a batch
    /// member: then the first record is the next member of that batch.
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

    /// Checks the next record (or a batch's link).
    pub fn push(&mut self, r: &Record) -> Result<(), Break> {
        // A link closes its batch at its last member's seq; every other record comes after.
        let closes = r.kind == Kind::Batch && r.batch_index.is_none();
        if let Some(last) = self.last_seq {
            if r.seq < last || (r.seq == last && !closes) {
                return Err(Break {
                    seq: r.seq,
                    reason: format!("out of order after seq {last}"),
                });
            }
        }
        match (r.batch_index, r.kind) {
            (Some(_), Kind::Batch | Kind::Checkpoint) => {
                return Err(Break {
                    seq: r.seq,
                    reason: format!("a {} record cannot be a batch member", r.kind.as_str()),
                })
            }
            (Some(index), _) => self.member(r, index)?,
            (None, Kind::Batch) => self.link(r)?,
            (None, _) => self.single(r)?,
        }
        self.last_seq = Some(r.seq);
        if !closes {
            self.count += 1;
        }
        Ok(())
    }

    /// Fails if the records pushed so far end inside a batch (its link is missing: the chain
    /// was cut there).
    pub fn end(&self) -> Result<(), Break> {
        match &self.open {
            Some(b) => Err(Break {
                seq: b.first_seq,
                reason: "the batch starting here has no link record (the chain ends inside it)"
                    .into(),
            }),
            None => Ok(()),
        }
    }

    /// A record sealed after the chain's head (or a leading checkpoint).
    fn single(&mut self, r: &Record) -> Result<(), Break> {
        if let Some(b) = &self.open {
            return Err(Break {
                seq: r.seq,
                reason: format!(
                    "a {} record inside the batch whose members start at seq {} (its link \
                     record is missing)",
                    r.kind.as_str(),
                    b.first_seq
                ),
            });
        }
        let leading_checkpoint = self.expected_prev.is_none() && r.kind == Kind::Checkpoint;
        if !leading_checkpoint && r.prev_hash != self.head() {
            return Err(prev_mismatch(r));
        }
        check_hash(r)?;
        let next = if leading_checkpoint {
            &r.prev_hash
        } else {
            &r.hash
        };
        self.expected_prev = Some(next.clone());
        Ok(())
    }

    /// Member `index` of a batch.
    fn member(&mut self, r: &Record, index: i64) -> Result<(), Break> {
        let broken = |reason: String| Break { seq: r.seq, reason };
        let (expected_prev, first_seq, partial) = match &self.open {
            Some(b) if index == 1 => {
                return Err(broken(format!(
                    "a new batch starts before the batch whose members start at seq {} was \
                     linked (its link record is missing)",
                    b.first_seq
                )))
            }
            Some(b) if index != b.index + 1 => {
                return Err(broken(format!(
                    "batch member {index} follows member {} (a member before it was deleted \
                     or moved)",
                    b.index
                )))
            }
            Some(b) if self.last_seq.is_some_and(|s| r.seq != s + 1) => {
                return Err(broken("batch members do not have consecutive seqs".into()))
            }
            Some(b) => (b.running.clone(), b.first_seq, b.partial),
            None if index == 1 => (GENESIS_HASH.to_owned(), r.seq, false),
            // An export that starts inside a batch, continuing from the member before it.
            None if self.count == 0 && self.expected_prev.is_some() => {
                (self.head().to_owned(), r.seq, true)
            }
            None => {
                return Err(broken(format!(
                    "batch member {index} without the members before it (a record before it \
                     was deleted or moved)"
                )))
            }
        };
        if r.prev_hash != expected_prev {
            return Err(prev_mismatch(r));
        }
        check_hash(r)?;
        self.open = Some(OpenBatch {
            first_seq,
            index,
            running: r.hash.clone(),
            partial,
        });
        Ok(())
    }

    /// The link of the open batch.
    fn link(&mut self, r: &Record) -> Result<(), Break> {
        let broken = |reason: String| Break { seq: r.seq, reason };
        let Some(b) = self.open.take() else {
            return Err(broken(
                "a batch link with no members before it (they were deleted or moved)".into(),
            ));
        };
        let Some(link) = r.detail.as_deref().and_then(detail::parse_batch_link) else {
            return Err(broken(
                "a batch link whose detail does not name its members (edited)".into(),
            ));
        };
        if self.last_seq != Some(r.seq) {
            return Err(broken("a batch link not at its last member's seq".into()));
        }
        if link.records != b.index {
            return Err(broken(format!(
                "the link names {} members but {} precede it (a member was deleted or added)",
                link.records, b.index
            )));
        }
        if link.last_hash != b.running {
            return Err(broken(format!(
                "the link names {} as its last member's hash, but that member hashes to {} \
                 (a member was edited or moved)",
                link.last_hash, b.running
            )));
        }
        if !b.partial && r.prev_hash != self.head() {
            return Err(prev_mismatch(r));
        }
        check_hash(r)?;
        self.expected_prev = Some(r.hash.clone());
        Ok(())
    }
}

fn prev_mismatch(r: &Record) -> Break {
    Break {
        seq: r.seq,
        reason: "prev_hash does not match the previous record's hash (a record before it was edited, deleted or moved)".into(),
    }
}

fn check_hash(r: &Record) -> Result<(), Break> {
    if r.compute_hash() != r.hash {
        return Err(Break {
            seq: r.seq,
            reason: "content does not match its hash (edited)".into(),
        });
    }
    Ok(())
}

/// What a batch's link record says of its batch ([`detail::batch_link`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLink {
    /// The batch's number in its ledger (how the ledger stores its members).
    pub batch_id: i64,
    /// How many members it has.
    pub records: i64,
    /// The last member's hash.
    pub last_hash: String,
    /// How many outbox rows the batch wrote.
    pub outbox_rows: i64,
    /// The outbox id its first row was given (the next after the previous batch's).
    pub outbox_first: i64,
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

    /// A batch's link record: which batch, how many members and the last one's hash, and the
    /// outbox ids its rows were given. One grammar, parsed back by [`parse_batch_link`];
    /// PostgreSQL's `claimgate_link` spells it too, and every `verify` checks the two agree.
    pub fn batch_link(link: &super::BatchLink) -> String {
        format!(
            "batch {}: {} records, last {}; {} outbox rows from id {}",
            link.batch_id, link.records, link.last_hash, link.outbox_rows, link.outbox_first
        )
    }

    /// The fields of a [`batch_link`] text, or `None` if it is not one.
    pub fn parse_batch_link(text: &str) -> Option<super::BatchLink> {
        let rest = text.strip_prefix("batch ")?;
        let (batch_id, rest) = rest.split_once(": ")?;
        let (records, rest) = rest.split_once(" records, last ")?;
        let (last_hash, rest) = rest.split_once("; ")?;
        let (outbox_rows, outbox_first) = rest.split_once(" outbox rows from id ")?;
        let int = |s: &str| -> Option<i64> {
            // Only the spelling `batch_link` writes: no sign, no leading zeros, no spaces.
            let canonical = s == "0" || (!s.starts_with('0') && !s.is_empty());
            if !canonical || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let link = super::BatchLink {
            batch_id: int(batch_id)?,
            records: int(records)?,
            last_hash: last_hash.to_owned(),
            outbox_rows: int(outbox_rows)?,
            outbox_first: int(outbox_first)?,
        };
        (batch_link(&link) == text).then_some(link)
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

    /// A held conflicting resubmission paid because a reviewer approved it (`claimgate dlq
    /// approve`): its `conflict` record, beside the `processed` one.
    pub fn conflict_paid_on_approval(other_key: &str, other_claimed_at: &str) -> String {
        format!(
            "{}; paid on approval after review",
            conflict(other_key, other_claimed_at)
        )
    }

    /// A reviewer's approval of a held conflicting resubmission: who (`by`) and why.
    pub fn conflict_approved(by: &str, reason: &str) -> String {
        format!("approved by {by}: {reason}")
    }

    /// A reviewer's rejection of a held conflicting resubmission: who (`by`) and why.
    pub fn conflict_rejected(by: &str, reason: &str) -> String {
        format!("rejected by {by}: {reason}; not paid")
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
            batch_index: None,
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
            (Kind::ConflictApproved, "conflict_approved"),
            (Kind::ConflictRejected, "conflict_rejected"),
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

    /// A chain of `singles` records sealed one by one, then one batch of `members` members per
    /// entry of `batches`, each linked after the head; seqs numbered through.
    fn mixed_chain(singles: i64, batches: &[i64]) -> Vec<Record> {
        let mut out = chain(singles);
        let mut head = out
            .last()
            .map_or(GENESIS_HASH.to_owned(), |r| r.hash.clone());
        let mut seq = singles;
        let mut outbox = 1;
        for (b, &n) in batches.iter().enumerate() {
            let mut members: Vec<Record> =
                (0..n).map(|i| record(0, &format!("B{b}-{i}"))).collect();
            let last_hash = seal_batch(&mut members);
            for m in &mut members {
                seq += 1;
                m.seq = seq;
            }
            let text = detail::batch_link(&BatchLink {
                batch_id: b as i64 + 1,
                records: n,
                last_hash,
                outbox_rows: n,
                outbox_first: outbox,
            });
            outbox += n;
            let link = Record::link(seq, text, "2026-11-29T00:00:01.000000Z", &head);
            head.clone_from(&link.hash);
            out.extend(members);
            out.push(link);
        }
        out
    }

    #[test]
    fn a_batch_link_detail_reads_back_and_nothing_but_its_own_spelling_does() {
        let link = BatchLink {
            batch_id: 7,
            records: 2,
            last_hash: "ab".repeat(32),
            outbox_rows: 0,
            outbox_first: 12,
        };
        let text = detail::batch_link(&link);
        assert_eq!(
            text,
            format!(
                "batch 7: 2 records, last {}; 0 outbox rows from id 12",
                "ab".repeat(32)
            )
        );
        assert_eq!(detail::parse_batch_link(&text), Some(link));
        for other in [
            "batch 7: 2 records",
            "batch 07: 2 records, last x; 0 outbox rows from id 12",
            "batch 7: +2 records, last x; 0 outbox rows from id 12",
            "batch 7: 2 records, last x; 0 outbox rows from id 12 ",
            "batch -7: 2 records, last x; 0 outbox rows from id 12",
        ] {
            assert_eq!(detail::parse_batch_link(other), None, "{other:?}");
        }
    }

    #[test]
    fn records_sealed_one_by_one_then_batches_verify_as_one_chain() {
        let c = mixed_chain(3, &[2, 1, 4]);
        assert_eq!(c.len(), 3 + 3 + 2 + 5);
        assert_eq!(verify_chain(&c), Ok(10), "links are seals, not records");
        assert_eq!(verify_chain(&mixed_chain(0, &[1])), Ok(1));
        // A link carries its last member's seq: every seq names one record.
        assert_eq!(
            c.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 5, 6, 6, 7, 8, 9, 10, 10]
        );
        // Each seq is its place in the chain; each member hashes with its place in the batch.
        assert_eq!(
            c.iter().map(|r| r.batch_index).collect::<Vec<_>>()[3..8],
            [Some(1), Some(2), None, Some(1), None]
        );
    }

    #[test]
    fn every_edit_deletion_move_or_cut_inside_a_batch_is_caught_at_the_right_record() {
        let c = mixed_chain(2, &[3, 3]);
        // seqs: 1 2 | 3 4 5 link(5) | 6 7 8 link(8)
        let broken = |f: &dyn Fn(&mut Vec<Record>)| {
            let mut t = c.clone();
            f(&mut t);
            verify_chain(&t).unwrap_err()
        };
        let edited = broken(&|t| t[3].amount_cents = Some(1));
        assert_eq!((edited.seq, edited.reason.contains("edited")), (4, true));
        assert_eq!(
            broken(&|t| {
                t.remove(3);
            })
            .seq,
            5,
            "a member deleted"
        );
        let swapped = broken(&|t| {
            t.swap(2, 3);
            (t[2].seq, t[3].seq) = (3, 4);
        });
        assert_eq!(
            swapped.seq, 3,
            "two members swapped, each keeping its place's seq"
        );
        assert_eq!(
            broken(&|t| {
                t.remove(5);
            })
            .seq,
            6,
            "a link deleted"
        );
        // A member renumbered in the chain: seqs are pinned by the link's own seq.
        assert_eq!(broken(&|t| t[4].seq = 4).seq, 4);
        // The whole last batch edited and its members re-sealed: its link names the old hash.
        let resealed = broken(&|t| {
            t[6].amount_cents = Some(1);
            let last = seal_batch(&mut t[6..9]);
            assert_ne!(last, c[8].hash);
        });
        assert_eq!(resealed.seq, 8);
        // ...and the link re-sealed too, after the same head: only an anchor can tell.
        let mut all = c.clone();
        all[6].amount_cents = Some(1);
        let last_hash = seal_batch(&mut all[6..9]);
        let mut link = detail::parse_batch_link(all[9].detail.as_deref().unwrap()).unwrap();
        link.last_hash = last_hash;
        let head = all[9].prev_hash.clone();
        all[9] = Record::link(8, detail::batch_link(&link), &all[9].recorded_at, &head);
        assert_eq!(verify_chain(&all), Ok(8));
        // A batch cut short: members with no link after them.
        let mut cut = c.clone();
        cut.truncate(8);
        let end = verify_chain(&cut).unwrap_err();
        assert_eq!((end.seq, end.reason.contains("no link")), (6, true));
        // A link claiming a member more or less than precede it.
        let miscounted = broken(&|t| {
            let mut l = detail::parse_batch_link(t[5].detail.as_deref().unwrap()).unwrap();
            l.records = 2;
            let head = t[5].prev_hash.clone();
            t[5] = Record::link(5, detail::batch_link(&l), "T", &head);
        });
        assert_eq!(miscounted.seq, 5);
        // A record sealed one by one placed inside a batch.
        let mut inside = c.clone();
        inside.insert(3, inside[1].clone());
        assert!(verify_chain(&inside).is_err());
        // A link or checkpoint pretending to be a member.
        assert_eq!(broken(&|t| t[5].batch_index = Some(4)).seq, 5);
        // A link moved off its last member's seq.
        assert_eq!(broken(&|t| t[5].seq = 6).seq, 6);
    }

    #[test]
    fn an_export_starting_inside_a_batch_verifies_from_the_member_before_it() {
        let c = mixed_chain(1, &[4, 2]);
        // seqs: 1 | 2 3 4 5 link(5) | 6 7 link(7); start at seq 4 (member 3).
        let mut v = Verifier::continuing_from(&c[2].hash);
        for r in &c[3..] {
            v.push(r).expect("the rest links on");
        }
        assert_eq!((v.count, v.head()), (4, c[8].hash.as_str()));
        let mut wrong = Verifier::continuing_from(&c[1].hash);
        assert_eq!(wrong.push(&c[3]).map_err(|b| b.seq), Err(4));
        // Starting at a batch's first member: the link must join the hash continued from.
        let mut at_start = Verifier::continuing_from(&c[5].hash);
        for r in &c[6..] {
            at_start.push(r).unwrap();
        }
        let mut off = Verifier::continuing_from(&c[4].hash);
        off.push(&c[6]).unwrap();
        off.push(&c[7]).unwrap();
        assert_eq!(off.push(&c[8]).map_err(|b| b.seq), Err(7));
    }

    /// Batch members and a link pinned by vectors computed outside Rust (Python's `hashlib`
    /// over the canonical JSON), as `the_hash_matches_vectors_computed_outside_rust` pins
    /// records sealed one by one: a member hashes with its place in the batch as `seq`, the
    /// first from the genesis hash; the link is sealed after the head like any record.
    #[test]
    fn batch_hashes_match_vectors_computed_outside_rust() {
        let first = Record {
            seq: 41,
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
            batch_index: None,
        };
        let second = Record {
            seq: 42,
            kind: Kind::Duplicate,
            amount_cents: None,
            stream_entry_id: Some("1719824400001-0".into()),
            delivery_count: Some(2),
            detail: Some("first claimed at 2026-07-01T09:00:00.123456Z".into()),
            ..first.clone()
        };
        let mut members = vec![first, second];
        let last = seal_batch(&mut members);
        assert_eq!(
            members[0].hash,
            "15bd8c861ce87dd9fc466f1d292cd5adc06004662b673fc1b8c226a6c59690e4"
        );
        assert_eq!(
            last,
            "f7f64fb773db0332d34d862d371fa4a4866801ba66bb68b5bbd28c9fa7669448"
        );
        assert_eq!((members[0].seq, members[1].batch_index), (41, Some(2)));
        let text = detail::batch_link(&BatchLink {
            batch_id: 7,
            records: 2,
            last_hash: last,
            outbox_rows: 1,
            outbox_first: 12,
        });
        let link = Record::link(42, text, "2026-07-01T09:00:00.200000Z", &"11".repeat(32));
        let mut canonical = Vec::new();
        link.canonical_json(&mut canonical);
        assert_eq!(
            String::from_utf8(canonical).unwrap(),
            concat!(
                r#"{"seq":42,"kind":"batch","idempotency_key":null,"award_id":null,"#,
                r#""amount_cents":null,"stream_entry_id":null,"consumer":null,"#,
                r#""delivery_count":null,"detail":"batch 7: 2 records, last "#,
                r#"f7f64fb773db0332d34d862d371fa4a4866801ba66bb68b5bbd28c9fa7669448; "#,
                r#"1 outbox rows from id 12","recorded_at":"2026-07-01T09:00:00.200000Z","#,
                r#""prev_hash":"1111111111111111111111111111111111111111111111111111111111111111","#,
                r#""hash":""}"#
            )
        );
        assert_eq!(
            link.hash,
            "5a90d80094fdf291f8fca75b45f27928fc67b61a5a70686eecff0d6b1033ca6e"
        );
        // A member's JSON says where it sits in its batch; a record sealed alone's does not.
        let json = serde_json::to_string(&members[1]).unwrap();
        assert!(json.ends_with(r#","batch_index":2}"#), "{json}");
        assert!(!serde_json::to_string(&link)
            .unwrap()
            .contains("batch_index"));
    }

    /// serde_json's spelling of `r` with `hash` empty and, for a batch member, `seq` its place
    /// in the batch: the definition `canonical_json` keeps.
    fn serde_canonical(r: &Record) -> Vec<u8> {
        let mut content = r.clone();
        content.hash = String::new();
        if let Some(i) = content.batch_index.take() {
            content.seq = i;
        }
        serde_json::to_vec(&content).unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]
        /// Over arbitrary text (control characters, quotes, backslashes, non-ASCII) and numbers,
        /// the hand-written canonical JSON is byte for byte serde_json's.
        #[test]
        fn the_canonical_json_is_exactly_serde_jsons(
            seq in proptest::num::i64::ANY,
            kind in 0usize..11,
            texts in proptest::collection::vec(proptest::option::of("(?s).{0,40}"), 5),
            amount in proptest::option::of(proptest::num::i64::ANY),
            deliveries in proptest::option::of(proptest::num::i64::ANY),
            recorded_at in "(?s).{0,30}",
            prev_hash in "[0-9a-f\"\\\\\u{0}-\u{1f}]{0,64}",
            batch_index in proptest::option::of(1i64..1_000_000),
        ) {
            let kinds = [Kind::Processed, Kind::Duplicate, Kind::DeadLetter, Kind::Conflict,
                Kind::Checkpoint, Kind::Vanished, Kind::HoldAdded, Kind::HoldRemoved, Kind::Restored,
                Kind::ConflictApproved, Kind::ConflictRejected];
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
                batch_index,
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
            batch_index: None,
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
