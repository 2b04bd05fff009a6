//! The closed loop (framework/METHOD.md, "One training step"), as a sequence of phases over
//! one [`StepBatch`]:
//!
//! 1. **Tasks** — every task slot draws a fresh task at its difficulty; a slot with a pending
//!    proposal also draws one at the proposed difficulty.
//! 2. **Rollout** — the policy plays each task `group_size` times, one step (line) at a time.
//! 3. **Outcome and gate** — the verifier scores every trajectory; group accuracy per task;
//!    pending proposals are accepted or rejected (rejected groups are dropped unused).
//! 4. **Judging** — the judge gives `m` verdicts per step.
//! 5. **Rewards and advantages** — integrated reward `R = O + (λ/m)ΣS` per step, z-scored per
//!    task group and step index (policy band); consistency reward `R·S` per verdict, z-scored
//!    over the `m` verdicts (judge band).
//! 6. **Updates** — PPO-clip + KL for the policy, then for the judge (if it learns).
//! 7. **Proposals** — slots that are too easy or too hard get a proposal for the next step.
//! 8. **Bookkeeping** — metrics, periodic greedy evaluation (in-domain, OOD, judge quality),
//!    atomic checkpoints from which a resumed run continues exactly.
//!
//! Before step 1 the policy (then the judge) is warm-started and everything is evaluated
//! (step 0) — or, on resume, everything is restored from the latest checkpoint. The pure
//! phases live in [`crate::step`]; the ones that run a model are methods of `Run` here.

use crate::adapt::{AdaptCounts, AdaptSlot, Critic, GateSpec, Proposer};
use crate::checkpoint::{self, CheckpointError};
use crate::env::{Difficulty, Environment, Split};
use crate::eval::{EvalSampling, EvalSpec, evaluate};
use crate::experiment::{
    Budget, Experiment, JudgeSpec, KlTarget, LabelSource, PpoSpec, RewardSpec, Sampling, WarmStart,
};
use crate::judge::{self, Voting};
use crate::judge_fit;
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::optimise::StepError;
use crate::placement::{Placement, PlacementError, checksum};
use crate::plugin::{AdaptationChoice, EnvironmentChoice};
use crate::ppo::{Sample, UpdateParams, UpdateStats, ppo_update};
use crate::progress;
use crate::rng::Rng;
use crate::rollout::rollout_sharded;
use crate::rundir::{Metrics, RunDir, RunDirError};
use crate::shard::Spread;
use crate::step::{self, StepBatch};
use crate::synthetic_judge::SyntheticJudge;
use crate::warmcache::{self, WarmCache};
use crate::warmstart::{SftOptions, warm_start};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig};
use rlany_kernels::{AutodiffLogProbOps, KernelChoice};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

mod checkpoint_eval;
mod evaluation;
mod learnability;
mod learner;
#[cfg(test)]
mod tests;
mod warm;

pub use checkpoint_eval::{CheckpointEval, EvalOptions, evaluate_checkpoint};
pub use learnability::{CellResult, LearnCell, judge_learnability};
use learner::{Learner, Role};

/// Why a run stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Run-directory I/O.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// Checkpoint I/O.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A loss or gradient became NaN or infinite.
    #[error(
        "training step {step}: the {what} is not finite; the run stopped and its last checkpoint is intact"
    )]
    NonFinite {
        /// The training step (0 = warm start).
        step: usize,
        /// Which quantity.
        what: String,
    },
    /// The proposer's checkpointed state could not be restored.
    #[error("restoring the {0}")]
    Adapt(#[from] crate::adapt::AdaptError),
    /// The peers of a spread run could not exchange their shards' results, or diverged.
    #[error("{0}; the run stopped and its last checkpoint is intact")]
    Placement(PlacementError),
    /// The environment gave up ([`crate::Environment::fault`]).
    #[error(
        "training step {step}: the environment failed; the run stopped {}: {message}",
        if *checkpointed {
            "and its last checkpoint is intact (fix the environment, then resume)"
        } else {
            "before its first checkpoint (fix the environment, then run it again)"
        }
    )]
    Environment {
        /// The training step (0 = warm start).
        step: usize,
        /// The environment's message.
        message: String,
        /// Whether the run has a checkpoint to resume from.
        checkpointed: bool,
    },
    /// The warm-started judge is outside its gate (`judge.gate`).
    #[error(
        "the warm-started judge fails its gate: {metric} is {} at step 0, the gate is [{min}, {max}]; the run stopped before its first training step (its step-0 metrics are logged)",
        value.map_or_else(|| "not measured".to_string(), |v| format!("{v:.4}"))
    )]
    JudgeGate {
        /// The metric read.
        metric: String,
        /// Its value (`None`: the evaluation did not measure it, e.g. no step of that kind).
        value: Option<f64>,
        /// Lowest accepted.
        min: f64,
        /// Highest accepted.
        max: f64,
    },
}

