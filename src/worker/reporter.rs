//! The reporter: the audit log lines (target `claimgate::audit`) and counters for committed
//! batches, on a thread of its own so the writer spends its time on commits.
//!
//! **Invariant:** a line is written only for an outcome the ledger committed and the writer
//! acknowledged, exactly once per outcome; nothing here talks to Redis or the ledger.

use super::parse::{Parsed, Verdict};
use crate::domain::audit;
use crate::ledger::Outcome;
use crate::observe::logging;
use crate::observe::metrics::Metrics;
use crossbeam_channel::{Receiver, Sender};
use log::{info, warn};
use std::sync::atomic::Ordering;

/// A batch that has been committed and acknowledged, on its way to the reporter.
pub(super) struct Committed {
    /// The entries, in stream order.
    pub(super) batch: Vec<Parsed>,
    /// Each entry's outcome; `None` where the ledger refused it (left pending).
    pub(super) outcomes: Vec<Option<Outcome>>,
}

/// Reports batches until the writer hangs up.
pub(super) fn run(rx: Receiver<Committed>, metrics: &Metrics) {
    for committed in rx {
        report_all(&committed, metrics);
    }
}

/// Hands a batch to the reporter. The reporter outlives the writer, so this fails only if it
/// panicked; then the lines are written here rather than lost.
pub(super) fn send(reports: &Sender<Committed>, committed: Committed, metrics: &Metrics) {
    if let Err(unsent) = reports.send(committed) {
        report_all(&unsent.into_inner(), metrics);
    }
}

/// A batch's lines and counters; the lines are written together (one write, not one per
/// entry: `logging::in_one_write`).
fn report_all(c: &Committed, metrics: &Metrics) {
    logging::in_one_write(|| {
        for (p, outcome) in c.batch.iter().zip(&c.outcomes) {
            if let Some(outcome) = outcome {
                report(p, outcome, metrics);
            }
        }
    });
}

/// The audit log line and counters for one committed outcome.
fn report(p: &Parsed, outcome: &Outcome, m: &Metrics) {
    match (&p.verdict, outcome) {
        (Verdict::Valid(s), Outcome::Processed) => {
            m.processed.fetch_add(1, Ordering::Relaxed);
            info!(target: audit::LOG_TARGET, "processed key={} award={} amount_cents={} entry={}", s.key.short(), s.award_id, s.amount_cents, p.id);
        }
        (
            Verdict::Valid(s),
            Outcome::Duplicate {
                first_claimed_at,
                purged_at,
            },
        ) => {
            m.duplicates.fetch_add(1, Ordering::Relaxed);
            let purged = purged_at
                .as_deref()
                .map(|at| format!(" claim_purged_at={at}"))
                .unwrap_or_default();
            info!(target: audit::LOG_TARGET, "duplicate key={} award={} entry={} deliveries={} first_claimed_at={first_claimed_at}{purged}; skipped", s.key.short(), s.award_id, p.id, p.delivery_count);
        }
        (Verdict::Valid(s), Outcome::ProcessedConflicting { other_key }) => {
            m.processed.fetch_add(1, Ordering::Relaxed);
            info!(target: audit::LOG_TARGET, "processed key={} award={} amount_cents={} entry={}", s.key.short(), s.award_id, s.amount_cents, p.id);
            warn!(target: audit::LOG_TARGET, "conflict key={} award={} entry={} other_key={}: same award and submission time, different payload; paid", s.key.short(), s.award_id, p.id, &other_key[..12]);
        }
        (
            Verdict::Valid(s),
            Outcome::Held {
                other_key,
                first: true,
            },
        ) => {
            m.dead_lettered.fetch_add(1, Ordering::Relaxed);
            warn!(target: audit::LOG_TARGET, "conflict key={} award={} entry={} other_key={}: held for review, not paid", s.key.short(), s.award_id, p.id, &other_key[..12]);
        }
        (Verdict::Rejected(r), Outcome::DeadLettered) => {
            m.dead_lettered.fetch_add(1, Ordering::Relaxed);
            info!(target: audit::LOG_TARGET, "dead_letter entry={} award={} reason={}: {}", p.id, r.award_id.as_deref().unwrap_or("-"), r.code, r.reason);
        }
        // Nothing new was written (an entry an earlier delivery dead-lettered or held), or a
        // pairing the ledger never returns.
        _ => {}
    }
}
