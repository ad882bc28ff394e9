//! From a `--db` URL ([`PgUrl`], redacted in every message) to pooled connections: its
//! settings, TLS, and the pool.
//!
//! # Why these crates
//! The `postgres` crate (rust-postgres, the sync face of `tokio-postgres`) fits a synchronous
//! worker: one blocking call per statement, no async runtime in our code, arrays for UNNEST
//! and SQLSTATEs to classify errors. It is kept by the rust-postgres project with regular
//! releases. The pool is `r2d2`, already in the tree for SQLite, with the small manager below
//! rather than `r2d2_postgres`: that crate is a thin adapter whose releases have lagged
//! `postgres` (0.18.2 is its latest), and the manager is ten lines we control (no
//! checkout-time ping; a connection the server closed is dropped through `has_broken`).
//! TLS is `tokio-postgres-rustls` on the `rustls` + `ring` already used for Redis, so no
//! OpenSSL is linked.
//!
//! # The schema
//! Every claimgate object lives in one schema, `public` unless the URL names another with
//! `schema=NAME` (lower-case letters, digits and `_`, starting with a letter or `_`). Every
//! connection pins it (`SET search_path TO NAME`, so PostgreSQL's own `pg_catalog` is still
//! searched first and new objects go into NAME): a ledger is never found, or made, through the
//! user's `search_path`, whose `"$user"` would otherwise send every table into a schema named
//! after the role the moment a DBA creates one (a second, empty ledger, which pays again).
//!
//! # TLS
//! `sslmode=require` with `sslrootcert=FILE` (a PEM CA bundle): the server's certificate is
//! verified against FILE, always (stricter than libpq's `require`, which does not verify).
//! `sslmode=require` without `sslrootcert` is refused as a configuration error, since it would
//! trust nothing. Without `sslmode`, or with `disable`/`prefer` and no CA, the connection is
//! plain: for a server on the same host or a private network.

use crate::config::PgUrl;
use crate::error::{Error, Result};
use postgres::{Client, Config, NoTls, Statement};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection attempt may take before it counts as a (transient) failure.
pub(super) const CONNECT_TIMEOUT_MS: u64 = 5_000;

/// The schema a URL that names none uses: where every ledger of earlier releases was made
/// (unless a role-named schema caught it).
pub const SCHEMA_DEFAULT: &str = "public";

/// Where and how to connect, parsed once from the `--db` URL.
#[derive(Clone)]
pub(super) struct Target {
    /// The client configuration (the URL less `sslrootcert` and `schema`).
    config: Config,
    /// The schema every claimgate object lives in, pinned on every connection.
    pub(super) schema: String,
    /// Whether the URL named the schema (`schema=`), rather than taking [`SCHEMA_DEFAULT`].
    pub(super) schema_named: bool,
    /// The TLS connector, when `sslrootcert` is given.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// The URL with its password removed, for messages.
    pub(super) redacted: String,
}

