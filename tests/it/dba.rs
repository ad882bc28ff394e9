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
    assert_eq!(
        count(&mut su, "SELECT COUNT(*) FROM ledger_a.disbursements"),
        10
    );
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
        assert!(
            err.contains("add schema=ledger_a to the URL"),
            "{args:?}: {err}"
        );
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
    // A schema named by a keyword is a name like any other.
    let keyword = format!("{base}?schema=user");
    w.add(&[submission(99)]);
    let (code, _, err) = with_db(
        &w,
        &[
            "run",
            "--exit-when-idle",
            "--claim-idle-ms",
            "200",
            "--group",
            "g2",
        ],
        &keyword,
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = with_db(&w, &["verify"], &keyword);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("11 claims"), "{out}");
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
    // 2. status --json, verify, audit verify, audit export and audit report all work as the
    //    auditor and read the real ledger (20 claims), not an empty copy in its own schema;
    //    its schema stays empty. (Before: exit 2 for want of CREATE, or, with its own schema,
    //    "audit chain intact: 0 records".)
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
    let report = w.dir.path().join("report.html");
    let (code, out, err) = with_db(
        &w,
        &["audit", "report", "--out", report.to_str().unwrap()],
        &url,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("20 records verified"), "{out}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains(r#"data-figure="status.claims" data-value="20""#));
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
        err.contains(&format!(
            "the role {auditor} may not INSERT processed_messages"
        )) && !err.contains("audit-pw"),
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
        assert_eq!(
            w.xlen("grants:submissions:dead"),
            0,
            "{}",
            worker.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (code, body) = health().unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("permission denied"), "{body}");
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.count("disbursements"), 10);
    su.batch_execute(&format!(
        "GRANT INSERT ON processed_messages TO {worker_role}"
    ))
    .unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || w.count("disbursements") == 20
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    assert!(
        wait_for(Duration::from_secs(10), || matches!(
            health(),
            Some((200, _))
        )),
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
    su.batch_execute(&format!(
        "GRANT INSERT ON processed_messages TO {worker_role}"
    ))
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
        short
            .log_text()
            .contains("permission denied for table processed_messages"),
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
        format!(
            r#"{{"award_id":"D","submission_timestamp":"{ts}","amount_cents":7,"note":"x\u0000y"}}"#
        ),
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

/// The fenced `sh` blocks of README's "When one box is not enough", in order.
fn readme_postgres_blocks() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("\n## When one box is not enough\n")
        .nth(1)
        .expect("README has the section")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("\n```").next().unwrap().to_owned())
        .collect()
}

/// The commands of a shell block: one per line, a here-document with the line that opens it.
fn commands(block: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut heredoc_end: Option<String> = None;
    for line in block.lines() {
        if let Some(end) = &heredoc_end {
            let last = out.last_mut().expect("a here-document follows its command");
            last.push('\n');
            last.push_str(line);
            if line == end {
                heredoc_end = None;
            }
            continue;
        }
        if let Some((_, tag)) = line.split_once("<<'") {
            heredoc_end = Some(tag.trim_end_matches('\'').to_owned());
        }
        out.push(line.to_owned());
    }
    assert!(heredoc_end.is_none(), "an unterminated here-document");
    out
}

