//! `claimgate status --watch [SECONDS]`: a live view for a box with no Prometheus. Every
//! interval it takes one status snapshot and shows how it moved since the last one.
//!
//! Where each figure comes from:
//! - processed, duplicates and dead letters per second: the ledger's own counts (the same ones
//!   `/metrics` serves as counters), differenced between two snapshots, so they cover every
//!   worker on the ledger and need no worker to be reachable;
//! - lag and oldest pending age: the consumer group in Redis; outbox backlog: the ledger;
//! - commit p99: only a worker process knows its commit latencies, so this one is read from its
//!   `/metrics` (`--metrics-url`, or `http://$CLAIMGATE_METRICS_ADDR/metrics`), over the
//!   interval (the histogram's growth since the last frame; the first frame covers the worker's
//!   life so far). Without a URL the figure says how to get it.
//!
//! Read-only, like `status`. A failure to read one side is shown in the frame and the watch
//! goes on; SIGINT or SIGTERM ends it with exit 0, as does a closed pipe (`| head`).

use crate::broker::stream::{self, Conn};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ledger::{Backend, Stats};
use crate::ops::scrape::{self, Buckets};
use crate::ops::status::{self, Doc, Status};
use crate::support::Shutdown;
use serde::Serialize;
use std::io::Write;
use std::time::{Duration, Instant};

/// How `status --watch` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Time between frames.
    pub interval: Duration,
    /// One JSON line per frame instead of a redrawn screen.
    pub json: bool,
    /// The worker's `/metrics` URL, for commit p99.
    pub metrics_url: Option<String>,
}

/// One look at the ledger, the stream and, given a URL, the worker's commit histogram.
struct Sample {
    /// When it was taken (rates divide by the time between two samples).
    at: Instant,
    /// The status, or why the ledger could not be read.
    status: std::result::Result<Status, String>,
    /// The commit histogram, or why it could not be read; `None` without a metrics URL.
    commits: Option<std::result::Result<Buckets, String>>,
}

/// How fast the ledger's counts grew between two samples.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Rates {
    /// Seconds between the two samples.
    pub interval_s: f64,
    /// Submissions claimed and disbursed per second.
    pub processed_per_s: f64,
    /// Deliveries suppressed as duplicates per second.
    pub duplicates_per_s: f64,
    /// Entries dead-lettered per second.
    pub dead_letters_per_s: f64,
}

/// What one frame shows beyond the status itself.
#[derive(Debug, Clone, Default, PartialEq)]
struct Moves {
    /// Rates since the previous sample; `None` on the first frame.
    rates: Option<Rates>,
    /// Commit p99 in seconds over the interval, if there were commits to measure.
    commit_p99_s: Option<f64>,
    /// Why there is no commit p99, when there is none.
    commit_note: Option<String>,
}

/// Counts only grow, except that a retention purge removes old records; a count that went
/// down reads as no growth, never as a negative rate.
pub fn rates(before: &Stats, now: &Stats, interval_s: f64) -> Rates {
    let per_s = |b: u64, n: u64| n.saturating_sub(b) as f64 / interval_s.max(1e-3);
    Rates {
        interval_s,
        processed_per_s: per_s(before.claims, now.claims),
        duplicates_per_s: per_s(before.duplicates_suppressed, now.duplicates_suppressed),
        dead_letters_per_s: per_s(before.dead_letters, now.dead_letters),
    }
}

/// Runs the watch until `stop` is triggered (SIGINT/SIGTERM) or stdout is closed. The wait
/// between frames is on `stop`, so a signal ends it at once.
pub fn run(cfg: &Config, ledger: &dyn Backend, opts: &Options, stop: &Shutdown) -> Result<()> {
    let mut conn = Conn::new(stream::client(&cfg.redis_url)?);
    let mut previous: Option<Sample> = None;
    loop {
        let sample = take(cfg, ledger, &mut conn, opts.metrics_url.as_deref());
        let moves = compare(previous.as_ref(), &sample, opts.metrics_url.is_some());
        let text = if opts.json {
            json_line(cfg, &sample, &moves)
        } else {
            screen(opts, &sample, &moves)
        };
        let mut out = std::io::stdout().lock();
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Error::io("writing status", e)),
        }
        drop(out);
        previous = Some(sample);
        if stop.wait_timeout(opts.interval) {
            if !opts.json {
                // The shell prompt goes below the last frame, not over it.
                println!();
            }
            return Ok(());
        }
    }
}

fn take(cfg: &Config, ledger: &dyn Backend, conn: &mut Conn, metrics_url: Option<&str>) -> Sample {
    let commits = metrics_url.map(|url| {
        scrape::get(url).and_then(|text| {
            scrape::buckets(&text, scrape::COMMIT_HISTOGRAM)
                .ok_or_else(|| format!("{url}: no {} histogram", scrape::COMMIT_HISTOGRAM))
        })
    });
    Sample {
        at: Instant::now(),
        status: status::gather(cfg, ledger, conn).map_err(|e| e.to_string()),
        commits,
    }
}

