//! Small pieces every task generator uses: reading a difficulty coordinate, rounding a
//! continuous count, indexing a list with a uniform, and the expert planner's plan length
//! that the planner-based oracles (household, desktop) label steps by.

/// Coordinate `i` of a difficulty vector, clamped to `[0, 1]`; NaN and a missing
/// coordinate read as 0.
pub(crate) fn coord(d: &[f64], i: usize) -> f64 {
    let x = d.get(i).copied().unwrap_or(0.0);
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

/// `⌊y⌋ + [u < frac(y)]` for a finite `y ≥ 0`: mean `y`, monotone in `y` for a fixed `u`.
pub(crate) fn stochastic_round(y: f64, u: f64) -> usize {
    let floor = y.floor();
    floor as usize + usize::from(u < y - floor)
}

/// Index `u ∈ [0, 1)` into `0..n` (`n > 0`).
pub(crate) fn index(u: f64, n: usize) -> usize {
    ((u * n as f64) as usize).min(n - 1)
}

/// The most actions an expert plan is simulated for; a state it cannot finish from counts as
/// this far.
pub(crate) const PLAN_CAP: usize = 64;

/// How many actions `expert` takes from `state` until `done` holds: the number of actions
/// `act` applied, or [`PLAN_CAP`] when the expert stops short, proposes an action `act`
/// rejects, or runs past the cap.
pub(crate) fn plan_length<S: Clone>(
    state: &S,
    expert: impl Fn(&S) -> Option<String>,
    act: impl Fn(&mut S, &str) -> bool,
    done: impl Fn(&S) -> bool,
) -> usize {
    let mut s = state.clone();
    for n in 0..PLAN_CAP {
        let Some(a) = expert(&s) else {
            return if done(&s) { n } else { PLAN_CAP };
        };
        if !act(&mut s, &a) {
            return PLAN_CAP;
        }
    }
    PLAN_CAP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_by_hand() {
        assert_eq!(coord(&[f64::NAN, 2.0, -1.0, 0.25], 0), 0.0);
        assert_eq!(coord(&[f64::NAN, 2.0, -1.0, 0.25], 1), 1.0);
        assert_eq!(coord(&[f64::NAN, 2.0, -1.0, 0.25], 2), 0.0);
        assert_eq!(coord(&[f64::NAN, 2.0, -1.0, 0.25], 3), 0.25);
        assert_eq!(coord(&[0.5], 7), 0.0);
        assert_eq!(stochastic_round(1.25, 0.2), 2);
        assert_eq!(stochastic_round(1.25, 0.3), 1);
        assert_eq!(stochastic_round(2.0, 0.0), 2);
        assert_eq!(index(0.0, 3), 0);
        assert_eq!(index(0.5, 3), 1);
        assert_eq!(index(0.999_999, 3), 2);
        // Counting down from 3 by one: three actions; a stuck expert is PLAN_CAP away.
        let down = |s: &i32| (*s > 0).then(|| "dec".to_string());
        let act = |s: &mut i32, _: &str| {
            *s -= 1;
            true
        };
        assert_eq!(plan_length(&3, down, act, |s| *s == 0), 3);
        assert_eq!(plan_length(&3, |_| None, act, |s| *s == 0), PLAN_CAP);
        assert_eq!(plan_length(&3, down, |_, _| false, |s| *s == 0), PLAN_CAP);
        assert_eq!(
            plan_length(&3, |_| Some("x".into()), act, |s| *s == 0),
            PLAN_CAP
        );
    }
}
