//! The integration suite: one test crate (builds once), a module per area.
//! Every test starts its own redis-server and uses a real SQLite file.

mod support;

mod audit;
mod batching;
mod chaos;
mod contract;
mod errors;
mod fuzz;
mod identity;
mod layers;
mod liveness;
mod memory;
mod ops;
mod promises;
mod relay;
mod resilience;
mod retry;
mod security;
mod sentinel;
mod worker;
