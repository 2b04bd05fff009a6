//! Small-sample statistics: Student's t quantile for any degrees of freedom, mean with a
//! 95% confidence interval, and per-step aggregation over seeds. The distributions are
//! `statrs`'s; this module adds the edge cases a report meets (one value, infinite degrees of
//! freedom, a probability outside `(0, 1)` as NaN rather than a panic).

use std::collections::BTreeMap;

use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// Mean of `xs` with the half-width of its two-sided 95% Student-t confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanCi {
    /// Sample mean.
    pub mean: f64,
    /// Half-width `t(0.975, n−1)·s/√n`; `None` for a single value (no interval exists).
    pub half_width: Option<f64>,
    /// Number of values.
    pub n: usize,
}

impl MeanCi {
    /// `mean ± half` with `digits` decimals, or `mean (n=1)` for a single value.
    pub fn format(&self, digits: usize) -> String {
        match self.half_width {
            Some(h) => format!("{:.digits$} ± {:.digits$}", self.mean, h),
            None => format!("{:.digits$} (n=1)", self.mean),
        }
    }
}

/// Mean and 95% confidence half-width (Student t with `n − 1` degrees of freedom) of `xs`;
/// `None` for no values, no half-width for one value. Non-finite values must be filtered out
/// by the caller (they would make the result NaN, never a wrong finite number).
pub fn mean_ci95(xs: &[f64]) -> Option<MeanCi> {
    mean_ci(xs, 0.95)
}

/// Mean and two-sided `level` confidence half-width (Student t) of `xs`.
pub fn mean_ci(xs: &[f64], level: f64) -> Option<MeanCi> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let half_width = (n > 1).then(|| {
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
        t_quantile(0.5 + level / 2.0, (n - 1) as f64) * (var / n as f64).sqrt()
    });
    Some(MeanCi {
        mean,
        half_width,
        n,
    })
}

/// The `p` quantile of Student's t distribution with `df` degrees of freedom (`df > 0`, may be
/// fractional or infinite: the normal quantile). NaN for `p` outside `(0, 1)` or `df ≤ 0`.
///
/// The CDF is `statrs`'s; it is inverted here by bisection to machine precision, because
/// `statrs`'s own `inverse_cdf` loses digits at large `df` (1.959848 at 10⁶ degrees of
/// freedom, against 1.959966).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if df.is_infinite() {
        return normal_quantile(p);
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    if p == 0.5 {
        return 0.0;
    }
    // Bracket, then bisect on the CDF (monotone).
    let mut hi = 1.0;
    while t_cdf(hi, df) < p && hi < 1e300 {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 4.0 * f64::EPSILON * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// Student's t CDF with `df` degrees of freedom (NaN for `df ≤ 0`).
pub fn t_cdf(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if df.is_infinite() {
        return Normal::standard().cdf(t);
    }
    StudentsT::new(0.0, 1.0, df).map_or(f64::NAN, |d| d.cdf(t))
}

/// The standard normal quantile (NaN outside `(0, 1)`).
pub fn normal_quantile(p: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    Normal::standard().inverse_cdf(p)
}

/// One point of a curve aggregated over seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate {
    /// The training step.
    pub step: u64,
    /// The x value (a training step, or the mean over seeds of an x metric).
    pub x: f64,
    /// Mean and 95% CI of the y values of the seeds that have this step.
    pub y: MeanCi,
}

