//! The training panels: small multiples of one metric per panel, one curve per experiment —
//! where the policy's training signal came from (`training`), and the reward and PPO
//! statistics of the policy and the judge (`diagnostics`).

use super::{
    BAND_NOTE, Planned, Section, XAxis, append_notes, coverage_notes, dedup_sorted,
    experiments_panel, legend_for,
};
use crate::plot::Figure;
use crate::suite::Suite;

/// The diagnostics panels: title, key, y label.
const DIAGNOSTICS: [(&str, &str, &str); 9] = [
    ("reward", "reward/step_mean", "mean step reward"),
    ("policy KL", "policy/kl", "KL (nats)"),
    (
        "policy clip fraction",
        "policy/clipfrac",
        "fraction of tokens",
    ),
    ("policy entropy", "policy/entropy", "entropy (nats)"),
    ("policy grad norm", "policy/grad_norm", "L2 norm"),
    ("judge KL", "judge/kl", "KL (nats)"),
    (
        "judge clip fraction",
        "judge/clipfrac",
        "fraction of tokens",
    ),
    ("judge entropy", "judge/entropy", "entropy (nats)"),
    ("judge grad norm", "judge/grad_norm", "L2 norm"),
];

/// The training-signal panels: title, key, y label.
const TRAINING: [(&str, &str, &str); 4] = [
    (
        "training success",
        "env/acc_mean",
        "success rate of the step's groups",
    ),
    (
        "right steps",
        "env/step_acc",
        "share of the rollouts' steps",
    ),
    (
        "groups with outcome signal",
        "policy/mixed_groups",
        "groups (not all solved or all failed)",
    ),
    (
        "steps trained in uniform groups",
        "policy/uniform_units",
        "steps with an advantage",
    ),
];

/// Small multiples of one curve per experiment for each `(title, key, y label)` panel.
fn panels_figure(
    suite: &Suite,
    stem: &str,
    title: &str,
    specs: &[(&str, &str, &str)],
    caption: String,
    first_key: &str,
) -> Planned {
    let mut shown = Vec::new();
    let panels = specs
        .iter()
        .map(|&(title, key, y)| {
            let (p, s) = experiments_panel(
                suite,
                title,
                &[key],
                XAxis::Step,
                y,
                &format!("{key} not logged by any run"),
            );
            shown.extend(s);
            p
        })
        .collect();
    let mut caption = caption;
    append_notes(
        &mut caption,
        &coverage_notes(suite, &[first_key], XAxis::Step),
        &[],
    );
    Planned {
        section: Section::Diagnostics,
        stem: stem.into(),
        figure: Figure {
            title: title.into(),
            cols: if specs.len() == 4 { 2 } else { 3 },
            panel: (330, 290),
            panels,
            legend: legend_for(suite, &dedup_sorted(shown), true),
        },
        caption,
        after: None,
    }
}

/// Where the policy's training signal came from, per step: the training rollouts' success and
/// right-step share, how many groups carried outcome signal, and how many steps were trained
/// in outcome-uniform groups (only a step reward can tell their rollouts apart).
pub(super) fn training_figure(suite: &Suite) -> Planned {
    panels_figure(
        suite,
        "training",
        "Training signal",
        &TRAINING,
        format!(
            "Per training step: the success rate of the step's own groups (`env/acc_mean`), the share of their steps the oracle labels right (`env/step_acc`), the groups whose rollouts neither all solved nor all failed (`policy/mixed_groups`: outcome signal), and the steps that got an advantage in outcome-uniform groups (`policy/uniform_units`: 0 unless step rewards reach them with the policy band off). {BAND_NOTE}"
        ),
        "env/acc_mean",
    )
}

pub(super) fn diagnostics_figure(suite: &Suite) -> Planned {
    panels_figure(
        suite,
        "diagnostics",
        "Training diagnostics",
        &DIAGNOSTICS,
        format!(
            "Training diagnostics per step (small multiples): mean step reward, and the PPO statistics of the policy and (where one is trained) the judge: KL to the reference, clip fraction, entropy, gradient norm before clipping. {BAND_NOTE}"
        ),
        "reward/step_mean",
    )
}
