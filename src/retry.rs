//! The one retry policy every component shares: how long to wait after a transient failure,
//! how an episode of failures is logged, and when to stop waiting.
//!
//! The worker's reader and writer, the relay and the ledger's open step all wait out transient
//! failures ([`Error::is_transient`]) the same way:
//!
//! - **Backoff.** The `n`th consecutive failure (counting from 0) waits a random time in
//!   `[c/2, c]`, where `c = min(BACKOFF_MS_MAX, BACKOFF_MS_MIN · 2^n)` ([`backoff`]): 25–50 ms
//!   after the first failure, doubling to 2.5–5 s from the eighth on.
//! - **One episode, two log lines.** The first failure of an episode is logged once at WARN,
//!   `<what> failed: <error>; retrying with backoff until it clears`; later failures are not
//!   logged; the first success after failures is logged once at INFO,
//!   `<what> recovered after <N> failed attempts over <S>s` ([`Episode`]).
//! - **Shutdown.** A loop never gives up while the process is meant to run: the world being
//!   briefly down is no reason to exit. Once shutdown is asked for, [`with_backoff`] grants a
//!   fixed number of further failures and then returns the last real error, so the caller can
//!   leave its work pending and stop. A backoff wait under way when shutdown is asked for ends
//!   at once (the wait is on the [`Shutdown`], not a sleep); the granted failures after it
//!   wait their full backoff, so a failure that clears within it still clears.
//! - **A ledger outage** ([`Error::is_ledger_outage`]: a privilege revoked, a damaged file, a
//!   missing schema) is not the world being briefly down, nor an entry's fault. A loop given an
//!   [`Outage`] ([`with_outage`]) waits it out like a transient failure, telling the caller of
//!   every failed attempt (so the worker can report itself unhealthy), for at most
//!   `Outage::ms_max` from the episode's first failure; then it returns the last error, and the
//!   caller stops for good. Without an [`Outage`], such an error is returned at once.
//!
//! Invariant: this module is a leaf. It knows nothing of Redis, SQLite or threads; it uses only
//! `config` (the limits), `error` (the transient question), `support::Shutdown` (the stop it
//! waits on), `std`, `log` and `fastrand`.

use crate::config::{BACKOFF_MS_MAX, BACKOFF_MS_MIN};
use crate::error::{Error, Result};
use crate::support::Shutdown;
use log::{info, warn};
use std::time::{Duration, Instant};

/// The largest wait the `attempt`th consecutive failure (from 0) can draw, in milliseconds:
/// `min(BACKOFF_MS_MAX, BACKOFF_MS_MIN · 2^attempt)`, without overflow for any `attempt`.
pub fn backoff_ceiling_ms(attempt: u32) -> u64 {
    // 2^16 · BACKOFF_MS_MIN is far above the cap already; clamping the shift keeps it in range.
    BACKOFF_MS_MIN
        .saturating_mul(1u64 << attempt.min(16))
        .min(BACKOFF_MS_MAX)
}

/// How long to wait after the `attempt`th consecutive failure (from 0): capped exponential
/// backoff with *equal jitter*, uniform in `[c - c/2, c]` for `c = backoff_ceiling_ms(attempt)`.
///
/// Equal rather than full jitter (uniform in `[0, c]`): full jitter spreads thousands of
/// clients best, but it may draw a wait near zero and retry back to back. claimgate has a
/// handful of processes, each with a few retrying components, so the spreading matters less
/// than the floor: with half the wait fixed, no component ever retries a recovering Redis or
/// SQLite sooner than `c/2` after its last try. Half random still keeps components that failed
/// together from retrying in lockstep.
pub fn backoff(attempt: u32) -> Duration {
    let ceiling_ms = backoff_ceiling_ms(attempt);
    let fixed_ms = ceiling_ms - ceiling_ms / 2;
    Duration::from_millis(fixed_ms + fastrand::u64(0..=ceiling_ms / 2))
}

/// One episode of transient failure of one step, logged when it starts and when it clears,
/// never once per retry. A success with no failure before it logs nothing.
#[derive(Debug)]
pub struct Episode<'a> {
    /// The step, as the log lines name it: "reading from redis", "opening the ledger".
    what: &'a str,
    /// Failed attempts in the current episode; 0 while healthy.
    failures: u32,
    /// When the current episode's first failure happened; `None` while healthy.
    started_at: Option<Instant>,
}

