//! Evidence beyond the ledger file, attacked as someone who can write that file would: every
//! test edits a real SQLite ledger with its own SQL and its own SHA-256 (never claimgate's
//! sealing code), then runs the real binary. `verify` and `audit verify` alone are fooled by a
//! careful attacker; anchors kept off the box and signed checkpoints are not.

use crate::support::{self, World};
use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Output;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `claimgate ARGS`, insists on exit `code`, and returns stderr.
fn exits(w: &World, code: i32, args: &[&str]) -> String {
    let out = w.run(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "claimgate {args:?}: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
    stderr(&out)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `audit keygen --out DIR/NAME`: (signing key, public key).
fn keygen(w: &World, name: &str) -> (PathBuf, PathBuf) {
    let key = w.dir.path().join(name);
    w.run_ok(&["audit", "keygen", "--out", s(&key)]);
    let mut public = key.clone().into_os_string();
    public.push(".pub");
    (key, public.into())
}

/// `audit anchor --out FILE [--signing-key KEY]`.
fn anchor(w: &World, file: &Path, key: Option<&Path>) {
    let mut args = vec!["audit", "anchor", "--out", s(file)];
    if let Some(k) = key {
        args.extend(["--signing-key", s(k)]);
    }
    w.run_ok(&args);
}

/// `audit verify --anchors FILE [--public-key KEY]`: the exit code and stderr.
fn verify_anchors(w: &World, file: &Path, public: Option<&Path>) -> (i32, String) {
    let mut args = vec!["audit", "verify", "--anchors", s(file)];
    if let Some(p) = public {
        args.extend(["--public-key", s(p)]);
    }
    let out = w.run(&args);
    (out.status.code().unwrap(), stderr(&out))
}

fn rw(w: &World) -> Connection {
    Connection::open(&w.db).unwrap()
}

/// A JSON string or null, as serde writes it.
fn json_opt(v: Option<String>) -> String {
    v.map_or("null".into(), |s| serde_json::to_string(&s).unwrap())
}

/// The attacker's own sealing code, from the rule in `schema.sql`:
/// `hash = sha256(prev_hash || canonical JSON of the record with "hash":"")`.
pub(crate) fn attacker_hash(db: &Connection, seq: i64, prev: &str) -> String {
    let canonical: String = db
        .query_row(
            "SELECT kind, nullif(lower(hex(idempotency_key)), ''), award_id, amount_cents, stream_entry_id, consumer,
                    delivery_count, detail, recorded_at FROM audit_log WHERE seq = ?1",
            [seq],
            |r| {
                let num = |v: Option<i64>| v.map_or("null".into(), |n| n.to_string());
                Ok(format!(
                    r#"{{"seq":{seq},"kind":{},"idempotency_key":{},"award_id":{},"amount_cents":{},"stream_entry_id":{},"consumer":{},"delivery_count":{},"detail":{},"recorded_at":{},"prev_hash":{},"hash":""}}"#,
                    json_opt(r.get(0)?),
                    json_opt(r.get(1)?),
                    json_opt(r.get(2)?),
                    num(r.get(3)?),
                    json_opt(r.get(4)?),
                    json_opt(r.get(5)?),
                    num(r.get(6)?),
                    json_opt(r.get(7)?),
                    json_opt(r.get(8)?),
                    serde_json::to_string(prev).unwrap(),
                ))
            },
        )
        .unwrap();
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(canonical.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Re-seals every record from `from` on, each linking to the one before: what an attacker
/// does after an edit so that the chain agrees with itself again.
pub(crate) fn reseal_from(db: &Connection, from: i64) {
    // What record `from` must link to: the previous record's hash, or, when that is the
    // leading checkpoint of a purge, the hash it continues from; the genesis hash at the start.
    let mut prev: String = db
        .query_row(
            "SELECT CASE WHEN kind = 'checkpoint' AND seq = (SELECT MIN(seq) FROM audit_log)
                         THEN prev_hash ELSE hash END
             FROM audit_log WHERE seq < ?1 ORDER BY seq DESC LIMIT 1",
            [from],
            |r| support::digest_at(r, 0),
        )
        .optional()
        .unwrap()
        .unwrap_or_else(|| "0".repeat(64));
    let seqs: Vec<i64> = db
        .prepare("SELECT seq FROM audit_log WHERE seq >= ?1 ORDER BY seq")
        .unwrap()
        .query_map([from], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let first: i64 = db
        .query_row("SELECT MIN(seq) FROM audit_log", [], |r| r.get(0))
        .unwrap();
    for seq in seqs {
        let (kind, own_prev): (String, String) = db
            .query_row(
                "SELECT kind, prev_hash FROM audit_log WHERE seq = ?1",
                [seq],
                |r| Ok((r.get(0)?, support::digest_at(r, 1)?)),
            )
            .unwrap();
        if seq == first && kind == "checkpoint" {
            // A leading checkpoint keeps the hash it continues from, and the next record links
            // to that, not to the checkpoint's own hash.
            let hash = attacker_hash(db, seq, &own_prev);
            db.execute(
                "UPDATE audit_log SET hash = ?1 WHERE seq = ?2",
                params![hash, seq],
            )
            .unwrap();
            prev = own_prev;
            continue;
        }
        let hash = attacker_hash(db, seq, &prev);
        db.execute(
            "UPDATE audit_log SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
}

/// Deletes the claims, disbursements and outbox rows of the `processed` records in `lo..=hi`,
/// and the records themselves: payments vanish along with their evidence.
pub(crate) fn delete_records_and_payments(db: &Connection, lo: i64, hi: i64) {
    db.execute_batch(&format!(
        "CREATE TEMP TABLE gone AS SELECT claim_id FROM processed_messages WHERE hex(idempotency_key) IN
           (SELECT hex(idempotency_key) FROM audit_log WHERE seq BETWEEN {lo} AND {hi} AND kind = 'processed');
         DELETE FROM outbox WHERE claim_id IN (SELECT claim_id FROM gone);
         DELETE FROM disbursements WHERE claim_id IN (SELECT claim_id FROM gone);
         DELETE FROM processed_messages WHERE claim_id IN (SELECT claim_id FROM gone);
         DELETE FROM audit_log WHERE seq BETWEEN {lo} AND {hi};
         DROP TABLE gone;
         -- The kept counts are no evidence: the next open counts the rows again.
         DELETE FROM ledger_counts;"
    ))
    .unwrap();
}

/// Work for the tests: `n` submissions, drained.
fn world_with(n: usize) -> World {
    let w = World::new();
    w.add(&(0..n).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    assert_eq!(w.count("audit_log"), n as i64);
    w
}

#[test]
fn keygen_writes_owner_only_files_never_overwrites_and_a_loose_signing_key_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let w = world_with(1);
    let (key, public) = keygen(&w, "k");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&key), mode(&public)), (0o600, 0o600));
    let before = std::fs::read(&key).unwrap();
    assert!(String::from_utf8_lossy(&before).starts_with("claimgate-ed25519-signing-key "));
    let again = exits(&w, 2, &["audit", "keygen", "--out", s(&key)]);
    assert!(again.contains("never overwritten"), "{again}");
    assert_eq!(
        std::fs::read(&key).unwrap(),
        before,
        "the first key is intact"
    );

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let anchors = w.dir.path().join("anchors.jsonl");
    let loose = exits(
        &w,
        2,
        &[
            "audit",
            "anchor",
            "--out",
            s(&anchors),
            "--signing-key",
            s(&key),
        ],
    );
    assert!(loose.contains("readable by others"), "{loose}");
    assert!(!anchors.exists(), "nothing written with a refused key");
}

#[test]
fn an_anchor_names_the_head_and_its_file_is_owner_only_and_appended() {
    use std::os::unix::fs::PermissionsExt;
    let w = world_with(5);
    let printed = stdout(&w.run_ok(&["audit", "anchor"]));
    let line: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    let head: String = rw(&w)
        .query_row("SELECT hash FROM audit_log WHERE seq = 5", [], |r| {
            support::digest_at(r, 0)
        })
        .unwrap();
    assert_eq!(line["seq"], 5);
    assert_eq!(line["hash"], head.as_str());
    assert_eq!(line["records"], 5);
    assert_eq!(
        line["at"].as_str().unwrap().len(),
        "2026-07-01T09:00:00.000000Z".len()
    );
    assert!(line["ledger_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(line.get("signature").is_none(), "unsigned without a key");

    let file = w.dir.path().join("anchors.jsonl");
    anchor(&w, &file, None);
    anchor(&w, &file, None);
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A chain that no longer verifies is never anchored: nothing is appended.
    rw(&w)
        .execute(
            "UPDATE audit_log SET amount_cents = amount_cents + 1 WHERE seq = 2",
            [],
        )
        .unwrap();
    let err = exits(&w, 1, &["audit", "anchor", "--out", s(&file)]);
    assert!(err.contains("audit chain broken at seq 2"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2);
}

#[test]
fn verifying_anchors_against_a_ledger_whose_id_was_deleted_fails_and_writes_nothing() {
    // The id deleted from a copy (or a ledger swapped for one that never had one): the check
    // must not make a new id to compare with, and says the ledger has none.
    let w = world_with(3);
    let file = w.dir.path().join("anchors.jsonl");
    anchor(&w, &file, None);
    rw(&w)
        .execute("DELETE FROM ledger_meta WHERE name = 'ledger_id'", [])
        .unwrap();
    let (code, err) = verify_anchors(&w, &file, None);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("but this ledger is without an id (never relayed or anchored)"),
        "{err}"
    );
    let ids: i64 = rw(&w)
        .query_row(
            "SELECT COUNT(*) FROM ledger_meta WHERE name = 'ledger_id'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(ids, 0, "audit verify made an id");
}

#[test]
fn a_resealed_payment_passes_both_verifies_but_not_the_anchors() {
    // 1. 10 submissions; a signed anchor of the head (seq 10).
    // 2. The attacker raises payment #3 everywhere it is written — disbursement, claim, outbox
    //    payload, audit record — and re-seals every record after it with their own SHA-256;
    //    and deletes the kept counts, which the next open counts again (they are no evidence).
    // 3. `verify` and `audit verify` pass; `audit verify --anchors` exits 1 naming line 1, seq 10.
    let w = world_with(10);
    let (key, public) = keygen(&w, "k");
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, Some(&key));
    assert_eq!(verify_anchors(&w, &anchors, Some(&public)).0, 0);

    let db = rw(&w);
    let claim: i64 = db
        .query_row(
            "SELECT claim_id FROM processed_messages WHERE hex(idempotency_key) =
               (SELECT hex(idempotency_key) FROM audit_log WHERE seq = 3)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let original: i64 = db
        .query_row(
            "SELECT amount_cents FROM audit_log WHERE seq = 3",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let raised = 99_999_999;
    db.execute_batch(&format!(
        "UPDATE disbursements SET amount_cents = {raised} WHERE claim_id = {claim};
         UPDATE processed_messages SET amount_cents = {raised} WHERE claim_id = {claim};
         UPDATE outbox SET payload = json_set(payload, '$.amount_cents', {raised}) WHERE claim_id = {claim};
         UPDATE audit_log SET amount_cents = {raised} WHERE seq = 3;
         DELETE FROM ledger_counts;"
    ))
    .unwrap();
    reseal_from(&db, 3);
    drop(db);

    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    assert_eq!(
        w.sql_i64("SELECT SUM(amount_cents) FROM disbursements"),
        support::amount_sum(10) - original + raised,
        "the raised payment is in the ledger"
    );
    let (code, err) = verify_anchors(&w, &anchors, None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("anchor on line 1 (seq 10)"), "{err}");
    assert!(err.contains("re-sealed"), "{err}");
}

#[test]
fn a_cut_tail_passes_both_verifies_but_not_the_anchors() {
    // 1. 10 submissions; an anchor (seq 10).
    // 2. The attacker deletes records 8..=10 and the payments behind them.
    // 3. Both verifies pass; the anchor fails, saying the chain now ends at seq 7.
    let w = world_with(10);
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, None);
    delete_records_and_payments(&rw(&w), 8, 10);
    assert_eq!(w.count("disbursements"), 7);
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    let (code, err) = verify_anchors(&w, &anchors, None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("anchor on line 1 (seq 10)"), "{err}");
    assert!(err.contains("the chain ends at seq 7"), "{err}");
}

/// Replaces records `1..=upto` (and their payments) with a hand-made checkpoint at `upto`
/// that continues from the real hash of record `upto`, carrying `detail`.
pub(crate) fn forge_head_checkpoint(w: &World, upto: i64, detail: &str) {
    let db = rw(w);
    let continues: String = db
        .query_row("SELECT hash FROM audit_log WHERE seq = ?1", [upto], |r| {
            support::digest_at(r, 0)
        })
        .unwrap();
    delete_records_and_payments(&db, 1, upto);
    db.execute(
        "INSERT INTO audit_log (seq, kind, detail, recorded_at, prev_hash, hash)
         VALUES (?1, 'checkpoint', ?2, '2026-01-01T00:00:00.000000Z', ?3, '')",
        params![upto, detail, continues],
    )
    .unwrap();
    let hash = attacker_hash(&db, upto, &continues);
    db.execute(
        "UPDATE audit_log SET hash = ?1 WHERE seq = ?2",
        params![hash, upto],
    )
    .unwrap();
}

#[test]
fn a_deleted_head_behind_a_forged_checkpoint_is_caught_by_anchors_and_by_the_key() {
    // 1. 4 submissions, an anchor (seq 4); 6 more, an anchor (seq 10).
    // 2. The attacker deletes records 1..=5 and their payments and puts a hand-made checkpoint
    //    at seq 5 (no key: they have none).
    // 3. Both verifies pass. The anchors catch it without a key: the record of seq 4 is gone
    //    behind a checkpoint though it was written inside the retention window. With the
    //    public key, the unsigned checkpoint itself is named.
    let w = world_with(4);
    let (_, public) = keygen(&w, "k");
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, None);
    w.add(&(4..10).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    anchor(&w, &anchors, None);

    forge_head_checkpoint(
        &w,
        5,
        "retention purge of records before 2023-01-01T00:00:00.000000Z",
    );
    assert_eq!(w.count("disbursements"), 5);
    w.run_ok(&["verify"]);
    w.run_ok(&["audit", "verify"]);
    let (code, err) = verify_anchors(&w, &anchors, None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("anchor on line 1 (seq 4)"), "{err}");
    assert!(err.contains("inside the retention window"), "{err}");
    assert!(
        !err.contains("line 2"),
        "the later anchor still holds: {err}"
    );

    let no_anchors = exits(&w, 1, &["audit", "verify", "--public-key", s(&public)]);
    assert!(
        no_anchors.contains("checkpoint at seq 5: unsigned"),
        "{no_anchors}"
    );
}

#[test]
fn a_forged_checkpoint_passes_without_the_key_and_fails_with_it_unsigned_or_wrongly_signed() {
    // 1. 8 submissions; the operator's key pair, and a second key the attacker made.
    // 2. A hand-made checkpoint replaces records 1..=3: `audit verify` passes, `audit verify
    //    --public-key` fails naming the checkpoint.
    // 3. The same checkpoint signed with the attacker's key: fails, naming the other key.
    use claimgate::domain::anchor::sign_checkpoint_detail;
    use claimgate::domain::signing::SigningKey;
    let w = world_with(8);
    let (_, public) = keygen(&w, "operator");
    let (wrong, _) = keygen(&w, "attacker");
    let detail = "retention purge of records before 2021-01-01T00:00:00.000000Z: removed seq 1..=3";
    let hash3: String = rw(&w)
        .query_row("SELECT hash FROM audit_log WHERE seq = 3", [], |r| {
            support::digest_at(r, 0)
        })
        .unwrap();
    forge_head_checkpoint(&w, 3, detail);
    w.run_ok(&["audit", "verify"]);
    w.run_ok(&["verify"]);
    let err = exits(&w, 1, &["audit", "verify", "--public-key", s(&public)]);
    assert!(err.contains("checkpoint at seq 3: unsigned"), "{err}");

    let attacker = SigningKey::parse(&std::fs::read_to_string(&wrong).unwrap()).unwrap();
    let signed = sign_checkpoint_detail(detail, 3, &hash3, &attacker);
    {
        let db = rw(&w);
        db.execute("UPDATE audit_log SET detail = ?1 WHERE seq = 3", [&signed])
            .unwrap();
        // A leading checkpoint keeps its prev_hash (what record 4 links to); only its own
        // hash is recomputed.
        let hash = attacker_hash(&db, 3, &hash3);
        db.execute("UPDATE audit_log SET hash = ?1 WHERE seq = 3", [&hash])
            .unwrap();
    }
    w.run_ok(&["audit", "verify"]);
    let err = exits(&w, 1, &["audit", "verify", "--public-key", s(&public)]);
    assert!(
        err.contains(&format!(
            "checkpoint at seq 3: signed by key {}",
            attacker.public_key().key_id()
        )),
        "{err}"
    );
}

#[test]
fn a_tampered_anchor_signature_an_unsigned_anchor_and_another_ledgers_anchor_fail() {
    let w = world_with(3);
    let (key, public) = keygen(&w, "k");
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, Some(&key));
    assert_eq!(verify_anchors(&w, &anchors, Some(&public)).0, 0);

    // Claim more records than there were: the signature no longer covers the line.
    let text = std::fs::read_to_string(&anchors).unwrap();
    let tampered = w.dir.path().join("tampered.jsonl");
    std::fs::write(&tampered, text.replace(r#""records":3"#, r#""records":4"#)).unwrap();
    let (code, err) = verify_anchors(&w, &tampered, Some(&public));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("anchor on line 1 (seq 3): signature does not verify"),
        "{err}"
    );

    // A file of unsigned anchors checked with a key: the command line's mistake, said as such
    // (exit 2), not "the ledger contradicts its evidence".
    let unsigned = w.dir.path().join("unsigned.jsonl");
    anchor(&w, &unsigned, None);
    let (code, err) = verify_anchors(&w, &unsigned, Some(&public));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("none of the 1 anchor(s) is signed") && !err.contains("contradicts"),
        "{err}"
    );
    // One unsigned anchor among signed ones is a signature stripped: a contradiction.
    let mixed = w.dir.path().join("mixed.jsonl");
    std::fs::write(
        &mixed,
        format!(
            "{}{}",
            std::fs::read_to_string(&anchors).unwrap(),
            std::fs::read_to_string(&unsigned).unwrap()
        ),
    )
    .unwrap();
    let (code, err) = verify_anchors(&w, &mixed, Some(&public));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("anchor on line 2 (seq 3): unsigned"), "{err}");
    assert_eq!(
        verify_anchors(&w, &unsigned, None).0,
        0,
        "no key: unsigned is fine"
    );

    let other = world_with(3);
    let (code, err) = verify_anchors(&other, &anchors, None);
    assert_eq!(code, 1);
    assert!(err.contains("taken of ledger"), "{err}");

    let garbage = w.dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, format!("{text}not an anchor\n")).unwrap();
    let (code, err) = verify_anchors(&w, &garbage, None);
    assert_eq!(code, 1);
    assert!(err.contains("line 2: not an anchor"), "{err}");
}

/// Moves the first `n` records (and their claims) back to `old` and re-seals, as a ledger that
/// has been running that long would look.
fn backdate(w: &World, n: i64, old: &str) {
    let db = rw(w);
    db.execute(
        "UPDATE audit_log SET recorded_at = ?1 WHERE seq <= ?2",
        params![old, n],
    )
    .unwrap();
    db.execute(
        "UPDATE processed_messages SET claimed_at = ?1 WHERE hex(idempotency_key) IN
         (SELECT hex(idempotency_key) FROM audit_log WHERE seq <= ?2 AND kind = 'processed')",
        params![old, n],
    )
    .unwrap();
    reseal_from(&db, 1);
}

#[test]
fn anchors_taken_before_a_signed_retention_purge_still_hold_after_it() {
    // 1. 6 submissions from 2020 (back-dated) and an anchor (seq 6); 4 more, all 10 back-dated,
    //    a signed anchor (seq 10); 5 recent ones, a signed anchor (seq 15). Relay everything.
    // 2. A signed purge of everything before 2021: records 1..=10 go, a checkpoint takes seq 10.
    // 3. Every anchor holds: seq 6 covered by the signed checkpoint, seq 10 by the hash it
    //    continues from, seq 15 as it was. With the public key too.
    // 4. An unsigned purge later: passes without the key, fails with it naming the checkpoint.
    let w = world_with(6);
    let (key, public) = keygen(&w, "k");
    backdate(&w, 6, "2020-02-01T00:00:00.000000Z");
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, Some(&key));
    w.add(&(6..10).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    backdate(&w, 10, "2020-02-01T00:00:00.000000Z");
    anchor(&w, &anchors, Some(&key));
    w.add(&(10..15).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    anchor(&w, &anchors, Some(&key));
    w.run_ok(&["relay", "--exit-when-idle"]);
    assert_eq!(verify_anchors(&w, &anchors, Some(&public)).0, 0);

    let export = w.dir.path().join("purged.jsonl");
    let out = w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2021-01-01",
        "--export",
        s(&export),
        "--batch-records-max",
        "4",
        "--signing-key",
        s(&key),
    ]);
    assert!(
        stdout(&out).contains("checkpoint signed with key"),
        "{}",
        stdout(&out)
    );
    assert_eq!(w.count("processed_messages"), 5);
    assert_eq!(
        w.sql_i64("SELECT seq FROM audit_log WHERE kind = 'checkpoint'"),
        10
    );
    let out = w.run_ok(&[
        "audit",
        "verify",
        "--anchors",
        s(&anchors),
        "--public-key",
        s(&public),
    ]);
    let said = stdout(&out);
    assert!(
        said.contains("2 of 3 found with the anchored hash, 1 covered"),
        "{said}"
    );
    assert!(said.contains("1 checkpoint(s)"), "{said}");
    w.run_ok(&["verify"]);

    // Old ledgers and unsigned checkpoints still verify when no key is asked for.
    w.add(&(15..20).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    backdate(&w, 15, "2020-03-01T00:00:00.000000Z");
    w.run_ok(&["relay", "--exit-when-idle"]);
    let export2 = w.dir.path().join("purged-2.jsonl");
    w.run_ok(&[
        "retention",
        "purge",
        "--before",
        "2021-01-01",
        "--export",
        s(&export2),
    ]);
    w.run_ok(&["audit", "verify"]);
    let err = exits(&w, 1, &["audit", "verify", "--public-key", s(&public)]);
    assert!(err.contains("checkpoint at seq 15: unsigned"), "{err}");

    // Exported files are checked the same way: the second purge's export carries the first,
    // signed checkpoint; an export of the ledger now carries the unsigned one.
    let out = w.run_ok(&[
        "audit",
        "verify",
        "--file",
        s(&export2),
        "--public-key",
        s(&public),
    ]);
    assert!(stdout(&out).contains("1 checkpoint(s)"), "{}", stdout(&out));
    let exported = w.dir.path().join("audit.jsonl");
    w.run_ok(&["audit", "export", "--out", s(&exported)]);
    w.run_ok(&["audit", "verify", "--file", s(&exported)]);
    let err = exits(
        &w,
        1,
        &[
            "audit",
            "verify",
            "--file",
            s(&exported),
            "--public-key",
            s(&public),
        ],
    );
    assert!(err.contains("checkpoint at seq 15: unsigned"), "{err}");
}

#[test]
fn a_worker_anchors_on_its_own_to_a_file_and_a_stream_and_the_anchors_verify() {
    // 1. A long-running worker with `--anchor-every 200ms`, a file, a stream and a signing
    //    key; 200 submissions arrive.
    // 2. Anchors keep coming while it runs (at least 3, the newest naming seq 200); SIGTERM
    //    stops it with exit 0 after one last anchor.
    // 3. The file and the stream hold the same anchors, all signed, and `audit verify
    //    --anchors --public-key` passes against each.
    let w = World::new();
    let (key, public) = keygen(&w, "k");
    let anchors = w.dir.path().join("anchors.jsonl");
    let mut worker = w.spawn(&[
        "run",
        "--anchor-every",
        "200ms",
        "--anchor-out",
        s(&anchors),
        "--anchor-stream",
        "grants:audit:anchors",
        "--signing-key",
        s(&key),
    ]);
    w.add(&(0..200).map(support::submission).collect::<Vec<_>>());
    let read = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&anchors)
            .unwrap_or_default()
            .lines()
            // While the worker runs, the last line may be half-appended as we read it.
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let running = support::wait_for(std::time::Duration::from_secs(30), || {
        let lines = read();
        lines.len() >= 3 && lines.last().is_some_and(|a| a["seq"] == 200)
    });
    assert!(running, "anchors while running: {:?}", read());
    let before_stop = read().len();
    support::signal(&worker, libc::SIGTERM);
    let status = support::wait_exit(&mut worker, std::time::Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    let lines = read();
    let text = std::fs::read_to_string(&anchors).unwrap();
    assert_eq!(
        lines.len(),
        text.lines().count(),
        "every line an anchor:\n{text}"
    );
    assert!(lines.len() > before_stop, "one more anchor on stopping");
    assert!(lines.iter().all(|a| a["signature"].is_string()));
    assert_eq!(w.xlen("grants:audit:anchors"), lines.len() as u64);

    let from_stream: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("grants:audit:anchors")
        .arg("-")
        .arg("+")
        .query(&mut w.conn())
        .unwrap();
    let streamed = w.dir.path().join("streamed.jsonl");
    let text: String = from_stream
        .ids
        .iter()
        .map(|entry| format!("{}\n", entry.get::<String>("anchor").unwrap()))
        .collect();
    std::fs::write(&streamed, text).unwrap();
    for file in [&anchors, &streamed] {
        let (code, err) = verify_anchors(&w, file, Some(&public));
        assert_eq!(code, 0, "{err}");
    }
}

#[test]
fn a_worker_anchoring_hourly_writes_its_last_anchor_and_exits_0_at_once_on_sigterm() {
    // 1. A worker with `--anchor-every 1h` pays 20 submissions; no anchor is due for an hour.
    // 2. SIGTERM: the anchoring thread, waiting for the hour on the worker's end, takes the
    //    last anchor as soon as the worker returns (before, it looked every 50 ms), and the
    //    worker exits 0 with exactly that one anchor, pinning all 20 records. A wait that the
    //    worker's end did not cut short would run to the hour and outlast the 60 s deadline.
    let w = World::new();
    let anchors = w.dir.path().join("anchors.jsonl");
    let mut worker = w.spawn(&["run", "--anchor-every", "1h", "--anchor-out", s(&anchors)]);
    w.add(&(0..20).map(support::submission).collect::<Vec<_>>());
    assert!(support::wait_for(
        std::time::Duration::from_secs(30),
        || w.count_once_made("processed_messages") == 20
    ));
    // The file is made at start (so a bad path is refused then), empty until the first anchor.
    let before_stop = std::fs::read_to_string(&anchors).unwrap_or_default();
    assert_eq!(before_stop, "", "no anchor is due within the hour");
    support::signal(&worker, libc::SIGTERM);
    let status = support::wait_exit(&mut worker, std::time::Duration::from_secs(60));
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&anchors).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "one anchor, the last:\n{text}");
    assert_eq!(lines[0]["seq"], 20, "{text}");
}

#[test]
fn a_worker_that_cannot_write_its_anchors_stops_with_exit_1() {
    // 1. The anchors stream key holds a string (WRONGTYPE: it will not clear by itself).
    // 2. A long-running worker (no --exit-when-idle) stops by itself, exit 1, naming anchoring.
    // 3. An anchors file in a missing directory is refused at start (exit 2).
    let w = world_with(3);
    redis::cmd("SET")
        .arg("grants:audit:anchors")
        .arg("not a stream")
        .query::<()>(&mut w.conn())
        .unwrap();
    let mut worker = w.spawn(&[
        "run",
        "--anchor-every",
        "200ms",
        "--anchor-stream",
        "grants:audit:anchors",
    ]);
    let status = support::wait_exit(&mut worker, std::time::Duration::from_secs(30));
    assert_eq!(status.code(), Some(1));
    let err = worker.log_text();
    assert!(err.contains("anchoring failed"), "{err}");
    assert!(err.contains("WRONGTYPE"), "{err}");

    let missing = w.dir.path().join("no-such-dir").join("anchors.jsonl");
    let refused = exits(
        &w,
        2,
        &[
            "run",
            "--exit-when-idle",
            "--anchor-every",
            "1s",
            "--anchor-out",
            s(&missing),
        ],
    );
    assert!(refused.contains("anchors file"), "{refused}");
    let no_target = exits(&w, 2, &["run", "--exit-when-idle", "--anchor-every", "1s"]);
    assert!(no_target.contains("--anchor-out"), "{no_target}");
}

#[test]
fn an_anchors_file_that_fails_for_a_while_is_one_episode_and_the_worker_stays_up() {
    // 1. A long-running worker anchors every 200ms to a file; its first anchor lands.
    // 2. The file is replaced by a directory (every append fails, EISDIR: an I/O error, which
    //    is transient) for a second, then the directory is removed.
    // 3. One WARN when it started, one INFO when it cleared; the worker stayed up throughout,
    //    paid what arrived meanwhile, and the anchors written after it verify.
    let w = World::new();
    let anchors = w.dir.path().join("anchors.jsonl");
    let logged = support::Logged::spawn(w.cmd(&[
        "run",
        "--anchor-every",
        "200ms",
        "--anchor-out",
        s(&anchors),
    ]));
    let lines = || {
        std::fs::read_to_string(&anchors)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    assert!(support::wait_for(
        std::time::Duration::from_secs(30),
        || lines() >= 1
    ));
    std::fs::remove_file(&anchors).unwrap();
    std::fs::create_dir(&anchors).unwrap();
    logged.wait_log("writing an anchor failed");
    w.add(&(0..5).map(support::submission).collect::<Vec<_>>());
    std::thread::sleep(std::time::Duration::from_secs(1));
    std::fs::remove_dir(&anchors).unwrap();
    logged.wait_log("writing an anchor recovered");
    let mut logged = logged;
    assert!(logged.alive(), "the worker rode out the failure");
    logged.assert_one_episode("writing an anchor");
    assert!(support::wait_for(
        std::time::Duration::from_secs(30),
        || { w.count_once_made("disbursements") == 5 }
    ));
    assert_eq!(logged.stop().code(), Some(0));
    assert_eq!(verify_anchors(&w, &anchors, None).0, 0);
}
