//! PostgreSQL as agencies run it: a DBA's habits (a schema named after the role, three roles,
//! grants revoked for a while, stock server settings) and a hostile producer's entries, each
//! tried against a real private PostgreSQL 15 with non-superuser roles where roles matter.

use crate::ops::http_get;
use crate::support::{self, submission, wait_exit, wait_for, Logged, Store, World};
use claimgate::support::localredis::free_port;
use std::time::{Duration, Instant};

/// A superuser session on the world's PostgreSQL database.
fn superuser(w: &World) -> postgres::Client {
    let url = w.db.to_str().unwrap().split('?').next().unwrap().to_owned();
    postgres::Client::connect(&url, postgres::NoTls).unwrap()
}

/// The world's URL with `user:password` in place of the superuser's, and `query` appended.
fn as_role(w: &World, user: &str, password: &str, query: &str) -> String {
    let url = w.db.to_str().unwrap();
    let (_, host_and_db) = url.split_once('@').unwrap();
    format!("postgres://{user}:{password}@{host_and_db}{query}")
}

/// Runs `claimgate ARGS` with `--db URL`: (exit code, stdout, stderr).
fn with_db(w: &World, args: &[&str], url: &str) -> (Option<i32>, String, String) {
    let mut all = args.to_vec();
    all.extend(["--db", url]);
    let out = w.run(&all);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A role name unique on the shared cluster (roles are the cluster's, not a database's).
fn role(w: &World, what: &str) -> String {
    let db = w.db.to_str().unwrap().rsplit('/').next().unwrap();
    format!("{}_{what}", db.split('?').next().unwrap())
}

#[test]
fn a_schema_named_after_the_role_never_starts_a_second_ledger() {
    // 1. A worker pays 50 submissions into the ledger its URL pins (public, named nowhere).
    // 2. The DBA makes the role's own schema, PostgreSQL's "secure schema usage pattern": the
    //    role's default search path ("$user", public) now finds it first.
    // 3. The consumer group is recreated at 0 and drained again: all 50 are duplicates,
    //    nothing is paid twice, status reads the one ledger, and the new schema stays empty.
    //    (Before: the next command made every table in the new schema and paid all 50 again.)
    let w = World::on(Store::Postgres);
    let payloads: Vec<String> = (0..50).map(submission).collect();
    w.add(&payloads);
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 50);
    let mut su = superuser(&w);
    su.batch_execute("CREATE SCHEMA claimgate AUTHORIZATION claimgate")
        .unwrap();
    let _: () = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg("grants:submissions")
        .arg("grant-workers")
        .query(&mut w.conn())
        .unwrap();
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    let mut in_public = |sql: &str| -> i64 {
        su.query_one(&format!("SELECT ({sql})::int8"), &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(in_public("SELECT COUNT(*) FROM public.disbursements"), 50);
    assert_eq!(
        in_public("SELECT SUM(amount_cents) FROM public.disbursements"),
        support::amount_sum(50)
    );
    assert_eq!(
        in_public("SELECT COUNT(*) FROM public.audit_log WHERE kind = 'duplicate'"),
        50
    );
    assert_eq!(
        in_public(
            "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'claimgate'"
        ),
        0,
        "nothing made in the role's schema"
    );
    let status = w.run_ok(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["ledger"]["claims"], 50);
    assert_eq!(v["ledger"]["duplicates_suppressed"], 50);
    assert_eq!(w.xlen("grants:events"), 50, "each event once");
}

#[test]
fn a_ledger_is_found_only_in_the_schema_its_url_names_and_made_only_in_an_empty_one() {
    // 1. A worker pays 10 submissions into schema ledger_a (schema=ledger_a in the URL).
    // 2. Without schema=, every command exits 2 naming schema ledger_a, and run and relay
    //    make nothing in public (the old ledger would be abandoned and everything paid again).
    // 3. A schema holding someone else's table is refused for a new ledger, naming the table.
    // 4. A schema name that is not a plain lower-case identifier is refused before connecting.
    let w = World::on(Store::Postgres);
    let base = w.db.to_str().unwrap().to_owned();
    let named = format!("{base}?schema=ledger_a");
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    let (code, _, err) = with_db(
        &w,
        &["run", "--exit-when-idle", "--claim-idle-ms", "200"],
        &named,
    );
    assert_eq!(code, Some(0), "{err}");
    let mut su = superuser(&w);
    let count = |su: &mut postgres::Client, sql: &str| -> i64 {
        su.query_one(&format!("SELECT ({sql})::int8"), &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(count(&mut su, "SELECT COUNT(*) FROM ledger_a.disbursements"), 10);
    for args in [
        &["status", "--json"][..],
        &["verify"],
        &["audit", "verify"],
        &["run", "--exit-when-idle"],
        &["relay", "--exit-when-idle"],
        &["init"],
    ] {
        let (code, _, err) = with_db(&w, args, &base);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("add schema=ledger_a to the URL"), "{args:?}: {err}");
    }
    assert_eq!(
        count(
            &mut su,
            "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public'"
        ),
        0,
        "nothing made in public"
    );
    let (code, out, err) = with_db(&w, &["verify"], &named);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("10 claims"), "{out}");

    su.batch_execute("CREATE SCHEMA reports; CREATE TABLE reports.monthly (n int)")
        .unwrap();
    let (code, _, err) = with_db(&w, &["init"], &format!("{base}?schema=reports"));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("holds objects claimgate did not make (monthly)"),
        "{err}"
    );
    assert_eq!(
        count(
            &mut su,
            "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'reports'"
        ),
        1,
        "nothing made beside it"
    );
    for bad in ["Ledger_A", "ledger;drop", "pg_catalog", "1st", ""] {
        let (code, _, err) = with_db(&w, &["status"], &format!("{base}?schema={bad}"));
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(err.contains("is not a schema claimgate can use"), "{err}");
    }
}

#[test]
fn a_role_that_may_only_read_runs_every_read_command_and_no_ddl() {
    // 1. A ledger is made and paid into (superuser). An auditor role gets USAGE and SELECT
    //    only, and a schema of its own named after it (which "$user" would find first).
    // 2. status --json, verify, audit verify and audit export all work as the auditor and read
    //    the real ledger (20 claims), not an empty copy in its own schema; its schema stays
    //    empty. (Before: exit 2 for want of CREATE, or, with its own schema, "audit chain
    //    intact: 0 records".)
    // 3. run as the auditor is refused at start (exit 2), naming the privilege it lacks.
    let w = World::on(Store::Postgres);
    w.add(&(0..20).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let auditor = role(&w, "auditor");
    let mut su = superuser(&w);
    su.batch_execute(&format!(
        "CREATE ROLE {auditor} LOGIN PASSWORD 'audit-pw';
         GRANT USAGE ON SCHEMA public TO {auditor};
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO {auditor};
         CREATE SCHEMA {auditor} AUTHORIZATION {auditor};"
    ))
    .unwrap();
    let url = as_role(&w, &auditor, "audit-pw", "");
    let (code, out, err) = with_db(&w, &["status", "--json"], &url);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ledger"]["claims"], 20);
    let (code, out, err) = with_db(&w, &["verify"], &url);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("20 claims"), "{out}");
    let (code, out, err) = with_db(&w, &["audit", "verify"], &url);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("20 records"), "{out}");
    let export = w.dir.path().join("audit.jsonl");
    let (code, _, err) = with_db(
        &w,
        &["audit", "export", "--out", export.to_str().unwrap()],
        &url,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(std::fs::read_to_string(&export).unwrap().lines().count() >= 20);
    let made: i64 = su
        .query_one(
            "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1",
            &[&auditor],
        )
        .unwrap()
        .get(0);
    assert_eq!(made, 0, "nothing made in the auditor's schema");
    let (code, _, err) = with_db(&w, &["run", "--exit-when-idle"], &url);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("the role {auditor} may not INSERT processed_messages"))
            && !err.contains("audit-pw"),
        "{err}"
    );
}

