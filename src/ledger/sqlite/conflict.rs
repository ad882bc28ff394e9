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

/// What [`Filter::sync`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Synced {
    /// The filter holds every claim's group.
    Current,
    /// It holds every claim's group, but more than it was sized for: still right, but its
    /// false positives grow with every claim; a bigger one should replace it.
    Overfull,
    /// Claims were purged since it was first synced, and it was not read further. A purge
    /// that removed the newest claims lets new ones take their ids, at or below the highest
    /// this filter has read, where its next sync would not look: it must not be used again.
    Purged,
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
    /// transaction, before its first claim (or, for a build, inside any read transaction:
    /// [`Groups`] catches up with what was committed after it). On an error the filter must be
    /// dropped: a full read stops part way through the claims, in index order.
    ///
    /// Never reads the ledger again from the start: a filter claims were purged under, or one
    /// past its size, says so ([`Synced`]) and the caller decides where a new one is built.
    /// Rebuilt here, inside a batch, a filter of 20,000,000 claims held every commit back for
    /// 20 s, and a purge beside a worker made it do that after every purge batch.
    fn sync(&mut self, tx: &Connection) -> Result<Synced> {
        self.sync_some(tx, None).map(|(synced, _)| synced)
    }

    /// [`Filter::sync`], reading at most `limit` claims (the lowest ids not yet read) when
    /// given; also returns how many it read.
    fn sync_some(&mut self, tx: &Connection, limit: Option<i64>) -> Result<(Synced, i64)> {
        let purges = purges(tx)?;
        match self.purges_seen {
            // The first sync: sized for the claims there are at once. Sized by the filter's
            // growth alone, a ledger of 1,000,000 claims was read twice before its first batch
            // (once into the smallest filter, then again into one big enough): 0.65 s.
            None => {
                let capacity = claim_ids_spanned(tx)?.saturating_mul(2).max(self.capacity);
                *self = Self::with_capacity(capacity);
                self.purges_seen = Some(purges);
            }
            Some(seen) if seen != purges => return Ok((Synced::Purged, 0)),
            Some(_) => {}
        }
        // Everything, on a fresh filter: no `claim_id` bound, so SQLite reads the claim index
        // (it covers the instant, the award and the rowid) rather than the larger table.
        // In bounded steps: in claim id order, `limit` at a time.
        let mut stmt = tx.prepare_cached(match (self.claim_id_seen, limit) {
            (0, None) => {
                "SELECT claim_id, submission_instant, award_id FROM processed_messages
                 WHERE submission_instant IS NOT NULL AND ?1 = 0 AND ?2 < 0"
            }
            (_, None) => {
                "SELECT claim_id, submission_instant, award_id FROM processed_messages
                 WHERE claim_id > ?1 AND submission_instant IS NOT NULL AND ?2 < 0"
            }
            (_, Some(_)) => {
                "SELECT claim_id, submission_instant, award_id FROM processed_messages
                 WHERE claim_id > ?1 AND submission_instant IS NOT NULL
                 ORDER BY claim_id LIMIT ?2"
            }
        })?;
        let mut rows = stmt.query([self.claim_id_seen, limit.unwrap_or(-1)])?;
        let mut read = 0;
        // Moved only once every row is in, so a read that fails part way never leaves a
        // highest id seen with lower ones unread.
        let mut claim_id_max = self.claim_id_seen;
        while let Some(row) = rows.next()? {
            let claim_id: i64 = row.get(0)?;
            let instant = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
            let award = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
            self.insert(instant, award);
            claim_id_max = claim_id_max.max(claim_id);
            read += 1;
        }
        self.claim_id_seen = claim_id_max;
        let synced = if self.len > self.capacity {
            Synced::Overfull
        } else {
            Synced::Current
        };
        Ok((synced, read))
    }

    /// A filter of every claim, built inside `tx`: its first sync sizes it for them all.
    fn built_here(tx: &Connection) -> Result<Filter> {
        let mut filter = Filter::new();
        let synced = filter.sync(tx)?;
        debug_assert_eq!(synced, Synced::Current, "a first sync sizes the filter");
        Ok(filter)
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

/// The writer's [`Filter`], built off the writer's path: on a thread of its own, from read
/// snapshots, while batches go on without it (every new claim is probed, as on a false
/// positive) or with the filter it replaces. A worker opening a ledger of 1,000,000 claims
/// used to read them all inside its first batch before committing anything (about 0.5 s;
/// BENCHMARKS.md), and one past 20,000,000 claims stopped every commit for 20 s to build a
/// bigger filter.
///
/// Nothing is missed by adopting a filter built from snapshots: it records the highest claim
/// id it read and the purge count it saw, and its adoption, a [`Filter::sync`] in a batch's
/// write transaction, adds every claim above that id (every claim committed after the
/// snapshot has a higher id, since ids only grow while nothing is purged) or, if a purge
/// happened meanwhile, drops it.
///
/// While a retention purge runs (each of its batches counts itself in [`PURGES_META`]) no
/// filter is used: any in use is dropped at the first purge batch, and the next build starts
/// once the count has stood still for [`BUILD_AFTER_PURGES_QUIET`], not after each batch.
pub(super) struct Groups {
    state: State,
    /// The ledger file and how to open it, for builds; `None` builds inside the batch.
    source: Option<(PathBuf, Settings)>,
}

/// How long the purge count must stand still before a filter dropped for a purge is built
/// again: a purge's batches follow each other far faster, and each would end the build.
pub(super) const BUILD_AFTER_PURGES_QUIET: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the writer's filter is.
enum State {
    /// No filter in use: every group may hold a claim. A build starts at the next sync, or,
    /// with `quiet`, once the purge count it holds has not moved since the instant beside it
    /// for [`BUILD_AFTER_PURGES_QUIET`].
    Unbuilt {
        quiet: Option<(i64, std::time::Instant)>,
    },
    /// Being built; until it is adopted, every group may hold a claim. The [`Halt`] stops
    /// the build when the writer goes away first (see `Drop`).
    Building(Build),
    /// In use.
    Ready(Filter),
    /// In use though past its size; a bigger one is being built to replace it.
    Growing(Filter, Build),
}

impl State {
    /// No filter until the purge count, `purges` now, stands still.
    fn after_purges(purges: i64) -> State {
        State::Unbuilt {
            quiet: Some((purges, std::time::Instant::now())),
        }
    }
}

impl Groups {
    /// No filter yet; the first [`Groups::sync`] starts building one from `source` (or, with
    /// none, builds it there and then).
    pub(super) fn new(source: Option<(PathBuf, Settings)>) -> Self {
        Groups {
            state: State::Unbuilt { quiet: None },
            source,
        }
    }

    /// Brings the filter up to every claim in the ledger, if one is in use, adopts a build
    /// that is done, and starts one when it is time. Call inside the batch's write
    /// transaction, before its first claim. Reads only claims committed since the last sync
    /// (and a build's adoption, those since its last pass): never the whole ledger, but where
    /// there is no `source` to build from beside the writer.
    pub(super) fn sync(&mut self, tx: &Transaction<'_>) -> Result<()> {
        // Taken out, so an error below leaves `Unbuilt`: a filter whose sync failed is dropped
        // and built again, never used with claims unread.
        let state = std::mem::replace(&mut self.state, State::Unbuilt { quiet: None });
        let Some(source) = self.source.clone() else {
            let mut filter = match state {
                State::Ready(filter) => filter,
                _ => Filter::built_here(tx)?,
            };
            if filter.sync(tx)? != Synced::Current {
                filter = Filter::built_here(tx)?;
            }
            self.state = State::Ready(filter);
            return Ok(());
        };
        self.state = match state {
            State::Ready(mut filter) => match filter.sync(tx)? {
                Synced::Current => State::Ready(filter),
                Synced::Overfull => grow(filter, source),
                Synced::Purged => State::after_purges(purges(tx)?),
            },
            State::Growing(filter, bigger) if bigger.0.is_finished() => {
                drop(filter);
                adopt(bigger, tx, source)?
            }
            State::Growing(mut filter, bigger) => match filter.sync(tx)? {
                Synced::Current | Synced::Overfull => State::Growing(filter, bigger),
                Synced::Purged => {
                    halt(bigger);
                    State::after_purges(purges(tx)?)
                }
            },
            State::Building(build) if !build.0.is_finished() => State::Building(build),
            State::Building(build) => adopt(build, tx, source)?,
            State::Unbuilt { quiet: None } => start(source, tx)?,
            State::Unbuilt {
                quiet: Some((seen, since)),
            } => match purges(tx)? {
                now if now != seen => State::after_purges(now),
                _ if since.elapsed() < BUILD_AFTER_PURGES_QUIET => State::Unbuilt {
                    quiet: Some((seen, since)),
                },
                _ => start(source, tx)?,
            },
        };
        Ok(())
    }

    /// Adds the group of a claim the batch under way made (nothing while there is no filter:
    /// the claim is committed after the build's snapshot, so the adoption's sync reads it).
    pub(super) fn insert(&mut self, instant: &str, award: &str) {
        if let State::Ready(filter) | State::Growing(filter, _) = &mut self.state {
            filter.insert(instant, award);
        }
    }

    /// The batch that made claims up to `claim_id` has committed (see
    /// [`Filter::committed_through`]).
    pub(super) fn committed_through(&mut self, claim_id: i64) {
        if let State::Ready(filter) | State::Growing(filter, _) = &mut self.state {
            filter.committed_through(claim_id);
        }
    }

    /// Whether a filter is in use (tests watch the build being adopted).
    #[cfg(test)]
    fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready(_) | State::Growing(..))
    }

    /// False only if no claim is in this group; true for every group while no filter is in
    /// use.
    pub(super) fn may_hold(&self, instant: &str, award: &str) -> bool {
        match &self.state {
            State::Ready(filter) | State::Growing(filter, _) => filter.may_hold(instant, award),
            State::Unbuilt { .. } | State::Building(..) => true,
        }
    }
}

