//! The reader: one thread that reads entries from the consumer group and hands them to the
//! parse pool, in four kinds of read — entries of ours held back by an earlier read (their
//! bodies did not fit the memory budget), a due XAUTOCLAIM scan for entries other consumers
//! abandoned, this consumer's own pending history, and new entries.
//!
//! Every read runs as a script on the server (`broker/read.rs`) that sends at most what is left
//! of the memory budget (`--read-bytes-max`, `read_size.rs`) and cuts down any entry too large
//! to read whole; an entry it delivered but could not send is held back as its id, ours and
//! pending, and fetched (XRANGE, counting no delivery) before anything else is read. A script
//! cannot block, so an idle reader polls (after 1 ms, then every `READ_POLL_MS_MAX` ms); its
//! waits, idle or after a failure, are on the shutdown signal, so a stop ends them at once.
//!
//! **Invariants:** the reader never acknowledges an entry it hands on (only pending ids whose
//! entries are gone from the stream, which nothing can process, and each of those only after
//! the ledger transaction that records its `vanished` audit record has committed; see
//! `forget_vanished` for the XAUTOCLAIM case, where Redis drops them first). It runs no XAUTOCLAIM scan
//! while it holds an entry that the scan could re-claim. After any transient read error it
//! picks up its own pending entries that are not in the pipeline before new entries, and that
//! recovery counts no delivery (XPENDING and XRANGE, never XREADGROUP from an id): a blip
//! must not push healthy entries toward the delivery cap. A read cut short (EINTR, UNBLOCKED)
//! is read again at once: it is not an outage. An entry past the delivery cap is handed on
//! alone, marked first (`Config::quarantine_key`), and only once nothing else is in the
//! pipeline; nothing more is read until its try is over, so nothing else can crash or fail
//! beside it. Entries are handed on in the order read, held-back ones before anything read
//! after them. Nothing is read before the group is bound to this worker's ledger
//! (`broker/binding.rs`), again after the group was recreated.

use super::parse::{Handoff, Raw};
use super::quarantine::{handoff, Quarantine};
use super::read_size::{Budget, Held};
use super::shared::Shared;
use crate::broker::binding;
use crate::broker::read::{self, Limits};
use crate::broker::stream::{self, Conn, Entry};
use crate::config::{READ_POLL_MS_MAX, READ_RESPONSE_TIMEOUT_MS};
use crate::error::{Error, Result};
use crate::ledger::{Item, Ledger};
use crate::retry::Episode;
use crate::support::failpoint;
use crossbeam_channel::Sender;
use log::{info, warn};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The one name the reader's failures are logged under.
pub const WHAT: &str = "reading from redis";

