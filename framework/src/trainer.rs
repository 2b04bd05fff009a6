//! The closed loop, top to bottom (method.md, "One training step"):
//!
//! 1. **Tasks** — every task slot draws a fresh task at its difficulty.
//! 2. **Rollout** — the policy plays each task `group_size` times, one step (line) at a time.
//! 3. **Outcome** — the verifier scores every trajectory; group accuracy per task.
//! 4. **Reward and advantage** — `R = O` per step (outcome only until a judge is configured),
//!    z-scored per task group and step index; tasks outside the policy band are dropped.
//! 5. **Update** — PPO-clip with a KL penalty over `policy_updates` minibatches, AdamW,
//!    global gradient clipping.
//! 6. **Bookkeeping** — metrics, periodic greedy evaluation (in-domain and OOD), atomic
//!    checkpoints from which a resumed run continues exactly.
//!
//! Before step 1 the policy is warm-started on expert demonstrations and evaluated (step 0).

use crate::advantage::{accuracy, group_step_advantages, in_band};
use crate::batch::{TokenBatch, host_tensor, sequence_logprobs, token_batch, weighted_entropy};
use crate::checkpoint::{self, CheckpointError};
use crate::env::{Environment, Split};
use crate::eval::{EvalResult, evaluate};
use crate::experiment::Experiment;
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::ppo::ppo_loss;
use crate::progress;
use crate::rng::Rng;
use crate::rollout::{Trajectory, rollout};
use crate::rundir::{Metrics, RunDir, RunDirError};
use crate::warmstart::warm_start;
use burn::module::AutodiffModule;
use burn::optim::AdamWConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

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
        "training step {step}: {what} is not finite; the run stopped and its last checkpoint is intact"
    )]
    NonFinite {
        /// The training step (0 = warm start).
        step: usize,
        /// Which quantity.
        what: String,
    },
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
}

/// A task slot: where its tasks are drawn (method.md, "Environment adaptation").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// Current difficulty in `[0, 1]^k`.
    pub difficulty: Vec<f64>,
}

/// Everything besides weights and optimiser state that a checkpoint must hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainerState {
    step: usize,
    task_rng: Rng,
    rollout_rng: Rng,
    shuffle_rng: Rng,
    slots: Vec<Slot>,
}

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone, PartialEq)]
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
}

