//! # rlany
//!
//! The composition root. `rlany` (the binary) is a thin wrapper over [`cli_main`]. It reads
//! an experiment file, builds the concrete environment, tokenizer, models and difficulty
//! proposer it names, picks the backend, and hands them to the framework's closed loop.

mod bench;
mod bench_models;
pub mod device;
pub mod distributed;
mod envcmd;
mod evalcmd;
mod exportcmd;
mod generate;
mod judgefit;
#[cfg(feature = "distributed")]
mod mpi;
pub mod overrides;
pub mod plugins;
pub mod pretrained;
pub mod suite;

use anyhow::{Context, Result};
use burn::backend::Autodiff;
use clap::{Parser, Subcommand};
pub use plugins::{AdaptationSpec, EnvironmentSpec, Experiment, Plugins};
use rlany_framework::adapt::{self, Proposer};
use rlany_framework::experiment::{ModelSource, ModelSpec, WeightDType};
use rlany_framework::plugin::{AdaptationChoice, EnvironmentChoice, ProposerContext};
use rlany_framework::{
    BackendKind, Components, Environment, ExperimentError, Rng, RunSummary, Tokenizer,
    TrainOptions, train,
};
use rlany_models::{CharTokenizer, Transformer, TransformerConfig};
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "rlany",
    version,
    about = "Closed-loop RL of language-model agents: environment, policy and reward model trained together"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an experiment (every seed it lists, or one with --seed).
    Run {
        /// The experiment file (.ron).
        file: PathBuf,
        /// Override the experiment's backend: ndarray, flex, wgpu, cuda or cuda:N (flex, wgpu and
        /// cuda as compiled in: `--features flex`, `wgpu`, `cuda`).
        #[arg(long)]
        backend: Option<String>,
        /// Run only this seed (need not be listed in the file).
        #[arg(long)]
        seed: Option<u64>,
        /// Continue the run in this directory (runs/<name>/seed-<n>) from its last checkpoint.
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
        /// Where run directories are created.
        #[arg(long, default_value = "runs")]
        runs_dir: PathBuf,
        /// Stop after this training step, as if killed (the run can be resumed).
        #[arg(long, value_name = "STEP")]
        stop_after: Option<usize>,
        /// No progress bars (plain per-step lines only).
        #[arg(long)]
        no_progress: bool,
        /// Override a field: PATH=VALUE (e.g. budget.steps=6); repeatable; recorded in
        /// resolved.ron.
        #[arg(long = "set", value_name = "PATH=VALUE")]
        sets: Vec<String>,
        /// With --resume: resume from this checkpoint (e.g. step-000010) instead of the latest.
        #[arg(long, requires = "resume")]
        checkpoint: Option<String>,
        /// Do not share warm starts through RUNS_DIR/.warm-cache.
        #[arg(long)]
        no_warm_cache: bool,
        /// Where the run's peers are (one replica in this process unless told otherwise).
        #[command(flatten)]
        placement: distributed::PlacementArgs,
    },
    /// Run an ablation suite: every experiment file of SUITE_DIR (rows in file-name order) for
    /// every seed, sharing identical warm starts; resumable; writes the suite's report.
    Ablate {
        /// The folder of experiment files (e.g. experiments/ablation/arith).
        suite: PathBuf,
        /// Seeds 1..=N (overrides the files' lists).
        #[arg(long, conflicts_with = "seed_list")]
        seeds: Option<u64>,
        /// These seeds, comma-separated (overrides the files' lists).
        #[arg(long, value_delimiter = ',')]
        seed_list: Vec<u64>,
        /// Override the experiments' backend: ndarray, flex, wgpu, cuda or cuda:N (flex, wgpu and
        /// cuda as compiled in: `--features flex`, `wgpu`, `cuda`).
        #[arg(long)]
        backend: Option<String>,
        /// Override a field of every row: PATH=VALUE; repeatable.
        #[arg(long = "set", value_name = "PATH=VALUE")]
        sets: Vec<String>,
        /// Where the suite's runs go: RUNS_DIR/<suite>/<experiment>/seed-<n>.
        #[arg(long, default_value = "runs")]
        runs_dir: PathBuf,
        /// No progress bars (plain lines only).
        #[arg(long)]
        no_progress: bool,
        /// Do not share warm starts (every run computes its own).
        #[arg(long)]
        no_warm_cache: bool,
        /// Seeds run at once, one thread each (results do not depend on it).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
        jobs: u64,
    },
    /// Benchmark workloads of kernels/BENCH.md (`--kernels`: the fused log-prob / KL kernels;
    /// `--models`: rollout and PPO step of the benchmark models, `--quick` on a CPU).
    Bench {
        #[command(flatten)]
        args: bench::BenchArgs,
    },
    /// A report from run directories: report.md with the ablation table (mean ± 95% CI over
    /// seeds, paired differences) and SVG figures (accuracy, judge, diagnostics,
    /// difficulty, GP posterior, backend comparison). Given `rlany judge-fit` study folders
    /// (holding `cells/`), rewrites their reports in place.
    Report {
        /// Run directories, or folders holding them (a suite's runs folder, `runs/`).
        #[arg(required_unless_present = "bench")]
        paths: Vec<PathBuf>,
        /// Where report.md and figures/ go (default: the first path).
        #[arg(long)]
        out: Option<PathBuf>,
        /// `rlany bench --json` files (any backend, or the PyTorch anchor's) to compare.
        #[arg(long, value_name = "FILE")]
        bench: Vec<PathBuf>,
        /// One more paired comparison, ROW=AGAINST (experiment names), beyond each row's
        /// baseline and the experiment files' `compare`; repeatable.
        #[arg(long, value_name = "ROW=AGAINST", value_parser = pair_of::<'='>)]
        compare: Vec<(String, String)>,
        /// An interaction, SUITE_A:SUITE_B (the folders holding the experiments): each arm's
        /// gain over its baseline in A minus its gain in B, paired by seed; repeatable.
        #[arg(long, value_name = "SUITE_A:SUITE_B", value_parser = pair_of::<':'>)]
        interaction: Vec<(String, String)>,
        /// Report only these seeds' runs (comma-separated), e.g. to leave out the seed that
        /// chose a setting.
        #[arg(long, value_delimiter = ',')]
        seeds: Option<Vec<u64>>,
    },
    /// Show an environment: a sampled task, the expert's trajectory with observations and
    /// oracle labels, and the difficulty dimensions — exactly what the agent sees.
    Env {
        #[command(flatten)]
        args: envcmd::EnvArgs,
    },
    /// Evaluate a run's checkpoint (the latest, or --step) without training: on its own
    /// evaluation splits (the run's numbers at that step, exactly) or on another experiment
    /// file's environment; prints the table and writes eval-<step>.json beside the run.
    Eval {
        #[command(flatten)]
        args: evalcmd::EvalArgs,
    },
    /// Write a run's trained policy in a format other tools load: `hf` (a Hugging Face
    /// directory, LoRA adapters merged), `peft` (the adapters alone, PEFT's names) or `gguf`
    /// (one file for llama.cpp, adapters merged, `--quant f16|q8_0`).
    Export {
        #[command(flatten)]
        args: exportcmd::ExportArgs,
    },
    /// What a pretrained model (GGUF file or Hugging Face directory) answers to one user
    /// message, in its own chat template; greedy unless --temperature is given.
    Generate {
        #[command(flatten)]
        args: generate::GenerateArgs,
    },
    /// The judge's learnability apart from RL: its warm start (the run's own labels, prompt,
    /// model and fit) for a grid of label counts × label noises × seeds, measured on held-out
    /// steps by kind and on its own labels at every point of the fit; writes one JSON per cell
    /// and a report with learning curves.
    JudgeFit {
        #[command(flatten)]
        args: judgefit::JudgeFitArgs,
    },
    /// Validate experiment files without running them; print the resolved experiment.
    Check {
        /// Experiment files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only report errors.
        #[arg(long, short)]
        quiet: bool,
        /// Also start each process environment's child once and ask its `hello` (a wrong
        /// command or path shows here, not at `run`).
        #[arg(long)]
        probe: bool,
    },
}

