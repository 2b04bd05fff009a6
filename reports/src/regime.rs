//! The regime figure: where does an arm help? Each arm's paired gain over its baseline against
//! the baseline's base success, one line per arm, when several suites are reported together
//! (`rlany report runs/regime-a runs/regime-b …`).
//!
//! **Arms.** A row's arm is the name of the experiment file it was started from (`meta.json`'s
//! `file`, e.g. `2_judge_no_band.ron`; the experiment name when a run has none), so the same
//! file name in several suites is the same arm at another setting — the convention of the
//! regime suites, whose rows differ from their suite's first row in the arm alone.
//!
//! **Points.** Every row with a baseline is a point of its arm: x = the baseline's training
//! success over the first quarter of its runs (`env/acc_mean`, steps 1–10 of 40; mean over its
//! seeds), y = the ablation table's paired difference of one column ([`crate::table`], not
//! recomputed): training success over the last quarter (left panel), and the greedy accuracy at
//! the training difficulty (right, when logged). Bars: 95% CI over the paired seeds.
//!
//! **Drawn** when the rows have at least two baselines and some arm has a point at two of them;
//! otherwise there is no regime to map (one suite: its table says it all).

use crate::figures::{Planned, Section};
use crate::plot::{Figure, GREY, Layer, LegendEntry, Panel, Shape, Swatch, color};
use crate::runs::Run;
use crate::stats::MeanCi;
use crate::suite::{Row, Suite};
use crate::table::{ColumnValue, Table, diff_text};
use std::path::Path;

/// The y columns: table header, panel title.
const PANELS: [(&str, &str); 2] = [
    ("train success, last ¼", "Δ training success, last quarter"),
    (
        "acc at the training difficulty",
        "Δ greedy accuracy at the training difficulty",
    ),
];

/// One point: an arm at one baseline.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Point {
    /// The row.
    pub experiment: String,
    /// The baseline row.
    pub baseline: String,
    /// The baseline's base success (x).
    pub base: f64,
    /// Per panel: the paired difference, if both rows log the column.
    pub diffs: Vec<Option<MeanCi>>,
}

/// The arms in first-seen order, each with its points in x order.
pub(crate) type Arms = Vec<(String, Vec<Point>)>;

/// A row's arm: the file name its runs were started from, else its experiment name.
fn arm(row: &Row) -> String {
    row.runs
        .iter()
        .find_map(|r| {
            let f = r.meta.file.as_ref()?;
            Path::new(f)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| row.experiment.clone())
}

/// Mean of `env/acc_mean` over the first quarter of one run's steps.
fn base_success(run: &Run) -> Option<f64> {
    ColumnValue::FirstQuarterMean.quarter_mean(run, "env/acc_mean")
}

/// The points of `suite` grouped by arm, or `None` when there is no regime to map.
pub(crate) fn arms(suite: &Suite, table: &Table) -> Option<Arms> {
    let cols: Vec<Option<usize>> = PANELS
        .iter()
        .map(|(h, _)| table.columns.iter().position(|c| c.header == *h))
        .collect();
    cols[0]?;
    let mut arms: Arms = Vec::new();
    for (row, trow) in suite.rows.iter().zip(&table.rows) {
        let Some(base) = row.baseline.as_deref().and_then(|b| suite.row(b)) else {
            continue;
        };
        let bases: Vec<f64> = base.runs.iter().filter_map(base_success).collect();
        if bases.is_empty() {
            continue;
        }
        let point = Point {
            experiment: row.experiment.clone(),
            baseline: base.experiment.clone(),
            base: bases.iter().sum::<f64>() / bases.len() as f64,
            diffs: cols.iter().map(|c| c.and_then(|c| trow.diffs[c])).collect(),
        };
        let name = arm(row);
        match arms.iter_mut().find(|(a, _)| *a == name) {
            Some((_, pts)) => pts.push(point),
            None => arms.push((name, vec![point])),
        }
    }
    let baselines: std::collections::BTreeSet<&str> = arms
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.baseline.as_str()))
        .collect();
    if baselines.len() < 2 || !arms.iter().any(|(_, p)| p.len() >= 2) {
        return None;
    }
    for (_, pts) in &mut arms {
        pts.sort_by(|a, b| a.base.total_cmp(&b.base));
    }
    Some(arms)
}

