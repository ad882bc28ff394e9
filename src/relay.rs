//! `claimgate relay`: publishes outbox rows to the events stream, each `event_id` exactly once.
//!
//! # Where the relay stands: the events stream itself
//!
//! The relay keeps no position of its own. Each round it reads where the events stream stands
//! for its ledger ([`mark::read`]: the higher of the mark `<events stream>:published_upto` and
//! the `event_id` of the stream's last entry, both written by the one script below), then reads
//! the ledger's outbox rows *above* that id, published or not. The ledger's `published_at` is
//! bookkeeping (the backlog `status` shows, what retention may purge), never the cursor. So
//! when Redis loses writes it acknowledged — a Sentinel promotion of a replica that was behind
//! takes the events stream and its mark back together — the next round finds the stream
//! behind the ledger and publishes again exactly the rows the stream lost, each once, although
//! the ledger had marked them published.
//!
//! # Why a relay killed at any moment never publishes an event twice
//!
//! One Lua script (atomic in Redis, and replicated and persisted as one unit) both XADDs a
//! batch of rows and raises the mark. It works out the position afresh from the mark and the
//! stream's last entry and skips every row at or below it. So the only crash window, between
//! the script and the `UPDATE outbox SET published_at` that follows it (failpoint
//! `relay_after_publish`), republishes nothing: the restarted relay finds the stream past those
//! rows and only marks them. Skipping by id is safe because of the [`Outbox`] contract (point 5
//! in `ledger/mod.rs`): once a row with id `n` has been read, no row with an id below `n` can
//! become visible later, and ids are never reused, so no row can appear later below a position
//! already reached. Every backend keeps that point (SQLite's reason is in
//! `ledger/sqlite/outbox.rs`); the relay relies on nothing else about the ledger. For the same
//! reason several relays may run at once; whichever publishes a row first moves the position
//! past it, and the others' scripts skip it.
//!
//! The mark carries the ledger's random `ledger_id`: a relay pointed at a fresh ledger but an
//! old events stream stops with an error instead of mistaking new rows for published ones.
//!
//! # A ledger put back behind the events stream
//!
//! A copy of this very ledger put back by hand (same `ledger_id`, an older state) has assigned
//! fewer outbox ids than the stream covers: its next rows would get ids at or below the
//! position, and the script would skip them as published — new disbursements marked published
//! that never reached the stream. So before each round the relay reads the position, then the
//! ledger's highest id ever assigned ([`Outbox::outbox_id_max`]), and stops with an error
//! (exit 1) if the position is above it (an event id forged onto the stream is refused the same
//! way). The order matters: any position a relay legitimately reached covers ids that were
//! assigned before it was reached, so an id maximum read after the position is at least the
//! position, however many relays run. `claimgate restore` is the way to put a backup back: it
//! moves the restored ledger's id sequence past the position and marks the restored rows at or
//! below it published (they are on the stream), so this check passes and nothing is skipped.
//!
//! Invariant: this module reads and writes the ledger only through [`Outbox`] (plus
//! `Inspect::describe` for its log line); it XADDs only rows above the position the stream
//! itself shows, and marks rows published only at or below it.

use crate::broker::mark;
use crate::broker::stream::{self, Conn};
use crate::domain::clock::now_rfc3339;
use crate::error::{Error, Result};
use crate::ledger::{Backend, Outbox, OutboxRow};
use crate::retry;
use crate::support::failpoint;
use crate::support::threads::spawn_named;
use log::{info, warn};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Default number of outbox rows published per script call (and per marking transaction).
pub const BATCH_COUNT_MAX_DEFAULT: usize = 500;
/// How often an idle relay looks for new outbox rows.
pub const POLL_MS: u64 = 100;

/// Everything the relay can be told.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Redis URL (never logged whole).
    pub redis_url: String,
    /// The events stream, `grants:events` by default.
    pub events_stream: String,
    /// Rows per publish round.
    pub batch_count_max: usize,
    /// Replicas that must have a batch before its rows are marked published.
    pub redis_wait: crate::config::RedisWait,
}

impl RelayConfig {
    /// The Redis hash holding the high-water mark and the ledger it belongs to.
    pub fn mark_key(&self) -> String {
        crate::broker::mark::key(&self.events_stream)
    }
}

