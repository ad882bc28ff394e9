//! Retention: nothing is ever deleted automatically. `claimgate retention purge --before DATE`
//! removes what was recorded before DATE, and only when DATE is at least three years back
//! (2 CFR 200.334) and no record in the range names an award under legal hold.
//!
//! Order of work: plan (the audit prefix to remove), refuse (window, holds, unpublished
//! events), export everything the plan removes to a file and fsync it, then delete in bounded
//! batches. The ledger does each step when asked ([`Retention`](crate::ledger::Retention));
//! the policy — the window, the refusals, the export file — is this module's. A purge killed
//! at any point leaves a ledger that passes `verify` and `audit verify`, and the export already
//! on disk.
//!
//! Invariant: nothing is deleted that is not first in the fsynced export file.

use crate::config::LedgerLocation;
use crate::domain::anchor::sign_checkpoint_detail;
use crate::domain::clock::{ledger_time, now_rfc3339};
use crate::domain::signing::SigningKey;
use crate::error::{Error, Result};
use crate::ledger::{Backend, PurgePlan, Removed, Since};
use crate::support::failpoint;
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// How long records are kept at least (2 CFR 200.334: three years from the final report).
pub const RETENTION_YEARS: i32 = 3;
/// Default audit records removed per transaction (with the ledger rows they describe).
pub const PURGE_BATCH_RECORDS_MAX: usize = 1_000;

/// What a purge did.
#[derive(Debug, Clone)]
pub struct Purged {
    /// The export file written before anything was deleted.
    pub export: PathBuf,
    /// The export file's SHA-256, also sealed into the checkpoint record.
    pub export_sha256: String,
    /// The last audit seq removed; the checkpoint now sits there.
    pub through_seq: i64,
    /// Totals over all batches.
    pub removed: Removed,
}

/// Parses `--before`: a date (`2022-01-31`, midnight UTC) or an RFC 3339 date-time.
pub fn parse_cutoff(s: &str) -> Result<OffsetDateTime> {
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t);
    }
    let date = time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]"))
        .map_err(|_| {
            Error::Config(format!(
                "--before {s:?} is neither a date (YYYY-MM-DD) nor an RFC 3339 date-time"
            ))
        })?;
    Ok(date.midnight().assume_utc())
}

/// The latest cutoff a purge may use: `RETENTION_YEARS` before `now`.
pub fn window_start(now: OffsetDateTime) -> OffsetDateTime {
    let year = now.year() - RETENTION_YEARS;
    // 29 February has no counterpart three years on or back; the day before is conservative.
    now.replace_year(year).unwrap_or_else(|_| {
        (now - time::Duration::days(1))
            .replace_year(year)
            .expect("28 Feb exists")
    })
}

/// What the operator asked to purge.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `--before`: a date or RFC 3339 date-time at least three years back.
    pub before: &'a str,
    /// Where to export first; `None` for a file next to the ledger.
    pub export: Option<&'a Path>,
    /// Where the ledger is (`--db`), which names the default export.
    pub ledger_at: &'a LedgerLocation,
    /// Audit records removed per transaction.
    pub batch_records_max: usize,
    /// `--signing-key`: sign each checkpoint the purge leaves, so `audit verify --public-key`
    /// can tell it from a hand-made one.
    pub signing_key: Option<&'a SigningKey>,
}

