//! `claimgate backup FILE`: a consistent copy of the ledger while workers keep writing.
//!
//! `VACUUM INTO` reads the ledger inside one read transaction (WAL lets writers go on), so the
//! copy is exactly the ledger as of one commit: never half a batch. The copy is created 0600
//! before SQLite writes into it, checked with `PRAGMA integrity_check`, and never overwrites an
//! existing file. Needs no `sqlite3` binary (the ledger's SQLite is bundled).

use crate::error::{Error, Result};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// What a backup copied, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Claims in the copy.
    pub claims: i64,
    /// Audit records in the copy.
    pub audit_records: i64,
    /// Size of the copy in bytes.
    pub bytes: u64,
}

/// Copies the ledger at `db` to `out`, which must not exist yet.
pub fn backup(db: &Path, out: &Path) -> Result<Copied> {
    if !db.exists() {
        return Err(Error::Config(format!("no ledger at {}", db.display())));
    }
    create_empty_private(out)?;
    let result = copy(db, out);
    if result.is_err() {
        // A partial copy must not be mistaken for a backup.
        let _ = std::fs::remove_file(out);
    }
    result
}

fn copy(db: &Path, out: &Path) -> Result<Copied> {
    let source = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    source.busy_timeout(std::time::Duration::from_millis(
        crate::config::BUSY_TIMEOUT_MS_DEFAULT,
    ))?;
    let target = out
        .to_str()
        .ok_or_else(|| Error::Config(format!("backup path {} is not UTF-8", out.display())))?;
    source.execute("VACUUM INTO ?1", [target])?;
    let copy = Connection::open_with_flags(out, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let integrity: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if integrity != "ok" {
        return Err(Error::Invariant(format!(
            "backup {} failed integrity_check: {integrity}",
            out.display()
        )));
    }
    let count = |table: &str| -> Result<i64> {
        Ok(copy.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?)
    };
    Ok(Copied {
        claims: count("processed_messages")?,
        audit_records: count("audit_log")?,
        bytes: std::fs::metadata(out)
            .map_err(|e| Error::io("reading the backup's size", e))?
            .len(),
    })
}

/// Creates `out` empty with mode 0600 (VACUUM INTO accepts an empty file), refusing to
/// overwrite anything.
fn create_empty_private(out: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map(drop)
        .map_err(|e| Error::Config(format!("cannot create backup {}: {e}", out.display())))
}

/// The body of `claimgate backup`.
pub fn run(db: &Path, out: &Path) -> Result<()> {
    let c = backup(db, out)?;
    println!(
        "backed up {} to {} ({} claims, {} audit records, {} bytes; integrity ok)",
        db.display(),
        out.display(),
        c.claims,
        c.audit_records,
        c.bytes
    );
    Ok(())
}
