//! Redis through Sentinel: a primary, one replica and three real sentinels on loopback
//! (`claimgate::support::localsentinels`), real workers, a real relay, a real SIGKILL.

use crate::support::{
    status_refusing_the_certificate, submission, wait_for, Certificates, Logged, RunWithDeadline,
    Spawned, World,
};
use claimgate::support::localsentinels::{LocalSentinels, Passwords};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the pipeline has to settle after a failover before the test calls it stuck.
const SETTLE: Duration = Duration::from_secs(90);

/// A sentinel set-up and a world (ledger, temp dir) whose commands go through the sentinels.
struct Cluster {
    /// Primary, replica, three sentinels.
    set: LocalSentinels,
    /// The ledger and the logs.
    world: World,
    /// With TLS: the certificate every node serves, trusted by our commands (`SSL_CERT_FILE`).
    cert: Option<PathBuf>,
}

impl Cluster {
    fn start() -> Cluster {
        Self::start_with(false, Passwords::default())
    }

    /// [`Cluster::start`] with every node and sentinel serving TLS with a certificate for
    /// 127.0.0.1 (written into the world's directory), and a `rediss+sentinel://` URL.
    fn start_tls() -> Cluster {
        Self::start_with(true, Passwords::default())
    }

    /// The set-up, over TLS or not, with `passwords` (its URL carries them).
    fn start_with(tls: bool, passwords: Passwords) -> Cluster {
        let world = World::new();
        let (tls, cert) = match tls {
            true => {
                let certs = Certificates::write_in(world.dir.path());
                let tls = claimgate::support::localredis::Tls {
                    cert: certs.cert.clone(),
                    key: certs.key,
                };
                (Some(tls), Some(certs.cert))
            }
            false => (None, None),
        };
        Cluster {
            set: LocalSentinels::start_with(tls, passwords).unwrap_or_else(no_sentinels),
            world,
            cert,
        }
    }

