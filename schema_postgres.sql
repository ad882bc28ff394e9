-- claimgate ledger schema for PostgreSQL: the shared ledger of several nodes. Applied only to
-- make a ledger in an empty schema or to upgrade one of an earlier format, under an advisory
-- lock, in one transaction that then records the format (src/ledger/postgres/schema.rs); a
-- ledger of today's format is opened with no DDL at all. Every statement is idempotent. Every
-- name is unqualified: the session's search path is pinned to the ledger's one schema
-- (src/ledger/postgres/connect.rs), and every function that reads a table keeps that path
-- (SET search_path FROM CURRENT), so a session with another path that fires a trigger still
-- reads this ledger's tables.
--
-- The same tables, columns and meanings as schema.sql (the SQLite ledger), so CONTRACT.md's
-- names hold on both: keys are 32 raw bytes (BYTEA), times are the ledger's fixed-width UTC
-- text (src/domain/clock.rs), compared as text exactly as on SQLite. What differs, and why:
--
-- * A batch is written in two transactions, so that no writer holds the one lock every node
--   shares while it writes rows (src/ledger/postgres/batch.rs). The first writes everything
--   the batch does — claims, disbursements, outbox rows, dead letters, and its audit records
--   as *members* of the batch (src/domain/audit.rs: hashed among themselves, not after the
--   chain's head) — plus one `audit_batches` row naming how many members and outbox rows it
--   has and the last member's hash. The second, `claimgate_link` (end of this file), is one
--   statement: it locks the chain head, gives the writer's own committed batch (or, at a
--   node's start and in a relay round, every batch a stopped writer left unlinked) its place
--   (its link record's seq after its members' seqs, its outbox rows' ids, its link hash
--   sealed after the head) and advances the head. That lock is held for a few row updates and
--   a commit that does not wait for the disk, whatever the size of the batch. A link is a seal,
--   not an event: it carries its batch's last seq, and every seq still names one record.
-- * So `audit_log` and `outbox` are views, with the columns and meanings they have on SQLite:
--   `audit_log` every record (records sealed one by one in `audit_chain`, batch members in
--   `audit_members`) with its seq; `outbox` every row (`outbox_rows`) with its id. The batches'
--   links are `audit_batches` rows. A batch committed but not linked yet
--   shows its records without a seq and its outbox rows without an id: they are written, not
--   yet placed. The relay, the chain walk and the purge read the tables underneath.
-- * outbox ids are handed out when a batch is linked, under the chain-head row lock held until
--   that commit, so they are assigned in the order batches become visible as linked: no row can
--   become visible below an id a relay has already read (contract point 5). A sequence would
--   hand out ids at insert time and let them become visible out of order.
-- * audit seqs likewise come from chain_head.seq at link time: one linear chain whatever
--   number of nodes write (contract point 4).
-- * chain_head: one row, the chain's last seq and hash, the last outbox id, and the ledger's
--   counts (what `stats` reports: claims, cents, records...), which each link moves by what its
--   batch wrote, in the update that moves the head; purges keep theirs in `purge_counts`. So
--   `stats` reads two rows, not the tables, and `verify` holds them to the rows. See
--   ARCHITECTURE.md, "src/ledger/postgres/".
-- * disbursements.claim_id and outbox_rows.claim_id are held to an existing claim by statement
--   triggers (at the end of this file), not by FOREIGN KEY. A foreign key checks and locks
--   the claim row once per inserted row; measured on the batch path it was 17 of 44 us of
--   server CPU per submission (BENCHMARKS.md). The triggers check a whole statement's rows in
--   one set-based query, with the same refusal (SQLSTATE 23503) for every writer.
--
-- Ledgers made by earlier releases had `audit_log` and `outbox` as tables, every record sealed
-- one by one and every outbox id numbered under the head lock: they are renamed to
-- `audit_chain` and `outbox_rows` below, kept as they are, and the batches written from then
-- on chain after them. Every node on one ledger must run this release from then on (README,
-- "When one box is not enough", upgrading).

-- Earlier releases' tables, renamed (only where they are still tables).
DO $$
DECLARE
    pk TEXT;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('audit_log')) = 'r' THEN
        ALTER TABLE audit_log RENAME TO audit_chain;
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('outbox')) = 'r' THEN
        ALTER TABLE outbox RENAME TO outbox_rows;
        SELECT conname INTO pk FROM pg_constraint
        WHERE conrelid = 'outbox_rows'::regclass AND contype = 'p';
        IF pk IS NOT NULL THEN
            EXECUTE format('ALTER TABLE outbox_rows DROP CONSTRAINT %I', pk);
        END IF;
        ALTER TABLE outbox_rows ALTER COLUMN id DROP NOT NULL,
            ADD CONSTRAINT outbox_rows_id_key UNIQUE (id),
            ADD COLUMN batch_id BIGINT,
            ADD COLUMN batch_index INTEGER,
            ADD CONSTRAINT outbox_rows_batch_id_batch_index_key UNIQUE (batch_id, batch_index),
            ADD CONSTRAINT outbox_rows_placed
                CHECK ((id IS NULL) = (batch_id IS NOT NULL)
                       AND (batch_id IS NULL) = (batch_index IS NULL));
    END IF;
END;
$$;

-- The durable claim. UNIQUE (submission_instant, award_id, idempotency_key) is uniqueness of
-- the key (schema.sql gives the argument), keeps new claims at the index's right edge, and is
-- the conflict probe too, as on SQLite: one index per claim besides the primary key. Ledgers
-- made by the first release keep UNIQUE (submission_timestamp, award_id, idempotency_key) plus
-- the index claim_instant (submission_instant, award_id, idempotency_key); every query in
-- src/ledger/postgres/ probes by (instant, award, key) and works on both.
CREATE TABLE IF NOT EXISTS processed_messages (
    claim_id             BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    idempotency_key      BYTEA   NOT NULL CHECK (octet_length(idempotency_key) = 32),
    award_id             TEXT    NOT NULL CHECK (award_id <> ''),
    submission_timestamp TEXT    NOT NULL,
    amount_cents         BIGINT  NOT NULL CHECK (amount_cents > 0),
    claimed_at           TEXT    NOT NULL,
    stream_entry_id      TEXT    NOT NULL,
    consumer             TEXT    NOT NULL,
    submission_instant   TEXT    NOT NULL,
    UNIQUE (submission_instant, award_id, idempotency_key)
);

