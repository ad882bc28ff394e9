//! Property tests over entry parsing and key derivation: whatever bytes or field maps arrive,
//! the parser returns a submission or a named `Malformed`, never panics, and a submission's key
//! is always the one the contract's formula gives.
//!
//! Generated inputs come in three shapes so the cases reach past the first check: raw bytes,
//! arbitrary field maps, and JSON objects whose required fields hold arbitrary JSON values.
//! Two more properties aim at the newer classes: a key repeated at any depth of an otherwise
//! valid submission is `duplicate_key`, and an amount over the limit is `amount_too_large`.

use claimgate::domain::clock::instant_utc;
use claimgate::domain::key::{derive_idempotency_key, IdempotencyKey};
use claimgate::domain::submission::{
    award_id_hint, parse_entry, parse_payload, Limits, Malformed, Submission,
};
use proptest::prelude::*;
use serde_json::Value;

/// Cases per property: thousands, and still well under a second each in a release build.
const CASES: u32 = 4_000;

/// The payload limit used here: small, so oversize inputs are generated too.
const PAYLOAD_BYTES_MAX: usize = 512;

/// The amount limit used here: low enough that generated amounts land on both sides of it.
const AMOUNT_CENTS_MAX: i64 = 1 << 40;

/// The limits every property but the amount one parses under.
const LIMITS: &Limits = &Limits {
    payload_bytes_max: PAYLOAD_BYTES_MAX,
    amount_cents_max: AMOUNT_CENTS_MAX,
};

