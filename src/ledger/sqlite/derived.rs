//! What a format-5 ledger does not store because it can be derived, read back as if it were
//! stored (`schema.sql` says which columns; `format.rs`, why the number changed).
//!
//! - **Digests** (`audit_log.prev_hash`, `hash`): stored as 32 raw bytes; a ledger of an
//!   earlier format keeps its rows' 64 hex digits. [`digest_hex`] reads either as hex, the one
//!   form a record is shown and hashed in, and [`Digest`] is how a record's hex is stored.
//! - **Audit keys** (`audit_log.idempotency_key`, format 6): stored the same way, 32 raw bytes
//!   for 64 lowercase hex digits, as the claim's own key is. [`key_hex`] reads either form (or
//!   NULL) as hex, the form a record is shown, exported and hashed in; in SQL, [`key_bytes!`]
//!   and [`key_text!`] spell the column as bytes (to join a claim) and as hex (to name it).
//!   `sqlite3` finds a payment's records with `WHERE idempotency_key = x'…'` (a record written
//!   before format 6: `= '…'`), as it finds its claim.
//! - **Outbox rows** are written whole, and stay whole while they wait for the relay: the
//!   event is there for anything that publishes it. Once published, a row whose table allows
//!   it keeps no `event_type`, `payload` or `created_at`: the transaction that marks it puts it
//!   back without them (`outbox::mark`). The event is a function of the claim (`domain::event::announcing`, the code
//!   that built it at the claim), so a derived payload is byte for byte the one stored, and
//!   `created_at` is the claim's `claimed_at` (one transaction wrote both). [`OUTBOX_ROWS`] and
//!   [`OutboxRow`] read a row either way.
//! - **Disbursements** whose table allows it leave `recorded_at` NULL: the claim's
//!   `claimed_at`, written in the same transaction. Their key, award and amount are always
//!   stored: the contract names them, and it is the table people query for what was paid
//!   (`verify` refuses a disbursement whose key is not its claim's, NULL included).
//!
//! **Invariant:** a value derived here is only ever derived from the row's own claim (the
//! claim a purge removes together with its disbursement and outbox row), and a value that is
//! stored is read as stored: `verify` still compares stored values with their claim, so a row
//! edited by hand is found as before.

use crate::domain::event::{self, Announced, DISBURSEMENT_RECORDED};
use crate::domain::key;
use crate::error::{Error, Result};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, ToSql};

/// Which of the two tables leave their derivable columns NULL: those whose declaration allows
/// it (a ledger this release made). Read once at open, like the claim index's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Derives {
    /// A published outbox row keeps no event type, payload or creation time.
    pub(super) outbox: bool,
    /// Disbursements store no recording time.
    pub(super) disbursements: bool,
}

impl Derives {
    /// What the tables' declarations allow. A table whose columns someone made NOT NULL again
    /// by hand is written in full, so no insert is refused.
    pub(super) fn of(conn: &Connection) -> Result<Derives> {
        let nullable = |table: &str, columns: &[&str]| -> Result<bool> {
            for column in columns {
                let not_null: Option<bool> = conn
                    .query_row(
                        "SELECT \"notnull\" FROM pragma_table_info(?1) WHERE name = ?2",
                        [table, column],
                        |r| r.get(0),
                    )
                    .optional()?;
                if not_null != Some(false) {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        Ok(Derives {
            outbox: nullable("outbox", &["event_type", "payload", "created_at"])?,
            disbursements: nullable("disbursements", &["recorded_at"])?,
        })
    }
}

/// A digest column's value as the hex it stands for: 32 raw bytes as lowercase hex, a text as
/// it is (an earlier format's hex; an edited value still reads, and then fails the chain).
pub(super) fn digest_hex(value: ValueRef<'_>) -> rusqlite::Result<String> {
    match value {
        ValueRef::Blob(bytes) if bytes.len() == 32 => Ok(key::to_hex(bytes)),
        ValueRef::Text(text) => String::from_utf8(text.to_vec())
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, value.data_type(), e.into())),
        other => Err(rusqlite::Error::FromSqlConversionFailure(
            0,
            other.data_type(),
            format!(
                "a key or digest is 32 bytes or hex text, not this {:?}",
                other.data_type()
            )
            .into(),
        )),
    }
}

/// An audit record's key column as the hex it stands for, `None` for NULL (a record about no
/// key): 32 raw bytes (format 6) or text (earlier formats), as [`digest_hex`] reads a digest.
pub(super) fn key_hex(value: ValueRef<'_>) -> rusqlite::Result<Option<String>> {
    match value {
        ValueRef::Null => Ok(None),
        other => digest_hex(other).map(Some),
    }
}

/// SQL for an audit record's key column `$column` as the 32 bytes it names, whichever form it is
/// stored in ([`key_hex`]): the bytes as stored, or a text's hex read back (NULL if it is not
/// hex). Compared with a claim's or a tombstone's key, which are always bytes.
macro_rules! key_bytes {
    ($column:literal) => {
        concat!(
            "CASE typeof(",
            $column,
            ") WHEN 'blob' THEN ",
            $column,
            " ELSE unhex(",
            $column,
            ") END"
        )
    };
}
pub(super) use key_bytes;

/// SQL for an audit record's key column `$column` as the text a message names it by: the bytes'
/// lowercase hex, or a text as it is stored.
macro_rules! key_text {
    ($column:literal) => {
        concat!(
            "CASE typeof(",
            $column,
            ") WHEN 'blob' THEN lower(hex(",
            $column,
            ")) ELSE ",
            $column,
            " END"
        )
    };
}
pub(super) use key_text;

/// How a record's digest (64 hex digits) is stored: as its 32 bytes when it is 64 lowercase
/// hex digits, which read back as the same text; anything else (never sealed by claimgate: a
/// test's or an insider's record) as the text itself, so every record is stored as given.
pub(super) struct Digest<'a>(pub(super) &'a str);

