//! What several commands share: the shutdown flag and the ways to open the ledger. Every
//! command opens its ledger here, through the one open step (`ledger::open`), so none of them
//! names a backend.

use crate::config::{Config, LedgerConfig};
use crate::error::{Error, Result};
use crate::ledger::Backend;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Registers SIGINT and SIGTERM to set the returned flag.
pub fn shutdown_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&flag))
            .map_err(|e| Error::io("installing signal handlers", e))?;
    }
    Ok(flag)
}

/// Opens a ledger that must already exist. Only `run` and `relay` create a ledger; every other
/// command on a path with no ledger (a typo, the wrong directory) is a configuration error that
/// names the path, never a new empty ledger that makes a hold or a status look real.
pub fn open_existing(cfg: &Config) -> Result<Box<dyn Backend>> {
    let mut lcfg = LedgerConfig::new(&cfg.db_path);
    lcfg.create = false;
    crate::ledger::open(&lcfg)
}
