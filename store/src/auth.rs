//! Agents prove they hold the job's secret without sending it: the server sends a random nonce,
//! the client answers HMAC-SHA256(secret, domain || nonce). torch's clients know nothing of this
//! and stay unauthenticated (see [`crate::server::AGENT_PREFIX`] for what that allows).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of the server's nonce and of the client's proof.
pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;

/// Separates these MACs from any other use of the same secret.
const DOMAIN: &[u8] = b"vigil-store-auth-v1";

/// Shortest secret accepted: 16 bytes, as `openssl rand -hex 8` gives.
pub const MIN_SECRET_LEN: usize = 16;

/// A secret too short to be one; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("VIGIL_STORE_SECRET has {len} bytes, fewer than {MIN_SECRET_LEN}: set it to a random string, e.g. $(openssl rand -hex 32), or unset it")]
pub struct ShortSecret {
    pub len: usize,
}

/// `secret` if it is long enough to be one.
pub fn check_secret(secret: &[u8]) -> Result<&[u8], ShortSecret> {
    if secret.len() < MIN_SECRET_LEN {
        return Err(ShortSecret { len: secret.len() });
    }
    Ok(secret)
}

/// The proof a client holding `secret` sends for `nonce`.
pub fn proof(secret: &[u8], nonce: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(DOMAIN);
    mac.update(nonce);
    mac.finalize().into_bytes().into()
}

/// Whether `got` is the proof for `nonce` under `secret` (constant time).
pub fn verify(secret: &[u8], nonce: &[u8; NONCE_LEN], got: &[u8; PROOF_LEN]) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(DOMAIN);
    mac.update(nonce);
    mac.verify_slice(got).is_ok()
}

/// Random bytes from the operating system.
pub fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b)
}

/// A fresh secret for a store whose only authenticated clients live in this process.
pub fn random_secret() -> std::io::Result<Vec<u8>> {
    Ok(random::<32>()?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_verifies_only_with_the_same_secret_and_nonce() {
        let n = [7u8; NONCE_LEN];
        let p = proof(b"0123456789abcdef", &n);
        assert!(verify(b"0123456789abcdef", &n, &p));
        assert!(!verify(b"0123456789abcdeX", &n, &p));
        assert!(!verify(b"0123456789abcdef", &[8u8; NONCE_LEN], &p));
    }

    #[test]
    fn random_bytes_differ() {
        assert_ne!(random::<32>().unwrap(), random::<32>().unwrap());
    }
}
