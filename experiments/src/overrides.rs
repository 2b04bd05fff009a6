//! `--set path=value`: change any field of an experiment from the command line, the way users
//! of Hydra-style configs shrink a run without editing files. The experiment is turned into
//! a JSON tree, the field at the dotted path is replaced (enum variants are stepped through:
//! `environment.max_operands` reaches into `Arith(...)`), and the tree is read back into the
//! typed experiment and validated like the file. The result is what `resolved.ron` records.

use crate::Experiment;
use rlany_framework::ExperimentError;
use serde_json::Value;
use std::path::Path;

/// A `--set` that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// Not of the form `path=value`.
    #[error("--set {0:?}: expected PATH=VALUE, e.g. budget.steps=6")]
    Syntax(String),
    /// The path names no field.
    #[error("--set {arg:?}: `{path}` names no field of the experiment (at `{at}`)")]
    NoField {
        /// The argument.
        arg: String,
        /// The dotted path.
        path: String,
        /// The part of the path that was not found.
        at: String,
    },
    /// The value is not a RON/JSON value.
    #[error("--set {arg:?}: cannot read the value: {message}")]
    Value {
        /// The argument.
        arg: String,
        /// Why.
        message: String,
    },
    /// The changed experiment does not fit the schema.
    #[error("--set {arg:?}: {message}")]
    Schema {
        /// The argument(s).
        arg: String,
        /// What the schema says.
        message: String,
    },
    /// The changed experiment is out of range.
    #[error("--set: {0}")]
    Invalid(#[source] ExperimentError),
}

/// `exp` with every `path=value` of `sets` applied, validated.
pub fn apply(exp: &Experiment, sets: &[String]) -> Result<Experiment, OverrideError> {
    apply_where_present(exp, sets, false).map(|(e, _)| e)
}

/// Like [`apply`], but with `skip_absent` a `path` this experiment does not have (e.g.
/// `judge.lr` on a row without a judge) is skipped instead of refused; returns the indices
/// of the skipped `sets`. A suite applies its `--set`s to every row this way and refuses a
/// path that no row has.
pub fn apply_where_present(
    exp: &Experiment,
    sets: &[String],
    skip_absent: bool,
) -> Result<(Experiment, Vec<usize>), OverrideError> {
    let mut skipped = Vec::new();
    if sets.is_empty() {
        return Ok((exp.clone(), skipped));
    }
    let mut tree = serde_json::to_value(exp).map_err(|e| OverrideError::Schema {
        arg: sets.join(" "),
        message: e.to_string(),
    })?;
    // Fields the resolved text leaves out at their default are still settable.
    if let Value::Object(root) = &mut tree {
        root.entry("shards").or_insert(Value::from(exp.shards));
    }
    // Leaves a set created (fields the resolved text leaves out at their default, like a
    // process environment's `max_failure_rate`): `(set index, path, leaf key)`.
    let mut created: Vec<(usize, String, String)> = Vec::new();
    // Paths set to the bare word `None`: a unit variant (`judge=None`) or, where the field is
    // optional, RON's empty option, read as `null` once the typed read says it is not a variant.
    let mut nones: Vec<String> = Vec::new();
    for (i, arg) in sets.iter().enumerate() {
        let (path, text) = arg
            .split_once('=')
            .filter(|(p, _)| !p.trim().is_empty())
            .ok_or_else(|| OverrideError::Syntax(arg.clone()))?;
        let value = parse_value(text.trim()).map_err(|message| OverrideError::Value {
            arg: arg.clone(),
            message,
        })?;
        if text.trim() == "None" {
            nones.push(path.trim().to_string());
        }
        match field_mut(&mut tree, path.trim(), true) {
            Ok((slot, new_leaf)) => {
                *slot = value;
                if new_leaf {
                    let leaf = path
                        .trim()
                        .rsplit('.')
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    created.push((i, path.trim().to_string(), leaf));
                }
            }
            Err(_) if skip_absent => skipped.push(i),
            Err(at) => {
                return Err(OverrideError::NoField {
                    arg: arg.clone(),
                    path: path.trim().to_string(),
                    at,
                });
            }
        }
    }
    // A created leaf the schema does not know is a field that does not exist: refused by
    // name (or skipped for a suite row), and the rest read again without it.
    let out: Experiment = loop {
        match serde_json::from_value::<Experiment>(tree.clone()) {
            Ok(e) => break e,
            Err(e) => {
                let message = e.to_string();
                if message.contains("invalid type: string \"None\"") && !nones.is_empty() {
                    for path in nones.drain(..) {
                        if let Ok((slot, _)) = field_mut(&mut tree, &path, false) {
                            *slot = Value::Null;
                        }
                    }
                    continue;
                }
                let unknown = created
                    .iter()
                    .position(|(_, _, leaf)| message.contains(&format!("unknown field `{leaf}`")));
                let Some(k) = unknown else {
                    return Err(OverrideError::Schema {
                        arg: sets.join(" "),
                        message,
                    });
                };
                let (i, path, leaf) = created.remove(k);
                if !skip_absent {
                    return Err(OverrideError::NoField {
                        arg: sets[i].clone(),
                        path,
                        at: leaf,
                    });
                }
                remove_field(&mut tree, &path);
                skipped.push(i);
            }
        }
    };
    skipped.sort_unstable();
    // Validated like a file: the resolved text gives the error its line.
    let text = out.to_ron();
    let exp = Experiment::parse(&text, Path::new("<experiment with --set>"))
        .map_err(OverrideError::Invalid)?;
    Ok((exp, skipped))
}

