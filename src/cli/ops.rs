//! The operator's commands on the ledger as a whole: `status`, `verify`, `backup`, `migrate`
//! and `restore`.

use super::common::open_existing;
use crate::config::{Config, LedgerConfig};
use crate::error::Result;
use clap::Args;
use std::path::PathBuf;

/// Flags of `claimgate status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
    let ledger = open_existing(cfg)?;
    crate::ops::status::run(cfg, &*ledger, args.json)
}

/// `claimgate verify`.
pub fn verify(cfg: &Config) -> Result<()> {
    let ledger = open_existing(cfg)?;
    let s = crate::ops::verify::ledger(&*ledger)?;
    println!(
        "ledger verified: {} claims, {} disbursements, {} outbox rows, one each; {} tombstones of purged claims; {} audit records, chain intact (head {}); integrity ok",
        s.claims, s.disbursements, s.outbox_rows, s.tombstones, s.audit_records, s.head_hash
    );
    Ok(())
}

/// `claimgate backup`.
pub fn backup(cfg: &Config, args: BackupArgs) -> Result<()> {
    let ledger = open_existing(cfg)?;
    crate::ops::backup::run(&*ledger, &args.out)
}

/// Flags of `claimgate migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The empty PostgreSQL ledger to copy the --db SQLite ledger into (postgres://…; the
    /// password is never shown).
    #[arg(long, env = "CLAIMGATE_MIGRATE_TO", hide_env_values = true)]
    pub to: PathBuf,
}

/// `claimgate migrate --to URL`.
pub fn migrate(cfg: &Config, args: MigrateArgs) -> Result<()> {
    let mut from = LedgerConfig::new(&cfg.db_path);
    from.create = false;
    let m = crate::ledger::migrate(&from, &LedgerConfig::new(&args.to))?;
    println!(
        "migrated {} claims, {} disbursements, {} outbox rows, {} audit records; both ledgers \
         verify with chain head {}",
        m.to.claims, m.to.disbursements, m.to.outbox_rows, m.to.audit_records, m.to.head_hash
    );
    Ok(())
}

/// `claimgate restore`.
pub fn restore(cfg: &Config, args: RestoreArgs) -> Result<()> {
    let lcfg = crate::config::LedgerConfig::new(&cfg.db_path);
    crate::ops::restore::run(
        &lcfg,
        &crate::ops::restore::Request {
            backup: &args.backup,
            redis_url: &cfg.redis_url,
            events_stream: &args.events_stream,
        },
    )
}
