//! Environment adaptation (framework/METHOD.md, step 7): the direction rule, the accept/reject gate,
//! the per-slot state machine (running accuracy, pending proposal) and the [`Proposer`]
//! interface with its two model-free implementations, [`Static`] and [`Threshold`]. The GP
//! proposer is a plugin in `rlany-envs` because it pulls in egobox-gp.
//!
//! Everything here is pure: no tensors, and every random draw comes from the [`Rng`] passed in.
//!
//! The loop, per task slot and training step:
//! 1. the slot draws a fresh task (a new seed) at its difficulty; its group of G rollouts is
//!    [`AdaptSlot::record`]ed into the slot's running accuracy (its groups of the last
//!    [`GateSpec::window`] steps at this difficulty) and [`Proposer::observe`]d;
//! 2. if the slot has a pending proposal, the proposal is rolled out on a *rewrite* of the
//!    same step's task (same seed, the proposed difficulty) and [`AdaptSlot::resolve`]
//!    applies the [`accept`] gate to the pair: the rewrite's accuracy against the original
//!    task's, same policy, same step. Accepted proposals replace the slot's difficulty (and
//!    their rollouts are trained on); rejected ones are dropped;
//! 3. otherwise [`AdaptSlot::maybe_propose`] asks the proposer for a new difficulty when the
//!    running accuracy rests on enough rollouts and [`direction`] says the slot is too easy or
//!    too hard; a proposal whose rewrite of the next step's task would be the same task is
//!    not made. It becomes pending and is rolled out at the next step.
//!
//! Why: a proposal triggered by one lucky group and gated against another single task's
//! accuracy is accepted by regression to the mean; the running estimate decides *when*, the
//! paired rewrite decides *whether* (see the `gate_*` tests).

use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// Which way a slot's difficulty should move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// The slot is too easy (acc ≥ α_high).
    Harder,
    /// The slot is too hard (acc ≤ α_low).
    Easier,
}

/// framework/METHOD.md: `acc ≥ α_high` → [`Direction::Harder`]; `acc ≤ α_low` → [`Direction::Easier`];
/// otherwise (or a NaN accuracy) `None`. `band = (α_low, α_high)`.
pub fn direction(acc: f64, band: (f64, f64)) -> Option<Direction> {
    let (lo, hi) = band;
    if acc.is_nan() {
        None
    } else if acc >= hi {
        Some(Direction::Harder)
    } else if acc <= lo {
        Some(Direction::Easier)
    } else {
        None
    }
}

/// The accept/reject gate of framework/METHOD.md for a pending proposal whose rollout gave `new_acc`,
/// proposed from a slot at accuracy `acc`:
/// - Harder: accept iff `new_acc < acc` and `new_acc ≥ α_low`;
/// - Easier: accept iff `new_acc > acc` and `new_acc ≤ α_high`;
/// - never when `new_acc == 0` (nor when either accuracy is NaN).
pub fn accept(direction: Direction, acc: f64, new_acc: f64, band: (f64, f64)) -> bool {
    let (lo, hi) = band;
    if new_acc.is_nan() || acc.is_nan() || new_acc == 0.0 {
        return false;
    }
    match direction {
        Direction::Harder => new_acc < acc && new_acc >= lo,
        Direction::Easier => new_acc > acc && new_acc <= hi,
    }
}

/// Critic feedback for one slot: per difficulty dimension, the fraction of the slot's
/// *flagged* steps that are blamed on that dimension (see [`Critic`] for what flags and
/// blames); plus the totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CriticFeedback {
    /// `blame[j]` = flagged steps attributed to dimension `j` / `flagged_steps` (0 when none).
    pub blame: Vec<f64>,
    /// Flagged steps (by default: all m verdicts −1).
    pub flagged_steps: usize,
    /// All judged steps of the slot.
    pub steps: usize,
}

