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
use crate::support::escape;
use log::{Log, Metadata, Record};
use std::cell::RefCell;
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
    /// The audit file, when `--audit-log` is set, and the path it was opened by: SIGHUP
    /// ([`reopen`]) opens that path again, so a log rotated away is let go.
    audit: Option<(Mutex<std::fs::File>, PathBuf)>,
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
        let to_file = self.audit.is_some() && record.target() == audit::LOG_TARGET;
        let wanted = if to_file {
            record.level() <= log::Level::Info
        } else {
            self.main.matches(record)
        };
        if !wanted {
            return;
        }
        if HELD.with_borrow(Option::is_some) {
            // Formatted before the borrow: a message's Display that logged would find it taken.
            let line = format_line(self.format, record);
            let full = HELD.with_borrow_mut(|held| {
                let held = held.as_mut()?;
                let lines = if to_file {
                    &mut held.audit
                } else {
                    &mut held.stderr
                };
                lines.extend_from_slice(line.as_bytes());
                (lines.len() >= HELD_BYTES_MAX).then(|| std::mem::take(lines))
            });
            if let Some(lines) = full {
                self.write(to_file, &lines);
            }
            return;
        }
        if to_file {
            self.write(true, format_line(self.format, record).as_bytes());
        } else {
            self.main.log(record);
        }
    }

    fn flush(&self) {
        self.main.flush();
        if let Some((file, _)) = &self.audit {
            let _ = file.lock().unwrap_or_else(|p| p.into_inner()).flush();
        }
    }
}

impl Router {
    /// Writes whole lines to the audit file (`to_file`) or to stderr, in one write.
    fn write(&self, to_file: bool, lines: &[u8]) {
        if !to_file {
            // As env_logger does: a line that cannot be written to stderr is dropped.
            let _ = std::io::stderr().lock().write_all(lines);
            return;
        }
        if let Some((file, _)) = &self.audit {
            let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
            // A failed audit-log write must not stop payments; the ledger's audit table is
            // the record of truth and this file only mirrors it.
            let _ = file.write_all(lines);
        }
    }
}

/// Held lines for one destination are written as soon as they reach this many bytes, so a
/// batch of hostile entries (an `award_id` of a megabyte of control characters escapes to
/// several) cannot make the held lines grow with the batch; a busy stream's lines still go out
/// a few thousand at a time.
const HELD_BYTES_MAX: usize = 256 * 1024;

/// Lines logged on this thread inside [`in_one_write`], not yet written.
#[derive(Default)]
struct Held {
    /// For stderr.
    stderr: Vec<u8>,
    /// For the audit file (`--audit-log`).
    audit: Vec<u8>,
}

thread_local! {
    /// This thread's held lines while it is inside [`in_one_write`].
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Runs `f` holding the lines this thread logs, then writes them: all of stderr's in one
/// write, all of the audit file's in another.
///
/// Why: the worker logs one audit line per entry, and a write per line was a system call per
/// entry, most of the reporter's time on a busy stream (see BENCHMARKS.md). Each line keeps the
/// time it was logged at and stays whole; lines from other threads come before or after the
/// held ones, never inside one. Lines past [`HELD_BYTES_MAX`] are written early, in order. The
/// lines are written however `f` ends, panic included, and a call inside another holds nothing
/// of its own. With another logger installed (a test's),
/// this only runs `f`.
pub fn in_one_write<R>(f: impl FnOnce() -> R) -> R {
    if HELD.with_borrow(Option::is_some) {
        return f();
    }
    /// Writes the held lines when dropped, so a panic in `f` loses none of them.
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            let Some(held) = HELD.with_borrow_mut(Option::take) else {
                return;
            };
            let Some(router) = ROUTER.get() else {
                return;
            };
            if !held.stderr.is_empty() {
                router.write(false, &held.stderr);
            }
            if !held.audit.is_empty() {
                router.write(true, &held.audit);
            }
        }
    }
    if ROUTER.get().is_none() {
        return f();
    }
    HELD.with_borrow_mut(|held| *held = Some(Held::default()));
    let _release = Release;
    f()
}