fn compare(previous: Option<&Sample>, now: &Sample, have_url: bool) -> Moves {
    let rates = match (previous.map(|p| (&p.status, p.at)), &now.status) {
        (Some((Ok(before), at)), Ok(s)) => Some(rates(
            &before.ledger,
            &s.ledger,
            now.at.duration_since(at).as_secs_f64(),
        )),
        _ => None,
    };
    let (commit_p99_s, commit_note) =
        match (&now.commits, previous.and_then(|p| p.commits.as_ref())) {
            (None, _) if !have_url => (
                None,
                Some("needs --metrics-url (the worker's /metrics)".into()),
            ),
            (None, _) => (None, None),
            (Some(Err(e)), _) => (None, Some(e.clone())),
            (Some(Ok(now)), before) => {
                let window = match before {
                    Some(Ok(before)) => scrape::delta(before, now),
                    _ => now.clone(),
                };
                match scrape::quantile(0.99, &window) {
                    Some(p99) => (Some(p99), None),
                    None => (None, Some("no commits in the interval".into())),
                }
            }
        };
    Moves {
        rates,
        commit_p99_s,
        commit_note,
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// One compact JSON object: `status --json`'s document plus `ts`, `rates` and commit p99.
fn json_line(cfg: &Config, sample: &Sample, moves: &Moves) -> String {
    #[derive(Serialize)]
    struct Line<'s> {
        /// When the sample was taken (UTC).
        ts: String,
        /// The status document, absent when the ledger could not be read.
        #[serde(flatten)]
        status: Option<Doc<'s>>,
        /// Why the ledger could not be read.
        #[serde(skip_serializing_if = "Option::is_none")]
        ledger_error: Option<&'s str>,
        /// Rates since the previous line; null on the first.
        rates: Option<Rates>,
        /// Commit p99 over the interval, in seconds.
        commit_p99_s: Option<f64>,
        /// Why `commit_p99_s` is null.
        #[serde(skip_serializing_if = "Option::is_none")]
        commit_p99_note: Option<&'s str>,
    }
    let line = Line {
        ts: now_rfc3339(),
        status: sample.status.as_ref().ok().map(|s| s.doc(cfg)),
        ledger_error: sample.status.as_ref().err().map(String::as_str),
        rates: moves.rates,
        commit_p99_s: moves.commit_p99_s,
        commit_p99_note: moves.commit_note.as_deref(),
    };
    serde_json::to_string(&line).expect("status serializes") + "\n"
}

/// The screen: cursor home, each line clearing what the last frame left, then the rest of the
/// screen cleared. Redrawn in place, without the flicker of clearing first.
fn screen(opts: &Options, sample: &Sample, moves: &Moves) -> String {
    let mut lines = vec![format!(
        "claimgate status --watch: every {}s, Ctrl-C to stop   {}",
        opts.interval.as_secs_f64(),
        now_rfc3339()
    )];
    lines.extend(summary(sample, moves));
    lines.push(String::new());
    match &sample.status {
        Ok(s) => lines.extend(status::table(s).lines().map(str::to_owned)),
        Err(e) => lines.push(format!("ledger unreadable: {e}")),
    }
    let mut text = String::from("\x1b[H");
    for line in lines {
        text.push_str(&line);
        text.push_str("\x1b[K\n");
    }
    text.push_str("\x1b[J");
    text
}

/// The figures the watch is for, one per line.
fn summary(sample: &Sample, moves: &Moves) -> Vec<String> {
    let rate = |pick: fn(&Rates) -> f64| match &moves.rates {
        Some(r) => format!("{:.1}/s", pick(r)),
        None => "measuring…".into(),
    };
    let stats = sample.status.as_ref().ok().map(|s| &s.ledger);
    let total = |pick: fn(&Stats) -> u64| stats.map_or("-".into(), |l| pick(l).to_string());
    let redis = sample
        .status
        .as_ref()
        .ok()
        .and_then(|s| s.redis.as_ref().ok());
    let commit = match (moves.commit_p99_s, &moves.commit_note) {
        (Some(s), _) => format!("{:.2} ms", s * 1000.0),
        (None, Some(note)) => format!("- ({note})"),
        (None, None) => "-".into(),
    };
    vec![
        format!(
            "  processed       {:>12}   total {}",
            rate(|r| r.processed_per_s),
            total(|l| l.claims)
        ),
        format!(
            "  duplicates      {:>12}   total {}",
            rate(|r| r.duplicates_per_s),
            total(|l| l.duplicates_suppressed)
        ),
        format!(
            "  dead letters    {:>12}   total {}",
            rate(|r| r.dead_letters_per_s),
            total(|l| l.dead_letters)
        ),
        format!(
            "  lag             {:>12}",
            redis
                .and_then(|r| r.lag)
                .map_or("-".into(), |n| n.to_string())
        ),
        format!(
            "  oldest pending  {:>12}   pending {}",
            status::age(redis.and_then(|r| r.oldest_pending_age_s)),
            redis.map_or("-".into(), |r| r.pending.to_string())
        ),
        format!(
            "  outbox backlog  {:>12}   oldest {}",
            total(|l| l.outbox_backlog),
            status::age(stats.and_then(|l| l.outbox_oldest_age_s))
        ),
        format!("  commit p99      {commit:>12}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_growth_per_second_and_never_negative() {
        let before = Stats {
            claims: 100,
            duplicates_suppressed: 4,
            dead_letters: 9,
            ..Stats::default()
        };
        let now = Stats {
            claims: 150,
            duplicates_suppressed: 6,
            // A purge removed dead letters: no growth, not a negative rate.
            dead_letters: 2,
            ..Stats::default()
        };
        let r = rates(&before, &now, 2.0);
        assert_eq!(r.processed_per_s, 25.0);
        assert_eq!(r.duplicates_per_s, 1.0);
        assert_eq!(r.dead_letters_per_s, 0.0);
    }
}
