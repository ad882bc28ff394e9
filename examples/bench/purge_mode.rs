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
//! 3. in both, the largest the ledger's WAL file grew (sampled).
//!
//! Afterwards the ledger holds the history less what the purge removed plus the load, and
//! `claimgate verify` and `audit verify` pass on it; anything else fails the benchmark.

use super::{wait4, Env, Load, Opts, Res, Shape, AS_CLAIMGATE};
use std::path::Path;
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
    let (history, purgeable) = history(&template)?;
    println!(
        "purge under load: {history} claims, {purgeable} of them recorded before {PURGE_BEFORE}; \
         load of {} entries ({:.0}% duplicates) in arrival order",
        o.n,
        o.dup * 100.0
    );
    let load = env.load("bench:purge", o.n, o.dup, 7, Shape::Arrival)?;
    let alone = live(&env, &load, &template, history, "pu-alone", false)?;
    println!(
        "  worker alone:       {:>8.0} claims/s   commit p99 {:>7.2} ms  max {:>8.2} ms   longest time \
         with no claim made (claims due) {:.0} ms   WAL peak {:.0} MiB",
        alone.rate,
        alone.commit_p99_us as f64 / 1e3,
        alone.commit_max_us as f64 / 1e3,
        alone.longest_idle_ms,
        alone.wal_peak_mib
    );
    let beside = live(&env, &load, &template, history, "pu-live", true)?;
    let purge = beside.purge.as_ref().expect("a purge ran beside it");
    println!(
        "  purge of {purgeable} claims: {:>7.1} s wall  {:>6.1} s cpu  peak RSS {:>6.1} MiB  export {:.1} MiB",
        purge.secs,
        purge.cpu_s,
        purge.rss_kib as f64 / 1024.0,
        std::fs::metadata(env.dir.join("purge-export.jsonl"))
            .map_err(|e| e.to_string())?
            .len() as f64
            / 1048576.0
    );
    println!(
        "  worker beside it:   {:>8.0} claims/s   commit p99 {:>7.2} ms  max {:>8.2} ms   longest time \
         with no claim made (claims due) {:.0} ms   WAL peak {:.0} MiB;  {:.2} x alone{}",
        beside.rate,
        beside.commit_p99_us as f64 / 1e3,
        beside.commit_max_us as f64 / 1e3,
        beside.longest_idle_ms,
        beside.wal_peak_mib,
        beside.rate / alone.rate,
        if beside.done_first {
            " (the worker was done first)"
        } else {
            " (the purge was done first: over the purge's time)"
        }
    );
    let db = env.dir.join("pu-live.db");
    check(&db, &load, history - purgeable)?;
    for (label, args) in [
        ("verify", &["verify"][..]),
        ("audit verify", &["audit", "verify"][..]),
    ] {
        let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
        cmd.arg(AS_CLAIMGATE)
            .args(args)
            .env_remove("CLAIMGATE_FAILPOINT")
            .env("RUST_LOG", "warn")
            .env("CLAIMGATE_DB", &db)
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
    if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
        println!("kept {}", work.keep().display());
    }
    Ok(())
}

/// A worker's run over `load` on a copy of `template`, sampled from the ledger.
struct Live {
    /// Claims per second from its start to when it had made them all or, with a purge beside
    /// it that ended first, to the purge's end.
    rate: f64,
    commit_p99_us: u64,
    commit_max_us: u64,
    /// The longest stretch between samples with no claim made and claims still due.
    longest_idle_ms: f64,
    /// The largest the ledger's WAL file was seen while it ran, in MiB.
    wal_peak_mib: f64,
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
/// of `template` named `label`.db and samples its progress until it has made every claim and
/// the purge has exited.
fn live(
    env: &Env,
    load: &Load,
    template: &Path,
    history: i64,
    label: &str,
    purge: bool,
) -> Res<Live> {
    let db = env.dir.join(format!("{label}.db"));
    std::fs::copy(template, &db).map_err(|e| e.to_string())?;
    // On disk before anything is timed (else the first checkpoint's fsync pays for the copy).
    std::fs::File::open(&db)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())?;
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
        .env("CLAIMGATE_DB", &db)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&purge_log).map_err(|e| e.to_string())?);
    let started = Instant::now();
    let worker = env
        .claimgate(
            &load.stream,
            &format!("bench-{label}"),
            db.as_os_str(),
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
    let progress = Progress::watch(&db, history, load.unique as i64, purge_pid, &purge_waited)?;
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
        rate,
        commit_p99_us: super::field(&text, "commit_p99_us="),
        commit_max_us: super::stage_max_us(&text, "commit"),
        longest_idle_ms: progress.longest_idle.as_secs_f64() * 1e3,
        wal_peak_mib: progress.wal_peak_bytes as f64 / 1048576.0,
        done_first,
        purge: purge.map(|p| p.0),
    })
}

