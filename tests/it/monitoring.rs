//! Monitoring you can import: the Prometheus rules and the Grafana dashboard use only metrics a
//! live worker serves, and the rules pass `promtool check rules`; `status --watch` in a real
//! terminal (tmux) and as JSON lines.

use crate::ops::{http_get, sample};
use crate::support::{signal, submission, wait_exit, wait_for, World};
use claimgate::support::localredis::free_port;
use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_claimgate");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every `claimgate_…` sample name in `text` (comment lines of a YAML file left out by the
/// caller): a name is `claimgate_` and at least one more letter, digit or underscore.
fn names_used(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("claimgate_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if len > "claimgate_".len() {
            names.insert(tail[..len].to_owned());
        }
        rest = &tail[len.max(1)..];
    }
    names
}

/// The PromQL of the dashboard: every target's `expr` and every variable's query.
fn dashboard_queries(json: &serde_json::Value) -> String {
    let mut out = String::new();
    fn walk(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if let ("expr" | "definition", serde_json::Value::String(s)) = (k.as_str(), v) {
                        out.push_str(s);
                        out.push('\n');
                    }
                    walk(v, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(json, &mut out);
    out
}

#[test]
fn every_metric_the_rules_and_dashboard_use_is_served_by_a_live_worker() {
    // Plan: 1. a worker with --metrics-addr drains 30 submissions (3 resent, 1 malformed), so
    // the group, lag, pending and commit histogram all exist; 2. scrape /metrics; 3. every
    // claimgate_* name in the rules' expressions and the dashboard's queries is a sample name
    // in the scrape.
    let world = World::new();
    let payloads: Vec<String> = (0..30).map(submission).collect();
    world.add(&payloads);
    world.add(&payloads[..3]);
    world.add_fields(&[("payload", b"not json")]);
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut worker = world.spawn(&["run", "--relay", "--metrics-addr", &addr]);
    assert!(
        wait_for(Duration::from_secs(60), || world
            .count_once_made("processed_messages")
            == 30
            && world.count_once_made("dead_letters") == 1
            && world.pending() == 0),
        "worker did not drain the stream"
    );
    let (code, scrape) = http_get(&addr, "/metrics").expect("metrics endpoint answers");
    assert_eq!(code, 200, "{scrape}");
    assert_eq!(sample(&scrape, "claimgate_healthy"), Some(1.0), "{scrape}");
    signal(&worker, libc::SIGTERM);
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());

    let served: BTreeSet<String> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    let rules: String = read("examples/prometheus/claimgate.rules.yml")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("examples/grafana/claimgate.json")).expect("dashboard is JSON");
    for (file, used) in [
        ("claimgate.rules.yml", names_used(&rules)),
        ("claimgate.json", names_used(&dashboard_queries(&dashboard))),
    ] {
        assert!(used.len() >= 6, "{file} uses only {used:?}");
        let missing: Vec<_> = used.difference(&served).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics /metrics does not serve: {missing:?}\nserved: {served:?}"
        );
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prometheus/claimgate.rules.yml");
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool could not run ({e}); install it: apt-get install prometheus")
        });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check rules failed:\n{text}");
    assert!(text.contains("SUCCESS: 10 rules found"), "{text}");
}

/// A private tmux server (its own socket), killed on drop.
struct Tmux {
    /// The `-L` socket name.
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!("tmux could not run ({e}); install it: apt-get install tmux")
            })
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "w"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// The number after `total` on the screen's `processed` line.
fn processed_total(screen: &str) -> Option<u64> {
    let line = screen
        .lines()
        .find(|l| l.trim_start().starts_with("processed"))?;
    line.split("total").nth(1)?.trim().parse().ok()
}

