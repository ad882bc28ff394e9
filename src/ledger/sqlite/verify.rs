//! [`Inspect`] for SQLite: `claimgate verify`'s checks (one bounded pass, and the same checks
//! as SQL to name a violation), `/healthz`'s ping, and the file path as the ledger's
//! description.
//!
//! Invariant: this module only reads the ledger (what it writes is unnamed temporary files).
//! Every check of `verify` but SQLite's `integrity_check` of the file's structure runs inside
//! one read transaction, the audit chain included, so a worker committing meanwhile cannot
//! make a consistent ledger look inconsistent.

use super::derived::{key_bytes, key_text};
use super::ledger::SqliteLedger;
use super::{audit_store, counts, format};
use crate::domain::audit::{Kind, Verifier};
use crate::error::{Error, Result};
use crate::ledger::{chain, checks, sweep, Inspect, Since, Summary};
use rusqlite::types::ValueRef::{Blob, Integer, Null, Text};
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

impl Inspect for SqliteLedger {
    fn verify(&self) -> Result<Summary> {
        ledger(&mut *self.conn()?, &self.path)
    }

    fn ping(&self) -> Result<()> {
        // Reads the schema, so the answer needs the file's read lock: `SELECT 1` never touches
        // the database and would say "up" while another process holds the ledger exclusively.
        self.conn()?
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// Each check: a query returning one text column describing the first row that breaks it, or
/// nothing. Ordered so the most basic faults are named first.
const CHECKS: [(&str, &str); 15] = [
    (
        // The schema makes a claim unique on (time, award, key), which is uniqueness of the key
        // because the key is derived from that time and award (`schema.sql`); checked here
        // directly, on the key alone.
        "key claimed twice",
        "SELECT 'key ' || lower(hex(idempotency_key)) || ' has ' || COUNT(*) || ' claims'
         FROM processed_messages GROUP BY idempotency_key HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        "disbursement without a claim",
        "SELECT 'disbursement ' || d.id || ' refers to claim ' || d.claim_id || ', which does not exist'
         FROM disbursements d LEFT JOIN processed_messages p ON p.claim_id = d.claim_id
         WHERE p.claim_id IS NULL ORDER BY d.id LIMIT 1",
    ),
    (
        "claim without a disbursement",
        "SELECT 'claim ' || p.claim_id || ' (key ' || lower(hex(p.idempotency_key)) || ') has no disbursement'
         FROM processed_messages p LEFT JOIN disbursements d ON d.claim_id = p.claim_id
         WHERE d.id IS NULL ORDER BY p.claim_id LIMIT 1",
    ),
    (
        "disbursement differs from its claim",
        "SELECT 'disbursement ' || d.id || ' (award ' || d.award_id || ', ' || d.amount_cents
                || ' cents) differs from its claim ' || p.claim_id || ' (award ' || p.award_id || ', '
                || p.amount_cents || ' cents)'
         FROM disbursements d JOIN processed_messages p ON p.claim_id = d.claim_id
         WHERE d.idempotency_key IS NOT p.idempotency_key OR d.award_id <> p.award_id
            OR d.amount_cents <> p.amount_cents
         ORDER BY d.id LIMIT 1",
    ),
    (
        // The schema makes the claim the disbursement's key ([`constraints`] checks it is
        // still there); this names the claim if a second disbursement got in anyway.
        "claim with more than one disbursement",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' disbursements'
         FROM disbursements GROUP BY claim_id HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // A second outbox row for a claim is a second event, which the relay would publish:
        // a second payment downstream.
        "claim with more than one outbox row",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' outbox rows'
         FROM outbox GROUP BY claim_id HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // One writer inserts a batch's claims and then its outbox rows in the same order, and
        // outbox ids only grow (AUTOINCREMENT), so outbox ids rise with claim ids. A row
        // renumbered past the relay's mark would be published again; one renumbered below it
        // would never be published at all.
        "outbox rows out of claim order",
        "SELECT 'outbox row ' || id || ' (claim ' || claim_id || ') is numbered at or below outbox row '
                || prev_id || ' of the earlier claim ' || prev_claim
         FROM (SELECT id, claim_id, LAG(id) OVER w AS prev_id, LAG(claim_id) OVER w AS prev_claim
               FROM outbox WINDOW w AS (ORDER BY claim_id))
         WHERE id <= prev_id ORDER BY claim_id LIMIT 1",
    ),
    (
        "disbursement without an outbox row",
        "SELECT 'disbursement ' || d.id || ' (claim ' || d.claim_id || ', key '
                || lower(hex(d.idempotency_key)) || ') has no outbox row'
         FROM disbursements d LEFT JOIN outbox o ON o.claim_id = d.claim_id
         WHERE o.id IS NULL ORDER BY d.id LIMIT 1",
    ),
    (
        "outbox row without a disbursement",
        "SELECT 'outbox row ' || o.id || ' refers to claim ' || o.claim_id || ', which has no disbursement'
         FROM outbox o LEFT JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE d.id IS NULL ORDER BY o.id LIMIT 1",
    ),
    (
        "outbox event differs from its disbursement",
        "SELECT 'outbox row ' || o.id || ' announces '
                || ifnull(CASE WHEN json_valid(o.payload) THEN json_extract(o.payload, '$.amount_cents') END,
                          'no amount')
                || ' cents but disbursement ' || d.id || ' records ' || d.amount_cents
         FROM outbox o JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE o.payload IS NOT NULL
           -- CASE, not OR: SQLite may evaluate json_extract first, which raises an error on
           -- text that is not JSON instead of naming the row.
           AND CASE WHEN json_valid(o.payload) = 0 THEN 1
                    ELSE json_extract(o.payload, '$.amount_cents') IS NOT d.amount_cents
                      OR json_extract(o.payload, '$.award_id') IS NOT d.award_id
                      OR json_extract(o.payload, '$.idempotency_key')
                         IS NOT lower(hex(d.idempotency_key))
               END
         ORDER BY o.id LIMIT 1",
    ),
    (
        "processed record without a matching disbursement",
        concat!(
            "SELECT 'audit record ' || a.seq || ' (processed, key ' || ",
            key_text!("a.idempotency_key"),
            " || ', ' || ifnull(a.amount_cents, 'no') || ' cents) ' ||
                CASE WHEN d.id IS NULL THEN 'has no disbursement'
                     ELSE 'but disbursement ' || d.id || ' records award ' || d.award_id || ', '
                          || d.amount_cents || ' cents' END
             FROM audit_log a
             LEFT JOIN processed_messages p ON p.idempotency_key = ",
            key_bytes!("a.idempotency_key"),
            " LEFT JOIN disbursements d ON d.claim_id = p.claim_id
             WHERE a.kind = 'processed'
               AND (d.id IS NULL OR d.amount_cents IS NOT a.amount_cents
                    OR d.award_id IS NOT a.award_id)
             ORDER BY a.seq LIMIT 1"
        ),
    ),
    (
        "key processed twice in the audit log",
        // By the bytes a key names: one written before format 6 (hex) and one after (bytes)
        // are the same key.
        concat!(
            "SELECT 'key ' || lower(hex(k)) || ' has ' || COUNT(*) || ' processed records'
             FROM (SELECT ",
            key_bytes!("idempotency_key"),
            " AS k FROM audit_log WHERE kind = 'processed')
             GROUP BY k HAVING COUNT(*) > 1 LIMIT 1"
        ),
    ),
    (
        // A purged key claimed again would be a second payment of one submission.
        "key claimed after its claim was purged",
        "SELECT 'key ' || lower(hex(p.idempotency_key)) || ' is claimed (claim ' || p.claim_id
                || ') and has a tombstone'
         FROM claim_tombstones t JOIN processed_messages p ON p.idempotency_key = t.idempotency_key
         ORDER BY p.claim_id LIMIT 1",
    ),
    (
        // A duplicate record is evidence that something was paid before: it must name a claim
        // still here, or one a purge removed and tombstoned. Deleting a claim (and re-sealing
        // the chain) leaves its duplicate records pointing at nothing.
        "duplicate record without a claim or tombstone",
        concat!(
            "SELECT 'audit record ' || a.seq || ' (duplicate, key ' || ifnull(",
            key_text!("a.idempotency_key"),
            ", 'none') || ') names a key with no claim and no tombstone'
             FROM audit_log a
             LEFT JOIN processed_messages p ON p.idempotency_key = ",
            key_bytes!("a.idempotency_key"),
            " LEFT JOIN claim_tombstones t ON t.idempotency_key = ",
            key_bytes!("a.idempotency_key"),
            " WHERE a.kind = 'duplicate' AND p.claim_id IS NULL AND t.idempotency_key IS NULL
             ORDER BY a.seq LIMIT 1"
        ),
    ),
    (
        // One `dead_letters` row per `dead_letter` record, counted per stream entry id (the
        // records carry no stream name; the entry id is what both sides share).
        "dead letters and dead_letter records disagree",
        "WITH r AS (SELECT ifnull(stream_entry_id, '') AS e, COUNT(*) AS n FROM audit_log
                    WHERE kind = 'dead_letter' GROUP BY 1),
              d AS (SELECT stream_entry_id AS e, COUNT(*) AS n FROM dead_letters GROUP BY 1)
         SELECT 'stream entry ' || e || ' has ' || rows || ' dead_letters rows but ' || records
                || ' dead_letter records'
         FROM (SELECT d.e AS e, d.n AS rows, ifnull(r.n, 0) AS records
               FROM d LEFT JOIN r ON r.e = d.e WHERE r.n IS NOT d.n
               UNION ALL
               SELECT r.e, 0, r.n FROM r LEFT JOIN d ON d.e = r.e WHERE d.e IS NULL)
         ORDER BY e LIMIT 1",
    ),
];

/// Checks everything; returns the summary, or `Error::Invariant` naming the first violation.
///
/// SQLite's `integrity_check` runs on a connection of its own, on the other core, while this
/// one walks the tables: it checks the file's structure, which every snapshot of it shows, so
/// it need not share the snapshot the checks below read. Its finding is still reported first.
///
/// Temporary B-trees (a sort, an index SQLite builds for a join) go to unnamed temporary files
/// while `verify` runs, not to memory as the pool's connections keep them: when the checks
/// were all SQL, their sorts and automatic indexes of every key took `verify` to 144 MiB at a
/// million claims and 1.1 GiB at ten million (BENCHMARKS.md). The pass needs none; the SQL
/// checks a faulty ledger is given to still do.
fn ledger(conn: &mut Connection, path: &Path) -> Result<Summary> {
    let pragma = |name: &str| -> Result<i64> {
        Ok(conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))?)
    };
    let (temp_store, cache_size) = (pragma("temp_store")?, pragma("cache_size")?);
    conn.execute_batch(&format!(
        "PRAGMA temp_store = FILE; PRAGMA cache_size = -{VERIFY_CACHE_KIB};"
    ))?;
    let checked = std::thread::scope(|s| {
        let integrity = s.spawn(|| integrity_of(path));
        let checked = checked(conn);
        integrity
            .join()
            .map_err(|_| Error::Other("the integrity check's thread panicked".into()))??;
        checked
    });
    conn.execute_batch(&format!(
        "PRAGMA temp_store = {temp_store}; PRAGMA cache_size = {cache_size};"
    ))?;
    checked
}

