//! The command line: flags, env vars, and one function per subcommand.
//!
//! Every flag can also come from the environment variable named beside it. Subcommand bodies
//! stay thin: they build configs, open what they need and call into the library.

mod trail;

use crate::broker::stream::{self, Conn};
use crate::config::{self, Config, LedgerConfig, OnConflict, Synchronous, WorkerConfig};
use crate::error::{Error, Result};
use crate::ledger::SqliteLedger;
use crate::observe::metrics::Metrics;
use clap::{Args, Parser, Subcommand};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// claimgate: pays each grant submission exactly once, however often Redis delivers it.
#[derive(Debug, Parser)]
#[command(name = "claimgate", version, about, propagate_version = true)]
pub struct Cli {
    /// Where things are; accepted before or after the subcommand.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand understands.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Redis URL (redis:// or rediss://, credentials allowed; never logged).
    #[arg(long, env = "REDIS_URL", global = true, default_value = config::REDIS_URL_DEFAULT, hide_env_values = true)]
    pub redis_url: String,
    /// The SQLite ledger file.
    #[arg(long, env = "CLAIMGATE_DB", global = true, default_value = config::DB_DEFAULT)]
    pub db: PathBuf,
    /// The submissions stream.
    #[arg(long, env = "CLAIMGATE_STREAM", global = true, default_value = config::STREAM_DEFAULT)]
    pub stream: String,
    /// The consumer group.
    #[arg(long, env = "CLAIMGATE_GROUP", global = true, default_value = config::GROUP_DEFAULT)]
    pub group: String,
    /// Log line format.
    #[arg(
        long,
        env = "CLAIMGATE_LOG_FORMAT",
        global = true,
        value_enum,
        default_value_t
    )]
    pub log_format: crate::observe::logging::Format,
    /// Append audit lines (target claimgate::audit) to this file instead of stderr.
    #[arg(long, env = "CLAIMGATE_AUDIT_LOG", global = true)]
    pub audit_log: Option<PathBuf>,
    /// Whether --redis-url was given on the command line (not inherited from REDIS_URL).
    #[arg(skip)]
    pub redis_url_explicit: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker: read submissions, record each exactly once, acknowledge after commit.
    Run(RunArgs),
    /// Queue submissions: each line of a JSON-lines file (or stdin) becomes one stream entry.
    Produce(ProduceArgs),
    /// Show ledger counts and totals, stream length, pending entries and backlog.
    Status(StatusArgs),
    /// Print the idempotency key of a payload.
    Key(KeyArgs),
    /// Publish unpublished outbox rows to the events stream, each event exactly once.
    Relay(crate::cli::trail::RelayArgs),
    /// Export or verify the hash-chained audit trail.
    Audit(crate::cli::trail::AuditArgs),
    /// Check the ledger against itself and the audit chain; exit 1 naming the first violation.
    Verify,
    /// Purge records older than the retention window (exported first; never automatic).
    Retention(crate::cli::trail::RetentionArgs),
    /// Place, lift or list legal holds on awards (held awards are never purged).
    Hold(crate::cli::trail::HoldArgs),
    /// Inspect dead letters and replay one onto the submissions stream.
    Dlq(crate::ops::dlq::DlqArgs),
    /// The whole pipeline on a private redis-server and a temporary ledger, then a summary
    /// (it uses its own temporary ledger and stream keys; --db, --stream and --group are ignored).
    Demo(crate::demo::DemoArgs),
    /// Copy the ledger consistently (while workers run) to a new file, mode 0600.
    Backup(BackupArgs),
}