/// The regime figure of `suite`, if it maps a regime (module docs).
pub(crate) fn plan(suite: &Suite) -> Option<Planned> {
    let table = Table::build(suite);
    let arms = arms(suite, &table)?;
    let shapes = [
        Shape::Circle,
        Shape::Up,
        Shape::Down,
        Shape::Square,
        Shape::Diamond,
    ];
    // The x range with a margin, and each arm's points moved a little apart so that arms at
    // the same baseline do not hide one another.
    let (lo, hi) = arms
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.base))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    let span = (hi - lo).max(0.05);
    let x_range = (lo - 0.08 * span, hi + 0.08 * span);
    let dodge = |k: usize| (k as f64 - (arms.len() as f64 - 1.0) / 2.0) * 0.012 * span;
    let panels: Vec<Panel> = PANELS
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            arms.iter()
                .any(|(_, p)| p.iter().any(|q| q.diffs[*i].is_some()))
        })
        .map(|(i, (_, title))| {
            let mut layers = vec![Layer::HLine {
                color: GREY,
                y: 0.0,
            }];
            for (k, (_, pts)) in arms.iter().enumerate() {
                let c = color(k);
                let xy: Vec<(f64, MeanCi)> = pts
                    .iter()
                    .filter_map(|p| Some((p.base + dodge(k), p.diffs[i]?)))
                    .collect();
                layers.push(Layer::Line {
                    color: c,
                    points: xy.iter().map(|(x, d)| (*x, d.mean)).collect(),
                    dashed: false,
                    dots: false,
                });
                layers.push(Layer::ErrorBars {
                    color: c,
                    bars: xy
                        .iter()
                        .filter_map(|(x, d)| {
                            Some((*x, d.mean - d.half_width?, d.mean + d.half_width?))
                        })
                        .collect(),
                });
                layers.push(Layer::Markers {
                    color: c,
                    shape: shapes[k % shapes.len()],
                    points: xy.iter().map(|(x, d)| (*x, d.mean)).collect(),
                });
            }
            Panel {
                title: (*title).to_string(),
                x_label: "baseline's training success, first quarter".into(),
                x_range: Some(x_range),
                y_label: "Δ (arm − baseline)".into(),
                layers,
                ..Panel::default()
            }
        })
        .collect();
    let mut legend: Vec<LegendEntry> = arms
        .iter()
        .enumerate()
        .map(|(k, (name, _))| LegendEntry {
            swatch: Swatch::Marker(color(k), shapes[k % shapes.len()]),
            label: name.clone(),
        })
        .collect();
    legend.push(LegendEntry {
        swatch: Swatch::Dashed(GREY),
        label: "0 = the baseline".into(),
    });
    let cols = panels.len();
    Some(Planned {
        section: Section::Eval,
        stem: "regime".into(),
        figure: Figure {
            title: "Where does each arm help?".into(),
            cols,
            panel: (480, 400),
            panels,
            legend,
        },
        caption: "The regime map: each arm (the experiment file its rows were started from) against its suite's baseline, at every suite reported together. x: the baseline's training success over the first quarter of its runs (`env/acc_mean`, mean over its seeds): how often outcome-only PPO succeeds where it starts. y: the ablation table's paired difference (arm − baseline, over the seeds both rows have) of training success over the last quarter (left) and of the greedy accuracy at the training difficulty (right, `eval/acc_start`). Points: mean; bars: 95% CI of the mean (Student t); the lines join an arm's points in x order, and the arms are moved a little apart in x so that none hides another.".into(),
        after: Some(markdown(&arms)),
    })
}

/// The figure's numbers as a table.
fn markdown(arms: &Arms) -> String {
    let mut out = String::from(
        "| arm | row | baseline | baseline's success, first ¼ | Δ training success, last ¼ | Δ accuracy at the training difficulty |\n|---|---|---|---:|---:|---:|\n",
    );
    for (name, pts) in arms {
        for p in pts {
            let cell = |i: usize| {
                p.diffs
                    .get(i)
                    .copied()
                    .flatten()
                    .map_or("–".to_string(), |d| {
                        diff_text(&d, &crate::table::COLUMNS[0], d.n)
                    })
            };
            out += &format!(
                "| {name} | {} | {} | {:.3} | {} | {} |\n",
                p.experiment,
                p.baseline,
                p.base,
                cell(0),
                cell(1)
            );
        }
    }
    out
}

