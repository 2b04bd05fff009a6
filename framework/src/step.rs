//! What one training step produces, and the phases of the loop that are pure logic (no
//! model, no tensors): drawing the tasks, the outcome gate on pending proposals, the
//! integrated-reward advantages of the policy, the consistency-reward samples of the judge,
//! the critic feedback of each slot and the step's metrics. The phases that run a model live
//! in [`crate::trainer`]; each writes into the same [`StepBatch`].

use crate::adapt::{
    AdaptCounts, AdaptSlot, Critic, CriticFeedback, GateSpec, Observation, ProposeContext, Proposer,
};
use crate::advantage::{accuracy, decomposed_advantages, group_step_advantages, in_band};
use crate::env::{Difficulty, Environment, Episode, Split};
use crate::judge::{JudgedStep, Situation};
use crate::ppo::{Sample, Unit, UpdateStats};
use crate::reward::{self, Advantage, Consistency, Verdict};
use crate::rng::Rng;
use crate::rollout::{StepSpan, Trajectory};
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

/// A proposal made, accepted or rejected during a step (for `adaptation.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProposalEvent {
    /// The task slot.
    pub slot: usize,
    /// The slot's difficulty when the proposal was made.
    pub from: Difficulty,
    /// The proposed difficulty.
    pub to: Difficulty,
    /// Which way it was meant to move.
    pub direction: crate::adapt::Direction,
    /// `pending` (made this step), `accepted` or `rejected` (gated this step).
    pub verdict: &'static str,
    /// The slot's accuracy when it was proposed.
    pub acc: f64,
    /// The proposal's own group accuracy (gated events only).
    pub new_acc: Option<f64>,
}

/// Where a step's policy signal comes from: how many used groups are outcome-uniform (all
/// solved or all failed, so only a step reward can tell their rollouts apart) and how many
/// steps got an advantage, in all and in those groups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignalCounts {
    /// Used groups (rejected proposals left out).
    pub groups: usize,
    /// Used groups whose rollouts all solved or all failed.
    pub uniform_groups: usize,
    /// Policy steps that carry an advantage (PPO units).
    pub units: usize,
    /// Of those, the steps of outcome-uniform groups.
    pub uniform_units: usize,
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
    /// Where the policy's signal came from (the `policy/*_groups`, `policy/*units` metrics).
    pub signal: SignalCounts,
    /// Judge samples (one verdict token each).
    pub judge_samples: Vec<Sample>,
    /// Indices into `judged` of the steps the judge's update drew from (groups inside the
    /// judge band; unanimous verdicts among them carry zero advantage).
    pub judge_trained: Vec<usize>,
    /// Statistics of the policy update.
    pub policy_stats: Option<UpdateStats>,
    /// Statistics of the judge update.
    pub judge_stats: Option<UpdateStats>,
    /// Phase wall times.
    pub timings: Timings,
    /// Proposals gated and made this step.
    pub proposals: Vec<ProposalEvent>,
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

/// Episodes paired with the index of their group.
pub type Episodes = Vec<(usize, Box<dyn Episode>)>;

/// The task seeds of one step, one per slot, in slot order: the next `slots` draws of
/// `task_rng` (so the seeds of the next step can be known in advance from a clone).
pub fn task_seeds(task_rng: &mut Rng, slots: usize) -> Vec<u64> {
    (0..slots).map(|_| task_rng.next_u64()).collect()
}