impl Drop for Groups {
    /// A build still reading when the writer goes (a worker that stops before its filter is
    /// ready: one that drains one entry and exits) is stopped and waited for: its read
    /// transaction would otherwise hold the ledger's last checkpoint (`checkpoint.rs`) until it
    /// had read every claim, about half a second per million.
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, State::Unbuilt { quiet: None }) {
            State::Building(build) | State::Growing(_, build) => halt(build),
            State::Ready(_) | State::Unbuilt { .. } => {}
        }
    }
}

/// Stops a build and waits for it.
fn halt((build, stop): Build) {
    stop.halt();
    // Stopped, it ends with an error nobody needs; a panic there is not ours to raise.
    drop(build.join());
}

/// A build started; if none can start, no filter until the purge count has stood still as
/// long as after a purge, then another try.
fn start(source: (PathBuf, Settings), tx: &Transaction<'_>) -> Result<State> {
    Ok(match build(source) {
        Ok(build) => State::Building(build),
        Err(e) => {
            log::warn!("cannot start the claim-group filter's build ({e})");
            State::after_purges(purges(tx)?)
        }
    })
}

/// An overfull `filter` stays in use while a bigger one is built (its first sync sizes it for
/// the claims there are then); if no build can start, it stays in use as it is.
fn grow(filter: Filter, source: (PathBuf, Settings)) -> State {
    match build(source) {
        Ok(bigger) => State::Growing(filter, bigger),
        Err(e) => {
            log::warn!("cannot start a bigger claim-group filter's build ({e}); keeping this one");
            State::Ready(filter)
        }
    }
}

