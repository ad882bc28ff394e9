//! Finding the ledger in its schema, and making or upgrading it: the only place the
//! PostgreSQL ledger runs DDL.
//!
//! A command finds the ledger where it was made — in the schema its URL pins
//! (`connect.rs`) — or stops, exit 2, saying what it found instead. Only an open that may
//! create (`LedgerConfig::create`: `run`, `relay`, `init`, `migrate`'s target) ever creates
//! or changes objects, and then only
//! - to make a ledger in a schema that holds no table, view or sequence at all but an
//!   extension's (a schema of its own, or `public` with at most `pg_stat_statements` and the
//!   like in it), never beside someone else's objects, and never, when the
//!   URL names no schema, while another schema of the database holds a claimgate ledger (that
//!   one would be abandoned and every submission paid again into the new one); or
//! - to upgrade a ledger of an earlier format.
//!
//! Every other open — and a creating one on a ledger of today's format — runs no DDL at all,
//! so an auditor role with `SELECT` alone can run `verify`, `status` and the `audit` commands,
//! and a worker role with no `CREATE` anywhere can run `run`.
//!
//! The format is a number in `ledger_meta` (`format_version`), written by the script that made
//! or upgraded the ledger, in the same transaction. A ledger without one was made by a release
//! before formats were recorded: format 1.

use super::connect::Target;
use crate::error::{Error, Fault, Result};
use postgres::Client;

/// The format this build makes and reads. 1: every ledger of a release before the format was
/// recorded. 2: the format was recorded, every function pins the schema it was made in, and
/// batches lock stripes of `claim_locks` rather than one advisory lock per group. 3:
/// `dead_letters` records reviewers' decisions on held conflicts (`ledger::review`). 4: the
/// ledger keeps its own counts (`chain_head`'s counters, `purge_counts`, each batch's counts in
/// its `audit_batches` row), which every writer of this format keeps right and a build of an
/// earlier one would not: it refuses a format-4 ledger at open. Upgraded to, the counts are
/// counted once from the rows. 5: outbox rows are written once: publication is recorded per
/// relay round in `outbox_published`, not per row (`outbox.rs`), and a batch's rows store no
/// event (spelled from the claim, `claimgate_event`); a build of format 4 would mark rows one
/// by one where no reader of format 5 looks, and read a NULL event. Upgraded to, the rows
/// marked so far become one publication (`claimgate_note_published`), the index of
/// unpublished rows is dropped, and the rows already written keep their events. 6: an audit
/// record's key and digests are stored as their 32 bytes (`audit_store::Stored`), not as hex
/// text, which a build of format 5 would write and read. Upgraded to, `audit_chain` and
/// `audit_members` are rewritten once, and the upgrade refuses a value that is not 64
/// lowercase hex digits rather than convert it. Format 6 also makes the partial index of the
/// conflicts awaiting review (`dead_letters_awaiting_review`), which format 5 lacks.
pub const FORMAT_VERSION: i64 = 6;

/// The schema script: makes the ledger, or brings one of an earlier format up to this one.
pub const SCHEMA: &str = include_str!("../../../schema_postgres.sql");

/// The SQLSTATE the schema script raises when an upgrade meets a value claimgate never
/// writes (an audit digest that is not lowercase hex): the ledger was edited, not the role
/// short of a privilege, so the refusal is an invariant (exit 1), not configuration.
const EDITED: &str = "CGL02";

/// The advisory lock (two-key form, so it never meets anything else claimgate locks) held
/// while the schema is made or upgraded, so nodes starting together neither race on
/// `CREATE TABLE` nor see a half-made schema.
const SCHEMA_LOCK: (i32, i32) = (0x636c_6169, 1);

/// What a look at the database found.
#[derive(Debug, Default)]
struct Found {
    /// Whether the pinned schema exists.
    schema_exists: bool,
    /// The format of the ledger in the pinned schema (1 when it records none), if one is there.
    ledger: Option<i64>,
    /// Tables, views and sequences in the pinned schema that are not a claimgate ledger's:
    /// a few names, for the message.
    strangers: Vec<String>,
    /// Other schemas of the database that hold a claimgate ledger.
    elsewhere: Vec<String>,
}

