//! # rlany-reports
//!
//! Run directories → a report: figures (SVG) and the ablation table, in
//! one `report.md`. Reads only what runs wrote (`metrics.jsonl`, `meta.json`,
//! `adaptation.jsonl`, `posterior.jsonl`, `resolved.ron`, optional `suite.json`) and `rlany bench --json` files,
//! never Burn: reports can be made on any machine from copied run directories.
//!
//! [`write_report`] is the entry point (used by `rlany report RUN_OR_SUITE_DIR… --out DIR`).
//! The pieces are public too: [`collect`] reads runs, [`Suite`] groups and orders them,
//! [`Table`] is the ablation table, [`GridTable`] the accuracy per level of the eval's
//! difficulty grid, [`stats`] has the Student-t machinery, [`svg`] writes the figures as
//! compact SVG.
//!
//! Figures, in report order: evaluation accuracy against steps and against rollouts, accuracy
//! over the eval's difficulty grid, the **sweep** (only when the rows sweep one numeric setting
//! of their `resolved.ron`, e.g. the synthetic judge's accuracy: each row's paired Δ of
//! in-domain and OOD accuracy to its baseline against that setting, with 95% CIs and a table
//! of the numbers; detection and drawing rules in [`sweep`]), the judge, training diagnostics,
//! difficulty per experiment and the GP posterior per run.
//!
//! Modules: [`runs`] (reading, tolerant of a killed run's cut last line), [`suite`] (row order
//! and baselines), [`stats`], [`table`], [`grid`], [`sweep`] (the swept setting: `resolved.ron`
//! flattened, detection, the sweep figure), `figures` (what each figure shows), `plot`
//! (drawing with plotters), `glyphs` (text measured and rasterised with ab_glyph and the bundled
//! DejaVu Sans, no system font), [`mod@bench`] (backend comparison).

pub mod bench;
mod error;
mod figures;
mod glyphs;
pub mod grid;
mod kinds;
pub mod learnability;
mod plot;
mod regime;
pub mod runs;
pub mod stats;
pub mod suite;
pub mod svg;
pub mod sweep;
pub mod table;
#[cfg(test)]
mod tests;

pub use error::ReportError;
pub use grid::GridTable;
pub use plot::FigureFile;
pub use runs::{Run, collect};
pub use stats::{MeanCi, mean_ci95, t_quantile};
pub use suite::Suite;
pub use table::Table;

use error::io;
use figures::{Planned, Section};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// What to write and from what besides the run directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOptions {
    /// Output folder: `report.md` and `figures/` are written there (created if needed; files of
    /// the same names are replaced).
    pub out: PathBuf,
    /// `rlany bench --json` files (or the same shape from other backends) to compare.
    pub bench_json: Vec<PathBuf>,
    /// Report title (default "RLAnything report").
    pub title: Option<String>,
    /// Further `(row, against)` comparisons for the paired table, beyond each row's baseline
    /// and what `suite.json` names ([`Suite::add_comparisons`]).
    pub compare: Vec<(String, String)>,
    /// `(suite, suite)` pairs (the folders holding the experiments) whose arms' gains are
    /// compared in an interaction table (`regime`).
    pub interactions: Vec<(String, String)>,
    /// Report only the runs of these seeds (e.g. leaving out the seed that chose a setting);
    /// `None`: every run.
    pub seeds: Option<Vec<u64>>,
}

impl ReportOptions {
    /// Options writing to `out`, with no bench file.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        Self {
            out: out.into(),
            bench_json: Vec::new(),
            title: None,
            compare: Vec::new(),
            interactions: Vec::new(),
            seeds: None,
        }
    }
}

/// What [`write_report`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// `OUT/report.md`.
    pub report: PathBuf,
    /// Every figure written, in report order.
    pub figures: Vec<FigureFile>,
    /// The ablation table section in Markdown (table, paired differences, notes); empty
    /// without runs.
    pub table: String,
    /// The backend comparison table, when bench files were given.
    pub bench_table: Option<String>,
    /// Everything odd but not fatal (cut last lines, nulls, missing files, suite.json issues).
    pub warnings: Vec<String>,
    /// Number of runs read.
    pub runs: usize,
    /// Number of experiments (table rows).
    pub experiments: usize,
}