impl Target {
    /// Parses `url`; a URL that cannot be used is a configuration error naming it redacted.
    pub(super) fn parse(url: &PgUrl) -> Result<Self> {
        let redacted = url.to_string();
        let url = url.expose_secret();
        let bad = |why: String| Error::Config(format!("bad PostgreSQL URL {redacted}: {why}"));
        let bad = &bad;
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut ca_file = None;
        let mut schema = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslrootcert", file)) => ca_file = Some(file.to_owned()),
                Some(("schema", name)) => schema = Some(schema_name(name).map_err(bad)?),
                _ => kept.push(pair),
            }
        }
        let rebuilt = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        // tokio-postgres's parse errors quote no part of the URL, so they are safe to show.
        let mut config = Config::from_str(&rebuilt).map_err(|e| bad(e.to_string()))?;
        config.connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS));
        if config.get_application_name().is_none() {
            config.application_name("claimgate");
        }
        let require = config.get_ssl_mode() == postgres::config::SslMode::Require;
        let tls = match ca_file {
            Some(file) => Some(tls_connector(&file).map_err(bad)?),
            None if require => {
                return Err(bad(
                    "sslmode=require needs sslrootcert=FILE (the CA that signed the server's \
                     certificate)"
                        .into(),
                ))
            }
            None => None,
        };
        Ok(Target {
            config,
            tls,
            schema_named: schema.is_some(),
            schema: schema.unwrap_or_else(|| SCHEMA_DEFAULT.to_owned()),
            redacted,
        })
    }

    /// One new connection, with the ledger's schema pinned ([module doc](self)).
    pub(super) fn connect(&self) -> Result<Client, postgres::Error> {
        let mut client = match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(NoTls),
        }?;
        // Quoted: a plain lower-case name folds to itself, and a keyword (`user`) stays a name.
        client.batch_execute(&format!("SET search_path TO \"{}\"", self.schema))?;
        Ok(client)
    }

    /// Where this target is, for a connection error: `host:port` (or the socket directory),
    /// and the database; never a user or password.
    pub(super) fn address(&self) -> String {
        use postgres::config::Host;
        let host = match self.config.get_hosts().first() {
            Some(Host::Tcp(name)) => name.clone(),
            Some(Host::Unix(dir)) => dir.display().to_string(),
            None => "localhost".to_owned(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        let db = self.config.get_dbname().unwrap_or("(the user's own)");
        format!("{host}:{port} (database {db})")
    }
}

/// A `schema=` value, checked: a plain lower-case identifier, so it is pinned and quoted
/// nowhere differently from how PostgreSQL folds it, and cannot carry SQL.
fn schema_name(name: &str) -> std::result::Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && !name.starts_with("pg_");
    if ok {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "schema={name:?} is not a schema claimgate can use: lower-case letters, digits and \
             _ only, not starting with a digit or pg_, at most 63 characters"
        ))
    }
}

/// A rustls connector trusting exactly the certificates in the PEM file `file`.
fn tls_connector(file: &str) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| format!("cannot read sslrootcert {file}: {e}"))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("sslrootcert {file}: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert {file}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert {file} holds no certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// A pooled connection and the statements prepared on it so far.
pub(super) struct Conn {
    /// The connection.
    pub(super) client: Client,
    /// Prepared statements by their SQL, so a batch does not prepare its statements again.
    prepared: HashMap<&'static str, Statement>,
}

impl From<Client> for Conn {
    /// A connection made outside the pool (the open step's first), with nothing prepared.
    fn from(client: Client) -> Conn {
        Conn {
            client,
            prepared: HashMap::new(),
        }
    }
}

impl Conn {
    /// The statement for `sql`, prepared on this connection the first time it is asked for.
    pub(super) fn prepared(&mut self, sql: &'static str) -> Result<Statement> {
        if let Some(s) = self.prepared.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.prepared.insert(sql, s.clone());
        Ok(s)
    }
}

/// The r2d2 manager: connects through [`Target`].
pub(super) struct Manager(pub(super) Target);

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = super::error::Unreachable;

    fn connect(&self) -> Result<Conn, Self::Error> {
        let unreachable = |error| super::error::Unreachable {
            address: self.0.address(),
            error,
        };
        let mut client = self.0.connect().map_err(unreachable)?;
        // Prepared statements get a plan per execution, from the table as it is now: a
        // generic plan cached while the ledger was empty would keep scanning it as it grows.
        //
        // And no JIT: every statement claimgate runs reads or writes a few rows through an
        // index, but one whose estimate the planner cannot see (a range above a value the same
        // statement computes) is costed at a third of the table, past `jit_above_cost` on a
        // large ledger, and compiled. `status` on 10,000,000 migrated claims spent 42 of its
        // 60-80 ms compiling its one statement, which reads no row (BENCHMARKS.md). `verify`
        // turned it off for its own statements already.
        client
            .batch_execute("SET plan_cache_mode = force_custom_plan; SET jit = off")
            .map_err(unreachable)?;
        Ok(Conn {
            client,
            prepared: HashMap::new(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), Self::Error> {
        conn.client
            .simple_query("")
            .map(|_| ())
            .map_err(|error| super::error::Unreachable {
                address: self.0.address(),
                error,
            })
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.client.is_closed()
    }
}

// A pool that hands out no connection in time is `Error::Ledger`, transient, through the one
// `From<r2d2::Error>` in `ledger/sqlite/error.rs` (both backends pool with r2d2).
