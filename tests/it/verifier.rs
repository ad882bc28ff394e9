//! The independent verifier (`tools/verify-evidence.py`: Python's standard library and
//! `openssl`, no claimgate code) against `claimgate audit verify`, case by case: on ledgers the
//! real binary made (SQLite and PostgreSQL, with purges, holds, batches and a migrated chain)
//! and on every tampering the evidence suite knows, the two must say the same — pass or fail,
//! and the same seq when the chain breaks. And it is no rubber stamp: a hash planted in the
//! export fails it, and over generated records with every awkward character both spellings of
//! every hashed and signed byte agree.

use crate::evidence::{
    attacker_hash, delete_records_and_payments, forge_head_checkpoint, reseal_from,
};
use crate::report::{ledger_with_everything, s, stderr, stdout};
use crate::support::{self, RunWithDeadline, Store, World};
use claimgate::domain::anchor::{sign_checkpoint_detail, Anchor};
use claimgate::domain::audit::{detail, seal_batch, BatchLink, Kind, Record, Verifier};
use claimgate::domain::signing::SigningKey;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The verifier as shipped.
const VERIFIER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/verify-evidence.py");

/// `python3 tools/verify-evidence.py ARGS`.
fn independent(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(VERIFIER)
        .args(args)
        .run_within(Duration::from_secs(300))
}

/// The evidence one case is checked against.
#[derive(Clone, Copy, Default)]
pub(crate) struct Against<'a> {
    pub(crate) anchors: Option<&'a Path>,
    pub(crate) public: Option<&'a Path>,
    /// For the verifier: the ledger id the anchors must name (which claimgate reads from the
    /// ledger, and an auditor from the report).
    pub(crate) ledger_id: Option<&'a str>,
}

/// `audit verify [--anchors] [--public-key]` on the ledger, and the verifier on a fresh export
/// of it with the same evidence: both must exit `code`, and name the same seq if the chain
/// breaks. Returns both stderrs.
pub(crate) fn agree(w: &World, with: Against<'_>, code: i32) -> (String, String) {
    let mut evidence: Vec<&str> = Vec::new();
    if let Some(a) = with.anchors {
        evidence.extend(["--anchors", s(a)]);
    }
    if let Some(k) = with.public {
        evidence.extend(["--public-key", s(k)]);
    }
    let mut args = vec!["audit", "verify"];
    args.extend(&evidence);
    let ours = w.run(&args);
    let export = export(w);
    let mut theirs_args = vec!["--export", s(&export)];
    theirs_args.extend(&evidence);
    if let Some(id) = with.ledger_id {
        theirs_args.extend(["--ledger-id", id]);
    }
    let theirs = independent(&theirs_args);
    let (a, b) = (stderr(&ours), stderr(&theirs));
    assert_eq!(
        (ours.status.code(), theirs.status.code()),
        (Some(code), Some(code)),
        "claimgate {args:?}: {a}{}\nverify-evidence: {b}{}",
        stdout(&ours),
        stdout(&theirs)
    );
    assert_eq!(broken_at(&a), broken_at(&b), "{a}\n{b}");
    if code == 0 {
        // The same records, the same head.
        let line = |out: &Output| stdout(out).lines().next().unwrap_or("").to_owned();
        assert_eq!(line(&ours), line(&theirs));
    }
    (a, b)
}

/// A fresh `audit export` file of the world's ledger.
fn export(w: &World) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("export-")
        .tempdir_in(w.dir.path())
        .unwrap()
        .keep();
    let out = dir.join("audit.jsonl");
    w.run_ok(&["audit", "export", "--out", s(&out)]);
    out
}

