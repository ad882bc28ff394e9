//! [`Retention`] for SQLite: the SQL behind `claimgate retention purge` and `claimgate hold`.
//!
//! A purge removes a prefix of the audit chain (records `seq <= last`) together with exactly
//! the ledger rows those records describe: the claim, disbursement and outbox row of each
//! `processed` record and the `dead_letters` row of each `dead_letter` record. Each bounded
//! batch is one transaction that also moves the leading checkpoint forward, so the ledger
//! passes `verify` and `audit verify` after every batch, even if the purge is killed mid-way.
//!
//! A purge finds each record's claim through a temporary key → claim map (see
//! [`index_claim_keys`]), built once on one connection by `export_purge` and kept, with that
//! connection, in a [`Session`] for the `purge_batch` calls that follow.

use super::checkpoint::Between;
use super::derived;
use super::ledger::{Session, SqliteLedger};
use super::{audit_store, counts};
use crate::domain::audit::{detail, Kind, Record};
use crate::domain::key::to_hex;
use crate::error::{Error, Result};
use crate::ledger::{purge, Hold, PurgePlan, Removed, Retention};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::time::Duration;

impl SqliteLedger {
    /// A connection with a fresh claim-key map for `cutoff`, kept as the session.
    fn start_session(&self, cutoff: &str) -> Result<Session> {
        let conn = self.conn()?;
        index_claim_keys(&conn, cutoff, self.settings.busy)?;
        Ok(Session {
            cutoff: cutoff.to_owned(),
            conn,
        })
    }
}

impl Retention for SqliteLedger {
    fn hold_add(&self, award_id: &str, reason: &str, now: &str) -> Result<bool> {
        hold_add(&mut *self.conn()?, award_id, reason, now)
    }

    fn hold_remove(&self, award_id: &str, now: &str) -> Result<bool> {
        hold_remove(&mut *self.conn()?, award_id, now)
    }

    fn holds(&self) -> Result<Vec<Hold>> {
        holds(&*self.conn()?)
    }

