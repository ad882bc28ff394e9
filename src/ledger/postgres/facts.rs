//! Step 2 of a PostgreSQL batch (`batch.rs`): what the database holds about the batch's
//! submissions, read in one statement (one snapshot) under the group locks, and answered to
//! `ledger/decide.rs` as a ledger's [`decide::Facts`].

use super::connect::Conn;
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::{Error, Result};
use crate::ledger::decide::{self, Delivered, Other, Purged};
use std::collections::HashMap;

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

/// Step 2's statements, prepared once per connection.
pub(super) struct Statements {
    claimed: postgres::Statement,
    facts: postgres::Statement,
}

impl Statements {
    pub(super) fn prepare(conn: &mut Conn) -> Result<Self> {
        Ok(Statements {
            claimed: conn.prepared(CLAIMED)?,
            facts: conn.prepared(FACTS.as_str())?,
        })
    }
}

/// What the batch found in the database in step 2, and the claims it decided since: what a
/// PostgreSQL ledger answers [`decide`](decide::decide) with, under its group locks.
pub(super) struct Facts {
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

impl Facts {
    /// No facts yet, for a batch at `now`: [`read`] fills them.
    pub(super) fn new(now: &str) -> Self {
        Facts {
            now: now.to_owned(),
            claimed: HashMap::new(),
            tombstones: HashMap::new(),
            groups: HashMap::new(),
        }
    }
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

/// Step 2: what is claimed already or tombstoned, and each group's earliest claims.
pub(super) fn read(
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

pub(super) fn key_of(bytes: &[u8]) -> Result<IdempotencyKey> {
    IdempotencyKey::from_slice(bytes)
        .ok_or_else(|| Error::Invariant(format!("a stored key of {} bytes", bytes.len())))
}
