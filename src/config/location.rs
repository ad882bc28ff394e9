//! Where a ledger is: the `--db` value parsed once, at the command line's edge, into a file
//! path or a PostgreSQL URL. From then on a URL is never a path and a path never a URL, and the
//! URL's password is shown nowhere: [`PgUrl`] prints redacted, by the one redactor every URL
//! claimgate is given goes through (`support::redact`).

use crate::error::{Error, Result};
use crate::support::redact;
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

/// The schemes that name a PostgreSQL ledger, exactly as written (lower case, nothing around).
const PG_SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// Query parameters of a PostgreSQL URL shown with their values in messages: none of them is a
/// secret (every other one is hidden, by `support::redact::by_hand`'s rule).
const PG_QUERY_SHOWN: [&str; 8] = [
    "schema",
    "sslmode",
    "sslrootcert",
    "user",
    "dbname",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
];

/// Words that begin a libpq `key=value` connection string's settings, as no file name does.
const CONNINFO_KEYS: [&str; 6] = [
    "host=",
    "hostaddr=",
    "user=",
    "password=",
    "dbname=",
    "port=",
];

/// Which ledger a `--db` value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerLocation {
    /// The embedded SQLite ledger in this file.
    File(PathBuf),
    /// The shared PostgreSQL ledger at this URL (which may hold a password).
    Postgres(PgUrl),
}

impl LedgerLocation {
    /// Parses a `--db` value (`CLAIMGATE_DB`): a `postgres://` or `postgresql://` URL is a
    /// PostgreSQL ledger, any other value a file path. A value that is almost a PostgreSQL
    /// address (the scheme in capitals, spaces around it, a `key=value` connection string) or
    /// a URL of another kind is [`Error::Config`], without being repeated: taken as a file name
    /// it would become a local SQLite ledger, leaving the shared one, with its password in a
    /// file name anyone can list and in every message that names the ledger.
    pub fn parse(value: impl AsRef<OsStr>) -> Result<Self> {
        let value = value.as_ref();
        // Only to tell the kinds apart: a file keeps its bytes as given, UTF-8 or not.
        let text = value.to_string_lossy();
        if PG_SCHEMES.iter().any(|scheme| text.starts_with(scheme)) {
            let url = value.to_str().ok_or_else(|| {
                Error::Config(
                    "--db is a PostgreSQL URL that is not valid UTF-8; it is not repeated here, \
                     as it may hold a password"
                        .into(),
                )
            })?;
            return Ok(LedgerLocation::Postgres(PgUrl(url.to_owned())));
        }
        refuse_a_url_that_is_not_one(&text)?;
        Ok(LedgerLocation::File(PathBuf::from(value)))
    }

    /// The file, for a SQLite ledger.
    pub fn file(&self) -> Option<&Path> {
        match self {
            LedgerLocation::File(path) => Some(path),
            LedgerLocation::Postgres(_) => None,
        }
    }
}

impl fmt::Display for LedgerLocation {
    /// The file's path, or the URL with its secrets hidden.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerLocation::File(path) => write!(f, "{}", path.display()),
            LedgerLocation::Postgres(url) => write!(f, "{url}"),
        }
    }
}

/// Refuses a value no ledger is named by: almost a PostgreSQL URL, a libpq connection string,
/// or a URL of another kind. The message never repeats the value.
fn refuse_a_url_that_is_not_one(value: &str) -> Result<()> {
    let lower = value.trim().to_ascii_lowercase();
    let almost_url = PG_SCHEMES.iter().any(|scheme| lower.starts_with(scheme));
    let conninfo = CONNINFO_KEYS
        .iter()
        .any(|key| lower.split_whitespace().any(|word| word.starts_with(key)));
    if almost_url || conninfo {
        return Err(Error::Config(
            "--db looks like a PostgreSQL address but is not a postgres:// or postgresql:// \
             URL as written (lower-case scheme, no spaces around it, not key=value); it is \
             not repeated here, as it may hold a password"
                .into(),
        ));
    }
    if let Some(scheme) = url_scheme(value) {
        return Err(Error::Config(format!(
            "--db is a URL of a kind claimgate does not take ({scheme}); a ledger is a file \
             path or a postgres:// or postgresql:// URL. The value is not repeated here, as \
             it may hold a password"
        )));
    }
    Ok(())
}

/// The scheme of a value that is a URL of some kind — `scheme://…`, or `scheme:…@…` — as
/// something safe to print (`pg://`, or `a URL`); `None` for a plain path. A mistyped scheme
/// (`postgre://`, `pg://`, `postgres:/`) must never become a file name, nor be repeated in
/// the message that refuses it: what follows the scheme may hold a password.
fn url_scheme(value: &str) -> Option<String> {
    let (scheme, rest) = value.trim().split_once(':')?;
    let schemeish = !scheme.is_empty()
        && scheme.len() <= 32
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !(rest.starts_with("//") || (schemeish && rest.starts_with('/') && rest.contains('@'))) {
        return (schemeish && rest.contains('@')).then(|| "a URL".to_owned());
    }
    Some(if schemeish {
        format!("{scheme}://")
    } else {
        "a URL".to_owned()
    })
}

