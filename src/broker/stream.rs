//! Everything claimgate says to Redis, and nothing else: this module never touches SQLite.
//!
//! Replies are parsed from raw [`redis::Value`]s rather than typed helpers because the shapes
//! that matter most are the unusual ones: a pending entry whose body was trimmed away comes
//! back as `[id, nil]`, and XAUTOCLAIM on Redis 7 adds a third element listing deleted ids.

use super::sentinel::{Primary, Sentinels};
use crate::config::{REDIS_CONNECT_TIMEOUT_MS, REDIS_RESPONSE_TIMEOUT_MS};
use crate::error::{Error, Result};
use crate::support::redact as url_secrets;
use redis::{Client, Connection, Value};
use std::time::Duration;

/// One stream entry as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The stream entry id, such as `1700000000000-0`.
    pub id: String,
    /// Field/value pairs in stream order (field names may repeat; values are raw bytes).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// How many times the group has delivered it, this delivery included.
    pub delivery_count: u64,
}

impl Entry {
    /// What the entry weighs: its id and every field name and value, in bytes.
    pub fn size_bytes(&self) -> usize {
        let fields: usize = self.fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.id.len() + fields
    }
}

/// What one read returned.
#[derive(Debug, Default)]
pub struct Read {
    /// Entries with bodies.
    pub entries: Vec<Entry>,
    /// Pending ids whose bodies are gone from the stream (trimmed or deleted).
    pub vanished: Vec<String>,
    /// The last id in the reply, body or not: where a history read continues.
    pub last_id: Option<String>,
}

/// What one XAUTOCLAIM call returned.
#[derive(Debug, Default)]
pub struct AutoClaimed {
    /// Where the next call continues; `0-0` once the whole PEL has been scanned.
    pub next_cursor: String,
    /// Entries now owned by this consumer.
    pub entries: Vec<Entry>,
    /// Ids that were pending but no longer exist; Redis 7 has already removed them from the PEL.
    pub deleted: Vec<String>,
}

/// Where a [`Conn`] connects: one Redis named by its URL, or whichever node the sentinels of a
/// `redis+sentinel://` URL name as the primary at the time (see `broker/sentinel.rs`). Cheap to
/// clone; clones share what they learnt about the primary.
#[derive(Debug, Clone)]
pub enum Target {
    /// A plain `redis://`, `rediss://` or unix-socket URL (boxed: a `Client` is large).
    Direct(Box<Client>),
    /// A `redis+sentinel://` or `rediss+sentinel://` URL.
    Sentinel(std::sync::Arc<Sentinels>),
}

impl Target {
    /// A new connection, with replies waited for at most `response_timeout`.
    fn connect(&self, response_timeout: Duration) -> Result<Connection> {
        let connect_timeout = Duration::from_millis(REDIS_CONNECT_TIMEOUT_MS);
        match self {
            Target::Direct(client) => {
                let conn = client.get_connection_with_timeout(connect_timeout)?;
                conn.set_read_timeout(Some(response_timeout))?;
                conn.set_write_timeout(Some(response_timeout))?;
                Ok(conn)
            }
            Target::Sentinel(sentinels) => sentinels.connect(connect_timeout, response_timeout),
        }
    }

    /// Through Sentinel: how many times a connection of this target (or of a clone) found a
    /// new primary after an earlier one, that is, failovers lived through; always 0 for a plain
    /// URL.
    pub fn primary_changes(&self) -> u64 {
        match self {
            Target::Direct(_) => 0,
            Target::Sentinel(sentinels) => sentinels.primary_changes(),
        }
    }

    /// Through Sentinel: the primary last connected to and the sentinel that named it.
    pub fn primary(&self) -> Option<Primary> {
        match self {
            Target::Direct(_) => None,
            Target::Sentinel(sentinels) => sentinels.last_primary(),
        }
    }
}

impl From<Client> for Target {
    fn from(client: Client) -> Self {
        Target::Direct(Box::new(client))
    }
}

/// Opens a client for `url` (every command's way to Redis, Sentinel URLs included), turning a
/// malformed URL into a configuration error that never echoes the URL's password.
pub fn client(url: &str) -> Result<Target> {
    if super::sentinel::is_sentinel_url(url) {
        let sentinels = Sentinels::parse(url)
            .map_err(|why| Error::Config(format!("bad --redis-url {}: {why}", redact(url))))?;
        return Ok(Target::Sentinel(std::sync::Arc::new(sentinels)));
    }
    Client::open(url)
        .map(Target::from)
        .map_err(|e| Error::Config(format!("bad --redis-url {}: {e}", redact(url))))
}

