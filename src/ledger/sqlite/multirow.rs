//! Many rows per `INSERT` statement.
//!
//! A group commit writes thousands of rows into the same few tables. One statement per row pays
//! SQLite's per-statement work (binding, opening cursors, seeking to the insertion point,
//! statement bookkeeping) every time; one statement of 64 rows pays it once. A batch's rows go
//! in statements of 64, then the remainder in statements of 16, 4 and 1 rows, so only four
//! statement shapes per table exist and all of them stay in the prepared-statement cache.

use crate::error::Result;
use rusqlite::{Connection, Statement, ToSql};

/// Rows per statement, largest first.
const CHUNK_ROWS: [usize; 4] = [64, 16, 4, 1];

/// Binds one row's values, in column order, into a multi-row statement.
pub(super) struct Binder<'s, 'c> {
    /// The statement being filled.
    stmt: &'s mut Statement<'c>,
    /// The next parameter's 1-based index.
    next: usize,
}

impl Binder<'_, '_> {
    /// Binds the next column's value.
    pub(super) fn bind<T: ToSql>(&mut self, value: T) -> Result<()> {
        self.stmt.raw_bind_parameter(self.next, value)?;
        self.next += 1;
        Ok(())
    }
}

/// Inserts `rows` with `head` (`INSERT INTO t (a, b, c)`, naming `columns` columns), many rows
/// per statement. `bind` must bind exactly `columns` values for each row.
pub(super) fn insert<R>(
    conn: &Connection,
    head: &str,
    columns: usize,
    rows: &[R],
    mut bind: impl FnMut(&mut Binder<'_, '_>, &R) -> Result<()>,
) -> Result<()> {
    let mut rest = rows;
    for size in CHUNK_ROWS {
        if rest.len() < size {
            continue;
        }
        // Built once per shape, not per chunk: a batch runs up to ~64 chunks of the same shape.
        let sql = statement(head, columns, size);
        while rest.len() >= size {
            let (chunk, tail) = rest.split_at(size);
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut binder = Binder {
                stmt: &mut stmt,
                next: 1,
            };
            for row in chunk {
                bind(&mut binder, row)?;
            }
            debug_assert_eq!(binder.next, columns * size + 1, "bind one value per column");
            stmt.raw_execute()?;
            rest = tail;
        }
    }
    Ok(())
}

/// `head VALUES (?, ?), (?, ?), ...` with `rows` groups of `columns` placeholders.
fn statement(head: &str, columns: usize, rows: usize) -> String {
    let group = format!("({})", vec!["?"; columns].join(", "));
    format!("{head} VALUES {}", vec![group; rows].join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_lands_once_whatever_the_count() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER, b TEXT)")
            .unwrap();
        for n in [0usize, 1, 3, 4, 5, 63, 64, 65, 150] {
            conn.execute("DELETE FROM t", []).unwrap();
            let rows: Vec<(i64, String)> = (0..n as i64).map(|i| (i, format!("r{i}"))).collect();
            insert(&conn, "INSERT INTO t (a, b)", 2, &rows, |b, (a, s)| {
                b.bind(a)?;
                b.bind(s)
            })
            .unwrap();
            let (count, sum, ok): (i64, i64, i64) = conn
                .query_row(
                    "SELECT COUNT(*), COALESCE(SUM(a), 0), COALESCE(SUM(b = 'r' || a), 0) FROM t",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .unwrap();
            let n = n as i64;
            assert_eq!(
                (count, sum, ok),
                (n, n * (n - 1) / 2, n),
                "{n} rows, each once"
            );
        }
    }
}
