//! [`PgLedger`]: a pool of connections to one PostgreSQL ledger, opened (the schema its URL pins
//! found, made or upgraded), recording batches and counting what it holds.

use super::connect::{Conn, Manager, Target};
use super::{batch, connect, error, link, schema};
use crate::config::{LedgerConfig, OnConflict, PgUrl};
use crate::domain::clock::age_seconds;
use crate::error::{Error, Result};
use crate::ledger::{Backup, BackupCopied, Counts, Item, Ledger, Outcome, Stats};
use crate::support::Shutdown;
use r2d2::{Pool, PooledConnection};
use std::sync::Mutex;
use std::time::Duration;

/// The advisory lock a retention purge holds for as long as it runs: one node at a time.
pub(super) const PURGE_LOCK: (i32, i32) = (0x636c_6169, 2);

/// A pool of connections to one PostgreSQL ledger.
pub struct PgLedger {
    /// Connections.
    pub(super) pool: Pool<Manager>,
    /// Where the pool connects, for a connection made outside it ([`PgLedger::durable_snapshot`]).
    pub(super) target: Target,
    /// The URL with its password removed, for messages.
    pub(super) redacted: String,
    /// What `record` does with a conflicting resubmission.
    pub(super) on_conflict: OnConflict,
    /// The retention purge under way: its connection, holding the purge lock (`retention.rs`).
    pub(super) purge: Mutex<Option<PooledConnection<Manager>>>,
    /// Entries `record` deferred and has not seen again (`batch.rs`, step 1).
    pub(super) deferred: Mutex<std::collections::HashSet<String>>,
}

impl PgLedger {
    /// Connects to the ledger `cfg.backend` names (a `postgres://` URL) and finds it in its
    /// schema, making or upgrading it only if `cfg.create` (`schema.rs`). A wrong password,
    /// unknown user or missing database, a ledger not where the URL says, or one this build
    /// cannot read is [`Error::Config`]; an unreachable or restarting server is a transient
    /// [`Error::Ledger`] naming host and port (see [`PgLedger::open_waiting`]).
    pub fn open(cfg: &LedgerConfig<PgUrl>) -> Result<Self> {
        let target = Target::parse(&cfg.backend)?;
        let redacted = target.redacted.clone();
        // The first connection is made here, not by the pool, so its error can be classified.
        let mut first = target.connect().map_err(|e| {
            error::config_fault(&e, &redacted)
                .unwrap_or_else(|| error::unreachable(e, &target.address()))
        })?;
        schema::prepare(&mut first, &target, cfg.create)?;
        if cfg.create {
            // Batches a writer committed and did not live to link (stopped in between): placed
            // now, so their events reach the relay whether or not another batch ever comes.
            let linked = link::link(&mut Conn::from(first), None)?;
            if linked > 0 {
                log::info!(
                    "linked {linked} committed batch(es) left unlinked into the audit chain"
                );
            }
        } else {
            drop(first);
        }
        let pool = Pool::builder()
            .max_size(cfg.pool_size_max)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(Duration::from_millis(
                cfg.busy_timeout_ms.max(connect::CONNECT_TIMEOUT_MS),
            ))
            .error_handler(Box::new(QuietPool))
            .build_unchecked(Manager(target.clone()));
        Ok(PgLedger {
            pool,
            target,
            redacted,
            on_conflict: cfg.on_conflict,
            purge: Mutex::new(None),
            deferred: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// Opens like [`PgLedger::open`], waiting out an unreachable or restarting server with the
    /// shared retry policy (`crate::retry`), as `run` and `relay` must. `None` if `stop` is set
    /// while waiting.
    pub fn open_waiting(cfg: &LedgerConfig<PgUrl>, stop: &Shutdown) -> Result<Option<Self>> {
        crate::retry::until_stopped("opening the ledger", stop, || Self::open(cfg))
    }

    /// A pooled connection.
    pub(super) fn conn(&self) -> Result<PooledConnection<Manager>> {
        Ok(self.pool.get()?)
    }
}

/// r2d2 logs every failed connection attempt at ERROR by default; the caller's retry policy
/// already reports an outage once, as an episode, so the pool's own lines are DEBUG.
#[derive(Debug)]
struct QuietPool;

impl r2d2::HandleError<error::Unreachable> for QuietPool {
    fn handle_error(&self, error: error::Unreachable) {
        log::debug!("ledger connection pool: {error}");
    }
}

/// Makes durable everything committed so far, on `client`: a no-op when the server has flushed
/// all the WAL it has, else one transaction that writes a WAL record (a logical message,
/// prefix `claimgate`, which nothing consumes) and commits under the server's own
/// `synchronous_commit`, flushing every earlier commit with its own.
///
/// Needed because a link commits without waiting for its WAL flush (`claimgate_link`, so the
/// chain-head lock is never held across a disk write): a link a reader sees may, for a moment,
/// be lost if the server crashes. A batch whose link is lost is only unlinked again (its own
/// commit was durable) and is linked anew, possibly at other seqs and outbox ids. So whatever
/// leaves the database with link-derived facts — outbox ids published as event ids, the
/// chain's head in an anchor, an export — first makes what it read durable with this.
pub(super) fn make_durable(client: &mut postgres::Client) -> Result<()> {
    let flushed: bool = client
        .query_one(
            "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()",
            &[],
        )?
        .get(0);
    if !flushed {
        client.batch_execute(
            "BEGIN; SELECT pg_logical_emit_message(true, 'claimgate', 'durable'); COMMIT",
        )?;
    }
    Ok(())
}

impl PgLedger {
    /// A repeatable-read, read-only snapshot whose every link is durable ([`make_durable`],
    /// run on a second connection after the snapshot was taken, so it covers all the snapshot
    /// shows), for reads whose result leaves the database.
    ///
    /// The second connection is an idle one of the pool, or else one made for this call and
    /// closed after it: never one waited for. A caller already holds a pooled connection, so
    /// waiting for another could, with as many such readers as the pool has connections, leave
    /// each holding one and waiting for the next until the pool timed out.
    pub(super) fn durable_snapshot<'c>(
        &self,
        client: &'c mut postgres::Client,
    ) -> Result<postgres::Transaction<'c>> {
        let mut tx = snapshot(client)?;
        tx.query_one("SELECT 1", &[])?;
        match self.pool.try_get() {
            Some(mut idle) => make_durable(&mut idle.client)?,
            None => make_durable(&mut self.target.connect()?)?,
        }
        Ok(tx)
    }
}

/// A repeatable-read, read-only transaction: one snapshot for everything read in it.
pub(super) fn snapshot(client: &mut postgres::Client) -> Result<postgres::Transaction<'_>> {
    Ok(client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?)
}

