//! The ledger's seam: what the worker records ([`Item`], [`Outcome`]) and one trait per caller,
//! each method's promise written on it; `mod.rs`'s doc is the contract every implementation
//! keeps, point by point.

use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::Result;

/// Logs a fast-filter marker the ledger could not confirm (neither a claim nor a tombstone
/// of its key): every backend says it in these words, before recording the submission.
pub(crate) fn warn_unconfirmed_marker(entry_id: &str, key: &IdempotencyKey) {
    log::warn!(
        "fast filter: entry {entry_id} has a marker for key {} but the ledger holds no claim \
         or tombstone of it; the marker is not trusted and the submission is processed normally \
         (a planted marker, or one left from before a restore)",
        key.short()
    );
}

/// One thing the worker asks the ledger to record, with where it came from.
#[derive(Debug, Clone)]
pub enum Item<'a> {
    /// A valid submission: claim its key and, if the claim is new, record its effects.
    Submission {
        /// The validated submission.
        submission: &'a Submission,
        /// The stream entry that carried it.
        entry_id: &'a str,
        /// How many times the entry has been delivered (1 on first delivery).
        delivery_count: u64,
    },
    /// A submission the fast filter (`--fast-filter`) saw committed earlier. The marker is a
    /// hint, never evidence: the ledger confirms it inside the batch's transaction (a claim of
    /// the key, or its tombstone) and then records what [`Item::Submission`] would — the same
    /// outcome, and the same `duplicate` record with
    /// [`crate::domain::audit::detail::via_fast_filter`] saying how it was found. A marker the ledger cannot confirm (one
    /// planted in Redis, or one that outlived a restored ledger) is logged at WARN, naming the
    /// entry and the key's prefix, and the item is recorded as the submission it is.
    KnownDuplicate {
        /// The validated submission.
        submission: &'a Submission,
        /// The stream entry that carried it.
        entry_id: &'a str,
        /// How many times the entry has been delivered.
        delivery_count: u64,
        /// The time the filter's marker says the key was seen committed (at or after the claim).
        committed_by: &'a str,
    },
    /// An entry that was copied to the dead-letter stream: leave its audit record.
    DeadLetter {
        /// The stream entry.
        entry_id: &'a str,
        /// A short machine-readable class, such as `not_json`.
        reason_code: &'a str,
        /// The reason in words.
        reason: &'a str,
        /// The award, where it could be read.
        award_id: Option<&'a str>,
        /// The key, where one could be derived.
        key: Option<IdempotencyKey>,
        /// Deliveries so far.
        delivery_count: u64,
    },
    /// A pending entry whose body is gone from the stream (trimmed or deleted while pending):
    /// leave a `vanished` audit record before the worker acknowledges it out of the pending
    /// list. Nothing else is written: there is nothing to claim, pay or dead-letter.
    Vanished {
        /// The stream entry id that was pending.
        entry_id: &'a str,
        /// How it was found gone, in words (for the record's detail).
        reason: &'a str,
    },
}

/// What recording one item did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The claim was new: disbursement, outbox row and audit record written.
    Processed,
    /// The key was already claimed (or its claim was purged and its tombstone remains);
    /// nothing but a `duplicate` audit record was written.
    Duplicate {
        /// When the key was first claimed: the evidence of why nothing was paid twice.
        first_claimed_at: String,
        /// When a retention purge removed that claim, leaving its tombstone; `None` while the
        /// claim itself is in the ledger.
        purged_at: Option<String>,
    },
    /// The dead letter's audit record was written (first time this entry was dead-lettered).
    DeadLettered,
    /// This entry had already been dead-lettered by an earlier delivery; nothing written.
    AlreadyDeadLettered,
    /// The `vanished` record of an [`Item::Vanished`] was written.
    Vanished,
    /// Processed and paid, but an earlier claim has the same award and submission instant
    /// with a different key: a `conflict` record linking both keys was written too.
    ProcessedConflicting {
        /// The earlier claim's key, in hex.
        other_key: String,
    },
    /// Nothing was written: another writer's uncommitted batch holds this submission's group.
    /// Offer it again (contract point 8); it is not to be acknowledged.
    Deferred,
    /// Under `--on-conflict hold`: a conflicting resubmission was neither claimed nor paid; a
    /// `dead_letters` row with `conflict` and `dead_letter` records holds it for review. The
    /// worker copies the entry to the dead-letter stream before acknowledging it.
    Held {
        /// The earlier claim's key, in hex.
        other_key: String,
        /// False when an earlier delivery already held it (nothing new was written).
        first: bool,
    },
}