/// A Redis URL with every secret replaced by `***`, safe to log or print.
///
/// Covers every form redis-rs accepts (`redis`, `rediss`, `valkey`, `valkeys` with
/// `user:password@` in the authority; `unix`, `redis+unix`, `valkey+unix` with `?user=…&pass=…`)
/// and `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER`. A URL that redis-rs parses
/// is rebuilt from the same parse redis-rs makes (so percent-encoding and `+` cannot hide a
/// `pass` from us): the password becomes `***`, query values other than `db`, `protocol` and
/// `user` are hidden, and so is a fragment other than `#insecure`. Anything else is cut by hand,
/// and when the cut is ambiguous (an `@` that may sit inside a query or path, a password holding
/// an unencoded `/`, `?` or `#`) everything after the scheme is hidden: an unreadable URL in a
/// log is better than a readable password.
pub fn redact(url: &str) -> String {
    redact_parsed(url).unwrap_or_else(|| url_secrets::by_hand(url, &URL_QUERY_SHOWN))
}

/// Query parameters shown with their values: none of them is a secret.
const URL_QUERY_SHOWN: [&str; 3] = ["db", "protocol", "user"];

/// [`redact`] for a URL redis-rs itself parses; `None` for anything else (including a parse in
/// which an `@` lands after the authority, where the password's own characters may have been
/// read as a host, a port or a path).
fn redact_parsed(url: &str) -> Option<String> {
    let parsed = redis::parse_redis_url(url)?;
    let unix = parsed.scheme().ends_with("unix");
    let after_authority = [
        parsed.path(),
        parsed.query().unwrap_or(""),
        parsed.fragment().unwrap_or(""),
    ];
    if !unix && after_authority.iter().any(|part| part.contains('@')) {
        return None;
    }
    let userinfo = match (parsed.username(), parsed.password()) {
        ("", None) => String::new(),
        (user, Some(_)) => format!("{user}:***@"),
        // A lone userinfo is a user name to redis-rs, but people put passwords there too.
        (_, None) => "***@".to_owned(),
    };
    let host = parsed.host_str().unwrap_or("");
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = parsed
        .query()
        .map(|_| {
            format!(
                "?{}",
                url_secrets::query(parsed.query_pairs(), &URL_QUERY_SHOWN)
            )
        })
        .unwrap_or_default();
    let fragment = match parsed.fragment() {
        None => "",
        Some("insecure") => "#insecure",
        Some(_) => "#***",
    };
    Some(format!(
        "{}://{userinfo}{host}{port}{}{query}{fragment}",
        parsed.scheme(),
        parsed.path()
    ))
}

/// A connection that reconnects lazily after a failure.
pub struct Conn {
    /// Where to reconnect to.
    client: Target,
    /// The live connection, if any.
    conn: Option<Connection>,
    /// Response timeout: for a blocking reader, longer than its BLOCK.
    response_timeout: Duration,
}

impl Conn {
    /// A connection for ordinary commands.
    pub fn new(client: impl Into<Target>) -> Self {
        Self::with_timeout(client, Duration::from_millis(REDIS_RESPONSE_TIMEOUT_MS))
    }

    /// A connection whose replies may take up to `response_timeout` (for blocking reads).
    pub fn with_timeout(client: impl Into<Target>, response_timeout: Duration) -> Self {
        Conn {
            client: client.into(),
            conn: None,
            response_timeout,
        }
    }

    /// The connection, opened if needed.
    pub fn get(&mut self) -> Result<&mut Connection> {
        if self.conn.is_none() {
            self.conn = Some(self.client.connect(self.response_timeout)?);
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    /// Waits until `wait.replicas` replicas have every write this connection made (WAIT); an
    /// error, transient, when fewer confirm within `wait.timeout_ms`. No-op for 0 replicas.
    /// A write re-sent on a new connection must be re-sent before this is called again: WAIT
    /// covers only what the connection it is sent on wrote.
    pub fn wait_replicated(&mut self, wait: crate::config::RedisWait) -> Result<()> {
        if wait.replicas == 0 {
            return Ok(());
        }
        let acked: i64 = self.query(redis::cmd("WAIT").arg(wait.replicas).arg(wait.timeout_ms))?;
        if acked < i64::from(wait.replicas) {
            return Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "WAIT: {acked} of {} replicas confirmed the write within {} ms",
                    wait.replicas, wait.timeout_ms
                ),
            ))));
        }
        Ok(())
    }

    /// Through Sentinel: which primary this connection talks to, through which sentinel, and
    /// its replicas' lag; `None` for a plain URL.
    pub fn sentinel_view(&mut self) -> Result<Option<super::sentinel::View>> {
        let Target::Sentinel(sentinels) = self.client.clone() else {
            return Ok(None);
        };
        super::sentinel::view(&sentinels, self.get()?)
    }

    /// Drops the connection so the next call reconnects; used after any transient error. Through
    /// Sentinel the reconnect asks the sentinels again, which is how a promotion is followed
    /// (a `READONLY` reply from a demoted primary is transient too).
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// Runs a command, dropping the connection if it failed in a way that may have broken it.
    pub fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T> {
        let result = cmd.query(self.get()?);
        if let Err(e) = &result {
            if crate::error::redis_is_transient(e) {
                self.reset();
            }
        }
        Ok(result?)
    }

    /// Runs a script, with the same reconnect rule as [`Conn::query`].
    pub fn invoke<T: redis::FromRedisValue>(
        &mut self,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<T> {
        let result = script.invoke(self.get()?);
        if let Err(e) = &result {
            if crate::error::redis_is_transient(e) {
                self.reset();
            }
        }
        Ok(result?)
    }
}