    /// `claimgate ARGS` with `REDIS_URL` the sentinel URL.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.world.cmd(args);
        cmd.env("REDIS_URL", self.set.url());
        if let Some(cert) = &self.cert {
            cmd.env("SSL_CERT_FILE", cert);
        }
        cmd
    }

    /// Starts `claimgate ARGS` in the background through the sentinels, logging to a file.
    fn spawn(&self, args: &[&str]) -> Spawned {
        self.spawn_at(&self.set.url(), args)
    }

    /// [`Cluster::spawn`] with `REDIS_URL` set to `url`.
    fn spawn_at(&self, url: &str, args: &[&str]) -> Spawned {
        let log = self.world.dir.path().join(format!(
            "{}-{}.log",
            args[0],
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let file = std::fs::File::create(&log).expect("child log");
        let child = self
            .cmd(args)
            .env("REDIS_URL", url)
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn claimgate");
        Spawned { child, log }
    }

    /// XADDs `lines` through `claimgate produce` (see [`produce`]).
    fn produce(&self, lines: &[String], extra: &[&str]) {
        produce(
            &self.world,
            &self.set.url(),
            self.cert.as_deref(),
            lines,
            extra,
        );
    }

    /// A connection to whichever node the sentinels name as the primary now (on its plain
    /// port: the test's own checks need no TLS).
    fn primary(&self) -> redis::Connection {
        let named = self.set.primary_port().expect("a sentinel answers");
        let port = self.set.nodes[self.set.node_on(named).expect("a node of ours")].port();
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn
    }
}

/// The sentinel set-up could not start: say what to install.
fn no_sentinels(e: claimgate::Error) -> LocalSentinels {
    panic!(
        "the sentinel tests need redis-server (with its --sentinel mode): {e}\n(install: {})",
        claimgate::support::localredis::INSTALL_HINT
    )
}

/// XADDs `lines` through `claimgate produce` at `url` (trusting `cert` when given), trying
/// again until it succeeds (a produce that fails mid-way may have added some lines: adding them
/// again is what a producer does, and the ledger makes the repeat harmless).
fn produce(world: &World, url: &str, cert: Option<&Path>, lines: &[String], extra: &[&str]) {
    let file = tempfile::NamedTempFile::new_in(world.dir.path()).unwrap();
    std::fs::write(file.path(), lines.join("\n")).unwrap();
    let mut args = vec!["produce", file.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut cmd = world.cmd(&args);
        cmd.env("REDIS_URL", url);
        if let Some(cert) = cert {
            cmd.env("SSL_CERT_FILE", cert);
        }
        let out = cmd.run_with_deadline();
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "produce never succeeded: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGKILLs the primary, waits for a sentinel to name the other node, and brings the old one
/// back as a replica of the new. Returns the new primary's port.
fn fail_over(set: &mut LocalSentinels) -> u16 {
    let old = set.primary_port().unwrap();
    let old_index = set.node_on(old).unwrap();
    set.nodes[old_index].kill();
    assert!(
        wait_for(Duration::from_secs(30), || set
            .primary_port()
            .is_ok_and(|p| p != old)),
        "no sentinel promoted the replica (logs in {})",
        set.dir().display()
    );
    let new = set.primary_port().unwrap();
    set.rejoin(old_index, new)
        .expect("the old primary comes back as a replica");
    new
}

/// A payload no worker can parse: it becomes a dead letter.
fn malformed(i: usize) -> String {
    format!("not json {i}")
}

/// The lines of chunk `c`: ten submissions and one malformed entry.
fn chunk(c: usize) -> Vec<String> {
    let mut lines: Vec<String> = (c * 10..c * 10 + 10).map(submission).collect();
    lines.push(malformed(c));
    lines
}

/// Everything the failover tests check on the ledger and the new primary, once the pipeline
/// has settled: every distinct submission paid once to the cent, nothing pending, every event
/// once on the events stream, every malformed entry dead-lettered once.
fn assert_exactly_once(cluster: &Cluster, chunks: usize, extra_awards: i64) {
    let n = chunks * 10;
    let expected_sum: i64 = (0..n).map(|i| 100 + i as i64).sum();
    let world = &cluster.world;
    // A connection per poll: one that timed out under load stays broken, and every later
    // poll through it would fail whatever the pipeline did.
    let mut last = String::new();
    let settled = wait_for(SETTLE, || {
        let mut primary = cluster.primary();
        let pending: Vec<redis::Value> = redis::cmd("XPENDING")
            .arg("grants:submissions")
            .arg("grant-workers")
            .query(&mut primary)
            .unwrap_or_default();
        let pending_zero = matches!(pending.first(), Some(redis::Value::Int(0)));
        let events: u64 = redis::cmd("XLEN")
            .arg("grants:events")
            .query(&mut primary)
            .unwrap_or(0);
        let paid = world.count_once_made("disbursements");
        let unpublished =
            world.sql_i64_once_made("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL");
        last = format!(
            "{paid} disbursements, pending {:?}, {events} events, {unpublished} outbox rows \
             unpublished, primary {:?}",
            pending.first(),
            cluster.set.primary_port()
        );
        paid == n as i64 + extra_awards
            && pending_zero
            && events == n as u64 + extra_awards as u64
            && unpublished == 0
    });
    let mut primary = cluster.primary();
    let events: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg("grants:events")
        .arg("-")
        .arg("+")
        .query(&mut primary)
        .unwrap();
    assert!(
        settled,
        "not settled (want {} disbursements and events): {last}; XRANGE read {} events\n{}",
        n as i64 + extra_awards,
        events.len(),
        logs_in(world.dir.path())
    );
    assert_eq!(
        world.sql_i64(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM disbursements WHERE award_id LIKE 'A-%'"
        ),
        expected_sum,
        "paid to the cent"
    );
    assert_eq!(
        world.sql_i64(
            "SELECT COUNT(DISTINCT p.idempotency_key)
             FROM disbursements d JOIN processed_messages p ON p.claim_id = d.claim_id"
        ),
        n as i64 + extra_awards
    );
    let event_ids: HashSet<&String> = events.iter().map(|(_, f)| &f["event_id"]).collect();
    assert_eq!(event_ids.len(), events.len(), "an event published twice");
    assert_eq!(events.len() as i64, n as i64 + extra_awards);
    assert_dead_letters_once(&mut primary, chunks);
}

/// Every process log the tests wrote in `dir`, each under its name: what a failure shows.
fn logs_in(dir: &Path) -> String {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    logs.iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            format!("--- {}\n{text}", p.display())
        })
        .collect()
}

/// Every malformed entry on the submissions stream has exactly one dead letter, and every
/// malformed payload produced is among them.
fn assert_dead_letters_once(primary: &mut redis::Connection, chunks: usize) {
    let entries: Vec<(String, HashMap<String, Vec<u8>>)> = redis::cmd("XRANGE")
        .arg("grants:submissions")
        .arg("-")
        .arg("+")
        .query(primary)
        .unwrap();
    let malformed_ids: HashSet<String> = entries
        .iter()
        .filter(|(_, f)| f["payload"].starts_with(b"not json"))
        .map(|(id, _)| id.clone())
        .collect();
    let dead: Vec<(String, HashMap<String, Vec<u8>>)> = redis::cmd("XRANGE")
        .arg("grants:submissions:dead")
        .arg("-")
        .arg("+")
        .query(primary)
        .unwrap();
    let originals: Vec<String> = dead
        .iter()
        .map(|(_, f)| String::from_utf8(f["original_id"].clone()).unwrap())
        .collect();
    let distinct: HashSet<String> = originals.iter().cloned().collect();
    assert_eq!(distinct.len(), originals.len(), "a dead letter twice");
    assert_eq!(distinct, malformed_ids, "dead letters vs malformed entries");
    let payloads: HashSet<Vec<u8>> = dead
        .iter()
        .map(|(_, f)| f["original.payload"].clone())
        .collect();
    for c in 0..chunks {
        assert!(
            payloads.contains(malformed(c).as_bytes()),
            "chunk {c}: {:?}",
            dead.first()
        );
    }
}

/// Asserts the process is still running (a worker must ride out a failover, not exit).
fn assert_alive(p: &mut Spawned, what: &str) {
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "{what} exited during the failover:\n{}",
        p.log_text()
    );
}

/// Two workers and a relay go through the sentinels while load arrives; the primary is
/// SIGKILLed, a sentinel promotes the replica, the old primary comes back as a replica: every
/// submission is paid once, nothing stays pending, every event and dead letter is there once,
/// and no process exited.
#[test]
fn a_primary_killed_under_load_fails_over_with_every_submission_paid_once() {
    // 1. Five processes: primary, replica, three sentinels; two workers and a relay on top.
    // 2. Half the load, then SIGKILL the primary while the rest arrives.
    // 3. A probe submission produced after the kill times the first commit on the new primary.
    // 4. The old primary rejoins as a replica; the pipeline settles; check everything.
    let mut cluster = Cluster::start();
    let run = ["run", "--claim-idle-ms", "1000", "--max-deliveries", "50"];
    let mut workers = [cluster.spawn(&run), cluster.spawn(&run)];
    let mut relay = cluster.spawn(&["relay"]);
    let chunks = 12;
    for c in 0..chunks / 2 {
        cluster.produce(&chunk(c), &[]);
    }
    assert!(wait_for(Duration::from_secs(30), || cluster
        .world
        .count_once_made("disbursements")
        > 0));
    let killed_at = Instant::now();
    let url = cluster.set.url();
    let new_primary = std::thread::scope(|s| {
        let (set, world) = (&mut cluster.set, &cluster.world);
        let load = s.spawn(|| {
            for c in chunks / 2..chunks {
                produce(world, &url, None, &chunk(c), &[]);
            }
        });
        let new_primary = fail_over(set);
        load.join().unwrap();
        new_primary
    });
    let probe =
        r#"{"award_id":"PROBE-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1}"#;
    cluster.produce(&[probe.to_owned()], &[]);
    assert!(wait_for(SETTLE, || cluster.world.sql_i64_once_made(
        "SELECT COUNT(*) FROM disbursements WHERE award_id = 'PROBE-1'"
    ) == 1));
    println!(
        "sentinel failover: primary SIGKILLed -> first commit of a submission added after the \
         kill (on the new primary, port {new_primary}): {:.2} s (down-after {} ms)",
        killed_at.elapsed().as_secs_f64(),
        claimgate::support::localsentinels::DOWN_AFTER_MS
    );
    assert_exactly_once(&cluster, chunks, 1);
    for (i, w) in workers.iter_mut().enumerate() {
        assert_alive(w, &format!("worker {i}"));
    }
    assert_alive(&mut relay, "relay");
    assert_status_names_primary(&cluster, new_primary);
    assert!(
        workers[0].log_text().contains("redis primary for")
            || workers[1].log_text().contains("redis primary for"),
        "the workers name the primary they follow"
    );
}