    fn claims_of(&self, award_id: &str) -> Result<u64> {
        let n: i64 = self.conn()?.query_row(
            "SELECT COUNT(*) FROM processed_messages WHERE award_id = ?1",
            [award_id],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    fn export_purge(
        &self,
        cutoff: &str,
        batch_records_max: usize,
        admit: &mut dyn FnMut(&PurgePlan) -> Result<()>,
        row: &mut dyn FnMut(&serde_json::Value) -> Result<()>,
    ) -> Result<Option<(PurgePlan, Vec<i64>)>> {
        let mut session = self.purge.lock().unwrap_or_else(|p| p.into_inner());
        // The map is built outside the read transaction below, which rolls back when it ends
        // and would take the temporary table with it.
        let session = session.insert(self.start_session(cutoff)?);
        let mut read = ExportRead {
            tx: session.conn.transaction()?,
            rounds: Between::new(self.settings.busy),
        };
        purge::export(&mut read, cutoff, batch_records_max, admit, row)
    }

    fn purge_batch(
        &self,
        first: i64,
        last: i64,
        cutoff: &str,
        detail: &str,
        now: &str,
    ) -> Result<Removed> {
        let mut session = self.purge.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = !matches!(&*session, Some(s) if s.cutoff == cutoff);
        if fresh {
            *session = Some(self.start_session(cutoff)?);
        }
        let session = session.as_mut().expect("set just above");
        match purge_batch(&mut session.conn, first, last, detail, now) {
            // The map was built at the last `export_purge`: a claim made since, before
            // `cutoff` all the same, is not in it yet. The batch rolled back; look again.
            Err(Error::Invariant(_)) if !fresh => {
                index_claim_keys(&session.conn, cutoff, self.settings.busy)?;
                purge_batch(&mut session.conn, first, last, detail, now)
            }
            done => done,
        }
    }
}

/// The read a purge's export runs in: a read transaction a batch, with a checkpoint round
/// between two when one is due ([`Between`]).
struct ExportRead<'c> {
    tx: Transaction<'c>,
    rounds: Between,
}

impl<'c> std::ops::Deref for ExportRead<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

/// A purge's export asks the read snapshot it runs in ([`purge::Snapshot`]).
impl purge::Snapshot for ExportRead<'_> {
    /// The audit prefix a purge before `cutoff` may remove: `(first, last)` seqs, or `None`.
    /// It ends before the first non-checkpoint record written at or after `cutoff`.
    fn prefix(&mut self, cutoff: &str) -> Result<Option<(i64, i64)>> {
        let (first, last): (Option<i64>, Option<i64>) = self.query_row(
            "SELECT (SELECT MIN(seq) FROM audit_log),
                    (SELECT MAX(seq) FROM audit_log WHERE seq < COALESCE(
                        (SELECT MIN(seq) FROM audit_log WHERE recorded_at >= ?1 AND kind <> 'checkpoint'),
                        9223372036854775807))",
            [cutoff],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let (Some(first), Some(last)) = (first, last) else {
            return Ok(None);
        };
        let only_checkpoint = self
            .query_row(
                "SELECT 1 FROM audit_log WHERE seq BETWEEN ?1 AND ?2 AND kind <> 'checkpoint' LIMIT 1",
                [first, last],
                |_| Ok(()),
            )
            .optional()?
            .is_none();
        Ok(if last < first || only_checkpoint {
            None
        } else {
            Some((first, last))
        })
    }

    fn held_in(&mut self, first: i64, last: i64) -> Result<Vec<String>> {
        held_in(&self.tx, first, last)
    }

    /// Outbox rows among the claims of `first..=last` not yet published, or not yet on every
    /// events stream a relay has published this ledger to: above the lowest `published_upto:`
    /// mark (`outbox.rs`). Either relay of two may set `published_at`; the other reads rows by id
    /// from its own stream's position, so a row above its mark must stay.
    ///
    /// Read in steps of [`PLAN_STEP_RECORDS`] records, each step a snapshot of its own
    /// ([`purge::Snapshot::unpublished_in`] says why that answers as one would): in one, the
    /// count of a year of a 10,000,000-claim ledger read for 9 s, and the WAL grew by 380 MB
    /// beside a worker while it did.
    fn unpublished_in(&mut self, first: i64, last: i64) -> Result<u64> {
        let sql = format!(
            "SELECT COUNT(*) FROM outbox
             WHERE (published_at IS NULL
                    OR id > (SELECT MIN(CAST(value AS INTEGER)) FROM ledger_meta
                             WHERE name LIKE 'published\\_upto:%' ESCAPE '\\'))
               AND claim_id IN ({CLAIMS_IN})"
        );
        let mut unpublished = 0;
        let mut lo = first;
        loop {
            let hi = lo.saturating_add(PLAN_STEP_RECORDS - 1).min(last);
            let n: i64 = self.query_row(&sql, [lo, hi], |r| r.get(0))?;
            unpublished += n as u64;
            if hi >= last {
                return Ok(unpublished);
            }
            purge::Snapshot::between_batches(self)?;
            lo = hi + 1;
        }
    }

    /// The seq ending a batch of at most `count` records starting at `first`, within `..=last`.
    fn batch_end(&mut self, first: i64, last: i64, count: usize) -> Result<i64> {
        let end: Option<i64> = self.query_row(
            "SELECT MAX(seq) FROM (SELECT seq FROM audit_log WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq LIMIT ?3)",
            params![first, last, count as i64],
            |r| r.get(0),
        )?;
        Ok(end.unwrap_or(last))
    }

    fn records(&mut self, first: i64, last: i64) -> Result<Vec<Record>> {
        audit_store::range(&self.tx, first, last)
    }

    /// Ends this read transaction and begins another (deferred: its snapshot is taken at its
    /// first read), so a checkpoint can copy what was committed meanwhile, and runs one here
    /// when one is due: back to back, the batches left no moment without a reader for the
    /// checkpointer's RESTART. The `Transaction` still rolls back at its end, which ends the
    /// last one.
    fn between_batches(&mut self) -> Result<()> {
        self.tx.execute_batch("COMMIT")?;
        self.rounds.steps(&self.tx);
        self.tx.execute_batch("BEGIN DEFERRED")?;
        Ok(())
    }

    /// The other tables' rows, each as SQLite returns it (`SELECT *`), except that what a
    /// format-5 ledger derives from the claim is exported as derived (`derived.rs`): the file
    /// reads the same whichever format wrote the rows.
    fn export_rows(&mut self, first: i64, last: i64) -> Result<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        let tables = [
            (
                "processed_messages",
                format!("SELECT * FROM processed_messages WHERE claim_id IN ({CLAIMS_IN})"),
            ),
            (
                "disbursements",
                format!(
                    "SELECT d.id, d.claim_id, d.idempotency_key, d.award_id, d.amount_cents,
                            ifnull(d.recorded_at, p.claimed_at) AS recorded_at
                     FROM disbursements d JOIN processed_messages p ON p.claim_id = d.claim_id
                     WHERE d.claim_id IN ({CLAIMS_IN})"
                ),
            ),
            ("outbox", String::new()),
            (
                "dead_letters",
                format!("SELECT * FROM dead_letters WHERE stream_entry_id IN ({DEAD_IN})"),
            ),
        ];
        for (table, sql) in tables {
            if table == "outbox" {
                export_outbox(&self.tx, first, last, &mut out)?;
                continue;
            }
            let mut stmt = self.prepare(&sql)?;
            let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
            let mut rows = stmt.query([first, last])?;
            while let Some(row) = rows.next()? {
                let mut obj = serde_json::Map::new();
                for (i, name) in names.iter().enumerate() {
                    obj.insert(name.clone(), json_of(row.get_ref(i)?));
                }
                out.push(serde_json::json!({ "table": table, "row": obj }));
            }
        }
        Ok(out)
    }
}