/// Flags of `claimgate backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The new file to write; must not exist.
    pub out: PathBuf,
}

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
    /// Refuse payloads larger than this many bytes (checked before parsing).
    #[arg(long, env = "CLAIMGATE_PAYLOAD_BYTES_MAX", default_value_t = config::PAYLOAD_BYTES_MAX_DEFAULT)]
    pub payload_bytes_max: usize,
    /// Entries asked for per read.
    #[arg(long, env = "CLAIMGATE_BATCH_COUNT_MAX", default_value_t = config::BATCH_COUNT_MAX_DEFAULT as u32, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_count_max: u32,
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
    #[arg(long, env = "CLAIMGATE_SYNCHRONOUS", default_value = "full", value_parser = ["full", "normal"])]
    pub synchronous: String,
    /// What to do with a resubmission reusing an award's timestamp with a different payload:
    /// record (pay it and leave a conflict record) or hold (dead-letter it for review).
    #[arg(long, env = "CLAIMGATE_ON_CONFLICT", default_value = "record", value_parser = ["record", "hold"])]
    pub on_conflict: String,
    /// Also run the outbox relay in this process (single-box setups).
    #[arg(long, env = "CLAIMGATE_RELAY")]
    pub relay: bool,
    /// Relay settings, used with --relay.
    #[command(flatten)]
    pub relay_opts: crate::cli::trail::RelayOpts,
    /// Cap the ledger at this many pages (PRAGMA max_page_count); when it is full the worker
    /// leaves entries pending and retries until room is made.
    #[arg(long, env = "CLAIMGATE_LEDGER_PAGES_MAX", value_parser = clap::value_parser!(u64).range(1..))]
    pub ledger_pages_max: Option<u64>,
    /// Serve Prometheus /metrics and /healthz on this HOST:PORT.
    #[arg(long, env = "CLAIMGATE_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
}

/// Flags of `claimgate produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// JSON-lines file; stdin when absent or `-`.
    pub file: Option<PathBuf>,
}

/// Flags of `claimgate status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `claimgate key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The award id, exactly as in the payload.
    #[arg(long)]
    pub award_id: String,
    /// The submission timestamp, exactly as in the payload.
    #[arg(long)]
    pub timestamp: String,
    /// File holding the exact payload bytes (`-` for stdin). A trailing newline counts.
    #[arg(long)]
    pub payload_file: PathBuf,
}

impl GlobalArgs {
    /// The shared configuration.
    pub fn config(&self) -> Config {
        Config {
            redis_url: self.redis_url.clone(),
            db_path: self.db.clone(),
            stream: self.stream.clone(),
            group: self.group.clone(),
        }
    }
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<()> {
    let cfg = cli.global.config();
    match cli.command {
        Command::Run(args) => run(&cfg, args),
        Command::Produce(args) => produce(&cfg, args),
        Command::Status(args) => crate::ops::status::run(&cfg, args.json),
        Command::Key(args) => key(args),
        Command::Relay(args) => crate::cli::trail::relay(&cfg, args),
        Command::Audit(args) => crate::cli::trail::audit(&cfg, args),
        Command::Verify => crate::cli::trail::verify(&cfg),
        Command::Retention(args) => crate::cli::trail::retention(&cfg, args),
        Command::Hold(args) => crate::cli::trail::hold(&cfg, args),
        Command::Dlq(args) => crate::ops::dlq::run(&cfg, args),
        Command::Demo(args) => crate::demo::run(
            &cfg,
            args,
            cli.global.redis_url_explicit,
            &*shutdown_flag()?,
        ),
        Command::Backup(args) => crate::ops::backup::run(&cfg.db_path, &args.out),
    }
}

/// Parses the process's arguments, noting whether `--redis-url` came from the command line.
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let from_command_line = |m: &clap::ArgMatches| {
        m.value_source("redis_url") == Some(clap::parser::ValueSource::CommandLine)
    };
    cli.global.redis_url_explicit = from_command_line(&matches)
        || matches
            .subcommand()
            .is_some_and(|(_, sub)| from_command_line(sub));
    cli
}

impl GlobalArgs {
    /// How logs are written.
    pub fn logging(&self) -> crate::observe::logging::Options {
        crate::observe::logging::Options {
            format: self.log_format,
            audit_log: self.audit_log.clone(),
        }
    }
}

/// Registers SIGINT and SIGTERM to set the returned flag.
pub fn shutdown_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&flag))
            .map_err(|e| Error::io("installing signal handlers", e))?;
    }
    Ok(flag)
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

