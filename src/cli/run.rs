//! `claimgate run`: the worker, with `/metrics` and an in-process relay when asked.

use super::common::shutdown_on_signals;
use super::relay::RelayOpts;
use crate::broker::binding;
use crate::broker::read::Limits;
use crate::broker::stream;
use crate::config::{
    self, Config, LedgerBackend, LedgerConfig, LedgerLocation, LedgerName, OnConflict,
    SqliteSettings, Synchronous, WorkerConfig,
};
use crate::error::{Error, Result};
use crate::observe::metrics::Metrics;
use crate::ops::anchoring::{self, Schedule};
use crate::support::Shutdown;
use clap::Args;

/// Flags of `claimgate run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// This consumer's name in the group [default: host name and pid].
    #[arg(long, env = "CLAIMGATE_CONSUMER")]
    pub consumer: Option<String>,
    /// Threads that parse, validate and hash entries.
    #[arg(long, env = "CLAIMGATE_THREADS", default_value_t = config::THREADS_DEFAULT as u16, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Take over entries other consumers have left idle this long.
    #[arg(long, env = "CLAIMGATE_CLAIM_IDLE_MS", default_value_t = config::CLAIM_IDLE_MS_DEFAULT)]
    pub claim_idle_ms: u64,
    /// Dead-letter an entry delivered more than this many times.
    #[arg(long, env = "CLAIMGATE_MAX_DELIVERIES", default_value_t = config::MAX_DELIVERIES_DEFAULT, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deliveries: u64,
    /// The least time between two tries alone of an entry past --max-deliveries, doubled after
    /// each try (30 s, 60 s, then 120 s before it is dead-lettered): a crash storm shorter than
    /// that cannot dead-letter a valid entry.
    #[arg(long, env = "CLAIMGATE_QUARANTINE_SPACING_MS", default_value_t = config::QUARANTINE_SPACING_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub quarantine_spacing_ms: u64,
    /// Refuse payloads larger than this many bytes (checked before parsing; also the limit of
    /// every other field, and the entry's limit with 64 KiB more); 256 to 512 MiB (a limit
    /// below any submission's size would dead-letter every entry).
    #[arg(long, env = "CLAIMGATE_PAYLOAD_BYTES_MAX", default_value_t = config::PAYLOAD_BYTES_MAX_DEFAULT as u64, value_parser = clap::value_parser!(u64).range(config::PAYLOAD_BYTES_MAX_MIN..=config::PAYLOAD_BYTES_MAX_MAX))]
    pub payload_bytes_max: u64,
    /// Dead-letter (`amount_too_large`) any submission whose amount_cents is over this. The
    /// default, 100000000000 cents ($1 billion), is above any single grant disbursement.
    #[arg(long, env = "CLAIMGATE_AMOUNT_CENTS_MAX", default_value_t = config::AMOUNT_CENTS_MAX_DEFAULT, value_parser = clap::value_parser!(i64).range(1..))]
    pub amount_cents_max: i64,
    /// Entries asked for per read.
    #[arg(long, env = "CLAIMGATE_BATCH_COUNT_MAX", default_value_t = config::BATCH_COUNT_MAX_DEFAULT as u32, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_count_max: u32,
    /// The most entry bytes the worker holds at once, read and not yet acknowledged (with a
    /// fixed cost per field); reads ask Redis for no more than what is left. At least what one
    /// entry of --payload-bytes-max may weigh (that plus 192 KiB).
    #[arg(long, env = "CLAIMGATE_READ_BYTES_MAX", default_value_t = config::READ_BYTES_MAX_DEFAULT as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub read_bytes_max: u64,
    /// Exit 0 once the stream has no undelivered entries and the group none pending.
    #[arg(long, env = "CLAIMGATE_EXIT_WHEN_IDLE")]
    pub exit_when_idle: bool,
    /// One transaction and one XACK per entry (the reference design's shape; slow, for comparison).
    #[arg(long, env = "CLAIMGATE_PER_MESSAGE")]
    pub per_message: bool,
    /// Skip the claim lookup for entries Redis marks as already committed (markers are written
    /// only after their commit; a miss asks the ledger).
    #[arg(long, env = "CLAIMGATE_FAST_FILTER")]
    pub fast_filter: bool,
    /// Lifetime of a --fast-filter marker, in seconds.
    #[arg(long, env = "CLAIMGATE_FAST_FILTER_TTL_S", default_value_t = crate::broker::fastfilter::FAST_FILTER_TTL_S_DEFAULT)]
    pub fast_filter_ttl_s: u64,
    /// SQLite synchronous level: full (default; survives power loss) or normal.
    #[arg(long, env = "CLAIMGATE_SYNCHRONOUS", value_enum, default_value_t)]
    pub synchronous: Synchronous,
    /// What to do with a resubmission reusing an award's timestamp with a different payload:
    /// record (pay it and leave a conflict record) or hold (dead-letter it for review).
    #[arg(long, env = "CLAIMGATE_ON_CONFLICT", value_enum, default_value_t)]
    pub on_conflict: OnConflict,
    /// Also run the outbox relay in this process (single-box setups).
    #[arg(long, env = "CLAIMGATE_RELAY")]
    pub relay: bool,
    /// Relay settings, used with --relay.
    #[command(flatten)]
    pub relay_opts: RelayOpts,
    /// Cap the ledger at this many pages (PRAGMA max_page_count); when it is full the worker
    /// leaves entries pending and retries until room is made.
    #[arg(long, env = "CLAIMGATE_LEDGER_PAGES_MAX", value_parser = clap::value_parser!(u64).range(1..))]
    pub ledger_pages_max: Option<u64>,
    /// Wait this long (ms) for a failure of the ledger as a whole (a privilege revoked, a
    /// read-only or damaged file, a missing schema) to clear before exiting 1; entries stay
    /// pending meanwhile, nothing is dead-lettered for it, and /healthz is 503.
    #[arg(long, env = "CLAIMGATE_LEDGER_OUTAGE_MS_MAX", default_value_t = config::LEDGER_OUTAGE_MS_MAX_DEFAULT, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub ledger_outage_ms_max: u64,
    /// Serve Prometheus /metrics and /healthz on this HOST:PORT.
    #[arg(long, env = "CLAIMGATE_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// Take an anchor of the audit chain this often (500ms, 30s, 5m, 1h) and once more on
    /// stopping; needs --anchor-out and/or --anchor-stream.
    #[arg(long, env = "CLAIMGATE_ANCHOR_EVERY", value_parser = parse_duration)]
    pub anchor_every: Option<std::time::Duration>,
    /// Append each anchor to this file (0600, created if absent).
    #[arg(long, env = "CLAIMGATE_ANCHOR_OUT", requires = "anchor_every")]
    pub anchor_out: Option<std::path::PathBuf>,
    /// Add each anchor to this Redis stream (field `anchor`), e.g. grants:audit:anchors.
    #[arg(long, env = "CLAIMGATE_ANCHOR_STREAM", requires = "anchor_every")]
    pub anchor_stream: Option<String>,
    /// Sign each anchor with this key file (`claimgate audit keygen`).
    #[arg(long, env = "CLAIMGATE_AUDIT_SIGNING_KEY")]
    pub signing_key: Option<std::path::PathBuf>,
}

