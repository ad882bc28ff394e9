//! The counts a SQLite ledger keeps (`ledger_counts`, src/ledger/sqlite/counts.rs): equal to
//! its rows after a kill between any two statements of any write, read by `status` instead of
//! the rows, checked by `verify`, and written once, counted, for a ledger that kept none.

use crate::audit::{backdate, ONE_PER_BATCH};
use crate::support::{submission, RunWithDeadline, World};
use claimgate::ledger::sqlite::FORMAT_VERSION;
use claimgate::support::failpoint;

/// The counts row, as `(claims, disbursements, cents, dead letters, duplicates, conflicts,
/// vanished, audit records, tombstones)`.
fn kept(w: &World) -> [i64; 9] {
    let mut db = w.sql();
    let text = db.text(
        "SELECT claims || ',' || disbursements || ',' || (cents_high * 4294967296 + cents_low)
                || ',' || dead_letters || ',' || duplicates || ',' || conflicts || ',' || vanished
                || ',' || audit_records || ',' || tombstones FROM ledger_counts WHERE id = 1",
    );
    parse9(&text)
}

/// The same counts, counted from the rows by this test's own SQL.
fn counted(w: &World) -> [i64; 9] {
    let mut db = w.sql();
    let text = db.text(
        "SELECT (SELECT COUNT(*) FROM processed_messages) || ',' || (SELECT COUNT(*) FROM disbursements)
                || ',' || (SELECT COALESCE(SUM(amount_cents), 0) FROM disbursements)
                || ',' || (SELECT COUNT(*) FROM dead_letters)
                || ',' || (SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate')
                || ',' || (SELECT COUNT(*) FROM audit_log WHERE kind = 'conflict')
                || ',' || (SELECT COUNT(*) FROM audit_log WHERE kind = 'vanished')
                || ',' || (SELECT COUNT(*) FROM audit_log)
                || ',' || (SELECT COUNT(*) FROM claim_tombstones)",
    );
    parse9(&text)
}

fn parse9(text: &str) -> [i64; 9] {
    let v: Vec<i64> = text.split(',').map(|n| n.parse().unwrap()).collect();
    v.try_into()
        .unwrap_or_else(|v| panic!("nine counts, got {v:?}"))
}

/// A resubmission of award A-900 at one instant, for `amount` cents: a second amount
/// conflicts with the first.
fn same(amount: i64) -> String {
    format!(
        r#"{{"award_id":"A-900","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{amount},"program":"p"}}"#
    )
}

/// Runs `claimgate` with `args(N)` killed at the 1st, 2nd, … statement inside its write
/// transactions (`write_statement:N`), `before(N)` first, checking after each kill that the
/// kept counts equal the rows, until a run reaches no further statement and exits 0. Returns
/// how many kills there were.
fn kill_at_every_write_statement(
    w: &World,
    before: &dyn Fn(usize),
    args: &dyn Fn(usize) -> Vec<String>,
) -> usize {
    for n in 1.. {
        before(n);
        let args = args(n);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        let out = w
            .cmd(&args)
            .env(failpoint::ENV, format!("write_statement:{n}"))
            .run_with_deadline();
        eprintln!(
            "write statement {n}: {:?}, {}",
            started.elapsed(),
            out.status
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            kept(w),
            counted(w),
            "{args:?} killed at write statement {n}: the kept counts differ from the rows\n{stderr}"
        );
        if !stderr.contains("failpoint write_statement fired") {
            assert!(out.status.success(), "{args:?} failed: {stderr}");
            return n - 1;
        }
        assert!(n < 1_000, "{args:?} never got past its writes");
    }
    unreachable!()
}

#[test]
fn a_kill_between_any_two_statements_of_a_batch_leaves_the_counts_equal_to_the_rows() {
    // 1. Three claims committed. 2. One batch of every kind of item: new claims, a duplicate
    //    of a committed claim and one of a claim earlier in the batch, a malformed entry (a
    //    dead letter) and a conflicting resubmission; the worker is killed at its 1st, 2nd, …
    //    write statement, the counts checked against the rows after each. 3. Then it runs
    //    through: every count is exact, status shows them and verify passes.
    let w = World::new();
    w.add(&[submission(0), submission(1), same(100)]);
    w.drain(&[]);
    assert_eq!(kept(&w), counted(&w));
    let mut batch: Vec<String> = (2..8).map(submission).collect();
    batch.extend([submission(0), submission(2), "not json".into(), same(300)]);
    w.add(&batch);
    // Each try gets the batch as new entries, the killed try's acknowledged (its transaction
    // rolled back): the same batch every time, never an entry redelivered often enough to be
    // tried alone (`--max-deliveries`).
    let fresh_batch = |_| {
        let mut conn = w.conn();
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg("grants:submissions")
            .arg("grant-workers")
            .arg("-")
            .arg("+")
            .arg(1_000)
            .query(&mut conn)
            .unwrap();
        for (id, ..) in pending {
            let _: u64 = redis::cmd("XACK")
                .arg("grants:submissions")
                .arg("grant-workers")
                .arg(id)
                .query(&mut conn)
                .unwrap();
        }
        w.add_atomically(&batch);
    };
    let kills = kill_at_every_write_statement(&w, &fresh_batch, &|_| {
        [
            "run",
            "--consumer",
            "w1",
            "--exit-when-idle",
            "--claim-idle-ms",
            "200",
        ]
        .map(String::from)
        .to_vec()
    });
    // Every statement of the batch, from its first read to its COMMIT, was a kill point.
    assert!(kills >= 10, "only {kills} write statements");
    // Under `--on-conflict record` the conflicting resubmission is paid too, with its record.
    assert_eq!(
        w.count("processed_messages"),
        10,
        "8 submissions and A-900's two"
    );
    assert_eq!(w.pending(), 0);
    let [claims, disbursements, cents, dead, duplicates, conflicts, _, records, _] = kept(&w);
    assert_eq!((claims, disbursements), (10, 10));
    assert_eq!(cents, (0..8).map(|i| 100 + i).sum::<i64>() + 100 + 300);
    assert_eq!((dead, duplicates, conflicts), (1, 2, 1));
    assert_eq!(records, w.count("audit_log"));
    let status: serde_json::Value =
        serde_json::from_slice(&w.run_ok(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["ledger"]["claims"], 10);
    assert_eq!(status["ledger"]["duplicates_suppressed"], 2);
    w.run_ok(&["verify"]);
}

#[test]
fn a_kill_between_any_two_statements_of_a_purge_leaves_the_counts_equal_to_the_rows() {
    // 1. Six claims, published, one per batch; the first four back-dated to 2019. 2. A purge
    //    before 2020 killed at each of its write statements, the counts checked after each.
    //    3. It runs through: four claims fewer, four tombstones, a checkpoint, counts exact.
    let w = World::new();
    w.add(&(0..6).map(submission).collect::<Vec<_>>());
    w.drain(&ONE_PER_BATCH);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 4, "2019-03-01T12:00:00.000000Z");
    // The back-dating rewrote records behind claimgate's back, not their number.
    assert_eq!(kept(&w), counted(&w));
    let dir = w.dir.path().to_owned();
    let kills = kill_at_every_write_statement(&w, &|_| {}, &|n| {
        let export = dir.join(format!("purged-{n}.jsonl"));
        ["retention", "purge", "--before", "2020-01-01", "--export"]
            .map(String::from)
            .into_iter()
            .chain([export.to_str().unwrap().to_owned()])
            .collect()
    });
    assert!(kills >= 5, "only {kills} write statements");
    let [claims, _, cents, _, _, _, _, records, tombstones] = kept(&w);
    assert_eq!((claims, tombstones), (2, 4));
    assert_eq!(cents, 104 + 105);
    assert_eq!(records, w.count("audit_log"));
    w.run_ok(&["verify"]);
}

#[test]
fn status_reads_the_kept_counts_verify_names_one_edited_by_hand_and_a_deleted_row_is_counted_again()
{
    // 1. Five claims. 2. The kept claim count raised by one behind claimgate's back: status
    //    shows the kept number (it does not count the rows), verify fails naming the counter,
    //    both numbers and the way out. 3. The row deleted: the next open counts the rows again
    //    (with a warning), status and verify agree with the rows.
    let w = World::new();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.sql().exec("UPDATE ledger_counts SET claims = claims + 1");
    let status: serde_json::Value =
        serde_json::from_slice(&w.run_ok(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["ledger"]["claims"], 6, "status reads the kept row");
    let out = w.run(&["verify"]);
    assert!(!out.status.success(), "verify passed a hand-edited count");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("ledger_counts says 6 claims, the ledger holds 5")
            && said.contains("DELETE FROM ledger_counts"),
        "{said}"
    );
    w.sql().exec("DELETE FROM ledger_counts");
    let out = w.run_ok(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["ledger"]["claims"], 5);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("counts row was missing"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(kept(&w), counted(&w));
    w.run_ok(&["verify"]);
}

#[test]
fn a_ledger_that_kept_no_counts_is_counted_once_at_its_first_open_and_gets_todays_format() {
    // 1. A ledger made as an earlier release made it: no ledger_counts table, format 3, with
    //    claims, a duplicate and a dead letter. 2. Its first open (status) counts the rows,
    //    writes the row and today's format, and says so; the counts equal the rows. 3. A worker
    //    adds to them exactly; verify passes.
    let w = World::new();
    w.add(&[submission(0), submission(1), submission(0), "{".into()]);
    w.drain(&[]);
    w.sql().exec(
        "DROP TABLE ledger_counts;
         UPDATE ledger_meta SET value = '3' WHERE name = 'format_version';",
    );
    let out = w
        .cmd(&["status", "--json"])
        .env("RUST_LOG", "info")
        .run_with_deadline();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "from format 3 to {FORMAT_VERSION} (counts kept): counted 2 claims"
        )),
        "{said}"
    );
    assert_eq!(
        w.sql()
            .text("SELECT value FROM ledger_meta WHERE name = 'format_version'"),
        FORMAT_VERSION.to_string()
    );
    assert_eq!(kept(&w), counted(&w));
    w.add(&[submission(2), submission(1)]);
    w.drain(&[]);
    let [claims, _, _, dead, duplicates, ..] = kept(&w);
    assert_eq!((claims, dead, duplicates), (3, 1, 2));
    assert_eq!(kept(&w), counted(&w));
    w.run_ok(&["verify"]);
}