/// A `postgres://` or `postgresql://` URL naming a PostgreSQL ledger, with its own settings in
/// its query (`schema=`, `sslmode=`, `sslrootcert=`). It may hold a password, so `Debug` and
/// `Display` show it redacted; only [`PgUrl::expose_secret`] hands out the URL whole, to
/// connect with.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl(String);

impl PgUrl {
    /// Parses a value that must name a PostgreSQL ledger, as [`LedgerLocation::parse`] does;
    /// a file path is [`Error::Config`] too.
    pub fn parse(value: &str) -> Result<Self> {
        match LedgerLocation::parse(value)? {
            LedgerLocation::Postgres(url) => Ok(url),
            LedgerLocation::File(_) => Err(Error::Config(
                "a PostgreSQL ledger is named by a postgres:// or postgresql:// URL".into(),
            )),
        }
    }

    /// The URL whole, password included: for connecting, never for a message.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PgUrl {
    /// The URL with every secret replaced by `***`, safe to log or print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact::by_hand(&self.0, &PG_QUERY_SHOWN))
    }
}

impl fmt::Debug for PgUrl {
    /// As [`Display`](fmt::Display): redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mistyped_url_is_refused_without_its_password() {
        for value in [
            "postgre://claimgate:PW-SECRET@db:5432/ledger",
            "pg://claimgate:PW-SECRET@db/ledger",
            "postgres:/claimgate:PW-SECRET@db/ledger",
            "postgres:claimgate:PW-SECRET@db/ledger",
            "mysql://claimgate:PW-SECRET@db/ledger",
            "redis://:PW-SECRET@127.0.0.1:6379",
            "Postgres://claimgate:PW-SECRET@db/ledger",
            " postgres://claimgate:PW-SECRET@db/ledger",
            "postgres ://claimgate:PW-SECRET@db/ledger",
            "host=db user=claimgate password=PW-SECRET",
            "://claimgate:PW-SECRET@db",
        ] {
            match LedgerLocation::parse(value) {
                Err(Error::Config(m)) => {
                    assert!(!m.contains("PW-SECRET") && !m.contains("claimgate:"), "{m}")
                }
                Err(e) => panic!("{value}: {e}"),
                Ok(_) => panic!("{value}: taken as a ledger"),
            }
        }
    }

    #[test]
    fn a_path_of_any_form_is_a_file_kept_as_given() {
        for path in [
            "./claimgate.db",
            "claimgate.db",
            "/var/lib/claimgate/claimgate.db",
            "../ledgers/claimgate.db",
            "ledger@2026.db",
            "C:ledger.db",
            "dir with spaces/ledger.db",
        ] {
            assert_eq!(
                LedgerLocation::parse(path).unwrap(),
                LedgerLocation::File(PathBuf::from(path)),
                "{path}"
            );
        }
        use std::os::unix::ffi::OsStrExt;
        let not_utf8 = OsStr::from_bytes(b"ledger-\xff.db");
        assert_eq!(
            LedgerLocation::parse(not_utf8).unwrap().file(),
            Some(Path::new(not_utf8))
        );
    }

    #[test]
    fn both_postgresql_schemes_are_a_postgres_location_kept_whole() {
        for url in [
            "postgres://claimgate@db:5432/ledger",
            "postgresql://claimgate@db/ledger?schema=claimgate&sslmode=disable",
            "postgresql:///ledger?host=/run/postgresql",
        ] {
            match LedgerLocation::parse(url).unwrap() {
                LedgerLocation::Postgres(pg) => assert_eq!(pg.expose_secret(), url),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert_eq!(
            LedgerLocation::parse("postgres://h/db").unwrap().file(),
            None
        );
    }

    #[test]
    fn a_password_is_never_shown_by_debug_display_or_an_error() {
        let url = "postgresql://claimgate:PW-SECRET@db/ledger?schema=claimgate&password=PW-SECRET";
        let location = LedgerLocation::parse(url).unwrap();
        let LedgerLocation::Postgres(pg) = &location else {
            panic!("{location:?}")
        };
        for shown in [
            format!("{pg}"),
            format!("{pg:?}"),
            format!("{location}"),
            format!("{location:?}"),
        ] {
            assert!(!shown.contains("PW-SECRET"), "{shown}");
            assert!(shown.contains("claimgate:***@db/ledger"), "{shown}");
            assert!(shown.contains("schema=claimgate"), "{shown}");
        }
        assert_eq!(pg.expose_secret(), url);
    }
}
