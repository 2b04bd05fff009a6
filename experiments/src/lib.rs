//! # rlany
//!
//! The composition root. `rlany` (the binary) is a thin wrapper over [`cli_main`]. It reads
//! an experiment file, builds the concrete environment, tokenizer, models and difficulty
//! proposer it names, picks the backend, and hands them to the framework's closed loop.

mod bench;

use anyhow::{Context, Result};
use burn::backend::Autodiff;
use clap::{Parser, Subcommand};
use rlany_envs::gp::{Acquisition as GpAcquisition, Gp, GpConfig};
use rlany_envs::{Arith, ArithConfig};
use rlany_framework::adapt::{self, Proposer};
use rlany_framework::experiment::{self, Adaptation, EnvironmentSpec};
use rlany_framework::{
    BackendKind, Components, Environment, Experiment, ExperimentError, Rng, RunSummary,
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
        /// Override the experiment's backend: ndarray, wgpu, cuda or cuda:N.
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
    },
    /// Benchmark workloads of bench/SPEC.md (`--kernels`: the fused log-prob / KL kernels).
    Bench {
        #[command(flatten)]
        args: bench::BenchArgs,
    },
    /// Tables from run directories: the ablation table (mean ± 95% CI over seeds per experiment).
    Report {
        /// Run directories, or folders holding them (e.g. `runs/`).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also write `report.md` into this folder.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Validate experiment files without running them; print the resolved experiment.
    Check {
        /// Experiment files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only report errors.
        #[arg(long, short)]
        quiet: bool,
    },
}

/// Runs the command line `args` (program name first) and returns the process exit code:
/// 0 on success, 2 on bad input (experiment file, option), 1 on a failure while running.
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
            // Bad input (an experiment file, an option) exits 2; failures while running, 1.
            let bad_input = e
                .chain()
                .any(|c| c.is::<ExperimentError>() || c.is::<UsageError>());
            if bad_input { 2 } else { 1 }
        }
    }
}