impl From<PlacementError> for TrainError {
    fn from(e: PlacementError) -> Self {
        Self::Placement(e)
    }
}

/// `Err` when the environment reports a fault ([`crate::Environment::fault`]).
///
/// Before the step-0 checkpoint (the warm starts and their evaluation) there is nothing to
/// resume from; a resumed run, and every later step, has a checkpoint.
fn env_ok(env: &dyn crate::Environment, step: usize) -> Result<(), TrainError> {
    match env.fault() {
        Some(message) => Err(TrainError::Environment {
            step,
            message,
            checkpointed: step > 0,
        }),
        None => Ok(()),
    }
}

/// How an optimiser step's error stops training step `step` of `who`.
fn non_finite(step: usize, who: &str) -> impl FnOnce(StepError) -> TrainError + '_ {
    move |e| match e {
        StepError::NonFinite(what) => TrainError::NonFinite {
            step,
            what: format!("{who} {what}"),
        },
        StepError::Placement(e) => TrainError::Placement(e),
    }
}

/// How one run is driven.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// `runs/<name>/seed-<n>/`.
    pub run_dir: PathBuf,
    /// Continue the run in `run_dir` from its latest checkpoint.
    pub resume: bool,
    /// Stop (as if killed) right after this step, without a final checkpoint; for tests
    /// and for splitting long runs.
    pub stop_after: Option<usize>,
    /// Draw progress bars.
    pub progress: bool,
    /// Print one plain line per step to stderr.
    pub log_lines: bool,
    /// Written to `meta.json` of a fresh run.
    pub meta: serde_json::Value,
    /// Share warm starts through this cache folder (see [`crate::warmcache`]).
    pub warm_cache: Option<PathBuf>,
    /// Resume from this checkpoint (e.g. `step-000010`) instead of the latest.
    pub checkpoint: Option<String>,
    /// Told about every completed step (e.g. a suite's progress display).
    pub observer: Option<StepObserver>,
    /// Which peers compute the shards (alone by default). Every peer runs the same loop on its
    /// own replica; peer 0 alone writes the run directory, and the warm-start cache is not
    /// used.
    pub placement: Placement,
}

/// A callback `(step, total steps)` after every completed training step (step 0 = the warm
/// start and its evaluation).
#[derive(Clone)]
pub struct StepObserver(pub std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>);

impl std::fmt::Debug for StepObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StepObserver")
    }
}

/// The concrete components an experiment pairs, built by the composition root.
pub struct Components<'a, M> {
    /// The environment plugin.
    pub env: &'a dyn Environment,
    /// The tokenizer shared by policy and judge.
    pub tok: &'a dyn Tokenizer,
    /// A freshly initialised policy (replaced by the checkpoint's weights on resume).
    pub policy: M,
    /// A freshly initialised judge, when the experiment has one.
    pub judge: Option<M>,
    /// The difficulty proposer.
    pub proposer: Box<dyn Proposer>,
}

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    /// Last training step completed.
    pub last_step: usize,
    /// In-domain eval accuracy right after the warm start (step 0), if this invocation saw it.
    pub acc_id_start: Option<f64>,
    /// OOD eval accuracy right after the warm start.
    pub acc_ood_start: Option<f64>,
    /// Latest in-domain eval accuracy.
    pub acc_id_end: Option<f64>,
    /// Latest OOD eval accuracy.
    pub acc_ood_end: Option<f64>,
    /// Stopped by `stop_after` before the budget was spent.
    pub interrupted: bool,
    /// Warm starts taken from the cache instead of computed (policy, judge).
    pub warm_cached: usize,
    /// The environment's failed calls in this invocation (one in another process).
    pub env_failed_calls: u64,
    /// Episodes the environment ended in this invocation (scored unsolved).
    pub env_failed_episodes: u64,
}

