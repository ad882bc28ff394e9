//! The one question the worker asks of an error — transient or permanent? — answered for the
//! replies a real redis-server gives, not for hand-built errors. Transient means "leave the entry
//! pending and retry"; permanent means "dead-letter it, or stop with exit 1". A wrong answer
//! either loses liveness (retrying forever on a misconfiguration) or loses entries (dead-lettering
//! because Redis was briefly busy), so each class in `src/error.rs` is provoked here for real.

use claimgate::support::localredis::{free_port, LocalRedis, Options};
use std::time::Duration;

fn server() -> LocalRedis {
    LocalRedis::start(Options::default()).expect("the suite needs redis-server")
}

fn conn(r: &LocalRedis) -> redis::Connection {
    redis::Client::open(r.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The error `cmd` gets from the server, as claimgate sees it.
fn error_of(c: &mut redis::Connection, cmd: &redis::Cmd) -> claimgate::Error {
    let e = cmd
        .query::<redis::Value>(c)
        .expect_err("the command must fail");
    claimgate::Error::from(e)
}

#[test]
fn redis_says_wait_for_busy_full_readonly_and_missing_groups() {
    // 1. NOGROUP (the group went with a restart): transient, the worker recreates it.
    let r = server();
    let mut c = conn(&r);
    let nogroup = error_of(
        &mut c,
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("STREAMS")
            .arg("s")
            .arg(">"),
    );
    assert!(nogroup.is_transient() && nogroup.is_no_group(), "{nogroup}");

    // 2. OOM (Redis at maxmemory): transient, like a full disk.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query::<()>(&mut c)
        .unwrap();
    let oom = error_of(
        &mut c,
        redis::cmd("XADD").arg("s").arg("*").arg("a").arg("b"),
    );
    assert!(oom.is_transient(), "{oom}");
    assert!(oom.to_string().contains("OOM"), "{oom}");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query::<()>(&mut c)
        .unwrap();

    // 3. BUSY (a long script holds the server): transient.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg("50")
        .query::<()>(&mut c)
        .unwrap();
    let url = r.url();
    let script = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        // Spins until SCRIPT KILL; it writes nothing, so it can be killed.
        let _ = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query::<redis::Value>(&mut c);
    });
    std::thread::sleep(Duration::from_millis(300));
    let busy = error_of(&mut c, redis::cmd("XLEN").arg("s"));
    assert!(busy.is_transient(), "{busy}");
    assert!(busy.to_string().contains("BUSY"), "{busy}");
    redis::cmd("SCRIPT")
        .arg("KILL")
        .query::<()>(&mut c)
        .unwrap();
    script.join().unwrap();

    // 4. READONLY (a replica, as after a failover that demoted our server): transient.
    let replica = server();
    let mut rc = conn(&replica);
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(r.port())
        .query::<()>(&mut rc)
        .unwrap();
    let readonly = error_of(
        &mut rc,
        redis::cmd("XADD").arg("s").arg("*").arg("a").arg("b"),
    );
    assert!(readonly.is_transient(), "{readonly}");
    assert!(readonly.to_string().contains("read only"), "{readonly}");

    // 5. MASTERDOWN (a replica cut off from its primary that may not serve stale data):
    //    transient.
    let orphan = server();
    let mut oc = conn(&orphan);
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-serve-stale-data")
        .arg("no")
        .query::<()>(&mut oc)
        .unwrap();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(free_port().unwrap())
        .query::<()>(&mut oc)
        .unwrap();
    let masterdown = error_of(&mut oc, redis::cmd("XLEN").arg("s"));
    assert!(masterdown.is_transient(), "{masterdown}");
    assert!(
        masterdown.to_string().to_lowercase().contains("masterdown"),
        "{masterdown}"
    );
}

#[test]
fn redis_unreachable_is_transient() {
    // Nothing listens on the port: connection refused, the outage the worker waits out.
    let port = free_port().unwrap();
    let Err(e) = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
    else {
        panic!("nothing listens on {port}, yet a connection was made");
    };
    let e = claimgate::Error::from(e);
    assert!(e.is_transient(), "{e}");
}

