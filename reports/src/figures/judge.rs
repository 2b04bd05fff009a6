//! The judge figure: its accuracies over training (p⁺, p⁻ and balanced accuracy on the fixed
//! pool, balanced accuracy on the steps it judged while training, outcome accuracy, and each
//! kind of step apart), one curve per experiment with a judge.

use super::{
    ACC, BAND_NOTE, Planned, Section, XAxis, add_note, append_notes, coverage_notes, dedup_sorted,
    experiments_panel, legend_for, rows_without,
};
use crate::plot::Figure;
use crate::suite::Suite;
use std::collections::BTreeSet;

/// p⁺ keys, in order of preference.
pub(crate) const P_POS: &[&str] = &["judge/eval_pos_acc", "judge/process_acc_pos"];
/// p⁻ keys, in order of preference.
pub(crate) const P_NEG: &[&str] = &["judge/eval_neg_acc", "judge/process_acc_neg"];
/// Judge balanced accuracy `(p⁺ + p⁻) / 2` on the fixed pool.
pub(crate) const P_BAL: &[&str] = &["judge/eval_bal_acc"];
/// Judge balanced accuracy on the steps it judged during a training step.
pub(crate) const TRAIN_BAL: &[&str] = &["judge/train_bal_acc"];
/// Judge balanced accuracy on every step of the policy's rollouts it judged in a training step.
pub(crate) const STEPS_BAL: &[&str] = &["judge/steps_bal_acc"];
/// Judge outcome accuracy.
pub(crate) const OUTCOME: &[&str] = &["judge/outcome_acc"];

/// The judge panels: title and keys (in order of preference). The first three are on the fixed
/// labelled pool at eval steps, the fourth on the judge's own training steps.
const JUDGE_PANELS: [(&str, &[&str]); 6] = [
    ("p⁺: accuracy on correct steps", P_POS),
    ("p⁻: accuracy on wrong steps", P_NEG),
    ("balanced accuracy (p⁺+p⁻)/2", P_BAL),
    ("balanced acc. on the update's steps", TRAIN_BAL),
    ("balanced acc. on the policy's steps", STEPS_BAL),
    ("outcome accuracy", OUTCOME),
];

/// The judge's panels: [`JUDGE_PANELS`], then for every kind of step with a balanced
/// accuracy in some run, that kind on the pool (`judge/eval_bal_acc/<kind>`) and on the
/// policy's steps (`judge/steps_bal_acc/<kind>`).
fn judge_panels(suite: &Suite) -> Vec<(String, Vec<String>)> {
    let mut panels: Vec<(String, Vec<String>)> = JUDGE_PANELS
        .iter()
        .map(|(t, keys)| (t.to_string(), keys.iter().map(|k| k.to_string()).collect()))
        .collect();
    let mut kinds = BTreeSet::new();
    for r in suite.runs() {
        for line in &r.lines {
            for key in line.values.keys() {
                for prefix in ["judge/eval_bal_acc/", "judge/steps_bal_acc/"] {
                    if let Some(kind) = key.strip_prefix(prefix) {
                        kinds.insert(kind.to_string());
                    }
                }
            }
        }
    }
    for kind in kinds {
        panels.push((
            format!("balanced acc., pool, {kind}"),
            vec![format!("judge/eval_bal_acc/{kind}")],
        ));
        panels.push((
            format!("balanced acc., policy's steps, {kind}"),
            vec![format!("judge/steps_bal_acc/{kind}")],
        ));
    }
    panels
}

/// The keys of `keys` that some run of `suite` uses (its first logged one).
fn keys_used<'k>(suite: &Suite, keys: &[&'k str]) -> Vec<&'k str> {
    keys.iter()
        .copied()
        .filter(|k| suite.runs().any(|r| r.first_key(keys) == Some(*k)))
        .collect()
}

pub(super) fn judge_figure(suite: &Suite) -> Planned {
    let judge_panels = judge_panels(suite);
    let all: Vec<&str> = judge_panels
        .iter()
        .flat_map(|(_, keys)| keys.iter().map(String::as_str))
        .collect();
    let mut shown = Vec::new();
    let mut panels = Vec::new();
    for (title, keys) in &judge_panels {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let keys = keys.as_slice();
        let (mut p, s) = experiments_panel(
            suite,
            title,
            keys,
            XAxis::Step,
            ACC,
            "no experiment logs this judge metric (no judge, or runs written before it was logged)",
        );
        if p.message.is_none() {
            add_note(
                &mut p,
                &format!("from {}", keys_used(suite, keys).join(" / ")),
            );
        }
        shown.extend(s);
        panels.push(p);
    }
    let without = rows_without(suite, &all);
    let mut caption = format!(
        "The judge over training, per experiment with a judge. At eval steps, on a fixed labelled pool with as many correct as wrong steps (`judge/eval_*`): p⁺ (accuracy on steps the oracle marks correct), p⁻ (on steps marked wrong) and the balanced accuracy (p⁺+p⁻)/2; runs that predate the pool have p⁺ and p⁻ as `judge/process_acc_pos`/`_neg`, measured on the greedy in-domain eval trajectories instead (each panel names its keys). Every training step, against oracle labels: the balanced accuracy on the steps the judge's update drew from (`judge/train_bal_acc`, a learned judge only) and on every step of the policy's rollouts it judged (`judge/steps_bal_acc`). Then outcome accuracy at eval steps, and, for each kind of step with both labels, the balanced accuracy on the pool's steps of that kind and on the policy's (`…/<kind>`). {BAND_NOTE}"
    );
    let missing = if without.is_empty() {
        Vec::new()
    } else {
        vec![format!("no judge metrics: {}", without.join(", "))]
    };
    append_notes(
        &mut caption,
        &coverage_notes(suite, P_POS, XAxis::Step),
        &missing,
    );
    Planned {
        section: Section::Judge,
        stem: "judge".into(),
        figure: Figure {
            title: "Judge accuracy over training".into(),
            cols: 3,
            panel: (330, 360),
            panels,
            legend: legend_for(suite, &dedup_sorted(shown), true),
        },
        caption,
        after: None,
    }
}
