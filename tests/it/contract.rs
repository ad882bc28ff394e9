//! The ledger contract (`src/ledger/mod.rs`), written once and run against every implementation.
//!
//! Each test is a generic function over [`Subject`]; `for_every_ledger!` instantiates it once
//! per ledger, as `contract::memory::NAME`, `contract::sqlite::NAME` and
//! `contract::postgres::NAME`. A subject is a fresh, empty ledger plus one fault hook ("fail when
//! paying award X"), so the all-or-nothing test is the same on all three:
//! `MemoryLedger::fail_on_award` on one, a real trigger on the others.
//! One test compares the three ledgers directly: the same batches must give the same outcomes
//! and the same audit records. Nothing here needs Redis.

use claimgate::config::LedgerConfig;
use claimgate::config::OnConflict;
use claimgate::domain::audit::{detail, Kind, Record};
use claimgate::domain::clock::now_rfc3339;
use claimgate::domain::event::{self, DISBURSEMENT_RECORDED};
use claimgate::domain::submission::{parse_payload, Submission};
use claimgate::ledger::postgres::PgLedger;
use claimgate::ledger::sqlite::SqliteLedger;
use claimgate::ledger::{
    AuditLog, Inspect, Item, Ledger, MemoryLedger, Outbox, OutboxRow, Outcome, Retention, Since,
    Stats, Summary,
};
use claimgate::Result;
use std::sync::Arc;

use crate::support::LIMITS as MAX;
const STREAM: &str = "grants:submissions";

/// A ledger under test: a fresh one per test, and the fault hook.
trait Subject: Ledger + Outbox + AuditLog + Inspect + Clone + 'static {
    /// Whether each batch is closed in the chain by a `batch` link after its records (a shared
    /// ledger's batches, `domain::audit`): a seal at the last record's seq, not a record.
    const LINKS: bool = false;
    /// An empty ledger with this conflict policy.
    fn fresh(on_conflict: OnConflict) -> Self;
    /// From now on, a batch that would pay a new claim of `award_id` fails, after the batch's
    /// earlier items were written inside its transaction.
    fn fail_on_award(&self, award_id: &str);
    /// Undoes `fail_on_award`.
    fn disarm(&self);
    /// Purges the audit chain from its first record through `last` with the rows they
    /// describe, at `now` (SQLite: `Retention::purge_batch`, as `retention purge` runs it).
    fn purge_through(&self, last: i64, now: &str) -> claimgate::ledger::Removed;
}

impl Subject for MemoryLedger {
    fn fresh(on_conflict: OnConflict) -> Self {
        MemoryLedger::new().with_on_conflict(on_conflict)
    }
    fn fail_on_award(&self, award_id: &str) {
        MemoryLedger::fail_on_award(self, award_id).unwrap();
    }
    fn disarm(&self) {
        self.clear_fault().unwrap();
    }
    fn purge_through(&self, last: i64, now: &str) -> claimgate::ledger::Removed {
        MemoryLedger::purge_through(self, last, "contract purge", now).unwrap()
    }
}

/// The SQLite ledger in a temp dir, shared between clones (the concurrency test's writers).
#[derive(Clone)]
struct Sqlite {
    /// The ledger under test.
    ledger: Arc<SqliteLedger>,
    /// Keeps the ledger file's directory alive as long as any clone.
    dir: Arc<tempfile::TempDir>,
}

impl Sqlite {
    /// A connection of its own to the ledger file, for planting triggers and faults.
    fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.dir.path().join("ledger.db")).unwrap()
    }
}

impl Subject for Sqlite {
    fn fresh(on_conflict: OnConflict) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = LedgerConfig::new(dir.path().join("ledger.db"));
        cfg.on_conflict = on_conflict;
        Sqlite {
            ledger: Arc::new(SqliteLedger::open(&cfg).unwrap()),
            dir: Arc::new(dir),
        }
    }
    fn fail_on_award(&self, award_id: &str) {
        // Disbursements are written at the end of the batch (`sqlite/batch.rs`, `finish`),
        // after every claim of the batch: the failure lands inside a transaction that has
        // already written claims, dead letters and other disbursements.
        assert!(!award_id.contains('\''));
        self.raw()
            .execute_batch(&format!(
                "CREATE TRIGGER contract_fault BEFORE INSERT ON disbursements
                 WHEN NEW.award_id = '{award_id}'
                 BEGIN SELECT RAISE(ABORT, 'forced failure'); END;"
            ))
            .unwrap();
    }
    fn disarm(&self) {
        self.raw()
            .execute_batch("DROP TRIGGER contract_fault")
            .unwrap();
    }
    fn purge_through(&self, last: i64, now: &str) -> claimgate::ledger::Removed {
        use claimgate::ledger::Retention;
        let first = records(self, &Since::All)[0].seq;
        let cutoff = "9999-12-31T23:59:59.999999Z";
        self.ledger
            .purge_batch(first, last, cutoff, "contract purge", now)
            .unwrap()
    }
}

impl Ledger for Sqlite {
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>> {
        self.ledger.record(items, consumer, stream)
    }
    fn stats(&self) -> Result<Stats> {
        self.ledger.stats()
    }
}

impl Outbox for Sqlite {
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
        self.ledger.rows_after(after_id, limit)
    }
    fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64> {
        self.ledger.mark_published(upto_id, now, events_stream)
    }
    fn ledger_id(&self) -> Result<String> {
        self.ledger.ledger_id()
    }
    fn ledger_id_made(&self) -> Result<Option<String>> {
        self.ledger.ledger_id_made()
    }
    fn outbox_id_max(&self) -> Result<i64> {
        self.ledger.outbox_id_max()
    }
    fn published_id_max(&self, events_stream: &str) -> Result<i64> {
        self.ledger.published_id_max(events_stream)
    }
}

impl AuditLog for Sqlite {
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        self.ledger.for_each_record(since, f)
    }

    fn for_each_dead_letter(&self, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        self.ledger.for_each_dead_letter(f)
    }
}

impl Inspect for Sqlite {
    fn verify(&self) -> Result<Summary> {
        self.ledger.verify()
    }
    fn ping(&self) -> Result<()> {
        self.ledger.ping()
    }
    fn describe(&self) -> String {
        self.ledger.describe()
    }
}

/// The PostgreSQL ledger on a fresh database of the shared test cluster, shared between clones.
#[derive(Clone)]
struct Postgres {
    /// The ledger under test.
    ledger: Arc<PgLedger>,
    /// Its URL, for a connection of the test's own.
    url: String,
}

impl Postgres {
    /// A connection of its own to the database, for planting triggers and faults.
    fn raw(&self) -> ::postgres::Client {
        ::postgres::Client::connect(&self.url, ::postgres::NoTls).unwrap()
    }
}

impl Subject for Postgres {
    const LINKS: bool = true;
    fn fresh(on_conflict: OnConflict) -> Self {
        let url = crate::pg::fresh_database();
        let mut cfg = crate::support::pg_config(&url);
        cfg.on_conflict = on_conflict;
        Postgres {
            ledger: Arc::new(PgLedger::open(&cfg).unwrap()),
            url,
        }
    }
    fn fail_on_award(&self, award_id: &str) {
        // As on SQLite: disbursements are written after every claim of the batch, so the
        // failure lands inside a transaction that has already written rows.
        assert!(!award_id.contains('\''));
        self.raw()
            .batch_execute(&format!(
                "CREATE FUNCTION contract_fault() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     IF NEW.award_id = '{award_id}' THEN RAISE EXCEPTION 'forced failure'; END IF;
                     RETURN NEW;
                 END $$;
                 CREATE TRIGGER contract_fault BEFORE INSERT ON disbursements
                 FOR EACH ROW EXECUTE FUNCTION contract_fault();"
            ))
            .unwrap();
    }
    fn disarm(&self) {
        self.raw()
            .batch_execute(
                "DROP TRIGGER contract_fault ON disbursements; DROP FUNCTION contract_fault();",
            )
            .unwrap();
    }
    /// Through the end of the batch holding `last`: a shared ledger purges whole batches.
    fn purge_through(&self, last: i64, now: &str) -> claimgate::ledger::Removed {
        use claimgate::ledger::Retention;
        let chain = chain(self, &Since::All);
        let first = chain[0].seq;
        let last = chain
            .iter()
            .find(|r| r.seq >= last && r.batch_index.is_none())
            .unwrap()
            .seq;
        let cutoff = "9999-12-31T23:59:59.999999Z";
        self.ledger
            .purge_batch(first, last, cutoff, "contract purge", now)
            .unwrap()
    }
}

/// Delegates every trait to the wrapped ledger (the subject wrappers add only the fault hook).
macro_rules! delegate {
    ($t:ty) => {
        impl Ledger for $t {
            fn record(
                &self,
                items: &[Item<'_>],
                consumer: &str,
                stream: &str,
            ) -> Result<Vec<Outcome>> {
                self.ledger.record(items, consumer, stream)
            }
            fn stats(&self) -> Result<Stats> {
                self.ledger.stats()
            }
        }
        impl Outbox for $t {
            fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
                self.ledger.rows_after(after_id, limit)
            }
            fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64> {
                self.ledger.mark_published(upto_id, now, events_stream)
            }
            fn ledger_id(&self) -> Result<String> {
                self.ledger.ledger_id()
            }
            fn ledger_id_made(&self) -> Result<Option<String>> {
                self.ledger.ledger_id_made()
            }
            fn outbox_id_max(&self) -> Result<i64> {
                self.ledger.outbox_id_max()
            }
            fn published_id_max(&self, events_stream: &str) -> Result<i64> {
                self.ledger.published_id_max(events_stream)
            }
        }
        impl AuditLog for $t {
            fn for_each_record(
                &self,
                since: &Since,
                f: &mut dyn FnMut(Record) -> Result<()>,
            ) -> Result<()> {
                self.ledger.for_each_record(since, f)
            }
            fn for_each_dead_letter(&self, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
                self.ledger.for_each_dead_letter(f)
            }
        }
        impl Inspect for $t {
            fn verify(&self) -> Result<Summary> {
                self.ledger.verify()
            }
            fn ping(&self) -> Result<()> {
                self.ledger.ping()
            }
            fn describe(&self) -> String {
                self.ledger.describe()
            }
        }
    };
}
delegate!(Postgres);

/// Instantiates each generic contract test once per ledger.
macro_rules! for_every_ledger {
    ($($test:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $test() {
                super::$test::<claimgate::ledger::MemoryLedger>();
            })*
        }
        mod sqlite {
            $(#[test]
            fn $test() {
                super::$test::<super::Sqlite>();
            })*
        }
        mod postgres {
            $(#[test]
            fn $test() {
                super::$test::<super::Postgres>();
            })*
        }
    };
}