/// Trains one seed of `exp` with `parts`.
pub fn train<B, M, E, A>(
    exp: &Experiment<E, A>,
    seed: u64,
    parts: Components<'_, M>,
    device: &B::Device,
    opts: &TrainOptions,
) -> Result<RunSummary, TrainError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
    E: EnvironmentChoice,
    A: AdaptationChoice,
{
    let settings = Settings::for_env(exp, parts.env);
    let mut run = if opts.resume {
        Run::resume(settings, seed, parts, device, opts)?
    } else {
        Run::warm_start(settings, seed, parts, device, opts)?
    };
    // `--stop-after 0`: the warm starts and the step-0 evaluation only (a pretrained model's
    // zero-shot accuracy, say).
    if opts.stop_after == Some(run.state.step) && run.state.step < run.cfg.budget.steps {
        run.summary.interrupted = true;
        return Ok(run.summary);
    }
    for step in run.state.step + 1..=run.cfg.budget.steps {
        let t0 = Instant::now();
        let mut batch = StepBatch::new(step);
        run.tasks_and_rollout(&mut batch)?; // phases 1–2
        run.outcome_and_gate(&mut batch); // phase 3
        run.judging(&mut batch)?; // phase 4
        run.rewards_and_advantages(&mut batch); // phase 5
        run.updates(&mut batch)?; // phase 6
        run.replicas_agree()?;
        run.proposals(&mut batch); // phase 7
        run.bookkeeping(&mut batch, t0)?; // phase 8
        if opts.stop_after == Some(step) && step < run.cfg.budget.steps {
            run.summary.interrupted = true;
            break;
        }
    }
    Ok(run.summary)
}

/// The loop-level settings of the experiment, read once.
struct Settings {
    name: String,
    resolved: String,
    warm_start: WarmStart,
    sampling: Sampling,
    judge: JudgeSpec,
    reward: RewardSpec,
    ppo: PpoSpec,
    budget: Budget,
    kernels: KernelChoice,
    /// Data-parallel shards per training batch.
    shards: usize,
    /// The environment plugin's starting difficulty of every task slot.
    start: Difficulty,
    /// When a slot may propose.
    gate: GateSpec,
    /// Where the critic feedback comes from.
    critic: Critic,
    /// Choose sampled tokens on the device (every backend but the CPU's).
    sample_on_device: bool,
    /// `(α_low, α_high)` of the adaptation rule.
    band: (f64, f64),
    /// Whether difficulty adapts at all (`Static` does not).
    adaptive: bool,
    /// The situations watched (measuring only).
    situations: Vec<crate::judge::Situation>,
    /// Every input of the policy's warm start except the seed (its cache key).
    warm_policy_inputs: serde_json::Value,
    /// Every input of the judge's warm start except the seed.
    warm_judge_inputs: serde_json::Value,
}

/// A setting as the JSON a cache key is computed from.
fn json<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

impl Settings {
    /// The settings of `exp` run on `env`. The warm-start cache keys hold what identifies
    /// the environment's code, which the experiment file does not: the identity an
    /// environment names (one in another process: its name and version), or else the
    /// fingerprint of its behaviour (`env::fingerprint`: a few demonstrations played at the
    /// starting difficulty), so a warm start made by other environment code is not reused.
    fn for_env<E: EnvironmentChoice, A: AdaptationChoice>(
        exp: &Experiment<E, A>,
        env: &dyn Environment,
    ) -> Self {
        let mut settings = Settings::of(exp);
        let (field, id) = match env.identity() {
            Some(id) => ("environment_identity", id),
            None => (
                "environment_fingerprint",
                crate::env::fingerprint(env, &exp.environment.plugin().start_difficulty()),
            ),
        };
        settings.warm_policy_inputs[field] = id.clone().into();
        settings.warm_judge_inputs["policy"][field] = id.into();
        settings
    }

