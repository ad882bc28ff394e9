//! Evidence that does not live in the ledger file: anchors, signed checkpoints, and the check
//! of a chain against both.
//!
//! The hash chain ([`crate::domain::audit`]) proves a ledger agrees with itself; someone who
//! can write the file can recompute every hash after an edit ("re-sealing") and it still
//! agrees. An **anchor** is one JSON line naming the chain's head at a moment — `seq`, `hash`,
//! the record count, when, and which ledger — kept somewhere the ledger's writer cannot reach.
//! Because each hash covers everything before it, an anchor pins the whole chain up to its
//! `seq`: a re-sealed edit at or before it changes the anchored hash, a cut tail removes the
//! anchored record. A retention purge legitimately removes old records; the checkpoint it
//! leaves at seq `c` continues from record `c`'s hash, so an anchor at `c` still checks against
//! the checkpoint's `prev_hash`, and one below `c` is *covered* — satisfiable only if the
//! checkpoint is valid: signed by the operator's key when a public key is given, and never
//! covering a record written inside the retention window.
//!
//! Signatures are Ed25519 ([`crate::domain::signing`]) over a canonical form that starts with a
//! label naming what is signed (`claimgate anchor v1`, `claimgate checkpoint v1`), so an
//! anchor's signature can never pass for a checkpoint's or the other way round.
//!
//! Pure: no clock, no files. Callers pass the ledger's id, the records and the time before
//! which a purge could have removed anything.

use crate::domain::audit::{Kind, Record, GENESIS_HASH};
use crate::domain::signing::{PublicKey, SigningKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What an anchor's signature is computed over, before its canonical JSON.
const ANCHOR_LABEL: &[u8] = b"claimgate anchor v1\n";
/// What a checkpoint's signature is computed over, before its canonical JSON.
const CHECKPOINT_LABEL: &[u8] = b"claimgate checkpoint v1\n";
/// Separates a checkpoint's detail from its signature: `<detail>; signed ed25519 <id> <sig>`.
const CHECKPOINT_SIGNATURE_MARK: &str = "; signed ed25519 ";

/// One anchor: the chain's head at a moment. Field order is the canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    /// The ledger's random identity (`Outbox::ledger_id`): an anchor of another ledger never
    /// passes for one of this ledger.
    pub ledger_id: String,
    /// The last record's seq (0 for an empty chain).
    pub seq: i64,
    /// The hash the next record links to: the last record's hash, or, when the last record is
    /// a leading checkpoint, the hash of the purged record it stands for (its `prev_hash`).
    /// Either way it is "what record `seq` hashed to", which a later purge never changes.
    pub hash: String,
    /// Records in the chain (informational: purges lower it).
    pub records: u64,
    /// When the anchored record was written (`None` for an empty chain; for a leading
    /// checkpoint, when its purge ran, which is later): a purge can remove the record only once
    /// that is older than the retention window.
    pub recorded_at: Option<String>,
    /// When the anchor was taken, in the ledger's time format.
    pub at: String,
    /// The id of the key that signed it ([`PublicKey::key_id`]), if signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Ed25519 signature (hex) over the canonical form of every field above, if signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl Anchor {
    /// The bytes a signature covers: the label, then the JSON of every field but `signature`.
    fn signed_bytes(&self) -> Vec<u8> {
        let mut unsigned = self.clone();
        unsigned.signature = None;
        let mut bytes = ANCHOR_LABEL.to_vec();
        bytes.extend(serde_json::to_vec(&unsigned).expect("an anchor serializes"));
        bytes
    }

    /// Signs the anchor with `key` (naming the key first, so its id is signed too).
    pub fn sign(&mut self, key: &SigningKey) {
        self.key_id = Some(key.public_key().key_id());
        self.signature = None;
        self.signature = Some(key.sign(&self.signed_bytes()));
    }

    /// Checks the signature against `key`: an unsigned anchor, one signed by another key, or a
    /// signature that does not verify is an error saying which.
    pub fn check_signature(&self, key: &PublicKey) -> Result<(), String> {
        let Some(sig) = &self.signature else {
            return Err("unsigned, but a public key was given".into());
        };
        let id = key.key_id();
        match &self.key_id {
            Some(k) if *k != id => Err(format!("signed by key {k}, not by {id}")),
            _ if !key.verifies(&self.signed_bytes(), sig) => {
                Err(format!("signature does not verify with key {id}"))
            }
            _ => Ok(()),
        }
    }

    /// The anchor as one JSON line, without the newline.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("an anchor serializes")
    }
}