/// Reads until shutdown, until the parse pool is gone, or (with `exit_when_idle`) until the
/// stream is drained. Transient failures are waited out as one episode; a permanent one is
/// returned.
pub(super) fn run(
    client: &stream::Target,
    ledger: &dyn Ledger,
    tx: Sender<Raw>,
    shared: &Shared<'_>,
) -> Result<()> {
    let mut reader = Reader::new(client, ledger, shared);
    // Handoffs are numbered in the order read, so the writers take them in that order
    // whichever parse thread finishes first.
    let mut handed: u64 = 0;
    while !shared.stopping() {
        shared.metrics.beat();
        reader.after_failover(client)?;
        match reader.step() {
            Ok(Some((mut handoff, held))) => {
                reader.episode.succeeded();
                if handoff.entries.is_empty() {
                    continue;
                }
                handoff.seq = handed;
                handed += 1;
                failpoint::hit("after_read");
                if tx.send((handoff, held)).is_err() {
                    break;
                }
            }
            Ok(None) => {
                reader.episode.succeeded();
                if shared.wcfg.exit_when_idle && reader.drained()? {
                    break;
                }
            }
            Err(e) if e.is_no_group() => reader.recreate_group(),
            // SIGINT/SIGTERM interrupt a read (sockets with a receive timeout are not restarted
            // after a signal): that is the stop we asked for, not an outage.
            Err(_) if shared.stopping() => break,
            Err(e) if stream::read_cut_short(&e) => {
                info!("a read was cut short ({e}); reading again at once");
                reader.recover_own();
            }
            Err(e) if e.is_transient() => reader.wait_out(&e),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What one read hands on: entries and their share of the memory budget.
type Got = (Handoff, Held);

/// Where the reader is in its cycle.
struct Reader<'a> {
    /// What the stages share.
    shared: &'a Shared<'a>,
    /// Where vanished entries are recorded before they are acknowledged out.
    ledger: &'a dyn Ledger,
    /// The reader's own connection, its timeout past what a read script may take.
    conn: Conn,
    /// False until the consumer group is known to exist (again) and to be ours.
    group_ready: bool,
    /// Which of this consumer's own pending entries are still to be picked up.
    own: Own,
    /// Ids delivered to us whose bodies an earlier read held back, with their delivery counts
    /// where known (`None`: ask XPENDING), in stream order; fetched before anything else.
    unfetched: VecDeque<(String, Option<u64>)>,
    /// XAUTOCLAIM's cursor, carried between calls.
    claim_cursor: String,
    /// When the next XAUTOCLAIM scan is due.
    claim_due: Instant,
    /// The current episode of read failures, if any.
    episode: Episode<'static>,
    /// Entries past the delivery cap, waiting for their try alone.
    quarantine: Quarantine,
    /// What the entries waiting in `quarantine` hold of the budget, let go when none waits.
    quarantined: Held,
    /// The memory budget every entry read is counted against.
    budget: Arc<Budget>,
    /// What an entry may weigh and still be read whole.
    limits: Limits,
    /// Empty reads in a row: the idle poll waits 1 ms after the first, `READ_POLL_MS_MAX` after
    /// the others.
    empty_reads: u32,
    /// The target's count of primary changes the failover repair has run for.
    failovers_repaired: u64,
    /// The failover repair's failures, logged once per episode.
    repair_episode: Episode<'static>,
}

impl<'a> Reader<'a> {
    fn new(client: &stream::Target, ledger: &'a dyn Ledger, shared: &'a Shared<'a>) -> Self {
        let timeout = Duration::from_millis(READ_RESPONSE_TIMEOUT_MS);
        Reader {
            shared,
            ledger,
            conn: Conn::with_timeout(client.clone(), timeout),
            group_ready: false,
            own: Own::History("0-0".into()),
            unfetched: VecDeque::new(),
            claim_cursor: "0-0".into(),
            claim_due: Instant::now(),
            episode: Episode::new(WHAT),
            quarantine: Quarantine::default(),
            quarantined: Held::default(),
            budget: Arc::clone(&shared.budget),
            limits: Limits::for_payload(shared.wcfg.payload_bytes_max),
            empty_reads: 0,
            failovers_repaired: 0,
            repair_episode: Episode::new("the repair after a redis failover"),
        }
    }

    /// Once the Redis primary has changed since the last repair, runs the worker's
    /// [`super::AfterFailover`] repair. A transient failure is logged once per episode and
    /// leaves the repair due, so the next turn tries again; a permanent one is returned (the
    /// worker stops).
    fn after_failover(&mut self, client: &stream::Target) -> Result<()> {
        let changes = client.primary_changes();
        if changes == self.failovers_repaired {
            return Ok(());
        }
        match (self.shared.after_failover)(&mut self.conn) {
            Ok(()) => {
                self.repair_episode.succeeded();
                self.failovers_repaired = changes;
                Ok(())
            }
            Err(e) if e.is_transient() => {
                self.repair_episode.failed(&e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Makes sure the group exists and is bound to our ledger, then reads once. `Ok(None)`
    /// means the stream had nothing new for us; `Ok(Some(empty))` that there is more to do at
    /// once.
    fn step(&mut self) -> Result<Option<Got>> {
        if self.group_ready {
            return self.read();
        }
        let (cfg, wcfg) = (self.shared.cfg, self.shared.wcfg);
        if stream::ensure_group(&mut self.conn, &cfg.stream, &cfg.group)? {
            info!(
                "created consumer group {} on {} at id 0",
                cfg.group, cfg.stream
            );
        }
        binding::bind_or_refuse(&mut self.conn, &cfg.stream, &cfg.group, &wcfg.ledger)?;
        self.group_ready = true;
        Ok(Some(nothing()))
    }

    /// One read: an entry past the cap on its own, else entries held back before, else a due
    /// XAUTOCLAIM scan, else our own pending history, else new entries. Entries past the cap
    /// are held back from the batch.
    fn read(&mut self) -> Result<Option<Got>> {
        if let Some(next) = self.quarantine.next(&mut self.conn, self.shared)? {
            return Ok(Some((next, Held::default())));
        }
        // Nothing waits in the quarantine: what its entries held is let go.
        drop(std::mem::take(&mut self.quarantined));
        let Some(room) = self.room() else {
            return Ok(Some(nothing()));
        };
        let got = if !self.unfetched.is_empty() {
            Some(self.fetch(room)?)
        } else if Instant::now() >= self.claim_due && !self.holding_claimable() {
            match self.take_over_stale(room)? {
                Some(entries) => Some(entries),
                None => self.read_own_or_new(room)?,
            }
        } else {
            self.read_own_or_new(room)?
        };
        Ok(got.map(|entries| self.hand_on(entries, room)))
    }

    /// Our own pending history, or entries picked up after an error, or new entries.
    fn read_own_or_new(&mut self, room: usize) -> Result<Option<Vec<Entry>>> {
        Ok(match self.own.clone() {
            Own::History(cursor) => Some(self.reread_own(&cursor, room)?),
            Own::Recover(after) => Some(self.pick_up_own(after)?),
            Own::Done => self.read_new(room)?,
        })
    }

    /// The budget's room for a read, waiting a moment for it; `None` when there is not room
    /// for the heaviest entry a read may bring (the pipeline still holds that much).
    fn room(&self) -> Option<usize> {
        let needed = self.limits.entry_weight_max();
        if self.budget.wait_for_room(needed, Duration::from_millis(10)) {
            Some(self.budget.room())
        } else {
            None
        }
    }

    /// Counts what a read brought against the budget and hands on all but the entries past the
    /// delivery cap, whose share the reader keeps while they wait.
    fn hand_on(&mut self, entries: Vec<Entry>, room: usize) -> Got {
        let weight: usize = entries.iter().map(Entry::weight).sum();
        // The read script keeps to the room it was given (one entry may fill it alone); more
        // would mean the script and `Entry::weight` disagree.
        assert!(
            weight <= room || entries.len() == 1,
            "a read of {} entries weighs {weight} bytes, over the {room} it was given",
            entries.len()
        );
        let mut held = self.budget.hold(weight);
        let handoff = self
            .quarantine
            .hold(entries, self.shared.wcfg.max_deliveries);
        let passed: usize = handoff.entries.iter().map(Entry::weight).sum();
        let kept_back = held.bytes() - passed;
        self.quarantined.absorb(held.take(kept_back));
        (handoff, held)
    }

    /// True when an entry has been in our pipeline long enough that an XAUTOCLAIM scan could
    /// take it back from us. Each such claim counts as a delivery, so while the writer waits
    /// out a long outage, scanning would push healthy entries over the delivery cap (and a
    /// restart would then dead-letter them). Half the idle time leaves a margin for the gap
    /// between Redis's delivery time and ours.
    fn holding_claimable(&self) -> bool {
        let held_min = Duration::from_millis(self.shared.wcfg.claim_idle_ms / 2);
        self.shared.in_flight.any_held(held_min)
    }

    /// Entries of ours an earlier read delivered but held back, as many as the room takes, in
    /// order; XRANGE counts no delivery.
    fn fetch(&mut self, room: usize) -> Result<Vec<Entry>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let ids: Vec<(String, u64)> = (self.unfetched.iter())
            .take(wcfg.batch_count_max)
            .map(|(id, count)| (id.clone(), count.unwrap_or(1)))
            .collect();
        let read = read::fetch(&mut self.conn, &cfg.stream, &ids, room, &self.limits)?;
        let why = "is pending but no longer in the stream";
        forget_vanished(&mut self.conn, self.ledger, shared, &read.vanished, why)?;
        shared.in_flight.release(read.vanished.iter().cloned());
        let taken = ids.len() - read.held.len();
        let counts_unknown = (self.unfetched.drain(..taken)).any(|(_, count)| count.is_none());
        let mut entries = read.entries;
        if counts_unknown {
            // Claimed or re-read held back: their counts are XPENDING's (one pipeline for all).
            let (stream_key, group) = (&cfg.stream, &cfg.group);
            stream::fill_delivery_counts(
                &mut self.conn,
                stream_key,
                group,
                &wcfg.consumer,
                &mut entries,
            )?;
        }
        Ok(entries)
    }

    /// Keeps ids a read delivered to us without their bodies, to fetch next, in our pipeline
    /// from now on (the heartbeat keeps them ours; no scan hands them back to us).
    fn hold_back(&mut self, ids: Vec<String>, counts_known: Option<u64>) {
        if ids.is_empty() {
            return;
        }
        self.shared.in_flight.track_ids(&ids);
        self.unfetched
            .extend(ids.into_iter().map(|id| (id, counts_known)));
    }

    /// One XAUTOCLAIM step over the group's pending list; `None` when it took nothing.
    fn take_over_stale(&mut self, room: usize) -> Result<Option<Vec<Entry>>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let got = read::autoclaim(
            &mut self.conn,
            &cfg.stream,
            &cfg.group,
            &wcfg.consumer,
            wcfg.claim_idle_ms,
            &self.claim_cursor,
            wcfg.batch_count_max,
            room,
            &self.limits,
        )?;
        let why = "was deleted from the stream while pending";
        forget_vanished(&mut self.conn, self.ledger, shared, &got.deleted, why)?;
        self.claim_cursor = got.next_cursor;
        if self.claim_cursor == "0-0" {
            self.claim_due = Instant::now() + claim_interval(wcfg.claim_idle_ms);
        }
        let held = got
            .read
            .held
            .into_iter()
            .filter(|id| !shared.in_flight.holds(id));
        self.hold_back(held.collect(), None);
        let mut entries = shared.in_flight.not_in(got.read.entries);
        if entries.is_empty() {
            return Ok(if self.unfetched.is_empty() {
                None
            } else {
                Some(Vec::new())
            });
        }
        let (stream_key, group) = (&cfg.stream, &cfg.group);
        stream::fill_delivery_counts(
            &mut self.conn,
            stream_key,
            group,
            &wcfg.consumer,
            &mut entries,
        )?;
        info!(
            "took over {} entries idle for over {} ms",
            entries.len(),
            wcfg.claim_idle_ms
        );
        Ok(Some(shared.in_flight.track(entries)))
    }

    /// One page of this consumer's own pending entries, from `cursor`.
    fn reread_own(&mut self, cursor: &str, room: usize) -> Result<Vec<Entry>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let (stream_key, group, consumer) = (&cfg.stream, &cfg.group, &wcfg.consumer);
        let read = read::read_group(
            &mut self.conn,
            stream_key,
            group,
            consumer,
            cursor,
            wcfg.batch_count_max,
            room,
            &self.limits,
        )?;
        let why = "is pending but no longer in the stream";
        forget_vanished(&mut self.conn, self.ledger, shared, &read.vanished, why)?;
        self.own = read.last_id.map_or(Own::Done, Own::History);
        let held = read
            .held
            .into_iter()
            .filter(|id| !shared.in_flight.holds(id));
        self.hold_back(held.collect(), None);
        let mut entries = shared.in_flight.not_in(read.entries);
        stream::fill_delivery_counts(&mut self.conn, stream_key, group, consumer, &mut entries)?;
        Ok(shared.in_flight.track(entries))
    }

    /// One page of this consumer's pending entries after `after` that are not in our pipeline,
    /// without counting a delivery: ids and counts from XPENDING, bodies fetched next (XRANGE).
    fn pick_up_own(&mut self, after: Option<String>) -> Result<Vec<Entry>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let page = wcfg.batch_count_max;
        let ids = stream::pending_ids(
            &mut self.conn,
            &cfg.stream,
            &cfg.group,
            &wcfg.consumer,
            after.as_deref(),
            page,
        )?;
        let next = match ids.last() {
            Some((id, _)) if ids.len() == page => Own::Recover(Some(id.clone())),
            _ => Own::Done,
        };
        let lost: Vec<(String, u64)> = ids
            .into_iter()
            .filter(|(id, _)| !shared.in_flight.holds(id))
            .collect();
        self.own = next;
        if !lost.is_empty() {
            info!(
                "picked up {} entries of ours that were pending but not in hand",
                lost.len()
            );
            for (id, count) in lost {
                self.shared.in_flight.track_ids(std::slice::from_ref(&id));
                self.unfetched.push_back((id, Some(count)));
            }
        }
        Ok(Vec::new())
    }

    /// New entries; `None` when none came, after the idle poll's wait (1 ms after entries came,
    /// then `READ_POLL_MS_MAX` ms).
    fn read_new(&mut self, room: usize) -> Result<Option<Vec<Entry>>> {
        let (cfg, wcfg) = (self.shared.cfg, self.shared.wcfg);
        let read = read::read_group(
            &mut self.conn,
            &cfg.stream,
            &cfg.group,
            &wcfg.consumer,
            ">",
            wcfg.batch_count_max,
            room,
            &self.limits,
        )?;
        self.hold_back(read.held, Some(1));
        if read.entries.is_empty() {
            let poll_ms = (1u64 << self.empty_reads.min(16)).min(READ_POLL_MS_MAX);
            self.empty_reads = self.empty_reads.saturating_add(1);
            // On the shutdown signal: a stop ends the idle wait at once.
            self.shared
                .shutdown
                .wait_timeout(Duration::from_millis(poll_ms));
            return Ok(None);
        }
        self.empty_reads = 0;
        Ok(Some(self.shared.in_flight.track(read.entries)))
    }

    /// With `exit_when_idle`: true when nothing is in our pipeline and nothing is pending in
    /// the group. The check talks to Redis too: losing it is a transient failure like any other
    /// read, waited out here, never a reason to exit.
    fn drained(&mut self) -> Result<bool> {
        let cfg = self.shared.cfg;
        let idle = if self.shared.in_flight.is_empty() {
            stream::pending_count(&mut self.conn, &cfg.stream, &cfg.group).map(|n| n == 0)
        } else {
            Ok(false)
        };
        match idle {
            Ok(true) => {
                info!(
                    "stream {} is drained and group {} has nothing pending; exiting",
                    cfg.stream, cfg.group
                );
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) if e.is_transient() => {
                self.shared.shutdown.wait_timeout(self.episode.failed(&e));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// After NOGROUP: the group went with a Redis restart; recreate it (and bind it again) and
    /// start over.
    fn recreate_group(&mut self) {
        warn!(
            "consumer group {} is gone (Redis restarted without its data?); recreating it",
            self.shared.cfg.group
        );
        self.group_ready = false;
        self.own = Own::History("0-0".into());
        // Entries held back past the cap, or delivered and not fetched, went with the group.
        self.quarantine.forget(&self.shared.in_flight);
        let unfetched = self.unfetched.drain(..).map(|(id, _)| id);
        self.shared.in_flight.release(unfetched);
        self.claim_cursor = "0-0".into();
    }

    /// After a transient read error: note it, and wait before the next read (a stop ends the
    /// wait at once: the reader then stops rather than reads).
    fn wait_out(&mut self, e: &Error) {
        self.recover_own();
        self.shared.shutdown.wait_timeout(self.episode.failed(e));
    }

    /// After a read that failed or was cut short: a reply lost with the connection may have
    /// moved entries into our pending list without handing them to us; pick them up before new
    /// entries rather than leave them until the XAUTOCLAIM scan takes them over. A history
    /// re-read under way (at start) carries on from its cursor instead.
    fn recover_own(&mut self) {
        if !matches!(self.own, Own::History(_)) {
            self.own = Own::Recover(None);
        }
    }
}

/// An empty handoff: nothing to hand on, more to do at once.
fn nothing() -> Got {
    (handoff(Vec::new(), false), Held::default())
}

/// Which of this consumer's own pending entries the reader has still to pick up.
#[derive(Debug, Clone)]
enum Own {
    /// None: every pending entry of ours is in the pipeline or accounted for.
    Done,
    /// At start, and after the group was recreated: XREADGROUP from this id through our pending
    /// history. It counts a delivery for each entry, as it should: each start is a new attempt,
    /// and counting them is what stops a crash loop at the delivery cap.
    History(String),
    /// After a read that failed or was cut short: XPENDING after this id (from the start when
    /// `None`), bodies fetched by XRANGE, skipping what is in our pipeline. Neither command
    /// counts a delivery, so blips cannot push healthy entries toward the cap.
    Recover(Option<String>),
}

/// How often to scan for stranded entries: often enough to take them over soon after they
/// become eligible, rarely enough to cost nothing.
fn claim_interval(claim_idle_ms: u64) -> Duration {
    Duration::from_millis((claim_idle_ms / 2).clamp(100, 5_000))
}

/// Acknowledges pending ids whose entries are gone, so they stop occupying the PEL — after
/// one ledger transaction has recorded a `vanished` audit record for each. A transient ledger
/// failure is waited out like the writer's; one that outlasts shutdown (or a permanent one) is
/// returned before any XACK, so ids found by re-reading our own history stay pending and are
/// found again next time. Limit: ids that XAUTOCLAIM reports deleted (Redis 7+) were already
/// dropped from the PEL by Redis as it reported them, so for those the XACK is a no-op and
/// a crash before this commit loses the record (never a payment: there is nothing to pay).
fn forget_vanished(
    conn: &mut Conn,
    ledger: &dyn Ledger,
    shared: &Shared<'_>,
    ids: &[String],
    why: &str,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let items: Vec<Item<'_>> = ids
        .iter()
        .map(|id| Item::Vanished {
            entry_id: id,
            reason: why,
        })
        .collect();
    let (consumer, stream_key) = (shared.wcfg.consumer.as_str(), shared.cfg.stream.as_str());
    let outcomes = shared.retry_ledger("recording vanished entries in the ledger", || {
        ledger.record(&items, consumer, stream_key)
    })?;
    assert_eq!(
        outcomes.len(),
        items.len(),
        "one outcome per vanished entry"
    );
    for id in ids {
        warn!("entry {id} {why}; recorded it as vanished and acknowledging it out of the pending list (nothing to process)");
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    stream::ack(conn, &shared.cfg.stream, &shared.cfg.group, &refs)?;
    Ok(())
}
