//! Evaluating a checkpoint without training (`rlany eval`): the run's policy and judge as
//! they were at a saved step, put through the same evaluation phase the loop runs
//! ([`Run::evaluate`]) — so at the step of one of the run's own evaluations the numbers
//! are that evaluation's, exactly. Nothing is written to the run directory.

use super::*;

/// Which checkpoint is evaluated, and how.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The run directory (`runs/<name>/seed-<n>`) whose checkpoint is read.
    pub run_dir: PathBuf,
    /// The checkpoint (e.g. `step-000010`); the latest when `None`.
    pub checkpoint: Option<String>,
    /// The seed of the evaluation's task streams and judge pool (the run's own seed
    /// reproduces its evaluations; another draws other tasks).
    pub seed: u64,
    /// Draw a progress bar.
    pub progress: bool,
}

/// What [`evaluate_checkpoint`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointEval {
    /// The training step the checkpoint was saved at.
    pub step: usize,
    /// The checkpoint's directory name (e.g. `step-000040`).
    pub checkpoint: String,
    /// `eval/*` (greedy accuracies by split and grid level) and, with a judge,
    /// `judge/eval*` (its quality on the evaluation pool), keyed as in `metrics.jsonl`.
    pub metrics: Metrics,
}

/// Evaluates the checkpoint of `opts.run_dir` under `exp`: its environment, evaluation
/// budget (`eval_tasks`, `eval_start_tasks`, `max_env_steps`) and judge settings. `exp` is
/// the run's own experiment (its `resolved.ron`) or another with the same models (a
/// harder level, another scenario with the same vocabulary); `parts` are its components
/// with fresh models, whose weights the checkpoint replaces.
pub fn evaluate_checkpoint<B, M, E, A>(
    exp: &Experiment<E, A>,
    parts: Components<'_, M>,
    device: &B::Device,
    opts: &EvalOptions,
) -> Result<CheckpointEval, TrainError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
    E: EnvironmentChoice,
    A: AdaptationChoice,
{
    let cfg = Settings::for_env(exp, parts.env);
    let dir = RunDir::read_only(&opts.run_dir);
    let ckpt = match &opts.checkpoint {
        Some(name) => checkpoint::Reader::named(&dir.checkpoints(), name)?,
        None => checkpoint::Reader::latest(&dir.checkpoints())?,
    };
    let state: TrainerState = ckpt.state()?;
    let train_opts = TrainOptions {
        run_dir: opts.run_dir.clone(),
        resume: true,
        stop_after: None,
        progress: opts.progress,
        log_lines: false,
        meta: serde_json::Value::Null,
        warm_cache: None,
        checkpoint: opts.checkpoint.clone(),
        observer: None,
        placement: Placement::default(),
    };
    let mut parts = parts;
    let fresh_judge = parts.judge.take();
    parts.policy = ckpt.trainable("policy", parts.policy.clone(), device)?;
    let mut run = Run::new(cfg, opts.seed, parts, device, &train_opts, dir);
    if let Some(j) = fresh_judge {
        let judge = ckpt.trainable("judge", j, device)?;
        run.judge = Some(Learner::new(Role::Judge, judge, &run.cfg, opts.seed));
    }
    run.judge_pool = run.make_judge_pool();
    let step = state.step;
    run.state = state;
    let mut m = Metrics::new(step);
    run.evaluate(&mut m, step)?;
    Ok(CheckpointEval {
        step,
        checkpoint: ckpt.name(),
        metrics: m,
    })
}
