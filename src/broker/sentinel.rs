//! Redis through Sentinel: `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER`.
//!
//! Every connection `Conn` (in `stream.rs`) opens to a Sentinel-addressed Redis starts here: ask
//! the sentinels, one after another, `SENTINEL GET-MASTER-ADDR-BY-NAME MASTER`, connect to the
//! address the first one names (with the URL's credentials: they belong to the data nodes) and
//! keep the connection only if that node's `ROLE` says `master`. Sentinels are asked without
//! credentials, or with `?sentinel_password=…` (and `&sentinel_user=…`) when the URL gives them:
//! `redis+sentinel://[USER:PASS@]HOST:PORT[,HOST:PORT…]/MASTER[?sentinel_user=U&sentinel_password=P]`. `Conn` drops its connection after any transient error — a refused or reset
//! connection, and a `READONLY` reply from a primary that was demoted — so the next command asks
//! the sentinels again and follows a promotion. Sentinel itself closes the connections of a
//! node it reconfigures, so a demoted primary is never kept by a quiet connection either.
//!
//! Why not redis-rs's own `sentinel` feature (read in redis-rs 1.8.1, `src/sentinel.rs`): its
//! synchronous path opens every connection, to sentinels and to the primary it checks, with
//! `get_connection()`, which has no connect or response timeout, so a sentinel host that drops
//! packets would hang a worker thread with no way to give up; it also finds the primary through
//! `SENTINEL MASTERS` and hands back a plain `Client`, which would still have to be re-resolved
//! by us on every failure. What we need is about a hundred lines over the `Client` we already
//! use, with our timeouts, and the "which sentinel named which primary" that `status` shows.
//!
//! **Invariant:** a connection is handed out only to a node that said it is a primary. What no
//! retry can clear is a configuration error (exit 2) at once: a master name no reachable
//! sentinel knows, a password or user a sentinel or the primary refuses, a URL setting this
//! build cannot honour (`#insecure`); sentinels or a primary that cannot be reached are
//! transient, waited out like Redis being down.

use super::fault::{self, Who};
use crate::error::{Error, Result};
use redis::{Client, Connection, IntoConnectionInfo, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A parsed Sentinel URL, and the primary it led to last.
#[derive(Debug)]
pub struct Sentinels {
    /// The sentinels' `host:port`s, in the order the URL gives them.
    sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    master: String,
    /// `user:pass` (or `:pass`, or `user`) exactly as written, still percent-encoded, for the
    /// data nodes' URLs.
    userinfo: Option<String>,
    /// `rediss+sentinel`: TLS to the sentinels and to the data nodes.
    tls: bool,
    /// The sentinels' own user and password (`?sentinel_user=…&sentinel_password=…`), decoded.
    sentinel_auth: Option<(Option<String>, String)>,
    /// The primary last connected to, and the sentinel that named it.
    last: Mutex<Option<Primary>>,
    /// The index of the sentinel that last named a primary we connected to: the next
    /// connection asks it first (as Redis's guidelines for sentinel clients say), so a sentinel
    /// that is down or drops packets costs one timeout, not one per connection.
    preferred: AtomicUsize,
    /// How many times a connection found a primary other than the one before it: each is a
    /// failover this process lived through (the worker repairs what one can lose).
    changes: AtomicU64,
}

/// Which node a Sentinel URL led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    /// The primary's `host:port`, as the sentinel named it.
    pub address: String,
    /// The sentinel (`host:port`) that named it.
    pub sentinel: String,
}

/// What one sentinel said.
enum Answer {
    /// This `host:port` is the primary.
    Named(String),
    /// It does not monitor a master by that name.
    Unknown,
}

/// What `status` shows of a Sentinel set-up: who the primary is, who named it, and how far
/// behind each replica is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct View {
    /// The master name.
    pub master: String,
    /// The primary the command talked to (`host:port`).
    pub primary: String,
    /// The sentinel that named it (`host:port`).
    pub sentinel: String,
    /// The primary's replicas, from its `INFO replication`.
    pub replicas: Vec<Replica>,
}

/// One replica as its primary sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Replica {
    /// `host:port`.
    pub address: String,
    /// `online`, or a sync state such as `wait_bgsave`.
    pub state: String,
    /// Replication bytes the primary has that the replica has not acknowledged.
    pub lag_bytes: u64,
    /// Seconds since the replica last acknowledged.
    pub lag_s: u64,
}

