//! `rlany ablate SUITE_DIR`: every experiment file of a suite (rows in file-name order) for
//! every seed, into `RUNS_DIR/<suite>/<experiment>/seed-<n>/`, then the suite's report.
//!
//! - Runs go seed by seed (all rows of seed 1 first), so a partial suite already holds paired
//!   comparisons.
//! - Identical warm starts are computed once (`RUNS_DIR/.warm-cache`, see
//!   `rlany_framework::warmcache`).
//! - Interrupt it at any point and run the same command again: finished runs are skipped, an
//!   interrupted run resumes from its latest checkpoint (writing exactly what an uninterrupted
//!   run writes), and a run killed before its first checkpoint (during its warm start) is
//!   removed and started again.
//! - `--jobs N` runs N runs at once (threads taking jobs from one queue: a free worker starts
//!   the next seed no one is running, and at the end of the suite helps with the rows of a
//!   seed already started; warm starts are still computed once, see `next_job`). Every run
//!   is a function of its seed and settings alone: the metrics do not depend on N.
//! - One progress display over the whole suite, one summary line per finished run.
//! - A run whose judge fails its gate (`judge.gate`) is not a failure of the suite: it is
//!   reported as gated out, its step-0 metrics kept as `gated.jsonl` beside its resolved file
//!   (so no report counts it as a run), and the other runs go on.

use crate::{Experiment, UsageError, WARM_CACHE, meta_json, overrides, run as run_seed};
use anyhow::{Context, Result};
use rlany_framework::checkpoint;
use rlany_framework::progress;
use rlany_framework::{BackendKind, StepObserver, TrainOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What `rlany ablate` was asked to do.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// The folder of experiment files.
    pub suite: PathBuf,
    /// Seeds for every row (`None`: each file's own list).
    pub seeds: Option<Vec<u64>>,
    /// Backend override.
    pub backend: Option<BackendKind>,
    /// `--set` overrides applied to every row.
    pub sets: Vec<String>,
    /// Where `<suite>/` goes.
    pub runs_dir: PathBuf,
    /// Draw the suite's progress bar.
    pub progress: bool,
    /// Share warm starts.
    pub warm_cache: bool,
    /// Seeds run at once (threads).
    pub jobs: usize,
}

/// One row of the suite: its file and its experiment (overrides applied).
#[derive(Debug, Clone)]
pub struct Row {
    /// The experiment file.
    pub file: PathBuf,
    /// The experiment it describes, `--set` and `--backend` applied.
    pub exp: Experiment,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// No run directory yet.
    Fresh,
    /// A directory without any checkpoint: killed during its warm start; start it again.
    Stale,
    /// A checkpoint before the last step: resume.
    Interrupted(usize),
    /// Its checkpoint is at the last step.
    Finished,
}

/// Where the run in `dir` of an experiment with `steps` training steps stands.
pub fn run_state(dir: &Path, steps: usize) -> RunState {
    if !dir.exists() {
        return RunState::Fresh;
    }
    let Some(latest) = checkpoint::latest(&dir.join("checkpoints")) else {
        return RunState::Stale;
    };
    let step = latest
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    if step >= steps {
        RunState::Finished
    } else {
        RunState::Interrupted(step)
    }
}