/// The counts a ledger keeps in itself, moved by every write in its own transaction
/// (`sqlite/counts.rs`; on PostgreSQL the chain head's and `purge_counts`' columns, see
/// `schema_postgres.sql`): every [`Stats`] field but the outbox backlog, which is read afresh.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) claims: u64,
    pub(crate) disbursements: u64,
    pub(crate) disbursed_cents_total: i128,
    pub(crate) dead_letters: u64,
    pub(crate) duplicates: u64,
    pub(crate) conflicts: u64,
    pub(crate) vanished: u64,
    pub(crate) audit_records: u64,
    pub(crate) tombstones: u64,
}

impl Counts {
    /// These counts with the outbox backlog read beside them.
    pub(crate) fn stats(&self, outbox_backlog: u64, outbox_oldest_age_s: Option<f64>) -> Stats {
        Stats {
            claims: self.claims,
            disbursements: self.disbursements,
            disbursed_cents_total: self.disbursed_cents_total,
            outbox_backlog,
            outbox_oldest_age_s,
            dead_letters: self.dead_letters,
            duplicates_suppressed: self.duplicates,
            conflicts: self.conflicts,
            vanished: self.vanished,
            audit_records: self.audit_records,
            tombstones: self.tombstones,
        }
    }
}

/// Ledger-wide counts, as `status` shows them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Rows in `processed_messages`.
    pub claims: u64,
    /// Rows in `disbursements`.
    pub disbursements: u64,
    /// Sum of `disbursements.amount_cents`, exact: an i128 cannot overflow on any number of
    /// i64 amounts a ledger can hold (a ledger written before `--amount-cents-max` may hold
    /// amounts whose sum is past i64).
    pub disbursed_cents_total: i128,
    /// Outbox rows not yet published.
    pub outbox_backlog: u64,
    /// Age in seconds of the oldest unpublished outbox row, if any.
    pub outbox_oldest_age_s: Option<f64>,
    /// Rows in `dead_letters`.
    pub dead_letters: u64,
    /// `duplicate` audit records: deliveries suppressed.
    pub duplicates_suppressed: u64,
    /// `conflict` audit records.
    pub conflicts: u64,
    /// `vanished` audit records: pending entries found gone from the stream and acknowledged
    /// out of the pending list.
    pub vanished: u64,
    /// All audit records.
    pub audit_records: u64,
    /// Tombstones: keys whose claims a retention purge removed, which still suppress.
    pub tombstones: u64,
}

/// The worker's side: record batches, read counts.
pub trait Ledger: Send + Sync {
    /// Records a batch in one transaction (claims, effects, audit records) and returns one
    /// outcome per item, in item order (contract points 1–4). On error nothing of the batch is
    /// visible. `consumer` and `stream` are written into the audit records.
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>>;

    /// How many batches one worker may have in [`Ledger::record_in_turn`] at once (contract
    /// point 9). A backend with one writer at a time keeps the default, 1.
    fn writers(&self) -> usize {
        1
    }

    /// [`Ledger::record`], calling `locked(deferred_any)` once the batch holds every group it
    /// will write under (contract point 9), at most once per call. The default, for a backend
    /// with one writer, never calls it: its caller's next batch waits for the return.
    fn record_in_turn(
        &self,
        items: &[Item<'_>],
        consumer: &str,
        stream: &str,
        locked: &mut dyn FnMut(bool),
    ) -> Result<Vec<Outcome>> {
        let _ = locked;
        self.record(items, consumer, stream)
    }

    /// Counts and totals for `status` and the metrics gauges, read in one snapshot.
    fn stats(&self) -> Result<Stats>;
}

/// One outbox row on its way to the events stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The outbox id: the event's `event_id`, only ever growing.
    pub id: i64,
    /// What happened, such as `disbursement.recorded`.
    pub event_type: String,
    /// The event body (JSON text).
    pub payload: String,
}