#[test]
fn status_watch_redraws_changing_figures_in_a_terminal_and_exits_0_on_ctrl_c() {
    // Plan: 1. a worker with --metrics-addr runs; 2. `status --watch 1` runs in a tmux
    // terminal; 3. submissions arrive in three waves: the screen's processed total changes
    // each time, a rate above zero and a commit p99 in ms appear, and the screen holds one
    // frame (redrawn in place, not scrolled); 4. Ctrl-C (sent as a key, so the terminal
    // delivers SIGINT) ends it with exit 0.
    let world = World::new();
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut worker = world.spawn(&["run", "--metrics-addr", &addr]);
    assert!(wait_for(Duration::from_secs(30), || http_get(
        &addr, "/healthz"
    )
    .is_some_and(|r| r.0 == 200)));
    let tmux = Tmux {
        socket: format!("claimgate-test-{}", free_port().unwrap()),
    };
    let shell = format!(
        "env REDIS_URL='{}' CLAIMGATE_DB='{}' '{BIN}' status --watch 1 --metrics-url http://{addr}/metrics; \
         echo \"watch exited $?\"; sleep 600",
        world.redis.url(),
        world.db.display()
    );
    let out = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "w",
        "-x",
        "120",
        "-y",
        "50",
        &shell,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        wait_for(Duration::from_secs(30), || processed_total(&tmux.screen())
            == Some(0)),
        "no first frame:\n{}",
        tmux.screen()
    );
    let mut totals = vec![0];
    let mut saw_rate = false;
    let mut saw_p99 = false;
    for wave in 1..=3usize {
        world.add(
            &(wave * 100..wave * 100 + 40)
                .map(submission)
                .collect::<Vec<_>>(),
        );
        assert!(
            wait_for(Duration::from_secs(30), || {
                let screen = tmux.screen();
                saw_rate |= screen.lines().any(|l| {
                    l.trim_start().starts_with("processed")
                        && !l.contains(" 0.0/s")
                        && l.contains("/s")
                });
                saw_p99 |= screen
                    .lines()
                    .any(|l| l.trim_start().starts_with("commit p99") && l.contains(" ms"));
                processed_total(&screen) == Some(wave as u64 * 40)
            }),
            "wave {wave} never showed:\n{}",
            tmux.screen()
        );
        totals.push(processed_total(&tmux.screen()).unwrap());
    }
    assert_eq!(totals, vec![0, 40, 80, 120]);
    assert!(saw_rate, "never a non-zero rate:\n{}", tmux.screen());
    assert!(saw_p99, "never a commit p99:\n{}", tmux.screen());
    let screen = tmux.screen();
    assert_eq!(
        screen.matches("claimgate status --watch:").count(),
        1,
        "{screen}"
    );

    tmux.cmd(&["send-keys", "-t", "w", "C-c"]);
    assert!(
        wait_for(Duration::from_secs(10), || tmux
            .screen()
            .contains("watch exited")),
        "still watching after Ctrl-C:\n{}",
        tmux.screen()
    );
    assert!(
        tmux.screen().contains("watch exited 0"),
        "{}",
        tmux.screen()
    );
    signal(&worker, libc::SIGTERM);
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());
}

