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

/// The page of `cmd`, then those of its visible subcommands, depth first.
fn man_pages(cmd: &clap::Command, files: &mut Vec<(PathBuf, Vec<u8>)>) {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render(&mut page)
        .expect("rendering into a Vec cannot fail");
    files.push((PathBuf::from("man").join(man.get_filename()), page));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, files);
    }
}
