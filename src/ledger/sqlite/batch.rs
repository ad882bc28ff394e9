//! One batch, one transaction: each item's claim, its effects and its audit records.
//!
//! Claims are taken one row at a time, in batch order, with `INSERT OR IGNORE`: the unique
//! index on the claim decides, row by row, whether a submission is new, so a duplicate inside
//! the same batch is a duplicate like any other. What follows from a new claim — its
//! disbursement, its outbox row — and every audit record are collected as the items are
//! decided and written at the end of the batch, many rows per statement (`multirow`), still
//! inside the same transaction. Nothing here commits: the caller does, or drops the
//! transaction and nothing of the batch exists.

use super::{conflict, multirow, raw, Item, Outcome};
use crate::config::OnConflict;
use crate::domain::audit::{self, detail, Kind, Record};
use crate::domain::event::{self, DISBURSEMENT_RECORDED as EVENT_DISBURSEMENT_RECORDED};
use crate::domain::submission::Submission;
use crate::error::Result;
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
    /// Paying a held conflict a reviewer approved (`review.rs`): its `conflict` record says so.
    pub(super) approving: bool,
}

/// One submission with its delivery facts.
pub(super) struct Claim<'a> {
    /// The validated submission.
    pub(super) submission: &'a Submission,
    /// The stream entry that carried it.
    pub(super) entry_id: &'a str,
    /// Deliveries so far.
    pub(super) delivery_count: u64,
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
        let tail = tx
            // A checkpoint is transparent: what follows it links to the hash it continues from.
            .query_row(
                "SELECT seq, CASE kind WHEN 'checkpoint' THEN prev_hash ELSE hash END
                        FROM audit_log ORDER BY seq DESC LIMIT 1",
                [],
                |r| {
                    Ok(ChainTail {
                        seq: r.get(0)?,
                        hash: r.get(1)?,
                    })
                },
            )
            .optional()?;
        Ok(tail.unwrap_or(ChainTail {
            seq: 0,
            hash: audit::GENESIS_HASH.to_owned(),
        }))
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

