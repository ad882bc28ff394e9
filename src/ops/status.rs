//! `claimgate status`: what the ledger holds and where the stream stands, as a table for people
//! or JSON for machines. The same snapshot feeds the `/metrics` gauges.
//!
//! Read-only on both sides: it never acknowledges, claims or writes anything. Redis being down is
//! a state worth showing, not a failure, so the ledger half is still printed. The Redis URL is
//! only ever shown redacted.

use crate::broker::stream::{self, Conn};
use crate::config::Config;
use crate::domain::money::dollars;
use crate::error::{Error, Result};
use crate::ledger::{Backend, Review, Stats};
use crate::support::escape::controls;
use redis::Value;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

/// One consumer in the group.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ConsumerStatus {
    /// The consumer's name.
    pub name: String,
    /// Entries delivered to it and not yet acknowledged.
    pub pending: u64,
    /// Milliseconds since it last interacted with the group.
    pub idle_ms: u64,
}

/// Where the submissions stream and its group stand.
#[derive(Debug, Clone, Serialize)]
pub struct RedisStatus {
    /// The Redis URL with any password replaced by `***`.
    pub url: String,
    /// The submissions stream key.
    pub stream: String,
    /// Entries in the stream (acknowledged ones included until trimmed).
    pub length: u64,
    /// The consumer group.
    pub group: String,
    /// Whether the group exists yet (a worker creates it on first start).
    pub group_exists: bool,
    /// Entries not yet delivered to the group; `None` when Redis cannot tell (after trimming).
    pub lag: Option<u64>,
    /// Entries delivered and not yet acknowledged, over all consumers.
    pub pending: u64,
    /// The oldest pending entry's id.
    pub oldest_pending_id: Option<String>,
    /// Seconds since the oldest pending entry was added to the stream (by Redis' clock).
    pub oldest_pending_age_s: Option<f64>,
    /// Per-consumer pending counts and idle times.
    pub consumers: Vec<ConsumerStatus>,
    /// The dead-letter stream key.
    pub dead_letter_stream: String,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
    /// Through Sentinel: the primary talked to, the sentinel that named it, replica lag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<crate::broker::sentinel::View>,
}

/// Everything `status` reports. Not `Serialize` itself: `run` shapes the JSON so that an
/// unreachable Redis reads as `{"url", "error"}` rather than a Rust `Result`.
#[derive(Debug, Clone)]
pub struct Status {
    /// Where the ledger is (`Inspect::describe`: a file path, or a URL without its password).
    pub db: String,
    /// Ledger counts and totals.
    pub ledger: Stats,
    /// The stream side, or why it could not be read.
    pub redis: std::result::Result<RedisStatus, RedisTrouble>,
    /// Conflicts held for review awaiting a decision ([`held`]): `claimgate status` reads the
    /// oldest few, a `/metrics` scrape the oldest one; `None` where not read (`status
    /// --watch`).
    pub held: Option<HeldStatus>,
}

/// Conflicts held for review (`run --on-conflict hold`) that no reviewer has decided yet.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HeldStatus {
    /// How many await a decision.
    pub awaiting: u64,
    /// The oldest few (`STATUS_HELD_SHOWN_MAX`).
    pub oldest: Vec<crate::ledger::HeldConflict>,
}

/// How many held conflicts of `cfg.stream` await a decision, and the oldest `shown` of them
/// (`claimgate status` lists `STATUS_HELD_SHOWN_MAX`; a `/metrics` scrape reads one, for its
/// age).
pub fn held(cfg: &Config, ledger: &dyn Review, shown: usize) -> Result<HeldStatus> {
    let (awaiting, oldest) = ledger.held_awaiting(&cfg.stream, shown)?;
    Ok(HeldStatus { awaiting, oldest })
}

/// Why the stream side could not be read.
#[derive(Debug, Clone)]
pub struct RedisTrouble {
    /// True when Redis could not be reached (a transient error); false when it answered with
    /// something that will not clear by itself, such as a key of the wrong type.
    pub unreachable: bool,
    /// The error, for the operator.
    pub message: String,
}

