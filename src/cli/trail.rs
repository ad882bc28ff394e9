//! Flags and bodies of the evidence commands: `relay`, `audit export|verify`, `verify`,
//! `retention purge` and `hold add|remove|list`. `cli.rs` only names them and dispatches.

use crate::config::{Config, LedgerConfig, EVENTS_STREAM_DEFAULT};
use crate::domain::clock::now_rfc3339;
use crate::error::{Error, Result};
use crate::ledger::sqlite::audit_store::{self, Since};
use crate::ledger::sqlite::purge as holds;
use crate::ledger::SqliteLedger;
use crate::relay::{self, RelayConfig};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

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
}

impl RelayOpts {
    /// The relay's configuration.
    pub fn config(&self, cfg: &Config) -> RelayConfig {
        RelayConfig {
            redis_url: cfg.redis_url.clone(),
            events_stream: self.events_stream.clone(),
            batch_count_max: self.relay_batch_count_max as usize,
        }
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

/// Flags of `claimgate audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// What to do with the audit trail.
    #[command(subcommand)]
    pub command: AuditCommand,
}

/// The `audit` subcommands.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Write the audit records as JSON lines, each with its prev_hash and hash.
    Export {
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only records from this seq, or written at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
    },
    /// Recompute the hash chain; exit 1 naming the first broken record.
    Verify {
        /// Verify an exported file instead of the ledger.
        #[arg(long)]
        file: Option<PathBuf>,
        /// With --file: the hash the file's first record links to (an export made with --since).
        #[arg(long, requires = "file")]
        continuing_from: Option<String>,
    },
}

/// Flags of `claimgate retention`.
#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: RetentionCommand,
}

/// The `retention` subcommands.
#[derive(Debug, Subcommand)]
pub enum RetentionCommand {
    /// Export, then delete, everything recorded before DATE (at least three years back).
    Purge {
        /// A date (YYYY-MM-DD, midnight UTC) or RFC 3339 date-time.
        #[arg(long)]
        before: String,
        /// The export file [default: next to the ledger, `<db>.purge-<time>.jsonl`].
        #[arg(long)]
        export: Option<PathBuf>,
        /// Audit records removed per transaction, with the ledger rows they describe.
        #[arg(long, default_value_t = crate::ops::retention::PURGE_BATCH_RECORDS_MAX as u32,
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch_records_max: u32,
    },
}

/// Flags of `claimgate hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: HoldCommand,
}

/// The `hold` subcommands.
#[derive(Debug, Subcommand)]
pub enum HoldCommand {
    /// Place an award under legal hold: nothing naming it will be purged.
    Add {
        /// The award id.
        award_id: String,
        /// Why (a case number, an auditor's request).
        #[arg(long, default_value = "legal hold")]
        reason: String,
    },
    /// Lift a legal hold.
    Remove {
        /// The award id.
        award_id: String,
    },
    /// List awards under legal hold.
    List,
}

/// Opens a ledger that must already exist (these commands never create one).
fn open_existing(cfg: &Config) -> Result<SqliteLedger> {
    if !cfg.db_path.exists() {
        return Err(Error::Config(format!(
            "no ledger at {}",
            cfg.db_path.display()
        )));
    }
    SqliteLedger::open(&LedgerConfig::new(&cfg.db_path))
}

/// `claimgate relay`.
pub fn relay(cfg: &Config, args: RelayArgs) -> Result<()> {
    let shutdown = crate::cli::shutdown_flag()?;
    let rcfg = args.opts.config(cfg);
    crate::broker::stream::client(&rcfg.redis_url)?;
    let Some(ledger) = SqliteLedger::open_waiting(&LedgerConfig::new(&cfg.db_path), &shutdown)?
    else {
        return Ok(());
    };
    let totals = relay::run(
        &rcfg,
        &ledger,
        &shutdown,
        &AtomicBool::new(args.exit_when_idle),
    )?;
    println!(
        "published {} events to {} ({} outbox rows marked published)",
        totals.published, rcfg.events_stream, totals.marked
    );
    Ok(())
}

/// `claimgate audit export|verify`.
pub fn audit(cfg: &Config, args: AuditArgs) -> Result<()> {
    match args.command {
        AuditCommand::Export { out, since } => export(cfg, out, since),
        AuditCommand::Verify {
            file: Some(path),
            continuing_from,
        } => {
            let (n, head) = crate::ops::verify::file(&path, continuing_from.as_deref())?;
            println!(
                "audit chain intact: {n} records in {}, head {head}",
                path.display()
            );
            Ok(())
        }
        AuditCommand::Verify { file: None, .. } => {
            let ledger = open_existing(cfg)?;
            let mut conn = ledger.connection()?;
            let tx = conn.transaction()?;
            let (n, head) = crate::ops::verify::chain(&tx)?;
            println!("audit chain intact: {n} records, head {head}");
            Ok(())
        }
    }
}

