//! The replies of protocol 1, read into typed structs and checked: a reply with a missing
//! field, a field of the wrong type, a field the protocol does not have (a typo such as
//! `lable`), or a value out of range is an error naming the field (the host treats it as
//! garbage: the child is killed and replaced, and the error names the child's command).

use rlany_contract::Dim;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The most difficulty dimensions a child may describe.
pub const MAX_DIMS: usize = 16;
/// The most eval-grid levels a child may name.
pub const MAX_LEVELS: usize = 32;
/// The most actions a demonstration may have.
pub const MAX_DEMO_STEPS: usize = 1024;

type Reply = Map<String, Value>;

/// `r` as the wire struct `T`; an error names the field that failed (`dims[0].lo`) and
/// says what serde expected, or names the unknown field.
fn wire<T: DeserializeOwned>(r: &Reply) -> Result<T, String> {
    serde_path_to_error::deserialize(Value::Object(r.clone())).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("`{path}`: {inner}")
        }
    })
}

/// Indices into the difficulty space (`dims`, `blame`), each below `dims`.
fn indices(v: Option<Vec<u64>>, field: &str, dims: usize) -> Result<Vec<usize>, String> {
    v.unwrap_or_default()
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < dims)
                .ok_or_else(|| format!("`{field}` holds {i}: expected dimension indices 0..{dims}"))
        })
        .collect()
}

/// A `hello` reply on the wire (`protocol` is checked before it is read).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HelloWire {
    /// Checked on the raw reply, before the fields are read.
    #[serde(rename = "protocol")]
    _protocol: u64,
    name: String,
    #[serde(default)]
    version: Option<String>,
    dims: Vec<DimWire>,
    #[serde(default)]
    eval_levels: Option<Vec<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DimWire {
    name: String,
    lo: f64,
    hi: f64,
}

/// The `hello` reply: what the environment is.
#[derive(Debug, Clone, PartialEq)]
pub struct Describe {
    /// The environment's name.
    pub name: String,
    /// Its version, when it says.
    pub version: Option<String>,
    /// The difficulty dimensions.
    pub dims: Vec<Dim>,
    /// The in-domain eval grid.
    pub eval_levels: Vec<f64>,
}

impl Describe {
    /// Reads a `hello` reply.
    pub fn read(r: &Reply) -> Result<Self, String> {
        // The version first: a child of another version may have other fields.
        match r.get("protocol").and_then(Value::as_u64) {
            Some(super::child::PROTOCOL) => {}
            other => {
                return Err(format!(
                    "`protocol` is {}, this host speaks {}",
                    other.map_or("missing".into(), |p| p.to_string()),
                    super::child::PROTOCOL
                ));
            }
        }
        let w: HelloWire = wire(r)?;
        if w.dims.is_empty() || w.dims.len() > MAX_DIMS {
            return Err(format!(
                "`dims` must list 1 to {MAX_DIMS} dimensions, got {}",
                w.dims.len()
            ));
        }
        for (i, d) in w.dims.iter().enumerate() {
            if d.name.is_empty()
                || d.name.len() > 32
                || !d
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "`dims[{i}].name` must be 1–32 letters, digits, `_` or `-`, got {:?}",
                    d.name
                ));
            }
        }
        let eval_levels = match w.eval_levels {
            None => vec![0.0, 0.25, 0.5, 0.75, 1.0],
            Some(levels) if levels.is_empty() => vec![0.0, 0.25, 0.5, 0.75, 1.0],
            Some(levels) if levels.len() > MAX_LEVELS => {
                return Err(format!("`eval_levels` has more than {MAX_LEVELS} levels"));
            }
            Some(levels) => {
                if let Some(x) = levels.iter().find(|x| !(0.0..=1.0).contains(*x)) {
                    return Err(format!("`eval_levels` holds {x}, outside [0, 1]"));
                }
                levels
            }
        };
        Ok(Self {
            name: w.name,
            version: w.version,
            dims: w
                .dims
                .into_iter()
                .map(|d| Dim {
                    name: d.name,
                    lo: d.lo,
                    hi: d.hi,
                })
                .collect(),
            eval_levels,
        })
    }
}

