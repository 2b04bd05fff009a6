//! End-to-end tests on the committed fixture `tests/fixtures/runs/` (written by
//! `tests/fixtures/make_runs.py`) and on malformed run directories made in a temp folder.

use crate::runs::tests::temp_dir;
use crate::table::ColumnKind;
use crate::*;
use std::fs;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/runs")
}

/// Reads an SVG's declared size, checking that it draws something (text, a path or a shape
/// besides the white background).
fn svg_size(path: &Path) -> (u32, u32) {
    let svg = fs::read_to_string(path).expect("svg");
    assert!(
        svg.ends_with("</svg>\n") || svg.ends_with("</svg>"),
        "{} is cut",
        path.display()
    );
    let attr = |name: &str| -> u32 {
        let head = &svg[..svg.find('>').expect("svg tag")];
        let at = head.find(&format!("{name}=\"")).expect("size attribute") + name.len() + 2;
        head[at..]
            .split('"')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a number")
    };
    let marks = [
        "<text",
        "<path",
        "<polyline",
        "<circle",
        "<polygon",
        "<line",
    ]
    .iter()
    .map(|m| svg.matches(m).count())
    .sum::<usize>();
    assert!(marks > 0, "{} is blank", path.display());
    (attr("width"), attr("height"))
}

/// Where a test writes its report: `RLANY_REPORT_OUT` if set (to look at it), else a temp dir.
fn out_dir(name: &str) -> PathBuf {
    match std::env::var_os("RLANY_REPORT_OUT") {
        Some(d) => PathBuf::from(d).join(name),
        None => temp_dir(name),
    }
}

fn bench_file(dir: &Path, name: &str, backend: Option<&str>, scale: f64) -> PathBuf {
    let mut rows = Vec::new();
    for (w, base) in [("K1_fwd", 0.4), ("K1_fwdbwd", 1.3), ("K2_fwd", 0.9)] {
        for v in [32_000, 128_000] {
            for (variant, f) in [("fused", 1.0), ("reference", 2.5)] {
                let ms = base * f * scale * f64::from(v) / 32_000.0;
                rows.push(serde_json::json!({
                    "name": format!("{w}_V{v}_f32"), "workload": w, "vocab": v, "dtype": "f32",
                    "variant": variant, "n": 4096, "bytes": 1e8, "median_ms": ms,
                    "gbps": 1.0, "frac_copy": 0.5, "error": null,
                }));
            }
        }
    }
    let mut v =
        serde_json::json!({ "n_requested": 4096, "reps": 10, "warmup": 3, "results": rows });
    if let Some(b) = backend {
        v["backend"] = b.into();
    }
    let path = dir.join(name);
    fs::write(&path, serde_json::to_string_pretty(&v).expect("json")).expect("write bench");
    path
}

#[test]
fn fixture_report_writes_every_figure() {
    let out = out_dir("fixture-report");
    let benches = temp_dir("fixture-bench");
    let mut opts = ReportOptions::new(&out);
    opts.bench_json = vec![
        bench_file(&benches, "cuda.json", Some("cuda"), 1.0),
        bench_file(&benches, "torch.json", None, 1.4),
    ];
    let s = write_report(&[fixture()], &opts).expect("report");
    assert_eq!((s.runs, s.experiments), (7, 3));
    let stems: Vec<String> = s
        .figures
        .iter()
        .map(|f| {
            f.svg
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        stems,
        [
            "eval_acc_step",
            "eval_acc_rollouts",
            "eval_acc_grid",
            "judge",
            "training",
            "diagnostics",
            "difficulty_a_outcome_only",
            "difficulty_b_policy_judge",
            "difficulty_c_env_gp",
            "posterior_c_env_gp_seed-1",
            "bench",
        ]
    );
    // Widths are fixed by the layout: panels × columns.
    // The grid figure: one 330 px panel per experiment with grid keys (b and c); the training
    // figure: 2 columns of 330 px.
    let widths = [960, 960, 660, 990, 660, 990, 990, 990, 990, 990, 960];
    let report = fs::read_to_string(&s.report).expect("report.md");
    for (f, w) in s.figures.iter().zip(widths) {
        let (pw, ph) = svg_size(&f.svg);
        assert_eq!((pw, ph), (f.width, f.height), "{}", f.svg.display());
        assert_eq!(pw, w, "{}", f.svg.display());
        assert!((400..2000).contains(&ph), "{} height {ph}", f.svg.display());
        let name = f.svg.file_name().expect("name").to_string_lossy();
        assert!(
            report.contains(&format!("(figures/{name})")),
            "{name} not embedded"
        );
    }
    // The posterior figure: 3 snapshots × 3 dimensions, 300 px panels.
    let post = &s.figures[9];
    assert!(post.height >= 44 + 3 * 300);
    for section in [
        "## 1. Evaluation accuracy",
        "## 2. The judge",
        "## 3. Training diagnostics",
        "## 4. Difficulty",
        "## 5. GP posterior",
        "## 6. Ablation table",
        "## 7. Backend comparison",
    ] {
        assert!(report.contains(section), "{section}");
    }
    assert!(report.contains(&s.table));
    let bench = s.bench_table.as_deref().expect("bench table");
    assert!(
        bench.contains("| K1_fwd_V32000_f32 | **0.4000** | 1.000 | 0.5600 | 1.400 |"),
        "{bench}"
    );
    // The killed run's cut line is reported with file and line.
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("b_policy_judge/seed-3/metrics.jsonl:10: last line is cut short")),
        "{:?}",
        s.warnings
    );
    assert!(report.contains("last line is cut short"));
    // Runs of different lengths are said so in the caption.
    assert!(
        report.contains("`b_policy_judge`: runs end at steps 10, 10, 8"),
        "{report}"
    );
    // Older runs without compute/rollouts are named on the rollouts figure.
    assert!(report.contains("no compute/rollouts: a_outcome_only"));
    // The grid table is under the grid figure, in section 1.
    let grid_at = report.find("| b_policy_judge | step 0 (warm start) |");
    assert!(
        grid_at.is_some_and(|i| i < report.find("## 2. The judge").unwrap_or(0)),
        "{report}"
    );
    assert!(report.contains("No `eval/acc_grid/*` in: a_outcome_only."));
    if std::env::var_os("RLANY_REPORT_OUT").is_none() {
        let _ = fs::remove_dir_all(out);
    }
    let _ = fs::remove_dir_all(benches);
}

