//! What one training step produces, and the phases of the loop that are pure logic (no
//! model, no tensors): drawing the tasks, the outcome gate on pending proposals, the
//! integrated-reward advantages of the policy, the consistency-reward samples of the judge,
//! the critic feedback of each slot and the step's metrics. The phases that run a model live
//! in [`crate::trainer`]; each writes into the same [`StepBatch`].

use crate::adapt::{AdaptCounts, AdaptSlot, CriticFeedback, Observation, Proposer};
use crate::advantage::{accuracy, group_step_advantages, in_band};
use crate::env::{Difficulty, Environment, Episode, Split};
use crate::judge::JudgedStep;
use crate::ppo::{Sample, Unit, UpdateStats};
use crate::reward::{self, Verdict};
use crate::rng::Rng;
use crate::rollout::Trajectory;
use crate::rundir::Metrics;

/// One group of `G` rollouts of one task: a slot's own task, or its pending proposal.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The task slot.
    pub slot: usize,
    /// A pending proposal's group (gated before it is used).
    pub pending: bool,
    /// The difficulty the task was drawn at.
    pub difficulty: Difficulty,
    /// Indices of its trajectories in [`StepBatch::trajs`].
    pub members: Vec<usize>,
    /// Fraction of its trajectories that solved the task.
    pub acc: f64,
    /// Whether its rollouts are trained on (false for a rejected proposal).
    pub used: bool,
}

/// Wall-clock seconds of the phases of one step (the `perf/*` metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Rollout generation.
    pub rollout_s: f64,
    /// Judging (m verdicts per step).
    pub judge_s: f64,
    /// The policy's PPO update.
    pub policy_update_s: f64,
    /// The judge's PPO update.
    pub judge_update_s: f64,
    /// The proposer (observations, fits, proposals).
    pub proposer_s: f64,
    /// Evaluation (when the step evaluates).
    pub eval_s: f64,
}

/// Everything one training step produces, phase by phase.
#[derive(Debug, Clone, Default)]
pub struct StepBatch {
    /// The training step (1-based).
    pub step: usize,
    /// The groups, in slot order (a slot's own group before its pending proposal's).
    pub groups: Vec<Group>,
    /// Every played-out trajectory; `trajs[i].task` is its group.
    pub trajs: Vec<Trajectory>,
    /// `[trajectory][step]` → the judge's m verdicts (empty without a judge or for unused
    /// groups).
    pub verdicts: Vec<Vec<Vec<Verdict>>>,
    /// The judged steps with the judge's prompts and sampled tokens.
    pub judged: Vec<JudgedStep>,
    /// `[trajectory][step]` → integrated reward `O + (λ/m)ΣS`.
    pub step_rewards: Vec<Vec<f64>>,
    /// Per slot: the accuracy the slot stands at after the gate.
    pub slot_acc: Vec<f64>,
    /// Policy samples (kept groups, advantages per step).
    pub policy_samples: Vec<Sample>,
    /// Groups whose policy data was kept (used and inside the policy band).
    pub kept_groups: usize,
    /// Judge samples (one verdict token each).
    pub judge_samples: Vec<Sample>,
    /// Statistics of the policy update.
    pub policy_stats: Option<UpdateStats>,
    /// Statistics of the judge update.
    pub judge_stats: Option<UpdateStats>,
    /// Phase wall times.
    pub timings: Timings,
}

impl StepBatch {
    /// An empty batch for `step`.
    pub fn new(step: usize) -> Self {
        Self {
            step,
            ..Self::default()
        }
    }

    /// Generated tokens of the step's rollouts.
    pub fn generated_tokens(&self) -> usize {
        self.trajs.iter().map(Trajectory::generated_tokens).sum()
    }
}

