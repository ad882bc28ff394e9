//! The shared PostgreSQL ledger, end to end, where it differs from SQLite: bad URLs, TLS,
//! every command against a PostgreSQL URL, a server restarted under a running worker, migrate,
//! and retention's purge batches there. The suites that run on both backends are in
//! `worker.rs`, `resilience.rs`, `relay.rs`, `audit.rs`, `contract.rs` and `chaos/` (three
//! workers and two relays on one database through kills, failpoints and server restarts).

use crate::ops::http_get;
use crate::support::{
    self, amount_sum, signal, submission, wait_exit, wait_for, RunWithDeadline, Store, World,
};
use claimgate::support::localredis::free_port;
use std::time::Duration;

/// What format 5 had of the audit tables (keys and digests as hex text), to take a ledger of
/// this release back to it, or, with another fixture after it, to an earlier format.
const V5_AUDIT: &str = include_str!("fixtures/schema-postgres-v5-audit.sql");

/// Runs `claimgate ARGS --db URL` and returns (exit code, stderr).
fn with_db(w: &World, args: &[&str], url: &str) -> (Option<i32>, String) {
    let mut all = args.to_vec();
    all.extend(["--db", url]);
    let out = w.run(&all);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_wrong_password_or_a_missing_database_exits_2_without_showing_the_password() {
    // Every command that opens the ledger: exit 2, one clear line, the password never echoed.
    let w = World::on(Store::Postgres);
    let good = w.db.to_str().unwrap().to_owned();
    let (base, _) = good.rsplit_once('/').unwrap();
    let user_and_host = base.split_once('@').unwrap().1;
    let wrong_pw = format!("postgres://claimgate:s3cret-wrong-pw@{user_and_host}/postgres");
    let password = good
        .split_once("claimgate:")
        .unwrap()
        .1
        .split_once('@')
        .unwrap()
        .0;
    let missing_db = format!("{base}/no_such_ledger");
    let commands: [&[&str]; 6] = [
        &["status"],
        &["verify"],
        &["hold", "list"],
        &["audit", "verify"],
        &["run", "--exit-when-idle"],
        &["relay", "--exit-when-idle"],
    ];
    for command in commands {
        let (code, stderr) = with_db(&w, command, &wrong_pw);
        assert_eq!(code, Some(2), "{command:?}: {stderr}");
        assert!(
            stderr.contains("refused the user name or password")
                && !stderr.contains("s3cret-wrong-pw"),
            "{command:?}: {stderr}"
        );
        let (code, stderr) = with_db(&w, command, &missing_db);
        assert_eq!(code, Some(2), "{command:?}: {stderr}");
        assert!(
            stderr.contains("does not exist") && !stderr.contains(password),
            "{command:?}: {stderr}"
        );
    }
    // sslmode=require without a CA file trusts nothing: refused before connecting.
    let (code, stderr) = with_db(&w, &["status"], &format!("{good}?sslmode=require"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("sslrootcert") && !stderr.contains(password),
        "{stderr}"
    );
}

#[test]
fn every_command_works_against_a_postgres_ledger() {
    // 1. Queue 60 submissions, 10 resent, one malformed; drain with `run`, publish with `relay`.
    // 2. status --json, verify, audit export/verify, hold add/list/remove (one hold_added and
    //    one hold_removed record, chained: verify passes), retention purge (nothing three
    //    years old: nothing removed) all succeed and agree with SQL.
    // 3. backup says to use pg_dump, restore to use pg_restore, exit 2, nothing changed.
    let w = World::on(Store::Postgres);
    let payloads: Vec<String> = (0..60).map(submission).collect();
    w.add(&payloads);
    w.add(&payloads[..10]);
    w.add_fields(&[("payload", b"not json")]);
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.count("disbursements"), 60);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(60)
    );
    assert_eq!(w.count("dead_letters"), 1);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0
    );
    assert_eq!(w.xlen("grants:events"), 60);

    let status = w.run_ok(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["ledger"]["claims"], 60);
    assert_eq!(v["ledger"]["disbursed_cents_total"], amount_sum(60));
    assert_eq!(v["ledger"]["duplicates_suppressed"], 10);
    assert_eq!(v["ledger"]["dead_letters"], 1);
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        !shown.contains(&password_of(&w)),
        "status shows the password: {shown}"
    );

    let verify = w.run_ok(&["verify"]);
    assert!(
        String::from_utf8_lossy(&verify.stdout).contains("71"),
        "71 audit records"
    );
    let export = w.dir.path().join("audit.jsonl");
    w.run_ok(&["audit", "export", "--out", export.to_str().unwrap()]);
    // Every record, and after each batch of them its link (a seal, not a record).
    let exported = std::fs::read_to_string(&export).unwrap();
    let records = exported
        .lines()
        .filter(|l| !l.contains(r#""kind":"batch""#))
        .count();
    assert_eq!(records as i64, w.count("audit_log"));
    assert!(
        exported.lines().count() > records,
        "the batches' links are exported"
    );
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["audit", "verify", "--file", export.to_str().unwrap()]);

    w.run_ok(&["hold", "add", "A-000001", "--reason", "case 7"]);
    let held = w.run_ok(&["hold", "list"]);
    assert!(String::from_utf8_lossy(&held.stdout).contains("A-000001"));
    assert_eq!(w.count("legal_holds"), 1);
    w.run_ok(&["hold", "remove", "A-000001"]);
    assert_eq!(w.count("legal_holds"), 0);
    for kind in ["hold_added", "hold_removed"] {
        let sql = format!(
            "SELECT COUNT(*) FROM audit_log WHERE kind = '{kind}' AND award_id = 'A-000001'"
        );
        assert_eq!(w.sql_i64(&sql), 1, "{kind}");
    }
    assert_eq!(w.count("audit_log"), 73);
    w.run_ok(&["verify"]);

    let purge_export = w.dir.path().join("purge.jsonl");
    w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2020-01-01",
        "--export",
        purge_export.to_str().unwrap(),
    ]);
    assert_eq!(w.count("audit_log"), 73, "nothing was old enough to purge");

    let out = w.run(&["backup", w.dir.path().join("b.db").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("pg_dump") && !stderr.contains(&password_of(&w)),
        "{stderr}"
    );
    let out = w.run(&["restore", w.dir.path().join("b.db").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("pg_restore") && !stderr.contains(&password_of(&w)),
        "{stderr}"
    );
    assert_eq!(w.count("audit_log"), 73, "restore changed nothing");
}

/// The password in a world's PostgreSQL URL.
fn password_of(w: &World) -> String {
    let url = w.db.to_str().unwrap();
    url.split_once("claimgate:")
        .unwrap()
        .1
        .split_once('@')
        .unwrap()
        .0
        .to_owned()
}

#[test]
fn postgres_restarted_under_a_running_worker_is_waited_out_and_everything_lands_once() {
    // 1. A cluster of the test's own; a worker running against it with /healthz served; 300
    //    submissions processed and /healthz 200.
    // 2. PostgreSQL stopped at once (immediate shutdown: connections cut, no checkpoint) while
    //    300 more arrive: /healthz turns 503 naming the ledger, and only the ledger (Redis
    //    answers, the worker loop goes round), and the worker is still up.
    // 3. PostgreSQL started again: /healthz is 200 again.
    // 4. The worker retries and finishes: 600 disbursements exactly, each paid once, nothing
    //    pending, the chain verifies.
    let mut pg = crate::pg::own_cluster();
    let url = pg.create_database("restart").unwrap();
    let w = World::on_postgres_url(&url);
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut worker =
        support::Logged::spawn(w.cmd(&["run", "--consumer", "w1", "--metrics-addr", &addr]));
    w.add(&(0..300).map(submission).collect::<Vec<_>>());
    // The worker makes the schema as it starts: polled as 0 until it has.
    assert!(
        wait_for(Duration::from_secs(60), || w
            .count_once_made("disbursements")
            == 300),
        "{}",
        worker.log_text()
    );
    assert_eq!(http_get(&addr, "/healthz").map(|r| r.0), Some(200));

    pg.stop_immediate().unwrap();
    w.add(&(300..600).map(submission).collect::<Vec<_>>());
    // The ledger's ping waits out the pool's connection timeout before it fails, so the first
    // answers after the stop may still be 200; the wait is bounded, the answer is not timed.
    let mut down = None;
    assert!(
        wait_for(Duration::from_secs(60), || {
            down = http_get(&addr, "/healthz");
            matches!(&down, Some((503, _)))
        }),
        "/healthz stayed {down:?} with the ledger down\n{}",
        worker.log_text()
    );
    let (_, body) = down.unwrap();
    assert!(body.contains("ledger: "), "{body}");
    assert!(
        !body.contains("redis") && !body.contains("has not gone round"),
        "only the ledger is down: {body}"
    );
    assert!(
        !body.contains(&password_of(&w)),
        "the ledger's password stays out of /healthz: {body}"
    );
    assert!(worker.alive(), "the worker waits; it does not exit");
    pg.start_again().unwrap();
    assert!(
        wait_for(Duration::from_secs(60), || http_get(&addr, "/healthz")
            .map(|r| r.0)
            == Some(200)),
        "/healthz did not recover once the ledger was back\n{}",
        worker.log_text()
    );

    assert!(
        wait_for(Duration::from_secs(90), || w.count("disbursements") == 600
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(600)
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'"),
        600
    );
    w.run_ok(&["verify"]);
}

#[test]
fn connections_postgres_terminates_under_a_running_worker_are_retried_and_everything_lands_once() {
    // What an operator's pg_terminate_backend, a pooler's restart or a failover does to the
    // worker's pooled connections: each dies with 57P01 (admin shutdown), and a later use of
    // it finds it closed. Both are transient: the batch is retried on a fresh connection.
    // 1. A worker on the shared cluster; 500 submissions arrive in five waves of 100, each
    //    paid before the next is sent.
    // 2. Before each wave after the first, every connection to the worker's database but the
    //    test's own is terminated (pg_terminate_backend): the pool's connections all die.
    // 3. All 500 are paid once (count and sum), nothing is pending, the worker is still up,
    //    and the ledger verifies.
    let w = World::on(Store::Postgres);
    let mut worker =
        support::Logged::spawn(w.cmd(&["run", "--consumer", "t1", "--claim-idle-ms", "600000"]));
    worker.wait_log("worker t1 reading");
    let url = w.db.to_str().unwrap().split('?').next().unwrap().to_owned();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    for wave in 0..5 {
        if wave > 0 {
            let killed: i64 = admin
                .query_one(
                    "SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid))
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    &[],
                )
                .unwrap()
                .get(0);
            assert!(killed >= 1, "wave {wave}: the worker holds a connection");
        }
        w.add(
            &(100 * wave..100 * (wave + 1))
                .map(submission)
                .collect::<Vec<_>>(),
        );
        assert!(
            wait_for(Duration::from_secs(60), || w
                .count_once_made("disbursements")
                == 100 * (wave as i64 + 1)),
            "wave {wave}\n{}",
            worker.log_text()
        );
    }
    assert!(
        wait_for(Duration::from_secs(90), || w.count("disbursements") == 500
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(worker.alive(), "{}", worker.log_text());
    assert!(worker.stop().success());
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(500)
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'"),
        500
    );
    w.run_ok(&["verify"]);
}

#[test]
fn migrate_copies_a_sqlite_ledger_with_its_chain_head_and_refuses_a_non_empty_target() {
    // 1. A SQLite ledger with every kind of row: 30 submissions (5 resent), two malformed
    //    entries, a conflicting resubmission, a legal hold (and its hold_added record), the
    //    first 8 records purged (a checkpoint, and tombstones of the claims it removed),
    //    published and unpublished outbox rows.
    // 2. migrate --to an empty PostgreSQL database: both verify, same counts, same chain head,
    //    same published states.
    // 3. The source is fenced: migrate, run and relay on it exit 2 naming the target; verify
    //    still reads it. Another ledger migrated into the same target is refused (exit 2),
    //    nothing changed, and that ledger is not fenced.
    // 4. A worker on the PostgreSQL ledger chains new records after the copied head.
    // 5. The purged submissions sent again to it are duplicates citing their copied
    //    tombstones: nothing claimed or paid again.
    let w = World::new();
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.add_fields(&[("payload", b"[]")]);
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    crate::audit::backdate(&w, 8, "2019-03-01T12:00:00.000000Z");
    let export = w.dir.path().join("purge.jsonl");
    w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2020-01-01",
        "--export",
        export.to_str().unwrap(),
    ]);
    w.add(&(20..30).map(submission).collect::<Vec<_>>());
    w.add(&[r#"{"award_id":"A-000021","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":999}"#.to_owned()]);
    w.add_fields(&[("nothing", b"x")]);
    w.drain(&[]);
    w.run_ok(&["hold", "add", "A-000003", "--reason", "audit 12"]);
    // One unpublished event stored in another spelling of the same payment (verify reads it
    // as that payment): migrate keeps it as stored; every other event is its claim's, and
    // PostgreSQL stores none of those.
    let respelled_id = w.sql_i64("SELECT MAX(id) FROM outbox");
    w.sql().exec(&format!(
        "UPDATE outbox SET payload = replace(payload, ',\"award_id\"', ', \"award_id\"')
         WHERE id = {respelled_id}"
    ));
    let respelled = w.sql_text(&format!(
        "SELECT payload FROM outbox WHERE id = {respelled_id}"
    ));
    assert!(respelled.contains(", \"award_id\""), "{respelled}");
    let source = String::from_utf8_lossy(&w.run_ok(&["verify"]).stdout).into_owned();
    let head = |text: &str| {
        text.split("(head ")
            .nth(1)
            .unwrap()
            .split(')')
            .next()
            .unwrap()
            .to_owned()
    };
    assert!(w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'checkpoint'") == 1);
    assert!(w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'") == 1);
    let tombstones = w.count("claim_tombstones");
    assert!(tombstones > 0, "the purge removed claims");

    let url = crate::pg::fresh_database();
    let out = w.run_ok(&["migrate", "--to", &url]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&head(&source)), "{said}");
    let pg = World::on_postgres_url(&url);
    let copied = String::from_utf8_lossy(&pg.run_ok(&["verify"]).stdout).into_owned();
    assert_eq!(head(&copied), head(&source));
    assert_eq!(pg.count("claim_tombstones"), tombstones);
    assert_counts_are_the_rows(&url);
    // The copy was analysed: the planner knows the claims' table's size (-1: never analysed,
    // and a first read planned blind, JIT-compiled on a large ledger).
    assert_eq!(
        pg.sql_i64(
            "SELECT reltuples::int8 FROM pg_class WHERE oid = 'processed_messages'::regclass"
        ),
        pg.count("processed_messages")
    );
    for sql in [
        "SELECT COUNT(*) FROM processed_messages",
        "SELECT SUM(amount_cents) FROM disbursements",
        "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL",
        "SELECT MAX(id) FROM outbox",
        "SELECT COUNT(*) FROM dead_letters",
        "SELECT COUNT(*) FROM audit_log",
        "SELECT MIN(seq) FROM audit_log",
        "SELECT COUNT(*) FROM legal_holds",
        "SELECT COUNT(*) FROM claim_tombstones",
        "SELECT COUNT(*) FROM audit_log WHERE kind = 'hold_added'",
    ] {
        assert_eq!(pg.sql_i64(sql), w.sql_i64(sql), "{sql}");
    }
    assert_eq!(
        pg.sql_text("SELECT string_agg(id::text, ' ') FROM outbox_rows WHERE payload IS NOT NULL"),
        respelled_id.to_string(),
        "only the event its claim does not spell is stored"
    );
    assert_eq!(
        pg.sql_text(&format!(
            "SELECT payload FROM outbox WHERE id = {respelled_id}"
        )),
        respelled
    );

    assert!(
        said.contains("is fenced") && !said.contains(&password_of(&pg)),
        "{said}"
    );
    // The source is fenced: a second migrate, run and relay refuse it naming the target,
    // without its password; reading it still works.
    for args in [
        &["migrate", "--to", url.as_str()][..],
        &["run", "--exit-when-idle"],
        &["relay", "--exit-when-idle"],
    ] {
        let again = w.run(args);
        let stderr = String::from_utf8_lossy(&again.stderr);
        assert_eq!(again.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("was migrated to postgres://claimgate:***@")
                && !stderr.contains(&password_of(&pg)),
            "{stderr}"
        );
    }
    w.run_ok(&["verify"]);
    // Another SQLite ledger into the same, now non-empty, target: refused, nothing written.
    let other = World::new();
    other.add(&[submission(99)]);
    other.drain(&[]);
    let again = other.run(&["migrate", "--to", &url]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not empty") && !stderr.contains(&password_of(&pg)),
        "{stderr}"
    );
    other.run_ok(&["run", "--exit-when-idle"]);
    assert_eq!(
        pg.sql_i64("SELECT COUNT(*) FROM audit_log"),
        w.sql_i64("SELECT COUNT(*) FROM audit_log")
    );

    let records = pg.count("audit_log");
    pg.add(&(40..45).map(submission).collect::<Vec<_>>());
    pg.drain(&[]);
    assert_eq!(pg.count("audit_log"), records + 5);
    pg.run_ok(&["verify"]);
    // This world's Redis is not the one the SQLite ledger's events went to: its events stream
    // is empty while the ledger says ids 1..=20 were published, which the relay refuses to
    // guess about (issue 39). Those events are on the other Redis: they are left out.
    let refused = pg.run(&["relay", "--exit-when-idle"]);
    assert_eq!(refused.status.code(), Some(1));
    pg.run_ok(&["relay", "--exit-when-idle", "--republish-from", "21"]);
    assert_eq!(
        pg.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0
    );

    let (claims, paid) = (pg.count("processed_messages"), pg.count("disbursements"));
    pg.add(&(0..20).map(submission).collect::<Vec<_>>());
    pg.drain(&[]);
    assert_eq!(
        pg.count("processed_messages"),
        claims,
        "nothing claimed again"
    );
    assert_eq!(pg.count("disbursements"), paid, "nothing paid again");
    assert_eq!(
        pg.sql_i64(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'
             AND detail LIKE '%(tombstone)'"
        ),
        tombstones,
        "each purged submission cites its tombstone"
    );
    pg.run_ok(&["verify"]);
    assert_counts_are_the_rows(&url);
}

#[test]
fn retention_on_postgres_purges_a_prefix_in_batches_and_the_chain_goes_on() {
    // 1. 20 submissions and a malformed entry on PostgreSQL, published; the first 9 records
    //    backdated to 2019.
    // 2. A held award in the prefix refuses the purge (nothing removed); lifted, the purge runs
    //    in batches of 4: records, claims, disbursements, outbox rows and the dead letter in
    //    the prefix are gone, one checkpoint is left, verify and audit verify pass.
    // 3. New work chains on after the checkpoint; verify passes again.
    let w = World::on(Store::Postgres);
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.add_fields(&[("payload", b"[]")]);
    w.add(&(5..20).map(submission).collect::<Vec<_>>());
    w.drain(&crate::audit::ONE_PER_BATCH);
    w.run_ok(&["relay", "--exit-when-idle"]);
    crate::audit::backdate(&w, 9, "2019-03-01T12:00:00.000000Z");
    w.run_ok(&["verify"]);
    let export = w.dir.path().join("purge.jsonl");
    let purge = |file: &std::path::Path| {
        w.run(&[
            "retention",
            "purge",
            "--before",
            "2020-01-01",
            "--batch-records-max",
            "4",
            "--export",
            file.to_str().unwrap(),
        ])
    };
    w.run_ok(&["hold", "add", "A-000002"]);
    let refused = purge(&w.dir.path().join("refused.jsonl"));
    assert!(!refused.status.success(), "a held award refuses the purge");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("A-000002"));
    // 21 records of work and the hold's own `hold_added` record.
    assert_eq!(w.count("audit_log"), 22, "a refused purge deletes nothing");
    w.run_ok(&["hold", "remove", "A-000002"]);

    let out = purge(&export);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        w.count("audit_log"),
        23 - 9 + 1,
        "nine records out, one checkpoint in (the two hold records are recent: kept)"
    );
    assert_eq!(w.sql_i64("SELECT MIN(seq) FROM audit_log"), 9);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'checkpoint'"),
        1
    );
    assert_eq!(
        w.count("processed_messages"),
        12,
        "eight claims went with their records"
    );
    assert_eq!(w.count("disbursements"), 12);
    assert_eq!(w.count("outbox"), 12);
    assert_eq!(w.count("dead_letters"), 0);
    let exported = std::fs::read_to_string(&export).unwrap();
    assert_eq!(
        exported
            .lines()
            .filter(|l| l.contains("\"audit_log\"") && !l.contains(r#""kind":"batch""#))
            .count(),
        9
    );
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    let url = w.db.to_str().unwrap().to_owned();
    assert_eq!(w.count("claim_tombstones"), 8);
    assert_counts_are_the_rows(&url);

    w.add(&(20..25).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_counts_are_the_rows(&url);
    assert_eq!(w.sql_i64("SELECT MAX(seq) FROM audit_log"), 28);
    assert_eq!(
        w.sql_i64("SELECT MAX(id) FROM outbox"),
        25,
        "outbox ids are not reused"
    );
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
}

#[test]
fn tls_with_sslrootcert_works_and_a_certificate_it_does_not_trust_is_exit_2() {
    // 1. A cluster of the test's own speaking TLS with a certificate for 127.0.0.1.
    // 2. sslmode=require&sslrootcert=<that certificate>: run drains 20 submissions, status
    //    and verify pass; the server saw the connections as TLS.
    // 3. sslrootcert=<another certificate>: exit 2 naming TLS, the password never shown.
    let dir = tempfile::tempdir().unwrap();
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let cert = dir.path().join("ca.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    let stranger = dir.path().join("stranger.pem");
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    std::fs::write(&stranger, other.cert.pem()).unwrap();
    let pg = claimgate::support::localpostgres::LocalPostgres::start_with_tls(Some((
        &certified.cert.pem(),
        &certified.signing_key.serialize_pem(),
    )))
    .unwrap();
    let url = pg.create_database("tls").unwrap();
    let with_ca =
        |ca: &std::path::Path| format!("{url}?sslmode=require&sslrootcert={}", ca.display());
    let w = World::on_postgres_url(&with_ca(&cert));
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 20);
    w.run_ok(&["status"]);
    w.run_ok(&["verify"]);
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let tls_seen: i64 = admin
        .query_one("SELECT COUNT(*) FROM pg_stat_ssl WHERE ssl", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        tls_seen, 0,
        "this admin connection is plain, so the check can fail"
    );
    let mut tls_client = w.cmd(&["relay"]).spawn().unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || admin
            .query_one("SELECT COUNT(*) FROM pg_stat_ssl WHERE ssl", &[])
            .unwrap()
            .get::<_, i64>(0)
            > 0),
        "a relay connected over TLS"
    );
    signal(&tls_client, libc::SIGTERM);
    assert!(wait_exit(&mut tls_client, Duration::from_secs(30)).success());

    let (code, stderr) = with_db(&w, &["status"], &with_ca(&stranger));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("TLS") && !stderr.contains(pg.password()),
        "{stderr}"
    );
}

/// The one number `sql` answers with.
fn count(client: &mut postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).unwrap().get(0)
}