/// The fixture's final values (see `tests/fixtures/make_runs.py`), computed independently.
fn hand_ci(xs: &[f64], t: f64) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let s = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    (m, t * s / n.sqrt())
}

const T2: f64 = 4.302_652_7; // t(0.975, 2)
const T1: f64 = 12.706_204_7; // t(0.975, 1)

fn assert_cell(c: Option<MeanCi>, expect: (f64, Option<f64>), n: usize, what: &str) {
    let c = c.unwrap_or_else(|| panic!("{what}: empty"));
    assert!((c.mean - expect.0).abs() < 1e-9, "{what}: mean {}", c.mean);
    assert_eq!(c.n, n, "{what}: n");
    match (c.half_width, expect.1) {
        (Some(h), Some(e)) => assert!((h - e).abs() < 1e-6, "{what}: half {h} vs {e}"),
        (None, None) => {}
        (h, e) => panic!("{what}: half {h:?} vs {e:?}"),
    }
}

#[test]
fn table_numbers_match_hand_computation() {
    let suite = Suite::build(collect(&[fixture()]).expect("runs")).expect("suite");
    let t = Table::build(&suite);
    let headers: Vec<&str> = t.columns.iter().map(|c| c.header).collect();
    assert_eq!(
        headers,
        [
            "acc ID",
            "acc OOD",
            "judge p⁺ (correct steps)",
            "judge p⁻ (wrong steps)",
            "judge balanced acc",
            "judge outcome acc",
            "proposals accepted",
            "proposals rejected",
            "accepted-proposal rate",
            "train success, last ¼",
            "right steps in training, last ¼",
            "train success, steps 1–5",
            "train success, whole run",
            "right steps in training, first ¼"
        ]
    );
    assert_eq!(t.columns[8].kind, ColumnKind::Rate);
    assert_eq!(t.columns[6].kind, ColumnKind::Count);
    let names: Vec<&str> = t.rows.iter().map(|r| r.experiment.as_str()).collect();
    assert_eq!(names, ["a_outcome_only", "b_policy_judge", "c_env_gp"]);
    let (a, b, c) = (&t.rows[0], &t.rows[1], &t.rows[2]);

    let ci = |xs: &[f64]| {
        let (m, h) = hand_ci(xs, T2);
        (m, Some(h))
    };
    assert_cell(a.cells[0], ci(&[0.5, 0.625, 0.75]), 3, "a acc ID");
    assert_cell(a.cells[1], ci(&[0.25, 0.375, 0.375]), 3, "a acc OOD");
    assert!(a.cells[2..6].iter().all(Option::is_none), "a has no judge");
    assert_cell(a.cells[6], (0.0, Some(0.0)), 3, "a accepted");
    // b: seed 3 was killed at step 8, so its final eval is the one of step 5.
    assert_cell(b.cells[0], ci(&[0.75, 0.875, 0.625]), 3, "b acc ID");
    assert_cell(b.cells[2], ci(&[0.9, 0.8, 0.85]), 3, "b p+");
    assert_cell(b.cells[3], ci(&[0.6, 0.7, 0.65]), 3, "b p-");
    assert!(b.cells[4].is_none(), "b has no balanced accuracy");
    // b seed 2's final outcome accuracy is null: left out, n = 2.
    let (m, h) = hand_ci(&[0.7, 0.6], T1);
    assert_cell(b.cells[5], (m, Some(h)), 2, "b outcome");
    assert_cell(b.cells[6], ci(&[3.0, 5.0, 2.0]), 3, "b accepted");
    assert_cell(b.cells[7], ci(&[1.0, 0.0, 2.0]), 3, "b rejected");
    // Accepted-proposal rate: 3/(3+1), 5/(5+0), 2/(2+2); a resolved none (undefined, not 0).
    assert_cell(b.cells[8], ci(&[0.75, 1.0, 0.5]), 3, "b accept rate");
    assert!(a.cells[8].is_none(), "a's accept rate is undefined");
    // c: one seed, no CI; its judge uses the newer eval_* keys.
    assert_cell(c.cells[0], (0.8125, None), 1, "c acc ID");
    assert_cell(c.cells[2], (0.9, None), 1, "c p+");
    assert_cell(c.cells[4], (0.825, None), 1, "c balanced");
    assert_cell(c.cells[6], (3.0, None), 1, "c accepted");
    assert_cell(c.cells[7], (2.0, None), 1, "c rejected");
    assert_cell(c.cells[8], (0.6, None), 1, "c accept rate");

    // Paired differences: b − a (row above) over seeds 1-3; c − a (suite.json) over seed 1.
    assert_eq!(b.baseline.as_deref(), Some("a_outcome_only"));
    assert_eq!(b.shared_seeds, [1, 2, 3]);
    assert_cell(b.diffs[0], ci(&[0.25, 0.25, -0.125]), 3, "b-a acc ID");
    assert_eq!(c.baseline.as_deref(), Some("a_outcome_only"));
    assert_eq!(c.shared_seeds, [1]);
    assert_cell(c.diffs[0], (0.3125, None), 1, "c-a acc ID");
    assert!(c.diffs[2].is_none(), "a has no judge to compare with");
    assert!(
        b.diffs[8].is_none() && c.diffs[8].is_none(),
        "a has no accept rate to compare with"
    );
    assert_eq!(a.baseline, None);

    // The Markdown: formatting, n=1, bold best, notes.
    let md = t.markdown();
    // One line per theme's table (success, judge, adaptation, diagnostics), in the main
    // table only (above the paired differences).
    let main = md.split("Paired difference").next().unwrap_or_default();
    let row = |name: &str| -> Vec<String> {
        main.lines()
            .filter(|l| l.starts_with(&format!("| {name} | ")))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        row("a_outcome_only"),
        // The last quarter of 10 steps (9, 10): env/acc_mean 0.5 + 0.02 · 9.5 + 0.01 · seed →
        // 0.70, 0.71, 0.72 (± t(2) · 0.01 / √3 = 0.025); env/step_acc 0.7 + 0.01 · 9.5.
        // Steps 1–5: 0.5 + 0.02 · 3 + 0.01 · seed → 0.57, 0.58, 0.59; the whole run (1–10):
        // 0.5 + 0.02 · 5.5 + 0.01 · seed → 0.62, 0.63, 0.64; right steps over the first
        // quarter (steps 1, 2): 0.7 + 0.01 · 1.5.
        [
            "| a_outcome_only | 3 | 0.625 ± 0.311 | 0.333 ± 0.179 | **0.710 ± 0.025** | 0.580 ± 0.025 | **0.630 ± 0.025** |",
            "| a_outcome_only | 3 | – | – | – | – |",
            "| a_outcome_only | 3 | 0.0 ± 0.0 | 0.0 ± 0.0 | – |",
            "| a_outcome_only | 3 | 0.795 ± 0.000 | 0.715 ± 0.000 |",
        ]
    );
    assert_eq!(
        row("b_policy_judge"),
        [
            "| b_policy_judge | 3 | 0.750 ± 0.311 | 0.417 ± 0.359 | 0.697 ± 0.038 | 0.580 ± 0.025 | 0.623 ± 0.014 |",
            "| b_policy_judge | 3 | 0.850 ± 0.124 | 0.650 ± 0.124 | – | 0.650 ± 0.635 (n=2) |",
            "| b_policy_judge | 3 | 3.3 ± 3.8 | 1.0 ± 2.5 | 0.750 ± 0.621 |",
            "| b_policy_judge | 3 | 0.788 ± 0.029 | 0.715 ± 0.000 |",
        ]
    );
    assert_eq!(
        row("c_env_gp"),
        [
            "| c_env_gp | 1 | **0.812 (n=1)** | **0.562 (n=1)** | 0.700 (n=1) | 0.570 (n=1) | 0.620 (n=1) |",
            "| c_env_gp | 1 | **0.900 (n=1)** | **0.750 (n=1)** | 0.825 (n=1) | **0.750 (n=1)** |",
            "| c_env_gp | 1 | 3.0 (n=1) | 2.0 (n=1) | 0.600 (n=1) |",
            "| c_env_gp | 1 | 0.795 (n=1) | 0.715 (n=1) |",
        ]
    );
    assert!(
        md.contains("| b_policy_judge | a_outcome_only | 1, 2, 3 | +0.125 ± 0.538 |"),
        "{md}"
    );
    assert!(
        md.contains("| c_env_gp | a_outcome_only | 1 | +0.312 (n=1) |"),
        "{md}"
    );
    assert!(
        md.contains("b_policy_judge/seed-2: `judge/outcome_acc` is null"),
        "{md}"
    );
    assert!(md.contains("comes from different keys across runs"), "{md}");
    assert!(
        md.contains("no proposal was resolved, so left out (– if no run of the row has one): a_outcome_only (3 of 3 runs)"),
        "{md}"
    );
    // The paired-difference table has a Δ column for each of the four compared quantities.
    for h in [
        "acc ID",
        "acc OOD",
        "judge balanced acc",
        "accepted-proposal rate",
    ] {
        assert!(md.contains(&format!(" Δ {h} |")), "{h}: {md}");
    }
    assert!(md.contains(
        "runs of different lengths (seed 1 → step 10, seed 2 → step 10, seed 3 → step 8)"
    ));
    // The legacy entry point renders the same.
    assert_eq!(ablation_table(&collect(&[fixture()]).expect("runs")), md);
}

