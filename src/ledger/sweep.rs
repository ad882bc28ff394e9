//! What `verify` needs to check a ledger of any size in bounded memory, whatever the backend:
//! each backend streams its rows once, in index order, into these.
//!
//! - [`KeySort`]: 32-byte keys sorted in fixed memory (runs of [`RUN_KEYS`] keys spilled to
//!   unnamed temporary files, then merged), so "no key claimed twice" needs no index on the key
//!   and no table of every key in memory.
//! - [`key_faults`]: one merge of the claims', tombstones' and `duplicate` records' sorted keys
//!   answering three questions at once (claimed twice; claimed and tombstoned; a duplicate
//!   naming neither).
//! - [`SetDigest`]: a fixed-size digest of a multiset of (key, award, amount), keyed by a salt
//!   drawn for this run, so the claims (with their disbursements) and the `processed` records
//!   can each be read in their own order and still be compared one to one.
//! - [`Progress`]: a line on stderr, only when it is a terminal and only after two seconds.
//!
//! Invariant: nothing here holds memory that grows with the ledger; nothing here writes
//! anything but temporary files that are unnamed (mode 0600, gone when closed).

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::time::{Duration, Instant};

/// A key as the ledger stores it.
pub type Key = [u8; 32];

/// Keys sorted in memory before a run is spilled: 8 MiB. A 10M-claim ledger makes 39 runs,
/// merged with a 64 KiB buffer each.
pub const RUN_KEYS: usize = 1 << 18;

/// Read buffer per run while merging.
const MERGE_BUFFER_BYTES: usize = 64 * 1024;

/// Keys pushed in any order, read back sorted (equal keys kept, so duplicates are adjacent).
#[derive(Default)]
pub struct KeySort {
    run: Vec<Key>,
    spilled: Vec<std::fs::File>,
    /// Keys pushed.
    pub count: u64,
}