/// Aggregates several seeds' `(step, x, y)` curves per step: at each step, the mean of x and the
/// mean ± 95% CI of y over the seeds that logged it (so where runs have different lengths the
/// later steps are over fewer seeds; [`Aggregate::y`]`.n` says how many).
pub fn aggregate_by_step(curves: &[Vec<(u64, f64, f64)>]) -> Vec<Aggregate> {
    let mut by_step: BTreeMap<u64, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for curve in curves {
        for &(step, x, y) in curve {
            if x.is_finite() && y.is_finite() {
                let e = by_step.entry(step).or_default();
                e.0.push(x);
                e.1.push(y);
            }
        }
    }
    by_step
        .into_iter()
        .filter_map(|(step, (xs, ys))| {
            let y = mean_ci95(&ys)?;
            Some(Aggregate {
                step,
                x: xs.iter().sum::<f64>() / xs.len() as f64,
                y,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantile_matches_tables() {
        // Two-sided 95% critical values from standard tables (3 decimals).
        for (df, t) in [
            (1.0, 12.706),
            (2.0, 4.303),
            (3.0, 3.182),
            (4.0, 2.776),
            (5.0, 2.571),
            (9.0, 2.262),
            (10.0, 2.228),
            (29.0, 2.045),
            (30.0, 2.042),
            (60.0, 2.000),
            (120.0, 1.980),
            (1000.0, 1.962),
        ] {
            let q = t_quantile(0.975, df);
            assert!((q - t).abs() < 5e-4, "df {df}: {q} vs {t}");
        }
        // More digits (closed forms): ν=1 is Cauchy, tan(π(p−½)); ν=2 is (2p−1)·√(2/(4p(1−p))).
        let p: f64 = 0.975;
        let cauchy = (std::f64::consts::PI * (p - 0.5)).tan();
        assert!((t_quantile(p, 1.0) - cauchy).abs() < 1e-9);
        let two = (2.0 * p - 1.0) * (2.0 / (4.0 * p * (1.0 - p))).sqrt();
        assert!((t_quantile(p, 2.0) - two).abs() < 1e-9);
        // Other levels and symmetry.
        assert!((t_quantile(0.995, 4.0) - 4.604).abs() < 5e-4);
        assert!((t_quantile(0.95, 9.0) - 1.833).abs() < 5e-4);
        assert!((t_quantile(0.025, 4.0) + 2.776).abs() < 5e-4);
        assert_eq!(t_quantile(0.5, 7.0), 0.0);
        assert!(t_quantile(1.0, 3.0).is_nan() && t_quantile(0.9, 0.0).is_nan());
    }

    #[test]
    fn t_quantile_approaches_normal() {
        let z = 1.959_963_984_540_054;
        assert!((normal_quantile(0.975) - z).abs() < 1e-12);
        assert!((normal_quantile(0.5)).abs() < 1e-15);
        assert!((normal_quantile(0.001) + 3.090_232_306_167_813).abs() < 1e-10);
        assert!((t_quantile(0.975, f64::INFINITY) - z).abs() < 1e-12);
        // Large degrees of freedom approach the normal quantile from above.
        let big = t_quantile(0.975, 1e6);
        assert!(big > z && big - z < 1e-5, "{big}");
        // Monotone in df.
        let qs: Vec<f64> = (1..=40).map(|d| t_quantile(0.975, f64::from(d))).collect();
        assert!(qs.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn t_cdf_hand_checked() {
        assert!((t_cdf(0.0, 3.0) - 0.5).abs() < 1e-15);
        // ν = 1 is Cauchy: F(1) = ½ + atan(1)/π = 0.75.
        assert!((t_cdf(1.0, 1.0) - 0.75).abs() < 1e-12);
        // ν = 2: F(t) = ½ + t / (2·√(2 + t²)); t = 1 → 0.788675.
        assert!((t_cdf(1.0, 2.0) - (0.5 + 1.0 / (2.0 * 3f64.sqrt()))).abs() < 1e-12);
        assert!(t_cdf(1.0, 0.0).is_nan());
    }

    #[test]
    fn ci95_hand_computed() {
        // mean 2, sample sd 1, n 3: half-width 4.302653 · 1/√3 = 2.484138
        let c = mean_ci95(&[1.0, 2.0, 3.0]).expect("ci");
        assert_eq!(c.mean, 2.0);
        assert_eq!(c.n, 3);
        let h = c.half_width.expect("n=3 has a CI");
        assert!((h - 2.484_138).abs() < 1e-5, "{h}");
        // n = 2: 0.5, 0.75 → mean 0.625, s = 0.176777, t(1) = 12.706205 → 1.588276
        let c = mean_ci95(&[0.5, 0.75]).expect("ci");
        assert!((c.half_width.expect("ci") - 1.588_276).abs() < 1e-5);
        assert_eq!(c.format(3), "0.625 ± 1.588");
        // n = 1: the value, no interval.
        let one = mean_ci95(&[5.0]).expect("one");
        assert_eq!((one.mean, one.half_width, one.n), (5.0, None, 1));
        assert_eq!(one.format(2), "5.00 (n=1)");
        assert!(mean_ci95(&[]).is_none());
    }

    #[test]
    fn aggregation_uses_the_seeds_that_have_each_step() {
        let a = vec![(0, 0.0, 0.2), (1, 10.0, 0.4), (2, 20.0, 0.6)];
        let b = vec![(0, 0.0, 0.4), (1, 12.0, f64::NAN)];
        let agg = aggregate_by_step(&[a, b]);
        assert_eq!(agg.len(), 3);
        assert!((agg[0].y.mean - 0.3).abs() < 1e-12 && agg[0].y.n == 2);
        // Step 1: b's NaN is not a value; x is a's alone.
        assert_eq!((agg[1].x, agg[1].y.mean, agg[1].y.n), (10.0, 0.4, 1));
        assert_eq!((agg[2].y.n, agg[2].y.half_width), (1, None));
    }
}
