//! The background checkpointer of a running worker (`ledger/sqlite/checkpoint.rs`): committed
//! pages reach the ledger file itself while the worker runs, not only when it stops.

use crate::support::{
    set_file_size_limit, signal, spawn_ignoring_sigxfsz, submission, wait_exit, wait_for, Logged,
    World,
};
use std::time::Duration;

/// Whether the ledger file itself (not its -wal) holds `needle`: its page was copied back.
fn in_main_file(world: &World, needle: &str) -> bool {
    let bytes = std::fs::read(&world.db).unwrap_or_default();
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// While a worker runs, its checkpointer copies committed pages from the WAL into the ledger
/// file (a passive checkpoint every `CHECKPOINT_INTERVAL_MS`): after a single lone commit and
/// after a burst, not only when the worker stops. Red when the passive checkpoint is removed.
#[test]
fn a_running_workers_commits_reach_the_ledger_file_through_the_background_checkpointer() {
    // 1. A worker starts on an empty stream.
    // 2. One lone submission: paid; within seconds its stream entry id (stored with its
    //    claim) is in the ledger file itself, though no commit came after it.
    // 3. A burst of 2,000: paid; within seconds the last one's entry id is in the file too.
    // 4. SIGTERM: exit 0.
    let world = World::new();
    let mut worker = world.spawn(&["run", "--consumer", "ck"]);
    let lone = world.add(&[submission(0)]).remove(0);
    assert!(wait_for(Duration::from_secs(30), || world
        .count_once_made("disbursements")
        == 1));
    assert!(
        wait_for(Duration::from_secs(10), || in_main_file(&world, &lone)),
        "the lone commit never reached the ledger file\n{}",
        worker.log_text()
    );

    let burst: Vec<String> = (1..=2_000).map(submission).collect();
    let last = world.add(&burst).pop().unwrap();
    assert!(wait_for(Duration::from_secs(60), || world
        .count_once_made("disbursements")
        == 2_001));
    assert!(
        wait_for(Duration::from_secs(10), || in_main_file(&world, &last)),
        "the burst never reached the ledger file\n{}",
        worker.log_text()
    );
    signal(&worker, libc::SIGTERM);
    assert!(wait_exit(&mut worker, Duration::from_secs(30)).success());
}

/// A checkpoint that cannot grow the ledger file (a full disk) is one episode: one WARN when it
/// starts failing and one INFO when it works again, with backoff between tries, not a WARN every
/// 250 ms (issue 39: 80 lines in 22 s, onto a journal likely on the same full disk).
#[test]
fn checkpoints_failing_on_a_full_disk_are_one_episode_of_two_lines() {
    // 1. A worker (SIGXFSZ ignored, as a supervisor may start it) pays 2,000 submissions and
    //    its checkpointer copies them into the ledger file.
    // 2. Its file-size limit is set to the ledger file's size: commits still append to the
    //    WAL, which starts over at its top, but no checkpoint can grow the file. 500 more.
    // 3. For 4 s every checkpoint fails: one WARN `checkpointing the ledger failed`.
    // 4. The limit lifted: one INFO `checkpointing the ledger recovered after`; all paid.
    let w = World::new();
    let worker =
        spawn_ignoring_sigxfsz(w.cmd(&["run", "--consumer", "full", "--claim-idle-ms", "600000"]));
    w.add(&(0..2_000).map(submission).collect::<Vec<_>>());
    assert!(
        wait_for(Duration::from_secs(60), || w
            .count_once_made("disbursements")
            == 2_000),
        "{}",
        worker.log_text()
    );
    // Until the checkpointer has copied everything (so the next commit starts the WAL over).
    let wal = w.db.with_extension("db-wal");
    let caught_up = || {
        let conn = rusqlite::Connection::open(&w.db).unwrap();
        let (log, done): (i64, i64) = conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(1)?, r.get(2)?))
            })
            .unwrap();
        log == done
    };
    assert!(wait_for(Duration::from_secs(30), caught_up));
    let size = std::fs::metadata(&w.db).unwrap().len();
    assert!(std::fs::metadata(&wal).is_ok());
    set_file_size_limit(worker.child.id(), size);
    w.add(&(2_000..2_500).map(submission).collect::<Vec<_>>());
    let warned = || -> Vec<String> {
        (worker.lines_with("checkpoint").into_iter())
            .filter(|l| l.contains("WARN"))
            .collect()
    };
    assert!(
        wait_for(Duration::from_secs(60), || !warned().is_empty()),
        "no checkpoint failed:\n{}",
        worker.log_text()
    );
    std::thread::sleep(Duration::from_secs(4));
    let warned = warned();
    assert_eq!(warned.len(), 1, "{}", worker.log_text());
    assert!(
        warned[0].contains("retrying with backoff until it clears"),
        "{}",
        warned[0]
    );

    set_file_size_limit(worker.child.id(), libc::RLIM_INFINITY);
    assert!(
        wait_for(Duration::from_secs(60), || w.count("disbursements")
            == 2_500
            && w.pending() == 0),
        "{}",
        worker.log_text()
    );
    worker.wait_log("checkpointing the ledger recovered after");
    worker.assert_one_episode("checkpointing the ledger");
    assert!(worker.stop().success());
}