/// A master name no sentinel monitors is a configuration error: exit 2, naming the name, for
/// the worker and for a one-shot command alike, and no password in the message.
#[test]
fn a_wrong_master_name_is_exit_2_with_a_clear_message() {
    let cluster = Cluster::start();
    let ports = cluster.set.sentinel_ports();
    let url = format!(
        "redis+sentinel://u:s3cret@127.0.0.1:{},127.0.0.1:{}/no-such-master",
        ports[0], ports[1]
    );
    for args in [&["run", "--exit-when-idle"][..], &["status"][..]] {
        let out = cluster
            .world
            .cmd(args)
            .env("REDIS_URL", &url)
            .run_with_deadline();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("monitors a master named \"no-such-master\""),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("s3cret"), "{stderr}");
    }
}

/// With every sentinel down when the worker starts, it waits (like Redis being down) and
/// processes what is queued once they are back.
#[test]
fn all_sentinels_down_at_start_is_waited_out() {
    let mut cluster = Cluster::start();
    let primary_url = cluster.set.nodes[0].url();
    cluster.set.kill_sentinels();
    produce(&cluster.world, &primary_url, None, &chunk(0), &[]);
    let mut worker = cluster.spawn(&["run"]);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_alive(&mut worker, "worker");
    assert_eq!(cluster.world.count_once_made("disbursements"), 0);
    cluster.set.restart_sentinels().unwrap();
    assert!(
        wait_for(SETTLE, || cluster.world.count_once_made("disbursements")
            == 10),
        "{}",
        worker.log_text()
    );
    assert_alive(&mut worker, "worker");
}

/// `status --json` through the sentinels names the primary it talked to, the sentinel that
/// named it, and the one replica. The primary is the one the sentinels name around the call:
/// usually `failed_over_to`, but on a loaded machine a real Sentinel (down-after 1 s) may fail
/// over once more after the test's own failover, and then status must name that one; a
/// promotion during the call is waited out and the call repeated. After such a second
/// failover the demoted node is a replica only once Sentinel has reconfigured it and it has
/// synced, and until then the primary's `INFO replication` (what status reports) lists none
/// (seen once under load: the pipeline settled exactly once, the status listed no replica):
/// status is asked again until it lists the one replica, for up to `SETTLE`.
fn assert_status_names_primary(cluster: &Cluster, failed_over_to: u16) {
    let deadline = Instant::now() + SETTLE;
    let (doc, primary_port) = loop {
        let (doc, primary_port) = (0..5)
            .find_map(|_| {
                let before = cluster.set.primary_port().expect("a sentinel answers");
                let out = cluster.cmd(&["status", "--json"]).run_with_deadline();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let after = cluster.set.primary_port().expect("a sentinel answers");
                let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                (before == after).then_some((doc, after))
            })
            .expect("the sentinels kept promoting during five status calls");
        let replicas = doc["redis"]["sentinel"]["replicas"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(
            replicas == 1 || Instant::now() < deadline,
            "status never listed the one replica within {SETTLE:?}: {doc}"
        );
        if replicas == 1 {
            break (doc, primary_port);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if primary_port != failed_over_to {
        eprintln!("the sentinels failed over again after the test's failover: now {primary_port}");
    }
    let view = &doc["redis"]["sentinel"];
    assert_eq!(
        view["primary"],
        format!("127.0.0.1:{primary_port}"),
        "{doc}"
    );
    let named_by = view["sentinel"].as_str().unwrap();
    assert!(
        cluster
            .set
            .url()
            .split(['/', ','])
            .any(|host| host == named_by),
        "{doc}"
    );
}

/// Sends `sig` to process `pid` (a redis-server or claimgate this test started).
fn send(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid this test spawned and still holds.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Closes the primary's links to its replicas (CLIENT KILL TYPE replica); returns the
/// primary's replication offset just before, the most any replica can have until it
/// reconnects.
fn cut_replicas(port: u16) -> u64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let offset = repl_offset(port, "master_repl_offset");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut conn)
        .unwrap();
    assert_eq!(killed, 1, "one replica link cut");
    offset
}

/// `master_repl_offset` (or a replica's `slave_repl_offset`) of the node on `port`.
fn repl_offset(port: u16, field: &str) -> u64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn)
        .unwrap();
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}:")))
        .unwrap()
        .parse()
        .unwrap()
}