#[test]
fn status_watch_json_prints_one_line_per_interval_with_rates_and_exits_0_on_sigint() {
    // Plan: a drained ledger of 20; `status --watch 0.2 --json` with no metrics URL prints
    // compact JSON lines: the first has null rates, later ones a rates object, each the
    // ledger's counts and a note on why there is no commit p99; SIGINT ends it with exit 0.
    let world = World::new();
    world.add(&(0..20).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    let mut watch = world
        .cmd(&["status", "--watch", "0.2", "--json"])
        .env_remove("CLAIMGATE_METRICS_ADDR")
        .env_remove("CLAIMGATE_METRICS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let docs: Vec<serde_json::Value> = (0..3)
        .map(|_| serde_json::from_str(&lines.next().unwrap().unwrap()).expect("a JSON line"))
        .collect();
    signal(&watch, libc::SIGINT);
    let status = wait_exit(&mut watch, Duration::from_secs(10));
    assert!(status.success(), "{status}");
    assert!(docs[0]["rates"].is_null(), "{}", docs[0]);
    for doc in &docs {
        assert_eq!(doc["ledger"]["claims"], 20, "{doc}");
        assert_eq!(doc["redis"]["pending"], 0, "{doc}");
        assert!(
            doc["ts"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{doc}"
        );
        assert!(doc["commit_p99_s"].is_null(), "{doc}");
        assert!(
            doc["commit_p99_note"]
                .as_str()
                .unwrap()
                .contains("--metrics-url"),
            "{doc}"
        );
    }
    for doc in &docs[1..] {
        assert_eq!(doc["rates"]["processed_per_s"], 0.0, "{doc}");
        assert!(doc["rates"]["interval_s"].as_f64().unwrap() > 0.1, "{doc}");
    }
}

#[test]
fn status_watch_refuses_an_interval_it_cannot_keep() {
    let world = World::new();
    for bad in ["0", "0.01", "soon", "99999"] {
        let out = world.run(&["status", "--watch", bad]);
        assert_eq!(out.status.code(), Some(2), "--watch {bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--watch"),
            "--watch {bad}"
        );
    }
}

#[test]
fn status_watch_exits_0_when_its_reader_goes_away() {
    // `claimgate status --watch --json | head -1`: the closed pipe ends the watch cleanly,
    // not with an error or a hang.
    let world = World::new();
    world.add(&[submission(1)]);
    world.drain(&[]);
    let mut watch = world
        .cmd(&["status", "--watch", "0.1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["ledger"]["claims"], 1);
    drop(lines);
    let status = wait_exit(&mut watch, Duration::from_secs(10));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn status_watch_started_before_the_worker_waits_for_the_ledger_it_makes() {
    // `status --watch --json` on a path with no ledger yet: one line says it waits (before, it
    // exited at once); a worker then makes the ledger and drains 5; the watch shows them, and
    // SIGINT ends it with exit 0.
    let world = World::new();
    let mut watch = world
        .cmd(&["status", "--watch", "0.2", "--json"])
        .env_remove("CLAIMGATE_METRICS_ADDR")
        .env_remove("CLAIMGATE_METRICS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut errors = std::io::BufReader::new(watch.stderr.take().unwrap()).lines();
    let said = errors.next().unwrap().unwrap();
    assert!(
        said.contains("no ledger at") && said.contains("waiting for it to be made"),
        "{said}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(watch.try_wait().unwrap().is_none(), "the watch waits");
    world.add(&(0..5).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let shown = (0..50).any(|_| {
        let doc: serde_json::Value =
            serde_json::from_str(&lines.next().unwrap().unwrap()).expect("a JSON line");
        doc["ledger"]["claims"] == 5
    });
    signal(&watch, libc::SIGINT);
    let status = wait_exit(&mut watch, Duration::from_secs(10));
    assert!(shown, "the watch showed the 5 claims");
    assert!(status.success(), "{status}");
}

#[test]
fn status_watch_ends_on_sigterm_in_the_middle_of_an_hour_long_interval() {
    // Plan: 1. A drained ledger of 3; `status --watch 3600 --json` prints its first frame and
    // waits an hour for the next. 2. SIGTERM during that wait ends it with exit 0 (the wait is
    // on the shutdown signal; an unwoken one would outlast the deadline and the test would
    // fail), having printed exactly that one frame.
    let world = World::new();
    world.add(&(0..3).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    let mut watch = world
        .cmd(&["status", "--watch", "3600", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["ledger"]["claims"], 3, "{first}");
    signal(&watch, libc::SIGTERM);
    let status = wait_exit(&mut watch, Duration::from_secs(60));
    assert!(status.success(), "{status}");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(rest.is_empty(), "no second frame: {rest:?}");
}

#[test]
fn status_watch_waiting_for_its_ledger_ends_on_sigterm_within_an_hour_long_interval() {
    // Plan: 1. `status --watch 3600` on a path with no ledger says it waits, and looks again
    // only after the hour. 2. SIGTERM in that wait ends it with exit 0, with no frame printed
    // and no ledger made.
    let world = World::new();
    let mut watch = world
        .cmd(&["status", "--watch", "3600", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut errors = std::io::BufReader::new(watch.stderr.take().unwrap()).lines();
    let said = errors.next().unwrap().unwrap();
    assert!(said.contains("waiting for it to be made"), "{said}");
    signal(&watch, libc::SIGTERM);
    let status = wait_exit(&mut watch, Duration::from_secs(60));
    assert!(status.success(), "{status}");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut watch.stdout.take().unwrap(), &mut out).unwrap();
    assert!(out.is_empty(), "no frame: {out}");
    assert!(!world.db.exists(), "the watch made no ledger");
}
