//! The box's habits (issue 40): what an operator of a small box does without reading the code,
//! each tried for real — logrotate and its SIGHUP, the other signals a tool sends by habit, a
//! backup copied back by hand over a crashed ledger, leap seconds and the year range, an
//! oversize dead letter as `dlq list`, `dlq replay` and the audit line describe it, and
//! `retention purge` with two relays on two events streams.

use crate::support::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The audit lines of `dir`'s `audit.log*` files (the compressed ones through `gzip -dc`), as
/// (file name, line).
fn audit_lines(dir: &Path) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("audit.log") {
            continue;
        }
        let text = if name.ends_with(".gz") {
            let out = Command::new("gzip")
                .arg("-dc")
                .arg(&path)
                .output()
                .expect("gzip: apt-get install gzip");
            assert!(out.status.success(), "gzip -dc {name}");
            String::from_utf8(out.stdout).unwrap()
        } else {
            std::fs::read_to_string(&path).unwrap()
        };
        lines.extend(text.lines().map(|l| (name.clone(), l.to_owned())));
    }
    lines
}

/// The packaged logrotate configuration, aimed at `log` in a test's directory: the path, the
/// user it runs as and the owner of the file it creates are this test's, and the postrotate
/// step signals `pid` as `systemctl reload` does through the unit's `ExecReload=` (the test
/// checks that line of the unit). Every other directive is the packaged one.
fn logrotate_config(log: &Path, pid: u32) -> String {
    let packaged = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/claimgate.logrotate"),
    )
    .unwrap();
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/debian/claimgate.service"),
    )
    .unwrap();
    assert!(
        unit.lines()
            .any(|l| l == "ExecReload=/bin/kill -HUP $MAINPID"),
        "{unit}"
    );
    let reload = "systemctl reload claimgate.service";
    assert!(packaged.contains(reload), "{packaged}");
    let user = users_name();
    packaged
        .replace("/var/lib/claimgate/audit.log", &log.display().to_string())
        .replace("su claimgate claimgate", &format!("su {user} {user}"))
        .replace(
            "create 0600 claimgate claimgate",
            &format!("create 0600 {user} {user}"),
        )
        .replace(reload, &format!("/bin/kill -HUP {pid}"))
}

