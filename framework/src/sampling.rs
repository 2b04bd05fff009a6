//! Host-side next-token choice for one row of logits (the models' `generate` and the judge's
//! votes share it): greedy, or temperature + nucleus
//! (top-p, Holtzman et al., arXiv 1904.09751) sampling, with the log-probability of the
//! chosen id under the untempered distribution.

use crate::rng::Rng;

/// Reusable buffers so a decode step allocates nothing per row.
#[derive(Debug, Default)]
pub struct Sampler {
    probs: Vec<f64>,
    order: Vec<usize>,
}

/// Index of the largest finite-or-not logit (first one on ties; NaN never wins).
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > best_val {
            best = i;
            best_val = l;
        }
    }
    best
}

/// `log_softmax(logits)[id]`, computed in f64.
fn log_prob(logits: &[f32], id: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    (logits[id] as f64 - max - sum.ln()) as f32
}

impl Sampler {
    /// Chooses the next id from one row of logits.
    ///
    /// `temperature <= 0` (or NaN) is greedy and draws nothing from `rng`; otherwise exactly
    /// one `rng.uniform()` is drawn. `top_p >= 1` disables the nucleus; a `top_p` so small
    /// that no prefix reaches it keeps the single most likely id.
    ///
    /// Returns the id and its log-probability under the untempered `log_softmax(logits)`.
    pub fn sample(
        &mut self,
        logits: &[f32],
        temperature: f64,
        top_p: f64,
        rng: &mut Rng,
    ) -> (u32, f32) {
        let id = if temperature > 0.0 {
            self.draw(logits, temperature, top_p, rng)
        } else {
            argmax(logits)
        };
        (id as u32, log_prob(logits, id))
    }

    fn draw(&mut self, logits: &[f32], temperature: f64, top_p: f64, rng: &mut Rng) -> usize {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        self.probs.clear();
        self.probs.extend(
            logits
                .iter()
                .map(|&l| ((l as f64 - max) / temperature).exp()),
        );
        let total: f64 = self.probs.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            // Non-finite logits: nothing sensible to sample from.
            return argmax(logits);
        }
        let u = rng.uniform();
        if top_p >= 1.0 {
            let target = u * total;
            let mut acc = 0.0;
            for (i, &p) in self.probs.iter().enumerate() {
                acc += p;
                if acc > target {
                    return i;
                }
            }
            return argmax(logits);
        }
        // Nucleus: most likely first (ties by id), keep the shortest prefix whose mass
        // reaches `top_p` (at least one id), sample within it.
        self.order.clear();
        self.order.extend(0..self.probs.len());
        let probs = &self.probs;
        self.order
            .sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let need = top_p * total;
        let mut kept_mass = 0.0;
        let mut kept = 0;
        for &i in &self.order {
            kept_mass += probs[i];
            kept += 1;
            if kept_mass >= need {
                break;
            }
        }
        let target = u * kept_mass;
        let mut acc = 0.0;
        for &i in &self.order[..kept] {
            acc += probs[i];
            if acc > target {
                return i;
            }
        }
        self.order[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_draws_nothing() {
        let mut s = Sampler::default();
        let mut rng = Rng::new(3);
        let before = rng.clone();
        let (id, lp) = s.sample(&[0.1, 2.0, -1.0, 1.5], 0.0, 1.0, &mut rng);
        assert_eq!(id, 1);
        assert_eq!(rng, before);
        let expected = 2.0 - (0.1f64.exp() + 2f64.exp() + (-1f64).exp() + 1.5f64.exp()).ln();
        assert!((lp as f64 - expected).abs() < 1e-6);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut s = Sampler::default();
        let mut rng = Rng::new(11);
        // Probabilities 0.1, 0.2, 0.7.
        let logits = [0.1f32.ln(), 0.2f32.ln(), 0.7f32.ln()];
        let mut counts = [0usize; 3];
        for _ in 0..20_000 {
            counts[s.sample(&logits, 1.0, 1.0, &mut rng).0 as usize] += 1;
        }
        let freq: Vec<f64> = counts.iter().map(|&c| c as f64 / 20_000.0).collect();
        assert!((freq[0] - 0.1).abs() < 0.02, "{freq:?}");
        assert!((freq[1] - 0.2).abs() < 0.02, "{freq:?}");
        assert!((freq[2] - 0.7).abs() < 0.02, "{freq:?}");
    }

    #[test]
    fn nucleus_keeps_the_top_mass() {
        let mut s = Sampler::default();
        let mut rng = Rng::new(5);
        // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps ids 0 and 1 only.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        let mut counts = [0usize; 4];
        for _ in 0..10_000 {
            counts[s.sample(&logits, 1.0, 0.75, &mut rng).0 as usize] += 1;
        }
        assert_eq!(counts[2] + counts[3], 0);
        let f0 = counts[0] as f64 / 10_000.0;
        assert!((f0 - 0.625).abs() < 0.03, "{counts:?}");
        // A tiny top_p is greedy.
        for _ in 0..100 {
            assert_eq!(s.sample(&logits, 1.0, 1e-6, &mut rng).0, 0);
        }
    }
}
