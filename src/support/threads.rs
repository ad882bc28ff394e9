//! Named threads.
//!
//! Every thread a worker starts carries its stage's name, so `top -H`, `perf` and
//! `/proc/<pid>/task/*/comm` tell the writer from the parse threads. (The checkpointer and the
//! claim-group filter's builder are not scoped threads; they name themselves where they
//! start.) Linux gives an unnamed thread its parent's name, which made a writer's sealing
//! helper look like the writer itself in every profile.

use std::thread::{Scope, ScopedJoinHandle};

/// Starts `f` on a thread of `scope` named `name` (15 bytes at most show in `comm`).
///
/// Panics if the thread cannot be started, as `Scope::spawn` does: a stage that cannot start
/// is not one to run without.
pub fn spawn_named<'scope, 'env, T: Send + 'scope>(
    scope: &'scope Scope<'scope, 'env>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'scope,
) -> ScopedJoinHandle<'scope, T> {
    debug_assert!(name.len() <= 15, "{name} is cut short in comm");
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn_scoped(scope, f)
        .unwrap_or_else(|e| panic!("starting the {name} thread: {e}"))
}
