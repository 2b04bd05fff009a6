//! The report's figures, built from a [`Suite`] as [`Figure`]s (data only; [`crate::plot`]
//! draws them). Each comes with a caption saying what is shown and what is missing.
//!
//! Aggregation over seeds: at each step, the mean over the seeds that logged that step, with the
//! 95% Student-t CI of the mean as a band (no band where a single seed has the step). Runs of
//! different lengths are therefore *not* cut at the shortest: later steps are over fewer seeds,
//! and the caption names the experiments and steps where that happens.

use crate::grid::{GridTable, steps_text};
use crate::plot::{Figure, GREEN, GREY, Layer, LegendEntry, Panel, RED, Shape, Swatch, color};
use crate::runs::{AdaptationStep, PosteriorSnapshot, Run, Verdict};
use crate::stats::MeanCi;
use crate::stats::{Aggregate, aggregate_by_step};
use crate::suite::{Row, Suite};
use plotters::style::RGBColor;
use std::collections::{BTreeMap, BTreeSet};

/// Where a figure goes in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Section {
    Eval,
    Judge,
    Diagnostics,
    Difficulty,
    Posterior,
}

/// A figure to write, with its file stem and caption.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub section: Section,
    pub stem: String,
    pub figure: Figure,
    pub caption: String,
    /// Markdown shown after the caption (a table of the figure's numbers), if any.
    pub after: Option<String>,
}

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

const ACC: &str = "accuracy (0–1)";
const STEP: &str = "training step";
const BAND_NOTE: &str = "Lines: mean over seeds; bands: 95% CI of the mean (Student t), clipped to the metric's range (fractions to [0, 1], entropies, norms and counts at 0); no band where one seed has the step.";

/// Every figure of the report for `suite`.
#[cfg(test)]
pub(crate) fn plan(suite: &Suite) -> Vec<Planned> {
    plan_all(suite).0
}

/// Every figure of the report for `suite`, and what the report should warn about (the sweep
/// figure's detection, [`crate::sweep`]).
pub(crate) fn plan_all(suite: &Suite) -> (Vec<Planned>, Vec<String>) {
    let sweep = crate::sweep::plan(suite);
    let mut out = vec![
        eval_figure(suite, XAxis::Step),
        eval_figure(suite, XAxis::Rollouts),
    ];
    out.extend(GridTable::build(suite).map(|g| grid_figure(suite, &g)));
    out.extend(sweep.figure);
    out.extend(crate::regime::plan(suite));
    out.push(judge_figure(suite));
    if suite.runs().any(|r| r.has("env/acc_mean")) {
        out.push(training_figure(suite));
    }
    out.push(diagnostics_figure(suite));
    out.extend(difficulty_figures(suite));
    out.extend(posterior_figures(suite));
    (out, sweep.warnings)
}

/// The x axis of a curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum XAxis {
    Step,
    Rollouts,
}

const ROLLOUTS: &str = "compute/rollouts";

/// Steps where some run of `row` logged its key for `keys` as `null`.
fn row_null_steps(row: &Row, keys: &[&str]) -> BTreeSet<u64> {
    row.runs
        .iter()
        .filter_map(|r| Some(r.null_steps(r.first_key(keys)?)))
        .flatten()
        .collect()
}

/// One row's curve of the first of `keys` each run logs, aggregated per step over seeds.
fn row_curve(row: &Row, keys: &[&str], x: XAxis) -> Vec<Aggregate> {
    let curves: Vec<Vec<(u64, f64, f64)>> = row
        .runs
        .iter()
        .filter_map(|r| {
            let key = r.first_key(keys)?;
            let xs: BTreeMap<u64, f64> = match x {
                XAxis::Step => BTreeMap::new(),
                XAxis::Rollouts => r.series(ROLLOUTS).into_iter().collect(),
            };
            Some(
                r.series(key)
                    .into_iter()
                    .filter_map(|(s, y)| match x {
                        XAxis::Step => Some((s, s as f64, y)),
                        XAxis::Rollouts => Some((s, *xs.get(&s)?, y)),
                    })
                    .collect(),
            )
        })
        .collect();
    aggregate_by_step(&curves)
}

