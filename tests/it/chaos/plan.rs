//! The seeded plan of one chaos run: what goes on the stream, in which order and when, and
//! which fault the nemesis injects at which moment. Everything random in a run is drawn here,
//! from one seed, before any process starts; the same seed gives the same plan.

use super::load::{self, Planned};
use crate::support::Store;
use fastrand::Rng;

/// The environment variable that replays a run's schedule.
pub const SEED_ENV: &str = "CLAIMGATE_CHAOS_SEED";

/// The environment variable that selects the soak size.
pub const SOAK_ENV: &str = "CLAIMGATE_SOAK";

/// Largest payload the workers accept in this suite: small, so oversize entries stay cheap.
pub const PAYLOAD_BYTES_MAX: usize = 2_048;

/// The ledger's busy timeout (`config::BUSY_TIMEOUT_MS_DEFAULT`): the lock holds are planned
/// on both sides of it.
pub const BUSY_TIMEOUT_MS: u64 = claimgate::config::BUSY_TIMEOUT_MS_DEFAULT;

/// How long after a lock hold is due a chunk of load arrives (the holder takes the lock at once
/// unless a worker is mid-commit).
const LOCK_LOAD_DELAY_MS: u64 = 200;

/// How long after a kill or a server restart is due a chunk of load arrives. The nemesis aims
/// (`nemesis::AIM_MS`): it waits for a victim holding work, and a chunk drains in milliseconds,
/// so without load timed to the faults most of them would wait out their aim on idle processes.
const FAULT_LOAD_DELAY_MS: u64 = 30;

/// One entry in this many is held back from the chunks as the reserve (`load::produce`): at the
/// CI size about 260 entries, thirteen seconds of trickle, where an armed worker needs a few
/// reads per worker in the group.
const RESERVE_DIVISOR: usize = 20;

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Size {
    /// `ci` or `soak`, for the report.
    pub name: &'static str,
    /// Distinct valid submissions.
    pub unique_submissions: usize,
    /// Byte-identical copies sent on top, in percent of `unique_submissions`.
    pub duplicate_percent: usize,
    /// Entries of each malformed variant (every class has several variants).
    pub malformed_per_variant: usize,
    /// How long the producer and the nemesis are at work.
    pub chaos_ms: u64,
    /// SIGKILLs of running processes (workers and the relay).
    pub kills: usize,
    /// Processes started armed with each failpoint.
    pub arms_per_failpoint: usize,
    /// redis-server SIGKILLed and restarted from its AOF.
    pub redis_restarts: usize,
    /// SQLite only: holds of the ledger's write lock shorter than the busy timeout, and as many
    /// longer.
    pub lock_holds_each: usize,
    /// PostgreSQL only: the server stopped at once (`pg_ctl stop -m immediate`: connections
    /// cut, no checkpoint) and started again, recovering from its WAL.
    pub postgres_restarts: usize,
    /// `claimgate run` processes in the group at any time.
    pub workers: usize,
    /// `claimgate relay` processes at any time, sharing the events stream's mark.
    pub relays: usize,
}

impl Size {
    /// A few thousand submissions in about a minute of chaos: the size `cargo test` runs.
    pub fn ci() -> Size {
        Size {
            name: "ci",
            unique_submissions: 4_000,
            duplicate_percent: 30,
            malformed_per_variant: 2,
            chaos_ms: 60_000,
            kills: 36,
            arms_per_failpoint: 3,
            redis_restarts: 2,
            lock_holds_each: 1,
            postgres_restarts: 2,
            workers: 3,
            relays: 2,
        }
    }

    /// 100,000 submissions and 240 kills over ten minutes, for a run by hand.
    pub fn soak() -> Size {
        Size {
            name: "soak",
            unique_submissions: 100_000,
            duplicate_percent: 30,
            malformed_per_variant: 20,
            chaos_ms: 600_000,
            kills: 240,
            arms_per_failpoint: 12,
            redis_restarts: 6,
            lock_holds_each: 4,
            postgres_restarts: 6,
            workers: 3,
            relays: 2,
        }
    }

    /// `soak` when `CLAIMGATE_SOAK=1`, otherwise `ci`.
    pub fn from_env() -> Size {
        match std::env::var(SOAK_ENV).as_deref() {
            Ok("1") | Ok("true") | Ok("yes") => Size::soak(),
            _ => Size::ci(),
        }
    }
}

