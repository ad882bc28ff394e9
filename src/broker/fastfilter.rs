//! `--fast-filter`: a Redis front-line filter for duplicates that cannot lose a submission.
//!
//! The reference design's guide suggests `SET key NX EX ttl` in Redis *before* processing.
//! Taken literally that loses data: a key set before a commit that never happens makes the
//! redelivery look like a duplicate, and the disbursement is never made. Here a marker is
//! written only *after* the ledger transaction covering its key has committed, so:
//!
//! - a hit is a hint that the key was committed: the ledger confirms it inside the batch
//!   transaction (a claim or a tombstone of the key: one lookup instead of an attempted insert)
//!   and records the duplicate; a hit it cannot confirm — a marker planted by someone who can
//!   write Redis, or one left from a ledger since lost — is logged at WARN and the submission is
//!   processed normally (`ledger::Item::KnownDuplicate`);
//! - a miss, an expired marker, or any Redis error means "ask the ledger", which stays the
//!   only authority. The filter can make the worker faster or slower, never wrong.
//!
//! Markers are scoped to the stream and consumer group, which share one ledger, and named under
//! the stream's own key (`<stream>:committed:<group>:<key>`, like `<stream>:dead`), so the key
//! pattern that lets an ACL user read the stream (`~grants:*`) covers them too. Markers written
//! by releases before this naming (`claimgate:committed:*`) are never read again: each is at
//! worst a miss, answered by the ledger, until its TTL removes it. A marker outliving the commit
//! it vouches for (after a restore from a backup) is caught the same way as a planted one.
//!
//! Invariant: no marker is written before the transaction covering its key has committed;
//! a Redis failure here never fails a batch.

use crate::broker::stream::Conn;
use crate::domain::key::IdempotencyKey;
use log::{info, warn};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Default lifetime of a marker: long enough to cover redeliveries and producer retries.
pub const FAST_FILTER_TTL_S_DEFAULT: u64 = 24 * 60 * 60;

/// Where markers live and how long they last.
#[derive(Debug, Clone)]
pub struct FastFilter {
    /// `<stream>:committed:<group>:`, followed by the key in hex.
    prefix: String,
    /// Marker lifetime in seconds.
    ttl_s: u64,
    /// True while Redis fails the filter's commands: one WARN when that starts and one INFO
    /// when it ends, not one per batch (shared by every clone: the parse threads and the acker).
    failing: Arc<AtomicBool>,
}

impl FastFilter {
    /// A filter for one stream and consumer group.
    pub fn new(stream: &str, group: &str, ttl_s: u64) -> FastFilter {
        FastFilter {
            prefix: format!("{stream}:committed:{group}:"),
            ttl_s: ttl_s.max(1),
            failing: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The marker's Redis key for `key`.
    pub fn marker(&self, key: &IdempotencyKey) -> String {
        format!("{}{}", self.prefix, key.to_hex())
    }

    /// For each key, the time it was seen committed if a marker says so; `None` means "ask the
    /// ledger". One MGET per call. A Redis failure is logged and answered with all misses.
    pub fn lookup(&self, conn: &mut Conn, keys: &[IdempotencyKey]) -> Vec<Option<String>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let mut cmd = redis::cmd("MGET");
        for k in keys {
            cmd.arg(self.marker(k));
        }
        let found = conn.query::<Vec<Option<String>>>(&cmd);
        self.episode(found.as_ref().err());
        match found {
            Ok(found) if found.len() == keys.len() => found,
            Ok(found) => {
                warn!(
                    "fast filter: MGET returned {} values for {} keys; asking the ledger",
                    found.len(),
                    keys.len()
                );
                vec![None; keys.len()]
            }
            Err(_) => vec![None; keys.len()],
        }
    }

    /// Marks `keys` as committed at `committed_at`. Call only after the transaction that
    /// claimed (or found) them has committed. One pipelined round trip; a failure is logged
    /// and otherwise ignored (the keys are simply looked up in the ledger next time).
    pub fn mark(&self, conn: &mut Conn, keys: &[IdempotencyKey], committed_at: &str) {
        if keys.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.cmd("SET")
                .arg(self.marker(k))
                .arg(committed_at)
                .arg("EX")
                .arg(self.ttl_s)
                .ignore();
        }
        let marked = conn.pipeline::<()>(&pipe);
        self.episode(marked.as_ref().err());
    }

    /// Logs the start of an episode of Redis failures (`error`, the first) and its end, once
    /// each: meanwhile every lookup is a miss the ledger answers and every key unmarked is
    /// looked up in the ledger next time, so nothing is lost, only speed.
    fn episode(&self, error: Option<&crate::Error>) {
        match error {
            Some(e) if !self.failing.swap(true, Ordering::SeqCst) => warn!(
                "fast filter: redis failed ({e}); the ledger answers every lookup until it \
                 works again"
            ),
            None if self.failing.swap(false, Ordering::SeqCst) => {
                info!("fast filter: redis works again")
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_live_under_the_stream_scoped_to_the_group_and_show_the_key_in_hex() {
        let key = IdempotencyKey::from_slice(&[0xab; 32]).unwrap();
        let f = FastFilter::new("grants:submissions", "grant-workers", 60);
        assert_eq!(
            f.marker(&key),
            format!(
                "grants:submissions:committed:grant-workers:{}",
                "ab".repeat(32)
            )
        );
        let other = FastFilter::new("grants:submissions", "audit-replay", 60);
        assert_ne!(f.marker(&key), other.marker(&key));
    }
}
