//! Environment adaptation (framework/METHOD.md, step 7): the direction rule, the accept/reject gate,
//! the per-slot pending-proposal state machine and the [`Proposer`] interface with its two
//! model-free implementations, [`Static`] and [`Threshold`]. The GP proposer lives in
//! `rlany-envs` (`rlany_envs::gp::Gp`) because it pulls in egobox-gp.
//!
//! Everything here is pure: no tensors, and every random draw comes from the [`Rng`] passed in.
//!
//! The loop, per task slot and training step:
//! 1. the slot's tasks are rolled out at its difficulty, giving `acc`; every rollout is
//!    [`Proposer::observe`]d;
//! 2. if the slot has a pending proposal, its rollout gives `new_acc` (also observed) and
//!    [`AdaptSlot::resolve`] applies the [`accept`] gate: accepted proposals replace the
//!    slot's difficulty (and their rollouts are trained on), rejected ones are dropped;
//! 3. otherwise [`AdaptSlot::maybe_propose`] asks the proposer for a new difficulty when
//!    [`direction`] says the slot is too easy or too hard; it becomes pending and is rolled
//!    out at the next step.

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

/// Critic feedback for one slot, from the judge: per difficulty dimension, the fraction of the
/// slot's *failed* steps (steps where all m verdicts were −1) that the environment attributed
/// to that dimension ([`crate::Episode::attribute_failure`]); plus the totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CriticFeedback {
    /// `blame[j]` = flagged steps attributed to dimension `j` / `flagged_steps` (0 when none).
    pub blame: Vec<f64>,
    /// Steps where all m verdicts were −1.
    pub flagged_steps: usize,
    /// All judged steps of the slot.
    pub steps: usize,
}

impl CriticFeedback {
    /// Feedback for a `k`-dimensional difficulty space built from per-step records
    /// `(all_verdicts_negative, attributed_dims)`; out-of-range dimensions are ignored.
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

/// Proposes new difficulties for task slots (framework/METHOD.md step 7: `Static`, `Threshold`, `Gp`).
pub trait Proposer: Send {
    /// Record an observed accuracy (every rollout of every slot and every pending proposal).
    fn observe(&mut self, obs: Observation);
    /// A new difficulty (in `[0, 1]^k`, same length as `current`) for a slot currently at
    /// `current` with accuracy `acc`, moving in `direction`.
    fn propose(
        &mut self,
        current: &[f64],
        acc: f64,
        direction: Direction,
        feedback: &CriticFeedback,
        step: usize,
        rng: &mut Rng,
    ) -> Vec<f64>;
    /// Everything needed to continue exactly after a resume (observations, hyperparameters...).
    fn state(&self) -> serde_json::Value;
    /// Restore what [`Proposer::state`] returned.
    fn load_state(&mut self, state: serde_json::Value) -> Result<(), AdaptError>;
    /// For reports: the model's predicted accuracy (mean, sd) on 1-D slices through `center`,
    /// one per dimension, `points` per slice, at `step`. `None` for proposers without a model.
    fn posterior(&self, center: &[f64], step: usize, points: usize) -> Option<Posterior>;
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
    fn observe(&mut self, _obs: Observation) {}

    fn propose(
        &mut self,
        current: &[f64],
        _acc: f64,
        _direction: Direction,
        _feedback: &CriticFeedback,
        _step: usize,
        _rng: &mut Rng,
    ) -> Vec<f64> {
        current.to_vec()
    }

    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    fn load_state(&mut self, _state: serde_json::Value) -> Result<(), AdaptError> {
        Ok(())
    }

