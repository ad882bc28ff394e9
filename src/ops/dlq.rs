//! `claimgate dlq`: dead letters an operator can work — list them, show one, replay one.
//!
//! A dead letter is never removed or edited here: it stays in `<stream>:dead` as evidence. A
//! replay copies its original fields back onto the submissions stream as a new entry and marks
//! the dead letter replayed in the hash `<stream>:dead:replayed` (dead-letter id → new entry id),
//! both inside one Lua script, so two operators replaying the same dead letter at once still
//! produce one new entry. A replayed submission that the ledger already holds is an ordinary
//! duplicate: the ledger, not this module, is what prevents a second disbursement.
//!
//! This module talks to Redis, and opens the ledger only to say what a reviewer decided of a
//! conflict held for review (`dlq list`, `dlq show`). (`dlq reconcile`, which reads the
//! ledger's dead-letter records, is `ops/reconcile.rs`; `dlq approve` and `dlq reject`, which
//! decide a held conflict in the ledger, are `ops/review.rs`; both run from `cli/ops.rs`.)

use crate::broker::dead_letter::{dead_index_key, DEAD_LETTER_PREFIX_BYTES, ORIGINAL_FIELD_PREFIX};
use crate::broker::stream::{self, Conn};
use crate::config::{Config, PAYLOAD_BYTES_MAX_DEFAULT};
use crate::domain::submission::{award_id_hint, PAYLOAD_FIELD};
use crate::error::{Error, Result};
use crate::support::escape;
use redis::Value;
use serde::Serialize;
use std::io::Write;

/// Dead letters fetched per XRANGE page. Listing streams page by page and keeps no page once
/// printed, so memory stays bounded by one page whatever the stream's length (dead letters
/// can carry oversize payloads, so a page is kept small).
const LIST_PAGE_ENTRIES_MAX: usize = 100;

/// Flags of `claimgate dlq`.
#[derive(Debug, clap::Args)]
pub struct DlqArgs {
    /// What to do with the dead letters.
    #[command(subcommand)]
    pub command: DlqCommand,
}

