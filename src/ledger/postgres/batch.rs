//! [`Ledger::record`](crate::ledger::Ledger::record) on PostgreSQL: one transaction per batch,
//! several nodes writing at once.
//!
//! The steps, each one statement over arrays (UNNEST), in one fixed lock order so concurrent
//! batches cannot deadlock. This file runs them in order; each lives in its own file: step 1
//! in `stripes.rs`, step 2 in `facts.rs`, step 3 in `ledger/decide.rs` (shared by every
//! ledger), steps 4 and 5 in `write.rs`, step 6 in `link.rs`.
//! 1. **Group locks.** The batch locks, for each (submission instant, award) it claims for, that
//!    group's stripe: one row of `claim_locks` (`schema_postgres.sql`), [`CLAIM_STRIPES`](super::stripes::CLAIM_STRIPES) rows
//!    in all, the stripe a hash of the group ([`group_stripe`](super::stripes::group_stripe)). Two batches that could claim
//!    the same key or conflict with each other share a group, so a stripe; batches on
//!    different awards almost never meet. This makes what step 2 reads exact: no other
//!    transaction can claim a key or a conflicting submission of these groups until we commit.
//!    The stripes of items offered again after a deferral are waited for (`FOR UPDATE`, in
//!    sorted order); every other stripe is only tried (`FOR UPDATE SKIP LOCKED`, sorted, after
//!    the waits), and the items whose stripe another batch holds are deferred (contract point
//!    8) instead of making this whole batch wait for that one's commit. Waits come before
//!    tries, and waits are sorted, so no cycle of waits can form: a batch waiting holds only
//!    stripes below the one it waits for, all of them taken by waiting.
//!    Row locks, not advisory locks: a row lock lives in the row, not in the server's shared
//!    lock table, so a batch of any size takes the same few heavyweight locks (its tables and
//!    indexes, and one tuple lock while it waits). With one advisory lock per group, three
//!    nodes' batches of 100,000 filled a stock server's lock table (`max_locks_per_transaction`
//!    64): SQLSTATE 53200 for claimgate and for every other application on the server.
//! 2. **Facts.** The claims of each of the batch's groups, earliest first, and the tombstones
//!    of its keys, in one statement, so one snapshot: a purge deletes a claim and writes its
//!    tombstone in one transaction, so a purged key is seen either still claimed or
//!    tombstoned, never neither. A group's claims say both which of its keys are claimed and
//!    which claim a new one conflicts with (the earliest with another key). A group with more
//!    claims than one read returns has the keys not found among them looked up one by one,
//!    claims and tombstones again in one statement.
//! 3. **Decide**, in item order, in memory, exactly as `sqlite/batch.rs` and the memory ledger
//!    do: an earlier item of the batch counts as claimed for every later one (contract point 3);
//!    a tombstoned key is a duplicate before anything else is asked (point 6); a fast-filter
//!    marker is confirmed against the claims and tombstones read in step 2, or warned about and
//!    decided as the submission it is.
//! 4. **Write** dead letters and holds (`ON CONFLICT DO NOTHING RETURNING`: once per entry),
//!    the new claims (sorted by the claim index's own order; `ON CONFLICT DO NOTHING
//!    RETURNING` — with the group locks held every one of them must take, which is asserted),
//!    and their disbursements (one statement: each disbursement is made from its claim row).
//! 5. **The batch's records and outbox rows, then COMMIT.** The audit records are sealed as
//!    one batch of members (`domain::audit::seal_batch`: among themselves, not after the
//!    chain's head, so no lock is needed to seal them; nor a claim id, so a large batch's are
//!    sealed, and its events spelled, on a thread of their own while the server runs step 4's
//!    claims insert); one `audit_batches` row names how many
//!    there are, the last one's hash and how many outbox rows the batch wrote; the members and
//!    the outbox rows (numbered within the batch, with no ids yet) go in by binary COPY. COMMIT:
//!    the batch's effects are durable, and no lock any other node waits for was held.
//! 6. **Link**, in a second transaction: one call of `claimgate_link` (`schema_postgres.sql`),
//!    one statement outside any transaction, which gives this batch its seqs, its outbox ids
//!    and its link record sealed after the head as it read it, then moves the head from exactly
//!    that to past the batch (compare-and-set; a try another link beat is rolled back and made
//!    again), and commits without waiting for the disk. The head's row lock is the one lock
//!    every node shares, and it is held for that one row update and the commit, whatever the
//!    batch's size (contract points 4 and 5; ARCHITECTURE.md gives the argument); its hold is
//!    measured (`link::head_hold`). A link that fails for a transient reason, or a writer that
//!    stops before it, leaves the batch committed and unlinked: the outcomes stand (they are
//!    durable), and a node's start or a relay round links it (`claimgate_link` with no batch
//!    named: the oldest not linked, call after call).