for_every_ledger!(
    duplicates_inside_one_batch_are_decided_in_batch_order,
    a_duplicate_in_a_later_batch_names_the_first_claim_and_pays_nothing,
    a_mixed_batch_gets_one_outcome_per_item_in_item_order,
    a_batch_that_fails_midway_leaves_nothing_and_succeeds_in_full_later,
    a_large_batch_is_sealed_in_order_after_the_chain_and_a_failure_in_it_leaves_nothing,
    concurrent_writers_leave_one_linear_chain_and_lose_nothing,
    outbox_rows_appear_in_id_order_above_any_position,
    the_ledger_id_is_stable_and_differs_between_ledgers,
    audit_records_read_back_in_seq_order_from_where_asked,
    dead_letter_records_read_back_alone_and_in_seq_order,
    stats_asked_again_and_again_agree_with_a_recount_through_every_kind_of_change,
    a_conflicting_resubmission_is_paid_and_linked_under_record,
    a_conflicting_resubmission_is_held_once_per_entry_under_hold,
    every_claim_of_a_crowded_group_is_found_again,
    verify_summarises_a_clean_ledger,
    the_disbursed_total_is_exact_past_i64,
    one_instant_spelled_four_ways_is_one_conflict_each_under_record,
    one_instant_spelled_four_ways_is_held_after_the_first_under_hold,
    a_vanished_entry_leaves_a_record_and_nothing_else,
    a_purged_claim_stays_a_duplicate_forever_through_its_tombstone,
);

// ----- Building items ---------------------------------------------------------------------------

/// Submission `i` of the test fixtures: award `A-00000i`, amount `100 + i`.
fn sub(i: usize) -> Submission {
    crate::support::parsed(i)
}

/// Same award and submission time as `sub(i)`, another payload: a conflicting resubmission.
fn conflicting(i: usize) -> Submission {
    let payload = format!(
        r#"{{"award_id":"A-{i:06}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{}}}"#,
        900 + i
    );
    parse_payload(payload.as_bytes(), MAX).unwrap()
}

fn item<'a>(s: &'a Submission, entry_id: &'a str) -> Item<'a> {
    Item::Submission {
        submission: s,
        entry_id,
        delivery_count: 1,
    }
}

/// `record`, with what a shared ledger defers offered again as the worker offers it
/// (contract point 8: the deferred items, in order, at once, to the same handle) until nothing
/// is deferred; each item's final outcome, and how many deferrals that took. A deferral that
/// never ends fails the test.
fn record_offering_again<L: Ledger>(
    l: &L,
    items: &[Item<'_>],
    consumer: &str,
) -> (Vec<Outcome>, usize) {
    let mut out = l.record(items, consumer, STREAM).unwrap();
    assert_eq!(out.len(), items.len());
    let mut deferrals = 0;
    for _ in 0..100 {
        let again: Vec<usize> = (0..out.len())
            .filter(|&n| out[n] == Outcome::Deferred)
            .collect();
        if again.is_empty() {
            return (out, deferrals);
        }
        deferrals += again.len();
        let offered: Vec<Item<'_>> = again.iter().map(|&n| items[n].clone()).collect();
        for (n, o) in again
            .into_iter()
            .zip(l.record(&offered, consumer, STREAM).unwrap())
        {
            out[n] = o;
        }
    }
    panic!("items deferred 100 times over: {out:?}");
}

fn known<'a>(s: &'a Submission, entry_id: &'a str, committed_by: &'a str) -> Item<'a> {
    Item::KnownDuplicate {
        submission: s,
        entry_id,
        delivery_count: 2,
        committed_by,
    }
}

fn dead(entry_id: &str) -> Item<'_> {
    Item::DeadLetter {
        entry_id,
        reason_code: "not_json",
        reason: "payload is not JSON",
        award_id: Some("A-BAD"),
        key: None,
        delivery_count: 3,
    }
}

// ----- Reading state back -----------------------------------------------------------------------

/// Every record of the chain, links of batches included.
fn chain(l: &impl AuditLog, since: &Since) -> Vec<Record> {
    let mut out = Vec::new();
    l.for_each_record(since, &mut |r| {
        out.push(r);
        Ok(())
    })
    .unwrap();
    out
}

/// The records of what happened: the chain without the links of batches.
fn records(l: &impl AuditLog, since: &Since) -> Vec<Record> {
    chain(l, since)
        .into_iter()
        .filter(|r| r.kind != Kind::Batch)
        .collect()
}

/// How many entries `records` records of what happened, in `batches` batches, make in the
/// walk of the chain: each batch's link comes too, on a ledger that links batches.
fn chain_len<L: Subject>(records: usize, batches: usize) -> usize {
    records + if L::LINKS { batches } else { 0 }
}

fn kinds(records: &[Record]) -> Vec<Kind> {
    records.iter().map(|r| r.kind).collect()
}

fn seqs(records: &[Record]) -> Vec<i64> {
    records.iter().map(|r| r.seq).collect()
}

/// Stats without the one field that moves with the clock.
fn counts(l: &impl Ledger) -> Stats {
    Stats {
        outbox_oldest_age_s: None,
        ..l.stats().unwrap()
    }
}

/// Waits until the ledger clock has moved on, so the next batch's time differs from every
/// earlier one (the clock has microseconds; a fast in-memory batch can take less).
fn tick() {
    let t = now_rfc3339();
    while now_rfc3339() <= t {
        std::hint::spin_loop();
    }
}

// ----- The contract tests -----------------------------------------------------------------------

fn duplicates_inside_one_batch_are_decided_in_batch_order<L: Subject>() {
    // The second of two items with one key in one batch is a duplicate of the first; one payment.
    let l = L::fresh(OnConflict::Record);
    let s = sub(1);
    let out = l
        .record(&[item(&s, "1-0"), item(&s, "2-0")], "c", STREAM)
        .unwrap();
    let recs = records(&l, &Since::All);
    let first_claimed_at = recs[0].recorded_at.clone();
    assert_eq!(
        out,
        vec![
            Outcome::Processed,
            Outcome::Duplicate {
                first_claimed_at: first_claimed_at.clone(),
                purged_at: None,
            }
        ]
    );
    assert_eq!(kinds(&recs), [Kind::Processed, Kind::Duplicate]);
    assert_eq!(
        recs[1].detail.as_deref(),
        Some(format!("first claimed at {first_claimed_at}").as_str())
    );
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.outbox_backlog), (1, 1, 1));
    assert_eq!(st.disbursed_cents_total, 101);
    assert_eq!((st.duplicates_suppressed, st.audit_records), (1, 2));
}

fn a_duplicate_in_a_later_batch_names_the_first_claim_and_pays_nothing<L: Subject>() {
    // A later batch's duplicate carries the first claim's time; only the duplicate count grows.
    let l = L::fresh(OnConflict::Record);
    let s = sub(7);
    assert_eq!(
        l.record(&[item(&s, "5-0")], "worker-a", STREAM).unwrap(),
        vec![Outcome::Processed]
    );
    let claimed_at = records(&l, &Since::All)[0].recorded_at.clone();
    let before = counts(&l);
    tick();
    let out = l
        .record(&[item(&s, "9-0"), item(&s, "5-0")], "worker-b", STREAM)
        .unwrap();
    let duplicate = Outcome::Duplicate {
        first_claimed_at: claimed_at.clone(),
        purged_at: None,
    };
    assert_eq!(out, vec![duplicate.clone(), duplicate]);
    assert_eq!(
        counts(&l),
        Stats {
            duplicates_suppressed: 2,
            audit_records: 3,
            ..before
        }
    );
    let recs = records(&l, &Since::All);
    assert_eq!(
        kinds(&recs),
        [Kind::Processed, Kind::Duplicate, Kind::Duplicate]
    );
    let later = &recs[1];
    assert_eq!(later.consumer.as_deref(), Some("worker-b"));
    assert_eq!(later.stream_entry_id.as_deref(), Some("9-0"));
    assert_eq!(later.amount_cents, None, "a duplicate pays nothing");
    assert_ne!(later.recorded_at, claimed_at);
}

fn a_mixed_batch_gets_one_outcome_per_item_in_item_order<L: Subject>() {
    // Outcomes and audit records follow the items one for one, whatever each item is.
    let l = L::fresh(OnConflict::Record);
    let (s1, s2, s3) = (sub(1), sub(2), sub(3));
    let by = "2026-07-01T10:00:00.000000Z";
    let out = l
        .record(
            &[
                item(&s1, "1-0"),
                item(&s2, "2-0"),
                item(&s1, "3-0"),
                dead("4-0"),
                dead("4-0"),
                known(&s3, "5-0", by),
                item(&s3, "6-0"),
                known(&s1, "7-0", by),
            ],
            "c",
            STREAM,
        )
        .unwrap();
    let recs = records(&l, &Since::All);
    let t = recs[0].recorded_at.clone();
    assert_eq!(
        out,
        vec![
            Outcome::Processed,
            Outcome::Processed,
            Outcome::Duplicate {
                first_claimed_at: t.clone(),
                purged_at: None,
            },
            Outcome::DeadLettered,
            Outcome::AlreadyDeadLettered,
            // A marker the ledger cannot confirm is not trusted: the submission is paid.
            Outcome::Processed,
            Outcome::Duplicate {
                first_claimed_at: t.clone(),
                purged_at: None,
            },
            // A confirmed marker is the same outcome as any duplicate.
            Outcome::Duplicate {
                first_claimed_at: t.clone(),
                purged_at: None,
            },
        ]
    );
    assert_eq!(seqs(&recs), [1, 2, 3, 4, 5, 6, 7]);
    use Kind::*;
    assert_eq!(
        kinds(&recs),
        [Processed, Processed, Duplicate, DeadLetter, Processed, Duplicate, Duplicate]
    );
    let entries: Vec<_> = recs.iter().map(|r| r.stream_entry_id.as_deref()).collect();
    let expected = ["1-0", "2-0", "3-0", "4-0", "5-0", "6-0", "7-0"];
    assert_eq!(entries, expected.map(Some));
    assert_eq!(
        recs[3].detail.as_deref(),
        Some("not_json: payload is not JSON")
    );
    assert_eq!(
        (recs[3].award_id.as_deref(), recs[3].delivery_count),
        (Some("A-BAD"), Some(3))
    );
    assert_eq!(
        recs[6].detail.as_deref(),
        Some(format!("first claimed at {t} (fast filter)").as_str())
    );
    assert!(recs.iter().all(|r| r.recorded_at == t));
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.dead_letters), (3, 3, 1));
    assert_eq!(st.disbursed_cents_total, 101 + 102 + 103);
    assert_eq!(st.duplicates_suppressed, 3);
    // A later delivery of the dead letter writes nothing more.
    assert_eq!(
        l.record(&[dead("4-0")], "c", STREAM).unwrap(),
        vec![Outcome::AlreadyDeadLettered]
    );
    assert_eq!(counts(&l), st);
    assert_eq!(l.record(&[], "c", STREAM).unwrap(), vec![]);
}

