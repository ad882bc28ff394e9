//! The invariants checked after the drain, each on real state: ledger rows read straight from
//! the SQLite file or the PostgreSQL database itself, streams and the pending list read from
//! Redis, the audit chain recomputed. Every check is reported, passing or not, so a failing
//! run shows the whole picture.

use super::load::{entry_id, Expect, STREAM};
use super::nemesis::Tally;
use super::plan::{Action, Plan, BUSY_TIMEOUT_MS};
use crate::support::{Store, World};
use claimgate::domain::audit::{self, Kind, Record};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// One invariant's verdict.
pub struct Check {
    /// What must hold.
    pub name: String,
    /// Whether it did.
    pub ok: bool,
    /// Figures or the first violations.
    pub detail: String,
}

fn check(name: &str, ok: bool, detail: impl Into<String>) -> Check {
    Check {
        name: name.to_owned(),
        ok,
        detail: detail.into(),
    }
}

/// The ledger as the checks need it.
struct Ledger {
    /// `processed_messages`: key → (claim_id, amount).
    claims: Vec<(Vec<u8>, i64, i64)>,
    /// `disbursements`: (claim_id, key, amount).
    disbursements: Vec<(i64, Vec<u8>, i64)>,
    /// `outbox`: (id, claim_id).
    outbox: Vec<(i64, i64)>,
    /// `dead_letters`: stream entry ids.
    dead_letter_rows: Vec<String>,
    /// `audit_log`, in seq order.
    audit: Vec<Record>,
    /// The store's own consistency check, `["ok"]` when it passes: SQLite's `PRAGMA
    /// integrity_check` and `foreign_key_check` output; on PostgreSQL (whose schema triggers
    /// refuse a row naming no claim, as a foreign key would) the chain head row against the
    /// last record and outbox id.
    integrity: Vec<String>,
    /// `SUM(amount_cents)` over disbursements, as the database computes it.
    sum_cents: i64,
}

/// The name of the check of [`Ledger::integrity`] on `store`.
fn integrity_check_name(store: Store) -> &'static str {
    match store {
        Store::Sqlite => "PRAGMA integrity_check is ok, no foreign key violations",
        Store::Postgres => {
            "the chain head row holds the last record's seq and hash and the highest outbox id; \
             outbox ids run 1..=N without a gap"
        }
    }
}

fn read_ledger(world: &World) -> Ledger {
    match world.store {
        Store::Sqlite => read_sqlite(world),
        Store::Postgres => read_postgres(world),
    }
}

