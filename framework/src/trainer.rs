//! The closed loop, top to bottom (method.md, "One training step"):
//!
//! 1. **Tasks** — every task slot draws a fresh task at its difficulty; a slot with a pending
//!    proposal also draws one at the proposed difficulty.
//! 2. **Rollout** — the policy plays each task `group_size` times, one step (line) at a time.
//! 3. **Outcome and gate** — the verifier scores every trajectory; group accuracy per task;
//!    pending proposals are accepted or rejected (rejected groups are dropped unused).
//! 4. **Judging** — the judge gives `m` verdicts per step.
//! 5. **Rewards** — integrated reward `R = O + (λ/m)ΣS` per step, z-scored per task group and
//!    step index (policy band); consistency reward `R·S` per verdict, z-scored over the `m`
//!    verdicts (judge band).
//! 6. **Updates** — PPO-clip + KL for the policy, then for the judge (if it learns).
//! 7. **Adaptation** — slots that are too easy or too hard get a proposal for the next step.
//! 8. **Bookkeeping** — metrics, periodic greedy evaluation (in-domain, OOD, judge quality),
//!    atomic checkpoints from which a resumed run continues exactly.
//!
//! Before step 1 the policy (then the judge) is warm-started and everything is evaluated
//! (step 0).

use crate::adapt::{AdaptCounts, AdaptSlot, CriticFeedback, Observation, Proposer};
use crate::advantage::{accuracy, group_step_advantages, in_band};
use crate::checkpoint::{self, CheckpointError};
use crate::env::{Environment, Split};
use crate::eval::evaluate;
use crate::experiment::{Experiment, JudgeSpec, KlTarget};
use crate::judge::{self, JudgedStep};
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::progress;
use crate::reward::{self, Verdict};
use crate::rng::Rng;
use crate::rollout::{Trajectory, rollout};
use crate::rundir::{Metrics, RunDir, RunDirError};
use crate::update::{NonFinite, Sample, Unit, UpdateParams, UpdateStats, ppo_update};
use crate::warmstart::{supervised, warm_start};
use burn::module::AutodiffModule;
use burn::optim::AdamWConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use rlany_kernels::AutodiffLogProbOps;
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
}

fn non_finite(step: usize, who: &str) -> impl FnOnce(NonFinite) -> TrainError + '_ {
    move |NonFinite(what)| TrainError::NonFinite {
        step,
        what: format!("{who} {what}"),
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

/// Everything besides weights and optimiser states that a checkpoint must hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainerState {
    step: usize,
    task_rng: Rng,
    rollout_rng: Rng,
    judge_rng: Rng,
    policy_mb_rng: Rng,
    judge_mb_rng: Rng,
    adapt_rng: Rng,
    slots: Vec<AdaptSlot>,
    counts: AdaptCounts,
    proposer: serde_json::Value,
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

/// One group of rollouts: a slot's own task, or the pending proposal of a slot.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Group {
    slot: usize,
    pending: bool,
}