/// Every verdict must be a submission consistent with its payload, or an error with a name and
/// a message.
fn check_verdict(payload: &[u8], verdict: &Result<Submission, Malformed>) {
    match verdict {
        Ok(s) => {
            assert!(payload.len() <= PAYLOAD_BYTES_MAX);
            assert_eq!(s.payload, payload);
            assert!(!s.award_id.is_empty());
            assert!(s.amount_cents > 0 && s.amount_cents <= AMOUNT_CENTS_MAX);
            assert_eq!(
                Some(&s.submission_instant),
                instant_utc(&s.submission_timestamp).ok().as_ref()
            );
            let key =
                derive_idempotency_key(&s.award_id, &s.submission_timestamp, payload).unwrap();
            assert_eq!(s.key, key);
            assert_eq!(IdempotencyKey::from_hex(&key.to_hex()), Some(key));
        }
        Err(m) => {
            assert!(!m.code().is_empty());
            assert!(!m.to_string().is_empty());
            if payload.len() > PAYLOAD_BYTES_MAX {
                assert_eq!(
                    m,
                    &Malformed::PayloadTooLarge {
                        size: payload.len(),
                        max: PAYLOAD_BYTES_MAX
                    }
                );
            }
        }
    }
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Amounts on both sides of the limit.
        (AMOUNT_CENTS_MAX - 2..=AMOUNT_CENTS_MAX + 2).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        ".{0,12}".prop_map(Value::String),
        // Values near the validators' edges: timestamps, valid and not.
        prop_oneof![
            Just("2026-07-01T09:00:00Z"),
            Just("2026-07-01T09:00:00.123+02:00"),
            Just("2026-13-01T09:00:00Z"),
            Just("2026-07-01 09:00:00"),
            Just(""),
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A JSON object that has each required field with some probability, holding any value.
fn submission_like() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::option::of(json_value()),
        prop::option::of(json_value()),
        prop::option::of(prop_oneof![
            any::<i64>().prop_map(Value::from),
            json_value()
        ]),
        prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3),
    )
        .prop_map(|(award, ts, amount, extra)| {
            let mut object: serde_json::Map<String, Value> = extra.into_iter().collect();
            for (name, value) in [
                ("award_id", award),
                ("submission_timestamp", ts),
                ("amount_cents", amount),
            ] {
                if let Some(v) = value {
                    object.insert(name.into(), v);
                }
            }
            serde_json::to_vec(&Value::Object(object)).unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    /// Arbitrary bytes as a payload never panic the parser.
    #[test]
    fn arbitrary_payload_bytes_yield_a_submission_or_a_named_error(payload in prop::collection::vec(any::<u8>(), 0..700)) {
        let verdict = parse_payload(&payload, LIMITS);
        check_verdict(&payload, &verdict);
        let _ = award_id_hint(&payload, PAYLOAD_BYTES_MAX);
    }

    /// Arbitrary field maps (names and values of any bytes, `payload` repeated or absent) never
    /// panic, and the verdict follows the number of `payload` fields.
    #[test]
    fn arbitrary_field_maps_yield_a_submission_or_a_named_error(
        fields in prop::collection::vec(
            (prop_oneof![Just(b"payload".to_vec()), prop::collection::vec(any::<u8>(), 0..10)],
             prop_oneof![submission_like(), prop::collection::vec(any::<u8>(), 0..64)]),
            0..5,
        )
    ) {
        let verdict = parse_entry(&fields, LIMITS);
        let payloads: Vec<&Vec<u8>> = fields.iter().filter(|(k, _)| k == b"payload").map(|(_, v)| v).collect();
        match payloads.as_slice() {
            [] => prop_assert_eq!(verdict, Err(Malformed::MissingPayload)),
            [one] => check_verdict(one, &verdict),
            _ => prop_assert_eq!(verdict, Err(Malformed::AmbiguousPayload)),
        }
    }

    /// JSON objects with the required fields holding any JSON value: deep into the validators.
    #[test]
    fn submission_shaped_json_yields_a_submission_or_a_named_error(payload in submission_like()) {
        let verdict = parse_payload(&payload, LIMITS);
        check_verdict(&payload, &verdict);
    }

    /// Well-formed submissions with arbitrary award ids and amounts always parse, and their key
    /// is the contract's formula over the exact bytes.
    #[test]
    fn valid_submissions_always_parse_to_the_contract_key(award in "\\PC{1,24}", amount in 1..=i64::MAX, note in ".{0,20}") {
        let payload = serde_json::to_vec(&serde_json::json!({
            "award_id": award, "submission_timestamp": "2026-07-01T09:00:00Z", "amount_cents": amount, "note": note,
        })).unwrap();
        let limits = Limits { payload_bytes_max: usize::MAX, amount_cents_max: i64::MAX };
        let s = parse_payload(&payload, &limits).unwrap();
        prop_assert_eq!(&s.award_id, &award);
        prop_assert_eq!(s.amount_cents, amount);
        prop_assert_eq!(s.key, derive_idempotency_key(&award, "2026-07-01T09:00:00Z", &payload).unwrap());
    }

    /// Any amount against any limit: paid exactly when it is within the limit, otherwise
    /// `amount_too_large` naming both.
    #[test]
    fn amounts_over_the_limit_are_amount_too_large(amount in 1..=i64::MAX, max in 1..=i64::MAX) {
        let payload = serde_json::to_vec(&serde_json::json!({
            "award_id": "A-1", "submission_timestamp": "2026-07-01T09:00:00Z", "amount_cents": amount,
        })).unwrap();
        let limits = Limits { payload_bytes_max: PAYLOAD_BYTES_MAX, amount_cents_max: max };
        match parse_payload(&payload, &limits) {
            Ok(s) => prop_assert!(amount <= max && s.amount_cents == amount),
            Err(m) => prop_assert_eq!(m, Malformed::AmountTooLarge { amount, max }),
        }
    }

    /// A valid submission with one key repeated — a required field or any other, at the top
    /// level or inside a nested object or array — is `duplicate_key`, whatever the values, and
    /// never a submission (serde_json alone would keep the last value and pay it).
    #[test]
    fn a_repeated_key_at_any_depth_is_duplicate_key(
        name in prop_oneof![Just("amount_cents".to_owned()), Just("award_id".to_owned()), "[a-z_]{1,8}"],
        first in json_value(),
        second in json_value(),
        depth in 0..3usize,
        escape in any::<bool>(),
    ) {
        // The repeat may be spelled with a JSON escape: it is the same key once unescaped.
        let spelled = if escape {
            format!("\\u{:04x}{}", u32::from(name.as_bytes()[0]), &name[1..])
        } else {
            name.clone()
        };
        let mut inner = format!(
            "{{{}:{first},\"{spelled}\":{second}}}",
            serde_json::to_string(&name).unwrap()
        );
        for level in 0..depth {
            inner = if level % 2 == 0 { format!("[1,{inner}]") } else { format!("{{\"n\":{inner}}}") };
        }
        let payload = if depth == 0 {
            // The repeat is in the submission object itself.
            format!(
                r#"{{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":5,{}"#,
                &inner[1..]
            )
        } else {
            format!(
                r#"{{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":5,"meta":{inner}}}"#
            )
        };
        let limits = Limits { payload_bytes_max: usize::MAX, amount_cents_max: i64::MAX };
        let verdict = parse_payload(payload.as_bytes(), &limits);
        prop_assert_eq!(verdict, Err(Malformed::DuplicateKey(name)), "{}", payload);
    }

    /// Without repeated keys, the strict parser accepts exactly what serde_json accepts: a
    /// submission-shaped object is never refused as `duplicate_key` or `not_json` when it is
    /// serde_json's own output (which cannot repeat a key).
    #[test]
    fn json_without_repeats_is_never_duplicate_key(payload in submission_like()) {
        let limits = Limits { payload_bytes_max: usize::MAX, amount_cents_max: i64::MAX };
        let verdict = parse_payload(&payload, &limits);
        prop_assert!(!matches!(verdict, Err(Malformed::DuplicateKey(_)) | Err(Malformed::NotJson(_))), "{:?}", verdict);
    }

    /// Key derivation over arbitrary strings and bytes never panics and is 64 lowercase hex.
    #[test]
    fn key_derivation_never_panics(award in ".{0,40}", ts in ".{0,40}", payload in prop::collection::vec(any::<u8>(), 0..256)) {
        match derive_idempotency_key(&award, &ts, &payload) {
            Ok(key) => {
                let hex = key.to_hex();
                prop_assert_eq!(hex.len(), 64);
                prop_assert!(hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            }
            Err(_) => prop_assert!(award.is_empty() || ts.is_empty()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One field varied at a time. Every case starts from a valid submission and, most of the time,
// changes exactly one required field to a value whose class is known in advance, so the deep
// validators (`bad_timestamp`, `amount_not_positive`, `amount_not_integer`,
// `amount_out_of_range`, `amount_too_large`, `empty_award_id`) are each reached hundreds of
// times, and each case asserts the exact class. The valid branch checks every field's meaning,
// the timestamp's instant against an oracle written here, not the `time` crate's arithmetic.
// ---------------------------------------------------------------------------------------------

/// A timestamp built from parts, some possibly out of range.
#[derive(Debug, Clone)]
struct Stamp {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    /// Fractional digits, 1 to 9 of them, or none.
    fraction: Option<String>,
    /// `T` or `t`.
    separator: char,
    /// `None` for `Z`/`z` (which one: `lower_z`), else (sign, hours, minutes).
    offset: Option<(i64, i64, i64)>,
    lower_z: bool,
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count (the inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

impl Stamp {
    fn text(&self) -> String {
        let mut s = format!(
            "{:04}-{:02}-{:02}{}{:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.separator, self.hour, self.minute, self.second
        );
        if let Some(f) = &self.fraction {
            s.push('.');
            s.push_str(f);
        }
        match self.offset {
            None => s.push(if self.lower_z { 'z' } else { 'Z' }),
            Some((sign, h, m)) => s.push_str(&format!(
                "{}{h:02}:{m:02}",
                if sign < 0 { '-' } else { '+' }
            )),
        }
        s
    }

    /// Whether every part is in range (RFC 3339 §5.6; no leap seconds are generated).
    fn in_range(&self) -> bool {
        (1..=12).contains(&self.month)
            && (1..=days_in_month(self.year, self.month)).contains(&self.day)
            && (0..=23).contains(&self.hour)
            && (0..=59).contains(&self.minute)
            && (0..=59).contains(&self.second)
    }

    /// The UTC instant, spelled as `clock::instant_utc` promises: nine fractional digits, `Z`.
    fn expected_instant(&self) -> String {
        let (sign, oh, om) = self.offset.unwrap_or((1, 0, 0));
        let local = days_from_civil(self.year, self.month, self.day) * 86_400
            + self.hour * 3_600
            + self.minute * 60
            + self.second;
        let utc = local - sign * (oh * 3_600 + om * 60);
        let (days, secs) = (utc.div_euclid(86_400), utc.rem_euclid(86_400));
        let (y, m, d) = civil_from_days(days);
        let nanos = format!("{:0<9}", self.fraction.as_deref().unwrap_or(""));
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos}Z",
            secs / 3_600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

/// Timestamps in range most of the time, with one part pushed out of range otherwise. Both
/// sides lean on the edges — the last day of each month, February 29th in years that are and
/// are not leap years (1900, 2000, 2100), month 13, hour 24, minute and second 60 — where a
/// validator is most likely wrong.
fn stamp() -> impl Strategy<Value = Stamp> {
    (
        (
            prop_oneof![3 => 1000i64..=9998, 1 => prop_oneof![Just(1900i64), Just(2000), Just(2024), Just(2100), Just(2023)]],
            prop_oneof![3 => 1i64..=12, 1 => Just(2i64)],
            prop_oneof![2 => 1i64..=28, 1 => Just(i64::MAX)],
            0i64..=23,
            0i64..=59,
            0i64..=59,
        ),
        prop::option::of("[0-9]{1,9}"),
        prop_oneof![Just('T'), Just('t')],
        prop::option::of((prop_oneof![Just(-1i64), Just(1)], 0i64..=23, 0i64..=59)),
        any::<bool>(),
        // Which part (if any) to push out of range, and to what.
        prop_oneof![
            6 => Just((0usize, 0i64)),
            1 => prop_oneof![Just(0i64), Just(13), 14i64..=99].prop_map(|v| (1usize, v)),
            1 => prop_oneof![Just(0i64), Just(1), Just(2), 3i64..=70].prop_map(|v| (2usize, v)),
            1 => prop_oneof![Just(24i64), 25i64..=99].prop_map(|v| (3usize, v)),
            1 => prop_oneof![Just(60i64), 61i64..=99].prop_map(|v| (4usize, v)),
            1 => prop_oneof![Just(61i64), 62i64..=99].prop_map(|v| (5usize, v)),
        ],
    )
        .prop_map(|((year, month, day, hour, minute, second), fraction, separator, offset, lower_z, (part, v))| {
            // `i64::MAX` stands for "the last day of the month".
            let last = days_in_month(year, month);
            let mut s = Stamp { year, month, day: day.min(last), hour, minute, second, fraction, separator, offset, lower_z };
            match part {
                1 => s.month = v,
                // Days are pushed past the month's last day by 0 (none), 1 or 2, or set to
                // 0 or anything up to 70.
                2 => s.day = if v <= 2 && v > 0 { last + v } else { v },
                3 => s.hour = v,
                4 => s.minute = v,
                5 => s.second = v,
                _ => {}
            }
            s
        })
}

/// What one case changes, and the class it must get (`None`: still valid).
#[derive(Debug, Clone)]
enum Change {
    Nothing,
    AwardId(String, Option<&'static str>),
    /// The new text, its class, and the parts it was built from (when it was built from parts).
    Timestamp(String, Option<&'static str>, Option<Stamp>),
    Amount(String, Option<&'static str>),
    Missing(&'static str),
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A valid submission's parts, then one change.
fn one_change() -> impl Strategy<Value = (String, Stamp, i64, Change)> {
    let not_a_string = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        any::<i32>().prop_map(|n| n.to_string()),
        Just("[\"A-1\"]".to_owned()),
        Just("{\"id\":\"A-1\"}".to_owned()),
    ];
    let change = prop_oneof![
        4 => Just(Change::Nothing),
        1 => Just(Change::AwardId("\"\"".into(), Some("empty_award_id"))),
        1 => not_a_string.clone().prop_map(|v| Change::AwardId(v, Some("wrong_type"))),
        3 => stamp().prop_map(|s| {
            let class = (!s.in_range()).then_some("bad_timestamp");
            Change::Timestamp(json_str(&s.text()), class, Some(s))
        }),
        1 => prop_oneof![
            Just("\"\"".to_owned()),
            Just("\"2026-07-01\"".to_owned()),
            Just("\"2026-07-01T09:00:00\"".to_owned()),
            Just("\"2026-07-01T09:00Z\"".to_owned()),
            "[a-z ]{1,12}".prop_map(|s| json_str(&s)),
        ].prop_map(|v| Change::Timestamp(v, Some("bad_timestamp"), None)),
        1 => not_a_string.prop_map(|v| Change::Timestamp(v, Some("wrong_type"), None)),
        1 => (i64::MIN..=0).prop_map(|n| Change::Amount(n.to_string(), Some("amount_not_positive"))),
        1 => (1i64..1_000_000, 1u32..100).prop_map(|(n, f)| Change::Amount(format!("{n}.{f:02}"), Some("amount_not_integer"))),
        1 => (1i64..1_000_000).prop_map(|n| Change::Amount(format!("{n}.0"), Some("amount_not_integer"))),
        1 => (i64::MAX as u64 + 1..=u64::MAX).prop_map(|n| Change::Amount(n.to_string(), Some("amount_out_of_range"))),
        1 => "[1-9][0-9]{20,30}".prop_map(|n| Change::Amount(n, Some("amount_out_of_range"))),
        1 => (AMOUNT_CENTS_MAX + 1..=i64::MAX).prop_map(|n| Change::Amount(n.to_string(), Some("amount_too_large"))),
        1 => prop_oneof![Just("\"100\"".to_owned()), Just("null".to_owned()), Just("[100]".to_owned())]
            .prop_map(|v| Change::Amount(v, Some("wrong_type"))),
        1 => prop_oneof![Just("award_id"), Just("submission_timestamp"), Just("amount_cents")].prop_map(Change::Missing),
    ];
    (
        "[A-Za-z0-9\\-]{1,16}",
        stamp().prop_filter("in range", Stamp::in_range),
        1..=AMOUNT_CENTS_MAX,
        change,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    /// A valid submission with at most one field changed gets exactly the class that change
    /// calls for, and when it stays valid every field means what it says: the award and amount
    /// as written, the timestamp kept byte for byte, its instant equal to the oracle's, and the
    /// key the contract's formula over the exact bytes.
    #[test]
    fn one_field_changed_at_a_time_gets_exactly_its_class((award, stamp, amount, change) in one_change()) {
        let mut fields: Vec<(&str, String)> = vec![
            ("award_id", json_str(&award)),
            ("submission_timestamp", json_str(&stamp.text())),
            ("amount_cents", amount.to_string()),
        ];
        let expected = match &change {
            Change::Nothing => None,
            Change::AwardId(v, c) => { fields[0].1 = v.clone(); *c }
            Change::Timestamp(v, c, _) => { fields[1].1 = v.clone(); *c }
            Change::Amount(v, c) => { fields[2].1 = v.clone(); *c }
            Change::Missing(name) => { fields.retain(|(n, _)| n != name); Some("missing_field") }
        };
        let payload = format!(
            "{{{},\"note\":\"kept\"}}",
            fields.iter().map(|(n, v)| format!("\"{n}\":{v}")).collect::<Vec<_>>().join(",")
        );
        let verdict = parse_payload(payload.as_bytes(), &Limits { payload_bytes_max: usize::MAX, amount_cents_max: AMOUNT_CENTS_MAX });
        match (expected, verdict) {
            (Some(class), Err(m)) => prop_assert_eq!(m.code(), class, "{} gave {}", payload, m),
            (Some(class), Ok(_)) => prop_assert!(false, "{} was accepted; expected {}", payload, class),
            (None, Err(m)) => prop_assert!(false, "{} was refused: {}", payload, m),
            (None, Ok(s)) => {
                let ts: String = serde_json::from_str(&fields[1].1).unwrap();
                let stamp_now = match &change { Change::Timestamp(_, _, built) => built.as_ref(), _ => Some(&stamp) };
                prop_assert_eq!(&s.award_id, &serde_json::from_str::<String>(&fields[0].1).unwrap());
                prop_assert_eq!(s.amount_cents, fields[2].1.parse::<i64>().unwrap());
                prop_assert_eq!(&s.submission_timestamp, &ts);
                let st = stamp_now.expect("a valid timestamp is always built from parts");
                prop_assert_eq!(&s.submission_instant, &st.expected_instant());
                prop_assert_eq!(&s.payload, &payload.as_bytes().to_vec());
                prop_assert_eq!(s.key, derive_idempotency_key(&s.award_id, &ts, payload.as_bytes()).unwrap());
            }
        }
    }
}

/// The oracle itself, against dates worked out by hand, so a shared mistake between it and the
/// parser cannot hide.
#[test]
fn the_timestamp_oracle_agrees_with_hand_worked_instants() {
    let st = |text_parts: (i64, i64, i64, i64, i64, i64), fraction: Option<&str>, offset| Stamp {
        year: text_parts.0,
        month: text_parts.1,
        day: text_parts.2,
        hour: text_parts.3,
        minute: text_parts.4,
        second: text_parts.5,
        fraction: fraction.map(str::to_owned),
        separator: 'T',
        offset,
        lower_z: false,
    };
    for (s, text, instant) in [
        (
            st((2026, 7, 1, 11, 0, 0), None, Some((1, 2, 0))),
            "2026-07-01T11:00:00+02:00",
            "2026-07-01T09:00:00.000000000Z",
        ),
        (
            st((2024, 3, 1, 0, 30, 0), Some("5"), Some((1, 1, 0))),
            "2024-03-01T00:30:00.5+01:00",
            "2024-02-29T23:30:00.500000000Z",
        ),
        (
            st(
                (1999, 12, 31, 23, 59, 59),
                Some("123456789"),
                Some((-1, 0, 1)),
            ),
            "1999-12-31T23:59:59.123456789-00:01",
            "2000-01-01T00:00:59.123456789Z",
        ),
        (
            st((2100, 2, 28, 12, 0, 0), None, None),
            "2100-02-28T12:00:00Z",
            "2100-02-28T12:00:00.000000000Z",
        ),
    ] {
        assert_eq!(s.text(), text);
        assert!(s.in_range());
        assert_eq!(s.expected_instant(), instant);
        assert_eq!(instant_utc(text).as_deref(), Ok(instant));
    }
    assert!(
        !st((2100, 2, 29, 0, 0, 0), None, None).in_range(),
        "2100 is not a leap year"
    );
    assert!(st((2000, 2, 29, 0, 0, 0), None, None).in_range(), "2000 is");
}
