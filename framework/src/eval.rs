//! Evaluation: greedy (temperature 0) rollouts on a fixed set of held-out tasks of the
//! training distribution (`Split::Eval`) and of the out-of-distribution split. The task sets
//! are drawn from streams derived from the run's seed, so every evaluation of a run (and of a
//! resumed run) sees the same tasks.

use crate::advantage::accuracy;
use crate::env::{Environment, Split};
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::rng::Rng;
use crate::rollout::{Trajectory, rollout};
use burn::prelude::Backend;

/// Accuracy and trajectories of one evaluation split.
#[derive(Debug, Clone)]
pub struct EvalResult {
    /// Fraction of tasks solved.
    pub accuracy: f64,
    /// Fraction of policy steps the oracle labels correct.
    pub step_accuracy: f64,
    /// The played-out tasks.
    pub trajectories: Vec<Trajectory>,
}

/// What one evaluation plays.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalSpec<'a> {
    /// Which split.
    pub split: Split,
    /// The difficulty of its tasks.
    pub difficulty: &'a [f64],
    /// How many tasks.
    pub tasks: usize,
    /// The run's seed (the task set derives from it).
    pub seed: u64,
    /// Most tokens per step.
    pub max_step_tokens: usize,
    /// Most steps per episode.
    pub max_env_steps: usize,
}

/// Plays `spec.tasks` tasks of `spec.split` greedily.
pub fn evaluate<B: Backend, M: CausalLm<B>>(
    model: &M,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    spec: &EvalSpec<'_>,
) -> EvalResult {
    let EvalSpec {
        split,
        difficulty: d,
        tasks: n,
        seed,
        max_step_tokens,
        max_env_steps,
    } = *spec;
    let mut task_rng = Rng::derive(
        seed,
        if split == Split::Ood {
            "eval-ood"
        } else {
            "eval-id"
        },
    );
    let episodes = (0..n)
        .map(|i| (i, env.sample(d, split, &mut task_rng)))
        .collect();
    let params = SampleParams {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: max_step_tokens,
        stop_tokens: vec![tok.step_delimiter(), tok.eos()],
    };
    // Greedy decoding draws no random numbers; the stream is only a formality.
    let mut rng = Rng::derive(seed, "eval-sampling");
    let trajectories = rollout(model, tok, episodes, &params, max_env_steps, &mut rng);
    let outcomes: Vec<bool> = trajectories.iter().map(|t| t.outcome).collect();
    let labels: Vec<bool> = trajectories
        .iter()
        .flat_map(|t| t.steps.iter().map(|s| s.oracle))
        .collect();
    EvalResult {
        accuracy: accuracy(&outcomes),
        step_accuracy: accuracy(&labels),
        trajectories,
    }
}