-- Tombstones: one per claim a retention purge removed, so a purged submission is a duplicate
-- forever (src/ledger/mod.rs, contract point 6); key and times only, as in schema.sql (which
-- gives the reasons for a table of its own). Written only by purge batches, in the transaction
-- that deletes the claim, and never deleted. The worker reads it in the same statement that
-- reads the claims (src/ledger/postgres/batch.rs, step 2), so one snapshot shows a purged key
-- either still claimed or tombstoned, never neither.
CREATE TABLE IF NOT EXISTS claim_tombstones (
    idempotency_key BYTEA PRIMARY KEY CHECK (octet_length(idempotency_key) = 32),
    claimed_at      TEXT  NOT NULL,
    purged_at       TEXT  NOT NULL
);

-- The business side effect; UNIQUE (claim_id) makes a second disbursement for one claim
-- impossible whatever the code does. claim_id names an existing claim (the triggers below).
CREATE TABLE IF NOT EXISTS disbursements (
    id              BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    claim_id        BIGINT  NOT NULL UNIQUE,
    idempotency_key BYTEA   NOT NULL,
    award_id        TEXT    NOT NULL,
    amount_cents    BIGINT  NOT NULL CHECK (amount_cents > 0),
    recorded_at     TEXT    NOT NULL
);

-- The transactional outbox's rows (claim_id as for disbursements). A row a batch wrote has its
-- batch and its place among the batch's rows, and no id of its own: its id is its batch's
-- `outbox_first` plus its place, given when the batch is linked (the view `outbox`, below). A
-- row written by an earlier release, or copied by `migrate`, has its id and no batch.
-- `published_at` is set only on rows an earlier format's relay marked one by one, and on rows
-- `migrate` copied: since format 5 a row is written once and never changed (`outbox_published`).
-- Since format 5 too, a batch's rows store no event: `event_type` and `payload` are NULL, and
-- the view `outbox` and the relay spell the event from the row's claim (`claimgate_event`,
-- below), which holds everything it announces. Rows an earlier format or `migrate` wrote keep
-- the event they stored, and it is still held to their claim (`verify`).
CREATE TABLE IF NOT EXISTS outbox_rows (
    id           BIGINT  UNIQUE CHECK (id > 0),
    claim_id     BIGINT  NOT NULL UNIQUE,
    event_type   TEXT,
    payload      TEXT,
    created_at   TEXT    NOT NULL,
    published_at TEXT,
    batch_id     BIGINT,
    batch_index  INTEGER,
    UNIQUE (batch_id, batch_index),
    CONSTRAINT outbox_rows_placed
        CHECK ((id IS NULL) = (batch_id IS NOT NULL) AND (batch_id IS NULL) = (batch_index IS NULL)),
    CONSTRAINT outbox_rows_event CHECK ((event_type IS NULL) = (payload IS NULL))
);
-- A ledger of an earlier format: its columns made nullable (no row rewritten) and the check
-- added (one pass over the rows, at the upgrade only).
ALTER TABLE outbox_rows ALTER COLUMN event_type DROP NOT NULL, ALTER COLUMN payload DROP NOT NULL;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'outbox_rows'::regclass AND conname = 'outbox_rows_event') THEN
        ALTER TABLE outbox_rows ADD CONSTRAINT outbox_rows_event
            CHECK ((event_type IS NULL) = (payload IS NULL));
    END IF;
END;
$$;

-- What the relays have published, one row per advance (format 5): every outbox row with an id
-- at or below the highest `upto_id` is published, and a row's `published_at` (the view
-- `outbox`) is that of the first publication at or above its id, unless the row carries its
-- own. Rows reach the events stream in id order and become visible in id order (contract
-- point 5, `src/ledger/postgres/outbox.rs`), so one number says which are published.
-- Before, the relay marked each row with an UPDATE that was never HOT (the partial index of
-- unpublished rows named the column): every row left a dead copy of itself and a second entry
-- in each of its table's four indexes, ~400 bytes a claim (BENCHMARKS.md).
CREATE TABLE IF NOT EXISTS outbox_published (
    upto_id      BIGINT PRIMARY KEY CHECK (upto_id > 0),
    published_at TEXT   NOT NULL
);
DROP INDEX IF EXISTS outbox_unpublished;

-- One row per dead-lettered stream entry.
CREATE TABLE IF NOT EXISTS dead_letters (
    stream          TEXT    NOT NULL,
    stream_entry_id TEXT    NOT NULL,
    reason_code     TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    award_id        TEXT,
    delivery_count  BIGINT  NOT NULL,
    recorded_at     TEXT    NOT NULL,
    PRIMARY KEY (stream, stream_entry_id)
);
-- A reviewer's decision on a conflict held for review, as on SQLite (schema.sql says what the
-- columns mean); added in format 3.
ALTER TABLE dead_letters
    ADD COLUMN IF NOT EXISTS decision       TEXT,
    ADD COLUMN IF NOT EXISTS decided_by     TEXT,
    ADD COLUMN IF NOT EXISTS decided_reason TEXT,
    ADD COLUMN IF NOT EXISTS decided_at     TEXT;

