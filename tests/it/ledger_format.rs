//! The SQLite ledger's stored format (`ledger_meta.format_version`, `ledger/sqlite/format.rs`):
//! recorded when a ledger is made or first opened by this release, refused when newer than
//! this build, and held by `verify` to the shape of the claim index; a ledger of an earlier
//! format has its counts counted again. Real binary, real files.

use crate::support::{submission, World};
use claimgate::ledger::sqlite::FORMAT_VERSION;

/// The format the ledger stores, as text ("" when none).
fn stored(w: &World) -> String {
    w.sql_text("SELECT (SELECT value FROM ledger_meta WHERE name = 'format_version')")
}

/// Sets (or, with `None`, removes) the stored format by hand.
fn store(w: &World, format: Option<&str>) {
    let conn = rusqlite::Connection::open(&w.db).unwrap();
    conn.execute("DELETE FROM ledger_meta WHERE name = 'format_version'", [])
        .unwrap();
    if let Some(format) = format {
        conn.execute(
            "INSERT INTO ledger_meta (name, value) VALUES ('format_version', ?1)",
            [format],
        )
        .unwrap();
    }
}

#[test]
fn a_ledger_made_today_stores_its_format_and_one_set_back_by_hand_is_counted_again() {
    // 1. A worker makes a ledger and pays three submissions: the ledger stores this build's
    //    format, and verify passes.
    // 2. The stored format set back to 3 and the kept claim count edited (as if an earlier
    //    release, which counts nothing, had written to it): the next open takes it for an
    //    earlier release's ledger, counts its rows again, replacing the edited count, and
    //    stores this build's format; verify passes.
    let w = World::new();
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(stored(&w), FORMAT_VERSION.to_string());
    w.run_ok(&["verify"]);

    store(&w, Some("3"));
    w.sql().exec("UPDATE ledger_counts SET claims = 7");
    w.run_ok(&["verify"]);
    assert_eq!(stored(&w), FORMAT_VERSION.to_string());
    assert_eq!(w.sql_i64("SELECT claims FROM ledger_counts"), 3);
}

#[test]
fn a_ledger_of_a_newer_format_is_refused_with_exit_2_and_left_as_it_is() {
    // 1. A ledger pays three submissions; its format is then set one past this build's by hand.
    // 2. `run`, `status` and `verify` each refuse it with exit 2, naming the format, and two
    //    new submissions stay unpaid.
    // 3. The ledger file is byte for byte what it was, its format still the newer one.
    let w = World::new();
    w.add(&(0..3).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let newer = (FORMAT_VERSION + 1).to_string();
    store(&w, Some(&newer));
    let before = std::fs::read(&w.db).unwrap();

    w.add(&(3..5).map(submission).collect::<Vec<_>>());
    for args in [
        &["run", "--exit-when-idle"][..],
        &["status"][..],
        &["verify"][..],
    ] {
        let out = w.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("is format {newer}, made by a newer claimgate")),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(std::fs::read(&w.db).unwrap(), before, "the ledger changed");
    assert_eq!(stored(&w), newer);
    assert_eq!(w.count("processed_messages"), 3);
}

#[test]
fn an_older_ledger_opens_and_gets_its_format() {
    // 1. A ledger made by the release before instants led the claim index (fixture
    //    schema-v2.sql) is opened by a worker: it keeps that index, records format 4 (counts
    //    kept, `counts.rs`), its counts are its rows', and verify passes.
    // 2. A ledger as the previous release made it (today's claim index, no format stored) is
    //    opened by `status`: it records this build's format, and verify passes.
    let old = World::new();
    rusqlite::Connection::open(&old.db)
        .unwrap()
        .execute_batch(include_str!("fixtures/schema-v2.sql"))
        .unwrap();
    assert_eq!(stored(&old), "");
    old.add(&(0..3).map(submission).collect::<Vec<_>>());
    old.drain(&[]);
    assert_eq!(stored(&old), FORMAT_VERSION.to_string());
    assert_eq!(old.count("processed_messages"), 3);
    assert_eq!(old.sql_i64("SELECT claims FROM ledger_counts"), 3);
    old.run_ok(&["verify"]);

    let previous = World::new();
    previous.add(&(0..3).map(submission).collect::<Vec<_>>());
    previous.drain(&[]);
    store(&previous, None);
    assert_eq!(stored(&previous), "");
    previous.run_ok(&["status"]);
    assert_eq!(stored(&previous), FORMAT_VERSION.to_string());
    previous.run_ok(&["verify"]);
}
