//! The writer's own statements, binding text and blobs without copying them.
//!
//! rusqlite binds every text and blob with `SQLITE_TRANSIENT`, which makes SQLite allocate and
//! copy each value before the statement runs. A batch binds about 25 values per submission
//! (claim, disbursement, outbox row, audit record), and on the writer thread those copies were
//! the largest single cost outside SQLite's B-tree work (`sqlite3_bind_text` and the
//! allocations under it: about a sixth of the batch's instructions, measured with callgrind on
//! `examples/bench_ledger.rs`). Here values are bound with `SQLITE_STATIC` — SQLite reads them
//! where they are — which is sound only while they stay alive and unmoved until the statement
//! has run and its bindings are cleared. [`Bound`] makes that a lifetime: it borrows every
//! value it binds for `'v`, and clears the bindings when it has run (or is dropped), so no
//! pointer into a value outlives it.
//!
//! [`Statements`] owns the prepared statements of one connection and is dropped (finalizing
//! them) before that connection closes: [`super::writer::Writer`] declares it first.
//!
//! **Invariant:** no bound pointer survives the [`Bound`] that bound it; every statement is
//! finalized exactly once, before its connection closes.

use crate::error::Result;
use rusqlite::ffi;
use std::collections::HashMap;
use std::ffi::c_int;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Prepared statements of one connection.
pub(super) struct Statements {
    /// The connection they were prepared on.
    db: NonNull<ffi::sqlite3>,
    /// Each statement's place in `prepared`, by SQL text.
    by_sql: HashMap<String, Id>,
    /// The statements, prepared once each.
    prepared: Vec<NonNull<ffi::sqlite3_stmt>>,
}

/// A statement of a [`Statements`], found once by its text and then used by number (the text of
/// a many-row insert runs to kilobytes: hashing it per use would cost more than it saves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Id(usize);

// SAFETY: the statements are used only through `&mut Statements`, by one thread at a time
// (the writer holds them under a mutex with their connection), as SQLite allows for one
// connection used by one thread at a time.
unsafe impl Send for Statements {}

impl Statements {
    /// Statements for `conn`, which must outlive them (the caller drops this first).
    pub(super) fn new(conn: &rusqlite::Connection) -> Self {
        // SAFETY: the handle is only used while `conn` is open (see above).
        let db = unsafe { conn.handle() };
        Statements {
            db: NonNull::new(db).expect("an open connection has a handle"),
            by_sql: HashMap::new(),
            prepared: Vec::new(),
        }
    }

    /// The statement for `sql`, prepared on first use.
    pub(super) fn id(&mut self, sql: &str) -> Result<Id> {
        if let Some(id) = self.by_sql.get(sql) {
            return Ok(*id);
        }
        let stmt = self.prepare(sql)?;
        let id = Id(self.prepared.len());
        self.prepared.push(stmt);
        self.by_sql.insert(sql.to_owned(), id);
        Ok(id)
    }

    /// Statement `id`, ready to bind from its first parameter.
    pub(super) fn bind<'v>(&mut self, id: Id) -> Bound<'_, 'v> {
        Bound {
            db: self.db,
            stmt: self.prepared[id.0],
            next: 1,
            _statements: PhantomData,
            _values: PhantomData,
        }
    }

    /// The statement for `sql`, prepared on first use, ready to bind.
    #[cfg(test)]
    pub(super) fn get<'v>(&mut self, sql: &str) -> Result<Bound<'_, 'v>> {
        let id = self.id(sql)?;
        Ok(self.bind(id))
    }

    fn prepare(&self, sql: &str) -> Result<NonNull<ffi::sqlite3_stmt>> {
        let mut stmt = std::ptr::null_mut();
        let len = c_int::try_from(sql.len()).expect("statement text fits in an int");
        // SAFETY: `db` is open; `sql` is valid for `len` bytes; SQLite writes `stmt`.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db.as_ptr(),
                sql.as_ptr().cast(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(error(self.db, rc));
        }
        Ok(NonNull::new(stmt).expect("a statement was prepared from non-empty text"))
    }
}

impl Drop for Statements {
    fn drop(&mut self) {
        for stmt in self.prepared.drain(..) {
            // SAFETY: each statement was prepared on `db`, which is still open, and is
            // finalized once, here.
            unsafe { ffi::sqlite3_finalize(stmt.as_ptr()) };
        }
    }
}

/// One execution of a statement being bound: values are bound in order, each borrowed for
/// `'v`; [`Bound::execute`] or [`Bound::query_row`] runs it and clears the bindings.
pub(super) struct Bound<'s, 'v> {
    /// The connection, for error messages.
    db: NonNull<ffi::sqlite3>,
    /// The statement.
    stmt: NonNull<ffi::sqlite3_stmt>,
    /// The next parameter's 1-based index.
    next: c_int,
    /// Borrows the statements, so only one execution is under way at a time.
    _statements: PhantomData<&'s mut Statements>,
    /// Every bound value lives at least this long.
    _values: PhantomData<&'v [u8]>,
}

