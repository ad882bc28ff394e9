//! The load: seeded valid submissions, byte-identical duplicates and malformed entries of every
//! class, and the producer that XADDs them while the nemesis is at work.
//!
//! Entries are added with explicit ids (`ID_MS-<index>`), so the producer can resume exactly
//! after a Redis restart: whatever the last id in the stream is, everything up to it was added
//! once and nothing after it was. A retried XADD can therefore never add an entry twice, and
//! every planned entry is on the stream exactly once.

use super::plan::{Plan, Size, PAYLOAD_BYTES_MAX};
use claimgate::domain::key::{derive_idempotency_key, IdempotencyKey};
use fastrand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The submissions stream.
pub const STREAM: &str = "grants:submissions";

/// The millisecond part of every planned entry id.
pub const ID_MS: u64 = 1_780_000_000_000;

/// Field/value pairs of one stream entry.
pub type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// One planned stream entry and what must become of it.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Its fields, exactly as XADDed.
    pub fields: Fields,
    /// Its fate.
    pub expect: Expect,
}

/// What must become of an entry.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Paid exactly once over all entries that carry this key.
    Valid {
        /// The idempotency key of its payload.
        key: IdempotencyKey,
        /// Its amount.
        amount_cents: i64,
        /// False for the first copy of a submission in stream order, true for later copies.
        duplicate: bool,
    },
    /// Dead-lettered exactly once with this reason code.
    Malformed {
        /// The expected `reason_code`.
        code: &'static str,
    },
}

/// The stream id of the entry at `index`.
pub fn entry_id(index: usize) -> String {
    format!("{ID_MS}-{index}")
}

/// The entries of a run in stream order: unique submissions, byte-identical copies of some of
/// them (`duplicate_percent`), and `malformed_per_variant` of each malformed variant, shuffled.
pub fn generate(rng: &mut Rng, size: &Size) -> Vec<Planned> {
    let uniques: Vec<Planned> = (0..size.unique_submissions)
        .map(|i| valid(rng, i))
        .collect();
    let copies = size.unique_submissions * size.duplicate_percent / 100;
    let mut entries: Vec<Planned> = (0..copies)
        .map(|_| uniques[rng.usize(0..uniques.len())].clone())
        .collect();
    entries.extend(uniques);
    for n in 0..size.malformed_per_variant {
        for (code, fields) in malformed_variants(rng, n) {
            entries.push(Planned {
                fields,
                expect: Expect::Malformed { code },
            });
        }
    }
    rng.shuffle(&mut entries);
    let mut seen = std::collections::HashSet::new();
    for e in &mut entries {
        if let Expect::Valid { key, duplicate, .. } = &mut e.expect {
            *duplicate = !seen.insert(*key);
        }
    }
    entries
}

/// A valid submission with a distinct award id, a random RFC 3339 timestamp in one of several
/// shapes, a random amount (now and then a very large one) and extra fields of random length.
fn valid(rng: &mut Rng, i: usize) -> Planned {
    let award_id = if rng.u8(..) < 8 {
        format!("Ä-{i:06}-ß")
    } else {
        format!("A-2026-{i:06}")
    };
    let timestamp = timestamp(rng);
    let amount_cents = if rng.u8(..) < 3 {
        rng.i64(1..=10_000_000_000)
    } else {
        rng.i64(1..=500_000)
    };
    let note_len = rng.usize(0..=120);
    let note: String = std::iter::repeat_with(|| rng.alphanumeric())
        .take(note_len)
        .collect();
    let program = ["rural-broadband", "clean-water", "school-meals"][rng.usize(0..3)];
    let payload = serde_json::json!({
        "award_id": award_id,
        "submission_timestamp": timestamp,
        "amount_cents": amount_cents,
        "program": program,
        "note": note,
    })
    .to_string()
    .into_bytes();
    let key = derive_idempotency_key(&award_id, &timestamp, &payload).expect("non-empty identity");
    Planned {
        fields: vec![(b"payload".to_vec(), payload)],
        expect: Expect::Valid {
            key,
            amount_cents,
            duplicate: false,
        },
    }
}

