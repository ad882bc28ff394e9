//! `claimgate verify` and `claimgate audit verify`: the ledger checked against itself and its
//! audit chain, reporting the first violation found.
//!
//! The ledger's own checks are each backend's [`Inspect::verify`] (one read snapshot, the
//! chain included); the chain alone, from the ledger or from an exported file, is walked with
//! [`ledger::chain`], the same walk every backend uses.
//!
//! Invariant: this module only reads.

use crate::domain::audit::{Record, Verifier};
use crate::error::{Error, Result};
use crate::ledger::{self, AuditLog, Inspect, Summary};
use std::io::BufRead;
use std::path::Path;

/// Checks every invariant of the ledger; returns the summary, or `Error::Invariant` naming the
/// first violation.
pub fn ledger(ledger: &dyn Inspect) -> Result<Summary> {
    ledger.verify()
}

/// Recomputes the ledger's audit chain; returns the record count and head hash, or
/// `Error::Invariant` naming the first broken record.
pub fn chain(log: &dyn AuditLog) -> Result<(u64, String)> {
    ledger::chain::verify(log)
}

/// Verifies an exported file: `audit export` output, or a purge export (whose `audit_log`
/// lines are checked and other tables' lines skipped). `continuing_from` is the hash the first
/// record must link to when the file starts mid-chain (`audit export --since`).
pub fn file(path: &Path, continuing_from: Option<&str>) -> Result<(u64, String)> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let mut v = continuing_from
        .map(Verifier::continuing_from)
        .unwrap_or_default();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |e: serde_json::Error| {
            Error::Invariant(format!(
                "{} line {}: not an audit record ({e})",
                path.display(),
                n + 1
            ))
        };
        let value: serde_json::Value = serde_json::from_str(&line).map_err(bad)?;
        let record = match value.get("table").and_then(|t| t.as_str()) {
            None => serde_json::from_value::<Record>(value).map_err(bad)?,
            Some("audit_log") => {
                serde_json::from_value::<Record>(value["row"].clone()).map_err(bad)?
            }
            Some(_) => continue,
        };
        ledger::chain::check(&mut v, &record)?;
    }
    ledger::chain::end(&v)
}
