//! The man pages and shell completions, rendered from the same clap definitions that parse the
//! command line, so they cannot say anything `--help` does not.
//!
//! They are committed under `packaging/generated/` (so `cargo deb` alone builds the package on a
//! clean checkout) and `tests/it/package.rs` fails if that copy differs from what this renders;
//! `cargo run --release --example generate_docs` rewrites it.

use clap_complete::Shell;
use std::path::PathBuf;

/// One man page per command and subcommand (`claimgate.1`, `claimgate-run.1`,
/// `claimgate-audit-export.1`, …) under `man/`, and the bash, zsh and fish completions under
/// `completions/`, each as (path relative to the output directory, contents).
pub fn render(cmd: clap::Command) -> Vec<(PathBuf, Vec<u8>)> {
    // `help` is a flag on every page already; as a subcommand it would only add a page of its own.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut files = Vec::new();
    man_pages(&cmd, &mut files);
    let bin = cmd.get_name().to_owned();
    for (shell, name) in [
        (Shell::Bash, format!("{bin}.bash")),
        (Shell::Zsh, format!("_{bin}")),
        (Shell::Fish, format!("{bin}.fish")),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), &bin, &mut text);
        files.push((PathBuf::from("completions").join(name), text));
    }
    files
}

/// The page of `cmd`, then those of its visible subcommands, depth first. Each page is clap's
/// (name, synopsis, description, options, subcommands, version) followed by the sections a
/// man page reader looks for: ENVIRONMENT, FILES, EXIT STATUS, EXAMPLES and SEE ALSO.
fn man_pages(cmd: &clap::Command, files: &mut Vec<(PathBuf, Vec<u8>)>) {
    man_pages_under(cmd, &[], files);
}

fn man_pages_under(cmd: &clap::Command, parents: &[&str], files: &mut Vec<(PathBuf, Vec<u8>)>) {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render(&mut page)
        .expect("rendering into a Vec cannot fail");
    let mut path: Vec<&str> = parents.to_vec();
    path.push(cmd.get_name());
    page.extend(sections(cmd, &path).into_bytes());
    files.push((PathBuf::from("man").join(man.get_filename()), page));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages_under(sub, &path, files);
    }
}

/// Where the package puts claimgate's documents, for SEE ALSO.
const DOC_DIR: &str = "/usr/share/doc/claimgate";

/// The sections after clap's, for the page of `cmd` at `path` (`["claimgate", "audit",
/// "verify"]`), in roff.
fn sections(cmd: &clap::Command, path: &[&str]) -> String {
    let mut out = String::new();
    let env: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let name = a.get_env()?.to_string_lossy().into_owned();
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            Some((name, help.lines().next().unwrap_or_default().to_owned()))
        })
        .collect();
    if !env.is_empty() {
        out.push_str(".SH ENVIRONMENT\nEvery flag above can be set by its environment variable instead; a flag on the command line wins.\n");
        for (name, help) in env {
            out.push_str(&format!(".TP\n\\fB{name}\\fR\n{}\n", roff(&help)));
        }
    }
    out.push_str(
        ".SH FILES\n\
         .TP\n/etc/claimgate/claimgate.env\n\
         The service's settings (systemd's EnvironmentFile=), a conffile of the Debian package.\n\
         .TP\n/var/lib/claimgate/claimgate.db\n\
         The service's ledger, when it is a SQLite file (mode 0600; with its \\-wal, \\-shm and .lock).\n\
         .TP\n/etc/logrotate.d/claimgate\n\
         Rotates \\-\\-audit\\-log files; the service reopens them on SIGHUP.\n",
    );
    out.push_str(
        ".SH EXIT STATUS\n\
         .TP\n0\nSuccess (for run and relay: stopped by SIGINT or SIGTERM, or idle with \\-\\-exit\\-when\\-idle).\n\
         .TP\n1\nA failure: a check that found a violation, a ledger or Redis failure that outlived its retries, a refused operation. One line on stderr names what was tried.\n\
         .TP\n2\nBad usage or configuration: a flag, a URL, a password or ACL refused by Redis, PostgreSQL or a sentinel, a ledger not where it was said to be. Retrying without a change cannot help.\n",
    );
    let examples = examples(&path.join(" "));
    if !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n");
        for example in examples {
            out.push_str(&format!(".PP\n.nf\n{}\n.fi\n", roff(example)));
        }
    }
    let mut see: Vec<String> = Vec::new();
    if path.len() > 1 {
        see.push(format!("\\fB{}\\fR(1)", path[..path.len() - 1].join("-")));
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        see.push(format!("\\fB{}-{}\\fR(1)", path.join("-"), sub.get_name()));
    }
    out.push_str(&format!(
        ".SH SEE ALSO\n{}{}README.md in {DOC_DIR}, and guide.md, operations.md, failure\\-handling.md, postgres.md and auditor.md in {DOC_DIR}/docs\n",
        see.join(", "),
        if see.is_empty() { "" } else { "; " }
    ));
    out
}

