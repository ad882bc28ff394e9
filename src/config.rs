//! Every limit and default in one place, named with units last.
//!
//! The command line (`cli`) fills these in; the library never reads flags or env vars itself.
//! Where the ledger is arrives parsed (`location`): a [`LedgerLocation`], never a string that
//! might be either a path or a URL.

mod location;

pub use location::{LedgerLocation, PgUrl};

use std::path::PathBuf;

/// Default Redis URL: the local server. `demo` never uses it unless told to.
pub const REDIS_URL_DEFAULT: &str = "redis://127.0.0.1:6379";
/// Default submissions stream key.
pub const STREAM_DEFAULT: &str = "grants:submissions";
/// Default consumer group.
pub const GROUP_DEFAULT: &str = "grant-workers";
/// Default events stream the relay publishes to.
pub const EVENTS_STREAM_DEFAULT: &str = "grants:events";
/// Default ledger file.
pub const DB_DEFAULT: &str = "./claimgate.db";
/// Largest payload accepted before parsing (1 MiB).
pub const PAYLOAD_BYTES_MAX_DEFAULT: usize = 1 << 20;
/// The smallest `--payload-bytes-max` accepted: a limit under a submission's own size (a few
/// hundred bytes) would dead-letter every entry and pay nothing.
pub const PAYLOAD_BYTES_MAX_MIN: u64 = 256;
/// The largest `--payload-bytes-max` accepted: Redis' own limit on one value (512 MiB).
pub const PAYLOAD_BYTES_MAX_MAX: u64 = 512 << 20;
/// Largest `amount_cents` one submission may carry: $1,000,000,000.00. No single federal
/// grant disbursement comes near it (the largest awards are paid out in many drawdowns), and
/// it leaves room for 92 million such amounts before an i64 sum could overflow; an amount
/// over it is a producer's bug or an attack, dead-lettered as `amount_too_large`.
pub const AMOUNT_CENTS_MAX_DEFAULT: i64 = 100_000_000_000;
/// Deliveries after which an entry is quarantined: tried alone, up to
/// [`QUARANTINE_TRIES_MAX`] times, then dead-lettered (docs/failure-handling.md).
pub const MAX_DELIVERIES_DEFAULT: u64 = 5;
/// Tries alone an entry past `--max-deliveries` gets before it is dead-lettered. A try alone
/// cannot tell a poison crash from a kill that came from outside (an operator, the OOM killer,
/// a supervisor's storm) during it, so one failed try is no evidence against the entry; the
/// evidence is the same failure on three separate occasions, spaced by
/// `--quarantine-spacing-ms` (below). Under crash storms aimed at whichever worker held the
/// entry, two tries taken back to back were both killed (issue 40).
pub const QUARANTINE_TRIES_MAX: u64 = 3;
/// Default of `--quarantine-spacing-ms`: the least time between the start of one try alone of
/// an entry and the start of the next is this, doubled after each try (`s`, `2s`, then `4s`
/// before the delivery that dead-letters it), on Redis's clock. With 30 s a valid entry is
/// dead-lettered only if tries alone failed at least 30 s and 90 s after the first (a storm
/// that outlasts that is no longer a storm), and a poison entry is dead-lettered 210 s after
/// its first try alone at the earliest, having crashed a worker `cap + 3` times in all.
pub const QUARANTINE_SPACING_MS_DEFAULT: u64 = 30_000;
/// Idle time after which another consumer's pending entry is taken over.
pub const CLAIM_IDLE_MS_DEFAULT: u64 = 30_000;
/// Entries asked for per read.
pub const BATCH_COUNT_MAX_DEFAULT: usize = 1024;
/// The most entry bytes the worker holds at once (4 MiB), by `broker::entry::Entry::weight`:
/// from the read that brings an entry in until its batch has been acknowledged and reported.
/// Reads are cut to what is left of it on the server (`broker/read.rs`), so it holds whatever
/// the entries weigh; docs/guide.md states the bound on the worker's memory it gives.
pub const READ_BYTES_MAX_DEFAULT: usize = 4 << 20;
/// What an entry may weigh besides its largest field before it is too large to read whole
/// (64 KiB): room for its id, its field names and small fields beside the payload. An entry is
/// read whole only if every field's value is at most `--payload-bytes-max` and all of it
/// together at most `--payload-bytes-max` plus this; anything larger is cut down on the server
/// to what its dead letter keeps.
pub const ENTRY_OVERHEAD_BYTES_MAX: usize = 64 << 10;
/// The most fields an entry read whole may have; one with more is cut down on the server. A
/// submission has one (`payload`).
pub const ENTRY_FIELDS_MAX: usize = 1_000;
/// How many of a cut entry's fields its dead letter shows (the first ones), each value whole up
/// to `DEAD_LETTER_PREFIX_BYTES` and otherwise as its size, SHA-1 and first bytes.
pub const CUT_FIELDS_SHOWN_MAX: usize = 32;
/// How much of a field name a cut entry's dead letter shows (256 bytes).
pub const CUT_NAME_BYTES_MAX: usize = 256;
/// The most entries one `XREADGROUP` (or `XAUTOCLAIM`) inside a read script asks for: the
/// script reads in steps of 1, 2, 4 … up to this, and stops at the budget, so Redis never
/// holds more than this many unread entries in the script's memory at once.
pub const READ_STEP_ENTRIES_MAX: usize = 32;
/// The longest the reader waits between two reads of an idle stream. A read script cannot
/// block (Redis refuses BLOCK inside a script), so an idle reader polls: at once after a read
/// that found entries, then after 1 ms, then every 2 ms (about 500 cheap script calls a second
/// while idle: the price of not blocking, measured in BENCHMARKS.md).
pub const READ_POLL_MS_MAX: u64 = 2;
/// Most payload bytes merged into one group-commit transaction (16 MiB), beside
/// [`COMMIT_ENTRIES_MAX`].
pub const COMMIT_BYTES_MAX: usize = 16 << 20;
/// The reader's response timeout (5.2 s): a read script that meets an entry of hundreds of
/// MiB spends a second or two hashing it, so the reader waits longer than other commands do.
pub const READ_RESPONSE_TIMEOUT_MS: u64 = 5_200;
/// Response timeout for non-blocking Redis commands.
pub const REDIS_RESPONSE_TIMEOUT_MS: u64 = 5_000;
/// Connect timeout for every Redis connection.
pub const REDIS_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// How long SQLite waits on another writer's lock before reporting busy.
pub const BUSY_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Ceiling of the first wait after a transient failure (`retry::backoff` draws 25–50 ms).
pub const BACKOFF_MS_MIN: u64 = 50;
/// Ceiling of every wait once the backoff has doubled up to it (draws 2.5–5 s).
pub const BACKOFF_MS_MAX: u64 = 5_000;
/// Failures granted to a worker step's episode once shutdown is asked for; past them the
/// entries are left pending (safe: they are redelivered) so the process can stop.
pub const SHUTDOWN_FAILURES_MAX: u32 = 3;
/// How long the worker waits out a failure of the ledger as a whole (a privilege revoked, a
/// read-only or damaged file, a missing schema) before it exits 1, leaving its entries
/// pending: long enough for a DBA's change of grants, short enough that a failure no one is
/// fixing reaches the supervisor and the operator (`--ledger-outage-ms-max`).
pub const LEDGER_OUTAGE_MS_MAX_DEFAULT: u64 = 300_000;
/// A transient ledger failure that has lasted this long makes `/healthz` unhealthy until it
/// clears (a lock held past the busy timeout, a server restarting); shorter ones (a
/// serialization failure retried once) do not flap it.
pub const LEDGER_TROUBLE_UNHEALTHY_MS: u64 = 1_000;
/// Most ids re-claimed by one heartbeat XCLAIM.
pub const HEARTBEAT_IDS_MAX: usize = 1_000;
/// Batches that may wait between pipeline stages; bounds memory whatever the backlog.
pub const CHANNEL_BATCHES_MAX: usize = 4;
/// Most entries written in one group-commit transaction.
pub const COMMIT_ENTRIES_MAX: usize = 4096;
/// Batches one worker has in a PostgreSQL ledger at once, each on a connection of its own
/// (ledger contract point 9): one reads and writes while the other commits or takes its
/// locks. Within the ledger pool's size (`LedgerConfig::pool_size_max`).
pub const PG_WRITERS_PER_WORKER: usize = 2;
/// SQLite's own default checkpoint threshold, kept for every process but the worker.
pub const WAL_AUTOCHECKPOINT_PAGES_DEFAULT: u32 = 1_000;
/// Page cache per ledger connection. Sized so the worker's peak RSS stays under 64 MiB while
/// draining a million entries (measured; see BENCHMARKS.md).
pub const CACHE_KIB_DEFAULT: u32 = 24 * 1024;
/// Default number of parse threads.
pub const THREADS_DEFAULT: usize = 2;

