//! Chaos: the exactly-once guarantee under fire, checked to the cent.
//!
//! One seeded plan drives real processes: a producer XADDs unique submissions, byte-identical
//! duplicates and malformed entries of every class while several `claimgate run` processes share
//! one consumer group and several `claimgate relay` processes one events stream, and a nemesis
//! SIGKILLs them at random moments, starts them armed with every failpoint on the path, SIGKILLs
//! and restarts redis-server (AOF, `appendfsync always`) and takes the ledger away: on SQLite
//! it holds the write lock from outside for less and more than the busy timeout, on PostgreSQL
//! it stops the server at once (immediate shutdown) and starts it again. Then one clean worker
//! and one clean relay drain everything, and every invariant is checked on the ledger itself
//! and reported. The same suite runs on both ledgers (`on_both_ledgers!`).
//!
//! The seed is printed first; `CLAIMGATE_CHAOS_SEED=<seed>` replays the same plan (the same
//! load and the same schedule; process timing is the machine's). `CLAIMGATE_SOAK=1` runs the
//! soak size (100,000 submissions, 240 kills) instead of the CI size.

mod invariants;
mod load;
mod nemesis;
mod plan;
mod stall;

use crate::support::{wait_exit, Store, World};
use claimgate::support::localpostgres::LocalPostgres;
use invariants::Check;
use load::{Expect, Produced};
use nemesis::{Nemesis, Tally};
use plan::{Action, Plan, Size, RELAY, WORKER};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

on_both_ledgers!(
    every_submission_is_paid_exactly_once_through_kills_failpoints_redis_restarts_and_ledger_outages
);

fn every_submission_is_paid_exactly_once_through_kills_failpoints_redis_restarts_and_ledger_outages(
    store: Store,
) {
    // 1. The plan, from the seed (printed first, so any failure can be replayed).
    let plan = Plan::new(Plan::seed_from_env(), Size::from_env(), store);
    println!(
        "chaos: {store:?} ledger, seed {} (replay: {}={} cargo test --release --test it chaos)",
        plan.seed,
        plan::SEED_ENV,
        plan.seed
    );
    describe(&plan);

    // 2. A Redis that persists every write before acknowledging it; the ledger (on PostgreSQL,
    //    a cluster of the test's own, since the nemesis restarts it); one process per slot.
    let mut postgres = (store == Store::Postgres).then(crate::pg::own_cluster);
    let mut world = match &postgres {
        Some(pg) => World::on_postgres_url(&pg.create_database("chaos").expect("chaos database")),
        None => World::persistent(),
    };
    let url = world.redis.url();
    let began = Instant::now();
    let (tally, produced, stop_failures) = {
        let mut nemesis = Nemesis::start(&mut world, &plan, postgres.as_mut());
        assert!(
            crate::support::wait_for(Duration::from_secs(30), || nemesis.schema_ready()),
            "workers never created the ledger"
        );

        // 3. The producer runs on its own thread while the nemesis works through the schedule.
        let done = AtomicBool::new(false);
        let wants_load = AtomicBool::new(true);
        let start = Instant::now();
        let produced = std::thread::scope(|s| {
            let producer = s.spawn(|| load::produce(&url, &plan, start, &wants_load, &done));
            nemesis.run(start, &wants_load, &done);
            producer.join().expect("producer panicked")
        });

        // 4. Every surviving process is stopped as an operator would: SIGTERM, exit 0.
        let stop_failures = nemesis.stop_all();
        (std::mem::take(&mut nemesis.tally), produced, stop_failures)
    };
    let chaos_s = began.elapsed().as_secs_f64();

    // 5. The drain: one clean worker, then one clean relay, until nothing is left.
    let drained = Instant::now();
    let mut drains = vec![drain(&world, &plan, &WORKER.args, "drain-worker")];
    if plan.relays() > 0 {
        drains.push(drain(&world, &plan, &RELAY.args, "drain-relay"));
    }
    let drain_s = drained.elapsed().as_secs_f64();

    // 6. Every invariant, checked on real state and reported whether it holds or not.
    let checked = Instant::now();
    let mut checks = drains;
    checks.push(Check {
        name: "every process stopped by SIGTERM exited 0".into(),
        ok: stop_failures.is_empty(),
        detail: stop_failures
            .first()
            .cloned()
            .unwrap_or_else(|| format!("{} processes", plan.slots.len())),
    });
    checks.extend(invariants::check_all(&world, &plan, &tally));
    let check_s = checked.elapsed().as_secs_f64();
    report(
        &plan,
        &produced,
        &tally,
        &world.dir.path().join("logs"),
        &checks,
    );
    println!("chaos: phases: chaos {chaos_s:.1}s, drain {drain_s:.1}s, checks {check_s:.1}s; total {:.1}s", began.elapsed().as_secs_f64());

    let failed: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
    if !failed.is_empty() {
        if let Some(pg) = &postgres {
            keep_postgres(pg, &world);
        }
        let World { redis, dir, .. } = world;
        drop(redis);
        let kept = dir.keep();
        let names: Vec<String> = failed
            .iter()
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        panic!(
            "chaos seed {}: {} invariant(s) violated (ledger and logs kept in {}):\n{}",
            plan.seed,
            failed.len(),
            kept.display(),
            names.join("\n")
        );
    }
}

