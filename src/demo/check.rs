//! The demo's "ledger verified": invariants checked with plain SQL on the ledger file, plus the
//! audit chain, plus the totals the feed promised. Read-only.

use super::data::Expected;
use crate::domain::audit::{self, Kind};
use crate::error::Result;
use rusqlite::Connection;

/// One check and how it came out.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked, in words.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

fn check(what: &str, ok: bool, detail: String) -> Check {
    Check {
        what: what.to_owned(),
        ok,
        detail,
    }
}

fn count(conn: &Connection, sql: &str) -> Result<i64> {
    Ok(conn
        .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))?
        .unwrap_or(0))
}

/// Runs every check. `received` is the submissions stream's length in Redis.
pub fn verify(conn: &Connection, expected: &Expected, received: u64) -> Result<Vec<Check>> {
    let claims = count(conn, "SELECT COUNT(*) FROM processed_messages")?;
    let disbursements = count(conn, "SELECT COUNT(*) FROM disbursements")?;
    let outbox = count(conn, "SELECT COUNT(*) FROM outbox")?;
    let cents = count(conn, "SELECT SUM(amount_cents) FROM disbursements")?;
    let double_paid = count(
        conn,
        "SELECT COUNT(*) FROM (SELECT idempotency_key FROM disbursements
         GROUP BY idempotency_key HAVING COUNT(*) > 1)",
    )?;
    let mismatched = count(
        conn,
        "SELECT COUNT(*) FROM disbursements d JOIN processed_messages p USING (claim_id)
         WHERE d.amount_cents <> p.amount_cents OR d.award_id <> p.award_id
            OR d.idempotency_key <> p.idempotency_key",
    )?;
    let dead = count(conn, "SELECT COUNT(*) FROM dead_letters")?;
    let accounted = count(
        conn,
        "SELECT COUNT(DISTINCT stream_entry_id) FROM audit_log
         WHERE kind IN ('processed', 'duplicate', 'dead_letter')",
    )?;
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    let records = crate::ledger::sqlite::audit_store::all(conn)?;
    let processed_records = records.iter().filter(|r| r.kind == Kind::Processed).count() as i64;
    let chain = audit::verify_chain(&records);
    Ok(vec![
        check("SQLite integrity_check", integrity == "ok", integrity),
        check(
            "one disbursement and one outbox row per claim",
            claims == disbursements && claims == outbox,
            format!("{claims} claims, {disbursements} disbursements, {outbox} outbox rows"),
        ),
        check(
            "no submission paid twice",
            double_paid == 0,
            format!("{double_paid} keys with more than one disbursement"),
        ),
        check(
            "every disbursement matches its claim",
            mismatched == 0,
            format!("{mismatched} mismatches"),
        ),
        check(
            "every distinct submission paid",
            claims as u64 == expected.unique,
            format!(
                "{claims} paid, {} distinct submissions sent",
                expected.unique
            ),
        ),
        check(
            "total equals the sum of distinct submissions",
            cents == expected.cents_total,
            format!("{cents} cents paid, {} cents sent", expected.cents_total),
        ),
        check(
            "every malformed entry dead-lettered",
            dead as usize == expected.malformed_codes.len(),
            format!(
                "{dead} dead letters, {} malformed entries sent",
                expected.malformed_codes.len()
            ),
        ),
        check(
            "every stream entry accounted for in the audit trail",
            accounted as u64 == received,
            format!("{accounted} of {received} entries"),
        ),
        match chain {
            Ok(n) => check(
                "audit chain intact, one processed record per disbursement",
                processed_records == disbursements,
                format!("{n} records, {processed_records} processed"),
            ),
            Err(b) => check(
                "audit chain intact",
                false,
                format!("broken at seq {}: {}", b.seq, b.reason),
            ),
        },
    ])
}

/// After the relay: every outbox row published, and exactly one event per row on the stream.
pub fn events(conn: &Connection, events_on_stream: u64) -> Result<Check> {
    let rows = count(conn, "SELECT COUNT(*) FROM outbox")?;
    let unpublished = count(
        conn,
        "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL",
    )?;
    Ok(check(
        "one event published per disbursement",
        unpublished == 0 && events_on_stream == rows as u64,
        format!("{events_on_stream} events for {rows} outbox rows, {unpublished} unpublished"),
    ))
}

/// What `claimgate verify` says of the ledger (its own invariants and the audit chain).
pub fn claimgate_verify(db: &std::path::Path) -> Check {
    let verdict =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(crate::Error::from)
            .and_then(|mut conn| crate::ops::verify::ledger(&mut conn));
    match verdict {
        Ok(s) => check(
            "claimgate verify",
            true,
            format!(
                "{} claims, {} audit records, chain head {}",
                s.claims,
                s.audit_records,
                &s.head_hash[..12.min(s.head_hash.len())]
            ),
        ),
        Err(e) => check("claimgate verify", false, e.to_string()),
    }
}

/// Dead letters by reason code: (code, count, one example reason), most frequent first.
pub fn dead_letter_reasons(conn: &Connection) -> Result<Vec<(String, i64, String)>> {
    let mut stmt = conn.prepare(
        "SELECT reason_code, COUNT(*), MIN(reason) FROM dead_letters
         GROUP BY reason_code ORDER BY COUNT(*) DESC, reason_code",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Duplicates split into producer resends (stream entries that were never processed
/// themselves: the content had already been paid) and redeliveries after the crash (everything
/// else: entries processed, or found to be duplicates, whose XACK the crash prevented).
pub fn duplicate_sources(conn: &Connection) -> Result<(i64, i64)> {
    let resent = count(
        conn,
        "SELECT COUNT(DISTINCT d.stream_entry_id) FROM audit_log d WHERE d.kind = 'duplicate'
         AND NOT EXISTS (SELECT 1 FROM audit_log p
                         WHERE p.kind = 'processed' AND p.stream_entry_id = d.stream_entry_id)",
    )?;
    let all = count(
        conn,
        "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'",
    )?;
    Ok((resent, all - resent))
}
