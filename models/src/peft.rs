//! LoRA adapters as PEFT writes them: a directory with `adapter_model.safetensors` (the
//! adapters of every targeted projection, named
//! `base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>.lora_A.weight` / `lora_B.weight`,
//! laid out as PyTorch's `nn.Linear` weights: `A` is `[r, d_in]`, `B` is `[d_out, r]`) and
//! `adapter_config.json` (`peft_type: LORA`, `r`, `lora_alpha`, `target_modules`, the base
//! model's name). `PeftModel.from_pretrained(base, dir)` loads such a directory over the
//! base model it names; [`load_peft_dir`] reads one back onto ours.

use std::path::Path;

use burn::prelude::*;
use rlany_framework::Rng;
use rlany_framework::experiment::LoraSpec;
use rlany_kernels::AttentionOps;
use serde_json::{Value, json};

use crate::Transformer;
use crate::error::ModelError;
use crate::hf::{read_safetensors_into, write_safetensors};
use crate::weights::{HfWeights, HostTensor};

/// The adapters' weights file.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The adapters' configuration file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

fn key(layer: usize, module: &str, part: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{module}.{part}.weight")
}

fn host<B: Backend>(t: Tensor<B, 2>) -> HostTensor {
    let shape = t.dims().to_vec();
    let data = t
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap_or_default();
    HostTensor { shape, data }
}