/// Text for roff: backslashes and hyphens escaped, and a line that would start with a dot or
/// an apostrophe (a roff request) guarded.
fn roff(text: &str) -> String {
    text.lines()
        .map(|line| {
            let line = line.replace('\\', "\\\\").replace('-', "\\-");
            if line.starts_with('.') || line.starts_with('\'') {
                format!("\\&{line}")
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The EXAMPLES of the page of the command `path` (`"claimgate audit verify"`); each is a
/// command line `examples_parse` (below) holds to the parser.
pub fn examples(path: &str) -> &'static [&'static str] {
    match path {
        "claimgate" => &[
            "claimgate demo",
            "claimgate run --relay --metrics-addr 127.0.0.1:9464",
            "claimgate status",
        ],
        "claimgate run" => &[
            "claimgate run --relay --metrics-addr 127.0.0.1:9464",
            "claimgate run --exit-when-idle",
            "claimgate run --db 'postgresql://claimgate_worker:PASSWORD@db.internal:5432/claimgate?schema=claimgate'",
        ],
        "claimgate init" => &[
            "claimgate init --db 'postgresql://claimgate_owner:PASSWORD@db.internal:5432/claimgate?schema=claimgate'",
        ],
        "claimgate produce" => &["claimgate produce submissions.jsonl"],
        "claimgate status" => &["claimgate status --json", "claimgate status --watch 5"],
        "claimgate key" => &[
            "claimgate key --award-id A-2026-014 --timestamp 2026-07-01T09:00:00Z --payload-file p.json",
        ],
        "claimgate relay" => &["claimgate relay --exit-when-idle"],
        "claimgate verify" => &["claimgate verify"],
        "claimgate audit export" => &["claimgate audit export --out audit.jsonl"],
        "claimgate audit verify" => &[
            "claimgate audit verify",
            "claimgate audit verify --anchors anchors.jsonl --public-key audit-key.pub",
        ],
        "claimgate audit anchor" => &["claimgate audit anchor --out anchors.jsonl"],
        "claimgate audit keygen" => &["claimgate audit keygen --out /etc/claimgate/audit-key"],
        "claimgate dlq list" => &["claimgate dlq list"],
        "claimgate dlq approve" => &[
            "claimgate dlq approve 1751360400000-0 --by 'Ann Auditor' --reason 'amount corrected on invoice 7'",
        ],
        "claimgate dlq reject" => &[
            "claimgate dlq reject 1751360400000-0 --by 'Ann Auditor' --reason 'sent twice by the portal'",
        ],
        "claimgate hold add" => &["claimgate hold add A-2026-014 --reason 'case 21-cv-0042'"],
        "claimgate retention purge" => &[
            "claimgate retention purge --before 2023-01-01 --export purged-2022.jsonl",
        ],
        "claimgate backup" => &["claimgate backup /var/backups/claimgate-2026-12-05.db"],
        "claimgate restore" => &["claimgate restore /var/backups/claimgate-2026-12-01.db"],
        "claimgate migrate" => &[
            "claimgate migrate --db /var/lib/claimgate/claimgate.db --to 'postgresql://claimgate_owner:PASSWORD@db.internal:5432/claimgate?schema=claimgate'",
        ],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `line` split into words as a shell would, for the simple lines the examples are: words
    /// apart at spaces, single quotes kept together.
    fn words(line: &str) -> Vec<String> {
        let mut out = vec![String::new()];
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                ' ' if !quoted => out.push(String::new()),
                c => out.last_mut().expect("one word at least").push(c),
            }
        }
        out.retain(|w| !w.is_empty());
        out
    }

    /// Every command path of the tree under `cmd`.
    fn paths(cmd: &clap::Command, parents: &[String], out: &mut Vec<String>) {
        let mut path = parents.to_vec();
        path.push(cmd.get_name().to_owned());
        out.push(path.join(" "));
        for sub in cmd.get_subcommands() {
            paths(sub, &path, out);
        }
    }

    #[test]
    fn every_man_page_example_is_a_command_line_the_parser_takes_on_its_own_page() {
        let cmd = crate::cli::command();
        let mut all = Vec::new();
        paths(&cmd, &[], &mut all);
        let mut seen = 0;
        for path in &all {
            for example in examples(path) {
                assert!(
                    example.starts_with(path.as_str()),
                    "{example} is on {path}'s page"
                );
                let args = words(example);
                if let Err(e) = crate::cli::command().try_get_matches_from(&args) {
                    panic!("{example}: {e}");
                }
                seen += 1;
            }
        }
        assert!(seen >= 20, "{seen} examples");
    }

    #[test]
    fn every_page_has_the_sections_a_reader_looks_for() {
        for (path, page) in render(crate::cli::command()) {
            if !path.starts_with("man") {
                continue;
            }
            let page = String::from_utf8(page).unwrap();
            for section in [".SH NAME", ".SH FILES", ".SH EXIT STATUS", ".SH SEE ALSO"] {
                assert!(page.contains(section), "{} lacks {section}", path.display());
            }
        }
    }
}
