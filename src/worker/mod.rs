//! `claimgate run`: the only module that holds both a Redis connection and the ledger.
//!
//! Three stages joined by bounded channels, so memory stays flat whatever the backlog:
//!
//! ```text
//! reader (1 thread, blocking XREADGROUP / XAUTOCLAIM)
//!   → parse pool (--threads: validate, hash, enforce the delivery cap)
//!     → writer (1 thread: dead letters, one ledger transaction per batch, then XACK)
//! ```
//!
//! The writer is the only place that acknowledges entries, and it does so only after the
//! transaction covering them has committed. A crash anywhere before that leaves the entries
//! pending; their redelivery finds the claims already taken and becomes a duplicate.

use crate::broker::fastfilter::FastFilter;
use crate::broker::stream::{self, Conn, Entry};
use crate::config::{
    backoff, Config, WorkerConfig, BLOCK_TIMEOUT_SLACK_MS, CHANNEL_BATCHES_MAX, COMMIT_ENTRIES_MAX,
};
use crate::domain::audit;
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::{self, Submission};
use crate::error::{Error, Result};
use crate::ledger::{Item, Ledger, Outcome};
use crate::observe::metrics::Metrics;
use crate::support::failpoint;
use crossbeam_channel::{bounded, Receiver, Sender};
use log::{error, info, warn};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Retries granted to a transient failure once shutdown has been asked for; after that the
/// entries are left pending (safe: they are redelivered) so the process can stop.
const SHUTDOWN_RETRIES_MAX: u32 = 3;

/// Most ids re-claimed by one heartbeat XCLAIM.
const HEARTBEAT_IDS_MAX: usize = 1_000;

/// What the stages share.
struct Shared<'a> {
    /// Where to read and what to call ourselves.
    cfg: &'a Config,
    /// Limits and policies.
    wcfg: &'a WorkerConfig,
    /// Set by SIGINT/SIGTERM (or a test): stop reading, finish what is in flight.
    shutdown: &'a AtomicBool,
    /// Counters for metrics and summaries.
    metrics: &'a Metrics,
    /// Ids read but not yet acknowledged or abandoned by this process, with when they were
    /// read. XAUTOCLAIM may hand our own slow entries back to us; these are skipped so an entry
    /// is never in the pipeline twice.
    in_flight: Mutex<HashMap<String, Instant>>,
    /// `--fast-filter`: markers for keys already committed, or `None`.
    filter: Option<FastFilter>,
}

impl Shared<'_> {
    fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    fn release(&self, ids: impl IntoIterator<Item = String>) {
        let mut set = self.in_flight.lock().expect("in-flight set poisoned");
        for id in ids {
            set.remove(&id);
        }
    }

    /// True when an entry has been in our pipeline long enough that an XAUTOCLAIM scan could
    /// take it back from us. Each such claim counts as a delivery, so while the writer waits
    /// out a long outage, scanning would push healthy entries over the delivery cap (and a
    /// restart would then dead-letter them). Half the idle time leaves a margin for the gap
    /// between Redis's delivery time and ours.
    fn holding_claimable(&self) -> bool {
        let held_max = Duration::from_millis(self.wcfg.claim_idle_ms / 2);
        let set = self.in_flight.lock().expect("in-flight set poisoned");
        set.values().any(|read_at| read_at.elapsed() >= held_max)
    }
}

/// An entry after the parse stage.
struct Parsed {
    /// The stream entry id.
    id: String,
    /// Deliveries so far.
    delivery_count: u64,
    /// Valid, or why not.
    verdict: Verdict,
    /// Set by the fast filter: when this valid submission's key was seen committed.
    committed_by: Option<String>,
}

enum Verdict {
    Valid(Submission),
    Dead(DeadLetter),
}