-- The audit records sealed one by one (src/domain/audit.rs), seq from chain_head: those of
-- earlier releases and of ledgers `migrate` copied, and a retention purge's checkpoint.
CREATE TABLE IF NOT EXISTS audit_chain (
    seq             BIGINT  PRIMARY KEY,
    kind            TEXT    NOT NULL,
    idempotency_key BYTEA,
    award_id        TEXT,
    amount_cents    BIGINT,
    stream_entry_id TEXT,
    consumer        TEXT,
    delivery_count  BIGINT,
    detail          TEXT,
    recorded_at     TEXT    NOT NULL,
    prev_hash       BYTEA   NOT NULL,
    hash            BYTEA   NOT NULL
);
-- No index but the seq and the partial one of dead letters below: as on SQLite. The first
-- release indexed `processed` records by key, but nothing looks one up by key (verify joins
-- whole tables, purge reads seq ranges), and that index was written under the chain-head lock,
-- one random-keyed entry per submission.
DROP INDEX IF EXISTS audit_processed_key;

-- One row per batch: written with the batch (its member count, its last member's hash, how
-- many outbox rows it wrote), then given its place in the chain by `claimgate_link` (the
-- columns from link_seq on, all at once). Its link record, as an audit export shows it, is
-- made of these columns: kind `batch`, seq `link_seq` (its last member's), detail
-- `claimgate_link_detail(..)`, recorded at `linked_at`, sealed after `prev_hash` into `hash`.
CREATE TABLE IF NOT EXISTS audit_batches (
    batch_id     BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    record_count INTEGER NOT NULL CHECK (record_count > 0),
    -- Spelled into the link's hashed JSON by `claimgate_link`: nothing but hex may be here.
    last_hash    TEXT    NOT NULL CHECK (last_hash ~ '^[0-9a-f]{64}$'),
    outbox_count INTEGER NOT NULL CHECK (outbox_count >= 0),
    created_at   TEXT    NOT NULL,
    link_seq     BIGINT  UNIQUE,
    outbox_first BIGINT,
    linked_at    TEXT,
    prev_hash    TEXT,
    hash         TEXT,
    CONSTRAINT audit_batches_linked_whole CHECK (
        (link_seq IS NULL) = (outbox_first IS NULL) AND (link_seq IS NULL) = (linked_at IS NULL)
        AND (link_seq IS NULL) = (prev_hash IS NULL) AND (link_seq IS NULL) = (hash IS NULL))
);

-- What a batch adds to the ledger's counts (`chain_head`, below), written with the batch and
-- added by its link in the head's own update, so the counts of a linked ledger move exactly
-- when, and only if, a link commits; added in format 4. Its claims and disbursements are its
-- `outbox_count` (one of each per outbox row); its records, `record_count`. The rest: the sum
-- of its disbursements' cents (NUMERIC: exact at any size), how many dead letters it inserted
-- (one `dead_letter` record each) and its `duplicate`, `conflict` and `vanished` records. NULL
-- in a batch an earlier release wrote: `claimgate_link` counts those from its rows, once.
ALTER TABLE audit_batches
    ADD COLUMN IF NOT EXISTS disbursed_cents NUMERIC CHECK (disbursed_cents >= 0),
    ADD COLUMN IF NOT EXISTS dead_letters    INTEGER CHECK (dead_letters >= 0),
    ADD COLUMN IF NOT EXISTS duplicates      INTEGER CHECK (duplicates >= 0),
    ADD COLUMN IF NOT EXISTS conflicts       INTEGER CHECK (conflicts >= 0),
    ADD COLUMN IF NOT EXISTS vanished        INTEGER CHECK (vanished >= 0);

-- A batch's audit records, as written: each hashed after the one before it in the batch (the
-- first after the genesis hash) with its place in the batch as its seq (src/domain/audit.rs).
-- Its seq in the chain is its batch's link_seq - record_count + batch_index.
CREATE TABLE IF NOT EXISTS audit_members (
    batch_id        BIGINT  NOT NULL,
    batch_index     INTEGER NOT NULL CHECK (batch_index > 0),
    kind            TEXT    NOT NULL,
    idempotency_key BYTEA,
    award_id        TEXT,
    amount_cents    BIGINT,
    stream_entry_id TEXT,
    consumer        TEXT,
    delivery_count  BIGINT,
    detail          TEXT,
    recorded_at     TEXT    NOT NULL,
    prev_hash       BYTEA   NOT NULL,
    hash            BYTEA   NOT NULL,
    PRIMARY KEY (batch_id, batch_index)
);

-- An audit record's key and digests are stored as their 32 bytes (format 6), as on SQLite and
-- as `processed_messages` has always stored a claim's key: 96 bytes a record less than their
-- hex. Every reader shows, exports and hashes them as lowercase hex, so nothing a record means
-- changed (src/ledger/postgres/audit_store.rs). A ledger of an earlier format stored hex text:
-- each table is rewritten here, once (`claimgate init`, every node stopped). A value that is
-- not 64 lowercase hex digits is not one claimgate wrote (its chain already fails `verify`):
-- the upgrade refuses, naming the record, and changes nothing, rather than turn an edit into
-- bytes that might verify (an uppercased digest would decode to the true one). The view
-- `audit_log` names the columns, so it is dropped first and made again below.
DO $$
DECLARE
    t TEXT;
    bad TEXT;
