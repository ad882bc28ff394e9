//! Steps 4 and 5 of a PostgreSQL batch (`batch.rs`): its dead letters and holds, its new
//! claims with their disbursements, and its sealed records and outbox rows, all inside the
//! batch's transaction.

use super::connect::Conn;
use super::facts::key_of;
use crate::domain::audit::{Kind, Record};
use crate::domain::key::IdempotencyKey;
use crate::domain::submission::Submission;
use crate::error::{Error, Result};
use crate::ledger::decide::{self, DeadRow, Delivered, Verdict};
use crate::ledger::Item;
use crate::support::failpoint;
use std::collections::{HashMap, HashSet};

const INSERT_DEAD: &str = "INSERT INTO dead_letters (stream, stream_entry_id, reason_code, reason,
         award_id, delivery_count, recorded_at)
     SELECT $1, e, c, r, a, n, $2
     FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], $7::int8[]) AS t(e, c, r, a, n)
     ON CONFLICT DO NOTHING RETURNING stream_entry_id";

/// The new claims and their disbursements, in one statement: each disbursement is made from
/// the claim row the insert returns, so the batch's keys, awards and amounts travel once.
const INSERT_CLAIMS: &str = "WITH c AS (
         INSERT INTO processed_messages (idempotency_key, award_id, submission_timestamp,
             amount_cents, claimed_at, stream_entry_id, consumer, submission_instant)
         SELECT k, a, ts, amt, $1, e, $2, i
         FROM UNNEST($3::bytea[], $4::text[], $5::text[], $6::int8[], $7::text[], $8::text[])
              AS t(k, a, ts, amt, e, i)
         ON CONFLICT DO NOTHING RETURNING idempotency_key, claim_id, award_id, amount_cents
     ), d AS (
         INSERT INTO disbursements (claim_id, idempotency_key, award_id, amount_cents,
             recorded_at)
         SELECT claim_id, idempotency_key, award_id, amount_cents, $1 FROM c
     )
     SELECT idempotency_key, claim_id FROM c";

/// The batch's row, with what it adds to the ledger's counts (`schema_postgres.sql`,
/// `chain_head`), which its link adds there; the cents as text, exact (NUMERIC).
const INSERT_BATCH: &str = "INSERT INTO audit_batches (record_count, last_hash, outbox_count,
         created_at, disbursed_cents, dead_letters, duplicates, conflicts, vanished)
     VALUES ($1, $2, $3, $4, $5::text::numeric, $6, $7, $8, $9) RETURNING batch_id";

// Step 5's rows go in by binary COPY, the cheapest way PostgreSQL takes rows.
static COPY_MEMBERS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "COPY audit_members ({}) FROM STDIN (FORMAT binary)",
        super::audit_store::MEMBER_COLUMNS
    )
});

/// A batch's outbox rows store no event: the view `outbox` and the relay spell it from the
/// row's claim (`claimgate_event`, `schema_postgres.sql`).
const COPY_OUTBOX: &str =
    "COPY outbox_rows (claim_id, created_at, batch_id, batch_index) FROM STDIN (FORMAT binary)";

/// Steps 4 and 5's statements, prepared once per connection.
pub(super) struct Statements {
    insert_dead: postgres::Statement,
    insert_claims: postgres::Statement,
    insert_batch: postgres::Statement,
    copy_members: postgres::Statement,
    copy_outbox: postgres::Statement,
}

impl Statements {
    pub(super) fn prepare(conn: &mut Conn) -> Result<Self> {
        Ok(Statements {
            insert_dead: conn.prepared(INSERT_DEAD)?,
            insert_claims: conn.prepared(INSERT_CLAIMS)?,
            insert_batch: conn.prepared(INSERT_BATCH)?,
            copy_members: conn.prepared(COPY_MEMBERS.as_str())?,
            copy_outbox: conn.prepared(COPY_OUTBOX)?,
        })
    }
}

