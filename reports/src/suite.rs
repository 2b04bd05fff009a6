//! Grouping runs into experiments (table rows): their order and each row's baseline.
//!
//! Order: the rows of `<suite_runs>/suite.json` first, in its order, when such a file exists
//! beside the experiment folders; the other experiments after them, ordered by the name of the
//! experiment file they were started from (`meta.json`'s `file`, e.g. `0_outcome_only.ron`,
//! `1_policy.ron`, …: the ablation's own order) when every one of them has it, else by
//! experiment name; both in natural order (`2` before `10`).
//!
//! Baseline (for the paired differences): the row above, unless `suite.json` says otherwise:
//! `{"rows": [{"experiment": "b", "baseline": "a"}, {"experiment": "c", "baseline": null}]}` —
//! a name picks that row, `null` means none, and a missing key means the row above. A row no
//! `suite.json` lists takes the `baseline` its runs' `resolved.ron` names, if any.
//!
//! Further comparisons: a row may name more experiments to be paired with after its baseline,
//! `{"experiment": "c", "baseline": "a", "compare": ["b"]}` (from the experiment file's
//! `compare`, or `rlany report --compare c=b`): the paired table gets one line per comparison.
//!
//! Sweep (for the sweep figure, [`crate::sweep`]): an optional top-level
//! `"sweep": "judge.p_pos"` names the numeric setting (a dotted path into `resolved.ron`) that
//! the rows sweep, when the report cannot tell it on its own.

use crate::error::{ReportError, io};
use crate::runs::Run;
use serde_json::Value;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// What a `suite.json` row says about its baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaselineSpec {
    /// The row above (the default).
    Above,
    /// No baseline.
    None,
    /// The named experiment.
    Named(String),
}

/// One row of `suite.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteRowSpec {
    /// Experiment name (its folder under the suite's runs directory).
    pub experiment: String,
    /// Its baseline.
    pub baseline: BaselineSpec,
    /// Further experiments it is paired with (after the baseline).
    pub compare: Vec<String>,
}

/// One experiment: its runs (sorted by seed) and the experiment it is compared to.
#[derive(Debug, Clone)]
pub struct Row {
    /// Experiment name.
    pub experiment: String,
    /// Its runs, by seed.
    pub runs: Vec<Run>,
    /// The experiment of its paired difference, if any.
    pub baseline: Option<String>,
    /// Further experiments it is paired with in the paired table (each has runs here).
    pub compare: Vec<String>,
}

impl Row {
    /// The seeds of its runs.
    pub fn seeds(&self) -> Vec<u64> {
        self.runs.iter().filter_map(|r| r.seed).collect()
    }
}

/// The experiments to report, in table order.
#[derive(Debug, Clone)]
pub struct Suite {
    /// One row per experiment.
    pub rows: Vec<Row>,
    /// What was odd but not fatal (each run's reading warnings included).
    pub warnings: Vec<String>,
    /// `suite.json`'s `"sweep"`: the setting the sweep figure plots against (a dotted path
    /// into `resolved.ron`, e.g. `judge.p_pos`); `None`: detected.
    pub sweep: Option<String>,
}

/// What a `suite.json` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SuiteFile {
    /// Its rows, in order.
    pub rows: Vec<SuiteRowSpec>,
    /// Its top-level `"sweep"`, if any.
    pub sweep: Option<String>,
}

impl Suite {
    /// Groups `runs`, reading any `suite.json` beside their experiment folders.
    pub fn build(runs: Vec<Run>) -> Result<Self, ReportError> {
        let mut spec = Vec::new();
        let mut warnings = Vec::new();
        let mut sweep: Option<String> = None;
        for path in suite_files(&runs) {
            let file = read_suite_file(&path)?;
            match (&sweep, file.sweep) {
                (None, s) => sweep = s,
                (Some(a), Some(b)) if *a != b => warnings.push(format!(
                    "{}: \"sweep\": \"{b}\" ignored; an earlier suite.json names \"{a}\"",
                    path.display()
                )),
                _ => {}
            }
            for row in file.rows {
                if spec
                    .iter()
                    .any(|s: &SuiteRowSpec| s.experiment == row.experiment)
                {
                    warnings.push(format!(
                        "{}: experiment `{}` already listed; this entry ignored",
                        path.display(),
                        row.experiment
                    ));
                } else {
                    spec.push(row);
                }
            }
        }
        let mut suite = Self::from_runs(runs, &spec);
        warnings.append(&mut suite.warnings);
        suite.warnings = warnings;
        suite.sweep = sweep;
        Ok(suite)
    }