/// The folder a row's runs were collected under (`<suite>/<experiment>/seed-<n>`): its suite.
fn suite_of(row: &Row) -> Option<String> {
    let dir = row.runs.first()?.dir.parent()?.parent()?;
    Some(dir.file_name()?.to_string_lossy().into_owned())
}

/// Interactions: for each `(hi, lo)` pair of suites (folder names) and each arm with a row and
/// its baseline in both, the arm's gain at `hi` minus its gain at `lo` (each gain: row −
/// baseline, per seed), over the seeds all four rows have, on the regime figure's two
/// measures. Returns the Markdown table (empty when no pair is given) and what was left out.
pub(crate) fn interactions(suite: &Suite, pairs: &[(String, String)]) -> (String, Vec<String>) {
    let mut warnings = Vec::new();
    if pairs.is_empty() {
        return (String::new(), warnings);
    }
    // Per suite: arm → (row, baseline row).
    let points = |name: &str| -> Vec<(String, &Row, &Row)> {
        suite
            .rows
            .iter()
            .filter(|r| suite_of(r).as_deref() == Some(name))
            .filter_map(|r| Some((arm(r), r, suite.row(r.baseline.as_deref()?)?)))
            .collect()
    };
    let gain = |row: &Row, base: &Row, header: &str, seed: u64| -> Option<f64> {
        let of = |r: &Row| {
            let run = r.runs.iter().find(|x| x.seed == Some(seed))?;
            crate::table::column_value(run, header)
        };
        Some(of(row)? - of(base)?)
    };
    let mut md = String::from(
        "Interactions (an arm's gain over its baseline at one setting minus its gain at another, paired by seed: `(row − baseline)` at the first suite minus at the second; mean ± 95% CI):\n\n| settings | arm | seeds | Δ of Δ training success, last ¼ | Δ of Δ accuracy at the training difficulty |\n|---|---|---|---:|---:|\n",
    );
    let mut any = false;
    for (hi, lo) in pairs {
        let (a, b) = (points(hi), points(lo));
        if a.is_empty() || b.is_empty() {
            warnings.push(format!(
                "interaction {hi}:{lo} left out: no row with a baseline in suite `{}`",
                if a.is_empty() { hi } else { lo }
            ));
            continue;
        }
        for (name, row_hi, base_hi) in &a {
            let Some((_, row_lo, base_lo)) = b.iter().find(|(n, _, _)| n == name) else {
                continue;
            };
            let seeds: Vec<u64> = row_hi
                .seeds()
                .into_iter()
                .filter(|s| {
                    [base_hi, row_lo, base_lo]
                        .iter()
                        .all(|r| r.seeds().contains(s))
                })
                .collect();
            let cells: Vec<String> = PANELS
                .iter()
                .map(|(header, _)| {
                    let ds: Vec<f64> = seeds
                        .iter()
                        .filter_map(|&s| {
                            Some(
                                gain(row_hi, base_hi, header, s)?
                                    - gain(row_lo, base_lo, header, s)?,
                            )
                        })
                        .collect();
                    crate::stats::mean_ci95(&ds).map_or("–".to_string(), |d| {
                        diff_text(&d, &crate::table::COLUMNS[0], seeds.len())
                    })
                })
                .collect();
            let seeds: Vec<String> = seeds.iter().map(u64::to_string).collect();
            md += &format!(
                "| {hi} − {lo} | {name} | {} | {} |\n",
                seeds.join(", "),
                cells.join(" | ")
            );
            any = true;
        }
    }
    if !any {
        return (String::new(), warnings);
    }
    (md, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::{Meta, MetricsLine};
    use std::path::PathBuf;

    /// A run of `exp` (started from `file`) over 8 steps: `env/acc_mean` is `start` on steps
    /// 1–2 and `end` on steps 7–8 (0.5 between).
    fn run(exp: &str, file: &str, seed: u64, start: f64, end: f64) -> Run {
        let line = |step: u64| MetricsLine {
            step,
            values: [(
                "env/acc_mean".to_string(),
                Some(match step {
                    1 | 2 => start,
                    7 | 8 => end,
                    _ => 0.5,
                }),
            )]
            .into_iter()
            .collect(),
        };
        Run {
            dir: PathBuf::from(format!("/x/{exp}/seed-{seed}")),
            experiment: exp.into(),
            seed: Some(seed),
            meta: Meta {
                file: Some(format!("experiments/ablation/s/{file}.ron")),
                ..Meta::default()
            },
            lines: (1..=8).map(line).collect(),
            adaptation: None,
            posterior: None,
            resolved: None,
            warnings: vec![],
        }
    }

    fn spec(rows: &[(&str, Option<&str>)]) -> Vec<crate::suite::SuiteRowSpec> {
        rows.iter()
            .map(|(e, b)| crate::suite::SuiteRowSpec {
                experiment: e.to_string(),
                baseline: b.map_or(crate::suite::BaselineSpec::None, |b| {
                    crate::suite::BaselineSpec::Named(b.into())
                }),
                compare: vec![],
            })
            .collect()
    }

    /// Two suites (folders `easy`: base 0.6; `sparse`: base 0.1), each with outcome-only and a
    /// judge arm, seeds 1–2.
    fn two_suites() -> Suite {
        let mut runs = Vec::new();
        for seed in [1, 2] {
            let s = seed as f64 / 100.0;
            for (suite, exp, file, start, end) in [
                ("easy", "easy_o", "0_outcome_only", 0.6, 0.7 + s),
                ("easy", "easy_j", "2_judge", 0.6, 0.72 + s),
                ("sparse", "sparse_o", "0_outcome_only", 0.1, 0.2 + s),
                ("sparse", "sparse_j", "2_judge", 0.1, 0.5 + 2.0 * s),
            ] {
                let mut r = run(exp, file, seed, start, end);
                r.dir = PathBuf::from(format!("/runs/{suite}/{exp}/seed-{seed}"));
                runs.push(r);
            }
        }
        Suite::from_runs(
            runs,
            &spec(&[
                ("easy_o", None),
                ("easy_j", Some("easy_o")),
                ("sparse_o", None),
                ("sparse_j", Some("sparse_o")),
            ]),
        )
    }

    #[test]
    fn one_point_per_arm_and_baseline_in_base_success_order() {
        let suite = two_suites();
        let table = Table::build(&suite);
        let arms = arms(&suite, &table).expect("a regime");
        assert_eq!(arms.len(), 1);
        let (name, pts) = &arms[0];
        assert_eq!(name, "2_judge");
        // x: the baseline's first-quarter success (steps 1-2 of 8); sorted: sparse first.
        assert_eq!(
            pts.iter()
                .map(|p| (p.experiment.as_str(), p.base))
                .collect::<Vec<_>>(),
            [("sparse_j", 0.1), ("easy_j", 0.6)]
        );
        // y: last quarter (steps 7-8) paired: sparse +0.3 + s (0.31, 0.32 → 0.315), easy +0.02.
        let d = pts[0].diffs[0].expect("sparse diff");
        assert!((d.mean - 0.315).abs() < 1e-12, "{}", d.mean);
        assert!((pts[1].diffs[0].expect("easy diff").mean - 0.02).abs() < 1e-12);
        assert!(pts[0].diffs[1].is_none(), "no eval/acc_start logged");
        let planned = plan(&suite).expect("figure");
        assert_eq!(planned.figure.panels.len(), 1);
        assert!(
            planned
                .after
                .expect("table")
                .contains("| 2_judge | sparse_j | sparse_o | 0.100 | +0.315 ± 0.064 | – |")
        );
    }

    #[test]
    fn interaction_is_the_difference_of_paired_gains() {
        let suite = two_suites();
        // Gains (last quarter): sparse 0.3 + s, easy 0.02 → 0.29, 0.30: 0.295 ± 12.706·0.005.
        let pairs = [("sparse".to_string(), "easy".to_string())];
        let (md, w) = interactions(&suite, &pairs);
        assert!(w.is_empty(), "{w:?}");
        assert!(
            md.contains("| sparse − easy | 2_judge | 1, 2 | +0.295 ± 0.064 | – |"),
            "{md}"
        );
        let (md, w) = interactions(&suite, &[("sparse".to_string(), "nowhere".to_string())]);
        assert!(md.is_empty());
        assert!(w[0].contains("`nowhere`"), "{w:?}");
    }

    #[test]
    fn no_regime_with_one_baseline() {
        let runs = vec![
            run("o", "0_outcome_only", 1, 0.1, 0.2),
            run("j", "2_judge", 1, 0.1, 0.3),
        ];
        let suite = Suite::from_runs(runs, &spec(&[("o", None), ("j", Some("o"))]));
        assert!(arms(&suite, &Table::build(&suite)).is_none());
        assert!(plan(&suite).is_none());
    }
}
