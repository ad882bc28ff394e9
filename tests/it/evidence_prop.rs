//! The evidence check as a property, on the library level (a real SQLite ledger through
//! `claimgate::ledger`, no processes, so hundreds of histories run in seconds): random work,
//! signed anchors and signed retention purges, then at most one tampering. With the public key,
//! `audit verify --anchors` (here: the chain walk plus `EvidenceCheck`, what it runs) fails if
//! and only if the tampering changed something an anchor pins — a record at or before an
//! anchored seq — or left a checkpoint the key did not sign.

use crate::evidence::{attacker_hash, reseal_from};
use claimgate::config::{LedgerConfig, Synchronous};
use claimgate::domain::anchor::{sign_checkpoint_detail, Anchor, Anchored, EvidenceCheck};
use claimgate::domain::audit::{Kind, Record, Verifier};
use claimgate::domain::signing::SigningKey;
use claimgate::domain::submission::parse_payload;
use claimgate::ledger::{Backend, Item, Since};
use proptest::prelude::*;
use rusqlite::{params, Connection};

/// Every record counts as old enough to purge: time policy is not what this property is about.
const PURGEABLE_BEFORE: &str = "9999-12-31T00:00:00.000000Z";
const CUTOFF: &str = "9999-01-01T00:00:00.000000Z";
const NOW: &str = "2026-12-01T00:00:00.000000Z";

#[derive(Debug, Clone)]
enum Step {
    /// Record this many submissions; `resend` sends the batch's first one again.
    Work { n: usize, resend: bool },
    /// Take a signed anchor of the head.
    Anchor,
    /// Purge, signed, up to the record at this position among the live non-checkpoint ones.
    Purge(prop::sample::Index),
}

#[derive(Debug, Clone)]
enum Tamper {
    None,
    /// Change one live record's content and re-seal everything after it.
    Reseal(prop::sample::Index),
    /// Delete every record after this one.
    CutTail(prop::sample::Index),
    /// Delete the prefix up to this record behind a hand-made checkpoint, unsigned or signed
    /// by another key.
    ForgeHead(prop::sample::Index, bool),
    /// Change one anchor's record count after it was signed.
    EditAnchor(prop::sample::Index),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..5, any::<bool>()).prop_map(|(n, resend)| Step::Work { n, resend }),
        2 => Just(Step::Anchor),
        1 => any::<prop::sample::Index>().prop_map(Step::Purge),
    ]
}

fn tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        Just(Tamper::None),
        any::<prop::sample::Index>().prop_map(Tamper::Reseal),
        any::<prop::sample::Index>().prop_map(Tamper::CutTail),
        (any::<prop::sample::Index>(), any::<bool>()).prop_map(|(i, w)| Tamper::ForgeHead(i, w)),
        any::<prop::sample::Index>().prop_map(Tamper::EditAnchor),
    ]
}

/// One history: the ledger, its key, the anchors taken.
struct History {
    /// Holds the ledger file (removed on drop).
    _dir: tempfile::TempDir,
    /// The ledger file, for the tampering done with plain SQL.
    path: std::path::PathBuf,
    /// The ledger, opened through the one open step.
    ledger: Box<dyn Backend>,
    /// The operator's key: signs every anchor and every honest checkpoint.
    key: SigningKey,
    /// The anchors taken so far, as a file would hold them.
    anchors: Vec<Anchored>,
    /// The next submission number.
    next: usize,
}

impl History {
    fn new() -> History {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut cfg = LedgerConfig::new(&path);
        cfg.backend.synchronous = Synchronous::Normal;
        let ledger = claimgate::ledger::open(&cfg.into()).unwrap();
        History {
            _dir: dir,
            path,
            ledger,
            key: SigningKey::from_seed([42; 32]),
            anchors: Vec::new(),
            next: 0,
        }
    }

    fn records(&self) -> Vec<Record> {
        let mut out = Vec::new();
        self.ledger
            .for_each_record(&Since::All, &mut |r| {
                out.push(r);
                Ok(())
            })
            .unwrap();
        out
    }

