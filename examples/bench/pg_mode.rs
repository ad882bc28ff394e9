//! The benchmark's PostgreSQL mode (`--postgres`): the same load through (a) the SQLite
//! worker, (p1) one worker on a PostgreSQL ledger and (p3) three workers on one consumer group
//! and one PostgreSQL ledger, on a private PostgreSQL 15 cluster on this machine (worker,
//! Redis and PostgreSQL share its cores). Every run is verified through the ledger's own
//! `verify` and `stats` before its figures count.

use super::{field, median, ms, wait4, Env, Load, Opts, Res};
use claimgate::config::{LedgerConfig, LedgerLocation};
use claimgate::support::localpostgres::LocalPostgres;
use std::time::{Duration, Instant};

/// One PostgreSQL run's figures.
struct PgRun {
    /// Entries per second, wall clock, all workers together.
    rate: f64,
    /// Worker CPU (user + system, all workers) per entry, microseconds.
    worker_cpu_us: f64,
    /// PostgreSQL CPU (every server process) per entry, microseconds.
    pg_cpu_us: f64,
    /// Commit latency p50 and p99 (the worst worker's), microseconds.
    commit_p50_us: u64,
    commit_p99_us: u64,
    /// Chain-head lock hold p99 (the worst worker's), microseconds.
    head_p99_us: u64,
    /// p99 of the hold's upper bound seen from the worker (with its commit, the round trip
    /// and the worker's scheduling; the worst worker's), microseconds.
    head_commit_p99_us: u64,
    /// WAL bytes written per entry.
    wal_per_entry: f64,
    /// Times a backend found the WAL buffers full and wrote them out itself (`pg_stat_wal`,
    /// the whole server), in the run: a write inside whatever statement was inserting WAL,
    /// the chain head's link among them.
    wal_buffers_full: i64,
    /// How long the ledger's own `verify` took afterwards, seconds.
    verify_s: f64,
    /// Entries the workers' ledger deferred and offered again, all workers together.
    deferred: u64,
}

/// Runs the mode: `o.rounds` rounds of (a), (p1), (p3), then medians.
pub(super) fn run(env: &Env, o: &Opts, load: &Load) -> Res<()> {
    let mut pg = LocalPostgres::start().map_err(|e| e.to_string())?;
    println!(
        "postgres: private PostgreSQL 15 on port {} (fsync=on, synchronous_commit=on)",
        pg.port()
    );
    if o.pg_statements || !o.pg_set.is_empty() {
        configure(&mut pg, o)?;
    }
    let (mut a, mut p1, mut p3) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=o.rounds {
        a.push(env.child_run(load, &format!("a{round}"), &[], None)?);
        p1.push(pg_run(env, &pg, o, load, &format!("p1r{round}"), 1, None)?);
        p3.push(pg_run(env, &pg, o, load, &format!("p3r{round}"), 3, None)?);
        let (x, y) = (&p1[round - 1], &p3[round - 1]);
        println!(
            "round {round}: (a) sqlite {:>7.0}/s  (p1) {:>7.0}/s head p99 {} WAL buffers full {}  (p3) {:>7.0}/s head p99 {} WAL buffers full {}",
            a[round - 1].rate,
            x.rate,
            ms(x.head_p99_us),
            x.wal_buffers_full,
            y.rate,
            ms(y.head_p99_us),
            y.wal_buffers_full
        );
    }
    println!(
        "\nmedians over {} rounds ({} entries, {:.0}% duplicates)",
        o.rounds,
        load.n,
        (1.0 - load.unique as f64 / load.n as f64) * 100.0
    );
    let ra = median(&a, |r| r.rate);
    println!(
        "  (a)  sqlite, 1 worker      {ra:>8.0} entries/s   commit p50 {} p99 {}   worker cpu {:.1} us/entry",
        ms(median(&a, |r| r.commit_p50_us as f64) as u64),
        ms(median(&a, |r| r.commit_p99_us as f64) as u64),
        median(&a, |r| r.cpu_us_per_entry)
    );
    for (label, runs) in [
        ("(p1) postgres, 1 worker   ", &p1),
        ("(p3) postgres, 3 workers  ", &p3),
    ] {
        println!(
            "  {label}{:>8.0} entries/s   commit p50 {} p99 {}   worker cpu {:.1} us/entry   postgres cpu {:.1} us/entry   head hold p99 {} (bound p99 {})   WAL {:.0} B/entry   verify {:.2} s   deferred {:.0}",
            median(runs, |r| r.rate),
            ms(median(runs, |r| r.commit_p50_us as f64) as u64),
            ms(median(runs, |r| r.commit_p99_us as f64) as u64),
            median(runs, |r| r.worker_cpu_us),
            median(runs, |r| r.pg_cpu_us),
            ms(median(runs, |r| r.head_p99_us as f64) as u64),
            ms(median(runs, |r| r.head_commit_p99_us as f64) as u64),
            median(runs, |r| r.wal_per_entry),
            median(runs, |r| r.verify_s),
            median(runs, |r| r.deferred as f64),
        );
    }
    println!(
        "  p1/a = {:.2}   p3/p1 = {:.2}",
        median(&p1, |r| r.rate) / ra,
        median(&p3, |r| r.rate) / median(&p1, |r| r.rate)
    );
    Ok(())
}