/// The lossy case: the replica is frozen while the workers read, commit and acknowledge, so
/// the promotion really loses writes the old primary had acknowledged (XACKs, the group's
/// position, dead-letter copies, published events and the relay's mark). Same invariants:
/// paid once to the cent, nothing pending, every event and dead letter once, nobody exits.
#[test]
fn a_promotion_that_loses_acknowledged_writes_still_pays_each_submission_once() {
    // 1. Workers and relay warm up on chunk 0.
    // 2. Freeze them (SIGSTOP), produce chunks 1..7 (confirmed on the replica by WAIT), then
    //    freeze the replica and let the workers and relay run against the primary alone.
    // 3. SIGKILL the primary, thaw the replica: what the primary did since is gone (checked by
    //    replication offsets). A sentinel promotes the replica; the old primary rejoins.
    // 4. More load; the pipeline settles; check everything.
    let mut cluster = Cluster::start();
    // Nothing WAITs for a replica: the workers commit and acknowledge, and the relay publishes
    // and marks rows published, freely while the replica is cut off, and all of that is lost.
    // The ledger and redelivery must make up for the workers' part, and the relay, whose
    // position is the events stream's own, must publish again exactly the events lost.
    let no_wait = ["--redis-wait-replicas", "0"];
    let run = [
        &["run", "--claim-idle-ms", "1000", "--max-deliveries", "50"][..],
        &no_wait,
    ]
    .concat();
    let mut workers = [cluster.spawn(&run), cluster.spawn(&run)];
    let mut relay = cluster.spawn(&[&["relay"][..], &no_wait].concat());
    cluster.produce(&chunk(0), &[]);
    assert!(wait_for(SETTLE, || cluster
        .world
        .count_once_made("disbursements")
        == 10));
    // Chunk 0's events on the stream before anything is frozen, so the replica has the stream
    // and its mark (the WAITs of the produce below cover them): the promotion then takes back
    // its newest events, which the relay publishes again. A replica without the stream at all
    // is the other case, refused until told (`a_promotion_that_loses_the_consumer_group_…`).
    assert!(wait_for(SETTLE, || {
        let events: redis::RedisResult<u64> = redis::cmd("XLEN")
            .arg("grants:events")
            .query(&mut cluster.primary());
        events.is_ok_and(|n| n == 10)
    }));
    let pids: Vec<u32> = workers
        .iter()
        .map(|w| w.child.id())
        .chain([relay.child.id()])
        .collect();
    pids.iter().for_each(|&p| send(p, libc::SIGSTOP));
    for c in 1..7 {
        cluster.produce(&chunk(c), &[]);
    }
    let old = cluster.set.primary_port().unwrap();
    let old_index = cluster.set.node_on(old).unwrap();
    let replica = &cluster.set.nodes[1 - old_index];
    let (replica_port, replica_pid) = (replica.port(), replica.pid().unwrap());
    // Frozen, the replica cannot reconnect; its link cut, nothing more reaches it (what the
    // kernel had buffered before the cut still does, so the cut's offset is the bound).
    send(replica_pid, libc::SIGSTOP);
    let cut_offset = cut_replicas(old);
    pids.iter().for_each(|&p| send(p, libc::SIGCONT));
    // Well under down-after (1000 ms), so the sentinels still count the replica as healthy.
    std::thread::sleep(Duration::from_millis(600));
    let primary_offset = repl_offset(old, "master_repl_offset");
    let committed_before_kill = cluster.world.count_once_made("disbursements");
    cluster.set.nodes[old_index].kill();
    send(replica_pid, libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(200));
    let replica_offset = repl_offset(replica_port, "slave_repl_offset");
    assert!(
        replica_offset <= cut_offset && cut_offset < primary_offset,
        "nothing was lost: replica at {replica_offset}, cut at {cut_offset}, primary was at \
         {primary_offset}"
    );
    assert!(
        committed_before_kill > 30,
        "the workers did little while the replica was cut off: {committed_before_kill}"
    );
    assert!(
        wait_for(Duration::from_secs(30), || cluster
            .set
            .primary_port()
            .is_ok_and(|p| p == replica_port)),
        "no sentinel promoted the replica (logs in {})",
        cluster.set.dir().display()
    );
    cluster.set.rejoin(old_index, replica_port).unwrap();
    for c in 7..12 {
        cluster.produce(&chunk(c), &[]);
    }
    assert_exactly_once(&cluster, 12, 0);
    // The loss reached the events: the relay found the stream behind what it had published,
    // and published those ids again (each once, as assert_exactly_once proved).
    let relay_log = relay.log_text();
    let went_back = relay_log
        .lines()
        .find(|l| l.contains("grants:events is back at outbox id"))
        .unwrap_or_else(|| panic!("the promotion lost no event:\n{relay_log}"));
    println!(
        "lossy promotion: {} replication bytes lost; {committed_before_kill} submissions \
         committed before the kill; relay: {went_back}",
        primary_offset - replica_offset
    );
    for (i, w) in workers.iter_mut().enumerate() {
        assert_alive(w, &format!("worker {i}"));
    }
    assert_alive(&mut relay, "relay");
}

