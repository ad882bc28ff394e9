//! Each check fires on a ledger that breaks its promise on purpose (`Wrong`, which answers
//! whatever a test scripts), and stays quiet on a ledger that keeps it.

use super::Checked;
use crate::config::OnConflict;
use crate::domain::audit::{Kind, Record};
use crate::domain::submission::{parse_payload, Limits, Submission};
use crate::error::Result;
use crate::ledger::{
    AuditLog, Inspect, Item, Ledger, MemoryLedger, Outbox, OutboxRow, Outcome, Since, Stats,
    Summary,
};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// A ledger that answers what the test scripts, right or wrong.
struct Wrong {
    /// What `record` returns.
    outcomes: Vec<Outcome>,
    /// What `writers` returns.
    writers: usize,
    /// What `record_in_turn` tells its hook, each call in turn.
    locked_says: Vec<bool>,
    /// Successive answers of `outbox_id_max` and `published_id_max`.
    ids: Mutex<VecDeque<i64>>,
    /// The ids of the rows `rows_after` returns.
    rows: Vec<i64>,
    /// Successive answers of `stats`.
    stats: Mutex<VecDeque<Stats>>,
    /// The seqs of the records `for_each_record` passes.
    seqs: Vec<i64>,
    /// What `verify` returns.
    summary: Summary,
    /// Successive answers of `ledger_id`.
    ledger_ids: Mutex<VecDeque<String>>,
}

impl Wrong {
    fn new() -> Self {
        Wrong {
            outcomes: Vec::new(),
            writers: 1,
            locked_says: Vec::new(),
            ids: Mutex::default(),
            rows: Vec::new(),
            stats: Mutex::default(),
            seqs: Vec::new(),
            summary: Summary {
                claims: 0,
                disbursements: 0,
                outbox_rows: 0,
                audit_records: 0,
                tombstones: 0,
                head_hash: String::new(),
                unlinked_batches: 0,
            },
            ledger_ids: Mutex::default(),
        }
    }

    fn next_id(&self) -> i64 {
        self.ids
            .lock()
            .unwrap()
            .pop_front()
            .expect("an id scripted")
    }
}

impl Ledger for Wrong {
    fn record(&self, _: &[Item<'_>], _: &str, _: &str) -> Result<Vec<Outcome>> {
        Ok(self.outcomes.clone())
    }

    fn writers(&self) -> usize {
        self.writers
    }

    fn record_in_turn(
        &self,
        _: &[Item<'_>],
        _: &str,
        _: &str,
        locked: &mut dyn FnMut(bool),
    ) -> Result<Vec<Outcome>> {
        for says in &self.locked_says {
            locked(*says);
        }
        Ok(self.outcomes.clone())
    }

    fn stats(&self) -> Result<Stats> {
        Ok(self
            .stats
            .lock()
            .unwrap()
            .pop_front()
            .expect("stats scripted"))
    }
}

impl Outbox for Wrong {
    fn rows_after(&self, _: i64, _: usize) -> Result<Vec<OutboxRow>> {
        Ok(self
            .rows
            .iter()
            .map(|&id| OutboxRow {
                id,
                event_type: "disbursement.recorded".into(),
                payload: "{}".into(),
            })
            .collect())
    }

    fn mark_published(&self, _: i64, _: &str, _: &str) -> Result<u64> {
        Ok(0)
    }

    fn ledger_id(&self) -> Result<String> {
        Ok(self.ledger_ids.lock().unwrap().pop_front().expect("an id"))
    }

    fn ledger_id_made(&self) -> Result<Option<String>> {
        Ok(self.ledger_ids.lock().unwrap().pop_front())
    }

    fn published_id_max(&self, _: &str) -> Result<i64> {
        Ok(self.next_id())
    }

    fn outbox_id_max(&self) -> Result<i64> {
        Ok(self.next_id())
    }
}

impl AuditLog for Wrong {
    fn for_each_record(&self, _: &Since, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        for &seq in &self.seqs {
            f(Record {
                seq,
                ..Record::unsealed(Kind::Processed, "2026-07-01T09:00:00.000000Z")
            })?;
        }
        Ok(())
    }
}

impl Inspect for Wrong {
    fn verify(&self) -> Result<Summary> {
        Ok(self.summary.clone())
    }

    fn ping(&self) -> Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        "a ledger that breaks its promises".into()
    }
}

/// Runs `f` and asserts it panicked with a message containing `naming`.
fn fails_naming(naming: &str, f: impl FnOnce()) {
    let Err(payload) = catch_unwind(AssertUnwindSafe(f)) else {
        panic!("no check fired; expected one naming {naming:?}");
    };
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains(naming),
        "the check fired, but its message {message:?} does not name {naming:?}"
    );
}

