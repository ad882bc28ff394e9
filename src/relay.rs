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
//! # When the stream stands below the ledger
//!
//! The ledger knows what it marked published ([`Outbox::published_id_max`]). When the events
//! stream's position is below that, events the ledger says were published are not on the
//! stream, and Redis tells why ([`mark::history`]):
//!
//! - **its newest events were lost with Redis's own history of them** (a failover to a replica
//!   that was behind, a power loss with `appendfsync everysec`): the stream's last entry is the
//!   last it ever generated. Consumers read from that Redis, so they lost them too: the relay
//!   publishes those ids again, each once, as always.
//! - **the stream and its mark are gone** (evicted, an operator's `DEL`, a failover to a replica
//!   that never had them), **or its newest entries were deleted or trimmed** (Redis generated
//!   ids past its last entry): consumers may well have read those events already, and the
//!   relay cannot tell. It refuses (exit 1), naming the ids and the cause (issue 39: 5,207
//!   events published again after a `DEL`), unless told with `--republish-from ID` where to go
//!   on from: `ID` the first of the missing ids to publish them again, or the one after the
//!   last to leave them out. The choice is written as the mark (never lowered), so the next
//!   round, and every relay after it, goes on from there.
//!
//! Either way one WARN names the ids and the cause, and one INFO says when the stream is level
//! with the ledger again. The check runs on the relay's first round and whenever the position
//! goes below what this relay has seen.
//!
//! Invariant: this module reads and writes the ledger only through [`Outbox`] (its callers
//! name the ledger for its log line); it XADDs only rows above the position the stream
//! itself shows, and marks rows published only at or below it.

use crate::broker::mark;
use crate::broker::stream::{self, Conn};
use crate::domain::clock::now_rfc3339;
use crate::error::{Error, Result};
use crate::ledger::{Outbox, OutboxRow};
use crate::retry;
use crate::support::failpoint;
use crate::support::threads::spawn_named;
use crate::support::Shutdown;
use log::{info, warn};
use std::time::Duration;

/// Default number of outbox rows published per script call (and per marking transaction).
pub const BATCH_COUNT_MAX_DEFAULT: usize = 500;
/// How often an idle relay looks for new outbox rows. The wait between looks is on the
/// shutdown signal, so a stop ends it at once.
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
    /// `--republish-from`: where to go on from when the events stream stands below what the
    /// ledger published for a cause that makes the relay refuse (see the module doc). Used by
    /// the first round that finds such a gap, and then forgotten.
    pub republish_from: Option<i64>,
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

/// When the relay stops.
pub struct Stop<'a> {
    /// SIGINT/SIGTERM, or a failure beside it: stop at once (a transient failure under way
    /// is given up on). It also ends the idle wait between looks for new rows.
    pub shutdown: &'a Shutdown,
    /// `--exit-when-idle`, or the worker beside it has returned: stop once a read finds no
    /// unpublished row. Not a shutdown (the rows there are still published first); it is
    /// looked at before each round and acted on after it, so an idle relay sees it within two
    /// [`POLL_MS`] and never stops on a read older than the worker's last commit.
    pub when_idle: &'a Shutdown,
}

