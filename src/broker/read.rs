//! Reading entries with a byte budget, on the server: XREADGROUP, XAUTOCLAIM and XRANGE run
//! inside Lua scripts that send at most `budget` bytes of entries (by [`Entry::weight`]) and
//! cut down, on the server, any entry too large to read whole.
//!
//! # Why on the server
//!
//! Redis has no byte limit on a read: `XREADGROUP COUNT n` sends `n` entries whatever they
//! weigh, so a reader that sizes its COUNT from what it saw before meets a wall of heavy entries
//! with a read of all of them (issue 39: 400 entries of 900 KB after light ones, 377 MB). And
//! an entry's size cannot be asked without reading it. A script can: it reads inside Redis,
//! weighs what it read, and sends only what fits.
//!
//! - **Reads in steps.** Each script reads 1 entry, then 2, 4 … up to
//!   `READ_STEP_ENTRIES_MAX` per step, up to the read's COUNT, and stops at the first step that
//!   fills the budget; so Redis holds at most one step's entries in the script's memory, and
//!   delivers (moves into the pending list) at most one step beyond what fitted.
//! - **What did not fit is delivered but not sent.** An entry that the step delivered but that
//!   did not fit (and every entry after it, so the order read is the stream's) comes back as
//!   its id only ("held"): it is this consumer's, pending, with its delivery counted once, as
//!   `XREADGROUP` counts it. The reader fetches it next with [`fetch`] (XRANGE, which counts
//!   no delivery), so delivery counts, the pending list and ownership are exactly what
//!   `XREADGROUP` alone would leave.
//! - **Too large to read whole.** An entry with a value over `field_bytes_max`, more than
//!   `fields_max` fields, or over `entry_bytes_max` in all is sent cut ([`crate::broker::entry::Cut`]):
//!   its size, its field count, its payload's size, its largest field, and its first
//!   `CUT_FIELDS_SHOWN_MAX` fields, each whole up to `DEAD_LETTER_PREFIX_BYTES` and otherwise
//!   as its size, SHA-1 (`redis.sha1hex`, the only digest Redis's Lua has) and first bytes:
//!   what its dead letter keeps. At most one entry is cut per call (hashing one can take a
//!   second); a second one is held.
//! - **No BLOCK.** Redis refuses BLOCK inside a script, so an idle reader polls
//!   (`worker/reader.rs`).
//!
//! **Invariant:** a reply's entries weigh at most `budget` in all, or are one entry when the
//! budget is smaller than that entry (the caller asks only with room for the heaviest entry it
//! may meet, [`Limits::entry_weight_max`]); an entry over the limits never crosses the wire
//! whole; the entries a reply sends come before those it holds, in stream order.

use super::dead_letter::DEAD_LETTER_PREFIX_BYTES;
use super::entry::{
    Cut, Entry, PayloadSize, Summary, CUT_WEIGHT_BYTES, ENTRY_WEIGHT_BYTES, FIELD_WEIGHT_BYTES,
    SUMMARY_WEIGHT_BYTES,
};
use super::stream::{array, bytes, naming_key, pairs, string, Conn};
use crate::config::{
    CUT_FIELDS_SHOWN_MAX, CUT_NAME_BYTES_MAX, ENTRY_FIELDS_MAX, ENTRY_OVERHEAD_BYTES_MAX,
    READ_STEP_ENTRIES_MAX,
};
use crate::error::{Error, Result};
use redis::Value;
use std::sync::OnceLock;

/// What an entry may weigh and still be read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest value of any field (`--payload-bytes-max`).
    pub field_bytes_max: usize,
    /// The largest entry: its id and every field name and value together.
    pub entry_bytes_max: usize,
    /// The most fields.
    pub fields_max: usize,
}

impl Limits {
    /// The limits of a worker whose payloads may hold `payload_bytes_max` bytes: every field's
    /// value that much, the whole entry [`ENTRY_OVERHEAD_BYTES_MAX`] more, and at most
    /// [`ENTRY_FIELDS_MAX`] fields.
    pub fn for_payload(payload_bytes_max: usize) -> Limits {
        Limits {
            field_bytes_max: payload_bytes_max,
            entry_bytes_max: payload_bytes_max + ENTRY_OVERHEAD_BYTES_MAX,
            fields_max: ENTRY_FIELDS_MAX,
        }
    }

