//! Issue 13's attacks on the evidence, each reproduced against real files and real processes:
//! a purge followed by a replay of the stream, a fast-filter marker planted in Redis, a claim
//! deleted behind its duplicate records and the chain re-sealed, a dead-letter row deleted, a
//! ledger put back by hand after a loss, holds that left no record, and commands that made a
//! ledger out of a typo. `restore` and tombstones are what stop them.

use crate::audit::backdate;
use crate::support::{self, submission, RunWithDeadline, World};
use rusqlite::Connection;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A writable connection to the ledger, as someone with the file would have.
fn rw(w: &World) -> Connection {
    Connection::open(&w.db).unwrap()
}

/// A file's permission bits.
fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The idempotency key of fixture submission `i`, in hex.
fn key_of(i: usize) -> String {
    support::parsed(i).key.to_hex()
}

/// Re-seals the whole chain after an edit, as an adversary who can compute SHA-256 would.
fn reseal(db: &Connection) {
    let records = claimgate::ledger::sqlite::audit_store::all(db).unwrap();
    let mut prev = claimgate::domain::audit::GENESIS_HASH.to_owned();
    for mut r in records {
        r.seal(&prev);
        db.execute(
            "UPDATE audit_log SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![r.prev_hash, r.hash, r.seq],
        )
        .unwrap();
        prev = r.hash;
    }
}

/// Idempotency keys of every event on `grants:events`, with how often each appears, and the
/// event ids carrying each.
fn events_by_key(w: &World) -> std::collections::BTreeMap<String, Vec<i64>> {
    let mut by_key = std::collections::BTreeMap::<String, Vec<i64>>::new();
    for e in w.events() {
        let payload: serde_json::Value = serde_json::from_str(&e["payload"]).unwrap();
        let key = payload["idempotency_key"].as_str().unwrap().to_owned();
        by_key
            .entry(key)
            .or_default()
            .push(e["event_id"].parse().unwrap());
    }
    by_key
}

/// Every outbox row of the ledger as (id, idempotency key, published).
fn outbox_rows(w: &World) -> Vec<(i64, String, bool)> {
    let db = Connection::open(&w.db).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT o.id, lower(hex(p.idempotency_key)), o.published_at IS NOT NULL
             FROM outbox o JOIN disbursements d ON d.claim_id = o.claim_id
             JOIN processed_messages p ON p.claim_id = d.claim_id ORDER BY o.id",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    rows
}

/// Every disbursement in the ledger is on `grants:events` exactly once, under its own outbox
/// id, and every outbox row marked published is one of them.
fn assert_events_exactly_once(w: &World) {
    let events = events_by_key(w);
    for (id, key, published) in outbox_rows(w) {
        assert!(
            published,
            "outbox row {id} (key {key}) is still unpublished"
        );
        assert_eq!(
            events.get(&key),
            Some(&vec![id]),
            "outbox row {id} (key {key}) must be on grants:events exactly once, as event {id}"
        );
    }
}

/// Removes the ledger and its WAL files, as a lost disk would.
fn lose_the_ledger(w: &World) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = w.db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn a_purged_submission_replayed_from_a_recreated_group_is_a_duplicate_and_never_paid_twice() {
    // 1. 10 submissions, drained and published; every record moved back to 2019.
    // 2. Purge before 2020: claims gone, 10 tombstones left.
    // 3. The consumer group destroyed and recreated at id 0, plus 2 new submissions: the
    //    worker replays the 10 purged entries and pays only the 2 new ones.
    // 4. The 10 replays are duplicates citing their tombstones; verify passes; status shows
    //    the tombstones.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 10, "2019-03-01T12:00:00.000000Z");
    w.run_ok(&["retention", "purge", "--before", "2020-01-01"]);
    assert_eq!(w.count("processed_messages"), 0);
    assert_eq!(w.count("claim_tombstones"), 10);

    let mut conn = w.conn();
    let _: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg("grants:submissions")
        .arg("grant-workers")
        .query(&mut conn)
        .unwrap();
    let _: String = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("grants:submissions")
        .arg("grant-workers")
        .arg("0")
        .query(&mut conn)
        .unwrap();
    w.add(&[submission(10), submission(11)]);
    w.drain(&[]);

    assert_eq!(w.count("disbursements"), 2, "only the two new ones paid");
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        110 + 111
    );
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate'
             AND detail LIKE 'first claimed at 2019-03-01T12:00:00.000000Z; claim purged at %(tombstone)'"
        ),
        10,
        "each replay cites its tombstone"
    );
    assert_eq!(w.pending(), 0);
    let verified = stdout(&w.run_ok(&["verify"]));
    assert!(verified.contains("10 tombstones"), "{verified}");
    let status = stdout(&w.run_ok(&["status", "--json"]));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["ledger"]["tombstones"], 10, "{status}");
}

