//! A [`Transformer`]'s own checkpoint: its weights in Burn's named MessagePack, full
//! precision (`<path>.mpk`), and its [`TransformerConfig`] as JSON beside them
//! (`<path>.json`), loaded back with every parameter's shape checked against the config.
//!
//! Pretrained files (GGUF, Hugging Face safetensors) do not come through here: they are read
//! into [`crate::HfWeights`] and mapped onto the model's fields by `weights.rs`.

use std::path::{Path, PathBuf};

use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use rlany_kernels::AttentionOps;

use crate::error::ModelError;
use crate::transformer::{Transformer, TransformerConfig, TransformerRecord};

impl<B: AttentionOps> Transformer<B> {
    /// Path of the JSON config saved beside the weights of `path` (extension `json`; the
    /// weights themselves get extension `mpk`).
    pub fn config_path(path: &Path) -> PathBuf {
        path.with_extension("json")
    }

    /// Saves the weights (full precision, named MessagePack, at `path` with extension `mpk`)
    /// and the config as JSON beside them ([`Transformer::config_path`]).
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
        self.clone()
            .save_file(path.to_path_buf(), &recorder)
            .map_err(|e| ModelError::Save {
                path: path.with_extension("mpk"),
                message: e.to_string(),
            })?;
        let config_path = Self::config_path(path);
        self.config
            .save(&config_path)
            .map_err(|e| ModelError::Save {
                path: config_path,
                message: e.to_string(),
            })
    }

    /// Loads weights saved by [`Transformer::save`] into a model built from `config` on
    /// `device`. A missing or corrupt file, or weights whose shapes (or, when the JSON config
    /// is beside them, whose architecture) differ from `config`, is an error.
    pub fn load(
        config: &TransformerConfig,
        path: &Path,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let weights_path = path.with_extension("mpk");
        let config_path = Self::config_path(path);
        if config_path.exists() {
            let saved = TransformerConfig::load(&config_path).map_err(|e| ModelError::Load {
                path: config_path.clone(),
                message: e.to_string(),
            })?;
            let arch = |c: &TransformerConfig| {
                (
                    c.vocab_size,
                    c.d_model,
                    c.n_layers,
                    c.n_heads,
                    c.n_kv_heads,
                    c.ffn_hidden,
                    c.qkv_bias,
                    c.tie_embeddings,
                )
            };
            if arch(&saved) != arch(config) {
                return Err(ModelError::Mismatch {
                    path: config_path,
                    message: format!("saved config {saved} differs from the given {config}"),
                });
            }
        }
        let fresh = config.build::<B>(device)?;
        let expected = param_shapes(&fresh);
        let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
        let record: TransformerRecord<B> =
            recorder
                .load(path.to_path_buf(), device)
                .map_err(|e| ModelError::Load {
                    path: weights_path.clone(),
                    message: e.to_string(),
                })?;
        let model = fresh.load_record(record);
        let found = param_shapes(&model);
        if found != expected {
            return Err(ModelError::Mismatch {
                path: weights_path,
                message: format!(
                    "parameter shapes {found:?} differ from the config's {expected:?}"
                ),
            });
        }
        Ok(model)
    }
}

/// Shapes of every float parameter in visiting order.
fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.shape().as_slice().to_vec());
        }
    }
    let mut shapes = Shapes(Vec::new());
    module.visit(&mut shapes);
    shapes.0
}

#[cfg(test)]
mod tests {
    use rlany_framework::CausalLm;

    use super::*;
    use crate::test_support::{B, int_tensor, tiny, to_vec};

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir()
            .join(format!("rlany-models-test-{}", std::process::id()))
            .join(name)
    }

    #[test]
    fn save_then_load_is_bit_exact() {
        let config = tiny().with_qkv_bias(true);
        // Straight from `init` (not reseeded): its parameters must already be materialised,
        // or the clone inside `save` would draw different weights.
        let model = config.init::<B>(&Default::default()).expect("valid config");
        let path = temp_path("roundtrip/policy");
        model.save(&path).expect("save");
        assert!(path.with_extension("mpk").exists());
        assert!(Transformer::<B>::config_path(&path).exists());
        let saved = TransformerConfig::load(Transformer::<B>::config_path(&path)).expect("json");
        assert_eq!(saved.d_model, config.d_model);
        let loaded = Transformer::<B>::load(&config, &path, &Default::default()).expect("load");
        let input = int_tensor(&[vec![1, 5, 9, 33, 70], vec![1, 2, 3, 4, 99]]);
        let (a, _) = to_vec(CausalLm::forward(&model, input.clone()));
        let (b, _) = to_vec(CausalLm::forward(&loaded, input));
        assert_eq!(a, b);

        // A config whose shapes differ is refused.
        let other = TransformerConfig {
            ffn_hidden: 48,
            ..config.clone()
        };
        assert!(matches!(
            Transformer::<B>::load(&other, &path, &Default::default()),
            Err(ModelError::Mismatch { .. })
        ));
        // Same, with the JSON config gone: the parameter shapes still catch it.
        std::fs::remove_file(Transformer::<B>::config_path(&path)).expect("rm json");
        assert!(matches!(
            Transformer::<B>::load(&other, &path, &Default::default()),
            Err(ModelError::Mismatch { .. })
        ));
        let _ = std::fs::remove_dir_all(temp_path("roundtrip"));
    }

    #[test]
    fn a_clone_of_a_fresh_model_has_the_same_weights() {
        let model = tiny().init::<B>(&Default::default()).expect("valid config");
        let copy = model.clone();
        let input = int_tensor(&[vec![1, 5, 9, 33]]);
        let (a, _) = to_vec(CausalLm::forward(&copy, input.clone()));
        let (b, _) = to_vec(CausalLm::forward(&model, input));
        assert_eq!(a, b);
    }

    #[test]
    fn loading_a_missing_or_corrupt_file_is_an_error() {
        let missing = temp_path("does/not/exist");
        let err = Transformer::<B>::load(&tiny(), &missing, &Default::default())
            .expect_err("missing file");
        assert!(matches!(err, ModelError::Load { .. }));
        assert!(err.to_string().contains("exist.mpk"), "{err}");

        let corrupt = temp_path("corrupt/model");
        std::fs::create_dir_all(temp_path("corrupt")).expect("mkdir");
        std::fs::write(corrupt.with_extension("mpk"), b"not msgpack at all").expect("write");
        assert!(matches!(
            Transformer::<B>::load(&tiny(), &corrupt, &Default::default()),
            Err(ModelError::Load { .. })
        ));
        let _ = std::fs::remove_dir_all(temp_path("corrupt"));
    }
}
