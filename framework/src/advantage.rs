//! Group-relative advantages (framework/METHOD.md, step 4): rewards z-scored within one task's group,
//! separately for every step index, with the population standard deviation. A slice whose
//! rewards are all equal carries no signal and is dropped; so is every task whose group
//! accuracy lies outside the policy band.

/// z-scores of `xs` with the population std; `None` when the std is (numerically) zero.
pub fn zscore(xs: &[f64]) -> Option<Vec<f64>> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let std = var.sqrt();
    if std < 1e-8 {
        return None;
    }
    Some(xs.iter().map(|x| (x - mean) / std).collect())
}

/// Per-step advantages for one task group.
///
/// `rewards[t][i]` is the reward of step `i` of trajectory `t` (trajectories may have
/// different lengths). The result has the same shape: `Some(a)` for a step that carries
/// signal, `None` for a step whose slice (all trajectories that reached step index `i`) has
/// zero variance.
pub fn group_step_advantages(rewards: &[Vec<f64>]) -> Vec<Vec<Option<f64>>> {
    let mut out: Vec<Vec<Option<f64>>> = rewards.iter().map(|r| vec![None; r.len()]).collect();
    let longest = rewards.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        let members: Vec<usize> = (0..rewards.len())
            .filter(|&t| rewards[t].len() > i)
            .collect();
        let slice: Vec<f64> = members.iter().map(|&t| rewards[t][i]).collect();
        if let Some(z) = zscore(&slice) {
            for (k, &t) in members.iter().enumerate() {
                out[t][i] = Some(z[k]);
            }
        }
    }
    out
}

/// Per-step advantages for one task group, decomposed (`reward: (advantage: Decomposed)`):
/// the outcome z-scored over the group's trajectories plus `λ` times the step's mean verdict
/// z-scored over *all* of the group's steps, so the judge's weight does not depend on which
/// step-index slice a step falls in.
///
/// `outcomes[t]` is trajectory `t`'s outcome value `O`, `verdicts[t][i]` the mean verdict
/// `(1/m) Σ S` of its step `i` (0 without a judge). A term whose values are all equal
/// contributes 0; a step gets `None` (no unit) only when both terms are uniform.
pub fn decomposed_advantages(
    outcomes: &[f64],
    verdicts: &[Vec<f64>],
    lambda: f64,
) -> Vec<Vec<Option<f64>>> {
    let z_outcome = zscore(outcomes);
    let flat: Vec<f64> = verdicts.iter().flatten().copied().collect();
    let z_flat = zscore(&flat);
    if z_outcome.is_none() && z_flat.is_none() {
        return verdicts.iter().map(|v| vec![None; v.len()]).collect();
    }
    let mut k = 0;
    verdicts
        .iter()
        .enumerate()
        .map(|(t, v)| {
            let o = z_outcome.as_ref().map_or(0.0, |z| z[t]);
            v.iter()
                .map(|_| {
                    let s = z_flat.as_ref().map_or(0.0, |z| z[k]);
                    k += 1;
                    Some(o + lambda * s)
                })
                .collect()
        })
        .collect()
}

/// Whether a group accuracy lies in the closed band `[lo, hi]`.
pub fn in_band(acc: f64, (lo, hi): (f64, f64)) -> bool {
    acc >= lo - 1e-12 && acc <= hi + 1e-12
}