use super::connect::Conn;
use super::facts::{self, Facts};
use super::stripes::{self, group_stripe};
use super::{link, write};
use crate::config::OnConflict;
use crate::domain::audit::Record;
use crate::domain::submission::Submission;
use crate::error::{Error, Result};
use crate::ledger::decide::{self, Delivered, Stamp, Verdict};
use crate::ledger::{Item, Outcome};
use crate::support::failpoint;
use crate::support::threads::spawn_named;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Who is recording, from where, under which conflict policy.
pub(super) struct Context<'a> {
    /// The consumer name, written into every audit record.
    pub(super) consumer: &'a str,
    /// The submissions stream (dead letters are keyed by stream and entry id).
    pub(super) stream: &'a str,
    /// What to do with a conflicting resubmission.
    pub(super) on_conflict: OnConflict,
    /// Entry ids this ledger handle deferred and not yet saw again: their groups are waited
    /// for on the next offer (contract point 8).
    pub(super) deferred: &'a Mutex<HashSet<String>>,
    /// Paying a held conflict a reviewer approved (`review.rs`): its `conflict` record says so.
    pub(super) approving: bool,
}

/// Records `items` in one transaction on `conn`; see the module doc for the steps.
pub(super) fn record<'a>(
    conn: &mut Conn,
    ctx: &Context<'_>,
    items: &[Item<'a>],
    locked: &mut dyn FnMut(bool),
) -> Result<Vec<Outcome>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let outcomes = record_with(conn, ctx, items, locked, &mut |_, _, _, _| Ok(true))?;
    Ok(outcomes.expect("a batch with no last step is never given up"))
}

/// The last step of a batch before its claims and records are written, inside its
/// transaction, once every item is decided and its group locked: given the transaction, the
/// outcomes, the batch's unsealed records (to add to) and the batch's time, it says whether
/// to go on (`false`: the batch is rolled back and nothing of it is written).
pub(super) type LastStep<'s> = dyn FnMut(&mut postgres::Transaction<'_>, &[Outcome], &mut Vec<Record>, &str) -> Result<bool>
    + 's;

/// [`record`], calling `last` before anything but dead letters is written (`review.rs` records
/// a reviewer's decision there, so the decision and the payment commit together); `None` when
/// `last` gave the batch up.
pub(super) fn record_with<'a>(
    conn: &mut Conn,
    ctx: &Context<'_>,
    items: &[Item<'a>],
    locked: &mut dyn FnMut(bool),
    last: &mut LastStep<'_>,
) -> Result<Option<Vec<Outcome>>> {
    let locks = stripes::Statements::prepare(conn)?;
    let reads = facts::Statements::prepare(conn)?;
    let writes = write::Statements::prepare(conn)?;
    let now = crate::domain::clock::now_rfc3339();
    let mut tx = conn.client.transaction()?;

    // Step 1. A fast-filter hit may turn out unconfirmed and be claimed: its group is locked too.
    let groups: Vec<Option<i32>> = items
        .iter()
        .map(|i| Delivered::of(i).map(|d| group_of(d.submission)))
        .collect();
    failpoint::hit("before_locks");
    let busy = stripes::lock_groups(&mut tx, &locks, ctx.deferred, items, &groups)?;
    let deferred: Vec<bool> = groups
        .iter()
        .map(|g| g.is_some_and(|g| busy.contains(&g)))
        .collect();
    // Every group this batch writes under is held: the worker's next batch may take its own
    // (contract point 9).
    locked(deferred.contains(&true));
    // Steps 2 and 3.
    let verdicts = decide_all(&mut tx, &reads, ctx.on_conflict, items, &deferred, &now)?;
    // Step 4a, then each item's outcome and records.
    let first_dead =
        write::insert_dead_letters(&mut tx, &writes, ctx.stream, items, &verdicts, &now)?;
    failpoint::hit("pg_after_dead_letters");
    let new_claims = write::claimed(items, &verdicts);
    // Their submissions in item order, whose events the batch spells.
    let paid: Vec<&Submission> = new_claims.iter().map(|(s, _)| *s).collect();
    let stamp = Stamp {
        consumer: ctx.consumer,
        stream: ctx.stream,
        now: &now,
        approving: ctx.approving,
    };
    let mut members = Vec::with_capacity(items.len());
    let outcomes: Vec<Outcome> = items
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(n, (item, verdict))| match verdict {
            None => Outcome::Deferred,
            Some(v) => decide::settle(item, v, first_dead.contains(&n), &stamp, &mut members),
        })
        .collect();
    if !last(&mut tx, &outcomes, &mut members, &now)? {
        return Ok(None);
    }
    // Steps 4b and 5.
    let claims = Claims {
        new: new_claims,
        paid,
    };
    let written =
        write_claims_and_records(&mut tx, &writes, ctx.consumer, claims, &mut members, &now)?;
    failpoint::hit(if ctx.approving {
        "before_decision_commit"
    } else {
        "before_commit"
    });
    tx.commit()?;
    // After the commit: a batch that failed is retried whole, offers and all.
    stripes::note_deferred(ctx.deferred, items, &deferred);
    // Step 6.
    if let Some(batch) = written {
        failpoint::hit("before_link");
        link::link_committed(conn, batch)?;
    }
    Ok(Some(outcomes))
}

