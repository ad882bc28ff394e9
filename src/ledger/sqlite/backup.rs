//! [`Backup`] for SQLite: a consistent copy of the ledger file while workers keep writing.
//!
//! `VACUUM INTO` reads the ledger inside one read transaction (WAL lets writers go on), so the
//! copy is exactly the ledger as of one commit: never half a batch. The copy is created 0600
//! before SQLite writes into it, checked with `PRAGMA integrity_check`, and never overwrites an
//! existing file. Needs no `sqlite3` binary (the ledger's SQLite is bundled).

use super::ledger::SqliteLedger;
use crate::error::{Error, Result};
use crate::ledger::{Backup, BackupCopied};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

impl Backup for SqliteLedger {
    fn backup(&self, out: &Path) -> Result<BackupCopied> {
        create_empty_private(out)?;
        let result = self.copy(out);
        if result.is_err() {
            // A partial copy must not be mistaken for a backup.
            let _ = std::fs::remove_file(out);
        }
        result
    }
}

impl SqliteLedger {
    fn copy(&self, out: &Path) -> Result<BackupCopied> {
        // The copy must say which ledger it is, so `restore` can match it with the events
        // stream's mark: a ledger no relay has run on yet gets its id now.
        crate::ledger::Outbox::ledger_id(self)?;
        let target = out
            .to_str()
            .ok_or_else(|| Error::Config(format!("backup path {} is not UTF-8", out.display())))?;
        self.conn()?.execute("VACUUM INTO ?1", [target])?;
        // The copy is another file: put back by hand over a ledger whose -wal is still there,
        // it must not pass for the file that -wal belongs to (`identity.rs`).
        super::identity::renew(&Connection::open(out)?)?;
        let copy = Connection::open_with_flags(out, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let integrity: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if integrity != "ok" {
            return Err(Error::Invariant(format!(
                "backup {} failed integrity_check: {integrity}",
                out.display()
            )));
        }
        let count = |table: &str| -> Result<u64> {
            let n: i64 =
                copy.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
            Ok(n as u64)
        };
        Ok(BackupCopied {
            claims: count("processed_messages")?,
            audit_records: count("audit_log")?,
            bytes: std::fs::metadata(out)
                .map_err(|e| Error::io("reading the backup's size", e))?
                .len(),
        })
    }
}

/// Creates `out` empty with mode 0600 (VACUUM INTO accepts an empty file), refusing to
/// overwrite anything.
fn create_empty_private(out: &Path) -> Result<()> {
    crate::support::files::create_private(out)
        .map(drop)
        .map_err(|e| Error::Config(format!("cannot create backup {}: {e}", out.display())))
}