/// The range a metric can take, for clipping its CI band (an interval of the mean with few
/// seeds reaches past it: a clip fraction below 0, an accuracy above 1).
fn domain(keys: &[&str]) -> (f64, f64) {
    let bounded = |k: &&str| {
        k.ends_with("clipfrac")
            || k.contains("acc")
            || k.ends_with("format_fail")
            || k.ends_with("_rate")
    };
    let non_negative = |k: &&str| {
        k.ends_with("entropy")
            || k.ends_with("grad_norm")
            || k.ends_with("_groups")
            || k.ends_with("units")
    };
    if !keys.is_empty() && keys.iter().all(bounded) {
        (0.0, 1.0)
    } else if !keys.is_empty() && keys.iter().all(non_negative) {
        (0.0, f64::INFINITY)
    } else {
        (f64::NEG_INFINITY, f64::INFINITY)
    }
}

/// Line and CI band of an aggregated curve; the line breaks across `gaps` (steps where every
/// seed logged `null`, so no value exists: nothing is drawn through them). The band is clipped
/// to the metric's `range`.
fn curve_layers(
    c: RGBColor,
    agg: &[Aggregate],
    gaps: &BTreeSet<u64>,
    dots: bool,
    range: (f64, f64),
) -> Vec<Layer> {
    let mut segments: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new()];
    for a in agg {
        match a.y.half_width {
            Some(h) => {
                if let Some(s) = segments.last_mut() {
                    let lo = (a.y.mean - h).max(range.0);
                    let hi = (a.y.mean + h).min(range.1);
                    s.push((a.x, lo, hi));
                }
            }
            None => segments.push(Vec::new()),
        }
    }
    segments.retain(|s| !s.is_empty());
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (i, a) in agg.iter().enumerate() {
        let gap_before = i > 0 && gaps.range(agg[i - 1].step + 1..a.step).next().is_some();
        if gap_before {
            lines.push(Vec::new());
        }
        if let Some(l) = lines.last_mut() {
            l.push((a.x, a.y.mean));
        }
    }
    let mut out = vec![Layer::Band { color: c, segments }];
    out.extend(
        lines
            .into_iter()
            .filter(|l| !l.is_empty())
            .map(|points| Layer::Line {
                color: c,
                points,
                dashed: false,
                dots,
            }),
    );
    out
}

