//! [`Inspect`] for PostgreSQL: `claimgate verify`'s checks as SQL, `/healthz`'s ping, and the
//! URL (password removed) as the ledger's description.
//!
//! The schema itself is checked first (`catalog.rs`): the checks below take its constraints
//! for granted.
//!
//! Invariant: this module only reads. Every check runs inside one repeatable-read, read-only
//! transaction, the audit chain included, so nodes committing meanwhile cannot make a
//! consistent ledger look inconsistent. PostgreSQL has no whole-database `integrity_check`;
//! the checks that stand in for it are the ones only this backend needs: the chain head row
//! agrees with the chain, no outbox id is above the head's counter or given twice, every batch
//! member and batched outbox row belongs to a batch, each batch has exactly the outbox rows its
//! link names, and linked batches' outbox ids follow each other without a gap; and, last, the
//! ledger's stored counts (what `stats` reports) are what its rows give.
//!
//! The checks read the views `audit_log` and `outbox` (`schema_postgres.sql`), which show a
//! batch committed but not linked yet with its rows (records without a seq, outbox rows without
//! an id): its claims, disbursements and records are checked against each other like any
//! other. Only the chain walk, which checks what is linked, leaves it out.

use super::audit_store;
use super::ledger::{stored_counts, PgLedger, COUNTED};
use crate::domain::audit::{Kind, Verifier};
use crate::error::{Error, Result};
use crate::ledger::{chain, checks, records, sweep, Inspect, Since, Summary};
use std::sync::atomic::Ordering;

impl Inspect for PgLedger {
    fn verify(&self) -> Result<Summary> {
        let mut conn = self.conn()?;
        // Durable, as the chain's head it reports may be written down as evidence.
        let mut tx = self.durable_snapshot(&mut conn.client)?;
        super::catalog::check(&mut tx, &self.target.schema)?;
        ledger(&mut tx, &|| Ok(self.target.connect()?))
    }

    fn ping(&self) -> Result<()> {
        self.conn()?.client.simple_query("SELECT 1")?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.redacted.clone()
    }
}