/// A command-line value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench { args } => bench::run(args),
        Command::Report { paths, out } => {
            let runs = rlany_reports::collect(&paths)?;
            let table = rlany_reports::ablation_table(&runs);
            println!("{table}");
            if let Some(dir) = out {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let path = dir.join("report.md");
                let text = format!(
                    "# Report\n\n{} runs from {}.\n\n{table}",
                    runs.len(),
                    paths
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Command::Check { files, quiet } => {
            let mut failed = None;
            for f in &files {
                match Experiment::load(f) {
                    Ok(exp) => {
                        if quiet {
                            println!("{}: ok", f.display());
                        } else {
                            println!("// {}: ok\n{}", f.display(), exp.to_ron());
                        }
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        failed = Some(e);
                    }
                }
            }
            match failed {
                Some(e) => Err(anyhow::Error::new(e).context(format!(
                    "{} of {} files invalid",
                    files.len(),
                    files.len()
                ))),
                None => Ok(()),
            }
        }
        Command::Run {
            file,
            backend,
            seed,
            resume,
            runs_dir,
            stop_after,
            no_progress,
        } => {
            let mut exp = Experiment::load(&file)?;
            if let Some(b) = backend {
                exp.backend = parse_backend(&b)?;
            }
            let seeds = match (seed, &resume) {
                (Some(s), _) => vec![s],
                (None, Some(dir)) => vec![seed_of_run_dir(dir)?],
                (None, None) => exp.seeds.clone(),
            };
            for s in seeds {
                let run_dir = match &resume {
                    Some(d) => d.clone(),
                    None => runs_dir.join(&exp.name).join(format!("seed-{s}")),
                };
                let opts = TrainOptions {
                    run_dir: run_dir.clone(),
                    resume: resume.is_some(),
                    stop_after,
                    progress: !no_progress,
                    log_lines: true,
                    meta: meta_json(&exp, s, &file),
                };
                let started = std::time::Instant::now();
                let summary =
                    run(&exp, s, &opts).with_context(|| format!("run {}", run_dir.display()))?;
                print_summary(&exp, s, &run_dir, &summary, started.elapsed().as_secs_f64());
            }
            Ok(())
        }
    }
}

fn parse_backend(s: &str) -> Result<BackendKind> {
    let lower = s.to_ascii_lowercase();
    Ok(match lower.as_str() {
        "ndarray" | "cpu" => BackendKind::NdArray,
        "wgpu" => BackendKind::Wgpu,
        "cuda" => BackendKind::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => BackendKind::Cuda(n),
            _ => {
                return Err(UsageError(format!(
                    "--backend {s:?}: expected ndarray, wgpu, cuda or cuda:N"
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
                "--resume {}: expected a run directory named seed-<n>",
                dir.display()
            ))
            .into()
        })
}

/// Runs (or resumes) one seed of `exp` on the backend it names.
pub fn run(exp: &Experiment, seed: u64, opts: &TrainOptions) -> Result<RunSummary> {
    match exp.backend {
        BackendKind::NdArray => {
            type B = Autodiff<burn::backend::NdArray<f32>>;
            run_seed::<B>(exp, seed, &Default::default(), opts)
        }
        BackendKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                type B = Autodiff<burn::backend::Wgpu>;
                run_seed::<B>(exp, seed, &Default::default(), opts)
            }
            #[cfg(not(feature = "wgpu"))]
            Err(UsageError(
                "backend Wgpu is not compiled in: rebuild with `--features wgpu`".into(),
            )
            .into())
        }
        BackendKind::Cuda(index) => {
            #[cfg(feature = "cuda")]
            {
                type B = Autodiff<burn::backend::Cuda>;
                run_seed::<B>(
                    exp,
                    seed,
                    &burn::backend::cuda::CudaDevice::new(index),
                    opts,
                )
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = index;
                Err(UsageError(
                    "backend Cuda is not compiled in: rebuild with `--features cuda`".into(),
                )
                .into())
            }
        }
    }
}

/// The concrete environment an experiment names.
pub fn build_environment(exp: &Experiment) -> Box<dyn Environment> {
    match &exp.environment {
        EnvironmentSpec::Arith(a) => Box::new(Arith::new(ArithConfig {
            max_operands: a.max_operands,
            max_digits: a.max_digits,
        })),
    }
}

/// The policy's transformer config.
pub fn policy_config(exp: &Experiment, vocab: usize) -> TransformerConfig {
    let p = &exp.policy;
    TransformerConfig::new(
        vocab,
        p.d_model,
        p.layers,
        p.heads,
        p.kv_heads,
        p.ffn,
        p.max_seq_len,
    )
    .with_qkv_bias(p.qkv_bias)
}

/// The judge's transformer config, when the experiment has a judge.
pub fn judge_config(exp: &Experiment, vocab: usize) -> Option<TransformerConfig> {
    exp.judge.model().map(|j| {
        TransformerConfig::new(
            vocab,
            j.d_model,
            j.layers,
            j.heads,
            j.kv_heads,
            j.ffn,
            j.max_seq_len,
        )
        .with_qkv_bias(j.qkv_bias)
    })
}

/// The difficulty proposer an experiment names.
pub fn build_proposer(exp: &Experiment) -> Box<dyn Proposer> {
    match &exp.adaptation {
        Adaptation::Static => Box::new(adapt::Static),
        Adaptation::Threshold(t) => Box::new(adapt::Threshold { step: t.step }),
        Adaptation::Gp(g) => Box::new(Gp::new(GpConfig {
            target: g.target,
            band: g.band,
            acquisition: match &g.acquisition {
                experiment::Acquisition::Nearest => GpAcquisition::Nearest,
                experiment::Acquisition::Ucb(u) => GpAcquisition::Ucb { beta: u.beta },
            },
            candidates: g.candidates,
            total_steps: exp.budget.steps,
            max_observations: g.max_observations,
            ..GpConfig::default()
        })),
    }
}

fn run_seed<B: rlany_kernels::AutodiffLogProbOps>(
    exp: &Experiment,
    seed: u64,
    device: &B::Device,
    opts: &TrainOptions,
) -> Result<RunSummary> {
    let env = build_environment(exp);
    let tok = CharTokenizer::new();
    let vocab = rlany_framework::Tokenizer::vocab_size(&tok);
    // Every initial weight is drawn from a stream of the run's seed (never Burn's global RNG).
    let policy = policy_config(exp, vocab)
        .init_seeded::<B>(device, &mut Rng::derive(seed, "policy-init"))
        .context("policy model config")?;
    let judge = match judge_config(exp, vocab) {
        Some(cfg) => Some(
            cfg.init_seeded::<B>(device, &mut Rng::derive(seed, "judge-init"))
                .context("judge model config")?,
        ),
        None => None,
    };
    let parts = Components {
        env: env.as_ref(),
        tok: &tok,
        policy,
        judge,
        proposer: build_proposer(exp),
    };
    Ok(train::<B, Transformer<B>>(exp, seed, parts, device, opts)?)
}

fn print_summary(exp: &Experiment, seed: u64, dir: &Path, s: &RunSummary, wall_s: f64) {
    let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.3}"));
    println!(
        "{} seed {seed}: {} at step {} in {:.1}s | eval in-domain {} -> {} | OOD {} -> {} | {}",
        exp.name,
        if s.interrupted { "stopped" } else { "finished" },
        s.last_step,
        wall_s,
        f(s.acc_id_start),
        f(s.acc_id_end),
        f(s.acc_ood_start),
        f(s.acc_ood_end),
        dir.display()
    );
}

fn meta_json(exp: &Experiment, seed: u64, file: &Path) -> serde_json::Value {
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
    serde_json::json!({
        "experiment": exp.name,
        "file": file.display().to_string(),
        "seed": seed,
        "backend": format!("{:?}", exp.backend),
        "git_sha": git_sha,
        "cargo_lock_fnv64": format!("{:016x}", fnv64(include_bytes!("../../Cargo.lock"))),
        "start_unix_s": now,
        "start_utc": utc(now),
        "rlany_version": env!("CARGO_PKG_VERSION"),
    })
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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

    #[test]
    fn backend_names() {
        assert_eq!(parse_backend("cuda:2").expect("ok"), BackendKind::Cuda(2));
        assert_eq!(parse_backend("NdArray").expect("ok"), BackendKind::NdArray);
        assert!(parse_backend("tpu").is_err());
    }
}