/// How an episode ended, for its recovery line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recovery {
    /// Failed attempts before the success.
    failures: u32,
    /// From the first failure to the success.
    lasted: Duration,
}

impl<'a> Episode<'a> {
    /// A healthy step named `what`.
    pub fn new(what: &'a str) -> Self {
        Episode {
            what,
            failures: 0,
            started_at: None,
        }
    }

    /// Failed attempts in the current episode; 0 while healthy.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Notes a failed attempt, logs the start of an episode if this is its first failure, and
    /// returns how long to wait before the next attempt.
    pub fn failed(&mut self, e: &Error) -> Duration {
        if self.note_failure(Instant::now()) {
            warn!("{}", started_line(self.what, e));
        }
        backoff(self.failures - 1)
    }

    /// Notes a success; logs the end of the episode if one was under way.
    pub fn succeeded(&mut self) {
        if let Some(recovery) = self.note_success(Instant::now()) {
            info!("{}", recovered_line(self.what, recovery));
        }
    }

    /// The state change of a failure at `now`; true when it starts an episode.
    fn note_failure(&mut self, now: Instant) -> bool {
        let first = self.failures == 0;
        if first {
            self.started_at = Some(now);
        }
        self.failures = self.failures.saturating_add(1);
        first
    }

    /// The state change of a success at `now`; how the episode ended, if one was under way.
    fn note_success(&mut self, now: Instant) -> Option<Recovery> {
        if self.failures == 0 {
            return None;
        }
        let started_at = self.started_at.take().unwrap_or(now);
        let recovery = Recovery {
            failures: self.failures,
            lasted: now.saturating_duration_since(started_at),
        };
        self.failures = 0;
        Some(recovery)
    }
}

/// The WARN line that starts an episode.
fn started_line(what: &str, e: &Error) -> String {
    format!("{what} failed: {e}; retrying with backoff until it clears")
}

/// The INFO line that ends one.
fn recovered_line(what: &str, r: Recovery) -> String {
    format!(
        "{what} recovered after {} failed attempts over {:.1}s",
        r.failures,
        r.lasted.as_secs_f64()
    )
}

/// Runs `op` until it succeeds or fails permanently, waiting out transient failures with
/// [`backoff`] and logging them as one [`Episode`] named `what`. Once `stop` is set, a failure
/// ends the loop if the episode already had `failures_max_stopping` failures (0: the first
/// failure after `stop` ends it); the last real error is returned, and the caller leaves its
/// work for later. A permanent error is returned at once.
pub fn with_backoff<T>(
    what: &str,
    stop: &Shutdown,
    failures_max_stopping: u32,
    op: impl FnMut() -> Result<T>,
) -> Result<T> {
    let limits = Limits {
        stop,
        failures_max_stopping,
        outage: None,
    };
    retry_loop(what, &limits, op, |wait| pause(stop, wait), Instant::now)
}

