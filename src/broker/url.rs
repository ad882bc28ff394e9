//! Redis URLs as they may be shown: every secret replaced by `***`, the shape kept.

use crate::support::redact as url_secrets;

/// A Redis URL with every secret replaced by `***`, safe to log or print.
///
/// Covers every form redis-rs accepts (`redis`, `rediss`, `valkey`, `valkeys` with
/// `user:password@` in the authority; `unix`, `redis+unix`, `valkey+unix` with `?user=…&pass=…`)
/// and `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER`. A URL that redis-rs parses
/// is rebuilt from the same parse redis-rs makes (so percent-encoding and `+` cannot hide a
/// `pass` from us): the password becomes `***`, query values other than `db`, `protocol` and
/// `user` (and `sentinel_user`) are hidden, and so is a fragment other than `#insecure`.
/// Anything else, sentinel URLs included, is cut by hand, its query (`?…`) and fragment (`#…`)
/// kept apart, and when the cut is ambiguous (an `@` that may sit inside a query or path, a
/// password holding an unencoded `/`, `?` or `#`) everything after the scheme is hidden: an
/// unreadable URL in a log is better than a readable password.
pub fn redact(url: &str) -> String {
    redact_parsed(url).unwrap_or_else(|| url_secrets::by_hand(url, &URL_QUERY_SHOWN))
}

/// Query parameters shown with their values: none of them is a secret.
const URL_QUERY_SHOWN: [&str; 4] = ["db", "protocol", "user", "sentinel_user"];

/// [`redact`] for a URL redis-rs itself parses; `None` for anything else (including a parse in
/// which an `@` lands after the authority, where the password's own characters may have been
/// read as a host, a port or a path).
fn redact_parsed(url: &str) -> Option<String> {
    let parsed = redis::parse_redis_url(url)?;
    let unix = parsed.scheme().ends_with("unix");
    let after_authority = [
        parsed.path(),
        parsed.query().unwrap_or(""),
        parsed.fragment().unwrap_or(""),
    ];
    if !unix && after_authority.iter().any(|part| part.contains('@')) {
        return None;
    }
    let userinfo = match (parsed.username(), parsed.password()) {
        ("", None) => String::new(),
        (user, Some(_)) => format!("{user}:***@"),
        // A lone userinfo is a user name to redis-rs, but people put passwords there too.
        (_, None) => "***@".to_owned(),
    };
    let host = parsed.host_str().unwrap_or("");
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = parsed
        .query()
        .map(|_| {
            format!(
                "?{}",
                url_secrets::query(parsed.query_pairs(), &URL_QUERY_SHOWN)
            )
        })
        .unwrap_or_default();
    let fragment = match parsed.fragment() {
        None => "",
        Some("insecure") => "#insecure",
        Some(_) => "#***",
    };
    Some(format!(
        "{}://{userinfo}{host}{port}{}{query}{fragment}",
        parsed.scheme(),
        parsed.path()
    ))
}

#[cfg(test)]
mod tests {
    use super::redact;

    /// Asserts `url` redacts to `shown`, and that `secret` appears nowhere in it.
    fn check(url: &str, secret: &str, shown: &str) {
        let got = redact(url);
        assert!(!got.contains(secret), "{url} -> {got} shows {secret}");
        assert_eq!(got, shown, "{url}");
    }

    #[test]
    fn tcp_urls_keep_user_host_port_and_db_and_hide_the_password() {
        check(
            "redis://user:s3cret@host:6379/0",
            "s3cret",
            "redis://user:***@host:6379/0",
        );
        check("redis://:s3cret@host", "s3cret", "redis://:***@host");
        check(
            "rediss://user:s3cret@host:6380",
            "s3cret",
            "rediss://user:***@host:6380",
        );
        check(
            "rediss://:s3cret@host:6380/#insecure",
            "s3cret",
            "rediss://:***@host:6380/#insecure",
        );
        check("valkey://u:s3cret@host", "s3cret", "valkey://u:***@host");
        check("valkeys://u:s3cret@host", "s3cret", "valkeys://u:***@host");
        for plain in [
            "redis://[::1]:6379/2?protocol=resp3",
            "redis://127.0.0.1:6379",
        ] {
            assert_eq!(redact(plain), plain);
        }
        // A lone userinfo is a user name to redis-rs, but often a misplaced password.
        check("redis://s3cret@host", "s3cret", "redis://***@host");
    }

