//! `claimgate demo`, the walk-through itself: its own Redis, a worker crashed after a commit and
//! restarted, the duplicates suppressed, the report checked (`check.rs`) against the data
//! (`data.rs`).

use super::{check, data};
use crate::broker::stream::{self, Conn};
use crate::config::{Config, LedgerConfig, LedgerLocation};
use crate::domain::money::{dollars, thousands as group};
use crate::error::{Error, Result};
use crate::ledger::Backend;
use crate::support::localredis::{LocalRedis, Options};
use crate::support::Shutdown;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What to tell someone whose machine has no `redis-server`.
pub const INSTALL_HELP: &str = "claimgate demo needs redis-server on PATH. Install it with:\n\n    \
     sudo apt-get install -y redis-server\n\n(macOS: brew install redis), or run the demo against a \
     Redis you already have with --redis-url redis://HOST:PORT";

/// Flags of `claimgate demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Distinct valid submissions to feed (resends and malformed entries come on top).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(100..=200_000))]
    pub submissions: u64,
    /// Seed for the generated submissions.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Where to write the audit report the demo ends with (a new file; default
    /// `claimgate-demo-report-<UTC time>.html` in the current directory).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// The commit after which the first worker crashes, before acknowledging it.
const CRASH_AFTER_COMMITS: u32 = 3;
/// Reads the demo's entries take at least, so the worker commits several times (a commit takes
/// at most 1 + CHANNEL_BATCHES_MAX reads) and the crash lands mid-run.
const DEMO_READS_MIN: u64 = 30;
/// Entries per read for the demo's workers, at most.
const DEMO_BATCH_COUNT_MAX: u64 = 100;
/// How long a worker may take before the demo gives up on it.
const WORKER_TIMEOUT_MS: u64 = 120_000;
/// How often progress is polled.
const POLL_MS: u64 = 100;
/// XADDs per pipelined round trip.
const FEED_PIPELINE_MAX: usize = 500;
/// The demo's ledger: this file in its temporary directory.
const LEDGER_FILE: &str = "ledger.db";
/// The consumer name of the demo's worker (kept across its restart, as systemd would).
const CONSUMER: &str = "demo-worker-1";

/// Everything the demo started. Fields drop in order: workers first, then Redis, then the
/// directory holding both the Redis data and the ledger.
struct Demo<'a> {
    /// Worker processes still running (killed on drop).
    workers: Vec<Child>,
    /// The private redis-server, unless `--redis-url` was given.
    redis: Option<LocalRedis>,
    /// Where to reach Redis, possibly with a password (never printed unredacted).
    redis_url: String,
    /// Stream, group and ledger path the demo uses.
    cfg: Config,
    /// Where the relay step publishes events (demo-prefixed on a Redis the demo did not start).
    events_stream: String,
    /// The demo's handle on the ledger, for progress and the summary (the workers write it).
    ledger: Box<dyn Backend>,
    /// A connection for feeding and progress.
    conn: Conn,
    /// Triggered by SIGINT/SIGTERM; the wait between looks at a step's progress is on it.
    interrupted: &'a Shutdown,
    /// Whether the demo may have created keys in Redis (so there is something to clean up).
    keys_created: bool,
    /// Entries fed to the stream.
    entries: u64,
    /// Whether stdout is a terminal (progress overwrites one line).
    tty: bool,
    /// The temporary directory with the ledger, Redis data and worker logs (removed on drop).
    dir: tempfile::TempDir,
    /// Where the audit report goes: the one file the demo leaves behind.
    report: PathBuf,
}

/// How a step ended.
enum Ended {
    /// The process exited with this status.
    Exited(ExitStatus),
    /// Ctrl-C or SIGTERM: everything is being stopped.
    Interrupted,
}

