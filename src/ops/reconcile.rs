//! `claimgate dlq reconcile`: dead letters the ledger recorded but the dead-letter stream lacks
//! are copied again.
//!
//! Why they can go missing: Redis replication is asynchronous, so a Sentinel promotion can lose
//! a dead-letter copy the old primary had taken (and an operator can delete the stream). In
//! the usual case the entry's XACK is lost with it, the entry is delivered again and the
//! worker copies it again; this repairs the rest. The ledger's `dead_letter` audit records are
//! the authority: one per dead-lettered entry id. For each, the index `<stream>:dead:index`
//! says whether a copy exists; when not, the entry is read back from the submissions stream
//! (XRANGE, which counts no delivery; one too large to read whole comes cut on the server, as
//! the worker reads it) and copied with the reason the ledger kept. An entry
//! trimmed from the stream meanwhile is copied with no original fields: the dead letter still
//! names it, its award and its reason. Copies go through the same script as the worker's, so
//! running this twice, or beside workers, never makes a second copy of one entry.

use crate::broker::dead_letter::{self, dead_index_key, DeadLetterCopy};
use crate::broker::read::{self, Limits};
use crate::broker::stream::{Conn, Entry};
use crate::config::{Config, PAYLOAD_BYTES_MAX_DEFAULT};
use crate::domain::audit::{Kind, Record};
use crate::error::Result;
use crate::ledger::AuditLog;

/// The `reason_code` of a dead letter copied again by reconciliation.
pub const RECONCILED_REASON_CODE: &str = "reconciled";

/// What one reconciliation found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    /// Dead letters the ledger records.
    pub recorded: u64,
    /// Of those, copied again now because the dead-letter stream lacked them.
    pub recopied: u64,
    /// Of those copied again, how many had lost their original fields (trimmed from the stream).
    pub without_fields: u64,
}

/// Dead-letter records asked about in one `HMGET` of the index: one round trip per this many,
/// instead of one per record.
const INDEX_LOOKUPS_PER_CALL: usize = 256;

/// Copies every dead letter `audit` records and the dead-letter stream lacks; then waits for
/// replicas as `cfg.redis_wait` says. Reads only the dead-letter records (the ledgers index
/// them) and asks the index about them [`INDEX_LOOKUPS_PER_CALL`] at a time, so its cost
/// follows the dead letters, not the size of the trail.
pub fn reconcile(conn: &mut Conn, cfg: &Config, audit: &dyn AuditLog) -> Result<Reconciled> {
    let dead_stream = cfg.dead_stream();
    let index = dead_index_key(&dead_stream);
    let mut done = Reconciled::default();
    let mut pending: Vec<Record> = Vec::with_capacity(INDEX_LOOKUPS_PER_CALL);
    audit.for_each_dead_letter(&mut |record| {
        debug_assert_eq!(
            record.kind,
            Kind::DeadLetter,
            "only dead letters are passed"
        );
        if record.kind != Kind::DeadLetter || record.stream_entry_id.is_none() {
            return Ok(());
        }
        pending.push(record);
        if pending.len() == INDEX_LOOKUPS_PER_CALL {
            recopy_missing(conn, cfg, &index, &mut pending, &mut done)?;
        }
        Ok(())
    })?;
    recopy_missing(conn, cfg, &index, &mut pending, &mut done)?;
    if done.recopied > 0 {
        conn.wait_replicated(cfg.redis_wait)?;
    }
    Ok(done)
}

/// Asks the index about `records` in one call, copies the ones it lacks, and empties
/// `records`.
fn recopy_missing(
    conn: &mut Conn,
    cfg: &Config,
    index: &str,
    records: &mut Vec<Record>,
    done: &mut Reconciled,
) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let ids = records
        .iter()
        .map(|r| r.stream_entry_id.as_deref().unwrap_or_default());
    let copies: Vec<Option<Vec<u8>>> =
        conn.query(redis::cmd("HMGET").arg(index).arg(ids.collect::<Vec<_>>()))?;
    if copies.len() != records.len() {
        return Err(crate::Error::Other(format!(
            "HMGET of {index} answered {} values for {} fields",
            copies.len(),
            records.len()
        )));
    }
    done.recorded += records.len() as u64;
    for (record, copy) in records.drain(..).zip(copies) {
        if copy.is_none() {
            recopy(conn, cfg, &record, done)?;
        }
    }
    Ok(())
}

/// Copies one dead letter the dead-letter stream lacks, with the reason the ledger kept; from
/// the submissions stream when the entry is still there (XRANGE counts no delivery), else
/// without its original fields.
fn recopy(conn: &mut Conn, cfg: &Config, record: &Record, done: &mut Reconciled) -> Result<()> {
    let id = record.stream_entry_id.as_deref().unwrap_or_default();
    let delivery_count = record.delivery_count.unwrap_or(1).max(1) as u64;
    // One entry at a time, with room for the heaviest one: reconciliation runs in the
    // worker's reader after a failover, beside its budget.
    let limits = Limits::for_payload(PAYLOAD_BYTES_MAX_DEFAULT);
    let ids = [(id.to_owned(), delivery_count)];
    let read = read::fetch(conn, &cfg.stream, &ids, limits.entry_weight_max(), &limits)?;
    let entry = (read.entries.into_iter().next())
        .unwrap_or_else(|| Entry::whole(id, Vec::new(), delivery_count));
    done.without_fields += u64::from(entry.fields.is_empty());
    let reason = record
        .detail
        .clone()
        .unwrap_or_else(|| "dead-lettered (reason not recorded)".into());
    let copy = DeadLetterCopy {
        original: &entry,
        reason: &reason,
        reason_code: RECONCILED_REASON_CODE,
        consumer: "claimgate dlq reconcile",
        source_stream: &cfg.stream,
        dead_lettered_at: &record.recorded_at,
    };
    dead_letter::copy_to_dead_letters(conn, &cfg.dead_stream(), &copy)?;
    done.recopied += 1;
    Ok(())
}