/// Each check: a query returning one text column describing the first row that breaks it, or
/// nothing; the same checks, in the same order, as `sqlite/verify.rs`, except that outbox ids
/// are held to the chain's batch links here (the last checks) rather than to claim order: two
/// writers number their batches' claims and outbox rows independently.
const CHECKS: [(&str, &str); 19] = [
    (
        "key claimed twice",
        "SELECT 'key ' || encode(idempotency_key, 'hex') || ' has ' || COUNT(*) || ' claims'
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
        "SELECT 'claim ' || p.claim_id || ' (key ' || encode(p.idempotency_key, 'hex') || ') has no disbursement'
         FROM processed_messages p LEFT JOIN disbursements d ON d.claim_id = p.claim_id
         WHERE d.id IS NULL ORDER BY p.claim_id LIMIT 1",
    ),
    (
        "disbursement differs from its claim",
        "SELECT 'disbursement ' || d.id || ' (award ' || d.award_id || ', ' || d.amount_cents
                || ' cents) differs from its claim ' || p.claim_id || ' (award ' || p.award_id || ', '
                || p.amount_cents || ' cents)'
         FROM disbursements d JOIN processed_messages p ON p.claim_id = d.claim_id
         WHERE d.idempotency_key <> p.idempotency_key OR d.award_id <> p.award_id
            OR d.amount_cents <> p.amount_cents
         ORDER BY d.id LIMIT 1",
    ),
    (
        "claim with more than one disbursement",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' disbursements'
         FROM disbursements GROUP BY claim_id HAVING COUNT(*) > 1 ORDER BY claim_id LIMIT 1",
    ),
    (
        // A second outbox row for a claim is a second event, which the relay would publish.
        "claim with more than one outbox row",
        "SELECT 'claim ' || claim_id || ' has ' || COUNT(*) || ' outbox rows'
         FROM outbox_rows GROUP BY claim_id HAVING COUNT(*) > 1 ORDER BY claim_id LIMIT 1",
    ),
    (
        "disbursement without an outbox row",
        "SELECT 'disbursement ' || d.id || ' (claim ' || d.claim_id || ', key '
                || encode(d.idempotency_key, 'hex') || ') has no outbox row'
         FROM disbursements d LEFT JOIN outbox_rows o ON o.claim_id = d.claim_id
         WHERE o.claim_id IS NULL ORDER BY d.id LIMIT 1",
    ),
    (
        "outbox row without a disbursement",
        "SELECT 'outbox row ' || COALESCE(o.id::text, o.batch_index || ' of batch ' || o.batch_id)
                || ' refers to claim ' || o.claim_id || ', which has no disbursement'
         FROM outbox o LEFT JOIN disbursements d ON d.claim_id = o.claim_id
         WHERE d.id IS NULL ORDER BY o.id, o.batch_id, o.batch_index LIMIT 1",
    ),
    (
        "outbox event differs from its disbursement",
        "SELECT 'outbox row ' || COALESCE(o.id::text, o.batch_index || ' of batch ' || o.batch_id)
                || ' announces ' || COALESCE(j.v ->> 'amount_cents', 'no amount')
                || ' cents but disbursement ' || d.id || ' records ' || d.amount_cents
         FROM outbox o JOIN disbursements d ON d.claim_id = o.claim_id
         CROSS JOIN LATERAL (SELECT claimgate_json(o.payload) AS v) j
         WHERE j.v IS NULL
            OR jsonb_typeof(j.v -> 'amount_cents') IS DISTINCT FROM 'number'
            OR (j.v ->> 'amount_cents') IS DISTINCT FROM d.amount_cents::text
            OR (j.v ->> 'award_id') IS DISTINCT FROM d.award_id
            OR (j.v ->> 'idempotency_key') IS DISTINCT FROM encode(d.idempotency_key, 'hex')
         ORDER BY o.id, o.batch_id, o.batch_index LIMIT 1",
    ),
    (
        "processed record without a matching disbursement",
        "SELECT 'audit record ' || COALESCE(a.seq::text, a.batch_index || ' of batch ' || a.batch_id)
                || ' (processed, key ' || COALESCE(encode(a.idempotency_key, 'hex'), 'none') || ', '
                || COALESCE(a.amount_cents::text, 'no') || ' cents) ' ||
                CASE WHEN d.id IS NULL THEN 'has no disbursement'
                     ELSE 'but disbursement ' || d.id || ' records award ' || d.award_id || ', '
                          || d.amount_cents || ' cents' END
         FROM audit_log a
         LEFT JOIN processed_messages p ON p.idempotency_key = a.idempotency_key
         LEFT JOIN disbursements d ON d.claim_id = p.claim_id
         WHERE a.kind = 'processed'
           AND (d.id IS NULL OR d.amount_cents IS DISTINCT FROM a.amount_cents
                OR d.award_id IS DISTINCT FROM a.award_id)
         ORDER BY a.seq, a.batch_id, a.batch_index LIMIT 1",
    ),
    (
        "key processed twice in the audit log",
        "SELECT 'key ' || encode(idempotency_key, 'hex') || ' has ' || COUNT(*) || ' processed records'
         FROM audit_log WHERE kind = 'processed' GROUP BY idempotency_key HAVING COUNT(*) > 1 LIMIT 1",
    ),
    (
        // A purged key claimed again would be a second payment of one submission.
        "key claimed after its claim was purged",
        "SELECT 'key ' || encode(p.idempotency_key, 'hex') || ' is claimed (claim ' || p.claim_id
                || ') and has a tombstone'
         FROM claim_tombstones t JOIN processed_messages p ON p.idempotency_key = t.idempotency_key
         ORDER BY p.claim_id LIMIT 1",
    ),
    (
        // A duplicate record is evidence that something was paid before: it must name a claim
        // still here, or one a purge removed and tombstoned.
        "duplicate record without a claim or tombstone",
        "SELECT 'audit record ' || COALESCE(a.seq::text, a.batch_index || ' of batch ' || a.batch_id)
                || ' (duplicate, key ' || COALESCE(encode(a.idempotency_key, 'hex'), 'none')
                || ') names a key with no claim and no tombstone'
         FROM audit_log a
         WHERE a.kind = 'duplicate'
           AND NOT EXISTS (SELECT 1 FROM processed_messages p
                           WHERE p.idempotency_key = a.idempotency_key)
           AND NOT EXISTS (SELECT 1 FROM claim_tombstones t
                           WHERE t.idempotency_key = a.idempotency_key)
         ORDER BY a.seq, a.batch_id, a.batch_index LIMIT 1",
    ),
    (
        // One `dead_letters` row per `dead_letter` record, counted per stream entry id (the
        // records carry no stream name; the entry id is what both sides share). Ordered by
        // bytes, as SQLite orders text, so both name the same entry first.
        "dead letters and dead_letter records disagree",
        "WITH r AS (SELECT COALESCE(stream_entry_id, '') AS e, COUNT(*) AS n FROM audit_log
                    WHERE kind = 'dead_letter' GROUP BY 1),
              d AS (SELECT stream_entry_id AS e, COUNT(*) AS n FROM dead_letters GROUP BY 1)
         SELECT 'stream entry ' || e || ' has ' || rows || ' dead_letters rows but ' || records
                || ' dead_letter records'
         FROM (SELECT d.e AS e, d.n AS rows, COALESCE(r.n, 0) AS records
               FROM d LEFT JOIN r ON r.e = d.e WHERE r.n IS DISTINCT FROM d.n
               UNION ALL
               SELECT r.e, 0, r.n FROM r LEFT JOIN d ON d.e = r.e WHERE d.e IS NULL) x
         ORDER BY e COLLATE \"C\" LIMIT 1",
    ),
    (
        "batch member without its batch",
        "SELECT 'audit member ' || m.batch_index || ' of batch ' || m.batch_id
                || ' belongs to no batch'
         FROM audit_members m LEFT JOIN audit_batches b ON b.batch_id = m.batch_id
         WHERE b.batch_id IS NULL ORDER BY m.batch_id, m.batch_index LIMIT 1",
    ),
    (
        "batch outbox rows disagree with the batch",
        "SELECT 'batch ' || b.batch_id || ' has ' || b.outbox_count || ' outbox rows, but '
                || COALESCE(o.n, 0) || ' are numbered ' || COALESCE(o.lo || '..' || o.hi, 'none')
         FROM audit_batches b
         LEFT JOIN (SELECT batch_id, COUNT(*) AS n, MIN(batch_index) AS lo, MAX(batch_index) AS hi
                    FROM outbox_rows WHERE batch_id IS NOT NULL GROUP BY batch_id) o
           ON o.batch_id = b.batch_id
         WHERE COALESCE(o.n, 0) <> b.outbox_count
            OR (o.n > 0 AND (o.lo <> 1 OR o.hi <> b.outbox_count))
         ORDER BY b.batch_id LIMIT 1",
    ),
    (
        "outbox row without its batch",
        "SELECT 'outbox row ' || o.batch_index || ' of batch ' || o.batch_id || ' (claim '
                || o.claim_id || ') belongs to no batch'
         FROM outbox_rows o LEFT JOIN audit_batches b ON b.batch_id = o.batch_id
         WHERE o.batch_id IS NOT NULL AND b.batch_id IS NULL
         ORDER BY o.batch_id, o.batch_index LIMIT 1",
    ),
    (
        // The relay skips every id at or below the events stream's position: an id given
        // twice, or a gap a later link could fill, would lose or repeat an event.
        OUTBOX_ID_TWICE,
        "SELECT 'outbox id ' || id || ' is given to ' || COUNT(*) || ' rows'
         FROM outbox WHERE id IS NOT NULL GROUP BY id HAVING COUNT(*) > 1 ORDER BY id LIMIT 1",
    ),
    (
        "linked batches' outbox ids do not follow each other",
        "SELECT 'batch ' || batch_id || ' (linked at seq ' || link_seq || ') has outbox ids from '
                || outbox_first || ', but the batch linked before it ends at ' || (expected - 1)
         FROM (SELECT batch_id, link_seq, outbox_first,
                      LAG(outbox_first + outbox_count) OVER (ORDER BY link_seq) AS expected
               FROM audit_batches WHERE link_seq IS NOT NULL) x
         WHERE expected IS NOT NULL AND outbox_first <> expected
         ORDER BY link_seq LIMIT 1",
    ),
];