/// Fraction of `true`s (0 for an empty slice).
pub fn accuracy(outcomes: &[bool]) -> f64 {
    if outcomes.is_empty() {
        return 0.0;
    }
    outcomes.iter().filter(|o| **o).count() as f64 / outcomes.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zscore_hand_computed() {
        // mean 2, population var (1+0+1)/3 = 2/3, std 0.8164966
        let z = zscore(&[1.0, 2.0, 3.0]).expect("has variance");
        assert!((z[0] + 1.224_744_87).abs() < 1e-6);
        assert!(z[1].abs() < 1e-12);
        assert!((z[2] - 1.224_744_87).abs() < 1e-6);
        assert!(zscore(&[0.5, 0.5]).is_none());
        assert!(zscore(&[]).is_none());
    }

    #[test]
    fn per_step_slices_use_only_trajectories_that_reached_the_step() {
        // Outcome ±1 repeated on every step; trajectory 2 stops after one step.
        let r = vec![
            vec![1.0, 1.0, 1.0],
            vec![-1.0, -1.0],
            vec![1.0],
            vec![-1.0, -1.0, -1.0],
        ];
        let a = group_step_advantages(&r);
        // step 0: [1,-1,1,-1] → ±1
        assert_eq!(a[0][0], Some(1.0));
        assert_eq!(a[1][0], Some(-1.0));
        assert_eq!(a[2][0], Some(1.0));
        // step 1: [1,-1,-1] (traj 0,1,3): mean -1/3, std sqrt(8/9)
        let s = (8.0f64 / 9.0).sqrt();
        assert!((a[0][1].expect("kept") - (4.0 / 3.0) / s).abs() < 1e-12);
        assert!((a[1][1].expect("kept") + (2.0 / 3.0) / s).abs() < 1e-12);
        // step 2: [1,-1] → ±1
        assert_eq!(a[0][2], Some(1.0));
        assert_eq!(a[3][2], Some(-1.0));
    }

    #[test]
    fn zero_variance_slices_are_dropped() {
        let r = vec![vec![1.0, 2.0], vec![1.0, 0.0]];
        let a = group_step_advantages(&r);
        assert_eq!(a[0][0], None);
        assert_eq!(a[1][0], None);
        assert_eq!(a[0][1], Some(1.0));
        assert_eq!(a[1][1], Some(-1.0));
    }

    #[test]
    fn decomposed_hand_computed() {
        // Outcomes (+1, −1): z = (+1, −1). Mean verdicts (1, −1 | −1): mean −1/3, var 8/9.
        let s = (8.0f64 / 9.0).sqrt();
        let a = decomposed_advantages(&[1.0, -1.0], &[vec![1.0, -1.0], vec![-1.0]], 0.5);
        assert!((a[0][0].expect("unit") - (1.0 + 0.5 * (4.0 / 3.0) / s)).abs() < 1e-12);
        assert!((a[0][1].expect("unit") - (1.0 - 0.5 * (2.0 / 3.0) / s)).abs() < 1e-12);
        assert!((a[1][0].expect("unit") - (-1.0 - 0.5 * (2.0 / 3.0) / s)).abs() < 1e-12);
        // An outcome-uniform group keeps the verdicts' signal: all failed, verdicts (1, −1 | 1).
        let u = decomposed_advantages(&[-1.0, -1.0], &[vec![1.0, -1.0], vec![1.0]], 1.0);
        let s = (8.0f64 / 9.0).sqrt();
        assert!((u[0][1].expect("unit") + (4.0 / 3.0) / s).abs() < 1e-12);
        assert!((u[1][0].expect("unit") - (2.0 / 3.0) / s).abs() < 1e-12);
        // No judge (verdicts 0): every step of a trajectory gets its outcome's z-score,
        // whatever its length (the per-index rule would z-score step 1 alone: no unit).
        let n = decomposed_advantages(&[1.0, -1.0], &[vec![0.0, 0.0], vec![0.0]], 1.0);
        assert_eq!(n, vec![vec![Some(1.0), Some(1.0)], vec![Some(-1.0)]]);
        // Both uniform: no unit anywhere.
        let none = decomposed_advantages(&[1.0, 1.0], &[vec![1.0], vec![1.0, 1.0]], 1.0);
        assert_eq!(none, vec![vec![None], vec![None, None]]);
    }

    #[test]
    fn band_is_closed() {
        let band = (0.125, 0.875);
        assert!(in_band(0.125, band));
        assert!(in_band(0.875, band));
        assert!(!in_band(0.0, band));
        assert!(!in_band(1.0, band));
        assert_eq!(accuracy(&[true, false, false, false]), 0.25);
    }
}