/// The SQLSTATE of a statement `client` refuses (None if it succeeds).
fn refusal(client: &mut postgres::Client, sql: &str) -> Option<String> {
    client
        .batch_execute(sql)
        .err()
        .map(|e| e.code().map(|c| c.code().to_owned()).unwrap_or_default())
}

/// A claim (id 900001), its disbursement and outbox row, as a hand-made writer would insert
/// them; the outbox id is out of the chain head's range, which does not matter here.
const ONE_PAID_CLAIM: &str = "
    INSERT INTO processed_messages (claim_id, idempotency_key, award_id, submission_timestamp,
        amount_cents, claimed_at, stream_entry_id, consumer, submission_instant)
    VALUES (900001, decode(repeat('ab', 32), 'hex'), 'AWD-FK', '2026-01-01T00:00:00Z', 100,
        '2026-01-01T00:00:00.000000Z', '1-1', 'hand', '2026-01-01T00:00:00.000000Z');
    INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents, recorded_at)
    VALUES (900001, decode(repeat('ab', 32), 'hex'), 'AWD-FK', 100, '2026-01-01T00:00:00.000000Z');
    INSERT INTO outbox_rows (id, claim_id, event_type, payload, created_at)
    VALUES (900001, 900001, 'disbursement.recorded', '{}', '2026-01-01T00:00:00.000000Z')";