/// The JSON value of `text`: JSON itself (numbers, `true`, `"text"`, `[1, 2]`), a bare
/// identifier as a unit enum variant (`K2`, `Reference`, `Static`), or RON (`(0.2, 0.8)`).
fn parse_value(text: &str) -> Result<Value, String> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(v);
    }
    let ident = !text.is_empty()
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && text.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if ident {
        return Ok(Value::String(text.to_string()));
    }
    // `Variant(fields…)`: an enum variant with a payload, e.g. `Threshold(step: 0.2)`.
    if let Some(open) = text.find('(')
        && text.ends_with(')')
        && open > 0
        && text[..open]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && text.starts_with(|c: char| c.is_ascii_uppercase())
    {
        let payload = ron::from_str::<Value>(&text[open..]).map_err(|e| e.to_string())?;
        let payload = match payload {
            Value::Array(mut a) if a.len() == 1 => a.remove(0),
            // `Variant()`: every field at its default.
            Value::Null => Value::Object(serde_json::Map::new()),
            other => other,
        };
        // RON's `Some(x)` of an optional field is `x` itself in the tree (no enum of the
        // schema has a variant named `Some`).
        if &text[..open] == "Some" {
            return Ok(payload);
        }
        let mut map = serde_json::Map::new();
        map.insert(text[..open].to_string(), payload);
        return Ok(Value::Object(map));
    }
    ron::from_str::<Value>(text).map_err(|e| e.to_string())
}