/// The [`View`] for a connection made through `sentinels`, asking the primary on `conn`.
pub fn view(sentinels: &Sentinels, conn: &mut Connection) -> redis::RedisResult<Option<View>> {
    let Some(primary) = sentinels.last_primary() else {
        return Ok(None);
    };
    let info: String = redis::cmd("INFO").arg("replication").query(conn)?;
    Ok(Some(View {
        master: sentinels.master.clone(),
        primary: primary.address,
        sentinel: primary.sentinel,
        replicas: replicas_of(&info),
    }))
}

/// The replicas listed in an `INFO replication` reply (`slaveN:ip=…,port=…,state=…,offset=…,
/// lag=…`), with their lag against `master_repl_offset`.
fn replicas_of(info: &str) -> Vec<Replica> {
    let offset: u64 = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("master_repl_offset:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains(":ip="))
        .filter_map(|l| {
            let fields: std::collections::HashMap<&str, &str> = l
                .trim()
                .split_once(':')?
                .1
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let acked: u64 = fields.get("offset")?.parse().ok()?;
            Some(Replica {
                address: join_host_port(fields.get("ip")?, fields.get("port")?),
                state: fields.get("state")?.to_string(),
                lag_bytes: offset.saturating_sub(acked),
                lag_s: fields.get("lag").and_then(|n| n.parse().ok()).unwrap_or(0),
            })
        })
        .collect()
}

/// True for the schemes this module takes.
pub fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

impl Sentinels {
    /// Parses a Sentinel URL; an error says what is wrong without quoting the URL (the caller
    /// adds it, redacted: `stream::client`).
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let bad = |why: &str| why.to_owned();
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let tls = scheme == "rediss+sentinel";
        if rest.contains('#') {
            return Err(bad("a sentinel URL takes no fragment"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((info, rest)) => (Some(info.to_owned()), rest),
            None => (None, rest),
        };
        if userinfo.as_deref().is_some_and(|i| i.contains('/')) {
            return Err(bad("a password holding '/' must be percent-encoded (%2F)"));
        }
        let (hosts, master) = rest
            .split_once('/')
            .ok_or_else(|| bad("no master name: end it with /MASTER_NAME"))?;
        if master.is_empty() || master.contains('/') {
            return Err(bad(
                "the path must be exactly one master name: /MASTER_NAME",
            ));
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            sentinels.push(sentinel_address(host).ok_or_else(|| {
                bad("each sentinel must be host:port (or host, meaning port 26379)")
            })?);
        }
        Ok(Sentinels {
            sentinels,
            master: master.to_owned(),
            userinfo,
            tls,
            sentinel_auth: query.map(sentinel_auth).transpose()?,
            last: Mutex::new(None),
            preferred: AtomicUsize::new(0),
            changes: AtomicU64::new(0),
        })
    }

    /// The master name.
    pub fn master(&self) -> &str {
        &self.master
    }

    /// The primary the last connection went to, and through which sentinel; `None` before any.
    pub fn last_primary(&self) -> Option<Primary> {
        self.last.lock().expect("not poisoned").clone()
    }

    /// How many times the primary changed under this process's connections (the first primary
    /// found is not a change).
    pub fn primary_changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// A connection to the current primary, found through the sentinels (see the module doc),
    /// and its address. Each connection attempt waits at most `connect_timeout`; replies on the
    /// returned connection at most `response_timeout`. A refused password or user (a sentinel's
    /// or the primary's) is a configuration error at once.
    pub fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<(Connection, String)> {
        let mut last_err = String::new();
        let mut answered = 0usize;
        let mut unknown = 0usize;
        let first = self.preferred.load(Ordering::Relaxed);
        for i in asking_order(self.sentinels.len(), first) {
            let sentinel = &self.sentinels[i];
            let answer = self
                .ask(sentinel, connect_timeout)
                .map_err(|e| fault::at(Who::Sentinel, sentinel, e));
            match answer {
                Ok(Answer::Unknown) => {
                    answered += 1;
                    unknown += 1;
                }
                Ok(Answer::Named(address)) => {
                    answered += 1;
                    match self.open_primary(&address, connect_timeout, response_timeout) {
                        Ok(conn) => {
                            self.preferred.store(i, Ordering::Relaxed);
                            self.remember(address.clone(), sentinel);
                            return Ok((conn, address));
                        }
                        Err(e @ Error::Config(_)) => return Err(e),
                        Err(e) => last_err = format!("{address} (named by {sentinel}): {e}"),
                    }
                }
                Err(e @ Error::Config(_)) => return Err(e),
                Err(e) => last_err = e.to_string(),
            }
        }
        if answered > 0 && unknown == answered {
            return Err(Error::Config(format!(
                "no sentinel of {} monitors a master named {:?} (check the name after the / in \
                 --redis-url)",
                self.sentinels.join(","),
                self.master
            )));
        }
        // Transient, like a refused connection to a plain Redis: the worker waits it out.
        Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!(
                "no primary for {:?} reachable through sentinels {}; last: {last_err}",
                self.master,
                self.sentinels.join(",")
            ),
        ))))
    }

    /// Asks one sentinel where the primary is, with the sentinels' credentials if any.
    fn ask(&self, sentinel: &str, connect_timeout: Duration) -> redis::RedisResult<Answer> {
        let mut info = self.node_url(sentinel, false).into_connection_info()?;
        if let Some((user, password)) = &self.sentinel_auth {
            let mut settings = info.redis_settings().clone().set_password(password);
            if let Some(user) = user {
                settings = settings.set_username(user);
            }
            info = info.set_redis_settings(settings);
        }
        let client = Client::open(info)?;
        let mut conn = client.get_connection_with_timeout(connect_timeout)?;
        conn.set_read_timeout(Some(connect_timeout))?;
        conn.set_write_timeout(Some(connect_timeout))?;
        let reply: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master)
            .query(&mut conn)?;
        Ok(match reply {
            None => Answer::Unknown,
            Some((host, port)) => Answer::Named(join_host_port(&host, &port)),
        })
    }

    /// Connects to `address` with the URL's credentials and keeps the connection only if the
    /// node says it is a primary: a sentinel may still name a node that was just demoted.
    fn open_primary(
        &self,
        address: &str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Connection> {
        let open = || -> redis::RedisResult<(Connection, Vec<Value>)> {
            let client = Client::open(self.node_url(address, true))?;
            let mut conn = client.get_connection_with_timeout(connect_timeout)?;
            conn.set_read_timeout(Some(response_timeout))?;
            conn.set_write_timeout(Some(response_timeout))?;
            let role: Vec<Value> = redis::cmd("ROLE").query(&mut conn)?;
            Ok((conn, role))
        };
        let (conn, role) = open().map_err(|e| fault::at(Who::Redis, address, e))?;
        match role.first() {
            Some(Value::BulkString(role)) if role == b"master" => Ok(conn),
            other => Err(Error::Other(format!(
                "ROLE replied {other:?}: not the primary (yet)"
            ))),
        }
    }

    /// The URL of one node: a sentinel (no credentials: [`Sentinels::ask`] adds the sentinels'
    /// own) or a data node (with the URL's).
    fn node_url(&self, address: &str, data_node: bool) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let userinfo = match (&self.userinfo, data_node) {
            (Some(info), true) => format!("{info}@"),
            _ => String::new(),
        };
        format!("{scheme}://{userinfo}{address}")
    }

    /// Records where the connection went, logging when the primary changed.
    fn remember(&self, address: String, sentinel: &str) {
        let primary = Primary {
            address,
            sentinel: sentinel.to_owned(),
        };
        let mut last = self.last.lock().expect("not poisoned");
        if last.as_ref().map(|p| &p.address) != Some(&primary.address) {
            if last.is_some() {
                self.changes.fetch_add(1, Ordering::SeqCst);
            }
            log::info!(
                "redis primary for {:?} is {} (named by sentinel {})",
                self.master,
                primary.address,
                primary.sentinel
            );
        }
        *last = Some(primary);
    }
}

