//! docs/experiment-file.md is the reference of an experiment file: these tests fail when a
//! field or variant of the schema is missing from it, when it documents one the schema does
//! not have, or when one of its examples no longer parses.
//!
//! The schema is read from the types themselves: serde-reflection traces the deserialization
//! of [`rlany::Experiment`] (every struct, every enum and every variant it reaches, fields left
//! at their defaults included), so a field added to any settings struct, or a plugin added to
//! experiments/src/plugins.rs, is seen here without a list to keep up to date.

use serde_reflection::{ContainerFormat, Registry, Samples, Tracer, TracerConfig, VariantFormat};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn doc_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join("docs/experiment-file.md")
}

fn doc() -> String {
    let path = doc_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The traced schema. Each pass of the tracer over [`rlany::Experiment`] explores one more
/// variant of every enum it meets, but an enum it has marked incomplete is not explored
/// again until the mark is cleared, which the tracer does itself only for the traced type.
/// So the marks of the nested enums are cleared after each pass, until a pass leaves none;
/// their names come from the error of a registry read too early (reading the registry
/// consumes the tracer, hence a fresh tracer for each attempt).
fn registry() -> Registry {
    let samples = Samples::new();
    let mut enums: BTreeSet<String> = BTreeSet::new();
    loop {
        let mut tracer = Tracer::new(TracerConfig::default());
        for _ in 0..1000 {
            tracer
                .trace_type_once::<rlany::Experiment>(&samples)
                .expect("the experiment schema traces");
            let mut incomplete = false;
            for name in &enums {
                incomplete |= tracer.check_incomplete_enum(name).is_some();
            }
            if !incomplete {
                break;
            }
        }
        match tracer.registry() {
            Ok(r) => return r,
            Err(serde_reflection::Error::MissingVariants(names))
                if names.iter().any(|n| !enums.contains(n)) =>
            {
                enums.extend(names)
            }
            Err(e) => panic!("the experiment schema did not trace completely: {e:?}"),
        }
    }
}

/// Every container of the schema (by its Rust name, as serde names it) with the names a file
/// writes in it: a struct's fields; an enum's variants and the fields of its struct-like
/// variants (`Ucb(beta: 2.0)`).
fn schema() -> BTreeMap<String, Vec<String>> {
    registry()
        .into_iter()
        .map(|(container, format)| {
            let names = match format {
                ContainerFormat::Struct(fields) => fields.into_iter().map(|f| f.name).collect(),
                ContainerFormat::Enum(variants) => {
                    let mut names = Vec::new();
                    for v in variants.into_values() {
                        names.push(v.name);
                        if let VariantFormat::Struct(fields) = v.value {
                            names.extend(fields.into_iter().map(|f| f.name));
                        }
                    }
                    names
                }
                ContainerFormat::UnitStruct
                | ContainerFormat::NewTypeStruct(_)
                | ContainerFormat::TupleStruct(_) => Vec::new(),
            };
            (container, names)
        })
        .collect()
}

/// The doc's sections: heading line -> the lines up to the next heading.
fn sections(doc: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with('#') {
            out.push((line.to_string(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// The name in a table row's first cell when it is one backticked identifier
/// (`` | `lr` | f64 | … ``).
fn row_name(line: &str) -> Option<&str> {
    let cell = line.trim().strip_prefix('|')?.split('|').next()?.trim();
    let name = cell.strip_prefix('`')?.strip_suffix('`')?;
    name.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        .then_some(name)
}

/// Every struct and enum of the schema has its own section, headed by its Rust name in
/// backticks (`` ## `Budget` ``), and every field and variant of it is named there in
/// backticks; and every name in the first column of a section's tables belongs to the
/// schema (a renamed or removed field leaves no stale row).
#[test]
fn every_field_and_variant_of_the_schema_is_documented() {
    let schema = schema();
    let doc = doc();
    let sections = sections(&doc);
    let mut missing = Vec::new();
    let mut stale = Vec::new();
    let mut checked = 0;
    for (container, names) in &schema {
        let tag = format!("`{container}`");
        let own: Vec<&(String, String)> =
            sections.iter().filter(|(h, _)| h.contains(&tag)).collect();
        let [(_, body)] = own.as_slice() else {
            missing.push(format!(
                "{container}: {} headings name {tag} (expected exactly one section)",
                own.len()
            ));
            continue;
        };
        for name in names {
            checked += 1;
            if !body.contains(&format!("`{name}`")) {
                missing.push(format!("{container}: `{name}`"));
            }
        }
        for row in body.lines().filter_map(row_name) {
            if !names.iter().any(|n| n == row) {
                stale.push(format!("{container}: `{row}`"));
            }
        }
    }
    eprintln!(
        "{} containers, {checked} field and variant names checked",
        schema.len()
    );
    assert!(
        missing.is_empty() && stale.is_empty(),
        "{}: {} names of the experiment schema are not documented in their section:\n  {}\n\
         {} documented names are not in the schema:\n  {}",
        doc_path().display(),
        missing.len(),
        missing.join("\n  "),
        stale.len(),
        stale.join("\n  "),
    );
}

/// The ```ron blocks of the doc that hold a whole experiment (`Experiment(` after their
/// comments).
fn whole_examples(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut block: Option<String> = None;
    for line in doc.lines() {
        match &mut block {
            None if line.trim_start().starts_with("```ron") => block = Some(String::new()),
            Some(b) if line.trim_start().starts_with("```") => {
                let first = b
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty() && !l.starts_with("//"));
                if first.is_some_and(|l| l.starts_with("Experiment(")) {
                    out.push(b.clone());
                }
                block = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The `--set PATH=VALUE` arguments of each command line of the doc's ```sh blocks (a value
/// in single quotes may hold spaces).
fn set_examples(doc: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in doc.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            in_sh = !in_sh && t.starts_with("```sh");
            continue;
        }
        if !in_sh {
            continue;
        }
        let mut sets = Vec::new();
        let mut rest = line;
        while let Some(i) = rest.find("--set ") {
            rest = rest[i + "--set ".len()..].trim_start();
            let (arg, tail) = match rest.strip_prefix('\'') {
                Some(quoted) => quoted.split_once('\'').unwrap_or((quoted, "")),
                None => rest.split_once(char::is_whitespace).unwrap_or((rest, "")),
            };
            sets.push(arg.to_string());
            rest = tail;
        }
        if !sets.is_empty() {
            out.push(sets);
        }
    }
    out
}

/// The doc's whole examples parse and validate, and the `--set`s of each of its example
/// command lines apply to the first of them.
#[test]
fn the_examples_of_the_doc_parse_and_its_overrides_apply() {
    let doc = doc();
    let examples = whole_examples(&doc);
    assert!(!examples.is_empty(), "no ```ron block holds an Experiment(");
    let parsed: Vec<rlany::Experiment> = examples
        .iter()
        .enumerate()
        .map(|(i, text)| {
            // Read as if beside the arith suite's rows: the `base:` example names its row 0.
            let at = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("ablation/arith")
                .join(format!("doc-example-{}.ron", i + 1));
            rlany::Experiment::parse(text, &at).unwrap_or_else(|e| panic!("{e}\n{text}"))
        })
        .collect();
    let commands = set_examples(&doc);
    assert!(commands.len() >= 5, "too few --set examples: {commands:?}");
    for sets in &commands {
        if let Err(e) = rlany::overrides::apply(&parsed[0], sets) {
            panic!("the doc's --set {sets:?} do not apply to its first example: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// docs/extend.md's skeleton of an environment plugin. The code between the two marker lines is
// the doc's ```rust block, character for character: `the_extend_skeleton_is_the_doc_s` reads
// this file and the doc and compares them, so edit both together.

// BEGIN docs/extend.md skeleton
use rlany_contract::check::{self, Checked};
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Split, StepResult};
use serde::{Deserialize, Serialize};

/// `environment: Echo(difficulty: [0.5])`: repeat a number of 1 to 6 digits (OOD: 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EchoSpec {
    /// Starting difficulty, dimension `digits`.
    pub difficulty: Vec<f64>,
}

impl Default for EchoSpec {
    fn default() -> Self {
        Self {
            difficulty: vec![0.5],
        }
    }
}

impl EnvironmentPlugin for EchoSpec {
    fn validate(&self) -> Checked {
        check::difficulty("difficulty", &self.difficulty, &["digits"])
    }
    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }
    fn build(&self) -> Box<dyn Environment> {
        Box::new(Echo)
    }
}

pub struct Echo;

/// The task's number, a pure function of its arguments; `n mod 3` tells the splits apart.
fn number(d: &[f64], split: Split, seed: u64) -> u64 {
    let level = d.first().map_or(0.0, |x| x.clamp(0.0, 1.0));
    let digits = if split == Split::Ood {
        7
    } else {
        1 + (level * 5.0).round() as u32
    };
    let lo = 10u64.pow(digits - 1);
    let draw = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
    lo + 3 * (draw % (3 * lo)) + split as u64
}

impl Environment for Echo {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![Dim::new("digits", 1.0, 6.0)]
    }
    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(EchoEpisode {
            n: number(d, split, seed),
            answer: None,
        })
    }
    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        // The flawed expert answers one too many with probability `noise`, drawn from `seed`.
        let u = (seed.wrapping_mul(0xD1B5_4A32_D192_ED03) >> 11) as f64 / (1u64 << 53) as f64;
        let n = number(d, Split::Train, seed);
        (
            format!("Repeat {n}\n"),
            vec![(n + u64::from(u < noise)).to_string()],
        )
    }
}

pub struct EchoEpisode {
    n: u64,
    answer: Option<String>,
}

impl Episode for EchoEpisode {
    fn prompt(&self) -> String {
        format!("Repeat {}\n", self.n)
    }
    fn step(&mut self, action: &str) -> StepResult {
        if self.answer.is_some() {
            return StepResult::ended();
        }
        self.answer = Some(action.trim().to_string());
        // One step: done, labelled right or wrong, exercising (and blamed on) `digits`.
        StepResult::taken(String::new(), true, self.outcome(), vec![0], vec![0])
    }
    fn done(&self) -> bool {
        self.answer.is_some()
    }
    fn outcome(&self) -> bool {
        self.answer == Some(self.n.to_string())
    }
}
// END docs/extend.md skeleton

/// The skeleton's settings parse as an experiment file writes them, and its environment
/// passes the conformance checks every built-in one passes (`rlany env NAME --check`), and
/// the expert plays one episode to a success.
#[test]
fn the_extend_skeleton_passes_the_conformance_checks() {
    let spec: EchoSpec = ron::from_str("(difficulty: [0.2])").expect("the settings parse");
    spec.validate().expect("the settings are valid");
    assert!(
        EchoSpec {
            difficulty: vec![2.0]
        }
        .validate()
        .is_err()
    );
    let env = spec.build();
    let checks = rlany_envs::conformance::run(&rlany_envs::conformance::Compiled(env.as_ref()));
    assert_eq!(checks.len(), 7, "{checks:?}");
    let failed: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
    assert!(failed.is_empty(), "failed conformance checks: {failed:?}");

    let d = spec.start_difficulty();
    let (prompt, actions) = env.demonstration(&d, 0.0, 7);
    let mut episode = env.sample(&d, Split::Train, 7);
    assert_eq!(episode.prompt(), prompt);
    for action in &actions {
        let answer = episode.step(action);
        assert!(answer.label, "{answer:?}");
    }
    assert!(episode.done() && episode.outcome());
}

/// The text between two lines of `text` that start with `begin` and `end` (excluded).
fn between<'a>(text: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let start = text.find(begin)?;
    let start = start + text[start..].find('\n')? + 1;
    let stop = start + text[start..].find(end)?;
    Some(&text[start..stop])
}

/// docs/extend.md's ```rust block that starts with the skeleton's first line is the code
/// above, character for character.
#[test]
fn the_extend_skeleton_is_the_doc_s() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let read = |p: &Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let source = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/docs.rs"));
    let doc = read(&root.join("docs/extend.md"));
    let code = between(
        &source,
        "// BEGIN docs/extend.md skeleton",
        "// END docs/extend.md skeleton",
    )
    .expect("the skeleton's markers in tests/docs.rs");
    let first = code.lines().next().expect("a first line");
    let block = doc
        .split("```rust\n")
        .skip(1)
        .find(|b| b.starts_with(first))
        .and_then(|b| b.split("```").next())
        .expect("docs/extend.md has a ```rust block starting with the skeleton's first line");
    assert!(
        block == code,
        "docs/extend.md's skeleton differs from the one tests/docs.rs compiles; copy the code \
         between the markers of experiments/tests/docs.rs into the doc"
    );
}

// ---------------------------------------------------------------------------------------------
// The README: its commands name files that parse, and every relative link resolves.

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// A command line split into words (a word in single quotes may hold spaces).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let (word, tail) = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.split_once('\'').unwrap_or((quoted, "")),
            None => rest.split_once(char::is_whitespace).unwrap_or((rest, "")),
        };
        out.push(word.to_string());
        rest = tail.trim_start();
    }
    out
}