/// Where an experiment's curve averages fewer seeds than it has: "`b`: n=2 at steps ≥ 9".
fn coverage_notes(suite: &Suite, keys: &[&str], x: XAxis) -> Vec<String> {
    let mut out = Vec::new();
    for row in &suite.rows {
        let with: Vec<&Run> = row
            .runs
            .iter()
            .filter(|r| r.first_key(keys).is_some())
            .collect();
        let ends: Vec<u64> = with.iter().filter_map(|r| r.last_step()).collect();
        let (Some(lo), Some(hi)) = (ends.iter().min(), ends.iter().max()) else {
            continue;
        };
        if lo != hi {
            let agg = row_curve(row, keys, x);
            let fewer = agg.iter().filter(|a| a.y.n < with.len()).count();
            out.push(format!(
                "`{}`: runs end at steps {} — {fewer} point(s) after step {lo} average fewer seeds",
                row.experiment,
                ends.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    out
}

/// Appends `text` to a panel's note.
fn add_note(p: &mut Panel, text: &str) {
    p.note = Some(match p.note.take() {
        Some(n) => format!("{text}; {n}"),
        None => text.to_string(),
    });
}

/// `3, 5, 7` (at most 6 values, then `…`).
fn list(steps: &BTreeSet<u64>) -> String {
    let mut v: Vec<String> = steps.iter().take(6).map(u64::to_string).collect();
    if steps.len() > 6 {
        v.push("…".into());
    }
    v.join(", ")
}

/// Names of rows with no run logging any of `keys`.
fn rows_without(suite: &Suite, keys: &[&str]) -> Vec<String> {
    suite
        .rows
        .iter()
        .filter(|row| row.runs.iter().all(|r| r.first_key(keys).is_none()))
        .map(|row| row.experiment.clone())
        .collect()
}

/// A panel of one curve per experiment (those with data), or a message if none has any.
fn experiments_panel(
    suite: &Suite,
    title: &str,
    keys: &[&str],
    x: XAxis,
    y_label: &str,
    empty: &str,
) -> (Panel, Vec<usize>) {
    // Every band first, then every line, so that no band veils another experiment's line.
    let (mut bands, mut lines) = (Vec::new(), Vec::new());
    let mut shown = Vec::new();
    let mut x_max = 0.0f64;
    let mut nulls = Vec::new();
    for (i, row) in suite.rows.iter().enumerate() {
        let agg = row_curve(row, keys, x);
        let null_steps = row_null_steps(row, keys);
        if !null_steps.is_empty() {
            nulls.push(format!("{} at step {}", row.experiment, list(&null_steps)));
        }
        if !agg.is_empty() {
            x_max = agg.iter().map(|a| a.x).fold(x_max, f64::max);
            for l in curve_layers(color(i), &agg, &null_steps, agg.len() <= 12, domain(keys)) {
                match l {
                    Layer::Band { .. } => bands.push(l),
                    _ => lines.push(l),
                }
            }
            shown.push(i);
        }
    }
    let mut layers = bands;
    layers.append(&mut lines);
    let accuracy = y_label == ACC;
    let panel = Panel {
        title: title.to_string(),
        x_label: match x {
            XAxis::Step => STEP.into(),
            XAxis::Rollouts => "rollouts (cumulative trajectories)".into(),
        },
        y_label: y_label.to_string(),
        y_range: accuracy.then_some((-0.02, 1.02)),
        // Cumulative counts start at 0.
        x_range: (x == XAxis::Rollouts && x_max > 0.0).then_some((0.0, x_max)),
        message: layers.is_empty().then(|| empty.to_string()),
        note: (!nulls.is_empty()).then(|| format!("null (non-finite): {}", nulls.join("; "))),
        layers,
    };
    (panel, shown)
}

fn legend_for(suite: &Suite, shown: &[usize], band: bool) -> Vec<LegendEntry> {
    let mut l: Vec<LegendEntry> = shown
        .iter()
        .map(|&i| {
            let row = &suite.rows[i];
            LegendEntry {
                swatch: Swatch::Line(color(i)),
                label: format!("{} (n={})", row.experiment, row.runs.len()),
            }
        })
        .collect();
    if band && !l.is_empty() {
        l.push(LegendEntry {
            swatch: Swatch::Band(GREY),
            label: "95% CI over seeds".into(),
        });
    }
    l
}

fn dedup_sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

fn eval_figure(suite: &Suite, x: XAxis) -> Planned {
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

fn append_notes(caption: &mut String, coverage: &[String], missing: &[String]) {
    if !coverage.is_empty() {
        *caption += &format!(
            " Runs of different lengths (each step averages the seeds that reached it): {}.",
            coverage.join("; ")
        );
    }
    if !missing.is_empty() {
        *caption += &format!(" Missing: {}.", missing.join("; "));
    }
}

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

fn judge_figure(suite: &Suite) -> Planned {
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

/// Line (dashed or not) with dots and CI band of one evaluation over the grid levels; levels
/// without a value are skipped.
fn grid_layers(c: RGBColor, levels: &[f64], cells: &[Option<MeanCi>], dashed: bool) -> Vec<Layer> {
    let agg: Vec<Aggregate> = levels
        .iter()
        .zip(cells)
        .enumerate()
        .filter_map(|(i, (&x, cell))| {
            Some(Aggregate {
                step: i as u64,
                x,
                y: (*cell)?,
            })
        })
        .collect();
    let mut layers = curve_layers(c, &agg, &BTreeSet::new(), true, (0.0, 1.0));
    for l in &mut layers {
        if let Layer::Line { dashed: d, .. } = l {
            *d = dashed;
        }
    }
    layers
}

/// One panel per experiment with grid accuracies: the first evaluation (dashed, grey) and the
/// last (solid, the experiment's colour) over the grid levels.
fn grid_figure(suite: &Suite, g: &GridTable) -> Planned {
    let xs: Vec<f64> = g.levels.iter().map(|l| l.value).collect();
    let (lo, hi) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min).min(0.0),
        xs.iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
            .max(1.0),
    );
    let pad = 0.04 * (hi - lo);
    let panels: Vec<Panel> = g
        .rows
        .iter()
        .map(|r| {
            let c = color(r.index);
            let mut layers = grid_layers(GREY, &xs, &r.start.cells, true);
            layers.extend(grid_layers(c, &xs, &r.last.cells, false));
            Panel {
                title: r.experiment.clone(),
                x_label: "grid level (difficulty on every dim.)".into(),
                y_label: ACC.into(),
                x_range: Some((lo - pad, hi + pad)),
                y_range: Some((-0.02, 1.02)),
                layers,
                note: Some(format!("last eval: {}", steps_text(&r.last.steps))),
                message: None,
            }
        })
        .collect();
    let shown: Vec<usize> = g.rows.iter().map(|r| r.index).collect();
    let mut legend = vec![LegendEntry {
        swatch: Swatch::Dashed(GREY),
        label: g.start_label().into(),
    }];
    legend.extend(legend_for(suite, &shown, true));
    let start = if g.starts_at_zero() {
        "at step 0 (the warm-started policy, dashed grey)"
    } else {
        "at each run's first evaluation with grid keys (dashed grey; not step 0 in every run)"
    };
    let mut caption = format!(
        "In-domain accuracy per level of the fixed evaluation grid (`eval/acc_grid/<level>`: the eval tasks whose difficulty coordinate is that level on every dimension, 0 = easiest, 1 = hardest; `eval/acc_id` is the mean over the levels), per experiment: {start} and at each run's last evaluation (solid). Lines: mean over seeds; bands: 95% CI of the mean (Student t) clipped to [0, 1]; no band where one seed has the value."
    );
    if !g.without.is_empty() {
        caption += &format!(" Missing: no `eval/acc_grid/*`: {}.", g.without.join(", "));
    }
    Planned {
        section: Section::Eval,
        stem: "eval_acc_grid".into(),
        figure: Figure {
            title: "In-domain accuracy over the difficulty grid".into(),
            cols: g.rows.len().clamp(1, 3),
            panel: (330, 330),
            panels,
            legend,
        },
        caption,
        after: Some(g.markdown()),
    }
}

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
fn training_figure(suite: &Suite) -> Planned {
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

fn diagnostics_figure(suite: &Suite) -> Planned {
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

/// Seed colours: the palette without green and red (kept for accepted/rejected).
fn seed_color(i: usize) -> RGBColor {
    const IDX: [usize; 8] = [0, 1, 4, 5, 6, 9, 8, 7];
    color(IDX[i % IDX.len()])
}

/// One run's difficulty data, whichever source it comes from.
struct DifficultyData {
    dims: Vec<String>,
    /// Per dim: (step, mean, min, max) over slots.
    curves: Vec<Vec<(f64, f64, f64, f64)>>,
    /// Per dim: accepted (point, shape) and rejected points.
    accepted: Vec<Vec<((f64, f64), Shape)>>,
    rejected: Vec<Vec<(f64, f64)>>,
    from_adaptation: bool,
}

fn difficulty_from_adaptation(steps: &[AdaptationStep]) -> DifficultyData {
    let k = steps
        .iter()
        .map(|s| s.dims.len().max(s.slots.first().map_or(0, Vec::len)))
        .max()
        .unwrap_or(0);
    let named = steps
        .iter()
        .find(|s| !s.dims.is_empty())
        .map(|s| s.dims.clone());
    let dims = (0..k)
        .map(|d| {
            named
                .as_ref()
                .and_then(|n| n.get(d).cloned())
                .unwrap_or_else(|| format!("dim {d}"))
        })
        .collect();
    let mut data = DifficultyData {
        dims,
        curves: vec![Vec::new(); k],
        accepted: vec![Vec::new(); k],
        rejected: vec![Vec::new(); k],
        from_adaptation: true,
    };
    for s in steps {
        let x = s.step as f64;
        for d in 0..k {
            let vals: Vec<f64> = s
                .slots
                .iter()
                .filter_map(|slot| slot.get(d).copied().flatten())
                .filter(|v| v.is_finite())
                .collect();
            if !vals.is_empty() {
                let mean = vals.iter().sum::<f64>() / vals.len() as f64;
                let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                data.curves[d].push((x, mean, lo, hi));
            }
        }
        for p in &s.proposals {
            for d in 0..k {
                let (Some(Some(from)), Some(Some(to))) = (p.from.get(d), p.to.get(d)) else {
                    continue;
                };
                if (to - from).abs() < 1e-12 {
                    continue;
                }
                match p.verdict {
                    Verdict::Accepted => {
                        let shape = if to > from { Shape::Up } else { Shape::Down };
                        data.accepted[d].push(((x, *to), shape));
                    }
                    Verdict::Rejected => data.rejected[d].push((x, *to)),
                    Verdict::Pending => {}
                }
            }
        }
    }
    data
}

/// The environment's dimension order, where some run of the suite records it
/// (`adaptation.jsonl` dims or posterior names); metrics keys alone are alphabetical.
fn dim_order(suite: &Suite) -> Vec<String> {
    let from_adaptation = suite.runs().find_map(|r| {
        r.adaptation
            .as_ref()?
            .iter()
            .find(|s| !s.dims.is_empty())
            .map(|s| s.dims.clone())
    });
    let from_posterior = || {
        suite.runs().find_map(|r| {
            r.posterior
                .as_ref()?
                .iter()
                .find(|s| !s.names.is_empty())
                .map(|s| s.names.clone())
        })
    };
    from_adaptation.or_else(from_posterior).unwrap_or_default()
}

fn difficulty_from_metrics(run: &Run, order: &[String]) -> Option<DifficultyData> {
    const PREFIX: &str = "env/difficulty/";
    let mut names: Vec<String> = Vec::new();
    for l in &run.lines {
        for k in l.values.keys() {
            if let Some(n) = k.strip_prefix(PREFIX)
                && !names.iter().any(|x| x == n)
            {
                names.push(n.to_string());
            }
        }
    }
    if names.is_empty() {
        return None;
    }
    // Known dimensions in the environment's order, then any other alphabetically.
    names.sort_by_key(|n| order.iter().position(|o| o == n).unwrap_or(usize::MAX));
    let k = names.len();
    let mut data = DifficultyData {
        dims: names.clone(),
        curves: vec![Vec::new(); k],
        accepted: vec![Vec::new(); k],
        rejected: vec![Vec::new(); k],
        from_adaptation: false,
    };
    let rises = |key: &str| -> Vec<u64> {
        run.series(key)
            .windows(2)
            .filter(|w| w[1].1 > w[0].1)
            .map(|w| w[1].0)
            .collect()
    };
    let (acc, rej) = (rises("env/accepted"), rises("env/rejected"));
    for (d, name) in names.iter().enumerate() {
        let series: BTreeMap<u64, f64> =
            run.series(&format!("{PREFIX}{name}")).into_iter().collect();
        data.curves[d] = series.iter().map(|(&s, &v)| (s as f64, v, v, v)).collect();
        // An accepted proposal moves a slot, so the mean moves on the dimension(s) it changed:
        // mark it there only. A rejected one moves nothing: its dimension is unknown, so it is
        // marked on every dimension.
        let moved = |s: &u64| {
            let now = series.get(s)?;
            let before = series.range(..*s).next_back()?.1;
            ((now - before).abs() > 1e-12).then_some(*now)
        };
        data.accepted[d] = acc
            .iter()
            .filter_map(|s| Some(((*s as f64, moved(s)?), Shape::Circle)))
            .collect();
        data.rejected[d] = rej
            .iter()
            .filter_map(|s| Some((*s as f64, *series.get(s)?)))
            .collect();
    }
    Some(data)
}

fn difficulty_figures(suite: &Suite) -> Vec<Planned> {
    let order = dim_order(suite);
    let mut out = Vec::new();
    for row in &suite.rows {
        let data: Vec<(&Run, DifficultyData)> = row
            .runs
            .iter()
            .filter_map(|r| {
                let d = match &r.adaptation {
                    Some(a) if !a.is_empty() => Some(difficulty_from_adaptation(a)),
                    _ => difficulty_from_metrics(r, &order),
                }?;
                Some((r, d))
            })
            .collect();
        if let Some(p) = difficulty_figure(row, &data) {
            out.push(p);
        }
    }
    if out.is_empty() {
        out.push(Planned {
            section: Section::Difficulty,
            stem: "difficulty".into(),
            figure: Figure {
                title: "Difficulty over training".into(),
                cols: 1,
                panel: (900, 300),
                panels: vec![Panel {
                    title: "difficulty".into(),
                    message: Some(
                        "no run has adaptation.jsonl or env/difficulty/<dim> in metrics.jsonl"
                            .into(),
                    ),
                    ..Panel::default()
                }],
                legend: vec![],
            },
            caption: "No difficulty was logged by any run.".into(),
            after: None,
        });
    }
    out
}

fn difficulty_figure(row: &Row, data: &[(&Run, DifficultyData)]) -> Option<Planned> {
    let dims = data.first()?.1.dims.clone();
    let any_adaptation = data.iter().any(|(_, d)| d.from_adaptation);
    let all_adaptation = data.iter().all(|(_, d)| d.from_adaptation);
    let mut panels = Vec::new();
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for (di, name) in dims.iter().enumerate() {
        let mut layers = Vec::new();
        for (si, (_, d)) in data.iter().enumerate() {
            let Some(j) = d.dims.iter().position(|n| n == name) else {
                continue;
            };
            let c = seed_color(si);
            let curve = &d.curves[j];
            for &(_, m, a, b) in curve {
                lo = lo.min(a).min(m);
                hi = hi.max(b).max(m);
            }
            if d.from_adaptation {
                layers.push(Layer::Band {
                    color: c,
                    segments: vec![curve.iter().map(|&(x, _, a, b)| (x, a, b)).collect()],
                });
            }
            layers.push(Layer::Line {
                color: c,
                points: curve.iter().map(|&(x, m, _, _)| (x, m)).collect(),
                dashed: false,
                dots: false,
            });
            for shape in [Shape::Up, Shape::Down, Shape::Circle] {
                let pts: Vec<(f64, f64)> = d.accepted[j]
                    .iter()
                    .filter(|(_, s)| *s == shape)
                    .map(|(p, _)| *p)
                    .collect();
                if !pts.is_empty() {
                    layers.push(Layer::Markers {
                        color: GREEN,
                        shape,
                        points: pts,
                    });
                }
            }
            layers.push(Layer::Markers {
                color: RED,
                shape: Shape::Cross,
                points: d.rejected[j].clone(),
            });
        }
        panels.push(Panel {
            title: name.clone(),
            x_label: STEP.into(),
            y_label: "difficulty (0 easy – 1 hard)".into(),
            layers,
            note: (di == 0 && !all_adaptation)
                .then(|| "from env/difficulty/* (no adaptation.jsonl): slot mean only".into()),
            ..Panel::default()
        });
    }
    for p in &mut panels {
        // A little room so that lines at exactly 0 or 1 are not hidden by the axes.
        p.y_range = Some((lo.min(0.0) - 0.04, hi.max(1.0) + 0.04));
    }
    let mut legend: Vec<LegendEntry> = data
        .iter()
        .enumerate()
        .map(|(si, (r, _))| LegendEntry {
            swatch: Swatch::Line(seed_color(si)),
            label: r.seed.map_or_else(|| r.label(), |s| format!("seed {s}")),
        })
        .collect();
    let any_accepted = |pred: fn(&DifficultyData) -> bool| {
        data.iter()
            .any(|(_, d)| pred(d) && d.accepted.iter().any(|a| !a.is_empty()))
    };
    if any_adaptation {
        legend.push(LegendEntry {
            swatch: Swatch::Band(GREY),
            label: "slot min–max".into(),
        });
    }
    if any_accepted(|d| d.from_adaptation) {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(GREEN, Shape::Up),
            label: "accepted ▲ harder ▼ easier".into(),
        });
    }
    if any_accepted(|d| !d.from_adaptation) {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(GREEN, Shape::Circle),
            label: "accepted (env/accepted rose)".into(),
        });
    }
    if data
        .iter()
        .any(|(_, d)| d.rejected.iter().any(|r| !r.is_empty()))
    {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(RED, Shape::Cross),
            label: "rejected".into(),
        });
    }
    let source = if all_adaptation {
        "from adaptation.jsonl: line = mean over the task slots, band = min–max over slots; markers at the step a proposal was resolved, at the proposed value, on each dimension it changed"
    } else if any_adaptation {
        "from adaptation.jsonl where a run has it, else from env/difficulty/<dim> (mean over slots only, markers at the steps where env/accepted or env/rejected rose)"
    } else {
        "from env/difficulty/<dim> in metrics.jsonl (adaptation.jsonl absent): the mean over slots only, no spread; markers at the steps where the cumulative env/accepted or env/rejected count rose, an acceptance on the dimension(s) whose mean moved, a rejection (dimension unknown) on every dimension"
    };
    let cols = dims.len().clamp(1, 3);
    Some(Planned {
        section: Section::Difficulty,
        stem: format!("difficulty_{}", file_safe(&row.experiment)),
        figure: Figure {
            title: format!("Difficulty over training — {}", row.experiment),
            cols,
            panel: (330, 330),
            panels,
            legend,
        },
        caption: format!(
            "`{}`: task difficulty per dimension (0 = easiest, 1 = hardest), one line per seed (identical seeds draw over each other), {source}.",
            row.experiment
        ),
        after: None,
    })
}

