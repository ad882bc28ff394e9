//! The ledger: where claims, disbursements, outbox rows and audit records live.
//!
//! Everything above this folder — the worker, the relay, the operator commands, the health
//! check — sees a ledger only through the traits below, each written for the one caller that
//! needs it: [`Ledger`] (the worker), [`Outbox`] (the relay), [`AuditLog`] (export and chain
//! verification), [`Inspect`] (verify, status, `/healthz`), [`Retention`] (purge and legal
//! holds), [`Backup`] and [`Review`] (a reviewer's decision on a conflict held for review,
//! `review.rs`). [`Backend`] is all of them together: what the one open step,
//! [`open`] (and [`open_waiting`] for long-running processes), hands out after choosing the
//! backend from the `--db` value. [`Restoring`] is `claimgate restore`'s, from
//! [`prepare_restore`]: a backup put in place of the ledger, not a side of an open one.
//! Implementations: [`sqlite`] (the embedded default), [`postgres`] (the shared ledger of
//! several nodes) and
//! `MemoryLedger` (tests; it keeps the same contract, and the contract tests in
//! `tests/it/contract.rs` run against both). `chain` is the audit-chain walk they share;
//! `checks`, `records` and `purge` are the other rules SQLite and PostgreSQL both keep, on
//! rows each reads itself.
//!
//! Invariant: nothing outside `ledger/sqlite/` names SQLite and nothing outside
//! `ledger/postgres/` names PostgreSQL; everything else holds a
//! `dyn Backend` (or the one trait it needs) from [`open`].
//!
//! # The contract every implementation keeps
//!
//! 1. **Atomic batches.** [`Ledger::record`] writes a whole batch — claims, disbursements,
//!    outbox rows, dead-letter rows, audit records — in one transaction, or nothing of it. An
//!    error means nothing of the batch is visible to any reader, now or after a crash.
//! 2. **One outcome per item, in item order.** `record` returns exactly `items.len()` outcomes,
//!    the `n`th describing `items[n]`.
//! 3. **Duplicates decided in batch order.** Items are claimed one at a time in slice order, so
//!    the second of two items with one key inside a batch is a [`Outcome::Duplicate`] of the
//!    first, exactly as if it had come in a later batch. Uniqueness is enforced by the store
//!    itself, not only by the code path that claims (on SQLite a UNIQUE constraint), so no code
//!    path can claim a key twice or post a second disbursement for one claim. A dead letter is
//!    recorded once per stream entry id (a held conflict counts as one): a second delivery of
//!    the same entry is [`Outcome::AlreadyDeadLettered`] and writes nothing. A conflict names
//!    the earliest claim with the same award and submission *instant* and another key, claims
//!    made earlier in the same batch included. The instant is
//!    [`Submission::submission_instant`], compared exactly: `…09:00:00Z`, `…11:00:00+02:00`
//!    and `…09:00:00.000Z` are one instant (and three keys, three submissions), so each later
//!    one conflicts with the first. Every claim stores its instant, and a ledger made before
//!    instants were stored has them filled in when it is opened.
//! 4. **A linear audit chain.** Every effect leaves its audit records in the same transaction:
//!    one `processed`, `duplicate`, `dead_letter` or `vanished` record per item, plus a
//!    `conflict` record for a conflicting resubmission (and a `dead_letter` record when it is
//!    held). An [`Item::Vanished`] writes its `vanished` record every time it is recorded,
//!    with no once-per-entry check: the worker records it before the XACK that forgets the
//!    entry, so a lost XACK can leave a second record of the same entry id. Records get consecutive `seq` numbers in commit order across all
//!    writers (two concurrent batches never interleave or share a `seq`), and each record's
//!    `hash = sha256(prev_hash || canonical JSON)` as [`crate::domain::audit::Record::seal`]
//!    computes it: the fields hashed are exactly the record's columns, byte for byte as stored.
//!    Outside `record`, [`Retention::hold_add`], [`Retention::hold_remove`] and a restore
//!    ([`Restoring::adopt_mark`]) append `hold_added`, `hold_removed` and `restored` records to
//!    the same chain under the same rules, in the transaction that makes the change.
//! 5. **Outbox rows become visible in id order.** Once [`Outbox::rows_after`] has returned a
//!    row with id `n`, no row with an id below `n` can ever become visible later, and ids are
//!    never reused (not even after a purge). The relay's exactly-once argument rests on this:
//!    it skips ids at or below the events stream's position, which is only safe if nothing can
//!    appear below it. SQLite keeps it because it has one writer at a time and `outbox.id` is AUTOINCREMENT;
//!    a backend with concurrent writers must serialize id assignment with commit order
//!    (PostgreSQL numbers rows under the chain-head row lock it holds until COMMIT:
//!    `ledger/postgres/outbox.rs`).
//! 6. **Purged claims still suppress.** A retention purge leaves a tombstone for every claim
//!    it removes: the key and when it was claimed (plus when it was purged), no award, no
//!    amount, nothing else. A submission whose key has a tombstone is a duplicate forever:
//!    [`Outcome::Duplicate`] with `purged_at`, and a `duplicate` record worded by
//!    [`crate::domain::audit::detail::duplicate_of_purged`]; it is never claimed or paid again.
//!    A key is never both claimed and tombstoned. The fast filter's markers are confirmed
//!    against claims and tombstones alike ([`Item::KnownDuplicate`]).
//! 7. **Errors say whether to retry.** An error for which [`crate::Error::is_transient`] is
//!    true (busy, locked, full, connection lost, serialization failure) changed nothing and may
//!    succeed later; the worker backs off and retries the whole batch. Anything else is
//!    permanent.
//! 8. **Deferral, on a shared ledger only.** A backend with concurrent writers may answer
//!    [`Outcome::Deferred`] for a submission whose (instant, award) group another writer's
//!    uncommitted batch holds, instead of waiting for that batch to commit. Nothing of the
//!    deferred item is written; the rest of the batch commits as usual (point 1 covers what
//!    was written). Items with one key, or conflicting keys, share a group, so they are deferred
//!    together and point 3 is unchanged. The caller must not acknowledge a deferred entry and
//!    must offer it again, to the same ledger handle, before anything read after it; on that
//!    second offer the backend waits for the group, so no entry is deferred for ever. SQLite and the memory ledger
//!    never defer (one writer at a time).
//! 9. **Writers in turn.** A backend that takes concurrent writers says how many batches one
//!    worker may have in [`Ledger::record_in_turn`] at once ([`Ledger::writers`]; 1 for
//!    SQLite and the memory ledger). Each batch calls its `locked` hook once it holds every
//!    (instant, award) group it will write under, saying whether it deferred anything; the
//!    worker starts the next batch only after that hook said "nothing deferred", or after the
//!    deferred items were offered again and took their groups, or after the batch returned.
//!    So batches take their groups in the order the worker read them: on every group two
//!    batches share, the one read first writes first, and point 8's second offer still comes
//!    before anything read after it. Only the locking is in turn; the rest of one batch (its
//!    reads, writes and commit) overlaps the next one's.

pub(crate) mod chain;
mod checked;
pub(crate) mod checks;
mod contract;
pub mod copy;
pub(crate) mod decide;
mod memory;
mod open;
pub mod postgres;
pub(crate) mod purge;
pub(crate) mod records;
mod review;
pub mod sqlite;
pub mod sweep;

pub use checked::Checked;
pub(crate) use contract::{warn_unconfirmed_marker, Counts};
pub use contract::{
    AuditLog, Backend, Backup, BackupCopied, Hold, Inspect, Item, Ledger, Outbox, OutboxRow,
    Outcome, PurgePlan, Removed, Replaced, Restoring, Retention, Since, Stats, Summary,
};
pub use memory::{MemoryLedger, MemoryStore};
pub use open::{migrate, open, open_waiting, prepare_restore, Migrated};
pub use review::{
    Decided, HeldConflict, HoldDecision, LetterState, PastDecision, Review, Verdict,
    AWAITING_REVIEW, CONFLICT_HOLD,
};