/// The `cargo run --release -- run|ablate|judge-fit …` commands in the README's "What you can
/// run" table: (subcommand, file or folder, `--set` arguments).
fn readme_commands(readme: &str) -> Vec<(String, String, Vec<String>)> {
    let table = between(readme, "## What you can run", "\n## ").expect("the README's table");
    let mut out = Vec::new();
    for row in table.lines().filter(|l| l.starts_with('|')) {
        for (i, span) in row.split('`').enumerate() {
            let Some(cmd) = span.strip_prefix("cargo run --release -- ") else {
                continue;
            };
            if i % 2 == 0 {
                continue; // outside backticks
            }
            let w = words(cmd);
            let Some(sub) = w.first() else { continue };
            if !["run", "ablate", "judge-fit"].contains(&sub.as_str()) {
                continue;
            }
            let file = w.get(1).expect("a file after the subcommand").clone();
            let sets = w
                .windows(2)
                .filter(|p| p[0] == "--set")
                .map(|p| p[1].clone())
                .collect();
            out.push((sub.clone(), file, sets));
        }
    }
    out
}

/// Every `run`, `ablate` and `judge-fit` command of the README's table names a file (or a
/// suite folder of files) that parses and validates, and its `--set`s apply.
#[test]
fn the_readme_s_commands_name_files_that_parse() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let commands = readme_commands(&readme);
    assert!(commands.len() >= 10, "too few commands found: {commands:?}");
    let mut errors = Vec::new();
    for (sub, file, sets) in &commands {
        let path = root.join(file);
        let files: Vec<PathBuf> = if sub == "ablate" {
            let mut rows: Vec<PathBuf> = std::fs::read_dir(&path)
                .unwrap_or_else(|e| panic!("{sub} {file}: {e}"))
                .map(|e| e.expect("a folder entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "ron"))
                .collect();
            rows.sort();
            assert!(!rows.is_empty(), "{sub} {file}: no .ron file");
            rows
        } else {
            vec![path]
        };
        for f in files {
            match rlany::Experiment::load(&f) {
                Ok(exp) => {
                    if let Err(e) = rlany::overrides::apply(&exp, sets) {
                        errors.push(format!("{sub} {}: --set {sets:?}: {e}", f.display()));
                    }
                }
                Err(e) => errors.push(format!("{sub} {}: {e}", f.display())),
            }
        }
    }
    assert!(errors.is_empty(), "README.md:\n  {}", errors.join("\n  "));
}

/// Every relative link of README.md and docs/*.md (`[text](path)`, `![alt](path)`, outside
/// fenced code) names a file or folder that exists; web links are skipped and a `#fragment`
/// is not checked.
#[test]
fn every_relative_link_of_the_docs_resolves() {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a markdown page");
        let dir = page.parent().expect("the page's folder");
        let mut in_code = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for (i, _) in line.match_indices("](") {
                let target = &line[i + 2..];
                let Some(end) = target.find(')') else {
                    continue;
                };
                let target = target[..end].trim();
                let is_web = target.split_once(':').is_some_and(|(scheme, _)| {
                    !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphabetic())
                });
                if is_web || target.starts_with('#') || target.is_empty() {
                    continue;
                }
                let path = target.split('#').next().unwrap_or(target);
                checked += 1;
                if !dir.join(path).exists() {
                    broken.push(format!("{}:{}: {target}", page.display(), n + 1));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} links found");
    assert!(
        broken.is_empty(),
        "links to missing files:\n  {}",
        broken.join("\n  ")
    );
}
