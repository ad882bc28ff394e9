//! Bringing a ledger made by an earlier release up to today's `schema.sql`, in place, at open.
//!
//! `schema.sql` is idempotent (`CREATE ... IF NOT EXISTS`), but SQLite has no
//! `ADD COLUMN IF NOT EXISTS`, and an index on a column the table lacks fails. So the open
//! step runs [`before_schema`] (add the missing column), then the schema, then
//! [`after_schema`] (backfill it). Each step first looks without writing — an up-to-date
//! ledger costs two reads and never takes the write lock, so `status` beside a busy worker
//! stays read-only — and only then changes anything, in a `BEGIN IMMEDIATE` transaction that
//! looks again: two processes opening one old ledger at once upgrade it once.
//!
//! The upgrades today:
//! - `processed_messages.submission_instant`, the UTC instant of the submission's timestamp,
//!   which conflict detection compares (`conflict.rs`);
//! - `claim_tombstones` (created by `schema.sql`), filled for a ledger that an earlier release
//!   purged: see [`backfill_tombstones`];
//! - `dead_letters.decision`, `decided_by`, `decided_reason` and `decided_at`, a reviewer's
//!   decision on a held conflict (`ledger::review`): added empty, as no earlier release could
//!   decide one.

use crate::domain::clock::instant_utc;
use crate::error::Result;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

/// Claims backfilled per step of [`after_schema`].
const BACKFILL_PAGE_ROWS: i64 = 10_000;