fn a_batch_that_fails_midway_leaves_nothing_and_succeeds_in_full_later<L: Subject>() {
    // A batch that fails after some of its items were written leaves no trace; redone, it all lands.
    // 1. Commit one submission.
    // 2. Arm the fault on award A-000004, the fourth item of the next batch.
    // 3. The batch (new, dead letter, duplicate, new A-000004, new) fails.
    // 4. Stats, audit records, outbox and verify read exactly as after step 1.
    // 5. Disarmed, the same batch succeeds in full: nothing of attempt 3 was left claimed.
    let l = L::fresh(OnConflict::Record);
    let (s1, s2, s4, s5) = (sub(1), sub(2), sub(4), sub(5));
    l.record(&[item(&s1, "1-0")], "c", STREAM).unwrap();
    let before = (
        counts(&l),
        records(&l, &Since::All),
        l.rows_after(0, 100).unwrap(),
    );
    let verified = l.verify().unwrap();

    l.fail_on_award("A-000004");
    let batch = [
        item(&s2, "2-0"),
        dead("3-0"),
        item(&s1, "4-0"),
        item(&s4, "5-0"),
        item(&s5, "6-0"),
    ];
    let err = l.record(&batch, "c", STREAM);
    assert!(err.is_err(), "the armed fault must fail the batch: {err:?}");
    let after = (
        counts(&l),
        records(&l, &Since::All),
        l.rows_after(0, 100).unwrap(),
    );
    assert_eq!(after, before);
    // Verified once the fault is out: on SQLite the fault is a trigger, and `verify` refuses a
    // ledger with a trigger claimgate did not make.
    l.disarm();
    assert_eq!(l.verify().unwrap(), verified);

    let claimed_at = before.1[0].recorded_at.clone();
    assert_eq!(
        l.record(&batch, "c", STREAM).unwrap(),
        vec![
            Outcome::Processed,
            Outcome::DeadLettered,
            Outcome::Duplicate {
                first_claimed_at: claimed_at,
                purged_at: None,
            },
            Outcome::Processed,
            Outcome::Processed,
        ]
    );
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.dead_letters), (4, 4, 1));
    assert_eq!(st.disbursed_cents_total, 101 + 102 + 104 + 105);
    assert_eq!(seqs(&records(&l, &Since::All)), [1, 2, 3, 4, 5, 6]);
    assert_eq!(l.rows_after(0, 100).unwrap().len(), 4);
    l.verify().unwrap();
}

fn a_large_batch_is_sealed_in_order_after_the_chain_and_a_failure_in_it_leaves_nothing<
    L: Subject,
>() {
    // A batch of 600 records (300 new claims, then a resend of each) is sealed apart from the
    // rows it writes on SQLite (`sqlite/batch.rs`, from 256 records): a fault in the middle of
    // its disbursements leaves nothing; redone, its records take seqs 2..=601 after the one
    // record before them, the chain verifies, and the next large batch continues after it.
    const NEW: usize = 300;
    let l = L::fresh(OnConflict::Record);
    let s0 = sub(0);
    l.record(&[item(&s0, "0-0")], "c", STREAM).unwrap();
    let subs: Vec<Submission> = (1..=NEW).map(sub).collect();
    // Every submission, then each again, as entries of delivery round `round`.
    let entry_ids =
        |round: usize| -> Vec<String> { (1..=2 * NEW).map(|i| format!("{i}-{round}")).collect() };
    fn twice<'a>(subs: &'a [Submission], ids: &'a [String]) -> Vec<Item<'a>> {
        subs.iter()
            .chain(subs)
            .zip(ids)
            .map(|(s, id)| item(s, id))
            .collect()
    }
    let ids = entry_ids(1);
    let batch = twice(&subs, &ids);
    l.fail_on_award(&subs[NEW / 2].award_id);
    assert!(l.record(&batch, "c", STREAM).is_err());
    assert_eq!(counts(&l).claims, 1);
    assert_eq!(seqs(&records(&l, &Since::All)), [1]);
    l.disarm();
    l.verify().unwrap();

    let outcomes = l.record(&batch, "c", STREAM).unwrap();
    assert!(outcomes[..NEW].iter().all(|o| *o == Outcome::Processed));
    assert!(outcomes[NEW..]
        .iter()
        .all(|o| matches!(o, Outcome::Duplicate { .. })));
    let expected: Vec<i64> = (1..=(1 + 2 * NEW) as i64).collect();
    assert_eq!(seqs(&records(&l, &Since::All)), expected);
    l.record(&twice(&subs, &entry_ids(2)), "c", STREAM).unwrap();
    let summary = l.verify().unwrap();
    assert_eq!(
        (summary.claims, summary.disbursements),
        (1 + NEW as u64, 1 + NEW as u64)
    );
    let expected: Vec<i64> = (1..=(1 + 4 * NEW) as i64).collect();
    assert_eq!(seqs(&records(&l, &Since::All)), expected);
    let st = counts(&l);
    assert_eq!(
        st.disbursed_cents_total,
        (0..=NEW as i128).map(|i| 100 + i).sum::<i128>()
    );
}

fn concurrent_writers_leave_one_linear_chain_and_lose_nothing<L: Subject>() {
    // Writers recording the same submissions at once: one chain 1..=N, each key paid once.
    // Four writers in small batches, so batches really overlap: a lock dropped for a moment
    // between staging and publishing was caught in 10 runs of 10 this way, and missed by two
    // writers in batches of five.
    const WRITERS: usize = 4;
    const KEYS: usize = 200;
    const BATCH: usize = 2;
    let l = L::fresh(OnConflict::Record);
    let subs: Vec<Submission> = (0..KEYS).map(sub).collect();
    let entries: Vec<String> = (0..KEYS).map(|i| format!("{i}-0")).collect();
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let (l, subs, entries) = (l.clone(), &subs, &entries);
            scope.spawn(move || {
                let consumer = format!("writer-{writer}");
                for first in (0..KEYS).step_by(BATCH) {
                    let items: Vec<Item<'_>> = (first..KEYS.min(first + BATCH))
                        .map(|i| item(&subs[i], &entries[i]))
                        .collect();
                    let (out, _) = record_offering_again(&l, &items, &consumer);
                    assert!(out.iter().all(|o| *o != Outcome::Deferred));
                }
            });
        }
    });
    let n = (WRITERS * KEYS) as i64;
    let all = chain(&l, &Since::All);
    let recs = records(&l, &Since::All);
    assert_eq!(seqs(&recs), (1..=n).collect::<Vec<_>>());
    let processed = recs.iter().filter(|r| r.kind == Kind::Processed).count();
    assert_eq!(processed, KEYS);
    let summary = l.verify().unwrap();
    assert_eq!(summary.audit_records, n as u64);
    assert_eq!(summary.head_hash, all.last().unwrap().hash);
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements), (KEYS as u64, KEYS as u64));
    assert_eq!(st.duplicates_suppressed, ((WRITERS - 1) * KEYS) as u64);
    let expected_cents: i128 = (0..KEYS as i128).map(|i| 100 + i).sum();
    assert_eq!(st.disbursed_cents_total, expected_cents);
}

fn outbox_rows_appear_in_id_order_above_any_position<L: Subject>() {
    // Rows above a position come lowest id first, published or not; ids only grow.
    // 1. Three batches of two new claims: six rows, ids ascending, each the event of its claim.
    // 2. Mark up to the third id: three rows change; marking again changes none; backlog 3.
    // 3. Above the third id: the three higher rows, `limit` respected. Above 0: all six, the
    //    published ones too (the relay's position is the events stream's, not `published_at`).
    // 4. Two more batches: every new id is above every earlier one.
    // 5. Marking everything changes the seven unpublished rows; nothing is above the last id.
    let l = L::fresh(OnConflict::Record);
    let subs: Vec<Submission> = (1..=10).map(sub).collect();
    let entries: Vec<String> = (1..=10).map(|i| format!("{i}-0")).collect();
    let record_pair = |i: usize| {
        let items = [
            item(&subs[i], &entries[i]),
            item(&subs[i + 1], &entries[i + 1]),
        ];
        l.record(&items, "c", STREAM).unwrap();
    };
    let ids_after = |after: i64, limit: usize| -> Vec<i64> {
        l.rows_after(after, limit)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect()
    };
    for i in [0, 2, 4] {
        record_pair(i);
    }
    assert_eq!(
        l.published_id_max("grants:events").unwrap(),
        0,
        "nothing marked yet"
    );
    let rows = l.rows_after(0, 100).unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 6);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for (row, s) in rows.iter().zip(&subs) {
        assert_eq!(row.event_type, DISBURSEMENT_RECORDED);
        assert_eq!(row.payload, event::payload(s, &s.key.to_hex()));
    }

    assert_eq!(
        l.mark_published(ids[2], "2026-07-01T10:00:00.000000Z", "grants:events")
            .unwrap(),
        3
    );
    assert_eq!(
        l.mark_published(ids[2], "2026-07-01T10:00:01.000000Z", "grants:events")
            .unwrap(),
        0
    );
    assert_eq!(counts(&l).outbox_backlog, 3);
    assert_eq!(
        l.published_id_max("grants:events").unwrap(),
        ids[2],
        "the last row marked"
    );
    assert_eq!(
        l.published_id_max("other:events").unwrap(),
        0,
        "a stream no relay has published to, beside one that has"
    );
    assert_eq!(ids_after(ids[2], 100), ids[3..]);
    assert_eq!(ids_after(ids[2], 2), ids[3..5]);
    assert_eq!(
        ids_after(0, 100),
        ids,
        "published rows are still read above 0"
    );
    assert_eq!(ids_after(ids[0], 1), ids[1..2]);

    for i in [6, 8] {
        record_pair(i);
    }
    let new = ids_after(ids[5], 100);
    assert_eq!(new.len(), 4);
    assert!(new.iter().all(|id| id > &ids[5]), "{new:?} reuses an id");
    assert!(new.windows(2).all(|w| w[0] < w[1]), "{new:?}");
    assert_eq!(ids_after(0, 100).len(), 10);
    assert_eq!(
        l.mark_published(i64::MAX, "2026-07-01T10:00:02.000000Z", "grants:events")
            .unwrap(),
        7
    );
    assert_eq!(ids_after(*new.last().unwrap(), 100), Vec::<i64>::new());
    assert_eq!(counts(&l).outbox_backlog, 0);
    assert_eq!(
        l.published_id_max("grants:events").unwrap(),
        *new.last().unwrap(),
        "a mark is never above the highest id the ledger gave"
    );
}

fn the_ledger_id_is_stable_and_differs_between_ledgers<L: Subject>() {
    // One ledger answers one random id on every call, through every handle; another ledger, another.
    // Before the first call there is none, and asking whether there is one makes none.
    let l = L::fresh(OnConflict::Record);
    assert_eq!(l.ledger_id_made().unwrap(), None);
    assert_eq!(l.ledger_id_made().unwrap(), None);
    let id = l.ledger_id().unwrap();
    assert_eq!(l.ledger_id_made().unwrap().as_deref(), Some(id.as_str()));
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    let s = sub(1);
    l.record(&[item(&s, "1-0")], "c", STREAM).unwrap();
    assert_eq!(l.ledger_id().unwrap(), id);
    assert_eq!(l.clone().ledger_id().unwrap(), id);
    assert_ne!(L::fresh(OnConflict::Record).ledger_id().unwrap(), id);
}