impl CriticFeedback {
    /// Feedback for a `k`-dimensional difficulty space built from per-step records
    /// `(flagged, blamed_dims)`; out-of-range dimensions are ignored.
    pub fn from_steps<'a>(k: usize, steps: impl IntoIterator<Item = (bool, &'a [usize])>) -> Self {
        let mut counts = vec![0usize; k];
        let (mut flagged, mut total) = (0usize, 0usize);
        for (all_negative, dims) in steps {
            total += 1;
            if all_negative {
                flagged += 1;
                let mut seen = vec![false; k];
                for &j in dims {
                    if j < k && !seen[j] {
                        seen[j] = true;
                        counts[j] += 1;
                    }
                }
            }
        }
        let blame = counts
            .iter()
            .map(|&c| {
                if flagged == 0 {
                    0.0
                } else {
                    c as f64 / flagged as f64
                }
            })
            .collect();
        Self {
            blame,
            flagged_steps: flagged,
            steps: total,
        }
    }

    /// The dimensions the critic flags (`blame > 0`) among `0..k`; all of `0..k` when none is.
    pub fn flagged_dims(&self, k: usize) -> Vec<usize> {
        let flagged: Vec<usize> = (0..k)
            .filter(|&j| self.blame.get(j).is_some_and(|b| *b > 0.0))
            .collect();
        if flagged.is_empty() {
            (0..k).collect()
        } else {
            flagged
        }
    }
}

/// Where the critic feedback's blame comes from (`critic:` in an experiment file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Critic {
    /// What a real system has: the steps the judge flags (all m verdicts −1), each blamed on
    /// the dimensions the environment says the step exercises ([`crate::StepResult::dims`]).
    /// Without a judge nothing is flagged and every dimension moves.
    #[default]
    Judge,
    /// Upper bound, not the method: the oracle's wrong steps and its attribution
    /// ([`crate::StepResult::blame`]).
    Oracle,
}

/// One observation of accuracy at a difficulty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The difficulty the tasks were drawn at, in `[0, 1]^k`.
    pub difficulty: Vec<f64>,
    /// The training step of the rollout.
    pub step: usize,
    /// Fraction of the group's trajectories with outcome +1.
    pub acc: f64,
    /// Number of trajectories behind `acc` (G).
    pub group_size: usize,
}

/// One 1-D slice of a proposer's model: predicted accuracy along dimension `dim`, the other
/// coordinates held at the slice centre.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PosteriorSlice {
    /// The difficulty dimension varied along the slice.
    pub dim: usize,
    /// The values of that dimension (in `[0, 1]`).
    pub grid: Vec<f64>,
    /// Predicted accuracy at each grid point.
    pub mean_acc: Vec<f64>,
    /// Predicted standard deviation of the accuracy at each grid point (≥ 0).
    pub sd_acc: Vec<f64>,
}

/// A proposer model's predicted accuracy, for reports (one slice per dimension).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Posterior {
    /// Training step the prediction is for.
    pub step: usize,
    /// One slice per difficulty dimension.
    pub dims: Vec<PosteriorSlice>,
    /// The accuracy the proposer aims at, if it has one.
    #[serde(default)]
    pub target: Option<f64>,
    /// The observations the model was fitted on (for plotting beside it).
    #[serde(default)]
    pub observations: Vec<Observation>,
}

/// Errors of the adaptation machinery.
#[derive(Debug, thiserror::Error)]
pub enum AdaptError {
    /// A saved proposer state could not be restored.
    #[error("cannot restore the state of proposer `{proposer}`: {reason}")]
    State {
        /// The proposer's name.
        proposer: String,
        /// What was wrong.
        reason: String,
    },
}

impl AdaptError {
    /// A [`AdaptError::State`] for `proposer`.
    pub fn state(proposer: &str, reason: impl Into<String>) -> Self {
        Self::State {
            proposer: proposer.to_string(),
            reason: reason.into(),
        }
    }
}

/// What a proposer is asked: a new difficulty for one task slot.
#[derive(Clone, Copy, Debug)]
pub struct ProposalRequest<'a> {
    /// The slot's difficulty, in `[0, 1]^k`.
    pub current: &'a [f64],
    /// The slot's estimated accuracy there.
    pub acc: f64,
    /// Harder (the slot is too easy) or easier (too hard).
    pub direction: Direction,
    /// Which difficulty dimensions the critic flags.
    pub feedback: &'a CriticFeedback,
    /// The training step.
    pub step: usize,
}

impl<'a> ProposalRequest<'a> {
    /// The request of a slot at `current` with accuracy `acc`, moving `direction`.
    pub fn new(
        current: &'a [f64],
        acc: f64,
        direction: Direction,
        feedback: &'a CriticFeedback,
        step: usize,
    ) -> Self {
        Self {
            current,
            acc,
            direction,
            feedback,
            step,
        }
    }
}