    #[test]
    fn percent_encoded_and_delimiter_laden_passwords_are_hidden_whole() {
        check(
            "redis://user:p%40ss%3Aw0rd@host",
            "p%40ss",
            "redis://user:***@host",
        );
        check(
            "redis://user:p@ss@host:6379",
            "ss",
            "redis://user:***@host:6379",
        );
        check("redis://user:p:ss@host", "p:ss", "redis://user:***@host");
        // Unencoded `/`, `?` or `#` in a password: redis-rs reads a host, port and path out of
        // it, or fails; either way nothing of it may show.
        for url in [
            "redis://u:12/ss@host",
            "redis://u:12?ss@host",
            "redis://u:12#ss@host",
            "redis://u:pa/ss@host",
            "redis://u:p?a=b@host",
        ] {
            let got = redact(url);
            assert_eq!(got, "redis://***", "{url}");
        }
    }

    #[test]
    fn unix_socket_urls_hide_pass_in_the_query() {
        check(
            "unix:///run/redis.sock?pass=s3cret",
            "s3cret",
            "unix:///run/redis.sock?pass=***",
        );
        check(
            "unix:///run/redis.sock?user=u&pass=s3cret&db=2",
            "s3cret",
            "unix:///run/redis.sock?user=u&pass=***&db=2",
        );
        check(
            "redis+unix:///run/redis.sock?pass=s3cret",
            "s3cret",
            "redis+unix:///run/redis.sock?pass=***",
        );
        check(
            "valkey+unix:///run/v.sock?pass=s3cret",
            "s3cret",
            "valkey+unix:///run/v.sock?pass=***",
        );
        // Percent-encoded names and values are what redis-rs decodes, so they are caught too.
        check(
            "unix:///r.sock?pa%73s=s3cret",
            "s3cret",
            "unix:///r.sock?pass=***",
        );
        check(
            "unix:///r.sock?pass=s3%40cr%26et",
            "s3",
            "unix:///r.sock?pass=***",
        );
        check(
            "unix:///r.sock?pass=s3@cret",
            "cret",
            "unix:///r.sock?pass=***",
        );
        // An unencoded `&` splits a password into a second parameter: hidden, name and all.
        check(
            "unix:///r.sock?pass=s3&cret=x",
            "cret",
            "unix:///r.sock?pass=***&***",
        );
        check(
            "unix:///r.sock?pass=a#s3cret",
            "s3cret",
            "unix:///r.sock?pass=***#***",
        );
    }

    #[test]
    fn password_query_parameters_are_hidden_in_every_form() {
        // redis-rs ignores these on TCP URLs, but an operator may still write them.
        check(
            "redis://host:6379/0?password=s3cret",
            "s3cret",
            "redis://host:6379/0?password=***",
        );
        check(
            "rediss://host?PASSWORD=s3cret&protocol=3",
            "s3cret",
            "rediss://host?PASSWORD=***&protocol=3",
        );
        check("redis://host?token=s3cret", "s3cret", "redis://host?***");
    }

    #[test]
    fn sentinel_urls_keep_hosts_and_master_and_hide_the_password() {
        check(
            "redis+sentinel://user:s3cret@h1:26379,h2:26379/mymaster",
            "s3cret",
            "redis+sentinel://user:***@h1:26379,h2:26379/mymaster",
        );
        check(
            "redis+sentinel://:s3cret@h1:26379/mymaster",
            "s3cret",
            "redis+sentinel://:***@h1:26379/mymaster",
        );
        check(
            "redis+sentinel://h1:26379,h2:26379/mymaster?password=s3cret",
            "s3cret",
            "redis+sentinel://h1:26379,h2:26379/mymaster?password=***",
        );
        check(
            "redis+sentinel://u:s3/cret@h1/m",
            "cret",
            "redis+sentinel://***",
        );
        check(
            "redis+sentinel://h1/m?pass=s3@cret",
            "cret",
            "redis+sentinel://***",
        );
    }

    #[test]
    fn malformed_urls_quoted_in_errors_show_no_secret() {
        check("user:s3cret@host:6379", "s3cret", "***");
        check("redis://user:s3cret@", "s3cret", "redis://user:***@");
        check("http://user:s3cret@host", "s3cret", "http://user:***@host");
    }
}
