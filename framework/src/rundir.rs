//! The run directory `runs/<name>/seed-<n>/`: `resolved.ron`, `meta.json`,
//! `metrics.jsonl` (one JSON object per line, namespaced keys), `samples.jsonl`,
//! `checkpoints/`, and TensorBoard's `events.out.tfevents.*` (the same scalars and samples,
//! [`crate::tensorboard`]).

use crate::tensorboard::EventFile;
use serde_json::{Map, Value};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// Errors of the run directory.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A fresh run would overwrite an existing one.
    #[error("{0} already holds a run; pass --resume {0} to continue it, or remove it")]
    Exists(PathBuf),
    /// A resumed run was started with a different experiment.
    #[error(
        "{path}: the experiment differs from the one this run was started with: {}. A run resumes \
         only with the experiment it was started with (the same file and --set options; a fixed \
         environment command included, since what the loop saw would no longer be what the \
         checkpoint learned from): resume with those, or start a new run",
        differences.join("; ")
    )]
    Mismatch {
        /// The run's resolved.ron.
        path: PathBuf,
        /// The fields that differ, as `path: stored → now` (at most a few).
        differences: Vec<String>,
    },
    /// A metrics line is not valid JSON.
    #[error("{path}:{line}: not a metrics line: {message}")]
    BadLine {
        /// metrics.jsonl.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// Parser message.
        message: String,
    },
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One metrics line: `step` plus namespaced keys, written in sorted key order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics(pub Map<String, Value>);

impl Metrics {
    /// A line for training step `step`.
    pub fn new(step: usize) -> Self {
        let mut m = Map::new();
        m.insert("step".into(), Value::from(step));
        Self(m)
    }

    /// Sets a numeric key (non-finite values are written as `null`).
    pub fn set(&mut self, key: &str, value: f64) {
        let v = serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number);
        self.0.insert(key.to_string(), v);
    }

    /// A numeric key, if present.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.get(key).and_then(Value::as_f64)
    }
}

/// An open run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
    /// Whether this process writes it (`false` for the peers of a spread run other than the
    /// first, which read checkpoints from it and write nothing).
    writes: bool,
    /// This session's TensorBoard event file (a resumed run starts a new one).
    events: Option<EventFile>,
}

impl RunDir {
    /// Creates a fresh run directory; refuses to reuse one that holds metrics.
    pub fn create(root: &Path, resolved_ron: &str, meta: &Value) -> Result<Self, RunDirError> {
        if root.join("metrics.jsonl").exists() || root.join("checkpoints").exists() {
            return Err(RunDirError::Exists(root.to_path_buf()));
        }
        fs::create_dir_all(root.join("checkpoints")).map_err(io(root))?;
        let dir = Self {
            root: root.to_path_buf(),
            writes: true,
            events: Some(EventFile::create(root).map_err(io(root))?),
        };
        write_atomic(&dir.root.join("resolved.ron"), resolved_ron.as_bytes())?;
        let meta = serde_json::to_string_pretty(meta).unwrap_or_default();
        write_atomic(&dir.root.join("meta.json"), meta.as_bytes())?;
        Ok(dir)
    }

    /// Opens an existing run to resume it; `resolved_ron` must match the stored one.
    pub fn open(root: &Path, resolved_ron: &str) -> Result<Self, RunDirError> {
        let path = root.join("resolved.ron");
        let stored = fs::read_to_string(&path).map_err(io(&path))?;
        if stored.trim() != resolved_ron.trim() {
            let differences = differing_fields(&stored, resolved_ron);
            return Err(RunDirError::Mismatch { path, differences });
        }
        Ok(Self {
            root: root.to_path_buf(),
            writes: true,
            events: Some(EventFile::create(root).map_err(io(root))?),
        })
    }