/// The sentinels' credentials from a sentinel URL's query: `sentinel_password` (required when
/// there is a query) and `sentinel_user`, percent-decoded; any other parameter is refused.
fn sentinel_auth(query: &str) -> std::result::Result<(Option<String>, String), String> {
    // redis-rs parses (and percent-decodes) a query for us when it sits on a URL it knows.
    let parsed = redis::parse_redis_url(&format!("redis://sentinel/?{query}"))
        .ok_or_else(|| "its query cannot be read".to_owned())?;
    let (mut user, mut password) = (None, None);
    for (name, value) in parsed.query_pairs() {
        match name.as_ref() {
            "sentinel_user" => user = Some(value.into_owned()),
            "sentinel_password" => password = Some(value.into_owned()),
            _ => {
                return Err(
                    "the only query a sentinel URL takes is ?sentinel_password=P (and \
                     &sentinel_user=U): the sentinels' own credentials (the data nodes' go \
                     before the @)"
                        .to_owned(),
                )
            }
        }
    }
    let password =
        password.ok_or_else(|| "?sentinel_user needs &sentinel_password beside it".to_owned())?;
    Ok((user, password))
}

/// The order `n` sentinels are asked in: `first` (the one that answered last), then the others
/// in the URL's order after it, wrapping round.
fn asking_order(n: usize, first: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (first + k) % n)
}

