//! The integration suite: one test crate (builds once), a module per area.
//! Every test starts its own redis-server and uses a real SQLite file or a real PostgreSQL
//! database (`pg.rs`).

/// Instantiates each end-to-end test `fn NAME(store: Store)` once per ledger backend, as
/// `on_sqlite::NAME` and `on_postgres::NAME`: one suite, both backends.
macro_rules! on_both_ledgers {
    ($($test:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test]
            fn $test() {
                super::$test(crate::support::Store::Sqlite);
            })*
        }
        mod on_postgres {
            $(#[test]
            fn $test() {
                super::$test(crate::support::Store::Postgres);
            })*
        }
    };
}

mod pg;
mod support;

mod audit;
mod batching;
mod binding;
mod chaos;
mod checkpoints;
mod contract;
mod counts;
mod dba;
mod derived;
mod docs;
mod errors;
mod evidence;
mod evidence_prop;
mod fuzz;
mod habits;
mod identity;
mod insider;
mod layers;
mod ledger_format;
mod liveness;
mod memory;
mod monitoring;
mod ops;
mod package;
mod promises;
mod relay;
mod report;
mod resilience;
mod restore_and_tombstones;
mod retry;
mod review;
mod safeguards;
mod security;
mod sentinel;
mod shared_ledger;
mod verifier;
mod worker;
