//! The documents' commands, held to the program: every `claimgate` command line any document
//! shows is one the real parser takes (a renamed flag or command fails here, not in an
//! operator's first hour), and README's five-minute walk is run verbatim against a private
//! Redis. README's PostgreSQL recipe is run verbatim in `dba.rs`; the man pages' examples in
//! `src/cli/docs.rs`. Commands of other programs (apt, systemctl, curl) are not run here:
//! `package.rs` checks what the package installs and the unit it ships.

use crate::support::World;
use std::path::{Path, PathBuf};

/// The repository's documents: README.md, CONTRIBUTING.md and every docs/*.md.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The fenced code blocks of a Markdown text, with the language each names.
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => open = Some((lang.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// `line` split into words as a shell would for the plain lines documents show: words apart at
/// unquoted spaces outside `$(…)`, quotes kept together and removed, nothing expanded.
fn words(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quote: Option<char> = None;
    let mut depth = 0;
    let mut last = ' ';
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ' ') if depth == 0 => out.push(String::new()),
            (_, c) => {
                if c == '(' && last == '$' {
                    depth += 1;
                } else if c == ')' && depth > 0 {
                    depth -= 1;
                }
                out.last_mut().unwrap().push(c);
            }
        }
        last = c;
    }
    out.retain(|w| !w.is_empty());
    out
}

/// The claimgate command lines of one shell line: its comment dropped, `sudo` and `sudo -u
/// USER` dropped, optional parts (`[--json]`) taken, and the shorthand `claimgate dlq list |
/// dlq show ID` read as two lines.
fn claimgate_lines(line: &str) -> Vec<Vec<String>> {
    let code = match line.find(" #") {
        Some(at) => &line[..at],
        None => line,
    };
    let mut w = words(&code.replace(['[', ']'], ""));
    while w.first().is_some_and(|x| x == "sudo") {
        w.remove(0);
        if w.first().is_some_and(|x| x == "-u") {
            w.drain(..2);
        }
    }
    if w.first().map(String::as_str) != Some("claimgate") {
        return Vec::new();
    }
    let mut lines = vec![Vec::new()];
    for word in w {
        if word == "|" {
            lines.push(vec!["claimgate".to_owned()]);
        } else {
            lines.last_mut().unwrap().push(word);
        }
    }
    lines
}

#[test]
fn every_claimgate_command_a_document_shows_is_one_the_parser_takes() {
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (_, body) in blocks(&text) {
            for line in body.lines() {
                for args in claimgate_lines(line.trim()) {
                    if let Err(e) = claimgate::cli::command().try_get_matches_from(&args) {
                        panic!("{}: {line}\n{e}", doc.display());
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} command lines found");
}

#[test]
fn the_readmes_five_minutes_run_verbatim_do_what_they_say() {
    // The walk of README's "Five minutes with it", every line as written, in a fresh
    // directory, against a private Redis (REDIS_URL) and no service settings: two paid, the
    // resend suppressed, the bad one dead-lettered, status and dlq list saying so, two events.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n## Five minutes with it\n")
        .nth(1)
        .expect("README has the section")
        .split("\n## ")
        .next()
        .unwrap();
    let (_, walk) = blocks(section).into_iter().next().expect("one sh block");
    let w = World::new();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_claimgate")).parent().unwrap();
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &walk])
        .current_dir(w.dir.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("REDIS_URL", w.redis.url())
        .env("CLAIMGATE_ENV_FILE", "")
        .env_remove("CLAIMGATE_DB")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ledger = rusqlite::Connection::open(w.dir.path().join("claimgate.db")).unwrap();
    let one = |sql: &str| -> i64 { ledger.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(one("SELECT COUNT(*) FROM disbursements"), 2);
    assert_eq!(one("SELECT SUM(amount_cents) FROM disbursements"), 223_000);
    assert_eq!(one("SELECT COUNT(*) FROM dead_letters"), 1);
    assert_eq!(w.xlen("grants:events"), 2);
    for shown in ["$2,230.00", "bad_timestamp"] {
        assert!(said.contains(shown), "{shown} not shown:\n{said}");
    }
}