/// What the schema's statement triggers must refuse, with the foreign-key SQLSTATE, on a
/// ledger at `url`: rows naming no claim, and a claim deleted or renumbered under its rows.
fn assert_rows_are_held_to_claims(url: &str) {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.batch_execute(ONE_PAID_CLAIM).unwrap();
    let fk = Some("23503".to_owned());
    let orphans = [
        "INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents, recorded_at)
         VALUES (777, decode(repeat('cd', 32), 'hex'), 'AWD-FK', 5, 'x')",
        "INSERT INTO outbox_rows (id, claim_id, event_type, payload, created_at)
         VALUES (900002, 777, 'disbursement.recorded', '{}', 'x')",
        "UPDATE disbursements SET claim_id = 777 WHERE claim_id = 900001",
        "UPDATE outbox_rows SET claim_id = 777 WHERE claim_id = 900001",
        "DELETE FROM processed_messages WHERE claim_id = 900001",
        "UPDATE processed_messages SET claim_id = 900009 WHERE claim_id = 900001",
    ];
    for sql in orphans {
        assert_eq!(refusal(&mut c, sql), fk, "{sql}");
    }
    // The batch writes outbox rows by COPY: the same refusal there.
    let mut copy = c
        .copy_in("COPY outbox_rows (id, claim_id, event_type, payload, created_at) FROM STDIN")
        .unwrap();
    std::io::Write::write_all(&mut copy, b"900003\t777\tdisbursement.recorded\t{}\tx\n").unwrap();
    let refused = copy.finish().unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("23503"), "{refused}");
    // Nothing of the refused statements stayed; what a purge does (rows first, then the claim,
    // in one transaction) and a relay's publish still go through.
    assert_eq!(
        count(
            &mut c,
            "SELECT COUNT(*) FROM disbursements WHERE claim_id = 900001"
        ),
        1
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT COUNT(*) FROM disbursements WHERE claim_id = 777"
        ),
        0
    );
    assert_eq!(
        count(&mut c, "SELECT COUNT(*) FROM outbox WHERE claim_id = 777"),
        0
    );
    c.batch_execute("UPDATE outbox_rows SET published_at = 'now' WHERE claim_id = 900001")
        .unwrap();
    c.batch_execute(
        "BEGIN; DELETE FROM outbox_rows WHERE claim_id = 900001;
         DELETE FROM disbursements WHERE claim_id = 900001;
         DELETE FROM processed_messages WHERE claim_id = 900001; COMMIT",
    )
    .unwrap();
    assert_eq!(
        count(
            &mut c,
            "SELECT COUNT(*) FROM processed_messages WHERE claim_id = 900001"
        ),
        0
    );
}

/// Copies every claim with its key, award and instant (raw SQL, outside claimgate): the
/// SQLSTATE the database answers with.
fn second_claim_refusal(url: &str) -> Option<String> {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    refusal(
        &mut c,
        "INSERT INTO processed_messages (idempotency_key, award_id, submission_timestamp,
             amount_cents, claimed_at, stream_entry_id, consumer, submission_instant)
         SELECT idempotency_key, award_id, submission_timestamp, amount_cents, 'now', 'x', 'y',
                submission_instant FROM processed_messages",
    )
}

#[test]
fn postgres_ledgers_new_and_upgraded_hold_rows_to_claims_and_claims_to_one_per_key() {
    // 1. A new ledger: one index per claim besides its primary key, (instant, award, key),
    //    unique; a raw copy of a claim is refused (23505); the statement triggers refuse rows
    //    naming no claim and deletes/renumberings that would orphan one (23503).
    // 2. A ledger made by the first release (its schema applied by hand: UNIQUE on the
    //    timestamp plus claim_instant, row-by-row foreign keys), opened by a worker: the
    //    foreign keys and the audit log's key index are dropped and the triggers added,
    //    once; it keeps its claim indexes; 10
    //    submissions, 3 resent and one conflicting resubmission are paid once each, the
    //    conflict found; verify passes; the same refusals hold.
    let indexes = "SELECT COUNT(*) FROM pg_indexes WHERE tablename = 'processed_messages'";
    // Records sealed one by one: `audit_chain`, the `audit_log` table of earlier releases.
    let audit_indexes = "SELECT COUNT(*) FROM pg_indexes
         WHERE tablename IN ('audit_log', 'audit_chain')";
    let foreign_keys = "SELECT COUNT(*) FROM pg_constraint WHERE contype = 'f'
         AND confrelid = 'processed_messages'::regclass";
    let triggers = "SELECT COUNT(*) FROM pg_trigger WHERE tgname LIKE 'claimgate_%'";

    let new = World::on(Store::Postgres);
    new.add(&[submission(1)]);
    new.drain(&[]);
    let url = new.db.to_str().unwrap().to_owned();
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    assert_eq!(
        (count(&mut c, indexes), count(&mut c, audit_indexes)),
        (2, 2),
        "claims: primary key and (instant, award, key); audit log: seq and its dead letters"
    );
    assert_eq!(second_claim_refusal(&url), Some("23505".to_owned()));
    assert_eq!(new.count("processed_messages"), 1);
    assert_eq!(
        (count(&mut c, foreign_keys), count(&mut c, triggers)),
        (0, 6)
    );
    assert_rows_are_held_to_claims(&url);

    let old = World::on(Store::Postgres);
    let url = old.db.to_str().unwrap().to_owned();
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(include_str!("fixtures/schema-postgres-v1.sql"))
        .unwrap();
    assert_eq!(
        (count(&mut c, foreign_keys), count(&mut c, triggers)),
        (2, 0)
    );
    assert_eq!(count(&mut c, audit_indexes), 2);
    let conflicting =
        r#"{"award_id":"A-000001","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":5}"#;
    old.add(&(0..10).map(submission).collect::<Vec<_>>());
    old.add(&(0..3).map(submission).collect::<Vec<_>>());
    old.add(&[conflicting.to_owned()]);
    old.drain(&[]);
    old.run_ok(&["verify"]);
    assert_eq!(
        (count(&mut c, foreign_keys), count(&mut c, triggers)),
        (0, 6)
    );
    assert_eq!(
        (count(&mut c, indexes), count(&mut c, audit_indexes)),
        (3, 2),
        "its own claim index and claim_instant kept; the audit key index nothing read, dropped; \
         the dead-letter index added"
    );
    assert_eq!(old.count("disbursements"), 11);
    assert_eq!(
        old.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(10) + 5
    );
    assert_eq!(
        old.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        3
    );
    assert_eq!(
        old.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'"),
        1
    );
    assert_eq!(second_claim_refusal(&url), Some("23505".to_owned()));
    assert_rows_are_held_to_claims(&url);
}

/// A node starting (its schema is applied at every open) beside another node's open batch on
/// the outbox and the audit log does not wait for that batch: the schema's indexes are made
/// only where missing. `CREATE INDEX IF NOT EXISTS` would take a SHARE lock on its table even
/// with the index there, wait for every batch in flight, and stall every node's writers
/// queued behind it.
#[test]
fn a_node_starting_beside_an_open_batch_neither_waits_for_it_nor_stalls_it() {
    let w = World::on(Store::Postgres);
    w.add(&[submission(1)]);
    w.drain(&[]);
    let url = w.db.to_str().unwrap().to_owned();
    let mut other = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut batch = other.transaction().unwrap();
    batch
        .batch_execute("LOCK TABLE outbox, audit_log IN ROW EXCLUSIVE MODE")
        .unwrap();
    let out = w.cmd(&["status"]).run_within(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("claims"));
    batch.commit().unwrap();
    assert_eq!(w.count("processed_messages"), 1);
}

/// The stripe of `submission(i)`'s group (instant, award), as the PostgreSQL ledger numbers it.
fn group_of(i: usize) -> i32 {
    let s = support::parsed(i);
    claimgate::ledger::postgres::group_stripe(&s.submission_instant, &s.award_id)
}

