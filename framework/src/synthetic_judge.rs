//! The calibrated synthetic judge (`judge: Oracle(p_pos, p_neg)`): an **instrument** for
//! measuring how good a judge the method needs, not part of the method (framework/METHOD.md,
//! "The synthetic judge"). It has no model and is never trained.
//!
//! Each of a step's `m` votes is the environment's oracle label for that step, kept with a
//! per-vote probability `q` and flipped otherwise, every vote drawn on its own from the
//! judge's seeded stream. `q` is chosen so that the **majority** of the `m` votes is right
//! with exactly the configured probability — `p_pos` on right steps, `p_neg` on wrong ones —
//! because that majority is what the judge's evaluation measures (`judge/eval_pos_acc`,
//! `judge/eval_neg_acc`, ties counting as wrong). So `Oracle(p_pos: 0.69, p_neg: 0.44)` is a
//! judge that a user's learned judge with `judge/eval_pos_acc` 0.69 and `judge/eval_neg_acc`
//! 0.44 would match on the labelled pool; the two differ only in that this one's errors are
//! independent coin flips.

use crate::judge::JudgedStep;
use crate::reward::Verdict;
use crate::rng::Rng;
use crate::rollout::Trajectory;
use std::collections::BTreeMap;

/// The probability that the majority of `m` independent votes, each right with probability
/// `q`, is right: more than `m / 2` of them right (a tie is not a majority).
pub fn majority_accuracy(q: f64, m: usize) -> f64 {
    let q = q.clamp(0.0, 1.0);
    // Σ_{k > m/2} C(m, k) q^k (1 − q)^(m − k), with C(m, k) built up term by term.
    let mut total = 0.0;
    let mut binom = 1.0;
    for k in 0..=m {
        if k > 0 {
            binom = binom * (m - k + 1) as f64 / k as f64;
        }
        if 2 * k > m {
            total += binom * q.powi(k as i32) * (1.0 - q).powi((m - k) as i32);
        }
    }
    total
}

