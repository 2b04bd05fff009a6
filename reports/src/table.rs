//! The ablation table (the paper's Table 1): one row per experiment, final values over seeds as
//! mean ± 95% CI, the best accuracy per column in bold, and each row's paired difference to its
//! baseline over the seeds both have.

use crate::runs::{Final, Run};
use crate::stats::{MeanCi, mean_ci95};
use crate::suite::{Row, Suite};
use std::collections::BTreeSet;

/// What a column holds, which decides its formatting and whether it is ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// An accuracy in `[0, 1]`: 3 decimals, best (highest) mean in bold.
    Accuracy,
    /// A count (proposals): 1 decimal, not ranked (more is neither better nor worse).
    Count,
}

/// A table column: a final metric value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Header text.
    pub header: &'static str,
    /// Metric keys, in order of preference: each run uses the first it logs.
    pub keys: &'static [&'static str],
    /// Formatting and ranking.
    pub kind: ColumnKind,
}

/// Every column the table can have; those no run logs are left out.
pub const COLUMNS: [Column; 8] = [
    Column {
        header: "acc ID",
        keys: &["eval/acc_id"],
        kind: ColumnKind::Accuracy,
    },
    Column {
        header: "acc OOD",
        keys: &["eval/acc_ood"],
        kind: ColumnKind::Accuracy,
    },
    Column {
        header: "judge p⁺ (correct steps)",
        keys: &["judge/eval_pos_acc", "judge/process_acc_pos"],
        kind: ColumnKind::Accuracy,
    },
    Column {
        header: "judge p⁻ (wrong steps)",
        keys: &["judge/eval_neg_acc", "judge/process_acc_neg"],
        kind: ColumnKind::Accuracy,
    },
    Column {
        header: "judge balanced acc",
        keys: &["judge/eval_bal_acc"],
        kind: ColumnKind::Accuracy,
    },
    Column {
        header: "judge outcome acc",
        keys: &["judge/outcome_acc"],
        kind: ColumnKind::Accuracy,
    },
    Column {
        header: "proposals accepted",
        keys: &["env/accepted"],
        kind: ColumnKind::Count,
    },
    Column {
        header: "proposals rejected",
        keys: &["env/rejected"],
        kind: ColumnKind::Count,
    },
];

/// One experiment's row.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    /// Experiment name.
    pub experiment: String,
    /// Number of runs (seeds).
    pub runs: usize,
    /// One cell per shown column: mean ± CI of the runs' final values (`None`: no run has one).
    pub cells: Vec<Option<MeanCi>>,
    /// The baseline of the paired difference.
    pub baseline: Option<String>,
    /// Seeds this row shares with its baseline.
    pub shared_seeds: Vec<u64>,
    /// One cell per shown column: mean ± CI of `row − baseline` over shared seeds.
    pub diffs: Vec<Option<MeanCi>>,
}

/// The ablation table.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The columns shown (those some run logs).
    pub columns: Vec<Column>,
    /// One row per experiment, in suite order.
    pub rows: Vec<TableRow>,
    /// Facts a reader needs (null values left out, mixed keys, runs of different lengths).
    pub notes: Vec<String>,
}

impl Table {
    /// Builds the table of `suite`.
    pub fn build(suite: &Suite) -> Self {
        let columns: Vec<Column> = COLUMNS
            .iter()
            .filter(|c| suite.runs().any(|r| r.first_key(c.keys).is_some()))
            .copied()
            .collect();
        let mut notes = Vec::new();
        for c in &columns {
            key_mix_note(suite, c, &mut notes);
        }
        let rows = suite
            .rows
            .iter()
            .map(|row| build_row(suite, row, &columns, &mut notes))
            .collect();
        Self {
            columns,
            rows,
            notes,
        }
    }