/// Checks everything inside the caller's snapshot; the summary, or the first violation.
///
/// One pass ([`pass`]) reads each big table once, in index order, in memory that does not
/// grow with the ledger, and decides whether the ledger is clean. Only if it is not do the
/// checks run one by one as SQL ([`exact`]), to name the first violation in their order, as
/// they always have; whatever the pass found is reported if they find nothing. Then the
/// chain head, holds, reviewers' decisions and stored counts, as before.
fn ledger(tx: &mut postgres::Transaction<'_>, second: &Second<'_>) -> Result<Summary> {
    // The SQL checks read whole tables: hash joins. A nested loop chosen from stale statistics
    // (a ledger never analyzed since it was small) made one check quadratic: minutes at 160,000
    // claims.
    //
    // And no JIT: a nested loop the planner cannot avoid (a one-row side, an inequality) is
    // then costed at 10^10, far above `jit_above_cost`, so a stock server compiled statements
    // that read a handful of rows, in up to 0.15 s each (`EXPLAIN ANALYZE`: 140 ms of
    // inlining and optimisation for 0.1 ms of execution).
    tx.batch_execute("SET LOCAL enable_nestloop = off; SET LOCAL jit = off")?;
    let walked = match pass(tx, second) {
        Ok(walked) => walked,
        Err(found) => {
            exact(tx)?;
            return Err(found);
        }
    };
    let (records, head_hash) = chain::end(&walked.links)?;
    head(tx, walked.last_seq, &head_hash)?;
    published_below_marks(tx)?;
    walked.holds.compare(&super::retention::holds_in(tx)?)?;
    decisions(tx)?;
    walked.counts?;
    let unlinked: i64 = tx
        .query_one(
            "SELECT COUNT(*) FROM audit_batches WHERE link_seq IS NULL",
            &[],
        )?
        .get(0);
    Ok(Summary {
        claims: walked.claims,
        disbursements: walked.claims,
        outbox_rows: walked.claims,
        audit_records: records,
        tombstones: walked.tombstones,
        head_hash,
        unlinked_batches: unlinked as u64,
    })
}

/// The checks one by one as SQL ([`CHECKS`], the instants, the count of `processed`
/// records), naming the first violation; slow on a large ledger, so run only for a ledger
/// [`pass`] did not pass.
fn exact(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    for (what, sql) in CHECKS {
        if let Some(row) = tx.query_opt(sql, &[])? {
            return Err(Error::Invariant(format!(
                "{what}: {}",
                row.get::<_, String>(0)
            )));
        }
    }
    instants(tx)?;
    let counts = tx.query_one(
        "SELECT (SELECT COUNT(*) FROM disbursements),
                (SELECT COUNT(*) FROM audit_log WHERE kind = 'processed')",
        &[],
    )?;
    let (disbursements, processed) = (counts.get::<_, i64>(0), counts.get::<_, i64>(1));
    checks::processed_records(disbursements as u64, processed as u64, || {
        Ok(tx.query_opt(
            "SELECT 'disbursement ' || d.id || ' (key ' || encode(d.idempotency_key, 'hex') || ') has no processed audit record'
             FROM disbursements d LEFT JOIN audit_log a
               ON a.kind = 'processed' AND a.idempotency_key = d.idempotency_key
             WHERE a.kind IS NULL ORDER BY d.id LIMIT 1",
            &[],
        )?.map(|row| row.get(0)))
    })
}

/// What [`pass`] walked and counted, for the checks after it.
struct Walked {
    /// Claims (each with exactly one disbursement and one outbox row).
    claims: u64,
    /// Tombstones.
    tombstones: u64,
    /// The chain as walked, for [`chain::end`].
    links: Verifier,
    /// The seq of the chain's last record.
    last_seq: i64,
    /// The holds the chain's records place and lift.
    holds: checks::Holds,
    /// [`stored_counts`]' verdict, made while the chain was walked and reported after the
    /// chain's own checks, where it always was.
    counts: Result<()>,
}

/// The tables [`pass`] walks in step, each in the order of its unique claim id (the schema's
/// UNIQUE constraints, which `catalog.rs` checked are there): the nth claim, disbursement and
/// outbox row must all be of one claim.
const CLAIMS: &str =
    "SELECT claim_id, idempotency_key, award_id, amount_cents, submission_timestamp,
                             submission_instant
                      FROM processed_messages ORDER BY claim_id";
const DISBURSEMENTS: &str = "SELECT claim_id, idempotency_key, award_id, amount_cents
                             FROM disbursements ORDER BY claim_id";
const OUTBOX: &str = "SELECT claim_id, payload FROM outbox_rows ORDER BY claim_id";

/// The checks [`CHECKS`] holds that [`pass`] does not stand in for, run as SQL at its end:
/// from the dead letters on (they read the dead letters and the batches, one row per batch or
/// per batched outbox row, not joins on keys).
const CHECKS_AFTER_PASS: usize = 13;