fn timestamp(rng: &mut Rng) -> String {
    let (mo, d, h, mi, s) = (
        rng.u8(1..=12),
        rng.u8(1..=28),
        rng.u8(0..24),
        rng.u8(0..60),
        rng.u8(0..60),
    );
    let base = format!("2026-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}");
    match rng.u8(0..4) {
        0 => format!("{base}Z"),
        1 => format!("{base}.{:03}Z", rng.u16(0..1000)),
        2 => format!("{base}+02:00"),
        _ => format!("{base}-05:30"),
    }
}

/// One entry of every malformed variant, with the reason code each must be dead-lettered with.
/// Each variant is unique to `n`, so no two dead letters look alike.
fn malformed_variants(rng: &mut Rng, n: usize) -> Vec<(&'static str, Fields)> {
    let ts = "2026-07-01T09:00:00Z";
    let award = format!("BAD-{n:04}-{}", rng.u32(..));
    let ok =
        format!(r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":100}}"#);
    let with = |body: String| vec![(b"payload".to_vec(), body.into_bytes())];
    let oversize = format!(
        r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":100,"note":"{}"}}"#,
        "x".repeat(PAYLOAD_BYTES_MAX + rng.usize(1..=1_000))
    );
    vec![
        (
            "missing_payload",
            vec![(b"body".to_vec(), ok.clone().into_bytes())],
        ),
        (
            "missing_payload",
            vec![(b"Payload".to_vec(), ok.clone().into_bytes())],
        ),
        (
            "ambiguous_payload",
            [with(ok.clone()), with(ok.clone())].concat(),
        ),
        ("payload_too_large", with(oversize)),
        ("not_json", with(format!("{{not json {award}"))),
        (
            "not_json",
            vec![(b"payload".to_vec(), vec![0xff, 0xfe, b'{', (n % 200) as u8])],
        ),
        (
            "not_json",
            vec![
                (b"payload".to_vec(), Vec::new()),
                (b"n".to_vec(), n.to_string().into_bytes()),
            ],
        ),
        ("not_an_object", with(format!("[1,2,{n}]"))),
        ("not_an_object", with(format!("\"{award}\""))),
        (
            "missing_field",
            with(format!(
                r#"{{"submission_timestamp":"{ts}","amount_cents":{}}}"#,
                n + 1
            )),
        ),
        (
            "missing_field",
            with(format!(r#"{{"award_id":"{award}","amount_cents":100}}"#)),
        ),
        (
            "missing_field",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}"}}"#
            )),
        ),
        (
            "wrong_type",
            with(format!(
                r#"{{"award_id":{n},"submission_timestamp":"{ts}","amount_cents":100}}"#
            )),
        ),
        (
            "wrong_type",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":1782900000,"amount_cents":100}}"#
            )),
        ),
        (
            "wrong_type",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":"100"}}"#
            )),
        ),
        (
            "empty_award_id",
            with(format!(
                r#"{{"award_id":"","submission_timestamp":"{ts}","amount_cents":{}}}"#,
                n + 1
            )),
        ),
        (
            "bad_timestamp",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"yesterday","amount_cents":100}}"#
            )),
        ),
        (
            "bad_timestamp",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"2026-07-01","amount_cents":100}}"#
            )),
        ),
        (
            "amount_not_positive",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":0}}"#
            )),
        ),
        (
            "amount_not_positive",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":-{}}}"#,
                n + 1
            )),
        ),
        (
            "amount_not_integer",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":1.5}}"#
            )),
        ),
        (
            "amount_not_integer",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":100.0}}"#
            )),
        ),
        (
            "amount_out_of_range",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":9223372036854775808}}"#
            )),
        ),
        (
            "amount_out_of_range",
            with(format!(
                r#"{{"award_id":"{award}","submission_timestamp":"{ts}","amount_cents":18446744073709551615}}"#
            )),
        ),
    ]
}

/// What the producer saw.
#[derive(Debug, Default)]
pub struct Produced {
    /// Entries added.
    pub entries: usize,
    /// Failed pipelines (Redis down or restarting), each resumed from the stream's last id.
    pub resumes: usize,
    /// When the last entry went in, after the chaos started.
    pub finished_after: Duration,
    /// Entries of the reserve added one at a time for processes still waiting for a fault.
    pub trickled: usize,
}

/// How often the producer adds one entry of the plan's reserve while the nemesis still waits
/// for a fault: about the time a worker takes to read, commit and block again, so entries
/// added one by one reach the blocked workers in turn (Redis serves blocked readers first come,
/// first served).
const TRICKLE_MS: u64 = 50;

