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