/// The installed router, for [`in_one_write`] to reach the audit file.
static ROUTER: std::sync::OnceLock<&'static Router> = std::sync::OnceLock::new();

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
            Some((Mutex::new(open_private_append(path)?), path.clone()))
        }
    };
    let router: &'static Router = Box::leak(Box::new(Router {
        main,
        audit,
        format,
    }));
    log::set_logger(router).map_err(|e| Error::Other(format!("installing the logger: {e}")))?;
    let _ = ROUTER.set(router);
    log::set_max_level(max_level);
    Ok(())
}

/// Opens the `--audit-log` file again by its path and writes every later audit line there:
/// what SIGHUP does, after logrotate (or an operator) renamed the file away. The swap happens
/// under the lock every write takes, so each line goes whole to the old file or to the new one,
/// never to both and never lost. Returns the path reopened, `None` without `--audit-log`. On an
/// error (the path now names something that is not an audit log, a full disk) the old file
/// stays in use and the error is returned for the caller to log.
pub fn reopen() -> Result<Option<PathBuf>> {
    let Some((file, path)) = ROUTER.get().and_then(|r| r.audit.as_ref()) else {
        return Ok(None);
    };
    let fresh = open_private_append(path)?;
    let mut current = file.lock().unwrap_or_else(|p| p.into_inner());
    let _ = current.flush();
    *current = fresh;
    Ok(Some(path.clone()))
}

fn open_private_append(path: &std::path::Path) -> Result<std::fs::File> {
    crate::support::files::append_private(path, is_log_line)
        .map_err(|e| Error::Config(format!("cannot open audit log {}: {e}", path.display())))
}

/// Whether `line` is one `--audit-log` holds: a human line, which starts with its time, or a
/// JSON line. What an existing audit log must start with before anything is appended to it.
fn is_log_line(line: &str) -> bool {
    let time = line.split(' ').next().unwrap_or_default();
    crate::domain::clock::instant_utc(time).is_ok()
        || serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object())
}

/// One log line, newline included.
pub fn format_line(format: Format, record: &Record<'_>) -> String {
    let ts = crate::domain::clock::now_rfc3339();
    match format {
        Format::Human => format!(
            "{ts} {:<5} {}: {}\n",
            record.level(),
            record.target(),
            escape::controls(&record.args().to_string())
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

    /// The only test that installs the process-wide logger (it can be installed once): audit
    /// lines to a file, so what is written, and when, can be read back. Other tests' lines may
    /// land in the file too; only this test's own markers are counted.
    #[test]
    fn held_lines_are_written_together_at_the_end_even_after_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("audit.log");
        init(&Options {
            format: Format::Human,
            audit_log: Some(file.clone()),
        })
        .unwrap();
        let mine = |marker: &str| -> Vec<String> {
            std::fs::read_to_string(&file)
                .unwrap()
                .lines()
                .filter(|l| l.contains(marker))
                .map(|l| l.split_once(": ").unwrap().1.to_owned())
                .collect()
        };

        log::info!(target: audit::LOG_TARGET, "held-test alone");
        assert_eq!(mine("held-test"), ["held-test alone"], "written at once");

        let inner = in_one_write(|| {
            log::info!(target: audit::LOG_TARGET, "held-test first");
            in_one_write(|| log::info!(target: audit::LOG_TARGET, "held-test nested"));
            log::info!(target: audit::LOG_TARGET, "held-test last");
            mine("held-test")
        });
        assert_eq!(inner, ["held-test alone"], "nothing written inside");
        assert_eq!(
            mine("held-test"),
            [
                "held-test alone",
                "held-test first",
                "held-test nested",
                "held-test last"
            ]
        );

        let big = "x".repeat(HELD_BYTES_MAX);
        let seen_inside = in_one_write(|| {
            log::info!(target: audit::LOG_TARGET, "held-big small");
            log::info!(target: audit::LOG_TARGET, "held-big {big}");
            let written = mine("held-big").len();
            log::info!(target: audit::LOG_TARGET, "held-big after");
            (written, mine("held-big").len())
        });
        assert_eq!(
            seen_inside,
            (2, 2),
            "written once the held lines passed the bound"
        );
        assert_eq!(mine("held-big").len(), 3);

        let panicked = std::panic::catch_unwind(|| {
            in_one_write(|| {
                log::info!(target: audit::LOG_TARGET, "held-panic before");
                panic!("in the middle of a batch");
            })
        });
        assert!(panicked.is_err());
        assert_eq!(mine("held-panic"), ["held-panic before"]);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&file).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
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
    }
}