fn audit_records_read_back_in_seq_order_from_where_asked<L: Subject>() {
    // All, from a seq, from a time: each the tail of one chain; an error from `f` stops the walk.
    let l = L::fresh(OnConflict::Record);
    let (s1, s2, s3, s4) = (sub(1), sub(2), sub(3), sub(4));
    l.record(&[item(&s1, "1-0"), item(&s2, "2-0")], "c", STREAM)
        .unwrap();
    tick();
    l.record(&[item(&s3, "3-0"), item(&s4, "4-0")], "c", STREAM)
        .unwrap();
    let all = records(&l, &Since::All);
    assert_eq!(seqs(&all), [1, 2, 3, 4]);
    assert_eq!(records(&l, &Since::Seq(2)), all[1..]);
    let past = chain(&l, &Since::All).last().unwrap().seq + 1;
    assert_eq!(chain(&l, &Since::Seq(past)), vec![]);
    let second_batch = Since::Time(all[2].recorded_at.clone());
    assert_eq!(records(&l, &second_batch), all[2..]);

    let mut seen = 0;
    let stopped = l.for_each_record(&Since::All, &mut |_| {
        seen += 1;
        if seen == 2 {
            Err(claimgate::Error::Other("enough".into()))
        } else {
            Ok(())
        }
    });
    assert!(matches!(stopped, Err(claimgate::Error::Other(m)) if m == "enough"));
    assert_eq!(seen, 2);
}

fn dead_letter_records_read_back_alone_and_in_seq_order<L: Subject>() {
    // Exactly the `dead_letter` records of the whole walk, in its order, among processed,
    // duplicate, conflict and held records; an error from `f` stops the walk.
    let l = L::fresh(OnConflict::Hold);
    let (s1, s2, c1) = (sub(1), sub(2), conflicting(1));
    l.record(&[dead("1-0"), item(&s1, "2-0"), dead("3-0")], "c", STREAM)
        .unwrap();
    l.record(
        &[item(&s1, "4-0"), item(&c1, "5-0"), item(&s2, "6-0")],
        "c",
        STREAM,
    )
    .unwrap();
    l.record(&[dead("7-0")], "c", STREAM).unwrap();
    let all = records(&l, &Since::All);
    let expected: Vec<Record> = all
        .iter()
        .filter(|r| r.kind == Kind::DeadLetter)
        .cloned()
        .collect();
    let entries: Vec<&str> = expected
        .iter()
        .map(|r| r.stream_entry_id.as_deref().unwrap())
        .collect();
    assert_eq!(entries, ["1-0", "3-0", "5-0", "7-0"], "{:?}", kinds(&all));
    let mut read = Vec::new();
    l.for_each_dead_letter(&mut |r| {
        read.push(r);
        Ok(())
    })
    .unwrap();
    assert_eq!(read, expected);

    let mut seen = 0;
    let stopped = l.for_each_dead_letter(&mut |_| {
        seen += 1;
        Err(claimgate::Error::Other("enough".into()))
    });
    assert!(matches!(stopped, Err(claimgate::Error::Other(m)) if m == "enough"));
    assert_eq!(seen, 1);
}

/// The counts `stats` should give, worked out from the audit records and `verify` alone: every
/// claim, disbursement and dead-letter row has exactly one record of its kind (the ledger's
/// invariants), and a purge removes them together.
fn recount(l: &(impl Ledger + AuditLog + Inspect)) -> Stats {
    let recs = records(l, &Since::All);
    let of = |kind: Kind| recs.iter().filter(|r| r.kind == kind).count() as u64;
    let summary = l.verify().unwrap();
    Stats {
        claims: of(Kind::Processed),
        disbursements: of(Kind::Processed),
        disbursed_cents_total: recs
            .iter()
            .filter(|r| r.kind == Kind::Processed)
            .map(|r| i128::from(r.amount_cents.unwrap()))
            .sum(),
        outbox_backlog: of(Kind::Processed),
        outbox_oldest_age_s: None,
        dead_letters: of(Kind::DeadLetter),
        duplicates_suppressed: of(Kind::Duplicate),
        conflicts: of(Kind::Conflict),
        vanished: of(Kind::Vanished),
        audit_records: recs.len() as u64,
        tombstones: summary.tombstones,
    }
}

fn stats_asked_again_and_again_agree_with_a_recount_through_every_kind_of_change<L: Subject>() {
    // One ledger handle asked for its counts after each change (SQLite counts only what was
    // added since it was last asked, and starts again after a purge): a batch of new claims, a
    // duplicate and a dead letter; a conflicting resubmission and a vanished entry; a purge of
    // the first batch; a batch after the purge, with a purged submission again. Each time the
    // counts equal a recount from the records and `verify`.
    let l = L::fresh(OnConflict::Record);
    let (s1, s2, s3, c1) = (sub(1), sub(2), sub(3), conflicting(1));
    let gone = Item::Vanished {
        entry_id: "6-0",
        reason: "was deleted from the stream while pending",
    };
    assert_eq!(counts(&l), recount(&l), "empty");
    l.record(
        &[
            item(&s1, "1-0"),
            item(&s1, "2-0"),
            dead("3-0"),
            item(&s2, "4-0"),
        ],
        "c",
        STREAM,
    )
    .unwrap();
    assert_eq!(counts(&l), recount(&l), "first batch");
    tick();
    l.record(&[item(&c1, "5-0"), gone], "c", STREAM).unwrap();
    let st = counts(&l);
    assert_eq!(st, recount(&l), "conflict and vanished");
    assert_eq!(
        (
            st.claims,
            st.duplicates_suppressed,
            st.conflicts,
            st.vanished,
            st.dead_letters
        ),
        (3, 1, 1, 1, 1)
    );
    l.purge_through(4, "2026-11-30T00:00:00.000000Z");
    let st = counts(&l);
    assert_eq!(st, recount(&l), "after the purge");
    assert_eq!((st.claims, st.tombstones, st.dead_letters), (1, 2, 0));
    tick();
    l.record(&[item(&s3, "7-0"), item(&s2, "8-0")], "c", STREAM)
        .unwrap();
    let st = counts(&l);
    assert_eq!(
        st,
        recount(&l),
        "after the purge, a new claim and a purged one again"
    );
    assert_eq!((st.claims, st.duplicates_suppressed), (2, 1));
}

fn a_conflicting_resubmission_is_paid_and_linked_under_record<L: Subject>() {
    // Same award and time, other payload: paid, with a conflict record naming the earlier key.
    let l = L::fresh(OnConflict::Record);
    let (s1, c1, s2, c2) = (sub(1), conflicting(1), sub(2), conflicting(2));
    l.record(&[item(&s1, "1-0")], "c", STREAM).unwrap();
    let t1 = records(&l, &Since::All)[0].recorded_at.clone();
    tick();
    // The second pair conflicts inside one batch: the earlier item's claim is already seen.
    let out = l
        .record(
            &[item(&c1, "2-0"), item(&s2, "3-0"), item(&c2, "4-0")],
            "c",
            STREAM,
        )
        .unwrap();
    let other = |s: &Submission| Outcome::ProcessedConflicting {
        other_key: s.key.to_hex(),
    };
    assert_eq!(out, vec![other(&s1), Outcome::Processed, other(&s2)]);
    let recs = records(&l, &Since::All);
    use Kind::*;
    assert_eq!(
        kinds(&recs),
        [Processed, Processed, Conflict, Processed, Processed, Conflict]
    );
    assert_eq!(
        recs[2].detail,
        Some(format!(
            "conflicts with key {} (claimed at {t1}): same award_id and submission instant, \
             different payload; paid (--on-conflict record)",
            s1.key.to_hex()
        ))
    );
    assert_eq!(recs[2].idempotency_key, Some(c1.key.to_hex()));
    assert_eq!(recs[2].amount_cents, Some(901));
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.conflicts), (4, 4, 2));
    assert_eq!(st.disbursed_cents_total, 101 + 901 + 102 + 902);
    l.verify().unwrap();
}

fn every_claim_of_a_crowded_group_is_found_again<L: Subject>() {
    // Ten submissions of one award at one time, each paid under record; then all of them again
    // with an eleventh. A ledger that reads a group's claims a few at a time (PostgreSQL reads
    // eight) must still find every one of the ten: a key it missed would be claimed twice.
    let l = L::fresh(OnConflict::Record);
    let crowd: Vec<Submission> = (0..11).map(crowded).collect();
    let entries: Vec<String> = (0..crowd.len()).map(|j| format!("{}-0", j + 1)).collect();
    for (s, e) in crowd[..10].iter().zip(&entries) {
        l.record(&[item(s, e)], "c", STREAM).unwrap();
    }
    let first = Outcome::ProcessedConflicting {
        other_key: crowd[0].key.to_hex(),
    };
    // Latest first, so the keys past any read of the earliest are asked before the rest.
    let again: Vec<Item<'_>> = crowd
        .iter()
        .zip(&entries)
        .rev()
        .map(|(s, e)| item(s, e))
        .collect();
    let out = l.record(&again, "c", STREAM).unwrap();
    assert_eq!(out[0], first, "the new one conflicts with the earliest");
    for (j, o) in out[1..].iter().enumerate() {
        assert!(
            matches!(
                o,
                Outcome::Duplicate {
                    purged_at: None,
                    ..
                }
            ),
            "submission {} of the crowd: {o:?}",
            9 - j
        );
    }
    let st = counts(&l);
    assert_eq!(
        (
            st.claims,
            st.disbursements,
            st.conflicts,
            st.duplicates_suppressed
        ),
        (11, 11, 10, 10)
    );
    assert_eq!(
        st.disbursed_cents_total,
        (0..11).map(|j| 1000 + j as i128).sum::<i128>()
    );
    l.verify().unwrap();
}

/// Submission `j` of a crowd: one award and one time, payload `j` (amount `1000 + j`).
fn crowded(j: usize) -> Submission {
    let payload = format!(
        r#"{{"award_id":"A-CROWD","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{}}}"#,
        1000 + j
    );
    parse_payload(payload.as_bytes(), MAX).unwrap()
}

fn a_conflicting_resubmission_is_held_once_per_entry_under_hold<L: Subject>() {
    // Under hold a conflicting resubmission is neither claimed nor paid, and held once per entry.
    let l = L::fresh(OnConflict::Hold);
    let (s1, c1) = (sub(1), conflicting(1));
    l.record(&[item(&s1, "1-0")], "c", STREAM).unwrap();
    let before = counts(&l);
    let out = l
        .record(
            &[
                item(&c1, "2-0"),
                item(&c1, "2-0"),
                item(&c1, "3-0"),
                item(&s1, "4-0"),
            ],
            "c",
            STREAM,
        )
        .unwrap();
    let held = |first| Outcome::Held {
        other_key: s1.key.to_hex(),
        first,
    };
    let t1 = records(&l, &Since::All)[0].recorded_at.clone();
    assert_eq!(
        out,
        vec![
            held(true),
            held(false),
            held(true),
            Outcome::Duplicate {
                first_claimed_at: t1.clone(),
                purged_at: None,
            }
        ]
    );
    let recs = records(&l, &Since::All);
    use Kind::*;
    assert_eq!(
        kinds(&recs),
        [Processed, Conflict, DeadLetter, Conflict, DeadLetter, Duplicate]
    );
    let reason = format!(
        "conflicts with key {} for the same award and submission time; held for review",
        s1.key.to_hex()
    );
    assert_eq!(recs[2].detail, Some(format!("conflict_hold: {reason}")));
    assert!(recs[1]
        .detail
        .as_deref()
        .unwrap()
        .ends_with("; held for review, not paid (--on-conflict hold)"));
    let st = counts(&l);
    assert_eq!(
        (st.claims, st.disbursements),
        (before.claims, before.disbursements)
    );
    assert_eq!(st.disbursed_cents_total, before.disbursed_cents_total);
    assert_eq!((st.dead_letters, st.conflicts), (2, 2));
    l.verify().unwrap();
}

