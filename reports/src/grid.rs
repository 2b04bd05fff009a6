//! In-domain accuracy over the evaluation's difficulty grid: `eval/acc_grid/<level>` is the
//! greedy accuracy on the eval tasks at that grid level (the difficulty coordinate `<level>` on
//! every dimension; `eval/acc_id` is the mean over the levels). Per experiment, each level at the
//! runs' first evaluation (step 0: the warm-started policy) and at their last one, as mean ± 95%
//! CI over seeds.

use crate::runs::{MetricsLine, Run};
use crate::stats::{MeanCi, mean_ci95};
use crate::suite::Suite;

/// Key prefix of the per-level accuracies; the rest of the key is the level (`{:.2}`).
pub const PREFIX: &str = "eval/acc_grid/";

/// One level of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// The level as logged in the key (`0.25`).
    pub label: String,
    /// Its numeric value.
    pub value: f64,
}

/// One evaluation of a row's runs, level by level.
#[derive(Debug, Clone, PartialEq)]
pub struct GridEval {
    /// The step of that evaluation in each run (in seed order).
    pub steps: Vec<u64>,
    /// One cell per level: mean ± CI over the runs with a finite value (`None`: no run has one).
    pub cells: Vec<Option<MeanCi>>,
}

/// One experiment with grid accuracies.
#[derive(Debug, Clone, PartialEq)]
pub struct GridRow {
    /// Experiment name.
    pub experiment: String,
    /// Index of the experiment in the suite (its colour in the figures).
    pub index: usize,
    /// Runs of the experiment that log `eval/acc_grid/*`.
    pub runs: usize,
    /// Each run's first evaluation with grid keys (step 0 in a run that started from scratch).
    pub start: GridEval,
    /// Each run's last evaluation with grid keys.
    pub last: GridEval,
}

/// The grid accuracies of a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct GridTable {
    /// Every level any run logs, in increasing difficulty.
    pub levels: Vec<Level>,
    /// The experiments with grid keys, in suite order.
    pub rows: Vec<GridRow>,
    /// The experiments without any (runs written before the grid was logged).
    pub without: Vec<String>,
}

impl GridTable {
    /// The grid table of `suite`; `None` when no run logs `eval/acc_grid/*`.
    pub fn build(suite: &Suite) -> Option<Self> {
        let levels = levels(suite.runs());
        if levels.is_empty() {
            return None;
        }
        let mut rows = Vec::new();
        let mut without = Vec::new();
        for (index, row) in suite.rows.iter().enumerate() {
            let runs: Vec<&Run> = row.runs.iter().filter(|r| has_grid(r)).collect();
            if runs.is_empty() {
                without.push(row.experiment.clone());
                continue;
            }
            rows.push(GridRow {
                experiment: row.experiment.clone(),
                index,
                runs: runs.len(),
                start: grid_eval(&runs, &levels, |r| {
                    r.lines.iter().find(|l| line_has_grid(l))
                }),
                last: grid_eval(&runs, &levels, |r| {
                    r.lines.iter().rev().find(|l| line_has_grid(l))
                }),
            });
        }
        Some(Self {
            levels,
            rows,
            without,
        })
    }

    /// Whether every run's first grid evaluation is at step 0 (the warm-started policy).
    pub fn starts_at_zero(&self) -> bool {
        self.rows
            .iter()
            .all(|r| r.start.steps.iter().all(|&s| s == 0))
    }

    /// What the first evaluation is called in the table and the figure.
    pub fn start_label(&self) -> &'static str {
        if self.starts_at_zero() {
            "step 0 (warm start)"
        } else {
            "first eval"
        }
    }

    /// The table in Markdown: two lines per experiment (first and last evaluation), one column
    /// per level, and a sentence naming the experiments without grid keys.
    pub fn markdown(&self) -> String {
        let mut out = String::from("| experiment | eval |");
        let mut rule = String::from("|---|---|");
        for l in &self.levels {
            out += &format!(" {} |", l.label);
            rule += "---:|";
        }
        out = out + "\n" + &rule + "\n";
        for r in &self.rows {
            let start = if self.starts_at_zero() {
                self.start_label().to_string()
            } else {
                format!("first eval ({})", steps_text(&r.start.steps))
            };
            let last = format!("last eval ({})", steps_text(&r.last.steps));
            for (when, eval) in [(start, &r.start), (last, &r.last)] {
                out += &format!("| {} | {when} |", r.experiment);
                for c in &eval.cells {
                    out += &format!(" {} |", cell_text(c.as_ref(), r.runs));
                }
                out += "\n";
            }
        }
        out += "\nIn-domain accuracy per difficulty level of the eval grid (`eval/acc_grid/<level>`), mean ± half-width of the 95% CI over seeds (Student t); `(n=k)`: only k of the row's runs have the value.\n";
        if !self.without.is_empty() {
            out += &format!("\nNo `eval/acc_grid/*` in: {}.\n", self.without.join(", "));
        }
        out
    }
}

/// `step 10` or `steps 10, 10, 5`.
pub(crate) fn steps_text(steps: &[u64]) -> String {
    let list: Vec<String> = steps.iter().map(u64::to_string).collect();
    match list.as_slice() {
        [one] => format!("step {one}"),
        _ => format!("steps {}", list.join(", ")),
    }
}

/// A cell: `mean ± h`, `mean (n=1)`, `(n=k)` when fewer than the row's runs, `–` when empty.
fn cell_text(c: Option<&MeanCi>, runs: usize) -> String {
    match c {
        None => "–".to_string(),
        Some(m) if m.n < runs && m.n > 1 => format!("{} (n={})", m.format(3), m.n),
        Some(m) => m.format(3),
    }
}

