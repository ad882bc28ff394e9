//! One stream entry as claimgate holds it — whole, or cut down on the server to what its dead
//! letter keeps (`read.rs`) — and what it weighs in the worker's memory.
//!
//! **Invariant:** [`Entry::weight`] is the one statement of an entry's weight; the read scripts
//! (`read.rs`) weigh what they send by the same rule, with the same constants passed in, so
//! what the server fits to a budget is what the worker counts against it.

/// Bytes counted for each field beside its name and value: the reply's array elements while it
/// is parsed and the `(name, value)` pair and its two vectors once it is an entry.
pub const FIELD_WEIGHT_BYTES: usize = 128;

/// Bytes counted for each entry beside its id and fields: its own struct, the reply's arrays
/// around it, and what the pipeline keeps of it (`worker::parse::Parsed`).
pub const ENTRY_WEIGHT_BYTES: usize = 256;

/// Bytes counted for a cut entry's facts beside the name of its largest field (four numbers).
pub const CUT_WEIGHT_BYTES: usize = 64;

/// Bytes counted for one summarised field beside its shown name and prefix: the SHA-1 in hex
/// (40), two numbers and three fields' overhead.
pub const SUMMARY_WEIGHT_BYTES: usize = 40 + 3 * FIELD_WEIGHT_BYTES;

/// One stream entry as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The stream entry id, such as `1700000000000-0`.
    pub id: String,
    /// Field/value pairs in stream order (field names may repeat; values are raw bytes). For a
    /// cut entry: those of its first fields small enough to show whole.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// How many times the group has delivered it, this delivery included.
    pub delivery_count: u64,
    /// Set when the entry was too large to read whole (a field over the field limit, all of it
    /// over the entry limit, or too many fields): what the server sent instead.
    pub cut: Option<Box<Cut>>,
}

/// What a read script sends of an entry too large to read whole: facts about all of it, and
/// its first fields, each whole when small, else summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The whole entry's size on the server: its id and every field name and value.
    pub bytes: u64,
    /// How many fields it has.
    pub fields: u64,
    /// Its `payload` field's size.
    pub payload: PayloadSize,
    /// The first bytes of the name of the field with the largest value.
    pub largest_name: Vec<u8>,
    /// That value's size.
    pub largest_bytes: u64,
    /// The shown fields too large to send whole, in stream order.
    pub summaries: Vec<Summary>,
}

/// How an entry's `payload` field stands, as a cut entry reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadSize {
    /// No field is named `payload`.
    Absent,
    /// One is, holding this many bytes.
    One(u64),
    /// More than one is.
    Several,
}

/// One field of a cut entry that is not sent whole: enough to find the original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The field's name, or its first bytes when it is longer than the shown part.
    pub name: Vec<u8>,
    /// The whole name's length.
    pub name_bytes: u64,
    /// The value's length.
    pub bytes: u64,
    /// The value's SHA-1, in lowercase hex, computed by Redis (`redis.sha1hex`).
    pub sha1: String,
    /// The value's first bytes.
    pub prefix: Vec<u8>,
}

impl Entry {
    /// An entry read whole.
    pub fn whole(
        id: impl Into<String>,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        delivery_count: u64,
    ) -> Entry {
        Entry {
            id: id.into(),
            fields,
            delivery_count,
            cut: None,
        }
    }

    /// What the entry weighs as held: its id and every field name and value, in bytes (for a
    /// cut entry, what was sent of it).
    pub fn size_bytes(&self) -> usize {
        let fields: usize = self.fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        let cut = self.cut.as_ref().map_or(0, |c| {
            let shown: usize = c
                .summaries
                .iter()
                .map(|s| s.name.len() + s.prefix.len())
                .sum();
            c.largest_name.len() + shown
        });
        self.id.len() + fields + cut
    }

    /// What the entry costs the worker's memory budget (`--read-bytes-max`): its bytes plus
    /// [`ENTRY_WEIGHT_BYTES`], [`FIELD_WEIGHT_BYTES`] per field, and for a cut entry
    /// [`CUT_WEIGHT_BYTES`] and [`SUMMARY_WEIGHT_BYTES`] per summary.
    pub fn weight(&self) -> usize {
        let cut = self.cut.as_ref().map_or(0, |c| {
            CUT_WEIGHT_BYTES + c.summaries.len() * SUMMARY_WEIGHT_BYTES
        });
        ENTRY_WEIGHT_BYTES + self.size_bytes() + self.fields.len() * FIELD_WEIGHT_BYTES + cut
    }

    /// For a cut entry: how many of its fields were neither sent whole nor summarised.
    pub fn fields_omitted(&self) -> u64 {
        self.cut.as_ref().map_or(0, |c| {
            c.fields
                .saturating_sub((self.fields.len() + c.summaries.len()) as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_entry_weighs_its_bytes_and_a_fixed_cost_per_field() {
        let e = Entry::whole("1-0", vec![(b"payload".to_vec(), vec![b'x'; 100])], 1);
        assert_eq!(e.size_bytes(), 3 + 7 + 100);
        assert_eq!(e.weight(), ENTRY_WEIGHT_BYTES + 110 + FIELD_WEIGHT_BYTES);
        assert_eq!(e.fields_omitted(), 0);
    }

    #[test]
    fn a_cut_entry_weighs_what_was_sent_of_it_and_counts_what_was_left_out() {
        let mut e = Entry::whole("1-0", vec![(b"a".to_vec(), b"b".to_vec())], 1);
        e.cut = Some(Box::new(Cut {
            bytes: 600 << 20,
            fields: 5,
            payload: PayloadSize::One(512 << 20),
            largest_name: b"payload".to_vec(),
            largest_bytes: 512 << 20,
            summaries: vec![Summary {
                name: b"payload".to_vec(),
                name_bytes: 7,
                bytes: 512 << 20,
                sha1: "0".repeat(40),
                prefix: vec![b'{'; 4096],
            }],
        }));
        assert_eq!(e.size_bytes(), 3 + 2 + 7 + 7 + 4096);
        assert_eq!(
            e.weight(),
            ENTRY_WEIGHT_BYTES
                + e.size_bytes()
                + FIELD_WEIGHT_BYTES
                + CUT_WEIGHT_BYTES
                + SUMMARY_WEIGHT_BYTES
        );
        assert_eq!(e.fields_omitted(), 3);
    }
}
