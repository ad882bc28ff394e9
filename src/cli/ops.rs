//! The operator's commands on the ledger as a whole: `status` (once, or `--watch`), `verify`,
//! `backup`, `restore` and `migrate`.

use super::common::{open_existing, shutdown_on_signals};
use crate::config::{Config, LedgerConfig, LedgerLocation};
use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

/// Flags of `claimgate status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table (with --watch: one compact JSON line per interval).
    #[arg(long)]
    pub json: bool,
    /// Redraw every SECONDS (default 2) until Ctrl-C, with processed, duplicate and dead-letter
    /// rates per second, lag, oldest pending age, outbox backlog and commit p99.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2", value_parser = parse_interval_s)]
    pub watch: Option<f64>,
    /// The worker's /metrics URL (http://HOST:PORT/metrics), read by --watch for commit p99
    /// [default: http://$CLAIMGATE_METRICS_ADDR/metrics when that is set].
    #[arg(
        long,
        env = "CLAIMGATE_METRICS_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub metrics_url: Option<String>,
}

/// Smallest and largest `--watch` interval, in seconds.
const WATCH_S_MIN: f64 = 0.1;
const WATCH_S_MAX: f64 = 3600.0;

fn parse_interval_s(text: &str) -> std::result::Result<f64, String> {
    let s: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if (WATCH_S_MIN..=WATCH_S_MAX).contains(&s) {
        Ok(s)
    } else {
        Err(format!(
            "the interval must be between {WATCH_S_MIN} and {WATCH_S_MAX} seconds"
        ))
    }
}

/// Flags of `claimgate backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The new file to write; must not exist.
    pub out: PathBuf,
}

/// Flags of `claimgate restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup file to put in place of the ledger (made by `claimgate backup`; only read).
    pub backup: PathBuf,
    /// The events stream the relay publishes to (its mark tells which rows are published).
    #[arg(long, env = "CLAIMGATE_EVENTS_STREAM", default_value = crate::config::EVENTS_STREAM_DEFAULT)]
    pub events_stream: String,
}

/// `claimgate status`.
pub fn status(cfg: &Config, args: StatusArgs) -> Result<()> {
    let Some(interval_s) = args.watch else {
        return crate::ops::status::run(cfg, &*open_existing(cfg)?, args.json);
    };
    let shutdown = shutdown_on_signals()?;
    let Some(ledger) = ledger_once_made(cfg, interval_s, &shutdown)? else {
        return Ok(());
    };
    // Where `run --metrics-addr` listens, when the operator's environment says (the packaged
    // env file sets CLAIMGATE_METRICS_ADDR for the worker; sourcing it serves both).
    let metrics_url = args.metrics_url.or_else(|| {
        std::env::var("CLAIMGATE_METRICS_ADDR")
            .ok()
            .filter(|a| !a.is_empty())
            .map(|addr| format!("http://{addr}/metrics"))
    });
    let opts = crate::ops::watch::Options {
        interval: std::time::Duration::from_secs_f64(interval_s),
        json: args.json,
        metrics_url,
    };
    crate::ops::watch::run(cfg, &*ledger, &opts, &shutdown)
}

/// The ledger, for `status --watch`, which is started as often before the worker as after:
/// while there is none yet (`run` or `init` makes it), one line says so and the watch waits,
/// looking again every interval, until it is made or Ctrl-C (`None`).
fn ledger_once_made(
    cfg: &Config,
    interval_s: f64,
    shutdown: &crate::support::Shutdown,
) -> Result<Option<Box<dyn crate::ledger::Backend>>> {
    let mut said = false;
    loop {
        match open_existing(cfg) {
            Ok(ledger) => return Ok(Some(ledger)),
            Err(crate::error::Error::Config(why))
                if why.starts_with("no ledger at") || why.contains("no claimgate ledger in") =>
            {
                if !said {
                    eprintln!(
                        "claimgate: {why}; waiting for it to be made (by claimgate run or init)"
                    );
                    said = true;
                }
            }
            Err(e) => return Err(e),
        }
        if shutdown.wait_timeout(std::time::Duration::from_secs_f64(interval_s)) {
            return Ok(None);
        }
    }
}

/// `claimgate dlq reconcile`.
pub fn dlq_reconcile(cfg: &Config) -> Result<()> {
    let ledger = open_existing(cfg)?;
    let mut conn = crate::broker::stream::Conn::new(crate::broker::stream::client(&cfg.redis_url)?);
    let done = crate::ops::reconcile::reconcile(&mut conn, cfg, &*ledger)?;
    println!(
        "{} dead letters recorded in the ledger; {} were missing from {} and copied again ({} without original fields)",
        done.recorded,
        done.recopied,
        cfg.dead_stream(),
        done.without_fields
    );
    Ok(())
}