/// The suite's rows: every `.ron` file directly in `dir`, in file-name order, loaded,
/// overridden and validated before anything runs.
pub fn rows(o: &SuiteOptions) -> Result<Vec<Row>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(&o.suite)
        .with_context(|| format!("reading the suite folder {}", o.suite.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(UsageError(format!("{}: no .ron experiment file", o.suite.display())).into());
    }
    let mut rows = Vec::new();
    let mut applied = vec![false; o.sets.len()];
    for file in files {
        let (mut exp, skipped) =
            overrides::apply_where_present(&Experiment::load(&file)?, &o.sets, true)
                .map_err(|e| UsageError(format!("{}: {e}", file.display())))?;
        for (i, a) in applied.iter_mut().enumerate() {
            *a |= !skipped.contains(&i);
        }
        if let Some(b) = o.backend {
            exp.backend = b;
        }
        if let Some(seeds) = &o.seeds {
            exp.seeds = seeds.clone();
        }
        rows.push(Row { file, exp });
    }
    if let Some(i) = applied.iter().position(|a| !a) {
        return Err(UsageError(format!(
            "--set {:?}: no row of {} has this field",
            o.sets[i],
            o.suite.display()
        ))
        .into());
    }
    let mut names: Vec<&str> = rows.iter().map(|r| r.exp.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(UsageError(format!("two rows of the suite are named {:?}", w[0])).into());
    }
    Ok(rows)
}

