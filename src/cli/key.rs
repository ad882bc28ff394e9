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
    /// File holding the payload, one line as `claimgate produce` reads it (`-` for stdin): its
    /// line ending is not part of the payload, as produce does not send it.
    #[arg(long)]
    pub payload_file: PathBuf,
    /// Take every byte of the file as the payload, a trailing newline included (a payload
    /// another producer sent with one).
    #[arg(long)]
    pub exact: bool,
}

/// `claimgate key`.
pub fn key(args: KeyArgs) -> Result<()> {
    let bytes = if args.payload_file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .map_err(|e| Error::io("reading stdin", e))?;
        buf
    } else {
        std::fs::read(&args.payload_file).map_err(|e| {
            Error::Config(format!("cannot read {}: {e}", args.payload_file.display()))
        })?
    };
    let payload = if args.exact {
        bytes.as_slice()
    } else {
        as_produce_sends(&bytes)?
    };
    if payload.len() != bytes.len() {
        eprintln!(
            "note: the file's line ending is not part of the payload, as `claimgate produce` \
             sends the line without it (--exact takes every byte)"
        );
    }
    let key = crate::domain::key::derive_idempotency_key(&args.award_id, &args.timestamp, payload)
        .map_err(|e| Error::Config(e.to_string()))?;
    println!("{key}");
    Ok(())
}

/// The one line of `bytes` as `claimgate produce` sends it: without a final `\n` or `\r\n`. A
/// file of several lines is refused: produce would send each as a submission of its own.
fn as_produce_sends(bytes: &[u8]) -> Result<&[u8]> {
    let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let line = if line.len() < bytes.len() {
        line.strip_suffix(b"\r").unwrap_or(line)
    } else {
        line
    };
    if line.contains(&b'\n') {
        return Err(Error::Config(
            "the payload file holds more than one line: claimgate produce would send each as a \
             submission of its own; give one line (or --exact for bytes that hold newlines)"
                .into(),
        ));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_file_reads_as_produce_sends_its_line() {
        assert_eq!(as_produce_sends(b"{...}\n").unwrap(), b"{...}");
        assert_eq!(as_produce_sends(b"{...}\r\n").unwrap(), b"{...}");
        assert_eq!(as_produce_sends(b"{...}").unwrap(), b"{...}");
        assert_eq!(as_produce_sends(b"{...}\r").unwrap(), b"{...}\r");
        assert!(as_produce_sends(b"{a}\n{b}\n").is_err());
    }
}
