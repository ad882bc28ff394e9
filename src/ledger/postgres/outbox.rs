//! The relay's side of the outbox on PostgreSQL: rows in id order above a position, marking
//! them published.
//!
//! # Why PostgreSQL keeps contract point 5 (rows become visible in id order)
//! With several writers, a sequence would hand out ids when rows are inserted, and those rows
//! would become visible when their transactions commit — in another order, so a relay that has
//! read id `n` could later see `n - 1` appear and skip it. Here a batch writes its outbox rows
//! with no ids (numbered only within the batch), and they get ids when the batch is *linked*
//! (`claimgate_link`, `schema_postgres.sql`): the batch's `outbox_first` is the next after
//! `chain_head.outbox_id_last`, read with `SELECT … FOR UPDATE` and advanced in the same
//! one-statement transaction. The row lock is held until that transaction commits, so the next
//! link waits for the commit and then reads the advanced value (the statements after the lock
//! take a new snapshot). A transaction is visible to new snapshots before its locks are
//! released, so when a later link commits, every earlier link is already visible: any snapshot
//! that shows id `n` shows every id below `n` that will ever exist (a row is read here only
//! through its batch's link, and the batch's rows committed before it could be linked).
//! `outbox_id_last` never decreases (a purge leaves it), so ids are never reused. Rows written
//! by earlier releases, and rows `migrate` copied, keep the ids they have, all below every
//! batch's.
//!
//! # Durable before published
//! A link commits without waiting for its WAL to reach the disk (the chain-head lock is never
//! held across a disk write), so a link just read could still be lost in a server crash, and
//! its batch linked again later at other ids. The rows this returns are therefore made durable
//! first (`make_durable`): the relay only ever publishes ids no crash can take back.
//!
//! # A batch left unlinked
//! A writer stopped between its batch's commit and the link leaves rows no relay can publish
//! yet. A writer links only its own batch, so another writer's next batch does not place them;
//! a node's start does (`run` or `relay` opening the ledger), and, so that a ledger whose
//! nodes keep running does not keep them waiting, a relay round that finds a batch unlinked
//! for longer than [`UNLINKED_GRACE_MS`] links it first.

use super::ledger::PgLedger;
use crate::error::Result;
use crate::ledger::{Outbox, OutboxRow};

/// How long a committed batch may stay unlinked before a relay round links it: its own writer
/// links it within milliseconds unless it stopped in between.
pub const UNLINKED_GRACE_MS: u64 = 1_000;

/// A row's event: the one it stored (an earlier format's row, a migrated one), else spelled
/// from its claim (a batch's row stores none: `write::COPY_OUTBOX`); NULL only if the claim is
/// gone, which [`event_of`] refuses. `o` is the row, `c` its claim (a LEFT JOIN).
macro_rules! event_columns {
    () => {
        "COALESCE(o.event_type, 'disbursement.recorded'),
         COALESCE(o.payload, claimgate_event(c.award_id, c.amount_cents, c.idempotency_key,
                                             c.submission_timestamp))"
    };
}

/// Rows with ids above `$1`: earlier releases' and migrated rows first (their ids are below
/// every batch's), then linked batches' in id order.
const ROWS_STORED: &str = concat!(
    "SELECT o.id, ",
    event_columns!(),
    " FROM outbox_rows o LEFT JOIN processed_messages c ON c.claim_id = o.claim_id
     WHERE o.id > $1 ORDER BY o.id LIMIT $2"
);
const ROWS_LINKED: &str = concat!(
    "SELECT b.outbox_first + o.batch_index - 1, ",
    event_columns!(),
    " FROM audit_batches b JOIN outbox_rows o ON o.batch_id = b.batch_id
     LEFT JOIN processed_messages c ON c.claim_id = o.claim_id
     WHERE b.link_seq IS NOT NULL AND b.outbox_count > 0
       AND b.outbox_first + b.outbox_count > $1::int8 + 1
       AND o.batch_index > $1::int8 - b.outbox_first + 1
     ORDER BY b.outbox_first + b.outbox_count, o.batch_index LIMIT $2"
);

/// A row of [`ROWS_STORED`] or [`ROWS_LINKED`]. A row whose event can be neither read nor
/// spelled (no stored event, no claim) is refused: publishing past it would lose its id.
fn event_of(r: &postgres::Row) -> Result<OutboxRow> {
    let id: i64 = r.try_get(0)?;
    let payload: Option<String> = r.try_get(2)?;
    let payload = payload.ok_or_else(|| {
        crate::error::Error::Invariant(format!(
            "outbox row {id} stores no event and its claim is gone, so its event cannot be \
             spelled: run `claimgate verify`"
        ))
    })?;
    Ok(OutboxRow {
        id,
        event_type: r.try_get(1)?,
        payload,
    })
}

impl Outbox for PgLedger {
    fn rows_after(&self, after_id: i64, limit: usize) -> Result<Vec<OutboxRow>> {
        let mut conn = self.conn()?;
        link_stale(&mut conn)?;
        let stored = conn.prepared(ROWS_STORED)?;
        let mut rows: Vec<OutboxRow> = conn
            .client
            .query(&stored, &[&after_id, &(limit as i64)])?
            .iter()
            .map(event_of)
            .collect::<Result<_>>()?;
        if rows.len() < limit {
            let after = rows.last().map_or(after_id, |r| r.id);
            let linked = conn.prepared(ROWS_LINKED)?;
            let more = (limit - rows.len()) as i64;
            for r in conn.client.query(&linked, &[&after, &more])?.iter() {
                rows.push(event_of(r)?);
            }
        }
        // The ids are the relay's event ids: only those of links a crash cannot undo leave.
        super::ledger::make_durable(&mut conn.client)?;
        Ok(rows)
    }