fn the_disbursed_total_is_exact_past_i64<L: Subject>() {
    // Amounts of i64::MAX (possible with the amount limit raised to it, or in a ledger written
    // before the limit existed) sum past i64: stats gives the exact figure, never an error.
    let l = L::fresh(OnConflict::Record);
    let huge: Vec<Submission> = (0..3)
        .map(|i| {
            let payload = format!(
                r#"{{"award_id":"H-{i}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{}}}"#,
                i64::MAX - i
            );
            parse_payload(payload.as_bytes(), MAX).unwrap()
        })
        .collect();
    let items: Vec<Item<'_>> = huge.iter().map(|s| item(s, "1-0")).collect();
    l.record(&items, "c", STREAM).unwrap();
    let st = counts(&l);
    assert_eq!(st.disbursements, 3);
    assert_eq!(st.disbursed_cents_total, 3 * i128::from(i64::MAX) - 3);
    l.verify().unwrap();
}

/// One award at one instant, spelled four ways: four keys, one instant.
const SPELLINGS: [&str; 4] = [
    "2026-07-01T09:00:00Z",
    "2026-07-01T11:00:00+02:00",
    "2026-07-01t09:00:00z",
    "2026-07-01T09:00:00.000Z",
];

/// Award `I-1` at `timestamp`, 500 cents.
fn at(timestamp: &str) -> Submission {
    let payload =
        format!(r#"{{"award_id":"I-1","submission_timestamp":"{timestamp}","amount_cents":500}}"#);
    parse_payload(payload.as_bytes(), MAX).unwrap()
}

fn one_instant_spelled_four_ways_is_one_conflict_each_under_record<L: Subject>() {
    // Different spellings are different submissions (different keys, each paid), but each
    // later one conflicts with the first claim at that instant; another instant does not, and
    // the same spelling again is a duplicate.
    let l = L::fresh(OnConflict::Record);
    let subs: Vec<Submission> = SPELLINGS.iter().map(|t| at(t)).collect();
    let later = at("2026-07-01T09:00:00.000000001Z");
    let first = l.record(&[item(&subs[0], "1-0")], "c", STREAM).unwrap();
    assert_eq!(first, vec![Outcome::Processed]);
    let items: Vec<Item<'_>> = subs[1..]
        .iter()
        .chain([&later, &subs[2]])
        .map(|s| item(s, "2-0"))
        .collect();
    let out = l.record(&items, "c", STREAM).unwrap();
    let conflicting = Outcome::ProcessedConflicting {
        other_key: subs[0].key.to_hex(),
    };
    assert_eq!(&out[..3], &vec![conflicting; 3][..]);
    assert_eq!(
        out[3],
        Outcome::Processed,
        "a nanosecond later is another instant"
    );
    assert!(matches!(out[4], Outcome::Duplicate { .. }));
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.conflicts), (5, 5, 3));
    let recs = records(&l, &Since::All);
    let conflicts: Vec<&Record> = recs.iter().filter(|r| r.kind == Kind::Conflict).collect();
    for (r, s) in conflicts.iter().zip(&subs[1..]) {
        assert_eq!(r.idempotency_key, Some(s.key.to_hex()));
    }
    l.verify().unwrap();
}

fn one_instant_spelled_four_ways_is_held_after_the_first_under_hold<L: Subject>() {
    // Under hold only the first spelling is paid; each later spelling is held for review.
    let l = L::fresh(OnConflict::Hold);
    let subs: Vec<Submission> = SPELLINGS.iter().map(|t| at(t)).collect();
    let ids = ["1-0", "2-0", "3-0", "4-0"];
    let items: Vec<Item<'_>> = subs.iter().zip(ids).map(|(s, id)| item(s, id)).collect();
    let out = l.record(&items, "c", STREAM).unwrap();
    let held = Outcome::Held {
        other_key: subs[0].key.to_hex(),
        first: true,
    };
    assert_eq!(
        out,
        vec![Outcome::Processed, held.clone(), held.clone(), held]
    );
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements), (1, 1));
    assert_eq!((st.conflicts, st.dead_letters), (3, 3));
    assert_eq!(st.disbursed_cents_total, 500);
    l.verify().unwrap();
}

fn a_vanished_entry_leaves_a_record_and_nothing_else<L: Subject>() {
    // An entry gone from the stream while pending: one `vanished` record (entry id, consumer,
    // time) per item, in item order among the batch's other records; nothing claimed, paid or
    // dead-lettered for it; counted in stats; the chain verifies.
    let l = L::fresh(OnConflict::Record);
    let s = sub(1);
    let gone = |id| Item::Vanished {
        entry_id: id,
        reason: "was deleted from the stream while pending",
    };
    let out = l
        .record(
            &[gone("7-0"), item(&s, "8-0"), gone("9-0")],
            "reader-a",
            STREAM,
        )
        .unwrap();
    assert_eq!(
        out,
        vec![Outcome::Vanished, Outcome::Processed, Outcome::Vanished]
    );
    let recs = records(&l, &Since::All);
    assert_eq!(
        kinds(&recs),
        [Kind::Vanished, Kind::Processed, Kind::Vanished]
    );
    for (r, id) in [(&recs[0], "7-0"), (&recs[2], "9-0")] {
        assert_eq!(r.stream_entry_id.as_deref(), Some(id));
        assert_eq!(r.consumer.as_deref(), Some("reader-a"));
        assert_eq!(r.recorded_at, recs[1].recorded_at);
        assert_eq!(
            r.detail.as_deref(),
            Some("grants:submissions was deleted from the stream while pending")
        );
        assert_eq!((r.idempotency_key.as_ref(), r.amount_cents), (None, None));
    }
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.dead_letters), (1, 1, 0));
    assert_eq!((st.vanished, st.audit_records), (2, 3));
    let summary = l.verify().unwrap();
    assert_eq!(summary.audit_records, 3);
}

fn verify_summarises_a_clean_ledger<L: Subject>() {
    // A clean ledger verifies, counting what was recorded, its head the last record's hash.
    let l = L::fresh(OnConflict::Record);
    l.ping().unwrap();
    assert!(!l.describe().is_empty());
    let empty = l.verify().unwrap();
    assert_eq!((empty.claims, empty.audit_records), (0, 0));
    assert_eq!(empty.head_hash, claimgate::domain::audit::GENESIS_HASH);
    let (s1, s2) = (sub(1), sub(2));
    l.record(
        &[
            item(&s1, "1-0"),
            item(&s2, "2-0"),
            item(&s1, "3-0"),
            dead("4-0"),
        ],
        "c",
        STREAM,
    )
    .unwrap();
    let summary = l.verify().unwrap();
    let recs = chain(&l, &Since::All);
    // Four records of what happened; a shared ledger adds the batch's link after them.
    assert_eq!(recs.len(), chain_len::<L>(4, 1));
    assert_eq!(
        summary,
        Summary {
            claims: 2,
            disbursements: 2,
            outbox_rows: 2,
            audit_records: 4,
            tombstones: 0,
            head_hash: recs.last().unwrap().hash.clone(),
            unlinked_batches: 0,
        }
    );
    assert_eq!(claimgate::domain::audit::verify_chain(&recs), Ok(4));
}

fn a_purged_claim_stays_a_duplicate_forever_through_its_tombstone<L: Subject>() {
    // A purge leaves a key-only tombstone per claim; a later delivery of a purged submission,
    // plain or as a fast-filter hit, is a duplicate citing it and pays nothing.
    // 1. Two submissions and a dead letter; purge all three records.
    // 2. Claims, disbursements and the dead-letter row are gone; two tombstones remain; verify
    //    passes and counts them.
    // 3. Both purged submissions again (one as a known duplicate) and a new one: two
    //    duplicates naming the claim time and the purge time, one payment.
    let l = L::fresh(OnConflict::Record);
    let (s1, s2, s3) = (sub(1), sub(2), sub(3));
    l.record(
        &[item(&s1, "1-0"), item(&s2, "2-0"), dead("3-0")],
        "c",
        STREAM,
    )
    .unwrap();
    let claimed_at = records(&l, &Since::All)[0].recorded_at.clone();
    let purged_at = "2026-11-30T00:00:00.000000Z";
    let removed = l.purge_through(3, purged_at);
    assert_eq!((removed.claims, removed.dead_letters), (2, 1));
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.dead_letters), (0, 0, 0));
    assert_eq!(st.tombstones, 2);
    assert_eq!(l.verify().unwrap().tombstones, 2);

    tick();
    let out = l
        .record(
            &[
                item(&s1, "4-0"),
                known(&s2, "5-0", "2026-07-01T10:00:00.000000Z"),
                item(&s3, "6-0"),
            ],
            "c",
            STREAM,
        )
        .unwrap();
    let purged = Outcome::Duplicate {
        first_claimed_at: claimed_at.clone(),
        purged_at: Some(purged_at.into()),
    };
    assert_eq!(out, vec![purged.clone(), purged, Outcome::Processed]);
    let recs = records(&l, &Since::All);
    assert_eq!(
        kinds(&recs),
        [
            Kind::Checkpoint,
            Kind::Duplicate,
            Kind::Duplicate,
            Kind::Processed
        ]
    );
    let cites = format!("first claimed at {claimed_at}; claim purged at {purged_at} (tombstone)");
    assert_eq!(recs[1].detail.as_deref(), Some(cites.as_str()));
    let vouched = format!("{cites} (fast filter)");
    assert_eq!(recs[2].detail.as_deref(), Some(vouched.as_str()));
    let st = counts(&l);
    assert_eq!((st.claims, st.disbursements, st.tombstones), (1, 1, 2));
    assert_eq!(st.disbursed_cents_total, 103);
    let summary = l.verify().unwrap();
    assert_eq!((summary.claims, summary.tombstones), (1, 2));
}

// ----- Memory and SQLite side by side -----------------------------------------------------------

/// What one ledger made of a script of batches, with its own times replaced by the batch that
/// wrote them and hashes blanked (they seal those times), so two ledgers can be compared.
#[derive(Debug, PartialEq)]
struct Transcript {
    /// Each batch's outcomes.
    outcomes: Vec<Vec<Outcome>>,
    /// Every audit record.
    records: Vec<Record>,
    /// Every outbox row, all unpublished.
    outbox: Vec<OutboxRow>,
    /// The final counts.
    stats: Stats,
}

