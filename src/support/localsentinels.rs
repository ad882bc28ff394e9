//! A private Sentinel set-up on loopback: a primary, one replica and three sentinels, each on a
//! free port, all in one temporary directory, all killed on drop. For the failover tests and
//! benchmarks; never touches a Redis the operator runs.
//!
//! With [`LocalSentinels::start_tls`] every process also serves TLS on a port of its own, the
//! replica and the sentinels reach the data nodes over TLS, and [`LocalSentinels::url`] is a
//! `rediss+sentinel://` URL naming the sentinels' TLS ports; the plain ports stay open for the
//! harness's own checks, and the ports the sentinels name are the TLS ones.
//!
//! With [`Passwords`] the data nodes take a password (`requirepass`, and `masterauth` for the
//! replica; the sentinels monitor them with `sentinel auth-pass`), the sentinels one of their own
//! (`requirepass`, and `sentinel sentinel-pass` among themselves), and [`LocalSentinels::url`]
//! carries both in the documented form.
//!
//! The sentinels decide fast so that a test sees a promotion within seconds: a primary is down
//! after [`DOWN_AFTER_MS`] ([`TLS_DOWN_AFTER_MS`] over TLS) without a reply, and a failover
//! that stalls is retried after
//! [`FAILOVER_TIMEOUT_MS`]. Two of the three must agree (quorum 2).

use super::localredis::{
    fresh_ports, spawn_redis_server, wait_started, LocalRedis, Options, Started, Tls, START_TRIES,
};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "claimgate-primary";

/// `sentinel down-after-milliseconds`: how long a silent primary takes to count as down.
pub const DOWN_AFTER_MS: u64 = 1_000;

/// The same over TLS. A sentinel counts a primary silent from the moment it makes a link to
/// it, handshake included, and after a failover it makes new links to the new primary. On
/// this 2-core box under load, TLS handshakes took over a second: the sentinels failed over a
/// second time, 1.05 s after the test's own failover, to the node that had just rejoined, and
/// the writes the old one took meanwhile (it learns it was demoted only at Sentinel's next look,
/// 10 s later) were lost with its resync (the TLS failover test, 1 run in 39 beside two CPU
/// hogs; the sentinels' logs showed `+sdown` of a primary that answered 0.1 s later).
pub const TLS_DOWN_AFTER_MS: u64 = 3_000;

/// `sentinel failover-timeout`: when a stalled failover is tried again.
pub const FAILOVER_TIMEOUT_MS: u64 = 3_000;

/// How long [`LocalSentinels::start`] waits for the sentinels to see the replica.
const READY_WAIT_MS_MAX: u64 = 15_000;

/// How long [`LocalSentinels::rejoin`] waits for a restarted node's full sync.
const REJOIN_WAIT_MS_MAX: u64 = 30_000;

/// Passwords for a set-up: the data nodes', and the sentinels' own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Passwords {
    /// The data nodes' `requirepass` (and the replica's `masterauth`).
    pub data: Option<String>,
    /// The sentinels' `requirepass`.
    pub sentinel: Option<String>,
}

/// One primary, one replica, three sentinels.
pub struct LocalSentinels {
    /// The data nodes: index 0 started as the primary, index 1 as its replica. Which one is the
    /// primary now is the sentinels' answer ([`LocalSentinels::primary_port`]).
    pub nodes: [LocalRedis; 2],
    /// The sentinel processes, with their ports.
    sentinels: Vec<(u16, Child)>,
    /// The sentinels' TLS ports, in the same order, when started with TLS.
    sentinel_tls_ports: Option<Vec<u16>>,
    /// Holds the sentinels' config files and logs (and the data nodes' directories).
    dir: tempfile::TempDir,
    /// The passwords it was started with.
    passwords: Passwords,
}

impl LocalSentinels {
    /// Starts the five processes and waits until every sentinel knows the primary and its
    /// replica, so a failover can happen from then on.
    pub fn start() -> Result<Self> {
        Self::start_with(None, Passwords::default())
    }