/// Trains one seed of `exp`. `init` builds a fresh policy on the device (its weights are
/// replaced by the checkpoint's when resuming).
#[allow(clippy::too_many_arguments)]
pub fn train<B, M>(
    exp: &Experiment,
    seed: u64,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    init: impl FnOnce(&B::Device) -> M,
    device: &B::Device,
    opts: &TrainOptions,
) -> Result<RunSummary, TrainError>
where
    B: AutodiffBackend,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let ppo = exp.ppo().clone();
    let budget = exp.budget.clone();
    let sampling = &exp.policy.sampling;
    let init_difficulty = exp.arith().difficulty.clone();
    let dims = env.difficulty_space();
    let resolved = exp.to_ron();
    let mut summary = RunSummary {
        last_step: 0,
        acc_id_start: None,
        acc_ood_start: None,
        acc_id_end: None,
        acc_ood_end: None,
        interrupted: false,
    };
    let mut optim = AdamWConfig::new()
        .with_weight_decay(ppo.weight_decay as f32)
        .init::<B, M>();

    // ── Warm start, or the latest checkpoint ────────────────────────────────────────────
    let (run, mut model, mut state) = if opts.resume {
        let run = RunDir::open(&opts.run_dir, &resolved)?;
        let ckpt = checkpoint::latest(&run.checkpoints())
            .ok_or_else(|| CheckpointError::Missing(run.checkpoints()))?;
        let (model, o, state): (M, _, TrainerState) =
            checkpoint::load(&ckpt, init(device), optim, device)?;
        optim = o;
        run.truncate_after(state.step)?;
        (run, model, state)
    } else {
        let run = RunDir::create(&opts.run_dir, &resolved, &opts.meta)?;
        let mut rng = Rng::derive(seed, "warm-start");
        let (model, warm_loss) = warm_start(
            init(device),
            env,
            tok,
            &exp.policy.warm_start,
            ppo.max_grad_norm,
            &mut rng,
            opts.progress,
            device,
        )?;
        let state = TrainerState {
            step: 0,
            task_rng: Rng::derive(seed, "tasks"),
            rollout_rng: Rng::derive(seed, "rollout"),
            shuffle_rng: Rng::derive(seed, "minibatches"),
            slots: vec![
                Slot {
                    difficulty: init_difficulty.clone()
                };
                budget.tasks_per_step
            ],
        };
        let mut m = Metrics::new(0);
        if warm_loss.is_finite() {
            m.set("warm/loss", warm_loss);
        }
        let (id, ood) = eval_into(
            &mut m,
            &run,
            &model.valid(),
            env,
            tok,
            exp,
            seed,
            0,
            opts.progress,
        )?;
        summary.acc_id_start = Some(id);
        summary.acc_ood_start = Some(ood);
        run.log(&m)?;
        checkpoint::save(&run.checkpoints(), 0, &model, &optim, &state, 2)?;
        if opts.log_lines {
            eprintln!(
                "[{} seed {seed}] warm start done: loss {warm_loss:.4} | eval id {id:.3} ood {ood:.3}",
                exp.name
            );
        }
        (run, model, state)
    };

    let params = SampleParams {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        max_new_tokens: sampling.max_step_tokens,
        stop_tokens: vec![tok.step_delimiter(), tok.eos()],
    };
    let group = budget.group_size;

    for step in state.step + 1..=budget.steps {
        let t0 = Instant::now();
        let mut m = Metrics::new(step);

        // 1. Tasks: one fresh task per slot, the same task for the whole group.
        let mut episodes = Vec::with_capacity(state.slots.len() * group);
        for (k, slot) in state.slots.iter().enumerate() {
            let task_seed = state.task_rng.next_u64();
            for _ in 0..group {
                let mut r = Rng::new(task_seed);
                episodes.push((k, env.sample(&slot.difficulty, Split::Train, &mut r)));
            }
        }

        // 2. Rollout with the pre-update policy.
        let policy = model.valid();
        let pb = progress::bar(1, "rollout", opts.progress);
        let trajs = rollout(
            &policy,
            tok,
            episodes,
            &params,
            budget.max_env_steps,
            &mut state.rollout_rng,
        );
        pb.finish_and_clear();
        let rollout_s = t0.elapsed().as_secs_f64();
        let gen_tokens: usize = trajs.iter().map(Trajectory::generated_tokens).sum();

        // 3. Outcome: group accuracy per task slot.
        let mut by_task: Vec<Vec<usize>> = vec![Vec::new(); state.slots.len()];
        for (i, t) in trajs.iter().enumerate() {
            by_task[t.task].push(i);
        }
        let accs: Vec<f64> = by_task
            .iter()
            .map(|ix| accuracy(&ix.iter().map(|&i| trajs[i].outcome).collect::<Vec<_>>()))
            .collect();

        // 4. Reward R = O ∈ {−1, +1} on every step; advantages per task group and step index.
        let mut step_adv: Vec<Vec<Option<f64>>> =
            trajs.iter().map(|t| vec![None; t.steps.len()]).collect();
        let mut kept_tasks = 0;
        for (k, ix) in by_task.iter().enumerate() {
            if !in_band(accs[k], exp.reward.policy_band) {
                continue;
            }
            kept_tasks += 1;
            let rewards: Vec<Vec<f64>> = ix
                .iter()
                .map(|&i| {
                    let o = if trajs[i].outcome { 1.0 } else { -1.0 };
                    vec![o; trajs[i].steps.len()]
                })
                .collect();
            for (adv, &i) in group_step_advantages(&rewards).into_iter().zip(ix) {
                step_adv[i] = adv;
            }
        }

        // 5. Update: PPO-clip over minibatches of the trajectories that carry signal.
        let mut kept: Vec<usize> = (0..trajs.len())
            .filter(|&i| step_adv[i].iter().any(Option::is_some))
            .collect();
        state.shuffle_rng.shuffle(&mut kept);
        let n_mb = ppo.policy_updates.min(kept.len()).max(1);
        let mb_size = kept.len().div_ceil(n_mb).max(1);
        let t_update = Instant::now();
        let (mut loss_sum, mut kl_sum, mut clip_sum, mut norm_sum, mut n_updates) =
            (0.0, 0.0, 0.0, 0.0, 0usize);
        let mut trained_tokens = 0usize;
        let all_adv: Vec<f64> = step_adv.iter().flatten().flatten().copied().collect();
        let pb = progress::bar(kept.chunks(mb_size).len() as u64, "update", opts.progress);
        for (mb_index, mb) in kept.chunks(mb_size).enumerate() {
            let seqs: Vec<&[u32]> = mb.iter().map(|&i| trajs[i].tokens.as_slice()).collect();
            let batch = token_batch::<B>(&seqs, tok.pad(), model.max_seq_len(), device);
            let (adv, weight, n_tok) = step_targets(mb, &trajs, &step_adv, &batch);
            trained_tokens += n_tok;
            let adv = host_tensor::<B>(adv, batch.batch, batch.seq, device);
            let weight = host_tensor::<B>(weight, batch.batch, batch.seq, device);
            let inner_batch = TokenBatch::<B::InnerBackend> {
                inputs: batch.inputs.clone().inner(),
                targets: batch.targets.clone().inner(),
                batch: batch.batch,
                seq: batch.seq,
            };
            // The rollout policy's log-probs (the "old" ones), recomputed without a graph.
            let old_lp = Tensor::<B, 2>::from_inner(sequence_logprobs(&policy, &inner_batch));
            if mb_index == 0 {
                m.set(
                    "policy/entropy",
                    weighted_entropy(&policy, &inner_batch, weight.clone().inner()),
                );
            }
            let new_lp = sequence_logprobs(&model, &batch);
            let out = ppo_loss(
                new_lp,
                old_lp.clone(),
                old_lp,
                adv,
                weight,
                ppo.clip,
                ppo.kl.coef,
                ppo.kl.estimator,
            );
            let loss_value = out.loss.clone().into_scalar().elem::<f64>();
            if !loss_value.is_finite() {
                return Err(TrainError::NonFinite {
                    step,
                    what: "the policy loss".into(),
                });
            }
            let norm;
            (model, norm) =
                crate::optim::step(model, &mut optim, out.loss, ppo.lr, ppo.max_grad_norm);
            if !norm.is_finite() {
                return Err(TrainError::NonFinite {
                    step,
                    what: "the policy gradient norm".into(),
                });
            }
            loss_sum += loss_value;
            kl_sum += out.kl.into_scalar().elem::<f64>();
            clip_sum += out.clipfrac.into_scalar().elem::<f64>();
            norm_sum += norm;
            n_updates += 1;
            pb.inc(1);
        }
        pb.finish_and_clear();
        let update_s = t_update.elapsed().as_secs_f64();

        // 6. Bookkeeping.
        let step_labels: Vec<bool> = trajs
            .iter()
            .flat_map(|t| t.steps.iter().map(|s| s.oracle))
            .collect();
        m.set(
            "env/acc_mean",
            accs.iter().sum::<f64>() / accs.len().max(1) as f64,
        );
        m.set("env/step_acc", accuracy(&step_labels));
        for (d, dim) in dims.iter().enumerate() {
            let mean =
                state.slots.iter().map(|s| s.difficulty[d]).sum::<f64>() / state.slots.len() as f64;
            m.set(&format!("env/difficulty/{}", dim.name), mean);
        }
        m.set("policy/kept_tasks", kept_tasks as f64);
        m.set("policy/trained_trajectories", kept.len() as f64);
        m.set(
            "rollout/gen_tokens_mean",
            gen_tokens as f64 / trajs.len().max(1) as f64,
        );
        if n_updates > 0 {
            let n = n_updates as f64;
            m.set("policy/loss", loss_sum / n);
            m.set("policy/kl", kl_sum / n);
            m.set("policy/clipfrac", clip_sum / n);
            m.set("policy/grad_norm", norm_sum / n);
            m.set("policy/adv_std", std_dev(&all_adv));
            m.set("policy/updates", n);
        }
        if step % budget.eval_every == 0 || step == budget.steps {
            let (id, ood) = eval_into(
                &mut m,
                &run,
                &model.valid(),
                env,
                tok,
                exp,
                seed,
                step,
                opts.progress,
            )?;
            summary.acc_id_end = Some(id);
            summary.acc_ood_end = Some(ood);
        }
        m.set("perf/step_s", t0.elapsed().as_secs_f64());
        m.set(
            "perf/rollout_tok_s",
            gen_tokens as f64 / rollout_s.max(1e-9),
        );
        m.set(
            "perf/train_tok_s",
            trained_tokens as f64 / update_s.max(1e-9),
        );
        run.log(&m)?;
        state.step = step;
        summary.last_step = step;
        if opts.log_lines {
            eprintln!(
                "[{} seed {seed}] {}",
                exp.name,
                plain_line(&m, budget.steps)
            );
        }
        if step % budget.checkpoint_every == 0 || step == budget.steps {
            checkpoint::save(&run.checkpoints(), step, &model, &optim, &state, 2)?;
        }
        if opts.stop_after == Some(step) && step < budget.steps {
            summary.interrupted = true;
            break;
        }
    }
    Ok(summary)
}

