//! The ledger's files on disk: made owner-only, and refused when a `--db` names something that
//! is not a ledger, before SQLite or any mode change touches it.

use crate::error::{Error, Result};
use rusqlite::Connection;
use std::path::{Path, PathBuf};

/// Creates the ledger file with mode 0600 if it does not exist, so it is never world-readable,
/// and turns "no such directory" or "permission denied" into a configuration error; true if it
/// existed already.
///
/// An existing ledger, or a `-wal`/`-shm` left beside it by an earlier process, that group or
/// others can read is then made owner-only by [`make_ledger_private`] (0644 becomes 0600), with
/// a WARN naming the file and the mode it had. Changing it rather than only warning is
/// deliberate: SQLite creates `-wal` and `-shm` with the main file's mode (overriding the
/// umask), so a loose ledger would keep producing loose WAL files holding the latest payments,
/// and a warning alone would leave them readable. Copies are taken with `claimgate backup`,
/// which needs no group access to the live file.
pub(super) fn create_private(path: &Path) -> Result<bool> {
    match crate::support::files::create_private(path) {
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(true),
        Err(e) => Err(Error::Config(format!(
            "cannot create ledger {}: {e}",
            path.display()
        ))),
    }
}

/// Refuses (configuration error, exit 2) a `--db` path that exists but is not a file: a
/// directory or a device. Checked from its metadata alone, before anything is created beside
/// it. (A file is never opened here to look inside: closing any descriptor of a file drops
/// every POSIX lock this process holds on it, SQLite's included. SQLite itself says whether a
/// file is a database, in [`refuse_non_database`], before its mode is touched.)
///
/// A symlink to nothing is refused too: SQLite would create its target with the umask's mode,
/// not 0600. The `-wal` and `-shm` beside the ledger must be plain files or absent, never
/// symlinks: their modes are changed, and a planted link would have that done to its target.
pub(super) fn refuse_what_is_not_a_ledger(path: &Path) -> Result<()> {
    let refuse = |why: String| Err(Error::Config(format!("ledger {}: {why}", path.display())));
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return refuse("not a file (a directory or a device?); name the ledger's file".into())
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return refuse(
                    "a symlink to nothing; make the ledger where it points, or name it".into(),
                );
            }
        }
        Err(e) => return refuse(format!("cannot use it: {e}")),
    }
    for file in &ledger_files(path)[1..] {
        match std::fs::symlink_metadata(file) {
            Ok(meta) if !meta.file_type().is_file() => {
                return refuse(format!(
                    "{} is not a plain file (a symlink?), as SQLite's own never are",
                    file.display()
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The ledger file `path` names, through symlinks: the target's path when `path` is a symlink
/// to something, else `path` itself (a symlink to nothing is refused later, by
/// [`refuse_what_is_not_a_ledger`]).
///
/// **Why:** the lock file sits beside the path it is given (`lock.rs`), and SQLite puts `-wal`
/// and `-shm` beside the symlink's target. A worker opening the ledger through a link and a
/// `restore` naming the real file would take locks on two different files, and the restore
/// would swap the ledger under the running worker; a restore through the link would put a
/// plain file in place of the link and leave the real ledger as it was. Every process resolves
/// the link first, so all of them lock, check and replace the one real file.
pub(crate) fn real_file(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
        }
        _ => path.to_owned(),
    }
}

/// Refuses (configuration error, exit 2) a file SQLite says is not a database, as its first
/// read of the header does: someone's text file named by a mistyped `--db`, left as it was.
pub(super) fn refuse_non_database(conn: &Connection, path: &Path) -> Result<()> {
    match conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    }) {
        Err(rusqlite::Error::SqliteFailure(f, _))
            if f.code == rusqlite::ErrorCode::NotADatabase =>
        {
            Err(Error::Config(format!(
                "{} is not a SQLite database, so not a ledger; left as it is",
                path.display()
            )))
        }
        // Anything else (a lock held elsewhere, say) is for the steps after to meet and say.
        _ => Ok(()),
    }
}

/// A ledger's three files: itself, its `-wal` and its `-shm`.
pub(super) fn ledger_files(path: &Path) -> [PathBuf; 3] {
    [
        path.to_owned(),
        sidecar(path, "-wal"),
        sidecar(path, "-shm"),
    ]
}

/// Makes an existing ledger and the `-wal` and `-shm` beside it owner-only ([`create_private`]
/// says why), once SQLite has said the ledger is a database. SQLite's first read made any
/// `-wal` or `-shm` that was missing, with the ledger's loose mode: those are changed without
/// a warning, as nobody left them loose; one that was there before (`existed`) is named.
pub(super) fn make_ledger_private(path: &Path, existed: [bool; 3]) {
    for (file, existed) in ledger_files(path).iter().zip(existed) {
        if existed {
            make_private(file);
        } else if let Err(e) = crate::support::files::make_private(file) {
            log::warn!(
                "ledger file {}: could not make it owner-only ({e}); using it as it is",
                file.display()
            );
        }
    }
}

/// SQLite's name for a file beside the ledger: its path with `suffix` appended.
pub(super) fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes one existing ledger file owner-only, saying so; a file that cannot be changed (owned
/// by someone else) is named in a WARN and used as it is.
pub(super) fn make_private(file: &Path) {
    match crate::support::files::make_private(file) {
        Ok(None) => {}
        Ok(Some((was, now))) => log::warn!(
            "ledger file {} had mode {was:04o} (readable beyond its owner); changed it to {now:04o}",
            file.display()
        ),
        Err(e) => log::warn!(
            "ledger file {}: could not check its mode or make it owner-only ({e}); using it as it is",
            file.display()
        ),
    }
}