/// Proposes new difficulties for task slots (framework/METHOD.md step 7: `Static`, `Threshold`,
/// `Gp`). Only [`Proposer::propose`] is required: a proposer without a model of its own
/// neither observes, nor keeps a state, nor has a posterior to plot.
pub trait Proposer: Send {
    /// A new difficulty (in `[0, 1]^k`, as long as `request.current`) for the slot.
    fn propose(&mut self, request: &ProposalRequest<'_>, rng: &mut Rng) -> Vec<f64>;
    /// Record an observed accuracy (every rollout of every slot and every pending proposal).
    fn observe(&mut self, _obs: Observation) {}
    /// Everything needed to continue exactly after a resume (observations, fitted
    /// hyper-parameters…); `Null` for a proposer whose settings say it all. Implement it
    /// together with [`Proposer::load_state`].
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Restore what [`Proposer::state`] returned. The default keeps no state: it accepts
    /// `Null` only, so a checkpoint holding a state this proposer cannot read is refused.
    fn load_state(&mut self, state: serde_json::Value) -> Result<(), AdaptError> {
        match state {
            serde_json::Value::Null => Ok(()),
            _ => Err(AdaptError::state(
                "(stateless)",
                "the checkpoint holds a state, but this proposer keeps none",
            )),
        }
    }
    /// For reports: the model's predicted accuracy (mean, sd) on 1-D slices through `center`,
    /// one per dimension, `points` per slice, at `step`. `None` (the default) for proposers
    /// without a model.
    fn posterior(&self, _center: &[f64], _step: usize, _points: usize) -> Option<Posterior> {
        None
    }
}

/// Clamp every coordinate to `[0, 1]` (NaN → 0).
pub fn clamp_unit(d: &[f64]) -> Vec<f64> {
    d.iter()
        .map(|x| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) })
        .collect()
}

/// The paper's rule on a numeric difficulty: `current ± step` (+ for Harder, − for Easier)
/// along the dimensions the critic flags (all dimensions when none is flagged), clamped to
/// `[0, 1]`.
pub fn threshold_move(
    current: &[f64],
    direction: Direction,
    feedback: &CriticFeedback,
    step: f64,
) -> Vec<f64> {
    let sign = match direction {
        Direction::Harder => 1.0,
        Direction::Easier => -1.0,
    };
    let step = if step.is_finite() { step } else { 0.0 };
    let mut d = current.to_vec();
    for j in feedback.flagged_dims(current.len()) {
        d[j] += sign * step;
    }
    clamp_unit(&d)
}

/// Never changes the difficulty (the ablation baseline). The trainer need not even call it.
#[derive(Clone, Debug, Default)]
pub struct Static;

impl Proposer for Static {
    fn propose(&mut self, request: &ProposalRequest<'_>, _rng: &mut Rng) -> Vec<f64> {
        request.current.to_vec()
    }
}

/// `d ± step` along the dimensions the critic flags (all if none), clamped to `[0, 1]`:
/// the paper's rule on our numeric difficulty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// The move along each flagged dimension.
    pub step: f64,
}

impl Default for Threshold {
    fn default() -> Self {
        Self { step: 0.1 }
    }
}

impl Proposer for Threshold {
    fn propose(&mut self, r: &ProposalRequest<'_>, _rng: &mut Rng) -> Vec<f64> {
        threshold_move(r.current, r.direction, r.feedback, self.step)
    }

    /// Its step is the experiment's own setting, so it keeps no state; checkpoints written
    /// before 2026-12-06 hold it as `step_bits`, which is the same setting and is ignored.
    fn load_state(&mut self, _state: serde_json::Value) -> Result<(), AdaptError> {
        Ok(())
    }
}

/// How a task slot's accuracy is estimated and when it may propose (the loop-level part of
/// the gate, shared by every proposer; `gate: (...)` in an experiment file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateSpec {
    /// The slot's running accuracy pools its groups of the last `window` training steps at
    /// its current difficulty (reset when the difficulty changes).
    pub window: usize,
    /// A slot proposes only once its running accuracy rests on at least this many rollouts.
    pub min_rollouts: usize,
}

impl Default for GateSpec {
    fn default() -> Self {
        Self {
            window: 4,
            min_rollouts: 16,
        }
    }
}