/// Where things are: shared by every subcommand.
#[derive(Debug, Clone)]
pub struct Config {
    /// Redis URL, possibly with credentials (never logged whole).
    pub redis_url: String,
    /// Where the ledger is (`--db`): a SQLite file, or a PostgreSQL URL whose password is
    /// never shown (see [`PgUrl`]).
    pub db: LedgerLocation,
    /// The submissions stream key.
    pub stream: String,
    /// The consumer group name.
    pub group: String,
    /// Which writes wait for a replica (`--redis-wait-replicas`, `--redis-wait-ms`).
    pub redis_wait: RedisWait,
}

/// `WAIT replicas ms` after the writes that should survive a Redis failover: dead-letter copies,
/// `produce`, and the relay's publish before it marks rows published. A WAIT that times out
/// short of `replicas` is an error (transient: the write is there, its copy is not confirmed),
/// never a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RedisWait {
    /// Replicas that must acknowledge; 0 waits for none (no WAIT is sent).
    pub replicas: u32,
    /// How long to wait for them, in milliseconds.
    pub timeout_ms: u64,
}

/// Longest `--redis-wait-ms`: WAIT blocks the connection, and a reply later than
/// [`REDIS_RESPONSE_TIMEOUT_MS`] would read as a dead connection.
pub const REDIS_WAIT_MS_MAX: u64 = REDIS_RESPONSE_TIMEOUT_MS - 1_000;