impl Ledger for PgLedger {
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>> {
        self.record_in_turn(items, consumer, stream, &mut |_| {})
    }

    /// Two: while one batch reads, writes and commits on its connection, the next takes its
    /// groups and does the same on another, so one worker keeps two server processes busy
    /// (BENCHMARKS.md, "Two batches at once").
    fn writers(&self) -> usize {
        crate::config::PG_WRITERS_PER_WORKER
    }

    fn record_in_turn(
        &self,
        items: &[Item<'_>],
        consumer: &str,
        stream: &str,
        locked: &mut dyn FnMut(bool),
    ) -> Result<Vec<Outcome>> {
        let mut conn = self.conn()?;
        let ctx = batch::Context {
            consumer,
            stream,
            on_conflict: self.on_conflict,
            deferred: &self.deferred,
            approving: false,
        };
        let outcomes = batch::record(&mut conn, &ctx, items, locked)?;
        assert_eq!(outcomes.len(), items.len(), "one outcome per item");
        Ok(outcomes)
    }

    fn stats(&self) -> Result<Stats> {
        stats(&mut *self.conn()?)
    }
}

/// The nine stored counts in [`COUNTED`]'s order, as columns of a select over `chain_head h`
/// and `purge_counts p` (a macro, so statements are built with `concat!`): `stats` and
/// `verify` read the same sums.
macro_rules! stored_counts {
    () => {
        "h.claims + p.claims, h.disbursements + p.disbursements,
         (h.disbursed_cents_total + p.disbursed_cents_total)::text,
         h.dead_letters + p.dead_letters, h.duplicates + p.duplicates,
         h.conflicts + p.conflicts, h.vanished + p.vanished,
         h.audit_records + p.audit_records, h.tombstones + p.tombstones"
    };
}
pub(super) use stored_counts;

/// The ledger's counts as stored (`chain_head` plus what purges changed, `purge_counts`:
/// `schema_postgres.sql`) and the outbox backlog, in one statement, so one snapshot: two row
/// reads however large the ledger, and the backlog's batches. The backlog is the rows above the
/// last publication (`outbox_published`): stored rows (an earlier format's, migrated ones)
/// through the id index, less any marked one by one; linked batches' rows counted from their
/// `audit_batches` rows alone (through `audit_batches_outbox`), and every batch not linked
/// yet. A batch's rows are written with its `created_at`, so the oldest is read from the
/// batches too: a relay stopped for a while costs `status` one row per batch behind, not one
/// per event.
const STATS: &str = concat!(
    "WITH pub AS (SELECT COALESCE(MAX(upto_id), 0) AS upto FROM outbox_published),
     stored AS (SELECT COUNT(*) AS n, MIN(r.created_at) AS oldest FROM outbox_rows r, pub
                WHERE r.id > pub.upto AND r.published_at IS NULL),
     linked AS (SELECT COALESCE(SUM(b.outbox_first + b.outbox_count
                                    - GREATEST(b.outbox_first, pub.upto + 1)), 0)::int8 AS n,
                       MIN(b.created_at) AS oldest
                FROM audit_batches b, pub
                WHERE b.link_seq IS NOT NULL AND b.outbox_count > 0
                  AND b.outbox_first + b.outbox_count > pub.upto + 1),
     unlinked AS (SELECT COALESCE(SUM(outbox_count), 0)::int8 AS n,
                         MIN(created_at) FILTER (WHERE outbox_count > 0) AS oldest
                  FROM audit_batches WHERE link_seq IS NULL)
     SELECT ",
    stored_counts!(),
    ", s.n + l.n + u.n, LEAST(s.oldest, l.oldest, u.oldest)
     FROM chain_head h, purge_counts p, stored s, linked l, unlinked u
     WHERE h.id = 1 AND p.id = 1"
);

/// Counts and totals, as stored, and the outbox backlog ([`STATS`]).
pub(super) fn stats(conn: &mut Conn) -> Result<Stats> {
    let st = conn.prepared(STATS)?;
    let row = conn.client.query_one(&st, &[])?;
    let counts = counts_of(&row, 0)?;
    let backlog = count_at(&row, 9, "outbox backlog")?;
    let oldest: Option<String> = row.get(10);
    Ok(counts.stats(backlog, oldest.as_deref().and_then(age_seconds)))
}

/// The names of [`Counts`]' fields in the order [`counts_of`] reads them, as the ledger's
/// columns spell them.
pub(super) const COUNTED: [&str; 9] = [
    "claims",
    "disbursements",
    "disbursed_cents_total",
    "dead_letters",
    "duplicates",
    "conflicts",
    "vanished",
    "audit_records",
    "tombstones",
];

/// [`Counts`] from the nine columns of `row` from `at` on, in [`COUNTED`]'s order (the cents
/// as NUMERIC text). A count below zero is a ledger edited by hand: an error naming it.
pub(super) fn counts_of(row: &postgres::Row, at: usize) -> Result<Counts> {
    let n = |i: usize| count_at(row, at + i, COUNTED[i]);
    Ok(Counts {
        claims: n(0)?,
        disbursements: n(1)?,
        disbursed_cents_total: cents(row.get(at + 2))?,
        dead_letters: n(3)?,
        duplicates: n(4)?,
        conflicts: n(5)?,
        vanished: n(6)?,
        audit_records: n(7)?,
        tombstones: n(8)?,
    })
}

fn count_at(row: &postgres::Row, i: usize, what: &str) -> Result<u64> {
    let n: i64 = row.get(i);
    u64::try_from(n).map_err(|_| {
        Error::Invariant(format!(
            "the ledger's stored count of {what} is {n}, below zero (recount it: see `verify`)"
        ))
    })
}

/// A NUMERIC sum of cents, read as text (exact at any size).
pub(super) fn cents(total: String) -> Result<i128> {
    total
        .parse()
        .map_err(|_| Error::Invariant(format!("the disbursed total {total} is not an integer")))
}

impl Backup for PgLedger {
    /// PostgreSQL's own tools make consistent copies of a live database; a copy through this
    /// process would be neither faster nor safer.
    fn backup(&self, _out: &std::path::Path) -> Result<BackupCopied> {
        Err(Error::Config(format!(
            "claimgate backup copies SQLite ledgers; {} is a PostgreSQL ledger: use pg_dump \
             (e.g. pg_dump --format=custom) for a logical copy, or pg_basebackup with WAL \
             archiving for point-in-time recovery",
            self.redacted
        )))
    }
}

impl Drop for PgLedger {
    /// Says how long batches held the chain head (the one lock all nodes share), and releases
    /// the purge lock.
    fn drop(&mut self) {
        if let Some((n, hold, bound)) = link::head_hold() {
            log::info!(
                "chain head lock held per link over {n} links, lock to end of link on the \
                 server's clock: p50 {} us, p99 {} us, max {} us; with its commit and the \
                 answer's return (an upper bound) p50 {} us, bound p99 {} us, max {} us",
                hold.p50,
                hold.p99,
                hold.max,
                bound.p50,
                bound.p99,
                bound.max
            );
        }
        self.end_purge();
    }
}