/// XADDs the plan's chunks at their planned moments, then its reserve: one entry at a time
/// while `wants_load` says the nemesis still waits for a fault (an armed process short of its
/// failpoint, an event still aiming), the rest at once when it does not. Resumes after any Redis
/// failure and sets `done` when everything is on the stream.
pub fn produce(
    url: &str,
    plan: &Plan,
    start: Instant,
    wants_load: &AtomicBool,
    done: &AtomicBool,
) -> Produced {
    let mut producer = Producer {
        client: redis::Client::open(url).expect("redis url"),
        conn: None,
        entries: &plan.entries,
        start,
        produced: Produced::default(),
        sent: 0,
    };
    for chunk in &plan.chunks {
        let due = start + Duration::from_millis(chunk.at_ms);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        producer.send_to(chunk.end);
    }
    // A worker armed for its third read can find the planned load gone to the others (seen
    // once in CI: it waited out the grace time unfired); the reserve is what it reads then.
    while producer.sent < plan.entries.len() {
        if wants_load.load(Ordering::SeqCst) {
            producer.send_to(producer.sent + 1);
            producer.produced.trickled += 1;
            std::thread::sleep(Duration::from_millis(TRICKLE_MS));
        } else {
            producer.send_to(plan.entries.len());
        }
    }
    let mut produced = producer.produced;
    produced.entries = producer.sent;
    produced.finished_after = start.elapsed();
    done.store(true, Ordering::SeqCst);
    produced
}

/// The producer's connection and how far it got.
struct Producer<'p> {
    client: redis::Client,
    conn: Option<redis::Connection>,
    entries: &'p [Planned],
    start: Instant,
    produced: Produced,
    /// Entries on the stream: `entries[..sent]`.
    sent: usize,
}

impl Producer<'_> {
    /// Adds `entries[sent..end]`, resuming after the last one on the stream when Redis fails.
    fn send_to(&mut self, end: usize) {
        while self.sent < end {
            match add(&self.client, &mut self.conn, self.entries, self.sent, end) {
                Ok(()) => self.sent = end,
                Err(e) => {
                    self.produced.resumes += 1;
                    self.conn = None;
                    self.sent = resume_point(&self.client, e, self.start);
                }
            }
        }
    }
}

fn connect(client: &redis::Client) -> redis::RedisResult<redis::Connection> {
    let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(conn)
}

/// One pipelined XADD of `entries[from..to]`.
fn add(
    client: &redis::Client,
    conn: &mut Option<redis::Connection>,
    entries: &[Planned],
    from: usize,
    to: usize,
) -> redis::RedisResult<()> {
    if conn.is_none() {
        *conn = Some(connect(client)?);
    }
    let mut pipe = redis::pipe();
    for (i, e) in entries.iter().enumerate().take(to).skip(from) {
        let cmd = pipe.cmd("XADD").arg(STREAM).arg(entry_id(i));
        for (name, value) in &e.fields {
            cmd.arg(name.as_slice()).arg(value.as_slice());
        }
        cmd.ignore();
    }
    pipe.query(conn.as_mut().expect("connected"))
}

/// After a failed pipeline: waits for Redis to answer, then returns the index after the last
/// entry that made it onto the stream. Gives up (panics) only after a minute of no Redis.
fn resume_point(client: &redis::Client, first: redis::RedisError, start: Instant) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_err = first;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let reply: redis::RedisResult<Vec<(String, redis::Value)>> =
            connect(client).and_then(|mut c| {
                redis::cmd("XREVRANGE")
                    .arg(STREAM)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1)
                    .query(&mut c)
            });
        match reply {
            Ok(last) => {
                return match last.first() {
                    None => 0,
                    Some((id, _)) => {
                        let seq = id
                            .rsplit_once('-')
                            .and_then(|(_, s)| s.parse::<usize>().ok());
                        seq.unwrap_or_else(|| panic!("unexpected id {id} on {STREAM}")) + 1
                    }
                }
            }
            Err(e) => last_err = e,
        }
    }
    panic!(
        "producer: redis unreachable for a minute ({:?} into the run): {last_err}",
        start.elapsed()
    )
}
