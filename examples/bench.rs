//! `cargo run --release --example bench -- [--n N] [--dup F] [--rounds R] [...]`
//!
//! Measures claimgate end to end against its own private redis-server:
//! (a) the worker as shipped, on submissions that arrive in about the order they were made,
//! (a') the same on a shuffled load (the claim index's worst case), (b) the same code in
//! per-message mode (one transaction and one XACK per entry: the reference design's shape),
//! (c) a null sink (read, parse, key, ack; no database). (a), (a') and (b) run as child
//! processes executing exactly the shipped command line (this executable re-runs itself as
//! `claimgate`, starting as `src/main.rs` does), so their peak RSS is the worker's own, read
//! from wait4(2). Every run is verified against the ledger afterwards; a fast wrong answer
//! aborts the benchmark.
//!
//! `--postgres` runs the PostgreSQL mode instead: a private PostgreSQL 15 cluster
//! (`synchronous_commit=on`, fsync on), and per round on the same load (a) the SQLite worker,
//! (p1) one worker and (p3) three workers on one consumer group, each on a fresh PostgreSQL
//! database; reported: entries/s, worker and PostgreSQL CPU per entry, commit p50/p99, the
//! chain-head lock's hold time p99 (from the workers' own exit lines) and WAL bytes per entry.
//!
//! Optional modes: `--backlog N` drains N entries once and reports peak RSS; `--prefill N`
//! compares throughput on a ledger that already holds N disbursements, for new submissions and
//! for back-dated ones that land among the history's; `--filter-dup F` compares
//! `--fast-filter` on and off on a load with F duplicates; `--report N` measures only the
//! operator's and the auditor's commands (`status`, a worker's start, `/metrics`, `backup`,
//! `verify`, `audit report`, the independent verifier...) on a ledger of N claims, and with
//! `--postgres` again on that ledger migrated to PostgreSQL; `--purge-under-load --prefill N` measures `retention purge` of the oldest year of
//! N claims beside a worker (`bench/purge_mode.rs`). `--report N --whole --template FILE`
//! then runs those on the same template, and with `--postgres` the PostgreSQL mode too: issue
//! 37's whole table, both ledgers, one sitting. `--help` lists all flags.
//! Environment: `BENCH_CHILD_LOG` sets the workers' RUST_LOG (default `info`, as shipped);
//! `BENCH_KEEP_LOGS` keeps their logs in the work directory.

use claimgate::config::{Config, WorkerConfig};
use claimgate::ledger::{Item, Ledger, Outcome, Stats};
use claimgate::observe::metrics::Metrics;
use claimgate::support::localredis::{LocalRedis, Options};
use claimgate::support::Shutdown;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The argument that makes this executable behave as the `claimgate` binary.
const AS_CLAIMGATE: &str = "__claimgate";

/// The first argument that makes this executable only prefill a ledger (`report_mode`).
const AS_PREFILL: &str = "__prefill";
/// XADDs per pipelined round trip while loading.
const LOAD_PIPELINE_MAX: usize = 2_000;

/// What to run.
#[derive(Clone)]
struct Opts {
    /// Entries per round for (a) and (c).
    n: usize,
    /// Entries per round for (b), which is slow by design.
    per_message_n: usize,
    /// Fraction of entries that are byte-identical copies of another.
    dup: f64,
    /// Rounds; medians are reported.
    rounds: usize,
    /// Single-submission latency samples on a quiet stream.
    latency_samples: usize,
    /// Drain this many entries once and report peak RSS (0: skip).
    backlog: usize,
    /// Compare against a ledger pre-filled with this many disbursements (0: skip).
    prefill: usize,
    /// Compare --fast-filter on and off at this duplicate fraction (skip when absent).
    filter_dup: Option<f64>,
    /// Only measure the auditor's side on a ledger of this many claims (report mode).
    report: Option<usize>,
    /// Only measure a purge of the `--prefill` history's oldest year beside a worker.
    purge_under_load: bool,
    /// With `--report N --template FILE`: then the worker (a) on that ledger against an empty
    /// one, one PostgreSQL node against SQLite (with `--postgres`), and the purge beside a
    /// worker, each on the same template: issue 37's whole table in one sitting.
    whole: bool,
    /// Where ledgers go.
    dir: PathBuf,
    /// Extra flags passed to every `claimgate run`.
    extra: Vec<String>,
    /// Keep (and reuse) the pre-filled ledger here instead of building a fresh one.
    template: Option<PathBuf>,
    /// Report mode: leave out the independent verifier (python3), minutes on ten million.
    report_skip_verifier: bool,
    /// Run the PostgreSQL mode (see the module doc) instead of the others.
    postgres: bool,
    /// In the PostgreSQL mode, print each run's costliest statements (pg_stat_statements).
    pg_statements: bool,
    /// In the PostgreSQL mode, server settings (`name=value`) set before the runs, to measure
    /// what a setting is worth on the same load.
    pg_set: Vec<String>,
}

