//! One consumer group, one ledger: which ledger a group's entries are paid in, kept in Redis.
//!
//! Two ledgers reading one group each pay what they read, and a worker that takes over another's
//! pending entries pays them again in its own ledger (issue 39: worker A on `a.db` crashed after
//! a commit, worker B on `b.db` took its entries over, both ledgers paid the same 100). So the
//! first worker to read a group binds it to its ledger's id (`Outbox::ledger_id`), and a worker
//! whose ledger is another refuses to read (exit 2), naming both ids and what to do.
//!
//! The bindings of a stream live in the hash `<stream>:ledgers` (field: group, value: ledger
//! id), beside the stream's other keys, so the ACL pattern of docs/operations.md ("Security") covers it. The check and the
//! first write are one Lua script, so two first workers of different ledgers cannot both bind.
//! A binding lost with Redis's data (a restart without persistence, a failover to a replica
//! that never had it) is made again by the next worker to read, as the group itself is.
//!
//! The binding names a ledger by its id, which `restore` keeps (a backup carries its ledger's
//! id) and `migrate` copies (`ledger_meta` is copied row by row), so a ledger put back or moved
//! to PostgreSQL still reads its group. Nothing claimgate does moves a group to another ledger;
//! an operator who means to deletes the group's field from the hash (`HDEL`).
//!
//! **Invariant:** a group is bound to at most one ledger id at a time, and [`bind`] never
//! replaces a binding.

use super::stream::Conn;
use crate::config::LedgerName;
use crate::error::{Error, Result};
use redis::Value;

/// The hash holding the bindings of `stream`'s groups.
pub fn key(stream: &str) -> String {
    format!("{stream}:ledgers")
}

/// Binds `group` on `stream` to `ledger_id` if it is bound to none, and says which ledger it is
/// bound to now: `ledger_id` itself, or another.
pub fn bind(conn: &mut Conn, stream: &str, group: &str, ledger_id: &str) -> Result<String> {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        redis::Script::new(
            r"
            local bound = redis.call('HGET', KEYS[1], ARGV[1])
            if bound then return bound end
            redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
            return ARGV[2]
            ",
        )
    });
    let key = key(stream);
    let mut inv = script.prepare_invoke();
    inv.key(&key).arg(group).arg(ledger_id);
    conn.invoke(&inv)
}

/// [`bind`] to `ledger`, refusing with a configuration error (exit 2) when the group belongs to
/// another ledger: no retry can make two ledgers one.
pub fn bind_or_refuse(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    ledger: &LedgerName,
) -> Result<()> {
    let bound = bind(conn, stream, group, &ledger.id)?;
    if bound == ledger.id {
        return Ok(());
    }
    let (ledger_id, ledger) = (&ledger.id, &ledger.shown);
    Err(Error::Config(format!(
        "consumer group {group} of {stream} belongs to ledger {bound} (the first worker to read \
         it bound it so, in {}), but this worker's ledger {ledger} is ledger {ledger_id}: two \
         ledgers reading one group would pay the same submissions twice, so this worker will \
         not read. Give this ledger a group of its own (--group NAME), or point --db at ledger \
         {bound}",
        key(stream)
    )))
}

/// Every group of `stream` with the ledger it is bound to.
pub fn bindings(conn: &mut Conn, stream: &str) -> Result<Vec<(String, String)>> {
    let key = key(stream);
    let reply: Value = conn.query(redis::cmd("HGETALL").arg(&key))?;
    let pairs = super::stream::pairs(reply)?;
    Ok(pairs
        .into_iter()
        .map(|(g, l)| {
            (
                String::from_utf8_lossy(&g).into_owned(),
                String::from_utf8_lossy(&l).into_owned(),
            )
        })
        .collect())
}
