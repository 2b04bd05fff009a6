//! A Llama/Qwen2-style decoder-only transformer with batched KV-cache generation.
//!
//! - Llama (Touvron et al., arXiv 2302.13971): pre-norm RMSNorm blocks, rotary positions,
//!   SwiGLU MLP, no biases, untied LM head.
//! - Qwen2 (Yang et al., arXiv 2407.10671): the same with a bias on the q/k/v projections
//!   (`qkv_bias`) and optionally tied input/output embeddings (`tie_embeddings`).
//! - RoPE (Su et al., arXiv 2104.09864), in the "rotate half" layout of Hugging Face Llama:
//!   the pair `(x[i], x[i + head_dim/2])` is rotated by `position · θ^(−2i/head_dim)`.
//! - Grouped-query attention (Ainslie et al., arXiv 2305.13245): `n_kv_heads` K/V heads,
//!   each shared by `n_heads / n_kv_heads` consecutive query heads.
//! - SwiGLU (Shazeer, arXiv 2002.05202): `down(silu(gate(x)) ⊙ up(x))`.
//!
//! The public surface is [`TransformerConfig`], [`Transformer`] (which implements
//! [`CausalLm`]) and [`KvCache`].
//!
//! This file is the decoder itself: its configuration, the blocks (attention, MLP), the
//! forward passes and the logits. The rest of [`Transformer`]'s methods sit beside what they
//! serve: LoRA adapters in `lora.rs`, packed weights in `packed.rs`, saving and loading in
//! `checkpoint.rs`, seeded initialisation in `init.rs`; generation over kept contexts, with
//! the attention biases, the shared-prefix rule and the decode-time LM head, in `decode.rs`.

use std::sync::Arc;