/// `--anchor-every`: a number with a unit, `ms`, `s`, `m` or `h`.
fn parse_duration(s: &str) -> std::result::Result<std::time::Duration, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 30s, 5m or 1h"))?;
    let ms = match &s[digits.len()..] {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(format!("{s:?} needs a unit: ms, s, m or h")),
    }
    .ok_or_else(|| format!("{s:?} is too long"))?;
    if ms < crate::ops::anchoring::EVERY_MS_MIN {
        return Err(format!(
            "{s:?} is shorter than {} ms (each anchor walks the whole chain)",
            crate::ops::anchoring::EVERY_MS_MIN
        ));
    }
    Ok(std::time::Duration::from_millis(ms))
}

impl RunArgs {
    /// The ledger settings of a long-running writer. The flags only a SQLite ledger has become
    /// its [`SqliteSettings`]; given with a PostgreSQL URL, they are refused here, before
    /// anything is opened or made ([`RunArgs::refuse_sqlite_only`]).
    fn ledger_config(&self, cfg: &Config) -> Result<LedgerConfig> {
        let backend = match &cfg.db {
            LedgerLocation::File(path) => LedgerBackend::Sqlite(SqliteSettings {
                synchronous: self.synchronous,
                pages_max: self.ledger_pages_max,
                // The worker's commits should only append to the log; the ledger does its
                // housekeeping on a thread of its own for as long as it is open.
                background_checkpoints: true,
                ..SqliteSettings::new(path)
            }),
            LedgerLocation::Postgres(url) => {
                self.refuse_sqlite_only()?;
                LedgerBackend::Postgres(url.clone())
            }
        };
        let mut lcfg = LedgerConfig::with_defaults(backend);
        lcfg.on_conflict = self.on_conflict;
        Ok(lcfg)
    }