    fn posterior(&self, _center: &[f64], _step: usize, _points: usize) -> Option<Posterior> {
        None
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
    fn observe(&mut self, _obs: Observation) {}

    fn propose(
        &mut self,
        current: &[f64],
        _acc: f64,
        direction: Direction,
        feedback: &CriticFeedback,
        _step: usize,
        _rng: &mut Rng,
    ) -> Vec<f64> {
        threshold_move(current, direction, feedback, self.step)
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({ "step_bits": self.step.to_bits() })
    }

    fn load_state(&mut self, state: serde_json::Value) -> Result<(), AdaptError> {
        let bits = state
            .get("step_bits")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| AdaptError::state("threshold", "missing `step_bits`"))?;
        self.step = f64::from_bits(bits);
        Ok(())
    }

    fn posterior(&self, _center: &[f64], _step: usize, _points: usize) -> Option<Posterior> {
        None
    }
}

/// A proposal waiting for its rollout (made at one step, rolled out at the next).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// The proposed difficulty.
    pub difficulty: Vec<f64>,
    /// Which way it was meant to move.
    pub direction: Direction,
    /// The slot's accuracy when it was proposed (the gate's `acc`).
    pub base_acc: f64,
    /// The training step it was proposed at.
    pub proposed_at: usize,
}

/// The adaptation state of one task slot: its difficulty and at most one pending proposal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptSlot {
    /// Current difficulty in `[0, 1]^k`.
    pub difficulty: Vec<f64>,
    /// A proposal to roll out at the next step, if any.
    pub pending: Option<Pending>,
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
}

impl AdaptSlot {
    /// A slot at `difficulty` with nothing pending.
    pub fn new(difficulty: Vec<f64>) -> Self {
        Self {
            difficulty,
            pending: None,
        }
    }

    /// Apply the gate to the pending proposal whose rollout gave `new_acc`. Returns `None`
    /// when nothing was pending, else whether it was accepted (then it replaced the slot's
    /// difficulty). The pending proposal is cleared either way.
    pub fn resolve(
        &mut self,
        new_acc: f64,
        band: (f64, f64),
        counts: &mut AdaptCounts,
    ) -> Option<bool> {
        let pending = self.pending.take()?;
        let ok = accept(pending.direction, pending.base_acc, new_acc, band);
        if ok {
            self.difficulty = pending.difficulty;
            counts.accepted += 1;
        } else {
            counts.rejected += 1;
        }
        Some(ok)
    }

    /// After the slot's own rollout gave `acc`: when [`direction`] asks for a move and nothing
    /// is pending, ask `proposer` for a new difficulty and make it pending. Returns the
    /// direction of the new proposal, if one was made. A proposal equal to the current
    /// difficulty (e.g. [`Static`], or a clamp at the edge of `[0, 1]^k`) is not made pending.
    #[allow(clippy::too_many_arguments)]
    pub fn maybe_propose(
        &mut self,
        acc: f64,
        band: (f64, f64),
        feedback: &CriticFeedback,
        step: usize,
        proposer: &mut dyn Proposer,
        rng: &mut Rng,
        counts: &mut AdaptCounts,
    ) -> Option<Direction> {
        if self.pending.is_some() {
            return None;
        }
        let dir = direction(acc, band)?;
        let proposal = proposer.propose(&self.difficulty, acc, dir, feedback, step, rng);
        let proposal = clamp_unit(&proposal);
        if proposal.len() != self.difficulty.len() || proposal == self.difficulty {
            return None;
        }
        counts.proposals += 1;
        self.pending = Some(Pending {
            difficulty: proposal,
            direction: dir,
            base_acc: acc,
            proposed_at: step,
        });
        Some(dir)
    }
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