/// The template's claims, and how many of them the purge may remove (claimed before the cutoff).
fn history(template: &Path) -> Res<(i64, i64)> {
    let conn = read_only(template)?;
    let count = |sql: &str| -> Res<i64> {
        conn.query_row(sql, [PURGE_BEFORE], |r| r.get(0))
            .map_err(|e| format!("{sql}: {e}"))
    };
    let history = count("SELECT COUNT(*) FROM processed_messages WHERE ?1 IS NOT NULL")?;
    let purgeable = count("SELECT COUNT(*) FROM processed_messages WHERE claimed_at < ?1")?;
    if purgeable == 0 || purgeable == history {
        return Err(format!(
            "{} was not prefilled over the years (an earlier bench recorded its whole history at \
             one instant): delete it and let this run prefill it again",
            template.display()
        ));
    }
    Ok((history, purgeable))
}

fn read_only(db: &Path) -> Res<rusqlite::Connection> {
    rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| e.to_string())
}

/// A worker's progress: claims it had made at each sample.
struct Progress {
    /// (since the start, claims the worker had made).
    samples: Vec<(Duration, i64)>,
    /// The longest stretch between samples in which the worker made no claim while it still
    /// had claims to make.
    longest_idle: Duration,
    /// The claims the load makes.
    due: i64,
    /// The purge's largest VmHWM seen, in KiB.
    purge_hwm_kib: i64,
    /// The largest the ledger's WAL file was seen, in bytes: SQLite writes it past its end
    /// while no checkpoint can start it over, and keeps it at that size until it closes.
    wal_peak_bytes: u64,
}

impl Progress {
    /// Samples until the worker made all `due` claims (claim ids run on from the history's
    /// `history`, and the purge removes only the history's) and the purge, if any, has exited.
    fn watch<T>(
        db: &Path,
        history: i64,
        due: i64,
        purge_pid: Option<u32>,
        purge: &Option<std::thread::JoinHandle<T>>,
    ) -> Res<Progress> {
        let conn = read_only(db)?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut samples = Vec::new();
        let (mut longest_idle, mut last_change) = (Duration::ZERO, Duration::ZERO);
        let mut purge_hwm_kib = 0;
        let wal = db.with_extension("db-wal");
        let mut wal_peak_bytes = 0;
        loop {
            if let Some(kib) = purge_pid.and_then(vm_hwm_kib) {
                purge_hwm_kib = purge_hwm_kib.max(kib);
            }
            wal_peak_bytes = std::fs::metadata(&wal)
                .map_or(0, |m| m.len())
                .max(wal_peak_bytes);
            let made: i64 = conn
                .query_row(
                    "SELECT ifnull(max(claim_id), 0) FROM processed_messages",
                    [],
                    |r| r.get(0),
                )
                .map_err(|e| e.to_string())?;
            let made = (made - history).max(0);
            let at = started.elapsed();
            match samples.last() {
                Some(&(_, before)) if before == made && made < due => {
                    longest_idle = longest_idle.max(at - last_change);
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
fn check(db: &Path, load: &Load, kept: i64) -> Res<()> {
    let conn = read_only(db)?;
    let q = |sql: &str| -> Res<i64> {
        conn.query_row(sql, [], |r| r.get(0))
            .map_err(|e| format!("{sql}: {e}"))
    };
    let want = kept + load.unique as i64;
    for (what, sql) in [
        ("claims", "SELECT COUNT(*) FROM processed_messages"),
        ("disbursements", "SELECT COUNT(*) FROM disbursements"),
        ("outbox rows", "SELECT COUNT(*) FROM outbox"),
    ] {
        let got = q(sql)?;
        if got != want {
            return Err(format!(
                "after the purge, {what} = {got}, expected {want} ({kept} kept + {} loaded)",
                load.unique
            ));
        }
    }
    Ok(())
}