/// A kind of process the nemesis keeps running, kills and arms.
pub struct Role {
    /// Short name, used in consumer names and log file names.
    pub name: &'static str,
    /// How many run at once.
    pub count: fn(&Size) -> usize,
    /// The failpoints on this role's path, each armed `arms_per_failpoint` times.
    pub failpoints: &'static [&'static str],
    /// More on its path on a shared ledger only, armed the same way there.
    pub postgres_failpoints: &'static [&'static str],
    /// The command line for a process of this role with this consumer name.
    pub args: fn(&Plan, &str) -> Vec<String>,
}

/// The workers: `claimgate run`, several in one consumer group.
pub static WORKER: Role = Role {
    name: "worker",
    count: |size| size.workers,
    failpoints: &["after_read", "after_claim", "before_commit", "after_commit"],
    // Committed, not linked into the chain: a batch only another link can place.
    postgres_failpoints: &["before_link"],
    args: worker_args,
};

/// The outbox relays: several processes on one events stream, killed and crashed at
/// `relay_after_publish` like the workers.
pub static RELAY: Role = Role {
    name: "relay",
    count: |size| size.relays,
    failpoints: &["relay_after_publish"],
    postgres_failpoints: &[],
    args: relay_args,
};

/// Every role, workers first; a slot's index in the plan's `slots` names it everywhere.
pub static ROLES: [&Role; 2] = [&WORKER, &RELAY];