/// Step 4a: dead letters and holds ([`decide::dead_row`]), once per stream entry. Returns the
/// indexes of the items whose row this batch inserted (the first of the batch's items for an
/// entry, and only if no earlier batch had dead-lettered it).
pub(super) fn insert_dead_letters(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    stream: &str,
    items: &[Item<'_>],
    verdicts: &[Option<Verdict>],
    now: &str,
) -> Result<HashSet<usize>> {
    let mut rows: Vec<(usize, DeadRow<'_>)> = items
        .iter()
        .zip(verdicts)
        .enumerate()
        .filter_map(|(n, (item, v))| Some((n, decide::dead_row(item, v.as_ref()?)?)))
        .collect();
    if rows.is_empty() {
        return Ok(HashSet::new());
    }
    // The first item for each entry is the one that may insert; sorted by entry id, the lock
    // order every batch shares.
    let mut seen = HashSet::new();
    rows.retain(|(_, r)| seen.insert(r.entry_id));
    rows.sort_by(|(_, a), (_, b)| a.entry_id.cmp(b.entry_id));
    let entries: Vec<&str> = rows.iter().map(|(_, r)| r.entry_id).collect();
    let codes: Vec<&str> = rows.iter().map(|(_, r)| r.reason_code).collect();
    let reasons: Vec<&str> = rows.iter().map(|(_, r)| r.reason.as_ref()).collect();
    let awards: Vec<Option<&str>> = rows.iter().map(|(_, r)| r.award_id).collect();
    let counts: Vec<i64> = rows.iter().map(|(_, r)| r.delivery_count as i64).collect();
    let inserted: HashSet<String> = tx
        .query(
            &st.insert_dead,
            &[&stream, &now, &entries, &codes, &reasons, &awards, &counts],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(rows
        .iter()
        .filter(|(_, r)| inserted.contains(r.entry_id))
        .map(|(n, _)| *n)
        .collect())
}

/// The new claims the verdicts make, in item order: (submission, entry id) each.
pub(super) fn claimed<'a>(
    items: &[Item<'a>],
    verdicts: &[Option<Verdict>],
) -> Vec<(&'a Submission, &'a str)> {
    items
        .iter()
        .zip(verdicts)
        .filter(|(_, v)| matches!(v, Some(Verdict::Claim { .. })))
        .filter_map(|(item, _)| Delivered::of(item).map(|d| (d.submission, d.entry_id)))
        .collect()
}

/// Step 4b: the new claims and their disbursements, sorted as the claim index orders them;
/// returns key → claim_id.
pub(super) fn insert_claims(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    consumer: &str,
    mut new: Vec<(&Submission, &str)>,
    now: &str,
) -> Result<HashMap<IdempotencyKey, i64>> {
    if new.is_empty() {
        return Ok(HashMap::new());
    }
    new.sort_by(|(a, _), (b, _)| {
        (&a.submission_instant, &a.award_id, a.key.as_bytes()).cmp(&(
            &b.submission_instant,
            &b.award_id,
            b.key.as_bytes(),
        ))
    });
    let keys: Vec<&[u8]> = new
        .iter()
        .map(|(s, _)| s.key.as_bytes().as_slice())
        .collect();
    let awards: Vec<&str> = new.iter().map(|(s, _)| s.award_id.as_str()).collect();
    let ts: Vec<&str> = new
        .iter()
        .map(|(s, _)| s.submission_timestamp.as_str())
        .collect();
    let amounts: Vec<i64> = new.iter().map(|(s, _)| s.amount_cents).collect();
    let entries: Vec<&str> = new.iter().map(|(_, e)| *e).collect();
    let instants: Vec<&str> = new
        .iter()
        .map(|(s, _)| s.submission_instant.as_str())
        .collect();
    let rows = tx.query(
        &st.insert_claims,
        &[
            &now, &consumer, &keys, &awards, &ts, &amounts, &entries, &instants,
        ],
    )?;
    let mut ids = HashMap::with_capacity(rows.len());
    for row in &rows {
        ids.insert(key_of(row.get(0))?, row.get::<_, i64>(1));
        failpoint::hit("after_claim");
    }
    // The group locks keep every other writer away from these keys until we commit, and the
    // facts said none was claimed: a refusal here means the store and the decisions disagree.
    if ids.len() != new.len() {
        return Err(Error::Invariant(format!(
            "{} of {} new claims were refused by the store although no claim of their keys was \
             found under the group locks",
            new.len() - ids.len(),
            new.len()
        )));
    }
    Ok(ids)
}

/// Step 5: seals `members` as one batch and writes them, with the outbox rows of `paid` and
/// the batch's row, inside `tx`; returns the batch's id. `None`, writing nothing, when there
/// are no members. Holds use it, for their one record.
pub(super) fn write_members(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    members: &mut [Record],
    paid: &[(i64, &Submission)],
    now: &str,
) -> Result<Option<i64>> {
    if members.is_empty() {
        return Ok(None);
    }
    let last_hash = crate::domain::audit::seal_batch(members);
    write_sealed(tx, st, members, &last_hash, paid, now).map(Some)
}

/// Writes sealed `members` (the last one's hash `last_hash`), the outbox rows of `paid` and
/// the batch's row inside `tx`; returns the batch's id.
pub(super) fn write_sealed(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    members: &[Record],
    last_hash: &str,
    paid: &[(i64, &Submission)],
    now: &str,
) -> Result<i64> {
    assert!(
        members
            .iter()
            .zip(1..)
            .all(|(r, i)| r.batch_index == Some(i)),
        "a batch's members are written sealed, in index order from 1"
    );
    let count =
        |n: usize| i32::try_from(n).map_err(|_| Error::Invariant(format!("a batch of {n} rows")));
    let of_kind = |k: Kind| count(members.iter().filter(|r| r.kind == k).count());
    // Every paid submission is one claim, one disbursement and one outbox row: the claims and
    // disbursements the batch adds are its outbox count.
    let cents: i128 = paid.iter().map(|(_, s)| i128::from(s.amount_cents)).sum();
    let batch_id: i64 = tx
        .query_one(
            &st.insert_batch,
            &[
                &count(members.len())?,
                &last_hash,
                &count(paid.len())?,
                &now,
                &cents.to_string(),
                // One `dead_letter` record per dead letter the batch inserted (`decide::settle`).
                &of_kind(Kind::DeadLetter)?,
                &of_kind(Kind::Duplicate)?,
                &of_kind(Kind::Conflict)?,
                &of_kind(Kind::Vanished)?,
            ],
        )?
        .get(0);
    failpoint::hit("pg_after_batch_row");
    use postgres::binary_copy::BinaryCopyInWriter;
    use postgres::types::Type;
    let mut audit = BinaryCopyInWriter::new(
        tx.copy_in(&st.copy_members)?,
        &super::audit_store::MEMBER_COLUMN_TYPES,
    );
    for r in members.iter() {
        let index = count(r.batch_index.expect("sealed as a member") as usize)?;
        audit.write(&super::audit_store::member_params(
            r,
            &super::audit_store::Stored::of(r)?,
            &batch_id,
            &index,
            &r.kind.as_str(),
        ))?;
    }
    audit.finish()?;
    failpoint::hit("pg_after_members");
    if !paid.is_empty() {
        let mut outbox = BinaryCopyInWriter::new(
            tx.copy_in(&st.copy_outbox)?,
            &[Type::INT8, Type::TEXT, Type::INT8, Type::INT4],
        );
        for (n, (claim_id, _)) in paid.iter().enumerate() {
            outbox.write(&[claim_id, &now, &batch_id, &count(n + 1)?])?;
        }
        outbox.finish()?;
    }
    Ok(batch_id)
}
