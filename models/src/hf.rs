//! Hugging Face checkpoint directories: `config.json` plus safetensors weights, in and out of
//! a [`Transformer`].
//!
//! A directory as `transformers`' `save_pretrained` writes it for a Llama (`model_type:
//! "llama"`) or Qwen2 (`"qwen2"`) causal LM:
//!
//! - `config.json`, read by [`read_hf_config`] into a [`TransformerConfig`];
//! - `model.safetensors`, or shards `model-0000i-of-0000n.safetensors` listed by the
//!   `weight_map` of `model.safetensors.index.json`, with tensors in F32, F16 or BF16.
//!
//! The weights are decoded into [`HfWeights`] and handed to [`transformer_from_hf`], the one
//! place that maps Hugging Face names onto the model. [`save_hf_dir`] writes the inverse
//! (one F32 `model.safetensors` and a `config.json` that `transformers` also reads).

use rlany_kernels::AttentionOps;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, View};
use serde_json::{Map, Value, json};

use crate::error::ModelError;
use crate::transformer::{Transformer, TransformerConfig};
use crate::weights::{HfWeights, HostTensor, transformer_from_hf, transformer_to_hf};

/// The model configuration file of a checkpoint directory.
const CONFIG_FILE: &str = "config.json";
/// The single-file weights of a checkpoint directory.
const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint (`weight_map`: tensor name → shard file name).
const INDEX_FILE: &str = "model.safetensors.index.json";

/// The Hugging Face architecture of a checkpoint (its `model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfArch {
    /// `model_type: "llama"` (`LlamaForCausalLM`): no biases.
    Llama,
    /// `model_type: "qwen2"` (`Qwen2ForCausalLM`): a bias on the q, k and v projections.
    Qwen2,
}

impl HfArch {
    /// The `model_type` strings [`read_hf_config`] accepts.
    pub const SUPPORTED: [&'static str; 2] = ["llama", "qwen2"];

    /// The architecture a [`TransformerConfig`] is saved as: Qwen2 when it has q/k/v
    /// biases, Llama otherwise.
    pub fn of(config: &TransformerConfig) -> Self {
        if config.qkv_bias {
            HfArch::Qwen2
        } else {
            HfArch::Llama
        }
    }

    /// The `model_type` field of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            HfArch::Llama => "llama",
            HfArch::Qwen2 => "qwen2",
        }
    }

    /// The `architectures` entry of `config.json` (the `transformers` model class).
    pub fn architecture(self) -> &'static str {
        match self {
            HfArch::Llama => "LlamaForCausalLM",
            HfArch::Qwen2 => "Qwen2ForCausalLM",
        }
    }
}

/// Reads `dir/config.json` of a Llama or Qwen2 checkpoint into a [`TransformerConfig`].
///
/// Fields read: `model_type` (`"llama"` or `"qwen2"`; Qwen2 means q/k/v biases),
/// `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`
/// (default: the number of heads), `intermediate_size`, `vocab_size`, `rope_theta` (default
/// 10000; also read from `rope_parameters` of newer `transformers`), `rms_norm_eps`,
/// `tie_word_embeddings` (default false) and `max_position_embeddings`, which becomes
/// `max_seq_len` unless the `max_seq_len` argument is smaller (the rotary tables are
/// allocated for the whole context, wasteful for a 32k-context model on the CPU).
///
/// Rejected as unsupported: `rope_scaling` other than null (or `{"rope_type": "default"}`),
/// `hidden_act` other than `"silu"`, a `head_dim` other than `hidden_size /
/// num_attention_heads`, Llama's `attention_bias`/`mlp_bias` and Qwen2's
/// `use_sliding_window`. Errors are [`ModelError::Load`] naming `config.json` and the field.
pub fn read_hf_config(
    dir: &Path,
    max_seq_len: Option<usize>,
) -> Result<(TransformerConfig, HfArch), ModelError> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| load_error(&path, format!("cannot read the file: {e}")))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| load_error(&path, format!("not valid JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(load_error(&path, "not a JSON object".to_string()));
    };
    parse_config(
        &Fields {
            path: &path,
            object,
        },
        max_seq_len,
    )
}