/// The `reset` reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reset {
    /// The task text (ends with a newline: the host adds one when it does not).
    pub prompt: String,
    /// What a pretrained chat model is told first.
    #[serde(default)]
    pub instructions: Option<String>,
    /// The task's identity (defaults to the prompt).
    #[serde(default)]
    pub key: Option<String>,
}

impl Reset {
    /// Reads a `reset` reply.
    pub fn read(r: &Reply) -> Result<Self, String> {
        let mut reset: Reset = wire(r)?;
        if !reset.prompt.ends_with('\n') {
            reset.prompt.push('\n');
        }
        Ok(reset)
    }
}

/// A `step` reply on the wire: optional fields may be absent or `null`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepWire {
    observation: String,
    done: bool,
    #[serde(default)]
    won: Option<bool>,
    #[serde(default)]
    label: Option<bool>,
    #[serde(default)]
    dims: Option<Vec<u64>>,
    #[serde(default)]
    blame: Option<Vec<u64>>,
    #[serde(default)]
    kind: Option<String>,
}

/// The `step` reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// What the agent reads next.
    pub observation: String,
    /// The episode is over.
    pub done: bool,
    /// The task is solved (the verifier).
    pub won: bool,
    /// The oracle's label of this step (default false).
    pub label: bool,
    /// The dimensions this step exercises.
    pub dims: Vec<usize>,
    /// The oracle's blame of this step.
    pub blame: Vec<usize>,
    /// The environment's kind of step (empty when not given).
    pub kind: String,
}

impl Step {
    /// Reads a `step` reply for an environment of `dims` dimensions.
    pub fn read(r: &Reply, dims: usize) -> Result<Self, String> {
        let w: StepWire = wire(r)?;
        Ok(Self {
            observation: w.observation,
            done: w.done,
            won: w.won.unwrap_or(false),
            label: w.label.unwrap_or(false),
            dims: indices(w.dims, "dims", dims)?,
            blame: indices(w.blame, "blame", dims)?,
            kind: match w.kind {
                Some(k) if !rlany_contract::env::valid_kind(&k) => {
                    return Err(format!(
                        "`kind` {k:?} is not a step kind (at most {} characters of a-z, 0-9 and _)",
                        rlany_contract::env::MAX_KIND_LEN
                    ));
                }
                k => k.unwrap_or_default(),
            },
        })
    }
}

/// A `demo` reply on the wire.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DemoWire {
    actions: Vec<String>,
}

