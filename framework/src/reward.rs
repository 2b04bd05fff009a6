//! The two rewards of framework/METHOD.md as small pure functions.
//!
//! - **Integrated reward** of a policy step (step 4): `R = O + (λ / m) · Σ_j S_j`, with the
//!   outcome `O ∈ {−1, +1}` and the judge's `m` verdicts `S_j ∈ {−1, 0, +1}` (0 = unparseable).
//! - **Consistency reward** of a verdict (step 5): `R · S_j`, or −2 for an unparseable verdict;
//!   advantages are z-scored over the `m` verdicts of one step.

use crate::advantage::zscore;
use serde::{Deserialize, Serialize};

/// The values of the outcome `O` in the integrated reward (`reward: (outcome: ...)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutcomeScale {
    /// Solved `+1`, failed `−1`.
    #[default]
    PlusMinus,
    /// Solved `1`, failed `0`.
    ZeroOne,
}

impl OutcomeScale {
    /// `O` for a trajectory that did (`true`) or did not solve its task.
    pub fn value(self, solved: bool) -> f64 {
        match (self, solved) {
            (_, true) => 1.0,
            (OutcomeScale::PlusMinus, false) => -1.0,
            (OutcomeScale::ZeroOne, false) => 0.0,
        }
    }
}

/// How a group's step rewards become advantages (`reward: (advantage: ...)`;
/// framework/METHOD.md, step 4 and "The decomposed advantage").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Advantage {
    /// The integrated reward `O + (λ/m)ΣS` z-scored per group and step index.
    #[default]
    PerIndex,
    /// The outcome z-scored over the group plus `λ` times the mean verdict `(1/m)ΣS`
    /// z-scored over all of the group's steps
    /// ([`crate::advantage::decomposed_advantages`]).
    Decomposed,
}

impl Advantage {
    /// Whether this is the default (left out of a written experiment file).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The mean verdict `(1/m) Σ S` of one step (0 without verdicts).
pub fn mean_verdict(verdicts: &[Verdict]) -> f64 {
    if verdicts.is_empty() {
        return 0.0;
    }
    verdicts.iter().map(|&s| f64::from(s)).sum::<f64>() / verdicts.len() as f64
}

/// A verdict: `+1` (step is good), `−1` (bad), `0` (unparseable: a format failure).
pub type Verdict = i8;

/// Reward given to an unparseable verdict.
pub const INVALID_VERDICT_REWARD: f64 = -2.0;

/// `O + (λ / m) · Σ S`; with no verdicts (no judge) it is the outcome alone.
pub fn integrated_reward(
    outcome: bool,
    verdicts: &[Verdict],
    lambda: f64,
    scale: OutcomeScale,
) -> f64 {
    let o = scale.value(outcome);
    if verdicts.is_empty() {
        return o;
    }
    let sum: f64 = verdicts.iter().map(|&s| f64::from(s)).sum();
    o + lambda / verdicts.len() as f64 * sum
}

/// Consistency reward of each verdict of one step whose integrated reward is `r_step`.
pub fn consistency_rewards(r_step: f64, verdicts: &[Verdict]) -> Vec<f64> {
    verdicts
        .iter()
        .map(|&s| {
            if s == 0 {
                INVALID_VERDICT_REWARD
            } else {
                r_step * f64::from(s)
            }
        })
        .collect()
}

/// Advantages of the verdicts of one step: z-scores of their consistency rewards, `None`
/// when they are all equal (no signal).
pub fn verdict_advantages(r_step: f64, verdicts: &[Verdict]) -> Option<Vec<f64>> {
    zscore(&consistency_rewards(r_step, verdicts))
}

/// How the judge's consistency samples are weighed across episode outcomes
/// (`reward: (consistency: ...)`; framework/METHOD.md, step 5 and "The class-balanced
/// consistency reward").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consistency {
    /// The paper's `R·S`: every judged step weighs the same.
    #[default]
    Paper,
    /// `R·S`, with the steps of successful and of failed episodes weighing the same in each
    /// update: each step's verdict advantages are multiplied by its outcome's
    /// [`class_weights`], so the judge is not pulled towards the training success rate.
    Balanced,
}