/// Loads the Llama or Qwen2 checkpoint in `dir` (see the module docs) onto `device`.
///
/// `max_seq_len` caps the context as in [`read_hf_config`]. Weights come from
/// `model.safetensors` if present, otherwise from the shards listed by
/// `model.safetensors.index.json`; F16 and BF16 tensors are widened to f32 (exactly), any
/// other dtype is an error naming the tensor.
///
/// Memory: each weights file is read whole before it is decoded, so the peak is about the
/// largest file plus 4 bytes per parameter (the f32 copies decoded so far), plus the
/// model's own parameters while they are built (up to another 4 bytes per parameter).
pub fn load_hf_dir<B: AttentionOps>(
    dir: &Path,
    max_seq_len: Option<usize>,
    device: &B::Device,
) -> Result<Transformer<B>, ModelError> {
    let (config, _arch) = read_hf_config(dir, max_seq_len)?;
    let (weights, source) = read_hf_weights(dir)?;
    transformer_from_hf(&config, weights, device, &source)
}

/// Writes `model` to `dir` (created if missing) as a Hugging Face checkpoint: F32
/// `model.safetensors` and a `config.json` that [`read_hf_config`] and `transformers`'
/// `AutoModelForCausalLM.from_pretrained` both read (`Qwen2ForCausalLM` when the model has
/// q/k/v biases, `LlamaForCausalLM` otherwise; `max_position_embeddings` is the model's
/// `max_seq_len`). A model with LoRA adapters is saved merged (`W + s·A·B`,
/// [`Transformer::merge_lora`]). Existing files of the same names are replaced.
pub fn save_hf_dir<B: AttentionOps>(model: &Transformer<B>, dir: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Save {
        path: dir.to_path_buf(),
        message: format!("cannot create the directory: {e}"),
    })?;
    let weights = if model.has_lora() {
        transformer_to_hf(&model.clone().merge_lora())
    } else {
        transformer_to_hf(model)
    };
    write_safetensors(&dir.join(WEIGHTS_FILE), &weights)?;
    let config_path = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config_json(model.config())).map_err(|e| {
        ModelError::Save {
            path: config_path.clone(),
            message: e.to_string(),
        }
    })?;
    std::fs::write(&config_path, text + "\n").map_err(|e| ModelError::Save {
        path: config_path,
        message: e.to_string(),
    })
}

/// A [`ModelError::Load`] for `path`.
fn load_error(path: &Path, message: String) -> ModelError {
    ModelError::Load {
        path: path.to_path_buf(),
        message,
    }
}

/// The fields of a parsed `config.json`, with errors that name the file and the field.
struct Fields<'a> {
    path: &'a Path,
    object: &'a Map<String, Value>,
}

impl Fields<'_> {
    /// An error about `field`.
    fn error(&self, field: &str, message: impl std::fmt::Display) -> ModelError {
        load_error(self.path, format!("field `{field}`: {message}"))
    }

    /// The value of `field`, `None` when absent or null.
    fn get(&self, field: &str) -> Option<&Value> {
        self.object.get(field).filter(|v| !v.is_null())
    }

    /// A required positive integer.
    fn count(&self, field: &str) -> Result<usize, ModelError> {
        match self.get(field) {
            Some(v) => Self::positive(v).ok_or_else(|| {
                self.error(field, format!("expected a positive integer, found {v}"))
            }),
            None => Err(self.error(field, "missing")),
        }
    }

    /// An optional positive integer.
    fn count_opt(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            Some(_) => self.count(field).map(Some),
            None => Ok(None),
        }
    }

    /// `v` as a positive integer.
    fn positive(v: &Value) -> Option<usize> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
    }

    /// A number, `default` when absent (required when `default` is `None`).
    fn number(&self, field: &str, default: Option<f64>) -> Result<f64, ModelError> {
        match (self.get(field), default) {
            (Some(v), _) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| self.error(field, format!("expected a positive number, found {v}"))),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.error(field, "missing")),
        }
    }

    /// A boolean, `default` when absent.
    fn flag(&self, field: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(field) {
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.error(field, format!("expected true or false, found {v}"))),
            None => Ok(default),
        }
    }

    /// A string, `default` when absent (required when `default` is `None`).
    fn text(&self, field: &str, default: Option<&str>) -> Result<String, ModelError> {
        match (self.get(field), default) {
            (Some(v), _) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| self.error(field, format!("expected a string, found {v}"))),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => Err(self.error(field, "missing")),
        }
    }
}

