//! The predictive distribution of a fresh group's successes and the logit helpers it and the
//! fit share.

use super::*;

/// The predictive distribution of the outcome of a fresh group of `group_size` rollouts at one
/// difficulty and step ([`Gp::predictive`]): `k ~ Binomial(group_size, sigmoid(f + ε))` with
/// the latent logit `f ~ N(logit_mean, logit_sd²)` (the GP's posterior) and the group's own
/// effect `ε ~ N(0, group_sd²)` (the overdispersion the fitted nugget found beyond binomial
/// noise).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPredictive {
    /// Rollouts in the group.
    pub group_size: usize,
    /// Posterior mean of the latent logit accuracy.
    pub logit_mean: f64,
    /// Posterior standard deviation of the latent logit accuracy.
    pub logit_sd: f64,
    /// Standard deviation of a single group's own logit effect.
    pub group_sd: f64,
    /// `pmf[k]` = probability of `k` successes, `k = 0..=group_size` (sums to 1).
    pub pmf: Vec<f64>,
}

impl GroupPredictive {
    /// Expected success rate of the group.
    pub fn mean(&self) -> f64 {
        let g = self.group_size.max(1) as f64;
        self.pmf
            .iter()
            .enumerate()
            .map(|(k, p)| p * k as f64 / g)
            .sum()
    }

    /// `P(successes ≤ k)`.
    pub fn cdf(&self, k: usize) -> f64 {
        self.pmf
            .iter()
            .take(k.saturating_add(1))
            .sum::<f64>()
            .min(1.0)
    }

    /// Equal-tailed interval of the success *rate* with probability at least `level`: the
    /// `(1−level)/2` and `(1+level)/2` quantiles of the count, divided by the group size.
    /// Conservative (the count is discrete: the mass inside is `≥ level`). A NaN level is
    /// treated as 0.95.
    pub fn interval(&self, level: f64) -> (f64, f64) {
        let level = if level.is_nan() { 0.95 } else { level };
        let a = ((1.0 - level) / 2.0).clamp(0.0, 0.5);
        let g = self.group_size.max(1) as f64;
        let quantile = |q: f64| -> usize {
            let mut c = 0.0;
            for (k, p) in self.pmf.iter().enumerate() {
                c += p;
                // Tolerance for the rounding of the running sum.
                if c >= q - 1e-12 {
                    return k;
                }
            }
            self.group_size
        };
        let lo = if a <= 0.0 { 0 } else { quantile(a) };
        let hi = quantile(1.0 - a);
        (lo as f64 / g, hi as f64 / g)
    }

    /// Whether the observed rate `rate` lies in [`GroupPredictive::interval`]`(level)`.
    pub fn covers(&self, rate: f64, level: f64) -> bool {
        let (lo, hi) = self.interval(level);
        rate >= lo - 1e-12 && rate <= hi + 1e-12
    }

    /// Randomised probability integral transform of an observed count `successes` with
    /// `u ∈ [0, 1]` uniform: `P(K < successes) + u·P(K = successes)`. Uniform on `[0, 1]` when
    /// the predictive distribution is right, whatever its discreteness; `(1−level)/2 ≤ pit ≤
    /// (1+level)/2` is the randomised central interval of probability exactly `level`
    /// (calibration checks, see [`GroupPredictive::covers_randomised`]). Counts above the
    /// group size give 1.
    pub fn pit(&self, successes: usize, u: f64) -> f64 {
        let below = if successes == 0 {
            0.0
        } else {
            self.cdf(successes - 1)
        };
        let at = self.pmf.get(successes).copied().unwrap_or(0.0);
        let u = if u.is_finite() {
            u.clamp(0.0, 1.0)
        } else {
            0.5
        };
        (below + u * at).clamp(0.0, 1.0)
    }

    /// Whether `successes` lies in the randomised central interval of probability exactly
    /// `level` (`u` uniform on `[0, 1]`, see [`GroupPredictive::pit`]). Unlike
    /// [`GroupPredictive::covers`], whose interval holds at least `level` of the mass (for 8
    /// rollouts typically 97–99%), its hit rate is `level` under a correct model, so it can
    /// show intervals that are too wide as well as too narrow.
    pub fn covers_randomised(&self, successes: usize, level: f64, u: f64) -> bool {
        let level = if level.is_nan() {
            0.95
        } else {
            level.clamp(0.0, 1.0)
        };
        let a = (1.0 - level) / 2.0;
        let v = self.pit(successes, u);
        v >= a && v <= 1.0 - a
    }
}

pub(super) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)` without overflow.
pub(super) fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// Empirical logit of `s` successes in `n` trials with the usual ½ continuity correction.
pub(super) fn empirical_logit(s: f64, n: f64) -> f64 {
    ((s + 0.5) / (n - s + 0.5)).ln()
}

/// Variance of [`empirical_logit`] (Gart's estimate), i.e. the binomial noise of a target.
pub(super) fn empirical_logit_var(s: f64, n: f64) -> f64 {
    1.0 / (s + 0.5) + 1.0 / (n - s + 0.5)
}

/// Column standard deviations (ddof 1, zero → 1): how egobox standardises its inputs.
pub(super) fn col_std(x: &Array2<f64>) -> Vec<f64> {
    x.std_axis(Axis(0), 1.0)
        .iter()
        .map(|s| if s.is_finite() && *s > 0.0 { *s } else { 1.0 })
        .collect()
}

/// Sample standard deviation (ddof 1, zero → 1), as egobox standardises its targets.
pub(super) fn vec_std(y: &Array1<f64>) -> f64 {
    let n = y.len() as f64;
    if n < 2.0 {
        return 1.0;
    }
    let mean = y.sum() / n;
    let var = y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    if var.is_finite() && var > 0.0 {
        var.sqrt()
    } else {
        1.0
    }
}

/// `P(k successes in g)` for `k = 0..=g` when the logit accuracy is `N(mu, sd²)`, by a
/// midpoint quadrature over ±6 sd.
pub(super) fn group_pmf(mu: f64, sd: f64, g: usize) -> Vec<f64> {
    let mut ln_choose = vec![0.0; g + 1];
    for k in 1..=g {
        ln_choose[k] = ln_choose[k - 1] + ((g - k + 1) as f64).ln() - (k as f64).ln();
    }
    let nodes: Vec<(f64, f64)> = if sd > 1e-9 {
        (0..QUAD_NODES)
            .map(|i| {
                let z =
                    -QUAD_HALF_WIDTH + 2.0 * QUAD_HALF_WIDTH * i as f64 / (QUAD_NODES - 1) as f64;
                (mu + sd * z, (-0.5 * z * z).exp())
            })
            .collect()
    } else {
        vec![(mu, 1.0)]
    };
    let mut pmf = vec![0.0; g + 1];
    let mut total = 0.0;
    for (x, w) in nodes {
        let (lp, lq) = (-softplus(-x), -softplus(x));
        for (k, slot) in pmf.iter_mut().enumerate() {
            *slot += w * (ln_choose[k] + k as f64 * lp + (g - k) as f64 * lq).exp();
        }
        total += w;
    }
    let sum: f64 = pmf.iter().sum();
    let norm = if sum > 0.0 { sum } else { total };
    pmf.iter_mut().for_each(|p| *p /= norm);
    pmf
}
