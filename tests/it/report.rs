//! `claimgate audit report`, opened as an auditor opens it: rendered by a real headless browser
//! (Debian's `chromium`), screenshotted and checked for a verdict banner in the right colour,
//! its DOM (as the browser parsed it) read back figure by figure and compared with what
//! `status --json`, `verify` and `audit verify --anchors` say and with the ledger's own rows,
//! on both ledgers. Producer text that is markup renders as text; a tampered ledger's report
//! says FAILED, names what broke, and the command exits 1.

use crate::audit::{backdate, ONE_PER_BATCH};
use crate::support::{self, RunWithDeadline, Store, World};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

on_both_ledgers!(
    a_report_in_a_browser_shows_every_figure_the_ledger_commands_show_and_markup_as_text,
    a_tampered_ledger_or_anchor_renders_failed_naming_it_and_exits_1,
);

/// Records 1..=4 are written at this time (and purged: it is before the purge's cutoff).
pub(crate) const JAN: &str = "2020-01-10T12:00:00.000000Z";
/// Records 5..=8 at this one: the period the period report selects.
pub(crate) const FEB: &str = "2020-02-10T12:00:00.000000Z";
/// Award ids a hostile producer might send: each must render as text.
pub(crate) const SCRIPT_AWARD: &str = "<script>alert(1)</script>";
pub(crate) const IMG_AWARD: &str = "\"><img src=x onerror=alert(1)>";

