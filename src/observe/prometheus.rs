//! The Prometheus text that `/metrics` serves, built with `prometheus-client`.
//!
//! # Why the counters are read from the ledger
//! `claimgate_submissions_processed_total`, `claimgate_duplicates_suppressed_total` and
//! `claimgate_dead_lettered_total` are the ledger's own counts (`processed_messages` rows,
//! `duplicate` audit records, `dead_letters` rows), read at every scrape. So they equal the
//! ledger exactly, survive restarts without a reset, and do not double-count when several
//! workers share one ledger. They only ever grow, because nothing deletes claims or dead letters
//! and duplicate audit records are append-only; Prometheus' `rate()` works on them as on any
//! counter. What only this process knows (entries acknowledged, commit latency) is exposed as
//! per-process series that start at zero with the process, as Prometheus expects.
//!
//! Pure: it turns a [`Status`] and [`Metrics`] into text; the caller does all I/O.

use crate::observe::metrics::{Metrics, COMMIT_SECONDS_BUCKETS};
use crate::ops::status::Status;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The values of one scrape, fixed before encoding starts.
#[derive(Debug)]
struct Snapshot {
    /// Counters: name without `_total` (the encoder appends it), help, value.
    counters: Vec<(&'static str, &'static str, u64)>,
    /// Gauges that count things: name, help, value.
    counts: Vec<(&'static str, &'static str, i64)>,
    /// Gauges in seconds: name, help, value.
    ages: Vec<(&'static str, &'static str, f64)>,
    /// Commit latency: per-bucket counts (upper bound, count), sum in seconds, total count.
    commit_buckets: Vec<(f64, u64)>,
    /// Sum of commit latencies in seconds.
    commit_seconds_sum: f64,
    /// Commits observed.
    commit_count: u64,
    /// Per-entry stage latency, one histogram per stage.
    stages: Vec<StageHistogram>,
    /// `claimgate_build_info`'s labels: this build's version, and the ledger's kind.
    build: [(&'static str, String); 2],
}

/// One stage's histogram in a scrape.
#[derive(Debug)]
struct StageHistogram {
    /// The `stage` label.
    stage: &'static str,
    /// Per-bucket counts (upper bound, count), the last at +Inf.
    buckets: Vec<(f64, u64)>,
    /// Sum of observations, in seconds.
    sum_seconds: f64,
    /// Observations (the buckets' sum).
    count: u64,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (name, help, value) in &self.counters {
            let counter = ConstCounter::new(*value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        for (name, help, value) in &self.counts {
            let gauge = ConstGauge::new(*value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        for (name, help, value) in &self.ages {
            let gauge = ConstGauge::new(*value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let mut histogram = encoder.encode_descriptor(
            "claimgate_commit_seconds",
            "Ledger transaction commit latency, in seconds (this process).",
            None,
            MetricType::Histogram,
        )?;
        histogram.encode_histogram::<NoLabelSet>(
            self.commit_seconds_sum,
            self.commit_count,
            &self.commit_buckets,
            None,
        )?;
        let info = ConstGauge::new(1i64);
        info.encode(
            encoder
                .encode_descriptor(
                    "claimgate_build_info",
                    "1, labelled with this build's version and the kind of ledger it writes \
                     (sqlite or postgres).",
                    None,
                    info.metric_type(),
                )?
                .encode_family(&self.build.as_slice())?,
        )?;
        let mut stages = encoder.encode_descriptor(
            "claimgate_stage_seconds",
            "Per-entry latency of each worker stage, read to XACK, in seconds (this process): \
             parse, queue (waiting for the writer), commit, ack, and total.",
            None,
            MetricType::Histogram,
        )?;
        for h in &self.stages {
            stages
                .encode_family(&[("stage", h.stage)])?
                .encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)?;
        }
        Ok(())
    }
}

/// The Prometheus text (format 0.0.4) for one scrape. `healthy` is what `/healthz` would
/// answer now (true for 200).
pub fn render(status: &Status, metrics: &Metrics, healthy: bool) -> String {
    let l = &status.ledger;
    let counters = vec![
        ("claimgate_submissions_processed", "Submissions claimed and disbursed (ledger processed_messages rows).", l.claims),
        ("claimgate_duplicates_suppressed", "Deliveries recognised as already processed and skipped (ledger duplicate audit records).", l.duplicates_suppressed),
        ("claimgate_dead_lettered", "Entries dead-lettered with a reason (ledger dead_letters rows).", l.dead_letters),
        ("claimgate_conflicts", "Resubmissions that reused an award's timestamp with a different payload (ledger conflict audit records).", l.conflicts),
        ("claimgate_vanished_entries", "Pending entries found gone from the stream and acknowledged out (ledger vanished audit records).", l.vanished),
        ("claimgate_disbursed_cents", "Sum of all disbursements recorded in the ledger, in cents.", u64::try_from(l.disbursed_cents_total.max(0)).unwrap_or(u64::MAX)),
        ("claimgate_entries_acked", "Stream entries this process acknowledged since it started.", Metrics::get(&metrics.acked)),
        ("claimgate_entries_deferred", "Entries a shared ledger deferred because another node's batch held their group, offered again at once (PostgreSQL only).", Metrics::get(&metrics.deferred)),
    ];
    let mut counts = vec![
        (
            "claimgate_outbox_backlog",
            "Outbox rows not yet published to the events stream.",
            l.outbox_backlog as i64,
        ),
        (
            "claimgate_redis_up",
            "1 if Redis answered this scrape, else 0.",
            status.redis.is_ok() as i64,
        ),
        (
            "claimgate_healthy",
            "1 while /healthz answers 200 (worker loop going round, Redis and ledger answering), else 0.",
            healthy as i64,
        ),
    ];
    let mut ages = vec![(
        "claimgate_outbox_oldest_age_seconds",
        "Age of the oldest unpublished outbox row, 0 when none.",
        l.outbox_oldest_age_s.unwrap_or(0.0),
    )];
    // A conflict held for review is a payment waiting on a person (`dlq approve` / `reject`).
    if let Some(held) = &status.held {
        counts.push((
            "claimgate_conflicts_awaiting_review",
            "Conflicting resubmissions held for review (run --on-conflict hold) that no reviewer has approved or rejected yet (ledger dead_letters rows).",
            held.awaiting as i64,
        ));
        ages.push((
            "claimgate_conflict_review_oldest_age_seconds",
            "How long the oldest conflict held for review has waited for a decision, 0 when none.",
            held.oldest
                .first()
                .and_then(|h| crate::domain::clock::age_seconds(&h.held_at))
                .unwrap_or(0.0),
        ));
    }
    // Anchoring: Prometheus compares the two (an alert fires when no anchor came for three
    // intervals); both 0 on a process that takes no anchors.
    ages.push((
        "claimgate_audit_anchor_interval_seconds",
        "run --anchor-every's interval, 0 when this process takes no anchors.",
        Metrics::get(&metrics.anchor_interval_ms) as f64 / 1e3,
    ));
    ages.push((
        "claimgate_audit_anchor_last_timestamp_seconds",
        "Unix time of the last anchor written (of anchoring's start before the first), 0 when this process takes no anchors.",
        Metrics::get(&metrics.anchor_last_unix_ms) as f64 / 1e3,
    ));
    // Redis-side gauges are left out, not zeroed, when Redis did not answer: a missing series
    // is honest, a zero would claim nothing is pending.
    if let Ok(r) = &status.redis {
        counts.push((
            "claimgate_pending_entries",
            "Entries delivered to the group and not yet acknowledged.",
            r.pending as i64,
        ));
        counts.push((
            "claimgate_stream_length_entries",
            "Entries in the submissions stream.",
            r.length as i64,
        ));
        counts.push((
            "claimgate_dead_letter_stream_entries",
            "Entries in the dead-letter stream.",
            r.dead_letters as i64,
        ));
        if let Some(lag) = r.lag {
            counts.push((
                "claimgate_group_lag_entries",
                "Entries in the stream not yet delivered to the group.",
                lag as i64,
            ));
        }
        ages.push((
            "claimgate_oldest_pending_age_seconds",
            "Age of the oldest pending entry by Redis' clock, 0 when none.",
            r.oldest_pending_age_s.unwrap_or(0.0),
        ));
    }
    let commit_buckets: Vec<(f64, u64)> = COMMIT_SECONDS_BUCKETS
        .iter()
        .copied()
        .chain(std::iter::once(f64::INFINITY))
        .zip(metrics.commit_buckets.iter().map(Metrics::get))
        .collect();
    // Buckets are read one by one while commits go on: count is their sum, so the histogram
    // is always self-consistent even if the sum drifts by a commit in flight.
    let commit_count = commit_buckets.iter().map(|(_, n)| n).sum();
    let ledger_kind = if status.db.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let snapshot = Snapshot {
        build: [
            ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ("ledger", ledger_kind.to_owned()),
        ],
        counters,
        counts,
        ages,
        commit_buckets,
        commit_seconds_sum: Metrics::get(&metrics.commit_us_sum) as f64 / 1e6,
        commit_count,
        stages: metrics
            .stages
            .named()
            .iter()
            .map(|(stage, h)| {
                let buckets = h.regrouped(&COMMIT_SECONDS_BUCKETS);
                // The count is the buckets' sum (read once), so each series is self-consistent
                // while the writer records.
                StageHistogram {
                    stage,
                    count: buckets.iter().map(|(_, n)| n).sum(),
                    buckets,
                    sum_seconds: h.sum_seconds(),
                }
            })
            .collect(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Stats;
    use std::time::Duration;

    #[test]
    fn contract_names_are_present_with_ledger_values() {
        let status = Status {
            db: "x.db".into(),
            ledger: Stats {
                claims: 7,
                duplicates_suppressed: 2,
                dead_letters: 1,
                outbox_backlog: 3,
                ..Stats::default()
            },
            redis: Err(crate::ops::status::RedisTrouble {
                unreachable: true,
                message: "down".into(),
            }),
            held: None,
        };
        let metrics = Metrics::default();
        metrics.observe_commit(Duration::from_millis(3));
        metrics.observe_commit(Duration::from_secs(9));
        // One entry: 1 ms to parse, 2 ms queued, 3 ms committing, 4 ms to its XACK.
        let t0 = std::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        metrics
            .stages
            .observe(&crate::observe::metrics::StageTimes {
                read: t0,
                parsed: ms(1),
                commit_began: ms(3),
                committed: ms(6),
                acked: ms(10),
            });
        let text = render(&status, &metrics, false);
        for line in [
            "claimgate_submissions_processed_total 7",
            "claimgate_duplicates_suppressed_total 2",
            "claimgate_dead_lettered_total 1",
            "claimgate_outbox_backlog 3",
            "claimgate_redis_up 0",
            "claimgate_healthy 0",
            "claimgate_commit_seconds_bucket{le=\"0.005\"} 1",
            "claimgate_commit_seconds_bucket{le=\"+Inf\"} 2",
            "claimgate_commit_seconds_count 2",
            "claimgate_stage_seconds_bucket{stage=\"parse\",le=\"0.001\"} 0",
            "claimgate_stage_seconds_bucket{stage=\"parse\",le=\"0.0025\"} 1",
            "claimgate_stage_seconds_bucket{stage=\"queue\",le=\"0.0025\"} 1",
            "claimgate_stage_seconds_bucket{stage=\"commit\",le=\"0.0025\"} 0",
            "claimgate_stage_seconds_bucket{stage=\"commit\",le=\"0.005\"} 1",
            "claimgate_stage_seconds_bucket{stage=\"total\",le=\"0.01\"} 0",
            "claimgate_stage_seconds_bucket{stage=\"total\",le=\"0.025\"} 1",
            "claimgate_stage_seconds_count{stage=\"ack\"} 1",
            "claimgate_stage_seconds_sum{stage=\"total\"} 0.01",
            concat!(
                "claimgate_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\",ledger=\"sqlite\"} 1"
            ),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("claimgate_pending_entries"),
            "no pending gauge without Redis:\n{text}"
        );
    }

    #[test]
    fn anchoring_gauges_are_zero_without_anchors_and_carry_the_interval_and_last_time_with() {
        let status = Status {
            db: "x.db".into(),
            ledger: Stats::default(),
            redis: Err(crate::ops::status::RedisTrouble {
                unreachable: true,
                message: "down".into(),
            }),
            held: None,
        };
        let metrics = Metrics::default();
        let gauge = |text: &str, name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        let off = render(&status, &metrics, true);
        assert_eq!(gauge(&off, "claimgate_audit_anchor_interval_seconds"), 0.0);
        assert_eq!(
            gauge(&off, "claimgate_audit_anchor_last_timestamp_seconds"),
            0.0
        );
        metrics.anchoring_every(Duration::from_secs(300));
        let on = render(&status, &metrics, true);
        assert_eq!(gauge(&on, "claimgate_audit_anchor_interval_seconds"), 300.0);
        let last = gauge(&on, "claimgate_audit_anchor_last_timestamp_seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - last).abs() < 60.0, "last {last}, now {now}");
    }

    #[test]
    fn a_total_past_u64_saturates_instead_of_failing_the_scrape() {
        let status = Status {
            db: "x.db".into(),
            ledger: Stats {
                disbursed_cents_total: i128::from(u64::MAX) + 5,
                ..Stats::default()
            },
            redis: Err(crate::ops::status::RedisTrouble {
                unreachable: true,
                message: "down".into(),
            }),
            held: None,
        };
        let text = render(&status, &Metrics::default(), true);
        let line = format!("claimgate_disbursed_cents_total {}", u64::MAX);
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}
