//! The demo's input: realistic grant drawdown submissions, with the things that go wrong in
//! real feeds mixed in. Pure and deterministic (seeded), so every run tells the same story and
//! the demo knows exactly what the ledger must end up holding.

/// One stream entry: field/value pairs in order.
pub type Fields = Vec<(String, Vec<u8>)>;

/// What the feed contains, and so what the ledger must hold afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// Entries sent, everything included.
    pub entries: u64,
    /// Distinct valid submissions: each must be paid exactly once.
    pub unique: u64,
    /// Sum of the distinct valid submissions' amounts, in cents.
    pub cents_total: i64,
    /// Byte-identical resends of submissions already sent.
    pub resends: u64,
    /// Resubmissions that reuse an award's timestamp with a different payload.
    pub conflicting: u64,
    /// The reason code each malformed entry must be dead-lettered with.
    pub malformed_codes: Vec<&'static str>,
}

/// The feed, in the order it is sent.
#[derive(Debug, Clone)]
pub struct Feed {
    /// Stream entries in send order.
    pub entries: Vec<Fields>,
    /// What they add up to.
    pub expected: Expected,
}

/// Programs the awards belong to: (award id prefix, program name).
const PROGRAMS: [(&str, &str); 5] = [
    ("RB", "rural-broadband"),
    ("WQ", "water-quality"),
    ("EL", "early-literacy"),
    ("HR", "heat-resilience"),
    ("TR", "transit-access"),
];

/// Recipients, so payloads look like what a grants office sends.
const RECIPIENTS: [&str; 12] = [
    "Mesa County Library District",
    "Blue Ridge Rural Electric Cooperative",
    "City of Yakima Public Works",
    "Northern Plains Tribal Health Board",
    "Delta Regional Water Authority",
    "Lowcountry Community Action Agency",
    "Upper Peninsula Transit Cooperative",
    "Tri-County School District 7",
    "Coastal Bend Housing Partnership",
    "Kenai Peninsula Borough",
    "Ozark Foothills Regional Planning",
    "Rio Grande Valley Food Bank",
];

/// Drawdowns (monthly submissions) per award.
const DRAWDOWNS_PER_AWARD: usize = 3;

/// One in this many submissions is sent again, byte for byte, a little later.
const RESEND_ONE_IN: u32 = 20;

/// A valid submission's payload.
fn payload(rng: &mut fastrand::Rng, award: usize, drawdown: usize) -> (String, i64) {
    let (prefix, program) = PROGRAMS[award % PROGRAMS.len()];
    let recipient = RECIPIENTS[award % RECIPIENTS.len()];
    let amount_cents = rng.i64(25_000..=2_500_000);
    let month = 7 + drawdown as u32; // July, August, September 2026
    let day = 1 + (award % 27) as u32;
    let (hour, minute, second) = (8 + rng.u32(0..10), rng.u32(0..60), rng.u32(0..60));
    let json = format!(
        concat!(
            r#"{{"award_id":"{}-2026-{:05}","submission_timestamp":"2026-{:02}-{:02}T{:02}:{:02}:{:02}Z","#,
            r#""amount_cents":{},"currency":"USD","recipient":"{}","program":"{}","#,
            r#""period":"2026-{:02}","invoice":"INV-{:05}-{:02}"}}"#
        ),
        prefix,
        award,
        month,
        day,
        hour,
        minute,
        second,
        amount_cents,
        recipient,
        program,
        month,
        award,
        drawdown + 1
    );
    (json, amount_cents)
}

fn entry(payload: &str) -> Fields {
    vec![("payload".to_owned(), payload.as_bytes().to_vec())]
}

/// Entries that must each be dead-lettered, one per class of problem, with the code expected.
fn malformed() -> Vec<(Fields, &'static str)> {
    let ts = "2026-07-14T10:00:00Z";
    vec![
        (
            entry(
                r#"{"award_id":"RB-2026-09001","submission_timestamp":"2026-07-14T10:00:00Z","amount_cents":125"#,
            ),
            "not_json",
        ),
        (
            entry(&format!(
                r#"{{"award_id":"WQ-2026-09002","submission_timestamp":"{ts}","currency":"USD"}}"#
            )),
            "missing_field",
        ),
        (
            entry(
                r#"{"award_id":"EL-2026-09003","submission_timestamp":"07/14/2026 10:00","amount_cents":48000}"#,
            ),
            "bad_timestamp",
        ),
        (
            entry(&format!(
                r#"{{"award_id":"HR-2026-09004","submission_timestamp":"{ts}","amount_cents":-4500}}"#
            )),
            "amount_not_positive",
        ),
        (
            entry(&format!(
                r#"{{"award_id":"TR-2026-09005","submission_timestamp":"{ts}","amount_cents":"1250.00"}}"#
            )),
            "wrong_type",
        ),
        (
            entry(&format!(
                r#"{{"award_id":"RB-2026-09006","submission_timestamp":"{ts}","amount_cents":1250.5}}"#
            )),
            "amount_not_integer",
        ),
        (
            vec![(
                "body".to_owned(),
                br#"{"award_id":"WQ-2026-09007"}"#.to_vec(),
            )],
            "missing_payload",
        ),
        (
            // $2.5 billion: a typo'd amount far over the largest single disbursement accepted.
            entry(&format!(
                r#"{{"award_id":"EL-2026-09008","submission_timestamp":"{ts}","amount_cents":250000000000}}"#
            )),
            "amount_too_large",
        ),
        (
            // Which amount is meant depends on the parser: refused, never guessed.
            entry(&format!(
                r#"{{"award_id":"HR-2026-09009","submission_timestamp":"{ts}","amount_cents":1200,"amount_cents":1200000}}"#
            )),
            "duplicate_key",
        ),
    ]
}