/// `host:port` (port 26379 when left out), or `None` for an empty or unparseable one.
fn sentinel_address(host: &str) -> Option<String> {
    if host.is_empty() {
        return None;
    }
    // `[v6]:port`, `[v6]`, `name:port`, `name`.
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => {
            let (addr, after) = v6.split_once(']')?;
            let port = match after.strip_prefix(':') {
                Some(port) => port,
                None if after.is_empty() => "26379",
                None => return None,
            };
            (format!("[{addr}]"), port)
        }
        None => match host.split_once(':') {
            Some((name, port)) => (name.to_owned(), port),
            None => (host.to_owned(), "26379"),
        },
    };
    let port: u16 = port.parse().ok()?;
    (!name.is_empty() && port != 0).then(|| format!("{name}:{port}"))
}

/// `host:port`, with an IPv6 host in brackets.
fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::{asking_order, is_sentinel_url, replicas_of, sentinel_address, Replica, Sentinels};

    #[test]
    fn the_sentinel_that_answered_last_is_asked_first_then_the_rest_in_url_order() {
        assert_eq!(asking_order(3, 0).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(asking_order(3, 2).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(asking_order(1, 0).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn replica_lag_is_read_from_info_replication() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=90,lag=1\r\n\
                    master_repl_offset:100\r\n";
        assert_eq!(
            replicas_of(info),
            [Replica {
                address: "127.0.0.1:7001".into(),
                state: "online".into(),
                lag_bytes: 10,
                lag_s: 1,
            }]
        );
    }

    #[test]
    fn sentinel_urls_parse_into_hosts_master_and_credentials() {
        let s = Sentinels::parse("redis+sentinel://u:p%40ss@h1:26379,h2,[::1]:5000/mymaster")
            .expect("parses");
        assert_eq!(s.sentinels, ["h1:26379", "h2:26379", "[::1]:5000"]);
        assert_eq!(s.master(), "mymaster");
        assert!(!s.tls);
        assert_eq!(s.node_url("h1:6379", true), "redis://u:p%40ss@h1:6379");
        assert_eq!(s.node_url("h1:26379", false), "redis://h1:26379");
        let tls = Sentinels::parse("rediss+sentinel://h1:1/m").expect("parses");
        assert_eq!(tls.node_url("h:2", true), "rediss://h:2");
        assert!(Sentinels::parse("rediss+sentinel://h1:1/m#insecure").is_err());
    }

    #[test]
    fn the_sentinels_credentials_come_from_the_query_percent_decoded() {
        let s = Sentinels::parse(
            "redis+sentinel://:data@h1/m?sentinel_user=watch&sentinel_password=p%40ss%26word",
        )
        .expect("parses");
        assert_eq!(
            s.sentinel_auth,
            Some((Some("watch".to_owned()), "p@ss&word".to_owned()))
        );
        assert_eq!(s.node_url("h1:26379", false), "redis://h1:26379");
        for bad in [
            "redis+sentinel://h1/m?password=x",
            "redis+sentinel://h1/m?sentinel_user=u",
            "redis+sentinel://h1/m?sentinel_password=x&db=2",
        ] {
            assert!(Sentinels::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_sentinel_addresses_are_refused() {
        assert_eq!(sentinel_address("h:0"), None);
        assert_eq!(sentinel_address("[::1]x"), None);
    }

    #[test]
    fn a_sentinel_address_without_a_port_gets_26379() {
        assert_eq!(sentinel_address("[::1]").as_deref(), Some("[::1]:26379"));
        assert_eq!(sentinel_address("s1").as_deref(), Some("s1:26379"));
        assert_eq!(sentinel_address("[::1]:5").as_deref(), Some("[::1]:5"));
    }

    #[test]
    fn only_the_two_sentinel_schemes_are_sentinel_urls() {
        assert!(is_sentinel_url("redis+sentinel://h:1/m"));
        assert!(is_sentinel_url("rediss+sentinel://h:1/m"));
        for other in [
            "redis://h:1",
            "rediss://h:1",
            "unix:///tmp/r.sock",
            "sentinel://h",
        ] {
            assert!(!is_sentinel_url(other), "{other}");
        }
    }
}