fn main() {
    claimgate::support::allocator::tune();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(AS_CLAIMGATE) {
        std::process::exit(as_claimgate(&args[2..]));
    }
    if args.get(1).map(String::as_str) == Some(AS_PREFILL) {
        // [`prefill_in_child`].
        // A fifth argument `wide`: the ledger as a format-4 release wrote it, for the bytes
        // per claim before format 5 (BENCHMARKS.md).
        let (path, n) = (Path::new(&args[2]), number(&args[3]));
        let wide = args.get(4).map(String::as_str) == Some("wide");
        if let Err(e) = prefill(path, n, wide) {
            eprintln!("prefill failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    let opts = parse_opts(&args[1..]);
    if let Err(e) = bench(&opts) {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}

/// The shipped binary's allocator, as in `src/main.rs`.
#[global_allocator]
static ALLOCATOR: claimgate::support::allocator::MiMalloc = claimgate::support::allocator::MiMalloc;

/// Exactly what `src/main.rs` does, so a child run here is the shipped binary's code path.
fn as_claimgate(args: &[String]) -> i32 {
    use clap::Parser;
    let cli = claimgate::cli::Cli::parse_from(
        std::iter::once("claimgate".to_owned()).chain(args.iter().cloned()),
    );
    match claimgate::observe::logging::init(&cli.global.logging())
        .and_then(|()| claimgate::cli::dispatch(cli))
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("claimgate: {e}");
            if matches!(e, claimgate::Error::Config(_)) {
                2
            } else {
                1
            }
        }
    }
}

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        n: 200_000,
        per_message_n: 20_000,
        dup: 0.2,
        rounds: 3,
        latency_samples: 200,
        backlog: 0,
        prefill: 0,
        filter_dup: None,
        report: None,
        purge_under_load: false,
        whole: false,
        dir: std::env::temp_dir(),
        extra: Vec::new(),
        template: None,
        report_skip_verifier: false,
        postgres: false,
        pg_statements: false,
        pg_set: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
                .clone()
        };
        match flag.as_str() {
            "--n" => o.n = number(&value()),
            "--per-message-n" => o.per_message_n = number(&value()),
            "--dup" => {
                o.dup = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--dup takes a fraction"))
            }
            "--rounds" => o.rounds = number(&value()).max(1),
            "--latency-samples" => o.latency_samples = number(&value()),
            "--backlog" => o.backlog = number(&value()),
            "--prefill" => o.prefill = number(&value()),
            "--filter-dup" => {
                o.filter_dup = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--filter-dup takes a fraction")),
                )
            }
            "--report" => o.report = Some(number(&value())),
            "--purge-under-load" => o.purge_under_load = true,
            "--whole" => o.whole = true,
            "--dir" => o.dir = PathBuf::from(value()),
            "--template" => o.template = Some(PathBuf::from(value())),
            "--report-skip-verifier" => o.report_skip_verifier = true,
            "--run-flag" => o.extra.push(value()),
            "--postgres" => o.postgres = true,
            "--pg-statements" => o.pg_statements = true,
            "--pg-set" => o.pg_set.push(value()),
            "--help" | "-h" => usage(""),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    o
}

fn number(s: &str) -> usize {
    s.replace('_', "")
        .parse()
        .unwrap_or_else(|_| usage(&format!("{s} is not a count")))
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("bench: {problem}");
    }
    eprintln!(
        "usage: cargo run --release --example bench -- [--n 200000] [--per-message-n 20000] [--dup 0.2]\n\
         \x20      [--rounds 3] [--latency-samples 200] [--backlog 1000000] [--prefill 1000000]\n\
         \x20      [--filter-dup 0.6] [--dir DIR] [--template FILE] [--run-flag FLAG]... [--postgres [--pg-statements] [--pg-set NAME=VALUE]...]\n\
         \x20      | --report 1000000 [--template FILE] [--report-skip-verifier] [--postgres]\n\
         \x20      | --report 1000000 --whole --template FILE [--n 200000] [--rounds 2] [--postgres] [--report-skip-verifier]\n\
         \x20      | --purge-under-load --prefill 1000000 [--n 1000000] [--template FILE]"
    );
    std::process::exit(if problem.is_empty() { 0 } else { 2 })
}

type Res<T> = Result<T, String>;

#[path = "bench/pg_mode.rs"]
mod pg_mode;
#[path = "bench/purge_mode.rs"]
mod purge_mode;
#[path = "bench/report_mode.rs"]
mod report_mode;

fn bench(o: &Opts) -> Res<()> {
    if let Some(n) = o.report {
        report_mode::run(o, n)?;
        return if o.whole { whole(o, n) } else { Ok(()) };
    }
    if o.purge_under_load {
        if o.prefill == 0 {
            usage("--purge-under-load needs --prefill N (the history it purges a year of)");
        }
        return purge_mode::run(o);
    }
    let (redis, work, env) = Env::start(o, "claimgate-bench-")?;
    println!(
        "claimgate bench: {} cores, redis {}, ledgers in {}",
        cores(),
        redis.url(),
        work.path().display()
    );
    println!(
        "load: {} entries ({:.0}% duplicates); per-message mode on {} entries; {} rounds",
        o.n,
        o.dup * 100.0,
        o.per_message_n,
        o.rounds
    );

    let main_load = env.load("bench:main", o.n, o.dup, 1, Shape::Arrival)?;
    if o.postgres {
        pg_mode::run(&env, o, &main_load)?;
        if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
            println!("kept {}", work.keep().display());
        }
        return Ok(());
    }
    let shuffled_load = env.load("bench:shuffled", o.n, o.dup, 1, Shape::Shuffled)?;
    let pm_load = env.load("bench:pm", o.per_message_n, o.dup, 2, Shape::Arrival)?;
    let (mut a, mut s, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=o.rounds {
        a.push(env.child_run(&main_load, &format!("a{round}"), &[], None)?);
        s.push(env.child_run(&shuffled_load, &format!("s{round}"), &[], None)?);
        b.push(env.child_run(&pm_load, &format!("b{round}"), &["--per-message"], None)?);
        c.push(env.null_run(&main_load, &format!("c{round}"))?);
        let (ra, rs) = (&a[round - 1], &s[round - 1]);
        println!(
            "round {round}: (a) {:>8.0}/s  (a') {:>8.0}/s  (b) {:>7.0}/s  (c) {:>8.0}/s  (a) commit p50 {} p99 {}  rss {:.1} MiB  cpu {:.1} us/entry",
            ra.rate, rs.rate, b[round - 1].rate, c[round - 1].rate,
            ms(ra.commit_p50_us), ms(ra.commit_p99_us), ra.rss_mib, ra.cpu_us_per_entry
        );
    }
    let (ma, ms_, mb, mc) = (
        median(&a, |r| r.rate),
        median(&s, |r| r.rate),
        median(&b, |r| r.rate),
        median(&c, |r| r.rate),
    );
    println!("\nmedians over {} rounds", o.rounds);
    println!("  (a) shipped (group commit)  {ma:>9.0} entries/s   commit p50 {} p99 {}   peak RSS {:.1} MiB   cpu {:.1} us/entry   written {:.2} KiB/entry",
        ms(median(&a, |r| r.commit_p50_us as f64) as u64), ms(median(&a, |r| r.commit_p99_us as f64) as u64), median(&a, |r| r.rss_mib), median(&a, |r| r.cpu_us_per_entry), median(&a, |r| r.written_kib_per_entry));
    println!("  (a') shipped, shuffled load {ms_:>9.0} entries/s   commit p50 {} p99 {}   peak RSS {:.1} MiB   cpu {:.1} us/entry   written {:.2} KiB/entry",
        ms(median(&s, |r| r.commit_p50_us as f64) as u64), ms(median(&s, |r| r.commit_p99_us as f64) as u64), median(&s, |r| r.rss_mib), median(&s, |r| r.cpu_us_per_entry), median(&s, |r| r.written_kib_per_entry));
    println!("  (b) per-message             {mb:>9.0} entries/s   commit p50 {} p99 {}   peak RSS {:.1} MiB   cpu {:.1} us/entry   written {:.2} KiB/entry",
        ms(median(&b, |r| r.commit_p50_us as f64) as u64), ms(median(&b, |r| r.commit_p99_us as f64) as u64), median(&b, |r| r.rss_mib), median(&b, |r| r.cpu_us_per_entry), median(&b, |r| r.written_kib_per_entry));
    println!("  (c) null sink (no database) {mc:>9.0} entries/s");
    println!(
        "  a/b = {:.1}x   a/c = {:.2}   a'/b = {:.1}x   a'/a = {:.2}",
        ma / mb,
        ma / mc,
        ms_ / mb,
        ms_ / ma
    );
    env.drop_stream("bench:shuffled")?;

    if o.latency_samples > 0 {
        env.quiet_latency(o.latency_samples)?;
    }
    if o.backlog > 0 {
        let load = env.load("bench:backlog", o.backlog, o.dup, 3, Shape::Arrival)?;
        let r = env.child_run(&load, "backlog", &[], None)?;
        println!("\nbacklog of {}: drained at {:.0} entries/s, peak RSS {:.1} MiB (wait4 ru_maxrss), cpu {:.1} us/entry", o.backlog, r.rate, r.rss_mib, r.cpu_us_per_entry);
        env.drop_stream("bench:backlog")?;
    }
    if o.prefill > 0 {
        env.prefilled(o, &main_load)?;
    }
    if let Some(dup) = o.filter_dup {
        env.fast_filter(o, dup)?;
    }
    if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
        println!("kept {}", work.keep().display());
    }
    Ok(())
}

