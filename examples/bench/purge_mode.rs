//! The benchmark's purge mode (`--purge-under-load`, with `--prefill N`): what `retention
//! purge` of the history's oldest year costs the worker running beside it (issue 37).
//!
//! On copies of one pre-filled ledger (its claims made and recorded evenly over the 3.5 years
//! before the loads), against the same arrival-order load of `--n` entries:
//! 1. the worker alone: its rate, commit p99 and max;
//! 2. the worker and `retention purge --before PURGE_BEFORE --export FILE` started together:
//!    the purge's wall time, CPU and peak RSS (wait4), its export's size; the worker's rate
//!    while the purge ran (claims it made in that window, sampled from the ledger every
//!    [`SAMPLE_EVERY`]), the longest time it made none with entries still waiting, and its
//!    commit p99 and max (its own stop line: from BEGIN to COMMIT, lock waits included);
//! 3. in both, on SQLite, the largest the ledger's WAL file grew (sampled).
//!
//! The same on PostgreSQL ([`beside`] with [`History::Postgres`]): `--whole --postgres` runs it
//! on the template migrated into a private cluster, each run on a `CREATE DATABASE … TEMPLATE`
//! copy.
//!
//! Afterwards the ledger holds the history less what the purge removed plus the load, and
//! `claimgate verify` and `audit verify` pass on it; anything else fails the benchmark.

use super::{wait4, Env, Load, Opts, Res, Shape, AS_CLAIMGATE};
use claimgate::support::localpostgres::LocalPostgres;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The cutoff: the oldest eleven months of the history (it starts 2023-01-01), the latest a
/// purge on 2026-12-05 may use being three years back.
const PURGE_BEFORE: &str = "2023-12-01";
/// How often the worker's progress is read from the ledger while both run.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

pub fn run(o: &Opts) -> Res<()> {
    let (_redis, work, env) = Env::start(o, "claimgate-bench-purge-")?;
    let template = o
        .template
        .clone()
        .unwrap_or_else(|| env.dir.join("purge-template.db"));
    if !template.exists() {
        super::prefill_in_child(&template, o.prefill)?;
    }
    beside(&env, o, &History::Sqlite(template), o.n)?;
    if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
        println!("kept {}", work.keep().display());
    }
    Ok(())
}

/// The pre-filled ledger a purge runs on. Each run gets a copy of it, so the worker alone and
/// the worker beside the purge start from the same rows.
pub(super) enum History<'a> {
    /// A SQLite ledger file.
    Sqlite(PathBuf),
    /// A database in a private PostgreSQL cluster (nobody connected to it: it is copied
    /// with `CREATE DATABASE … TEMPLATE`).
    Postgres {
        pg: &'a LocalPostgres,
        database: &'a str,
    },
}

