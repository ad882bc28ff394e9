//! The service's settings file, read by every command on a box where the package put it, so an
//! operator's `claimgate status` finds the ledger and Redis the service uses without being
//! told.
//!
//! Which file: `--env-file FILE` (or `CLAIMGATE_ENV_FILE`), else [`SERVICE_ENV_FILE`] when it
//! exists; `--env-file ''` reads none. Its values apply only where neither a flag nor the
//! environment says otherwise: flag, then environment, then this file, then the built-in
//! default. It is read with systemd's rules for `EnvironmentFile=` (the service reads it that
//! way), not a shell's: `KEY=VALUE` lines, `#` and `;` comments, single or double quotes, and
//! an unquoted value taken as it stands — `&`, `;` and `$` included, where `sh -c '. FILE'`
//! would cut a URL at its `&` or expand its `$`.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the Debian package puts the service's settings (`packaging/claimgate.env`).
pub const SERVICE_ENV_FILE: &str = "/etc/claimgate/claimgate.env";

/// The flag and variable naming the file.
const FLAG: &str = "--env-file";
const VARIABLE: &str = "CLAIMGATE_ENV_FILE";

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The file read.
    pub file: PathBuf,
    /// The variables it supplied (those the process did not have already).
    pub supplied: Vec<String>,
}

/// Reads the settings file `args` (the process's arguments) and the environment name, and puts
/// each of its variables the process does not have yet into the environment. `Ok(None)` when
/// no file is to be read. Must run before any other thread starts (it changes the process's
/// environment). A file named explicitly that cannot be read, or a line that cannot be parsed,
/// is a configuration error; the default file unreadable (a user outside the `claimgate`
/// group) is a note on stderr and no file.
pub fn apply(args: &[OsString]) -> Result<Option<Applied>> {
    let (file, explicit) = match named(args) {
        Some(f) if f.as_os_str().is_empty() => return Ok(None),
        Some(f) => (f, true),
        None if Path::new(SERVICE_ENV_FILE).exists() => (PathBuf::from(SERVICE_ENV_FILE), false),
        None => return Ok(None),
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if !explicit => {
            eprintln!(
                "claimgate: note: not using the service's settings in {} ({e}); run as root or \
                 a member of the claimgate group to use them, or say --env-file ''",
                file.display()
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(Error::Config(format!(
                "cannot read --env-file {}: {e}",
                file.display()
            )))
        }
    };
    let settings = parse(&text)
        .map_err(|(line, why)| Error::Config(format!("{}:{line}: {why}", file.display())))?;
    let mut supplied = Vec::new();
    for (name, value) in settings {
        if std::env::var_os(&name).is_none() {
            // Single-threaded still: nothing else reads the environment yet.
            std::env::set_var(&name, value);
            supplied.push(name);
        }
    }
    Ok(Some(Applied { file, supplied }))
}

/// The file the command line or the environment names, if either does.
fn named(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--" {
            break;
        }
        if arg == FLAG {
            return Some(PathBuf::from(it.next().cloned().unwrap_or_default()));
        }
        if let Some(value) = arg.to_str().and_then(|a| a.strip_prefix("--env-file=")) {
            return Some(PathBuf::from(value));
        }
    }
    std::env::var_os(VARIABLE).map(PathBuf::from)
}

/// The assignments of an `EnvironmentFile=`, in order, as systemd reads them: blank lines and
/// lines starting with `#` or `;` skipped; a line ending in an unquoted `\` joined to the next;
/// `KEY=VALUE` with `KEY` a plain name; a value in double quotes with `\"`, `\\`, `\$` and
/// `` \` `` escapes, in single quotes taken as it is, or unquoted with its outer whitespace
/// removed and everything else kept. `Err((line number, why))` for a line of no such shape.
pub fn parse(text: &str) -> std::result::Result<Vec<(String, String)>, (usize, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((n, first)) = lines.next() {
        let mut line = first.trim_start().to_owned();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        while line.ends_with('\\') && !line.ends_with("\\\\") {
            line.pop();
            match lines.next() {
                Some((_, more)) => line.push_str(more),
                None => break,
            }
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((n + 1, "not a KEY=VALUE line".into()));
        };
        let key = key.trim();
        let plain = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err((n + 1, format!("{key:?} is not a variable name")));
        }
        out.push((
            key.to_owned(),
            value_of(value.trim()).map_err(|why| (n + 1, why))?,
        ));
    }
    Ok(out)
}

/// One value, quoted or not (see [`parse`]).
fn value_of(raw: &str) -> std::result::Result<String, String> {
    let Some(quote) = raw.chars().next().filter(|c| *c == '"' || *c == '\'') else {
        return Ok(raw.to_owned());
    };
    let mut value = String::new();
    let mut chars = raw[1..].chars();
    while let Some(c) = chars.next() {
        match c {
            c if c == quote => {
                let rest: String = chars.collect();
                if !rest.trim().is_empty() {
                    return Err(format!("text after the closing quote: {rest:?}"));
                }
                return Ok(value);
            }
            '\\' if quote == '"' => match chars.next() {
                Some(e @ ('"' | '\\' | '$' | '`')) => value.push(e),
                Some(other) => {
                    value.push('\\');
                    value.push(other);
                }
                None => value.push('\\'),
            },
            c => value.push(c),
        }
    }
    Err(format!("no closing {quote}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_systemd_reads_them() {
        let text = "# settings\n\
                    ; also a comment\n\
                    \n\
                    CLAIMGATE_DB=postgresql://u:p@db/ledger?schema=claimgate&sslmode=require\n\
                    REDIS_URL = redis://:pa$$word@127.0.0.1:6379  \n\
                    CLAIMGATE_STREAM=\"grants: \\\"main\\\" \\$x\"\n\
                    CLAIMGATE_GROUP='a \\ b'\n\
                    CLAIMGATE_CONSUMER=one \\\n\
                    two\n";
        let got = parse(text).unwrap();
        assert_eq!(
            got,
            vec![
                (
                    "CLAIMGATE_DB".to_owned(),
                    "postgresql://u:p@db/ledger?schema=claimgate&sslmode=require".to_owned()
                ),
                (
                    "REDIS_URL".to_owned(),
                    "redis://:pa$$word@127.0.0.1:6379".to_owned()
                ),
                (
                    "CLAIMGATE_STREAM".to_owned(),
                    "grants: \"main\" $x".to_owned()
                ),
                ("CLAIMGATE_GROUP".to_owned(), "a \\ b".to_owned()),
                ("CLAIMGATE_CONSUMER".to_owned(), "one two".to_owned()),
            ]
        );
    }

    #[test]
    fn a_line_of_another_shape_is_named_by_its_number() {
        assert_eq!(parse("A=1\nnot an assignment\n").unwrap_err().0, 2);
        assert_eq!(parse("1A=x\n").unwrap_err().0, 1);
        assert_eq!(parse("A=\"open\n").unwrap_err().0, 1);
        assert_eq!(parse("A='x' y\n").unwrap_err().0, 1);
    }

    #[test]
    fn the_file_is_named_by_the_flag_then_the_environment() {
        let args = |a: &[&str]| -> Vec<OsString> { a.iter().map(OsString::from).collect() };
        assert_eq!(
            named(&args(&["claimgate", "status", "--env-file", "/x.env"])),
            Some(PathBuf::from("/x.env"))
        );
        assert_eq!(
            named(&args(&["claimgate", "--env-file=", "status"])),
            Some(PathBuf::new())
        );
    }
}