#[test]
fn grid_table_and_judge_panels_of_the_fixture() {
    let suite = Suite::build(collect(&[fixture()]).expect("runs")).expect("suite");
    let g = GridTable::build(&suite).expect("b and c log eval/acc_grid/*");
    let labels: Vec<&str> = g.levels.iter().map(|l| l.label.as_str()).collect();
    assert_eq!(labels, ["0.00", "0.25", "0.50", "0.75", "1.00"]);
    assert_eq!(g.without, ["a_outcome_only"]);
    let (b, c) = (&g.rows[0], &g.rows[1]);
    assert_eq!(
        (b.experiment.as_str(), b.index, b.runs),
        ("b_policy_judge", 1, 3)
    );
    // Step 0: the same warm start in every seed, acc_id 0.375 + the level's offset.
    assert_eq!(b.start.steps, [0, 0, 0]);
    for (cell, v) in b.start.cells.iter().zip([0.5, 0.4375, 0.375, 0.3125, 0.25]) {
        assert_cell(*cell, (v, Some(0.0)), 3, "b start");
    }
    // Last eval: steps 10, 10 and 5 (seed 3 was killed at step 8); level 0.00 is acc_id +
    // 0.125 = 0.875, 1.0, 0.75; every level has the same spread as acc_id.
    assert_eq!(b.last.steps, [10, 10, 5]);
    let (_, h) = hand_ci(&[0.875, 1.0, 0.75], T2);
    for (cell, v) in b
        .last
        .cells
        .iter()
        .zip([0.875, 0.8125, 0.75, 0.6875, 0.625])
    {
        assert_cell(*cell, (v, Some(h)), 3, "b last");
    }
    assert_eq!(c.last.steps, [10]);
    assert_cell(c.last.cells[4], (0.6875, None), 1, "c last at 1.00");
    let md = g.markdown();
    assert!(
        md.contains("| b_policy_judge | last eval (steps 10, 10, 5) | 0.875 ± 0.311 | 0.812 ± 0.311 | 0.750 ± 0.311 | 0.688 ± 0.311 | 0.625 ± 0.311 |"),
        "{md}"
    );
    assert!(
        md.contains("| c_env_gp | last eval (step 10) | 0.938 (n=1) | 0.875 (n=1) | 0.812 (n=1) | 0.750 (n=1) | 0.688 (n=1) |"),
        "{md}"
    );

    // The judge figure: pool p⁺, p⁻, balanced; training-side balanced; outcome.
    let plans = crate::figures::plan(&suite);
    let judge = judge_plan(&plans);
    let titles = panel_titles(judge);
    assert_eq!(
        titles,
        [
            "p⁺: accuracy on correct steps",
            "p⁻: accuracy on wrong steps",
            "balanced accuracy (p⁺+p⁻)/2",
            "balanced acc. on the update's steps",
            "balanced acc. on the policy's steps",
            "outcome accuracy"
        ]
    );
    let train = &judge.figure.panels[3];
    assert!(train.message.is_none() && !train.layers.is_empty());
    assert!(
        train
            .note
            .as_deref()
            .is_some_and(|n| n.contains("judge/train_bal_acc")),
        "{:?}",
        train.note
    );
    // Only c logs it: one line, steps 1-10.
    let lines: Vec<&Vec<(f64, f64)>> = train
        .layers
        .iter()
        .filter_map(|l| match l {
            crate::plot::Layer::Line { points, .. } => Some(points),
            _ => None,
        })
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].len(), 10);
    assert_eq!(lines[0][9], (10.0, 0.75));
}