/// The `demo` reply: the expert's actions.
pub fn demo(r: &Reply) -> Result<Vec<String>, String> {
    let w: DemoWire = wire(r)?;
    if w.actions.len() > MAX_DEMO_STEPS {
        return Err(format!("`actions` has more than {MAX_DEMO_STEPS} steps"));
    }
    Ok(w.actions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Reply {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_hello_reply_is_read_and_checked() {
        let ok = obj(json!({"protocol": 1, "name": "n",
            "dims": [{"name": "a", "lo": 1, "hi": 9}, {"name": "b_2", "lo": 0.5, "hi": 0}]}));
        let d = Describe::read(&ok).expect("valid");
        assert_eq!(d.dims.len(), 2);
        assert_eq!((d.dims[1].lo, d.dims[1].hi), (0.5, 0.0));
        assert_eq!(d.eval_levels, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        for (bad, says) in [
            (
                json!({"protocol": 2, "name": "n", "dims": [{"name": "a", "lo": 0, "hi": 1}]}),
                "`protocol` is 2",
            ),
            (json!({"protocol": 1, "name": "n", "dims": []}), "1 to 16"),
            (
                json!({"protocol": 1, "name": "n", "dims": [{"name": "a b", "lo": 0, "hi": 1}]}),
                "dims[0].name",
            ),
            (
                json!({"protocol": 1, "name": "n", "dims": [{"name": "a", "lo": "x", "hi": 1}]}),
                "dims[0].lo",
            ),
            (
                json!({"protocol": 1, "dims": [{"name": "a", "lo": 0, "hi": 1}]}),
                "`name`",
            ),
            (
                json!({"protocol": 1, "name": "n", "dims": [{"name": "a", "lo": 0, "hi": 1}], "eval_levels": [1.5]}),
                "outside [0, 1]",
            ),
        ] {
            let e = Describe::read(&obj(bad)).expect_err("invalid");
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn a_step_reply_defaults_and_refuses_out_of_range_dims() {
        let s = Step::read(&obj(json!({"observation": "at 3", "done": false})), 2).expect("ok");
        assert_eq!((s.won, s.label, s.dims.len()), (false, false, 0));
        let s = Step::read(&obj(json!({"observation": "", "done": true, "won": true, "label": true, "dims": [0, 1], "blame": [1]})), 2).expect("ok");
        assert_eq!(
            (s.won, s.dims, s.blame, s.kind),
            (true, vec![0, 1], vec![1], String::new())
        );
        let s = Step::read(
            &obj(json!({"observation": "", "done": false, "kind": "off_plan"})),
            2,
        )
        .expect("ok");
        assert_eq!(s.kind, "off_plan");
        for bad in ["Off plan", "a-b", "abcdefghijklmnopqrstuvwxyz"] {
            let e = Step::read(
                &obj(json!({"observation": "", "done": false, "kind": bad})),
                2,
            )
            .expect_err(bad);
            assert!(e.contains("`kind`"), "{e}");
        }
        let e = Step::read(
            &obj(json!({"observation": "", "done": true, "dims": [2]})),
            2,
        )
        .expect_err("index 2 of 2");
        assert!(e.contains("0..2"), "{e}");
        let e = Step::read(&obj(json!({"observation": "x"})), 2).expect_err("no done");
        assert!(e.contains("`done`"), "{e}");
        let e =
            Step::read(&obj(json!({"observation": 3, "done": true})), 2).expect_err("not a string");
        assert!(e.contains("`observation`: invalid type"), "{e}");
    }

    /// A field the protocol does not have — a typo of an optional field above all, which
    /// would otherwise be read as absent — is an error naming it, in every reply.
    #[test]
    fn an_unknown_field_is_refused_by_name() {
        let hello = json!({"protocol": 1, "name": "n", "dims": [{"name": "a", "lo": 0, "hi": 1}],
            "eval_level": [0.5]});
        let step = json!({"observation": "at 3", "done": false, "lable": true});
        let dim = json!({"protocol": 1, "name": "n", "dims": [{"name": "a", "lo": 0, "hi": 1, "mid": 0.5}]});
        for (e, field) in [
            (
                Describe::read(&obj(hello)).expect_err("eval_level"),
                "eval_level",
            ),
            (Describe::read(&obj(dim)).expect_err("mid"), "mid"),
            (Step::read(&obj(step), 2).expect_err("lable"), "lable"),
            (
                Reset::read(&obj(json!({"prompt": "go", "instruction": "x"}))).expect_err("x"),
                "instruction",
            ),
            (
                demo(&obj(json!({"actions": [], "action": []}))).expect_err("action"),
                "action",
            ),
        ] {
            assert!(e.contains(&format!("unknown field `{field}`")), "{e}");
        }
        // The error of a nested field names its path.
        let e = Describe::read(&obj(json!({"protocol": 1, "name": "n",
            "dims": [{"name": "a", "lo": 0, "hi": 1, "mid": 0.5}]})))
        .expect_err("mid");
        assert!(e.starts_with("`dims[0].mid`: unknown field"), "{e}");
    }

    #[test]
    fn a_reset_prompt_ends_with_a_newline_and_demo_actions_are_strings() {
        let r = Reset::read(&obj(json!({"prompt": "go"}))).expect("ok");
        assert_eq!(r.prompt, "go\n");
        assert_eq!(
            demo(&obj(json!({"actions": ["+1", "-2"]}))).expect("ok"),
            vec!["+1", "-2"]
        );
        assert!(demo(&obj(json!({"actions": ["+1", 2]}))).is_err());
        assert!(demo(&obj(json!({}))).is_err());
    }
}