/// Reads every run under `paths` (and the bench files of `opts`), and writes `report.md` with
/// its figures to `opts.out`. With no path but bench files, writes the backend comparison alone.
pub fn write_report(paths: &[PathBuf], opts: &ReportOptions) -> Result<ReportSummary, ReportError> {
    let fig_dir = opts.out.join("figures");
    fs::create_dir_all(&fig_dir).map_err(io(&fig_dir))?;
    let (suite, gated) = if paths.is_empty() && !opts.bench_json.is_empty() {
        (Suite::from_runs(Vec::new(), &[]), Vec::new())
    } else {
        let keep = |r: &Run| match &opts.seeds {
            Some(seeds) => r.seed.is_some_and(|s| seeds.contains(&s)),
            None => true,
        };
        let runs: Vec<Run> = collect(paths)?.into_iter().filter(keep).collect();
        if runs.is_empty() {
            return Err(ReportError::NoRuns(format!(
                "{} (none of seeds {:?})",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                opts.seeds.as_deref().unwrap_or_default()
            )));
        }
        let mut suite = Suite::build(runs)?;
        suite.add_comparisons(&opts.compare);
        let gated = runs::collect_gated(paths)?
            .into_iter()
            .filter(keep)
            .collect();
        (suite, gated)
    };
    let mut warnings = suite.warnings.clone();
    let table = if suite.rows.is_empty() {
        None
    } else {
        Some(Table::build(&suite))
    };
    let mut table_md = table.as_ref().map(Table::markdown).unwrap_or_default();
    if table.is_some() {
        let (inter, inter_warnings) = regime::interactions(&suite, &opts.interactions);
        warnings.extend(inter_warnings);
        if !inter.is_empty() {
            table_md += "\n";
            table_md += &inter;
        }
        let by_kind = kinds::markdown(&suite, &gated);
        if !by_kind.is_empty() {
            table_md += "\n### By kind of step\n\n";
            table_md += &by_kind;
        }
    }

    let mut stems = BTreeSet::new();
    let mut written: Vec<(Planned, FigureFile)> = Vec::new();
    if !suite.rows.is_empty() {
        let (plans, sweep_warnings) = figures::plan_all(&suite);
        warnings.extend(sweep_warnings);
        for p in plans {
            let stem = unique_stem(&mut stems, &p.stem);
            let f = plot::save(&p.figure, &fig_dir, &stem)?;
            written.push((p, f));
        }
    }
    let bench = if opts.bench_json.is_empty() {
        None
    } else {
        let files = bench::read_benches(&opts.bench_json)?;
        let cmp = bench::BenchComparison::build(&files);
        warnings.extend(
            cmp.failures
                .iter()
                .map(|f| format!("bench: failed row {f}")),
        );
        let stem = unique_stem(&mut stems, "bench");
        let fig = plot::save(&bench::BenchChart { cmp: &cmp }, &fig_dir, &stem)?;
        Some((files, cmp, fig))
    };

    let md = report_markdown(&ReportParts {
        opts,
        paths,
        suite: &suite,
        table: &table_md,
        figures: &written,
        bench: bench
            .as_ref()
            .map(|(files, cmp, fig)| (files.as_slice(), cmp, fig)),
        warnings: &warnings,
    });
    let report = opts.out.join("report.md");
    fs::write(&report, md).map_err(io(&report))?;

    let mut figures: Vec<FigureFile> = written.into_iter().map(|(_, f)| f).collect();
    let bench_table = bench.map(|(_, cmp, fig)| {
        figures.push(fig);
        cmp.markdown()
    });
    Ok(ReportSummary {
        report,
        figures,
        table: table_md,
        bench_table,
        warnings,
        runs: suite.runs().count(),
        experiments: suite.rows.len(),
    })
}

/// The ablation table of `runs` in Markdown (table, paired differences, notes), honouring a
/// `suite.json` beside the runs. A `suite.json` that cannot be read is named under the table
/// and the default order is used. [`write_report`] writes the same text into `report.md`.
pub fn ablation_table(runs: &[Run]) -> String {
    match Suite::build(runs.to_vec()) {
        Ok(s) => Table::build(&s).markdown(),
        Err(e) => {
            let s = Suite::from_runs(runs.to_vec(), &[]);
            format!("{}- suite.json ignored: {e}\n", Table::build(&s).markdown())
        }
    }
}

fn unique_stem(used: &mut BTreeSet<String>, stem: &str) -> String {
    let mut s = stem.to_string();
    let mut i = 2;
    while used.contains(&s) {
        s = format!("{stem}-{i}");
        i += 1;
    }
    used.insert(s.clone());
    s
}