/// Longest `--by` of `dlq approve` / `dlq reject`, in characters: a name, not a document.
pub const REVIEW_BY_CHARS_MAX: usize = 128;

/// Longest `--reason` of `dlq approve` / `dlq reject`, in characters: it is hashed into the
/// audit trail and shown on one line.
pub const REVIEW_REASON_CHARS_MAX: usize = 1_000;

/// Held conflicts `status` names one by one (it counts them all).
pub const STATUS_HELD_SHOWN_MAX: usize = 5;

/// `--redis-wait-ms` when not given.
pub const REDIS_WAIT_MS_DEFAULT: u64 = 1_000;

impl RedisWait {
    /// The policy for `url` when `--redis-wait-replicas` is `replicas`: when not given, one
    /// replica behind a Sentinel URL (a failover is what the set-up is for) and none otherwise.
    pub fn for_url(url: &str, replicas: Option<u32>, timeout_ms: u64) -> Self {
        let sentinel =
            url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://");
        RedisWait {
            replicas: replicas.unwrap_or(u32::from(sentinel)),
            timeout_ms,
        }
    }
}

impl Config {
    /// The dead-letter stream: `<stream>:dead`.
    pub fn dead_stream(&self) -> String {
        format!("{}:dead", self.stream)
    }

    /// The quarantine marks: `<stream>:quarantine`, a hash of entry id → who tried it alone,
    /// when. An entry past `--max-deliveries` is marked as it is handed on for its one try alone;
    /// the mark is cleared once the entry is acknowledged, so a mark found on a later delivery
    /// means that try crashed or was refused, and the entry is dead-lettered.
    pub fn quarantine_key(&self) -> String {
        format!("{}:quarantine", self.stream)
    }
}

/// What to do with a resubmission that reuses an award's timestamp with a different payload
/// (`--on-conflict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnConflict {
    /// Pay it (it is a distinct submission by design) and leave a `conflict` audit record.
    #[default]
    Record,
    /// Dead-letter it for review instead of paying.
    Hold,
}

