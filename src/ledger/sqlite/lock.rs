//! Who has the ledger open: an advisory lock on `<ledger>.lock`, beside the ledger file.
//!
//! Every [`super::SqliteLedger`] holds a shared `flock` on it for as long as it is open (a
//! worker, a relay, `status`, a purge: any claimgate process using the ledger), and `restore`
//! takes it exclusively, without waiting, before it changes anything: so a restore never swaps
//! the file under a process still writing to the old one, and a process starting during a
//! restore waits (its open fails as transient and is retried) instead of creating a ledger.
//!
//! A file of its own, not a lock on the ledger file: SQLite's own locks are POSIX `fcntl` locks,
//! which a process loses on *every* descriptor of a file the moment it closes *any* descriptor
//! of that file, so claimgate must never open and close the ledger file itself beside SQLite.
//! `flock` locks on another file are independent of all that.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A held lock; released when dropped (or when the process ends, however it ends).
#[derive(Debug)]
pub(super) struct LedgerLock {
    /// The open lock file; the lock lives as long as this descriptor.
    _file: File,
}

impl LedgerLock {
    /// The ledger file epoch the lock file names (`identity.rs`), if it names one.
    pub(super) fn epoch(&self) -> Option<String> {
        use std::io::Read;
        let mut text = String::new();
        (&self._file).take(256).read_to_string(&mut text).ok()?;
        let epoch = text.trim().strip_prefix(EPOCH_PREFIX)?;
        (!epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| epoch.to_owned())
    }

    /// Writes `epoch` as the one the lock file names, in one write at its start. Every process
    /// with the ledger open writes the same value (a ledger's epoch never changes in place).
    pub(super) fn record_epoch(&self, epoch: &str) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let line = format!("{EPOCH_PREFIX}{epoch}\n");
        self._file
            .write_all_at(line.as_bytes(), 0)
            .and_then(|()| self._file.set_len(line.len() as u64))
            .map_err(|e| Error::io("recording the ledger's file epoch in its lock file", e))
    }
}

/// What the lock file's one line starts with, before the epoch.
const EPOCH_PREFIX: &str = "claimgate ledger file epoch ";

/// The lock file of the ledger at `db`.
pub(super) fn path(db: &Path) -> PathBuf {
    super::files::sidecar(db, ".lock")
}

/// Opens (creating 0600 if absent; an existing one is only opened, never truncated) the lock
/// file of `db`.
fn open(db: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(crate::support::files::PRIVATE_MODE)
        .open(path(db))
}

/// `flock` without waiting; `Ok(false)` when another holder is in the way.
fn try_flock(file: &File, operation: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor this function's caller owns; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), operation | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// The shared lock every open ledger holds. A restore under way is transient (the open is
/// retried by long-running processes). A missing directory gets no lock (there is no ledger,
/// and the open fails naming the path); nor does a directory this process may not write to
/// (a read-only `status` by another user): such a process cannot be harmed by a restore,
/// which swaps the file's name, not the file it has open.
pub(super) fn shared(db: &Path) -> Result<Option<LedgerLock>> {
    let file = match open(db) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Ok(None),
        // No directory, so no ledger to protect: the open step's own error names the path.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => return Ok(None),
        Err(e) => return Err(Error::io(format!("opening {}", path(db).display()), e)),
    };
    match try_flock(&file, libc::LOCK_SH) {
        Ok(true) => Ok(Some(LedgerLock { _file: file })),
        Ok(false) => Err(Error::ledger(
            format!(
                "ledger {} is being restored or migrated (claimgate restore or migrate holds it)",
                db.display()
            ),
            crate::error::Fault::Transient,
        )),
        Err(e) => Err(Error::io(format!("locking {}", path(db).display()), e)),
    }
}

/// The exclusive lock `restore` holds while it replaces the ledger, and `migrate` while it
/// copies it (`doing`, for the message); refused (exit 1, saying why) while any claimgate
/// process has the ledger open.
pub(super) fn exclusive(db: &Path, doing: &str) -> Result<LedgerLock> {
    let file = open(db)
        .map_err(|e| Error::Config(format!("cannot create {}: {e}", path(db).display())))?;
    match try_flock(&file, libc::LOCK_EX) {
        Ok(true) => Ok(LedgerLock { _file: file }),
        Ok(false) => Err(Error::Other(format!(
            "ledger {} is in use: a claimgate process (a worker, a relay or another command) \
             has it open ({} is locked); stop it, then {doing}",
            db.display(),
            path(db).display()
        ))),
        Err(e) => Err(Error::io(format!("locking {}", path(db).display()), e)),
    }
}
