//! Proposing: candidates inside the trust region on the side the gate asks for, and the
//! acquisition's choice among them.

use super::*;

impl Gp {
    pub(super) fn trust_radius(&self) -> f64 {
        let r = self.config.trust_radius;
        if r.is_finite() && r > 0.0 {
            r.min(1.0)
        } else {
            0.2
        }
    }

    /// Candidates inside the trust region: the part of the L∞ box of radius `trust_radius`
    /// around `current` (within `[0,1]^k`) on the side of `direction` (every coordinate at
    /// least the current one for Harder, at most for Easier; difficulty is monotone). Half
    /// uniform in it, half moves of `current` along the dimensions the critic flags (all if
    /// none) by independent uniform amounts up to the radius, and the moves by ¼, ½, ¾ and
    /// all of the radius along all flagged dimensions (not random).
    pub(super) fn candidates(
        &self,
        current: &[f64],
        direction: Direction,
        feedback: &CriticFeedback,
        rng: &mut Rng,
    ) -> Vec<Vec<f64>> {
        let k = current.len();
        let r = self.trust_radius();
        let (lo, hi): (Vec<f64>, Vec<f64>) = match direction {
            Direction::Harder => current.iter().map(|c| (*c, (c + r).min(1.0))).unzip(),
            Direction::Easier => current.iter().map(|c| ((c - r).max(0.0), *c)).unzip(),
        };
        let sign = match direction {
            Direction::Harder => 1.0,
            Direction::Easier => -1.0,
        };
        let n = self.config.candidates.max(2);
        let flagged = feedback.flagged_dims(k);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n / 2 {
            out.push(
                (0..k)
                    .map(|j| lo[j] + (hi[j] - lo[j]) * rng.uniform())
                    .collect(),
            );
        }
        for _ in n / 2..n {
            let mut d = current.to_vec();
            for &j in &flagged {
                d[j] = (d[j] + sign * r * rng.uniform()).clamp(lo[j], hi[j]);
            }
            out.push(d);
        }
        for f in [0.25, 0.5, 0.75, 1.0] {
            let mut d = current.to_vec();
            for &j in &flagged {
                d[j] = (d[j] + sign * r * f).clamp(lo[j], hi[j]);
            }
            out.push(d);
        }
        out
    }

    pub(super) fn select(
        &self,
        current: &[f64],
        acc: f64,
        direction: Direction,
        cands: &[Vec<f64>],
        preds: &[(f64, f64)],
    ) -> Option<usize> {
        let ok: Vec<usize> = (0..cands.len())
            .filter(|&i| {
                let (p, sd) = preds[i];
                p.is_finite()
                    && sd.is_finite()
                    && cands[i].as_slice() != current
                    && match direction {
                        Direction::Harder => p < acc,
                        Direction::Easier => p > acc,
                    }
            })
            .collect();
        if ok.is_empty() {
            return None;
        }
        let target = if self.config.target.is_finite() {
            self.config.target.clamp(1e-6, 1.0 - 1e-6)
        } else {
            0.5
        };
        let logit = |p: f64| (p / (1.0 - p)).ln();
        // Distance of a prediction from the target on the logit scale.
        let gap = |i: usize| (logit(preds[i].0.clamp(1e-12, 1.0 - 1e-12)) - logit(target)).abs();
        let dist = |i: usize| -> f64 {
            cands[i]
                .iter()
                .zip(current)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
        };
        let nearest = |set: &[usize]| -> Option<usize> {
            let best = set.iter().map(|&i| gap(i)).fold(f64::INFINITY, f64::min);
            // Target in reach: the smallest move that gets (about) there; out of reach: the
            // move predicted to get closest.
            let tol = if best <= REACH_TOL { NEAREST_TOL } else { 0.0 };
            set.iter()
                .copied()
                .filter(|&i| gap(i) <= best + tol)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
        };
        match self.config.acquisition {
            Acquisition::Nearest => nearest(&ok),
            Acquisition::Ucb { beta } => {
                let beta = if beta.is_finite() { beta } else { 0.0 };
                let (lo, hi) = self.config.band;
                let inside: Vec<usize> = ok
                    .iter()
                    .copied()
                    .filter(|&i| preds[i].0 >= lo && preds[i].0 <= hi)
                    .collect();
                if inside.is_empty() {
                    return nearest(&ok);
                }
                let score = |i: usize| {
                    let (p, sd) = preds[i];
                    p * (1.0 - p) + beta * sd
                };
                // First maximum wins (deterministic).
                let mut best = inside[0];
                for &i in &inside[1..] {
                    if score(i) > score(best) {
                        best = i;
                    }
                }
                Some(best)
            }
        }
    }
}