/// Holds the group of `submission(i)` in `session` as another node's uncommitted batch would:
/// a transaction holding its stripe's row lock, until the session commits.
fn hold_group(session: &mut postgres::Client, i: usize) {
    session.batch_execute("BEGIN").unwrap();
    let held = session
        .execute(
            "SELECT 1 FROM claim_locks WHERE stripe = $1 FOR UPDATE",
            &[&group_of(i)],
        )
        .unwrap();
    assert_eq!(held, 1, "the stripe's row exists and is held");
}

#[test]
fn a_batch_defers_the_items_whose_group_another_batch_holds_and_waits_for_them_when_offered_again()
{
    // 1. Another session holds the group of submission 1 (as another node's uncommitted batch
    //    would). A batch of [s1, s2, s1 again]: s2 is paid at once; both s1 items are deferred
    //    (one group), nothing written for them.
    // 2. s1 offered again to the same ledger handle waits for the group rather than being
    //    deferred again: it returns only after the other session lets go, paid; the copy of it
    //    is then a duplicate.
    use claimgate::ledger::{Item, Outcome};
    let w = World::on(Store::Postgres);
    let url = w.db.to_str().unwrap().to_owned();
    let ledger = claimgate::ledger::open(&crate::support::ledger_config(&w.db)).unwrap();
    let (s1, s2) = (support::parsed(1), support::parsed(2));
    let item = |s, entry_id| Item::Submission {
        submission: s,
        entry_id,
        delivery_count: 1,
    };
    let mut other = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    hold_group(&mut other, 1);

    let outcomes = ledger
        .record(
            &[item(&s1, "1-1"), item(&s2, "1-2"), item(&s1, "1-3")],
            "c",
            "s",
        )
        .unwrap();
    assert_eq!(
        outcomes,
        vec![Outcome::Deferred, Outcome::Processed, Outcome::Deferred]
    );
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(w.sql_i64("SELECT COUNT(*) FROM audit_log"), 1);

    let letting_go = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        other.batch_execute("COMMIT").unwrap();
    });
    let offered = std::time::Instant::now();
    let outcomes = ledger
        .record(&[item(&s1, "1-1"), item(&s1, "1-3")], "c", "s")
        .unwrap();
    let waited = offered.elapsed();
    letting_go.join().unwrap();
    assert!(
        waited >= Duration::from_millis(500),
        "the second offer waited for the group ({waited:?})"
    );
    assert_eq!(outcomes[0], Outcome::Processed);
    assert!(
        matches!(outcomes[1], Outcome::Duplicate { .. }),
        "{outcomes:?}"
    );
    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        101 + 102
    );
    w.run_ok(&["verify"]);
}

#[test]
fn a_worker_pays_the_rest_of_a_batch_while_another_node_holds_one_group_and_then_that_entry() {
    // 1. Another session holds the group of submission 3. A worker drains 10 submissions:
    //    the 9 others are paid and acknowledged while that one stays pending (without deferral
    //    the whole batch would wait for the group, and nothing would be paid).
    // 2. The other session lets go: the worker pays it, once; nothing pending; the deferral is
    //    counted in /metrics; verify passes.
    let w = World::on(Store::Postgres);
    let url = w.db.to_str().unwrap().to_owned();
    // The schema first, so the test's session can hold a lock before the worker starts.
    w.run_ok(&["relay", "--exit-when-idle"]);
    let mut other = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    hold_group(&mut other, 3);
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let mut worker = support::Logged::spawn(w.cmd(&[
        "run",
        "--consumer",
        "w1",
        "--metrics-addr",
        &addr,
        "--exit-when-idle",
    ]));
    assert!(
        wait_for(Duration::from_secs(30), || w.count("disbursements") == 9
            && w.pending() == 1),
        "{}",
        worker.log_text()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(w.count("disbursements"), 9, "the held group's entry waits");
    assert!(worker.alive());
    let metrics = http_get(&addr, "/metrics").unwrap().1;
    assert!(
        metrics.contains("claimgate_entries_deferred_total 1"),
        "{metrics}"
    );
    other.batch_execute("COMMIT").unwrap();
    let status = wait_exit(&mut worker.child, Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", worker.log_text());
    worker.wait_log("1 deferred and offered again");
    assert_eq!(w.count("disbursements"), 10);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(10)
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        0
    );
    assert_eq!(w.pending(), 0);
    w.run_ok(&["verify"]);
}

/// Batches committed and never linked (the writer died between the two), as SQL sees them.
fn unlinked(w: &World) -> (i64, i64) {
    (
        w.sql_i64("SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL"),
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE seq IS NULL"),
    )
}

/// A worker that dies between its batch's commit and the batch's link.
fn crash_before_link(w: &World, extra: &[&str]) {
    crash_before_link_as(w, "doomed", extra);
}

/// [`crash_before_link`], as consumer `consumer`.
fn crash_before_link_as(w: &World, consumer: &str, extra: &[&str]) {
    let mut args = vec!["run", "--consumer", consumer, "--exit-when-idle"];
    args.extend_from_slice(extra);
    let out = w.crash_at(w.cmd(&args), "before_link");
    assert!(!out.status.success(), "before_link should have fired");
}

#[test]
fn a_batch_committed_and_left_unlinked_is_linked_at_the_next_start_and_published_once() {
    // 1. A worker commits a batch of 5 and dies before linking it (failpoint before_link):
    //    the claims and records are committed, the records have no seq, the outbox rows no id,
    //    nothing is acknowledged; verify passes and says one batch waits for its link; the
    //    chain (empty) verifies.
    // 2. A worker starts: its open links the batch, the redeliveries are duplicates.
    // 3. Everything is in one chain, each event is published once with ids 1..=5, and an
    //    anchor of the head is matched after more work.
    let w = World::on(Store::Postgres);
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    crash_before_link(&w, &[]);
    assert_eq!(w.count("processed_messages"), 5);
    assert_eq!(unlinked(&w), (1, 5));
    assert_eq!(w.sql_i64("SELECT COUNT(*) FROM outbox WHERE id IS NULL"), 5);
    assert_eq!(w.pending(), 5, "nothing acknowledged before the link");
    let verified = w.run_ok(&["verify"]);
    let said = String::from_utf8_lossy(&verified.stdout);
    assert!(
        said.contains("1 committed batch(es) not linked into the audit chain yet"),
        "{said}"
    );
    w.run_ok(&["audit", "verify"]);

    w.drain(&[]);
    assert_eq!(unlinked(&w), (0, 0));
    assert_eq!(w.pending(), 0);
    assert_eq!(w.count("disbursements"), 5);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        5
    );
    assert_eq!(
        w.sql_i64("SELECT MAX(seq) FROM audit_log"),
        10,
        "seq 1..=10: the linked batch, then the duplicates' batch"
    );
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 5);
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM outbox WHERE id BETWEEN 1 AND 5 AND published_at IS NOT NULL"
        ),
        5
    );
    let anchors = w.dir.path().join("anchors.jsonl");
    w.run_ok(&["audit", "anchor", "--out", anchors.to_str().unwrap()]);
    w.add(&(5..8).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["audit", "verify", "--anchors", anchors.to_str().unwrap()]);
    w.run_ok(&["verify"]);
}

#[test]
fn a_link_that_loses_the_chain_head_to_another_places_its_batch_after_that_one() {
    // Two batches committed and left unlinked (two workers died before their links; while the
    // second starts, the first batch's row is held as its writer would hold it while linking,
    // so the second's start skips it and leaves it be). Link A is made in a transaction held
    // open: it has moved the head, not committed. Link B reads the head as it was, places its
    // batch after it and then finds the head held: it must wait, and once A commits, lose its
    // compare-and-set and place its batch again after A's. One linear chain, verified.
    let w = World::on(Store::Postgres);
    let url = w.db.to_str().unwrap().to_owned();
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    crash_before_link(&w, &[]);
    let mut writer = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut linking = writer.transaction().unwrap();
    linking
        .batch_execute("SELECT 1 FROM audit_batches WHERE link_seq IS NULL FOR UPDATE")
        .unwrap();
    w.add(&(3..7).map(submission).collect::<Vec<_>>());
    crash_before_link_as(&w, "doomed-too", &[]);
    linking.rollback().unwrap();
    assert_eq!(
        unlinked(&w).0,
        2,
        "the start skipped the batch a writer held"
    );
    let batches: Vec<i64> = {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query(
            "SELECT batch_id FROM audit_batches WHERE link_seq IS NULL ORDER BY batch_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let (a, b) = (batches[0], batches[1]);
    let at = claimgate::domain::clock::now_rfc3339();
    let mut first = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut held = first.transaction().unwrap();
    let linked: i32 = held
        .query_one("SELECT linked FROM claimgate_link($1, $2)", &[&at, &a])
        .unwrap()
        .get(0);
    assert_eq!(linked, 1);
    let (done_tx, done) = std::sync::mpsc::channel();
    let other = {
        let (url, at) = (url.clone(), at.clone());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let linked: i32 = c
                .query_one("SELECT linked FROM claimgate_link($1, $2)", &[&at, &b])
                .unwrap()
                .get(0);
            done_tx.send(linked).unwrap();
        })
    };
    assert!(
        done.recv_timeout(Duration::from_millis(500)).is_err(),
        "link B moved the head while link A held it"
    );
    held.commit().unwrap();
    assert_eq!(done.recv_timeout(Duration::from_secs(30)).unwrap(), 1);
    other.join().unwrap();
    assert_eq!(unlinked(&w), (0, 0));
    let column = |name: &str, batch: i64| {
        w.sql_i64(&format!(
            "SELECT {name} FROM audit_batches WHERE batch_id = {batch}"
        ))
    };
    let (a_records, a_rows) = (column("record_count", a), column("outbox_count", a));
    assert_eq!(a_records, 3);
    assert_eq!(column("link_seq", a), a_records, "A first: seqs 1..=3");
    assert_eq!(column("outbox_first", a), 1);
    assert_eq!(
        column("link_seq", b),
        a_records + column("record_count", b),
        "B after A"
    );
    assert_eq!(column("outbox_first", b), a_rows + 1);
    assert_eq!(
        w.sql_text(&format!(
            "SELECT prev_hash FROM audit_batches WHERE batch_id = {b}"
        )),
        w.sql_text(&format!(
            "SELECT hash FROM audit_batches WHERE batch_id = {a}"
        )),
    );
    assert_eq!(
        w.sql_i64("SELECT seq FROM chain_head"),
        column("link_seq", b)
    );
    assert_eq!(
        w.sql_i64("SELECT outbox_id_last FROM chain_head"),
        w.sql_i64("SELECT COUNT(*) FROM outbox_rows")
    );
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
}

