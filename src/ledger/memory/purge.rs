//! The in-memory ledger's purge: what `Retention::purge_batch` does on SQLite (`sqlite/purge.rs`)
//! for the contract tests' sake — remove a prefix of the chain with exactly the rows it
//! describes, leave a tombstone per removed claim and a checkpoint continuing the chain — without
//! holds or a retention window, which are `ops::retention`'s business and need a real ledger.

use super::ledger::MemoryStore;
use super::state::Tombstone;
use crate::domain::audit::{Kind, Record};
use crate::domain::key::IdempotencyKey;
use crate::error::{Error, Result};
use crate::ledger::Removed;
use std::collections::HashSet;

impl MemoryStore {
    /// Removes every audit record with `seq <= last` (a leading checkpoint included), the
    /// claims, disbursements and outbox rows of the `processed` records among them and the
    /// dead-letter rows of the `dead_letter` records, leaving a tombstone for each removed
    /// claim (`purged_at` = `now`) and a checkpoint at `last` carrying `detail` and continuing
    /// from record `last`'s hash. All or nothing: a `processed` record whose claim is gone is
    /// [`Error::Invariant`], and nothing changes. The outbox id sequence is untouched.
    pub fn purge_through(&self, last: i64, detail: &str, now: &str) -> Result<Removed> {
        let mut state = self.lock()?;
        let Some(end) = state.audit.iter().position(|r| r.seq == last) else {
            return Err(Error::Other(format!("no audit record with seq {last}")));
        };
        let prefix = &state.audit[..=end];
        let mut keys = Vec::new();
        for r in prefix.iter().filter(|r| r.kind == Kind::Processed) {
            let key = r
                .idempotency_key
                .as_deref()
                .and_then(IdempotencyKey::from_hex);
            match key.filter(|k| state.claim(k).is_some()) {
                Some(k) => keys.push(k),
                None => {
                    return Err(Error::Invariant(format!(
                        "processed record {} has no claim to purge with it; nothing was purged",
                        r.seq
                    )))
                }
            }
        }
        let dead: HashSet<String> = prefix
            .iter()
            .filter(|r| r.kind == Kind::DeadLetter)
            .filter_map(|r| r.stream_entry_id.clone())
            .collect();
        let continues_from = state.audit[end].hash.clone();
        let records = end as u64 + 1;

        let purged: HashSet<IdempotencyKey> = keys.iter().copied().collect();
        let mut claim_ids = HashSet::new();
        for c in state.claims.iter().filter(|c| purged.contains(&c.key)) {
            claim_ids.insert(c.id);
        }
        let tombstones: Vec<(IdempotencyKey, Tombstone)> = state
            .claims
            .iter()
            .filter(|c| claim_ids.contains(&c.id))
            .map(|c| {
                let t = Tombstone {
                    claimed_at: c.claimed_at.clone(),
                    purged_at: now.to_owned(),
                };
                (c.key, t)
            })
            .collect();
        state.tombstones.extend(tombstones);
        state.claims.retain(|c| !claim_ids.contains(&c.id));
        state
            .disbursements
            .retain(|d| !claim_ids.contains(&d.claim_id));
        state.outbox.retain(|o| !claim_ids.contains(&o.claim_id));
        state
            .dead_letters
            .retain(|(_, entry)| !dead.contains(entry));
        state.reindex();
        state.audit.drain(..=end);
        let checkpoint = Record::checkpoint(last, detail, now, &continues_from);
        state.audit.insert(0, checkpoint);
        Ok(Removed {
            records,
            claims: claim_ids.len() as u64,
            dead_letters: dead.len() as u64,
        })
    }
}