/// A PostgreSQL ledger holding a history, to copy for each run that starts from it.
struct Prefilled {
    /// The database (in the same cluster) each run's is copied from.
    database: String,
    /// Its counts before any run: a run's ledger must hold these plus the load's.
    stats: claimgate::ledger::Stats,
}

/// The PostgreSQL row of issue 37's "worker on a large ledger against an empty one"
/// (`--whole --postgres`): `template` (a SQLite ledger of N claims) migrated once into a
/// private cluster, timed, then `o.rounds` rounds of (pe) one node on an empty ledger and (pf)
/// one node on a copy of the migrated one (`CREATE DATABASE … TEMPLATE`, untimed), the same
/// load each time, each verified.
pub(super) fn against_template(
    env: &Env,
    o: &Opts,
    load: &Load,
    template: &std::path::Path,
) -> Res<()> {
    let pg = LocalPostgres::start().map_err(|e| e.to_string())?;
    // `migrate` opens its source, which may record a format upgrade in it: a copy, so the
    // template stays what every other part reads.
    let source = env.dir.join("pg-source.db");
    std::fs::copy(template, &source).map_err(|e| format!("copying the template: {e}"))?;
    let url = pg.create_database("prefilled").map_err(|e| e.to_string())?;
    let log = env.dir.join("pg-migrate.log");
    let started = Instant::now();
    let status = env
        .claimgate("unused", "unused", source.as_ref(), &log)
        .args(["migrate", "--to", &url])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("migrate exited {status}; see {}", log.display()));
    }
    let migrate_s = started.elapsed().as_secs_f64();
    super::remove_ledger(&source);
    // What autovacuum would have done by the time a worker meets the ledger.
    let analyzing = Instant::now();
    postgres::Client::connect(&url, postgres::NoTls)
        .and_then(|mut c| c.batch_execute("VACUUM ANALYZE"))
        .map_err(|e| e.to_string())?;
    let stats = open_made(&url)?.stats().map_err(|e| e.to_string())?;
    println!(
        "\none PostgreSQL node on {} claims against an empty PostgreSQL ledger (private cluster on port {}): migrate {migrate_s:.1} s, VACUUM ANALYZE {:.1} s",
        stats.claims,
        pg.port(),
        analyzing.elapsed().as_secs_f64()
    );
    let prefilled = Prefilled {
        database: "prefilled".into(),
        stats,
    };
    let (mut empty, mut full) = (Vec::new(), Vec::new());
    for round in 1..=o.rounds {
        empty.push(pg_run(env, &pg, o, load, &format!("pe{round}"), 1, None)?);
        full.push(pg_run(
            env,
            &pg,
            o,
            load,
            &format!("pf{round}"),
            1,
            Some(&prefilled),
        )?);
        let (e, f) = (&empty[round - 1], &full[round - 1]);
        println!(
            "  round {round}: empty {:.0}/s ({:.1} us worker, {:.1} us postgres cpu /entry)  prefilled {:.0}/s ({:.1} us worker, {:.1} us postgres cpu /entry, verify {:.1} s)",
            e.rate, e.worker_cpu_us, e.pg_cpu_us, f.rate, f.worker_cpu_us, f.pg_cpu_us, f.verify_s
        );
    }
    let (me, mf) = (median(&empty, |r| r.rate), median(&full, |r| r.rate));
    println!(
        "  medians: empty {me:.0}/s, holding {} {mf:.0}/s (ratio {:.2}); postgres cpu {:.1} vs {:.1} us/entry; commit p99 {} vs {}",
        prefilled.stats.claims,
        mf / me,
        median(&empty, |r| r.pg_cpu_us),
        median(&full, |r| r.pg_cpu_us),
        ms(median(&empty, |r| r.commit_p99_us as f64) as u64),
        ms(median(&full, |r| r.commit_p99_us as f64) as u64)
    );
    // One node's purge beside a worker, on the same migrated history. A load three fifths
    // the history's size keeps the worker busy for the whole purge (at 10M: about 23,000
    // claims/s against a purge of about 270 s, as measured by hand before).
    println!();
    let history = super::purge_mode::History::Postgres {
        pg: &pg,
        database: &prefilled.database,
    };
    let n = (prefilled.stats.claims as usize * 3 / 5).max(o.n);
    super::purge_mode::beside(env, o, &history, n)
}