fn run(cfg: &Config, args: RunArgs) -> Result<()> {
    // First, so a SIGTERM during start-up (opening the ledger can wait on its lock) is a
    // graceful stop too, not death by the default signal action.
    let shutdown = shutdown_flag()?;
    let mut lcfg = LedgerConfig::new(&cfg.db_path);
    if args.synchronous == "normal" {
        lcfg.synchronous = Synchronous::Normal;
    }
    let on_conflict = if args.on_conflict == "hold" {
        OnConflict::Hold
    } else {
        OnConflict::Record
    };
    lcfg.pages_max = args.ledger_pages_max;
    // Checkpoints run on their own thread so the writer's commits only append to the WAL.
    lcfg.wal_autocheckpoint_pages = 0;
    let Some(ledger) = SqliteLedger::open_waiting(&lcfg, &shutdown)? else {
        return Ok(());
    };
    let ledger = ledger.with_on_conflict(on_conflict);
    let _checkpointer = crate::ledger::Checkpointer::start(&lcfg)?;
    stream::client(&cfg.redis_url)?;
    let mut wcfg = WorkerConfig::new(args.consumer.unwrap_or_else(default_consumer));
    wcfg.threads = args.threads.into();
    wcfg.claim_idle_ms = args.claim_idle_ms;
    wcfg.max_deliveries = args.max_deliveries;
    wcfg.payload_bytes_max = args.payload_bytes_max;
    wcfg.batch_count_max = args.batch_count_max as usize;
    wcfg.exit_when_idle = args.exit_when_idle;
    wcfg.per_message = args.per_message;
    wcfg.fast_filter_ttl_s = args.fast_filter.then_some(args.fast_filter_ttl_s);
    let metrics = Metrics::default();
    let relay = args.relay.then(|| args.relay_opts.config(cfg));
    let work = || {
        crate::relay::alongside(relay.as_ref(), &ledger, &shutdown, || {
            crate::worker::run(cfg, &wcfg, &ledger, &shutdown, &metrics)
        })
    };
    match &args.metrics_addr {
        Some(addr) => crate::observe::http::serve_during(addr, cfg, &ledger, &metrics, work)?,
        None => work()?,
    }
    let quantile = |q| metrics.commit_latency.quantile_us(q).unwrap_or(0);
    log::info!(
        "worker stopped: {} processed, {} duplicates suppressed, {} dead-lettered; \
         commits={} commit_p50_us={} commit_p99_us={}",
        Metrics::get(&metrics.processed),
        Metrics::get(&metrics.duplicates),
        Metrics::get(&metrics.dead_lettered),
        Metrics::get(&metrics.commits),
        quantile(0.5),
        quantile(0.99)
    );
    Ok(())
}

/// Lines XADDed per pipelined round trip.
const PRODUCE_PIPELINE_MAX: usize = 1_000;

fn produce(cfg: &Config, args: ProduceArgs) -> Result<()> {
    let input: Box<dyn BufRead> = match args.file.as_deref() {
        None => Box::new(std::io::stdin().lock()),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::stdin().lock()),
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p)
                .map_err(|e| Error::Config(format!("cannot read {}: {e}", p.display())))?,
        )),
    };
    let mut conn = Conn::new(stream::client(&cfg.redis_url)?);
    let mut pipe = redis::pipe();
    let (mut queued, mut pending) = (0u64, 0usize);
    for line in input.split(b'\n') {
        let mut line = line.map_err(|e| Error::io("reading submissions", e))?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        pipe.cmd("XADD")
            .arg(&cfg.stream)
            .arg("*")
            .arg("payload")
            .arg(line)
            .ignore();
        pending += 1;
        if pending == PRODUCE_PIPELINE_MAX {
            pipe.query::<()>(conn.get()?)?;
            pipe.clear();
            queued += pending as u64;
            pending = 0;
        }
    }
    if pending > 0 {
        pipe.query::<()>(conn.get()?)?;
        queued += pending as u64;
    }
    println!("queued {queued} submissions on {}", cfg.stream);
    Ok(())
}

fn key(args: KeyArgs) -> Result<()> {
    let payload = if args.payload_file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .map_err(|e| Error::io("reading stdin", e))?;
        buf
    } else {
        std::fs::read(&args.payload_file).map_err(|e| {
            Error::Config(format!("cannot read {}: {e}", args.payload_file.display()))
        })?
    };
    let key = crate::domain::key::derive_idempotency_key(&args.award_id, &args.timestamp, &payload)
        .map_err(|e| Error::Config(e.to_string()))?;
    println!("{key}");
    Ok(())
}