fn parse_since(since: Option<String>) -> Result<Since> {
    let Some(s) = since else {
        return Ok(Since::All);
    };
    if let Ok(seq) = s.parse::<i64>() {
        return Ok(Since::Seq(seq));
    }
    let t = time::OffsetDateTime::parse(&s, &time::format_description::well_known::Rfc3339)
        .map_err(|_| {
            Error::Config(format!(
                "--since {s:?} is neither a seq number nor an RFC 3339 date-time"
            ))
        })?;
    Ok(Since::Time(crate::domain::clock::ledger_time(t)))
}

fn export(cfg: &Config, out: Option<PathBuf>, since: Option<String>) -> Result<()> {
    let since = parse_since(since)?;
    let ledger = open_existing(cfg)?;
    let mut conn = ledger.connection()?;
    let tx = conn.transaction()?;
    let sink: Box<dyn Write> = match &out {
        Some(p) => Box::new(
            std::fs::File::create(p)
                .map_err(|e| Error::Config(format!("cannot create {}: {e}", p.display())))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut sink = std::io::BufWriter::new(sink);
    let (mut n, mut range, mut head) = (0u64, None::<(i64, i64)>, String::new());
    audit_store::for_each(&tx, &since, |r| {
        serde_json::to_writer(&mut sink, &r).expect("records serialize");
        sink.write_all(b"\n")
            .map_err(|e| Error::io("writing the export", e))?;
        n += 1;
        range = Some((range.map_or(r.seq, |(a, _)| a), r.seq));
        head = r.hash;
        Ok(())
    })?;
    sink.flush()
        .map_err(|e| Error::io("writing the export", e))?;
    if let Some(p) = &out {
        std::fs::File::open(p)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(format!("syncing {}", p.display()), e))?;
    }
    let seqs = range
        .map(|(a, b)| format!(" (seq {a}..={b}, last hash {head})"))
        .unwrap_or_default();
    eprintln!("exported {n} audit records{seqs}");
    Ok(())
}

/// `claimgate verify`.
pub fn verify(cfg: &Config) -> Result<()> {
    let ledger = open_existing(cfg)?;
    let mut conn = ledger.connection()?;
    let s = crate::ops::verify::ledger(&mut conn)?;
    println!(
        "ledger verified: {} claims, {} disbursements, {} outbox rows, one each; {} audit records, chain intact (head {}); integrity ok",
        s.claims, s.disbursements, s.outbox_rows, s.audit_records, s.head_hash
    );
    Ok(())
}

/// `claimgate retention purge`.
pub fn retention(cfg: &Config, args: RetentionArgs) -> Result<()> {
    let RetentionCommand::Purge {
        before,
        export,
        batch_records_max,
    } = args.command;
    let ledger = open_existing(cfg)?;
    let req = crate::ops::retention::Request {
        before: &before,
        export: export.as_deref(),
        batch_records_max: batch_records_max as usize,
    };
    match crate::ops::retention::purge(&ledger, &req)? {
        None => println!("nothing recorded before {before}; nothing purged"),
        Some(p) => println!(
            "purged {} audit records (through seq {}), {} claims with their disbursements and outbox rows, {} dead letters; \
             exported first to {} (sha256 {})",
            p.removed.records, p.through_seq, p.removed.claims, p.removed.dead_letters, p.export.display(), p.export_sha256
        ),
    }
    Ok(())
}

/// `claimgate hold add|remove|list`.
pub fn hold(cfg: &Config, args: HoldArgs) -> Result<()> {
    if let HoldCommand::Add { award_id, .. } | HoldCommand::Remove { award_id } = &args.command {
        if award_id.trim().is_empty() {
            return Err(Error::Config("the award id must not be empty".into()));
        }
    }
    let ledger = SqliteLedger::open(&LedgerConfig::new(&cfg.db_path))?;
    let mut conn = ledger.connection()?;
    match args.command {
        HoldCommand::Add { award_id, reason } => {
            let placed = holds::hold_add(&mut conn, &award_id, &reason, &now_rfc3339())?;
            println!(
                "{award_id}: {}",
                if placed {
                    "now under legal hold"
                } else {
                    "already under legal hold"
                }
            );
        }
        HoldCommand::Remove { award_id } => {
            let lifted = holds::hold_remove(&mut conn, &award_id)?;
            println!(
                "{award_id}: {}",
                if lifted {
                    "hold lifted"
                } else {
                    "was not under hold"
                }
            );
        }
        HoldCommand::List => {
            for h in holds::holds(&conn)? {
                println!("{}\t{}\t{}", h.award_id, h.held_at, h.reason);
            }
        }
    }
    Ok(())
}