/// Trains one seed of `exp` with `parts`.
pub fn train<B, M>(
    exp: &Experiment,
    seed: u64,
    parts: Components<'_, M>,
    device: &B::Device,
    opts: &TrainOptions,
) -> Result<RunSummary, TrainError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let kernels = exp.kernels.choice();
    let Components {
        env,
        tok,
        policy: fresh_policy,
        judge: fresh_judge,
        mut proposer,
    } = parts;
    let ppo = exp.ppo().clone();
    let budget = exp.budget.clone();
    let rw = exp.reward.clone();
    let judge_spec = exp.judge.model().cloned();
    let band = exp.adaptation.band();
    let adaptive = !matches!(exp.adaptation, crate::experiment::Adaptation::Static);
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
    let adamw = AdamWConfig::new().with_weight_decay(ppo.weight_decay as f32);
    let mut policy_optim = adamw.init::<B, M>();
    let mut judge_optim = adamw.init::<B, M>();
    let params = SampleParams {
        temperature: exp.policy.sampling.temperature,
        top_p: exp.policy.sampling.top_p,
        max_new_tokens: exp.policy.sampling.max_step_tokens,
        stop_tokens: vec![tok.step_delimiter(), tok.eos()],
    };

    // ── Warm starts, or the latest checkpoint ──────────────────────────────────────────
    let (run, mut policy, mut judge, reference, mut state) = if opts.resume {
        let run = RunDir::open(&opts.run_dir, &resolved)?;
        let ckpt = checkpoint::Reader::latest(&run.checkpoints())?;
        let reference = match ppo.kl.target {
            KlTarget::Reference => Some(ckpt.module("reference", fresh_policy.valid(), device)?),
            KlTarget::Old => None,
        };
        let policy = ckpt.module("policy", fresh_policy, device)?;
        policy_optim = ckpt.optim("policy_optim", policy_optim, device)?;
        let judge = match fresh_judge {
            Some(j) => {
                judge_optim = ckpt.optim("judge_optim", judge_optim, device)?;
                Some(ckpt.module("judge", j, device)?)
            }
            None => None,
        };
        let state: TrainerState = ckpt.state()?;
        proposer.load_state(state.proposer.clone())?;
        run.truncate_after(state.step)?;
        (run, policy, judge, reference, state)
    } else {
        let run = RunDir::create(&opts.run_dir, &resolved, &opts.meta)?;
        let mut m = Metrics::new(0);
        let mut rng = Rng::derive(seed, "warm-start");
        let ws = &exp.policy.warm_start;
        let (policy, loss) = warm_start(
            fresh_policy,
            env,
            tok,
            ws,
            ppo.max_grad_norm,
            &mut rng,
            opts.progress,
            kernels,
            device,
        )
        .map_err(non_finite(0, "policy warm-start"))?;
        if loss.is_finite() {
            m.set("warm/policy_loss", loss);
        }
        let judge = match (fresh_judge, &judge_spec) {
            (Some(j), Some(spec)) => {
                let ws = &spec.warm_start;
                let mut rng = Rng::derive(seed, "judge-warm-start");
                let pool = judge::labelled_steps(
                    &policy.valid(),
                    env,
                    tok,
                    ws.labels,
                    ws.label_noise,
                    spec.max_seq_len,
                    &params,
                    budget.max_env_steps,
                    &mut rng,
                );
                m.set("warm/judge_labels", pool.len() as f64);
                m.set(
                    "warm/judge_pos_rate",
                    pool.iter().filter(|(_, l)| *l).count() as f64 / pool.len().max(1) as f64,
                );
                let examples: Vec<(Vec<u32>, Vec<bool>)> = pool
                    .iter()
                    .map(|(prompt, label)| {
                        let mut ids = prompt.clone();
                        ids.push(judge::verdict_token(tok, *label));
                        let mut target = vec![false; prompt.len()];
                        target.push(true);
                        (ids, target)
                    })
                    .collect();
                let (j, loss) = supervised(
                    j,
                    tok,
                    ws.steps,
                    ws.lr,
                    ppo.max_grad_norm,
                    "judge warm",
                    opts.progress,
                    kernels,
                    device,
                    |_| {
                        (0..ws.batch.min(examples.len()))
                            .map(|_| examples[rng.below(examples.len())].clone())
                            .collect()
                    },
                )
                .map_err(non_finite(0, "judge warm-start"))?;
                if loss.is_finite() {
                    m.set("warm/judge_loss", loss);
                }
                Some(j)
            }
            _ => None,
        };
        let reference = matches!(ppo.kl.target, KlTarget::Reference).then(|| policy.valid());
        let state = TrainerState {
            step: 0,
            task_rng: Rng::derive(seed, "tasks"),
            rollout_rng: Rng::derive(seed, "rollout"),
            judge_rng: Rng::derive(seed, "judge"),
            policy_mb_rng: Rng::derive(seed, "policy-minibatches"),
            judge_mb_rng: Rng::derive(seed, "judge-minibatches"),
            adapt_rng: Rng::derive(seed, "adaptation"),
            slots: vec![AdaptSlot::new(exp.arith().difficulty.clone()); budget.tasks_per_step],
            counts: AdaptCounts::default(),
            proposer: proposer.state(),
        };
        let (id, ood) = evaluate_all(
            &mut m,
            &run,
            &policy.valid(),
            judge.as_ref().map(|j| j.valid()).as_ref(),
            env,
            tok,
            exp,
            seed,
            0,
            opts.progress,
        )?;
        log_posterior(&run, proposer.as_ref(), &state.slots, 0)?;
        summary.acc_id_start = Some(id);
        summary.acc_ood_start = Some(ood);
        run.log(&m)?;
        save(
            &run,
            &state,
            &policy,
            &policy_optim,
            judge.as_ref(),
            &judge_optim,
            reference.as_ref(),
        )?;
        if opts.log_lines {
            eprintln!(
                "[{} seed {seed}] warm start done | eval id {id:.3} ood {ood:.3}",
                exp.name
            );
        }
        (run, policy, judge, reference, state)
    };

    let group_size = budget.group_size;
    for step in state.step + 1..=budget.steps {
        let t0 = Instant::now();
        let mut m = Metrics::new(step);

        // 1. Tasks: one fresh task per slot (and per pending proposal), shared by its group.
        let mut groups: Vec<Group> = Vec::new();
        let mut episodes = Vec::new();
        for (k, slot) in state.slots.iter().enumerate() {
            let mut draws = vec![(
                Group {
                    slot: k,
                    pending: false,
                },
                slot.difficulty.clone(),
            )];
            if let Some(p) = &slot.pending {
                draws.push((
                    Group {
                        slot: k,
                        pending: true,
                    },
                    p.difficulty.clone(),
                ));
            }
            for (g, d) in draws {
                let task_seed = state.task_rng.next_u64();
                for _ in 0..group_size {
                    episodes.push((
                        groups.len(),
                        env.sample(&d, Split::Train, &mut Rng::new(task_seed)),
                    ));
                }
                groups.push(g);
            }
        }

        // 2. Rollout with the pre-update policy.
        let old_policy = policy.valid();
        let pb = progress::bar(1, "rollout", opts.progress);
        let trajs = rollout(
            &old_policy,
            tok,
            episodes,
            &params,
            budget.max_env_steps,
            &mut state.rollout_rng,
        );
        pb.finish_and_clear();
        if trajs.iter().any(|t| !t.finite) {
            return Err(TrainError::NonFinite {
                step,
                what: "policy's log-probability of a sampled token".into(),
            });
        }
        let rollout_s = t0.elapsed().as_secs_f64();
        let gen_tokens: usize = trajs.iter().map(Trajectory::generated_tokens).sum();

        // 3. Outcome per group; the gate on pending proposals.
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
        for (i, t) in trajs.iter().enumerate() {
            members[t.task].push(i);
        }
        let accs: Vec<f64> = members
            .iter()
            .map(|ix| accuracy(&ix.iter().map(|&i| trajs[i].outcome).collect::<Vec<_>>()))
            .collect();
        let mut used = vec![true; groups.len()];
        let mut slot_acc: Vec<f64> = vec![0.0; state.slots.len()];
        for (g, grp) in groups.iter().enumerate() {
            let d = if grp.pending {
                state.slots[grp.slot]
                    .pending
                    .as_ref()
                    .map(|p| p.difficulty.clone())
            } else {
                Some(state.slots[grp.slot].difficulty.clone())
            };
            if let Some(difficulty) = d {
                proposer.observe(Observation {
                    difficulty,
                    step,
                    acc: accs[g],
                    group_size,
                });
            }
            if !grp.pending {
                slot_acc[grp.slot] = accs[g];
            }
        }
        for (g, grp) in groups.iter().enumerate().filter(|(_, grp)| grp.pending) {
            let accepted =
                state.slots[grp.slot].resolve(accs[g], band, &mut state.counts) == Some(true);
            used[g] = accepted;
            if accepted {
                // The accepted task replaces the slot: its accuracy is the slot's now.
                slot_acc[grp.slot] = accs[g];
            }
        }

        // 4. Judging: m verdicts per step of every trajectory that will be used.
        let judged: Vec<JudgedStep> = match (&judge, &judge_spec) {
            (Some(j), Some(spec)) => {
                let pb = progress::bar(1, "judge", opts.progress);
                let kept: Vec<Trajectory> =
                    trajs.iter().filter(|t| used[t.task]).cloned().collect();
                let index: Vec<usize> = (0..trajs.len()).filter(|&i| used[trajs[i].task]).collect();
                let mut out = judge::judge_steps(
                    &j.valid(),
                    tok,
                    &kept,
                    rw.votes,
                    spec.temperature,
                    &mut state.judge_rng,
                );
                for js in &mut out {
                    js.traj = index[js.traj];
                }
                pb.finish_and_clear();
                out
            }
            _ => Vec::new(),
        };
        let verdicts = judge::by_trajectory(&judged, &trajs);

        // 5a. Integrated reward per step; advantages per group and step index (policy band).
        let step_reward: Vec<Vec<f64>> = trajs
            .iter()
            .zip(&verdicts)
            .map(|(t, v)| {
                v.iter()
                    .map(|s| reward::integrated_reward(t.outcome, s, rw.lambda))
                    .collect()
            })
            .collect();
        let mut policy_samples: Vec<Sample> = Vec::new();
        let mut kept_groups = 0;
        for (g, ix) in members.iter().enumerate() {
            if !used[g] || !in_band(accs[g], rw.policy_band) {
                continue;
            }
            kept_groups += 1;
            let rewards: Vec<Vec<f64>> = ix.iter().map(|&i| step_reward[i].clone()).collect();
            for (adv, &i) in group_step_advantages(&rewards).into_iter().zip(ix) {
                let units = trajs[i]
                    .steps
                    .iter()
                    .zip(adv)
                    .filter_map(|(s, a)| {
                        a.map(|adv| Unit {
                            start: s.start,
                            end: s.end,
                            adv,
                        })
                    })
                    .collect();
                policy_samples.push(Sample {
                    tokens: trajs[i].tokens.clone(),
                    units,
                });
            }
        }

        // 5b. Consistency reward per verdict; advantages over the m verdicts (judge band).
        let mut judge_samples: Vec<Sample> = Vec::new();
        if exp.judge.trained() {
            for js in &judged {
                let g = trajs[js.traj].task;
                if !in_band(accs[g], rw.judge_band) {
                    continue;
                }
                let r = step_reward[js.traj][js.step];
                let Some(adv) = reward::verdict_advantages(r, &js.verdicts) else {
                    continue;
                };
                for (token, a) in js.tokens.iter().zip(adv) {
                    let mut tokens = js.prompt.clone();
                    tokens.push(*token);
                    let n = tokens.len();
                    judge_samples.push(Sample {
                        tokens,
                        units: vec![Unit {
                            start: n - 1,
                            end: n,
                            adv: a,
                        }],
                    });
                }
            }
        }

        // 6. Updates: the policy, then the judge.
        let t_update = Instant::now();
        let policy_params = UpdateParams {
            clip: ppo.clip,
            kl_coef: ppo.kl.coef,
            estimator: ppo.kl.estimator,
            lr: ppo.lr,
            max_grad_norm: ppo.max_grad_norm,
            minibatches: ppo.policy_updates,
            pad: tok.pad(),
            kernels,
        };
        let target = reference.as_ref().unwrap_or(&old_policy);
        let (p, policy_stats) = ppo_update(
            policy,
            &mut policy_optim,
            &old_policy,
            target,
            &policy_samples,
            &policy_params,
            &mut state.policy_mb_rng,
            "update",
            opts.progress,
            device,
        )
        .map_err(non_finite(step, "policy"))?;
        policy = p;
        // Only a learned judge is updated (a frozen one keeps its warm-start weights).
        let mut judge_stats = None;
        if exp.judge.trained()
            && let (Some(j), Some(spec)) = (judge.take(), &judge_spec)
        {
            let old_judge = j.valid();
            let params = UpdateParams {
                lr: spec.lr,
                minibatches: ppo.judge_updates,
                ..policy_params.clone()
            };
            let (j, stats) = ppo_update(
                j,
                &mut judge_optim,
                &old_judge,
                &old_judge,
                &judge_samples,
                &params,
                &mut state.judge_mb_rng,
                "judge update",
                opts.progress,
                device,
            )
            .map_err(non_finite(step, "judge"))?;
            judge = Some(j);
            judge_stats = stats;
        }
        let update_s = t_update.elapsed().as_secs_f64();

        // 7. Adaptation: slots that are too easy or too hard get a proposal for the next step.
        if adaptive {
            for (k, slot) in state.slots.iter_mut().enumerate() {
                let steps = members
                    .iter()
                    .enumerate()
                    .filter(|(g, _)| groups[*g].slot == k && used[*g])
                    .flat_map(|(_, ix)| ix.iter())
                    .flat_map(|&i| {
                        trajs[i]
                            .steps
                            .iter()
                            .zip(&verdicts[i])
                            .map(|(s, v)| (reward::all_negative(v), s.blame.as_slice()))
                    });
                let feedback = CriticFeedback::from_steps(dims.len(), steps);
                slot.maybe_propose(
                    slot_acc[k],
                    band,
                    &feedback,
                    step,
                    proposer.as_mut(),
                    &mut state.adapt_rng,
                    &mut state.counts,
                );
            }
        }
        state.proposer = proposer.state();

        // 8. Bookkeeping.
        let main_accs: Vec<f64> = groups
            .iter()
            .zip(&accs)
            .filter(|(g, _)| !g.pending)
            .map(|(_, a)| *a)
            .collect();
        let step_labels: Vec<bool> = trajs
            .iter()
            .flat_map(|t| t.steps.iter().map(|s| s.oracle))
            .collect();
        m.set(
            "env/acc_mean",
            main_accs.iter().sum::<f64>() / main_accs.len().max(1) as f64,
        );
        m.set("env/step_acc", accuracy(&step_labels));
        for (d, dim) in dims.iter().enumerate() {
            let mean =
                state.slots.iter().map(|s| s.difficulty[d]).sum::<f64>() / state.slots.len() as f64;
            m.set(&format!("env/difficulty/{}", dim.name), mean);
        }
        m.set("env/proposals", state.counts.proposals as f64);
        m.set("env/accepted", state.counts.accepted as f64);
        m.set("env/rejected", state.counts.rejected as f64);
        m.set("policy/kept_groups", kept_groups as f64);
        m.set(
            "rollout/gen_tokens_mean",
            gen_tokens as f64 / trajs.len().max(1) as f64,
        );
        let all_rewards: Vec<f64> = step_reward.iter().flatten().copied().collect();
        m.set(
            "reward/step_mean",
            all_rewards.iter().sum::<f64>() / all_rewards.len().max(1) as f64,
        );
        let all_adv: Vec<f64> = policy_samples
            .iter()
            .flat_map(|s| s.units.iter().map(|u| u.adv))
            .collect();
        set_stats(&mut m, "policy", policy_stats.as_ref());
        if policy_stats.is_some() {
            m.set("policy/adv_std", std_dev(&all_adv));
        }
        if !judged.is_empty() {
            let all: Vec<Verdict> = judged
                .iter()
                .flat_map(|j| j.verdicts.iter().copied())
                .collect();
            let n = all.len().max(1) as f64;
            m.set(
                "judge/format_fail",
                all.iter().filter(|&&v| v == 0).count() as f64 / n,
            );
            m.set(
                "judge/verdict_pos_rate",
                all.iter().filter(|&&v| v == 1).count() as f64 / n,
            );
            m.set("judge/train_samples", judge_samples.len() as f64);
            set_stats(&mut m, "judge", judge_stats.as_ref());
        }
        if step % budget.eval_every == 0 || step == budget.steps {
            let judge_inner = judge.as_ref().map(|j| j.valid());
            let (id, ood) = evaluate_all(
                &mut m,
                &run,
                &policy.valid(),
                judge_inner.as_ref(),
                env,
                tok,
                exp,
                seed,
                step,
                opts.progress,
            )?;
            log_posterior(&run, proposer.as_ref(), &state.slots, step)?;
            summary.acc_id_end = Some(id);
            summary.acc_ood_end = Some(ood);
        }
        let trained_tokens = policy_stats.as_ref().map_or(0, |s| s.tokens)
            + judge_stats.as_ref().map_or(0, |s| s.tokens);
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
            save(
                &run,
                &state,
                &policy,
                &policy_optim,
                judge.as_ref(),
                &judge_optim,
                reference.as_ref(),
            )?;
        }
        if opts.stop_after == Some(step) && step < budget.steps {
            summary.interrupted = true;
            break;
        }
    }
    Ok(summary)
}