/// The weights `(w_solved, w_failed)` that give `solved` steps of successful episodes and
/// `failed` steps of failed episodes the same total weight, `(solved + failed) / 2` each,
/// keeping the update's total weight: `w = n / (2 n_class)`. With only one class present
/// nothing can be balanced: `(1, 1)`.
pub fn class_weights(solved: usize, failed: usize) -> (f64, f64) {
    if solved == 0 || failed == 0 {
        return (1.0, 1.0);
    }
    let n = (solved + failed) as f64;
    (n / (2.0 * solved as f64), n / (2.0 * failed as f64))
}

/// Majority verdict: the sign of the sum (0 on a tie or when every verdict is invalid).
pub fn majority(verdicts: &[Verdict]) -> Verdict {
    let sum: i32 = verdicts.iter().map(|&s| i32::from(s)).sum();
    sum.signum() as Verdict
}

/// Whether every verdict is −1 (the step is flagged as a failure for critic feedback).
pub fn all_negative(verdicts: &[Verdict]) -> bool {
    !verdicts.is_empty() && verdicts.iter().all(|&s| s == -1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integrated_reward_hand_computed() {
        let pm = OutcomeScale::PlusMinus;
        // O = +1, λ = 1, verdicts (+1, −1, +1): 1 + 1/3 · 1 = 4/3
        assert!((integrated_reward(true, &[1, -1, 1], 1.0, pm) - 4.0 / 3.0).abs() < 1e-12);
        // O = −1, λ = 0.5, verdicts (−1, −1, 0): −1 + 0.5/3 · (−2) = −4/3
        assert!((integrated_reward(false, &[-1, -1, 0], 0.5, pm) + 4.0 / 3.0).abs() < 1e-12);
        // No judge: the outcome alone.
        assert_eq!(integrated_reward(false, &[], 1.0, pm), -1.0);
        // O ∈ {0, 1}: failed with verdicts (−1, −1, +1), λ = 1: 0 − 1/3 = −1/3.
        let zo = OutcomeScale::ZeroOne;
        assert!((integrated_reward(false, &[-1, -1, 1], 1.0, zo) + 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(integrated_reward(false, &[], 1.0, zo), 0.0);
        assert_eq!(integrated_reward(true, &[], 1.0, zo), 1.0);
    }

    #[test]
    fn consistency_reward_hand_computed() {
        // R = 4/3, verdicts (+1, −1, 0) → (4/3, −4/3, −2)
        let r = consistency_rewards(4.0 / 3.0, &[1, -1, 0]);
        assert!((r[0] - 4.0 / 3.0).abs() < 1e-12);
        assert!((r[1] + 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(r[2], -2.0);
    }

    #[test]
    fn class_weights_hand_computed() {
        // 1 solved step, 3 failed: n = 4, w = 4/2 = 2 and 4/6 = 2/3; totals 2 and 2.
        let (ws, wf) = class_weights(1, 3);
        assert!((ws - 2.0).abs() < 1e-12 && (wf - 2.0 / 3.0).abs() < 1e-12);
        assert!((ws * 1.0 - wf * 3.0).abs() < 1e-12);
        // Already balanced: 1 and 1.
        assert_eq!(class_weights(5, 5), (1.0, 1.0));
        // One class absent: nothing to balance.
        assert_eq!(class_weights(0, 7), (1.0, 1.0));
        assert_eq!(class_weights(4, 0), (1.0, 1.0));
    }

    #[test]
    fn verdict_advantages_hand_computed() {
        // R = 1, verdicts (+1, +1, −1): rewards (1, 1, −1): mean 1/3, std sqrt(8/9)
        let a = verdict_advantages(1.0, &[1, 1, -1]).expect("variance");
        let s = (8.0f64 / 9.0).sqrt();
        assert!((a[0] - (2.0 / 3.0) / s).abs() < 1e-12);
        assert!((a[2] + (4.0 / 3.0) / s).abs() < 1e-12);
        // Unanimous verdicts: no signal.
        assert!(verdict_advantages(1.0, &[1, 1, 1]).is_none());
        // R = 0 makes every valid verdict's reward 0: only an invalid one stands out.
        assert!(verdict_advantages(0.0, &[1, -1]).is_none());
        assert!(verdict_advantages(0.0, &[1, 0]).is_some());
    }

    #[test]
    fn majority_and_flags() {
        assert_eq!(majority(&[1, -1, 1]), 1);
        assert_eq!(majority(&[1, -1, 0]), 0);
        assert_eq!(majority(&[-1, -1, 0]), -1);
        assert!(all_negative(&[-1, -1, -1]));
        assert!(!all_negative(&[-1, 0, -1]));
        assert!(!all_negative(&[]));
    }
}