/// The one pass: every check of [`exact`] and the chain walk, in memory that does not grow
/// with the ledger (the same argument as SQLite's `sweep`, `sqlite/verify.rs`). Returns what it
/// walked, or an error describing the first fault it met (which [`ledger`] then has [`exact`]
/// name in the checks' words).
///
/// Why its conditions imply [`CHECKS`]':
/// - Claims, disbursements and outbox rows walked in step by claim id: each claim has exactly
///   one disbursement and one outbox row, none exists without its claim, the disbursement
///   holds the claim's key, award and amount, and the event announces them (a plain event is
///   read here, [`sweep::plain_event_announces`]; any other text by the check's own SQL).
/// - Every claim's (key, award, amount), and every `processed` record's, linked or not,
///   digested as multisets ([`sweep::SetDigest`]), a record's key read as `encode` writes it
///   (lowercase hex): equal means each record matches a distinct disbursement, no key is
///   processed twice, and the counts are equal.
/// - The claims', tombstones' and `duplicate` records' keys sorted and merged
///   ([`sweep::key_faults`]): no key claimed twice, none claimed and tombstoned, every duplicate
///   naming a claim or a tombstone.
/// - The rest of [`CHECKS`] ([`CHECKS_AFTER_PASS`] on) as SQL. A batch member without its
///   batch is left out of the digests here, and named by one of those.
fn pass(tx: &mut postgres::Transaction<'_>, second: &Second<'_>) -> Result<Walked> {
    let fault = |s: String| Error::Invariant(s);
    let bounds = tx.query_one(
        "SELECT (SELECT MIN(claim_id) FROM processed_messages),
                (SELECT MAX(claim_id) FROM processed_messages),
                (SELECT seq FROM chain_head WHERE id = 1)",
        &[],
    )?;
    let (first_claim, last_claim, last_seq) = (
        bounds.get::<_, Option<i64>>(0).unwrap_or(0),
        bounds.get::<_, Option<i64>>(1).unwrap_or(0),
        bounds.get::<_, Option<i64>>(2).unwrap_or(0),
    );
    let mut claim_digest = sweep::SetDigest::new()?;
    // The chain is walked at the same time on a second connection, in this transaction's
    // snapshot: the two walks keep both cores busy (the server reading, the client hashing).
    let snapshot: String = tx.query_one("SELECT pg_export_snapshot()", &[])?.get(0);
    let mut client = second()?;
    let chain_at = std::sync::atomic::AtomicI64::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let records_digest = claim_digest.clone();
    let (claimed, chain, rest) = std::thread::scope(|s| {
        let walker =
            s.spawn(|| walk_chain(&mut client, &snapshot, records_digest, &chain_at, &stop));
        let mut progress = sweep::Progress::new();
        let line = |claim: i64| {
            format!(
                "verify: claims {:.0}%, audit chain {:.0}% (claim {claim} of {last_claim})",
                sweep::percent(claim, first_claim, last_claim),
                sweep::percent(chain_at.load(Ordering::Relaxed), 0, last_seq)
            )
        };
        let claimed = walk_claims(tx, &mut claim_digest, &mut progress, &line);
        // A fault in the claims is reported whatever the chain holds: stop walking it.
        stop.store(claimed.is_err(), Ordering::Relaxed);
        // The checks left to SQL, while the chain walk (the longer) goes on; their results are
        // reported in their places below.
        let rest = claimed
            .is_ok()
            .then(|| (checks_after_pass(tx), stored_and_unwalked(tx)));
        while !walker.is_finished() {
            progress.row(|| line(last_claim));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let chain = walker
            .join()
            .unwrap_or_else(|_| Err(Error::Other("the chain walk's thread panicked".into())));
        (claimed, chain, rest)
    });
    let Claimed {
        claims,
        keys: claim_keys,
        cents,
    } = claimed?;
    let Chain {
        links,
        holds,
        processed_digest,
        duplicate_keys,
        walked_seq,
        kinds,
    } = chain?;
    if !claim_digest.same_as(&processed_digest) {
        return Err(fault(format!(
            "the {} processed records and the {claims} disbursements differ",
            processed_digest.count
        )));
    }
    let mut tombstones = tx.query_raw(
        "SELECT idempotency_key FROM claim_tombstones ORDER BY idempotency_key",
        std::iter::empty::<i64>(),
    )?;
    let mut tombstone = || -> Result<Option<sweep::Key>> {
        use postgres::fallible_iterator::FallibleIterator;
        let Some(row) = tombstones.next()? else {
            return Ok(None);
        };
        Ok(Some(sweep::tombstone_key(row.try_get(0)?)?))
    };
    let tombstone_count = sweep::check_keys(claim_keys, &mut tombstone, duplicate_keys)?;
    drop(tombstones);
    let (after_pass, counts) = rest.expect("the claims were walked");
    after_pass?;
    let counts = counts.and_then(|(stored, unwalked)| {
        let walked = Tallied {
            claims,
            cents,
            records: links.count,
            kinds,
        };
        compare_counts(&stored, &walked.counts(&unwalked))
    });
    Ok(Walked {
        claims,
        tombstones: tombstone_count,
        links,
        last_seq: walked_seq,
        holds,
        counts,
    })
}

/// [`CHECKS`] from [`CHECKS_AFTER_PASS`] on, as SQL: the first fault, in [`pass`]'s words.
/// "Outbox id given twice" is first tried as [`outbox_ids_apart`], which the checks before it
/// make sufficient; only where that cannot tell does its own statement run.
fn checks_after_pass(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    for (what, sql) in &CHECKS[CHECKS_AFTER_PASS..] {
        if *what == OUTBOX_ID_TWICE && outbox_ids_apart(tx)? {
            continue;
        }
        if let Some(row) = tx.query_opt(*sql, &[])? {
            return Err(Error::Invariant(format!(
                "{what}: {}",
                row.get::<_, String>(0)
            )));
        }
    }
    Ok(())
}

/// The check [`outbox_ids_apart`] stands in for.
const OUTBOX_ID_TWICE: &str = "outbox id given twice";

/// Whether no two outbox rows can share an id, decided from the batches alone (one row per
/// batch, and one probe of the id index) where the check's own statement groups every row of
/// the `outbox` view (a join of every outbox row with its batch: 0.4 s of the server's time at
/// 500,000 claims). `false` only says "cannot tell": the statement then decides.
///
/// Sufficient because of what is checked before it (in [`CHECKS`]' order) and by the schema
/// check: a row's id is its own `id` (unique: `catalog.rs` checks the index) or, for a row of
/// a batch without one, the batch's `outbox_first` plus its place, less one; and each batch's
/// rows hold exactly the places `1..=outbox_count` ("batch outbox rows disagree with the
/// batch"). So every id a batch gives is in `[outbox_first, outbox_first + outbox_count)`, and
/// none is given twice if those ranges do not overlap and none holds a row's own id.
fn outbox_ids_apart(tx: &mut postgres::Transaction<'_>) -> Result<bool> {
    let row = tx.query_one(
        "SELECT COUNT(*) FILTER (WHERE first < reached), MIN(first), MAX(first + n)
         FROM (SELECT outbox_first AS first, outbox_count::bigint AS n,
                      MAX(outbox_first + outbox_count) OVER (
                          ORDER BY outbox_first ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                          AS reached
               FROM audit_batches WHERE outbox_first IS NOT NULL AND outbox_count > 0) r",
        &[],
    )?;
    let (overlaps, lowest, beyond): (i64, Option<i64>, Option<i64>) =
        (row.get(0), row.get(1), row.get(2));
    if overlaps > 0 {
        return Ok(false);
    }
    let (Some(lowest), Some(beyond)) = (lowest, beyond) else {
        return Ok(true); // No batch gives an id: every id is a row's own.
    };
    // Between the lowest and the highest batch's ids there may be ids no batch gives; a row's
    // own id there is not given twice, but this cannot tell (the statement will).
    let own_among_them: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM outbox_rows WHERE id >= $1 AND id < $2)",
            &[&lowest, &beyond],
        )?
        .get(0);
    Ok(!own_among_them)
}

