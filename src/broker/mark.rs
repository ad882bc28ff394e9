//! The relay's high-water mark in Redis: the hash `<events stream>:published_upto`, fields
//! `ledger_id` (whose outbox ids these are) and `upto` (every id at or below it is on the
//! events stream). The relay's Lua script (`relay.rs`) is the only writer; `restore` and the
//! relay's own consistency check read it here.

use crate::broker::stream::Conn;
use crate::error::{Error, Result};

/// The mark as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The ledger whose outbox ids the mark counts.
    pub ledger_id: String,
    /// Every outbox id at or below this is on the events stream.
    pub upto: i64,
}

/// The Redis key of the mark for `events_stream`.
pub fn key(events_stream: &str) -> String {
    format!("{events_stream}:published_upto")
}

/// Reads the mark of `events_stream`; `None` when no relay has published to it yet. A hash
/// without a ledger id or with an `upto` that is not an integer was not written by the relay,
/// and is reported as [`Error::Invariant`] rather than guessed at.
pub fn read(conn: &mut Conn, events_stream: &str) -> Result<Option<Mark>> {
    let key = key(events_stream);
    let (ledger_id, upto): (Option<String>, Option<String>) =
        conn.query(redis::cmd("HMGET").arg(&key).arg("ledger_id").arg("upto"))?;
    match (ledger_id, upto) {
        (None, None) => Ok(None),
        (Some(ledger_id), Some(upto)) => match upto.parse::<i64>() {
            Ok(upto) => Ok(Some(Mark { ledger_id, upto })),
            Err(_) => Err(Error::Invariant(format!(
                "{key}: upto {upto:?} is not an outbox id"
            ))),
        },
        _ => Err(Error::Invariant(format!(
            "{key} lacks its ledger_id or upto field; it was not written by the relay"
        ))),
    }
}