/// The `dlq` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum DlqCommand {
    /// List dead letters: id, time, award id where known, reason, whether it was replayed and,
    /// for a conflict held for review, whether a reviewer decided it.
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with all its fields (ID: the dead-letter id, or the original entry
    /// id) and, for a conflict held for review, the ledger's decision.
    Show {
        /// The dead-letter entry id (or the original submission entry id).
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Put a dead letter's original fields back on the submissions stream, once.
    Replay {
        /// The dead-letter entry id (or the original submission entry id).
        id: String,
        /// Replay it even though it is still malformed as it stands (the worker's own limits
        /// may differ from the defaults it is checked against here).
        #[arg(long)]
        anyway: bool,
    },
    /// Copy again every dead letter the ledger records but the dead-letter stream lacks (after
    /// a Redis failover lost some); never copies one entry twice.
    Reconcile,
    /// Approve a conflict held for review (run --on-conflict hold): pay it once, exactly as a
    /// new submission, and record who approved it and why, in one ledger transaction.
    ///
    /// The entry is read from the dead-letter stream and paid only if it is the submission the
    /// ledger held (the same idempotency key): claim, disbursement, outbox row for the relay,
    /// `processed` and `conflict` records, and a `conflict_approved` record naming who and why.
    /// A letter is decided once: deciding it again, at once or later, is refused naming the
    /// earlier decision, and any dead letter that is not a held conflict is refused naming its
    /// reason. Exit 2 for a missing, empty, over-long or multi-line --by or --reason.
    Approve(DecideArgs),
    /// Reject a conflict held for review: nothing is paid; record who rejected it and why.
    ///
    /// Leaves a `conflict_rejected` record naming who and why, and the decision on the ledger's
    /// dead-letter row; the letter stays in the dead-letter stream as evidence. Decided once,
    /// as for approve.
    Reject(DecideArgs),
}

/// Flags of `dlq approve` and `dlq reject`.
#[derive(Debug, Clone, clap::Args)]
pub struct DecideArgs {
    /// The held conflict's dead-letter entry id (or its original submission entry id).
    pub id: String,
    /// Who decides (a name the audit trail keeps; one line, at most 128 characters).
    #[arg(long, value_name = "WHO", value_parser = reviewer_name)]
    pub by: String,
    /// Why (kept in the audit trail; one line, at most 1000 characters).
    #[arg(long, value_name = "WHY", value_parser = reviewer_reason)]
    pub reason: String,
}

/// `--by`: non-empty, one line, bounded.
fn reviewer_name(text: &str) -> std::result::Result<String, String> {
    reviewer_text(text, crate::config::REVIEW_BY_CHARS_MAX)
}

/// `--reason`: non-empty, one line, bounded.
fn reviewer_reason(text: &str) -> std::result::Result<String, String> {
    reviewer_text(text, crate::config::REVIEW_REASON_CHARS_MAX)
}

/// Text a reviewer gives, kept whole in the audit trail: refused when empty (or only spaces),
/// longer than `chars_max` characters, or holding anything `escape::controls` would escape (a
/// control character, a line separator, a character that reorders text), which would let it
/// forge lines or hide words wherever it is shown.
fn reviewer_text(text: &str, chars_max: usize) -> std::result::Result<String, String> {
    if text.trim().is_empty() {
        return Err("must not be empty".into());
    }
    let chars = text.chars().count();
    if chars > chars_max {
        return Err(format!("is {chars} characters; at most {chars_max}"));
    }
    if let std::borrow::Cow::Owned(shown) = escape::controls(text) {
        return Err(format!(
            "holds a control or formatting character ({shown}); give one line of plain text"
        ));
    }
    Ok(text.to_owned())
}

/// One entry of the dead-letter stream as an operator sees it (the worker wrote it as a
/// `broker::stream::DeadLetterCopy`).
#[derive(Debug, Clone, Serialize)]
pub struct Letter {
    /// Its id in the dead-letter stream.
    pub id: String,
    /// The id the entry had on the submissions stream.
    pub original_id: Option<String>,
    /// When it was dead-lettered (RFC 3339), as the worker wrote it.
    pub dead_lettered_at: Option<String>,
    /// Short class of the problem, e.g. `not_json` or `max_deliveries`.
    pub reason_code: Option<String>,
    /// The reason in words.
    pub reason: Option<String>,
    /// The award, where the payload still names one.
    pub award_id: Option<String>,
    /// Deliveries the entry had when it was dead-lettered.
    pub deliveries: Option<u64>,
    /// The new submissions entry id if it was replayed.
    pub replayed_as: Option<String>,
    /// For a conflict held for review: what the ledger says a reviewer decided (`None` for
    /// every other letter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Every field of the dead-letter entry, in stream order (values shown as lossy UTF-8).
    #[serde(skip)]
    pub fields: Vec<(String, String)>,
}

impl Letter {
    /// The entry's fields as the worker read them (the letter's `original.*` fields, prefix
    /// removed): what a replay puts back and what a reviewer's decision parses.
    pub fn original_fields(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.fields
            .iter()
            .filter_map(|(name, value)| {
                name.strip_prefix(ORIGINAL_FIELD_PREFIX)
                    .map(|n| (n.as_bytes().to_vec(), value.as_bytes().to_vec()))
            })
            .collect()
    }
}

/// A held conflict's decision as `dlq list` and `dlq show` report it, read from the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Decision {
    /// No decision yet: `dlq approve` or `dlq reject` it.
    Awaiting,
    /// Decided (`verdict` approved or rejected) by `by` at `at`, for `reason`.
    Decided(crate::ledger::PastDecision),
    /// The ledger holds no dead letter of this entry (another ledger's stream, or lost).
    NotInLedger,
    /// The ledger says it is not a held conflict (its reason code there).
    NotHeld {
        /// The ledger's reason code.
        reason_code: String,
    },
    /// The ledger could not be read: why.
    Unknown {
        /// The error.
        error: String,
    },
}

impl Decision {
    /// How a decision reads on one line.
    pub fn words(&self) -> String {
        match self {
            Decision::Awaiting => "awaiting review (dlq approve / dlq reject)".into(),
            Decision::Decided(p) => format!(
                "{} by {} at {}: {}",
                p.verdict.as_str(),
                p.by,
                p.at,
                p.reason
            ),
            Decision::NotInLedger => "not recorded in the ledger".into(),
            Decision::NotHeld { reason_code } => {
                format!("the ledger records it as {reason_code}, not a held conflict")
            }
            Decision::Unknown { error } => format!("unknown (ledger unreadable: {error})"),
        }
    }
}

/// The ledger, opened the first time a held conflict's decision is asked for, and kept.
#[derive(Default)]
struct Decisions {
    /// The ledger, or why it could not be opened.
    ledger: Option<std::result::Result<Box<dyn crate::ledger::Backend>, String>>,
}