    /// The most one entry a script sends can weigh ([`Entry::weight`]), whole or cut: a read
    /// asked with less room than this might not fit the entry next in line.
    pub fn entry_weight_max(&self) -> usize {
        let whole =
            ENTRY_WEIGHT_BYTES + self.entry_bytes_max + self.fields_max * FIELD_WEIGHT_BYTES;
        // A stream id is at most 41 bytes ("<u64>-<u64>"); each shown field at most a name and
        // a prefix, and its overhead as a field or as a summary.
        let shown = CUT_NAME_BYTES_MAX + DEAD_LETTER_PREFIX_BYTES + SUMMARY_WEIGHT_BYTES;
        let cut = ENTRY_WEIGHT_BYTES
            + 41
            + CUT_WEIGHT_BYTES
            + CUT_NAME_BYTES_MAX
            + CUT_FIELDS_SHOWN_MAX * shown.max(FIELD_WEIGHT_BYTES);
        whole.max(cut)
    }

    /// The script arguments that carry these limits, the weights and `budget`, in the order the
    /// Lua `limits` function reads them.
    fn args(&self, budget: usize) -> [usize; LIMIT_ARGS] {
        [
            self.field_bytes_max,
            self.entry_bytes_max,
            self.fields_max,
            CUT_FIELDS_SHOWN_MAX,
            CUT_NAME_BYTES_MAX,
            DEAD_LETTER_PREFIX_BYTES,
            FIELD_WEIGHT_BYTES,
            ENTRY_WEIGHT_BYTES,
            CUT_WEIGHT_BYTES,
            SUMMARY_WEIGHT_BYTES,
            READ_STEP_ENTRIES_MAX,
            budget,
        ]
    }
}

/// How many arguments [`Limits::args`] passes.
const LIMIT_ARGS: usize = 12;

/// What one read returned.
#[derive(Debug, Default)]
pub struct Read {
    /// Entries sent, whole or cut, in stream order.
    pub entries: Vec<Entry>,
    /// Pending ids whose bodies are gone from the stream (trimmed or deleted).
    pub vanished: Vec<String>,
    /// Ids delivered to this consumer (or, for [`fetch`], asked for) whose bodies did not fit
    /// the budget, in stream order: to be fetched next.
    pub held: Vec<String>,
    /// The last id in the reply, whatever came of it: where a history read continues.
    pub last_id: Option<String>,
}

impl Read {
    /// Panics unless this reply keeps the scripts' promise (the module's invariant): at most
    /// `count_max` entries, weighing at most `budget` by [`Entry::weight`] in all, or one
    /// entry when the budget is smaller than it. The worker's memory bound rests on it.
    fn assert_within(&self, count_max: usize, budget: usize) {
        assert!(
            self.entries.len() <= count_max,
            "a read script sent {} entries, asked for at most {count_max}",
            self.entries.len()
        );
        let weight: usize = self.entries.iter().map(Entry::weight).sum();
        assert!(
            weight <= budget || self.entries.len() <= 1,
            "a read script sent {} entries weighing {weight} bytes, over its budget of {budget}",
            self.entries.len()
        );
    }
}

/// What one XAUTOCLAIM script returned.
#[derive(Debug, Default)]
pub struct AutoClaimed {
    /// Where the next call continues; `0-0` once the whole PEL has been scanned.
    pub next_cursor: String,
    /// What was claimed, as a [`Read`] (bodies, held ids, and on Redis before 7 nil bodies).
    pub read: Read,
    /// Ids that were pending but no longer exist; Redis 7 has already removed them from the PEL.
    pub deleted: Vec<String>,
}

/// The Lua every read script starts with: its limits, and `take`, which decides what of one
/// entry is sent: whole, cut, held (its id only), or vanished (a nil body).
const TAKE_LUA: &str = r"
local L = {}
local function limits(first)
  local names = {'field', 'entry', 'fields', 'shown', 'name', 'prefix', 'fw', 'ew', 'cw', 'sw', 'step', 'budget'}
  for i, name in ipairs(names) do L[name] = tonumber(ARGV[first + i - 1]) end
  return first + #names
end
local total, full, cut_made = 0, false, false

-- One pass over an entry: its weight as sent whole, and whether it is too large to send whole.
local function weigh(id, f)
  local n = #f / 2
  local w, size, too_large = L.ew + #id + L.fw * n, #id, n > L.fields
  for i = 1, #f, 2 do
    local k, v = #f[i], #f[i + 1]
    w = w + k + v
    size = size + k + v
    if v > L.field then too_large = true end
  end
  return w, too_large or size > L.entry
end

