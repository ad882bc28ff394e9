//! The ledger's counts, kept in the ledger (`ledger_counts`), so `status`, `/metrics`,
//! `/healthz` and a worker's start read one row at any ledger size.
//!
//! Counted from the rows, they cost a pass over the claims, the disbursements and the audit
//! trail: about a second per million claims, so ten seconds on a three-year ledger of ten
//! million, at every process's first look (BENCHMARKS.md, issue 37).
//!
//! **Invariant:** the row equals what [`recount`] finds, at every commit. Every transaction
//! that adds or removes a counted row moves the counts by what it did, in the same
//! transaction, before its COMMIT: a batch (`batch.rs`, also the decision on a held conflict),
//! a record written outside a batch (`audit_store::append`: holds, a restore), a purge batch
//! (`purge.rs`). So a crash at any point of a commit leaves both or neither. `verify` counts the
//! rows in its one pass and fails when the row says otherwise (`verify.rs`).
//!
//! The row is not evidence (the audit chain is): a ledger whose row is missing gets it again,
//! counted from the rows, at its next open ([`install`]), which is also how a ledger made by an
//! earlier release gets it, once. A transaction that finds no row changes nothing; the next open
//! counts what it wrote.
//!
//! The amounts are kept in two halves that cannot overflow, as the old tally summed them:
//! `cents_high` the sum of each amount's high 32 bits (each under 2^31), `cents_low` of its low
//! 32 bits (each under 2^32); both exact for fewer than 2^31 claims, joined into an i128.

use crate::domain::audit::{Kind, Record};
use crate::error::{Error, Result};
use crate::ledger::Counts;
use rusqlite::{params, Connection, OptionalExtension};

/// What one transaction changes in the counts; written with one UPDATE ([`Delta::apply`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Delta {
    claims: i64,
    disbursements: i64,
    cents_high: i64,
    cents_low: i64,
    dead_letters: i64,
    duplicates: i64,
    conflicts: i64,
    vanished: i64,
    audit_records: i64,
    tombstones: i64,
}

impl Delta {
    /// A claim made with its disbursement of `amount_cents`.
    pub(super) fn paid(&mut self, amount_cents: i64) {
        assert!(amount_cents > 0, "a disbursement of {amount_cents} cents");
        self.claims += 1;
        self.disbursements += 1;
        self.cents_high += amount_cents >> 32;
        self.cents_low += amount_cents & LOW_BITS;
    }

    /// Dead letters inserted.
    pub(super) fn dead_letters(&mut self, n: usize) {
        self.dead_letters += n as i64;
    }

    /// The delta of `records` written.
    pub(super) fn of_records<'r>(records: impl IntoIterator<Item = &'r Record>) -> Delta {
        let mut d = Delta::default();
        d.records(records);
        d
    }

    /// Audit records written.
    pub(super) fn records<'r>(&mut self, records: impl IntoIterator<Item = &'r Record>) {
        for r in records {
            self.audit_records += 1;
            match r.kind {
                Kind::Duplicate => self.duplicates += 1,
                Kind::Conflict => self.conflicts += 1,
                Kind::Vanished => self.vanished += 1,
                _ => {}
            }
        }
    }

    /// What a purge batch removed, and the tombstones it added.
    pub(super) fn purged(removed: Removed, tombstones: usize) -> Delta {
        Delta {
            claims: -removed.claims,
            disbursements: -removed.disbursements,
            cents_high: -removed.cents_high,
            cents_low: -removed.cents_low,
            dead_letters: -removed.dead_letters,
            duplicates: -removed.duplicates,
            conflicts: -removed.conflicts,
            vanished: -removed.vanished,
            audit_records: -removed.records,
            tombstones: tombstones as i64,
        }
    }

    /// Moves the counts by this delta, inside the caller's write transaction. Nothing when the
    /// delta is empty, or when the ledger has no counts row (see the module doc).
    pub(super) fn apply(&self, conn: &Connection) -> Result<()> {
        if *self == Delta::default() {
            return Ok(());
        }
        conn.prepare_cached(
            "UPDATE ledger_counts SET claims = claims + ?1, disbursements = disbursements + ?2,
                 cents_high = cents_high + ?3, cents_low = cents_low + ?4,
                 dead_letters = dead_letters + ?5, duplicates = duplicates + ?6,
                 conflicts = conflicts + ?7, vanished = vanished + ?8,
                 audit_records = audit_records + ?9, tombstones = tombstones + ?10
             WHERE id = 1",
        )?
        .execute(params![
            self.claims,
            self.disbursements,
            self.cents_high,
            self.cents_low,
            self.dead_letters,
            self.duplicates,
            self.conflicts,
            self.vanished,
            self.audit_records,
            self.tombstones
        ])?;
        Ok(())
    }
}

