//! The embedded SQLite ledger.
//!
//! WAL is set once on a plain connection before the pool exists; every pooled connection then
//! gets the busy timeout and `synchronous` level. Writers open their transactions with
//! `BEGIN IMMEDIATE`, so two processes never both read and then fail to upgrade to write.

use super::{conflict, Item, Ledger, Outcome, Stats};
use crate::audit::{self, Kind, Record};
use crate::config::{LedgerConfig, OnConflict};
use crate::error::{Error, Result};
use crate::failpoint;
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The schema, applied idempotently at every open.
pub const SCHEMA: &str = include_str!("../../schema.sql");

/// The only event type the worker emits.
pub const EVENT_DISBURSEMENT_RECORDED: &str = "disbursement.recorded";

/// A pool of connections to one ledger file.
#[derive(Clone)]
pub struct SqliteLedger {
    /// Connections, each already configured (busy timeout, synchronous, cache).
    pool: Pool<SqliteConnectionManager>,
    /// The file, for messages.
    path: PathBuf,
    /// What `record` does with a conflicting resubmission.
    on_conflict: OnConflict,
}

impl SqliteLedger {
    /// Opens (creating if needed, mode 0600) the ledger at `cfg.path` and applies the schema.
    pub fn open(cfg: &LedgerConfig) -> Result<Self> {
        create_private(&cfg.path)?;
        let first = Connection::open(&cfg.path).map_err(|e| {
            Error::Config(format!("cannot open ledger {}: {e}", cfg.path.display()))
        })?;
        first.busy_timeout(Duration::from_millis(cfg.busy_timeout_ms))?;
        prepare_file(&first, cfg)?;
        drop(first);

        let busy = Duration::from_millis(cfg.busy_timeout_ms);
        let synchronous = cfg.synchronous.as_sql();
        // max_page_count is per connection, not stored in the file, so every connection sets it.
        let pages_max = cfg
            .pages_max
            .map(|n| format!("PRAGMA max_page_count = {n};"))
            .unwrap_or_default();
        let (autocheckpoint, cache_kib) = (cfg.wal_autocheckpoint_pages, cfg.cache_kib);
        let manager = SqliteConnectionManager::file(&cfg.path).with_init(move |c| {
            c.busy_timeout(busy)?;
            c.execute_batch(&format!(
                "PRAGMA synchronous = {synchronous};
                 PRAGMA foreign_keys = ON;
                 PRAGMA cache_size = -{cache_kib};
                 PRAGMA wal_autocheckpoint = {autocheckpoint};
                 PRAGMA temp_store = MEMORY;
                 {pages_max}"
            ))
        });
        let pool = Pool::builder()
            .max_size(cfg.pool_size_max)
            .connection_timeout(Duration::from_millis(cfg.busy_timeout_ms.max(1_000)))
            .build(manager)?;
        Ok(SqliteLedger {
            pool,
            path: cfg.path.clone(),
            on_conflict: OnConflict::Record,
        })
    }

    /// Sets what `record` does with a conflicting resubmission (default: record and pay).
    pub fn with_on_conflict(mut self, on_conflict: OnConflict) -> Self {
        self.on_conflict = on_conflict;
        self
    }