fn transcript<L: Subject>(on_conflict: OnConflict, script: &[Vec<Item<'_>>]) -> Transcript {
    let l = L::fresh(on_conflict);
    let mut outcomes = Vec::new();
    let mut times = Vec::new();
    for batch in script {
        let seen = records(&l, &Since::All).len();
        outcomes.push(l.record(batch, "c", STREAM).unwrap());
        let new = records(&l, &Since::All).split_off(seen);
        let t = new[0].recorded_at.clone();
        assert!(new.iter().all(|r| r.recorded_at == t), "one time per batch");
        times.push(t);
        tick();
    }
    let name = |s: &str| {
        let mut s = s.to_owned();
        for (k, t) in times.iter().enumerate() {
            s = s.replace(t, &format!("<batch {k}>"));
        }
        s
    };
    for o in outcomes.iter_mut().flatten() {
        if let Outcome::Duplicate {
            first_claimed_at,
            purged_at,
        } = o
        {
            *first_claimed_at = name(first_claimed_at);
            *purged_at = purged_at.as_deref().map(name);
        }
    }
    // A shared ledger's records are batch members, each also numbered within its batch.
    let records: Vec<Record> = records(&l, &Since::All)
        .into_iter()
        .map(|r| Record {
            recorded_at: name(&r.recorded_at),
            detail: r.detail.as_deref().map(name),
            prev_hash: String::new(),
            hash: String::new(),
            batch_index: None,
            ..r
        })
        .collect();
    let links = chain(&l, &Since::All).len() - records.len();
    assert_eq!(links, chain_len::<L>(0, script.len()));
    l.verify().unwrap();
    Transcript {
        outcomes,
        records,
        outbox: l.rows_after(0, 1000).unwrap(),
        stats: counts(&l),
    }
}

#[test]
fn memory_sqlite_and_postgres_give_the_same_outcomes_and_records_for_the_same_batches() {
    // Every kind of item, under both conflict policies: the three ledgers agree field for field.
    let s: Vec<Submission> = (0..4).map(sub).collect();
    let c: Vec<Submission> = (0..4).map(conflicting).collect();
    let by = "2026-07-01T10:00:00.000000Z";
    let script = vec![
        vec![
            item(&s[1], "1-0"),
            item(&s[2], "2-0"),
            item(&s[1], "3-0"),
            dead("4-0"),
        ],
        vec![
            item(&s[1], "5-0"),
            item(&c[1], "6-0"),
            dead("4-0"),
            known(&s[3], "7-0", by),
        ],
        vec![
            item(&c[1], "6-0"),
            item(&c[1], "8-0"),
            item(&s[3], "9-0"),
            item(&c[3], "10-0"),
            item(&s[2], "2-0"),
        ],
        vec![
            item(&c[2], "11-0"),
            item(&s[0], "12-0"),
            item(&c[0], "12-0"),
        ],
    ];
    for policy in [OnConflict::Record, OnConflict::Hold] {
        let memory = transcript::<MemoryLedger>(policy, &script);
        let sqlite = transcript::<Sqlite>(policy, &script);
        assert_eq!(memory, sqlite, "under {policy:?}");
        let postgres = transcript::<Postgres>(policy, &script);
        assert_eq!(memory, postgres, "PostgreSQL under {policy:?}");
        // Not agreement on nothing: every outcome kind the script aims at occurred.
        let all: Vec<&Outcome> = memory.outcomes.iter().flatten().collect();
        let has = |f: fn(&Outcome) -> bool| all.iter().any(|o| f(o));
        assert!(has(|o| matches!(o, Outcome::Duplicate { .. })));
        assert!(has(|o| matches!(o, Outcome::AlreadyDeadLettered)));
        match policy {
            OnConflict::Record => {
                assert!(has(|o| matches!(o, Outcome::ProcessedConflicting { .. })))
            }
            OnConflict::Hold => assert!(has(|o| matches!(o, Outcome::Held { first: false, .. }))),
        }
    }
}

// ----- SQLite only ------------------------------------------------------------------------------

#[test]
fn sqlite_verify_names_a_planted_inconsistency() {
    // A deleted disbursement, then an edited audit record, each make verify fail naming it.
    // (The in-memory ledger offers no raw access to plant one, so this test is SQLite's alone.)
    let l = Sqlite::fresh(OnConflict::Record);
    let (s1, s2, s3) = (sub(1), sub(2), sub(3));
    l.record(
        &[
            item(&s1, "1-0"),
            item(&s2, "2-0"),
            item(&s3, "3-0"),
            item(&s1, "4-0"),
        ],
        "c",
        STREAM,
    )
    .unwrap();
    l.verify().unwrap();

    let raw = l.raw();
    raw.execute_batch("DELETE FROM disbursements WHERE claim_id = 2")
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(
        err.contains("claim without a disbursement: claim 2"),
        "{err}"
    );

    let l = Sqlite::fresh(OnConflict::Record);
    l.record(&[item(&s1, "1-0"), item(&s1, "2-0")], "c", STREAM)
        .unwrap();
    l.raw()
        .execute_batch("UPDATE audit_log SET detail = 'first claimed never' WHERE seq = 2")
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(err.contains("audit chain broken at seq 2"), "{err}");
}

// ----- PostgreSQL only --------------------------------------------------------------------------

#[test]
fn postgres_verify_names_a_planted_inconsistency() {
    // A deleted disbursement, an edited audit record, and a chain head moved behind the chain
    // (the next batch would fork it) each make verify fail naming what is wrong.
    let l = Postgres::fresh(OnConflict::Record);
    let (s1, s2, s3) = (sub(1), sub(2), sub(3));
    l.record(
        &[
            item(&s1, "1-0"),
            item(&s2, "2-0"),
            item(&s3, "3-0"),
            item(&s1, "4-0"),
        ],
        "c",
        STREAM,
    )
    .unwrap();
    l.verify().unwrap();
    l.raw()
        .batch_execute(
            "DELETE FROM disbursements WHERE claim_id = (SELECT MIN(claim_id) + 1 FROM processed_messages)",
        )
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(err.contains("claim without a disbursement"), "{err}");

    let l = Postgres::fresh(OnConflict::Record);
    l.record(&[item(&s1, "1-0"), item(&s1, "2-0")], "c", STREAM)
        .unwrap();
    // The record at seq 2 is the second member of the batch: its row in `audit_members`.
    l.raw()
        .batch_execute(
            "UPDATE audit_members SET detail = 'first claimed never'
             WHERE (batch_id, batch_index) = (SELECT batch_id, batch_index FROM audit_log
                                              WHERE seq = 2)",
        )
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(err.contains("audit chain broken at seq 2"), "{err}");

    let l = Postgres::fresh(OnConflict::Record);
    l.record(&[item(&s1, "1-0"), item(&s2, "2-0")], "c", STREAM)
        .unwrap();
    l.raw()
        .batch_execute("UPDATE chain_head SET seq = 1")
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(err.contains("chain head"), "{err}");
}

#[test]
fn postgres_a_chain_head_set_back_fails_the_next_link_instead_of_retrying_it_forever() {
    // A link retries when another link took its place first. Someone who can write the ledger
    // sets the head back, so every try collides with a seq given before while the head stays
    // where it was read: the link must fail, naming the collision, not retry for ever; the
    // batch's effects stand (committed before its link) and verify names the edited head.
    let l = Postgres::fresh(OnConflict::Record);
    let (s1, s2, s3) = (sub(1), sub(2), sub(3));
    l.record(&[item(&s1, "1-0"), item(&s2, "2-0")], "c", STREAM)
        .unwrap();
    // Seqs 1..=2 are the first batch's, its link at 2; the next batch's one record would
    // take seq 2 again after a head at 1.
    l.raw()
        .batch_execute("UPDATE chain_head SET seq = 1")
        .unwrap();
    let (done_tx, done) = std::sync::mpsc::channel();
    let ledger = Arc::clone(&l.ledger);
    std::thread::spawn(move || {
        let subs = [s3];
        let outcome = ledger
            .record(&[item(&subs[0], "3-0")], "c", STREAM)
            .map(|o| o.len())
            .map_err(|e| e.to_string());
        done_tx.send(outcome).unwrap();
    });
    let err = done
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the link retried for ever")
        .unwrap_err();
    assert!(err.contains("audit_batches_link_seq_key"), "{err}");
    let mut raw = l.raw();
    let claims: i64 = raw
        .query_one("SELECT COUNT(*) FROM processed_messages", &[])
        .unwrap()
        .get(0);
    assert_eq!(claims, 3, "the batch committed before its link stands");
    let unlinked: i64 = raw
        .query_one(
            "SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(unlinked, 1);
    let err = l.verify().unwrap_err().to_string();
    assert!(err.contains("chain head"), "{err}");
}

#[test]
fn postgres_durable_reads_on_a_pool_of_one_connection_do_not_wait_for_a_second() {
    // Verify, an export's walk and the dead-letter walk hold a snapshot on one pooled
    // connection and make its links durable on a second. With a pool of one, a second taken
    // from the pool never comes: each would wait out the pool's timeout and fail. They must
    // answer, from the same snapshot the ledger holds.
    use claimgate::ledger::{AuditLog, Since};
    let l = Postgres::fresh(OnConflict::Record);
    let mut cfg = crate::support::pg_config(&l.url);
    cfg.pool_size_max = 1;
    let one = PgLedger::open(&cfg).unwrap();
    let (s1, s2) = (sub(1), sub(2));
    one.record(
        &[item(&s1, "1-0"), item(&s2, "2-0"), item(&s1, "3-0")],
        "c",
        STREAM,
    )
    .unwrap();
    let began = std::time::Instant::now();
    let summary = one.verify().unwrap();
    assert_eq!(summary.claims, 2, "{summary:?}");
    let mut kinds = Vec::new();
    one.for_each_record(&Since::All, &mut |r| {
        kinds.push(r.kind.as_str().to_owned());
        Ok(())
    })
    .unwrap();
    assert_eq!(kinds, ["processed", "processed", "duplicate", "batch"]);
    let mut dead = 0;
    one.for_each_dead_letter(&mut |_| {
        dead += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(dead, 0);
    // The pool's one connection was handed back: an ordinary read still gets it.
    assert_eq!(one.stats().unwrap().claims, 2);
    eprintln!(
        "three durable reads on a pool of one: {:?}",
        began.elapsed()
    );
}

#[test]
fn postgres_a_batch_probes_the_claims_by_index_and_never_scans_them() {
    // On a ledger of 48,000 claims, with fresh statistics, a batch of 4,000 (half of them
    // resends) reads `processed_messages` by index only: its sequential-scan counter does not
    // move. A lookup the planner turned into a hash join scanned the whole table once per
    // batch, so a batch's cost grew with the ledger.
    const LEDGER: usize = 48_000;
    const CHUNK: usize = 4_000;
    let l = Postgres::fresh(OnConflict::Record);
    let subs: Vec<Submission> = (0..LEDGER + CHUNK / 2).map(sub).collect();
    let ids: Vec<String> = (0..LEDGER + CHUNK).map(|i| format!("{i}-0")).collect();
    for first in (0..LEDGER).step_by(CHUNK) {
        let batch: Vec<Item<'_>> = (first..first + CHUNK)
            .map(|i| item(&subs[i], &ids[i]))
            .collect();
        l.record(&batch, "c", STREAM).unwrap();
    }
    let mut raw = l.raw();
    raw.batch_execute("ANALYZE processed_messages, claim_tombstones")
        .unwrap();
    // Counters of the ledger's own connections reach the statistics when those end, which is
    // before they leave pg_stat_activity.
    let url = l.url.clone();
    drop(l);
    let alone = |raw: &mut ::postgres::Client| {
        crate::support::wait_for(std::time::Duration::from_secs(20), || {
            let others: i64 = raw
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    &[],
                )
                .unwrap()
                .get(0);
            others == 0
        })
    };
    assert!(alone(&mut raw), "the ledger's connections did not end");
    let scans = |raw: &mut ::postgres::Client| -> (i64, i64) {
        let row = raw
            .query_one(
                "SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables
                 WHERE relname = 'processed_messages'",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let before = scans(&mut raw);
    let ledger = PgLedger::open(&crate::support::pg_config(&url)).unwrap();
    // Resends of the last 2,000 claims, then 2,000 new submissions.
    let batch: Vec<Item<'_>> = (LEDGER - CHUNK / 2..LEDGER + CHUNK / 2)
        .map(|i| item(&subs[i], &ids[LEDGER + i % CHUNK]))
        .collect();
    let outcomes = ledger.record(&batch, "c", STREAM).unwrap();
    let duplicates = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Duplicate { .. }))
        .count();
    assert_eq!(duplicates, CHUNK / 2);
    drop(ledger);
    assert!(alone(&mut raw), "the ledger's connections did not end");
    let after = scans(&mut raw);
    assert!(
        after.1 >= before.1 + (CHUNK / 2) as i64,
        "the batch's index probes are not in the statistics: {before:?} {after:?}"
    );
    assert_eq!(
        after.0, before.0,
        "the batch scanned the claims table (seq_scan, idx_scan before {before:?}, after {after:?})"
    );
}

#[test]
fn postgres_batches_from_many_connections_number_outbox_rows_in_commit_order() {
    // Contract point 5 under real concurrency: eight writers commit batches while a reader
    // polls `rows_after` the way a relay does (all rows above its position). A row below the
    // highest id the reader has seen must never appear later; a sequence-numbered outbox
    // fails this within a few hundred batches.
    const WRITERS: usize = 8;
    const PER_WRITER: usize = 150;
    let l = Postgres::fresh(OnConflict::Record);
    let subs: Vec<Submission> = (0..WRITERS * PER_WRITER).map(sub).collect();
    let entries: Vec<String> = (0..subs.len()).map(|i| format!("{i}-0")).collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    let late = std::thread::scope(|scope| {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (l, subs, entries) = (l.clone(), &subs, &entries);
            writers.push(scope.spawn(move || {
                for i in (w * PER_WRITER..(w + 1) * PER_WRITER).step_by(3) {
                    let items: Vec<Item<'_>> = (i..(i + 3).min((w + 1) * PER_WRITER))
                        .map(|j| item(&subs[j], &entries[j]))
                        .collect();
                    l.record(&items, &format!("w{w}"), STREAM).unwrap();
                }
            }));
        }
        let reader = {
            let (l, done) = (l.clone(), &done);
            scope.spawn(move || {
                let mut seen_max = 0;
                let mut seen = std::collections::HashSet::new();
                let mut late = 0;
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    for row in l.rows_after(0, 100_000).unwrap() {
                        if seen.insert(row.id) && row.id < seen_max {
                            late += 1;
                        }
                        seen_max = seen_max.max(row.id);
                    }
                    if finished {
                        return (late, seen.len());
                    }
                }
            })
        };
        // The reader stops once every writer has returned: a batch's outbox rows get their ids
        // when it is linked, after its commit (its claims count before that), and `record`
        // returns after the link. A deadline, and the reader stopped before anything is
        // asserted: a writer that panicked or hung must fail the test, not leave the scope
        // waiting on the reader for ever.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !writers.iter().all(|w| w.is_finished()) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let seen = reader.join().unwrap();
        assert!(
            writers.iter().all(|w| w.is_finished()),
            "writers still busy after 120 s"
        );
        for w in writers {
            w.join().unwrap();
        }
        seen
    });
    assert_eq!(late.1, subs.len(), "the reader saw every row");
    assert_eq!(late.0, 0, "rows appeared below an id already seen");
    let ids: Vec<i64> = l
        .rows_after(0, 100_000)
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, (1..=subs.len() as i64).collect::<Vec<_>>());
    l.verify().unwrap();
}

