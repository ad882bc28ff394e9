//! The operator's tools, end to end: `demo`, `status`, `/metrics` and `/healthz`, log routing,
//! credentials in Redis URLs, the ledger's file mode. Real redis-servers, real processes.

use crate::support::RunWithDeadline;
use crate::support::{
    signal, status_refusing_the_certificate, submission, wait_exit, wait_for, Certificates, Store,
    World,
};
use claimgate::support::localredis::{free_port, Options};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_claimgate");

/// `GET path` over plain HTTP/1.0; returns the status code and body, or `None` if nobody answers.
pub(crate) fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((code, body))
}

/// The value of an unlabelled sample in Prometheus text.
pub(crate) fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(format!(
                    "{}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p).unwrap().next().is_none()
}

#[test]
fn demo_runs_from_an_empty_dir_pays_once_and_leaves_nothing_behind() {
    // Plan:
    // 1. A "Redis you already run" stands by, named in an inherited REDIS_URL, with a ledger
    //    path in CLAIMGATE_DB: the demo must touch neither (only --redis-url counts).
    // 2. Run the demo from an empty directory with its own TMPDIR.
    // 3. Check the summary, then that the cwd and TMPDIR are empty, no process mentions the
    //    demo's directory (no redis-server left behind), and the bystander Redis is untouched.
    let bystander = World::new();
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["demo", "--submissions", "600"])
        .current_dir(cwd.path())
        .env("TMPDIR", tmp.path())
        .env("REDIS_URL", bystander.redis.url())
        .env("CLAIMGATE_DB", &bystander.db)
        .env_remove("CLAIMGATE_FAILPOINT")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .run_with_deadline();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{stderr}",
        out.status
    );

    let line = |label: &str| -> String {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} line in\n{stdout}"))
            .to_owned()
    };
    let first_number = |l: String| -> u64 {
        l.split_whitespace()
            .find_map(|w| w.replace(',', "").parse().ok())
            .unwrap()
    };
    assert_eq!(
        first_number(line("processed")),
        601,
        "600 submissions + 1 corrected resubmission"
    );
    assert!(first_number(line("duplicates suppressed")) > 0, "{stdout}");
    assert_eq!(
        first_number(line("dead-lettered")),
        9,
        "one entry per malformed class"
    );
    assert_eq!(
        first_number(line("events published")),
        601,
        "the relay step ran"
    );
    assert_eq!(first_number(line("conflicts flagged")), 1);
    assert!(line("ledger verified").contains("yes"), "{stdout}");
    assert!(line("evidence:").contains("signed anchor"), "{stdout}");
    assert!(
        line("audit verify --anchors").contains("the anchor holds"),
        "the demo ends by verifying against its anchor:\n{stdout}"
    );
    assert!(
        stdout.contains("crashed"),
        "the worker crash must happen and be reported:\n{stdout}"
    );

    only_the_report(cwd.path(), &stdout);
    assert!(is_empty_dir(tmp.path()), "the demo left files in TMPDIR");
    let tmp_path = tmp.path().to_string_lossy().into_owned();
    assert_eq!(
        processes_mentioning(&tmp_path),
        Vec::<String>::new(),
        "processes left behind"
    );
    let keys: u64 = redis::cmd("DBSIZE").query(&mut bystander.conn()).unwrap();
    assert_eq!(
        keys, 0,
        "the demo wrote to a Redis it was not given with --redis-url"
    );
    assert!(
        !bystander.db.exists(),
        "the demo created the inherited CLAIMGATE_DB"
    );
}

#[test]
fn demo_without_redis_server_on_path_exits_2_with_the_install_command() {
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("demo")
        .env("PATH", empty.path())
        .current_dir(empty.path())
        .stdin(Stdio::null())
        .run_with_deadline();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("sudo apt-get install -y redis-server"),
        "{stderr}"
    );
    assert!(is_empty_dir(empty.path()));
}

on_both_ledgers!(
    metrics_counters_equal_the_ledger_and_healthz_follows_redis,
    dlq_reconcile_finds_every_lost_copy_among_many_through_the_ledgers_dead_letter_index,
);

