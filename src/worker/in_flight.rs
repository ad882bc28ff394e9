//! The set of entries this process has read and not yet acknowledged or given up.
//!
//! **Invariant:** an id is in the set from the moment the reader hands its entry on until the
//! writer has acknowledged it or left it pending; while it is in, the reader never hands the
//! same entry on again, so an entry is never in the pipeline twice (XAUTOCLAIM may return our
//! own slow entries to us).

use crate::broker::stream::Entry;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Ids in the pipeline, with when the reader handed them on.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Each in-flight entry id, with when it was read.
    read_at: Mutex<HashMap<String, Instant>>,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.read_at.lock().expect("in-flight set poisoned")
    }

    /// Adds `entries` to the set, read now, and hands them back.
    pub(super) fn track(&self, entries: Vec<Entry>) -> Vec<Entry> {
        let now = Instant::now();
        self.lock()
            .extend(entries.iter().map(|e| (e.id.clone(), now)));
        entries
    }

    /// Adds `ids` to the set, read now: entries delivered to us whose bodies are still to be
    /// fetched.
    pub(super) fn track_ids(&self, ids: &[String]) {
        let now = Instant::now();
        self.lock().extend(ids.iter().map(|id| (id.clone(), now)));
    }

    /// The entries that are not in the set already.
    pub(super) fn not_in(&self, entries: Vec<Entry>) -> Vec<Entry> {
        let set = self.lock();
        entries
            .into_iter()
            .filter(|e| !set.contains_key(&e.id))
            .collect()
    }

    /// True when `id` is in the set.
    pub(super) fn holds(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Removes `ids`: acknowledged, or left pending for redelivery.
    pub(super) fn release(&self, ids: impl IntoIterator<Item = String>) {
        let mut set = self.lock();
        for id in ids {
            set.remove(&id);
        }
    }

    /// Stamps `ids` (those still in the set) as read just now: entries parked by the
    /// quarantine, which wait outside the pipeline and must not count as held up in it.
    pub(super) fn restamp<'i>(&self, ids: impl IntoIterator<Item = &'i str>) {
        let now = Instant::now();
        let mut set = self.lock();
        for id in ids {
            if let Some(read_at) = set.get_mut(id) {
                *read_at = now;
            }
        }
    }

    /// True when some entry has been in the set for at least `held_min`.
    pub(super) fn any_held(&self, held_min: Duration) -> bool {
        self.lock()
            .values()
            .any(|read_at| read_at.elapsed() >= held_min)
    }

    /// Every id in the set now.
    pub(super) fn ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// How many entries are in the pipeline.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing is in the pipeline.
    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}