/// Runs the suite, then writes its report into its runs folder.
pub fn ablate(o: &SuiteOptions) -> Result<()> {
    let rows = rows(o)?;
    let suite_name = o
        .suite
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("suite")
        .to_string();
    let out = o.runs_dir.join(&suite_name);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    write_suite_json(&out, &rows)?;
    let cache = o.runs_dir.join(WARM_CACHE);
    clean_stale_tmp(&cache);

    // Seed by seed, every row of a seed before the next seed.
    let mut seeds: Vec<u64> = rows.iter().flat_map(|r| r.exp.seeds.clone()).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let jobs: Vec<(u64, &Row)> = seeds
        .iter()
        .flat_map(|&s| {
            rows.iter()
                .filter(move |r| r.exp.seeds.contains(&s))
                .map(move |r| (s, r))
        })
        .collect();
    let units: u64 = jobs
        .iter()
        .map(|(_, r)| r.exp.budget.steps as u64 + 1)
        .sum();
    let bar = Arc::new(Mutex::new(progress::bar(units, "suite", o.progress)));
    let say = |line: &str| match bar.lock() {
        Ok(b) => b.println(line),
        Err(_) => println!("{line}"),
    };
    let workers = o.jobs.clamp(1, seeds.len().max(1));
    say(&format!(
        "suite {suite_name}: {} rows × {} seeds = {} runs into {} ({workers} at a time)",
        rows.len(),
        seeds.len(),
        jobs.len(),
        out.display()
    ));
    let run_job = |k: usize, seed: u64, row: &Row| -> Result<()> {
        let exp = &row.exp;
        let dir = out.join(&exp.name).join(format!("seed-{seed}"));
        let state = run_state(&dir, exp.budget.steps);
        let before = match state {
            RunState::Finished => exp.budget.steps as u64 + 1,
            RunState::Interrupted(step) => step as u64 + 1,
            RunState::Fresh | RunState::Stale => 0,
        };
        if let Ok(mut b) = bar.lock() {
            b.set_message(format!(
                "[{}/{}] {} seed {seed}",
                k + 1,
                jobs.len(),
                exp.name
            ));
            b.inc(before);
        }
        if state == RunState::Finished {
            say(&format!(
                "{} seed {seed}: finished earlier, skipped",
                exp.name
            ));
            return Ok(());
        }
        if let RunState::Interrupted(step) = state {
            say(&format!(
                "{} seed {seed}: interrupted, resuming from its checkpoint at step {step}",
                exp.name
            ));
        }
        if state == RunState::Stale {
            say(&format!(
                "{} seed {seed}: no checkpoint (killed during its warm start), starting again",
                exp.name
            ));
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let observer = {
            let bar = Arc::clone(&bar);
            StepObserver(Arc::new(move |_, _| {
                if let Ok(mut b) = bar.lock() {
                    b.inc(1);
                }
            }))
        };
        let opts = TrainOptions {
            run_dir: dir.clone(),
            resume: matches!(state, RunState::Interrupted(_)),
            stop_after: None,
            progress: false,
            log_lines: !o.progress,
            meta: meta_json(exp, seed, &row.file),
            warm_cache: o.warm_cache.then(|| cache.clone()),
            checkpoint: None,
            placement: Default::default(),
            observer: Some(observer),
        };
        let started = std::time::Instant::now();
        let summary = match run_seed(exp, seed, &opts) {
            Ok(summary) => summary,
            Err(e) if gated(&e) => {
                // A precondition of the row, not a failure of the suite: the run's step-0
                // metrics are kept as `gated.jsonl` (no report reads them as a run) and the
                // other runs go on.
                let metrics = dir.join("metrics.jsonl");
                std::fs::rename(&metrics, dir.join("gated.jsonl"))
                    .with_context(|| format!("setting aside {}", metrics.display()))?;
                say(&format!(
                    "{} seed {seed}: gated out, not trained: {e:#}",
                    exp.name
                ));
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("run {}", dir.display())),
        };
        say(&crate::summary_line(
            exp,
            seed,
            &dir,
            &summary,
            started.elapsed().as_secs_f64(),
        ));
        Ok(())
    };
    // Workers take jobs from one queue (see `next_job`) until none is left or one failed.
    let queue = Mutex::new(vec![JobState::Pending; jobs.len()]);
    let job_seeds: Vec<u64> = jobs.iter().map(|(s, _)| *s).collect();
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (run_job, jobs, queue, job_seeds) = (&run_job, &jobs, &queue, &job_seeds);
                scope.spawn(move || -> Result<()> {
                    loop {
                        let k = {
                            let mut states = queue
                                .lock()
                                .map_err(|_| anyhow::anyhow!("the suite's queue was poisoned"))?;
                            match next_job(&states, job_seeds) {
                                Some(k) => {
                                    states[k] = JobState::Running;
                                    k
                                }
                                None => return Ok(()),
                            }
                        };
                        let (seed, row) = jobs[k];
                        let result = run_job(k, seed, row);
                        if let Ok(mut states) = queue.lock() {
                            states[k] = if result.is_ok() {
                                JobState::Done
                            } else {
                                // Stop the other workers after their current run.
                                states.iter_mut().for_each(|s| {
                                    if *s == JobState::Pending {
                                        *s = JobState::Cancelled;
                                    }
                                });
                                JobState::Failed
                            };
                        }
                        result?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a suite worker panicked")))
            })
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    if let Ok(b) = bar.lock() {
        b.finish_and_clear();
    }
    let report = rlany_reports::write_report(
        std::slice::from_ref(&out),
        &rlany_reports::ReportOptions {
            title: Some(format!("Ablation suite `{suite_name}`")),
            ..rlany_reports::ReportOptions::new(out.clone())
        },
    )?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    println!("{}", report.table);
    println!("wrote {}", report.report.display());
    Ok(())
}

/// Where one (seed, row) job of the suite stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Pending,
    Running,
    Done,
    Failed,
    Cancelled,
}

/// The job a free worker takes next, of jobs in suite order (seed by seed, rows in order);
/// `seeds[k]` is job k's seed.
///
/// The first pending job of a seed no worker is running; when every pending job's seed is
/// being run, the first pending job (so a suite whose seeds do not divide among the workers
/// still keeps them all busy at its end). A seed's first row computes the warm starts its
/// later rows load: a later row started beside it waits for them (`WarmCache::claim`) and
/// then loads them instead of computing them again.
fn next_job(states: &[JobState], seeds: &[u64]) -> Option<usize> {
    let pending = |k: &usize| states[*k] == JobState::Pending;
    let busy = |k: usize| {
        (0..states.len()).any(|j| states[j] == JobState::Running && seeds[j] == seeds[k])
    };
    (0..states.len())
        .filter(pending)
        .find(|&k| !busy(k))
        .or_else(|| (0..states.len()).find(pending))
}

/// Whether a run stopped at its judge's gate (`judge.gate`).
fn gated(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<rlany_framework::TrainError>(),
            Some(rlany_framework::TrainError::JudgeGate { .. })
        )
    })
}

