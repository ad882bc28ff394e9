//! [`Ledger::record`](crate::ledger::Ledger::record) on PostgreSQL: one transaction per batch,
//! several nodes writing at once.
//!
//! The steps, each one statement over arrays (UNNEST), in one fixed lock order so concurrent
//! batches cannot deadlock:
//! 1. **Group locks.** The batch locks, for each (submission instant, award) it claims for, that
//!    group's stripe: one row of `claim_locks` (`schema_postgres.sql`), [`CLAIM_STRIPES`] rows
//!    in all, the stripe a hash of the group ([`group_stripe`]). Two batches that could claim
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
//!    measured ([`head_hold`]). A link that fails for a transient reason, or a writer that
//!    stops before it, leaves the batch committed and unlinked: the outcomes stand (they are
//!    durable), and a node's start or a relay round links it (`claimgate_link` with no batch
//!    named: the oldest not linked, call after call).

use super::connect::Conn;
use crate::config::OnConflict;
use crate::domain::audit::Record;
use crate::domain::event::{self, DISBURSEMENT_RECORDED};
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::{Error, Result};
use crate::ledger::decide::{self, DeadRow, Delivered, Other, Purged, Stamp, Verdict};
use crate::ledger::{Item, Outcome};
use crate::support::failpoint;
use crate::support::threads::spawn_named;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// How many stripes `claim_locks` holds: rows 0 to `CLAIM_STRIPES - 1`, made with the ledger.
/// Enough that two batches of a thousand groups share a stripe needlessly about 15 times
/// (a deferral each, never a wrong answer), few enough that the table is 300 pages.
pub const CLAIM_STRIPES: i32 = 65_536;

/// Waits for and locks the stripes `$1` (sorted), returning each one it locked.
const LOCK_GROUPS: &str = "SELECT stripe FROM claim_locks WHERE stripe = ANY($1::int4[])
     ORDER BY stripe FOR UPDATE";

/// Locks the stripes of `$1` (sorted) no other transaction holds, returning them.
const TRY_GROUPS: &str = "SELECT stripe FROM claim_locks WHERE stripe = ANY($1::int4[])
     ORDER BY stripe FOR UPDATE SKIP LOCKED";

/// Claims and tombstones of the batch's keys, in one statement (one snapshot; see step 2).
// Both lookups probe an index once per element, whatever the planner believes about the
// tables' sizes. Each is a LATERAL subquery with `LIMIT 1` (a no-op: claims and tombstones are
// unique on what is asked), because the planner flattens a plain LATERAL subquery into a join,
// and with a few thousand keys it then hashed the whole claims table on every batch: 49 ms per
// batch of 4,000 on a ledger of 80,000 claims against 8 ms probed, growing with the ledger
// (BENCHMARKS.md). Claims are probed by (instant, award, key), the claim's own unique index
// (claim_instant on ledgers of the first release). Tombstones are probed only in a ledger that
// has one: the uncorrelated EXISTS is evaluated once per statement, in the same snapshot as
// the probes, so a never-purged ledger pays one read per batch, not one per key.
const CLAIMED: &str = "SELECT k.key, p.claimed_at, t.claimed_at, t.purged_at
     FROM UNNEST($1::text[], $2::text[], $3::bytea[]) AS k(instant, award, key)
     LEFT JOIN LATERAL (
         SELECT claimed_at FROM processed_messages
         WHERE submission_instant = k.instant AND award_id = k.award AND idempotency_key = k.key
         LIMIT 1
     ) p ON true
     LEFT JOIN LATERAL (
         SELECT claimed_at, purged_at FROM claim_tombstones
         WHERE idempotency_key = k.key AND EXISTS (SELECT 1 FROM claim_tombstones)
         LIMIT 1
     ) t ON true
     WHERE p.claimed_at IS NOT NULL OR t.claimed_at IS NOT NULL";