fn write_metrics(root: &Path, exp: &str, seed: u64, text: &str) -> PathBuf {
    let d = root.join(exp).join(format!("seed-{seed}"));
    fs::create_dir_all(&d).expect("dir");
    fs::write(d.join("metrics.jsonl"), text).expect("write");
    d
}

#[test]
fn malformed_middle_line_fails_naming_file_and_line() {
    let root = temp_dir("malformed-report");
    write_metrics(
        &root,
        "x",
        1,
        "{\"step\":0}\n{\"step\":1,\"policy/kl\":0.1}\n",
    );
    write_metrics(
        &root,
        "y",
        1,
        "{\"step\":0}\n{\"step\":1 \"bad\"}\n{\"step\":2}\n",
    );
    let e = write_report(
        std::slice::from_ref(&root),
        &ReportOptions::new(root.join("out")),
    )
    .expect_err("must fail");
    let msg = e.to_string();
    assert!(msg.contains("y/seed-1/metrics.jsonl:2:"), "{msg}");
    let _ = fs::remove_dir_all(root);
}

/// The judge on the policy's own steps and by kind: a panel for the policy's steps, and for
/// each kind with a balanced accuracy, one on the pool and one on the policy's steps; the
/// table's first- and last-quarter columns read `judge/steps_bal_acc`.
#[test]
fn judge_panels_and_columns_by_kind_of_step() {
    let root = temp_dir("kinds");
    // Steps 1–8: on the policy's steps 0.5 → 0.9 (first quarter 0.5, 0.55; last 0.85, 0.9).
    let text: String = (0..=8)
        .map(|s| {
            let v = 0.45 + 0.05 * s as f64;
            format!(
                "{{\"step\":{s},\"env/acc_mean\":0.5,\"judge/steps_bal_acc\":{v},\"judge/steps_bal_acc/borderline\":{v},\"judge/eval_bal_acc/borderline\":0.6}}\n"
            )
        })
        .collect();
    write_metrics(&root, "k", 1, &text);
    let suite = Suite::build(collect(std::slice::from_ref(&root)).expect("runs")).expect("suite");
    let plans = crate::figures::plan(&suite);
    let judge = judge_plan(&plans);
    let titles = panel_titles(judge);
    assert_eq!(
        &titles[4..],
        [
            "balanced acc. on the policy's steps",
            "outcome accuracy",
            "balanced acc., pool, borderline",
            "balanced acc., policy's steps, borderline"
        ]
    );
    for i in [4, 6, 7] {
        assert!(judge.figure.panels[i].message.is_none(), "{}", titles[i]);
    }
    let out = out_dir("kinds-out");
    let s = write_report(std::slice::from_ref(&root), &ReportOptions::new(&out)).expect("report");
    // Steps 1–2 and 7–8 of 8: (0.5 + 0.55)/2 and (0.8 + 0.85)/2.
    assert!(
        s.table.contains("0.525") && s.table.contains("0.825"),
        "{}",
        s.table
    );
}

