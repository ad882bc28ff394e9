//! `claimgate retention purge` and `claimgate hold add|remove|list`: what may be removed, and
//! what never may.

use super::common::open_existing;
use crate::config::Config;
use crate::domain::clock::now_rfc3339;
use crate::error::{Error, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

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
        /// Sign the checkpoint the purge leaves with this key file (`claimgate audit keygen`).
        #[arg(long, env = "CLAIMGATE_AUDIT_SIGNING_KEY")]
        signing_key: Option<PathBuf>,
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

/// `claimgate retention purge`.
pub fn retention(cfg: &Config, args: RetentionArgs) -> Result<()> {
    let RetentionCommand::Purge {
        before,
        export,
        batch_records_max,
        signing_key,
    } = args.command;
    let signing_key = signing_key
        .as_deref()
        .map(crate::ops::evidence::load_signing_key)
        .transpose()?;
    let ledger = open_existing(cfg)?;
    let req = crate::ops::retention::Request {
        before: &before,
        export: export.as_deref(),
        ledger_at: &cfg.db,
        batch_records_max: batch_records_max as usize,
        signing_key: signing_key.as_ref(),
    };
    let signed = signing_key
        .as_ref()
        .map(|k| format!("; checkpoint signed with key {}", k.public_key().key_id()))
        .unwrap_or_default();
    match crate::ops::retention::purge(&*ledger, &req)? {
        None => println!("nothing recorded before {before}; nothing purged"),
        Some(p) => println!(
            "purged {} audit records (through seq {}), {} claims with their disbursements and outbox rows, {} dead letters; \
             exported first to {} (sha256 {}){signed}",
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
        // An award no submission can carry (too long for the ledgers' index) cannot be held.
        crate::domain::submission::check_award_id(award_id)
            .map_err(|m| Error::Config(format!("not an award id a submission can carry: {m}")))?;
    }
    let ledger = open_existing(cfg)?;
    match args.command {
        HoldCommand::Add { award_id, reason } => {
            let placed = ledger.hold_add(&award_id, &reason, &now_rfc3339())?;
            if placed {
                println!("{award_id}: now under legal hold");
                if ledger.claims_of(&award_id)? == 0 {
                    println!(
                        "note: the ledger holds no claim of {award_id} (yet): the hold covers \
                         those to come; if the award id is mistyped, lift it with hold remove"
                    );
                }
            } else {
                let held = ledger.holds()?.into_iter().find(|h| h.award_id == award_id);
                match held {
                    Some(h) if h.reason != reason => println!(
                        "{award_id}: already under legal hold since {} for {:?}; that reason \
                         stands (to change it, lift the hold and place it again)",
                        h.held_at, h.reason
                    ),
                    Some(h) => println!("{award_id}: already under legal hold since {}", h.held_at),
                    None => println!("{award_id}: already under legal hold"),
                }
            }
        }
        HoldCommand::Remove { award_id } => {
            let lifted = ledger.hold_remove(&award_id, &now_rfc3339())?;
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
            for h in ledger.holds()? {
                println!("{}\t{}\t{}", h.award_id, h.held_at, h.reason);
            }
        }
    }
    Ok(())
}