impl History<'_> {
    fn name(&self) -> &'static str {
        match self {
            History::Sqlite(_) => "SQLite",
            History::Postgres { .. } => "PostgreSQL",
        }
    }

    /// A copy named `label` (a plain name: it may be a database's), and where a worker finds it.
    fn copy(&self, env: &Env, label: &str) -> Res<String> {
        match self {
            History::Sqlite(template) => {
                let db = env.dir.join(format!("{label}.db"));
                std::fs::copy(template, &db).map_err(|e| e.to_string())?;
                // On disk before anything is timed (else the first checkpoint's fsync pays
                // for the copy).
                std::fs::File::open(&db)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| e.to_string())?;
                Ok(db.to_string_lossy().into_owned())
            }
            // On disk before anything is timed too: `STRATEGY FILE_COPY` syncs the files it
            // copies and checkpoints before and after.
            History::Postgres { pg, database } => {
                pg.copy_database(label, database).map_err(|e| e.to_string())
            }
        }
    }

    /// Removes the copy named `label` (at 10M, gigabytes each).
    fn discard(&self, env: &Env, label: &str) -> Res<()> {
        match self {
            History::Sqlite(_) => {
                super::remove_ledger(&env.dir.join(format!("{label}.db")));
                Ok(())
            }
            History::Postgres { pg, .. } => {
                postgres::Client::connect(&pg.url("postgres"), postgres::NoTls)
                    .and_then(|mut c| c.batch_execute(&format!("DROP DATABASE {label}")))
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The history's claims, and how many of them the purge may remove (claimed before the
    /// cutoff).
    fn counts(&self) -> Res<(i64, i64)> {
        let at = match self {
            History::Sqlite(template) => template.to_string_lossy().into_owned(),
            History::Postgres { pg, database } => pg.url(database),
        };
        // Closed before the history is copied: PostgreSQL copies no database with a session.
        let mut c = Counter::open(self, &at)?;
        let history = c.count("SELECT COUNT(*) FROM processed_messages")?;
        let purgeable = c.count(&format!(
            "SELECT COUNT(*) FROM processed_messages WHERE claimed_at < '{PURGE_BEFORE}'"
        ))?;
        if purgeable == 0 || purgeable == history {
            return Err(
                "the history was not prefilled over the years (an earlier bench recorded it at \
                 one instant): delete the template and let this run prefill it again"
                    .into(),
            );
        }
        Ok((history, purgeable))
    }
}

/// The worker alone, then the worker beside `retention purge` of the history's oldest
/// months, each on a copy of `history` with the same `n`-entry load; then the ledger checked
/// and `verify` and `audit verify` run on it.
pub(super) fn beside(env: &Env, o: &Opts, history: &History, n: usize) -> Res<()> {
    let (total, purgeable) = history.counts()?;
    println!(
        "purge under load ({}): {total} claims, {purgeable} of them recorded before {PURGE_BEFORE}; \
         load of {n} entries ({:.0}% duplicates) in arrival order",
        history.name(),
        o.dup * 100.0
    );
    let load = env.load("bench:purge", n, o.dup, 7, Shape::Arrival)?;
    let wal = |l: &Live| match l.wal_peak_mib {
        Some(mib) => format!("   WAL peak {mib:.0} MiB"),
        None => String::new(),
    };
    let alone = live(env, &load, history, total, "pu_alone", false)?;
    history.discard(env, "pu_alone")?;
    println!(
        "  worker alone:       {:>8.0} claims/s   commit p99 {:>7.2} ms  max {:>8.2} ms   longest time \
         with no claim made (claims due) {:.0} ms{}",
        alone.rate,
        alone.commit_p99_us as f64 / 1e3,
        alone.commit_max_us as f64 / 1e3,
        alone.longest_idle_ms,
        wal(&alone)
    );
    let beside = live(env, &load, history, total, "pu_live", true)?;
    let purge = beside.purge.as_ref().expect("a purge ran beside it");
    let export = env.dir.join("purge-export.jsonl");
    println!(
        "  purge of {purgeable} claims: {:>7.1} s wall  {:>6.1} s cpu  peak RSS {:>6.1} MiB  export {:.1} MiB",
        purge.secs,
        purge.cpu_s,
        purge.rss_kib as f64 / 1024.0,
        std::fs::metadata(&export).map_err(|e| e.to_string())?.len() as f64 / 1048576.0
    );
    std::fs::remove_file(&export).map_err(|e| e.to_string())?;
    println!(
        "  worker beside it:   {:>8.0} claims/s   commit p99 {:>7.2} ms  max {:>8.2} ms   longest time \
         with no claim made (claims due) {:.0} ms, ending {:.1} s in (the export last grew {:.1} s in){};  {:.2} x alone{}",
        beside.rate,
        beside.commit_p99_us as f64 / 1e3,
        beside.commit_max_us as f64 / 1e3,
        beside.longest_idle_ms,
        beside.longest_idle_end_s,
        beside.export_end_s.unwrap_or(0.0),
        wal(&beside),
        beside.rate / alone.rate,
        if beside.done_first {
            " (the worker was done first)"
        } else {
            " (the purge was done first: over the purge's time)"
        }
    );
    check(history, &beside.ledger, &load, total - purgeable)?;
    for (label, args) in [
        ("verify", &["verify"][..]),
        ("audit verify", &["audit", "verify"][..]),
    ] {
        let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
        cmd.arg(AS_CLAIMGATE)
            .args(args)
            .env_remove("CLAIMGATE_FAILPOINT")
            .env("RUST_LOG", "warn")
            .env("CLAIMGATE_DB", &beside.ledger)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let t = Instant::now();
        let pid = cmd.spawn().map_err(|e| e.to_string())?.id();
        // Its own peak, sampled ([`Purge::rss_kib`] says why not wait4's).
        let waited = std::thread::spawn(move || wait4(pid));
        let mut rss = 0;
        while !waited.is_finished() {
            rss = vm_hwm_kib(pid).unwrap_or(0).max(rss);
            std::thread::sleep(SAMPLE_EVERY);
        }
        let (status, _, _) = waited
            .join()
            .map_err(|_| format!("{label}'s waiter panicked"))??;
        if status != 0 {
            return Err(format!(
                "{label} after the purge exited with status {status}"
            ));
        }
        println!(
            "  {label} afterwards: passed in {:.1} s, peak RSS {:.1} MiB (VmHWM sampled)",
            t.elapsed().as_secs_f64(),
            rss as f64 / 1024.0
        );
    }
    if std::env::var_os("BENCH_KEEP_LOGS").is_none() {
        history.discard(env, "pu_live")?;
    }
    env.drop_stream("bench:purge")
}

/// A worker's run over `load` on a copy of the history, sampled from the ledger.
struct Live {
    /// Where the copy is (a file or a URL).
    ledger: String,
    /// Claims per second from its start to when it had made them all or, with a purge beside
    /// it that ended first, to the purge's end.
    rate: f64,
    commit_p99_us: u64,
    commit_max_us: u64,
    /// The longest stretch between samples with no claim made and claims still due, and
    /// when it ended (since the start).
    longest_idle_ms: f64,
    longest_idle_end_s: f64,
    /// When the purge's export file last grew (since the start), if one ran.
    export_end_s: Option<f64>,
    /// The largest a SQLite ledger's WAL file was seen while it ran, in MiB.
    wal_peak_mib: Option<f64>,
    /// Whether the worker made its last claim before the purge ended.
    done_first: bool,
    /// The purge beside it, if one ran.
    purge: Option<Purge>,
}

/// What the purge cost.
struct Purge {
    secs: f64,
    cpu_s: f64,
    /// Peak RSS, the largest VmHWM sampled from /proc while it ran: wait4's ru_maxrss of a
    /// child starts from this process's RSS at the spawn, and this one holds the load's index.
    rss_kib: i64,
}

/// Runs a worker (and, with `purge`, `retention purge` started at the same moment) on a copy
/// of the history named `label` and samples its progress until it has made every claim and
/// the purge has exited.
fn live(
    env: &Env,
    load: &Load,
    history: &History,
    claims: i64,
    label: &str,
    purge: bool,
) -> Res<Live> {
    let ledger = history.copy(env, label)?;
    let log = env.dir.join(format!("{label}.log"));
    let export = env.dir.join("purge-export.jsonl");
    let purge_log = env.dir.join("purge.log");
    let mut purge_cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    purge_cmd
        .arg(AS_CLAIMGATE)
        .args(["retention", "purge", "--before", PURGE_BEFORE, "--export"])
        .arg(&export)
        .env_remove("CLAIMGATE_FAILPOINT")
        .env("RUST_LOG", "warn")
        .env("CLAIMGATE_DB", &ledger)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&purge_log).map_err(|e| e.to_string())?);
    let mut sampler = Sampler::open(history, &ledger, claims)?;
    let started = Instant::now();
    let worker = env
        .claimgate(
            &load.stream,
            &format!("bench-{label}"),
            ledger.as_ref(),
            &log,
        )
        .args(["run", "--exit-when-idle", "--consumer", label])
        .args(&env.extra)
        .spawn()
        .map_err(|e| e.to_string())?;
    let purge_pid = if purge {
        Some(purge_cmd.spawn().map_err(|e| e.to_string())?.id())
    } else {
        None
    };
    let purge_waited =
        purge_pid.map(|pid| std::thread::spawn(move || wait4(pid).map(|w| (w, Instant::now()))));
    let watched = Watched {
        purge_pid,
        export: purge.then_some(export.as_path()),
    };
    let progress = Progress::watch(&mut sampler, load.unique as i64, &watched, &purge_waited)?;
    drop(sampler);
    let (wstatus, _, _) = wait4(worker.id())?;
    if wstatus != 0 {
        return Err(format!(
            "worker {label} exited with status {wstatus}; see {}",
            log.display()
        ));
    }
    let purge = match purge_waited {
        None => None,
        Some(waited) => {
            let ((status, _, cpu_s), ended) = waited
                .join()
                .map_err(|_| "the purge's waiter panicked".to_string())??;
            if status != 0 {
                return Err(format!(
                    "retention purge exited with status {status}: {}",
                    std::fs::read_to_string(&purge_log).unwrap_or_default()
                ));
            }
            Some((
                Purge {
                    secs: (ended - started).as_secs_f64(),
                    cpu_s,
                    rss_kib: progress.purge_hwm_kib,
                },
                ended - started,
            ))
        }
    };
    let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
    let (rate, done_first) = progress.rate_until(purge.as_ref().map(|p| p.1));
    Ok(Live {
        ledger,
        rate,
        commit_p99_us: super::field(&text, "commit_p99_us="),
        commit_max_us: super::stage_max_us(&text, "commit"),
        longest_idle_ms: progress.longest_idle.as_secs_f64() * 1e3,
        longest_idle_end_s: progress.longest_idle_end.as_secs_f64(),
        export_end_s: progress.export_grew.map(|t| t.as_secs_f64()),
        wal_peak_mib: progress.wal_peak_bytes.map(|b| b as f64 / 1048576.0),
        done_first,
        purge: purge.map(|p| p.0),
    })
}