/// A finished build, adopted with a sync inside the batch's transaction (only the claims
/// committed since its last pass); dropped if claims were purged since, or it failed.
fn adopt((build, _): Build, tx: &Transaction<'_>, source: (PathBuf, Settings)) -> Result<State> {
    let mut filter = match build.join() {
        Ok(Ok(Some(filter))) => filter,
        Ok(Ok(None)) => return Ok(State::after_purges(purges(tx)?)),
        Ok(Err(e)) => {
            log::warn!(
                "building the claim-group filter failed ({e}); trying again in {}s",
                BUILD_AFTER_PURGES_QUIET.as_secs()
            );
            return Ok(State::after_purges(purges(tx)?));
        }
        Err(_) => {
            log::warn!(
                "building the claim-group filter panicked; trying again in {}s",
                BUILD_AFTER_PURGES_QUIET.as_secs()
            );
            return Ok(State::after_purges(purges(tx)?));
        }
    };
    Ok(match filter.sync(tx)? {
        Synced::Current => State::Ready(filter),
        Synced::Overfull => grow(filter, source),
        Synced::Purged => State::after_purges(purges(tx)?),
    })
}

/// A filter's build under way (`None`: claims were purged while it read), and how to stop it.
type Build = (std::thread::JoinHandle<Result<Option<Filter>>>, Halt);

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

/// Claims a build reads in one read transaction. One snapshot for a whole build kept every
/// page the worker wrote meanwhile in the WAL: on a ledger of 10,000,000 claims, a minute and
/// gigabytes, which the checkpointer then copied back and fsynced at once while commits
/// waited (BENCHMARKS.md, purge beside a worker).
pub(super) const BUILD_STEP_CLAIMS: i64 = 100_000;

/// The pause between two steps of a build: one round of the checkpointer, which can then
/// start the WAL over (its RESTART waits for every reader of the log). Steps back to back kept
/// the log from starting over until the build was done: 1.8 GB of WAL beside a worker on a
/// ledger of 10,000,000 claims. 25 s more for a build of 10,000,000 claims, during which every
/// new claim is probed.
pub(super) const BUILD_STEP_PAUSE: std::time::Duration =
    std::time::Duration::from_millis(super::checkpoint::CHECKPOINT_INTERVAL_MS);

