//! What one call of `record` promised, checked from its items and outcomes alone (contract
//! points 2, 3, 8 and 9).

use crate::config::OnConflict;
use crate::domain::key::IdempotencyKey;
use crate::ledger::{Item, Outcome};
use std::collections::{HashMap, HashSet};

/// What the ledger that answered is known to be, for the checks that depend on it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known {
    /// [`crate::ledger::Ledger::writers`]: 1 means no item may be deferred (point 8).
    pub(super) writers: usize,
    /// The conflict policy the ledger was opened with, when the opener said: under
    /// `--on-conflict record` nothing is ever held.
    pub(super) on_conflict: Option<OnConflict>,
}

/// Panics, naming the contract point, unless `outcomes` are what a ledger may answer for
/// `items` (points 2, 3 and 8).
pub(super) fn check(items: &[Item<'_>], outcomes: &[Outcome], known: Known) {
    assert!(
        known.writers >= 1,
        "ledger contract point 9: writers() is 0"
    );
    assert_eq!(
        outcomes.len(),
        items.len(),
        "ledger contract point 2: a batch of {} items got {} outcomes",
        items.len(),
        outcomes.len()
    );
    let mut paid: HashSet<IdempotencyKey> = HashSet::new();
    let mut dead: HashSet<&str> = HashSet::new();
    for (n, (item, outcome)) in items.iter().zip(outcomes).enumerate() {
        match item {
            Item::Submission {
                submission,
                entry_id,
                ..
            }
            | Item::KnownDuplicate {
                submission,
                entry_id,
                ..
            } => {
                submission_outcome(n, &submission.key, outcome, known);
                let key = submission.key;
                if paid.contains(&key) {
                    assert!(
                        matches!(outcome, Outcome::Duplicate { .. }),
                        "ledger contract point 3: item {n} (entry {entry_id}) has the key of a \
                         submission paid earlier in the batch, yet is {outcome:?}, not a duplicate"
                    );
                }
                if matches!(
                    outcome,
                    Outcome::Processed | Outcome::ProcessedConflicting { .. }
                ) {
                    paid.insert(key);
                }
                if matches!(outcome, Outcome::Held { first: true, .. }) {
                    first_dead_letter(n, entry_id, &mut dead);
                }
            }
            Item::DeadLetter { entry_id, .. } => {
                assert!(
                    matches!(
                        outcome,
                        Outcome::DeadLettered | Outcome::AlreadyDeadLettered
                    ),
                    "ledger contract point 2: item {n} is a dead letter (entry {entry_id}) and \
                     got {outcome:?}"
                );
                if *outcome == Outcome::DeadLettered {
                    first_dead_letter(n, entry_id, &mut dead);
                }
            }
            Item::Vanished { entry_id, .. } => assert!(
                *outcome == Outcome::Vanished,
                "ledger contract point 2: item {n} is a vanished entry ({entry_id}) and got \
                 {outcome:?}"
            ),
        }
    }
    if outcomes.contains(&Outcome::Deferred) {
        deferred_together(items, outcomes);
    }
}

/// Panics unless `outcome` is one a submission with key `key` may have.
fn submission_outcome(n: usize, key: &IdempotencyKey, outcome: &Outcome, known: Known) {
    match outcome {
        Outcome::Processed | Outcome::Duplicate { .. } => {}
        Outcome::ProcessedConflicting { other_key } => other_claim(n, key, other_key),
        Outcome::Held { other_key, .. } => {
            assert!(
                known.on_conflict != Some(OnConflict::Record),
                "ledger contract: item {n} was held for review by a ledger opened with \
                 --on-conflict record"
            );
            other_claim(n, key, other_key);
        }
        Outcome::Deferred => assert!(
            known.writers > 1,
            "ledger contract point 8: item {n} was deferred by a ledger with one writer"
        ),
        Outcome::DeadLettered | Outcome::AlreadyDeadLettered | Outcome::Vanished => panic!(
            "ledger contract point 2: item {n} is a submission and got {outcome:?}, an outcome \
             of a dead letter or a vanished entry"
        ),
    }
}

/// Panics unless `other_key`, the earlier claim a conflict names, is a key and not `key`.
fn other_claim(n: usize, key: &IdempotencyKey, other_key: &str) {
    let is_hex = other_key.len() == 64
        && other_key
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    assert!(
        is_hex && other_key != key.to_hex(),
        "ledger contract point 3: item {n}'s conflict names {other_key:?}, which is not \
         another claim's key"
    );
}

/// Records that item `n` wrote the dead letter of `entry_id`; panics if an earlier item of the
/// batch already had (a dead letter is recorded once per stream entry id, point 3).
fn first_dead_letter<'a>(n: usize, entry_id: &'a str, dead: &mut HashSet<&'a str>) {
    assert!(
        dead.insert(entry_id),
        "ledger contract point 3: item {n} recorded a second dead letter of entry {entry_id} \
         in one batch"
    );
}

/// Panics unless the submissions of each (instant, award) group were deferred all together
/// or not at all (point 8: items with one key, or conflicting keys, share a group).
fn deferred_together(items: &[Item<'_>], outcomes: &[Outcome]) {
    let mut groups: HashMap<(&str, &str), bool> = HashMap::new();
    for (n, (item, outcome)) in items.iter().zip(outcomes).enumerate() {
        let (Item::Submission { submission, .. } | Item::KnownDuplicate { submission, .. }) = item
        else {
            continue;
        };
        let group = (
            submission.submission_instant.as_str(),
            submission.award_id.as_str(),
        );
        let deferred = *outcome == Outcome::Deferred;
        let first = *groups.entry(group).or_insert(deferred);
        assert_eq!(
            first,
            deferred,
            "ledger contract point 8: item {n} (award {}, instant {}) was {}deferred while an \
             earlier item of its group was {}",
            group.1,
            group.0,
            if deferred { "" } else { "not " },
            if first { "deferred" } else { "not" }
        );
    }
}

/// Panics unless what a batch told its `locked` hook (point 9: whether it deferred anything)
/// agrees with its outcomes.
pub(super) fn check_locked(said: Option<bool>, outcomes: &[Outcome]) {
    let Some(deferred_any) = said else {
        return;
    };
    let deferred = outcomes.contains(&Outcome::Deferred);
    assert_eq!(
        deferred_any,
        deferred,
        "ledger contract point 9: the batch told its locked hook deferred = {deferred_any}, \
         but its outcomes {} a Deferred",
        if deferred { "hold" } else { "hold no" }
    );
}
