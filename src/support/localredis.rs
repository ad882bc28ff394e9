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

/// How a private server is started.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Persist with AOF, `appendfsync always`, so a kill -9 loses nothing acknowledged.
    pub appendonly: bool,
    /// Require this password (`requirepass`).
    pub password: Option<String>,
    /// Also listen on a unix socket, `redis.sock` in the server's directory (see
    /// [`LocalRedis::socket_path`]).
    pub unixsocket: bool,
    /// Start as a replica of the server on this loopback port (`--replicaof`; with
    /// [`Options::tls`], the primary's TLS port, replicated over TLS).
    pub replica_of: Option<u16>,
    /// Also listen for TLS on a port of its own ([`LocalRedis::tls_port`]) with this
    /// certificate. The plain port stays open for the harness's own checks.
    pub tls: Option<Tls>,
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

    /// Starts a server whose data lives in `dir` (which must exist).
    pub fn start_in(dir: &Path, options: Options) -> Result<Self> {
        let port = free_port()?;
        let tls_port = match options.tls {
            Some(_) => Some(free_port()?),
            None => None,
        };
        let mut server = LocalRedis {
            child: None,
            port,
            tls_port,
            dir: dir.to_owned(),
            _tmp: None,
            options,
        };
        server.spawn()?;
        Ok(server)
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
        if let Some(port) = self.options.replica_of {
            cmd.args(["--replicaof", "127.0.0.1"]).arg(port.to_string());
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
        let deadline = Instant::now() + Duration::from_millis(START_WAIT_MS_MAX);
        loop {
            let ping = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            match ping {
                Ok(_) => return Ok(()),
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => {
                    return Err(Error::Other(format!(
                        "redis-server on port {} did not answer within {START_WAIT_MS_MAX} ms: {e} (log: {})",
                        self.port,
                        self.dir.join("redis.log").display()
                    )))
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(Error::Other(format!(
                    "redis-server exited at start ({status}); see {}",
                    self.dir.join("redis.log").display()
                )));
            }
        }
    }
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

/// A TCP port nobody was listening on a moment ago.
pub fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("finding a free port", e))?;
    Ok(listener
        .local_addr()
        .map_err(|e| Error::io("finding a free port", e))?
        .port())
}
