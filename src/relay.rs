//! `claimgate relay`: publishes outbox rows to the events stream, each `event_id` exactly once.
//!
//! # Why a relay killed at any moment never publishes an event twice
//!
//! One Lua script (atomic in Redis, and replicated and persisted as one unit) both XADDs a
//! batch of rows and raises a high-water mark, the hash `<events stream>:published_upto`. The
//! script skips every row whose id is at or below the mark. So the only crash window, between
//! the script and the `UPDATE outbox SET published_at` that follows it (failpoint
//! `relay_after_publish`), republishes nothing: the restarted relay reads the same rows as
//! unpublished, the script skips them all, and the relay marks them. Skipping by id is safe
//! because of the [`Outbox`] contract (point 5 in `ledger/mod.rs`): once a row with id `n` has
//! been read as unpublished, no row with an id below `n` can become visible later, and ids are
//! never reused, so no row can appear later below a mark already set. Every backend keeps that
//! point (SQLite's reason is in `ledger/sqlite/outbox.rs`); the relay relies on nothing else
//! about the ledger. For the same reason several relays may run at once; whichever publishes a
//! row first raises the mark past it.
//!
//! The mark carries the ledger's random `ledger_id`: a relay pointed at a fresh ledger but an
//! old events stream stops with an error instead of mistaking new rows for published ones.
//!
//! # A ledger put back behind the events stream
//!
//! A copy of this very ledger put back by hand (same `ledger_id`, an older state) has assigned
//! fewer outbox ids than the mark covers: its next rows would get ids at or below the mark, and
//! the script would skip them as published — new disbursements marked published that never
//! reached the stream. So before each round the relay reads the mark, then the ledger's highest
//! id ever assigned ([`Outbox::outbox_id_max`]), and stops with an error (exit 1) if the mark
//! for this ledger is above it. The order matters: any mark a relay legitimately set covers
//! ids that were assigned before it was set, so an id maximum read after the mark is at least
//! the mark, however many relays run. `claimgate restore` is the way to put a backup back: it
//! moves the restored ledger's id sequence past the mark and marks the restored rows at or
//! below it published (they are on the stream), so this check passes and nothing is skipped.
//!
//! Invariant: this module reads and writes the ledger only through [`Outbox`] (plus
//! `Inspect::describe` for its log line), and marks rows published only for ids the Redis mark
//! already covers.

use crate::broker::stream::{self, Conn};
use crate::domain::clock::now_rfc3339;
use crate::error::{Error, Result};
use crate::ledger::{Backend, Outbox, OutboxRow};
use crate::retry;
use crate::support::failpoint;
use log::info;
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

/// The script: skip ids at or below the mark, XADD the rest in order, raise the mark.
/// KEYS[1] events stream, KEYS[2] mark hash; ARGV[1] ledger id, then (id, type, payload) triples.
const PUBLISH_LUA: &str = r"
local owner = redis.call('HGET', KEYS[2], 'ledger_id')
if owner and owner ~= ARGV[1] then
  return redis.error_reply('LEDGERMISMATCH ' .. KEYS[2] .. ' belongs to ledger ' .. owner)
