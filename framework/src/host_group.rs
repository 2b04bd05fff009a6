//! Peers of one process (threads, each with its own replica and device) joined through host
//! memory: the [`Collective`] of `rlany run --peers N`. Each exchange is a round: every peer
//! puts its bytes in its slot, the last to arrive publishes the round, and every peer takes a
//! copy of all slots. A round waits at most the group's deadline, and a peer that failed
//! ([`HostGroup::fail`]) stops the others at their next wait; either way the error names who
//! is missing or what failed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::placement::{Collective, PlacementError};

/// The peers of one process and their exchange.
pub struct HostGroup {
    peers: usize,
    timeout: Duration,
    state: Mutex<Round>,
    ready: Condvar,
}

/// The exchange's shared state.
struct Round {
    /// Each peer's bytes for the round being gathered.
    parts: Vec<Option<Vec<u8>>>,
    /// Rounds completed.
    done: u64,
    /// The last round's slots, until every peer has read them.
    published: Option<Arc<Vec<Vec<u8>>>>,
    /// Peers that have read `published`.
    readers: usize,
    /// The first failure a peer reported.
    failed: Option<String>,
}

impl HostGroup {
    /// A group of `peers` whose every wait ends at `timeout` (`--peer-timeout`).
    pub fn new(peers: usize, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            peers: peers.max(1),
            timeout,
            state: Mutex::new(Round {
                parts: vec![None; peers.max(1)],
                done: 0,
                published: None,
                readers: 0,
                failed: None,
            }),
            ready: Condvar::new(),
        })
    }

    /// Peer `rank`'s handle on the group.
    pub fn peer(self: &Arc<Self>, rank: usize) -> HostPeer {
        HostPeer(self.clone(), rank)
    }

    /// Reports a peer's failure (`message` names it): every wait of the others ends with it.
    pub fn fail(&self, message: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.failed.is_none() {
            s.failed = Some(message);
        }
        self.ready.notify_all();
    }

    /// Waits on the condition until `done` says so, the deadline passes or a peer failed.
    fn wait_until<'g>(
        &'g self,
        mut s: MutexGuard<'g, Round>,
        deadline: Instant,
        rank: usize,
        what: &str,
        done: impl Fn(&Round) -> bool,
    ) -> Result<MutexGuard<'g, Round>, PlacementError> {
        loop {
            if let Some(f) = &s.failed {
                return Err(PlacementError::Collective(format!(
                    "peer {rank} of {}: stopped during the exchange of {what} because {f}",
                    self.peers
                )));
            }
            if done(&s) {
                return Ok(s);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = (0..self.peers)
                    .filter(|&p| s.parts[p].is_none())
                    .map(|p| p.to_string())
                    .collect();
                return Err(PlacementError::Collective(format!(
                    "peer {rank} of {}: no answer within {} s during the exchange of {what}: \
                     peer {} never arrived (it stalled or is still computing; --peer-timeout)",
                    self.peers,
                    self.timeout.as_secs(),
                    missing.join(", ")
                )));
            }
            s = self
                .ready
                .wait_timeout(s, deadline - now)
                .map_err(|_| PlacementError::Collective("a peer panicked".into()))?
                .0;
        }
    }
}

/// One peer's view of a [`HostGroup`].
pub struct HostPeer(Arc<HostGroup>, usize);

impl Collective for HostPeer {
    fn peers(&self) -> usize {
        self.0.peers
    }

    fn rank(&self) -> usize {
        self.1
    }

    fn all_gather(&self, mine: Vec<u8>, what: &str) -> Result<Vec<Vec<u8>>, PlacementError> {
        let (g, rank) = (&*self.0, self.1);
        let deadline = Instant::now() + g.timeout;
        let s = g.state.lock().unwrap_or_else(|e| e.into_inner());
        // The previous round's readers finish first.
        let mut s = g.wait_until(s, deadline, rank, what, |r| r.published.is_none())?;
        s.parts[rank] = Some(mine);
        if s.parts.iter().all(Option::is_some) {
            let parts = s.parts.iter_mut().filter_map(Option::take).collect();
            s.published = Some(Arc::new(parts));
            s.readers = 0;
            s.done += 1;
            g.ready.notify_all();
        } else {
            let round = s.done;
            s = g.wait_until(s, deadline, rank, what, |r| r.done != round)?;
        }
        let out = s.published.as_deref().cloned().unwrap_or_default();
        s.readers += 1;
        if s.readers == g.peers {
            s.published = None;
            g.ready.notify_all();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement;

    /// Three peers, three rounds of different lengths: every peer gets every slot, in rank
    /// order, every round.
    #[test]
    fn every_peer_gets_every_slot_every_round() {
        let g = HostGroup::new(3, Duration::from_secs(30));
        let out: Vec<Vec<Vec<Vec<u8>>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let p = g.peer(r);
                    s.spawn(move || {
                        (0..3u8)
                            .map(|round| {
                                let mine = vec![10 * round + r as u8; r + round as usize];
                                p.all_gather(mine, "bytes").expect("a round")
                            })
                            .collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("peer")).collect()
        });
        for rounds in out {
            assert_eq!(rounds[0], vec![vec![], vec![1], vec![2, 2]]);
            assert_eq!(rounds[2], vec![vec![20; 2], vec![21; 3], vec![22; 4]]);
        }
    }

    /// A peer that never arrives ends the others' wait at the deadline, naming it; a peer
    /// that failed ends it at once, with its message.
    #[test]
    fn a_missing_peer_is_named_and_a_failure_stops_the_others() {
        let g = HostGroup::new(3, Duration::from_millis(300));
        let t = Instant::now();
        let err = std::thread::scope(|s| {
            let other = s.spawn(|| g.peer(1).all_gather(vec![1], "gradients"));
            let mine = g.peer(0).all_gather(vec![0], "gradients");
            let _ = other.join();
            mine
        })
        .expect_err("peer 2 never comes")
        .to_string();
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(
            err.contains("peer 0 of 3: no answer within 0 s during the exchange of gradients"),
            "{err}"
        );
        assert!(err.contains("peer 2 never arrived"), "{err}");

        let g = HostGroup::new(2, Duration::from_secs(30));
        g.fail("peer 1 failed: the environment crashed".into());
        let t = Instant::now();
        let err = Placement::over(Arc::new(g.peer(0)))
            .gather_rows(vec![1.0], "gradients")
            .expect_err("a failure")
            .to_string();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(
            err.contains(
                "peer 0 of 2: stopped during the exchange of gradients because peer 1 failed"
            ),
            "{err}"
        );
    }
}