/// The model described by the fields of `config.json` (see [`read_hf_config`]).
fn parse_config(
    f: &Fields<'_>,
    max_seq_len: Option<usize>,
) -> Result<(TransformerConfig, HfArch), ModelError> {
    let model_type = f.text("model_type", None)?;
    let arch = match model_type.as_str() {
        "llama" => HfArch::Llama,
        "qwen2" => HfArch::Qwen2,
        other => {
            return Err(f.error(
                "model_type",
                format!(
                    "{other:?} is not supported (supported: {})",
                    HfArch::SUPPORTED.map(|s| format!("{s:?}")).join(", ")
                ),
            ));
        }
    };
    let act = f.text("hidden_act", Some("silu"))?;
    if act != "silu" {
        return Err(f.error(
            "hidden_act",
            format!("{act:?} is not supported (only \"silu\", the SwiGLU MLP)"),
        ));
    }
    if let Some(scaling) = f.get("rope_scaling")
        && !is_default_rope(scaling)
    {
        return Err(f.error(
            "rope_scaling",
            format!("RoPE scaling {scaling} is not supported (only plain RoPE, null)"),
        ));
    }
    let mut rope_theta = f.number("rope_theta", Some(10000.0))?;
    // transformers ≥ 5 moves rope_theta (and the scaling type) into `rope_parameters`.
    if let Some(params) = f.get("rope_parameters") {
        let Some(object) = params.as_object() else {
            return Err(f.error(
                "rope_parameters",
                format!("expected an object, found {params}"),
            ));
        };
        if !is_default_rope(params) {
            return Err(f.error(
                "rope_parameters",
                format!("RoPE scaling {params} is not supported (only rope_type \"default\")"),
            ));
        }
        let inner = Fields {
            path: f.path,
            object,
        };
        if inner.get("rope_theta").is_some() {
            rope_theta = inner
                .number("rope_theta", None)
                .map_err(|_| f.error("rope_parameters.rope_theta", "expected a positive number"))?;
        }
    }
    match arch {
        HfArch::Llama => {
            for field in ["attention_bias", "mlp_bias"] {
                if f.flag(field, false)? {
                    return Err(f.error(field, "true is not supported (Llama without biases)"));
                }
            }
        }
        HfArch::Qwen2 => {
            if f.flag("use_sliding_window", false)? {
                return Err(f.error(
                    "use_sliding_window",
                    "true is not supported (full attention only)",
                ));
            }
        }
    }

    let d_model = f.count("hidden_size")?;
    let n_layers = f.count("num_hidden_layers")?;
    let n_heads = f.count("num_attention_heads")?;
    let n_kv_heads = f.count_opt("num_key_value_heads")?.unwrap_or(n_heads);
    let ffn_hidden = f.count("intermediate_size")?;
    let vocab_size = f.count("vocab_size")?;
    let context = f.count("max_position_embeddings")?;
    let norm_eps = f.number("rms_norm_eps", None)?;
    let tie = f.flag("tie_word_embeddings", false)?;
    if let Some(head_dim) = f.count_opt("head_dim")?
        && head_dim * n_heads != d_model
    {
        return Err(f.error(
            "head_dim",
            format!(
                "{head_dim} is not hidden_size / num_attention_heads = {d_model} / {n_heads} \
                 (only that head size is supported)"
            ),
        ));
    }
    let config = TransformerConfig::new(
        vocab_size,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads,
        ffn_hidden,
        max_seq_len.map_or(context, |cap| context.min(cap)),
    )
    .with_rope_theta(rope_theta as f32)
    .with_qkv_bias(arch == HfArch::Qwen2)
    .with_tie_embeddings(tie)
    .with_norm_eps(norm_eps);
    config.validate().map_err(|e| match e {
        ModelError::InvalidConfig(m) => load_error(f.path, m),
        other => other,
    })?;
    Ok((config, arch))
}

/// Whether a `rope_scaling` / `rope_parameters` value asks for plain RoPE: no `rope_type`
/// (or legacy `type`) other than `"default"`, and no scaling `factor`.
fn is_default_rope(value: &Value) -> bool {
    let Some(object) = value.as_object() else {
        return false;
    };
    let kind = object
        .get("rope_type")
        .or_else(|| object.get("type"))
        .and_then(Value::as_str);
    matches!(kind, None | Some("default")) && object.get("factor").is_none_or(Value::is_null)
}