fn worker_args(plan: &Plan, consumer: &str) -> Vec<String> {
    [
        "run",
        "--consumer",
        consumer,
        "--threads",
        "1",
        "--claim-idle-ms",
        &plan.claim_idle_ms.to_string(),
        "--payload-bytes-max",
        &PAYLOAD_BYTES_MAX.to_string(),
        "--batch-count-max",
        &plan.batch_count_max.to_string(),
        // Tries alone 1 s, then 2 s, apart (not the 30 s default), so the drain after the
        // chaos does not wait minutes for an entry parked between two tries.
        "--quarantine-spacing-ms",
        "1000",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn relay_args(_plan: &Plan, _consumer: &str) -> Vec<String> {
    vec!["relay".to_owned()]
}

/// A slice of the load, XADDed together at a planned moment.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Milliseconds after the chaos starts.
    pub at_ms: u64,
    /// One past the last entry of the chunk; the chunk starts where the previous one ended.
    pub end: usize,
}

/// What the nemesis does at one moment.
#[derive(Debug, Clone)]
pub enum Action {
    /// SIGKILL the process in this slot (or the next slot with a plain process, if this one is
    /// armed or restarting), then start a plain one after `respawn_delay_ms`.
    Kill {
        /// The slot aimed at.
        slot: usize,
        /// Pause before the replacement starts, so its entries sit idle and get claimed.
        respawn_delay_ms: u64,
        /// The replacement takes the killed consumer's name (and re-reads its pending entries)
        /// instead of a new one (whose entries others must XAUTOCLAIM).
        reuse_name: bool,
    },
    /// Replace the plain process in this slot with one armed to abort at `point` on its
    /// `nth` hit; when it has aborted, start a plain one after `respawn_delay_ms`.
    Arm {
        /// The slot aimed at (of the role the failpoint belongs to).
        slot: usize,
        /// The failpoint's name.
        point: &'static str,
        /// Which hit aborts.
        nth: u32,
        /// Pause before the replacement starts.
        respawn_delay_ms: u64,
        /// The replacement takes the aborted consumer's name.
        reuse_name: bool,
    },
    /// SIGKILL redis-server, keep it down this long, start it again from its AOF.
    RestartRedis {
        /// Downtime.
        down_ms: u64,
    },
    /// Hold the SQLite ledger's write lock (`BEGIN IMMEDIATE`) from another connection this
    /// long. PostgreSQL has no counterpart: claimgate sets no lock or statement timeout there,
    /// so a lock held from outside is only a wait, with nothing promised past any timeout.
    HoldLedgerLock {
        /// How long the lock is held once taken.
        hold_ms: u64,
    },
    /// Stop the PostgreSQL server at once (immediate shutdown), keep it down this long, start
    /// it again (crash recovery from the WAL).
    RestartPostgres {
        /// Downtime.
        down_ms: u64,
    },
}

/// One planned fault.
#[derive(Debug, Clone)]
pub struct Event {
    /// Milliseconds after the chaos starts.
    pub at_ms: u64,
    /// What happens.
    pub action: Action,
}

/// Everything a run will do.
pub struct Plan {
    /// The seed all of it came from.
    pub seed: u64,
    /// The ledger backend the run is planned for: it decides the ledger outages.
    pub store: Store,
    /// The size.
    pub size: Size,
    /// Stream entries in the order they are XADDed, each with what must become of it.
    pub entries: Vec<Planned>,
    /// When each slice of `entries` is XADDed. The last chunk ends short of the end: the rest is
    /// the reserve, which the producer trickles while the nemesis waits for a fault.
    pub chunks: Vec<Chunk>,
    /// The nemesis's schedule, in time order.
    pub events: Vec<Event>,
    /// The role of each process slot.
    pub slots: Vec<&'static Role>,
    /// `--claim-idle-ms` of every worker.
    pub claim_idle_ms: u64,
    /// `--batch-count-max` of every worker.
    pub batch_count_max: u32,
}

impl Plan {
    /// The plan for `seed` at `size` on a ledger in `store`.
    pub fn new(seed: u64, size: Size, store: Store) -> Plan {
        let mut rng = Rng::with_seed(seed);
        let entries = load::generate(&mut rng, &size);
        let slots: Vec<&'static Role> = ROLES
            .iter()
            .flat_map(|role| std::iter::repeat_n(*role, (role.count)(&size)))
            .collect();
        let events = schedule(&mut rng, &size, &slots, store);
        let planned = entries.len() - entries.len() / RESERVE_DIVISOR;
        let chunks = chunks(&mut rng, planned, size.chaos_ms, &events);
        Plan {
            seed,
            store,
            claim_idle_ms: rng.u64(300..=500),
            batch_count_max: [16, 64, 256][rng.usize(0..3)],
            size,
            entries,
            chunks,
            events,
            slots,
        }
    }

    /// The seed from `CLAIMGATE_CHAOS_SEED` (decimal or 0x-hex), or one from the clock.
    pub fn seed_from_env() -> u64 {
        if let Ok(text) = std::env::var(SEED_ENV) {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            return parsed.unwrap_or_else(|e| panic!("{SEED_ENV}={text:?} is not a u64: {e}"));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64;
        nanos ^ (u64::from(std::process::id()) << 32)
    }

    /// How many relay processes run.
    pub fn relays(&self) -> usize {
        self.slots
            .iter()
            .filter(|r| std::ptr::eq(**r, &RELAY))
            .count()
    }

    /// Planned arms of each failpoint, over all roles that run.
    pub fn arms(&self) -> Vec<(&'static str, usize)> {
        let mut out: Vec<(&'static str, usize)> = Vec::new();
        for e in &self.events {
            if let Action::Arm { point, .. } = e.action {
                match out.iter_mut().find(|(p, _)| *p == point) {
                    Some((_, n)) => *n += 1,
                    None => out.push((point, 1)),
                }
            }
        }
        out
    }

    /// Planned events of one kind.
    pub fn count(&self, pred: impl Fn(&Action) -> bool) -> usize {
        self.events.iter().filter(|e| pred(&e.action)).count()
    }
}

/// Splits the load into chunks: a tenth queued before the first fault as a backlog, the rest
/// spread over the first 85% of the window, in chunks of random size, one of them just after
/// each lock hold starts, so workers are committing while the lock is held, and one just after
/// each kill and server restart is due, so the nemesis finds work in flight to hit.
fn chunks(rng: &mut Rng, entries: usize, chaos_ms: u64, events: &[Event]) -> Vec<Chunk> {
    let backlog = entries / 10;
    let mut out = vec![Chunk {
        at_ms: 0,
        end: backlog,
    }];
    let mut end = backlog;
    let mut sizes = Vec::new();
    while end < entries {
        let n = rng.usize(10..=120).min(entries - end);
        sizes.push(n);
        end += n;
    }
    let span_ms = chaos_ms * 85 / 100;
    let lock_starts = events
        .iter()
        .filter(|e| matches!(e.action, Action::HoldLedgerLock { .. }))
        .map(|e| e.at_ms + LOCK_LOAD_DELAY_MS);
    let fault_starts = events
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                Action::Kill { .. } | Action::RestartRedis { .. } | Action::RestartPostgres { .. }
            )
        })
        .map(|e| e.at_ms + FAULT_LOAD_DELAY_MS);
    let mut times: Vec<u64> = lock_starts.chain(fault_starts).take(sizes.len()).collect();
    times.extend((times.len()..sizes.len()).map(|_| rng.u64(0..=span_ms)));
    times.sort_unstable();
    let mut end = backlog;
    for (n, at_ms) in sizes.into_iter().zip(times) {
        end += n;
        out.push(Chunk { at_ms, end });
    }
    out
}

