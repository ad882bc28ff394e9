//! One batch, one transaction: each item's claim, its effects and its audit records.
//!
//! What each item is, and which records say so, is decided by `ledger/decide.rs`; this file
//! answers its questions ([`Probe`], the [`Facts`] of a SQLite ledger) and stores the answers.
//! Claims are taken one row at a time, in batch order, with `INSERT OR IGNORE`: the unique
//! index on the claim decides, row by row, whether a submission is new, so a duplicate inside
//! the same batch is a duplicate like any other. What follows from a new claim — its
//! disbursement, its outbox row — and every audit record are collected as the items are
//! decided and written at the end of the batch, many rows per statement (`multirow`), still
//! inside the same transaction. Nothing here commits: the caller does, or drops the
//! transaction and nothing of the batch exists.

use super::derived::Derives;
use super::{conflict, counts, multirow, raw};
use crate::config::OnConflict;
use crate::domain::audit::Record;
use crate::domain::event::{self, DISBURSEMENT_RECORDED as EVENT_DISBURSEMENT_RECORDED};
use crate::domain::submission::Submission;
use crate::error::Result;
use crate::ledger::decide::{self, DeadRow, Delivered, Facts, Other, Purged, Stamp, Verdict};
use crate::ledger::{Item, Outcome};
use crate::support::failpoint;
use crate::support::threads::spawn_named;
use rusqlite::{params, OptionalExtension, Transaction};

/// Who is recording, from where, under which conflict policy.
pub(super) struct Context<'a> {
    /// The consumer name.
    pub(super) consumer: &'a str,
    /// The submissions stream (dead letters are keyed by stream and entry id).
    pub(super) stream: &'a str,
    /// What to do with a conflicting resubmission.
    pub(super) on_conflict: OnConflict,
    /// The ledger's claim index leads with the timestamp as spelled (a ledger made before
    /// this release): a claim an older release wrote without its instant is found that way.
    pub(super) claims_by_spelling: bool,
    /// Which of the disbursement's and outbox row's columns the ledger derives from the claim
    /// rather than stores (`derived.rs`).
    pub(super) derives: Derives,
    /// Paying a held conflict a reviewer approved (`review.rs`): its `conflict` record says so.
    pub(super) approving: bool,
}

/// The tail of the audit chain when a batch starts, read inside its transaction.
struct ChainTail {
    /// The last record's seq (0 for an empty chain).
    seq: i64,
    /// The hash the next record links to.
    hash: String,
}

impl ChainTail {
    fn read(tx: &Transaction<'_>) -> Result<Self> {
        let (seq, hash) = super::audit_store::tail(tx)?;
        Ok(ChainTail { seq, hash })
    }
}

/// The statements every submission runs, on the writer's connection (`raw.rs`: values bound
/// in place), looked up once per batch.
struct Ids {
    /// `INSERT OR IGNORE` of a claim.
    claim: raw::Id,
    /// When a claim was taken, found by submission instant, award and key.
    claimed_at: raw::Id,
    /// The earliest other claim at the same instant for the same award
    /// ([`conflict::EARLIEST_OTHER`]).
    conflict: raw::Id,
}

impl Ids {
    fn of(st: &mut raw::Statements) -> Result<Self> {
        Ok(Ids {
            claim: st.id(
                "INSERT OR IGNORE INTO processed_messages (idempotency_key, award_id,
                 submission_timestamp, amount_cents, claimed_at, stream_entry_id, consumer,
                 submission_instant)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?,
            // Both layouts answer this from one index: a ledger made by this release from its
            // claim index (which leads with the instant), an older one from `claim_instant`.
            claimed_at: st.id("SELECT claimed_at FROM processed_messages
                 WHERE submission_instant = ?1 AND award_id = ?2 AND idempotency_key = ?3")?,
            conflict: st.id(conflict::EARLIEST_OTHER)?,
        })
    }
}

/// A disbursement waiting to be written with the rest of the batch.
struct Disbursement<'a> {
    /// The claim it pays.
    claim_id: i64,
    /// What it pays.
    submission: &'a Submission,
}