#[test]
fn privileges_revoked_mid_run_dead_letter_nothing_and_end_run_only_past_its_limit() {
    // 1. A worker role with the documented grants pays 10 submissions (max deliveries 1, a
    //    quarantine of 100 ms tries, takeover after 300 ms: every path to a dead letter is
    //    short).
    // 2. The DBA revokes INSERT on processed_messages and 10 more arrive. For 6 s (many times
    //    what the quarantine needs): /healthz is 503 "commits failing", no dead letter, no
    //    delivery counted beyond the first, the worker alive.
    // 3. The grant is given back: all 20 paid once, /healthz 200, nothing pending.
    // 4. Revoked again under a worker with --ledger-outage-ms-max 1500: it exits 1 within
    //    seconds naming the privilege, its entries pending, still no dead letter.
    let w = World::on(Store::Postgres);
    w.run_ok(&["init"]);
    let worker_role = role(&w, "worker");
    let mut su = superuser(&w);
    su.batch_execute(&format!(
        "CREATE ROLE {worker_role} LOGIN PASSWORD 'work-pw';
         GRANT USAGE ON SCHEMA public TO {worker_role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {worker_role};"
    ))
    .unwrap();
    let url = as_role(&w, &worker_role, "work-pw", "");
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let spawn = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--consumer",
            "w1",
            "--max-deliveries",
            "1",
            "--quarantine-spacing-ms",
            "100",
            "--claim-idle-ms",
            "300",
            "--db",
            url.as_str(),
        ];
        args.extend_from_slice(extra);
        Logged::spawn(w.cmd(&args))
    };
    let mut worker = spawn(&["--metrics-addr", &addr]);
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(Duration::from_secs(30), || w.count("disbursements") == 10),
        "{}",
        worker.log_text()
    );
    su.batch_execute(&format!(
        "REVOKE INSERT ON processed_messages FROM {worker_role}"
    ))
    .unwrap();
    w.add(&(10..20).map(submission).collect::<Vec<_>>());
    let health = || http_get(&addr, "/healthz");
    assert!(
        wait_for(Duration::from_secs(20), || matches!(
            health(),
            Some((503, body)) if body.contains("commits failing")
        )),
        "{:?}\n{}",
        health(),
        worker.log_text()
    );
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(6) {
        assert!(worker.alive(), "{}", worker.log_text());
        assert_eq!(w.xlen("grants:submissions:dead"), 0, "{}", worker.log_text());
        std::thread::sleep(Duration::from_millis(250));
    }
    let (code, body) = health().unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("permission denied"), "{body}");
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.count("disbursements"), 10);
    su.batch_execute(&format!("GRANT INSERT ON processed_messages TO {worker_role}"))
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || w.count("disbursements") == 20
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(
        wait_for(Duration::from_secs(10), || matches!(health(), Some((200, _)))),
        "{:?}",
        health()
    );
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(20)
    );
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(worker.stop().code(), Some(0));

    su.batch_execute(&format!(
        "REVOKE INSERT ON processed_messages FROM {worker_role}"
    ))
    .unwrap();
    let mut short = spawn(&[]);
    // It started with the grant gone: refused at once as configuration (exit 2).
    let status = wait_exit(&mut short.child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "{}", short.log_text());
    su.batch_execute(&format!("GRANT INSERT ON processed_messages TO {worker_role}"))
        .unwrap();
    let mut short = spawn(&["--ledger-outage-ms-max", "1500"]);
    w.add(&(20..21).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(Duration::from_secs(20), || w.count("disbursements") == 21),
        "{}",
        short.log_text()
    );
    su.batch_execute(&format!(
        "REVOKE INSERT ON processed_messages FROM {worker_role}"
    ))
    .unwrap();
    w.add(&(21..26).map(submission).collect::<Vec<_>>());
    let status = wait_exit(&mut short.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{}", short.log_text());
    assert!(
        short.log_text().contains("permission denied for table processed_messages"),
        "{}",
        short.log_text()
    );
    assert_eq!(w.pending(), 5, "its entries stay pending");
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
}

