//! Step 1 of a PostgreSQL batch (`batch.rs`): the locks of the (instant, award) groups it
//! claims for, one `claim_locks` row (a stripe) per group, waited for where an item is
//! offered again after a deferral and only tried for the rest (contract point 8).

use super::connect::Conn;
use crate::error::{Error, Result};
use crate::ledger::decide::Delivered;
use crate::ledger::Item;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::Mutex;

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

/// Step 1's statements, prepared once per connection.
pub(super) struct Statements {
    lock_groups: postgres::Statement,
    try_groups: postgres::Statement,
}

impl Statements {
    pub(super) fn prepare(conn: &mut Conn) -> Result<Self> {
        Ok(Statements {
            lock_groups: conn.prepared(LOCK_GROUPS)?,
            try_groups: conn.prepared(TRY_GROUPS)?,
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
pub(super) fn lock_groups(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    remembered: &Mutex<HashSet<String>>,
    items: &[Item<'_>],
    groups: &[Option<i32>],
) -> Result<HashSet<i32>> {
    let mut wait: Vec<i32> = Vec::new();
    let mut tried: Vec<i32> = Vec::new();
    {
        let deferred = remembered.lock().unwrap_or_else(|p| p.into_inner());
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
pub(super) fn note_deferred(
    remembered: &Mutex<HashSet<String>>,
    items: &[Item<'_>],
    deferred: &[bool],
) {
    let mut set = remembered.lock().unwrap_or_else(|p| p.into_inner());
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