/// What [`walk_claims`] found: the claims (each with exactly one disbursement and outbox row),
/// their keys sorted, and the sum of their cents.
struct Claimed {
    claims: u64,
    keys: sweep::KeySort,
    cents: i128,
}

/// [`pass`]'s walk of claims, disbursements and outbox rows in step (see there): the claims
/// counted and their cents summed, each digested into `claim_digest`, their keys sorted.
fn walk_claims(
    tx: &mut postgres::Transaction<'_>,
    claim_digest: &mut sweep::SetDigest,
    progress: &mut sweep::Progress,
    line: &dyn Fn(i64) -> String,
) -> Result<Claimed> {
    let fault = |s: String| Error::Invariant(s);
    let (mut c, mut d, mut o) = (
        Cursor::open(tx, CLAIMS)?,
        Cursor::open(tx, DISBURSEMENTS)?,
        Cursor::open(tx, OUTBOX)?,
    );
    let mut announces = Announces::default();
    let mut claim_keys = sweep::KeySort::default();
    let mut claims = 0u64;
    let mut cents = 0i128;
    while let Some(p) = c.next(tx)? {
        let claim: i64 = p.try_get(0)?;
        progress.row(|| line(claim));
        let key: &[u8] = p.try_get(1)?;
        let (award, amount): (&str, i64) = (p.try_get(2)?, p.try_get(3)?);
        let Some(dr) = d.next(tx)?.filter(|r| r.get::<_, i64>(0) == claim) else {
            return Err(fault(format!(
                "claim {claim}'s disbursement is not the next one in claim order"
            )));
        };
        if dr.try_get::<_, &[u8]>(1)? != key
            || dr.try_get::<_, &str>(2)? != award
            || dr.try_get::<_, i64>(3)? != amount
        {
            return Err(fault(format!(
                "claim {claim}'s disbursement differs from it"
            )));
        }
        let key: sweep::Key = key
            .try_into()
            .map_err(|_| fault(format!("claim {claim}'s key is not 32 bytes")))?;
        let Some(or) = o.next(tx)?.filter(|r| r.get::<_, i64>(0) == claim) else {
            return Err(fault(format!(
                "claim {claim}'s outbox row is not the next one in claim order"
            )));
        };
        // A row that stores no event announces its claim by construction (the event is
        // spelled from the claim: `claimgate_event`); a stored one is held to it.
        let announced = match or.try_get::<_, Option<&str>>(1)? {
            Some(payload) => announces.decide(tx, payload, &key, award, amount)?,
            None => true,
        };
        if !announced {
            return Err(fault(format!(
                "claim {claim}'s outbox event differs from its disbursement"
            )));
        }
        let (timestamp, instant): (&str, Option<&str>) = (p.try_get(4)?, p.try_get(5)?);
        checks::instant(claim, timestamp, instant)?;
        claim_digest.add(&key, award, amount);
        claim_keys.push(key)?;
        claims += 1;
        cents += i128::from(amount);
    }
    if d.next(tx)?.is_some() || o.next(tx)?.is_some() {
        return Err(fault(format!(
            "a disbursement or outbox row is left over after the {claims} claims"
        )));
    }
    drop((c, d, o));
    Ok(Claimed {
        claims,
        keys: claim_keys,
        cents,
    })
}

/// What [`walk_chain`] found.
struct Chain {
    links: Verifier,
    holds: checks::Holds,
    processed_digest: sweep::SetDigest,
    duplicate_keys: sweep::KeySort,
    walked_seq: i64,
    /// The chain's `duplicate`, `conflict` and `vanished` records (batch links are none).
    kinds: [u64; 3],
}

/// The kinds [`Chain::kinds`] counts, in its order (and [`COUNTED`]'s).
const COUNTED_KINDS: [Kind; 3] = [Kind::Duplicate, Kind::Conflict, Kind::Vanished];

