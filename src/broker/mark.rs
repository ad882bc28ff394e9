//! Where the events stream stands: the relay's only position.
//!
//! Two things in Redis say how far a ledger's outbox has reached the events stream: the hash
//! `<events stream>:published_upto` (fields `ledger_id`, whose outbox ids these are, and `upto`)
//! and the stream itself, whose last entry carries the highest `event_id` published. The
//! relay's publish script (`relay.rs`) writes both in one atomic step, so they agree — unless
//! Redis lost writes it had acknowledged (a Sentinel promotion of a replica that was behind),
//! in which case both went back together, or something other than the relay wrote one of
//! them. The position is therefore read from both, in one script, and is the higher of the
//! mark's `upto` and the last entry's `event_id`: a mark that went back with its stream leaves
//! the relay to publish again exactly what the stream lost, and an event above a lagging mark
//! is never sent twice.
//!
//! Anything the relay did not write is refused, never guessed at: a mark missing a field or with
//! an `upto` that is not an integer, a last entry without an integer `event_id`, and a stream
//! holding events with no mark at all (no relay could tell whose they are).
//!
//! [`POSITION_LUA`] is the one statement of that rule; the publish script, [`read`] and
//! [`raise`] run it.
//!
//! [`history`] is what Redis itself says of the stream (`XINFO STREAM`): whether it exists, the
//! last id it ever generated, the highest id deleted from it, and how many entries were ever
//! added. It tells a stream that lost its newest entries with its data (its last entry is the
//! last it ever made) from one whose entries were deleted or trimmed after being added.

use crate::broker::stream::{self, Conn};
use crate::error::{Error, Result};
use redis::Value;

/// How far one ledger's outbox is on the events stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The ledger whose outbox ids the mark counts.
    pub ledger_id: String,
    /// Every outbox id at or below this is on the events stream: the higher of the mark's
    /// `upto` and the `event_id` of the stream's last entry.
    pub upto: i64,
}

/// The Redis key of the mark for `events_stream`.
pub fn key(events_stream: &str) -> String {
    format!("{events_stream}:published_upto")
}

/// Lua defining `position(events, mark)`, which returns the mark's owner (or `false` when there
/// is no mark and no event) and the position, or raises an error reply naming what it refused.
/// Scripts that need the position start with this text.
pub const POSITION_LUA: &str = r"
local function position(events, mark)
  local owner = redis.call('HGET', mark, 'ledger_id')
  local upto = redis.call('HGET', mark, 'upto')
  if (owner == false) ~= (upto == false) then
    error({err = 'MARKINCOMPLETE ' .. mark .. ' lacks its ledger_id or upto field; it was not written by the relay'})
  end
  if upto then
    upto = tonumber(upto)
    if not upto or upto ~= math.floor(upto) then
      error({err = 'MARKNOTANID ' .. mark .. ': upto is not an outbox id; it was not written by the relay'})
    end
  end
  local last = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)[1]
  if not last then
    return owner, upto or 0
  end
  if not owner then
    error({err = 'EVENTSUNMARKED ' .. events .. ' holds events but ' .. mark .. ' is missing, so no relay can tell which ledger published them; move that stream aside (RENAME) or point --events-stream elsewhere'})
  end
  local event_id
  local fields = last[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'event_id' then
      event_id = tonumber(fields[i + 1])
    end
  end
  if not event_id or event_id ~= math.floor(event_id) then
    error({err = 'NOTANEVENT ' .. events .. ': its last entry ' .. last[1] .. ' has no integer event_id; it was not written by the relay'})
  end
  if event_id > upto then
    upto = event_id
  end
  return owner, upto
end
";

/// Reads the position of `events_stream`: `None` when no relay has published to it yet
/// (no mark, no events). Anything the relay could not have written is a permanent error
/// naming it (see the module doc).
pub fn read(conn: &mut Conn, events_stream: &str) -> Result<Option<Mark>> {
    let script = redis::Script::new(&format!(
        "{POSITION_LUA}\nlocal owner, upto = position(KEYS[1], KEYS[2])\n\
         if not owner then return false end\nreturn {{owner, string.format('%d', upto)}}"
    ));
    let mut inv = script.prepare_invoke();
    inv.key(events_stream).key(key(events_stream));
    let found: Option<(String, i64)> = conn.invoke(&inv)?;
    Ok(found.map(|(ledger_id, upto)| Mark { ledger_id, upto }))
}

/// Raises the mark of `events_stream` for ledger `ledger_id` to `upto` unless the position is
/// there already (never lowers it); returns the position after. For an operator's
/// `--republish-from`: the ids below it are to be left out. Another ledger's mark is refused
/// (`LEDGERMISMATCH`), as the publish script refuses it.
pub fn raise(conn: &mut Conn, events_stream: &str, ledger_id: &str, upto: i64) -> Result<i64> {
    let script = redis::Script::new(&format!(
        "{POSITION_LUA}
local owner, upto = position(KEYS[1], KEYS[2])
if owner and owner ~= ARGV[1] then
  return redis.error_reply('LEDGERMISMATCH ' .. KEYS[2] .. ' belongs to ledger ' .. owner)
end
local target = tonumber(ARGV[2])
if target > upto then
  redis.call('HSET', KEYS[2], 'ledger_id', ARGV[1], 'upto', ARGV[2])
  upto = target
end
return string.format('%d', upto)"
    ));
    let mut inv = script.prepare_invoke();
    inv.key(events_stream)
        .key(key(events_stream))
        .arg(ledger_id)
        .arg(upto);
    let raised: String = conn.invoke(&inv)?;
    raised.parse().map_err(|_| {
        Error::Other(format!(
            "raising {} returned {raised:?}",
            key(events_stream)
        ))
    })
}

/// What Redis says of a stream's history (`XINFO STREAM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// Entries in it now.
    pub length: u64,
    /// The last id it ever generated, its entry deleted or not.
    pub last_generated: String,
    /// The highest id deleted from it (Redis 7; `0-0` for none, or on older servers).
    pub max_deleted: String,
    /// How many entries were ever added (Redis 7; `None` on older servers).
    pub entries_added: Option<u64>,
    /// Its last entry's id, if it has one.
    pub last_entry: Option<String>,
}