fn save_error(path: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Save {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn load_error(path: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Load {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Writes the adapters of `model` (attached with `spec`) to `dir` (created if missing) as a
/// PEFT adapter directory over `base_model` (a Hugging Face repository name or a path, as
/// `adapter_config.json`'s `base_model_name_or_path`). A model without adapters is refused.
pub fn save_peft_dir<B: AttentionOps>(
    model: &Transformer<B>,
    spec: &LoraSpec,
    base_model: &str,
    dir: &Path,
) -> Result<(), ModelError> {
    if !model.has_lora() {
        return Err(save_error(dir, "the model has no LoRA adapters to save"));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| save_error(dir, format!("cannot create the directory: {e}")))?;
    let mut weights = HfWeights::new();
    let mut targets = std::collections::BTreeSet::new();
    for (layer, block) in model.lora_blocks().enumerate() {
        let Some(block) = block else { continue };
        for (module, adapter) in block.named() {
            let Some(adapter) = adapter else { continue };
            let (a, b) = adapter.parts();
            weights.insert(key(layer, module, "lora_A"), host(a.transpose()));
            weights.insert(key(layer, module, "lora_B"), host(b.transpose()));
            targets.insert(module.rsplit('.').next().unwrap_or(module).to_string());
        }
    }
    write_safetensors(&dir.join(ADAPTER_WEIGHTS), &weights)?;
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.r,
        "lora_alpha": spec.lora_alpha,
        "lora_dropout": spec.lora_dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "modules_to_save": Value::Null,
    });
    let path = dir.join(ADAPTER_CONFIG);
    let text =
        serde_json::to_string_pretty(&config).map_err(|e| save_error(&path, e.to_string()))?;
    std::fs::write(&path, text + "\n").map_err(|e| save_error(&path, e.to_string()))
}

/// The LoRA settings of a PEFT adapter directory's `adapter_config.json`.
pub fn read_peft_config(dir: &Path) -> Result<LoraSpec, ModelError> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| load_error(&path, format!("cannot read the file: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| load_error(&path, e.to_string()))?;
    if v["peft_type"] != "LORA" {
        return Err(load_error(&path, "`peft_type` is not \"LORA\""));
    }
    if v["use_rslora"] == true || v["fan_in_fan_out"] == true {
        return Err(load_error(
            &path,
            "`use_rslora` and `fan_in_fan_out` are not supported",
        ));
    }
    let r = v["r"]
        .as_u64()
        .filter(|&r| r > 0)
        .ok_or_else(|| load_error(&path, "`r` must be a positive integer"))?;
    let lora_alpha = v["lora_alpha"]
        .as_f64()
        .ok_or_else(|| load_error(&path, "`lora_alpha` must be a number"))?;
    let target_modules = match &v["target_modules"] {
        Value::Array(a) => a
            .iter()
            .map(|t| t.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>(),
        Value::String(s) => Some(vec![s.clone()]),
        _ => None,
    }
    .ok_or_else(|| load_error(&path, "`target_modules` must be a list of names"))?;
    Ok(LoraSpec {
        r: r as usize,
        lora_alpha,
        lora_dropout: 0.0,
        target_modules,
    })
}

/// `base` with the adapters of the PEFT directory `dir` attached (replacing any it had).
pub fn load_peft_dir<B: AttentionOps>(
    base: Transformer<B>,
    dir: &Path,
) -> Result<Transformer<B>, ModelError> {
    let spec = read_peft_config(dir)?;
    let path = dir.join(ADAPTER_WEIGHTS);
    let mut weights = HfWeights::new();
    read_safetensors_into(&path, &mut weights)?;
    let device = base.device();
    // Fresh adapters of the right shapes, then every one replaced from the file.
    let mut model = base.with_lora(&spec, &mut Rng::new(0));
    let mut used = 0;
    for (layer, block) in model.lora_blocks_mut().enumerate() {
        let Some(block) = block else { continue };
        for (module, slot) in block.named_mut() {
            let Some(adapter) = slot.take() else { continue };
            let (a0, b0) = adapter.parts();
            let mut part = |name: &str, want: [usize; 2]| -> Result<Tensor<B, 2>, ModelError> {
                let k = key(layer, module, name);
                let t = weights
                    .get(&k)
                    .ok_or_else(|| load_error(&path, format!("missing tensor {k}")))?;
                // The file holds the transpose of ours.
                if t.shape != [want[1], want[0]] {
                    return Err(load_error(
                        &path,
                        format!(
                            "{k}: shape {:?}, expected {:?}",
                            t.shape,
                            [want[1], want[0]]
                        ),
                    ));
                }
                used += 1;
                let file = Tensor::<B, 2>::from_data(
                    TensorData::new(t.data.clone(), [want[1], want[0]]),
                    &device,
                );
                Ok(file.transpose())
            };
            let a = part("lora_A", a0.dims())?;
            let b = part("lora_B", b0.dims())?;
            *slot = Some(adapter.with_parts(a, b));
        }
    }
    if used != weights.len() {
        return Err(load_error(
            &path,
            format!(
                "{} tensors are not adapters of `target_modules` {:?} on this model",
                weights.len() - used,
                spec.target_modules
            ),
        ));
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_hf_dir;
    use burn::backend::NdArray;
    use rlany_framework::CausalLm;

    type B = NdArray;

    #[test]
    fn adapters_round_trip_through_peft_names_and_layout() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-llama");
        let base = load_hf_dir::<B>(&fixture, None, &Default::default()).expect("fixture");
        let spec = LoraSpec {
            r: 4,
            lora_alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
            ..LoraSpec::default()
        };
        // Adapters with B ≠ 0 (as after training): B drawn like A.
        let mut adapted = base.clone().with_lora(&spec, &mut Rng::new(5));
        let mut rng = Rng::new(9);
        for block in adapted.lora_blocks_mut().flatten() {
            for (_, slot) in block.named_mut() {
                if let Some(ad) = slot.take() {
                    let (a, b) = ad.parts();
                    let dims = b.dims();
                    let values: Vec<f32> = (0..dims[0] * dims[1])
                        .map(|_| (rng.uniform() - 0.5) as f32)
                        .collect();
                    let b = Tensor::from_data(TensorData::new(values, dims), &b.device());
                    *slot = Some(ad.with_parts(a, b));
                }
            }
        }
        let dir = std::env::temp_dir().join(format!("rlany-peft-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        save_peft_dir(&adapted, &spec, "tiny-llama", &dir).expect("save");
        // PEFT's names and layout: q_proj's A is [r, d_in].
        let mut w = HfWeights::new();
        read_safetensors_into(&dir.join(ADAPTER_WEIGHTS), &mut w).expect("read");
        let d = base.config().d_model;
        let q_a = &w["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
        assert_eq!(q_a.shape, [4, d]);
        assert_eq!(w.len(), 2 * 3 * base.config().n_layers);
        let config = read_peft_config(&dir).expect("config");
        assert_eq!(
            (config.r, config.lora_alpha, config.target_modules.clone()),
            (
                4,
                8.0,
                vec!["down_proj".into(), "q_proj".into(), "v_proj".into()]
            )
        );
        let loaded = load_peft_dir(base.clone(), &dir).expect("load");
        let tokens = Tensor::<B, 2, Int>::from_data(
            TensorData::new(vec![1i64, 7, 30, 31, 2], [1, 5]),
            &Default::default(),
        );
        let want = CausalLm::forward(&adapted, tokens.clone()).into_data();
        assert_eq!(CausalLm::forward(&loaded, tokens.clone()).into_data(), want);
        assert_ne!(CausalLm::forward(&base, tokens).into_data(), want);
        // A model without adapters has nothing to save.
        assert!(save_peft_dir(&base, &spec, "x", &dir.join("none")).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