/// Dead letters the ledger records but the dead-letter stream lost (as a lossy promotion can
/// make it) are copied again by `dlq reconcile`, each once, with the reason the ledger kept;
/// one whose entry was trimmed meanwhile still comes back, without its fields; a second run
/// copies nothing.
#[test]
fn dlq_reconcile_recopies_lost_dead_letters_once() {
    let world = World::new();
    let bad = world.add(&[malformed(0), malformed(1), malformed(2)]);
    world.add(&[submission(0)]);
    world.drain(&[]);
    assert_eq!(world.dead_letters().len(), 3);
    let mut conn = world.conn();
    redis::cmd("DEL")
        .arg("grants:submissions:dead")
        .arg("grants:submissions:dead:index")
        .query::<()>(&mut conn)
        .unwrap();
    redis::cmd("XDEL")
        .arg("grants:submissions")
        .arg(&bad[2])
        .query::<()>(&mut conn)
        .unwrap();
    let out = world.run_ok(&["dlq", "reconcile"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("3 dead letters recorded in the ledger; 3 were missing")
            && stdout.contains("(1 without original fields)"),
        "{stdout}"
    );
    let letters = world.dead_letters();
    let originals: HashSet<String> = letters
        .iter()
        .map(|f| String::from_utf8(f["original_id"].clone()).unwrap())
        .collect();
    assert_eq!(originals, bad.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(letters.len(), 3);
    for f in &letters {
        assert_eq!(f["reason_code"], b"reconciled");
        assert!(
            String::from_utf8_lossy(&f["reason"]).contains("JSON"),
            "{f:?}"
        );
    }
    let with_payload = letters
        .iter()
        .filter(|f| f.contains_key("original.payload"))
        .count();
    assert_eq!(with_payload, 2);
    let again = world.run_ok(&["dlq", "reconcile"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("; 0 were missing"));
    assert_eq!(world.dead_letters().len(), 3);
}

/// `--redis-wait-replicas 1` against a Redis with no replica: `produce` adds the lines but
/// reports that no replica confirmed them (exit 1), never success.
#[test]
fn a_write_no_replica_confirms_is_reported_not_treated_as_success() {
    let world = World::new();
    let file = world.dir.path().join("lines.jsonl");
    std::fs::write(&file, submission(0)).unwrap();
    let out = world
        .cmd(&[
            "produce",
            file.to_str().unwrap(),
            "--redis-wait-replicas",
            "1",
            "--redis-wait-ms",
            "200",
        ])
        .run_with_deadline();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not confirmed on a replica")
            && stderr.contains("0 of 1 replicas confirmed the write within 200 ms"),
        "{stderr}"
    );
    assert_eq!(world.xlen("grants:submissions"), 1);
}

/// `--redis-wait-replicas 1` against a Redis with no replica: the relay adds its events, no
/// replica confirms them, and no retry marks them published. A retry finds them on the stream
/// (its last round wrote them) and once marked them unconfirmed; a failover to a replica that
/// never had them then lost them with their mark, and the relay refused to go on where it would
/// have published them again (the TLS failover test's flake, 1 run in 39 under load). Once a
/// replica has them, they are marked, and published once.
#[test]
fn events_no_replica_confirmed_are_not_marked_published_by_a_retry() {
    // 1. Five submissions paid.
    // 2. A relay waiting for 1 replica (200 ms) runs beside a Redis with none: the 5 events
    //    reach the stream and, 3 s of retries later, the ledger still reads 5 unpublished and
    //    the relay is alive and saying why.
    // 3. A replica starts: the 5 are marked; the stream holds each event once.
    let world = World::new();
    world.add(&(0..5).map(submission).collect::<Vec<_>>());
    world.drain(&[]);
    let unpublished =
        || world.sql_i64_once_made("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL");
    assert_eq!(unpublished(), 5);
    let mut relay = Logged::spawn(world.cmd(&[
        "relay",
        "--redis-wait-replicas",
        "1",
        "--redis-wait-ms",
        "200",
    ]));
    assert!(wait_for(Duration::from_secs(30), || world
        .xlen("grants:events")
        == 5));
    std::thread::sleep(Duration::from_secs(3));
    assert!(relay.alive(), "{}", relay.log_text());
    assert_eq!(
        unpublished(),
        5,
        "marked unconfirmed:\n{}",
        relay.log_text()
    );
    assert!(
        !relay
            .lines_with("0 of 1 replicas confirmed the write within 200 ms")
            .is_empty(),
        "{}",
        relay.log_text()
    );

    let replica = claimgate::support::localredis::LocalRedis::start(
        claimgate::support::localredis::Options {
            replica_of: Some(world.redis.port()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || unpublished() == 0),
        "{}",
        relay.log_text()
    );
    assert_eq!(world.xlen("grants:events"), 5);
    assert!(relay.stop().success());
    drop(replica);
}

/// A worker started behind Sentinel copies again the dead letters the ledger records but the
/// dead-letter stream lacks, before it reads.
#[test]
fn a_worker_started_behind_sentinel_restores_lost_dead_letters() {
    let cluster = Cluster::start();
    cluster.produce(&chunk(0), &[]);
    let drain = |c: &Cluster| {
        let out = c.cmd(&["run", "--exit-when-idle"]).run_with_deadline();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    drain(&cluster);
    let mut primary = cluster.primary();
    redis::cmd("DEL")
        .arg("grants:submissions:dead")
        .arg("grants:submissions:dead:index")
        .query::<()>(&mut primary)
        .unwrap();
    drain(&cluster);
    assert_dead_letters_once(&mut primary, 1);
    assert_eq!(cluster.world.count_once_made("disbursements"), 10);
}

/// The consumer groups of the submissions stream on the node at `port`, by name (none when
/// the node cannot be asked or has no stream: a node in the middle of a failover).
fn groups_on(port: u16) -> Vec<String> {
    let asked = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
        .and_then(|mut conn| {
            redis::cmd("XINFO")
                .arg("GROUPS")
                .arg("grants:submissions")
                .query::<Vec<HashMap<String, redis::Value>>>(&mut conn)
        });
    let Ok(groups) = asked else {
        return Vec::new();
    };
    groups
        .iter()
        .map(|g| match &g["name"] {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("group name {other:?}"),
        })
        .collect()
}

/// A promotion can lose the consumer group itself (created on the old primary after the
/// replica fell behind): the worker finds NOGROUP on the new primary, creates the group again
/// at 0 and reads everything again, and the ledger turns every entry it had already recorded
/// into a duplicate. The events stream and its mark are lost with it: the relay cannot know
/// whether consumers read those events, so it stops (exit 1) naming them, and an operator's
/// `--republish-from 1` publishes them again. Paid once to the cent, nothing pending, every
/// event and dead letter once.
#[test]
fn a_promotion_that_loses_the_consumer_group_replays_from_0_and_pays_nothing_twice() {
    // 1. Three chunks reach both nodes (produce WAITs for the replica); no group exists yet.
    // 2. The replica is frozen and cut off; a worker and a relay start: the group, every XACK,
    //    dead-letter copy and event exist on the old primary only.
    // 3. SIGKILL the primary, thaw the replica, wait for its promotion: it has no group.
    // 4. The worker recreates the group at 0 and replays: 30 duplicates; then check everything.
    let mut cluster = Cluster::start();
    for c in 0..3 {
        cluster.produce(&chunk(c), &[]);
    }
    let old = cluster.set.primary_port().unwrap();
    let old_index = cluster.set.node_on(old).unwrap();
    let replica = &cluster.set.nodes[1 - old_index];
    let (replica_port, replica_pid) = (replica.port(), replica.pid().unwrap());
    assert!(wait_for(Duration::from_secs(10), || repl_offset(
        replica_port,
        "slave_repl_offset"
    ) == repl_offset(
        old,
        "master_repl_offset"
    )));
    send(replica_pid, libc::SIGSTOP);
    cut_replicas(old);
    let no_wait = ["--redis-wait-replicas", "0"];
    let run = [&["run", "--claim-idle-ms", "1000"][..], &no_wait].concat();
    let mut worker = cluster.spawn(&run);
    let mut relay = cluster.spawn(&[&["relay"][..], &no_wait].concat());
    let drained = wait_for(Duration::from_secs(20), || {
        cluster.world.count_once_made("disbursements") == 30
            && cluster
                .world
                .sql_i64_once_made("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL")
                == 0
    });
    assert!(drained, "{}", worker.log_text());
    assert_eq!(groups_on(old), ["grant-workers"]);
    cluster.set.nodes[old_index].kill();
    send(replica_pid, libc::SIGCONT);
    assert!(
        wait_for(Duration::from_secs(30), || cluster
            .set
            .primary_port()
            .is_ok_and(|p| p == replica_port)),
        "no sentinel promoted the replica (logs in {})",
        cluster.set.dir().display()
    );
    cluster.set.rejoin(old_index, replica_port).unwrap();
    // The relay finds the ledger's 30 published events gone with the stream and its mark.
    let stopped = wait_for(SETTLE, || relay.child.try_wait().unwrap().is_some());
    assert!(stopped, "the relay did not stop:\n{}", relay.log_text());
    assert_eq!(relay.child.wait().unwrap().code(), Some(1));
    assert!(
        relay.log_text().contains(
            "the events stream and its mark are both gone (deleted, evicted, or a failover to a \
             replica that never had them)"
        ) && relay.log_text().contains("--republish-from 1 "),
        "{}",
        relay.log_text()
    );
    let mut relay = cluster.spawn(&[&["relay", "--republish-from", "1"][..], &no_wait].concat());
    assert_exactly_once(&cluster, 3, 0);
    assert!(
        wait_for(SETTLE, || cluster.world.sql_i64(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"
        ) == 30),
        "every recorded entry read again is a duplicate:\n{}",
        worker.log_text()
    );
    // The fault landed: the group had to be created again on the new primary.
    assert_eq!(
        worker.log_text().matches("created consumer group").count(),
        2,
        "{}",
        worker.log_text()
    );
    // On whichever node the sentinels now name: on a loaded machine they have been seen to
    // fail over a second time (a 1 s silence of the new primary), to the rejoined node, which
    // may not have had the group yet; the worker then creates it there too.
    let primary_has_group = wait_for(SETTLE, || {
        cluster
            .set
            .primary_port()
            .is_ok_and(|p| groups_on(p) == ["grant-workers"])
    });
    assert!(primary_has_group, "{}", worker.log_text());
    assert_alive(&mut worker, "worker");
    assert_alive(&mut relay, "relay");
}

/// After a failover the worker checks the dead letters again, without a restart: a dead
/// letter the new primary lacks (its stream deleted before a graceful failover, so the
/// promoted replica lacks it too) is copied again once, although its entry was acknowledged
/// long ago and will never be delivered again.
#[test]
fn a_worker_copies_lost_dead_letters_again_after_a_failover_it_lives_through() {
    // 1. A worker drains a chunk: ten paid, one dead letter, everything acknowledged.
    // 2. The dead-letter stream and its index are deleted; the deletion reaches the replica.
    // 3. SENTINEL FAILOVER promotes the replica; the worker follows it and, on its next turn,
    //    copies the dead letter again, once; the old primary rejoins as a replica.
    let cluster = Cluster::start();
    let mut worker = cluster.spawn(&["run"]);
    cluster.produce(&chunk(0), &[]);
    assert!(wait_for(SETTLE, || cluster
        .world
        .count_once_made("dead_letters")
        == 1
        && cluster.world.count_once_made("disbursements") == 10));
    let mut primary = cluster.primary();
    let old = cluster.set.primary_port().unwrap();
    redis::cmd("DEL")
        .arg("grants:submissions:dead")
        .arg("grants:submissions:dead:index")
        .query::<()>(&mut primary)
        .unwrap();
    let replicated: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query(&mut primary)
        .unwrap();
    assert_eq!(replicated, 1);
    let sentinel = cluster.set.sentinel_ports()[0];
    let client = redis::Client::open(format!("redis://127.0.0.1:{sentinel}")).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(claimgate::support::localsentinels::MASTER_NAME)
        .query::<()>(&mut conn)
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || cluster
            .set
            .primary_port()
            .is_ok_and(|p| p != old)),
        "no failover (logs in {})",
        cluster.set.dir().display()
    );
    let mut primary = cluster.primary();
    assert!(
        wait_for(SETTLE, || {
            let n: u64 = redis::cmd("XLEN")
                .arg("grants:submissions:dead")
                .query(&mut primary)
                .unwrap_or(0);
            n == 1
        }),
        "the dead letter was not copied again:\n{}",
        worker.log_text()
    );
    assert_dead_letters_once(&mut primary, 1);
    // The WARN comes once the reconciliation returns, just after the copy is visible.
    assert!(
        wait_for(SETTLE, || {
            let log = worker.log_text();
            log.contains("the redis primary changed: checking the dead letters")
                && log.contains("1 dead letters recorded in the ledger were missing")
        }),
        "{}",
        worker.log_text()
    );
    assert_alive(&mut worker, "worker");
}

/// The last command of every client connected to the data node whose plain port is `plain`,
/// by the port it connected to (`laddr`): `(local port, cmd)`.
fn clients_by_port(plain: u16) -> Vec<(u16, String)> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{plain}")).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
    list.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            };
            let port = field("laddr")?.rsplit_once(':')?.1.parse().ok()?;
            Some((port, field("cmd")?.to_owned()))
        })
        .collect()
}