    fn of<E: EnvironmentChoice, A: AdaptationChoice>(exp: &Experiment<E, A>) -> Self {
        let proposer = exp.adaptation.plugin();
        let environment = warmcache::without_fields(
            json(&exp.environment),
            exp.environment.plugin().label_only_fields(),
        );
        let mut warm_policy_inputs = serde_json::json!({
            "environment": environment,
            "model": json(&exp.policy.model),
            "warm_start": json(&exp.policy.warm_start),
            "max_grad_norm": exp.ppo().max_grad_norm,
            "kernels": json(&exp.kernels),
            "backend": json(&exp.backend),
        });
        // Shards change the warm start's float sums; one shard keeps the keys made before them.
        if exp.shards != 1 {
            warm_policy_inputs["shards"] = exp.shards.into();
        }
        let mut judge_policy = warm_policy_inputs.clone();
        judge_policy["environment"] = json(&exp.environment);
        let warm_judge_inputs = serde_json::json!({
            "policy": judge_policy,
            // The prompts' history layout only when it is not the default, so that keys made
            // before it existed stay valid (a pair serialises as a two-element list).
            "judge": exp.judge.model().map(|j| {
                let mut parts = vec![json(&j.model), json(&j.warm_start)];
                if j.history != crate::experiment::JudgeHistory::Actions {
                    parts.push(json(&j.history));
                }
                parts
            }),
            "sampling": json(&exp.policy.sampling),
            "max_env_steps": exp.budget.max_env_steps,
        });
        Self {
            warm_policy_inputs,
            warm_judge_inputs,
            name: exp.name.clone(),
            resolved: exp.to_ron(),
            warm_start: exp.policy.warm_start.clone(),
            sampling: exp.policy.sampling.clone(),
            judge: exp.judge.clone(),
            reward: exp.reward.clone(),
            ppo: exp.ppo().clone(),
            budget: exp.budget.clone(),
            kernels: exp.kernels.choice(),
            shards: exp.shards,
            start: exp.environment.plugin().start_difficulty(),
            gate: exp.gate.clone(),
            critic: exp.critic,
            sample_on_device: !exp.backend.is_cpu(),
            band: proposer.map_or((0.2, 0.8), |p| p.band()),
            adaptive: proposer.is_some(),
            situations: exp.situations.clone(),
        }
    }
}

/// Everything besides the learners that a checkpoint must hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainerState {
    step: usize,
    task_rng: Rng,
    rollout_rng: Rng,
    judge_rng: Rng,
    adapt_rng: Rng,
    slots: Vec<AdaptSlot>,
    counts: AdaptCounts,
    proposer: serde_json::Value,
    /// Cumulative compute (the `compute/*` metrics).
    #[serde(default)]
    compute: Compute,
}

/// Cumulative compute of a run: what rows that differ in compute are compared against.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Compute {
    /// Trajectories rolled out for training (pending proposals included).
    rollouts: u64,
    /// Tokens the policy generated in them.
    gen_tokens: u64,
    /// Optimiser steps of the policy's PPO updates.
    policy_steps: u64,
    /// Optimiser steps of the judge's PPO updates.
    judge_steps: u64,
    /// Steps judged (each with m verdicts).
    judged_steps: u64,
    /// Training steps in which no policy step carried an advantage (no policy gradient:
    /// every group all solved or all failed, or none in the policy band).
    #[serde(default)]
    silent_steps: u64,
}

impl TrainerState {
    fn fresh(seed: u64, slots: Vec<AdaptSlot>, proposer: &dyn Proposer) -> Self {
        Self {
            step: 0,
            task_rng: Rng::derive(seed, "tasks"),
            rollout_rng: Rng::derive(seed, "rollout"),
            judge_rng: Rng::derive(seed, "judge"),
            adapt_rng: Rng::derive(seed, "adaptation"),
            slots,
            counts: AdaptCounts::default(),
            proposer: proposer.state(),
            compute: Compute::default(),
        }
    }
}

/// A checkpoint's `state.json`: the loop's state and the learners' minibatch streams, under
/// the names they have always had (so that checkpoints written before learners resume).
#[derive(Serialize, Deserialize)]
struct SavedState<S, R> {
    #[serde(flatten)]
    state: S,
    policy_mb_rng: R,
    judge_mb_rng: R,
}

type Optim<B, M> = OptimizerAdaptor<AdamW, M, B>;

/// The run context: settings, components, learners, streams and the run directory.
struct Run<'a, B: AutodiffLogProbOps, M: AutodiffModule<B>> {
    cfg: Settings,
    seed: u64,
    env: &'a dyn Environment,
    tok: &'a dyn Tokenizer,
    proposer: Box<dyn Proposer>,
    device: &'a B::Device,
    opts: &'a TrainOptions,
    dir: RunDir,
    policy: Learner<B, M>,
    /// The judge model, when the experiment has one (a frozen judge is never updated).
    judge: Option<Learner<B, M>>,
    /// The calibrated synthetic judge (`judge: Oracle`), which votes instead of a model.
    synthetic: Option<SyntheticJudge>,
    /// The fixed, balanced pool of labelled steps the judge is measured on.
    judge_pool: Vec<judge::PoolStep>,
    state: TrainerState,
    /// Rollout sampling (one step = one line).
    params: SampleParams,
    summary: RunSummary,
    /// The environment's failure counts when the last metrics line was written.
    env_seen: crate::env::EnvHealth,
    /// Names of the environment's difficulty dimensions.
    dims: Vec<String>,
    /// Where every phase's work runs (the experiment's shards over the run's placement).
    spread: Spread,
}

