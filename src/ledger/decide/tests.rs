//! The decision procedure alone, over a model of what a ledger holds: for any batch of items
//! against any committed state, each outcome is what the contract says in so many words
//! (`spec` below, written as a table of cases, not as the procedure's steps), and each item's
//! records are exactly the ones its outcome names.

use super::*;
use crate::domain::key::{derive_idempotency_key, IdempotencyKey};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// A ledger's state as [`Facts`] sees it: claims in claim-id order, and tombstones.
#[derive(Default, Clone)]
struct Model {
    /// (key, instant, award, claimed_at), in claim-id order.
    claims: Vec<(IdempotencyKey, String, String, String)>,
    tombstones: HashMap<IdempotencyKey, Purged>,
    /// The batch's time, which a new claim is made at.
    now: String,
    /// Keys `claim` claimed, to prove none is claimed twice.
    claimed_now: Vec<IdempotencyKey>,
}

impl Model {
    fn claim_of(&self, key: &IdempotencyKey) -> Option<&(IdempotencyKey, String, String, String)> {
        self.claims.iter().find(|c| c.0 == *key)
    }
}

impl<'a> Facts<'a> for Model {
    fn tombstone(&mut self, s: &Submission) -> Result<Option<Purged>> {
        Ok(self.tombstones.get(&s.key).cloned())
    }

    fn claimed_at(&mut self, s: &Submission) -> Result<Option<String>> {
        Ok(self.claim_of(&s.key).map(|c| c.3.clone()))
    }

    fn earliest_other(&mut self, s: &Submission) -> Result<Option<Other>> {
        Ok(self
            .claims
            .iter()
            .find(|c| c.1 == s.submission_instant && c.2 == s.award_id && c.0 != s.key)
            .map(|c| Other {
                key_hex: c.0.to_hex(),
                claimed_at: c.3.clone(),
            }))
    }

    fn claim(&mut self, d: &Delivered<'a>) -> Result<Option<String>> {
        let s = d.submission;
        assert!(
            !self.tombstones.contains_key(&s.key),
            "a tombstoned key is never offered for a claim"
        );
        if let Some(c) = self.claim_of(&s.key) {
            return Ok(Some(c.3.clone()));
        }
        self.claims.push((
            s.key,
            s.submission_instant.clone(),
            s.award_id.clone(),
            self.now.clone(),
        ));
        self.claimed_now.push(s.key);
        Ok(None)
    }
}

/// What the contract says an item's outcome is, given the state before it, as a table of
/// cases (points 3 and 6, `--on-conflict`), and whether the item's dead-letter row is new.
fn spec(model: &Model, item: &Item<'_>, policy: OnConflict, first_dead: bool) -> Outcome {
    let d = match item {
        Item::DeadLetter { .. } if first_dead => return Outcome::DeadLettered,
        Item::DeadLetter { .. } => return Outcome::AlreadyDeadLettered,
        Item::Vanished { .. } => return Outcome::Vanished,
        _ => Delivered::of(item).unwrap(),
    };
    let s = d.submission;
    let claimed = model.claim_of(&s.key).map(|c| c.3.clone());
    let tombstone = model.tombstones.get(&s.key);
    let earliest_other = model
        .claims
        .iter()
        .find(|c| c.1 == s.submission_instant && c.2 == s.award_id && c.0 != s.key);
    match (tombstone, claimed, earliest_other, policy) {
        (Some(t), _, _, _) => Outcome::Duplicate {
            first_claimed_at: t.claimed_at.clone(),
            purged_at: Some(t.purged_at.clone()),
        },
        (None, Some(at), _, _) => Outcome::Duplicate {
            first_claimed_at: at,
            purged_at: None,
        },
        (None, None, None, _) => Outcome::Processed,
        (None, None, Some(o), OnConflict::Record) => Outcome::ProcessedConflicting {
            other_key: o.0.to_hex(),
        },
        (None, None, Some(o), OnConflict::Hold) => Outcome::Held {
            other_key: o.0.to_hex(),
            first: first_dead,
        },
    }
}

