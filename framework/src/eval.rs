//! Evaluation: greedy (temperature 0) rollouts on a fixed set of held-out tasks of the
//! training distribution (`Split::Eval`) and of the out-of-distribution split. The tasks are
//! spread evenly over the environment's eval grid ([`crate::Environment::eval_levels`]: task
//! `i` at level `levels[i mod L]` on every dimension), so the in-domain accuracy covers the
//! whole training range, not only where the task slots start. The task seeds come from
//! streams derived from the run's seed, so every evaluation of a run (and of a resumed run,
//! and of every row of an ablation) sees the same tasks.

use crate::advantage::accuracy;
use crate::env::{Environment, Split};
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::placement::{Placement, PlacementError};
use crate::rng::Rng;
use crate::rollout::{Trajectory, rollout_sharded};
use burn::prelude::Backend;

/// Accuracy and trajectories of one evaluation split.
#[derive(Debug, Clone)]
pub struct EvalResult {
    /// Fraction of tasks solved.
    pub accuracy: f64,
    /// Fraction of policy steps the oracle labels correct.
    pub step_accuracy: f64,
    /// `(level, accuracy of its tasks)` per grid level.
    pub by_level: Vec<(f64, f64)>,
    /// The played-out tasks.
    pub trajectories: Vec<Trajectory>,
}

/// What one evaluation plays.
#[derive(Debug, Clone)]
pub struct EvalSpec<'a> {
    /// Which split.
    pub split: Split,
    /// The grid levels the tasks are spread over.
    pub levels: &'a [f64],
    /// Dimensions of the difficulty space.
    pub dims: usize,
    /// How many tasks.
    pub tasks: usize,
    /// The run's seed (the task set derives from it).
    pub seed: u64,
    /// Most tokens per step.
    pub max_step_tokens: usize,
    /// Most steps per episode.
    pub max_env_steps: usize,
    /// Choose tokens on the device ([`SampleParams::on_device`]).
    pub on_device: bool,
    /// Data-parallel shards: the tasks are played in this many groups, a thread each.
    pub shards: usize,
    /// Which peers play them.
    pub placement: &'a Placement,
}

/// Plays `spec.tasks` tasks of `spec.split` greedily.
pub fn evaluate<B: Backend, M: CausalLm<B>>(
    model: &M,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    spec: &EvalSpec<'_>,
) -> Result<EvalResult, PlacementError> {
    let EvalSpec {
        split,
        levels,
        dims,
        tasks: n,
        seed,
        max_step_tokens,
        max_env_steps,
        on_device,
        shards,
        placement,
    } = *spec;
    let mut task_rng = Rng::derive(
        seed,
        if split == Split::Ood {
            "eval-ood"
        } else {
            "eval-id"
        },
    );
    let level = |i: usize| levels.get(i % levels.len().max(1)).copied().unwrap_or(0.5);
    let tasks: Vec<_> = (0..n)
        .map(|i| (vec![level(i); dims], split, task_rng.next_u64()))
        .collect();
    let episodes = (0..n).zip(env.sample_many(&tasks)).collect();
    let params = SampleParams {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: max_step_tokens,
        stop_tokens: tok.prompt_format().stop_tokens(tok),
        on_device,
    };
    // Greedy decoding draws no random numbers; the stream is only a formality.
    let mut rng = Rng::derive(seed, "eval-sampling");
    let trajectories = rollout_sharded(
        model,
        tok,
        episodes,
        &params,
        max_env_steps,
        &mut rng,
        shards,
        placement,
    )?;
    let outcomes: Vec<bool> = trajectories.iter().map(|t| t.outcome).collect();
    let labels: Vec<bool> = trajectories
        .iter()
        .flat_map(|t| t.steps.iter().map(|s| s.oracle))
        .collect();
    let by_level = (0..levels.len().min(n))
        .map(|l| {
            let solved: Vec<bool> = (l..n).step_by(levels.len()).map(|i| outcomes[i]).collect();
            (levels[l], accuracy(&solved))
        })
        .collect();
    Ok(EvalResult {
        by_level,
        accuracy: accuracy(&outcomes),
        step_accuracy: accuracy(&labels),
        trajectories,
    })
}
