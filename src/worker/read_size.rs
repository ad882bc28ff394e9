//! How many entries the reader asks for: a byte budget (`--read-bytes-max`) over the entry sizes
//! seen so far, so a stream of heavy entries is read a few at a time and a stream of light ones
//! in full pages.
//!
//! **Invariant:** a read never asks for more than `batch_count_max` entries nor fewer than one;
//! at first and right after an entry over the payload limit it asks for [`READ_COUNT_START`]; from
//! there the count at most doubles per read, so a run of oversize entries is met a few at a time
//! once the estimate has learned their size. Redis has no
//! byte limit on a read, so the budget is an aim learned from what came, not a guarantee for an
//! entry never seen: the doubling bounds how far a sudden change can overshoot it.

use crate::broker::stream::Entry;

/// The most the first read, and the read after an oversize entry, asks for: small against
/// `batch_count_max`, since nothing (or something heavy) has been seen, yet enough that entries
/// arriving together still share a transaction. After an oversize entry the byte budget over the
/// estimate (which that entry has just raised) usually asks for far fewer.
pub(super) const READ_COUNT_START: usize = 64;

/// The running estimate behind each read's COUNT.
#[derive(Debug, Clone)]
pub(super) struct ReadSize {
    /// Entry bytes one read aims for.
    bytes_max: usize,
    /// The count never goes above this (`batch_count_max`).
    count_max: usize,
    /// An entry longer than this restarts the count at 1 (`payload_bytes_max`).
    oversize_bytes: usize,
    /// Bytes per entry expected of the next read: the mean of the last read, or a quarter less
    /// than the previous estimate if that is more (heavy entries are forgotten gradually).
    entry_bytes_est: usize,
    /// The slow-start ceiling: [`READ_COUNT_START`] after an oversize entry, doubling with each
    /// read after it.
    count_ceiling: usize,
}

impl ReadSize {
    /// Starts small: the first read asks for [`READ_COUNT_START`] entries, as nothing has been
    /// seen yet.
    pub(super) fn new(bytes_max: usize, count_max: usize, oversize_bytes: usize) -> Self {
        ReadSize {
            bytes_max: bytes_max.max(1),
            count_max: count_max.max(1),
            oversize_bytes,
            entry_bytes_est: 1,
            count_ceiling: READ_COUNT_START,
        }
    }

    /// The COUNT for the next read.
    pub(super) fn count(&self) -> usize {
        let by_bytes = self.bytes_max / self.entry_bytes_est.max(1);
        by_bytes.clamp(1, self.count_max).min(self.count_ceiling)
    }

    /// Learns from what a read returned.
    pub(super) fn saw(&mut self, entries: &[Entry]) {
        if entries.is_empty() {
            return;
        }
        let sizes = entries.iter().map(Entry::size_bytes);
        let (total, largest) = sizes.fold((0, 0), |(t, l), s| (t + s, l.max(s)));
        let mean = total / entries.len();
        self.entry_bytes_est = mean.max(self.entry_bytes_est - self.entry_bytes_est / 4);
        self.count_ceiling = if largest > self.oversize_bytes {
            READ_COUNT_START
        } else {
            (self.count_ceiling * 2).min(self.count_max)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize, bytes: usize) -> Vec<Entry> {
        let one = Entry {
            id: "1-0".into(),
            fields: vec![(b"payload".to_vec(), vec![b'x'; bytes - 10])],
            delivery_count: 1,
        };
        vec![one; n]
    }

    #[test]
    fn light_entries_grow_the_count_to_its_cap_by_doubling() {
        let mut size = ReadSize::new(4 << 20, 1024, 1 << 20);
        let mut counts = Vec::new();
        for _ in 0..10 {
            counts.push(size.count());
            size.saw(&entries(size.count(), 200));
        }
        assert_eq!(
            counts,
            [64, 128, 256, 512, 1024, 1024, 1024, 1024, 1024, 1024]
        );
    }

    #[test]
    fn heavy_entries_are_read_by_the_byte_budget() {
        let mut size = ReadSize::new(4 << 20, 1024, 1 << 20);
        for _ in 0..12 {
            size.saw(&entries(size.count(), 512 << 10));
        }
        assert_eq!(size.count(), 8, "4 MiB over 512 KiB entries");
    }

    #[test]
    fn an_oversize_entry_restarts_the_count_small() {
        let mut size = ReadSize::new(4 << 20, 1024, 1 << 20);
        for _ in 0..12 {
            size.saw(&entries(size.count(), 200));
        }
        assert_eq!(size.count(), 1024);
        let mut read = entries(1023, 200);
        read.extend(entries(1, 2 << 20));
        size.saw(&read);
        assert_eq!(size.count(), READ_COUNT_START);
        size.saw(&entries(1, 2 << 20));
        assert_eq!(size.count(), 2, "the budget over the heavy estimate");
    }
}