/// [`pass`]'s walk of the audit trail, on its own connection in the snapshot `snapshot`
/// (exported by [`pass`]'s transaction): the chain checked, holds seen, and every `processed`
/// record, linked or in a batch not linked yet, digested into `processed_digest` (its key read
/// as `encode` writes it, lowercase hex), every `duplicate` record's key sorted. `at` follows
/// the seq reached, for the progress line; `stop` ends the walk early (the claims' walk found
/// a fault, which is reported instead).
fn walk_chain(
    client: &mut postgres::Client,
    snapshot: &str,
    mut processed_digest: sweep::SetDigest,
    at: &std::sync::atomic::AtomicI64,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Chain> {
    let fault = |s: String| Error::Invariant(s);
    assert!(
        snapshot.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
        "PostgreSQL names snapshots in hex and dashes: {snapshot}"
    );
    let mut tx = super::ledger::snapshot(client)?;
    tx.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{snapshot}'"))?;
    let mut links = Verifier::default();
    let mut holds = checks::Holds::default();
    let mut duplicate_keys = sweep::KeySort::default();
    let mut walked_seq = 0;
    let mut kinds = [0u64; 3];
    let mut record = |kind: Kind,
                      key: Option<&str>,
                      award: Option<&str>,
                      amount: Option<i64>,
                      at: &dyn Fn() -> String| {
        let key = key.and_then(sweep::unhex_lowercase);
        match (kind, key, award, amount) {
            (Kind::Processed, Some(key), Some(award), Some(amount)) => {
                processed_digest.add(&key, award, amount);
            }
            (Kind::Processed, ..) => {
                return Err(fault(format!(
                    "audit record {} (processed) lacks a key in lowercase hex, an award or an \
                     amount",
                    at()
                )))
            }
            (Kind::Duplicate, Some(key), ..) => duplicate_keys.push(key)?,
            (Kind::Duplicate, None, ..) => {
                return Err(fault(format!(
                    "audit record {} (duplicate) has no key in lowercase hex",
                    at()
                )))
            }
            _ => {}
        }
        Ok(())
    };
    audit_store::for_each(&mut tx, &audit_store::Range::Since(&Since::All), &mut |r| {
        walked_seq = r.seq;
        if r.seq % 4_096 == 0 {
            at.store(r.seq, Ordering::Relaxed);
            if stop.load(Ordering::Relaxed) {
                return Err(Error::Other("the chain walk was stopped".into()));
            }
        }
        holds.see(&r);
        chain::check(&mut links, &r)?;
        if let Some(i) = COUNTED_KINDS.iter().position(|k| *k == r.kind) {
            kinds[i] += 1;
        }
        record(
            r.kind,
            r.idempotency_key.as_deref(),
            r.award_id.as_deref(),
            r.amount_cents,
            &|| r.seq.to_string(),
        )
    })?;
    // The records of batches committed but not linked yet: in `audit_log`, not in the chain.
    for row in tx.query(
        "SELECT m.kind, m.idempotency_key, m.award_id, m.amount_cents, m.batch_index, m.batch_id
         FROM audit_batches b JOIN audit_members m ON m.batch_id = b.batch_id
         WHERE b.link_seq IS NULL AND m.kind IN ('processed', 'duplicate')",
        &[],
    )? {
        let kind = Kind::parse(row.try_get(0)?).expect("the query selects two kinds");
        let (index, batch): (i32, i64) = (row.try_get(4)?, row.try_get(5)?);
        let key = records::Columns::opt_key(&row, 1).map_err(|e| {
            fault(format!(
                "audit record {index} of batch {batch}: its idempotency_key does not read as \
                 claimgate writes it: {e} (edited)"
            ))
        })?;
        record(
            kind,
            key.as_deref(),
            row.try_get(2)?,
            row.try_get(3)?,
            &|| format!("{index} of batch {batch}"),
        )?;
    }
    Ok(Chain {
        links,
        holds,
        processed_digest,
        duplicate_keys,
        walked_seq,
        kinds,
    })
}

/// Opens the second connection [`pass`] walks the chain on.
type Second<'a> = dyn Fn() -> Result<postgres::Client> + 'a;

/// Rows fetched per round trip by each of [`pass`]'s cursors: a few MiB of rows at most.
const PASS_FETCH_ROWS: i32 = 4_096;

/// A query's rows fetched in chunks through a portal (a cursor inside the transaction), so
/// that several queries can be read in step on one connection.
struct Cursor {
    portal: postgres::Portal,
    rows: std::vec::IntoIter<postgres::Row>,
    done: bool,
}

impl Cursor {
    fn open(tx: &mut postgres::Transaction<'_>, sql: &str) -> Result<Self> {
        Ok(Cursor {
            portal: tx.bind(sql, &[])?,
            rows: Vec::new().into_iter(),
            done: false,
        })
    }

    fn next(&mut self, tx: &mut postgres::Transaction<'_>) -> Result<Option<postgres::Row>> {
        loop {
            if let Some(row) = self.rows.next() {
                return Ok(Some(row));
            }
            if self.done {
                return Ok(None);
            }
            let rows = tx.query_portal(&self.portal, PASS_FETCH_ROWS)?;
            self.done = rows.len() < PASS_FETCH_ROWS as usize;
            self.rows = rows.into_iter();
        }
    }
}

/// Whether an outbox payload announces a disbursement, as [`CHECKS`]' "outbox event differs
/// from its disbursement" decides it; a payload that is not plainly claimgate's own event is
/// handed to PostgreSQL with that check's expression (prepared once).
#[derive(Default)]
struct Announces {
    statement: Option<postgres::Statement>,
}

impl Announces {
    fn decide(
        &mut self,
        tx: &mut postgres::Transaction<'_>,
        payload: &str,
        key: &sweep::Key,
        award: &str,
        amount: i64,
    ) -> Result<bool> {
        if let Some(plain) = sweep::plain_event_announces(payload.as_bytes(), key, award, amount) {
            return Ok(plain);
        }
        let statement = match &self.statement {
            Some(s) => s.clone(),
            None => {
                let s = tx.prepare(
                    "SELECT NOT (j.v IS NULL
                        OR jsonb_typeof(j.v -> 'amount_cents') IS DISTINCT FROM 'number'
                        OR (j.v ->> 'amount_cents') IS DISTINCT FROM $2::bigint::text
                        OR (j.v ->> 'award_id') IS DISTINCT FROM $3::text
                        OR (j.v ->> 'idempotency_key') IS DISTINCT FROM encode($4::bytea, 'hex'))
                     FROM (SELECT claimgate_json($1::text) AS v) j",
                )?;
                self.statement = Some(s.clone());
                s
            }
        };
        let row = tx.query_one(&statement, &[&payload, &amount, &award, &&key[..]])?;
        Ok(row.get(0))
    }
}