/// A proposal waiting for its rollout (made at one step, rolled out at the next as a
/// rewrite of that step's task of the slot).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// The proposed difficulty.
    pub difficulty: Vec<f64>,
    /// Which way it was meant to move.
    pub direction: Direction,
    /// The slot's running accuracy when it was proposed (what triggered it).
    pub base_acc: f64,
    /// The training step it was proposed at.
    pub proposed_at: usize,
}

/// The adaptation state of one task slot: its difficulty, its recent outcomes there and at
/// most one pending proposal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptSlot {
    /// Current difficulty in `[0, 1]^k`.
    pub difficulty: Vec<f64>,
    /// A proposal to roll out at the next step, if any.
    pub pending: Option<Pending>,
    /// `(successes, rollouts)` of the slot's groups at its current difficulty, one entry per
    /// step, newest last, at most [`GateSpec::window`] entries.
    #[serde(default)]
    pub recent: Vec<(usize, usize)>,
}

/// Running totals for the `env/proposals`, `env/accepted`, `env/rejected` metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptCounts {
    /// Proposals made.
    pub proposals: usize,
    /// Proposals accepted by the gate.
    pub accepted: usize,
    /// Proposals rejected by the gate.
    pub rejected: usize,
    /// Proposals not made because the rewrite left the task unchanged.
    #[serde(default)]
    pub unchanged: usize,
    /// Accepted proposals that made the slot harder.
    #[serde(default)]
    pub accepted_harder: usize,
    /// Accepted proposals that made the slot easier.
    #[serde(default)]
    pub accepted_easier: usize,
}

impl AdaptSlot {
    /// A slot at `difficulty` with no history and nothing pending.
    pub fn new(difficulty: Vec<f64>) -> Self {
        Self {
            difficulty,
            pending: None,
            recent: Vec::new(),
        }
    }

    /// Records one group of the slot's own task at its current difficulty.
    pub fn record(&mut self, successes: usize, rollouts: usize, gate: &GateSpec) {
        self.recent.push((successes, rollouts));
        let keep = gate.window.max(1);
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
    }

    /// `(accuracy, rollouts)` of the slot's recent groups (NaN accuracy when there are none).
    pub fn estimate(&self) -> (f64, usize) {
        let (s, n) = self
            .recent
            .iter()
            .fold((0, 0), |(s, n), &(a, b)| (s + a, n + b));
        let acc = if n == 0 {
            f64::NAN
        } else {
            s as f64 / n as f64
        };
        (acc, n)
    }

    /// Apply the gate to the pending proposal. Its rewrite of this step's task gave
    /// `new = (successes, rollouts)`; the same task at the slot's difficulty gave accuracy
    /// `paired_acc` in the same step. Returns `None` when nothing was pending, else whether
    /// it was accepted; accepted, it replaces the slot's difficulty and its group starts the
    /// slot's new history. The pending proposal is cleared either way.
    pub fn resolve(
        &mut self,
        paired_acc: f64,
        new: (usize, usize),
        band: (f64, f64),
        counts: &mut AdaptCounts,
    ) -> Option<bool> {
        let pending = self.pending.take()?;
        let new_acc = if new.1 == 0 {
            f64::NAN
        } else {
            new.0 as f64 / new.1 as f64
        };
        let ok = accept(pending.direction, paired_acc, new_acc, band);
        if ok {
            self.difficulty = pending.difficulty;
            self.recent = vec![new];
            counts.accepted += 1;
            match pending.direction {
                Direction::Harder => counts.accepted_harder += 1,
                Direction::Easier => counts.accepted_easier += 1,
            }
        } else {
            counts.rejected += 1;
        }
        Some(ok)
    }

