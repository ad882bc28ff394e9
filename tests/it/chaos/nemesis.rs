//! The nemesis: keeps the planned processes running and breaks things on the plan's schedule.
//!
//! Every process is a real `claimgate` child with its log in a file. A kill is SIGKILL; an
//! armed process must die by SIGABRT at its failpoint (anything else is recorded as a fault that
//! did not happen as planned); Redis is SIGKILLed and restarted from its AOF on the same port;
//! a SQLite ledger's write lock is taken from outside by a plain rusqlite connection; a
//! PostgreSQL ledger's server is stopped at once and started again on the same port and data.

use super::plan::{Action, Event, Plan, Role};
use crate::support::{Store, World};
use claimgate::support::localpostgres::LocalPostgres;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long after the window the nemesis waits for armed processes to reach their failpoint.
const ARMED_GRACE_MS: u64 = 60_000;

/// How often the nemesis looks at its processes.
const TICK_MS: u64 = 20;

/// How long after it is due a kill or a Redis restart may wait for its target to hold work
/// (a worker with entries pending, a relay with unpublished rows, a group with entries
/// pending) before it strikes anyway. The plan times a chunk of load just after each.
pub const AIM_MS: u64 = 2_000;

/// A Redis restart may wait longer for its target: the group needs entries pending, and at the
/// moment it is due every worker may be dead (killed, waiting out its respawn delay) with the
/// new load undelivered; one seed missed by that with `AIM_MS` (found on another branch).
pub const RESTART_AIM_MS: u64 = 8_000;

/// How often the nemesis looks while it aims: a chunk is read, committed and acknowledged in
/// a few milliseconds.
const AIM_TICK_MS: u64 = 1;

/// What the nemesis did, for the report and the "every planned fault fired" invariant.
#[derive(Debug, Default)]
pub struct Tally {
    /// Processes SIGKILLed (including plain processes replaced by armed ones).
    pub kills: usize,
    /// Processes that died by SIGABRT at their failpoint, per failpoint.
    pub fired: BTreeMap<&'static str, usize>,
    /// Armed processes that had not fired when the run ended.
    pub not_fired: Vec<String>,
    /// redis-server restarts done.
    pub redis_restarts: usize,
    /// PostgreSQL immediate shutdowns and restarts done.
    pub postgres_restarts: usize,
    /// Lock holds done: (planned, actually held).
    pub lock_holds: Vec<LockHold>,
    /// Processes that exited without being killed or armed to abort: each one is a failure.
    pub unexpected_exits: Vec<String>,
    /// Processes started, over the whole run.
    pub spawns: usize,
    /// What each aimed fault (a kill, a Redis restart) hit.
    pub strikes: Vec<Strike>,
}

/// What one aimed fault hit, measured the moment before it struck.
#[derive(Debug, Clone)]
pub struct Strike {
    /// `worker kill`, `relay kill`, `redis restart` or `postgres restart`.
    pub fault: &'static str,
    /// The work in flight it hit: the victim worker's pending entries, the unpublished outbox
    /// rows (for the relay), the group's pending entries (for a server restart). 0 means it
    /// hit nothing.
    pub work: u64,
}

/// A running child.
struct Running {
    /// The process.
    child: Child,
    /// Its consumer name.
    consumer: String,
    /// `(point, nth, respawn delay, reuse name)` when armed.
    armed: Option<(&'static str, u32, u64, bool)>,
    /// Its log file.
    log: PathBuf,
}

/// One place in the plan where a process of one role runs.
struct Slot {
    /// What runs here.
    role: &'static Role,
    /// The current process, if any.
    running: Option<Running>,
    /// The last consumer name used here (a replacement may take it over).
    consumer: String,
    /// When to start a plain replacement, and whether it takes over `consumer`.
    respawn: Option<(Instant, bool)>,
}

/// The processes and what has been done to them.
pub struct Nemesis<'w> {
    /// The world: its Redis is restarted from here.
    world: &'w mut World,
    /// The PostgreSQL cluster holding the world's ledger (PostgreSQL runs only), restarted
    /// from here.
    postgres: Option<&'w mut LocalPostgres>,
    /// The plan.
    plan: &'w Plan,
    /// One per planned process.
    slots: Vec<Slot>,
    /// Lock holders still running.
    lockers: Vec<JoinHandle<LockHold>>,
    /// When the chaos started (set by `run`).
    start: Instant,
    /// Where process logs go.
    logs: PathBuf,
    /// A connection for aiming (reset after a Redis restart or error).
    redis: Option<redis::Connection>,
    /// A ledger connection for aiming at the relays (reset after a restart or error).
    ledger: Option<LedgerConn>,
    /// Counts.
    pub tally: Tally,
}