/// Everything the Markdown is made of.
struct ReportParts<'a> {
    opts: &'a ReportOptions,
    paths: &'a [PathBuf],
    suite: &'a Suite,
    table: &'a str,
    figures: &'a [(Planned, FigureFile)],
    bench: Option<(
        &'a [bench::BenchFile],
        &'a bench::BenchComparison,
        &'a FigureFile,
    )>,
    warnings: &'a [String],
}

fn report_markdown(p: &ReportParts<'_>) -> String {
    let mut md = format!(
        "# {}\n\n",
        p.opts.title.as_deref().unwrap_or("RLAnything report")
    );
    if !p.suite.rows.is_empty() {
        md += &overview(p.suite, p.paths);
    }
    if !p.warnings.is_empty() {
        md += "## Warnings\n\n";
        for w in p.warnings {
            md += &format!("- {w}\n");
        }
        md += "\n";
    }
    if !p.suite.rows.is_empty() {
        md += &figure_sections(p);
        md += "## 6. Ablation table\n\n";
        md += p.table;
        md += "\n";
    }
    if let Some((files, cmp, fig)) = p.bench {
        md += "## 7. Backend comparison\n\n";
        md += &image(fig, &p.opts.out);
        let names: Vec<String> = files
            .iter()
            .map(|f| format!("`{}` = {}", f.label, f.path.display()))
            .collect();
        md += &format!(
            "*Median time per call of each workload (kernels: one call; R_: one rollout; T_: one PPO step), one bar per file and variant (log scale; a missing bar: absent or failed). Files: {}.*\n\n",
            names.join(", ")
        );
        md += &cmp.markdown();
        md += "\nBold: fastest of the row.\n";
        if let Some(sp) = cmp.speedups_markdown("PyTorch") {
            md += "\nSpeed-up against PyTorch (its time / ours: above 1 is faster than PyTorch), measured in the same run:\n\n";
            md += &sp;
        }
    }
    md
}

fn overview(suite: &Suite, paths: &[PathBuf]) -> String {
    let sources: Vec<String> = paths.iter().map(|p| format!("`{}`", p.display())).collect();
    let mut md = format!(
        "{} runs of {} experiments from {}. Rows and colours in this order (suite.json if present, else the experiment files' names, else the experiment names); each row's paired difference is to its baseline.\n\n| experiment | seeds | last step per seed | baseline | backend |\n|---|---|---|---|---|\n",
        suite.runs().count(),
        suite.rows.len(),
        sources.join(", ")
    );
    for row in &suite.rows {
        let seeds: Vec<String> = row
            .runs
            .iter()
            .map(|r| r.seed.map_or("?".into(), |s| s.to_string()))
            .collect();
        let ends: Vec<String> = row
            .runs
            .iter()
            .map(|r| r.last_step().map_or("–".into(), |s| s.to_string()))
            .collect();
        let backends: BTreeSet<&str> = row
            .runs
            .iter()
            .filter_map(|r| r.meta.backend.as_deref())
            .collect();
        md += &format!(
            "| {} | {} | {} | {} | {} |\n",
            row.experiment,
            seeds.join(", "),
            ends.join(", "),
            row.baseline.as_deref().unwrap_or("–"),
            if backends.is_empty() {
                "–".to_string()
            } else {
                backends.into_iter().collect::<Vec<_>>().join(", ")
            }
        );
    }
    md + "\n"
}

fn figure_sections(p: &ReportParts<'_>) -> String {
    let heads = [
        (Section::Eval, "## 1. Evaluation accuracy"),
        (Section::Judge, "## 2. The judge"),
        (Section::Diagnostics, "## 3. Training diagnostics"),
        (Section::Difficulty, "## 4. Difficulty"),
        (Section::Posterior, "## 5. GP posterior"),
    ];
    let mut md = String::new();
    for (section, head) in heads {
        md += head;
        md += "\n\n";
        let mut any = false;
        for (planned, file) in p.figures.iter().filter(|(pl, _)| pl.section == section) {
            md += &image(file, &p.opts.out);
            md += &format!("*{}*\n\n", planned.caption);
            if let Some(after) = &planned.after {
                md += after;
                md += "\n";
            }
            any = true;
        }
        if !any && section == Section::Posterior {
            md += "No run has `posterior.jsonl` (only runs with the Gp proposer write one).\n\n";
        }
    }
    md
}

/// The Markdown of an embedded figure, its path relative to `out`.
fn image(f: &FigureFile, out: &Path) -> String {
    let rel = f
        .svg
        .strip_prefix(out)
        .unwrap_or(&f.svg)
        .to_string_lossy()
        .replace('\\', "/");
    format!("![{}]({rel})\n\n", f.title)
}