fn metrics_counters_equal_the_ledger_and_healthz_follows_redis(store: Store) {
    // Plan:
    // 1. Queue 120 submissions, 6 byte-identical resends and 2 malformed entries.
    // 2. Run a worker with --metrics-addr; once it has drained the stream, scrape /metrics and
    //    compare each counter with SQL on the ledger.
    // 3. Kill Redis: /healthz turns 503. Restart it: /healthz is 200 again.
    let mut world = World::on(store);
    let payloads: Vec<String> = (0..120).map(submission).collect();
    world.add(&payloads);
    world.add(&payloads[..6]);
    world.add_fields(&[("payload", b"not json")]);
    world.add_fields(&[("other", b"{}")]);
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut worker = world.spawn(&["run", "--consumer", "m1", "--metrics-addr", &addr]);

    assert!(
        wait_for(Duration::from_secs(60), || world
            .count_once_made("processed_messages")
            == 120
            && world.count_once_made("dead_letters") == 2
            && world.pending() == 0),
        "worker did not drain the stream"
    );
    let (code, text) = http_get(&addr, "/metrics").expect("metrics endpoint answers");
    assert_eq!(code, 200, "{text}");
    let processed = sample(&text, "claimgate_submissions_processed_total").unwrap();
    let duplicates = sample(&text, "claimgate_duplicates_suppressed_total").unwrap();
    let dead = sample(&text, "claimgate_dead_lettered_total").unwrap();
    assert_eq!(processed as i64, world.count("processed_messages"));
    assert_eq!(
        duplicates as i64,
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'")
    );
    assert_eq!(dead as i64, world.count("dead_letters"));
    assert_eq!((processed, duplicates, dead), (120.0, 6.0, 2.0));
    assert_eq!(sample(&text, "claimgate_pending_entries"), Some(0.0));
    assert_eq!(
        sample(&text, "claimgate_outbox_backlog"),
        Some(world.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL") as f64)
    );
    assert!(
        sample(&text, "claimgate_commit_seconds_count").unwrap() >= 1.0,
        "{text}"
    );
    assert!(
        text.contains("# TYPE claimgate_commit_seconds histogram"),
        "{text}"
    );
    // Every acknowledged entry went through each stage once, and its stages add up.
    let acked = sample(&text, "claimgate_entries_acked_total").unwrap();
    assert_eq!(acked, 128.0, "{text}");
    let stage = |name: &str, what: &str| {
        sample(
            &text,
            &format!("claimgate_stage_seconds_{what}{{stage=\"{name}\"}}"),
        )
        .unwrap_or_else(|| panic!("no {what} for stage {name} in\n{text}"))
    };
    let parts: f64 = ["parse", "queue", "commit", "ack"]
        .iter()
        .map(|s| {
            assert_eq!(stage(s, "count"), acked, "{s}");
            stage(s, "sum")
        })
        .sum();
    assert_eq!(stage("total", "count"), acked);
    // Each part is recorded in whole microseconds, so they may fall short of the total by
    // under a microsecond per part and entry.
    let total = stage("total", "sum");
    assert!(
        parts <= total + 1e-9 && total - parts < 4.0 * acked * 1e-6,
        "stages {parts} s vs total {total} s"
    );

    assert_eq!(http_get(&addr, "/healthz").map(|r| r.0), Some(200));
    // The same answer as a gauge, for alerting without a probe.
    assert_eq!(sample(&text, "claimgate_healthy"), Some(1.0), "{text}");
    world.redis.kill();
    assert!(
        wait_for(
            Duration::from_secs(30),
            || matches!(http_get(&addr, "/healthz"), Some((503, b)) if b.contains("redis"))
        ),
        "healthz stayed healthy with Redis down"
    );
    let (_, text) = http_get(&addr, "/metrics").expect("metrics answer without Redis");
    assert_eq!(sample(&text, "claimgate_healthy"), Some(0.0), "{text}");
    world.redis.restart().unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || http_get(&addr, "/healthz")
            .map(|r| r.0)
            == Some(200)),
        "healthz did not recover after Redis came back"
    );

    signal(&worker, libc::SIGTERM);
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());
}

