//! A ledger's rows in a form neither backend owns, for `claimgate migrate`: the SQLite ledger
//! hands them out (`SqliteLedger::dump`), the PostgreSQL ledger takes them in
//! (`PgLedger::load`), and `open::migrate` joins the two. Every column is carried as stored,
//! ids included, so the audit chain (which hashes exactly these values) is unchanged.

use crate::domain::audit::Record;
use crate::domain::key::IdempotencyKey;
use crate::error::Result;
use crate::ledger::Hold;

/// One row of one table.
#[derive(Debug, Clone)]
pub enum Row {
    /// `processed_messages`.
    Claim {
        /// `claim_id`.
        claim_id: i64,
        /// The key.
        key: IdempotencyKey,
        /// The award.
        award_id: String,
        /// The timestamp as submitted.
        submission_timestamp: String,
        /// The amount.
        amount_cents: i64,
        /// When it was claimed.
        claimed_at: String,
        /// The entry that carried it.
        stream_entry_id: String,
        /// The consumer that claimed it.
        consumer: String,
        /// The instant the timestamp names.
        submission_instant: String,
    },
    /// `disbursements`.
    Disbursement {
        /// `id`.
        id: i64,
        /// The claim it pays.
        claim_id: i64,
        /// The key.
        key: IdempotencyKey,
        /// The award.
        award_id: String,
        /// The amount.
        amount_cents: i64,
        /// When it was recorded.
        recorded_at: String,
    },
    /// `outbox`, published state kept.
    Outbox {
        /// `id`: the event id.
        id: i64,
        /// The claim.
        claim_id: i64,
        /// The event type.
        event_type: String,
        /// The event JSON.
        payload: String,
        /// Whether the event is exactly the one the claim spells (`event::announcing`): a
        /// ledger that spells events from claims stores none for such a row.
        spelled_by_claim: bool,
        /// When it was written.
        created_at: String,
        /// When it was relayed, if it was.
        published_at: Option<String>,
    },
    /// `dead_letters`.
    DeadLetter {
        /// The stream.
        stream: String,
        /// The entry.
        stream_entry_id: String,
        /// The class.
        reason_code: String,
        /// The reason.
        reason: String,
        /// The award, if known.
        award_id: Option<String>,
        /// Deliveries.
        delivery_count: i64,
        /// When.
        recorded_at: String,
        /// A reviewer's decision on a held conflict: `decision`, `decided_by`,
        /// `decided_reason`, `decided_at` (`ledger::review`), all `None` while awaiting.
        decision: [Option<String>; 4],
    },
    /// `audit_log`, exactly as sealed (hold and restore records included: they are chain
    /// records like any other).
    Audit(Record),
    /// `claim_tombstones`: a purged claim's key and times, which must keep suppressing the key
    /// in the copy.
    Tombstone {
        /// The key.
        key: IdempotencyKey,
        /// When its claim was made.
        claimed_at: String,
        /// When a purge removed the claim.
        purged_at: String,
    },
    /// `legal_holds`.
    Hold(Hold),
    /// `ledger_meta` (the ledger's identity, which the relay's high-water mark names).
    Meta {
        /// The fact's name.
        name: String,
        /// Its value.
        value: String,
    },
}

/// What the rows alone do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// The highest outbox id ever used, purged rows included: no id at or below it may be
    /// handed out again.
    pub outbox_id_last: i64,
}

/// Where `dump` sends rows.
pub type Sink<'a> = dyn FnMut(Row) -> Result<()> + 'a;
