//! `claimgate relay`, and the relay settings `claimgate run --relay` shares.

use super::common::shutdown_on_signals;
use crate::config::{Config, LedgerConfig, EVENTS_STREAM_DEFAULT};
use crate::error::{Error, Result};
use crate::relay::{self, RelayConfig};
use crate::support::Shutdown;
use clap::Args;

/// Where and how the relay publishes (shared by `relay` and `run --relay`).
#[derive(Debug, Args)]
pub struct RelayOpts {
    /// The events stream outbox rows are published to.
    #[arg(long, env = "CLAIMGATE_EVENTS_STREAM", default_value = EVENTS_STREAM_DEFAULT)]
    pub events_stream: String,
    /// Outbox rows published per round (one Redis script call, one ledger transaction).
    #[arg(long, env = "CLAIMGATE_RELAY_BATCH_COUNT_MAX", default_value_t = relay::BATCH_COUNT_MAX_DEFAULT as u32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub relay_batch_count_max: u32,
    /// When the events stream stands below what the ledger marked published and Redis says its
    /// events were deleted, trimmed, or lost with the stream and its mark, the relay refuses
    /// and names the missing ids; this says where to go on from: the first missing id to
    /// publish them again, or the id after the last to leave them out. Used once.
    #[arg(long, env = "CLAIMGATE_RELAY_REPUBLISH_FROM", value_parser = clap::value_parser!(i64).range(1..))]
    pub republish_from: Option<i64>,
}

impl RelayOpts {
    /// The relay's configuration. Refused when the events stream is the submissions stream or
    /// its dead-letter stream: every event is a well-formed payload naming an award, a time and
    /// an amount, so a worker reading it back would take it for a submission.
    pub fn config(&self, cfg: &Config) -> Result<RelayConfig> {
        if self.events_stream == cfg.stream || self.events_stream == cfg.dead_stream() {
            return Err(Error::Config(format!(
                "--events-stream {} is the submissions stream {} or its dead letters: events \
                 published there would be read back as submissions",
                self.events_stream, cfg.stream
            )));
        }
        Ok(RelayConfig {
            redis_url: cfg.redis_url.clone(),
            events_stream: self.events_stream.clone(),
            batch_count_max: self.relay_batch_count_max as usize,
            redis_wait: cfg.redis_wait,
            republish_from: self.republish_from,
        })
    }
}

/// Flags of `claimgate relay`.
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Where and how to publish.
    #[command(flatten)]
    pub opts: RelayOpts,
    /// Exit 0 once no outbox row is left unpublished.
    #[arg(long, env = "CLAIMGATE_EXIT_WHEN_IDLE")]
    pub exit_when_idle: bool,
}

/// `claimgate relay`.
pub fn relay(cfg: &Config, args: RelayArgs) -> Result<()> {
    let shutdown = shutdown_on_signals()?;
    super::common::operator_signals()?;
    let rcfg = args.opts.config(cfg)?;
    crate::broker::stream::client(&rcfg.redis_url)?;
    let Some(ledger) = crate::ledger::open_waiting(&LedgerConfig::at(cfg.db.clone()), &shutdown)?
    else {
        return Ok(());
    };
    // `--exit-when-idle` holds from the start: a signal already triggered.
    let when_idle = Shutdown::new();
    if args.exit_when_idle {
        when_idle.trigger();
    }
    let stop = relay::Stop {
        shutdown: &shutdown,
        when_idle: &when_idle,
    };
    let totals = relay::run(&rcfg, &*ledger, &ledger.describe(), &stop)?;
    println!(
        "published {} events to {} ({} outbox rows marked published)",
        totals.published, rcfg.events_stream, totals.marked
    );
    Ok(())
}