/// What one relay run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Rows this process added to the events stream.
    pub published: u64,
    /// Rows this process marked published (includes rows another relay, or this relay before a
    /// crash, had already added).
    pub marked: u64,
}

/// The script: work out the position (`mark::POSITION_LUA`), refuse another ledger's mark,
/// XADD the rows above the position in order, raise the mark. KEYS[1] events stream, KEYS[2]
/// mark hash; ARGV[1] ledger id, then (id, type, payload) triples in id order.
const PUBLISH_LUA: &str = r"
local owner, upto = position(KEYS[1], KEYS[2])
if owner and owner ~= ARGV[1] then
  return redis.error_reply('LEDGERMISMATCH ' .. KEYS[2] .. ' belongs to ledger ' .. owner)
end
local published = 0
for i = 2, #ARGV, 3 do
  local id = tonumber(ARGV[i])
  if id > upto then
    redis.call('XADD', KEYS[1], '*', 'event_id', ARGV[i], 'event_type', ARGV[i + 1], 'payload', ARGV[i + 2])
    upto = id
    published = published + 1
  end
end
redis.call('HSET', KEYS[2], 'ledger_id', ARGV[1], 'upto', string.format('%d', upto))
return {upto, published}
";

/// Publishes until `shutdown` is set, or, once `exit_when_idle` is set, until a read finds no
/// unpublished row. Transient failures (Redis down, the ledger busy or unreachable) are waited out with backoff;
/// only a permanent one (a wrong key type, a mark from another ledger) ends it with an error.
pub fn run(
    rcfg: &RelayConfig,
    ledger: &dyn Backend,
    shutdown: &AtomicBool,
    exit_when_idle: &AtomicBool,
) -> Result<Totals> {
    let mut conn = Conn::new(stream::client(&rcfg.redis_url)?);
    let ledger_id = ledger.ledger_id()?;
    let script = redis::Script::new(&format!("{}{PUBLISH_LUA}", mark::POSITION_LUA));
    info!(
        "relay publishing outbox of {} to {}",
        ledger.describe(),
        rcfg.events_stream
    );
    let mut totals = Totals::default();
    let mut seen = Seen::default();
    while !shutdown.load(Ordering::SeqCst) {
        let attempt = || step(rcfg, ledger, &mut conn, &script, &ledger_id, &mut seen);
        let round = match retry::with_backoff("relay", shutdown, 0, attempt) {
            Ok(round) => round,
            // The retry gives up on a transient failure only once shutdown is asked for.
            Err(e) if e.is_transient() => break,
            Err(e) => return Err(e),
        };
        totals.published += round.published;
        totals.marked += round.marked;
        if round.read == 0 {
            if exit_when_idle.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }
    info!(
        "relay stopped: {} events published, {} rows marked",
        totals.published, totals.marked
    );
    Ok(totals)
}

/// What this relay has seen so far, across rounds.
#[derive(Debug, Default)]
struct Seen {
    /// The highest position of the events stream this relay has read or reached; a lower one
    /// later means Redis lost events (a failover), which is logged.
    reached: i64,
    /// The highest id up to which this relay has marked rows published in the ledger, so an
    /// idle round does not mark again what it marked before.
    marked_upto: i64,
}

/// What one round did.
struct Round {
    /// Outbox rows read above the stream's position.
    read: usize,
    /// Rows the script added to the stream.
    published: u64,
    /// Rows marked published in the ledger.
    marked: u64,
}

/// One round: read where the stream stands, read the rows above it, publish them atomically
/// with the mark, then mark everything at or below the new position in the ledger.
fn step(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    conn: &mut Conn,
    script: &redis::Script,
    ledger_id: &str,
    seen: &mut Seen,
) -> Result<Round> {
    let position = position(rcfg, ledger, conn, ledger_id)?;
    if position < seen.reached {
        warn!(
            "{} is back at outbox id {position} after this relay saw it at {}: Redis lost events \
             it had acknowledged (a failover to a replica that was behind?); publishing ids \
             {}..={} again",
            rcfg.events_stream,
            seen.reached,
            position + 1,
            seen.reached
        );
    }
    seen.reached = position;
    let rows = ledger.rows_after(position, rcfg.batch_count_max)?;
    let (mut round, reached) = match rows.last() {
        None => (
            Round {
                read: 0,
                published: 0,
                marked: 0,
            },
            position,
        ),
        Some(last) => {
            let (upto, published) = publish(conn, script, rcfg, ledger_id, &rows)?;
            // The script moved the position past every row it was given (it skips only rows at
            // or below it), so anything else is a broken script, not an operating error.
            assert!(
                upto >= last.id,
                "{} reads {upto} after publishing ids up to {}",
                rcfg.mark_key(),
                last.id
            );
            // Marked published only once a replica has the events too, so a failover seldom
            // makes the next round publish them again. The retry republishes nothing.
            conn.wait_replicated(rcfg.redis_wait)?;
            failpoint::hit("relay_after_publish");
            seen.reached = seen.reached.max(upto);
            let round = Round {
                read: rows.len(),
                published,
                marked: 0,
            };
            (round, upto)
        }
    };
    // Everything at or below the position is on the stream (`position` checked it is an id
    // this ledger assigned): rows this relay just sent, and rows another relay (or this one,
    // before a crash) sent but did not get to mark.
    if reached > seen.marked_upto {
        round.marked = ledger.mark_published(reached, &now_rfc3339())?;
        seen.marked_upto = reached;
    }
    Ok(round)
}

/// Where the events stream stands for this ledger ([`mark::read`]): 0 before anything was
/// published. Refuses to go on when that position covers ids this ledger has never assigned
/// (see "A ledger put back behind the events stream" above): a permanent error, so the relay
/// stops and says why instead of marking unpublished rows published.
fn position(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    conn: &mut Conn,
    ledger_id: &str,
) -> Result<i64> {
    // The position first, then the ledger: see the ordering argument above.
    let Some(mark) = mark::read(conn, &rcfg.events_stream)? else {
        return Ok(0);
    };
    if mark.ledger_id != ledger_id {
        // Another ledger's mark: the script refuses it (LEDGERMISMATCH) before writing anything.
        return Ok(0);
    }
    let id_max = ledger.outbox_id_max()?;
    if mark.upto > id_max {
        return Err(Error::Other(format!(
            "{} says outbox ids up to {} of ledger {ledger_id} were published, but this ledger \
             has only ever assigned ids up to {id_max}: it is an older copy of that ledger, put \
             back without `claimgate restore` (or the stream holds an event this ledger never \
             made). Publishing from it would skip its new rows as already published, so the \
             relay stops. Put a copy back with `claimgate restore BACKUP` (it keeps the events \
             stream and the ledger in step)",
            rcfg.events_stream, mark.upto
        )));
    }
    Ok(mark.upto)
}

/// Runs the publish script; returns the new position and how many rows it added.
fn publish(
    conn: &mut Conn,
    script: &redis::Script,
    rcfg: &RelayConfig,
    ledger_id: &str,
    rows: &[OutboxRow],
) -> Result<(i64, u64)> {
    let mut inv = script.prepare_invoke();
    inv.key(&rcfg.events_stream)
        .key(rcfg.mark_key())
        .arg(ledger_id);
    for row in rows {
        inv.arg(row.id).arg(&row.event_type).arg(&row.payload);
    }
    conn.invoke(&inv)
}

/// Runs `work` (the worker) with a relay thread beside it when `rcfg` is given. When `work`
/// returns, the relay drains what is left and stops (or stops at once if shutdown was asked
/// for). A relay that fails permanently is reported to `on_failure` at once (so `/healthz`
/// turns unhealthy while the worker winds down), asks the worker to shut down, and its error
/// is returned.
pub fn alongside<T>(
    rcfg: Option<&RelayConfig>,
    ledger: &dyn Backend,
    shutdown: &AtomicBool,
    on_failure: &(dyn Fn(&Error) + Sync),
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(rcfg) = rcfg else { return work() };
    let drain = AtomicBool::new(false);
    std::thread::scope(|s| {
        let relay = spawn_named(s, "relay", || {
            let result = run(rcfg, ledger, shutdown, &drain);
            if let Err(e) = &result {
                on_failure(e);
                log::error!("relay failed: {e}; stopping the worker");
                shutdown.store(true, Ordering::SeqCst);
            }
            result
        });
        let worked = work();
        if worked.is_err() {
            shutdown.store(true, Ordering::SeqCst);
        }
        drain.store(true, Ordering::SeqCst);
        let relayed = relay
            .join()
            .unwrap_or_else(|_| Err(Error::Other("relay thread panicked".into())));
        let value = worked?;
        relayed.map(|_| value)
    })
}