#[test]
fn status_json_agrees_with_sql_on_the_ledger() {
    // Plan: process 40 submissions (3 resent, 1 malformed), then queue 5 more and leave 2 of
    // them pending with consumer "stuck", so every figure is non-trivial; compare with SQL/Redis.
    let world = World::new();
    let payloads: Vec<String> = (0..40).map(submission).collect();
    world.add(&payloads);
    world.add(&payloads[..3]);
    world.add_fields(&[("payload", b"{\"award_id\":\"A\"}")]);
    world.drain(&[]);
    world.add(&(100..105).map(submission).collect::<Vec<_>>());
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("grant-workers")
        .arg("stuck")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg("grants:submissions")
        .arg(">")
        .query(&mut world.conn())
        .unwrap();

    let out = world.run_ok(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (l, r) = (&v["ledger"], &v["redis"]);
    assert_eq!(l["claims"], world.count("processed_messages"));
    assert_eq!(l["disbursements"], world.count("disbursements"));
    assert_eq!(
        l["disbursed_cents_total"],
        world.sql_i64("SELECT SUM(amount_cents) FROM disbursements")
    );
    assert_eq!(l["dead_letters"], world.count("dead_letters"));
    assert_eq!(
        l["duplicates_suppressed"],
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'")
    );
    assert_eq!(
        l["outbox_backlog"],
        world.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL")
    );
    assert_eq!(l["audit_records"], world.count("audit_log"));
    assert_eq!(
        (
            l["claims"].as_i64(),
            l["duplicates_suppressed"].as_i64(),
            l["dead_letters"].as_i64()
        ),
        (Some(40), Some(3), Some(1))
    );

    assert_eq!(r["length"], world.xlen("grants:submissions"));
    assert_eq!(r["dead_letters"], world.xlen("grants:submissions:dead"));
    assert_eq!(r["pending"], world.pending());
    assert_eq!(
        (r["pending"].as_u64(), r["lag"].as_u64()),
        (Some(2), Some(3))
    );
    let stuck = r["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "stuck")
        .expect("consumer listed");
    assert_eq!(stuck["pending"], 2);
    assert!(r["oldest_pending_age_s"].as_f64().is_some());

    let table = String::from_utf8(world.run_ok(&["status"]).stdout).unwrap();
    for needle in [
        "total disbursed",
        "consumer stuck",
        "pending 2",
        "oldest pending",
        "outbox backlog",
    ] {
        assert!(table.contains(needle), "no {needle:?} in\n{table}");
    }
}

#[test]
fn passwords_and_acl_users_work_and_are_never_shown() {
    // Plan:
    // 1. A Redis with requirepass, plus an ACL user with its own password.
    // 2. Drain through the ACL user with INFO logs in JSON and audit lines routed to a file.
    // 3. Run status (table and JSON), and status with a wrong password (exit 2).
    // 4. No output anywhere contains either password; JSON logs parse; audit lines are only in
    //    their file; the ledger and the audit file are private (0600).
    const ADMIN_PW: &str = "adm1n-pw-5f3a9c";
    const USER_PW: &str = "us3r-pw-c0ffee";
    const WRONG_PW: &str = "wr0ng-pw-bad1dea";
    let world = World::with(Options {
        password: Some(ADMIN_PW.into()),
        ..Options::default()
    });
    // The ACL user exactly as README.md documents it.
    let _: () = redis::cmd("ACL")
        .arg(crate::security::readme_acl_args(USER_PW))
        .query(&mut world.conn())
        .unwrap();
    let user_url = format!(
        "redis://claimgate:{USER_PW}@127.0.0.1:{}",
        world.redis.port()
    );
    world.add(&(0..30).map(submission).collect::<Vec<_>>());
    world.add(&[submission(0)]);
    world.add_fields(&[("payload", b"{oops")]);
    let audit_file = world.dir.path().join("audit.log");

    let drain = world
        .cmd(&[
            "run",
            "--exit-when-idle",
            "--log-format",
            "json",
            "--audit-log",
        ])
        .arg(&audit_file)
        .env("REDIS_URL", &user_url)
        .env("RUST_LOG", "info")
        .run_with_deadline();
    let drain_err = String::from_utf8_lossy(&drain.stderr).into_owned();
    assert!(drain.status.success(), "{drain_err}");
    assert_eq!(world.count("processed_messages"), 30);
    assert!(!drain_err.is_empty(), "INFO logs expected on stderr");
    for line in drain_err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_ne!(
            v["target"], "claimgate::audit",
            "audit line on stderr: {line}"
        );
    }
    let audit = std::fs::read_to_string(&audit_file).unwrap();
    assert_eq!(
        audit.lines().count(),
        32,
        "one audit line per processed, duplicate or dead-lettered entry:\n{audit}"
    );
    assert_eq!(world.count("dead_letters"), 1);
    assert!(audit.lines().all(
        |l| serde_json::from_str::<serde_json::Value>(l).unwrap()["target"] == "claimgate::audit"
    ));

    let table = world
        .cmd(&["status"])
        .env("REDIS_URL", &user_url)
        .run_with_deadline();
    let json = world.run_ok(&["status", "--json"]);
    let wrong_url = format!(
        "redis://claimgate:{WRONG_PW}@127.0.0.1:{}",
        world.redis.port()
    );
    let wrong = world
        .cmd(&["status", "--json"])
        .env("REDIS_URL", &wrong_url)
        .run_with_deadline();
    assert!(table.status.success());
    // A refused password is configuration: exit 2, one line naming the URL form (issue 39).
    let wrong_err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(2), "{wrong_err}");
    assert!(
        wrong_err.contains("refused the user or password --redis-url gives it"),
        "a wrong password must show as an error: {wrong_err}"
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&json.stdout).unwrap()["redis"]["length"],
        32
    );

    let everything = [
        &drain.stdout,
        &drain.stderr,
        &table.stdout,
        &table.stderr,
        &json.stdout,
        &json.stderr,
        &wrong.stdout,
        &wrong.stderr,
    ]
    .iter()
    .map(|b| String::from_utf8_lossy(b).into_owned())
    .collect::<Vec<_>>()
    .join("\n")
        + &audit;
    for pw in [ADMIN_PW, USER_PW, WRONG_PW] {
        assert!(
            !everything.contains(pw),
            "password {pw} leaked:\n{everything}"
        );
    }
    assert!(String::from_utf8_lossy(&table.stdout).contains("redis://claimgate:***@127.0.0.1"));

    use std::os::unix::fs::PermissionsExt;
    for f in [&world.db, &audit_file] {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", f.display());
    }
}

