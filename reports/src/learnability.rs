//! The judge-learnability study (`rlany judge-fit`): `OUT/cells/*.json`, one cell (seed ×
//! label count × label noise) each, → `OUT/report.md` with a table (the kept checkpoint's
//! held-out accuracy by kind, mean ± 95% CI over seeds and every seed's value) and a figure
//! of learning curves (one panel per cell: held-out borderline accuracy per seed against
//! epochs, with the judge's agreement with its own flipped training labels).
//!
//! A cell file is `{cell: {labels, noise}, seed, train, val, batch, best_step, points: [{step,
//! loss, val_bal_acc, <probe keys>}]}`; the probe's keys are `pool|policy/(logit|vote)_
//! (pos|neg|bal)_acc[/<kind>]` and `train|val/(agree_given|agree_flipped|oracle_bal_acc)`.

use crate::error::{ReportError, io};
use crate::plot::{self, Figure, GREY, Layer, LegendEntry, Panel, Shape, Swatch};
use crate::stats::mean_ci95;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One cell's results as `rlany judge-fit` wrote them.
#[derive(Debug, Clone, Deserialize)]
pub struct Cell {
    /// The label count and noise.
    pub cell: CellKey,
    /// The seed.
    pub seed: u64,
    /// Labels trained on.
    pub train: usize,
    /// Labels held out for validation.
    pub val: usize,
    /// Labels per optimiser step.
    pub batch: usize,
    /// The step of the kept checkpoint.
    pub best_step: usize,
    /// Every measurement.
    pub points: Vec<BTreeMap<String, f64>>,
}

/// A cell's coordinates.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct CellKey {
    /// Label count.
    pub labels: usize,
    /// Label noise.
    pub noise: f64,
}

impl Cell {
    /// The measurement at `step`.
    fn at(&self, step: usize) -> Option<&BTreeMap<String, f64>> {
        self.points
            .iter()
            .find(|p| p.get("step").copied() == Some(step as f64))
    }

    /// `key` at the kept checkpoint.
    pub fn best(&self, key: &str) -> Option<f64> {
        self.at(self.best_step).and_then(|p| p.get(key).copied())
    }

    /// `key` at the last measurement (the checkpoint a fit without validation keeps).
    pub fn last(&self, key: &str) -> Option<f64> {
        self.points.last().and_then(|p| p.get(key).copied())
    }

    fn epoch(&self, step: f64) -> f64 {
        step * self.batch as f64 / self.train.max(1) as f64
    }
}