/// This process's user and group name (logrotate's `su` and `create` want names).
fn users_name() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs the real `logrotate -f` on `config`, with its state file beside it.
fn rotate(dir: &Path, config: &str) {
    let conf = dir.join("logrotate.conf");
    std::fs::write(&conf, config).unwrap();
    let out = Command::new("logrotate")
        .arg("-f")
        .arg("-s")
        .arg(dir.join("logrotate.state"))
        .arg(&conf)
        .output()
        .unwrap_or_else(|e| {
            panic!("logrotate could not run ({e}); install it: apt-get install logrotate")
        });
    assert!(
        out.status.success(),
        "logrotate failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn logrotate_with_its_sighup_keeps_every_audit_line_in_exactly_one_file_through_five_rotations() {
    // 1. A worker writes its audit lines to audit.log; submissions arrive all the time.
    // 2. The real logrotate, with the packaged configuration, rotates audit.log five times
    //    while they do; its postrotate sends SIGHUP as `systemctl reload` would.
    // 3. The worker lives through every SIGHUP and reopens the file each time; at the end every
    //    submission's audit line is in exactly one of audit.log, audit.log.1, audit.log.N.gz,
    //    and the newest file holds lines written after the last rotation.
    let w = World::new();
    let logs = w.dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("audit.log");
    let mut worker = w.spawn(&[
        "run",
        "--audit-log",
        log.to_str().unwrap(),
        "--claim-idle-ms",
        "200",
    ]);
    let config = logrotate_config(&log, worker.id());
    let total = 600;
    let mut added = 0;
    for round in 0..6 {
        let wave: Vec<String> = (added..added + total / 6).map(submission).collect();
        // Half before the rotation, half right after it, so lines race the SIGHUP.
        w.add(&wave[..wave.len() / 2]);
        if round > 0 {
            std::thread::sleep(Duration::from_millis(30));
            rotate(&logs, &config);
        }
        w.add(&wave[wave.len() / 2..]);
        added += wave.len();
        assert!(
            wait_for(Duration::from_secs(60), || w
                .count_once_made("disbursements")
                == added as i64),
            "round {round}: {} of {added} paid\n{}",
            w.count_once_made("disbursements"),
            worker.log_text()
        );
        assert!(
            worker.try_wait().unwrap().is_none(),
            "the worker died at round {round}: {:?}\n{}",
            worker.try_wait(),
            worker.log_text()
        );
    }
    // Each audit line is written once the XACK is done; wait for the last ones.
    assert!(wait_for(Duration::from_secs(30), || w.pending() == 0));
    std::thread::sleep(Duration::from_millis(300));
    signal(&worker, libc::SIGTERM);
    let status = wait_exit(&mut worker, Duration::from_secs(60));
    assert!(status.success(), "{status}\n{}", worker.log_text());
    let lines = audit_lines(&logs);
    for i in 0..total {
        let award = format!("award=A-{i:06} ");
        let holding: Vec<&str> = lines
            .iter()
            .filter(|(_, l)| l.contains("processed ") && l.contains(&award))
            .map(|(f, _)| f.as_str())
            .collect();
        assert_eq!(holding.len(), 1, "{award}: in {holding:?}");
    }
    let files: std::collections::BTreeSet<&str> = lines.iter().map(|(f, _)| f.as_str()).collect();
    assert!(files.contains("audit.log"), "{files:?}");
    assert!(files.contains("audit.log.1"), "{files:?}");
    assert!(
        files.iter().filter(|f| f.ends_with(".gz")).count() >= 3,
        "{files:?}"
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn hup_pipe_usr1_and_usr2_leave_the_worker_and_relay_running_and_sigterm_still_stops_them() {
    // 1. A worker with the relay in-process pays a first wave.
    // 2. It is sent SIGHUP (no audit log: nothing to reopen), SIGPIPE, SIGUSR1 and SIGUSR2,
    //    the signals an operator's tools send by habit, and so is a separate `claimgate relay`.
    // 3. Both stay up; a second wave is paid and published; SIGTERM ends each with exit 0.
    let w = World::new();
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    let mut worker = w.spawn(&["run", "--relay", "--claim-idle-ms", "200"]);
    let mut relay = w.spawn(&["relay", "--events-stream", "grants:events:second"]);
    assert!(wait_for(Duration::from_secs(60), || w
        .count_once_made("disbursements")
        == 20));
    for sig in [libc::SIGHUP, libc::SIGPIPE, libc::SIGUSR1, libc::SIGUSR2] {
        signal(&worker, sig);
        signal(&relay, sig);
        std::thread::sleep(Duration::from_millis(100));
        assert!(worker.try_wait().unwrap().is_none(), "worker died of {sig}");
        assert!(relay.try_wait().unwrap().is_none(), "relay died of {sig}");
    }
    w.add(&(20..40).map(submission).collect::<Vec<_>>());
    assert!(wait_for(Duration::from_secs(60), || w
        .count_once_made("disbursements")
        == 40
        && w.xlen("grants:events") == 40));
    signal(&worker, libc::SIGTERM);
    signal(&relay, libc::SIGTERM);
    let (ws, rs) = (
        wait_exit(&mut worker, Duration::from_secs(60)),
        wait_exit(&mut relay, Duration::from_secs(60)),
    );
    assert!(ws.success(), "worker: {ws}\n{}", worker.log_text());
    assert!(rs.success(), "relay: {rs}\n{}", relay.log_text());
}

/// The quarantine mark of entry `id`: how many tries alone it counts (0 without a mark).
fn tries_marked(w: &World, id: &str) -> u64 {
    let mark: Option<String> = redis::cmd("HGET")
        .arg("grants:submissions:quarantine")
        .arg(id)
        .query(&mut w.conn())
        .unwrap();
    mark.and_then(|m| m.strip_prefix("try ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn kills_aimed_at_a_valid_entrys_tries_alone_never_dead_letter_it_while_the_storm_is_shorter_than_the_spacing(
) {
    // For each of six seeds:
    // 1. One valid entry, --max-deliveries 1, tries alone spaced 300 ms then 600 ms. Every
    //    worker holds its first commit for a second at a point the seed picks (before its
    //    commit, after its claim, or committed and not yet acknowledged), so a kill aimed at
    //    the worker on its try alone lands inside that try.
    // 2. The storm: the first delivery is killed (the entry passes the cap), then every try
    //    alone that begins within the storm's length (the seed picks it between 1.1 and 2.9
    //    spacings after the first try) is killed with SIGKILL 0–150 ms after it begins, and
    //    the worker restarted at once, as a supervisor would.
    // 3. After the storm the entry is paid exactly once, never dead-lettered, nothing is left
    //    pending or marked; at least two tries alone were killed in every seed. (With the tries
    //    taken back to back, as before, the second kill dead-lettered it.)
    let spacing_ms = 300u64;
    for seed in 1..=6u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let point = ["before_commit", "after_claim", "after_commit"][rng.usize(0..3)];
        let storm_ms = rng.u64(spacing_ms * 11 / 10..spacing_ms * 29 / 10);
        let w = World::new();
        let id = w.add(&[submission(seed as usize)]).remove(0);
        let args = [
            "run",
            "--consumer",
            "storm",
            "--max-deliveries",
            "1",
            "--quarantine-spacing-ms",
            &spacing_ms.to_string(),
            "--exit-when-idle",
        ];
        let (mut first_try, mut killed_tries, mut last_killed) = (None, 0, 0);
        let mut killed_first_delivery = false;
        let finished = loop {
            let mut worker = w.spawn_armed(&args, &format!("slow:{point}"));
            let outcome = loop {
                if let Some(status) = worker.try_wait().unwrap() {
                    break Some(status);
                }
                let tries = tries_marked(&w, &id);
                if first_try.is_none() && tries > 0 {
                    first_try = Some(Instant::now());
                }
                let storm_on =
                    first_try.is_none_or(|t| t.elapsed() < Duration::from_millis(storm_ms));
                let begun = tries > last_killed || (!killed_first_delivery && w.pending() == 1);
                if storm_on && begun {
                    std::thread::sleep(Duration::from_millis(rng.u64(0..150)));
                    signal(&worker, libc::SIGKILL);
                    let _ = wait_exit(&mut worker, Duration::from_secs(10));
                    if tries > last_killed {
                        killed_tries += 1;
                        last_killed = tries;
                    } else {
                        killed_first_delivery = true;
                    }
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            if let Some(status) = outcome {
                assert!(
                    status.success(),
                    "seed {seed}: {status}\n{}",
                    worker.log_text()
                );
                break status;
            }
        };
        assert!(finished.success());
        let dead = w.xlen("grants:submissions:dead");
        assert_eq!(
            (w.count("disbursements"), dead, w.pending()),
            (1, 0, 0),
            "seed {seed} ({point}, storm {storm_ms} ms, {killed_tries} tries killed)"
        );
        assert_eq!(tries_marked(&w, &id), 0, "seed {seed}: mark left");
        assert!(
            killed_tries >= 2,
            "seed {seed}: the storm killed only {killed_tries} tries alone"
        );
    }
}

on_both_ledgers!(
    leap_seconds_and_instants_outside_the_years_are_dead_lettered_with_their_own_reason_never_held_as_conflicts,
    a_purge_keeps_every_row_a_second_relay_has_not_published_to_its_own_stream,
);

fn a_purge_keeps_every_row_a_second_relay_has_not_published_to_its_own_stream(store: Store) {
    // 1. Five submissions paid; relay B publishes them to other:events.
    // 2. Five more paid; relay A publishes all ten to grants:events (published_at set on all).
    // 3. Everything made three years ago and more: a purge is refused, naming the relays, and
    //    removes nothing: B's stream lacks rows 6-10, and B reads rows by id from its own
    //    position. (Before: the purge checked published_at alone, which A had set, and
    //    removed them: B never published them.)
    // 4. B runs again and publishes rows 6-10; the purge removes everything.
    let w = World::on(store);
    w.add(&(0..5).map(crate::support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&[
        "relay",
        "--exit-when-idle",
        "--events-stream",
        "other:events",
    ]);
    w.add(&(5..10).map(crate::support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0
    );
    let last = w.sql_i64("SELECT MAX(seq) FROM audit_log");
    crate::audit::backdate(&w, last, "2019-03-01T12:00:00.000000Z");
    let export = w.dir.path().join("purge.jsonl");
    let purge = |w: &World| {
        w.run(&[
            "retention",
            "purge",
            "--before",
            "2020-01-01",
            "--export",
            export.to_str().unwrap(),
        ])
    };
    let refused = purge(&w);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("5 outbox rows") && said.contains("every events stream"),
        "{said}"
    );
    assert_eq!(w.count("disbursements"), 10, "nothing purged");
    assert_eq!(w.xlen("other:events"), 5);
    w.run_ok(&[
        "relay",
        "--exit-when-idle",
        "--events-stream",
        "other:events",
    ]);
    assert_eq!(w.xlen("other:events"), 10);
    let _ = std::fs::remove_file(&export);
    let done = purge(&w);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(w.count("processed_messages"), 0, "everything purged");
    w.run_ok(&["verify"]);
}

fn leap_seconds_and_instants_outside_the_years_are_dead_lettered_with_their_own_reason_never_held_as_conflicts(
    store: Store,
) {
    // 1. One award, under --on-conflict hold, submitted at 23:59:59.999999999Z, at the leap
    //    second 23:59:60Z and at 23:59:60.5Z (different payloads), and at two valid RFC 3339
    //    times whose UTC instants fall in years -1 and 10000.
    // 2. The first is paid; each leap second is dead-lettered `leap_second` and each of the
    //    last two `timestamp_out_of_range`, each with its reason naming the timestamp — none
    //    is held as a conflict with the first (before, all three leap spellings were one
    //    instant, so two were held) or called "not an RFC 3339 date-time".
    let w = World::on(store);
    let at = |ts: &str, cents: u32| {
        format!(r#"{{"award_id":"A-LEAP","submission_timestamp":"{ts}","amount_cents":{cents}}}"#)
    };
    w.add(&[
        at("2016-12-31T23:59:59.999999999Z", 100),
        at("2016-12-31T23:59:60Z", 200),
        at("2016-12-31T23:59:60.5Z", 300),
        at("0000-01-01T00:30:00+01:00", 400),
        at("9999-12-31T23:30:00-01:00", 500),
    ]);
    w.drain(&["--on-conflict", "hold"]);
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        100
    );
    let codes: Vec<(String, String)> = w
        .dead_letters()
        .iter()
        .map(|d| {
            (
                String::from_utf8_lossy(&d["reason_code"]).into_owned(),
                String::from_utf8_lossy(&d["reason"]).into_owned(),
            )
        })
        .collect();
    assert_eq!(codes.len(), 4, "{codes:?}");
    for (ts, code) in [
        ("2016-12-31T23:59:60Z", "leap_second"),
        ("2016-12-31T23:59:60.5Z", "leap_second"),
        ("0000-01-01T00:30:00+01:00", "timestamp_out_of_range"),
        ("9999-12-31T23:30:00-01:00", "timestamp_out_of_range"),
    ] {
        assert!(
            codes
                .iter()
                .any(|(c, r)| c == code && r.contains(&format!("{ts:?}"))),
            "{ts}: {codes:?}"
        );
    }
    assert!(
        !codes
            .iter()
            .any(|(c, _)| c == "conflict_hold" || c == "bad_timestamp"),
        "{codes:?}"
    );
    assert_eq!(w.pending(), 0);
    w.run_ok(&["verify"]);
}

#[test]
fn a_backup_copied_by_hand_over_a_killed_ledger_is_refused_before_its_wal_is_merged() {
    // 1. A worker pays 300 submissions; `claimgate backup` copies the ledger; it pays 300 more
    //    and is killed with SIGKILL while the ledger's -wal holds frames.
    // 2. The operator copies the backup over the ledger by hand (`cp backup claimgate.db`).
    // 3. The next start is refused with exit 2 naming `claimgate restore`, before SQLite
    //    merges the -wal into the copy: the -wal is byte for byte what the kill left, and
    //    nothing was paid. (Before: the worker started without a word on a file `verify` then
    //    found malformed.) `claimgate restore` puts the copy back properly; then it verifies.
    let w = World::new();
    w.add(&(0..300).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    let mut worker = w.spawn(&["run", "--claim-idle-ms", "200"]);
    w.add(&(300..600).map(submission).collect::<Vec<_>>());
    assert!(wait_for(Duration::from_secs(60), || w
        .count("disbursements")
        == 600));
    w.add(&(600..620).map(submission).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(20));
    signal(&worker, libc::SIGKILL);
    let _ = wait_exit(&mut worker, Duration::from_secs(10));
    let wal_path = format!("{}-wal", w.db.display());
    let wal = std::fs::read(&wal_path).expect("a -wal left by the kill");
    assert!(wal.len() > 32, "the -wal holds no frame");
    let cp = Command::new("cp").arg(&backup).arg(&w.db).status().unwrap();
    assert!(cp.success());

    let out = w.run(&["run", "--exit-when-idle"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("claimgate restore"), "{stderr}");
    assert!(stderr.contains("write-ahead log"), "{stderr}");
    assert_eq!(
        std::fs::read(&wal_path).unwrap(),
        wal,
        "the -wal was changed"
    );
    for args in [&["status"][..], &["verify"]] {
        assert_eq!(w.run(args).status.code(), Some(2), "{args:?}");
    }
    assert_eq!(
        std::fs::read(&wal_path).unwrap(),
        wal,
        "the -wal was changed"
    );

    // The way out the message names: the copy moved aside, then restored properly.
    let copy = w.dir.path().join("copy.db");
    std::fs::rename(&w.db, &copy).unwrap();
    std::fs::rename(&wal_path, w.dir.path().join("copy.db-wal.kept")).unwrap();
    let _ = std::fs::remove_file(format!("{}-shm", w.db.display()));
    w.run_ok(&["restore", backup.to_str().unwrap()]);
    w.drain(&[]);
    w.run_ok(&["verify"]);
}
