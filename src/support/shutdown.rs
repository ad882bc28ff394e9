//! [`Shutdown`]: how a thread is told to stop, and how it waits without polling.
//!
//! A `Shutdown` is a one-way latch shared by its clones: once [`Shutdown::trigger`] has been
//! called it stays set, and every clone sees it. A thread that checks between steps asks
//! [`Shutdown::is_set`] (one atomic load); a thread with nothing to do until a deadline (the
//! relay's idle poll, a retry's backoff, the next anchor) waits with
//! [`Shutdown::wait_timeout`] or [`Shutdown::wait_until`], so a trigger wakes it at once rather
//! than at its next look at a flag.
//!
//! SIGINT and SIGTERM reach a `Shutdown` through a thread of their own (`cli::common`): a
//! signal handler may not take a lock or notify a condition variable, so the handler only
//! writes to signal-hook's pipe and that thread calls `trigger`.
//!
//! The same latch also marks the other one-way moments a thread waits for — "the worker has
//! returned" for the anchoring thread's last anchor and the metrics server, "exit once idle"
//! for the relay — each a `Shutdown` of its own, named for what it means where it is used.
//!
//! **Invariant:** a waiter never misses a trigger: it checks the flag and starts waiting while
//! holding the lock, and `trigger` notifies while holding it, after setting the flag.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A one-way stop signal, cheap to clone; all clones share one state.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// The state every clone shares.
    inner: Arc<Inner>,
}

/// What the clones of one [`Shutdown`] share.
#[derive(Debug, Default)]
struct Inner {
    /// True once triggered; read without the lock by [`Shutdown::is_set`].
    set: AtomicBool,
    /// Held by a waiter from its look at `set` until it sleeps, and by `trigger` to notify, so
    /// no wake-up falls between the two. It guards no data of its own.
    lock: Mutex<()>,
    /// Where waiters sleep until a trigger or their deadline.
    woken: Condvar,
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the signal (for good) and wakes every thread waiting on it or on any clone.
    /// Triggering again does nothing more.
    pub fn trigger(&self) {
        self.inner.set.store(true, Ordering::SeqCst);
        let _held = self
            .inner
            .lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.inner.woken.notify_all();
    }

    /// True once [`Shutdown::trigger`] has been called on this signal or any clone of it.
    pub fn is_set(&self) -> bool {
        self.inner.set.load(Ordering::SeqCst)
    }

    /// Waits until the signal is triggered or `timeout` has passed; true if triggered.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_until(deadline),
            // A timeout past the clock's end: wait as long as any deadline could.
            None => self.wait_until(Instant::now() + Duration::from_secs(u32::MAX.into())),
        }
    }

    /// Waits until the signal is triggered or `deadline` is reached; true if triggered. A
    /// deadline already past returns at once with the signal's state.
    pub fn wait_until(&self, deadline: Instant) -> bool {
        // The lock guards `()`: a waiter that panicked holding it left nothing half-written.
        let mut held = self
            .inner
            .lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if self.is_set() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // A spurious wake-up, or the deadline, goes round the loop and looks again.
            held = self
                .inner
                .woken
                .wait_timeout(held, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far longer than any of these tests takes, so a wait that does not wake fails the test
    /// by its result rather than hanging it.
    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_new_signal_is_not_set_and_a_wait_times_out() {
        let shutdown = Shutdown::new();
        assert!(!shutdown.is_set());
        assert!(!shutdown.wait_timeout(Duration::from_millis(20)));
        assert!(!shutdown.wait_until(Instant::now()));
        assert!(!shutdown.is_set());
    }

    #[test]
    fn a_wait_returns_when_another_thread_triggers_a_clone() {
        let shutdown = Shutdown::new();
        let trigger = shutdown.clone();
        let deadline = Instant::now() + LONG;
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (woke, returned_at) = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                started_tx.send(()).unwrap();
                (shutdown.wait_until(deadline), Instant::now())
            });
            started_rx.recv().unwrap();
            trigger.trigger();
            waiter.join().unwrap()
        });
        assert!(woke, "the waiter saw the trigger");
        // Woken by the trigger, not by reaching its deadline (a lost wake-up would end there).
        assert!(returned_at < deadline, "the waiter slept to its deadline");
        assert!(shutdown.is_set());
    }

    #[test]
    fn every_clone_sees_a_trigger_and_waits_no_more() {
        let shutdown = Shutdown::new();
        let clones = [shutdown.clone(), shutdown.clone()];
        clones[1].trigger();
        assert!(shutdown.is_set());
        assert!(clones.iter().all(Shutdown::is_set));
        // Already set: returns true at once, whatever the deadline.
        assert!(shutdown.wait_timeout(LONG));
        assert!(clones[0].wait_until(Instant::now()));
        // A second trigger changes nothing.
        shutdown.trigger();
        assert!(shutdown.is_set());
    }

    #[test]
    fn a_separate_signal_is_not_triggered_by_another() {
        let (a, b) = (Shutdown::new(), Shutdown::new());
        a.trigger();
        assert!(a.is_set());
        assert!(!b.is_set());
        assert!(!b.wait_timeout(Duration::from_millis(5)));
    }

    #[test]
    fn many_waiters_all_wake_on_one_trigger() {
        let shutdown = Shutdown::new();
        let woke = std::thread::scope(|s| {
            let waiters: Vec<_> = (0..4)
                .map(|_| s.spawn(|| shutdown.clone().wait_timeout(LONG)))
                .collect();
            shutdown.trigger();
            waiters
                .into_iter()
                .map(|w| w.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(woke, vec![true; 4]);
    }
}