use burn::module::{Initializer, ModuleMapper, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;
use burn::tensor::module::linear;
use burn::tensor::{DType, FloatDType, TensorPrimitive};
use rlany_framework::ppo::in_f32;
use rlany_framework::{CausalLm, Generation, Rng, SampleParams, select_positions};
use rlany_kernels::{
    AttentionOps, Heads, PACKED_MAX_ROWS, PackedMatrix, add_rms_norm, grouped_attention,
    packed_matmul, rotary, rotary_cache_write,
};

use crate::decode::{
    self, Contexts, SHARED_PREFIX_MIN, causal_bias, combine_bias, tokens_shared_prefix,
};
use crate::error::ModelError;
pub(crate) use crate::kv_cache::KvCache;
use crate::kv_cache::LayerKv;
use crate::lora::{BlockLora, LoraAdapter};
use crate::packed::{LayerPacked, PackedWeights};

/// Additive attention bias of a masked-out key. Finite (not `-inf`) so that a query whose
/// keys are all masked (a left-pad position) gets a harmless uniform row instead of NaN;
/// any query with one visible key gives masked keys exactly zero weight in f32.
pub(crate) const MASKED: f32 = -1.0e9;

/// Token id fed at padding positions. Padding keys are masked out, so the id is irrelevant;
/// 0 is valid in every vocabulary.
pub(crate) const PAD_ID: i64 = 0;

/// Configuration of a [`Transformer`].
#[derive(Config, Debug)]
pub struct TransformerConfig {
    /// Number of token ids (input embedding rows and output logits).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of decoder blocks.
    pub n_layers: usize,
    /// Number of query heads (`d_model / n_heads` is the head dimension).
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention); divides `n_heads`.
    pub n_kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub ffn_hidden: usize,
    /// Longest context (prompt + generation); the size of the rotary tables.
    pub max_seq_len: usize,
    /// Base θ of the rotary frequencies.
    #[config(default = 10000.0)]
    pub rope_theta: f32,
    /// Bias on the q, k and v projections (Qwen2).
    #[config(default = false)]
    pub qkv_bias: bool,
    /// Use the transposed token embedding as the LM head instead of its own weights.
    #[config(default = false)]
    pub tie_embeddings: bool,
    /// Epsilon of every RMSNorm.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl TransformerConfig {
    /// Checks that the sizes describe a model: all positive, `d_model` divisible by
    /// `n_heads`, an even head dimension (rotary pairs), `n_heads` divisible by
    /// `n_kv_heads`, and a positive finite `rope_theta` and `norm_eps`.
    pub fn validate(&self) -> Result<(), ModelError> {
        let invalid = |m: String| Err(ModelError::InvalidConfig(m));
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("ffn_hidden", self.ffn_hidden),
            ("max_seq_len", self.max_seq_len),
        ] {
            if value == 0 {
                return invalid(format!("{name} must be positive"));
            }
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return invalid(format!(
                "d_model {} is not divisible by n_heads {}",
                self.d_model, self.n_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return invalid(format!(
                "head_dim {} (d_model / n_heads) must be even for rotary positions",
                self.head_dim()
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return invalid(format!(
                "n_heads {} is not divisible by n_kv_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return invalid(format!("rope_theta {} must be positive", self.rope_theta));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return invalid(format!("norm_eps {} must be positive", self.norm_eps));
        }
        Ok(())
    }

    /// Width of one attention head, `d_model / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Builds a freshly initialised model on `device` (embedding ~ N(0, 0.02²), linear
    /// layers with Burn's default Kaiming-uniform, norms at 1).
    ///
    /// Every parameter is materialised here: Burn parameters are otherwise initialised
    /// lazily, and a clone of a never-read model would draw its own, different weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Transformer<B>, ModelError> {
        struct Materialize;
        impl<B: Backend> ModuleVisitor<B> for Materialize {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let _ = param.val();
            }
        }
        let model = self.build::<B>(device)?;
        model.visit(&mut Materialize);
        Ok(model)
    }

    /// The model with lazily initialised parameters (for loading weights into).
    pub(crate) fn build<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<Transformer<B>, ModelError> {
        self.validate()?;
        let head_dim = self.head_dim();
        let linear = |d_in: usize, d_out: usize, bias: bool| {
            LinearConfig::new(d_in, d_out)
                .with_bias(bias)
                .init::<B>(device)
        };
        let norm = || {
            RmsNormConfig::new(self.d_model)
                .with_epsilon(self.norm_eps)
                .init::<B>(device)
        };
        let blocks = (0..self.n_layers)
            .map(|_| Block {
                attention_norm: norm(),
                attention: Attention {
                    query: linear(self.d_model, self.n_heads * head_dim, self.qkv_bias),
                    key: linear(self.d_model, self.n_kv_heads * head_dim, self.qkv_bias),
                    value: linear(self.d_model, self.n_kv_heads * head_dim, self.qkv_bias),
                    output: linear(self.n_heads * head_dim, self.d_model, false),
                    n_heads: self.n_heads,
                    n_kv_heads: self.n_kv_heads,
                    head_dim,
                },
                mlp_norm: norm(),
                mlp: SwiGlu {
                    gate: linear(self.d_model, self.ffn_hidden, false),
                    up: linear(self.d_model, self.ffn_hidden, false),
                    down: linear(self.ffn_hidden, self.d_model, false),
                },
                lora: None,
            })
            .collect();
        let (rope_cos, rope_sin) =
            rotary_tables::<B>(self.max_seq_len, head_dim, self.rope_theta, device);
        Ok(Transformer {
            embedding: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                })
                .init(device),
            blocks,
            norm: norm(),
            lm_head: (!self.tie_embeddings).then(|| linear(self.d_model, self.vocab_size, false)),
            rope_cos,
            rope_sin,
            config: self.clone(),
            packed: None,
        })
    }
}

/// Rotary tables `cos(p · θ^(−2i/head_dim))`, `sin(…)` for every position `p <
/// max_seq_len` and pair `i < head_dim / 2`, computed in f64 on the host once.
///
/// # Shapes
/// - outputs: `[max_seq_len, head_dim / 2]` each
fn rotary_tables<B: Backend>(
    max_seq_len: usize,
    head_dim: usize,
    theta: f32,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(max_seq_len * half);
    let mut sin = Vec::with_capacity(max_seq_len * half);
    for p in 0..max_seq_len {
        for i in 0..half {
            let inv_freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let angle = p as f64 * inv_freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (
        Tensor::from_data(TensorData::new(cos, [max_seq_len, half]), device),
        Tensor::from_data(TensorData::new(sin, [max_seq_len, half]), device),
    )
}

/// `layer` (plus its LoRA adapter, if any) applied as one matrix product over all rows:
/// Burn's `Linear` on a rank-3 input runs one small product per batch row, far slower on CPU
/// than a single flat product. The base product reads `packed` instead of the weights where
/// it is given and serves (a few rows on a CPU backend, [`crate::packed`]).
///
/// # Shapes
/// - `x`: `[batch, seq, d_input]`
/// - output: `[batch, seq, d_output]`
fn project<B: AttentionOps>(
    layer: &Linear<B>,
    adapter: Option<&LoraAdapter<B>>,
    packed: Option<&PackedMatrix>,
    x: Tensor<B, 3>,
) -> Tensor<B, 3> {
    project_with(layer, adapter, packed, x, true)
}

/// [`project`] without the layer's bias when `with_bias` is false (the decode step adds it in
/// its next op: [`rotary_cache_write`]).
///
/// # Shapes
/// As [`project`].
fn project_with<B: AttentionOps>(
    layer: &Linear<B>,
    adapter: Option<&LoraAdapter<B>>,
    packed: Option<&PackedMatrix>,
    x: Tensor<B, 3>,
    with_bias: bool,
) -> Tensor<B, 3> {
    let [batch, seq, d_input] = x.dims();
    // [batch * seq, d_input]
    let flat = x.reshape([batch * seq, d_input]);
    // [batch * seq, d_output]: the base product on the packed blocks where they serve (a few
    // rows, a CPU backend, no autodiff; the blocks hold the weight, not the bias), the dense
    // weights otherwise.
    let bias = layer.bias.as_ref().filter(|_| with_bias).map(|b| b.val());
    let base = match packed.and_then(|w| packed_matmul(&flat, w)) {
        Some(y) => match bias {
            Some(b) => y + b.unsqueeze_dim(0),
            None => y,
        },
        None => linear(flat.clone(), layer.weight.val(), bias),
    };
    let y = match adapter {
        Some(a) => base + a.forward(flat),
        None => base,
    };
    let d_output = y.dims()[1];
    // [batch, seq, d_output]
    y.reshape([batch, seq, d_output])
}

/// What a block's projections add to their dense weights: LoRA adapters, and the packed
/// blocks that few-row products read instead of the weights.
struct Extras<'a, B: Backend> {
    lora: Option<&'a BlockLora<B>>,
    packed: Option<&'a LayerPacked>,
}

impl<B: Backend> Clone for Extras<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for Extras<'_, B> {}

impl<B: Backend> Extras<'_, B> {
    /// The packed blocks of projection `k` (in [`PROJECTIONS`](crate::packed::PROJECTIONS)
    /// order), if any.
    fn packed(&self, k: usize) -> Option<&PackedMatrix> {
        self.packed.and_then(|p| p[k].as_deref())
    }
}

/// Grouped-query self-attention with rotary positions.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub(crate) query: Linear<B>,
    pub(crate) key: Linear<B>,
    pub(crate) value: Linear<B>,
    pub(crate) output: Linear<B>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl<B: AttentionOps> Attention<B> {
    /// Attention of every position of `x` over the cached keys and its own causal prefix.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
    /// - `bias`: `[batch or 1, 1, seq, cache_len + seq]` (f32, 0 or [`MASKED`])
    /// - cached K/V: `[batch, kv_heads, cache_len, head_dim]`
    /// - output: `[batch, seq, d_model]`
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
        cache: Option<(&mut Option<LayerKv<B>>, usize)>,
        extra: Extras<'_, B>,
    ) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let (lora, pick) = (extra.lora, |k| extra.packed(k));
        let (heads, kv_heads, head_dim) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let group = heads / kv_heads;
        // With the cache on a backend with decode kernels, the projections' biases go into
        // the next op (one launch fewer each); elsewhere the products are unchanged.
        let fold = cache.is_some() && B::DECODE_KERNELS;
        let bias_of =
            |layer: &Linear<B>| fold.then(|| layer.bias.as_ref().map(|b| b.val())).flatten();

        // [batch, seq, heads * head_dim]
        let q = project_with(
            &self.query,
            lora.and_then(|l| l.q_proj.as_ref()),
            pick(0),
            x.clone(),
            !fold,
        );
        // [batch, seq, kv_heads * head_dim]
        let k = project_with(
            &self.key,
            lora.and_then(|l| l.k_proj.as_ref()),
            pick(1),
            x.clone(),
            !fold,
        );
        // [batch, seq, kv_heads * head_dim]
        let v = project_with(
            &self.value,
            lora.and_then(|l| l.v_proj.as_ref()),
            pick(2),
            x,
            !fold,
        );
        let bias_qkv = [
            bias_of(&self.query),
            bias_of(&self.key),
            bias_of(&self.value),
        ];

        // softmax(q kᵀ + bias) v; under autodiff its backward recomputes the probabilities
        // rather than keeping every layer's [heads, seq, keys] (rlany-kernels, `attention`).
        // Each K/V head serves `group` consecutive query heads (the repeat of GQA), done by
        // folding those heads into the row dimension instead of copying K and V.
        // [batch, kv_heads, group * seq, head_dim]
        let context = match cache {
            Some((slot, reserve)) => {
                // Rotary positions, the queries' scale and the cache's write in one op
                // (one pass on the Cube backends, rlany-kernels `decode`).
                let (k_buffer, v_buffer, at) =
                    LayerKv::make_room(slot, [batch, kv_heads, seq, head_dim], reserve, &k);
                let shape = Heads {
                    heads,
                    kv_heads,
                    head_dim,
                };
                let [q, k_buffer, v_buffer] =
                    rotary_cache_write(q, k, v, bias_qkv, cos, sin, k_buffer, v_buffer, at, shape);
                let keys = at + seq;
                let (k, v) = LayerKv::filled(slot, k_buffer, v_buffer, keys);
                // The cache read in place ([`AttentionOps::cached_attention`]): for every
                // decode step on the Cube backends, where it is one launch; on the CPU only
                // where the projections read packed blocks (a decode step of at most
                // `PACKED_MAX_ROWS` rows of `rlany generate`), so a run's numbers stay the
                // composition's.
                let in_place = (B::DECODE_KERNELS && seq == 1)
                    || (extra.packed.is_some() && batch * seq <= PACKED_MAX_ROWS);
                let served = in_place
                    .then(|| {
                        B::cached_attention(
                            q.clone().into_primitive().tensor(),
                            k.clone().into_primitive().tensor(),
                            v.clone().into_primitive().tensor(),
                            keys,
                            bias.map(|b| b.clone().into_primitive().tensor()),
                            group,
                        )
                    })
                    .flatten();
                match served {
                    Some(context) => Tensor::from_primitive(TensorPrimitive::Float(context)),
                    None => grouped_attention(
                        q,
                        k.narrow(2, 0, keys),
                        v.narrow(2, 0, keys),
                        bias.cloned(),
                        group,
                    ),
                }
            }
            None => {
                // [batch, seq, n, head_dim] -> [batch, n, seq, head_dim]
                let split =
                    |t: Tensor<B, 3>, n| t.reshape([batch, seq, n, head_dim]).swap_dims(1, 2);
                let q = rotary(split(q, heads), cos, sin)
                    .mul_scalar((head_dim as f64).powf(-0.5))
                    .reshape([batch, kv_heads, group * seq, head_dim]);
                let k = rotary(split(k, kv_heads), cos, sin);
                grouped_attention(q, k, split(v, kv_heads), bias.cloned(), group)
            }
        };
        // [batch, kv_heads, group * seq, head_dim] -> [batch, heads, seq, head_dim]
        let context = context.reshape([batch, heads, seq, head_dim]);
        // [batch, seq, heads, head_dim] -> [batch, seq, heads * head_dim]; one position is
        // already in that order (no copy).
        let context = match seq {
            1 => context.reshape([batch, seq, heads * head_dim]),
            _ => context
                .swap_dims(1, 2)
                .reshape([batch, seq, heads * head_dim]),
        };
        project(
            &self.output,
            lora.and_then(|l| l.o_proj.as_ref()),
            pick(3),
            context,
        )
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) ⊙ up(x))`, no biases.
#[derive(Module, Debug)]
pub struct SwiGlu<B: Backend> {
    pub(crate) gate: Linear<B>,
    pub(crate) up: Linear<B>,
    pub(crate) down: Linear<B>,
}

impl<B: AttentionOps> SwiGlu<B> {
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    fn forward(&self, x: Tensor<B, 3>, extra: Extras<'_, B>) -> Tensor<B, 3> {
        let adapter =
            |pick: fn(&BlockLora<B>) -> Option<&LoraAdapter<B>>| extra.lora.and_then(pick);
        let pick = |k| extra.packed(k);
        let gate = project(
            &self.gate,
            adapter(|l| l.gate_proj.as_ref()),
            pick(4),
            x.clone(),
        );
        let up = project(&self.up, adapter(|l| l.up_proj.as_ref()), pick(5), x);
        // Both products first, then the gate: Burn's fusion makes `silu(gate) ⊙ up` one kernel
        // (the silu between the two products would be a kernel of its own).
        project(
            &self.down,
            adapter(|l| l.down_proj.as_ref()),
            pick(6),
            silu(gate) * up,
        )
    }
}

/// One pre-norm decoder block: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    attention_norm: RmsNorm<B>,
    pub(crate) attention: Attention<B>,
    mlp_norm: RmsNorm<B>,
    pub(crate) mlp: SwiGlu<B>,
    /// Low-rank adapters on this block's projections (see [`Transformer::with_lora`]).
    pub(crate) lora: Option<BlockLora<B>>,
}

impl<B: AttentionOps> Block<B> {
    /// The block on the residual stream `x` plus `delta`, the previous block's MLP output
    /// not yet added (so that the add and this block's first norm are one op:
    /// [`AttentionOps::add_rms_norm`]). Returns the stream after the attention's residual and
    /// this block's MLP output, to be added by the next norm.
    ///
    /// # Shapes
    /// - `x`, `delta`: `[batch, seq, d_model]`
    /// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
    /// - `bias`: `[batch or 1, 1, seq, cache_len + seq]`
    /// - outputs: `[batch, seq, d_model]` each
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: Tensor<B, 3>,
        delta: Option<Tensor<B, 3>>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
        cache: Option<(&mut Option<LayerKv<B>>, usize)>,
        packed: Option<&LayerPacked>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let extra = Extras {
            lora: self.lora.as_ref(),
            packed,
        };
        let (x, normed) = norm(&self.attention_norm, x, delta);
        let attended = self.attention.forward(normed, cos, sin, bias, cache, extra);
        let (h, normed) = norm(&self.mlp_norm, x, Some(attended));
        (h, self.mlp.forward(normed, extra))
    }
}

/// `(x + delta, norm(x + delta))` through [`AttentionOps::add_rms_norm`] (Burn's `RmsNorm`
/// op for op, or one pass).
///
/// # Shapes
/// - `x`, `delta`: `[batch, seq, d_model]`; outputs the same
fn norm<B: AttentionOps>(
    norm: &RmsNorm<B>,
    x: Tensor<B, 3>,
    delta: Option<Tensor<B, 3>>,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    add_rms_norm(x, delta, norm.gamma.val(), norm.epsilon)
}

/// A Llama/Qwen2-style decoder: token embedding, [`TransformerConfig::n_layers`] pre-norm
/// blocks (RMSNorm → GQA attention with rotary positions → residual → RMSNorm → SwiGLU →
/// residual), a final RMSNorm and an LM head (own weights or the tied embedding).
///
/// Build it with [`TransformerConfig::init`] or [`Transformer::load`].
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    pub(crate) embedding: Embedding<B>,
    pub(crate) blocks: Vec<Block<B>>,
    pub(crate) norm: RmsNorm<B>,
    pub(crate) lm_head: Option<Linear<B>>,
    /// `[max_seq_len, head_dim / 2]`, a constant (not a parameter, not saved).
    rope_cos: Tensor<B, 2>,
    /// `[max_seq_len, head_dim / 2]`, a constant (not a parameter, not saved).
    rope_sin: Tensor<B, 2>,
    #[module(skip)]
    pub(crate) config: TransformerConfig,
    /// The frozen projections in their file's quantized blocks, for decoding a few rows
    /// ([`crate::packed`]; set by [`Transformer::with_packed`]).
    #[module(skip)]
    pub(crate) packed: Option<Arc<PackedWeights>>,
}

impl<B: AttentionOps> Transformer<B> {
    /// The configuration the model was built from.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.blocks.len())
    }

    /// The device the model lives on.
    pub fn device(&self) -> B::Device {
        self.rope_cos.device()
    }

    /// The model with every weight and the rotary tables in `dtype` (bf16/f16 compute on a
    /// backend that supports it; attention scores and their softmax stay in f32).
    pub fn with_dtype(self, dtype: FloatDType) -> Self {
        struct Cast(FloatDType);
        impl<B: Backend> ModuleMapper<B> for Cast {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                let dtype = self.0;
                param.map(|t| t.cast(dtype))
            }
        }
        let mut model = self.map(&mut Cast(dtype));
        // The packed blocks compute in f32 from the weights as loaded.
        model.packed = None;
        model.rope_cos = model.rope_cos.cast(dtype);
        model.rope_sin = model.rope_sin.cast(dtype);
        model
    }

    /// The model with context `max_seq_len` (its rotary tables rebuilt; the weights, which
    /// do not depend on it, shared with `self`).
    pub fn with_max_seq_len(mut self, max_seq_len: usize) -> Self {
        if max_seq_len == self.config.max_seq_len {
            return self;
        }
        let device = self.device();
        let dtype = self.rope_cos.dtype();
        let (cos, sin) = rotary_tables::<B>(
            max_seq_len,
            self.config.head_dim(),
            self.config.rope_theta,
            &device,
        );
        self.rope_cos = cos.cast(dtype);
        self.rope_sin = sin.cast(dtype);
        self.config.max_seq_len = max_seq_len;
        self
    }

    /// Final hidden states (after the last RMSNorm) at explicit positions, optionally
    /// attending over and extending a KV cache. Apply [`Transformer::logits`] to get logits.
    ///
    /// Every query attends to the cached keys and to the keys of this call up to itself
    /// (causal), minus those marked in `key_mask`.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`
    /// - `positions`: `[batch, seq]`, rotary position of each token, each `< max_seq_len`
    ///   (left-padded rows count from their first real token; pads may use 0)
    /// - `key_mask`: `[batch, cache_len + seq]`, `true` = masked out (padding)
    /// - `cache`: K/V `[batch, kv_heads, cache_len, head_dim]` per layer, grown by `seq`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// On shapes that disagree with the above or a cache built for another layer count.
    pub fn forward_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        key_mask: Option<Tensor<B, 2, Bool>>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        assert_eq!(
            positions.dims(),
            [batch, seq],
            "positions must have the shape of tokens"
        );
        let cache_len = cache.as_ref().map_or(0, |c| c.len());
        let device = tokens.device();
        let (cos, sin) = self.rotary_at(positions);
        let keys = key_mask.map(|mask| {
            assert_eq!(
                mask.dims(),
                [batch, cache_len + seq],
                "key_mask must be [batch, cache_len + seq]"
            );
            // [batch, 1, 1, cache_len + seq]
            mask.float()
                .cast(DType::F32)
                .mul_scalar(MASKED)
                .reshape([batch, 1, 1, cache_len + seq])
        });
        let bias = combine_bias(causal_bias::<B>(cache_len, seq, &device), keys);
        self.forward_hidden(tokens, &cos, &sin, bias.as_ref(), cache)
    }

    /// Final hidden states of right-padded rows read from position 0, causal mask only.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`
    /// - output: `[batch, seq, d_model]`
    fn causal_hidden(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let seq = tokens.dims()[1];
        assert!(
            seq <= self.config.max_seq_len,
            "sequence length {seq} exceeds max_seq_len {}",
            self.config.max_seq_len
        );
        let (cos, sin) = self.rotary_range(0, seq);
        let bias = causal_bias::<B>(0, seq, &tokens.device());
        self.forward_hidden(tokens, &cos, &sin, bias.as_ref(), None)
    }

    /// Final hidden states at the flat positions `row · seq + j` of right-padded rows read
    /// from position 0, causal mask only: [`Transformer::causal_hidden`]'s rows there.
    ///
    /// When every row starts with the same [`SHARED_PREFIX_MIN`] tokens or more (a chat
    /// template's system prompt and instructions; a task's prompt in a group of samples of
    /// it), that common prefix is computed once, as a batch of one, and each row's remainder
    /// attends to its keys and values (the KV cache's path): the same values, and under
    /// autodiff the same gradients (the rows' gradients of the prefix add up), for a
    /// fraction of the arithmetic.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`
    /// - output: `[positions.len(), d_model]`
    fn hidden_at(&self, tokens: Tensor<B, 2, Int>, positions: &[usize]) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        // Reading the ids to the host only where a prefix could be shared.
        let shared = if batch > 1 && seq > SHARED_PREFIX_MIN {
            tokens_shared_prefix(&tokens)
        } else {
            0
        };
        if shared == 0 {
            return select_positions(self.causal_hidden(tokens), positions);
        }
        let rest = seq - shared;
        let device = tokens.device();
        // The prefix as one row: [1, shared] -> [1, shared, d_model], its K/V cached.
        let mut cache = KvCache::new(self.blocks.len());
        cache.reserve(rest);
        let (cos, sin) = self.rotary_range(0, shared);
        let bias = causal_bias::<B>(0, shared, &device);
        let head = tokens.clone().slice([0..1, 0..shared]);
        let prefix = self.forward_hidden(head, &cos, &sin, bias.as_ref(), Some(&mut cache));
        // Every row reads the one prefix: [1, kv_heads, shared, head_dim] -> [batch, ...].
        cache.select_rows(Tensor::zeros([batch], &device));
        let (cos, sin) = self.rotary_range(shared, rest);
        let bias = causal_bias::<B>(shared, rest, &device);
        let tail = tokens.slice([0..batch, shared..seq]);
        // [batch, rest, d_model]
        let suffix = self.forward_hidden(tail, &cos, &sin, bias.as_ref(), Some(&mut cache));
        let d_model = self.config.d_model;
        // [shared, d_model] then [batch · rest, d_model]: position (r, j) is row j of the
        // prefix when j < shared, else row `shared + r · rest + (j − shared)`.
        let table = Tensor::cat(
            vec![
                prefix.reshape([shared, d_model]),
                suffix.reshape([batch * rest, d_model]),
            ],
            0,
        );
        let index: Vec<usize> = positions
            .iter()
            .map(|&p| {
                let (r, j) = (p / seq, p % seq);
                if j < shared {
                    j
                } else {
                    shared + r * rest + (j - shared)
                }
            })
            .collect();
        // [shared + batch · rest, d_model] -> [1, shared + batch · rest, d_model]
        select_positions(table.unsqueeze_dim(0), &index)
    }

    /// Logits of hidden states (the LM head, or the transposed embedding when tied), in f32
    /// whatever the weights' dtype: sampling, log-probs, entropy and KL all read them in f32.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let logits = match &self.lm_head {
            Some(head) => project(head, None, None, hidden),
            None => {
                let [batch, seq, d_model] = hidden.dims();
                // [batch * seq, d_model] x [d_model, vocab] -> [batch, seq, vocab]
                hidden
                    .reshape([batch * seq, d_model])
                    .matmul(self.embedding.weight.val().transpose())
                    .reshape([batch, seq, self.config.vocab_size])
            }
        };
        in_f32(logits)
    }

    /// Rotary cosines and sines gathered at `positions`.
    ///
    /// # Shapes
    /// - `positions`: `[batch, seq]`
    /// - outputs: `[batch, 1, seq, head_dim / 2]`
    pub(crate) fn rotary_at(&self, positions: Tensor<B, 2, Int>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [batch, seq] = positions.dims();
        let half = self.config.head_dim() / 2;
        // [batch * seq]
        let flat = positions.reshape([batch * seq]);
        // [batch * seq, half] -> [batch, 1, seq, half]
        let cos = self
            .rope_cos
            .clone()
            .select(0, flat.clone())
            .reshape([batch, 1, seq, half]);
        // [batch * seq, half] -> [batch, 1, seq, half]
        let sin = self
            .rope_sin
            .clone()
            .select(0, flat)
            .reshape([batch, 1, seq, half]);
        (cos, sin)
    }

    /// Rotary cosines and sines of positions `start..start + seq` (shared by every row).
    ///
    /// # Shapes
    /// - outputs: `[1, 1, seq, head_dim / 2]`
    pub(crate) fn rotary_range(&self, start: usize, seq: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let half = self.config.head_dim() / 2;
        // [seq, half] -> [1, 1, seq, half]
        let cos = self
            .rope_cos
            .clone()
            .narrow(0, start, seq)
            .reshape([1, 1, seq, half]);
        // [seq, half] -> [1, 1, seq, half]
        let sin = self
            .rope_sin
            .clone()
            .narrow(0, start, seq)
            .reshape([1, 1, seq, half]);
        (cos, sin)
    }

    /// The decoder stack on prepared rotary angles and attention bias.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`
    /// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
    /// - `bias`: `[batch or 1, 1, seq, cache_len + seq]` (f32)
    /// - output: `[batch, seq, d_model]`
    pub(crate) fn forward_hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        if let Some(cache) = cache.as_deref() {
            assert_eq!(
                cache.layers.len(),
                self.blocks.len(),
                "the KV cache was built for another number of layers"
            );
        }
        let (mut x, mut delta) = (self.embedding.forward(tokens), None);
        for (i, block) in self.blocks.iter().enumerate() {
            let layer = cache.as_deref_mut().map(|c| {
                let reserve = c.reserve;
                (&mut c.layers[i], reserve)
            });
            let packed = self.packed.as_ref().and_then(|p| p.layers.get(i));
            let (stream, out) = block.forward(x, delta, cos, sin, bias, layer, packed);
            (x, delta) = (stream, Some(out));
        }
        norm(&self.norm, x, delta).1
    }
}