impl Delta {
    /// [`Delta::apply`] on a ledger that may predate the counts (a restore's copy of a backup
    /// an earlier release made, which has no `ledger_counts` table until its first open).
    pub(super) fn apply_if_kept(&self, conn: &Connection) -> Result<()> {
        let kept: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master
                            WHERE type = 'table' AND name = 'ledger_counts')",
            [],
            |r| r.get(0),
        )?;
        if kept {
            self.apply(conn)?;
        }
        Ok(())
    }
}

/// What a purge batch removes, counted before it does (`purge.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Removed {
    pub(super) claims: i64,
    pub(super) disbursements: i64,
    pub(super) cents_high: i64,
    pub(super) cents_low: i64,
    pub(super) dead_letters: i64,
    pub(super) records: i64,
    pub(super) duplicates: i64,
    pub(super) conflicts: i64,
    pub(super) vanished: i64,
}

/// The low 32 bits of an amount.
const LOW_BITS: i64 = 0xffff_ffff;

/// The kept counts, if the ledger has its row.
pub(super) fn read(conn: &Connection) -> Result<Option<Counts>> {
    Ok(conn
        .prepare_cached(
            "SELECT claims, disbursements, cents_high, cents_low, dead_letters, duplicates,
                    conflicts, vanished, audit_records, tombstones
             FROM ledger_counts WHERE id = 1",
        )?
        .query_row([], |r| {
            let n = |i: usize| -> rusqlite::Result<u64> {
                let v: i64 = r.get(i)?;
                // A negative count is a row edited by hand; `verify` names it, with its value.
                Ok(u64::try_from(v).unwrap_or(u64::MAX))
            };
            Ok(Counts {
                claims: n(0)?,
                disbursements: n(1)?,
                disbursed_cents_total: cents(r.get(2)?, r.get(3)?),
                dead_letters: n(4)?,
                duplicates: n(5)?,
                conflicts: n(6)?,
                vanished: n(7)?,
                audit_records: n(8)?,
                tombstones: n(9)?,
            })
        })
        .optional()?)
}

/// The amount the two halves make.
fn cents(high: i64, low: i64) -> i128 {
    (i128::from(high) << 32) + i128::from(low)
}

/// The counts, counted from the rows (a pass over each counted table): for [`install`] and for
/// `stats` on a ledger whose row went missing under a running process.
pub(super) fn recount(conn: &Connection) -> Result<Counts> {
    let one = |sql: &str| -> Result<i64> { Ok(conn.query_row(sql, [], |r| r.get(0))?) };
    let (disbursements, high, low): (i64, i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(amount_cents >> 32), 0),
                COALESCE(SUM(amount_cents & 4294967295), 0) FROM disbursements",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let (records, duplicates, conflicts, vanished): (i64, i64, i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(kind = 'duplicate'), 0),
                COALESCE(SUM(kind = 'conflict'), 0), COALESCE(SUM(kind = 'vanished'), 0)
         FROM audit_log",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    let n = |v: i64| v as u64;
    Ok(Counts {
        claims: n(one("SELECT COUNT(*) FROM processed_messages")?),
        disbursements: n(disbursements),
        disbursed_cents_total: cents(high, low),
        dead_letters: n(one("SELECT COUNT(*) FROM dead_letters")?),
        duplicates: n(duplicates),
        conflicts: n(conflicts),
        vanished: n(vanished),
        audit_records: n(records),
        tombstones: n(one("SELECT COUNT(*) FROM claim_tombstones")?),
    })
}

/// Writes the counts row, counted from the rows, if the ledger has none; inside the caller's
/// `BEGIN IMMEDIATE` transaction, so no batch commits between the count and the row. Returns
/// the counts written, or `None` when the row was there.
pub(super) fn install(conn: &Connection) -> Result<Option<Counts>> {
    if read(conn)?.is_some() {
        return Ok(None);
    }
    assert!(
        !conn.is_autocommit(),
        "the counts are installed inside a write transaction"
    );
    let c = recount(conn)?;
    let (high, low) = halves(c.disbursed_cents_total)?;
    let i = |v: u64| v as i64;
    conn.execute(
        "INSERT INTO ledger_counts (id, claims, disbursements, cents_high, cents_low,
             dead_letters, duplicates, conflicts, vanished, audit_records, tombstones)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            i(c.claims),
            i(c.disbursements),
            high,
            low,
            i(c.dead_letters),
            i(c.duplicates),
            i(c.conflicts),
            i(c.vanished),
            i(c.audit_records),
            i(c.tombstones)
        ],
    )?;
    Ok(Some(c))
}

