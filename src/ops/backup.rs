//! `claimgate backup FILE`: a consistent copy of the ledger while workers keep writing, made by
//! the backend itself ([`Backup`](crate::ledger::Backup); for SQLite, `VACUUM INTO`, see
//! `ledger/sqlite/backup.rs`). The copy is a new 0600 file, never an overwritten one, and is
//! checked before it is reported.

use crate::error::Result;
use crate::ledger::Backend;
use std::path::Path;

/// The body of `claimgate backup`: copies `ledger` to `out`, which must not exist yet.
pub fn run(ledger: &dyn Backend, out: &Path) -> Result<()> {
    let c = ledger.backup(out)?;
    println!(
        "backed up {} to {} ({} claims, {} audit records, {} bytes; integrity ok)",
        ledger.describe(),
        out.display(),
        c.claims,
        c.audit_records,
        c.bytes
    );
    Ok(())
}