/// The outbox rows of the batch's claims, as stored or derived.
fn export_outbox(
    tx: &Transaction<'_>,
    first: i64,
    last: i64,
    out: &mut Vec<serde_json::Value>,
) -> Result<()> {
    let mut stmt = tx.prepare(&format!(
        "SELECT {} FROM {} WHERE o.claim_id IN ({CLAIMS_IN}) ORDER BY o.id",
        derived::outbox_columns!(),
        derived::outbox_from!()
    ))?;
    let mut rows = stmt.query([first, last])?;
    while let Some(row) = rows.next()? {
        let o = derived::OutboxRow::read(row)?;
        out.push(serde_json::json!({ "table": "outbox", "row": {
            "id": o.id,
            "claim_id": o.claim_id,
            "event_type": o.event_type,
            "payload": o.payload,
            "created_at": o.created_at,
            "published_at": o.published_at,
        }}));
    }
    Ok(())
}

/// Places a hold with its `hold_added` record; returns false (nothing written) if the award
/// was already held.
fn hold_add(conn: &mut Connection, award_id: &str, reason: &str, now: &str) -> Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = tx.execute(
        "INSERT OR IGNORE INTO legal_holds (award_id, reason, held_at) VALUES (?1, ?2, ?3)",
        params![award_id, reason, now],
    )?;
    if n == 1 {
        let r = audit_store::append(
            &tx,
            Record::hold(Kind::HoldAdded, award_id, detail::hold_added(reason), now),
        )?;
        counts::Delta::of_records([&r]).apply(&tx)?;
    }
    tx.commit()?;
    Ok(n == 1)
}

