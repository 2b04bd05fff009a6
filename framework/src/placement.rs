//! Where a run's shards are computed: on this thread's replica alone, or spread over peers
//! (threads with their own device, processes on other machines) that each hold a replica of
//! the models (framework/METHOD.md, "Placement").
//!
//! `shards: n` fixes how a step's work is split, and so the numbers. A placement only decides
//! who computes which shards: peer `r` of `P` computes the contiguous share [`share`]`(n, P,
//! r)` of every sharded piece of work and the peers exchange the results, so that every peer
//! ends up with exactly what one process computing all shards has. Everything that is not
//! sharded (task draws, rewards, the proposer, the optimiser step) every peer computes itself
//! from the same inputs, so the replicas stay equal; [`Placement::agree`] checks that they do.
//!
//! The exchange is one primitive, an all-reduce sum ([`Collective`], implemented by the
//! composition root over burn-collective). A gather is built from it: each peer writes its
//! results into its own slot of a zero-filled buffer, and the sum hands every peer every slot
//! unchanged (`x + 0 = x` in floating point, whatever order the collective adds in; only a
//! `-0.0` arrives as `+0.0`). That costs `P` times a plain all-reduce's volume and buys exact
//! equality with one process for any number of peers and any reduction order.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why an exchange between peers failed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The collective itself failed (a peer died, stalled, never arrived, or the network
    /// broke); the message names what is known.
    #[error("{0}")]
    Collective(String),
    /// A peer's data could not be written or read back.
    #[error("peer {peer}'s {what} could not be exchanged: {message}")]
    Codec {
        /// The peer whose data it was.
        peer: usize,
        /// What was exchanged.
        what: String,
        /// The codec's message.
        message: String,
    },
    /// Two replicas that should be equal are not.
    #[error(
        "the replicas diverged: peer {peer}'s {what} differs from peer 0's (checksum \
         {theirs:016x}, peer 0 {ours:016x}); every peer must run the same binary on the same \
         kind of device"
    )]
    Diverged {
        /// The first peer that differs.
        peer: usize,
        /// What differs.
        what: String,
        /// Peer 0's checksum.
        ours: u64,
        /// That peer's checksum.
        theirs: u64,
    },
}

/// An all-reduce among the peers of a run: the composition root implements it (over
/// burn-collective); the framework builds every exchange on it.
pub trait Collective: Send + Sync {
    /// Peers in the run, this one included (≥ 1).
    fn peers(&self) -> usize;
    /// This peer's rank, `0..peers()`; peer 0 writes the run's files.
    fn rank(&self) -> usize;
    /// The element-wise sum of every peer's `values` (each peer passes the same length, in
    /// the same call order); `what` names the exchange in errors. Must return, or fail,
    /// within a bounded time.
    fn all_reduce_sum(&self, values: Vec<f32>, what: &str) -> Result<Vec<f32>, PlacementError>;
}

/// Where this replica's shards are computed: alone (the default), or as one peer of several.
#[derive(Clone, Default)]
pub struct Placement(Option<Arc<dyn Collective>>, Arc<Traffic>);

/// What this peer's exchanges cost so far: all-reduce calls, the bytes each call carried
/// (this peer's input), and the seconds spent in them (waiting for slower peers included);
/// and the slot width each kind of gather had last time ([`Placement::gather_rows`]).
#[derive(Debug, Default)]
struct Traffic {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    widths: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// A snapshot of a placement's traffic ([`Placement::traffic`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrafficTotals {
    /// All-reduce calls.
    pub calls: u64,
    /// Bytes this peer passed in to them.
    pub bytes: u64,
    /// Seconds spent in them.
    pub seconds: f64,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Placement(peer {} of {})", self.rank(), self.peers())
    }
}

