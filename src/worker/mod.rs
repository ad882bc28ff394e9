//! `claimgate run`: the only module that holds both a Redis connection and the ledger.
//!
//! Three stages joined by bounded channels, and two helpers beside them. Memory is bounded by
//! bytes: every entry counts against `--read-bytes-max` from the read that brings it in until
//! it is dropped after its XACK (`read_size.rs`), and the reader asks Redis for no more than
//! what is left (`broker/read.rs`), whatever the entries weigh.
//!
//! ```text
//! reader (reader.rs: 1 thread, read scripts within the memory budget, polling when idle)
//!   → parse pool (parse.rs, --threads: validate, hash, enforce the delivery cap)
//!     → writer (writer.rs, 1 thread: dead letters, one ledger transaction per batch)
//!       → acker (acker.rs, 1 thread: held copies, XACK, in-flight ids let go)
//!         → reporter (reporter.rs, 1 thread: audit log lines and counters)
//! heartbeat (heartbeat.rs, 1 thread: keeps our in-flight entries from looking abandoned)
//! ```
//!
//! An entry past `--max-deliveries` is tried alone, at most twice (quarantine.rs), before the cap
//! dead-letters it. A stage that fails for good stops all of them (`Shared::halt`).
//!
//! This file wires the threads and channels together and holds the state they share.
//!
//! **Invariant:** nothing under `worker/` sends XACK for an entry before the ledger transaction
//! covering it has committed. The acker acknowledges every entry the writer committed, and
//! only what the writer hands it after that commit; the reader acknowledges nothing but pending ids whose entries are gone from the
//! stream (there is nothing left to process). A crash anywhere before the XACK leaves the
//! entries pending; their redelivery finds the claims already taken and becomes a duplicate.

mod acker;
mod dead_letters;
mod heartbeat;
mod in_flight;
mod parse;
mod quarantine;
mod read_size;
mod reader;
mod record;
mod reporter;
mod signals;
mod writer;

use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::{self, Conn};
use crate::config::{
    Config, WorkerConfig, CHANNEL_BATCHES_MAX, LEDGER_TROUBLE_UNHEALTHY_MS, SHUTDOWN_FAILURES_MAX,
};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::observe::metrics::Metrics;
use crate::support::threads::spawn_named;
use crate::support::Shutdown;
use crossbeam_channel::bounded;
use in_flight::InFlight;
use log::{error, info};
use reporter::Committed;
use std::thread::ScopedJoinHandle;

/// The name the reader's failures to reach Redis are logged under (`retry::Episode`); `run`
/// waits out Redis at start under it too.
pub use reader::WHAT as READING;

/// What the stages share.
struct Shared<'a> {
    /// Where to read and what to call ourselves.
    cfg: &'a Config,
    /// Limits and policies.
    wcfg: &'a WorkerConfig,
    /// Triggered by SIGINT/SIGTERM, a failed stage (or a test): stop reading, finish what is
    /// in flight. The reader's idle and backoff waits are on it, so they end at once.
    shutdown: &'a Shutdown,
    /// Counters for metrics and summaries.
    metrics: &'a Metrics,
    /// Ids read but not yet acknowledged or abandoned by this process.
    in_flight: InFlight,
    /// `--fast-filter`: markers for keys already committed, or `None`.
    filter: Option<FastFilter>,
    /// Run by the reader after the Redis primary changed (see [`AfterFailover`]).
    after_failover: AfterFailover<'a>,
    /// The memory budget for entries (`--read-bytes-max`): counted from the read that brings
    /// an entry in until it is dropped (`read_size.rs`).
    budget: std::sync::Arc<read_size::Budget>,
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
    fn stopping(&self) -> bool {
        self.shutdown.is_set()
    }

    /// Runs one writer step under the shared retry policy: transient failures are waited out,
    /// and once shutdown is asked for the step gets [`SHUTDOWN_FAILURES_MAX`] failures before
    /// the last error is returned (the caller then leaves its entries pending).
    fn retry<T>(&self, what: &str, op: impl FnMut() -> Result<T>) -> Result<T> {
        crate::retry::with_backoff(what, self.shutdown, SHUTDOWN_FAILURES_MAX, op)
    }

    /// Runs one ledger commit under the shared retry policy, as [`Shared::retry`] does, and
    /// waits out a failure of the ledger itself too (`Error::is_ledger_outage`), for at most
    /// `--ledger-outage-ms-max`: never counted against the entries. While it fails for the
    /// ledger's own reason, or for a transient one that has lasted
    /// [`LEDGER_TROUBLE_UNHEALTHY_MS`], `/healthz` says so.
    fn retry_ledger<T>(&self, what: &str, op: impl FnMut() -> Result<T>) -> Result<T> {
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
    fn halt(&self, stage: &str, cause: &str) {
        self.metrics.fail(format!("{stage}: {cause}"));
        error!("{stage} stopped: {cause}; stopping the worker");
        self.shutdown.trigger();
    }

    /// Runs a stage's body on its thread. A permanent error or a panic halts the whole worker
    /// at once: a stage that dies quietly would leave the others alive and doing nothing (the
    /// reader would notice only when it next had entries to hand on).
    fn stage(&self, name: &str, body: impl FnOnce() -> Result<()>) -> Result<()> {
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
struct HaltOnPanic<'s, 'a> {
    /// What the stages share.
    shared: &'s Shared<'a>,
    /// The stage, as the log line names it.
    name: &'s str,
}

impl Drop for HaltOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.halt(self.name, "the thread panicked");
        }
    }
}

