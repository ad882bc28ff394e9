//! The reader: one thread that reads entries from the consumer group and hands them to the
//! parse pool, in three kinds of read — a due XAUTOCLAIM scan for entries other consumers
//! abandoned, this consumer's own pending history, and new entries.
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
//! beside it.

use super::parse::Handoff;
use super::quarantine::{handoff, Quarantine};
use super::read_size::ReadSize;
use super::Shared;
use crate::broker::stream::{self, Conn, Entry};
use crate::config::{BLOCK_TIMEOUT_SLACK_MS, EXIT_WHEN_IDLE_BLOCK_MS};
use crate::error::{Error, Result};
use crate::ledger::{Item, Ledger};
use crate::retry::Episode;
use crate::support::failpoint;
use crossbeam_channel::Sender;
use log::{info, warn};
use std::time::{Duration, Instant};

/// The one name the reader's failures are logged under.
const WHAT: &str = "reading from redis";

/// Reads until shutdown, until the parse pool is gone, or (with `exit_when_idle`) until the
/// stream is drained. Transient failures are waited out as one episode; a permanent one is
/// returned.
pub(super) fn run(
    client: &stream::Target,
    ledger: &dyn Ledger,
    tx: Sender<Handoff>,
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
            Ok(Some(mut handoff)) => {
                reader.episode.succeeded();
                if handoff.entries.is_empty() {
                    continue;
                }
                handoff.seq = handed;
                handed += 1;
                failpoint::hit("after_read");
                if tx.send(handoff).is_err() {
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
            // SIGINT/SIGTERM interrupt a blocking read (sockets with a receive timeout are
            // not restarted after a signal): that is the stop we asked for, not an outage.
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

/// Where the reader is in its cycle.
struct Reader<'a> {
    /// What the stages share.
    shared: &'a Shared<'a>,
    /// Where vanished entries are recorded before they are acknowledged out.
    ledger: &'a dyn Ledger,
    /// The blocking connection, its timeout past XREADGROUP's BLOCK.
    conn: Conn,
    /// False until the consumer group is known to exist (again).
    group_ready: bool,
    /// Which of this consumer's own pending entries are still to be picked up.
    own: Own,
    /// XAUTOCLAIM's cursor, carried between calls.
    claim_cursor: String,
    /// When the next XAUTOCLAIM scan is due.
    claim_due: Instant,
    /// The current episode of read failures, if any.
    episode: Episode<'static>,
    /// Entries past the delivery cap, waiting for their try alone.
    quarantine: Quarantine,
    /// How many entries the next read asks for, from the byte budget and the sizes seen.
    size: ReadSize,
    /// The target's count of primary changes the failover repair has run for.
    failovers_repaired: u64,
}

impl<'a> Reader<'a> {
    fn new(client: &stream::Target, ledger: &'a dyn Ledger, shared: &'a Shared<'a>) -> Self {
        let timeout = Duration::from_millis(shared.wcfg.block_ms + BLOCK_TIMEOUT_SLACK_MS);
        Reader {
            shared,
            ledger,
            conn: Conn::with_timeout(client.clone(), timeout),
            group_ready: false,
            own: Own::History("0-0".into()),
            claim_cursor: "0-0".into(),
            claim_due: Instant::now(),
            episode: Episode::new(WHAT),
            quarantine: Quarantine::default(),
            size: ReadSize::new(
                shared.wcfg.read_bytes_max,
                shared.wcfg.batch_count_max,
                shared.wcfg.payload_bytes_max,
            ),
            failovers_repaired: 0,
        }
    }

    /// Once the Redis primary has changed since the last repair, runs the worker's
    /// [`super::AfterFailover`] repair. A transient failure is logged and leaves the repair
    /// due, so the next turn tries again; a permanent one is returned (the worker stops).
    fn after_failover(&mut self, client: &stream::Target) -> Result<()> {
        let changes = client.primary_changes();
        if changes == self.failovers_repaired {
            return Ok(());
        }
        match (self.shared.after_failover)(&mut self.conn) {
            Ok(()) => {
                self.failovers_repaired = changes;
                Ok(())
            }
            Err(e) if e.is_transient() => {
                warn!("repair after the redis failover postponed: {e}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Makes sure the group exists, then reads once. `Ok(None)` means the stream had nothing
    /// new for us; `Ok(Some(empty))` that there is more to do at once.
    fn step(&mut self) -> Result<Option<Handoff>> {
        if self.group_ready {
            return self.read();
        }
        let cfg = self.shared.cfg;
        if stream::ensure_group(&mut self.conn, &cfg.stream, &cfg.group)? {
            info!(
                "created consumer group {} on {} at id 0",
                cfg.group, cfg.stream
            );
        }
        self.group_ready = true;
        Ok(Some(handoff(Vec::new(), false)))
    }

    /// One read: an entry past the cap on its own, else a due XAUTOCLAIM scan, else our own
    /// pending history, else new entries. Entries past the cap are held back from the batch.
    fn read(&mut self) -> Result<Option<Handoff>> {
        if let Some(next) = self.quarantine.next(&mut self.conn, self.shared)? {
            return Ok(Some(next));
        }
        if Instant::now() >= self.claim_due && !self.holding_claimable() {
            if let Some(entries) = self.take_over_stale()? {
                self.size.saw(&entries);
                return Ok(Some(self.quarantine.hold(entries, self.shared)));
            }
        }
        let entries = match self.own.clone() {
            Own::History(cursor) => Some(self.reread_own(&cursor)?),
            Own::Recover(after) => Some(self.pick_up_own(after)?),
            Own::Done => self.read_new()?,
        };
        if let Some(entries) = &entries {
            self.size.saw(entries);
        }
        Ok(entries.map(|e| self.quarantine.hold(e, self.shared)))
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

    /// One XAUTOCLAIM step over the group's pending list; `None` when it took nothing.
    fn take_over_stale(&mut self) -> Result<Option<Vec<Entry>>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let got = stream::autoclaim(
            &mut self.conn,
            &cfg.stream,
            &cfg.group,
            &wcfg.consumer,
            wcfg.claim_idle_ms,
            &self.claim_cursor,
            self.size.count(),
        )?;
        let why = "was deleted from the stream while pending";
        forget_vanished(&mut self.conn, self.ledger, shared, &got.deleted, why)?;
        self.claim_cursor = got.next_cursor;
        if self.claim_cursor == "0-0" {
            self.claim_due = Instant::now() + claim_interval(wcfg.claim_idle_ms);
        }
        let mut entries = shared.in_flight.not_in(got.entries);
        if entries.is_empty() {
            return Ok(None);
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
    fn reread_own(&mut self, cursor: &str) -> Result<Vec<Entry>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let (stream_key, group, consumer) = (&cfg.stream, &cfg.group, &wcfg.consumer);
        let page = self.size.count();
        let read = stream::read_group(
            &mut self.conn,
            stream_key,
            group,
            consumer,
            cursor,
            page,
            None,
        )?;
        let why = "is pending but no longer in the stream";
        forget_vanished(&mut self.conn, self.ledger, shared, &read.vanished, why)?;
        self.own = read.last_id.map_or(Own::Done, Own::History);
        let mut entries = shared.in_flight.not_in(read.entries);
        stream::fill_delivery_counts(&mut self.conn, stream_key, group, consumer, &mut entries)?;
        Ok(shared.in_flight.track(entries))
    }

    /// One page of this consumer's pending entries after `after` that are not in our pipeline,
    /// without counting a delivery: ids and counts from XPENDING, bodies from XRANGE.
    fn pick_up_own(&mut self, after: Option<String>) -> Result<Vec<Entry>> {
        let (cfg, wcfg, shared) = (self.shared.cfg, self.shared.wcfg, self.shared);
        let page = self.size.count();
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
        let read = stream::entries_by_id(&mut self.conn, &cfg.stream, &lost)?;
        let why = "is pending but no longer in the stream";
        forget_vanished(&mut self.conn, self.ledger, shared, &read.vanished, why)?;
        self.own = next;
        if !read.entries.is_empty() {
            info!(
                "picked up {} entries of ours that were pending but not in hand",
                read.entries.len()
            );
        }
        Ok(shared.in_flight.track(read.entries))
    }

    /// New entries, blocking up to `block_ms` (at most [`EXIT_WHEN_IDLE_BLOCK_MS`] under
    /// `exit_when_idle`, so the idle check follows the last acknowledgement closely); `None`
    /// when none came.
    fn read_new(&mut self) -> Result<Option<Vec<Entry>>> {
        let (cfg, wcfg) = (self.shared.cfg, self.shared.wcfg);
        let block_ms = if wcfg.exit_when_idle {
            wcfg.block_ms.min(EXIT_WHEN_IDLE_BLOCK_MS)
        } else {
            wcfg.block_ms
        };
        let read = stream::read_group(
            &mut self.conn,
            &cfg.stream,
            &cfg.group,
            &wcfg.consumer,
            ">",
            self.size.count(),
            Some(block_ms),
        )?;
        if read.entries.is_empty() {
            return Ok(None);
        }
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
                std::thread::sleep(self.episode.failed(&e));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// After NOGROUP: the group went with a Redis restart; recreate it and start over.
    fn recreate_group(&mut self) {
        warn!(
            "consumer group {} is gone (Redis restarted without its data?); recreating it",
            self.shared.cfg.group
        );
        self.group_ready = false;
        self.own = Own::History("0-0".into());
        // Entries held back past the cap went with the group.
        self.quarantine.forget(self.shared);
        self.claim_cursor = "0-0".into();
    }

    /// After a transient read error: note it, and wait before the next read.
    fn wait_out(&mut self, e: &Error) {
        self.recover_own();
        std::thread::sleep(self.episode.failed(e));
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
    /// `None`), bodies by XRANGE, skipping what is in our pipeline. Neither command counts a
    /// delivery, so blips cannot push healthy entries toward the cap.
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