/// Writes one checkpoint of everything the loop needs to continue.
#[allow(clippy::too_many_arguments)]
fn save<B, M, O>(
    run: &RunDir,
    state: &TrainerState,
    policy: &M,
    policy_optim: &O,
    judge: Option<&M>,
    judge_optim: &O,
    reference: Option<&M::InnerModule>,
) -> Result<(), CheckpointError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: burn::optim::Optimizer<M, B>,
{
    let w = checkpoint::Writer::begin(&run.checkpoints(), state.step)?;
    w.module("policy", policy)?;
    w.optim::<B, M, O>("policy_optim", policy_optim)?;
    if let Some(j) = judge {
        w.module("judge", j)?;
        w.optim::<B, M, O>("judge_optim", judge_optim)?;
    }
    if let Some(r) = reference {
        w.module::<B::InnerBackend, M::InnerModule>("reference", r)?;
    }
    w.state(state)?;
    w.commit(2)
}

fn set_stats(m: &mut Metrics, who: &str, stats: Option<&UpdateStats>) {
    if let Some(s) = stats {
        m.set(&format!("{who}/loss"), s.loss);
        m.set(&format!("{who}/kl"), s.kl);
        m.set(&format!("{who}/clipfrac"), s.clipfrac);
        m.set(&format!("{who}/grad_norm"), s.grad_norm);
        m.set(&format!("{who}/entropy"), s.entropy);
        m.set(&format!("{who}/updates"), s.updates as f64);
    }
}