    /// The table, the paired-difference table and the notes, in Markdown.
    pub fn markdown(&self) -> String {
        let mut out = self.main_markdown();
        out.push('\n');
        out += &self.diff_markdown();
        out += "\nFinal values (each run's last line with the key), over seeds: mean ± half-width \
                of the 95% confidence interval (Student t, n−1 degrees of freedom); `(n=1)`: a \
                single run, no interval; `(n=k)` after a cell: only k of the row's runs have the \
                value. **Bold**: best mean of an accuracy column (counts are not ranked).\n";
        for n in &self.notes {
            out += &format!("- {n}\n");
        }
        out
    }

    fn main_markdown(&self) -> String {
        let mut out = String::from("| experiment | seeds |");
        let mut rule = String::from("|---|---:|");
        for c in &self.columns {
            out += &format!(" {} |", c.header);
            rule += "---:|";
        }
        out = out + "\n" + &rule + "\n";
        let best = self.best();
        for r in &self.rows {
            out += &format!("| {} | {} |", r.experiment, r.runs);
            for (i, (c, cell)) in self.columns.iter().zip(&r.cells).enumerate() {
                let text = cell.map_or_else(|| "–".to_string(), |m| cell_text(&m, c, r.runs));
                let bold = matches!((cell, best[i]), (Some(m), Some(b)) if m.mean >= b - 1e-12);
                out += &if bold {
                    format!(" **{text}** |")
                } else {
                    format!(" {text} |")
                };
            }
            out += "\n";
        }
        out
    }

    fn diff_markdown(&self) -> String {
        let mut out = String::from(
            "Paired difference to the baseline (row − baseline, over the seeds both have, matched by seed number; mean ± 95% CI):\n\n| experiment | baseline | shared seeds |",
        );
        let mut rule = String::from("|---|---|---|");
        for c in &self.columns {
            out += &format!(" Δ {} |", c.header);
            rule += "---:|";
        }
        out = out + "\n" + &rule + "\n";
        for r in &self.rows {
            let Some(b) = &r.baseline else {
                continue;
            };
            let seeds = if r.shared_seeds.is_empty() {
                "none".to_string()
            } else {
                r.shared_seeds
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            out += &format!("| {} | {b} | {seeds} |", r.experiment);
            for (c, d) in self.columns.iter().zip(&r.diffs) {
                out += &match d {
                    Some(d) => format!(" {} |", diff_text(d, c, r.shared_seeds.len())),
                    None => " – |".to_string(),
                };
            }
            out += "\n";
        }
        out
    }

    /// The best mean of each accuracy column, when at least two rows have a value.
    fn best(&self) -> Vec<Option<f64>> {
        self.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let means: Vec<f64> = self
                    .rows
                    .iter()
                    .filter_map(|r| r.cells[i].map(|m| m.mean))
                    .collect();
                (c.kind == ColumnKind::Accuracy && means.len() >= 2)
                    .then(|| means.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            })
            .collect()
    }
}

fn digits(c: &Column) -> usize {
    match c.kind {
        ColumnKind::Accuracy => 3,
        ColumnKind::Count => 1,
    }
}

fn cell_text(m: &MeanCi, c: &Column, runs: usize) -> String {
    let text = m.format(digits(c));
    if m.n < runs && m.n > 1 {
        format!("{text} (n={})", m.n)
    } else {
        text
    }
}

fn diff_text(d: &MeanCi, c: &Column, shared: usize) -> String {
    let p = digits(c);
    let mean = format!("{:+.p$}", d.mean);
    let text = match d.half_width {
        Some(h) => format!("{mean} ± {h:.p$}"),
        None => format!("{mean} (n=1)"),
    };
    if d.n < shared && d.n > 1 {
        format!("{text} (n={})", d.n)
    } else {
        text
    }
}

/// A run's final value for a column: the first of its keys the run logs; `None` when absent
/// or `null` (the latter with a note).
fn run_value(run: &Run, c: &Column, notes: &mut Vec<String>) -> Option<f64> {
    let key = run.first_key(c.keys)?;
    match run.final_value(key) {
        Final::Value { value, .. } => Some(value),
        Final::Null { step } => {
            notes.push(format!(
                "{}: `{key}` is null (non-finite) at its last step {step}; left out of `{}`",
                run.label(),
                c.header
            ));
            None
        }
        Final::Absent => None,
    }
}

