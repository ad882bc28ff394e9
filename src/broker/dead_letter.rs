//! The dead-letter copy: one entry of `<stream>:dead` per original entry id, with what claimgate
//! says about it, written by one Lua script that checks and records the original id
//! atomically with the XADD.
//!
//! **Invariant:** a dead letter holds nothing larger than the entry it was made from as read:
//! an entry cut down on the server (`read.rs`) is copied as what was sent of it — its fields
//! shown whole, the others as size, SHA-1 and first bytes — never fetched whole for the copy.

use super::entry::Entry;
use super::stream::Conn;
use crate::error::Result;

/// Prefix of every original field in a dead-letter entry, so the originals can never collide
/// with the fields claimgate adds (see [`DeadLetterCopy`]).
pub const ORIGINAL_FIELD_PREFIX: &str = "original.";

/// Most original fields copied into a dead letter: Lua's `unpack` has a hard stack limit. An
/// entry read whole has at most `ENTRY_FIELDS_MAX` fields (one with more is cut on the server),
/// so this only guards the script.
pub const DEAD_LETTER_FIELDS_MAX: usize = 1_000;

/// Prefix of the fields that summarise an original field too large to copy (see
/// [`DeadLetterCopy`]). An oversize payload copied whole would double what it costs Redis; the
/// summary is what an operator needs to find the original and have it re-sent fixed.
pub const TRUNCATED_FIELD_PREFIX: &str = "truncated.";

/// How much of an oversize original field a dead letter keeps, from its start (4 KiB): enough
/// to see what it is and whose. A value no longer than this is always copied whole.
pub const DEAD_LETTER_PREFIX_BYTES: usize = 4 * 1024;

/// An entry on its way to the dead-letter stream, with what claimgate says about it.
///
/// The dead-letter entry's fields are, in this order: `original_id` (the entry's id), `reason`,
/// `reason_code`, `deliveries` (the entry's delivery count), `consumer`, `source_stream`,
/// `dead_lettered_at`, then each original field with its name prefixed by
/// [`ORIGINAL_FIELD_PREFIX`]. For an entry too large to read whole (cut on the server), those
/// are the fields of its first `CUT_FIELDS_SHOWN_MAX` that are at most
/// [`DEAD_LETTER_PREFIX_BYTES`] long, and each of the others shown is summarised: in its place
/// come `<name>.bytes` (its length), `<name>.sha1` (hex SHA-1 of the whole value, computed by
/// Redis) and `<name>.prefix` (its first [`DEAD_LETTER_PREFIX_BYTES`]), plus `<name>.name_bytes`
/// when the name itself was too long to show whole (`<name>` is then its first
/// `CUT_NAME_BYTES_MAX` bytes), each prefixed by [`TRUNCATED_FIELD_PREFIX`]; then
/// `original_entry_bytes` (the whole entry's size), and `original_fields_omitted` (how many
/// fields are not shown at all) and `original_fields_truncated` (how many were summarised) when
/// not zero. Either of the last two makes `dlq replay` refuse it. `claimgate dlq` reads them
/// back.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterCopy<'a> {
    /// The entry as delivered: its id, fields and delivery count are copied.
    pub original: &'a Entry,
    /// Why, in words.
    pub reason: &'a str,
    /// A short machine-readable class, such as `not_json`.
    pub reason_code: &'a str,
    /// The consumer that dead-lettered it.
    pub consumer: &'a str,
    /// The stream it was read from.
    pub source_stream: &'a str,
    /// When it was dead-lettered (RFC 3339).
    pub dead_lettered_at: &'a str,
}

/// Copies an entry to the dead-letter stream exactly once per original id.
///
/// An index hash `<dead stream>:index` maps original id → dead-letter id, checked and written
/// in the same Lua script as the XADD, so a redelivery after a crash finds the first copy
/// instead of adding a second. Returns the dead-letter entry id.
pub fn copy_to_dead_letters(
    conn: &mut Conn,
    dead_stream: &str,
    copy: &DeadLetterCopy<'_>,
) -> Result<String> {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        redis::Script::new(
            r"
            local existing = redis.call('HGET', KEYS[2], ARGV[1])
            if existing then return existing end
            local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
            redis.call('HSET', KEYS[2], ARGV[1], id)
            return id
            ",
        )
    });
    let entry = copy.original;
    let mut inv = script.prepare_invoke();
    inv.key(dead_stream)
        .key(dead_index_key(dead_stream))
        .arg(&entry.id);
    inv.arg("original_id").arg(&entry.id);
    inv.arg("reason").arg(copy.reason);
    inv.arg("reason_code").arg(copy.reason_code);
    inv.arg("deliveries").arg(entry.delivery_count);
    inv.arg("consumer").arg(copy.consumer);
    inv.arg("source_stream").arg(copy.source_stream);
    inv.arg("dead_lettered_at").arg(copy.dead_lettered_at);
    for (name, value) in entry.fields.iter().take(DEAD_LETTER_FIELDS_MAX) {
        inv.arg([ORIGINAL_FIELD_PREFIX.as_bytes(), name].concat())
            .arg(value.as_slice());
    }
    let mut omitted = entry.fields.len().saturating_sub(DEAD_LETTER_FIELDS_MAX) as u64;
    if let Some(cut) = &entry.cut {
        for s in &cut.summaries {
            let field = |suffix: &str| {
                [
                    TRUNCATED_FIELD_PREFIX.as_bytes(),
                    &s.name,
                    suffix.as_bytes(),
                ]
                .concat()
            };
            inv.arg(field(".bytes")).arg(s.bytes);
            inv.arg(field(".sha1")).arg(&s.sha1);
            inv.arg(field(".prefix")).arg(s.prefix.as_slice());
            if s.name_bytes > s.name.len() as u64 {
                inv.arg(field(".name_bytes")).arg(s.name_bytes);
            }
        }
        inv.arg("original_entry_bytes").arg(cut.bytes);
        omitted += entry.fields_omitted();
        if !cut.summaries.is_empty() {
            inv.arg("original_fields_truncated")
                .arg(cut.summaries.len());
        }
    }
    if omitted > 0 {
        inv.arg("original_fields_omitted").arg(omitted);
    }
    conn.invoke(&inv)
}

/// The hash that records which original ids were dead-lettered, and where.
pub fn dead_index_key(dead_stream: &str) -> String {
    format!("{dead_stream}:index")
}

#[cfg(test)]
mod tests {
    use super::dead_index_key;

    #[test]
    fn the_dead_letter_index_lives_beside_its_stream() {
        // `dlq`, `dlq reconcile` and earlier releases find it by this name.
        assert_eq!(
            dead_index_key("grants:submissions:dead"),
            "grants:submissions:dead:index"
        );
    }
}
