//! `Ledger::stats` on PostgreSQL without counting the whole ledger on every call.
//!
//! Every `/metrics` scrape of every node asks for the counts. Counted from scratch they cost
//! the server a pass over the claims, the disbursements and the audit trail each time: 0.4–0.6 s
//! on a ledger of 1,000,000 claims (BENCHMARKS.md), per node, per scrape, growing with the
//! years a ledger is kept. A [`Tally`] keeps the counts and how far they reach; the next call
//! counts only what committed since, in one repeatable-read snapshot.
//!
//! How far a tally reaches cannot be "the highest claim id": claim ids come from a sequence at
//! insert and become visible at commit, out of order (a claim with a lower id can commit after
//! one with a higher id was counted). What *is* in commit order is what a link numbers under
//! the chain-head row lock, which it holds until its COMMIT (`claimgate_link`): the batches'
//! `link_seq`s. The head row read in the same snapshot bounds them exactly: every batch linked
//! at a seq up to the head's is visible, and none above it.
//!
//! **Invariant:** between purges, rows are only added; each claim is added in the transaction
//! that adds its disbursement and its outbox row, in a batch that is linked later, at a
//! `link_seq` above every linked batch's. So what a tally counts is the *linked* ledger: the
//! records of the chain, and the claims and disbursements of the outbox rows of linked batches
//! (and of rows stored with their ids, which an earlier release or `migrate` wrote, counted
//! whole once and never added to again). What was linked since the last count is exactly the
//! batches with `link_seq` between the two heads' `seq`s: their members, outbox rows and the
//! claims and disbursements those name. A hold's record is a batch too. A claim
//! of a batch not linked yet is counted when its batch is. The one thing that deletes rows, or
//! writes a record below the head (its checkpoint), is a retention purge batch, and every one
//! moves [`PURGES_META`] in `ledger_meta`, as on SQLite; `migrate` copies SQLite's value, which
//! is above zero wherever there are tombstones to copy. A tally that sees it moved counts
//! everything again. Tombstones are written only by purges and by `migrate`, so they are
//! counted only then. Dead letters carry no commit-ordered number and are counted whole on
//! every call; there are few of them in any ledger that is working.
//!
//! A link commits without waiting for the disk (`claimgate_link`), so a server crash can take
//! back links a tally has already counted: their batches are unlinked again and linked anew,
//! at other seqs, and the head may by then be below the tally's or past it. Either way the
//! link the tally's head was is gone or sealed differently (a link's hash covers its seq and
//! every link before it), so a tally whose head was a link checks that this link still stands
//! with the hash it had, and counts everything again when it does not; a head that is not a
//! link (an earlier release's or a migrated chain's end) was written by a durable commit.

use crate::error::{Error, Result};
use crate::ledger::Counts;
use postgres::Transaction;

/// The `ledger_meta` row every purge batch moves; the name SQLite uses, so `migrate` carries it.
pub(super) const PURGES_META: &str = "claims_purged";

/// The ledger's counts as of the last call, and how far they reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// [`PURGES_META`] when counted (`None`: never purged).
    purges: Option<String>,
    /// The chain head's `seq` and `outbox_id_last` when counted.
    seq_seen: i64,
    outbox_seen: i64,
    /// The head's hash when counted, if the head was a link (the batch linked at `seq_seen`):
    /// the counts hold only while that link stands.
    link_seen: Option<String>,
    /// The counts (`dead_letters` stays 0 here: they are counted whole on every call).
    pub(super) counts: Counts,
}

impl Tally {
    /// Brings `last` (if any) up to what `tx` sees, or counts everything when there is no tally
    /// yet, a purge happened since, or the head it reached is behind the head or no longer
    /// stands (a link a server crash took back). `tx` must be one snapshot (repeatable read),
    /// so the head it reads bounds every count.
    pub(super) fn of(tx: &mut Transaction<'_>, last: Option<Tally>) -> Result<Tally> {
        // Both link lookups are probes of the unique index on link_seq.
        let seen = last.as_ref().map_or(-1, |t| t.seq_seen);
        let head = tx.query_one(
            "SELECT h.seq, h.outbox_id_last,
                    (SELECT value FROM ledger_meta WHERE name = $1),
                    (SELECT b.hash FROM audit_batches b WHERE b.link_seq = h.seq),
                    (SELECT b.hash FROM audit_batches b WHERE b.link_seq = $2)
             FROM chain_head h WHERE h.id = 1",
            &[&PURGES_META, &seen],
        )?;
        let (seq, outbox, purges): (i64, i64, Option<String>) =
            (head.get(0), head.get(1), head.get(2));
        let (link, link_at_seen): (Option<String>, Option<String>) = (head.get(3), head.get(4));
        match last {
            Some(t)
                if t.purges == purges
                    && t.seq_seen <= seq
                    && t.outbox_seen <= outbox
                    && (t.link_seen.is_none() || t.link_seen == link_at_seen) =>
            {
                t.since(tx, seq, outbox, link)
            }
            _ => Tally::whole(tx, purges, seq, outbox, link),
        }
    }