/// `rediss+sentinel://`: the sentinels and the data nodes are reached over TLS, certificates
/// checked. A worker and a relay ride out a failover over TLS with every submission paid once;
/// with another certificate trusted instead, nothing connects and `status` says why.
#[test]
fn rediss_sentinel_urls_use_checked_tls_to_sentinels_and_primary_through_a_failover() {
    // 1. Primary, replica and three sentinels serve TLS with a certificate for 127.0.0.1 (plain
    //    ports stay open for this test's own checks); the sentinels name the TLS ports.
    // 2. A worker and a relay through rediss+sentinel:// with the certificate trusted; three
    //    chunks are paid. The worker's reads (read scripts: EVALSHA) are on the primary's TLS
    //    port, none on its plain port.
    // 3. SIGKILL the primary; the replica is promoted; three more chunks arrive.
    // 4. Everything settles exactly once; status names the new primary's TLS port; no
    //    process exited.
    // 5. Trusting another certificate instead, status reports the certificate refused.
    let mut cluster = Cluster::start_tls();
    assert!(cluster.set.url().starts_with("rediss+sentinel://"));
    let mut worker = cluster.spawn(&["run", "--claim-idle-ms", "1000"]);
    let mut relay = cluster.spawn(&["relay"]);
    for c in 0..3 {
        cluster.produce(&chunk(c), &[]);
    }
    assert!(
        wait_for(SETTLE, || cluster.world.count_once_made("disbursements")
            == 30),
        "{}",
        worker.log_text()
    );
    let old = cluster.set.primary_port().unwrap();
    let node = &cluster.set.nodes[cluster.set.node_on(old).unwrap()];
    assert_eq!(node.tls_port(), Some(old), "the sentinels name TLS ports");
    let plain = node.port();
    assert!(
        wait_for(Duration::from_secs(10), || clients_by_port(plain)
            .contains(&(old, "evalsha".to_owned()))),
        "no read on the TLS port: {:?}",
        clients_by_port(plain)
    );
    assert!(
        !clients_by_port(plain).contains(&(plain, "evalsha".to_owned())),
        "a read on the plain port"
    );

    let new = fail_over(&mut cluster.set);
    for c in 3..6 {
        cluster.produce(&chunk(c), &[]);
    }
    assert_exactly_once(&cluster, 6, 0);
    assert_alive(&mut worker, "worker");
    assert_alive(&mut relay, "relay");
    assert_status_names_primary(&cluster, new);

    let out = cluster
        .cmd(&["status", "--json"])
        .env(
            "SSL_CERT_FILE",
            cluster.world.dir.path().join("stranger.pem"),
        )
        .run_with_deadline();
    status_refusing_the_certificate(&out);
}

