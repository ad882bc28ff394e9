//! Shared test plumbing: a private redis-server per test, a ledger in a temp dir, and the real
//! `claimgate` binary run as a child process. Nothing here mocks Redis or SQLite.

#![allow(dead_code)]

use claimgate::support::localredis::{LocalRedis, Options};
use rusqlite::OptionalExtension;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The settings of the ledger `db` names (a file, or a PostgreSQL URL), parsed as `--db` is.
pub fn ledger_config(db: impl AsRef<std::ffi::OsStr>) -> claimgate::config::LedgerConfig {
    let location = claimgate::config::LedgerLocation::parse(db).expect("a ledger's location");
    claimgate::config::LedgerConfig::at(location)
}

/// The settings of the PostgreSQL ledger at `url`.
pub fn pg_config(url: &str) -> claimgate::config::LedgerConfig<claimgate::config::PgUrl> {
    let url = claimgate::config::PgUrl::parse(url).expect("a PostgreSQL URL");
    claimgate::config::LedgerConfig::with_defaults(url)
}

/// Which ledger backend a world's ledger lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// A SQLite file in the world's temp dir.
    Sqlite,
    /// A fresh database on the test process's private PostgreSQL cluster (`pg.rs`).
    Postgres,
}

/// One isolated world: its own redis-server, its own ledger (a file, or a database).
pub struct World {
    /// The private server (killed on drop).
    pub redis: LocalRedis,
    /// Holds the ledger file and anything else the test writes.
    pub dir: tempfile::TempDir,
    /// The `--db` value: the ledger file, or the PostgreSQL database's URL.
    pub db: PathBuf,
    /// Which backend `db` names.
    pub store: Store,
}

impl World {
    /// A world with a throwaway (non-persistent) Redis.
    pub fn new() -> World {
        Self::with(Options::default())
    }

    /// A world whose Redis persists with AOF (`appendfsync always`), for restart tests.
    pub fn persistent() -> World {
        Self::with(Options {
            appendonly: true,
            ..Options::default()
        })
    }

    /// A world with a throwaway Redis and its ledger in `store`.
    pub fn on(store: Store) -> World {
        Self::with_on(Options::default(), store)
    }

    /// A world whose Redis persists with AOF (`appendfsync always`) and whose ledger is in
    /// `store`: for Redis restart tests on either backend.
    pub fn persistent_on(store: Store) -> World {
        Self::with_on(
            Options {
                appendonly: true,
                ..Options::default()
            },
            store,
        )
    }

    /// A world with the given server options and its ledger in `store`.
    pub fn with_on(options: Options, store: Store) -> World {
        let mut w = Self::with(options);
        if store == Store::Postgres {
            w.db = PathBuf::from(crate::pg::fresh_database());
            w.store = Store::Postgres;
        }
        w
    }

    /// Another empty ledger of this world's backend, never opened yet: a second file in the
    /// world's directory, or a second fresh database.
    pub fn another_ledger(&self) -> PathBuf {
        match self.store {
            Store::Sqlite => self.dir.path().join("other.db"),
            Store::Postgres => PathBuf::from(crate::pg::fresh_database()),
        }
    }

    /// Creates the ledger (schema included, and its id) as `run` would, so a test can query it,
    /// or lock it, before any worker has started.
    pub fn create_ledger(&self) {
        let ledger = claimgate::ledger::open(&ledger_config(&self.db)).expect("create the ledger");
        ledger.ledger_id().expect("the ledger's id");
    }

    /// A read-write SQL connection to the ledger, whichever backend, for tests that edit it
    /// behind claimgate's back. The ledger must exist.
    pub fn sql(&self) -> Sql {
        match self.store {
            Store::Sqlite => {
                assert!(self.db.exists(), "no ledger at {}", self.db.display());
                let conn = rusqlite::Connection::open(&self.db).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                Sql::Sqlite(conn)
            }
            Store::Postgres => Sql::Postgres(self.pg_client()),
        }
    }

    /// The test's own plain connection to a PostgreSQL ledger: without the TLS parameters
    /// claimgate reads.
    fn pg_client(&self) -> postgres::Client {
        let url = self.db.to_str().expect("a URL").split('?').next().unwrap();
        postgres::Client::connect(url, postgres::NoTls).unwrap()
    }