/// `submissions` distinct valid submissions, with resends, one conflicting resubmission and
/// the malformed entries spread through the feed.
pub fn generate(submissions: usize, seed: u64) -> Feed {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut expected = Expected::default();
    let mut entries = Vec::with_capacity(submissions + submissions / 10);
    let mut resend_queue: Vec<String> = Vec::new();
    let mut bad = malformed().into_iter();
    let bad_every = (submissions / 8).max(1);
    let mut first = String::new();
    for i in 0..submissions {
        let (json, cents) = payload(&mut rng, i / DRAWDOWNS_PER_AWARD, i % DRAWDOWNS_PER_AWARD);
        if i == 0 {
            first.clone_from(&json);
        }
        expected.unique += 1;
        expected.cents_total += cents;
        entries.push(entry(&json));
        if rng.u32(0..RESEND_ONE_IN) == 0 {
            resend_queue.push(json);
        }
        // A producer retry lands a few entries after the original, as after a timeout.
        if resend_queue.len() > 3 || (i + 1 == submissions && !resend_queue.is_empty()) {
            for json in resend_queue.drain(..) {
                entries.push(entry(&json));
                expected.resends += 1;
            }
        }
        if (i + 1) % bad_every == 0 {
            if let Some((fields, code)) = bad.next() {
                entries.push(fields);
                expected.malformed_codes.push(code);
            }
        }
        if i == submissions / 2 {
            let (json, cents) = corrected(&first);
            expected.unique += 1;
            expected.cents_total += cents;
            expected.conflicting += 1;
            entries.push(entry(&json));
        }
    }
    for (fields, code) in bad {
        entries.push(fields);
        expected.malformed_codes.push(code);
    }
    expected.entries = entries.len() as u64;
    Feed { entries, expected }
}

/// A resubmission of `original` with the same award id and timestamp but the amount corrected:
/// a different payload, so a different key. It is paid (it is a distinct submission) and, where
/// conflict detection is on, flagged for review. Returns the payload and its amount.
fn corrected(original: &str) -> (String, i64) {
    let mut v: serde_json::Value =
        serde_json::from_str(original).expect("the demo writes valid JSON");
    let cents = v["amount_cents"]
        .as_i64()
        .expect("the demo writes integer amounts")
        + 100;
    v["amount_cents"] = cents.into();
    v["note"] = "amount corrected".into();
    (v.to_string(), cents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::submission::{parse_entry, Limits};
    use std::collections::HashSet;

    fn as_pairs(f: &Fields) -> Vec<(Vec<u8>, Vec<u8>)> {
        f.iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.clone()))
            .collect()
    }

    #[test]
    fn the_feed_adds_up_to_what_it_promises() {
        let feed = generate(600, 7);
        let e = &feed.expected;
        let (mut keys, mut cents, mut valid, mut codes) = (HashSet::new(), 0i64, 0u64, Vec::new());
        let limits = Limits {
            payload_bytes_max: crate::config::PAYLOAD_BYTES_MAX_DEFAULT,
            amount_cents_max: crate::config::AMOUNT_CENTS_MAX_DEFAULT,
        };
        for fields in &feed.entries {
            match parse_entry(&as_pairs(fields), &limits) {
                Ok(s) => {
                    valid += 1;
                    if keys.insert(s.key) {
                        cents += s.amount_cents;
                    }
                }
                Err(m) => codes.push(m.code()),
            }
        }
        assert_eq!(keys.len() as u64, e.unique);
        assert_eq!(cents, e.cents_total);
        assert_eq!(valid - e.unique, e.resends);
        assert!(e.resends > 0 && e.conflicting == 1);
        assert_eq!(codes, e.malformed_codes);
        assert_eq!(
            codes.iter().collect::<HashSet<_>>().len(),
            9,
            "every malformed class differs"
        );
        assert_eq!(feed.entries.len() as u64, e.entries);
    }
}
