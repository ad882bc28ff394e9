//! `cargo run --release --example bench_ledger -- [--n N] [--batch B] [--rounds R] [--db URL]
//! [--shuffled] [--sorted-batches] [--pre-schema FILE]`
//!
//! The ledger alone, no Redis: `Ledger::record` called with batches of `--batch` items (the
//! size a busy worker's group commit reaches) on the benchmark's arrival-order load (20%
//! byte-identical resends, runs of 64 shuffled), on a fresh ledger per round, `synchronous=FULL`
//! and the background checkpointer on, exactly as `claimgate run` opens it. Reports entries/s and
//! the recording thread's own CPU per entry (`RUSAGE_THREAD`, so the checkpointer is not in it),
//! and the bytes the whole process (recording thread and checkpointer) handed to `write(2)` and
//! `pwrite(2)` per entry (WAL frames and checkpoint copies alike), and checks the counts
//! afterwards. This is the number to move when the writer is the limit:
//! the end-to-end bench (`examples/bench.rs`) has Redis, parsing and the reporter on the same
//! two cores. `--db postgres://…` measures a PostgreSQL ledger instead (one fresh database per
//! round is the caller's job: pass a URL whose database is empty, and use `--rounds 1`).
//! `--pre-schema FILE` runs FILE's SQL on each fresh SQLite file before the ledger opens it (to
//! try another table or index layout: `schema.sql` only creates what does not exist yet).
//! `--shuffled` shuffles the whole load (the end-to-end bench's (a'), the claim index's worst
//! case); `--sorted-batches` then sorts each batch by (instant, award) before recording it, to
//! measure what claiming a batch in index order would be worth (BENCHMARKS.md: not built).

use claimgate::config::LedgerConfig;
use claimgate::domain::submission::{parse_payload, Limits, Submission};
use claimgate::ledger::{Item, Outcome};
use std::time::Instant;

/// The shipped allocator, as in `src/main.rs`.
#[global_allocator]
static ALLOCATOR: claimgate::support::allocator::MiMalloc = claimgate::support::allocator::MiMalloc;

fn main() {
    claimgate::support::allocator::tune();
    let mut n = 200_000usize;
    let mut batch = 4_000usize;
    let mut rounds = 3usize;
    let mut db: Option<String> = None;
    let mut pre_schema: Option<String> = None;
    let mut shuffled = false;
    let mut sorted_batches = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().expect("flag needs a value");
        match a.as_str() {
            "--n" => n = value().parse().expect("--n"),
            "--batch" => batch = value().parse().expect("--batch"),
            "--rounds" => rounds = value().parse().expect("--rounds"),
            "--db" => db = Some(value()),
            "--pre-schema" => pre_schema = Some(std::fs::read_to_string(value()).expect("file")),
            "--shuffled" => shuffled = true,
            "--sorted-batches" => sorted_batches = true,
            other => panic!("unknown flag {other}"),
        }
    }
    let mut subs = load(n);
    if shuffled {
        fastrand::Rng::with_seed(11).shuffle(&mut subs);
    }
    if sorted_batches {
        for chunk in subs.chunks_mut(batch) {
            chunk.sort_by(|a, b| {
                (&a.submission_instant, &a.award_id).cmp(&(&b.submission_instant, &b.award_id))
            });
        }
    }
    let entry_ids: Vec<String> = (0..n).map(|i| format!("{}-0", i + 1)).collect();
    let mut rates = Vec::new();
    for round in 0..rounds {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = db
            .clone()
            .unwrap_or_else(|| dir.path().join("ledger.db").display().to_string());
        if let Some(sql) = &pre_schema {
            rusqlite::Connection::open(&path)
                .and_then(|c| c.execute_batch(sql))
                .expect("pre-schema");
        }
        let mut cfg = LedgerConfig::new(&path);
        cfg.backend.background_checkpoints = true;
        let ledger = claimgate::ledger::open(&cfg.into()).expect("open ledger");
        let (cpu0, written0, t0) = (thread_cpu_s(), written_bytes(), Instant::now());
        let mut processed = 0u64;
        for (chunk, ids) in subs.chunks(batch).zip(entry_ids.chunks(batch)) {
            let items: Vec<Item<'_>> = chunk
                .iter()
                .zip(ids)
                .map(|(s, id)| Item::Submission {
                    submission: s,
                    entry_id: id,
                    delivery_count: 1,
                })
                .collect();
            let outcomes = ledger
                .record(&items, "bench", "grants:submissions")
                .unwrap();
            processed += outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Processed))
                .count() as u64;
        }
        let (secs, cpu) = (t0.elapsed().as_secs_f64(), thread_cpu_s() - cpu0);
        // Read before the ledger is dropped, so closing it adds nothing a running worker
        // would not pay.
        let written = written_bytes() - written0;
        let stats = ledger.stats().expect("stats");
        let distinct = subs
            .iter()
            .map(|s| s.key)
            .collect::<std::collections::HashSet<_>>()
            .len() as u64;
        let rate = n as f64 / secs;
        println!(
            "round {round}: {rate:.0} entries/s, {:.2} µs CPU/entry on the recording thread, \
             {:.2} KiB written/entry ({n} entries, batches of {batch}, {distinct} distinct)",
            cpu / n as f64 * 1e6,
            written as f64 / 1024.0 / n as f64
        );
        // Checked after the figures are printed, so a layout experiment (`--pre-schema`) that
        // breaks uniqueness still shows what it cost before it fails.
        assert_eq!(
            (stats.disbursements, processed),
            (distinct, distinct),
            "every distinct submission paid once"
        );
        assert_eq!(stats.duplicates_suppressed, n as u64 - distinct);
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    println!("median {:.0} entries/s", rates[rates.len() / 2]);
}

/// The arrival-order load of `examples/bench.rs`: submissions 10 ms apart, about a fifth of
/// the entries resends of an earlier one, each run of 64 shuffled.
fn load(n: usize) -> Vec<Submission> {
    let limits = Limits {
        payload_bytes_max: 1 << 20,
        amount_cents_max: i64::MAX,
    };
    let mut rng = fastrand::Rng::with_seed(7);
    let distinct = n * 4 / 5;
    let mut lines: Vec<String> = Vec::with_capacity(n);
    let mut made = 0usize;
    while lines.len() < n {
        if made < distinct && (made == 0 || rng.f64() >= 0.2) {
            let (s, ms) = (made / 100, made % 100 * 10);
            lines.push(format!(
                r#"{{"award_id":"A-{:06}","submission_timestamp":"2026-07-01T{:02}:{:02}:{:02}.{:03}Z","amount_cents":{},"program":"ESG","recipient":"R-{made}"}}"#,
                made % 5_000,
                9 + s / 3600,
                s / 60 % 60,
                s % 60,
                ms,
                100 + made % 977
            ));
            made += 1;
        } else {
            let back = rng.usize(1..=made.min(50));
            let earlier = lines[lines.len() - back.min(lines.len())].clone();
            lines.push(earlier);
        }
    }
    for chunk in lines.chunks_mut(64) {
        rng.shuffle(chunk);
    }
    lines
        .iter()
        .map(|l| parse_payload(l.as_bytes(), &limits).expect("valid submission"))
        .collect()
}

/// Bytes this process has handed to the write system calls so far (`wchar` in `/proc/self/io`):
/// what SQLite asks the kernel to write, whether or not the page cache absorbs it before the
/// disk does.
fn written_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.parse().ok())
        .expect("wchar in /proc/self/io")
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}
