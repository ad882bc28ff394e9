//! Which file a ledger's write-ahead log belongs to: a ledger copied by hand over one that was
//! not closed cleanly is refused before SQLite can merge the two.
//!
//! After a crash (`kill -9`, a power cut) the `-wal` beside the ledger holds committed
//! transactions not yet moved into the file. SQLite applies them at the next open to whatever
//! file is there, page by page: a backup copied over the ledger (`cp backup claimgate.db`) got
//! pages of another layout laid over it, and the worker went on writing into a file `verify`
//! then found malformed, while the claims that lived only in the log were gone (issue 40).
//!
//! So every ledger records a **file epoch** (`ledger_meta.file_epoch`, random, made at its
//! first open by `run` or `relay`), and every process that opens it writes that epoch into the
//! lock file (`<ledger>.lock`, `lock.rs`). `claimgate backup` gives its copy an epoch of its
//! own. At open, before any connection reads the ledger: when a `-wal` with frames is beside it
//! and the lock file names an epoch, the epoch the ledger *file* holds (read by SQLite with
//! `immutable=1`, which ignores the `-wal`) must be that one; another is a copy put there by
//! hand, refused as configuration (exit 2) with the way out, `claimgate restore`. Nothing is
//! changed: the `-wal` stays as it is, to recover the ledger it belongs to.
//!
//! What it cannot tell: a copy of the same file made by another tool (`cp`, `sqlite3 .backup`)
//! has the same epoch, and a ledger or backup made before file epochs existed has none; either
//! is let through, as before. The lock file is claimgate's own, opened with its own
//! descriptor; the ledger file is read only through SQLite (closing a descriptor of our own on
//! it would drop every POSIX lock SQLite holds on it in this process). The `-wal` is read
//! through a descriptor of our own: SQLite takes no POSIX lock on it (a WAL ledger's locks are
//! on the ledger file and the `-shm`, which is never opened here).

use crate::error::{Error, Result};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use std::path::Path;

/// The `ledger_meta` row holding the epoch.
const EPOCH_ROW: &str = "file_epoch";

/// A WAL file's header is 32 bytes; with no frame after it, it holds nothing to merge.
const WAL_HEADER_BYTES: u64 = 32;

/// Refuses (exit 2) a ledger file that is not the one the `-wal` beside it belongs to. Runs
/// before any connection reads the ledger; `lock_epoch` is what the lock file names.
pub(super) fn refuse_a_stranger_to_its_wal(db: &Path, lock_epoch: Option<&str>) -> Result<()> {
    let Some(expected) = lock_epoch else {
        return Ok(());
    };
    let wal = super::files::sidecar(db, "-wal");
    let has_frames = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_HEADER_BYTES);
    if !has_frames {
        return Ok(());
    }
    match epoch_of_the_file_alone(db) {
        Some(found) if found != expected => Err(Error::Config(format!(
            "ledger {} is not the file its write-ahead log {} belongs to (the file is ledger \
             file {found}, the log was written for {expected}): a copy was put in place of a \
             ledger that had not been closed cleanly. Nothing was opened or changed, and the \
             log is left as it is. Put a backup back with `claimgate restore BACKUP` (move \
             this copy away and put the ledger file back first, so its log is kept)",
            db.display(),
            wal.display()
        ))),
        _ => Ok(()),
    }
}

/// The epoch the ledger file itself holds, read by SQLite without its `-wal` (`immutable`);
/// `None` when it has none or cannot be read so (not a ledger yet, a page being written by a
/// checkpoint elsewhere): no opinion, never a refusal.
fn epoch_of_the_file_alone(db: &Path) -> Option<String> {
    let path = db.to_str()?;
    let escaped = path
        .replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(format!("file:{escaped}?immutable=1"), flags).ok()?;
    conn.query_row(
        "SELECT value FROM ledger_meta WHERE name = ?1",
        [EPOCH_ROW],
        |r| r.get(0),
    )
    .ok()
}

/// The ledger's epoch, made now if it has none and `make` (a writer's open).
pub(super) fn epoch(conn: &Connection, make: bool) -> Result<Option<String>> {
    let found: Option<String> = conn
        .query_row(
            "SELECT value FROM ledger_meta WHERE name = ?1",
            [EPOCH_ROW],
            |r| r.get(0),
        )
        .optional()?;
    if found.is_some() || !make {
        return Ok(found);
    }
    let fresh = fresh_epoch();
    conn.execute(
        "INSERT OR IGNORE INTO ledger_meta (name, value) VALUES (?1, ?2)",
        [EPOCH_ROW, &fresh],
    )?;
    Ok(Some(conn.query_row(
        "SELECT value FROM ledger_meta WHERE name = ?1",
        [EPOCH_ROW],
        |r| r.get(0),
    )?))
}

/// Gives a backup copy an epoch of its own, so a copy put back by hand over a crashed ledger
/// is told apart from the ledger its `-wal` belongs to.
pub(super) fn renew(copy: &Connection) -> Result<()> {
    copy.execute(
        "INSERT OR REPLACE INTO ledger_meta (name, value) VALUES (?1, ?2)",
        [EPOCH_ROW, &fresh_epoch()],
    )?;
    Ok(())
}

/// 128 random bits as hex.
fn fresh_epoch() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}
