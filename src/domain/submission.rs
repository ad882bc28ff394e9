//! Turning the fields of one stream entry into a validated [`Submission`], or a named reason why not.
//!
//! Everything here is pure: no Redis, no SQLite, no clock. The size limit is checked before the
//! payload is handed to a JSON parser, so an oversize entry costs nothing but its length.

use crate::domain::clock::instant_utc;
use crate::domain::key::{derive_idempotency_key, IdempotencyKey, KeyError};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::RefCell;

/// The one stream field a submission entry must carry.
pub const PAYLOAD_FIELD: &[u8] = b"payload";

/// The longest `award_id` accepted, in bytes of UTF-8. Both ledgers index the award with each
/// claim; PostgreSQL cannot index a value much over 2,000 bytes (a btree entry holds at most
/// 2,704), so a longer one would be paid on SQLite and refused on PostgreSQL. One input domain
/// for both: anything over this is malformed before any ledger sees it. Far above any real
/// award identifier (a FAIN is under 30 characters).
pub const AWARD_ID_BYTES_MAX: usize = 1024;

/// The limits a payload is validated against (`--payload-bytes-max`, `--amount-cents-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload accepted, in bytes; checked before any parsing.
    pub payload_bytes_max: usize,
    /// Largest `amount_cents` one submission may carry.
    pub amount_cents_max: i64,
}

/// A submission that passed validation, with its idempotency key already derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The award this disbursement belongs to, exactly as it appears in the payload.
    pub award_id: String,
    /// When the submission was made, exactly as it appears in the payload (valid RFC 3339).
    pub submission_timestamp: String,
    /// The instant `submission_timestamp` names, as [`crate::domain::clock::instant_utc`]
    /// spells it: what conflict detection compares, so `…09:00:00Z` and `…11:00:00+02:00` are
    /// one time. The key still covers the submitted spelling.
    pub submission_instant: String,
    /// The amount to disburse, in cents; always positive.
    pub amount_cents: i64,
    /// The raw payload bytes, kept whole: extra fields are never dropped.
    pub payload: Vec<u8>,
    /// The idempotency key derived from the three above.
    pub key: IdempotencyKey,
}