/// Step 2 in one statement (one snapshot): the claims of each of the batch's groups, earliest
/// first, up to [`GROUP_CLAIMS_READ`] per group, and the tombstones of its keys.
// A group's claims, read by its (instant, award) prefix of the claim index, answer both
// questions at once: which of the batch's keys are claimed (a claimed key's claim is in its
// own group, as the key hashes the award and the time) and which claim a new one conflicts
// with. One probe per group instead of one per key and one per group: groups almost always
// hold no claim or one. A group that fills the read may hold more; its keys not among those
// read are asked of `CLAIMED`, one probe each (`read_facts`). Tombstones as in `CLAIMED`.
static FACTS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT g.i, g.a, e.idempotency_key, e.claimed_at, e.claim_id, NULL::text
         FROM (SELECT DISTINCT i, a FROM UNNEST($1::text[], $2::text[]) AS u(i, a)) g
         CROSS JOIN LATERAL (
             SELECT idempotency_key, claimed_at, claim_id FROM processed_messages
             WHERE submission_instant = g.i AND award_id = g.a
             ORDER BY claim_id LIMIT {GROUP_CLAIMS_READ}
         ) e
         UNION ALL
         SELECT NULL, NULL, k.key, t.claimed_at, NULL, t.purged_at
         FROM UNNEST($3::bytea[]) AS k(key)
         CROSS JOIN LATERAL (
             SELECT claimed_at, purged_at FROM claim_tombstones
             WHERE idempotency_key = k.key AND EXISTS (SELECT 1 FROM claim_tombstones)
             LIMIT 1
         ) t"
    )
});

/// Claims of a group `FACTS` reads. Past it, a key not among them is looked up by itself.
const GROUP_CLAIMS_READ: usize = 8;

const INSERT_DEAD: &str = "INSERT INTO dead_letters (stream, stream_entry_id, reason_code, reason,
         award_id, delivery_count, recorded_at)
     SELECT $1, e, c, r, a, n, $2
     FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], $7::int8[]) AS t(e, c, r, a, n)
     ON CONFLICT DO NOTHING RETURNING stream_entry_id";

/// The new claims and their disbursements, in one statement: each disbursement is made from
/// the claim row the insert returns, so the batch's keys, awards and amounts travel once.
const INSERT_CLAIMS: &str = "WITH c AS (
         INSERT INTO processed_messages (idempotency_key, award_id, submission_timestamp,
             amount_cents, claimed_at, stream_entry_id, consumer, submission_instant)
         SELECT k, a, ts, amt, $1, e, $2, i
         FROM UNNEST($3::bytea[], $4::text[], $5::text[], $6::int8[], $7::text[], $8::text[])
              AS t(k, a, ts, amt, e, i)
         ON CONFLICT DO NOTHING RETURNING idempotency_key, claim_id, award_id, amount_cents
     ), d AS (
         INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents,
             recorded_at)
         SELECT claim_id, idempotency_key, award_id, amount_cents, $1 FROM c
     )
     SELECT idempotency_key, claim_id FROM c";

const INSERT_BATCH: &str = "INSERT INTO audit_batches (record_count, last_hash, outbox_count,
         created_at) VALUES ($1, $2, $3, $4) RETURNING batch_id";

// Step 5's rows go in by binary COPY, the cheapest way PostgreSQL takes rows.
static COPY_MEMBERS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "COPY audit_members ({}) FROM STDIN (FORMAT binary)",
        super::audit_store::MEMBER_COLUMNS
    )
});

const COPY_OUTBOX: &str = "COPY outbox_rows (claim_id, event_type, payload, created_at, batch_id,
         batch_index) FROM STDIN (FORMAT binary)";

/// Step 6, on its own: one statement, so PostgreSQL commits it before it answers. `$2` is the
/// writer's own batch, or NULL for the oldest batch not linked yet that no writer holds.
const LINK: &str = "SELECT linked, waited_us, held_us FROM claimgate_link($1, $2)";

/// What the batch found in the database in step 2, and the claims it decided since: what a
/// PostgreSQL ledger answers [`decide`](decide::decide) with, under its group locks.
struct Facts {
    /// The batch's time, which its claims are made at.
    now: String,
    /// Claimed keys (before the batch, then the batch's own as they are decided) → claimed_at.
    claimed: HashMap<IdempotencyKey, String>,
    /// Tombstoned keys → (claimed_at, purged_at).
    tombstones: HashMap<IdempotencyKey, (String, String)>,
    /// Claims by (instant, award), earliest first: those read from before the batch, then the
    /// batch's own in item order.
    groups: HashMap<(String, String), Vec<(IdempotencyKey, String)>>,
}

