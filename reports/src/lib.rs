//! # rlany-reports
//!
//! Run directories → tables. Reads only what a run wrote (`metrics.jsonl`, `meta.json`), never
//! Burn: reports can be made on any machine from copied run directories.
//!
//! [`collect`] finds runs under the given paths, [`summarise`] takes each run's final and
//! initial values, and [`ablation_table`] renders the paper's Table-1 shape: one row per
//! experiment, mean ± 95% confidence half-width over seeds.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Errors while reading run directories.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A metrics line is not JSON.
    #[error("{path}:{line}: not a metrics line: {message}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// Parser message.
        message: String,
    },
    /// Nothing to report.
    #[error("no run directory (a folder with metrics.jsonl) under {0}")]
    NoRuns(String),
}

/// One run's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The run directory.
    pub dir: PathBuf,
    /// Experiment name (the run directory's parent folder).
    pub experiment: String,
    /// One map per metrics line, in order.
    pub lines: Vec<BTreeMap<String, f64>>,
}

impl Run {
    /// Reads `dir/metrics.jsonl`.
    pub fn read(dir: &Path) -> Result<Self, ReportError> {
        let path = dir.join("metrics.jsonl");
        let text = fs::read_to_string(&path).map_err(|source| ReportError::Io {
            path: path.clone(),
            source,
        })?;
        let mut lines = Vec::new();
        for (i, l) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: Value = serde_json::from_str(l).map_err(|e| ReportError::BadLine {
                path: path.clone(),
                line: i + 1,
                message: e.to_string(),
            })?;
            let map = v
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
                        .collect()
                })
                .unwrap_or_default();
            lines.push(map);
        }
        let experiment = dir
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self {
            dir: dir.to_path_buf(),
            experiment,
            lines,
        })
    }

    /// The first logged value of `key`.
    pub fn first(&self, key: &str) -> Option<f64> {
        self.lines.iter().find_map(|l| l.get(key).copied())
    }

    /// The last logged value of `key`.
    pub fn last(&self, key: &str) -> Option<f64> {
        self.lines.iter().rev().find_map(|l| l.get(key).copied())
    }

    /// `(step, value)` for every line that has `key`.
    pub fn series(&self, key: &str) -> Vec<(f64, f64)> {
        self.lines
            .iter()
            .filter_map(|l| Some((*l.get("step")?, *l.get(key)?)))
            .collect()
    }
}

/// Every run directory (a folder holding `metrics.jsonl`) at or below each path.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<Run>, ReportError> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        if p.join("metrics.jsonl").is_file() {
            out.push(p.to_path_buf());
            return;
        }
        if let Ok(entries) = fs::read_dir(p) {
            let mut dirs: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            dirs.sort();
            for d in dirs {
                walk(&d, out);
            }
        }
    }
    let mut dirs = Vec::new();
    for p in paths {
        walk(p, &mut dirs);
    }
    if dirs.is_empty() {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(ReportError::NoRuns(names.join(", ")));
    }
    dirs.iter().map(|d| Run::read(d)).collect()
}

/// Mean and 95% confidence half-width (Student t) of `xs`; half-width 0 for one value.
pub fn mean_ci95(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom, then ≈ normal.
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    (mean, t * (var / n as f64).sqrt())
}

/// A column of the ablation table: header, metric key, and whether to take the first value
/// (after the warm start) rather than the last.
pub const COLUMNS: [(&str, &str, bool); 8] = [
    ("acc ID (start)", "eval/acc_id", true),
    ("acc ID (end)", "eval/acc_id", false),
    ("acc OOD (end)", "eval/acc_ood", false),
    ("judge process acc (start)", "judge/process_acc", true),
    ("judge process acc (end)", "judge/process_acc", false),
    ("judge outcome acc (end)", "judge/outcome_acc", false),
    ("proposals accepted", "env/accepted", false),
    ("proposals rejected", "env/rejected", false),
];

/// The ablation table in Markdown: one row per experiment (in name order), mean ± 95% CI over
/// its seeds; `–` where an experiment has no such metric.
pub fn ablation_table(runs: &[Run]) -> String {
    let mut by_exp: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_exp.entry(r.experiment.as_str()).or_default().push(r);
    }
    let mut out = String::from("| experiment | seeds |");
    for (h, _, _) in COLUMNS {
        out += &format!(" {h} |");
    }
    out += "\n|---|---|";
    out += &"---|".repeat(COLUMNS.len());
    out += "\n";
    for (name, rs) in by_exp {
        out += &format!("| {name} | {} |", rs.len());
        for (_, key, first) in COLUMNS {
            let xs: Vec<f64> = rs
                .iter()
                .filter_map(|r| if first { r.first(key) } else { r.last(key) })
                .collect();
            if xs.is_empty() {
                out += " – |";
            } else {
                let (m, h) = mean_ci95(&xs);
                let is_count = key.starts_with("env/");
                out += &if is_count {
                    format!(" {m:.1} ± {h:.1} |")
                } else {
                    format!(" {m:.3} ± {h:.3} |")
                };
            }
        }
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci95_hand_computed() {
        // mean 2, sample sd 1, n 3: half-width 4.303 · 1/√3 = 2.484
        let (m, h) = mean_ci95(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((h - 2.484_29).abs() < 1e-4, "{h}");
        assert_eq!(mean_ci95(&[5.0]), (5.0, 0.0));
    }

    #[test]
    fn table_from_run_directories() {
        let root = std::env::temp_dir().join(format!("rlany-reports-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (exp, seed, start, end) in [("a", 1, 0.5, 0.7), ("a", 2, 0.5, 0.9), ("b", 1, 0.4, 0.4)]
        {
            let d = root.join(exp).join(format!("seed-{seed}"));
            fs::create_dir_all(&d).expect("dir");
            let text = format!(
                "{{\"step\":0,\"eval/acc_id\":{start}}}\n{{\"step\":5,\"eval/acc_id\":{end},\"env/accepted\":3}}\n"
            );
            fs::write(d.join("metrics.jsonl"), text).expect("write");
        }
        let runs = collect(std::slice::from_ref(&root)).expect("runs");
        assert_eq!(runs.len(), 3);
        let table = ablation_table(&runs);
        let row_a = table
            .lines()
            .find(|l| l.starts_with("| a "))
            .expect("row a");
        assert!(
            row_a.contains("| 2 |")
                && row_a.contains("0.500 ± 0.000")
                && row_a.contains("0.800 ± 1.271"),
            "{row_a}"
        );
        assert!(row_a.contains("3.0 ± 0.0"), "{row_a}");
        assert!(table.contains("| b | 1 |"));
        assert!(collect(&[root.join("nothing")]).is_err());
        let _ = fs::remove_dir_all(root);
    }
}
