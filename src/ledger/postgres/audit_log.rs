//! [`AuditLog`] for PostgreSQL: the chain walked through the store's reads
//! (`audit_store.rs`).

use super::audit_store::{for_each, Range};
use super::ledger::PgLedger;
use crate::domain::audit::Record;
use crate::error::Result;
use crate::ledger::{AuditLog, Since};

impl AuditLog for PgLedger {
    /// One repeatable-read transaction around the whole walk: batches linked meanwhile add
    /// nothing to what `f` sees, and every link in it is durable before `f` sees the first
    /// record (an export or an anchor must not name a link a server crash could undo). Rows
    /// are streamed, one at a time.
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        let mut conn = self.conn()?;
        let mut tx = self.durable_snapshot(&mut conn.client)?;
        for_each(&mut tx, &Range::Since(since), f)
    }

    /// Through the partial indexes of dead-letter records (`schema_postgres.sql`), streamed,
    /// from a durable snapshot as above.
    fn for_each_dead_letter(&self, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let mut conn = self.conn()?;
        let mut tx = self.durable_snapshot(&mut conn.client)?;
        for_each(&mut tx, &Range::DeadLetters, f)
    }
}