impl<'a> decide::Facts<'a> for Facts {
    fn tombstone(&mut self, s: &Submission) -> Result<Option<Purged>> {
        Ok(self
            .tombstones
            .get(&s.key)
            .map(|(claimed_at, purged_at)| Purged {
                claimed_at: claimed_at.clone(),
                purged_at: purged_at.clone(),
            }))
    }

    fn claimed_at(&mut self, s: &Submission) -> Result<Option<String>> {
        Ok(self.claimed.get(&s.key).cloned())
    }

    fn earliest_other(&mut self, s: &Submission) -> Result<Option<Other>> {
        let group = self
            .groups
            .get(&(s.submission_instant.clone(), s.award_id.clone()));
        Ok(group
            .and_then(|g| g.iter().find(|(k, _)| *k != s.key))
            .map(|(k, at)| Other {
                key_hex: k.to_hex(),
                claimed_at: at.clone(),
            }))
    }

    /// Decided here, written by step 4, where the store's unique index must take every one
    /// (asserted: the group locks keep every other writer out of these groups).
    fn claim(&mut self, d: &Delivered<'a>) -> Result<Option<String>> {
        let s = d.submission;
        if let Some(at) = self.claimed.get(&s.key) {
            return Ok(Some(at.clone()));
        }
        self.claimed.insert(s.key, self.now.clone());
        self.groups
            .entry((s.submission_instant.clone(), s.award_id.clone()))
            .or_default()
            .push((s.key, self.now.clone()));
        Ok(None)
    }
}

/// How long each link held the chain-head row lock, in microseconds: from its compare-and-set
/// inside `claimgate_link` to the end of the function's work, on the server's clock (the
/// commit after it writes no WAL to disk), and, as an upper bound of the whole hold, the call's
/// time less what came before that try (which also counts the round trip and this process's
/// scheduling). For the summary [`head_hold`] gives, the benchmark's figures. Bounded: past
/// [`HEAD_HOLDS_MAX`] samples the oldest half is dropped.
static HEAD_HOLDS_US: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());

/// Samples kept for [`head_hold`].
const HEAD_HOLDS_MAX: usize = 1 << 20;

/// Percentiles of one kind of duration, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    /// Median.
    pub p50: u32,
    /// 99th percentile.
    pub p99: u32,
    /// Largest.
    pub max: u32,
}