#[test]
fn a_batch_left_unlinked_leaves_other_nodes_working_and_a_running_relay_places_it() {
    // 1. A node on another stream of the same ledger runs; a worker on the main stream dies
    //    between its batch's commit and its link. The other node's batches go on being linked
    //    after it (a writer links its own batch only, never waits on one left behind); the
    //    chain verifies and verify names the batch still waiting.
    // 2. A worker's start links that batch. A relay runs; another worker dies before its
    //    link: past its grace the relay links the batch itself and publishes every event, each
    //    once.
    let w = World::on(Store::Postgres);
    let other = w.spawn(&[
        "run",
        "--stream",
        "other:submissions",
        "--consumer",
        "other",
    ]);
    let mut c = w.conn();
    let mut add_other = |i: usize| {
        let _: String = redis::cmd("XADD")
            .arg("other:submissions")
            .arg("*")
            .arg("payload")
            .arg(submission(i).as_bytes())
            .query(&mut c)
            .unwrap();
    };
    // The other node is running (its start done, so it cannot be the one that links the batch
    // left behind) before the batch is left: it has paid and linked an entry of its own.
    add_other(100);
    assert!(
        wait_for(Duration::from_secs(20), || w.sql_i64_once_made(
            "SELECT COUNT(*) FROM audit_log WHERE seq IS NOT NULL"
        ) == 1),
        "the other node starts and pays its first entry"
    );
    w.add(&(0..4).map(submission).collect::<Vec<_>>());
    crash_before_link(&w, &[]);
    assert_eq!(unlinked(&w), (1, 4));
    add_other(101);
    add_other(102);
    assert!(
        wait_for(Duration::from_secs(20), || w.count("disbursements") == 7
            && w.sql_i64(
                "SELECT COUNT(*) FROM audit_log WHERE seq IS NOT NULL"
            ) == 3),
        "the other node's entries are linked: {:?}",
        unlinked(&w)
    );
    drop(other);
    assert_eq!(
        unlinked(&w),
        (1, 4),
        "the batch left behind is still waiting"
    );
    w.run_ok(&["audit", "verify"]);
    let said = String::from_utf8_lossy(&w.run_ok(&["verify"]).stdout).into_owned();
    assert!(said.contains("1 committed batch(es) not linked"), "{said}");

    // The entries of the batch left behind are still pending: a worker's start links the
    // batch, and their redelivery is recorded as duplicates.
    w.drain(&[]);
    assert_eq!(unlinked(&w), (0, 0));
    assert_eq!(w.pending(), 0);
    // To see a running relay link a batch left behind, the relay is up first and the batch
    // is left after.
    let relay = w.spawn(&["relay"]);
    assert!(wait_for(Duration::from_secs(20), || w
        .xlen("grants:events")
        == 7));
    assert_eq!(unlinked(&w), (0, 0));
    w.add(&(10..13).map(submission).collect::<Vec<_>>());
    crash_before_link(&w, &[]);
    assert_eq!(unlinked(&w).0, 1);
    assert!(
        wait_for(Duration::from_secs(20), || w.xlen("grants:events") == 10),
        "the relay links the batch and publishes its events: {} on the stream, {:?} unlinked",
        w.xlen("grants:events"),
        unlinked(&w)
    );
    assert_eq!(unlinked(&w), (0, 0));
    assert!(
        relay.log_text().contains("linked 1 committed batch(es)"),
        "{}",
        relay.log_text()
    );
    drop(relay);
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 10);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 10, "each event once");
    let ids: Vec<i64> = (1..=10).collect();
    assert_eq!(
        w.sql_i64("SELECT COUNT(DISTINCT id) FROM outbox WHERE id BETWEEN 1 AND 10"),
        ids.len() as i64
    );
    w.run_ok(&["verify"]);
}

#[test]
fn a_ledger_of_the_release_before_batches_is_continued_with_its_chain_ids_and_anchors_intact() {
    // 1. A ledger as the previous release left it (its schema applied by hand, fixture
    //    schema-postgres-v2.sql): 3 paid submissions and a duplicate, each record sealed after
    //    the head, outbox ids 1..=3 numbered under the head lock, the head at seq 4.
    // 2. `verify` refuses it (exit 2, naming `claimgate init`) and changes nothing; `init`
    //    upgrades it: the tables are renamed under the views, nothing else changes; verify
    //    passes; an anchor of the head is taken.
    // 3. A worker pays 5 new submissions and finds a resent old one a duplicate; a relay
    //    publishes ids 1..=8 once each, old rows first.
    // 4. One chain: the old records sealed alone, then the batches; verify, audit verify and
    //    the anchor pass.
    use claimgate::domain::audit::{detail, Kind, Record, GENESIS_HASH};
    let w = World::on(Store::Postgres);
    let url = w.db.to_str().unwrap().to_owned();
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(include_str!("fixtures/schema-postgres-v2.sql"))
        .unwrap();
    let at = "2026-11-01T09:00:00.000000Z";
    let mut prev = GENESIS_HASH.to_owned();
    let mut seal = |mut r: Record, c: &mut postgres::Client| {
        r.seal(&prev);
        prev.clone_from(&r.hash);
        c.execute(
            "INSERT INTO audit_log (seq, kind, idempotency_key, award_id, amount_cents,
                 stream_entry_id, consumer, delivery_count, detail, recorded_at, prev_hash, hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &r.seq,
                &r.kind.as_str(),
                &r.idempotency_key,
                &r.award_id,
                &r.amount_cents,
                &r.stream_entry_id,
                &r.consumer,
                &r.delivery_count,
                &r.detail,
                &r.recorded_at,
                &r.prev_hash,
                &r.hash,
            ],
        )
        .unwrap();
    };
    for i in 1..=3usize {
        let s = support::parsed(i);
        let id = i as i64;
        c.execute(
            "INSERT INTO processed_messages (claim_id, idempotency_key, award_id,
                 submission_timestamp, amount_cents, claimed_at, stream_entry_id, consumer,
                 submission_instant) VALUES ($1, $2, $3, $4, $5, $6, $7, 'old', $8)",
            &[
                &id,
                &s.key.as_bytes().as_slice(),
                &s.award_id,
                &s.submission_timestamp,
                &s.amount_cents,
                &at,
                &format!("1-{i}"),
                &s.submission_instant,
            ],
        )
        .unwrap();
        c.execute(
            "INSERT INTO disbursements (id, claim_id, idempotency_key, award_id, amount_cents,
                 recorded_at) VALUES ($1, $1, $2, $3, $4, $5)",
            &[
                &id,
                &s.key.as_bytes().as_slice(),
                &s.award_id,
                &s.amount_cents,
                &at,
            ],
        )
        .unwrap();
        let payload = claimgate::domain::event::payload(&s, &s.key.to_hex());
        c.execute(
            "INSERT INTO outbox (id, claim_id, event_type, payload, created_at)
             VALUES ($1, $1, 'disbursement.recorded', $2, $3)",
            &[&id, &payload, &at],
        )
        .unwrap();
        let r = Record {
            seq: id,
            idempotency_key: Some(s.key.to_hex()),
            award_id: Some(s.award_id.clone()),
            amount_cents: Some(s.amount_cents),
            stream_entry_id: Some(format!("1-{i}")),
            consumer: Some("old".into()),
            delivery_count: Some(1),
            ..Record::unsealed(Kind::Processed, at)
        };
        seal(r, &mut c);
    }
    let s1 = support::parsed(1);
    let resent = Record {
        seq: 4,
        idempotency_key: Some(s1.key.to_hex()),
        award_id: Some(s1.award_id.clone()),
        stream_entry_id: Some("1-9".into()),
        consumer: Some("old".into()),
        delivery_count: Some(1),
        detail: Some(detail::duplicate(at)),
        ..Record::unsealed(Kind::Duplicate, at)
    };
    seal(resent, &mut c);
    c.execute(
        "UPDATE chain_head SET seq = 4, hash = $1, outbox_id_last = 3",
        &[&prev],
    )
    .unwrap();
    c.batch_execute("SELECT setval(pg_get_serial_sequence('processed_messages', 'claim_id'), 3)")
        .unwrap();

    // A read-only command runs no DDL: it refuses, naming the upgrade, and changes nothing.
    let refused = w.run(&["verify"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("claimgate init"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT COUNT(*) FROM pg_class WHERE relname IN ('audit_log', 'outbox') AND relkind = 'r'"
        ),
        2,
        "verify changed nothing"
    );
    w.run_ok(&["init"]);
    let said = String::from_utf8_lossy(&w.run_ok(&["verify"]).stdout).into_owned();
    assert!(
        said.contains("3 claims") && said.contains("4 audit records"),
        "{said}"
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT COUNT(*) FROM pg_class WHERE relname IN ('audit_log', 'outbox') AND relkind = 'v'"
        ),
        2,
        "the tables of the release before are under views now"
    );
    let anchors = w.dir.path().join("anchors.jsonl");
    w.run_ok(&["audit", "anchor", "--out", anchors.to_str().unwrap()]);

    let mut payloads: Vec<String> = (4..=8).map(submission).collect();
    payloads.push(submission(2));
    w.add(&payloads);
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 8);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'"),
        2,
        "the resent old submission is found claimed"
    );
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 8);
    let ids: Vec<i64> = (1..=8).collect();
    let listed = w.sql_text("SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox");
    assert_eq!(
        listed,
        ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0
    );
    let said = String::from_utf8_lossy(&w.run_ok(&["verify"]).stdout).into_owned();
    assert!(
        said.contains("8 claims") && said.contains("10 audit records"),
        "{said}"
    );
    w.run_ok(&["audit", "verify", "--anchors", anchors.to_str().unwrap()]);
    let export = w.dir.path().join("audit.jsonl");
    w.run_ok(&["audit", "export", "--out", export.to_str().unwrap()]);
    let lines: Vec<Record> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines[..4].iter().all(|r| r.batch_index.is_none()));
    assert!(lines[4..].iter().any(|r| r.kind == Kind::Batch));
    assert_eq!(lines.last().unwrap().kind, Kind::Batch);
    w.run_ok(&["audit", "verify", "--file", export.to_str().unwrap()]);
}

/// The pid of the cluster's WAL writer; `None` while the server cannot say (a connection made
/// just before a crash is ended under the query, and during recovery there is no WAL writer).
fn wal_writer(admin: &mut postgres::Client) -> Option<i32> {
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'",
            &[],
        )
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