    /// When nothing is pending, the running accuracy rests on at least
    /// [`GateSpec::min_rollouts`] rollouts and [`direction`] asks for a move: ask `proposer`
    /// for a new difficulty and make it pending — unless `changes(proposal)` says the rewrite
    /// of the task it will be tried on is the same task (counted in
    /// [`AdaptCounts::unchanged`]), or it equals the current difficulty (e.g. [`Static`], or
    /// a clamp at the edge of `[0, 1]^k`). Returns the direction of the new proposal, if one
    /// was made.
    pub fn maybe_propose(
        &mut self,
        ctx: &ProposeContext<'_>,
        proposer: &mut dyn Proposer,
        rng: &mut Rng,
        counts: &mut AdaptCounts,
        changes: impl Fn(&[f64]) -> bool,
    ) -> Option<Direction> {
        if self.pending.is_some() {
            return None;
        }
        let (acc, n) = self.estimate();
        if n < ctx.gate.min_rollouts.max(1) {
            return None;
        }
        let dir = direction(acc, ctx.band)?;
        let request = ProposalRequest {
            current: &self.difficulty,
            acc,
            direction: dir,
            feedback: ctx.feedback,
            step: ctx.step,
        };
        let proposal = proposer.propose(&request, rng);
        let proposal = clamp_unit(&proposal);
        if proposal.len() != self.difficulty.len() || proposal == self.difficulty {
            return None;
        }
        if !changes(&proposal) {
            counts.unchanged += 1;
            return None;
        }
        counts.proposals += 1;
        self.pending = Some(Pending {
            difficulty: proposal,
            direction: dir,
            base_acc: acc,
            proposed_at: ctx.step,
        });
        Some(dir)
    }
}