fn read_only(db: &Path) -> Res<rusqlite::Connection> {
    rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| e.to_string())
}

/// Reads how many claims the worker has made so far, beside it.
enum Sampler {
    /// Claim ids run on from the history's (a claim that loses its race takes no rowid); the
    /// purge removes only the history's.
    Sqlite {
        conn: rusqlite::Connection,
        history: i64,
        wal: PathBuf,
    },
    /// From the ledger's own counts: claims plus tombstones only grow by claims made (a purge
    /// moves each claim it removes to a tombstone in one transaction). Not the largest claim
    /// id: a sequence value is spent by a claim that loses its race.
    Postgres {
        ledger: Box<dyn claimgate::ledger::Backend>,
        history: i64,
    },
}

impl Sampler {
    fn open(history: &History, ledger: &str, claims: i64) -> Res<Sampler> {
        Ok(match history {
            History::Sqlite(_) => {
                let conn = read_only(Path::new(ledger))?;
                conn.busy_timeout(Duration::from_secs(10))
                    .map_err(|e| e.to_string())?;
                Sampler::Sqlite {
                    conn,
                    history: claims,
                    wal: PathBuf::from(format!("{ledger}-wal")),
                }
            }
            History::Postgres { .. } => {
                let ledger = super::pg_mode::open_made(ledger)?;
                let stats = ledger.stats().map_err(|e| e.to_string())?;
                Sampler::Postgres {
                    ledger,
                    history: (stats.claims + stats.tombstones) as i64,
                }
            }
        })
    }

