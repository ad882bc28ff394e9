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
//! [`POSITION_LUA`] is the one statement of that rule; the publish script and [`read`] both run it.

use crate::broker::stream::Conn;
use crate::error::Result;

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

#[cfg(test)]
mod tests {
    #[test]
    fn the_mark_lives_beside_its_events_stream() {
        // Operators, `restore` and earlier releases find it by this name.
        assert_eq!(super::key("grants:events"), "grants:events:published_upto");
    }
}