#[test]
fn what_a_relay_published_survives_a_server_crash_although_links_commit_without_waiting_for_the_disk(
) {
    // A link commits without waiting for its WAL flush, so it can be lost in a crash; what
    // leaves the database with a link's decisions must not be. The server's WAL writer is
    // stopped (SIGSTOP), so nothing but claimgate's own commits writes WAL out.
    // 1. A relay runs. A worker records 3 submissions (its batch durable, its link only in WAL
    //    buffers).
    // 2. The relay publishes the 3 events and dies before marking them (relay_after_publish).
    // 3. The WAL writer is killed: the server crashes (every process ended, shared memory and
    //    the WAL buffers in it thrown away) and recovers.
    // 4. The link the relay published from is still there: batch linked, ids 1..=3, head at 3.
    //    A relay then marks the rows without publishing anything twice; verify passes.
    let pg = crate::pg::own_cluster();
    let url = pg.create_database("durable").unwrap();
    let admin_url = pg.url("postgres");
    let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
    let writer = wal_writer(&mut admin).expect("the WAL writer of a running cluster");
    drop(admin);
    let w = World::on_postgres_url(&url);
    w.create_ledger();
    // The relay runs before the batch: its own start (which writes to the catalog, applying
    // the schema) flushes nothing of what comes after.
    let relay = w.spawn_armed(&["relay"], "relay_after_publish");
    std::thread::sleep(Duration::from_millis(500));
    signal_pid(writer, libc::SIGSTOP);
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NOT NULL"),
        1
    );
    let mut relay = relay;
    let died = support::wait_exit(&mut relay, Duration::from_secs(30));
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(died.signal(), Some(libc::SIGABRT), "{}", relay.log_text());
    }
    assert!(relay
        .log_text()
        .contains("failpoint relay_after_publish fired"));
    assert_eq!(w.xlen("grants:events"), 3, "published before the crash");
    signal_pid(writer, libc::SIGKILL);
    let mut fresh_writer = None;
    assert!(
        wait_for(Duration::from_secs(60), || {
            fresh_writer = postgres::Client::connect(&admin_url, postgres::NoTls)
                .ok()
                .and_then(|mut c| wal_writer(&mut c));
            fresh_writer.is_some_and(|p| p != writer)
        }),
        "the server recovers from the crash"
    );
    assert_eq!(
        w.sql_text(
            "SELECT string_agg(link_seq || ':' || outbox_first || ':' || outbox_count, ',')
             FROM audit_batches"
        ),
        "3:1:3",
        "the link the relay published from survived the crash"
    );
    assert_eq!(w.sql_i64("SELECT outbox_id_last FROM chain_head"), 3);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 3, "nothing published twice");
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL"),
        3
    );
    w.run_ok(&["verify"]);
}

/// Sends `sig` to process `pid` (a server process of the test's own cluster).
fn signal_pid(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process of the cluster this test started and owns.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
}

#[test]
fn metrics_counts_stay_exact_when_a_server_crash_takes_back_links_they_had_counted() {
    // A link commits without waiting for the disk, so a crash can unlink a batch `stats` has
    // already counted; the chain then moves past where the count reached with other batches.
    // 1. The WAL writer stopped: a batch of 3 is recorded (durable) and linked (only in WAL
    //    buffers); `stats` counts it: 3 claims, head at seq 3.
    // 2. The server crashes and recovers: the link is gone, the batch unlinked.
    // 3. A batch of 5 is linked at seqs 1..=5, past where the count reached; then a new handle
    //    links the batch left behind. The first handle's counts equal a recount: 8 claims,
    //    8 records, not 3 + 5 + 3.
    use claimgate::ledger::postgres::PgLedger;
    use claimgate::ledger::{Item, Ledger};
    let pg = crate::pg::own_cluster();
    let url = pg.create_database("tally").unwrap();
    let admin_url = pg.url("postgres");
    let ledger = PgLedger::open(&support::pg_config(&url)).unwrap();
    let subs: Vec<_> = (0..8).map(support::parsed).collect();
    let entries: Vec<String> = (0..8).map(|i| format!("1-{i}")).collect();
    let items: Vec<Item<'_>> = subs
        .iter()
        .zip(&entries)
        .map(|(s, e)| Item::Submission {
            submission: s,
            entry_id: e,
            delivery_count: 1,
        })
        .collect();
    let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
    let writer = wal_writer(&mut admin).expect("the WAL writer of a running cluster");
    // Stopped while it has nothing to write, so it holds no WAL lock a COMMIT would wait for
    // (stopped in the middle of a write, it hung the commit below for good, once, under load).
    assert!(
        wait_for(Duration::from_secs(30), || {
            let row = admin
                .query_one(
                    "SELECT pg_current_wal_flush_lsn() = pg_current_wal_insert_lsn()",
                    &[],
                )
                .unwrap();
            row.get::<_, bool>(0)
        }),
        "the WAL is flushed before the WAL writer is stopped"
    );
    drop(admin);
    signal_pid(writer, libc::SIGSTOP);
    // Should the commit still wait on the stopped writer, it is let go after a minute and the
    // test fails below (the link then reaches the disk), instead of hanging.
    let (recorded, watch) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            watch.recv_timeout(Duration::from_secs(60))
        {
            signal_pid(writer, libc::SIGCONT);
        }
    });
    ledger
        .record(&items[..3], "c", "grants:submissions")
        .unwrap();
    recorded.send(()).unwrap();
    watchdog.join().unwrap();
    let counted = ledger.stats().unwrap();
    assert_eq!((counted.claims, counted.audit_records), (3, 3));
    signal_pid(writer, libc::SIGKILL);
    assert!(
        wait_for(Duration::from_secs(60), || {
            postgres::Client::connect(&admin_url, postgres::NoTls)
                .ok()
                .and_then(|mut c| wal_writer(&mut c))
                .is_some_and(|p| p != writer)
        }),
        "the server recovers from the crash"
    );
    let mut raw = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    assert_eq!(
        count(
            &mut raw,
            "SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL"
        ),
        1,
        "the crash took the link back"
    );
    // The first handle's pooled connections died with the server: retried as a worker would.
    assert!(wait_for(Duration::from_secs(30), || ledger
        .record(&items[3..], "c", "grants:submissions")
        .is_ok()));
    assert_eq!(count(&mut raw, "SELECT seq FROM chain_head"), 5);
    drop(PgLedger::open(&support::pg_config(&url)).unwrap());
    assert_eq!(count(&mut raw, "SELECT seq FROM chain_head"), 8);
    let recount = PgLedger::open(&support::pg_config(&url))
        .unwrap()
        .stats()
        .unwrap();
    assert_eq!((recount.claims, recount.audit_records), (8, 8));
    let mut again = None;
    assert!(wait_for(Duration::from_secs(30), || {
        again = ledger.stats().ok();
        again.is_some()
    }));
    let totals = |s: &claimgate::ledger::Stats| {
        (
            s.claims,
            s.disbursements,
            s.disbursed_cents_total,
            s.audit_records,
            s.outbox_backlog,
        )
    };
    assert_eq!(totals(&again.unwrap()), totals(&recount));
    assert_counts_are_the_rows(&url);
}

#[test]
fn one_workers_two_writers_take_each_group_in_the_order_read() {
    two_writers_pay_the_first_read(None);
}

#[test]
fn a_batch_held_back_before_its_group_locks_keeps_its_turn() {
    // The first batch is held for a second just before it takes its groups (failpoint
    // `slow:before_locks`), while the next batch, holding the later halves of many of its
    // pairs, is read and parsed. The next batch must wait for its turn: had the turn been let
    // go before the locks, it would take those groups first and pay the later submissions.
    two_writers_pay_the_first_read(Some("slow:before_locks:1"));
}

/// One worker has two batches in a PostgreSQL ledger at once (ledger contract point 9).
/// Each of 3,000 submissions is followed 500 entries later by a conflicting one (same award
/// and time, another amount), so the two often fall in batches recorded side by side.
/// Under `--on-conflict hold` the one read first must be paid and the later one held, every
/// time, as with one writer: a batch that took its groups out of turn would pay a later one.
fn two_writers_pay_the_first_read(failpoint: Option<&str>) {
    let w = World::on(Store::Postgres);
    let (n, lag) = (3_000, 500);
    let mut payloads = Vec::with_capacity(2 * n);
    for p in 0..n + lag {
        if p < n {
            payloads.push(submission(p));
        }
        if p >= lag {
            payloads.push(conflicting_with(p - lag));
        }
    }
    w.add(&payloads);
    let mut cmd = w.cmd(&[
        "run",
        "--consumer",
        "w1",
        "--on-conflict",
        "hold",
        "--exit-when-idle",
    ]);
    cmd.env("RUST_LOG", "info");
    if let Some(point) = failpoint {
        cmd.env(claimgate::support::failpoint::ENV, point);
    }
    let out = cmd.run_with_deadline();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    if failpoint.is_some() {
        assert!(log.contains("fired; holding this thread"), "{log}");
    }
    assert_eq!(w.count("disbursements"), n as i64, "{log}");
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(n),
        "only the submissions read first are paid"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE reason_code = 'conflict_hold'"),
        n as i64
    );
    assert_eq!(w.pending(), 0);
    // The two writers did meet on groups: the later of a pair was deferred while the earlier
    // one's batch held the group, and offered again after it.
    let deferred: u64 = log
        .split(" deferred and offered again")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no deferral count in the log:\n{log}"));
    assert!(deferred > 0, "no batch met another on a group:\n{log}");
    w.run_ok(&["verify"]);
}

/// Same award and time as [`submission`] `i`, another amount: a conflicting resubmission.
fn conflicting_with(i: usize) -> String {
    format!(
        r#"{{"award_id":"A-{i:06}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{},"program":"rural-broadband"}}"#,
        900_000 + i
    )
}

