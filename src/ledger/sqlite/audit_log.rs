//! [`AuditLog`] for SQLite: the chain walked in one read transaction, through the store's
//! reads (`audit_store.rs`).

use super::audit_store::{for_each, record_of, DEAD_LETTER_RECORDS};
use super::ledger::SqliteLedger;
use crate::domain::audit::Record;
use crate::error::Result;
use crate::ledger::{AuditLog, Since};

impl AuditLog for SqliteLedger {
    /// One read transaction around the whole walk: a worker committing meanwhile adds nothing
    /// to what `f` sees.
    fn for_each_record(
        &self,
        since: &Since,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        for_each(&tx, since, f)
    }

    /// Through the partial index `audit_dead_letters` (`schema.sql`): one index entry per dead
    /// letter, none for any other record.
    fn for_each_dead_letter(&self, f: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let mut stmt = tx.prepare(DEAD_LETTER_RECORDS)?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            f(record_of(row)?)?;
        }
        Ok(())
    }
}
