//! `rlany eval RUN_DIR`: a run's checkpoint evaluated without training (see
//! `rlany_framework::trainer::evaluate_checkpoint`) — on the run's own evaluation splits,
//! which reproduces the run's evaluation at that step exactly, or on another experiment
//! file's environment with the same models. Prints the measurements and writes them as
//! `eval-<step>….json` beside the run. Given an experiment's folder (`runs/<name>`, its
//! `seed-<n>` runs inside), every seed is evaluated so and the measurements are summarised as
//! mean ± 95% interval over the seeds (`eval-<step>…-seeds.json` in the folder).

use crate::plugins::Experiment;
use crate::{OnBackend, UsageError, on_backend, parse_backend, seed_of_run_dir, with_parts};
use anyhow::{Context, Result};
use clap::Args;
use rlany_framework::checkpoint::step_dir_name;
use rlany_framework::trainer::{CheckpointEval, EvalOptions, evaluate_checkpoint};
use rlany_models::Transformer;
use std::path::{Path, PathBuf};

/// `rlany eval`'s arguments.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The run directory (runs/<name>/seed-<n>), or an experiment's folder (runs/<name>):
    /// every seed-<n> run in it, summarised over the seeds.
    run_dir: PathBuf,
    /// Evaluate the checkpoint of this training step (default: the latest).
    #[arg(long, conflicts_with = "checkpoint")]
    step: Option<usize>,
    /// Evaluate this checkpoint (e.g. step-000010; default: the latest).
    #[arg(long)]
    checkpoint: Option<String>,
    /// Evaluate on this experiment file's environment and evaluation budget instead of the
    /// run's own (a harder level, another scenario); its policy model must be the run's.
    #[arg(long, value_name = "FILE")]
    experiment: Option<PathBuf>,
    /// Evaluation tasks per split (`budget.eval_tasks`, and `eval_start_tasks` and
    /// `eval_start_sampled_tasks` where the experiment has them).
    #[arg(long)]
    tasks: Option<usize>,
    /// Seed of the evaluation's tasks (default: the run's, which reproduces its evaluations).
    #[arg(long)]
    seed: Option<u64>,
    /// Override the backend: ndarray, flex, wgpu, cuda or cuda:N (flex, wgpu and cuda as compiled
    /// in: `--features flex`, `wgpu`, `cuda`).
    #[arg(long)]
    backend: Option<String>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

/// What `rlany eval` writes: the measurements and what they were taken on.
#[derive(Debug, serde::Serialize)]
struct EvalRecord<'a> {
    run: String,
    checkpoint: &'a str,
    step: usize,
    experiment: String,
    seed: u64,
    eval_tasks: usize,
    metrics: &'a serde_json::Map<String, serde_json::Value>,
}

/// Evaluates one run, or every seed of an experiment's folder; prints and writes the records.
pub fn run(args: &EvalArgs) -> Result<()> {
    if args.run_dir.join("resolved.ron").exists() {
        return eval_run(args, &args.run_dir).map(|_| ());
    }
    let seeds = seed_runs(&args.run_dir);
    if seeds.is_empty() {
        return Err(UsageError(format!(
            "{}: neither a run directory (no resolved.ron; expected runs/<name>/seed-<n>) nor \
             an experiment's folder of seed-<n> runs",
            args.run_dir.display()
        ))
        .into());
    }
    let mut records = Vec::with_capacity(seeds.len());
    for dir in &seeds {
        let (record, name) = eval_run(args, dir)?;
        records.push((dir.clone(), record, name));
    }
    let (_, _, name) = &records[0];
    let summary = summarise(&records);
    println!(
        "{} over {} seeds: mean ± 95% interval (Student t)",
        args.run_dir.display(),
        records.len()
    );
    for (key, s) in &summary {
        println!("  {key:<40}  {}", s.format(4));
    }
    let path = args.run_dir.join(name.replace(".json", "-seeds.json"));
    let json = serde_json::json!({
        "runs": records.iter().map(|(d, r, _)| serde_json::json!({"run": d.display().to_string(), "step": r.step})).collect::<Vec<_>>(),
        "metrics": summary.iter().map(|(k, s)| (k.clone(), serde_json::json!({"mean": s.mean, "half_width_95": s.half_width, "n": s.n}))).collect::<serde_json::Map<_, _>>(),
    });
    let text = serde_json::to_string_pretty(&json).context("serialising the summary")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The `seed-<n>` run directories in `dir` (those with a resolved.ron), by seed.
fn seed_runs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut runs: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("resolved.ron").exists())
        .filter_map(|p| seed_of_run_dir(&p).ok().map(|s| (s, p)))
        .collect();
    runs.sort();
    runs.into_iter().map(|(_, p)| p).collect()
}

/// Every numeric measurement that all the records have: mean ± 95% interval over them.
fn summarise(
    records: &[(PathBuf, CheckpointEval, String)],
) -> Vec<(String, rlany_reports::MeanCi)> {
    let Some((_, first, _)) = records.first() else {
        return Vec::new();
    };
    first
        .metrics
        .0
        .keys()
        .filter(|k| k.as_str() != "step")
        .filter_map(|k| {
            let xs: Option<Vec<f64>> = records
                .iter()
                .map(|(_, r, _)| r.metrics.0.get(k).and_then(serde_json::Value::as_f64))
                .collect();
            xs.and_then(|xs| rlany_reports::mean_ci95(&xs))
                .map(|s| (k.clone(), s))
        })
        .collect()
}