/// Purges everything recorded before `req.before`, exporting it first. `Ok(None)` when there
/// is nothing that old.
pub fn purge(ledger: &dyn Backend, req: &Request<'_>) -> Result<Option<Purged>> {
    let before = req.before;
    let cutoff_time = parse_cutoff(before)?;
    let latest = window_start(OffsetDateTime::now_utc());
    if cutoff_time > latest {
        return Err(Error::Config(format!(
            "refusing to purge: --before {before} reaches into the {RETENTION_YEARS}-year retention window \
             (2 CFR 200.334); the latest allowed is {}",
            ledger_time(latest)
        )));
    }
    let cutoff = ledger_time(cutoff_time);
    let export_path = req
        .export
        .map(Path::to_owned)
        .unwrap_or_else(|| default_export_path(req.ledger_at, &ledger.describe()));
    // Created by `admit`, once the plan is allowed, and written by `row`.
    let export = RefCell::new(None::<Export>);
    let Some((plan, ends)) = ledger.export_purge(
        &cutoff,
        req.batch_records_max.max(1),
        &mut |plan| {
            refuse_if_held_or_unpublished(plan, &cutoff)?;
            *export.borrow_mut() = Some(Export::create(&export_path)?);
            Ok(())
        },
        &mut |row| {
            export
                .borrow_mut()
                .as_mut()
                .expect("rows come only after admit")
                .write(row)
        },
    )?
    else {
        return Ok(None);
    };
    let export = export.into_inner().expect("an admitted plan was exported");
    let digest = export.finish()?;
    let (first, last) = (plan.first, plan.last);
    let mut removed = Removed::default();
    let mut lo = first;
    let mut episode = crate::retry::Episode::new("a purge batch");
    for hi in ends {
        let detail = format!(
            "retention purge of records before {cutoff}: removed seq {first}..={hi} of {first}..={last}; \
             all of it exported to {} (sha256 {digest})",
            export_path.display()
        );
        let detail = match req.signing_key {
            Some(key) => sign_checkpoint(ledger, &detail, hi, key)?,
            None => detail,
        };
        // A batch is one transaction: one that failed for a passing reason (the write lock
        // held past the busy timeout by a worker's commit, a full disk) left nothing and is
        // tried again, as a worker tries its batches; the purge beside a busy worker on a
        // 10,000,000-claim ledger used to stop at the first, with "database is locked".
        let r = loop {
            match ledger.purge_batch(lo, hi, &cutoff, &detail, &now_rfc3339()) {
                Err(e) if e.is_transient() => std::thread::sleep(episode.failed(&e)),
                done => {
                    episode.succeeded();
                    break done?;
                }
            }
        };
        removed.records += r.records;
        removed.claims += r.claims;
        removed.dead_letters += r.dead_letters;
        // A purge killed here, between two committed batches, must leave a ledger that
        // verifies and a purge that can be run again to finish (tests/it/promises.rs).
        failpoint::hit("purge_after_batch");
        // The next batch starts at the checkpoint this one left at `hi`, replacing it.
        lo = hi;
    }
    Ok(Some(Purged {
        export: export_path,
        export_sha256: digest,
        through_seq: last,
        removed,
    }))
}

/// `detail` signed for the checkpoint that will take seq `hi`, continuing from what record
/// `hi` hashed to as it is now: on a shared ledger where `hi` ends a batch, the hash of the
/// batch's link (which carries that seq after the batch's last member), never the member's own,
/// since the checkpoint continues from the link. Should the record change before the batch
/// runs, the signature will not verify against the checkpoint, and `audit verify --public-key`
/// names it.
fn sign_checkpoint(
    ledger: &dyn Backend,
    detail: &str,
    hi: i64,
    key: &SigningKey,
) -> Result<String> {
    let mut found = None;
    let past = || Error::Other(String::new());
    let walked = ledger.for_each_record(&Since::Seq(hi), &mut |r| {
        if r.seq != hi {
            return Err(past());
        }
        found = Some(r);
        Ok(())
    });
    match walked {
        Ok(()) => {}
        Err(Error::Other(s)) if s.is_empty() => {}
        Err(e) => return Err(e),
    }
    match found {
        Some(r) => Ok(sign_checkpoint_detail(detail, hi, &r.hash, key)),
        None => Err(Error::Invariant(format!(
            "record {hi}, planned as the end of a purge batch, is gone; nothing more was purged"
        ))),
    }
}

fn refuse_if_held_or_unpublished(plan: &PurgePlan, cutoff: &str) -> Result<()> {
    if !plan.held.is_empty() {
        return Err(Error::Other(format!(
            "refusing to purge: records before {cutoff} name award(s) under legal hold: {}; \
             lift the hold (claimgate hold remove) or choose an earlier --before",
            plan.held.join(", ")
        )));
    }
    if plan.unpublished > 0 {
        return Err(Error::Other(format!(
            "refusing to purge: {} outbox rows recorded before {cutoff} are not yet published to \
             every events stream a relay publishes this ledger to; run claimgate relay first (each \
             relay, on its own --events-stream)",
            plan.unpublished
        )));
    }
    Ok(())
}

/// `<ledger>.purge-<UTC time>.jsonl`: beside the file the SQLite ledger opened (`described`,
/// its path with any symlink resolved), or, for a PostgreSQL ledger, in the current directory
/// and named after the database.
fn default_export_path(location: &LedgerLocation, described: &str) -> PathBuf {
    let stamp = now_rfc3339().replace([':', '.'], "");
    match location {
        LedgerLocation::Postgres(url) => {
            // Read from the URL as shown (password removed), never from the URL whole.
            let shown = url.to_string();
            let name = shown
                .split_once("://")
                .and_then(|(_, rest)| rest.split(['?', '#']).next())
                .and_then(|r| r.rsplit('/').next())
                .filter(|n| !n.is_empty() && !n.contains('@'))
                .unwrap_or("ledger");
            PathBuf::from(format!("{name}.purge-{stamp}.jsonl"))
        }
        LedgerLocation::File(_) => {
            let db = Path::new(described);
            let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
            name.push(format!(".purge-{stamp}.jsonl"));
            db.with_file_name(name)
        }
    }
}