/// The relay's side: rows in id order above a position, and marking them published.
pub trait Outbox: Send + Sync {
    /// Up to `limit` rows with an id above `after_id`, lowest id first, whether or not they
    /// are marked published (contract point 5: no row below the highest id returned can become
    /// visible later). The relay's position is the events stream's own (`relay.rs`), so a row
    /// the stream lost after the ledger marked it is read, and published, again.
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>>;

    /// Marks every unpublished row with id `<= upto_id` as published at `now`, and records,
    /// in the same transaction, that the events stream `events_stream` holds every row at or
    /// below `upto_id` (`ledger_meta` `published_upto:<stream>`, only ever raised), so a
    /// retention purge never removes a row one of several relays has not published yet (each
    /// on its own stream, any of them may set `published_at` first). Returns how many rows
    /// changed; rows already published are left alone.
    fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64>;

    /// This ledger's random identity, created on first call and never changed after, so two
    /// ledgers (or a ledger and its fresh replacement) are never mistaken for each other.
    fn ledger_id(&self) -> Result<String>;

    /// This ledger's identity if one was ever made, without making one: for checks, which
    /// must only read (`audit verify --anchors` on a ledger that never had an id).
    fn ledger_id_made(&self) -> Result<Option<String>>;

    /// The highest outbox id this ledger has recorded as published to the events stream
    /// `events_stream` (its `published_upto:` mark, [`Outbox::mark_published`]); 0 for a
    /// stream no relay has published to while another has (a second relay's first run). A
    /// ledger of an earlier release, which records no stream's mark, answers the highest id
    /// marked published by any relay: rows are marked in id order, so every row below it is
    /// marked too. The relay compares it with the events stream's position: a stream standing
    /// lower lost events the ledger says it published (`relay.rs`, "When the stream stands
    /// below the ledger").
    fn published_id_max(&self, events_stream: &str) -> Result<i64>;

    /// The highest outbox id this ledger has ever assigned (0 before the first row), whether
    /// or not the row still exists (a purge removes rows, never the sequence). The relay
    /// compares the events stream's mark with it: a mark above it means the stream holds events
    /// this ledger never made, the sign of a ledger copied back by hand (see `relay.rs`).
    fn outbox_id_max(&self) -> Result<i64>;
}

/// Which audit records to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// The whole log.
    All,
    /// Records with `seq` at or above this.
    Seq(i64),
    /// Records written at or after this time, in the ledger's format (`domain::clock`). Every
    /// backend must compare exactly as that text compares: fixed width, UTC, so text order is
    /// time order.
    Time(String),
}

/// Reading the audit chain back, for export and verification.
pub trait AuditLog: Send + Sync {
    /// Calls `f` with each selected record, lowest `seq` first, all from one consistent
    /// snapshot; stops at the first error `f` returns and returns it. A stored record that
    /// cannot be a record (an unknown kind) is [`crate::Error::Invariant`].
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(crate::domain::audit::Record) -> Result<()>,
    ) -> Result<()>;

    /// Calls `f` with each `dead_letter` record, lowest `seq` first, all from one consistent
    /// snapshot, exactly the records [`AuditLog::for_each_record`] would pass of that kind;
    /// same error rules. Dead-letter reconciliation runs this before a worker behind Sentinel
    /// reads, and again after every failover it lives through, so a backend must answer it in
    /// time proportional to the dead letters, not to the whole log (SQLite and PostgreSQL
    /// keep a partial index of them). The default walks the whole log: for the memory ledger,
    /// whose log is small.
    fn for_each_dead_letter(
        &self,
        f: &mut dyn FnMut(crate::domain::audit::Record) -> Result<()>,
    ) -> Result<()> {
        use crate::domain::audit::Kind;
        self.for_each_record(&Since::All, &mut |r| match r.kind {
            Kind::DeadLetter => f(r),
            _ => Ok(()),
        })
    }
}