/// Reads the stream side. A missing stream or group reads as empty, not as an error.
pub fn redis_status(cfg: &Config, conn: &mut Conn) -> Result<RedisStatus> {
    let mut xlen = |key: &str| -> Result<u64> {
        conn.query(redis::cmd("XLEN").arg(key))
            .map_err(|e| stream::naming_key(e, key))
    };
    let length = xlen(&cfg.stream)?;
    let dead_letter_stream = cfg.dead_stream();
    let dead_letters = xlen(&dead_letter_stream)?;
    let mut status = RedisStatus {
        url: stream::redact(&cfg.redis_url),
        stream: cfg.stream.clone(),
        length,
        group: cfg.group.clone(),
        group_exists: false,
        lag: Some(length),
        pending: 0,
        oldest_pending_id: None,
        oldest_pending_age_s: None,
        consumers: Vec::new(),
        dead_letter_stream,
        dead_letters,
        sentinel: conn.sentinel_view()?,
    };
    let groups = match conn.query::<Value>(redis::cmd("XINFO").arg("GROUPS").arg(&cfg.stream)) {
        Ok(v) => stream::array(v)?,
        Err(Error::Redis(e)) if e.to_string().contains("no such key") => return Ok(status),
        Err(e) => return Err(e),
    };
    let Some(group) = groups
        .into_iter()
        .map(fields)
        .find(|g| text(g, "name").as_deref() == Some(cfg.group.as_str()))
    else {
        return Ok(status);
    };
    status.group_exists = true;
    status.lag = match group.get("lag") {
        Some(Value::Nil) | None => None,
        Some(v) => Some(stream::int(v.clone())?.max(0) as u64),
    };
    let summary =
        stream::array(conn.query(redis::cmd("XPENDING").arg(&cfg.stream).arg(&cfg.group))?)?;
    let mut summary = summary.into_iter();
    status.pending = stream::int(summary.next().unwrap_or(Value::Nil))?.max(0) as u64;
    if status.pending > 0 {
        let oldest = stream::string(summary.next().unwrap_or(Value::Nil))?;
        status.oldest_pending_age_s = id_age_s(conn, &oldest)?;
        status.oldest_pending_id = Some(oldest);
    }
    let consumers: Value = conn.query(
        redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&cfg.stream)
            .arg(&cfg.group),
    )?;
    for c in stream::array(consumers)? {
        let c = fields(c);
        status.consumers.push(ConsumerStatus {
            name: text(&c, "name").unwrap_or_default(),
            pending: number(&c, "pending"),
            idle_ms: number(&c, "idle"),
        });
    }
    Ok(status)
}

/// Gathers the ledger and stream sides. Only a ledger failure is an error.
pub fn gather(cfg: &Config, ledger: &dyn Backend, conn: &mut Conn) -> Result<Status> {
    Ok(Status {
        db: ledger.describe(),
        ledger: ledger.stats()?,
        redis: match redis_status(cfg, conn) {
            // A master name no sentinel knows is the command line's fault, not an outage.
            Err(e @ Error::Config(_)) => return Err(e),
            // "Unreachable" only for what is: a key of the wrong type is not an outage.
            other => other.map_err(|e| RedisTrouble {
                unreachable: e.is_transient(),
                message: e.to_string(),
            }),
        },
        held: None,
    })
}

/// `status --json`'s document. Written straight from `Stats`, not through a
/// `serde_json::Value`: a total past u64 (an i128) has no `Value`, but it is still written
/// exactly.
#[derive(Debug, Serialize)]
pub struct Doc<'s> {
    /// Where the ledger is.
    pub db: &'s str,
    /// Its counts and totals.
    pub ledger: &'s Stats,
    /// The stream side, or `{"url", "error"}`.
    pub redis: serde_json::Value,
    /// Conflicts held for review awaiting a decision (absent where not read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_conflicts: Option<&'s HeldStatus>,
}

impl Status {
    /// The JSON document of this status.
    pub fn doc(&self, cfg: &Config) -> Doc<'_> {
        Doc {
            db: &self.db,
            ledger: &self.ledger,
            redis: match &self.redis {
                Ok(r) => serde_json::to_value(r).expect("status serializes"),
                Err(e) => serde_json::json!({
                    "url": stream::redact(&cfg.redis_url),
                    "error": e.message,
                }),
            },
            held_conflicts: self.held.as_ref(),
        }
    }
}

/// The body of `claimgate status`, on the ledger the command line opened. Everything that
/// could be read is printed; then, if Redis could not be, the command fails (exit 1) naming
/// the URL it tried (redacted), so a script or cron job never reads "all is well" from an
/// outage. (A ledger that cannot be read fails before anything is printed.)
pub fn run(cfg: &Config, ledger: &dyn Backend, json: bool) -> Result<()> {
    let mut conn = Conn::new(stream::client(&cfg.redis_url)?);
    let mut status = gather(cfg, ledger, &mut conn)?;
    status.held = Some(held(cfg, ledger, crate::config::STATUS_HELD_SHOWN_MAX)?);
    let text = if json {
        serde_json::to_string_pretty(&status.doc(cfg)).expect("status serializes") + "\n"
    } else {
        table(&status)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| Error::io("writing status", e))?;
    match &status.redis {
        Ok(_) => Ok(()),
        Err(trouble) => Err(Error::Other(format!(
            "Redis at {} {}: {}",
            stream::redact(&cfg.redis_url),
            if trouble.unreachable {
                "could not be reached"
            } else {
                "could not be read"
            },
            trouble.message
        ))),
    }
}

/// Seconds as a short human duration.
pub fn age(secs: Option<f64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120.0 => format!("{s:.1}s"),
        Some(s) if s < 7200.0 => format!("{:.1}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3600.0),
    }
}

