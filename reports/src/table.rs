//! The ablation table (the paper's Table 1): one row per experiment, final values over seeds as
//! mean ± 95% CI, the best accuracy per column in bold, and each row's paired difference to its
//! baseline (the row above unless `suite.json` names another) over the seeds both have, on
//! every column: in-domain and OOD accuracy, the judge's accuracies, the accepted-proposal rate
//! and the proposal counts. Written as one table per theme ([`ColumnGroup`]: success, judge,
//! adaptation, diagnostics), so that none is wider than a screen.

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
    /// A fraction in `[0, 1]` that is not ranked (the accepted-proposal rate: higher is neither
    /// better nor worse): 3 decimals.
    Rate,
}

/// How a run's value of a column is made from its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnValue {
    /// The final value of the first of the column's keys that the run logs.
    FirstKey,
    /// `keys[0] / (keys[0] + keys[1])` of the two keys' final values; undefined (no value, not
    /// 0) when the sum is 0.
    Share,
    /// The mean of `keys[0]` over the last quarter of the run's training steps (steps
    /// `s > L − L/4` of a run whose last step is `L`: 31–40 of 40): a training-time measure
    /// over hundreds of rollouts instead of one final value.
    LastQuarterMean,
    /// The mean of `keys[0]` over the first quarter of the training steps (`1 ≤ s ≤ L/4`).
    FirstQuarterMean,
    /// The mean of `keys[0]` over the first `n` training steps (`1 ≤ s ≤ n`): the base rate
    /// before learning has moved it.
    FirstStepsMean(u64),
    /// The mean of `keys[0]` over every training step (`1 ≤ s ≤ L`): a measure that does not
    /// saturate when the last quarter does.
    WholeMean,
    /// `keys[0] − keys[1]`, each the mean over the first quarter of the training steps.
    FirstQuarterGap,
    /// The sum of `keys[0]` over every logged step (a per-step count's total).
    Total,
}

impl ColumnValue {
    /// The training steps a windowed column averages over, for a run whose last step is
    /// `last`; `None` for the final-value kinds.
    pub fn steps(self, last: u64) -> Option<std::ops::RangeInclusive<u64>> {
        let q = (last / 4).max(1);
        match self {
            ColumnValue::LastQuarterMean => Some(last.saturating_sub(q) + 1..=last),
            ColumnValue::FirstQuarterMean | ColumnValue::FirstQuarterGap => Some(1..=q.min(last)),
            ColumnValue::FirstStepsMean(n) => Some(1..=n.min(last)),
            ColumnValue::WholeMean => Some(1..=last),
            ColumnValue::FirstKey | ColumnValue::Share | ColumnValue::Total => None,
        }
    }

    /// Which steps a windowed column averages over, in words (e.g. "steps 31–40 of 40").
    fn window_words(self) -> Option<String> {
        Some(match self {
            ColumnValue::LastQuarterMean => {
                "the last quarter of each run's training steps (e.g. steps 31–40 of 40)".into()
            }
            ColumnValue::FirstQuarterMean | ColumnValue::FirstQuarterGap => {
                "the first quarter of each run's training steps (e.g. steps 1–10 of 40)".into()
            }
            ColumnValue::FirstStepsMean(n) => format!("each run's training steps 1–{n}"),
            ColumnValue::WholeMean => "every training step of each run".into(),
            ColumnValue::FirstKey | ColumnValue::Share | ColumnValue::Total => return None,
        })
    }

    /// The mean of `key` over the [`Self::steps`] of `run`; `None` for the final-value kinds
    /// or when the run logs no value there.
    pub fn quarter_mean(self, run: &Run, key: &str) -> Option<f64> {
        let steps = self.steps(run.last_step()?)?;
        let xs: Vec<f64> = run
            .series(key)
            .into_iter()
            .filter(|(s, _)| steps.contains(s))
            .map(|(_, v)| v)
            .collect();
        (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
    }
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
    /// How the value is made from the keys.
    pub value: ColumnValue,
}

impl Column {
    /// Whether `run` logs what this column needs (one of its keys, or both for a share).
    pub fn logged_by(&self, run: &Run) -> bool {
        match self.value {
            ColumnValue::FirstKey
            | ColumnValue::LastQuarterMean
            | ColumnValue::FirstQuarterMean
            | ColumnValue::FirstStepsMean(_)
            | ColumnValue::WholeMean
            | ColumnValue::Total => run.first_key(self.keys).is_some(),
            ColumnValue::Share | ColumnValue::FirstQuarterGap => {
                self.keys.iter().all(|k| run.has(k))
            }
        }
    }
}

/// The themes the table is split into, so that no table is wider than a screen: what was
/// solved, the judge, the difficulty adaptation, and the training diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ColumnGroup {
    /// Task success: the evaluations and the training success.
    Success,
    /// The judge's accuracies and training.
    Judge,
    /// The proposals of the difficulty adaptation.
    Adaptation,
    /// How training went: right steps, groups with a signal, episodes the environment ended.
    Diagnostics,
}