impl Spread {
    fn of(mut v: Vec<u32>) -> Spread {
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Spread {
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// The chain-head lock's hold time over the links this process made so far, on the server's
/// clock, and its upper bound seen from here: `(links, hold, bound)`, or `None` before the
/// first.
pub fn head_hold() -> Option<(usize, Spread, Spread)> {
    let v = HEAD_HOLDS_US
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    let (hold, bound) = v.into_iter().unzip();
    Some((n, Spread::of(hold), Spread::of(bound)))
}

fn note_head_hold(held: Duration, bound: Duration) {
    let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
    let mut v = HEAD_HOLDS_US.lock().unwrap_or_else(|p| p.into_inner());
    if v.len() >= HEAD_HOLDS_MAX {
        v.drain(..HEAD_HOLDS_MAX / 2);
    }
    v.push((us(held), us(bound)));
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
    let st = Statements::prepare(conn)?;
    let now = crate::domain::clock::now_rfc3339();
    let mut tx = conn.client.transaction()?;

    // A fast-filter hit may turn out unconfirmed and be claimed: its group is locked too.
    let groups: Vec<Option<i32>> = items
        .iter()
        .map(|i| Delivered::of(i).map(|d| group_stripe(&d.submission.submission_instant, &d.submission.award_id)))
        .collect();
    failpoint::hit("before_locks");
    let busy = lock_groups(&mut tx, &st, ctx, items, &groups)?;
    let deferred: Vec<bool> = groups
        .iter()
        .map(|g| g.is_some_and(|g| busy.contains(&g)))
        .collect();
    // Every group this batch writes under is held: the worker's next batch may take its own
    // (contract point 9).
    locked(deferred.contains(&true));
    let subs: Vec<&Submission> = items
        .iter()
        .zip(&deferred)
        .filter(|(_, d)| !**d)
        .filter_map(|(i, _)| Delivered::of(i).map(|d| d.submission))
        .collect();
    let mut facts = Facts {
        now: now.clone(),
        claimed: HashMap::new(),
        tombstones: HashMap::new(),
        groups: HashMap::new(),
    };
    if !subs.is_empty() {
        read_facts(&mut tx, &st, &subs, &mut facts)?;
    }
    // Step 3: `None` for a deferred item.
    let verdicts = items
        .iter()
        .zip(&deferred)
        .map(|(item, d)| match d {
            true => Ok(None),
            false => decide::decide(item, ctx.on_conflict, &mut facts).map(Some),
        })
        .collect::<Result<Vec<_>>>()?;
    let first_dead = insert_dead_letters(&mut tx, &st, ctx, items, &verdicts, &now)?;
    let (new_claims, paid) = claimed(items, &verdicts);
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
    // The records and events need no claim id: a large batch's are sealed and spelled on a
    // thread of their own while the server inserts the claims, which the writer only waits for.
    let (claim_ids, (last_hash, payloads)) = if members.len() < SEAL_APART_RECORDS_MIN {
        let claim_ids = insert_claims(&mut tx, &st, ctx, new_claims, &now)?;
        (claim_ids, seal_and_spell(&mut members, &paid))
    } else {
        std::thread::scope(|scope| {
            let sealing = spawn_named(scope, "seal", || seal_and_spell(&mut members, &paid));
            let claim_ids = insert_claims(&mut tx, &st, ctx, new_claims, &now);
            let sealed = sealing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            claim_ids.map(|ids| (ids, sealed))
        })?
    };
    let paid: Vec<(i64, &Submission, String)> = paid
        .into_iter()
        .zip(payloads)
        .map(|(s, payload)| {
            let claim_id = *claim_ids.get(&s.key).ok_or_else(|| {
                Error::Invariant(format!("no claim id for new claim {}", s.key.to_hex()))
            })?;
            Ok((claim_id, s, payload))
        })
        .collect::<Result<_>>()?;
    let written = match last_hash {
        Some(last_hash) => Some(write_sealed(
            &mut tx, &st, &members, &last_hash, &paid, &now,
        )?),
        None => None,
    };
    failpoint::hit(if ctx.approving {
        "before_decision_commit"
    } else {
        "before_commit"
    });
    tx.commit()?;
    // After the commit: a batch that failed is retried whole, offers and all.
    note_deferred(ctx, items, &deferred);
    if let Some(batch) = written {
        failpoint::hit("before_link");
        link_committed(conn, batch)?;
    }
    Ok(Some(outcomes))
}

/// The batch's statements, prepared once per connection.
pub(super) struct Statements {
    lock_groups: postgres::Statement,
    try_groups: postgres::Statement,
    claimed: postgres::Statement,
    facts: postgres::Statement,
    insert_dead: postgres::Statement,
    insert_claims: postgres::Statement,
    insert_batch: postgres::Statement,
    copy_members: postgres::Statement,
    copy_outbox: postgres::Statement,
}

impl Statements {
    pub(super) fn prepare(conn: &mut Conn) -> Result<Self> {
        Ok(Statements {
            lock_groups: conn.prepared(LOCK_GROUPS)?,
            try_groups: conn.prepared(TRY_GROUPS)?,
            claimed: conn.prepared(CLAIMED)?,
            facts: conn.prepared(FACTS.as_str())?,
            insert_dead: conn.prepared(INSERT_DEAD)?,
            insert_claims: conn.prepared(INSERT_CLAIMS)?,
            insert_batch: conn.prepared(INSERT_BATCH)?,
            copy_members: conn.prepared(COPY_MEMBERS.as_str())?,
            copy_outbox: conn.prepared(COPY_OUTBOX)?,
        })
    }
}

/// The stripe (`claim_locks` row) of a (instant, award) group: the first 8 bytes of a SHA-256
/// of both, modulo [`CLAIM_STRIPES`]. Two groups sharing a stripe only wait for each other
/// needlessly. Public so an operator (or a test) can hold a group as another node's batch
/// would: `SELECT 1 FROM claim_locks WHERE stripe = N FOR UPDATE`.
pub fn group_stripe(instant: &str, award_id: &str) -> i32 {
    let mut h = Sha256::new();
    h.update(instant.as_bytes());
    h.update([0]);
    h.update(award_id.as_bytes());
    let d = h.finalize();
    let n = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
    (n % CLAIM_STRIPES as u64) as i32
}

/// Step 1: the group locks: waited for where an item is offered again after a deferral,
/// then tried for the rest, each set sorted. Returns the groups another batch holds.
fn lock_groups(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    ctx: &Context<'_>,
    items: &[Item<'_>],
    groups: &[Option<i32>],
) -> Result<HashSet<i32>> {
    let mut wait: Vec<i32> = Vec::new();
    let mut tried: Vec<i32> = Vec::new();
    {
        let deferred = ctx.deferred.lock().unwrap_or_else(|p| p.into_inner());
        for (item, g) in items.iter().zip(groups) {
            let (Some(g), Some(Delivered { entry_id, .. })) = (g, Delivered::of(item)) else {
                continue;
            };
            if deferred.contains(entry_id) {
                wait.push(*g);
            } else {
                tried.push(*g);
            }
        }
    }
    wait.sort_unstable();
    wait.dedup();
    if !wait.is_empty() {
        let locked = tx.query(&st.lock_groups, &[&wait])?.len();
        if locked != wait.len() {
            return Err(stripes_missing(wait.len() - locked));
        }
    }
    tried.sort_unstable();
    tried.dedup();
    tried.retain(|g| wait.binary_search(g).is_err());
    if tried.is_empty() {
        return Ok(HashSet::new());
    }
    let got: HashSet<i32> = tx
        .query(&st.try_groups, &[&tried])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // What was not locked is held by another batch — or missing from the table, which the
    // wait on its next offer finds out.
    Ok(tried.into_iter().filter(|g| !got.contains(g)).collect())
}

/// Stripes a batch waited for and did not find: `claim_locks` lost rows (edited by hand). No
/// retry can make them: a failure of the ledger itself, never of the entries.
fn stripes_missing(n: usize) -> Error {
    Error::ledger(
        format!(
            "{n} row(s) of claim_locks are missing (the table must hold stripes 0 to {}; \
             `claimgate verify` names what else changed)",
            CLAIM_STRIPES - 1
        ),
        crate::error::Fault::Ledger,
    )
}

/// Remembers this batch's deferred entries (their groups are waited for next time) and
/// forgets the ones offered again, whatever became of them.
fn note_deferred(ctx: &Context<'_>, items: &[Item<'_>], deferred: &[bool]) {
    let mut set = ctx.deferred.lock().unwrap_or_else(|p| p.into_inner());
    for (item, d) in items.iter().zip(deferred) {
        if let Some(Delivered { entry_id, .. }) = Delivered::of(item) {
            if *d {
                set.insert(entry_id.to_owned());
            } else {
                set.remove(entry_id);
            }
        }
    }
    // Entries deferred and never offered again (their worker stopped first) are few; a bound
    // keeps a long-lived handle from collecting them. Forgetting one costs it one more
    // deferral, never correctness.
    if set.len() > DEFERRED_REMEMBERED_MAX {
        set.clear();
    }
}

/// Deferred entry ids a ledger handle remembers at most.
const DEFERRED_REMEMBERED_MAX: usize = 100_000;

/// Step 2: what is claimed already or tombstoned, and each group's earliest claims.
fn read_facts(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    subs: &[&Submission],
    facts: &mut Facts,
) -> Result<()> {
    let (instants, awards, keys) = key_arrays(subs);
    let mut read: HashMap<(String, String), Vec<ClaimRead>> = HashMap::new();
    for row in tx.query(&st.facts, &[&instants, &awards, &keys])? {
        let key = key_of(row.get(2))?;
        let claimed_at: String = row.get(3);
        match (row.get::<_, Option<String>>(0), row.get(1)) {
            (Some(instant), Some(award)) => {
                read.entry((instant, award))
                    .or_default()
                    .push((row.get(4), key, claimed_at));
            }
            _ => {
                facts.tombstones.insert(key, (claimed_at, row.get(5)));
            }
        }
    }
    // Earliest first: the conflict is the earliest claim with another key.
    for claims in read.values_mut() {
        claims.sort_unstable_by_key(|c| c.0);
    }
    // A key of a group read whole is claimed exactly when it is among its group's claims; in a
    // group that filled the read, a key not among them is looked up by itself.
    let mut unsure: Vec<&Submission> = Vec::new();
    for s in subs {
        let claims = read.get(&(s.submission_instant.clone(), s.award_id.clone()));
        match claims.and_then(|c| c.iter().find(|(_, k, _)| *k == s.key)) {
            Some((_, key, at)) => {
                facts.claimed.insert(*key, at.clone());
            }
            None if claims.is_some_and(|c| c.len() >= GROUP_CLAIMS_READ) => unsure.push(s),
            None => {}
        }
    }
    if !unsure.is_empty() {
        look_up_keys(tx, st, &unsure, facts)?;
    }
    for (group, claims) in read {
        facts.groups.insert(
            group,
            claims.into_iter().map(|(_, key, at)| (key, at)).collect(),
        );
    }
    Ok(())
}

/// The instants, awards and keys of `subs`, as the step 2 statements take them.
fn key_arrays<'s>(subs: &[&'s Submission]) -> (Vec<&'s str>, Vec<&'s str>, Vec<&'s [u8]>) {
    (
        subs.iter().map(|s| s.submission_instant.as_str()).collect(),
        subs.iter().map(|s| s.award_id.as_str()).collect(),
        subs.iter().map(|s| s.key.as_bytes().as_slice()).collect(),
    )
}

/// A claim as `FACTS` reads it: (claim id, key, claimed_at).
type ClaimRead = (i64, IdempotencyKey, String);

/// Claims and tombstones of `subs`' keys, one probe each, in one statement: what it finds
/// replaces what `FACTS` said of these keys, so each key's two facts come from one snapshot.
fn look_up_keys(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    subs: &[&Submission],
    facts: &mut Facts,
) -> Result<()> {
    let (instants, awards, keys) = key_arrays(subs);
    for s in subs {
        facts.tombstones.remove(&s.key);
    }
    for row in tx.query(&st.claimed, &[&instants, &awards, &keys])? {
        let key = key_of(row.get(0))?;
        if let Some(at) = row.get::<_, Option<String>>(1) {
            facts.claimed.insert(key, at);
        }
        if let (Some(claimed), Some(purged)) = (row.get(2), row.get(3)) {
            facts.tombstones.insert(key, (claimed, purged));
        }
    }
    Ok(())
}

fn key_of(bytes: &[u8]) -> Result<IdempotencyKey> {
    IdempotencyKey::from_slice(bytes)
        .ok_or_else(|| Error::Invariant(format!("a stored key of {} bytes", bytes.len())))
}

/// Step 4a: dead letters and holds ([`decide::dead_row`]), once per stream entry. Returns the
/// indexes of the items whose row this batch inserted (the first of the batch's items for an
/// entry, and only if no earlier batch had dead-lettered it).
fn insert_dead_letters(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    ctx: &Context<'_>,
    items: &[Item<'_>],
    verdicts: &[Option<Verdict>],
    now: &str,
) -> Result<HashSet<usize>> {
    let mut rows: Vec<(usize, DeadRow<'_>)> = items
        .iter()
        .zip(verdicts)
        .enumerate()
        .filter_map(|(n, (item, v))| Some((n, decide::dead_row(item, v.as_ref()?)?)))
        .collect();
    if rows.is_empty() {
        return Ok(HashSet::new());
    }
    // The first item for each entry is the one that may insert; sorted by entry id, the lock
    // order every batch shares.
    let mut seen = HashSet::new();
    rows.retain(|(_, r)| seen.insert(r.entry_id));
    rows.sort_by(|(_, a), (_, b)| a.entry_id.cmp(b.entry_id));
    let entries: Vec<&str> = rows.iter().map(|(_, r)| r.entry_id).collect();
    let codes: Vec<&str> = rows.iter().map(|(_, r)| r.reason_code).collect();
    let reasons: Vec<&str> = rows.iter().map(|(_, r)| r.reason.as_ref()).collect();
    let awards: Vec<Option<&str>> = rows.iter().map(|(_, r)| r.award_id).collect();
    let counts: Vec<i64> = rows.iter().map(|(_, r)| r.delivery_count as i64).collect();
    let inserted: HashSet<String> = tx
        .query(
            &st.insert_dead,
            &[
                &ctx.stream,
                &now,
                &entries,
                &codes,
                &reasons,
                &awards,
                &counts,
            ],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(rows
        .iter()
        .filter(|(_, r)| inserted.contains(r.entry_id))
        .map(|(n, _)| *n)
        .collect())
}

/// The new claims the verdicts make: (submission, entry id) each, and their submissions, in
/// item order (whose events the batch spells).
#[allow(clippy::type_complexity)]
fn claimed<'a>(
    items: &[Item<'a>],
    verdicts: &[Option<Verdict>],
) -> (Vec<(&'a Submission, &'a str)>, Vec<&'a Submission>) {
    let new: Vec<(&Submission, &str)> = items
        .iter()
        .zip(verdicts)
        .filter(|(_, v)| matches!(v, Some(Verdict::Claim { .. })))
        .filter_map(|(item, _)| Delivered::of(item).map(|d| (d.submission, d.entry_id)))
        .collect();
    let paid = new.iter().map(|(s, _)| *s).collect();
    (new, paid)
}

/// Step 4b: the new claims and their disbursements, sorted as the claim index orders them;
/// returns key → claim_id.
fn insert_claims(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    ctx: &Context<'_>,
    mut new: Vec<(&Submission, &str)>,
    now: &str,
) -> Result<HashMap<IdempotencyKey, i64>> {
    if new.is_empty() {
        return Ok(HashMap::new());
    }
    new.sort_by(|(a, _), (b, _)| {
        (&a.submission_instant, &a.award_id, a.key.as_bytes()).cmp(&(
            &b.submission_instant,
            &b.award_id,
            b.key.as_bytes(),
        ))
    });
    let keys: Vec<&[u8]> = new
        .iter()
        .map(|(s, _)| s.key.as_bytes().as_slice())
        .collect();
    let awards: Vec<&str> = new.iter().map(|(s, _)| s.award_id.as_str()).collect();
    let ts: Vec<&str> = new
        .iter()
        .map(|(s, _)| s.submission_timestamp.as_str())
        .collect();
    let amounts: Vec<i64> = new.iter().map(|(s, _)| s.amount_cents).collect();
    let entries: Vec<&str> = new.iter().map(|(_, e)| *e).collect();
    let instants: Vec<&str> = new
        .iter()
        .map(|(s, _)| s.submission_instant.as_str())
        .collect();
    let rows = tx.query(
        &st.insert_claims,
        &[
            &now,
            &ctx.consumer,
            &keys,
            &awards,
            &ts,
            &amounts,
            &entries,
            &instants,
        ],
    )?;
    let mut ids = HashMap::with_capacity(rows.len());
    for row in &rows {
        ids.insert(key_of(row.get(0))?, row.get::<_, i64>(1));
        failpoint::hit("after_claim");
    }
    // The group locks keep every other writer away from these keys until we commit, and the
    // facts said none was claimed: a refusal here means the store and the decisions disagree.
    if ids.len() != new.len() {
        return Err(Error::Invariant(format!(
            "{} of {} new claims were refused by the store although no claim of their keys was \
             found under the group locks",
            new.len() - ids.len(),
            new.len()
        )));
    }
    Ok(ids)
}

/// Step 5: seals `members` as one batch and writes them, with the outbox rows of `paid` and
/// the batch's row, inside `tx`; returns the batch's id. `None`, writing nothing, when there
/// are no members. Holds use it, for their one record.
pub(super) fn write_members(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    members: &mut [Record],
    paid: &[(i64, &Submission, String)],
    now: &str,
) -> Result<Option<i64>> {
    if members.is_empty() {
        return Ok(None);
    }
    let last_hash = crate::domain::audit::seal_batch(members);
    write_sealed(tx, st, members, &last_hash, paid, now).map(Some)
}

/// Seals `members` as one batch and spells the event of each submission in `paid`: the
/// batch's last hash (`None` for no members) and the events, in order.
fn seal_and_spell(members: &mut [Record], paid: &[&Submission]) -> (Option<String>, Vec<String>) {
    let last_hash = (!members.is_empty()).then(|| crate::domain::audit::seal_batch(members));
    let events = paid
        .iter()
        .map(|s| event::payload(s, &s.key.to_hex()))
        .collect();
    (last_hash, events)
}

/// Records in a batch from which `record` seals them on a thread of their own, beside the
/// claims insert. A smaller batch seals them inline: a thread's start would cost a lone
/// submission more than its one seal.
const SEAL_APART_RECORDS_MIN: usize = 256;

/// Writes sealed `members` (the last one's hash `last_hash`), the outbox rows of `paid` and
/// the batch's row inside `tx`; returns the batch's id.
fn write_sealed(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    members: &[Record],
    last_hash: &str,
    paid: &[(i64, &Submission, String)],
    now: &str,
) -> Result<i64> {
    assert!(
        members
            .iter()
            .zip(1..)
            .all(|(r, i)| r.batch_index == Some(i)),
        "a batch's members are written sealed, in index order from 1"
    );
    let count =
        |n: usize| i32::try_from(n).map_err(|_| Error::Invariant(format!("a batch of {n} rows")));
    let batch_id: i64 = tx
        .query_one(
            &st.insert_batch,
            &[
                &count(members.len())?,
                &last_hash,
                &count(paid.len())?,
                &now,
            ],
        )?
        .get(0);
    use postgres::binary_copy::BinaryCopyInWriter;
    use postgres::types::Type;
    let mut audit = BinaryCopyInWriter::new(
        tx.copy_in(&st.copy_members)?,
        &super::audit_store::MEMBER_COLUMN_TYPES,
    );
    for r in members.iter() {
        let index = count(r.batch_index.expect("sealed as a member") as usize)?;
        audit.write(&super::audit_store::member_params(
            r,
            &batch_id,
            &index,
            &r.kind.as_str(),
        ))?;
    }
    audit.finish()?;
    if !paid.is_empty() {
        let mut outbox = BinaryCopyInWriter::new(
            tx.copy_in(&st.copy_outbox)?,
            &[
                Type::INT8,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
                Type::INT8,
                Type::INT4,
            ],
        );
        for (n, (claim_id, _, payload)) in paid.iter().enumerate() {
            outbox.write(&[
                claim_id,
                &DISBURSEMENT_RECORDED,
                payload,
                &now,
                &batch_id,
                &count(n + 1)?,
            ])?;
        }
        outbox.finish()?;
    }
    Ok(batch_id)
}

/// Step 6 for `batch`, which this process just committed: [`link`]. A transient failure
/// leaves the batch committed and unlinked — its outcomes stand — and says so: a node's start
/// or a relay round places it. A permanent one (the ledger's tables edited so that no link can
/// be sealed) is the caller's to report.
pub(super) fn link_committed(conn: &mut Conn, batch: i64) -> Result<()> {
    match link(conn, Some(batch)) {
        Ok(_) => Ok(()),
        Err(e) if e.is_transient() => {
            log::warn!(
                "batch {batch} is committed but could not be linked into the audit chain yet \
                 ({e}); its effects stand, and a node's start or a relay round links it"
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Links `batch`, or with `None` the committed batches not linked yet (`claimgate_link`, one
/// per call, oldest first, skipping those a writer is linking: as many calls as there were
/// such batches when it began, or until one finds none left), and notes how long each link
/// held the chain head. Returns how many it linked.
pub(super) fn link(conn: &mut Conn, batch: Option<i64>) -> Result<i32> {
    if batch.is_some() {
        return link_one(conn, batch);
    }
    let st = conn.prepared("SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL")?;
    let unlinked: i64 = conn.client.query_one(&st, &[])?.get(0);
    let mut linked = 0;
    for _ in 0..unlinked {
        match link_one(conn, None)? {
            0 => break,
            n => linked += n,
        }
    }
    Ok(linked)
}

/// One call of `claimgate_link`.
fn link_one(conn: &mut Conn, batch: Option<i64>) -> Result<i32> {
    let st = conn.prepared(LINK)?;
    let now = crate::domain::clock::now_rfc3339();
    let called = Instant::now();
    let row = conn.client.query_one(&st, &[&now, &batch])?;
    let elapsed = called.elapsed();
    let (linked, waited_us, held_us): (i32, i64, i64) = (row.get(0), row.get(1), row.get(2));
    if linked > 0 {
        // Held from the head's compare-and-set inside the call to the end of the statement's
        // commit, which writes no WAL to disk: the update itself (server clock) and a commit
        // record's insertion. Bounded above by the call's time less what came before that
        // try, which also counts the round trip and this process's scheduling.
        let waited = Duration::from_micros(waited_us.max(0) as u64);
        let in_function = Duration::from_micros(held_us.max(0) as u64);
        note_head_hold(in_function, elapsed.saturating_sub(waited));
    }
    Ok(linked)
}