/// Per-token advantages and weights of a minibatch in the batch's `[row, j]` layout:
/// weight `1 / (tokens in the step) / (steps in the minibatch)` on the tokens of every step
/// that carries an advantage, zero elsewhere. Returns `(adv, weight, trained tokens)`.
fn step_targets<B: Backend>(
    mb: &[usize],
    trajs: &[Trajectory],
    step_adv: &[Vec<Option<f64>>],
    batch: &TokenBatch<B>,
) -> (Vec<f32>, Vec<f32>, usize) {
    let n_steps: usize = mb
        .iter()
        .map(|&i| step_adv[i].iter().flatten().count())
        .sum();
    let mut adv = vec![0f32; batch.batch * batch.seq];
    let mut weight = vec![0f32; batch.batch * batch.seq];
    let mut n_tok = 0;
    for (r, &i) in mb.iter().enumerate() {
        for (s, span) in trajs[i].steps.iter().enumerate() {
            let Some(a) = step_adv[i][s] else { continue };
            // Token k is predicted at target position k − 1.
            let positions: Vec<usize> = (span.start..span.end)
                .map(|k| k - 1)
                .filter(|&j| j < batch.seq)
                .collect();
            let w = 1.0 / positions.len().max(1) as f64 / n_steps.max(1) as f64;
            for j in positions {
                adv[r * batch.seq + j] = a as f32;
                weight[r * batch.seq + j] = w as f32;
                n_tok += 1;
            }
        }
    }
    (adv, weight, n_tok)
}