    /// A text value from SQL on the ledger (NULL reads as the empty string).
    pub fn sql_text(&self, sql: &str) -> String {
        self.sql().text(sql)
    }

    /// The SQL expression for a key column (32 raw bytes) as lowercase hex, in this world's
    /// backend's dialect.
    pub fn hex_sql(&self, column: &str) -> String {
        match self.store {
            Store::Sqlite => format!("lower(hex({column}))"),
            Store::Postgres => format!("encode({column}, 'hex')"),
        }
    }

    /// The SQL expression turning an audit record's key column into raw key bytes: SQLite
    /// stores it as those bytes from format 6 on (hex text before), PostgreSQL from its format
    /// 6 on (every record: the upgrade rewrites them).
    pub fn audit_key_bytes_sql(&self, column: &str) -> String {
        match self.store {
            Store::Sqlite => {
                format!("CASE typeof({column}) WHEN 'blob' THEN {column} ELSE unhex({column}) END")
            }
            Store::Postgres => column.to_owned(),
        }
    }

    /// The SQL expression for an audit record's key column as its 64 lowercase hex digits.
    pub fn audit_key_hex_sql(&self, column: &str) -> String {
        match self.store {
            Store::Sqlite => format!(
                "CASE typeof({column}) WHEN 'blob' THEN lower(hex({column})) ELSE {column} END"
            ),
            Store::Postgres => format!("encode({column}, 'hex')"),
        }
    }

    /// A world whose ledger is the PostgreSQL database at `url` (a cluster the test started
    /// itself, to stop and restart it); Redis persists with AOF.
    pub fn on_postgres_url(url: &str) -> World {
        let mut w = Self::persistent();
        w.db = PathBuf::from(url);
        w.store = Store::Postgres;
        w
    }