    /// One row in `outbox_published` (`schema_postgres.sql`) when the highest id published
    /// advances, none when it does not: rows are written once and never updated. The rows
    /// marked are those between the last publication and `upto_id` (capped at the last id
    /// given): stored rows counted through the id index, linked batches' from their
    /// `audit_batches` rows alone. Two relays marking at the same moment may both advance it
    /// (each statement reads the last publication before the other commits); each row still
    /// reads as published, at the time of the lower publication that covers it.
    fn mark_published(&self, upto_id: i64, now: &str, events_stream: &str) -> Result<u64> {
        let mut conn = self.conn()?;
        // The stream's mark in `ledger_meta` moves in the same statement, so atomically
        // (retention reads it: `retention.rs`).
        let st = conn.prepared(
            "WITH last AS (
                 SELECT (SELECT COALESCE(MAX(upto_id), 0) FROM outbox_published) AS was,
                        LEAST($2, outbox_id_last) AS upto
                 FROM chain_head WHERE id = 1
             ), added AS (
                 INSERT INTO outbox_published (upto_id, published_at)
                 SELECT upto, $1 FROM last WHERE upto > was
                 ON CONFLICT (upto_id) DO NOTHING
                 RETURNING upto_id
             ), noted AS (
                 INSERT INTO ledger_meta (name, value)
                 VALUES ('published_upto:' || $3, (SELECT upto FROM last)::text)
                 ON CONFLICT (name) DO UPDATE
                     SET value = GREATEST(ledger_meta.value::bigint, EXCLUDED.value::bigint)::text
             )
             SELECT (SELECT COUNT(*) FROM outbox_rows o, last, added
                     WHERE o.id > last.was AND o.id <= added.upto_id AND o.published_at IS NULL)
                  + (SELECT COALESCE(SUM(LEAST(b.outbox_first + b.outbox_count - 1, added.upto_id)
                                         - GREATEST(b.outbox_first, last.was + 1) + 1), 0)::int8
                     FROM audit_batches b, last, added
                     WHERE b.link_seq IS NOT NULL AND b.outbox_count > 0
                       AND b.outbox_first + b.outbox_count > last.was + 1
                       AND b.outbox_first <= added.upto_id)",
        )?;
        let n: i64 = conn
            .client
            .query_one(&st, &[&now, &upto_id, &events_stream])?
            .get(0);
        Ok(n as u64)
    }
    fn ledger_id(&self) -> Result<String> {
        let mut conn = self.conn()?;
        crate::support::failpoint::hit("pg_ledger_id");
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

    fn ledger_id_made(&self) -> Result<Option<String>> {
        let row = self.conn()?.client.query_opt(
            "SELECT value FROM ledger_meta WHERE name = 'ledger_id'",
            &[],
        )?;
        Ok(row.map(|r| r.get(0)))
    }

    /// The stream's own mark; else, for a ledger whose relays recorded none (an earlier
    /// release's), the highest publication (an upgrade records the rows marked one by one as
    /// one: `claimgate_note_published`). Added for the relay's check of a stream standing
    /// below the ledger (issue 39).
    fn published_id_max(&self, events_stream: &str) -> Result<i64> {
        let mut conn = self.conn()?;
        let row = conn.client.query_one(
            "SELECT (SELECT value::bigint FROM ledger_meta WHERE name = 'published_upto:' || $1),
                    EXISTS (SELECT 1 FROM ledger_meta WHERE name LIKE 'published\\_upto:%'),
                    (SELECT COALESCE(MAX(upto_id), 0) FROM outbox_published)",
            &[&events_stream],
        )?;
        Ok(
            match (row.get::<_, Option<i64>>(0), row.get::<_, bool>(1)) {
                (Some(upto), _) => upto,
                (None, true) => 0,
                (None, false) => row.get(2),
            },
        )
    }

    /// The head's counter, not `MAX(id)`: ids are numbered from it under the head lock and it
    /// only grows, so it still counts rows a purge removed. Read without the lock: a link that
    /// has numbered rows but not committed has not advanced it for anyone else yet, and its
    /// rows have no ids for anyone else either.
    fn outbox_id_max(&self) -> Result<i64> {
        let mut conn = self.conn()?;
        let row = conn
            .client
            .query_one("SELECT outbox_id_last FROM chain_head WHERE id = 1", &[])?;
        Ok(row.get(0))
    }
}

/// Links the batches left unlinked for longer than [`UNLINKED_GRACE_MS`], if there are any (one
/// probe of the unlinked batches' index when there are none).
fn link_stale(conn: &mut super::connect::Conn) -> Result<()> {
    let st = conn.prepared(
        "SELECT EXISTS (SELECT 1 FROM audit_batches WHERE link_seq IS NULL AND created_at < $1)",
    )?;
    let before =
        crate::domain::clock::ago_rfc3339(std::time::Duration::from_millis(UNLINKED_GRACE_MS));
    if conn.client.query_one(&st, &[&before])?.get(0) {
        let n = super::link::link(conn, None)?;
        log::warn!(
            "linked {n} committed batch(es) that had waited over {UNLINKED_GRACE_MS} ms for \
             their link (a writer stopped between its commit and its link)"
        );
    }
    Ok(())
}