/// Phase 1, tasks: one fresh task per slot (seed from [`task_seeds`]), shared by the `G`
/// rollouts of its group; a slot's pending proposal is rolled out on the *rewrite* of that
/// task (the same seed at the proposed difficulty). Returns the groups (members still empty)
/// and the episodes paired with their group.
pub fn draw_tasks(
    slots: &[AdaptSlot],
    env: &dyn Environment,
    group_size: usize,
    task_rng: &mut Rng,
) -> (Vec<Group>, Episodes) {
    let mut groups = Vec::new();
    // (group, task) per episode, sampled together below.
    let mut members = Vec::new();
    let mut tasks = Vec::new();
    for ((k, slot), seed) in slots
        .iter()
        .enumerate()
        .zip(task_seeds(task_rng, slots.len()))
    {
        let pending = slot.pending.as_ref().map(|p| (true, p.difficulty.clone()));
        for (is_pending, d) in std::iter::once((false, slot.difficulty.clone())).chain(pending) {
            for _ in 0..group_size {
                members.push(groups.len());
                tasks.push((d.clone(), Split::Train, seed));
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
    let episodes = members.into_iter().zip(env.sample_many(&tasks)).collect();
    (groups, episodes)
}

/// Phase 3, outcome and gate: group accuracies; every group is observed by the proposer;
/// each slot's own group is recorded into its running accuracy; each pending proposal is
/// accepted (it replaces its slot, its rollouts are used) or rejected (its rollouts are
/// dropped unused) by the method's gate, comparing the rewrite with the same step's original
/// task. Fills `members`, `acc`, `used` and `slot_acc` (the slots' running accuracies).
pub fn outcome_and_gate(
    batch: &mut StepBatch,
    slots: &mut [AdaptSlot],
    band: (f64, f64),
    gate: &GateSpec,
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
    let mut own_acc = vec![f64::NAN; slots.len()];
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
            own_acc[g.slot] = g.acc;
            let solved = outcomes.iter().filter(|&&o| o).count();
            slots[g.slot].record(solved, outcomes.len(), gate);
        }
    }
    for g in batch.groups.iter_mut().filter(|g| g.pending) {
        let from = slots[g.slot].difficulty.clone();
        let pending = slots[g.slot].pending.clone();
        let solved = g
            .members
            .iter()
            .filter(|&&i| batch.trajs[i].outcome)
            .count();
        let new = (solved, g.members.len());
        let accepted = slots[g.slot].resolve(own_acc[g.slot], new, band, counts) == Some(true);
        if let Some(p) = pending {
            batch.proposals.push(ProposalEvent {
                slot: g.slot,
                from,
                to: p.difficulty,
                direction: p.direction,
                verdict: if accepted { "accepted" } else { "rejected" },
                acc: own_acc[g.slot],
                new_acc: Some(g.acc),
            });
        }
        g.used = accepted;
    }
    batch.slot_acc = slots.iter().map(|s| s.estimate().0).collect();
}

/// Indices of the trajectories of used groups (those the judge scores and training sees).
pub fn used_trajectories(batch: &StepBatch) -> Vec<usize> {
    (0..batch.trajs.len())
        .filter(|&i| batch.groups[batch.trajs[i].task].used)
        .collect()
}

/// Phase 5a, the policy's rewards and advantages: the integrated reward of every step, then
/// for every used group inside `policy_band`, advantages by `reward.advantage` (z-scored per
/// group and step index, or decomposed into the outcome's and the verdicts' z-scores).
/// Fills `step_rewards`, `policy_samples`, `kept_groups` and `signal`.
pub fn policy_samples(batch: &mut StepBatch, reward: &crate::experiment::RewardSpec) {
    let (lambda, policy_band, scale) = (reward.lambda, reward.policy_band, reward.outcome);
    batch.step_rewards = batch
        .trajs
        .iter()
        .zip(&batch.verdicts)
        .map(|(t, v)| {
            v.iter()
                .map(|s| reward::integrated_reward(t.outcome, s, lambda, scale))
                .collect()
        })
        .collect();
    batch.policy_samples.clear();
    batch.kept_groups = 0;
    batch.signal = SignalCounts::default();
    for g in batch.groups.iter().filter(|g| g.used) {
        let uniform = outcome_uniform(g.acc);
        batch.signal.groups += 1;
        batch.signal.uniform_groups += usize::from(uniform);
        if !in_band(g.acc, policy_band) {
            continue;
        }
        batch.kept_groups += 1;
        let advantages = match reward.advantage {
            Advantage::PerIndex => {
                let rewards: Vec<Vec<f64>> = g
                    .members
                    .iter()
                    .map(|&i| batch.step_rewards[i].clone())
                    .collect();
                group_step_advantages(&rewards)
            }
            Advantage::Decomposed => {
                let outcomes: Vec<f64> = g
                    .members
                    .iter()
                    .map(|&i| scale.value(batch.trajs[i].outcome))
                    .collect();
                let verdicts: Vec<Vec<f64>> = g
                    .members
                    .iter()
                    .map(|&i| {
                        batch.verdicts[i]
                            .iter()
                            .map(|v| reward::mean_verdict(v))
                            .collect()
                    })
                    .collect();
                decomposed_advantages(&outcomes, &verdicts, lambda)
            }
        };
        for (adv, &i) in advantages.into_iter().zip(&g.members) {
            let t = &batch.trajs[i];
            let units: Vec<Unit> = t
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
            batch.signal.units += units.len();
            if uniform {
                batch.signal.uniform_units += units.len();
            }
            batch.policy_samples.push(Sample {
                tokens: t.tokens.clone(),
                units,
            });
        }
    }
}

/// Whether every rollout of a group ended alike (all solved or all failed): its outcomes
/// carry no signal, only step rewards can.
pub fn outcome_uniform(acc: f64) -> bool {
    acc <= 1e-12 || acc >= 1.0 - 1e-12
}

/// Phase 5b, the judge's consistency samples: for every judged step of a group inside
/// `judge_band`, each verdict's consistency reward `R·S` z-scored over the m verdicts; one
/// sample per verdict token. With [`Consistency::Balanced`] the advantages of a step are
/// multiplied by its episode outcome's [`reward::class_weights`], counted over the steps
/// that carry signal. Needs `step_rewards`.
pub fn judge_samples(batch: &mut StepBatch, judge_band: (f64, f64), consistency: Consistency) {
    batch.judge_samples.clear();
    batch.judge_trained.clear();
    // (judged step, its episode's outcome, its verdicts' advantages) for each step with signal.
    let mut signal: Vec<(usize, bool, Vec<f64>)> = Vec::new();
    for (k, js) in batch.judged.iter().enumerate() {
        let traj = &batch.trajs[js.traj];
        if !in_band(batch.groups[traj.task].acc, judge_band) {
            continue;
        }
        batch.judge_trained.push(k);
        let r = batch.step_rewards[js.traj][js.step];
        if let Some(adv) = reward::verdict_advantages(r, &js.verdicts) {
            signal.push((k, traj.outcome, adv));
        }
    }
    let (w_solved, w_failed) = match consistency {
        Consistency::Paper => (1.0, 1.0),
        Consistency::Balanced => {
            let solved = signal.iter().filter(|(_, o, _)| *o).count();
            reward::class_weights(solved, signal.len() - solved)
        }
    };
    for (k, outcome, adv) in signal {
        let js = &batch.judged[k];
        let w = if outcome { w_solved } else { w_failed };
        for (token, a) in js.tokens.iter().zip(adv) {
            let mut tokens = js.prompt.clone();
            tokens.push(*token);
            let n = tokens.len();
            batch.judge_samples.push(Sample {
                tokens,
                units: vec![Unit {
                    start: n - 1,
                    end: n,
                    adv: w * a,
                }],
            });
        }
    }
}

/// The critic feedback of slot `slot` from its used groups' steps: with [`Critic::Judge`]
/// a step is flagged when all its verdicts are negative and blamed on the dimensions it
/// exercises; with [`Critic::Oracle`] (the upper bound) when the oracle labels it wrong, and
/// blamed on the oracle's attribution.
pub fn critic_feedback(
    batch: &StepBatch,
    slot: usize,
    dims: usize,
    critic: Critic,
) -> CriticFeedback {
    let steps =
        batch
            .groups
            .iter()
            .filter(|g| g.slot == slot && g.used)
            .flat_map(|g| g.members.iter())
            .flat_map(|&i| {
                batch.trajs[i].steps.iter().zip(&batch.verdicts[i]).map(
                    move |(s, v)| match critic {
                        Critic::Judge => (reward::all_negative(v), s.dims.as_slice()),
                        Critic::Oracle => (!s.oracle, s.oracle_blame.as_slice()),
                    },
                )
            });
    CriticFeedback::from_steps(dims, steps)
}

/// What phase 7 needs besides the batch and the slots.
pub struct ProposalPhase<'a> {
    /// The environment (to check that a rewrite changes the task).
    pub env: &'a dyn Environment,
    /// Each slot's task seed at the next step (see [`task_seeds`]).
    pub next_seeds: &'a [u64],
    /// Dimensions of the difficulty space.
    pub dims: usize,
    /// `(α_low, α_high)`.
    pub band: (f64, f64),
    /// Running-accuracy settings.
    pub gate: &'a GateSpec,
    /// Where the critic feedback comes from.
    pub critic: Critic,
}