/// What the worker of `claimgate run` is told. The ledger's settings are in [`LedgerConfig`];
/// `--on-conflict` is the ledger's business too (`LedgerConfig::on_conflict`), since it
/// decides inside the transaction.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This consumer's name in the group.
    pub consumer: String,
    /// The ledger the worker writes to: the worker binds its consumer group to its id before
    /// the first read and refuses a group bound to another (`broker/binding.rs`).
    pub ledger: LedgerName,
    /// Parse-and-hash threads.
    pub threads: usize,
    /// Take over other consumers' entries idle at least this long.
    pub claim_idle_ms: u64,
    /// An entry delivered more than this many times is tried alone (at most
    /// [`QUARANTINE_TRIES_MAX`] times) and dead-lettered if no such try succeeds (see
    /// `Config::quarantine_key`).
    pub max_deliveries: u64,
    /// The least time between two tries alone of one entry, doubled after each
    /// ([`QUARANTINE_SPACING_MS_DEFAULT`]).
    pub quarantine_spacing_ms: u64,
    /// Exit once nothing is undelivered or pending.
    pub exit_when_idle: bool,
    /// Entries per read, at most.
    pub batch_count_max: usize,
    /// The most entry bytes held at once (`--read-bytes-max`); see [`READ_BYTES_MAX_DEFAULT`].
    pub read_bytes_max: usize,
    /// Largest payload accepted.
    pub payload_bytes_max: usize,
    /// Largest `amount_cents` accepted (`--amount-cents-max`); over it is malformed.
    pub amount_cents_max: i64,
    /// One transaction and one XACK per entry: the reference design's shape, for comparison.
    pub per_message: bool,
    /// `--fast-filter`: marker lifetime in seconds, or `None` when the filter is off.
    pub fast_filter_ttl_s: Option<u64>,
    /// How long a failure of the ledger as a whole (`Error::is_ledger_outage`: a privilege
    /// revoked, a read-only or damaged file, a missing schema) is waited out, unhealthy,
    /// before the worker exits 1 (`--ledger-outage-ms-max`).
    pub ledger_outage_ms_max: u64,
}

impl WorkerConfig {
    /// Defaults for a consumer named `consumer` writing to `ledger`.
    pub fn new(consumer: impl Into<String>, ledger: LedgerName) -> Self {
        WorkerConfig {
            consumer: consumer.into(),
            ledger,
            threads: THREADS_DEFAULT,
            claim_idle_ms: CLAIM_IDLE_MS_DEFAULT,
            max_deliveries: MAX_DELIVERIES_DEFAULT,
            quarantine_spacing_ms: QUARANTINE_SPACING_MS_DEFAULT,
            exit_when_idle: false,
            batch_count_max: BATCH_COUNT_MAX_DEFAULT,
            read_bytes_max: READ_BYTES_MAX_DEFAULT,
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            amount_cents_max: AMOUNT_CENTS_MAX_DEFAULT,
            per_message: false,
            fast_filter_ttl_s: None,
            ledger_outage_ms_max: LEDGER_OUTAGE_MS_MAX_DEFAULT,
        }
    }
}

/// Which ledger a worker writes to, as Redis and an operator know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerName {
    /// Its random identity (`Outbox::ledger_id`), made when first asked for and never changed.
    pub id: String,
    /// Where it is, for messages: a file path, or a URL without its password
    /// (`Inspect::describe`).
    pub shown: String,
}

/// Ledger settings: which ledger (`--db`) with the settings only its kind has, and what every
/// kind shares. `ledger::open` reads them.
///
/// `B` is the backend's part: [`LedgerBackend`] until the open step picks the backend, then
/// [`SqliteSettings`] (the SQLite ledger's `open`) or [`PgUrl`] (the PostgreSQL ledger's). A
/// setting only SQLite has is a field of [`SqliteSettings`], so a PostgreSQL ledger cannot be
/// handed one: the command line refuses such a flag with a URL before anything is opened.
#[derive(Debug, Clone)]
pub struct LedgerConfig<B = LedgerBackend> {
    /// Which ledger, with the settings only its kind has.
    pub backend: B,
    /// Whether to create the ledger when there is none yet. False for commands that only
    /// look at or change an existing ledger (`verify`, `audit`, `retention`, `backup`): for
    /// them a missing ledger is a configuration error naming it.
    pub create: bool,
    /// What `Ledger::record` does with a conflicting resubmission.
    pub on_conflict: OnConflict,
    /// How long a writer waits for another's lock (SQLite), or for a pooled connection (both).
    pub busy_timeout_ms: u64,
    /// Connections in the pool.
    pub pool_size_max: u32,
}