/// The seq a message says the chain broke at.
fn broken_at(text: &str) -> Option<i64> {
    let at = text.find("audit chain broken at seq ")? + "audit chain broken at seq ".len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn keygen(w: &World, name: &str) -> (PathBuf, PathBuf) {
    let key = w.dir.path().join(name);
    w.run_ok(&["audit", "keygen", "--out", s(&key)]);
    (key.clone(), w.dir.path().join(format!("{name}.pub")))
}

pub(crate) fn anchor(w: &World, file: &Path, key: Option<&Path>) {
    let mut args = vec!["audit", "anchor", "--out", s(file)];
    if let Some(k) = key {
        args.extend(["--signing-key", s(k)]);
    }
    w.run_ok(&args);
}

fn drained(n: usize) -> World {
    let w = World::new();
    w.add(&(0..n).map(support::submission).collect::<Vec<_>>());
    w.drain(&[]);
    w
}

fn rw(w: &World) -> rusqlite::Connection {
    rusqlite::Connection::open(&w.db).unwrap()
}

#[test]
fn the_verifier_agrees_with_audit_verify_on_a_full_sqlite_ledger_and_fails_a_planted_hash() {
    let (w, kept) = ledger_with_everything(Store::Sqlite);
    let full = Against {
        anchors: Some(&kept.anchors),
        public: Some(&kept.public),
        ..Against::default()
    };
    agree(&w, full, 0);
    agree(&w, Against::default(), 0);
    agree(
        &w,
        Against {
            public: Some(&kept.public),
            ..Against::default()
        },
        0,
    );

    // One hash replaced in the export alone: the ledger is fine, the file is not.
    let file = export(&w);
    let text = std::fs::read_to_string(&file).unwrap();
    let fifth: Record = serde_json::from_str(text.lines().nth(4).unwrap()).unwrap();
    let planted = text.replacen(&fifth.hash, &"7".repeat(64), 1);
    let planted_file = w.dir.path().join("planted.jsonl");
    std::fs::write(&planted_file, planted).unwrap();
    let theirs = independent(&["--export", s(&planted_file)]);
    assert_eq!(theirs.status.code(), Some(1), "{}", stdout(&theirs));
    assert_eq!(broken_at(&stderr(&theirs)), Some(fifth.seq));
    let ours = w.run(&["audit", "verify", "--file", s(&planted_file)]);
    assert_eq!(ours.status.code(), Some(1));
    assert_eq!(broken_at(&stderr(&ours)), Some(fifth.seq));
    w.run_ok(&["audit", "verify"]);

    // The anchors themselves tampered with: a count raised after signing, an unsigned one, a
    // line that is no anchor, an anchor of another ledger.
    let anchors = std::fs::read_to_string(&kept.anchors).unwrap();
    let variant = |name: &str, text: String| {
        let p = w.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let raised = variant(
        "raised.jsonl",
        anchors.replacen(r#""records":"#, r#""records":9"#, 1),
    );
    let with_key = |a| Against {
        anchors: Some(a),
        public: Some(&kept.public),
        ..Against::default()
    };
    agree(&w, with_key(raised.as_path()), 1);
    let unsigned = w.dir.path().join("unsigned.jsonl");
    anchor(&w, &unsigned, None);
    // A key for anchors none of which is signed: the command line's mistake (exit 2), both.
    agree(&w, with_key(unsigned.as_path()), 2);
    agree(
        &w,
        Against {
            anchors: Some(&unsigned),
            ..Against::default()
        },
        0,
    );
    let garbage = variant("garbage.jsonl", format!("{anchors}not an anchor\n"));
    agree(&w, with_key(garbage.as_path()), 1);
    let other = drained(3);
    let foreign = other.dir.path().join("foreign.jsonl");
    anchor(&other, &foreign, None);
    // Without the ledger's id the verifier still fails it (the hashes differ); with the id
    // the report names, it says why, as claimgate does.
    let foreign_only = Against {
        anchors: Some(&foreign),
        ..Against::default()
    };
    agree(&w, foreign_only, 1);
    let id = w.sql_text("SELECT value FROM ledger_meta WHERE name = 'ledger_id'");
    let (ours, theirs) = agree(
        &w,
        Against {
            ledger_id: Some(&id),
            ..foreign_only
        },
        1,
    );
    assert!(
        ours.contains("taken of ledger") && theirs.contains("taken of ledger"),
        "{ours}\n{theirs}"
    );
}

#[test]
fn the_verifier_agrees_with_audit_verify_on_every_tampering_the_evidence_suite_knows() {
    // A payment raised and every record after it re-sealed: passes both without anchors,
    // fails both with them.
    let w = drained(10);
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, None);
    let with = Against {
        anchors: Some(&anchors),
        ..Against::default()
    };
    rw(&w)
        .execute(
            "UPDATE audit_log SET amount_cents = 99999999 WHERE seq = 3",
            [],
        )
        .unwrap();
    agree(&w, Against::default(), 1);
    reseal_from(&rw(&w), 3);
    agree(&w, Against::default(), 0);
    agree(&w, with, 1);

    // A cut tail.
    let w = drained(10);
    let anchors = w.dir.path().join("anchors.jsonl");
    anchor(&w, &anchors, None);
    delete_records_and_payments(&rw(&w), 8, 10);
    agree(&w, Against::default(), 0);
    let (ours, theirs) = agree(
        &w,
        Against {
            anchors: Some(&anchors),
            ..Against::default()
        },
        1,
    );
    for said in [ours, theirs] {
        assert!(
            said.contains("anchor on line 1 (seq 10)") && said.contains("the chain ends at seq 7"),
            "{said}"
        );
    }

    // The head deleted behind a hand-made checkpoint: anchors inside the retention window
    // catch it without a key; the key catches the unsigned checkpoint without anchors.
    let w = drained(4);
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
    agree(&w, Against::default(), 0);
    let (ours, theirs) = agree(
        &w,
        Against {
            anchors: Some(&anchors),
            ..Against::default()
        },
        1,
    );
    for said in [ours, theirs] {
        assert!(
            said.contains("inside the retention window") && !said.contains("line 2"),
            "{said}"
        );
    }
    agree(
        &w,
        Against {
            public: Some(&public),
            ..Against::default()
        },
        1,
    );

    // A forged checkpoint signed with the attacker's own key.
    let w = drained(8);
    let (_, public) = keygen(&w, "operator");
    let attacker = SigningKey::from_seed([9; 32]);
    let text = "retention purge of records before 2021-01-01T00:00:00.000000Z: removed seq 1..=3";
    let hash3: String = rw(&w)
        .query_row("SELECT hash FROM audit_log WHERE seq = 3", [], |r| {
            support::digest_at(r, 0)
        })
        .unwrap();
    forge_head_checkpoint(&w, 3, text);
    let signed = sign_checkpoint_detail(text, 3, &hash3, &attacker);
    {
        let db = rw(&w);
        db.execute("UPDATE audit_log SET detail = ?1 WHERE seq = 3", [&signed])
            .unwrap();
        let hash = attacker_hash(&db, 3, &hash3);
        db.execute("UPDATE audit_log SET hash = ?1 WHERE seq = 3", [&hash])
            .unwrap();
    }
    agree(&w, Against::default(), 0);
    let (ours, theirs) = agree(
        &w,
        Against {
            public: Some(&public),
            ..Against::default()
        },
        1,
    );
    let named = format!("signed by key {}", attacker.public_key().key_id());
    assert!(
        ours.contains(&named) && theirs.contains(&named),
        "{ours}\n{theirs}"
    );

    // An edit that touches no hashed field (the insider suite's): verify fails, and both
    // chain checks pass, as they should — the chain never held it.
    let w = drained(2);
    w.run_ok(&["hold", "add", "A-000001", "--reason", "case 7"]);
    rw(&w).execute("DELETE FROM legal_holds", []).unwrap();
    assert_eq!(w.run(&["verify"]).status.code(), Some(1));
    agree(&w, Against::default(), 0);
}

#[test]
fn the_verifier_agrees_on_shared_ledgers_with_batches_holds_purges_and_a_migrated_chain() {
    // 1. A PostgreSQL ledger built like the report's (batches of one and of several, a signed
    //    purge, holds, signed anchors): both pass, then both fail a member edited in place.
    let (w, kept) = ledger_with_everything(Store::Postgres);
    let full = Against {
        anchors: Some(&kept.anchors),
        public: Some(&kept.public),
        ..Against::default()
    };
    agree(&w, full, 0);
    let exported = std::fs::read_to_string(export(&w)).unwrap();
    assert!(exported.contains(r#""kind":"batch""#) && exported.contains(r#""batch_index":2"#));
    assert!(exported.contains(r#""kind":"checkpoint""#));
    let member =
        "(batch_id, batch_index) = (SELECT batch_id, batch_index FROM audit_log WHERE seq = 6)";
    w.sql().exec(&format!(
        "UPDATE audit_members SET amount_cents = amount_cents + 1 WHERE {member}"
    ));
    let (ours, _) = agree(&w, full, 1);
    assert!(ours.contains("audit chain broken at seq 6"), "{ours}");
    w.sql().exec(&format!(
        "UPDATE audit_members SET amount_cents = amount_cents - 1 WHERE {member}"
    ));
    agree(&w, full, 0);

    // 2. A SQLite ledger with a signed purge and a hold, migrated, then worked on in batches
    //    of several on PostgreSQL: one chain, records sealed alone then batches.
    let (sqlite, kept) = ledger_with_everything(Store::Sqlite);
    let url = crate::pg::fresh_database();
    sqlite.run_ok(&["migrate", "--to", &url]);
    let pg = World::on_postgres_url(&url);
    agree(
        &pg,
        Against {
            public: Some(&kept.public),
            ..Against::default()
        },
        0,
    );
    pg.add(&(40..60).map(support::submission).collect::<Vec<_>>());
    pg.drain(&[]);
    pg.run_ok(&["hold", "add", "A-000041", "--reason", "case 9"]);
    let anchors = pg.dir.path().join("anchors.jsonl");
    std::fs::copy(&kept.anchors, &anchors).unwrap();
    anchor(&pg, &anchors, Some(&kept.key));
    agree(
        &pg,
        Against {
            anchors: Some(&anchors),
            public: Some(&kept.public),
            ..Against::default()
        },
        0,
    );
    let exported = std::fs::read_to_string(export(&pg)).unwrap();
    let first_member = exported
        .lines()
        .position(|l| l.contains(r#""batch_index":1"#))
        .unwrap();
    assert!(
        exported
            .lines()
            .take(first_member)
            .all(|l| !l.contains("batch_index"))
            && first_member > 5,
        "records sealed alone first, then batches"
    );
    // A member deleted from a batch of several: its link names one member more.
    pg.sql().exec(
        "DELETE FROM audit_members WHERE (batch_id, batch_index) =
           (SELECT batch_id, 2 FROM audit_batches WHERE record_count >= 3 ORDER BY batch_id DESC LIMIT 1)",
    );
    agree(&pg, Against::default(), 1);
}

#[test]
fn both_spellings_of_every_hashed_and_signed_byte_agree_over_generated_records() {
    // Records with text full of what JSON escapes and what it does not (controls, quotes,
    // backslashes, DEL, line separators, non-ASCII), amounts at i64's ends: a leading signed
    // checkpoint, records sealed alone and batches of members with their links, and signed
    // anchors with the same awkward text — written as `audit export` writes them. The
    // verifier must accept all of it, and refuse it once one character changes.
    let mut rng = fastrand::Rng::with_seed(38);
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::from_seed([38; 32]);
    let public = dir.path().join("key.pub");
    std::fs::write(&public, key.public_key().to_text()).unwrap();
    let chain = generated_chain(&mut rng, &key);
    let mut v = Verifier::default();
    for r in &chain {
        v.push(r).expect("the generated chain is sound");
    }
    let ledger_id = awkward(&mut rng, 20);
    let anchors: Vec<String> = chain
        .iter()
        // What seq n hashed to: a record sealed alone's or a link's own hash (a leading
        // checkpoint stands for the record it continues from, a member for nothing).
        .filter(|r| r.batch_index.is_none() && r.kind != Kind::Checkpoint && r.seq % 7 == 0)
        .map(|r| {
            let mut a = Anchor {
                ledger_id: ledger_id.clone(),
                seq: r.seq,
                hash: r.hash.clone(),
                records: rng.u64(..),
                recorded_at: Some(r.recorded_at.clone()),
                at: awkward(&mut rng, 12),
                key_id: None,
                signature: None,
            };
            a.sign(&key);
            a.to_line() + "\n"
        })
        .collect();
    assert!(anchors.len() > 5);
    let anchors_file = dir.path().join("anchors.jsonl");
    std::fs::write(&anchors_file, anchors.concat()).unwrap();
    let lines: Vec<String> = chain
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    let file = dir.path().join("audit.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let args = [
        "--export",
        s(&file),
        "--anchors",
        s(&anchors_file),
        "--public-key",
        s(&public),
    ];
    let out = independent(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains(&format!(
            "audit chain intact: {} records, head {}",
            v.count,
            v.head()
        )),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains(&format!(
        "anchors hold: {} of {}",
        anchors.len(),
        anchors.len()
    )));

    // One character of one record changed (its hash left as it was): refused at that record.
    let victim = 1 + rng.usize(..lines.len() - 1);
    let mut edited: Record = serde_json::from_str(&lines[victim]).unwrap();
    edited.recorded_at.push('\u{7f}');
    let mut changed = lines.clone();
    changed[victim] = serde_json::to_string(&edited).unwrap();
    std::fs::write(&file, changed.join("\n") + "\n").unwrap();
    let out = independent(&args);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        broken_at(&stderr(&out)),
        Some(edited.seq),
        "{}",
        stderr(&out)
    );
}

/// Text of up to `n` characters drawn mostly from what JSON must escape or is tempted to.
fn awkward(rng: &mut fastrand::Rng, n: usize) -> String {
    let odd = [
        '"', '\\', '\u{0}', '\u{1}', '\u{8}', '\t', '\n', '\u{b}', '\u{c}', '\r', '\u{1f}',
        '\u{7f}', '/', 'é', '\u{2028}', '\u{202e}', '😀', '<', '&', ' ',
    ];
    (0..rng.usize(1..=n))
        .map(|_| {
            if rng.bool() {
                odd[rng.usize(..odd.len())]
            } else {
                rng.alphanumeric()
            }
        })
        .collect()
}

/// A chain of about 400 records: a leading signed checkpoint, then records sealed alone and
/// batches mixed.
fn generated_chain(rng: &mut fastrand::Rng, key: &SigningKey) -> Vec<Record> {
    let kinds = [
        Kind::Processed,
        Kind::Duplicate,
        Kind::DeadLetter,
        Kind::Conflict,
        Kind::Vanished,
        Kind::HoldAdded,
        Kind::HoldRemoved,
        Kind::Restored,
        Kind::ConflictApproved,
        Kind::ConflictRejected,
    ];
    let text = |rng: &mut fastrand::Rng, n| rng.bool().then(|| awkward(rng, n));
    let record = |rng: &mut fastrand::Rng, seq: i64| -> Record {
        Record {
            seq,
            idempotency_key: text(rng, 64),
            award_id: text(rng, 30),
            amount_cents: Some([i64::MIN, i64::MAX, 0, -1, 125_000][seq as usize % 5]),
            stream_entry_id: text(rng, 20),
            consumer: text(rng, 10),
            delivery_count: Some(seq),
            detail: text(rng, 80),
            ..Record::unsealed(kinds[seq as usize % kinds.len()], &awkward(rng, 27))
        }
    };
    let continues = "ab".repeat(32);
    let purged = awkward(rng, 60);
    let mut checkpoint = Record {
        seq: 10,
        detail: Some(sign_checkpoint_detail(&purged, 10, &continues, key)),
        ..Record::unsealed(Kind::Checkpoint, "2019-01-01T00:00:00.000000Z")
    };
    checkpoint.seal(&continues);
    let mut chain = vec![checkpoint];
    let (mut head, mut seq, mut batch_id) = (continues, 10, 0);
    while chain.len() < 400 {
        if rng.bool() {
            seq += 1;
            let mut r = record(rng, seq);
            r.seal(&head);
            head.clone_from(&r.hash);
            chain.push(r);
            continue;
        }
        let mut members: Vec<Record> = (0..rng.i64(1..6))
            .map(|i| record(rng, seq + 1 + i))
            .collect();
        seq += members.len() as i64;
        let last_hash = seal_batch(&mut members);
        batch_id += 1;
        let link = Record::link(
            seq,
            detail::batch_link(&BatchLink {
                batch_id,
                records: members.len() as i64,
                last_hash,
                outbox_rows: 1,
                outbox_first: batch_id,
            }),
            &awkward(rng, 27),
            &head,
        );
        head.clone_from(&link.hash);
        chain.extend(members);
        chain.push(link);
    }
    chain
}
