//! Files claimgate writes: owner-only (0600), and never an existing file silently overwritten.
//!
//! Ledger files, backups, purge exports, audit logs and worker logs can all hold award ids and
//! amounts. Every one is created through this module so none is ever world-readable, whatever
//! the umask, and none replaces a file an operator already has.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Owner read and write, nothing for group or others.
pub const PRIVATE_MODE: u32 = 0o600;

/// Creates `path` as a new, empty, 0600 file open for writing. An existing path is an error
/// (`ErrorKind::AlreadyExists`), never truncated or reused.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_MODE)
        .open(path)
}

/// Opens `path` for appending, creating it 0600 if it does not exist: for a log that a restart
/// continues rather than replaces. An existing file is appended to only if it is a plain file
/// (not a symlink, whose target would be written through, nor a FIFO, which would hang), and
/// its first line is `looks_right`: what this log holds, so a mistyped path cannot add lines
/// to a key file, a ledger or anything else. Its mode is then made owner-only.
pub fn append_private(path: &Path, looks_right: fn(&str) -> bool) -> std::io::Result<File> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::PermissionsExt;
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .mode(PRIVATE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Error::new(
                ErrorKind::InvalidInput,
                "is a symlink; name the file itself",
            ),
            Some(libc::ENXIO) => Error::new(ErrorKind::InvalidInput, "is a FIFO, not a file"),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "is not a plain file"));
    }
    if meta.len() > 0 {
        let mut head = Vec::with_capacity(4096);
        (&mut file).take(4096).read_to_end(&mut head)?;
        let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
        if !std::str::from_utf8(first).is_ok_and(looks_right) {
            return Err(Error::new(
                ErrorKind::InvalidData,
                "holds something else (its first line is not one this file takes); \
                 name a new file or one it wrote",
            ));
        }
    }
    if meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(PRIVATE_MODE))?;
    }
    Ok(file)
}

/// Makes an existing `path` owner-only if group or others have any access to it, by taking
/// their bits away (0644 becomes 0600, a read-only 0444 becomes 0400: the owner gains nothing),
/// and returns the mode it had and the mode it has now; `Ok(None)` if it was already private or
/// does not exist. For files that must be private but were not made here (an operator's copy, a
/// restored backup).
pub fn make_private(path: &Path) -> std::io::Result<Option<(u32, u32)>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    let private = mode & !0o077;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(private))?;
    Ok(Some((mode, private)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn new_files_are_owner_only_and_existing_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        create_private(&path).unwrap().write_all(b"kept").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, PRIVATE_MODE);
        let again = create_private(&path).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
    }

    #[test]
    fn appending_keeps_what_was_there_and_creates_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let ours = |line: &str| line.starts_with("log ");
        append_private(&path, ours)
            .unwrap()
            .write_all(b"log a\n")
            .unwrap();
        append_private(&path, ours)
            .unwrap()
            .write_all(b"log b\n")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"log a\nlog b\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, PRIVATE_MODE);
        // Another kind of file, a symlink to this one: refused, nothing written.
        let other = dir.path().join("key");
        std::fs::write(&other, b"secret\n").unwrap();
        let e = append_private(&other, ours).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(std::fs::read(&other).unwrap(), b"secret\n");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = append_private(&link, ours).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(std::fs::read(&path).unwrap(), b"log a\nlog b\n");
    }

    #[test]
    fn loose_files_are_made_owner_only_and_private_ones_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        assert_eq!(make_private(&path).unwrap(), None, "no file, nothing to do");
        std::fs::write(&path, b"kept").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(make_private(&path).unwrap(), Some((0o644, PRIVATE_MODE)));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), PRIVATE_MODE);
        assert_eq!(make_private(&path).unwrap(), None, "already private");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        assert_eq!(
            make_private(&path).unwrap(),
            Some((0o444, 0o400)),
            "a read-only file is never made writable"
        );
        assert_eq!(mode(&path), 0o400);
        assert_eq!(
            make_private(&path).unwrap(),
            None,
            "owner-only, even if not 0600"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
    }
}
