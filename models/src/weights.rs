//! Weights by Hugging Face name, in and out of a [`Transformer`].
//!
//! Every pretrained format this crate reads (GGUF, Hugging Face safetensors) is first turned
//! into [`HfWeights`]: dense f32 tensors named and laid out as in a Hugging Face Llama/Qwen2
//! checkpoint (`model.layers.3.self_attn.q_proj.weight`, linear weights `[out, in]`, the
//! "rotate half" rotary layout). This file is the one place that knows how those names map
//! onto the fields of [`Transformer`]:
//!
//! | Hugging Face | ours |
//! |---|---|
//! | `model.embed_tokens.weight` `[vocab, d]` | `embedding.weight` `[vocab, d]` |
//! | `model.layers.i.input_layernorm.weight` | `blocks.i.attention_norm.gamma` |
//! | `model.layers.i.self_attn.{q,k,v,o}_proj.weight` `[out, in]` | `blocks.i.attention.{query,key,value,output}.weight` `[in, out]` |
//! | `model.layers.i.self_attn.{q,k,v}_proj.bias` | `blocks.i.attention.{query,key,value}.bias` |
//! | `model.layers.i.post_attention_layernorm.weight` | `blocks.i.mlp_norm.gamma` |
//! | `model.layers.i.mlp.{gate,up,down}_proj.weight` `[out, in]` | `blocks.i.mlp.{gate,up,down}.weight` `[in, out]` |
//! | `model.norm.weight` | `norm.gamma` |
//! | `lm_head.weight` `[vocab, d]` | `lm_head.weight` `[d, vocab]` (absent when tied) |

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;

use crate::error::ModelError;
use crate::transformer::{Transformer, TransformerConfig};

/// A dense f32 tensor on the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// The transpose of a rank-2 tensor (`[r, c]` → `[c, r]`).
    fn transposed(&self) -> HostTensor {
        let (r, c) = (self.shape[0], self.shape[1]);
        let mut data = vec![0.0f32; r * c];
        for i in 0..r {
            for j in 0..c {
                data[j * r + i] = self.data[i * c + j];
            }
        }
        HostTensor {
            shape: vec![c, r],
            data,
        }
    }
}

/// Tensors by Hugging Face name (see the module docs for names and layouts).
pub type HfWeights = BTreeMap<String, HostTensor>;

/// Names a checkpoint may carry that the model does not use: rotary frequency buffers of
/// older Llama exports, which are recomputed from `rope_theta`.
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// The Hugging Face name of the parameter at `path` (our field names) and whether its
/// layout is transposed between the two (linear weights).
fn hf_name(path: &[String]) -> Option<(String, bool)> {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let name = match p.as_slice() {
        ["embedding", "weight"] => ("model.embed_tokens.weight".to_string(), false),
        ["norm", "gamma"] => ("model.norm.weight".to_string(), false),
        ["lm_head", "weight"] => ("lm_head.weight".to_string(), true),
        ["blocks", i, "attention_norm", "gamma"] => {
            (format!("model.layers.{i}.input_layernorm.weight"), false)
        }
        ["blocks", i, "mlp_norm", "gamma"] => (
            format!("model.layers.{i}.post_attention_layernorm.weight"),
            false,
        ),
        ["blocks", i, "attention", proj, leaf] => {
            let hf = match *proj {
                "query" => "q_proj",
                "key" => "k_proj",
                "value" => "v_proj",
                "output" => "o_proj",
                _ => return None,
            };
            (
                format!("model.layers.{i}.self_attn.{hf}.{leaf}"),
                *leaf == "weight",
            )
        }
        ["blocks", i, "mlp", proj, "weight"] => {
            let hf = match *proj {
                "gate" => "gate_proj",
                "up" => "up_proj",
                "down" => "down_proj",
                _ => return None,
            };
            (format!("model.layers.{i}.mlp.{hf}.weight"), true)
        }
        _ => return None,
    };
    Some(name)
}

/// A model built from `config` on `device` with every parameter taken from `weights`.
///
/// Every parameter must be present with the right shape; a name the model does not use is
/// an error too (it would mean a different architecture), except the rotary frequency
/// buffers of older exports and `lm_head.weight` of a checkpoint with tied embeddings.
/// `source` names the file in errors.
pub fn transformer_from_hf<B: Backend>(
    config: &TransformerConfig,
    mut weights: HfWeights,
    device: &B::Device,
    source: &Path,
) -> Result<Transformer<B>, ModelError> {
    let fresh = config.build::<B>(device)?;
    let mut loader = Loader {
        weights: &mut weights,
        path: Vec::new(),
        error: None,
    };
    let model = fresh.map(&mut loader);
    if let Some(message) = loader.error {
        return Err(ModelError::Mismatch {
            path: source.to_path_buf(),
            message,
        });
    }
    let unused: Vec<&String> = weights
        .keys()
        .filter(|n| !ignorable(n) && (!config.tie_embeddings || *n != "lm_head.weight"))
        .collect();
    if !unused.is_empty() {
        return Err(ModelError::Mismatch {
            path: source.to_path_buf(),
            message: format!("tensors the model has no place for: {unused:?}"),
        });
    }
    Ok(model)
}

/// Every parameter of `model` under its Hugging Face name and layout (the inverse of
/// [`transformer_from_hf`]).
pub fn transformer_to_hf<B: Backend>(model: &Transformer<B>) -> HfWeights {
    struct Collect {
        path: Vec<String>,
        out: HfWeights,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some((name, transposed)) = hf_name(&self.path) else {
                return;
            };
            let t = param.val();
            let shape = t.shape().as_slice().to_vec();
            let data = t
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .unwrap_or_default();
            let host = HostTensor { shape, data };
            let host = if transposed { host.transposed() } else { host };
            self.out.insert(name, host);
        }
    }
    let mut c = Collect {
        path: Vec::new(),
        out: HfWeights::new(),
    };
    model.visit(&mut c);
    c.out
}