/// Every way an entry can be malformed. Each is permanent: the entry is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// The entry has no `payload` field.
    #[error("no payload field")]
    MissingPayload,
    /// The entry has more than one `payload` field, so which one to pay is ambiguous.
    #[error("more than one payload field")]
    AmbiguousPayload,
    /// The entry is an event a claimgate relay published (its `event_id` and `event_type`
    /// fields), not a submission. Its payload would parse: it names the award, the time and the
    /// amount. But its bytes are not the submission's, so its key is new, and under
    /// `--on-conflict record` it would be paid again, published again, read again: a loop that
    /// pays one award without end. A worker sees one only when `--stream` names an events stream.
    #[error(
        "entry is claimgate's own event {event_id}, published by a relay, not a submission; \
         this worker's --stream is an events stream"
    )]
    OwnEvent {
        /// The event's `event_id` field, as the relay wrote it.
        event_id: String,
    },
    /// The payload is larger than `--payload-bytes-max`; it was not parsed.
    #[error("payload is {size} bytes, over the limit of {max} bytes")]
    PayloadTooLarge {
        /// The payload's size in bytes.
        size: usize,
        /// The configured limit in bytes.
        max: usize,
    },
    /// The payload is not valid UTF-8 JSON.
    #[error("payload is not JSON: {0}")]
    NotJson(String),
    /// The payload is JSON but not an object.
    #[error("payload is not a JSON object")]
    NotAnObject,
    /// A required field is absent.
    #[error("required field {0} is missing")]
    MissingField(&'static str),
    /// A required field has the wrong JSON type.
    #[error("field {field} must be {expected}")]
    WrongType {
        /// The field's name.
        field: &'static str,
        /// What it must be, in words.
        expected: &'static str,
    },
    /// `award_id` is the empty string.
    #[error("award_id is empty")]
    EmptyAwardId,
    /// `award_id` is longer than [`AWARD_ID_BYTES_MAX`].
    #[error("award_id is {size} bytes, over the limit of {max} bytes")]
    AwardIdTooLong {
        /// Its size in bytes.
        size: usize,
        /// [`AWARD_ID_BYTES_MAX`].
        max: usize,
    },
    /// A text field the ledger stores holds a NUL character (`\u0000`), which PostgreSQL's
    /// text type cannot hold and no award id or timestamp has a use for.
    #[error("{0} holds a NUL character (\\u0000)")]
    NulInText(&'static str),
    /// `submission_timestamp` is not an RFC 3339 date-time.
    #[error("submission_timestamp {value:?} is not an RFC 3339 date-time")]
    BadTimestamp {
        /// The offending value, for the operator.
        value: String,
    },
    /// `submission_timestamp` is RFC 3339 but names no instant a ledger stores: a leap second,
    /// or a UTC instant outside the years 0000–9999 ([`crate::domain::clock::Unstorable`]).
    #[error("submission_timestamp {value:?} {why}")]
    UnstorableTimestamp {
        /// The offending value, for the operator.
        value: String,
        /// Which of the two it is.
        why: crate::domain::clock::Unstorable,
    },
    /// `amount_cents` is zero or negative.
    #[error("amount_cents must be positive, got {0}")]
    AmountNotPositive(i64),
    /// `amount_cents` is a number but not an integer.
    #[error("amount_cents must be an integer, got {0}")]
    AmountNotInteger(String),
    /// `amount_cents` is an integer too large for i64.
    #[error("amount_cents {0} does not fit in a 64-bit signed integer")]
    AmountOutOfRange(String),
    /// `amount_cents` fits in i64 but is over `--amount-cents-max`: no single grant
    /// disbursement is that large, so it is a producer's error, not a payment.
    #[error("amount_cents {amount} is over the limit of {max} cents")]
    AmountTooLarge {
        /// The amount asked for, in cents.
        amount: i64,
        /// The configured limit, in cents.
        max: i64,
    },
    /// A JSON object in the payload names one key twice. Parsers disagree on which value wins
    /// (serde_json keeps the last, others the first), so what would be paid is ambiguous.
    #[error("payload repeats the JSON object key {0:?}")]
    DuplicateKey(String),
}

impl Malformed {
    /// A short, stable name for the class of problem, for metrics and machine-read dead letters.
    pub fn code(&self) -> &'static str {
        match self {
            Malformed::MissingPayload => "missing_payload",
            Malformed::AmbiguousPayload => "ambiguous_payload",
            Malformed::OwnEvent { .. } => "claimgate_event",
            Malformed::PayloadTooLarge { .. } => "payload_too_large",
            Malformed::NotJson(_) => "not_json",
            Malformed::NotAnObject => "not_an_object",
            Malformed::MissingField(_) => "missing_field",
            Malformed::WrongType { .. } => "wrong_type",
            Malformed::EmptyAwardId => "empty_award_id",
            Malformed::AwardIdTooLong { .. } => "award_id_too_long",
            Malformed::NulInText(_) => "nul_in_text",
            Malformed::BadTimestamp { .. } => "bad_timestamp",
            Malformed::UnstorableTimestamp { why, .. } => match why {
                crate::domain::clock::Unstorable::LeapSecond => "leap_second",
                _ => "timestamp_out_of_range",
            },
            Malformed::AmountNotPositive(_) => "amount_not_positive",
            Malformed::AmountNotInteger(_) => "amount_not_integer",
            Malformed::AmountOutOfRange(_) => "amount_out_of_range",
            Malformed::AmountTooLarge { .. } => "amount_too_large",
            Malformed::DuplicateKey(_) => "duplicate_key",
        }
    }
}