impl<'a, B, M> Run<'a, B, M>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The context of a run whose policy is `parts.policy` (the judge is set by the caller).
    fn new(
        cfg: Settings,
        seed: u64,
        parts: Components<'a, M>,
        device: &'a B::Device,
        opts: &'a TrainOptions,
        dir: RunDir,
    ) -> Self {
        let Components {
            env,
            tok,
            policy,
            judge: _,
            proposer,
        } = parts;
        let params = SampleParams {
            temperature: cfg.sampling.temperature,
            top_p: cfg.sampling.top_p,
            max_new_tokens: cfg.sampling.max_step_tokens,
            stop_tokens: tok.prompt_format().stop_tokens(tok),
            on_device: cfg.sample_on_device,
        };
        let slots = vec![AdaptSlot::new(cfg.start.clone()); cfg.budget.tasks_per_step];
        let dims = env.difficulty_space().into_iter().map(|d| d.name).collect();
        let state = TrainerState::fresh(seed, slots, proposer.as_ref());
        let synthetic = cfg.judge.oracle().map(|o| {
            SyntheticJudge::new(o.p_pos, o.p_neg, cfg.reward.votes).with_kinds(&o.by_kind)
        });
        Self {
            seed,
            env,
            tok,
            proposer,
            device,
            opts,
            dir,
            policy: Learner::new(Role::Policy, policy, &cfg, seed),
            judge: None,
            synthetic,
            judge_pool: Vec::new(),
            state,
            params,
            summary: RunSummary::default(),
            env_seen: crate::env::EnvHealth::default(),
            dims,
            spread: Spread {
                shards: cfg.shards,
                placement: opts.placement.clone(),
            },
            cfg,
        }
    }

    /// Phases 1–2: draw the tasks, then roll them out with the pre-update policy.
    fn tasks_and_rollout(&mut self, batch: &mut StepBatch) -> Result<(), TrainError> {
        let t = Instant::now();
        let (groups, episodes) = step::draw_tasks(
            &self.state.slots,
            self.env,
            self.cfg.budget.group_size,
            &mut self.state.task_rng,
        );
        batch.groups = groups;
        let old = self.policy.model.valid();
        let pb = progress::bar(1, "rollout", self.opts.progress);
        batch.trajs = rollout_sharded(
            &old,
            self.tok,
            episodes,
            &self.params,
            self.cfg.budget.max_env_steps,
            &mut self.state.rollout_rng,
            &self.spread,
        )?;
        pb.finish_and_clear();
        batch.timings.rollout_s = t.elapsed().as_secs_f64();
        env_ok(self.env, batch.step)?;
        if batch.trajs.iter().any(|t| !t.finite) {
            return Err(TrainError::NonFinite {
                step: batch.step,
                what: "policy's log-probability of a sampled token".into(),
            });
        }
        Ok(())
    }

    /// Phase 3: outcomes, group accuracies, the proposer's observations and the gate.
    fn outcome_and_gate(&mut self, batch: &mut StepBatch) {
        let t = Instant::now();
        step::outcome_and_gate(
            batch,
            &mut self.state.slots,
            self.cfg.band,
            &self.cfg.gate,
            self.proposer.as_mut(),
            &mut self.state.counts,
        );
        batch.timings.proposer_s += t.elapsed().as_secs_f64();
    }

    /// Phase 4: m verdicts per step of every used trajectory (from the judge model, or from
    /// the synthetic judge).
    fn judging(&mut self, batch: &mut StepBatch) -> Result<(), TrainError> {
        let t = Instant::now();
        if self.cfg.judge.has_verdicts() {
            let pb = progress::bar(1, "judge", self.opts.progress);
            let index = step::used_trajectories(batch);
            let kept: Vec<_> = index.iter().map(|&i| batch.trajs[i].clone()).collect();
            let rng = &mut self.state.judge_rng;
            let mut judged = match (&self.judge, self.cfg.judge.model(), &self.synthetic) {
                (Some(j), Some(spec), _) => judge::judge_steps(
                    &j.model.valid(),
                    self.tok,
                    spec.history,
                    &kept,
                    Voting {
                        votes: self.cfg.reward.votes,
                        temperature: spec.temperature,
                    },
                    rng,
                    &self.spread,
                )?,
                (_, _, Some(s)) => s.judge_steps(&kept, rng),
                _ => Vec::new(),
            };
            for js in &mut judged {
                js.traj = index[js.traj];
            }
            pb.finish_and_clear();
            batch.judged = judged;
        }
        batch.verdicts = judge::by_trajectory(&batch.judged, &batch.trajs);
        batch.timings.judge_s = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Phase 5: the policy's advantages and (when the judge learns) the judge's samples.
    fn rewards_and_advantages(&self, batch: &mut StepBatch) {
        let rw = &self.cfg.reward;
        step::policy_samples(batch, rw);
        if self.cfg.judge.trained() {
            step::judge_samples(batch, rw.judge_band, rw.consistency);
        }
    }

    /// The PPO settings both learners share (each has its own learning rate and minibatches).
    fn update_params(&self) -> UpdateParams {
        let ppo = &self.cfg.ppo;
        UpdateParams {
            clip: ppo.clip,
            kl_coef: ppo.kl.coef,
            estimator: ppo.kl.estimator,
            lr: ppo.lr,
            max_grad_norm: ppo.max_grad_norm,
            minibatches: ppo.policy_updates,
            pad: self.tok.pad(),
            kernels: self.cfg.kernels,
            spread: self.spread.clone(),
            micro_batch: ppo.micro_batch,
            label: "update",
            progress: self.opts.progress,
        }
    }

    /// Phase 6: the policy's PPO update against its pre-update self (or its reference), then
    /// the judge's on the consistency samples (a frozen judge keeps its warm-start weights).
    fn updates(&mut self, batch: &mut StepBatch) -> Result<(), TrainError> {
        let params = self.update_params();
        let (step, device) = (batch.step, self.device);
        let update = |learner: &mut Learner<B, M>, samples: &[Sample]| {
            let t = Instant::now();
            let stats = learner
                .update(samples, &params, device)
                .map_err(non_finite(step, learner.role().name()))?;
            Ok::<_, TrainError>((stats, t.elapsed().as_secs_f64()))
        };
        (batch.policy_stats, batch.timings.policy_update_s) =
            update(&mut self.policy, &batch.policy_samples)?;
        let learns = self.cfg.judge.trained();
        if let Some(judge) = self.judge.as_mut().filter(|_| learns) {
            (batch.judge_stats, batch.timings.judge_update_s) =
                update(judge, &batch.judge_samples)?;
        }
        Ok(())
    }

    /// Phase 7: new proposals for slots outside the band.
    fn proposals(&mut self, batch: &mut StepBatch) {
        let t = Instant::now();
        if self.cfg.adaptive {
            // The seeds the slots' tasks will have at the next step (a rewrite must change
            // the task it will be tried on).
            let mut next = self.state.task_rng.clone();
            let next_seeds = step::task_seeds(&mut next, self.state.slots.len());
            let phase = step::ProposalPhase {
                env: self.env,
                next_seeds: &next_seeds,
                dims: self.dims.len(),
                band: self.cfg.band,
                gate: &self.cfg.gate,
                critic: self.cfg.critic,
            };
            step::propose(
                batch,
                &mut self.state.slots,
                &phase,
                self.proposer.as_mut(),
                &mut self.state.adapt_rng,
                &mut self.state.counts,
            );
        }
        self.state.proposer = self.proposer.state();
        batch.timings.proposer_s += t.elapsed().as_secs_f64();
    }

    /// Phase 8: metrics, evaluation, checkpoint.
    fn bookkeeping(&mut self, batch: &mut StepBatch, t0: Instant) -> Result<(), TrainError> {
        let step = batch.step;
        let budget = &self.cfg.budget;
        let (steps, eval_every, ckpt_every) =
            (budget.steps, budget.eval_every, budget.checkpoint_every);
        let mut m = Metrics::new(step);
        step::step_metrics(
            &mut m,
            batch,
            &self.state.slots,
            &self.dims,
            &self.state.counts,
        );
        step::situation_metrics(&mut m, batch, &self.cfg.situations);
        let c = &mut self.state.compute;
        c.rollouts += batch.trajs.len() as u64;
        c.gen_tokens += batch.generated_tokens() as u64;
        c.policy_steps += batch.policy_stats.as_ref().map_or(0, |s| s.updates as u64);
        c.judge_steps += batch.judge_stats.as_ref().map_or(0, |s| s.updates as u64);
        c.judged_steps += batch.judged.len() as u64;
        c.silent_steps += u64::from(batch.signal.units == 0);
        self.set_compute(&mut m);
        self.dir.append(
            "adaptation.jsonl",
            &serde_json::json!({
                "step": step,
                "dims": self.dims,
                "slots": self.state.slots.iter().map(|s| &s.difficulty).collect::<Vec<_>>(),
                "proposals": batch.proposals,
            }),
        )?;
        if step.is_multiple_of(eval_every) || step == steps {
            let t = Instant::now();
            let (id, ood) = self.evaluate(&mut m, step)?;
            self.summary.acc_id_end = Some(id);
            self.summary.acc_ood_end = Some(ood);
            batch.timings.eval_s = t.elapsed().as_secs_f64();
        }
        set_perf(&mut m, batch, t0);
        self.set_exchange(&mut m);
        self.set_env_health(&mut m, step);
        self.dir.log(&m)?;
        self.state.step = step;
        self.summary.last_step = step;
        if self.opts.log_lines {
            eprintln!(
                "[{} seed {}] {}",
                self.cfg.name,
                self.seed,
                plain_line(&m, steps)
            );
        }
        if step.is_multiple_of(ckpt_every) || step == steps {
            self.save()?;
        }
        if let Some(o) = &self.opts.observer {
            (o.0)(step, steps);
        }
        Ok(())
    }

    /// The environment's failures since the last metrics line (`env/failed_calls`,
    /// `env/timeouts`, `env/restarts`, `env/failed_episodes`; only for an environment that
    /// can fail), added to the run's summary, and a warning line when there were any.
    fn set_env_health(&mut self, m: &mut Metrics, step: usize) {
        let Some(now) = self.env.health() else {
            return;
        };
        let d = now.since(&self.env_seen);
        self.env_seen = now;
        m.set("env/failed_calls", d.failed_calls as f64);
        m.set("env/timeouts", d.timeouts as f64);
        m.set("env/restarts", d.restarts as f64);
        m.set("env/failed_episodes", d.failed_episodes as f64);
        self.summary.env_failed_calls += d.failed_calls;
        self.summary.env_failed_episodes += d.failed_episodes;
        if d.failed_calls > 0 || d.failed_episodes > 0 {
            eprintln!(
                "[{} seed {}] warning: step {step}: {}",
                self.cfg.name,
                self.seed,
                env_failure_words(&d)
            );
        }
    }

    /// The cumulative `compute/*` metrics.
    fn set_compute(&self, m: &mut Metrics) {
        let c = &self.state.compute;
        m.set("compute/rollouts", c.rollouts as f64);
        m.set("compute/gen_tokens", c.gen_tokens as f64);
        m.set("compute/policy_steps", c.policy_steps as f64);
        m.set("compute/judge_steps", c.judge_steps as f64);
        m.set("compute/judged_steps", c.judged_steps as f64);
        m.set("compute/silent_steps", c.silent_steps as f64);
    }

    /// A spread run's exchanges so far (`perf/exchange_*`: exchanges, MB this peer
    /// passed in, seconds spent in them), cumulative like the `compute/*` metrics.
    fn set_exchange(&self, m: &mut Metrics) {
        let p = &self.opts.placement;
        if p.is_spread() {
            let t = p.traffic();
            m.set("perf/exchange_calls", t.calls as f64);
            m.set("perf/exchange_mb", t.bytes as f64 / 1e6);
            m.set("perf/exchange_s", t.seconds);
        }
    }

    /// Writes one checkpoint of everything the loop needs to continue (peer 0 of a spread
    /// run alone).
    fn save(&self) -> Result<(), CheckpointError> {
        if !self.dir.writes() {
            return Ok(());
        }
        let w = checkpoint::Writer::begin(&self.dir.checkpoints(), self.state.step)?;
        self.policy.save(&w)?;
        if let Some(j) = &self.judge {
            j.save(&w)?;
        }
        // A run without a judge model saves the judge's stream as it was drawn, unused.
        let unused = Rng::derive(self.seed, Role::Judge.stream());
        w.state(&SavedState {
            state: &self.state,
            policy_mb_rng: self.policy.rng(),
            judge_mb_rng: self.judge.as_ref().map_or(&unused, |j| j.rng()),
        })?;
        w.commit(2)
    }

    /// A spread run's replicas hold equal trainable weights after the updates (checked by
    /// checksum on every peer; a difference is an error naming the peer).
    fn replicas_agree(&self) -> Result<(), TrainError> {
        let placement = &self.opts.placement;
        if !placement.is_spread() {
            return Ok(());
        }
        let step = self.state.step + 1;
        for learner in std::iter::once(&self.policy).chain(&self.judge) {
            let what = format!("{} after step {step}", learner.role().name());
            placement.agree(&what, learner.checksum())?;
        }
        Ok(())
    }
}

