//! The two hashes of the framework, each written once.
//!
//! - [`content_key`]: SHA-256 (the `sha2` crate) of bytes, as hex — the name or checksum of
//!   stored content: checkpoint files, warm-start entries and their weights, the build's
//!   `Cargo.lock` in a run's `meta.json`.
//! - [`Fnv1a`]: 64-bit FNV-1a (written once, in the environment contract, whose
//!   [`crate::Rng::derive`] needs it), for the places where a fast non-cryptographic hash is
//!   the point and nothing is stored: deriving a random stream from its name (every seed's
//!   metrics depend on these exact values, so it stays) and the replicas' per-step agreement
//!   check over every parameter ([`crate::placement::checksum`]).

use sha2::{Digest, Sha256};

/// SHA-256 of `bytes` as 64 lower-case hex digits.
pub fn content_key(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub use rlany_contract::fnv::Fnv1a;

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