/// `claimgate dlq approve` / `claimgate dlq reject`.
pub fn dlq_decide(
    cfg: &Config,
    verdict: crate::ledger::Verdict,
    args: &crate::ops::dlq::DecideArgs,
) -> Result<()> {
    let ledger = open_existing(cfg)?;
    let mut conn = crate::broker::stream::Conn::new(crate::broker::stream::client(&cfg.redis_url)?);
    let said = crate::ops::review::decide(cfg, &*ledger, &mut conn, verdict, args)?;
    println!("{said}");
    Ok(())
}

/// `claimgate verify`.
pub fn verify(cfg: &Config) -> Result<()> {
    let ledger = open_existing(cfg)?;
    let s = crate::ops::verify::ledger(&*ledger)?;
    println!(
        "ledger verified: {} claims, {} disbursements, {} outbox rows, one each; {} tombstones of purged claims; {} audit records, chain intact (head {}); integrity ok",
        s.claims, s.disbursements, s.outbox_rows, s.tombstones, s.audit_records, s.head_hash
    );
    if s.unlinked_batches > 0 {
        println!(
            "{} committed batch(es) not linked into the audit chain yet: checked with the rest; \
             a node's start or a relay round links them",
            s.unlinked_batches
        );
    }
    Ok(())
}

/// `claimgate backup`.
pub fn backup(cfg: &Config, args: BackupArgs) -> Result<()> {
    let ledger = open_existing(cfg)?;
    crate::ops::backup::run(&*ledger, &args.out)
}

/// `claimgate restore`.
pub fn restore(cfg: &Config, args: RestoreArgs) -> Result<()> {
    crate::ops::restore::run(
        &cfg.db,
        &crate::ops::restore::Request {
            backup: &args.backup,
            redis_url: &cfg.redis_url,
            events_stream: &args.events_stream,
            stream: &cfg.stream,
        },
    )
}

/// Flags of `claimgate migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The empty PostgreSQL ledger to copy the --db SQLite ledger into (postgres://…; the
    /// password is never shown).
    // Kept as given until `migrate` parses it, as `--db` is (`GlobalArgs::db`). The path hint
    // keeps the shell completions as they were.
    #[arg(long, env = "CLAIMGATE_MIGRATE_TO", hide_env_values = true, value_hint = clap::ValueHint::AnyPath)]
    pub to: std::ffi::OsString,
}

/// `claimgate init`: the ledger made or upgraded (the one open that may, besides `run`,
/// `relay` and `migrate`), and where it is said.
pub fn init(cfg: &Config) -> Result<()> {
    let ledger = crate::ledger::open(&LedgerConfig::at(cfg.db.clone()))?;
    println!("ledger ready: {}", ledger.describe());
    Ok(())
}

/// `claimgate migrate --to URL`: from the SQLite ledger `--db` names to the PostgreSQL ledger
/// `--to` names; any other pair is refused (exit 2) before either is opened.
pub fn migrate(cfg: &Config, args: MigrateArgs) -> Result<()> {
    let LedgerLocation::File(path) = &cfg.db else {
        return Err(Error::Config(
            "migrate copies a SQLite ledger: --db must name its file".into(),
        ));
    };
    // Whatever `--to` is instead (a file, or no ledger at all) is not repeated: it may hold a
    // password.
    let Ok(LedgerLocation::Postgres(to)) = LedgerLocation::parse(&args.to) else {
        return Err(Error::Config(
            "migrate copies into a PostgreSQL ledger: --to must be a postgres:// or \
             postgresql:// URL"
                .into(),
        ));
    };
    let mut from = LedgerConfig::new(path);
    from.create = false;
    let m = crate::ledger::migrate(&from, &LedgerConfig::with_defaults(to))?;
    println!(
        "migrated {} claims, {} disbursements, {} outbox rows, {} audit records; both ledgers \
         verify with chain head {}",
        m.to.claims, m.to.disbursements, m.to.outbox_rows, m.to.audit_records, m.to.head_hash
    );
    println!(
        "{} is fenced: run and relay refuse it from now on. Next: set CLAIMGATE_DB (or --db) \
         to {} on every node, with its password, and start the workers there; keep the SQLite \
         file as it is, for reference",
        path.display(),
        m.target
    );
    Ok(())
}