/// `workers` child workers on one fresh database and one fresh group, run to idle.
fn pg_run(
    env: &Env,
    pg: &LocalPostgres,
    o: &Opts,
    load: &Load,
    label: &str,
    workers: usize,
    from: Option<&Prefilled>,
) -> Res<PgRun> {
    let url = match from {
        None => pg.create_database(label),
        Some(p) => pg.copy_database(label, &p.database),
    }
    .map_err(|e| e.to_string())?;
    let group = format!("bench-{label}");
    // The schema first, so no worker's figures include creating it.
    drop(claimgate::ledger::open(&ledger_config(&url)?).map_err(|e| e.to_string())?);
    let mut admin = postgres::Client::connect(&pg.url("postgres"), postgres::NoTls)
        .map_err(|e| e.to_string())?;
    let lsn = |c: &mut postgres::Client| -> Res<String> {
        c.query_one("SELECT pg_current_wal_lsn()::text", &[])
            .map(|r| r.get(0))
            .map_err(|e| e.to_string())
    };
    if o.pg_statements {
        admin
            .batch_execute("SELECT pg_stat_statements_reset()")
            .map_err(|e| e.to_string())?;
    }
    let wal_before = lsn(&mut admin)?;
    let full_before = wal_buffers_full(&mut admin)?;
    let cpu_before = server_cpu_s(pg)?;
    let started = Instant::now();
    let mut children = Vec::new();
    for w in 0..workers {
        let log = env.dir.join(format!("{label}-{w}.log"));
        let child = env
            .claimgate(&load.stream, &group, url.as_ref(), &log)
            .args([
                "run",
                "--exit-when-idle",
                "--consumer",
                &format!("{label}-{w}"),
            ])
            .args(&env.extra)
            .spawn()
            .map_err(|e| e.to_string())?;
        children.push((child, log));
    }
    let mut worker_cpu_s = 0.0;
    for (child, log) in &children {
        let (status, _rss, cpu) = wait4(child.id())?;
        if status != 0 {
            return Err(format!("worker exited {status}; see {}", log.display()));
        }
        worker_cpu_s += cpu;
    }
    let secs = started.elapsed().as_secs_f64();
    // Backends exit when their worker's connections close; let the server reap them so their
    // CPU is counted.
    std::thread::sleep(Duration::from_millis(300));
    let pg_cpu_s = server_cpu_s(pg)? - cpu_before;
    let wal: f64 = admin
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&wal_before],
        )
        .map(|r| r.get(0))
        .map_err(|e| e.to_string())?;
    let full = wal_buffers_full(&mut admin)? - full_before;
    if o.pg_statements {
        print_statements(&mut admin, label, load.n)?;
    }
    let verifying = Instant::now();
    verify(env, load, &group, &url, from.map(|p| &p.stats))?;
    let verify_s = verifying.elapsed().as_secs_f64();
    let (mut p50, mut p99, mut head, mut head_commit, mut deferred) = (0, 0, 0, 0, 0);
    for (_, log) in &children {
        let text = std::fs::read_to_string(log).map_err(|e| e.to_string())?;
        p50 = p50.max(field(&text, "commit_p50_us="));
        p99 = p99.max(field(&text, "commit_p99_us="));
        head = head.max(field(&text, " us, p99 "));
        head_commit = head_commit.max(field(&text, "bound p99 "));
        deferred += field(&text, "dead-lettered, ");
        if std::env::var_os("BENCH_KEEP_LOGS").is_none() {
            std::fs::remove_file(log).ok();
        }
    }
    admin
        .batch_execute(&format!("DROP DATABASE {label}"))
        .map_err(|e| e.to_string())?;
    Ok(PgRun {
        rate: load.n as f64 / secs,
        worker_cpu_us: worker_cpu_s * 1e6 / load.n as f64,
        pg_cpu_us: pg_cpu_s * 1e6 / load.n as f64,
        commit_p50_us: p50,
        commit_p99_us: p99,
        head_p99_us: head,
        head_commit_p99_us: head_commit,
        wal_per_entry: wal / load.n as f64,
        wal_buffers_full: full,
        verify_s,
        deferred,
    })
}