impl Decisions {
    /// Fills in `d.decision` when `d` is a held conflict (the Redis copy says so).
    fn fill(&mut self, cfg: &Config, d: &mut Letter) {
        if d.reason_code.as_deref() != Some(crate::ledger::CONFLICT_HOLD) {
            return;
        }
        let Some(original) = d.original_id.clone() else {
            return;
        };
        let ledger = self.ledger.get_or_insert_with(|| {
            let mut lcfg = crate::config::LedgerConfig::at(cfg.db.clone());
            lcfg.create = false;
            crate::ledger::open(&lcfg).map_err(|e| e.to_string())
        });
        d.decision = Some(match ledger {
            Err(e) => Decision::Unknown { error: e.clone() },
            Ok(l) => match l.letter_state(&cfg.stream, &original) {
                Err(e) => Decision::Unknown {
                    error: e.to_string(),
                },
                Ok(s) => Decision::of(s),
            },
        });
    }
}

impl Decision {
    /// The decision a ledger's letter state reports.
    pub fn of(state: crate::ledger::LetterState) -> Decision {
        use crate::ledger::LetterState;
        match state {
            LetterState::Unknown => Decision::NotInLedger,
            LetterState::NotHeld { reason_code } => Decision::NotHeld { reason_code },
            LetterState::Awaiting { .. } => Decision::Awaiting,
            LetterState::Decided(p) => Decision::Decided(p),
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Replayed now, as this new submissions entry id.
    Replayed(String),
    /// Refused: it had already been replayed, as this entry id.
    AlreadyReplayed(String),
}

/// Runs `claimgate dlq ...`.
pub fn run(cfg: &Config, args: DlqArgs) -> Result<()> {
    let mut conn = Conn::new(stream::client(&cfg.redis_url)?);
    let mut out = std::io::stdout().lock();
    match args.command {
        DlqCommand::List { json } => {
            // JSON is written as an array one element at a time, so it streams like the table.
            let mut count = 0u64;
            if json {
                write!(out, "[").ok();
            }
            let mut decisions = Decisions::default();
            for_each(&mut conn, cfg, |d| {
                let mut d = d.clone();
                decisions.fill(cfg, &mut d);
                let d = &d;
                let line = if json {
                    let sep = if count == 0 { "\n  " } else { ",\n  " };
                    format!("{sep}{}", serde_json::to_string(d).expect("serializable"))
                } else {
                    format!("{}\n", summary_line(d))
                };
                count += 1;
                write!(out, "{line}").ok();
            })?;
            if json {
                writeln!(out, "{}]", if count == 0 { "" } else { "\n" }).ok();
            } else {
                writeln!(out, "{count} dead letters on {}", cfg.dead_stream()).ok();
            }
            Ok(())
        }
        DlqCommand::Show { id, json } => {
            let mut d = find(&mut conn, cfg, &id)?.ok_or_else(|| not_found(cfg, &id))?;
            Decisions::default().fill(cfg, &mut d);
            if json {
                let mut doc = serde_json::to_value(&d).expect("serializable");
                // Pairs, not a map: an entry dead-lettered for two payload fields must show both.
                doc["fields"] = serde_json::to_value(&d.fields).expect("serializable");
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&doc).expect("serializable")
                )
                .ok();
                return Ok(());
            }
            writeln!(out, "dead letter {} on {}", d.id, cfg.dead_stream()).ok();
            // Names and values are a producer's bytes: escaped, so none can clear the screen
            // or start a line of its own (a forged `replayed: yes`).
            for (name, value) in &d.fields {
                writeln!(
                    out,
                    "  {}: {}",
                    escape::controls(name),
                    escape::controls(value)
                )
                .ok();
            }
            let replayed = d
                .replayed_as
                .as_deref()
                .map(|r| format!("yes, as {r}"))
                .unwrap_or_else(|| "no".into());
            writeln!(out, "  replayed: {replayed}").ok();
            if let Some(decision) = &d.decision {
                writeln!(out, "  decision: {}", escape::controls(&decision.words())).ok();
            }
            if d.fields
                .iter()
                .any(|(k, _)| k == "original_fields_truncated")
            {
                writeln!(out, "  note: oversize field(s) kept as size, SHA-1 and first {DEAD_LETTER_PREFIX_BYTES} bytes only; not replayable, have the producer re-send the entry fixed").ok();
            }
            Ok(())
        }
        DlqCommand::Replay { id, anyway } => {
            let d = find(&mut conn, cfg, &id)?.ok_or_else(|| not_found(cfg, &id))?;
            if let (Some(why), false) = (still_malformed(&d), anyway) {
                return Err(Error::Other(format!(
                    "dead letter {} is still malformed as it stands ({why}): replayed unchanged, \
                     it would be dead-lettered again. Have the producer send it fixed (dlq show \
                     {} names the original), or, if the worker's limits differ from the \
                     defaults, replay it with --anyway",
                    d.id, d.id
                )));
            }
            match replay(&mut conn, cfg, &d.id)? {
                Replay::Replayed(new_id) => {
                    let original = d.original_id.as_deref().unwrap_or("?");
                    writeln!(out, "replayed dead letter {} (original entry {original}) as {new_id} on {}", d.id, cfg.stream).ok();
                    Ok(())
                }
                Replay::AlreadyReplayed(prior) => Err(Error::Other(format!(
                    "dead letter {} was already replayed as {prior} on {}; refusing to replay it twice",
                    d.id, cfg.stream
                ))),
            }
        }
        DlqCommand::Reconcile | DlqCommand::Approve(_) | DlqCommand::Reject(_) => {
            unreachable!("cli::dispatch sends dlq reconcile, approve and reject to cli::ops")
        }
    }
}