/// The wall-clock metrics (`perf/*`: the only keys that differ between two runs of a seed).
fn set_perf(m: &mut Metrics, batch: &StepBatch, t0: Instant) {
    let t = &batch.timings;
    let gen_tokens = batch.generated_tokens();
    let trained = batch.policy_stats.as_ref().map_or(0, |s| s.tokens)
        + batch.judge_stats.as_ref().map_or(0, |s| s.tokens);
    let update_s = t.policy_update_s + t.judge_update_s;
    m.set("perf/step_s", t0.elapsed().as_secs_f64());
    m.set("perf/rollout_s", t.rollout_s);
    m.set("perf/judge_s", t.judge_s);
    m.set("perf/policy_update_s", t.policy_update_s);
    m.set("perf/judge_update_s", t.judge_update_s);
    m.set("perf/proposer_s", t.proposer_s);
    m.set("perf/eval_s", t.eval_s);
    m.set(
        "perf/rollout_tok_s",
        gen_tokens as f64 / t.rollout_s.max(1e-9),
    );
    m.set("perf/train_tok_s", trained as f64 / update_s.max(1e-9));
}

/// One step's environment failures in words.
pub fn env_failure_words(d: &crate::env::EnvHealth) -> String {
    format!(
        "the environment failed {} call{} ({} timed out, {} child{} restarted); {} episode{} it ended \
         count{} as unsolved",
        d.failed_calls,
        if d.failed_calls == 1 { "" } else { "s" },
        d.timeouts,
        d.restarts,
        if d.restarts == 1 { "" } else { "ren" },
        d.failed_episodes,
        if d.failed_episodes == 1 { "" } else { "s" },
        if d.failed_episodes == 1 { "s" } else { "" },
    )
}

