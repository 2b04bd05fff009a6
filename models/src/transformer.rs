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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::{Initializer, ModuleMapper, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::activation::silu;
use burn::tensor::{DType, FloatDType, TensorPrimitive};
use rlany_framework::ppo::in_f32;
use rlany_framework::{CausalLm, Generation, Rng, SampleParams, select_positions};
use rlany_kernels::{
    AttentionOps, PACKED_MAX_ROWS, PackedMatrix, grouped_attention, packed_matmul, rotary,
};

use crate::decode::{self, Contexts};
use crate::error::ModelError;
pub(crate) use crate::kv_cache::KvCache;
use crate::kv_cache::LayerKv;
use crate::lora::{BlockLora, LoraAdapter};
use crate::packed::{LayerPacked, PROJECTIONS, PackedWeights};
use rlany_framework::experiment::LoraSpec;

/// Additive attention bias of a masked-out key. Finite (not `-inf`) so that a query whose
/// keys are all masked (a left-pad position) gets a harmless uniform row instead of NaN;
/// any query with one visible key gives masked keys exactly zero weight in f32.
pub(crate) const MASKED: f32 = -1.0e9;

/// Elements of the embedding in one slice of the tied LM head while decoding (4 MiB in f32;
/// see [`Transformer::decode_logits`]).
const HEAD_SLICE: usize = 1 << 20;

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

    /// Builds a freshly initialised model whose every weight is drawn from `rng` (not from
    /// the backend's global RNG, which is shared by everything in the process): embedding
    /// ~ N(0, 0.02²), linear weights ~ U(±1/√fan_in) (Burn's default Kaiming-uniform bound),
    /// biases 0, norm gains 1. The same `rng` state gives the same model on every backend.
    pub fn init_seeded<B: Backend>(
        &self,
        device: &B::Device,
        rng: &mut Rng,
    ) -> Result<Transformer<B>, ModelError> {
        Ok(self.build::<B>(device)?.map(&mut SeededInit {
            rng,
            path: Vec::new(),
        }))
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

/// Draws every float parameter from the run's [`Rng`]; the leaf field name (`weight`,
/// `bias`, `gamma`) and whether the path passes through `embedding` pick the scheme.
struct SeededInit<'a> {
    rng: &'a mut Rng,
    path: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for SeededInit<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let leaf = self.path.last().cloned().unwrap_or_default();
        let in_embedding = self.path.iter().any(|p| p == "embedding");
        let rng = &mut *self.rng;
        param.map(|t| {
            let shape = t.shape();
            let dims = shape.as_slice().to_vec();
            let n: usize = dims.iter().product();
            let values: Vec<f32> = match leaf.as_str() {
                "gamma" => vec![1.0; n],
                "bias" => vec![0.0; n],
                _ if in_embedding => (0..n).map(|_| (0.02 * rng.normal()) as f32).collect(),
                _ => {
                    // Burn's Linear stores weights as [d_in, d_out]: fan_in = dims[0].
                    let bound = 1.0 / (dims.first().copied().unwrap_or(1).max(1) as f64).sqrt();
                    (0..n)
                        .map(|_| (bound * (2.0 * rng.uniform() - 1.0)) as f32)
                        .collect()
                }
            };
            Tensor::from_data(TensorData::new(values, shape), &t.device())
                .set_require_grad(t.is_require_grad())
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
    let [batch, seq, d_input] = x.dims();
    // [batch * seq, d_input]
    let flat = x.reshape([batch * seq, d_input]);
    // [batch * seq, d_output]: the base product on the packed blocks where they serve (a few
    // rows, a CPU backend, no autodiff), the dense weights otherwise.
    let base = packed
        .and_then(|w| packed_matmul(&flat, w))
        .unwrap_or_else(|| layer.forward(flat.clone()));
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
    /// The packed blocks of projection `k` (in [`PROJECTIONS`] order), if any.
    fn packed(&self, k: usize) -> Option<&PackedMatrix> {
        self.packed.and_then(|p| p[k].as_deref())
    }
}

/// Grouped-query self-attention with rotary positions.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
    output: Linear<B>,
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

        // [batch, seq, heads, head_dim] -> [batch, heads, seq, head_dim]
        let q = project(
            &self.query,
            lora.and_then(|l| l.q_proj.as_ref()),
            pick(0),
            x.clone(),
        )
        .reshape([batch, seq, heads, head_dim])
        .swap_dims(1, 2);
        // [batch, seq, kv_heads, head_dim] -> [batch, kv_heads, seq, head_dim]
        let k = project(
            &self.key,
            lora.and_then(|l| l.k_proj.as_ref()),
            pick(1),
            x.clone(),
        )
        .reshape([batch, seq, kv_heads, head_dim])
        .swap_dims(1, 2);
        // [batch, seq, kv_heads, head_dim] -> [batch, kv_heads, seq, head_dim]
        let v = project(
            &self.value,
            lora.and_then(|l| l.v_proj.as_ref()),
            pick(2),
            x,
        )
        .reshape([batch, seq, kv_heads, head_dim])
        .swap_dims(1, 2);
        let q = rotary(q, cos, sin);
        let k = rotary(k, cos, sin);

        // Each K/V head serves `group` consecutive query heads (the repeat of GQA), done by
        // folding those heads into the row dimension instead of copying K and V:
        // [batch, kv_heads, group * seq, head_dim]
        let q = q.mul_scalar((head_dim as f64).powf(-0.5)).reshape([
            batch,
            kv_heads,
            group * seq,
            head_dim,
        ]);
        // softmax(q kᵀ + bias) v; under autodiff its backward recomputes the probabilities
        // rather than keeping every layer's [heads, seq, keys] (rlany-kernels, `attention`).
        // Where the projections read packed blocks (a decode step of at most
        // `PACKED_MAX_ROWS` rows of `rlany generate` on a CPU backend) the cache is read in
        // place ([`AttentionOps::cached_attention`]); a run's numbers stay the composition's.
        // [batch, kv_heads, group * seq, head_dim]
        let context = match cache {
            Some((slot, reserve)) => {
                let (k, v, keys) = LayerKv::append(slot, k, v, reserve);
                let few_rows = batch * seq <= PACKED_MAX_ROWS;
                let in_place = extra.packed.filter(|_| few_rows).and_then(|_| {
                    B::cached_attention(
                        q.clone().into_primitive().tensor(),
                        k.clone().into_primitive().tensor(),
                        v.clone().into_primitive().tensor(),
                        keys,
                        bias.map(|b| b.clone().into_primitive().tensor()),
                        group,
                    )
                });
                match in_place {
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
            None => grouped_attention(q, k, v, bias.cloned(), group),
        };
        // [batch, kv_heads, group * seq, head_dim] -> [batch, heads, seq, head_dim]
        let context = context.reshape([batch, heads, seq, head_dim]);
        // [batch, seq, heads, head_dim] -> [batch, seq, heads * head_dim]
        let context = context
            .swap_dims(1, 2)
            .reshape([batch, seq, heads * head_dim]);
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
    gate: Linear<B>,
    up: Linear<B>,
    down: Linear<B>,
}

impl<B: AttentionOps> SwiGlu<B> {
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    fn forward(&self, x: Tensor<B, 3>, extra: Extras<'_, B>) -> Tensor<B, 3> {
        let adapter =
            |pick: fn(&BlockLora<B>) -> Option<&LoraAdapter<B>>| extra.lora.and_then(pick);
        let pick = |k| extra.packed(k);
        let gate = silu(project(
            &self.gate,
            adapter(|l| l.gate_proj.as_ref()),
            pick(4),
            x.clone(),
        ));
        let up = project(&self.up, adapter(|l| l.up_proj.as_ref()), pick(5), x);
        project(
            &self.down,
            adapter(|l| l.down_proj.as_ref()),
            pick(6),
            gate * up,
        )
    }
}

/// One pre-norm decoder block: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    attention_norm: RmsNorm<B>,
    attention: Attention<B>,
    mlp_norm: RmsNorm<B>,
    mlp: SwiGlu<B>,
    /// Low-rank adapters on this block's projections (see [`Transformer::with_lora`]).
    lora: Option<BlockLora<B>>,
}

impl<B: AttentionOps> Block<B> {
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
    /// - `bias`: `[batch or 1, 1, seq, cache_len + seq]`
    /// - output: `[batch, seq, d_model]`
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
        cache: Option<(&mut Option<LayerKv<B>>, usize)>,
        packed: Option<&LayerPacked>,
    ) -> Tensor<B, 3> {
        let extra = Extras {
            lora: self.lora.as_ref(),
            packed,
        };
        let h = x.clone()
            + self
                .attention
                .forward(self.attention_norm.forward(x), cos, sin, bias, cache, extra);
        h.clone() + self.mlp.forward(self.mlp_norm.forward(h), extra)
    }
}

/// A Llama/Qwen2-style decoder: token embedding, [`TransformerConfig::n_layers`] pre-norm
/// blocks (RMSNorm → GQA attention with rotary positions → residual → RMSNorm → SwiGLU →
/// residual), a final RMSNorm and an LM head (own weights or the tied embedding).
///
/// Build it with [`TransformerConfig::init`] or [`Transformer::load`].
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    embedding: Embedding<B>,
    blocks: Vec<Block<B>>,
    norm: RmsNorm<B>,
    lm_head: Option<Linear<B>>,
    /// `[max_seq_len, head_dim / 2]`, a constant (not a parameter, not saved).
    rope_cos: Tensor<B, 2>,
    /// `[max_seq_len, head_dim / 2]`, a constant (not a parameter, not saved).
    rope_sin: Tensor<B, 2>,
    #[module(skip)]
    config: TransformerConfig,
    /// The frozen projections in their file's quantized blocks, for decoding a few rows
    /// ([`crate::packed`]; set by [`Transformer::with_packed`]).
    #[module(skip)]
    packed: Option<Arc<PackedWeights>>,
}

/// The shortest common prefix of a batch's rows that [`Transformer::hidden_at`] computes
/// once instead of once per row (below it, the second pass costs more than it saves).
pub const SHARED_PREFIX_MIN: usize = 16;

/// How many leading tokens every row shares, when two rows or more share
/// [`SHARED_PREFIX_MIN`] or more; 0 otherwise. At most the shortest row's length − 1, so that
/// every row keeps a position of its own after the prefix (the one whose hidden state is read
/// last). The one rule for the training forward ([`Transformer::hidden_at`]) and generation
/// (`decode.rs`).
pub(crate) fn shared_prefix_len<T: PartialEq, R: AsRef<[T]>>(rows: &[R]) -> usize {
    let Some((first, others)) = rows.split_first() else {
        return 0;
    };
    if others.is_empty() {
        return 0;
    }
    let first = first.as_ref();
    let shortest = rows.iter().map(|r| r.as_ref().len()).min().unwrap_or(0);
    let common = (0..shortest)
        .take_while(|&j| others.iter().all(|r| r.as_ref()[j] == first[j]))
        .count()
        .min(shortest.saturating_sub(1));
    if common >= SHARED_PREFIX_MIN {
        common
    } else {
        0
    }
}

/// [`shared_prefix_len`] of the rows of `tokens` (their ids read to the host).
///
/// # Shapes
/// - `tokens`: `[batch, seq]`, `seq > 0`
fn tokens_shared_prefix<B: Backend>(tokens: &Tensor<B, 2, Int>) -> usize {
    let [_, seq] = tokens.dims();
    let ids = tokens.clone().into_data().convert::<i64>();
    let Ok(ids) = ids.to_vec::<i64>() else {
        return 0;
    };
    // [batch * seq] -> batch rows of seq
    let rows: Vec<&[i64]> = ids.chunks(seq).collect();
    shared_prefix_len(&rows)
}

/// Additive causal bias: query `i` (absolute position `cache_len + i`) sees keys
/// `j <= cache_len + i`. `None` when `seq == 1` (a single new query sees every key).
///
/// # Shapes
/// - output: `[1, 1, seq, cache_len + seq]` (f32)
pub(crate) fn causal_bias<B: Backend>(
    cache_len: usize,
    seq: usize,
    device: &B::Device,
) -> Option<Tensor<B, 4>> {
    if seq <= 1 {
        return None;
    }
    let keys = cache_len + seq;
    let mut bias = vec![0.0f32; seq * keys];
    for i in 0..seq {
        for j in (cache_len + i + 1)..keys {
            bias[i * keys + j] = MASKED;
        }
    }
    Some(Tensor::from_data(
        TensorData::new(bias, [1, 1, seq, keys]),
        (device, DType::F32),
    ))
}

/// Sum of the optional causal and key-padding biases.
pub(crate) fn combine_bias<B: Backend>(
    causal: Option<Tensor<B, 4>>,
    keys: Option<Tensor<B, 4>>,
) -> Option<Tensor<B, 4>> {
    match (causal, keys) {
        (Some(c), Some(k)) => Some(c + k),
        (c, k) => c.or(k),
    }
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

    /// The model with low-rank adapters ([`crate::lora`]) on the projections `spec` targets,
    /// in every block: every existing weight is frozen (no gradient, so no optimiser state),
    /// each adapter's `A` is drawn from `rng` and its `B` is zero, so the result computes
    /// exactly what `self` does until it is trained. Adapters already present are replaced.
    pub fn with_lora(self, spec: &LoraSpec, rng: &mut Rng) -> Self {
        let device = self.device();
        let mut model = self.without_lora().no_grad();
        let c = &model.config;
        let (d, ffn, hd) = (c.d_model, c.ffn_hidden, c.head_dim());
        let (q, kv) = (c.n_heads * hd, c.n_kv_heads * hd);
        for block in &mut model.blocks {
            let mut make = |name: &str, d_in: usize, d_out: usize| {
                spec.targets(name)
                    .then(|| LoraAdapter::init(d_in, d_out, spec, rng, &device))
            };
            block.lora = Some(BlockLora {
                q_proj: make("q_proj", d, q),
                k_proj: make("k_proj", d, kv),
                v_proj: make("v_proj", d, kv),
                o_proj: make("o_proj", q, d),
                gate_proj: make("gate_proj", d, ffn),
                up_proj: make("up_proj", d, ffn),
                down_proj: make("down_proj", ffn, d),
            });
        }
        model
    }

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

    /// Each block's adapters (`None` for a block without), in layer order.
    pub(crate) fn lora_blocks(&self) -> impl Iterator<Item = Option<&BlockLora<B>>> {
        self.blocks.iter().map(|b| b.lora.as_ref())
    }

    /// [`Transformer::lora_blocks`], to change.
    pub(crate) fn lora_blocks_mut(&mut self) -> impl Iterator<Item = &mut Option<BlockLora<B>>> {
        self.blocks.iter_mut().map(|b| &mut b.lora)
    }

    /// Whether any block has adapters.
    pub fn has_lora(&self) -> bool {
        self.blocks.iter().any(|b| b.lora.is_some())
    }

    /// The base model: the adapters dropped, the (shared, frozen) weights kept.
    pub fn without_lora(mut self) -> Self {
        for block in &mut self.blocks {
            block.lora = None;
        }
        self
    }

    /// Every adapter folded into its projection (`W + s·A·B`), the adapters dropped: a plain
    /// model computing what the adapted one does (to float rounding), e.g. to save in
    /// Hugging Face's format. A model without adapters is returned unchanged.
    pub fn merge_lora(mut self) -> Self {
        if self.has_lora() {
            // The merged projections are no longer the packed blocks' weights.
            self.packed = None;
        }
        for block in &mut self.blocks {
            let Some(lora) = block.lora.take() else {
                continue;
            };
            let a = &mut block.attention;
            let m = &mut block.mlp;
            let targets: [(&mut Linear<B>, Option<LoraAdapter<B>>); 7] = [
                (&mut a.query, lora.q_proj),
                (&mut a.key, lora.k_proj),
                (&mut a.value, lora.v_proj),
                (&mut a.output, lora.o_proj),
                (&mut m.gate, lora.gate_proj),
                (&mut m.up, lora.up_proj),
                (&mut m.down, lora.down_proj),
            ];
            for (linear, adapter) in targets {
                if let Some(adapter) = adapter {
                    let delta = adapter.delta();
                    let weight = linear.weight.val();
                    let merged = weight.clone() + delta.cast(weight.dtype());
                    linear.weight = Param::initialized(
                        linear.weight.id,
                        merged.set_require_grad(weight.is_require_grad()),
                    );
                }
            }
        }
        self
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

    /// The adapters of block `i`, if it has any.
    #[cfg(test)]
    pub(crate) fn blocks_lora(&self, i: usize) -> Option<&BlockLora<B>> {
        self.blocks.get(i).and_then(|b| b.lora.as_ref())
    }

    /// Parameters of the adapters (0 without).
    pub fn lora_params(&self) -> usize {
        self.blocks
            .iter()
            .filter_map(|b| b.lora.as_ref())
            .map(|l| l.num_params())
            .sum()
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

    /// [`Transformer::logits`] for decoding: the same logits, bit for bit on NdArray, with a
    /// tied head computed one slice of the vocabulary at a time.
    ///
    /// Burn's NdArray backend copies both operands of every matrix product into fresh
    /// row-major buffers, so `hidden · embeddingᵀ` gathers the whole transposed embedding
    /// element by element on every decode step (SmolLM2: 28M strided reads, ~2/3 of a decode
    /// step). Here each slice of [`HEAD_SLICE`] embedding elements, a contiguous view, is the
    /// left operand of `embedding[slice] · hiddenᵀ`: a contiguous copy small enough to stay
    /// in cache. Each logit is still one dot product over `d_model` in the same order
    /// (`a·b = b·a`; the product is blocked along `d_model` alone, never along the vocabulary
    /// or the rows; the test `sliced_tied_head_is_bit_identical` checks it). A GPU backend may
    /// tile the slices differently from the whole product (not checked bit for bit there).
    /// [`Transformer::logits`] itself, used by training, keeps the single product; an untied
    /// head (the models trained from scratch) goes through it unchanged.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab]`
    pub(crate) fn decode_logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        if let Some(head) = self.packed.as_ref().and_then(|p| p.head.as_deref()) {
            let [batch, seq, d_model] = hidden.dims();
            // [batch * seq, d_model] -> [batch * seq, vocab] -> [batch, seq, vocab]
            let flat = hidden.clone().reshape([batch * seq, d_model]);
            if let Some(logits) = packed_matmul(&flat, head) {
                return logits.reshape([batch, seq, self.config.vocab_size]);
            }
        }
        let rows = HEAD_SLICE / self.config.d_model;
        in_f32(self.sliced_logits(hidden, rows))
    }

    /// [`Transformer::decode_logits`] with slices of `rows` vocabulary entries (the last one
    /// shorter); the untied head is one product as in [`Transformer::logits`].
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab]`
    fn sliced_logits(&self, hidden: Tensor<B, 3>, rows: usize) -> Tensor<B, 3> {
        if self.lm_head.is_some() {
            return self.logits(hidden);
        }
        let [batch, seq, d_model] = hidden.dims();
        let (device, dtype) = (hidden.device(), hidden.dtype());
        let vocab = self.config.vocab_size;
        let rows = rows.clamp(1, vocab);
        // [batch * seq, d_model] -> [d_model, batch * seq]
        let columns = hidden.reshape([batch * seq, d_model]).transpose();
        let embedding = self.embedding.weight.val();
        // [rows, d_model] x [d_model, batch * seq] per slice -> [vocab, batch * seq]
        let slices = (0..vocab)
            .step_by(rows)
            .map(|start| {
                embedding
                    .clone()
                    .narrow(0, start, rows.min(vocab - start))
                    .matmul(columns.clone())
            })
            .collect();
        // [vocab, batch * seq] -> [batch * seq, vocab] -> [batch, seq, vocab]
        let logits = Tensor::cat(slices, 0)
            .transpose()
            .reshape([batch, seq, vocab]);
        // Copied into a fresh buffer: NdArray reads a tensor to the host in one copy only when
        // its strides are exactly row-major, and the reshape gives a length-1 axis stride 1
        // (read element by element, the SmolLM2 logits take ~1.5 ms more per step).
        Tensor::zeros([batch, seq, vocab], (&device, dtype))
            .slice_assign([0..batch, 0..seq, 0..vocab], logits)
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
        let mut x = self.embedding.forward(tokens);
        for (i, block) in self.blocks.iter().enumerate() {
            let layer = cache.as_deref_mut().map(|c| {
                let reserve = c.reserve;
                (&mut c.layers[i], reserve)
            });
            let packed = self.packed.as_ref().and_then(|p| p.layers.get(i));
            x = block.forward(x, cos, sin, bias, layer, packed);
        }
        self.norm.forward(x)
    }

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
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::activation::log_softmax;

    type B = NdArray;

    fn tiny() -> TransformerConfig {
        TransformerConfig::new(100, 32, 2, 4, 2, 64, 64)
    }

    /// Replaces every float parameter with values drawn from our own [`Rng`], so test
    /// models do not depend on Burn's global seed (shared by tests running in parallel).
    struct Reseed(Rng);
    impl<BB: Backend> burn::module::ModuleMapper<BB> for Reseed {
        fn map_float<const D: usize>(
            &mut self,
            param: Param<Tensor<BB, D>>,
        ) -> Param<Tensor<BB, D>> {
            param.map(|t| {
                let shape = t.shape();
                let dims = shape.as_slice().to_vec();
                let n: usize = dims.iter().product();
                let values: Vec<f32> = if dims.len() == 1 {
                    // Norm gains and biases.
                    (0..n)
                        .map(|_| (1.0 + 0.1 * self.0.normal()) as f32)
                        .collect()
                } else {
                    let a = 1.0 / (dims[0] as f64).sqrt();
                    (0..n)
                        .map(|_| (a * (2.0 * self.0.uniform() - 1.0)) as f32)
                        .collect()
                };
                Tensor::from_data(TensorData::new(values, shape), &t.device())
                    .set_require_grad(t.is_require_grad())
            })
        }
    }

    #[test]
    fn seeded_init_is_reproducible_and_follows_the_scheme() {
        let dev = Default::default();
        let a: Transformer<B> = tiny().init_seeded(&dev, &mut Rng::new(5)).expect("init");
        let b: Transformer<B> = tiny().init_seeded(&dev, &mut Rng::new(5)).expect("init");
        let c: Transformer<B> = tiny().init_seeded(&dev, &mut Rng::new(6)).expect("init");
        let x = Tensor::<B, 2, Int>::from_ints([[1, 5, 9, 4]], &dev);
        let (la, lb, lc) = (a.forward(x.clone()), b.forward(x.clone()), c.forward(x));
        assert_eq!(la.to_data(), lb.to_data());
        assert_ne!(la.to_data(), lc.to_data());
        let gamma = a.norm.gamma.val().into_data().to_vec::<f32>().expect("f32");
        assert!(gamma.iter().all(|g| *g == 1.0));
        let emb = a
            .embedding
            .weight
            .val()
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        let std = (emb.iter().map(|v| v * v).sum::<f32>() / emb.len() as f32).sqrt();
        assert!((std - 0.02).abs() < 0.003, "{std}");
    }

    fn seeded<BB: Backend>(config: &TransformerConfig, seed: u64) -> Transformer<BB> {
        let model = config
            .init::<BB>(&Default::default())
            .expect("valid config");
        model.map(&mut Reseed(Rng::new(seed)))
    }

    fn model(config: &TransformerConfig, seed: u64) -> Transformer<B> {
        seeded::<B>(config, seed)
    }

    fn int_tensor(rows: &[Vec<i64>]) -> Tensor<B, 2, Int> {
        let width = rows[0].len();
        let flat: Vec<i64> = rows.iter().flatten().copied().collect();
        Tensor::from_data(
            TensorData::new(flat, [rows.len(), width]),
            &Default::default(),
        )
    }

    fn to_vec(t: Tensor<B, 3>) -> (Vec<f32>, [usize; 3]) {
        let dims = t.dims();
        (t.into_data().iter::<f32>().collect(), dims)
    }

    /// `[seq, vocab]` logits of one unpadded row through `CausalLm::forward`.
    fn row_logits(model: &Transformer<B>, row: &[u32]) -> Vec<Vec<f32>> {
        let ids: Vec<i64> = row.iter().map(|&t| i64::from(t)).collect();
        let (flat, [_, seq, vocab]) = to_vec(CausalLm::forward(model, int_tensor(&[ids])));
        (0..seq)
            .map(|i| flat[i * vocab..(i + 1) * vocab].to_vec())
            .collect()
    }

    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn argmax(xs: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in xs.iter().enumerate() {
            if x > xs[best] {
                best = i;
            }
        }
        best as u32
    }

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
    fn cached_decoding_matches_uncached_and_unpadded_rows() {
        for config in [tiny(), tiny().with_qkv_bias(true).with_tie_embeddings(true)] {
            let model = model(&config, 7);
            let device = Default::default();
            let prompts: Vec<Vec<u32>> = vec![
                vec![1, 40, 41, 42, 43, 44],
                vec![1, 50],
                vec![1, 60, 61, 62],
            ];
            // Continuations fed one at a time after the prompt.
            let cont: Vec<Vec<u32>> =
                vec![vec![5, 6, 7, 8], vec![9, 10, 11, 12], vec![13, 14, 15, 16]];
            let batch = prompts.len();
            let plen = prompts.iter().map(Vec::len).max().unwrap_or(0);
            let steps = cont[0].len();
            let total = plen + steps;
            let pads: Vec<usize> = prompts.iter().map(|p| plen - p.len()).collect();
            let full: Vec<Vec<i64>> = (0..batch)
                .map(|r| {
                    let mut row = vec![0i64; pads[r]];
                    row.extend(prompts[r].iter().chain(&cont[r]).map(|&t| i64::from(t)));
                    row
                })
                .collect();
            let pos: Vec<Vec<i64>> = (0..batch)
                .map(|r| {
                    (0..total)
                        .map(|i| i.saturating_sub(pads[r]) as i64)
                        .collect()
                })
                .collect();
            let mask_rows: Vec<bool> = (0..batch)
                .flat_map(|r| (0..total).map(|i| i < pads[r]).collect::<Vec<_>>())
                .collect();
            let mask = Tensor::<B, 2, Bool>::from_data(
                TensorData::new(mask_rows, [batch, total]),
                &device,
            );
            let vocab = config.vocab_size;

            // Uncached: one pass over the whole padded sequence.
            let hidden = model.forward_with(
                int_tensor(&full),
                int_tensor(&pos),
                Some(mask.clone()),
                None,
            );
            let (uncached, _) = to_vec(model.logits(hidden));
            let uncached_at = |r: usize, i: usize| {
                uncached[(r * total + i) * vocab..(r * total + i + 1) * vocab].to_vec()
            };

            // Cached: prefill the prompts, then one token per step.
            let mut cache = model.new_cache();
            let take = |rows: &Vec<Vec<i64>>, from: usize, len: usize| -> Vec<Vec<i64>> {
                rows.iter().map(|r| r[from..from + len].to_vec()).collect()
            };
            let hidden = model.forward_with(
                int_tensor(&take(&full, 0, plen)),
                int_tensor(&take(&pos, 0, plen)),
                Some(mask.clone().narrow(1, 0, plen)),
                Some(&mut cache),
            );
            assert_eq!(cache.len(), plen);
            let (prefill, _) = to_vec(model.logits(hidden));
            let mut cached: Vec<Vec<Vec<f32>>> = (0..batch)
                .map(|r| {
                    (0..plen)
                        .map(|i| {
                            prefill[(r * plen + i) * vocab..(r * plen + i + 1) * vocab].to_vec()
                        })
                        .collect()
                })
                .collect();
            for s in 0..steps {
                let at = plen + s;
                let hidden = model.forward_with(
                    int_tensor(&take(&full, at, 1)),
                    int_tensor(&take(&pos, at, 1)),
                    Some(mask.clone().narrow(1, 0, at + 1)),
                    Some(&mut cache),
                );
                let (step, _) = to_vec(model.logits(hidden));
                for (r, rows) in cached.iter_mut().enumerate() {
                    rows.push(step[r * vocab..(r + 1) * vocab].to_vec());
                }
            }
            assert_eq!(cache.len(), total);

            for r in 0..batch {
                // Unpadded single-row forward of prompt + continuation.
                let row: Vec<u32> = prompts[r].iter().chain(&cont[r]).copied().collect();
                let alone = row_logits(&model, &row);
                for i in pads[r]..total {
                    let c = &cached[r][i];
                    let u = uncached_at(r, i);
                    let a = &alone[i - pads[r]];
                    assert!(
                        max_abs_diff(c, &u) <= 1e-4,
                        "cached vs uncached row {r} pos {i}"
                    );
                    assert!(
                        max_abs_diff(c, a) <= 1e-4,
                        "cached vs alone row {r} pos {i}"
                    );
                }
            }
        }
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

    fn params(temperature: f64, top_p: f64, max_new_tokens: usize, stop: Vec<u32>) -> SampleParams {
        SampleParams {
            temperature,
            top_p,
            max_new_tokens,
            stop_tokens: stop,
            on_device: false,
        }
    }

    #[test]
    fn sampling_on_the_device_follows_the_host_rule() {
        let model = model(&tiny(), 29);
        for (temperature, stop) in [(0.0, vec![]), (1.0, vec![4, 9]), (0.7, vec![])] {
            let host = params(temperature, 1.0, 10, stop);
            let device = SampleParams {
                on_device: true,
                ..host.clone()
            };
            let (mut rh, mut rd) = (Rng::new(31), Rng::new(31));
            let a = model.generate(&prompts(), &host, &mut rh);
            let b = model.generate(&prompts(), &device, &mut rd);
            assert_eq!(rh, rd, "the same uniforms are drawn");
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.tokens, y.tokens, "T = {temperature}");
                assert_eq!(x.stopped, y.stopped);
                assert!(max_abs_diff(&x.logprobs, &y.logprobs) <= 1e-4);
            }
        }
    }

    fn prompts() -> Vec<Vec<u32>> {
        vec![
            vec![1, 40, 41, 42, 43, 44],
            vec![1, 50],
            vec![1, 60, 61, 62],
            vec![1],
        ]
    }

    #[test]
    fn greedy_generation_is_the_argmax_of_forward() {
        let model = model(&tiny(), 21);
        let p = params(0.0, 1.0, 8, vec![]);
        let a = model.generate(&prompts(), &p, &mut Rng::new(1));
        let b = model.generate(&prompts(), &p, &mut Rng::new(2));
        assert_eq!(a, b);
        for (prompt, g) in prompts().iter().zip(&a) {
            assert_eq!(g.tokens.len(), 8);
            assert!(!g.stopped);
            let mut context = prompt.clone();
            for (&tok, &lp) in g.tokens.iter().zip(&g.logprobs) {
                let logits = row_logits(&model, &context);
                let last = &logits[logits.len() - 1];
                assert_eq!(tok, argmax(last));
                let lse = last.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
                assert!((lp as f64 - (last[tok as usize] as f64 - lse)).abs() < 1e-4);
                context.push(tok);
            }
        }
    }

    #[test]
    fn sampling_is_reproducible_per_seed() {
        let model = model(&tiny(), 22);
        let p = params(1.0, 1.0, 12, vec![]);
        let a = model.generate(&prompts(), &p, &mut Rng::new(7));
        let b = model.generate(&prompts(), &p, &mut Rng::new(7));
        let c = model.generate(&prompts(), &p, &mut Rng::new(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The rng advanced by exactly one draw per sampled token.
        let mut rng = Rng::new(7);
        model.generate(&prompts(), &p, &mut rng);
        let mut expect = Rng::new(7);
        for _ in 0..a.iter().map(|g| g.tokens.len()).sum::<usize>() {
            expect.uniform();
        }
        assert_eq!(rng, expect);
    }

    #[test]
    fn sampled_logprobs_match_log_softmax_of_forward() {
        let model = model(&tiny(), 23);
        let p = params(0.8, 0.9, 10, vec![]);
        let gens = model.generate(&prompts(), &p, &mut Rng::new(3));
        for (prompt, g) in prompts().iter().zip(&gens) {
            let full: Vec<u32> = prompt.iter().chain(&g.tokens).copied().collect();
            let ids: Vec<i64> = full.iter().map(|&t| i64::from(t)).collect();
            let logp = log_softmax(CausalLm::forward(&model, int_tensor(&[ids])), 2);
            let (flat, [_, _, vocab]) = to_vec(logp);
            for (k, (&tok, &lp)) in g.tokens.iter().zip(&g.logprobs).enumerate() {
                assert!(lp <= 0.0);
                let at = prompt.len() - 1 + k;
                let want = flat[at * vocab + tok as usize];
                assert!((lp - want).abs() <= 1e-4, "{lp} vs {want}");
            }
        }
    }

    #[test]
    fn stop_tokens_end_rows_at_their_own_length() {
        let model = model(&tiny(), 24);
        // A third of the vocabulary stops a row: rows stop early, at different steps.
        let stop: Vec<u32> = (0..100).filter(|t| t % 3 == 0).collect();
        let p = params(1.0, 1.0, 20, stop.clone());
        let gens = model.generate(&prompts(), &p, &mut Rng::new(4));
        let mut lengths = Vec::new();
        for g in &gens {
            assert_eq!(g.tokens.len(), g.logprobs.len());
            assert!(!g.tokens.is_empty() && g.tokens.len() <= 20);
            let (last, body) = g.tokens.split_last().expect("non-empty");
            assert!(body.iter().all(|t| !stop.contains(t)));
            assert_eq!(g.stopped, stop.contains(last));
            if !g.stopped {
                assert_eq!(g.tokens.len(), 20);
            }
            lengths.push(g.tokens.len());
        }
        assert!(gens.iter().any(|g| g.stopped));
        lengths.sort_unstable();
        lengths.dedup();
        assert!(lengths.len() > 1, "all rows stopped at the same length");
    }

    #[test]
    fn budgets_respect_max_new_tokens_and_max_seq_len() {
        let config = TransformerConfig {
            max_seq_len: 10,
            ..tiny()
        };
        let model = model(&config, 25);
        let long: Vec<u32> = (0..15).map(|i| 5 + i).collect();
        let prompts = vec![vec![1, 5, 6], long.clone(), vec![1, 5, 6, 7, 8, 9, 10, 11]];
        let gens = model.generate(&prompts, &params(1.0, 1.0, 5, vec![]), &mut Rng::new(1));
        // 3 + 5 <= 10; the long prompt keeps its last 9 tokens -> 1 new; 8 + 2 = 10.
        let lens: Vec<usize> = gens.iter().map(|g| g.tokens.len()).collect();
        assert_eq!(lens, vec![5, 1, 2]);
        // The truncated prompt behaves as its last 9 tokens alone.
        let greedy = params(0.0, 1.0, 5, vec![]);
        let a = model.generate(std::slice::from_ref(&long), &greedy, &mut Rng::new(1));
        let b = model.generate(&[long[6..].to_vec()], &greedy, &mut Rng::new(1));
        assert_eq!(a, b);
        // No new tokens, no prompts, an empty prompt.
        assert!(
            model
                .generate(&prompts, &params(1.0, 1.0, 0, vec![]), &mut Rng::new(1))
                .iter()
                .all(|g| g.tokens.is_empty() && !g.stopped)
        );
        assert!(model.generate(&[], &greedy, &mut Rng::new(1)).is_empty());
        let mixed = model.generate(&[vec![], vec![1, 5]], &greedy, &mut Rng::new(1));
        assert!(mixed[0].tokens.is_empty());
        assert_eq!(mixed[1].tokens.len(), 5);
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let model = model(&tiny(), 26);
        let greedy = model.generate(&prompts(), &params(0.0, 1.0, 8, vec![]), &mut Rng::new(1));
        let nucleus = model.generate(&prompts(), &params(1.5, 1e-6, 8, vec![]), &mut Rng::new(9));
        assert_eq!(greedy, nucleus);
    }

    #[test]
    fn batched_generation_equals_one_row_at_a_time() {
        let model = model(&tiny(), 27);
        let p = params(0.0, 1.0, 6, vec![4]);
        let batched = model.generate(&prompts(), &p, &mut Rng::new(1));
        for (prompt, g) in prompts().iter().zip(&batched) {
            let alone = model.generate(std::slice::from_ref(prompt), &p, &mut Rng::new(1));
            assert_eq!(alone[0].tokens, g.tokens);
            assert!(max_abs_diff(&alone[0].logprobs, &g.logprobs) <= 1e-4);
        }
    }

    #[test]
    fn a_prefix_is_shared_from_sixteen_common_tokens() {
        let head: Vec<u32> = (0..20).collect();
        let with = |rest: &[u32]| -> Vec<u32> { head.iter().chain(rest).copied().collect() };
        let len = |rows: &[Vec<u32>]| shared_prefix_len(rows);
        // 20 common tokens, then the rows differ.
        assert_eq!(len(&[with(&[1]), with(&[2, 3])]), 20);
        // A row that is the prefix itself keeps its last token: 19.
        assert_eq!(len(&[head.clone(), with(&[2, 3])]), 19);
        // Identical rows: all but the last token.
        assert_eq!(len(&[with(&[9]), with(&[9])]), 20);
        // Rows that differ at token 15 share too little; one row, or none, shares nothing.
        let mut early = with(&[1]);
        early[15] = 99;
        assert_eq!(len(&[with(&[1]), early]), 0);
        assert_eq!(len(&[with(&[1])]), 0);
        assert_eq!(len(&[]), 0);
    }

    #[test]
    fn a_prefix_read_once_gives_every_row_its_own_generation() {
        // 20 shared tokens (the path that reads them once), then remainders of 1, 4 and 9
        // tokens and one prompt that is the prefix plus a single token.
        let prefix: Vec<u32> = (0..20).map(|i| 10 + (i * 7) % 80).collect();
        let prompts: Vec<Vec<u32>> = [vec![5], vec![6, 7, 8, 9], vec![3; 9], vec![11]]
            .into_iter()
            .map(|rest| prefix.iter().copied().chain(rest).collect())
            .collect();
        for config in [tiny(), tiny().with_qkv_bias(true)] {
            let model = model(&config, 31);
            let p = params(0.0, 1.0, 6, vec![4]);
            let mut contexts = model.contexts(prompts.len());
            let rows: Vec<usize> = (0..prompts.len()).collect();
            let first = model.extend(&mut contexts, &rows, &prompts, &p, &mut Rng::new(1));
            // A second turn on the kept contexts: the rows' positions and masks after the
            // shared read are right.
            let appended: Vec<Vec<u32>> = vec![vec![70, 71], vec![72], vec![73, 74, 75], vec![76]];
            let second = model.extend(&mut contexts, &rows, &appended, &p, &mut Rng::new(1));
            for r in rows {
                let alone = model.generate(std::slice::from_ref(&prompts[r]), &p, &mut Rng::new(1));
                assert_eq!(alone[0].tokens, first[r].tokens, "row {r}");
                assert!(max_abs_diff(&alone[0].logprobs, &first[r].logprobs) <= 1e-4);
                let whole: Vec<u32> = prompts[r]
                    .iter()
                    .chain(&first[r].tokens)
                    .chain(&appended[r])
                    .copied()
                    .collect();
                let alone = model.generate(std::slice::from_ref(&whole), &p, &mut Rng::new(1));
                assert_eq!(alone[0].tokens, second[r].tokens, "row {r}, second turn");
                assert!(max_abs_diff(&alone[0].logprobs, &second[r].logprobs) <= 1e-4);
            }
        }
    }

    #[test]
    fn turns_on_kept_contexts_equal_generation_from_the_whole_context() {
        for (config, temperature) in [(tiny(), 0.0), (tiny().with_qkv_bias(true), 1.0)] {
            let model = model(&config, 28);
            // Rows stop at different steps; row 2 leaves after the first turn.
            let p = params(temperature, 1.0, 6, vec![4, 9]);
            let appends: [Vec<Vec<u32>>; 3] = [
                prompts(),
                vec![vec![30, 31, 32], vec![33], vec![], vec![34, 35, 36, 37, 38]],
                vec![vec![40], vec![41, 42, 43, 44, 45, 46, 47], vec![], vec![48]],
            ];
            let turn_rows: [Vec<usize>; 3] = [vec![0, 1, 2, 3], vec![0, 1, 3], vec![3, 0, 1]];
            let mut contexts = model.contexts(4);
            let mut whole: Vec<Vec<u32>> = vec![Vec::new(); 4];
            let mut rng = Rng::new(5);
            for (turn, rows) in turn_rows.iter().enumerate() {
                let appended: Vec<Vec<u32>> =
                    rows.iter().map(|&r| appends[turn][r].clone()).collect();
                // The reference: each row alone, from its whole context, with the draws it
                // takes in the batched call (rows draw in call order, one per sampled token).
                let before = rng.clone();
                let gens = model.extend(&mut contexts, rows, &appended, &p, &mut rng);
                assert!(contexts.cached_len() > 0);
                let mut replay = before;
                let mut draws: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
                let longest = gens.iter().map(|g| g.tokens.len()).max().unwrap_or(0);
                for step in 0..longest {
                    for (k, g) in gens.iter().enumerate() {
                        if step < g.tokens.len() && temperature > 0.0 {
                            draws[k].push(replay.uniform());
                        }
                    }
                }
                assert_eq!(replay, rng, "one draw per sampled token");
                for (k, (&r, g)) in rows.iter().zip(&gens).enumerate() {
                    whole[r].extend(&appended[k]);
                    let alone = if temperature > 0.0 {
                        // Replays row k's own uniforms through a stream that yields them.
                        let mut fake = FixedUniforms(draws[k].clone());
                        fake.generate(&model, &whole[r], &p)
                    } else {
                        model
                            .generate(std::slice::from_ref(&whole[r]), &p, &mut Rng::new(0))
                            .remove(0)
                    };
                    assert_eq!(alone.tokens, g.tokens, "turn {turn} row {r}");
                    assert_eq!(alone.stopped, g.stopped);
                    assert!(max_abs_diff(&alone.logprobs, &g.logprobs) <= 1e-4);
                    whole[r].extend(&g.tokens);
                }
            }
            assert!(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    model.extend(&mut contexts, &[2], &[vec![5]], &p, &mut Rng::new(1))
                }))
                .is_err(),
                "a dropped row cannot come back"
            );
        }
    }

    /// Sampling one row with given uniforms: token by token through full forwards, by the
    /// same inverse-CDF rule as the sampler.
    struct FixedUniforms(Vec<f64>);
    impl FixedUniforms {
        fn generate(
            &mut self,
            model: &Transformer<B>,
            context: &[u32],
            p: &SampleParams,
        ) -> Generation {
            let mut ctx = context.to_vec();
            let mut g = Generation {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                stopped: false,
            };
            for u in self.0.drain(..) {
                let logits = row_logits(model, &ctx);
                let last = &logits[logits.len() - 1];
                let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let probs: Vec<f64> = last
                    .iter()
                    .map(|&l| ((l as f64 - max) / p.temperature).exp())
                    .collect();
                let total: f64 = probs.iter().sum();
                let (mut acc, mut id) = (0.0, probs.len() - 1);
                for (i, q) in probs.iter().enumerate() {
                    acc += q;
                    if acc > u * total {
                        id = i;
                        break;
                    }
                }
                let lse = last
                    .iter()
                    .map(|&l| (l as f64 - max).exp())
                    .sum::<f64>()
                    .ln()
                    + max;
                g.tokens.push(id as u32);
                g.logprobs.push((last[id] as f64 - lse) as f32);
                ctx.push(id as u32);
                if p.stop_tokens.contains(&(id as u32)) {
                    g.stopped = true;
                }
            }
            g
        }
    }

    #[test]
    fn sliced_tied_head_is_bit_identical() {
        // d_model 600 > 2 x the 256-long blocks of the CPU product, so the partial last block
        // along d_model is exercised; slices of 7 and 64 rows, with a short last slice.
        let config = TransformerConfig::new(1000, 600, 1, 4, 2, 16, 8).with_tie_embeddings(true);
        let model = model(&config, 30);
        let mut rng = Rng::new(31);
        for (batch, seq) in [(1, 1), (3, 1), (2, 7)] {
            let values: Vec<f32> = (0..batch * seq * 600)
                .map(|_| (3.0 * rng.normal()) as f32)
                .collect();
            let hidden = Tensor::<B, 3>::from_data(
                TensorData::new(values, [batch, seq, 600]),
                &Default::default(),
            );
            let want = to_vec(model.logits(hidden.clone())).0;
            for rows in [7, 64, 1000] {
                let got = to_vec(model.sliced_logits(hidden.clone(), rows)).0;
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "batch {batch}, seq {seq}, {rows} rows per slice");
            }
            assert_eq!(to_vec(model.decode_logits(hidden)).0, want);
        }
    }
}