/// The kinds of the records an outcome writes, in chain order.
fn kinds_of(outcome: &Outcome) -> Vec<Kind> {
    match outcome {
        Outcome::Processed => vec![Kind::Processed],
        Outcome::ProcessedConflicting { .. } => vec![Kind::Processed, Kind::Conflict],
        Outcome::Duplicate { .. } => vec![Kind::Duplicate],
        Outcome::Held { first: true, .. } => vec![Kind::Conflict, Kind::DeadLetter],
        Outcome::Held { first: false, .. } | Outcome::AlreadyDeadLettered => vec![],
        Outcome::DeadLettered => vec![Kind::DeadLetter],
        Outcome::Vanished => vec![Kind::Vanished],
        Outcome::Deferred => unreachable!("the procedure never defers"),
    }
}

/// A small pool of submissions: 2 awards × 2 instants (one spelled two ways) × 2 payloads,
/// so keys collide, groups share and conflicts are common.
fn pool() -> Vec<Submission> {
    let mut out = Vec::new();
    for award in ["A-1", "A-2"] {
        for (ts, instant) in [
            ("2026-07-01T09:00:00Z", "2026-07-01T09:00:00Z"),
            ("2026-07-01T11:00:00+02:00", "2026-07-01T09:00:00Z"),
            ("2026-07-02T09:00:00Z", "2026-07-02T09:00:00Z"),
        ] {
            for amount in [100, 250] {
                let payload = format!(
                    r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":{amount}}}"#
                );
                out.push(Submission {
                    award_id: award.to_owned(),
                    submission_timestamp: ts.to_owned(),
                    submission_instant: instant.to_owned(),
                    amount_cents: amount,
                    key: derive_idempotency_key(award, ts, payload.as_bytes()).unwrap(),
                    payload: payload.into_bytes(),
                });
            }
        }
    }
    out
}

/// An item as generated: (kind 0..4, submission index, entry index, deliveries).
type Gen = (u8, usize, usize, u64);