/// A batch being recorded inside an open transaction.
pub(super) struct Batch<'t, 'a> {
    /// The batch's transaction.
    pub(super) tx: &'t Transaction<'t>,
    /// Consumer, stream and conflict policy.
    pub(super) ctx: &'t Context<'t>,
    /// The time every row of the batch is recorded at.
    pub(super) now: String,
    /// The chain's last seq when the batch started: its first record must follow it.
    start_seq: i64,
    /// The chain's tail when the batch started: the batch's first record links to its hash.
    tail: ChainTail,
    /// New claims' disbursements, written by `finish`.
    disbursements: Vec<Disbursement<'a>>,
    /// New claims' outbox rows (claim id, event JSON), written by `finish`.
    outbox: Vec<(i64, String)>,
    /// Audit records in chain order, numbered and not yet sealed: `finish` seals and writes
    /// them.
    audit: Vec<Record>,
    /// Whether the ledger has any tombstone, read once when the batch starts: a ledger never
    /// purged then pays one read per batch instead of one probe per submission. Tombstones are
    /// written only by purges, which take the write lock this transaction holds.
    tombstones_exist: bool,
    /// The writer's statements.
    st: &'t mut raw::Statements,
    /// The ones every submission runs.
    ids: Ids,
    /// The groups holding a claim, synchronised with the ledger when the batch started.
    groups: &'t mut conflict::Groups,
    /// The highest claim id this batch made (0 before its first).
    claim_id_max: i64,
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
            tombstones_exist,
            ids: Ids::of(st)?,
            st,
            groups,
            claim_id_max: 0,
            tx,
            ctx,
            now: crate::domain::clock::now_rfc3339(),
            start_seq: tail.seq,
            tail,
            disbursements: Vec::with_capacity(capacity),
            outbox: Vec::with_capacity(capacity),
            audit: Vec::with_capacity(capacity),
        })
    }

    /// A record of `kind` by this batch's consumer at this batch's time, not yet sealed.
    pub(super) fn record(&self, kind: Kind) -> Record {
        Record {
            consumer: Some(self.ctx.consumer.to_owned()),
            ..Record::unsealed(kind, &self.now)
        }
    }

    /// Numbers `record` after the last one queued (or the chain's tail, for the batch's first)
    /// and queues it for `finish`, which seals the batch's records in this order.
    pub(super) fn append(&mut self, mut record: Record) {
        record.seq = self.start_seq + self.audit.len() as i64 + 1;
        self.audit.push(record);
    }

    /// Records one item and says what it did.
    pub(super) fn item(&mut self, item: &Item<'a>) -> Result<Outcome> {
        match item {
            Item::Submission {
                submission,
                entry_id,
                delivery_count,
            } => self.submission(&Claim {
                submission,
                entry_id,
                delivery_count: *delivery_count,
            }),
            Item::KnownDuplicate {
                submission,
                entry_id,
                delivery_count,
                committed_by: _,
            } => self.known_duplicate(&Claim {
                submission,
                entry_id,
                delivery_count: *delivery_count,
            }),
            Item::DeadLetter {
                entry_id,
                reason_code,
                reason,
                award_id,
                key,
                delivery_count,
            } => {
                let inserted = self
                    .tx
                    .prepare_cached(
                        "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code,
                         reason, award_id, delivery_count, recorded_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )?
                    .execute(params![
                        self.ctx.stream,
                        entry_id,
                        reason_code,
                        reason,
                        award_id,
                        *delivery_count as i64,
                        self.now
                    ])?;
                if inserted == 0 {
                    return Ok(Outcome::AlreadyDeadLettered);
                }
                let mut r = self.record(Kind::DeadLetter);
                r.idempotency_key = key.map(|k| k.to_hex());
                r.award_id = award_id.map(str::to_owned);
                r.stream_entry_id = Some((*entry_id).to_owned());
                r.delivery_count = Some(*delivery_count as i64);
                r.detail = Some(detail::dead_letter(reason_code, reason));
                self.append(r);
                Ok(Outcome::DeadLettered)
            }
            Item::Vanished { entry_id, reason } => {
                let mut r = self.record(Kind::Vanished);
                r.stream_entry_id = Some((*entry_id).to_owned());
                r.detail = Some(detail::vanished(self.ctx.stream, reason));
                self.append(r);
                Ok(Outcome::Vanished)
            }
        }
    }

    /// A record of `kind` about `claim`, not yet sealed.
    pub(super) fn claim_record(&self, kind: Kind, claim: &Claim<'_>) -> Record {
        let s = claim.submission;
        let mut r = self.record(kind);
        r.idempotency_key = Some(s.key.to_hex());
        r.award_id = Some(s.award_id.clone());
        r.stream_entry_id = Some(claim.entry_id.to_owned());
        r.delivery_count = Some(claim.delivery_count as i64);
        r
    }

    /// A fast-filter hit, confirmed here: the claim (one probe of its unique index, instead of
    /// an attempted insert) or the tombstone is found and the duplicate recorded as any
    /// duplicate is; a marker with neither behind it is logged and the item recorded as the
    /// submission it is.
    fn known_duplicate(&mut self, claim: &Claim<'a>) -> Result<Outcome> {
        if let Some(first_claimed_at) = self.claimed_at(claim.submission)? {
            return Ok(self.duplicate(claim, first_claimed_at, None, true));
        }
        if let Some(outcome) = self.tombstoned(claim, true)? {
            return Ok(outcome);
        }
        crate::ledger::warn_unconfirmed_marker(claim.entry_id, &claim.submission.key);
        self.submission(claim)
    }

    /// The `duplicate` record and outcome of a delivery of a claimed (or purged) key;
    /// `via_filter` when a fast-filter marker pointed at it (the record says so).
    fn duplicate(
        &mut self,
        claim: &Claim<'a>,
        first_claimed_at: String,
        purged_at: Option<String>,
        via_filter: bool,
    ) -> Outcome {
        let mut r = self.claim_record(Kind::Duplicate, claim);
        r.detail = Some(detail::duplicate_record(
            &first_claimed_at,
            purged_at.as_deref(),
            via_filter,
        ));
        self.append(r);
        Outcome::Duplicate {
            first_claimed_at,
            purged_at,
        }
    }

    /// The duplicate outcome of a submission whose claim was purged, if its key has a
    /// tombstone (recording its `duplicate` record).
    fn tombstoned(&mut self, claim: &Claim<'a>, via_filter: bool) -> Result<Option<Outcome>> {
        if !self.tombstones_exist {
            return Ok(None);
        }
        let found: Option<(String, String)> = self
            .tx
            .prepare_cached(
                "SELECT claimed_at, purged_at FROM claim_tombstones WHERE idempotency_key = ?1",
            )?
            .query_row([claim.submission.key.as_bytes().as_slice()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        Ok(found.map(|(claimed, purged)| self.duplicate(claim, claimed, Some(purged), via_filter)))
    }

    /// INSERT OR IGNORE the claim; if it took, queue its disbursement, outbox row and audit
    /// record; if not, look up when the key was first claimed. A key with a tombstone is a
    /// duplicate before anything else is asked: its claim was purged, and it stays paid.
    fn submission(&mut self, claim: &Claim<'a>) -> Result<Outcome> {
        if let Some(outcome) = self.tombstoned(claim, false)? {
            return Ok(outcome);
        }
        let s = claim.submission;
        // Under hold, a conflict must be known before claiming; under record (the default) it
        // is looked up only for new claims, after the claim, so duplicates pay nothing for it.
        let held_conflict = match self.ctx.on_conflict {
            OnConflict::Hold => self.conflict(s)?,
            OnConflict::Record => None,
        };
        if let Some(other) = &held_conflict {
            if self.claimed_at(s)?.is_none() {
                return self.hold(claim, other);
            }
        }
        let mut b = self.st.bind(self.ids.claim);
        b.blob(s.key.as_bytes())?;
        b.text(&s.award_id)?;
        b.text(&s.submission_timestamp)?;
        b.int(s.amount_cents)?;
        b.text(&self.now)?;
        b.text(claim.entry_id)?;
        b.text(self.ctx.consumer)?;
        b.text(&s.submission_instant)?;
        let claimed = b.execute()?;
        if claimed == 0 {
            // Only a claim of this very key can have refused ours, so it is there to be found.
            let first_claimed_at = self.claimed_at(s)?.ok_or_else(|| {
                crate::Error::Invariant(format!(
                    "claim of key {} was refused but no claim of it exists",
                    s.key.to_hex()
                ))
            })?;
            return Ok(self.duplicate(claim, first_claimed_at, None, false));
        }

        let claim_id = self.tx.last_insert_rowid();
        self.claim_id_max = self.claim_id_max.max(claim_id);
        failpoint::hit("after_claim");
        let mut r = self.claim_record(Kind::Processed, claim);
        let key_hex = r.idempotency_key.as_deref().unwrap_or_default();
        self.disbursements.push(Disbursement {
            claim_id,
            submission: s,
        });
        self.outbox.push((claim_id, event::payload(s, key_hex)));
        r.amount_cents = Some(s.amount_cents);
        self.append(r);
        let other = match self.ctx.on_conflict {
            OnConflict::Hold => held_conflict,
            OnConflict::Record => self.conflict(s)?,
        };
        // After the probe: its own claim is no conflict, and later claims in its group are.
        self.groups.insert(&s.submission_instant, &s.award_id);
        let Some(other) = other else {
            return Ok(Outcome::Processed);
        };
        let mut c = self.claim_record(Kind::Conflict, claim);
        c.amount_cents = Some(s.amount_cents);
        c.detail = Some(if self.ctx.approving {
            detail::conflict_paid_on_approval(&other.key_hex, &other.claimed_at)
        } else {
            detail::conflict_paid(&other.key_hex, &other.claimed_at)
        });
        self.append(c);
        Ok(Outcome::ProcessedConflicting {
            other_key: other.key_hex,
        })
    }

    /// Holds a conflicting submission for review: a `dead_letters` row plus `conflict` and
    /// `dead_letter` records, once per stream entry. Nothing is claimed or paid.
    fn hold(&mut self, claim: &Claim<'a>, other: &conflict::Other) -> Result<Outcome> {
        let s = claim.submission;
        let reason = detail::hold_reason(&other.key_hex);
        let first = conflict::insert_hold(
            self.tx,
            &conflict::Held {
                stream: self.ctx.stream,
                entry_id: claim.entry_id,
                reason: &reason,
                award_id: &s.award_id,
                delivery_count: claim.delivery_count,
                now: &self.now,
            },
        )?;
        if first {
            let mut c = self.claim_record(Kind::Conflict, claim);
            c.amount_cents = Some(s.amount_cents);
            c.detail = Some(detail::conflict_held(&other.key_hex, &other.claimed_at));
            self.append(c);
            let mut d = self.claim_record(Kind::DeadLetter, claim);
            d.detail = Some(detail::conflict_hold(&reason));
            self.append(d);
        }
        Ok(Outcome::Held {
            other_key: other.key_hex.clone(),
            first,
        })
    }

    /// When the claim of this submission's key was taken, if it was: one probe of the index
    /// that leads with the submission instant. In a ledger made before this release, a claim
    /// an older release wrote without its instant (the next open backfills it) is found by its
    /// spelling instead, through that ledger's own claim index.
    fn claimed_at(&mut self, s: &Submission) -> Result<Option<String>> {
        let mut b = self.st.bind(self.ids.claimed_at);
        b.text(&s.submission_instant)?;
        b.text(&s.award_id)?;
        b.blob(s.key.as_bytes())?;
        let found = b.query_row(|row| row.text(0))?.flatten();
        match found {
            None if self.ctx.claims_by_spelling => claimed_at_by_spelling(self.tx, s),
            found => Ok(found),
        }
    }

    /// The earliest claim `s` conflicts with, if any: none without a probe when no claim is in
    /// its (instant, award) group (`conflict::Groups`), else one probe of the claim index.
    fn conflict(&mut self, s: &Submission) -> Result<Option<conflict::Other>> {
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

    /// Seals the queued audit records after the chain's tail and writes them, with the queued
    /// disbursements and outbox rows; returns the highest claim id the batch made (0 for
    /// none), for the conflict filter once it has committed.
    ///
    /// A large batch's records are sealed on a thread of their own while this one writes the
    /// disbursements and outbox rows: sealing (canonical JSON and SHA-256, one record after
    /// another, as each links to the one before) was about a tenth of the writer's time, and
    /// the writer is the worker's limit. A small batch seals them here: a thread's start
    /// would cost a lone submission more than its one seal.
    pub(super) fn finish(self) -> Result<i64> {
        let Batch {
            st,
            now,
            disbursements,
            outbox,
            audit,
            claim_id_max,
            tail,
            ..
        } = self;
        let now = now.as_str();
        let audit = if audit.len() < SEAL_APART_RECORDS_MIN {
            write_effects(st, now, &disbursements, &outbox)?;
            seal(audit, tail.hash)
        } else {
            std::thread::scope(|scope| {
                let sealing = spawn_named(scope, "seal", move || seal(audit, tail.hash));
                let written = write_effects(st, now, &disbursements, &outbox);
                let sealed = sealing
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                written.map(|()| sealed)
            })?
        };
        super::audit_store::insert_many(st, &audit)?;
        Ok(claim_id_max)
    }
}

/// Records in a batch from which `finish` seals them on a thread of their own.
const SEAL_APART_RECORDS_MIN: usize = 256;

/// Seals `records` in order, the first after `prev_hash`, each after the one before it.
///
/// Panics if a record's seq is not one past the one before it: a chain sealed out of order
/// must stop the process here, before anything commits, not drift into the ledger.
fn seal(mut records: Vec<Record>, mut prev_hash: String) -> Vec<Record> {
    for pair in records.windows(2) {
        assert!(
            pair[1].seq == pair[0].seq + 1,
            "audit record sealed out of order: seq {} after seq {}",
            pair[1].seq,
            pair[0].seq
        );
    }
    for r in &mut records {
        r.seal(&prev_hash);
        prev_hash.clone_from(&r.hash);
    }
    records
}

/// Writes a batch's disbursements and outbox rows, many rows per statement.
fn write_effects(
    st: &mut raw::Statements,
    now: &str,
    disbursements: &[Disbursement<'_>],
    outbox: &[(i64, String)],
) -> Result<()> {
    multirow::insert(
        st,
        "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents,
             recorded_at)",
        5,
        disbursements,
        |b, d| {
            let s = d.submission;
            b.int(d.claim_id)?;
            b.blob(s.key.as_bytes())?;
            b.text(&s.award_id)?;
            b.int(s.amount_cents)?;
            b.text(now)
        },
    )?;
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
/// [`Batch::claimed_at`]'s fallback asks this.
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