/// `e`, naming `key` when Redis answered WRONGTYPE: a string or hash written under the stream's
/// (or dead-letter stream's) name by another client is not an outage, and the operator must
/// learn which key to look at. Anything else comes back unchanged.
pub fn naming_key(e: Error, key: &str) -> Error {
    match &e {
        Error::Redis(r) if r.code() == Some("WRONGTYPE") => Error::Other(format!(
            "the Redis key {key} is not a stream (something else was written under that \
             name); rename or delete it, or point claimgate at another stream"
        )),
        _ => e,
    }
}

/// Creates the consumer group at the start of the stream (id 0, MKSTREAM) if it is absent, so
/// entries queued before the first start are processed. Returns true if it was created.
pub fn ensure_group(conn: &mut Conn, stream: &str, group: &str) -> Result<bool> {
    let mut cmd = redis::cmd("XGROUP");
    cmd.arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM");
    match conn.query::<Value>(&cmd) {
        Ok(_) => Ok(true),
        Err(Error::Redis(e)) if e.code() == Some("BUSYGROUP") => Ok(false),
        Err(e) => Err(naming_key(e, stream)),
    }
}

/// XREADGROUP from `id` (`>` for new entries, an id to re-read this consumer's pending ones).
/// Delivery counts are 1 for new entries; callers re-reading history fill them in from XPENDING.
pub fn read_group(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    id: &str,
    count: usize,
    block_ms: Option<u64>,
) -> Result<Read> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    cmd.arg("STREAMS").arg(stream).arg(id);
    let reply: Value = conn.query(&cmd)?;
    let mut read = Read::default();
    let streams = match reply {
        Value::Nil => return Ok(read),
        other => array(other)?,
    };
    for stream_reply in streams {
        let mut parts = array(stream_reply)?.into_iter();
        let _name = parts.next();
        let entries = parts.next().map(array).transpose()?.unwrap_or_default();
        read.last_id = split_entries(entries, &mut read.entries, &mut read.vanished)?;
    }
    Ok(read)
}

/// XAUTOCLAIM entries idle at least `min_idle_ms` from any consumer, starting at `cursor`.
pub fn autoclaim(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    min_idle_ms: u64,
    cursor: &str,
    count: usize,
) -> Result<AutoClaimed> {
    let mut cmd = redis::cmd("XAUTOCLAIM");
    cmd.arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(min_idle_ms)
        .arg(cursor)
        .arg("COUNT")
        .arg(count);
    let mut parts = array(conn.query::<Value>(&cmd)?)?.into_iter();
    let next_cursor = string(parts.next().unwrap_or(Value::Nil))?;
    let entries = parts.next().map(array).transpose()?.unwrap_or_default();
    let mut out = AutoClaimed {
        next_cursor,
        ..AutoClaimed::default()
    };
    // Before Redis 7 there is no third element and deleted entries show up as nil bodies.
    split_entries(entries, &mut out.entries, &mut out.deleted)?;
    if let Some(deleted) = parts.next() {
        for id in array(deleted)? {
            out.deleted.push(string(id)?);
        }
    }
    Ok(out)
}

/// Fills in each entry's delivery count from XPENDING, one pipelined round trip for the lot.
/// Only entries re-read from history or claimed need this; new entries are on delivery 1.
pub fn fill_delivery_counts(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    entries: &mut [Entry],
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for e in entries.iter() {
        pipe.cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg(&e.id)
            .arg(&e.id)
            .arg(1)
            .arg(consumer);
    }
    let replies: Vec<Value> = {
        let result = pipe.query(conn.get()?);
        if matches!(&result, Err(e) if crate::error::redis_is_transient(e)) {
            conn.reset();
        }
        result?
    };
    for (e, reply) in entries.iter_mut().zip(replies) {
        let row = array(reply)?.into_iter().next();
        let deliveries = match row {
            Some(row) => int(array(row)?.into_iter().nth(3).unwrap_or(Value::Nil))?,
            None => 1,
        };
        e.delivery_count = deliveries.max(1) as u64;
    }
    Ok(())
}