BEGIN
    FOREACH t IN ARRAY ARRAY['audit_chain', 'audit_members'] LOOP
        IF (SELECT atttypid FROM pg_attribute WHERE attrelid = to_regclass(t) AND attname = 'hash')
           = 'text'::regtype THEN
            EXECUTE format(
                -- Lengths, then any character outside the class: 15 times faster than one
                -- anchored pattern a column (0.7 s against 10 s for 1,000,000 members).
                'SELECT %s FROM %I
                 WHERE octet_length(idempotency_key) <> 64 OR octet_length(prev_hash) <> 64
                    OR octet_length(hash) <> 64 OR idempotency_key ~ ''[^0-9a-f]''
                    OR prev_hash ~ ''[^0-9a-f]'' OR hash ~ ''[^0-9a-f]''
                 ORDER BY %s LIMIT 1',
                CASE t WHEN 'audit_chain' THEN '''seq '' || seq'
                       ELSE '''member '' || batch_index || '' of batch '' || batch_id' END,
                t,
                CASE t WHEN 'audit_chain' THEN 'seq' ELSE 'batch_id, batch_index' END) INTO bad;
            IF bad IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'CGL02', MESSAGE = format(
                    'audit record %s holds a key or digest that is not 64 lowercase hex digits, '
                    'as claimgate never writes one (edited?): nothing was upgraded; the release '
                    'that made this ledger names the change with `claimgate verify`', bad);
            END IF;
            DROP VIEW IF EXISTS audit_log;
            EXECUTE format(
                'ALTER TABLE %I
                     ALTER COLUMN idempotency_key TYPE BYTEA USING decode(idempotency_key, ''hex''),
                     ALTER COLUMN prev_hash TYPE BYTEA USING decode(prev_hash, ''hex''),
                     ALTER COLUMN hash TYPE BYTEA USING decode(hash, ''hex'')',
                t);
        END IF;
    END LOOP;
END;
$$;

-- Partial indexes, created only where missing: `CREATE INDEX IF NOT EXISTS` takes a SHARE lock
-- on its table even when the index is there, so at every node's start it would wait for the
-- batches in flight and stall every other node's writers behind it.
-- * audit_dead_letters, audit_member_dead_letters: the dead-letter records, and only those.
--   Dead-letter reconciliation reads them before a worker behind Sentinel reads and after
--   every failover (src/ops/reconcile.rs); it must not walk the whole trail for them. No entry
--   is written for any other record. A ledger from before them gets them at the first start,
--   in one pass over the trail.
-- * audit_batches_unlinked: the batches `claimgate_link` places (few: it runs after every
--   batch).
-- * audit_batches_outbox: linked batches with outbox rows, by the id after their last row, so
--   the relay finds the rows above its position in one index range.
-- * dead_letters_awaiting_review: the conflicts held for review no reviewer has decided yet,
--   oldest first, which `status` lists and each `/metrics` scrape counts (its predicate is
--   src/ledger/review.rs's AWAITING_REVIEW); added in format 6.
DO $$
BEGIN
    IF to_regclass('audit_dead_letters') IS NULL THEN
        CREATE INDEX audit_dead_letters ON audit_chain (seq) WHERE kind = 'dead_letter';
    END IF;
    IF to_regclass('audit_member_dead_letters') IS NULL THEN
        CREATE INDEX audit_member_dead_letters ON audit_members (batch_id, batch_index)
            WHERE kind = 'dead_letter';
    END IF;
    IF to_regclass('audit_batches_unlinked') IS NULL THEN
        CREATE INDEX audit_batches_unlinked ON audit_batches (batch_id) WHERE link_seq IS NULL;
    END IF;
    IF to_regclass('audit_batches_outbox') IS NULL THEN
        CREATE INDEX audit_batches_outbox ON audit_batches ((outbox_first + outbox_count))
            WHERE link_seq IS NOT NULL AND outbox_count > 0;
    END IF;
    IF to_regclass('dead_letters_awaiting_review') IS NULL THEN
        CREATE INDEX dead_letters_awaiting_review
            ON dead_letters (stream, recorded_at, stream_entry_id)
            WHERE reason_code = 'conflict_hold' AND decision IS NULL;
    END IF;
END;
$$;

-- The chain's head: the one row every link locks (`claimgate_link`); besides links only
-- `migrate` and `claimgate_recount` write it. `seq` and `hash` are the last
-- record's (for a checkpoint, the hash it continues from, as SQLite's tail read does);
-- `outbox_id_last` only grows, so outbox ids are never reused, not even after a purge.
CREATE TABLE IF NOT EXISTS chain_head (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    seq            BIGINT  NOT NULL,
    hash           TEXT    NOT NULL,
    outbox_id_last BIGINT  NOT NULL
);
INSERT INTO chain_head (id, seq, hash, outbox_id_last)
    VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000', 0)
    ON CONFLICT (id) DO NOTHING;

-- The ledger's counts, what `Ledger::stats` reports (status, /metrics, /healthz), kept where
-- they change instead of counted on every call; added in format 4. They count the *linked*
-- ledger: the records of the chain, the claims, disbursements and dead letters of linked
-- batches (and the rows an earlier release or `migrate` stored with their ids), the
-- tombstones. `claimgate_link` adds its batch's counts (`audit_batches`, above) in the update
-- that moves the head, so they commit with the link: a server crash that takes a link back
-- takes its counts back with it, and a batch not linked yet is counted when it is. Retention
-- purges take theirs off in `purge_counts` (below), so a purge never waits for the head, nor
-- a link for a purge. `stats` reads both rows; `verify` compares them with the rows
-- (`claimgate_counted`); `claimgate_recount` sets them from the rows.
ALTER TABLE chain_head
    ADD COLUMN IF NOT EXISTS claims                BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS disbursements         BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS disbursed_cents_total NUMERIC NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS dead_letters          BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS duplicates            BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS conflicts             BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS vanished              BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS audit_records         BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS tombstones            BIGINT  NOT NULL DEFAULT 0;

