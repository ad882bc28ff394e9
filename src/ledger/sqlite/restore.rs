//! [`Restoring`] for SQLite: `claimgate restore BACKUP` puts a backup file in place of the
//! ledger, whole or not at all.
//!
//! 1. Take `<ledger>.lock` exclusively (`lock.rs`): refused while any claimgate process has the
//!    ledger open, and no process can open (or create) it until the restore is done.
//! 2. Copy the backup with `VACUUM INTO` to a new 0600 file in the ledger's directory (so the
//!    final step is a rename within one filesystem); check its integrity and that it is a
//!    claimgate ledger. The backup itself is only read.
//! 3. The caller reads the events stream's mark and calls [`Restoring::adopt_mark`], which
//!    changes the copy only (one transaction).
//! 4. [`Restoring::commit`]: the ledger being replaced, with its `-wal`, is linked under
//!    `<ledger>.replaced-<time>` (a hard link: never a copy, never over an existing file), its
//!    `-wal` and `-shm` are removed, and the copy is renamed over the ledger path, which is
//!    atomic. At every moment the path holds the old ledger or the new one, never a part of
//!    either; the old ledger stays whole under its new name.
//!
//! Dropped before `commit` (an error, a refused mark), the copy is deleted and nothing else
//! has changed.

use super::files::sidecar;
use super::{audit_store, lock, outbox};
use crate::domain::audit::{detail, Kind, Record};
use crate::error::{Error, Result};
use crate::ledger::{Replaced, Restoring};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};

/// A backup copied beside the ledger, waiting to be swapped in.
pub(crate) struct Restore {
    /// The ledger path being replaced.
    db: PathBuf,
    /// The backup it came from, for the `restored` record and messages.
    backup: PathBuf,
    /// The copy (deleted on drop unless committed).
    copy: Option<tempfile::NamedTempFile>,
    /// The copy's `ledger_meta.ledger_id`.
    ledger_id: Option<String>,
    /// The copy's highest outbox id ever assigned.
    outbox_id_max: i64,
    /// Held until the swap is done.
    _lock: lock::LedgerLock,
}

/// Steps 1 and 2: lock the ledger, copy and check the backup.
pub(crate) fn prepare(db: &Path, backup: &Path) -> Result<Restore> {
    // The file itself, not a link to it: the lock and the swap are the real file's.
    let db = &super::files::real_file(db);
    if !backup.is_file() {
        return Err(Error::Config(format!(
            "no backup file at {}",
            backup.display()
        )));
    }
    let dir = match db.parent() {
        Some(d) if d.as_os_str().is_empty() => Path::new("."),
        Some(d) => d,
        None => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::Config(format!(
            "the ledger's directory {} does not exist",
            dir.display()
        )));
    }
    if db.exists() && same_file(db, backup)? {
        return Err(Error::Config(format!(
            "{} is the ledger itself, not a backup of it",
            backup.display()
        )));
    }
    let held = lock::exclusive(db, "restore")?;
    let copy = tempfile::Builder::new()
        .prefix(".claimgate-restore-")
        .tempfile_in(dir)
        .map_err(|e| Error::io(format!("creating a file in {}", dir.display()), e))?;
    copy_into(backup, copy.path())?;
    let conn = Connection::open(copy.path())?;
    let ledger_id = conn
        .query_row(
            "SELECT value FROM ledger_meta WHERE name = 'ledger_id'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let outbox_id_max = outbox::outbox_id_max(&conn)?;
    Ok(Restore {
        db: db.to_owned(),
        backup: backup.to_owned(),
        copy: Some(copy),
        ledger_id,
        outbox_id_max,
        _lock: held,
    })
}

/// True when `a` and `b` are one file (same device and inode).
fn same_file(a: &Path, b: &Path) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let meta = |p: &Path| {
        std::fs::metadata(p).map_err(|e| Error::io(format!("reading {}", p.display()), e))
    };
    let (a, b) = (meta(a)?, meta(b)?);
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// Copies the backup into the empty file `out` with `VACUUM INTO` (a consistent copy that
/// keeps every rowid and `sqlite_sequence`), then checks it.
fn copy_into(backup: &Path, out: &Path) -> Result<()> {
    let unreadable = |e: rusqlite::Error| {
        Error::Config(format!(
            "{} cannot be read as a ledger backup: {e}",
            backup.display()
        ))
    };
    let source = Connection::open_with_flags(backup, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(unreadable)?;
    let tables: i64 = source
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'
             AND name IN ('processed_messages', 'disbursements', 'outbox', 'audit_log', 'ledger_meta')",
            [],
            |r| r.get(0),
        )
        .map_err(unreadable)?;
    if tables != 5 {
        return Err(Error::Config(format!(
            "{} is not a claimgate ledger (it lacks the ledger's tables)",
            backup.display()
        )));
    }
    // A backup of a newer claimgate is refused as its ledger would be, before it is copied.
    super::format::refuse_newer(&source, backup)?;
    let target = out
        .to_str()
        .ok_or_else(|| Error::Config(format!("path {} is not UTF-8", out.display())))?;
    source.execute("VACUUM INTO ?1", [target])?;
    let copy = Connection::open(out)?;
    // One file, no `-wal` beside it, whatever mode the backup was in: the rename in `commit`
    // moves the main file only. The first open after the restore turns WAL back on.
    copy.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))?;
    let integrity: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if integrity != "ok" {
        return Err(Error::Other(format!(
            "backup {} fails SQLite's integrity check: {integrity}; nothing was restored",
            backup.display()
        )));
    }
    Ok(())
}