/// This consumer's pending ids after `after` (exclusive; from the start when `None`), at most
/// `count`, each with its delivery count. XPENDING counts no delivery, unlike re-reading the
/// history with XREADGROUP, which counts one for every entry it returns.
pub fn pending_ids(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    after: Option<&str>,
    count: usize,
) -> Result<Vec<(String, u64)>> {
    let start = after.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
    let mut cmd = redis::cmd("XPENDING");
    cmd.arg(stream)
        .arg(group)
        .arg(start)
        .arg("+")
        .arg(count)
        .arg(consumer);
    let mut ids = Vec::new();
    for row in array(conn.query::<Value>(&cmd)?)? {
        let mut fields = array(row)?.into_iter();
        let id = string(fields.next().unwrap_or(Value::Nil))?;
        let deliveries = int(fields.nth(2).unwrap_or(Value::Nil))?;
        ids.push((id, deliveries.max(1) as u64));
    }
    Ok(ids)
}

/// The entries with these ids and delivery counts, read with XRANGE (one pipelined round trip),
/// which neither counts a delivery nor changes who owns them. Ids whose bodies are gone from the
/// stream come back apart, as vanished.
pub fn entries_by_id(conn: &mut Conn, stream: &str, ids: &[(String, u64)]) -> Result<Read> {
    let mut read = Read::default();
    if ids.is_empty() {
        return Ok(read);
    }
    let mut pipe = redis::pipe();
    for (id, _) in ids {
        pipe.cmd("XRANGE").arg(stream).arg(id).arg(id);
    }
    let replies: Vec<Value> = {
        let result = pipe.query(conn.get()?);
        if matches!(&result, Err(e) if crate::error::redis_is_transient(e)) {
            conn.reset();
        }
        result?
    };
    for ((id, deliveries), reply) in ids.iter().zip(replies) {
        let mut found = Vec::new();
        split_entries(array(reply)?, &mut found, &mut read.vanished)?;
        match found.pop() {
            Some(mut entry) => {
                entry.delivery_count = *deliveries;
                read.entries.push(entry);
            }
            None => read.vanished.push(id.clone()),
        }
        read.last_id = Some(id.clone());
    }
    Ok(read)
}

/// True when a read was cut short rather than failed, so the right answer is to read again at
/// once, without backoff and without calling it an outage: a blocking read interrupted by a
/// signal (EINTR: after SIGSTOP/SIGCONT a socket read with a timeout is never restarted), or a
/// blocking XREADGROUP released because its stream key was deleted (`UNBLOCKED`; the next read
/// finds out what is there now). A reply lost to EINTR may have moved entries into the
/// consumer's pending list; the caller recovers them.
pub fn read_cut_short(e: &Error) -> bool {
    let Error::Redis(e) = e else {
        return false;
    };
    e.code() == Some("UNBLOCKED") || io_error_kind(e) == Some(std::io::ErrorKind::Interrupted)
}

/// The kind of the I/O error inside a Redis error, if it is one. redis-rs keeps the
/// `io::Error` behind an `Arc` and offers no accessor for its kind.
fn io_error_kind(e: &redis::RedisError) -> Option<std::io::ErrorKind> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let source = std::error::Error::source(e)?;
    let io = match source.downcast_ref::<std::io::Error>() {
        Some(io) => io,
        None => source.downcast_ref::<Shared>()?.downcast_ref()?,
    };
    Some(io.kind())
}

/// Re-claims pending `ids` for `consumer` without counting a delivery (XCLAIM ... JUSTID), which
/// resets their idle time: other consumers' XAUTOCLAIM then leaves alone entries this consumer
/// is still working on. Ids no longer pending are ignored by Redis.
pub fn touch(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    ids: &[String],
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut cmd = redis::cmd("XCLAIM");
    cmd.arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(0)
        .arg(ids)
        .arg("JUSTID");
    conn.query::<Value>(&cmd).map(|_| ())
}

/// What [`mark_quarantined`] decided for one entry past the delivery cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryAlone {
    /// Try number `n` is counted in the mark: hand the entry on alone now.
    Now(u64),
    /// `n` tries were counted, the last too recently: ask again in this many milliseconds.
    Later(u64, u64),
}

/// Counts one more try alone for entry `id` in the hash `key`, unless the last one began less
/// than `spacing_ms · 2^(tries - 1)` ago on Redis's clock. The value is `try <n> by <note> ms
/// <redis ms>` (`note` says who and when), read and written in one Lua script so two workers
/// never both take the same try number. A mark written before tries were counted (just
/// `<note>`) counts as one try, and one written before tries were timed as one long ago.
pub fn mark_quarantined(
    conn: &mut Conn,
    key: &str,
    id: &str,
    note: &str,
    spacing_ms: u64,
) -> Result<TryAlone> {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        redis::Script::new(
            r"
            local old = redis.call('HGET', KEYS[1], ARGV[1])
            local clock = redis.call('TIME')
            local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
            local tries, last = 0, 0
            if old then
              tries = tonumber(string.match(old, '^try (%d+) by ')) or 1
              last = tonumber(string.match(old, ' ms (%d+)$')) or 0
            end
            if tries > 0 then
              local due = last + tonumber(ARGV[3]) * 2 ^ (tries - 1)
              if now < due then return {tries, math.ceil(due - now)} end
            end
            tries = tries + 1
            redis.call('HSET', KEYS[1], ARGV[1], 'try ' .. tries .. ' by ' .. ARGV[2] .. ' ms ' .. now)
            return {tries, 0}
            ",
        )
    });
    let mut inv = script.prepare_invoke();
    inv.key(key).arg(id).arg(note).arg(spacing_ms);
    let (tries, wait_ms): (i64, i64) = conn.invoke(&inv)?;
    let tries = tries.max(0) as u64;
    Ok(if wait_ms > 0 {
        TryAlone::Later(tries, wait_ms as u64)
    } else {
        TryAlone::Now(tries)
    })
}

