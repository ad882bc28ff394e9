//! A private PostgreSQL 15 cluster on a free port, with its data in a temporary directory of
//! its own: for the test suite and the benchmark, so neither ever touches a PostgreSQL the
//! machine already runs. Dropping the handle stops the server (immediate shutdown) and removes
//! the directory.
//!
//! `initdb` and `pg_ctl` refuse to run as root, so when this process is root they run as the
//! `postgres` user (`runuser -u postgres --`) in a directory that user owns. The server runs
//! with `fsync=on` and `synchronous_commit=on`, as a ledger must; it listens on 127.0.0.1 only
//! and on a unix socket inside its own directory, and password authentication
//! (scram-sha-256) is required over TCP, so tests can give a wrong password.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The command that installs PostgreSQL on Debian and Ubuntu, quoted in errors.
pub const INSTALL_HINT: &str = "sudo apt-get install -y postgresql";

/// Where Debian puts PostgreSQL 15's server binaries (not on PATH).
pub const BIN_DIR_DEFAULT: &str = "/usr/lib/postgresql/15/bin";

/// The superuser every private cluster is made with.
pub const USER: &str = "claimgate";

/// The OS user that runs the server when this process is root.
const OS_USER: &str = "postgres";

/// How long `pg_ctl start` may wait for the server to accept connections, in seconds.
const START_WAIT_S_MAX: u32 = 60;

/// A running private PostgreSQL cluster.
pub struct LocalPostgres {
    /// The port it listens on, kept across restarts.
    port: u16,
    /// The superuser's password (random per cluster).
    password: String,
    /// The server binaries.
    bin: PathBuf,
    /// The temporary directory: `data/` (the cluster), `server.log`, the unix socket.
    dir: tempfile::TempDir,
    /// Whether the server is running (stopped by `stop_immediate`).
    running: bool,
    /// Whether it also speaks TLS (`server.crt` and `server.key` in its directory).
    tls: bool,
}

impl LocalPostgres {
    /// Makes a fresh cluster (`initdb`) and starts it. Fails with the install command when
    /// PostgreSQL is not installed.
    pub fn start() -> Result<Self> {
        Self::start_with_tls(None)
    }