/// The value at dotted `path`, stepping through single-variant enum objects
/// (`{"Arith": {...}}`) when the variant is not itself named in the path. With `create`, a
/// missing last key of an existing object is inserted (`null`, reported by `true`): the
/// typed read-back decides whether the field exists. `Err` holds the part of the path that
/// was not found.
fn field_mut<'a>(
    tree: &'a mut Value,
    path: &str,
    create: bool,
) -> Result<(&'a mut Value, bool), String> {
    let keys: Vec<&str> = path.split('.').collect();
    let mut cur = tree;
    for (n, key) in keys.iter().enumerate() {
        let last = n + 1 == keys.len();
        let Value::Object(map) = cur else {
            return Err(key.to_string());
        };
        // Step into a single-variant enum object unless the key is its own field.
        let map = if !map.contains_key(*key)
            && map.len() == 1
            && map
                .keys()
                .next()
                .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_uppercase()))
        {
            let variant = map.keys().next().cloned().unwrap_or_default();
            match map.get_mut(&variant) {
                Some(Value::Object(m)) => m,
                _ => return Err(key.to_string()),
            }
        } else {
            map
        };
        if !map.contains_key(*key) {
            if create && last {
                map.insert(key.to_string(), Value::Null);
                let slot = map.get_mut(*key).ok_or_else(|| key.to_string())?;
                return Ok((slot, true));
            }
            return Err(key.to_string());
        }
        cur = map.get_mut(*key).ok_or_else(|| key.to_string())?;
    }
    Ok((cur, false))
}