/// Phase 7, proposals: every slot whose running accuracy is too easy or too hard (and has
/// nothing pending) asks the proposer for a new difficulty, given its critic feedback; a
/// proposal whose rewrite of the slot's next task is the same task is not made.
pub fn propose(
    batch: &mut StepBatch,
    slots: &mut [AdaptSlot],
    phase: &ProposalPhase<'_>,
    proposer: &mut dyn Proposer,
    rng: &mut Rng,
    counts: &mut AdaptCounts,
) {
    for (k, slot) in slots.iter_mut().enumerate() {
        let feedback = critic_feedback(batch, k, phase.dims, phase.critic);
        let ctx = ProposeContext {
            band: phase.band,
            gate: phase.gate,
            feedback: &feedback,
            step: batch.step,
        };
        let seed = phase.next_seeds.get(k).copied().unwrap_or(0);
        let current = slot.difficulty.clone();
        let key = |d: &[f64]| phase.env.sample(d, Split::Train, seed).task_key();
        let changes = |d: &[f64]| key(d) != key(&current);
        let made = slot.maybe_propose(&ctx, proposer, rng, counts, changes);
        if let (Some(direction), Some(p)) = (made, &slot.pending) {
            batch.proposals.push(ProposalEvent {
                slot: k,
                from: slot.difficulty.clone(),
                to: p.difficulty.clone(),
                direction,
                verdict: "pending",
                acc: p.base_acc,
                new_acc: None,
            });
        }
    }
}

/// The steps split by the environment's kind of step (unclassified steps left out):
/// `env/step_acc/<kind>`, the right share of the steps of that kind, `env/wrong/<kind>`, the
/// share of all wrong steps that are of that kind, and `env/kind/<kind>`, the share of all
/// steps that are of that kind.
pub fn kind_metrics<'a>(m: &mut Metrics, steps: impl Iterator<Item = &'a StepSpan>) {
    // kind → (steps, right steps), in name order so the metrics' order is fixed.
    let mut by_kind: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    let (mut wrong, mut all) = (0usize, 0usize);
    for s in steps {
        all += 1;
        wrong += usize::from(!s.oracle);
        if !s.kind.is_empty() {
            let e = by_kind.entry(s.kind.as_str()).or_default();
            e.0 += 1;
            e.1 += usize::from(s.oracle);
        }
    }
    for (kind, (n, right)) in by_kind {
        m.set(&format!("env/step_acc/{kind}"), right as f64 / n as f64);
        m.set(&format!("env/kind/{kind}"), n as f64 / all as f64);
        if wrong > 0 {
            m.set(
                &format!("env/wrong/{kind}"),
                (n - right) as f64 / wrong as f64,
            );
        }
    }
}

/// The watched situations ([`crate::experiment::Experiment::situations`]) on the policy's
/// training steps: `env/situation/<after>:<action>`, the share of the steps answering the line
/// `after` that answer `action` (of the trajectories the step used, as `env/*`), and
/// `judge/steps_approve/<after>:<action>`, the share of the judged steps in the situation
/// whose majority verdict is `+`. Each is also logged apart for the steps of solved and of
/// failed episodes (`env/situation_solved/…`, `env/situation_failed/…`,
/// `judge/steps_approve_solved/…`, `judge/steps_approve_failed/…`): what the outcome can
/// teach a judge about the situation. Each is absent from a step with no such step.
pub fn situation_metrics(m: &mut Metrics, batch: &StepBatch, situations: &[Situation]) {
    if situations.is_empty() {
        return;
    }
    let used = used_trajectories(batch);
    // Every step of the used trajectories: its situation and its episode's outcome.
    let seen: Vec<(Situation, bool)> = used
        .iter()
        .flat_map(|&i| {
            let t = &batch.trajs[i];
            (0..t.steps.len()).map(move |k| (Situation::of(t, k), t.outcome))
        })
        .collect();
    let judged: Vec<(Situation, bool, bool)> = batch
        .judged
        .iter()
        .map(|j| {
            let t = &batch.trajs[j.traj];
            let approved = reward::majority(&j.verdicts) == 1;
            (Situation::of(t, j.step), t.outcome, approved)
        })
        .collect();
    for s in situations {
        for (suffix, keep) in [
            ("", None),
            ("_solved", Some(true)),
            ("_failed", Some(false)),
        ] {
            let of_outcome = |outcome: bool| keep.is_none_or(|k| k == outcome);
            let after: Vec<bool> = seen
                .iter()
                .filter(|(x, o)| x.after == s.after && of_outcome(*o))
                .map(|(x, _)| x.action == s.action)
                .collect();
            if !after.is_empty() {
                m.set(
                    &format!("env/situation{suffix}/{}", s.key()),
                    accuracy(&after),
                );
            }
            let approved: Vec<bool> = judged
                .iter()
                .filter(|(x, o, _)| x == s && of_outcome(*o))
                .map(|&(_, _, a)| a)
                .collect();
            if !approved.is_empty() {
                m.set(
                    &format!("judge/steps_approve{suffix}/{}", s.key()),
                    accuracy(&approved),
                );
            }
        }
    }
}

