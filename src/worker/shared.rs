//! What the worker's stages share ([`Shared`]), and the guard that halts them all when one
//! of them panics ([`HaltOnPanic`]).

use super::in_flight::InFlight;
use super::read_size;
use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::Conn;
use crate::config::{Config, WorkerConfig, LEDGER_TROUBLE_UNHEALTHY_MS, SHUTDOWN_FAILURES_MAX};
use crate::error::{Error, Result};
use crate::observe::metrics::Metrics;
use crate::support::Shutdown;
use log::error;

/// What the stages share.
pub(super) struct Shared<'a> {
    /// Where to read and what to call ourselves.
    pub(super) cfg: &'a Config,
    /// Limits and policies.
    pub(super) wcfg: &'a WorkerConfig,
    /// Triggered by SIGINT/SIGTERM, a failed stage (or a test): stop reading, finish what is
    /// in flight. The reader's idle and backoff waits are on it, so they end at once.
    pub(super) shutdown: &'a Shutdown,
    /// Counters for metrics and summaries.
    pub(super) metrics: &'a Metrics,
    /// Ids read but not yet acknowledged or abandoned by this process.
    pub(super) in_flight: InFlight,
    /// `--fast-filter`: markers for keys already committed, or `None`.
    pub(super) filter: Option<FastFilter>,
    /// Run by the reader after the Redis primary changed (see [`AfterFailover`]).
    pub(super) after_failover: AfterFailover<'a>,
    /// The memory budget for entries (`--read-bytes-max`): counted from the read that brings
    /// an entry in until it is dropped (`read_size.rs`).
    pub(super) budget: std::sync::Arc<read_size::Budget>,
}

/// What the worker runs, on the reader's connection, once it finds that the Redis primary
/// changed under it (a Sentinel promotion; never for a plain URL): the repairs a promotion can
/// need that redelivery does not bring about. `claimgate run` passes the dead-letter
/// reconciliation (`ops/reconcile.rs`, which the worker cannot name: it sits beside it). A
/// transient error is logged and the repair tried again on the reader's next turn; a permanent
/// one stops the worker.
pub type AfterFailover<'a> = &'a (dyn Fn(&mut Conn) -> Result<()> + Sync);

impl Shared<'_> {
    /// True once shutdown has been asked for.
    pub(super) fn stopping(&self) -> bool {
        self.shutdown.is_set()
    }

    /// Runs one writer step under the shared retry policy: transient failures are waited out,
    /// and once shutdown is asked for the step gets [`SHUTDOWN_FAILURES_MAX`] failures before
    /// the last error is returned (the caller then leaves its entries pending).
    pub(super) fn retry<T>(&self, what: &str, op: impl FnMut() -> Result<T>) -> Result<T> {
        crate::retry::with_backoff(what, self.shutdown, SHUTDOWN_FAILURES_MAX, op)
    }

    /// Runs one ledger commit under the shared retry policy, as [`Shared::retry`] does, and
    /// waits out a failure of the ledger itself too (`Error::is_ledger_outage`), for at most
    /// `--ledger-outage-ms-max`: never counted against the entries. While it fails for the
    /// ledger's own reason, or for a transient one that has lasted
    /// [`LEDGER_TROUBLE_UNHEALTHY_MS`], `/healthz` says so.
    pub(super) fn retry_ledger<T>(&self, what: &str, op: impl FnMut() -> Result<T>) -> Result<T> {
        let note = |failing: Option<(&Error, std::time::Duration)>| match failing {
            Some((e, lasted))
                if e.is_ledger_outage()
                    || lasted.as_millis() as u64 >= LEDGER_TROUBLE_UNHEALTHY_MS =>
            {
                self.metrics
                    .note_ledger_trouble(Some(format!("{e} (for {:.1} s)", lasted.as_secs_f64())))
            }
            Some(_) => {}
            None => self.metrics.note_ledger_trouble(None),
        };
        let outage = crate::retry::Outage {
            ms_max: self.wcfg.ledger_outage_ms_max,
            note: &note,
        };
        crate::retry::with_outage(what, self.shutdown, SHUTDOWN_FAILURES_MAX, &outage, op)
    }

    /// A stage has stopped for a reason that will not clear by itself: `/healthz` turns 503
    /// first (so nobody reads "healthy" after this line), then one ERROR line names the cause,
    /// then every other stage is asked to stop as on SIGTERM — the reader within one blocking
    /// read, the writer after what it holds — and `run` returns the error (exit 1).
    pub(super) fn halt(&self, stage: &str, cause: &str) {
        self.metrics.fail(format!("{stage}: {cause}"));
        error!("{stage} stopped: {cause}; stopping the worker");
        self.shutdown.trigger();
    }

    /// Runs a stage's body on its thread. A permanent error or a panic halts the whole worker
    /// at once: a stage that dies quietly would leave the others alive and doing nothing (the
    /// reader would notice only when it next had entries to hand on).
    pub(super) fn stage(&self, name: &str, body: impl FnOnce() -> Result<()>) -> Result<()> {
        let guard = HaltOnPanic { shared: self, name };
        let result = body();
        std::mem::forget(guard);
        if let Err(e) = &result {
            self.halt(name, &e.to_string());
        }
        result
    }
}

/// Halts the worker if the stage thread holding it unwinds from a panic.
pub(super) struct HaltOnPanic<'s, 'a> {
    /// What the stages share.
    pub(super) shared: &'s Shared<'a>,
    /// The stage, as the log line names it.
    pub(super) name: &'s str,
}

impl Drop for HaltOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.halt(self.name, "the thread panicked");
        }
    }
}
