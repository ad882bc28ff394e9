//! The command line: flags, env vars, and one file per command group.
//!
//! Every flag can also come from the environment variable named beside it. This file holds the
//! global flags and the dispatch; each command group's flags and body live in a file of its
//! own (`run`, `relay`, `produce`, `key`, `audit`, `retention` with `hold`, `ops` for
//! `status`, `verify`, `backup` and `restore`), and what they share — the shutdown flag and the ways to
//! open the ledger — in `common`. Dependencies point one way: this file uses the children, the
//! children use `common` (and `run` uses `relay`'s settings), never this file. Command bodies
//! stay thin: they build configs, open what they need through the one open step and call into
//! the library.

mod audit;
mod common;
mod dispatch;
mod docs;
pub mod envfile;
mod key;
mod ops;
mod produce;
mod relay;
mod retention;
mod run;

pub use dispatch::{command, dispatch, docs, parse, Cli, Command, GlobalArgs};
