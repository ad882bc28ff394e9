//! Conflicting resubmissions: the same award at the same submission instant with a different
//! payload. "The same instant" is compared as `submission_instant` (UTC, one spelling), so
//! `…09:00:00Z` and `…11:00:00+02:00` conflict although their keys differ.
//!
//! By design such a resubmission has its own key and is not suppressed (the reference design:
//! a genuine resubmission must not be lost). It is made visible instead: a `conflict` audit
//! record links both keys, and under `--on-conflict hold` it is dead-lettered for review rather
//! than paid. Everything here runs inside the batch's open transaction; the batch (`batch.rs`)
//! writes the audit records, so this file knows nothing of it.

use crate::domain::key::to_hex;
use crate::error::Result;
use rusqlite::{params, OptionalExtension, Transaction};

/// The earlier claim a submission conflicts with.
pub(super) struct Other {
    /// Its key, in hex.
    pub(super) key_hex: String,
    /// When it was claimed.
    pub(super) claimed_at: String,
}

/// The earliest claim with a submission's award and instant but another key. Almost always
/// there is none, so this only probes the index that leads with exactly these two columns (the
/// claim's own in a ledger made by this release, `claim_instant` in an older one), which holds
/// the key and `claim_id` (the rowid): no table row is read and nothing is sorted.
pub(super) const EARLIEST_OTHER: &str = "SELECT MIN(claim_id) FROM processed_messages
     WHERE submission_instant = ?1 AND award_id = ?2 AND idempotency_key <> ?3";

/// The claim `claim_id` as a conflict names it ([`EARLIEST_OTHER`] found it).
pub(super) fn describe(tx: &Transaction<'_>, claim_id: i64) -> Result<Option<Other>> {
    let other = tx
        .prepare_cached(
            "SELECT idempotency_key, claimed_at FROM processed_messages WHERE claim_id = ?1",
        )?
        .query_row([claim_id], |r| {
            Ok(Other {
                key_hex: to_hex(&r.get::<_, Vec<u8>>(0)?),
                claimed_at: r.get(1)?,
            })
        })
        .optional()?;
    Ok(other)
}

/// The `dead_letters` row that holds a conflicting submission for review.
pub(super) struct Held<'r> {
    /// The stream it arrived on.
    pub(super) stream: &'r str,
    /// The entry that carried it.
    pub(super) entry_id: &'r str,
    /// `domain::audit::detail::hold_reason`.
    pub(super) reason: &'r str,
    /// Its award.
    pub(super) award_id: &'r str,
    /// Deliveries so far.
    pub(super) delivery_count: u64,
    /// The batch's time.
    pub(super) now: &'r str,
}

/// Inserts the hold row, once per stream entry; true if this call inserted it (an earlier
/// delivery may already have held the entry).
pub(super) fn insert_hold(tx: &Transaction<'_>, held: &Held<'_>) -> Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code, reason,
             award_id, delivery_count, recorded_at) VALUES (?1, ?2, 'conflict_hold', ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            held.stream,
            held.entry_id,
            held.reason,
            held.award_id,
            held.delivery_count as i64,
            held.now
        ])?;
    Ok(inserted == 1)
}

/// The `ledger_meta` row a retention purge counts its batches in, so a writer knows its
/// [`Groups`] may name claims that are gone and rebuilds it.
pub(super) const PURGES_META: &str = "claims_purged";

/// The (instant, award) groups that hold a claim, as a Bloom filter: a group it has never
/// seen certainly holds no claim, so a new claim in it cannot conflict and the probe of the
/// claim index is skipped (nearly every new claim: conflicts are rare). A group it has seen —
/// or a false positive, about one in a hundred — is probed as before, so conflicts are found
/// exactly as without it.
///
/// No false negative is possible: at the start of each batch, inside the batch's write
/// transaction (so no other writer can add a claim meanwhile), [`Groups::sync`] adds every claim
/// with a `claim_id` above the highest it has seen committed — claims of other processes sharing
/// the ledger file included — and each claim the batch makes is added as it is made. Claim ids
/// only grow while no claim is deleted (a batch that rolls back gives its ids back, which is why
/// only a commit moves the highest id seen); a retention purge (the one thing that deletes claims) bumps
/// [`PURGES_META`], and a filter that sees it moved is rebuilt from the claims that remain.
/// The filter grows by rebuilding at twice its size when it holds more groups than it was
/// sized for. Memory: about 1.25 bytes per claim (10 bits).
pub(super) struct Groups {
    /// The filter's bits.
    bits: Vec<u64>,
    /// Groups added since the last rebuild.
    len: usize,
    /// Groups it is sized for (its false-positive rate holds up to this).
    capacity: usize,
    /// The highest claim id added.
    claim_id_seen: i64,
    /// [`PURGES_META`] when last synchronised; `None` before the first sync.
    purges_seen: Option<i64>,
    /// Hashes a group to the filter's bits.
    hasher: std::hash::RandomState,
}

/// Bits per group sized for, and hashes per group: a false-positive rate of about 0.8%.
const BITS_PER_GROUP: usize = 10;
const HASHES: u64 = 7;
/// The smallest filter built (8 KiB).
const CAPACITY_MIN: usize = 1 << 16;

impl Groups {
    /// An empty filter; the first [`Groups::sync`] fills it from the ledger.
    pub(super) fn new() -> Self {
        Self::with_capacity(CAPACITY_MIN)
    }

