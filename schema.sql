-- claimgate ledger schema. Applied at every start; every statement is idempotent.
--
-- One index holds the claim, and it is not on a random key alone: it leads with the
-- submission's own instant. Every other table refers to a claim through its integer claim_id, so
-- inserts there append to the right edge of their B-trees. Keys are stored as 32 raw bytes; use
-- lower(hex(idempotency_key)) to see the 64-hex form.

-- The durable claim: one row per submission ever processed. It is also the retained evidence
-- of what was processed and when (2 CFR 200.334), so nothing deletes from it automatically.
-- claim_id is the surrogate the other tables reference.
--
-- submission_instant is the instant submission_timestamp names, spelled one way (UTC, nine
-- fractional digits, 'Z': src/domain/clock.rs, instant_utc), so `09:00:00Z` and
-- `11:00:00+02:00` are one time.
--
-- The claim itself is UNIQUE (submission_instant, award_id, idempotency_key), and that is
-- uniqueness of the idempotency key: the key is sha256(award_id | submission_timestamp |
-- sha256(payload)) over exactly the award stored beside it and the timestamp whose instant is
-- stored beside it, and an RFC 3339 timestamp and a hex digest contain no '|', so one key can
-- only ever come with one (instant, award) pair. A second claim of a key therefore collides
-- here, and INSERT OR IGNORE is refused by the database whatever the code does. Leading with
-- the instant is what keeps the index cheap to write: submissions arrive roughly in the order
-- they were made, so new claims land on the few pages at the index's right edge instead of one
-- random page each among millions (the write amplification that made a ledger of 1,000,000
-- claims 40% slower than an empty one; see BENCHMARKS.md). The same index answers conflict
-- detection ("an earlier claim for this award at this instant with another key", compared on
-- the instant, never the spelling), so a claim costs one index entry, not two.
--
-- Ledgers made by earlier releases keep their own claim index — UNIQUE (submission_timestamp,
-- award_id, idempotency_key), or UNIQUE (idempotency_key) before that — plus the index
-- claim_instant (submission_instant, award_id, idempotency_key) for conflicts, and a
-- submission_instant column that may be NULL (src/ledger/sqlite/upgrade.rs adds and backfills
-- it); every query here works on each.
CREATE TABLE IF NOT EXISTS processed_messages (
    claim_id             INTEGER PRIMARY KEY,
    idempotency_key      BLOB    NOT NULL CHECK (length(idempotency_key) = 32),
    award_id             TEXT    NOT NULL CHECK (award_id <> ''),
    submission_timestamp TEXT    NOT NULL,
    amount_cents         INTEGER NOT NULL CHECK (amount_cents > 0),
    claimed_at           TEXT    NOT NULL,
    stream_entry_id      TEXT    NOT NULL,
    consumer             TEXT    NOT NULL,
    submission_instant   TEXT    NOT NULL,
    UNIQUE (submission_instant, award_id, idempotency_key)
);

-- Tombstones: one per claim a retention purge removed, so a purged submission is a duplicate
-- forever (src/ledger/mod.rs, contract point 6). Only the key and when it was claimed (and
-- purged): no award, no amount, nothing personal.
--
-- Why a table of its own rather than a row left in processed_messages: the claim's unique
-- index is (submission_timestamp, award_id, idempotency_key), so a row kept there keeps the
-- award and time, which a purge must remove, and the worker's insert-heavy index would carry
-- every purged key for ever. Here the key alone is the primary key (WITHOUT ROWID: one B-tree,
-- no second lookup). It is random-keyed, which the claim index must never be, but this table
-- is written only by purges, never on the worker's path; the worker only reads it, one probe
-- per submission and only in a ledger that has any tombstone at all (src/ledger/sqlite/batch.rs
-- asks once per batch), so a ledger never purged pays one cheap read per batch.
-- A ledger from before this table gets it on open, and tombstones rebuilt from the duplicate
-- records its earlier purges left behind (src/ledger/sqlite/upgrade.rs).
CREATE TABLE IF NOT EXISTS claim_tombstones (
    idempotency_key BLOB NOT NULL PRIMARY KEY CHECK (length(idempotency_key) = 32),
    claimed_at      TEXT NOT NULL,
    purged_at       TEXT NOT NULL
) WITHOUT ROWID;

