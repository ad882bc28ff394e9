//! The ledger: where claims, disbursements, outbox rows and audit records live.
//!
//! The worker sees only the [`Ledger`] trait, so a shared PostgreSQL ledger for multi-node
//! deployments can slot in beside [`SqliteLedger`] without touching it. The one promise every
//! implementation keeps: [`Ledger::record`] writes all of a batch's effects in one transaction,
//! or none of them.

pub mod sqlite;

pub use sqlite::{Checkpointer, SqliteLedger, SCHEMA};

use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::Result;

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
    /// A submission the fast filter (`--fast-filter`) saw committed earlier: leave its
    /// `duplicate` audit record without probing the claim index.
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
}

/// What recording one item did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The claim was new: disbursement, outbox row and audit record written.
    Processed,
    /// The key was already claimed; nothing but a `duplicate` audit record was written.
    Duplicate {
        /// When the key was first claimed: the evidence of why nothing was paid twice.
        first_claimed_at: String,
    },
    /// The dead letter's audit record was written (first time this entry was dead-lettered).
    DeadLettered,
    /// This entry had already been dead-lettered by an earlier delivery; nothing written.
    AlreadyDeadLettered,
    /// Processed and paid, but an earlier claim has the same award and submission time with a
    /// different payload: a `conflict` record linking both keys was written too.
    ProcessedConflicting {
        /// The earlier claim's key, in hex.
        other_key: String,
    },
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

/// Ledger-wide counts, as `status` shows them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Rows in `processed_messages`.
    pub claims: u64,
    /// Rows in `disbursements`.
    pub disbursements: u64,
    /// Sum of `disbursements.amount_cents`.
    pub disbursed_cents_total: i64,
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
    /// All audit records.
    pub audit_records: u64,
}

/// The narrow interface the worker needs from any ledger.
pub trait Ledger: Send + Sync {
    /// Records a batch in one transaction (claims, effects, audit records) and returns one
    /// outcome per item, in order. On error nothing of the batch is visible.
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>>;

    /// Counts and totals for `status` and metrics.
    fn stats(&self) -> Result<Stats>;
}