/// After the report on the N-claim `--template` (built by the report if it was missing): the
/// worker (a) on a copy of it against an empty ledger, arrival order and back-dated (as
/// `--prefill N --template FILE`); with `--postgres`, one PostgreSQL node and three against
/// SQLite's (a) on empty ledgers (as `--postgres`), one node on the template migrated
/// into PostgreSQL against one on an empty PostgreSQL ledger, and a purge of that migrated
/// ledger's oldest year beside one node (on a load of 0.6 N entries); and a purge of the
/// SQLite template's oldest year beside a worker (as `--purge-under-load --prefill N`, on a
/// load of 1.5 N entries). Each load keeps its worker busy as long as the purge runs. Each
/// part is its mode, run as that mode runs.
fn whole(o: &Opts, n: usize) -> Res<()> {
    let Some(template) = o.template.clone() else {
        usage("--whole needs --template FILE (kept, so each part reads the same ledger)")
    };
    let o = Opts {
        prefill: n,
        template: Some(template),
        latency_samples: 0,
        ..o.clone()
    };
    let (_redis, work, env) = Env::start(&o, "claimgate-bench-whole-")?;
    println!(
        "\nworker (a) on {n} claims against an empty ledger: {} entries ({:.0}% duplicates), {} rounds, in {}",
        o.n,
        o.dup * 100.0,
        o.rounds,
        work.path().display()
    );
    let main_load = env.load("bench:main", o.n, o.dup, 1, Shape::Arrival)?;
    env.prefilled(&o, &main_load)?;
    if o.postgres {
        println!("\none PostgreSQL node against SQLite, empty ledgers:");
        pg_mode::run(&env, &o, &main_load)?;
        let template = o.template.as_deref().expect("checked above");
        pg_mode::against_template(&env, &o, &main_load, template)?;
    }
    env.drop_stream("bench:main")?;
    drop((env, work));
    println!();
    // The purge's worker must still be working when the purge ends, or "beside the purge"
    // measures only its first seconds: a load half again the history (as measured before).
    purge_mode::run(&Opts {
        n: o.n.max(n + n / 2),
        ..o
    })
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn median<T>(runs: &[T], f: impl Fn(&T) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

/// What was loaded on a stream, and what a correct ledger must hold after draining it.
struct Load {
    /// The stream key.
    stream: String,
    /// Entries on the stream.
    n: usize,
    /// Distinct submissions among them.
    unique: usize,
    /// Sum of the distinct submissions' amounts.
    cents_total: i64,
}

/// One measured run.
struct RunResult {
    /// Entries per second, wall clock from start to exit.
    rate: f64,
    /// Median ledger commit latency, from the worker's own histogram.
    commit_p50_us: u64,
    /// 99th percentile ledger commit latency.
    commit_p99_us: u64,
    /// Peak resident set of the worker process (0 for in-process runs).
    rss_mib: f64,
    /// CPU time (user + system) of the worker process per entry, in microseconds: less
    /// sensitive than wall-clock rates to other work on a shared machine.
    cpu_us_per_entry: f64,
    /// Bytes the worker process handed to the write system calls per entry, in KiB (`wchar`):
    /// WAL frames, checkpoint copies and its log, whatever the page cache then absorbs.
    written_kib_per_entry: f64,
}

/// The benchmark's surroundings.
struct Env {
    /// The private redis-server.
    redis_url: String,
    /// Where this run's ledgers live.
    dir: PathBuf,
    /// Extra flags for every child `run`.
    extra: Vec<String>,
}

/// When the submissions of a load were made, and in what order they reach the stream.
#[derive(Clone, Copy)]
enum Shape {
    /// As submissions arrive in production: each stamped when it was made, so the stream is in
    /// timestamp order up to a little jitter (shuffled within runs of [`ARRIVAL_JITTER`]), and
    /// each duplicate (a resend, a redelivery) after its original. Timestamps start at
    /// [`LOAD_EPOCH_S`], [`LOAD_STEP_MS`] apart.
    Arrival,
    /// The worst case for the claim index: timestamps as above, entries in random order.
    Shuffled,
    /// Back-dated submissions (a backfill): random order, timestamps spread over the span of
    /// a pre-filled history of this many submissions, so every claim lands among old ones.
    Backdated(usize),
}

/// Entries shuffled among each other in an arrival-ordered load.
const ARRIVAL_JITTER: usize = 64;
/// The first submission's time in a load: 2026-07-01T09:00:00Z.
const LOAD_EPOCH_S: i64 = 1_782_896_400;
/// Time between consecutive submissions in a load.
const LOAD_STEP_MS: i64 = 10;
/// The pre-filled history: 1,000,000 submissions from 2023-01-01T00:00:00Z on, evenly spread
/// until just before the loads start.
const HISTORY_EPOCH_S: i64 = 1_672_531_200;

/// An RFC 3339 timestamp `ms` milliseconds after the Unix epoch, as producers write them.
fn timestamp(ms: i64) -> String {
    let t =
        time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).expect("in range");
    t.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .expect("formats")
}

/// The time `ms` milliseconds after the Unix epoch, as the ledger records times.
fn recorded(ms: i64) -> String {
    claimgate::domain::clock::ledger_time(
        time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).expect("in range"),
    )
}

