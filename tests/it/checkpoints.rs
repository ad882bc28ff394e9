//! The background checkpointer of a running worker (`ledger/sqlite/checkpoint.rs`): committed
//! pages reach the ledger file itself while the worker runs, not only when it stops.

use crate::support::{signal, submission, wait_exit, wait_for, World};
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