impl KeySort {
    /// Adds one key; spills the current run to a temporary file when it is full.
    pub fn push(&mut self, key: Key) -> Result<()> {
        if self.run.capacity() == 0 {
            self.run.reserve_exact(RUN_KEYS);
        }
        self.run.push(key);
        self.count += 1;
        if self.run.len() == RUN_KEYS {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> Result<()> {
        self.run.sort_unstable();
        let file = tempfile::tempfile().map_err(|e| Error::io("creating a temporary file", e))?;
        let mut out = BufWriter::with_capacity(MERGE_BUFFER_BYTES, file);
        for key in &self.run {
            out.write_all(key)
                .map_err(|e| Error::io("writing a temporary file", e))?;
        }
        let mut file = out
            .into_inner()
            .map_err(|e| Error::io("writing a temporary file", e.into_error()))?;
        file.rewind()
            .map_err(|e| Error::io("rewinding a temporary file", e))?;
        self.spilled.push(file);
        self.run.clear();
        Ok(())
    }

    /// The keys in ascending byte order.
    pub fn sorted(mut self) -> Result<Sorted> {
        if self.spilled.is_empty() {
            self.run.sort_unstable();
            return Ok(Sorted::Memory(self.run.into_iter()));
        }
        if !self.run.is_empty() {
            self.spill()?;
        }
        self.run = Vec::new();
        let mut runs: Vec<BufReader<std::fs::File>> = self
            .spilled
            .into_iter()
            .map(|f| BufReader::with_capacity(MERGE_BUFFER_BYTES, f))
            .collect();
        let mut heads = BinaryHeap::with_capacity(runs.len());
        for (i, run) in runs.iter_mut().enumerate() {
            if let Some(key) = read_key(run)? {
                heads.push(Reverse((key, i)));
            }
        }
        Ok(Sorted::Runs { runs, heads })
    }
}

fn read_key(run: &mut BufReader<std::fs::File>) -> Result<Option<Key>> {
    let mut key = [0u8; 32];
    match run.read_exact(&mut key) {
        Ok(()) => Ok(Some(key)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(Error::io("reading a temporary file", e)),
    }
}

/// [`KeySort::sorted`]'s keys.
pub enum Sorted {
    /// All fitted in one run.
    Memory(std::vec::IntoIter<Key>),
    /// Spilled runs, merged: the smallest unread key of each run on a heap.
    Runs {
        runs: Vec<BufReader<std::fs::File>>,
        heads: BinaryHeap<Reverse<(Key, usize)>>,
    },
}

impl Sorted {
    /// The next key, or `None` after the last.
    pub fn next_key(&mut self) -> Result<Option<Key>> {
        match self {
            Sorted::Memory(keys) => Ok(keys.next()),
            Sorted::Runs { runs, heads } => {
                let Some(Reverse((key, i))) = heads.pop() else {
                    return Ok(None);
                };
                if let Some(next) = read_key(&mut runs[i])? {
                    heads.push(Reverse((next, i)));
                }
                Ok(Some(key))
            }
        }
    }
}

/// The first key that breaks one of the three rules [`key_faults`] checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFault {
    /// Two or more claims hold the key.
    ClaimedTwice(Key),
    /// A claim holds a key a purge tombstoned.
    ClaimedAndTombstoned(Key),
    /// A `duplicate` record names a key no claim and no tombstone holds.
    DuplicateOfNothing(Key),
}

/// Merges three ascending key streams: the claims' keys, the tombstones' and the keys of the
/// `duplicate` records. Returns the number of tombstones and the first (lowest-keyed) fault.
pub fn key_faults(
    claims: &mut Sorted,
    tombstones: &mut dyn FnMut() -> Result<Option<Key>>,
    duplicates: &mut Sorted,
) -> Result<(u64, Option<KeyFault>)> {
    let (mut c, mut t, mut d) = (claims.next_key()?, tombstones()?, duplicates.next_key()?);
    let mut tombstone_count = 0;
    let mut fault = None;
    while let Some(key) = [c, t, d].into_iter().flatten().min() {
        let (mut n_claims, mut n_tombstones, mut n_duplicates) = (0u64, 0u64, 0u64);
        while c == Some(key) {
            n_claims += 1;
            c = claims.next_key()?;
        }
        while t == Some(key) {
            n_tombstones += 1;
            t = tombstones()?;
        }
        while d == Some(key) {
            n_duplicates += 1;
            d = duplicates.next_key()?;
        }
        // The merge finds every fault only if each stream ascends: a key below `key` now
        // would be compared with nothing.
        for (stream, next) in [("claims", c), ("tombstones", t), ("duplicates", d)] {
            assert!(
                next.is_none_or(|n| n > key),
                "sweep: the {stream}' keys do not ascend"
            );
        }
        tombstone_count += n_tombstones;
        if fault.is_none() {
            fault = if n_claims > 1 {
                Some(KeyFault::ClaimedTwice(key))
            } else if n_claims > 0 && n_tombstones > 0 {
                Some(KeyFault::ClaimedAndTombstoned(key))
            } else if n_duplicates > 0 && n_claims == 0 && n_tombstones == 0 {
                Some(KeyFault::DuplicateOfNothing(key))
            } else {
                None
            };
        }
    }
    Ok((tombstone_count, fault))
}

/// [`key_faults`] over the claims' and `duplicate` records' keys as pushed and the tombstones'
/// keys read in ascending order: the number of tombstones, or `Error::Invariant` naming the
/// first fault, as a verify pass reports it.
pub fn check_keys(
    claims: KeySort,
    tombstones: &mut dyn FnMut() -> Result<Option<Key>>,
    duplicates: KeySort,
) -> Result<u64> {
    let (count, fault) = key_faults(&mut claims.sorted()?, tombstones, &mut duplicates.sorted()?)?;
    match fault {
        Some(f) => Err(Error::Invariant(format!("key fault: {f:?}"))),
        None => Ok(count),
    }
}

/// A tombstone's key as stored, which must be 32 bytes.
pub fn tombstone_key(bytes: &[u8]) -> Result<Key> {
    bytes
        .try_into()
        .map_err(|_| Error::Invariant("a tombstone's key is not 32 bytes".into()))
}

/// A multiset of (key, award, amount) as a fixed-size digest: the sum, lane by lane modulo
/// 2^64, of each element's salted SHA-256, with the element count. Two multisets are equal
/// when their digests are (but for a chance of about 2^-128 per lane pair); the salt is drawn
/// from the OS for each run and never shown, so nobody editing a ledger can choose rows whose
/// sums cancel (an unsalted sum could be steered that way).
#[derive(Clone)]
pub struct SetDigest {
    salted: Sha256,
    sum: [u64; 4],
    /// Elements added.
    pub count: u64,
}

impl SetDigest {
    /// Digests under a salt from the OS's random source; digests from one `SetDigest::new`
    /// cloned are comparable, digests from two calls are not.
    pub fn new() -> Result<Self> {
        use ring::rand::SecureRandom;
        let mut salt = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut salt)
            .map_err(|_| Error::Config("the OS's random source failed".into()))?;
        let mut salted = Sha256::new();
        salted.update(salt);
        Ok(SetDigest {
            salted,
            sum: [0; 4],
            count: 0,
        })
    }

    /// Adds one element. Key and amount have fixed widths and the award comes last, so no two
    /// elements are hashed from the same bytes.
    pub fn add(&mut self, key: &Key, award: &str, amount: i64) {
        let mut h = self.salted.clone();
        h.update(key);
        h.update(amount.to_le_bytes());
        h.update(award.as_bytes());
        let out = h.finalize();
        for (lane, bytes) in self.sum.iter_mut().zip(out.chunks_exact(8)) {
            let word = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            *lane = lane.wrapping_add(word);
        }
        self.count += 1;
    }

    /// Whether the two multisets are equal (digested under the same salt).
    pub fn same_as(&self, other: &SetDigest) -> bool {
        self.sum == other.sum && self.count == other.count
    }
}

/// How often the clock is read: every this many rows.
const PROGRESS_ROWS: u64 = 16_384;

/// A progress line on stderr for a long walk: nothing unless stderr is a terminal and the walk
/// has run two seconds, then at most four updates a second, overwriting one line that is
/// cleared when the `Progress` is dropped (so what the command prints next starts clean).
pub struct Progress {
    terminal: bool,
    started: Instant,
    last: Option<Instant>,
    rows: u64,
}

impl Progress {
    /// Starts the clock.
    pub fn new() -> Self {
        use std::io::IsTerminal;
        Progress {
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last: None,
            rows: 0,
        }
    }