/// The page cache `verify`'s connection keeps while it runs. Every walk reads in index order,
/// so a page is read once and a larger cache would only hold pages already done with.
const VERIFY_CACHE_KIB: u32 = 8 * 1024;

/// Every check but the file's integrity, in one read transaction.
///
/// One pass ([`sweep`]) reads each table once, in index order, in memory that does not grow
/// with the ledger, and decides whether the ledger is clean. Only if it is not do the checks
/// run one by one as SQL ([`exact`]), to name the first violation in their order, the most
/// basic first, as they always have; whatever the pass found is reported if they find nothing.
/// The pass finds every fault they do: each of its conditions is shown there to imply theirs.
fn checked(conn: &mut Connection) -> Result<Summary> {
    let tx = conn.transaction()?;
    constraints(&tx)?;
    match sweep(&tx) {
        Ok(summary) => Ok(summary),
        Err(found) => {
            exact(&tx)?;
            Err(found)
        }
    }
}

/// Every outbox row at or below an events stream's `published_upto:` mark reads as published:
/// the mark moves with the rows' own marks, in one transaction (`outbox::mark`,
/// `note_published_upto`). A row set back to unpublished by hand stands in the backlog, and
/// its alert, though the stream holds it, until a relay's next round marks it again from the
/// stream's position (publishing nothing twice). Found through the partial index of
/// unpublished rows (normally all above every mark). A mark that is not a number casts to 0
/// and names nothing.
const PUBLISHED_BELOW_MARK: (&str, &str) = (
    "outbox publication",
    "SELECT 'outbox row ' || o.id || ' reads as unpublished, but events stream '
            || substr(m.name, 16) || ' holds every row up to id ' || m.value
            || ' (its published_upto mark)'
     FROM ledger_meta m JOIN outbox o
       ON o.published_at IS NULL AND o.id <= CAST(m.value AS INTEGER)
     WHERE m.name LIKE 'published\\_upto:%' ESCAPE '\\'
     ORDER BY o.id LIMIT 1",
);