/// A training step's line names a step that taught the policy nothing (`policy/units` 0):
/// why, and how many steps of the run so far did the same (`compute/silent_steps`).
fn silence_words(m: &Metrics) -> Option<String> {
    if m.get("policy/units")? > 0.0 {
        return None;
    }
    let why = match m.get("policy/mixed_groups") {
        Some(n) if n > 0.0 => "no group in the policy band",
        _ => "every group all solved or all failed",
    };
    let so_far = m.get("compute/silent_steps").unwrap_or(1.0);
    let step = m.get("step").unwrap_or(so_far);
    Some(format!(
        "no policy gradient ({why}): {so_far} of {step} steps so far"
    ))
}

fn plain_line(m: &Metrics, steps: usize) -> String {
    let g = |k: &str| m.get(k).map_or("-".to_string(), |v| format!("{v:.3}"));
    let mut line = format!(
        "step {:>4}/{steps} acc {} loss {} kl {} clip {}",
        m.get("step").unwrap_or(0.0),
        g("env/acc_mean"),
        g("policy/loss"),
        g("policy/kl"),
        g("policy/clipfrac"),
    );
    if m.get("judge/verdict_pos_rate").is_some() {
        line += &format!(" | judge +rate {}", g("judge/verdict_pos_rate"));
    }
    if let Some(words) = silence_words(m) {
        line += &format!(" | {words}");
    }
    if m.get("env/proposals").is_some_and(|p| p > 0.0) {
        line += &format!(" | env {}/{} acc.", g("env/accepted"), g("env/proposals"));
    }
    if m.get("env/failed_calls").is_some_and(|n| n > 0.0) {
        line += &format!(
            " | env failures {} (episodes {})",
            m.get("env/failed_calls").unwrap_or(0.0),
            m.get("env/failed_episodes").unwrap_or(0.0)
        );
    }
    if m.get("eval/acc_id").is_some() {
        line += &format!(" | eval id {} ood {}", g("eval/acc_id"), g("eval/acc_ood"));
        if m.get("judge/eval_bal_acc").is_some() {
            line += &format!(" judge bal {}", g("judge/eval_bal_acc"));
        }
    }
    line + &format!(" | {}s", g("perf/step_s"))
}