/// The contiguous share of `n` items that peer `rank` of `peers` takes: sizes differ by at
/// most one, the first peers take the longer shares, and a peer may take none (`n < peers`).
pub fn share(n: usize, peers: usize, rank: usize) -> Range<usize> {
    let peers = peers.max(1);
    let (base, extra) = (n / peers, n % peers);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

impl Placement {
    /// One peer of the run that `collective` connects.
    pub fn over(collective: Arc<dyn Collective>) -> Self {
        Self(Some(collective), Arc::default())
    }

    /// The traffic of this peer's exchanges since the placement was made.
    pub fn traffic(&self) -> TrafficTotals {
        let t = &self.1;
        TrafficTotals {
            calls: t.calls.load(Ordering::Relaxed),
            bytes: t.bytes.load(Ordering::Relaxed),
            seconds: t.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    /// One all-reduce, counted in [`Self::traffic`].
    fn all_reduce(
        &self,
        c: &Arc<dyn Collective>,
        values: Vec<f32>,
        what: &str,
    ) -> Result<Vec<f32>, PlacementError> {
        let (t, bytes) = (std::time::Instant::now(), 4 * values.len() as u64);
        let out = c.all_reduce_sum(values, what);
        let traffic = &self.1;
        traffic.calls.fetch_add(1, Ordering::Relaxed);
        traffic.bytes.fetch_add(bytes, Ordering::Relaxed);
        traffic
            .nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// Peers in the run (1 alone).
    pub fn peers(&self) -> usize {
        self.0.as_ref().map_or(1, |c| c.peers().max(1))
    }

    /// This peer's rank (0 alone).
    pub fn rank(&self) -> usize {
        self.0.as_ref().map_or(0, |c| c.rank())
    }

    /// Whether this peer writes the run's files (peer 0, or a run alone).
    pub fn leads(&self) -> bool {
        self.rank() == 0
    }

    /// Whether the work is spread over more than one peer.
    pub fn is_spread(&self) -> bool {
        self.peers() > 1
    }

    /// The share of `n` sharded inputs this peer computes.
    pub fn owned(&self, n: usize) -> Range<usize> {
        share(n, self.peers(), self.rank())
    }

    /// Every peer's `mine`, in rank order (this peer's own among them). Exact but for the
    /// sign of a zero (see the module's documentation).
    ///
    /// One all-reduce carries every peer's length (two 16-bit halves, exact in f32 whatever
    /// the length) and, in slots of the width this kind of gather (`what`, digits aside) had
    /// last time, the rows themselves; only when a row is longer than that does a second
    /// all-reduce carry them at the new width. Every peer sees the same lengths, so every
    /// peer keeps the same widths and makes the same calls. Over several nodes each
    /// all-reduce is a session of its own, so the second one is what this saves.
    pub fn gather_rows(&self, mine: Vec<f32>, what: &str) -> Result<Vec<Vec<f32>>, PlacementError> {
        let Some(c) = &self.0 else {
            return Ok(vec![mine]);
        };
        let (peers, rank) = (self.peers(), self.rank());
        let kind: String = what.chars().filter(|ch| !ch.is_ascii_digit()).collect();
        let widths = &self.1.widths;
        let guess = widths
            .lock()
            .ok()
            .and_then(|w| w.get(&kind).copied())
            .unwrap_or(0);
        // [lengths: 2 per peer | rows: `guess` per peer]
        let mut buf = vec![0.0f32; 2 * peers + peers * guess];
        buf[2 * rank] = (mine.len() >> 16) as f32;
        buf[2 * rank + 1] = (mine.len() & 0xffff) as f32;
        if mine.len() <= guess {
            let at = 2 * peers + rank * guess;
            buf[at..at + mine.len()].copy_from_slice(&mine);
        }
        let buf = self.all_reduce(c, buf, what)?;
        let lens: Vec<usize> = buf[..2 * peers]
            .chunks(2)
            .map(|h| ((h[0] as usize) << 16) | h[1] as usize)
            .collect();
        let width = lens.iter().copied().max().unwrap_or(0);
        if let Ok(mut w) = widths.lock() {
            w.insert(kind, width);
        }
        let rows_of = |slots: &[f32], stride: usize| -> Vec<Vec<f32>> {
            lens.iter()
                .enumerate()
                .map(|(p, &len)| slots[p * stride..p * stride + len].to_vec())
                .collect()
        };
        if width <= guess {
            return Ok(rows_of(&buf[2 * peers..], guess));
        }
        let mut slots = vec![0.0f32; peers * width];
        slots[rank * width..rank * width + mine.len()].copy_from_slice(&mine);
        let slots = self.all_reduce(c, slots, what)?;
        Ok(rows_of(&slots, width))
    }

    /// Every peer's `mine` (any serde value), in rank order: written with MessagePack, two
    /// bytes per exchanged number, bit for bit.
    pub fn gather<T: Serialize + DeserializeOwned>(
        &self,
        mine: T,
        what: &str,
    ) -> Result<Vec<T>, PlacementError> {
        if self.0.is_none() {
            return Ok(vec![mine]);
        }
        let codec = |peer: usize, message: String| PlacementError::Codec {
            peer,
            what: what.to_string(),
            message,
        };
        let bytes = rmp_serde::to_vec(&mine).map_err(|e| codec(self.rank(), e.to_string()))?;
        let rows = self.gather_rows(to_words(&bytes), what)?;
        rows.iter()
            .enumerate()
            .map(|(peer, words)| {
                let bytes = from_words(words).ok_or_else(|| codec(peer, "bad framing".into()))?;
                rmp_serde::from_slice(&bytes).map_err(|e| codec(peer, e.to_string()))
            })
            .collect()
    }

    /// `Ok` when every peer passes the same `value` for `what` (a checksum of its replica).
    pub fn agree(&self, what: &str, value: u64) -> Result<(), PlacementError> {
        let all = self.gather(value, what)?;
        match all.iter().position(|&v| v != all[0]) {
            None => Ok(()),
            Some(peer) => Err(PlacementError::Diverged {
                peer,
                what: what.to_string(),
                ours: all[0],
                theirs: all[peer],
            }),
        }
    }
}

/// `bytes` as 16-bit words (exact in f32), after two words of byte count.
fn to_words(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(2 + bytes.len().div_ceil(2));
    out.push((bytes.len() >> 16) as f32);
    out.push((bytes.len() & 0xffff) as f32);
    out.extend(bytes.chunks(2).map(|c| {
        let hi = c.get(1).copied().unwrap_or(0);
        f32::from(u16::from_le_bytes([c[0], hi]))
    }));
    out
}

/// The bytes [`to_words`] wrote; `None` when the framing does not hold.
fn from_words(words: &[f32]) -> Option<Vec<u8>> {
    let (head, body) = words.split_at_checked(2)?;
    let n = ((head[0] as usize) << 16) | head[1] as usize;
    if body.len() != n.div_ceil(2) {
        return None;
    }
    let mut out = Vec::with_capacity(n + 1);
    for &w in body {
        if !(0.0..=65535.0).contains(&w) || w.fract() != 0.0 {
            return None;
        }
        out.extend((w as u16).to_le_bytes());
    }
    out.truncate(n);
    Some(out)
}

/// FNV-1a over the bits of every trainable (gradient-requiring) parameter of `module`, in
/// visiting order: equal replicas give equal checksums.
pub fn checksum<B: Backend, M: Module<B>>(module: &M) -> u64 {
    struct Fnv(u64);
    impl<B: Backend> ModuleVisitor<B> for Fnv {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            if !t.is_require_grad() {
                return;
            }
            let data = t.into_data().convert::<f32>();
            for &x in data.as_slice::<f32>().unwrap_or(&[]) {
                for b in x.to_bits().to_le_bytes() {
                    self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
                }
            }
        }
    }
    let mut v = Fnv(0xcbf2_9ce4_8422_2325);
    module.visit(&mut v);
    v.0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex};

    #[test]
    fn shares_are_contiguous_even_and_cover_the_items() {
        let all = |n, p| (0..p).map(|r| share(n, p, r)).collect::<Vec<_>>();
        assert_eq!(all(5, 2), vec![0..3, 3..5]);
        assert_eq!(all(6, 3), vec![0..2, 2..4, 4..6]);
        assert_eq!(all(1, 3), vec![0..1, 1..1, 1..1]);
        assert_eq!(all(7, 1), vec![0..7]);
        // The same split as the shards' own row groups when there are enough items.
        assert_eq!(all(7, 3), crate::shard::ranges(7, 3));
    }

    #[test]
    fn words_round_trip_odd_and_even_lengths() {
        for bytes in [vec![], vec![7u8], vec![0, 255, 128], vec![1, 2, 3, 4]] {
            let w = to_words(&bytes);
            assert_eq!(w.len(), 2 + bytes.len().div_ceil(2));
            assert_eq!(from_words(&w), Some(bytes));
        }
        // Two words of byte count (high, low half), then bytes [1, 2] as the word 0x0201.
        let w = to_words(&[1, 2]);
        assert_eq!(w, vec![0.0, 2.0, 513.0]);
        assert_eq!(to_words(&vec![0u8; 300])[..2], [0.0, 300.0]);
        assert_eq!(from_words(&[0.0, 3.0, 1.0]), None, "too few words");
        assert_eq!(from_words(&[0.0, 1.0, 70000.0]), None, "not a 16-bit word");
    }

    /// An in-process all-reduce for `peers` threads: each call waits until every peer has
    /// added its values, then all read the sum (in rank order, like one process would add).
    pub(crate) struct Threads {
        peers: usize,
        state: Mutex<Round>,
        ready: Condvar,
    }

    /// The all-reduce's shared state.
    struct Round {
        /// Each peer's values for the round being gathered.
        parts: Vec<Option<Vec<f32>>>,
        /// Rounds completed.
        done: u64,
        /// The last round's sum, until every peer has read it.
        sum: Option<Vec<f32>>,
        /// Peers that have read `sum`.
        readers: usize,
    }

    impl Threads {
        pub(crate) fn new(peers: usize) -> Arc<Self> {
            Arc::new(Self {
                peers,
                state: Mutex::new(Round {
                    parts: vec![None; peers],
                    done: 0,
                    sum: None,
                    readers: 0,
                }),
                ready: Condvar::new(),
            })
        }
    }

    /// One peer's view of [`Threads`].
    pub(crate) struct ThreadPeer(pub Arc<Threads>, pub usize);

    impl Collective for ThreadPeer {
        fn peers(&self) -> usize {
            self.0.peers
        }
        fn rank(&self) -> usize {
            self.1
        }
        fn all_reduce_sum(&self, values: Vec<f32>, _: &str) -> Result<Vec<f32>, PlacementError> {
            let t = &self.0;
            let mut s = t
                .state
                .lock()
                .map_err(|e| PlacementError::Collective(e.to_string()))?;
            // Wait for the previous round's readers to finish.
            while s.sum.is_some() {
                s = t
                    .ready
                    .wait(s)
                    .map_err(|e| PlacementError::Collective(e.to_string()))?;
            }
            s.parts[self.1] = Some(values);
            if s.parts.iter().all(Option::is_some) {
                let parts: Vec<Vec<f32>> = s.parts.iter_mut().filter_map(Option::take).collect();
                let mut sum = vec![0.0f32; parts[0].len()];
                for p in &parts {
                    sum.iter_mut().zip(p).for_each(|(a, b)| *a += b);
                }
                s.sum = Some(sum);
                s.readers = 0;
                s.done += 1;
                t.ready.notify_all();
            } else {
                let round = s.done;
                while s.done == round {
                    s = t
                        .ready
                        .wait(s)
                        .map_err(|e| PlacementError::Collective(e.to_string()))?;
                }
            }
            let out = s.sum.clone().unwrap_or_default();
            s.readers += 1;
            if s.readers == t.peers {
                s.sum = None;
                t.ready.notify_all();
            }
            Ok(out)
        }
    }

    /// `f(placement)` on `peers` threads joined by [`Threads`]; the results in rank order.
    pub(crate) fn on_peers<R: Send>(peers: usize, f: impl Fn(Placement) -> R + Sync) -> Vec<R> {
        let threads = Threads::new(peers);
        let f = &f;
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..peers)
                .map(|r| {
                    let p = Placement::over(Arc::new(ThreadPeer(threads.clone(), r)));
                    s.spawn(move || f(p))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("peer thread"))
                .collect()
        })
    }

    #[test]
    fn gather_hands_every_peer_every_peers_value_exactly() {
        let out = on_peers(3, |p| {
            let r = p.rank();
            let rows = p
                .gather_rows(vec![r as f32 + 0.1; r + 1], "rows")
                .expect("rows");
            let text = p
                .gather(format!("peer {r} {}", f64::NAN), "text")
                .expect("text");
            let nan = p.gather(vec![f64::NAN, -1e-300], "floats").expect("floats");
            (rows, text, nan)
        });
        for (rows, text, nan) in out {
            assert_eq!(rows, vec![vec![0.1], vec![1.1, 1.1], vec![2.1, 2.1, 2.1]]);
            assert_eq!(text, vec!["peer 0 NaN", "peer 1 NaN", "peer 2 NaN"]);
            assert!(nan.iter().all(|v| v[0].is_nan() && v[1] == -1e-300));
        }
    }

    /// A gather of a kind seen before costs one all-reduce while its rows fit the last
    /// width, two when one outgrows it (or the first time); the rows are exact either way.
    #[test]
    fn a_gather_that_fits_the_last_width_is_one_all_reduce() {
        let out = on_peers(2, |p| {
            let r = p.rank();
            let mut calls = Vec::new();
            // Step numbers in `what` do not make a new kind.
            for (step, len) in [(1, 3), (2, 3), (3, 2), (4, 5), (5, 5), (6, 0)] {
                let before = p.traffic().calls;
                let mine: Vec<f32> = (0..len + r).map(|i| (10 * r + i) as f32).collect();
                let rows = p
                    .gather_rows(mine, &format!("rows at step {step}"))
                    .expect("rows");
                let want: Vec<Vec<f32>> = (0..2)
                    .map(|q| (0..len + q).map(|i| (10 * q + i) as f32).collect())
                    .collect();
                assert_eq!(rows, want, "step {step}");
                calls.push(p.traffic().calls - before);
            }
            calls
        });
        // Widths 4, 4, 3, 6, 6, 1: the first, and the one that outgrows 3, take two calls.
        for calls in out {
            assert_eq!(calls, vec![2, 1, 1, 2, 1, 1]);
        }
    }

    #[test]
    fn agree_names_the_first_peer_that_differs() {
        let out = on_peers(3, |p| p.agree("policy", [5, 5, 9][p.rank()]));
        for r in out {
            match r {
                Err(PlacementError::Diverged {
                    peer, ours, theirs, ..
                }) => {
                    assert_eq!((peer, ours, theirs), (2, 5, 9));
                }
                other => panic!("expected a divergence, got {other:?}"),
            }
        }
        assert!(
            on_peers(2, |p| p.agree("policy", 4))
                .iter()
                .all(Result::is_ok)
        );
    }
}