/// A "sentinel" that accepts connections and never answers (a host that is up but hung),
/// counting the connections made to it.
struct Unanswering {
    /// Its port.
    port: u16,
    /// Connections accepted so far.
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Unanswering {
    fn start() -> Unanswering {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming().flatten() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(conn);
            }
        });
        Unanswering { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A sentinel that accepts connections and never replies is asked once, not by every
/// connection: once its ask times out, the sentinel that answered is asked first. Shown by
/// counting the connections the hung sentinel receives while every connection of a worker is
/// dropped and made again.
#[test]
fn a_sentinel_that_never_answers_is_not_asked_again_by_every_reconnection() {
    // 1. The worker's URL names a hung sentinel first, then the three real ones.
    // 2. The worker starts and pays a chunk; count the connections the hung one received
    //    (its first connections all ask it, and wait out the timeout).
    // 3. Twice, the primary drops every client connection (CLIENT KILL TYPE normal): every
    //    connection of the worker reconnects through the sentinels. Then another chunk.
    // 4. Paid; the hung sentinel received no connection since step 2.
    let cluster = Cluster::start();
    let hung = Unanswering::start();
    let url = cluster.set.url().replacen(
        "redis+sentinel://",
        &format!("redis+sentinel://127.0.0.1:{},", hung.port),
        1,
    );
    let mut worker = cluster.spawn_at(&url, &["run", "--claim-idle-ms", "1000"]);
    cluster.produce(&chunk(0), &[]);
    assert!(
        wait_for(SETTLE, || cluster.world.count_once_made("disbursements")
            == 10),
        "{}",
        worker.log_text()
    );
    let before = hung.accepted();
    assert!(before >= 1, "the worker never asked the hung sentinel");
    for _ in 0..2 {
        let dropped: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut cluster.primary())
            .unwrap();
        assert!(dropped >= 1, "the worker had no connection to drop");
        std::thread::sleep(Duration::from_millis(300));
    }
    cluster.produce(&chunk(1), &[]);
    assert!(
        wait_for(SETTLE, || cluster.world.count_once_made("disbursements")
            == 20),
        "{}",
        worker.log_text()
    );
    assert_alive(&mut worker, "worker");
    assert_eq!(
        hung.accepted(),
        before,
        "reconnections asked the hung sentinel again:\n{}",
        worker.log_text()
    );
}