/// Bytes of export written between two `fdatasync`s of it. A year of a busy ledger is
/// gigabytes of export; left for one fsync at the end, up to that much is dirty in the page
/// cache when it comes, and on ext4 its writeback held a worker's WAL fsync beside it for
/// up to 0.83 s (4 KiB fsyncs beside a 3.7 GB file: 0.65–0.83 s at its one final fsync, and
/// 0.38–0.55 s during its writes from the kernel's own writeback; with a sync every 64 MiB,
/// 40 ms at most). The export must be on disk before anything is deleted anyway, so syncing it as
/// it goes costs the purge nothing it would not pay at the end.
const EXPORT_SYNC_BYTES: u64 = 64 << 20;

/// The export file being written: every row the purge will remove, one JSON line each.
struct Export {
    /// Where it is, for messages.
    path: PathBuf,
    /// The file, buffered.
    out: std::io::BufWriter<std::fs::File>,
    /// SHA-256 of every byte written so far.
    sha: Sha256,
    /// Bytes written since the file was last synced.
    unsynced: u64,
    /// [`EXPORT_SYNC_BYTES`], smaller in tests.
    sync_bytes: u64,
}

impl Export {
    /// Creates the file, mode 0600. Refuses to overwrite an existing file.
    fn create(path: &Path) -> Result<Export> {
        Export::create_syncing(path, EXPORT_SYNC_BYTES)
    }

    fn create_syncing(path: &Path, sync_bytes: u64) -> Result<Export> {
        assert!(sync_bytes > 0, "an export syncs after some bytes");
        let file = crate::support::files::create_private(path).map_err(|e| {
            Error::Config(format!("cannot create export file {}: {e}", path.display()))
        })?;
        Ok(Export {
            path: path.to_owned(),
            out: std::io::BufWriter::new(file),
            sha: Sha256::new(),
            unsynced: 0,
            sync_bytes,
        })
    }

    fn write(&mut self, row: &serde_json::Value) -> Result<()> {
        let mut line = serde_json::to_vec(row).expect("rows serialize");
        line.push(b'\n');
        self.sha.update(&line);
        let failed = |e| Error::io(format!("writing {}", self.path.display()), e);
        self.out.write_all(&line).map_err(failed)?;
        self.unsynced += line.len() as u64;
        if self.unsynced >= self.sync_bytes {
            self.out.flush().map_err(failed)?;
            self.out.get_ref().sync_data().map_err(failed)?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Flushes and fsyncs the file and its directory; returns the file's SHA-256.
    fn finish(self) -> Result<String> {
        let path = &self.path;
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io(format!("writing {}", path.display()), e.into_error()))?;
        file.sync_all()
            .map_err(|e| Error::io(format!("syncing {}", path.display()), e))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = std::fs::File::open(dir) {
                d.sync_all().ok();
            }
        }
        Ok(crate::domain::key::to_hex(&self.sha.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_is_written_out_as_it_grows_not_only_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.jsonl");
        let mut export = Export::create_syncing(&path, 4096).unwrap();
        let row = serde_json::json!({ "award_id": "GR-2026-0000001", "pad": "x".repeat(100) });
        let line = serde_json::to_vec(&row).unwrap().len() as u64 + 1;
        let rows = 50 * 4096 / line + 7;
        for _ in 0..rows {
            export.write(&row).unwrap();
        }
        // Before `finish`, the file holds everything up to the last sync point: only what
        // was written since (less than the 4 KiB, so still in the 8 KiB buffer) is not there.
        let on_disk = std::fs::metadata(&path).unwrap().len();
        assert!(export.unsynced < 4096, "{} bytes unsynced", export.unsynced);
        assert_eq!(on_disk, rows * line - export.unsynced);
        let digest = export.finish().unwrap();
        let whole = std::fs::read(&path).unwrap();
        assert_eq!(whole.len() as u64, rows * line);
        assert_eq!(digest, crate::domain::key::to_hex(&Sha256::digest(&whole)));
    }

    #[test]
    fn a_default_export_is_named_after_the_ledger_and_never_after_a_password() {
        let pg =
            LedgerLocation::parse("postgresql://u:PW-SECRET@db:5432/grants?schema=cg").unwrap();
        let shown = "postgresql://u:***@db:5432/grants?schema=cg";
        let name = default_export_path(&pg, shown).display().to_string();
        assert!(
            name.starts_with("grants.purge-") && name.ends_with(".jsonl"),
            "{name}"
        );
        assert!(!name.contains('/') && !name.contains("PW-SECRET"), "{name}");
        let file = LedgerLocation::parse("ledgers/link.db").unwrap();
        let beside = default_export_path(&file, "/var/lib/claimgate/claimgate.db");
        assert_eq!(beside.parent(), Some(Path::new("/var/lib/claimgate")));
        let name = beside.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("claimgate.db.purge-"), "{name}");
    }
}