    /// Live records that are not checkpoints: the ones work wrote.
    fn ordinary(&self) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.kind != Kind::Checkpoint)
            .collect()
    }

    fn work(&mut self, n: usize, resend: bool) {
        let mut payloads: Vec<String> = (self.next..self.next + n)
            .map(crate::support::submission)
            .collect();
        if resend {
            payloads.push(payloads[0].clone());
        }
        self.next += n;
        let subs: Vec<_> = payloads
            .iter()
            .map(|p| parse_payload(p.as_bytes(), crate::support::LIMITS).unwrap())
            .collect();
        let ids: Vec<String> = (0..subs.len())
            .map(|i| format!("{}-{i}", self.next))
            .collect();
        let items: Vec<Item<'_>> = subs
            .iter()
            .zip(&ids)
            .map(|(s, id)| Item::Submission {
                submission: s,
                entry_id: id,
                delivery_count: 1,
            })
            .collect();
        self.ledger
            .record(&items, "prop", "grants:submissions")
            .unwrap();
    }

    /// A signed anchor, as `ops::evidence::take` makes one.
    fn anchor(&mut self) {
        let mut v = Verifier::default();
        let records = self.records();
        for r in &records {
            v.push(r).unwrap();
        }
        let last = records.last();
        let mut anchor = Anchor {
            ledger_id: self.ledger.ledger_id().unwrap(),
            seq: last.map_or(0, |r| r.seq),
            hash: v.head().to_owned(),
            records: v.count,
            recorded_at: last.map(|r| r.recorded_at.clone()),
            at: NOW.into(),
            key_id: None,
            signature: None,
        };
        anchor.sign(&self.key);
        let line = self.anchors.len() + 1;
        self.anchors.push(Anchored { line, anchor });
    }

    /// A signed purge batch up to an ordinary record, as `ops::retention::purge` does it.
    fn purge(&mut self, at: &prop::sample::Index) {
        let ordinary = self.ordinary();
        if ordinary.is_empty() {
            return;
        }
        let hi = at.get(&ordinary);
        let first = self.records()[0].seq;
        let detail = sign_checkpoint_detail(
            "retention purge (property test)",
            hi.seq,
            &hi.hash,
            &self.key,
        );
        self.ledger
            .purge_batch(first, hi.seq, CUTOFF, &detail, NOW)
            .unwrap();
    }

    fn db(&self) -> Connection {
        Connection::open(&self.path).unwrap()
    }

    /// Applies `t`; returns whether it changed something anchored (or forged a checkpoint).
    /// With `near`, the record tampered with is one at or next to an anchored seq (where an
    /// off-by-one in the check would show), when there is one.
    fn tamper(&mut self, t: &Tamper, near: bool) -> bool {
        let all = self.ordinary();
        let near_anchor: Vec<Record> = all
            .iter()
            .filter(|r| {
                self.anchors
                    .iter()
                    .any(|a| (r.seq - a.anchor.seq).abs() <= 1)
            })
            .cloned()
            .collect();
        let ordinary = if near && !near_anchor.is_empty() {
            near_anchor
        } else {
            all
        };
        let anchored_max = self.anchors.iter().map(|a| a.anchor.seq).max().unwrap_or(0);
        match t {
            Tamper::None => false,
            Tamper::Reseal(i) if !ordinary.is_empty() => {
                let k = i.get(&ordinary).seq;
                let db = self.db();
                db.execute(
                    "UPDATE audit_log SET consumer = 'mallory' WHERE seq = ?1",
                    [k],
                )
                .unwrap();
                reseal_from(&db, k);
                k <= anchored_max
            }
            Tamper::CutTail(i) if !ordinary.is_empty() => {
                let k = i.get(&ordinary).seq;
                self.db()
                    .execute("DELETE FROM audit_log WHERE seq > ?1", [k])
                    .unwrap();
                anchored_max > k
            }
            Tamper::ForgeHead(i, wrong_key) if !ordinary.is_empty() => {
                let hi = i.get(&ordinary);
                let detail = "retention purge (forged)";
                let detail = if *wrong_key {
                    sign_checkpoint_detail(
                        detail,
                        hi.seq,
                        &hi.hash,
                        &SigningKey::from_seed([7; 32]),
                    )
                } else {
                    detail.to_owned()
                };
                let db = self.db();
                db.execute("DELETE FROM audit_log WHERE seq <= ?1", [hi.seq])
                    .unwrap();
                db.execute(
                    "INSERT INTO audit_log (seq, kind, detail, recorded_at, prev_hash, hash)
                     VALUES (?1, 'checkpoint', ?2, ?3, ?4, '')",
                    params![hi.seq, detail, NOW, hi.hash],
                )
                .unwrap();
                let hash = attacker_hash(&db, hi.seq, &hi.hash);
                db.execute(
                    "UPDATE audit_log SET hash = ?1 WHERE seq = ?2",
                    params![hash, hi.seq],
                )
                .unwrap();
                true
            }
            Tamper::EditAnchor(i) if !self.anchors.is_empty() => {
                let n = i.index(self.anchors.len());
                self.anchors[n].anchor.records += 1;
                true
            }
            _ => false,
        }
    }

    /// What `audit verify --anchors --public-key` decides: true when it would exit 1.
    fn verify_fails(&self, with_key: bool) -> bool {
        let public = self.key.public_key();
        let id = self.ledger.ledger_id().unwrap();
        let key = with_key.then_some(&public);
        let mut check = EvidenceCheck::new(&id, &self.anchors, key, PURGEABLE_BEFORE);
        let mut v = Verifier::default();
        for r in self.records() {
            if v.push(&r).is_err() {
                return true;
            }
            check.push(&r);
        }
        !check.finish().contradictions.is_empty()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn anchored_verify_fails_exactly_when_something_anchored_was_changed(
        steps in prop::collection::vec(step(), 1..14),
        t in tamper(),
        near in any::<bool>(),
    ) {
        let mut h = History::new();
        for s in &steps {
            match s {
                Step::Work { n, resend } => h.work(*n, *resend),
                Step::Anchor => h.anchor(),
                Step::Purge(i) => h.purge(i),
            }
            prop_assert!(!h.verify_fails(true), "an honest history verifies, after {s:?}");
        }
        // Without the key, neither a forged checkpoint (every record is old enough to have
        // been purged here) nor an anchor's signature can be told from the real thing: the
        // key is what catches those two.
        let needs_key = matches!(t, Tamper::ForgeHead(..) | Tamper::EditAnchor(_));
        let anchored_change = h.tamper(&t, near);
        prop_assert_eq!(h.verify_fails(true), anchored_change, "with the key, after {:?}", t);
        prop_assert_eq!(h.verify_fails(false), anchored_change && !needs_key, "without the key, after {:?}", t);
    }
}