impl ToSql for Digest<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match lowercase_hex(self.0) {
            Some(bytes) => ToSqlOutput::Owned(rusqlite::types::Value::Blob(bytes.to_vec())),
            None => ToSqlOutput::Borrowed(ValueRef::Text(self.0.as_bytes())),
        })
    }
}

/// The 32 bytes `hex` spells, when it is exactly 64 lowercase hex digits.
pub(super) fn lowercase_hex(hex: &str) -> Option<[u8; 32]> {
    let lowercase = hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !lowercase {
        return None;
    }
    let k = key::IdempotencyKey::from_hex(hex)?;
    debug_assert_eq!(k.to_hex(), hex, "lowercase hex reads back as itself");
    Some(*k.as_bytes())
}

/// The columns of an outbox row as [`OutboxRow::read`] takes them, from `outbox o` joined to
/// its claim `p` (`outbox_from!`); `created_at` is derived in SQL. Macros, so statements are
/// built with `concat!`.
macro_rules! outbox_columns {
    () => {
        "o.id, o.claim_id, o.event_type, o.payload, ifnull(o.created_at, p.claimed_at), \
         o.published_at, p.amount_cents, p.award_id, p.idempotency_key, p.submission_timestamp"
    };
}
pub(super) use outbox_columns;

/// The outbox joined to each row's claim by the claim's primary key: one lookup a row, in
/// whatever order the outbox is read.
macro_rules! outbox_from {
    () => {
        "outbox o LEFT JOIN processed_messages p ON p.claim_id = o.claim_id"
    };
}
pub(super) use outbox_from;

/// Every outbox row in id order, as stored or derived.
pub(super) const OUTBOX_ROWS: &str = concat!(
    "SELECT ",
    outbox_columns!(),
    " FROM ",
    outbox_from!(),
    " ORDER BY o.id"
);

/// An outbox row with everything an earlier format stored, whether stored or derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OutboxRow {
    pub(super) id: i64,
    pub(super) claim_id: i64,
    pub(super) event_type: String,
    pub(super) payload: String,
    /// NULL only in a row whose claim is gone and which stored none (`verify` finds it).
    pub(super) created_at: Option<String>,
    pub(super) published_at: Option<String>,
}

impl OutboxRow {
    /// Reads the row from `row`'s columns in `outbox_columns!` order. A payload neither stored
    /// nor derivable (its claim is gone) is [`Error::Invariant`] naming the row.
    pub(super) fn read(row: &Row<'_>) -> Result<OutboxRow> {
        let (id, claim_id): (i64, i64) = (row.get(0)?, row.get(1)?);
        let payload = match row.get::<_, Option<String>>(3)? {
            Some(stored) => stored,
            None => derived_payload(row, 6)?.ok_or_else(|| {
                Error::Invariant(format!(
                    "outbox row {id} stores no payload and its claim {claim_id} is not in the \
                     ledger to derive its event from"
                ))
            })?,
        };
        Ok(OutboxRow {
            id,
            claim_id,
            event_type: row
                .get::<_, Option<String>>(2)?
                .unwrap_or_else(|| DISBURSEMENT_RECORDED.to_owned()),
            payload,
            created_at: row.get(4)?,
            published_at: row.get(5)?,
        })
    }

