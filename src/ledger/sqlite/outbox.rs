//! The relay's side of the outbox: read rows in id order above a position, mark them published.
//!
//! # Why SQLite keeps contract point 5 (rows become visible in id order)
//! SQLite has one writer at a time (every writer opens with `BEGIN IMMEDIATE`) and `outbox.id`
//! is AUTOINCREMENT, so ids are handed out in commit order: a reader that sees row `n` has
//! already seen every committed row below `n`, and no later commit can add a row below it.
//! AUTOINCREMENT also keeps the highest id ever used in `sqlite_sequence`, so an id is never
//! reused, not even after a retention purge removed the rows at the top. The relay's
//! exactly-once argument (`relay.rs`) rests on exactly this.

use super::derived;
use super::ledger::SqliteLedger;
use crate::error::Result;
use crate::ledger::{Outbox, OutboxRow};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

impl Outbox for SqliteLedger {
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(
            "SELECT id, event_type, payload FROM outbox WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let mut rows = stmt.query(params![after_id, limit as i64])?;
        let mut out = Vec::with_capacity(limit.min(4096));
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            let row = match (r.get(1)?, r.get(2)?) {
                (Some(event_type), Some(payload)) => OutboxRow {
                    id,
                    event_type,
                    payload,
                },
                // A published row of a format-5 ledger keeps no event (`derived.rs`): read
                // only when the events stream lost what it had and the relay publishes it
                // again, so its claim is looked up for it alone (a lookup for every row, the
                // join, cost the relay a fifth of its time).
                _ => {
                    let row = conn
                        .prepare_cached(concat!(
                            "SELECT ",
                            derived::outbox_columns!(),
                            " FROM ",
                            derived::outbox_from!(),
                            " WHERE o.id = ?1"
                        ))?
                        .query_row([id], |r| Ok(derived::OutboxRow::read(r)))??;
                    OutboxRow {
                        id,
                        event_type: row.event_type,
                        payload: row.payload,
                    }
                }
            };
            out.push(row);
        }
        Ok(out)
    }

    fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = mark(&tx, self.derives.outbox, now, upto_id)?;
        note_published_upto(&tx, events_stream, upto_id)?;
        tx.commit()?;
        Ok(n as u64)
    }

    fn outbox_id_max(&self) -> Result<i64> {
        outbox_id_max(&*self.conn()?)
    }

    /// Below the first unpublished row (found through `outbox_unpublished`), the highest row:
    /// rows are marked in id order, so it is the last one marked. Two index probes, however
    /// large the backlog.
    fn published_id_max(&self, events_stream: &str) -> Result<i64> {
        let conn = self.conn()?;
        let (mine, any): (Option<i64>, bool) = conn
            .prepare_cached(
                "SELECT (SELECT CAST(value AS INTEGER) FROM ledger_meta
                         WHERE name = 'published_upto:' || ?1),
                        EXISTS (SELECT 1 FROM ledger_meta
                                WHERE name LIKE 'published\\_upto:%' ESCAPE '\\')",
            )?
            .query_row([events_stream], |r| Ok((r.get(0)?, r.get(1)?)))?;
        if let Some(upto) = mine {
            return Ok(upto);
        }
        if any {
            return Ok(0);
        }
        let mut stmt = conn.prepare_cached(
            "SELECT COALESCE(MAX(id), 0) FROM outbox WHERE published_at IS NOT NULL
               AND id < COALESCE((SELECT MIN(id) FROM outbox WHERE published_at IS NULL),
                                 9223372036854775807)",
        )?;
        Ok(stmt.query_row([], |r| r.get(0))?)
    }

    fn ledger_id(&self) -> Result<String> {
        let conn = self.conn()?;
        if let Some(id) = read_ledger_id(&conn)? {
            return Ok(id);
        }
        // One statement, so it is atomic on its own; OR IGNORE lets two first relays race safely.
        conn.execute(
            "INSERT OR IGNORE INTO ledger_meta (name, value) VALUES ('ledger_id', lower(hex(randomblob(16))))",
            [],
        )?;
        Ok(read_ledger_id(&conn)?.expect("just inserted"))
    }

    fn ledger_id_made(&self) -> Result<Option<String>> {
        read_ledger_id(&*self.conn()?)
    }
}