/// The `rlany` command with `plugins` added to the built-in ones: what a user's own binary
/// calls (docs/extend.md). Every command of `rlany` then knows the user's environments and
/// proposers by the names they were registered under.
///
/// ```ignore
/// fn main() -> std::process::ExitCode {
///     rlany::main_with(rlany::Plugins::builtin().environment::<CountdownSpec>("Countdown"))
/// }
/// ```
pub fn main_with(plugins: Plugins) -> std::process::ExitCode {
    if let Err(e) = plugins.install() {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    std::process::ExitCode::from(cli_main(std::env::args_os()))
}

/// Runs the command line `args` (program name first) and returns the process exit code:
/// 0 on success, 2 on bad input (experiment file, option) or a backend this machine cannot
/// start, 1 on a failure while running.
pub fn cli_main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match dispatch(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            // Bad input (an experiment file, an option) and a backend that cannot start exit 2;
            // failures while running, 1.
            let bad_input = e.chain().any(|c| {
                c.is::<ExperimentError>()
                    || c.is::<UsageError>()
                    || c.is::<device::BackendUnavailable>()
                    || c.is::<rlany_reports::ReportError>()
            });
            if bad_input { 2 } else { 1 }
        }
    }
}

/// A command-line value that cannot be used (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Parses `A<SEP>B` into two non-empty names.
fn pair_of<const SEP: char>(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once(SEP) {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
        _ => Err(format!("expected two names joined by `{SEP}`, got `{s}`")),
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench { args } => bench::run(args),
        Command::Env { args } => envcmd::run(&args),
        Command::Eval { args } => evalcmd::run(&args),
        Command::Export { args } => exportcmd::run(&args),
        Command::JudgeFit { args } => judgefit::run(&args),
        Command::Generate { args } => generate::run(&args),
        Command::Report {
            paths,
            out,
            bench,
            compare,
            interaction,
            seeds,
        } => {
            // A `rlany judge-fit` study (its `cells/`): its report is rewritten in place.
            let fits: Vec<&PathBuf> = paths.iter().filter(|p| p.join("cells").is_dir()).collect();
            if !fits.is_empty() && fits.len() == paths.len() && bench.is_empty() {
                if out.is_some() {
                    return Err(UsageError(
                        "a judge-fit study's report is written into its own folder; drop --out"
                            .into(),
                    )
                    .into());
                }
                for p in fits {
                    let written = rlany_reports::learnability::write(p)?;
                    println!("wrote {}", written.display());
                }
                return Ok(());
            }
            let out = match (out, paths.first(), bench.first()) {
                (Some(o), _, _) => o,
                (None, Some(p), _) => p.clone(),
                (None, None, Some(b)) => b.parent().map(Path::to_path_buf).unwrap_or_default(),
                (None, None, None) => PathBuf::from("."),
            };
            let opts = rlany_reports::ReportOptions {
                out,
                bench_json: bench,
                title: None,
                compare,
                interactions: interaction,
                seeds,
            };
            let summary = rlany_reports::write_report(&paths, &opts)?;
            for w in &summary.warnings {
                eprintln!("warning: {w}");
            }
            println!("{}", summary.table);
            if let Some(t) = &summary.bench_table {
                println!("{t}");
            }
            println!(
                "wrote {} ({} runs, {} figures)",
                summary.report.display(),
                summary.runs,
                summary.figures.len()
            );
            Ok(())
        }
        Command::Check {
            files,
            quiet,
            probe,
        } => check(&files, quiet, probe),
        Command::Run {
            file,
            backend,
            seed,
            resume,
            runs_dir,
            stop_after,
            no_progress,
            sets,
            checkpoint,
            no_warm_cache,
            placement,
        } => {
            let mut exp = overrides::apply(&Experiment::load(&file)?, &sets)
                .map_err(|e| UsageError(e.to_string()))?;
            if let Some(b) = backend {
                exp.backend = parse_backend(&b)?;
            }
            let seeds = match (seed, &resume) {
                (Some(s), _) => vec![s],
                (None, Some(dir)) => vec![seed_of_run_dir(dir)?],
                (None, None) => exp.seeds.clone(),
            };
            let opts_for = |s: u64| {
                let run_dir = match &resume {
                    Some(d) => d.clone(),
                    None => runs_dir.join(&exp.name).join(format!("seed-{s}")),
                };
                let warm_cache = (!no_warm_cache).then(|| match &resume {
                    // runs/<name>/seed-<n> → runs/.warm-cache
                    Some(d) => d
                        .parent()
                        .and_then(Path::parent)
                        .map(|r| r.join(WARM_CACHE))
                        .unwrap_or_else(|| PathBuf::from(WARM_CACHE)),
                    None => runs_dir.join(WARM_CACHE),
                });
                TrainOptions {
                    run_dir,
                    resume: resume.is_some(),
                    stop_after,
                    progress: !no_progress,
                    log_lines: true,
                    meta: meta_json(&exp, s, &file),
                    warm_cache,
                    checkpoint: checkpoint.clone(),
                    observer: None,
                    placement: Default::default(),
                }
            };
            if placement.is_spread() {
                return distributed::run_spread(&exp, &seeds, &placement, &opts_for);
            }
            for s in seeds {
                let opts = opts_for(s);
                let run_dir = opts.run_dir.clone();
                let started = std::time::Instant::now();
                let existed = run_dir.join("resolved.ron").exists();
                let summary = match run(&exp, s, &opts) {
                    Ok(summary) => summary,
                    // A run that never started (its directory was not made): the cause first.
                    Err(e) if !existed && !run_dir.join("resolved.ron").exists() => return Err(e),
                    Err(e) => return Err(e.context(format!("run {}", run_dir.display()))),
                };
                print_summary(&exp, s, &run_dir, &summary, started.elapsed().as_secs_f64());
            }
            Ok(())
        }
        Command::Ablate {
            suite,
            seeds,
            seed_list,
            backend,
            sets,
            runs_dir,
            no_progress,
            no_warm_cache,
            jobs,
        } => {
            let seeds = match (seeds, seed_list.is_empty()) {
                (Some(n), _) => Some((1..=n).collect()),
                (None, false) => Some(seed_list),
                (None, true) => None,
            };
            let backend = backend.as_deref().map(parse_backend).transpose()?;
            suite::ablate(&suite::SuiteOptions {
                suite,
                seeds,
                backend,
                sets,
                runs_dir,
                progress: !no_progress,
                warm_cache: !no_warm_cache,
                jobs: jobs as usize,
            })
        }
    }
}