impl<B: AttentionOps> CausalLm<B> for Transformer<B> {
    type Contexts = Contexts<B>;

    /// Logits at positions `0..seq` of every row, causal mask only (right-padded rows).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `seq <= max_seq_len`
    /// - output: `[batch, seq, vocab]`
    ///
    /// # Panics
    /// If `seq > max_seq_len`.
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.logits(self.causal_hidden(tokens))
    }

    /// The LM head at the named positions only (see the trait); the same values as
    /// [`CausalLm::forward`]'s rows there.
    fn logits_at(&self, tokens: Tensor<B, 2, Int>, positions: &[usize]) -> Tensor<B, 2> {
        let n = positions.len();
        // [n, d] -> [1, n, d]
        let picked = self.hidden_at(tokens, positions).unsqueeze_dim(0);
        let logits = self.logits(picked);
        let vocab = logits.dims()[2];
        // [1, n, vocab] -> [n, vocab]
        logits.reshape([n, vocab])
    }

    fn contexts(&self, rows: usize) -> Contexts<B> {
        Contexts::new(self, rows)
    }

    /// See the `decode` module: reads each row's new tokens in one left-padded pass over its
    /// cached positions, then samples one token per row per step with the KV cache (the LM
    /// head on the last position only, its logits read to the host once per step and
    /// sampled there in row order).
    ///
    /// On an autodiff backend this records a graph: generate with `model.valid()`.
    ///
    /// # Panics
    /// If a token id is `>= vocab_size`, or a row is out of range, named twice or was dropped.
    fn extend(
        &self,
        contexts: &mut Contexts<B>,
        rows: &[usize],
        appended: &[Vec<u32>],
        params: &SampleParams,
        rng: &mut Rng,
    ) -> Vec<Generation> {
        decode::extend(self, contexts, rows, appended, params, rng)
    }

    fn max_seq_len(&self) -> usize {
        self.config.max_seq_len
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::activation::log_softmax;
    use rlany_framework::experiment::LoraSpec;

    use super::*;
    use crate::test_support::{
        B, int_tensor, max_abs_diff, model, row_logits, seeded, tiny, to_vec,
    };

    #[test]
    fn validate_rejects_bad_shapes() {
        assert!(tiny().validate().is_ok());
        let bad = [
            TransformerConfig {
                d_model: 30,
                ..tiny()
            }, // 30 % 4 != 0
            TransformerConfig {
                d_model: 36,
                ..tiny()
            }, // head_dim 9 is odd
            TransformerConfig {
                n_kv_heads: 3,
                ..tiny()
            }, // 4 % 3 != 0
            TransformerConfig {
                n_layers: 0,
                ..tiny()
            },
            TransformerConfig {
                vocab_size: 0,
                ..tiny()
            },
            TransformerConfig {
                max_seq_len: 0,
                ..tiny()
            },
            tiny().with_rope_theta(0.0),
            tiny().with_norm_eps(0.0),
        ];
        for config in bad {
            assert!(
                matches!(config.validate(), Err(ModelError::InvalidConfig(_))),
                "{config}"
            );
            assert!(config.init::<B>(&Default::default()).is_err());
        }
    }

    #[test]
    fn rotary_rotates_pairs_by_hand() {
        let device = Default::default();
        // head_dim 4: pair 0 turns by p rad, pair 1 by p / 100 rad (theta = 10^4).
        let (cos, sin) = rotary_tables::<B>(8, 4, 10_000.0, &device);
        let positions = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![3i64], [1]), &device);
        let cos = cos.select(0, positions.clone()).reshape([1, 1, 1, 2]);
        let sin = sin.select(0, positions).reshape([1, 1, 1, 2]);
        // x = (x1 = [1, 2], x2 = [0, 1]): pairs (1, 0) and (2, 1).
        let x = Tensor::<B, 4>::from_data(
            TensorData::new(vec![1.0f32, 2.0, 0.0, 1.0], [1, 1, 1, 4]),
            &device,
        );
        let got: Vec<f32> = rotary(x, &cos, &sin).into_data().iter().collect();
        let (a, b) = (3.0f64, 0.03f64);
        let want = [
            a.cos(),
            2.0 * b.cos() - b.sin(),
            a.sin(),
            b.cos() + 2.0 * b.sin(),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn rotary_scores_depend_only_on_relative_position() {
        let device = Default::default();
        let (cos_t, sin_t) = rotary_tables::<B>(32, 8, 10_000.0, &device);
        let at = |p: i64| {
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![p], [1]), &device);
            (
                cos_t.clone().select(0, idx.clone()).reshape([1, 1, 1, 4]),
                sin_t.clone().select(0, idx).reshape([1, 1, 1, 4]),
            )
        };
        let q = Tensor::<B, 4>::from_data(
            TensorData::new(
                vec![0.3f32, -1.2, 0.5, 0.9, 1.1, 0.2, -0.7, 0.4],
                [1, 1, 1, 8],
            ),
            &device,
        );
        let k = Tensor::<B, 4>::from_data(
            TensorData::new(
                vec![-0.4f32, 0.8, 1.3, -0.2, 0.6, -0.9, 0.1, 0.7],
                [1, 1, 1, 8],
            ),
            &device,
        );
        let score = |pq: i64, pk: i64| {
            let (cq, sq) = at(pq);
            let (ck, sk) = at(pk);
            let rq = rotary(q.clone(), &cq, &sq);
            let rk = rotary(k.clone(), &ck, &sk);
            (rq * rk).sum().into_scalar()
        };
        let base = score(5, 2);
        for shift in [1, 7, 20] {
            assert!((score(5 + shift, 2 + shift) - base).abs() < 1e-5);
        }
        assert!((score(6, 2) - base).abs() > 1e-3);
    }

    #[test]
    fn right_padding_does_not_change_real_positions() {
        let model = model(&tiny(), 3);
        let short = vec![1u32, 20, 21];
        let alone = row_logits(&model, &short);
        let batch = int_tensor(&[vec![1, 20, 21, 0, 0], vec![1, 30, 31, 32, 33]]);
        let (flat, [_, seq, vocab]) = to_vec(CausalLm::forward(&model, batch));
        for (i, want) in alone.iter().enumerate() {
            assert!(max_abs_diff(&flat[i * vocab..(i + 1) * vocab], want) <= 1e-5);
        }
        assert_eq!(seq, 5);
    }

    /// PPO's first minibatch reads the old policy's log-probs off the trained forward
    /// (`ppo_update`), which is exact only if that forward gives the inference model's values
    /// bit for bit: checked with LoRA adapters on every projection, q/k/v biases, and rows
    /// sharing a prefix (the path computing it once).
    #[test]
    fn the_trained_forward_gives_the_inference_forwards_values_bit_for_bit() {
        use burn::module::AutodiffModule;
        type A = Autodiff<NdArray>;
        let device = Default::default();
        let shared: Vec<i64> = (0..20).map(|i| 3 + (i * 7) % 90).collect();
        let mut ids = Vec::new();
        for tail in [[40i64, 41, 42, 43], [40, 44, 45, 46], [60, 0, 0, 0]] {
            ids.extend(shared.iter().copied());
            ids.extend(tail);
        }
        let positions = vec![23usize, 3, 20, 47, 19, 48, 21, 71, 30, 55];
        let spec = LoraSpec {
            target_modules: vec!["all-linear".into()],
            ..Default::default()
        };
        let base = seeded::<A>(&tiny().with_qkv_bias(true), 5);
        for model in [base.clone(), base.with_lora(&spec, &mut Rng::new(2))] {
            let tokens =
                Tensor::<A, 2, Int>::from_data(TensorData::new(ids.clone(), [3, 24]), &device);
            let trained = model
                .logits_at(tokens.clone(), &positions)
                .into_data()
                .to_vec::<f32>()
                .expect("f32");
            let inference = model
                .valid()
                .logits_at(tokens.inner(), &positions)
                .into_data()
                .to_vec::<f32>()
                .expect("f32");
            assert_eq!(trained, inference);
        }
    }

    /// `logits_at` (and `last_logits`) equal `forward`'s rows at the named positions (any
    /// order, repeats, the padding), with and without a prefix the rows share, and a loss on
    /// it gives every parameter the gradient the same loss on `forward` gives.
    #[test]
    fn logits_at_positions_equal_forward_values_and_gradients() {
        type A = Autodiff<NdArray>;
        struct Grads<'a> {
            grads: &'a <A as burn::tensor::backend::AutodiffBackend>::Gradients,
            flat: Vec<f32>,
        }
        impl ModuleVisitor<A> for Grads<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
                if let Some(g) = param.grad(self.grads) {
                    self.flat
                        .extend(g.into_data().to_vec::<f32>().expect("f32"));
                }
            }
        }
        // Two rows with nothing in common; three rows sharing their first 20 tokens (the
        // prefix computed once), one right-padded, positions in the prefix and after it.
        let shared: Vec<i64> = (0..20).map(|i| 3 + (i * 7) % 90).collect();
        let mut three = Vec::new();
        for tail in [[40i64, 41, 42, 43], [40, 44, 45, 46], [60, 0, 0, 0]] {
            three.extend(shared.iter().copied());
            three.extend(tail);
        }
        let cases = [
            (
                vec![1i64, 7, 30, 31, 2, 1, 50, 51, 52, 53],
                [2, 5],
                vec![9usize, 1, 4, 6, 1, 0],
            ),
            (
                three,
                [3, 24],
                vec![23, 3, 20, 47, 19, 0, 48, 21, 71, 30, 55, 24],
            ),
        ];
        for ((ids, shape, positions), config) in cases.into_iter().flat_map(|c| {
            [tiny(), tiny().with_qkv_bias(true).with_tie_embeddings(true)]
                .map(|config| (c.clone(), config))
        }) {
            let device = Default::default();
            let model = seeded::<A>(&config, 11);
            let tokens = || -> Tensor<A, 2, Int> {
                Tensor::from_data(TensorData::new(ids.clone(), shape), &device)
            };
            let full = CausalLm::forward(&model, tokens());
            let vocab = full.dims()[2];
            let want = select_positions(full, &positions);
            let got = model.logits_at(tokens(), &positions);
            assert_eq!(got.dims(), [positions.len(), vocab]);
            let (w, g) = (
                want.clone().into_data().to_vec::<f32>().expect("f32"),
                got.clone().into_data().to_vec::<f32>().expect("f32"),
            );
            assert!(max_abs_diff(&w, &g) <= 1e-5);
            // The judge's read of each row's last real token takes the same path.
            let [rows, seq] = shape;
            let lengths: Vec<usize> = (0..rows).map(|r| seq - r).collect();
            let flat: Vec<usize> = (0..rows).map(|r| r * seq + seq - r - 1).collect();
            let last = model.last_logits(tokens(), &lengths);
            let want_last = select_positions(CausalLm::forward(&model, tokens()), &flat);
            assert!(
                max_abs_diff(
                    &last.into_data().to_vec::<f32>().expect("f32"),
                    &want_last.into_data().to_vec::<f32>().expect("f32"),
                ) <= 1e-5
            );
            // A loss weighting each picked row differently.
            let weights: Vec<f32> = (0..positions.len())
                .map(|i| [0.5, -1.0, 2.0, 0.25, 1.5, -0.75][i % 6])
                .collect();
            let weights = Tensor::<A, 1>::from_floats(weights.as_slice(), &device)
                .reshape([positions.len(), 1]);
            let grads_of = |logits: Tensor<A, 2>| {
                let loss = (log_softmax(logits, 1) * weights.clone()).sum();
                let grads = loss.backward();
                let mut v = Grads {
                    grads: &grads,
                    flat: Vec::new(),
                };
                model.visit(&mut v);
                v.flat
            };
            let (gw, gg) = (grads_of(want), grads_of(got));
            assert_eq!(gw.len(), gg.len());
            assert!(!gw.is_empty());
            assert!(max_abs_diff(&gw, &gg) <= 1e-4, "{}", max_abs_diff(&gw, &gg));
        }
    }

    #[test]
    fn gradients_reach_every_parameter() {
        type A = Autodiff<NdArray>;
        struct GradNorms<'a> {
            grads: &'a <A as burn::tensor::backend::AutodiffBackend>::Gradients,
            norms: Vec<Option<f32>>,
        }
        impl ModuleVisitor<A> for GradNorms<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
                let norm = param
                    .grad(self.grads)
                    .map(|g| g.square().sum().sqrt().into_scalar());
                self.norms.push(norm);
            }
        }
        for config in [tiny(), tiny().with_qkv_bias(true).with_tie_embeddings(true)] {
            let device = Default::default();
            let model = seeded::<A>(&config, 5);
            let tokens: Tensor<A, 2, Int> = Tensor::from_data(
                TensorData::new(vec![1i64, 7, 30, 31, 2, 1, 50, 51, 52, 53], [2, 5]),
                &device,
            );
            let targets: Tensor<A, 2, Int> = Tensor::from_data(
                TensorData::new(vec![7i64, 30, 31, 2, 0, 50, 51, 52, 53, 9], [2, 5]),
                &device,
            );
            let logp = log_softmax(CausalLm::forward(&model, tokens), 2);
            // Cross-entropy: -mean log p(target).
            let loss = logp.gather(2, targets.reshape([2, 5, 1])).mean().neg();
            let grads = loss.backward();
            let mut visitor = GradNorms {
                grads: &grads,
                norms: Vec::new(),
            };
            model.visit(&mut visitor);
            let expected = 2
                + config.n_layers * (2 + 7 + if config.qkv_bias { 3 } else { 0 })
                + usize::from(!config.tie_embeddings);
            assert_eq!(visitor.norms.len(), expected);
            for (i, norm) in visitor.norms.iter().enumerate() {
                let norm = norm.unwrap_or_else(|| panic!("parameter {i} has no gradient"));
                assert!(
                    norm.is_finite() && norm > 0.0,
                    "parameter {i}: grad norm {norm}"
                );
            }
        }
    }
}
