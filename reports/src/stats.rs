//! Small-sample statistics: Student's t quantile for any degrees of freedom, mean with a
//! 95% confidence interval, and per-step aggregation over seeds.
//!
//! The t quantile inverts the t CDF, `F(t) = 1 − ½·I_{ν/(ν+t²)}(ν/2, ½)` for `t ≥ 0`, where
//! `I` is the regularized incomplete beta function (continued fraction, Lentz's method), by
//! bisection to machine precision. Above 10⁶ degrees of freedom a Cornish–Fisher expansion
//! around the normal quantile is used (error < 1e-12 there).

use std::collections::BTreeMap;

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
/// fractional or infinite). NaN for `p` outside `(0, 1)` or `df ≤ 0`.
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    if p == 0.5 {
        return 0.0;
    }
    if df > 1e6 {
        return cornish_fisher(normal_quantile(p), df);
    }
    // Bracket, then bisect on the CDF (monotone), 200 halvings ≫ f64 precision.
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

/// Student's t CDF with `df` degrees of freedom.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if t.is_infinite() {
        return if t > 0.0 { 1.0 } else { 0.0 };
    }
    let x = df / (df + t * t);
    let tail = 0.5 * reg_inc_beta(df / 2.0, 0.5, x);
    if t >= 0.0 { 1.0 - tail } else { tail }
}

/// Third-order Cornish–Fisher expansion of the t quantile around the normal quantile `z`.
fn cornish_fisher(z: f64, df: f64) -> f64 {
    let z2 = z * z;
    let g1 = (z2 + 1.0) * z / 4.0;
    let g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0;
    let g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0;
    z + g1 / df + g2 / (df * df) + g3 / (df * df * df)
}

/// The standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9,
/// refined by one Halley step on the complementary error function).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    if !(p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let x = if p < 0.024_25 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.024_25 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    };
    // Halley refinement with Φ(x) = ½·erfc(−x/√2).
    let e = 0.5 * erfc(-x / std::f64::consts::SQRT_2) - p;
    let u = e * (2.0 * std::f64::consts::PI).sqrt() * (x * x / 2.0).exp();
    x - u / (1.0 + x * u / 2.0)
}

/// The complementary error function, via the regularized incomplete gamma relation
/// `erfc(x) = Q(½, x²)` for `x ≥ 0` (continued fraction / series).
fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    let a = 0.5;
    let z = x * x;
    if z < a + 1.0 {
        1.0 - gamma_p_series(a, z)
    } else {
        gamma_q_cf(a, z)
    }
}

/// Regularized lower incomplete gamma `P(a, x)` by its series (for `x < a + 1`).
fn gamma_p_series(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let mut term = 1.0 / a;
    let mut sum = term;
    let mut ap = a;
    for _ in 0..1000 {
        ap += 1.0;
        term *= x / ap;
        sum += term;
        if term.abs() < sum.abs() * 1e-16 {
            break;
        }
    }
    sum * (-x + a * x.ln() - ln_gamma(a)).exp()
}

/// Regularized upper incomplete gamma `Q(a, x)` by its continued fraction (for `x ≥ a + 1`).
fn gamma_q_cf(a: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / TINY;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..1000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        if d.abs() < TINY {
            d = TINY;
        }
        c = b + an / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let delta = d * c;
        h *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x + a * x.ln() - ln_gamma(a)).exp() * h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms; relative error ~1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEF: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = COEF[0];
    let t = x + G + 0.5;
    for (i, c) in COEF.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized incomplete beta function `I_x(a, b)` for `a, b > 0`, `x ∈ [0, 1]`.
pub fn reg_inc_beta(a: f64, b: f64, x: f64) -> f64 {
    if !(0.0..=1.0).contains(&x) || a <= 0.0 || b <= 0.0 {
        return f64::NAN;
    }
    if x == 0.0 || x == 1.0 {
        return x;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    // The continued fraction converges fast for x < (a+1)/(a+b+2); use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// The continued fraction of the incomplete beta function (modified Lentz).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPS: f64 = 1e-16;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..100_000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        // One modified-Lentz update of (c, d) for the coefficient `aa`; returns d·c.
        let mut lentz = |aa: f64| {
            d = 1.0 + aa * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + aa / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            d * c
        };
        h *= lentz(m * (b - m) * x / ((qam + m2) * (a + m2)));
        let delta = lentz(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)));
        h *= delta;
        if (delta - 1.0).abs() < EPS {
            break;
        }
    }
    h
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
        // Continuity across the switch to the expansion at 10⁶ degrees of freedom.
        let below = t_quantile(0.975, 999_999.0);
        let above = t_quantile(0.975, 1_000_001.0);
        assert!((below - above).abs() < 1e-9, "{below} {above}");
        // Cornish–Fisher vs the exact inversion where both are valid.
        let cf = cornish_fisher(z, 1000.0);
        assert!((cf - t_quantile(0.975, 1000.0)).abs() < 1e-8);
        // Monotone in df.
        let qs: Vec<f64> = (1..=40).map(|d| t_quantile(0.975, f64::from(d))).collect();
        assert!(qs.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn special_functions() {
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
        // I_x(1, 1) = x;  I_x(a, 1) = x^a.
        assert!((reg_inc_beta(1.0, 1.0, 0.3) - 0.3).abs() < 1e-14);
        assert!((reg_inc_beta(2.5, 1.0, 0.4) - 0.4f64.powf(2.5)).abs() < 1e-13);
        assert!((t_cdf(0.0, 3.0) - 0.5).abs() < 1e-15);
        assert!((erfc(1.0) - 0.157_299_207_050_285_1).abs() < 1e-14);
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