/// `rlany check`: validates every file (all of them, not only up to the first bad one),
/// printing the resolved experiment of each valid one; the error says how many were invalid.
/// With `probe`, a process environment's child is started once and answers `hello`.
pub fn check(files: &[PathBuf], quiet: bool, probe: bool) -> Result<()> {
    let mut failed: Vec<String> = Vec::new();
    for f in files {
        let loaded = Experiment::load(f).map(|exp| {
            let missing = missing_models(&exp);
            (exp, missing)
        });
        match loaded {
            Ok((_, missing)) if !missing.is_empty() => {
                for m in missing {
                    eprintln!("error: {}: {m}", f.display());
                }
                failed.push(f.display().to_string());
                continue;
            }
            Ok(_) if quiet => println!("{}: ok", f.display()),
            Ok((ref exp, _)) => println!("// {}: ok\n{}", f.display(), exp.to_ron()),
            Err(e) => {
                eprintln!("error: {e}");
                failed.push(f.display().to_string());
                continue;
            }
        }
        if let (true, Ok((exp, _))) = (probe, &loaded)
            && let EnvironmentSpec::Process(p) = &exp.environment
        {
            match p.try_build() {
                Ok(env) => {
                    let (name, version) = env.name().unwrap_or_default();
                    let dims: Vec<String> = env
                        .difficulty_space()
                        .iter()
                        .map(|d| d.name.clone())
                        .collect();
                    println!(
                        "{}: probe ok: `{name}`{} answered hello, dims {}",
                        f.display(),
                        version.map(|v| format!(" version {v}")).unwrap_or_default(),
                        dims.join(", ")
                    );
                }
                Err(e) => {
                    eprintln!("error: {}: the environment did not start: {e}", f.display());
                    failed.push(f.display().to_string());
                }
            }
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    Err(UsageError(format!(
        "{} of {} files invalid: {}",
        failed.len(),
        files.len(),
        failed.join(", ")
    ))
    .into())
}

/// The warm-start cache folder inside a runs folder.
pub const WARM_CACHE: &str = ".warm-cache";

/// `--backend` text → backend.
pub fn parse_backend(s: &str) -> Result<BackendKind> {
    let lower = s.to_ascii_lowercase();
    Ok(match lower.as_str() {
        "ndarray" | "cpu" => BackendKind::NdArray,
        "flex" => BackendKind::Flex,
        "wgpu" => BackendKind::Wgpu,
        "cuda" => BackendKind::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => BackendKind::Cuda(n),
            _ => {
                return Err(UsageError(format!(
                    "--backend {s:?}: expected ndarray, flex, wgpu, cuda or cuda:N"
                ))
                .into());
            }
        },
    })
}

fn seed_of_run_dir(dir: &Path) -> Result<u64> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("seed-"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            UsageError(format!(
                "{}: expected a run directory named seed-<n>",
                dir.display()
            ))
            .into()
        })
}

