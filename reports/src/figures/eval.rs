//! The evaluation figures: greedy accuracy on the in-domain and out-of-domain splits, one
//! curve per experiment, against training steps and against cumulative rollouts.

use super::{
    ACC, BAND_NOTE, Planned, ROLLOUTS, Section, XAxis, add_note, append_notes, coverage_notes,
    dedup_sorted, experiments_panel, legend_for, rows_without,
};
use crate::plot::Figure;
use crate::suite::Suite;

pub(super) fn eval_figure(suite: &Suite, x: XAxis) -> Planned {
    let (id, mut s1) = experiments_panel(
        suite,
        "in-domain (eval/acc_id)",
        &["eval/acc_id"],
        x,
        ACC,
        "no eval lines in any run",
    );
    let (ood, s2) = experiments_panel(
        suite,
        "out-of-domain (eval/acc_ood)",
        &["eval/acc_ood"],
        x,
        ACC,
        "no eval lines in any run",
    );
    s1.extend(s2);
    let shown = dedup_sorted(s1);
    let mut panels = vec![id, ood];
    let mut missing = Vec::new();
    let no_eval = rows_without(suite, &["eval/acc_id", "eval/acc_ood"]);
    if !no_eval.is_empty() {
        missing.push(format!("no eval lines: {}", no_eval.join(", ")));
    }
    if x == XAxis::Rollouts {
        let no_x = rows_without(suite, &[ROLLOUTS]);
        if no_x.len() == suite.rows.len() {
            for p in &mut panels {
                p.layers.clear();
                p.message = Some(format!(
                    "{ROLLOUTS} is not in metrics.jsonl of any run (runs written before it was logged): nothing to plot against rollouts"
                ));
            }
        } else if !no_x.is_empty() {
            missing.push(format!("no {ROLLOUTS}: {}", no_x.join(", ")));
        }
    }
    if !missing.is_empty() {
        let note = missing.join("; ");
        for p in panels.iter_mut().filter(|p| p.message.is_none()) {
            add_note(p, &note);
        }
    }
    let shown = if panels.iter().all(|p| p.message.is_some()) {
        Vec::new()
    } else {
        shown
    };
    let (stem, title, xdesc) = match x {
        XAxis::Step => (
            "eval_acc_step",
            "Evaluation accuracy over training steps",
            "training step".to_string(),
        ),
        XAxis::Rollouts => (
            "eval_acc_rollouts",
            "Evaluation accuracy against rollouts",
            format!(
                "`{ROLLOUTS}` (cumulative trajectories rolled out for training, pending proposals included; at each eval step the mean over seeds)"
            ),
        ),
    };
    let mut caption = format!(
        "Greedy eval accuracy on the in-domain and out-of-domain splits against {xdesc}. {BAND_NOTE}"
    );
    append_notes(
        &mut caption,
        &coverage_notes(suite, &["eval/acc_id"], x),
        &missing,
    );
    Planned {
        section: Section::Eval,
        stem: stem.into(),
        figure: Figure {
            title: title.into(),
            cols: 2,
            panel: (480, 380),
            panels,
            legend: legend_for(suite, &shown, true),
        },
        caption,
        after: None,
    }
}