/// The training-side metrics of a step: environment, rewards, updates and judge verdicts.
/// Rollouts of rejected proposals are left out of everything but `env/*` counts.
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
    let used = used_trajectories(batch);
    let step_labels: Vec<bool> = used
        .iter()
        .flat_map(|&i| batch.trajs[i].steps.iter().map(|s| s.oracle))
        .collect();
    m.set("env/acc_mean", mean(&main_accs));
    let running: Vec<f64> = batch
        .slot_acc
        .iter()
        .copied()
        .filter(|a| a.is_finite())
        .collect();
    if !running.is_empty() {
        m.set("env/slot_acc_mean", mean(&running));
    }
    m.set("env/step_acc", accuracy(&step_labels));
    // The right-step share of solved and of failed episodes apart: how right a policy must be
    // to succeed, read beside how right it is (absent in a step with no such episode).
    for (key, solved) in [
        ("env/step_acc_solved", true),
        ("env/step_acc_failed", false),
    ] {
        let labels: Vec<bool> = used
            .iter()
            .filter(|&&i| batch.trajs[i].outcome == solved)
            .flat_map(|&i| batch.trajs[i].steps.iter().map(|s| s.oracle))
            .collect();
        if !labels.is_empty() {
            m.set(key, accuracy(&labels));
        }
    }
    kind_metrics(m, used.iter().flat_map(|&i| batch.trajs[i].steps.iter()));
    for (name, d) in dim_names.iter().zip(mean_difficulty(slots)) {
        m.set(&format!("env/difficulty/{name}"), d);
    }
    m.set("env/proposals", counts.proposals as f64);
    m.set("env/accepted", counts.accepted as f64);
    m.set("env/rejected", counts.rejected as f64);
    m.set("env/unchanged", counts.unchanged as f64);
    m.set("env/accepted_harder", counts.accepted_harder as f64);
    m.set("env/accepted_easier", counts.accepted_easier as f64);
    m.set("policy/kept_groups", batch.kept_groups as f64);
    let sig = &batch.signal;
    m.set("policy/uniform_groups", sig.uniform_groups as f64);
    m.set(
        "policy/mixed_groups",
        (sig.groups - sig.uniform_groups) as f64,
    );
    m.set("policy/units", sig.units as f64);
    m.set("policy/uniform_units", sig.uniform_units as f64);
    let used_tokens: usize = used
        .iter()
        .map(|&i| batch.trajs[i].generated_tokens())
        .sum();
    m.set(
        "rollout/gen_tokens_mean",
        used_tokens as f64 / used.len().max(1) as f64,
    );
    let rewards: Vec<f64> = used
        .iter()
        .flat_map(|&i| batch.step_rewards.get(i).into_iter().flatten().copied())
        .collect();
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
        let q = crate::judge::quality(batch.judge_trained.iter().map(|&k| {
            let j = &batch.judged[k];
            (
                batch.trajs[j.traj].steps[j.step].oracle,
                j.verdicts.as_slice(),
            )
        }));
        q.set(m, "judge/train");
        // On every step of the policy's own rollouts it judged, by the oracle: what the
        // judge's verdicts on this policy are worth, over all and by the environment's kind.
        let steps = || {
            batch.judged.iter().map(|j| {
                let s = &batch.trajs[j.traj].steps[j.step];
                (s.kind.as_str(), s.oracle, j.verdicts.as_slice())
            })
        };
        crate::judge::quality(steps().map(|(_, o, v)| (o, v))).set(m, "judge/steps");
        for (kind, q) in crate::judge::quality_by_kind(steps()) {
            q.set_for_kind(m, "judge/steps", &kind);
        }
        set_stats(m, "judge", batch.judge_stats.as_ref());
    }
}