/// The snapshots to show: all if at most 3, else the first, middle and last.
fn pick_snapshots(snaps: &[PosteriorSnapshot]) -> Vec<&PosteriorSnapshot> {
    if snaps.len() <= 3 {
        snaps.iter().collect()
    } else {
        vec![&snaps[0], &snaps[snaps.len() / 2], &snaps[snaps.len() - 1]]
    }
}

fn posterior_figures(suite: &Suite) -> Vec<Planned> {
    suite
        .runs()
        .filter_map(|r| {
            let snaps = r.posterior.as_ref().filter(|p| !p.is_empty())?;
            Some(posterior_figure(r, snaps))
        })
        .collect()
}

fn dim_name(run: &Run, snap: &PosteriorSnapshot, d: usize) -> String {
    snap.names
        .get(d)
        .cloned()
        .or_else(|| {
            run.adaptation
                .as_ref()?
                .iter()
                .find_map(|s| s.dims.get(d).cloned())
        })
        .unwrap_or_else(|| format!("dim {d}"))
}

fn posterior_panel(run: &Run, snap: &PosteriorSnapshot, slice_i: usize) -> Panel {
    let blue = color(0);
    let slice = &snap.dims[slice_i];
    let d = slice.dim;
    let mut layers = Vec::new();
    if let Some([a, b]) = snap.band {
        layers.push(Layer::HSpan {
            color: GREEN,
            lo: a,
            hi: b,
        });
    }
    if let Some(t) = snap.target {
        layers.push(Layer::HLine { color: GREEN, y: t });
    }
    if let Some(Some(c)) = snap.center.get(d) {
        layers.push(Layer::VLine { color: GREY, x: *c });
    }
    let pts: Vec<(f64, f64, f64)> = slice
        .grid
        .iter()
        .zip(&slice.mean_acc)
        .zip(&slice.sd_acc)
        .filter_map(|((g, m), s)| Some(((*g)?, (*m)?, (*s)?)))
        .filter(|(g, m, s)| g.is_finite() && m.is_finite() && s.is_finite())
        .collect();
    layers.push(Layer::Band {
        color: blue,
        segments: vec![
            pts.iter()
                .map(|&(g, m, s)| (g, m - 2.0 * s, m + 2.0 * s))
                .collect(),
        ],
    });
    layers.push(Layer::Line {
        color: blue,
        points: pts.iter().map(|&(g, m, _)| (g, m)).collect(),
        dashed: false,
        dots: false,
    });
    let obs: Vec<(f64, f64)> = snap
        .observations
        .iter()
        .filter(|o| o.step.is_none_or(|s| s <= snap.step))
        .filter_map(|o| Some(((*o.difficulty.get(d)?)?, o.acc?)))
        .collect();
    layers.push(Layer::Markers {
        color: GREY,
        shape: Shape::Circle,
        points: obs,
    });
    let name = dim_name(run, snap, d);
    let grid_max = pts.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let grid_min = pts.iter().map(|p| p.0).fold(0.0f64, f64::min);
    Panel {
        title: format!("step {} · {name}", snap.step),
        x_label: format!("{name} (difficulty)"),
        y_label: "predicted accuracy".into(),
        x_range: Some((grid_min, grid_max)),
        y_range: Some((0.0, 1.0)),
        message: pts
            .is_empty()
            .then(|| "no finite prediction in this slice".into()),
        layers,
        ..Panel::default()
    }
}