/// Runs one of the checks' queries: the first row that breaks it, named, or nothing.
fn check(tx: &Connection, (what, sql): (&str, &str)) -> Result<()> {
    match tx
        .query_row(sql, [], |r| r.get::<_, String>(0))
        .optional()?
    {
        Some(found) => Err(Error::Invariant(format!("{what}: {found}"))),
        None => Ok(()),
    }
}

/// The checks one by one as SQL ([`CHECKS`], the instants, the count of `processed` records),
/// naming the first violation; slow on a large ledger (several join on keys no index holds),
/// so run only for a ledger [`sweep`] did not pass.
fn exact(tx: &Connection) -> Result<()> {
    for c in CHECKS {
        check(tx, c)?;
    }
    check(tx, PUBLISHED_BELOW_MARK)?;
    instants(tx)?;
    let count =
        |sql: &str| -> Result<u64> { Ok(tx.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64) };
    let disbursements = count("SELECT COUNT(*) FROM disbursements")?;
    // Every processed record matches a disbursement, and no two name one key (both checked
    // above, keys compared as bytes).
    let processed = count("SELECT COUNT(*) FROM audit_log WHERE kind = 'processed'")?;
    checks::processed_records(disbursements, processed, || {
        Ok(tx
            .query_row(
                concat!(
                    "SELECT 'disbursement ' || d.id || ' (key ' || lower(hex(d.idempotency_key))
                        || ') has no processed audit record'
                 FROM disbursements d LEFT JOIN audit_log a
                   ON a.kind = 'processed' AND ",
                    key_bytes!("a.idempotency_key"),
                    " = d.idempotency_key
                 WHERE a.seq IS NULL ORDER BY d.id LIMIT 1"
                ),
                [],
                |r| r.get(0),
            )
            .optional()?)
    })
}

