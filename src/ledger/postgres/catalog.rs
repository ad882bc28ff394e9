//! `verify`'s check of the ledger's schema itself, as SQLite's `verify` checks `schema.sql`'s:
//! the checks over the rows take the schema for granted, and someone who can change it (the
//! owner role, a DBA) can make every row look right while the next payment goes wrong.
//!
//! What is checked, in the ledger's schema only, from the catalogs (one read, no DDL):
//! - each table is still unique on the columns a promise rests on (a unique, non-partial,
//!   valid index: a dropped constraint lets the second claim or disbursement in);
//! - no trigger but claimgate's six, each enabled (a trigger can copy every new outbox row: a
//!   second event per payment, with no row looking wrong);
//! - no rule, no row-level security policy, and no table with row-level security on (either
//!   can hide rows from `verify` or reroute writes);
//! - no view but `audit_log` and `outbox` (and an extension's own), and each of those shows
//!   the rows its definition in `schema_postgres.sql` gives: the same columns and the same
//!   plan (a view redefined to hide rows would hide them from every check that reads it);
//! - claimgate's functions have the bodies the schema script gives them, and pin its schema;
//! - `claim_locks` holds every stripe (a missing one would hold its groups back for good).

use super::schema::SCHEMA;
use super::stripes::CLAIM_STRIPES;
use crate::error::{Error, Result};
use crate::ledger::checks;
use postgres::Transaction;

/// The uniqueness each promise rests on, as sets of columns a table must have a unique,
/// non-partial, valid index on; any one set of a row will do (ledgers of earlier releases).
const UNIQUE: [(&str, &[&[&str]]); 15] = [
    ("processed_messages", checks::CLAIM_UNIQUE),
    ("processed_messages", &[&["claim_id"]]),
    ("disbursements", &[&["claim_id"]]),
    ("outbox_rows", &[&["claim_id"]]),
    ("outbox_rows", &[&["id"]]),
    ("outbox_rows", &[&["batch_id", "batch_index"]]),
    ("outbox_published", &[&["upto_id"]]),
    ("claim_tombstones", &[&["idempotency_key"]]),
    ("dead_letters", &[&["stream", "stream_entry_id"]]),
    ("audit_chain", &[&["seq"]]),
    ("audit_batches", &[&["link_seq"]]),
    ("audit_members", &[&["batch_id", "batch_index"]]),
    ("chain_head", &[&["id"]]),
    ("purge_counts", &[&["id"]]),
    ("claim_locks", &[&["stripe"]]),
];

/// claimgate's triggers: (table, name, function), as the schema script makes them.
const TRIGGERS: [(&str, &str, &str); 6] = [
    (
        "disbursements",
        "claimgate_claim_on_insert",
        "claimgate_rows_name_claims",
    ),
    (
        "disbursements",
        "claimgate_claim_on_update",
        "claimgate_rows_name_claims",
    ),
    (
        "outbox_rows",
        "claimgate_claim_on_insert",
        "claimgate_rows_name_claims",
    ),
    (
        "outbox_rows",
        "claimgate_claim_on_update",
        "claimgate_rows_name_claims",
    ),
    (
        "processed_messages",
        "claimgate_named_on_delete",
        "claimgate_claims_unnamed",
    ),
    (
        "processed_messages",
        "claimgate_named_on_update",
        "claimgate_claims_unnamed",
    ),
];

/// claimgate's views.
const VIEWS: [&str; 2] = ["audit_log", "outbox"];

/// claimgate's functions, each with the body the schema script gives it.
const FUNCTIONS: [&str; 9] = [
    "claimgate_json",
    "claimgate_event",
    "claimgate_rows_name_claims",
    "claimgate_claims_unnamed",
    "claimgate_link_detail",
    "claimgate_link",
    "claimgate_counted",
    "claimgate_recount",
    "claimgate_note_published",
];

/// Checks the schema `schema` inside the caller's snapshot; the first thing altered, as an
/// [`Error::Invariant`] starting `schema altered:`.
pub(super) fn check(tx: &mut Transaction<'_>, schema: &str) -> Result<()> {
    unique(tx, schema)?;
    triggers(tx, schema)?;
    rules_and_policies(tx, schema)?;
    views(tx, schema)?;
    functions(tx, schema)?;
    stripes(tx)
}

fn altered(what: String) -> Error {
    Error::Invariant(format!("schema altered: {what}"))
}