/// `suite.json`: the rows in order with their baselines (the row above unless the file
/// names another) and further comparisons (`compare`), for the report.
fn write_suite_json(out: &Path, rows: &[Row]) -> Result<()> {
    let list: Vec<serde_json::Value> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let baseline = match &r.exp.baseline {
                Some(b) => Some(b.clone()),
                None if i > 0 => Some(rows[i - 1].exp.name.clone()),
                None => None,
            };
            let mut row = serde_json::json!({
                "experiment": r.exp.name,
                "file": r.file.display().to_string(),
                "baseline": baseline,
            });
            if !r.exp.compare.is_empty() {
                row["compare"] = serde_json::json!(r.exp.compare);
            }
            row
        })
        .collect();
    let path = out.join("suite.json");
    let text = serde_json::to_string_pretty(&serde_json::json!({ "rows": list }))?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Removes temporary cache entries that killed runs left behind (`.tmp-<key>-<pid>` whose
/// process is gone; a live process may still be writing its own).
fn clean_stale_tmp(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(".tmp-")
            .and_then(|rest| rest.rsplit('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            let alive = Path::new("/proc").join(pid.to_string()).exists();
            if !alive || pid == std::process::id() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_judge_gate_is_told_apart_from_other_failures() {
        use rlany_framework::TrainError;
        let gate = TrainError::JudgeGate {
            metric: "judge/eval_bal_acc/borderline".into(),
            value: Some(0.6),
            min: 0.8,
            max: 0.95,
        };
        let wrapped = anyhow::Error::from(gate).context("run runs/x/seed-1");
        assert!(gated(&wrapped));
        assert!(format!("{wrapped:#}").contains("is 0.6000 at step 0, the gate is [0.8, 0.95]"));
        let other = TrainError::NonFinite {
            step: 3,
            what: "policy loss".into(),
        };
        assert!(!gated(
            &anyhow::Error::from(other).context("run runs/x/seed-1")
        ));
    }

    #[test]
    fn run_states() {
        let root = std::env::temp_dir().join(format!("rlany-suite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("x/seed-1");
        assert_eq!(run_state(&dir, 10), RunState::Fresh);
        std::fs::create_dir_all(&dir).expect("dir");
        assert_eq!(run_state(&dir, 10), RunState::Stale);
        let ck = dir.join("checkpoints");
        for (step, want) in [(4, RunState::Interrupted(4)), (10, RunState::Finished)] {
            let name = checkpoint::step_dir_name(step);
            std::fs::create_dir_all(ck.join(&name)).expect("ckpt");
            std::fs::write(ck.join(&name).join("state.json"), "{}").expect("state");
            std::fs::write(ck.join("latest"), &name).expect("latest");
            assert_eq!(run_state(&dir, 10), want);
        }
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn the_queue_takes_fresh_seeds_first_then_helps_with_started_ones() {
        use JobState::*;
        // 3 seeds × 2 rows, in suite order.
        let seeds = [1, 1, 2, 2, 3, 3];
        let mut st = [Pending; 6];
        assert_eq!(next_job(&st, &seeds), Some(0));
        st[0] = Running;
        // Not seed 1's second row: seed 2 is untouched.
        assert_eq!(next_job(&st, &seeds), Some(2));
        st[2] = Running;
        st[0] = Done;
        assert_eq!(next_job(&st, &seeds), Some(1), "seed 1 is free again");
        st[1] = Done;
        st[2] = Done;
        st[3] = Running;
        assert_eq!(next_job(&st, &seeds), Some(4));
        st[4] = Running;
        st[3] = Done;
        // Only seed 3's second row is left and seed 3 is running: help with it.
        assert_eq!(next_job(&st, &seeds), Some(5));
        st[5] = Running;
        assert_eq!(next_job(&st, &seeds), None);
        // Cancelled jobs are never taken.
        assert_eq!(next_job(&[Cancelled, Failed, Done], &[1, 1, 1]), None);
    }
}