#[test]
fn runs_without_eval_lines_single_seeds_and_missing_files_still_report() {
    let root = temp_dir("no-eval");
    // Two experiments, one seed each, no eval keys, no meta/adaptation/posterior, nulls, and a
    // cut last line.
    let lines = |k: f64| {
        (0..6)
            .map(|s| {
                format!(
                    "{{\"step\":{s},\"policy/kl\":{},\"reward/step_mean\":{}}}\n",
                    if s == 3 {
                        "null".to_string()
                    } else {
                        format!("{}", 0.01 * s as f64)
                    },
                    k * s as f64
                )
            })
            .collect::<String>()
    };
    write_metrics(&root, "p", 1, &lines(0.1));
    write_metrics(&root, "q", 2, &(lines(0.2) + "{\"step\":6,\"pol"));
    let out = out_dir("no-eval-out");
    let s = write_report(std::slice::from_ref(&root), &ReportOptions::new(&out)).expect("report");
    assert_eq!(s.experiments, 2);
    for f in &s.figures {
        assert_eq!(svg_size(&f.svg), (f.width, f.height));
    }
    let report = fs::read_to_string(&s.report).expect("report.md");
    assert!(report.contains("no eval lines: p, q"), "{report}");
    assert!(report.contains("No run has `posterior.jsonl`"));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("q/seed-2/metrics.jsonl:7: last line is cut short"))
    );
    assert!(s.warnings.iter().any(|w| w.contains("meta.json: missing")));
    // No column is logged by any run: the table has the two rows and no value column.
    assert!(s.table.contains("| p | 1 |\n| q | 1 |"), "{}", s.table);
    // Panels say why they are empty.
    let suite = Suite::build(collect(std::slice::from_ref(&root)).expect("runs")).expect("suite");
    let plans = crate::figures::plan(&suite);
    let eval = &plans[0].figure.panels[0];
    assert_eq!(eval.message.as_deref(), Some("no eval lines in any run"));
    let judge = &plans[2].figure.panels[0];
    assert!(
        judge
            .message
            .as_deref()
            .is_some_and(|m| m.contains("no experiment logs"))
    );
    let diff = plans
        .iter()
        .find(|p| p.stem == "difficulty")
        .expect("difficulty placeholder");
    assert!(diff.figure.panels[0].message.is_some());
    if std::env::var_os("RLANY_REPORT_OUT").is_none() {
        let _ = fs::remove_dir_all(out);
    }
    let _ = fs::remove_dir_all(root);
}

