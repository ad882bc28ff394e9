//! The idempotency key: a pure function of the submission, never of its delivery.
//!
//! `hex(sha256(award_id + "|" + submission_timestamp + "|" + hex(sha256(payload_bytes))))`
//!
//! Two deliveries of one submission carry byte-identical payloads, so they get one key on any
//! worker, in any process, on any day. A genuine resubmission that changes even one byte of the
//! payload gets a different key and is not suppressed.

use sha2::{Digest, Sha256};
use std::fmt;

/// Why a key could not be derived. An empty identity would make unrelated submissions collide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `award_id` was the empty string.
    #[error("award_id is empty")]
    EmptyAwardId,
    /// `submission_timestamp` was the empty string.
    #[error("submission_timestamp is empty")]
    EmptyTimestamp,
}

/// A 32-byte idempotency key. Stored as 32 bytes in the ledger; shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey([u8; 32]);

impl IdempotencyKey {
    /// The raw digest, as the ledger stores it.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Rebuilds a key from the 32 bytes the ledger stored; `None` for any other length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        Some(IdempotencyKey(bytes.try_into().ok()?))
    }

    /// Parses 64 hex digits (either case), as printed by `claimgate key`.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(IdempotencyKey(out))
    }

    /// The 64-character lowercase hex form used everywhere a person or another program sees it.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// The first 12 hex characters, as audit log lines show it.
    pub fn short(&self) -> String {
        to_hex(&self.0[..6])
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.short())
    }
}

/// Derives the idempotency key of one submission, exactly as the formula at the top of this file
/// (and docs/guide.md, "The commands") defines it.
pub fn derive_idempotency_key(
    award_id: &str,
    submission_timestamp: &str,
    payload: &[u8],
) -> Result<IdempotencyKey, KeyError> {
    if award_id.is_empty() {
        return Err(KeyError::EmptyAwardId);
    }
    if submission_timestamp.is_empty() {
        return Err(KeyError::EmptyTimestamp);
    }
    let payload_digest = to_hex(&Sha256::digest(payload));
    let mut material = Sha256::new();
    material.update(award_id.as_bytes());
    material.update(b"|");
    material.update(submission_timestamp.as_bytes());
    material.update(b"|");
    material.update(payload_digest.as_bytes());
    Ok(IdempotencyKey(material.finalize().into()))
}

/// Lowercase hex of any byte string.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Bytes, not chars: this runs for every audit record and event on the writer thread, and
    // `String::push` encodes each char as UTF-8.
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0x0f)]);
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector_matches_an_independent_computation() {
        // Computed with Python's hashlib, independently of this code:
        // sha256("A-2026-014|2026-07-01T09:00:00Z|" + sha256(b"{...}").hexdigest()).hexdigest()
        let key = derive_idempotency_key("A-2026-014", "2026-07-01T09:00:00Z", b"{...}").unwrap();
        assert_eq!(key.to_hex(), KNOWN_VECTOR);
        assert_eq!(key.short(), &KNOWN_VECTOR[..12]);
    }

    const KNOWN_VECTOR: &str = "d3ed6c4d8acb11aa58dcdb03e400559b1e415626580e4a00466ae631bea74acd";

    #[test]
    fn same_inputs_same_key_and_one_changed_byte_changes_it() {
        let a = derive_idempotency_key("A-1", "2026-07-01T09:00:00Z", b"{\"x\":1}").unwrap();
        let b = derive_idempotency_key("A-1", "2026-07-01T09:00:00Z", b"{\"x\":1}").unwrap();
        let c = derive_idempotency_key("A-1", "2026-07-01T09:00:00Z", b"{\"x\":2}").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_hex().len(), 64);
        assert_ne!(a, c);
    }

    #[test]
    fn empty_identity_is_an_error_not_a_key() {
        assert_eq!(
            derive_idempotency_key("", "t", b"p"),
            Err(KeyError::EmptyAwardId)
        );
        assert_eq!(
            derive_idempotency_key("a", "", b"p"),
            Err(KeyError::EmptyTimestamp)
        );
    }

    #[test]
    fn hex_round_trips() {
        let key = derive_idempotency_key("A", "T", b"P").unwrap();
        assert_eq!(IdempotencyKey::from_hex(&key.to_hex()), Some(key));
        assert_eq!(
            IdempotencyKey::from_hex(&key.to_hex().to_uppercase()),
            Some(key)
        );
        assert_eq!(IdempotencyKey::from_slice(key.as_bytes()), Some(key));
        assert_eq!(IdempotencyKey::from_hex("zz"), None);
    }

    #[test]
    fn only_64_ascii_hex_digits_read_as_a_key() {
        let hex = derive_idempotency_key("A", "T", b"P").unwrap().to_hex();
        for bad in [
            format!("{hex}00"),
            hex[..62].to_owned(),
            format!("{}é", &hex[..62]),
        ] {
            assert_eq!(IdempotencyKey::from_hex(&bad), None, "{bad}");
        }
    }

    #[test]
    fn a_key_displays_as_its_hex_and_debugs_as_its_short_form() {
        let key = derive_idempotency_key("A", "T", b"P").unwrap();
        assert_eq!(format!("{key}"), key.to_hex());
        assert_eq!(
            format!("{key:?}"),
            format!("IdempotencyKey({})", &key.to_hex()[..12])
        );
    }
}