    fn with_capacity(capacity: usize) -> Self {
        Groups {
            bits: vec![0; (capacity * BITS_PER_GROUP).div_ceil(64)],
            len: 0,
            capacity,
            claim_id_seen: 0,
            purges_seen: None,
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Brings the filter up to every claim in the ledger. Call inside the batch's write
    /// transaction, before its first claim.
    pub(super) fn sync(&mut self, tx: &Transaction<'_>) -> Result<()> {
        let purges: i64 = tx
            .query_row(
                "SELECT CAST(value AS INTEGER) FROM ledger_meta WHERE name = ?1",
                [PURGES_META],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(0);
        if self.purges_seen != Some(purges) {
            *self = Self::with_capacity(self.capacity);
            self.purges_seen = Some(purges);
        }
        let mut stmt = tx.prepare_cached(
            "SELECT claim_id, submission_instant, award_id FROM processed_messages
             WHERE claim_id > ?1 AND submission_instant IS NOT NULL",
        )?;
        let mut rows = stmt.query([self.claim_id_seen])?;
        while let Some(row) = rows.next()? {
            let claim_id: i64 = row.get(0)?;
            let instant = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
            let award = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
            self.insert(instant, award);
            self.claim_id_seen = self.claim_id_seen.max(claim_id);
        }
        drop(rows);
        drop(stmt);
        if self.len > self.capacity {
            // Sized for twice what it holds now, rebuilt from the ledger.
            let capacity = self.len * 2;
            *self = Self::with_capacity(capacity);
            return self.sync(tx);
        }
        Ok(())
    }

    /// Adds the group of a claim read from the ledger or made by the batch under way.
    pub(super) fn insert(&mut self, instant: &str, award: &str) {
        for bit in self.bit_indexes(instant, award) {
            self.bits[bit / 64] |= 1 << (bit % 64);
        }
        self.len += 1;
    }

    /// The batch that made claims up to `claim_id` has committed: the next sync need not read
    /// them again. Not called for a batch that rolled back, whose claim ids SQLite hands out
    /// again; its groups stay in the filter as false positives, which cost only a probe.
    pub(super) fn committed_through(&mut self, claim_id: i64) {
        self.claim_id_seen = self.claim_id_seen.max(claim_id);
    }

    /// False only if no claim is in this group.
    pub(super) fn may_hold(&self, instant: &str, award: &str) -> bool {
        self.bit_indexes(instant, award)
            .all(|bit| self.bits[bit / 64] & (1 << (bit % 64)) != 0)
    }

    /// The filter's bits for a group (double hashing over one 64-bit hash).
    fn bit_indexes(&self, instant: &str, award: &str) -> impl Iterator<Item = usize> {
        use std::hash::BuildHasher;
        let h = self.hasher.hash_one((instant, award));
        let (h1, h2) = (h & 0xffff_ffff, (h >> 32) | 1);
        let m = (self.bits.len() * 64) as u64;
        (0..HASHES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % m) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> rusqlite::Connection {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(crate::ledger::sqlite::SCHEMA).unwrap();
        conn
    }

    fn claim(conn: &rusqlite::Connection, i: i64, instant: &str, award: &str) {
        conn.execute(
            "INSERT INTO processed_messages (claim_id, idempotency_key, award_id,
             submission_timestamp, amount_cents, claimed_at, stream_entry_id, consumer,
             submission_instant) VALUES (?1, randomblob(32), ?3, ?2, 1, 'now', 'e', 'c', ?2)",
            rusqlite::params![i, instant, award],
        )
        .unwrap();
    }

    #[test]
    fn every_claimed_group_is_held_including_other_writers_claims_and_growth_past_capacity() {
        let mut conn = ledger();
        let mut groups = Groups::with_capacity(64);
        for i in 1..=50 {
            claim(&conn, i, &format!("t{i}"), "A");
        }
        let tx = conn.transaction().unwrap();
        groups.sync(&tx).unwrap();
        drop(tx);
        // Another process's claims (ids above the highest seen), past the filter's size.
        for i in 51..=500 {
            claim(&conn, i, &format!("t{i}"), "A");
        }
        let tx = conn.transaction().unwrap();
        groups.sync(&tx).unwrap();
        drop(tx);
        assert!(groups.capacity >= 500, "grew: {}", groups.capacity);
        for i in 1..=500 {
            assert!(groups.may_hold(&format!("t{i}"), "A"), "group {i} lost");
        }
        let false_positives = (0..10_000)
            .filter(|i| groups.may_hold(&format!("u{i}"), "A"))
            .count();
        assert!(false_positives < 300, "{false_positives} of 10000");
    }

    #[test]
    fn a_purge_makes_the_next_sync_rebuild_from_the_claims_that_remain() {
        let mut conn = ledger();
        let mut groups = Groups::new();
        claim(&conn, 1, "t1", "A");
        let tx = conn.transaction().unwrap();
        groups.sync(&tx).unwrap();
        drop(tx);
        // A purge removes claim 1, counts itself, and a claim reuses id 1 in another group.
        conn.execute_batch(&format!(
            "DELETE FROM processed_messages;
             INSERT INTO ledger_meta (name, value) VALUES ('{PURGES_META}', '1');"
        ))
        .unwrap();
        claim(&conn, 1, "t2", "B");
        let tx = conn.transaction().unwrap();
        groups.sync(&tx).unwrap();
        assert!(groups.may_hold("t2", "B"), "the reused id's group");
    }
}