    /// Refuses the flags only a SQLite ledger has, when they ask for something other than the
    /// default: a PostgreSQL ledger has nowhere to hold them, and an operator who asked for a
    /// size cap or another durability level must not believe they hold. (PostgreSQL's
    /// durability is the server's `synchronous_commit`; its size, the server's disk and quotas.)
    fn refuse_sqlite_only(&self) -> Result<()> {
        let mut set = Vec::new();
        if self.synchronous != Synchronous::Full {
            set.push("--synchronous (CLAIMGATE_SYNCHRONOUS): a PostgreSQL ledger's durability is the server's synchronous_commit");
        }
        if self.ledger_pages_max.is_some() {
            set.push("--ledger-pages-max (CLAIMGATE_LEDGER_PAGES_MAX): size a PostgreSQL ledger with the server's disk and quotas");
        }
        if set.is_empty() {
            return Ok(());
        }
        Err(Error::Config(format!(
            "these settings apply to a SQLite ledger only and --db is a PostgreSQL URL; unset them: {}",
            set.join("; ")
        )))
    }

    /// The anchoring schedule, if `--anchor-every` was given. The anchors file is opened (and
    /// created) here, so a path that cannot be written is a configuration error at start, not a
    /// failure later.
    fn anchor_schedule(&self, cfg: &Config) -> Result<Option<Schedule>> {
        let Some(every) = self.anchor_every else {
            return Ok(None);
        };
        if self.anchor_out.is_none() && self.anchor_stream.is_none() {
            return Err(Error::Config(
                "--anchor-every needs --anchor-out FILE and/or --anchor-stream KEY: where the anchors go".into(),
            ));
        }
        if let Some(path) = &self.anchor_out {
            crate::support::files::append_private(path, crate::ops::evidence::is_anchor_line)
                .map_err(|e| Error::Config(format!("anchors file {}: {e}", path.display())))?;
        }
        let key = self
            .signing_key
            .as_deref()
            .map(crate::ops::evidence::load_signing_key)
            .transpose()?;
        Ok(Some(Schedule {
            every,
            out: self.anchor_out.clone(),
            stream: self.anchor_stream.clone(),
            redis_url: cfg.redis_url.clone(),
            key,
        }))
    }

    /// The worker's settings, for the ledger `ledger`.
    fn worker_config(&self, ledger: LedgerName) -> WorkerConfig {
        let consumer = self.consumer.clone().unwrap_or_else(default_consumer);
        let mut wcfg = WorkerConfig::new(consumer, ledger);
        wcfg.threads = self.threads.into();
        wcfg.claim_idle_ms = self.claim_idle_ms;
        wcfg.max_deliveries = self.max_deliveries;
        wcfg.ledger_outage_ms_max = self.ledger_outage_ms_max;
        wcfg.quarantine_spacing_ms = self.quarantine_spacing_ms;
        wcfg.payload_bytes_max = self.payload_bytes_max as usize;
        wcfg.amount_cents_max = self.amount_cents_max;
        wcfg.batch_count_max = self.batch_count_max as usize;
        wcfg.read_bytes_max = self.read_bytes_max as usize;
        wcfg.exit_when_idle = self.exit_when_idle;
        wcfg.per_message = self.per_message;
        wcfg.fast_filter_ttl_s = self.fast_filter.then_some(self.fast_filter_ttl_s);
        wcfg
    }

    /// Refuses a `--read-bytes-max` that cannot hold one entry of the largest size
    /// `--payload-bytes-max` allows: nothing could be read.
    fn check_read_budget(&self) -> Result<()> {
        let entry_max = Limits::for_payload(self.payload_bytes_max as usize).entry_weight_max();
        if (self.read_bytes_max as usize) < entry_max {
            return Err(Error::Config(format!(
                "--read-bytes-max {} cannot hold one entry of the size --payload-bytes-max {} \
                 allows ({entry_max} bytes with its overhead): raise --read-bytes-max to at \
                 least {entry_max}",
                self.read_bytes_max, self.payload_bytes_max
            )));
        }
        Ok(())
    }
}