/// Adds `processed_messages.submission_instant` to a ledger whose table predates it. A new
/// ledger has no table yet; `schema.sql` creates it with the column.
pub(super) fn before_schema(conn: &mut Connection) -> Result<()> {
    add_decision_columns(conn)?;
    if !needs_instant_column(conn)? {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if needs_instant_column(&tx)? {
        // The index conflict detection probes (a ledger made by this release has the claim
        // index itself lead with the instant; this one keeps the claim index it had).
        tx.execute_batch(
            "ALTER TABLE processed_messages ADD COLUMN submission_instant TEXT;
             CREATE INDEX IF NOT EXISTS claim_instant
                 ON processed_messages (submission_instant, award_id, idempotency_key);",
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// True when no unique index of `processed_messages` leads with `submission_instant`: a ledger
/// made by an earlier release, whose claim index leads with the timestamp as spelled (or is
/// the key alone). Read once, by the open that records the ledger's format (`format.rs`: 2
/// when true), and by `verify`, which holds the stored format to it; the batch then knows from
/// the format where an older release's claim without an instant can be found (`batch.rs`).
pub(super) fn claims_by_spelling(conn: &Connection) -> Result<bool> {
    let by_instant: i64 = conn.query_row(
        "SELECT COUNT(*) FROM pragma_index_list('processed_messages') AS il,
                pragma_index_info(il.name) AS ii
         WHERE il.\"unique\" = 1 AND ii.seqno = 0 AND ii.name = 'submission_instant'",
        [],
        |r| r.get(0),
    )?;
    Ok(by_instant == 0)
}

/// Fills `submission_instant` for every claim that lacks it (all of them, once, after the
/// column was added; afterwards only rows an older release wrote meanwhile). A stored
/// timestamp whose instant cannot be spelled (one this release's parser would refuse) keeps
/// its own text as its instant, so it still conflicts with the same spelling, as before.
pub(super) fn after_schema(conn: &mut Connection) -> Result<()> {
    if !has_claims_without_instant(conn)? {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut upgraded = 0usize;
    loop {
        // A page at a time, so a ledger of millions of claims upgrades in bounded memory.
        let rows: Vec<(i64, String)> = tx
            .prepare_cached(
                "SELECT claim_id, submission_timestamp FROM processed_messages
                 WHERE submission_instant IS NULL LIMIT ?1",
            )?
            .query_map([BACKFILL_PAGE_ROWS], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        if rows.is_empty() {
            break;
        }
        let mut set = tx.prepare_cached(
            "UPDATE processed_messages SET submission_instant = ?2 WHERE claim_id = ?1",
        )?;
        for (claim_id, timestamp) in &rows {
            let instant = instant_utc(timestamp)
                .ok()
                .or_else(|| crate::domain::clock::leap_second_stand_in(timestamp))
                .unwrap_or_else(|| timestamp.clone());
            set.execute(rusqlite::params![claim_id, instant])?;
        }
        upgraded += rows.len();
    }
    tx.commit()?;
    log::info!("upgraded the ledger: recorded the submission instant of {upgraded} claims");
    Ok(())
}

/// True for a ledger made before tombstones: it has claims but no `claim_tombstones` table.
/// Asked before the schema runs (which creates the table), so the backfill after it runs once.
pub(super) fn needs_tombstones(conn: &Connection) -> Result<bool> {
    let tables = |name: &str| -> Result<i64> {
        Ok(conn.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get(0),
        )?)
    };
    Ok(tables("processed_messages")? == 1 && tables("claim_tombstones")? == 0)
}

/// Rebuilds tombstones in a ledger an earlier release purged (its chain starts with a
/// checkpoint), which removed claims without leaving any. What survives of each removed claim
/// is the `duplicate` records written after it, whose detail `first claimed at T` the ledger
/// wrote only after finding the claim: each such record whose key has no claim gets a
/// tombstone (key, T, purged at the leading checkpoint's time), so the purged submission stays
/// a duplicate and `verify`'s duplicate check holds. Records left by the old fast filter
/// ("seen committed by …") are not trusted for this — a planted marker wrote them for keys
/// never claimed — so `verify` names any of them whose claim is gone, for an operator to
/// review against the purge export. A claim purged with no later duplicate left no trace in
/// the ledger; its row is in that purge's export file. Idempotent: two processes opening one
/// old ledger at once insert each tombstone once.
pub(super) fn backfill_tombstones(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS upgrade_claim_keys (
             idempotency_key BLOB PRIMARY KEY) WITHOUT ROWID;
         DELETE FROM temp.upgrade_claim_keys;
         INSERT OR IGNORE INTO temp.upgrade_claim_keys SELECT idempotency_key FROM processed_messages;",
    )?;
    let rebuilt = tx.execute(
        concat!(
            "INSERT OR IGNORE INTO claim_tombstones (idempotency_key, claimed_at, purged_at)
             SELECT k, claimed_at, purged_at FROM (
                 SELECT a.seq, ",
            super::derived::key_bytes!("a.idempotency_key"),
            " AS k, substr(a.detail, 18) AS claimed_at, c.recorded_at AS purged_at
                 FROM audit_log a,
                      (SELECT kind, recorded_at FROM audit_log ORDER BY seq LIMIT 1) c
                 WHERE c.kind = 'checkpoint' AND a.kind = 'duplicate'
                   AND a.detail LIKE 'first claimed at %')
             WHERE length(k) = 32
               AND k NOT IN (SELECT idempotency_key FROM temp.upgrade_claim_keys)
             ORDER BY seq"
        ),
        [],
    )?;
    tx.execute_batch("DROP TABLE temp.upgrade_claim_keys")?;
    tx.commit()?;
    if rebuilt > 0 {
        log::info!(
            "upgraded the ledger: rebuilt {rebuilt} tombstones of claims an earlier release purged"
        );
    }
    Ok(())
}

/// The columns of a held conflict's decision, as `schema.sql` declares them.
const DECISION_COLUMNS: [&str; 4] = ["decision", "decided_by", "decided_reason", "decided_at"];

/// Adds the decision columns to a `dead_letters` table that predates them (a new ledger has no
/// table yet; `schema.sql` creates it with them). Looks first without writing.
fn add_decision_columns(conn: &mut Connection) -> Result<()> {
    if missing_decision_columns(conn)?.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let missing = missing_decision_columns(&tx)?;
    for column in &missing {
        tx.execute_batch(&format!(
            "ALTER TABLE dead_letters ADD COLUMN {column} TEXT"
        ))?;
    }
    tx.commit()?;
    if !missing.is_empty() {
        log::info!("upgraded the ledger: dead letters can record a reviewer's decision");
    }
    Ok(())
}

/// The decision columns an existing `dead_letters` table lacks (none when there is no table).
fn missing_decision_columns(conn: &Connection) -> Result<Vec<&'static str>> {
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('dead_letters')")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if columns.is_empty() {
        return Ok(Vec::new());
    }
    Ok(DECISION_COLUMNS
        .into_iter()
        .filter(|c| !columns.iter().any(|have| have == c))
        .collect())
}

/// True when `processed_messages` exists without `submission_instant`.
fn needs_instant_column(conn: &Connection) -> Result<bool> {
    let columns: i64 = conn.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('processed_messages')",
        [],
        |r| r.get(0),
    )?;
    let has: i64 = conn.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('processed_messages')
         WHERE name = 'submission_instant'",
        [],
        |r| r.get(0),
    )?;
    Ok(columns > 0 && has == 0)
}

/// True when some claim has no instant. One probe of the index leading with the instant (the
/// claim's own, or `claim_instant` in an older ledger), where NULLs sort first.
fn has_claims_without_instant(conn: &Connection) -> Result<bool> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM processed_messages WHERE submission_instant IS NULL LIMIT 1",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}