    /// Claims the worker has made.
    fn made(&mut self) -> Res<i64> {
        let (now, history) = match self {
            Sampler::Sqlite { conn, history, .. } => (
                conn.query_row(
                    "SELECT ifnull(max(claim_id), 0) FROM processed_messages",
                    [],
                    |r| r.get(0),
                )
                .map_err(|e| e.to_string())?,
                *history,
            ),
            Sampler::Postgres { ledger, history } => {
                let s = ledger.stats().map_err(|e| e.to_string())?;
                ((s.claims + s.tombstones) as i64, *history)
            }
        };
        Ok((now - history).max(0))
    }

    /// The SQLite ledger's WAL file's size now.
    fn wal_bytes(&self) -> Option<u64> {
        match self {
            Sampler::Sqlite { wal, .. } => Some(std::fs::metadata(wal).map_or(0, |m| m.len())),
            Sampler::Postgres { .. } => None,
        }
    }
}

/// What else is watched beside the worker's progress.
struct Watched<'a> {
    /// The purge, for its peak RSS.
    purge_pid: Option<u32>,
    /// Its export file, for when it stops growing.
    export: Option<&'a Path>,
}

/// A worker's progress: claims it had made at each sample.
struct Progress {
    /// (since the start, claims the worker had made).
    samples: Vec<(Duration, i64)>,
    /// The longest stretch between samples in which the worker made no claim while it still
    /// had claims to make.
    longest_idle: Duration,
    /// When that stretch ended (since the start).
    longest_idle_end: Duration,
    /// When the purge's export file was last seen to grow.
    export_grew: Option<Duration>,
    /// The claims the load makes.
    due: i64,
    /// The purge's largest VmHWM seen, in KiB.
    purge_hwm_kib: i64,
    /// The largest a SQLite ledger's WAL file was seen, in bytes: SQLite writes it past its
    /// end while no checkpoint can start it over, and keeps it at that size until it closes.
    wal_peak_bytes: Option<u64>,
}

