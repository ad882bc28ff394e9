//! The worker's memory budget for entries (`--read-bytes-max`): every entry read is counted, by
//! `Entry::weight`, from the read that brings it in until the last of it is dropped (its batch
//! acknowledged and reported, or given up), and the reader asks Redis only for what is left.
//!
//! **Invariant:** the entries counted never weigh more than `bytes_max` in all. The reader reads
//! only when there is room for the heaviest entry it may meet (`read::Limits::entry_weight_max`,
//! which `--read-bytes-max` must cover, checked at start), asks for at most the room left
//! (`broker/read.rs` keeps to it), counts what came before handing it on, and the count drops
//! only when a [`Held`] is dropped, which happens with the memory it stands for.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Entry bytes held, against the most there may be.
#[derive(Debug)]
pub(super) struct Budget {
    /// The most, in `Entry::weight` bytes (`--read-bytes-max`).
    bytes_max: usize,
    /// What is counted now.
    held: Mutex<usize>,
    /// Signalled whenever something is let go, so a reader waiting for room wakes at once.
    freed: Condvar,
}

/// Entry bytes counted against a [`Budget`], let go when this is dropped: it travels with the
/// entries it stands for (a handoff's, then each parsed entry's) and is dropped with them.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// The budget to give back to; `None` for nothing counted.
    budget: Option<Arc<Budget>>,
    /// How much.
    bytes: usize,
}

impl Budget {
    /// A budget of `bytes_max`.
    pub(super) fn new(bytes_max: usize) -> Arc<Budget> {
        Arc::new(Budget {
            bytes_max,
            held: Mutex::new(0),
            freed: Condvar::new(),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, usize> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What may be read now.
    pub(super) fn room(&self) -> usize {
        self.bytes_max.saturating_sub(*self.held())
    }

    /// Waits at most `wait` for at least `bytes` of room; true when it is there.
    pub(super) fn wait_for_room(&self, bytes: usize, wait: Duration) -> bool {
        let held = self.held();
        let (held, _) = self
            .freed
            .wait_timeout_while(held, wait, |held| {
                self.bytes_max.saturating_sub(*held) < bytes
            })
            .unwrap_or_else(|p| p.into_inner());
        self.bytes_max.saturating_sub(*held) >= bytes
    }

    /// Counts `bytes` just read, which the read was asked to keep within [`Budget::room`].
    pub(super) fn hold(self: &Arc<Self>, bytes: usize) -> Held {
        *self.held() += bytes;
        Held {
            budget: Some(Arc::clone(self)),
            bytes,
        }
    }

    fn free(&self, bytes: usize) {
        let mut held = self.held();
        *held = held.saturating_sub(bytes);
        self.freed.notify_all();
    }
}

impl Held {
    /// Splits `bytes` (at most what this holds) off into a [`Held`] of their own.
    pub(super) fn take(&mut self, bytes: usize) -> Held {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Held {
            budget: self.budget.clone(),
            bytes,
        }
    }

    /// How much this holds.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes over what `other` holds (of the same budget), as one share.
    pub(super) fn absorb(&mut self, mut other: Held) {
        if self.budget.is_none() {
            self.budget = other.budget.take();
        }
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.free(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_held_is_counted_until_every_part_of_it_is_dropped() {
        let budget = Budget::new(1_000);
        let mut read = budget.hold(700);
        assert_eq!(budget.room(), 300);
        let first = read.take(200);
        let second = read.take(10_000);
        assert_eq!((first.bytes(), second.bytes(), read.bytes()), (200, 500, 0));
        drop(read);
        assert_eq!(budget.room(), 300, "nothing was let go yet");
        drop(first);
        assert_eq!(budget.room(), 500);
        assert!(!budget.wait_for_room(600, Duration::from_millis(1)));
        let mut both = Held::default();
        both.absorb(second);
        assert_eq!((both.bytes(), budget.room()), (500, 500));
        drop(both);
        assert!(budget.wait_for_room(1_000, Duration::from_millis(1)));
    }

    #[test]
    fn a_reader_waiting_for_room_wakes_when_it_is_let_go() {
        let budget = Budget::new(100);
        let held = budget.hold(100);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| budget.wait_for_room(50, Duration::from_secs(30)));
            std::thread::sleep(Duration::from_millis(20));
            drop(held);
            assert!(waiter.join().unwrap());
        });
    }
}
