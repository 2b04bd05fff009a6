//! A model's frozen projections also kept in the quantized blocks of the file they were
//! loaded from, for decoding a few rows at a time on the CPU.
//!
//! A GGUF file stores SmolLM2's projections as `Q4_1` and its tied embedding as `Q8_0`;
//! [`crate::gguf::GgufFile::packed`] reads them into [`PackedWeights`] and
//! [`Transformer::with_packed`] (at the end of this file) attaches them. Then every product of a projection (or
//! of the LM head) with at most [`PACKED_MAX_ROWS`] rows — a decode step of one to four
//! streams — multiplies by the blocks ([`rlany_kernels::packed`]), reading ≈ 96 MB per token
//! instead of 538 MB of f32; larger products, training and `Autodiff` use the dense
//! weights. The blocks hold exactly the dense weights' values, so the outputs differ from
//! the dense product's only by summation order (≈ 1e-6 relative).
//!
//! The blocks describe the weights as loaded: whatever changes those weights
//! ([`crate::Transformer::merge_lora`], [`crate::Transformer::with_dtype`]) drops them, and a
//! model whose projections are trained must not carry them (LoRA adapters are fine: they
//! are added on top, and the base stays frozen).

use std::sync::Arc;

pub use rlany_kernels::PACKED_MAX_ROWS;
use rlany_kernels::{AttentionOps, PackedMatrix};

use crate::error::ModelError;
use crate::transformer::Transformer;

/// The projections of one block, in [`PROJECTIONS`] order.
pub(crate) type LayerPacked = [Option<Arc<PackedMatrix>>; 7];

/// The Hugging Face names of a block's projections, in [`LayerPacked`] order.
pub(crate) const PROJECTIONS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// Quantized copies of a model's projections and LM head (any of them may be absent: that
/// product stays dense).
#[derive(Debug, Clone, Default)]
pub struct PackedWeights {
    pub(crate) layers: Vec<LayerPacked>,
    /// `[vocab, d_model]`: the LM head, or the tied embedding.
    pub(crate) head: Option<Arc<PackedMatrix>>,
}

impl PackedWeights {
    /// Nothing packed yet, for a model of `n_layers` blocks.
    pub fn new(n_layers: usize) -> Self {
        PackedWeights {
            layers: vec![Default::default(); n_layers],
            head: None,
        }
    }

    /// Places `matrix` by the Hugging Face name of the weight it holds
    /// (`model.layers.{i}.self_attn.q_proj.weight`, …, `lm_head.weight`, and
    /// `model.embed_tokens.weight` when the head is `tied` to it). Returns whether the name
    /// has a place; other names (norms, biases, an untied embedding) are not products here.
    pub fn place(&mut self, name: &str, matrix: PackedMatrix, tied: bool) -> bool {
        if name == "lm_head.weight" || (tied && name == "model.embed_tokens.weight") {
            self.head = Some(Arc::new(matrix));
            return true;
        }
        let Some(rest) = name.strip_prefix("model.layers.") else {
            return false;
        };
        let Some((layer, rest)) = rest.split_once('.') else {
            return false;
        };
        let (Ok(layer), Some(part)) = (layer.parse::<usize>(), rest.strip_suffix(".weight")) else {
            return false;
        };
        let (Some(slots), Some(k)) = (
            self.layers.get_mut(layer),
            PROJECTIONS.iter().position(|p| *p == part),
        ) else {
            return false;
        };
        slots[k] = Some(Arc::new(matrix));
        true
    }

    /// How many matrices are packed.
    pub fn len(&self) -> usize {
        self.layers.iter().flatten().flatten().count() + usize::from(self.head.is_some())
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the blocks' integers and scales.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .flatten()
            .chain(&self.head)
            .map(|m| m.bytes())
            .sum()
    }
}

