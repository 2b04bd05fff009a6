//! `rlany env`: shows exactly what the agent sees — a sampled task, the expert's trajectory
//! with the environment's observations and oracle labels, and the difficulty dimensions.
//! A process environment (`rlany env process -- python3 my_env.py`, or an experiment file
//! naming one) is first put through the protocol's conformance checks
//! (`rlany_envs::process::conformance`); a failed check is an error. `--check` runs the
//! environment contract's checks on any environment (`rlany_envs::conformance`) and stops.

use crate::plugins::{EnvironmentSpec, environment_names};
use crate::{Experiment, UsageError};
use anyhow::Result;
use rlany_framework::Split;
use rlany_framework::plugin::EnvironmentChoice;
use rlany_framework::rollout::replay_demonstration;
use std::path::Path;

/// The options of `rlany env`.
#[derive(clap::Args, Debug)]
pub struct EnvArgs {
    /// An environment plugin (e.g. `arith`, default settings) or an experiment file (.ron,
    /// its environment settings).
    pub name: String,
    /// The difficulty, one value in [0, 1] per dimension, comma-separated (default: the
    /// settings' starting difficulty).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub difficulty: Vec<f64>,
    /// The task's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// train, eval or ood.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// The expert's slip probability (0: the expert; the warm start uses the experiment's
    /// `policy.warm_start.noise`).
    #[arg(long, default_value_t = 0.0)]
    pub noise: f64,
    /// Run the environment contract's conformance checks (any environment) and stop: an
    /// error when one fails.
    #[arg(long)]
    pub check: bool,
    /// For `process`: the command that starts the environment, after `--` (no shell),
    /// e.g. `rlany env process -- python3 environments/process/reference.py`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Prints the conformance checks of a process environment; an error when one failed.
fn conformance(spec: &rlany_envs::ProcessSpec) -> Result<()> {
    println!(
        "conformance checks of `{}` (protocol 1):",
        spec.command.join(" ")
    );
    let failed = print_checks(&rlany_envs::process::conformance::run(spec));
    if failed > 0 {
        anyhow::bail!(
            "the environment process `{}` failed {failed} of the protocol's conformance checks \
             (environments/process/PROTOCOL.md)",
            spec.command.join(" ")
        );
    }
    println!();
    Ok(())
}

/// One line per check; how many failed.
fn print_checks(checks: &[rlany_envs::conformance::Check]) -> usize {
    for c in checks {
        println!(
            "  {:<5} {:<14} {}",
            if c.ok { "ok" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    checks.iter().filter(|c| !c.ok).count()
}

/// The environment settings `name` stands for.
fn settings(name: &str) -> Result<EnvironmentSpec> {
    if name.ends_with(".ron") {
        return Ok(Experiment::load(Path::new(name))?.environment);
    }
    let names = environment_names();
    let known = names
        .iter()
        .find(|e| e.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<String> = names.iter().map(|e| e.to_lowercase()).collect();
            UsageError(format!(
                "unknown environment `{name}`: expected one of {} or an experiment file (.ron)",
                names.join(", ")
            ))
        })?;
    EnvironmentSpec::default_of(known)
        .map_err(|e| UsageError(format!("default settings of `{known}`: {e}")).into())
}

/// `rlany env`.
pub fn run(args: &EnvArgs) -> Result<()> {
    let mut spec = settings(&args.name)?;
    // `rlany env process -- COMMAND`: the starting difficulty is unknown before the child
    // describes its dimensions (the middle of each is shown).
    let mut unknown_start = false;
    match &mut spec {
        EnvironmentSpec::Process(p) => {
            if !args.command.is_empty() {
                p.command = args.command.clone();
            }
            if p.difficulty.is_empty() {
                p.difficulty = vec![0.5];
                unknown_start = true;
            }
        }
        _ if !args.command.is_empty() => {
            return Err(UsageError(format!(
                "a command after `--` is for `process`, not `{}`",
                args.name
            ))
            .into());
        }
        _ => {}
    }
    spec.plugin()
        .validate()
        .map_err(|e| UsageError(format!("environment.{}: {}", e.field, e.message)))?;
    if let EnvironmentSpec::Process(p) = &spec {
        conformance(p)?;
        if args.check {
            return Ok(());
        }
    }
    let env = spec.plugin().build();
    if let Some(fault) = env.fault() {
        anyhow::bail!("environment: {fault}");
    }
    if args.check {
        println!("conformance checks of `{}`:", args.name);
        let compiled = rlany_envs::conformance::Compiled(env.as_ref());
        let failed = print_checks(&rlany_envs::conformance::run(&compiled));
        if failed > 0 {
            anyhow::bail!(
                "`{}` failed {failed} of the environment contract's conformance checks",
                args.name
            );
        }
        return Ok(());
    }
    let dims = env.difficulty_space();
    let d = if !args.difficulty.is_empty() {
        args.difficulty.clone()
    } else if unknown_start {
        vec![0.5; dims.len()]
    } else {
        spec.plugin().start_difficulty()
    };
    if d.len() != dims.len() || d.iter().any(|x| !(0.0..=1.0).contains(x)) {
        return Err(UsageError(format!(
            "--difficulty needs {} values in [0, 1] ({}), got {:?}",
            dims.len(),
            dims.iter()
                .map(|x| x.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            d
        ))
        .into());
    }
    let split = match args.split.to_ascii_lowercase().as_str() {
        "train" => Split::Train,
        "eval" => Split::Eval,
        "ood" => Split::Ood,
        other => {
            return Err(UsageError(format!(
                "unknown split `{other}`: expected train, eval or ood"
            ))
            .into());
        }
    };
    println!("difficulty dimensions (0 → 1):");
    for (x, dim) in d.iter().zip(&dims) {
        println!(
            "  {:<12} {:>5.2}   ({} at 0, {} at 1)",
            dim.name, x, dim.lo, dim.hi
        );
    }
    println!("in-domain eval grid levels: {:?}", env.eval_levels());
    let ep = env.sample(&d, split, args.seed);
    if let Some(text) = ep.instructions() {
        println!(
            "\nwhat a pretrained chat model is told first (its user message, before the task):"
        );
        println!("{text}");
    }
    println!("\nsplit {split:?}, seed {} — the prompt:", args.seed);
    print!("{}", ep.prompt());
    if split != Split::Train {
        println!("\n(expert trajectories are shown for the training split: --split train)");
        return Ok(());
    }
    let demo = replay_demonstration(env.as_ref(), &d, args.noise, args.seed);
    println!(
        "\nthe expert's trajectory (slip probability {}): step | action | observation | oracle | dims exercised",
        args.noise
    );
    for (i, step) in demo.steps.iter().enumerate() {
        let names: Vec<&str> = step
            .dims
            .iter()
            .filter_map(|&j| dims.get(j).map(|x| x.name.as_str()))
            .collect();
        println!(
            "{:>4} | {:<24} | {:<10} | {} | {}",
            i + 1,
            step.text,
            step.observation.trim_end(),
            if step.oracle { "right" } else { "wrong" },
            names.join(",")
        );
    }
    println!(
        "\noutcome: {}",
        if demo.outcome { "solved" } else { "failed" }
    );
    Ok(())
}