#[test]
fn postgres_runs_one_retention_purge_at_a_time() {
    // Two handles on one database (two nodes): while the first holds a purge session, the
    // second's purge is refused, naming why; once the first handle is gone, it may run.
    use claimgate::ledger::Retention;
    let a = Postgres::fresh(OnConflict::Record);
    let cfg = crate::support::pg_config(&a.url);
    let b = PgLedger::open(&cfg).unwrap();
    let cutoff = "2020-01-01T00:00:00.000000Z";
    let mut admit = |_: &claimgate::ledger::PurgePlan| Ok(());
    let mut row = |_: &serde_json::Value| Ok(());
    assert_eq!(
        a.ledger
            .export_purge(cutoff, 10, &mut admit, &mut row)
            .unwrap(),
        None,
        "nothing that old, but the session (and its lock) is held"
    );
    let refused = b
        .export_purge(cutoff, 10, &mut admit, &mut row)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("another retention purge is running"),
        "{refused}"
    );
    drop(a);
    assert_eq!(
        b.export_purge(cutoff, 10, &mut admit, &mut row).unwrap(),
        None
    );
}

// ----- Legal holds' records: SQLite and PostgreSQL (the memory ledger has no holds) ----------

/// Holds leave chained records (contract point 4): a placed and a lifted hold each append one
/// record in the transaction that changes the hold, a repeated one writes nothing, batches
/// continue the chain after them, and a purge of them leaves the outbox id counter alone.
fn holds_leave_chained_records<L: Subject>(l: &L, holds: &dyn Retention) {
    // 1. Two payments, then hold add (twice) and hold remove (twice) on award A-000001.
    // 2. Exactly two records, hold_added and hold_removed, worded by `detail`, seq 3 and 4
    //    (on a ledger that links batches, each a batch of its own after the payments' batch);
    //    the repeats return false and add nothing.
    // 3. A third payment chains after them; the chain and `verify` pass.
    // 4. Purge through the hold_removed record: outbox_id_max is still 3, only id 3 is
    //    unpublished.
    let (s1, s2, s3) = (sub(1), sub(2), sub(3));
    l.record(&[item(&s1, "1-0"), item(&s2, "2-0")], "c", STREAM)
        .unwrap();
    let (placed, lifted) = ("2026-11-01T00:00:00.000000Z", "2026-11-02T00:00:00.000000Z");
    assert!(holds.hold_add("A-000001", "case 7", placed).unwrap());
    assert!(!holds.hold_add("A-000001", "case 8", lifted).unwrap());
    assert_eq!(holds.holds().unwrap().len(), 1);
    assert!(holds.hold_remove("A-000001", lifted).unwrap());
    assert!(!holds.hold_remove("A-000001", lifted).unwrap());
    assert!(holds.holds().unwrap().is_empty());
    let recs = records(l, &Since::All);
    assert_eq!(
        kinds(&recs),
        [
            Kind::Processed,
            Kind::Processed,
            Kind::HoldAdded,
            Kind::HoldRemoved
        ]
    );
    let expected = [1, 2, 3, 4, 5];
    assert_eq!(seqs(&recs), expected[..4]);
    let (added, removed) = (&recs[2], &recs[3]);
    assert_eq!(added.award_id.as_deref(), Some("A-000001"));
    assert_eq!(added.detail, Some(detail::hold_added("case 7")));
    assert_eq!(added.recorded_at, placed);
    assert_eq!(removed.detail, Some(detail::hold_removed("case 7", placed)));
    assert_eq!(removed.recorded_at, lifted);

    l.record(&[item(&s3, "3-0")], "c", STREAM).unwrap();
    let recs = records(l, &Since::All);
    assert_eq!(recs[4].seq, expected[4]);
    let all = chain(l, &Since::All);
    assert_eq!(all.len(), chain_len::<L>(5, 4));
    assert_eq!(claimgate::domain::audit::verify_chain(&all), Ok(5));
    assert_eq!(l.verify().unwrap().audit_records, 5);

    assert_eq!(l.outbox_id_max().unwrap(), 3);
    l.purge_through(expected[3], "2026-11-30T00:00:00.000000Z");
    assert_eq!(
        l.outbox_id_max().unwrap(),
        3,
        "a purge leaves the id counter"
    );
    let ids: Vec<i64> = l.rows_after(0, 10).unwrap().iter().map(|r| r.id).collect();
    assert_eq!(ids, [3]);
    assert_eq!(l.verify().unwrap().tombstones, 2);
}

#[test]
fn sqlite_holds_leave_chained_records() {
    let l = Sqlite::fresh(OnConflict::Record);
    holds_leave_chained_records(&l, &*l.ledger.clone());
}

#[test]
fn postgres_holds_leave_chained_records() {
    let l = Postgres::fresh(OnConflict::Record);
    holds_leave_chained_records(&l, &*l.ledger.clone());
}

// ----- PostgreSQL: tombstones under concurrency, and verify's evidence checks ----------------

#[test]
fn postgres_a_purge_racing_resubmissions_never_lets_a_key_be_claimed_again() {
    // Contract point 6 with several writers: while one connection purges every claim (one
    // purge batch: claims deleted, tombstones written, in one transaction), four writers keep
    // resubmitting the same submissions. Each read of a key sees its claim or its tombstone,
    // never neither, so every resubmission is a duplicate and nothing is claimed or paid
    // again. Writers stop only after seeing tombstones, so the race window is crossed. Four
    // rounds, each on a fresh ledger: reading claims and tombstones in two statements instead
    // of one failed this test in one run of three with a single round.
    for _ in 0..4 {
        purge_race_round();
    }
}