    /// Opens the ledger like [`SqliteLedger::open`], but waits out transient failures (another
    /// process holding the write lock past the busy timeout, a full disk) with backoff, as a
    /// long-running process must: it never exits because the ledger is briefly unavailable.
    /// Returns `None` if `stop` is set while waiting.
    pub fn open_waiting(cfg: &LedgerConfig, stop: &AtomicBool) -> Result<Option<Self>> {
        let mut attempt = 0u32;
        loop {
            match Self::open(cfg) {
                Ok(ledger) => {
                    if attempt > 0 {
                        log::info!(
                            "ledger {} opened after {attempt} retries",
                            cfg.path.display()
                        );
                    }
                    return Ok(Some(ledger));
                }
                Err(e) if e.is_transient() => {
                    if attempt == 0 {
                        log::warn!(
                            "opening the ledger failed: {e}; retrying with backoff until it clears"
                        );
                    }
                    if stop.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                    std::thread::sleep(crate::config::backoff(attempt));
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens the ledger at `path` with default settings.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self> {
        Self::open(&LedgerConfig::new(path.as_ref()))
    }

    /// A pooled connection, for the ledger-side parts of relay, audit and verify.
    pub fn connection(&self) -> Result<PooledConnection<SqliteConnectionManager>> {
        Ok(self.pool.get()?)
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Sets WAL (a property of the file: once, before any pooled connection exists) and applies the
/// schema. Processes opening a brand-new ledger at the same moment race to convert it, and
/// SQLite settles that race by failing one side with SQLITE_BUSY at once instead of waiting
/// (waiting could deadlock); the loser tries again, within the busy timeout.
fn prepare_file(conn: &Connection, cfg: &LedgerConfig) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_millis(cfg.busy_timeout_ms);
    let mut attempt = 0;
    loop {
        let result = (|| -> Result<()> {
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(Error::Config(format!(
                    "ledger {} refused WAL mode (got {mode}); is it on a network filesystem?",
                    cfg.path.display()
                )));
            }
            Ok(conn.execute_batch(SCHEMA)?)
        })();
        match result {
            Err(Error::Sqlite(e))
                if crate::error::sqlite_is_transient(&e)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(crate::config::backoff(attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Creates the ledger file with mode 0600 if it does not exist, so it is never world-readable,
/// and turns "no such directory" or "permission denied" into a configuration error.
fn create_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::Config(format!(
            "cannot create ledger {}: {e}",
            path.display()
        ))),
    }
}

impl Ledger for SqliteLedger {
    fn record(&self, items: &[Item<'_>], consumer: &str, stream: &str) -> Result<Vec<Outcome>> {
        let mut conn = self.pool.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outcomes = write_items(
            &tx,
            items,
            &Context {
                consumer,
                stream,
                on_conflict: self.on_conflict,
            },
        )?;
        failpoint::hit("before_commit");
        tx.commit()?;
        Ok(outcomes)
    }

    fn stats(&self) -> Result<Stats> {
        let conn = self.pool.get()?;
        stats(&conn)
    }
}

/// The tail of the audit chain, carried through one transaction.
pub(super) struct ChainTail {
    seq: i64,
    hash: String,
}

impl ChainTail {
    fn read(tx: &Transaction<'_>) -> Result<Self> {
        let tail = tx
            // A checkpoint is transparent: what follows it links to the hash it continues from.
            .query_row(
                "SELECT seq, CASE kind WHEN 'checkpoint' THEN prev_hash ELSE hash END
                        FROM audit_log ORDER BY seq DESC LIMIT 1",
                [],
                |r| {
                    Ok(ChainTail {
                        seq: r.get(0)?,
                        hash: r.get(1)?,
                    })
                },
            )
            .optional()?;
        Ok(tail.unwrap_or(ChainTail {
            seq: 0,
            hash: audit::GENESIS_HASH.to_owned(),
        }))
    }

    /// Seals `record` after the current tail, inserts it, and makes it the new tail.
    pub(super) fn append(&mut self, tx: &Transaction<'_>, mut record: Record) -> Result<()> {
        record.seq = self.seq + 1;
        record.seal(&self.hash);
        insert_audit(tx, &record)?;
        self.seq = record.seq;
        self.hash = record.hash;
        Ok(())
    }
}

/// Who is recording, from where, under which conflict policy.
pub(super) struct Context<'a> {
    /// The consumer name.
    pub(super) consumer: &'a str,
    /// The submissions stream (dead letters are keyed by stream and entry id).
    pub(super) stream: &'a str,
    /// What to do with a conflicting resubmission.
    pub(super) on_conflict: OnConflict,
}

/// Writes every item of a batch inside the caller's open transaction.
fn write_items(
    tx: &Transaction<'_>,
    items: &[Item<'_>],
    ctx: &Context<'_>,
) -> Result<Vec<Outcome>> {
    let (consumer, stream) = (ctx.consumer, ctx.stream);
    let now = now_rfc3339();
    let mut tail = ChainTail::read(tx)?;
    let mut outcomes = Vec::with_capacity(items.len());
    for item in items {
        let outcome = match item {
            Item::Submission {
                submission,
                entry_id,
                delivery_count,
            } => {
                let claim = Claim {
                    submission,
                    entry_id,
                    delivery_count: *delivery_count,
                };
                record_submission(tx, &mut tail, &claim, ctx, &now)?
            }
            Item::KnownDuplicate {
                submission,
                entry_id,
                delivery_count,
                committed_by,
            } => {
                let claim = Claim {
                    submission,
                    entry_id,
                    delivery_count: *delivery_count,
                };
                record_known_duplicate(tx, &mut tail, &claim, committed_by, consumer, &now)?
            }
            Item::DeadLetter {
                entry_id,
                reason_code,
                reason,
                award_id,
                key,
                delivery_count,
            } => {
                let inserted = tx
                    .prepare_cached(
                        "INSERT OR IGNORE INTO dead_letters (stream, stream_entry_id, reason_code,
                         reason, award_id, delivery_count, recorded_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )?
                    .execute(params![
                        stream,
                        entry_id,
                        reason_code,
                        reason,
                        award_id,
                        *delivery_count as i64,
                        now
                    ])?;
                if inserted == 0 {
                    Outcome::AlreadyDeadLettered
                } else {
                    let mut r = blank_record(Kind::DeadLetter, consumer, &now);
                    r.idempotency_key = key.map(|k| k.to_hex());
                    r.award_id = award_id.map(str::to_owned);
                    r.stream_entry_id = Some((*entry_id).to_owned());
                    r.delivery_count = Some(*delivery_count as i64);
                    r.detail = Some(format!("{reason_code}: {reason}"));
                    tail.append(tx, r)?;
                    Outcome::DeadLettered
                }
            }
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// One submission with its delivery facts.
pub(super) struct Claim<'a> {
    /// The validated submission.
    pub(super) submission: &'a crate::submission::Submission,
    /// The stream entry that carried it.
    pub(super) entry_id: &'a str,
    /// Deliveries so far.
    pub(super) delivery_count: u64,
}

/// INSERT OR IGNORE the claim; if it took, write the disbursement, outbox row and audit record.
fn record_submission(
    tx: &Transaction<'_>,
    tail: &mut ChainTail,
    claim: &Claim<'_>,
    ctx: &Context<'_>,
    now: &str,
) -> Result<Outcome> {
    let (s, consumer) = (claim.submission, ctx.consumer);
    let key = s.key.as_bytes().as_slice();
    // Under hold, a conflict must be known before claiming; under record (the default) it is
    // looked up only for new claims, after the claim, so duplicates pay nothing for it.
    let held_conflict = match ctx.on_conflict {
        OnConflict::Hold => conflict::find(tx, s)?,
        OnConflict::Record => None,
    };
    if let Some(other) = &held_conflict {
        if !conflict::is_claimed(tx, key)? {
            return conflict::hold(tx, tail, claim, other, ctx, now);
        }
    }
    let claimed = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO processed_messages (idempotency_key, award_id,
             submission_timestamp, amount_cents, claimed_at, stream_entry_id, consumer)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            key,
            s.award_id,
            s.submission_timestamp,
            s.amount_cents,
            now,
            claim.entry_id,
            consumer
        ])?;

    let mut r = blank_record(Kind::Processed, consumer, now);
    r.idempotency_key = Some(s.key.to_hex());
    r.award_id = Some(s.award_id.clone());
    r.stream_entry_id = Some(claim.entry_id.to_owned());
    r.delivery_count = Some(claim.delivery_count as i64);

    if claimed == 0 {
        let first_claimed_at: String = tx
            .prepare_cached("SELECT claimed_at FROM processed_messages WHERE idempotency_key = ?1")?
            .query_row([key], |row| row.get(0))?;
        r.kind = Kind::Duplicate;
        r.detail = Some(format!("first claimed at {first_claimed_at}"));
        tail.append(tx, r)?;
        return Ok(Outcome::Duplicate { first_claimed_at });
    }

    let claim_id = tx.last_insert_rowid();
    failpoint::hit("after_claim");
    tx.prepare_cached(
        "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents, recorded_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![claim_id, key, s.award_id, s.amount_cents, now])?;
    let event = serde_json::json!({
        "award_id": s.award_id,
        "amount_cents": s.amount_cents,
        "idempotency_key": s.key.to_hex(),
        "submission_timestamp": s.submission_timestamp,
    });
    tx.prepare_cached(
        "INSERT INTO outbox (claim_id, event_type, payload, created_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        claim_id,
        EVENT_DISBURSEMENT_RECORDED,
        event.to_string(),
        now
    ])?;
    r.amount_cents = Some(s.amount_cents);
    tail.append(tx, r)?;
    let other = match ctx.on_conflict {
        OnConflict::Hold => held_conflict,
        OnConflict::Record => conflict::find(tx, s)?,
    };
    match other {
        None => Ok(Outcome::Processed),
        Some(other) => {
            let mut c = conflict::record(claim, &other, consumer, now);
            c.detail = Some(format!(
                "{}; paid (--on-conflict record)",
                c.detail.unwrap_or_default()
            ));
            tail.append(tx, c)?;
            Ok(Outcome::ProcessedConflicting {
                other_key: other.key_hex,
            })
        }
    }
}

/// A duplicate the fast filter vouched for: its audit record only, no probe of the claim index.
fn record_known_duplicate(
    tx: &Transaction<'_>,
    tail: &mut ChainTail,
    claim: &Claim<'_>,
    committed_by: &str,
    consumer: &str,
    now: &str,
) -> Result<Outcome> {
    let s = claim.submission;
    let mut r = blank_record(Kind::Duplicate, consumer, now);
    r.idempotency_key = Some(s.key.to_hex());
    r.award_id = Some(s.award_id.clone());
    r.stream_entry_id = Some(claim.entry_id.to_owned());
    r.delivery_count = Some(claim.delivery_count as i64);
    r.detail = Some(format!(
        "already claimed; seen committed by {committed_by} (fast filter)"
    ));
    tail.append(tx, r)?;
    Ok(Outcome::Duplicate {
        first_claimed_at: committed_by.to_owned(),
    })
}

pub(super) fn blank_record(kind: Kind, consumer: &str, now: &str) -> Record {
    Record {
        seq: 0,
        kind,
        idempotency_key: None,
        award_id: None,
        amount_cents: None,
        stream_entry_id: None,
        consumer: Some(consumer.to_owned()),
        delivery_count: None,
        detail: None,
        recorded_at: now.to_owned(),
        prev_hash: String::new(),
        hash: String::new(),
    }
}

fn insert_audit(tx: &Transaction<'_>, r: &Record) -> Result<()> {
    super::audit_store::insert(tx, r)
}

fn stats(conn: &Connection) -> Result<Stats> {
    let count =
        |sql: &str| -> Result<u64> { Ok(conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64) };
    let oldest: Option<String> = conn.query_row(
        "SELECT MIN(created_at) FROM outbox WHERE published_at IS NULL",
        [],
        |r| r.get(0),
    )?;
    Ok(Stats {
        claims: count("SELECT COUNT(*) FROM processed_messages")?,
        disbursements: count("SELECT COUNT(*) FROM disbursements")?,
        disbursed_cents_total: conn.query_row(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM disbursements",
            [],
            |r| r.get(0),
        )?,
        outbox_backlog: count("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL")?,
        outbox_oldest_age_s: oldest.as_deref().and_then(age_seconds),
        dead_letters: count("SELECT COUNT(*) FROM dead_letters")?,
        duplicates_suppressed: count("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'")?,
        conflicts: count("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'")?,
        audit_records: count("SELECT COUNT(*) FROM audit_log")?,
    })
}

/// The current time as the ledger stores it: RFC 3339, UTC, microseconds.
pub fn now_rfc3339() -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    time::OffsetDateTime::now_utc()
        .format(&format)
        .expect("UTC time always formats")
}

/// Seconds between an RFC 3339 timestamp and now.
pub fn age_seconds(rfc3339: &str) -> Option<f64> {
    let then = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()?;
    Some(
        (time::OffsetDateTime::now_utc() - then)
            .as_seconds_f64()
            .max(0.0),
    )
}