/// The three tables [`sweep`] walks in step, each in the order of a key it has: claims and
/// disbursements by claim (their primary key; on a ledger an earlier release made,
/// disbursements' unique index on it), outbox rows by id (its primary key), which must then
/// name the claims in the same order.
const CLAIMS: &str =
    "SELECT claim_id, idempotency_key, award_id, amount_cents, submission_timestamp,
                             submission_instant
                      FROM processed_messages ORDER BY claim_id";
const DISBURSEMENTS: &str = "SELECT claim_id, idempotency_key, award_id, amount_cents
                             FROM disbursements ORDER BY claim_id";
const OUTBOX: &str = "SELECT id, claim_id, payload FROM outbox ORDER BY id";

/// The one pass: every check of [`exact`] and the chain, in memory that does not grow with the
/// ledger. Returns the summary, or an error describing the first fault it met (which
/// [`checked`] then has [`exact`] name in the checks' words).
///
/// Why its conditions imply [`CHECKS`]':
/// - Claims, disbursements and outbox rows walked in step ([`CLAIMS`]): the nth claim, the
///   nth disbursement and the nth outbox row must all be of the same claim, and none may be
///   left over. So each claim has exactly one disbursement and one outbox row, none exists
///   without its claim, and outbox ids rise with claims. The disbursement must hold the
///   claim's key, award and amount (the same types, the same bytes: SQLite's `<>` then finds
///   no difference), and the event must announce them ([`event_announces`]).
/// - Every claim's (key, award, amount), as its disbursement holds them, and every `processed`
///   record's, digested as multisets ([`sweep::SetDigest`]): equal means each record matches a
///   distinct disbursement (and, with the claims' keys distinct, no key is processed twice,
///   in any case of its hex) and the counts are equal.
/// - The claims' keys, the tombstones' and the `duplicate` records' keys, each sorted in
///   bounded memory and merged ([`sweep::key_faults`]): no key claimed twice, none claimed and
///   tombstoned, every duplicate naming a claim or a tombstone.
/// - Dead letters against their records: [`CHECKS`]' own query (it reads the partial index of
///   `dead_letter` records and the dead letters: as many rows as there are dead letters).
fn sweep(tx: &Connection) -> Result<Summary> {
    let fault = |s: String| Error::Invariant(s);
    let ids = |sql: &str| -> Result<(i64, i64)> {
        Ok(tx.query_row(sql, [], |r| {
            Ok((
                r.get::<_, Option<i64>>(0)?.unwrap_or(0),
                r.get::<_, Option<i64>>(1)?.unwrap_or(0),
            ))
        })?)
    };
    let (first_claim, last_claim) = ids("SELECT (SELECT MIN(claim_id) FROM processed_messages),
                (SELECT MAX(claim_id) FROM processed_messages)")?;
    let mut progress = sweep::Progress::new();
    let mut claim_digest = sweep::SetDigest::new()?;
    let mut processed_digest = claim_digest.clone();
    let mut claim_keys = sweep::KeySort::default();
    let mut claims = 0u64;
    let mut cents = 0i128;
    {
        let (mut c, mut d, mut o) = (
            tx.prepare(CLAIMS)?,
            tx.prepare(DISBURSEMENTS)?,
            tx.prepare(OUTBOX)?,
        );
        let (mut c, mut d, mut o) = (c.query([])?, d.query([])?, o.query([])?);
        while let Some(p) = c.next()? {
            let claim: i64 = p.get(0)?;
            progress.row(|| {
                format!(
                    "verify: claims {:.0}% (claim {claim} of {last_claim})",
                    sweep::percent(claim, first_claim, last_claim)
                )
            });
            let Some(d) = d
                .next()?
                .filter(|d| d.get_ref(0).ok() == Some(Integer(claim)))
            else {
                return Err(fault(format!(
                    "claim {claim}'s disbursement is not the next one in claim order"
                )));
            };
            let key = p.get_ref(1)?;
            let (award, amount) = (p.get_ref(2)?, p.get_ref(3)?);
            let (Blob(key), Text(award_bytes), Integer(amount)) = (key, award, amount) else {
                return Err(fault(format!(
                    "claim {claim} holds a value of another type"
                )));
            };
            // The key is stored in every format (CONTRACT.md names it): NULL differs too.
            if d.get_ref(1)? != Blob(key)
                || d.get_ref(2)? != Text(award_bytes)
                || d.get_ref(3)? != Integer(amount)
            {
                return Err(fault(format!(
                    "claim {claim}'s disbursement differs from it"
                )));
            }
            let key: sweep::Key = key
                .try_into()
                .map_err(|_| fault(format!("claim {claim}'s key is not 32 bytes")))?;
            let award = std::str::from_utf8(award_bytes)
                .map_err(|_| fault(format!("claim {claim}'s award is not UTF-8")))?;
            let Some(o) = o
                .next()?
                .filter(|o| o.get_ref(1).ok() == Some(Integer(claim)))
            else {
                return Err(fault(format!(
                    "claim {claim}'s outbox row is not the next one in id order"
                )));
            };
            if !event_announces(tx, o.get_ref(2)?, &key, award, amount)? {
                return Err(fault(format!(
                    "outbox row {}'s event differs from claim {claim}'s disbursement",
                    o.get::<_, i64>(0)?
                )));
            }
            let (timestamp, instant): (String, Option<String>) = (p.get(4)?, p.get(5)?);
            checks::instant(claim, &timestamp, instant.as_deref())?;
            claim_digest.add(&key, award, amount);
            claim_keys.push(key)?;
            claims += 1;
            cents += i128::from(amount);
        }
        if d.next()?.is_some() || o.next()?.is_some() {
            return Err(fault(format!(
                "a disbursement or outbox row is left over after the {claims} claims"
            )));
        }
    }
    let (disbursements, outbox_rows) = (claims, claims);

    let (first_seq, last_seq) =
        ids("SELECT (SELECT MIN(seq) FROM audit_log), (SELECT MAX(seq) FROM audit_log)")?;
    let mut links = Verifier::default();
    let mut holds = checks::Holds::default();
    let mut duplicate_keys = sweep::KeySort::default();
    let (mut duplicates, mut conflicts, mut vanished) = (0u64, 0u64, 0u64);
    audit_store::for_each(tx, &Since::All, |r| {
        progress.row(|| {
            format!(
                "verify: audit chain {:.0}% (seq {} of {last_seq})",
                sweep::percent(r.seq, first_seq, last_seq),
                r.seq
            )
        });
        holds.see(&r);
        chain::check(&mut links, &r)?;
        match r.kind {
            Kind::Processed => {
                let (Some(key), Some(award), Some(amount)) = (
                    r.idempotency_key
                        .as_deref()
                        .and_then(sweep::unhex_either_case),
                    &r.award_id,
                    r.amount_cents,
                ) else {
                    return Err(fault(format!(
                        "audit record {} (processed) lacks a key, award or amount",
                        r.seq
                    )));
                };
                processed_digest.add(&key, award, amount);
            }
            Kind::Duplicate => {
                let key = r
                    .idempotency_key
                    .as_deref()
                    .and_then(sweep::unhex_either_case)
                    .ok_or_else(|| {
                        fault(format!("audit record {} (duplicate) has no key", r.seq))
                    })?;
                duplicate_keys.push(key)?;
                duplicates += 1;
            }
            Kind::Conflict => conflicts += 1,
            Kind::Vanished => vanished += 1,
            _ => {}
        }
        Ok(())
    })?;
    drop(progress);
    if !claim_digest.same_as(&processed_digest) {
        return Err(fault(format!(
            "the {} processed records and the {claims} disbursements differ",
            processed_digest.count
        )));
    }
    let mut stmt =
        tx.prepare("SELECT idempotency_key FROM claim_tombstones ORDER BY idempotency_key")?;
    let mut rows = stmt.query([])?;
    let mut tombstone = || -> Result<Option<sweep::Key>> {
        let Some(row) = rows.next()? else {
            return Ok(None);
        };
        Ok(Some(sweep::tombstone_key(&row.get::<_, Vec<u8>>(0)?)?))
    };
    let tombstones = sweep::check_keys(claim_keys, &mut tombstone, duplicate_keys)?;
    check(tx, CHECKS[CHECKS.len() - 1])?;
    check(tx, PUBLISHED_BELOW_MARK)?;
    let (audit_records, head_hash) = chain::end(&links)?;
    holds.compare(&super::purge::holds(tx)?)?;
    decisions(tx)?;
    let rows = crate::ledger::Counts {
        claims,
        disbursements,
        disbursed_cents_total: cents,
        dead_letters: tx.query_row("SELECT COUNT(*) FROM dead_letters", [], |r| {
            r.get::<_, i64>(0)
        })? as u64,
        duplicates,
        conflicts,
        vanished,
        audit_records,
        tombstones,
    };
    kept_counts(tx, &rows)?;
    Ok(Summary {
        claims,
        disbursements,
        outbox_rows,
        audit_records,
        tombstones,
        head_hash,
        unlinked_batches: 0,
    })
}

/// The counts the ledger keeps (`counts.rs`) are the ones [`sweep`] counted in the rows.
fn kept_counts(tx: &Connection, rows: &crate::ledger::Counts) -> Result<()> {
    let Some(kept) = counts::read(tx)? else {
        return Err(Error::Invariant(
            "ledger counts: the ledger_counts row is missing (every open writes it)".into(),
        ));
    };
    match counts::differs(&kept, rows) {
        Some(what) => Err(Error::Invariant(format!("ledger counts: {what}"))),
        None => Ok(()),
    }
}

/// Whether an outbox row's payload is an event announcing exactly this award, amount and key,
/// as [`CHECKS`]' SQL decides it: a JSON object whose `award_id` is that string, whose
/// `amount_cents` is that integer and whose `idempotency_key` is the key's lowercase hex.
/// Decided here when the payload is plainly such an object (as every event claimgate writes
/// is); any other payload (an escape, a NUL, a field named twice, a number written as a
/// fraction, not JSON at all) is handed to SQLite with the same expression as [`CHECKS`], so
/// the two can never read one text differently.
fn event_announces(
    tx: &Connection,
    payload: rusqlite::types::ValueRef<'_>,
    key: &sweep::Key,
    award: &str,
    amount: i64,
) -> Result<bool> {
    if payload == Null {
        // Not stored: the event is derived from this very claim (`derived.rs`).
        return Ok(true);
    }
    if let Some(plain) = match payload {
        Text(text) => sweep::plain_event_announces(text, key, award, amount),
        _ => None,
    } {
        return Ok(plain);
    }
    let differs: Option<bool> = tx
        .prepare_cached(
            "SELECT CASE WHEN json_valid(?1) = 0 THEN 1
                         ELSE json_extract(?1, '$.amount_cents') IS NOT ?2
                           OR json_extract(?1, '$.award_id') IS NOT ?3
                           OR json_extract(?1, '$.idempotency_key') IS NOT lower(hex(?4))
                    END",
        )?
        .query_row(
            rusqlite::params![
                rusqlite::types::ToSqlOutput::Borrowed(payload),
                amount,
                award,
                &key[..]
            ],
            |r| r.get(0),
        )?;
    Ok(differs == Some(false))
}

/// The uniqueness each promise rests on, as sets of columns a table must have a unique,
/// non-partial index (or an integer primary key) on; any one set of a row will do, for
/// ledgers made by earlier releases (`schema.sql`). Someone who can write the file can rebuild
/// a table without its constraint ([`checks::unique`]).
const UNIQUE: [(&str, &[&[&str]]); 8] = [
    ("processed_messages", checks::CLAIM_UNIQUE),
    ("processed_messages", &[&["claim_id"]]),
    ("disbursements", &[&["claim_id"]]),
    ("outbox", &[&["claim_id"]]),
    ("outbox", &[&["id"]]),
    ("claim_tombstones", &[&["idempotency_key"]]),
    ("dead_letters", &[&["stream", "stream_entry_id"]]),
    ("audit_log", &[&["seq"]]),
];

/// The schema still holds the constraints the checks below take for granted, and nothing
/// runs on its own inside it: `schema.sql` creates no trigger and no view, so any there were
/// put in by hand, and a trigger can copy every new outbox row (a second event per payment)
/// without a single row looking wrong when `verify` runs.
fn constraints(conn: &Connection) -> Result<()> {
    if let Some((kind, name)) = conn
        .query_row(
            "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view')
             ORDER BY name LIMIT 1",
            [],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )
        .optional()?
    {
        return Err(Error::Invariant(format!(
            "schema altered: {kind} {name} is not claimgate's (its schema has none)"
        )));
    }
    checks::unique(&UNIQUE, |table| unique_column_sets(conn, table))?;
    format_matches_shape(conn)
}

/// The stored format (`format.rs`) is the one every open of this build records, and the claim
/// index is one it reads: today's, leading with the instant, or an earlier release's beside
/// the `claim_instant` index batches probe for conflicts.
fn format_matches_shape(conn: &Connection) -> Result<()> {
    let broken = |why: String| Err(Error::Invariant(format!("ledger format: {why}")));
    let Some(text) = format::stored_text(conn)? else {
        return broken("no format_version recorded (every open records it)".into());
    };
    if format::parse(&text) != Some(format::FORMAT_VERSION) {
        return broken(format!(
            "format_version is {text:?}, not {} (every open of this build records it)",
            format::FORMAT_VERSION
        ));
    }
    let by_spelling = super::upgrade::claims_by_spelling(conn)?;
    let claim_instant: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'claim_instant')",
        [],
        |r| r.get(0),
    )?;
    if by_spelling && !claim_instant {
        return broken(
            "the claim index is an earlier release's (it leads with the timestamp as spelled), \
             and claim_instant, which batches probe beside it, is missing"
                .into(),
        );
    }
    Ok(())
}

