//! `verify` for the in-memory ledger: the checks `ops/verify.rs` runs on SQLite, in the same
//! order and with the same names, run over the vectors instead of tables.
//!
//! SQLite's UNIQUE constraints make some faults impossible there (two disbursements or two
//! outbox rows for one claim); here nothing but `record`'s own care prevents them, so they are
//! checked too, in place of SQLite's `integrity_check`.

use super::state::{ClaimRow, DisbursementRow, State};
use crate::domain::audit::{Kind, Verifier};
use crate::error::{Error, Result};
use crate::ledger::{chain, checks, Summary};
use std::collections::{BTreeMap, HashMap};

/// One check: its name, and what it found wrong first, if anything.
type Check = (&'static str, fn(&State) -> Option<String>);

/// Ordered so the most basic faults are named first, as in `ops/verify.rs`.
const CHECKS: [Check; 15] = [
    ("in-memory indexes disagree", indexes),
    ("key claimed twice", key_claimed_twice),
    ("disbursement without a claim", disbursement_without_claim),
    ("claim without a disbursement", claim_without_disbursement),
    ("claim paid twice", claim_paid_twice),
    ("disbursement differs from its claim", disbursement_differs),
    (
        "disbursement without an outbox row",
        disbursement_without_outbox,
    ),
    (
        "outbox row without a disbursement",
        outbox_without_disbursement,
    ),
    ("outbox ids out of order", outbox_order),
    ("outbox event differs from its disbursement", event_differs),
    (
        "processed record without a matching disbursement",
        processed_unmatched,
    ),
    ("key processed twice in the audit log", processed_twice),
    (
        "key claimed after its claim was purged",
        claimed_and_tombstoned,
    ),
    (
        "duplicate record without a claim or tombstone",
        duplicate_unfounded,
    ),
    (
        "dead letters and dead_letter records disagree",
        dead_letters_disagree,
    ),
];

/// Checks everything; returns the summary, or `Error::Invariant` naming the first violation.
pub(super) fn state(state: &State) -> Result<Summary> {
    for (what, check) in CHECKS {
        if let Some(found) = check(state) {
            return Err(Error::Invariant(format!("{what}: {found}")));
        }
    }
    // Every processed record matches a distinct disbursement (checked above).
    let processed = processed_keys(state);
    checks::processed_records(
        state.disbursements.len() as u64,
        processed.values().sum::<u64>(),
        || {
            let d = state
                .disbursements
                .iter()
                .find(|d| !processed.contains_key(&d.key.to_hex()))
                .map(|d| format!("disbursement {} (key {})", d.id, d.key.to_hex()))
                .unwrap_or_else(|| "a disbursement".into());
            Ok(Some(format!("{d} has no processed audit record")))
        },
    )?;
    let mut v = Verifier::default();
    for r in &state.audit {
        chain::check(&mut v, r)?;
    }
    chain::end(&v)?;
    Ok(Summary {
        claims: state.claims.len() as u64,
        disbursements: state.disbursements.len() as u64,
        outbox_rows: state.outbox.len() as u64,
        audit_records: v.count,
        tombstones: state.tombstones.len() as u64,
        head_hash: v.head().to_owned(),
        unlinked_batches: 0,
    })
}

fn claims_by_id(state: &State) -> HashMap<i64, &ClaimRow> {
    state.claims.iter().map(|c| (c.id, c)).collect()
}

fn disbursements_by_claim(state: &State) -> HashMap<i64, &DisbursementRow> {
    state
        .disbursements
        .iter()
        .map(|d| (d.claim_id, d))
        .collect()
}

/// Processed records by key (hex), counted.
fn processed_keys(state: &State) -> BTreeMap<String, u64> {
    let mut keys = BTreeMap::new();
    for r in state.audit.iter().filter(|r| r.kind == Kind::Processed) {
        *keys
            .entry(r.idempotency_key.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    keys
}

fn indexes(state: &State) -> Option<String> {
    if state.claim_by_key.len() != state.claims.len() {
        return Some(format!(
            "{} claims but {} keys indexed",
            state.claims.len(),
            state.claim_by_key.len()
        ));
    }
    state.claims.iter().enumerate().find_map(|(i, c)| {
        (state.claim_by_key.get(&c.key) != Some(&i))
            .then(|| format!("claim {} is not where the key index says", c.id))
    })
}

fn key_claimed_twice(state: &State) -> Option<String> {
    let mut claims = BTreeMap::new();
    for c in &state.claims {
        *claims.entry(c.key).or_insert(0u64) += 1;
    }
    let (key, n) = claims.into_iter().find(|(_, n)| *n > 1)?;
    Some(format!("key {} has {n} claims", key.to_hex()))
}

fn disbursement_without_claim(state: &State) -> Option<String> {
    let claims = claims_by_id(state);
    let d = state
        .disbursements
        .iter()
        .find(|d| !claims.contains_key(&d.claim_id))?;
    Some(format!(
        "disbursement {} refers to claim {}, which does not exist",
        d.id, d.claim_id
    ))
}

fn claim_without_disbursement(state: &State) -> Option<String> {
    let paid = disbursements_by_claim(state);
    let c = state.claims.iter().find(|c| !paid.contains_key(&c.id))?;
    Some(format!(
        "claim {} (key {}) has no disbursement",
        c.id,
        c.key.to_hex()
    ))
}

fn claim_paid_twice(state: &State) -> Option<String> {
    let mut per_claim = BTreeMap::new();
    for d in &state.disbursements {
        *per_claim.entry(d.claim_id).or_insert(0u64) += 1;
    }
    let (claim, n) = per_claim.into_iter().find(|(_, n)| *n > 1)?;
    Some(format!("claim {claim} has {n} disbursements"))
}

fn disbursement_differs(state: &State) -> Option<String> {
    let claims = claims_by_id(state);
    state.disbursements.iter().find_map(|d| {
        let p = claims.get(&d.claim_id)?;
        (d.key != p.key || d.award_id != p.award_id || d.amount_cents != p.amount_cents).then(
            || {
                format!(
                    "disbursement {} (award {}, {} cents) differs from its claim {} (award {}, {} cents)",
                    d.id, d.award_id, d.amount_cents, p.id, p.award_id, p.amount_cents
                )
            },
        )
    })
}

fn disbursement_without_outbox(state: &State) -> Option<String> {
    let mut rows = BTreeMap::new();
    for o in &state.outbox {
        *rows.entry(o.claim_id).or_insert(0u64) += 1;
    }
    if let Some((claim, n)) = rows.iter().find(|(_, n)| **n > 1) {
        return Some(format!("claim {claim} has {n} outbox rows"));
    }
    let d = state
        .disbursements
        .iter()
        .find(|d| !rows.contains_key(&d.claim_id))?;
    Some(format!(
        "disbursement {} (claim {}, key {}) has no outbox row",
        d.id,
        d.claim_id,
        d.key.to_hex()
    ))
}

fn outbox_without_disbursement(state: &State) -> Option<String> {
    let paid = disbursements_by_claim(state);
    let o = state
        .outbox
        .iter()
        .find(|o| !paid.contains_key(&o.claim_id))?;
    Some(format!(
        "outbox row {} refers to claim {}, which has no disbursement",
        o.id, o.claim_id
    ))
}

fn outbox_order(state: &State) -> Option<String> {
    let mut last = 0;
    for o in &state.outbox {
        if o.id <= last || o.id > state.outbox_id_last {
            return Some(format!(
                "outbox row {} after row {last} (highest id given out: {})",
                o.id, state.outbox_id_last
            ));
        }
        last = o.id;
    }
    None
}

fn event_differs(state: &State) -> Option<String> {
    let paid = disbursements_by_claim(state);
    state.outbox.iter().find_map(|o| {
        let d = paid.get(&o.claim_id)?;
        let event: Option<serde_json::Value> = serde_json::from_str(&o.payload).ok();
        let field = |name: &str| event.as_ref().and_then(|e| e.get(name)).cloned();
        let agrees = field("amount_cents") == Some(d.amount_cents.into())
            && field("award_id") == Some(d.award_id.as_str().into())
            && field("idempotency_key") == Some(d.key.to_hex().into());
        (!agrees).then(|| {
            let announced = field("amount_cents").map_or("no amount".into(), |a| a.to_string());
            format!(
                "outbox row {} announces {announced} cents but disbursement {} records {}",
                o.id, d.id, d.amount_cents
            )
        })
    })
}

fn processed_unmatched(state: &State) -> Option<String> {
    let paid = disbursements_by_claim(state);
    let processed = state.audit.iter().filter(|r| r.kind == Kind::Processed);
    processed.into_iter().find_map(|a| {
        let key_hex = a.idempotency_key.as_deref().unwrap_or_default();
        let d = crate::domain::key::IdempotencyKey::from_hex(key_hex)
            .and_then(|k| state.claim(&k))
            .and_then(|c| paid.get(&c.id));
        let cents = a.amount_cents.map_or("no".into(), |c| c.to_string());
        let head = format!(
            "audit record {} (processed, key {key_hex}, {cents} cents)",
            a.seq
        );
        match d {
            None => Some(format!("{head} has no disbursement")),
            Some(d)
                if Some(d.amount_cents) != a.amount_cents
                    || Some(d.award_id.as_str()) != a.award_id.as_deref() =>
            {
                Some(format!(
                    "{head} but disbursement {} records award {}, {} cents",
                    d.id, d.award_id, d.amount_cents
                ))
            }
            Some(_) => None,
        }
    })
}

fn processed_twice(state: &State) -> Option<String> {
    let (key, n) = processed_keys(state).into_iter().find(|(_, n)| *n > 1)?;
    Some(format!("key {key} has {n} processed records"))
}

fn claimed_and_tombstoned(state: &State) -> Option<String> {
    let c = state
        .claims
        .iter()
        .find(|c| state.tombstones.contains_key(&c.key))?;
    Some(format!(
        "key {} is claimed (claim {}) and has a tombstone",
        c.key.to_hex(),
        c.id
    ))
}

fn duplicate_unfounded(state: &State) -> Option<String> {
    let duplicates = state.audit.iter().filter(|r| r.kind == Kind::Duplicate);
    duplicates.into_iter().find_map(|r| {
        let key_hex = r.idempotency_key.as_deref().unwrap_or_default();
        let founded = crate::domain::key::IdempotencyKey::from_hex(key_hex)
            .is_some_and(|k| state.claim(&k).is_some() || state.tombstones.contains_key(&k));
        (!founded).then(|| {
            format!(
                "audit record {} (duplicate, key {key_hex}) names a key with no claim and no tombstone",
                r.seq
            )
        })
    })
}

/// Dead-letter rows and `dead_letter` records, counted per stream entry id, must be equal:
/// one record per row, as `record` writes them (records carry no stream name, so entry ids
/// are what both sides share).
fn dead_letters_disagree(state: &State) -> Option<String> {
    let mut rows: BTreeMap<&str, i64> = BTreeMap::new();
    for (_, entry) in &state.dead_letters {
        *rows.entry(entry.as_str()).or_insert(0) += 1;
    }
    let mut records: BTreeMap<&str, i64> = BTreeMap::new();
    for r in state.audit.iter().filter(|r| r.kind == Kind::DeadLetter) {
        *records
            .entry(r.stream_entry_id.as_deref().unwrap_or_default())
            .or_insert(0) += 1;
    }
    let entries: std::collections::BTreeSet<&str> =
        rows.keys().chain(records.keys()).copied().collect();
    entries.into_iter().find_map(|e| {
        let (n_rows, n_records) = (
            rows.get(e).copied().unwrap_or(0),
            records.get(e).copied().unwrap_or(0),
        );
        (n_rows != n_records).then(|| dead_letter_mismatch(e, n_rows, n_records))
    })
}

/// The words for a dead-letter mismatch, as SQLite's check spells them.
fn dead_letter_mismatch(entry: &str, rows: i64, records: i64) -> String {
    format!("stream entry {entry} has {rows} dead_letters rows but {records} dead_letter records")
}