    /// A world with the given server options.
    pub fn with(options: Options) -> World {
        let redis = LocalRedis::start(options).unwrap_or_else(|e| {
            panic!(
                "the test suite needs a real redis-server: {e}\n(install: {})",
                claimgate::support::localredis::INSTALL_HINT
            )
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("ledger.db");
        World {
            redis,
            dir,
            db,
            store: Store::Sqlite,
        }
    }

    /// The `claimgate` binary with this world's Redis and ledger in its environment: the one
    /// this crate built, or the one `CLAIMGATE_TEST_BIN` names (to see a test red on an older
    /// build: `CLAIMGATE_TEST_BIN=/tmp/claimgate-old cargo test …`).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let bin = std::env::var_os("CLAIMGATE_TEST_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_claimgate").into());
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("REDIS_URL", self.redis.url())
            .env("CLAIMGATE_DB", &self.db)
            // The box's own service settings, if the package is installed here, are not the
            // test's.
            .env("CLAIMGATE_ENV_FILE", "")
            .env_remove("CLAIMGATE_FAILPOINT")
            .env(
                "RUST_LOG",
                std::env::var("CLAIMGATE_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `claimgate ARGS` to completion (within [`DEADLINE`]) and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).run_with_deadline()
    }

    /// Runs `cmd` (a [`World::cmd`]) armed with failpoint `point`, and insists that it died
    /// there: by SIGABRT, with the failpoint's own line on stderr — not by an unrelated error
    /// at start-up that would make "nothing was written" pass by accident.
    pub fn crash_at(&self, mut cmd: Command, point: &str) -> Output {
        let out = cmd
            .env(claimgate::support::failpoint::ENV, point)
            .run_with_deadline();
        assert_crashed_at(&out, point.split(':').next().unwrap_or(point));
        out
    }

    /// Runs `claimgate ARGS` and insists on exit 0.
    pub fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "claimgate {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Starts `claimgate ARGS` in the background, its stdout and stderr going to a log file of
    /// its own in the world's directory (a pipe nobody reads would fill and stall it), killed
    /// when the handle is dropped (a failed assertion leaves no process behind).
    pub fn spawn(&self, args: &[&str]) -> Spawned {
        self.spawn_cmd(self.cmd(args))
    }

    /// Like [`World::spawn`], armed with failpoint `point`.
    pub fn spawn_armed(&self, args: &[&str], point: &str) -> Spawned {
        let mut cmd = self.cmd(args);
        cmd.env(claimgate::support::failpoint::ENV, point);
        self.spawn_cmd(cmd)
    }

    fn spawn_cmd(&self, mut cmd: Command) -> Spawned {
        let log = tempfile::Builder::new()
            .prefix("spawned-")
            .suffix(".log")
            .tempfile_in(self.dir.path())
            .expect("child log file")
            .into_temp_path()
            .keep()
            .expect("keep child log");
        let file = std::fs::File::create(&log).expect("child log file");
        let child = cmd
            .stdout(file.try_clone().expect("child log file"))
            .stderr(file)
            .spawn()
            .expect("spawn claimgate");
        Spawned { child, log }
    }

    /// Drains the stream with one worker that exits when idle.
    pub fn drain(&self, extra: &[&str]) -> Output {
        let mut args = Self::DRAIN.to_vec();
        args.extend_from_slice(extra);
        self.run_ok(&args)
    }

    /// [`World::drain`]'s command with `extra` flags, not yet run: for a test that sets its
    /// environment or expects it to fail.
    pub fn drain_cmd(&self, extra: &[&str]) -> Command {
        let mut args = Self::DRAIN.to_vec();
        args.extend_from_slice(extra);
        self.cmd(&args)
    }

    /// The worker run until the stream is drained.
    const DRAIN: [&'static str; 4] = ["run", "--exit-when-idle", "--claim-idle-ms", "200"];

    /// A Redis connection.
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.redis.url()).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn
    }

    /// XADDs each payload to `grants:submissions`; returns the entry ids.
    pub fn add(&self, payloads: &[String]) -> Vec<String> {
        let mut conn = self.conn();
        payloads
            .iter()
            .map(|p| {
                redis::cmd("XADD")
                    .arg("grants:submissions")
                    .arg("*")
                    .arg("payload")
                    .arg(p.as_bytes())
                    .query(&mut conn)
                    .unwrap()
            })
            .collect()
    }

    /// XADDs each payload to `grants:submissions` in one MULTI, so a reader sees them all at
    /// once or not at all: one read takes them together (added one by one on a loaded box they
    /// can trickle into more reads than a stalled worker's bounded stages hold).
    pub fn add_atomically<P: AsRef<[u8]>>(&self, payloads: &[P]) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for p in payloads {
            pipe.cmd("XADD")
                .arg("grants:submissions")
                .arg("*")
                .arg("payload")
                .arg(p.as_ref())
                .ignore();
        }
        pipe.query::<()>(&mut self.conn()).unwrap();
    }

    /// XADDs raw field/value pairs (for malformed entries).
    pub fn add_fields(&self, fields: &[(&str, &[u8])]) -> String {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("grants:submissions").arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        cmd.query(&mut self.conn()).unwrap()
    }

    /// An integer from SQL on the ledger (opened read-only, separately from any worker). A
    /// missing ledger (file, database schema) or table fails the test: "nothing was written"
    /// must never pass because the worker died before it made the ledger.
    /// [`World::sql_i64_once_made`] is for polling a ledger a starting worker is still making.
    /// On PostgreSQL the query is wrapped as `SELECT (sql)::int8`, so a SUM (NUMERIC there)
    /// reads as an integer too.
    pub fn sql_i64(&self, sql: &str) -> i64 {
        self.query_i64(sql, false)
    }

    /// Like [`World::sql_i64`], but 0 while the ledger or its tables do not exist yet: for
    /// waiting on a worker that is starting.
    pub fn sql_i64_once_made(&self, sql: &str) -> i64 {
        self.query_i64(sql, true)
    }

    fn query_i64(&self, sql: &str, zero_until_made: bool) -> i64 {
        if self.store == Store::Postgres {
            let mut client = self.pg_client();
            return match client.query_one(&format!("SELECT ({sql})::int8"), &[]) {
                Ok(row) => row.get::<_, Option<i64>>(0).unwrap_or(0),
                // The worker creates the schema when it starts: nothing recorded yet.
                Err(e)
                    if zero_until_made
                        && e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) =>
                {
                    0
                }
                Err(e) => panic!(
                    "{sql}: {e}{}",
                    e.as_db_error()
                        .map(|d| format!(" ({}: {})", d.code().code(), d.message()))
                        .unwrap_or_default()
                ),
            };
        }
        if !self.db.exists() {
            assert!(
                zero_until_made,
                "{sql}: the ledger {} does not exist (did the worker start?)",
                self.db.display()
            );
            return 0;
        }
        let conn = rusqlite::Connection::open_with_flags(
            &self.db,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        match conn
            .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
            .optional()
        {
            Ok(v) => v.flatten().unwrap_or(0),
            // The worker creates the schema moments after the file: nothing recorded yet.
            Err(e) if zero_until_made && e.to_string().contains("no such table") => 0,
            Err(e) => panic!("{sql} on {}: {e}", self.db.display()),
        }
    }

    /// Rows in a ledger table (the ledger and the table must exist).
    pub fn count(&self, table: &str) -> i64 {
        self.sql_i64(&format!("SELECT COUNT(*) FROM {table}"))
    }

    /// Rows in a ledger table, 0 while a starting worker has not made it yet (for polling).
    pub fn count_once_made(&self, table: &str) -> i64 {
        self.sql_i64_once_made(&format!("SELECT COUNT(*) FROM {table}"))
    }

    /// Entries pending in the group, over all consumers. A reply of any other shape than
    /// XPENDING's summary fails the test (it must never read as "nothing pending").
    pub fn pending(&self) -> u64 {
        let reply: redis::Value = match redis::cmd("XPENDING")
            .arg("grants:submissions")
            .arg("grant-workers")
            .query(&mut self.conn())
        {
            Ok(v) => v,
            // No group yet (the worker has not started): nothing can be pending.
            Err(e) if e.code() == Some("NOGROUP") => return 0,
            Err(e) => panic!("XPENDING: {e}"),
        };
        match &reply {
            redis::Value::Array(v) if v.len() == 4 => match v[0] {
                redis::Value::Int(n) if n >= 0 => n as u64,
                _ => panic!("XPENDING summary of an unexpected shape: {reply:?}"),
            },
            _ => panic!("XPENDING summary of an unexpected shape: {reply:?}"),
        }
    }

    /// Length of a stream.
    pub fn xlen(&self, stream: &str) -> u64 {
        redis::cmd("XLEN")
            .arg(stream)
            .query(&mut self.conn())
            .unwrap()
    }

    /// `status --json`, parsed.
    pub fn status_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.run_ok(&["status", "--json"]).stdout).unwrap()
    }

    /// The events stream's (`grants:events`) entries as field maps, in stream order.
    pub fn events(&self) -> Vec<std::collections::HashMap<String, String>> {
        self.entries("grants:events")
    }

    /// The dead-letter stream's entries as field maps.
    pub fn dead_letters(&self) -> Vec<std::collections::HashMap<String, Vec<u8>>> {
        self.entries("grants:submissions:dead")
    }

    /// Every entry of `stream` as a field map, in stream order.
    fn entries<V: redis::FromRedisValue>(
        &self,
        stream: &str,
    ) -> Vec<std::collections::HashMap<String, V>> {
        let reply: Vec<(String, Vec<(String, V)>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query(&mut self.conn())
            .unwrap();
        reply
            .into_iter()
            .map(|(_, f)| f.into_iter().collect())
            .collect()
    }
}