/// The `config.json` of a model saved by [`save_hf_dir`].
fn config_json(config: &TransformerConfig) -> Value {
    let arch = HfArch::of(config);
    let mut value = json!({
        "architectures": [arch.architecture()],
        "model_type": arch.model_type(),
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.ffn_hidden,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim(),
        "max_position_embeddings": config.max_seq_len,
        "rope_theta": f64::from(config.rope_theta),
        "rope_scaling": null,
        "rms_norm_eps": config.norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": "float32",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
    });
    if let Some(object) = value.as_object_mut() {
        match arch {
            HfArch::Llama => {
                object.insert("attention_bias".into(), json!(false));
                object.insert("mlp_bias".into(), json!(false));
            }
            HfArch::Qwen2 => {
                object.insert("use_sliding_window".into(), json!(false));
            }
        }
    }
    value
}

/// All tensors of the checkpoint in `dir`, and the file to name in errors about them
/// (`model.safetensors` or the shard index).
fn read_hf_weights(dir: &Path) -> Result<(HfWeights, PathBuf), ModelError> {
    let mut weights = HfWeights::new();
    let single = dir.join(WEIGHTS_FILE);
    if single.is_file() {
        read_safetensors_into(&single, &mut weights)?;
        return Ok((weights, single));
    }
    let index = dir.join(INDEX_FILE);
    if !index.is_file() {
        return Err(load_error(
            &single,
            format!("no such file (and no {INDEX_FILE} either)"),
        ));
    }
    for (shard, names) in read_index(&index)? {
        let path = dir.join(&shard);
        let added = read_safetensors_into(&path, &mut weights)?;
        if let Some(name) = names.iter().find(|n| !added.contains(*n)) {
            return Err(load_error(
                &path,
                format!("tensor {name} is listed for this shard in {INDEX_FILE} but not in it"),
            ));
        }
    }
    Ok((weights, index))
}

/// The `weight_map` of a shard index, grouped by shard file name.
fn read_index(path: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, ModelError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| load_error(path, format!("cannot read the file: {e}")))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| load_error(path, format!("not valid JSON: {e}")))?;
    let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
        return Err(load_error(
            path,
            "field `weight_map`: missing or not an object".to_string(),
        ));
    };
    let mut shards: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, shard) in map {
        let Some(shard) = shard.as_str() else {
            return Err(load_error(
                path,
                format!("field `weight_map`: the shard of {name} is {shard}, not a file name"),
            ));
        };
        // Only plain names inside the checkpoint directory.
        if !Path::new(shard)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(load_error(
                path,
                format!("field `weight_map`: shard {shard:?} of {name} is not a file name"),
            ));
        }
        shards
            .entry(shard.to_string())
            .or_default()
            .insert(name.clone());
    }
    Ok(shards)
}

/// Reads every tensor of the safetensors file at `path` into `out` as f32 (the whole file is
/// read into memory first) and returns their names. A name already in `out` is an error.
pub(crate) fn read_safetensors_into(
    path: &Path,
    out: &mut HfWeights,
) -> Result<Vec<String>, ModelError> {
    let bytes =
        std::fs::read(path).map_err(|e| load_error(path, format!("cannot read the file: {e}")))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| load_error(path, format!("not a valid safetensors file: {e}")))?;
    let mut added = Vec::new();
    for (name, view) in file.iter() {
        if out.contains_key(name) {
            return Err(load_error(
                path,
                format!("tensor {name} appears in more than one file"),
            ));
        }
        let data = decode(view.dtype(), view.data()).ok_or_else(|| {
            load_error(
                path,
                format!(
                    "tensor {name} has dtype {:?}; only F32, F16 and BF16 are supported",
                    view.dtype()
                ),
            )
        })?;
        out.insert(
            name.to_string(),
            HostTensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
        added.push(name.to_string());
    }
    Ok(added)
}

/// Little-endian `bytes` of `dtype` widened to f32 (exact for all three), `None` for an
/// unsupported dtype. The length was checked against the shape by `safetensors`.
fn decode(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// A [`HostTensor`] as an F32 safetensors view; its bytes are produced only while the
/// tensor is written, so saving needs one tensor's bytes at a time.
struct F32View<'a>(&'a HostTensor);

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.0.data.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    fn data_len(&self) -> usize {
        self.0.data.len() * 4
    }
}