impl Restoring for Restore {
    fn ledger_id(&self) -> Option<String> {
        self.ledger_id.clone()
    }

    fn outbox_id_max(&self) -> i64 {
        self.outbox_id_max
    }

    fn adopt_mark(&mut self, upto: i64, now: &str, events_stream: &str) -> Result<u64> {
        let copy = self.copy.as_ref().expect("present until commit");
        let mut conn = Connection::open(copy.path())?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let derives = super::derived::Derives::of(&tx)?.outbox;
        let marked = super::outbox::mark(&tx, derives, now, upto)?;
        if upto > 0 {
            super::outbox::note_published_upto(&tx, events_stream, upto)?;
        }
        // AUTOINCREMENT gives the next row max(seq, max(id)) + 1, so raising `seq` is enough.
        let next_after = self.outbox_id_max.max(upto);
        tx.execute("DELETE FROM sqlite_sequence WHERE name = 'outbox'", [])?;
        tx.execute(
            "INSERT INTO sqlite_sequence (name, seq) VALUES ('outbox', ?1)",
            [next_after],
        )?;
        // The relay's exactly-once argument needs every new row above the mark it skips to.
        assert_eq!(
            super::outbox::outbox_id_max(&tx)?,
            next_after,
            "the restored copy's outbox sequence did not move to {next_after}"
        );
        let backup = self.backup.display().to_string();
        let restored = audit_store::append(
            &tx,
            Record {
                detail: Some(detail::restored(&backup, upto, marked as u64, next_after)),
                ..Record::unsealed(Kind::Restored, now)
            },
        )?;
        super::counts::Delta::of_records([&restored]).apply_if_kept(&tx)?;
        tx.commit()?;
        self.outbox_id_max = next_after;
        Ok(marked as u64)
    }

    fn commit(mut self: Box<Self>) -> Result<Option<Replaced>> {
        let copy = self.copy.take().expect("present until commit");
        copy.as_file()
            .sync_all()
            .map_err(|e| Error::io("syncing the restored copy", e))?;
        let aside = if self.db.exists() {
            Some(self.set_aside()?)
        } else {
            None
        };
        // Over the old name (whose file is kept under `aside`), or onto a free one: under the
        // exclusive lock no claimgate process can have created a ledger here meanwhile.
        copy.persist(&self.db).map_err(|e| {
            Error::io(
                format!("putting the copy in place at {}", self.db.display()),
                e.error,
            )
        })?;
        sync_dir(&self.db)?;
        aside
            .map(|path| {
                let (claims_only_there, cents_only_there) = paid_only_in(&path, &self.db)?;
                Ok(Replaced {
                    path,
                    claims_only_there,
                    cents_only_there,
                })
            })
            .transpose()
    }
}

/// Claims of the ledger at `replaced` that the ledger at `restored` does not hold, and their
/// disbursements in cents: what was paid after the backup, now only in the replaced file.
/// Each claim is looked up by the restored ledger's claim index (instant, award, key).
fn paid_only_in(replaced: &Path, restored: &Path) -> Result<(u64, i64)> {
    let conn = Connection::open_with_flags(replaced, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.execute(
        "ATTACH DATABASE ?1 AS restored",
        [restored.to_string_lossy()],
    )?;
    let found = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(d.amount_cents), 0)
         FROM processed_messages o JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE NOT EXISTS (SELECT 1 FROM restored.processed_messages p
                           WHERE p.submission_instant = o.submission_instant
                             AND p.award_id = o.award_id
                             AND p.idempotency_key = o.idempotency_key)",
        [],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)?)),
    )?;
    Ok(found)
}

impl Restore {
    /// Keeps the ledger being replaced whole under `<ledger>.replaced-<time>` (hard links to
    /// the same files, made before anything is removed) and clears its `-wal` and `-shm` from
    /// the ledger path, so the restored file is not read with the old ledger's log.
    fn set_aside(&self) -> Result<PathBuf> {
        checkpoint_quietly(&self.db);
        let stamp = crate::domain::clock::now_rfc3339()
            .replace([':', '-'], "")
            .replace('.', "_");
        let aside = sidecar(&self.db, &format!(".replaced-{stamp}"));
        let link = |from: &Path, to: &Path| {
            std::fs::hard_link(from, to).map_err(|e| {
                Error::io(format!("keeping {} as {}", from.display(), to.display()), e)
            })
        };
        link(&self.db, &aside)?;
        let wal = sidecar(&self.db, "-wal");
        if wal.exists() {
            link(&wal, &sidecar(&aside, "-wal"))?;
        }
        for suffix in ["-wal", "-shm"] {
            let file = sidecar(&self.db, suffix);
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", file.display()), e)),
            }
        }
        Ok(aside)
    }
}

/// Moves what the old ledger's `-wal` holds into its main file, so the copy kept aside is one
/// file; a ledger too damaged for that keeps its `-wal` beside it (linked under the new name).
fn checkpoint_quietly(db: &Path) {
    let result = Connection::open(db)
        .and_then(|c| c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())));
    if let Err(e) = result {
        log::warn!(
            "could not checkpoint the ledger being replaced ({e}); its -wal is kept beside it"
        );
    }
}

/// Makes the rename durable: fsync the directory holding the ledger.
fn sync_dir(db: &Path) -> Result<()> {
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), e))
}