/// A read-write connection to a ledger of either backend ([`World::sql`]). Statements are
/// written in the SQL both dialects share, or chosen per [`Store`] by the test. Every failure
/// fails the test unless asked for with [`Sql::try_exec`].
pub enum Sql {
    /// The SQLite file, opened beside any worker.
    Sqlite(rusqlite::Connection),
    /// A plain session on the PostgreSQL database.
    Postgres(postgres::Client),
}

impl Sql {
    /// Runs statements (several, separated by `;`); any error fails the test.
    pub fn exec(&mut self, sql: &str) {
        if let Err(e) = self.try_exec(sql) {
            panic!("{sql}: {e}");
        }
    }

    /// Runs statements and returns the database's error message, if any.
    pub fn try_exec(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Sql::Sqlite(c) => c.execute_batch(sql).map_err(|e| e.to_string()),
            Sql::Postgres(c) => c.batch_execute(sql).map_err(|e| match e.as_db_error() {
                Some(db) => format!("{} ({})", db.message(), db.code().code()),
                None => e.to_string(),
            }),
        }
    }

    /// An integer from SQL (NULL reads as 0; on PostgreSQL the value is cast to int8).
    pub fn i64(&mut self, sql: &str) -> i64 {
        match self {
            Sql::Sqlite(c) => c
                .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .unwrap_or(0),
            Sql::Postgres(c) => c
                .query_one(&format!("SELECT ({sql})::int8"), &[])
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get::<_, Option<i64>>(0)
                .unwrap_or(0),
        }
    }

    /// A text value from SQL (NULL reads as the empty string).
    pub fn text(&mut self, sql: &str) -> String {
        match self {
            Sql::Sqlite(c) => c
                .query_row(sql, [], |r| r.get::<_, Option<String>>(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .unwrap_or_default(),
            Sql::Postgres(c) => c
                .query_one(sql, &[])
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get::<_, Option<String>>(0)
                .unwrap_or_default(),
        }
    }
}

/// A valid submission payload for award `A-{i}`, amount `100 + i` cents.
pub fn submission(i: usize) -> String {
    format!(
        r#"{{"award_id":"A-{i:06}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{},"program":"rural-broadband"}}"#,
        100 + i
    )
}

/// An audit digest (`prev_hash`, `hash`) of a SQLite row as hex: the 32 raw bytes format 5
/// stores, or the hex text an earlier format (or an attacker's re-seal) stored.
pub fn digest_at(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<String> {
    use rusqlite::types::ValueRef;
    match row.get_ref(i)? {
        ValueRef::Blob(b) => Ok(b.iter().map(|b| format!("{b:02x}")).collect()),
        _ => row.get(i),
    }
}

/// Parse limits for fixtures: any amount, payloads up to 1 MiB.
pub const LIMITS: &claimgate::domain::submission::Limits = &claimgate::domain::submission::Limits {
    payload_bytes_max: 1 << 20,
    amount_cents_max: i64::MAX,
};

/// [`submission`] `i`, parsed.
pub fn parsed(i: usize) -> claimgate::domain::submission::Submission {
    claimgate::domain::submission::parse_payload(submission(i).as_bytes(), LIMITS)
        .expect("a fixture submission parses")
}

/// The sum of amounts of submissions `0..n`.
pub fn amount_sum(n: usize) -> i64 {
    (0..n).map(|i| 100 + i as i64).sum()
}

/// Waits until `cond` holds or `timeout` passes; returns whether it held.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    cond()
}

/// How long any one `claimgate` command run to completion by a test may take before the test
/// kills it and fails, printing what it wrote: no test can hang on a child.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Running a command to completion, never longer than a deadline.
pub trait RunWithDeadline {
    /// Like `Command::output`, but the child is killed and the test fails (with its stdout
    /// and stderr so far) if it has not exited within [`DEADLINE`].
    fn run_with_deadline(&mut self) -> Output;
    /// The same with a deadline of the caller's choosing.
    fn run_within(&mut self, deadline: Duration) -> Output;
}

impl RunWithDeadline for Command {
    fn run_with_deadline(&mut self) -> Output {
        self.run_within(DEADLINE)
    }

    fn run_within(&mut self, deadline: Duration) -> Output {
        use std::io::Read;
        let mut child = self
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Both pipes are drained on threads of their own, so a chatty child never blocks.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let until = Instant::now() + deadline;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                let (out, err) = (out.join().unwrap(), err.join().unwrap());
                panic!(
                    "{:?} did not exit within {deadline:?}; killed it.\nstdout:\n{}\nstderr:\n{}",
                    self.get_args().collect::<Vec<_>>(),
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&err)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }
}

/// Asserts that a run died at failpoint `point`: killed by SIGABRT, and the failpoint's own
/// line on stderr.
pub fn assert_crashed_at(out: &Output, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "expected death at failpoint {point} by SIGABRT, got {}:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains(&format!("failpoint {point} fired")),
        "died by SIGABRT but not at failpoint {point}:\n{stderr}"
    );
}

