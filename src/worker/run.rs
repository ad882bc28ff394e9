//! [`run`]: the worker's threads and channels, wired together.

use super::in_flight::InFlight;
use super::reporter::Committed;
use super::shared::{AfterFailover, Shared};
use super::{acker, heartbeat, parse, read_size, reader, reporter, signals, writer};
use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::{self, Conn};
use crate::config::{Config, WorkerConfig, CHANNEL_BATCHES_MAX};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::observe::metrics::Metrics;
use crate::support::threads::spawn_named;
use crate::support::Shutdown;
use crossbeam_channel::bounded;
use log::info;
use std::thread::ScopedJoinHandle;

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