/// The packed side of [`Transformer`]: attach the blocks, ask whether they are there.
impl<B: AttentionOps> Transformer<B> {
    /// The model with `packed` copies of its projections and LM head ([`crate::packed`]):
    /// products of at most [`crate::packed::PACKED_MAX_ROWS`] rows then read the blocks
    /// (on a CPU backend, outside autodiff). Each matrix must have its projection's shape
    /// (`[d_out, d_in]`) and the layer count this model's; the values are the caller's
    /// promise — the blocks of the file these weights were loaded from (see
    /// [`crate::gguf::GgufFile::packed`]).
    pub fn with_packed(mut self, packed: PackedWeights) -> Result<Self, ModelError> {
        let c = &self.config;
        let (d, ffn, hd) = (c.d_model, c.ffn_hidden, c.head_dim());
        let (q, kv) = (c.n_heads * hd, c.n_kv_heads * hd);
        // [d_out, d_in] of each projection, in `PROJECTIONS` order.
        let shapes = [
            (q, d),
            (kv, d),
            (kv, d),
            (d, q),
            (ffn, d),
            (ffn, d),
            (d, ffn),
        ];
        if packed.layers.len() != self.blocks.len() {
            return Err(ModelError::InvalidConfig(format!(
                "packed weights for {} layers, the model has {}",
                packed.layers.len(),
                self.blocks.len()
            )));
        }
        for (i, layer) in packed.layers.iter().enumerate() {
            for ((m, &(rows, cols)), name) in layer.iter().zip(&shapes).zip(PROJECTIONS) {
                if let Some(m) = m
                    && (m.rows(), m.cols()) != (rows, cols)
                {
                    return Err(ModelError::InvalidConfig(format!(
                        "packed layer {i} {name} is {} × {}, the model's is {rows} × {cols}",
                        m.rows(),
                        m.cols()
                    )));
                }
            }
        }
        if let Some(h) = &packed.head
            && (h.rows(), h.cols()) != (c.vocab_size, d)
        {
            return Err(ModelError::InvalidConfig(format!(
                "the packed LM head is {} × {}, the model's is {} × {d}",
                h.rows(),
                h.cols(),
                c.vocab_size
            )));
        }
        self.packed = (!packed.is_empty()).then(|| Arc::new(packed));
        Ok(self)
    }

    /// Whether the model carries packed blocks ([`Transformer::with_packed`]).
    pub fn has_packed(&self) -> bool {
        self.packed.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use burn::backend::NdArray;
    use burn::prelude::*;
    use rlany_framework::{CausalLm, Rng, SampleParams};
    use rlany_kernels::{BlockFormat, PackedMatrix};

    use super::{PROJECTIONS, PackedWeights};
    use crate::gguf::GgufFile;
    use crate::transformer::Transformer;

    type B = NdArray<f32>;

    /// The fixture: llama, 2 layers, `d_model` 64, untied head, every block type.
    fn tiny() -> GgufFile {
        GgufFile::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny.gguf"))
            .expect("tiny.gguf")
    }

    /// The fixture's config and its dense model on NdArray.
    fn tiny_model(gguf: &GgufFile) -> (crate::TransformerConfig, Transformer<B>) {
        let config = gguf.config(None).expect("config");
        let model = gguf.transformer(None, &Default::default()).expect("model");
        (config, model)
    }

    /// A `rows × cols` `Q8_0` matrix of zero blocks (every weight 0).
    fn zeros(rows: usize, cols: usize) -> PackedMatrix {
        let raw = vec![0u8; rows * cols / 32 * BlockFormat::Q8_0.ggml_bytes()];
        PackedMatrix::from_ggml(BlockFormat::Q8_0, rows, cols, &raw).expect("zero blocks")
    }

    #[test]
    fn the_blocks_hold_the_dense_weights_bit_for_bit() {
        let gguf = tiny();
        let config = gguf.config(None).expect("config");
        let packed = gguf.packed(&config).expect("packed");
        let dense = gguf.weights(&config).expect("weights");
        let mut named: Vec<(String, &PackedMatrix)> = Vec::new();
        for (i, layer) in packed.layers.iter().enumerate() {
            for (m, part) in layer.iter().zip(PROJECTIONS) {
                if let Some(m) = m {
                    named.push((format!("model.layers.{i}.{part}.weight"), m));
                }
            }
        }
        if let Some(head) = &packed.head {
            named.push(("lm_head.weight".to_string(), head));
        }
        // Both formats, and the Q/K rows put back in "rotate half" order like the dense ones.
        let formats: std::collections::BTreeSet<_> = named
            .iter()
            .map(|(_, m)| format!("{:?}", m.format()))
            .collect();
        assert_eq!(formats.len(), 2, "{formats:?}");
        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.iter().any(|n| n.contains("k_proj")), "{names:?}");
        assert_eq!(named.len(), packed.len());
        for (name, m) in named {
            let w = &dense[&name];
            assert_eq!(w.shape, [m.rows(), m.cols()], "{name}");
            let same = m
                .dequantize()
                .iter()
                .zip(&w.data)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: the blocks are not the dense weights");
        }
    }

