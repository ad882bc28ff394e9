//! The relay's side of the outbox on PostgreSQL: rows in id order above a position, marking
//! them published.
//!
//! # Why PostgreSQL keeps contract point 5 (rows become visible in id order)
//! With several writers, a sequence would hand out ids when rows are inserted, and those rows
//! would become visible when their transactions commit — in another order, so a relay that has
//! read id `n` could later see `n - 1` appear and skip it. Here ids are not drawn from a
//! sequence: a batch numbers its outbox rows after `chain_head.outbox_id_last`, which it reads
//! with `SELECT … FOR UPDATE` and advances in the same transaction (`batch.rs`, step 5). The
//! row lock is held until the batch commits, so the next batch to number rows waits for that
//! commit and then reads the advanced value (READ COMMITTED re-reads a row updated by the
//! transaction it waited for). A transaction is visible to new snapshots before its locks are
//! released, so when a later batch commits, every earlier-numbered batch is already visible:
//! any snapshot that shows id `n` shows every committed id below `n`, and no id below `n` can
//! commit afterwards. `outbox_id_last` never decreases (a purge leaves it), so ids are never
//! reused.

use super::PgLedger;
use crate::error::Result;
use crate::ledger::{Outbox, OutboxRow};

impl Outbox for PgLedger {
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
        let mut conn = self.conn()?;
        let st = conn.prepared(
            "SELECT id, event_type, payload FROM outbox WHERE id > $1 ORDER BY id LIMIT $2",
        )?;
        Ok(conn
            .client
            .query(&st, &[&after_id, &(limit as i64)])?
            .iter()
            .map(|r| OutboxRow {
                id: r.get(0),
                event_type: r.get(1),
                payload: r.get(2),
            })
            .collect())
    }

    fn mark_published(&self, upto_id: i64, now: &str) -> Result<u64> {
        let mut conn = self.conn()?;
        let st = conn.prepared(
            "UPDATE outbox SET published_at = $1 WHERE published_at IS NULL AND id <= $2",
        )?;
        Ok(conn.client.execute(&st, &[&now, &upto_id])?)
    }

    fn ledger_id(&self) -> Result<String> {
        let mut conn = self.conn()?;
        // One statement, atomic on its own; ON CONFLICT lets two first relays race safely.
        conn.client.execute(
            "INSERT INTO ledger_meta (name, value)
             VALUES ('ledger_id', replace(gen_random_uuid()::text, '-', ''))
             ON CONFLICT (name) DO NOTHING",
            &[],
        )?;
        let row = conn.client.query_one(
            "SELECT value FROM ledger_meta WHERE name = 'ledger_id'",
            &[],
        )?;
        Ok(row.get(0))
    }

    /// The head's counter, not `MAX(id)`: ids are numbered from it under the head lock and it
    /// only grows, so it still counts rows a purge removed. Read without the lock: a batch
    /// that has numbered rows but not committed has not advanced it for anyone else yet, and
    /// its rows are not visible either.
    fn outbox_id_max(&self) -> Result<i64> {
        let mut conn = self.conn()?;
        let row = conn
            .client
            .query_one("SELECT outbox_id_last FROM chain_head WHERE id = 1", &[])?;
        Ok(row.get(0))
    }
}