    /// Everything, from scratch, up to the head (`seq`, `outbox`): what is linked.
    fn whole(
        tx: &mut Transaction<'_>,
        purges: Option<String>,
        seq: i64,
        outbox: i64,
        link: Option<String>,
    ) -> Result<Tally> {
        // One pass over each table; the claims and disbursements of batches not linked yet
        // (few: a writer links right after its commit) are taken off.
        let row = tx.query_one(
            "WITH unlinked AS (
                 SELECT o.claim_id FROM audit_batches b
                 JOIN outbox_rows o ON o.batch_id = b.batch_id WHERE b.link_seq IS NULL),
             u AS (SELECT COUNT(*) AS claims, COUNT(d.claim_id) AS disbursements,
                          COALESCE(SUM(d.amount_cents), 0) AS total
                   FROM unlinked LEFT JOIN disbursements d ON d.claim_id = unlinked.claim_id)
             SELECT (SELECT COUNT(*) FROM processed_messages) - u.claims,
                    d.n - u.disbursements, (d.total - u.total)::text,
                    a.n + m.n, a.duplicates + m.duplicates, a.conflicts + m.conflicts,
                    a.vanished + m.vanished,
                    (SELECT COUNT(*) FROM claim_tombstones)
             FROM u,
                  (SELECT COUNT(*) AS n, COALESCE(SUM(amount_cents), 0) AS total
                   FROM disbursements) d,
                  (SELECT COUNT(*) AS n,
                          COUNT(*) FILTER (WHERE kind = 'duplicate') AS duplicates,
                          COUNT(*) FILTER (WHERE kind = 'conflict') AS conflicts,
                          COUNT(*) FILTER (WHERE kind = 'vanished') AS vanished
                   FROM audit_chain) a,
                  (SELECT COUNT(*) AS n,
                          COUNT(*) FILTER (WHERE kind = 'duplicate') AS duplicates,
                          COUNT(*) FILTER (WHERE kind = 'conflict') AS conflicts,
                          COUNT(*) FILTER (WHERE kind = 'vanished') AS vanished
                   FROM audit_members m JOIN audit_batches b ON b.batch_id = m.batch_id
                   WHERE b.link_seq IS NOT NULL) m",
            &[],
        )?;
        let n = |i: usize| row.get::<_, i64>(i) as u64;
        Ok(Tally {
            purges,
            seq_seen: seq,
            outbox_seen: outbox,
            link_seen: link,
            counts: Counts {
                claims: n(0),
                disbursements: n(1),
                disbursed_cents_total: cents(row.get(2))?,
                dead_letters: 0,
                audit_records: n(3),
                duplicates: n(4),
                conflicts: n(5),
                vanished: n(6),
                tombstones: n(7),
            },
        })
    }

    /// This tally plus what was linked since, up to the head (`seq`, `outbox`): range scans
    /// of the batches' link index and the primary keys under them, however large the ledger.
    fn since(
        mut self,
        tx: &mut Transaction<'_>,
        seq: i64,
        outbox: i64,
        link: Option<String>,
    ) -> Result<Tally> {
        // The planner cannot know a range past its statistics' last bucket is nearly empty; it
        // guessed thousands of rows and started parallel workers, whose start-up was 20 ms of a
        // scrape that reads a handful of index entries (measured on a 1,000,000-claim ledger).
        tx.batch_execute("SET LOCAL max_parallel_workers_per_gather = 0")?;
        let row = tx.query_one(
            "WITH b AS (SELECT batch_id FROM audit_batches WHERE link_seq > $1 AND link_seq <= $2)
             SELECT a.n, a.duplicates, a.conflicts, a.vanished,
                    c.claims, c.disbursements, c.total
             FROM (SELECT COUNT(*) AS n,
                          COUNT(*) FILTER (WHERE kind = 'duplicate') AS duplicates,
                          COUNT(*) FILTER (WHERE kind = 'conflict') AS conflicts,
                          COUNT(*) FILTER (WHERE kind = 'vanished') AS vanished
                   FROM b JOIN audit_members m ON m.batch_id = b.batch_id) a,
                  (SELECT COUNT(p.claim_id) AS claims, COUNT(d.claim_id) AS disbursements,
                          COALESCE(SUM(d.amount_cents), 0)::text AS total
                   FROM b JOIN outbox_rows o ON o.batch_id = b.batch_id
                   LEFT JOIN processed_messages p ON p.claim_id = o.claim_id
                   LEFT JOIN disbursements d ON d.claim_id = o.claim_id) c",
            &[&self.seq_seen, &seq],
        )?;
        let n = |i: usize| row.get::<_, i64>(i) as u64;
        let c = &mut self.counts;
        c.audit_records += n(0);
        c.duplicates += n(1);
        c.conflicts += n(2);
        c.vanished += n(3);
        c.claims += n(4);
        c.disbursements += n(5);
        c.disbursed_cents_total += cents(row.get(6))?;
        self.seq_seen = seq;
        self.outbox_seen = outbox;
        self.link_seen = link;
        Ok(self)
    }
}

/// A SUM over BIGINT, which PostgreSQL gives as NUMERIC (exact at any size), read as text.
fn cents(total: String) -> Result<i128> {
    total
        .parse()
        .map_err(|_| Error::Invariant(format!("the disbursed total {total} is not an integer")))
}