impl<'v> Bound<'_, 'v> {
    /// Binds a text value without copying it.
    pub(super) fn text(&mut self, v: &'v str) -> Result<()> {
        let len = c_int::try_from(v.len()).map_err(|_| too_big())?;
        // SAFETY: `v` lives for 'v, past the clear in `finish`; SQLITE_STATIC tells SQLite not
        // to free it.
        let rc = unsafe {
            ffi::sqlite3_bind_text(
                self.stmt.as_ptr(),
                self.next,
                v.as_ptr().cast(),
                len,
                ffi::SQLITE_STATIC(),
            )
        };
        self.bound(rc)
    }

    /// Binds a blob without copying it.
    pub(super) fn blob(&mut self, v: &'v [u8]) -> Result<()> {
        let len = c_int::try_from(v.len()).map_err(|_| too_big())?;
        // SAFETY: as for `text`.
        let rc = unsafe {
            ffi::sqlite3_bind_blob(
                self.stmt.as_ptr(),
                self.next,
                v.as_ptr().cast(),
                len,
                ffi::SQLITE_STATIC(),
            )
        };
        self.bound(rc)
    }

    /// Binds a record's digest in the form it is stored (`derived::Digest`): its 32 bytes,
    /// copied by SQLite (they exist only here), or the text as it is.
    pub(super) fn digest(&mut self, hex: &'v str) -> Result<()> {
        let Some(bytes) = super::derived::lowercase_hex(hex) else {
            return self.text(hex);
        };
        // SAFETY: the statement is live; SQLITE_TRANSIENT makes SQLite copy the 32 bytes
        // before this returns.
        let rc = unsafe {
            ffi::sqlite3_bind_blob(
                self.stmt.as_ptr(),
                self.next,
                bytes.as_ptr().cast(),
                32,
                ffi::SQLITE_TRANSIENT(),
            )
        };
        self.bound(rc)
    }

    /// Binds an audit record's key in the form it is stored (as [`Bound::digest`]), or NULL.
    pub(super) fn opt_digest(&mut self, v: Option<&'v str>) -> Result<()> {
        match v {
            Some(v) => self.digest(v),
            None => self.null(),
        }
    }

    /// Binds an integer.
    pub(super) fn int(&mut self, v: i64) -> Result<()> {
        // SAFETY: the statement is live.
        let rc = unsafe { ffi::sqlite3_bind_int64(self.stmt.as_ptr(), self.next, v) };
        self.bound(rc)
    }

    /// Binds NULL.
    pub(super) fn null(&mut self) -> Result<()> {
        // SAFETY: the statement is live.
        let rc = unsafe { ffi::sqlite3_bind_null(self.stmt.as_ptr(), self.next) };
        self.bound(rc)
    }

    /// Binds a text value or NULL.
    pub(super) fn opt_text(&mut self, v: Option<&'v str>) -> Result<()> {
        match v {
            Some(v) => self.text(v),
            None => self.null(),
        }
    }

    /// Binds an integer or NULL.
    pub(super) fn opt_int(&mut self, v: Option<i64>) -> Result<()> {
        match v {
            Some(v) => self.int(v),
            None => self.null(),
        }
    }

    /// How many values are bound so far.
    pub(super) fn count(&self) -> usize {
        (self.next - 1) as usize
    }

    /// Runs a statement that returns no rows; returns the rows it changed.
    pub(super) fn execute(self) -> Result<usize> {
        // SAFETY: the statement is live and fully bound.
        let rc = unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) };
        match rc {
            ffi::SQLITE_DONE => {
                // SAFETY: `db` is open.
                Ok(unsafe { ffi::sqlite3_changes64(self.db.as_ptr()) } as usize)
            }
            ffi::SQLITE_ROW => Err(crate::Error::Invariant(
                "a statement run for its changes returned a row".into(),
            )),
            rc => Err(error(self.db, rc)),
        }
    }

    /// Runs a query and reads its first row with `read` (`None` when there is none); further
    /// rows are not read.
    pub(super) fn query_row<T>(self, read: impl FnOnce(&Row<'_>) -> T) -> Result<Option<T>> {
        // SAFETY: the statement is live and fully bound.
        let rc = unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) };
        match rc {
            ffi::SQLITE_ROW => Ok(Some(read(&Row {
                stmt: self.stmt,
                _row: PhantomData,
            }))),
            ffi::SQLITE_DONE => Ok(None),
            rc => Err(error(self.db, rc)),
        }
    }

    fn bound(&mut self, rc: c_int) -> Result<()> {
        if rc != ffi::SQLITE_OK {
            return Err(error(self.db, rc));
        }
        self.next += 1;
        Ok(())
    }
}

