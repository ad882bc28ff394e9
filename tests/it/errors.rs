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