/// Greedy evaluation on both splits into `m` (and the judge's quality on the in-domain
/// trajectories); also writes a few decoded samples.
#[allow(clippy::too_many_arguments)]
fn evaluate_all<B: Backend, M: CausalLm<B>>(
    m: &mut Metrics,
    run: &RunDir,
    policy: &M,
    judge: Option<&M>,
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
    let mut pb = progress::bar(3, "eval", show_progress);
    let id = evaluate(
        policy,
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
        policy,
        env,
        tok,
        Split::Ood,
        d,
        b.eval_tasks,
        seed,
        mst,
        b.max_env_steps,
    );
    pb.inc(1);
    m.set("eval/acc_id", id.accuracy);
    m.set("eval/acc_ood", ood.accuracy);
    m.set("eval/step_acc_id", id.step_accuracy);
    m.set("eval/step_acc_ood", ood.step_accuracy);
    let mut judged_id = Vec::new();
    if let (Some(j), JudgeSpec::Frozen(spec) | JudgeSpec::Learned(spec)) = (judge, &exp.judge) {
        // A stream per evaluation step: evaluations never disturb the training streams.
        let mut rng = Rng::derive(seed ^ step as u64, "judge-eval");
        judged_id = judge::judge_steps(
            j,
            tok,
            &id.trajectories,
            exp.reward.votes,
            spec.temperature,
            &mut rng,
        );
        let q = judge::quality(&judged_id, &id.trajectories);
        m.set("judge/process_acc", q.process_acc);
        m.set("judge/process_acc_pos", q.process_acc_pos);
        m.set("judge/process_acc_neg", q.process_acc_neg);
        m.set("judge/outcome_acc", q.outcome_acc);
    }
    pb.finish_and_clear();
    let verdicts = judge::by_trajectory(&judged_id, &id.trajectories);
    for (split, r) in [("id", &id), ("ood", &ood)] {
        for (ti, t) in r.trajectories.iter().enumerate().take(2) {
            let steps: Vec<serde_json::Value> = t
                .steps
                .iter()
                .enumerate()
                .map(|(si, s)| {
                    let v = if split == "id" {
                        verdicts[ti].get(si).cloned().unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    serde_json::json!({"text": s.text, "oracle": s.oracle, "verdicts": v})
                })
                .collect();
            run.sample(&serde_json::json!({
                "step": step, "split": split, "prompt": t.prompt, "steps": steps, "outcome": t.outcome,
            }))?;
        }
    }
    Ok((id.accuracy, ood.accuracy))
}

/// Appends the proposer's posterior (if it has a model) to `posterior.jsonl`.
fn log_posterior(
    run: &RunDir,
    proposer: &dyn Proposer,
    slots: &[AdaptSlot],
    step: usize,
) -> Result<(), TrainError> {
    let Some(k) = slots.first().map(|s| s.difficulty.len()) else {
        return Ok(());
    };
    let center: Vec<f64> = (0..k)
        .map(|d| slots.iter().map(|s| s.difficulty[d]).sum::<f64>() / slots.len() as f64)
        .collect();
    if let Some(p) = proposer.posterior(&center, step, 11) {
        let mut v = serde_json::to_value(&p).unwrap_or_default();
        if let serde_json::Value::Object(o) = &mut v {
            o.insert("step".into(), step.into());
            o.insert("center".into(), serde_json::json!(center));
        }
        run.append("posterior.jsonl", &v)?;
    }
    Ok(())
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
    if m.get("judge/verdict_pos_rate").is_some() {
        line += &format!(" | judge +rate {}", g("judge/verdict_pos_rate"));
    }
    if m.get("env/proposals").is_some_and(|p| p > 0.0) {
        line += &format!(" | env {}/{} acc.", g("env/accepted"), g("env/proposals"));
    }
    if m.get("eval/acc_id").is_some() {
        line += &format!(" | eval id {} ood {}", g("eval/acc_id"), g("eval/acc_ood"));
        if m.get("judge/process_acc").is_some() {
            line += &format!(" judge {}", g("judge/process_acc"));
        }
    }
    line + &format!(" | {}s", g("perf/step_s"))
}