/// The ledger's counts as `stats` reports them on a new handle (whose open links whatever a
/// stopped writer left unlinked), against the rows counted whole with SQL; then `verify`
/// passes (it compares the stored counts with the rows too).
fn assert_counts_are_the_rows(url: &str) {
    use claimgate::ledger::postgres::PgLedger;
    use claimgate::ledger::{Inspect, Ledger};
    let ledger = PgLedger::open(&support::pg_config(url)).unwrap();
    let stats = ledger.stats().unwrap();
    let plain = url.split('?').next().unwrap();
    let mut c = postgres::Client::connect(plain, postgres::NoTls).unwrap();
    let row = c
        .query_one(
            "SELECT (SELECT COUNT(*) FROM processed_messages), (SELECT COUNT(*) FROM disbursements),
                    (SELECT COALESCE(SUM(amount_cents), 0)::text FROM disbursements),
                    (SELECT COUNT(*) FROM dead_letters),
                    (SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'),
                    (SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict'),
                    (SELECT COUNT(*) FROM audit_log WHERE kind = 'vanished'),
                    (SELECT COUNT(*) FROM audit_log), (SELECT COUNT(*) FROM claim_tombstones),
                    (SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL)",
            &[],
        )
        .unwrap();
    let n = |i: usize| row.get::<_, i64>(i) as u64;
    assert_eq!(n(9), 0, "every batch linked");
    let cents: i128 = row.get::<_, String>(2).parse().unwrap();
    assert_eq!(
        (
            stats.claims,
            stats.disbursements,
            stats.disbursed_cents_total,
            stats.dead_letters,
            stats.duplicates_suppressed,
            stats.conflicts,
            stats.vanished,
            stats.audit_records,
            stats.tombstones
        ),
        (n(0), n(1), cents, n(3), n(4), n(5), n(6), n(7), n(8)),
        "stats' counts are the rows'"
    );
    ledger.verify().unwrap();
}

/// The counters `stats` reads, as stored on the chain head.
const COUNTERS: [&str; 9] = [
    "claims",
    "disbursements",
    "disbursed_cents_total",
    "dead_letters",
    "duplicates",
    "conflicts",
    "vanished",
    "audit_records",
    "tombstones",
];

#[test]
fn postgres_verify_names_a_count_edited_by_hand_and_a_recount_sets_it_right() {
    // 1. A new ledger verifies; so does one with claims, duplicates, a conflict and a dead
    //    letter, whose counts are the rows'.
    // 2. Each stored counter moved by hand (on the chain head, or in purge_counts): verify
    //    fails naming it, with the stored value and the rows', and how to recount.
    // 3. `SELECT claimgate_recount()` sets them from the rows: verify passes again.
    let w = World::on(Store::Postgres);
    w.run_ok(&["init"]);
    w.run_ok(&["verify"]);
    let url = w.db.to_str().unwrap().to_owned();
    assert_counts_are_the_rows(&url);
    let conflicting =
        r#"{"award_id":"A-000001","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":5}"#;
    w.add(&(0..6).map(submission).collect::<Vec<_>>());
    w.add(&(0..2).map(submission).collect::<Vec<_>>());
    w.add(&[conflicting.to_owned()]);
    w.add_fields(&[("payload", b"[]")]);
    w.drain(&[]);
    assert_counts_are_the_rows(&url);
    for (table, counter) in COUNTERS
        .iter()
        .map(|c| ("chain_head", *c))
        .chain([("purge_counts", "claims"), ("purge_counts", "tombstones")])
    {
        let rows = w.sql_text(&format!(
            "SELECT (h.{counter} + p.{counter})::text FROM chain_head h, purge_counts p"
        ));
        w.sql()
            .exec(&format!("UPDATE {table} SET {counter} = {counter} + 7"));
        let stored: i128 = rows.parse::<i128>().unwrap() + 7;
        let out = w.run(&["verify"]);
        assert!(
            !out.status.success(),
            "{table}.{counter} edited: verify fails"
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!(
                "{counter} is stored as {stored} (chain_head plus purge_counts) but the ledger \
                 holds {rows}"
            )) && said.contains("SELECT claimgate_recount();"),
            "{table}.{counter}: {said}"
        );
        w.sql().exec("SELECT claimgate_recount()");
        w.run_ok(&["verify"]);
    }
    assert_counts_are_the_rows(&url);
}

#[test]
fn postgres_counts_are_the_rows_after_a_worker_killed_at_every_step_of_a_batch() {
    // A worker killed (abort) between any two statements of a batch, before and after its
    // commit and its link, with new claims, a resent one and a malformed entry in the batch:
    // verify passes at once (a batch left unlinked is counted when it is linked, and verify
    // counts the rows the same way), and after a worker drains the stream, stats' counts are
    // the rows' and verify passes. Then a purge killed in the middle of its batch.
    let w = World::on(Store::Postgres);
    let url = w.db.to_str().unwrap().to_owned();
    let points = [
        "before_locks",
        "pg_after_dead_letters",
        "after_claim",
        "pg_after_batch_row",
        "pg_after_members",
        "before_commit",
        "before_link",
        "after_commit",
    ];
    for (round, point) in points.iter().enumerate() {
        let first = round * 4;
        let mut batch: Vec<String> = (first..first + 4).map(submission).collect();
        if round > 0 {
            batch.push(submission(first - 1));
        }
        w.add(&batch);
        w.add_fields(&[("payload", b"[]")]);
        let out = w.crash_at(
            w.cmd(&["run", "--consumer", "doomed", "--exit-when-idle"]),
            point,
        );
        assert!(!out.status.success(), "{point} fired");
        w.run_ok(&["verify"]);
        w.drain(&[]);
        assert_eq!(w.pending(), 0, "{point}: the stream drained");
        assert_eq!(w.count("disbursements"), (first + 4) as i64, "{point}");
        assert_counts_are_the_rows(&url);
    }
    w.run_ok(&["relay", "--exit-when-idle"]);
    // The first three batches or so (backdating ends at a batch's link).
    let end = w.sql_i64("SELECT MIN(link_seq) FROM audit_batches WHERE link_seq >= 12");
    crate::audit::backdate(&w, end, "2019-03-01T12:00:00.000000Z");
    // Exports in the world's directory (by default a purge writes one beside the ledger).
    let export = |name: &str| w.dir.path().join(name).to_str().unwrap().to_owned();
    let purge = w.cmd(&[
        "retention",
        "purge",
        "--before",
        "2020-01-01",
        "--batch-records-max",
        "4",
        "--export",
        &export("killed.jsonl"),
    ]);
    w.crash_at(purge, "purge_after_rows:2");
    w.run_ok(&["verify"]);
    assert_counts_are_the_rows(&url);
    w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2020-01-01",
        "--export",
        &export("purge.jsonl"),
    ]);
    assert!(w.count("claim_tombstones") > 0, "the purge left tombstones");
    assert_counts_are_the_rows(&url);
}

#[test]
fn a_format_3_postgres_ledger_is_upgraded_once_and_its_counts_are_the_rows() {
    // 1. A ledger with claims, duplicates, a dead letter and a batch a stopped writer left
    //    unlinked, taken back to format 3 (this release's additions dropped, format 3's
    //    functions put back from the fixture schema-postgres-v3.sql, its audit digests hex text
    //    again from schema-postgres-v5-audit.sql): a batch format 3 wrote
    //    carries no counts of its own.
    // 2. `status` refuses it (exit 2, naming `claimgate init`); `init` upgrades it, counting
    //    what is linked once, and its open links the batch left unlinked (its counts taken
    //    from its rows by the link): stats' counts are the rows' and verify passes.
    // 3. A worker pays more: the counts are still the rows'.
    let w = World::on(Store::Postgres);
    let url = w.db.to_str().unwrap().to_owned();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.add(&(0..2).map(submission).collect::<Vec<_>>());
    w.add_fields(&[("payload", b"[]")]);
    w.drain(&[]);
    w.add(&(5..9).map(submission).collect::<Vec<_>>());
    w.add(&[submission(1)]);
    w.add_fields(&[("payload", b"{}")]);
    crash_before_link(&w, &[]);
    assert_eq!(unlinked(&w).0, 1);
    w.sql().exec(&format!(
        "ALTER TABLE chain_head {};
         ALTER TABLE audit_batches DROP COLUMN disbursed_cents, DROP COLUMN dead_letters,
             DROP COLUMN duplicates, DROP COLUMN conflicts, DROP COLUMN vanished;
         DROP TABLE purge_counts;
         DROP FUNCTION claimgate_recount(); DROP FUNCTION claimgate_counted();
         {}
         {V5_AUDIT}
         UPDATE ledger_meta SET value = '3' WHERE name = 'format_version'",
        COUNTERS
            .iter()
            .map(|c| format!("DROP COLUMN {c}"))
            .collect::<Vec<_>>()
            .join(", "),
        include_str!("fixtures/schema-postgres-v3.sql")
    ));
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM pg_proc WHERE proname = 'claimgate_counted'"),
        0
    );
    assert_refused_until_init(&w, 3);
    w.run_ok(&["init"]);
    assert_eq!(
        w.sql_text("SELECT value FROM ledger_meta WHERE name = 'format_version'"),
        claimgate::ledger::postgres::FORMAT_VERSION.to_string()
    );
    // The upgrade counted the linked ledger (5 claims); then init's open linked the batch
    // left unlinked, its counts taken from its rows by the link.
    assert_eq!(
        unlinked(&w).0,
        0,
        "init's open links the batch left unlinked"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_batches WHERE disbursed_cents IS NOT NULL"),
        1,
        "only the batch linked since the upgrade carries counts"
    );
    assert_eq!(w.sql_i64("SELECT claims FROM chain_head"), 9);
    assert_counts_are_the_rows(&url);
    w.add(&(9..12).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 12);
    assert_counts_are_the_rows(&url);
}

#[test]
fn a_format_5_postgres_ledger_has_its_audit_digests_rewritten_as_bytes_and_means_the_same() {
    // 1. A SQLite ledger (four paid, a duplicate, a dead letter) migrated: its records sealed
    //    one by one in `audit_chain`. Paid into on PostgreSQL: batch members in
    //    `audit_members`. Its audit export and an anchor, taken now.
    // 2. Taken back to format 5 (fixture schema-postgres-v5-audit.sql): keys and digests as
    //    hex text. `status` refuses it (exit 2, naming `claimgate init`).
    // 3. One member's hash edited to upper case (the same digest, spelled as claimgate never
    //    spells it): `init` refuses, naming the record, and changes nothing: still format 5,
    //    still text, still upper case. Converting it would have made the edit vanish.
    // 4. The edit undone: `init` upgrades. Every key and digest is 32 bytes, the export is the
    //    same byte for byte, the anchor holds, `verify` and `audit verify` pass, and a worker
    //    pays on with the chain continuing.
    let sqlite = World::new();
    sqlite.add(&(0..4).map(submission).collect::<Vec<_>>());
    sqlite.add(&[submission(1)]);
    sqlite.add_fields(&[("payload", b"[]")]);
    sqlite.drain(&[]);
    let url = crate::pg::fresh_database();
    sqlite.run_ok(&["migrate", "--to", &url]);
    let w = World::on_postgres_url(&url);
    w.add(&(4..8).map(submission).collect::<Vec<_>>());
    w.add(&[submission(5)]);
    w.drain(&[]);
    assert_eq!(
        w.count("audit_chain"),
        6,
        "the migrated records, sealed one by one"
    );
    assert_eq!(
        w.count("audit_members"),
        5,
        "the records paid into PostgreSQL, in a batch"
    );
    let path = |name: &str| w.dir.path().join(name).to_str().unwrap().to_owned();
    w.run_ok(&["audit", "export", "--out", &path("before.jsonl")]);
    w.run_ok(&["audit", "anchor", "--out", &path("anchors.jsonl")]);
    w.sql().exec(&format!(
        "{V5_AUDIT}
         UPDATE ledger_meta SET value = '5' WHERE name = 'format_version'"
    ));
    let text_columns = "SELECT COUNT(*) FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name IN ('audit_chain', 'audit_members')
           AND column_name IN ('idempotency_key', 'prev_hash', 'hash') AND data_type = 'text'";
    assert_eq!(w.sql_i64(text_columns), 6);
    assert_refused_until_init(&w, 5);

    let edited = "(SELECT batch_id FROM audit_members LIMIT 1) AND batch_index = 2";
    w.sql().exec(&format!(
        "UPDATE audit_members SET hash = upper(hash) WHERE batch_id = {edited}"
    ));
    let refused = w.run(&["init"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("audit record member 2 of batch")
            && said.contains("nothing was upgraded")
            && !said.contains("takes a role"),
        "{said}"
    );
    assert_eq!(
        w.sql_text("SELECT value FROM ledger_meta WHERE name = 'format_version'"),
        "5"
    );
    assert_eq!(w.sql_i64(text_columns), 6);
    assert_eq!(
        w.sql_i64(&format!(
            "SELECT COUNT(*) FROM audit_members WHERE batch_id = {edited} AND hash ~ '[A-F]'"
        )),
        1,
        "the edit is still there to be found"
    );

    w.sql().exec(&format!(
        "UPDATE audit_members SET hash = lower(hash) WHERE batch_id = {edited}"
    ));
    w.run_ok(&["init"]);
    assert_eq!(
        w.sql_text("SELECT value FROM ledger_meta WHERE name = 'format_version'"),
        claimgate::ledger::postgres::FORMAT_VERSION.to_string()
    );
    assert_eq!(w.sql_i64(text_columns), 0);
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM audit_log WHERE octet_length(prev_hash) <> 32
                OR octet_length(hash) <> 32 OR octet_length(idempotency_key) <> 32"
        ),
        0
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE idempotency_key IS NOT NULL"),
        10,
        "eight processed and two duplicate records carry a key (the dead letter none)"
    );
    w.run_ok(&["audit", "export", "--out", &path("after.jsonl")]);
    assert_eq!(
        std::fs::read_to_string(path("after.jsonl")).unwrap(),
        std::fs::read_to_string(path("before.jsonl")).unwrap()
    );
    w.run_ok(&["audit", "verify", "--anchors", &path("anchors.jsonl")]);
    w.run_ok(&["verify"]);
    w.add(&(8..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 10);
    w.run_ok(&["audit", "verify", "--anchors", &path("anchors.jsonl")]);
    w.run_ok(&["verify"]);
}