/// Makes sure the ledger `target` names is there and of today's format, on `client` (whose
/// search path pins the schema): makes or upgrades it only if `create`; otherwise runs no DDL
/// and says what it found when it is not usable. Configuration errors (exit 2) say what to do.
pub(super) fn prepare(client: &mut Client, target: &Target, create: bool) -> Result<()> {
    let found = look(client, &target.schema)?;
    match found.ledger {
        Some(FORMAT_VERSION) if create => may_write(client, target),
        Some(FORMAT_VERSION) => Ok(()),
        Some(v) if v > FORMAT_VERSION => Err(Error::Config(format!(
            "the ledger in schema {} of {} is format {v}, made by a newer claimgate; this \
             build reads format {FORMAT_VERSION}: upgrade claimgate on this node",
            target.schema, target.redacted
        ))),
        Some(v) if !create => Err(Error::Config(format!(
            "the ledger in schema {} of {} is format {v}, made by an earlier claimgate; this \
             build reads format {FORMAT_VERSION}: upgrade it once, as the role that owns it, \
             with `claimgate init` (every node must then run this release)",
            target.schema, target.redacted
        ))),
        Some(_) => apply(client, target, "upgrade"),
        None if !create => Err(not_here(&found, target)),
        None => {
            if !found.elsewhere.is_empty() && !target.schema_named {
                return Err(not_here(&found, target));
            }
            if !found.strangers.is_empty() {
                return Err(Error::Config(format!(
                    "schema {} of {} holds objects claimgate did not make ({}); claimgate \
                     makes its ledger only in an empty schema: give it one of its own, e.g. \
                     CREATE SCHEMA claimgate AUTHORIZATION <owner role>, and add \
                     schema=claimgate to the URL",
                    target.schema,
                    target.redacted,
                    found.strangers.join(", ")
                )));
            }
            apply(client, target, "create")
        }
    }
}

/// What a writing node needs of each table: (table, privilege). `FOR UPDATE` on
/// `claim_locks` needs `UPDATE`.
const WRITES: [(&str, &str); 10] = [
    ("processed_messages", "INSERT"),
    ("disbursements", "INSERT"),
    ("outbox_rows", "INSERT"),
    ("outbox_published", "INSERT"),
    ("dead_letters", "INSERT"),
    ("audit_members", "INSERT"),
    ("audit_batches", "INSERT"),
    ("audit_batches", "UPDATE"),
    ("chain_head", "UPDATE"),
    ("claim_locks", "UPDATE"),
];

/// The role may write what a writing node writes; else a configuration error naming the first
/// privilege missing, at start rather than at the first batch (where it would be a ledger
/// outage, waited out for minutes).
fn may_write(client: &mut Client, target: &Target) -> Result<()> {
    for (table, privilege) in WRITES {
        let held: bool = client
            .query_one(
                "SELECT has_table_privilege(quote_ident($1) || '.' || quote_ident($2), $3)",
                &[&target.schema, &table, &privilege],
            )?
            .get(0);
        if !held {
            let role: String = client.query_one("SELECT current_user::text", &[])?.get(0);
            return Err(Error::Config(format!(
                "the role {role} may not {privilege} {table} in schema {} of {}: run and relay \
                 need the worker's grants (docs/postgres.md: SELECT, INSERT, UPDATE, DELETE on \
                 the schema's tables); status, verify and audit need only SELECT",
                target.schema, target.redacted
            )));
        }
    }
    Ok(())
}

/// The message for a schema holding no ledger where one was expected.
fn not_here(found: &Found, target: &Target) -> Error {
    let (schema, url) = (&target.schema, &target.redacted);
    let what = if !found.schema_exists {
        format!("schema {schema} does not exist in {url}")
    } else {
        format!("no claimgate ledger in schema {schema} of {url}")
    };
    Error::Config(match found.elsewhere.as_slice() {
        [] => format!("{what}; `claimgate init` (or run, or relay) makes one"),
        [one] => format!(
            "{what}, but schema {one} holds one: add schema={one} to the URL (a ledger is \
             never looked for, or made, through the search path)"
        ),
        many => format!(
            "{what}, but schemas {} hold one each: name the one to use with schema=NAME in the \
             URL",
            many.join(", ")
        ),
    })
}

/// True of a `pg_class` row `c` that no extension made. What `CREATE EXTENSION` puts in the
/// ledger's schema (`pg_stat_statements`' views, which a DBA adds to the application's database
/// as a matter of course, in `public` unless told otherwise) belongs to the extension, not to
/// whoever can change the ledger, and can hide or reroute none of its rows: a trigger, rule or
/// policy an extension would add to claimgate's tables is still refused (`catalog.rs`).
pub(super) const MADE_BY_NO_EXTENSION: &str = "NOT EXISTS (SELECT 1 FROM pg_depend d
     WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')";

