//! Secrets out of URLs before they reach a log line or an error message: one implementation
//! for every URL claimgate is given (Redis in `broker/stream.rs`, PostgreSQL in
//! `ledger/postgres/`), so a fix to one is a fix to all.
//!
//! The rule: a password becomes `***`; a query value is shown only when its name is on the
//! caller's list of names known to carry no secret; a value named like a password is hidden
//! with its name kept; any other query pair is hidden whole (an unknown name may itself be a
//! piece of an unencoded password).

use std::borrow::Cow;

/// Query parameters whose name is shown but whose value is not.
const URL_QUERY_SECRET: [&str; 5] = ["pass", "password", "passwd", "pwd", "sentinel_password"];

/// Fragments shown as they are: none is a secret (`#insecure` is refused, and named when it is).
const URL_FRAGMENT_SHOWN: [&str; 1] = ["insecure"];

/// Decoded query pairs, re-joined with every value that might be a secret hidden; values of
/// the names in `shown` are kept.
pub fn query<'a>(
    pairs: impl Iterator<Item = (Cow<'a, str>, Cow<'a, str>)>,
    shown: &[&str],
) -> String {
    pairs
        .map(|(name, value)| {
            let lower = name.to_ascii_lowercase();
            if shown.contains(&lower.as_str()) {
                format!("{name}={value}")
            } else if URL_QUERY_SECRET.contains(&lower.as_str()) {
                format!("{name}=***")
            } else {
                "***".to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A URL of the form `scheme://[user[:password]@]address[?query][#fragment]` with its secrets
/// hidden, cut by hand (no parser has to accept it: it may be malformed, and is then quoted in
/// the error saying so). When the cut is ambiguous (an `@` that may sit inside a query or path,
/// a password holding an unencoded `/`, `?` or `#`) everything after the scheme is hidden: an
/// unreadable URL in a log is better than a readable password.
pub fn by_hand(url: &str, shown: &[&str]) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    let (userinfo, tail) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let userinfo = match userinfo {
        None => String::new(),
        Some(info) if info.contains(['/', '?', '#']) => return format!("{scheme}://***"),
        Some(info) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => "***@".to_owned(),
        },
    };
    // The fragment first: a `?` after a `#` is part of the fragment, not a query.
    let (tail, fragment) = match tail.split_once('#') {
        Some((before, fragment)) if URL_FRAGMENT_SHOWN.contains(&fragment) => {
            (before, format!("#{fragment}"))
        }
        Some((before, _)) => (before, "#***".to_owned()),
        None => (tail, String::new()),
    };
    let (address, query_text) = match tail.split_once('?') {
        Some((address, after)) => {
            let pairs = after.split('&').filter(|p| !p.is_empty()).map(|p| {
                let (name, value) = p.split_once('=').unwrap_or((p, ""));
                (Cow::Borrowed(name), Cow::Borrowed(value))
            });
            (address, format!("?{}", query(pairs, shown)))
        }
        None => (tail, String::new()),
    };
    format!("{scheme}://{userinfo}{address}{query_text}{fragment}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_userinfo_and_query_are_hidden() {
        let shown = ["sslmode"];
        assert_eq!(
            by_hand(
                "postgres://u:s3cret@h:5432/db?sslmode=require&password=s3cret",
                &shown
            ),
            "postgres://u:***@h:5432/db?sslmode=require&password=***"
        );
        assert_eq!(
            by_hand("postgres://s3cret@h/db", &shown),
            "postgres://***@h/db"
        );
        assert_eq!(by_hand("postgres://u:a/b@h/db", &shown), "postgres://***");
        assert_eq!(
            by_hand("postgres://h/db?x=s3cret", &shown),
            "postgres://h/db?***"
        );
    }

    #[test]
    fn a_query_and_a_fragment_keep_their_places() {
        // A sentinel URL's `#insecure` read as a query pair gave `…/grants?***` (issue 39).
        assert_eq!(
            by_hand("rediss+sentinel://:pw@h1:1,h2:2/grants#insecure", &[]),
            "rediss+sentinel://:***@h1:1,h2:2/grants#insecure"
        );
        assert_eq!(
            by_hand(
                "redis+sentinel://h1/m?sentinel_password=pw&sentinel_user=u#x",
                &["sentinel_user"]
            ),
            "redis+sentinel://h1/m?sentinel_password=***&sentinel_user=u#***"
        );
        assert_eq!(
            by_hand("redis+sentinel://h1/m#a?b=pw", &[]),
            "redis+sentinel://h1/m#***"
        );
    }
}