fn build_row(suite: &Suite, row: &Row, columns: &[Column], notes: &mut Vec<String>) -> TableRow {
    let values: Vec<Vec<Option<f64>>> = row
        .runs
        .iter()
        .map(|r| columns.iter().map(|c| run_value(r, c, notes)).collect())
        .collect();
    let cells = (0..columns.len())
        .map(|i| {
            let xs: Vec<f64> = values.iter().filter_map(|v| v[i]).collect();
            mean_ci95(&xs)
        })
        .collect();
    length_note(row, notes);
    let base = row.baseline.as_deref().and_then(|b| suite.row(b));
    let (shared_seeds, diffs) = match base {
        Some(b) => paired(row, b, columns),
        None => (Vec::new(), vec![None; columns.len()]),
    };
    TableRow {
        experiment: row.experiment.clone(),
        runs: row.runs.len(),
        cells,
        baseline: row.baseline.clone(),
        shared_seeds,
        diffs,
    }
}

/// Seeds both rows have, and per column the mean ± CI of `row − base` over the seeds where both
/// have a value (the first run of a seed, should a seed repeat).
fn paired(row: &Row, base: &Row, columns: &[Column]) -> (Vec<u64>, Vec<Option<MeanCi>>) {
    let mine: BTreeSet<u64> = row.seeds().into_iter().collect();
    let shared: Vec<u64> = base
        .seeds()
        .into_iter()
        .collect::<BTreeSet<_>>()
        .intersection(&mine)
        .copied()
        .collect();
    let run_of = |r: &Row, s: u64| r.runs.iter().find(|x| x.seed == Some(s)).cloned();
    let mut scratch = Vec::new();
    let diffs = columns
        .iter()
        .map(|c| {
            let ds: Vec<f64> = shared
                .iter()
                .filter_map(|&s| {
                    let a = run_value(&run_of(row, s)?, c, &mut scratch)?;
                    let b = run_value(&run_of(base, s)?, c, &mut scratch)?;
                    Some(a - b)
                })
                .collect();
            mean_ci95(&ds)
        })
        .collect();
    (shared, diffs)
}

fn length_note(row: &Row, notes: &mut Vec<String>) {
    let ends: BTreeSet<u64> = row.runs.iter().filter_map(Run::last_step).collect();
    if ends.len() > 1 {
        let detail: Vec<String> = row
            .runs
            .iter()
            .map(|r| {
                format!(
                    "seed {} → step {}",
                    r.seed.map_or("?".into(), |s| s.to_string()),
                    r.last_step().map_or("–".into(), |s| s.to_string())
                )
            })
            .collect();
        notes.push(format!(
            "`{}`: runs of different lengths ({}); each run's final value is from its own last step",
            row.experiment,
            detail.join(", ")
        ));
    }
}

fn key_mix_note(suite: &Suite, c: &Column, notes: &mut Vec<String>) {
    if c.keys.len() < 2 {
        return;
    }
    let used: BTreeSet<&str> = suite.runs().filter_map(|r| r.first_key(c.keys)).collect();
    if used.len() > 1 {
        let per: Vec<String> = suite
            .rows
            .iter()
            .filter_map(|row| {
                let ks: BTreeSet<&str> = row
                    .runs
                    .iter()
                    .filter_map(|r| r.first_key(c.keys))
                    .collect();
                (!ks.is_empty()).then(|| {
                    format!(
                        "{}: {}",
                        row.experiment,
                        ks.iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join("/")
                    )
                })
            })
            .collect();
        notes.push(format!(
            "`{}` comes from different keys across runs ({})",
            c.header,
            per.join("; ")
        ));
    } else if let Some(k) = used.iter().next() {
        notes.push(format!("`{}` is `{k}`", c.header));
    }
}
