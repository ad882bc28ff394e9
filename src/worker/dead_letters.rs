//! Copies to the dead-letter stream `<stream>:dead`: rejected entries before their batch's
//! commit, entries the ledger held for review (`--on-conflict hold`) after it.
//!
//! **Invariant:** every copy is made, and retried until Redis takes it, before the XACK of its
//! entry; a crash in between leaves the entry pending, and its redelivery finds the first copy
//! (one copy per original id). The fields a copy carries are built in one place, [`copy`].

use super::parse::{Parsed, Verdict};
use super::shared::Shared;
use crate::broker::dead_letter::{self, DeadLetterCopy};
use crate::broker::stream::{Conn, Entry};
use crate::domain::clock::now_rfc3339;
use crate::domain::submission;
use crate::error::{Error, Result};
use crate::ledger::Outcome;

/// Copies every rejected entry of `batch`, before the transaction that records it.
pub(super) fn copy_rejected(batch: &[Parsed], conn: &mut Conn, shared: &Shared<'_>) -> Result<()> {
    for p in batch {
        if let Verdict::Rejected(r) = &p.verdict {
            let what = "copying an entry to the dead-letter stream";
            copy(conn, shared, what, &r.entry, r.code, &r.reason)?;
        }
    }
    Ok(())
}

/// Copies entries the ledger held for review (`--on-conflict hold`) to the dead-letter stream.
/// This runs after the commit that recorded the hold and before the XACK: a crash in between
/// leaves the entry pending, and its redelivery is held again and copied (once per id).
pub(super) fn copy_held(
    batch: &[Parsed],
    outcomes: &[Option<Outcome>],
    conn: &mut Conn,
    shared: &Shared<'_>,
) -> Result<()> {
    for (p, outcome) in batch.iter().zip(outcomes) {
        let (Verdict::Valid(s), Some(Outcome::Held { other_key, .. })) = (&p.verdict, outcome)
        else {
            continue;
        };
        // The submission keeps its payload, the one field a valid entry needs.
        let entry = Entry::whole(
            p.id.clone(),
            vec![(submission::PAYLOAD_FIELD.to_vec(), s.payload.clone())],
            p.delivery_count,
        );
        let reason = format!(
            "conflicts with key {other_key} for the same award and submission time; held for review"
        );
        let what = "copying a held entry to the dead-letter stream";
        copy(conn, shared, what, &entry, "conflict_hold", &reason)?;
    }
    Ok(())
}

/// Copies `entry` to the dead-letter stream with its reason, under the shared retry policy
/// (failures logged as `what`). The time is taken once, so a retried copy keeps it.
fn copy(
    conn: &mut Conn,
    shared: &Shared<'_>,
    what: &str,
    entry: &Entry,
    reason_code: &str,
    reason: &str,
) -> Result<()> {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    let dead_lettered_at = now_rfc3339();
    let letter = DeadLetterCopy {
        original: entry,
        reason,
        reason_code,
        consumer: &wcfg.consumer,
        source_stream: &cfg.stream,
        dead_lettered_at: &dead_lettered_at,
    };
    let dead_stream = cfg.dead_stream();
    shared
        .retry(what, || {
            dead_letter::copy_to_dead_letters(conn, &dead_stream, &letter)?;
            // Before the XACK: a copy only the primary held would go with it in a failover.
            conn.wait_replicated(cfg.redis_wait)
        })
        .map_err(|e| {
            if e.is_transient() {
                return e;
            }
            // Permanent (a key of the wrong type where the stream must be, a refused
            // permission): the message that stops the worker says where it failed.
            Error::Other(format!(
                "copying entry {} to the dead-letter stream {dead_stream}: {e}",
                entry.id
            ))
        })?;
    Ok(())
}