/// Removes the marks of `ids` from the hash `key`; ids without one are ignored.
pub fn unmark_quarantined(conn: &mut Conn, key: &str, ids: &[&str]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut cmd = redis::cmd("HDEL");
    cmd.arg(key).arg(ids);
    conn.query::<i64>(&cmd).map(|_| ())
}

/// XACK a set of ids. Returns how many were pending.
pub fn ack(conn: &mut Conn, stream: &str, group: &str, ids: &[&str]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut cmd = redis::cmd("XACK");
    cmd.arg(stream).arg(group).arg(ids);
    conn.query(&cmd)
}

/// Entries pending in the group (delivered, not acknowledged), over all consumers.
pub fn pending_count(conn: &mut Conn, stream: &str, group: &str) -> Result<u64> {
    let mut cmd = redis::cmd("XPENDING");
    cmd.arg(stream).arg(group);
    let summary = array(conn.query::<Value>(&cmd)?)?;
    int(summary.into_iter().next().unwrap_or(Value::Nil)).map(|n| n.max(0) as u64)
}

/// Prefix of every original field in a dead-letter entry, so the originals can never collide
/// with the fields claimgate adds (see [`DeadLetterCopy`]).
pub const ORIGINAL_FIELD_PREFIX: &str = "original.";

/// Most original fields copied into a dead letter: Lua's `unpack` has a hard stack limit, and an
/// entry with thousands of fields is itself the problem. The entry stays in the source stream.
pub const DEAD_LETTER_FIELDS_MAX: usize = 1_000;

/// Prefix of the fields that summarise an original field too large to copy (see
/// [`DeadLetterCopy`]). An oversize payload copied whole would double what it costs Redis; the
/// summary is what an operator needs to find the original and have it re-sent fixed.
pub const TRUNCATED_FIELD_PREFIX: &str = "truncated.";

/// How much of an oversize original field a dead letter keeps, from its start (4 KiB): enough
/// to see what it is and whose.
pub const DEAD_LETTER_PREFIX_BYTES: usize = 4 * 1024;

/// An entry on its way to the dead-letter stream, with what claimgate says about it.
///
/// The dead-letter entry's fields are, in this order: `original_id` (the entry's id), `reason`,
/// `reason_code`, `deliveries` (the entry's delivery count), `consumer`, `source_stream`,
/// `dead_lettered_at`, then each original field with its name prefixed by
/// [`ORIGINAL_FIELD_PREFIX`] (at most [`DEAD_LETTER_FIELDS_MAX`] of them, followed by
/// `original_fields_omitted` with the count left out, if any). An original field whose value is
/// longer than `field_bytes_max` is not copied: in its place come `<name>.bytes` (its length),
/// `<name>.sha256` (hex digest of the whole value) and `<name>.prefix` (its first
/// [`DEAD_LETTER_PREFIX_BYTES`]), each name prefixed by [`TRUNCATED_FIELD_PREFIX`], and the
/// entry ends with `original_fields_truncated` (how many fields were summarised), which makes
/// `dlq replay` refuse it. A value no longer than [`DEAD_LETTER_PREFIX_BYTES`] is always copied.
/// `claimgate dlq` reads them back.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterCopy<'a> {
    /// The entry as delivered: its id, fields and delivery count are copied.
    pub original: &'a Entry,
    /// Why, in words.
    pub reason: &'a str,
    /// A short machine-readable class, such as `not_json`.
    pub reason_code: &'a str,
    /// The consumer that dead-lettered it.
    pub consumer: &'a str,
    /// The stream it was read from.
    pub source_stream: &'a str,
    /// When it was dead-lettered (RFC 3339).
    pub dead_lettered_at: &'a str,
    /// Original fields longer than this (and than [`DEAD_LETTER_PREFIX_BYTES`]) are summarised
    /// (length, SHA-256, first [`DEAD_LETTER_PREFIX_BYTES`]) instead of copied.
    pub field_bytes_max: usize,
}