/// Runs (or resumes) one seed of `exp` on the backend it names.
pub fn run(exp: &Experiment, seed: u64, opts: &TrainOptions) -> Result<RunSummary> {
    struct Train<'a>(&'a Experiment, u64, &'a TrainOptions);
    impl OnBackend for Train<'_> {
        type Output = RunSummary;
        fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<RunSummary> {
            run_seed::<Autodiff<B>>(self.0, self.1, device, self.2)
        }
    }
    on_backend(exp.backend, Train(exp, seed, opts))
}

/// Work that can run on any backend: `rlany run` trains on its autodiff form, `rlany
/// generate` decodes on the backend itself.
pub(crate) trait OnBackend {
    /// What the work returns.
    type Output;
    /// The work on backend `B`, on `device`.
    fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<Self::Output>;
}

/// `job` on the backend `kind` names: a GPU backend is started first (a failed start is a
/// clear error); a backend this binary was built without is a usage error naming the
/// feature to build with.
pub(crate) fn on_backend<J: OnBackend>(kind: BackendKind, job: J) -> Result<J::Output> {
    #[allow(dead_code)] // unused when every backend is compiled in
    fn not_compiled(backend: &str, feature: &str) -> anyhow::Error {
        UsageError(format!(
            "backend {backend} is not compiled in: rebuild with `--features {feature}`"
        ))
        .into()
    }
    match kind {
        BackendKind::NdArray => job.on::<burn::backend::NdArray<f32>>(&Default::default()),
        BackendKind::Flex => {
            #[cfg(feature = "flex")]
            {
                job.on::<burn::backend::Flex>(&Default::default())
            }
            #[cfg(not(feature = "flex"))]
            Err(not_compiled("Flex", "flex"))
        }
        BackendKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                type B = burn::backend::Wgpu;
                device::probe::<B>("wgpu", &Default::default())?;
                job.on::<B>(&Default::default())
            }
            #[cfg(not(feature = "wgpu"))]
            Err(not_compiled("Wgpu", "wgpu"))
        }
        BackendKind::Cuda(index) => {
            #[cfg(feature = "cuda")]
            {
                type B = burn::backend::Cuda;
                let device = burn::backend::cuda::CudaDevice::new(index);
                device::probe::<B>(&format!("cuda:{index}"), &device)?;
                job.on::<B>(&device)
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = index;
                Err(not_compiled("Cuda", "cuda"))
            }
        }
    }
}