fn read_sqlite(world: &World) -> Ledger {
    let conn = rusqlite::Connection::open_with_flags(
        &world.db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open ledger");
    let rows = |sql: &str| -> Vec<Vec<rusqlite::types::Value>> {
        let mut stmt = conn.prepare(sql).expect(sql);
        let n = stmt.column_count();
        stmt.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
            .expect(sql)
            .map(|r| r.expect(sql))
            .collect()
    };
    use rusqlite::types::Value as V;
    let int = |v: &V| match v {
        V::Integer(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    };
    let blob = |v: &V| match v {
        V::Blob(b) => b.clone(),
        other => panic!("expected a blob, got {other:?}"),
    };
    let text = |v: &V| match v {
        V::Text(t) => Some(t.clone()),
        V::Null => None,
        other => panic!("expected text, got {other:?}"),
    };
    let int_or_null = |v: &V| match v {
        V::Null => None,
        other => Some(int(other)),
    };
    // A digest as hex: 32 raw bytes (format 5) or an earlier format's hex text.
    let digest = |v: &V| match v {
        V::Blob(b) => claimgate::domain::key::to_hex(b),
        other => text(other).expect("a digest"),
    };
    let claims = rows("SELECT idempotency_key, claim_id, amount_cents FROM processed_messages")
        .iter()
        .map(|r| (blob(&r[0]), int(&r[1]), int(&r[2])))
        .collect();
    // A disbursement of a ledger this release made stores no key: its claim's (format 5).
    let disbursements = rows(
        "SELECT d.claim_id, ifnull(d.idempotency_key, p.idempotency_key), d.amount_cents
         FROM disbursements d LEFT JOIN processed_messages p ON p.claim_id = d.claim_id",
    )
    .iter()
    .map(|r| (int(&r[0]), blob(&r[1]), int(&r[2])))
    .collect();
    let outbox = rows("SELECT id, claim_id FROM outbox")
        .iter()
        .map(|r| (int(&r[0]), int(&r[1])))
        .collect();
    let dead_letter_rows = rows("SELECT stream_entry_id FROM dead_letters")
        .iter()
        .map(|r| text(&r[0]).expect("id"))
        .collect();
    let audit = rows(
        "SELECT seq, kind, idempotency_key, award_id, amount_cents, stream_entry_id, consumer,
                delivery_count, detail, recorded_at, prev_hash, hash FROM audit_log ORDER BY seq",
    )
    .iter()
    .map(|r| Record {
        seq: int(&r[0]),
        kind: Kind::parse(&text(&r[1]).expect("kind")).expect("known kind"),
        // Stored like a digest from format 6 on (NULL for a record about no key).
        idempotency_key: match &r[2] {
            V::Null => None,
            key => Some(digest(key)),
        },
        award_id: text(&r[3]),
        amount_cents: int_or_null(&r[4]),
        stream_entry_id: text(&r[5]),
        consumer: text(&r[6]),
        delivery_count: int_or_null(&r[7]),
        detail: text(&r[8]),
        recorded_at: text(&r[9]).expect("recorded_at"),
        prev_hash: digest(&r[10]),
        hash: digest(&r[11]),
        batch_index: None,
    })
    .collect();
    let mut integrity: Vec<String> = rows("PRAGMA integrity_check")
        .iter()
        .map(|r| text(&r[0]).unwrap_or_default())
        .collect();
    integrity.extend(
        rows("PRAGMA foreign_key_check")
            .iter()
            .map(|r| format!("foreign key: {r:?}")),
    );
    let sum_cents = conn
        .query_row(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM disbursements",
            [],
            |r| r.get(0),
        )
        .expect("sum");
    Ledger {
        claims,
        disbursements,
        outbox,
        dead_letter_rows,
        audit,
        integrity,
        sum_cents,
    }
}

/// The same rows from the PostgreSQL database, in one repeatable-read snapshot.
fn read_postgres(world: &World) -> Ledger {
    let url = world.db.to_str().expect("a URL");
    let mut client = postgres::Client::connect(url, postgres::NoTls).expect("connect to ledger");
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .expect("snapshot");
    let mut rows = |sql: &str| tx.query(sql, &[]).expect(sql);
    let claims = rows("SELECT idempotency_key, claim_id, amount_cents FROM processed_messages")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let disbursements = rows("SELECT claim_id, idempotency_key, amount_cents FROM disbursements")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    // A row of a batch never linked has no id: -1 here, a gap the check below names.
    let outbox: Vec<(i64, i64)> = rows("SELECT COALESCE(id, -1), claim_id FROM outbox")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let dead_letter_rows = rows("SELECT stream_entry_id FROM dead_letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The chain as stored (keys and digests, stored as bytes, as the hex a record carries):
    // every record (the view numbers batch members by their batch's
    // link; members of a batch not linked yet have no seq and are not in the chain), and after
    // each batch's last member the batch's link, at that seq, its detail spelled here from the
    // row's columns.
    let audit: Vec<Record> = rows(
        "SELECT seq, kind, encode(idempotency_key, 'hex'), award_id, amount_cents,
                stream_entry_id, consumer, delivery_count, detail, recorded_at,
                encode(prev_hash, 'hex'), encode(hash, 'hex'), batch_index, 0 AS link
         FROM audit_log WHERE seq IS NOT NULL
         UNION ALL
         SELECT link_seq, 'batch', NULL, NULL, NULL, NULL, NULL, NULL,
                'batch ' || batch_id || ': ' || record_count || ' records, last ' || last_hash
                    || '; ' || outbox_count || ' outbox rows from id ' || outbox_first,
                linked_at, prev_hash, hash, NULL, 1
         FROM audit_batches WHERE link_seq IS NOT NULL
         ORDER BY seq, link",
    )
    .iter()
    .map(|r| Record {
        seq: r.get(0),
        kind: Kind::parse(r.get(1)).expect("known kind"),
        idempotency_key: r.get(2),
        award_id: r.get(3),
        amount_cents: r.get(4),
        stream_entry_id: r.get(5),
        consumer: r.get(6),
        delivery_count: r.get(7),
        detail: r.get(8),
        recorded_at: r.get(9),
        prev_hash: r.get(10),
        hash: r.get(11),
        batch_index: r.get::<_, Option<i32>>(12).map(i64::from),
    })
    .collect();
    let head = &rows("SELECT seq, hash, outbox_id_last FROM chain_head")[0];
    let head: (i64, String, i64) = (head.get(0), head.get(1), head.get(2));
    let last = audit.last().map_or(
        (0, claimgate::domain::audit::GENESIS_HASH.to_owned()),
        |r| (r.seq, r.hash.clone()),
    );
    let outbox_max = outbox.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let mut integrity = Vec::new();
    if (head.0, &head.1, head.2) != (last.0, &last.1, outbox_max) {
        integrity.push(format!(
            "chain head (seq {}, hash {}, outbox id {}), last record (seq {}, hash {}), highest outbox id {outbox_max}",
            head.0, head.1, head.2, last.0, last.1
        ));
    }
    // Ids come from the head, advanced in the statement that inserts their rows: an id
    // handed out without its row committed would be a gap.
    if outbox_max != outbox.len() as i64 {
        integrity.push(format!(
            "{} outbox rows but ids up to {outbox_max}",
            outbox.len()
        ));
    }
    if integrity.is_empty() {
        integrity.push("ok".to_owned());
    }
    let sum_cents =
        rows("SELECT COALESCE(SUM(amount_cents), 0)::int8 FROM disbursements")[0].get(0);
    Ledger {
        claims,
        disbursements,
        outbox,
        dead_letter_rows,
        audit,
        integrity,
        sum_cents,
    }
}

/// What the plan says must be true at the end.
struct Expected {
    /// Key → amount, one per unique submission.
    amounts: HashMap<Vec<u8>, i64>,
    /// Entry id → reason code, one per malformed entry.
    malformed: HashMap<String, &'static str>,
    /// Ids of every valid entry, first copies and duplicates.
    valid_ids: HashSet<String>,
    /// Duplicate copies sent.
    duplicates: usize,
}

fn expected(plan: &Plan) -> Expected {
    let mut e = Expected {
        amounts: HashMap::new(),
        malformed: HashMap::new(),
        valid_ids: HashSet::new(),
        duplicates: 0,
    };
    for (i, p) in plan.entries.iter().enumerate() {
        match &p.expect {
            Expect::Valid {
                key,
                amount_cents,
                duplicate,
            } => {
                e.amounts.insert(key.as_bytes().to_vec(), *amount_cents);
                e.valid_ids.insert(entry_id(i));
                e.duplicates += usize::from(*duplicate);
            }
            Expect::Malformed { code } => {
                e.malformed.insert(entry_id(i), code);
            }
        }
    }
    e
}

/// Runs every check.
pub fn check_all(world: &World, plan: &Plan, tally: &Tally) -> Vec<Check> {
    let ledger = read_ledger(world);
    let expected = expected(plan);
    let mut checks = vec![
        exactly_once(&ledger, &expected),
        nothing_unsent(&ledger, &expected),
        sum_exact(&ledger, &expected),
    ];
    checks.extend(dead_letters(world, &ledger, &expected));
    checks.push(nothing_pending(world, plan));
    checks.extend(audit_trail(&ledger, &expected));
    checks.push(check(
        integrity_check_name(world.store),
        ledger.integrity == ["ok"],
        ledger.integrity.join("; "),
    ));
    checks.extend(faults_fired(plan, tally));
    checks.extend(faults_landed(plan, &world.dir.path().join("logs"), tally));
    if plan.relays() > 0 {
        checks.push(events_once(world, &ledger));
    }
    checks.extend(
        VERIFY_COMMANDS
            .iter()
            .map(|args| command_passes(world, args)),
    );
    checks
}

/// `claimgate` commands that check the ledger themselves and must exit 0 after the drain.
pub static VERIFY_COMMANDS: &[&[&str]] = &[&["verify"], &["audit", "verify"]];

fn command_passes(world: &World, args: &[&str]) -> Check {
    let out = world.run(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    check(
        &format!("`claimgate {}` passes", args.join(" ")),
        out.status.success(),
        format!("{}: {}", out.status, text.trim()),
    )
}

/// Every unique submission has exactly one claim, one disbursement and one outbox row.
fn exactly_once(ledger: &Ledger, expected: &Expected) -> Check {
    let mut claims: HashMap<&[u8], Vec<i64>> = HashMap::new();
    for (key, claim_id, _) in &ledger.claims {
        claims.entry(key).or_default().push(*claim_id);
    }
    let mut disbursed: HashMap<&[u8], usize> = HashMap::new();
    for (_, key, _) in &ledger.disbursements {
        *disbursed.entry(key).or_default() += 1;
    }
    let mut outbox: HashMap<i64, usize> = HashMap::new();
    for (_, claim_id) in &ledger.outbox {
        *outbox.entry(*claim_id).or_default() += 1;
    }
    let mut bad = Vec::new();
    for key in expected.amounts.keys() {
        let c = claims.get(key.as_slice()).map(Vec::as_slice).unwrap_or(&[]);
        let d = disbursed.get(key.as_slice()).copied().unwrap_or(0);
        let o: usize = c
            .iter()
            .map(|id| outbox.get(id).copied().unwrap_or(0))
            .sum();
        if (c.len(), d, o) != (1, 1, 1) {
            bad.push(format!(
                "{}: {} claims, {d} disbursements, {o} outbox rows",
                hex(key),
                c.len()
            ));
        }
    }
    let n = expected.amounts.len();
    check(
        "every unique submission has exactly one claim, one disbursement and one outbox row",
        bad.is_empty(),
        if bad.is_empty() {
            format!("{n} of {n}")
        } else {
            format!("{} of {n} wrong, e.g. {}", bad.len(), first(&bad))
        },
    )
}

/// No claim, disbursement or outbox row exists for anything never sent, and every amount is
/// the one sent.
fn nothing_unsent(ledger: &Ledger, expected: &Expected) -> Check {
    let mut bad = Vec::new();
    for (key, _, amount) in &ledger.claims {
        if expected.amounts.get(key) != Some(amount) {
            bad.push(format!(
                "claim {} for {amount} cents was never sent",
                hex(key)
            ));
        }
    }
    let claim_ids: HashSet<i64> = ledger.claims.iter().map(|c| c.1).collect();
    for (claim_id, key, amount) in &ledger.disbursements {
        if expected.amounts.get(key) != Some(amount) || !claim_ids.contains(claim_id) {
            bad.push(format!(
                "disbursement {} of {amount} cents (claim {claim_id}) was never sent",
                hex(key)
            ));
        }
    }
    for (id, claim_id) in &ledger.outbox {
        if !claim_ids.contains(claim_id) {
            bad.push(format!("outbox row {id} has no claim {claim_id}"));
        }
    }
    check(
        "no claim, disbursement or outbox row for anything never sent; every amount as sent",
        bad.is_empty(),
        if bad.is_empty() {
            format!(
                "{} claims, {} disbursements, {} outbox rows",
                ledger.claims.len(),
                ledger.disbursements.len(),
                ledger.outbox.len()
            )
        } else {
            format!("{} violations, e.g. {}", bad.len(), first(&bad))
        },
    )
}

/// The sum disbursed equals the sum sent, to the cent.
fn sum_exact(ledger: &Ledger, expected: &Expected) -> Check {
    let want: i128 = expected.amounts.values().map(|&a| i128::from(a)).sum();
    check(
        "the sum of disbursed amounts equals the sum sent, exactly",
        i128::from(ledger.sum_cents) == want,
        format!("ledger {} cents, sent {want} cents", ledger.sum_cents),
    )
}

/// Every malformed entry is in the dead-letter stream exactly once, with its reason code and
/// its original fields, and nothing else is there; the ledger's `dead_letters` agrees.
fn dead_letters(world: &World, ledger: &Ledger, expected: &Expected) -> Vec<Check> {
    let mut by_original: HashMap<String, Vec<HashMap<String, Vec<u8>>>> = HashMap::new();
    let letters = world.dead_letters();
    for fields in &letters {
        let original =
            String::from_utf8_lossy(fields.get("original_id").map(Vec::as_slice).unwrap_or(b"?"))
                .into_owned();
        by_original
            .entry(original)
            .or_default()
            .push(fields.clone());
    }
    let mut bad = Vec::new();
    for (id, code) in &expected.malformed {
        match by_original.get(id).map(Vec::as_slice) {
            Some([one]) => {
                let got = one
                    .get("reason_code")
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .unwrap_or_default();
                if got != *code {
                    bad.push(format!("{id}: reason_code {got:?}, expected {code:?}"));
                }
            }
            Some(many) => bad.push(format!("{id}: dead-lettered {} times", many.len())),
            None => bad.push(format!("{id} ({code}): not in the dead-letter stream")),
        }
    }
    for (id, copies) in &by_original {
        if !expected.malformed.contains_key(id) {
            let reason = copies[0]
                .get("reason_code")
                .map(|c| String::from_utf8_lossy(c).into_owned());
            bad.push(format!(
                "{id} was dead-lettered ({reason:?}) but is not malformed"
            ));
        }
    }
    let rows: HashSet<&String> = ledger.dead_letter_rows.iter().collect();
    let want: HashSet<&String> = expected.malformed.keys().collect();
    let n = expected.malformed.len();
    let classes: HashSet<&&str> = expected.malformed.values().collect();
    vec![
        check(
            "every malformed entry is in the dead-letter stream exactly once, with its reason code",
            bad.is_empty(),
            if bad.is_empty() {
                format!(
                    "{n} entries of {} classes, {} dead letters",
                    classes.len(),
                    letters.len()
                )
            } else {
                format!("{} violations, e.g. {}", bad.len(), first(&bad))
            },
        ),
        check(
            "the ledger's dead_letters table holds exactly the malformed entries",
            rows == want && ledger.dead_letter_rows.len() == n,
            format!("{} rows, {n} expected", ledger.dead_letter_rows.len()),
        ),
    ]
}

/// The group has nothing pending, and the stream holds every planned entry exactly once.
fn nothing_pending(world: &World, plan: &Plan) -> Check {
    let pending = world.pending();
    let len = world.xlen(STREAM);
    check(
        "the group has nothing pending; the stream holds each planned entry once",
        pending == 0 && len == plan.entries.len() as u64,
        format!(
            "pending {pending}, stream length {len} of {} planned",
            plan.entries.len()
        ),
    )
}

/// The audit chain verifies; its records agree with the ledger and the load.
fn audit_trail(ledger: &Ledger, expected: &Expected) -> Vec<Check> {
    let chain = audit::verify_chain(&ledger.audit);
    // Links of batches are seals in the chain, not records.
    let records = ledger
        .audit
        .iter()
        .filter(|r| r.kind != Kind::Batch)
        .count();
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    for r in &ledger.audit {
        *kinds.entry(r.kind.as_str()).or_default() += 1;
    }
    let count = |k: Kind| kinds.get(k.as_str()).copied().unwrap_or(0);
    let mut bad = Vec::new();
    if count(Kind::Processed) != expected.amounts.len() {
        bad.push(format!(
            "{} processed records for {} submissions",
            count(Kind::Processed),
            expected.amounts.len()
        ));
    }
    if count(Kind::DeadLetter) != expected.malformed.len() {
        bad.push(format!(
            "{} dead_letter records for {} malformed entries",
            count(Kind::DeadLetter),
            expected.malformed.len()
        ));
    }
    if count(Kind::Duplicate) < expected.duplicates {
        bad.push(format!(
            "{} duplicate records for {} duplicates sent",
            count(Kind::Duplicate),
            expected.duplicates
        ));
    }
    if count(Kind::Conflict) + count(Kind::Checkpoint) != 0 {
        bad.push("conflict or checkpoint records in a run that has none".to_owned());
    }
    let disbursed: HashMap<String, i64> = ledger
        .disbursements
        .iter()
        .map(|(_, k, a)| (hex(k), *a))
        .collect();
    let mut seen_ids = HashSet::new();
    for r in &ledger.audit {
        if r.kind == Kind::Processed {
            let key = r.idempotency_key.clone().unwrap_or_default();
            if disbursed.get(&key) != r.amount_cents.as_ref() {
                bad.push(format!(
                    "processed record {} ({key}) does not match its disbursement",
                    r.seq
                ));
            }
        }
        if matches!(r.kind, Kind::Processed | Kind::Duplicate) {
            seen_ids.extend(r.stream_entry_id.clone());
        }
    }
    let unrecorded = expected
        .valid_ids
        .iter()
        .filter(|id| !seen_ids.contains(*id))
        .count();
    if unrecorded > 0 {
        bad.push(format!(
            "{unrecorded} valid entries have neither a processed nor a duplicate record"
        ));
    }
    let max_deliveries = ledger
        .audit
        .iter()
        .filter_map(|r| r.delivery_count)
        .max()
        .unwrap_or(0);
    // Entries recorded on a delivery past the cap (the workers run with the default
    // --max-deliveries): each went through the quarantine and was paid or found a duplicate on
    // a try alone. Reported; a valid entry dead-lettered instead would already be a violation
    // above (dead_letter records must equal the malformed entries sent).
    let cap = claimgate::config::MAX_DELIVERIES_DEFAULT as i64;
    let over_cap: HashSet<&String> = ledger
        .audit
        .iter()
        .filter(|r| r.delivery_count.unwrap_or(0) > cap)
        .filter_map(|r| r.stream_entry_id.as_ref())
        .collect();
    let recomputed = recompute_chain(&ledger.audit);
    vec![
        check(
            "the audit chain, rehashed by this test's own code, links every row from genesis",
            recomputed.is_ok(),
            format!("{recomputed:?} over {} rows", ledger.audit.len()),
        ),
        check(
            "the audit chain verifies over every row",
            chain == Ok(records as u64),
            format!("{:?} over {} rows", chain.map_err(|b| format!("break at seq {}: {}", b.seq, b.reason)), ledger.audit.len()),
        ),
        check(
            "audit counts per kind match the ledger and the load; every valid entry left a record",
            bad.is_empty(),
            format!(
                "processed {}, duplicate {}, dead_letter {}; highest delivery count {max_deliveries}, \
                 {} entries recorded after more than {cap} deliveries{}",
                count(Kind::Processed),
                count(Kind::Duplicate),
                count(Kind::DeadLetter),
                over_cap.len(),
                if bad.is_empty() { String::new() } else { format!("; {}", bad.join("; ")) }
            ),
        ),
    ]
}

/// Every planned fault happened: the kills, each failpoint (by SIGABRT) as often as armed, the
/// Redis restarts, and the ledger's outages (on SQLite the lock holds, the long ones past the
/// busy timeout; on PostgreSQL the server restarts); and no process died in a way nobody
/// planned.
fn faults_fired(plan: &Plan, tally: &Tally) -> Vec<Check> {
    let kills = plan.count(|a| matches!(a, Action::Kill { .. }));
    let arms = plan.arms();
    let restarts = plan.count(|a| matches!(a, Action::RestartRedis { .. }));
    let pg_restarts = plan.count(|a| matches!(a, Action::RestartPostgres { .. }));
    let fired: Vec<String> = arms
        .iter()
        .map(|(p, n)| format!("{p} {}/{n}", tally.fired.get(p).copied().unwrap_or(0)))
        .collect();
    let all_fired = arms
        .iter()
        .all(|(p, n)| tally.fired.get(p).copied().unwrap_or(0) == *n)
        && tally.not_fired.is_empty();
    let busy = Duration::from_millis(BUSY_TIMEOUT_MS);
    let holds = plan.count(|a| matches!(a, Action::HoldLedgerLock { .. }));
    let held_ok =
        tally.lock_holds.len() == holds && tally.lock_holds.iter().all(|h| h.held >= h.planned);
    let long = tally.lock_holds.iter().filter(|h| h.held > busy).count();
    let short = tally.lock_holds.len() - long;
    let held: Vec<String> = tally
        .lock_holds
        .iter()
        .map(|h| {
            format!(
                "{:.1}s at {:.1}s",
                h.held.as_secs_f64(),
                h.taken_at.as_secs_f64()
            )
        })
        .collect();
    let ledger_outages = match plan.store {
        Store::Sqlite => check(
            "the ledger's write lock was held as planned, on both sides of the busy timeout",
            held_ok && long > 0 && short > 0,
            format!(
                "held {} (busy timeout {:.1}s)",
                held.join(", "),
                busy.as_secs_f64()
            ),
        ),
        Store::Postgres => check(
            "every planned PostgreSQL immediate shutdown and restart happened",
            tally.postgres_restarts == pg_restarts && pg_restarts > 0 && holds == 0,
            format!("{}/{pg_restarts}", tally.postgres_restarts),
        ),
    };
    vec![
        check(
            "every planned SIGKILL happened (plus one per plain process replaced by an armed one)",
            tally.kills >= kills + arms.iter().map(|(_, n)| n).sum::<usize>(),
            format!(
                "{} kills for {kills} planned kills and {} arms",
                tally.kills,
                arms.iter().map(|(_, n)| n).sum::<usize>()
            ),
        ),
        check(
            "every armed failpoint fired (the process died by SIGABRT there)",
            all_fired,
            format!(
                "{}{}",
                fired.join(", "),
                if tally.not_fired.is_empty() {
                    String::new()
                } else {
                    format!("; {}", tally.not_fired.join("; "))
                }
            ),
        ),
        check(
            "every planned Redis restart happened",
            tally.redis_restarts == restarts && restarts > 0,
            format!("{}/{restarts}", tally.redis_restarts),
        ),
        ledger_outages,
        check(
            "no process exited unless killed or armed",
            tally.unexpected_exits.is_empty(),
            tally
                .unexpected_exits
                .first()
                .cloned()
                .unwrap_or_else(|| format!("{} processes started", tally.spawns)),
        ),
    ]
}

/// Rehashes the chain without the project's own `Record::compute_hash` or `verify_chain` (the
/// code under test): the canonical text is written out here field by field, in the order and
/// with the escaping the stored chain was sealed with (serde_json's: `"`, `\\` and control
/// characters escaped, nothing else). A record sealed alone must link to the chain's head, the
/// first to the all-zero genesis hash. A batch member (shared ledger) is hashed with its place
/// in the batch as its seq and links to the member before it, the first to the genesis hash;
/// the batch's link follows its last member at that seq, names how many members there were
/// and the last one's hash, and links to the chain's head. Returns the number of records
/// (links are not records), or the first bad seq.
fn recompute_chain(records: &[Record]) -> Result<usize, String> {
    use sha2::{Digest, Sha256};
    fn text(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }
    fn opt_text(s: &Option<String>) -> String {
        s.as_deref().map_or_else(|| "null".to_owned(), text)
    }
    fn opt_int(n: Option<i64>) -> String {
        n.map_or_else(|| "null".to_owned(), |n| n.to_string())
    }
    fn hash_of(r: &Record, seq: i64) -> String {
        let canonical = format!(
            "{{\"seq\":{},\"kind\":{},\"idempotency_key\":{},\"award_id\":{},\"amount_cents\":{},\
             \"stream_entry_id\":{},\"consumer\":{},\"delivery_count\":{},\"detail\":{},\
             \"recorded_at\":{},\"prev_hash\":{},\"hash\":\"\"}}",
            seq,
            text(r.kind.as_str()),
            opt_text(&r.idempotency_key),
            opt_text(&r.award_id),
            opt_int(r.amount_cents),
            opt_text(&r.stream_entry_id),
            opt_text(&r.consumer),
            opt_int(r.delivery_count),
            opt_text(&r.detail),
            text(&r.recorded_at),
            text(&r.prev_hash),
        );
        let mut h = Sha256::new();
        h.update(r.prev_hash.as_bytes());
        h.update(canonical.as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
    let genesis = "0".repeat(64);
    let mut head = genesis.clone();
    // The batch being read: its last member's place and hash.
    let mut batch: Option<(i64, String)> = None;
    let mut count = 0;
    for r in records {
        let bad = |what: &str| Err(format!("seq {}: {what}", r.seq));
        let expected_prev = match (r.batch_index, r.kind, &batch) {
            (Some(1), _, None) => genesis.clone(),
            (Some(i), _, Some((last, running))) if i == last + 1 => running.clone(),
            (Some(_), _, _) => return bad("a batch member out of its place"),
            (None, Kind::Batch, Some((last, running))) => {
                // "batch ID: N records, last HASH; M outbox rows from id F"
                let named = r.detail.as_deref().and_then(|d| {
                    let (_, rest) = d.split_once(": ")?;
                    let (n, rest) = rest.split_once(" records, last ")?;
                    let (h, _) = rest.split_once("; ")?;
                    Some((n.parse::<i64>().ok()?, h.to_owned()))
                });
                if named != Some((*last, running.clone())) {
                    return bad("a link naming other members than precede it");
                }
                head.clone()
            }
            (None, Kind::Batch, None) => return bad("a link with no batch before it"),
            (None, _, Some(_)) => return bad("a record inside a batch"),
            (None, _, None) => head.clone(),
        };
        if r.prev_hash != expected_prev {
            return bad("prev_hash does not link to the record before");
        }
        let hash = hash_of(r, r.batch_index.unwrap_or(r.seq));
        if hash != r.hash {
            return bad("stored hash is not the hash of its content");
        }
        match (r.batch_index, r.kind) {
            (Some(i), _) => batch = Some((i, hash)),
            (None, Kind::Batch) => {
                batch = None;
                head = hash;
            }
            (None, _) => head = hash,
        }
        if r.kind != Kind::Batch {
            count += 1;
        }
    }
    if batch.is_some() {
        return Err("the chain ends inside a batch".into());
    }
    Ok(count)
}

/// The faults hit work in flight, not idle processes: most kills found their victim holding
/// work (a worker with entries pending, a relay with unpublished rows), every server restart
/// happened with entries pending, and (on SQLite) every lock hold past the busy timeout made at
/// least one worker log a wait on the ledger while it lasted.
fn faults_landed(plan: &Plan, logs: &Path, tally: &Tally) -> Vec<Check> {
    let mut checks = Vec::new();
    let restarts: &[&str] = match plan.store {
        Store::Sqlite => &["redis restart"],
        Store::Postgres => &["redis restart", "postgres restart"],
    };
    for &fault in ["worker kill", "relay kill"].iter().chain(restarts) {
        let strikes: Vec<u64> = tally
            .strikes
            .iter()
            .filter(|s| s.fault == fault)
            .map(|s| s.work)
            .collect();
        let landed = strikes.iter().filter(|&&w| w > 0).count();
        let (name, ok) = if fault.ends_with("restart") {
            (
                format!("every {fault} landed on work in flight"),
                landed == strikes.len() && !strikes.is_empty(),
            )
        } else {
            (
                format!("most {fault}s landed on work in flight"),
                strikes.is_empty() || landed * 2 > strikes.len(),
            )
        };
        checks.push(check(
            &name,
            ok,
            format!("{landed}/{} landed; work hit: {:?}", strikes.len(), strikes),
        ));
    }
    if plan.store != Store::Sqlite {
        return checks;
    }
    let waits = ledger_waits(logs);
    let busy = Duration::from_millis(BUSY_TIMEOUT_MS);
    let long: Vec<(String, usize)> = tally
        .lock_holds
        .iter()
        .filter(|h| h.held > busy)
        .map(|h| {
            let (from, until) = &h.wall;
            let n = waits
                .iter()
                .filter(|t| t.as_str() >= from.as_str() && t.as_str() <= until.as_str())
                .count();
            (format!("{from}..{until}"), n)
        })
        .collect();
    checks.push(check(
        "every lock hold past the busy timeout made a worker wait on the ledger (a logged episode)",
        !long.is_empty() && long.iter().all(|(_, n)| *n > 0),
        format!("episodes per long hold: {long:?}"),
    ));
    checks
}

/// The times of every ledger wait episode the processes logged (the retry module logs one
/// WARN line when an episode starts; the line begins with its time).
fn ledger_waits(logs: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(logs).expect("chaos logs").flatten() {
        let text = std::fs::read_to_string(entry.path()).expect("chaos log");
        for line in text.lines() {
            if line.contains("retrying with backoff") && line.contains("ledger") {
                out.extend(line.split(' ').next().map(str::to_owned));
            }
        }
    }
    out
}

/// An XRANGE reply row: id and field/value pairs.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

/// The events stream holds each outbox row exactly once, in id order (only when a relay ran).
fn events_once(world: &World, ledger: &Ledger) -> Check {
    let reply: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(claimgate::config::EVENTS_STREAM_DEFAULT)
        .arg("-")
        .arg("+")
        .query(&mut world.conn())
        .expect("XRANGE events");
    let mut published: HashMap<i64, usize> = HashMap::new();
    let (mut last, mut out_of_order) = (0, 0);
    for (_, fields) in &reply {
        let event_id = fields
            .iter()
            .find(|(k, _)| k == "event_id")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(-1);
        *published.entry(event_id).or_default() += 1;
        out_of_order += usize::from(event_id <= last);
        last = event_id;
    }
    let outbox: HashSet<i64> = ledger.outbox.iter().map(|(id, _)| *id).collect();
    let missing = outbox
        .iter()
        .filter(|id| !published.contains_key(id))
        .count();
    let twice = published.values().filter(|&&n| n > 1).count();
    let stray = published.keys().filter(|id| !outbox.contains(id)).count();
    check(
        "the events stream holds each outbox row exactly once, in id order",
        missing == 0 && twice == 0 && stray == 0 && out_of_order == 0,
        format!("{} events for {} outbox rows: {missing} missing, {twice} published twice, {stray} unknown, {out_of_order} not above the event before", reply.len(), outbox.len()),
    )
}

fn hex(key: &[u8]) -> String {
    claimgate::domain::key::to_hex(key)
}

fn first(v: &[String]) -> &str {
    v.first().map(String::as_str).unwrap_or("")
}