/// Whether a metrics line has a grid key.
fn line_has_grid(l: &MetricsLine) -> bool {
    l.values.keys().any(|k| k.starts_with(PREFIX))
}

/// Whether a run logs a grid key.
fn has_grid(r: &Run) -> bool {
    r.lines.iter().any(line_has_grid)
}

/// Every level the runs log, sorted by value (keys whose level is not a number are ignored).
fn levels<'a>(runs: impl Iterator<Item = &'a Run>) -> Vec<Level> {
    let mut out: Vec<Level> = Vec::new();
    for r in runs {
        for l in &r.lines {
            for k in l.values.keys() {
                let Some(label) = k.strip_prefix(PREFIX) else {
                    continue;
                };
                let Ok(value) = label.parse::<f64>() else {
                    continue;
                };
                if value.is_finite() && !out.iter().any(|x| x.label == label) {
                    out.push(Level {
                        label: label.to_string(),
                        value,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| a.value.total_cmp(&b.value));
    out
}

/// The evaluation `pick` chooses in each run, aggregated per level over the runs (a `null` or
/// missing level of a run is left out of that level).
fn grid_eval<'r>(
    runs: &[&'r Run],
    levels: &[Level],
    pick: impl Fn(&'r Run) -> Option<&'r MetricsLine>,
) -> GridEval {
    let lines: Vec<&MetricsLine> = runs.iter().filter_map(|r| pick(r)).collect();
    let cells = levels
        .iter()
        .map(|level| {
            let key = format!("{PREFIX}{}", level.label);
            let xs: Vec<f64> = lines
                .iter()
                .filter_map(|l| l.values.get(&key).copied().flatten())
                .filter(|v| v.is_finite())
                .collect();
            mean_ci95(&xs)
        })
        .collect();
    GridEval {
        steps: lines.iter().map(|l| l.step).collect(),
        cells,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One metrics line: its step and `(key, value)` pairs.
    type Line<'a> = (u64, &'a [(&'a str, Option<f64>)]);

    /// A run of experiment `exp` from its lines.
    fn run(exp: &str, seed: u64, lines: &[Line<'_>]) -> Run {
        crate::runs::test_run(
            exp,
            seed,
            lines.iter().map(|(s, kv)| (*s, kv.iter().copied())),
        )
    }

    #[test]
    fn levels_sort_by_value_and_cells_average_seeds() {
        let g0 = "eval/acc_grid/0.00";
        let g1 = "eval/acc_grid/1.00";
        let g5 = "eval/acc_grid/0.50";
        let runs = vec![
            run(
                "x",
                1,
                &[
                    (0, &[(g1, Some(0.25)), (g0, Some(0.5)), (g5, Some(0.5))]),
                    (3, &[("policy/kl", Some(0.1))]),
                    (5, &[(g1, Some(0.5)), (g0, Some(1.0)), (g5, None)]),
                ],
            ),
            run(
                "x",
                2,
                &[
                    (0, &[(g1, Some(0.25)), (g0, Some(0.75)), (g5, Some(0.25))]),
                    (5, &[(g1, Some(0.75)), (g0, Some(0.5)), (g5, Some(0.75))]),
                ],
            ),
            run("old", 1, &[(0, &[("eval/acc_id", Some(0.5))])]),
        ];
        let suite = Suite::from_runs(runs, &[]);
        let t = GridTable::build(&suite).expect("grid");
        let labels: Vec<&str> = t.levels.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["0.00", "0.50", "1.00"]);
        assert_eq!(t.without, ["old"]);
        let r = &t.rows[0];
        assert_eq!((r.experiment.as_str(), r.index, r.runs), ("x", 1, 2));
        assert_eq!(
            (r.start.steps.clone(), r.last.steps.clone()),
            (vec![0, 0], vec![5, 5])
        );
        // Level 0.00 at step 0: 0.5, 0.75 → mean 0.625, s = 0.1767767, t(1) = 12.7062047.
        let c = r.start.cells[0].expect("cell");
        assert!((c.mean - 0.625).abs() < 1e-12);
        assert!((c.half_width.expect("ci") - 1.588_275_6).abs() < 1e-6);
        // Level 0.50 at the last eval: seed 1 logged null, so seed 2's 0.75 alone.
        let c = r.last.cells[1].expect("cell");
        assert_eq!((c.mean, c.half_width, c.n), (0.75, None, 1));
        // Level 1.00 at the last eval: 0.5, 0.75.
        assert!((r.last.cells[2].expect("cell").mean - 0.625).abs() < 1e-12);
        assert!(t.starts_at_zero());
        let md = t.markdown();
        assert!(
            md.contains("| experiment | eval | 0.00 | 0.50 | 1.00 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| x | step 0 (warm start) | 0.625 ± 1.588 | 0.375 ± 1.588 | 0.250 ± 0.000 |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| x | last eval (steps 5, 5) | 0.750 ± 3.177 | 0.750 (n=1) | 0.625 ± 1.588 |"
            ),
            "{md}"
        );
        assert!(md.contains("No `eval/acc_grid/*` in: old."), "{md}");
    }

    #[test]
    fn no_grid_key_no_table() {
        let suite = Suite::from_runs(
            vec![run("a", 1, &[(0, &[("eval/acc_id", Some(0.5))])])],
            &[],
        );
        assert!(GridTable::build(&suite).is_none());
    }
}