/// `status` on a ledger of an earlier `format` exits 2, naming the format and `claimgate init`.
fn assert_refused_until_init(w: &World, format: u32) {
    let refused = w.run(&["status"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("is format {format}")) && said.contains("claimgate init"),
        "{said}"
    );
}

/// The outbox backlog as `status --json` reports it.
fn backlog(w: &World) -> serde_json::Value {
    w.status_json()["ledger"]["outbox_backlog"].clone()
}

#[test]
fn a_format_4_postgres_ledger_keeps_its_rows_marked_one_by_one_and_goes_on_publishing_per_round() {
    // 1. Seven paid; a relay publishes them; three more paid, unpublished. The ledger is taken
    //    back to format 4 (fixtures schema-postgres-v4-outbox.sql, and v5-audit for the audit
    //    digests as hex text): `outbox_published` dropped,
    //    each row storing its event, each published row marked on its own row, as format 4's
    //    relay marked it, at its own time, and the partial index of unpublished rows back.
    // 2. `status` refuses it (exit 2); `init` upgrades it: the rows marked one by one keep
    //    their times, they become one publication, the index is gone, the backlog is the 3,
    //    and verify passes.
    // 3. A relay publishes the 3 (10 events, each once, as format 4 stored them) and records
    //    one publication, changing no row; the backlog is 0; a worker and relay go on, their
    //    rows storing no event; verify passes.
    let w = World::on(Store::Postgres);
    w.add(&(0..7).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    w.add(&(7..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.xlen("grants:events"), 7);
    w.sql().exec(&format!(
        "UPDATE outbox_rows r SET event_type = v.event_type, payload = v.payload
         FROM outbox v WHERE v.claim_id = r.claim_id;
         UPDATE outbox_rows r SET published_at = '2026-07-01T10:00:0' || v.id || '.000000Z'
         FROM outbox v WHERE v.claim_id = r.claim_id AND v.published_at IS NOT NULL;
         DROP TABLE outbox_published CASCADE;
         {}
         {V5_AUDIT}
         UPDATE ledger_meta SET value = '4' WHERE name = 'format_version'",
        include_str!("fixtures/schema-postgres-v4-outbox.sql")
    ));
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox_rows WHERE published_at IS NOT NULL"),
        7
    );
    assert_refused_until_init(&w, 4);

    w.run_ok(&["init"]);
    assert_eq!(
        w.sql_text("SELECT upto_id || ' ' || published_at FROM outbox_published"),
        "7 2026-07-01T10:00:07.000000Z",
        "the rows marked one by one, as one publication at the last of their times"
    );
    assert_eq!(
        w.sql_text(
            "SELECT string_agg(id || ' ' || COALESCE(published_at, '-'), ', ' ORDER BY id)
             FROM outbox WHERE id IN (1, 7, 8)"
        ),
        "1 2026-07-01T10:00:01.000000Z, 7 2026-07-01T10:00:07.000000Z, 8 -"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM pg_class WHERE relname = 'outbox_unpublished'"),
        0
    );
    assert_eq!(backlog(&w), 3);
    w.run_ok(&["verify"]);

    let stored: Vec<String> = (8..=10)
        .map(|id| w.sql_text(&format!("SELECT payload FROM outbox_rows WHERE id IS NULL AND claim_id = (SELECT claim_id FROM outbox WHERE id = {id})")))
        .collect();
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 10);
    let published: Vec<String> = w.events()[7..]
        .iter()
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(published, stored, "the events format 4 stored, as stored");
    assert_eq!(backlog(&w), 0);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0
    );
    assert_eq!(
        w.sql_text("SELECT string_agg(upto_id::text, ' ' ORDER BY upto_id) FROM outbox_published"),
        "7 10"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox_rows WHERE published_at IS NOT NULL"),
        7,
        "no row is updated to be published"
    );
    w.add(&(10..14).map(submission).collect::<Vec<_>>());
    w.drain(&["--relay"]);
    assert_eq!(w.xlen("grants:events"), 14);
    assert_eq!(backlog(&w), 0);
    assert_eq!(w.count("disbursements"), 14);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox_rows WHERE payload IS NULL"),
        4,
        "rows written since the upgrade store no event"
    );
    w.run_ok(&["verify"]);
}

#[test]
fn postgres_spells_each_event_from_its_claim_byte_for_byte_as_the_worker_spells_it() {
    // A batch's outbox rows store no event: the relay and the view `outbox` spell it from the
    // claim with `claimgate_event` (SQL), where SQLite and earlier formats stored what
    // `event::announcing` (Rust) spelled. The two must agree byte for byte, or a relay would
    // publish an event no consumer's check of the old spelling would accept.
    // 1. `claimgate_event` against `announcing` on award ids holding each ASCII character
    //    (control characters, quotes, backslash, slash, DEL), and non-ASCII ones (é, €, an
    //    emoji, U+2028, U+FFFD), in the award and the timestamp.
    // 2. End to end: awards with such characters paid on PostgreSQL and on SQLite and relayed:
    //    the two events streams carry the same payloads; the stored rows hold no event; the view
    //    shows each row's event as the relay published it; verify passes.
    use claimgate::domain::event::{announcing, Announced};
    let w = World::on(Store::Postgres);
    w.drain(&[]);
    let support::Sql::Postgres(mut c) = w.sql() else {
        unreachable!("a PostgreSQL world")
    };
    let mut odd: Vec<String> = (1u8..=0x7f).map(|b| format!("A{}Z", b as char)).collect();
    odd.extend(
        [
            "é-€",
            "😀",
            "x\u{2028}y",
            "\u{fffd}",
            r#"\"quoted\"\\"#,
            "a/b",
        ]
        .map(String::from),
    );
    let key = [0xabu8; 32];
    for text in &odd {
        let want = announcing(&Announced {
            amount_cents: 12_345,
            award_id: text,
            key_hex: &"ab".repeat(32),
            submission_timestamp: text,
        });
        let got: String = c
            .query_one(
                "SELECT claimgate_event($1, 12345, $2, $1)",
                &[text as &(dyn postgres::types::ToSql + Sync), &&key[..]],
            )
            .unwrap()
            .get(0);
        assert_eq!(got, want, "{text:?}");
    }

    let awards = [
        "GR-\"1\"",
        "GR-\\2",
        "GR-\t3\n",
        "GR-\u{1}4",
        "GR-é5",
        "GR-😀6",
    ];
    let subs: Vec<String> = awards
        .iter()
        .enumerate()
        .map(|(i, a)| {
            serde_json::json!({
                "award_id": a,
                "submission_timestamp": format!("2026-07-01T09:00:0{i}Z"),
                "amount_cents": 100 + i,
            })
            .to_string()
        })
        .collect();
    let lite = World::on(Store::Sqlite);
    for world in [&w, &lite] {
        world.add(&subs);
        world.drain(&["--relay"]);
    }
    let payloads = |world: &World| -> Vec<String> {
        world
            .events()
            .into_iter()
            .map(|e| e["payload"].clone())
            .collect()
    };
    assert_eq!(payloads(&w).len(), awards.len());
    assert_eq!(payloads(&w), payloads(&lite));
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox_rows WHERE payload IS NULL AND event_type IS NULL"),
        awards.len() as i64,
        "a batch's rows store no event"
    );
    let viewed: Vec<String> = (1..=awards.len())
        .map(|id| w.sql_text(&format!("SELECT payload FROM outbox WHERE id = {id}")))
        .collect();
    assert_eq!(viewed, payloads(&w));
    w.run_ok(&["verify"]);
}

#[test]
fn postgres_counts_are_the_rows_after_server_crashes_under_a_running_worker() {
    // A worker pays three waves of 1,000 submissions (each with 100 resent ones); in each wave,
    // once it has begun paying, the server crashes (its WAL writer killed with SIGKILL: every
    // backend is cut off and the cluster recovers from WAL), taking back links that had not
    // reached the disk, with their counts. The worker waits the server out and finishes: every
    // submission paid once, and stats' counts are the rows' (a link taken back is counted once,
    // when it is made again), verify passes.
    let pg = crate::pg::own_cluster();
    let url = pg.create_database("crashes").unwrap();
    let admin_url = pg.url("postgres");
    let w = World::on_postgres_url(&url);
    let worker = support::Logged::spawn(w.cmd(&["run", "--consumer", "w1"]));
    let paid = || {
        postgres::Client::connect(&url, postgres::NoTls)
            .ok()
            .and_then(|mut c| {
                c.query_one(
                    "SELECT CASE WHEN to_regclass('disbursements') IS NULL THEN 0
                            ELSE (SELECT COUNT(*) FROM disbursements) END",
                    &[],
                )
                .ok()
            })
            .map_or(-1, |r| r.get::<_, i64>(0))
    };
    for wave in 0..3usize {
        let first = wave * 1000;
        let mut batch: Vec<String> = (first..first + 1000).map(submission).collect();
        batch.extend((first..first + 100).map(submission));
        w.add(&batch);
        assert!(
            wait_for(Duration::from_secs(60), || paid() > first as i64),
            "wave {wave}: paying\n{}",
            worker.log_text()
        );
        let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
        let writer = wal_writer(&mut admin).expect("the WAL writer of a running cluster");
        drop(admin);
        signal_pid(writer, libc::SIGKILL);
        assert!(
            wait_for(Duration::from_secs(60), || {
                postgres::Client::connect(&admin_url, postgres::NoTls)
                    .ok()
                    .and_then(|mut c| wal_writer(&mut c))
                    .is_some_and(|p| p != writer)
            }),
            "wave {wave}: the server recovers from the crash"
        );
    }
    assert!(
        wait_for(Duration::from_secs(120), || paid() == 3000
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        amount_sum(3000)
    );
    assert_counts_are_the_rows(&url);
}
