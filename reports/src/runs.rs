//! Reading run directories: `metrics.jsonl`, `meta.json`, `adaptation.jsonl` and
//! `posterior.jsonl`, tolerating what a killed run leaves behind.
//!
//! JSON-lines rule (every file): blank lines are ignored; a last line that does not parse is a
//! write cut short by a kill, so it is skipped with a warning naming `file:line`; any other line
//! that does not parse (or lacks what the trainer always writes, e.g. `step`) is an error naming
//! `file:line`. Values written as `null` (non-finite at run time) are kept as "null", never as a
//! number.

use crate::error::{ReportError, io};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsLine {
    /// Training step (0 = after the warm start).
    pub step: u64,
    /// Every numeric key of the line; `None` where the trainer wrote `null` (non-finite).
    pub values: BTreeMap<String, Option<f64>>,
}

/// The final logged value of a metric in one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Final {
    /// The key is in no line.
    Absent,
    /// The last line with the key has `null` (a non-finite value) at this step.
    Null {
        /// Step of that line.
        step: u64,
    },
    /// The value of the last line that has the key.
    Value {
        /// Step of that line.
        step: u64,
        /// The value.
        value: f64,
    },
}

/// Direction of a difficulty proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Direction {
    /// Towards harder tasks.
    Harder,
    /// Towards easier tasks.
    Easier,
}

/// How a proposal ended (or that it has not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Made, not yet resolved.
    Pending,
    /// Resolved and kept.
    Accepted,
    /// Resolved and dropped.
    Rejected,
}

/// One proposal record of `adaptation.jsonl`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Proposal {
    /// The slot it is for.
    pub slot: usize,
    /// Difficulty before.
    pub from: Vec<Option<f64>>,
    /// Proposed difficulty.
    pub to: Vec<Option<f64>>,
    /// Harder or easier.
    pub direction: Direction,
    /// Pending, accepted or rejected.
    pub verdict: Verdict,
    /// The slot's accuracy that triggered it.
    #[serde(default)]
    pub acc: Option<f64>,
    /// Accuracy measured on the proposal (`null` while pending).
    #[serde(default)]
    pub new_acc: Option<f64>,
}

/// One line of `adaptation.jsonl` (one per training step).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AdaptationStep {
    /// Training step.
    pub step: u64,
    /// Names of the difficulty dimensions.
    #[serde(default)]
    pub dims: Vec<String>,
    /// Per-slot difficulty after the step.
    pub slots: Vec<Vec<Option<f64>>>,
    /// Proposals made or resolved at this step.
    #[serde(default)]
    pub proposals: Vec<Proposal>,
}

/// One slice of a posterior snapshot: predicted accuracy along one dimension.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PosteriorSlice {
    /// The dimension varied.
    pub dim: usize,
    /// Its values (in `[0, 1]`).
    pub grid: Vec<Option<f64>>,
    /// Predicted accuracy at each grid point.
    pub mean_acc: Vec<Option<f64>>,
    /// Predicted standard deviation at each grid point.
    pub sd_acc: Vec<Option<f64>>,
}

/// One accuracy observation the proposer's model was fitted on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Observation {
    /// Where (one value per dimension).
    pub difficulty: Vec<Option<f64>>,
    /// When it was observed.
    #[serde(default)]
    pub step: Option<u64>,
    /// Observed accuracy.
    pub acc: Option<f64>,
    /// Number of trajectories behind it.
    #[serde(default)]
    pub n: Option<u64>,
}

/// One line of `posterior.jsonl` (Gp runs, every eval step).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PosteriorSnapshot {
    /// Training step.
    pub step: u64,
    /// The point the slices pass through (mean slot difficulty).
    #[serde(default)]
    pub center: Vec<Option<f64>>,
    /// One slice per dimension.
    pub dims: Vec<PosteriorSlice>,
    /// Dimension names (newer runs).
    #[serde(default)]
    pub names: Vec<String>,
    /// The accuracy band the proposer aims for (newer runs).
    #[serde(default)]
    pub band: Option<[f64; 2]>,
    /// The target accuracy (newer runs).
    #[serde(default)]
    pub target: Option<f64>,
    /// The observations the model holds (newer runs).
    #[serde(default)]
    pub observations: Vec<Observation>,
}

/// The parts of `meta.json` a report uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// `experiment`.
    pub experiment: Option<String>,
    /// `seed`.
    pub seed: Option<u64>,
    /// `backend`.
    pub backend: Option<String>,
    /// `file`: the experiment file the run was started from.
    pub file: Option<String>,
}

