//! Kinds of step: the judge's accuracy on each kind, what the policy's steps and wrong steps
//! are, and the runs a judge gate stopped — the tables a study of *where* credit goes reads.
//!
//! An environment names the kind of each step (the corridor: `borderline` and `clear` doors;
//! household and desktop their own), and the loop logs per kind:
//! - the judge on the fixed pool at each evaluation (`judge/eval_{bal,pos,neg}_acc/<kind>`)
//!   and on the policy's own training steps, against the oracle
//!   (`judge/steps_{bal,pos,neg}_acc/<kind>`);
//! - each kind's share of all steps and of the wrong steps (`env/kind/<kind>`,
//!   `env/wrong/<kind>`).
//!
//! **Judge by kind**: per experiment and kind, the pool at the first evaluation (step 0: the
//! warm-started judge; what a `judge.gate` reads) and the last, and the policy's steps over
//! the first and the last quarter of the training steps (as the ablation table's quarter
//! columns); mean ± 95% CI over seeds. **Step kinds**: each kind's share over the first →
//! last quarter, mean over seeds. **Gated out**: every run the gate stopped (its
//! `gated.jsonl`: the step-0 line), with its pool accuracies by kind.

use crate::runs::Run;
use crate::stats::mean_ci95;
use crate::suite::Suite;
use crate::table::ColumnValue;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The judge-by-kind columns: header, key stem, how a run's value is made.
const JUDGE: [(&str, &str, When); 8] = [
    (
        "pool, first eval: balanced",
        "judge/eval_bal_acc",
        When::FirstEval,
    ),
    (
        "pool, first eval: p⁺",
        "judge/eval_pos_acc",
        When::FirstEval,
    ),
    (
        "pool, first eval: p⁻",
        "judge/eval_neg_acc",
        When::FirstEval,
    ),
    (
        "pool, last eval: balanced",
        "judge/eval_bal_acc",
        When::LastEval,
    ),
    (
        "policy's steps, first ¼: balanced",
        "judge/steps_bal_acc",
        When::FirstQuarter,
    ),
    (
        "policy's steps, first ¼: p⁺",
        "judge/steps_pos_acc",
        When::FirstQuarter,
    ),
    (
        "policy's steps, first ¼: p⁻",
        "judge/steps_neg_acc",
        When::FirstQuarter,
    ),
    (
        "policy's steps, last ¼: balanced",
        "judge/steps_bal_acc",
        When::LastQuarter,
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    FirstEval,
    LastEval,
    FirstQuarter,
    LastQuarter,
}

/// A run's value of `key` at `when`.
fn value(run: &Run, key: &str, when: When) -> Option<f64> {
    match when {
        When::FirstEval => run.series(key).first().map(|(_, v)| *v),
        When::LastEval => run.series(key).last().map(|(_, v)| *v),
        When::FirstQuarter => ColumnValue::FirstQuarterMean.quarter_mean(run, key),
        When::LastQuarter => ColumnValue::LastQuarterMean.quarter_mean(run, key),
    }
}

/// The kinds named by keys `<stem>/<kind>` of any of `stems` in `runs`, sorted.
fn kinds<'r>(runs: impl Iterator<Item = &'r Run>, stems: &[&str]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for r in runs {
        for l in &r.lines {
            for k in l.values.keys() {
                for s in stems {
                    if let Some(kind) = k.strip_prefix(s).and_then(|t| t.strip_prefix('/')) {
                        out.insert(kind.to_string());
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

fn cell(xs: &[f64], runs: usize) -> String {
    mean_ci95(xs).map_or("–".into(), |m| crate::table::mean_text(&m, 3, runs))
}

/// The situation columns: header, key stem, how a run's value is made.
const SITUATION: [(&str, &str, When); 6] = [
    (
        "policy takes it, first ¼",
        "env/situation",
        When::FirstQuarter,
    ),
    (
        "policy takes it, last ¼",
        "env/situation",
        When::LastQuarter,
    ),
    (
        "judge approves: pool, first eval",
        "judge/eval_approve",
        When::FirstEval,
    ),
    (
        "judge approves: pool, last eval",
        "judge/eval_approve",
        When::LastEval,
    ),
    (
        "judge approves: policy's steps, first ¼",
        "judge/steps_approve",
        When::FirstQuarter,
    ),
    (
        "judge approves: policy's steps, last ¼",
        "judge/steps_approve",
        When::LastQuarter,
    ),
];

/// The situation columns split by the episode's outcome (policy's steps, last quarter).
const SITUATION_BY_OUTCOME: [(&str, &str, When); 4] = [
    (
        "policy takes it: solved episodes, last ¼",
        "env/situation_solved",
        When::LastQuarter,
    ),
    (
        "policy takes it: failed episodes, last ¼",
        "env/situation_failed",
        When::LastQuarter,
    ),
    (
        "judge approves: solved episodes, last ¼",
        "judge/steps_approve_solved",
        When::LastQuarter,
    ),
    (
        "judge approves: failed episodes, last ¼",
        "judge/steps_approve_failed",
        When::LastQuarter,
    ),
];

/// A table of `columns` for every row and every suffix (`label`: a kind, a situation) that
/// any run logs under a column's stem; `None` when none does. Rows whose cells are all empty
/// for a suffix are left out.
fn by_suffix_table(suite: &Suite, label: &str, columns: &[(&str, &str, When)]) -> Option<String> {
    let stems: Vec<&str> = columns.iter().map(|(_, k, _)| *k).collect();
    let all = kinds(suite.runs(), &stems);
    if all.is_empty() {
        return None;
    }
    let mut md = format!("| experiment | {label} |");
    for (h, _, _) in columns {
        let _ = write!(md, " {h} |");
    }
    let _ = writeln!(md, "\n|---|---|{}", "---:|".repeat(columns.len()));
    for row in &suite.rows {
        for suffix in &all {
            let cells: Vec<String> = columns
                .iter()
                .map(|(_, stem, when)| {
                    let key = format!("{stem}/{suffix}");
                    let xs: Vec<f64> = row
                        .runs
                        .iter()
                        .filter_map(|r| value(r, &key, *when))
                        .collect();
                    cell(&xs, row.runs.len())
                })
                .collect();
            if cells.iter().all(|c| c == "–") {
                continue;
            }
            let _ = writeln!(
                md,
                "| {} | {suffix} | {} |",
                row.experiment,
                cells.join(" | ")
            );
        }
    }
    Some(md)
}

/// The judge-by-kind table, if any run logs the judge by kind.
fn judge_table(suite: &Suite) -> Option<String> {
    let mut md = by_suffix_table(suite, "kind", &JUDGE)?;
    md += "\nThe judge per kind of step, mean ± 95% CI over seeds (`(n=k)`: only k runs have the value — a kind with no wrong step in a window has no p⁻ and no balanced accuracy there). Pool: the fixed labelled pool at the first evaluation (step 0, the warm-started judge: what a `judge.gate` reads) and at the last (`judge/eval_*_acc/<kind>`, majority of the votes). Policy's steps: the judge's verdicts on the policy's own training steps against the oracle, averaged over the first and the last quarter of the training steps (`judge/steps_*_acc/<kind>`).\n";
    md += &paired_by_suffix(
        suite,
        "judge/eval_bal_acc",
        When::LastEval,
        "The judge's balanced accuracy per kind on the pool at the last evaluation",
    );
    Some(md)
}

/// The watched-situations table (an experiment's `situations`), if any run logs one, and,
/// paired by seed between each row and its baseline and further comparisons: the policy's
/// rate of each over the last quarter, and the judge's approval there on the pool at the last
/// evaluation and on the policy's steps over the last quarter.
fn situation_table(suite: &Suite) -> Option<String> {
    let mut md = by_suffix_table(suite, "situation", &SITUATION)?;
    md += "\nThe watched situations (`after:action`: the action answered to the line `after`), mean ± 95% CI over seeds. Policy takes it: of the policy's training steps after that line, the share that answer the action (`env/situation/…`), averaged over the first and the last quarter of the training steps. Judge approves: the share of majority `+` verdicts on the steps in the situation — on the evaluation pool at the first and the last evaluation (`judge/eval_approve/…`) and on the policy's own steps (`judge/steps_approve/…`); `(n=k)`: only k runs met it.\n";
    if let Some(t) = by_suffix_table(suite, "situation", &SITUATION_BY_OUTCOME) {
        md += "\nBy the episode's outcome: the same shares over the last quarter of the training steps, counting only the steps of solved episodes or only those of failed ones (`env/situation_solved/…`, `env/situation_failed/…`, `judge/steps_approve_solved/…`, `judge/steps_approve_failed/…`). A situation the outcome can teach a judge about is one the policy takes more often in failed episodes than in solved ones.\n\n";
        md += &t;
    }
    for (stem, when, what) in [
        (
            "env/situation",
            When::LastQuarter,
            "The policy takes it, last ¼",
        ),
        (
            "judge/eval_approve",
            When::LastEval,
            "The judge approves it: pool, last eval",
        ),
        (
            "judge/steps_approve",
            When::LastQuarter,
            "The judge approves it: policy's steps, last ¼",
        ),
    ] {
        md += &paired_by_suffix(suite, stem, when, what);
    }
    Some(md)
}

/// `what`, row − row named, paired by seed (mean ± 95% CI of the per-seed differences) for
/// each suffix of `stem` that a run logs, a run's value taken at `when`: one line per row and
/// its baseline or further comparison; empty without a pair that has a value.
fn paired_by_suffix(suite: &Suite, stem: &str, when: When, what: &str) -> String {
    let all = kinds(suite.runs(), &[stem]);
    let mut lines = String::new();
    for row in &suite.rows {
        for name in row.baseline.iter().chain(&row.compare) {
            let Some(other) = suite.row(name) else {
                continue;
            };
            let seeds: Vec<u64> = row
                .seeds()
                .into_iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let cells: Vec<String> = all
                .iter()
                .map(|suffix| {
                    let key = format!("{stem}/{suffix}");
                    let d = crate::table::paired_on(row, other, &seeds, |r| value(r, &key, when));
                    d.map_or("–".into(), |d| match d.half_width {
                        Some(h) => format!("{:+.3} ± {h:.3} (n={})", d.mean, d.n),
                        None => format!("{:+.3} (n=1)", d.mean),
                    })
                })
                .collect();
            if cells.iter().any(|c| c != "–") {
                let _ = writeln!(
                    lines,
                    "| {} − {name} | {} |",
                    row.experiment,
                    cells.join(" | ")
                );
            }
        }
    }
    if lines.is_empty() {
        return lines;
    }
    format!(
        "\n{what}, paired by seed (row − row named; `n`: the seeds both have it; `{stem}/…`):\n\n| comparison | {} |\n|---|{}\n{lines}",
        all.join(" | "),
        "---:|".repeat(all.len())
    )
}

/// The share-of-steps tables (`env/kind/`, `env/wrong/`), if any run logs them.
fn share_tables(suite: &Suite) -> String {
    let mut md = String::new();
    for (stem, what) in [
        ("env/wrong", "each kind's share of the wrong steps"),
        ("env/kind", "each kind's share of all steps"),
    ] {
        let all = kinds(suite.runs(), &[stem]);
        if all.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "What the policy's training steps are — {what} (`{stem}/<kind>`), first quarter → last quarter of the training steps, mean over seeds:\n"
        );
        let _ = writeln!(
            md,
            "| experiment | {} |\n|---|{}",
            all.join(" | "),
            "---|".repeat(all.len())
        );
        for row in &suite.rows {
            let cells: Vec<String> = all
                .iter()
                .map(|k| {
                    let key = format!("{stem}/{k}");
                    let mean = |when| {
                        let xs: Vec<f64> = row
                            .runs
                            .iter()
                            .filter_map(|r| value(r, &key, when))
                            .collect();
                        (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
                    };
                    match (mean(When::FirstQuarter), mean(When::LastQuarter)) {
                        (Some(a), Some(b)) => format!("{a:.3} → {b:.3}"),
                        _ => "–".into(),
                    }
                })
                .collect();
            if cells.iter().any(|c| c != "–") {
                let _ = writeln!(md, "| {} | {} |", row.experiment, cells.join(" | "));
            }
        }
        md += "\n";
    }
    md
}

/// The runs a gate stopped, and for each row that had one every seed's step-0 pool accuracy
/// by kind (what the gate read), passed or not.
fn gated_list(suite: &Suite, gated: &[Run]) -> String {
    if gated.is_empty() {
        return String::new();
    }
    let step0 = |r: &Run| -> String {
        let vals: Vec<String> = kinds(std::iter::once(r), &["judge/eval_bal_acc"])
            .iter()
            .filter_map(|k| {
                let v = value(r, &format!("judge/eval_bal_acc/{k}"), When::FirstEval)?;
                Some(format!("{k} {v:.3}"))
            })
            .collect();
        if vals.is_empty() {
            "not logged".into()
        } else {
            vals.join(", ")
        }
    };
    let mut md = String::from(
        "Gated out (`judge.gate`: the warm-started judge's pool accuracy outside the gate's range at its step-0 evaluation; such a run stopped before its first PPO step, is in no table above, and its step-0 line is its `gated.jsonl`). Every seed's step-0 pool balanced accuracy by kind, in the rows that lost a seed:\n\n",
    );
    let mut names: Vec<&str> = gated.iter().map(|r| r.experiment.as_str()).collect();
    names.dedup();
    for name in names {
        let mut seeds: Vec<(Option<u64>, String)> = gated
            .iter()
            .filter(|r| r.experiment == name)
            .map(|r| (r.seed, format!("{} **gated out**", step0(r))))
            .collect();
        if let Some(row) = suite.row(name) {
            seeds.extend(row.runs.iter().map(|r| (r.seed, step0(r))));
        }
        seeds.sort_by_key(|(s, _)| *s);
        let cells: Vec<String> = seeds
            .iter()
            .map(|(s, v)| format!("seed {}: {v}", s.map_or("?".into(), |s| s.to_string())))
            .collect();
        let _ = writeln!(md, "- {name}: {}", cells.join("; "));
    }
    md + "\n"
}

/// The step-kind section (Markdown), empty when no run logs a kind and no run was gated out.
pub(crate) fn markdown(suite: &Suite, gated: &[Run]) -> String {
    let mut md = String::new();
    if let Some(t) = judge_table(suite) {
        md += &t;
        md += "\n";
    }
    if let Some(t) = situation_table(suite) {
        md += &t;
        md += "\n";
    }
    md += &share_tables(suite);
    md += &gated_list(suite, gated);
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(exp: &str, seed: u64, lines: Vec<(u64, Vec<(&str, f64)>)>) -> Run {
        crate::runs::test_run(
            exp,
            seed,
            lines
                .into_iter()
                .map(|(s, kv)| (s, kv.into_iter().map(|(k, v)| (k, Some(v))))),
        )
    }

    /// `r` as a run of experiment `experiment`.
    fn renamed(mut r: Run, experiment: &str) -> Run {
        r.experiment = experiment.into();
        r
    }

    /// The section of `runs` with the comparison `row − against` added.
    fn compared(runs: Vec<Run>, (row, against): (&str, &str)) -> String {
        let mut suite = Suite::from_runs(runs, &[]);
        suite.add_comparisons(&[(row.into(), against.into())]);
        markdown(&suite, &[])
    }

    /// Eight steps: quarters are steps 1–2 and 7–8; evaluations at 0 and 8.
    fn judged(seed: u64, pool0: f64, early: f64, late: f64) -> Run {
        let mut lines = vec![(0, vec![("judge/eval_bal_acc/borderline", pool0)])];
        for s in 1..=8 {
            let v = if s <= 2 { early } else { late };
            lines.push((
                s,
                vec![
                    ("judge/steps_bal_acc/borderline", v),
                    ("env/wrong/borderline", 1.0),
                    ("env/kind/clear", s as f64 / 10.0),
                ],
            ));
        }
        lines.push((8, vec![("judge/eval_bal_acc/borderline", pool0 + 0.1)]));
        run("j", seed, lines)
    }

    #[test]
    fn judge_by_kind_shares_and_gated_runs_by_hand() {
        let runs = vec![judged(1, 0.8, 0.6, 0.7), judged(2, 0.9, 0.8, 0.9)];
        let suite = Suite::from_runs(runs, &[]);
        let gated = vec![run(
            "j",
            3,
            vec![(0, vec![("judge/eval_bal_acc/borderline", 0.495)])],
        )];
        let md = markdown(&suite, &gated);
        // Pool first eval: 0.8, 0.9 → 0.850 ± t(1)·0.0707 = 0.850 ± 0.635; last: 0.950.
        // Steps, first quarter (steps 1–2): 0.6, 0.8 → 0.700; last quarter (7–8): 0.7, 0.9.
        assert!(
            md.contains("| j | borderline | 0.850 ± 0.635 | – | – | 0.950 ± 0.635 | 0.700 ± 1.271 | – | – | 0.800 ± 1.271 |"),
            "{md}"
        );
        // env/kind/clear: steps 1–2 mean 0.15, steps 7–8 mean 0.75.
        assert!(md.contains("| j | 0.150 → 0.750 |"), "{md}");
        assert!(md.contains("| j | 1.000 → 1.000 |"), "{md}");
        assert!(
            md.contains("- j: seed 1: borderline 0.800; seed 2: borderline 0.900; seed 3: borderline 0.495 **gated out**"),
            "{md}"
        );
    }

    #[test]
    fn watched_situations_by_hand() {
        // Eight steps (quarters: steps 1–2 and 7–8), the pool at step 0. Seed 1 takes `L` after
        // a 6 at 0.2 early and 0.6 late; seed 2 at 0.4 and 0.8; the judge approves it on the
        // pool 1.0 and 0.9 at step 0 and 0.4 and 0.2 at step 8, on the policy's steps 1.0
        // throughout (seed 2 never judged there).
        let watched = |seed: u64, early: f64, late: f64, pool: (f64, f64), judged: bool| {
            let mut lines = vec![(0, vec![("judge/eval_approve/6:L", pool.0)])];
            for s in 1..=8 {
                let mut kv = vec![("env/situation/6:L", if s <= 2 { early } else { late })];
                if judged {
                    kv.push(("judge/steps_approve/6:L", 1.0));
                }
                if s == 8 {
                    kv.push(("judge/eval_approve/6:L", pool.1));
                }
                lines.push((s, kv));
            }
            run("w", seed, lines)
        };
        let against = |seed, late| renamed(watched(seed, 0.0, late, (0.5, 0.5), false), "o");
        let md = compared(
            vec![
                watched(1, 0.2, 0.6, (1.0, 0.4), true),
                watched(2, 0.4, 0.8, (0.9, 0.2), false),
                against(1, 0.5),
                against(2, 0.5),
            ],
            ("w", "o"),
        );
        // Last quarter, w − o by seed: 0.6 − 0.5, 0.8 − 0.5 → 0.200 ± 12.706·0.1414/√2.
        let policy = md
            .find("The policy takes it, last ¼, paired")
            .expect("policy pairs");
        assert!(
            md[policy..].contains("| w − o | +0.200 ± 1.271 (n=2) |"),
            "{md}"
        );
        // The pool at the last evaluation, w − o: 0.4 − 0.5, 0.2 − 0.5 → −0.200 ± 1.271.
        let pool = md.find("pool, last eval, paired").expect("pool pairs");
        assert!(
            md[pool..].contains("| w − o | -0.200 ± 1.271 (n=2) |"),
            "{md}"
        );
        // `o` is never judged on its steps: no pair there, so no such table.
        assert!(!md.contains("policy's steps, last ¼, paired"), "{md}");
        // 0.2, 0.4 → 0.300 ± 12.706·0.1414/√2 = 0.300 ± 1.271; 0.6, 0.8 → 0.700 ± 1.271;
        // pool 1.0, 0.9 → 0.950 ± 0.635, then 0.4, 0.2 → 0.300 ± 1.271; judged on seed 1
        // only: 1.000 (n=1).
        assert!(
            md.contains("| w | 6:L | 0.300 ± 1.271 | 0.700 ± 1.271 | 0.950 ± 0.635 | 0.300 ± 1.271 | 1.000 (n=1) | 1.000 (n=1) |"),
            "{md}"
        );
    }

    #[test]
    fn watched_situations_by_outcome_by_hand() {
        // Eight steps (last quarter: steps 7–8). `L` after a 6 is never taken in a solved
        // episode; in failed ones at 0.4 then 0.6 (seed 1) and 0.8 throughout (seed 2); the
        // judge approves it on failed episodes' steps 1.0 then 0.5 (seed 1), 0.2 (seed 2).
        let by_outcome = |seed: u64, failed: (f64, f64), approve: (f64, f64)| {
            let lines = (1..=8)
                .map(|s| {
                    let late = s >= 7;
                    let pick = |(a, b): (f64, f64)| if late { b } else { a };
                    let kv = vec![
                        ("env/situation/6:L", 0.5),
                        ("env/situation_solved/6:L", 0.0),
                        ("env/situation_failed/6:L", pick(failed)),
                        ("judge/steps_approve_failed/6:L", pick(approve)),
                    ];
                    (s, kv)
                })
                .collect();
            run("w", seed, lines)
        };
        let md = markdown(
            &Suite::from_runs(
                vec![
                    by_outcome(1, (0.4, 0.6), (1.0, 0.5)),
                    by_outcome(2, (0.8, 0.8), (0.2, 0.2)),
                ],
                &[],
            ),
            &[],
        );
        let table = md
            .find("By the episode's outcome")
            .expect("by-outcome table");
        // Solved 0, 0 → 0.000 ± 0.000; failed 0.6, 0.8 → 0.700 ± 12.706·0.1414/√2 = 1.271;
        // approved on failed 0.5, 0.2 → 0.350 ± 12.706·0.2121/√2 = 1.906; never judged on a
        // solved episode's step: –.
        assert!(
            md[table..].contains("| w | 6:L | 0.000 ± 0.000 | 0.700 ± 1.271 | – | 0.350 ± 1.906 |"),
            "{md}"
        );
    }

    #[test]
    fn the_judge_by_kind_at_the_last_evaluation_paired_by_hand() {
        // j's pool at step 8: 0.9, 1.0; k's: 0.7, 0.7 → j − k: 0.2, 0.3 → 0.250 ± 0.635.
        let k = |seed| renamed(judged(seed, 0.6, 0.5, 0.5), "k");
        let md = compared(
            vec![
                judged(1, 0.8, 0.6, 0.7),
                judged(2, 0.9, 0.8, 0.9),
                k(1),
                k(2),
            ],
            ("j", "k"),
        );
        let at = md
            .find("balanced accuracy per kind on the pool at the last evaluation, paired")
            .expect("paired by kind");
        assert!(md[at..].contains("| comparison | borderline |"), "{md}");
        assert!(
            md[at..].contains("| j − k | +0.250 ± 0.635 (n=2) |"),
            "{md}"
        );
    }

    #[test]
    fn nothing_without_kinds() {
        let suite = Suite::from_runs(
            vec![run("o", 1, vec![(1, vec![("env/acc_mean", 0.5)])])],
            &[],
        );
        assert_eq!(markdown(&suite, &[]), "");
    }
}
