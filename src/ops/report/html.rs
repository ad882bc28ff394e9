//! The report as one self-contained HTML page: no script, no external asset, no network (its
//! Content-Security-Policy forbids every fetch), a print stylesheet, and the verdict first.
//!
//! Pure: a [`Report`] in, a page out. Every text from the ledger or the anchors file goes
//! through [`text`]; every figure carries its raw value in `data-figure` / `data-value`
//! attributes, so a program can read the same numbers a person reads (the tests do).

use super::chart;
use super::facts::{AnchorRow, AnchorStatus, Report, Verdict};
use super::markup::text;
use super::tally::{Counts, Signature, EXCEPTIONS_MAX};
use crate::domain::audit::Kind;
use crate::domain::money::{dollars, thousands};
use std::fmt::Write;

/// Anchor rows listed; the failing ones come first, then the latest that hold.
pub const ANCHOR_ROWS_MAX: usize = 200;
/// Holds in force listed.
pub const HOLD_ROWS_MAX: usize = 500;

const STYLE: &str = r#"
:root { color-scheme: light; }
body { margin: 0; background: #eef0f3; color: #1d1f23;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1000px; margin: 0 auto; padding: 24px 28px 40px; background: #fff; }
.verdict { border-radius: 8px; padding: 16px 22px; color: #fff; }
.verdict.verified { background: #1c7430; }
.verdict.partial { background: #9a5b00; }
.verdict.failed { background: #b3261e; }
.verdict h1 { margin: 0; font-size: 28px; letter-spacing: .03em; }
.verdict p { margin: 6px 0 0; font-size: 15px; }
h2 { font-size: 17px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 2px solid #dfe3e8; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eceef1; vertical-align: top; }
th { background: #f6f7f9; font-weight: 600; }
.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, .hash { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px;
  overflow-wrap: anywhere; }
.ok { color: #1c7430; font-weight: 600; }
.bad { color: #b3261e; font-weight: 600; }
.warn { color: #9a5b00; font-weight: 600; }
.muted { color: #5f6670; }
dl { display: grid; grid-template-columns: 190px 1fr; gap: 4px 14px; margin: 0; }
dt { color: #5f6670; }
dd { margin: 0; overflow-wrap: anywhere; }
ul.checks { margin: 10px 0 0; padding-left: 20px; }
.chart { display: block; max-width: 100%; height: auto; margin: 6px 0 10px; }
footer { margin-top: 32px; font-size: 12px; color: #5f6670; }
@media print {
  body { background: #fff; font-size: 11px; }
  main { max-width: none; padding: 0; }
  .verdict { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  h2 { break-after: avoid; }
  tr, .chart, dl { break-inside: avoid; }
}
"#;

/// The whole page.
pub fn render(r: &Report) -> String {
    let mut page = String::with_capacity(64 * 1024);
    let (class, word) = headline(&r.verdict);
    let _ = write!(
        page,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="claimgate {}">
<title>claimgate audit report: {}</title>
<style>{STYLE}</style></head>
<body><main>
"#,
        env!("CARGO_PKG_VERSION"),
        text(word)
    );
    verdict(&mut page, r, class, word);
    ledger(&mut page, r);
    anchors(&mut page, r);
    figures(&mut page, r);
    chart_section(&mut page, r);
    reasons(&mut page, r);
    holds(&mut page, r);
    purges(&mut page, r);
    exceptions(&mut page, r);
    footer(&mut page, r);
    page.push_str("</main></body></html>\n");
    page
}

/// The verdict's CSS class and first word.
fn headline(v: &Verdict) -> (&'static str, &'static str) {
    match v {
        Verdict::Failed(_) => ("failed", "FAILED"),
        Verdict::Verified {
            anchors: true,
            key: true,
        } => ("verified", "VERIFIED"),
        Verdict::Verified { .. } => ("partial", "VERIFIED, PARTLY"),
    }
}

/// A figure: its display text, with its name and raw value for programs.
fn fig(name: &str, value: impl std::fmt::Display, shown: &str) -> String {
    format!(
        r#"<span data-figure="{}" data-value="{}">{}</span>"#,
        text(name),
        text(&value.to_string()),
        text(shown)
    )
}

fn count(name: &str, n: u64) -> String {
    fig(name, n, &thousands(n))
}

fn money(name: &str, cents: i128) -> String {
    fig(name, cents, &dollars(cents))
}

fn verdict(page: &mut String, r: &Report, class: &str, word: &str) {
    let said: String = match &r.verdict {
        Verdict::Failed(first) => format!("The first thing that does not hold: {first}"),
        Verdict::Verified {
            anchors: true,
            key: true,
        } => "The audit chain, the ledger's own invariants, every anchor and every signature \
              hold."
            .into(),
        Verdict::Verified {
            anchors: false,
            key: false,
        } => "The audit chain and the ledger's own invariants hold. No anchors and no public key \
              were given: a ledger changed and re-sealed by someone who can write it would pass \
              too."
            .into(),
        Verdict::Verified { anchors: false, .. } => {
            "The audit chain, the ledger's own invariants and every checkpoint signature hold. \
             No anchors were given: a ledger changed and re-sealed by someone who can write it \
             would pass too."
                .into()
        }
        Verdict::Verified { .. } => {
            "The audit chain, the ledger's own invariants and every anchor hold. No public key \
             was given: signatures were not checked, so a forged checkpoint or anchor would \
             pass too."
                .into()
        }
    };
    let value = match &r.verdict {
        Verdict::Failed(_) => "failed",
        Verdict::Verified {
            anchors: true,
            key: true,
        } => "verified",
        Verdict::Verified { .. } => "partial",
    };
    let _ = writeln!(
        page,
        r#"<section class="verdict {class}" data-figure="verdict" data-value="{value}"><h1>{}</h1><p data-figure="verdict.detail">{}</p></section>"#,
        text(word),
        text(&said)
    );
    page.push_str(r#"<ul class="checks">"#);
    let chain = match &r.chain.broken {
        Some((seq, why)) => format!(
            r#"<li><span class="bad">Audit chain: broken</span> at seq {}: {}</li>"#,
            fig("chain.broken_seq", seq, &seq.to_string()),
            text(why)
        ),
        None => format!(
            r#"<li><span class="ok">Audit chain: intact</span>, {} records, every hash and link recomputed</li>"#,
            count("chain.checked", r.chain.records)
        ),
    };
    page.push_str(&chain);
    let verified = match &r.verified {
        Ok(s) => format!(
            r#"<li><span class="ok">verify: passed</span>: {} claims, {} disbursements, {} outbox rows, {} audit records, {} tombstones{}</li>"#,
            count("verify.claims", s.claims),
            count("verify.disbursements", s.disbursements),
            count("verify.outbox_rows", s.outbox_rows),
            count("verify.audit_records", s.audit_records),
            count("verify.tombstones", s.tombstones),
            if s.unlinked_batches > 0 {
                format!(
                    "; {} committed batch(es) not linked into the chain yet",
                    count("verify.unlinked_batches", s.unlinked_batches)
                )
            } else {
                String::new()
            }
        ),
        Err(v) => format!(
            r#"<li><span class="bad">verify: failed</span>: {}</li>"#,
            fig("verify.violation", v, v)
        ),
    };
    page.push_str(&verified);
    evidence_lines(page, r);
    page.push_str("</ul>\n");
}

fn evidence_lines(page: &mut String, r: &Report) {
    let failed = r
        .anchors
        .iter()
        .filter(|a| matches!(a.status, AnchorStatus::Fails(_)))
        .count() as u64;
    if r.anchors.is_empty() {
        page.push_str(r#"<li><span class="warn">Anchors: none given</span></li>"#);
    } else {
        let class = if failed > 0 { "bad" } else { "ok" };
        let _ = write!(
            page,
            r#"<li><span class="{class}">Anchors: {} failed</span>; {} of {} found with the anchored hash, {} covered by a retention checkpoint</li>"#,
            count("anchors.failed", failed),
            count("anchors.matched", r.findings.matched as u64),
            count("anchors.total", r.anchors.len() as u64),
            count("anchors.covered", r.findings.covered as u64),
        );
    }
    match &r.key_id {
        Some(id) => {
            let _ = write!(
                page,
                r#"<li>Signatures checked with key <code>{}</code>: {} checkpoint(s){}</li>"#,
                fig("key.id", id, id),
                count(
                    "signatures.checkpoints",
                    r.findings.checkpoints_signed as u64
                ),
                if r.anchors.is_empty() {
                    ""
                } else {
                    " and every anchor"
                }
            );
        }
        None => page.push_str(
            r#"<li><span class="warn">Signatures: not checked</span> (no public key given)</li>"#,
        ),
    }
    let others: Vec<String> = r
        .findings
        .contradictions
        .iter()
        .filter(|c| c.line.is_none())
        .map(|c| {
            format!(
                "<li><span class=\"bad\">{}</span></li>",
                text(&c.to_string())
            )
        })
        .collect();
    page.push_str(&others.concat());
}

fn ledger(page: &mut String, r: &Report) {
    let t = &r.tally;
    let period = match (&t.window.since, &t.window.until) {
        (None, None) => "the whole ledger".to_owned(),
        (since, until) => format!(
            "records written from {} until {}",
            since.as_deref().unwrap_or("the first"),
            until
                .as_deref()
                .map_or("now".to_owned(), |u| format!("before {u}"))
        ),
    };
    let span = match (&t.first, &t.last) {
        (Some((a, at)), Some((b, bt))) => format!("seq {a} ({at}) to seq {b} ({bt})"),
        _ => "no records".into(),
    };
    let id = r
        .ledger_id
        .as_deref()
        .unwrap_or("none (never relayed or anchored)");
    let head_seq = t.last.as_ref().map_or(0, |(s, _)| *s);
    let _ = write!(
        page,
        r#"<h2>The ledger</h2><dl>
<dt>Ledger id</dt><dd><code>{}</code></dd>
<dt>Where</dt><dd><code>{}</code></dd>
<dt>Period</dt><dd>{}</dd>
<dt>Chain</dt><dd>{}</dd>
<dt>Chain head</dt><dd>seq {}, hash <code class="hash">{}</code></dd>
<dt>Anchors file</dt><dd>{}</dd>
<dt>Report made</dt><dd>{} by claimgate {}</dd>
</dl>
"#,
        fig("ledger.id", id, id),
        text(&r.location),
        fig("period", &period, &period),
        text(&span),
        fig("chain.head_seq", head_seq, &head_seq.to_string()),
        fig("chain.head", &r.chain.head, &r.chain.head),
        text(r.anchors_file.as_deref().unwrap_or("none given")),
        text(&r.generated_at),
        env!("CARGO_PKG_VERSION")
    );
}

fn anchors(page: &mut String, r: &Report) {
    page.push_str("<h2>Anchors checked</h2>\n");
    if r.anchors.is_empty() {
        page.push_str(
            r#"<p class="muted">No anchors file was given (<code>--anchors</code>). An anchor is the chain's head written down somewhere the ledger's writer cannot reach; without one, a ledger re-sealed after an edit verifies too.</p>"#,
        );
        return;
    }
    let mut shown: Vec<&AnchorRow> = r
        .anchors
        .iter()
        .filter(|a| matches!(a.status, AnchorStatus::Fails(_)))
        .take(ANCHOR_ROWS_MAX)
        .collect();
    let room = ANCHOR_ROWS_MAX - shown.len();
    let rest: Vec<&AnchorRow> = r
        .anchors
        .iter()
        .filter(|a| !matches!(a.status, AnchorStatus::Fails(_)))
        .collect();
    shown.extend(&rest[rest.len().saturating_sub(room)..]);
    page.push_str(
        r#"<table><thead><tr><th class="n">Line</th><th>Taken at</th><th class="n">Seq</th><th class="n">Records</th><th>Key id</th><th>Result</th></tr></thead><tbody>"#,
    );
    for a in &shown {
        let (status, class, said) = match &a.status {
            AnchorStatus::Holds => ("holds", "ok", "holds".to_owned()),
            AnchorStatus::Covered(c) => (
                "covered",
                "ok",
                format!("holds: purged behind the valid checkpoint at seq {c}"),
            ),
            AnchorStatus::Fails(why) => ("fails", "bad", format!("FAILS: {why}")),
            AnchorStatus::NotChecked => (
                "not-checked",
                "warn",
                "not checked: the chain breaks before it".to_owned(),
            ),
        };
        let _ = write!(
            page,
            r#"<tr data-line="{}" data-seq="{}" data-status="{status}"><td class="n">{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td><code>{}</code></td><td class="{class}">{}</td></tr>"#,
            a.line,
            a.anchor.seq,
            a.line,
            text(&a.anchor.at),
            a.anchor.seq,
            thousands(a.anchor.records),
            text(a.anchor.key_id.as_deref().unwrap_or("unsigned")),
            text(&said)
        );
    }
    page.push_str("</tbody></table>\n");
    if shown.len() < r.anchors.len() {
        let _ = write!(
            page,
            r#"<p class="muted">{} more anchors hold and are not listed.</p>"#,
            thousands((r.anchors.len() - shown.len()) as u64)
        );
    }
}

/// One row of the counts table: the period's figure (when a period was given), the whole
/// chain's, and what `status` says (where it says it).
fn row(
    page: &mut String,
    label: &str,
    name: &str,
    r: &Report,
    pick: fn(&Counts) -> i128,
    status: Option<String>,
) {
    let money_row = name == "disbursed_cents";
    let cell = |prefix: &str, c: &Counts| -> String {
        let v = pick(c);
        let n = format!("{prefix}.{name}");
        if money_row {
            money(&n, v)
        } else {
            count(&n, v as u64)
        }
    };
    let period = if r.tally.window.is_all() {
        String::new()
    } else {
        format!(r#"<td class="n">{}</td>"#, cell("period", &r.tally.period))
    };
    let _ = write!(
        page,
        r#"<tr><td>{}</td>{period}<td class="n">{}</td><td class="n">{}</td></tr>"#,
        text(label),
        cell("chain", &r.tally.all),
        status.unwrap_or_else(|| r#"<span class="muted">-</span>"#.into())
    );
}

fn figures(page: &mut String, r: &Report) {
    let s = &r.stats;
    page.push_str("<h2>Figures</h2>\n<table><thead><tr><th>What</th>");
    if !r.tally.window.is_all() {
        page.push_str(r#"<th class="n">In the period</th>"#);
    }
    page.push_str(
        r#"<th class="n">Whole audit chain</th><th class="n">Ledger (as <code>status</code> says)</th></tr></thead><tbody>"#,
    );
    row(
        page,
        "Submissions paid (processed)",
        "processed",
        r,
        |c| c.processed.into(),
        Some(count("status.claims", s.claims)),
    );
    row(
        page,
        "Total disbursed",
        "disbursed_cents",
        r,
        |c| c.disbursed_cents,
        Some(money(
            "status.disbursed_cents_total",
            s.disbursed_cents_total,
        )),
    );
    row(
        page,
        "Duplicates suppressed",
        "duplicates",
        r,
        |c| c.duplicates.into(),
        Some(count(
            "status.duplicates_suppressed",
            s.duplicates_suppressed,
        )),
    );
    row(
        page,
        "Conflicts",
        "conflicts",
        r,
        |c| c.conflicts.into(),
        Some(count("status.conflicts", s.conflicts)),
    );
    row(
        page,
        "Held conflicts approved",
        "conflicts_approved",
        r,
        |c| c.conflicts_approved.into(),
        None,
    );
    row(
        page,
        "Held conflicts rejected",
        "conflicts_rejected",
        r,
        |c| c.conflicts_rejected.into(),
        None,
    );
    row(
        page,
        "Dead letters",
        "dead_letters",
        r,
        |c| c.dead_letters.into(),
        Some(count("status.dead_letters", s.dead_letters)),
    );
    row(
        page,
        "Vanished entries",
        "vanished",
        r,
        |c| c.vanished.into(),
        Some(count("status.vanished", s.vanished)),
    );
    row(
        page,
        "Legal holds placed",
        "holds_placed",
        r,
        |c| c.holds_placed.into(),
        None,
    );
    row(
        page,
        "Legal holds lifted",
        "holds_lifted",
        r,
        |c| c.holds_lifted.into(),
        Some(format!(
            "{} in force",
            count("holds.in_force", r.holds.len() as u64)
        )),
    );
    row(
        page,
        "Purges (checkpoints)",
        "checkpoints",
        r,
        |c| c.checkpoints.into(),
        Some(format!(
            "{} purged claims",
            count("status.tombstones", s.tombstones)
        )),
    );
    row(page, "Restores", "restored", r, |c| c.restored.into(), None);
    row(
        page,
        "Audit records",
        "records",
        r,
        |c| c.records.into(),
        Some(count("status.audit_records", s.audit_records)),
    );
    let _ = write!(
        page,
        r#"<tr><td>Outbox rows not yet published</td>{}<td class="n"><span class="muted">-</span></td><td class="n">{}</td></tr>"#,
        if r.tally.window.is_all() {
            ""
        } else {
            r#"<td class="n"><span class="muted">-</span></td>"#
        },
        count("status.outbox_backlog", s.outbox_backlog)
    );
    page.push_str("</tbody></table>\n");
}

fn chart_section(page: &mut String, r: &Report) {
    let (unit, rows) = chart::buckets(&r.tally.days);
    let _ = writeln!(page, "<h2>Disbursed per {}</h2>", unit.noun());
    if rows.is_empty() {
        page.push_str(r#"<p class="muted">No payments in the period.</p>"#);
        return;
    }
    page.push_str(&chart::svg(unit, &rows));
    let _ = write!(
        page,
        r#"<table><thead><tr><th>{}</th><th class="n">Payments</th><th class="n">Disbursed</th></tr></thead><tbody>"#,
        unit.noun()
    );
    for (label, d) in &rows {
        let _ = write!(
            page,
            r#"<tr data-bucket="{}"><td>{}</td><td class="n">{}</td><td class="n">{}</td></tr>"#,
            text(label),
            text(label),
            thousands(d.payments),
            money("bucket.cents", d.cents)
        );
    }
    page.push_str("</tbody></table>\n");
}

fn reasons(page: &mut String, r: &Report) {
    page.push_str("<h2>Dead letters by reason</h2>\n");
    if r.tally.reasons.is_empty() {
        page.push_str(r#"<p class="muted">No dead letters in the period.</p>"#);
        return;
    }
    page.push_str(
        r#"<table><thead><tr><th>Reason</th><th class="n">Dead letters</th></tr></thead><tbody>"#,
    );
    let mut rows: Vec<(&String, &u64)> = r.tally.reasons.iter().collect();
    rows.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
    for (code, n) in rows {
        let _ = write!(
            page,
            r#"<tr data-reason="{}"><td><code>{}</code></td><td class="n">{}</td></tr>"#,
            text(code),
            text(code),
            count("dead_letter_reason", *n)
        );
    }
    page.push_str("</tbody></table>\n");
}

fn holds(page: &mut String, r: &Report) {
    page.push_str("<h2>Legal holds in force</h2>\n");
    if r.holds.is_empty() {
        page.push_str(r#"<p class="muted">None.</p>"#);
        return;
    }
    page.push_str(
        r#"<table><thead><tr><th>Award</th><th>Reason</th><th>Placed at</th></tr></thead><tbody>"#,
    );
    for h in r.holds.iter().take(HOLD_ROWS_MAX) {
        let _ = write!(
            page,
            r#"<tr class="hold"><td><code>{}</code></td><td>{}</td><td>{}</td></tr>"#,
            text(&h.award_id),
            text(&h.reason),
            text(&h.held_at)
        );
    }
    page.push_str("</tbody></table>\n");
}

fn purges(page: &mut String, r: &Report) {
    page.push_str("<h2>Purges and their checkpoints</h2>\n");
    if r.tally.purges.is_empty() {
        page.push_str(
            r#"<p class="muted">No purge: the chain holds every record since the first.</p>"#,
        );
        return;
    }
    page.push_str(r#"<table><thead><tr><th class="n">Seq</th><th>Purged at</th><th>What the checkpoint says</th><th>Signature</th></tr></thead><tbody>"#);
    for p in &r.tally.purges {
        let (state, class, said) = match &p.signature {
            Signature::Verified(id) => ("verified", "ok", format!("signed by key {id}, verified")),
            Signature::Refused(why) => ("refused", "bad", why.clone()),
            Signature::NotChecked(id) => (
                "not-checked",
                "warn",
                format!("signed by key {id}; not checked (no public key given)"),
            ),
            Signature::Unsigned => ("unsigned", "warn", "unsigned".to_owned()),
        };
        let _ = write!(
            page,
            r#"<tr data-seq="{}" data-signature="{state}"><td class="n">{}</td><td>{}</td><td>{}</td><td class="{class}">{}</td></tr>"#,
            p.seq,
            p.seq,
            text(&p.recorded_at),
            text(&p.text),
            text(&said)
        );
    }
    page.push_str("</tbody></table>\n");
}

fn exceptions(page: &mut String, r: &Report) {
    let t = &r.tally;
    let _ = write!(
        page,
        "<h2>Exceptions to sample</h2>\n<p class=\"muted\">Conflicts and reviewers' decisions on them, dead letters, legal holds and vanished entries in the period, in chain order: {} in all{}.</p>\n",
        count("exceptions.total", t.exceptions_total),
        if t.exceptions_total > t.exceptions.len() as u64 {
            format!(", the first {EXCEPTIONS_MAX} listed (<code>claimgate audit export</code> has every one)")
        } else {
            String::new()
        }
    );
    if t.exceptions.is_empty() {
        return;
    }
    page.push_str(r#"<table><thead><tr><th class="n">Seq</th><th>Kind</th><th>Recorded at</th><th>Award</th><th>Stream entry</th><th>Detail</th></tr></thead><tbody>"#);
    for e in &t.exceptions {
        let kind = match e.kind {
            Kind::HoldAdded => "hold placed",
            Kind::HoldRemoved => "hold lifted",
            Kind::DeadLetter => "dead letter",
            Kind::ConflictApproved => "held conflict approved",
            Kind::ConflictRejected => "held conflict rejected",
            other => other.as_str(),
        };
        let _ = write!(
            page,
            r#"<tr class="exception" data-seq="{}" data-kind="{}"><td class="n">{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>"#,
            e.seq,
            e.kind.as_str(),
            e.seq,
            kind,
            text(&e.recorded_at),
            text(e.award_id.as_deref().unwrap_or("")),
            text(e.stream_entry_id.as_deref().unwrap_or("")),
            text(&e.detail)
        );
    }
    page.push_str("</tbody></table>\n");
}

fn footer(page: &mut String, r: &Report) {
    let _ = writeln!(
        page,
        r#"<footer><p>To check this without claimgate: <code>claimgate audit export --out audit.jsonl</code>, then <code>python3 verify-evidence.py --export audit.jsonl --anchors {} --public-key KEY.pub</code> (shipped at <code>/usr/share/claimgate/verify-evidence.py</code>; the steps are in <code>/usr/share/doc/claimgate/auditor.md</code>). The figures are read one after another from the ledger as it was at {}; on a ledger still being written, later rows may have arrived between two of them.</p></footer>"#,
        text(r.anchors_file.as_deref().unwrap_or("ANCHORS")),
        text(&r.generated_at)
    );
}
