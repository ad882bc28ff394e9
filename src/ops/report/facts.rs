//! What a report says, as data: the verdict, each anchor's status, the chain walk's outcome and
//! everything read beside them. `gather.rs` fills it in; `html.rs` lays it out.

use super::tally::Tally;
use crate::domain::anchor::{Anchor, Findings};
use crate::ledger::{Hold, Stats, Summary};

/// The report's headline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Everything checked held; says what was checked against.
    Verified {
        /// Anchors were given (and all held).
        anchors: bool,
        /// A public key was given (and every signature verified).
        key: bool,
    },
    /// Something did not hold: the first thing found, in words.
    Failed(String),
}

/// How one anchor came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnchorStatus {
    /// The chain holds the anchored hash at the anchored seq.
    Holds,
    /// The anchored record was purged behind the valid checkpoint at this seq.
    Covered(i64),
    /// The chain contradicts it, for this reason.
    Fails(String),
    /// The chain broke before the walk reached it.
    NotChecked,
}

/// One anchor as the report lists it.
#[derive(Debug, Clone)]
pub struct AnchorRow {
    /// Its line in the anchors file.
    pub line: usize,
    /// The anchor.
    pub anchor: Anchor,
    /// How it came out.
    pub status: AnchorStatus,
}

/// How the walk of the chain came out.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Records checked (links are seals, not records).
    pub records: u64,
    /// The hash the next record links to.
    pub head: String,
    /// The first break, as `audit verify` words it, and the seq it names.
    pub broken: Option<(i64, String)>,
}

/// Everything the report shows.
#[derive(Debug)]
pub struct Report {
    /// When it was made (ledger time).
    pub generated_at: String,
    /// The ledger's id, if one was ever made.
    pub ledger_id: Option<String>,
    /// Where the ledger is (a path, or a URL without its password).
    pub location: String,
    /// The anchors file given.
    pub anchors_file: Option<String>,
    /// The id of the public key given.
    pub key_id: Option<String>,
    /// `status`'s ledger counts.
    pub stats: Stats,
    /// Legal holds in force.
    pub holds: Vec<Hold>,
    /// What `verify` says: its summary, or the violation it names.
    pub verified: std::result::Result<Summary, String>,
    /// The chain walk.
    pub chain: Chain,
    /// What the evidence check counted.
    pub findings: Findings,
    /// Every anchor, in file order.
    pub anchors: Vec<AnchorRow>,
    /// The figures counted from the chain.
    pub tally: Tally,
    /// The headline.
    pub verdict: Verdict,
}