impl ColumnGroup {
    /// The table's heading.
    pub fn title(self) -> &'static str {
        match self {
            Self::Success => "Task success",
            Self::Judge => "The judge",
            Self::Adaptation => "Difficulty adaptation",
            Self::Diagnostics => "Training diagnostics",
        }
    }
}

impl Column {
    /// The theme of the column, read from its first key.
    pub fn group(&self) -> ColumnGroup {
        let k = self.keys[0];
        if k.starts_with("judge/") {
            ColumnGroup::Judge
        } else if k.starts_with("env/accepted") || k.starts_with("env/rejected") {
            ColumnGroup::Adaptation
        } else if k.starts_with("eval/") || k == "env/acc_mean" {
            ColumnGroup::Success
        } else {
            ColumnGroup::Diagnostics
        }
    }
}

/// Header of the accepted-proposal rate column.
pub const ACCEPT_RATE: &str = "accepted-proposal rate";

/// Every column the table can have; those no run logs are left out.
pub const COLUMNS: [Column; 25] = [
    Column {
        header: "acc ID",
        keys: &["eval/acc_id"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "acc OOD",
        keys: &["eval/acc_ood"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "judge p⁺ (correct steps)",
        keys: &["judge/eval_pos_acc", "judge/process_acc_pos"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "judge p⁻ (wrong steps)",
        keys: &["judge/eval_neg_acc", "judge/process_acc_neg"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "judge balanced acc",
        keys: &["judge/eval_bal_acc"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "judge bal. acc, policy's steps, first quarter",
        keys: &["judge/steps_bal_acc"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstQuarterMean,
    },
    Column {
        header: "judge bal. acc, policy's steps, last quarter",
        keys: &["judge/steps_bal_acc"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::LastQuarterMean,
    },
    Column {
        header: "judge outcome acc",
        keys: &["judge/outcome_acc"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "judge training samples (total)",
        keys: &["judge/train_samples"],
        kind: ColumnKind::Count,
        value: ColumnValue::Total,
    },
    Column {
        header: "proposals accepted",
        keys: &["env/accepted"],
        kind: ColumnKind::Count,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "proposals rejected",
        keys: &["env/rejected"],
        kind: ColumnKind::Count,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "accepted harder",
        keys: &["env/accepted_harder"],
        kind: ColumnKind::Count,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "accepted easier",
        keys: &["env/accepted_easier"],
        kind: ColumnKind::Count,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: ACCEPT_RATE,
        keys: &["env/accepted", "env/rejected"],
        kind: ColumnKind::Rate,
        value: ColumnValue::Share,
    },
    Column {
        header: "train success, last ¼",
        keys: &["env/acc_mean"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::LastQuarterMean,
    },
    Column {
        header: "acc at the training difficulty",
        keys: &["eval/acc_start"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "sampled acc at the training difficulty",
        keys: &["eval/acc_start_sampled"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::FirstKey,
    },
    Column {
        header: "right steps in training, last ¼",
        keys: &["env/step_acc"],
        kind: ColumnKind::Rate,
        value: ColumnValue::LastQuarterMean,
    },
    Column {
        header: "train success, steps 1–5",
        keys: &["env/acc_mean"],
        kind: ColumnKind::Rate,
        value: ColumnValue::FirstStepsMean(5),
    },
    Column {
        header: "train success, whole run",
        keys: &["env/acc_mean"],
        kind: ColumnKind::Accuracy,
        value: ColumnValue::WholeMean,
    },
    Column {
        header: "right steps in training, first ¼",
        keys: &["env/step_acc"],
        kind: ColumnKind::Rate,
        value: ColumnValue::FirstQuarterMean,
    },
    Column {
        header: "right steps of solved episodes, first ¼",
        keys: &["env/step_acc_solved"],
        kind: ColumnKind::Rate,
        value: ColumnValue::FirstQuarterMean,
    },
    Column {
        header: "solved − all right steps, first ¼",
        keys: &["env/step_acc_solved", "env/step_acc"],
        kind: ColumnKind::Rate,
        value: ColumnValue::FirstQuarterGap,
    },
    Column {
        header: "groups with outcome signal (of the used), first ¼",
        keys: &["policy/mixed_groups"],
        kind: ColumnKind::Count,
        value: ColumnValue::FirstQuarterMean,
    },
    Column {
        header: "episodes ended by the environment (total)",
        keys: &["env/failed_episodes"],
        kind: ColumnKind::Count,
        value: ColumnValue::Total,
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
    /// Its further comparisons ([`Row::compare`]), in order.
    pub more: Vec<Comparison>,
}

/// A row paired with another experiment than its baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The other experiment.
    pub against: String,
    /// Seeds both have.
    pub shared_seeds: Vec<u64>,
    /// One cell per shown column: mean ± CI of `row − against` over shared seeds.
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
        // A run at static difficulty logs the proposal counters as 0 on every step: the
        // adaptation's columns are left out where no run of the suite resolved a proposal.
        let adapts = suite.runs().any(|r| {
            ["env/accepted", "env/rejected"]
                .iter()
                .any(|k| r.series(k).iter().any(|&(_, v)| v != 0.0))
        });
        let logged: Vec<Column> = COLUMNS
            .iter()
            .filter(|c| suite.runs().any(|r| c.logged_by(r)))
            .copied()
            .collect();
        let mut notes = Vec::new();
        if !adapts && logged.iter().any(|c| c.group() == ColumnGroup::Adaptation) {
            notes.push(
                "no run resolved a difficulty proposal (every proposal counter 0): the \
                 adaptation's columns are left out"
                    .to_string(),
            );
        }
        let columns: Vec<Column> = logged
            .into_iter()
            .filter(|c| adapts || c.group() != ColumnGroup::Adaptation)
            .collect();
        for c in &columns {
            match c.value {
                ColumnValue::FirstKey => key_mix_note(suite, c, &mut notes),
                ColumnValue::Share => share_note(suite, c, &mut notes),
                ColumnValue::Total => notes.push(format!(
                    "`{}`: the sum of `{}` over every step of each run{}",
                    c.header,
                    c.keys[0],
                    if c.keys[0] == "env/failed_episodes" {
                        "; such episodes are scored unsolved like the policy's failures"
                    } else {
                        ""
                    }
                )),
                ColumnValue::FirstQuarterGap => notes.push(format!(
                    "`{}`: the mean of `{}` minus the mean of `{}`, each over {}",
                    c.header,
                    c.keys[0],
                    c.keys[1],
                    c.value.window_words().unwrap_or_default()
                )),
                ColumnValue::LastQuarterMean
                | ColumnValue::FirstQuarterMean
                | ColumnValue::FirstStepsMean(_)
                | ColumnValue::WholeMean => notes.push(format!(
                    "`{}`: the mean of `{}` over {}, not a final value",
                    c.header,
                    c.keys[0],
                    c.value.window_words().unwrap_or_default()
                )),
            }
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
                value. **Bold**: best mean of an accuracy column (counts and the \
                accepted-proposal rate are not ranked).\n";
        for n in &self.notes {
            out += &format!("- {n}\n");
        }
        out
    }

    /// The shown columns' indices by theme, themes in order (each once, only if present); one
    /// theme of no columns when nothing is shown (a table of the rows alone).
    fn groups(&self) -> Vec<(ColumnGroup, Vec<usize>)> {
        let mut groups: Vec<(ColumnGroup, Vec<usize>)> = Vec::new();
        for (i, c) in self.columns.iter().enumerate() {
            match groups.iter_mut().find(|(g, _)| *g == c.group()) {
                Some((_, idx)) => idx.push(i),
                None => groups.push((c.group(), vec![i])),
            }
        }
        groups.sort_by_key(|(g, _)| *g);
        if groups.is_empty() {
            groups.push((ColumnGroup::Success, Vec::new()));
        }
        groups
    }

    /// One Markdown table per theme, each under its heading where there are several: the lead
    /// header cells `lead` (ruled by `lead_rule`), a cell `prefix` + header per column of the
    /// theme, then `body`'s rows for the theme's column indices.
    fn by_theme(
        &self,
        lead: &str,
        lead_rule: &str,
        prefix: &str,
        body: impl Fn(&[usize]) -> String,
    ) -> String {
        let groups = self.groups();
        let mut out = String::new();
        for (n, (g, idx)) in groups.iter().enumerate() {
            if n > 0 {
                out.push('\n');
            }
            if groups.len() > 1 {
                out += &format!("**{}**\n\n", g.title());
            }
            out += lead;
            let mut rule = String::from(lead_rule);
            for &i in idx {
                out += &format!(" {prefix}{} |", self.columns[i].header);
                rule += "---:|";
            }
            out = out + "\n" + &rule + "\n" + &body(idx);
        }
        out
    }

    fn main_markdown(&self) -> String {
        let best = self.best();
        self.by_theme("| experiment | seeds |", "|---|---:|", "", |idx| {
            let mut out = String::new();
            for r in &self.rows {
                out += &format!("| {} | {} |", r.experiment, r.runs);
                for &i in idx {
                    let (c, cell) = (&self.columns[i], r.cells[i]);
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
        })
    }

    fn diff_markdown(&self) -> String {
        let more = self.rows.iter().any(|r| !r.more.is_empty());
        let (intro, lead) = if more {
            (
                "Paired difference to the baseline and to each further comparison named (row − the other, over the seeds both have, matched by seed number; mean ± 95% CI):\n\n",
                "| experiment | against | shared seeds |",
            )
        } else {
            (
                "Paired difference to the baseline (row − baseline, over the seeds both have, matched by seed number; mean ± 95% CI):\n\n",
                "| experiment | baseline | shared seeds |",
            )
        };
        let tables = self.by_theme(lead, "|---|---|---|", "Δ ", |idx| {
            let mut out = String::new();
            for r in &self.rows {
                let base = r.baseline.as_ref().map(|b| (b, &r.shared_seeds, &r.diffs));
                let further = r
                    .more
                    .iter()
                    .map(|m| (&m.against, &m.shared_seeds, &m.diffs));
                for (against, shared, diffs) in base.into_iter().chain(further) {
                    let seeds = if shared.is_empty() {
                        "none".to_string()
                    } else {
                        shared
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    out += &format!("| {} | {against} | {seeds} |", r.experiment);
                    for &i in idx {
                        out += &match &diffs[i] {
                            Some(d) => {
                                format!(" {} |", diff_text(d, &self.columns[i], shared.len()))
                            }
                            None => " – |".to_string(),
                        };
                    }
                    out += "\n";
                }
            }
            out
        });
        intro.to_string() + &tables
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
        ColumnKind::Accuracy | ColumnKind::Rate => 3,
        ColumnKind::Count => 1,
    }
}

fn cell_text(m: &MeanCi, c: &Column, runs: usize) -> String {
    mean_text(m, digits(c), runs)
}

/// `mean ± half-width` to `digits` decimals, with `(n=k)` when only k of `runs` runs (k > 1)
/// have the value.
pub(crate) fn mean_text(m: &MeanCi, digits: usize, runs: usize) -> String {
    let text = m.format(digits);
    if m.n < runs && m.n > 1 {
        format!("{text} (n={})", m.n)
    } else {
        text
    }
}

pub(crate) fn diff_text(d: &MeanCi, c: &Column, shared: usize) -> String {
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

/// A run's final value for a column (see [`ColumnValue`]); `None` when absent, `null` (with a
/// note) or undefined.
fn run_value(run: &Run, c: &Column, notes: &mut Vec<String>) -> Option<f64> {
    match c.value {
        ColumnValue::FirstKey => final_number(run, run.first_key(c.keys)?, c, notes),
        ColumnValue::Share => {
            let [a, b] = c.keys else {
                return None;
            };
            let x = final_number(run, a, c, notes)?;
            let y = final_number(run, b, c, notes)?;
            share(x, y)
        }
        ColumnValue::LastQuarterMean
        | ColumnValue::FirstQuarterMean
        | ColumnValue::FirstStepsMean(_)
        | ColumnValue::WholeMean => c.value.quarter_mean(run, c.keys[0]),
        ColumnValue::FirstQuarterGap => {
            let [a, b] = c.keys else {
                return None;
            };
            Some(c.value.quarter_mean(run, a)? - c.value.quarter_mean(run, b)?)
        }
        ColumnValue::Total => {
            let xs = run.series(c.keys[0]);
            (!xs.is_empty()).then(|| xs.iter().map(|(_, v)| v).sum())
        }
    }
}

/// A run's value of the column headed `header` (see [`ColumnValue`]); `None` when the run has
/// none or no column has that header.
pub(crate) fn column_value(run: &Run, header: &str) -> Option<f64> {
    let c = COLUMNS.iter().find(|c| c.header == header)?;
    run_value(run, c, &mut Vec::new())
}

/// `x / (x + y)`; `None` when the sum is not positive (no proposal resolved: undefined).
fn share(x: f64, y: f64) -> Option<f64> {
    let total = x + y;
    (total > 0.0).then(|| x / total)
}

/// The final value of `key` in `run`; `None` when absent or `null` (the latter with a note).
fn final_number(run: &Run, key: &str, c: &Column, notes: &mut Vec<String>) -> Option<f64> {
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
    let more = row
        .compare
        .iter()
        .filter_map(|a| {
            let (shared_seeds, diffs) = paired(row, suite.row(a)?, columns);
            Some(Comparison {
                against: a.clone(),
                shared_seeds,
                diffs,
            })
        })
        .collect();
    TableRow {
        experiment: row.experiment.clone(),
        runs: row.runs.len(),
        cells,
        baseline: row.baseline.clone(),
        shared_seeds,
        diffs,
        more,
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
    let mut scratch = Vec::new();
    let diffs = columns
        .iter()
        .map(|c| paired_on(row, base, &shared, |r| run_value(r, c, &mut scratch)))
        .collect();
    (shared, diffs)
}

/// The mean ± CI of `value(row's run) − value(base's run)` over `seeds` (the first run of a
/// seed in each row), where both runs have a value.
pub(crate) fn paired_on(
    row: &Row,
    base: &Row,
    seeds: &[u64],
    mut value: impl FnMut(&Run) -> Option<f64>,
) -> Option<MeanCi> {
    let run_of = |r: &Row, s: u64| r.runs.iter().find(|x| x.seed == Some(s)).cloned();
    let ds: Vec<f64> = seeds
        .iter()
        .filter_map(|&s| {
            let a = value(&run_of(row, s)?)?;
            let b = value(&run_of(base, s)?)?;
            Some(a - b)
        })
        .collect();
    mean_ci95(&ds)
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

/// Whether the final value of `key` in `run` is 0.
fn final_is_zero(run: &Run, key: &str) -> bool {
    matches!(run.final_value(key), Final::Value { value, .. } if value == 0.0)
}

/// Says how a share column is computed and which runs it is undefined for (both counts 0).
fn share_note(suite: &Suite, c: &Column, notes: &mut Vec<String>) {
    let [a, b] = c.keys else {
        return;
    };
    let undefined: Vec<String> = suite
        .rows
        .iter()
        .filter_map(|row| {
            let k = row
                .runs
                .iter()
                .filter(|r| final_is_zero(r, a) && final_is_zero(r, b))
                .count();
            (k > 0).then(|| format!("{} ({k} of {} runs)", row.experiment, row.runs.len()))
        })
        .collect();
    let mut note = format!(
        "`{}` is `{a} / ({a} + {b})` at each run's last step (proposals still pending are not counted)",
        c.header
    );
    if !undefined.is_empty() {
        note += &format!(
            "; undefined where no proposal was resolved, so left out (– if no run of the row has one): {}",
            undefined.join(", ")
        );
    }
    notes.push(note);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::{Meta, MetricsLine};
    use std::path::PathBuf;

    /// A run of `exp` whose last line has the cumulative counts `accepted`, `rejected`.
    fn run(exp: &str, seed: u64, accepted: f64, rejected: f64) -> Run {
        let line = |step, a: f64, r: f64| MetricsLine {
            step,
            values: [
                ("env/accepted".to_string(), Some(a)),
                ("env/rejected".to_string(), Some(r)),
                ("eval/acc_id".to_string(), Some(0.5)),
            ]
            .into_iter()
            .collect(),
        };
        Run {
            dir: PathBuf::from(format!("/x/{exp}/seed-{seed}")),
            experiment: exp.into(),
            seed: Some(seed),
            meta: Meta::default(),
            lines: vec![line(1, 0.0, 0.0), line(2, accepted, rejected)],
            adaptation: None,
            posterior: None,
            resolved: None,
            warnings: vec![],
        }
    }

    #[test]
    fn share_is_undefined_without_resolved_proposals() {
        assert_eq!(share(3.0, 1.0), Some(0.75));
        assert_eq!(share(0.0, 4.0), Some(0.0));
        assert_eq!(share(0.0, 0.0), None);
    }

    #[test]
    fn accept_rate_cells_and_paired_differences() {
        // x: 1/4, 2/4, 0/0 (undefined); y (baseline: the row above is x): 3/4, 1/2, 2/2.
        let runs = vec![
            run("x", 1, 1.0, 3.0),
            run("x", 2, 2.0, 2.0),
            run("x", 3, 0.0, 0.0),
            run("y", 1, 3.0, 1.0),
            run("y", 2, 1.0, 1.0),
            run("y", 3, 2.0, 0.0),
        ];
        let t = Table::build(&Suite::from_runs(runs, &[]));
        let i = t
            .columns
            .iter()
            .position(|c| c.header == ACCEPT_RATE)
            .expect("rate column");
        let (x, y) = (&t.rows[0], &t.rows[1]);
        // x: 0.25, 0.5 → mean 0.375, s = 0.1767767, t(1) = 12.7062047 → ± 1.5882756; n = 2.
        let c = x.cells[i].expect("x rate");
        assert_eq!(c.n, 2);
        assert!((c.mean - 0.375).abs() < 1e-12);
        assert!((c.half_width.expect("ci") - 1.588_275_6).abs() < 1e-6);
        // y: 0.75, 0.5, 1.0 → mean 0.75.
        assert!((y.cells[i].expect("y rate").mean - 0.75).abs() < 1e-12);
        // y − x over seeds 1, 2 (seed 3 of x is undefined): 0.5, 0.0 → +0.25 ± 3.1765512.
        assert_eq!(y.baseline.as_deref(), Some("x"));
        let d = y.diffs[i].expect("paired rate");
        assert_eq!(d.n, 2);
        assert!((d.mean - 0.25).abs() < 1e-12);
        assert!((d.half_width.expect("ci") - 3.176_551_2).abs() < 1e-6);
        let md = t.markdown();
        // Two themes, two tables, each under its heading: the success column apart from the
        // adaptation's three, in both the table and the paired differences.
        assert!(
            md.contains("**Task success**\n\n| experiment | seeds | acc ID |\n|---|---:|---:|\n| x | 3 | **0.500 ± 0.000** |\n"),
            "{md}"
        );
        assert!(
            md.contains("**Difficulty adaptation**\n\n| experiment | seeds | proposals accepted |"),
            "{md}"
        );
        assert!(
            md.contains("| x | 3 | 1.0 ± 2.5 | 1.7 ± 3.8 | 0.375 ± 1.588 (n=2) |\n"),
            "{md}"
        );
        assert_eq!(md.matches("**Task success**").count(), 2, "{md}");
        assert!(
            md.contains("| y | x | 1, 2, 3 | +0.000 ± 0.000 |\n"),
            "{md}"
        );
        assert!(md.contains("| +0.250 ± 3.177 (n=2) |"), "{md}");
        assert!(md.contains("x (1 of 3 runs)"), "{md}");
        // Not ranked: the higher rate (y's) is not bold.
        assert!(md.contains(" | 0.750 ± 0.621 |\n"), "{md}");
    }

    /// A run of 8 steps whose `env/acc_mean` at step `s` is `base + s / 100` and whose
    /// `policy/mixed_groups` is `s`.
    fn training_run(exp: &str, seed: u64, base: f64) -> Run {
        let line = |step: u64| MetricsLine {
            step,
            values: [
                ("env/acc_mean".to_string(), Some(base + step as f64 / 100.0)),
                ("policy/mixed_groups".to_string(), Some(step as f64)),
            ]
            .into_iter()
            .collect(),
        };
        Run {
            lines: (1..=8).map(line).collect(),
            ..run(exp, seed, 0.0, 0.0)
        }
    }

    #[test]
    fn a_suite_that_never_proposes_has_no_adaptation_table() {
        // Counters logged as 0 on every step (static difficulty): left out, with a note.
        let t = Table::build(&Suite::from_runs(
            vec![run("z", 1, 0.0, 0.0), run("z", 2, 0.0, 0.0)],
            &[],
        ));
        assert!(
            !t.columns
                .iter()
                .any(|c| c.group() == ColumnGroup::Adaptation)
        );
        assert!(t.columns.iter().any(|c| c.header == "acc ID"));
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("no run resolved a difficulty proposal")),
            "{:?}",
            t.notes
        );
        assert!(!t.markdown().contains("Difficulty adaptation"));
        // One resolved proposal in the suite brings the columns back, for every row (the three
        // these runs log: accepted, rejected and the rate).
        let t = Table::build(&Suite::from_runs(
            vec![run("z", 1, 0.0, 0.0), run("y", 1, 0.0, 1.0)],
            &[],
        ));
        assert_eq!(
            t.columns
                .iter()
                .filter(|c| c.group() == ColumnGroup::Adaptation)
                .count(),
            3
        );
    }

    #[test]
    fn quarter_columns_average_the_first_and_last_quarter_of_training() {
        assert_eq!(ColumnValue::LastQuarterMean.steps(40), Some(31..=40));
        assert_eq!(ColumnValue::FirstQuarterMean.steps(40), Some(1..=10));
        assert_eq!(ColumnValue::LastQuarterMean.steps(2), Some(2..=2));
        assert_eq!(ColumnValue::FirstKey.steps(40), None);
        // Last quarter of 8 steps: 7, 8 → base + 0.075; first: 1, 2 → 1.5 mixed groups.
        let runs = vec![
            training_run("x", 1, 0.1),
            training_run("x", 2, 0.3),
            training_run("y", 1, 0.2),
            training_run("y", 2, 0.5),
        ];
        let t = Table::build(&Suite::from_runs(runs, &[]));
        let col = |h: &str| t.columns.iter().position(|c| c.header == h).expect(h);
        let (last, first) = (
            col("train success, last ¼"),
            col("groups with outcome signal (of the used), first ¼"),
        );
        let x = t.rows[0].cells[last].expect("x");
        assert!((x.mean - 0.275).abs() < 1e-12, "{}", x.mean);
        assert!((t.rows[0].cells[first].expect("x").mean - 1.5).abs() < 1e-12);
        // y − x per seed: +0.1, +0.2 → +0.15.
        let d = t.rows[1].diffs[last].expect("paired");
        assert!((d.mean - 0.15).abs() < 1e-12);
    }

    #[test]
    fn the_environments_failures_are_a_total_column_shown_only_when_logged() {
        // Runs of 8 steps; seed 1 lost 1 episode at step 3 and 2 at step 7, seed 2 none.
        let failing = |seed: u64, lost: &[(u64, f64)]| {
            let mut r = training_run("p", seed, 0.1);
            for l in &mut r.lines {
                let n = lost
                    .iter()
                    .find(|(s, _)| *s == l.step)
                    .map_or(0.0, |(_, n)| *n);
                l.values.insert("env/failed_episodes".to_string(), Some(n));
            }
            r
        };
        let t = Table::build(&Suite::from_runs(
            vec![failing(1, &[(3, 1.0), (7, 2.0)]), failing(2, &[])],
            &[],
        ));
        let c = t
            .columns
            .iter()
            .position(|c| c.header == "episodes ended by the environment (total)")
            .expect("shown");
        // (3 + 0) / 2 seeds.
        assert!((t.rows[0].cells[c].expect("total").mean - 1.5).abs() < 1e-12);
        assert!(
            t.notes.iter().any(|n| n.contains("scored unsolved")),
            "{:?}",
            t.notes
        );
        // Runs of an in-process environment do not log it: no column.
        let t = Table::build(&Suite::from_runs(vec![training_run("q", 1, 0.1)], &[]));
        assert!(
            !t.columns
                .iter()
                .any(|c| c.header == "episodes ended by the environment (total)")
        );
    }
}