/// Marks every unpublished row up to `upto_id` published at `now`. Returns the rows marked.
///
/// Where the ledger derives a published row's event from its claim (`derived.rs`), the row
/// keeps no event type, payload or creation time from then on: it is deleted and put back
/// with the same id, claim and its `published_at` alone. Not an `UPDATE` to NULL: SQLite
/// rebalances a B-tree page only when a row is deleted from it, never when one shrinks in
/// place, so an update left every published row's page as full of free space as before
/// (measured: 257 bytes a row either way). Deleted and put back, the rows of a batch share
/// the pages they leave, and the pages freed are reused by the next rows written.
pub(super) fn mark(tx: &Connection, derives: bool, now: &str, upto_id: i64) -> Result<usize> {
    if !derives {
        return Ok(tx
            .prepare_cached(
                "UPDATE outbox SET published_at = ?1 WHERE published_at IS NULL AND id <= ?2",
            )?
            .execute(params![now, upto_id])?);
    }
    let mut marked = 0;
    loop {
        // A chunk at a time, in id order through `outbox_unpublished` (the chunk's last id,
        // then the range up to it): a restore adopts a mark that may cover every row of a
        // large ledger.
        let last: i64 = tx
            .prepare_cached(
                "SELECT COALESCE(
                     (SELECT id FROM outbox WHERE published_at IS NULL AND id <= ?1
                      ORDER BY id LIMIT 1 OFFSET ?2),
                     ?1)",
            )?
            .query_row(params![upto_id, MARK_CHUNK_ROWS - 1], |r| r.get(0))?;
        let mut rows: Vec<(i64, i64)> = tx
            .prepare_cached(
                "DELETE FROM outbox WHERE published_at IS NULL AND id <= ?1
                 RETURNING id, claim_id",
            )?
            .query_map([last], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        if rows.is_empty() {
            return Ok(marked);
        }
        rows.sort_unstable();
        // One statement a row: 64 rows a statement measured no faster.
        let mut put_back = tx.prepare_cached(
            "INSERT INTO outbox (id, claim_id, published_at) VALUES (?1, ?2, ?3)",
        )?;
        for (id, claim_id) in &rows {
            put_back.execute(params![id, claim_id, now])?;
        }
        marked += rows.len();
    }
}

/// Rows [`mark`] moves per statement where it puts published rows back without their event.
const MARK_CHUNK_ROWS: i64 = 4096;

fn read_ledger_id(conn: &Connection) -> Result<Option<String>> {
    Ok(conn
        .query_row(
            "SELECT value FROM ledger_meta WHERE name = 'ledger_id'",
            [],
            |r| r.get(0),
        )
        .optional()?)
}

/// The highest outbox id ever assigned: AUTOINCREMENT keeps it in `sqlite_sequence`, which
/// has no row for `outbox` until the first one (and none at all in a ledger that never had an
/// AUTOINCREMENT row).
pub(super) fn outbox_id_max(conn: &Connection) -> Result<i64> {
    let has_sequence: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence')",
        [],
        |r| r.get(0),
    )?;
    if !has_sequence {
        return Ok(0);
    }
    Ok(conn
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'",
            [],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0))
}

/// Records in `ledger_meta` that `events_stream` holds every outbox row at or below `upto_id`
/// (raised, never lowered; never above the highest id the ledger gave); retention reads the
/// lowest such mark (`purge.rs`).
pub(super) fn note_published_upto(
    tx: &rusqlite::Transaction<'_>,
    events_stream: &str,
    upto_id: i64,
) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO ledger_meta (name, value)
             VALUES ('published_upto:' || ?1,
                     min(?2, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0)))
         ON CONFLICT (name) DO UPDATE
             SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
    )?
    .execute(params![events_stream, upto_id])?;
    Ok(())
}
