//! The children of one process environment: started lazily, one call at a time each,
//! replaced after a failure, with a count of failures since the last successful `step`
//! that turns into the environment's fault.
//!
//! A failed call (crash, timeout, garbage, an oversized line, an `error` reply, a reply
//! that breaks the protocol) fails the episode that made it; unless the failure was an
//! `error` reply the child is killed, its slot's *generation* goes up (every episode it
//! held is lost and ends failed) and the next call on the slot starts a new child. After
//! `max_failures` failed calls with no successful `step` between them the pool is
//! *faulted*: every later call fails at once without starting anything, and
//! [`rlany_contract::Environment::fault`] names the command and the last failure, so the
//! loop stops the run before its next checkpoint. A child that fails *often* without
//! failing twice in a row (one that crashes at every third step: each new child answers
//! two steps first) faults it too: of the last `window` outcomes (successful steps and
//! failed calls), more than `max_rate` failed.

use super::child::{Child, Failure, Limits, PROTOCOL, ProcessError};
use super::reply::Describe;
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// How to start a child.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The program and its arguments (no shell).
    pub command: Vec<String>,
    /// Its working directory (`None`: ours).
    pub cwd: Option<PathBuf>,
    /// Per-call limits.
    pub limits: Limits,
}

impl Launch {
    /// Starts a child and reads its `hello` reply.
    pub fn start(&self) -> Result<(Child, Describe), ProcessError> {
        let mut child = Child::spawn(&self.command, self.cwd.as_deref(), self.limits)?;
        let mut hello = Map::new();
        hello.insert("protocol".into(), PROTOCOL.into());
        let reply = child.call("hello", hello)?;
        match Describe::read(&reply) {
            Ok(d) => Ok((child, d)),
            Err(why) => {
                child.kill();
                Err(ProcessError {
                    command: child.command().to_owned(),
                    failure: Failure::Garbage {
                        op: "hello".into(),
                        why,
                        excerpt: Value::Object(reply).to_string().chars().take(120).collect(),
                    },
                    stderr: String::new(),
                })
            }
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    child: Option<Child>,
    generation: u64,
}

#[derive(Debug, Default)]
struct Health {
    consecutive: usize,
    failed_calls: u64,
    timeouts: u64,
    restarts: u64,
    /// The last outcomes, oldest first: `true` a failed call, `false` a successful step.
    recent: VecDeque<bool>,
    fault: Option<String>,
}

/// When failures stop the environment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Failed calls in a row (no successful step between them).
    pub max_failures: usize,
    /// The largest tolerated fraction of failures among the last `window` outcomes.
    pub max_rate: f64,
    /// How many outcomes (successful steps and failed calls) the rate is taken over; the
    /// rate applies once that many were seen.
    pub window: usize,
}

/// A request in flight: its `seq` and the generation of the child it went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The request's `seq`.
    pub seq: u64,
    /// The generation of its child.
    pub generation: u64,
}

/// Why a call did not happen or failed (already recorded in the pool's health).
#[derive(Debug, Clone, PartialEq)]
pub struct CallFailed(pub String);

