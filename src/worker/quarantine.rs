//! The quarantine: an entry delivered more than `--max-deliveries` times is tried alone, at
//! most [`QUARANTINE_TRIES_MAX`] times, each try at least `--quarantine-spacing-ms` (doubled
//! after each try) after the one before, and dead-lettered only if every such try fails
//! (docs/failure-handling.md, "The quarantine rule"). The reader holds such entries back
//! ([`Quarantine::hold`]) and hands them on one at a time ([`Quarantine::next`]); one whose
//! next try is not due yet is *parked*: kept (in flight, so the heartbeat keeps it ours) while
//! the reader goes on reading everything else. Their marks are cleared ([`unmark`]) by the
//! writer when a try fails for a reason that is not the entry's (the ledger's, say), and by the
//! acknowledger once the entry is settled.
//!
//! **Invariant:** an entry on its try alone is marked in `<stream>:quarantine` before it is
//! handed on, and is then the only entry in the pipeline: it is handed on only once nothing
//! else is in flight, and nothing else is handed on until it has left. A mark found on a
//! later delivery therefore means that its own try crashed or was refused. The mark counts the
//! tries and when the last began, on Redis's clock; a try begins only once the spacing since
//! the last has passed, and a delivery that would be try number `QUARANTINE_TRIES_MAX + 1`
//! (spaced the same way) is dead-lettered. So a valid entry is dead-lettered only after tries
//! alone failed on three occasions at least `s` and `3s` after the first, and the dead letter
//! comes at least `7s` after it.

use super::in_flight::InFlight;
use super::parse::Handoff;
use super::shared::Shared;
use crate::broker::stream::{self, Conn, Entry, TryAlone};
use crate::config::{Config, QUARANTINE_TRIES_MAX};
use crate::domain::clock::now_rfc3339;
use crate::error::Result;
use crate::support::Shutdown;
use log::{info, warn};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The reader's side: entries past the cap waiting for their turn, and the one on its try.
#[derive(Debug, Default)]
pub(super) struct Quarantine {
    /// Entries past the delivery cap (already in `in_flight`), in the order they were read;
    /// the reader reads nothing new while any wait.
    waiting: VecDeque<Entry>,
    /// The entry on its try alone, while it is in the pipeline.
    solo: Option<String>,
    /// Entries past the cap whose next try alone is not due yet, with when it is. They stay
    /// in `in_flight` (not in the pipeline) while the reader reads on.
    parked: Vec<(Entry, Instant)>,
}

impl Quarantine {
    /// Keeps entries delivered more than `cap` (`--max-deliveries`) times back (they stay in
    /// `in_flight`) and hands on the rest.
    pub(super) fn hold(&mut self, entries: Vec<Entry>, cap: u64) -> Handoff {
        let (over, under): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| e.delivery_count > cap);
        self.waiting.extend(over);
        handoff(under, false)
    }

    /// The next handoff while entries wait, `None` when none does. Once nothing else is in the
    /// pipeline, the first waiting entry's mark counts one more try: while that is within
    /// [`QUARANTINE_TRIES_MAX`] the entry is handed on alone (`solo`); past it, every try alone
    /// has crashed or been refused, so the cap dead-letters it. Meanwhile: an empty handoff
    /// after a short nap (cut short by shutdown).
    pub(super) fn next(&mut self, conn: &mut Conn, shared: &Shared<'_>) -> Result<Option<Handoff>> {
        let in_flight = &shared.in_flight;
        if let Some(id) = &self.solo {
            if in_flight.holds(id) {
                return Ok(Some(wait_a_moment(shared.shutdown)));
            }
            self.solo = None;
        }
        self.unpark_due(in_flight);
        let Some(entry) = self.waiting.front() else {
            return Ok(None);
        };
        if in_flight.len() > self.waiting.len() + self.parked.len() {
            return Ok(Some(wait_a_moment(shared.shutdown)));
        }
        let (cfg, wcfg) = (shared.cfg, shared.wcfg);
        let note = format!("{} at {}", wcfg.consumer, now_rfc3339());
        let decided = stream::mark_quarantined(
            conn,
            &cfg.quarantine_key(),
            &entry.id,
            &note,
            wcfg.quarantine_spacing_ms,
        )?;
        let entry = self.waiting.pop_front().expect("looked at just now");
        let tries = match decided {
            TryAlone::Now(tries) => tries,
            TryAlone::Later(tries, wait_ms) => {
                info!(
                    "entry {} was delivered {} times (over --max-deliveries {}) and tried alone \
                     {tries} times; its next try alone is due in {wait_ms} ms",
                    entry.id, entry.delivery_count, wcfg.max_deliveries
                );
                let due = Instant::now() + Duration::from_millis(wait_ms);
                self.parked.push((entry, due));
                return Ok(Some(handoff(Vec::new(), false)));
            }
        };
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

    /// Moves parked entries whose try is due to the waiting queue. The rest are stamped as
    /// read just now: a parked entry is not in the pipeline, so it must not pause the reader's
    /// XAUTOCLAIM scan as an entry held up in the pipeline does (the heartbeat keeps it ours).
    fn unpark_due(&mut self, in_flight: &InFlight) {
        if self.parked.is_empty() {
            return;
        }
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|(_, at)| *at <= now);
        self.waiting.extend(due.into_iter().map(|(e, _)| e));
        in_flight.restamp(later.iter().map(|(e, _)| e.id.as_str()));
        self.parked = later;
    }

    /// Lets go of every waiting entry (their group is gone).
    pub(super) fn forget(&mut self, in_flight: &InFlight) {
        let parked = self.parked.drain(..).map(|(e, _)| e);
        in_flight.release(self.waiting.drain(..).chain(parked).map(|e| e.id));
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
/// The nap is on `shutdown`, so a stop ends it at once; the pipeline emptying is looked at
/// again after it (the reader's loop goes round).
fn wait_a_moment(shutdown: &Shutdown) -> Handoff {
    shutdown.wait_timeout(Duration::from_millis(10));
    handoff(Vec::new(), false)
}

/// Clears the marks of `ids` (the writer's and the acknowledger's side). Best effort: a mark left behind on an
/// acknowledged entry is never looked at again (its id is not delivered again).
pub(super) fn unmark(conn: &mut Conn, cfg: &Config, ids: &[&str]) {
    if ids.is_empty() {
        return;
    }
    let key = cfg.quarantine_key();
    match stream::unmark_quarantined(conn, &key, ids) {
        Ok(()) => info!("cleared the quarantine mark of {} entries", ids.len()),
        Err(e) => warn!("could not clear the quarantine mark of {ids:?} in {key}: {e}"),
    }
}