/// Why the dead letter's original fields, put back as they are, would be dead-lettered again
/// (checked against the default limits, as a worker would check them); `None` when they are a
/// valid submission (a letter past the delivery cap, one held for review, one fixed by a
/// higher limit since).
fn still_malformed(d: &Letter) -> Option<String> {
    // A letter that kept only part of its entry cannot be put back at all; the replay script
    // refuses it with that reason, which is the one the operator needs.
    if d.fields
        .iter()
        .any(|(k, _)| k == "original_fields_truncated" || k == "original_fields_omitted")
    {
        return None;
    }
    let original = d.original_fields();
    let limits = crate::domain::submission::Limits {
        payload_bytes_max: crate::config::PAYLOAD_BYTES_MAX_DEFAULT,
        amount_cents_max: crate::config::AMOUNT_CENTS_MAX_DEFAULT,
    };
    crate::domain::submission::parse_entry(&original, &limits)
        .err()
        .map(|m| m.to_string())
}

/// The hash that marks dead letters replayed: dead-letter id → new submissions entry id.
pub fn replayed_key(dead_stream: &str) -> String {
    format!("{dead_stream}:replayed")
}

/// Calls `f` on every dead letter, oldest first, reading one page at a time.
pub fn for_each(conn: &mut Conn, cfg: &Config, mut f: impl FnMut(&Letter)) -> Result<()> {
    let dead = cfg.dead_stream();
    let mut start = "-".to_owned();
    loop {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&dead)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(LIST_PAGE_ENTRIES_MAX);
        let reply = conn.query(&cmd).map_err(|e| stream::naming_key(e, &dead))?;
        let mut page = parse_entries(reply)?;
        mark_replayed(conn, &dead, &mut page)?;
        page.iter().for_each(&mut f);
        match page.last() {
            Some(last) if page.len() == LIST_PAGE_ENTRIES_MAX => start = format!("({}", last.id),
            _ => return Ok(()),
        }
    }
}

/// The dead letter with dead-letter id `id`, or failing that the one made from original entry
/// `id`; `None` if neither exists.
pub fn find(conn: &mut Conn, cfg: &Config, id: &str) -> Result<Option<Letter>> {
    if !is_stream_id(id) {
        return Err(Error::Config(format!(
            "{id:?} is not a stream entry id (expected MS-SEQ, e.g. 1700000000000-0)"
        )));
    }
    let dead = cfg.dead_stream();
    let mut found = fetch(conn, &dead, id)?;
    if found.is_none() {
        let by_original: Option<String> =
            conn.query(redis::cmd("HGET").arg(dead_index_key(&dead)).arg(id))?;
        if let Some(dead_id) = by_original {
            found = fetch(conn, &dead, &dead_id)?;
        }
    }
    let mut found: Vec<Letter> = found.into_iter().collect();
    mark_replayed(conn, &dead, &mut found)?;
    Ok(found.pop())
}