/// The children.
#[derive(Debug)]
pub struct Pool {
    launch: Launch,
    describe: Describe,
    slots: Vec<Mutex<Slot>>,
    next_slot: AtomicUsize,
    next_episode: AtomicU64,
    health: Mutex<Health>,
    tolerance: Tolerance,
    failed_episodes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pool {
    /// Starts the first child (its `hello` describes the environment); the others start
    /// on first use.
    pub fn start(
        launch: Launch,
        children: usize,
        tolerance: Tolerance,
    ) -> Result<Self, ProcessError> {
        let (first, describe) = launch.start()?;
        let mut slots: Vec<Mutex<Slot>> = (0..children.max(1)).map(|_| Mutex::default()).collect();
        slots[0] = Mutex::new(Slot {
            child: Some(first),
            generation: 0,
        });
        Ok(Self {
            launch,
            describe,
            slots,
            next_slot: AtomicUsize::new(0),
            next_episode: AtomicU64::new(1),
            health: Mutex::default(),
            tolerance: Tolerance {
                max_failures: tolerance.max_failures.max(1),
                max_rate: tolerance.max_rate.clamp(0.0, 1.0),
                window: tolerance.window.max(1),
            },
            failed_episodes: AtomicU64::new(0),
        })
    }

    /// What the first child said it is.
    pub fn describe(&self) -> &Describe {
        &self.describe
    }

    /// The fault that ended the pool, if any.
    pub fn fault(&self) -> Option<String> {
        lock(&self.health).fault.clone()
    }

    /// Failed calls so far.
    pub fn failed_calls(&self) -> u64 {
        lock(&self.health).failed_calls
    }

    /// The failure counts so far.
    pub fn health(&self) -> rlany_contract::EnvHealth {
        let h = lock(&self.health);
        rlany_contract::EnvHealth {
            failed_calls: h.failed_calls,
            timeouts: h.timeouts,
            restarts: h.restarts,
            failed_episodes: self.failed_episodes.load(Ordering::Relaxed),
        }
    }

    /// Counts an episode the environment ended (a failed call ended it).
    pub fn episode_failed(&self) {
        self.failed_episodes.fetch_add(1, Ordering::Relaxed);
    }

    /// The slot for a new episode (round robin) and the episode's id.
    pub fn assign(&self) -> (usize, u64) {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        (slot, self.next_episode.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, result: Result<(), &ProcessError>) {
        let t = self.tolerance;
        let mut h = lock(&self.health);
        h.recent.push_back(result.is_err());
        while h.recent.len() > t.window {
            h.recent.pop_front();
        }
        let Err(e) = result else {
            h.consecutive = 0;
            return;
        };
        h.consecutive += 1;
        h.failed_calls += 1;
        if matches!(e.failure, Failure::Timeout { .. }) {
            h.timeouts += 1;
        }
        if h.fault.is_some() {
            return;
        }
        let failed = h.recent.iter().filter(|f| **f).count();
        if h.consecutive >= t.max_failures {
            h.fault = Some(format!(
                "{e} ({} failed call{} since the last good step, environment.max_failures is {}: \
                 the run stops)",
                h.consecutive,
                if h.consecutive == 1 { "" } else { "s" },
                t.max_failures
            ));
        } else if h.recent.len() == t.window && failed as f64 > t.max_rate * t.window as f64 {
            h.fault = Some(format!(
                "{e} ({failed} of the last {} calls failed ({} in all), above \
                 environment.max_failure_rate {}: the run stops)",
                t.window, h.failed_calls, t.max_rate
            ));
        }
    }

    /// One request on `slot`'s child: `generation` names the child an episode was started
    /// on (`None`: any, starting one if needed). Returns the reply and the child's
    /// generation.
    pub fn call(
        &self,
        slot: usize,
        generation: Option<u64>,
        op: &str,
        body: Map<String, Value>,
    ) -> Result<(Map<String, Value>, u64), CallFailed> {
        let sent = self.submit(slot, generation, op, body)?;
        Ok((self.collect(slot, sent, op)?, sent.generation))
    }

    /// Sends a request on `slot`'s child (see [`Self::call`]) without waiting for its reply:
    /// requests to several children are then in flight at once. [`Self::collect`] waits.
    pub fn submit(
        &self,
        slot: usize,
        generation: Option<u64>,
        op: &str,
        body: Map<String, Value>,
    ) -> Result<Sent, CallFailed> {
        if let Some(f) = self.fault() {
            return Err(CallFailed(f));
        }
        let mut s = lock(&self.slots[slot % self.slots.len()]);
        if generation.is_some_and(|g| g != s.generation)
            || (generation.is_some() && s.child.is_none())
        {
            return Err(CallFailed(
                "its environment process failed and was replaced".into(),
            ));
        }
        if s.child.is_none() {
            match self.launch.start() {
                Ok((child, d)) if d.dims == self.describe.dims => {
                    // A slot whose child was lost has a generation above 0.
                    if s.generation > 0 {
                        lock(&self.health).restarts += 1;
                    }
                    s.child = Some(child);
                }
                Ok((mut child, d)) => {
                    child.kill();
                    let e = ProcessError {
                        command: self.launch.command.join(" "),
                        failure: Failure::Garbage {
                            op: "hello".into(),
                            why: "a restarted child describes other dimensions than the first"
                                .into(),
                            excerpt: format!("{:?}", d.dims),
                        },
                        stderr: String::new(),
                    };
                    self.record(Err(&e));
                    return Err(CallFailed(e.to_string()));
                }
                Err(e) => {
                    self.record(Err(&e));
                    return Err(CallFailed(e.to_string()));
                }
            }
        }
        let generation = s.generation;
        let Some(child) = s.child.as_mut() else {
            return Err(CallFailed("no child".into()));
        };
        match child.send(op, body) {
            Ok(seq) => Ok(Sent { seq, generation }),
            Err(e) => Err(self.failed(&mut s, e)),
        }
    }

    /// The reply to a request [`Self::submit`] sent.
    pub fn collect(
        &self,
        slot: usize,
        sent: Sent,
        op: &str,
    ) -> Result<Map<String, Value>, CallFailed> {
        let mut s = lock(&self.slots[slot % self.slots.len()]);
        if s.generation != sent.generation {
            return Err(CallFailed(
                "its environment process failed and was replaced".into(),
            ));
        }
        let Some(child) = s.child.as_mut() else {
            return Err(CallFailed("no child".into()));
        };
        match child.receive(op, sent.seq) {
            Ok(reply) => {
                // Only a step resets the count: a child that starts and resets but dies at
                // every step must still fault.
                if op == "step" {
                    self.record(Ok(()));
                }
                Ok(reply)
            }
            Err(e) => Err(self.failed(&mut s, e)),
        }
    }

    /// Records a failed call; unless it was an `error` reply the child is gone.
    fn failed(&self, s: &mut Slot, e: ProcessError) -> CallFailed {
        if !matches!(e.failure, Failure::Refused { .. }) {
            s.child = None;
            s.generation += 1;
        }
        self.record(Err(&e));
        CallFailed(e.to_string())
    }

    /// A reply that broke the protocol after it was read: the child is killed and replaced,
    /// and the failure counts.
    pub fn bad_reply(&self, slot: usize, generation: u64, op: &str, why: String) -> CallFailed {
        let mut s = lock(&self.slots[slot % self.slots.len()]);
        if s.generation == generation {
            if let Some(mut c) = s.child.take() {
                c.kill();
            }
            s.generation += 1;
        }
        let e = ProcessError {
            command: self.launch.command.join(" "),
            failure: Failure::Garbage {
                op: op.into(),
                why,
                excerpt: String::new(),
            },
            stderr: String::new(),
        };
        self.record(Err(&e));
        CallFailed(e.to_string())
    }

    /// Tells `slot`'s child that an episode is over, without waiting for the reply; the
    /// reply to its `unanswered` request, if any, is dropped when it arrives.
    pub fn close(&self, slot: usize, generation: u64, episode: u64, unanswered: Option<Sent>) {
        let mut s = lock(&self.slots[slot % self.slots.len()]);
        if s.generation != generation {
            return;
        }
        if let Some(child) = s.child.as_mut() {
            if let Some(sent) = unanswered.filter(|u| u.generation == generation) {
                child.forget(sent.seq);
            }
            let mut body = Map::new();
            body.insert("episode".into(), episode.into());
            if child.send_ignored("close", body).is_err() {
                s.child = None;
                s.generation += 1;
            }
        }
    }
}
