//! The conformance checks `rlany env` runs against a process environment before it shows a
//! task: what a child must do for the loop to train on it (PROTOCOL.md, "Conformance").
//!
//! 1. `hello`: it starts and describes a valid difficulty space (protocol 1).
//! 2. `unknown op`: a request it does not know gets an `error` reply, and it keeps answering.
//!
//! Then the checks every environment passes, compiled in or not ([`crate::conformance`]):
//! `space`, `deterministic`, `expert solves`, `step answers`, `any action`, `splits`; a call
//! that fails there (a crash, a bad reply) fails its check with the reason.
//!
//! Each check names what it saw; the first failure of a check is its detail.

use super::child::{Child, Failure};
use super::{ProcessEnv, ProcessEpisode, ProcessSpec};
use crate::conformance::{self, Check, Subject};
use rlany_contract::{Environment, Split, StepResult};
use serde_json::Map;

/// The checks' view of a process environment: every call can fail, with its reason.
impl Subject for ProcessEnv {
    type Episode = ProcessEpisode;
    const LABELS: bool = false;
    fn env(&self) -> &dyn Environment {
        self
    }
    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Result<ProcessEpisode, String> {
        self.try_sample(d, split, seed)
    }
    fn step(&self, ep: &mut ProcessEpisode, action: &str) -> Result<StepResult, String> {
        ep.try_step(action)
    }
    fn demonstration(
        &self,
        d: &[f64],
        noise: f64,
        seed: u64,
    ) -> Result<(String, Vec<String>), String> {
        self.try_demonstration(d, noise, seed)
    }
}

/// Runs every check on `spec`'s command; stops after `hello` when that fails.
pub fn run(spec: &ProcessSpec) -> Vec<Check> {
    // Every check reports its own failure: the environment never faults here.
    let spec = &ProcessSpec {
        max_failures: usize::MAX,
        max_failure_rate: 1.0,
        ..spec.clone()
    };
    let env = match spec.try_build() {
        Ok(env) => env,
        Err(e) => return vec![Check::new("hello", Err(e.to_string()))],
    };
    let dims = env.difficulty_space();
    let (name, version) = env.name().unwrap_or_default();
    let mut out = vec![Check::new(
        "hello",
        Ok(format!(
            "`{name}`{}, {} dims",
            version.map(|v| format!(" version {v}")).unwrap_or_default(),
            dims.len(),
        )),
    )];
    out.push(Check::new("unknown op", unknown_op(spec)));
    out.extend(conformance::run(&env));
    out
}

fn unknown_op(spec: &ProcessSpec) -> Result<String, String> {
    let launch = spec.launch();
    let (mut child, _) = launch.start().map_err(|e| e.to_string())?;
    match child.call("no-such-op", Map::new()) {
        Err(e) if matches!(e.failure, Failure::Refused { .. }) => {}
        Err(e) => return Err(e.to_string()),
        Ok(r) => return Err(format!("answered with {r:?}, not an `error` reply")),
    }
    let mut hello = Map::new();
    hello.insert("protocol".into(), super::child::PROTOCOL.into());
    check_alive(&mut child, hello)
}

fn check_alive(child: &mut Child, hello: Map<String, serde_json::Value>) -> Result<String, String> {
    child
        .call("hello", hello)
        .map(|_| "answered `error` and kept answering".into())
        .map_err(|e| format!("after the error reply: {e}"))
}
