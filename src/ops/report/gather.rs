//! What the report says, read from the ledger: its counts ([`Ledger::stats`], what `status`
//! shows), its own check ([`Inspect::verify`], what `verify` runs), its holds, and one walk of
//! the audit chain through [`ledger::chain`] beside [`EvidenceCheck`] (what `audit verify
//! --anchors` runs) and the report's [`Tally`]. Then the file: written whole, new and 0600,
//! removed again if anything fails before it is complete.
//!
//! A ledger that does not verify is not an error here: it is the report's verdict. Only a
//! ledger that cannot be read at all (or a file that cannot be written) is.

use super::facts::{AnchorRow, AnchorStatus, Chain, Report, Verdict};
use super::html;
use super::tally::{Period, Tally};
use crate::domain::anchor::{Anchored, EvidenceCheck, Findings};
use crate::domain::audit::Verifier;
use crate::domain::clock::now_rfc3339;
use crate::domain::signing::PublicKey;
use crate::error::{Error, Result};
use crate::ledger::{self, Backend, Since, Summary};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `claimgate audit report` was asked for.
#[derive(Debug)]
pub struct Request<'a> {
    /// The HTML file to write: new, never an existing one.
    pub out: &'a Path,
    /// The anchors file given, if any, for the report to name.
    pub anchors_file: Option<&'a Path>,
    /// Its anchors (empty without a file).
    pub anchors: &'a [Anchored],
    /// The public key every checkpoint and anchor must be signed by, if one was given.
    pub key: Option<&'a PublicKey>,
    /// The records the figures count.
    pub period: Period,
}

/// What was written.
#[derive(Debug)]
pub struct Written {
    /// The report file.
    pub path: PathBuf,
    /// Its headline.
    pub verdict: Verdict,
    /// Records checked.
    pub records: u64,
}

/// Reads the ledger and writes the report to `req.out`, a new 0600 file. A ledger that fails
/// a check still gets its report (the verdict says FAILED); only a ledger that cannot be read,
/// or a file that cannot be written, is an error, and then no file is left behind.
pub fn write(ledger: &dyn Backend, req: &Request<'_>) -> Result<Written> {
    let file = crate::support::files::create_private(req.out).map_err(|e| {
        Error::Config(format!(
            "cannot create {} (an existing file is never overwritten): {e}",
            req.out.display()
        ))
    })?;
    let written = read(ledger, req).and_then(|report| {
        let page = html::render(&report);
        let mut file = std::io::BufWriter::new(file);
        file.write_all(page.as_bytes())
            .and_then(|()| file.flush())
            .and_then(|()| file.get_ref().sync_all())
            .map_err(|e| Error::io(format!("writing {}", req.out.display()), e))?;
        Ok(Written {
            path: req.out.to_owned(),
            verdict: report.verdict,
            records: report.chain.records,
        })
    });
    if written.is_err() {
        let _ = std::fs::remove_file(req.out);
    }
    written
}

/// Everything the report shows, read from `ledger`.
fn read(ledger: &dyn Backend, req: &Request<'_>) -> Result<Report> {
    // Read, never made: a report writes nothing to the ledger (EvidenceCheck names a ledger
    // without an id as matching no anchor, as `audit verify --anchors` does).
    let ledger_id = ledger.ledger_id_made()?;
    let stats = ledger.stats()?;
    let holds = ledger.holds()?;
    let verified = match ledger.verify() {
        Ok(summary) => Ok(summary),
        Err(Error::Invariant(violation)) => Err(violation),
        Err(e) => return Err(e),
    };
    let (chain, findings, tally) = walk(ledger, ledger_id.as_deref(), req)?;
    let anchors = anchor_rows(req.anchors, &findings, &chain, tally.leading_checkpoint);
    let verdict = verdict(&chain, &verified, &findings, req);
    Ok(Report {
        generated_at: now_rfc3339(),
        ledger_id,
        location: ledger.describe(),
        anchors_file: req.anchors_file.map(|p| p.display().to_string()),
        key_id: req.key.map(PublicKey::key_id),
        stats,
        holds,
        verified,
        chain,
        findings,
        anchors,
        tally,
        verdict,
    })
}