/// Removes the field at dotted `path` (one [`field_mut`] created).
fn remove_field(tree: &mut Value, path: &str) {
    let (parent, leaf) = match path.rsplit_once('.') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let map = match parent {
        Some(p) => field_mut(tree, p, false).ok().map(|(v, _)| v),
        None => Some(tree),
    };
    if let Some(Value::Object(m)) = map
        && m.remove(leaf).is_none()
        && m.len() == 1
        && let Some(Value::Object(inner)) = m.values_mut().next()
    {
        inner.remove(leaf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
Experiment(
    name: "t",
    seeds: [1],
    environment: Arith(max_operands: 3),
    policy: (model: Scratch(d_model: 32)),
    algorithm: Ppo(lr: 1e-4),
    budget: (steps: 20, group_size: 4),
)
"#;

    fn exp() -> Experiment {
        Experiment::parse(FILE, Path::new("x.ron")).expect("parses")
    }

    fn set(args: &[&str]) -> Result<Experiment, OverrideError> {
        apply(
            &exp(),
            &args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    }

    #[test]
    fn fields_at_any_depth_and_through_variants() {
        let e = set(&[
            "budget.steps=6",
            "algorithm.lr=0.001",
            "environment.max_operands=5",
            "policy.model.d_model=16",
            "algorithm.kl.estimator=K2",
            "reward.policy_band=(0.1, 0.9)",
            "seeds=[4, 5]",
            "name=\"u\"",
            "shards=2",
        ])
        .expect("applies");
        assert_eq!(e.budget.steps, 6);
        assert_eq!(e.ppo().lr, 0.001);
        assert_eq!(
            e.ppo().kl.estimator,
            rlany_framework::experiment::KlEstimator::K2
        );
        assert_eq!(e.reward.policy_band, (0.1, 0.9));
        assert_eq!(e.seeds, vec![4, 5]);
        assert_eq!(e.name, "u");
        assert_eq!(e.shards, 2);
        assert_eq!(e.policy.model.spec().map(|m| m.d_model), Some(16));
        match &e.environment {
            crate::EnvironmentSpec::Arith(a) => assert_eq!(a.max_operands, 5),
            other => panic!("{other:?}"),
        }
        // Everything else is untouched.
        assert_eq!(e.budget.group_size, 4);
    }

    #[test]
    fn whole_sections_and_variants_can_be_replaced() {
        let e = set(&["adaptation=Threshold(step: 0.2, band: (0.3, 0.7))"]).expect("variant");
        match &e.adaptation {
            crate::AdaptationSpec::Threshold(t) => assert_eq!((t.step, t.band), (0.2, (0.3, 0.7))),
            other => panic!("{other:?}"),
        }
        let e = set(&["judge=None"]).expect("unit variant");
        assert!(e.judge.model().is_none());
        // Empty parentheses: the variant with every field at its default.
        let e = set(&["adaptation=Gp()"]).expect("a default Gp");
        assert!(
            matches!(e.adaptation, crate::AdaptationSpec::Gp(_)),
            "{:?}",
            e.adaptation
        );
        let e = set(&["judge=Learned()"]).expect("a default learned judge");
        assert!(e.judge.model().is_some());
    }

    /// An optional field takes RON's own words: `None` (as well as JSON's `null`) and
    /// `Some(...)` (or the value alone); `None` still names a unit variant where the field is
    /// an enum.
    #[test]
    fn optional_fields_take_none_and_some() {
        let lora = |e: &Experiment| match &e.policy.model {
            rlany_framework::experiment::ModelSource::Pretrained(p) => p.lora.clone(),
            other => panic!("{other:?}"),
        };
        // Nested in a variant's payload, RON's strict form: `Some((…))`.
        let e = set(&["policy.model=Pretrained(path: \"m.gguf\", lora: Some((r: 4)))"])
            .expect("Some((..)) inside a variant");
        assert_eq!(lora(&e).map(|l| l.r), Some(4));
        let sets = |extra: &str| {
            vec![
                "policy.model=Pretrained(path: \"m.gguf\")".to_string(),
                extra.to_string(),
            ]
        };
        for some in ["policy.model.lora=Some(r: 2)", "policy.model.lora=(r: 2)"] {
            let e = apply(&exp(), &sets(some)).expect(some);
            assert_eq!(lora(&e).map(|l| l.r), Some(2), "{some}");
        }
        for none in ["policy.model.lora=None", "policy.model.lora=null"] {
            let with = apply(&exp(), &sets("policy.model.lora=Some(r: 2)")).expect("lora");
            let e = apply(&with, &[none.to_string()]).expect(none);
            assert_eq!(lora(&e), None, "{none}");
        }
        let e = set(&["judge=None"]).expect("still the unit variant");
        assert!(e.judge.model().is_none());
    }

    #[test]
    fn bad_overrides_are_clear_errors() {
        assert!(matches!(
            set(&["budget.steps"]),
            Err(OverrideError::Syntax(_))
        ));
        assert!(matches!(
            set(&["budget.stepz=3"]),
            Err(OverrideError::NoField { .. })
        ));
        assert!(matches!(
            set(&["budget.steps=\"many\""]),
            Err(OverrideError::Schema { .. })
        ));
        match set(&["budget.steps=0"]) {
            Err(OverrideError::Invalid(e)) => {
                assert!(e.to_string().contains("budget.steps"), "{e}")
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    /// Fields the resolved text leaves out at their default (a household's `slack`, a
    /// process environment's failure bounds) are settable; a name no schema has is still
    /// refused by name.
    #[test]
    fn fields_left_out_at_their_default_are_settable() {
        let hh = Experiment::parse(
            &FILE.replace("Arith(max_operands: 3)", "Household()"),
            Path::new("h.ron"),
        )
        .expect("parses");
        assert!(!hh.to_ron().contains("slack"), "left out at its default");
        let (e, skipped) =
            apply_where_present(&hh, &["environment.slack=12".to_string()], false).expect("set");
        assert!(e.to_ron().contains("slack: 12"), "{}", e.to_ron());
        assert!(skipped.is_empty());
        let p = Experiment::parse(
            &FILE.replace(
                "Arith(max_operands: 3)",
                r#"Process(command: ["python3", "x.py"], difficulty: [0.5])"#,
            ),
            Path::new("p.ron"),
        )
        .expect("parses");
        let e = apply(&p, &["environment.max_failure_rate=1.0".to_string()]).expect("set");
        assert!(
            e.to_ron().contains("max_failure_rate: 1.0"),
            "{}",
            e.to_ron()
        );
        match set(&["environment.max_operandz=5"]) {
            Err(OverrideError::NoField { at, .. }) => assert_eq!(at, "max_operandz"),
            other => panic!("{other:?}"),
        }
        // A suite row without the field skips the set instead.
        let (_, skipped) =
            apply_where_present(&exp(), &["environment.slack=12".to_string()], true).expect("ok");
        assert_eq!(skipped, [0]);
    }
}
