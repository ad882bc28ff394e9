//! PostgreSQL for the tests: one private cluster per test process (started on first use,
//! stopped at exit), and a fresh database per test, so tests never see each other's rows and
//! never touch a PostgreSQL the machine already runs. Tests that stop or restart the server
//! start a cluster of their own with [`LocalPostgres::start`].

#![allow(dead_code)]

use claimgate::support::localpostgres::{LocalPostgres, INSTALL_HINT};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The process's shared cluster; taken out and dropped (stopped) by [`stop_shared`] at exit.
static SHARED: OnceLock<Mutex<Option<LocalPostgres>>> = OnceLock::new();

/// Runs when the test process exits: the statics are never dropped, so the cluster is stopped
/// here (immediate shutdown) and its directory removed.
extern "C" fn stop_shared() {
    if let Some(cell) = SHARED.get() {
        let taken = cell.lock().map(|mut g| g.take()).unwrap_or_default();
        drop(taken);
    }
}

/// A cluster of its own, for a test that stops or restarts it. A missing PostgreSQL fails
/// the test loudly, with the install command.
pub fn own_cluster() -> LocalPostgres {
    LocalPostgres::start().unwrap_or_else(|e| {
        panic!("the test suite needs PostgreSQL 15: {e}\n(install: {INSTALL_HINT})")
    })
}

/// The URL of a fresh, empty database on the shared cluster.
pub fn fresh_database() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let cell = SHARED.get_or_init(|| {
        let pg = own_cluster();
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe { libc::atexit(stop_shared) };
        Mutex::new(Some(pg))
    });
    let guard = cell.lock().unwrap_or_else(|p| p.into_inner());
    let pg = guard.as_ref().expect("the shared cluster runs until exit");
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    pg.create_database(&name)
        .unwrap_or_else(|e| panic!("creating test database {name}: {e}"))
}
