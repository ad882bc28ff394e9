//! `claimgate audit report`: one self-contained HTML file an auditor opens offline — the
//! verdict first (verified against the anchors and key given, or FAILED naming the first
//! record or anchor that does not hold), then the ledger's identity, the period, the chain
//! head, each anchor checked, totals disbursed per day or month as an inline SVG chart, the
//! counts, legal holds, purges with their checkpoints, and the exceptions an auditor samples.
//!
//! `gather.rs` reads the ledger through the same calls as `status` (`Ledger::stats`), `verify`
//! (`Inspect::verify`) and `audit verify --anchors` (`ledger::chain` beside `EvidenceCheck`),
//! so the report can never say other figures than they do, into `facts.rs`; `tally.rs` counts the chain in
//! bounded memory; `chart.rs` draws; `html.rs` lays the page out; `markup.rs` is the one
//! place text becomes HTML.
//!
//! **Invariant:** the report only reads the ledger (never makes its id); it writes one new 0600
//! file, whole or not at all; the page holds no script and loads nothing; no text from the
//! ledger or the anchors file reaches the page except through `markup::text`.

mod chart;
mod facts;
mod gather;
mod html;
mod markup;
mod tally;

pub use facts::Verdict;
pub use gather::{write, Request};
pub use tally::Period;