    /// Whether the event [`OutboxRow::read`] read from `row` is exactly the one its claim
    /// spells (derived, or stored with the same bytes): a ledger that spells events from
    /// claims (PostgreSQL since its format 5) need not store it (`migrate`). A payload `read`
    /// derived is not spelled a second time.
    pub(super) fn spelled_by_claim(&self, row: &Row<'_>) -> Result<bool> {
        if self.event_type != DISBURSEMENT_RECORDED {
            return Ok(false);
        }
        if row.get_ref(3)? == rusqlite::types::ValueRef::Null {
            return Ok(true);
        }
        Ok(derived_payload(row, 6)?.as_deref() == Some(self.payload.as_str()))
    }
}

/// The event of the claim whose amount, award, key and submission timestamp stand in `row`
/// from column `at` on; `None` when the row has no claim (all NULL).
fn derived_payload(row: &Row<'_>, at: usize) -> Result<Option<String>> {
    let Some(amount) = row.get::<_, Option<i64>>(at)? else {
        return Ok(None);
    };
    let (award, key, submitted): (String, Vec<u8>, String) =
        (row.get(at + 1)?, row.get(at + 2)?, row.get(at + 3)?);
    Ok(Some(event::announcing(&Announced {
        amount_cents: amount,
        award_id: &award,
        key_hex: &key::to_hex(&key),
        submission_timestamp: &submitted,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_stored_as_bytes_only_when_it_reads_back_as_the_same_text() {
        let hex = "84b044a3ad4d173e73fd003c1f68920589d6168f9190e7006a6318026a493b88";
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER, d BLOB)")
            .unwrap();
        let upper = hex.to_uppercase();
        let odd = "not a digest";
        for (n, given) in [hex, upper.as_str(), odd].into_iter().enumerate() {
            conn.execute(
                "INSERT INTO t VALUES (?1, ?2)",
                rusqlite::params![n as i64, Digest(given)],
            )
            .unwrap();
        }
        let stored: Vec<(String, String)> = conn
            .prepare("SELECT typeof(d), d FROM t ORDER BY n")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, digest_hex(r.get_ref(1)?)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            stored,
            [
                ("blob".to_owned(), hex.to_owned()),
                ("text".to_owned(), upper.clone()),
                ("text".to_owned(), odd.to_owned()),
            ]
        );
        assert!(digest_hex(ValueRef::Blob(&[0; 31])).is_err());
        assert!(digest_hex(ValueRef::Integer(7)).is_err());
    }

    #[test]
    fn an_audit_key_reads_and_joins_as_one_key_whichever_form_it_is_stored_in() {
        // Rows 1..=4: a key as bytes (format 6), the same key as hex (earlier formats), the
        // same in capitals (an insider's), and NULL (a record about no key).
        let hex = "84b044a3ad4d173e73fd003c1f68920589d6168f9190e7006a6318026a493b88";
        let upper = hex.to_uppercase();
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE a (n INTEGER, k BLOB)")
            .unwrap();
        let keys = [Some(hex), Some(hex), Some(upper.as_str()), None];
        for (n, key) in keys.iter().enumerate() {
            let stored: Box<dyn ToSql> = match (n, key) {
                (1, Some(k)) => Box::new(k.to_string()),
                (_, k) => Box::new(k.map(Digest)),
            };
            conn.execute(
                "INSERT INTO a VALUES (?1, ?2)",
                rusqlite::params![n as i64, stored],
            )
            .unwrap();
        }
        // (typeof, read as hex, `key_bytes!`, `key_text!`)
        type Read = (String, Option<String>, Option<Vec<u8>>, Option<String>);
        let read: Vec<Read> = conn
            .prepare(concat!(
                "SELECT typeof(k), k, ",
                key_bytes!("k"),
                ", ",
                key_text!("k"),
                " FROM a ORDER BY n"
            ))
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, key_hex(r.get_ref(1)?)?, r.get(2)?, r.get(3)?))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let bytes = lowercase_hex(hex).unwrap().to_vec();
        assert_eq!(
            read,
            [
                (
                    "blob".into(),
                    Some(hex.into()),
                    Some(bytes.clone()),
                    Some(hex.into())
                ),
                (
                    "text".into(),
                    Some(hex.into()),
                    Some(bytes.clone()),
                    Some(hex.into())
                ),
                ("text".into(), Some(upper.clone()), Some(bytes), Some(upper)),
                ("null".into(), None, None, None),
            ]
        );
        assert!(key_hex(ValueRef::Blob(&[0; 16])).is_err());
    }
}