/// The disbursements and their claims, up to a comparison of when each was recorded (the
/// disbursement's own time where it stores one, format 4; its claim's in format 5).
const HISTORY_ROWS: &str = "disbursements d JOIN processed_messages p ON p.claim_id = d.claim_id
     WHERE ifnull(d.recorded_at, p.claimed_at)";

/// Before this, a row of a pre-filled ledger was recorded by the prefill (its history ends
/// where the loads begin, [`LOAD_EPOCH_S`]); a worker of the benchmark records later, on the
/// machine's clock.
const PREFILLED_BEFORE: &str = "2026-07-01T09:00:00Z";

/// Milliseconds between consecutive submissions of a history of `n` before the loads.
fn history_step_ms(n: usize) -> i64 {
    ((LOAD_EPOCH_S - HISTORY_EPOCH_S) * 1000 / n.max(1) as i64).max(1)
}

/// A submission payload of realistic size; `i` makes it distinct, `ms` is when it was made.
fn payload(i: usize, ms: i64) -> String {
    format!(
        r#"{{"award_id":"A-2026-{:07}","submission_timestamp":"{}","amount_cents":{},"program":"rural-broadband","recipient":"Example County Broadband Cooperative","period":"2026-Q3"}}"#,
        i,
        timestamp(ms),
        amount(i)
    )
}

fn amount(i: usize) -> i64 {
    10_000 + (i as i64 * 7919) % 990_000
}

/// The order of a load of `n` entries with `unique` distinct submissions (indices into them).
fn order(shape: Shape, n: usize, unique: usize, rng: &mut fastrand::Rng) -> Vec<u32> {
    let mut originals: Vec<u32> = (0..unique as u32).collect();
    if !matches!(shape, Shape::Arrival) {
        let mut all = originals;
        all.extend((unique..n).map(|_| rng.u32(0..unique as u32)));
        rng.shuffle(&mut all);
        return all;
    }
    for run in originals.chunks_mut(ARRIVAL_JITTER) {
        rng.shuffle(run);
    }
    // Each original at its place in the stream; each duplicate somewhere after its original.
    let mut placed: Vec<(f64, u32)> = originals
        .iter()
        .enumerate()
        .map(|(at, &i)| (at as f64, i))
        .collect();
    let mut position = vec![0usize; unique];
    for (at, &i) in originals.iter().enumerate() {
        position[i as usize] = at;
    }
    for _ in unique..n {
        let i = rng.u32(0..unique as u32);
        let after = position[i as usize] as f64 + 0.5;
        placed.push((after + rng.f64() * (unique as f64 - after), i));
    }
    placed.sort_by(|a, b| a.0.total_cmp(&b.0));
    placed.into_iter().map(|(_, i)| i).collect()
}

