//! Ed25519 keys for evidence: what a key file says, and signing and checking bytes.
//!
//! A key file is one line of text, a header word and the key in lowercase hex:
//! `claimgate-ed25519-signing-key <64 hex digits: the 32-byte seed>` or
//! `claimgate-ed25519-public-key <64 hex digits: the 32-byte public key>`. A key is named in
//! anchors and checkpoints by its id, the first 16 hex digits of SHA-256 over the public key,
//! so a reader can tell which key a signature claims without trusting it.
//!
//! Pure: making a seed needs the OS's random source, which is the caller's business
//! (`ops::evidence`); everything here is a function of the bytes it is given.

use crate::domain::key::to_hex;
use ring::signature::{self, KeyPair};
use sha2::{Digest, Sha256};

/// The first word of a signing (secret) key file.
pub const SIGNING_KEY_HEADER: &str = "claimgate-ed25519-signing-key";
/// The first word of a public key file.
pub const PUBLIC_KEY_HEADER: &str = "claimgate-ed25519-public-key";

/// An Ed25519 signing key. Its `Debug` never shows the secret.
pub struct SigningKey {
    /// The 32-byte seed the key pair is derived from: what the key file holds.
    seed: [u8; 32],
    /// The key pair derived from `seed`.
    pair: signature::Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.public_key().key_id())
    }
}

impl SigningKey {
    /// The key pair of a 32-byte seed.
    pub fn from_seed(seed: [u8; 32]) -> SigningKey {
        let pair = signature::Ed25519KeyPair::from_seed_unchecked(&seed)
            .expect("any 32 bytes are an Ed25519 seed");
        SigningKey { seed, pair }
    }

    /// Reads a signing key file's text; the error says what is wrong, never the key.
    pub fn parse(text: &str) -> Result<SigningKey, String> {
        let seed = parse_line(text, SIGNING_KEY_HEADER)?;
        Ok(SigningKey::from_seed(seed))
    }

    /// The key file's text (one line, newline-terminated).
    pub fn to_text(&self) -> String {
        format!("{SIGNING_KEY_HEADER} {}\n", to_hex(&self.seed))
    }

    /// The public half.
    pub fn public_key(&self) -> PublicKey {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(bytes)
    }

    /// The signature of `message`, in hex (128 digits). Ed25519 signing is deterministic: the
    /// same key and message always give the same signature.
    pub fn sign(&self, message: &[u8]) -> String {
        to_hex(self.pair.sign(message).as_ref())
    }
}

/// An Ed25519 public key: what `audit verify --public-key` checks signatures with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// Reads a public key file's text.
    pub fn parse(text: &str) -> Result<PublicKey, String> {
        parse_line(text, PUBLIC_KEY_HEADER).map(PublicKey)
    }

    /// The key file's text (one line, newline-terminated).
    pub fn to_text(&self) -> String {
        format!("{PUBLIC_KEY_HEADER} {}\n", to_hex(&self.0))
    }

    /// The key's short name: the first 16 hex digits of SHA-256 over its 32 bytes.
    pub fn key_id(&self) -> String {
        to_hex(&Sha256::digest(self.0))[..16].to_owned()
    }

    /// True when `signature_hex` is this key's valid signature of `message`.
    pub fn verifies(&self, message: &[u8], signature_hex: &str) -> bool {
        let Some(sig) = from_hex(signature_hex) else {
            return false;
        };
        signature::UnparsedPublicKey::new(&signature::ED25519, &self.0)
            .verify(message, &sig)
            .is_ok()
    }
}

/// `HEADER <64 hex>` on the first line (surrounding whitespace ignored) → 32 bytes.
fn parse_line(text: &str, header: &str) -> Result<[u8; 32], String> {
    let mut words = text.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(h), Some(hex), None) if h == header => from_hex(hex)
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| format!("the key after {header} is not 64 hex digits")),
        (Some(h), _, _) if h != header => Err(format!(
            "not a {header} file (it starts with {:?})",
            h.chars().take(40).collect::<String>()
        )),
        _ => Err(format!("expected one line: {header} <64 hex digits>")),
    }
}

/// Lowercase or uppercase hex → bytes; `None` for an odd length or a non-hex digit.
pub(crate) fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signing_key_debugs_as_its_public_id_and_never_its_secret() {
        let key = SigningKey::from_seed([7; 32]);
        let shown = format!("{key:?}");
        assert_eq!(shown, format!("SigningKey({})", key.public_key().key_id()));
        assert!(!shown.contains(&"07".repeat(32)), "{shown}");
    }

    #[test]
    fn a_key_file_with_the_right_header_and_anything_more_is_not_one_line() {
        let hex = "07".repeat(32);
        let err = SigningKey::parse(&format!("{SIGNING_KEY_HEADER} {hex} extra")).unwrap_err();
        assert!(err.starts_with("expected one line"), "{err}");
        let err = PublicKey::parse("claimgate-ed25519-public-key").unwrap_err();
        assert!(err.starts_with("expected one line"), "{err}");
    }

    #[test]
    fn a_key_signs_and_only_its_public_key_verifies() {
        let key = SigningKey::from_seed([7; 32]);
        let other = SigningKey::from_seed([8; 32]);
        let sig = key.sign(b"anchor");
        assert_eq!(sig.len(), 128);
        assert!(key.public_key().verifies(b"anchor", &sig));
        assert!(!key.public_key().verifies(b"anchor!", &sig));
        assert!(!other.public_key().verifies(b"anchor", &sig));
        assert!(!key.public_key().verifies(b"anchor", "zz"));
        assert_ne!(key.public_key().key_id(), other.public_key().key_id());
    }

    #[test]
    fn key_files_round_trip_and_a_wrong_file_is_named() {
        let key = SigningKey::from_seed([9; 32]);
        let again = SigningKey::parse(&key.to_text()).unwrap();
        assert_eq!(again.public_key(), key.public_key());
        let public = PublicKey::parse(&key.public_key().to_text()).unwrap();
        assert_eq!(public, key.public_key());
        assert!(PublicKey::parse(&key.to_text())
            .unwrap_err()
            .contains("not a claimgate-ed25519-public-key"));
        assert!(SigningKey::parse("claimgate-ed25519-signing-key abc").is_err());
        assert!(SigningKey::parse("").is_err());
        assert!(
            !format!("{key:?}").contains(&to_hex(&[9; 32])),
            "Debug never shows the seed"
        );
    }

    /// RFC 8032 section 7.1, test 1: the empty message under a known seed, so the scheme is
    /// checked against a vector computed outside this crate.
    #[test]
    fn signing_matches_rfc_8032_test_1() {
        let seed =
            from_hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60").unwrap();
        let key = SigningKey::from_seed(seed.try_into().unwrap());
        assert_eq!(
            to_hex(&key.public_key().0),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        assert_eq!(
            key.sign(b""),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155\
             5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        );
    }
}
