//! `Ledger::stats` without counting the whole ledger on every call.
//!
//! `/metrics` asks for the ledger's counts on every scrape. Counted from scratch, that is a
//! pass over the claims, the disbursements and the audit trail each time: about 0.7 s on a
//! ledger of 1,000,000 claims (BENCHMARKS.md), so a scrape every 15 s would cost a growing share
//! of the box, and a ledger kept for years would outgrow the scrape timeout. A [`Tally`] keeps
//! the counts and, for each counted table, the highest row id it has counted; the next call
//! counts only the rows above those, in one read transaction.
//!
//! **Invariant:** between purges, rows are only ever added to these tables, each above every
//! committed row's id: claims, disbursements (keyed by their claim) and dead letters take
//! `max(rowid) + 1` in a transaction that holds the write lock, and audit records take the next
//! AUTOINCREMENT `seq`. A rolled-back batch gives its ids back, but nothing committed was above
//! them. The one thing that deletes rows, or writes a record below the highest `seq` (its
//! checkpoint), is a retention purge, and every purge transaction moves
//! [`super::conflict::PURGES_META`]: a tally that sees it moved starts again from zero.
//! Tombstones are written only by purges (and by the upgrade at open, before any tally), so
//! they are counted only when the tally starts again.

use crate::error::Result;
use crate::ledger::Counts;
use rusqlite::Connection;

/// The ledger's counts as of the last call, and how far each table was counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// [`super::conflict::PURGES_META`] when counted.
    purges: i64,
    /// The highest audit `seq`, claim id, disbursement claim id and dead-letter rowid counted.
    seq_seen: i64,
    claim_id_seen: i64,
    disbursement_seen: i64,
    dead_letter_seen: i64,
    /// The counts.
    pub(super) counts: Counts,
}

impl Tally {
    /// Brings `last` (if any) up to the ledger `conn` reads, or counts everything when there is
    /// no tally yet or a purge happened since. Call inside one read transaction, so every count
    /// comes from one snapshot.
    pub(super) fn of(conn: &Connection, last: Option<Tally>) -> Result<Tally> {
        let purges = super::conflict::purges(conn)?;
        let mut t = match last {
            Some(t) if t.purges == purges => t,
            _ => {
                let tombstones: i64 =
                    conn.query_row("SELECT COUNT(*) FROM claim_tombstones", [], |r| r.get(0))?;
                Tally {
                    purges,
                    counts: Counts {
                        tombstones: tombstones as u64,
                        ..Counts::default()
                    },
                    ..Tally::default()
                }
            }
        };
        // Each: the rows above the mark, and the new mark (the mark itself when there are none).
        let (n, seq, duplicates, conflicts, vanished): (i64, Option<i64>, i64, i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), MAX(seq), COALESCE(SUM(kind = 'duplicate'), 0),
                        COALESCE(SUM(kind = 'conflict'), 0), COALESCE(SUM(kind = 'vanished'), 0)
                 FROM audit_log WHERE seq > ?1",
                [t.seq_seen],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )?;
        t.counts.audit_records += n as u64;
        t.counts.duplicates += duplicates as u64;
        t.counts.conflicts += conflicts as u64;
        t.counts.vanished += vanished as u64;
        t.seq_seen = seq.unwrap_or(t.seq_seen);
        let (n, claim_id) = above(
            conn,
            "SELECT COUNT(*), MAX(claim_id) FROM processed_messages WHERE claim_id > ?1",
            t.claim_id_seen,
        )?;
        t.counts.claims += n;
        t.claim_id_seen = claim_id;
        // The amounts summed in two halves that cannot overflow, joined in an i128: SQLite's
        // SUM stops with "integer overflow" past i64 and TOTAL rounds to a float. The high 32
        // bits of each (under 2^31) and the low 32 bits (under 2^32), summed apart, are exact
        // for fewer than 2^31 rows.
        let (n, claim_id, high, low): (i64, Option<i64>, i64, i64) = conn.query_row(
            "SELECT COUNT(*), MAX(claim_id), COALESCE(SUM(amount_cents >> 32), 0),
                    COALESCE(SUM(amount_cents & 4294967295), 0)
             FROM disbursements WHERE claim_id > ?1",
            [t.disbursement_seen],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        t.counts.disbursements += n as u64;
        t.counts.disbursed_cents_total += (i128::from(high) << 32) + i128::from(low);
        t.disbursement_seen = claim_id.unwrap_or(t.disbursement_seen);
        let (n, rowid) = above(
            conn,
            "SELECT COUNT(*), MAX(rowid) FROM dead_letters WHERE rowid > ?1",
            t.dead_letter_seen,
        )?;
        t.counts.dead_letters += n;
        t.dead_letter_seen = rowid;
        Ok(t)
    }
}

/// `(COUNT(*), MAX(id))` of the rows `sql` selects above `mark` (its `?1`); the mark again
/// when there are none.
fn above(conn: &Connection, sql: &str, mark: i64) -> Result<(u64, i64)> {
    let (n, max): (i64, Option<i64>) =
        conn.query_row(sql, [mark], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((n as u64, max.unwrap_or(mark)))
}
