//! The one random-number generator of the project: xoshiro256++ seeded through splitmix64.
//!
//! Every random stream of a run (task sampling, rollout sampling, minibatch shuffling, ...)
//! is an [`Rng`] derived from the experiment seed with [`Rng::derive`]. Its whole state is four
//! `u64`s, so it serialises exactly into checkpoints: a resumed run draws the same numbers as
//! an uninterrupted one.

use serde::{Deserialize, Serialize};

/// xoshiro256++ (Blackman & Vigna), small, fast and exactly serialisable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded from one `u64`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Self { s }
    }

    /// An independent stream named `stream` derived from `seed` (e.g. `Rng::derive(seed, "rollout")`).
    pub fn derive(seed: u64, stream: &str) -> Self {
        // FNV-1a of the stream name, mixed with the seed.
        let h = crate::fnv::Fnv1a::of(stream.as_bytes());
        Self::new(seed ^ h.rotate_left(17))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `[lo, hi]` (inclusive). Returns `lo` when `hi <= lo`.
    pub fn range_inclusive(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo) as u64 + 1;
        // Lemire-style rejection to avoid modulo bias.
        let zone = u64::MAX - (u64::MAX % span);
        loop {
            let x = self.next_u64();
            if x < zone {
                return lo + (x % span) as i64;
            }
        }
    }

    /// Uniform index in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: usize) -> usize {
        self.range_inclusive(0, n.saturating_sub(1) as i64) as usize
    }

    /// `true` with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }

    /// Standard normal draw (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let mut a = Rng::derive(7, "rollout");
        let mut b = Rng::derive(7, "rollout");
        let mut c = Rng::derive(7, "eval");
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn serde_round_trip_continues_the_stream() {
        let mut a = Rng::new(42);
        a.next_u64();
        let json = serde_json::to_string(&a).expect("serialise");
        let mut b: Rng = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn ranges_are_inclusive_and_bounded() {
        let mut r = Rng::new(1);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let x = r.range_inclusive(2, 5);
            assert!((2..=5).contains(&x));
            seen[(x - 2) as usize] = true;
            let u = r.uniform();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(seen.iter().all(|s| *s));
    }
}