/// Replaces each float parameter by the tensor of the same (Hugging Face) name, recording
/// the first problem instead of panicking.
struct Loader<'a> {
    weights: &'a mut HfWeights,
    path: Vec<String>,
    error: Option<String>,
}

impl<B: Backend> ModuleMapper<B> for Loader<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let Some((name, transposed)) = hf_name(&self.path) else {
            self.error = Some(format!("no Hugging Face name for {}", self.path.join(".")));
            return param;
        };
        let Some(host) = self.weights.remove(&name) else {
            self.error = Some(format!("missing tensor {name}"));
            return param;
        };
        let host = if transposed && host.shape.len() == 2 {
            host.transposed()
        } else {
            host
        };
        // The shape, device and autodiff setting are read without initialising the fresh
        // parameter: Burn builds it lazily, and forcing its random init only to overwrite it
        // cost about 6% of a short SmolLM2 run's profile (reports/perf/NOTES.md §9h).
        let expected = param.lazy_shape().as_slice().to_vec();
        if host.shape != expected || host.data.len() != expected.iter().product::<usize>() {
            self.error = Some(format!(
                "{name} has shape {:?}, the model wants {:?}{}",
                host.shape,
                expected,
                if transposed {
                    " (after transposing)"
                } else {
                    ""
                }
            ));
            return param;
        }
        let (id, device) = (param.id, param.lazy_device());
        let tensor = Tensor::from_data(TensorData::new(host.data, expected), &device);
        param.transform_for_load(tensor, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use rlany_framework::{CausalLm, Rng};

    type B = NdArray<f32>;

    fn tiny(qkv_bias: bool, tie: bool) -> TransformerConfig {
        TransformerConfig::new(11, 8, 2, 2, 1, 12, 16)
            .with_qkv_bias(qkv_bias)
            .with_tie_embeddings(tie)
    }

    #[test]
    fn hand_checked_names_and_transpose() {
        let path = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            hf_name(&path("blocks.1.attention.key.weight")),
            Some(("model.layers.1.self_attn.k_proj.weight".into(), true))
        );
        assert_eq!(
            hf_name(&path("blocks.0.attention.query.bias")),
            Some(("model.layers.0.self_attn.q_proj.bias".into(), false))
        );
        assert_eq!(
            hf_name(&path("blocks.0.mlp_norm.gamma")),
            Some((
                "model.layers.0.post_attention_layernorm.weight".into(),
                false
            ))
        );
        assert_eq!(hf_name(&path("blocks.0.mlp.other.weight")), None);
        let t = HostTensor {
            shape: vec![2, 3],
            data: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        let tt = t.transposed();
        assert_eq!(tt.shape, vec![3, 2]);
        assert_eq!(tt.data, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }

    #[test]
    fn round_trip_gives_the_same_logits() {
        let device = Default::default();
        for (bias, tie) in [(false, false), (true, true)] {
            let config = tiny(bias, tie);
            let model: Transformer<B> = config
                .init_seeded(&device, &mut Rng::new(7))
                .expect("valid config");
            let hf = transformer_to_hf(&model);
            let expected_names = 2 + 2 * 9 + usize::from(!tie) + if bias { 2 * 3 } else { 0 };
            assert_eq!(hf.len(), expected_names, "{:?}", hf.keys());
            assert_eq!(hf["model.layers.1.mlp.down_proj.weight"].shape, vec![8, 12]);
            let loaded: Transformer<B> =
                transformer_from_hf(&config, hf, &device, Path::new("mem")).expect("loads");
            let tokens = Tensor::<B, 2, Int>::from_data([[1, 4, 9, 2]], &device);
            let a = model.forward(tokens.clone()).into_data();
            let b = loaded.forward(tokens).into_data();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn missing_wrong_shape_and_extra_tensors_are_errors() {
        let device = Default::default();
        let config = tiny(false, false);
        let model: Transformer<B> = config
            .init_seeded(&device, &mut Rng::new(1))
            .expect("valid config");
        let full = transformer_to_hf(&model);

        let mut missing = full.clone();
        missing.remove("model.norm.weight");
        let err = transformer_from_hf::<B>(&config, missing, &device, Path::new("m"))
            .expect_err("missing");
        assert!(
            err.to_string().contains("missing tensor model.norm.weight"),
            "{err}"
        );

        let mut wrong = full.clone();
        wrong.insert(
            "model.layers.0.self_attn.v_proj.weight".into(),
            HostTensor {
                shape: vec![8, 8],
                data: vec![0.0; 64],
            },
        );
        let err =
            transformer_from_hf::<B>(&config, wrong, &device, Path::new("m")).expect_err("shape");
        assert!(
            err.to_string().contains("v_proj.weight has shape [8, 8]"),
            "{err}"
        );

        let mut extra = full;
        extra.insert(
            "model.layers.0.self_attn.q_proj.bias".into(),
            HostTensor {
                shape: vec![8],
                data: vec![0.0; 8],
            },
        );
        extra.insert(
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            HostTensor {
                shape: vec![2],
                data: vec![0.0; 2],
            },
        );
        let err =
            transformer_from_hf::<B>(&config, extra, &device, Path::new("m")).expect_err("extra");
        assert!(err.to_string().contains("q_proj.bias"), "{err}");
        assert!(!err.to_string().contains("inv_freq"), "{err}");
    }
}