/// The column sets `table` is unique on: its integer primary key (the rowid itself), and each
/// unique index that is not partial (a partial one leaves rows outside it unchecked).
fn unique_column_sets(conn: &Connection, table: &str) -> Result<Vec<Vec<String>>> {
    let mut sets = Vec::new();
    let pk: Vec<(String, String)> = conn
        .prepare("SELECT name, upper(type) FROM pragma_table_info(?1) WHERE pk > 0")?
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    if let [(name, ty)] = pk.as_slice() {
        if ty == "INTEGER" {
            sets.push(vec![name.clone()]);
        }
    }
    let indexes: Vec<String> = conn
        .prepare("SELECT name FROM pragma_index_list(?1) WHERE \"unique\" = 1 AND partial = 0")?
        .query_map([table], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for index in indexes {
        let columns: Vec<String> = conn
            .prepare("SELECT ifnull(name, '') FROM pragma_index_info(?1) ORDER BY seqno")?
            .query_map([&index], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        sets.push(columns);
    }
    Ok(sets)
}

/// Every claim's instant agrees with its timestamp ([`checks::instant`] says why).
fn instants(conn: &Connection) -> Result<()> {
    let mut stmt = conn.prepare(
        "SELECT claim_id, submission_timestamp, submission_instant FROM processed_messages
         ORDER BY claim_id",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let (claim, timestamp, instant): (i64, String, Option<String>) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        checks::instant(claim, &timestamp, instant.as_deref())?;
    }
    Ok(())
}

/// SQLite's own consistency check of the file, on a connection of its own.
fn integrity_of(path: &Path) -> Result<()> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let mut stmt = conn.prepare("PRAGMA integrity_check")?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    match problems.first().map(String::as_str) {
        Some("ok") => Ok(()),
        _ => Err(Error::Invariant(format!(
            "SQLite integrity_check: {}",
            problems.join("; ")
        ))),
    }
}

/// Reviewers' decisions on held conflicts agree with their records ([`checks::decisions`]).
fn decisions(conn: &Connection) -> Result<()> {
    let rows = read_all(
        conn,
        "SELECT reason_code, stream_entry_id, decision, decided_by, decided_reason, decided_at
         FROM dead_letters WHERE reason_code = 'conflict_hold' OR decision IS NOT NULL
            OR decided_by IS NOT NULL OR decided_reason IS NOT NULL OR decided_at IS NOT NULL",
        |r| checks::HeldRow::read(r),
    )?;
    let records = read_all(
        conn,
        "SELECT kind, stream_entry_id, detail, recorded_at FROM audit_log
         WHERE kind IN ('conflict_approved', 'conflict_rejected') ORDER BY seq",
        |r| checks::DecisionRecord::read(r),
    )?;
    checks::decisions(&rows, &records)
}

/// Every row `sql` selects, each as `read` makes it.
fn read_all<T>(
    conn: &Connection,
    sql: &str,
    read: impl Fn(&rusqlite::Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = conn.prepare(sql)?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(read(row)?);
    }
    Ok(out)
}