/// The body of `claimgate demo`. `redis_url_explicit` is true only when `--redis-url` was on
/// the command line.
pub fn run(
    cfg: &Config,
    args: DemoArgs,
    redis_url_explicit: bool,
    interrupted: &Shutdown,
) -> Result<()> {
    let started = Instant::now();
    if !redis_url_explicit && !on_path("redis-server") {
        return Err(Error::Config(INSTALL_HELP.into()));
    }
    let report = args.report.clone().unwrap_or_else(default_report_path);
    if report.exists() {
        return Err(Error::Config(format!(
            "{} exists; the demo's report never overwrites a file (name another with --report)",
            report.display()
        )));
    }
    let mut demo = Demo::start(cfg, redis_url_explicit, interrupted)?;
    demo.report = report;
    let feed = data::generate(args.submissions as usize, args.seed);
    let result = demo.play(&feed, started);
    if result.is_err() {
        demo.show_worker_logs();
    }
    demo.clean_up_shared_redis(redis_url_explicit);
    match result {
        Ok(true) => Ok(()),
        Ok(false) => {
            let redis = if redis_url_explicit {
                ""
            } else {
                " and its redis-server"
            };
            println!("\ninterrupted: stopped the demo's workers{redis}; removed its files.");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

impl<'a> Demo<'a> {
    fn start(cfg: &Config, redis_url_explicit: bool, interrupted: &'a Shutdown) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("claimgate-demo-")
            .tempdir()
            .map_err(|e| Error::io("creating the demo's temporary directory", e))?;
        let (redis, redis_url, cfg, events_stream) = if redis_url_explicit {
            // Someone else's Redis: fresh keys of our own, never the default stream.
            let prefix = format!("claimgate-demo-{}", unix_ms());
            let cfg = Config {
                stream: format!("{prefix}:submissions"),
                group: "claimgate-demo".into(),
                db: LedgerLocation::File(dir.path().join(LEDGER_FILE)),
                ..cfg.clone()
            };
            (None, cfg.redis_url.clone(), cfg, format!("{prefix}:events"))
        } else {
            let redis_dir = dir.path().join("redis");
            std::fs::create_dir(&redis_dir)
                .map_err(|e| Error::io("creating the redis directory", e))?;
            let server = LocalRedis::start_in(&redis_dir, Options::default())?;
            let url = server.url();
            let cfg = Config {
                redis_url: url.clone(),
                db: LedgerLocation::File(dir.path().join(LEDGER_FILE)),
                stream: crate::config::STREAM_DEFAULT.into(),
                group: crate::config::GROUP_DEFAULT.into(),
                // A private server with no replica: nothing to wait for.
                redis_wait: crate::config::RedisWait::default(),
            };
            (
                Some(server),
                url,
                cfg,
                crate::config::EVENTS_STREAM_DEFAULT.into(),
            )
        };
        let ledger = crate::ledger::open(&LedgerConfig::at(cfg.db.clone()))?;
        let conn = Conn::new(stream::client(&redis_url)?);
        Ok(Demo {
            workers: Vec::new(),
            redis,
            redis_url,
            cfg,
            events_stream,
            ledger,
            conn,
            interrupted,
            keys_created: false,
            entries: 0,
            tty: std::io::stdout().is_terminal(),
            dir,
            report: PathBuf::new(),
        })
    }

    /// Runs the story. `Ok(false)` means it was interrupted.
    fn play(&mut self, feed: &data::Feed, started: Instant) -> Result<bool> {
        let e = &feed.expected;
        match &self.redis {
            Some(r) => say(&format!(
                "started a private redis-server on 127.0.0.1:{} (data in {})",
                r.port(),
                self.dir.path().display()
            )),
            None => say(&format!(
                "using {} (keys under {}), as asked",
                stream::redact(&self.redis_url),
                self.cfg.stream
            )),
        }
        say(&format!("ledger: {}", self.cfg.db));
        self.feed(&feed.entries)?;
        say(&format!(
            "queued {} entries on {}: {} distinct submissions, {} byte-identical resends, {} conflicting resubmission, {} malformed",
            group(e.entries), self.cfg.stream, group(e.unique), group(e.resends), e.conflicting, e.malformed_codes.len()
        ));

        say(&format!("starting {CONSUMER}, armed to crash after its commit #{CRASH_AFTER_COMMITS} and before that commit's XACK"));
        let failpoint = format!("after_commit:{CRASH_AFTER_COMMITS}");
        let Ended::Exited(status) =
            self.worker("worker-1", &[("CLAIMGATE_FAILPOINT", &failpoint)])?
        else {
            return Ok(false);
        };
        if status.success() {
            return Err(Error::Other(format!(
                "{CONSUMER} was meant to crash but finished cleanly"
            )));
        }
        let pending = self.pending()?;
        say(&format!(
            "{CONSUMER} crashed ({status}) with {pending} entries delivered but not acknowledged"
        ));

        say(&format!(
            "restarting {CONSUMER}, as systemd's Restart=on-failure would"
        ));
        let args = self.worker_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if !self.run_step("worker-1-restarted", &args)? {
            return Ok(false);
        }
        say(&format!(
            "relaying the outbox to {} (claimgate relay --exit-when-idle)",
            self.events_stream
        ));
        let events_stream = self.events_stream.clone();
        let relay = [
            "relay",
            "--exit-when-idle",
            "--events-stream",
            &events_stream,
        ];
        if !self.run_step("relay", &relay)? {
            return Ok(false);
        }
        self.summary(e, started)?;
        let evidence = self.anchor_and_verify()?;
        self.write_report(&evidence)?;
        Ok(true)
    }

    /// The evidence an auditor keeps: a key pair, a signed anchor of the chain's head, and
    /// `audit verify --anchors --public-key` against it, as docs/operations.md's "Evidence" section does.
    fn anchor_and_verify(&mut self) -> Result<Kept> {
        use crate::ops::evidence;
        let keys = evidence::keygen(&self.dir.path().join("audit-key"))?;
        let key = evidence::load_signing_key(&keys.signing)?;
        let anchor = evidence::take(&*self.ledger, Some(&key))?;
        let anchors_file = self.dir.path().join("anchors.jsonl");
        evidence::append(&anchors_file, &anchor)?;
        say(&format!(
            "\nevidence: a signed anchor of the chain's head (seq {}, hash {}…, key {})",
            anchor.seq,
            &anchor.hash[..12],
            keys.key_id
        ));
        let anchors = evidence::read_anchors(&anchors_file)?;
        let public = evidence::load_public_key(&keys.public)?;
        let v = evidence::verify(&*self.ledger, &anchors, Some(&public))?;
        say(&format!(
            "  audit verify --anchors --public-key: {} records intact, the anchor holds",
            v.records
        ));
        say("  (in production, ship anchors off this box: docs/operations.md, \"Evidence\")");
        Ok(Kept {
            anchors_file,
            anchors,
            public,
        })
    }

    /// The audit report an auditor would open, against the demo's anchor and key: the one file
    /// the demo leaves, outside its temporary directory.
    fn write_report(&mut self, kept: &Kept) -> Result<()> {
        use crate::ops::report;
        let written = report::write(
            &*self.ledger,
            &report::Request {
                out: &self.report,
                anchors_file: Some(&kept.anchors_file),
                anchors: &kept.anchors,
                key: Some(&kept.public),
                period: report::Period::default(),
            },
        )?;
        match written.verdict {
            report::Verdict::Failed(first) => Err(Error::Invariant(format!(
                "{first}; the report {} says FAILED",
                written.path.display()
            ))),
            report::Verdict::Verified { .. } => {
                say(&format!(
                    "\naudit report (open it in a browser): {}",
                    written.path.display()
                ));
                Ok(())
            }
        }
    }

    /// XADDs the whole feed, pipelined.
    fn feed(&mut self, entries: &[data::Fields]) -> Result<()> {
        self.keys_created = true;
        self.entries = entries.len() as u64;
        for chunk in entries.chunks(FEED_PIPELINE_MAX) {
            let mut pipe = redis::pipe();
            for fields in chunk {
                let cmd = pipe.cmd("XADD").arg(&self.cfg.stream).arg("*");
                for (name, value) in fields {
                    cmd.arg(name).arg(value.as_slice());
                }
                cmd.ignore();
            }
            self.conn.pipeline::<()>(&pipe)?;
        }
        Ok(())
    }

    /// Runs the claimgate binary with `args` to completion. `Ok(false)` if interrupted; an
    /// error naming its log if it failed.
    fn run_step(&mut self, label: &str, args: &[&str]) -> Result<bool> {
        match self.step(label, args, &[])? {
            Ended::Interrupted => Ok(false),
            Ended::Exited(s) if s.success() => Ok(true),
            Ended::Exited(s) => Err(Error::Other(format!("{label} failed ({s})"))),
        }
    }

    /// Runs `claimgate run --exit-when-idle` as a child until it exits, showing progress.
    fn worker(&mut self, label: &str, env: &[(&str, &str)]) -> Result<Ended> {
        let args = self.worker_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.step(label, &args, env)
    }

    /// The demo worker's command line: reads small enough that the crash lands mid-run.
    fn worker_args(&self) -> Vec<String> {
        let batch = (self.entries / DEMO_READS_MIN).clamp(1, DEMO_BATCH_COUNT_MAX);
        [
            "run",
            "--consumer",
            CONSUMER,
            "--exit-when-idle",
            "--claim-idle-ms",
            "1000",
        ]
        .into_iter()
        .map(String::from)
        .chain(["--batch-count-max".into(), batch.to_string()])
        .collect()
    }

    /// Runs the claimgate binary with `args` as a child and waits for it, showing progress and
    /// stopping it on Ctrl-C. Its log goes to `<label>.log` in the demo directory.
    fn step(&mut self, label: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Ended> {
        let exe =
            std::env::current_exe().map_err(|e| Error::io("finding the claimgate binary", e))?;
        let log = crate::support::files::create_private(&self.log(label))
            .map_err(|e| Error::io("creating a worker log", e))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // The child gets exactly our settings: nothing inherited from the operator's CLAIMGATE_*
        // or REDIS_URL, and the URL travels in the environment, not on a `ps`-visible command line.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CLAIMGATE_") || k == "REDIS_URL" {
                cmd.env_remove(k);
            }
        }
        cmd.env("REDIS_URL", &self.redis_url)
            .env("CLAIMGATE_DB", self.dir.path().join(LEDGER_FILE))
            .env("CLAIMGATE_STREAM", &self.cfg.stream)
            .env("CLAIMGATE_GROUP", &self.cfg.group)
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| Error::io("starting a worker", e))?;
        self.workers.push(child);
        let deadline = Instant::now() + Duration::from_millis(WORKER_TIMEOUT_MS);
        let mut last_print = Instant::now();
        loop {
            if self.interrupted.is_set() {
                self.stop_workers();
                return Ok(Ended::Interrupted);
            }
            let child = self.workers.last_mut().expect("just pushed");
            if let Some(status) = child
                .try_wait()
                .map_err(|e| Error::io("waiting for a worker", e))?
            {
                self.workers.pop();
                self.progress(label, true);
                return Ok(Ended::Exited(status));
            }
            if Instant::now() > deadline {
                self.stop_workers();
                return Err(Error::Other(format!(
                    "{label} did not finish within {WORKER_TIMEOUT_MS} ms; log: {}",
                    self.log(label).display()
                )));
            }
            if self.tty || last_print.elapsed() >= Duration::from_secs(1) {
                self.progress(label, false);
                last_print = Instant::now();
            }
            // A signal ends the wait at once; the child's exit is looked at each round.
            self.interrupted
                .wait_timeout(Duration::from_millis(POLL_MS));
        }
    }

    fn log(&self, label: &str) -> PathBuf {
        self.dir.path().join(format!("{label}.log"))
    }

    /// One progress line: overwritten in place on a terminal, one per second otherwise.
    fn progress(&mut self, label: &str, last: bool) {
        let Ok(s) = self.ledger.stats() else { return };
        let pending = self
            .pending()
            .map(|p| p.to_string())
            .unwrap_or_else(|_| "-".into());
        let published = s.disbursements.saturating_sub(s.outbox_backlog);
        let line = format!(
            "  [{label}] paid {} · duplicates skipped {} · dead-lettered {} · pending {pending} · events published {}",
            group(s.claims),
            group(s.duplicates_suppressed),
            s.dead_letters,
            group(published)
        );
        let mut out = std::io::stdout().lock();
        let _ = match (self.tty, last) {
            (true, false) => write!(out, "\r{line}\x1b[K"),
            (true, true) => writeln!(out, "\r{line}\x1b[K"),
            (false, _) => writeln!(out, "{line}"),
        };
        let _ = out.flush();
    }

    fn pending(&mut self) -> Result<u64> {
        stream::pending_count(&mut self.conn, &self.cfg.stream, &self.cfg.group)
    }

    /// SIGTERM to every running worker (a graceful stop), SIGKILL to any still there after a
    /// few seconds.
    fn stop_workers(&mut self) {
        for w in &self.workers {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(w.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for w in &mut self.workers {
            while Instant::now() < deadline && matches!(w.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = w.kill();
            let _ = w.wait();
        }
        self.workers.clear();
    }

    /// Prints the tail of each worker log to stderr: they are about to be deleted with the
    /// temporary directory, and they say why a step failed.
    fn show_worker_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("--- last lines of {} ---", path.display());
                for line in &lines[lines.len().saturating_sub(20)..] {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// On a Redis the demo did not start, deletes the keys it created.
    fn clean_up_shared_redis(&mut self, explicit: bool) {
        if !explicit || !self.keys_created {
            return;
        }
        // Every key the demo, its workers and its relay create starts with the demo's prefix
        // (the stream's, up to its first colon), so one pattern finds them all.
        let prefix = self
            .cfg
            .stream
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        if let Err(e) = self.delete_matching(&format!("{prefix}:*")) {
            eprintln!("claimgate demo: could not delete its keys {prefix}:*: {e}");
        }
    }

    /// SCANs for keys matching `pattern` and deletes them, a page at a time.
    fn delete_matching(&mut self, pattern: &str) -> Result<()> {
        let mut cursor = "0".to_owned();
        loop {
            let (next, keys): (String, Vec<String>) = self.conn.query(
                redis::cmd("SCAN")
                    .arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000),
            )?;
            if !keys.is_empty() {
                self.conn.query::<i64>(redis::cmd("DEL").arg(&keys))?;
            }
            if next == "0" {
                return Ok(());
            }
            cursor = next;
        }
    }

    fn summary(&mut self, e: &data::Expected, started: Instant) -> Result<()> {
        let evidence = check::Evidence::read(&*self.ledger)?;
        let stats = &evidence.stats;
        let received: u64 = self.conn.query(redis::cmd("XLEN").arg(&self.cfg.stream))?;
        let events: u64 = self
            .conn
            .query(redis::cmd("XLEN").arg(&self.events_stream))?;
        let resent = evidence.trail.duplicates_resent;
        let redelivered = evidence.trail.duplicates - resent;
        let reasons = evidence.trail.dead_letters_by_reason();
        let checks = evidence.checks(e, received, events);
        let failed: Vec<&check::Check> = checks.iter().filter(|c| !c.ok).collect();
        let mut out = String::new();
        out += "\nclaimgate demo: summary\n";
        out += &format!(
            "  received               {} stream entries\n",
            group(received)
        );
        out += &format!(
            "  processed              {} submissions paid exactly once\n",
            group(stats.claims)
        );
        out += &format!(
            "  duplicates suppressed  {} ({resent} resent by the producer, {redelivered} redeliveries after the crash)\n",
            group(stats.duplicates_suppressed)
        );
        out += &format!(
            "  conflicts flagged      {} ({} conflicting resubmission sent)\n",
            stats.conflicts, e.conflicting
        );
        out += &format!("  dead-lettered          {}\n", stats.dead_letters);
        for (code, n, reason) in &reasons {
            out += &format!("    {n} × {code:<20} e.g. {reason}\n");
        }
        out += &format!(
            "  total disbursed        {}\n",
            dollars(stats.disbursed_cents_total)
        );
        if events > 0 {
            out += &format!(
                "  events published       {} on {}\n",
                group(events),
                self.events_stream
            );
        }
        out += &format!(
            "  outbox backlog         {} events not yet published\n",
            group(stats.outbox_backlog)
        );
        if failed.is_empty() {
            out += &format!(
                "  ledger verified        yes: {} checks passed\n",
                checks.len()
            );
        } else {
            out += "  ledger verified        NO\n";
        }
        for c in &checks {
            out += &format!(
                "    [{}] {}: {}\n",
                if c.ok { "ok" } else { "FAILED" },
                c.what,
                c.detail
            );
        }
        out += &format!(
            "  took                   {:.1}s\n",
            started.elapsed().as_secs_f64()
        );
        print!("{out}");
        let _ = std::io::stdout().flush();
        match failed.first() {
            None => Ok(()),
            Some(c) => Err(Error::Invariant(format!("{}: {}", c.what, c.detail))),
        }
    }
}

impl Drop for Demo<'_> {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// The evidence the demo keeps for its report.
struct Kept {
    /// The anchors file (in the demo's directory).
    anchors_file: PathBuf,
    /// Its anchors.
    anchors: Vec<crate::domain::anchor::Anchored>,
    /// The public key that signed them.
    public: crate::domain::signing::PublicKey,
}

/// `claimgate-demo-report-<UTC time>.html` in the current directory.
fn default_report_path() -> PathBuf {
    let now = crate::domain::clock::now_rfc3339();
    let stamp: String = now
        .chars()
        .take(19)
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    PathBuf::from(format!("claimgate-demo-report-{stamp}Z.html"))
}

/// Whether an executable called `name` is on PATH.
pub fn on_path(name: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| is_executable(&dir.join(name)))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn say(line: &str) {
    println!("{line}");
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