#[test]
fn bench_only_report_and_no_runs() {
    let d = temp_dir("bench-only");
    let b = bench_file(&d, "wgpu.json", Some("wgpu"), 1.0);
    let mut opts = ReportOptions::new(d.join("out"));
    opts.bench_json = vec![b];
    let s = write_report(&[], &opts).expect("bench report");
    assert_eq!(s.figures.len(), 1);
    assert_eq!(s.experiments, 0);
    assert_eq!(svg_size(&s.figures[0].svg).0, 960);
    let e = write_report(&[d.join("nothing")], &ReportOptions::new(d.join("out2")));
    assert!(matches!(e, Err(ReportError::NoRuns(_))));
    let _ = fs::remove_dir_all(d);
}

fn sweep_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sweep")
}

/// Copies the folder tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("dir");
    for e in fs::read_dir(from).expect("read dir").filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            copy_tree(&p, &to.join(e.file_name()));
        } else {
            fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

/// Every `(x, y)` of the layers of `panel` that match `pick`.
fn layer_points(
    panel: &crate::plot::Panel,
    pick: impl Fn(&crate::plot::Layer) -> Option<Vec<(f64, f64)>>,
) -> Vec<(f64, f64)> {
    panel.layers.iter().filter_map(pick).flatten().collect()
}

fn close(a: &[(f64, f64)], b: &[(f64, f64)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(p, q)| (p.0 - q.0).abs() < 1e-9 && (p.1 - q.1).abs() < 1e-9)
}

#[test]
fn sweep_fixture_figure_table_and_placement() {
    use crate::plot::{Layer, Shape};
    let out = out_dir("sweep-report");
    let s = write_report(&[sweep_fixture()], &ReportOptions::new(&out)).expect("report");
    assert_eq!((s.runs, s.experiments), (18, 6));
    assert!(
        s.warnings.iter().all(|w| !w.contains("sweep")),
        "{:?}",
        s.warnings
    );
    let fig = s
        .figures
        .iter()
        .find(|f| f.svg.file_stem().is_some_and(|n| n == "sweep"))
        .expect("a sweep figure");
    assert_eq!(svg_size(&fig.svg), (960, fig.height));
    let svg = fs::read_to_string(&fig.svg).expect("svg");
    assert!(svg.contains("<svg") && svg.contains("judge.p_pos = 0.9, judge.p_neg = 0.5"));
    let report = fs::read_to_string(&s.report).expect("report.md");
    // In section 1, after the other eval figures, before the judge.
    let at = report.find("(figures/sweep.svg)").expect("embedded");
    assert!(
        at > report
            .find("## 1. Evaluation accuracy")
            .unwrap_or(usize::MAX)
    );
    assert!(at < report.find("## 2. The judge").unwrap_or(0));
    assert!(
        report.contains("*Sweep of `judge.p_pos = judge.p_neg` (found as the numeric setting"),
        "{report}"
    );
    assert!(report.contains(
        "Rows whose grouped settings differ are drawn at their mean, marked (◆) and labelled with their values (for p⁺ and p⁻ the mean is the judge's balanced accuracy)."
    ));
    assert!(report.contains("The dashed line at 0 is the baseline, `outcome_only`."));
    // Hand-computed: baseline acc_id 0.5, 0.5625, 0.625 and acc_ood 0.25, 0.3125, 0.25
    // (seeds 1-3). oracle_p06: Δ ID 0, 0.0625, −0.0625 → mean 0, s = 0.0625, half-width
    // 4.302653 · 0.0625 / √3 = 0.155; Δ OOD 0.0625, 0, 0.0625 → 0.0417, s = 0.036084 → 0.090.
    // oracle_off (x = (0.9 + 0.5) / 2 = 0.7): Δ ID 0.0625, 0.125, 0.0625 → 0.0833 ± 0.090.
    // oracle_p10: Δ OOD 0.1875, 0.25, 0.3125 → 0.25 ± 0.155.
    // oracle_p10_lambda2: Δ ID 0.1875, 0.125, 0.1875 → 0.1667; Δ OOD 0.125, 0.125, 0.0625 → 0.1042.
    let table = "| experiment | baseline | `judge.p_pos = judge.p_neg` | what else differs | seeds paired | Δ acc ID | Δ acc OOD |\n\
|---|---|---:|---|---|---:|---:|\n\
| oracle_p06 | outcome_only | 0.6 | – | 1, 2, 3 | +0.000 ± 0.155 | +0.042 ± 0.090 |\n\
| oracle_off | outcome_only | 0.7 | judge.p_pos = 0.9, judge.p_neg = 0.5 | 1, 2, 3 | +0.083 ± 0.090 | +0.042 ± 0.090 |\n\
| oracle_p08 | outcome_only | 0.8 | – | 1, 2, 3 | +0.146 ± 0.090 | +0.146 ± 0.090 |\n\
| oracle_p10 | outcome_only | 1 | – | 1, 2, 3 | +0.271 ± 0.090 | +0.250 ± 0.155 |\n\
| oracle_p10_lambda2 | outcome_only | 1 | reward.lambda = 2 | 1, 2, 3 | +0.167 ± 0.090 | +0.104 ± 0.090 |\n";
    assert!(report.contains(table), "{report}");
    // The same numbers as the ablation table's paired differences.
    assert!(
        s.table
            .contains("| oracle_off | outcome_only | 1, 2, 3 | +0.083 ± 0.090 | +0.042 ± 0.090 |")
    );

    // The drawing: the off-diagonal row at x = 0.7 (a diamond), λ = 2 apart (a square), the
    // others joined in x order, bars = hand-computed 95% CIs.
    let suite = Suite::build(collect(&[sweep_fixture()]).expect("runs")).expect("suite");
    let plans = crate::figures::plan(&suite);
    let p = plans.iter().find(|p| p.stem == "sweep").expect("sweep");
    assert_eq!(p.figure.panels[0].x_label, "judge.p_pos = judge.p_neg");
    let id = &p.figure.panels[0];
    let m = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let line = layer_points(id, |l| match l {
        Layer::Line { points, .. } => Some(points.clone()),
        _ => None,
    });
    assert!(
        close(
            &line,
            &[
                (0.6, 0.0),
                (0.8, m(&[0.125, 0.1875, 0.125])),
                (1.0, m(&[0.25, 0.25, 0.3125]))
            ]
        ),
        "{line:?}"
    );
    let shape = |s: Shape| {
        layer_points(id, move |l| match l {
            Layer::Markers { shape, points, .. } if *shape == s => Some(points.clone()),
            _ => None,
        })
    };
    assert!(close(
        &shape(Shape::Diamond),
        &[(0.7, m(&[0.0625, 0.125, 0.0625]))]
    ));
    // λ = 2 is at p = 1 like oracle_p10: drawn 1.5% of the x range (0.6 − 0.032 … 1 + 0.032)
    // to its right.
    let dodge = 0.015 * 0.4 * 1.16;
    assert!(close(
        &shape(Shape::Square),
        &[(1.0 + dodge, m(&[0.1875, 0.125, 0.1875]))]
    ));
    let bars: Vec<(f64, f64, f64)> = id
        .layers
        .iter()
        .filter_map(|l| match l {
            Layer::ErrorBars { bars, .. } => Some(bars.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let (bm, bh) = hand_ci(&[0.0625, 0.125, 0.0625], T2);
    assert!(
        bars.iter().any(|&(x, lo, hi)| x == 0.7
            && (lo - (bm - bh)).abs() < 1e-9
            && (hi - (bm + bh)).abs() < 1e-9),
        "{bars:?}"
    );
    assert_eq!(bars.len(), 5);
    let labels: Vec<String> = id
        .layers
        .iter()
        .filter_map(|l| match l {
            Layer::Labels { labels, .. } => Some(labels.iter().map(|l| l.text.clone())),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        labels,
        ["judge.p_pos = 0.9, judge.p_neg = 0.5", "reward.lambda = 2"]
    );
    if std::env::var_os("RLANY_REPORT_OUT").is_none() {
        let _ = fs::remove_dir_all(out);
    }
}

#[test]
fn sweep_named_in_suite_json_and_a_bad_name_warns() {
    let root = temp_dir("sweep-override");
    copy_tree(&sweep_fixture(), &root);
    let suite_json = root.join("suite.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&suite_json).expect("read")).expect("json");
    v["sweep"] = "reward.lambda".into();
    fs::write(&suite_json, v.to_string()).expect("write");
    let s = write_report(
        std::slice::from_ref(&root),
        &ReportOptions::new(root.join("out")),
    )
    .expect("report");
    let report = fs::read_to_string(&s.report).expect("report.md");
    // λ is the axis now; the rows whose judge differs from the most common one (p = 1) are
    // set apart and labelled.
    assert!(report.contains("*Sweep of `reward.lambda` (named by suite.json's `\"sweep\"`)"));
    assert!(
        report.contains("| oracle_p10_lambda2 | outcome_only | 2 | – | 1, 2, 3 | +0.167 ± 0.090 |"),
        "{report}"
    );
    assert!(report.contains(
        "| oracle_off | outcome_only | 1 | judge.p_pos = 0.9; judge.p_neg = 0.5 | 1, 2, 3 |"
    ));

    // A setting that does not vary: no sweep figure, a warning saying what varies.
    v["sweep"] = "budget.steps".into();
    fs::write(&suite_json, v.to_string()).expect("write");
    let s = write_report(
        std::slice::from_ref(&root),
        &ReportOptions::new(root.join("out2")),
    )
    .expect("report");
    assert!(s.figures.iter().all(|f| !f.svg.ends_with("sweep.svg")));
    let report = fs::read_to_string(&s.report).expect("report.md");
    assert!(
        report.contains("- no sweep figure: suite.json's \"sweep\": \"budget.steps\" is not a numeric setting whose value differs among the rows that have a baseline (those that do: `judge.p_pos`, `judge.p_neg`, `reward.lambda`)"),
        "{report}"
    );
    let _ = fs::remove_dir_all(root);
}

/// The judge figure among a report's planned figures.
fn judge_plan(plans: &[crate::figures::Planned]) -> &crate::figures::Planned {
    plans.iter().find(|p| p.stem == "judge").expect("judge")
}

/// A figure's panel titles, in order.
fn panel_titles(plan: &crate::figures::Planned) -> Vec<&str> {
    plan.figure
        .panels
        .iter()
        .map(|p| p.title.as_str())
        .collect()
}

/// `--compare` pairs a row with another besides its baseline, a suite.json row's `compare`
/// does the same, and a comparison naming no row (or the row's baseline) is left out.
#[test]
fn further_comparisons_from_options_and_suite_json() {
    let out = temp_dir("compare-report");
    let mut opts = ReportOptions::new(&out);
    opts.compare = vec![
        ("c_env_gp".into(), "b_policy_judge".into()),
        ("c_env_gp".into(), "a_outcome_only".into()),
        ("b_policy_judge".into(), "nobody".into()),
    ];
    // The fixture's suite.json makes a c's baseline; the option adds c − b on seed 1: final
    // eval/acc_id 0.8125 − 0.75.
    let s = write_report(&[fixture()], &opts).expect("report");
    let lines = |t: &str, prefix: &str| t.lines().filter(|l| l.starts_with(prefix)).count();
    assert!(
        s.table
            .contains("| c_env_gp | b_policy_judge | 1 | +0.062 (n=1) |"),
        "{}",
        s.table
    );
    // Once in each theme's table of paired differences (success, judge, adaptation,
    // diagnostics): the comparison already there is not repeated.
    assert_eq!(lines(&s.table, "| c_env_gp | a_outcome_only | 1 |"), 4);
    assert!(s.table.contains("| experiment | against | shared seeds |"));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("comparison b_policy_judge = nobody left out")),
        "{:?}",
        s.warnings
    );
    // The same comparison from a suite.json beside a copy of the runs.
    let root = temp_dir("compare-suite");
    for e in ["a_outcome_only", "b_policy_judge", "c_env_gp"] {
        copy_dir(&fixture().join(e), &root.join(e));
    }
    fs::write(
        root.join("suite.json"),
        r#"{"rows": [{"experiment": "a_outcome_only", "baseline": null},
                     {"experiment": "b_policy_judge"},
                     {"experiment": "c_env_gp", "baseline": "a_outcome_only",
                      "compare": ["b_policy_judge"]}]}"#,
    )
    .expect("suite.json");
    let s = write_report(
        std::slice::from_ref(&root),
        &ReportOptions::new(root.join("out")),
    )
    .expect("report");
    assert!(
        s.table
            .contains("| c_env_gp | b_policy_judge | 1 | +0.062 (n=1) |"),
        "{}",
        s.table
    );
    let _ = fs::remove_dir_all(out);
    let _ = fs::remove_dir_all(root);
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("dir");
    for e in fs::read_dir(from).expect("read dir").filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

/// `seeds` keeps only those seeds' runs; none left is an error naming the seeds.
#[test]
fn a_report_of_some_seeds() {
    let out = temp_dir("seeds-report");
    let mut opts = ReportOptions::new(&out);
    opts.seeds = Some(vec![2, 3]);
    let s = write_report(&[fixture()], &opts).expect("report");
    // a and b have seeds 1–3, c only seed 1.
    assert_eq!((s.runs, s.experiments), (4, 2));
    assert!(
        s.table
            .contains("| b_policy_judge | a_outcome_only | 2, 3 |"),
        "{}",
        s.table
    );
    opts.seeds = Some(vec![9]);
    let e = write_report(&[fixture()], &opts).expect_err("no run of seed 9");
    assert!(e.to_string().contains("[9]"), "{e}");
    let _ = fs::remove_dir_all(out);
}
