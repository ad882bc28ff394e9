//! The audit chain checked record by record: the one walk that every backend's
//! [`Inspect::verify`](super::Inspect::verify), `claimgate audit verify` and the check of an
//! exported file share, so they can never disagree on what a broken chain is.
//!
//! Invariant: this module only reads; the hashing rules themselves are
//! [`crate::domain::audit::Verifier`]'s.

use super::{AuditLog, Since};
use crate::domain::audit::{Record, Verifier};
use crate::error::{Error, Result};

/// Checks `record` as the next link after those `v` has seen; a break is
/// [`Error::Invariant`] naming the record's seq.
pub fn check(v: &mut Verifier, record: &Record) -> Result<()> {
    v.push(record)
        .map_err(|b| Error::Invariant(format!("audit chain broken at seq {}: {}", b.seq, b.reason)))
}

/// After the last record: the record count and the head hash (the hash the next record will
/// link to), or [`Error::Invariant`] if the walk ended inside a batch (its link is missing).
pub fn end(v: &Verifier) -> Result<(u64, String)> {
    v.end().map_err(|b| {
        Error::Invariant(format!("audit chain broken at seq {}: {}", b.seq, b.reason))
    })?;
    Ok((v.count, v.head().to_owned()))
}

/// Recomputes the whole chain of `log` from one snapshot; returns the record count and the
/// head hash, or [`Error::Invariant`] naming the first broken record. Shows its progress on a
/// terminal when it takes more than two seconds ([`super::sweep::Progress`]).
pub fn verify(log: &(impl AuditLog + ?Sized)) -> Result<(u64, String)> {
    let mut v = Verifier::default();
    let mut progress = super::sweep::Progress::new();
    log.for_each_record(&Since::All, &mut |r| {
        progress.row(|| format!("audit verify: {} records checked (seq {})", v.count, r.seq));
        check(&mut v, &r)
    })?;
    drop(progress);
    end(&v)
}
