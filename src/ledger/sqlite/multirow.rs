//! Many rows per `INSERT` statement.
//!
//! A group commit writes thousands of rows into the same few tables. One statement per row pays
//! SQLite's per-statement work (binding, opening cursors, seeking to the insertion point,
//! statement bookkeeping) every time; one statement of 64 rows pays it once. A batch's rows go
//! in statements of 64, then the remainder in statements of 16, 4 and 1 rows, so only four
//! statement shapes per table exist and all of them stay in the prepared-statement cache.

use super::raw::{Bound, Statements};
use crate::error::Result;

/// Rows per statement, largest first.
const CHUNK_ROWS: [usize; 4] = [64, 16, 4, 1];

/// Inserts `rows` with `head` (`INSERT INTO t (a, b, c)`, naming `columns` columns), many rows
/// per statement, through the writer's statements (values bound in place: `raw.rs`). `bind`
/// must bind exactly `columns` values for each row.
pub(super) fn insert<'v, R>(
    st: &mut Statements,
    head: &str,
    columns: usize,
    rows: &'v [R],
    mut bind: impl FnMut(&mut Bound<'_, 'v>, &'v R) -> Result<()>,
) -> Result<()> {
    let mut rest = rows;
    for size in CHUNK_ROWS {
        if rest.len() < size {
            continue;
        }
        // Built and looked up once per shape, not per chunk: a batch runs up to ~64 chunks of
        // the same shape.
        let id = st.id(&statement(head, columns, size))?;
        while rest.len() >= size {
            let (chunk, tail) = rest.split_at(size);
            let mut b = st.bind(id);
            for row in chunk {
                bind(&mut b, row)?;
            }
            debug_assert_eq!(b.count(), columns * size, "bind one value per column");
            b.execute()?;
            rest = tail;
        }
    }
    // The last chunk size is 1, so nothing can be left over.
    assert!(rest.is_empty(), "{} rows left uninserted", rest.len());
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
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER, b TEXT)")
            .unwrap();
        let mut st = Statements::new(&conn);
        for n in [0usize, 1, 3, 4, 5, 63, 64, 65, 150] {
            conn.execute("DELETE FROM t", []).unwrap();
            let rows: Vec<(i64, String)> = (0..n as i64).map(|i| (i, format!("r{i}"))).collect();
            insert(&mut st, "INSERT INTO t (a, b)", 2, &rows, |b, (a, s)| {
                b.int(*a)?;
                b.text(s)
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