/// `claimgate ARGS` at `url` through `cluster` (its certificate trusted), within 60 s (a
/// configuration error must not be retried for ever): exit code and stdout and stderr.
fn run_at(cluster: &Cluster, url: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = cluster
        .cmd(args)
        .env("REDIS_URL", url)
        .run_within(Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Sentinels with `requirepass` and data nodes with another password, over plain TCP or TLS:
/// the documented URL reaches them; without the sentinels' password, with a wrong one, or with
/// a wrong data-node password, every command stops at once with exit 2 and one line naming
/// who refused and the URL form, never a password.
fn passwords_on_sentinels_and_data_nodes(tls: bool) {
    // 1. Data nodes with requirepass, sentinels with requirepass of their own.
    // 2. produce, run and status through redis+sentinel://:DATA@…/MASTER?sentinel_password=S:
    //    10 paid; status shows the URL's shape with both passwords hidden.
    // 3. The same URL without ?sentinel_password, with a wrong one, and with a wrong data-node
    //    password: run and status exit 2 within seconds (before issue 39: retried for ever),
    //    naming the sentinel or the primary that refused.
    const DATA_PW: &str = "data-pw-6f1c";
    const SENTINEL_PW: &str = "sentinel-pw-93ab";
    let cluster = Cluster::start_with(
        tls,
        Passwords {
            data: Some(DATA_PW.into()),
            sentinel: Some(SENTINEL_PW.into()),
        },
    );
    let url = cluster.set.url();
    assert!(url.contains("?sentinel_password="), "{url}");
    cluster.produce(&chunk(0), &[]);
    let (code, text) = run_at(&cluster, &url, &["run", "--exit-when-idle"]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(cluster.world.count("disbursements"), 10);
    let (code, text) = run_at(&cluster, &url, &["status"]);
    assert_eq!(code, Some(0), "{text}");
    let scheme = if tls { "rediss" } else { "redis" };
    assert!(
        text.contains(&format!("{scheme}+sentinel://:***@127.0.0.1:"))
            && text.contains("/claimgate-primary?sentinel_password=***"),
        "{text}"
    );

    let without = url.split('?').next().unwrap().to_owned();
    let wrong_sentinel = url.replace(SENTINEL_PW, "not-the-sentinel-pw");
    let wrong_data = url.replace(DATA_PW, "not-the-data-pw");
    for (bad, said) in [
        (
            &without,
            "wants a password (NOAUTH) and --redis-url gives it none",
        ),
        (
            &wrong_sentinel,
            "refused the user or password --redis-url gives it",
        ),
        (
            &wrong_data,
            "refused the user or password --redis-url gives it",
        ),
    ] {
        let who = if bad == &wrong_data {
            "redis at 127.0.0.1:"
        } else {
            "sentinel at 127.0.0.1:"
        };
        for args in [&["run", "--exit-when-idle"][..], &["status"][..]] {
            let (code, text) = run_at(&cluster, bad, args);
            assert_eq!(code, Some(2), "{args:?} at {bad}: {text}");
            let last = text.lines().last().unwrap_or("");
            assert!(
                last.contains(who) && last.contains(said),
                "{args:?}: {text}"
            );
            for secret in [
                DATA_PW,
                SENTINEL_PW,
                "not-the-sentinel-pw",
                "not-the-data-pw",
            ] {
                assert!(!text.contains(secret), "{secret} shown: {text}");
            }
        }
    }
}

#[test]
fn sentinels_and_data_nodes_with_passwords_are_reached_and_a_refusal_is_exit_2() {
    passwords_on_sentinels_and_data_nodes(false);
}

#[test]
fn tls_sentinels_and_data_nodes_with_passwords_are_reached_and_a_refusal_is_exit_2() {
    passwords_on_sentinels_and_data_nodes(true);
}

/// `#insecure` asked for TLS without checking certificates, which this build cannot do (it
/// was documented; behind Sentinel it was retried for ever): refused at once, exit 2, one line
/// naming what to do instead, the URL shown in its own shape (`…/MASTER#insecure`, not
/// `…/MASTER?***`) without its password.
#[test]
fn an_insecure_tls_url_is_refused_as_configuration_showing_its_shape() {
    let cluster = Cluster::start_tls();
    let tls_url = cluster.set.url();
    let sentinel =
        tls_url.replacen("rediss+sentinel://", "rediss+sentinel://:s3cret-pw@", 1) + "#insecure";
    let primary = cluster.set.nodes[0].tls_port().unwrap();
    let plain = format!("rediss://:s3cret-pw@127.0.0.1:{primary}/#insecure");
    for url in [&sentinel, &plain] {
        for args in [&["run", "--exit-when-idle"][..], &["status"][..]] {
            let (code, text) = run_at(&cluster, url, args);
            assert_eq!(code, Some(2), "{args:?} at {url}: {text}");
            assert_eq!(text.lines().count(), 1, "{text}");
            assert!(
                text.contains(
                    "#insecure (TLS without checking the server's certificate) is not supported"
                ),
                "{text}"
            );
            assert!(text.contains("SSL_CERT_FILE"), "{text}");
            assert!(
                !text.contains("s3cret-pw") && !text.contains("?***"),
                "{text}"
            );
            assert!(text.contains(":***@"), "{text}");
        }
    }
    let (_, text) = run_at(&cluster, &sentinel, &["status"]);
    assert!(text.contains("/claimgate-primary#insecure"), "{text}");
}