/// What the database holds, in the pinned schema and elsewhere. Catalog reads only.
fn look(client: &mut Client, schema: &str) -> Result<Found> {
    let row = client.query_one(
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
                to_regclass(quote_ident($1) || '.chain_head') IS NOT NULL,
                to_regclass(quote_ident($1) || '.ledger_meta') IS NOT NULL,
                ARRAY(SELECT c.relname::text FROM pg_class c JOIN pg_namespace n
                      ON n.oid = c.relnamespace
                      WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
                        AND {}
                      ORDER BY c.relname LIMIT 5),
                ARRAY(SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n
                      ON n.oid = c.relnamespace
                      WHERE c.relname = 'chain_head' AND c.relkind = 'r' AND n.nspname <> $1
                      ORDER BY n.nspname)",
            MADE_BY_NO_EXTENSION
        ),
        &[&schema],
    )?;
    let mut found = Found {
        schema_exists: row.get(0),
        strangers: row.get(3),
        elsewhere: row.get(4),
        ..Found::default()
    };
    if row.get::<_, bool>(1) {
        let recorded: Option<String> = if row.get::<_, bool>(2) {
            client
                .query_opt(
                    "SELECT value FROM ledger_meta WHERE name = 'format_version'",
                    &[],
                )?
                .map(|r| r.get(0))
        } else {
            None
        };
        let version = match recorded {
            None => 1,
            Some(v) => v.parse().map_err(|_| {
                Error::Config(format!(
                    "the ledger in schema {schema} records format {v:?}, which is not a number"
                ))
            })?,
        };
        found.ledger = Some(version);
        found.strangers.clear();
    }
    Ok(found)
}

/// Makes or upgrades the ledger: the schema script in one transaction under [`SCHEMA_LOCK`],
/// after looking again under the lock (a node that started at the same moment may have done
/// it). A role that may not create objects is told which role can.
fn apply(client: &mut Client, target: &Target, doing: &str) -> Result<()> {
    let denied = |e: Error| match e {
        Error::Ledger {
            source,
            fault: Fault::Ledger | Fault::Entry,
            ..
        } => Error::Config(format!(
            "cannot {doing} the ledger in schema {} of {}: {source}; making or upgrading it \
             takes a role that may create objects in that schema (its owner): run `claimgate \
             init` as that role, then start the workers as theirs",
            target.schema, target.redacted
        )),
        other => other,
    };
    let mut tx = client.transaction()?;
    // "already exists, skipping" notices are noise in the operator's log.
    tx.batch_execute("SET LOCAL client_min_messages = warning")?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, $2)",
        &[&SCHEMA_LOCK.0, &SCHEMA_LOCK.1],
    )?;
    let again = {
        let row = tx.query_one(
            "SELECT to_regclass(quote_ident($1) || '.ledger_meta') IS NOT NULL",
            &[&target.schema],
        )?;
        if row.get::<_, bool>(0) {
            tx.query_opt(
                "SELECT value FROM ledger_meta WHERE name = 'format_version'",
                &[],
            )?
            .map(|r| r.get::<_, String>(0))
        } else {
            None
        }
    };
    if again.as_deref() == Some(FORMAT_VERSION.to_string().as_str()) {
        return Ok(());
    }
    // Only where missing: CREATE SCHEMA asks for CREATE on the database even when the schema
    // is there (PostgreSQL checks the privilege before IF NOT EXISTS), which an owner of a
    // schema made for it by a DBA need not have.
    let exists: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&target.schema],
        )?
        .get(0);
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA \"{}\"", target.schema))
            .map_err(Error::from)
            .map_err(denied)?;
    }
    tx.batch_execute(SCHEMA)
        .map_err(|e| match e.as_db_error() {
            // The script's own refusal: the ledger holds what claimgate never writes (an edit).
            Some(db) if db.code().code() == EDITED => Error::Invariant(format!(
                "cannot {doing} the ledger in schema {} of {}: {}",
                target.schema,
                target.redacted,
                db.message()
            )),
            _ => denied(Error::from(e)),
        })?;
    tx.execute(
        "INSERT INTO ledger_meta (name, value) VALUES ('format_version', $1)
         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
        &[&FORMAT_VERSION.to_string()],
    )?;
    tx.commit()?;
    log::info!(
        "{} the claimgate ledger (format {FORMAT_VERSION}) in schema {} of {}",
        if doing == "create" {
            "made"
        } else {
            "upgraded"
        },
        target.schema,
        target.redacted
    );
    Ok(())
}