local function cut(id, f)
  local size, payloads, payload, largest, largest_name = #id, 0, 0, 0, ''
  for i = 1, #f, 2 do
    local v = #f[i + 1]
    size = size + #f[i] + v
    if f[i] == 'payload' then payloads = payloads + 1; payload = v end
    if v > largest then largest = v; largest_name = string.sub(f[i], 1, L.name) end
  end
  local whole, summaries = {}, {}
  local w = L.ew + #id + L.cw + #largest_name
  for i = 1, math.min(#f / 2, L.shown) * 2, 2 do
    local name, value = f[i], f[i + 1]
    if #name <= L.name and #value <= L.prefix then
      whole[#whole + 1] = name
      whole[#whole + 1] = value
      w = w + #name + #value + L.fw
    else
      local shown, prefix = string.sub(name, 1, L.name), string.sub(value, 1, L.prefix)
      for _, x in ipairs({shown, tostring(#name), tostring(#value), redis.sha1hex(value), prefix}) do
        summaries[#summaries + 1] = x
      end
      w = w + #shown + #prefix + L.sw
    end
  end
  local payload_size = 'none'
  if payloads == 1 then payload_size = tostring(payload) elseif payloads > 1 then payload_size = 'several' end
  return {id, 'cut', tostring(size), tostring(#f / 2), payload_size, largest_name, tostring(largest), whole, summaries}, w
end

-- What of entry `e` ({id, fields} as XREADGROUP, XAUTOCLAIM and XRANGE give it) is sent: `e`
-- itself (no new table for the common case), cut, held, or vanished.
local function take(e)
  local id, f = e[1], e[2]
  if not f then return {id} end
  if full then return {id, 'held'} end
  local item, w = e, 0
  local whole_w, too_large = weigh(id, f)
  if too_large then
    if cut_made then
      full = true
      return {id, 'held'}
    end
    item, w = cut(id, f)
    cut_made = true
  else
    w = whole_w
  end
  if total > 0 and total + w > L.budget then
    full = true
    return {id, 'held'}
  end
  total = total + w
  return item
end
";

/// XREADGROUP in steps. KEYS[1] stream; ARGV: group, consumer, start (`>` or an id after
/// which this consumer's pending history is read), count_max, then the limits.
const READ_LUA: &str = r"
local key, group, consumer, start = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local count_max = tonumber(ARGV[4])
limits(5)
local out, step = {}, 1
while #out < count_max and not full do
  local want = math.min(step, count_max - #out)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want, 'STREAMS', key, start)
  local got = (reply and reply[1][2]) or {}
  for _, e in ipairs(got) do out[#out + 1] = take(e) end
  if #got < want then break end
  if start ~= '>' then start = got[#got][1] end
  step = math.min(step * 2, L.step)
end
return out
";

/// XAUTOCLAIM in steps. KEYS[1] stream; ARGV: group, consumer, min idle ms, cursor,
/// count_max, then the limits. Stops after a step that claimed fewer than it asked for, as one
/// XAUTOCLAIM call would (each step scans at most ten times its COUNT of pending entries).
const CLAIM_LUA: &str = r"
local key, group, consumer, min_idle, cursor = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local count_max = tonumber(ARGV[5])
limits(6)
local out, deleted, step = {}, {}, 1
while #out < count_max and not full do
  local want = math.min(step, count_max - #out)
  local r = redis.call('XAUTOCLAIM', key, group, consumer, min_idle, cursor, 'COUNT', want)
  cursor = r[1]
  for _, e in ipairs(r[2]) do out[#out + 1] = take(e) end
  for _, d in ipairs(r[3] or {}) do deleted[#deleted + 1] = d end
  if cursor == '0-0' or #r[2] < want then break end
  step = math.min(step * 2, L.step)
end
return {cursor, out, deleted}
";

/// XRANGE of each id in turn. KEYS[1] stream; ARGV: the limits, then the ids.
const FETCH_LUA: &str = r"
local out = {}
for i = limits(1), #ARGV do
  local id = ARGV[i]
  if full then
    out[#out + 1] = {id, 'held'}
  else
    local e = redis.call('XRANGE', KEYS[1], id, id)[1]
    if e then out[#out + 1] = take(e) else out[#out + 1] = {id} end
  end
end
return out
";

/// The script `body`, after [`TAKE_LUA`], loaded once per process.
fn script(cell: &'static OnceLock<redis::Script>, body: &str) -> &'static redis::Script {
    cell.get_or_init(|| redis::Script::new(&format!("{TAKE_LUA}{body}")))
}

/// New entries (`start` = `>`) or this consumer's pending history after `start`, at most
/// `count_max` entries and `budget` bytes of them. Entries sent carry delivery count 1; a
/// caller reading history fills the counts in (`stream::fill_delivery_counts`).
#[allow(clippy::too_many_arguments)]
pub fn read_group(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    start: &str,
    count_max: usize,
    budget: usize,
    limits: &Limits,
) -> Result<Read> {
    static SCRIPT: OnceLock<redis::Script> = OnceLock::new();
    let mut inv = script(&SCRIPT, READ_LUA).prepare_invoke();
    inv.key(stream)
        .arg(group)
        .arg(consumer)
        .arg(start)
        .arg(count_max.max(1));
    for a in limits.args(budget) {
        inv.arg(a);
    }
    let reply: Value = conn.invoke(&inv).map_err(|e| naming_key(e, stream))?;
    let mut read = Read::default();
    take_items(array(reply)?, 1, &mut read)?;
    read.assert_within(count_max.max(1), budget);
    Ok(read)
}

/// XAUTOCLAIM of entries idle at least `min_idle_ms`, from `cursor`, at most `count_max`
/// entries and `budget` bytes of them sent; what is claimed but not sent comes back held.
#[allow(clippy::too_many_arguments)]
pub fn autoclaim(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    min_idle_ms: u64,
    cursor: &str,
    count_max: usize,
    budget: usize,
    limits: &Limits,
) -> Result<AutoClaimed> {
    static SCRIPT: OnceLock<redis::Script> = OnceLock::new();
    let mut inv = script(&SCRIPT, CLAIM_LUA).prepare_invoke();
    inv.key(stream)
        .arg(group)
        .arg(consumer)
        .arg(min_idle_ms)
        .arg(cursor)
        .arg(count_max.max(1));
    for a in limits.args(budget) {
        inv.arg(a);
    }
    let reply: Value = conn.invoke(&inv).map_err(|e| naming_key(e, stream))?;
    let mut parts = array(reply)?.into_iter();
    let mut out = AutoClaimed {
        next_cursor: string(parts.next().unwrap_or(Value::Nil))?,
        ..AutoClaimed::default()
    };
    take_items(array(parts.next().unwrap_or(Value::Nil))?, 1, &mut out.read)?;
    out.read.assert_within(count_max.max(1), budget);
    for id in array(parts.next().unwrap_or(Value::Nil))? {
        out.deleted.push(string(id)?);
    }
    // Before Redis 7 a deleted entry came back as a nil body instead.
    out.deleted.append(&mut out.read.vanished);
    Ok(out)
}

/// The entries with these ids (this consumer's, pending), each with the delivery count given,
/// as many as `budget` holds (at least the first); XRANGE counts no delivery and changes no
/// owner. Ids whose bodies are gone come back vanished; those that did not fit, held.
pub fn fetch(
    conn: &mut Conn,
    stream: &str,
    ids: &[(String, u64)],
    budget: usize,
    limits: &Limits,
) -> Result<Read> {
    static SCRIPT: OnceLock<redis::Script> = OnceLock::new();
    let mut read = Read::default();
    if ids.is_empty() {
        return Ok(read);
    }
    let mut inv = script(&SCRIPT, FETCH_LUA).prepare_invoke();
    inv.key(stream);
    for a in limits.args(budget) {
        inv.arg(a);
    }
    for (id, _) in ids {
        inv.arg(id);
    }
    let reply: Value = conn.invoke(&inv).map_err(|e| naming_key(e, stream))?;
    take_items(array(reply)?, 1, &mut read)?;
    read.assert_within(ids.len(), budget);
    let counts: std::collections::HashMap<&str, u64> =
        ids.iter().map(|(id, n)| (id.as_str(), *n)).collect();
    for e in &mut read.entries {
        e.delivery_count = counts.get(e.id.as_str()).copied().unwrap_or(1);
    }
    Ok(read)
}

/// Sorts a script's items into `read`: `[id]` vanished, `[id, fields]` whole, `[id, "held"]`,
/// `[id, "cut", …]`.
fn take_items(raw: Vec<Value>, delivery_count: u64, read: &mut Read) -> Result<()> {
    for item in raw {
        let mut parts = array(item)?.into_iter();
        let id = string(parts.next().unwrap_or(Value::Nil))?;
        read.last_id = Some(id.clone());
        match parts.next() {
            None | Some(Value::Nil) => read.vanished.push(id),
            Some(f @ (Value::Array(_) | Value::Map(_))) => {
                read.entries
                    .push(Entry::whole(id, pairs(f)?, delivery_count));
            }
            Some(marker) => match bytes(marker)?.as_slice() {
                b"held" => read.held.push(id),
                b"cut" => read.entries.push(cut_entry(id, parts, delivery_count)?),
                other => {
                    return Err(Error::Other(format!(
                        "a read script sent {:?} for entry {id}",
                        String::from_utf8_lossy(other)
                    )))
                }
            },
        }
    }
    Ok(())
}

/// A cut entry from the rest of its item: size, field count, payload size, largest field's
/// name and size, the fields shown whole, the summaries (five values each).
fn cut_entry(id: String, parts: impl Iterator<Item = Value>, delivery_count: u64) -> Result<Entry> {
    let mut parts = parts.fuse();
    let mut next = || parts.next().unwrap_or(Value::Nil);
    let number = |v: Value| -> Result<u64> {
        let text = string(v)?;
        text.parse()
            .map_err(|_| Error::Other(format!("a read script sent {text:?} for a size")))
    };
    let bytes_total = number(next())?;
    let fields = number(next())?;
    let payload =
        match string(next())?.as_str() {
            "none" => PayloadSize::Absent,
            "several" => PayloadSize::Several,
            n => PayloadSize::One(n.parse().map_err(|_| {
                Error::Other(format!("a read script sent {n:?} for a payload size"))
            })?),
        };
    let largest_name = bytes(next())?;
    let largest_bytes = number(next())?;
    let whole = pairs(next())?;
    let flat = array(next())?;
    let mut summaries = Vec::with_capacity(flat.len() / 5);
    let mut it = flat.into_iter();
    while let Some(name) = it.next() {
        let mut field = || it.next().unwrap_or(Value::Nil);
        summaries.push(Summary {
            name: bytes(name)?,
            name_bytes: number(field())?,
            bytes: number(field())?,
            sha1: string(field())?,
            prefix: bytes(field())?,
        });
    }
    Ok(Entry {
        id,
        fields: whole,
        delivery_count,
        cut: Some(Box::new(Cut {
            bytes: bytes_total,
            fields,
            payload,
            largest_name,
            largest_bytes,
            summaries,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn script_items_sort_into_whole_cut_held_and_vanished_entries() {
        let raw = vec![
            Value::Array(vec![
                bulk("1-0"),
                Value::Array(vec![bulk("payload"), bulk("{}")]),
            ]),
            Value::Array(vec![
                bulk("2-0"),
                bulk("cut"),
                bulk("5000"),
                bulk("2"),
                bulk("4990"),
                bulk("payload"),
                bulk("4990"),
                Value::Array(vec![bulk("n"), bulk("1")]),
                Value::Array(vec![
                    bulk("payload"),
                    bulk("7"),
                    bulk("4990"),
                    bulk(&"a".repeat(40)),
                    bulk("{\"award"),
                ]),
            ]),
            Value::Array(vec![bulk("3-0"), bulk("held")]),
            Value::Array(vec![bulk("4-0")]),
        ];
        let mut read = Read::default();
        take_items(raw, 1, &mut read).unwrap();
        assert_eq!(read.entries.len(), 2);
        assert_eq!(
            read.entries[0],
            Entry::whole("1-0", vec![(b"payload".to_vec(), b"{}".to_vec())], 1)
        );
        let cut = read.entries[1].cut.as_ref().expect("cut");
        assert_eq!((cut.bytes, cut.fields), (5000, 2));
        assert_eq!(cut.payload, PayloadSize::One(4990));
        assert_eq!(cut.summaries[0].prefix, b"{\"award");
        assert_eq!(read.entries[1].fields, vec![(b"n".to_vec(), b"1".to_vec())]);
        assert_eq!(read.held, ["3-0"]);
        assert_eq!(read.vanished, ["4-0"]);
        assert_eq!(read.last_id.as_deref(), Some("4-0"));
    }

    #[test]
    fn a_read_has_room_for_the_heaviest_entry_whole_or_cut() {
        let limits = Limits::for_payload(256);
        let heaviest_whole = Entry::whole(
            "18446744073709551615-18446744073709551615",
            vec![(Vec::new(), vec![0; limits.entry_bytes_max - 41])],
            1,
        );
        assert!(heaviest_whole.weight() <= limits.entry_weight_max());
        assert!(
            Limits::for_payload(1 << 20).entry_weight_max() > (1 << 20) + ENTRY_OVERHEAD_BYTES_MAX
        );
    }
}