/// Phase 1, tasks: one fresh task per slot (and per pending proposal), shared by the `G`
/// rollouts of its group. Each task is drawn from its own seed, taken from `task_rng` in slot
/// order. Returns the groups (members still empty) and the episodes paired with their group.
pub fn draw_tasks(
    slots: &[AdaptSlot],
    env: &dyn Environment,
    group_size: usize,
    task_rng: &mut Rng,
) -> (Vec<Group>, Vec<(usize, Box<dyn Episode>)>) {
    let mut groups = Vec::new();
    let mut episodes = Vec::new();
    for (k, slot) in slots.iter().enumerate() {
        let pending = slot.pending.as_ref().map(|p| (true, p.difficulty.clone()));
        for (is_pending, d) in std::iter::once((false, slot.difficulty.clone())).chain(pending) {
            let task_seed = task_rng.next_u64();
            for _ in 0..group_size {
                episodes.push((
                    groups.len(),
                    env.sample(&d, Split::Train, &mut Rng::new(task_seed)),
                ));
            }
            groups.push(Group {
                slot: k,
                pending: is_pending,
                difficulty: d,
                members: Vec::new(),
                acc: 0.0,
                used: true,
            });
        }
    }
    (groups, episodes)
}

/// Phase 3, outcome and gate: group accuracies; every group is observed by the proposer; each
/// pending proposal is accepted (it replaces its slot, its rollouts are used) or rejected
/// (its rollouts are dropped unused) by the method's gate. Fills `members`, `acc`, `used` and
/// `slot_acc`.
pub fn outcome_and_gate(
    batch: &mut StepBatch,
    slots: &mut [AdaptSlot],
    band: (f64, f64),
    proposer: &mut dyn Proposer,
    counts: &mut AdaptCounts,
) {
    for g in &mut batch.groups {
        g.members.clear();
    }
    for (i, t) in batch.trajs.iter().enumerate() {
        batch.groups[t.task].members.push(i);
    }
    let group_size = batch.groups.first().map_or(0, |g| g.members.len());
    batch.slot_acc = vec![0.0; slots.len()];
    for g in &mut batch.groups {
        let outcomes: Vec<bool> = g.members.iter().map(|&i| batch.trajs[i].outcome).collect();
        g.acc = accuracy(&outcomes);
        proposer.observe(Observation {
            difficulty: g.difficulty.clone(),
            step: batch.step,
            acc: g.acc,
            group_size,
        });
        if !g.pending {
            batch.slot_acc[g.slot] = g.acc;
        }
    }
    for g in batch.groups.iter_mut().filter(|g| g.pending) {
        let accepted = slots[g.slot].resolve(g.acc, band, counts) == Some(true);
        g.used = accepted;
        if accepted {
            // The accepted task replaces the slot: its accuracy is the slot's now.
            batch.slot_acc[g.slot] = g.acc;
        }
    }
}

/// Indices of the trajectories of used groups (those the judge scores and training sees).
pub fn used_trajectories(batch: &StepBatch) -> Vec<usize> {
    (0..batch.trajs.len())
        .filter(|&i| batch.groups[batch.trajs[i].task].used)
        .collect()
}

/// Phase 5a, the policy's rewards and advantages: the integrated reward of every step, then
/// for every used group inside `policy_band`, advantages z-scored per group and step index.
/// Fills `step_rewards`, `policy_samples` and `kept_groups`.
pub fn policy_samples(batch: &mut StepBatch, lambda: f64, policy_band: (f64, f64)) {
    batch.step_rewards = batch
        .trajs
        .iter()
        .zip(&batch.verdicts)
        .map(|(t, v)| {
            v.iter()
                .map(|s| reward::integrated_reward(t.outcome, s, lambda))
                .collect()
        })
        .collect();
    batch.policy_samples.clear();
    batch.kept_groups = 0;
    for g in &batch.groups {
        if !g.used || !in_band(g.acc, policy_band) {
            continue;
        }
        batch.kept_groups += 1;
        let rewards: Vec<Vec<f64>> = g
            .members
            .iter()
            .map(|&i| batch.step_rewards[i].clone())
            .collect();
        for (adv, &i) in group_step_advantages(&rewards).into_iter().zip(&g.members) {
            let t = &batch.trajs[i];
            let units = t
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
            batch.policy_samples.push(Sample {
                tokens: t.tokens.clone(),
                units,
            });
        }
    }
}