/// A failed PostgreSQL run's evidence, kept in the world's directory before the cluster (and
/// its directory) goes: the server's log beside the processes' logs, and the ledger as
/// `ledger.sql` (pg_dump, best effort: a missing dump is said in its place).
fn keep_postgres(pg: &LocalPostgres, world: &World) {
    let logs = world.dir.path().join("logs");
    let _ = std::fs::copy(
        pg.dir().join("server.log"),
        logs.join("postgres-server.log"),
    );
    let dump = world.dir.path().join("ledger.sql");
    let out = std::process::Command::new(pg.bin_dir().join("pg_dump"))
        .arg("--file")
        .arg(&dump)
        .arg(&world.db)
        .output();
    if !matches!(&out, Ok(o) if o.status.success()) {
        let _ = std::fs::write(&dump, format!("-- pg_dump failed: {out:?}\n"));
    }
}

/// Runs one process of a role with `--exit-when-idle` until it exits; it must exit 0.
fn drain(world: &World, plan: &Plan, args: &fn(&Plan, &str) -> Vec<String>, name: &str) -> Check {
    let mut args = args(plan, name);
    args.push("--exit-when-idle".into());
    let log = world.dir.path().join("logs").join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("drain log");
    let mut child = world
        .cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(file.try_clone().expect("drain log"))
        .stderr(file)
        .spawn()
        .expect("spawn drain");
    let status = wait_exit(
        &mut child,
        Duration::from_secs(plan.size.chaos_ms / 1_000 + 120),
    );
    Check {
        name: format!("`claimgate {}` drained everything and exited 0", args[0]),
        ok: status.success(),
        detail: if status.success() {
            status.to_string()
        } else {
            format!("{status}\n{}", nemesis::tail(&log))
        },
    }
}

/// Prints what the plan will do.
fn describe(plan: &Plan) {
    let (mut unique, mut copies, mut malformed) = (0, 0, 0);
    for e in &plan.entries {
        match e.expect {
            Expect::Valid {
                duplicate: false, ..
            } => unique += 1,
            Expect::Valid {
                duplicate: true, ..
            } => copies += 1,
            Expect::Malformed { .. } => malformed += 1,
        }
    }
    let arms: Vec<String> = plan
        .arms()
        .iter()
        .map(|(p, n)| format!("{p} x{n}"))
        .collect();
    println!(
        "chaos: size {}: {unique} unique submissions, {copies} byte-identical duplicates ({:.1}% of valid entries), \
         {malformed} malformed; {} chunks over {:.0}s",
        plan.size.name,
        100.0 * copies as f64 / (unique + copies) as f64,
        plan.chunks.len(),
        plan.size.chaos_ms as f64 / 1_000.0,
    );
    println!(
        "chaos: {} processes ({} workers, {} relays), claim-idle {} ms, batch {}; {} kills, failpoints [{}], {} Redis restarts, {} ledger lock holds, {} PostgreSQL restarts",
        plan.slots.len(),
        plan.slots.len() - plan.relays(),
        plan.relays(),
        plan.claim_idle_ms,
        plan.batch_count_max,
        plan.count(|a| matches!(a, Action::Kill { .. })),
        arms.join(", "),
        plan.count(|a| matches!(a, Action::RestartRedis { .. })),
        plan.count(|a| matches!(a, Action::HoldLedgerLock { .. })),
        plan.count(|a| matches!(a, Action::RestartPostgres { .. })),
    );
}

/// Prints what happened and every check's verdict.
fn report(plan: &Plan, produced: &Produced, tally: &Tally, logs: &Path, checks: &[Check]) {
    let fired: Vec<String> = tally
        .fired
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    println!(
        "chaos: seed {}: produced {} entries (last at {:.1}s, {} trickled for armed processes, {} resumes after Redis failures); {} processes started, \
         {} SIGKILLs, failpoints fired [{}], {} Redis restarts, {} PostgreSQL restarts, ledger lock held {:?}",
        plan.seed,
        produced.entries,
        produced.finished_after.as_secs_f64(),
        produced.trickled,
        produced.resumes,
        tally.spawns,
        tally.kills,
        fired.join(", "),
        tally.redis_restarts,
        tally.postgres_restarts,
        tally.lock_holds.iter().map(|h| format!("{:.1}s", h.held.as_secs_f64())).collect::<Vec<_>>(),
    );
    let (ledger_waits, redis_waits) = transient_episodes(logs);
    println!("chaos: transient-failure episodes in process logs: {ledger_waits} ledger, {redis_waits} redis");
    for c in checks {
        println!(
            "chaos: [{}] {}: {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
}

/// Counts the episodes of transient failure the processes logged (each is logged once when it
/// starts): waits on the ledger's lock and on Redis.
fn transient_episodes(logs: &Path) -> (usize, usize) {
    let (mut ledger, mut redis) = (0, 0);
    for entry in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("retrying with backoff")) {
            if line.contains("ledger") {
                ledger += 1;
            } else {
                redis += 1;
            }
        }
    }
    (ledger, redis)
}