/// A total split into the halves the row keeps (`cents_low` under 2^32 here; batches then add
/// to each half).
fn halves(total: i128) -> Result<(i64, i64)> {
    let high = i64::try_from(total >> 32)
        .map_err(|_| Error::Invariant(format!("a disbursed total of {total} cents")))?;
    Ok((high, (total & i128::from(LOW_BITS)) as i64))
}

/// Names the first count the row holds that the rows do not (`verify`), or `None`.
pub(super) fn differs(kept: &Counts, rows: &Counts) -> Option<String> {
    let pairs: [(&str, i128, i128); 9] = [
        ("claims", kept.claims.into(), rows.claims.into()),
        (
            "disbursements",
            kept.disbursements.into(),
            rows.disbursements.into(),
        ),
        (
            "disbursed cents",
            kept.disbursed_cents_total,
            rows.disbursed_cents_total,
        ),
        (
            "dead letters",
            kept.dead_letters.into(),
            rows.dead_letters.into(),
        ),
        ("duplicates", kept.duplicates.into(), rows.duplicates.into()),
        ("conflicts", kept.conflicts.into(), rows.conflicts.into()),
        ("vanished", kept.vanished.into(), rows.vanished.into()),
        (
            "audit records",
            kept.audit_records.into(),
            rows.audit_records.into(),
        ),
        ("tombstones", kept.tombstones.into(), rows.tombstones.into()),
    ];
    pairs.iter().find(|(_, k, r)| k != r).map(|(what, k, r)| {
        format!(
            "ledger_counts says {k} {what}, the ledger holds {r}: the row is derived from the \
             rows and is no evidence; if nothing else is wrong, delete it (DELETE FROM \
             ledger_counts) and the next open of the ledger counts again"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::SCHEMA).unwrap();
        conn
    }

    #[test]
    fn installed_counts_equal_the_rows_and_a_delta_moves_them_exactly() {
        let mut conn = ledger();
        conn.execute_batch(
            "INSERT INTO processed_messages VALUES
               (1, zeroblob(32), 'A', 't', 9223372036854775807, 'now', 'e1', 'c', 't');
             INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents,
               recorded_at) VALUES (1, zeroblob(32), 'A', 9223372036854775807, 'now');
             INSERT INTO claim_tombstones VALUES (randomblob(32), 't', 'now');
             INSERT INTO dead_letters (stream, stream_entry_id, reason_code, reason,
               delivery_count, recorded_at) VALUES ('s', 'e2', 'r', 'r', 1, 'now');
             INSERT INTO audit_log (kind, recorded_at, prev_hash, hash) VALUES
               ('processed', 'now', '', ''), ('duplicate', 'now', '', ''),
               ('conflict', 'now', '', ''), ('vanished', 'now', '', '');",
        )
        .unwrap();
        let tx = conn.transaction().unwrap();
        let installed = install(&tx).unwrap().expect("no row before");
        assert_eq!(install(&tx).unwrap(), None, "installed once");
        assert_eq!(read(&tx).unwrap(), Some(installed.clone()));
        assert_eq!(installed.claims, 1);
        assert_eq!(installed.disbursed_cents_total, i128::from(i64::MAX));
        assert_eq!(
            (
                installed.duplicates,
                installed.conflicts,
                installed.vanished
            ),
            (1, 1, 1)
        );
        assert_eq!((installed.audit_records, installed.tombstones), (4, 1));
        // A second maximal amount: the halves still sum past i64 exactly.
        let mut d = Delta::default();
        d.paid(i64::MAX);
        d.dead_letters(2);
        d.apply(&tx).unwrap();
        let after = read(&tx).unwrap().unwrap();
        assert_eq!(after.disbursed_cents_total, 2 * i128::from(i64::MAX));
        assert_eq!((after.claims, after.dead_letters), (2, 3));
        let mut kept = after.clone();
        kept.claims += 1;
        let said = differs(&kept, &after).expect("a claim more");
        assert!(said.contains("3 claims, the ledger holds 2"), "{said}");
        assert_eq!(differs(&after, &after), None);
    }
}