end
local upto = tonumber(redis.call('HGET', KEYS[2], 'upto') or '0')
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
    let script = redis::Script::new(PUBLISH_LUA);
    info!(
        "relay publishing outbox of {} to {}",
        ledger.describe(),
        rcfg.events_stream
    );
    let mut totals = Totals::default();
    // The highest id this relay has marked published; the Redis mark never goes below it.
    let mut last_marked = 0i64;
    while !shutdown.load(Ordering::SeqCst) {
        let attempt = || step(rcfg, ledger, &mut conn, &script, &ledger_id, last_marked);
        let round = match retry::with_backoff("relay", shutdown, 0, attempt) {
            Ok(round) => round,
            // The retry gives up on a transient failure only once shutdown is asked for.
            Err(e) if e.is_transient() => break,
            Err(e) => return Err(e),
        };
        last_marked = last_marked.max(round.marked_upto);
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

/// What one round did.
struct Round {
    /// Unpublished rows read from the ledger.
    read: usize,
    /// Rows the script added to the stream.
    published: u64,
    /// Rows marked published in the ledger.
    marked: u64,
    /// The id up to which this round marked rows published; 0 when it read none.
    marked_upto: i64,
}

/// One round: read a batch, publish it atomically with the mark, then mark it in the ledger.
/// `last_marked` is the highest id this relay has marked published so far.
fn step(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    conn: &mut Conn,
    script: &redis::Script,
    ledger_id: &str,
    last_marked: i64,
) -> Result<Round> {
    behind_the_stream(rcfg, ledger, conn, ledger_id)?;
    let rows = ledger.unpublished(rcfg.batch_count_max)?;
    let Some(last) = rows.last() else {
        return Ok(Round {
            read: 0,
            published: 0,
            marked: 0,
            marked_upto: 0,
        });
    };
    let last_id = last.id;
    let (upto, published) = publish(conn, script, rcfg, ledger_id, &rows)?;
    // Two checks on the mark, of two kinds. `publish` returns `Error::Invariant` when the mark
    // is below this batch: the mark is Redis state that others can change (an operator's HSET
    // or DEL, another tool), so that is an operating error, reported, and nothing is marked.
    // Past that check the mark is at least `rows[0].id`, and `unpublished` never returns a row
    // at or below one this relay has marked published (ledger contract, point 5). A mark below
    // `last_marked` therefore means our own code broke that promise: a programmer error, which
    // must stop the process before it marks anything on the strength of it.
    assert!(
        upto >= last_marked,
        "{} reads {upto}, below {last_marked}, which this relay already marked published",
        rcfg.mark_key()
    );
    // Marked published only once a replica has the events too: a failover would otherwise
    // lose events the ledger says were sent. The retry republishes nothing (the mark skips).
    conn.wait_replicated(rcfg.redis_wait)?;
    failpoint::hit("relay_after_publish");
    // Rows above our batch may be covered by another relay's mark; we mark only what we read.
    let marked_upto = upto.min(last_id);
    let marked = ledger.mark_published(marked_upto, &now_rfc3339())?;
    Ok(Round {
        read: rows.len(),
        published,
        marked,
        marked_upto,
    })
}

/// Refuses to go on when the events stream's mark for this ledger covers ids this ledger has
/// never assigned (see "A ledger put back behind the events stream" above): a permanent error,
/// so the relay stops and says why instead of marking unpublished rows published.
fn behind_the_stream(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    conn: &mut Conn,
    ledger_id: &str,
) -> Result<()> {
    // The mark first, then the ledger: see the ordering argument above.
    let Some(mark) = crate::broker::mark::read(conn, &rcfg.events_stream)? else {
        return Ok(());
    };
    if mark.ledger_id != ledger_id {
        // Another ledger's mark: the script refuses it (LEDGERMISMATCH).
        return Ok(());
    }
    let id_max = ledger.outbox_id_max()?;
    if mark.upto > id_max {
        return Err(Error::Other(format!(
            "{} says outbox ids up to {} of ledger {ledger_id} were published, but this ledger \
             has only ever assigned ids up to {id_max}: it is an older copy of that ledger, put \
             back without `claimgate restore`. Publishing from it would skip its new rows as \
             already published, so the relay stops. Put the copy back with \
             `claimgate restore BACKUP` (it keeps the events stream and the ledger in step)",
            rcfg.mark_key(),
            mark.upto
        )));
    }
    Ok(())
}

/// Runs the publish script; returns the new mark and how many rows it added.
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
    let (upto, published): (i64, u64) = conn.invoke(&inv)?;
    if upto < rows[0].id {
        // The mark can only be at or past what we just sent; anything else means the hash was
        // changed under us, and marking rows published on its word would lose them.
        return Err(Error::Invariant(format!(
            "{} reads {upto} after publishing ids {}..={}",
            rcfg.mark_key(),
            rows[0].id,
            rows[rows.len() - 1].id
        )));
    }
    Ok((upto, published))
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
        let relay = s.spawn(|| {
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