/// One run directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The run directory.
    pub dir: PathBuf,
    /// Experiment name: the run directory's parent folder (`runs/<experiment>/seed-<n>/`).
    pub experiment: String,
    /// Seed: `meta.json`'s `seed`, else the `seed-<n>` folder name.
    pub seed: Option<u64>,
    /// `meta.json`, if present.
    pub meta: Meta,
    /// One entry per metrics line, in file order.
    pub lines: Vec<MetricsLine>,
    /// `adaptation.jsonl`, if present.
    pub adaptation: Option<Vec<AdaptationStep>>,
    /// `posterior.jsonl`, if present.
    pub posterior: Option<Vec<PosteriorSnapshot>>,
    /// `resolved.ron` (the experiment as run, every default filled in), if present; read as
    /// text, parsed only by the sweep figure ([`crate::sweep`]).
    pub resolved: Option<String>,
    /// What was odd but not fatal while reading (each names its file).
    pub warnings: Vec<String>,
}

impl Run {
    /// Reads the run directory `dir` (`metrics.jsonl` required, every other file optional).
    pub fn read(dir: &Path) -> Result<Self, ReportError> {
        Self::read_with(dir, "metrics.jsonl")
    }

    /// Reads a run that its judge's gate stopped: as [`Self::read`], its metrics from
    /// `gated.jsonl` (the step-0 line `rlany ablate` keeps).
    pub fn read_gated(dir: &Path) -> Result<Self, ReportError> {
        Self::read_with(dir, "gated.jsonl")
    }

    fn read_with(dir: &Path, metrics: &str) -> Result<Self, ReportError> {
        let mut warnings = Vec::new();
        let lines = read_metrics(&dir.join(metrics), &mut warnings)?;
        let meta = read_meta(&dir.join("meta.json"), &mut warnings)?;
        let experiment = dir
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(m) = meta.experiment.as_ref().filter(|m| **m != experiment) {
            warnings.push(format!(
                "{}: meta.json names experiment `{m}`, the folder `{experiment}`; grouped by the folder",
                dir.display()
            ));
        }
        let seed = meta.seed.or_else(|| seed_from_dir(dir));
        if seed.is_none() {
            warnings.push(format!(
                "{}: no seed (neither meta.json nor a seed-<n> folder name); left out of paired differences",
                dir.display()
            ));
        }
        let adaptation = read_optional(&dir.join("adaptation.jsonl"), &mut warnings)?;
        let posterior = read_optional(&dir.join("posterior.jsonl"), &mut warnings)?;
        let resolved = fs::read_to_string(dir.join("resolved.ron")).ok();
        Ok(Self {
            dir: dir.to_path_buf(),
            experiment,
            seed,
            meta,
            lines,
            adaptation,
            posterior,
            resolved,
            warnings,
        })
    }

    /// A short name: `experiment/seed-n`.
    pub fn label(&self) -> String {
        match self.seed {
            Some(s) => format!("{}/seed-{s}", self.experiment),
            None => format!("{}/{}", self.experiment, self.dir.display()),
        }
    }

    /// Whether any line has `key` (even as `null`).
    pub fn has(&self, key: &str) -> bool {
        self.lines.iter().any(|l| l.values.contains_key(key))
    }

    /// The last step logged.
    pub fn last_step(&self) -> Option<u64> {
        self.lines.iter().map(|l| l.step).max()
    }

    /// `(step, value)` of every line whose `key` is a number (`null`s are left out).
    pub fn series(&self, key: &str) -> Vec<(u64, f64)> {
        self.lines
            .iter()
            .filter_map(|l| Some((l.step, (*l.values.get(key)?)?)))
            .collect()
    }

    /// Steps whose line has `key` as `null` (non-finite at run time).
    pub fn null_steps(&self, key: &str) -> Vec<u64> {
        self.lines
            .iter()
            .filter(|l| matches!(l.values.get(key), Some(None)))
            .map(|l| l.step)
            .collect()
    }

    /// The value of `key` in the last line that has it.
    pub fn final_value(&self, key: &str) -> Final {
        let Some(line) = self.lines.iter().rev().find(|l| l.values.contains_key(key)) else {
            return Final::Absent;
        };
        match line.values.get(key).copied().flatten() {
            Some(value) => Final::Value {
                step: line.step,
                value,
            },
            None => Final::Null { step: line.step },
        }
    }

    /// The first of `keys` that this run logs.
    pub fn first_key<'k>(&self, keys: &[&'k str]) -> Option<&'k str> {
        keys.iter().copied().find(|k| self.has(k))
    }
}

/// Every run directory (a folder holding `metrics.jsonl`) at or below each path, read, in
/// path order (sub-folders sorted by name).
pub fn collect(paths: &[PathBuf]) -> Result<Vec<Run>, ReportError> {
    let mut dirs = Vec::new();
    for p in paths {
        walk(p, &mut dirs);
    }
    if dirs.is_empty() {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(ReportError::NoRuns(names.join(", ")));
    }
    dirs.dedup();
    dirs.iter().map(|d| Run::read(d)).collect()
}