/// The canonical bytes of a checkpoint's signature: its seq, the hash it continues from (the
/// last purged record's), and its detail — which names the cutoff, the purged range, the export
/// file and the export's SHA-256.
fn checkpoint_bytes(seq: i64, prev_hash: &str, detail: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Signed<'a> {
        seq: i64,
        prev_hash: &'a str,
        detail: &'a str,
    }
    let mut bytes = CHECKPOINT_LABEL.to_vec();
    bytes.extend(
        serde_json::to_vec(&Signed {
            seq,
            prev_hash,
            detail,
        })
        .expect("serializes"),
    );
    bytes
}

/// `detail` with a signature appended, for the checkpoint a purge batch leaves at `seq`
/// continuing from `prev_hash` (the hash of record `seq` before it is purged).
pub fn sign_checkpoint_detail(detail: &str, seq: i64, prev_hash: &str, key: &SigningKey) -> String {
    let sig = key.sign(&checkpoint_bytes(seq, prev_hash, detail));
    let id = key.public_key().key_id();
    format!("{detail}{CHECKPOINT_SIGNATURE_MARK}{id} {sig}")
}

/// Checks a checkpoint record's signature against `key`: unsigned, signed by another key, or
/// not verifying (its seq, `prev_hash` or detail changed since it was signed) is an error.
pub fn check_checkpoint(r: &Record, key: &PublicKey) -> Result<(), String> {
    assert_eq!(
        r.kind,
        Kind::Checkpoint,
        "only checkpoints carry signatures"
    );
    let detail = r.detail.as_deref().unwrap_or("");
    let (text, Some((signer, sig))) = checkpoint_signature(detail) else {
        return Err("unsigned, but a public key was given".into());
    };
    let id = key.key_id();
    if signer != id {
        return Err(format!("signed by key {signer}, not by {id}"));
    }
    if !key.verifies(&checkpoint_bytes(r.seq, &r.prev_hash, text), sig) {
        return Err(format!("signature does not verify with key {id}"));
    }
    Ok(())
}

/// A checkpoint's detail split into the text that was signed and, if it is signed, the signing
/// key's id and the signature (hex): `<text>; signed ed25519 <key id> <signature>`. Whether the
/// signature verifies is [`check_checkpoint`]'s question; this only reads what the detail says.
pub fn checkpoint_signature(detail: &str) -> (&str, Option<(&str, &str)>) {
    match detail.rsplit_once(CHECKPOINT_SIGNATURE_MARK) {
        Some((text, signed)) => (text, Some(signed.split_once(' ').unwrap_or((signed, "")))),
        None => (detail, None),
    }
}

/// One anchor read from a file, with where it was.
#[derive(Debug, Clone)]
pub struct Anchored {
    /// Its line number in the anchors file (1-based).
    pub line: usize,
    /// The anchor.
    pub anchor: Anchor,
}

/// Something the chain contradicts, or that is wrong with the evidence itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contradiction {
    /// The anchor's line number, or `None` for a checkpoint's own failure.
    pub line: Option<usize>,
    /// The anchored seq, or the checkpoint's seq.
    pub seq: i64,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Contradiction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(
                f,
                "anchor on line {line} (seq {}): {}",
                self.seq, self.reason
            ),
            None => write!(f, "checkpoint at seq {}: {}", self.seq, self.reason),
        }
    }
}