/// Evaluates the run in `run_dir`, prints its table and writes its record; returns the
/// evaluation and the record's file name.
fn eval_run(args: &EvalArgs, run_dir: &Path) -> Result<(CheckpointEval, String)> {
    let resolved = run_dir.join("resolved.ron");
    let own = Experiment::load(&resolved)?;
    let run_seed = seed_of_run_dir(run_dir)?;
    let mut exp = match &args.experiment {
        None => own.clone(),
        Some(file) => on_other_environment(&own, &Experiment::load(file)?, file)?,
    };
    if let Some(n) = args.tasks {
        if n == 0 {
            return Err(UsageError("--tasks must be at least 1".into()).into());
        }
        exp.budget.eval_tasks = n;
        if exp.budget.eval_start_tasks > 0 {
            exp.budget.eval_start_tasks = n;
        }
        if exp.budget.eval_start_sampled_tasks > 0 {
            exp.budget.eval_start_sampled_tasks = n;
        }
    }
    if let Some(b) = &args.backend {
        exp.backend = parse_backend(b)?;
    }
    let checkpoint = args.checkpoint.clone().or(args.step.map(step_dir_name));
    let saved = rlany_framework::checkpoint::list(&run_dir.join("checkpoints"));
    if let Some(name) = checkpoint.as_ref().filter(|n| !saved.contains(n)) {
        return Err(UsageError(format!(
            "{}: no checkpoint {name}; this run has {} (a run keeps its two latest \
             checkpoints)",
            run_dir.display(),
            if saved.is_empty() {
                "none".into()
            } else {
                saved.join(", ")
            }
        ))
        .into());
    }
    let opts = EvalOptions {
        run_dir: run_dir.to_path_buf(),
        checkpoint,
        seed: args.seed.unwrap_or(run_seed),
        progress: !args.no_progress,
    };
    let result = evaluate(&exp, run_seed, &opts)?;
    println!(
        "{} at {} (step {}), {} on {}, seed {}:",
        run_dir.display(),
        result.checkpoint,
        result.step,
        exp.name,
        match &args.experiment {
            Some(f) => f.display().to_string(),
            None => "its own evaluation".into(),
        },
        opts.seed
    );
    println!("{}", table(&result));
    let record = EvalRecord {
        run: run_dir.display().to_string(),
        checkpoint: &result.checkpoint,
        step: result.step,
        experiment: match &args.experiment {
            Some(f) => f.display().to_string(),
            None => "resolved.ron".into(),
        },
        seed: opts.seed,
        eval_tasks: exp.budget.eval_tasks,
        metrics: &result.metrics.0,
    };
    let name = record_name(
        result.step,
        args.experiment.as_deref().map(|_| exp.name.as_str()),
        args.seed.filter(|&s| s != run_seed),
        args.tasks,
    );
    let path = run_dir.join(&name);
    let text = serde_json::to_string_pretty(&record).context("serialising the evaluation")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok((result, name))
}

/// `other`'s environment, evaluation budget and seeds with `own`'s models and judge: the
/// checkpoint's weights must fit, so the policy model (and its tokenizer) must be the same.
fn on_other_environment(own: &Experiment, other: &Experiment, file: &Path) -> Result<Experiment> {
    if other.policy.model != own.policy.model {
        return Err(UsageError(format!(
            "{}: its policy model differs from the run's ({:?} against {:?}); a checkpoint is \
             evaluated with the model it was trained as",
            file.display(),
            other.policy.model,
            own.policy.model
        ))
        .into());
    }
    let mut exp = other.clone();
    exp.policy = own.policy.clone();
    exp.judge = own.judge.clone();
    exp.backend = own.backend;
    Ok(exp)
}

/// `eval-<step>[-<experiment>][-seed-<s>][-tasks-<n>].json`: the run's own evaluation at a
/// step has the short name; each departure from it is in the name.
fn record_name(
    step: usize,
    other: Option<&str>,
    seed: Option<u64>,
    tasks: Option<usize>,
) -> String {
    let mut name = format!("eval-{step}");
    if let Some(e) = other {
        name.push('-');
        name.push_str(e);
    }
    if let Some(s) = seed {
        name.push_str(&format!("-seed-{s}"));
    }
    if let Some(n) = tasks {
        name.push_str(&format!("-tasks-{n}"));
    }
    name + ".json"
}

/// One line per measurement, `key  value`, in key order.
fn table(r: &CheckpointEval) -> String {
    let width = r.metrics.0.keys().map(String::len).max().unwrap_or(0);
    r.metrics
        .0
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .map(|(k, v)| match v.as_f64() {
            Some(x) => format!("  {k:<width$}  {x:.4}"),
            None => format!("  {k:<width$}  -"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The evaluation on the backend `exp` names (models built for the run's seed, then replaced
/// by the checkpoint's weights).
fn evaluate(exp: &Experiment, run_seed: u64, opts: &EvalOptions) -> Result<CheckpointEval> {
    struct Job<'a>(&'a Experiment, u64, &'a EvalOptions);
    impl OnBackend for Job<'_> {
        type Output = CheckpointEval;
        fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<CheckpointEval> {
            type Ad<B> = burn::backend::Autodiff<B>;
            let Job(exp, seed, opts) = self;
            with_parts::<Ad<B>, _>(exp, seed, device, |parts| {
                Ok(evaluate_checkpoint::<Ad<B>, Transformer<Ad<B>>, _, _>(
                    exp, parts, device, opts,
                )?)
            })
        }
    }
    on_backend(exp.backend, Job(exp, run_seed, opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_names_say_what_departs_from_the_runs_own_evaluation() {
        assert_eq!(record_name(40, None, None, None), "eval-40.json");
        assert_eq!(
            record_name(40, Some("hard"), Some(7), Some(64)),
            "eval-40-hard-seed-7-tasks-64.json"
        );
    }
}