#[test]
fn redis_says_stop_for_wrong_types_missing_rights_and_bad_commands() {
    // Each of these will fail the same way on every retry: permanent, never retried forever.
    let r = server();
    let mut c = conn(&r);
    redis::cmd("SET")
        .arg("grants:submissions:dead")
        .arg("x")
        .query::<()>(&mut c)
        .unwrap();
    let wrongtype = error_of(
        &mut c,
        redis::cmd("XADD")
            .arg("grants:submissions:dead")
            .arg("*")
            .arg("a")
            .arg("b"),
    );
    assert!(!wrongtype.is_transient(), "{wrongtype}");
    assert!(wrongtype.to_string().contains("WRONGTYPE"), "{wrongtype}");

    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("reader")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+xlen")
        .query::<()>(&mut c)
        .unwrap();
    let mut limited = redis::Client::open(format!("redis://reader:pw@127.0.0.1:{}", r.port()))
        .unwrap()
        .get_connection()
        .unwrap();
    let noperm = error_of(
        &mut limited,
        redis::cmd("XADD").arg("s").arg("*").arg("a").arg("b"),
    );
    assert!(!noperm.is_transient(), "{noperm}");

    let unknown = error_of(&mut c, &redis::cmd("NOSUCHCOMMAND"));
    assert!(!unknown.is_transient(), "{unknown}");
}

/// Each command's stderr, as text.
fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn produce_without_the_password_says_so_in_one_line_and_exits_2() {
    // Issue 39: `produce` without the password printed 56 KB of `NOAUTH` pipeline errors and
    // exited 1. Now: one line, exit 2, naming host:port and the URL form that carries a
    // password; nothing added.
    let w = crate::support::World::with(Options {
        password: Some("pr0duce-pw".into()),
        ..Options::default()
    });
    let lines: Vec<String> = (0..1_000).map(crate::support::submission).collect();
    let file = w.dir.path().join("in.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let bare = format!("redis://127.0.0.1:{}", w.redis.port());
    let out = w
        .cmd(&["produce", file.to_str().unwrap()])
        .env("REDIS_URL", &bare)
        .run_with_deadline();
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.len() < 1_024, "{} bytes:\n{stderr}", stderr.len());
    let said = format!(
        "redis at 127.0.0.1:{} wants a password (NOAUTH)",
        w.redis.port()
    );
    for part in [said.as_str(), "redis://:PASSWORD@HOST:PORT"] {
        assert!(stderr.contains(part), "wanted {part:?} in {stderr}");
    }
    assert_eq!(w.xlen("grants:submissions"), 0);
}

use crate::support::RunWithDeadline;

#[test]
fn a_refused_password_or_command_is_exit_2_in_every_command_and_never_shows_the_password() {
    // A wrong password (WRONGPASS), an ACL user refused a command claimgate needs (NOPERM):
    // configuration, exit 2 at once, one line naming host:port; never retried for ever, never
    // the password.
    const PW: &str = "r1ght-pw-0b5e";
    const WRONG: &str = "wr0ng-pw-77c1";
    let w = crate::support::World::with(Options {
        password: Some(PW.into()),
        ..Options::default()
    });
    let port = w.redis.port();
    redis::cmd("ACL")
        .arg(&["SETUSER", "scant", "on", ">scant-pw-9d", "~*", "+ping"])
        .query::<()>(&mut w.conn())
        .unwrap();
    w.create_ledger();
    let wrong = format!("redis://:{WRONG}@127.0.0.1:{port}");
    let scant = format!("redis://scant:scant-pw-9d@127.0.0.1:{port}");
    for (url, said) in [
        (&wrong, "refused the user or password --redis-url gives it"),
        (&scant, "refused a command to the user --redis-url names"),
    ] {
        for args in [
            &["run", "--exit-when-idle"][..],
            &["relay", "--exit-when-idle"][..],
            &["status"][..],
            &["dlq", "list"][..],
        ] {
            let out = w
                .cmd(args)
                .env("REDIS_URL", url)
                .run_within(std::time::Duration::from_secs(60));
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                stderr_of(&out)
            );
            assert_eq!(out.status.code(), Some(2), "{args:?} at {url}: {all}");
            let last = stderr_of(&out).lines().last().unwrap_or("").to_owned();
            assert!(
                last.contains(&format!("redis at 127.0.0.1:{port} {said}")),
                "{args:?}: {all}"
            );
            assert!(
                !all.contains(WRONG) && !all.contains("scant-pw-9d"),
                "{all}"
            );
        }
    }
}

#[test]
fn a_redis_that_cannot_be_reached_is_named_by_host_and_port() {
    // "Connection refused" alone does not say which Redis; redis-cli says where.
    let w = crate::support::World::new();
    let port = free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let file = w.dir.path().join("in.jsonl");
    std::fs::write(&file, crate::support::submission(0)).unwrap();
    for args in [
        &["produce", file.to_str().unwrap()][..],
        &["dlq", "list"][..],
    ] {
        let out = w.cmd(args).env("REDIS_URL", &url).run_with_deadline();
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("redis: 127.0.0.1:{port}: Connection refused")),
            "{args:?}: {stderr}"
        );
    }
}