/// What a finished check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Anchors whose record was found with the anchored hash.
    pub matched: usize,
    /// Anchors whose record a valid retention checkpoint covers.
    pub covered: usize,
    /// Checkpoints whose signature verified.
    pub checkpoints_signed: usize,
    /// Everything that failed, in the order found.
    pub contradictions: Vec<Contradiction>,
}

/// Checks one ledger's records, in seq order, against anchors and (with a public key) every
/// checkpoint's signature, in constant memory beyond the anchors themselves. Feed it the same
/// records the chain [`Verifier`](crate::domain::audit::Verifier) checks; it assumes the chain
/// itself verifies and only adds what the chain alone cannot show.
#[derive(Debug)]
pub struct EvidenceCheck<'a> {
    /// Indexes into `anchors` by anchored seq, for anchors still to be settled.
    open: BTreeMap<i64, Vec<usize>>,
    /// The anchors.
    anchors: &'a [Anchored],
    /// With a key: checkpoints and anchors must be signed by it.
    key: Option<&'a PublicKey>,
    /// Records written before this (ledger time) may have been purged by now; an anchored
    /// record written at or after it cannot have been, whatever a checkpoint says.
    purgeable_before: &'a str,
    /// Whether any record has been seen (a checkpoint leads only as the first).
    seen_any: bool,
    /// The last seq seen.
    last_seq: i64,
    /// What has been found so far.
    findings: Findings,
}

impl<'a> EvidenceCheck<'a> {
    /// A check of the ledger `ledger_id` against `anchors`; signatures are checked with `key`.
    /// Anchors of another ledger, and (with a key) unsigned or wrongly signed ones, fail here.
    pub fn new(
        ledger_id: &str,
        anchors: &'a [Anchored],
        key: Option<&'a PublicKey>,
        purgeable_before: &'a str,
    ) -> Self {
        let mut check = EvidenceCheck {
            open: BTreeMap::new(),
            anchors,
            key,
            purgeable_before,
            seen_any: false,
            last_seq: 0,
            findings: Findings::default(),
        };
        for (i, a) in anchors.iter().enumerate() {
            let own = if a.anchor.ledger_id != ledger_id {
                Some(format!(
                    "taken of ledger {}, but this ledger is {ledger_id}",
                    a.anchor.ledger_id
                ))
            } else {
                key.and_then(|k| a.anchor.check_signature(k).err())
            };
            match own {
                Some(reason) => check.fail(Some(a.line), a.anchor.seq, reason),
                None => check.open.entry(a.anchor.seq).or_default().push(i),
            }
        }
        check
    }

    fn fail(&mut self, line: Option<usize>, seq: i64, reason: String) {
        self.findings
            .contradictions
            .push(Contradiction { line, seq, reason });
    }

    /// The next record, in seq order.
    pub fn push(&mut self, r: &Record) {
        let leading = !self.seen_any && r.kind == Kind::Checkpoint;
        self.seen_any = true;
        self.last_seq = r.seq;
        if r.kind == Kind::Checkpoint {
            let valid = match self.key.map(|k| check_checkpoint(r, k)) {
                Some(Err(reason)) => {
                    self.fail(None, r.seq, reason);
                    false
                }
                Some(Ok(())) => {
                    self.findings.checkpoints_signed += 1;
                    true
                }
                None => true,
            };
            if leading {
                self.settle_covered(r.seq, valid);
            }
        }
        // A batch member's hash is its batch's business; what seq `n` hashed to, where `n`
        // ends a batch, is the hash of the batch's link, which follows at the same seq. So a
        // member settles no anchor at its own seq, only those it has passed.
        if r.batch_index.is_some() {
            self.skipped_below(r.seq);
            return;
        }
        // What record `seq` hashed to: a leading checkpoint stands for the purged record whose
        // hash it continues from.
        let hash = if leading { &r.prev_hash } else { &r.hash };
        let anchors = self.anchors;
        for i in self.open.remove(&r.seq).unwrap_or_default() {
            let a = &anchors[i];
            if a.anchor.hash == *hash {
                self.findings.matched += 1;
            } else {
                let reason = format!(
                    "the record at seq {} hashes to {hash}, not the anchored {} (edited or re-sealed since)",
                    r.seq, a.anchor.hash
                );
                self.fail(Some(a.line), r.seq, reason);
            }
        }
        self.skipped_below(r.seq);
    }