/// Per dimension, the mean difficulty over the task slots (empty without slots).
pub fn mean_difficulty(slots: &[AdaptSlot]) -> Vec<f64> {
    let k = slots.first().map_or(0, |s| s.difficulty.len());
    (0..k)
        .map(|d| mean(&slots.iter().map(|s| s.difficulty[d]).collect::<Vec<_>>()))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::{Direction, Pending, Threshold};
    use crate::env::{Dim, StepResult};
    use crate::rollout::StepSpan;

    /// A one-step task: "solved" iff the action equals the difficulty's first coordinate
    /// printed with one decimal; the task records the seed it was drawn from.
    struct Echo;
    struct EchoEpisode {
        d: f64,
        seed: u64,
        done: bool,
        ok: bool,
    }

    impl Episode for EchoEpisode {
        fn prompt(&self) -> String {
            format!("{:.1} {}\n", self.d, self.seed)
        }
        fn step(&mut self, action: &str) -> StepResult {
            self.ok = action == format!("{:.1}", self.d);
            self.done = true;
            StepResult::taken(String::new(), true, self.ok, Vec::new(), Vec::new())
        }
        fn done(&self) -> bool {
            self.done
        }
        fn outcome(&self) -> bool {
            self.ok
        }
    }

    impl Environment for Echo {
        fn difficulty_space(&self) -> Vec<Dim> {
            vec![Dim {
                name: "d".into(),
                lo: 0.0,
                hi: 1.0,
            }]
        }
        fn sample(&self, d: &[f64], _split: Split, seed: u64) -> Box<dyn Episode> {
            Box::new(EchoEpisode {
                d: d[0],
                seed,
                done: false,
                ok: false,
            })
        }
        fn demonstration(&self, d: &[f64], _noise: f64, _seed: u64) -> (String, Vec<String>) {
            (String::new(), vec![format!("{:.1}", d[0])])
        }
    }

    /// A trajectory of group `task` with the given outcome and one step per blame entry.
    fn traj(task: usize, outcome: bool, steps: &[(usize, usize, &[usize])]) -> Trajectory {
        Trajectory {
            task,
            tokens: (0..20).collect(),
            steps: steps
                .iter()
                .map(|&(start, end, blame)| StepSpan {
                    start,
                    end,
                    text: String::new(),
                    oracle: outcome,
                    observation: String::new(),
                    dims: blame.to_vec(),
                    oracle_blame: blame.to_vec(),
                    kind: String::new(),
                })
                .collect(),
            outcome,
            prompt: String::new(),
            finite: true,
        }
    }

    fn pending(d: f64, dir: Direction, base_acc: f64) -> Option<Pending> {
        Some(Pending {
            difficulty: vec![d],
            direction: dir,
            base_acc,
            proposed_at: 0,
        })
    }

    #[test]
    fn tasks_one_seed_per_group_shared_by_its_rollouts() {
        let mut slots = vec![AdaptSlot::new(vec![0.2]), AdaptSlot::new(vec![0.4])];
        slots[1].pending = pending(0.5, Direction::Harder, 1.0);
        let mut rng = Rng::new(7);
        let (groups, episodes) = draw_tasks(&slots, &Echo, 3, &mut rng);
        // Slot 0, slot 1, slot 1's proposal; 3 rollouts each, in that order.
        let shape: Vec<(usize, bool, f64)> = groups
            .iter()
            .map(|g| (g.slot, g.pending, g.difficulty[0]))
            .collect();
        assert_eq!(
            shape,
            vec![(0, false, 0.2), (1, false, 0.4), (1, true, 0.5)]
        );
        assert_eq!(episodes.len(), 9);
        let prompts: Vec<String> = episodes.iter().map(|(_, e)| e.prompt()).collect();
        for g in 0..3 {
            assert_eq!(episodes[3 * g].0, g);
            assert_eq!(prompts[3 * g], prompts[3 * g + 1], "one task per group");
            assert_eq!(prompts[3 * g], prompts[3 * g + 2]);
        }
        // The task seeds are the stream's next draws, one per slot; the proposal is a rewrite
        // of its slot's task: the same seed at the proposed difficulty.
        let mut again = Rng::new(7);
        let seeds = task_seeds(&mut again, 2);
        assert_eq!(prompts[0], format!("0.2 {}\n", seeds[0]));
        assert_eq!(prompts[3], format!("0.4 {}\n", seeds[1]));
        assert_eq!(prompts[6], format!("0.5 {}\n", seeds[1]));
        assert_eq!(rng, again, "one draw per slot, none for the rewrite");
    }

    #[test]
    fn gate_accepts_and_rejects_and_uses_only_accepted_rollouts() {
        // Slot 0 at acc 1.0 with a harder proposal that gives 0.5 → accepted.
        // Slot 1 at acc 1.0 with a harder proposal that gives 0.0 → rejected (never at 0).
        let mut slots = vec![AdaptSlot::new(vec![0.2]), AdaptSlot::new(vec![0.4])];
        slots[0].pending = pending(0.3, Direction::Harder, 1.0);
        slots[1].pending = pending(0.5, Direction::Harder, 1.0);
        let mut batch = StepBatch::new(3);
        batch.groups = vec![
            group(0, false, 0.2),
            group(0, true, 0.3),
            group(1, false, 0.4),
            group(1, true, 0.5),
        ];
        let outcomes = [[true, true], [true, false], [true, true], [false, false]];
        batch.trajs = outcomes
            .iter()
            .enumerate()
            .flat_map(|(g, o)| o.iter().map(move |&ok| traj(g, ok, &[(1, 2, &[])])))
            .collect();
        let mut counts = AdaptCounts::default();
        let mut recorder = Recorder::default();
        outcome_and_gate(
            &mut batch,
            &mut slots,
            (0.2, 0.8),
            &GATE,
            &mut recorder,
            &mut counts,
        );
        let accs: Vec<f64> = batch.groups.iter().map(|g| g.acc).collect();
        assert_eq!(accs, vec![1.0, 0.5, 1.0, 0.0]);
        let used: Vec<bool> = batch.groups.iter().map(|g| g.used).collect();
        assert_eq!(used, vec![true, true, true, false]);
        assert_eq!(
            slots[0].difficulty,
            vec![0.3],
            "accepted: replaces the slot"
        );
        assert_eq!(slots[1].difficulty, vec![0.4], "rejected: the slot stays");
        assert_eq!(
            batch.slot_acc,
            vec![0.5, 1.0],
            "an accepted rewrite starts the slot's history; a rejected one leaves it"
        );
        assert_eq!(
            (slots[0].recent.clone(), slots[1].recent.clone()),
            (vec![(1, 2)], vec![(2, 2)])
        );
        // The gate compared each rewrite with the same step's original task.
        let paired: Vec<(f64, Option<f64>)> =
            batch.proposals.iter().map(|p| (p.acc, p.new_acc)).collect();
        assert_eq!(paired, vec![(1.0, Some(0.5)), (1.0, Some(0.0))]);
        assert_eq!((counts.accepted, counts.rejected), (1, 1));
        // Every group was observed, at its own difficulty, with its group size.
        assert_eq!(
            recorder.0,
            vec![(0.2, 1.0, 2), (0.3, 0.5, 2), (0.4, 1.0, 2), (0.5, 0.0, 2)]
        );
        let verdicts: Vec<&str> = batch.proposals.iter().map(|p| p.verdict).collect();
        assert_eq!(verdicts, vec!["accepted", "rejected"]);
        assert_eq!(used_trajectories(&batch), vec![0, 1, 2, 3, 4, 5]);
    }

    fn group(slot: usize, pending: bool, d: f64) -> Group {
        Group {
            slot,
            pending,
            difficulty: vec![d],
            members: Vec::new(),
            acc: 0.0,
            used: true,
        }
    }

    /// Records every observation as `(d, acc, group size)`.
    #[derive(Default)]
    struct Recorder(Vec<(f64, f64, usize)>);

    impl Proposer for Recorder {
        fn observe(&mut self, obs: Observation) {
            self.0.push((obs.difficulty[0], obs.acc, obs.group_size));
        }
        fn propose(
            &mut self,
            request: &crate::adapt::ProposalRequest<'_>,
            _rng: &mut Rng,
        ) -> Vec<f64> {
            request.current.to_vec()
        }
    }

    /// Running accuracy over 4 steps; one group of 2 is enough to propose.
    const GATE: GateSpec = GateSpec {
        window: 4,
        min_rollouts: 2,
    };

    fn reward(lambda: f64, policy_band: (f64, f64)) -> crate::experiment::RewardSpec {
        crate::experiment::RewardSpec {
            lambda,
            policy_band,
            ..Default::default()
        }
    }

    /// Two groups of two one-step trajectories: group 0 mixed (acc 0.5), group 1 all solved.
    fn two_groups() -> StepBatch {
        two_groups_and_slots().0
    }

    fn two_groups_and_slots() -> (StepBatch, Vec<AdaptSlot>) {
        let mut batch = StepBatch::new(1);
        batch.groups = vec![group(0, false, 0.2), group(1, false, 0.2)];
        batch.trajs = vec![
            traj(0, true, &[(3, 5, &[])]),
            traj(0, false, &[(3, 6, &[0])]),
            traj(1, true, &[(3, 4, &[])]),
            traj(1, true, &[(3, 4, &[])]),
        ];
        let mut slots = vec![AdaptSlot::new(vec![0.2]), AdaptSlot::new(vec![0.2])];
        outcome_and_gate(
            &mut batch,
            &mut slots,
            (0.2, 0.8),
            &GATE,
            &mut Recorder::default(),
            &mut AdaptCounts::default(),
        );
        (batch, slots)
    }

    #[test]
    fn policy_advantages_per_group_and_band_filter() {
        let mut batch = two_groups();
        // Judge verdicts on group 0: the solved step judged (+,+,+), the failed one (+,-,-).
        batch.verdicts = vec![
            vec![vec![1, 1, 1]],
            vec![vec![1, -1, -1]],
            vec![vec![]],
            vec![vec![]],
        ];
        policy_samples(&mut batch, &reward(1.0, (0.125, 0.875)));
        // R = O + (λ/m)ΣS: 1 + 1 = 2; −1 − 1/3 = −4/3; group 1: O alone = 1, 1.
        assert_eq!(batch.step_rewards[0], vec![2.0]);
        assert!((batch.step_rewards[1][0] + 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(batch.step_rewards[2], vec![1.0]);
        // Group 1 (acc 1.0) is outside the band: only group 0 is trained on, z-scores ±1.
        assert_eq!(batch.kept_groups, 1);
        assert_eq!(batch.policy_samples.len(), 2);
        let units: Vec<(usize, usize, f64)> = batch
            .policy_samples
            .iter()
            .flat_map(|s| s.units.iter().map(|u| (u.start, u.end, u.adv)))
            .collect();
        assert_eq!(units.len(), 2);
        assert_eq!((units[0].0, units[0].1), (3, 5));
        assert!((units[0].2 - 1.0).abs() < 1e-12 && (units[1].2 + 1.0).abs() < 1e-12);
        // A wider band keeps group 1, whose equal rewards carry no signal (no unit).
        policy_samples(&mut batch, &reward(1.0, (0.0, 1.0)));
        assert_eq!(batch.kept_groups, 2);
        assert!(batch.policy_samples[2..].iter().all(|s| s.units.is_empty()));
    }

    #[test]
    fn decomposed_advantages_and_signal_counts() {
        let mut batch = two_groups();
        // Group 0 mixed: the solved step judged (+,+,+), the failed one (+,−,−); group 1
        // (all solved, outcome-uniform): one step judged (+,+,+), the other (−,−,−).
        batch.verdicts = vec![
            vec![vec![1, 1, 1]],
            vec![vec![1, -1, -1]],
            vec![vec![1, 1, 1]],
            vec![vec![-1, -1, -1]],
        ];
        let decomposed = crate::experiment::RewardSpec {
            advantage: Advantage::Decomposed,
            ..reward(0.5, (0.0, 1.0))
        };
        policy_samples(&mut batch, &decomposed);
        let adv: Vec<f64> = batch
            .policy_samples
            .iter()
            .flat_map(|s| s.units.iter().map(|u| u.adv))
            .collect();
        // Group 0: outcomes ±1 → z ±1; mean verdicts (1, −1/3) → z ±1: 1 + 0.5, −1 − 0.5.
        // Group 1: outcomes uniform → 0; mean verdicts (1, −1) → z ±1: ±0.5.
        assert_eq!(adv, vec![1.5, -1.5, 0.5, -0.5]);
        assert_eq!(
            batch.signal,
            SignalCounts {
                groups: 2,
                uniform_groups: 1,
                units: 4,
                uniform_units: 2,
            }
        );
        // The default band drops group 1: its signal is lost, its uniformity still counted.
        policy_samples(&mut batch, &reward(0.5, (0.125, 0.875)));
        assert_eq!(
            batch.signal,
            SignalCounts {
                groups: 2,
                uniform_groups: 1,
                units: 2,
                uniform_units: 0,
            }
        );
        // One wrong step in a solved episode (trajectory 2): the solved episodes' steps are
        // right 2 of 3, the failed one's 0 of 1; all four together 2 of 4.
        batch.trajs[2].steps[0].oracle = false;
        let mut m = Metrics::new(1);
        step_metrics(&mut m, &batch, &[], &[], &AdaptCounts::default());
        assert_eq!(m.get("env/step_acc"), Some(0.5));
        let solved = m.get("env/step_acc_solved").expect("solved episodes");
        assert!((solved - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(m.get("env/step_acc_failed"), Some(0.0));
        assert_eq!(m.get("policy/uniform_groups"), Some(1.0));
        assert_eq!(m.get("policy/mixed_groups"), Some(1.0));
        assert_eq!(m.get("policy/units"), Some(2.0));
        assert_eq!(m.get("policy/uniform_units"), Some(0.0));
    }

    #[test]
    fn situation_metrics_hand_computed() {
        // A corridor's steps as text: the prompt's last line is the first door, each
        // observation the next door. Group 1 is not used: its trajectory counts nowhere.
        let corridor = |task: usize, first: &str, steps: &[(&str, &str)], outcome| Trajectory {
            task,
            tokens: Vec::new(),
            steps: steps
                .iter()
                .map(|&(text, observation)| StepSpan::of_text(text, observation, true))
                .collect(),
            outcome,
            prompt: format!("rule\n{first}\n"),
            finite: true,
        };
        let mut batch = StepBatch::new(1);
        batch.groups = vec![group(0, false, 0.2), group(1, false, 0.2)];
        batch.groups[1].used = false;
        batch.trajs = vec![
            // Solved. After a 6: L, then (after the 2) L, then (after the 6) R.
            corridor(0, "6", &[("L", "2"), ("L", "6"), ("R", "")], true),
            // Failed. After a 6: L, then (after the 3) R.
            corridor(0, "6", &[("L", "3"), ("R", "")], false),
            corridor(1, "6", &[("L", "")], true),
        ];
        let judged = |traj: usize, step: usize, verdicts: Vec<Verdict>| JudgedStep {
            traj,
            step,
            prompt: Vec::new(),
            tokens: Vec::new(),
            verdicts,
        };
        // `L` after a 6 judged twice: approved (+,+,−), rejected (−,−,+); `R` after a 3 once,
        // a tie (+,−): not approved.
        batch.judged = vec![
            judged(0, 0, vec![1, 1, -1]),
            judged(1, 0, vec![-1, -1, 1]),
            judged(1, 1, vec![1, -1]),
        ];
        let watched = [
            Situation {
                after: "6".into(),
                action: "L".into(),
            },
            Situation {
                after: "3".into(),
                action: "R".into(),
            },
            Situation {
                after: "9".into(),
                action: "L".into(),
            },
        ];
        let mut m = Metrics::new(1);
        situation_metrics(&mut m, &batch, &watched);
        // After a 6 (used trajectories only): L, R, L → 2 of 3 take `L`.
        assert_eq!(m.get("env/situation/6:L"), Some(2.0 / 3.0));
        assert_eq!(m.get("env/situation/3:R"), Some(1.0));
        assert_eq!(m.get("judge/steps_approve/6:L"), Some(0.5));
        assert_eq!(m.get("judge/steps_approve/3:R"), Some(0.0));
        // By the episode's outcome. After a 6 in the solved episode: L, R (1 of 2); in the
        // failed one: L (1 of 1). `R` after a 3 only in the failed one.
        assert_eq!(m.get("env/situation_solved/6:L"), Some(0.5));
        assert_eq!(m.get("env/situation_failed/6:L"), Some(1.0));
        assert_eq!(m.get("env/situation_failed/3:R"), Some(1.0));
        assert_eq!(m.get("env/situation_solved/3:R"), None);
        // The judged `L` after a 6: approved in the solved episode, rejected in the failed.
        assert_eq!(m.get("judge/steps_approve_solved/6:L"), Some(1.0));
        assert_eq!(m.get("judge/steps_approve_failed/6:L"), Some(0.0));
        assert_eq!(m.get("judge/steps_approve_failed/3:R"), Some(0.0));
        assert_eq!(m.get("judge/steps_approve_solved/3:R"), None);
        // Never met: no metric at all.
        assert_eq!(m.get("env/situation/9:L"), None);
        assert_eq!(m.get("judge/steps_approve/9:L"), None);
        assert_eq!(m.get("env/situation_solved/9:L"), None);
        // Nothing watched, nothing logged.
        let mut none = Metrics::new(1);
        situation_metrics(&mut none, &batch, &[]);
        assert_eq!(none.get("env/situation/6:L"), None);
    }

    #[test]
    fn kind_metrics_hand_computed() {
        let span = |oracle: bool, kind: &str| StepSpan {
            start: 0,
            end: 1,
            text: String::new(),
            oracle,
            observation: String::new(),
            dims: Vec::new(),
            oracle_blame: Vec::new(),
            kind: kind.into(),
        };
        // Five steps, three wrong: two `invalid`, one unclassified.
        let steps = [
            span(true, "progress"),
            span(false, "invalid"),
            span(false, "invalid"),
            span(true, "search"),
            span(false, ""),
        ];
        let mut m = Metrics::new(1);
        kind_metrics(&mut m, steps.iter());
        assert_eq!(m.get("env/step_acc/progress"), Some(1.0));
        assert_eq!(m.get("env/step_acc/invalid"), Some(0.0));
        assert_eq!(m.get("env/wrong/invalid"), Some(2.0 / 3.0));
        assert_eq!(m.get("env/wrong/progress"), Some(0.0));
        assert_eq!(m.get("env/wrong/search"), Some(0.0));
        // Each kind's share of all steps, the unclassified one counted in the whole.
        assert_eq!(m.get("env/kind/invalid"), Some(2.0 / 5.0));
        assert_eq!(m.get("env/kind/progress"), Some(1.0 / 5.0));
        assert_eq!(
            m.get("env/step_acc/"),
            None,
            "unclassified steps get no metric"
        );
    }

    #[test]
    fn judge_samples_consistency_advantages_and_band() {
        let mut batch = two_groups();
        batch.verdicts = vec![
            vec![vec![1, 1, -1]],
            vec![vec![1, -1, -1]],
            vec![vec![]],
            vec![vec![]],
        ];
        batch.judged = vec![
            JudgedStep {
                traj: 0,
                step: 0,
                prompt: vec![1, 2],
                tokens: vec![10, 10, 11],
                verdicts: vec![1, 1, -1],
            },
            JudgedStep {
                traj: 2,
                step: 0,
                prompt: vec![1, 3],
                tokens: vec![10, 10, 10],
                verdicts: vec![1, 1, 1],
            },
        ];
        policy_samples(&mut batch, &reward(1.0, (0.0, 1.0)));
        judge_samples(&mut batch, (0.2, 0.8), Consistency::Paper);
        // Only traj 0's step (group 0, acc 0.5) is in the judge band; R = 1 + 1/3 = 4/3;
        // consistency rewards (4/3, 4/3, −4/3) → z-scores (1/√2, 1/√2, −√2).
        assert_eq!(batch.judge_samples.len(), 3);
        let adv: Vec<f64> = batch.judge_samples.iter().map(|s| s.units[0].adv).collect();
        let h = std::f64::consts::FRAC_1_SQRT_2;
        for (a, want) in adv.iter().zip([h, h, -2.0 * h]) {
            assert!((a - want).abs() < 1e-9, "{adv:?}");
        }
        // Each sample is the prompt plus its verdict token, the token being the trained unit.
        assert_eq!(batch.judge_samples[2].tokens, vec![1, 2, 11]);
        assert_eq!(
            (
                batch.judge_samples[2].units[0].start,
                batch.judge_samples[2].units[0].end
            ),
            (2, 3)
        );
    }

    #[test]
    fn balanced_consistency_weighs_solved_and_failed_steps_the_same() {
        let mut batch = two_groups();
        // Group 0 (acc 0.5): the solved episode has one step, the failed one three.
        batch.trajs[1] = traj(0, false, &[(3, 6, &[0]), (6, 8, &[0]), (8, 9, &[0])]);
        batch.verdicts = vec![
            vec![vec![1, 1, -1]],
            vec![vec![1, -1, -1]; 3],
            vec![vec![]],
            vec![vec![]],
        ];
        let judged = |traj, step, verdicts: Vec<Verdict>| JudgedStep {
            traj,
            step,
            prompt: vec![1, 2],
            tokens: verdicts
                .iter()
                .map(|&v| if v > 0 { 10 } else { 11 })
                .collect(),
            verdicts,
        };
        batch.judged = vec![
            judged(0, 0, vec![1, 1, -1]),
            judged(1, 0, vec![1, -1, -1]),
            judged(1, 1, vec![1, -1, -1]),
            judged(1, 2, vec![1, -1, -1]),
        ];
        policy_samples(&mut batch, &reward(1.0, (0.0, 1.0)));
        let h = std::f64::consts::FRAC_1_SQRT_2;
        // Solved step: R = 1 + 1/3 = 4/3, rewards (4/3, 4/3, −4/3) → z (h, h, −2h).
        // Failed steps: R = −1 − 1/3 = −4/3, rewards (−4/3, 4/3, 4/3) → z (−2h, h, h).
        let solved = [h, h, -2.0 * h];
        let failed = [-2.0 * h, h, h];
        let advs = |b: &StepBatch| -> Vec<f64> {
            b.judge_samples.iter().map(|s| s.units[0].adv).collect()
        };
        judge_samples(&mut batch, (0.2, 0.8), Consistency::Paper);
        let paper = advs(&batch);
        assert_eq!(paper.len(), 12);
        let want: Vec<f64> = solved
            .iter()
            .chain(failed.iter().cycle().take(9))
            .copied()
            .collect();
        for (a, w) in paper.iter().zip(&want) {
            assert!((a - w).abs() < 1e-9, "{paper:?}");
        }
        // Balanced: 1 solved step and 3 failed ones → weights 4/2 = 2 and 4/6 = 2/3, so each
        // outcome's steps weigh 2 in all.
        judge_samples(&mut batch, (0.2, 0.8), Consistency::Balanced);
        let balanced = advs(&batch);
        for (i, (a, w)) in balanced.iter().zip(&want).enumerate() {
            let weight = if i < 3 { 2.0 } else { 2.0 / 3.0 };
            assert!((a - weight * w).abs() < 1e-9, "{balanced:?}");
        }
        // The update's net pull on `+`, the summed advantage of the `+` votes: towards `−`
        // under the paper's weights, because failed steps outnumber solved ones; none when
        // balanced.
        let plus_total = |adv: &[f64]| -> f64 {
            batch
                .judge_samples
                .iter()
                .zip(adv)
                .filter(|(s, _)| s.tokens.last() == Some(&10))
                .map(|(_, a)| a)
                .sum()
        };
        // Paper: solved (h + h) + failed 3 × (−2h) = −4h. Balanced: 2·2h + (2/3)·3·(−2h) = 0.
        assert!((plus_total(&paper) + 4.0 * h).abs() < 1e-9);
        assert!(plus_total(&balanced).abs() < 1e-9);
    }

    #[test]
    fn critic_feedback_from_the_judge_or_the_oracle() {
        let mut batch = two_groups();
        // The judge flags the solved step of group 0 and passes the failed one.
        batch.verdicts = vec![
            vec![vec![-1, -1, -1]],
            vec![vec![1, 1, 1]],
            vec![vec![]],
            vec![vec![]],
        ];
        // Judge: the flagged step exercises no dimension (its `dims` are empty).
        let fb = critic_feedback(&batch, 0, 1, Critic::Judge);
        assert_eq!(
            (fb.flagged_steps, fb.steps, fb.blame.clone()),
            (1, 2, vec![0.0])
        );
        // Oracle (upper bound): the failed step, blamed on dimension 0.
        let fb = critic_feedback(&batch, 0, 1, Critic::Oracle);
        assert_eq!(
            (fb.flagged_steps, fb.steps, fb.blame.clone()),
            (1, 2, vec![1.0])
        );
        // Slot 1 has no flagged step.
        assert_eq!(
            critic_feedback(&batch, 1, 1, Critic::Judge).flagged_steps,
            0
        );
    }

    #[test]
    fn proposals_from_running_accuracy_and_only_when_the_rewrite_changes_the_task() {
        let (mut batch, mut slots) = two_groups_and_slots();
        batch.verdicts = vec![vec![vec![1]]; 4];
        let seeds = [11, 12];
        let phase = ProposalPhase {
            env: &Echo,
            next_seeds: &seeds,
            dims: 1,
            band: (0.2, 0.8),
            gate: &GATE,
            critic: Critic::Judge,
        };
        // Slot 1 is at 1.0: too easy. A move of 0.01 prints the same task ("0.2 12"): not made.
        let mut counts = AdaptCounts::default();
        let mut small = Threshold { step: 0.01 };
        propose(
            &mut batch,
            &mut slots,
            &phase,
            &mut small,
            &mut Rng::new(1),
            &mut counts,
        );
        assert!(slots.iter().all(|s| s.pending.is_none()));
        assert_eq!((counts.proposals, counts.unchanged), (0, 1));
        // A move of 0.25 changes it; slot 0 (0.5) does not propose.
        let mut t = Threshold { step: 0.25 };
        propose(
            &mut batch,
            &mut slots,
            &phase,
            &mut t,
            &mut Rng::new(1),
            &mut counts,
        );
        assert!(slots[0].pending.is_none());
        assert_eq!(
            slots[1].pending.as_ref().map(|p| p.difficulty.clone()),
            Some(vec![0.45])
        );
        assert_eq!(counts.proposals, 1);
        let made: Vec<(usize, &str)> = batch
            .proposals
            .iter()
            .map(|p| (p.slot, p.verdict))
            .collect();
        assert_eq!(made, vec![(1, "pending")]);
    }
}