    /// Counts one row; `line` says where the walk is (called only when a line is due).
    pub fn row(&mut self, line: impl FnOnce() -> String) {
        self.rows += 1;
        if !self.terminal || !self.rows.is_multiple_of(PROGRESS_ROWS) {
            return;
        }
        let now = Instant::now();
        if now - self.started < Duration::from_secs(2)
            || self
                .last
                .is_some_and(|l| now - l < Duration::from_millis(250))
        {
            return;
        }
        self.last = Some(now);
        let mut err = std::io::stderr().lock();
        // A progress line that cannot be written is no reason to fail the check.
        let _ = write!(
            err,
            "\r\x1b[K{} ({:.0} s)",
            line(),
            (now - self.started).as_secs_f64()
        );
        let _ = err.flush();
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.last.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

/// Whether an outbox payload plainly announces this award, amount and key: `Some` when `text`
/// is a JSON object of exactly the fields claimgate writes in an event (`domain/event.rs`),
/// strings without escapes, the amount an integer, each field once; `None` for anything else
/// (an escape, a NUL, a field named twice or unknown, a number written as a fraction, not JSON
/// at all), which the backend then decides with its own SQL, the expression its exact check
/// uses, so that the pass and the check can never read one text differently. Every text
/// answered here is one both SQLite's JSON functions and PostgreSQL's `jsonb` read the same
/// way, and claimgate writes only such texts, so the database is asked only about edited rows.
pub fn plain_event_announces(text: &[u8], key: &Key, award: &str, amount: i64) -> Option<bool> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Event<'a> {
        award_id: &'a str,
        amount_cents: i64,
        idempotency_key: &'a str,
        // Absent from events written by hand or by the benchmark's prefill; a text when there.
        #[serde(default, borrow, rename = "submission_timestamp")]
        _submission_timestamp: Option<&'a str>,
    }
    let plain =
        text.trim_ascii_start().starts_with(b"{") && !text.iter().any(|b| *b == b'\\' || *b == 0);
    if !plain {
        return None;
    }
    let event = serde_json::from_slice::<Event<'_>>(text).ok()?;
    Some(
        event.award_id == award
            && event.amount_cents == amount
            && is_lower_hex_of(event.idempotency_key.as_bytes(), key),
    )
}

/// Whether `hex` is exactly `key` in lowercase hex.
fn is_lower_hex_of(hex: &[u8], key: &Key) -> bool {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    hex.len() == 64
        && key.iter().zip(hex.chunks_exact(2)).all(|(k, pair)| {
            pair[0] == DIGITS[usize::from(k >> 4)] && pair[1] == DIGITS[usize::from(k & 15)]
        })
}

/// A key's hex as SQLite's `unhex` reads it (either case, nothing else), as 32 bytes; `None`
/// for anything else, which `unhex` would not match to a claim either.
pub fn unhex_either_case(hex: &str) -> Option<Key> {
    unhex_with(hex, true)
}

/// A key's hex as PostgreSQL's `encode(key, 'hex')` writes it (lowercase only), as 32 bytes;
/// `None` for anything else, which a comparison with `encode` would not match to a claim either.
pub fn unhex_lowercase(hex: &str) -> Option<Key> {
    unhex_with(hex, false)
}

fn unhex_with(hex: &str, upper_too: bool) -> Option<Key> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    // A table and one check at the end, not a branch a character: the PostgreSQL writer
    // decodes three of these a record, and the per-character `match` it replaced was the
    // worker's largest single cost (7% of its CPU, more than SHA-256).
    let table = if upper_too { &EITHER_CASE } else { &LOWERCASE };
    let mut key = [0u8; 32];
    let mut seen = 0u8;
    for (byte, pair) in key.iter_mut().zip(hex.chunks_exact(2)) {
        let (high, low) = (table[usize::from(pair[0])], table[usize::from(pair[1])]);
        seen |= high | low;
        *byte = high << 4 | low;
    }
    (seen & NOT_HEX == 0).then_some(key)
}

