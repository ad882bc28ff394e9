//! The heartbeat: keeps this consumer's in-flight entries from looking abandoned while it is
//! still working on them.
//!
//! **Invariant:** the heartbeat never counts a delivery and never acknowledges anything; it only
//! resets the idle time of entries this consumer already owns (XCLAIM ... JUSTID).

use super::shared::Shared;
use crate::broker::stream::{self, Conn};
use crate::config::HEARTBEAT_IDS_MAX;
use crate::retry::Episode;
use crate::support::failpoint;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Every third of `claim_idle_ms`, re-claims this consumer's in-flight entries for itself with
/// XCLAIM JUSTID, which resets their idle time without counting a delivery. Without it, a stall
/// longer than `claim_idle_ms` (a commit waiting out a locked ledger or a full disk) lets other
/// consumers XAUTOCLAIM the entries back and forth, every claim counts as a delivery, and valid
/// entries cross `--max-deliveries` and are dead-lettered although nothing failed. When the
/// process dies the heartbeat stops with it and its entries are taken over after
/// `claim_idle_ms`. Returns once the pipeline is done.
pub(super) fn run(client: &stream::Target, shared: &Shared<'_>, pipeline_done: Receiver<()>) {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    let interval = Duration::from_millis((wcfg.claim_idle_ms / 3).clamp(10, 10_000));
    let mut conn = Conn::new(client.clone());
    let mut due = Instant::now() + interval;
    let mut episode = Episode::new("refreshing in-flight entries (heartbeat)");
    loop {
        // Sleeps until the beat is due, woken at once when the pipeline is done (its sender is
        // dropped then): a worker draining under --exit-when-idle exits without waiting here.
        let nap = due.saturating_duration_since(Instant::now());
        match pipeline_done.recv_timeout(nap) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if Instant::now() < due {
            continue;
        }
        due = Instant::now() + interval;
        if failpoint::off("heartbeat") {
            continue;
        }
        let mut result = Ok(());
        for chunk in shared.in_flight.ids().chunks(HEARTBEAT_IDS_MAX) {
            result = stream::touch(&mut conn, &cfg.stream, &cfg.group, &wcfg.consumer, chunk);
            if result.is_err() {
                break;
            }
        }
        // Logged once when refreshing starts failing and once when it works again: while it
        // fails, this consumer's entries can look abandoned to the others. Not retried sooner
        // than the next beat (the reader and writer carry the outage itself).
        match result {
            Ok(()) => episode.succeeded(),
            Err(e) => {
                episode.failed(&e);
            }
        }
    }
}
