//! The process allocator: mimalloc, tuned to hand freed memory back promptly.
//!
//! The worker allocates an entry on one thread and frees it on another (reader → parse pool →
//! writer → reporter). glibc's malloc pays for that in arena locks and consolidation: about a
//! fifth of the worker's CPU samples were in it. mimalloc frees across threads cheaply, but by
//! default keeps freed pages for a while (its `purge_delay`, 1000 ms in the linked version; the
//! test below checks that default) and commits arena memory eagerly, which raised the worker's
//! peak RSS from 52 MiB to 85–108 MiB on a 200,000-entry drain. With purging after
//! [`PURGE_DELAY_MS`] and arenas committed on demand it stays at glibc's 52 MiB.
//! See BENCHMARKS.md for the measurements. Eager commit is switched off at build time
//! (`.cargo/config.toml`), because the first arena exists before `main` runs.
//!
//! The binary installs it (`#[global_allocator]` in `src/main.rs`) and calls [`tune`] first,
//! then [`keep_freed_pages`] for the commands that scan the ledger.

use libmimalloc_sys::{mi_option_set, mi_option_t};

pub use mimalloc::MiMalloc;

/// How long mimalloc keeps a freed page before returning it to the OS.
pub const PURGE_DELAY_MS: i64 = 1;

/// `mi_option_arena_eager_commit` in mimalloc v3's `mi_option_e` (`mimalloc.h`); the crate
/// does not name it. Set at build time; here only to be checked by the test.
#[cfg(test)]
const OPTION_ARENA_EAGER_COMMIT: mi_option_t = 4;
/// `mi_option_purge_delay`, likewise unnamed by the crate; checked against its default by a test.
const OPTION_PURGE_DELAY: mi_option_t = 15;

/// Applies the settings above. Call once, first thing in `main`; later allocations follow them.
pub fn tune() {
    // SAFETY: mi_option_set only stores an integer in mimalloc's option table; the index names
    // an option of the linked version (see the test).
    unsafe { mi_option_set(OPTION_PURGE_DELAY, PURGE_DELAY_MS as _) };
}

/// For a command that reads the ledger through from one end to the other (`verify`, `audit`):
/// freed pages are kept for mimalloc's default 1000 ms, not [`PURGE_DELAY_MS`]. Such a scan
/// allocates and frees the same few MiB of rows thousands of times a second; returned to the
/// kernel after 1 ms they were unmapped and faulted back in over and over (PostgreSQL's
/// `verify` of 1M claims: 0.8 s of system time against 0.4, 5.2 s wall against 4.8), and
/// its peak RSS is the same either way, bounded by its working set.
pub fn keep_freed_pages() {
    // SAFETY: as in `tune`.
    unsafe { mi_option_set(OPTION_PURGE_DELAY, PURGE_DELAY_MS_SCAN as _) };
}

/// [`keep_freed_pages`]' delay: mimalloc's own default (the test checks it is).
const PURGE_DELAY_MS_SCAN: i64 = 1000;

/// The current value of a mimalloc option.
#[cfg(test)]
fn option(option: mi_option_t) -> i64 {
    // SAFETY: reads mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_get(option) as i64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_and_tune_settings_reach_the_options_we_mean() {
        // Unless this test's environment overrides them: eager commit as built (off, see
        // .cargo/config.toml; mimalloc's own default is 2) and the purge delay at mimalloc's
        // default (1000 ms in `src/options.c`) until `tune` lowers it.
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
            assert_eq!(option(OPTION_ARENA_EAGER_COMMIT), 0);
        }
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(option(OPTION_PURGE_DELAY), PURGE_DELAY_MS_SCAN);
        }
        tune();
        assert_eq!(option(OPTION_PURGE_DELAY), PURGE_DELAY_MS);
        keep_freed_pages();
        assert_eq!(option(OPTION_PURGE_DELAY), PURGE_DELAY_MS_SCAN);
        tune();
    }
}