#[test]
fn a_nul_or_an_overlong_award_id_settles_alike_on_both_ledgers() {
    hostile_ids(Store::Sqlite);
    hostile_ids(Store::Postgres);
}

/// One run of the hostile-id entries on one ledger: each dead-lettered with its own reason,
/// nothing pending, the valid ones paid, the NUL kept as text in the ledger's dead-letter row.
fn hostile_ids(store: Store) {
    let w = World::on(store);
    let ts = "2026-07-01T09:00:00Z";
    let long = "A".repeat(claimgate::domain::submission::AWARD_ID_BYTES_MAX + 1);
    let mut payloads: Vec<String> = (0..5).map(submission).collect();
    payloads.extend([
        format!(r#"{{"award_id":"A\u0000B","submission_timestamp":"{ts}","amount_cents":5}}"#),
        format!(r#"{{"award_id":"{long}","submission_timestamp":"{ts}","amount_cents":5}}"#),
        format!(r#"{{"award_id":"C","submission_timestamp":"{ts}\u0000","amount_cents":5}}"#),
        // A NUL elsewhere in the payload is the producer's business: kept, and paid.
        format!(r#"{{"award_id":"D","submission_timestamp":"{ts}","amount_cents":7,"note":"x\u0000y"}}"#),
    ]);
    w.add(&payloads);
    let began = Instant::now();
    w.drain(&[]);
    let took = began.elapsed();
    assert_eq!(w.pending(), 0, "{store:?}");
    assert_eq!(w.count("disbursements"), 6, "{store:?}");
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(5) + 7
    );
    let codes =
        w.sql_text("SELECT string_agg(reason_code, ',' ORDER BY reason_code) FROM dead_letters");
    assert_eq!(
        codes, "award_id_too_long,nul_in_text,nul_in_text",
        "{store:?}"
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE award_id = 'A\\u0000B'"),
        1,
        "{store:?}: the NUL kept as text in the dead letter's award"
    );
    assert_eq!(w.xlen("grants:submissions:dead"), 3);
    w.run_ok(&["verify"]);
    eprintln!("{store:?}: settled in {took:?}");
}