fn submission(award: &str, amount: i64) -> Submission {
    let payload = format!(
        r#"{{"award_id":"{award}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{amount}}}"#
    );
    let limits = Limits {
        payload_bytes_max: 1 << 20,
        amount_cents_max: 1 << 40,
    };
    parse_payload(payload.as_bytes(), &limits).expect("a valid submission")
}

fn item(s: &Submission) -> Item<'_> {
    Item::Submission {
        submission: s,
        entry_id: "1-0",
        delivery_count: 1,
    }
}

fn dead_letter(entry_id: &str) -> Item<'_> {
    Item::DeadLetter {
        entry_id,
        reason_code: "not_json",
        reason: "payload is not JSON",
        award_id: None,
        key: None,
        delivery_count: 1,
    }
}

/// `wrong` answering `outcomes` to a `record` of `items`, with `writers` writers.
fn record_with(items: &[Item<'_>], outcomes: Vec<Outcome>, writers: usize, policy: OnConflict) {
    let wrong = Wrong {
        outcomes,
        writers,
        ..Wrong::new()
    };
    Checked::wrap(wrong, Some(policy))
        .record(items, "c", "s")
        .unwrap();
}

fn dup() -> Outcome {
    Outcome::Duplicate {
        first_claimed_at: "2026-07-01T09:00:00.000000Z".into(),
        purged_at: None,
    }
}

#[test]
fn a_batch_answered_with_too_few_outcomes_stops_the_process() {
    let (a, b) = (submission("A", 1), submission("B", 2));
    let items = [item(&a), item(&b)];
    fails_naming("point 2", || {
        record_with(&items, vec![Outcome::Processed], 1, OnConflict::Record)
    });
}

#[test]
fn an_outcome_of_another_kind_of_item_stops_the_process() {
    let a = submission("A", 1);
    fails_naming("point 2", || {
        record_with(
            &[dead_letter("1-0")],
            vec![Outcome::Processed],
            1,
            OnConflict::Record,
        )
    });
    fails_naming("point 2", || {
        let vanished = Item::Vanished {
            entry_id: "1-0",
            reason: "gone",
        };
        record_with(
            &[vanished],
            vec![Outcome::DeadLettered],
            1,
            OnConflict::Record,
        )
    });
    fails_naming("point 2", || {
        record_with(&[item(&a)], vec![Outcome::Vanished], 1, OnConflict::Record)
    });
}

#[test]
fn a_deferral_by_a_ledger_with_one_writer_stops_the_process() {
    let a = submission("A", 1);
    fails_naming("point 8", || {
        record_with(&[item(&a)], vec![Outcome::Deferred], 1, OnConflict::Record)
    });
    // With two writers it is allowed.
    record_with(&[item(&a)], vec![Outcome::Deferred], 2, OnConflict::Record);
}

#[test]
fn a_group_deferred_in_part_stops_the_process() {
    let (a, b) = (submission("A", 1), submission("A", 2));
    let items = [item(&a), item(&b)];
    fails_naming("point 8", || {
        record_with(
            &items,
            vec![Outcome::Deferred, Outcome::Processed],
            2,
            OnConflict::Record,
        )
    });
}

#[test]
fn a_hold_under_the_record_policy_stops_the_process() {
    let (a, b) = (submission("A", 1), submission("A", 2));
    let held = || Outcome::Held {
        other_key: b.key.to_hex(),
        first: true,
    };
    fails_naming("--on-conflict record", || {
        record_with(&[item(&a)], vec![held()], 1, OnConflict::Record)
    });
    record_with(&[item(&a)], vec![held()], 1, OnConflict::Hold);
}

#[test]
fn a_key_paid_twice_in_one_batch_or_a_conflict_with_itself_stops_the_process() {
    let a = submission("A", 1);
    let items = [item(&a), item(&a)];
    fails_naming("point 3", || {
        record_with(
            &items,
            vec![Outcome::Processed, Outcome::Processed],
            1,
            OnConflict::Record,
        )
    });
    record_with(
        &items,
        vec![Outcome::Processed, dup()],
        1,
        OnConflict::Record,
    );
    fails_naming("point 3", || {
        let itself = Outcome::ProcessedConflicting {
            other_key: a.key.to_hex(),
        };
        record_with(&[item(&a)], vec![itself], 1, OnConflict::Record)
    });
}

#[test]
fn a_second_dead_letter_of_one_entry_in_one_batch_stops_the_process() {
    let items = [dead_letter("7-0"), dead_letter("7-0")];
    fails_naming("point 3", || {
        record_with(
            &items,
            vec![Outcome::DeadLettered, Outcome::DeadLettered],
            1,
            OnConflict::Record,
        )
    });
    record_with(
        &items,
        vec![Outcome::DeadLettered, Outcome::AlreadyDeadLettered],
        1,
        OnConflict::Record,
    );
}

#[test]
fn a_locked_hook_that_lies_or_is_called_twice_stops_the_process() {
    let a = submission("A", 1);
    let run = |says: Vec<bool>, outcome: Outcome| {
        let wrong = Wrong {
            outcomes: vec![outcome],
            writers: 2,
            locked_says: says,
            ..Wrong::new()
        };
        Checked::wrap(wrong, None)
            .record_in_turn(&[item(&a)], "c", "s", &mut |_| {})
            .unwrap();
    };
    fails_naming("point 9", || run(vec![false], Outcome::Deferred));
    fails_naming("point 9", || run(vec![true], Outcome::Processed));
    fails_naming("point 9", || run(vec![false, false], Outcome::Processed));
    run(vec![true], Outcome::Deferred);
}

#[test]
fn outbox_rows_not_rising_above_the_id_asked_stop_the_process() {
    let rows = |ids: Vec<i64>| {
        Checked::wrap(
            Wrong {
                rows: ids,
                ..Wrong::new()
            },
            None,
        )
    };
    fails_naming("point 5", || drop(rows(vec![5, 4]).rows_after(0, 10)));
    fails_naming("point 5", || drop(rows(vec![3, 4]).rows_after(3, 10)));
    fails_naming("point 5", || drop(rows(vec![1, 2, 3]).rows_after(0, 2)));
    assert_eq!(rows(vec![4, 9]).rows_after(3, 2).unwrap().len(), 2);
}

#[test]
fn an_outbox_sequence_going_back_stops_the_process() {
    let ledger = |ids: Vec<i64>, rows: Vec<i64>| {
        Checked::wrap(
            Wrong {
                ids: Mutex::new(ids.into()),
                rows,
                ..Wrong::new()
            },
            None,
        )
    };
    // A highest id that falls is what a PostgreSQL server crash does to links that had not
    // reached the disk: reported as it is, not a broken contract.
    let falls = ledger(vec![7, 6], vec![]);
    assert_eq!(falls.outbox_id_max().unwrap(), 7);
    assert_eq!(falls.outbox_id_max().unwrap(), 6);
    let below = ledger(vec![3], vec![5]);
    below.rows_after(0, 10).unwrap();
    assert_eq!(below.outbox_id_max().unwrap(), 3);
}

#[test]
fn a_published_mark_going_back_after_this_process_marked_stops_it() {
    let ledger = Checked::wrap(
        Wrong {
            ids: Mutex::new(vec![50, 0, 9, 8].into()),
            ..Wrong::new()
        },
        None,
    );
    // Before any mark of its own, a ledger of an earlier release may answer lower later
    // (another relay's first mark): allowed.
    assert_eq!(ledger.published_id_max("ev").unwrap(), 50);
    assert_eq!(ledger.published_id_max("ev").unwrap(), 0);
    ledger.mark_published(9, "now", "ev").unwrap();
    assert_eq!(ledger.published_id_max("ev").unwrap(), 9);
    fails_naming("only ever raised", || drop(ledger.published_id_max("ev")));
}

#[test]
fn counts_that_only_grow_shrinking_stop_the_process() {
    let stats = |claims, tombstones| Stats {
        claims,
        tombstones,
        ..Stats::default()
    };
    let ledger = |answers: Vec<Stats>| {
        Checked::wrap(
            Wrong {
                stats: Mutex::new(answers.into()),
                ..Wrong::new()
            },
            None,
        )
    };
    // A purge turns claims into tombstones: allowed.
    let purged = ledger(vec![stats(10, 0), stats(4, 6)]);
    purged.stats().unwrap();
    purged.stats().unwrap();
    let lost = ledger(vec![stats(10, 6), stats(10, 5)]);
    lost.stats().unwrap();
    fails_naming("point 6", || drop(lost.stats()));
    let vanished = ledger(vec![stats(10, 0), stats(9, 0)]);
    vanished.stats().unwrap();
    fails_naming("point 6", || drop(vanished.stats()));
}

#[test]
fn audit_records_out_of_order_stop_the_process() {
    let ledger = |seqs: Vec<i64>| {
        Checked::wrap(
            Wrong {
                seqs,
                ..Wrong::new()
            },
            None,
        )
    };
    let walk = |l: &Checked<Wrong>| l.for_each_record(&Since::All, &mut |_| Ok(()));
    fails_naming("point 4", || drop(walk(&ledger(vec![1, 3, 2]))));
    walk(&ledger(vec![1, 2, 2, 3])).unwrap();
}

#[test]
fn a_verify_summary_without_one_row_of_each_per_payment_stops_the_process() {
    let mut wrong = Wrong::new();
    wrong.summary.claims = 3;
    wrong.summary.disbursements = 3;
    wrong.summary.outbox_rows = 2;
    fails_naming("one of each", || drop(Checked::wrap(wrong, None).verify()));
}

#[test]
fn a_ledger_identity_that_changes_stops_the_process() {
    let wrong = Wrong {
        ledger_ids: Mutex::new(vec!["aa".to_owned(), "bb".to_owned()].into()),
        ..Wrong::new()
    };
    let ledger = Checked::wrap(wrong, None);
    assert_eq!(ledger.ledger_id().unwrap(), "aa");
    fails_naming("identity changed", || drop(ledger.ledger_id()));
}

#[test]
fn a_ledger_that_keeps_the_contract_passes_every_check() {
    // The real in-memory ledger, checked: a payment, its resend in the same batch, a
    // conflicting resubmission, a dead letter twice and a vanished entry.
    let (a, b) = (submission("A", 1), submission("A", 2));
    let vanished = Item::Vanished {
        entry_id: "9-0",
        reason: "trimmed",
    };
    let items = [
        item(&a),
        item(&a),
        item(&b),
        dead_letter("8-0"),
        dead_letter("8-0"),
        vanished,
    ];
    let ledger = MemoryLedger::new();
    let outcomes = ledger.record(&items, "c", "s").unwrap();
    assert_eq!(outcomes[0], Outcome::Processed);
    assert!(matches!(outcomes[1], Outcome::Duplicate { .. }));
    assert!(matches!(outcomes[2], Outcome::ProcessedConflicting { .. }));
    assert_eq!(
        outcomes[3..5],
        [Outcome::DeadLettered, Outcome::AlreadyDeadLettered]
    );
    assert_eq!(ledger.rows_after(0, 10).unwrap().len(), 2);
    assert_eq!(ledger.outbox_id_max().unwrap(), 2);
    assert_eq!(ledger.stats().unwrap().claims, 2);
    ledger.verify().unwrap();
}