/// Each table of [`UNIQUE`] is unique on one of its column sets.
fn unique(tx: &mut Transaction<'_>, schema: &str) -> Result<()> {
    let rows = tx.query(
        "SELECT c.relname::text,
                ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n
                      ORDER BY k.o)
         FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL
           AND 0 <> ALL (i.indkey::int2[])",
        &[&schema],
    )?;
    let sets: Vec<(String, Vec<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    checks::unique(&UNIQUE, |table| {
        Ok(sets
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, set)| set.clone())
            .collect())
    })
}

/// No trigger on the schema's tables but [`TRIGGERS`], each enabled and calling its function.
fn triggers(tx: &mut Transaction<'_>, schema: &str) -> Result<()> {
    let rows = tx.query(
        "SELECT c.relname::text, t.tgname::text, p.proname::text, t.tgenabled::text
         FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_proc p ON p.oid = t.tgfoid
         WHERE n.nspname = $1 AND NOT t.tgisinternal ORDER BY 1, 2",
        &[&schema],
    )?;
    let mut seen = 0;
    for r in &rows {
        let (table, name, func, enabled): (String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let ours = TRIGGERS
            .iter()
            .any(|(t, n, f)| *t == table && *n == name && *f == func);
        if !ours {
            return Err(altered(format!(
                "trigger {name} on {table} (calling {func}) is not claimgate's"
            )));
        }
        if enabled != "O" {
            return Err(altered(format!("trigger {name} on {table} is disabled")));
        }
        seen += 1;
    }
    if seen != TRIGGERS.len() {
        return Err(altered(format!(
            "{} of claimgate's {} triggers are missing (each checks that every disbursement \
             and outbox row names a claim)",
            TRIGGERS.len() - seen,
            TRIGGERS.len()
        )));
    }
    Ok(())
}

/// No rule but a view's own, no policy, no table with row-level security on.
fn rules_and_policies(tx: &mut Transaction<'_>, schema: &str) -> Result<()> {
    let found: Option<String> = tx
        .query_opt(
            "SELECT what FROM (
                 SELECT 'rule ' || r.rulename || ' on ' || c.relname AS what, 1 AS o
                 FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND r.rulename <> '_RETURN'
                 UNION ALL
                 SELECT 'row-level security policy ' || p.polname || ' on ' || c.relname, 2
                 FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
                 UNION ALL
                 SELECT 'row-level security turned on for ' || c.relname, 3
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND (c.relrowsecurity OR c.relforcerowsecurity)
             ) x ORDER BY o, what LIMIT 1",
            &[&schema],
        )?
        .map(|r| r.get(0));
    match found {
        Some(what) => Err(altered(format!("{what} is not claimgate's"))),
        None => Ok(()),
    }
}

/// No view but [`VIEWS`], and each shows exactly the rows of its definition in the schema
/// script: the same columns (names and types, in order) and the same plan.
fn views(tx: &mut Transaction<'_>, schema: &str) -> Result<()> {
    let rows = tx.query(
        &format!(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('v', 'm') AND {} ORDER BY 1",
            super::schema::MADE_BY_NO_EXTENSION
        ),
        &[&schema],
    )?;
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    if let Some(other) = names.iter().find(|n| !VIEWS.contains(&n.as_str())) {
        return Err(altered(format!("view {other} is not claimgate's")));
    }
    for view in VIEWS {
        if !names.iter().any(|n| n == view) {
            return Err(altered(format!("the view {view} is missing")));
        }
        let definition = view_definition(view);
        let shown = format!("SELECT * FROM {view}");
        if columns(tx, &shown)? != columns(tx, definition)? {
            return Err(altered(format!(
                "the view {view} has other columns than its definition (redefined?)"
            )));
        }
        // The same plan means the same rows, read the same way from the same tables: compared
        // in O(1), where summing a hash of every row of both sides read the whole trail twice
        // (a third of verify's time on PostgreSQL). The planner reads statistics outside the
        // snapshot, so an ANALYZE committed between the two EXPLAINs can change a plan:
        // only plans that differ every time are a redefined view.
        let mut same = false;
        for _ in 0..VIEW_PLAN_TRIES {
            if plan(tx, &shown)? == plan(tx, definition)? {
                same = true;
                break;
            }
        }
        if !same {
            return Err(altered(format!(
                "the view {view} shows other rows than its definition gives (redefined?): \
                 its plan differs"
            )));
        }
    }
    Ok(())
}

/// Times the two plans of a view are made before a difference counts.
const VIEW_PLAN_TRIES: usize = 3;

/// The names and types of the columns `query` returns.
fn columns(tx: &mut Transaction<'_>, query: &str) -> Result<Vec<(String, postgres::types::Type)>> {
    Ok(tx
        .prepare(query)?
        .columns()
        .iter()
        .map(|c| (c.name().to_owned(), c.type_().clone()))
        .collect())
}