/// One round of the test above.
fn purge_race_round() {
    const KEYS: usize = 300;
    const WRITERS: usize = 4;
    let l = Postgres::fresh(OnConflict::Record);
    let subs: Vec<Submission> = (0..KEYS).map(sub).collect();
    for (n, chunk) in subs.chunks(50).enumerate() {
        let entries: Vec<String> = (0..chunk.len()).map(|i| format!("{n}-{i}")).collect();
        let items: Vec<Item<'_>> = chunk
            .iter()
            .zip(&entries)
            .map(|(s, e)| item(s, e))
            .collect();
        l.record(&items, "c", STREAM).unwrap();
    }
    let last = records(&l, &Since::All).last().unwrap().seq;
    let purged = std::sync::atomic::AtomicBool::new(false);
    let (before, after) = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (l, subs, purged) = (l.clone(), &subs, &purged);
                scope.spawn(move || {
                    let (mut cited_claim, mut cited_tombstone) = (0, 0);
                    let mut round = 0;
                    // Rounds of 25 keys, each writer starting elsewhere, until two whole
                    // rounds after the purge committed.
                    let mut rounds_after = 0;
                    // A purge that failed (the main thread panicked) never sets `purged`: the
                    // deadline turns that into this writer's failure instead of a hang.
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
                    while rounds_after < 2 {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "the purge did not commit within two minutes"
                        );
                        if purged.load(std::sync::atomic::Ordering::SeqCst) {
                            rounds_after += 1;
                        }
                        let start = (w * 75 + round * 25) % KEYS;
                        let entries: Vec<String> =
                            (0..25).map(|i| format!("w{w}r{round}-{i}")).collect();
                        let items: Vec<Item<'_>> = (0..25)
                            .map(|i| item(&subs[(start + i) % KEYS], &entries[i]))
                            .collect();
                        for o in record_offering_again(&l, &items, &format!("w{w}")).0 {
                            match o {
                                Outcome::Duplicate {
                                    purged_at: None, ..
                                } => cited_claim += 1,
                                Outcome::Duplicate {
                                    purged_at: Some(_), ..
                                } => cited_tombstone += 1,
                                other => panic!("a purged key was {other:?}"),
                            }
                        }
                        round += 1;
                    }
                    (cited_claim, cited_tombstone)
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let removed = l.purge_through(last, "2026-11-30T00:00:00.000000Z");
        assert_eq!(removed.claims, KEYS as u64);
        purged.store(true, std::sync::atomic::Ordering::SeqCst);
        writers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    assert!(before > 0, "writers ran before the purge committed");
    assert!(after > 0, "writers ran after it");
    let st = counts(&l);
    assert_eq!(
        (st.claims, st.disbursements),
        (0, 0),
        "nothing claimed again"
    );
    assert_eq!(st.tombstones, KEYS as u64);
    assert_eq!(
        l.outbox_id_max().unwrap(),
        KEYS as i64,
        "nothing paid again"
    );
    let summary = l.verify().unwrap();
    assert_eq!((summary.claims, summary.tombstones), (0, KEYS as u64));
}

#[test]
fn postgres_verify_names_a_claimed_tombstone_an_unbacked_duplicate_and_a_lost_dead_letter() {
    // The three evidence checks, each on a fresh ledger with one planted fault, in SQLite's
    // words: a tombstone planted for a claimed key; a claim (with its payment and processed
    // record) deleted behind its duplicate record; a dead_letters row deleted.
    let (s1, s2) = (sub(1), sub(2));

    let l = Postgres::fresh(OnConflict::Record);
    l.record(&[item(&s1, "1-0"), item(&s2, "2-0")], "c", STREAM)
        .unwrap();
    l.raw()
        .batch_execute(&format!(
            "INSERT INTO claim_tombstones VALUES ('\\x{}', 'then', 'now')",
            s2.key.to_hex()
        ))
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "key claimed after its claim was purged: key {} is claimed",
            s2.key.to_hex()
        )),
        "{err}"
    );

    let l = Postgres::fresh(OnConflict::Record);
    l.record(&[item(&s1, "1-0"), item(&s1, "2-0")], "c", STREAM)
        .unwrap();
    l.raw()
        .batch_execute(
            "DELETE FROM outbox_rows; DELETE FROM disbursements; DELETE FROM processed_messages;
             DELETE FROM audit_members WHERE kind = 'processed';",
        )
        .unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "duplicate record without a claim or tombstone: audit record 2 (duplicate, key {}) \
             names a key with no claim and no tombstone",
            s1.key.to_hex()
        )),
        "{err}"
    );

    let l = Postgres::fresh(OnConflict::Record);
    l.record(&[item(&s1, "1-0"), dead("3-0")], "c", STREAM)
        .unwrap();
    l.verify().unwrap();
    l.raw().batch_execute("DELETE FROM dead_letters").unwrap();
    let err = l.verify().unwrap_err().to_string();
    assert!(
        err.contains(
            "dead letters and dead_letter records disagree: stream entry 3-0 has 0 \
             dead_letters rows but 1 dead_letter records"
        ),
        "{err}"
    );
}

#[test]
fn postgres_verify_names_every_tampering_of_the_batch_tables() {
    // Two batches (3 and 2 submissions, seqs 1..=3 and 4..=5, outbox ids 1..=3 and 4..=5);
    // each tampering on a fresh copy, and verify names it: a batch's outbox ids moved (an id
    // given twice), a row given its own id that the other batch gives, the head's outbox
    // counter lowered below the last id (the next batch would give it again), a member deleted (the chain breaks at the next record), a batch's row
    // deleted (its members belong to no batch), an outbox row renumbered within its batch, a
    // link sealed after another head, a member moved into the other batch, a link's seq moved.
    // (A member deleted is named by the first check it fails: its payment has no record.)
    let cases: [(&str, &str); 9] = [
        (
            "UPDATE chain_head SET outbox_id_last = outbox_id_last - 1",
            "chain head: outbox row 5 is above the head's last outbox id 4",
        ),
        (
            "UPDATE audit_batches SET outbox_first = outbox_first + 1 WHERE batch_id = {first}",
            "outbox id given twice: outbox id 4",
        ),
        (
            // A row's own id that a batch also gives (the schema's rule that a batch's rows
            // have none dropped first): the batches' ranges alone do not overlap.
            "ALTER TABLE outbox_rows DROP CONSTRAINT outbox_rows_placed;
             UPDATE outbox_rows SET id = 4 WHERE batch_id = {first} AND batch_index = 1",
            "outbox id given twice: outbox id 4",
        ),
        (
            "DELETE FROM audit_members WHERE batch_id = {first} AND batch_index = 2",
            "disbursement without a processed record: disbursement 2",
        ),
        (
            "DELETE FROM audit_batches WHERE batch_id = {second}",
            "batch member without its batch",
        ),
        (
            "UPDATE outbox_rows SET batch_index = 7 WHERE batch_id = {first} AND batch_index = 3",
            "batch outbox rows disagree with the batch",
        ),
        (
            "UPDATE audit_batches SET prev_hash = repeat('0', 64) WHERE batch_id = {second}",
            "audit chain broken at seq 5",
        ),
        (
            "UPDATE audit_members SET batch_id = {second}, batch_index = 3
             WHERE batch_id = {first} AND batch_index = 3",
            "audit chain broken at seq 3",
        ),
        (
            "UPDATE audit_batches SET link_seq = link_seq + 1 WHERE batch_id = {second}",
            "audit chain broken",
        ),
    ];
    for (tamper, named) in cases {
        let l = Postgres::fresh(OnConflict::Record);
        let subs: Vec<Submission> = (1..=5).map(sub).collect();
        let entries: Vec<String> = (1..=5).map(|i| format!("{i}-0")).collect();
        let items: Vec<Item<'_>> = subs.iter().zip(&entries).map(|(s, e)| item(s, e)).collect();
        l.record(&items[..3], "c", STREAM).unwrap();
        l.record(&items[3..], "c", STREAM).unwrap();
        l.verify().unwrap();
        let mut raw = l.raw();
        let ids: Vec<i64> = raw
            .query("SELECT batch_id FROM audit_batches ORDER BY link_seq", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let sql = tamper
            .replace("{first}", &ids[0].to_string())
            .replace("{second}", &ids[1].to_string());
        raw.batch_execute(&sql).unwrap();
        let err = l.verify().unwrap_err().to_string();
        assert!(err.contains(named), "{sql}: {err}");
    }
}

// ----- PostgreSQL: the batch link's bytes have one meaning on both sides ---------------------

/// The expression `claimgate_link` hashes a link with, as `schema_postgres.sql` ships it, with
/// its inputs made parameters: `$1` prev hash, `$2` seq, `$3` batch id, `$4` member count, `$5`
/// last member's hash, `$6` outbox rows, `$7` first outbox id, `$8` the link's time.
fn shipped_link_hash_sql() -> String {
    let script = include_str!("../../schema_postgres.sql");
    let start = script
        .find("encode(sha256(convert_to(format(")
        .expect("claimgate_link hashes with encode(sha256(convert_to(format(…");
    let end = start
        + script[start..]
            .find("'UTF8')), 'hex')")
            .expect("…, 'UTF8')), 'hex')")
        + "'UTF8')), 'hex')".len();
    let mut expr = script[start..end].to_owned();
    // Longest first: `h.seq + b.record_count` holds `b.record_count`.
    for (from, to) in [
        ("h.seq + b.record_count", "$2::int8"),
        ("h.outbox_id_last + 1", "$7::int8"),
        ("h.hash", "$1::text"),
        ("b.batch_id", "$3::int8"),
        ("b.record_count", "$4::int4"),
        ("b.last_hash", "$5::text"),
        ("b.outbox_count", "$6::int4"),
    ] {
        assert!(expr.contains(from), "{from} in {expr}");
        expr = expr.replace(from, to);
    }
    // `at`, the function's parameter, as a whole word (not the `_at` of `recorded_at`).
    let at = word_offsets(&expr, "at");
    assert_eq!(at.len(), 1, "one `at` in {expr}");
    expr.replace_range(at[0]..at[0] + 2, "$8::text");
    format!("SELECT {expr}")
}

/// Byte offsets of `word` in `text` standing as a whole word.
fn word_offsets(text: &str, word: &str) -> Vec<usize> {
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    text.match_indices(word)
        .map(|(i, _)| i)
        .filter(|&i| {
            !is_word(text[..i].chars().next_back())
                && !is_word(text[i + word.len()..].chars().next())
        })
        .collect()
}

#[test]
fn postgres_spells_and_hashes_a_batch_link_byte_for_byte_as_rust_does() {
    // The audit link has two authors: Rust (`Record::link`, `detail::batch_link`) and the
    // PL/pgSQL of `claimgate_link` (`claimgate_link_detail` and a `format()`). Over generated
    // values, extremes included, the server's detail and hash, from the shipped script's own
    // text, equal Rust's; a drift in either spelling fails here before any ledger is written.
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let l = Postgres::fresh(OnConflict::Record);
    let db = std::cell::RefCell::new(l.raw());
    let hash_sql = shipped_link_hash_sql();
    let detail_sql = "SELECT claimgate_link_detail($1, $2, $3, $4, $5)";
    let hex = "[0-9a-f]{64}";
    let at = (
        2000u32..=9999,
        1u32..=12,
        1u32..=28,
        0u32..24,
        0u32..60,
        0u32..60,
        0u32..1_000_000,
    )
        .prop_map(|(y, mo, d, h, mi, s, us)| {
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z")
        });
    let count = prop_oneof![Just(1i32), Just(i32::MAX), 1i32..5_000];
    let big = prop_oneof![Just(1i64), Just(i64::MAX / 2), 1i64..1_000_000_000];
    let values = (
        hex,
        big.clone(),
        big.clone(),
        count.clone(),
        hex,
        0i32..5_000,
        big,
        at,
    );
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(
            &values,
            |(prev, seq, batch_id, records, last, outbox_rows, outbox_first, at)| {
                let link = claimgate::domain::audit::BatchLink {
                    batch_id,
                    records: records.into(),
                    last_hash: last.clone(),
                    outbox_rows: outbox_rows.into(),
                    outbox_first,
                };
                let rust_detail = detail::batch_link(&link);
                let pg_detail: String = db
                    .borrow_mut()
                    .query_one(
                        detail_sql,
                        &[&batch_id, &records, &last, &outbox_rows, &outbox_first],
                    )
                    .unwrap()
                    .get(0);
                prop_assert_eq!(&pg_detail, &rust_detail);
                let rust_hash = Record::link(seq, rust_detail, &at, &prev).hash;
                let pg_hash: String = db
                    .borrow_mut()
                    .query_one(
                        &hash_sql,
                        &[
                            &prev,
                            &seq,
                            &batch_id,
                            &records,
                            &last,
                            &outbox_rows,
                            &outbox_first,
                            &at,
                        ],
                    )
                    .unwrap()
                    .get(0);
                prop_assert_eq!(pg_hash, rust_hash);
                Ok(())
            },
        )
        .unwrap();
}
