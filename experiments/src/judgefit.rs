//! `rlany judge-fit`: the judge's learnability apart from RL (see
//! `rlany_framework::trainer::judge_learnability`). One JSON file per cell (seed × labels ×
//! noise) in `OUT/cells/`; cells already there are not run again, so an interrupted study
//! resumes; then `OUT/report.md` and its figures.

use crate::plugins::Experiment;
use crate::{OnBackend, UsageError, WARM_CACHE, on_backend, overrides, parse_backend, with_parts};
use anyhow::{Context, Result};
use clap::Args;
use rlany_framework::trainer::{CellResult, LearnCell, judge_learnability};
use rlany_framework::{TrainError, TrainOptions};
use rlany_models::Transformer;
use std::path::{Path, PathBuf};

/// `rlany judge-fit`'s arguments.
#[derive(Args, Debug)]
pub struct JudgeFitArgs {
    /// The experiment file whose judge is studied (it must have a model judge).
    file: PathBuf,
    /// Label counts (`judge.warm_start.labels`), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    labels: Vec<usize>,
    /// Label noises (`judge.warm_start.label_noise`), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    noise: Vec<f64>,
    /// Seeds, comma-separated (each warm-starts its own policy, as a run of that seed does).
    #[arg(long, value_delimiter = ',', required = true)]
    seeds: Vec<u64>,
    /// Where the cells and the report go.
    #[arg(long)]
    out: PathBuf,
    /// Override a field: PATH=VALUE (e.g. judge.warm_start.steps=500); repeatable.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    sets: Vec<String>,
    /// Override the experiment's backend: ndarray, flex, wgpu, cuda or cuda:N (flex, wgpu and cuda
    /// as compiled in: `--features flex`, `wgpu`, `cuda`).
    #[arg(long)]
    backend: Option<String>,
    /// Where the policies' warm starts are shared (RUNS_DIR/.warm-cache, as `rlany run`).
    #[arg(long, default_value = "runs")]
    runs_dir: PathBuf,
    /// Seeds run at once, one thread each (results do not depend on it).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// No progress bars: plain lines instead, one per measurement of each fit.
    #[arg(long)]
    no_progress: bool,
}

/// A cell's file name: `seed-<s>-labels-<n>-noise-<η>.json`.
fn cell_file(out: &Path, seed: u64, c: &LearnCell) -> PathBuf {
    out.join("cells").join(format!(
        "seed-{seed}-labels-{}-noise-{:.3}.json",
        c.labels, c.noise
    ))
}

/// Runs the study, then writes its report.
pub fn run(args: &JudgeFitArgs) -> Result<()> {
    let mut exp = overrides::apply(&Experiment::load(&args.file)?, &args.sets)
        .map_err(|e| UsageError(e.to_string()))?;
    if let Some(b) = &args.backend {
        exp.backend = parse_backend(b)?;
    }
    if exp.judge.model().is_none() {
        return Err(UsageError(format!(
            "{}: the experiment has no model judge (judge: Frozen(...) or Learned(...)) to study",
            args.file.display()
        ))
        .into());
    }
    for &n in &args.labels {
        if n == 0 {
            return Err(UsageError("--labels: every count must be at least 1".into()).into());
        }
    }
    for &η in &args.noise {
        if !(0.0..=1.0).contains(&η) {
            return Err(UsageError(format!("--noise: {η} is not in [0, 1]")).into());
        }
    }
    std::fs::create_dir_all(args.out.join("cells"))
        .with_context(|| format!("creating {}", args.out.display()))?;
    let cells: Vec<LearnCell> = args
        .labels
        .iter()
        .flat_map(|&labels| {
            args.noise
                .iter()
                .map(move |&noise| LearnCell { labels, noise })
        })
        .collect();
    let seeds = args.seeds.clone();
    let jobs = args.jobs.clamp(1, seeds.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(&seed) = seeds.get(i) else {
                            return Ok(());
                        };
                        study_seed(&exp, seed, &cells, args)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a seed's thread panicked")))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let written = rlany_reports::learnability::write(&args.out)?;
    println!("{}", written.display());
    Ok(())
}

/// Every cell of one seed not measured yet.
fn study_seed(exp: &Experiment, seed: u64, cells: &[LearnCell], args: &JudgeFitArgs) -> Result<()> {
    struct Job<'a> {
        exp: &'a Experiment,
        seed: u64,
        cells: &'a [LearnCell],
        args: &'a JudgeFitArgs,
    }
    impl OnBackend for Job<'_> {
        type Output = ();
        fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<()> {
            type Ad<B> = burn::backend::Autodiff<B>;
            let Job {
                exp,
                seed,
                cells,
                args,
            } = self;
            let opts = TrainOptions {
                run_dir: args.out.join(format!("seed-{seed}")),
                resume: false,
                stop_after: None,
                progress: !args.no_progress,
                log_lines: args.no_progress,
                meta: serde_json::Value::Null,
                warm_cache: Some(args.runs_dir.join(WARM_CACHE)),
                checkpoint: None,
                observer: None,
                placement: Default::default(),
            };
            let out = &args.out;
            // Cells already measured are not run again (an interrupted study resumes).
            let todo: Vec<LearnCell> = cells
                .iter()
                .filter(|c| !cell_file(out, seed, c).exists())
                .copied()
                .collect();
            if todo.is_empty() {
                return Ok(());
            }
            with_parts::<Ad<B>, _>(exp, seed, device, |parts| {
                judge_learnability::<Ad<B>, Transformer<Ad<B>>, _, _>(
                    exp,
                    seed,
                    parts,
                    device,
                    &opts,
                    &todo,
                    |r: CellResult| {
                        let path = cell_file(out, seed, &r.cell);
                        let text = serde_json::to_string(&r).unwrap_or_default();
                        let tmp = path.with_extension("json.tmp");
                        std::fs::write(&tmp, text)
                            .and_then(|()| std::fs::rename(&tmp, &path))
                            .map_err(|e| {
                                TrainError::RunDir(rlany_framework::rundir::RunDirError::Io {
                                    path: path.clone(),
                                    source: e,
                                })
                            })?;
                        eprintln!(
                            "seed {seed} labels {} noise {}: best step {}, pool {} borderline {}",
                            r.cell.labels,
                            r.cell.noise,
                            r.best_step,
                            fmt(best(&r, "pool/logit_bal_acc")),
                            fmt(best(&r, "pool/logit_bal_acc/borderline")),
                        );
                        Ok(())
                    },
                )?;
                Ok(())
            })
        }
    }
    on_backend(
        exp.backend,
        Job {
            exp,
            seed,
            cells,
            args,
        },
    )
}

/// A key's value at the kept checkpoint.
fn best(r: &CellResult, key: &str) -> Option<f64> {
    r.points
        .iter()
        .find(|p| p.get("step").copied() == Some(r.best_step as f64))
        .and_then(|p| p.get(key).copied())
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}