/// Lifts a hold with its `hold_removed` record; returns false (nothing written) if there was
/// none.
fn hold_remove(conn: &mut Connection, award_id: &str, now: &str) -> Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held: Option<(String, String)> = tx
        .query_row(
            "DELETE FROM legal_holds WHERE award_id = ?1 RETURNING reason, held_at",
            [award_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((reason, held_at)) = &held {
        let text = detail::hold_removed(reason, held_at);
        let r = audit_store::append(&tx, Record::hold(Kind::HoldRemoved, award_id, text, now))?;
        counts::Delta::of_records([&r]).apply(&tx)?;
    }
    tx.commit()?;
    Ok(held.is_some())
}

/// Every hold, by award.
pub(super) fn holds(conn: &Connection) -> Result<Vec<Hold>> {
    let mut stmt =
        conn.prepare("SELECT award_id, reason, held_at FROM legal_holds ORDER BY award_id")?;
    let rows = stmt.query_map([], |r| {
        Ok(Hold {
            award_id: r.get(0)?,
            reason: r.get(1)?,
            held_at: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Claims whose `processed` record lies in `?1..=?2` (through `temp.claim_keys`, see
/// [`index_claim_keys`]).
const CLAIMS_IN: &str = concat!(
    "SELECT k.claim_id FROM audit_log a
     JOIN temp.claim_keys k ON k.idempotency_key = ",
    super::derived::key_bytes!("a.idempotency_key"),
    " WHERE a.kind = 'processed' AND a.seq BETWEEN ?1 AND ?2"
);

/// Builds `temp.claim_keys` on this connection: key → claim id for every claim made before
/// `cutoff`, the only claims a purge before `cutoff` can reach. Audit records name a claim by
/// its key alone, and the ledger has no index on the key alone: its one index on claims leads
/// with the submission's time and award (`schema.sql`), which keeps the worker's inserts local.
/// Built once per purge (one pass over the claims), this keeps each batch's lookups cheap; the
/// map cannot go stale during the purge, because every claim it must find was made before
/// `cutoff`, and a claim made later is never purged. Every later call on this connection
/// (`unpublished_in`, `export_rows`, `purge_batch`) reads it.
///
/// The map goes to a temporary file, not memory as the pool's connections keep temporary
/// tables: a year of a busy ledger is millions of keys (about 60 bytes each in memory; a purge
/// of 3 million claims would have held some 180 MiB). The connection is the purge's own for
/// as long as the session lasts, and changing `temp_store` drops only temporary tables, which
/// it has no other.
fn index_claim_keys(conn: &Connection, cutoff: &str, busy: Duration) -> Result<()> {
    conn.execute_batch(
        "PRAGMA temp_store = FILE;
         CREATE TEMP TABLE IF NOT EXISTS claim_keys (
             idempotency_key BLOB PRIMARY KEY, claim_id INTEGER NOT NULL) WITHOUT ROWID;
         DELETE FROM temp.claim_keys;",
    )?;
    // In steps of claim ids, each statement a read snapshot of its own: one scan of every
    // claim in one snapshot kept every page the workers wrote meanwhile in the WAL (on a
    // ledger of 10,000,000 claims, a minute of commits). A claim made after the first step
    // has a higher id than the last step reads, and was made after the cutoff anyway.
    let (low, high): (Option<i64>, Option<i64>) = conn.query_row(
        "SELECT (SELECT MIN(claim_id) FROM processed_messages),
                (SELECT MAX(claim_id) FROM processed_messages)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (Some(low), Some(high)) = (low, high) else {
        return Ok(());
    };
    let mut insert = conn.prepare(
        "INSERT OR IGNORE INTO temp.claim_keys (idempotency_key, claim_id)
         SELECT idempotency_key, claim_id FROM processed_messages
         WHERE claim_id BETWEEN ?2 AND ?3 AND claimed_at < ?1",
    )?;
    let mut rounds = Between::new(busy);
    let mut from = low;
    while from <= high {
        let to = from.saturating_add(CLAIM_KEYS_STEP - 1).min(high);
        insert.execute(params![cutoff, from, to])?;
        rounds.steps(conn);
        from = to.saturating_add(1);
        if to == i64::MAX {
            break;
        }
    }
    Ok(())
}

/// Claim ids [`index_claim_keys`] reads in one statement. Beside a worker on a
/// 10,000,000-claim ledger, steps of 100,000 (0.13 s each alone) let the WAL grow by 500 MB
/// while the map was built; steps of 20,000 by 30 MB (BENCHMARKS.md).
const CLAIM_KEYS_STEP: i64 = 20_000;
/// Audit records [`purge::Snapshot::unpublished_in`] reads in one snapshot: about 70 ms of a
/// 10,000,000-claim ledger's.
const PLAN_STEP_RECORDS: i64 = 20_000;
/// Dead-letter entries whose `dead_letter` record lies in `?1..=?2`.
const DEAD_IN: &str = "SELECT stream_entry_id FROM audit_log
     WHERE kind = 'dead_letter' AND seq BETWEEN ?1 AND ?2";

fn json_of(v: ValueRef<'_>) -> serde_json::Value {
    match v {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(n) => n.into(),
        ValueRef::Real(x) => x.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        // Keys are 32 raw bytes; hex is how every other tool shows them.
        ValueRef::Blob(b) => to_hex(b).into(),
    }
}

/// Held awards named by any record in `first..=last`.
fn held_in(conn: &Connection, first: i64, last: i64) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT a.award_id FROM audit_log a JOIN legal_holds h ON h.award_id = a.award_id
         WHERE a.seq BETWEEN ?1 AND ?2 ORDER BY a.award_id",
    )?;
    let rows = stmt.query_map([first, last], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Removes batch `first..=last` and leaves a checkpoint at `last` that continues from the hash
/// of record `last`, in one transaction. Refuses (nothing removed) if an award in the batch has
/// come under hold since the purge was planned.
fn purge_batch(
    conn: &mut Connection,
    first: i64,
    last: i64,
    detail: &str,
    now: &str,
) -> Result<Removed> {
    assert!(first <= last, "a purge batch {first}..={last} is empty");
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    purge::refuse_held(&held_in(&tx, first, last)?)?;
    let continues_from: String =
        tx.query_row("SELECT hash FROM audit_log WHERE seq = ?1", [last], |r| {
            super::derived::digest_hex(r.get_ref(0)?)
        })?;
    let mut removed = counts::Removed::default();
    let (claims, tombstones) = delete_claims(&tx, first, last, now, &mut removed)?;
    let dead_letters = tx.execute(
        &format!("DELETE FROM dead_letters WHERE stream_entry_id IN ({DEAD_IN})"),
        [first, last],
    )?;
    // The records go in one pass that also tells their kinds, for the counts.
    let mut records = 0;
    {
        let mut stmt =
            tx.prepare("DELETE FROM audit_log WHERE seq BETWEEN ?1 AND ?2 RETURNING kind")?;
        let mut gone = stmt.query([first, last])?;
        while let Some(row) = gone.next()? {
            records += 1;
            match row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)? {
                "duplicate" => removed.duplicates += 1,
                "conflict" => removed.conflicts += 1,
                "vanished" => removed.vanished += 1,
                _ => {}
            }
        }
    }
    (removed.dead_letters, removed.records) = (dead_letters as i64, records);
    let checkpoint = Record::checkpoint(last, detail, now, &continues_from);
    audit_store::insert(&tx, &checkpoint)?;
    let mut delta = counts::Delta::purged(removed, tombstones);
    delta.records([&checkpoint]);
    delta.apply(&tx)?;
    tx.commit()?;
    Ok(Removed {
        records: records as u64,
        claims,
        dead_letters: dead_letters as u64,
    })
}

/// Deletes the claims of the batch's `processed` records with their disbursements and outbox
/// rows, leaving each claim's tombstone (key, claimed_at, purged at `now`) first. Returns the
/// claims found and the tombstones added, and notes in `removed` the claims and disbursements
/// it deleted and the halves of their amounts (`counts.rs`).
fn delete_claims(
    tx: &Transaction<'_>,
    first: i64,
    last: i64,
    now: &str,
    removed: &mut counts::Removed,
) -> Result<(u64, usize)> {
    tx.execute(
        "CREATE TEMP TABLE IF NOT EXISTS purge_claims (claim_id INTEGER PRIMARY KEY)",
        [],
    )?;
    tx.execute("DELETE FROM temp.purge_claims", [])?;
    tx.execute(
        &format!("INSERT INTO temp.purge_claims {CLAIMS_IN}"),
        [first, last],
    )?;
    // Each processed record must take its claim with it ([`purge::all_claims_found`]).
    let (records, found): (i64, i64) = tx.query_row(
        "SELECT (SELECT COUNT(*) FROM audit_log WHERE kind = 'processed' AND seq BETWEEN ?1 AND ?2),
                (SELECT COUNT(*) FROM temp.purge_claims)",
        [first, last],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    purge::all_claims_found(records, found, first, last)?;
    // OR IGNORE: a hand-edited ledger could hold a tombstone of a key that is also claimed
    // (`verify` names that); the purge keeps the earlier tombstone and removes the claim.
    let tombstones = tx.execute(
        "INSERT OR IGNORE INTO claim_tombstones (idempotency_key, claimed_at, purged_at)
         SELECT p.idempotency_key, p.claimed_at, ?1 FROM processed_messages p
         WHERE p.claim_id IN (SELECT claim_id FROM temp.purge_claims)",
        [now],
    )?;
    (removed.cents_high, removed.cents_low) = tx.query_row(
        "SELECT COALESCE(SUM(amount_cents >> 32), 0), COALESCE(SUM(amount_cents & 4294967295), 0)
         FROM disbursements WHERE claim_id IN (SELECT claim_id FROM temp.purge_claims)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    // Claims are gone: writers' conflict filters (`conflict::Groups`) must be rebuilt.
    tx.execute(
        "INSERT INTO ledger_meta (name, value) VALUES (?1, '1')
         ON CONFLICT (name) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
        [super::conflict::PURGES_META],
    )?;
    let mut deleted = [0; 3];
    for (table, n) in ["outbox", "disbursements", "processed_messages"]
        .into_iter()
        .zip(&mut deleted)
    {
        *n = tx.execute(
            &format!(
                "DELETE FROM {table} WHERE claim_id IN (SELECT claim_id FROM temp.purge_claims)"
            ),
            [],
        )? as i64;
    }
    (removed.disbursements, removed.claims) = (deleted[1], deleted[2]);
    Ok((found as u64, tombstones))
}