impl<'w> Nemesis<'w> {
    /// Starts one plain process per slot. `postgres` is the cluster of a PostgreSQL ledger.
    pub fn start(
        world: &'w mut World,
        plan: &'w Plan,
        postgres: Option<&'w mut LocalPostgres>,
    ) -> Nemesis<'w> {
        assert_eq!(
            postgres.is_some(),
            world.store == Store::Postgres,
            "a PostgreSQL ledger's cluster, and only then"
        );
        let logs = world.dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        let slots = plan
            .slots
            .iter()
            .enumerate()
            .map(|(i, role)| Slot {
                role,
                running: None,
                consumer: format!("{}-{i}-0", role.name),
                respawn: None,
            })
            .collect();
        let mut nemesis = Nemesis {
            world,
            postgres,
            plan,
            slots,
            lockers: Vec::new(),
            start: Instant::now(),
            logs,
            redis: None,
            ledger: None,
            tally: Tally::default(),
        };
        for slot in 0..nemesis.slots.len() {
            nemesis.spawn(slot, None, true);
        }
        nemesis
    }

    /// Runs the schedule against the clock started at `start`, until every event has happened,
    /// the producer is `done`, and every armed process has fired (or the grace time is over).
    /// Meanwhile `wants_load` tells the producer whether a fault is still to come.
    pub fn run(&mut self, start: Instant, wants_load: &AtomicBool, done: &AtomicBool) {
        self.start = start;
        let chaos = Duration::from_millis(self.plan.size.chaos_ms);
        let deadline = chaos + Duration::from_millis(ARMED_GRACE_MS);
        let mut next = 0;
        loop {
            let now = start.elapsed();
            let mut aiming = false;
            while let Some(event) = self.plan.events.get(next) {
                if Duration::from_millis(event.at_ms) > now {
                    break;
                }
                let aim_ms = match event.action {
                    Action::RestartRedis { .. } | Action::RestartPostgres { .. } => RESTART_AIM_MS,
                    _ => AIM_MS,
                };
                let aim_over = now >= Duration::from_millis(event.at_ms + aim_ms);
                if !self.apply(event, aim_over) {
                    aiming = true;
                    break;
                }
                next += 1;
            }
            self.reap();
            self.respawn_due();
            let armed_left = self
                .slots
                .iter()
                .any(|s| s.running.as_ref().is_some_and(|r| r.armed.is_some()));
            wants_load.store(
                armed_left || next < self.plan.events.len(),
                Ordering::SeqCst,
            );
            if now >= chaos
                && next == self.plan.events.len()
                && done.load(Ordering::SeqCst)
                && !armed_left
            {
                break;
            }
            if now >= deadline {
                self.give_up(next);
                break;
            }
            std::thread::sleep(Duration::from_millis(if aiming {
                AIM_TICK_MS
            } else {
                TICK_MS
            }));
        }
        for locker in self.lockers.drain(..) {
            self.tally
                .lock_holds
                .push(locker.join().expect("lock holder panicked"));
        }
    }

    /// Stops every process with SIGTERM, as an operator would; each must exit 0. Returns the
    /// ones that did not.
    pub fn stop_all(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        for slot in &mut self.slots {
            slot.respawn = None;
            if let Some(mut r) = slot.running.take() {
                signal(&r.child, libc::SIGTERM);
                let status = wait(&mut r.child, Duration::from_secs(60));
                if !status.success() {
                    failures.push(format!(
                        "{} after SIGTERM: {status}\n{}",
                        r.consumer,
                        tail(&r.log)
                    ));
                }
            }
        }
        failures
    }

    /// Does one event; false when it has to wait: no process in a state it can act on yet, a
    /// lock hold under way (kills and arms wait for its end, so the workers waiting on the lock
    /// live to show the wait), or — until `aim_over` — no target holding work.
    fn apply(&mut self, event: &Event, aim_over: bool) -> bool {
        let lock_held = self.lockers.iter().any(|l| !l.is_finished());
        match event.action {
            Action::Kill { .. } | Action::Arm { .. } if lock_held => return false,
            _ => {}
        }
        match event.action {
            Action::Kill {
                slot,
                respawn_delay_ms,
                reuse_name,
            } => {
                let Some(planned) = self.plain_slot(slot) else {
                    return false;
                };
                let role = self.slots[planned].role;
                let (slot, work) = match self.busiest(role) {
                    Some((busy, work)) => (busy, work),
                    None if !aim_over => return false,
                    None => (planned, 0),
                };
                self.tally.strikes.push(Strike {
                    fault: if role.name == "relay" {
                        "relay kill"
                    } else {
                        "worker kill"
                    },
                    work,
                });
                self.kill(slot);
                self.slots[slot].respawn = Some((
                    Instant::now() + Duration::from_millis(respawn_delay_ms),
                    reuse_name,
                ));
            }
            Action::Arm {
                slot,
                point,
                nth,
                respawn_delay_ms,
                reuse_name,
            } => {
                let Some(slot) = self.plain_slot(slot) else {
                    return false;
                };
                self.kill(slot);
                self.spawn(
                    slot,
                    Some((point, nth, respawn_delay_ms, reuse_name)),
                    false,
                );
            }
            Action::RestartRedis { down_ms } => {
                let pending = self.group_pending();
                if pending == 0 && !aim_over {
                    return false;
                }
                self.tally.strikes.push(Strike {
                    fault: "redis restart",
                    work: pending,
                });
                self.redis = None;
                self.world.redis.kill();
                std::thread::sleep(Duration::from_millis(down_ms));
                self.world
                    .redis
                    .restart()
                    .expect("redis-server restarts from its AOF");
                self.tally.redis_restarts += 1;
            }
            Action::RestartPostgres { down_ms } => {
                let pending = self.group_pending();
                if pending == 0 && !aim_over {
                    return false;
                }
                self.tally.strikes.push(Strike {
                    fault: "postgres restart",
                    work: pending,
                });
                self.ledger = None;
                let pg = self
                    .postgres
                    .as_mut()
                    .expect("a PostgreSQL restart is planned only for a PostgreSQL ledger");
                pg.stop_immediate().expect("PostgreSQL stops (immediate)");
                std::thread::sleep(Duration::from_millis(down_ms));
                pg.start_again()
                    .expect("PostgreSQL starts again and recovers from its WAL");
                self.tally.postgres_restarts += 1;
            }
            Action::HoldLedgerLock { hold_ms } => {
                assert_eq!(
                    self.world.store,
                    Store::Sqlite,
                    "a lock hold is planned only for a SQLite ledger"
                );
                let (db, start) = (self.world.db.clone(), self.start);
                self.lockers.push(std::thread::spawn(move || {
                    hold_write_lock(&db, Duration::from_millis(hold_ms), start)
                }));
            }
        }
        true
    }

    /// `wanted` if a plain process runs there, else the next slot of the same role that has one.
    fn plain_slot(&self, wanted: usize) -> Option<usize> {
        let n = self.slots.len();
        (0..n).map(|i| (wanted + i) % n).find(|&i| {
            let s = &self.slots[i];
            std::ptr::eq(s.role, self.slots[wanted].role)
                && s.running.as_ref().is_some_and(|r| r.armed.is_none())
        })
    }

    /// The plain process of `role` holding the most work right now, with that work, if any
    /// holds some: a worker's pending entries (XPENDING's per-consumer counts), or for the relay
    /// the unpublished outbox rows.
    fn busiest(&mut self, role: &'static Role) -> Option<(usize, u64)> {
        let plain: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                std::ptr::eq(self.slots[i].role, role)
                    && self.slots[i]
                        .running
                        .as_ref()
                        .is_some_and(|r| r.armed.is_none())
            })
            .collect();
        if role.name == "relay" {
            let backlog = self.unpublished();
            return plain.first().filter(|_| backlog > 0).map(|&i| (i, backlog));
        }
        let per_consumer = self.pending_per_consumer();
        plain
            .into_iter()
            .filter_map(|i| {
                let consumer = &self.slots[i].running.as_ref()?.consumer;
                per_consumer
                    .iter()
                    .find(|(c, _)| c == consumer)
                    .map(|(_, n)| (i, *n))
            })
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// The group's pending entries, total (0 while Redis cannot answer).
    fn group_pending(&mut self) -> u64 {
        self.pending_per_consumer().iter().map(|(_, n)| n).sum()
    }

    /// XPENDING's summary: pending entries per consumer. An answer of an unexpected shape is a
    /// failure of the test, never "nothing pending"; a refused connection (Redis down) is.
    fn pending_per_consumer(&mut self) -> Vec<(String, u64)> {
        if self.redis.is_none() {
            self.redis = redis::Client::open(self.world.redis.url())
                .and_then(|c| c.get_connection())
                .ok();
        }
        let Some(conn) = self.redis.as_mut() else {
            return Vec::new();
        };
        let reply: redis::RedisResult<redis::Value> = redis::cmd("XPENDING")
            .arg(claimgate::config::STREAM_DEFAULT)
            .arg(claimgate::config::GROUP_DEFAULT)
            .query(conn);
        let reply = match reply {
            Ok(v) => v,
            Err(_) => {
                self.redis = None;
                return Vec::new();
            }
        };
        parse_pending_summary(&reply)
            .unwrap_or_else(|| panic!("XPENDING summary of an unexpected shape: {reply:?}"))
    }

    /// True once the workers have created the ledger's tables.
    pub fn schema_ready(&mut self) -> bool {
        let Some(conn) = LedgerConn::open(self.world) else {
            return false;
        };
        match conn {
            LedgerConn::Sqlite(c) => c
                .query_row(
                    "SELECT COUNT(*) FROM sqlite_master WHERE name = 'audit_log'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .is_ok_and(|n| n == 1),
            // The schema is applied in one transaction: its chain head row shows all of it.
            LedgerConn::Postgres(mut c) => c
                .query_one("SELECT COUNT(*) FROM chain_head", &[])
                .is_ok_and(|r| r.get::<_, i64>(0) == 1),
        }
    }

    /// Outbox rows not yet published, read from the ledger (0 until it exists, and while it
    /// cannot answer).
    fn unpublished(&mut self) -> u64 {
        if self.ledger.is_none() {
            self.ledger = LedgerConn::open(self.world);
        }
        let Some(conn) = self.ledger.as_mut() else {
            return 0;
        };
        let sql = "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL";
        let n = match conn {
            LedgerConn::Sqlite(c) => c.query_row(sql, [], |r| r.get::<_, i64>(0)).ok(),
            LedgerConn::Postgres(c) => c.query_one(sql, &[]).ok().map(|r| r.get::<_, i64>(0)),
        };
        if n.is_none() {
            self.ledger = None;
        }
        n.unwrap_or(0) as u64
    }

    fn kill(&mut self, slot: usize) {
        let Some(mut r) = self.slots[slot].running.take() else {
            return;
        };
        signal(&r.child, libc::SIGKILL);
        let status = wait(&mut r.child, Duration::from_secs(30));
        if status.signal() == Some(libc::SIGKILL) {
            self.tally.kills += 1;
        } else {
            // It had already exited by itself before the signal landed.
            self.unexpected(&r, status);
        }
    }

    /// Collects processes that exited: armed ones that aborted are the faults planned; any
    /// other exit is recorded as unexpected and the slot restarted.
    fn reap(&mut self) {
        for i in 0..self.slots.len() {
            let Some(r) = self.slots[i].running.as_mut() else {
                continue;
            };
            let Some(status) = r.child.try_wait().expect("try_wait") else {
                continue;
            };
            let r = self.slots[i].running.take().expect("just seen");
            match r.armed {
                Some((point, _, delay_ms, reuse)) if status.signal() == Some(libc::SIGABRT) => {
                    *self.tally.fired.entry(point).or_default() += 1;
                    self.slots[i].respawn =
                        Some((Instant::now() + Duration::from_millis(delay_ms), reuse));
                }
                _ => {
                    self.unexpected(&r, status);
                    self.slots[i].respawn = Some((Instant::now(), false));
                }
            }
        }
    }

    fn respawn_due(&mut self) {
        for i in 0..self.slots.len() {
            if let Some((at, reuse)) = self.slots[i].respawn {
                if Instant::now() >= at {
                    self.slots[i].respawn = None;
                    self.spawn(i, None, reuse);
                }
            }
        }
    }

    /// Starts a process in `slot`, armed or plain, under the slot's last consumer name or a new one.
    fn spawn(
        &mut self,
        slot: usize,
        armed: Option<(&'static str, u32, u64, bool)>,
        reuse_name: bool,
    ) {
        self.tally.spawns += 1;
        let role = self.slots[slot].role;
        if !reuse_name {
            self.slots[slot].consumer = format!("{}-{slot}-{}", role.name, self.tally.spawns);
        }
        let consumer = self.slots[slot].consumer.clone();
        let log = self
            .logs
            .join(format!("{:05}-{consumer}.log", self.tally.spawns));
        let file = File::create(&log).expect("log file");
        let mut cmd = self.world.cmd(
            &(role.args)(self.plan, &consumer)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        cmd.current_dir(self.world.dir.path())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        if let Some((point, nth, _, _)) = armed {
            cmd.env(claimgate::support::failpoint::ENV, format!("{point}:{nth}"));
        }
        // SAFETY: setrlimit is async-signal-safe; no core files from the aborts we cause.
        unsafe {
            cmd.pre_exec(|| {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn claimgate");
        self.slots[slot].running = Some(Running {
            child,
            consumer,
            armed,
            log,
        });
    }

    fn unexpected(&mut self, r: &Running, status: ExitStatus) {
        self.tally.unexpected_exits.push(format!(
            "{} ({:?}) exited by itself: {status}\n{}",
            r.consumer,
            r.armed,
            tail(&r.log)
        ));
    }

    /// Past the deadline: names what never happened and stops the armed processes still waiting.
    fn give_up(&mut self, next: usize) {
        for event in &self.plan.events[next..] {
            self.tally
                .not_fired
                .push(format!("event never applied: {event:?}"));
        }
        for i in 0..self.slots.len() {
            if self.slots[i]
                .running
                .as_ref()
                .is_some_and(|r| r.armed.is_some())
            {
                let mut r = self.slots[i].running.take().expect("just seen");
                signal(&r.child, libc::SIGKILL);
                wait(&mut r.child, Duration::from_secs(30));
                self.tally.not_fired.push(format!(
                    "{} armed {:?} never reached its failpoint\n{}",
                    r.consumer,
                    r.armed,
                    tail(&r.log)
                ));
            }
        }
    }
}

/// The nemesis's own read connection to the ledger, whichever backend.
enum LedgerConn {
    /// The SQLite file, read-only.
    Sqlite(rusqlite::Connection),
    /// A plain session on the PostgreSQL database.
    Postgres(postgres::Client),
}

impl LedgerConn {
    /// A connection, or `None` while the ledger cannot be reached.
    fn open(world: &World) -> Option<LedgerConn> {
        match world.store {
            Store::Sqlite => rusqlite::Connection::open_with_flags(
                &world.db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .ok()
            .map(LedgerConn::Sqlite),
            Store::Postgres => {
                let url = world.db.to_str().expect("a URL");
                let mut config: postgres::Config = url.parse().expect("a PostgreSQL URL");
                config.connect_timeout(Duration::from_secs(2));
                config
                    .connect(postgres::NoTls)
                    .ok()
                    .map(LedgerConn::Postgres)
            }
        }
    }
}

impl Drop for Nemesis<'_> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut r) = slot.running.take() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
    }
}

/// One hold of the ledger's write lock.
#[derive(Debug)]
pub struct LockHold {
    /// When the lock was taken, after the chaos started.
    pub taken_at: Duration,
    /// How long it was meant to be held.
    pub planned: Duration,
    /// How long it was held.
    pub held: Duration,
    /// When it was taken and released, in the time format of the processes' log lines, so
    /// their waits can be matched to it.
    pub wall: (String, String),
}

/// Takes the ledger's write lock with `BEGIN IMMEDIATE` and holds it for `hold`.
fn hold_write_lock(db: &Path, hold: Duration, start: Instant) -> LockHold {
    let conn = rusqlite::Connection::open(db).expect("open ledger");
    // Workers hold the lock only for a commit; waiting for a gap is fine.
    conn.busy_timeout(Duration::from_secs(60))
        .expect("busy timeout");
    conn.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let taken = Instant::now();
    let taken_wall = claimgate::domain::clock::now_rfc3339();
    std::thread::sleep(hold);
    let held = taken.elapsed();
    conn.execute_batch("ROLLBACK")
        .expect("release the write lock");
    LockHold {
        taken_at: taken - start,
        planned: hold,
        held,
        wall: (taken_wall, claimgate::domain::clock::now_rfc3339()),
    }
}

/// `XPENDING key group` (summary form): `[count, min, max, [[consumer, count], ...]]`, or
/// `[0, nil, nil, nil]` when nothing is pending. `None` for any other shape.
fn parse_pending_summary(reply: &redis::Value) -> Option<Vec<(String, u64)>> {
    use redis::Value;
    let Value::Array(parts) = reply else {
        return None;
    };
    let [Value::Int(total), _, _, consumers] = parts.as_slice() else {
        return None;
    };
    let out = match consumers {
        Value::Nil => Vec::new(),
        Value::Array(rows) => rows
            .iter()
            .map(|row| match row {
                Value::Array(pair) => match pair.as_slice() {
                    [name, count] => Some((
                        redis::from_redis_value_ref::<String>(name).ok()?,
                        redis::from_redis_value_ref::<String>(count)
                            .ok()?
                            .parse()
                            .ok()?,
                    )),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    (out.iter().map(|(_, n)| n).sum::<u64>() == *total as u64).then_some(out)
}

fn signal(child: &Child, sig: i32) {
    crate::support::signal(child, sig);
}

/// Waits for a child to exit; panics if it takes longer than `timeout`.
fn wait(child: &mut Child, timeout: Duration) -> ExitStatus {
    crate::support::wait_exit(child, timeout)
}

/// The last lines of a log, for failure messages.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