/// A long read beside a running worker (a purge's export, `verify`, `backup`) holds an old
/// snapshot, so passive checkpoints cannot copy past it and the WAL grows past its soft limit.
/// A RESTART then held the worker's commits back while it copied all that was left (0.6-0.9 s)
/// or waited for the reader, up to the 5 s busy timeout, round after round (BENCHMARKS.md,
/// purge under load). The checkpointer tries none while a passive pass leaves more than a
/// little behind, and starts the log over once the reader is gone.
#[test]
fn a_long_reader_beside_a_worker_never_has_a_restart_checkpoint_hold_the_writer_back() {
    // 1. A worker (its checkpointer logging at DEBUG) pays one submission.
    // 2. A reader opens a read transaction on the ledger and keeps its snapshot.
    // 3. Submissions in rounds of 5,000 until the WAL is past 16,384 frames (64 MiB) and all
    //    are paid, the reader still holding: no RESTART was tried meanwhile.
    // 4. The reader ends; 2,000 more are paid: a RESTART follows and succeeds (busy=0).
    let w = World::new();
    let mut cmd = w.cmd(&["run", "--consumer", "ck", "--claim-idle-ms", "600000"]);
    cmd.env_remove("RUST_LOG");
    let worker = Logged::spawn_logging(cmd, "warn,claimgate::ledger::sqlite::checkpoint=debug");
    w.add(&[submission(0)]);
    assert!(wait_for(Duration::from_secs(30), || w
        .count_once_made("disbursements")
        == 1));

    let mut reader = rusqlite::Connection::open(&w.db).unwrap();
    let snapshot = reader.transaction().unwrap();
    let seen: i64 = snapshot
        .query_row("SELECT COUNT(*) FROM disbursements", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 1);
    let restarts = || worker.lines_with("checkpoint RESTART");
    let before = restarts().len();
    let wal = w.db.with_extension("db-wal");
    let wal_frames = || std::fs::metadata(&wal).map_or(0, |m| m.len()) / 4_096;
    let mut paid = 1;
    while wal_frames() <= 20_000 {
        assert!(paid < 400_000, "the WAL never grew past its soft limit");
        w.add_atomically(&(paid..paid + 5_000).map(submission).collect::<Vec<_>>());
        paid += 5_000;
        assert!(
            wait_for(Duration::from_secs(120), || w
                .count_once_made("disbursements")
                == paid as i64),
            "{}",
            worker.log_text()
        );
    }
    // A round of passive checkpoints after the last commit, each finding the reader behind.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        restarts().len(),
        before,
        "a RESTART was tried while a reader held the log:\n{}",
        worker.log_text()
    );
    drop(snapshot);
    drop(reader);

    w.add_atomically(&(paid..paid + 2_000).map(submission).collect::<Vec<_>>());
    assert!(wait_for(Duration::from_secs(60), || w
        .count_once_made("disbursements")
        == (paid + 2_000) as i64));
    assert!(
        wait_for(Duration::from_secs(30), || restarts()
            .iter()
            .skip(before)
            .any(|l| l.contains("busy=0"))),
        "no RESTART once the reader was gone:\n{}",
        worker.log_text()
    );
    assert!(worker.stop().success());
}

/// A ledger of `n` claims, paid and published, back-dated to 2019: a prefix of `n` records
/// (one a claim) that `retention purge --before 2020-01-01` may remove.
fn purgeable_history(n: usize) -> World {
    let w = World::new();
    w.add_atomically(&(0..n).map(submission).collect::<Vec<_>>());
    w.drain(&[]);
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(w.sql_i64("SELECT MAX(seq) FROM audit_log"), n as i64);
    crate::audit::backdate(&w, n as i64, "2019-03-01T12:00:00.000000Z");
    w
}

/// The WAL's checkpoint sequence number (its header's bytes 12..16): it moves on each time
/// the log starts over from its top.
fn wal_checkpoint_seq(world: &World) -> u32 {
    let header = std::fs::read(world.db.with_extension("db-wal")).unwrap();
    u32::from_be_bytes(header[12..16].try_into().unwrap())
}