/// What a SQLite ledger answers [`decide`] with: probes of its indexes, and the claim itself,
/// inside the batch's transaction.
struct Probe<'t> {
    /// The batch's transaction.
    tx: &'t Transaction<'t>,
    /// The writer's statements.
    st: &'t mut raw::Statements,
    /// The ones every submission runs.
    ids: Ids,
    /// The consumer that claims.
    consumer: &'t str,
    /// The time every row of the batch is recorded at.
    now: String,
    /// See [`Context::claims_by_spelling`].
    claims_by_spelling: bool,
    /// Whether the ledger has any tombstone, read once when the batch starts: a ledger never
    /// purged then pays one read per batch instead of one probe per submission. Tombstones are
    /// written only by purges, which take the write lock this transaction holds.
    tombstones_exist: bool,
    /// The groups holding a claim, synchronised with the ledger when the batch started.
    groups: &'t mut conflict::Groups,
    /// The id of the claim the last successful [`Facts::claim`] made.
    claim_id: i64,
}

impl<'a> Facts<'a> for Probe<'_> {
    fn tombstone(&mut self, s: &Submission) -> Result<Option<Purged>> {
        if !self.tombstones_exist {
            return Ok(None);
        }
        Ok(self
            .tx
            .prepare_cached(
                "SELECT claimed_at, purged_at FROM claim_tombstones WHERE idempotency_key = ?1",
            )?
            .query_row([s.key.as_bytes().as_slice()], |r| {
                Ok(Purged {
                    claimed_at: r.get(0)?,
                    purged_at: r.get(1)?,
                })
            })
            .optional()?)
    }

    /// One probe of the index that leads with the submission instant. In a ledger made before
    /// this release, a claim an older release wrote without its instant (the next open
    /// backfills it) is found by its spelling instead, through that ledger's own claim index.
    fn claimed_at(&mut self, s: &Submission) -> Result<Option<String>> {
        let mut b = self.st.bind(self.ids.claimed_at);
        b.text(&s.submission_instant)?;
        b.text(&s.award_id)?;
        b.blob(s.key.as_bytes())?;
        let found = b.query_row(|row| row.text(0))?.flatten();
        match found {
            None if self.claims_by_spelling => claimed_at_by_spelling(self.tx, s),
            found => Ok(found),
        }
    }

    /// None without a probe when no claim is in its (instant, award) group
    /// (`conflict::Groups`), else one probe of the claim index.
    fn earliest_other(&mut self, s: &Submission) -> Result<Option<Other>> {
        if !self.groups.may_hold(&s.submission_instant, &s.award_id) {
            return Ok(None);
        }
        let mut b = self.st.bind(self.ids.conflict);
        b.text(&s.submission_instant)?;
        b.text(&s.award_id)?;
        b.blob(s.key.as_bytes())?;
        let earliest = b.query_row(|row| row.int(0))?.flatten();
        match earliest {
            Some(claim_id) => conflict::describe(self.tx, claim_id),
            None => Ok(None),
        }
    }

    /// `INSERT OR IGNORE`: the unique index decides; a refused claim's time is looked up.
    fn claim(&mut self, d: &Delivered<'a>) -> Result<Option<String>> {
        let s = d.submission;
        let mut b = self.st.bind(self.ids.claim);
        b.blob(s.key.as_bytes())?;
        b.text(&s.award_id)?;
        b.text(&s.submission_timestamp)?;
        b.int(s.amount_cents)?;
        b.text(&self.now)?;
        b.text(d.entry_id)?;
        b.text(self.consumer)?;
        b.text(&s.submission_instant)?;
        if b.execute()? == 0 {
            // Only a claim of this very key can have refused ours, so it is there to be found.
            let first_claimed_at = self.claimed_at(s)?.ok_or_else(|| {
                crate::Error::Invariant(format!(
                    "claim of key {} was refused but no claim of it exists",
                    s.key.to_hex()
                ))
            })?;
            return Ok(Some(first_claimed_at));
        }
        let claim_id = self.tx.last_insert_rowid();
        assert!(
            claim_id > self.claim_id,
            "claim ids only grow within a batch"
        );
        self.claim_id = claim_id;
        failpoint::hit("after_claim");
        Ok(None)
    }
}