/// Greedy evaluation on both splits into `m`; also writes a few decoded samples.
#[allow(clippy::too_many_arguments)]
fn eval_into<B: Backend, M: CausalLm<B>>(
    m: &mut Metrics,
    run: &RunDir,
    model: &M,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    exp: &Experiment,
    seed: u64,
    step: usize,
    show_progress: bool,
) -> Result<(f64, f64), TrainError> {
    let d = &exp.arith().difficulty;
    let b = &exp.budget;
    let mst = exp.policy.sampling.max_step_tokens;
    let pb = progress::bar(2, "eval", show_progress);
    let id: EvalResult = evaluate(
        model,
        env,
        tok,
        Split::Eval,
        d,
        b.eval_tasks,
        seed,
        mst,
        b.max_env_steps,
    );
    pb.inc(1);
    let ood = evaluate(
        model,
        env,
        tok,
        Split::Ood,
        d,
        b.eval_tasks,
        seed,
        mst,
        b.max_env_steps,
    );
    pb.finish_and_clear();
    m.set("eval/acc_id", id.accuracy);
    m.set("eval/acc_ood", ood.accuracy);
    m.set("eval/step_acc_id", id.step_accuracy);
    m.set("eval/step_acc_ood", ood.step_accuracy);
    for (split, r) in [("id", &id), ("ood", &ood)] {
        for t in r.trajectories.iter().take(2) {
            run.sample(&serde_json::json!({
                "step": step,
                "split": split,
                "prompt": t.prompt,
                "steps": t.steps.iter().map(|s| serde_json::json!({"text": s.text, "oracle": s.oracle})).collect::<Vec<_>>(),
                "outcome": t.outcome,
            }))?;
        }
    }
    Ok((id.accuracy, ood.accuracy))
}

fn std_dev(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt()
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
    if m.get("eval/acc_id").is_some() {
        line += &format!(" | eval id {} ood {}", g("eval/acc_id"), g("eval/acc_ood"));
    }
    line + &format!(" | {}s", g("perf/step_s"))
}
