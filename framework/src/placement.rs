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
//! The exchange is one primitive, an exact all-gather of bytes ([`Collective`]): every peer
//! hands in its own rows and gets every peer's rows back, in rank order, bit for bit. Over
//! several processes it is MPI's `MPI_Allgatherv` (the composition root's `distributed`
//! build); between peers of one process it goes through host memory ([`crate::HostGroup`]).
//! Gradients are gathered per shard and summed in shard order by every peer, so any number of
//! peers gives the sums of one process, whatever order a network would add in.

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

/// The exchange among the peers of a run: the composition root implements it (over MPI), or
/// [`crate::HostGroup`] between threads; the framework builds every exchange on it.
pub trait Collective: Send + Sync {
    /// Peers in the run, this one included (≥ 1).
    fn peers(&self) -> usize;
    /// This peer's rank, `0..peers()`; peer 0 writes the run's files.
    fn rank(&self) -> usize;
    /// Every peer's `mine`, in rank order (this peer's own among them), exactly; the lengths
    /// may differ. Every peer makes the same calls in the same order; `what` names the
    /// exchange in errors. Must return, or fail, within a bounded time.
    fn all_gather(&self, mine: Vec<u8>, what: &str) -> Result<Vec<Vec<u8>>, PlacementError>;
}

/// Where this replica's shards are computed: alone (the default), or as one peer of several.
#[derive(Clone, Default)]
pub struct Placement(Option<Arc<dyn Collective>>, Arc<Traffic>);

/// What this peer's exchanges cost so far: calls, the bytes each call carried (this peer's
/// input), and the seconds spent in them (waiting for slower peers included).
#[derive(Debug, Default)]
struct Traffic {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

/// A snapshot of a placement's traffic ([`Placement::traffic`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrafficTotals {
    /// Exchanges.
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

    /// One exchange, counted in [`Self::traffic`].
    fn exchange(
        &self,
        c: &Arc<dyn Collective>,
        mine: Vec<u8>,
        what: &str,
    ) -> Result<Vec<Vec<u8>>, PlacementError> {
        let (t, bytes) = (std::time::Instant::now(), mine.len() as u64);
        let out = c.all_gather(mine, what);
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

    /// Every peer's `mine`, in rank order (this peer's own among them), bit for bit: one
    /// exchange of the values' bytes.
    pub fn gather_rows(&self, mine: Vec<f32>, what: &str) -> Result<Vec<Vec<f32>>, PlacementError> {
        let Some(c) = &self.0 else {
            return Ok(vec![mine]);
        };
        let mut bytes = Vec::with_capacity(4 * mine.len());
        for x in &mine {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        let rows = self.exchange(c, bytes, what)?;
        rows.iter()
            .enumerate()
            .map(|(peer, row)| {
                if row.len() % 4 != 0 {
                    return Err(PlacementError::Codec {
                        peer,
                        what: what.to_string(),
                        message: format!("{} bytes are not whole f32 values", row.len()),
                    });
                }
                Ok(row
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect())
            })
            .collect()
    }

    /// Every peer's `mine` (any serde value), in rank order: written with MessagePack and
    /// exchanged as bytes, bit for bit.
    pub fn gather<T: Serialize + DeserializeOwned>(
        &self,
        mine: T,
        what: &str,
    ) -> Result<Vec<T>, PlacementError> {
        let Some(c) = &self.0 else {
            return Ok(vec![mine]);
        };
        let codec = |peer: usize, message: String| PlacementError::Codec {
            peer,
            what: what.to_string(),
            message,
        };
        let bytes = rmp_serde::to_vec(&mine).map_err(|e| codec(self.rank(), e.to_string()))?;
        let rows = self.exchange(c, bytes, what)?;
        rows.iter()
            .enumerate()
            .map(|(peer, bytes)| {
                rmp_serde::from_slice(bytes).map_err(|e| codec(peer, e.to_string()))
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

/// FNV-1a over the bits of every trainable (gradient-requiring) parameter of `module`, in
/// visiting order: equal replicas give equal checksums.
pub fn checksum<B: Backend, M: Module<B>>(module: &M) -> u64 {
    struct Fnv(crate::digest::Fnv1a);
    impl<B: Backend> ModuleVisitor<B> for Fnv {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            if !t.is_require_grad() {
                return;
            }
            let data = t.into_data().convert::<f32>();
            for &x in data.as_slice::<f32>().unwrap_or(&[]) {
                self.0.write(&x.to_bits().to_le_bytes());
            }
        }
    }
    let mut v = Fnv(crate::digest::Fnv1a::default());
    module.visit(&mut v);
    v.0.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::host_group::HostGroup;

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

    /// `f(placement)` on `peers` threads joined by a [`HostGroup`]; the results in rank order.
    pub(crate) fn on_peers<R: Send>(peers: usize, f: impl Fn(Placement) -> R + Sync) -> Vec<R> {
        let group = HostGroup::new(peers, std::time::Duration::from_secs(60));
        let f = &f;
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..peers)
                .map(|r| {
                    let p = Placement::over(Arc::new(group.peer(r)));
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

    /// Every gather is one exchange, whatever the lengths.
    #[test]
    fn a_gather_is_one_exchange() {
        let out = on_peers(2, |p| {
            let before = p.traffic();
            p.gather_rows(vec![1.0; 3 + p.rank()], "rows")
                .expect("rows");
            p.gather(String::from("x"), "text").expect("text");
            let after = p.traffic();
            (after.calls - before.calls, after.bytes - before.bytes)
        });
        // 12 and 16 bytes of rows, then MessagePack's two bytes of "x".
        assert_eq!(out, vec![(2, 14), (2, 18)]);
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