    /// [`LocalSentinels::start`], with every process also serving TLS with `tls`'s certificate
    /// and the nodes replicating and monitored over TLS.
    pub fn start_tls(tls: Tls) -> Result<Self> {
        Self::start_with(Some(tls), Passwords::default())
    }

    /// The set-up, over TLS when `tls` is given, with `passwords`.
    pub fn start_with(tls: Option<Tls>, passwords: Passwords) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("claimgate-sentinel-")
            .tempdir()
            .map_err(|e| Error::io("creating a temporary directory for sentinels", e))?;
        let node_dir = |name: &str| -> Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::create_dir(&path).map_err(|e| Error::io("creating a node directory", e))?;
            Ok(path)
        };
        let options = Options {
            tls: tls.clone(),
            password: passwords.data.clone(),
            masterauth: passwords.data.clone(),
            ..Options::default()
        };
        let primary = LocalRedis::start_in(&node_dir("a")?, options.clone())?;
        // Replicas and sentinels reach a node on the port they would serve clients on.
        let primary_port = primary.tls_port().unwrap_or(primary.port());
        sync_at_once(primary.port(), passwords.data.as_deref())?;
        let replica = LocalRedis::start_in(
            &node_dir("b")?,
            Options {
                replica_of: Some(primary_port),
                ..options
            },
        )?;
        // The replica is the primary after a failover, and serves the old one's resync then.
        sync_at_once(replica.port(), passwords.data.as_deref())?;
        let mut sentinels = Vec::new();
        let mut tls_ports = Vec::new();
        for _ in 0..3 {
            let (port, tls_port, child) =
                start_sentinel(dir.path(), tls.as_ref(), primary_port, &passwords)?;
            sentinels.push((port, child));
            tls_ports.extend(tls_port);
        }
        let set = LocalSentinels {
            nodes: [primary, replica],
            sentinels,
            sentinel_tls_ports: tls.map(|_| tls_ports),
            dir,
            passwords,
        };
        set.wait_ready()?;
        Ok(set)
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/claimgate-primary`, or with TLS
    /// `rediss+sentinel://` and the sentinels' TLS ports.
    pub fn url(&self) -> String {
        let (scheme, ports) = match &self.sentinel_tls_ports {
            Some(ports) => ("rediss+sentinel", ports.clone()),
            None => ("redis+sentinel", self.sentinel_ports()),
        };
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let userinfo = match &self.passwords.data {
            Some(pw) => format!(":{pw}@"),
            None => String::new(),
        };
        let query = match &self.passwords.sentinel {
            Some(pw) => format!("?sentinel_password={pw}"),
            None => String::new(),
        };
        format!(
            "{scheme}://{userinfo}{}/{MASTER_NAME}{query}",
            hosts.join(",")
        )
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(port, _)| *port).collect()
    }

    /// The port the first sentinel that answers names as the primary now.
    pub fn primary_port(&self) -> Result<u16> {
        let mut last = None;
        for (port, _) in &self.sentinels {
            match ask_primary(*port, self.passwords.sentinel.as_deref()) {
                Ok(p) => return Ok(p),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Other("no sentinel".into())))
    }

    /// The data node (index into `nodes`) listening on `port` (plain or TLS).
    pub fn node_on(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.port() == port || n.tls_port() == Some(port))
    }

    /// Kills every sentinel with SIGKILL (their config files stay, so they can be restarted).
    pub fn kill_sentinels(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts every sentinel on its port from its (rewritten) config file.
    pub fn restart_sentinels(&mut self) -> Result<()> {
        for (port, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
            *child = start_sentinel_process(&config_path(self.dir.path(), *port))?;
        }
        Ok(())
    }

    /// Restarts the data node `index` (a killed old primary) as a replica of the node on
    /// `primary_port` and waits until it has synced. It starts with no data (no persistence),
    /// so until then Sentinel must not promote it: on a loaded box a second failover inside
    /// that window would make an empty node the primary, and the other's full resync from it
    /// would erase everything. Sentinel does not rule out a replica that never had a link
    /// (Redis reports its link down for -1 s), so the node is kept unpromotable until synced.
    pub fn rejoin(&mut self, index: usize, primary_port: u16) -> Result<()> {
        let node = &mut self.nodes[index];
        node.restart_unpromotable_as_replica_of(primary_port)?;
        let port = node.port();
        let deadline = Instant::now() + Duration::from_millis(REJOIN_WAIT_MS_MAX);
        while !replica_link_up_with(port, self.passwords.data.as_deref()).unwrap_or(false) {
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "the node on port {port} did not sync with {primary_port} within \
                     {REJOIN_WAIT_MS_MAX} ms; logs in {}",
                    self.dir.path().display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.nodes[index].make_promotable()
    }

    /// The directory the sentinels' config files and logs are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the replica's link to the primary is up (a replica still syncing would make
    /// a failover lose everything), then until every sentinel answers, knows of the replica and of the two other sentinels
    /// (without which there is no quorum to fail over).
    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_millis(READY_WAIT_MS_MAX);
        while !replica_link_up_with(self.nodes[1].port(), self.passwords.data.as_deref())? {
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "the replica did not finish syncing within {READY_WAIT_MS_MAX} ms"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (port, _) in &self.sentinels {
            loop {
                let pw = self.passwords.sentinel.as_deref();
                let known = (count(*port, pw, "REPLICAS"), count(*port, pw, "SENTINELS"));
                match known {
                    (Ok(replicas), Ok(others)) if replicas >= 1 && others >= 2 => break,
                    _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                    other => {
                        return Err(Error::Other(format!(
                            "sentinel on port {port} did not see the replica and two \
                             sentinels within {READY_WAIT_MS_MAX} ms ({other:?}); logs in {}",
                            self.dir.path().display()
                        )))
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for LocalSentinels {
    /// Kills the sentinels; when a test is failing, first prints what every process logged
    /// (their directory goes with this value, and a failover the test did not ask for is
    /// only told there).
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        self.kill_sentinels();
    }
}

impl LocalSentinels {
    /// Every sentinel's log whole (a line an event: `+sdown`, `+switch-master`, ...) and the
    /// last [`NODE_LOG_LINES_SHOWN`] lines of each data node's.
    pub fn logs(&self) -> String {
        let dir = self.dir.path();
        let mut out = String::new();
        let mut show = |name: String, path: PathBuf, last: usize| {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| format!("({e})\n"));
            let lines: Vec<&str> = text.lines().collect();
            let shown = &lines[lines.len().saturating_sub(last)..];
            out.push_str(&format!(
                "--- {name} ({})\n{}\n",
                path.display(),
                shown.join("\n")
            ));
        };
        for port in self.sentinel_ports() {
            show(
                format!("sentinel {port}"),
                dir.join(format!("sentinel-{port}.log")),
                usize::MAX,
            );
        }
        for (name, node) in ["a", "b"].iter().zip(&self.nodes) {
            show(
                format!("node {name}, port {}", node.port()),
                dir.join(name).join("redis.log"),
                NODE_LOG_LINES_SHOWN,
            );
        }
        out
    }
}

/// How much of each data node's log [`LocalSentinels::logs`] shows.
const NODE_LOG_LINES_SHOWN: usize = 60;

fn config_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("sentinel-{port}.conf"))
}

/// Starts a sentinel on fresh ports and waits until it answers PING. One that exits at start
/// (another process bound its port first) is started again on other ports, up to
/// [`START_TRIES`] times. Returns its port, its TLS port (with `tls`) and the process.
fn start_sentinel(
    dir: &Path,
    tls: Option<&Tls>,
    primary_port: u16,
    passwords: &Passwords,
) -> Result<(u16, Option<u16>, Child)> {
    let mut tries = 0;
    loop {
        tries += 1;
        let (port, tls_port) = fresh_ports(tls.is_some())?;
        let mut child = spawn_sentinel(dir, port, tls_port.zip(tls), primary_port, passwords)?;
        let ping = || -> Result<()> {
            let pw = passwords.sentinel.as_deref();
            redis::cmd("PING").query::<String>(&mut node_conn(port, pw)?)?;
            Ok(())
        };
        let log = dir.join(format!("sentinel-{port}.log"));
        match wait_started(Some(&mut child), ping) {
            Started::Answered => return Ok((port, tls_port, child)),
            Started::Exited(_) if tries < START_TRIES => continue,
            Started::Exited(status) => {
                return Err(Error::Other(format!(
                    "redis-server --sentinel exited at start {START_TRIES} times, the last on \
                     port {port} ({status}); see {}",
                    log.display()
                )))
            }
            Started::Silent(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Other(format!(
                    "redis-server --sentinel on port {port} did not answer: {e}; see {}",
                    log.display()
                )));
            }
        }
    }
}

/// Writes a sentinel's config file (sentinels rewrite it as they learn, so it is theirs) and
/// starts it. With `tls`, it also serves TLS on that port and reaches nodes and other
/// sentinels over TLS.
fn spawn_sentinel(
    dir: &Path,
    port: u16,
    tls: Option<(u16, &Tls)>,
    primary_port: u16,
    passwords: &Passwords,
) -> Result<Child> {
    let path = config_path(dir, port);
    let tls_lines = match tls {
        Some((tls_port, tls)) => format!(
            "tls-port {tls_port}\ntls-cert-file {cert}\ntls-key-file {key}\n\
             tls-ca-cert-file {cert}\ntls-auth-clients no\ntls-replication yes\n",
            cert = tls.cert.display(),
            key = tls.key.display(),
        ),
        None => String::new(),
    };
    let mut auth_lines = String::new();
    if let Some(pw) = &passwords.sentinel {
        auth_lines.push_str(&format!("requirepass {pw}\nsentinel sentinel-pass {pw}\n"));
    }
    let config = format!(
        "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n{tls_lines}\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} {down_after}\n\
         sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n{auth_lines}{data_auth}",
        data_auth = passwords
            .data
            .as_ref()
            .map(|pw| format!("sentinel auth-pass {MASTER_NAME} {pw}\n"))
            .unwrap_or_default(),
        dir = dir.display(),
        log = dir.join(format!("sentinel-{port}.log")).display(),
        down_after = if tls.is_some() {
            TLS_DOWN_AFTER_MS
        } else {
            DOWN_AFTER_MS
        },
    );
    std::fs::write(&path, config).map_err(|e| Error::io("writing a sentinel config", e))?;
    start_sentinel_process(&path)
}

fn start_sentinel_process(config: &Path) -> Result<Child> {
    spawn_redis_server(
        Command::new("redis-server").arg(config).arg("--sentinel"),
        "starting redis-server --sentinel",
    )
}

/// A connection to a sentinel or data node on loopback `port`, with its password if it has one.
fn node_conn(port: u16, password: Option<&str>) -> Result<redis::Connection> {
    let auth = password.map(|pw| format!(":{pw}@")).unwrap_or_default();
    let client = redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))?;
    let conn = client.get_connection_with_timeout(Duration::from_millis(300))?;
    conn.set_read_timeout(Some(Duration::from_millis(1_000)))?;
    Ok(conn)
}

/// The primary's port as the sentinel on `port` names it.
fn ask_primary(port: u16, password: Option<&str>) -> Result<u16> {
    let (_, primary_port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(&mut node_conn(port, password)?)?;
    Ok(primary_port)
}

/// Makes the data node on `port` start a replica's full sync at once: by default a primary
/// waits 5 s (`repl-diskless-sync-delay`) for more replicas to join the same transfer.
fn sync_at_once(port: u16, password: Option<&str>) -> Result<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query::<()>(&mut node_conn(port, password)?)?;
    Ok(())
}

/// True when the replica on `port` (which takes `password`) says its link to the primary is up.
fn replica_link_up_with(port: u16, password: Option<&str>) -> Result<bool> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut node_conn(port, password)?)?;
    Ok(info.lines().any(|l| l.trim() == "master_link_status:up"))
}

/// How many replicas (`what` = `REPLICAS`) or other sentinels (`SENTINELS`) the sentinel on
/// `port` knows of.
fn count(port: u16, password: Option<&str>, what: &str) -> Result<usize> {
    let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
        .arg(what)
        .arg(MASTER_NAME)
        .query(&mut node_conn(port, password)?)?;
    Ok(replicas.len())
}
