//! The quarantine: an entry delivered more than `--max-deliveries` times is tried alone, at
//! most [`QUARANTINE_TRIES_MAX`] times, and dead-lettered only if every such try fails
//! (docs/failure-handling.md, "The quarantine rule"). The reader holds such entries back ([`Quarantine::hold`]) and hands them on one at
//! a time ([`Quarantine::next`]); the writer clears their marks ([`unmark`]).
//!
//! **Invariant:** an entry on its try alone is marked in `<stream>:quarantine` before it is
//! handed on, and is then the only entry in the pipeline: it is handed on only once nothing
//! else is in flight, and nothing else is handed on until it has left. A mark found on a
//! later delivery therefore means that its own try crashed or was refused. The mark counts the
//! tries; a delivery that would be try number `QUARANTINE_TRIES_MAX + 1` is dead-lettered.

use super::parse::Handoff;
use super::Shared;
use crate::broker::stream::{self, Conn, Entry};
use crate::config::QUARANTINE_TRIES_MAX;
use crate::domain::clock::now_rfc3339;
use crate::error::Result;
use log::{info, warn};
use std::collections::VecDeque;
use std::time::Duration;

/// The reader's side: entries past the cap waiting for their turn, and the one on its try.
#[derive(Debug, Default)]
pub(super) struct Quarantine {
    /// Entries past the delivery cap (already in `in_flight`), in the order they were read;
    /// the reader reads nothing new while any wait.
    waiting: VecDeque<Entry>,
    /// The entry on its try alone, while it is in the pipeline.
    solo: Option<String>,
}

impl Quarantine {
    /// Keeps entries past the delivery cap back (they stay in `in_flight`) and hands on the rest.
    pub(super) fn hold(&mut self, entries: Vec<Entry>, shared: &Shared<'_>) -> Handoff {
        let cap = shared.wcfg.max_deliveries;
        let (over, under): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| e.delivery_count > cap);
        self.waiting.extend(over);
        handoff(under, false)
    }

    /// The next handoff while entries wait, `None` when none does. Once nothing else is in the
    /// pipeline, the first waiting entry's mark counts one more try: while that is within
    /// [`QUARANTINE_TRIES_MAX`] the entry is handed on alone (`solo`); past it, every try alone
    /// has crashed or been refused, so the cap dead-letters it. Meanwhile: an empty handoff
    /// after a short nap.
    pub(super) fn next(&mut self, conn: &mut Conn, shared: &Shared<'_>) -> Result<Option<Handoff>> {
        let in_flight = &shared.in_flight;
        if let Some(id) = &self.solo {
            if in_flight.holds(id) {
                return Ok(Some(wait_a_moment()));
            }
            self.solo = None;
        }
        let Some(entry) = self.waiting.front() else {
            return Ok(None);
        };
        if in_flight.len() > self.waiting.len() {
            return Ok(Some(wait_a_moment()));
        }
        let (cfg, wcfg) = (shared.cfg, shared.wcfg);
        let note = format!("{} at {}", wcfg.consumer, now_rfc3339());
        let tries = stream::mark_quarantined(conn, &cfg.quarantine_key(), &entry.id, &note)?;
        let entry = self.waiting.pop_front().expect("looked at just now");
        if tries > QUARANTINE_TRIES_MAX {
            return Ok(Some(handoff(vec![entry], false)));
        }
        info!(
            "entry {} was delivered {} times (over --max-deliveries {}): trying it alone \
             (try {tries} of {QUARANTINE_TRIES_MAX})",
            entry.id, entry.delivery_count, wcfg.max_deliveries
        );
        self.solo = Some(entry.id.clone());
        Ok(Some(handoff(vec![entry], true)))
    }

    /// Lets go of every waiting entry (their group is gone).
    pub(super) fn forget(&mut self, shared: &Shared<'_>) {
        shared
            .in_flight
            .release(self.waiting.drain(..).map(|e| e.id));
        self.solo = None;
    }
}

/// A handoff of `entries`, read just now; `solo` for an entry past the cap on its try alone.
pub(super) fn handoff(entries: Vec<Entry>, solo: bool) -> Handoff {
    Handoff {
        entries,
        solo,
        read_at: std::time::Instant::now(),
        seq: 0,
    }
}

/// While the quarantine waits for the pipeline to empty: a short nap, then nothing to hand on.
fn wait_a_moment() -> Handoff {
    std::thread::sleep(Duration::from_millis(10));
    handoff(Vec::new(), false)
}

/// The writer's side: clears the marks of `ids`. Best effort: a mark left behind on an
/// acknowledged entry is never looked at again (its id is not delivered again).
pub(super) fn unmark(conn: &mut Conn, shared: &Shared<'_>, ids: &[&str]) {
    if ids.is_empty() {
        return;
    }
    let key = shared.cfg.quarantine_key();
    match stream::unmark_quarantined(conn, &key, ids) {
        Ok(()) => info!("cleared the quarantine mark of {} entries", ids.len()),
        Err(e) => warn!("could not clear the quarantine mark of {ids:?} in {key}: {e}"),
    }
}
