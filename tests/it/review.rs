//! A conflict held for review (`run --on-conflict hold`) decided by a reviewer: `dlq approve`
//! pays it exactly once with who and why on the record, `dlq reject` pays nothing, every other
//! letter and every second decision is refused, and `status`, `dlq list` and `dlq show` say
//! where each stands; every test on both ledgers. (The hold itself is `audit.rs`'s.)

use crate::ops::{http_get, sample};
use crate::support::{wait_for, Logged, Store, World};
use crate::verifier::{agree, anchor, Against};
use claimgate::support::localredis::free_port;
use std::process::Output;

on_both_ledgers!(
    a_held_conflict_approved_is_paid_once_with_who_and_why_and_never_again,
    a_held_conflict_rejected_is_never_paid_and_no_other_letter_can_be_decided,
    two_approvals_at_once_pay_once,
    a_ledger_made_before_decisions_opens_and_decides,
    a_scrape_counts_the_conflicts_awaiting_review_through_their_index_until_decided,
);

/// A submission of award A-35 at one fixed time, for `cents`: any two of them conflict.
fn same(cents: i64) -> String {
    format!(
        r#"{{"award_id":"A-35","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{cents}}}"#
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `claimgate ARGS`, insists on exit `code`, and returns stderr.
fn exits(w: &World, args: &[&str], code: i32) -> String {
    let out = w.run(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "claimgate {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stderr(&out)
}

fn key_of(payload: &str) -> String {
    claimgate::domain::key::derive_idempotency_key(
        "A-35",
        "2026-07-01T09:00:00Z",
        payload.as_bytes(),
    )
    .unwrap()
    .to_hex()
}

/// The dead-letter id of the letter made from original entry `original`.
fn dead_id(w: &World, original: &str) -> String {
    let list: serde_json::Value =
        serde_json::from_slice(&w.run_ok(&["dlq", "list", "--json"]).stdout).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|d| d["original_id"] == original)
        .unwrap_or_else(|| panic!("no dead letter of {original} in {list}"))["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A world where A-35's 100-cent submission is paid and its 300-cent resubmission is held;
/// returns the held entry's id.
fn one_held(store: Store) -> (World, String) {
    let w = World::on(store);
    w.add(&[same(100)]);
    w.drain(&[]);
    let held = w.add(&[same(300)]).remove(0);
    w.drain(&["--on-conflict", "hold"]);
    assert_eq!(w.count("disbursements"), 1, "held, not paid");
    (w, held)
}

fn disbursed(w: &World) -> i64 {
    w.sql_i64("SELECT COALESCE(SUM(amount_cents), 0) FROM disbursements")
}

fn records_of(w: &World, kind: &str) -> i64 {
    w.sql_i64(&format!(
        "SELECT COUNT(*) FROM audit_log WHERE kind = '{kind}'"
    ))
}

fn a_held_conflict_approved_is_paid_once_with_who_and_why_and_never_again(store: Store) {
    // Plan: 1. A paid, B held: status lists B awaiting review, dlq list and show say so.
    // 2. An approval that dies just before its commit leaves nothing. 3. Approved by its
    // dead-letter id: paid once (claim, disbursement, outbox row, processed and conflict
    // records) with a conflict_approved record naming who and why; status lists nothing; verify,
    // audit verify and the independent verifier pass. 4. Approving or rejecting it again is
    // refused naming the approval, nothing paid twice. 5. The relay publishes both payments.
    // 6. The worker still holds a new conflict.
    let (w, held) = one_held(store);
    let s = w.status_json();
    assert_eq!(s["held_conflicts"]["awaiting"], 1, "{s}");
    assert_eq!(s["held_conflicts"]["oldest"][0]["entry_id"], held.as_str());
    assert_eq!(s["held_conflicts"]["oldest"][0]["award_id"], "A-35");
    let text = stdout(&w.run_ok(&["status"]));
    assert!(text.contains("held conflicts awaiting review"), "{text}");
    assert!(
        text.contains(&format!("entry {held}")) && text.contains("award A-35"),
        "{text}"
    );
    let dead = dead_id(&w, &held);
    let list = stdout(&w.run_ok(&["dlq", "list"]));
    assert!(list.contains("[awaiting review"), "{list}");
    let show = stdout(&w.run_ok(&["dlq", "show", &held]));
    assert!(show.contains("decision: awaiting review"), "{show}");

    // 2.
    let approve = [
        "dlq",
        "approve",
        &dead,
        "--by",
        "Ann Auditor",
        "--reason",
        "invoice 7 corrected",
    ];
    w.crash_at(w.cmd(&approve), "before_decision_commit");
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(records_of(&w, "conflict_approved"), 0);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE decision IS NOT NULL"),
        0
    );

    // 3.
    let said = stdout(&w.run_ok(&approve));
    assert!(said.contains("paid $3.00 (300 cents) once"), "{said}");
    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(disbursed(&w), 400);
    assert_eq!(w.count("processed_messages"), 2);
    assert_eq!(w.count("outbox"), 2);
    let key = key_of(&same(300));
    let audit_key = w.audit_key_hex_sql("idempotency_key");
    assert_eq!(
        w.sql_i64(&format!(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'processed' AND {audit_key} = '{key}'
             AND amount_cents = 300 AND stream_entry_id = '{held}'"
        )),
        1
    );
    assert_eq!(
        w.sql_i64(&format!(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict' AND {audit_key} = '{key}'
             AND detail LIKE '%{}%paid on approval after review'",
            key_of(&same(100))
        )),
        1
    );
    assert_eq!(
        w.sql_text(&format!(
            "SELECT detail FROM audit_log WHERE kind = 'conflict_approved'
             AND {audit_key} = '{key}' AND stream_entry_id = '{held}'"
        )),
        "approved by Ann Auditor: invoice 7 corrected"
    );
    assert_eq!(
        w.sql_text(&format!(
            "SELECT decision || '|' || decided_by || '|' || decided_reason FROM dead_letters
             WHERE stream_entry_id = '{held}'"
        )),
        "approved|Ann Auditor|invoice 7 corrected"
    );
    let s = w.status_json();
    assert_eq!(s["held_conflicts"]["awaiting"], 0, "{s}");
    assert_eq!(s["ledger"]["disbursements"], 2);
    assert!(!stdout(&w.run_ok(&["status"])).contains(&format!("entry {held}")));
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, None);
    agree(
        &w,
        Against {
            anchors: Some(&anchors),
            ..Against::default()
        },
        0,
    );
    // The auditor's report counts the approval and lists it among the exceptions.
    let report = w.dir.path().join("report.html");
    w.run_ok(&["audit", "report", "--out", report.to_str().unwrap()]);
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(
        page.contains(r#"<span data-figure="chain.conflicts_approved" data-value="1">"#)
            && page.contains(r#"<span data-figure="chain.conflicts_rejected" data-value="0">"#),
        "{page}"
    );
    assert!(
        page.contains(r#"data-kind="conflict_approved""#)
            && page.contains("approved by Ann Auditor: invoice 7 corrected"),
        "{page}"
    );
    let show = stdout(&w.run_ok(&["dlq", "show", &dead]));
    assert!(
        show.contains("decision: approved by Ann Auditor at"),
        "{show}"
    );
    assert!(stdout(&w.run_ok(&["dlq", "list"])).contains("[approved by Ann Auditor at"));

    // 4.
    let again = exits(
        &w,
        &["dlq", "approve", &held, "--by", "Bo", "--reason", "x"],
        1,
    );
    assert!(
        again.contains("was already approved by Ann Auditor at")
            && again.contains("invoice 7 corrected"),
        "{again}"
    );
    let reject = exits(
        &w,
        &["dlq", "reject", &dead, "--by", "Bo", "--reason", "x"],
        1,
    );
    assert!(
        reject.contains("was already approved by Ann Auditor"),
        "{reject}"
    );
    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(disbursed(&w), 400);
    assert_eq!(records_of(&w, "conflict_approved"), 1);
    assert_eq!(records_of(&w, "conflict_rejected"), 0);

    // 5.
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 2);

    // 6.
    let next = w.add(&[same(500)]).remove(0);
    w.drain(&["--on-conflict", "hold"]);
    assert_eq!(
        w.count("disbursements"),
        2,
        "a new conflict is held, not paid"
    );
    assert_eq!(
        w.sql_i64(&format!(
            "SELECT COUNT(*) FROM dead_letters WHERE reason_code = 'conflict_hold'
             AND stream_entry_id = '{next}' AND decision IS NULL"
        )),
        1
    );
    let s = w.status_json();
    assert_eq!(s["held_conflicts"]["awaiting"], 1);
    assert_eq!(s["held_conflicts"]["oldest"][0]["entry_id"], next.as_str());
    w.run_ok(&["verify"]);
}

fn a_held_conflict_rejected_is_never_paid_and_no_other_letter_can_be_decided(store: Store) {
    // Plan: 1. Flags: --by and --reason required, non-empty, one line, bounded (exit 2).
    // 2. A letter that is not a held conflict (not JSON) is refused naming what it is, and a
    // letter forged in Redis for the held entry is refused for its key. 3. The
    // held one rejected: nothing paid, a conflict_rejected record with who and why, status lists
    // nothing, verify passes; approving it then is refused naming the rejection. 4. verify
    // names a decision cleared or made up by an edit of the row.
    let (w, held) = one_held(store);
    let bad = w.add_fields(&[("payload", &b"not json"[..])]);
    w.drain(&["--on-conflict", "hold"]);

    // 1.
    for args in [
        vec!["dlq", "reject", held.as_str(), "--reason", "why"],
        vec!["dlq", "reject", held.as_str(), "--by", "Bo"],
        vec![
            "dlq",
            "reject",
            held.as_str(),
            "--by",
            "",
            "--reason",
            "why",
        ],
        vec![
            "dlq",
            "reject",
            held.as_str(),
            "--by",
            "  ",
            "--reason",
            "why",
        ],
        vec![
            "dlq",
            "reject",
            held.as_str(),
            "--by",
            "Bo",
            "--reason",
            "a\nforged line",
        ],
        vec![
            "dlq",
            "reject",
            held.as_str(),
            "--by",
            "B\u{202e}o",
            "--reason",
            "why",
        ],
    ] {
        exits(&w, &args, 2);
    }
    let long = "x".repeat(129);
    let msg = exits(
        &w,
        &["dlq", "reject", &held, "--by", &long, "--reason", "y"],
        2,
    );
    assert!(msg.contains("at most 128"), "{msg}");
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE decision IS NOT NULL"),
        0
    );

    // 2.
    for verb in ["approve", "reject"] {
        let msg = exits(&w, &["dlq", verb, &bad, "--by", "Bo", "--reason", "why"], 1);
        assert!(
            msg.contains("is a not_json dead letter, not a conflict held for review"),
            "{msg}"
        );
    }
    let msg = exits(
        &w,
        &["dlq", "approve", "1-999", "--by", "Bo", "--reason", "why"],
        1,
    );
    assert!(msg.contains("no dead letter 1-999"), "{msg}");
    // A letter forged in Redis for the held entry, carrying another payload, pays nothing.
    let forged: String = redis::cmd("XADD")
        .arg("grants:submissions:dead")
        .arg("*")
        .arg("original_id")
        .arg(&held)
        .arg("reason_code")
        .arg("conflict_hold")
        .arg("original.payload")
        .arg(same(90_000))
        .query(&mut w.conn())
        .unwrap();
    let msg = exits(
        &w,
        &["dlq", "approve", &forged, "--by", "Eve", "--reason", "x"],
        1,
    );
    assert!(
        msg.contains("does not hold the submission the ledger held")
            && msg.contains(&key_of(&same(300))),
        "{msg}"
    );
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM dead_letters WHERE decision IS NOT NULL"),
        0
    );

    // 3.
    let said = stdout(&w.run_ok(&[
        "dlq",
        "reject",
        &held,
        "--by",
        "Bo Reviewer",
        "--reason",
        "duplicate invoice",
    ]));
    assert!(said.contains("nothing paid"), "{said}");
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(disbursed(&w), 100);
    assert_eq!(w.count("processed_messages"), 1);
    assert_eq!(w.count("outbox"), 1);
    assert_eq!(
        w.sql_text(&format!(
            "SELECT detail FROM audit_log WHERE kind = 'conflict_rejected'
             AND stream_entry_id = '{held}' AND {} = '{}'",
            w.audit_key_hex_sql("idempotency_key"),
            key_of(&same(300))
        )),
        "rejected by Bo Reviewer: duplicate invoice; not paid"
    );
    assert_eq!(w.status_json()["held_conflicts"]["awaiting"], 0);
    w.run_ok(&["verify"]);
    agree(&w, Against::default(), 0);
    let msg = exits(
        &w,
        &["dlq", "approve", &held, "--by", "Ann", "--reason", "x"],
        1,
    );
    assert!(
        msg.contains("was already rejected by Bo Reviewer at") && msg.contains("duplicate invoice"),
        "{msg}"
    );
    assert_eq!(w.count("disbursements"), 1);
    let show = stdout(&w.run_ok(&["dlq", "show", &held]));
    assert!(show.contains("decision: rejected by Bo Reviewer"), "{show}");

    // 4.
    let mut db = w.sql();
    db.exec(&format!(
        "UPDATE dead_letters SET decision = NULL, decided_by = NULL, decided_reason = NULL,
         decided_at = NULL WHERE stream_entry_id = '{held}'"
    ));
    let msg = exits(&w, &["verify"], 1);
    assert!(
        msg.contains("held conflict decisions differ from the audit trail"),
        "{msg}"
    );
    db.exec(&format!(
        "UPDATE dead_letters SET decision = 'rejected', decided_by = 'Bo Reviewer',
         decided_reason = 'duplicate invoice',
         decided_at = (SELECT recorded_at FROM audit_log WHERE kind = 'conflict_rejected')
         WHERE stream_entry_id = '{held}'"
    ));
    w.run_ok(&["verify"]);
    db.exec(&format!(
        "UPDATE dead_letters SET decision = 'approved' WHERE stream_entry_id = '{held}'"
    ));
    assert!(exits(&w, &["verify"], 1).contains("held conflict decisions differ"));
    db.exec(&format!(
        "UPDATE dead_letters SET decision = 'rejected' WHERE stream_entry_id = '{held}'"
    ));
    w.run_ok(&["verify"]);
}

fn two_approvals_at_once_pay_once(store: Store) {
    // Two reviewers approve the same held conflict at the same moment: one approval, one
    // payment; the other is refused naming it.
    let (w, held) = one_held(store);
    let spawn = |who: &str| {
        w.cmd(&[
            "dlq",
            "approve",
            &held,
            "--by",
            who,
            "--reason",
            "same time",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (spawn("Ann"), spawn("Bo"));
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let ok = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 1, "{}{}", stderr(&outs[0]), stderr(&outs[1]));
    let refused = outs.iter().find(|o| !o.status.success()).unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(refused).contains("was already approved by"),
        "{}",
        stderr(refused)
    );
    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(disbursed(&w), 400);
    assert_eq!(records_of(&w, "conflict_approved"), 1);
    w.run_ok(&["verify"]);
}

fn a_ledger_made_before_decisions_opens_and_decides(store: Store) {
    // A ledger whose dead_letters has no decision columns (an earlier release's) and a held
    // conflict in it: on SQLite the next open adds them; on PostgreSQL (format 2) a command
    // that may not change the schema says to run init, and init upgrades it. Then the held
    // conflict is listed and approved as on a new ledger.
    let (w, held) = one_held(store);
    let mut db = w.sql();
    match store {
        Store::Sqlite => {
            // The release before decisions had no index of the conflicts awaiting one.
            db.exec("DROP INDEX dead_letters_awaiting_review");
            for c in ["decision", "decided_by", "decided_reason", "decided_at"] {
                db.exec(&format!("ALTER TABLE dead_letters DROP COLUMN {c}"));
            }
        }
        Store::Postgres => {
            db.exec(
                "ALTER TABLE dead_letters DROP COLUMN decision, DROP COLUMN decided_by,
                     DROP COLUMN decided_reason, DROP COLUMN decided_at;
                 UPDATE ledger_meta SET value = '2' WHERE name = 'format_version'",
            );
            let msg = exits(&w, &["status"], 2);
            assert!(
                msg.contains("is format 2") && msg.contains("claimgate init"),
                "{msg}"
            );
            w.run_ok(&["init"]);
        }
    }
    assert_eq!(w.status_json()["held_conflicts"]["awaiting"], 1);
    let index = match store {
        Store::Sqlite => {
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'dead_letters_awaiting_review'"
        }
        Store::Postgres => {
            "SELECT COUNT(*) FROM pg_class WHERE relname = 'dead_letters_awaiting_review'"
        }
    };
    assert_eq!(
        w.sql_i64(index),
        1,
        "the upgrade made the index of those awaiting review"
    );
    w.run_ok(&["dlq", "approve", &held, "--by", "Ann", "--reason", "ok"]);
    assert_eq!(w.count("disbursements"), 2);
    assert_eq!(disbursed(&w), 400);
    w.run_ok(&["verify"]);
}

#[test]
fn a_migrated_ledger_keeps_its_decisions_and_verifies() {
    // A SQLite ledger with one held conflict approved and one rejected, migrated to
    // PostgreSQL: the decisions are copied with their rows, both ledgers verify, and the
    // decided letters stay decided there.
    let (w, approved) = one_held(Store::Sqlite);
    let rejected = w.add(&[same(700)]).remove(0);
    w.drain(&["--on-conflict", "hold"]);
    w.run_ok(&["dlq", "approve", &approved, "--by", "Ann", "--reason", "ok"]);
    w.run_ok(&["dlq", "reject", &rejected, "--by", "Bo", "--reason", "no"]);
    let url = crate::pg::fresh_database();
    w.run_ok(&["migrate", "--to", &url]);
    let pg = World::on_postgres_url(&url);
    pg.run_ok(&["verify"]);
    assert_eq!(
        pg.sql_text(
            "SELECT string_agg(decision || ' by ' || decided_by, ', ' ORDER BY decision)
             FROM dead_letters"
        ),
        "approved by Ann, rejected by Bo"
    );
    assert_eq!(pg.count("disbursements"), 2);
    assert_eq!(disbursed(&pg), 400);
}

fn a_scrape_counts_the_conflicts_awaiting_review_through_their_index_until_decided(store: Store) {
    // A conflict held for review is a payment waiting on a person. Each /metrics scrape counts
    // those awaiting a decision and how long the oldest has waited (the alert
    // ClaimgateConflictAwaitingReview reads both); approved, the count is 0. The count is
    // read through the ledger's partial index of them, not every dead letter: with the
    // query's own text, each planner names the index.
    let (w, held) = one_held(store);
    let addr = format!("127.0.0.1:{}", free_port().expect("a free port"));
    let worker = Logged::spawn(w.cmd(&["run", "--on-conflict", "hold", "--metrics-addr", &addr]));
    let scrape = || {
        http_get(&addr, "/metrics")
            .filter(|(code, _)| *code == 200)
            .map(|(_, text)| text)
    };
    assert!(
        wait_for(std::time::Duration::from_secs(60), || scrape().is_some()),
        "no scrape:\n{}",
        worker.log_text()
    );
    let text = scrape().unwrap();
    assert_eq!(
        sample(&text, "claimgate_conflicts_awaiting_review"),
        Some(1.0),
        "{text}"
    );
    let waited = sample(&text, "claimgate_conflict_review_oldest_age_seconds").unwrap();
    assert!(waited > 0.0 && waited < 600.0, "{text}");

    let dead = dead_id(&w, &held);
    w.run_ok(&[
        "dlq", "approve", &dead, "--by", "Ann", "--reason", "checked",
    ]);
    let text = scrape().unwrap();
    assert_eq!(
        sample(&text, "claimgate_conflicts_awaiting_review"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "claimgate_conflict_review_oldest_age_seconds"),
        Some(0.0)
    );
    worker.stop();
    assert_eq!(w.count("disbursements"), 2, "approved: paid");

    let query = format!(
        "SELECT COUNT(*) FROM dead_letters WHERE stream = 'grants:submissions' AND {}",
        claimgate::ledger::AWAITING_REVIEW
    );
    let plan = match store {
        Store::Sqlite => {
            let db = rusqlite::Connection::open(&w.db).unwrap();
            let mut plan = db.prepare(&format!("EXPLAIN QUERY PLAN {query}")).unwrap();
            let details = plan
                .query_map([], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            details.join("; ")
        }
        Store::Postgres => {
            let crate::support::Sql::Postgres(mut db) = w.sql() else {
                unreachable!("a PostgreSQL world")
            };
            // The table holds two rows: a scan of it is cheaper, and would be chosen.
            db.batch_execute("SET enable_seqscan = off").unwrap();
            db.query(&format!("EXPLAIN {query}"), &[])
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    assert!(plan.contains("dead_letters_awaiting_review"), "{plan}");
}