/// What a slot's proposal depends on besides the slot and the proposer.
#[derive(Clone, Copy, Debug)]
pub struct ProposeContext<'a> {
    /// `(α_low, α_high)`.
    pub band: (f64, f64),
    /// Running-accuracy settings.
    pub gate: &'a GateSpec,
    /// The slot's critic feedback.
    pub feedback: &'a CriticFeedback,
    /// The training step.
    pub step: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    const BAND: (f64, f64) = (0.2, 0.8);

    #[test]
    fn direction_every_branch_and_boundaries() {
        assert_eq!(direction(1.0, BAND), Some(Direction::Harder));
        assert_eq!(direction(0.8, BAND), Some(Direction::Harder)); // boundary: ≥ α_high
        assert_eq!(direction(0.875, BAND), Some(Direction::Harder));
        assert_eq!(direction(0.79, BAND), None);
        assert_eq!(direction(0.5, BAND), None);
        assert_eq!(direction(0.21, BAND), None);
        assert_eq!(direction(0.2, BAND), Some(Direction::Easier)); // boundary: ≤ α_low
        assert_eq!(direction(0.125, BAND), Some(Direction::Easier));
        assert_eq!(direction(0.0, BAND), Some(Direction::Easier));
        assert_eq!(direction(f64::NAN, BAND), None);
    }

    #[test]
    fn accept_gate_every_branch_and_boundaries() {
        use Direction::{Easier, Harder};
        // Harder: new_acc < acc and new_acc ≥ α_low.
        assert!(accept(Harder, 1.0, 0.5, BAND));
        assert!(accept(Harder, 0.875, 0.2, BAND)); // boundary: new_acc = α_low accepted
        assert!(!accept(Harder, 0.875, 0.125, BAND)); // overshoot below α_low
        assert!(!accept(Harder, 0.875, 0.875, BAND)); // not strictly lower
        assert!(!accept(Harder, 0.875, 1.0, BAND)); // easier, not harder
        assert!(!accept(Harder, 0.875, 0.0, BAND)); // zero: never
        assert!(!accept(Harder, 0.875, 0.0, (0.0, 0.8))); // zero even if α_low = 0
        // Easier: new_acc > acc and new_acc ≤ α_high.
        assert!(accept(Easier, 0.0, 0.5, BAND));
        assert!(accept(Easier, 0.125, 0.8, BAND)); // boundary: new_acc = α_high accepted
        assert!(!accept(Easier, 0.125, 0.875, BAND)); // overshoot above α_high
        assert!(!accept(Easier, 0.125, 0.125, BAND)); // not strictly higher
        assert!(!accept(Easier, 0.125, 0.0, BAND)); // lower, and zero
        assert!(!accept(Easier, 0.0, 0.0, BAND)); // zero: never
        // NaN never passes.
        assert!(!accept(Harder, 0.9, f64::NAN, BAND));
        assert!(!accept(Easier, f64::NAN, 0.5, BAND));
    }

    #[test]
    fn critic_feedback_from_steps() {
        let a: &[usize] = &[0];
        let ab: &[usize] = &[0, 2, 2, 7]; // duplicate and out-of-range dims ignored
        let none: &[usize] = &[];
        let fb = CriticFeedback::from_steps(3, [(true, a), (true, ab), (false, ab), (true, none)]);
        assert_eq!(fb.steps, 4);
        assert_eq!(fb.flagged_steps, 3);
        assert_eq!(fb.blame, vec![2.0 / 3.0, 0.0, 1.0 / 3.0]);
        assert_eq!(fb.flagged_dims(3), vec![0, 2]);
        let empty = CriticFeedback::from_steps(2, std::iter::empty());
        assert_eq!(empty.blame, vec![0.0, 0.0]);
        assert_eq!(empty.flagged_dims(2), vec![0, 1]);
        assert_eq!(CriticFeedback::default().flagged_dims(2), vec![0, 1]);
    }

    fn req<'a>(
        current: &'a [f64],
        acc: f64,
        direction: Direction,
        feedback: &'a CriticFeedback,
    ) -> ProposalRequest<'a> {
        ProposalRequest::new(current, acc, direction, feedback, 0)
    }

    #[test]
    fn threshold_moves_exactly_step_on_flagged_dims_and_clamps() {
        let mut rng = Rng::new(0);
        let mut t = Threshold { step: 0.125 };
        let none = CriticFeedback::default();
        let d = t.propose(&req(&[0.25, 0.5], 0.9, Direction::Harder, &none), &mut rng);
        assert_eq!(d, vec![0.375, 0.625]); // no flags: all dims
        let d = t.propose(&req(&[0.25, 0.5], 0.1, Direction::Easier, &none), &mut rng);
        assert_eq!(d, vec![0.125, 0.375]);
        let fb = CriticFeedback {
            blame: vec![0.0, 1.0],
            flagged_steps: 2,
            steps: 5,
        };
        let d = t.propose(&req(&[0.25, 0.5], 0.9, Direction::Harder, &fb), &mut rng);
        assert_eq!(d, vec![0.25, 0.625]); // only the flagged dim
        let d = t.propose(&req(&[0.25, 0.5], 0.1, Direction::Easier, &fb), &mut rng);
        assert_eq!(d, vec![0.25, 0.375]);
        // Clamping at both edges.
        let d = t.propose(
            &req(&[0.95, 0.0625], 0.9, Direction::Harder, &none),
            &mut rng,
        );
        assert_eq!(d, vec![1.0, 0.1875]);
        let d = t.propose(&req(&[0.05, 1.0], 0.1, Direction::Easier, &none), &mut rng);
        assert_eq!(d, vec![0.0, 0.875]);
        // No state: the step is the experiment's; an older checkpoint's `step_bits` is accepted.
        assert_eq!(t.state(), serde_json::Value::Null);
        let old = serde_json::json!({ "step_bits": 0.125f64.to_bits() });
        assert!(t.load_state(old.clone()).is_ok());
        // Static keeps none either, and refuses one it cannot read.
        assert!(Static.load_state(serde_json::Value::Null).is_ok());
        assert!(Static.load_state(old).is_err());
    }

    #[test]
    fn static_never_moves() {
        let mut s = Static;
        let mut rng = Rng::new(1);
        let none = CriticFeedback::default();
        let request = ProposalRequest {
            current: &[0.3, 0.7],
            acc: 1.0,
            direction: Direction::Harder,
            feedback: &none,
            step: 3,
        };
        let d = s.propose(&request, &mut rng);
        assert_eq!(d, vec![0.3, 0.7]);
        assert!(s.posterior(&[0.3, 0.7], 3, 5).is_none());
        // The slot machine never makes a no-op pending proposal.
        let mut slot = AdaptSlot::new(vec![0.3, 0.7]);
        slot.record(16, 16, &GATE);
        let mut counts = AdaptCounts::default();
        let fb = CriticFeedback::default();
        let made = slot.maybe_propose(&ctx(&fb, 0), &mut s, &mut rng, &mut counts, |_| true);
        assert_eq!(made, None);
        assert_eq!(counts, AdaptCounts::default());
    }

    const GATE: GateSpec = GateSpec {
        window: 2,
        min_rollouts: 16,
    };

    fn ctx(feedback: &CriticFeedback, step: usize) -> ProposeContext<'_> {
        ProposeContext {
            band: BAND,
            gate: &GATE,
            feedback,
            step,
        }
    }

    #[test]
    fn running_estimate_window_and_min_rollouts() {
        let mut t = Threshold { step: 0.25 };
        let mut rng = Rng::new(2);
        let fb = CriticFeedback::default();
        let mut counts = AdaptCounts::default();
        let mut slot = AdaptSlot::new(vec![0.0, 0.5]);
        assert!(slot.estimate().0.is_nan());
        // One group of 8 at 8/8: too few rollouts to propose.
        slot.record(8, 8, &GATE);
        assert_eq!(slot.estimate(), (1.0, 8));
        assert_eq!(
            slot.maybe_propose(&ctx(&fb, 0), &mut t, &mut rng, &mut counts, |_| true),
            None
        );
        // 8/8 then 6/8: 14/16 = 0.875 ≥ 0.8 → harder.
        slot.record(6, 8, &GATE);
        assert_eq!(slot.estimate(), (0.875, 16));
        // A rewrite that leaves the task unchanged is not made.
        assert_eq!(
            slot.maybe_propose(&ctx(&fb, 1), &mut t, &mut rng, &mut counts, |_| false),
            None
        );
        assert_eq!((counts.proposals, counts.unchanged), (0, 1));
        // The window keeps the last 2 groups: 6/8 + 2/8 = 0.5 → mid-band, no proposal.
        slot.record(2, 8, &GATE);
        assert_eq!(slot.estimate(), (0.5, 16));
        assert_eq!(
            slot.maybe_propose(&ctx(&fb, 2), &mut t, &mut rng, &mut counts, |_| true),
            None
        );
        slot.record(8, 8, &GATE);
        slot.record(7, 8, &GATE); // 15/16
        let dir = slot.maybe_propose(&ctx(&fb, 3), &mut t, &mut rng, &mut counts, |_| true);
        assert_eq!(dir, Some(Direction::Harder));
        let p = slot.pending.clone().expect("pending");
        assert_eq!(p.difficulty, vec![0.25, 0.75]);
        assert_eq!((p.base_acc, p.proposed_at), (15.0 / 16.0, 3));
        // While pending, no second proposal.
        assert_eq!(
            slot.maybe_propose(&ctx(&fb, 3), &mut t, &mut rng, &mut counts, |_| true),
            None
        );
        // Accepted against the paired original (8/8): the rewrite's 5/8 is lower and in band;
        // it replaces the slot and starts its history.
        assert_eq!(slot.resolve(1.0, (5, 8), BAND, &mut counts), Some(true));
        assert_eq!(slot.difficulty, vec![0.25, 0.75]);
        assert_eq!(slot.recent, vec![(5, 8)]);
        assert_eq!(slot.resolve(0.5, (5, 8), BAND, &mut counts), None);
        // Too hard: an easier proposal, rejected because it overshoots α_high; the slot and
        // its history stay.
        slot.record(0, 8, &GATE); // 5/16: mid-band
        assert_eq!(
            slot.maybe_propose(&ctx(&fb, 4), &mut t, &mut rng, &mut counts, |_| true),
            None
        );
        slot.record(0, 8, &GATE); // 0/16
        let dir = slot.maybe_propose(&ctx(&fb, 5), &mut t, &mut rng, &mut counts, |_| true);
        assert_eq!(dir, Some(Direction::Easier));
        assert_eq!(slot.resolve(0.125, (8, 8), BAND, &mut counts), Some(false));
        assert_eq!(slot.difficulty, vec![0.25, 0.75]);
        assert_eq!(slot.recent, vec![(0, 8), (0, 8)]);
        assert_eq!(
            counts,
            AdaptCounts {
                proposals: 2,
                accepted: 1,
                rejected: 1,
                unchanged: 1,
                accepted_harder: 1,
                accepted_easier: 0,
            }
        );
        // Still too hard: the next easier proposal lands in band and is accepted; the counts
        // say in which direction each accepted proposal moved the slot.
        let dir = slot.maybe_propose(&ctx(&fb, 6), &mut t, &mut rng, &mut counts, |_| true);
        assert_eq!(dir, Some(Direction::Easier));
        assert_eq!(slot.resolve(0.125, (3, 8), BAND, &mut counts), Some(true));
        assert_eq!(
            (
                counts.accepted,
                counts.accepted_harder,
                counts.accepted_easier
            ),
            (2, 1, 1)
        );
    }

    /// Binomial(n, p) draw.
    fn binomial(n: usize, p: f64, rng: &mut Rng) -> usize {
        (0..n).filter(|_| rng.bernoulli(p)).count()
    }

    /// P(X = k) for X ~ Binomial(n, p).
    fn binomial_pmf(n: usize, p: f64, k: usize) -> f64 {
        let mut c = 1.0;
        for i in 0..k {
            c *= (n - i) as f64 / (i + 1) as f64;
        }
        c * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32)
    }

    /// The acceptance probability of a harder proposal that the accuracy curve implies: the
    /// paired original's G rollouts at `p0`, the rewrite's at `p1`, independent.
    fn implied_accept_rate(g: usize, p0: f64, p1: f64) -> f64 {
        let mut rate = 0.0;
        for x in 0..=g {
            for y in 0..=g {
                if accept(
                    Direction::Harder,
                    x as f64 / g as f64,
                    y as f64 / g as f64,
                    BAND,
                ) {
                    rate += binomial_pmf(g, p0, x) * binomial_pmf(g, p1, y);
                }
            }
        }
        rate
    }

    /// A synthetic environment with a known accuracy curve, `acc(d) = 0.95 − 0.6·d`, driven
    /// through the slot machine the way the loop drives it: each step the slot's group, and
    /// when pending the rewrite's group, are G = 8 Bernoulli draws at the true accuracy.
    /// Returns the acceptance rate of harder proposals from the slot at `d0` to `d0 + step`.
    fn simulated_accept_rate(d0: f64, step: f64, trials: usize, seed: u64) -> f64 {
        let curve = |d: f64| 0.95 - 0.6 * d;
        let mut rng = Rng::new(seed);
        let (mut made, mut accepted) = (0, 0);
        let fb = CriticFeedback::default();
        let mut t = Threshold { step };
        let mut counts = AdaptCounts::default();
        while made < trials {
            let mut slot = AdaptSlot::new(vec![d0]);
            for s in 0..50 {
                let own = binomial(8, curve(slot.difficulty[0]), &mut rng);
                if slot.pending.is_some() {
                    let d1 = slot.pending.as_ref().map_or(d0, |p| p.difficulty[0]);
                    let new = binomial(8, curve(d1), &mut rng);
                    slot.record(own, 8, &GATE);
                    made += 1;
                    if slot.resolve(own as f64 / 8.0, (new, 8), BAND, &mut counts) == Some(true) {
                        accepted += 1;
                    }
                    break;
                }
                slot.record(own, 8, &GATE);
                slot.maybe_propose(&ctx(&fb, s), &mut t, &mut rng, &mut counts, |_| true);
            }
        }
        accepted as f64 / made as f64
    }

    #[test]
    fn gate_accepts_harder_proposals_at_the_rate_the_curve_implies() {
        // From an easy slot (true acc 0.95) to d = 0.5 (true acc 0.65): the implied rate is
        // computed from the two binomials alone; the simulation through the slot machine
        // (trigger on the running estimate, gate on the paired rewrite) matches it.
        let n = 4000;
        for (step, seed) in [(0.5, 11), (0.05, 12)] {
            let implied = implied_accept_rate(8, 0.95, 0.95 - 0.6 * step);
            let seen = simulated_accept_rate(0.0, step, n, seed);
            let se = (implied * (1.0 - implied) / n as f64).sqrt();
            assert!(
                (seen - implied).abs() < 4.0 * se,
                "step {step}: accepted {seen:.3}, the curve implies {implied:.3} ± {se:.3}"
            );
        }
        // A real move is accepted far more often than a negligible one.
        assert!(implied_accept_rate(8, 0.95, 0.65) > 0.8);
        assert!(implied_accept_rate(8, 0.95, 0.92) < 0.5);
    }

    #[test]
    fn gate_on_a_single_triggering_group_is_accepted_by_regression_to_the_mean() {
        // The design this replaces: trigger on one group (acc ≥ 0.8) and compare the proposal's
        // group with that same triggering accuracy. For a proposal that changes nothing (true
        // acc 0.75 on both sides) it accepts far more often than a fair paired comparison.
        let mut rng = Rng::new(5);
        let (mut made, mut accepted) = (0, 0);
        while made < 4000 {
            let trigger = binomial(8, 0.75, &mut rng) as f64 / 8.0;
            if direction(trigger, BAND) != Some(Direction::Harder) {
                continue;
            }
            made += 1;
            let new = binomial(8, 0.75, &mut rng) as f64 / 8.0;
            accepted += usize::from(accept(Direction::Harder, trigger, new, BAND));
        }
        let biased = accepted as f64 / made as f64;
        let fair = implied_accept_rate(8, 0.75, 0.75);
        assert!(biased > fair + 0.2, "biased {biased:.3} vs fair {fair:.3}");
    }
}