/// A permanently bad entry on its way to the dead-letter stream.
struct DeadLetter {
    /// The whole original entry, copied into the dead letter.
    entry: Entry,
    /// Short class, e.g. `not_json` or `max_deliveries`.
    code: &'static str,
    /// The reason in words.
    reason: String,
    /// The award, where readable.
    award_id: Option<String>,
    /// The key, where derivable.
    key: Option<IdempotencyKey>,
}

/// Runs the worker until shutdown is requested or, with `exit_when_idle`, until the stream has
/// nothing undelivered and the group nothing pending. Transient failures never end it.
pub fn run(
    cfg: &Config,
    wcfg: &WorkerConfig,
    ledger: &dyn Ledger,
    shutdown: &AtomicBool,
    metrics: &Metrics,
) -> Result<()> {
    let client = stream::client(&cfg.redis_url)?;
    let filter = wcfg
        .fast_filter_ttl_s
        .map(|ttl_s| FastFilter::new(&cfg.stream, &cfg.group, ttl_s));
    let shared = Shared {
        cfg,
        wcfg,
        shutdown,
        metrics,
        in_flight: Mutex::new(HashMap::new()),
        filter,
    };
    let pipeline_done = AtomicBool::new(false);
    let (raw_tx, raw_rx) = bounded::<Vec<Entry>>(CHANNEL_BATCHES_MAX);
    let (parsed_tx, parsed_rx) = bounded::<Vec<Parsed>>(CHANNEL_BATCHES_MAX);
    info!(
        "worker {} reading {} as group {} from {} ({} parse threads{})",
        wcfg.consumer,
        cfg.stream,
        cfg.group,
        stream::redact(&cfg.redis_url),
        wcfg.threads,
        if wcfg.per_message {
            ", per-message commits"
        } else {
            ""
        }
    );
    std::thread::scope(|s| {
        for _ in 0..wcfg.threads.max(1) {
            let (rx, tx, shared) = (raw_rx.clone(), parsed_tx.clone(), &shared);
            let filter = shared
                .filter
                .as_ref()
                .map(|f| (f, Conn::new(client.clone())));
            s.spawn(move || parse_loop(rx, tx, shared.wcfg, filter));
        }
        drop(parsed_tx);
        drop(raw_rx);
        let writer_client = client.clone();
        let shared_ref = &shared;
        // Audit log lines, counters and freeing the batch happen on a thread of their own, so
        // the single writer spends its time on commits (+3-9% throughput, see BENCHMARKS.md).
        let (report_tx, report_rx) = bounded::<Committed>(CHANNEL_BATCHES_MAX);
        s.spawn(move || {
            block_termination_signals();
            report_loop(report_rx, shared_ref)
        });
        let writer = s.spawn(move || {
            block_termination_signals();
            writer_loop(
                parsed_rx,
                ledger,
                Conn::new(writer_client),
                shared_ref,
                report_tx,
            )
        });
        let heartbeat = s.spawn(|| {
            block_termination_signals();
            heartbeat_loop(&client, &shared, &pipeline_done)
        });
        let reader = s.spawn(|| {
            block_termination_signals();
            reader_loop(&client, raw_tx, &shared)
        });
        let read_result = reader
            .join()
            .unwrap_or_else(|_| Err(Error::Other("reader thread panicked".into())));
        let write_result = writer
            .join()
            .unwrap_or_else(|_| Err(Error::Other("writer thread panicked".into())));
        pipeline_done.store(true, Ordering::SeqCst);
        let _ = heartbeat.join();
        read_result.and(write_result)
    })
}