/// A batch being recorded inside an open transaction.
pub(super) struct Batch<'t, 'a> {
    /// What the batch asks the ledger, and the claims it makes.
    probe: Probe<'t>,
    /// Consumer, stream and conflict policy.
    ctx: &'t Context<'t>,
    /// The chain's last seq when the batch started: its first record must follow it.
    start_seq: i64,
    /// The chain's tail when the batch started: the batch's first record links to its hash.
    tail: ChainTail,
    /// New claims' disbursements, written by `finish`.
    disbursements: Vec<Disbursement<'a>>,
    /// New claims' outbox rows (claim id, event JSON), written by `finish`.
    outbox: Vec<(i64, String)>,
    /// Audit records in chain order, not yet numbered or sealed: `finish` does both.
    audit: Vec<Record>,
    /// The highest claim id this batch made (0 before its first).
    claim_id_max: i64,
    /// What the batch adds to the ledger's counts so far (`counts.rs`); `finish` writes it.
    delta: counts::Delta,
}

impl<'t, 'a> Batch<'t, 'a> {
    /// Starts recording a batch of `capacity` items after the chain's current tail.
    pub(super) fn start(
        tx: &'t Transaction<'t>,
        st: &'t mut raw::Statements,
        groups: &'t mut conflict::Groups,
        ctx: &'t Context<'t>,
        capacity: usize,
    ) -> Result<Self> {
        let tail = ChainTail::read(tx)?;
        groups.sync(tx)?;
        let tombstones_exist = tx
            .prepare_cached("SELECT 1 FROM claim_tombstones LIMIT 1")?
            .query_row([], |_| Ok(()))
            .optional()?
            .is_some();
        Ok(Batch {
            probe: Probe {
                tx,
                ids: Ids::of(st)?,
                st,
                consumer: ctx.consumer,
                now: crate::domain::clock::now_rfc3339(),
                claims_by_spelling: ctx.claims_by_spelling,
                tombstones_exist,
                groups,
                claim_id: 0,
            },
            claim_id_max: 0,
            delta: counts::Delta::default(),
            ctx,
            start_seq: tail.seq,
            tail,
            disbursements: Vec::with_capacity(capacity),
            outbox: Vec::with_capacity(capacity),
            audit: Vec::with_capacity(capacity),
        })
    }

    /// The time every row of the batch is recorded at.
    pub(super) fn now(&self) -> &str {
        &self.probe.now
    }

    /// Queues `record` after the batch's records so far, for `finish` to number and seal.
    pub(super) fn append(&mut self, record: Record) {
        self.audit.push(record);
    }

    /// Records one item and says what it did.
    pub(super) fn item(&mut self, item: &Item<'a>) -> Result<Outcome> {
        let verdict = decide::decide(item, self.ctx.on_conflict, &mut self.probe)?;
        let first_dead = match decide::dead_row(item, &verdict) {
            Some(row) => insert_dead(self.probe.tx, self.ctx.stream, &row, &self.probe.now)?,
            None => false,
        };
        if first_dead {
            self.delta.dead_letters(1);
        }
        let claimed = matches!(verdict, Verdict::Claim { .. });
        let stamp = Stamp {
            consumer: self.ctx.consumer,
            stream: self.ctx.stream,
            now: &self.probe.now,
            approving: self.ctx.approving,
        };
        let records_before = self.audit.len();
        let outcome = decide::settle(item, verdict, first_dead, &stamp, &mut self.audit);
        if let (true, Some(d)) = (claimed, Delivered::of(item)) {
            // The claim's `processed` record, just settled, already spells its key in hex.
            let key_hex = self.audit[records_before].idempotency_key.as_deref();
            let event = event::payload(
                d.submission,
                key_hex.expect("a processed record names its key"),
            );
            self.pay(d.submission, event);
        }
        Ok(outcome)
    }

    /// Queues the disbursement and outbox row (its `event`) of the claim [`Facts::claim`] just
    /// made of `s`.
    fn pay(&mut self, s: &'a Submission, event: String) {
        let claim_id = self.probe.claim_id;
        self.claim_id_max = self.claim_id_max.max(claim_id);
        // After its own conflict probe (its own claim is no conflict); later claims in its
        // group are.
        self.probe.groups.insert(&s.submission_instant, &s.award_id);
        self.delta.paid(s.amount_cents);
        self.disbursements.push(Disbursement {
            claim_id,
            submission: s,
        });
        self.outbox.push((claim_id, event));
    }