-- What retention purges changed in those counts (claims, disbursements, cents, dead letters
-- and records taken off; tombstones and checkpoints added), written by each purge batch in its
-- own transaction: one row of its own, since purges run one at a time (the purge lock) and
-- must not hold the head, which a link waits for, across their durable commits. The counts
-- are `chain_head`'s plus these.
CREATE TABLE IF NOT EXISTS purge_counts (
    id                    INTEGER PRIMARY KEY CHECK (id = 1),
    claims                BIGINT  NOT NULL DEFAULT 0,
    disbursements         BIGINT  NOT NULL DEFAULT 0,
    disbursed_cents_total NUMERIC NOT NULL DEFAULT 0,
    dead_letters          BIGINT  NOT NULL DEFAULT 0,
    duplicates            BIGINT  NOT NULL DEFAULT 0,
    conflicts             BIGINT  NOT NULL DEFAULT 0,
    vanished              BIGINT  NOT NULL DEFAULT 0,
    audit_records         BIGINT  NOT NULL DEFAULT 0,
    tombstones            BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO purge_counts (id) VALUES (1) ON CONFLICT (id) DO NOTHING;

-- The claim locks: one row per stripe of (submission instant, award) groups, 65,536 of them
-- (CLAIM_STRIPES in src/ledger/postgres/batch.rs). A batch locks the rows of the groups it
-- claims in (FOR UPDATE, or FOR UPDATE SKIP LOCKED to defer what another batch holds), so
-- what it reads of those groups is exact until it commits. Row locks live in the rows, not in
-- the server's shared lock table: a batch of any size takes the same few heavyweight locks,
-- where one advisory lock per group filled a stock server's table. Never updated or deleted.
CREATE TABLE IF NOT EXISTS claim_locks (
    stripe INTEGER PRIMARY KEY CHECK (stripe >= 0 AND stripe < 65536)
);
INSERT INTO claim_locks (stripe) SELECT generate_series(0, 65535) ON CONFLICT DO NOTHING;

-- Facts about this ledger: `ledger_id`, random, created by the first relay; `format_version`,
-- written with the schema (src/ledger/postgres/schema.rs).
CREATE TABLE IF NOT EXISTS ledger_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Awards under legal hold.
CREATE TABLE IF NOT EXISTS legal_holds (
    award_id TEXT PRIMARY KEY,
    reason   TEXT NOT NULL,
    held_at  TEXT NOT NULL
);

-- `verify` reads outbox payloads as JSON; a payload that is not JSON (an edited row) must be
-- named as a violation, not abort the check, and PostgreSQL 15 has no non-raising cast.
CREATE OR REPLACE FUNCTION claimgate_json(t TEXT) RETURNS JSONB
    LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN t::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END;
$$;

-- The event announcing a claim, spelled as src/domain/event.rs spells it (`announcing`): the
-- fields in alphabetical order, no spaces, the key in lowercase hex, and strings escaped as
-- serde_json escapes them. `to_json` escapes the same characters the same way (", \, \b, \f,
-- \n, \r, \t, every other control character as \u00xx in lowercase hex, nothing else), and
-- tests/it/shared_ledger.rs holds the two spellings to each other on every character that
-- matters. STABLE, as `to_json` is, so a query that calls it has it inlined.
CREATE OR REPLACE FUNCTION claimgate_event(
    award_id TEXT, amount_cents BIGINT, idempotency_key BYTEA, submission_timestamp TEXT)
    RETURNS TEXT LANGUAGE sql STABLE AS $$
    SELECT '{"amount_cents":' || amount_cents || ',"award_id":' || to_json(award_id)::text
           || ',"idempotency_key":"' || encode(idempotency_key, 'hex')
           || '","submission_timestamp":' || to_json(submission_timestamp)::text || '}'
$$;

-- Every disbursement and outbox row names an existing claim, and no claim they name can be
-- deleted or renumbered: what FOREIGN KEY ... REFERENCES processed_messages (claim_id) said
-- in ledgers made by earlier releases (dropped from them below), checked once per statement
-- over its transition table instead of once per row. One thing a foreign key does that these
-- do not: lock the claim row, so that a transaction referencing an existing, committed claim
-- and another deleting that claim at the same moment cannot both commit. claimgate never
-- does the first (a batch references only the claims it inserts itself, which no other
-- transaction can see until it commits), and `verify` names any orphan row either way.
CREATE OR REPLACE FUNCTION claimgate_rows_name_claims() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    orphan BIGINT;
BEGIN
    -- One primary-key probe per row (LATERAL ... LIMIT 1 is never turned into a join that
    -- scans the claims, whatever the planner guesses about the transition table's size).
    SELECT n.claim_id INTO orphan FROM claimgate_new n
    LEFT JOIN LATERAL (
        SELECT true AS found FROM processed_messages p WHERE p.claim_id = n.claim_id LIMIT 1
    ) p ON true
    WHERE p.found IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '% row refers to claim %, which does not exist', TG_TABLE_NAME, orphan
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION claimgate_claims_unnamed() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    named BIGINT;
BEGIN
    SELECT o.claim_id INTO named FROM claimgate_old o
    WHERE NOT EXISTS (SELECT 1 FROM processed_messages p WHERE p.claim_id = o.claim_id)
      AND (EXISTS (SELECT 1 FROM disbursements d WHERE d.claim_id = o.claim_id)
           OR EXISTS (SELECT 1 FROM outbox_rows x WHERE x.claim_id = o.claim_id))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'claim % is still named by its disbursement or outbox row', named
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$;

-- Created, and the old foreign keys dropped, only where missing: CREATE OR REPLACE TRIGGER
-- and ALTER TABLE lock the table against writers, and this file runs at every node's start.
DO $$
DECLARE
    t RECORD;
BEGIN
    FOR t IN SELECT * FROM (VALUES
        ('disbursements', 'claimgate_claim_on_insert', 'INSERT', 'NEW', 'claimgate_rows_name_claims'),
        ('disbursements', 'claimgate_claim_on_update', 'UPDATE', 'NEW', 'claimgate_rows_name_claims'),
        ('outbox_rows', 'claimgate_claim_on_insert', 'INSERT', 'NEW', 'claimgate_rows_name_claims'),
        ('outbox_rows', 'claimgate_claim_on_update', 'UPDATE', 'NEW', 'claimgate_rows_name_claims'),
        ('processed_messages', 'claimgate_named_on_delete', 'DELETE', 'OLD', 'claimgate_claims_unnamed'),
        ('processed_messages', 'claimgate_named_on_update', 'UPDATE', 'OLD', 'claimgate_claims_unnamed')
    ) AS v(tab, name, event, side, func)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgrelid = t.tab::regclass AND tgname = t.name) THEN
            EXECUTE format(
                'CREATE TRIGGER %I AFTER %s ON %I REFERENCING %s TABLE AS claimgate_%s '
                'FOR EACH STATEMENT EXECUTE FUNCTION %I()',
                t.name, t.event, t.tab, t.side, lower(t.side), t.func);
        END IF;
    END LOOP;
    FOR t IN SELECT c.conrelid::regclass AS tab, c.conname AS name FROM pg_constraint c
             WHERE c.contype = 'f' AND c.confrelid = 'processed_messages'::regclass
               AND c.conrelid IN ('disbursements'::regclass, 'outbox_rows'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', t.tab, t.name);
    END LOOP;
END;
$$;

-- A batch's link detail, spelled exactly as `detail::batch_link` spells it in
-- src/domain/audit.rs: the link's hash covers it, and every `verify` recomputes that hash in
-- Rust from these same columns, so a spelling that drifted apart would fail every check.
CREATE OR REPLACE FUNCTION claimgate_link_detail(
    batch_id BIGINT, records INTEGER, last_hash TEXT, outbox_rows INTEGER, outbox_first BIGINT)
    RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT 'batch ' || batch_id || ': ' || records || ' records, last ' || last_hash || '; '
           || outbox_rows || ' outbox rows from id ' || outbox_first
$$;

-- Every audit record, with its seq, as on SQLite (see the top of this file). Members of a
-- batch not linked yet have no seq (and `batch_id` says which batch); `batch_index` is set
-- for batch members. The links are not records: `audit_batches` holds them. Created only
-- where missing; a release that changes a view replaces it (as `outbox`, below), which is
-- safe because this script runs only where a ledger is made or upgraded, all nodes stopped.
DO $$
BEGIN
    IF to_regclass('audit_log') IS NULL THEN
        CREATE VIEW audit_log AS
        SELECT seq, kind, idempotency_key, award_id, amount_cents, stream_entry_id, consumer,
               delivery_count, detail, recorded_at, prev_hash, hash,
               NULL::integer AS batch_index, NULL::bigint AS batch_id
        FROM audit_chain
        UNION ALL
        SELECT b.link_seq - b.record_count + m.batch_index, m.kind, m.idempotency_key,
               m.award_id, m.amount_cents, m.stream_entry_id, m.consumer, m.delivery_count,
               m.detail, m.recorded_at, m.prev_hash, m.hash, m.batch_index, m.batch_id
        FROM audit_members m LEFT JOIN audit_batches b ON b.batch_id = m.batch_id;
    END IF;
END;
$$;

-- Every outbox row with its id (none yet for a batch not linked), its event (stored, or spelled
-- from its claim: `claimgate_event`; none if the claim is gone, which `verify` names) and when
-- it was published: its own mark, else the first publication at or above its id
-- (`outbox_published`). Replaced, not only made where missing: format 5 changed where the
-- event and `published_at` come from.
CREATE OR REPLACE VIEW outbox AS
SELECT x.id, x.claim_id, x.event_type, x.payload, x.created_at,
       COALESCE(x.published_at,
                (SELECT p.published_at FROM outbox_published p
                 WHERE p.upto_id >= x.id ORDER BY p.upto_id LIMIT 1)) AS published_at,
       x.batch_id, x.batch_index
FROM (SELECT COALESCE(o.id, b.outbox_first + o.batch_index - 1) AS id, o.claim_id,
             COALESCE(o.event_type, 'disbursement.recorded') AS event_type,
             COALESCE(o.payload, claimgate_event(c.award_id, c.amount_cents, c.idempotency_key,
                                                 c.submission_timestamp)) AS payload,
             o.created_at, o.published_at, o.batch_id, o.batch_index
      FROM outbox_rows o LEFT JOIN audit_batches b ON b.batch_id = o.batch_id
      LEFT JOIN processed_messages c ON c.claim_id = o.claim_id) x;

-- The rows an earlier format marked published one by one (or `migrate` copied with their
-- marks), recorded as one publication where none is recorded yet: every row below the first
-- one not marked (relays marked in id order), at the last of their times. Run below, where
-- this script upgrades a ledger, and by `migrate` once it has copied the rows
-- (src/ledger/postgres/load.rs); it changes nothing on a ledger that records a publication.
CREATE OR REPLACE FUNCTION claimgate_note_published() RETURNS void
    LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO outbox_published (upto_id, published_at)
    SELECT u.upto, (SELECT MAX(published_at) FROM outbox WHERE id <= u.upto)
    FROM (SELECT COALESCE((SELECT MIN(id) FROM outbox WHERE id IS NOT NULL AND published_at IS NULL) - 1,
                          (SELECT MAX(id) FROM outbox)) AS upto) u
    WHERE u.upto > 0
      AND EXISTS (SELECT 1 FROM outbox WHERE id <= u.upto AND published_at IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM outbox_published);
$$;
SELECT claimgate_note_published();

-- The ledger's counts as its rows give them, in the caller's snapshot: what `chain_head` and
-- `purge_counts` together must hold (`verify` compares them, `claimgate_recount` sets them).
-- The linked ledger (see `chain_head`): every row, less what batches not linked yet wrote —
-- their claims (one per outbox row), those claims' disbursements and cents, their dead letters
-- (one per `dead_letter` record) — and every record of the chain, the members of linked
-- batches only. One pass over each table.
CREATE OR REPLACE FUNCTION claimgate_counted()
    RETURNS TABLE (claims BIGINT, disbursements BIGINT, disbursed_cents_total NUMERIC,
                   dead_letters BIGINT, duplicates BIGINT, conflicts BIGINT, vanished BIGINT,
                   audit_records BIGINT, tombstones BIGINT)
    LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    WITH unlinked AS (
        SELECT o.claim_id FROM audit_batches b
        JOIN outbox_rows o ON o.batch_id = b.batch_id WHERE b.link_seq IS NULL),
    u AS (
        SELECT COUNT(*) AS claims, COUNT(d.claim_id) AS disbursements,
               COALESCE(SUM(d.amount_cents), 0) AS cents
        FROM unlinked LEFT JOIN disbursements d ON d.claim_id = unlinked.claim_id),
    ud AS (
        SELECT COUNT(*) AS n FROM audit_batches b
        JOIN audit_members m ON m.batch_id = b.batch_id
        WHERE b.link_seq IS NULL AND m.kind = 'dead_letter'),
    d AS (SELECT COUNT(*) AS n, COALESCE(SUM(amount_cents), 0) AS cents FROM disbursements),
    a AS (
        SELECT COUNT(*) AS n,
               COUNT(*) FILTER (WHERE kind = 'duplicate') AS duplicates,
               COUNT(*) FILTER (WHERE kind = 'conflict') AS conflicts,
               COUNT(*) FILTER (WHERE kind = 'vanished') AS vanished
        FROM audit_chain),
    m AS (
        SELECT COUNT(*) AS n,
               COUNT(*) FILTER (WHERE m.kind = 'duplicate') AS duplicates,
               COUNT(*) FILTER (WHERE m.kind = 'conflict') AS conflicts,
               COUNT(*) FILTER (WHERE m.kind = 'vanished') AS vanished
        FROM audit_members m JOIN audit_batches b ON b.batch_id = m.batch_id
        WHERE b.link_seq IS NOT NULL)
    SELECT (SELECT COUNT(*) FROM processed_messages) - u.claims, d.n - u.disbursements,
           d.cents - u.cents, (SELECT COUNT(*) FROM dead_letters) - ud.n,
           a.duplicates + m.duplicates, a.conflicts + m.conflicts, a.vanished + m.vanished,
           a.n + m.n, (SELECT COUNT(*) FROM claim_tombstones)
    FROM u, ud, d, a, m
$$;

-- Sets the stored counts to what the rows give (`claimgate_counted`): at the end of this
-- script (a ledger made, or upgraded from a format that kept none: counted once), after
-- `migrate`'s copy, and by hand, as the ledger's owner, when `verify` finds a count that
-- disagrees (`SELECT claimgate_recount()`). It takes the head first, then the purge row, so
-- no link or purge batch can commit between the count and the write: a link waiting for the
-- head adds its batch after (its batch was not linked in the count's snapshot), and so does a
-- purge batch waiting for its row. Links wait for it for as long as the count takes.
CREATE OR REPLACE FUNCTION claimgate_recount() RETURNS void
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c RECORD;
BEGIN
    PERFORM 1 FROM chain_head WHERE id = 1 FOR UPDATE;
    PERFORM 1 FROM purge_counts WHERE id = 1 FOR UPDATE;
    -- A statement of its own, so (at READ COMMITTED) a snapshot taken with both rows held.
    SELECT * INTO c FROM claimgate_counted();
    UPDATE chain_head SET claims = c.claims, disbursements = c.disbursements,
        disbursed_cents_total = c.disbursed_cents_total, dead_letters = c.dead_letters,
        duplicates = c.duplicates, conflicts = c.conflicts, vanished = c.vanished,
        audit_records = c.audit_records, tombstones = c.tombstones
    WHERE id = 1;
    UPDATE purge_counts SET claims = 0, disbursements = 0, disbursed_cents_total = 0,
        dead_letters = 0, duplicates = 0, conflicts = 0, vanished = 0, audit_records = 0,
        tombstones = 0
    WHERE id = 1;
END;
$$;

-- Links one committed batch not linked yet into the chain, at `at` (the ledger's time format,
-- checked: it is spelled into hashed JSON): the batch `mine` (a writer's own, just committed),
-- or, with `mine` NULL, the oldest one no writer is linking (those a writer that stopped left
-- behind: a node's start and a relay round call this until it links none, batch.rs `link`).
-- The batch's members take the seqs after the head's and its link the last of them, its outbox
-- rows the ids after the head's, and the link's hash is sealed after the head exactly as
-- `Record::seal` seals it; then the head moves past them, with the batch's counts added to the
-- ledger's (`chain_head`).
--
-- The head is taken last, by compare-and-set, so its row lock is held only for its own update
-- and the commit: (1) the batch's row is locked (a writer's own waits for a round that holds
-- it; a round skips the rows writers hold: they link them); (2) the head is read without a
-- lock; (3) the batch's row is given its place after it; (4) the head is moved from exactly
-- what was read to past the batch, or, if another link moved it in between (or gave the same
-- seq first), (3) is rolled back (a subtransaction) and the call starts again from (2). A try
-- lost means another link was made, so links always go forward. No call waits while it holds
-- the head: (1) and (3) come before it, and a call that finds the head held waits for a commit
-- that waits for nothing. A head set back under the chain makes (3) collide with a seq given
-- before, try after try: that is raised, as a link error, not retried. One batch per call, so
-- a round with many never holds the head across them, nor loses every try to the writers.
--
-- Called as one statement outside any transaction (src/ledger/postgres/batch.rs), so the
-- chain-head row lock is held until the statement's own commit only; and that commit does not
-- wait for its WAL to reach the disk (synchronous_commit off, for this transaction alone), so
-- the lock is never held across a disk write. That is safe because a link is derived: the
-- batch it places committed durably before, a link lost in a server crash leaves its batch
-- unlinked (every later link is lost with it: WAL is replayed in order), and the next link
-- places it again; and whatever leaves the database with what a link decided (an event id,
-- an anchor's head, an export) is made durable first (`make_durable`,
-- src/ledger/postgres/mod.rs). Seqs and outbox ids still become visible in the order given: a
-- link that gives later ones moves the head from where this one left it, so it commits only
-- after this one has. Returns how many batches it linked (0 or 1), how long it took before the
-- try that moved the head and how long that try held it until its work was done, in
-- microseconds. A batch another call linked first is not linked again (READ COMMITTED: each
-- statement sees every link committed before it).
CREATE OR REPLACE FUNCTION claimgate_link(at TEXT, mine BIGINT)
    RETURNS TABLE (linked INTEGER, waited_us BIGINT, held_us BIGINT)
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    began TIMESTAMPTZ := clock_timestamp();
    locked TIMESTAMPTZ;
    batch BIGINT;
    uncounted BOOLEAN;
    h RECORD;
    n RECORD;
BEGIN
    IF at !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$' THEN
        RAISE EXCEPTION 'claimgate_link: % is not a ledger time', at;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Each statement below finds rows by their key: planned once per connection, not on
    -- every call (claimgate's connections plan every other statement afresh, connect.rs).
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    -- (1) The batch's row. A writer's own by its key; else the oldest not linked whose row no
    -- writer holds (the one query that reads the index of unlinked batches, full of dead
    -- entries between vacuums: every link updates a row out of it).
    IF mine IS NOT NULL THEN
        SELECT a.batch_id, a.dead_letters IS NULL INTO batch, uncounted FROM audit_batches a
        WHERE a.batch_id = mine AND a.link_seq IS NULL FOR UPDATE;
    ELSE
        SELECT a.batch_id, a.dead_letters IS NULL INTO batch, uncounted FROM audit_batches a
        WHERE a.link_seq IS NULL ORDER BY a.batch_id LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    IF batch IS NULL THEN
        RETURN QUERY SELECT 0, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    -- A batch an earlier release wrote carries no counts: counted from its rows, by their
    -- keys, before the head is taken (the batch's row is held: its rows cannot change).
    IF uncounted THEN
        UPDATE audit_batches a SET
            disbursed_cents = (SELECT COALESCE(SUM(d.amount_cents), 0) FROM outbox_rows o
                               JOIN disbursements d ON d.claim_id = o.claim_id
                               WHERE o.batch_id = batch),
            dead_letters = (SELECT COUNT(*) FROM audit_members m
                            WHERE m.batch_id = batch AND m.kind = 'dead_letter'),
            duplicates = (SELECT COUNT(*) FROM audit_members m
                          WHERE m.batch_id = batch AND m.kind = 'duplicate'),
            conflicts = (SELECT COUNT(*) FROM audit_members m
                         WHERE m.batch_id = batch AND m.kind = 'conflict'),
            vanished = (SELECT COUNT(*) FROM audit_members m
                        WHERE m.batch_id = batch AND m.kind = 'vanished')
        WHERE a.batch_id = batch;
    END IF;
    LOOP
        BEGIN
            -- (2) The head, as it is now.
            SELECT c.seq, c.hash, c.outbox_id_last INTO h FROM chain_head c WHERE c.id = 1;
            -- (3) The batch's place after it. The link record's canonical JSON, as
            -- `Record::canonical_json` spells a record of kind `batch` (src/domain/audit.rs),
            -- its detail from `claimgate_link_detail` (an SQL function the planner inlines;
            -- nothing in it needs JSON escaping: digits, hex and words).
            UPDATE audit_batches b SET
                link_seq = h.seq + b.record_count,
                outbox_first = h.outbox_id_last + 1,
                linked_at = at,
                prev_hash = h.hash,
                hash = encode(sha256(convert_to(format(
                    '%s{"seq":%s,"kind":"batch","idempotency_key":null,"award_id":null,'
                    '"amount_cents":null,"stream_entry_id":null,"consumer":null,'
                    '"delivery_count":null,"detail":"%s","recorded_at":"%s","prev_hash":"%s",'
                    '"hash":""}',
                    h.hash, h.seq + b.record_count,
                    claimgate_link_detail(b.batch_id, b.record_count, b.last_hash,
                                          b.outbox_count, h.outbox_id_last + 1),
                    at, h.hash), 'UTF8')), 'hex')
            WHERE b.batch_id = batch
            RETURNING b.link_seq, b.hash, b.outbox_count, b.record_count, b.disbursed_cents,
                      b.dead_letters, b.duplicates, b.conflicts, b.vanished INTO n;
            -- (4) The head moved from what was read, the batch's counts added to the ledger's
            -- (a few more columns of the same row update); held from here to the commit.
            locked := clock_timestamp();
            UPDATE chain_head c SET seq = n.link_seq, hash = n.hash,
                outbox_id_last = h.outbox_id_last + n.outbox_count,
                claims = c.claims + n.outbox_count,
                disbursements = c.disbursements + n.outbox_count,
                disbursed_cents_total = c.disbursed_cents_total + n.disbursed_cents,
                dead_letters = c.dead_letters + n.dead_letters,
                duplicates = c.duplicates + n.duplicates,
                conflicts = c.conflicts + n.conflicts,
                vanished = c.vanished + n.vanished,
                audit_records = c.audit_records + n.record_count
            WHERE c.id = 1 AND c.seq = h.seq AND c.hash = h.hash;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'CGL01', MESSAGE = 'the chain head moved';
            END IF;
            EXIT;
        EXCEPTION
            -- Another link moved the head first: again from (2).
            WHEN SQLSTATE 'CGL01' THEN
                NULL;
            -- Another link gave this seq first, and so moved the head since (2): again. A seq
            -- taken while the head is still where it was read is a ledger edited under the
            -- chain (a head set back): no try can pass it, so it is an error, not a loop.
            WHEN unique_violation THEN
                IF (SELECT c.seq FROM chain_head c WHERE c.id = 1) = h.seq THEN
                    RAISE;
                END IF;
        END;
    END LOOP;
    RETURN QUERY SELECT 1,
        (extract(epoch FROM locked - began) * 1000000)::bigint,
        (extract(epoch FROM clock_timestamp() - locked) * 1000000)::bigint;
END;
$$;

-- The counts set from the rows, once, where this script made the ledger or upgraded one of a
-- format that kept none (it runs only then: src/ledger/postgres/schema.rs).
SELECT claimgate_recount();