/// The default consumer name: host name and pid, unique per process.
pub fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "claimgate".into());
    format!("{host}-{}", std::process::id())
}

/// The ledger as the worker names it to Redis and the operator: its id, made now if no relay or
/// backup made it before (a write, so a ledger locked by another process is waited out, as its
/// opening is), and where it is. `None` when a stop was asked for meanwhile.
fn ledger_name(
    ledger: &dyn crate::ledger::Backend,
    shutdown: &Shutdown,
) -> Result<Option<LedgerName>> {
    let id = crate::retry::until_stopped("opening the ledger", shutdown, || ledger.ledger_id())?;
    Ok(id.map(|id| LedgerName {
        id,
        shown: ledger.describe(),
    }))
}

/// Before anything reads the group or writes beside it: binds the group to this ledger, or
/// refuses (exit 2) when it belongs to another (`broker/binding.rs`). Redis unreachable is
/// waited out as the reader would, under the reader's name (one WARN, one INFO); `false` when
/// a stop was asked for meanwhile.
fn bind_at_start(
    cfg: &Config,
    target: &stream::Target,
    ledger: &LedgerName,
    shutdown: &Shutdown,
) -> Result<bool> {
    let mut conn = stream::Conn::new(target.clone());
    let bound = crate::retry::until_stopped(crate::worker::READING, shutdown, || {
        binding::bind_or_refuse(&mut conn, &cfg.stream, &cfg.group, ledger)
    })?;
    Ok(bound.is_some())
}

/// Behind Sentinel, before reading: copies again any dead letter a promotion lost
/// (`ops/reconcile.rs`). Redis being unreachable is not a reason to wait here (the worker
/// waits it out); it is logged, and the worker runs the same repair after its next failover
/// (`claimgate dlq reconcile` does it by hand). A master name no sentinel knows is a
/// configuration error (exit 2). Plain URLs skip this: without a promotion there is no lost
/// copy whose XACK survived.
fn reconcile_at_start(
    cfg: &Config,
    target: stream::Target,
    ledger: &dyn crate::ledger::Backend,
) -> Result<()> {
    if !matches!(target, stream::Target::Sentinel(_)) {
        return Ok(());
    }
    match reconcile_dead_letters(cfg, &mut stream::Conn::new(target), ledger) {
        Err(e) if e.is_transient() => log::warn!(
            "dead-letter reconciliation skipped at start-up ({e}); it runs again after the next \
             failover, or run `claimgate dlq reconcile` once Redis is back"
        ),
        other => other?,
    }
    Ok(())
}

/// Copies again the dead letters the ledger records but the dead-letter stream lacks, saying
/// so when there were any: at start-up behind Sentinel, and after every failover the worker
/// lives through (`worker::AfterFailover`).
fn reconcile_dead_letters(
    cfg: &Config,
    conn: &mut stream::Conn,
    ledger: &dyn crate::ledger::Backend,
) -> Result<()> {
    let done = crate::ops::reconcile::reconcile(conn, cfg, ledger)?;
    if done.recopied > 0 {
        log::warn!(
            "{} dead letters recorded in the ledger were missing from {}; copied again",
            done.recopied,
            cfg.dead_stream()
        );
    }
    Ok(())
}