    /// A run directory another peer writes: this view reads its checkpoints and writes
    /// nothing (every write below is skipped).
    pub fn read_only(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            writes: false,
            events: None,
        }
    }

    /// Whether this view writes the directory.
    pub fn writes(&self) -> bool {
        self.writes
    }

    /// `checkpoints/`.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// `metrics.jsonl`.
    pub fn metrics_path(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    /// Appends one metrics line (flushed at once, so a killed run loses nothing written).
    pub fn log(&self, m: &Metrics) -> Result<(), RunDirError> {
        if !self.writes {
            return Ok(());
        }
        append_line(&self.metrics_path(), &Value::Object(m.0.clone()))?;
        if let (Some(e), Some(step)) = (&self.events, m.get("step")) {
            let scalars =
                m.0.iter()
                    .filter(|(k, _)| k.as_str() != "step")
                    .filter_map(|(k, v)| Some((k.as_str(), v.as_f64()?)));
            e.scalars(step as usize, scalars).map_err(io(e.path()))?;
        }
        Ok(())
    }

    /// Appends one sample record to `samples.jsonl` (and, as text, to the event file).
    pub fn sample(&self, v: &Value) -> Result<(), RunDirError> {
        self.append("samples.jsonl", v)?;
        if let (Some(e), Some(step)) = (&self.events, v.get("step").and_then(Value::as_u64)) {
            let split = v.get("split").and_then(Value::as_str).unwrap_or("samples");
            e.text(
                step as usize,
                &format!("samples/{split}"),
                &sample_markdown(v),
            )
            .map_err(io(e.path()))?;
        }
        Ok(())
    }

    /// Appends one JSON line to the run's file `name` (e.g. `posterior.jsonl`).
    pub fn append(&self, name: &str, v: &Value) -> Result<(), RunDirError> {
        if !self.writes {
            return Ok(());
        }
        append_line(&self.root.join(name), v)
    }

    /// Drops every metrics/samples line written after `step` (used on resume, so the lines
    /// of steps redone after the checkpoint are not duplicated).
    pub fn truncate_after(&self, step: usize) -> Result<(), RunDirError> {
        if !self.writes {
            return Ok(());
        }
        if let Some(e) = &self.events {
            e.restart(step + 1).map_err(io(e.path()))?;
        }
        for name in [
            "metrics.jsonl",
            "samples.jsonl",
            "posterior.jsonl",
            "adaptation.jsonl",
        ] {
            let path = self.root.join(name);
            if !path.exists() {
                continue;
            }
            let kept: Vec<String> = read_lines(&path)?
                .into_iter()
                .filter(|(v, _)| {
                    v.get("step")
                        .and_then(Value::as_u64)
                        .is_some_and(|s| s as usize <= step)
                })
                .map(|(_, raw)| raw)
                .collect();
            let mut text = kept.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            write_atomic(&path, text.as_bytes())?;
        }
        Ok(())
    }
}

/// A sample record (`samples.jsonl`: prompt, steps with the oracle's label and the judge's
/// verdicts, outcome) as markdown for TensorBoard's text tab.
fn sample_markdown(v: &Value) -> String {
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let mut md = format!("**outcome** {}\n\n", text(v.get("outcome")));
    for line in text(v.get("prompt")).lines() {
        md.push_str(&format!("    {line}\n"));
    }
    md.push_str("\n| step | oracle | verdicts |\n|---|---|---|\n");
    for s in v
        .get("steps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let oracle = match s.get("oracle").and_then(Value::as_bool) {
            Some(true) => "right",
            Some(false) => "wrong",
            None => "-",
        };
        let verdicts: Vec<String> = s
            .get("verdicts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|x| match x.as_f64() {
                Some(v) if v > 0.0 => "+".to_string(),
                Some(_) => "-".to_string(),
                None => text(Some(x)),
            })
            .collect();
        let step = text(s.get("text")).replace('|', "\\|").replace('\n', " ");
        md.push_str(&format!(
            "| `{step}` | {oracle} | {} |\n",
            verdicts.join(" ")
        ));
    }
    md
}

