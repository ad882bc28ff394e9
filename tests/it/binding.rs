//! One consumer group, one ledger: the first worker binds its group to its ledger's id in Redis
//! (`<stream>:ledgers`), a worker whose ledger is another refuses to read (exit 2) naming both
//! ids, and `restore` and `migrate` carry the binding over: a ledger put back or moved keeps
//! its id, a backup of another ledger does not.

use crate::support::{submission, RunWithDeadline, World};
use std::path::Path;

/// The id a SQLite ledger file carries (`ledger_meta`).
fn ledger_id_of(db: &Path) -> String {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(
        "SELECT value FROM ledger_meta WHERE name = 'ledger_id'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// Rows of `table` in the SQLite ledger file `db`.
fn count_in(db: &Path, table: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

/// The ledger the group `group` of `grants:submissions` is bound to.
fn bound(w: &World, group: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg("grants:submissions:ledgers")
        .arg(group)
        .query(&mut w.conn())
        .unwrap()
}

#[test]
fn a_second_ledger_on_one_group_refuses_to_read_and_pays_nothing() {
    // Issue 39: worker A on a.db crashed after a commit, worker B on b.db in the same group
    // took its entries over, and both ledgers showed the same 100 payments.
    // 1. Worker A (a.db) reads 100 submissions and dies right after committing (some of) them:
    //    paid in a.db, all still pending in Redis, and the group bound to a.db's id.
    // 2. Worker B (b.db), same group, would take them over at once (--claim-idle-ms 200): it
    //    refuses instead, exit 2, naming both ledger ids and what to do. b.db pays nothing;
    //    the 100 stay pending.
    // 3. A restarted finds them claimed: 100 paid once, nothing pending.
    // 4. B with a group of its own reads the stream into b.db, which is that group's ledger.
    let w = World::new();
    let a_db = w.dir.path().join("a.db");
    let b_db = w.dir.path().join("b.db");
    w.add(&(0..100).map(submission).collect::<Vec<_>>());
    let mut a = w.cmd(&["run", "--consumer", "a"]);
    a.env("CLAIMGATE_DB", &a_db);
    w.crash_at(a, "after_commit");
    let paid_by_a = count_in(&a_db, "disbursements");
    assert!(paid_by_a > 0, "A committed nothing before it died");
    assert_eq!(w.pending(), 100);

    let out = w
        .cmd(&[
            "run",
            "--exit-when-idle",
            "--consumer",
            "b",
            "--claim-idle-ms",
            "200",
        ])
        .env("CLAIMGATE_DB", &b_db)
        .run_with_deadline();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(count_in(&b_db, "disbursements"), 0, "b.db paid: {stderr}");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let a_id = ledger_id_of(&a_db);
    assert_eq!(bound(&w, "grant-workers").as_deref(), Some(a_id.as_str()));
    let b_id = ledger_id_of(&b_db);
    let said = stderr.lines().last().unwrap_or("");
    for part in [
        format!("consumer group grant-workers of grants:submissions belongs to ledger {a_id}"),
        format!(
            "but this worker's ledger {} is ledger {b_id}",
            b_db.display()
        ),
        "--group NAME".to_owned(),
        format!("point --db at ledger {a_id}"),
    ] {
        assert!(said.contains(&part), "wanted {part:?} in:\n{stderr}");
    }
    assert_eq!(w.pending(), 100);

    let mut a = w.cmd(&[
        "run",
        "--exit-when-idle",
        "--consumer",
        "a",
        "--claim-idle-ms",
        "200",
    ]);
    a.env("CLAIMGATE_DB", &a_db);
    let out = a.run_with_deadline();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count_in(&a_db, "disbursements"), 100);
    assert_eq!(w.pending(), 0);

    let out = w
        .cmd(&["run", "--exit-when-idle", "--group", "for-b"])
        .env("CLAIMGATE_DB", &b_db)
        .run_with_deadline();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count_in(&b_db, "disbursements"), 100);
    assert_eq!(bound(&w, "for-b").as_deref(), Some(b_id.as_str()));
}

#[test]
fn a_restored_backup_of_the_ledger_keeps_its_group_and_one_of_another_ledger_is_refused() {
    // 1. A worker binds the group to ledger L and pays 10; a backup of L is taken; 5 more.
    // 2. `restore` of L's backup says the group is bound to this ledger; a worker reads on
    //    and pays 5 new submissions (15 in the restored ledger).
    // 3. Another ledger M (its own group) is backed up and restored over L: `restore` says the
    //    group is bound to L, not M; a worker refuses (exit 2) and pays nothing.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let l_id = ledger_id_of(&w.db);
    let backup = w.dir.path().join("l.backup");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    w.add(&(10..15).map(submission).collect::<Vec<_>>());
    w.drain(&[]);

    let out = w.run_ok(&["restore", backup.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "consumer group grant-workers of grants:submissions is bound to this ledger \
             ({l_id}): its workers read on"
        )),
        "{said}"
    );
    w.add(&(15..20).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 15);
    assert_eq!(ledger_id_of(&w.db), l_id);

    let m_db = w.dir.path().join("m.db");
    let out = w
        .cmd(&["run", "--exit-when-idle", "--group", "for-m"])
        .env("CLAIMGATE_DB", &m_db)
        .run_with_deadline();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m_id = ledger_id_of(&m_db);
    let m_backup = w.dir.path().join("m.backup");
    w.cmd(&["backup", m_backup.to_str().unwrap()])
        .env("CLAIMGATE_DB", &m_db)
        .run_with_deadline();
    let out = w.run_ok(&["restore", m_backup.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "note: consumer group grant-workers of grants:submissions is bound to ledger \
             {l_id}, not to this backup's ledger {m_id}"
        )),
        "{said}"
    );
    let before = w.count("disbursements");
    w.add(&(20..25).map(submission).collect::<Vec<_>>());
    let out = w.run(&["run", "--exit-when-idle"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("belongs to ledger {l_id}")),
        "{stderr}"
    );
    assert_eq!(w.count("disbursements"), before, "the other ledger paid");
}

#[test]
fn a_ledger_migrated_to_postgresql_keeps_its_id_and_so_its_group() {
    // `migrate` copies `ledger_meta`, the ledger's id with it, so the group bound to the SQLite
    // ledger reads on into the PostgreSQL one.
    // 1. A worker on SQLite binds the group and pays 10.
    // 2. migrate --to a fresh PostgreSQL database: it carries the same id.
    // 3. A worker on PostgreSQL, same group: accepted, pays 5 new submissions.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let id = ledger_id_of(&w.db);
    let url = crate::pg::fresh_database();
    w.run_ok(&["migrate", "--to", &url]);
    let pg = World::on_postgres_url(&url);
    assert_eq!(
        pg.sql_text("SELECT value FROM ledger_meta WHERE name = 'ledger_id'"),
        id
    );
    w.add(&(10..15).map(submission).collect::<Vec<_>>());
    let out = w
        .cmd(&["run", "--exit-when-idle"])
        .env("CLAIMGATE_DB", &url)
        .run_with_deadline();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pg.count("disbursements"), 15);
    assert_eq!(bound(&w, "grant-workers").as_deref(), Some(id.as_str()));
}