    /// Numbers the queued audit records after the chain's tail, seals and writes them, with
    /// the queued disbursements and outbox rows; returns the highest claim id the batch made
    /// (0 for none), for the conflict filter once it has committed.
    ///
    /// A large batch's records are sealed on a thread of their own while this one writes the
    /// disbursements and outbox rows: sealing (canonical JSON and SHA-256, one record after
    /// another, as each links to the one before) was about a tenth of the writer's time, and
    /// the writer is the worker's limit. A small batch seals them here: a thread's start
    /// would cost a lone submission more than its one seal.
    pub(super) fn finish(self) -> Result<i64> {
        let Batch {
            probe: Probe { st, now, tx, .. },
            disbursements,
            outbox,
            audit,
            claim_id_max,
            tail,
            start_seq,
            mut delta,
            ctx,
            ..
        } = self;
        let derives = ctx.derives;
        let now = now.as_str();
        let audit = if audit.len() < SEAL_APART_RECORDS_MIN {
            write_effects(st, now, derives, &disbursements, &outbox)?;
            seal(audit, start_seq, tail.hash)
        } else {
            std::thread::scope(|scope| {
                let sealing = spawn_named(scope, "seal", move || seal(audit, start_seq, tail.hash));
                let written = write_effects(st, now, derives, &disbursements, &outbox);
                let sealed = sealing
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                written.map(|()| sealed)
            })?
        };
        super::audit_store::insert_many(st, &audit)?;
        delta.records(&audit);
        delta.apply(tx)?;
        Ok(claim_id_max)
    }
}

/// Inserts a dead letter's or a hold's row, once per stream entry: true if this call inserted
/// it (an earlier delivery may already have).
fn insert_dead(tx: &Transaction<'_>, stream: &str, row: &DeadRow<'_>, now: &str) -> Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code, reason,
             award_id, delivery_count, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            stream,
            row.entry_id,
            row.reason_code,
            row.reason,
            row.award_id,
            row.delivery_count as i64,
            now
        ])?;
    Ok(inserted == 1)
}

/// Records in a batch from which `finish` seals them on a thread of their own.
const SEAL_APART_RECORDS_MIN: usize = 256;

/// Numbers `records` from `after_seq + 1` and seals them in order, the first after
/// `prev_hash`, each after the one before it.
fn seal(mut records: Vec<Record>, after_seq: i64, mut prev_hash: String) -> Vec<Record> {
    for (r, seq) in records.iter_mut().zip(after_seq + 1..) {
        debug_assert_eq!(r.seq, 0, "a record is numbered once, here");
        r.seq = seq;
        r.seal(&prev_hash);
        prev_hash.clone_from(&r.hash);
    }
    records
}

/// Writes a batch's disbursements and outbox rows, many rows per statement: a disbursement
/// without its time where the ledger derives it from the claim (`derived.rs`). Outbox rows
/// are written whole: the event is there for whatever publishes it until it is published.
fn write_effects(
    st: &mut raw::Statements,
    now: &str,
    derives: Derives,
    disbursements: &[Disbursement<'_>],
    outbox: &[(i64, String)],
) -> Result<()> {
    let (head, columns) = if derives.disbursements {
        (
            "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents)",
            4,
        )
    } else {
        (
            "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents,
                 recorded_at)",
            5,
        )
    };
    multirow::insert(st, head, columns, disbursements, |b, d| {
        let s = d.submission;
        b.int(d.claim_id)?;
        b.blob(s.key.as_bytes())?;
        b.text(&s.award_id)?;
        b.int(s.amount_cents)?;
        if derives.disbursements {
            Ok(())
        } else {
            b.text(now)
        }
    })?;
    multirow::insert(
        st,
        "INSERT INTO outbox (claim_id, event_type, payload, created_at)",
        4,
        outbox,
        |b, (claim_id, payload)| {
            b.int(*claim_id)?;
            b.text(EVENT_DISBURSEMENT_RECORDED)?;
            b.text(payload)?;
            b.text(now)
        },
    )?;
    Ok(())
}

/// When the claim of `s`'s key was taken, if it was, found by the columns that lead the
/// claim's index in an older ledger (`submission_timestamp`, not the instant). Only
/// [`Probe`]'s `claimed_at` falls back to this.
fn claimed_at_by_spelling(tx: &Transaction<'_>, s: &Submission) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached(
            "SELECT claimed_at FROM processed_messages
             WHERE submission_timestamp = ?1 AND award_id = ?2 AND idempotency_key = ?3",
        )?
        .query_row(
            params![
                s.submission_timestamp,
                s.award_id,
                s.key.as_bytes().as_slice()
            ],
            |row| row.get(0),
        )
        .optional()?)
}