#[test]
fn a_ledger_purged_before_tombstones_gets_them_back_from_its_duplicate_records() {
    // 1. 5 submissions, then each resent (5 duplicate records); published; the 5 processed
    //    records moved back to 2019 and purged; then the tombstone table dropped, as a ledger
    //    an earlier release purged would be.
    // 2. The next open upgrades it: 5 tombstones rebuilt from the duplicate records, verify
    //    passes, and a third delivery of each is a duplicate, not a payment.
    let w = World::new();
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    backdate(&w, 5, "2019-03-01T12:00:00.000000Z");
    w.run_ok(&["retention", "purge", "--before", "2020-01-01"]);
    rw(&w).execute_batch("DROP TABLE claim_tombstones").unwrap();

    let verified = stdout(&w.run_ok(&["verify"]));
    assert!(verified.contains("5 tombstones"), "{verified}");
    assert_eq!(
        w.sql_i64(
            "SELECT COUNT(*) FROM claim_tombstones t JOIN audit_log a ON a.kind = 'duplicate'
             AND a.idempotency_key = t.idempotency_key
             AND a.detail = 'first claimed at ' || t.claimed_at"
        ),
        5,
        "each rebuilt from the duplicate record that cited its claim"
    );
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("disbursements"), 0);
    w.run_ok(&["verify"]);
}

#[test]
fn a_fast_filter_marker_planted_for_a_never_processed_submission_is_not_trusted() {
    // 1. Submission 1 is queued; someone with Redis write access plants its marker.
    // 2. The worker with --fast-filter pays it once and logs a WARN naming entry and key.
    // 3. A resend (its marker now true) is a duplicate: still paid once; verify passes.
    let w = World::new();
    let ids = w.add(&[submission(1)]);
    let key = key_of(1);
    let _: () = redis::cmd("SET")
        .arg(format!("grants:submissions:committed:grant-workers:{key}"))
        .arg("2026-01-01T00:00:00.000000Z")
        .query(&mut w.conn())
        .unwrap();
    let out = w.drain_cmd(&["--fast-filter"]).run_with_deadline();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        101
    );
    let log = stderr(&out);
    let warned = format!(
        "fast filter: entry {} has a marker for key {}",
        ids[0],
        &key[..12]
    );
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&warned)),
        "{log}"
    );

    w.add(&[submission(1)]);
    w.drain(&["--fast-filter"]);
    assert_eq!(w.count("disbursements"), 1);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'duplicate' AND detail LIKE '%(fast filter)'"),
        1
    );
    w.run_ok(&["verify"]);
}