/// Every claim's instant agrees with its timestamp ([`checks::instant`] says why). Rows are
/// streamed, not loaded: a ledger may hold millions.
fn instants(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    use postgres::fallible_iterator::FallibleIterator;
    let mut rows = tx.query_raw(
        "SELECT claim_id, submission_timestamp, submission_instant FROM processed_messages
         ORDER BY claim_id",
        std::iter::empty::<i64>(),
    )?;
    while let Some(row) = rows.next()? {
        let (claim, timestamp, instant): (i64, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        checks::instant(claim, &timestamp, instant.as_deref())?;
    }
    Ok(())
}

/// The chain head row agrees with the chain just walked (its last seq, the hash the next
/// record links to), no outbox id is above its counter (the next batch would reuse it), and
/// no publication is (`outbox_published`: every row the next batches write would read as
/// published, and the backlog as empty, with not one of them on the events stream).
///
/// The highest id is bounded from the id index and one row per batch (as in
/// [`outbox_ids_apart`], each batch gives ids below its `outbox_first + outbox_count`), and
/// only a bound above the counter has the `outbox` view's every row read for the id itself.
fn head(tx: &mut postgres::Transaction<'_>, last_seq: i64, head_hash: &str) -> Result<()> {
    let row = tx.query_one(
        "SELECT h.seq, h.hash, h.outbox_id_last,
                GREATEST((SELECT MAX(id) FROM outbox_rows),
                         (SELECT MAX(outbox_first + outbox_count - 1) FROM audit_batches
                          WHERE outbox_first IS NOT NULL AND outbox_count > 0)),
                (SELECT MAX(upto_id) FROM outbox_published)
         FROM chain_head h WHERE h.id = 1",
        &[],
    )?;
    let (seq, hash, outbox_last, mut outbox_max): (i64, String, i64, Option<i64>) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let published: Option<i64> = row.get(4);
    if outbox_max.is_some_and(|bound| bound > outbox_last) {
        outbox_max = tx.query_one("SELECT MAX(id) FROM outbox", &[])?.get(0);
    }
    if seq != last_seq || hash != head_hash {
        return Err(Error::Invariant(format!(
            "chain head: the head row says seq {seq}, hash {hash}, but the chain ends at seq \
             {last_seq} linking to {head_hash}"
        )));
    }
    if let Some(max) = outbox_max.filter(|m| *m > outbox_last) {
        return Err(Error::Invariant(format!(
            "chain head: outbox row {max} is above the head's last outbox id {outbox_last}"
        )));
    }
    if let Some(upto) = published.filter(|p| *p > outbox_last) {
        return Err(Error::Invariant(format!(
            "outbox publication: rows up to id {upto} are recorded as published \
             (outbox_published), above the head's last outbox id {outbox_last} (edited?)"
        )));
    }
    Ok(())
}

/// Every outbox row at or below an events stream's `published_upto:` mark reads as published.
/// The mark moves in the statement that records the publication (`outbox.rs`,
/// `mark_published`), so the last publication is never below a mark. Where it is (its rows
/// deleted by hand), the rows between read as unpublished and stand in the backlog, and its
/// alert, though the stream holds them, until a relay's next round records a publication from
/// the stream's position (publishing nothing twice). Rows marked on their own (an earlier
/// format's, migrated ones) and rows a purge removed are never named: only a row that reads as
/// unpublished is. The marks are read first, so the rows (the view `outbox`, a scan) are read
/// only when a mark stands above the last publication.
fn published_below_marks(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    // CASE: the cast must not meet another name's value (`ledger_id`), whatever order the
    // planner evaluates the conditions in.
    let above = tx.query_opt(
        "SELECT substr(m.name, 16), m.value, p.upto
         FROM ledger_meta m, (SELECT COALESCE(MAX(upto_id), 0) AS upto FROM outbox_published) p
         WHERE CASE WHEN m.name LIKE 'published\\_upto:%' AND m.value ~ '^[0-9]{1,18}$'
                    THEN m.value::bigint > p.upto END
         ORDER BY m.value::numeric DESC LIMIT 1",
        &[],
    )?;
    let Some(above) = above else {
        return Ok(());
    };
    let (stream, mark, upto): (String, String, i64) = (above.get(0), above.get(1), above.get(2));
    let mark: i64 = mark.parse().expect("selected as at most 18 digits");
    let first: Option<i64> = tx
        .query_one(
            "SELECT MIN(id) FROM outbox WHERE id > $1 AND id <= $2 AND published_at IS NULL",
            &[&upto, &mark],
        )?
        .get(0);
    match first {
        Some(id) => Err(Error::Invariant(format!(
            "outbox publication: outbox row {id} reads as unpublished, but events stream \
             {stream} holds every row up to id {mark} (its published_upto mark), above the \
             last publication recorded ({upto}; outbox_published rows deleted?)"
        ))),
        None => Ok(()),
    }
}

/// The ledger's nine counts, in [`COUNTED`]'s order, as text (a count a hand edit took below
/// zero is named, not refused as one).
type CountsText = [String; 9];

/// What [`pass`] counted on its walks, for [`Tallied::counts`].
struct Tallied {
    claims: u64,
    cents: i128,
    /// The chain's records, links not counted ([`Verifier::count`]).
    records: u64,
    kinds: [u64; 3],
}

/// What the walks do not read: the claims, disbursements and cents of batches committed but
/// not linked yet (which the stored counts leave out until the link), the dead letters less
/// those of such batches, and the tombstones.
struct Unwalked {
    claims: i64,
    disbursements: i64,
    cents: i128,
    dead_letters: i64,
    tombstones: i64,
}

impl Tallied {
    /// The counts the rows give, as `claimgate_counted()` (`schema_postgres.sql`) gives them,
    /// from what the walks read rather than by scanning every table a second time (0.8 of
    /// the server's 4.7 s of `verify` at 1M claims, on the connection whose work ends last).
    /// Equal to that function's whenever the pass has passed: every claim then has one
    /// disbursement of its amount (so the claims walked are its claims and disbursements,
    /// their cents its cents, before the unlinked batches' are taken off), and the chain walk
    /// read every record of `audit_chain` and every member of a linked batch — its count,
    /// links aside, and its kinds are the function's `a` plus `m` (a link of no batch would
    /// have broken the chain). `shared_ledger.rs`'s `postgres_counts_are_the_rows_…` and
    /// `postgres_verify_names_a_count_edited_by_hand_…` hold the two to each other: batches
    /// left unlinked at every step, dead letters, duplicates, conflicts and a purge.
    fn counts(&self, u: &Unwalked) -> CountsText {
        let claims = i128::from(self.claims);
        [
            (claims - i128::from(u.claims)).to_string(),
            (claims - i128::from(u.disbursements)).to_string(),
            (self.cents - u.cents).to_string(),
            u.dead_letters.to_string(),
            self.kinds[0].to_string(),
            self.kinds[1].to_string(),
            self.kinds[2].to_string(),
            self.records.to_string(),
            u.tombstones.to_string(),
        ]
    }
}

/// The stored counts (`chain_head` plus `purge_counts`, what `stats` reports) and what the
/// walks leave to count ([`Unwalked`]), in the pass's snapshot: one statement, reading the
/// two count rows, the unlinked batches' rows through their indexes, and the dead letters and
/// tombstones. Spelled with `= ANY (ARRAY(…))` and a scalar subquery rather than joins:
/// `verify` turns nested loops off, and a hash join read every outbox row and every member to
/// find the few of the batches in flight (0.2 s at 500,000 claims).
fn stored_and_unwalked(tx: &mut postgres::Transaction<'_>) -> Result<(CountsText, Unwalked)> {
    let row = tx.query_one(
        concat!(
            "WITH unlinked AS (
                 SELECT ARRAY(SELECT batch_id FROM audit_batches WHERE link_seq IS NULL) AS ids),
             u AS (
                 SELECT COUNT(*) AS claims, COUNT(x.cents) AS disbursements,
                        COALESCE(SUM(x.cents), 0) AS cents
                 FROM (SELECT (SELECT d.amount_cents FROM disbursements d
                               WHERE d.claim_id = o.claim_id) AS cents
                       FROM unlinked, outbox_rows o WHERE o.batch_id = ANY (unlinked.ids)) x),
             ud AS (
                 SELECT COUNT(*) AS n FROM unlinked, audit_members m
                 WHERE m.batch_id = ANY (unlinked.ids) AND m.kind = 'dead_letter')
             SELECT ",
            stored_counts!(),
            ", u.claims, u.disbursements, u.cents::text,
                (SELECT COUNT(*) FROM dead_letters) - ud.n, (SELECT COUNT(*) FROM claim_tombstones)
             FROM chain_head h, purge_counts p, u, ud WHERE h.id = 1 AND p.id = 1"
        ),
        &[],
    )?;
    let stored = std::array::from_fn(|i| match i {
        2 => row.get(i),
        _ => row.get::<_, i64>(i).to_string(),
    });
    let n = COUNTED.len();
    let unwalked = Unwalked {
        claims: row.get(n),
        disbursements: row.get(n + 1),
        cents: super::ledger::cents(row.get(n + 2))?,
        dead_letters: row.get(n + 3),
        tombstones: row.get(n + 4),
    };
    Ok((stored, unwalked))
}