/// [`with_backoff`] for work that is worth nothing once `stop` is set: `Ok(None)` when a
/// transient failure was given up on, which the retry does only because `stop` was set.
pub fn until_stopped<T>(
    what: &str,
    stop: &Shutdown,
    op: impl FnMut() -> Result<T>,
) -> Result<Option<T>> {
    match with_backoff(what, stop, 0, op) {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.is_transient() => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a loop with an [`Outage`] tells of each failed attempt: the error and how long its
/// episode has lasted, or `None` when an episode it told of ended in a success.
pub type OutageNote<'a> = &'a (dyn Fn(Option<(&Error, Duration)>) + Sync);

/// How a loop given one treats a ledger outage ([`Error::is_ledger_outage`]).
pub struct Outage<'a> {
    /// How long an episode that has seen an outage is waited out, from its first failure,
    /// before the last error is returned, in milliseconds.
    pub ms_max: u64,
    /// Told of every failed attempt (the error, and how long the episode has lasted), and
    /// with `None` when an episode it was told of ends in a success.
    pub note: OutageNote<'a>,
}

/// [`with_backoff`], and a ledger outage is waited out too, for at most `outage.ms_max`, with
/// every failed attempt told to `outage.note`.
pub fn with_outage<T>(
    what: &str,
    stop: &Shutdown,
    failures_max_stopping: u32,
    outage: &Outage<'_>,
    op: impl FnMut() -> Result<T>,
) -> Result<T> {
    let limits = Limits {
        stop,
        failures_max_stopping,
        outage: Some(outage),
    };
    retry_loop(what, &limits, op, |wait| pause(stop, wait), Instant::now)
}

/// One backoff wait. Until shutdown is asked for, the wait is on `stop`, so a trigger ends it
/// at once and the attempt that decides whether to give up comes without delay. Once it has
/// been asked for, the failures shutdown grants wait their full backoff: they are there to let
/// a brief failure clear, which back-to-back attempts would not.
fn pause(stop: &Shutdown, wait: Duration) {
    if stop.is_set() {
        std::thread::sleep(wait);
    } else {
        stop.wait_timeout(wait);
    }
}

/// When a retry loop stops trying.
struct Limits<'a> {
    /// Triggered once shutdown is asked for.
    stop: &'a Shutdown,
    /// Failures an episode may have had when a failure after `stop` ends the loop.
    failures_max_stopping: u32,
    /// Whether, and for how long, a ledger outage is waited out.
    outage: Option<&'a Outage<'a>>,
}