fn item_of<'a>(g: &Gen, pool: &'a [Submission], entries: &'a [String]) -> Item<'a> {
    let (kind, n, e, deliveries) = *g;
    let (s, entry_id) = (&pool[n % pool.len()], entries[e % entries.len()].as_str());
    match kind % 4 {
        0 => Item::Submission {
            submission: s,
            entry_id,
            delivery_count: deliveries,
        },
        1 => Item::KnownDuplicate {
            submission: s,
            entry_id,
            delivery_count: deliveries,
            committed_by: "2026-07-01T09:00:01Z",
        },
        2 => Item::DeadLetter {
            entry_id,
            reason_code: "not_json",
            reason: "expected value at line 1",
            award_id: Some("A-1"),
            key: None,
            delivery_count: deliveries,
        },
        _ => Item::Vanished {
            entry_id,
            reason: "XAUTOCLAIM reported it deleted",
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]
    /// Over any committed state (claims and tombstones of the pool's keys, never both for one
    /// key) and any batch, under either policy: each outcome is the spec's; each item writes
    /// exactly its outcome's records, each about that item; no key is claimed twice, and no
    /// tombstoned key at all.
    #[test]
    fn every_outcome_and_record_is_the_contracts(
        state in proptest::collection::vec(0u8..3, 12),
        items in proptest::collection::vec((0u8..4, 0usize..12, 0usize..5, 1u64..4), 0..24),
        hold in proptest::bool::ANY,
        approving in proptest::bool::ANY,
    ) {
        let pool = pool();
        let entries: Vec<String> = (0..5).map(|n| format!("{n}-0")).collect();
        let policy = if hold { OnConflict::Hold } else { OnConflict::Record };
        let mut model = Model { now: "2026-12-05T10:00:00Z".into(), ..Model::default() };
        for (s, st) in pool.iter().zip(&state) {
            match st {
                1 => model.claims.push((s.key, s.submission_instant.clone(), s.award_id.clone(),
                    format!("2026-07-0{}T00:00:00Z", model.claims.len() % 9 + 1))),
                2 => { model.tombstones.insert(s.key, Purged {
                    claimed_at: "2023-01-01T00:00:00Z".into(),
                    purged_at: "2026-01-02T00:00:00Z".into(),
                }); }
                _ => {}
            }
        }
        let stamp = Stamp { consumer: "c-1", stream: "grants", now: "2026-12-05T10:00:00Z", approving };
        let mut dead: HashSet<String> = HashSet::new();
        let mut records = Vec::new();
        for g in &items {
            let item = item_of(g, &pool, &entries);
            let before = model.clone();
            let verdict = decide(&item, policy, &mut model).unwrap();
            // The store's once-per-entry insert.
            let row = dead_row(&item, &verdict);
            let writes_row = row.is_some();
            let first_dead = row.is_some_and(|row| dead.insert(row.entry_id.to_owned()));
            let expected = spec(&before, &item, policy, first_dead);
            let start = records.len();
            let outcome = settle(&item, verdict, first_dead, &stamp, &mut records);
            prop_assert_eq!(&outcome, &expected);
            prop_assert_eq!(writes_row, matches!(outcome, Outcome::DeadLettered
                | Outcome::AlreadyDeadLettered | Outcome::Held { .. }));
            let written = &records[start..];
            prop_assert_eq!(written.iter().map(|r| r.kind).collect::<Vec<_>>(), kinds_of(&outcome));
            for r in written {
                prop_assert_eq!(r.consumer.as_deref(), Some("c-1"));
                prop_assert_eq!(r.recorded_at.as_str(), stamp.now);
                prop_assert_eq!(r.seq, 0, "records are numbered by the ledger, not here");
                if let Some(d) = Delivered::of(&item) {
                    prop_assert_eq!(r.idempotency_key.clone(), Some(d.submission.key.to_hex()));
                    prop_assert_eq!(r.award_id.as_deref(), Some(d.submission.award_id.as_str()));
                    prop_assert_eq!(r.stream_entry_id.as_deref(), Some(d.entry_id));
                    prop_assert_eq!(r.delivery_count, Some(d.delivery_count as i64));
                    let paid = matches!(r.kind, Kind::Processed | Kind::Conflict);
                    prop_assert_eq!(r.amount_cents, paid.then_some(d.submission.amount_cents));
                }
            }
            if let (Outcome::ProcessedConflicting { .. }, Some(c)) = (&outcome, written.get(1)) {
                let approved = c.detail.as_deref().is_some_and(|t| t.contains("approv"));
                prop_assert_eq!(approved, approving, "{:?}", c.detail);
            }
        }
        let mut claimed = model.claimed_now.clone();
        claimed.sort_unstable_by_key(|k| *k.as_bytes());
        let n = claimed.len();
        claimed.dedup();
        prop_assert_eq!(claimed.len(), n, "a key claimed twice");
        prop_assert!(claimed.iter().all(|k| !model.tombstones.contains_key(k)));
    }
}

/// A fast-filter hit with neither a claim nor a tombstone behind it is decided as the plain
/// submission (claimed and paid), not trusted as a duplicate.
#[test]
fn an_unconfirmed_marker_is_decided_as_the_submission_it_is() {
    let pool = pool();
    let mut model = Model {
        now: "now".into(),
        ..Model::default()
    };
    let item = Item::KnownDuplicate {
        submission: &pool[0],
        entry_id: "1-0",
        delivery_count: 1,
        committed_by: "then",
    };
    let verdict = decide(&item, OnConflict::Record, &mut model).unwrap();
    assert_eq!(verdict, Verdict::Claim { other: None });
    assert_eq!(model.claimed_now, vec![pool[0].key]);
}

/// Under hold, a conflicting submission whose key is claimed already is a duplicate, not a
/// second hold: the claim decides before the conflict does.
#[test]
fn under_hold_a_claimed_key_is_a_duplicate_not_a_hold() {
    let pool = pool();
    // pool[0] and pool[1]: one award and instant, two payloads, so two conflicting keys.
    let (a, b) = (&pool[0], &pool[1]);
    assert_ne!(a.key, b.key);
    let mut model = Model {
        now: "now".into(),
        ..Model::default()
    };
    for (s, at) in [(a, "t1"), (b, "t2")] {
        model.claims.push((
            s.key,
            s.submission_instant.clone(),
            s.award_id.clone(),
            at.into(),
        ));
    }
    let item = Item::Submission {
        submission: b,
        entry_id: "2-0",
        delivery_count: 2,
    };
    let verdict = decide(&item, OnConflict::Hold, &mut model).unwrap();
    assert_eq!(
        verdict,
        Verdict::Duplicate {
            first_claimed_at: "t2".into(),
            purged_at: None,
            via_filter: false
        }
    );
    assert!(model.claimed_now.is_empty());
}
