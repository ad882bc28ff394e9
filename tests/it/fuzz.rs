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
                instant_utc(&s.submission_timestamp).as_ref()
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