    /// Logits of a 3-token prompt then 4 one-token steps through the KV cache, `[7, vocab]`.
    fn decode_logits(model: &Transformer<B>, prompt_rows: usize) -> Vec<f32> {
        let device = Default::default();
        let mut cache = model.new_cache();
        let mut out = Vec::new();
        let mut at = 0i64;
        for len in [prompt_rows, 1, 1, 1, 1] {
            let ids: Vec<i64> = (0..len as i64).map(|k| (at + k) * 37 % 300).collect();
            let pos: Vec<i64> = (0..len as i64).map(|k| at + k).collect();
            let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, len]), &device);
            let positions = Tensor::<B, 2, Int>::from_data(TensorData::new(pos, [1, len]), &device);
            let hidden = model.forward_with(tokens, positions, None, Some(&mut cache));
            let logits = model.decode_logits(hidden);
            out.extend(logits.into_data().into_vec::<f32>().expect("f32"));
            at += len as i64;
        }
        out
    }

    /// `packed` decodes as `dense` does, up to summation order: every logit of
    /// [`decode_logits`] within 1e-5 of the largest.
    fn assert_decodes_alike(dense: &Transformer<B>, packed: &Transformer<B>) {
        let (want, got) = (decode_logits(dense, 3), decode_logits(packed, 3));
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = want
            .iter()
            .zip(&got)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "worst {worst}, scale {scale}"
        );
    }

    #[test]
    fn packed_decoding_matches_the_dense_model() {
        let gguf = tiny();
        let (config, dense) = tiny_model(&gguf);
        let packed = dense
            .clone()
            .with_packed(gguf.packed(&config).expect("packed"))
            .expect("shapes fit");
        assert!(packed.has_packed() && !dense.has_packed());
        assert_decodes_alike(&dense, &packed);
        // What changes the weights drops the blocks.
        assert!(
            !packed
                .clone()
                .with_dtype(burn::tensor::FloatDType::F32)
                .has_packed()
        );
    }

    /// A model with q/k/v biases (Qwen2's): the packed products add them as the dense ones
    /// do (the blocks hold the weights only).
    #[test]
    fn packed_decoding_keeps_the_projections_biases() {
        let gguf = tiny();
        let (config, mut dense) = tiny_model(&gguf);
        let device = Default::default();
        for (i, block) in dense.blocks.iter_mut().enumerate() {
            let a = &mut block.attention;
            for (k, layer) in [&mut a.query, &mut a.key, &mut a.value]
                .into_iter()
                .enumerate()
            {
                let n = layer.weight.dims()[1];
                let values: Vec<f32> = (0..n)
                    .map(|j| ((i * 31 + k * 7 + j) as f32 * 0.61).sin() * 0.5)
                    .collect();
                let bias = Tensor::<B, 1>::from_data(TensorData::new(values, [n]), &device);
                layer.bias = Some(burn::module::Param::from_tensor(bias));
            }
        }
        let packed = dense
            .clone()
            .with_packed(gguf.packed(&config).expect("packed"))
            .expect("shapes fit");
        assert_decodes_alike(&dense, &packed);
    }

    #[test]
    fn products_of_at_most_four_rows_read_the_blocks_and_larger_ones_the_dense_weights() {
        let (config, dense) = tiny_model(&tiny());
        // Blocks of zeros for the first layer's gate: only a product that reads them changes.
        let mut zeroed = PackedWeights::new(config.n_layers);
        let matrix = zeros(config.ffn_hidden, config.d_model);
        assert!(zeroed.place("model.layers.0.mlp.gate_proj.weight", matrix, false));
        let model = dense.clone().with_packed(zeroed).expect("shapes fit");
        let vocab = config.vocab_size;
        // A 3-token prompt: rows of 3 and then 1, all through the zeroed gate.
        let (d, z) = (decode_logits(&dense, 3), decode_logits(&model, 3));
        assert_ne!(d[..3 * vocab], z[..3 * vocab]);
        assert_ne!(d[6 * vocab..], z[6 * vocab..]);
        // A 5-token prompt: its 5 rows take the dense weights (the same logits, bit for bit);
        // the one-token steps after it read the blocks.
        let (d, z) = (decode_logits(&dense, 5), decode_logits(&model, 5));
        assert_eq!(d[..5 * vocab], z[..5 * vocab]);
        assert_ne!(d[8 * vocab..], z[8 * vocab..]);
    }

    #[test]
    fn misshapen_blocks_are_refused() {
        let (config, dense) = tiny_model(&tiny());
        let mut wrong = PackedWeights::new(config.n_layers);
        assert!(wrong.place(
            "model.layers.1.self_attn.q_proj.weight",
            zeros(32, 64),
            false
        ));
        let e = dense
            .clone()
            .with_packed(wrong)
            .expect_err("32 × 64 is not q_proj");
        assert!(e.to_string().contains("layer 1 self_attn.q_proj"), "{e}");
        let e = dense
            .with_packed(PackedWeights::new(config.n_layers + 1))
            .expect_err("a layer too many");
        assert!(e.to_string().contains("3 layers"), "{e}");
        // Names without a product here have no place.
        let m = zeros(1, 32);
        let mut p = PackedWeights::new(2);
        assert!(!p.place("model.layers.0.input_layernorm.weight", m.clone(), false));
        assert!(!p.place("model.embed_tokens.weight", m.clone(), false));
        assert!(!p.place("model.layers.9.mlp.up_proj.weight", m, false));
        assert!(p.is_empty());
    }

    /// SmolLM2 (its projections `Q4_1`, its tied embedding `Q8_0`): greedy replies with and
    /// without the blocks are the same tokens.
    #[test]
    fn smollm2_greedy_reply_is_the_same_packed() {
        let Some(path) = crate::gguf::tests::smollm2() else {
            return;
        };
        let device = Default::default();
        let gguf = GgufFile::open(&path).expect("open");
        let dense: Transformer<B> = gguf.transformer(Some(128), &device).expect("model");
        let packed = gguf.packed(dense.config()).expect("packed");
        // 30 layers × 7 projections and the head.
        assert_eq!(packed.len(), 30 * 7 + 1);
        let model = dense.clone().with_packed(packed).expect("shapes fit");
        let prompt = crate::gguf::tests::ids(&serde_json::json!([1, 9690, 198, 2683, 314, 253]));
        let params = SampleParams {
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 12,
            stop_tokens: Vec::new(),
            on_device: false,
        };
        let reply = |m: &Transformer<B>| {
            m.generate(std::slice::from_ref(&prompt), &params, &mut Rng::new(1))
                .remove(0)
                .tokens
        };
        assert_eq!(reply(&model), reply(&dense));
    }
}