/// Replays dead letter `dead_id` (which must exist) onto the submissions stream, unless it was
/// replayed before. Check, copy and mark happen in one script, so they cannot interleave with
/// another replay of the same dead letter.
pub fn replay(conn: &mut Conn, cfg: &Config, dead_id: &str) -> Result<Replay> {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        redis::Script::new(
            r"
            local prior = redis.call('HGET', KEYS[2], ARGV[1])
            if prior then return {'already', prior} end
            local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
            if #found == 0 then return {'missing', ''} end
            local fields = found[1][2]
            local prefix_len = string.len(ARGV[2])
            local out = {}
            for i = 1, #fields, 2 do
              local name = fields[i]
              if name == 'original_fields_omitted' then return {'incomplete', fields[i + 1]} end
              if name == 'original_fields_truncated' then return {'truncated', fields[i + 1]} end
              if string.sub(name, 1, prefix_len) == ARGV[2] then
                out[#out + 1] = string.sub(name, prefix_len + 1)
                out[#out + 1] = fields[i + 1]
              end
            end
            if #out == 0 then return {'empty', ''} end
            local id = redis.call('XADD', KEYS[3], '*', unpack(out))
            redis.call('HSET', KEYS[2], ARGV[1], id)
            return {'replayed', id}
            ",
        )
    });
    let dead = cfg.dead_stream();
    let mut inv = script.prepare_invoke();
    inv.key(&dead)
        .key(replayed_key(&dead))
        .key(&cfg.stream)
        .arg(dead_id)
        .arg(ORIGINAL_FIELD_PREFIX);
    let reply: Vec<String> = conn.invoke(&inv)?;
    let (status, value) = match reply.as_slice() {
        [status, value] => (status.as_str(), value.clone()),
        _ => {
            return Err(Error::Other(format!(
                "unexpected reply from the replay script: {reply:?}"
            )))
        }
    };
    match status {
        "replayed" => Ok(Replay::Replayed(value)),
        "already" => Ok(Replay::AlreadyReplayed(value)),
        "missing" => Err(Error::Other(format!("no dead letter {dead_id} on {dead}"))),
        "incomplete" => Err(Error::Other(format!(
            "dead letter {dead_id} kept only part of its entry ({value} fields omitted); replay it by hand from the source"
        ))),
        "truncated" => Err(Error::Other(format!(
            "dead letter {dead_id} kept only the size, SHA-1 and first bytes of {value} oversize field(s), not the original; it cannot be replayed: have the producer re-send the entry fixed"
        ))),
        _ => Err(Error::Other(format!("dead letter {dead_id} holds no original fields to replay"))),
    }
}

fn not_found(cfg: &Config, id: &str) -> Error {
    Error::Other(format!(
        "no dead letter {id} on {} (neither a dead-letter id nor an original entry id)",
        cfg.dead_stream()
    ))
}

/// A stream id as XRANGE accepts it: `MS` or `MS-SEQ`, digits only.
fn is_stream_id(id: &str) -> bool {
    let mut parts = id.splitn(2, '-');
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    parts.next().is_some_and(digits) && parts.next().is_none_or(digits)
}

fn fetch(conn: &mut Conn, dead: &str, id: &str) -> Result<Option<Letter>> {
    let reply = conn
        .query(redis::cmd("XRANGE").arg(dead).arg(id).arg(id))
        .map_err(|e| stream::naming_key(e, dead))?;
    Ok(parse_entries(reply)?.into_iter().next())
}

/// Fills in `replayed_as` for each dead letter (at most a page) with one HMGET.
fn mark_replayed(conn: &mut Conn, dead: &str, letters: &mut [Letter]) -> Result<()> {
    if letters.is_empty() {
        return Ok(());
    }
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(replayed_key(dead));
    for d in letters.iter() {
        cmd.arg(&d.id);
    }
    let replayed: Vec<Option<String>> = conn.query(&cmd)?;
    for (d, r) in letters.iter_mut().zip(replayed) {
        d.replayed_as = r;
    }
    Ok(())
}

fn parse_entries(reply: Value) -> Result<Vec<Letter>> {
    let mut out = Vec::new();
    for item in stream::array(reply)? {
        let mut parts = stream::array(item)?.into_iter();
        let id = stream::string(parts.next().unwrap_or(Value::Nil))?;
        let raw = stream::pairs(parts.next().unwrap_or(Value::Nil))?;
        out.push(letter_of(id, &raw));
    }
    Ok(out)
}