/// Finds the single `payload` field among an entry's fields.
pub fn payload_of(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<&[u8], Malformed> {
    let mut found = fields.iter().filter(|(name, _)| name == PAYLOAD_FIELD);
    let first = found.next().ok_or(Malformed::MissingPayload)?;
    if found.next().is_some() {
        return Err(Malformed::AmbiguousPayload);
    }
    Ok(&first.1)
}

/// Validates an entry's fields into a submission. The size check comes before any parsing.
pub fn parse_entry(
    fields: &[(Vec<u8>, Vec<u8>)],
    limits: &Limits,
) -> Result<Submission, Malformed> {
    parse_payload(payload_of(fields)?, limits)
}

/// Validates raw payload bytes into a submission.
pub fn parse_payload(payload: &[u8], limits: &Limits) -> Result<Submission, Malformed> {
    if payload.len() > limits.payload_bytes_max {
        return Err(Malformed::PayloadTooLarge {
            size: payload.len(),
            max: limits.payload_bytes_max,
        });
    }
    let value = parse_json_strict(payload)?;
    let object = value.as_object().ok_or(Malformed::NotAnObject)?;

    let award_id = required_str(object, "award_id")?;
    check_award_id(award_id)?;
    let submission_timestamp = required_str(object, "submission_timestamp")?;
    if submission_timestamp.contains('\0') {
        return Err(Malformed::NulInText("submission_timestamp"));
    }
    let submission_instant = instant_utc(submission_timestamp).map_err(|why| {
        let value = submission_timestamp.to_owned();
        match why {
            crate::domain::clock::Unstorable::NotRfc3339 => Malformed::BadTimestamp { value },
            why => Malformed::UnstorableTimestamp { value, why },
        }
    })?;
    let amount_cents = amount(object)?;
    if amount_cents > limits.amount_cents_max {
        return Err(Malformed::AmountTooLarge {
            amount: amount_cents,
            max: limits.amount_cents_max,
        });
    }

    let key =
        derive_idempotency_key(award_id, submission_timestamp, payload).map_err(|e| match e {
            KeyError::EmptyAwardId => Malformed::EmptyAwardId,
            KeyError::EmptyTimestamp => Malformed::BadTimestamp {
                value: submission_timestamp.to_owned(),
            },
        })?;
    Ok(Submission {
        award_id: award_id.to_owned(),
        submission_timestamp: submission_timestamp.to_owned(),
        submission_instant,
        amount_cents,
        payload: payload.to_vec(),
        key,
    })
}

/// Whether `award_id` is one both ledgers store alike: not empty, at most
/// [`AWARD_ID_BYTES_MAX`] bytes, no NUL. Also `hold add`'s check, so no hold names an award no
/// submission can carry.
pub fn check_award_id(award_id: &str) -> Result<(), Malformed> {
    if award_id.is_empty() {
        return Err(Malformed::EmptyAwardId);
    }
    if award_id.len() > AWARD_ID_BYTES_MAX {
        return Err(Malformed::AwardIdTooLong {
            size: award_id.len(),
            max: AWARD_ID_BYTES_MAX,
        });
    }
    if award_id.contains('\0') {
        return Err(Malformed::NulInText("award_id"));
    }
    Ok(())
}

/// Best-effort award id of a payload that failed validation, so a dead letter can name it,
/// spelled so that any ledger can store it ([`storable`]).
pub fn award_id_hint(payload: &[u8], payload_bytes_max: usize) -> Option<String> {
    if payload.len() > payload_bytes_max {
        return None;
    }
    let value: Value = serde_json::from_slice(payload).ok()?;
    let id = value.get("award_id")?.as_str()?;
    (!id.is_empty()).then(|| storable(id).into_owned())
}

/// Text from outside (a malformed entry's award id, a reason quoting it) spelled so that every
/// ledger stores it alike: a NUL, which PostgreSQL's text type refuses, becomes the six
/// characters `\u0000`; everything else is kept as it arrived. The dead-letter stream keeps
/// the original bytes whole.
pub fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\\u0000"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Parses JSON like `serde_json::from_slice`, except that an object naming one key twice, at
/// any depth, is [`Malformed::DuplicateKey`] instead of silently keeping the last value. Keys
/// are compared after unescaping, so `"a"` and `"\u0061"` are the same key.
fn parse_json_strict(payload: &[u8]) -> Result<Value, Malformed> {
    let repeated = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(payload);
    let parsed = Strict {
        repeated: &repeated,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    match (parsed, repeated.into_inner()) {
        (_, Some(key)) => Err(Malformed::DuplicateKey(key)),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(Malformed::NotJson(e.to_string())),
    }
}

/// A JSON value that refuses repeated object keys, noting the first one in `repeated` (a
/// serde error carries only text, and the repeat is a class of its own, not "not JSON").
#[derive(Clone, Copy)]
struct Strict<'r> {
    /// Set to the repeated key when one is found.
    repeated: &'r RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, and serde_json rounds huge literals to finite floats.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let message = format!("repeated key {key:?}");
                *self.repeated.borrow_mut() = Some(key);
                return Err(serde::de::Error::custom(message));
            }
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

fn required_str<'a>(
    object: &'a serde_json::Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, Malformed> {
    match object.get(field) {
        None => Err(Malformed::MissingField(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(Malformed::WrongType {
            field,
            expected: "a string",
        }),
    }
}

fn amount(object: &serde_json::Map<String, Value>) -> Result<i64, Malformed> {
    let field = "amount_cents";
    let number = match object.get(field) {
        None => return Err(Malformed::MissingField(field)),
        Some(Value::Number(n)) => n,
        Some(_) => {
            return Err(Malformed::WrongType {
                field,
                expected: "an integer",
            })
        }
    };
    match number.as_i64() {
        Some(n) if n > 0 => Ok(n),
        Some(n) => Err(Malformed::AmountNotPositive(n)),
        None if number.is_u64() => Err(Malformed::AmountOutOfRange(number.to_string())),
        // Integers beyond u64 reach us as floats; a whole float too large for i64 was an
        // integer literal out of range, anything else was never an integer.
        None => match number.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() >= 9.223_372_036_854_776e18 => {
                Err(Malformed::AmountOutOfRange(number.to_string()))
            }
            _ => Err(Malformed::AmountNotInteger(number.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Limits = Limits {
        payload_bytes_max: 1 << 20,
        amount_cents_max: 100_000_000_000,
    };

    fn entry(payload: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![(b"payload".to_vec(), payload.as_bytes().to_vec())]
    }

    #[test]
    fn a_valid_payload_keeps_its_bytes_and_extra_fields() {
        let raw = r#"{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1250,"note":"x"}"#;
        let s = parse_entry(&entry(raw), &MAX).unwrap();
        assert_eq!(s.award_id, "A-1");
        assert_eq!(s.amount_cents, 1250);
        assert_eq!(s.payload, raw.as_bytes());
        assert_eq!(
            s.key,
            derive_idempotency_key("A-1", "2026-07-01T09:00:00Z", raw.as_bytes()).unwrap()
        );
    }

    #[test]
    fn every_malformed_class_is_named() {
        let ok_ts = "2026-07-01T09:00:00Z";
        type Fields = Vec<(Vec<u8>, Vec<u8>)>;
        let cases: Vec<(Fields, &str)> = vec![
            (vec![(b"other".to_vec(), b"{}".to_vec())], "missing_payload"),
            ([entry("{}"), entry("{}")].concat(), "ambiguous_payload"),
            (entry("{not json"), "not_json"),
            (vec![(b"payload".to_vec(), vec![0xff, 0xfe])], "not_json"),
            (entry("[1,2]"), "not_an_object"),
            (
                entry(&format!(
                    r#"{{"submission_timestamp":"{ok_ts}","amount_cents":1}}"#
                )),
                "missing_field",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":7,"submission_timestamp":"{ok_ts}","amount_cents":1}}"#
                )),
                "wrong_type",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"","submission_timestamp":"{ok_ts}","amount_cents":1}}"#
                )),
                "empty_award_id",
            ),
            (
                entry(r#"{"award_id":"A","submission_timestamp":"yesterday","amount_cents":1}"#),
                "bad_timestamp",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":0}}"#
                )),
                "amount_not_positive",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":-5}}"#
                )),
                "amount_not_positive",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":1.5}}"#
                )),
                "amount_not_integer",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":9223372036854775808}}"#
                )),
                "amount_out_of_range",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":100000000001}}"#
                )),
                "amount_too_large",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":1,"amount_cents":200000}}"#
                )),
                "duplicate_key",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":1,"meta":{{"a":[{{"b":1,"\u0062":2}}]}}}}"#
                )),
                "duplicate_key",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A","submission_timestamp":"{ok_ts}","amount_cents":"12"}}"#
                )),
                "wrong_type",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"A\u0000B","submission_timestamp":"{ok_ts}","amount_cents":1}}"#
                )),
                "nul_in_text",
            ),
            (
                entry(&format!(
                    r#"{{"award_id":"{}","submission_timestamp":"{ok_ts}","amount_cents":1}}"#,
                    "é".repeat(AWARD_ID_BYTES_MAX / 2 + 1)
                )),
                "award_id_too_long",
            ),
        ];
        for (fields, code) in cases {
            let err = parse_entry(&fields, &MAX).unwrap_err();
            assert_eq!(err.code(), code, "{err}");
        }
    }

    #[test]
    fn a_payload_and_an_amount_exactly_at_their_limits_are_accepted() {
        let payload =
            br#"{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":500}"#;
        let limits = Limits {
            payload_bytes_max: payload.len(),
            amount_cents_max: 500,
        };
        let s = parse_payload(payload, &limits).expect("at both limits");
        assert_eq!(s.amount_cents, 500);
    }

    #[test]
    fn an_award_id_at_its_limit_is_paid_and_a_nul_is_stored_as_text_in_a_dead_letter() {
        let at_limit = "A".repeat(AWARD_ID_BYTES_MAX);
        let raw = format!(
            r#"{{"award_id":"{at_limit}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1}}"#
        );
        assert_eq!(parse_entry(&entry(&raw), &MAX).unwrap().award_id, at_limit);
        let nul = br#"{"award_id":"A\u0000B","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":1}"#;
        let err = parse_entry(&entry(std::str::from_utf8(nul).unwrap()), &MAX).unwrap_err();
        assert_eq!(err.to_string(), "award_id holds a NUL character (\\u0000)");
        let hint = award_id_hint(nul, 1 << 20).unwrap();
        assert_eq!(hint, "A\\u0000B", "no NUL reaches a ledger");
        assert!(!hint.contains('\0'));
        assert_eq!(storable("plain"), "plain");
        assert!(check_award_id(&"x".repeat(AWARD_ID_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn oversize_payload_is_refused_before_parsing() {
        let limits = Limits {
            payload_bytes_max: 4,
            ..MAX
        };
        let err = parse_entry(&entry("{not even json"), &limits).unwrap_err();
        assert_eq!(err, Malformed::PayloadTooLarge { size: 14, max: 4 });
    }

    #[test]
    fn award_id_hint_names_the_award_of_a_bad_entry() {
        assert_eq!(
            award_id_hint(
                br#"{"award_id":"A-9","amount_cents":0}"#,
                MAX.payload_bytes_max
            )
            .as_deref(),
            Some("A-9")
        );
        assert_eq!(award_id_hint(b"nope", MAX.payload_bytes_max), None);
    }

    #[test]
    fn an_amount_too_big_for_i64_is_out_of_range_and_a_fraction_or_exponent_is_not_an_integer() {
        // serde_json hands integers past u64 over as floats: whole and past i64 means an
        // integer literal out of range; anything else a float is was never an integer.
        for (amount, code) in [
            ("9223372036854775808", "amount_out_of_range"),
            ("18446744073709551616", "amount_out_of_range"),
            ("100000000000000000000", "amount_out_of_range"),
            ("-100000000000000000000", "amount_out_of_range"),
            ("1.5", "amount_not_integer"),
            ("1e3", "amount_not_integer"),
            ("1000.0", "amount_not_integer"),
        ] {
            let payload = format!(
                r#"{{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{amount}}}"#
            );
            let err = parse_payload(payload.as_bytes(), &MAX).unwrap_err();
            assert_eq!(err.code(), code, "{amount}: {err}");
        }
    }

    #[test]
    fn the_award_hint_reads_a_payload_at_the_size_limit_and_not_one_past_it() {
        let payload = br#"{"award_id":"A-9","amount_cents":0}"#;
        let named = award_id_hint(payload, payload.len());
        assert_eq!(named.as_deref(), Some("A-9"));
        assert_eq!(award_id_hint(payload, payload.len() - 1), None);
    }
}