    #[test]
    fn threshold_moves_exactly_step_on_flagged_dims_and_clamps() {
        let mut rng = Rng::new(0);
        let mut t = Threshold { step: 0.125 };
        let none = CriticFeedback::default();
        let d = t.propose(&[0.25, 0.5], 0.9, Direction::Harder, &none, 0, &mut rng);
        assert_eq!(d, vec![0.375, 0.625]); // no flags: all dims
        let d = t.propose(&[0.25, 0.5], 0.1, Direction::Easier, &none, 0, &mut rng);
        assert_eq!(d, vec![0.125, 0.375]);
        let fb = CriticFeedback {
            blame: vec![0.0, 1.0],
            flagged_steps: 2,
            steps: 5,
        };
        let d = t.propose(&[0.25, 0.5], 0.9, Direction::Harder, &fb, 0, &mut rng);
        assert_eq!(d, vec![0.25, 0.625]); // only the flagged dim
        let d = t.propose(&[0.25, 0.5], 0.1, Direction::Easier, &fb, 0, &mut rng);
        assert_eq!(d, vec![0.25, 0.375]);
        // Clamping at both edges.
        let d = t.propose(&[0.95, 0.0625], 0.9, Direction::Harder, &none, 0, &mut rng);
        assert_eq!(d, vec![1.0, 0.1875]);
        let d = t.propose(&[0.05, 1.0], 0.1, Direction::Easier, &none, 0, &mut rng);
        assert_eq!(d, vec![0.0, 0.875]);
        // State round trip is exact.
        let mut u = Threshold { step: 0.0 };
        u.load_state(t.state()).expect("load");
        assert_eq!(u, t);
        assert!(u.load_state(serde_json::Value::Null).is_err());
    }

    #[test]
    fn static_never_moves() {
        let mut s = Static;
        let mut rng = Rng::new(1);
        let d = s.propose(
            &[0.3, 0.7],
            1.0,
            Direction::Harder,
            &CriticFeedback::default(),
            3,
            &mut rng,
        );
        assert_eq!(d, vec![0.3, 0.7]);
        assert!(s.posterior(&[0.3, 0.7], 3, 5).is_none());
        // The slot machine never makes a no-op pending proposal.
        let mut slot = AdaptSlot::new(vec![0.3, 0.7]);
        let mut counts = AdaptCounts::default();
        let fb = CriticFeedback::default();
        assert_eq!(
            slot.maybe_propose(1.0, BAND, &fb, 0, &mut s, &mut rng, &mut counts),
            None
        );
        assert_eq!(counts, AdaptCounts::default());
    }

    #[test]
    fn slot_pending_accept_and_reject() {
        let mut t = Threshold { step: 0.25 };
        let mut rng = Rng::new(2);
        let fb = CriticFeedback::default();
        let mut counts = AdaptCounts::default();
        let mut slot = AdaptSlot::new(vec![0.0, 0.5]);
        // Mid-band: no proposal.
        assert_eq!(
            slot.maybe_propose(0.5, BAND, &fb, 0, &mut t, &mut rng, &mut counts),
            None
        );
        // Too easy: a harder proposal becomes pending.
        let dir = slot.maybe_propose(0.875, BAND, &fb, 1, &mut t, &mut rng, &mut counts);
        assert_eq!(dir, Some(Direction::Harder));
        let p = slot.pending.clone().expect("pending");
        assert_eq!(p.difficulty, vec![0.25, 0.75]);
        assert_eq!((p.base_acc, p.proposed_at), (0.875, 1));
        // While pending, no second proposal.
        assert_eq!(
            slot.maybe_propose(1.0, BAND, &fb, 1, &mut t, &mut rng, &mut counts),
            None
        );
        // Accepted: replaces the slot.
        assert_eq!(slot.resolve(0.5, BAND, &mut counts), Some(true));
        assert_eq!(slot.difficulty, vec![0.25, 0.75]);
        assert!(slot.pending.is_none());
        assert_eq!(slot.resolve(0.5, BAND, &mut counts), None);
        // Too hard: easier proposal, rejected because it overshoots α_high.
        slot.maybe_propose(0.125, BAND, &fb, 2, &mut t, &mut rng, &mut counts);
        assert_eq!(slot.resolve(1.0, BAND, &mut counts), Some(false));
        assert_eq!(slot.difficulty, vec![0.25, 0.75]);
        assert_eq!(
            counts,
            AdaptCounts {
                proposals: 2,
                accepted: 1,
                rejected: 1
            }
        );
    }
}
