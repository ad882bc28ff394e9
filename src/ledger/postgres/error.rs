//! How PostgreSQL's errors become [`Error::Ledger`], each carrying this backend's answer to
//! "whom does this failure concern?" ([`Fault`]; ledger contract point 7). With this, `?`
//! works on `postgres` results throughout the PostgreSQL code, and `crate::error` names no
//! backend.
//!
//! | SQLSTATE | [`Fault`] | why |
//! | --- | --- | --- |
//! | 40001, 40P01, 57P01–57P03, 57014, 55P03, 53100, 53200, 53300, class 08, a closed or refused connection, an I/O error | transient | another writer won, the server is restarting or busy, the disk or memory is full for now, the connection was lost |
//! | class 22 (data exception), class 23 (integrity constraint), 54000 (a value too large for an index) | entry | the values one entry brought |
//! | everything else: 42501 (a privilege revoked), 25006 (read-only), 3F000 / 42P01 / 42883 (schema, table, function gone), class 58 (I/O), class XX (corruption), a raised exception, a reply of an unexpected type | ledger | the database, its schema or its grants, not any entry |

use crate::error::{Error, Fault};
use postgres::error::SqlState;

impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        let fault = fault(&e);
        Error::ledger(Described(e), fault)
    }
}

/// A PostgreSQL error in the words an operator needs. `postgres::Error` displays only its kind
/// ("db error", "error communicating with the server") and keeps the server's message, or the
/// I/O error beneath, as its source, which nothing in claimgate prints: every log line and exit
/// message read "ledger: db error". This displays the kind, then each cause in the chain, then
/// the SQLSTATE, on one line. It has no source of its own: its text carries the whole chain.
#[derive(Debug)]
struct Described<E: std::borrow::Borrow<postgres::Error>>(E);

impl<E: std::borrow::Borrow<postgres::Error>> std::fmt::Display for Described<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e: &postgres::Error = self.0.borrow();
        write!(f, "{e}")?;
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            // The server's DETAIL and HINT come on lines of their own; a log line stays one.
            write!(f, ": {}", c.to_string().replace('\n', "; "))?;
            cause = c.source();
        }
        if let Some(code) = e.code() {
            write!(f, " (SQLSTATE {})", code.code())?;
        }
        Ok(())
    }
}

impl<E: std::borrow::Borrow<postgres::Error> + std::fmt::Debug> std::error::Error for Described<E> {}

/// A connection that could not be made, naming where it was tried (host and port, the
/// database; never a user or password), as `psql` does: "Connection refused" alone does not
/// say which of an operator's servers refused.
#[derive(Debug)]
pub(super) struct Unreachable {
    /// `host:port (database NAME)`: `Target::address`.
    pub(super) address: String,
    /// What the client library said.
    pub(super) error: postgres::Error,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgreSQL at {}: ", self.address)?;
        Described(&self.error).fmt(f)
    }
}

impl std::error::Error for Unreachable {}

/// A failed connection attempt as the ledger error it is, naming where it was tried.
pub(super) fn unreachable(e: postgres::Error, address: &str) -> Error {
    let fault = fault(&e);
    Error::ledger(
        Unreachable {
            address: address.to_owned(),
            error: e,
        },
        fault,
    )
}

/// SQLSTATEs after which nothing was changed and the same transaction, tried again, can
/// succeed: a serialization failure or deadlock (another writer won), the server shutting
/// down, restarting or refusing connections for now, a lock or statement timeout, resources
/// briefly exhausted (53200 is also the server's lock table full), and the connection classes.
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
    &SqlState::CONNECTION_DOES_NOT_EXIST,
];

/// Whom a PostgreSQL error concerns (the table at the top of this file).
pub(super) fn fault(e: &postgres::Error) -> Fault {
    if e.is_closed() {
        return Fault::Transient;
    }
    let Some(code) = e.code() else {
        // No SQLSTATE: the client's own error. I/O (refused, reset, timed out) clears by
        // itself; a value of an unexpected type or a protocol error is the ledger's.
        return if std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) {
            Fault::Transient
        } else {
            Fault::Ledger
        };
    };
    if TRANSIENT.contains(&code) || code.code().starts_with("08") {
        Fault::Transient
    } else if code.code().starts_with("22")
        || code.code().starts_with("23")
        || code == &SqlState::PROGRAM_LIMIT_EXCEEDED
    {
        Fault::Entry
    } else {
        Fault::Ledger
    }
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
