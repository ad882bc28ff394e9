//! A private `redis-server` on a free port with its data in a directory of its own.
//!
//! Used by `claimgate demo`, the benchmark and the test suite, so none of them ever touches a
//! Redis the operator already runs. Dropping the handle kills the server.

use crate::error::{Error, Result};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The command that installs redis-server on Debian and Ubuntu, quoted in errors.
pub const INSTALL_HINT: &str = "sudo apt-get install -y redis-server";

/// How long a started server has to answer PING.
const START_WAIT_MS_MAX: u64 = 10_000;

/// How many times a private server that exits at start is started on fresh ports.
pub const START_TRIES: usize = 5;

/// How a private server is started.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Persist with AOF, `appendfsync always`, so a kill -9 loses nothing acknowledged.
    pub appendonly: bool,
    /// Require this password (`requirepass`).
    pub password: Option<String>,
    /// As a replica, give this password to the primary (`masterauth`).
    pub masterauth: Option<String>,
    /// Also listen on a unix socket, `redis.sock` in the server's directory (see
    /// [`LocalRedis::socket_path`]).
    pub unixsocket: bool,
    /// Start as a replica of the server on this loopback port (`--replicaof`; with
    /// [`Options::tls`], the primary's TLS port, replicated over TLS).
    pub replica_of: Option<u16>,
    /// Also listen for TLS on a port of its own ([`LocalRedis::tls_port`]) with this
    /// certificate. The plain port stays open for the harness's own checks.
    pub tls: Option<Tls>,
    /// As a replica, one Sentinel never promotes (`replica-priority 0`).
    pub unpromotable: bool,
}

/// A certificate and key for a private server's TLS port (PEM files).
#[derive(Debug, Clone)]
pub struct Tls {
    /// The server's certificate, also the CA it trusts for replication links.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl Tls {
    /// The `redis-server` arguments that serve TLS on `port` with these files (clients need no
    /// certificate of their own) and replicate over TLS.
    pub fn server_args(&self, port: u16) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["--tls-port".into(), port.to_string().into()];
        for (flag, file) in [
            ("--tls-cert-file", &self.cert),
            ("--tls-key-file", &self.key),
            ("--tls-ca-cert-file", &self.cert),
        ] {
            args.push(flag.into());
            args.push(file.into());
        }
        args.extend(["--tls-auth-clients", "no", "--tls-replication", "yes"].map(Into::into));
        args
    }
}

/// A running private redis-server.
pub struct LocalRedis {
    /// The server process, while it runs.
    child: Option<Child>,
    /// Its port, kept across restarts.
    port: u16,
    /// Its TLS port, when started with [`Options::tls`], kept across restarts.
    tls_port: Option<u16>,
    /// Its working directory (AOF, logs).
    dir: PathBuf,
    /// Keeps a temporary directory alive when we made one.
    _tmp: Option<tempfile::TempDir>,
    /// How it was started, reused by `restart`.
    options: Options,
}

impl LocalRedis {
    /// Starts a server in a fresh temporary directory.
    pub fn start(options: Options) -> Result<Self> {
        let tmp = tempfile::Builder::new()
            .prefix("claimgate-redis-")
            .tempdir()
            .map_err(|e| Error::io("creating a temporary directory for redis-server", e))?;
        let dir = tmp.path().to_owned();
        let mut server = Self::start_in(&dir, options)?;
        server._tmp = Some(tmp);
        Ok(server)
    }