/// The human-readable table.
pub fn table(s: &Status) -> String {
    let l = &s.ledger;
    let mut rows: Vec<(String, String)> = vec![
        ("ledger".into(), s.db.clone()),
        ("  claims".into(), l.claims.to_string()),
        (
            "  purged claims (tombstones)".into(),
            l.tombstones.to_string(),
        ),
        ("  disbursements".into(), l.disbursements.to_string()),
        (
            "  total disbursed".into(),
            format!(
                "{} ({} cents)",
                dollars(l.disbursed_cents_total),
                l.disbursed_cents_total
            ),
        ),
        (
            "  duplicates suppressed".into(),
            l.duplicates_suppressed.to_string(),
        ),
        ("  conflicts recorded".into(), l.conflicts.to_string()),
        ("  vanished entries recorded".into(), l.vanished.to_string()),
        ("  dead letters recorded".into(), l.dead_letters.to_string()),
        (
            "  outbox backlog".into(),
            format!(
                "{} (oldest {})",
                l.outbox_backlog,
                age(l.outbox_oldest_age_s)
            ),
        ),
        ("  audit records".into(), l.audit_records.to_string()),
    ];
    if let Some(h) = &s.held {
        rows.push((
            "  held conflicts awaiting review".into(),
            if h.awaiting == 0 {
                "0".into()
            } else {
                format!(
                    "{} (claimgate dlq approve|reject ID --by --reason)",
                    h.awaiting
                )
            },
        ));
        for c in &h.oldest {
            rows.push((
                format!("    entry {}", c.entry_id),
                format!(
                    "award {}, held at {}",
                    c.award_id.as_deref().unwrap_or("-"),
                    c.held_at
                ),
            ));
        }
        if h.awaiting > h.oldest.len() as u64 {
            rows.push((
                "    …".into(),
                format!(
                    "{} more (claimgate dlq list)",
                    h.awaiting - h.oldest.len() as u64
                ),
            ));
        }
    }
    match &s.redis {
        Err(e) if e.unreachable => {
            rows.push(("redis".into(), format!("unreachable: {}", e.message)))
        }
        Err(e) => rows.push(("redis".into(), e.message.clone())),
        Ok(r) => {
            rows.push(("redis".into(), r.url.clone()));
            if let Some(v) = &r.sentinel {
                rows.push((
                    format!("  primary of {}", v.master),
                    format!("{} (named by sentinel {})", v.primary, v.sentinel),
                ));
                for replica in &v.replicas {
                    rows.push((
                        format!("    replica {}", replica.address),
                        format!(
                            "{}, {} bytes behind, last ack {}s ago",
                            replica.state, replica.lag_bytes, replica.lag_s
                        ),
                    ));
                }
            }
            rows.push((
                format!("  stream {}", r.stream),
                format!("{} entries", r.length),
            ));
            if r.group_exists {
                let lag = r
                    .lag
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "unknown".into());
                rows.push((
                    format!("  group {}", r.group),
                    format!("lag {lag}, pending {}", r.pending),
                ));
                rows.push((
                    "  oldest pending".into(),
                    match &r.oldest_pending_id {
                        Some(id) => format!("{id} ({} old)", age(r.oldest_pending_age_s)),
                        None => "-".into(),
                    },
                ));
                for c in &r.consumers {
                    rows.push((
                        format!("    consumer {}", c.name),
                        format!(
                            "pending {}, idle {}",
                            c.pending,
                            age(Some(c.idle_ms as f64 / 1000.0))
                        ),
                    ));
                }
            } else {
                rows.push((
                    format!("  group {}", r.group),
                    "not created yet (no worker has started)".into(),
                ));
            }
            rows.push((
                format!("  dead letters {}", r.dead_letter_stream),
                format!("{} entries", r.dead_letters),
            ));
        }
    }
    // Consumer names, replica addresses and error texts come from whoever can write to Redis
    // (any client may XREADGROUP under a name of its choosing): none may rewrite the
    // operator's terminal.
    let rows: Vec<(String, String)> = rows
        .iter()
        .map(|(k, v)| (controls(k).into_owned(), controls(v).into_owned()))
        .collect();
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

/// Seconds between the time encoded in a stream id and Redis' own clock.
fn id_age_s(conn: &mut Conn, id: &str) -> Result<Option<f64>> {
    let Some(id_ms) = id.split('-').next().and_then(|ms| ms.parse::<u64>().ok()) else {
        return Ok(None);
    };
    let (secs, micros): (u64, u64) = conn.query(&redis::cmd("TIME"))?;
    let now_ms = secs * 1000 + micros / 1000;
    Ok(Some(now_ms.saturating_sub(id_ms) as f64 / 1000.0))
}

/// A flat `[name, value, …]` reply (or RESP3 map) as a map.
fn fields(v: Value) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    if let Value::Map(pairs) = v {
        for (k, v) in pairs {
            if let Ok(k) = stream::string(k) {
                out.insert(k, v);
            }
        }
        return out;
    }
    let mut it = stream::array(v).unwrap_or_default().into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        if let Ok(k) = stream::string(k) {
            out.insert(k, v);
        }
    }
    out
}

fn text(m: &HashMap<String, Value>, key: &str) -> Option<String> {
    m.get(key).cloned().and_then(|v| stream::string(v).ok())
}

fn number(m: &HashMap<String, Value>, key: &str) -> u64 {
    m.get(key)
        .cloned()
        .and_then(|v| stream::int(v).ok())
        .unwrap_or(0)
        .max(0) as u64
}
