//! `claimgate produce`: JSON lines in, one submissions-stream entry each.

use crate::broker::stream::{self, Conn};
use crate::config::Config;
use crate::error::{Error, Result};
use clap::Args;
use std::io::BufRead;
use std::path::PathBuf;

/// Lines XADDed per pipelined round trip.
const PRODUCE_PIPELINE_MAX: usize = 1_000;

/// Flags of `claimgate produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// JSON-lines file; stdin when absent or `-`.
    pub file: Option<PathBuf>,
}

/// `claimgate produce`.
pub fn produce(cfg: &Config, args: ProduceArgs) -> Result<()> {
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
            conn.pipeline::<()>(&pipe)?;
            confirm(&mut conn, cfg, queued)?;
            pipe.clear();
            queued += pending as u64;
            pending = 0;
        }
    }
    if pending > 0 {
        conn.pipeline::<()>(&pipe)?;
        confirm(&mut conn, cfg, queued)?;
        queued += pending as u64;
    }
    println!(
        "queued {queued} submission{} on {}",
        if queued == 1 { "" } else { "s" },
        cfg.stream
    );
    Ok(())
}

/// With `--redis-wait-replicas`, waits until the replicas have what was just added: a
/// submission only the primary held would be lost with it in a failover, so an unconfirmed
/// batch is an error (exit 1) and the producer sends it again (byte-identical lines are
/// harmless: the ledger pays each submission once). `before` lines were confirmed already.
fn confirm(conn: &mut Conn, cfg: &Config, before: u64) -> Result<()> {
    conn.wait_replicated(cfg.redis_wait).map_err(|e| {
        Error::Other(format!(
            "lines after the first {before} were added to {} but not confirmed on a replica \
             ({e}); send them again",
            cfg.stream
        ))
    })
}