impl Progress {
    /// Samples until the worker made all `due` claims and the purge, if any, has exited.
    fn watch<T>(
        sampler: &mut Sampler,
        due: i64,
        watched: &Watched,
        purge: &Option<std::thread::JoinHandle<T>>,
    ) -> Res<Progress> {
        let started = Instant::now();
        let mut samples = Vec::new();
        let (mut longest_idle, mut last_change) = (Duration::ZERO, Duration::ZERO);
        let mut longest_idle_end = Duration::ZERO;
        let (mut export_len, mut export_grew) = (0, None);
        let mut purge_hwm_kib = 0;
        let mut wal_peak_bytes = None;
        loop {
            if let Some(len) = watched.export.and_then(|e| std::fs::metadata(e).ok()) {
                if len.len() > export_len {
                    (export_len, export_grew) = (len.len(), Some(started.elapsed()));
                }
            }
            if let Some(kib) = watched.purge_pid.and_then(vm_hwm_kib) {
                purge_hwm_kib = purge_hwm_kib.max(kib);
            }
            wal_peak_bytes = sampler.wal_bytes().max(wal_peak_bytes);
            let made = sampler.made()?;
            let at = started.elapsed();
            match samples.last() {
                Some(&(_, before)) if before == made && made < due => {
                    if at - last_change > longest_idle {
                        (longest_idle, longest_idle_end) = (at - last_change, at);
                    }
                }
                _ => last_change = at,
            }
            samples.push((at, made));
            if made >= due && purge.as_ref().is_none_or(|p| p.is_finished()) {
                break;
            }
            std::thread::sleep(SAMPLE_EVERY);
        }
        Ok(Progress {
            samples,
            longest_idle,
            longest_idle_end,
            export_grew,
            due,
            purge_hwm_kib,
            wal_peak_bytes,
        })
    }

    /// The worker's rate from the first sample to the first that found every claim made (its
    /// idle wait before it exits is not its rate) or, if the purge ended before that, to the
    /// last sample before `purge_ended`; and whether the worker was done first.
    fn rate_until(&self, purge_ended: Option<Duration>) -> (f64, bool) {
        let first = self.samples[0];
        let done = *self
            .samples
            .iter()
            .find(|(_, made)| *made >= self.due)
            .expect("sampling ends only when every claim is made");
        let (last, done_first) = match purge_ended {
            Some(end) if end < done.0 => (
                self.samples
                    .iter()
                    .take_while(|(at, _)| *at <= end)
                    .last()
                    .copied()
                    .unwrap_or(first),
                false,
            ),
            _ => (done, true),
        };
        let secs = (last.0 - first.0).as_secs_f64();
        let rate = if secs > 0.0 {
            (last.1 - first.1) as f64 / secs
        } else {
            0.0
        };
        (rate, done_first)
    }
}

/// The peak resident set of a running process (VmHWM), in KiB; `None` once it has exited.
fn vm_hwm_kib(pid: u32) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The ledger after both: the history less the purged claims, plus the load's submissions.
fn check(history: &History, ledger: &str, load: &Load, kept: i64) -> Res<()> {
    let want = kept + load.unique as i64;
    let outbox = match history {
        History::Sqlite(_) => "outbox",
        History::Postgres { .. } => "outbox_rows",
    };
    let mut c = Counter::open(history, ledger)?;
    for table in ["processed_messages", "disbursements", outbox] {
        let got = c.count(&format!("SELECT COUNT(*) FROM {table}"))?;
        if got != want {
            return Err(format!(
                "after the purge, {table} holds {got} rows, expected {want} ({kept} kept + {} loaded)",
                load.unique
            ));
        }
    }
    Ok(())
}

/// A connection the bench counts rows with, on either ledger.
enum Counter {
    Sqlite(rusqlite::Connection),
    Postgres(postgres::Client),
}

impl Counter {
    /// On the ledger at `at`: a file or a URL, as `history` is.
    fn open(history: &History, at: &str) -> Res<Counter> {
        Ok(match history {
            History::Sqlite(_) => Counter::Sqlite(read_only(Path::new(at))?),
            History::Postgres { .. } => Counter::Postgres(
                postgres::Client::connect(at, postgres::NoTls).map_err(|e| e.to_string())?,
            ),
        })
    }

    /// The one number `sql` reads.
    fn count(&mut self, sql: &str) -> Res<i64> {
        let n = match self {
            Counter::Sqlite(c) => c
                .query_row(sql, [], |r| r.get(0))
                .map_err(|e| e.to_string()),
            Counter::Postgres(c) => c
                .query_one(sql, &[])
                .map(|r| r.get(0))
                .map_err(|e| e.to_string()),
        };
        n.map_err(|e| format!("{sql}: {e}"))
    }
}