/// Reads every line of a JSON-lines file as `(value, raw text)`. A last line cut short (a
/// process killed while appending it) is dropped; a malformed line before it is an error.
pub fn read_lines(path: &Path) -> Result<Vec<(Value, String)>, RunDirError> {
    let f = File::open(path).map_err(io(path))?;
    let lines: Vec<String> = BufReader::new(f)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(io(path))?;
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    let mut out = Vec::new();
    for (i, line) in lines.into_iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(v) => out.push((v, line)),
            Err(_) if Some(i) == last => {}
            Err(e) => {
                return Err(RunDirError::BadLine {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(out)
}

fn append_line(path: &Path, v: &Value) -> Result<(), RunDirError> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(path))?;
    let mut line = v.to_string();
    line.push('\n');
    f.write_all(line.as_bytes()).map_err(io(path))?;
    f.flush().map_err(io(path))
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    let tmp = path.with_extension("tmp-write");
    {
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(io(path))
}

/// The fields of two pretty-printed experiments (resolved.ron) that differ, as
/// `dotted.path: stored → now` (`absent` where one has no such field), at most 8 and a count
/// of the rest. List elements are numbered (`command[1]`).
pub fn differing_fields(stored: &str, now: &str) -> Vec<String> {
    let (a, b) = (ron_leaves(stored), ron_leaves(now));
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (path, va) in &a {
        seen.insert(path.clone());
        let vb = b.iter().find(|(p, _)| p == path).map(|(_, v)| v.as_str());
        if vb != Some(va.as_str()) {
            out.push(format!("{path}: {va} → {}", vb.unwrap_or("absent")));
        }
    }
    for (path, vb) in &b {
        if !seen.contains(path) {
            out.push(format!("{path}: absent → {vb}"));
        }
    }
    if out.len() > 8 {
        let rest = out.len() - 8;
        out.truncate(8);
        out.push(format!("and {rest} more"));
    }
    if out.is_empty() {
        out.push("the text differs, no field does".into());
    }
    out
}

/// `(dotted path, value)` of every leaf line of a pretty-printed RON value.
fn ron_leaves(text: &str) -> Vec<(String, String)> {
    // Open brackets: (indent, name, unnamed children so far).
    let mut stack: Vec<(usize, String, usize)> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        while stack.last().is_some_and(|(i, _, _)| *i >= indent) {
            stack.pop();
        }
        if t.starts_with(')') || t.starts_with(']') || t.starts_with('}') {
            continue;
        }
        let (key, rest) = match t.split_once(": ") {
            Some((k, r)) if !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                (k.to_string(), r)
            }
            _ => {
                let i = stack.last_mut().map_or(0, |(_, _, n)| {
                    *n += 1;
                    *n - 1
                });
                (format!("[{i}]"), t)
            }
        };
        let path = stack
            .iter()
            .map(|(_, k, _)| k.as_str())
            .chain(std::iter::once(key.as_str()))
            .filter(|k| !k.is_empty())
            .fold(String::new(), |acc, k| {
                if acc.is_empty() || k.starts_with('[') {
                    acc + k
                } else {
                    acc + "." + k
                }
            });
        let value = rest.trim_end_matches(',');
        if value.ends_with('(') || value.ends_with('[') || value.ends_with('{') {
            // The root `Experiment(` names no field.
            let name = if stack.is_empty() && !t.contains(": ") {
                String::new()
            } else {
                key
            };
            stack.push((indent, name, 0));
        } else {
            out.push((path, value.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_lines_up_to_the_checkpoint() {
        let root = std::env::temp_dir().join(format!("rlany-rundir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = RunDir::create(&root, "X()", &Value::Null).expect("create");
        for s in 0..5 {
            let mut m = Metrics::new(s);
            m.set("env/acc_mean", s as f64 / 10.0);
            dir.log(&m).expect("log");
        }
        dir.truncate_after(2).expect("truncate");
        let lines = read_lines(&dir.metrics_path()).expect("read");
        assert_eq!(lines.len(), 3);
        assert!(matches!(
            RunDir::create(&root, "X()", &Value::Null),
            Err(RunDirError::Exists(_))
        ));
        assert!(matches!(
            RunDir::open(&root, "Y()"),
            Err(RunDirError::Mismatch { .. })
        ));
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn the_event_file_holds_every_scalar_and_sample_as_written() {
        let root = std::env::temp_dir().join(format!("rlany-rundir-tb-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = RunDir::create(&root, "X()", &Value::Null).expect("create");
        let mut m = Metrics::new(4);
        m.set("eval/acc_id", 0.75);
        m.set("ppo/loss", f64::NAN); // written as null, not as a scalar
        dir.log(&m).expect("log");
        let sample = serde_json::json!({"step": 4, "split": "id", "prompt": "Door 3", "outcome": 1.0,
            "steps": [{"text": "L", "oracle": true, "verdicts": [1, -1]}]});
        dir.sample(&sample).expect("sample");
        dir.truncate_after(4).expect("resume point");
        let files: Vec<PathBuf> = fs::read_dir(&root)
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains("tfevents"))
            .collect();
        assert_eq!(files.len(), 1);
        let events = crate::tensorboard::read_events(&files[0]).expect("events");
        // Version, the step's scalars, the sample's text, the restart at step 5.
        assert_eq!(events.len(), 4);
        let scalars = &events[1].summary.as_ref().expect("scalars").value;
        assert_eq!(events[1].step, 4);
        let tags: Vec<(&str, Option<f32>)> = scalars
            .iter()
            .map(|v| (v.tag.as_str(), v.simple_value))
            .collect();
        assert_eq!(tags, [("eval/acc_id", Some(0.75))]);
        let text = &events[2].summary.as_ref().expect("text").value[0];
        assert_eq!(text.tag, "samples/id");
        let md = String::from_utf8(text.tensor.as_ref().expect("tensor").string_val[0].clone())
            .expect("utf8");
        assert_eq!(
            md,
            "**outcome** 1.0\n\n    Door 3\n\n| step | oracle | verdicts |\n|---|---|---|\n| `L` | right | + - |\n"
        );
        assert_eq!((events[3].step, events[3].session_log.is_some()), (5, true));
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_refused_resume_names_the_fields_that_differ() {
        let stored = "Experiment(\n    name: \"p\",\n    environment: Process(\n        command: [\n            \"python3\",\n            \"a.py\",\n        ],\n        timeout_s: 30.0,\n    ),\n    budget: (\n        steps: 10,\n    ),\n)\n";
        let now = stored
            .replace("a.py", "b.py")
            .replace("steps: 10", "steps: 20");
        assert_eq!(
            differing_fields(stored, &now),
            [
                "environment.command[1]: \"a.py\" → \"b.py\"",
                "budget.steps: 10 → 20"
            ]
        );
        let added = stored.replace(
            "        timeout_s: 30.0,\n",
            "        timeout_s: 30.0,\n        children: 4,\n",
        );
        assert_eq!(
            differing_fields(stored, &added),
            ["environment.children: absent → 4"]
        );
        let dir =
            std::env::temp_dir().join(format!("rlany-rundir-mismatch-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        RunDir::create(&dir, stored, &serde_json::json!({})).expect("create");
        let e = RunDir::open(&dir, &now).expect_err("refused").to_string();
        assert!(
            e.contains("environment.command[1]: \"a.py\" → \"b.py\"; budget.steps: 10 → 20"),
            "{e}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