#[test]
fn verify_names_a_claim_deleted_behind_its_duplicate_records_even_when_the_chain_is_resealed() {
    // 1. Submissions 1 and 2, then 1 again (a duplicate record); verify passes.
    // 2. Claim 1 deleted with its disbursement, outbox row and processed record, the chain
    //    re-sealed: the audit chain verifies, but `verify` exits 1 naming the duplicate record.
    let w = World::new();
    w.add(&[submission(1), submission(2)]);
    w.drain(&[]);
    w.add(&[submission(1)]);
    w.drain(&[]);
    w.run_ok(&["verify"]);

    let key = key_of(1);
    let db = rw(&w);
    db.execute_batch(&format!(
        "DELETE FROM outbox WHERE claim_id = (SELECT claim_id FROM processed_messages WHERE idempotency_key = unhex('{key}'));
         DELETE FROM disbursements WHERE claim_id = (SELECT claim_id FROM processed_messages WHERE idempotency_key = unhex('{key}'));
         DELETE FROM processed_messages WHERE idempotency_key = unhex('{key}');
         DELETE FROM audit_log WHERE kind = 'processed' AND idempotency_key = unhex('{key}');"
    ))
    .unwrap();
    reseal(&db);
    drop(db);
    w.run_ok(&["audit", "verify"]);
    let out = w.run(&["verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "duplicate record without a claim or tombstone: audit record 3 (duplicate, key {key})"
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn verify_names_a_dead_letter_row_deleted_or_added_without_its_record() {
    // 1. One malformed entry: one dead_letters row, one dead_letter record; verify passes.
    // 2. The row deleted: verify exits 1 naming the entry. Put back, plus a row with no
    //    record: verify exits 1 naming that entry.
    let w = World::new();
    let id = w.add_fields(&[("payload", b"not json")]);
    w.drain(&[]);
    w.run_ok(&["verify"]);
    let db = rw(&w);
    db.execute_batch("CREATE TABLE saved AS SELECT * FROM dead_letters; DELETE FROM dead_letters;")
        .unwrap();
    let out = w.run(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "dead letters and dead_letter records disagree: stream entry {id} has 0 dead_letters rows but 1 dead_letter records"
        )),
        "{}",
        stderr(&out)
    );
    db.execute_batch(
        "INSERT INTO dead_letters SELECT * FROM saved; DROP TABLE saved;
         INSERT INTO dead_letters (stream, stream_entry_id, reason_code, reason, award_id,
             delivery_count, recorded_at)
         VALUES ('grants:submissions', '9-9', 'not_json', 'x', NULL, 1, '2026-01-01T00:00:00Z');",
    )
    .unwrap();
    let out = w.run(&["verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("stream entry 9-9 has 1 dead_letters rows but 0 dead_letter records"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn holds_placed_and_lifted_leave_chained_audit_records() {
    // A hold and its lifting each append one record, chained like every other; a repeated
    // add or remove writes nothing.
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let placed = w.run_ok(&["hold", "add", "A-000001", "--reason", "case 21-cv-0042"]);
    assert!(
        !String::from_utf8_lossy(&placed.stdout).contains("no claim"),
        "the award has a claim"
    );
    // A second add with another reason says the first one stands.
    let again = w.run_ok(&["hold", "add", "A-000001", "--reason", "again"]);
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(
        said.contains("already under legal hold since")
            && said.contains("\"case 21-cv-0042\"; that reason stands"),
        "{said}"
    );
    // An award nothing was paid to: held, and said so (a typo shows at once).
    let typo = w.run_ok(&["hold", "add", "A-00001", "--reason", "case 8"]);
    assert!(
        String::from_utf8_lossy(&typo.stdout).contains("the ledger holds no claim of A-00001"),
        "{}",
        String::from_utf8_lossy(&typo.stdout)
    );
    w.run_ok(&["hold", "remove", "A-00001"]);
    w.run_ok(&["hold", "remove", "A-000001"]);
    w.run_ok(&["hold", "remove", "A-000001"]);
    let db = Connection::open(&w.db).unwrap();
    let records: Vec<(String, String, String)> = db
        .prepare("SELECT kind, award_id, detail FROM audit_log WHERE seq > 1 ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let records: Vec<_> = records.into_iter().filter(|r| r.1 == "A-000001").collect();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(
        (
            records[0].0.as_str(),
            records[0].1.as_str(),
            records[0].2.as_str()
        ),
        (
            "hold_added",
            "A-000001",
            "legal hold placed: case 21-cv-0042"
        )
    );
    assert_eq!(records[1].0, "hold_removed");
    assert!(
        records[1].2.starts_with("legal hold lifted (placed at ")
            && records[1].2.ends_with(": case 21-cv-0042)"),
        "{}",
        records[1].2
    );
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
}

#[test]
fn no_command_but_run_and_relay_makes_a_ledger_out_of_a_missing_path() {
    // Each command on a path with no ledger exits 2 naming the path and leaves the directory
    // empty; `dlq` never opens the ledger; `restore` of a missing backup names the backup.
    let w = World::new();
    let db = w.dir.path().join("typo.db");
    let db_arg = db.to_str().unwrap();
    let out_file = w.dir.path().join("out.jsonl");
    let commands: Vec<Vec<&str>> = vec![
        vec!["hold", "add", "A-1"],
        vec!["hold", "remove", "A-1"],
        vec!["hold", "list"],
        vec!["verify"],
        vec!["status"],
        vec!["audit", "verify"],
        vec!["audit", "export", "--out", out_file.to_str().unwrap()],
        vec!["retention", "purge", "--before", "2019-01-01"],
        vec!["backup", out_file.to_str().unwrap()],
    ];
    for args in commands {
        let mut full = args.clone();
        full.extend(["--db", db_arg]);
        let out = w.run(&full);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("no ledger at {db_arg}")),
            "{args:?}: {}",
            stderr(&out)
        );
        let left: Vec<_> = std::fs::read_dir(w.dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    let out = w.run(&["dlq", "list", "--db", db_arg]);
    assert!(out.status.success(), "{}", stderr(&out));
    let missing = w.dir.path().join("no-such-backup.db");
    let out = w.run(&["restore", missing.to_str().unwrap(), "--db", db_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("no backup file at {}", missing.display())));
    let left: Vec<_> = std::fs::read_dir(w.dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left {left:?}");
}

#[test]
fn a_restored_ledger_gets_every_disbursement_onto_the_events_stream_exactly_once() {
    // 1. 10 submissions; a backup (0600, never over an existing file).
    // 2. 5 more; the relay publishes all 15 (mark at 15).
    // 3. The ledger is lost; `restore` puts the backup back (0600): its 10 rows, already on
    //    the stream, are marked published; outbox ids continue after 15.
    // 4. 5 new submissions; the relay publishes exactly those 5.
    // 5. Every disbursement in the ledger is on grants:events exactly once under its own id;
    //    verify and audit verify pass; the restore left a `restored` record.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    assert_eq!(mode(&backup), 0o600);
    let again = w.run(&["backup", backup.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2), "a backup never overwrites");
    w.add(&(10..15).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 15);

    lose_the_ledger(&w);
    let out = w.run_ok(&["restore", backup.to_str().unwrap()]);
    assert!(
        stdout(&out).contains("10 outbox rows at or below the events mark (15) marked published"),
        "{}",
        stdout(&out)
    );
    assert_eq!(mode(&w.db), 0o600);
    let lock = w.dir.path().join("ledger.db.lock");
    assert_eq!(mode(&lock), 0o600, "the lock file is private too");
    assert_eq!(w.count("processed_messages"), 10);
    assert_eq!(
        w.sql_i64("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'"),
        15
    );
    w.run_ok(&["verify"]);

    w.add(&(15..20).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(
        w.xlen("grants:events"),
        20,
        "the 5 new events, nothing more"
    );
    assert_eq!(w.count("disbursements"), 15);
    let ids: Vec<i64> = outbox_rows(&w).iter().map(|r| r.0).collect();
    assert_eq!(
        ids,
        [(1..=10).collect::<Vec<_>>(), (16..=20).collect()].concat()
    );
    assert_events_exactly_once(&w);
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM audit_log WHERE kind = 'restored'"),
        1
    );
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
}

#[test]
fn a_restored_backup_whose_last_row_is_the_events_mark_publishes_only_what_comes_after() {
    // The boundary the test above does not reach: the backup's highest outbox id equals the
    // events mark. Backed up before the relay ran (10 rows, none published), then all 10
    // published (mark 10). Restored, all 10 rows, the one at the mark included, are marked
    // published, none is sent again, and the next submission's row gets id 11, sent once.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 10);

    lose_the_ledger(&w);
    let out = w.run_ok(&["restore", backup.to_str().unwrap()]);
    assert!(
        stdout(&out).contains("10 outbox rows at or below the events mark (10) marked published")
            && stdout(&out).contains("new outbox ids continue after 10"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        0
    );
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 10, "nothing published again");

    w.add(&[submission(10)]);
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.xlen("grants:events"), 11, "the new event, once");
    let ids: Vec<i64> = outbox_rows(&w).iter().map(|r| r.0).collect();
    assert_eq!(ids, (1..=11).collect::<Vec<_>>());
    assert_events_exactly_once(&w);
    w.run_ok(&["verify"]);
}

#[test]
fn a_ledger_copied_back_by_hand_stops_the_relay_and_restore_waits_for_the_worker() {
    // 1. 10 submissions and a backup; 5 more; all 15 published.
    // 2. The ledger lost and the backup copied back by hand (as README once said); 3 new
    //    submissions. The relay exits 1 pointing at `claimgate restore` and marks nothing.
    // 3. A worker holds the ledger: `restore` exits 1 saying it is in use, changing nothing.
    // 4. The worker stopped: `restore` replaces the hand copy, keeping it beside (0600, not
    //    overwritten), and the relay then publishes without skipping anything.
    let w = World::new();
    w.add(&(0..10).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    w.add(&(10..15).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);

    lose_the_ledger(&w);
    std::fs::copy(&backup, &w.db).unwrap();
    w.add(&(15..18).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    let out = w.run(&["relay", "--exit-when-idle"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("claimgate restore"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("only ever assigned ids up to 13"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        w.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL"),
        13,
        "the relay marked nothing: the copy's 10 rows (published from the lost ledger) and 3 new"
    );
    assert_eq!(w.xlen("grants:events"), 15);

    let mut worker = w.spawn(&["run", "--claim-idle-ms", "200"]);
    w.add(&[submission(18)]);
    assert!(support::wait_for(Duration::from_secs(20), || w
        .count_once_made("disbursements")
        == 14));
    let refused = w.run(&["restore", backup.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("is in use"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(w.count("disbursements"), 14, "nothing changed");
    support::signal(&worker, libc::SIGTERM);
    assert!(support::wait_exit(&mut worker, Duration::from_secs(20)).success());

    let out = w.run_ok(&["restore", backup.to_str().unwrap()]);
    let kept = std::fs::read_dir(w.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            // The kept file itself, not its -wal or the -shm a read-only open leaves beside it.
            let name = p.to_string_lossy();
            name.contains("ledger.db.replaced-")
                && !name.ends_with("-wal")
                && !name.ends_with("-shm")
        })
        .expect("the replaced ledger is kept");
    assert!(
        stdout(&out).contains(&kept.display().to_string()),
        "{}",
        stdout(&out)
    );
    // What was paid after the backup is named: it now lives only in the file kept aside.
    assert!(
        stdout(&out).contains("it holds 4 claim(s)")
            && stdout(&out).contains("now exist only in that file"),
        "{}",
        stdout(&out)
    );
    assert_eq!(mode(&kept), 0o600);
    let old = Connection::open(&kept).unwrap();
    let old_claims: i64 = old
        .query_row("SELECT COUNT(*) FROM processed_messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        old_claims, 14,
        "the hand copy, whole, beside the restored ledger"
    );
    assert_eq!(w.count("processed_messages"), 10);

    w.add(&[submission(30)]);
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_events_exactly_once(&w);
    w.run_ok(&["verify"]);
}

#[test]
fn a_ledger_named_through_a_symlink_is_locked_and_restored_as_the_one_file_it_is() {
    // The ledger is data/ledger.db, run through a link (current.db -> data/ledger.db), as a
    // deployment that switches volumes might. 1. While a worker runs through the link, a
    // restore naming the real file is refused: both saw one lock. 2. Stopped, a restore through
    // the link replaces the real file and leaves the link a link to it; no lock file is made
    // beside the link.
    let w = World::new();
    let data = w.dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let real = data.join("ledger.db");
    let link = w.dir.path().join("current.db");
    std::os::unix::fs::symlink("data/ledger.db", &link).unwrap();
    let (real_s, link_s) = (real.to_str().unwrap(), link.to_str().unwrap());
    let disbursements = || -> i64 {
        Connection::open(&real)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM disbursements", [], |r| r.get(0))
            .unwrap()
    };
    w.add(&(0..5).map(submission).collect::<Vec<_>>());
    w.drain(&["--db", real_s]);
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap(), "--db", link_s]);
    w.add(&(5..8).map(submission).collect::<Vec<_>>());

    let mut worker = w.spawn(&["run", "--claim-idle-ms", "200", "--db", link_s]);
    assert!(support::wait_for(Duration::from_secs(20), || {
        disbursements() == 8
    }));
    let refused = w.run(&["restore", backup.to_str().unwrap(), "--db", real_s]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("is in use"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(disbursements(), 8, "nothing changed");
    support::signal(&worker, libc::SIGTERM);
    assert!(support::wait_exit(&mut worker, Duration::from_secs(20)).success());

    w.run_ok(&["restore", backup.to_str().unwrap(), "--db", link_s]);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is still a link"
    );
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("data/ledger.db")
    );
    assert_eq!(disbursements(), 5, "the real file holds the backup");
    let names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert!(
        names(&data)
            .iter()
            .any(|n| n.starts_with("ledger.db.replaced-")),
        "the replaced ledger is kept beside the real file: {:?}",
        names(&data)
    );
    assert!(names(&data).contains(&"ledger.db.lock".to_owned()));
    assert!(
        !names(w.dir.path())
            .iter()
            .any(|n| n.starts_with("current.db.")),
        "nothing made beside the link: {:?}",
        names(w.dir.path())
    );
    w.add(&[submission(9)]);
    w.drain(&["--db", link_s]);
    assert_eq!(
        disbursements(),
        6,
        "a worker through the link writes the restored file"
    );
    w.run_ok(&["verify", "--db", real_s]);
}

#[test]
fn a_backup_of_another_ledger_is_not_matched_with_this_events_stream() {
    // A backup of ledger B restored where ledger A published: nothing is marked published on
    // A's mark, `restore` says so (and that A's consumer group will refuse B), and the relay
    // refuses the stream instead of skipping rows.
    let a = World::new();
    a.add(&(0..5).map(submission).collect::<Vec<_>>());
    a.drain(&[]);
    a.run_ok(&["relay", "--exit-when-idle"]);
    let other = a.dir.path().join("other.db");
    let backup = a.dir.path().join("other-backup.db");
    a.run_ok(&[
        "run",
        "--exit-when-idle",
        "--db",
        other.to_str().unwrap(),
        "--stream",
        "other",
    ]);
    a.run_ok(&[
        "backup",
        backup.to_str().unwrap(),
        "--db",
        other.to_str().unwrap(),
    ]);

    let out = a.run_ok(&["restore", backup.to_str().unwrap()]);
    assert!(stdout(&out).contains("0 outbox rows"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("not to this backup's ledger"),
        "{}",
        stdout(&out)
    );
    // Its consumer group is bound to A (issue 39): B reads with a group of its own.
    assert!(
        stdout(&out).contains(
            "note: consumer group grant-workers of grants:submissions is bound to ledger"
        ),
        "{}",
        stdout(&out)
    );
    a.add(&[submission(9)]);
    a.drain(&["--group", "for-the-restored-ledger"]);
    let relay = a.run(&["relay", "--exit-when-idle"]);
    assert_eq!(relay.status.code(), Some(1), "{}", stderr(&relay));
    assert!(
        stderr(&relay).contains("LEDGERMISMATCH"),
        "{}",
        stderr(&relay)
    );
    assert_eq!(
        a.sql_i64("SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL"),
        0
    );
}

#[test]
fn restore_refuses_a_file_that_is_not_a_ledger_backup_and_changes_nothing() {
    // Junk, the ledger itself and (with a real backup) an unreachable Redis are each refused;
    // the ledger is untouched and no copy or replaced ledger is left behind.
    let w = World::new();
    w.add(&[submission(1)]);
    w.drain(&[]);
    let junk = w.dir.path().join("junk.db");
    std::fs::write(&junk, b"not a database at all").unwrap();
    let out = w.run(&["restore", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("junk.db"), "{}", stderr(&out));
    let out = w.run(&["restore", w.db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // A real backup, but Redis (and so the events mark) out of reach: refused, nothing swapped.
    let backup = w.dir.path().join("backup.db");
    w.run_ok(&["backup", backup.to_str().unwrap()]);
    w.add(&[submission(2)]);
    w.drain(&[]);
    let out = w.run(&[
        "restore",
        backup.to_str().unwrap(),
        "--redis-url",
        "redis://127.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("restore needs it"),
        "{}",
        stderr(&out)
    );
    assert_eq!(w.count("processed_messages"), 2);
    let names: Vec<String> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains("restore") && !n.contains("replaced")),
        "{names:?}"
    );
    w.run_ok(&["verify"]);
}
