//! Conflicting resubmissions: the same award at the same submission instant with a different
//! payload. "The same instant" is compared as `submission_instant` (UTC, one spelling), so
//! `…09:00:00Z` and `…11:00:00+02:00` conflict although their keys differ.
//!
//! By design such a resubmission has its own key and is not suppressed (the reference design:
//! a genuine resubmission must not be lost). It is made visible instead: a `conflict` audit
//! record links both keys, and under `--on-conflict hold` it is dead-lettered for review rather
//! than paid. Everything here runs inside the batch's open transaction; the batch (`batch.rs`)
//! writes the audit records, so this file knows nothing of it.

use super::settings::Settings;
use crate::domain::key::to_hex;
use crate::error::Result;
use crate::ledger::decide::Other;
use rusqlite::{Connection, InterruptHandle, OptionalExtension, Transaction};
use std::path::PathBuf;

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
/// transaction (so no other writer can add a claim meanwhile), [`Filter::sync`] adds every claim
/// with a `claim_id` above the highest it has seen committed — claims of other processes sharing
/// the ledger file included — and each claim the batch makes is added as it is made. Claim ids
/// only grow while no claim is deleted (a batch that rolls back gives its ids back, which is why
/// only a commit moves the highest id seen); a retention purge (the one thing that deletes claims) bumps
/// [`PURGES_META`], and a filter that sees it moved is rebuilt from the claims that remain.
/// The filter grows by rebuilding at twice its size when it holds more groups than it was
/// sized for. Memory: about 1.25 bytes per claim (10 bits).
///
/// The filter is blocked: a group's bits all fall in one 512-bit block (one cache line), so
/// adding or asking about a group touches one line, not seven scattered over a filter of
/// megabytes. That matters when a worker opens a large ledger, whose every claim is added
/// before its first batch (BENCHMARKS.md: 1,000,000 claims). The price is a slightly higher
/// false-positive rate for the same bits (about 1% instead of 0.8%), which costs a probe.
pub(super) struct Filter {
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

/// Bits per group sized for, and bits set per group: a false-positive rate of about 1%.
const BITS_PER_GROUP: usize = 10;
const HASHES: u32 = 7;
/// Words per block: 8 × 64 bits, one cache line.
const BLOCK_WORDS: usize = 8;
/// The smallest filter built (8 KiB).
const CAPACITY_MIN: usize = 1 << 16;

impl Filter {
    /// An empty filter; the first [`Filter::sync`] fills it from the ledger.
    fn new() -> Self {
        Self::with_capacity(CAPACITY_MIN)
    }