/// What a clean ledger holds, as `verify` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Claims.
    pub claims: u64,
    /// Disbursements.
    pub disbursements: u64,
    /// Outbox rows.
    pub outbox_rows: u64,
    /// Audit records, all links and hashes checked.
    pub audit_records: u64,
    /// Tombstones of purged claims (each key neither claimed again nor missing behind a
    /// `duplicate` record).
    pub tombstones: u64,
    /// The chain's head: the hash the next record will link to.
    pub head_hash: String,
    /// Batches committed but not linked into the chain yet (a shared ledger only: a writer
    /// links its batch right after committing it, so these are batches in that moment, or left
    /// by a writer that stopped in it, which a node's start or a relay round places). Their rows
    /// are checked with the rest; their records are not in the chain yet.
    pub unlinked_batches: u64,
}

/// Looking at a ledger without changing it: `verify`, `status`, `/healthz`.
pub trait Inspect: Send + Sync {
    /// Checks every invariant in one read snapshot (the store's own integrity, which is
    /// backend-specific — `PRAGMA integrity_check` on SQLite, its indexes agreeing with its rows
    /// in memory; one claim and one
    /// outbox row per disbursement and agreeing with it, every `processed` record matching its
    /// disbursement, no key claimed or processed twice, no key both claimed and tombstoned,
    /// every `duplicate` record's key claimed or tombstoned, `dead_letters` rows and
    /// `dead_letter` records one to one by stream entry id, the audit chain). Returns the
    /// summary, or [`crate::Error::Invariant`] naming the first violation.
    fn verify(&self) -> Result<Summary>;

    /// Answers one trivial query: `Ok` means the ledger is reachable now.
    fn ping(&self) -> Result<()>;

    /// Where this ledger is, for messages: a file path, or a URL with its password removed.
    fn describe(&self) -> String;
}

/// Backup, where the backend can make one itself.
pub trait Backup: Send + Sync {
    /// Writes a consistent copy (the ledger as of one commit) to `out`, a new 0600 file that
    /// must not exist; a failed copy is removed. The copy carries the ledger's `ledger_id`
    /// (created first if no relay has asked for it yet), which `restore` matches against the
    /// events stream's mark. A backend whose backups are made by other
    /// tools returns [`crate::Error::Config`] saying which.
    fn backup(&self, out: &std::path::Path) -> Result<BackupCopied>;
}

/// What a backup copied, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupCopied {
    /// Claims in the copy.
    pub claims: u64,
    /// Audit records in the copy.
    pub audit_records: u64,
    /// Size of the copy in bytes.
    pub bytes: u64,
}

/// One legal hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Hold {
    /// The award nothing may be purged for.
    pub award_id: String,
    /// Why (case number, auditor's request).
    pub reason: String,
    /// When it was placed.
    pub held_at: String,
}

/// The audit prefix a purge before a cutoff may remove, and what stands in its way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgePlan {
    /// First `seq` of the prefix (a leading checkpoint, if the chain has one).
    pub first: i64,
    /// Last `seq` removed; the new checkpoint takes this number.
    pub last: i64,
    /// Awards under legal hold that records in the prefix name.
    pub held: Vec<String>,
    /// Outbox rows of claims in the prefix that are not yet published.
    pub unpublished: u64,
}

/// What purge batches removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Audit records (a previous checkpoint included).
    pub records: u64,
    /// Claims, each with its disbursement and outbox row.
    pub claims: u64,
    /// Dead-letter rows.
    pub dead_letters: u64,
}

/// Retention: legal holds, and removing a prefix of the chain with exactly the rows it
/// describes. Nothing here decides *whether* a purge is allowed (the retention window is
/// `ops::retention`'s business); it only does what it is asked, atomically per batch.
pub trait Retention: Send + Sync {
    /// Places a hold at `now` and, in the same transaction, appends a `hold_added` audit record
    /// (award, `detail::hold_added(reason)`) to the chain; false, writing nothing, if the award
    /// was already held.
    fn hold_add(&self, award_id: &str, reason: &str, now: &str) -> Result<bool>;

    /// Lifts a hold and, in the same transaction, appends a `hold_removed` audit record
    /// (award, `detail::hold_removed(reason, held_at)`) at `now`; false, writing nothing, if
    /// there was none.
    fn hold_remove(&self, award_id: &str, now: &str) -> Result<bool>;