/// One walk of the chain: the chain check, the evidence check and the tally, side by side.
/// After a break the chain and evidence checks stop (what follows a break proves nothing);
/// the tally counts on, so the report still shows what the ledger holds.
fn walk(
    ledger: &dyn Backend,
    ledger_id: Option<&str>,
    req: &Request<'_>,
) -> Result<(Chain, Findings, Tally)> {
    let id = ledger_id.unwrap_or("without an id (never relayed or anchored)");
    let purgeable = crate::ops::evidence::purgeable_before();
    let mut evidence = EvidenceCheck::new(id, req.anchors, req.key, &purgeable);
    let mut v = Verifier::default();
    let mut tally = Tally::new(req.period.clone());
    let mut broken: Option<(i64, String)> = None;
    let walked = ledger.for_each_record(&Since::All, &mut |r| {
        if broken.is_none() {
            match ledger::chain::check(&mut v, &r) {
                Ok(()) => evidence.push(&r),
                Err(Error::Invariant(why)) => broken = Some((r.seq, why)),
                Err(e) => return Err(e),
            }
        }
        tally.push(&r, req.key);
        Ok(())
    });
    match walked {
        Ok(()) => {}
        // A stored record that is no record at all (an unknown kind): the walk stops there.
        Err(Error::Invariant(why)) if broken.is_none() => {
            let at = tally.last.as_ref().map_or(0, |(seq, _)| *seq);
            broken = Some((at, why));
        }
        Err(Error::Invariant(_)) => {}
        Err(e) => return Err(e),
    }
    if broken.is_none() {
        if let (Err(Error::Invariant(why)), Err(b)) = (ledger::chain::end(&v), v.end()) {
            broken = Some((b.seq, why));
        }
    }
    let mut findings = evidence.finish();
    if let Some((at, _)) = &broken {
        // Anchors past the break were never reached: not contradicted, not confirmed.
        findings.contradictions.retain(|c| c.seq < *at);
    }
    let chain = Chain {
        records: v.count,
        head: v.head().to_owned(),
        broken,
    };
    Ok((chain, findings, tally))
}

/// Each anchor's status: failed if a contradiction names its line, not checked if the chain
/// broke at or before its seq, covered if a leading checkpoint stands above it, else held.
fn anchor_rows(
    anchors: &[Anchored],
    findings: &Findings,
    chain: &Chain,
    leading_checkpoint: Option<i64>,
) -> Vec<AnchorRow> {
    anchors
        .iter()
        .map(|a| {
            let failed = findings
                .contradictions
                .iter()
                .find(|c| c.line == Some(a.line));
            let seq = a.anchor.seq;
            let status = match (failed, &chain.broken, leading_checkpoint) {
                (Some(c), _, _) => AnchorStatus::Fails(c.reason.clone()),
                (None, Some((at, _)), _) if seq >= *at => AnchorStatus::NotChecked,
                (None, _, Some(c)) if seq > 0 && seq < c => AnchorStatus::Covered(c),
                _ => AnchorStatus::Holds,
            };
            AnchorRow {
                line: a.line,
                anchor: a.anchor.clone(),
                status,
            }
        })
        .collect()
}

/// The headline: the first failure in the order `audit verify` would meet them (the chain,
/// then the ledger's own invariants, then the evidence), or what the ledger was verified
/// against.
fn verdict(
    chain: &Chain,
    verified: &std::result::Result<Summary, String>,
    findings: &Findings,
    req: &Request<'_>,
) -> Verdict {
    if let Some((_, why)) = &chain.broken {
        return Verdict::Failed(why.clone());
    }
    if let Err(violation) = verified {
        return Verdict::Failed(format!("verify: {violation}"));
    }
    if let Some(c) = findings.contradictions.first() {
        return Verdict::Failed(c.to_string());
    }
    Verdict::Verified {
        anchors: !req.anchors.is_empty(),
        key: req.key.is_some(),
    }
}