-- The business side effect. The claim is the row's key (claim_id INTEGER PRIMARY KEY, unique
-- by definition) — that is what makes a second disbursement for one claim impossible whatever
-- the code does — and one B-tree holds it, not a table and a separate unique index. `id` is
-- the disbursement's number for messages and exports; it is the claim's (a claim has at most
-- one disbursement). Ledgers made by earlier releases keep `id INTEGER PRIMARY KEY` with
-- UNIQUE (claim_id), the same guarantee in two B-trees.
--
-- The key, award and amount are stored, as the contract names them: this is the table people
-- query for what was paid to whom. Only recorded_at, when NULL, is derived: the claim's
-- claimed_at, written in the same transaction (format 5, src/ledger/sqlite/derived.rs). A
-- ledger made by an earlier release keeps it NOT NULL and written; both are read alike.
CREATE TABLE IF NOT EXISTS disbursements (
    id              INTEGER GENERATED ALWAYS AS (claim_id) VIRTUAL,
    claim_id        INTEGER PRIMARY KEY REFERENCES processed_messages (claim_id),
    idempotency_key BLOB    NOT NULL CHECK (length(idempotency_key) = 32),
    award_id        TEXT    NOT NULL,
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    recorded_at     TEXT
);

-- The transactional outbox. AUTOINCREMENT so an id is never reused, even after a purge: the
-- relay's exactly-once publishing depends on ids only ever growing.
--
-- A row is written whole and keeps its event until it is published. The event is a function
-- of the claim (src/domain/event.rs), so once published a row keeps only its id, claim and
-- published_at (format 5; the relay puts the row back without the rest, src/ledger/sqlite/
-- outbox.rs): event_type NULL is 'disbursement.recorded', payload NULL the event built from
-- the claim's amount, award, key and submission_timestamp, created_at NULL the claim's
-- claimed_at. The relay (publishing again from the ledger), `migrate`, the retention export
-- and `verify` read such a row as if it held them (src/ledger/sqlite/derived.rs), byte for
-- byte what was stored; a payload that is stored is published as stored and checked against
-- its claim. The claim is kept as long as its outbox row (a purge removes both), so there is
-- always one to derive from. A ledger made by an earlier release keeps these columns NOT NULL
-- and its published rows whole.
CREATE TABLE IF NOT EXISTS outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    claim_id     INTEGER NOT NULL UNIQUE REFERENCES processed_messages (claim_id),
    event_type   TEXT,
    payload      TEXT,
    created_at   TEXT,
    published_at TEXT
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

-- Entries that were dead-lettered, one row per stream entry, so a redelivered bad entry leaves
-- one audit record, not one per delivery. A conflict held for review (reason_code
-- 'conflict_hold') gets a reviewer's decision once (`claimgate dlq approve` / `reject`,
-- src/ledger/review.rs): `decision` is 'approved' or 'rejected', set with who, why and when in
-- the transaction that writes its audit record (and, approved, pays it); NULL while awaiting.
-- Ledgers of earlier releases get the four columns at open (src/ledger/sqlite/upgrade.rs).
CREATE TABLE IF NOT EXISTS dead_letters (
    stream          TEXT    NOT NULL,
    stream_entry_id TEXT    NOT NULL,
    reason_code     TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    award_id        TEXT,
    delivery_count  INTEGER NOT NULL,
    recorded_at     TEXT    NOT NULL,
    decision        TEXT,
    decided_by      TEXT,
    decided_reason  TEXT,
    decided_at      TEXT,
    PRIMARY KEY (stream, stream_entry_id)
);
-- The conflicts held for review that no reviewer has decided yet, oldest first: what `status`
-- lists and each `/metrics` scrape counts (src/ledger/review.rs, AWAITING_REVIEW, which is
-- this predicate), read without walking every dead letter. A ledger from before it gets it at
-- its first open.
CREATE INDEX IF NOT EXISTS dead_letters_awaiting_review
    ON dead_letters (stream, recorded_at, stream_entry_id)
    WHERE reason_code = 'conflict_hold' AND decision IS NULL;