    fn with_capacity(capacity: usize) -> Self {
        Filter {
            bits: vec![0; (capacity * BITS_PER_GROUP).div_ceil(64 * BLOCK_WORDS) * BLOCK_WORDS],
            len: 0,
            capacity,
            claim_id_seen: 0,
            purges_seen: None,
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Brings the filter up to every claim in the ledger. Call inside the batch's write
    /// transaction, before its first claim (or, for a first build, inside any read
    /// transaction: [`Groups`] catches up with what was committed after it). On an error the
    /// filter must be dropped: a full read stops part way through the claims, in index order.
    fn sync(&mut self, tx: &Connection) -> Result<()> {
        let purges = purges(tx)?;
        if self.purges_seen != Some(purges) {
            // The first sync, or claims were purged since: start again from the claims there
            // are, in a filter sized for them at once. Sized by the filter's growth alone, a
            // ledger of 1,000,000 claims was read twice before its first batch (once into the
            // smallest filter, then again into one big enough): 0.65 s.
            let capacity = claim_ids_spanned(tx)?.saturating_mul(2).max(self.capacity);
            *self = Self::with_capacity(capacity);
            self.purges_seen = Some(purges);
        }
        // Everything, on a fresh filter: no `claim_id` bound, so SQLite reads the claim index
        // (it covers the instant, the award and the rowid) rather than the larger table.
        let mut stmt = tx.prepare_cached(if self.claim_id_seen == 0 {
            "SELECT claim_id, submission_instant, award_id FROM processed_messages
             WHERE submission_instant IS NOT NULL AND ?1 = 0"
        } else {
            "SELECT claim_id, submission_instant, award_id FROM processed_messages
             WHERE claim_id > ?1 AND submission_instant IS NOT NULL"
        })?;
        let mut rows = stmt.query([self.claim_id_seen])?;
        // Moved only once every row is in, so a read that fails part way never leaves a
        // highest id seen with lower ones unread.
        let mut claim_id_max = self.claim_id_seen;
        while let Some(row) = rows.next()? {
            let claim_id: i64 = row.get(0)?;
            let instant = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
            let award = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
            self.insert(instant, award);
            claim_id_max = claim_id_max.max(claim_id);
        }
        self.claim_id_seen = claim_id_max;
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
    fn insert(&mut self, instant: &str, award: &str) {
        let (block, bits) = self.block_and_bits(instant, award);
        for (word, mask) in self.bits[block..block + BLOCK_WORDS].iter_mut().zip(bits) {
            *word |= mask;
        }
        self.len += 1;
    }

    /// The batch that made claims up to `claim_id` has committed: the next sync need not read
    /// them again. Not called for a batch that rolled back, whose claim ids SQLite hands out
    /// again; its groups stay in the filter as false positives, which cost only a probe.
    fn committed_through(&mut self, claim_id: i64) {
        self.claim_id_seen = self.claim_id_seen.max(claim_id);
    }

    /// False only if no claim is in this group.
    fn may_hold(&self, instant: &str, award: &str) -> bool {
        let (block, bits) = self.block_and_bits(instant, award);
        self.bits[block..block + BLOCK_WORDS]
            .iter()
            .zip(bits)
            .all(|(word, mask)| word & mask == mask)
    }

    /// A group's block (the index of its first word) and its bits within the block, one mask
    /// per word: [`HASHES`] positions of 9 bits each, taken from one 64-bit hash remixed,
    /// the block from the hash's high half by multiplication (no division).
    fn block_and_bits(&self, instant: &str, award: &str) -> (usize, [u64; BLOCK_WORDS]) {
        use std::hash::BuildHasher;
        let h = self.hasher.hash_one((instant, award));
        let blocks = (self.bits.len() / BLOCK_WORDS) as u64;
        let block = ((u128::from(h) * u128::from(blocks)) >> 64) as usize * BLOCK_WORDS;
        let mut positions = h.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (h >> 29);
        let mut masks = [0u64; BLOCK_WORDS];
        for _ in 0..HASHES {
            let bit = (positions & 511) as usize;
            masks[bit / 64] |= 1 << (bit % 64);
            positions >>= 9;
        }
        debug_assert!(block + BLOCK_WORDS <= self.bits.len());
        (block, masks)
    }
}

/// The writer's [`Filter`], built the first time off the writer's path: on a thread of its
/// own, from a read snapshot, while the first batches go on without it (every new claim is
/// probed, as on a false positive). A worker opening a ledger of 1,000,000 claims used to
/// read them all inside its first batch before committing anything (about 0.5 s; BENCHMARKS.md).
///
/// Nothing is missed by adopting a filter built from a snapshot: it records the highest claim
/// id it read and the purge count it saw, and the first [`Filter::sync`] after adoption, in a
/// batch's write transaction, adds every claim above that id (every claim committed after the
/// snapshot has a higher id, since ids only grow while nothing is purged) or rebuilds it if a
/// purge happened meanwhile.
pub(super) struct Groups {
    state: State,
    /// The ledger file and how to open it, for the build; `None` builds inside the batch.
    source: Option<(PathBuf, Settings)>,
}

/// Where the writer's filter is.
enum State {
    /// Not built: the next sync starts the build.
    Unbuilt,
    /// Being built; until it is adopted, every group may hold a claim. The [`Halt`] stops
    /// the build when the writer goes away first (see `Drop`).
    Building(std::thread::JoinHandle<Result<Filter>>, Halt),
    /// In use.
    Ready(Filter),
}

impl Groups {
    /// No filter yet; the first [`Groups::sync`] starts building one from `source` (or, with
    /// none, builds it there and then).
    pub(super) fn new(source: Option<(PathBuf, Settings)>) -> Self {
        Groups {
            state: State::Unbuilt,
            source,
        }
    }

    /// Brings the filter up to every claim in the ledger, if it is in use, or adopts it once
    /// its build is done. Call inside the batch's write transaction, before its first claim.
    pub(super) fn sync(&mut self, tx: &Transaction<'_>) -> Result<()> {
        // Taken out, so an error below leaves `Unbuilt`: a filter whose sync failed is dropped
        // and built again, never used with claims unread.
        let mut filter = match std::mem::replace(&mut self.state, State::Unbuilt) {
            State::Ready(filter) => filter,
            State::Building(build, stop) if !build.is_finished() => {
                self.state = State::Building(build, stop);
                return Ok(());
            }
            State::Building(build, _) => match build.join() {
                Ok(Ok(filter)) => filter,
                Ok(Err(e)) => {
                    log::warn!("building the claim-group filter failed ({e}); building it here");
                    Filter::new()
                }
                Err(_) => {
                    log::warn!("building the claim-group filter panicked; building it here");
                    Filter::new()
                }
            },
            State::Unbuilt => match self.source.clone().map(build) {
                Some(Ok((build, stop))) => {
                    self.state = State::Building(build, stop);
                    return Ok(());
                }
                Some(Err(e)) => {
                    log::warn!(
                        "cannot start the claim-group filter's build ({e}); building it here"
                    );
                    Filter::new()
                }
                None => Filter::new(),
            },
        };
        filter.sync(tx)?;
        self.state = State::Ready(filter);
        Ok(())
    }

    /// Adds the group of a claim the batch under way made (nothing while there is no filter:
    /// the claim is committed after the build's snapshot, so the adoption's sync reads it).
    pub(super) fn insert(&mut self, instant: &str, award: &str) {
        if let State::Ready(filter) = &mut self.state {
            filter.insert(instant, award);
        }
    }

    /// The batch that made claims up to `claim_id` has committed (see
    /// [`Filter::committed_through`]).
    pub(super) fn committed_through(&mut self, claim_id: i64) {
        if let State::Ready(filter) = &mut self.state {
            filter.committed_through(claim_id);
        }
    }

    /// Whether a filter is in use (tests watch the build being adopted).
    #[cfg(test)]
    fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// False only if no claim is in this group; true for every group until a filter is in use.
    pub(super) fn may_hold(&self, instant: &str, award: &str) -> bool {
        match &self.state {
            State::Ready(filter) => filter.may_hold(instant, award),
            State::Unbuilt | State::Building(..) => true,
        }
    }
}

impl Drop for Groups {
    /// A build still reading when the writer goes (a worker that stops before its filter is
    /// ready: one that drains one entry and exits) is interrupted and waited for: its read
    /// transaction would otherwise hold the ledger's last checkpoint (`checkpoint.rs`) until it
    /// had read every claim, about half a second per million.
    fn drop(&mut self) {
        if let State::Building(build, stop) = std::mem::replace(&mut self.state, State::Unbuilt) {
            stop.halt();
            // Interrupted, it ends with an error nobody needs; a panic there is not ours to raise.
            drop(build.join());
        }
    }
}

/// A filter's build under way, and how to stop it.
type Build = (std::thread::JoinHandle<Result<Filter>>, Halt);

/// Stops a build: interrupts the read it is in, and keeps it from starting another.
pub(super) struct Halt {
    interrupt: InterruptHandle,
    asked: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Halt {
    fn halt(&self) {
        self.asked.store(true, std::sync::atomic::Ordering::SeqCst);
        self.interrupt.interrupt();
    }

    fn asked(asked: &std::sync::atomic::AtomicBool) -> Result<()> {
        if asked.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::error::Error::Other(
                "the claim-group filter's build was stopped".into(),
            ));
        }
        Ok(())
    }
}

/// Claims a build may leave for its adoption to read. The adoption reads them inside a
/// batch's write transaction, holding every commit back while it does.
pub(super) const ADOPTION_CLAIMS_MAX: i64 = 10_000;

/// Starts building a filter of every claim in the ledger at `path`, on its own connection and
/// on a thread of its own: one read transaction (one snapshot) over every claim, then passes
/// over the claims committed since, each in a read transaction of its own, until one finds at
/// most [`ADOPTION_CLAIMS_MAX`]. Without them the adoption read every claim the worker made
/// while the build ran, inside a batch: on a ledger of 10,000,000 claims, a build of over a
/// minute beside a busy worker left millions, and one commit took 18 s (BENCHMARKS.md).
fn build((path, settings): (PathBuf, Settings)) -> Result<Build> {
    let mut conn = Connection::open(&path)?;
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = Halt {
        interrupt: conn.get_interrupt_handle(),
        asked: asked.clone(),
    };
    let build = std::thread::Builder::new()
        .name("claim-groups".into())
        .spawn(move || {
            settings.apply(&conn)?;
            // One pass over the claim index gains nothing from a page cache; the writer's is
            // already as much memory as a worker should hold for one.
            conn.pragma_update(None, "cache_size", -1024)?;
            let mut filter = Filter::new();
            for pass in 0.. {
                Halt::asked(&asked)?;
                let seen = filter.claim_id_seen;
                let tx = conn.transaction()?;
                filter.sync(&tx)?;
                drop(tx);
                if pass > 0 && filter.claim_id_seen - seen <= ADOPTION_CLAIMS_MAX {
                    break;
                }
            }
            Ok(filter)
        })
        .map_err(|e| crate::error::Error::io("starting the claim-group filter's build", e))?;
    Ok((build, stop))
}

/// How many retention purges have removed claims from this ledger ([`PURGES_META`]; 0 for
/// none): what the claim-group filter watches to start again.
pub(super) fn purges(conn: &Connection) -> Result<i64> {
    Ok(conn
        .query_row(
            "SELECT CAST(value AS INTEGER) FROM ledger_meta WHERE name = ?1",
            [PURGES_META],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0))
}

/// How many claim ids lie between the lowest and the highest claim, both included (0 for no
/// claim): at least the number of claims, and close to it, since only a purge (of the oldest)
/// and a rolled-back batch (whose ids are handed out again) leave ids unused.
fn claim_ids_spanned(tx: &Connection) -> Result<usize> {
    let span: i64 = tx.query_row(
        // Two subqueries, so each is one seek to an end of the rowid B-tree.
        "SELECT COALESCE((SELECT MAX(claim_id) FROM processed_messages)
                       - (SELECT MIN(claim_id) FROM processed_messages) + 1, 0)",
        [],
        |r| r.get(0),
    )?;
    Ok(usize::try_from(span).unwrap_or(0))
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
        let mut groups = Filter::with_capacity(64);
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
    fn a_full_filter_holds_every_group_and_lets_about_one_in_a_hundred_others_through() {
        // Filled to the capacity it was sized for (10 bits per group), blocked: every group
        // held, and false positives near the 1% the sizing is for (0.8% unblocked).
        let mut groups = Filter::with_capacity(100_000);
        for i in 0..100_000 {
            groups.insert(&format!("2026-07-01T09:00:{i:09}Z"), "A-000001");
        }
        for i in 0..100_000 {
            assert!(groups.may_hold(&format!("2026-07-01T09:00:{i:09}Z"), "A-000001"));
        }
        let false_positives = (0..100_000)
            .filter(|i| groups.may_hold(&format!("2026-07-01T09:00:{i:09}Z"), "A-000002"))
            .count();
        assert!(
            (100..1_500).contains(&false_positives),
            "{false_positives} of 100000"
        );
    }

    #[test]
    fn a_filter_built_beside_the_writer_is_adopted_with_every_claim_committed_meanwhile() {
        // Until the build is adopted every group may hold a claim; once it is, every claim is
        // held: those in its snapshot, another writer's committed while it was being built,
        // the writer's own batches' claims, and claims committed after adoption.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(crate::ledger::sqlite::SCHEMA).unwrap();
        conn.execute_batch("BEGIN").unwrap();
        for i in 1..=20_000 {
            claim(&conn, i, &format!("t{i}"), "A");
        }
        conn.execute_batch("COMMIT").unwrap();
        let settings =
            super::super::settings::Settings::of(&crate::config::LedgerConfig::new(&path));
        let mut groups = Groups::new(Some((path.clone(), settings)));
        let mut writer = rusqlite::Connection::open(&path).unwrap();
        let mut next = 20_001;
        let mut batches_before_adoption = 0;
        while !groups.is_ready() {
            let tx = writer.transaction().unwrap();
            groups.sync(&tx).unwrap();
            if !groups.is_ready() {
                batches_before_adoption += 1;
                assert!(
                    groups.may_hold("never", "claimed"),
                    "no filter yet: probe all"
                );
            }
            // This batch's claim, and one from another writer after it commits.
            claim(&tx, next, &format!("t{next}"), "A");
            groups.insert(&format!("t{next}"), "A");
            tx.commit().unwrap();
            groups.committed_through(next);
            claim(&conn, next + 1, &format!("t{next}"), "B");
            next += 2;
        }
        assert!(
            batches_before_adoption > 0,
            "adopted before its first sync returned"
        );
        let tx = writer.transaction().unwrap();
        groups.sync(&tx).unwrap();
        drop(tx);
        for i in 1..=20_000 {
            assert!(groups.may_hold(&format!("t{i}"), "A"), "history claim {i}");
        }
        for i in (20_001..next).step_by(2) {
            assert!(groups.may_hold(&format!("t{i}"), "A"), "batch claim {i}");
            assert!(
                groups.may_hold(&format!("t{i}"), "B"),
                "other writer's claim {}",
                i + 1
            );
        }
        let false_positives = (0..10_000)
            .filter(|i| groups.may_hold(&format!("u{i}"), "A"))
            .count();
        assert!(false_positives < 300, "{false_positives} of 10000");
    }

    #[test]
    fn a_build_beside_a_busy_writer_leaves_its_adoption_only_what_its_last_pass_missed() {
        // A ledger of 400,000 claims; its build starts, and another writer commits claims in
        // transactions of 2,000 until the build is done: the build's last pass found at most
        // ADOPTION_CLAIMS_MAX new claims, so the built filter is behind the ledger by little
        // more than what was committed while that short pass read. Red when the build stops
        // at its snapshot: it is then behind by everything committed while it read 400,000
        // claims (dozens of transactions here). A quarter of all that was committed is
        // allowed too, for a build thread descheduled on a loaded machine after its last pass.
        const HISTORY: i64 = 400_000;
        const WRITES: i64 = 2_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(crate::ledger::sqlite::SCHEMA).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF")
            .unwrap();
        let mut write = |from: i64, n: i64| {
            let tx = conn.transaction().unwrap();
            for i in from..from + n {
                claim(&tx, i, &format!("t{i}"), "A");
            }
            tx.commit().unwrap();
        };
        write(1, HISTORY);
        let settings =
            super::super::settings::Settings::of(&crate::config::LedgerConfig::new(&path));
        let (build, _halt) = build((path.clone(), settings)).unwrap();
        let (mut next, mut transactions) = (HISTORY + 1, 0);
        while !build.is_finished() {
            write(next, WRITES);
            next += WRITES;
            transactions += 1;
        }
        let filter = build.join().unwrap().unwrap();
        let behind = next - 1 - filter.claim_id_seen;
        assert!(
            behind <= (ADOPTION_CLAIMS_MAX + WRITES).max(transactions * WRITES / 4),
            "the build is {behind} claims behind the ledger ({transactions} transactions \
             committed while it ran)"
        );
        for i in 1..=filter.claim_id_seen {
            assert!(filter.may_hold(&format!("t{i}"), "A"), "claim {i}");
        }
    }

    #[test]
    fn a_purge_makes_the_next_sync_rebuild_from_the_claims_that_remain() {
        let mut conn = ledger();
        let mut groups = Filter::new();
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
