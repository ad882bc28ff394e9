//! Counters the worker keeps while it runs. Plain atomics: cheap on the hot path, readable from
//! any thread (the `/metrics` endpoint, the demo's progress line, tests).

use crate::observe::latency::Histogram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds, in seconds, of the commit-latency histogram's buckets.
pub const COMMIT_SECONDS_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// What one worker process has done since it started.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Submissions claimed and recorded by this process.
    pub processed: AtomicU64,
    /// Deliveries recognised as already processed and skipped.
    pub duplicates: AtomicU64,
    /// Entries copied to the dead-letter stream.
    pub dead_lettered: AtomicU64,
    /// Stream entries acknowledged.
    pub acked: AtomicU64,
    /// Entries a shared ledger deferred (ledger contract, point 8) and the writer offered again.
    pub deferred: AtomicU64,
    /// Ledger transactions committed.
    pub commits: AtomicU64,
    /// Commit latency histogram: counts per bucket of [`COMMIT_SECONDS_BUCKETS`], plus +Inf.
    pub commit_buckets: [AtomicU64; COMMIT_SECONDS_BUCKETS.len() + 1],
    /// Sum of commit latencies, in microseconds.
    pub commit_us_sum: AtomicU64,
    /// When the worker loop last went round, in milliseconds since the Unix epoch (`/healthz`).
    pub heartbeat_unix_ms: AtomicU64,
    /// Commit latencies at a resolution fine enough to quote p50/p99 from.
    pub commit_latency: Histogram,
    /// Where each entry's time went between its read and its XACK.
    pub stages: Stages,
    /// `run --anchor-every`'s interval in milliseconds; 0 when this process takes no anchors.
    pub anchor_interval_ms: AtomicU64,
    /// When the last anchor was written (or anchoring started, before the first), in
    /// milliseconds since the Unix epoch; 0 when this process takes no anchors.
    pub anchor_last_unix_ms: AtomicU64,
    /// Why the worker is stopping for good, once a stage has failed for a reason that will not
    /// clear by itself; `/healthz` is 503 from then on, however long the rest takes to stop.
    failure: Mutex<Option<String>>,
    /// What the ledger answers while a commit is being retried for a failure of the ledger
    /// itself (or a transient one that has lasted past `LEDGER_TROUBLE_UNHEALTHY_MS`);
    /// `/healthz` is 503 while it is set. Cleared by the commit that succeeds.
    ledger_trouble: Mutex<Option<String>>,
}

/// Per-entry latency of each stage of the worker, from the moment a read returned the entry to
/// the moment its XACK returned: the stages add up to `total`. Recorded by the writer for
/// every acknowledged entry (a few relaxed atomic adds each).
#[derive(Debug, Default)]
pub struct Stages {
    /// Read returned → parsed: waiting for a parse thread, validating and hashing.
    pub parse: Histogram,
    /// Parsed → its transaction began: waiting for the writer (the batch before it, gathering
    /// the group commit, copying dead letters).
    pub queue: Histogram,
    /// The ledger transaction that recorded it, begin to commit.
    pub commit: Histogram,
    /// Committed → XACK returned (held entries' copies included).
    pub ack: Histogram,
    /// Read returned → XACK returned.
    pub total: Histogram,
}

/// When one entry reached each stage boundary.
#[derive(Debug, Clone, Copy)]
pub struct StageTimes {
    /// The read that returned it.
    pub read: Instant,
    /// Parsing finished.
    pub parsed: Instant,
    /// Its transaction began.
    pub commit_began: Instant,
    /// Its transaction committed.
    pub committed: Instant,
    /// Its XACK returned.
    pub acked: Instant,
}

impl Stages {
    /// The names `/metrics` and the stop line give the stages, with each histogram.
    pub fn named(&self) -> [(&'static str, &Histogram); 5] {
        [
            ("parse", &self.parse),
            ("queue", &self.queue),
            ("commit", &self.commit),
            ("ack", &self.ack),
            ("total", &self.total),
        ]
    }

    /// Records one entry's way through the stages.
    pub fn observe(&self, t: &StageTimes) {
        let between = |a: Instant, b: Instant| b.saturating_duration_since(a);
        self.parse.record(between(t.read, t.parsed));
        self.queue.record(between(t.parsed, t.commit_began));
        self.commit.record(between(t.commit_began, t.committed));
        self.ack.record(between(t.committed, t.acked));
        self.total.record(between(t.read, t.acked));
    }

    /// One line: each stage's p50, p99 and max in microseconds, labelled
    /// (`parse p50=12us p99=40us max=51us; queue …`).
    pub fn summary(&self) -> String {
        self.named()
            .iter()
            .map(|(name, h)| {
                format!(
                    "{name} p50={}us p99={}us max={}us",
                    h.quantile_us(0.5).unwrap_or(0),
                    h.quantile_us(0.99).unwrap_or(0),
                    h.max_us().unwrap_or(0)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Metrics {
    /// Records one committed transaction's latency.
    pub fn observe_commit(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = COMMIT_SECONDS_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(COMMIT_SECONDS_BUCKETS.len());
        self.commit_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.commit_us_sum
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_latency.record(took);
    }

    /// Notes that this process anchors the audit chain every `every`, starting now.
    pub fn anchoring_every(&self, every: Duration) {
        self.anchor_interval_ms
            .store(every.as_millis() as u64, Ordering::Relaxed);
        self.anchored();
    }

    /// Notes that an anchor was just written.
    pub fn anchored(&self) {
        self.anchor_last_unix_ms.store(unix_ms(), Ordering::Relaxed);
    }

    /// Notes that the worker loop is alive and going round.
    pub fn beat(&self) {
        self.heartbeat_unix_ms.store(unix_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the last [`Metrics::beat`] (since the epoch if there was none).
    pub fn heartbeat_age_ms(&self) -> u64 {
        unix_ms().saturating_sub(self.heartbeat_unix_ms.load(Ordering::Relaxed))
    }

    /// Notes that the worker has failed for good, and why. The first cause is kept.
    pub fn fail(&self, cause: String) {
        self.failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(cause);
    }

    /// Notes that commits are failing for a reason of the ledger's own (`Some`), or that they
    /// succeed again (`None`).
    pub fn note_ledger_trouble(&self, trouble: Option<String>) {
        *self
            .ledger_trouble
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = trouble;
    }

    /// What [`Metrics::note_ledger_trouble`] noted last, while commits are failing.
    pub fn ledger_trouble(&self) -> Option<String> {
        self.ledger_trouble
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The cause passed to [`Metrics::fail`], if the worker has failed.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