-- The hash-chained audit trail, written in the same transaction as the effect it records.
-- hash = sha256(prev_hash || canonical JSON of the record); see src/domain/audit.rs.
--
-- prev_hash and hash are stored as their 32 raw bytes (format 5); a ledger made by an earlier
-- release holds them as 64 lowercase hex digits, and keeps those rows as they are. Each is read
-- in either form, and always shown and hashed as hex, so a record's meaning and its hash do
-- not depend on which form it is stored in. Use lower(hex(hash)) in sqlite3 to see the hex.
--
-- idempotency_key is stored the same way from format 6 on: 32 raw bytes, as in
-- processed_messages, NULL for a record about no key; a record written before keeps its hex.
-- A payment's records: WHERE idempotency_key = x'<64 hex digits>' (or = '<64 hex digits>' for a
-- record written before format 6); both are read, shown, exported and hashed as hex.
CREATE TABLE IF NOT EXISTS audit_log (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT    NOT NULL,
    idempotency_key BLOB,
    award_id        TEXT,
    amount_cents    INTEGER,
    stream_entry_id TEXT,
    consumer        TEXT,
    delivery_count  INTEGER,
    detail          TEXT,
    recorded_at     TEXT    NOT NULL,
    prev_hash       BLOB    NOT NULL,
    hash            BLOB    NOT NULL
);
-- The dead-letter records, and only those: dead-letter reconciliation reads them before a
-- worker behind Sentinel starts reading and after every failover (src/ops/reconcile.rs), and
-- must not walk the whole trail to find them (about 1.5 us a record: 15 s on 10,000,000). A
-- partial index costs the worker's path nothing on any other record. A ledger from before it
-- gets it at its first open, in one pass over the trail.
CREATE INDEX IF NOT EXISTS audit_dead_letters ON audit_log (seq) WHERE kind = 'dead_letter';

-- Facts about this ledger file itself. `ledger_id` is random per file, created by the first
-- relay (not here: this file runs at every open and must not take the write lock): the relay
-- stamps it on its Redis high-water mark so a fresh ledger is never mistaken for a published one.
CREATE TABLE IF NOT EXISTS ledger_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Awards under legal hold: `retention purge` refuses to delete anything that names them.
CREATE TABLE IF NOT EXISTS legal_holds (
    award_id TEXT PRIMARY KEY,
    reason   TEXT NOT NULL,
    held_at  TEXT NOT NULL
);

-- The ledger's counts, one row, so `status`, `/metrics` and a worker's start read them at any
-- size instead of counting millions of rows (src/ledger/sqlite/counts.rs). Every transaction
-- that adds or removes a counted row moves them in the same transaction; `verify` checks them
-- against the rows. The row is written, counted from the rows, by the first open that finds
-- none (a new ledger, an earlier release's, or one whose row was deleted). The disbursed total
-- is kept in two halves that cannot overflow: the sums of each amount's high and low 32 bits.
CREATE TABLE IF NOT EXISTS ledger_counts (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    claims        INTEGER NOT NULL,
    disbursements INTEGER NOT NULL,
    cents_high    INTEGER NOT NULL,
    cents_low     INTEGER NOT NULL,
    dead_letters  INTEGER NOT NULL,
    duplicates    INTEGER NOT NULL,
    conflicts     INTEGER NOT NULL,
    vanished      INTEGER NOT NULL,
    audit_records INTEGER NOT NULL,
    tombstones    INTEGER NOT NULL
);