/// `claimgate run`.
pub fn run(cfg: &Config, args: RunArgs) -> Result<()> {
    // Before anything else: settings that cannot go together are refused as flags are.
    let lcfg = args.ledger_config(cfg)?;
    // Then, so a SIGTERM during start-up (opening the ledger can wait on its lock) is a
    // graceful stop too, not death by the default signal action.
    let shutdown = shutdown_on_signals()?;
    super::common::operator_signals()?;
    let anchors = args.anchor_schedule(cfg)?;
    args.check_read_budget()?;
    let Some(ledger) = crate::ledger::open_waiting(&lcfg, &shutdown)? else {
        return Ok(());
    };
    let Some(name) = ledger_name(&*ledger, &shutdown)? else {
        return Ok(());
    };
    let wcfg = args.worker_config(name);
    let target = stream::client(&cfg.redis_url)?;
    if !bind_at_start(cfg, &target, &wcfg.ledger, &shutdown)? {
        return Ok(());
    }
    reconcile_at_start(cfg, target, &*ledger)?;
    let metrics = Metrics::default();
    let relay = args
        .relay
        .then(|| args.relay_opts.config(cfg))
        .transpose()?;
    let relay_failed = |e: &crate::Error| metrics.fail(format!("relay: {e}"));
    let anchoring_failed = |e: &crate::Error| metrics.fail(format!("anchoring: {e}"));
    let anchored = || metrics.anchored();
    if let Some(schedule) = &anchors {
        metrics.anchoring_every(schedule.every);
    }
    let work = || {
        anchoring::alongside(
            anchors.as_ref(),
            &*ledger,
            &shutdown,
            &anchoring_failed,
            &anchored,
            || {
                let shown = ledger.describe();
                crate::relay::alongside(
                    relay.as_ref(),
                    &*ledger,
                    &shown,
                    &shutdown,
                    &relay_failed,
                    || {
                        let after_failover = |conn: &mut stream::Conn| {
                            log::info!("the redis primary changed: checking the dead letters");
                            reconcile_dead_letters(cfg, conn, &*ledger)
                        };
                        crate::worker::run(
                            cfg,
                            &wcfg,
                            &*ledger,
                            &shutdown,
                            &metrics,
                            &after_failover,
                        )
                    },
                )
            },
        )
    };
    match &args.metrics_addr {
        Some(addr) => crate::observe::http::serve_during(addr, cfg, &*ledger, &metrics, work)?,
        None => work()?,
    }
    let quantile = |q| metrics.commit_latency.quantile_us(q).unwrap_or(0);
    log::info!(
        "worker stopped: {} processed, {} duplicates suppressed, {} dead-lettered, {} deferred \
         and offered again; commits={} commit_p50_us={} commit_p99_us={}",
        Metrics::get(&metrics.processed),
        Metrics::get(&metrics.duplicates),
        Metrics::get(&metrics.dead_lettered),
        Metrics::get(&metrics.deferred),
        Metrics::get(&metrics.commits),
        quantile(0.5),
        quantile(0.99)
    );
    // Where an entry's time went, read to XACK (p50/p99/max, µs): BENCHMARKS.md's quiet-stream
    // breakdown is read from this line.
    log::info!("stage latency: {}", metrics.stages.summary());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The run flags and shared settings of `claimgate ARGS`, as the binary parses them.
    fn parsed(args: &[&str]) -> (Config, RunArgs) {
        let cli = crate::cli::Cli::try_parse_from([&["claimgate"], args].concat()).unwrap();
        let cfg = cli.global.config().unwrap();
        match cli.command {
            crate::cli::Command::Run(run) => (cfg, run),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sqlite_only_flag_with_a_url_is_refused_naming_it_and_not_the_password() {
        let url = "postgresql://u:PW-SECRET@db/ledger";
        for (flags, named) in [
            (&["--synchronous", "normal"][..], "--synchronous"),
            (&["--ledger-pages-max", "1000"][..], "--ledger-pages-max"),
        ] {
            let (cfg, run) = parsed(&[&["--db", url, "run"], flags].concat());
            match run.ledger_config(&cfg) {
                Err(Error::Config(m)) => {
                    assert!(m.contains(named) && m.contains("SQLite ledger only"), "{m}");
                    assert!(!m.contains("PW-SECRET"), "{m}");
                }
                other => panic!("{flags:?}: {other:?}"),
            }
        }
        let (cfg, run) = parsed(&["--db", url, "run", "--synchronous", "full"]);
        assert!(matches!(
            run.ledger_config(&cfg).unwrap().backend,
            LedgerBackend::Postgres(_)
        ));
    }

    #[test]
    fn sqlite_only_flags_with_a_file_become_its_settings() {
        let (cfg, run) = parsed(&[
            "--db",
            "ledger.db",
            "run",
            "--synchronous",
            "normal",
            "--ledger-pages-max",
            "1000",
        ]);
        let LedgerBackend::Sqlite(file) = run.ledger_config(&cfg).unwrap().backend else {
            panic!("not a SQLite ledger")
        };
        assert_eq!(file.path, std::path::Path::new("ledger.db"));
        assert_eq!(file.synchronous, Synchronous::Normal);
        assert_eq!(file.pages_max, Some(1000));
        assert!(file.background_checkpoints);
    }
}