/// Which ledger, with the settings only its kind has.
#[derive(Debug, Clone)]
pub enum LedgerBackend {
    /// The embedded SQLite ledger.
    Sqlite(SqliteSettings),
    /// The shared PostgreSQL ledger: its own settings (`schema=`, `sslmode=`, `sslrootcert=`)
    /// are in its URL.
    Postgres(PgUrl),
}

/// The SQLite ledger's file and the settings only it has.
#[derive(Debug, Clone)]
pub struct SqliteSettings {
    /// The ledger file.
    pub path: PathBuf,
    /// For a long-running writer (`claimgate run`): keep the store's housekeeping off the commit
    /// path, on a thread of the ledger's own for as long as it is open. For SQLite that is WAL
    /// checkpoints: pooled connections run with `wal_autocheckpoint = 0` and a background
    /// checkpointer (`ledger::sqlite::Checkpointer`) copies pages back instead. Otherwise every
    /// connection keeps SQLite's own [`WAL_AUTOCHECKPOINT_PAGES_DEFAULT`].
    pub background_checkpoints: bool,
    /// `PRAGMA synchronous`: FULL unless an operator explicitly trades durability away.
    pub synchronous: Synchronous,
    /// `PRAGMA max_page_count` on every pooled connection: a hard cap on the ledger's size.
    /// Past it a commit fails as "database or disk is full", which the worker waits out like a
    /// full disk. `None` leaves SQLite's own limit.
    pub pages_max: Option<u64>,
    /// Page cache per connection, in KiB (`PRAGMA cache_size = -N`).
    pub cache_kib: u32,
}

impl SqliteSettings {
    /// Defaults for the ledger file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteSettings {
            path: path.into(),
            background_checkpoints: false,
            synchronous: Synchronous::Full,
            pages_max: None,
            cache_kib: CACHE_KIB_DEFAULT,
        }
    }
}

impl<B> LedgerConfig<B> {
    /// Defaults for the ledger `backend` names.
    pub fn with_defaults(backend: B) -> Self {
        LedgerConfig {
            backend,
            create: true,
            on_conflict: OnConflict::Record,
            busy_timeout_ms: BUSY_TIMEOUT_MS_DEFAULT,
            pool_size_max: 4,
        }
    }

    /// These shared settings, for the ledger `backend` names.
    pub fn with_backend<C>(&self, backend: C) -> LedgerConfig<C> {
        LedgerConfig {
            backend,
            create: self.create,
            on_conflict: self.on_conflict,
            busy_timeout_ms: self.busy_timeout_ms,
            pool_size_max: self.pool_size_max,
        }
    }
}

impl LedgerConfig {
    /// Defaults for the ledger at `location`.
    pub fn at(location: LedgerLocation) -> Self {
        LedgerConfig::with_defaults(match location {
            LedgerLocation::File(path) => LedgerBackend::Sqlite(SqliteSettings::new(path)),
            LedgerLocation::Postgres(url) => LedgerBackend::Postgres(url),
        })
    }
}

impl LedgerConfig<SqliteSettings> {
    /// Defaults for the SQLite ledger in the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LedgerConfig::with_defaults(SqliteSettings::new(path))
    }
}

impl From<LedgerConfig<SqliteSettings>> for LedgerConfig {
    /// The same settings, for `ledger::open`, which picks the backend again.
    fn from(cfg: LedgerConfig<SqliteSettings>) -> Self {
        cfg.with_backend(LedgerBackend::Sqlite(cfg.backend.clone()))
    }
}

impl From<LedgerConfig<PgUrl>> for LedgerConfig {
    /// The same settings, for `ledger::open`, which picks the backend again.
    fn from(cfg: LedgerConfig<PgUrl>) -> Self {
        cfg.with_backend(LedgerBackend::Postgres(cfg.backend.clone()))
    }
}

/// SQLite's `synchronous` levels that make sense for a ledger in WAL mode (`--synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Synchronous {
    /// fsync the WAL at every commit: a committed claim survives power loss.
    #[default]
    Full,
    /// fsync only at checkpoints: a power loss may roll back recent commits (never corrupts).
    Normal,
}

impl Synchronous {
    /// The pragma's value.
    pub fn as_sql(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}
