//! The report's figures, built from a [`Suite`] as [`Figure`]s (data only; [`crate::plot`]
//! draws them). Each comes with a caption saying what is shown and what is missing.
//!
//! Aggregation over seeds: at each step, the mean over the seeds that logged that step, with the
//! 95% Student-t CI of the mean as a band (no band where a single seed has the step). Runs of
//! different lengths are therefore *not* cut at the shortest: later steps are over fewer seeds,
//! and the caption names the experiments and steps where that happens.
//!
//! The figures by kind, one file each: `eval.rs` (evaluation accuracy against steps and
//! rollouts), `grid.rs` (accuracy over the difficulty grid), `judge.rs` (the judge's
//! accuracies), `training.rs` (training signal and PPO diagnostics), `difficulty.rs` (task
//! difficulty over training), `posterior.rs` (the GP proposer's posterior). This file plans
//! them ([`plan_all`]) and holds what several kinds share: the curves of one metric per
//! experiment over seeds, their legend and the caption notes.

mod difficulty;
mod eval;
mod grid;
mod judge;
mod posterior;
mod training;

use crate::grid::GridTable;
use crate::plot::{Figure, GREY, Layer, LegendEntry, Panel, Swatch, color};
use crate::runs::Run;
use crate::stats::{Aggregate, aggregate_by_step};
use crate::suite::{Row, Suite};
use difficulty::difficulty_figures;
use eval::eval_figure;
use grid::grid_figure;
use judge::judge_figure;
use plotters::style::RGBColor;
use posterior::posterior_figures;
use std::collections::{BTreeMap, BTreeSet};
use training::{diagnostics_figure, training_figure};

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
