//! `claimgate audit keygen|anchor` and `audit verify --anchors|--public-key`: the I/O around
//! [`crate::domain::anchor`] — key files, anchor files, and one walk of the ledger's chain.
//!
//! Invariant: this module writes only new 0600 key files and appends to an anchors file
//! (`support::files`); it reads the ledger only through [`AuditLog`], `Outbox::ledger_id` (to anchor)
//! and `Outbox::ledger_id_made` (to verify, which must write nothing).
//! An anchor is taken only of a chain that verifies, so an anchor never vouches for a chain
//! that was already broken when it was taken.

use crate::domain::anchor::{check_checkpoint, Anchor, Anchored, EvidenceCheck, Findings};
use crate::domain::audit::Kind;
use crate::domain::audit::{Record, Verifier};
use crate::domain::clock::{ledger_time, now_rfc3339};
use crate::domain::signing::{PublicKey, SigningKey};
use crate::error::{Error, Result};
use crate::ledger::{self, Backend, Since};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// Where `audit keygen --out PATH` put the two halves.
#[derive(Debug, Clone)]
pub struct KeyFiles {
    /// The signing key (secret): PATH.
    pub signing: PathBuf,
    /// The public key: PATH.pub.
    pub public: PathBuf,
    /// The key's id, as anchors and checkpoints name it.
    pub key_id: String,
}

/// Makes a new Ed25519 key pair from the OS's random source and writes the signing key to
/// `out` and the public key to `out.pub`, both new 0600 files. Refuses, writing nothing, if
/// either exists; a half-written pair is removed.
pub fn keygen(out: &Path) -> Result<KeyFiles> {
    let mut public = out.as_os_str().to_owned();
    public.push(".pub");
    let public = PathBuf::from(public);
    for p in [out, public.as_path()] {
        if p.exists() {
            return Err(Error::Config(format!(
                "{} exists; a key file is never overwritten",
                p.display()
            )));
        }
    }
    let mut seed = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
        .map_err(|_| Error::Other("the OS's random source failed".into()))?;
    let key = SigningKey::from_seed(seed);
    write_new(out, &key.to_text())?;
    if let Err(e) = write_new(&public, &key.public_key().to_text()) {
        let _ = std::fs::remove_file(out);
        return Err(e);
    }
    Ok(KeyFiles {
        signing: out.to_owned(),
        public,
        key_id: key.public_key().key_id(),
    })
}

/// Writes `text` to a new 0600 file and fsyncs it.
fn write_new(path: &Path, text: &str) -> Result<()> {
    let mut f = crate::support::files::create_private(path).map_err(|e| {
        Error::Config(format!(
            "cannot create {} (an existing file is never overwritten): {e}",
            path.display()
        ))
    })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Reads a signing key file. One that group or others can read is refused: whoever can read
/// it can forge anchors and checkpoints.
pub fn load_signing_key(path: &Path) -> Result<SigningKey> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::Config(format!("signing key {}: {e}", path.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::Config(format!(
            "signing key {} is readable by others (mode {mode:o}); make it owner-only (chmod 600)",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("signing key {}: {e}", path.display())))?;
    SigningKey::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// Reads a public key file.
pub fn load_public_key(path: &Path) -> Result<PublicKey> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("public key {}: {e}", path.display())))?;
    PublicKey::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// The chain's head now, verified first; signed with `key` when given.
pub fn take(ledger: &dyn Backend, key: Option<&SigningKey>) -> Result<Anchor> {
    let ledger_id = ledger.ledger_id()?;
    let mut v = Verifier::default();
    let mut last: Option<Record> = None;
    ledger.for_each_record(&Since::All, &mut |r| {
        ledger::chain::check(&mut v, &r)?;
        last = Some(r);
        Ok(())
    })?;
    ledger::chain::end(&v)?;
    let mut anchor = Anchor {
        ledger_id,
        seq: last.as_ref().map_or(0, |r| r.seq),
        hash: v.head().to_owned(),
        records: v.count,
        recorded_at: last.map(|r| r.recorded_at),
        at: now_rfc3339(),
        key_id: None,
        signature: None,
    };
    if let Some(key) = key {
        anchor.sign(key);
    }
    Ok(anchor)
}

/// Appends `anchor` as one line to `path` (created 0600 if absent) and fsyncs it.
pub fn append(path: &Path, anchor: &Anchor) -> Result<()> {
    let mut line = anchor.to_line();
    line.push('\n');
    let mut f = crate::support::files::append_private(path, is_anchor_line)
        .map_err(|e| Error::io(format!("opening anchors file {}", path.display()), e))?;
    f.write_all(line.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(|e| Error::io(format!("appending to {}", path.display()), e))
}

/// Whether `line` is one an anchors file holds: an anchor. What an existing `--anchor-out` or
/// `audit anchor --out` file must start with before anything is appended to it.
pub fn is_anchor_line(line: &str) -> bool {
    serde_json::from_str::<Anchor>(line).is_ok()
}

/// Reads an anchors file. A line that is not an anchor is a failure naming it (exit 1): a
/// damaged anchors file is itself evidence of something. A file with no anchor at all proves
/// nothing and is refused too.
pub fn read_anchors(path: &Path) -> Result<Vec<Anchored>> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::Config(format!("cannot read anchors {}: {e}", path.display())))?;
    let mut anchors = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let anchor = serde_json::from_str::<Anchor>(&line).map_err(|e| {
            Error::Invariant(format!(
                "{} line {}: not an anchor ({e})",
                path.display(),
                n + 1
            ))
        })?;
        anchors.push(Anchored {
            line: n + 1,
            anchor,
        });
    }
    if anchors.is_empty() {
        return Err(Error::Invariant(format!(
            "{} holds no anchors: nothing to verify against",
            path.display()
        )));
    }
    Ok(anchors)
}