/// The nemesis's schedule. Kills and arms fall anywhere in 3%..80% of the window (arms end
/// early enough that load is still flowing to trip them). Redis restarts and the ledger's
/// outages (lock holds on SQLite, server restarts on PostgreSQL) are outages: each gets its
/// own stretch of 5%..85% of the window and ends inside it, so no two overlap and each one's
/// effect is its own.
fn schedule(rng: &mut Rng, size: &Size, slots: &[&'static Role], store: Store) -> Vec<Event> {
    let window = |rng: &mut Rng, from_pct: u64, to_pct: u64| {
        rng.u64(size.chaos_ms * from_pct / 100..=size.chaos_ms * to_pct / 100)
    };
    let mut events = Vec::new();
    for _ in 0..size.kills {
        let action = Action::Kill {
            slot: rng.usize(0..slots.len()),
            respawn_delay_ms: rng.u64(0..=1_000),
            reuse_name: rng.bool(),
        };
        events.push(Event {
            at_ms: window(rng, 3, 80),
            action,
        });
    }
    for role in ROLES {
        let role_slots: Vec<usize> = (0..slots.len())
            .filter(|&s| std::ptr::eq(slots[s], role))
            .collect();
        if role_slots.is_empty() {
            continue;
        }
        let shared: &[&'static str] = match store {
            Store::Sqlite => &[],
            Store::Postgres => role.postgres_failpoints,
        };
        for point in role.failpoints.iter().chain(shared) {
            for _ in 0..size.arms_per_failpoint {
                let slot = role_slots[rng.usize(0..role_slots.len())];
                let nth = rng.u32(1..=3);
                let action = Action::Arm {
                    slot,
                    point,
                    // A relay's failpoint is hit once per round that found rows, and the other
                    // relay takes every round it reaches first: on a busy machine the load's
                    // rows came in a few large rounds, and a relay armed for its third after
                    // the load's last chunk waited out the grace time unfired (seen once in a
                    // full suite run). Its first round is the one aimed at.
                    nth: if std::ptr::eq(role, &RELAY) { 1 } else { nth },
                    respawn_delay_ms: rng.u64(0..=500),
                    reuse_name: rng.bool(),
                };
                events.push(Event {
                    at_ms: window(rng, 3, 70),
                    action,
                });
            }
        }
    }
    let mut outages: Vec<Action> = (0..size.redis_restarts)
        .map(|_| Action::RestartRedis {
            down_ms: rng.u64(100..=1_500),
        })
        .collect();
    match store {
        Store::Sqlite => {
            for _ in 0..size.lock_holds_each {
                let short_ms = rng.u64(1_500..=BUSY_TIMEOUT_MS - 1_500);
                let long_ms = rng.u64(BUSY_TIMEOUT_MS + 1_500..=BUSY_TIMEOUT_MS + 4_000);
                outages.push(Action::HoldLedgerLock { hold_ms: short_ms });
                outages.push(Action::HoldLedgerLock { hold_ms: long_ms });
            }
        }
        Store::Postgres => {
            for _ in 0..size.postgres_restarts {
                outages.push(Action::RestartPostgres {
                    down_ms: rng.u64(200..=2_000),
                });
            }
        }
    }
    rng.shuffle(&mut outages);
    let (from_ms, to_ms) = (size.chaos_ms * 5 / 100, size.chaos_ms * 85 / 100);
    let stretch_ms = (to_ms - from_ms) / outages.len().max(1) as u64;
    assert!(
        stretch_ms * 3 / 4 >= BUSY_TIMEOUT_MS + 4_000,
        "window too short for the outages"
    );
    for (i, action) in outages.into_iter().enumerate() {
        let at_ms = from_ms + i as u64 * stretch_ms + rng.u64(0..=stretch_ms / 4);
        events.push(Event { at_ms, action });
    }
    events.sort_by_key(|e| e.at_ms);
    events
}