/// A purge's export reads one batch per read transaction, back to back, so beside a writer
/// there was never a moment without a reader for a RESTART to start the log over: on a
/// 10,000,000-claim ledger the WAL grew to 3.8 GB beside a worker, and stays that size on disk
/// until the worker stops (BENCHMARKS.md). The export now runs a checkpoint round itself
/// between two batches, at most every `CHECKPOINT_INTERVAL_MS`. Red without that round: the
/// purge then logs no checkpoint of its own and the log never starts over during its export.
#[test]
fn a_purge_exporting_beside_a_writer_lets_the_wal_start_over() {
    // 1. 3,000 claims, paid and published, back-dated to 2019.
    // 2. A writer of the test's own, with no checkpoints of its own (wal_autocheckpoint 0),
    //    grows the WAL past the checkpointer's 16,384 frames (64 MiB) and keeps committing.
    // 3. `retention purge --before 2020-01-01 --batch-records-max 1` exports 3,000 batches
    //    beside it and exits 0; its log shows a RESTART that found no reader (busy=0), and the
    //    log's checkpoint sequence moved on (the filler's commits alone never start it over).
    // 4. The writer stops and its table goes; 3,000 tombstones; verify passes.
    let n = 3_000;
    let w = purgeable_history(n);

    let filler = rusqlite::Connection::open(&w.db).unwrap();
    filler
        .execute_batch(
            "PRAGMA wal_autocheckpoint = 0; PRAGMA synchronous = OFF;
             CREATE TABLE test_wal_filler (page BLOB NOT NULL);",
        )
        .unwrap();
    // A 256 KiB row a commit: 64 frames of 4 KiB each.
    let commit = |filler: &rusqlite::Connection| {
        filler
            .execute("INSERT INTO test_wal_filler VALUES (zeroblob(262144))", [])
            .unwrap();
    };
    for _ in 0..300 {
        commit(&filler);
    }
    let wal_frames = std::fs::metadata(w.db.with_extension("db-wal"))
        .unwrap()
        .len()
        / 4_096;
    assert!(
        wal_frames > 16_384,
        "the WAL holds only {wal_frames} frames"
    );
    let seq_before = wal_checkpoint_seq(&w);

    let mut cmd = w.cmd(&[
        "retention",
        "purge",
        "--before",
        "2020-01-01",
        "--batch-records-max",
        "1",
    ]);
    cmd.env_remove("RUST_LOG");
    let mut purge = Logged::spawn_logging(cmd, "warn,claimgate::ledger::sqlite::checkpoint=debug");
    // Small commits beside it, as a worker's; the filler deletes what it adds, so the file
    // itself does not grow.
    while purge.alive() {
        filler
            .execute_batch(
                "INSERT INTO test_wal_filler VALUES (zeroblob(8192));
                 DELETE FROM test_wal_filler WHERE rowid = (SELECT MAX(rowid) FROM test_wal_filler);",
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = wait_exit(&mut purge.child, Duration::from_secs(60));
    assert!(status.success(), "{status}\n{}", purge.log_text());
    let restarts = purge.lines_with("checkpoint RESTART: busy=0");
    assert!(
        !restarts.is_empty(),
        "the purge's export never started the log over:\n{}",
        purge.log_text()
    );
    assert_ne!(
        wal_checkpoint_seq(&w),
        seq_before,
        "the log never started over"
    );
    drop(filler);
    let db = rusqlite::Connection::open(&w.db).unwrap();
    db.execute_batch("DROP TABLE test_wal_filler").unwrap();
    drop(db);
    assert_eq!(w.count("claim_tombstones"), n as i64);
    assert_eq!(w.count("processed_messages"), 0);
    w.run_ok(&["verify"]);
}

/// A purge's plan counts the prefix's unpublished outbox rows in steps of 20,000 records, each
/// a read snapshot of its own (in one, a year of a 10,000,000-claim ledger was read for 9 s,
/// and the WAL grew by 380 MB beside a worker meanwhile). Every step counts: an unpublished row
/// in the first, the second and the last step of a three-step prefix refuses the purge, naming
/// all three. Red when only the first step is read.
#[test]
fn a_purges_unpublished_count_read_in_steps_counts_every_step() {
    // 1. 41,000 claims, paid and published, back-dated to 2019: a prefix of 41,000 records.
    // 2. The outbox rows of claims 100, 20,500 and 40,500 made to read as unpublished.
    // 3. `retention purge --before 2020-01-01` is refused (exit 1), naming 3 outbox rows;
    //    nothing is removed.
    let n = 41_000;
    let w = purgeable_history(n);
    let db = rusqlite::Connection::open(&w.db).unwrap();
    let unpublished = db
        .execute(
            "UPDATE outbox SET published_at = NULL WHERE claim_id IN (100, 20500, 40500)",
            [],
        )
        .unwrap();
    assert_eq!(unpublished, 3);
    drop(db);
    let refused = w.run(&["retention", "purge", "--before", "2020-01-01"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("refusing to purge: 3 outbox rows"), "{said}");
    assert_eq!(w.count("processed_messages"), n as i64);
}