/// A TLS-only redis-server, killed on drop (`LocalRedis` speaks plain TCP only).
struct TlsRedis {
    /// The server process.
    child: std::process::Child,
    /// Its port.
    port: u16,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn rediss_urls_are_verified_against_trusted_certificates() {
    // Plan:
    // 1. A self-signed certificate for 127.0.0.1; a redis-server that only speaks TLS, with a
    //    password.
    // 2. With the certificate trusted (SSL_CERT_FILE), produce and drain over rediss://.
    // 3. Without it trusted, status reports Redis unreachable (the certificate is refused).
    let dir = tempfile::tempdir().unwrap();
    let Certificates {
        cert,
        key,
        stranger,
    } = Certificates::write_in(dir.path());
    let port = free_port().unwrap();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&cert)
        .args(["--tls-auth-clients", "no", "--requirepass", "tls-pw-77aa"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let server = TlsRedis { child, port };
    let url = format!("rediss://:tls-pw-77aa@127.0.0.1:{}", server.port);
    let db = dir.path().join("ledger.db");
    let claimgate = |args: &[&str], trusted: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("REDIS_URL", &url)
            .env("CLAIMGATE_DB", &db)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        if trusted {
            cmd.env("SSL_CERT_FILE", &cert);
        } else {
            cmd.env("SSL_CERT_FILE", &stranger);
        }
        cmd
    };
    // From a file, each try within a deadline: a produce that hangs fails the test.
    let two = dir.path().join("two.jsonl");
    std::fs::write(&two, format!("{}\n{}\n", submission(1), submission(2))).unwrap();
    let ready = wait_for(Duration::from_secs(10), || {
        claimgate(&["produce", two.to_str().unwrap()], true)
            .run_within(Duration::from_secs(10))
            .status
            .success()
    });
    assert!(ready, "could not queue over rediss://");
    let drained = claimgate(&["run", "--exit-when-idle"], true).run_with_deadline();
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    let ledger = rusqlite::Connection::open(&db).unwrap();
    let paid: i64 = ledger
        .query_row("SELECT COUNT(*) FROM disbursements", [], |r| r.get(0))
        .unwrap();
    assert_eq!(paid, 2);

    let untrusted = claimgate(&["status", "--json"], false).run_with_deadline();
    let doc = status_refusing_the_certificate(&untrusted);
    assert_eq!(
        doc["redis"]["url"],
        format!("rediss://:***@127.0.0.1:{port}")
    );
}

#[test]
fn backup_copies_the_ledger_consistently_and_privately() {
    let world = World::new();
    world.add(&(0..25).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    let out = world.dir.path().join("ledger-backup.db");
    let done = world.run_ok(&["backup", out.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&done.stdout).contains("25 claims"));
    let copy = rusqlite::Connection::open(&out).unwrap();
    let (claims, cents): (i64, i64) = copy
        .query_row("SELECT COUNT(*), (SELECT SUM(amount_cents) FROM disbursements) FROM processed_messages", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(
        (claims, cents),
        (
            25,
            world.sql_i64("SELECT SUM(amount_cents) FROM disbursements")
        )
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let again = world.run(&["backup", out.to_str().unwrap()]);
    assert_eq!(
        again.status.code(),
        Some(2),
        "an existing backup must not be overwritten"
    );
}

#[test]
fn demo_with_an_explicit_redis_url_uses_only_its_own_keys_and_removes_them() {
    let world = World::with(Options {
        password: Some("demo-pw-31337".into()),
        ..Options::default()
    });
    let _: () = redis::cmd("SET")
        .arg("operator:key")
        .arg("keep me")
        .query(&mut world.conn())
        .unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "demo",
            "--submissions",
            "200",
            "--redis-url",
            &world.redis.url(),
        ])
        .current_dir(cwd.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .run_with_deadline();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ledger verified        yes"), "{stdout}");
    assert!(
        !stdout.contains("demo-pw-31337") && stdout.contains(":***@127.0.0.1"),
        "{stdout}"
    );
    only_the_report(cwd.path(), &stdout);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut world.conn())
        .unwrap();
    assert_eq!(
        keys,
        vec!["operator:key".to_owned()],
        "only the operator's own key may remain"
    );
}

/// The demo's cwd holds one file, the report it printed the path of: 0600, verified, and
/// never naming the Redis password.
fn only_the_report(cwd: &Path, stdout: &str) {
    use std::os::unix::fs::PermissionsExt;
    let files: Vec<PathBuf> = std::fs::read_dir(cwd)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "the demo leaves its report and nothing else: {files:?}"
    );
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("claimgate-demo-report-") && name.ends_with(".html"),
        "{name}"
    );
    assert!(
        stdout.contains(&format!("audit report (open it in a browser): {name}")),
        "the demo ends by printing the report's path:\n{stdout}"
    );
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let html = std::fs::read_to_string(&files[0]).unwrap();
    assert!(html.contains(r#"data-figure="verdict" data-value="verified""#));
    assert!(!html.contains("demo-pw-31337"));
}

#[test]
fn workers_starting_together_on_a_new_ledger_all_open_it() {
    // Several processes converting one brand-new ledger to WAL at once: SQLite fails the losers
    // with SQLITE_BUSY immediately (no busy wait); every one must still start and exit 0.
    let world = World::new();
    world.add(&(0..20).map(submission).collect::<Vec<_>>());
    let mut workers: Vec<_> = (0..8)
        .map(|i| world.spawn(&["run", "--exit-when-idle", "--consumer", &format!("w{i}")]))
        .collect();
    for w in &mut workers {
        let status = wait_exit(w, Duration::from_secs(60));
        assert!(status.success(), "{status}: {}", w.log_text());
    }
    assert_eq!(world.count("disbursements"), 20);
}

#[test]
fn commands_other_than_run_and_relay_never_create_a_ledger() {
    // A typo in --db must not conjure an empty ledger that makes a hold or a status look real:
    // every read-or-annotate command on a missing path exits 2 naming it, and creates nothing.
    let world = World::new();
    let typo = world.dir.path().join("claimgate-typo.db");
    let typo_arg = typo.to_str().unwrap();
    for args in [
        vec!["hold", "add", "A-1", "--reason", "audit 2026-17"],
        vec!["hold", "list"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["verify"],
        vec!["audit", "export"],
        vec!["audit", "verify"],
        vec!["retention", "purge", "--before", "2020-01-01"],
    ] {
        let mut all = args.clone();
        all.extend(["--db", typo_arg]);
        let out = world.run(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(typo_arg),
            "{args:?} must name the path: {stderr}"
        );
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
}

#[test]
fn audit_export_writes_a_new_private_file_and_never_overwrites_one() {
    // 1. A ledger with records; `audit export --out` writes a 0600 file whose lines verify.
    // 2. A second export to the same path is refused (exit 2) and the first file is unchanged.
    use std::os::unix::fs::PermissionsExt;
    let world = World::new();
    world.add(&(0..5).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    let out = world.dir.path().join("export.jsonl");
    let out_arg = out.to_str().unwrap();
    world.run_ok(&["audit", "export", "--out", out_arg]);
    let first = std::fs::read(&out).unwrap();
    assert_eq!(first.iter().filter(|b| **b == b'\n').count(), 5);
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "export mode {mode:o}");
    world.run_ok(&["audit", "verify", "--file", out_arg]);

    let again = world.run(&["audit", "export", "--out", out_arg]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwritten"));
    assert_eq!(std::fs::read(&out).unwrap(), first);
}

/// A SQLite-only setting asked of a PostgreSQL ledger is refused before anything connects
/// (exit 2 naming the setting, no password shown), never silently ignored; the defaults pass.
#[test]
fn sqlite_only_settings_on_a_postgresql_ledger_are_exit_2_naming_them() {
    let world = World::new();
    // Nothing listens on port 1: a refusal that came from connecting would not be exit 2.
    let url = "postgresql://claimgate:pg-s3cret@127.0.0.1:1/ledger";
    for (args, env, named) in [
        (
            &["run", "--exit-when-idle", "--ledger-pages-max", "1000"][..],
            None,
            "--ledger-pages-max",
        ),
        (
            &["run", "--exit-when-idle"][..],
            Some(("CLAIMGATE_SYNCHRONOUS", "normal")),
            "--synchronous",
        ),
    ] {
        let mut cmd = world.cmd(args);
        cmd.env("CLAIMGATE_DB", url);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.run_with_deadline();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named) && stderr.contains("SQLite ledger only"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("pg-s3cret"), "{stderr}");
    }
}

/// The refusal comes where `--db` and the flags are read, before `run` makes anything: the
/// anchors file it was told to append to is not created, and nothing appears in its working
/// directory (a URL taken for a path would have become a file there).
#[test]
fn a_sqlite_only_setting_with_a_url_is_refused_before_run_makes_anything() {
    let world = World::new();
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(world.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    let anchors = world.dir.path().join("anchors.jsonl");
    let url = "postgres://claimgate:pg-s3cret@127.0.0.1:1/ledger";
    let mut cmd = world.cmd(&[
        "run",
        "--exit-when-idle",
        "--synchronous",
        "normal",
        "--anchor-every",
        "1s",
        "--anchor-out",
        anchors.to_str().unwrap(),
    ]);
    cmd.env("CLAIMGATE_DB", url).current_dir(world.dir.path());
    let out = cmd.run_with_deadline();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--synchronous") && stderr.contains("SQLite ledger only"),
        "{stderr}"
    );
    assert!(!stderr.contains("pg-s3cret"), "{stderr}");
    assert!(
        !anchors.exists(),
        "the anchors file was made before the refusal"
    );
    assert_eq!(listing(), before);
}

/// `dlq reconcile` reads the dead-letter records through the ledger's partial index and asks
/// Redis about them in batches (`src/ops/reconcile.rs`): with 600 dead letters among 800
/// entries (three lookups, the last one partial) and every seventh copy lost, exactly the lost
/// ones come back, each once; a second run copies nothing.
fn dlq_reconcile_finds_every_lost_copy_among_many_through_the_ledgers_dead_letter_index(
    store: Store,
) {
    let world = World::on(store);
    let bad = world.add(
        &(0..600)
            .map(|i| format!("not json {i}"))
            .collect::<Vec<_>>(),
    );
    world.add(&(0..200).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    assert_eq!(world.dead_letters().len(), 600);
    assert_eq!(
        world.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'dead_letter'"),
        600
    );

    // Lose every seventh copy, as a lossy promotion would: its index field and the copy.
    let (dead, index) = ("grants:submissions:dead", "grants:submissions:dead:index");
    let mut conn = world.conn();
    let lost: Vec<&String> = bad.iter().step_by(7).collect();
    for id in &lost {
        let copy: String = redis::cmd("HGET")
            .arg(index)
            .arg(*id)
            .query(&mut conn)
            .unwrap();
        let gone: (i64, i64) = redis::pipe()
            .cmd("XDEL")
            .arg(dead)
            .arg(&copy)
            .cmd("HDEL")
            .arg(index)
            .arg(*id)
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            gone,
            (1, 1),
            "copy {copy} of {id} and its index field removed"
        );
    }
    assert_eq!(world.dead_letters().len(), 600 - lost.len());

    let out = world.run_ok(&["dlq", "reconcile"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "600 dead letters recorded in the ledger; {} were missing",
            lost.len()
        )),
        "{stdout}"
    );
    let letters = world.dead_letters();
    assert_eq!(letters.len(), 600, "one copy per dead letter, no more");
    let originals: std::collections::HashSet<Vec<u8>> =
        letters.iter().map(|f| f["original_id"].clone()).collect();
    assert_eq!(originals.len(), 600);
    let recopied: std::collections::HashSet<Vec<u8>> = letters
        .iter()
        .filter(|f| f["reason_code"] == b"reconciled")
        .map(|f| f["original_id"].clone())
        .collect();
    let lost: std::collections::HashSet<Vec<u8>> =
        lost.iter().map(|id| id.as_bytes().to_vec()).collect();
    assert_eq!(recopied, lost, "exactly the lost copies, recopied");
    let again = world.run_ok(&["dlq", "reconcile"]);
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .contains("600 dead letters recorded in the ledger; 0 were missing"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    assert_eq!(world.dead_letters().len(), 600);

    // The records come from the partial index, which holds the dead letters and nothing else.
    match store {
        Store::Sqlite => {
            let db = rusqlite::Connection::open(&world.db).unwrap();
            let plan: Vec<String> = db
                .prepare(&format!(
                    "EXPLAIN QUERY PLAN {}",
                    claimgate::ledger::sqlite::audit_store::DEAD_LETTER_RECORDS
                ))
                .unwrap()
                .query_map([], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                plan.iter()
                    .any(|p| p.contains("USING INDEX audit_dead_letters")),
                "{plan:?}"
            );
            let indexed: i64 = db
                .query_row(
                    "SELECT COUNT(*) FROM audit_log INDEXED BY audit_dead_letters
                     WHERE kind = 'dead_letter'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(indexed, 600);
        }
        Store::Postgres => {
            let mut db =
                postgres::Client::connect(world.db.to_str().unwrap(), postgres::NoTls).unwrap();
            let def: String = db
                .query_one(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'audit_dead_letters'",
                    &[],
                )
                .unwrap()
                .get(0);
            assert!(
                def.contains("(seq)") && def.contains("WHERE (kind = 'dead_letter'::text)"),
                "{def}"
            );
        }
    }
}

#[test]
fn status_prints_what_it_can_and_fails_naming_the_redis_it_could_not_reach() {
    // A cron job's check: the ledger's counts are printed, then exit 1 with one line naming
    // the URL tried (password hidden). Before, status exited 0 with Redis down.
    let w = World::new();
    w.add(&[crate::support::submission(1)]);
    w.drain(&[]);
    let port = claimgate::support::localredis::free_port().unwrap();
    let url = format!("redis://:S3cret@127.0.0.1:{port}");
    for args in [&["status"][..], &["status", "--json"]] {
        let out = w.cmd(args).env("REDIS_URL", &url).run_with_deadline();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
        assert!(
            stdout.contains("claims"),
            "the ledger's side is shown: {stdout}"
        );
        assert!(
            stderr.contains(&format!(
                "Redis at redis://:***@127.0.0.1:{port} could not be reached"
            )) && !stderr.contains("S3cret")
                && !stdout.contains("S3cret"),
            "{stderr}"
        );
    }
}

#[test]
fn replaying_a_dead_letter_still_malformed_as_it_stands_is_refused_with_the_reason() {
    // A dead letter that is not JSON, replayed unchanged, would only be dead-lettered again:
    // `dlq replay` says so (exit 1, naming why) and changes nothing; --anyway replays it.
    let w = World::new();
    w.add_fields(&[("payload", b"{not json")]);
    w.drain(&[]);
    let dead: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("grants:submissions:dead")
        .arg("-")
        .arg("+")
        .query(&mut w.conn())
        .unwrap();
    let id = dead.ids[0].id.clone();
    let refused = w.run(&["dlq", "replay", &id]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("is still malformed as it stands (payload is not JSON"),
        "{said}"
    );
    assert_eq!(w.xlen("grants:submissions"), 1, "nothing put back");
    w.run_ok(&["dlq", "replay", &id, "--anyway"]);
    assert_eq!(w.xlen("grants:submissions"), 2, "put back when asked");
}