    /// Anchored seqs below `seq` not settled yet: records gone from the middle of the chain.
    fn skipped_below(&mut self, seq: i64) {
        let skipped: Vec<i64> = self.open.range(..seq).map(|(s, _)| *s).collect();
        for gone in skipped {
            self.missing(
                gone,
                &format!("no record at seq {gone} (the chain jumps past it to {seq})"),
            );
        }
    }

    /// Anchors below a leading checkpoint at `seq`: covered if it is `valid` and they are old
    /// enough to have been purged.
    fn settle_covered(&mut self, seq: i64, valid: bool) {
        let below: Vec<i64> = self.open.range(..seq).map(|(s, _)| *s).collect();
        let anchors = self.anchors;
        let purgeable_before = self.purgeable_before;
        for s in below {
            for i in self.open.remove(&s).unwrap_or_default() {
                let a = &anchors[i].anchor;
                let line = anchors[i].line;
                if s == 0 {
                    self.genesis(line, a);
                } else if !valid {
                    let reason = format!(
                        "the record is gone, and the only checkpoint covering it (seq {seq}) is not validly signed"
                    );
                    self.fail(Some(line), s, reason);
                } else if a
                    .recorded_at
                    .as_deref()
                    .is_none_or(|t| t >= purgeable_before)
                {
                    let reason = format!(
                        "the record is gone behind the checkpoint at seq {seq}, but it was written at {}, \
                         inside the retention window: no retention purge could have removed it",
                        a.recorded_at.as_deref().unwrap_or("an unknown time")
                    );
                    self.fail(Some(line), s, reason);
                } else {
                    self.findings.covered += 1;
                }
            }
        }
    }

    /// An anchor of the empty chain: true of every chain, if its hash is the genesis hash.
    fn genesis(&mut self, line: usize, a: &Anchor) {
        if a.hash == GENESIS_HASH {
            self.findings.matched += 1;
        } else {
            let reason = format!(
                "an anchor at seq 0 must carry the genesis hash, not {}",
                a.hash
            );
            self.fail(Some(line), 0, reason);
        }
    }

    /// Fails every open anchor at `seq` as missing, for `why`.
    fn missing(&mut self, seq: i64, why: &str) {
        for i in self.open.remove(&seq).unwrap_or_default() {
            let line = self.anchors[i].line;
            if seq == 0 {
                let a = self.anchors[i].anchor.clone();
                self.genesis(line, &a);
                continue;
            }
            let reason =
                format!("the anchored record is missing: {why}, and no checkpoint covers it");
            self.fail(Some(line), seq, reason);
        }
    }

