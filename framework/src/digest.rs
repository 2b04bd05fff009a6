//! The two hashes of the framework, each written once.
//!
//! - [`content_key`]: SHA-256 (the `sha2` crate) of bytes, as hex — the name or checksum of
//!   stored content: checkpoint files, warm-start entries and their weights, the build's
//!   `Cargo.lock` in a run's `meta.json`.
//! - [`Fnv1a`]: 64-bit FNV-1a, for the two places where a fast non-cryptographic hash is the
//!   point and nothing is stored: deriving a random stream from its name
//!   ([`crate::Rng::derive`]: every seed's metrics depend on these exact values, so it stays)
//!   and the replicas' per-step agreement check over every parameter
//!   ([`crate::placement::checksum`]).

use sha2::{Digest, Sha256};

/// SHA-256 of `bytes` as 64 lower-case hex digits.
pub fn content_key(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// 64-bit FNV-1a, fed byte by byte.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    /// Feeds `bytes`.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }

    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::default();
        h.write(bytes);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published test vectors: SHA-256 of "" and "abc"; FNV-1a 64 of "" (the offset basis)
    /// and "a".
    #[test]
    fn known_vectors() {
        assert_eq!(
            content_key(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            content_key(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Fnv1a::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv1a::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv1a::default();
        h.write(b"a");
        h.write(b"bc");
        assert_eq!(h.finish(), Fnv1a::of(b"abc"));
    }
}