#[test]
fn the_readmes_postgres_recipe_run_verbatim_on_a_fresh_server_gives_a_working_node() {
    // README's "When one box is not enough", as a newcomer types it, on a fresh PostgreSQL 15
    // cluster (stock settings), with only these changes: `sudo -u postgres` is dropped (libpq's
    // environment points the commands at the private cluster as its superuser), the three
    // passwords are typed at createuser's prompts (stdin, no terminal), and PASSWORD
    // placeholders and `db.internal:5432` are replaced by the test's.
    // 1. The roles, database and schema (block 1). 2. init as the owner, run --relay as the
    // worker (25 submissions paid and published once), verify as the auditor (block 2).
    let pg = crate::pg::own_cluster();
    let w = World::on_postgres_url(&pg.url("postgres"));
    let blocks = readme_postgres_blocks();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_claimgate"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        pg.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let port = pg.port().to_string();
    let sh = |command: &str, stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new("setsid")
            .args(["-w", "bash", "-euo", "pipefail", "-c", command])
            .env("PATH", &path)
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", &port)
            .env("PGUSER", claimgate::support::localpostgres::USER)
            .env("PGPASSWORD", pg.password())
            .env("PGDATABASE", "postgres")
            .env("REDIS_URL", w.redis.url())
            .env_remove("CLAIMGATE_DB")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{command}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let passwords = [
        ("claimgate_owner", "OWNER_PASSWORD", "owner-pw-1"),
        ("claimgate_worker", "WORKER_PASSWORD", "worker-pw-2"),
        ("claimgate_auditor", "AUDITOR_PASSWORD", "auditor-pw-3"),
    ];
    for command in commands(&blocks[0]) {
        let command = command.replace("sudo -u postgres ", "");
        let typed = passwords
            .iter()
            .find(|(role, _, _)| command.contains("createuser") && command.contains(role))
            .map(|(_, _, pw)| format!("{pw}\n{pw}\n"))
            .unwrap_or_default();
        sh(&command, &typed);
    }
    let localize = |command: &str| {
        let mut c = command.replace("db.internal:5432", &format!("127.0.0.1:{port}"));
        for (_, placeholder, pw) in passwords {
            c = c.replace(placeholder, pw);
        }
        c
    };
    let block = commands(&blocks[1]);
    assert_eq!(block.len(), 4, "{block:?}");
    let said = sh(&localize(&block[0]), "");
    assert!(said.contains("ledger ready"), "{said}");
    w.add(&(0..25).map(submission).collect::<Vec<_>>());
    // The worker line runs in the background after the export line, until SIGTERM.
    let worker = std::process::Command::new("bash")
        .args([
            "-c",
            &format!("{}\nexec {}", localize(&block[1]), localize(&block[2])),
        ])
        .env("PATH", &path)
        .env("REDIS_URL", w.redis.url())
        .env_remove("CLAIMGATE_DB")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut worker = scopeguard(worker);
    let ledger = format!("{}?schema=claimgate", pg.url("claimgate"));
    let w_db = World::on_postgres_url(&ledger);
    assert!(
        wait_for(Duration::from_secs(60), || w_db.sql_i64_once_made(
            "SELECT COUNT(*) FROM claimgate.outbox WHERE published_at IS NOT NULL"
        ) == 25),
        "the node paid and published the 25"
    );
    support::signal(&worker.0, libc::SIGTERM);
    assert!(wait_exit(&mut worker.0, Duration::from_secs(30)).success());
    let said = sh(&localize(&block[3]), "");
    assert!(said.contains("25 claims"), "{said}");
    assert_eq!(w.xlen("grants:events"), 25);
    // Who owns what: the owner made every table; the worker and the auditor made nothing.
    let mut su = postgres::Client::connect(&pg.url("claimgate"), postgres::NoTls).unwrap();
    let owners: Vec<String> = su
        .query(
            "SELECT DISTINCT pg_get_userbyid(c.relowner)::text FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'claimgate'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(owners, ["claimgate_owner"]);
    let supers: i64 = su
        .query_one(
            "SELECT COUNT(*) FROM pg_roles WHERE rolname LIKE 'claimgate\\_%' AND rolsuper",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(supers, 0, "none of the three roles is a superuser");
}

/// Kills the child when dropped (a failed assertion leaves no process behind).
struct Guarded(std::process::Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scopeguard(child: std::process::Child) -> Guarded {
    Guarded(child)
}

#[test]
fn three_nodes_at_the_largest_batches_never_fill_a_stock_lock_table() {
    // 1. A fresh cluster at stock settings (max_locks_per_transaction 64). 40,000 distinct
    //    submissions queued at once.
    // 2. Three nodes drain them with --batch-count-max at its maximum (100,000) and a read
    //    budget that lets a read take thousands; meanwhile pg_locks is sampled.
    // 3. All 40,000 paid once, verify passes, no "out of shared memory" (53200) in the
    //    server's log, and no claimgate backend held more than 40 heavyweight locks at once.
    //    (Before: one advisory lock per group per batch; 53200 for claimgate and for anything
    //    else on the server.)
    let pg = crate::pg::own_cluster();
    let url = pg.create_database("locks").unwrap();
    let w = World::on_postgres_url(&url);
    let n = 40_000;
    let file = w.dir.path().join("burst.jsonl");
    let lines: Vec<String> = (0..n).map(submission).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    w.run_ok(&["init"]);
    w.run_ok(&["produce", file.to_str().unwrap()]);
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (url, sampling) = (url.clone(), sampling.clone());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let (mut most, mut most_shared) = (0i64, 0i64);
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                for row in c
                    .query(
                        "SELECT COUNT(*), COUNT(*) FILTER (WHERE NOT l.fastpath)
                         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                         WHERE a.application_name = 'claimgate' GROUP BY l.pid",
                        &[],
                    )
                    .unwrap()
                {
                    most = most.max(row.get(0));
                    most_shared = most_shared.max(row.get(1));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (most, most_shared)
        })
    };
    let began = Instant::now();
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let consumer = format!("node{i}");
            w.spawn(&[
                "run",
                "--exit-when-idle",
                "--consumer",
                &consumer,
                "--batch-count-max",
                "100000",
                "--read-bytes-max",
                "100000000",
            ])
        })
        .collect();
    for mut worker in workers {
        let status = wait_exit(&mut worker.child, Duration::from_secs(300));
        assert!(status.success(), "{}", worker.log_text());
    }
    let took = began.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    let (most, most_shared) = sampler.join().unwrap();
    assert_eq!(w.count("disbursements"), n as i64);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(n)
    );
    assert_eq!(w.pending(), 0);
    w.run_ok(&["verify"]);
    let log = std::fs::read_to_string(pg.dir().join("server.log")).unwrap();
    assert!(
        !log.contains("out of shared memory") && !log.contains("53200"),
        "{}",
        log.lines()
            .filter(|l| l.contains("shared memory"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        most <= 40,
        "a claimgate backend held {most} heavyweight locks at once ({most_shared} in the shared table)"
    );
    eprintln!(
        "3 nodes, {n} entries in {took:?}; most locks held by one backend at once: {most} \
         ({most_shared} in the shared table)"
    );
}

#[test]
fn verify_names_every_change_to_the_schema_claimgate_did_not_make() {
    // A small ledger, then one change per fresh database, each as a DBA or an insider with the
    // owner's rights could make it; verify exits 1 naming it ("schema altered: …"). Before,
    // verify checked no part of the PostgreSQL schema.
    let changes: [(&str, &str); 10] = [
        (
            "CREATE FUNCTION copy_outbox() RETURNS trigger LANGUAGE plpgsql AS
                 $$BEGIN RETURN NEW; END$$;
             CREATE TRIGGER copy AFTER INSERT ON outbox_rows FOR EACH ROW
                 EXECUTE FUNCTION copy_outbox()",
            "trigger copy on outbox_rows (calling copy_outbox) is not claimgate's",
        ),
        (
            "ALTER TABLE disbursements DROP CONSTRAINT disbursements_claim_id_key",
            "disbursements is no longer unique on (claim_id)",
        ),
        (
            "ALTER TABLE processed_messages ENABLE ROW LEVEL SECURITY;
             CREATE POLICY pass ON processed_messages USING (true)",
            "row-level security policy pass on processed_messages is not claimgate's",
        ),
        (
            "CREATE RULE keep AS ON DELETE TO dead_letters DO INSTEAD NOTHING",
            "rule keep on dead_letters is not claimgate's",
        ),
        (
            "CREATE VIEW paid AS SELECT * FROM disbursements",
            "view paid is not claimgate's",
        ),
        (
            "CREATE OR REPLACE VIEW outbox AS
             SELECT COALESCE(o.id, b.outbox_first + o.batch_index - 1) AS id, o.claim_id,
                    o.event_type, o.payload, o.created_at, o.published_at, o.batch_id,
                    o.batch_index
             FROM outbox_rows o LEFT JOIN audit_batches b ON b.batch_id = o.batch_id
             WHERE o.claim_id <> (SELECT MIN(claim_id) FROM outbox_rows)",
            "the view outbox shows other rows than its definition gives",
        ),
        (
            // The same rows in the same order, two columns' names swapped: a reader asking for
            // `hash` by name reads the previous record's.
            "DROP VIEW audit_log;
             CREATE VIEW audit_log AS
             SELECT seq, kind, idempotency_key, award_id, amount_cents, stream_entry_id,
                    consumer, delivery_count, detail, recorded_at, prev_hash AS hash,
                    hash AS prev_hash, NULL::integer AS batch_index, NULL::bigint AS batch_id
             FROM audit_chain
             UNION ALL
             SELECT b.link_seq - b.record_count + m.batch_index, m.kind, m.idempotency_key,
                    m.award_id, m.amount_cents, m.stream_entry_id, m.consumer, m.delivery_count,
                    m.detail, m.recorded_at, m.prev_hash, m.hash, m.batch_index, m.batch_id
             FROM audit_members m LEFT JOIN audit_batches b ON b.batch_id = m.batch_id",
            "the view audit_log has other columns than its definition",
        ),
        (
            "ALTER TABLE disbursements DISABLE TRIGGER claimgate_claim_on_insert",
            "trigger claimgate_claim_on_insert on disbursements is disabled",
        ),
        (
            "CREATE OR REPLACE FUNCTION claimgate_json(t TEXT) RETURNS JSONB
                 LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RETURN '{}'::jsonb; END;$$",
            "the function claimgate_json is not the one claimgate made",
        ),
        (
            "DELETE FROM claim_locks WHERE stripe = 7",
            "claim_locks holds 65535 rows",
        ),
    ];
    for (change, named) in changes {
        let w = World::on(Store::Postgres);
        w.add(&(0..3).map(submission).collect::<Vec<_>>());
        w.drain(&[]);
        w.run_ok(&["verify"]);
        superuser(&w).batch_execute(change).unwrap();
        let out = w.run(&["verify"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{change}: {err}");
        assert!(
            err.contains("schema altered: ") && err.contains(named),
            "{change}: {err}"
        );
    }
}

#[test]
fn an_extension_in_the_ledgers_schema_is_the_dbas_and_changes_nothing_claimgate_checks() {
    // A DBA adds pg_stat_statements to the application's database as a matter of course, and
    // `CREATE EXTENSION` puts its views in `public`, the schema a ledger is made in when the URL
    // names none. Before: the first `run` refused to make the ledger beside them ("holds
    // objects claimgate did not make (pg_stat_statements, pg_stat_statements_info)"), and on a
    // ledger made first, `verify` failed ("view pg_stat_statements is not claimgate's").
    let w = World::on(Store::Postgres);
    let mut su = superuser(&w);
    su.batch_execute("CREATE EXTENSION pg_stat_statements")
        .unwrap();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 5);
    w.run_ok(&["verify"]);
    // One added after the ledger was made, as an extension's objects: verify passes.
    su.batch_execute("CREATE EXTENSION pg_buffercache").unwrap();
    w.run_ok(&["verify"]);
    // A view the DBA made by hand beside them is still someone else's change to the schema.
    su.batch_execute("CREATE VIEW paid AS SELECT * FROM disbursements")
        .unwrap();
    let out = w.run(&["verify"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("view paid is not claimgate's"), "{err}");
    // And a new ledger is still made only where nothing but an extension's objects are.
    let other = w.another_ledger();
    let mut su_other = postgres::Client::connect(
        other.to_str().unwrap().split('?').next().unwrap(),
        postgres::NoTls,
    )
    .unwrap();
    su_other
        .batch_execute("CREATE EXTENSION pg_stat_statements; CREATE TABLE reports (id int)")
        .unwrap();
    let (code, _, err) = with_db(&w, &["init"], other.to_str().unwrap());
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("holds objects claimgate did not make (reports)"),
        "{err}"
    );
}

#[test]
fn migrate_refuses_a_ledger_in_use_and_one_holding_rows_postgres_cannot_hold() {
    // 1. A SQLite ledger a running worker has open: migrate exits 1 ("in use"), and nothing is
    //    made in the target.
    // 2. The worker stopped, a claim's award id edited to hold a NUL and a hold of an award of
    //    2,500 bytes planted (what an earlier release could store): migrate names both and
    //    exits 1 before copying anything; the target still holds no ledger and the source is
    //    not fenced.
    let w = World::new();
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    let worker = Logged::spawn(w.cmd(&["run", "--consumer", "m1"]));
    assert!(
        wait_for(Duration::from_secs(30), || w
            .count_once_made("disbursements")
            == 3),
        "{}",
        worker.log_text()
    );
    let url = crate::pg::fresh_database();
    let out = w.run(&["migrate", "--to", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is in use") && err.contains("then migrate"),
        "{err}"
    );
    let target = World::on_postgres_url(&url);
    let (code, _, err) = with_db(&target, &["status"], &url);
    assert_ne!(code, Some(0));
    assert!(err.contains("no claimgate ledger"), "{err}");
    assert_eq!(worker.stop().code(), Some(0));

    let mut sql = w.sql();
    sql.exec(
        "UPDATE processed_messages SET award_id = 'A' || char(0) || 'B' WHERE claim_id = 1;
         INSERT INTO legal_holds (award_id, reason, held_at)
             VALUES (printf('%.2500c', 'H'), 'audit', '2026-11-01T09:00:00.000000Z');",
    );
    drop(sql);
    let out = w.run(&["migrate", "--to", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("2 row(s)")
            && err.contains("claim 1: its award_id holds a NUL character")
            && err.contains("hold 1 (2500 bytes): its award_id is over the 2000 bytes")
            && err.contains("nothing was copied"),
        "{err}"
    );
    let (code, _, err) = with_db(&target, &["status"], &url);
    assert_ne!(code, Some(0));
    assert!(err.contains("no claimgate ledger"), "{err}");
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM ledger_meta WHERE name = 'migrated_to'"),
        0,
        "not fenced"
    );
}

#[test]
fn a_sqlite_ledger_that_fails_as_a_whole_dead_letters_nothing_and_ends_run_past_its_limit() {
    // 1. A worker pays 5 submissions into its SQLite ledger.
    // 2. Someone who can write the file drops the outbox table. 5 more arrive: every commit
    //    fails ("no such table"), a failure of the ledger, not of any entry: /healthz turns
    //    503 "commits failing", nothing is dead-lettered, and once --ledger-outage-ms-max has
    //    passed the worker exits 1 with the 5 pending.
    let w = World::new();
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    let mut worker = Logged::spawn(w.cmd(&[
        "run",
        "--consumer",
        "s1",
        "--max-deliveries",
        "1",
        "--quarantine-spacing-ms",
        "100",
        "--claim-idle-ms",
        "300",
        "--ledger-outage-ms-max",
        "4000",
        "--metrics-addr",
        &addr,
    ]));
    assert!(
        wait_for(Duration::from_secs(30), || w
            .count_once_made("disbursements")
            == 5),
        "{}",
        worker.log_text()
    );
    w.sql().exec("DROP TABLE outbox");
    w.add(&(5..10).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(Duration::from_secs(10), || matches!(
            http_get(&addr, "/healthz"),
            Some((503, body)) if body.contains("commits failing") && body.contains("no such table")
        )),
        "{:?}\n{}",
        http_get(&addr, "/healthz"),
        worker.log_text()
    );
    let status = wait_exit(&mut worker.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{}", worker.log_text());
    assert_eq!(w.pending(), 5);
    assert_eq!(w.count("dead_letters"), 0);
    assert_eq!(w.xlen("grants:submissions:dead"), 0);
    assert_eq!(w.count("disbursements"), 5);
}

#[test]
fn a_postgres_server_that_cannot_be_reached_is_named_by_host_and_port() {
    // verify against a port nothing listens on: exit 1, the message names 127.0.0.1:PORT and
    // the database (as psql does), never the password; run waits it out, its one WARN line
    // naming the same.
    let w = World::new();
    let port = free_port().unwrap();
    let url = format!("postgres://claimgate:Secret-PW-9@127.0.0.1:{port}/ledger");
    let (code, _, err) = with_db(&w, &["verify"], &url);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("PostgreSQL at 127.0.0.1:{port} (database ledger)"))
            && !err.contains("Secret-PW-9"),
        "{err}"
    );
    let worker = Logged::spawn(w.cmd(&["run", "--db", &url]));
    worker.wait_log("opening the ledger failed");
    let text = worker.log_text();
    assert!(
        text.contains(&format!("127.0.0.1:{port}")) && !text.contains("Secret-PW-9"),
        "{text}"
    );
    assert_eq!(worker.stop().code(), Some(0));
}

#[test]
fn sigterm_during_a_ledger_outage_stops_the_worker_with_exit_0_and_its_entries_pending() {
    // The ledger fails as a whole (a table dropped) while 4 entries are in hand; SIGTERM is
    // a stop, not a failure: exit 0 within the shutdown tries, the 4 left pending, nothing
    // dead-lettered.
    let w = World::new();
    w.add(&[submission(0)]);
    let mut worker = Logged::spawn(w.cmd(&["run", "--consumer", "t1"]));
    assert!(
        wait_for(Duration::from_secs(30), || w
            .count_once_made("disbursements")
            == 1),
        "{}",
        worker.log_text()
    );
    w.sql().exec("DROP TABLE outbox");
    // One MULTI, and the four seen pending before the stop: added one by one, a loaded box
    // let the stop land while the reader held only some of them (seen once: pending below 4).
    w.add_atomically(&(1..5).map(submission).collect::<Vec<_>>());
    worker.wait_log("committing to the ledger failed");
    assert!(
        wait_for(Duration::from_secs(30), || w.pending() == 4),
        "{}",
        worker.log_text()
    );
    support::signal(&worker.child, libc::SIGTERM);
    let status = wait_exit(&mut worker.child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", worker.log_text());
    assert_eq!(w.pending(), 4);
    assert_eq!(w.count("dead_letters"), 0);
}
