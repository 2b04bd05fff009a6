//! The conformance checks `rlany env` runs against a process environment before it shows a
//! task: what a child must do for the loop to train on it (PROTOCOL.md, "Conformance").
//!
//! 1. `hello`: it starts and describes a valid difficulty space (protocol 1).
//! 2. `unknown op`: a request it does not know gets an `error` reply, and it keeps answering.
//! 3. `deterministic`: the same `(difficulty, split, seed)` twice gives the same prompt, key,
//!    and — playing the expert's actions — the same observations and labels.
//! 4. `expert solves`: the expert (noise 0) solves its task at every eval-grid level, for
//!    a few seeds.
//! 5. `any action`: an empty action, 500 characters of junk and non-ASCII text get valid
//!    replies (wasted steps, not errors).
//! 6. `splits`: the `ood` split gives other tasks than `train` for the same seeds, and
//!    `eval` other tasks than `train`.
//!
//! Each check names what it saw; the first failure of a check is its detail.

use super::child::{Child, Failure};
use super::{ProcessEnv, ProcessSpec};
use rlany_framework::{Environment, Episode, Split};
use serde_json::Map;

/// Seeds each check samples.
pub const SEEDS: [u64; 3] = [1, 2, 3];

/// One check's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// The check's name.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

fn check(name: &'static str, result: Result<String, String>) -> Check {
    match result {
        Ok(detail) => Check {
            name,
            ok: true,
            detail,
        },
        Err(detail) => Check {
            name,
            ok: false,
            detail,
        },
    }
}

/// One played episode: prompt, key, and per step (observation, label); whether it was won.
type Played = (String, String, Vec<(String, bool)>, bool);

fn play(
    env: &ProcessEnv,
    d: &[f64],
    split: Split,
    seed: u64,
    actions: &[String],
) -> Result<Played, String> {
    let mut ep = env.try_sample(d, split, seed)?;
    let mut steps = Vec::new();
    for (i, a) in actions.iter().enumerate() {
        if ep.done() {
            break;
        }
        let r = ep.try_step(a)?;
        steps.push((r.observation, ep.oracle_label(i)));
    }
    Ok((ep.prompt(), ep.task_key(), steps, ep.outcome()))
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
        Err(e) => return vec![check("hello", Err(e.to_string()))],
    };
    let dims = env.difficulty_space();
    let levels = env.eval_levels();
    let (name, version) = env.name().unwrap_or_default();
    let mut out = vec![check(
        "hello",
        Ok(format!(
            "`{name}`{}, {} dims ({}), eval grid {levels:?}",
            version.map(|v| format!(" version {v}")).unwrap_or_default(),
            dims.len(),
            dims.iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    )];
    out.push(check("unknown op", unknown_op(spec)));
    let grid = |level: f64| vec![level; dims.len()];
    out.push(check(
        "deterministic",
        (|| {
            for &level in &[levels[0], levels[levels.len() - 1]] {
                for split in [Split::Train, Split::Ood] {
                    let seed = SEEDS[0];
                    let (_, actions) = env.try_demonstration(&grid(level), 0.0, seed)?;
                    let a = play(&env, &grid(level), split, seed, &actions)?;
                    let b = play(&env, &grid(level), split, seed, &actions)?;
                    if a != b {
                        return Err(format!(
                            "level {level}, {split:?}, seed {seed}: two resets differ:\n{a:?}\n{b:?}"
                        ));
                    }
                }
            }
            Ok("the same task twice gives the same prompt, observations and labels".into())
        })(),
    ));
    out.push(check(
        "expert solves",
        (|| {
            let (mut solved, mut n, mut steps) = (0, 0, 0);
            let mut first_fail = None;
            for &level in &levels {
                for seed in SEEDS {
                    let (_, actions) = env.try_demonstration(&grid(level), 0.0, seed)?;
                    let p = play(&env, &grid(level), Split::Train, seed, &actions)?;
                    n += 1;
                    steps += p.2.len();
                    if p.3 {
                        solved += 1;
                    } else if first_fail.is_none() {
                        first_fail = Some(format!("level {level}, seed {seed}: {actions:?}"));
                    }
                }
            }
            match first_fail {
                None => Ok(format!(
                    "{solved} of {n} tasks, {:.1} steps on average",
                    steps as f64 / n as f64
                )),
                Some(f) => Err(format!("{solved} of {n} tasks; the first unsolved: {f}")),
            }
        })(),
    ));
    out.push(check(
        "any action",
        (|| {
            let junk = [
                "".to_string(),
                "#".repeat(500),
                "é ☃ \u{7f} \"quoted\" \\".to_string(),
            ];
            let mut ep = env.try_sample(&grid(levels[0]), Split::Train, SEEDS[0])?;
            for a in &junk {
                if ep.done() {
                    break;
                }
                ep.try_step(a)
                    .map_err(|e| format!("action {:.20?}: {e}", a))?;
            }
            Ok("an empty, a 500-character and a non-ASCII action were answered".into())
        })(),
    ));
    out.push(check(
        "splits",
        (|| {
            let mut differ = [0; 2];
            let level = levels[levels.len() / 2];
            for seed in SEEDS {
                let key = |s| env.try_sample(&grid(level), s, seed).map(|e| e.task_key());
                let train = key(Split::Train)?;
                differ[0] += usize::from(key(Split::Eval)? != train);
                differ[1] += usize::from(key(Split::Ood)? != train);
            }
            if differ.contains(&0) {
                Err(format!(
                    "for seeds {SEEDS:?}, eval differs from train {} times, ood {} times",
                    differ[0], differ[1]
                ))
            } else {
                Ok(format!(
                    "eval differs from train on {} of {n} seeds, ood on {} of {n}",
                    differ[0],
                    differ[1],
                    n = SEEDS.len()
                ))
            }
        })(),
    ));
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