/// The stripe of `s`'s (instant, award) group.
fn group_of(s: &Submission) -> i32 {
    group_stripe(&s.submission_instant, &s.award_id)
}

/// Steps 2 and 3: reads what the database holds about the submissions not deferred, then
/// decides each item in item order; `None` for a deferred one.
fn decide_all(
    tx: &mut postgres::Transaction<'_>,
    reads: &facts::Statements,
    policy: OnConflict,
    items: &[Item<'_>],
    deferred: &[bool],
    now: &str,
) -> Result<Vec<Option<Verdict>>> {
    let subs: Vec<&Submission> = items
        .iter()
        .zip(deferred)
        .filter(|(_, d)| !**d)
        .filter_map(|(i, _)| Delivered::of(i).map(|d| d.submission))
        .collect();
    let mut facts = Facts::new(now);
    if !subs.is_empty() {
        facts::read(tx, reads, &subs, &mut facts)?;
    }
    items
        .iter()
        .zip(deferred)
        .map(|(item, d)| match d {
            true => Ok(None),
            false => decide::decide(item, policy, &mut facts).map(Some),
        })
        .collect()
}

/// A batch's new claims: (submission, entry id) each, and their submissions in item order.
struct Claims<'a> {
    new: Vec<(&'a Submission, &'a str)>,
    paid: Vec<&'a Submission>,
}

/// Steps 4b and 5: the new claims and their disbursements, then the sealed records and the
/// outbox rows; the batch's id, or `None` when it has no records.
///
/// The records need no claim id: a large batch's are sealed on a thread of their own while the
/// server inserts the claims, which the writer only waits for.
fn write_claims_and_records(
    tx: &mut postgres::Transaction<'_>,
    writes: &write::Statements,
    consumer: &str,
    claims: Claims<'_>,
    members: &mut [Record],
    now: &str,
) -> Result<Option<i64>> {
    let Claims { new, paid } = claims;
    let (claim_ids, last_hash) = if members.len() < SEAL_APART_RECORDS_MIN {
        let claim_ids = write::insert_claims(tx, writes, consumer, new, now)?;
        (claim_ids, seal(members))
    } else {
        std::thread::scope(|scope| {
            let sealing = spawn_named(scope, "seal", || seal(members));
            let claim_ids = write::insert_claims(tx, writes, consumer, new, now);
            let sealed = sealing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            claim_ids.map(|ids| (ids, sealed))
        })?
    };
    let paid = with_claim_ids(paid, &claim_ids)?;
    match last_hash {
        Some(last_hash) => {
            write::write_sealed(tx, writes, members, &last_hash, &paid, now).map(Some)
        }
        None => Ok(None),
    }
}

/// Each paid submission with its claim id.
fn with_claim_ids<'a>(
    paid: Vec<&'a Submission>,
    claim_ids: &HashMap<crate::domain::key::IdempotencyKey, i64>,
) -> Result<Vec<(i64, &'a Submission)>> {
    paid.into_iter()
        .map(|s| {
            let claim_id = *claim_ids.get(&s.key).ok_or_else(|| {
                Error::Invariant(format!("no claim id for new claim {}", s.key.to_hex()))
            })?;
            Ok((claim_id, s))
        })
        .collect()
}

/// Seals `members` as one batch: the batch's last hash, `None` for no members. (The events
/// are not spelled here: the rows store none, `write::COPY_OUTBOX`.)
fn seal(members: &mut [Record]) -> Option<String> {
    (!members.is_empty()).then(|| crate::domain::audit::seal_batch(members))
}

/// Records in a batch from which `record` seals them on a thread of their own, beside the
/// claims insert. A smaller batch seals them inline: a thread's start would cost a lone
/// submission more than its one seal.
const SEAL_APART_RECORDS_MIN: usize = 256;