/// The concrete environment an experiment names; an error when it could not start (a
/// process environment's child, [`Environment::fault`]) or its difficulty space has another
/// number of dimensions than the settings' starting difficulty.
pub fn build_environment(exp: &Experiment) -> Result<Box<dyn Environment>> {
    let plugin = exp.environment.plugin();
    let env = plugin.build();
    if let Some(fault) = env.fault() {
        anyhow::bail!("environment: {fault}");
    }
    let (start, dims) = (plugin.start_difficulty(), env.difficulty_space());
    if start.len() != dims.len() {
        return Err(UsageError(format!(
            "environment.difficulty has {} values; the environment has {} dimensions ({})",
            start.len(),
            dims.len(),
            dims.iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into());
    }
    Ok(env)
}

/// The decoder config of a from-scratch model source (`None` for a pretrained one, whose
/// file holds its architecture).
pub fn model_config(source: &ModelSource, vocab: usize) -> Option<TransformerConfig> {
    match source {
        ModelSource::Scratch(m) => Some(scratch_config(m, vocab)),
        ModelSource::Pretrained(_) => None,
    }
}

fn scratch_config(m: &ModelSpec, vocab: usize) -> TransformerConfig {
    TransformerConfig::new(
        vocab,
        m.d_model,
        m.layers,
        m.heads,
        m.kv_heads,
        m.ffn,
        m.max_seq_len,
    )
    .with_qkv_bias(m.qkv_bias)
}

/// The policy's transformer config, when it is trained from scratch.
pub fn policy_config(exp: &Experiment, vocab: usize) -> Option<TransformerConfig> {
    model_config(&exp.policy.model, vocab)
}

/// The pretrained files an experiment names that do not exist, each with the message that
/// says how to get it (for `rlany check` and `rlany run`).
pub fn missing_models(exp: &Experiment) -> Vec<String> {
    let mut sources = vec![&exp.policy.model];
    if let Some(j) = exp.judge.model() {
        sources.push(&j.model);
    }
    sources
        .into_iter()
        .filter_map(|s| match s {
            ModelSource::Pretrained(p) if !Path::new(&p.path).exists() => {
                Some(pretrained::missing_model_hint(Path::new(&p.path)))
            }
            _ => None,
        })
        .collect()
}

/// A model of `source` on `device` with the tokenizer it reads: a pretrained file's own, or
/// (from scratch) the character tokenizer, weights drawn from the stream `init` of `seed`.
fn build_model<B: rlany_kernels::AttentionOps>(
    source: &ModelSource,
    seed: u64,
    init: &str,
    device: &B::Device,
) -> Result<(Transformer<B>, Box<dyn Tokenizer>)> {
    build_model_with_chat(source, seed, init, device).map(|(m, t, _)| (m, t))
}

/// A model, the tokenizer it reads and its chat template (a pretrained file's, when this
/// build renders it).
pub(crate) type BuiltModel<B> = (
    Transformer<B>,
    Box<dyn Tokenizer>,
    Option<rlany_models::ChatTemplate>,
);

/// Which of a run's models: the policy, or its learned judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The policy.
    Policy,
    /// The judge (`judge: Learned(...)` or `Frozen(...)`).
    Judge,
}

/// A run's trained policy (or judge) at one of its checkpoints.
pub(crate) struct RunPolicy<B: burn::prelude::Backend> {
    /// The model the run's experiment names (adapters included) with the checkpoint's
    /// trainable weights.
    pub model: Transformer<B>,
    /// The tokenizer it reads.
    pub tokenizer: Box<dyn Tokenizer>,
    /// A pretrained file's chat template.
    pub chat: Option<rlany_models::ChatTemplate>,
    /// Where the model came from (the experiment's policy or judge model).
    pub source: ModelSource,
    /// The checkpoint's name (`step-000040`).
    pub checkpoint: String,
}

/// The policy of the run in `run` (`runs/<name>/seed-<n>`) at `checkpoint` (default the
/// latest): built as its experiment names it, then given the checkpoint's weights.
pub(crate) fn run_policy<B: rlany_kernels::LogProbOps>(
    run: &Path,
    checkpoint: Option<&str>,
    device: &B::Device,
) -> Result<RunPolicy<B>> {
    run_model(run, checkpoint, Role::Policy, device)
}

/// The policy or the judge of the run in `run` at `checkpoint` (default the latest), built as
/// its experiment names it (the same streams a run draws its fresh models and adapters
/// from), then given the checkpoint's weights. A judge from scratch reads the policy's
/// tokenizer, which it is given here too.
pub(crate) fn run_model<B: rlany_kernels::LogProbOps>(
    run: &Path,
    checkpoint: Option<&str>,
    role: Role,
    device: &B::Device,
) -> Result<RunPolicy<B>> {
    use burn::module::AutodiffModule;
    type Ad<B> = burn::backend::Autodiff<B>;
    let resolved = run.join("resolved.ron");
    if !resolved.exists() {
        return Err(UsageError(format!(
            "{}: not a run directory (no resolved.ron; expected runs/<name>/seed-<n>)",
            run.display()
        ))
        .into());
    }
    let mut exp = Experiment::load(&resolved)?;
    let seed = seed_of_run_dir(run)?;
    from_run_dir(&mut exp.policy.model, run);
    let (name, source) = match role {
        Role::Policy => ("policy", exp.policy.model.clone()),
        Role::Judge => match exp.judge.model() {
            Some(j) => ("judge", {
                let mut m = j.model.clone();
                from_run_dir(&mut m, run);
                m
            }),
            None => {
                return Err(UsageError(format!(
                    "{}: the run has no judge with a model of its own (its judge is {})",
                    run.display(),
                    match exp.judge {
                        rlany_framework::experiment::JudgeSpec::Oracle(_) => "a synthetic Oracle",
                        _ => "None",
                    }
                ))
                .into());
            }
        },
    };
    let (model, tokenizer, chat) = match (role, &source) {
        (Role::Judge, ModelSource::Scratch(m)) => {
            // A from-scratch judge reads the policy's tokenizer (the run builds it so).
            let (_, tok, chat) =
                build_model_with_chat::<Ad<B>>(&exp.policy.model, seed, "policy-init", device)
                    .context("policy model")?;
            let model = scratch_config(m, tok.vocab_size())
                .init_seeded::<Ad<B>>(device, &mut Rng::derive(seed, "judge-init"))
                .context("judge model config")?;
            (model, tok, chat)
        }
        _ => build_model_with_chat::<Ad<B>>(&source, seed, &format!("{name}-init"), device)
            .with_context(|| format!("{name} model"))?,
    };
    let model = with_adapters(model, &source, seed, &format!("{name}-lora"));
    let checkpoints = run.join("checkpoints");
    let ckpt = match checkpoint {
        Some(name) => rlany_framework::checkpoint::Reader::named(&checkpoints, name)?,
        None => rlany_framework::checkpoint::Reader::latest(&checkpoints)?,
    };
    let model = ckpt.trainable(name, model, device)?.valid();
    let checkpoint = ckpt.name();
    Ok(RunPolicy {
        model,
        tokenizer,
        chat,
        source,
        checkpoint,
    })
}

/// A run directory names its pretrained source as the experiment file did: relative to the
/// folder the run was started in. Read from elsewhere (`rlany eval`, `export`, `generate
/// --run` in another folder), a relative path that does not exist from here is looked up from
/// the run directory's enclosing folders, the first that holds it.
fn from_run_dir(source: &mut ModelSource, run: &Path) {
    let ModelSource::Pretrained(p) = source else {
        return;
    };
    let path = Path::new(&p.path);
    if path.is_absolute() || path.exists() {
        return;
    }
    let Ok(run) = run.canonicalize() else {
        return;
    };
    if let Some(found) = run
        .ancestors()
        .skip(1)
        .map(|a| a.join(path))
        .find(|c| c.exists())
    {
        p.path = found.to_string_lossy().into_owned();
    }
}

/// [`build_model`], with the pretrained file's chat template (when this build renders it).
pub(crate) fn build_model_with_chat<B: rlany_kernels::AttentionOps>(
    source: &ModelSource,
    seed: u64,
    init: &str,
    device: &B::Device,
) -> Result<BuiltModel<B>> {
    match source {
        ModelSource::Scratch(m) => {
            let tok = CharTokenizer::new();
            let model = scratch_config(m, tok.vocab_size())
                .init_seeded::<B>(device, &mut Rng::derive(seed, init))
                .context("model config")?;
            Ok((model, Box::new(tok), None))
        }
        ModelSource::Pretrained(p) => {
            let path = Path::new(&p.path);
            if !path.exists() {
                return Err(UsageError(pretrained::missing_model_hint(path)).into());
            }
            let mut loaded = rlany_models::load_pretrained::<B>(path, Some(p.max_seq_len), device)
                .with_context(|| format!("loading {}", path.display()))?;
            if p.dtype == WeightDType::Bf16 {
                use burn::tensor::{DType, FloatDType};
                if !B::supports_dtype(device, DType::BF16) {
                    return Err(UsageError(format!(
                        "{}: `dtype: Bf16` needs a backend with bf16 tensors (CUDA, or Flex on the CPU); {} has none \
                         (leave `dtype` out for f32)",
                        path.display(),
                        B::name(device)
                    ))
                    .into());
                }
                loaded.model = loaded.model.with_dtype(FloatDType::BF16);
            }
            if let Some(t) = &loaded.unrecognised_template {
                eprintln!(
                    "warning: {}: its chat template is not ChatML; episodes are laid out as plain \
                     lines ({} characters of template ignored)",
                    path.display(),
                    t.len()
                );
            }
            Ok((loaded.model, Box::new(loaded.tokenizer), loaded.chat))
        }
    }
}

/// `model` with the LoRA adapters its source asks for (frozen base, adapters drawn from the
/// stream `stream` of `seed`); unchanged without.
pub(crate) fn with_adapters<B: rlany_kernels::AttentionOps>(
    model: Transformer<B>,
    source: &ModelSource,
    seed: u64,
    stream: &str,
) -> Transformer<B> {
    match source {
        ModelSource::Pretrained(rlany_framework::experiment::PretrainedSpec {
            lora: Some(spec),
            ..
        }) => model.with_lora(spec, &mut Rng::derive(seed, stream)),
        _ => model,
    }
}

/// Whether two tokenizers are the same (vocabulary size, special ids and the ids of a
/// probe text covering letters, digits, punctuation, spaces and newlines).
fn same_tokenizer(a: &dyn Tokenizer, b: &dyn Tokenizer) -> bool {
    let probe = "The judge reads 17+25=42, click(3)\n  and type(7, \"Budget\").\n";
    (a.vocab_size(), a.bos(), a.eos(), a.pad(), a.prompt_format())
        == (b.vocab_size(), b.bos(), b.eos(), b.pad(), b.prompt_format())
        && a.encode(probe) == b.encode(probe)
}

/// The difficulty proposer an experiment names (`Static` when difficulty never changes).
pub fn build_proposer(exp: &Experiment, dims: usize) -> Box<dyn Proposer> {
    let ctx = ProposerContext {
        total_steps: exp.budget.steps,
        dims,
    };
    match exp.adaptation.plugin() {
        Some(p) => p.build(&ctx),
        None => Box::new(adapt::Static),
    }
}

fn run_seed<B: rlany_kernels::AutodiffLogProbOps>(
    exp: &Experiment,
    seed: u64,
    device: &B::Device,
    opts: &TrainOptions,
) -> Result<RunSummary> {
    if opts.resume {
        check_bases(exp, &opts.run_dir)?;
    }
    with_parts::<B, _>(exp, seed, device, |parts| {
        Ok(train::<B, Transformer<B>, _, _>(
            exp, seed, parts, device, opts,
        )?)
    })
}

/// The components of `exp` for `seed` (environment, tokenizer, fresh policy and judge,
/// proposer), handed to `f`.
pub(crate) fn with_parts<B: rlany_kernels::AutodiffLogProbOps, R>(
    exp: &Experiment,
    seed: u64,
    device: &B::Device,
    f: impl FnOnce(Components<'_, Transformer<B>>) -> Result<R>,
) -> Result<R> {
    let env = build_environment(exp)?;
    // A judge that starts from the policy's pretrained file shares its weights in memory
    // (loaded once, at the longer of the two contexts; Burn's tensors are reference-counted,
    // and a weight that one of them trains is replaced, never written in place).
    let shared = match (&exp.policy.model, exp.judge.model().map(|j| &j.model)) {
        (ModelSource::Pretrained(p), Some(ModelSource::Pretrained(j)))
            if p.path == j.path && p.dtype == j.dtype =>
        {
            Some((p.max_seq_len, j.max_seq_len))
        }
        _ => None,
    };
    // Every from-scratch weight is drawn from a stream of the run's seed (never Burn's
    // global RNG); a pretrained model brings its weights and its tokenizer.
    let (policy, tok) = match (&exp.policy.model, shared) {
        (ModelSource::Pretrained(p), Some((pl, jl))) => {
            let widest = ModelSource::Pretrained(rlany_framework::experiment::PretrainedSpec {
                max_seq_len: pl.max(jl),
                ..p.clone()
            });
            build_model::<B>(&widest, seed, "policy-init", device).context("policy model")?
        }
        (source, _) => {
            build_model::<B>(source, seed, "policy-init", device).context("policy model")?
        }
    };
    // Each at its own context, capped by the model's (as a separate load would be).
    let cap = policy.config().max_seq_len;
    let base = shared.map(|(_, jl)| policy.clone().with_max_seq_len(jl.min(cap)));
    let policy = match shared {
        Some((pl, _)) => policy.with_max_seq_len(pl.min(cap)),
        None => policy,
    };
    let policy = with_adapters(policy, &exp.policy.model, seed, "policy-lora");
    let judge = match exp.judge.model() {
        None => None,
        Some(j) => {
            let judge = match (&j.model, base) {
                // A from-scratch judge reads the policy's tokenizer.
                (ModelSource::Scratch(m), _) => scratch_config(m, tok.vocab_size())
                    .init_seeded::<B>(device, &mut Rng::derive(seed, "judge-init"))
                    .context("judge model config")?,
                (_, Some(base)) => base,
                (source, None) => {
                    let (judge, judge_tok) = build_model::<B>(source, seed, "judge-init", device)
                        .context("judge model")?;
                    if !same_tokenizer(tok.as_ref(), judge_tok.as_ref()) {
                        return Err(UsageError(
                            "the judge's pretrained model brings a different tokenizer from the \
                             policy's; this version needs one tokenizer for both (the same \
                             pretrained family, or a from-scratch judge, which reads the \
                             policy's)"
                                .into(),
                        )
                        .into());
                    }
                    judge
                }
            };
            Some(with_adapters(judge, &j.model, seed, "judge-lora"))
        }
    };
    let parts = Components {
        env: env.as_ref(),
        tok: tok.as_ref(),
        policy,
        judge,
        proposer: build_proposer(exp, env.difficulty_space().len()),
    };
    f(parts)
}

/// One line per finished run.
pub fn print_summary(exp: &Experiment, seed: u64, dir: &Path, s: &RunSummary, wall_s: f64) {
    println!("{}", summary_line(exp, seed, dir, s, wall_s));
}

/// The summary line of a finished (or stopped) run.
pub fn summary_line(
    exp: &Experiment,
    seed: u64,
    dir: &Path,
    s: &RunSummary,
    wall_s: f64,
) -> String {
    let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.3}"));
    format!(
        "{} seed {seed}: {} at step {} in {:.1}s{}{} | eval in-domain {} -> {} | OOD {} -> {} | {}",
        exp.name,
        if s.interrupted { "stopped" } else { "finished" },
        s.last_step,
        wall_s,
        match s.warm_cached {
            0 => String::new(),
            n => format!(
                " ({n} warm start{} from the cache)",
                if n > 1 { "s" } else { "" }
            ),
        },
        match (s.env_failed_calls, s.env_failed_episodes) {
            (0, 0) => String::new(),
            (c, e) => format!(
                " | the environment failed {c} call{} and ended {e} episode{} (scored unsolved)",
                if c == 1 { "" } else { "s" },
                if e == 1 { "" } else { "s" }
            ),
        },
        f(s.acc_id_start),
        f(s.acc_id_end),
        f(s.acc_ood_start),
        f(s.acc_ood_end),
        dir.display()
    )
}

/// `meta.json` of a run.
pub fn meta_json(exp: &Experiment, seed: u64, file: &Path) -> serde_json::Value {
    let git_sha = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut meta = serde_json::json!({
        "experiment": exp.name,
        "file": file.display().to_string(),
        "seed": seed,
        "backend": format!("{:?}", exp.backend),
        "git_sha": git_sha,
        // The commit the binary was built from (its build script's HEAD): differs from
        // `git_sha` when a binary is run on a checkout that has moved on.
        "binary_commit": env!("RLANY_BUILD_COMMIT"),
        "cargo_lock_sha256": rlany_framework::digest::content_key(include_bytes!("../../Cargo.lock")),
        "start_unix_s": now,
        "start_utc": utc(now),
        "rlany_version": env!("CARGO_PKG_VERSION"),
    });
    let bases = pretrained_digests(exp);
    if !bases.is_empty() {
        meta["pretrained_sha256"] = serde_json::json!(bases);
    }
    meta
}

/// SHA-256 of every pretrained source the experiment reads, by path (unreadable ones left
/// out: a missing model is reported before any run starts).
pub fn pretrained_digests(exp: &Experiment) -> std::collections::BTreeMap<String, String> {
    let judge = exp.judge.model().map(|j| &j.model);
    std::iter::once(&exp.policy.model)
        .chain(judge)
        .filter_map(|s| match s {
            ModelSource::Pretrained(p) => pretrained::digest(Path::new(&p.path))
                .ok()
                .map(|d| (p.path.clone(), d)),
            ModelSource::Scratch(_) => None,
        })
        .collect()
}

/// A resumed run whose pretrained base changed since it started is refused (its
/// checkpoints do not hold the frozen base; `meta.json` holds the base's SHA-256).
fn check_bases(exp: &Experiment, run_dir: &Path) -> Result<()> {
    let now = pretrained_digests(exp);
    if now.is_empty() {
        return Ok(());
    }
    let meta: serde_json::Value = std::fs::read(run_dir.join("meta.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    match meta["pretrained_sha256"]
        .as_object()
        .and_then(|then| pretrained::changed_base(then, &now))
    {
        Some(why) => Err(UsageError(format!("--resume {}: {why}", run_dir.display())).into()),
        None => Ok(()),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` from Unix seconds (Howard Hinnant's civil-from-days).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    /// A run's relative model path is found from the folder the run was started in, whatever
    /// the current folder: the run directory's enclosing folders are searched.
    #[test]
    fn a_run_s_relative_model_path_is_found_from_its_own_folders() {
        let root = std::env::temp_dir().join(format!("rlany-from-run-{}", std::process::id()));
        let rel = "pretrained-here/rlany-test-model.gguf";
        std::fs::create_dir_all(root.join("pretrained-here")).expect("dir");
        std::fs::write(root.join(rel), b"x").expect("file");
        let run = root.join("runs/exp/seed-1");
        std::fs::create_dir_all(&run).expect("run dir");
        let spec = |path: &str| {
            ModelSource::Pretrained(
                ron::from_str(&format!("(path: {path:?})")).expect("a pretrained spec"),
            )
        };
        let mut source = spec(rel);
        from_run_dir(&mut source, &run);
        let ModelSource::Pretrained(p) = &source else {
            panic!("{source:?}")
        };
        assert!(
            Path::new(&p.path).is_absolute() && Path::new(&p.path).exists(),
            "{p:?}"
        );
        // A path found nowhere is left as it was (its own error names it).
        let mut missing = spec("pretrained-here/none.gguf");
        from_run_dir(&mut missing, &run);
        assert_eq!(missing, spec("pretrained-here/none.gguf"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn backend_names() {
        assert_eq!(parse_backend("cuda:2").expect("ok"), BackendKind::Cuda(2));
        assert_eq!(parse_backend("NdArray").expect("ok"), BackendKind::NdArray);
        assert_eq!(parse_backend("flex").expect("ok"), BackendKind::Flex);
        assert!(parse_backend("tpu").is_err());
    }
}