/// `query`'s plan with every output expression (`EXPLAIN (VERBOSE, COSTS OFF)`), less the
/// query identifier, which is a hash of the query's text.
fn plan(tx: &mut Transaction<'_>, query: &str) -> Result<Vec<String>> {
    Ok(tx
        .query(&format!("EXPLAIN (VERBOSE, COSTS OFF) {query}"), &[])?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|line| !line.trim_start().starts_with("Query Identifier:"))
        .collect())
}

/// The `SELECT` of `CREATE [OR REPLACE] VIEW view AS …;` in the schema script: the one
/// definition of each view, read where it is written.
fn view_definition(view: &str) -> &'static str {
    let (at, start) = [
        format!("CREATE VIEW {view} AS"),
        format!("CREATE OR REPLACE VIEW {view} AS"),
    ]
    .into_iter()
    .find_map(|start| SCHEMA.find(&start).map(|at| (at, start)))
    .unwrap_or_else(|| panic!("schema_postgres.sql defines the view {view}"));
    let from = at + start.len();
    let len = SCHEMA[from..]
        .find(';')
        .expect("a view definition ends with ;");
    SCHEMA[from..from + len].trim()
}

/// Each of [`FUNCTIONS`] has the body the schema script gives it, and every one that reads
/// a table pins this schema.
fn functions(tx: &mut Transaction<'_>, schema: &str) -> Result<()> {
    let rows = tx.query(
        "SELECT p.proname::text, p.prosrc, COALESCE(p.proconfig, '{}')
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1 AND p.proname = ANY($2)",
        &[&schema, &FUNCTIONS.as_slice()],
    )?;
    for name in FUNCTIONS {
        let mut found = rows.iter().filter(|r| r.get::<_, String>(0) == name);
        let (Some(row), None) = (found.next(), found.next()) else {
            return Err(altered(format!(
                "the function {name} is missing, or defined more than once"
            )));
        };
        let (body, config): (String, Vec<String>) = (row.get(1), row.get(2));
        if body != function_body(name) {
            return Err(altered(format!(
                "the function {name} is not the one claimgate made (its body differs)"
            )));
        }
        let pinned = format!("search_path={schema}");
        // These two read no table: their names resolve in `pg_catalog`, searched first.
        let wants_pin = !["claimgate_link_detail", "claimgate_event"].contains(&name);
        // PostgreSQL quotes a name that needs it (a keyword) when it records the setting.
        let config: Vec<String> = config.into_iter().map(|c| c.replace('"', "")).collect();
        if wants_pin && config != [pinned.clone()] {
            return Err(altered(format!(
                "the function {name} runs with {config:?}, not {pinned}"
            )));
        }
    }
    Ok(())
}

/// The body (between the `$$`s) of `CREATE OR REPLACE FUNCTION name(` in the schema script.
fn function_body(name: &str) -> &'static str {
    let start = format!("CREATE OR REPLACE FUNCTION {name}(");
    let at = SCHEMA
        .find(&start)
        .unwrap_or_else(|| panic!("schema_postgres.sql defines {name}"));
    let open = at + SCHEMA[at..].find("$$").expect("a body in $$") + 2;
    let close = open + SCHEMA[open..].find("$$").expect("a body ends with $$");
    &SCHEMA[open..close]
}

/// `claim_locks` holds exactly the stripes 0 to `CLAIM_STRIPES - 1`.
fn stripes(tx: &mut Transaction<'_>) -> Result<()> {
    let row = tx.query_one(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE stripe BETWEEN 0 AND $1 - 1) FROM claim_locks",
        &[&CLAIM_STRIPES],
    )?;
    let (all, inside): (i64, i64) = (row.get(0), row.get(1));
    if all != i64::from(CLAIM_STRIPES) || inside != all {
        return Err(altered(format!(
            "claim_locks holds {all} rows ({inside} of them stripes 0 to {}), not the {} \
             stripes claimgate made",
            CLAIM_STRIPES - 1,
            CLAIM_STRIPES
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_and_function_is_found_in_the_schema_script() {
        for view in VIEWS {
            let d = view_definition(view);
            assert!(d.starts_with("SELECT") && !d.contains(';'), "{view}: {d}");
        }
        for name in FUNCTIONS {
            let body = function_body(name);
            assert!(!body.trim().is_empty() && !body.contains("$$"), "{name}");
        }
        assert!(function_body("claimgate_link").contains("chain_head"));
    }
}
