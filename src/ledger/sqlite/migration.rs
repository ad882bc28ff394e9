//! The SQLite side of `claimgate migrate` beyond the row dump (`dump.rs`): the ledger held
//! exclusively while it is copied, the rows the PostgreSQL ledger could not hold named before
//! anything is copied, and the fence left behind.
//!
//! **Invariant:** a ledger being migrated is held with the exclusive lock `restore` takes
//! (`lock.rs`): no claimgate process has it open while it is read, so nothing can be paid into
//! it after the copy's snapshot. Once copied and verified it is fenced (`ledger_meta`
//! `migrated_to`, `migrated_at`): `run`, `relay` and `init` refuse it (exit 2, naming where it
//! went), so a node someone forgot to repoint cannot go on paying into the old file — a split
//! ledger. Everything else may still read it.

use super::fence::fenced;
use super::ledger::{Locking, SqliteLedger};
use crate::config::{LedgerConfig, SqliteSettings};
use crate::error::Result;
use rusqlite::Connection;

/// The longest `award_id` the copy takes into a column PostgreSQL indexes (claims, holds):
/// any value up to this fits a btree entry whatever its bytes (one holds at most 2,704, and a
/// compressible value may fit beyond this, an incompressible one may not). Today's releases
/// refuse an award id over 1,024 bytes as malformed; earlier ones took any length.
pub const INDEXED_TEXT_BYTES_MAX: usize = 2_000;

/// Rows of the PostgreSQL ledger's text columns that one statement per table finds: (table,
/// how a row is named, its text columns). Not the audit digests (`prev_hash`, `hash`): format 5
/// stores them as raw bytes, which hold NULs, and they are copied as the hex they stand for
/// (`derived::digest_hex`); a digest edited into text with a NUL is not a record claimgate
/// sealed, and the copy's verification refuses the chain. The audit key is raw bytes from
/// format 6 on, so only a key stored as text is looked at ([`AUDIT_KEY_WITH_NUL`]). Nor the
/// outbox's and disbursements' derived columns, which are NULL where derived and copied as
/// their claim's.
const TEXT_COLUMNS: [(&str, &str, &[&str]); 8] = [
    (
        "processed_messages",
        "'claim ' || claim_id",
        &[
            "award_id",
            "submission_timestamp",
            "claimed_at",
            "stream_entry_id",
            "consumer",
            "submission_instant",
        ],
    ),
    (
        "disbursements",
        "'disbursement of claim ' || claim_id",
        &["award_id", "recorded_at"],
    ),
    (
        "outbox",
        "'outbox row ' || id",
        &["event_type", "payload", "created_at", "published_at"],
    ),
    (
        "dead_letters",
        "'dead letter ' || stream_entry_id",
        &[
            "stream",
            "reason_code",
            "reason",
            "award_id",
            "recorded_at",
            "decision",
            "decided_by",
            "decided_reason",
            "decided_at",
        ],
    ),
    (
        "audit_log",
        "'audit record ' || seq",
        &[
            "kind",
            "award_id",
            "stream_entry_id",
            "consumer",
            "detail",
            "recorded_at",
        ],
    ),
    (
        "claim_tombstones",
        "'tombstone ' || lower(hex(idempotency_key))",
        &["claimed_at", "purged_at"],
    ),
    (
        "legal_holds",
        "'hold ' || rowid",
        &["award_id", "reason", "held_at"],
    ),
    ("ledger_meta", "'ledger_meta ' || rowid", &["name", "value"]),
];

/// Audit records whose key is text holding a NUL (a key stored as bytes is copied as its hex).
const AUDIT_KEY_WITH_NUL: &str = "SELECT 'audit record ' || seq FROM audit_log
     WHERE typeof(idempotency_key) = 'text' AND instr(CAST(idempotency_key AS BLOB), x'00') > 0";

/// Rows named at most, per kind of problem.
const NAMED_MAX: usize = 20;

impl SqliteLedger {
    /// Opens the ledger in the file `cfg.backend.path`, which must exist, holding the exclusive
    /// lock: refused (exit 1, saying so) while any claimgate process has it open.
    pub fn open_exclusively(cfg: &LedgerConfig<SqliteSettings>) -> Result<SqliteLedger> {
        SqliteLedger::open_locked(cfg, Locking::Exclusive)
    }

    /// Every row the PostgreSQL ledger could not hold, named with the reason: a NUL in any
    /// text (PostgreSQL's text type has none), an award id over [`INDEXED_TEXT_BYTES_MAX`] in
    /// a column it indexes. Empty when every row can be copied.
    pub fn rows_postgres_refuses(&self) -> Result<Vec<String>> {
        let conn = self.conn()?;
        let mut found = Vec::new();
        for (table, name, columns) in TEXT_COLUMNS {
            for column in columns {
                let sql = format!(
                    "SELECT {name} FROM {table}
                     WHERE instr(CAST({column} AS BLOB), x'00') > 0 LIMIT {NAMED_MAX}"
                );
                for row in rows_named(&conn, &sql)? {
                    found.push(format!(
                        "{row}: its {column} holds a NUL character, which PostgreSQL's text \
                         type cannot hold"
                    ));
                }
            }
        }
        for row in rows_named(&conn, &format!("{AUDIT_KEY_WITH_NUL} LIMIT {NAMED_MAX}"))? {
            found.push(format!(
                "{row}: its idempotency_key holds a NUL character, which PostgreSQL's text \
                 type cannot hold"
            ));
        }
        for (table, name) in [
            ("processed_messages", "'claim ' || claim_id"),
            ("legal_holds", "'hold ' || rowid"),
        ] {
            let sql = format!(
                "SELECT {name} || ' (' || length(CAST(award_id AS BLOB)) || ' bytes)' FROM {table}
                 WHERE length(CAST(award_id AS BLOB)) > {INDEXED_TEXT_BYTES_MAX} LIMIT {NAMED_MAX}"
            );
            for row in rows_named(&conn, &sql)? {
                found.push(format!(
                    "{row}: its award_id is over the {INDEXED_TEXT_BYTES_MAX} bytes a \
                     PostgreSQL index entry is sure to hold"
                ));
            }
        }
        Ok(found)
    }

    /// Where this ledger was migrated to, and when, if it was.
    pub fn migrated_to(&self) -> Result<Option<(String, String)>> {
        fenced(&*self.conn()?)
    }

    /// Fences this ledger: it was copied to `to` (a URL with its password removed) at `at`.
    pub fn fence(&self, to: &str, at: &str) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for (name, value) in [("migrated_to", to), ("migrated_at", at)] {
            tx.execute(
                "INSERT INTO ledger_meta (name, value) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                [name, value],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}

/// The first column of every row `sql` returns.
fn rows_named(conn: &Connection, sql: &str) -> Result<Vec<String>> {
    let mut st = conn.prepare(sql)?;
    let rows = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}