/// Copies an entry to the dead-letter stream exactly once per original id.
///
/// An index hash `<dead stream>:index` maps original id → dead-letter id, checked and written
/// in the same Lua script as the XADD, so a redelivery after a crash finds the first copy
/// instead of adding a second. Returns the dead-letter entry id.
pub fn copy_to_dead_letters(
    conn: &mut Conn,
    dead_stream: &str,
    copy: &DeadLetterCopy<'_>,
) -> Result<String> {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        redis::Script::new(
            r"
            local existing = redis.call('HGET', KEYS[2], ARGV[1])
            if existing then return existing end
            local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
            redis.call('HSET', KEYS[2], ARGV[1], id)
            return id
            ",
        )
    });
    let entry = copy.original;
    let mut inv = script.prepare_invoke();
    inv.key(dead_stream)
        .key(dead_index_key(dead_stream))
        .arg(&entry.id);
    inv.arg("original_id").arg(&entry.id);
    inv.arg("reason").arg(copy.reason);
    inv.arg("reason_code").arg(copy.reason_code);
    inv.arg("deliveries").arg(entry.delivery_count);
    inv.arg("consumer").arg(copy.consumer);
    inv.arg("source_stream").arg(copy.source_stream);
    inv.arg("dead_lettered_at").arg(copy.dead_lettered_at);
    let mut truncated = 0usize;
    for (name, value) in entry.fields.iter().take(DEAD_LETTER_FIELDS_MAX) {
        // A value no longer than the prefix is kept whole whatever the limit: its summary would
        // hold all of it anyway, and the dead letter stays replayable.
        if value.len() > copy.field_bytes_max.max(DEAD_LETTER_PREFIX_BYTES) {
            truncated += 1;
            for (suffix, summary) in summary_of(value) {
                let name = [TRUNCATED_FIELD_PREFIX.as_bytes(), name, suffix.as_bytes()].concat();
                inv.arg(name).arg(summary);
            }
            continue;
        }
        let mut prefixed = ORIGINAL_FIELD_PREFIX.as_bytes().to_vec();
        prefixed.extend_from_slice(name);
        inv.arg(prefixed).arg(value.as_slice());
    }
    if entry.fields.len() > DEAD_LETTER_FIELDS_MAX {
        inv.arg("original_fields_omitted")
            .arg(entry.fields.len() - DEAD_LETTER_FIELDS_MAX);
    }
    if truncated > 0 {
        inv.arg("original_fields_truncated").arg(truncated);
    }
    conn.invoke(&inv)
}

/// What a dead letter keeps of a field too large to copy: `.bytes`, `.sha256`, `.prefix`.
fn summary_of(value: &[u8]) -> [(&'static str, Vec<u8>); 3] {
    use sha2::{Digest, Sha256};
    let digest = crate::domain::key::to_hex(&Sha256::digest(value));
    let prefix = &value[..value.len().min(DEAD_LETTER_PREFIX_BYTES)];
    [
        (".bytes", value.len().to_string().into_bytes()),
        (".sha256", digest.into_bytes()),
        (".prefix", prefix.to_vec()),
    ]
}

/// The hash that records which original ids were dead-lettered, and where.
pub fn dead_index_key(dead_stream: &str) -> String {
    format!("{dead_stream}:index")
}

/// Splits raw `[id, fields]` pairs into entries and ids whose bodies are gone; returns the
/// last id seen.
fn split_entries(
    raw: Vec<Value>,
    entries: &mut Vec<Entry>,
    vanished: &mut Vec<String>,
) -> Result<Option<String>> {
    let mut last = None;
    for item in raw {
        let mut parts = array(item)?.into_iter();
        let id = string(parts.next().unwrap_or(Value::Nil))?;
        last = Some(id.clone());
        match parts.next() {
            None | Some(Value::Nil) => vanished.push(id),
            Some(body) => entries.push(Entry {
                id,
                fields: pairs(body)?,
                delivery_count: 1,
            }),
        }
    }
    Ok(last)
}

/// Flattened field/value array (or a RESP3 map) into pairs.
pub fn pairs(v: Value) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    if let Value::Map(map) = v {
        return map
            .into_iter()
            .map(|(k, v)| Ok((bytes(k)?, bytes(v)?)))
            .collect();
    }
    let flat = array(v)?;
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((bytes(k)?, bytes(v)?));
    }
    Ok(out)
}

/// An array reply's elements.
pub fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(unexpected("an array", &other)),
    }
}

/// A bulk or simple string's bytes.
pub fn bytes(v: Value) -> Result<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(unexpected("a string", &other)),
    }
}

/// A string reply as UTF-8 text.
pub fn string(v: Value) -> Result<String> {
    String::from_utf8(bytes(v)?)
        .map_err(|_| Error::Other("redis replied with non-UTF-8 text".into()))
}

