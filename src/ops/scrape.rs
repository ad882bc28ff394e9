//! Reading a running worker's `/metrics` from outside: a plain-HTTP GET and the commit-latency
//! histogram out of the Prometheus text, for `status --watch`'s commit p99 (only the worker
//! process knows its commit latencies; the ledger does not record them).
//!
//! Deliberately small: `http://HOST:PORT/PATH` only (the endpoint is meant to stay on loopback
//! or a private interface, docs/operations.md, "Monitoring"), HTTP/1.0 so the server closes the connection
//! after the body, bounded time and bytes. Every failure is a sentence for the screen, never a
//! reason to stop watching.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The histogram `status --watch` reads.
pub const COMMIT_HISTOGRAM: &str = "claimgate_commit_seconds";

/// Longest wait to connect, and for the whole answer.
const TIMEOUT_MS: u64 = 2_000;

/// Largest response read; a `/metrics` page is a few KiB.
const RESPONSE_BYTES_MAX: u64 = 1 << 20;

/// A histogram's cumulative buckets (upper bound in seconds, count ≤ it), in bound order, the
/// last one `+Inf`.
pub type Buckets = Vec<(f64, u64)>;

/// `GET url` and the body of a 200 answer.
pub fn get(url: &str) -> Result<String, String> {
    // Every message names the URL with any password hidden; a `user:password@` before the host
    // is dropped from the address (it is never sent: `/metrics` takes no credentials).
    let shown = crate::support::redact::by_hand(url, &[]);
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{shown}: only http:// metrics URLs are supported"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    let host = host.rsplit_once('@').map_or(host, |(_, address)| address);
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let timeout = Duration::from_millis(TIMEOUT_MS);
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{host}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .and_then(|()| write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n"))
        .map_err(|e| format!("{host}: {e}"))?;
    // The timeout bounds each read; the deadline bounds them all, so a server that trickles
    // a byte at a time cannot hold the watch for longer than one timeout.
    let deadline = Instant::now() + timeout;
    let mut body = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).map_err(|e| format!("{host}: {e}"))?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
        if body.len() as u64 > RESPONSE_BYTES_MAX {
            return Err(format!("{shown}: response over {RESPONSE_BYTES_MAX} bytes"));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{shown}: no complete answer within {TIMEOUT_MS} ms"
            ));
        }
    }
    let text = String::from_utf8_lossy(&body);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{shown}: not an HTTP response"))?;
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(body.to_owned()),
        Some(code) => Err(format!("{shown}: HTTP {code}")),
        None => Err(format!("{shown}: not an HTTP response")),
    }
}

/// The unlabelled histogram `name`'s buckets in Prometheus text, or `None` if it is absent.
pub fn buckets(text: &str, name: &str) -> Option<Buckets> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out: Buckets = text
        .lines()
        .filter_map(|line| {
            let (le, rest) = line.strip_prefix(&prefix)?.split_once("\"}")?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, rest.trim().parse::<f64>().ok()? as u64))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!out.is_empty()).then_some(out)
}

/// What was observed between two scrapes of one histogram: `now` less `before`, bucket by
/// bucket. A count that went down means the process restarted in between (its histogram
/// started again at zero), so `now` alone is what happened since.
pub fn delta(before: &Buckets, now: &Buckets) -> Buckets {
    let same_shape = before.len() == now.len() && before.iter().zip(now).all(|(b, n)| b.0 == n.0);
    if !same_shape || before.iter().zip(now).any(|(b, n)| n.1 < b.1) {
        return now.clone();
    }
    before
        .iter()
        .zip(now)
        .map(|(b, n)| (n.0, n.1 - b.1))
        .collect()
}

/// The `q` quantile (0 < q ≤ 1) of cumulative buckets, interpolated linearly inside the bucket
/// it falls in, as PromQL's `histogram_quantile` does: a quantile in the `+Inf` bucket is the
/// highest finite bound. `None` when nothing was observed.
pub fn quantile(q: f64, buckets: &Buckets) -> Option<f64> {
    assert!(q > 0.0 && q <= 1.0, "quantile {q} out of (0, 1]");
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in buckets {
        if count as f64 >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let inside = (count - lower.1) as f64;
            let share = if inside > 0.0 {
                (rank - lower.1 as f64) / inside
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * share);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE claimgate_commit_seconds histogram\n\
        claimgate_commit_seconds_sum 0.5\n\
        claimgate_commit_seconds_count 100\n\
        claimgate_commit_seconds_bucket{le=\"0.001\"} 50\n\
        claimgate_commit_seconds_bucket{le=\"0.01\"} 98\n\
        claimgate_commit_seconds_bucket{le=\"+Inf\"} 100\n";

    #[test]
    fn buckets_are_read_in_bound_order() {
        let b = buckets(TEXT, COMMIT_HISTOGRAM).unwrap();
        assert_eq!(b, vec![(0.001, 50), (0.01, 98), (f64::INFINITY, 100)]);
        assert_eq!(buckets(TEXT, "claimgate_other_seconds"), None);
    }

    #[test]
    fn quantile_interpolates_inside_its_bucket_like_promql() {
        let b = buckets(TEXT, COMMIT_HISTOGRAM).unwrap();
        // Rank 50 is the top of the first bucket; rank 74 is halfway through the second.
        assert_eq!(quantile(0.5, &b), Some(0.001));
        let q74 = quantile(0.74, &b).unwrap();
        assert!((q74 - 0.0055).abs() < 1e-9, "{q74}");
        // Rank 99 is in +Inf: the highest finite bound, as histogram_quantile answers.
        assert_eq!(quantile(0.99, &b), Some(0.01));
        assert_eq!(quantile(0.99, &vec![(0.001, 0), (f64::INFINITY, 0)]), None);
    }

    #[test]
    fn delta_subtracts_and_treats_a_decrease_as_a_restart() {
        let before = vec![(0.001, 5), (f64::INFINITY, 10)];
        let now = vec![(0.001, 7), (f64::INFINITY, 20)];
        assert_eq!(delta(&before, &now), vec![(0.001, 2), (f64::INFINITY, 10)]);
        let restarted = vec![(0.001, 1), (f64::INFINITY, 1)];
        assert_eq!(delta(&before, &restarted), restarted);
    }

    #[test]
    fn only_plain_http_is_fetched() {
        let e = get("https://127.0.0.1:1/metrics").unwrap_err();
        assert!(e.contains("only http://"), "{e}");
    }
}