/// Writes `weights` as an F32 safetensors file with `transformers`' `{"format": "pt"}`
/// metadata.
pub(crate) fn write_safetensors(path: &Path, weights: &HfWeights) -> Result<(), ModelError> {
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(
        weights.iter().map(|(name, t)| (name.as_str(), F32View(t))),
        Some(metadata),
        path,
    )
    .map_err(|e| ModelError::Save {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::prelude::*;
    use rlany_framework::{CausalLm, Rng};

    type B = NdArray<f32>;

    /// A fresh, empty directory under the system temp dir.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rlany-hf-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn logits(model: &Transformer<B>, tokens: &[i64]) -> Vec<f32> {
        let device = model.device();
        let tokens = Tensor::<B, 1, Int>::from_data(tokens, &device).unsqueeze::<2>();
        model
            .forward(tokens)
            .into_data()
            .into_vec::<f32>()
            .expect("f32 logits")
    }

    fn tiny(bias: bool, tie: bool) -> TransformerConfig {
        TransformerConfig::new(37, 16, 2, 4, 2, 24, 32)
            .with_qkv_bias(bias)
            .with_tie_embeddings(tie)
            .with_rope_theta(500_000.0)
            .with_norm_eps(1e-6)
    }

    /// Writes `object` (a JSON object) as `dir/config.json`.
    fn write_config(dir: &Path, object: &Value) {
        std::fs::write(dir.join(CONFIG_FILE), object.to_string()).expect("write config");
    }

    fn llama_config() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 300,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096,
            "rope_scaling": null,
            "hidden_act": "silu",
        })
    }

    #[test]
    fn hf_save_load_round_trip_is_bit_identical() {
        let device = Default::default();
        for (bias, tie) in [(false, false), (true, true)] {
            let config = tiny(bias, tie);
            let model: Transformer<B> = config
                .init_seeded(&device, &mut Rng::new(11))
                .expect("valid config");
            let dir = temp_dir(&format!("round-trip-{bias}-{tie}"));
            let nested = dir.join("a/b");
            save_hf_dir(&model, &nested).expect("save");

            let text = std::fs::read_to_string(nested.join(CONFIG_FILE)).expect("config");
            let json: Value = serde_json::from_str(&text).expect("json");
            let class = if bias {
                "Qwen2ForCausalLM"
            } else {
                "LlamaForCausalLM"
            };
            assert_eq!(json["architectures"][0], class);
            assert_eq!(json["torch_dtype"], "float32");

            let (read, arch) = read_hf_config(&nested, None).expect("read config");
            assert_eq!(arch, if bias { HfArch::Qwen2 } else { HfArch::Llama });
            assert_eq!(
                (read.vocab_size, read.d_model, read.n_layers, read.n_heads),
                (37, 16, 2, 4)
            );
            assert_eq!(
                (read.n_kv_heads, read.ffn_hidden, read.max_seq_len),
                (2, 24, 32)
            );
            assert_eq!((read.qkv_bias, read.tie_embeddings), (bias, tie));
            assert_eq!(read.rope_theta, 500_000.0);
            assert_eq!(read.norm_eps, 1e-6);
            let (capped, _) = read_hf_config(&nested, Some(8)).expect("capped");
            assert_eq!(capped.max_seq_len, 8);
            let (uncapped, _) = read_hf_config(&nested, Some(1000)).expect("not capped");
            assert_eq!(uncapped.max_seq_len, 32);

            let loaded: Transformer<B> = load_hf_dir(&nested, None, &device).expect("load");
            let tokens = [3, 0, 36, 7, 7, 12, 1];
            assert_eq!(logits(&model, &tokens), logits(&loaded, &tokens));
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn hf_config_defaults_and_errors_name_file_and_field() {
        let dir = temp_dir("config-errors");
        write_config(&dir, &llama_config());
        let (config, arch) = read_hf_config(&dir, Some(64)).expect("valid");
        assert_eq!(arch, HfArch::Llama);
        assert_eq!(
            config.n_kv_heads, 4,
            "num_key_value_heads defaults to heads"
        );
        assert_eq!(config.rope_theta, 10000.0);
        assert!(!config.tie_embeddings && !config.qkv_bias);
        assert_eq!(config.max_seq_len, 64);

        let check = |edit: &dyn Fn(&mut Map<String, Value>), needles: &[&str]| {
            let mut value = llama_config();
            edit(value.as_object_mut().expect("object"));
            write_config(&dir, &value);
            let err = read_hf_config(&dir, None).expect_err("invalid config");
            let msg = err.to_string();
            assert!(msg.contains("config.json"), "{msg}");
            for needle in needles {
                assert!(msg.contains(needle), "{needle:?} not in {msg}");
            }
        };
        check(
            &|o| {
                o.insert("model_type".into(), json!("gpt_neox"));
            },
            &["`model_type`", "gpt_neox", "\"llama\"", "\"qwen2\""],
        );
        check(
            &|o| {
                o.insert(
                    "rope_scaling".into(),
                    json!({"rope_type": "llama3", "factor": 8.0}),
                );
            },
            &["`rope_scaling`", "not supported"],
        );
        check(
            &|o| {
                o.remove("hidden_size");
            },
            &["`hidden_size`", "missing"],
        );
        check(
            &|o| {
                o.insert("num_hidden_layers".into(), json!("two"));
            },
            &["`num_hidden_layers`", "positive integer"],
        );
        check(
            &|o| {
                o.insert("head_dim".into(), json!(32));
            },
            &["`head_dim`", "32"],
        );
        check(
            &|o| {
                o.insert("hidden_act".into(), json!("gelu"));
            },
            &["`hidden_act`", "gelu"],
        );
        check(
            &|o| {
                o.insert("model_type".into(), json!("qwen2"));
                o.insert("use_sliding_window".into(), json!(true));
            },
            &["`use_sliding_window`"],
        );

        // Qwen2, newer-transformers rope_parameters, a null head_dim and a default rope_scaling.
        let mut value = llama_config();
        let o = value.as_object_mut().expect("object");
        o.insert("model_type".into(), json!("qwen2"));
        o.insert("head_dim".into(), Value::Null);
        o.insert("rope_scaling".into(), json!({"rope_type": "default"}));
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 1e6}),
        );
        o.insert("tie_word_embeddings".into(), json!(true));
        write_config(&dir, &value);
        let (config, arch) = read_hf_config(&dir, None).expect("valid qwen2");
        assert_eq!(arch, HfArch::Qwen2);
        assert!(config.qkv_bias && config.tie_embeddings);
        assert_eq!(config.rope_theta, 1e6);
        assert_eq!(config.max_seq_len, 4096);

        let err = read_hf_config(&dir.join("missing"), None).expect_err("no file");
        assert!(err.to_string().contains("config.json"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hf_sharded_checkpoint_loads() {
        let device = Default::default();
        let config = tiny(true, false);
        let model: Transformer<B> = config
            .init_seeded(&device, &mut Rng::new(5))
            .expect("valid config");
        let dir = temp_dir("sharded");
        save_hf_dir(&model, &dir).expect("save");
        std::fs::remove_file(dir.join(WEIGHTS_FILE)).expect("remove single file");

        let weights = transformer_to_hf(&model);
        let names = [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ];
        let mut shards = [HfWeights::new(), HfWeights::new()];
        let mut weight_map = Map::new();
        for (i, (name, tensor)) in weights.into_iter().enumerate() {
            weight_map.insert(name.clone(), json!(names[i % 2]));
            shards[i % 2].insert(name, tensor);
        }
        for (file, shard) in names.iter().zip(&shards) {
            write_safetensors(&dir.join(file), shard).expect("write shard");
        }
        let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(dir.join(INDEX_FILE), index.to_string()).expect("index");

        let loaded: Transformer<B> = load_hf_dir(&dir, None, &device).expect("load shards");
        let tokens = [1, 2, 3, 30, 36];
        assert_eq!(logits(&model, &tokens), logits(&loaded, &tokens));

        // A tensor listed in the wrong shard is an error naming it.
        let mut wrong = weight_map.clone();
        let moved = "model.norm.weight";
        let other = if wrong[moved] == json!(names[0]) {
            names[1]
        } else {
            names[0]
        };
        wrong.insert(moved.into(), json!(other));
        let index = json!({"weight_map": wrong});
        std::fs::write(dir.join(INDEX_FILE), index.to_string()).expect("index");
        let err = load_hf_dir::<B>(&dir, None, &device).expect_err("wrong shard");
        assert!(err.to_string().contains(moved), "{err}");

        // A shard outside the directory is refused.
        let index = json!({"weight_map": {moved: "../elsewhere.safetensors"}});
        std::fs::write(dir.join(INDEX_FILE), index.to_string()).expect("index");
        let err = load_hf_dir::<B>(&dir, None, &device).expect_err("escaping shard");
        assert!(err.to_string().contains("not a file name"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hf_decodes_f16_bf16_and_rejects_other_dtypes() {
        use safetensors::tensor::TensorView;
        let dir = temp_dir("dtypes");
        let path = dir.join("x.safetensors");
        // 1.5 and -2.0 in f16 (0x3E00, 0xC000) and bf16 (0x3FC0, 0xC000), little-endian.
        let f16 = [0x00u8, 0x3E, 0x00, 0xC0];
        let bf16 = [0xC0u8, 0x3F, 0x00, 0xC0];
        let views = vec![
            (
                "a",
                TensorView::new(Dtype::F16, vec![2], &f16).expect("view"),
            ),
            (
                "b",
                TensorView::new(Dtype::BF16, vec![1, 2], &bf16).expect("view"),
            ),
        ];
        safetensors::serialize_to_file(views, None, &path).expect("write");
        let mut out = HfWeights::new();
        read_safetensors_into(&path, &mut out).expect("read");
        assert_eq!(out["a"].data, vec![1.5, -2.0]);
        assert_eq!(out["b"].shape, vec![1, 2]);
        assert_eq!(out["b"].data, vec![1.5, -2.0]);

        let int8 = [1u8, 2];
        let views = vec![(
            "model.layers.0.mlp.up_proj.weight",
            TensorView::new(Dtype::I8, vec![2], &int8).expect("view"),
        )];
        safetensors::serialize_to_file(views, None, &path).expect("write");
        let err = read_safetensors_into(&path, &mut HfWeights::new()).expect_err("I8");
        let msg = err.to_string();
        assert!(
            msg.contains("up_proj.weight") && msg.contains("I8"),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Compares our logits on a committed fixture with the numpy reference of
    /// `fixtures/make_tiny.py`.
    ///
    /// Tolerance 1e-4 (absolute; the logits have std ≈ 0.8 and |max| ≈ 3.2): both sides run
    /// f32 forward passes on the same weight values (F16/BF16 widen to f32 exactly), so they
    /// differ only by f32 rounding in a different summation order (matrix products, softmax,
    /// RMS means), different `exp`/`sqrt` implementations, and the 7 significant digits the
    /// JSON keeps (≤ 2e-6 here); through two layers of width ≤ 128 that is ~1e-6–1e-5. A real
    /// bug (RoPE layout, GQA head mapping, a missing bias or tie) moves logits by ~1e-1.
    fn check_fixture(name: &str, dir: &str) {
        let device = Default::default();
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/tiny_logits.json"
        ))
        .expect("fixture logits");
        let expected: Value = serde_json::from_str(&text).expect("json");
        let model: Transformer<B> = load_hf_dir(Path::new(dir), None, &device).expect("load");
        let cases = expected[name]["cases"].as_array().expect("cases");
        assert!(!cases.is_empty());
        let mut worst = 0.0f32;
        for case in cases {
            let tokens: Vec<i64> = case["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_i64().expect("token id"))
                .collect();
            let want: Vec<f32> = case["logits"]
                .as_array()
                .expect("logits")
                .iter()
                .flat_map(|row| row.as_array().expect("row").iter())
                .map(|v| v.as_f64().expect("logit") as f32)
                .collect();
            let got = logits(&model, &tokens);
            assert_eq!(got.len(), want.len(), "{name}: [seq * vocab] sizes");
            assert_eq!(got.len(), tokens.len() * 300);
            for (g, w) in got.iter().zip(&want) {
                worst = worst.max((g - w).abs());
            }
        }
        eprintln!("{name}: max |logit difference| = {worst:e}");
        assert!(worst < 1e-4, "{name}: max |logit difference| {worst}");
    }

    #[test]
    fn hf_fixture_tiny_llama_matches_reference_logits() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/tiny-llama");
        let (config, arch) = read_hf_config(Path::new(dir), None).expect("config");
        assert_eq!(arch, HfArch::Llama);
        assert!(!config.tie_embeddings && !config.qkv_bias);
        assert_eq!(
            (config.n_heads, config.n_kv_heads, config.max_seq_len),
            (4, 2, 64)
        );
        check_fixture("tiny-llama", dir);
    }

    #[test]
    fn hf_fixture_tiny_qwen2_matches_reference_logits() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/tiny-qwen2");
        let (config, arch) = read_hf_config(Path::new(dir), None).expect("config");
        assert_eq!(arch, HfArch::Qwen2);
        assert!(config.tie_embeddings && config.qkv_bias);
        check_fixture("tiny-qwen2", dir);
    }
}