/// An integer reply (or a string holding one).
pub fn int(v: Value) -> Result<i64> {
    match v {
        Value::Int(n) => Ok(n),
        Value::Nil => Ok(0),
        other => {
            let text = string(other)?;
            text.parse()
                .map_err(|_| Error::Other(format!("redis replied {text:?} where a number belongs")))
        }
    }
}

fn unexpected(what: &str, got: &Value) -> Error {
    Error::Other(format!("redis replied {got:?} where {what} belongs"))
}

#[cfg(test)]
mod tests {
    use super::{array, dead_index_key, int, pairs, read_cut_short, redact, split_entries, string};
    use crate::error::Error;
    use redis::Value;
    use std::io::ErrorKind;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies_read_as_fields_arrays_strings_and_numbers_whatever_their_resp_shape() {
        let fields = vec![
            (b"payload".to_vec(), b"{}".to_vec()),
            (b"n".to_vec(), b"7".to_vec()),
        ];
        let flat = Value::Array(vec![bulk("payload"), bulk("{}"), bulk("n"), Value::Int(7)]);
        assert_eq!(pairs(flat).unwrap(), fields);
        let map = Value::Map(vec![(bulk("payload"), bulk("{}")), (bulk("n"), bulk("7"))]);
        assert_eq!(pairs(map).unwrap(), fields);
        assert_eq!(array(Value::Nil).unwrap(), vec![]);
        assert!(array(Value::Int(1)).is_err());
        assert_eq!(string(Value::SimpleString("OK".into())).unwrap(), "OK");
        assert_eq!(int(bulk("42")).unwrap(), 42);
        assert_eq!(int(Value::Nil).unwrap(), 0);
        assert!(int(bulk("forty")).is_err());
    }

    #[test]
    fn the_dead_letter_index_lives_beside_its_stream() {
        // `dlq`, `dlq reconcile` and earlier releases find it by this name.
        assert_eq!(
            dead_index_key("grants:submissions:dead"),
            "grants:submissions:dead:index"
        );
    }

    #[test]
    fn an_entry_whose_body_is_gone_is_vanished_and_the_last_id_is_kept() {
        let raw = vec![
            Value::Array(vec![
                bulk("1-0"),
                Value::Array(vec![bulk("payload"), bulk("{}")]),
            ]),
            Value::Array(vec![bulk("2-0"), Value::Nil]),
        ];
        let (mut entries, mut vanished) = (Vec::new(), Vec::new());
        let last = split_entries(raw, &mut entries, &mut vanished).unwrap();
        assert_eq!(last.as_deref(), Some("2-0"));
        assert_eq!(vanished, ["2-0"]);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(
            entries[0].fields,
            vec![(b"payload".to_vec(), b"{}".to_vec())]
        );
    }

    #[test]
    fn an_interrupted_read_is_cut_short_and_a_reset_connection_is_not() {
        let io = |kind: ErrorKind| Error::Redis(std::io::Error::from(kind).into());
        assert!(read_cut_short(&io(ErrorKind::Interrupted)));
        assert!(!read_cut_short(&io(ErrorKind::ConnectionReset)));
        assert!(!read_cut_short(&io(ErrorKind::TimedOut)));
        assert!(!read_cut_short(&Error::Other("Interrupted".into())));
    }

    /// Asserts `url` redacts to `shown`, and that `secret` appears nowhere in it.
    fn check(url: &str, secret: &str, shown: &str) {
        let got = redact(url);
        assert!(!got.contains(secret), "{url} -> {got} shows {secret}");
        assert_eq!(got, shown, "{url}");
    }

    #[test]
    fn tcp_urls_keep_user_host_port_and_db_and_hide_the_password() {
        check(
            "redis://user:s3cret@host:6379/0",
            "s3cret",
            "redis://user:***@host:6379/0",
        );
        check("redis://:s3cret@host", "s3cret", "redis://:***@host");
        check(
            "rediss://user:s3cret@host:6380",
            "s3cret",
            "rediss://user:***@host:6380",
        );
        check(
            "rediss://:s3cret@host:6380/#insecure",
            "s3cret",
            "rediss://:***@host:6380/#insecure",
        );
        check("valkey://u:s3cret@host", "s3cret", "valkey://u:***@host");
        check("valkeys://u:s3cret@host", "s3cret", "valkeys://u:***@host");
        for plain in [
            "redis://[::1]:6379/2?protocol=resp3",
            "redis://127.0.0.1:6379",
        ] {
            assert_eq!(redact(plain), plain);
        }
        // A lone userinfo is a user name to redis-rs, but often a misplaced password.
        check("redis://s3cret@host", "s3cret", "redis://***@host");
    }