    /// Settles what is left (anchors past the chain's end: a cut tail) and returns the findings.
    pub fn finish(mut self) -> Findings {
        let rest: Vec<i64> = self.open.keys().copied().collect();
        let end = if self.seen_any {
            format!("the chain ends at seq {}", self.last_seq)
        } else {
            "the chain is empty".to_owned()
        };
        for seq in rest {
            self.missing(seq, &end);
        }
        self.findings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "2020-01-01T00:00:00.000000Z";
    const NOW: &str = "2026-07-01T00:00:00.000000Z";
    const WINDOW: &str = "2023-07-01T00:00:00.000000Z";

    fn chain(n: i64, at: &str) -> Vec<Record> {
        let mut prev = GENESIS_HASH.to_owned();
        (1..=n)
            .map(|seq| {
                let mut r = Record {
                    seq,
                    kind: Kind::Processed,
                    idempotency_key: None,
                    award_id: Some(format!("A-{seq}")),
                    amount_cents: Some(100),
                    stream_entry_id: Some(format!("{seq}-0")),
                    consumer: Some("c".into()),
                    delivery_count: Some(1),
                    detail: None,
                    recorded_at: at.into(),
                    prev_hash: String::new(),
                    hash: String::new(),
                    batch_index: None,
                };
                r.seal(&prev);
                prev = r.hash.clone();
                r
            })
            .collect()
    }

    fn anchor_at(records: &[Record], seq: i64, line: usize) -> Anchored {
        let r = records.iter().find(|r| r.seq == seq).unwrap();
        Anchored {
            line,
            anchor: Anchor {
                ledger_id: "L".into(),
                seq,
                hash: r.hash.clone(),
                records: records.len() as u64,
                recorded_at: Some(r.recorded_at.clone()),
                at: NOW.into(),
                key_id: None,
                signature: None,
            },
        }
    }

    fn run(records: &[Record], anchors: &[Anchored], key: Option<&PublicKey>) -> Findings {
        let mut check = EvidenceCheck::new("L", anchors, key, WINDOW);
        for r in records {
            check.push(r);
        }
        check.finish()
    }

    /// Records 1..=`seq` replaced by a checkpoint at `seq`, as a purge leaves them.
    fn purged(records: &[Record], seq: i64, key: Option<&SigningKey>) -> Vec<Record> {
        let last = &records[seq as usize - 1];
        let detail = "retention purge of records before 2021-01-01T00:00:00.000000Z";
        let mut cp = Record {
            kind: Kind::Checkpoint,
            detail: Some(match key {
                Some(k) => sign_checkpoint_detail(detail, seq, &last.hash, k),
                None => detail.to_owned(),
            }),
            ..last.clone()
        };
        cp.seal(&last.hash);
        let mut out = vec![cp];
        out.extend_from_slice(&records[seq as usize..]);
        out
    }

    #[test]
    fn each_signed_form_starts_with_its_own_label_so_neither_passes_for_the_other() {
        // The labels are part of every signature ever made: spelled out here, not taken from
        // the constants, so a form signed under the wrong label (or a renamed one, which would
        // invalidate every signature already in a ledger) fails.
        let anchor = Anchor {
            ledger_id: "L".into(),
            seq: 7,
            hash: "ab".repeat(32),
            records: 7,
            recorded_at: None,
            at: "2026-07-01T09:00:00.000000Z".into(),
            key_id: None,
            signature: None,
        };
        assert!(anchor
            .signed_bytes()
            .starts_with(b"claimgate anchor v1\n{\"ledger_id\":\"L\","));
        assert!(checkpoint_bytes(7, &"ab".repeat(32), "retention purge")
            .starts_with(b"claimgate checkpoint v1\n{\"seq\":7,"));
    }

    /// Two sealed records, then batches of 3 and 2 members, each closed by its link at its
    /// last member's seq: seqs 1 2 | 3 4 5 (5) | 6 7 (7).
    fn batched(at: &str) -> Vec<Record> {
        use crate::domain::audit::{detail, seal_batch, BatchLink};
        let mut out = chain(2, at);
        let mut head = out[1].hash.clone();
        for (b, n) in [(1, 3), (2, 2)] {
            let first = out.iter().filter(|r| r.kind != Kind::Batch).count() as i64 + 1;
            let mut members: Vec<Record> = chain(n, at);
            let last_hash = seal_batch(&mut members);
            for (i, m) in members.iter_mut().enumerate() {
                m.seq = first + i as i64;
            }
            let last = first + n - 1;
            let text = detail::batch_link(&BatchLink {
                batch_id: b,
                records: n,
                last_hash,
                outbox_rows: 0,
                outbox_first: 1,
            });
            let link = Record::link(last, text, at, &head);
            head.clone_from(&link.hash);
            out.extend(members);
            out.push(link);
        }
        assert_eq!(crate::domain::audit::verify_chain(&out), Ok(7));
        out
    }

    #[test]
    fn an_anchor_at_the_end_of_a_batch_pins_its_link_and_a_members_own_hash_does_not_pass() {
        // What seq 5 hashed to is the link closing the batch there: an anchor taken of the
        // head holds that hash. An anchor claiming the member's own in-batch hash at seq 5
        // contradicts the chain, and one past the end is missing.
        let records = batched(NOW);
        let link = |seq: i64| {
            records
                .iter()
                .find(|r| r.seq == seq && r.kind == Kind::Batch)
                .unwrap()
                .clone()
        };
        let at = |seq: i64, hash: &str, line: usize| {
            let mut a = anchor_at(&records, seq.min(7), line);
            a.anchor.seq = seq;
            a.anchor.hash = hash.to_owned();
            a
        };
        let member5 = records.iter().find(|r| r.seq == 5).unwrap().hash.clone();
        let anchors = [
            at(5, &link(5).hash, 1),
            at(7, &link(7).hash, 2),
            at(2, &records[1].hash, 3),
            at(5, &member5, 4),
            at(8, &link(7).hash, 5),
        ];
        let f = run(&records, &anchors, None);
        assert_eq!(f.matched, 3);
        let lines: Vec<Option<usize>> = f.contradictions.iter().map(|c| c.line).collect();
        assert_eq!(lines, [Some(4), Some(5)], "{:?}", f.contradictions);
    }

    #[test]
    fn an_anchor_of_the_first_record_matches_that_record_not_the_hash_it_continues_from() {
        // Only a leading *checkpoint* stands for the purged record it continues from; an
        // ordinary first record is checked against its own hash.
        let records = chain(3, NOW);
        let f = run(&records, &[anchor_at(&records, 1, 1)], None);
        assert_eq!((f.matched, f.contradictions), (1, vec![]));
    }

    #[test]
    fn an_anchor_signed_by_another_key_names_the_key_that_signed_it() {
        let (signer, other) = (
            SigningKey::from_seed([1; 32]),
            SigningKey::from_seed([2; 32]),
        );
        let mut anchor = anchor_at(&chain(1, NOW), 1, 1).anchor;
        anchor.sign(&signer);
        let err = anchor.check_signature(&other.public_key()).unwrap_err();
        let named = format!("signed by key {}", signer.public_key().key_id());
        assert!(err.contains(&named), "{err}");
    }

    #[test]
    fn an_anchor_line_is_one_line_that_reads_back_as_the_same_anchor() {
        let mut anchor = anchor_at(&chain(2, NOW), 2, 1).anchor;
        anchor.sign(&SigningKey::from_seed([1; 32]));
        let line = anchor.to_line();
        assert!(!line.contains('\n'), "{line}");
        let back: Anchor = serde_json::from_str(&line).expect("an anchor line parses");
        assert_eq!(back, anchor);
    }

    #[test]
    fn anchors_of_an_untouched_chain_all_match_and_a_signed_one_verifies() {
        let key = SigningKey::from_seed([1; 32]);
        let records = chain(6, NOW);
        let mut signed = anchor_at(&records, 6, 2);
        signed.anchor.sign(&key);
        let anchors = [anchor_at(&records, 3, 1), signed];
        let f = run(&records, &anchors, None);
        assert_eq!((f.matched, f.contradictions.len()), (2, 0));
        let with_key = run(&records, &anchors[1..], Some(&key.public_key()));
        assert_eq!(with_key.contradictions, vec![]);
        let unsigned_with_key = run(&records, &anchors[..1], Some(&key.public_key()));
        assert!(unsigned_with_key.contradictions[0]
            .reason
            .contains("unsigned"));
    }

    #[test]
    fn a_resealed_edit_and_a_cut_tail_each_name_the_anchor() {
        let records = chain(6, NOW);
        let anchors = [anchor_at(&records, 2, 1), anchor_at(&records, 5, 2)];
        let mut resealed = records.clone();
        resealed[3].amount_cents = Some(1_000_000);
        let mut prev = resealed[2].hash.clone();
        for r in &mut resealed[3..] {
            r.seal(&prev);
            prev = r.hash.clone();
        }
        let f = run(&resealed, &anchors, None);
        assert_eq!(f.matched, 1);
        assert_eq!(f.contradictions.len(), 1);
        assert_eq!(
            (f.contradictions[0].line, f.contradictions[0].seq),
            (Some(2), 5)
        );

        let f = run(&records[..4], &anchors, None);
        assert_eq!(
            f.contradictions[0].to_string().split(':').next(),
            Some("anchor on line 2 (seq 5)")
        );
        assert!(f.contradictions[0].reason.contains("chain ends at seq 4"));
    }

    #[test]
    fn a_signed_purge_keeps_old_anchors_and_a_forged_one_is_caught() {
        let key = SigningKey::from_seed([2; 32]);
        let old = chain(6, OLD);
        let mut anchors = [
            anchor_at(&old, 2, 1),
            anchor_at(&old, 4, 2),
            anchor_at(&old, 6, 3),
        ];
        for a in &mut anchors {
            a.anchor.sign(&key);
        }
        let pk = key.public_key();

        let signed = purged(&old, 4, Some(&key));
        let f = run(&signed, &anchors, Some(&pk));
        assert_eq!(f.contradictions, vec![]);
        assert_eq!((f.covered, f.matched, f.checkpoints_signed), (1, 2, 1));

        let forged = purged(&old, 4, None);
        assert_eq!(
            run(&forged, &anchors, None).contradictions,
            vec![],
            "no key: not caught"
        );
        let f = run(&forged, &anchors, Some(&pk));
        assert_eq!(
            f.contradictions[0].line, None,
            "the checkpoint itself is named"
        );
        assert!(f.contradictions[1].reason.contains("not validly signed"));

        // Re-pointing a signed checkpoint at another export (its digest is in the detail)
        // and re-sealing it breaks the signature.
        let mut edited = signed.clone();
        let detail = edited[0].detail.take().unwrap();
        edited[0].detail = Some(detail.replacen("2021", "2022", 1));
        edited[0].hash = edited[0].compute_hash();
        let f = run(&edited, &anchors, Some(&pk));
        assert!(
            f.contradictions[0].reason.contains("does not verify"),
            "{f:?}"
        );

        let other = SigningKey::from_seed([3; 32]);
        let wrong = purged(&old, 4, Some(&other));
        assert!(run(&wrong, &anchors, Some(&pk)).contradictions[0]
            .reason
            .contains("signed by key"));
    }

    #[test]
    fn a_checkpoint_cannot_cover_a_record_written_inside_the_retention_window() {
        let key = SigningKey::from_seed([4; 32]);
        let recent = chain(5, NOW);
        let anchors = [anchor_at(&recent, 2, 7)];
        let f = run(&purged(&recent, 3, Some(&key)), &anchors, None);
        assert_eq!(f.contradictions.len(), 1);
        assert!(f.contradictions[0]
            .reason
            .contains("inside the retention window"));
    }

    #[test]
    fn an_anchor_of_another_ledger_or_with_a_tampered_signature_fails() {
        let key = SigningKey::from_seed([5; 32]);
        let records = chain(3, NOW);
        let mut a = anchor_at(&records, 3, 1);
        a.anchor.ledger_id = "M".into();
        assert!(run(&records, &[a], None).contradictions[0]
            .reason
            .contains("taken of ledger M"));
        let mut b = anchor_at(&records, 3, 1);
        b.anchor.sign(&key);
        b.anchor.records += 1;
        assert!(
            run(&records, &[b], Some(&key.public_key())).contradictions[0]
                .reason
                .contains("does not verify")
        );
    }

    #[test]
    fn an_empty_chain_anchor_holds_forever_and_a_missing_middle_record_is_named() {
        let records = chain(4, NOW);
        let genesis = Anchored {
            line: 1,
            anchor: Anchor {
                seq: 0,
                hash: GENESIS_HASH.into(),
                recorded_at: None,
                ..anchor_at(&records, 1, 1).anchor
            },
        };
        let mut gapped = records.clone();
        gapped.remove(1);
        let f = run(&gapped, &[genesis, anchor_at(&records, 2, 2)], None);
        assert_eq!(f.matched, 1);
        assert_eq!(f.contradictions.len(), 1);
        assert!(f.contradictions[0].reason.contains("jumps past it to 3"));
    }
}