/// The evidence kept beside a ledger built by [`ledger_with_everything`].
pub(crate) struct Kept {
    /// The operator's signing key.
    pub key: PathBuf,
    /// Its public half.
    pub public: PathBuf,
    /// Three signed anchors: seq 3 (purged since, covered by the checkpoint), seq 8, the head.
    pub anchors: PathBuf,
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub(crate) fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A ledger holding every kind of record a report shows, and its evidence.
///
/// 1. Submissions 0..3, one per batch, back-dated to January 2020; a signed anchor (seq 3).
/// 2. Submissions 3..8, one per batch; 1..=4 back-dated to January, 5..=8 to February 2020
///    (the anchor of seq 3 still holds: its records are as they were); a signed anchor (seq 8).
/// 3. Now, in ordinary batches: submissions 8..12, one resent (a duplicate), one whose award
///    id is a `<script>` element, a conflicting resubmission of it (paid), an entry that is
///    not JSON and one with a wrong-typed amount whose award id is an `<img onerror>` (two
///    dead letters).
/// 4. A hold placed and lifted, one placed on the `<script>` award with markup in its reason.
/// 5. Relayed; a signed purge of everything before 2020-02-01 (records 1..=4, checkpoint at 4);
///    a signed anchor of the head.
pub(crate) fn ledger_with_everything(store: Store) -> (World, Kept) {
    let w = World::on(store);
    let key = w.dir.path().join("audit-key");
    w.run_ok(&["audit", "keygen", "--out", s(&key)]);
    let public = w.dir.path().join("audit-key.pub");
    let anchors = w.dir.path().join("anchors.jsonl");
    let anchor = || {
        w.run_ok(&[
            "audit",
            "anchor",
            "--out",
            s(&anchors),
            "--signing-key",
            s(&key),
        ])
    };
    w.add(&(0..3).map(support::submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    backdate(&w, 3, JAN);
    anchor();
    w.add(&(3..8).map(support::submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    backdate(&w, 8, FEB);
    backdate(&w, 4, JAN);
    anchor();

    let hostile = |award: &str, amount: serde_json::Value| {
        serde_json::json!({
            "award_id": award,
            "submission_timestamp": "2026-07-01T09:00:00Z",
            "amount_cents": amount,
        })
        .to_string()
    };
    let mut now: Vec<String> = (8..12).map(support::submission).collect();
    now.push(support::submission(9));
    now.push(hostile(SCRIPT_AWARD, 500.into()));
    now.push(hostile(SCRIPT_AWARD, 501.into()));
    now.push(hostile(IMG_AWARD, "x".into()));
    w.add(&now);
    w.add_fields(&[("payload", b"not json")]);
    w.drain(&[]);
    w.run_ok(&["hold", "add", "A-000001", "--reason", "case 7"]);
    w.run_ok(&["hold", "remove", "A-000001"]);
    w.run_ok(&["hold", "add", SCRIPT_AWARD, "--reason", IMG_AWARD]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    let export = w.dir.path().join("purged.jsonl");
    w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2020-02-01",
        "--export",
        s(&export),
        "--signing-key",
        s(&key),
    ]);
    anchor();
    assert_eq!(
        w.sql_i64("SELECT seq FROM audit_log WHERE kind = 'checkpoint'"),
        4
    );
    w.run_ok(&["verify"]);
    (
        w,
        Kept {
            key,
            public,
            anchors,
        },
    )
}

fn a_report_in_a_browser_shows_every_figure_the_ledger_commands_show_and_markup_as_text(
    store: Store,
) {
    let (w, kept) = ledger_with_everything(store);
    let out = w.dir.path().join("report.html");
    let said = report(&w, 0, &out, &kept, &[]);
    assert!(said.contains("every anchor holds"), "{said}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let page = Page::open(&out);
    assert_eq!(page.banner, VERIFIED_GREEN, "the verdict banner is green");
    printable(&out);
    let f = &page.figures;
    assert_eq!(f.one("verdict"), "verified");
    self_contained(&page.dom);
    markup_is_text(&page.dom);
    same_as_status(&w, f);
    same_as_verify(&w, f);
    same_as_audit_verify(&w, f, &kept);
    same_as_rows(&w, &page);

    // A period: only February's four payments are counted in it, and drawn day by day; the
    // whole chain is still verified and counted beside it.
    let feb = w.dir.path().join("february.html");
    report(
        &w,
        0,
        &feb,
        &kept,
        &["--since", "2020-02-01", "--until", "2020-03-01"],
    );
    let p = Page::open(&feb);
    let feb_paid = w.sql_i64(&format!(
        "SELECT COUNT(*) FROM audit_log WHERE kind = 'processed' AND recorded_at = '{FEB}'"
    ));
    assert_eq!(feb_paid, 4);
    assert_eq!(p.figures.one("period.processed"), "4");
    assert_eq!(
        p.figures.one("period.disbursed_cents"),
        w.sql_text(&format!(
            "SELECT CAST(SUM(amount_cents) AS TEXT) FROM audit_log
             WHERE kind = 'processed' AND recorded_at = '{FEB}'"
        ))
    );
    assert_eq!(p.figures.one("period.dead_letters"), "0");
    assert_eq!(p.figures.one("chain.processed"), f.one("chain.processed"));
    assert_eq!(
        p.bars(),
        vec![(
            "2020-02-10".to_owned(),
            p.figures.one("period.disbursed_cents")
        )]
    );

    // The report never replaces a file, its own or anyone's.
    let before = std::fs::read(&out).unwrap();
    let again = report(&w, 2, &out, &kept, &[]);
    assert!(again.contains("never overwrites"), "{again}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
}

fn a_tampered_ledger_or_anchor_renders_failed_naming_it_and_exits_1(store: Store) {
    let (w, kept) = ledger_with_everything(store);
    // An anchor whose record count was raised after it was signed: its signature fails.
    let text = std::fs::read_to_string(&kept.anchors).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let edited = lines[2].replacen(r#""records":"#, r#""records":1"#, 1);
    assert_ne!(edited, lines[2]);
    let tampered = Kept {
        anchors: w.dir.path().join("tampered-anchors.jsonl"),
        key: kept.key.clone(),
        public: kept.public.clone(),
    };
    std::fs::write(
        &tampered.anchors,
        format!("{}\n{}\n{edited}\n", lines[0], lines[1]),
    )
    .unwrap();
    let out = w.dir.path().join("anchor.html");
    let said = report(&w, 1, &out, &tampered, &[]);
    assert!(
        said.contains("anchor on line 3") && said.contains("says FAILED"),
        "{said}"
    );
    let page = Page::open(&out);
    assert_eq!(page.banner, FAILED_RED);
    assert_eq!(page.figures.one("verdict"), "failed");
    assert!(page
        .figures
        .one("verdict.detail")
        .contains("anchor on line 3"));
    assert_eq!(page.row_status(3), "fails");
    assert_eq!(page.row_status(2), "holds");

    // A payment's record edited in place: the chain breaks there, and the report says where.
    let seq = 6;
    let (table, row) = match store {
        Store::Sqlite => ("audit_log", format!("seq = {seq}")),
        Store::Postgres => (
            "audit_members",
            format!("(batch_id, batch_index) = (SELECT batch_id, batch_index FROM audit_log WHERE seq = {seq})"),
        ),
    };
    w.sql().exec(&format!(
        "UPDATE {table} SET amount_cents = amount_cents + 100000 WHERE {row}"
    ));
    let out = w.dir.path().join("edited.html");
    let said = report(&w, 1, &out, &kept, &[]);
    assert!(said.contains("audit chain broken at seq 6"), "{said}");
    let page = Page::open(&out);
    assert_eq!(page.banner, FAILED_RED);
    let f = &page.figures;
    assert_eq!(f.one("verdict"), "failed");
    assert_eq!(f.one("chain.broken_seq"), "6");
    assert!(
        f.one("verdict.detail")
            .contains("audit chain broken at seq 6"),
        "{}",
        f.one("verdict.detail")
    );
    // The figures are still shown, for what they are worth: what the ledger holds.
    let status: serde_json::Value =
        serde_json::from_slice(&w.run_ok(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        f.one("status.claims"),
        status["ledger"]["claims"].to_string()
    );
    // The anchors past the break were never reached: the report does not pretend otherwise.
    assert_eq!(page.row_status(3), "not-checked");
    let cmd = w.run(&["audit", "verify", "--anchors", s(&kept.anchors)]);
    assert_eq!(cmd.status.code(), Some(1));
    assert!(stderr(&cmd).contains("audit chain broken at seq 6"));
}

/// Runs `audit report --out OUT --anchors .. --public-key .. EXTRA`, insists on exit `code`,
/// and returns what it said (stdout and stderr).
pub(crate) fn report(w: &World, code: i32, out: &Path, kept: &Kept, extra: &[&str]) -> String {
    let mut args = vec![
        "audit",
        "report",
        "--out",
        s(out),
        "--anchors",
        s(&kept.anchors),
        "--public-key",
        s(&kept.public),
    ];
    args.extend_from_slice(extra);
    let run = w.run(&args);
    let said = format!("{}{}", stdout(&run), stderr(&run));
    assert_eq!(run.status.code(), Some(code), "{args:?}: {said}");
    said
}

fn same_as_status(w: &World, f: &Figures) {
    let status: serde_json::Value =
        serde_json::from_slice(&w.run_ok(&["status", "--json"]).stdout).unwrap();
    let l = &status["ledger"];
    for key in [
        "claims",
        "disbursed_cents_total",
        "duplicates_suppressed",
        "conflicts",
        "dead_letters",
        "vanished",
        "audit_records",
        "tombstones",
        "outbox_backlog",
    ] {
        assert_eq!(f.one(&format!("status.{key}")), l[key].to_string(), "{key}");
    }
    // The chain, counted record by record, says what the ledger's own counts say.
    for (chain, key) in [
        ("processed", "claims"),
        ("disbursed_cents", "disbursed_cents_total"),
        ("duplicates", "duplicates_suppressed"),
        ("conflicts", "conflicts"),
        ("dead_letters", "dead_letters"),
        ("vanished", "vanished"),
        ("records", "audit_records"),
    ] {
        assert_eq!(
            f.one(&format!("chain.{chain}")),
            l[key].to_string(),
            "{chain}"
        );
    }
    assert_eq!(
        l["claims"],
        4 + 4 + 2,
        "February's, the four now and the two <script> ones"
    );
    assert_eq!(l["conflicts"], 1);
    assert_eq!(l["dead_letters"], 2);
    assert_eq!(l["duplicates_suppressed"], 1);
    assert_eq!(f.one("chain.holds_placed"), "2");
    assert_eq!(f.one("chain.holds_lifted"), "1");
    assert_eq!(f.one("chain.checkpoints"), "1");
}

fn same_as_verify(w: &World, f: &Figures) {
    let said = stdout(&w.run_ok(&["verify"]));
    let expected = format!(
        "ledger verified: {} claims, {} disbursements, {} outbox rows, one each; {} tombstones of purged claims; {} audit records, chain intact (head {})",
        f.one("verify.claims"),
        f.one("verify.disbursements"),
        f.one("verify.outbox_rows"),
        f.one("verify.tombstones"),
        f.one("verify.audit_records"),
        f.one("chain.head"),
    );
    assert!(
        said.contains(&expected),
        "verify said {said}\nthe report {expected}"
    );
}

fn same_as_audit_verify(w: &World, f: &Figures, kept: &Kept) {
    let said = stdout(&w.run_ok(&[
        "audit",
        "verify",
        "--anchors",
        s(&kept.anchors),
        "--public-key",
        s(&kept.public),
    ]));
    for line in [
        format!("audit chain intact: {} records, head {}", f.one("chain.checked"), f.one("chain.head")),
        format!(
            "anchors hold: {} of {} found with the anchored hash, {} covered by a retention checkpoint",
            f.one("anchors.matched"),
            f.one("anchors.total"),
            f.one("anchors.covered")
        ),
        format!(
            "signatures verified with key {}: {} checkpoint(s) and every anchor",
            f.one("key.id"),
            f.one("signatures.checkpoints")
        ),
    ] {
        assert!(said.contains(&line), "audit verify said {said}\nthe report {line}");
    }
    assert_eq!(
        (
            f.one("anchors.total"),
            f.one("anchors.covered"),
            f.one("anchors.failed")
        ),
        ("3".into(), "1".into(), "0".into())
    );
    assert_eq!(f.one("signatures.checkpoints"), "1");
}

/// The chart, the tables and the ledger's rows, each against the other.
fn same_as_rows(w: &World, page: &Page) {
    let f = &page.figures;
    // Disbursed per month (the payments span 2020 to now), as the records say.
    let mut db = w.sql();
    let months = db.text(
        "SELECT string_agg(m || '=' || c, ',' ORDER BY m) FROM (SELECT substr(recorded_at, 1, 7)
                AS m, CAST(SUM(amount_cents) AS TEXT) AS c FROM audit_log WHERE kind = 'processed'
                GROUP BY substr(recorded_at, 1, 7)) t",
    );
    let drawn: Vec<String> = page
        .bars()
        .into_iter()
        .filter(|(_, c)| c != "0")
        .map(|(m, c)| format!("{m}={c}"))
        .collect();
    assert_eq!(drawn.join(","), months);
    let total: i128 = page
        .bars()
        .iter()
        .map(|(_, c)| c.parse::<i128>().unwrap())
        .sum();
    assert_eq!(total.to_string(), f.one("status.disbursed_cents_total"));
    // Every exception, by seq, in chain order.
    let seqs = db.text(
        "SELECT string_agg(CAST(seq AS TEXT), ',' ORDER BY seq) FROM audit_log
         WHERE kind IN ('conflict', 'dead_letter', 'hold_added', 'hold_removed', 'vanished')",
    );
    assert_eq!(
        page.attrs("tr", "class=\"exception\"", "data-seq")
            .join(","),
        seqs
    );
    assert_eq!(
        f.one("exceptions.total"),
        seqs.split(',').count().to_string()
    );
    // Dead letters by reason, as the dead_letters table has them.
    let reasons = db.text(
        "SELECT string_agg(reason_code || '=' || CAST(n AS TEXT), ',' ORDER BY reason_code)
         FROM (SELECT reason_code, COUNT(*) AS n FROM dead_letters GROUP BY reason_code) t",
    );
    let mut shown: Vec<String> = page
        .attrs("tr", "data-reason=", "data-reason")
        .into_iter()
        .zip(f.all("dead_letter_reason"))
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    shown.sort();
    assert_eq!(shown.join(","), reasons);
    assert_eq!(
        f.one("holds.in_force"),
        db.i64("SELECT COUNT(*) FROM legal_holds").to_string()
    );
    // The purge, its checkpoint and its verified signature.
    assert_eq!(
        page.attrs("tr", "data-signature=", "data-signature"),
        ["verified"]
    );
    // Anchors: the one of seq 3 is covered by the checkpoint at seq 4; the others hold.
    let statuses = page.attrs("tr", "data-line=", "data-status");
    assert_eq!(statuses, ["covered", "holds", "holds"]);
}

/// The page loads nothing and runs nothing: no script, no element that fetches, no URL.
fn self_contained(dom: &str) {
    // Text holds no `<` (the browser writes it `&lt;`): every `<` starts a tag.
    for tag in dom
        .split('<')
        .skip(1)
        .map(|t| &t[..t.find('>').unwrap_or(t.len())])
    {
        let name = tag.split([' ', '/']).next().unwrap_or("");
        assert!(
            !["script", "link", "img", "iframe", "object", "embed", "base"].contains(&name),
            "the report holds <{tag}>"
        );
        assert!(
            !tag.contains(" src=") && !tag.contains(" href="),
            "<{tag}> fetches"
        );
    }
    assert!(!dom.contains("url("), "the style fetches");
    assert!(dom.contains("@media print"), "a print stylesheet");
}

/// The report prints to PDF, through its print stylesheet.
fn printable(html: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let pdf = dir.path().join("report.pdf");
    let url = format!("file://{}", html.display());
    chromium(
        dir.path(),
        &[
            &format!("--print-to-pdf={}", pdf.display()),
            "--no-pdf-header-footer",
            &url,
        ],
    );
    let bytes = std::fs::read(&pdf).unwrap();
    assert!(bytes.starts_with(b"%PDF-"), "not a PDF");
    assert!(bytes.len() > 20_000, "a PDF of {} bytes", bytes.len());
}

/// The hostile award ids are in the page as text, in the exceptions and the holds.
fn markup_is_text(dom: &str) {
    let script = "&lt;script&gt;alert(1)&lt;/script&gt;";
    assert!(
        dom.matches(script).count() >= 3,
        "the <script> award, shown as text"
    );
    let img = "\"&gt;&lt;img src=x onerror=alert(1)&gt;";
    assert!(
        dom.matches(img).count() >= 2,
        "the <img> award and reason, shown as text"
    );
}

/// What the verdict banner is painted, in the screenshot.
const VERIFIED_GREEN: [u8; 3] = [0x1c, 0x74, 0x30];
const FAILED_RED: [u8; 3] = [0xb3, 0x26, 0x1e];

/// Reads a PNG's first rows (colour types 2 and 6, 8 bits, not interlaced: what chromium
/// writes) and prints how many colours they hold and the most common one among rows 30..70,
/// where the verdict banner is.
const PNG_PROBE: &str = r#"
import sys, zlib, struct, json, collections
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat = 8, b''
while pos < len(data):
    n, = struct.unpack('>I', data[pos:pos + 4]); kind = data[pos + 4:pos + 8]
    body = data[pos + 8:pos + 8 + n]; pos += 12 + n
    if kind == b'IHDR': w, h, depth, ctype, _, _, inter = struct.unpack('>IIBBBBB', body)
    elif kind == b'IDAT': idat += body
assert depth == 8 and ctype in (2, 6) and inter == 0, (depth, ctype, inter)
raw = zlib.decompressobj().decompress(idat, (w * 4 + 1) * 700)
bpp = 3 if ctype == 2 else 4; stride = w * bpp
prev = bytearray(stride); colours = collections.Counter(); banner = collections.Counter()
for y in range(min(h, int(sys.argv[2]))):
    f = raw[y * (stride + 1)]; line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0; b = prev[i]; c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    px = [bytes(line[i:i + 3]) for i in range(0, stride, bpp)]
    colours.update(px)
    if 30 <= y < 70: banner.update(px)
    prev = line
print(json.dumps({'width': w, 'height': h, 'colours': len(colours), 'banner': list(banner.most_common(1)[0][0])}))
"#;

/// A report as a browser shows it.
pub(crate) struct Page {
    /// The DOM the browser built, serialized.
    pub dom: String,
    /// Its figures.
    pub figures: Figures,
    /// The colour of the verdict banner in the screenshot.
    pub banner: [u8; 3],
}

impl Page {
    /// Renders `html` in chromium: a screenshot (checked not blank) and the DOM.
    pub(crate) fn open(html: &Path) -> Page {
        let dir = tempfile::tempdir().unwrap();
        let shot = dir.path().join("shot.png");
        let url = format!("file://{}", html.display());
        let shot_arg = format!("--screenshot={}", shot.display());
        chromium(dir.path(), &[&shot_arg, "--window-size=1100,1400", &url]);
        let probe = Command::new("python3")
            .args(["-c", PNG_PROBE, s(&shot), "700"])
            .run_within(Duration::from_secs(120));
        assert!(probe.status.success(), "{}", stderr(&probe));
        let seen: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
        assert_eq!(
            (seen["width"].as_u64(), seen["height"].as_u64()),
            (Some(1100), Some(1400))
        );
        assert!(
            seen["colours"].as_u64().unwrap() > 50,
            "a blank screenshot: {seen}"
        );
        let banner: Vec<u8> = serde_json::from_value(seen["banner"].clone()).unwrap();
        let dom = chromium(dir.path(), &["--dump-dom", &url]);
        assert!(dom.contains("</html>"), "{dom}");
        Page {
            figures: Figures::read(&dom),
            dom,
            banner: banner.try_into().unwrap(),
        }
    }

    /// The chart's bars: (bucket, cents).
    fn bars(&self) -> Vec<(String, String)> {
        self.attrs("rect", "class=\"bar\"", "data-bucket")
            .into_iter()
            .zip(self.attrs("rect", "class=\"bar\"", "data-cents"))
            .collect()
    }

    /// The status of the anchor on `line` in the anchors table.
    fn row_status(&self, line: usize) -> String {
        let tags = tags(&self.dom, "tr");
        let row = tags
            .iter()
            .find(|t| attr(t, "data-line").as_deref() == Some(&line.to_string()))
            .unwrap_or_else(|| panic!("no anchor row for line {line}"));
        attr(row, "data-status").unwrap()
    }

    /// Attribute `name` of every `<element …>` whose tag contains `marker`, in page order.
    fn attrs(&self, element: &str, marker: &str, name: &str) -> Vec<String> {
        tags(&self.dom, element)
            .iter()
            .filter(|t| t.contains(marker))
            .filter_map(|t| attr(t, name))
            .collect()
    }
}

/// Runs chromium headless with the flags that work in a container (no sandbox, no GPU, no
/// network of its own) and a fresh profile under `dir`; returns its stdout.
fn chromium(dir: &Path, args: &[&str]) -> String {
    let profile = tempfile::tempdir_in(dir).unwrap();
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args);
    if let Err(e) = Command::new("chromium").arg("--version").output() {
        panic!("the report tests need Debian's chromium ({e}): apt-get install -y chromium");
    }
    let out = cmd.run_within(Duration::from_secs(120));
    assert!(out.status.success(), "chromium {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Every start tag `<element …>` in `dom`.
fn tags<'a>(dom: &'a str, element: &str) -> Vec<&'a str> {
    let open = format!("<{element} ");
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(i) = rest.find(&open) {
        let tag = &rest[i..];
        let end = tag.find('>').unwrap();
        out.push(&tag[..end]);
        rest = &tag[end..];
    }
    out
}

/// The value of attribute `name` in a start tag, unescaped as the browser escaped it.
fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')?;
    Some(
        tag[start..start + end]
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

/// A report's figures: `data-figure` name → every `data-value` of that name.
pub(crate) struct Figures(BTreeMap<String, Vec<String>>);

impl Figures {
    fn read(dom: &str) -> Figures {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for element in ["span", "section", "p"] {
            for t in tags(dom, element) {
                if let Some(name) = attr(t, "data-figure") {
                    let value = attr(t, "data-value").unwrap_or_else(|| {
                        // A figure written as text (the verdict's detail): its element's text.
                        let at = dom.find(t).unwrap() + t.len() + 1;
                        let end = dom[at..].find('<').unwrap();
                        dom[at..at + end].replace("&amp;", "&")
                    });
                    map.entry(name).or_default().push(value);
                }
            }
        }
        Figures(map)
    }

    /// The one value of figure `name`.
    pub(crate) fn one(&self, name: &str) -> String {
        match self.0.get(name).map(Vec::as_slice) {
            Some([one]) => one.clone(),
            other => panic!("figure {name}: {other:?}"),
        }
    }

    /// Every value of figure `name`, in page order.
    fn all(&self, name: &str) -> Vec<String> {
        self.0.get(name).cloned().unwrap_or_default()
    }
}
