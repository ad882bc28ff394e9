//! The relay's side of the outbox: read unpublished rows in id order, mark them published.
//!
//! SQLite has one writer at a time and `outbox.id` is AUTOINCREMENT, so ids are handed out in
//! commit order: a reader that sees row `n` has already seen every committed row below `n`.
//! The relay's exactly-once argument (see `relay.rs`) rests on that.

use crate::error::Result;
pub use crate::ledger::OutboxRow;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The oldest `limit` unpublished rows, lowest id first.
pub fn unpublished(conn: &Connection, limit: usize) -> Result<Vec<OutboxRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, event_type, payload FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT ?1",
    )?;
    let rows = stmt
        .query_map([limit as i64], |r| {
            Ok(OutboxRow {
                id: r.get(0)?,
                event_type: r.get(1)?,
                payload: r.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// Marks every unpublished row with id `<= upto_id` as published at `now`; returns how many.
pub fn mark_published(conn: &mut Connection, upto_id: i64, now: &str) -> Result<usize> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = tx
        .prepare_cached(
            "UPDATE outbox SET published_at = ?1 WHERE published_at IS NULL AND id <= ?2",
        )?
        .execute(params![now, upto_id])?;
    tx.commit()?;
    Ok(n)
}

/// This ledger file's random identity, created on first use.
pub fn ledger_id(conn: &Connection) -> Result<String> {
    let read = |conn: &Connection| {
        conn.query_row(
            "SELECT value FROM ledger_meta WHERE name = 'ledger_id'",
            [],
            |r| r.get(0),
        )
        .optional()
    };
    if let Some(id) = read(conn)? {
        return Ok(id);
    }
    // One statement, so it is atomic on its own; OR IGNORE lets two first relays race safely.
    conn.execute(
        "INSERT OR IGNORE INTO ledger_meta (name, value) VALUES ('ledger_id', lower(hex(randomblob(16))))",
        [],
    )?;
    Ok(read(conn)?.expect("just inserted"))
}