/// Every run directory at or below each path that a judge gate stopped (a folder holding
/// `gated.jsonl` and no `metrics.jsonl`), read, in path order.
pub fn collect_gated(paths: &[PathBuf]) -> Result<Vec<Run>, ReportError> {
    let mut dirs = Vec::new();
    for p in paths {
        walk_for(p, "gated.jsonl", &mut dirs);
    }
    dirs.dedup();
    dirs.retain(|d| !d.join("metrics.jsonl").is_file());
    dirs.iter().map(|d| Run::read_gated(d)).collect()
}

fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    walk_for(p, "metrics.jsonl", out);
}

fn walk_for(p: &Path, marker: &str, out: &mut Vec<PathBuf>) {
    if p.join(marker).is_file() {
        out.push(p.to_path_buf());
        return;
    }
    let Ok(entries) = fs::read_dir(p) else {
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        walk_for(&d, marker, out);
    }
}

fn seed_from_dir(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix("seed-")?
        .parse()
        .ok()
}

/// Parses a JSON-lines file into `(1-based line, value)` with the cut-last-line rule.
pub(crate) fn read_jsonl(
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<(usize, Value)>, ReportError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    let numbered: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let last = numbered.last().map(|(i, _)| *i);
    let mut out = Vec::with_capacity(numbered.len());
    for (line, raw) in numbered {
        match serde_json::from_str::<Value>(raw) {
            Ok(v) => out.push((line, v)),
            Err(e) if Some(line) == last => warnings.push(format!(
                "{}:{line}: last line is cut short ({e}); skipped (a run killed mid-write leaves one)",
                path.display()
            )),
            Err(e) => {
                return Err(ReportError::BadLine {
                    path: path.to_path_buf(),
                    line,
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(out)
}

fn read_metrics(path: &Path, warnings: &mut Vec<String>) -> Result<Vec<MetricsLine>, ReportError> {
    let bad = |line: usize, message: &str| ReportError::BadLine {
        path: path.to_path_buf(),
        line,
        message: message.to_string(),
    };
    let mut lines: Vec<MetricsLine> = Vec::new();
    for (line, v) in read_jsonl(path, warnings)? {
        let obj = v
            .as_object()
            .ok_or_else(|| bad(line, "not a JSON object"))?;
        let step = obj
            .get("step")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(line, "no `step` (a non-negative integer)"))?;
        let values = obj
            .iter()
            .filter(|(k, _)| k.as_str() != "step")
            .filter_map(|(k, v)| match v {
                Value::Null => Some((k.clone(), None)),
                Value::Number(n) => Some((k.clone(), n.as_f64())),
                _ => None,
            })
            .collect();
        if let Some(prev) = lines.last().filter(|p| p.step >= step) {
            warnings.push(format!(
                "{}:{line}: step {step} after step {}; the later line replaces the earlier",
                path.display(),
                prev.step
            ));
            lines.retain(|l| l.step < step);
        }
        lines.push(MetricsLine { step, values });
    }
    Ok(lines)
}

fn read_meta(path: &Path, warnings: &mut Vec<String>) -> Result<Meta, ReportError> {
    if !path.is_file() {
        warnings.push(format!("{}: missing", path.display()));
        return Ok(Meta::default());
    }
    let text = fs::read_to_string(path).map_err(io(path))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| ReportError::BadFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(Meta {
        experiment: s("experiment"),
        seed: v.get("seed").and_then(Value::as_u64),
        backend: s("backend"),
        file: s("file"),
    })
}

/// Reads an optional JSON-lines file of records `T`; `None` when the file does not exist.
fn read_optional<T: for<'de> Deserialize<'de>>(
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<Option<Vec<T>>, ReportError> {
    if !path.is_file() {
        return Ok(None);
    }
    read_jsonl(path, warnings)?
        .into_iter()
        .map(|(line, v)| {
            serde_json::from_value(v).map_err(|e| ReportError::BadLine {
                path: path.to_path_buf(),
                line,
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

/// A run of experiment `exp` (folder `/x/<exp>/seed-<seed>`, no other file) from its metrics
/// lines, each a step and its `(key, value)` pairs — for the report modules' unit tests.
#[cfg(test)]
pub(crate) fn test_run<'k>(
    exp: &str,
    seed: u64,
    lines: impl IntoIterator<Item = (u64, impl IntoIterator<Item = (&'k str, Option<f64>)>)>,
) -> Run {
    Run {
        dir: PathBuf::from(format!("/x/{exp}/seed-{seed}")),
        experiment: exp.into(),
        seed: Some(seed),
        meta: Meta::default(),
        lines: lines
            .into_iter()
            .map(|(step, kv)| MetricsLine {
                step,
                values: kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            })
            .collect(),
        adaptation: None,
        posterior: None,
        resolved: None,
        warnings: vec![],
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh empty temporary directory for one test.
    pub(crate) fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rlany-reports-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("temp dir");
        d
    }

    fn write_run(root: &Path, metrics: &str) -> PathBuf {
        let d = root.join("exp").join("seed-4");
        fs::create_dir_all(&d).expect("dir");
        fs::write(d.join("metrics.jsonl"), metrics).expect("write");
        d
    }

    #[test]
    fn a_cut_last_line_is_skipped_with_a_warning() {
        let root = temp_dir("cut");
        let d = write_run(
            &root,
            "{\"step\":0,\"eval/acc_id\":0.5}\n{\"step\":1,\"policy/kl\":null}\n{\"step\":2,\"eval/acc",
        );
        let run = Run::read(&d).expect("read");
        assert_eq!(run.lines.len(), 2);
        assert_eq!(run.seed, Some(4));
        assert_eq!(run.experiment, "exp");
        let w = run.warnings.join("\n");
        assert!(w.contains("metrics.jsonl:3: last line is cut short"), "{w}");
        assert!(w.contains("meta.json: missing"), "{w}");
        assert_eq!(run.final_value("policy/kl"), Final::Null { step: 1 });
        assert_eq!(
            run.final_value("eval/acc_id"),
            Final::Value {
                step: 0,
                value: 0.5
            }
        );
        assert_eq!(run.final_value("nothing"), Final::Absent);
        assert!(run.series("policy/kl").is_empty());
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn a_malformed_middle_line_is_an_error_naming_file_and_line() {
        let root = temp_dir("middle");
        let d = write_run(&root, "{\"step\":0}\n{\"step\":1,,}\n{\"step\":2}\n");
        let e = Run::read(&d).expect_err("must fail");
        let msg = e.to_string();
        assert!(msg.contains("metrics.jsonl:2:"), "{msg}");
        let d = write_run(&root, "{\"step\":0}\n[1,2]\n{\"step\":2}\n");
        assert!(
            Run::read(&d)
                .expect_err("array")
                .to_string()
                .contains(":2:")
        );
        let d = write_run(&root, "{\"step\":0}\n{\"x\":1}\n{\"step\":2}\n");
        let msg = Run::read(&d).expect_err("no step").to_string();
        assert!(msg.contains(":2:") && msg.contains("step"), "{msg}");
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn optional_files_are_typed_and_checked() {
        let root = temp_dir("optional");
        let d = write_run(&root, "{\"step\":0}\n");
        fs::write(
            d.join("posterior.jsonl"),
            "{\"step\":0,\"center\":[0.5],\"dims\":[{\"dim\":0,\"grid\":[0,1],\"mean_acc\":[0.9,null],\"sd_acc\":[0.1,0.2]}]}\n",
        )
        .expect("write");
        fs::write(
            d.join("adaptation.jsonl"),
            "{\"step\":1,\"dims\":[\"a\"],\"slots\":[[0.5]],\"proposals\":[{\"slot\":0,\"from\":[0.5],\"to\":[0.6],\"direction\":\"Harder\",\"verdict\":\"pending\",\"acc\":0.9,\"new_acc\":null}]}\n{\"step\":2,\"slots\":[[0.5]]}\n",
        )
        .expect("write");
        let run = Run::read(&d).expect("read");
        let post = run.posterior.as_ref().expect("posterior");
        assert_eq!(post[0].dims[0].mean_acc, vec![Some(0.9), None]);
        assert!(post[0].band.is_none() && post[0].observations.is_empty());
        let ad = run.adaptation.as_ref().expect("adaptation");
        assert_eq!(ad[0].proposals[0].verdict, Verdict::Pending);
        assert_eq!(ad.len(), 2);
        fs::write(
            d.join("adaptation.jsonl"),
            "{\"step\":1,\"slots\":\"x\"}\n{\"step\":2,\"slots\":[]}\n",
        )
        .expect("write");
        let msg = Run::read(&d).expect_err("bad shape").to_string();
        assert!(msg.contains("adaptation.jsonl:1:"), "{msg}");
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn repeated_steps_keep_the_later_line_and_warn() {
        let root = temp_dir("repeat");
        let d = write_run(
            &root,
            "{\"step\":0,\"a\":1}\n{\"step\":1,\"a\":2}\n{\"step\":1,\"a\":3}\n",
        );
        let run = Run::read(&d).expect("read");
        assert_eq!(run.series("a"), vec![(0, 1.0), (1, 3.0)]);
        assert!(run.warnings.iter().any(|w| w.contains("metrics.jsonl:3")));
        let _ = fs::remove_dir_all(root);
    }
}