/// A `claimgate` process started by [`World::spawn`]: its output in a log file, killed and
/// reaped on drop.
pub struct Spawned {
    /// The process.
    pub child: Child,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Spawned {
    /// What it has written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl std::ops::Deref for Spawned {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a signal to a child process.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned and have not yet reaped.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// Waits for a child to exit, killing it if it takes longer than `timeout`.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A claimgate process whose stderr (at INFO) is collected line by line while it runs; killed
/// on drop if the test ends early.
pub struct Logged {
    /// The process.
    pub child: Child,
    /// Every stderr line so far.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Logged {
    /// Spawns `cmd` (a [`World::cmd`]) logging at INFO, collecting its stderr.
    pub fn spawn(cmd: Command) -> Logged {
        Logged::spawn_logging(cmd, "info")
    }

    /// [`Logged::spawn`], logging what the `RUST_LOG` filter `filter` lets through.
    pub fn spawn_logging(mut cmd: Command, filter: &str) -> Logged {
        use std::io::BufRead;
        let mut child = cmd
            .env("RUST_LOG", filter)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn claimgate");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stderr, sink) = (
            child.stderr.take().expect("piped stderr"),
            std::sync::Arc::clone(&log),
        );
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().unwrap().push(line);
            }
        });
        Logged { child, log }
    }

    /// Lines of its log containing `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// Waits (up to a minute) until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str) {
        assert!(
            wait_for(Duration::from_secs(60), || !self
                .lines_with(needle)
                .is_empty()),
            "no log line with {needle:?}:\n{}",
            self.log_text()
        );
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM, then its exit status (within a minute).
    pub fn stop(mut self) -> std::process::ExitStatus {
        signal(&self.child, libc::SIGTERM);
        wait_exit(&mut self.child, Duration::from_secs(60))
    }

    /// Asserts one episode of `what`: exactly one WARN line when it started and one INFO line
    /// when it cleared, whatever the retries in between; returns the failures it counted.
    pub fn assert_one_episode(&self, what: &str) -> u32 {
        let failed = self.lines_with(&format!("{what} failed: "));
        assert_eq!(failed.len(), 1, "{what} failed:\n{}", self.log_text());
        assert!(failed[0].contains("WARN"), "{}", failed[0]);
        assert!(failed[0].ends_with("; retrying with backoff until it clears"));
        let recovered = self.lines_with(&format!("{what} recovered after "));
        assert_eq!(recovered.len(), 1, "{what} recovered:\n{}", self.log_text());
        assert!(recovered[0].contains("INFO"), "{}", recovered[0]);
        let tail = recovered[0].split(" recovered after ").nth(1).unwrap();
        let words: Vec<&str> = tail.split_whitespace().collect();
        assert_eq!(
            words[1..4],
            ["failed", "attempts", "over"],
            "{}",
            recovered[0]
        );
        assert!(words[4].ends_with('s'), "{}", recovered[0]);
        words[0].parse().expect("a count of failed attempts")
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Certificates for TLS tests, written into `dir`: `cert.pem` and `key.pem`, a self-signed
/// certificate for 127.0.0.1 and localhost, and `stranger.pem`, another certificate for
/// 127.0.0.1 (trusting it must not make the first acceptable).
pub struct Certificates {
    /// The server's certificate (also what a client trusts to accept it).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// A certificate of nobody the servers use.
    pub stranger: PathBuf,
}

impl Certificates {
    pub fn write_in(dir: &std::path::Path) -> Certificates {
        let server =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
                .unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let certs = Certificates {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            stranger: dir.join("stranger.pem"),
        };
        std::fs::write(&certs.cert, server.cert.pem()).unwrap();
        std::fs::write(&certs.key, server.signing_key.serialize_pem()).unwrap();
        std::fs::write(&certs.stranger, other.cert.pem()).unwrap();
        certs
    }
}

/// The `status --json` document of `out`, asserting its Redis part reports a certificate
/// the client refused.
pub fn status_refusing_the_certificate(out: &Output) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["redis"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("certificate"),
        "{doc}"
    );
    doc
}

/// Starts `cmd` (a worker) logged, with SIGXFSZ ignored, as a supervisor may start it: a write
/// over its file-size limit then fails (EFBIG, an I/O error to SQLite) instead of killing it.
pub fn spawn_ignoring_sigxfsz(mut cmd: Command) -> Logged {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) between fork and exec touches nothing but this process's dispositions.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    Logged::spawn(cmd)
}

/// Sets the file-size limit (RLIMIT_FSIZE) of a running process, as `prlimit --fsize` does.
pub fn set_file_size_limit(pid: u32, bytes: libc::rlim_t) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit(2) on a child we spawned and have not reaped, with a valid rlimit.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}