/// Phase 5b, the judge's consistency samples: for every judged step of a group inside
/// `judge_band`, each verdict's consistency reward `R·S` z-scored over the m verdicts; one
/// sample per verdict token. Needs `step_rewards`.
pub fn judge_samples(batch: &mut StepBatch, judge_band: (f64, f64)) {
    batch.judge_samples.clear();
    for js in &batch.judged {
        let g = &batch.groups[batch.trajs[js.traj].task];
        if !in_band(g.acc, judge_band) {
            continue;
        }
        let r = batch.step_rewards[js.traj][js.step];
        let Some(adv) = reward::verdict_advantages(r, &js.verdicts) else {
            continue;
        };
        for (token, a) in js.tokens.iter().zip(adv) {
            let mut tokens = js.prompt.clone();
            tokens.push(*token);
            let n = tokens.len();
            batch.judge_samples.push(Sample {
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

/// The critic feedback of slot `slot`: its used groups' steps, each with whether all its
/// verdicts were negative and the dimensions the environment blames.
pub fn critic_feedback(batch: &StepBatch, slot: usize, dims: usize) -> CriticFeedback {
    let steps = batch
        .groups
        .iter()
        .filter(|g| g.slot == slot && g.used)
        .flat_map(|g| g.members.iter())
        .flat_map(|&i| {
            batch.trajs[i]
                .steps
                .iter()
                .zip(&batch.verdicts[i])
                .map(|(s, v)| (reward::all_negative(v), s.blame.as_slice()))
        });
    CriticFeedback::from_steps(dims, steps)
}

/// Phase 7, proposals: every slot that is too easy or too hard (and has nothing pending)
/// asks the proposer for a new difficulty, given its critic feedback.
pub fn propose(
    batch: &StepBatch,
    slots: &mut [AdaptSlot],
    dims: usize,
    band: (f64, f64),
    proposer: &mut dyn Proposer,
    rng: &mut Rng,
    counts: &mut AdaptCounts,
) {
    for (k, slot) in slots.iter_mut().enumerate() {
        let feedback = critic_feedback(batch, k, dims);
        slot.maybe_propose(
            batch.slot_acc[k],
            band,
            &feedback,
            batch.step,
            proposer,
            rng,
            counts,
        );
    }
}

/// The training-side metrics of a step: environment, rewards, updates and judge verdicts.
pub fn step_metrics(
    m: &mut Metrics,
    batch: &StepBatch,
    slots: &[AdaptSlot],
    dim_names: &[String],
    counts: &AdaptCounts,
) {
    let main_accs: Vec<f64> = batch
        .groups
        .iter()
        .filter(|g| !g.pending)
        .map(|g| g.acc)
        .collect();
    let step_labels: Vec<bool> = batch
        .trajs
        .iter()
        .flat_map(|t| t.steps.iter().map(|s| s.oracle))
        .collect();
    m.set("env/acc_mean", mean(&main_accs));
    m.set("env/step_acc", accuracy(&step_labels));
    for (d, name) in dim_names.iter().enumerate() {
        let ds: Vec<f64> = slots.iter().map(|s| s.difficulty[d]).collect();
        m.set(&format!("env/difficulty/{name}"), mean(&ds));
    }
    m.set("env/proposals", counts.proposals as f64);
    m.set("env/accepted", counts.accepted as f64);
    m.set("env/rejected", counts.rejected as f64);
    m.set("policy/kept_groups", batch.kept_groups as f64);
    m.set(
        "rollout/gen_tokens_mean",
        batch.generated_tokens() as f64 / batch.trajs.len().max(1) as f64,
    );
    let rewards: Vec<f64> = batch.step_rewards.iter().flatten().copied().collect();
    m.set("reward/step_mean", mean(&rewards));
    set_stats(m, "policy", batch.policy_stats.as_ref());
    if batch.policy_stats.is_some() {
        let adv: Vec<f64> = batch
            .policy_samples
            .iter()
            .flat_map(|s| s.units.iter().map(|u| u.adv))
            .collect();
        m.set("policy/adv_std", std_dev(&adv));
    }
    if !batch.judged.is_empty() {
        let all: Vec<Verdict> = batch
            .judged
            .iter()
            .flat_map(|j| j.verdicts.iter().copied())
            .collect();
        let n = all.len().max(1) as f64;
        let share = |v: Verdict| all.iter().filter(|&&x| x == v).count() as f64 / n;
        m.set("judge/format_fail", share(0));
        m.set("judge/verdict_pos_rate", share(1));
        m.set("judge/train_samples", batch.judge_samples.len() as f64);
        set_stats(m, "judge", batch.judge_stats.as_ref());
    }
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

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

fn std_dev(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt()
}
