//! `claimgate key`: the idempotency key of a payload, so anyone can check it by hand.

use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

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

/// `claimgate key`.
pub fn key(args: KeyArgs) -> Result<()> {
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