    /// Like [`LocalPostgres::start`]; with `Some((certificate_pem, key_pem))` the server also
    /// accepts TLS (`ssl=on`) with that certificate.
    pub fn start_with_tls(tls: Option<(&str, &str)>) -> Result<Self> {
        let bin = std::env::var_os("CLAIMGATE_PG_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(BIN_DIR_DEFAULT));
        if !bin.join("initdb").exists() {
            return Err(Error::Config(format!(
                "PostgreSQL 15 was not found ({} is missing); install it with: {INSTALL_HINT}",
                bin.join("initdb").display()
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("claimgate-pg-")
            .tempdir()
            .map_err(|e| Error::io("creating a temporary directory for PostgreSQL", e))?;
        let password = format!("pw{:016x}", fastrand::u64(..));
        let pg = LocalPostgres {
            port: super::localredis::free_port()?,
            password,
            bin,
            dir,
            running: false,
            tls: tls.is_some(),
        };
        pg.give_to_server_user(pg.dir.path())?;
        if let Some((cert, key)) = tls {
            pg.write_server_file("server.crt", cert)?;
            pg.write_server_file("server.key", key)?;
        }
        pg.init()?;
        let mut pg = pg;
        pg.start_server()?;
        Ok(pg)
    }

    /// `postgres://claimgate:PASSWORD@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{database}",
            self.password, self.port
        )
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The server binaries it runs (`CLAIMGATE_PG_BIN`, else [`BIN_DIR_DEFAULT`]): the client
    /// tools of the same version (`pg_dump`, `pg_restore`, `psql`) are beside them.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The cluster's directory (`data/`, `server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates a database and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String> {
        self.create(name, "")
    }

    /// A new database `name` that starts as a copy of the database `template` (`CREATE
    /// DATABASE … TEMPLATE`: its files copied, no rows re-inserted; nobody may be connected to
    /// `template`), and its URL. `STRATEGY FILE_COPY`: PostgreSQL 15's default copies a
    /// database through the WAL, which for a 10M-claim ledger writes its 9 GB twice.
    pub fn copy_database(&self, name: &str, template: &str) -> Result<String> {
        assert!(
            template
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "a plain database name"
        );
        self.create(name, &format!(" TEMPLATE {template} STRATEGY FILE_COPY"))
    }

    fn create(&self, name: &str, how: &str) -> Result<String> {
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "a plain database name"
        );
        let mut client = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .map_err(|e| Error::Other(format!("connecting to the private PostgreSQL: {e}")))?;
        client
            .batch_execute(&format!("CREATE DATABASE {name}{how}"))
            .map_err(|e| Error::Other(format!("CREATE DATABASE {name}{how}: {e}")))?;
        Ok(self.url(name))
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`): no checkpoint, connections cut,
    /// as a crash of the server would leave it. Committed transactions survive (fsync=on).
    pub fn stop_immediate(&mut self) -> Result<()> {
        if self.running {
            self.pg_ctl(&["stop", "-m", "immediate", "-w"])?;
            self.running = false;
        }
        Ok(())
    }

    /// Starts the server again on the same port and data (after `stop_immediate`: crash
    /// recovery replays the WAL).
    pub fn start_again(&mut self) -> Result<()> {
        self.start_server()
    }

    /// Writes a file the server reads (mode 0600, owned by the server's user).
    fn write_server_file(&self, name: &str, text: &str) -> Result<()> {
        use std::io::Write;
        let path = self.dir.path().join(name);
        crate::support::files::create_private(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        self.give_to_server_user(&path)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn init(&self) -> Result<()> {
        let pwfile = self.dir.path().join("pwfile");
        std::fs::write(&pwfile, &self.password)
            .map_err(|e| Error::io("writing the private PostgreSQL's password file", e))?;
        self.give_to_server_user(&pwfile)?;
        let data = self.data();
        let pw_arg = format!("--pwfile={}", pwfile.display());
        // --no-sync: only initdb's own files skip fsync (a throwaway cluster); the server
        // itself runs with fsync=on.
        let args = [
            "-D",
            data.to_str().expect("a UTF-8 temp path"),
            "-U",
            USER,
            &pw_arg,
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ];
        let out = self.as_server_user(&self.bin.join("initdb"), &args);
        let _ = std::fs::remove_file(&pwfile);
        out
    }

    fn start_server(&mut self) -> Result<()> {
        let dir = self.dir.path().display();
        let mut options = format!(
            "-p {} -k {dir} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
             -c max_connections=200",
            self.port
        );
        if self.tls {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key"
            ));
        }
        let log = self.dir.path().join("server.log");
        let wait = START_WAIT_S_MAX.to_string();
        self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            &wait,
            "-l",
            log.to_str().expect("a UTF-8 temp path"),
            "-o",
            &options,
        ])?;
        self.running = true;
        Ok(())
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<()> {
        let data = self.data();
        let mut all = vec!["-D", data.to_str().expect("a UTF-8 temp path")];
        all.extend_from_slice(args);
        self.as_server_user(&self.bin.join("pg_ctl"), &all)
    }

    /// Runs a server binary, as the `postgres` user when we are root; fails naming its output.
    fn as_server_user(&self, program: &Path, args: &[&str]) -> Result<()> {
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", OS_USER, "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::io(format!("running {}", program.display()), e))?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Other(format!(
            "{} {} failed ({}): {}{} (log: {})",
            program.display(),
            args.first().unwrap_or(&""),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.dir.path().join("server.log").display()
        )))
    }

    /// Makes `path` owned by the `postgres` user when we are root (the server must own its
    /// data directory, and initdb must read the password file).
    fn give_to_server_user(&self, path: &Path) -> Result<()> {
        if !is_root() {
            return Ok(());
        }
        let name = CString::new(OS_USER).expect("no NUL");
        // SAFETY: getpwnam returns a pointer into static storage or null; it is read at once,
        // before any other call that could overwrite it.
        let ids = unsafe {
            let pw = libc::getpwnam(name.as_ptr());
            (!pw.is_null()).then(|| ((*pw).pw_uid, (*pw).pw_gid))
        };
        let Some((uid, gid)) = ids else {
            return Err(Error::Config(format!(
                "there is no '{OS_USER}' user to run PostgreSQL as (running as root); install \
                 PostgreSQL with: {INSTALL_HINT}"
            )));
        };
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| Error::io(format!("giving {} to {OS_USER}", path.display()), e))
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        if let Err(e) = self.stop_immediate() {
            eprintln!("stopping the private PostgreSQL: {e}");
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