/// `pg_stat_wal.wal_buffers_full`, the server's count so far.
fn wal_buffers_full(admin: &mut postgres::Client) -> Res<i64> {
    admin
        .query_one("SELECT wal_buffers_full FROM pg_stat_wal", &[])
        .map(|r| r.get(0))
        .map_err(|e| e.to_string())
}

/// Applies `--pg-set` and turns on pg_stat_statements where asked; both may need a restart
/// (`shared_preload_libraries`, `wal_buffers`, `shared_buffers`), so the server restarts.
fn configure(pg: &mut LocalPostgres, o: &Opts) -> Res<()> {
    let mut admin = postgres::Client::connect(&pg.url("postgres"), postgres::NoTls)
        .map_err(|e| e.to_string())?;
    let mut settings: Vec<(String, String)> = Vec::new();
    if o.pg_statements {
        settings.push((
            "shared_preload_libraries".into(),
            "pg_stat_statements".into(),
        ));
    }
    for s in &o.pg_set {
        let (name, value) = s
            .split_once('=')
            .filter(|(n, _)| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .ok_or_else(|| format!("--pg-set takes NAME=VALUE, not {s}"))?;
        settings.push((name.into(), value.into()));
    }
    for (name, value) in &settings {
        // A literal, quoted; the name was checked to be a plain identifier above.
        let value = value.replace('\'', "''");
        admin
            .batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'"))
            .map_err(|e| format!("setting {name}: {e}"))?;
    }
    drop(admin);
    pg.stop_immediate().map_err(|e| e.to_string())?;
    pg.start_again().map_err(|e| e.to_string())?;
    let mut admin = postgres::Client::connect(&pg.url("postgres"), postgres::NoTls)
        .map_err(|e| e.to_string())?;
    if o.pg_statements {
        admin
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .map_err(|e| e.to_string())?;
        println!("postgres: pg_stat_statements on; each run prints its costliest statements");
    }
    for (name, _) in settings
        .iter()
        .filter(|(n, _)| n != "shared_preload_libraries")
    {
        let now: String = admin
            .query_one(&format!("SHOW {name}"), &[])
            .map(|r| r.get(0))
            .map_err(|e| e.to_string())?;
        println!("postgres: {name} = {now}");
    }
    Ok(())
}

/// The statements that took most server time in the run just finished, per entry.
fn print_statements(admin: &mut postgres::Client, label: &str, entries: usize) -> Res<()> {
    let rows = admin
        .query(
            "SELECT calls, total_exec_time, rows, shared_blks_hit + shared_blks_read,
                    wal_bytes::float8, regexp_replace(query, '\\s+', ' ', 'g')
             FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 10",
            &[],
        )
        .map_err(|e| e.to_string())?;
    println!(
        "  {label}: statements by server time (us/entry, calls, rows, blocks/entry, WAL B/entry)"
    );
    for r in rows {
        let (calls, ms, n, blocks, wal, q): (i64, f64, i64, i64, f64, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
        let e = entries as f64;
        println!(
            "    {:>7.2} {calls:>7} {n:>8} {:>6.1} {:>6.0}  {}",
            ms * 1000.0 / e,
            blocks as f64 / e,
            wal / e,
            q.chars().take(90).collect::<String>()
        );
    }
    Ok(())
}

/// The settings of the ledger at `db` (a PostgreSQL URL), parsed as `--db` is.
fn ledger_config(db: &str) -> Res<LedgerConfig> {
    let location = LedgerLocation::parse(db).map_err(|e| e.to_string())?;
    Ok(LedgerConfig::at(location))
}

/// The ledger at `db`, opened as a reader opens it: nothing made or upgraded.
pub(super) fn open_made(db: &str) -> Res<Box<dyn claimgate::ledger::Backend>> {
    let mut cfg = ledger_config(db)?;
    cfg.create = false;
    claimgate::ledger::open(&cfg).map_err(|e| e.to_string())
}

/// The ledger's own verify, and counts and sums against the load; the group drained.
fn verify(
    env: &Env,
    load: &Load,
    group: &str,
    db: &str,
    before: Option<&claimgate::ledger::Stats>,
) -> Res<()> {
    let ledger = open_made(db)?;
    ledger.verify().map_err(|e| e.to_string())?;
    let st = ledger.stats().map_err(|e| e.to_string())?;
    let had = before.map_or((0, 0, 0, 0), |b| {
        (
            b.disbursements,
            b.disbursed_cents_total,
            b.duplicates_suppressed,
            b.claims,
        )
    });
    let want = (
        had.0 + load.unique as u64,
        had.1 + load.cents_total as i128,
        had.2 + (load.n - load.unique) as u64,
    );
    let got = (
        st.disbursements,
        st.disbursed_cents_total,
        st.duplicates_suppressed,
    );
    if got != want || st.claims != had.3 + load.unique as u64 {
        return Err(format!(
            "postgres ledger is wrong: (disbursements, cents, duplicates) = {got:?}, expected {want:?}"
        ));
    }
    let (read, pending) = super::group_progress(&mut env.conn()?, &load.stream, group)?;
    if read != load.n as u64 || pending != 0 {
        return Err(format!("group {group}: {read} read, {pending} pending"));
    }
    Ok(())
}

/// CPU seconds used by the server so far: the postmaster and its reaped children (utime,
/// stime, cutime, cstime) plus every live child (utime, stime).
fn server_cpu_s(pg: &LocalPostgres) -> Res<f64> {
    let pid_file = pg.dir().join("data").join("postmaster.pid");
    let text = std::fs::read_to_string(&pid_file).map_err(|e| e.to_string())?;
    let postmaster: i32 = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or("no postmaster pid")?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc")
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces) start at field 3.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| {
            f.get(i - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let ppid = num(4) as i32;
        if pid == postmaster {
            total += num(14) + num(15) + num(16) + num(17);
        } else if ppid == postmaster {
            total += num(14) + num(15);
        }
    }
    Ok(total as f64 / ticks)
}