fn posterior_figure(run: &Run, snaps: &[PosteriorSnapshot]) -> Planned {
    let chosen = pick_snapshots(snaps);
    let cols = chosen
        .iter()
        .map(|s| s.dims.len())
        .max()
        .unwrap_or(1)
        .clamp(1, 3);
    let mut panels = Vec::new();
    for s in &chosen {
        for i in 0..cols {
            panels.push(if i < s.dims.len() {
                posterior_panel(run, s, i)
            } else {
                Panel {
                    title: format!("step {}", s.step),
                    message: Some("no slice for this dimension".into()),
                    ..Panel::default()
                }
            });
        }
    }
    let has_band = chosen.iter().any(|s| s.band.is_some());
    let has_target = chosen.iter().any(|s| s.target.is_some());
    let has_obs = chosen.iter().any(|s| !s.observations.is_empty());
    let mut legend = vec![
        LegendEntry {
            swatch: Swatch::Line(color(0)),
            label: "predicted accuracy".into(),
        },
        LegendEntry {
            swatch: Swatch::Band(color(0)),
            label: "± 2 sd".into(),
        },
    ];
    if has_band {
        legend.push(LegendEntry {
            swatch: Swatch::Band(GREEN),
            label: "target band".into(),
        });
    }
    if has_target {
        legend.push(LegendEntry {
            swatch: Swatch::Dashed(GREEN),
            label: "target".into(),
        });
    }
    if has_obs {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(GREY, Shape::Circle),
            label: "observations".into(),
        });
    }
    legend.push(LegendEntry {
        swatch: Swatch::Dashed(GREY),
        label: "slice position".into(),
    });
    let mut missing = Vec::new();
    if !has_band || !has_target {
        missing.push("no target/band in posterior.jsonl (written before they were logged)");
    }
    if !has_obs {
        missing.push("no observations in posterior.jsonl");
    }
    let mut caption = format!(
        "`{}`: the Gaussian-process proposer's predicted accuracy along each difficulty dimension (the other dimensions fixed at the mean slot difficulty, dashed vertical line), mean ± 2 sd, at {} of {} logged eval steps ({}). Observations are the (difficulty, accuracy) points the model holds, projected onto the dimension.",
        run.label(),
        chosen.len(),
        snaps.len(),
        chosen
            .iter()
            .map(|s| format!("step {}", s.step))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !missing.is_empty() {
        caption += &format!(" Missing: {}.", missing.join("; "));
    }
    let seed = run
        .seed
        .map_or_else(|| "seed-unknown".into(), |s| format!("seed-{s}"));
    Planned {
        section: Section::Posterior,
        stem: format!("posterior_{}_{seed}", file_safe(&run.experiment)),
        figure: Figure {
            title: format!("GP posterior — {}", run.label()),
            cols,
            panel: (330, 300),
            panels,
            legend,
        },
        caption,
        after: None,
    }
}

/// A file-name-safe version of `s` (letters, digits, `-`, `_`, `.`).
pub(crate) fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}