/// Reads the worker's fields (see `stream::DeadLetterCopy`) out of one dead-letter entry.
fn letter_of(id: String, raw: &[(Vec<u8>, Vec<u8>)]) -> Letter {
    let get = |name: &str| {
        raw.iter()
            .find(|(k, _)| k == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    };
    let text = |name: &str| get(name).map(|v| String::from_utf8_lossy(v).into_owned());
    let payload_field = [ORIGINAL_FIELD_PREFIX.as_bytes(), PAYLOAD_FIELD].concat();
    let payload = raw
        .iter()
        .find(|(k, _)| *k == payload_field)
        .map(|(_, v)| v.as_slice());
    Letter {
        original_id: text("original_id"),
        dead_lettered_at: text("dead_lettered_at"),
        reason_code: text("reason_code"),
        reason: text("reason"),
        award_id: payload.and_then(|p| award_id_hint(p, PAYLOAD_BYTES_MAX_DEFAULT)),
        deliveries: text("deliveries").and_then(|d| d.parse().ok()),
        replayed_as: None,
        decision: None,
        fields: raw
            .iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect(),
        id,
    }
}

/// One line of `dlq list`: id, time, award, reason, replay mark.
fn summary_line(d: &Letter) -> String {
    let dash = || "-".to_owned();
    let reason = match (&d.reason_code, &d.reason) {
        (Some(code), Some(reason)) => format!("{code}: {reason}"),
        (None, Some(reason)) => reason.clone(),
        (Some(code), None) => code.clone(),
        (None, None) => dash(),
    };
    let mut replayed = d
        .replayed_as
        .as_deref()
        .map(|r| format!("  [replayed as {r}]"))
        .unwrap_or_default();
    match &d.decision {
        None => {}
        Some(Decision::Decided(p)) => replayed.push_str(&format!(
            "  [{} by {} at {}]",
            p.verdict.as_str(),
            p.by,
            p.at
        )),
        Some(other) => replayed.push_str(&format!("  [{}]", other.words())),
    }
    // One line per dead letter, whatever a producer put in its award id or reason.
    let line = format!(
        "{}  {}  award={}  {reason}{replayed}",
        d.id,
        d.dead_lettered_at.clone().unwrap_or_else(dash),
        d.award_id.clone().unwrap_or_else(dash)
    );
    escape::controls(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reviewers_name_and_reason_are_one_bounded_line_of_plain_text() {
        assert_eq!(
            reviewer_text("Ann Auditor", 128).as_deref(),
            Ok("Ann Auditor")
        );
        assert_eq!(
            reviewer_text(&"é".repeat(128), 128).map(|t| t.len()),
            Ok(256)
        );
        for bad in [
            "",
            "   ",
            "a\nb",
            "a\tb",
            "a\u{1b}[2Jb",
            "a\u{2028}b",
            "a\u{202e}b",
        ] {
            assert!(reviewer_text(bad, 128).is_err(), "{bad:?}");
        }
        assert!(reviewer_text(&"é".repeat(129), 128)
            .unwrap_err()
            .contains("at most 128"));
    }

    #[test]
    fn only_stream_ids_are_accepted() {
        for ok in ["0", "0-0", "1700000000000-12"] {
            assert!(is_stream_id(ok), "{ok}");
        }
        for bad in [
            "",
            "-",
            "1-",
            "-1",
            "abc",
            "1-2-3",
            "1700000000000-x",
            "+",
            "99999999999999999999999",
        ] {
            assert!(!is_stream_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_dead_letter_names_its_award_and_reason() {
        let raw: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"original_id".to_vec(), b"5-0".to_vec()),
            (
                b"reason".to_vec(),
                b"max deliveries exceeded (6 > 5)".to_vec(),
            ),
            (b"reason_code".to_vec(), b"max_deliveries".to_vec()),
            (b"deliveries".to_vec(), b"6".to_vec()),
            (
                b"dead_lettered_at".to_vec(),
                b"2026-07-01T09:00:00.000000Z".to_vec(),
            ),
            (
                b"original.payload".to_vec(),
                br#"{"award_id":"A-7","amount_cents":1}"#.to_vec(),
            ),
        ];
        let d = letter_of("9-0".into(), &raw);
        assert_eq!(d.award_id.as_deref(), Some("A-7"));
        assert_eq!(d.deliveries, Some(6));
        assert_eq!(
            summary_line(&d),
            "9-0  2026-07-01T09:00:00.000000Z  award=A-7  max_deliveries: max deliveries exceeded (6 > 5)"
        );
    }
}