    /// Groups `runs` with the rows of `spec` (possibly empty) first.
    pub fn from_runs(runs: Vec<Run>, spec: &[SuiteRowSpec]) -> Self {
        let mut warnings: Vec<String> = runs.iter().flat_map(|r| r.warnings.clone()).collect();
        let mut groups: BTreeMap<String, Vec<Run>> = BTreeMap::new();
        for r in runs {
            groups.entry(r.experiment.clone()).or_default().push(r);
        }
        for (name, rs) in &mut groups {
            rs.sort_by(|a, b| a.seed.cmp(&b.seed).then_with(|| a.dir.cmp(&b.dir)));
            let seeds: Vec<u64> = rs.iter().filter_map(|r| r.seed).collect();
            if seeds.windows(2).any(|w| w[0] == w[1]) {
                warnings.push(format!(
                    "experiment `{name}` has two runs with the same seed (from different folders?); both are averaged, the first is paired"
                ));
            }
        }
        let mut ordered: Vec<(String, BaselineSpec)> = Vec::new();
        let mut compare: Vec<(String, String)> = Vec::new();
        for s in spec {
            if groups.contains_key(&s.experiment) {
                ordered.push((s.experiment.clone(), s.baseline.clone()));
                compare.extend(s.compare.iter().map(|c| (s.experiment.clone(), c.clone())));
            } else {
                warnings.push(format!(
                    "suite.json lists `{}`, which has no run here",
                    s.experiment
                ));
            }
        }
        let mut rest: Vec<&String> = groups
            .keys()
            .filter(|k| !ordered.iter().any(|(o, _)| o == *k))
            .collect();
        if !spec.is_empty() && !rest.is_empty() {
            warnings.push(format!(
                "suite.json does not list {}; put after its rows",
                rest.iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        sort_experiments(&mut rest, &groups);
        ordered.extend(rest.into_iter().map(|k| {
            let named = groups[k].iter().find_map(resolved_baseline);
            (
                k.clone(),
                named.map_or(BaselineSpec::Above, BaselineSpec::Named),
            )
        }));

        let names: Vec<String> = ordered.iter().map(|(n, _)| n.clone()).collect();
        let rows = ordered
            .into_iter()
            .enumerate()
            .map(|(i, (experiment, b))| {
                let baseline = resolve_baseline(&experiment, i, &b, &names, &mut warnings);
                let runs = groups.remove(&experiment).unwrap_or_default();
                Row {
                    experiment,
                    runs,
                    baseline,
                    compare: Vec::new(),
                }
            })
            .collect();
        let mut suite = Self {
            rows,
            warnings,
            sweep: None,
        };
        suite.add_comparisons(&compare);
        suite
    }

    /// Adds `(row, against)` comparisons (after each row's baseline, in the order given): the
    /// paired table gets a line for each. One that names a row without runs here, pairs a row
    /// with itself or repeats one already there is left out with a warning.
    pub fn add_comparisons(&mut self, pairs: &[(String, String)]) {
        for (row, against) in pairs {
            let known = |n: &str| self.rows.iter().any(|r| r.experiment == n);
            let why = if !known(row) {
                Some(format!("`{row}` has no run here"))
            } else if !known(against) {
                Some(format!("`{against}` has no run here"))
            } else if row == against {
                Some("a row against itself".to_string())
            } else {
                None
            };
            if let Some(why) = why {
                self.warnings
                    .push(format!("comparison {row} = {against} left out: {why}"));
                continue;
            }
            if let Some(r) = self.rows.iter_mut().find(|r| r.experiment == *row)
                && r.baseline.as_deref() != Some(against.as_str())
                && !r.compare.contains(against)
            {
                r.compare.push(against.clone());
            }
        }
    }

    /// The row of `experiment`.
    pub fn row(&self, experiment: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.experiment == experiment)
    }

    /// Every run, row by row.
    pub fn runs(&self) -> impl Iterator<Item = &Run> {
        self.rows.iter().flat_map(|r| r.runs.iter())
    }
}

fn resolve_baseline(
    experiment: &str,
    index: usize,
    spec: &BaselineSpec,
    names: &[String],
    warnings: &mut Vec<String>,
) -> Option<String> {
    match spec {
        BaselineSpec::Above => index.checked_sub(1).map(|i| names[i].clone()),
        BaselineSpec::None => None,
        BaselineSpec::Named(b) if b == experiment => {
            warnings.push(format!(
                "suite.json: `{experiment}` is its own baseline; no paired difference"
            ));
            None
        }
        BaselineSpec::Named(b) if names.contains(b) => Some(b.clone()),
        BaselineSpec::Named(b) => {
            warnings.push(format!(
                "suite.json: baseline `{b}` of `{experiment}` has no run here; no paired difference"
            ));
            None
        }
    }
}

/// The `baseline` its `resolved.ron` names (the experiment file's own choice), for a row no
/// `suite.json` lists: a suite's runs copied without their `suite.json` keep their pairing.
fn resolved_baseline(run: &Run) -> Option<String> {
    let v = crate::sweep::parse_resolved(run.resolved.as_deref()?).ok()?;
    let ron::Value::Map(fields) = v else {
        return None;
    };
    fields.iter().find_map(|(k, v)| match (k, v) {
        (ron::Value::String(k), ron::Value::Option(Some(b))) if k == "baseline" => match &**b {
            ron::Value::String(b) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    })
}

/// Orders experiment names by their experiment file's name when every one has it, else by
/// name; natural order in both cases.
fn sort_experiments(names: &mut [&String], groups: &BTreeMap<String, Vec<Run>>) {
    let file_of = |name: &str| -> Option<String> {
        groups.get(name)?.iter().find_map(|r| {
            let f = r.meta.file.as_ref()?;
            Path::new(f)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
    };
    let files: Option<BTreeMap<&str, String>> = names
        .iter()
        .map(|n| file_of(n).map(|f| (n.as_str(), f)))
        .collect();
    match files {
        Some(files) => names.sort_by(|a, b| {
            natural_cmp(&files[a.as_str()], &files[b.as_str()]).then_with(|| natural_cmp(a, b))
        }),
        None => names.sort_by(|a, b| natural_cmp(a, b)),
    }
}

/// Natural order: runs of digits compare as numbers (`run2` < `run10`).
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.chars().next(), b.chars().next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.len() - a.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let db = b.len() - b.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let (na, nb) = (
                    a[..da].trim_start_matches('0'),
                    b[..db].trim_start_matches('0'),
                );
                let o = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if o != Ordering::Equal {
                    return o;
                }
                (a, b) = (&a[da..], &b[db..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(&y);
                }
                (a, b) = (&a[x.len_utf8()..], &b[y.len_utf8()..]);
            }
        }
    }
}

/// The `suite.json` files beside the runs' experiment folders (`<suite_runs>/suite.json`).
fn suite_files(runs: &[Run]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for r in runs {
        if let Some(p) = r.dir.parent().and_then(Path::parent) {
            let f = p.join("suite.json");
            if f.is_file() && !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// Reads the rows of `suite.json`: `{"rows": [{"experiment": "...", "baseline": "..." | null}]}`.
pub fn read_suite_json(path: &Path) -> Result<Vec<SuiteRowSpec>, ReportError> {
    read_suite_file(path).map(|f| f.rows)
}

/// Reads `suite.json`: `{"rows": [...], "sweep": "judge.p_pos"}` (`"sweep"` optional; a row:
/// `{"experiment": "b", "baseline": "a" | null, "compare": ["c"]}`, the last two optional).
pub fn read_suite_file(path: &Path) -> Result<SuiteFile, ReportError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    let bad = |message: String| ReportError::BadFile {
        path: path.to_path_buf(),
        message,
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let rows = v
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("expected {\"rows\": [...]}".into()))?;
    let sweep = match v.get("sweep") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(bad(
                "\"sweep\": expected a setting's path, e.g. \"judge.p_pos\"".into(),
            ));
        }
    };
    let rows = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let experiment = r
                .get("experiment")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("rows[{i}]: no \"experiment\" string")))?
                .to_string();
            let baseline = match r.get("baseline") {
                None => BaselineSpec::Above,
                Some(Value::Null) => BaselineSpec::None,
                Some(Value::String(s)) => BaselineSpec::Named(s.clone()),
                Some(_) => {
                    return Err(bad(format!("rows[{i}].baseline: expected a name or null")));
                }
            };
            let compare = match r.get("compare") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(xs)) => xs
                    .iter()
                    .map(|x| {
                        x.as_str().map(str::to_string).ok_or_else(|| {
                            bad(format!("rows[{i}].compare: expected experiment names"))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => {
                    return Err(bad(format!(
                        "rows[{i}].compare: expected a list of experiment names"
                    )));
                }
            };
            Ok(SuiteRowSpec {
                experiment,
                baseline,
                compare,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SuiteFile { rows, sweep })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::Meta;

    fn run(exp: &str, seed: u64, file: Option<&str>) -> Run {
        Run {
            dir: PathBuf::from(format!("/x/{exp}/seed-{seed}")),
            experiment: exp.into(),
            seed: Some(seed),
            meta: Meta {
                file: file.map(str::to_string),
                ..Meta::default()
            },
            lines: vec![],
            adaptation: None,
            posterior: None,
            resolved: None,
            warnings: vec![],
        }
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["r10", "r2", "r1", "a", "r02b"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, vec!["a", "r1", "r2", "r02b", "r10"]);
    }

    #[test]
    fn order_by_experiment_file_then_baseline_above() {
        let runs = vec![
            run("arith_policy", 2, Some("ablation/arith/1_policy.ron")),
            run("arith_env_gp", 1, Some("ablation/arith/4_env_gp.ron")),
            run("arith_policy", 1, Some("ablation/arith/1_policy.ron")),
            run(
                "arith_outcome_only",
                1,
                Some("ablation/arith/0_outcome_only.ron"),
            ),
        ];
        let s = Suite::from_runs(runs.clone(), &[]);
        let names: Vec<&str> = s.rows.iter().map(|r| r.experiment.as_str()).collect();
        assert_eq!(
            names,
            ["arith_outcome_only", "arith_policy", "arith_env_gp"]
        );
        assert_eq!(s.rows[0].baseline, None);
        assert_eq!(s.rows[2].baseline.as_deref(), Some("arith_policy"));
        assert_eq!(s.rows[1].seeds(), vec![1, 2]);
        // Without files for all: by name.
        let mut runs = runs;
        runs.push(run("zzz", 1, None));
        let s = Suite::from_runs(runs, &[]);
        assert_eq!(s.rows[0].experiment, "arith_env_gp");
    }

    #[test]
    fn without_suite_json_the_resolved_files_baseline_is_used() {
        let mut runs = vec![
            run("o", 1, Some("0_o.ron")),
            run("j", 1, Some("1_j.ron")),
            run("k", 1, Some("2_k.ron")),
        ];
        runs[2].resolved =
            Some("Experiment(name: \"k\", baseline: Some(\"o\"), seeds: [1])".into());
        let s = Suite::from_runs(runs, &[]);
        let got: Vec<Option<&str>> = s.rows.iter().map(|r| r.baseline.as_deref()).collect();
        assert_eq!(got, [None, Some("o"), Some("o")]);
    }

    #[test]
    fn suite_json_orders_and_names_baselines() {
        let runs = vec![run("a", 1, None), run("b", 1, None), run("c", 1, None)];
        let spec = vec![
            SuiteRowSpec {
                experiment: "c".into(),
                baseline: BaselineSpec::None,
                compare: vec![],
            },
            SuiteRowSpec {
                experiment: "a".into(),
                baseline: BaselineSpec::Above,
                compare: vec!["b".into(), "c".into(), "gone".into()],
            },
            SuiteRowSpec {
                experiment: "gone".into(),
                baseline: BaselineSpec::Above,
                compare: vec![],
            },
        ];
        let s = Suite::from_runs(runs, &spec);
        let got: Vec<(&str, Option<&str>)> = s
            .rows
            .iter()
            .map(|r| (r.experiment.as_str(), r.baseline.as_deref()))
            .collect();
        assert_eq!(got, [("c", None), ("a", Some("c")), ("b", Some("a"))]);
        // `c` is a's baseline already; `gone` has no run.
        assert_eq!(s.rows[1].compare, ["b"]);
        let w = s.warnings.join("\n");
        assert!(
            w.contains("`gone`") && w.contains("does not list `b`"),
            "{w}"
        );
        assert!(w.contains("comparison a = gone left out"), "{w}");
    }
}