/// Publishes the outbox of `ledger` (named `shown` in the log) until `stop` says so.
/// Transient failures (Redis down, the ledger busy or unreachable) are waited out with backoff;
/// only a permanent one (a wrong key type, a mark from another ledger) ends it with an error.
pub fn run(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    shown: &str,
    stop: &Stop<'_>,
) -> Result<Totals> {
    let shutdown = stop.shutdown;
    let mut conn = Conn::new(stream::client(&rcfg.redis_url)?);
    // Waited out like every later step: a PostgreSQL restart between the open and this first
    // read cut the connection and once ended the relay with exit 1.
    let Some(ledger_id) = retry::until_stopped("relay", shutdown, || ledger.ledger_id())? else {
        info!("relay stopped before it read the ledger's id");
        return Ok(Totals::default());
    };
    let script = redis::Script::new(&format!("{}{PUBLISH_LUA}", mark::POSITION_LUA));
    info!(
        "relay publishing outbox of {shown} to {}",
        rcfg.events_stream
    );
    let mut totals = Totals::default();
    let mut seen = Seen {
        republish_from: rcfg.republish_from,
        ..Seen::default()
    };
    while !shutdown.is_set() {
        // Read before the round: a worker done by then committed everything before this
        // round's read, so an empty round means nothing is left. Read after, a worker that
        // committed and finished while the round read nothing would strand its last rows
        // unpublished until the next relay.
        let worker_was_done = stop.when_idle.is_set();
        let attempt = || step(rcfg, ledger, &mut conn, &script, &ledger_id, &mut seen);
        let Some(round) = retry::until_stopped("relay", shutdown, attempt)? else {
            break;
        };
        totals.published += round.published;
        totals.marked += round.marked;
        if round.read == 0 {
            failpoint::hit("relay_idle");
            if worker_was_done {
                break;
            }
            shutdown.wait_timeout(Duration::from_millis(POLL_MS));
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
    /// True once a round has compared the stream's position with the ledger's.
    checked: bool,
    /// While ids the stream lost are published again: the last of them (the WARN that
    /// started it is not repeated, and an INFO ends it).
    refilling: Option<i64>,
    /// `--republish-from`, until a round uses it.
    republish_from: Option<i64>,
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
    let position = match position {
        Position::Ours(position) => {
            if !seen.checked || position < seen.reached || seen.refilling.is_some() {
                check_behind(rcfg, ledger, conn, ledger_id, position, seen)?
            } else {
                position
            }
        }
        // The publish script refuses another ledger's mark (LEDGERMISMATCH) before writing.
        Position::Foreign => 0,
    };
    seen.checked = true;
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
        if rows.is_empty() && rcfg.redis_wait.replicas > 0 {
            // Not sent by this round, so no WAIT of this round covers them: this relay's own
            // last round, whose WAIT failed, or another's. Marked unconfirmed, they were lost
            // with their mark by a failover to a replica that never had them, and the relay
            // then refused to go on where it would have published them again (the Sentinel TLS
            // test, 1 run in 39 under load). The script run with no rows writes the mark as it
            // stands (after them in the replication stream), and WAIT covers that write.
            publish(conn, script, rcfg, ledger_id, &[])?;
            conn.wait_replicated(rcfg.redis_wait)?;
        }
        round.marked = ledger.mark_published(reached, &now_rfc3339(), &rcfg.events_stream)?;
        seen.marked_upto = reached;
    }
    Ok(round)
}

/// Where the events stream stands, as [`position`] reads it.
enum Position {
    /// The position for this ledger (0 before anything was published).
    Ours(i64),
    /// The mark belongs to another ledger.
    Foreign,
}

/// Where the events stream stands for this ledger ([`mark::read`]). Refuses to go on when that
/// position covers ids this ledger has never assigned (see "A ledger put back behind the
/// events stream" above): a permanent error, so the relay stops and says why instead of
/// marking unpublished rows published.
fn position(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    conn: &mut Conn,
    ledger_id: &str,
) -> Result<Position> {
    // The position first, then the ledger: see the ordering argument above.
    let Some(mark) = mark::read(conn, &rcfg.events_stream)? else {
        return Ok(Position::Ours(0));
    };
    if mark.ledger_id != ledger_id {
        return Ok(Position::Foreign);
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
    Ok(Position::Ours(mark.upto))
}

/// Compares the stream's `position` with what the ledger marked published (see "When the
/// stream stands below the ledger" above) and returns the position to publish from: as it is,
/// or raised by `--republish-from`. Refuses, with the ids and the cause, a gap Redis says was
/// deleted, trimmed, or lost with the stream and its mark, unless told where to go on from.
fn check_behind(
    rcfg: &RelayConfig,
    ledger: &dyn Outbox,
    conn: &mut Conn,
    ledger_id: &str,
    position: i64,
    seen: &mut Seen,
) -> Result<i64> {
    let published = ledger
        .published_id_max(&rcfg.events_stream)?
        .max(seen.reached);
    let told = seen.republish_from.take();
    if position >= published {
        if let Some(upto) = seen.refilling.take() {
            info!(
                "{} is level with the ledger again: ids up to {upto} are on it",
                rcfg.events_stream
            );
        }
        if let Some(from) = told {
            info!(
                "--republish-from {from} left unused: {} is not behind the ledger",
                rcfg.events_stream
            );
        }
        return Ok(position);
    }
    if seen.refilling.is_some_and(|upto| upto >= published) {
        return Ok(position);
    }
    let history = mark::history(conn, &rcfg.events_stream)?;
    let refused = refusal_cause(position, history.as_ref());
    let events = &rcfg.events_stream;
    let seen_at = match seen.reached > position {
        true => format!(", after this relay saw it at {}", seen.reached),
        false => String::new(),
    };
    let cause = refused.as_deref().unwrap_or(
        "its newest events were lost with Redis's own record of them (a failover to a replica \
         that was behind, or a power loss), so its consumers lost them too",
    );
    warn!(
        "{events} is back at outbox id {position}, below id {published} that the ledger marked \
         published{seen_at}: {cause}; ids {}..={published} are not on it",
        position + 1
    );
    let Some(cause) = refused else {
        info!(
            "publishing ids {}..={published} again, each once",
            position + 1
        );
        seen.refilling = Some(published);
        return Ok(position);
    };
    let Some(from) = told else {
        return Err(Error::Other(format!(
            "{events} stands at outbox id {position}, but the ledger marked ids up to \
             {published} published: {cause}. Its consumers may already have events {}..=\
             {published}, so the relay will not publish them again by itself: run it once with \
             --republish-from {} to publish them again, or --republish-from {} to leave them \
             out and go on with the rows never published",
            position + 1,
            position + 1,
            published + 1
        )));
    };
    republish_from(rcfg, conn, ledger_id, position, published, from, seen)
}

/// Why a stream standing below the ledger is refused, from what Redis says of its history
/// (`None`: its newest events were lost with that history, and are published again).
fn refusal_cause(position: i64, history: Option<&mark::History>) -> Option<String> {
    let Some(h) = history else {
        return Some(match position {
            0 => "the events stream and its mark are both gone (deleted, evicted, or a failover \
                  to a replica that never had them)"
                .to_owned(),
            _ => "the events stream is gone, though its mark is there".to_owned(),
        });
    };
    if !h.end_removed() {
        return None;
    }
    let added = h
        .entries_added
        .map(|n| format!(", {n} entries added in all"))
        .unwrap_or_default();
    Some(match &h.last_entry {
        None => format!(
            "the events stream is empty, but Redis generated ids up to {}{added}: its entries \
             were trimmed or deleted",
            h.last_generated
        ),
        Some(last) => format!(
            "entries after its last one, {last}, were deleted or trimmed (Redis generated ids \
             up to {}, and deleted up to {}{added})",
            h.last_generated, h.max_deleted
        ),
    })
}

/// Applies `--republish-from FROM` to a refused gap `position + 1 ..= published`: ids below
/// FROM are left out (the mark is raised to FROM - 1), the rest published again. FROM past
/// `published + 1` would skip rows never published: refused (exit 2).
fn republish_from(
    rcfg: &RelayConfig,
    conn: &mut Conn,
    ledger_id: &str,
    position: i64,
    published: i64,
    from: i64,
    seen: &mut Seen,
) -> Result<i64> {
    if from > published + 1 {
        return Err(Error::Config(format!(
            "--republish-from {from} would skip outbox ids {}..={} that were never published: \
             give at most {}",
            published + 1,
            from - 1,
            published + 1
        )));
    }
    let left_out = (position + 1, from - 1);
    let position = if from - 1 > position {
        mark::raise(conn, &rcfg.events_stream, ledger_id, from - 1)?
    } else {
        position
    };
    let left_out = match left_out.0 <= left_out.1 {
        true => format!("ids {}..={} left out, as told", left_out.0, left_out.1),
        false => "none left out".to_owned(),
    };
    if position < published {
        info!(
            "--republish-from {from}: publishing ids {}..={published} again, each once; \
             {left_out}",
            position + 1
        );
        seen.refilling = Some(published);
    } else {
        info!("--republish-from {from}: {left_out}; going on with the rows never published");
    }
    Ok(position)
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

/// Runs `work` (the worker) with a relay thread beside it, publishing the outbox of `ledger`
/// (named `shown`), when `rcfg` is given. When `work` returns, the relay drains what is left and stops (or stops at once if shutdown was asked
/// for). A relay that fails permanently is reported to `on_failure` at once (so `/healthz`
/// turns unhealthy while the worker winds down), asks the worker to shut down, and its error
/// is returned.
pub fn alongside<T>(
    rcfg: Option<&RelayConfig>,
    ledger: &dyn Outbox,
    shown: &str,
    shutdown: &Shutdown,
    on_failure: &(dyn Fn(&Error) + Sync),
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(rcfg) = rcfg else { return work() };
    let worker_done = Shutdown::new();
    let stop = Stop {
        shutdown,
        when_idle: &worker_done,
    };
    std::thread::scope(|s| {
        let relay = spawn_named(s, "relay", || {
            let result = run(rcfg, ledger, shown, &stop);
            if let Err(e) = &result {
                on_failure(e);
                log::error!("relay failed: {e}; stopping the worker");
                shutdown.trigger();
            }
            result
        });
        let worked = work();
        if worked.is_err() {
            shutdown.trigger();
        }
        worker_done.trigger();
        let relayed = relay
            .join()
            .unwrap_or_else(|_| Err(Error::Other("relay thread panicked".into())));
        let value = worked?;
        relayed.map(|_| value)
    })
}
