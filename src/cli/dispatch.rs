//! The command line: the global flags, the commands, parsing (with the settings file
//! `envfile.rs` under the flags) and the dispatch to each command group's file.

use super::{audit, common, envfile, key, ops, produce, relay, retention, run};
use crate::config::{self, Config};
use crate::error::Result;
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

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
    /// Redis URL (redis://, rediss://, or redis+sentinel://[user:pass@]host:port,…/MASTER, with
    /// ?sentinel_password=P for sentinels that have one; credentials allowed; never logged).
    #[arg(long, env = "REDIS_URL", global = true, default_value = config::REDIS_URL_DEFAULT, hide_env_values = true)]
    pub redis_url: String,
    /// The ledger: a SQLite file, or a postgres:// / postgresql:// URL of the shared PostgreSQL
    /// ledger (credentials allowed; never shown).
    // Kept as given, neither path nor URL, until `GlobalArgs::config` parses it (once): clap's
    // own parse error would repeat the value, password and all. Shells still complete it as a
    // path, the common case.
    #[arg(long, env = "CLAIMGATE_DB", global = true, default_value = config::DB_DEFAULT, hide_env_values = true, value_hint = clap::ValueHint::AnyPath)]
    pub db: OsString,
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
    /// Writes that should survive a Redis failover (dead-letter copies, produce, the relay's
    /// publish) wait until this many replicas have them (WAIT); default 1 with a
    /// redis+sentinel:// URL, 0 (no wait) otherwise.
    #[arg(long, env = "CLAIMGATE_REDIS_WAIT_REPLICAS", global = true)]
    pub redis_wait_replicas: Option<u32>,
    /// How long such a write waits for its replicas before it is reported as failed.
    #[arg(long, env = "CLAIMGATE_REDIS_WAIT_MS", global = true, default_value_t = config::REDIS_WAIT_MS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=config::REDIS_WAIT_MS_MAX))]
    pub redis_wait_ms: u64,
    /// Read settings not given by a flag or the environment from this file, with systemd's
    /// EnvironmentFile= rules [default: /etc/claimgate/claimgate.env, the service's, when it
    /// exists]; '' reads none.
    #[arg(long, env = "CLAIMGATE_ENV_FILE", global = true, value_name = "FILE")]
    pub env_file: Option<String>,
    /// Whether --redis-url was given on the command line (not inherited from REDIS_URL).
    #[arg(skip)]
    pub redis_url_explicit: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker: read submissions, record each exactly once, acknowledge after commit.
    Run(run::RunArgs),
    /// Queue submissions: each line of a JSON-lines file (or stdin) becomes one stream entry.
    Produce(produce::ProduceArgs),
    /// Show ledger counts and totals, stream length, pending entries and backlog.
    Status(ops::StatusArgs),
    /// Print the idempotency key of a payload.
    Key(key::KeyArgs),
    /// Publish unpublished outbox rows to the events stream, each event exactly once.
    Relay(relay::RelayArgs),
    /// Export or verify the hash-chained audit trail.
    Audit(audit::AuditArgs),
    /// Check the ledger against itself and the audit chain; exit 1 naming the first violation.
    Verify,
    /// Purge records older than the retention window (exported first; never automatic).
    Retention(retention::RetentionArgs),
    /// Place, lift or list legal holds on awards (held awards are never purged).
    Hold(retention::HoldArgs),
    /// Inspect dead letters, replay one onto the submissions stream, or decide a conflict held
    /// for review (approve: pay it once; reject: never).
    Dlq(crate::ops::dlq::DlqArgs),
    /// The whole pipeline on a private redis-server and a temporary ledger, then a summary and
    /// an auditor's report (it uses its own temporary ledger and stream keys).
    Demo(crate::demo::DemoArgs),
    /// Copy the ledger consistently (while workers run) to a new file, mode 0600.
    Backup(ops::BackupArgs),
    /// Put a backup in place of the ledger (no worker may have it open); the ledger replaced
    /// is kept beside it, and every disbursement in the backup reaches the events stream once.
    Restore(ops::RestoreArgs),
    /// Copy the --db SQLite ledger into an empty PostgreSQL ledger, audit chain unchanged.
    Migrate(ops::MigrateArgs),
    /// Make the ledger (or upgrade one an earlier release made), then exit: on PostgreSQL, run
    /// it as the role that owns the schema before the workers start as theirs.
    Init,
}

impl Command {
    /// Whether the command reads the whole ledger through and exits (the allocator keeps
    /// freed pages for those: `support::allocator::keep_freed_pages`). The commands that run
    /// for days (`run`, `relay`) or beside them (`retention purge`, `backup`) are not among
    /// them: they hand freed memory back promptly.
    pub fn scans_the_ledger(&self) -> bool {
        matches!(self, Command::Verify | Command::Audit(_))
    }
}