impl History {
    /// True when entries were removed from its end: its last entry is not the last it ever
    /// generated (or it has none, and generated some). A stream that lost its newest entries
    /// with the rest of Redis's data (a failover to a replica that was behind) never says so:
    /// its history lost them too.
    pub fn end_removed(&self) -> bool {
        match &self.last_entry {
            Some(last) => id_order(&self.last_generated) > id_order(last),
            None => self.last_generated != "0-0",
        }
    }
}

/// A stream id as two numbers, for comparing.
fn id_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// [`History`] of `stream`, or `None` when there is no such key.
pub fn history(conn: &mut Conn, stream_key: &str) -> Result<Option<History>> {
    let reply: Value = match conn.query(redis::cmd("XINFO").arg("STREAM").arg(stream_key)) {
        Ok(v) => v,
        Err(Error::Redis(e)) if e.to_string().contains("no such key") => return Ok(None),
        Err(e) => return Err(stream::naming_key(e, stream_key)),
    };
    let mut h = History {
        length: 0,
        last_generated: "0-0".into(),
        max_deleted: "0-0".into(),
        entries_added: None,
        last_entry: None,
    };
    let fields: Vec<(Value, Value)> = match reply {
        Value::Map(m) => m,
        other => {
            let flat = stream::array(other)?;
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
    };
    for (name, value) in fields {
        match stream::string(name)?.as_str() {
            "length" => h.length = stream::int(value)?.max(0) as u64,
            "last-generated-id" => h.last_generated = stream::string(value)?,
            "max-deleted-entry-id" => h.max_deleted = stream::string(value)?,
            "entries-added" => h.entries_added = Some(stream::int(value)?.max(0) as u64),
            "last-entry" => {
                h.last_entry = match value {
                    Value::Nil => None,
                    v => stream::array(v)?
                        .into_iter()
                        .next()
                        .map(stream::string)
                        .transpose()?,
                }
            }
            _ => {}
        }
    }
    Ok(Some(h))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mark_lives_beside_its_events_stream() {
        // Operators, `restore` and earlier releases find it by this name.
        assert_eq!(super::key("grants:events"), "grants:events:published_upto");
    }

    #[test]
    fn a_stream_whose_end_was_deleted_says_so_and_one_that_lost_it_with_its_history_does_not() {
        let h = |last_generated: &str, last: Option<&str>| super::History {
            length: u64::from(last.is_some()),
            last_generated: last_generated.into(),
            max_deleted: "0-0".into(),
            entries_added: None,
            last_entry: last.map(Into::into),
        };
        assert!(!h("5-3", Some("5-3")).end_removed());
        assert!(h("5-4", Some("5-3")).end_removed());
        assert!(h("10-0", Some("9-9")).end_removed());
        assert!(h("5-0", None).end_removed(), "emptied");
        assert!(!h("0-0", None).end_removed(), "never held anything");
    }
}