/// The per-vote accuracy `q` whose majority of `m` votes is right with probability `p`
/// (the inverse of [`majority_accuracy`], which rises from 0 at `q = 0` to 1 at `q = 1`;
/// found by bisection to 1e-12). `m = 1` gives `q = p`.
pub fn per_vote_accuracy(p: f64, m: usize) -> f64 {
    let p = p.clamp(0.0, 1.0);
    if m <= 1 {
        return p;
    }
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if majority_accuracy(mid, m) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The synthetic judge of one run: its per-vote accuracies and its vote count.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticJudge {
    /// Per-vote probability of a `+` on a step the oracle labels right.
    pub q_pos: f64,
    /// Per-vote probability of a `−` on a step the oracle labels wrong.
    pub q_neg: f64,
    /// Kinds of step with per-vote accuracies of their own: kind → `(q_pos, q_neg)`.
    pub by_kind: BTreeMap<String, (f64, f64)>,
    /// Votes per step (`m`).
    pub votes: usize,
}

impl SyntheticJudge {
    /// The judge whose majority of `votes` votes is right with probability `p_pos` on right
    /// steps and `p_neg` on wrong steps.
    pub fn new(p_pos: f64, p_neg: f64, votes: usize) -> Self {
        Self {
            q_pos: per_vote_accuracy(p_pos, votes),
            q_neg: per_vote_accuracy(p_neg, votes),
            by_kind: BTreeMap::new(),
            votes,
        }
    }

    /// The same judge with majority accuracies of their own on steps of some kinds
    /// (kind → `(p_pos, p_neg)`).
    pub fn with_kinds(mut self, by_kind: &BTreeMap<String, (f64, f64)>) -> Self {
        self.by_kind = by_kind
            .iter()
            .map(|(k, &(p, n))| {
                let q = (
                    per_vote_accuracy(p, self.votes),
                    per_vote_accuracy(n, self.votes),
                );
                (k.clone(), q)
            })
            .collect();
        self
    }

    /// The `m` votes on one step whose oracle label is `label` and whose kind is `kind`:
    /// each the label, kept with the per-vote accuracy of the label (the kind's own, when it
    /// has one) — one uniform draw per vote, in order.
    pub fn vote(&self, label: bool, kind: &str, rng: &mut Rng) -> Vec<Verdict> {
        let (q_pos, q_neg) = self
            .by_kind
            .get(kind)
            .copied()
            .unwrap_or((self.q_pos, self.q_neg));
        let q = if label { q_pos } else { q_neg };
        (0..self.votes)
            .map(|_| {
                let says_right = label == rng.bernoulli(q);
                if says_right { 1 } else { -1 }
            })
            .collect()
    }

    /// Votes on every step of `trajs`, in trajectory then step order (as the learned judge's
    /// `judge_steps`; no prompt, no tokens: nothing trains on them).
    pub fn judge_steps(&self, trajs: &[Trajectory], rng: &mut Rng) -> Vec<JudgedStep> {
        let mut out = Vec::new();
        for (ti, t) in trajs.iter().enumerate() {
            for (si, s) in t.steps.iter().enumerate() {
                out.push(JudgedStep {
                    traj: ti,
                    step: si,
                    prompt: Vec::new(),
                    tokens: Vec::new(),
                    verdicts: self.vote(s.oracle, &s.kind, rng),
                });
            }
        }
        out
    }

    /// Votes on labelled steps (the judge's evaluation pool): entry `i` judges the `i`-th
    /// `(label, kind)`.
    pub fn judge_labels<'a>(
        &self,
        labels: impl IntoIterator<Item = (bool, &'a str)>,
        rng: &mut Rng,
    ) -> Vec<JudgedStep> {
        labels
            .into_iter()
            .enumerate()
            .map(|(i, (label, kind))| JudgedStep {
                traj: i,
                step: 0,
                prompt: Vec::new(),
                tokens: Vec::new(),
                verdicts: self.vote(label, kind, rng),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::quality;

    #[test]
    fn majority_accuracy_hand_computed() {
        // m = 3: 3q²(1−q) + q³. q = 0.5 → 0.5; q = 0.8 → 3·0.64·0.2 + 0.512 = 0.896.
        assert!((majority_accuracy(0.5, 3) - 0.5).abs() < 1e-12);
        assert!((majority_accuracy(0.8, 3) - 0.896).abs() < 1e-12);
        // m = 2: a tie is not a majority, so both votes must be right: q².
        assert!((majority_accuracy(0.7, 2) - 0.49).abs() < 1e-12);
        // m = 1: the vote itself.
        assert!((majority_accuracy(0.3, 1) - 0.3).abs() < 1e-12);
        assert_eq!(majority_accuracy(0.0, 5), 0.0);
        assert!((majority_accuracy(1.0, 5) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn per_vote_accuracy_inverts_the_majority() {
        // 0.896 is the majority of three votes at 0.8; 0.49 of two at 0.7.
        assert!((per_vote_accuracy(0.896, 3) - 0.8).abs() < 1e-9);
        assert!((per_vote_accuracy(0.49, 2) - 0.7).abs() < 1e-9);
        assert_eq!(per_vote_accuracy(0.42, 1), 0.42);
        for m in 1..=7 {
            for p in [0.0, 0.1, 0.44, 0.5, 0.69, 0.85, 1.0] {
                let q = per_vote_accuracy(p, m);
                assert!((majority_accuracy(q, m) - p).abs() < 1e-9, "m {m} p {p}");
            }
        }
    }

    #[test]
    fn votes_are_the_label_or_its_flip() {
        let mut rng = Rng::new(3);
        let perfect = SyntheticJudge::new(1.0, 1.0, 3);
        assert_eq!(perfect.vote(true, "", &mut rng), vec![1, 1, 1]);
        assert_eq!(perfect.vote(false, "", &mut rng), vec![-1, -1, -1]);
        let contrary = SyntheticJudge::new(0.0, 0.0, 4);
        assert_eq!(contrary.vote(true, "", &mut rng), vec![-1; 4]);
        assert_eq!(contrary.vote(false, "", &mut rng), vec![1; 4]);
        // A kind with accuracies of its own: perfect elsewhere, contrary on "borderline".
        let by_kind = [("borderline".to_string(), (0.0, 0.0))]
            .into_iter()
            .collect();
        let twin = SyntheticJudge::new(1.0, 1.0, 3).with_kinds(&by_kind);
        assert_eq!(twin.vote(true, "clear", &mut rng), vec![1, 1, 1]);
        assert_eq!(twin.vote(true, "", &mut rng), vec![1, 1, 1]);
        assert_eq!(twin.vote(true, "borderline", &mut rng), vec![-1, -1, -1]);
        assert_eq!(twin.vote(false, "borderline", &mut rng), vec![1, 1, 1]);
    }

    /// Without kinds of its own a judge draws exactly the votes of before (one uniform per
    /// vote whatever the kind), so files without `by_kind` keep their numbers.
    #[test]
    fn kinds_without_accuracies_of_their_own_change_no_draw() {
        let labels: Vec<(bool, &str)> = (0..64)
            .map(|i| (i % 3 == 0, if i % 2 == 0 { "a" } else { "" }))
            .collect();
        let plain = SyntheticJudge::new(0.7, 0.6, 3);
        let other = [("b".to_string(), (0.1, 0.1))].into_iter().collect();
        let with = SyntheticJudge::new(0.7, 0.6, 3).with_kinds(&other);
        let a = plain.judge_labels(labels.iter().copied(), &mut Rng::new(5));
        let b = with.judge_labels(labels.iter().copied(), &mut Rng::new(5));
        assert_eq!(a, b);
    }

    /// The measured majority accuracies on a 256-step pool (128 right, 128 wrong) lie within
    /// the 99.9% binomial interval of the set values (±3.29 standard errors of 128 draws),
    /// on several seeds and settings; and the per-vote share of right votes lies within the
    /// interval of `q`.
    #[test]
    fn measured_quality_matches_the_setting() {
        let labels: Vec<bool> = (0..256).map(|i| i < 128).collect();
        let pairs = || labels.iter().map(|&l| (l, ""));
        for (p_pos, p_neg) in [(0.55, 0.55), (0.7, 0.7), (0.85, 0.85), (0.69, 0.44)] {
            for seed in 1..=5 {
                let judge = SyntheticJudge::new(p_pos, p_neg, 3);
                let judged = judge.judge_labels(pairs(), &mut Rng::new(seed));
                let q = quality(
                    judged
                        .iter()
                        .map(|j| (labels[j.traj], j.verdicts.as_slice())),
                );
                for (measured, set) in [(q.pos_acc, p_pos), (q.neg_acc, p_neg)] {
                    let measured = measured.unwrap_or(f64::NAN);
                    let half = 3.29 * (set * (1.0 - set) / 128.0).sqrt();
                    assert!(
                        (measured - set).abs() <= half,
                        "seed {seed}: measured {measured}, set {set} ± {half}"
                    );
                }
                // Every vote, on right steps: 384 draws at q_pos.
                let right_votes = judged[..128]
                    .iter()
                    .flat_map(|j| j.verdicts.iter())
                    .filter(|&&v| v == 1)
                    .count() as f64
                    / 384.0;
                let half = 3.29 * (judge.q_pos * (1.0 - judge.q_pos) / 384.0).sqrt();
                assert!((right_votes - judge.q_pos).abs() <= half);
            }
        }
    }

    #[test]
    fn same_seed_same_votes_other_seed_other_votes() {
        let judge = SyntheticJudge::new(0.7, 0.6, 3);
        let labels: Vec<(bool, &str)> = (0..64).map(|i| (i % 3 == 0, "")).collect();
        let a = judge.judge_labels(labels.iter().copied(), &mut Rng::new(11));
        let b = judge.judge_labels(labels.iter().copied(), &mut Rng::new(11));
        let c = judge.judge_labels(labels.iter().copied(), &mut Rng::new(12));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
