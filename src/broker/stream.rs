//! Everything claimgate says to Redis, and nothing else: this module never touches SQLite.
//!
//! Replies are parsed from raw [`redis::Value`]s rather than typed helpers because the shapes
//! that matter most are the unusual ones: a pending entry whose body was trimmed away comes
//! back as `[id, nil]`, and XAUTOCLAIM on Redis 7 adds a third element listing deleted ids.

use super::fault::{self, Who};
use super::sentinel::{Primary, Sentinels};
use crate::config::{REDIS_CONNECT_TIMEOUT_MS, REDIS_RESPONSE_TIMEOUT_MS};
use crate::error::{Error, Result};
use redis::{Client, Connection, Value};
use std::time::Duration;

pub use super::entry::{Cut, Entry, PayloadSize, Summary};
pub use super::url::redact;

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
    /// A new connection, with replies waited for at most `response_timeout`, and the address
    /// it went to (`host:port` or a socket path), which its errors name.
    fn connect(&self, response_timeout: Duration) -> Result<(Connection, String)> {
        let connect_timeout = Duration::from_millis(REDIS_CONNECT_TIMEOUT_MS);
        match self {
            Target::Direct(client) => {
                let addr = client.get_connection_info().addr().to_string();
                let open = || -> redis::RedisResult<Connection> {
                    let conn = client.get_connection_with_timeout(connect_timeout)?;
                    conn.set_read_timeout(Some(response_timeout))?;
                    conn.set_write_timeout(Some(response_timeout))?;
                    Ok(conn)
                };
                let conn = open().map_err(|e| fault::at(Who::Redis, &addr, e))?;
                Ok((conn, addr))
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
    let bad = |why: &dyn std::fmt::Display| {
        Error::Config(format!("bad --redis-url {}: {why}", redact(url)))
    };
    if url.ends_with("#insecure") {
        return Err(bad(&INSECURE_REFUSED));
    }
    if super::sentinel::is_sentinel_url(url) {
        let sentinels = Sentinels::parse(url).map_err(|why| bad(&why))?;
        return Ok(Target::Sentinel(std::sync::Arc::new(sentinels)));
    }
    Client::open(url).map(Target::from).map_err(|e| bad(&e))
}

/// Why `#insecure` is refused. This build cannot honour it (redis-rs's `tls-rustls-insecure`
/// feature is off), and a payments worker should not talk TLS without checking whom to.
const INSECURE_REFUSED: &str = "#insecure (TLS without checking the server's certificate) is \
     not supported: remove it, and trust the server's certificate instead (its CA in the \
     system's store, or SSL_CERT_FILE=/path/to/ca.pem)";

/// A connection that reconnects lazily after a failure. Every error it returns has passed
/// through `fault::at`: a lost connection names the address, a refused password or command is
/// a configuration error.
pub struct Conn {
    /// Where to reconnect to.
    client: Target,
    /// The live connection, if any, and the address it went to.
    conn: Option<(Connection, String)>,
    /// Response timeout: for the reader, longer than a read script may take.
    response_timeout: Duration,
}

impl Conn {
    /// A connection for ordinary commands.
    pub fn new(client: impl Into<Target>) -> Self {
        Self::with_timeout(client, Duration::from_millis(REDIS_RESPONSE_TIMEOUT_MS))
    }

    /// A connection whose replies may take up to `response_timeout`.
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
        Ok(&mut self.conn.as_mut().expect("just set").0)
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
        let result = super::sentinel::view(&sentinels, self.get()?);
        self.checked(result)
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
        self.checked(result)
    }

    /// Runs a pipeline, with the same rules as [`Conn::query`]; a pipeline whose commands
    /// failed is reported as its first failure.
    pub fn pipeline<T: redis::FromRedisValue>(&mut self, pipe: &redis::Pipeline) -> Result<T> {
        let result = pipe.query(self.get()?);
        self.checked(result)
    }

    /// Runs a script, with the same rules as [`Conn::query`].
    pub fn invoke<T: redis::FromRedisValue>(
        &mut self,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<T> {
        let result = script.invoke(self.get()?);
        self.checked(result)
    }

    /// A command's result: on an error that may have broken the connection, the connection is
    /// dropped; every error is said as `fault::at` says it, naming the address.
    fn checked<T>(&mut self, result: redis::RedisResult<T>) -> Result<T> {
        result.map_err(|e| {
            let addr = self
                .conn
                .as_ref()
                .map_or_else(String::new, |(_, a)| a.clone());
            if crate::error::redis_is_transient(&e) {
                self.reset();
            }
            fault::at(Who::Redis, &addr, e)
        })
    }
}

/// `e`, naming `key` when Redis answered WRONGTYPE: a string or hash written under the stream's
/// (or dead-letter stream's) name by another client is not an outage, and the operator must
/// learn which key to look at. Anything else comes back unchanged.
pub fn naming_key(e: Error, key: &str) -> Error {
    match &e {
        Error::Redis(r) if r.code() == Some("WRONGTYPE") => Error::Other(format!(
            "the Redis key {key} is not a stream (WRONGTYPE: something else was written under \
             that name); rename or delete it, or point claimgate at another stream"
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
    let replies: Vec<Value> = conn.pipeline(&pipe)?;
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
    e.code() == Some("UNBLOCKED")
        || fault::io_error_kind(e) == Some(std::io::ErrorKind::Interrupted)
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
    use super::{array, int, pairs, read_cut_short, string};
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
    fn an_interrupted_read_is_cut_short_and_a_reset_connection_is_not() {
        let io = |kind: ErrorKind| Error::Redis(std::io::Error::from(kind).into());
        assert!(read_cut_short(&io(ErrorKind::Interrupted)));
        assert!(!read_cut_short(&io(ErrorKind::ConnectionReset)));
        assert!(!read_cut_short(&io(ErrorKind::TimedOut)));
        assert!(!read_cut_short(&Error::Other("Interrupted".into())));
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
            "redis+sentinel://u:s3cret@h1:1/m#insecure",
            "rediss://u:s3cret@h1:1/#insecure",
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
}
