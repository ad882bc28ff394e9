//! The operator's commands on the ledger as a whole: `status`, `verify` and `backup`.

use super::common::open_existing;
use crate::config::Config;
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

/// `claimgate status`.
pub fn status(cfg: &Config, args: StatusArgs) -> Result<()> {
    let ledger = open_existing(cfg)?;
    crate::ops::status::run(cfg, &*ledger, args.json)
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

/// `claimgate verify`.
pub fn verify(cfg: &Config) -> Result<()> {
    let ledger = open_existing(cfg)?;
    let s = crate::ops::verify::ledger(&*ledger)?;
    println!(
        "ledger verified: {} claims, {} disbursements, {} outbox rows, one each; {} audit records, chain intact (head {}); integrity ok",
        s.claims, s.disbursements, s.outbox_rows, s.audit_records, s.head_hash
    );
    Ok(())
}

/// `claimgate backup`.
pub fn backup(cfg: &Config, args: BackupArgs) -> Result<()> {
    let ledger = open_existing(cfg)?;
    crate::ops::backup::run(&*ledger, &args.out)
}