impl Drop for Bound<'_, '_> {
    /// Resets the statement and clears its bindings, so nothing points into the values any
    /// longer, whether it ran, failed or was never run.
    fn drop(&mut self) {
        // SAFETY: the statement is live; reset and clear never fail in a way that leaves a
        // binding in place.
        unsafe {
            ffi::sqlite3_reset(self.stmt.as_ptr());
            ffi::sqlite3_clear_bindings(self.stmt.as_ptr());
        }
    }
}

/// The current row of a query, readable while the [`Bound`] that ran it lives.
pub(super) struct Row<'r> {
    /// The statement positioned on the row.
    stmt: NonNull<ffi::sqlite3_stmt>,
    /// Valid only during `query_row`'s callback.
    _row: PhantomData<&'r ()>,
}

impl Row<'_> {
    /// Column `i` (0-based) as text; `None` for NULL.
    pub(super) fn text(&self, i: c_int) -> Option<String> {
        // SAFETY: the statement is on a row; SQLite returns a pointer valid until the next
        // step or reset, which we copy from at once.
        unsafe {
            let p = ffi::sqlite3_column_text(self.stmt.as_ptr(), i);
            if p.is_null() {
                return None;
            }
            let n = ffi::sqlite3_column_bytes(self.stmt.as_ptr(), i) as usize;
            let bytes = std::slice::from_raw_parts(p, n);
            Some(String::from_utf8_lossy(bytes).into_owned())
        }
    }

    /// Column `i` as an integer; `None` for NULL.
    pub(super) fn int(&self, i: c_int) -> Option<i64> {
        // SAFETY: the statement is on a row.
        unsafe {
            if ffi::sqlite3_column_type(self.stmt.as_ptr(), i) == ffi::SQLITE_NULL {
                return None;
            }
            Some(ffi::sqlite3_column_int64(self.stmt.as_ptr(), i))
        }
    }
}

/// SQLite's error for `rc` on `db`, as rusqlite would report it (so `error.rs` classifies it
/// the same way: busy, locked, full and I/O are transient).
fn error(db: NonNull<ffi::sqlite3>, rc: c_int) -> crate::Error {
    // SAFETY: `db` is open; the message is copied at once.
    let (extended, message) = unsafe {
        let extended = ffi::sqlite3_extended_errcode(db.as_ptr());
        let p = ffi::sqlite3_errmsg(db.as_ptr());
        let message = if p.is_null() {
            None
        } else {
            Some(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        (extended, message)
    };
    // The extended code carries the primary one in its low byte; use rc's when they disagree
    // (a bind error sets no connection error).
    let code = if extended & 0xff == rc & 0xff {
        extended
    } else {
        rc
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(code), message).into()
}

fn too_big() -> crate::Error {
    rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_TOOBIG), None).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_bound_in_place_are_stored_and_read_back_exactly() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a TEXT, b BLOB, c INTEGER, d TEXT)")
            .unwrap();
        let mut st = Statements::new(&conn);
        for i in 0..3i64 {
            let text = format!("row {i} é");
            let blob = vec![i as u8; 32];
            let mut b = st.get("INSERT INTO t VALUES (?, ?, ?, ?)").unwrap();
            b.text(&text).unwrap();
            b.blob(&blob).unwrap();
            b.int(i).unwrap();
            b.opt_text(None).unwrap();
            assert_eq!(b.count(), 4);
            assert_eq!(b.execute().unwrap(), 1);
            // The values go out of scope here; the bindings were cleared before they did.
        }
        let mut q = st.get("SELECT a, c FROM t WHERE c = ?").unwrap();
        q.int(2).unwrap();
        let row = q.query_row(|r| (r.text(0), r.int(1))).unwrap();
        assert_eq!(row, Some((Some("row 2 é".to_owned()), Some(2))));
        let (n, blobs): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), SUM(b = zeroblob(0) OR length(b) = 32) FROM t WHERE d IS NULL",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((n, blobs), (3, 3));
        let mut none = st.get("SELECT a FROM t WHERE c = ?").unwrap();
        none.int(9).unwrap();
        assert_eq!(none.query_row(|r| r.text(0)).unwrap(), None);
    }

    #[test]
    fn a_constraint_failure_is_the_error_rusqlite_would_give() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER PRIMARY KEY)")
            .unwrap();
        let mut st = Statements::new(&conn);
        for expect_ok in [true, false] {
            let mut b = st.get("INSERT INTO t VALUES (?)").unwrap();
            b.int(1).unwrap();
            let result = b.execute();
            assert_eq!(result.is_ok(), expect_ok, "{result:?}");
            if let Err(e) = result {
                assert!(e.to_string().contains("UNIQUE constraint failed"), "{e}");
                assert!(!e.is_transient());
            }
        }
        // The statement is usable again after a failure.
        let mut b = st.get("INSERT INTO t VALUES (?)").unwrap();
        b.int(2).unwrap();
        assert_eq!(b.execute().unwrap(), 1);
    }
}
