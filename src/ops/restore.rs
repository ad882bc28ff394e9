//! `claimgate restore BACKUP`: a backup put in place of the ledger so that every disbursement
//! in it reaches the events stream exactly once.
//!
//! # Why a file copy is not enough, and what this does instead
//!
//! The relay skips outbox ids at or below the events stream's mark (`relay.rs`). A backup of
//! this ledger has the same `ledger_id` and a lower highest outbox id than the mark: put back
//! by hand, its new rows would get ids the mark already covers and be marked published without
//! ever being published. Here, with the ledger locked against every other claimgate process:
//!
//! - the events stream's position is read from Redis (`broker::mark::read`: the mark, or the
//!   stream's last event if that is higher; the restore refuses to go on without it);
//! - if it belongs to the backup's ledger, the restored rows at or below it are marked
//!   published — they are on the stream already: same ledger, same ids, same rows, since a
//!   backup is an earlier state of the very ledger whose rows were published — and the outbox
//!   id sequence is moved to the mark, so new rows get ids above it and are published;
//! - rows above the mark were never published and stay unpublished, so the relay sends them;
//! - a mark of another ledger, or a backup with no ledger id (made before any relay ran), is
//!   left alone: nothing is marked, and the relay refuses that events stream
//!   (`LEDGERMISMATCH`) rather than guess, as it would for any other ledger;
//! - a `restored` audit record says all this, in the same transaction.
//!
//! The ledger replaced is kept whole beside the restored one, never overwritten.
//!
//! # The consumer groups' binding
//!
//! A consumer group is bound to one ledger by its id (`broker/binding.rs`). A backup carries its
//! ledger's id, so a restored backup of this ledger is the ledger its groups are bound to and
//! its workers read on; a backup of another ledger is not, and its workers refuse the group
//! (exit 2) rather than pay its entries a second time. The restore reads the bindings of
//! `--stream`'s groups with the mark, before anything is swapped in, and says which is which.

use crate::broker::{binding, mark, stream};
use crate::config::LedgerLocation;
use crate::domain::clock::now_rfc3339;
use crate::error::Result;
use std::path::Path;

/// What `restore` needs besides the ledger.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The backup file (only read).
    pub backup: &'a Path,
    /// Redis, where the events stream's mark is.
    pub redis_url: &'a str,
    /// The events stream the relay publishes to.
    pub events_stream: &'a str,
    /// The submissions stream, whose consumer groups' bindings are reported.
    pub stream: &'a str,
}

/// Restores `req.backup` in place of the ledger at `location`, and says what it did.
pub fn run(location: &LedgerLocation, req: &Request<'_>) -> Result<()> {
    let mut restoring = crate::ledger::prepare_restore(location, req.backup)?;
    let mut conn = stream::Conn::new(stream::client(req.redis_url)?);
    let found = mark::read(&mut conn, req.events_stream).map_err(|e| {
        crate::error::Error::Other(format!(
            "cannot read {} from Redis ({e}); restore needs it to keep the events stream \
             exactly-once, so nothing was changed",
            mark::key(req.events_stream)
        ))
    })?;
    let bound = binding::bindings(&mut conn, req.stream).map_err(|e| {
        crate::error::Error::Other(format!(
            "cannot read {} from Redis ({e}); nothing was changed",
            binding::key(req.stream)
        ))
    })?;
    let backup_id = restoring.ledger_id();
    let (upto, note) = match (&found, &backup_id) {
        (Some(m), Some(id)) if &m.ledger_id == id => (m.upto, None),
        (None, _) => (0, None),
        (Some(m), Some(id)) => (
            0,
            Some(format!(
                "{} belongs to ledger {}, not to this backup's ledger {id}: nothing was marked \
                 published, and the relay will refuse that events stream for this ledger",
                mark::key(req.events_stream),
                m.ledger_id
            )),
        ),
        (Some(m), None) => (
            0,
            Some(format!(
                "the backup carries no ledger id (it was made before any relay ran) and {} \
                 belongs to ledger {}: nothing was marked published, and the relay will refuse \
                 that events stream for this ledger",
                mark::key(req.events_stream),
                m.ledger_id
            )),
        ),
    };
    let marked = restoring.adopt_mark(upto, &now_rfc3339(), req.events_stream)?;
    let id_max = restoring.outbox_id_max();
    let aside = restoring.commit()?;
    println!(
        "restored {} from {}: {marked} outbox rows at or below the events mark ({upto}) marked \
         published (already on {}); new outbox ids continue after {id_max}",
        location,
        req.backup.display(),
        req.events_stream
    );
    match aside {
        Some(old) if old.claims_only_there > 0 => println!(
            "the ledger it replaced is kept as {}; it holds {} claim(s), {} paid, that the \
             backup does not: they were paid after the backup was made and now exist only in \
             that file (their submissions, if redelivered, would be paid again into the \
             restored ledger)",
            old.path.display(),
            old.claims_only_there,
            crate::domain::money::dollars(old.cents_only_there)
        ),
        Some(old) => println!(
            "the ledger it replaced is kept as {}; every claim in it is in the backup too",
            old.path.display()
        ),
        None => println!("there was no ledger at {location} before"),
    }
    if let Some(note) = note {
        println!("note: {note}");
    }
    for line in binding_notes(req.stream, &bound, backup_id.as_deref()) {
        println!("{line}");
    }
    Ok(())
}

/// What the restore means for each consumer group of `stream` bound to a ledger (`bound`:
/// group, ledger id), given the restored backup's id.
fn binding_notes(stream: &str, bound: &[(String, String)], backup_id: Option<&str>) -> Vec<String> {
    bound
        .iter()
        .map(|(group, ledger)| match backup_id {
            Some(id) if id == ledger => format!(
                "consumer group {group} of {stream} is bound to this ledger ({id}): its workers \
                 read on"
            ),
            Some(id) => format!(
                "note: consumer group {group} of {stream} is bound to ledger {ledger}, not to \
                 this backup's ledger {id}: its workers will refuse this ledger (exit 2) rather \
                 than pay its entries in a second ledger; give this ledger a group of its own \
                 (--group)"
            ),
            None => format!(
                "note: the backup carries no ledger id, so it is given a new one when first \
                 opened, and consumer group {group} of {stream} (bound to ledger {ledger}) will \
                 refuse it; give it a group of its own (--group)"
            ),
        })
        .collect()
}