/// Reads every `*.json` of `dir/cells`, sorted by labels, noise, seed.
pub fn read_cells(dir: &Path) -> Result<Vec<Cell>, ReportError> {
    let cells_dir = dir.join("cells");
    let mut cells = Vec::new();
    let entries = std::fs::read_dir(&cells_dir).map_err(io(&cells_dir))?;
    for e in entries {
        let path = e.map_err(io(&cells_dir))?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        let cell: Cell = serde_json::from_str(&text).map_err(|e| ReportError::BadFile {
            path: path.clone(),
            message: format!("not a judge-fit cell: {e}"),
        })?;
        cells.push(cell);
    }
    cells.sort_by(|a, b| {
        (a.cell.labels, a.cell.noise, a.seed)
            .partial_cmp(&(b.cell.labels, b.cell.noise, b.seed))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(cells)
}

/// The columns of the table: (header, key, at the kept checkpoint or the last).
const COLUMNS: &[(&str, &str, bool)] = &[
    (
        "pool, borderline (logit)",
        "pool/logit_bal_acc/borderline",
        true,
    ),
    (
        "pool, borderline (3 votes)",
        "pool/vote_bal_acc/borderline",
        true,
    ),
    ("pool, all (logit)", "pool/logit_bal_acc", true),
    ("policy's steps, all (logit)", "policy/logit_bal_acc", true),
    (
        "policy's steps, borderline",
        "policy/logit_bal_acc/borderline",
        true,
    ),
    (
        "policy's steps, clear p⁺",
        "policy/logit_pos_acc/clear",
        true,
    ),
    (
        "last step: pool, borderline",
        "pool/logit_bal_acc/borderline",
        false,
    ),
    (
        "last step: flipped labels agreed",
        "train/agree_flipped",
        false,
    ),
];

/// Writes `dir/report.md` and `dir/figures/learnability.svg`; returns the report's path.
pub fn write(dir: &Path) -> Result<PathBuf, ReportError> {
    let cells = read_cells(dir)?;
    let mut groups: Vec<((usize, f64), Vec<&Cell>)> = Vec::new();
    for c in &cells {
        let key = (c.cell.labels, c.cell.noise);
        match groups.last_mut() {
            Some((k, g)) if *k == key => g.push(c),
            _ => groups.push((key, vec![c])),
        }
    }
    let mut md = String::new();
    let _ = writeln!(md, "# The judge's learnability (rlany judge-fit)\n");
    let _ = writeln!(
        md,
        "{} cells. Each is the judge's warm start of the experiment (its labels, prompt, model \
         and supervised fit), measured at every evaluation point on held-out steps with oracle \
         labels: the run's evaluation pool (the flawed expert, half right, half wrong) and \
         fresh rollouts of the warm-started policy, by kind of step. The kept checkpoint is \
         the one with the best balanced accuracy on the validation split (its labels as given, \
         noise included). \"logit\": the verdict whose token has the larger logit; \"3 votes\": \
         the expected accuracy of the loop's majority of sampled votes. Values: mean ± 95% CI \
         over seeds [each seed].\n",
        cells.len()
    );
    // The columns some cell has (the corridor's kinds are not every environment's).
    let columns: Vec<&(&str, &str, bool)> = COLUMNS
        .iter()
        .filter(|(_, key, _)| cells.iter().any(|c| c.last(key).is_some()))
        .collect();
    let _ = write!(md, "| labels | noise | kept step (epoch) |");
    for (h, _, _) in &columns {
        let _ = write!(md, " {h} |");
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|{}", "---|".repeat(3 + columns.len()));
    for ((labels, noise), g) in &groups {
        let steps: Vec<String> = g
            .iter()
            .map(|c| format!("{} ({:.1})", c.best_step, c.epoch(c.best_step as f64)))
            .collect();
        let _ = write!(md, "| {labels} | {noise} | {} |", steps.join(", "));
        for (_, key, kept) in &columns {
            let vals: Vec<f64> = g
                .iter()
                .filter_map(|c| if *kept { c.best(key) } else { c.last(key) })
                .collect();
            let _ = write!(md, " {} |", values_cell(&vals));
        }
        let _ = writeln!(md);
    }
    md += &by_kind(&groups);
    let figures = dir.join("figures");
    std::fs::create_dir_all(&figures).map_err(io(&figures))?;
    let fig = curves(&groups);
    let file = plot::save(&fig, &figures, "learnability")?;
    let rel = |p: &Path| {
        p.strip_prefix(dir)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| p.display().to_string())
    };
    let _ = writeln!(
        md,
        "\n![{}]({})\n\nEach panel: one cell; a line per seed — solid, the held-out {} \
         balanced accuracy (pool, logit readout: `{}`); dashed, the share of the *flipped* \
         training labels the judge agrees with (memorisation; 0 for a judge that learned the \
         rule, 1 for one that memorised its labels); a diamond at the kept checkpoint. x: \
         epochs over the training labels.",
        file.title,
        rel(&file.svg),
        if curve_key(&groups).ends_with("borderline") {
            "borderline"
        } else {
            "(every step)"
        },
        curve_key(&groups)
    );
    let path = dir.join("report.md");
    std::fs::write(&path, md).map_err(io(&path))?;
    Ok(path)
}

/// Mean ± CI and every seed's value: `0.850 ± 0.127 [0.80, 0.90]`.
fn values_cell(vals: &[f64]) -> String {
    let each: Vec<String> = vals.iter().map(|v| format!("{v:.2}")).collect();
    match mean_ci95(vals) {
        Some(m) if vals.len() > 1 => format!("{} [{}]", m.format(3), each.join(", ")),
        _ => each.join(", "),
    }
}

/// The kept checkpoint's accuracy by kind of step (`<source>/logit_(pos|neg)_acc/<kind>`:
/// right-step kinds have p⁺, wrong-step kinds p⁻, a kind of both both), every kind any cell
/// logs; empty when none does.
fn by_kind(groups: &[((usize, f64), Vec<&Cell>)]) -> String {
    let mut kinds: Vec<String> = groups
        .iter()
        .flat_map(|(_, g)| g.iter())
        .flat_map(|c| c.points.iter().flat_map(|p| p.keys()))
        .filter_map(|k| {
            [
                "pool/logit_pos_acc/",
                "pool/logit_neg_acc/",
                "policy/logit_pos_acc/",
                "policy/logit_neg_acc/",
            ]
            .iter()
            .find_map(|pre| k.strip_prefix(pre))
            .map(str::to_string)
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return String::new();
    }
    let heads = [
        ("pool: right steps (p⁺)", "pool/logit_pos_acc"),
        ("pool: wrong steps (p⁻)", "pool/logit_neg_acc"),
        ("policy's steps: p⁺", "policy/logit_pos_acc"),
        ("policy's steps: p⁻", "policy/logit_neg_acc"),
    ];
    let mut md = String::from(
        "\nBy kind of step, at the kept checkpoint (logit readout): the accuracy on the right steps (p⁺) and on the wrong steps (p⁻) of each kind the environment names, on the pool and on the policy's own rollouts; mean ± 95% CI [each seed]; – where a kind has no such step.\n\n| labels | noise | kind |",
    );
    for (h, _) in heads {
        let _ = write!(md, " {h} |");
    }
    let _ = writeln!(md, "\n|---|---|---|{}", "---:|".repeat(heads.len()));
    for ((labels, noise), g) in groups {
        for kind in &kinds {
            let cells: Vec<String> = heads
                .iter()
                .map(|(_, stem)| {
                    let key = format!("{stem}/{kind}");
                    let vals: Vec<f64> = g.iter().filter_map(|c| c.best(&key)).collect();
                    if vals.is_empty() {
                        "–".into()
                    } else {
                        values_cell(&vals)
                    }
                })
                .collect();
            let _ = writeln!(
                md,
                "| {labels} | {noise} | {kind} | {} |",
                cells.join(" | ")
            );
        }
    }
    md
}

/// The key the figure's solid lines follow: the pool's borderline balanced accuracy where
/// cells log it (the corridor), else the pool's balanced accuracy over every step.
fn curve_key(groups: &[((usize, f64), Vec<&Cell>)]) -> &'static str {
    let border = "pool/logit_bal_acc/borderline";
    if groups
        .iter()
        .flat_map(|(_, g)| g.iter())
        .any(|c| c.last(border).is_some())
    {
        border
    } else {
        "pool/logit_bal_acc"
    }
}

/// The learning-curve figure: a panel per cell, rows by noise, columns by label count.
fn curves(groups: &[((usize, f64), Vec<&Cell>)]) -> Figure {
    let key = curve_key(groups);
    let mut labels: Vec<usize> = groups.iter().map(|((l, _), _)| *l).collect();
    labels.sort_unstable();
    labels.dedup();
    let mut seeds: Vec<u64> = groups
        .iter()
        .flat_map(|(_, g)| g.iter().map(|c| c.seed))
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    let colour = |seed: u64| plot::color(seeds.iter().position(|&s| s == seed).unwrap_or(0));
    let panels = groups
        .iter()
        .map(|((l, noise), g)| {
            let mut layers = vec![Layer::HLine {
                color: GREY,
                y: 0.5,
            }];
            for c in g {
                let series = |key: &str| -> Vec<(f64, f64)> {
                    c.points
                        .iter()
                        .filter_map(|p| Some((c.epoch(*p.get("step")?), *p.get(key)?)))
                        .collect()
                };
                layers.push(Layer::Line {
                    color: colour(c.seed),
                    points: series(key),
                    dashed: false,
                    dots: false,
                });
                layers.push(Layer::Line {
                    color: colour(c.seed),
                    points: series("train/agree_flipped"),
                    dashed: true,
                    dots: false,
                });
                if let Some(v) = c.best(key) {
                    layers.push(Layer::Markers {
                        color: colour(c.seed),
                        shape: Shape::Diamond,
                        points: vec![(c.epoch(c.best_step as f64), v)],
                    });
                }
            }
            Panel {
                title: format!("{l} labels, noise {noise}"),
                x_label: "epochs".into(),
                y_label: "accuracy".into(),
                y_range: Some((-0.02, 1.02)),
                layers,
                ..Panel::default()
            }
        })
        .collect();
    let mut legend: Vec<LegendEntry> = seeds
        .iter()
        .map(|&s| LegendEntry {
            swatch: Swatch::Line(colour(s)),
            label: format!(
                "seed {s}: held-out {} (pool)",
                if key.ends_with("borderline") {
                    "borderline"
                } else {
                    "balanced"
                }
            ),
        })
        .collect();
    legend.push(LegendEntry {
        swatch: Swatch::Dashed(GREY),
        label: "dashed: flipped training labels agreed".into(),
    });
    legend.push(LegendEntry {
        swatch: Swatch::Marker(GREY, Shape::Diamond),
        label: "kept checkpoint".into(),
    });
    Figure {
        title: "The judge's learning curves".into(),
        cols: labels.len().max(1),
        panel: (360, 260),
        panels,
        legend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(seed: u64, labels: usize, noise: f64, best: usize, acc: &[(usize, f64)]) -> String {
        let points: Vec<String> = acc
            .iter()
            .map(|(s, a)| {
                format!(
                    r#"{{"step": {s}, "pool/logit_bal_acc/borderline": {a}, "train/agree_flipped": 0.1}}"#
                )
            })
            .collect();
        format!(
            r#"{{"cell": {{"labels": {labels}, "noise": {noise}}}, "seed": {seed}, "train": 64, "val": 16, "batch": 32, "best_step": {best}, "points": [{}]}}"#,
            points.join(",")
        )
    }

    #[test]
    fn the_table_reads_the_kept_checkpoint_and_the_last() {
        let dir = std::env::temp_dir().join(format!("rlany-learn-{}", std::process::id()));
        let cells = dir.join("cells");
        std::fs::create_dir_all(&cells).expect("dir");
        // Two seeds of one cell: kept at step 10 (0.9 and 0.7), last 0.6 and 0.5.
        for (seed, best, at10) in [(1, 10, 0.9), (2, 10, 0.7)] {
            let text = cell(
                seed,
                80,
                0.25,
                best,
                &[(0, 0.5), (10, at10), (20, 0.55 + 0.05 * (2 - seed) as f64)],
            );
            std::fs::write(cells.join(format!("s{seed}.json")), text).expect("write");
        }
        let path = write(&dir).expect("report");
        let md = std::fs::read_to_string(path).expect("read");
        // Mean of 0.9 and 0.7 at the kept step, each seed listed; 10 steps × 32 / 64 = 5 epochs.
        assert!(
            md.contains("| 80 | 0.25 | 10 (5.0), 10 (5.0) | 0.800 ± "),
            "{md}"
        );
        assert!(md.contains("[0.90, 0.70]"), "{md}");
        // The last step's column: 0.60 and 0.55.
        assert!(md.contains("[0.60, 0.55]"), "{md}");
        assert!(dir.join("figures/learnability.svg").exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// An environment without the corridor's kinds (household's: `progress` right steps,
    /// `off_plan` wrong ones): no borderline column, the balanced accuracy over every step,
    /// and a by-kind table of p⁺ and p⁻.
    #[test]
    fn other_kinds_get_their_own_table() {
        let dir = std::env::temp_dir().join(format!("rlany-learn-kinds-{}", std::process::id()));
        let cells = dir.join("cells");
        std::fs::create_dir_all(&cells).expect("dir");
        for (seed, pos) in [(1, 0.8), (2, 0.6)] {
            let text = format!(
                r#"{{"cell": {{"labels": 40, "noise": 0.0}}, "seed": {seed}, "train": 32, "val": 8, "batch": 32, "best_step": 5, "points": [{{"step": 5, "pool/logit_bal_acc": 0.7, "policy/logit_bal_acc": 0.75, "pool/logit_pos_acc/progress": {pos}, "pool/logit_neg_acc/off_plan": 0.5, "train/agree_flipped": 0.2}}]}}"#
            );
            std::fs::write(cells.join(format!("s{seed}.json")), text).expect("write");
        }
        let md = std::fs::read_to_string(write(&dir).expect("report")).expect("read");
        assert!(!md.contains("borderline (logit)"), "{md}");
        assert!(md.contains("policy's steps, all (logit)"), "{md}");
        // p⁺ of progress: 0.8 and 0.6 → 0.700 ± 12.706 · 0.1 = 1.271.
        assert!(
            md.contains("| 40 | 0 | progress | 0.700 ± 1.271 [0.80, 0.60] | – | – | – |"),
            "{md}"
        );
        assert!(
            md.contains("| 40 | 0 | off_plan | – | 0.500 ± 0.000 [0.50, 0.50] | – | – |"),
            "{md}"
        );
        assert!(md.contains("`pool/logit_bal_acc`"), "{md}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