/// A character's value as a hex digit, or [`NOT_HEX`] (a bit no digit has).
const NOT_HEX: u8 = 0x80;
const LOWERCASE: [u8; 256] = hex_table(false);
const EITHER_CASE: [u8; 256] = hex_table(true);

const fn hex_table(upper_too: bool) -> [u8; 256] {
    let mut table = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        if upper_too {
            table[b'A' as usize + i] = 10 + i as u8;
        }
        i += 1;
    }
    table
}

/// `done` of `total` as a percentage for a progress line (ids, not rows: an id range is known
/// without counting).
pub fn percent(done: i64, first: i64, last: i64) -> f64 {
    if last <= first {
        return 100.0;
    }
    ((done - first) as f64 * 100.0 / (last - first) as f64).clamp(0.0, 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> Key {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&n.to_be_bytes());
        k[31] = (n % 251) as u8;
        k
    }

    fn drain(mut s: Sorted) -> Vec<Key> {
        let mut out = Vec::new();
        while let Some(k) = s.next_key().unwrap() {
            out.push(k);
        }
        out
    }

    #[test]
    fn keys_come_back_sorted_across_spilled_runs() {
        let n = RUN_KEYS as u64 * 2 + 17;
        let mut sort = KeySort::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut expected: Vec<Key> = (0..n).map(|i| key(rng.u64(..) ^ i)).collect();
        for k in &expected {
            sort.push(*k).unwrap();
        }
        assert_eq!(sort.count, n);
        assert_eq!(sort.spilled.len(), 2);
        expected.sort_unstable();
        assert_eq!(drain(sort.sorted().unwrap()), expected);
    }

    fn sorted(keys: &[u64]) -> Sorted {
        let mut s = KeySort::default();
        for k in keys {
            s.push(key(*k)).unwrap();
        }
        s.sorted().unwrap()
    }

    fn faults(claims: &[u64], tombstones: &[u64], dups: &[u64]) -> (u64, Option<KeyFault>) {
        let mut t = tombstones.iter().map(|k| key(*k)).collect::<Vec<_>>();
        t.sort_unstable();
        let mut t = t.into_iter();
        key_faults(&mut sorted(claims), &mut || Ok(t.next()), &mut sorted(dups)).unwrap()
    }

    #[test]
    fn the_merge_names_each_fault_and_passes_a_clean_set() {
        assert_eq!(faults(&[3, 1, 2], &[5, 4], &[1, 1, 5]), (2, None));
        assert_eq!(
            faults(&[3, 1, 3], &[], &[]),
            (0, Some(KeyFault::ClaimedTwice(key(3))))
        );
        assert_eq!(
            faults(&[3, 1], &[1], &[]),
            (1, Some(KeyFault::ClaimedAndTombstoned(key(1))))
        );
        assert_eq!(
            faults(&[3, 1], &[4], &[4, 9]),
            (1, Some(KeyFault::DuplicateOfNothing(key(9))))
        );
    }

    #[test]
    fn only_a_plain_event_of_claimgate_s_fields_is_decided_without_the_database() {
        let k = key(42);
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        let event = |amount: &str, extra: &str| {
            format!(
                r#"{{"amount_cents":{amount},"award_id":"A-1","idempotency_key":"{hex}","submission_timestamp":"2026-07-01T09:00:00Z"{extra}}}"#
            )
        };
        let decide = |text: &str| plain_event_announces(text.as_bytes(), &k, "A-1", 125);
        assert_eq!(decide(&event("125", "")), Some(true));
        let without_time =
            event("125", "").replace(r#","submission_timestamp":"2026-07-01T09:00:00Z""#, "");
        assert!(!without_time.contains("submission"), "{without_time}");
        assert_eq!(decide(&without_time), Some(true));
        assert_eq!(
            decide(&event("125", "").replace(r#""2026-07-01T09:00:00Z""#, "5")),
            None
        );
        assert_eq!(decide(&event("126", "")), Some(false));
        assert_eq!(
            plain_event_announces(event("125", "").as_bytes(), &key(43), "A-1", 125),
            Some(false)
        );
        assert_eq!(
            decide(&event("125", "").replace(&hex, &hex.to_uppercase())),
            Some(false)
        );
        for asked in [
            event("125.0", ""),
            event("1.25e2", ""),
            event("125", r#","extra":1"#),
            event("125", r#","amount_cents":126"#),
            event("125", "").replace("A-1", r"A\u002d1"),
            "not json".to_owned(),
            "[1]".to_owned(),
        ] {
            assert_eq!(decide(&asked), None, "{asked}");
        }
        assert_eq!(unhex_either_case(&hex.to_uppercase()), Some(k));
        assert_eq!(unhex_lowercase(&hex.to_uppercase()), None);
        assert_eq!(unhex_lowercase(&hex), Some(k));
    }

    #[test]
    fn unhex_reads_exactly_the_hex_digits_of_its_case_at_every_place() {
        let k = key(7);
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        for c in (0u8..128).map(char::from).chain(['é', '\u{ff}']) {
            for at in [0, 1, 62, 63] {
                let mut edited = hex.clone();
                edited.replace_range(at..at + 1, &c.to_string());
                let digit = c.to_digit(16).map(|d| d as u8);
                let expected = |upper_too: bool| {
                    let digit = digit.filter(|_| upper_too || !c.is_ascii_uppercase())?;
                    let mut want = k;
                    let shift = if at % 2 == 0 { 4 } else { 0 };
                    want[at / 2] = want[at / 2] & !(0xf << shift) | digit << shift;
                    Some(want)
                };
                assert_eq!(unhex_lowercase(&edited), expected(false), "{c:?} at {at}");
                assert_eq!(unhex_either_case(&edited), expected(true), "{c:?} at {at}");
            }
        }
        assert_eq!(unhex_lowercase(&hex[..62]), None);
        assert_eq!(unhex_lowercase(&format!("{hex}0")), None);
    }

    #[test]
    fn the_digest_is_of_the_multiset_whatever_the_order() {
        let d = SetDigest::new().unwrap();
        let (mut a, mut b, mut c) = (d.clone(), d.clone(), d);
        a.add(&key(1), "A", 5);
        a.add(&key(2), "B", 6);
        b.add(&key(2), "B", 6);
        b.add(&key(1), "A", 5);
        assert!(a.same_as(&b));
        c.add(&key(1), "A", 5);
        c.add(&key(2), "B", 7);
        assert!(!a.same_as(&c));
        let mut e = c.clone();
        e.add(&key(2), "B", 6);
        assert!(!a.same_as(&e), "the count is part of the digest");
    }
}