impl Env {
    /// A private redis-server and a work directory named `prefix…` under `--dir`, each kept
    /// until its handle is dropped.
    fn start(o: &Opts, prefix: &str) -> Res<(LocalRedis, tempfile::TempDir, Env)> {
        let redis = LocalRedis::start(Options::default()).map_err(|e| e.to_string())?;
        let work = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&o.dir)
            .map_err(|e| e.to_string())?;
        let env = Env {
            redis_url: redis.url(),
            dir: work.path().to_owned(),
            extra: o.extra.clone(),
        };
        Ok((redis, work, env))
    }

    fn conn(&self) -> Res<redis::Connection> {
        let client = redis::Client::open(self.redis_url.as_str()).map_err(|e| e.to_string())?;
        let conn = client.get_connection().map_err(|e| e.to_string())?;
        Ok(conn)
    }

    /// XADDs `n` entries, of which a `dup` fraction repeat an earlier submission byte for byte,
    /// in the order `shape` gives (fixed by `seed`).
    fn load(&self, stream: &str, n: usize, dup: f64, seed: u64, shape: Shape) -> Res<Load> {
        let unique = ((n as f64) * (1.0 - dup)).round().max(1.0) as usize;
        let mut rng = fastrand::Rng::with_seed(seed);
        let order = order(shape, n, unique, &mut rng);
        let made_at = |i: usize| match shape {
            Shape::Arrival | Shape::Shuffled => LOAD_EPOCH_S * 1000 + i as i64 * LOAD_STEP_MS,
            // Between two pre-filled submissions' times, so it never equals one.
            Shape::Backdated(history) => {
                let step = history_step_ms(history);
                let slot = (i as i64 * 7_919) % history.max(1) as i64;
                HISTORY_EPOCH_S * 1000 + slot * step + step / 2
            }
        };
        let mut conn = self.conn()?;
        let started = Instant::now();
        for chunk in order.chunks(LOAD_PIPELINE_MAX) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("XADD")
                    .arg(stream)
                    .arg("*")
                    .arg("payload")
                    .arg(payload(i as usize, made_at(i as usize)))
                    .ignore();
            }
            pipe.query::<()>(&mut conn).map_err(|e| e.to_string())?;
        }
        let cents_total = (0..unique).map(amount).sum();
        println!(
            "loaded {n} entries ({unique} distinct, {}) on {stream} in {:.1}s",
            match shape {
                Shape::Arrival => "in arrival order",
                Shape::Shuffled => "shuffled",
                Shape::Backdated(_) => "back-dated, shuffled",
            },
            started.elapsed().as_secs_f64()
        );
        Ok(Load {
            stream: stream.to_owned(),
            n,
            unique,
            cents_total,
        })
    }

    fn drop_stream(&self, stream: &str) -> Res<()> {
        redis::cmd("DEL")
            .arg(stream)
            .query::<()>(&mut self.conn()?)
            .map_err(|e| e.to_string())
    }

    /// Runs `claimgate run --exit-when-idle` as a child on a fresh group and a fresh ledger
    /// (or a copy of `template`), then verifies the ledger.
    fn child_run(
        &self,
        load: &Load,
        label: &str,
        flags: &[&str],
        template: Option<&Path>,
    ) -> Res<RunResult> {
        let db = self.dir.join(format!("{label}.db"));
        if let Some(t) = template {
            std::fs::copy(t, &db).map_err(|e| format!("copying {}: {e}", t.display()))?;
            // Flush the copy now, or the worker's first checkpoint fsync would pay for writing
            // back the whole file and the run would measure the copy, not the worker.
            std::fs::File::open(&db)
                .and_then(|f| f.sync_all())
                .map_err(|e| e.to_string())?;
        }
        let log = self.dir.join(format!("{label}.log"));
        let group = format!("bench-{label}");
        let started = Instant::now();
        let child = self
            .claimgate(&load.stream, &group, db.as_os_str(), &log)
            .args(["run", "--exit-when-idle", "--consumer", label])
            .args(flags)
            .args(&self.extra)
            .spawn()
            .map_err(|e| e.to_string())?;
        let written = written_at_exit(child.id())?;
        let (status, rss_kib, cpu_s) = wait4(child.id())?;
        let secs = started.elapsed().as_secs_f64();
        if status != 0 {
            return Err(format!(
                "worker {label} exited with status {status}; see {}",
                log.display()
            ));
        }
        self.verify(load, &group, &db, template.is_some())?;
        let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
        let result = RunResult {
            rate: load.n as f64 / secs,
            commit_p50_us: field(&text, "commit_p50_us="),
            commit_p99_us: field(&text, "commit_p99_us="),
            rss_mib: rss_kib as f64 / 1024.0,
            cpu_us_per_entry: cpu_s * 1e6 / load.n as f64,
            written_kib_per_entry: written as f64 / 1024.0 / load.n as f64,
        };
        if std::env::var_os("BENCH_KEEP_LOGS").is_none() {
            std::fs::remove_file(&log).ok();
        }
        if template.is_none() {
            remove_ledger(&db);
        }
        Ok(result)
    }

    /// The child command, with the worker's environment cleared of anything that could change it.
    fn claimgate(&self, stream: &str, group: &str, db: &OsStr, log: &Path) -> Command {
        let exe = std::env::current_exe().expect("own executable");
        let mut cmd = Command::new(exe);
        let log_file = std::fs::File::create(log).expect("log file");
        cmd.arg(AS_CLAIMGATE)
            .env_remove("CLAIMGATE_FAILPOINT")
            .env(
                "RUST_LOG",
                std::env::var("BENCH_CHILD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("REDIS_URL", &self.redis_url)
            .env("CLAIMGATE_DB", db)
            .env("CLAIMGATE_STREAM", stream)
            .env("CLAIMGATE_GROUP", group)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        cmd
    }

    /// Count, sum, no duplicates, nothing pending, everything read; the history's rows told
    /// by their time ([`HISTORY_ROWS`]).
    fn verify(&self, load: &Load, group: &str, db: &Path, prefilled: bool) -> Res<()> {
        let conn =
            rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| e.to_string())?;
        let q = |sql: &str| -> Res<i64> {
            conn.query_row(sql, [], |r| r.get(0))
                .map_err(|e| format!("{sql}: {e}"))
        };
        // One pass over the history's join for both (ten million rows on the 10M template).
        let (base, base_cents): (i64, i64) = if prefilled {
            let sql = format!(
                "SELECT COUNT(*), COALESCE(SUM(d.amount_cents), 0) FROM {HISTORY_ROWS} < '{PREFILLED_BEFORE}'"
            );
            conn.query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(|e| format!("{sql}: {e}"))?
        } else {
            (0, 0)
        };
        let checks = [
            (
                "disbursements",
                q("SELECT COUNT(*) FROM disbursements")?,
                load.unique as i64 + base,
            ),
            (
                "distinct disbursed keys",
                q("SELECT COUNT(DISTINCT idempotency_key) FROM disbursements")?,
                load.unique as i64 + base,
            ),
            (
                "claims",
                q("SELECT COUNT(*) FROM processed_messages")?,
                load.unique as i64 + base,
            ),
            (
                "cents disbursed",
                q("SELECT COALESCE(SUM(amount_cents),0) FROM disbursements")?,
                load.cents_total + base_cents,
            ),
            (
                "outbox rows",
                q("SELECT COUNT(*) FROM outbox")?,
                load.unique as i64 + base,
            ),
            (
                "duplicate audit records",
                q("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'")?,
                (load.n - load.unique) as i64,
            ),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(format!(
                    "ledger {} is wrong: {what} = {got}, expected {want}",
                    db.display()
                ));
            }
        }
        let (read, pending) = group_progress(&mut self.conn()?, &load.stream, group)?;
        if read != load.n as u64 || pending != 0 {
            return Err(format!(
                "group {group}: {read} entries read (expected {}), {pending} pending",
                load.n
            ));
        }
        Ok(())
    }

    /// (c): the real worker loop with a ledger that records nothing.
    fn null_run(&self, load: &Load, label: &str) -> Res<RunResult> {
        let group = format!("bench-{label}");
        let cfg = Config {
            redis_url: self.redis_url.clone(),
            db: claimgate::config::LedgerLocation::File(self.dir.join("unused.db")),
            stream: load.stream.clone(),
            group: group.clone(),
            redis_wait: Default::default(),
        };
        let ledger = claimgate::config::LedgerName {
            id: format!("bench-null-sink-{label}"),
            shown: "the null sink".into(),
        };
        let mut wcfg = WorkerConfig::new(label, ledger);
        wcfg.exit_when_idle = true;
        let metrics = Metrics::default();
        let started = Instant::now();
        claimgate::worker::run(
            &cfg,
            &wcfg,
            &NullLedger,
            &Shutdown::new(),
            &metrics,
            &|_| Ok(()),
        )
        .map_err(|e| e.to_string())?;
        let secs = started.elapsed().as_secs_f64();
        let acked = Metrics::get(&metrics.acked);
        let (read, pending) = group_progress(&mut self.conn()?, &load.stream, &group)?;
        if acked != load.n as u64 || read != load.n as u64 || pending != 0 {
            return Err(format!(
                "null sink: acked {acked}, read {read}, pending {pending}; expected {} acked",
                load.n
            ));
        }
        Ok(RunResult {
            rate: load.n as f64 / secs,
            commit_p50_us: 0,
            commit_p99_us: 0,
            rss_mib: 0.0,
            cpu_us_per_entry: 0.0,
            written_kib_per_entry: 0.0,
        })
    }

    /// One submission at a time on a quiet stream: XADD, then poll until the group has read it
    /// and nothing is pending (acknowledged, hence committed).
    fn quiet_latency(&self, samples: usize) -> Res<()> {
        let (stream, group) = ("bench:quiet", "bench-quiet");
        let db = self.dir.join("quiet.db");
        let log = self.dir.join("quiet.log");
        let mut conn = self.conn()?;
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query::<()>(&mut conn)
            .map_err(|e| e.to_string())?;
        let mut child = self
            .claimgate(stream, group, db.as_os_str(), &log)
            .args(["run", "--consumer", "quiet"])
            .args(&self.extra)
            .spawn()
            .map_err(|e| e.to_string())?;
        // The worker is ready once its consumer exists (it registers on its first read).
        let ready = Instant::now();
        while consumers(&mut conn, stream, group)? == 0 {
            if ready.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                return Err("worker never started reading".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut took_us = Vec::with_capacity(samples);
        for i in 0..samples {
            std::thread::sleep(Duration::from_millis(20 + (i as u64 * 7) % 30));
            let t0 = Instant::now();
            redis::cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(payload(10_000_000 + i, LOAD_EPOCH_S * 1000 + i as i64))
                .query::<String>(&mut conn)
                .map_err(|e| e.to_string())?;
            loop {
                let (read, pending) = group_progress(&mut conn, stream, group)?;
                if read > i as u64 && pending == 0 {
                    break;
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    return Err(format!("sample {i} was not acknowledged within 10 s"));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            took_us.push(t0.elapsed().as_micros() as u64);
        }
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().map_err(|e| e.to_string())?;
        let stored = rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row("SELECT COUNT(*) FROM disbursements", [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .map_err(|e| e.to_string())?;
        if !status.success() || stored != samples as i64 {
            return Err(format!(
                "quiet run: worker {status}, {stored} disbursements for {samples} submissions"
            ));
        }
        took_us.sort_unstable();
        let at = |q: f64| {
            ms(took_us[((took_us.len() as f64 * q).ceil() as usize).clamp(1, took_us.len()) - 1])
        };
        let within = took_us.iter().filter(|&&us| us <= 10_000).count();
        println!(
            "\nsingle submission on a quiet stream, XADD to committed+acked ({samples} samples): p50 {} p90 {} p99 {} max {}; {within}/{samples} within 10 ms",
            at(0.5), at(0.9), at(0.99), at(1.0)
        );
        // The worker's own account of the same entries, read to XACK, per stage (p50/p99/max
        // in µs): the part of the wait above that the worker can see.
        let stages = std::fs::read_to_string(&log)
            .ok()
            .and_then(|l| {
                l.lines().find_map(|line| {
                    line.split_once("stage latency: ")
                        .map(|(_, s)| s.to_owned())
                })
            })
            .unwrap_or_else(|| "(no stage line in the worker's log)".into());
        println!("  the worker's stages: {stages}");
        remove_ledger(&db);
        Ok(())
    }

    /// Throughput on a ledger already holding `o.prefill` disbursements against an empty one.
    fn prefilled(&self, o: &Opts, load: &Load) -> Res<()> {
        let template = o
            .template
            .clone()
            .unwrap_or_else(|| self.dir.join("prefilled-template.db"));
        if o.template.is_none() || !template.exists() {
            println!();
            prefill_in_child(&template, o.prefill)?;
        }
        println!("on a load in arrival order (the submissions made after the history):");
        self.against_template(o, load, &template, "e", "p")?;
        let backdated = self.load(
            "bench:backdated",
            o.n,
            o.dup,
            5,
            Shape::Backdated(o.prefill),
        )?;
        println!("on a back-dated load (every claim lands among the history's):");
        self.against_template(o, &backdated, &template, "be", "bp")?;
        self.drop_stream("bench:backdated")?;
        if o.template.is_none() {
            remove_ledger(&template);
        }
        Ok(())
    }

    /// Rounds of `load` on an empty ledger and on a copy of `template`, interleaved.
    fn against_template(
        &self,
        o: &Opts,
        load: &Load,
        template: &Path,
        empty_label: &str,
        full_label: &str,
    ) -> Res<()> {
        let (mut empty, mut full) = (Vec::new(), Vec::new());
        for round in 1..=o.rounds {
            empty.push(self.child_run(load, &format!("{empty_label}{round}"), &[], None)?);
            let label = format!("{full_label}{round}");
            let r = self.child_run(load, &label, &[], Some(template))?;
            remove_ledger(&self.dir.join(format!("{label}.db")));
            full.push(r);
            println!(
                "  round {round}: empty {:.0}/s ({:.1} us cpu, {:.2} KiB written /entry)  prefilled {:.0}/s ({:.1} us cpu, {:.2} KiB written /entry)",
                empty[round - 1].rate, empty[round - 1].cpu_us_per_entry, empty[round - 1].written_kib_per_entry,
                full[round - 1].rate, full[round - 1].cpu_us_per_entry, full[round - 1].written_kib_per_entry
            );
        }
        let (me, mf) = (median(&empty, |r| r.rate), median(&full, |r| r.rate));
        println!(
            "  medians: empty {me:.0}/s, holding {} {mf:.0}/s ({:+.1}%, ratio {:.2}); cpu {:.1} vs {:.1} us/entry; written {:.2} vs {:.2} KiB/entry; commit p99 {} vs {}",
            o.prefill,
            (mf / me - 1.0) * 100.0,
            mf / me,
            median(&empty, |r| r.cpu_us_per_entry),
            median(&full, |r| r.cpu_us_per_entry),
            median(&empty, |r| r.written_kib_per_entry),
            median(&full, |r| r.written_kib_per_entry),
            ms(median(&empty, |r| r.commit_p99_us as f64) as u64),
            ms(median(&full, |r| r.commit_p99_us as f64) as u64)
        );
        Ok(())
    }

    /// `--fast-filter` off and on, interleaved, on a duplicate-heavy load; on copies of the
    /// pre-filled ledger when `--template` names one, where claim probes miss the page cache.
    fn fast_filter(&self, o: &Opts, dup: f64) -> Res<()> {
        let load = self.load("bench:filter", o.n, dup, 4, Shape::Arrival)?;
        let template = o.template.as_deref().filter(|t| t.exists());
        if let Some(t) = template {
            println!("fast filter runs on copies of {}", t.display());
        }
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for round in 1..=o.rounds {
            off.push(self.child_run(&load, &format!("f0-{round}"), &[], template)?);
            remove_ledger(&self.dir.join(format!("f0-{round}.db")));
            on.push(self.child_run(&load, &format!("f1-{round}"), &["--fast-filter"], template)?);
            remove_ledger(&self.dir.join(format!("f1-{round}.db")));
            println!(
                "round {round}: filter off {:.0}/s ({:.1} us cpu/entry)  on {:.0}/s ({:.1} us cpu/entry)",
                off[round - 1].rate, off[round - 1].cpu_us_per_entry, on[round - 1].rate, on[round - 1].cpu_us_per_entry
            );
        }
        let (m0, m1) = (median(&off, |r| r.rate), median(&on, |r| r.rate));
        println!("  {:.0}% duplicates, medians: --fast-filter off {m0:.0}/s, on {m1:.0}/s ({:+.1}%); commit p50 {} vs {}",
            dup * 100.0, (m1 / m0 - 1.0) * 100.0, ms(median(&off, |r| r.commit_p50_us as f64) as u64), ms(median(&on, |r| r.commit_p50_us as f64) as u64));
        self.drop_stream("bench:filter")
    }
}

fn remove_ledger(db: &Path) {
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        std::fs::remove_file(PathBuf::from(p)).ok();
    }
}

/// Waits for a child to exit without reaping it, and returns the bytes it handed to the write
/// system calls (`wchar` in `/proc/<pid>/io`, readable until the child is reaped).
fn written_at_exit(pid: u32) -> Res<u64> {
    // SAFETY: zeroed siginfo is a valid out-parameter; WNOWAIT leaves the child to wait4.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) } != 0 {
        return Err(format!(
            "waitid({pid}) failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).map_err(|e| e.to_string())?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no wchar in /proc/{pid}/io"))
}

/// Prefills `template` with `n` claims ([`prefill`]) in a child process, so this one's RSS
/// stays small: a child's peak RSS (wait4) starts from its parent's at the fork.
fn prefill_in_child(template: &Path, n: usize) -> Res<()> {
    let started = Instant::now();
    let status = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg(AS_PREFILL)
        .arg(template)
        .arg(n.to_string())
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("prefilling {} failed", template.display()));
    }
    println!(
        "prefilled a ledger with {n} claims in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The number right after the last `marker` in a worker's log (0 if absent).
fn field(text: &str, marker: &str) -> u64 {
    text.rsplit(marker)
        .next()
        .filter(|_| text.contains(marker))
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A stage's max, in µs, from a worker's `stage latency:` line (`src/observe/metrics.rs`);
/// 0 if the log has none.
fn stage_max_us(log: &str, stage: &str) -> u64 {
    log.lines()
        .rev()
        .find_map(|l| l.split_once("stage latency: "))
        .and_then(|(_, stages)| {
            stages
                .split("; ")
                .find_map(|s| s.strip_prefix(stage)?.strip_prefix(' '))
        })
        .and_then(|s| s.split("max=").nth(1))
        .and_then(|s| s.trim_end_matches("us").parse().ok())
        .unwrap_or(0)
}

/// Waits for a child and returns its exit status, peak RSS in KiB (ru_maxrss) and CPU seconds
/// (user + system).
fn wait4(pid: u32) -> Res<(i32, i64, f64)> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter; pid is our own unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let got = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    if got != pid as i32 {
        return Err(format!(
            "wait4({pid}) failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        code,
        usage.ru_maxrss,
        secs(usage.ru_utime) + secs(usage.ru_stime),
    ))
}

/// `(entries-read, pending)` of a group, from XINFO GROUPS.
fn group_progress(conn: &mut redis::Connection, stream: &str, group: &str) -> Res<(u64, u64)> {
    let info = group_info(conn, stream, group)?;
    let get = |k: &str| {
        info.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| *v)
            .unwrap_or(0)
    };
    Ok((get("entries-read"), get("pending")))
}

fn consumers(conn: &mut redis::Connection, stream: &str, group: &str) -> Res<u64> {
    Ok(group_info(conn, stream, group)?
        .iter()
        .find(|(n, _)| n == "consumers")
        .map(|(_, v)| *v)
        .unwrap_or(0))
}

fn group_info(conn: &mut redis::Connection, stream: &str, group: &str) -> Res<Vec<(String, u64)>> {
    let groups: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query(conn)
        .map_err(|e| e.to_string())?;
    for g in groups {
        let flat = claimgate::broker::stream::array(g).map_err(|e| e.to_string())?;
        let (mut name, mut pairs) = (String::new(), Vec::new());
        let mut it = flat.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            let k = claimgate::broker::stream::string(k).map_err(|e| e.to_string())?;
            if k == "name" {
                name = claimgate::broker::stream::string(v).map_err(|e| e.to_string())?;
            } else if !matches!(
                v,
                redis::Value::BulkString(_) | redis::Value::SimpleString(_)
            ) {
                pairs.push((
                    k,
                    claimgate::broker::stream::int(v).unwrap_or(0).max(0) as u64,
                ));
            }
        }
        if name == group {
            return Ok(pairs);
        }
    }
    Ok(Vec::new())
}

/// (c)'s ledger: accepts everything and writes nothing.
struct NullLedger;

impl Ledger for NullLedger {
    fn record(
        &self,
        items: &[Item<'_>],
        _consumer: &str,
        _stream: &str,
    ) -> claimgate::Result<Vec<Outcome>> {
        Ok(items
            .iter()
            .map(|item| match item {
                Item::Submission { .. } => Outcome::Processed,
                Item::KnownDuplicate { committed_by, .. } => Outcome::Duplicate {
                    first_claimed_at: committed_by.to_string(),
                    purged_at: None,
                },
                Item::DeadLetter { .. } => Outcome::DeadLettered,
                Item::Vanished { .. } => Outcome::Vanished,
            })
            .collect())
    }

    fn stats(&self) -> claimgate::Result<Stats> {
        Ok(Stats::default())
    }
}

/// The disbursements, outbox and audit log as a format-4 release declared them, made before
/// the schema so it keeps them: `prefill`'s `wide` ledger (the tests' fixture).
const WIDE_TABLES: &str = include_str!("../tests/it/fixtures/schema-v4-effects.sql");

/// Builds a ledger holding `n` earlier submissions by direct SQL: claims with random keys,
/// their disbursements, published outbox rows and a correctly chained audit trail. The
/// submissions were made evenly over the 3.5 years before the loads' (from 2023-01-01), as a
/// ledger that has been in service that long holds them, each recorded a moment after it was
/// made: before [`PREFILLED_BEFORE`], so verification can tell them from the run's own rows,
/// and spread over the years, so `retention purge` of a year removes a year's claims.
///
/// Rows are written as the worker writes them into a ledger this release made (format 5:
/// the disbursement's time and the outbox row's event left to their claim); `wide`
/// makes the three tables as a format-4 release did and fills every column, hashes as hex.
fn prefill(path: &Path, n: usize, wide: bool) -> Res<()> {
    use claimgate::domain::audit::{Kind, Record, GENESIS_HASH};
    use claimgate::domain::event::{announcing, Announced};
    remove_ledger(path);
    if wide {
        let conn = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
        conn.execute_batch(WIDE_TABLES).map_err(|e| e.to_string())?;
    }
    drop(claimgate::ledger::sqlite::SqliteLedger::open_path(path).map_err(|e| e.to_string())?);
    let mut conn = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
    conn.execute_batch("PRAGMA synchronous = OFF; PRAGMA cache_size = -262144;")
        .map_err(|e| e.to_string())?;
    let tx = conn.transaction().map_err(|e| e.to_string())?;
    let mut rng = fastrand::Rng::with_seed(99);
    let step_ms = history_step_ms(n);
    let mut prev = GENESIS_HASH.to_owned();
    {
        let mut claim = tx.prepare("INSERT INTO processed_messages (claim_id, idempotency_key, award_id, submission_timestamp, amount_cents, claimed_at, stream_entry_id, consumer, submission_instant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'prefill', ?8)").map_err(|e| e.to_string())?;
        let (disb, outbox) = if wide {
            ("INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5)",
             "INSERT INTO outbox (claim_id, event_type, payload, created_at, published_at) VALUES (?1, 'disbursement.recorded', ?2, ?3, ?3)")
        } else {
            (
                "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents) VALUES (?1, ?2, ?3, ?4)",
                "INSERT INTO outbox (claim_id, published_at) VALUES (?1, ?3)",
            )
        };
        let mut disb = tx.prepare(disb).map_err(|e| e.to_string())?;
        let mut outbox = tx.prepare(outbox).map_err(|e| e.to_string())?;
        for i in 1..=n as i64 {
            let mut key = [0u8; 32];
            rng.fill(&mut key);
            let hex = claimgate::domain::key::to_hex(&key);
            let award = format!("P-{i:09}");
            let cents = 1_000 + i % 50_000;
            let entry = format!("{i}-0");
            let sql = |e: rusqlite::Error| e.to_string();
            let made_ms = HISTORY_EPOCH_S * 1000 + (i - 1) * step_ms;
            let made = timestamp(made_ms);
            let instant = claimgate::domain::clock::instant_utc(&made).expect("a valid timestamp");
            // Recorded a moment after it was made, as a worker keeping up would, so the history
            // spans its years in the rows a purge selects by (`claimed_at`, `recorded_at`).
            let at = recorded(made_ms + 250);
            let at = at.as_str();
            claim
                .execute(rusqlite::params![
                    i,
                    &key[..],
                    award,
                    made,
                    cents,
                    at,
                    entry,
                    instant
                ])
                .map_err(sql)?;
            if wide {
                disb.execute(rusqlite::params![i, &key[..], award, cents, at])
                    .map_err(sql)?;
                let event = announcing(&Announced {
                    amount_cents: cents,
                    award_id: &award,
                    key_hex: &hex,
                    submission_timestamp: &made,
                });
                outbox
                    .execute(rusqlite::params![i, event, at])
                    .map_err(sql)?;
            } else {
                disb.execute(rusqlite::params![i, &key[..], award, cents])
                    .map_err(sql)?;
                outbox
                    .execute(rusqlite::params![i, None::<String>, at])
                    .map_err(sql)?;
            }
            let mut r = Record {
                seq: i,
                kind: Kind::Processed,
                idempotency_key: Some(hex),
                award_id: Some(award),
                amount_cents: Some(cents),
                stream_entry_id: Some(entry),
                consumer: Some("prefill".into()),
                delivery_count: Some(1),
                detail: None,
                recorded_at: at.into(),
                prev_hash: String::new(),
                hash: String::new(),
                batch_index: None,
            };
            r.seal(&prev);
            claimgate::ledger::sqlite::audit_store::insert(&tx, &r).map_err(|e| e.to_string())?;
            prev = r.hash;
        }
    }
    // Written behind claimgate's back, so not counted: without its counts row, the next open
    // counts the rows once and writes it (src/ledger/sqlite/counts.rs), as for an earlier
    // release's ledger. Done here, so no measurement below pays for it.
    tx.execute("DELETE FROM ledger_counts", [])
        .map_err(|e| e.to_string())?;
    if wide {
        tx.execute_batch(
            "UPDATE audit_log SET prev_hash = lower(hex(prev_hash)), hash = lower(hex(hash)),
                                  idempotency_key = lower(hex(idempotency_key));
             UPDATE ledger_meta SET value = '4' WHERE name = 'format_version';",
        )
        .map_err(|e| e.to_string())?;
    }
    tx.commit().map_err(|e| e.to_string())?;
    drop(conn);
    drop(claimgate::ledger::sqlite::SqliteLedger::open_path(path).map_err(|e| e.to_string())?);
    let conn = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .map_err(|e| e.to_string())?;
    Ok(())
}
