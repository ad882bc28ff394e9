//! What a Redis error means to the operator, said once and with where it happened.
//!
//! Every error a connection meets passes through [`at`] with the address it talks to
//! (`host:port` or a socket path: never a password), so that:
//!
//! - a lost or refused connection names the address, as redis-cli does ("127.0.0.1:6379:
//!   Connection refused"), and stays transient (its I/O kind is kept);
//! - a refused password or user (`NOAUTH`, `WRONGPASS`, a failed `AUTH`) and a command the
//!   user may not run (`NOPERM`) are configuration errors (exit 2) that say which URL form
//!   carries a password: no retry clears them;
//! - a pipeline whose commands failed is one line, its first failure (code and all), never the
//!   whole list (a `produce` without its password printed 56 KB of `NOAUTH`).
//!
//! Anything else (`WRONGTYPE`, `NOGROUP`, `OOM` …) comes back unchanged: callers decide on its
//! code.

use crate::error::Error;
use redis::{ErrorKind, RedisError};

/// Who answered: a Redis data node, or a sentinel of a `redis+sentinel://` URL. They take
/// their credentials from different parts of the URL, so a refusal names a different form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// A Redis server holding the streams.
    Redis,
    /// A sentinel.
    Sentinel,
}

/// `e`, met talking to `who` at `addr`, as the operator should read it (see the module doc).
pub fn at(who: Who, addr: &str, e: RedisError) -> Error {
    let e = first_failure(e);
    if let Some(config) = refusal(who, addr, &e) {
        return config;
    }
    if let Some(kind) = io_error_kind(&e).or_else(|| lost_kind(&e)) {
        // Shown as `redis: HOST:PORT: …` (or `redis: sentinel HOST:PORT: …`).
        let place = match who {
            Who::Redis => addr.to_owned(),
            Who::Sentinel => format!("sentinel {addr}"),
        };
        return Error::Redis(RedisError::from(std::io::Error::new(
            kind,
            format!("{place}: {e}"),
        )));
    }
    Error::Redis(e)
}

impl Who {
    /// How a message names it.
    fn noun(self) -> &'static str {
        match self {
            Who::Redis => "redis",
            Who::Sentinel => "sentinel",
        }
    }

    /// Where its password goes in `--redis-url`.
    fn url_form(self) -> &'static str {
        match self {
            Who::Redis => {
                "redis://:PASSWORD@HOST:PORT (requirepass) or redis://USER:PASSWORD@HOST:PORT (an \
                 ACL user); through sentinels, redis+sentinel://USER:PASSWORD@HOST:PORT,…/MASTER"
            }
            Who::Sentinel => {
                "redis+sentinel://[USER:PASSWORD@]HOST:PORT,…/MASTER?sentinel_password=PASSWORD \
                 (and &sentinel_user=USER for a sentinel ACL user)"
            }
        }
    }
}

/// The configuration error for a refused password, user or command; `None` for anything else.
fn refusal(who: Who, addr: &str, e: &RedisError) -> Option<Error> {
    let code = e.code().unwrap_or("");
    let text = e.to_string();
    let (noun, form) = (who.noun(), who.url_form());
    let encode = "percent-encode @ : / ? # & in a password";
    let message = if code == "NOAUTH" {
        format!(
            "{noun} at {addr} wants a password (NOAUTH) and --redis-url gives it none: put it in \
             the URL, {form}; {encode}"
        )
    } else if code == "WRONGPASS"
        || e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("invalid password")
        || text.contains("without any password configured")
    {
        format!(
            "{noun} at {addr} refused the user or password --redis-url gives it ({}): the form \
             is {form}; {encode}",
            one_line(&text)
        )
    } else if code == "NOPERM" {
        format!(
            "{noun} at {addr} refused a command to the user --redis-url names ({}): give that \
             user what the ACL line of docs/operations.md gives (section Security)",
            one_line(&text)
        )
    } else {
        return None;
    };
    Some(Error::Config(message))
}

/// A pipeline's error as its first failure, code and all (the others are almost always the
/// same, and one line is what an operator can read); any other error as it is.
fn first_failure(e: RedisError) -> RedisError {
    if !e.to_string().starts_with("Pipeline failure") {
        return e;
    }
    match e.into_server_errors() {
        Some(items) if !items.is_empty() => RedisError::from(items[0].1.clone()),
        _ => RedisError::from((ErrorKind::Extension, "a pipeline failed")),
    }
}

/// Redis text on one line: a reply never needs more, and a log line must not be split.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The kind of the I/O error inside a Redis error, if it is one. redis-rs keeps the
/// `io::Error` behind an `Arc` and offers no accessor for its kind.
pub fn io_error_kind(e: &RedisError) -> Option<std::io::ErrorKind> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let source = std::error::Error::source(e)?;
    let io = match source.downcast_ref::<std::io::Error>() {
        Some(io) => io,
        None => source.downcast_ref::<Shared>()?.downcast_ref()?,
    };
    Some(io.kind())
}

/// For a connection lost in a way redis-rs reports without an `io::Error` inside (a timeout, a
/// dropped or refused connection): the I/O kind to keep it transient under.
fn lost_kind(e: &RedisError) -> Option<std::io::ErrorKind> {
    if e.is_timeout() {
        Some(std::io::ErrorKind::TimedOut)
    } else if e.is_connection_refusal() {
        Some(std::io::ErrorKind::ConnectionRefused)
    } else if e.is_connection_dropped() || e.is_io_error() {
        Some(std::io::ErrorKind::ConnectionReset)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error redis-rs makes of a server's `-CODE text` reply.
    fn server_says(reply: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .expect("an error reply parses");
        value
            .extract_error()
            .expect_err("an error reply is an error")
    }

    #[test]
    fn refused_passwords_users_and_commands_are_configuration_naming_the_url_form() {
        for (reply, said) in [
            (
                "NOAUTH Authentication required.",
                "wants a password (NOAUTH)",
            ),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                "refused the user or password",
            ),
            ("ERR invalid password", "refused the user or password"),
            (
                "NOPERM User u has no permissions to run the 'xadd' command",
                "refused a command to the user",
            ),
        ] {
            let e = at(Who::Redis, "h:1", server_says(reply));
            let Error::Config(text) = &e else {
                panic!("{reply}: {e}")
            };
            assert!(text.starts_with(&format!("redis at h:1 {said}")), "{text}");
            assert!(!text.contains('\n'), "{text}");
        }
        let e = at(
            Who::Sentinel,
            "s:2",
            server_says("NOAUTH Authentication required."),
        );
        assert!(e.to_string().contains("?sentinel_password=PASSWORD"), "{e}");
    }

    #[test]
    fn a_lost_connection_names_the_address_and_stays_transient() {
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::Interrupted,
            std::io::ErrorKind::TimedOut,
        ] {
            let e = at(
                Who::Redis,
                "10.0.0.7:6380",
                std::io::Error::from(kind).into(),
            );
            assert!(e.is_transient(), "{kind:?}: {e}");
            assert!(e.to_string().starts_with("redis: 10.0.0.7:6380: "), "{e}");
            let Error::Redis(r) = &e else { panic!("{e}") };
            assert_eq!(io_error_kind(r), Some(kind));
        }
    }

    #[test]
    fn other_replies_come_back_with_their_code() {
        let e = at(
            Who::Redis,
            "h:1",
            server_says("WRONGTYPE Operation against a key"),
        );
        let Error::Redis(r) = &e else { panic!("{e}") };
        assert_eq!(r.code(), Some("WRONGTYPE"));
    }
}
