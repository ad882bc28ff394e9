//! The command line: flags, env vars, and one function per subcommand.
//!
//! Every flag can also come from the environment variable named beside it. Subcommand bodies
//! stay thin: they build configs, open what they need and call into the library.

use crate::config::{self, Config, LedgerConfig, Synchronous, WorkerConfig};
use crate::error::{Error, Result};
use crate::ledger::{Ledger, SqliteLedger};
use crate::metrics::Metrics;
use crate::stream::{self, Conn};
use clap::{Args, Parser, Subcommand};
use std::io::{BufRead, Write};
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
    /// SQLite synchronous level: full (default; survives power loss) or normal.
    #[arg(long, env = "CLAIMGATE_SYNCHRONOUS", default_value = "full", value_parser = ["full", "normal"])]
    pub synchronous: String,
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
        Command::Status(args) => status(&cfg, args),
        Command::Key(args) => key(args),
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
    let ledger = SqliteLedger::open(&lcfg)?;
    stream::client(&cfg.redis_url)?;
    let mut wcfg = WorkerConfig::new(args.consumer.unwrap_or_else(default_consumer));
    wcfg.threads = args.threads.into();
    wcfg.claim_idle_ms = args.claim_idle_ms;
    wcfg.max_deliveries = args.max_deliveries;
    wcfg.payload_bytes_max = args.payload_bytes_max;
    wcfg.batch_count_max = args.batch_count_max as usize;
    wcfg.exit_when_idle = args.exit_when_idle;
    wcfg.per_message = args.per_message;
    let metrics = Metrics::default();
    crate::worker::run(cfg, &wcfg, &ledger, &shutdown, &metrics)?;
    log::info!(
        "worker stopped: {} processed, {} duplicates suppressed, {} dead-lettered",
        Metrics::get(&metrics.processed),
        Metrics::get(&metrics.duplicates),
        Metrics::get(&metrics.dead_lettered)
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
    let key = crate::key::derive_idempotency_key(&args.award_id, &args.timestamp, &payload)
        .map_err(|e| Error::Config(e.to_string()))?;
    println!("{key}");
    Ok(())
}

/// What `status` reports about Redis.
#[derive(Debug, serde::Serialize)]
struct StreamStatus {
    stream: String,
    length: u64,
    group: String,
    pending: u64,
    lag: Option<u64>,
    dead_letters: u64,
}

fn stream_status(cfg: &Config) -> Result<StreamStatus> {
    let mut conn = Conn::new(stream::client(&cfg.redis_url)?);
    let length: u64 = conn.query(redis::cmd("XLEN").arg(&cfg.stream))?;
    let dead_letters: u64 = conn.query(redis::cmd("XLEN").arg(cfg.dead_stream()))?;
    let (mut pending, mut lag) = (0, None);
    let groups: redis::Value = match conn.query(redis::cmd("XINFO").arg("GROUPS").arg(&cfg.stream))
    {
        Ok(v) => v,
        Err(Error::Redis(e)) if e.to_string().contains("no such key") => redis::Value::Nil,
        Err(e) => return Err(e),
    };
    for g in stream::array(groups)? {
        let info = group_fields(g);
        let name = info
            .get("name")
            .cloned()
            .map(stream::string)
            .transpose()?
            .unwrap_or_default();
        if name == cfg.group {
            pending = info
                .get("pending")
                .cloned()
                .map(stream::int)
                .transpose()?
                .unwrap_or(0) as u64;
            lag = match info.get("lag") {
                Some(redis::Value::Nil) | None => None,
                Some(v) => Some(stream::int(v.clone())? as u64),
            };
        }
    }
    Ok(StreamStatus {
        stream: cfg.stream.clone(),
        length,
        group: cfg.group.clone(),
        pending,
        lag,
        dead_letters,
    })
}

fn group_fields(v: redis::Value) -> std::collections::HashMap<String, redis::Value> {
    let mut out = std::collections::HashMap::new();
    if let Ok(items) = stream::array(v) {
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let Ok(k) = stream::string(k) {
                out.insert(k, v);
            }
        }
    }
    out
}

fn status(cfg: &Config, args: StatusArgs) -> Result<()> {
    let ledger = SqliteLedger::open(&LedgerConfig::new(&cfg.db_path))?;
    let stats = ledger.stats()?;
    let redis = stream_status(cfg);
    let mut out = std::io::stdout().lock();
    if args.json {
        let redis_json = match &redis {
            Ok(s) => serde_json::to_value(s).expect("serializable"),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        let doc = serde_json::json!({ "ledger": stats, "redis": redis_json });
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializable")
        )
        .ok();
        return Ok(());
    }
    let dollars = format!(
        "{}.{:02}",
        stats.disbursed_cents_total / 100,
        stats.disbursed_cents_total % 100
    );
    let lines = [
        format!("ledger {}", cfg.db_path.display()),
        format!("  claims                 {}", stats.claims),
        format!("  disbursements          {}", stats.disbursements),
        format!(
            "  total disbursed        ${dollars} ({} cents)",
            stats.disbursed_cents_total
        ),
        format!("  duplicates suppressed  {}", stats.duplicates_suppressed),
        format!("  dead letters recorded  {}", stats.dead_letters),
        format!("  outbox backlog         {}", stats.outbox_backlog),
        format!("  audit records          {}", stats.audit_records),
    ];
    for l in lines {
        writeln!(out, "{l}").ok();
    }
    match redis {
        Ok(s) => {
            writeln!(out, "redis {}", stream::redact(&cfg.redis_url)).ok();
            writeln!(out, "  stream {}  length {}", s.stream, s.length).ok();
            let lag = s
                .lag
                .map(|l| l.to_string())
                .unwrap_or_else(|| "unknown".into());
            writeln!(out, "  group {}  pending {}  lag {lag}", s.group, s.pending).ok();
            writeln!(
                out,
                "  dead-letter stream {}  length {}",
                cfg.dead_stream(),
                s.dead_letters
            )
            .ok();
        }
        Err(e) => {
            writeln!(
                out,
                "redis {}: unreachable ({e})",
                stream::redact(&cfg.redis_url)
            )
            .ok();
        }
    }
    Ok(())
}
