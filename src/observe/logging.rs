//! Log output: human-readable lines by default, one JSON object per line for shipping, and the
//! audit lines (target [`crate::domain::audit::LOG_TARGET`]) optionally routed to a file of their own.
//!
//! Levels and targets come from `RUST_LOG` as usual (default `info`), so
//! `RUST_LOG=info,claimgate::audit=off` silences audit lines and `RUST_LOG=claimgate::audit=info`
//! keeps only them. `--audit-log FILE` appends every audit line to `FILE` (mode 0600, created if
//! needed) whatever `RUST_LOG` says, and takes them off stderr.
//!
//! A human line is one line whatever its message holds: control characters in the message (a
//! newline in an `award_id`, a carriage return, an ESC that a terminal would obey) are escaped,
//! so no submission can forge a log or audit line of its own. JSON lines need no such care:
//! the JSON encoder already escapes them inside the `message` string.
//!
//! Nothing here ever sees a Redis URL: callers log [`crate::broker::stream::redact`]ed forms only.

use crate::domain::audit;
use crate::error::{Error, Result};
use log::{Log, Metadata, Record};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// How each log line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `2026-11-29T23:15:00.123456Z INFO  claimgate::worker: message`
    #[default]
    Human,
    /// `{"ts":"…","level":"INFO","target":"claimgate::worker","message":"…"}`
    Json,
}

/// Where logs go and in what shape.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Line format for stderr and the audit file alike.
    pub format: Format,
    /// Append audit lines here instead of stderr.
    pub audit_log: Option<PathBuf>,
}

/// Routes audit lines to their file (when one is set) and everything else to stderr.
struct Router {
    /// stderr, filtered by `RUST_LOG`.
    main: env_logger::Logger,
    /// The audit file, when `--audit-log` is set.
    audit: Option<Mutex<std::fs::File>>,
    /// Line format.
    format: Format,
}

impl Log for Router {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        if self.audit.is_some() && metadata.target() == audit::LOG_TARGET {
            return metadata.level() <= log::Level::Info;
        }
        self.main.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        match &self.audit {
            Some(file) if record.target() == audit::LOG_TARGET => {
                if record.level() <= log::Level::Info {
                    let line = format_line(self.format, record);
                    let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
                    // A failed audit-log write must not stop payments; the ledger's audit
                    // table is the record of truth and this file only mirrors it.
                    let _ = file.write_all(line.as_bytes());
                }
            }
            _ => self.main.log(record),
        }
    }

    fn flush(&self) {
        self.main.flush();
        if let Some(file) = &self.audit {
            let _ = file.lock().unwrap_or_else(|p| p.into_inner()).flush();
        }
    }
}

/// Installs the process-wide logger. Call once, from `main`.
pub fn init(options: &Options) -> Result<()> {
    let format = options.format;
    let main = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(move |buf, record| buf.write_all(format_line(format, record).as_bytes()))
        .build();
    let mut max_level = main.filter();
    let audit = match &options.audit_log {
        None => None,
        Some(path) => {
            max_level = max_level.max(log::LevelFilter::Info);
            Some(Mutex::new(open_private_append(path)?))
        }
    };
    log::set_boxed_logger(Box::new(Router {
        main,
        audit,
        format,
    }))
    .map_err(|e| Error::Other(format!("installing the logger: {e}")))?;
    log::set_max_level(max_level);
    Ok(())
}

fn open_private_append(path: &std::path::Path) -> Result<std::fs::File> {
    crate::support::files::append_private(path)
        .map_err(|e| Error::Config(format!("cannot open audit log {}: {e}", path.display())))
}

/// One log line, newline included.
pub fn format_line(format: Format, record: &Record<'_>) -> String {
    let ts = crate::domain::clock::now_rfc3339();
    match format {
        Format::Human => format!(
            "{ts} {:<5} {}: {}\n",
            record.level(),
            record.target(),
            escape_controls(&record.args().to_string())
        ),
        Format::Json => {
            let line = serde_json::json!({
                "ts": ts,
                "level": record.level().as_str(),
                "target": record.target(),
                "message": record.args().to_string(),
            });
            format!("{line}\n")
        }
    }
}

/// `message` with every control character escaped: `\n`, `\r` and `\t` as those two
/// characters, any other (C0, DEL, C1, and the Unicode line and paragraph separators that some
/// viewers break lines at) as `\u{..}`. A backslash is left alone: a message with a literal
/// `\n` in it still reads as one line, which is what matters, and doubling every backslash
/// would garble the many messages that quote Debug-formatted text.
fn escape_controls(message: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !message.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len() + 16);
    for c in message.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_one_object_each_with_the_target() {
        let args = format_args!("processed key=abc \"quoted\"\nsecond line");
        let record = Record::builder()
            .args(args)
            .level(log::Level::Info)
            .target(audit::LOG_TARGET)
            .build();
        let line = format_line(Format::Json, &record);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["target"], "claimgate::audit");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "processed key=abc \"quoted\"\nsecond line");
    }

    #[test]
    fn human_lines_stay_one_line_whatever_the_message_holds() {
        let forged = "processed award=A-1\n2026-07-01T09:00:00.000000Z INFO  claimgate::audit: processed award=FAKE\r\u{1b}[2K\t\u{7f}\u{85}\u{2028}end";
        let args = format_args!("{forged}");
        let record = Record::builder()
            .args(args)
            .level(log::Level::Info)
            .target(audit::LOG_TARGET)
            .build();
        let line = format_line(Format::Human, &record);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with('\n'));
        assert!(
            !line.trim_end_matches('\n').chars().any(|c| c.is_control()),
            "{line:?}"
        );
        assert!(
            line.ends_with(
                "processed award=A-1\\n2026-07-01T09:00:00.000000Z INFO  claimgate::audit: processed award=FAKE\\r\\u{1b}[2K\\t\\u{7f}\\u{85}\\u{2028}end\n"
            ),
            "{line}"
        );
        assert_eq!(escape_controls("plain \\n text"), "plain \\n text");
    }
}