    /// Every hold, by award.
    fn holds(&self) -> Result<Vec<Hold>>;

    /// How many claims of `award_id` the ledger holds (purged ones not counted), for `hold
    /// add` to say when it holds an award nothing was paid to yet. Reads every claim on a
    /// large ledger (no index leads with the award): for an operator's command, not a hot path.
    fn claims_of(&self, award_id: &str) -> Result<u64>;

    /// In one read snapshot: finds the audit prefix recorded before `cutoff` (it ends before
    /// the first non-checkpoint record at or after `cutoff`), hands the plan to `admit` — which
    /// refuses by returning an error, and then nothing is exported — and then passes every row
    /// a purge of that prefix removes to `row` as `{"table": .., "row": ..}`, audit records of
    /// each batch first, in batches of at most `batch_records_max` records. Returns the plan and
    /// each batch's last `seq`, or `None` when nothing is that old.
    fn export_purge(
        &self,
        cutoff: &str,
        batch_records_max: usize,
        admit: &mut dyn FnMut(&PurgePlan) -> Result<()>,
        row: &mut dyn FnMut(&serde_json::Value) -> Result<()>,
    ) -> Result<Option<(PurgePlan, Vec<i64>)>>;

    /// Removes records `first..=last` with the claims, disbursements, outbox rows and
    /// dead-letter rows they describe, leaves a tombstone (key, `claimed_at`, `purged_at` =
    /// `now`; nothing else) for every claim removed, and leaves one checkpoint record at `last`
    /// carrying `detail` and continuing from record `last`'s hash — in one transaction, so
    /// `verify` passes after every batch. Tombstones are never removed. `cutoff` is the one the plan was made for: only claims made
    /// before it are removed. Refuses, removing nothing, if an award in the batch has come
    /// under hold since the plan ([`crate::Error::Other`]), or if a `processed` record in the
    /// batch has no claim made before `cutoff` to take with it, as in a hand-edited or
    /// clock-skewed ledger ([`crate::Error::Invariant`]).
    fn purge_batch(
        &self,
        first: i64,
        last: i64,
        cutoff: &str,
        detail: &str,
        now: &str,
    ) -> Result<Removed>;
}

/// A backup being put in place of a ledger by `claimgate restore`: prepared beside the
/// ledger, adjusted, then swapped in whole. Dropped before [`Restoring::commit`], it leaves the
/// ledger as it was and removes its own copy.
pub trait Restoring {
    /// The backup's `ledger_id`, if it has one (a backup made before any relay ran may not).
    fn ledger_id(&self) -> Option<String>;

    /// The highest outbox id the backup had ever assigned.
    fn outbox_id_max(&self) -> i64;

    /// Prepares the copy for an events stream whose mark says ids up to `upto` of this very
    /// ledger were published: marks the copy's unpublished rows at or below `upto` published
    /// at `now` (they are on the stream: same ledger, same ids, same rows), moves its outbox
    /// id sequence to at least `upto` (so new rows get ids the relay has never skipped), and
    /// appends a `restored` audit record saying so, in one transaction. Returns how many rows
    /// it marked. Call at most once.
    fn adopt_mark(&mut self, upto: i64, now: &str, events_stream: &str) -> Result<u64>;

    /// Puts the copy in place of the ledger. The ledger it replaces (if any) is kept beside
    /// it under a new name, which is returned with what was paid there and not in the backup;
    /// at no moment is the ledger's path half-written.
    fn commit(self: Box<Self>) -> Result<Option<Replaced>>;
}

/// The ledger a restore replaced, kept beside the restored one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    /// Where it is kept.
    pub path: std::path::PathBuf,
    /// Claims it holds that the restored ledger does not (paid after the backup was made):
    /// they now exist only in the replaced file.
    pub claims_only_there: u64,
    /// Their disbursements, in cents.
    pub cents_only_there: i64,
}

use super::review::Review;

/// Every side of a ledger at once: what the CLI's open step returns.
pub trait Backend: Ledger + Outbox + AuditLog + Inspect + Retention + Backup + Review {}
impl<T: Ledger + Outbox + AuditLog + Inspect + Retention + Backup + Review> Backend for T {}