/// [`with_backoff`] with the sleep and the clock passed in, so tests can run it without
/// waiting.
fn retry_loop<T>(
    what: &str,
    limits: &Limits<'_>,
    mut op: impl FnMut() -> Result<T>,
    mut sleep: impl FnMut(Duration),
    mut now: impl FnMut() -> Instant,
) -> Result<T> {
    let mut episode = Episode::new(what);
    let mut began: Option<Instant> = None;
    loop {
        match op() {
            Ok(value) => {
                episode.succeeded();
                if let (Some(outage), Some(_)) = (limits.outage, began) {
                    (outage.note)(None);
                }
                return Ok(value);
            }
            Err(e) if e.is_transient() || (limits.outage.is_some() && e.is_ledger_outage()) => {
                let at = now();
                let lasted = at.saturating_duration_since(*began.get_or_insert(at));
                if let Some(outage) = limits.outage {
                    (outage.note)(Some((&e, lasted)));
                    if e.is_ledger_outage() && lasted >= Duration::from_millis(outage.ms_max) {
                        return Err(e);
                    }
                }
                if limits.stop.is_set() && episode.failures() >= limits.failures_max_stopping {
                    return Err(e);
                }
                sleep(episode.failed(&e));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transient error: an I/O failure, as a refused connection would be.
    fn transient() -> Error {
        Error::io("connecting", std::io::ErrorKind::ConnectionRefused.into())
    }

    #[test]
    fn a_success_ends_the_episode_so_the_next_failure_starts_a_new_one_at_the_shortest_wait() {
        let mut episode = Episode::new("reading");
        for _ in 0..6 {
            episode.failed(&transient());
        }
        assert_eq!(episode.failures(), 6);
        episode.succeeded();
        assert_eq!(episode.failures(), 0, "the episode is over");
        let wait = episode.failed(&transient());
        assert_eq!(episode.failures(), 1);
        assert!(
            wait <= Duration::from_millis(BACKOFF_MS_MIN),
            "a new episode starts at the first backoff, not the seventh: {wait:?}"
        );
    }

    #[test]
    fn backoff_grows_to_max() {
        let ceilings: Vec<u64> = (0..12).map(backoff_ceiling_ms).collect();
        assert_eq!(
            ceilings,
            [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000, 5000]
        );
        assert_eq!(ceilings[0], BACKOFF_MS_MIN);
        for pair in ceilings.windows(2) {
            assert!(pair[0] <= pair[1], "{ceilings:?}");
        }
        for attempt in [12, 16, 17, 31, 32, 63, 64, 1000, u32::MAX] {
            assert_eq!(
                backoff_ceiling_ms(attempt),
                BACKOFF_MS_MAX,
                "attempt {attempt}"
            );
        }
    }

    #[test]
    fn every_backoff_lies_within_equal_jitter_bounds() {
        for attempt in (0..20).chain([1000, u32::MAX]) {
            let ceiling = Duration::from_millis(backoff_ceiling_ms(attempt));
            let (mut low, mut high) = (Duration::MAX, Duration::ZERO);
            for _ in 0..2_000 {
                let wait = backoff(attempt);
                assert!(wait >= ceiling / 2, "attempt {attempt}: {wait:?}");
                assert!(wait <= ceiling, "attempt {attempt}: {wait:?}");
                (low, high) = (low.min(wait), high.max(wait));
            }
            // The jitter is real: 2,000 draws cover most of the random half.
            let spread = ceiling / 2;
            assert!(
                high - low >= spread * 3 / 4,
                "attempt {attempt}: {low:?}..{high:?}"
            );
        }
    }

    #[test]
    fn an_episode_starts_once_and_recovers_once() {
        let mut episode = Episode::new("reading from redis");
        let t0 = Instant::now();
        assert_eq!(episode.note_success(t0), None, "healthy: nothing to report");
        assert!(
            episode.note_failure(t0),
            "the first failure starts the episode"
        );
        assert!(!episode.note_failure(t0 + Duration::from_secs(1)));
        assert!(!episode.note_failure(t0 + Duration::from_secs(2)));
        assert_eq!(episode.failures(), 3);
        let recovery = episode.note_success(t0 + Duration::from_millis(3_250));
        assert_eq!(
            recovery,
            Some(Recovery {
                failures: 3,
                lasted: Duration::from_millis(3_250)
            })
        );
        assert_eq!(episode.failures(), 0);
        assert_eq!(episode.note_success(t0 + Duration::from_secs(4)), None);
        assert!(
            episode.note_failure(t0 + Duration::from_secs(5)),
            "a new episode"
        );
        assert_eq!(
            episode.note_success(t0 + Duration::from_secs(6)),
            Some(Recovery {
                failures: 1,
                lasted: Duration::from_secs(1)
            })
        );
    }

    #[test]
    fn the_episode_lines_read_as_documented() {
        let e = Error::Other("connection refused".into());
        assert_eq!(
            started_line("reading from redis", &e),
            "reading from redis failed: connection refused; retrying with backoff until it clears"
        );
        let r = Recovery {
            failures: 7,
            lasted: Duration::from_millis(12_340),
        };
        assert_eq!(
            recovered_line("committing to the ledger", r),
            "committing to the ledger recovered after 7 failed attempts over 12.3s"
        );
    }

    #[test]
    fn transient_failures_are_waited_out_with_growing_backoff() {
        let stop = Shutdown::new();
        let (mut calls, mut waits) = (0, Vec::new());
        let got = retry_loop(
            "a step",
            &limits(&stop, 3),
            || {
                calls += 1;
                if calls <= 5 {
                    Err(transient())
                } else {
                    Ok(calls)
                }
            },
            |wait| waits.push(wait),
            Instant::now,
        );
        assert_eq!(got.unwrap(), 6);
        assert_eq!(waits.len(), 5);
        for (attempt, wait) in waits.iter().enumerate() {
            let ceiling = Duration::from_millis(backoff_ceiling_ms(attempt as u32));
            assert!(
                *wait >= ceiling / 2 && *wait <= ceiling,
                "{attempt}: {wait:?}"
            );
        }
    }

    #[test]
    fn a_permanent_error_is_returned_at_once() {
        let stop = Shutdown::new();
        let (mut calls, mut sleeps) = (0, 0);
        let got: Result<()> = retry_loop(
            "a step",
            &limits(&stop, 3),
            || {
                calls += 1;
                Err(Error::Other("refused".into()))
            },
            |_| sleeps += 1,
            Instant::now,
        );
        assert!(matches!(got, Err(Error::Other(m)) if m == "refused"));
        assert_eq!((calls, sleeps), (1, 0));
    }

    #[test]
    fn once_stopping_the_loop_gives_up_after_the_granted_failures() {
        // 1. The first attempt fails while running; shutdown is asked for during the second.
        // 2. With 3 failures granted, the episode may reach 3 failures; the 4th attempt's
        //    failure ends the loop and is returned.
        let stop = Shutdown::new();
        let mut calls = 0;
        let got: Result<()> = retry_loop(
            "a step",
            &limits(&stop, 3),
            || {
                calls += 1;
                if calls == 2 {
                    stop.trigger();
                }
                Err(transient())
            },
            |_| {},
            Instant::now,
        );
        assert!(got.unwrap_err().is_transient(), "the last real error");
        assert_eq!(calls, 4);

        // With none granted, the first failure after the stop ends it.
        let mut calls = 0;
        let got: Result<()> = retry_loop(
            "a step",
            &limits(&stop, 0),
            || {
                calls += 1;
                Err(transient())
            },
            |_| {},
            Instant::now,
        );
        assert!(got.is_err());
        assert_eq!(calls, 1);
    }

    fn limits(stop: &Shutdown, failures_max_stopping: u32) -> Limits<'_> {
        Limits {
            stop,
            failures_max_stopping,
            outage: None,
        }
    }

    #[test]
    fn a_ledger_outage_is_returned_at_once_without_patience_and_waited_out_with_it() {
        // 1. Without an Outage, a revoked privilege is returned at the first failure.
        // 2. With one of 60 s, it is retried (each failure told to `note`) until it clears,
        //    and the clearing is told too.
        // 3. With one that never clears, the loop gives up once 60 s have passed since the
        //    episode's first failure, on the clock the loop is given.
        let stop = Shutdown::new();
        let revoked = || Error::ledger("permission denied for table", crate::error::Fault::Ledger);
        let mut calls = 0;
        let got: Result<()> = retry_loop(
            "a step",
            &limits(&stop, 3),
            || {
                calls += 1;
                Err(revoked())
            },
            |_| {},
            Instant::now,
        );
        assert!(got.unwrap_err().is_ledger_outage());
        assert_eq!(calls, 1);

        let told = std::sync::Mutex::new(Vec::new());
        let note = |n: Option<(&Error, Duration)>| {
            told.lock().unwrap().push(n.map(|(_, lasted)| lasted));
        };
        let outage = Outage {
            ms_max: 60_000,
            note: &note,
        };
        let with_patience = Limits {
            stop: &stop,
            failures_max_stopping: 3,
            outage: Some(&outage),
        };
        let t0 = Instant::now();
        let clock = std::cell::Cell::new(t0);
        let mut calls = 0;
        let got = retry_loop(
            "a step",
            &with_patience,
            || {
                calls += 1;
                if calls <= 4 {
                    Err(revoked())
                } else {
                    Ok(calls)
                }
            },
            |wait| clock.set(clock.get() + wait),
            || clock.get(),
        );
        assert_eq!(got.unwrap(), 5);
        let told = std::mem::take(&mut *told.lock().unwrap());
        assert_eq!(told.len(), 5, "four failures and the recovery: {told:?}");
        assert_eq!(told[0], Some(Duration::ZERO));
        assert_eq!(told[4], None, "the recovery is told");

        let clock = std::cell::Cell::new(t0);
        let mut calls = 0;
        let got: Result<()> = retry_loop(
            "a step",
            &with_patience,
            || {
                calls += 1;
                Err(revoked())
            },
            |wait| clock.set(clock.get() + wait),
            || clock.get(),
        );
        assert!(got.unwrap_err().is_ledger_outage());
        let waited = clock.get() - t0;
        assert!(
            waited >= Duration::from_secs(60) && waited < Duration::from_secs(66),
            "gave up {waited:?} after the first failure, after {calls} attempts"
        );
    }

    #[test]
    fn until_stopped_is_none_only_for_a_transient_failure_given_up_on_at_a_stop() {
        let stop = Shutdown::new();
        assert_eq!(until_stopped("t", &stop, || Ok(7)).unwrap(), Some(7));
        let permanent = until_stopped::<()>("t", &stop, || Err(Error::Other("no".into())));
        assert!(matches!(permanent, Err(Error::Other(_))), "{permanent:?}");
        stop.trigger();
        let mut calls = 0;
        let given_up = until_stopped::<()>("t", &stop, || {
            calls += 1;
            Err(transient())
        });
        assert_eq!((given_up.unwrap(), calls), (None, 1));
    }
}