    #[test]
    fn percent_encoded_and_delimiter_laden_passwords_are_hidden_whole() {
        check(
            "redis://user:p%40ss%3Aw0rd@host",
            "p%40ss",
            "redis://user:***@host",
        );
        check(
            "redis://user:p@ss@host:6379",
            "ss",
            "redis://user:***@host:6379",
        );
        check("redis://user:p:ss@host", "p:ss", "redis://user:***@host");
        // Unencoded `/`, `?` or `#` in a password: redis-rs reads a host, port and path out of
        // it, or fails; either way nothing of it may show.
        for url in [
            "redis://u:12/ss@host",
            "redis://u:12?ss@host",
            "redis://u:12#ss@host",
            "redis://u:pa/ss@host",
            "redis://u:p?a=b@host",
        ] {
            let got = redact(url);
            assert_eq!(got, "redis://***", "{url}");
        }
    }

    #[test]
    fn unix_socket_urls_hide_pass_in_the_query() {
        check(
            "unix:///run/redis.sock?pass=s3cret",
            "s3cret",
            "unix:///run/redis.sock?pass=***",
        );
        check(
            "unix:///run/redis.sock?user=u&pass=s3cret&db=2",
            "s3cret",
            "unix:///run/redis.sock?user=u&pass=***&db=2",
        );
        check(
            "redis+unix:///run/redis.sock?pass=s3cret",
            "s3cret",
            "redis+unix:///run/redis.sock?pass=***",
        );
        check(
            "valkey+unix:///run/v.sock?pass=s3cret",
            "s3cret",
            "valkey+unix:///run/v.sock?pass=***",
        );
        // Percent-encoded names and values are what redis-rs decodes, so they are caught too.
        check(
            "unix:///r.sock?pa%73s=s3cret",
            "s3cret",
            "unix:///r.sock?pass=***",
        );
        check(
            "unix:///r.sock?pass=s3%40cr%26et",
            "s3",
            "unix:///r.sock?pass=***",
        );
        check(
            "unix:///r.sock?pass=s3@cret",
            "cret",
            "unix:///r.sock?pass=***",
        );
        // An unencoded `&` splits a password into a second parameter: hidden, name and all.
        check(
            "unix:///r.sock?pass=s3&cret=x",
            "cret",
            "unix:///r.sock?pass=***&***",
        );
        check(
            "unix:///r.sock?pass=a#s3cret",
            "s3cret",
            "unix:///r.sock?pass=***#***",
        );
    }

    #[test]
    fn password_query_parameters_are_hidden_in_every_form() {
        // redis-rs ignores these on TCP URLs, but an operator may still write them.
        check(
            "redis://host:6379/0?password=s3cret",
            "s3cret",
            "redis://host:6379/0?password=***",
        );
        check(
            "rediss://host?PASSWORD=s3cret&protocol=3",
            "s3cret",
            "rediss://host?PASSWORD=***&protocol=3",
        );
        check("redis://host?token=s3cret", "s3cret", "redis://host?***");
    }

    #[test]
    fn sentinel_urls_keep_hosts_and_master_and_hide_the_password() {
        check(
            "redis+sentinel://user:s3cret@h1:26379,h2:26379/mymaster",
            "s3cret",
            "redis+sentinel://user:***@h1:26379,h2:26379/mymaster",
        );
        check(
            "redis+sentinel://:s3cret@h1:26379/mymaster",
            "s3cret",
            "redis+sentinel://:***@h1:26379/mymaster",
        );
        check(
            "redis+sentinel://h1:26379,h2:26379/mymaster?password=s3cret",
            "s3cret",
            "redis+sentinel://h1:26379,h2:26379/mymaster?password=***",
        );
        check(
            "redis+sentinel://u:s3/cret@h1/m",
            "cret",
            "redis+sentinel://***",
        );
        check(
            "redis+sentinel://h1/m?pass=s3@cret",
            "cret",
            "redis+sentinel://***",
        );
    }

    #[test]
    fn malformed_sentinel_urls_are_config_errors_that_hide_the_password() {
        for url in [
            "redis+sentinel://u:s3cret@h1:26379",
            "redis+sentinel://u:s3cret@h1:26379/",
            "redis+sentinel://u:s3cret@h1:x/m",
            "redis+sentinel://u:s3cret@h1:1,,h2:2/m",
            "redis+sentinel://u:s3cret@h1:1/m/extra",
            "redis+sentinel://u:s3cret@h1:1/m?password=s3cret",
            "redis+sentinel://u:s3cret@h1:1/m#nope",
            "redis+sentinel://u:s3/cret@h1:1/m",
        ] {
            let e = super::client(url).expect_err(url).to_string();
            assert!(
                e.starts_with("configuration: bad --redis-url"),
                "{url}: {e}"
            );
            assert!(!e.contains("s3cret") && !e.contains("cret@"), "{url}: {e}");
        }
    }

    #[test]
    fn malformed_urls_quoted_in_errors_show_no_secret() {
        check("user:s3cret@host:6379", "s3cret", "***");
        check("redis://user:s3cret@", "s3cret", "redis://user:***@");
        check("http://user:s3cret@host", "s3cret", "http://user:***@host");
    }
}
