//! What several commands share: the shutdown signal and the ways to open the ledger. Every
//! command opens its ledger here, through the one open step (`ledger::open`), so none of them
//! names a backend.

use crate::config::{Config, LedgerConfig};
use crate::error::{Error, Result};
use crate::ledger::Backend;
use crate::support::Shutdown;

/// Registers SIGINT and SIGTERM to trigger the returned [`Shutdown`]: each replaces the
/// default action (death) with a graceful stop; a second one changes nothing.
///
/// A signal handler may not take a lock or notify a condition variable, so signal-hook's
/// handler only writes to its pipe, and a thread named `shutdown` reads it and triggers the
/// signal, waking every thread waiting on it.
pub fn shutdown_on_signals() -> Result<Shutdown> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| Error::io("installing signal handlers", e))?;
    let shutdown = Shutdown::new();
    let trigger = shutdown.clone();
    std::thread::Builder::new()
        .name("shutdown".into())
        .spawn(move || {
            for _ in signals.forever() {
                trigger.trigger();
            }
        })
        .map_err(|e| Error::io("starting the signal thread", e))?;
    Ok(shutdown)
}

/// Handles the signals an operator's tools send a service by habit, so none of them ends a
/// long-running command (`run`, `relay`) by its default action:
/// - SIGHUP (logrotate's `postrotate`, `systemctl reload`): reopens every file claimgate keeps
///   open to append to, which is the `--audit-log` file (an anchors file is opened by its path
///   for each anchor, so it needs nothing), and does nothing else;
/// - SIGUSR1, SIGUSR2: logged and otherwise ignored (claimgate gives them no meaning);
/// - SIGPIPE needs nothing here: the Rust runtime ignores it, so a closed pipe is an `EPIPE`
///   on that one write (a log line lost), never the end of the process.
///
/// A thread named `signals` takes them one at a time and logs each.
pub fn operator_signals() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGUSR1, SIGUSR2};
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGUSR1, SIGUSR2])
        .map_err(|e| Error::io("installing signal handlers", e))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                match signal {
                    SIGHUP => reopen_files(),
                    other => log::info!(
                        "{} received: claimgate gives it no meaning; ignored",
                        if other == SIGUSR1 {
                            "SIGUSR1"
                        } else {
                            "SIGUSR2"
                        }
                    ),
                }
            }
        })
        .map_err(|e| Error::io("starting the signal thread", e))?;
    Ok(())
}

/// SIGHUP: the audit log reopened by its path, and one line saying what happened.
fn reopen_files() {
    match crate::observe::logging::reopen() {
        Ok(Some(path)) => log::info!("SIGHUP: reopened the audit log {}", path.display()),
        Ok(None) => log::info!("SIGHUP: no audit log to reopen (no --audit-log)"),
        Err(e) => log::warn!("SIGHUP: {e}; audit lines still go to the file open before"),
    }
}

/// Opens a ledger that must already exist. Only `run` and `relay` create a ledger; every other
/// command on a path with no ledger (a typo, the wrong directory) is a configuration error that
/// names the path, never a new empty ledger that makes a hold or a status look real.
pub fn open_existing(cfg: &Config) -> Result<Box<dyn Backend>> {
    let mut lcfg = LedgerConfig::at(cfg.db.clone());
    lcfg.create = false;
    crate::ledger::open(&lcfg)
}
