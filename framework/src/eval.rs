//! Evaluation: greedy (temperature 0) rollouts on a fixed set of held-out tasks of the
//! training distribution (`Split::Eval`) and of the out-of-distribution split (and, where a
//! run asks for it, the policy sampled at its training temperature on the starting
//! difficulty's tasks, `budget.eval_start_sampled_tasks`: [`EvalSampling`]). The tasks are
//! spread evenly over the environment's eval grid ([`crate::Environment::eval_levels`]: task
//! `i` at level `levels[i mod L]` on every dimension), so the in-domain accuracy covers the
//! whole training range, not only where the task slots start (a run may add a third
//! evaluation at the slots' starting difficulty, `budget.eval_start_tasks`). The task seeds come from
//! streams derived from the run's seed, so every evaluation of a run (and of a resumed run,
//! and of every row of an ablation) sees the same tasks.

use crate::advantage::accuracy;
use crate::env::{Difficulty, Environment, Split};
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::placement::PlacementError;
use crate::rng::Rng;
use crate::rollout::{Trajectory, rollout_sharded};
use crate::shard::Spread;
use burn::prelude::Backend;

/// Accuracy and trajectories of one evaluation split.
#[derive(Debug, Clone)]
pub struct EvalResult {
    /// Fraction of tasks solved.
    pub accuracy: f64,
    /// Fraction of policy steps the oracle labels correct.
    pub step_accuracy: f64,
    /// The accuracy of each difficulty point's tasks, in [`EvalSpec::points`] order.
    pub by_point: Vec<f64>,
    /// The played-out tasks.
    pub trajectories: Vec<Trajectory>,
}

/// What one evaluation plays.
#[derive(Debug, Clone)]
pub struct EvalSpec<'a> {
    /// Which split.
    pub split: Split,
    /// The difficulty points the tasks are spread over (task `i` at `points[i mod len]`):
    /// the eval grid ([`grid`]), or the one difficulty the task slots start at.
    pub points: &'a [Difficulty],
    /// Names the stream the task seeds derive from: evaluations with the same split and
    /// stream play the same tasks.
    pub stream: &'static str,
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
    /// Where the tasks are played: in `shards` groups, a thread each, over the peers.
    pub spread: &'a Spread,
    /// Sampled instead of greedy (`None`: greedy).
    pub sampling: Option<EvalSampling>,
}

/// A sampled evaluation: the policy's own sampling settings and the seed of its draws (a
/// stream of its own, so that it disturbs no other evaluation or training stream).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalSampling {
    /// Sampling temperature (the training temperature).
    pub temperature: f64,
    /// Nucleus mass.
    pub top_p: f64,
    /// Seeds the draws ([`Rng::new`]).
    pub draws: u64,
}

/// The eval grid's points: each level on every one of `dims` dimensions (0.5 everywhere
/// when the environment names no level).
pub fn grid(levels: &[f64], dims: usize) -> Vec<Difficulty> {
    if levels.is_empty() {
        return vec![vec![0.5; dims]];
    }
    levels.iter().map(|&l| vec![l; dims]).collect()
}

/// The task-seed stream of the grid evaluation of `split`.
pub fn grid_stream(split: Split) -> &'static str {
    if split == Split::Ood {
        "eval-ood"
    } else {
        "eval-id"
    }
}

/// Plays `spec.tasks` tasks of `spec.split`, greedily unless `spec.sampling` says otherwise.
pub fn evaluate<B: Backend, M: CausalLm<B>>(
    model: &M,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    spec: &EvalSpec<'_>,
) -> Result<EvalResult, PlacementError> {
    let EvalSpec {
        split,
        points,
        stream,
        tasks: n,
        seed,
        max_step_tokens,
        max_env_steps,
        on_device,
        spread,
        sampling,
    } = *spec;
    let mut task_rng = Rng::derive(seed, stream);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            (
                points[i % points.len().max(1)].clone(),
                split,
                task_rng.next_u64(),
            )
        })
        .collect();
    let episodes = (0..n).zip(env.sample_many(&tasks)).collect();
    let (temperature, top_p) = sampling.map_or((0.0, 1.0), |s| (s.temperature, s.top_p));
    let params = SampleParams {
        temperature,
        top_p,
        max_new_tokens: max_step_tokens,
        stop_tokens: tok.prompt_format().stop_tokens(tok),
        on_device,
    };
    // Greedy decoding draws no random numbers: its stream is only a formality.
    let mut rng = match sampling {
        Some(s) => Rng::new(s.draws),
        None => Rng::derive(seed, "eval-sampling"),
    };
    let trajectories = rollout_sharded(
        model,
        tok,
        episodes,
        &params,
        max_env_steps,
        &mut rng,
        spread,
    )?;
    let outcomes: Vec<bool> = trajectories.iter().map(|t| t.outcome).collect();
    let labels: Vec<bool> = trajectories
        .iter()
        .flat_map(|t| t.steps.iter().map(|s| s.oracle))
        .collect();
    let by_point = (0..points.len().min(n))
        .map(|l| {
            let solved: Vec<bool> = (l..n).step_by(points.len()).map(|i| outcomes[i]).collect();
            accuracy(&solved)
        })
        .collect();
    Ok(EvalResult {
        by_point,
        accuracy: accuracy(&outcomes),
        step_accuracy: accuracy(&labels),
        trajectories,
    })
}