    /// Starts a server whose data lives in `dir` (which must exist). A server that exits at
    /// start (most often because another process bound its port between [`free_port`] and
    /// the server's own bind) is started again on fresh ports, up to [`START_TRIES`] times.
    pub fn start_in(dir: &Path, options: Options) -> Result<Self> {
        let mut tries = 0;
        loop {
            tries += 1;
            let (port, tls_port) = fresh_ports(options.tls.is_some())?;
            let mut server = LocalRedis {
                child: None,
                port,
                tls_port,
                dir: dir.to_owned(),
                _tmp: None,
                options: options.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(_) if tries < START_TRIES && server.exited() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// True when the server process was started and has exited.
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
    }

    /// `redis://127.0.0.1:PORT`, with the password if one is set.
    pub fn url(&self) -> String {
        match &self.options.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The unix socket it listens on, when started with [`Options::unixsocket`].
    pub fn socket_path(&self) -> Option<PathBuf> {
        self.options.unixsocket.then(|| self.dir.join("redis.sock"))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, when started with [`Options::tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory, as a replica of the server on
    /// `primary_port`: how an old primary rejoins after a failover.
    pub fn restart_as_replica_of(&mut self, primary_port: u16) -> Result<()> {
        self.options.replica_of = Some(primary_port);
        self.restart()
    }

    /// [`LocalRedis::restart_as_replica_of`], unpromotable ([`Options::unpromotable`]) until
    /// [`LocalRedis::make_promotable`].
    pub fn restart_unpromotable_as_replica_of(&mut self, primary_port: u16) -> Result<()> {
        self.options.unpromotable = true;
        let restarted = self.restart_as_replica_of(primary_port);
        self.options.unpromotable = false;
        restarted
    }

    /// Lets Sentinel promote this replica again (`replica-priority 100`, Redis's default).
    pub fn make_promotable(&self) -> Result<()> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("replica-priority")
            .arg(100)
            .query::<()>(&mut conn)?;
        Ok(())
    }

    /// Starts it again on the same port and directory (so with AOF, with the same data).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    fn spawn(&mut self) -> Result<()> {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--save")
            .arg("")
            .arg("--daemonize")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        if self.options.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let Some(p) = &self.options.password {
            cmd.arg("--requirepass").arg(p);
        }
        if let Some(p) = &self.options.masterauth {
            cmd.arg("--masterauth").arg(p);
        }
        if let Some(port) = self.options.replica_of {
            cmd.args(["--replicaof", "127.0.0.1"]).arg(port.to_string());
        }
        if self.options.unpromotable {
            cmd.args(["--replica-priority", "0"]);
        }
        if let (Some(tls), Some(port)) = (&self.options.tls, self.tls_port) {
            cmd.args(tls.server_args(port));
        }
        if let Some(socket) = self.socket_path() {
            cmd.arg("--unixsocket")
                .arg(socket)
                .args(["--unixsocketperm", "700"]);
        }
        self.child = Some(spawn_redis_server(&mut cmd, "starting redis-server")?);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let client = redis::Client::open(self.url())?;
        let ping = || -> Result<()> {
            let mut conn = client.get_connection_with_timeout(Duration::from_millis(200))?;
            redis::cmd("PING").query::<String>(&mut conn)?;
            Ok(())
        };
        let log = self.dir.join("redis.log");
        match wait_started(self.child.as_mut(), ping) {
            Started::Answered => Ok(()),
            Started::Exited(status) => Err(Error::Other(format!(
                "redis-server exited at start ({status}); see {}",
                log.display()
            ))),
            Started::Silent(e) => Err(Error::Other(format!(
                "redis-server on port {} did not answer within {START_WAIT_MS_MAX} ms: {e} (log: {})",
                self.port,
                log.display()
            ))),
        }
    }
}

/// How a just-started server process turned out.
pub(crate) enum Started {
    /// It answered.
    Answered,
    /// It exited first (most often: its port was taken).
    Exited(std::process::ExitStatus),
    /// It neither answered nor exited within [`START_WAIT_MS_MAX`]; the last failed ping.
    Silent(Error),
}

/// Calls `ping` every 20 ms until it succeeds, `child` exits or [`START_WAIT_MS_MAX`] passes.
pub(crate) fn wait_started(
    mut child: Option<&mut Child>,
    mut ping: impl FnMut() -> Result<()>,
) -> Started {
    let deadline = Instant::now() + Duration::from_millis(START_WAIT_MS_MAX);
    loop {
        let e = match ping() {
            Ok(()) => return Started::Answered,
            Err(e) => e,
        };
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            return Started::Exited(status);
        }
        if Instant::now() >= deadline {
            return Started::Silent(e);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A port, and with `tls` a second one for TLS, from [`free_port`].
pub(crate) fn fresh_ports(tls: bool) -> Result<(u16, Option<u16>)> {
    let port = free_port()?;
    let tls_port = if tls { Some(free_port()?) } else { None };
    Ok((port, tls_port))
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `cmd` (a `redis-server` command line) with no stdio; a missing binary is a
/// configuration error carrying the install command, anything else an I/O error saying `doing`.
pub(crate) fn spawn_redis_server(cmd: &mut Command, doing: &str) -> Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::Config(format!(
                "redis-server was not found on PATH; install it with: {INSTALL_HINT}"
            )),
            _ => Error::io(doing, e),
        })
}

/// The lowest port [`free_port`] hands out.
const PRIVATE_PORT_MIN: u16 = 10_000;

/// Where in its range [`free_port`] looks next, as an offset taken modulo the range's size (0
/// until the first call picks a random start).
static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// A loopback TCP port nobody was listening on a moment ago, for a private server to bind.
///
/// Taken below the kernel's ephemeral range, never from it: a port `bind(0)` hands out is one
/// the kernel may give the very next outgoing connection (a test's Redis or PostgreSQL client)
/// as its local port, and a server started on it then fails with "Address already in use" (a
/// sentinel test failed in CI so). Within a process the ports go round the range from a random
/// start, so two servers started at once are not handed the same port. The servers that start
/// on one still check that they did ([`LocalRedis::start_in`] tries again on fresh ports).
pub fn free_port() -> Result<u16> {
    let ephemeral_min = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_min < PRIVATE_PORT_MIN + 1_000 {
        return kernel_port();
    }
    let span = ephemeral_min - PRIVATE_PORT_MIN;
    let start = fastrand::u16(..span);
    let _ = NEXT_PORT.compare_exchange(
        0,
        start + 1,
        std::sync::atomic::Ordering::Relaxed,
        std::sync::atomic::Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span;
        let port = PRIVATE_PORT_MIN + offset;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    kernel_port()
}

/// A port the kernel picks from its ephemeral range (for a machine whose range leaves nothing
/// below it).
fn kernel_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("finding a free port", e))?;
    Ok(listener
        .local_addr()
        .map_err(|e| Error::io("finding a free port", e))?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports handed out lie below the kernel's ephemeral range (where no outgoing
    /// connection can be given one), are distinct within the process, and can be bound.
    #[test]
    fn free_ports_are_private_distinct_and_bindable() {
        let ephemeral_min: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        for port in ports {
            assert!(
                (PRIVATE_PORT_MIN..ephemeral_min).contains(&port),
                "port {port} is outside {PRIVATE_PORT_MIN}..{ephemeral_min}"
            );
            TcpListener::bind(("127.0.0.1", port)).expect("a free port binds");
        }
    }
}
