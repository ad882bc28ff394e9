//! The events claimgate emits: what a committed disbursement announces on `grants:events`.

use super::submission::Submission;

/// The only event type the worker emits.
pub const DISBURSEMENT_RECORDED: &str = "disbursement.recorded";

/// How much of a foreign `event_id` a dead letter's reason repeats.
const EVENT_ID_SHOWN_MAX: usize = 40;

/// The `event_id` of a stream entry that is one of claimgate's own events: it carries an
/// `event_id` field and the `event_type` claimgate gives its events, both of which the relay
/// writes beside the payload (`src/relay.rs`). A producer's submission carries neither, so a
/// worker that finds one is reading an events stream (`Malformed::OwnEvent` says why that must
/// not be paid).
pub fn published_id(fields: &[(Vec<u8>, Vec<u8>)]) -> Option<String> {
    let field = |name: &[u8]| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    if field(b"event_type")? != DISBURSEMENT_RECORDED.as_bytes() {
        return None;
    }
    // Shown in the dead letter's reason; a producer could make the field any size.
    let id = field(b"event_id")?;
    Some(String::from_utf8_lossy(&id[..id.len().min(EVENT_ID_SHOWN_MAX)]).into_owned())
}

/// The `disbursement.recorded` event a new claim announces.
pub fn payload(s: &Submission, key_hex: &str) -> String {
    announcing(&Announced {
        amount_cents: s.amount_cents,
        award_id: &s.award_id,
        key_hex,
        submission_timestamp: &s.submission_timestamp,
    })
}

/// What a claim's event announces: the claim's own stored values. A ledger that derives an
/// outbox row's payload from its claim (SQLite, format 5: `schema.sql`) builds the event from
/// these when it publishes or exports it, with the same bytes [`payload`] wrote at the claim.
#[derive(Debug, Clone, Copy)]
pub struct Announced<'a> {
    pub amount_cents: i64,
    pub award_id: &'a str,
    /// The claim's key as 64 lowercase hex digits.
    pub key_hex: &'a str,
    pub submission_timestamp: &'a str,
}

/// The event body announcing `a`.
pub fn announcing(a: &Announced<'_>) -> String {
    /// The event body. Fields in alphabetical order, as the events stream has always carried
    /// them.
    #[derive(serde::Serialize)]
    struct Event<'e> {
        amount_cents: i64,
        award_id: &'e str,
        idempotency_key: &'e str,
        submission_timestamp: &'e str,
    }
    // Sized for the whole body up front (the fixed part is under 128 bytes, escapes aside):
    // serde_json's own 128-byte start grew, and so copied, nearly every payload.
    let fixed = 128 + a.award_id.len() + a.key_hex.len() + a.submission_timestamp.len();
    let mut out = Vec::with_capacity(fixed);
    serde_json::to_writer(
        &mut out,
        &Event {
            amount_cents: a.amount_cents,
            award_id: a.award_id,
            idempotency_key: a.key_hex,
            submission_timestamp: a.submission_timestamp,
        },
    )
    .expect("an event always serializes");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_payload_keeps_its_published_shape() {
        let s = crate::domain::submission::parse_payload(
            br#"{"award_id":"A-1","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":125}"#,
            &crate::domain::submission::Limits {
                payload_bytes_max: 1 << 20,
                amount_cents_max: i64::MAX,
            },
        )
        .unwrap();
        let hex = s.key.to_hex();
        let expected = serde_json::json!({
            "award_id": "A-1",
            "amount_cents": 125,
            "idempotency_key": hex,
            "submission_timestamp": "2026-07-01T09:00:00Z",
        })
        .to_string();
        assert_eq!(payload(&s, &hex), expected);
    }
}
