//! `claimgate audit export|verify|anchor|keygen|report`: the hash-chained audit trail, out of
//! the ledger and checked, the evidence kept outside it (anchors, signing keys), and the
//! report an auditor opens.

use super::common::open_existing;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ledger::{AuditLog, Since};
use crate::ops::evidence;
use crate::ops::report::{self, Period, Verdict};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Flags of `claimgate audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// What to do with the audit trail.
    #[command(subcommand)]
    pub command: AuditCommand,
}

/// The `audit` subcommands.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Write the audit records as JSON lines, each with its prev_hash and hash.
    Export {
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only records from this seq, or written at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
    },
    /// Recompute the hash chain; exit 1 naming the first broken record, or (with --anchors)
    /// every anchor the chain contradicts.
    Verify {
        /// Verify an exported file instead of the ledger.
        #[arg(long, conflicts_with = "anchors")]
        file: Option<PathBuf>,
        /// With --file: the hash the file's first record links to (an export made with --since).
        #[arg(long, requires = "file")]
        continuing_from: Option<String>,
        /// Check the ledger against the anchors in this file (`claimgate audit anchor` lines).
        #[arg(long)]
        anchors: Option<PathBuf>,
        /// Require every checkpoint (and every anchor) to be signed by this key's signing key
        /// (with --file: every checkpoint in the file).
        #[arg(long, env = "CLAIMGATE_AUDIT_PUBLIC_KEY")]
        public_key: Option<PathBuf>,
    },
    /// Write one JSON line describing the chain's head now (seq, hash, records, time, ledger
    /// id), verified first; signed when a signing key is given.
    Anchor {
        /// Append the line to this file (created 0600 if absent) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Sign the anchor with this key file (`claimgate audit keygen`).
        #[arg(long, env = "CLAIMGATE_AUDIT_SIGNING_KEY")]
        signing_key: Option<PathBuf>,
    },
    /// Write one self-contained HTML report an auditor opens offline: the verdict first
    /// (verified against the anchors and key given, or FAILED naming the first broken record or
    /// anchor), then the ledger, the chain head, each anchor, totals disbursed per day or month,
    /// the counts, holds, purges and exceptions. Exit 1 (the report still written) when the
    /// ledger does not verify.
    Report {
        /// The HTML file to write: a new 0600 file (an existing file is never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// Check the ledger against the anchors in this file (`claimgate audit anchor` lines).
        #[arg(long)]
        anchors: Option<PathBuf>,
        /// Require every checkpoint and anchor to be signed by this key's signing key.
        #[arg(long, env = "CLAIMGATE_AUDIT_PUBLIC_KEY")]
        public_key: Option<PathBuf>,
        /// Count only records written at or after this date (YYYY-MM-DD, UTC) or RFC 3339
        /// date-time. The whole chain is verified whatever the period.
        #[arg(long)]
        since: Option<String>,
        /// Count only records written before this date (YYYY-MM-DD, UTC) or RFC 3339 date-time.
        #[arg(long)]
        until: Option<String>,
    },
    /// Make an Ed25519 key pair: the signing key at PATH, the public key at PATH.pub (both new
    /// 0600 files; existing files are never overwritten).
    Keygen {
        /// Where to write the signing key; the public key goes to the same path plus `.pub`.
        #[arg(long)]
        out: PathBuf,
    },
}

/// `claimgate audit export|verify`.
pub fn audit(cfg: &Config, args: AuditArgs) -> Result<()> {
    match args.command {
        AuditCommand::Export { out, since } => export(cfg, out, since),
        AuditCommand::Verify {
            file: Some(path),
            continuing_from,
            public_key,
            ..
        } => {
            let key = public_key
                .as_deref()
                .map(evidence::load_public_key)
                .transpose()?;
            let (n, head) = crate::ops::verify::file(&path, continuing_from.as_deref())?;
            println!(
                "audit chain intact: {n} records in {}, head {head}",
                path.display()
            );
            if let Some(key) = &key {
                let signed = evidence::check_file_checkpoints(&path, key)?;
                println!(
                    "signatures verified with key {}: {signed} checkpoint(s)",
                    key.key_id()
                );
            }
            Ok(())
        }
        AuditCommand::Verify {
            file: None,
            anchors: None,
            public_key: None,
            ..
        } => {
            let ledger = open_existing(cfg)?;
            let (n, head) = crate::ops::verify::chain(&*ledger)?;
            println!("audit chain intact: {n} records, head {head}");
            Ok(())
        }
        AuditCommand::Verify {
            anchors,
            public_key,
            ..
        } => verify_evidence(cfg, anchors, public_key),
        AuditCommand::Anchor { out, signing_key } => anchor(cfg, out, signing_key),
        AuditCommand::Report {
            out,
            anchors,
            public_key,
            since,
            until,
        } => report(cfg, &out, anchors, public_key, since, until),
        AuditCommand::Keygen { out } => {
            let k = evidence::keygen(&out)?;
            println!(
                "signing key {} (keep it secret: it can sign anchors and checkpoints)\n\
                 public key  {} (give it to whoever verifies)\nkey id      {}",
                k.signing.display(),
                k.public.display(),
                k.key_id
            );
            Ok(())
        }
    }
}

/// `audit verify --anchors FILE` and/or `--public-key FILE`.
fn verify_evidence(
    cfg: &Config,
    anchors: Option<PathBuf>,
    public_key: Option<PathBuf>,
) -> Result<()> {
    let key = public_key
        .as_deref()
        .map(evidence::load_public_key)
        .transpose()?;
    let anchors = match &anchors {
        Some(path) => evidence::read_anchors(path)?,
        None => Vec::new(),
    };
    let ledger = open_existing(cfg)?;
    let v = evidence::verify(&*ledger, &anchors, key.as_ref())?;
    println!("audit chain intact: {} records, head {}", v.records, v.head);
    if !anchors.is_empty() {
        println!(
            "anchors hold: {} of {} found with the anchored hash, {} covered by a retention checkpoint",
            v.findings.matched,
            anchors.len(),
            v.findings.covered
        );
    }
    if let Some(key) = &key {
        println!(
            "signatures verified with key {}: {} checkpoint(s){}",
            key.key_id(),
            v.findings.checkpoints_signed,
            if anchors.is_empty() {
                ""
            } else {
                " and every anchor"
            }
        );
    }
    Ok(())
}

/// `audit anchor [--out FILE] [--signing-key FILE]`.
fn anchor(cfg: &Config, out: Option<PathBuf>, signing_key: Option<PathBuf>) -> Result<()> {
    let key = signing_key
        .as_deref()
        .map(evidence::load_signing_key)
        .transpose()?;
    let ledger = open_existing(cfg)?;
    let anchor = evidence::take(&*ledger, key.as_ref())?;
    match &out {
        Some(path) => {
            evidence::append(path, &anchor)?;
            eprintln!(
                "anchor appended to {}: seq {} hash {} ({} records){}",
                path.display(),
                anchor.seq,
                anchor.hash,
                anchor.records,
                if anchor.signature.is_some() {
                    ", signed"
                } else {
                    ""
                }
            );
        }
        None => println!("{}", anchor.to_line()),
    }
    Ok(())
}

/// `audit report --out FILE [--anchors FILE] [--public-key FILE] [--since T] [--until T]`.
fn report(
    cfg: &Config,
    out: &Path,
    anchors_file: Option<PathBuf>,
    public_key: Option<PathBuf>,
    since: Option<String>,
    until: Option<String>,
) -> Result<()> {
    let key = public_key
        .as_deref()
        .map(evidence::load_public_key)
        .transpose()?;
    let period = Period {
        since: since.map(|s| parse_time("--since", &s)).transpose()?,
        until: until.map(|s| parse_time("--until", &s)).transpose()?,
    };
    if let (Some(a), Some(b)) = (&period.since, &period.until) {
        if a >= b {
            return Err(Error::Config(format!(
                "--since {a} is not before --until {b}: the period is empty"
            )));
        }
    }
    if out.exists() {
        return Err(Error::Config(format!(
            "{} exists; a report never overwrites a file",
            out.display()
        )));
    }
    let anchors = match &anchors_file {
        Some(path) => evidence::read_anchors(path)?,
        None => Vec::new(),
    };
    let ledger = open_existing(cfg)?;
    let written = report::write(
        &*ledger,
        &report::Request {
            out,
            anchors_file: anchors_file.as_deref(),
            anchors: &anchors,
            key: key.as_ref(),
            period,
        },
    )?;
    match written.verdict {
        Verdict::Failed(first) => Err(Error::Invariant(format!(
            "{first}; the report {} says FAILED",
            written.path.display()
        ))),
        Verdict::Verified { anchors, key } => {
            println!(
                "report written to {}: {} records verified{}{}",
                written.path.display(),
                written.records,
                if anchors { ", every anchor holds" } else { "" },
                if key {
                    ", every signature verifies"
                } else {
                    ""
                },
            );
            Ok(())
        }
    }
}

/// A period's end from the command line: a date (midnight UTC) or an RFC 3339 date-time, in
/// the ledger's time format.
fn parse_time(flag: &str, s: &str) -> Result<String> {
    use time::format_description::well_known::Rfc3339;
    let t = time::OffsetDateTime::parse(s, &Rfc3339)
        .or_else(|_| {
            time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]"))
                .map(|d| d.midnight().assume_utc())
        })
        .map_err(|_| {
            Error::Config(format!(
                "{flag} {s:?} is neither a date (YYYY-MM-DD) nor an RFC 3339 date-time"
            ))
        })?;
    Ok(crate::domain::clock::ledger_time(t))
}

fn parse_since(since: Option<String>) -> Result<Since> {
    let Some(s) = since else {
        return Ok(Since::All);
    };
    if let Ok(seq) = s.parse::<i64>() {
        return Ok(Since::Seq(seq));
    }
    let t = time::OffsetDateTime::parse(&s, &time::format_description::well_known::Rfc3339)
        .map_err(|_| {
            Error::Config(format!(
                "--since {s:?} is neither a seq number nor an RFC 3339 date-time"
            ))
        })?;
    Ok(Since::Time(crate::domain::clock::ledger_time(t)))
}

fn export(cfg: &Config, out: Option<PathBuf>, since: Option<String>) -> Result<()> {
    let since = parse_since(since)?;
    let ledger = open_existing(cfg)?;
    let Some(path) = out else {
        let mut sink = std::io::BufWriter::new(std::io::stdout().lock());
        let summary = write_records(&*ledger, &since, &mut sink)?;
        eprintln!("exported {summary}");
        return Ok(());
    };
    // Evidence: a new owner-only file, never an existing one overwritten (an earlier export may
    // be the copy someone relies on), and never left half-written.
    let file = crate::support::files::create_private(&path).map_err(|e| {
        Error::Config(format!(
            "cannot create {} (an existing file is never overwritten): {e}",
            path.display()
        ))
    })?;
    let mut sink = std::io::BufWriter::new(file);
    let written = write_records(&*ledger, &since, &mut sink).and_then(|summary| {
        let file = sink
            .into_inner()
            .map_err(|e| Error::io(format!("writing {}", path.display()), e.into_error()))?;
        file.sync_all()
            .map_err(|e| Error::io(format!("syncing {}", path.display()), e))?;
        Ok(summary)
    });
    match written {
        Ok(summary) => {
            eprintln!("exported {summary}");
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// Writes the selected records as JSON lines; returns what to tell the operator.
fn write_records(ledger: &dyn AuditLog, since: &Since, sink: &mut impl Write) -> Result<String> {
    let (mut n, mut range, mut head) = (0u64, None::<(i64, i64)>, String::new());
    ledger.for_each_record(since, &mut |r| {
        serde_json::to_writer(&mut *sink, &r).expect("records serialize");
        sink.write_all(b"\n")
            .map_err(|e| Error::io("writing the export", e))?;
        n += 1;
        range = Some((range.map_or(r.seq, |(a, _)| a), r.seq));
        head = r.hash;
        Ok(())
    })?;
    sink.flush()
        .map_err(|e| Error::io("writing the export", e))?;
    let seqs = range
        .map(|(a, b)| format!(" (seq {a}..={b}, last hash {head})"))
        .unwrap_or_default();
    Ok(format!("{n} audit records{seqs}"))
}