/// Runs the worker until shutdown is requested or, with `exit_when_idle`, until the stream has
/// nothing undelivered and the group nothing pending. Transient failures never end it; a stage
/// that fails for good (a permanent error or a panic) ends it promptly, and the error is
/// returned.
pub fn run(
    cfg: &Config,
    wcfg: &WorkerConfig,
    ledger: &dyn Ledger,
    shutdown: &Shutdown,
    metrics: &Metrics,
    after_failover: AfterFailover<'_>,
) -> Result<()> {
    let client = stream::client(&cfg.redis_url)?;
    let shared = Shared {
        cfg,
        wcfg,
        shutdown,
        metrics,
        in_flight: InFlight::default(),
        filter: wcfg
            .fast_filter_ttl_s
            .map(|ttl_s| FastFilter::new(&cfg.stream, &cfg.group, ttl_s)),
        after_failover,
        budget: read_size::Budget::new(wcfg.read_bytes_max),
    };
    announce(cfg, wcfg);
    let (raw_tx, raw_rx) = bounded::<parse::Raw>(CHANNEL_BATCHES_MAX);
    let (parsed_tx, parsed_rx) = bounded::<parse::Batch>(CHANNEL_BATCHES_MAX);
    // Audit log lines, counters and freeing the batch happen on a thread of their own, so
    // the single writer spends its time on commits (+3-9% throughput, see BENCHMARKS.md).
    let (report_tx, report_rx) = bounded::<Committed>(CHANNEL_BATCHES_MAX);
    // The XACK of one batch overlaps the transaction of the next. One batch may wait: the
    // writer runs at most one commit ahead of the acknowledgements.
    let (ack_tx, ack_rx) = bounded::<acker::Settled>(1);
    let turns = writer::Turns::default();
    let (shared, client) = (&shared, &client);
    std::thread::scope(|s| {
        for _ in 0..wcfg.threads.max(1) {
            let (rx, tx) = (raw_rx.clone(), parsed_tx.clone());
            let filter = shared
                .filter
                .as_ref()
                .map(|f| (f, Conn::new(client.clone())));
            spawn_named(s, "parse", move || {
                shared.stage("parse thread", || {
                    parse::run(rx, tx, wcfg, filter);
                    Ok(())
                })
            });
        }
        drop((parsed_tx, raw_rx));
        spawn_named(s, "reporter", move || {
            signals::block_termination();
            shared.stage("reporter", || {
                reporter::run(report_rx, shared.metrics);
                Ok(())
            })
        });
        let acker_conn = Conn::new(client.clone());
        let acker = spawn_named(s, "acker", move || {
            signals::block_termination();
            shared.stage("acker", || {
                acker::run(ack_rx, acker_conn, shared, report_tx)
            })
        });
        // One writer per batch the ledger takes at once (contract point 9), in turns.
        let turns = &turns;
        let writers: Vec<_> = (0..ledger.writers().max(1))
            .map(|_| {
                let (rx, acks) = (parsed_rx.clone(), ack_tx.clone());
                let writer_conn = Conn::new(client.clone());
                spawn_named(s, "writer", move || {
                    signals::block_termination();
                    shared.stage("writer", || {
                        writer::run(rx, ledger, writer_conn, shared, acks, turns)
                    })
                })
            })
            .collect();
        drop((parsed_rx, ack_tx));
        // Dropped once the reader, writer and acker have returned: the heartbeat's cue to stop.
        let (pipeline_done, pipeline_done_rx) = bounded::<()>(0);
        let heartbeat = spawn_named(s, "heartbeat", move || {
            signals::block_termination();
            shared.stage("heartbeat", || {
                heartbeat::run(client, shared, pipeline_done_rx);
                Ok(())
            })
        });
        let reader = spawn_named(s, "reader", move || {
            signals::block_termination();
            shared.stage("reader", || reader::run(client, ledger, raw_tx, shared))
        });
        let read_result = joined(reader, "reader");
        let write_result = writers
            .into_iter()
            .map(|w| joined(w, "writer"))
            .fold(Ok(()), Result::and);
        let ack_result = joined(acker, "acker");
        drop(pipeline_done);
        let _ = heartbeat.join();
        // A later stage's failure is usually the cause of an earlier one's stop, so it is
        // named first.
        ack_result.and(write_result).and(read_result)
    })
}

/// The start-up line: who reads what, from where, how.
fn announce(cfg: &Config, wcfg: &WorkerConfig) {
    info!(
        "worker {} reading {} as group {} from {} ({} parse thread{}{})",
        wcfg.consumer,
        cfg.stream,
        cfg.group,
        stream::redact(&cfg.redis_url),
        wcfg.threads,
        if wcfg.threads == 1 { "" } else { "s" },
        if wcfg.per_message {
            ", per-message commits"
        } else {
            ""
        }
    );
}

/// A stage's result once its thread has ended; a panic becomes an error naming the stage.
fn joined(handle: ScopedJoinHandle<'_, Result<()>>, stage: &str) -> Result<()> {
    handle
        .join()
        .unwrap_or_else(|_| Err(Error::Other(format!("{stage} thread panicked"))))
}
