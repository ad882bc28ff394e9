//! The events claimgate emits: what a committed disbursement announces on `grants:events`.

use super::submission::Submission;

/// The only event type the worker emits.
pub const DISBURSEMENT_RECORDED: &str = "disbursement.recorded";

/// The `disbursement.recorded` event a new claim announces.
pub fn payload(s: &Submission, key_hex: &str) -> String {
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
    let fixed = 128 + s.award_id.len() + key_hex.len() + s.submission_timestamp.len();
    let mut out = Vec::with_capacity(fixed);
    serde_json::to_writer(
        &mut out,
        &Event {
            amount_cents: s.amount_cents,
            award_id: &s.award_id,
            idempotency_key: key_hex,
            submission_timestamp: &s.submission_timestamp,
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