/// Keeps SIGINT and SIGTERM off the calling thread; the caller's thread (blocked in `join`)
/// takes them and sets the shutdown flag. Delivered to a thread inside a socket read with a
/// timeout, a signal fails the read with EINTR even under SA_RESTART: a lost XREADGROUP reply
/// leaves entries Redis counts as delivered pending after a clean SIGTERM.
fn block_termination_signals() {
    // SAFETY: `set` is plain data initialised by sigemptyset; pthread_sigmask changes only the
    // calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Keeps this consumer's in-flight entries from looking abandoned while it is still working on
/// them: every third of `claim_idle_ms` it re-claims them for itself with XCLAIM JUSTID, which
/// resets their idle time without counting a delivery. Without it, a stall longer than
/// `claim_idle_ms` (a commit waiting out a locked ledger or a full disk) lets other consumers
/// XAUTOCLAIM the entries back and forth, every claim counts as a delivery, and valid entries
/// cross `--max-deliveries` and are dead-lettered although nothing failed. When the process
/// dies the heartbeat stops with it and its entries are taken over after `claim_idle_ms`.
fn heartbeat_loop(client: &redis::Client, shared: &Shared<'_>, done: &AtomicBool) {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    let interval = Duration::from_millis((wcfg.claim_idle_ms / 3).clamp(10, 10_000));
    let mut conn = Conn::new(client.clone());
    let mut due = Instant::now() + interval;
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(
            due.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50)),
        );
        if Instant::now() < due {
            continue;
        }
        due = Instant::now() + interval;
        let ids: Vec<String> = shared
            .in_flight
            .lock()
            .expect("in-flight set poisoned")
            .keys()
            .cloned()
            .collect();
        for chunk in ids.chunks(HEARTBEAT_IDS_MAX) {
            // A failure here is Redis being away, which the reader and writer already report.
            if stream::touch(&mut conn, &cfg.stream, &cfg.group, &wcfg.consumer, chunk).is_err() {
                break;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reader

/// Where the reader is in its cycle.
struct ReadState {
    /// Re-reading this consumer's own pending entries from this id; `None` once done.
    own_cursor: Option<String>,
    /// XAUTOCLAIM's cursor, carried between calls.
    claim_cursor: String,
    /// When the next XAUTOCLAIM scan is due.
    claim_due: Instant,
}

fn reader_loop(client: &redis::Client, tx: Sender<Vec<Entry>>, shared: &Shared<'_>) -> Result<()> {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    let timeout = Duration::from_millis(wcfg.block_ms + BLOCK_TIMEOUT_SLACK_MS);
    let mut conn = Conn::with_timeout(client.clone(), timeout);
    let mut state = ReadState {
        own_cursor: Some("0-0".into()),
        claim_cursor: "0-0".into(),
        claim_due: Instant::now(),
    };
    let mut group_ready = false;
    let mut episode = Episode::default();
    while !shared.stopping() {
        shared.metrics.beat();
        let step = if group_ready {
            read_step(&mut conn, &mut state, shared)
        } else {
            stream::ensure_group(&mut conn, &cfg.stream, &cfg.group).map(|created| {
                if created {
                    info!(
                        "created consumer group {} on {} at id 0",
                        cfg.group, cfg.stream
                    );
                }
                group_ready = true;
                Some(Vec::new())
            })
        };
        match step {
            Ok(Some(entries)) => {
                episode.cleared("reading from redis");
                if entries.is_empty() {
                    continue;
                }
                failpoint::hit("after_read");
                if tx.send(entries).is_err() {
                    break;
                }
            }
            Ok(None) => {
                episode.cleared("reading from redis");
                if !wcfg.exit_when_idle {
                    continue;
                }
                // The idle check talks to Redis too: losing it is a transient failure like any
                // other read, never a reason to exit.
                match is_idle(&mut conn, shared) {
                    Ok(true) => {
                        info!(
                            "stream {} is drained and group {} has nothing pending; exiting",
                            cfg.stream, cfg.group
                        );
                        break;
                    }
                    Ok(false) => {}
                    Err(e) if e.is_transient() => {
                        std::thread::sleep(episode.failed("reading from redis", &e))
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.is_no_group() => {
                warn!(
                    "consumer group {} is gone (Redis restarted without its data?); recreating it",
                    cfg.group
                );
                group_ready = false;
                state.own_cursor = Some("0-0".into());
                state.claim_cursor = "0-0".into();
            }
            // SIGINT/SIGTERM interrupt a blocking read (sockets with a receive timeout are
            // not restarted after a signal): that is the stop we asked for, not an outage.
            Err(_) if shared.stopping() => break,
            Err(e) if e.is_transient() => {
                // A reply lost with the connection may have moved entries into our pending
                // list without handing them to us; re-read our own history once Redis is back
                // rather than leave them until the XAUTOCLAIM scan takes them over.
                state.own_cursor = Some("0-0".into());
                let wait = episode.failed("reading from redis", &e);
                std::thread::sleep(wait);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One read: a due XAUTOCLAIM scan, else our own pending history, else new entries.
/// `Ok(None)` means the stream had nothing new for us.
fn read_step(
    conn: &mut Conn,
    state: &mut ReadState,
    shared: &Shared<'_>,
) -> Result<Option<Vec<Entry>>> {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    let consumer = wcfg.consumer.as_str();
    if Instant::now() >= state.claim_due && !shared.holding_claimable() {
        let got = stream::autoclaim(
            conn,
            &cfg.stream,
            &cfg.group,
            consumer,
            wcfg.claim_idle_ms,
            &state.claim_cursor,
            wcfg.batch_count_max,
        )?;
        forget_vanished(
            conn,
            shared,
            &got.deleted,
            "was deleted from the stream while pending",
        )?;
        state.claim_cursor = got.next_cursor;
        if state.claim_cursor == "0-0" {
            state.claim_due = Instant::now() + claim_interval(wcfg.claim_idle_ms);
        }
        let mut entries = not_in_flight(shared, got.entries);
        if !entries.is_empty() {
            stream::fill_delivery_counts(conn, &cfg.stream, &cfg.group, consumer, &mut entries)?;
            info!(
                "took over {} entries idle for over {} ms",
                entries.len(),
                wcfg.claim_idle_ms
            );
            return Ok(Some(track(shared, entries)));
        }
    }
    if let Some(cursor) = state.own_cursor.clone() {
        let read = stream::read_group(
            conn,
            &cfg.stream,
            &cfg.group,
            consumer,
            &cursor,
            wcfg.batch_count_max,
            None,
        )?;
        forget_vanished(
            conn,
            shared,
            &read.vanished,
            "is pending but no longer in the stream",
        )?;
        state.own_cursor = read.last_id;
        let mut entries = not_in_flight(shared, read.entries);
        stream::fill_delivery_counts(conn, &cfg.stream, &cfg.group, consumer, &mut entries)?;
        return Ok(Some(track(shared, entries)));
    }
    let read = stream::read_group(
        conn,
        &cfg.stream,
        &cfg.group,
        consumer,
        ">",
        wcfg.batch_count_max,
        Some(wcfg.block_ms),
    )?;
    if read.entries.is_empty() {
        return Ok(None);
    }
    Ok(Some(track(shared, read.entries)))
}

/// How often to scan for stranded entries: often enough to take them over soon after they
/// become eligible, rarely enough to cost nothing.
fn claim_interval(claim_idle_ms: u64) -> Duration {
    Duration::from_millis((claim_idle_ms / 2).clamp(100, 5_000))
}

/// Acknowledges pending ids whose entries are gone, so they stop occupying the PEL.
fn forget_vanished(conn: &mut Conn, shared: &Shared<'_>, ids: &[String], why: &str) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    for id in ids {
        warn!("entry {id} {why}; acknowledging it out of the pending list (nothing to process)");
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    stream::ack(conn, &shared.cfg.stream, &shared.cfg.group, &refs)?;
    Ok(())
}

fn not_in_flight(shared: &Shared<'_>, entries: Vec<Entry>) -> Vec<Entry> {
    let set = shared.in_flight.lock().expect("in-flight set poisoned");
    entries
        .into_iter()
        .filter(|e| !set.contains_key(&e.id))
        .collect()
}

fn track(shared: &Shared<'_>, entries: Vec<Entry>) -> Vec<Entry> {
    let mut set = shared.in_flight.lock().expect("in-flight set poisoned");
    let now = Instant::now();
    set.extend(entries.iter().map(|e| (e.id.clone(), now)));
    entries
}

/// True when nothing is in our pipeline and nothing is pending in the group.
fn is_idle(conn: &mut Conn, shared: &Shared<'_>) -> Result<bool> {
    if !shared
        .in_flight
        .lock()
        .expect("in-flight set poisoned")
        .is_empty()
    {
        return Ok(false);
    }
    Ok(stream::pending_count(conn, &shared.cfg.stream, &shared.cfg.group)? == 0)
}

// ---------------------------------------------------------------------------------------------
// Parse pool

fn parse_loop(
    rx: Receiver<Vec<Entry>>,
    tx: Sender<Vec<Parsed>>,
    wcfg: &WorkerConfig,
    mut filter: Option<(&FastFilter, Conn)>,
) {
    for batch in rx {
        let mut parsed: Vec<Parsed> = batch.into_iter().map(|e| parse_one(e, wcfg)).collect();
        if let Some((filter, conn)) = filter.as_mut() {
            look_up_committed(filter, conn, &mut parsed);
        }
        if tx.send(parsed).is_err() {
            return;
        }
    }
}

/// Asks the fast filter which valid submissions are already committed; here, on a parse
/// thread, so the writer never waits on the lookup.
fn look_up_committed(filter: &FastFilter, conn: &mut Conn, parsed: &mut [Parsed]) {
    let keys: Vec<IdempotencyKey> = parsed.iter().filter_map(valid_key).collect();
    let mut found = filter.lookup(conn, &keys).into_iter();
    for p in parsed.iter_mut().filter(|p| valid_key(p).is_some()) {
        p.committed_by = found.next().flatten();
    }
}

fn valid_key(p: &Parsed) -> Option<IdempotencyKey> {
    match &p.verdict {
        Verdict::Valid(s) => Some(s.key),
        Verdict::Dead(_) => None,
    }
}

/// Validates one entry, or says why it must be dead-lettered. Pure apart from its inputs.
fn parse_one(entry: Entry, wcfg: &WorkerConfig) -> Parsed {
    let (id, delivery_count) = (entry.id.clone(), entry.delivery_count);
    let hint = |entry: &Entry| {
        submission::payload_of(&entry.fields)
            .ok()
            .and_then(|p| submission::award_id_hint(p, wcfg.payload_bytes_max))
    };
    let verdict = if delivery_count > wcfg.max_deliveries {
        Verdict::Dead(DeadLetter {
            code: "max_deliveries",
            reason: format!(
                "max deliveries exceeded ({delivery_count} > {})",
                wcfg.max_deliveries
            ),
            award_id: hint(&entry),
            key: submission::parse_entry(&entry.fields, wcfg.payload_bytes_max)
                .ok()
                .map(|s| s.key),
            entry,
        })
    } else {
        match submission::parse_entry(&entry.fields, wcfg.payload_bytes_max) {
            Ok(s) => Verdict::Valid(s),
            Err(m) => Verdict::Dead(DeadLetter {
                code: m.code(),
                reason: m.to_string(),
                award_id: hint(&entry),
                key: None,
                entry,
            }),
        }
    };
    Parsed {
        id,
        delivery_count,
        verdict,
        committed_by: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Writer

/// A batch that has been committed and acknowledged, on its way to the reporter.
struct Committed {
    /// The entries, in stream order.
    batch: Vec<Parsed>,
    /// Each entry's outcome; `None` where the ledger refused it (left pending).
    outcomes: Vec<Option<Outcome>>,
}

fn report_loop(rx: Receiver<Committed>, shared: &Shared<'_>) {
    for c in rx {
        for (p, outcome) in c.batch.iter().zip(&c.outcomes) {
            if let Some(outcome) = outcome {
                report(p, outcome, shared);
            }
        }
    }
}

fn writer_loop(
    rx: Receiver<Vec<Parsed>>,
    ledger: &dyn Ledger,
    mut conn: Conn,
    shared: &Shared<'_>,
    reports: Sender<Committed>,
) -> Result<()> {
    while let Ok(mut batch) = rx.recv() {
        // Group commit: take whatever else is already waiting, up to the cap, so a backlog
        // drains in large transactions while a quiet stream still commits at once.
        while batch.len() < COMMIT_ENTRIES_MAX {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        if shared.wcfg.per_message {
            for one in batch {
                commit_and_ack(vec![one], ledger, &mut conn, shared, &reports)?;
            }
        } else {
            commit_and_ack(batch, ledger, &mut conn, shared, &reports)?;
        }
    }
    Ok(())
}

/// Dead letters out, one transaction in, then XACK — in that order, never another.
fn commit_and_ack(
    batch: Vec<Parsed>,
    ledger: &dyn Ledger,
    conn: &mut Conn,
    shared: &Shared<'_>,
    reports: &Sender<Committed>,
) -> Result<()> {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    let all_ids: Vec<String> = batch.iter().map(|p| p.id.clone()).collect();
    let result = (|| -> Result<Vec<Option<Outcome>>> {
        let dead_stream = cfg.dead_stream();
        for p in &batch {
            if let Verdict::Dead(d) = &p.verdict {
                let meta = [
                    ("reason", d.reason.clone()),
                    ("reason_code", d.code.to_owned()),
                    ("deliveries", p.delivery_count.to_string()),
                    ("consumer", wcfg.consumer.clone()),
                    ("source_stream", cfg.stream.clone()),
                    ("dead_lettered_at", crate::domain::clock::now_rfc3339()),
                ];
                retry("copying an entry to the dead-letter stream", shared, || {
                    stream::dead_letter(conn, &dead_stream, &d.entry, &meta)
                })?;
            }
        }
        let items: Vec<Item<'_>> = batch.iter().map(|p| item_of(p)).collect();
        let started = Instant::now();
        let (outcomes, committed) = record(ledger, &items, shared)?;
        drop(items);
        shared.metrics.observe_commit(started.elapsed());
        failpoint::hit("after_commit");
        copy_held(&batch, &outcomes, conn, shared)?;
        let ack_ids: Vec<&str> = batch
            .iter()
            .zip(&committed)
            .filter(|(_, ok)| **ok)
            .map(|(p, _)| p.id.as_str())
            .collect();
        retry("acknowledging entries", shared, || {
            stream::ack(conn, &cfg.stream, &cfg.group, &ack_ids)
        })?;
        shared
            .metrics
            .acked
            .fetch_add(ack_ids.len() as u64, Ordering::Relaxed);
        if let Some(filter) = &shared.filter {
            mark_committed(filter, conn, &batch, &outcomes);
        }
        Ok(outcomes)
    })();
    shared.release(all_ids);
    match result {
        Ok(outcomes) => {
            // The reporter outlives the writer, so this fails only if it panicked; then the
            // lines are written here rather than lost.
            if let Err(unsent) = reports.send(Committed { batch, outcomes }) {
                let c = unsent.into_inner();
                for (p, outcome) in c.batch.iter().zip(&c.outcomes) {
                    if let Some(outcome) = outcome {
                        report(p, outcome, shared);
                    }
                }
            }
            Ok(())
        }
        // Giving up during shutdown leaves the entries pending; they are redelivered later.
        Err(e) if e.is_transient() => {
            warn!("left {} entries pending for redelivery: {e}", batch.len());
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Copies entries the ledger held for review (`--on-conflict hold`) to the dead-letter stream.
/// This runs after the commit that recorded the hold and before the XACK: a crash in between
/// leaves the entry pending, and its redelivery is held again and copied (once per id).
fn copy_held(
    batch: &[Parsed],
    outcomes: &[Option<Outcome>],
    conn: &mut Conn,
    shared: &Shared<'_>,
) -> Result<()> {
    let (cfg, wcfg) = (shared.cfg, shared.wcfg);
    for (p, outcome) in batch.iter().zip(outcomes) {
        let (Verdict::Valid(s), Some(Outcome::Held { other_key, .. })) = (&p.verdict, outcome)
        else {
            continue;
        };
        let entry = Entry {
            id: p.id.clone(),
            fields: vec![(submission::PAYLOAD_FIELD.to_vec(), s.payload.clone())],
            delivery_count: p.delivery_count,
        };
        let meta = [
            ("reason", format!("conflicts with key {other_key} for the same award and submission time; held for review")),
            ("reason_code", "conflict_hold".to_owned()),
            ("deliveries", p.delivery_count.to_string()),
            ("consumer", wcfg.consumer.clone()),
            ("source_stream", cfg.stream.clone()),
            ("dead_lettered_at", crate::domain::clock::now_rfc3339()),
        ];
        retry(
            "copying a held entry to the dead-letter stream",
            shared,
            || stream::dead_letter(conn, &cfg.dead_stream(), &entry, &meta),
        )?;
    }
    Ok(())
}

/// After the commit: marks every key the ledger now holds that no marker vouched for yet.
fn mark_committed(
    filter: &FastFilter,
    conn: &mut Conn,
    batch: &[Parsed],
    outcomes: &[Option<Outcome>],
) {
    let keys: Vec<IdempotencyKey> = batch
        .iter()
        .zip(outcomes)
        .filter(|(p, o)| {
            p.committed_by.is_none()
                && matches!(o, Some(Outcome::Processed | Outcome::Duplicate { .. }))
        })
        .filter_map(|(p, _)| valid_key(p))
        .collect();
    filter.mark(conn, &keys, &crate::domain::clock::now_rfc3339());
}

fn item_of(p: &Parsed) -> Item<'_> {
    match &p.verdict {
        Verdict::Valid(s) => match &p.committed_by {
            Some(at) => Item::KnownDuplicate {
                submission: s,
                entry_id: &p.id,
                delivery_count: p.delivery_count,
                committed_by: at,
            },
            None => Item::Submission {
                submission: s,
                entry_id: &p.id,
                delivery_count: p.delivery_count,
            },
        },
        Verdict::Dead(d) => Item::DeadLetter {
            entry_id: &p.id,
            reason_code: d.code,
            reason: &d.reason,
            award_id: d.award_id.as_deref(),
            key: d.key,
            delivery_count: p.delivery_count,
        },
    }
}

/// Records the batch in one transaction. If the ledger refuses the batch for a permanent
/// reason, each item is tried alone so one bad item cannot hold back the rest; an item the
/// ledger refuses by itself is left pending (the delivery cap dead-letters it eventually).
/// Returns each item's outcome and whether it committed.
fn record(
    ledger: &dyn Ledger,
    items: &[Item<'_>],
    shared: &Shared<'_>,
) -> Result<(Vec<Option<Outcome>>, Vec<bool>)> {
    let (consumer, stream) = (shared.wcfg.consumer.as_str(), shared.cfg.stream.as_str());
    match retry("committing to the ledger", shared, || {
        ledger.record(items, consumer, stream)
    }) {
        Ok(outcomes) => Ok((
            outcomes.into_iter().map(Some).collect(),
            vec![true; items.len()],
        )),
        Err(e) if e.is_transient() => Err(e),
        Err(e) if items.len() == 1 => {
            error!(
                "ledger refused entry {}: {e}; leaving it pending",
                entry_id_of(&items[0])
            );
            Ok((vec![None], vec![false]))
        }
        Err(e) => {
            warn!(
                "ledger refused a batch of {} ({e}); retrying its entries one by one",
                items.len()
            );
            let mut outcomes = Vec::with_capacity(items.len());
            let mut committed = Vec::with_capacity(items.len());
            for item in items {
                let (o, c) = record(ledger, std::slice::from_ref(item), shared)?;
                outcomes.extend(o);
                committed.extend(c);
            }
            Ok((outcomes, committed))
        }
    }
}

fn entry_id_of<'a>(item: &Item<'a>) -> &'a str {
    match item {
        Item::Submission { entry_id, .. }
        | Item::KnownDuplicate { entry_id, .. }
        | Item::DeadLetter { entry_id, .. } => entry_id,
    }
}

/// The audit log line and counters for one committed outcome.
fn report(p: &Parsed, outcome: &Outcome, shared: &Shared<'_>) {
    let m = shared.metrics;
    match (&p.verdict, outcome) {
        (Verdict::Valid(s), Outcome::Processed) => {
            m.processed.fetch_add(1, Ordering::Relaxed);
            info!(target: audit::LOG_TARGET, "processed key={} award={} amount_cents={} entry={}", s.key.short(), s.award_id, s.amount_cents, p.id);
        }
        (Verdict::Valid(s), Outcome::Duplicate { first_claimed_at }) => {
            m.duplicates.fetch_add(1, Ordering::Relaxed);
            info!(target: audit::LOG_TARGET, "duplicate key={} award={} entry={} deliveries={} first_claimed_at={first_claimed_at}; skipped", s.key.short(), s.award_id, p.id, p.delivery_count);
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
        (Verdict::Dead(d), Outcome::DeadLettered) => {
            m.dead_lettered.fetch_add(1, Ordering::Relaxed);
            info!(target: audit::LOG_TARGET, "dead_letter entry={} award={} reason={}: {}", p.id, d.award_id.as_deref().unwrap_or("-"), d.code, d.reason);
        }
        _ => {}
    }
}

/// Tracks one episode of transient failure so it is logged when it starts and when it clears,
/// not on every retry.
#[derive(Default)]
struct Episode {
    /// Failed attempts in the current episode; 0 when healthy.
    attempts: u32,
    /// When the episode started.
    since: Option<Instant>,
}

impl Episode {
    /// Notes a failure and returns how long to wait before the next attempt.
    fn failed(&mut self, what: &str, e: &Error) -> Duration {
        if self.attempts == 0 {
            warn!("{what} failed: {e}; retrying with backoff until it clears");
            self.since = Some(Instant::now());
        }
        self.attempts += 1;
        backoff(self.attempts - 1)
    }

    /// Notes a success; logs the end of an episode if one was under way.
    fn cleared(&mut self, what: &str) {
        if self.attempts > 0 {
            let secs = self.since.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
            info!(
                "{what} recovered after {} failed attempts over {secs:.1}s",
                self.attempts
            );
            self.attempts = 0;
            self.since = None;
        }
    }
}

/// Runs `op` until it succeeds, fails permanently, or (once shutdown is asked for) has had
/// [`SHUTDOWN_RETRIES_MAX`] more tries. Transient failures are waited out with capped
/// exponential backoff and jitter; the process never exits because the world is briefly down.
fn retry<T>(what: &str, shared: &Shared<'_>, mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let mut episode = Episode::default();
    loop {
        match op() {
            Ok(v) => {
                episode.cleared(what);
                return Ok(v);
            }
            Err(e) if e.is_transient() => {
                if shared.stopping() && episode.attempts >= SHUTDOWN_RETRIES_MAX {
                    return Err(e);
                }
                let wait = episode.failed(what, &e);
                std::thread::sleep(wait);
            }
            Err(e) => return Err(e),
        }
    }
}