impl GlobalArgs {
    /// The shared configuration, with `--db` parsed into where the ledger is: the one place a
    /// `--db` value is read. A value that names no ledger is [`crate::Error::Config`] (exit 2),
    /// never repeated.
    pub fn config(&self) -> Result<Config> {
        Ok(Config {
            redis_url: self.redis_url.clone(),
            db: config::LedgerLocation::parse(&self.db)?,
            stream: self.stream.clone(),
            group: self.group.clone(),
            redis_wait: config::RedisWait::for_url(
                &self.redis_url,
                self.redis_wait_replicas,
                self.redis_wait_ms,
            ),
        })
    }
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<()> {
    // `key` reads no setting, so a `--db` meant for the other commands cannot stop it.
    if let Command::Key(args) = cli.command {
        return key::key(args);
    }
    let cfg = cli.global.config()?;
    match cli.command {
        Command::Run(args) => run::run(&cfg, args),
        Command::Produce(args) => produce::produce(&cfg, args),
        Command::Status(args) => ops::status(&cfg, args),
        Command::Key(args) => key::key(args),
        Command::Relay(args) => relay::relay(&cfg, args),
        Command::Audit(args) => audit::audit(&cfg, args),
        Command::Verify => ops::verify(&cfg),
        Command::Retention(args) => retention::retention(&cfg, args),
        Command::Hold(args) => retention::hold(&cfg, args),
        Command::Dlq(crate::ops::dlq::DlqArgs {
            command: crate::ops::dlq::DlqCommand::Reconcile,
        }) => ops::dlq_reconcile(&cfg),
        Command::Dlq(crate::ops::dlq::DlqArgs {
            command: crate::ops::dlq::DlqCommand::Approve(args),
        }) => ops::dlq_decide(&cfg, crate::ledger::Verdict::Approved, &args),
        Command::Dlq(crate::ops::dlq::DlqArgs {
            command: crate::ops::dlq::DlqCommand::Reject(args),
        }) => ops::dlq_decide(&cfg, crate::ledger::Verdict::Rejected, &args),
        Command::Dlq(args) => crate::ops::dlq::run(&cfg, args),
        Command::Demo(args) => crate::demo::run(
            &cfg,
            args,
            cli.global.redis_url_explicit,
            &common::shutdown_on_signals()?,
        ),
        Command::Backup(args) => ops::backup(&cfg, args),
        Command::Restore(args) => ops::restore(&cfg, args),
        Command::Migrate(args) => ops::migrate(&cfg, args),
        Command::Init => ops::init(&cfg),
    }
}

/// The man pages and shell completions of this command line, as (relative path, contents):
/// what `packaging/generated/` holds (see `docs`).
pub fn docs() -> Vec<(PathBuf, Vec<u8>)> {
    super::docs::render(command())
}

/// The command line's definition, as `--help`, the man pages and the parser see it. Help names
/// each flag's environment variable but never shows its value: clap would print `[env:
/// CLAIMGATE_STREAM=]` for one that is unset, as if it were set to nothing, and a set one
/// may hold a secret.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    fn hide(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| a.hide_env_values(true))
            .mut_subcommands(hide)
    }
    let mut cmd = hide(Cli::command());
    // Global flags reach every subcommand, unless it has its own of the same name: a hidden
    // copy keeps a page from offering one its command ignores.
    for (sub, unused) in UNUSED_GLOBALS {
        let copies: Vec<clap::Arg> = cmd
            .get_arguments()
            .filter(|a| unused.contains(&a.get_id().as_str()))
            .map(|a| a.clone().hide(true))
            .collect();
        assert_eq!(
            copies.len(),
            unused.len(),
            "{sub}: every hidden flag is global"
        );
        cmd = cmd.mut_subcommand(sub, |s| s.args(copies));
    }
    // The demo starts a private redis-server and uses --redis-url only when it is given.
    let demo_redis = cmd
        .get_arguments()
        .find(|a| a.get_id() == "redis_url")
        .expect("--redis-url is global")
        .clone()
        .hide_default_value(true)
        .help(
            "Use this Redis instead of a private redis-server started for the demo (only when \
             given on the command line; the demo writes only fresh claimgate-demo-* keys there \
             and deletes them afterwards)",
        );
    cmd.mut_subcommand("demo", |s| s.arg(demo_redis))
}

/// The global flags each of these commands ignores, hidden from its help and man page (still
/// accepted, as every global flag is, so a script setting them for all commands keeps working).
const UNUSED_GLOBALS: [(&str, &[&str]); 3] = [
    (
        "key",
        &[
            "redis_url",
            "db",
            "stream",
            "group",
            "audit_log",
            "redis_wait_replicas",
            "redis_wait_ms",
            "env_file",
        ],
    ),
    ("produce", &["db", "group", "audit_log"]),
    (
        "demo",
        &[
            "db",
            "stream",
            "group",
            "audit_log",
            "redis_wait_replicas",
            "redis_wait_ms",
        ],
    ),
];

/// Parses the process's arguments, noting whether `--redis-url` came from the command line.
pub fn parse() -> Cli {
    use clap::FromArgMatches;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match envfile::apply(&args) {
        Ok(Some(applied)) if !applied.supplied.is_empty() => eprintln!(
            "claimgate: settings from {}: {}",
            applied.file.display(),
            applied.supplied.join(", ")
        ),
        Ok(_) => {}
        Err(e) => {
            eprintln!("claimgate: {e}");
            std::process::exit(2);
        }
    }
    let matches = command().get_matches_from(args);
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_page_offers_no_global_flag_its_command_ignores() {
        let help = |sub: &str| {
            let mut cmd = super::command();
            cmd.build();
            cmd.find_subcommand_mut(sub)
                .expect("a subcommand")
                .render_long_help()
                .to_string()
        };
        let key = help("key");
        assert!(
            !key.contains("--db") && !key.contains("--redis-url"),
            "{key}"
        );
        let produce = help("produce");
        assert!(
            produce.contains("--redis-url") && !produce.contains("--db"),
            "{produce}"
        );
        let demo = help("demo");
        assert!(
            !demo.contains("--stream <STREAM>") && !demo.contains("default: redis://"),
            "{demo}"
        );
        assert!(help("run").contains("--db"));
    }
}