/// Starts building a filter of every claim in the ledger at `path`, on its own connection and
/// on a thread of its own: in claim id order, [`BUILD_STEP_CLAIMS`] at a time, each step in a
/// read transaction of its own (claim ids only grow while nothing is purged, and each step
/// checks that nothing was), [`BUILD_STEP_PAUSE`] apart, until a step reaches the last claim.
/// Its adoption, inside a batch, then reads only what was committed since that step: it once
/// read every claim the worker made while a build of one snapshot ran, and a build of over a
/// minute beside a busy worker on 10,000,000 claims left millions. Ends with `None` if claims
/// were purged meanwhile.
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
            loop {
                Halt::asked(&asked)?;
                let tx = conn.transaction()?;
                let (synced, read) = filter.sync_some(&tx, Some(BUILD_STEP_CLAIMS))?;
                drop(tx);
                match synced {
                    Synced::Purged => return Ok(None),
                    // Claims came faster than it was sized for: again, sized for them.
                    Synced::Overfull => filter = Filter::new(),
                    Synced::Current if read < BUILD_STEP_CLAIMS => break,
                    Synced::Current => {}
                }
                // Out of any read for a checkpoint round: a RESTART waits for every reader of
                // the log, and steps back to back were always one (BUILD_STEP_CLAIMS).
                std::thread::sleep(BUILD_STEP_PAUSE);
            }
            Ok(Some(filter))
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
    fn every_claimed_group_is_held_including_other_writers_claims_and_past_the_filters_size() {
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
        // Past its size it says so (a bigger one is built beside the writer: `Groups`), and
        // still holds every group.
        assert_eq!(groups.sync(&tx).unwrap(), Synced::Overfull);
        drop(tx);
        for i in 1..=500 {
            assert!(groups.may_hold(&format!("t{i}"), "A"), "group {i} lost");
        }
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
    fn a_build_beside_a_busy_writer_leaves_its_adoption_only_what_its_last_step_missed() {
        // A ledger of 1,000,000 claims; its build starts, and another writer commits claims in
        // transactions of 2,000 until the build is done: the build's last step reached the
        // last claim, so the built filter is behind the ledger by little more than what was
        // committed while that step read (3 transactions allowed). Red when the build stops
        // at one snapshot: it is then behind by everything committed while it read 1,000,000
        // claims (a dozen transactions here). A quarter of all that was committed is
        // allowed too, for a build thread descheduled on a loaded machine after its last step.
        //
        // The writer pauses after each transaction, as a worker does between batches: writing
        // back to back with `synchronous = OFF` it could outrun the build's steps (a pause of
        // a checkpoint round each) on a fast disk, and the build, which must reach the last
        // claim, then never ended (seen: the test ran until killed). A build that has not
        // ended after two minutes fails the test, saying so.
        const HISTORY: i64 = 1_000_000;
        const WRITES: i64 = 2_000;
        const WRITER_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);
        const GIVE_UP: std::time::Duration = std::time::Duration::from_secs(120);
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
        let started = std::time::Instant::now();
        while !build.is_finished() {
            assert!(
                started.elapsed() < GIVE_UP,
                "the build never reached the last claim beside a writer of {WRITES} claims \
                 every {WRITER_PAUSE:?} ({transactions} transactions in {GIVE_UP:?})"
            );
            write(next, WRITES);
            next += WRITES;
            transactions += 1;
            std::thread::sleep(WRITER_PAUSE);
        }
        let filter = build.join().unwrap().unwrap().expect("nothing was purged");
        let behind = next - 1 - filter.claim_id_seen;
        assert!(
            behind <= (3 * WRITES).max(transactions * WRITES / 4),
            "the build is {behind} claims behind the ledger ({transactions} transactions \
             committed while it ran)"
        );
        for i in 1..=filter.claim_id_seen {
            assert!(filter.may_hold(&format!("t{i}"), "A"), "claim {i}");
        }
    }

    #[test]
    fn a_purge_makes_a_filter_unusable_and_one_built_here_holds_the_claims_that_remain() {
        let mut conn = ledger();
        let mut filter = Filter::new();
        claim(&conn, 1, "t1", "A");
        let tx = conn.transaction().unwrap();
        assert_eq!(filter.sync(&tx).unwrap(), Synced::Current);
        drop(tx);
        // A purge removes claim 1, counts itself, and a claim reuses id 1 in another group.
        conn.execute_batch(&format!(
            "DELETE FROM processed_messages;
             INSERT INTO ledger_meta (name, value) VALUES ('{PURGES_META}', '1');"
        ))
        .unwrap();
        claim(&conn, 1, "t2", "B");
        let tx = conn.transaction().unwrap();
        assert_eq!(filter.sync(&tx).unwrap(), Synced::Purged);
        assert!(!filter.may_hold("t2", "B"), "it never read the reused id");
        // With no file to build from beside the writer, the writer builds it anew.
        let mut groups = Groups::new(None);
        groups.sync(&tx).unwrap();
        assert!(groups.may_hold("t2", "B"), "the reused id's group");
        drop(tx);
        conn.execute_batch(&format!(
            "UPDATE ledger_meta SET value = '2' WHERE name = '{PURGES_META}'"
        ))
        .unwrap();
        claim(&conn, 2, "t3", "C");
        let tx = conn.transaction().unwrap();
        groups.sync(&tx).unwrap();
        assert!(groups.may_hold("t3", "C"), "after the second purge");
    }

    /// A ledger file of `n` claims (`t1`..`tn`, award `A`) and groups that build from it.
    fn on_file(n: i64) -> (tempfile::TempDir, std::path::PathBuf, Groups) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(crate::ledger::sqlite::SCHEMA).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; BEGIN")
            .unwrap();
        for i in 1..=n {
            claim(&conn, i, &format!("t{i}"), "A");
        }
        conn.execute_batch("COMMIT").unwrap();
        let settings =
            super::super::settings::Settings::of(&crate::config::LedgerConfig::new(&path));
        let groups = Groups::new(Some((path.clone(), settings)));
        (dir, path, groups)
    }

    /// Syncs in a write transaction of `conn` until `done` says so (at most 30 s).
    fn sync_until(
        conn: &mut rusqlite::Connection,
        groups: &mut Groups,
        mut done: impl FnMut(&Groups) -> bool,
    ) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            groups.sync(&tx).unwrap();
            drop(tx);
            if done(groups) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "never came about");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_filter_past_its_size_stays_in_use_while_a_bigger_one_is_built_beside_the_writer() {
        // A filter in use; claims past twice what it was sized for arrive from another
        // writer: the next sync reads only them (no rebuild inside the batch), the filter
        // stays in use holding every group while a bigger one builds, and the bigger one is
        // adopted holding every group too.
        let (_dir, path, mut groups) = on_file(1_000);
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        sync_until(&mut conn, &mut groups, |g| {
            matches!(g.state, State::Ready(_))
        });
        let capacity = |g: &Groups| match &g.state {
            State::Ready(f) | State::Growing(f, _) => f.capacity,
            _ => 0,
        };
        let sized = capacity(&groups);
        let more = sized as i64 + 1_000;
        conn.execute_batch("BEGIN").unwrap();
        for i in 1_001..=1_000 + more {
            claim(&conn, i, &format!("t{i}"), "A");
        }
        conn.execute_batch("COMMIT").unwrap();
        let tx = conn.transaction().unwrap();
        groups.sync(&tx).unwrap();
        drop(tx);
        assert!(matches!(groups.state, State::Growing(..)), "growing beside");
        for i in 1..=1_000 + more {
            assert!(
                groups.may_hold(&format!("t{i}"), "A"),
                "claim {i} while growing"
            );
        }
        sync_until(&mut conn, &mut groups, |g| {
            matches!(g.state, State::Ready(_))
        });
        assert!(capacity(&groups) > sized, "adopted a bigger filter");
        for i in 1..=1_000 + more {
            assert!(
                groups.may_hold(&format!("t{i}"), "A"),
                "claim {i} after growing"
            );
        }
    }

    #[test]
    fn while_a_purge_goes_on_no_filter_is_used_and_none_is_built_after_each_batch() {
        // A filter in use; a purge batch counts itself: the filter is dropped (every group may
        // hold a claim) and no build starts while the count keeps moving or has stood still
        // for less than BUILD_AFTER_PURGES_QUIET.
        let (_dir, path, mut groups) = on_file(1_000);
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        sync_until(&mut conn, &mut groups, |g| {
            matches!(g.state, State::Ready(_))
        });
        for purge in 1..=5 {
            conn.execute(
                &format!(
                    "INSERT INTO ledger_meta (name, value) VALUES ('{PURGES_META}', ?1)
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value"
                ),
                [purge],
            )
            .unwrap();
            let tx = conn.transaction().unwrap();
            groups.sync(&tx).unwrap();
            drop(tx);
            assert!(
                matches!(groups.state, State::Unbuilt { quiet: Some(_) }),
                "no filter, no build, after purge batch {purge}"
            );
            assert!(groups.may_hold("never", "claimed"));
        }
    }
}
