//! HMAC-SHA256 challenge–response. The secret never travels: each side proves it knows the
//! secret by MACing both nonces and the claims under its own label, so a client's proof cannot
//! be replayed on another connection (fresh root nonce) or reflected as the root's proof
//! (different label). Verification is constant-time (`Mac::verify_slice`).

use hmac::{Hmac, Mac as _};
use sha2::{Digest, Sha256};

use super::id::Secret;
use crate::{Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Bytes of an HMAC-SHA256 tag.
pub(crate) const MAC_LEN: usize = 32;
/// A nonce.
pub(crate) type Nonce = [u8; NONCE_LEN];
/// An HMAC-SHA256 tag.
pub(crate) type Mac = [u8; MAC_LEN];

/// What a MAC vouches for; the label keeps the three proofs apart.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Label {
    /// Client → root: "I know the secret, and these are my claims".
    Client,
    /// Root → client: "I know the secret, and I accepted these claims".
    Root,
    /// Root → client: "this rank table comes from the root you authenticated".
    Table,
}

impl Label {
    fn bytes(self) -> &'static [u8] {
        match self {
            Label::Client => b"symcomm/1/client",
            Label::Root => b"symcomm/1/root",
            Label::Table => b"symcomm/1/table",
        }
    }
}

/// A fresh nonce from the OS CSPRNG.
pub(crate) fn nonce() -> Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    fill_random(&mut n)?;
    Ok(n)
}

/// Fills `buf` from the OS CSPRNG.
pub(crate) fn fill_random(buf: &mut [u8]) -> Result<()> {
    getrandom::fill(buf).map_err(|e| {
        Error::io(
            "reading the OS random number generator",
            std::io::Error::other(e.to_string()),
        )
    })
}

fn keyed(secret: &Secret, label: Label, client: &Nonce, root: &Nonce, body: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for HMAC.
    let mut mac = match HmacSha256::new_from_slice(secret.bytes()) {
        Ok(m) => m,
        Err(_) => unreachable_key(),
    };
    mac.update(label.bytes());
    mac.update(client);
    mac.update(root);
    mac.update(body);
    mac
}

/// HMAC keys have no length limit, so this is never reached; a MAC under an all-zero key
/// would then simply fail to verify.
#[cold]
fn unreachable_key() -> HmacSha256 {
    <HmacSha256 as hmac::digest::KeyInit>::new(&Default::default())
}

/// `HMAC-SHA256(secret, label ‖ client nonce ‖ root nonce ‖ body)`.
pub(crate) fn mac(secret: &Secret, label: Label, client: &Nonce, root: &Nonce, body: &[u8]) -> Mac {
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(
        &keyed(secret, label, client, root, body)
            .finalize()
            .into_bytes(),
    );
    out
}

/// Constant-time check of a received tag.
pub(crate) fn verify(
    secret: &Secret,
    label: Label,
    client: &Nonce,
    root: &Nonce,
    body: &[u8],
    tag: &Mac,
) -> bool {
    keyed(secret, label, client, root, body)
        .verify_slice(tag)
        .is_ok()
}

/// A short, non-reversible name for a secret, safe to log: the first 8 bytes of
/// `SHA-256("symcomm/1/fingerprint" ‖ secret)` in hex.
pub(crate) fn fingerprint(secret: &Secret) -> String {
    let mut h = Sha256::new();
    h.update(b"symcomm/1/fingerprint");
    h.update(secret.bytes());
    super::id::hex(&h.finalize()[..8])
}

/// A secret derived from `secret` for `purpose` (a new communicator made from an existing one:
/// its ranks agree on it without sending it): the first 16 bytes of
/// `HMAC-SHA256(secret, "symcomm/1/derive" ‖ purpose)`.
pub(crate) fn derive_secret(secret: &Secret, purpose: &[u8]) -> Secret {
    // HMAC accepts keys of any length (as in `keyed`).
    let mut h = HmacSha256::new_from_slice(secret.bytes()).unwrap_or_else(|_| unreachable_key());
    h.update(b"symcomm/1/derive");
    h.update(purpose);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().into_bytes()[..16]);
    Secret::from_bytes(out)
}

/// A secret derived from public facts (used when none was configured; it only keeps unrelated
/// jobs apart, it does not keep anyone out).
pub(crate) fn derive_public_secret(parts: &[&str]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"symcomm/1/unauthenticated");
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_label_nonces_and_body() {
        let s = Secret::from_bytes([1; 16]);
        let other = Secret::from_bytes([2; 16]);
        let (c, r) = ([3; NONCE_LEN], [4; NONCE_LEN]);
        let tag = mac(&s, Label::Client, &c, &r, b"claims");
        assert!(verify(&s, Label::Client, &c, &r, b"claims", &tag));
        assert!(!verify(&other, Label::Client, &c, &r, b"claims", &tag));
        assert!(!verify(&s, Label::Root, &c, &r, b"claims", &tag));
        assert!(!verify(&s, Label::Client, &r, &c, b"claims", &tag));
        assert!(!verify(
            &s,
            Label::Client,
            &c,
            &[5; NONCE_LEN],
            b"claims",
            &tag
        ));
        assert!(!verify(&s, Label::Client, &c, &r, b"claimz", &tag));
        let mut flipped = tag;
        flipped[31] ^= 1;
        assert!(!verify(&s, Label::Client, &c, &r, b"claims", &flipped));
    }

    #[test]
    fn nonces_differ_and_fingerprints_hide_the_secret() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
        let s = Secret::from_bytes([0xab; 16]);
        let fp = fingerprint(&s);
        assert_eq!(fp.len(), 16);
        assert!(!fp.contains("abab"));
        assert_ne!(
            derive_public_secret(&["a", "bc"]),
            derive_public_secret(&["ab", "c"])
        );
    }
}
