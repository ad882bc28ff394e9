//! How PostgreSQL's errors become [`Error::Ledger`], each carrying this backend's answer to
//! "can a later attempt succeed?" (contract point 6). With this, `?` works on `postgres`
//! results throughout the PostgreSQL code, and `crate::error` names no backend.

use crate::error::Error;
use postgres::error::SqlState;

impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        let transient = is_transient(&e);
        Error::ledger(Described(e), transient)
    }
}

/// A PostgreSQL error in the words an operator needs. `postgres::Error` displays only its kind
/// ("db error", "error communicating with the server") and keeps the server's message, or the
/// I/O error beneath, as its source, which nothing in claimgate prints: every log line and exit
/// message read "ledger: db error". This displays the kind, then each cause in the chain, then
/// the SQLSTATE, on one line. It has no source of its own: its text carries the whole chain.
#[derive(Debug)]
struct Described(postgres::Error);

impl std::fmt::Display for Described {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = std::error::Error::source(&self.0);
        while let Some(c) = cause {
            // The server's DETAIL and HINT come on lines of their own; a log line stays one.
            write!(f, ": {}", c.to_string().replace('\n', "; "))?;
            cause = c.source();
        }
        if let Some(code) = self.0.code() {
            write!(f, " (SQLSTATE {})", code.code())?;
        }
        Ok(())
    }
}

impl std::error::Error for Described {}

/// SQLSTATEs after which nothing was changed and the same transaction, tried again, can
/// succeed: a serialization failure or deadlock (another writer won), the server shutting
/// down, restarting or refusing connections for now, a lock or statement timeout, resources
/// briefly exhausted, and the connection classes.
const TRANSIENT: [&SqlState; 14] = [
    &SqlState::T_R_SERIALIZATION_FAILURE,
    &SqlState::T_R_DEADLOCK_DETECTED,
    &SqlState::ADMIN_SHUTDOWN,
    &SqlState::CRASH_SHUTDOWN,
    &SqlState::CANNOT_CONNECT_NOW,
    &SqlState::TOO_MANY_CONNECTIONS,
    &SqlState::LOCK_NOT_AVAILABLE,
    &SqlState::QUERY_CANCELED,
    &SqlState::DISK_FULL,
    &SqlState::OUT_OF_MEMORY,
    &SqlState::CONNECTION_EXCEPTION,
    &SqlState::CONNECTION_FAILURE,
    &SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    &SqlState::READ_ONLY_SQL_TRANSACTION,
];

/// True for errors a retry can get past: a SQLSTATE in [`TRANSIENT`], a closed connection,
/// or an I/O error talking to the server (the connection lost or refused).
pub(super) fn is_transient(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        return TRANSIENT.contains(&code);
    }
    // No SQLSTATE: the client's own error. I/O (refused, reset, timed out) clears by itself;
    // a type conversion or protocol error does not.
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// A failure to connect that an operator must fix, as a configuration error (exit 2): a
/// wrong password or user, a database that does not exist. `None` for anything else.
pub(super) fn config_fault(e: &postgres::Error, target: &str) -> Option<Error> {
    if let Some(tls) = tls_refusal(e) {
        return Some(Error::Config(format!(
            "cannot open the PostgreSQL ledger {target}: TLS refused the server ({tls}); is \
             sslrootcert the CA that signed the server's certificate, for this host name?"
        )));
    }
    let code = e.code()?;
    let what = if code == &SqlState::INVALID_PASSWORD
        || code == &SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        "the server refused the user name or password"
    } else if code == &SqlState::INVALID_CATALOG_NAME {
        "the database does not exist (create it first, e.g. createdb)"
    } else if code == &SqlState::INSUFFICIENT_PRIVILEGE {
        "the user lacks a privilege the ledger needs (CREATE on the database, or on its tables)"
    } else {
        return None;
    };
    // The server's own message names only the user or the database, never the password.
    let detail = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    Some(Error::Config(format!(
        "cannot open the PostgreSQL ledger {target}: {what} ({detail})"
    )))
}

/// The TLS library's own refusal (a certificate not signed by `sslrootcert`, a name that does
/// not match), found in the error's chain: retrying cannot change it.
fn tls_refusal(e: &postgres::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(r) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(r.to_string());
        }
        source = s.source();
    }
    None
}