/// What `audit verify` with evidence found when everything held.
#[derive(Debug, Clone)]
pub struct Verified {
    /// Records in the chain, all links and hashes checked.
    pub records: u64,
    /// The chain's head.
    pub head: String,
    /// What the evidence check counted.
    pub findings: Findings,
}

/// Before this time (ledger format) a retention purge run now could have removed a record:
/// the retention window's start.
pub fn purgeable_before() -> String {
    ledger_time(crate::ops::retention::window_start(
        time::OffsetDateTime::now_utc(),
    ))
}

/// Walks the chain once, checking every link and hash and, beside them, `anchors` and (with
/// `key`) every checkpoint's and anchor's signature. `Error::Invariant` lists every
/// contradiction, each naming its anchor's line and seq or its checkpoint's seq. A key given
/// for anchors none of which is signed is a mistake of the command line, not a contradiction
/// of the ledger: `Error::Config` saying so (one unsigned anchor among signed ones is a
/// contradiction: a signature stripped).
pub fn verify(
    ledger: &dyn Backend,
    anchors: &[Anchored],
    key: Option<&PublicKey>,
) -> Result<Verified> {
    if key.is_some() && !anchors.is_empty() && anchors.iter().all(|a| a.anchor.signature.is_none())
    {
        return Err(Error::Config(format!(
            "none of the {} anchor(s) is signed, so --public-key has nothing to check them \
             against: check them without it (their hashes are still checked), or take signed \
             anchors (audit anchor --signing-key, run --signing-key)",
            anchors.len()
        )));
    }
    // Read, never made: a check writes nothing, and a ledger with no id matches no anchor
    // (every anchor names one), which the comparison below reports.
    let ledger_id = ledger
        .ledger_id_made()?
        .unwrap_or_else(|| "without an id (never relayed or anchored)".to_owned());
    let purgeable = purgeable_before();
    let mut evidence = EvidenceCheck::new(&ledger_id, anchors, key, &purgeable);
    let mut v = Verifier::default();
    let mut progress = ledger::sweep::Progress::new();
    ledger.for_each_record(&Since::All, &mut |r| {
        progress.row(|| format!("audit verify: {} records checked (seq {})", v.count, r.seq));
        ledger::chain::check(&mut v, &r)?;
        evidence.push(&r);
        Ok(())
    })?;
    drop(progress);
    ledger::chain::end(&v)?;
    let findings = evidence.finish();
    if !findings.contradictions.is_empty() {
        let lines: Vec<String> = findings
            .contradictions
            .iter()
            .map(|c| c.to_string())
            .collect();
        return Err(Error::Invariant(format!(
            "the ledger contradicts its evidence ({} finding(s)):\n  {}",
            lines.len(),
            lines.join("\n  ")
        )));
    }
    Ok(Verified {
        records: v.count,
        head: v.head().to_owned(),
        findings,
    })
}

/// `audit verify --file FILE --public-key KEY`: after the chain of an exported file has been
/// checked (`ops::verify::file`), checks every checkpoint in it against `key`; returns how many
/// there were, or `Error::Invariant` naming the first unsigned or wrongly signed one.
pub fn check_file_checkpoints(path: &Path, key: &PublicKey) -> Result<usize> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let mut checked = 0;
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        // An `audit export` line is a record; a purge export's is `{"table":..,"row":..}`.
        let row = match value.get("table").and_then(|t| t.as_str()) {
            None => value,
            Some("audit_log") => value["row"].clone(),
            Some(_) => continue,
        };
        let Ok(record) = serde_json::from_value::<Record>(row) else {
            continue;
        };
        if record.kind == Kind::Checkpoint {
            check_checkpoint(&record, key).map_err(|reason| {
                Error::Invariant(format!("checkpoint at seq {}: {reason}", record.seq))
            })?;
            checked += 1;
        }
    }
    Ok(checked)
}
