//! `claimgate run --metrics-addr HOST:PORT`: `/metrics` (Prometheus text) and `/healthz`.
//!
//! One thread answers requests one at a time with `tiny_http`; it only reads (ledger counts,
//! Redis XLEN/XPENDING/XINFO/PING), so a scrape can never change what the worker does.
//!
//! `/healthz` is 200 `ok` while all five hold, else 503 naming each one that does not:
//! - no stage of the worker has failed for a reason that will not clear by itself
//!   ([`Metrics::fail`]: the process is on its way to exit 1);
//! - no commit is being retried for a failure of the ledger itself, or for a transient one
//!   that has lasted a second or more ([`Metrics::ledger_trouble`]: a revoked privilege leaves
//!   the ledger answering a ping while nothing can be paid);
//! - the worker loop is running and has gone round within [`HEARTBEAT_STALE_MS`];
//! - Redis answers PING;
//! - the ledger answers a query ([`crate::ledger::Inspect::ping`]).

use crate::broker::stream::{self, Conn};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ledger::Backend;
use crate::observe::metrics::Metrics;
use crate::observe::prometheus;
use crate::ops::status;
use crate::support::threads::spawn_named;
use crate::support::Shutdown;

/// A worker loop that has not gone round for this long is reported unhealthy. Its longest
/// legitimate pause is a Redis outage step: connect timeout + response timeout + the longest
/// backoff, about 12 s; this leaves room for that and still catches a stuck loop.
pub const HEARTBEAT_STALE_MS: u64 = 30_000;

/// How long `/healthz` keeps answering after the worker loop failed for good, before the
/// server stops: long enough for a probe that saw the process still running to be told why.
const FAILED_HEALTH_LINGER_MS: u64 = 2_000;

/// What the request handler reads.
struct Endpoints<'a> {
    /// Stream, group and Redis URL.
    cfg: &'a Config,
    /// The ledger the worker writes.
    ledger: &'a dyn Backend,
    /// The worker's counters and heartbeat.
    metrics: &'a Metrics,
    /// Triggered once the worker loop has returned: the server stops, and until it has,
    /// `/healthz` says so.
    worker_done: &'a Shutdown,
    /// The handler's own Redis connection (reconnects after failures).
    conn: Conn,
}

/// Serves `/metrics` and `/healthz` on `addr` while `work` (the worker loop) runs, then stops
/// the server (at once after a clean stop, [`FAILED_HEALTH_LINGER_MS`] later after a failure;
/// its thread blocks in `recv` until a request comes or it is unblocked, never polling) and
/// returns what `work` returned. A port that cannot be bound is a configuration
/// error, reported before the worker starts.
pub fn serve_during<T>(
    addr: &str,
    cfg: &Config,
    ledger: &dyn Backend,
    metrics: &Metrics,
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| Error::Config(format!("cannot listen on --metrics-addr {addr}: {e}")))?;
    log::info!(
        "serving /metrics and /healthz on http://{}",
        server.server_addr()
    );
    let worker_done = Shutdown::new();
    metrics.beat();
    std::thread::scope(|s| {
        let mut endpoints = Endpoints {
            cfg,
            ledger,
            metrics,
            worker_done: &worker_done,
            conn: Conn::new(stream::client(&cfg.redis_url)?),
        };
        let server = &server;
        spawn_named(s, "http", move || endpoints.serve(server));
        let result = work();
        if result.is_err() {
            // The worker failed for good and the process is about to exit 1: a probe that asks
            // in this moment still learns why (503, naming the failure) instead of finding
            // the port closed. Bounded; a clean stop does not wait.
            std::thread::sleep(std::time::Duration::from_millis(FAILED_HEALTH_LINGER_MS));
        }
        worker_done.trigger();
        // Ends the server thread's `recv`; queued behind any request already accepted.
        server.unblock();
        result
    })
}

impl Endpoints<'_> {
    fn serve(&mut self, server: &tiny_http::Server) {
        while !self.worker_done.is_set() {
            let request = match server.recv() {
                Ok(r) => r,
                // `unblock`, once the worker has returned; the loop's test then ends it.
                Err(_) if self.worker_done.is_set() => break,
                Err(e) => {
                    log::warn!("metrics server: {e}");
                    continue;
                }
            };
            let path = request.url().split('?').next().unwrap_or("").to_owned();
            let (code, content_type, body) = match path.as_str() {
                "/metrics" => self.metrics_page(),
                "/healthz" => self.health(),
                _ => (
                    404,
                    "text/plain",
                    "not found: try /metrics or /healthz\n".to_owned(),
                ),
            };
            let header = tiny_http::Header::from_bytes("Content-Type", content_type)
                .expect("static header is valid");
            let response = tiny_http::Response::from_string(body)
                .with_status_code(code)
                .with_header(header);
            if let Err(e) = request.respond(response) {
                log::debug!("metrics server: client went away: {e}");
            }
        }
    }

    fn metrics_page(&mut self) -> (u16, &'static str, String) {
        let gathered = status::gather(self.cfg, self.ledger, &mut self.conn).and_then(|mut s| {
            // The count and the oldest one only: through the ledger's partial index, as many
            // rows as await review.
            s.held = Some(status::held(self.cfg, self.ledger, 1)?);
            Ok(s)
        });
        match gathered {
            Ok(s) => {
                let healthy = self.problems().is_empty();
                (
                    200,
                    prometheus::CONTENT_TYPE,
                    prometheus::render(&s, self.metrics, healthy),
                )
            }
            // Without the ledger the counters cannot be stated; a failed scrape (up == 0) says so.
            Err(e) => (503, "text/plain", format!("ledger unavailable: {e}\n")),
        }
    }

    fn health(&mut self) -> (u16, &'static str, String) {
        let problems = self.problems();
        if problems.is_empty() {
            (200, "text/plain", "ok\n".into())
        } else {
            (
                503,
                "text/plain",
                format!("unhealthy: {}\n", problems.join("; ")),
            )
        }
    }

    /// What keeps `/healthz` from answering 200, one sentence each; empty when healthy.
    /// `/metrics` reports the same answer as `claimgate_healthy`, so an alert needs no probe.
    fn problems(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(cause) = self.metrics.failure() {
            problems.push(format!("worker failed: {cause}"));
        }
        if let Some(trouble) = self.metrics.ledger_trouble() {
            problems.push(format!("commits failing: {trouble}"));
        }
        if self.worker_done.is_set() {
            problems.push("worker loop has stopped".to_owned());
        } else {
            let since_ms = self.metrics.heartbeat_age_ms();
            if since_ms > HEARTBEAT_STALE_MS {
                problems.push(format!(
                    "worker loop has not gone round for {} s",
                    since_ms / 1000
                ));
            }
        }
        if let Err(e) = self.conn.query::<String>(&redis::cmd("PING")) {
            problems.push(format!("redis: {e}"));
        }
        if let Err(e) = self.ledger.ping() {
            problems.push(format!("ledger: {e}"));
        }
        problems
    }
}