/// The stored counts are the counts the rows give; else the first that differs, both values,
/// and how to set them again.
fn compare_counts(stored: &CountsText, rows: &CountsText) -> Result<()> {
    for ((name, stored), rows) in COUNTED.iter().zip(stored).zip(rows) {
        if stored != rows {
            return Err(Error::Invariant(format!(
                "stored count differs from the rows: {name} is stored as {stored} \
                 (chain_head plus purge_counts) but the ledger holds {rows}; status and \
                 /metrics report the stored count: set every count from the rows with \
                 `SELECT claimgate_recount();`, run in the ledger's schema as the role that \
                 owns it, then verify again"
            )));
        }
    }
    Ok(())
}

/// Reviewers' decisions on held conflicts agree with their records ([`checks::decisions`]),
/// the records read from every batch, linked or not (`audit_log`).
fn decisions(tx: &mut postgres::Transaction<'_>) -> Result<()> {
    let rows = tx
        .query(
            "SELECT reason_code, stream_entry_id, decision, decided_by, decided_reason, decided_at
             FROM dead_letters WHERE reason_code = 'conflict_hold' OR decision IS NOT NULL
                OR decided_by IS NOT NULL OR decided_reason IS NOT NULL OR decided_at IS NOT NULL",
            &[],
        )?
        .iter()
        .map(checks::HeldRow::read)
        .collect::<Result<Vec<_>>>()?;
    let records = tx
        .query(
            "SELECT kind, stream_entry_id, detail, recorded_at FROM audit_log
             WHERE kind IN ('conflict_approved', 'conflict_rejected')",
            &[],
        )?
        .iter()
        .map(checks::DecisionRecord::read)
        .collect::<Result<Vec<_>>>()?;
    checks::decisions(&rows, &records)
}
