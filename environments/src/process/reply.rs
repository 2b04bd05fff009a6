//! The replies of protocol 1, read and checked: a reply with a missing field, a field of the
//! wrong type, or a value out of range is an error naming the field (the host treats it as
//! garbage: the child is killed and replaced).

use rlany_framework::Dim;
use serde_json::{Map, Value};

/// The most difficulty dimensions a child may describe.
pub const MAX_DIMS: usize = 16;
/// The most eval-grid levels a child may name.
pub const MAX_LEVELS: usize = 32;
/// The most actions a demonstration may have.
pub const MAX_DEMO_STEPS: usize = 1024;

type Reply = Map<String, Value>;

fn string(r: &Reply, field: &str) -> Result<Option<String>, String> {
    match r.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("`{field}` must be a string, got {other}")),
    }
}

fn required_string(r: &Reply, field: &str) -> Result<String, String> {
    string(r, field)?.ok_or_else(|| format!("`{field}` (a string) is missing"))
}

fn boolean(r: &Reply, field: &str, default: Option<bool>) -> Result<bool, String> {
    match (r.get(field), default) {
        (Some(Value::Bool(b)), _) => Ok(*b),
        (None | Some(Value::Null), Some(d)) => Ok(d),
        (None | Some(Value::Null), None) => Err(format!("`{field}` (true or false) is missing")),
        (Some(other), _) => Err(format!("`{field}` must be true or false, got {other}")),
    }
}

fn number(v: &Value, what: &str) -> Result<f64, String> {
    v.as_f64()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("{what} must be a finite number, got {v}"))
}

fn array<'a>(r: &'a Reply, field: &str) -> Result<&'a [Value], String> {
    match r.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(format!("`{field}` must be a list, got {other}")),
    }
}

/// Indices into the difficulty space (`dims`, `blame`).
fn indices(r: &Reply, field: &str, dims: usize) -> Result<Vec<usize>, String> {
    array(r, field)?
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|i| i as usize)
                .filter(|&i| i < dims)
                .ok_or_else(|| format!("`{field}` holds {v}: expected dimension indices 0..{dims}"))
        })
        .collect()
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
        let name = required_string(r, "name")?;
        let dims_v = array(r, "dims")?;
        if dims_v.is_empty() || dims_v.len() > MAX_DIMS {
            return Err(format!(
                "`dims` must list 1 to {MAX_DIMS} dimensions, got {}",
                dims_v.len()
            ));
        }
        let mut dims = Vec::new();
        for (i, d) in dims_v.iter().enumerate() {
            let obj = d
                .as_object()
                .ok_or_else(|| format!("`dims[{i}]` must be an object, got {d}"))?;
            let dname = required_string(obj, "name").map_err(|e| format!("dims[{i}]: {e}"))?;
            if dname.is_empty()
                || dname.len() > 32
                || !dname
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "`dims[{i}].name` must be 1–32 letters, digits, `_` or `-`, got {dname:?}"
                ));
            }
            let lo = obj.get("lo").unwrap_or(&Value::Null);
            let hi = obj.get("hi").unwrap_or(&Value::Null);
            dims.push(Dim {
                name: dname,
                lo: number(lo, &format!("`dims[{i}].lo`"))?,
                hi: number(hi, &format!("`dims[{i}].hi`"))?,
            });
        }
        let levels_v = array(r, "eval_levels")?;
        let eval_levels = if levels_v.is_empty() {
            vec![0.0, 0.25, 0.5, 0.75, 1.0]
        } else {
            if levels_v.len() > MAX_LEVELS {
                return Err(format!("`eval_levels` has more than {MAX_LEVELS} levels"));
            }
            levels_v
                .iter()
                .map(|v| {
                    number(v, "`eval_levels`").and_then(|x| {
                        if (0.0..=1.0).contains(&x) {
                            Ok(x)
                        } else {
                            Err(format!("`eval_levels` holds {x}, outside [0, 1]"))
                        }
                    })
                })
                .collect::<Result<_, _>>()?
        };
        Ok(Self {
            name,
            version: string(r, "version")?,
            dims,
            eval_levels,
        })
    }
}

/// The `reset` reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reset {
    /// The task text (ends with a newline: the host adds one when it does not).
    pub prompt: String,
    /// What a pretrained chat model is told first.
    pub instructions: Option<String>,
    /// The task's identity (defaults to the prompt).
    pub key: Option<String>,
}

impl Reset {
    /// Reads a `reset` reply.
    pub fn read(r: &Reply) -> Result<Self, String> {
        let mut prompt = required_string(r, "prompt")?;
        if !prompt.ends_with('\n') {
            prompt.push('\n');
        }
        Ok(Self {
            prompt,
            instructions: string(r, "instructions")?,
            key: string(r, "key")?,
        })
    }
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
}

impl Step {
    /// Reads a `step` reply for an environment of `dims` dimensions.
    pub fn read(r: &Reply, dims: usize) -> Result<Self, String> {
        Ok(Self {
            observation: required_string(r, "observation")?,
            done: boolean(r, "done", None)?,
            won: boolean(r, "won", Some(false))?,
            label: boolean(r, "label", Some(false))?,
            dims: indices(r, "dims", dims)?,
            blame: indices(r, "blame", dims)?,
        })
    }
}

/// The `demo` reply: the expert's actions.
pub fn demo(r: &Reply) -> Result<Vec<String>, String> {
    let actions = match r.get("actions") {
        Some(Value::Array(a)) => a,
        _ => return Err("`actions` (a list of strings) is missing".into()),
    };
    if actions.len() > MAX_DEMO_STEPS {
        return Err(format!("`actions` has more than {MAX_DEMO_STEPS} steps"));
    }
    actions
        .iter()
        .map(|a| {
            a.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("`actions` holds {a}, not a string"))
        })
        .collect()
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
        assert_eq!((s.won, s.dims, s.blame), (true, vec![0, 1], vec![1]));
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
        assert!(e.contains("`observation` must be a string"), "{e}");
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
