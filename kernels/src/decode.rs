//! The fused decode step: what a decoder block does around its matrix products, in as few
//! passes as a backend can.
//!
//! Composed from tensor ops, one decoded token costs a Cube backend ≈ 45 kernel launches per
//! layer (reports/perf/NOTES.md §11): the RMSNorm's square, mean, root, division and scale;
//! rotary positions as narrowed halves, four products and a concatenation; the KV cache's two
//! slice-assigns; the attention's scores, mask, softmax and product. The GPU path of one
//! decoded token is bound by those launches, not by arithmetic. Three ops of
//! [`AttentionOps`] do the same work in one pass each on the Cube backends:
//!
//! - [`AttentionOps::add_rms_norm`]: the residual add and the next RMSNorm (the block's
//!   stream and the normalised input of its next sublayer);
//! - [`AttentionOps::rotary_cache_write`]: the projections' biases, rotary positions on the
//!   queries (then scaled by `1/√head_dim`) and keys, and the keys and values written into
//!   the cache's buffers;
//! - [`AttentionOps::cached_attention`]: single-query attention over the cache where it lies;
//! - [`AttentionOps::sample_rows`]: the token drawn from the logits (once per token, not per
//!   layer), without a running sum over the whole vocabulary.
//!
//! With the seven projections that leaves 12 launches per layer: norm, q, k, v, rotary and
//! write, attention, o, add and norm, gate, up, the gated product (Burn's fusion), down.
//! Every backend gets the reference twins below by default (the CPU backends and `Autodiff`,
//! whose training forward is the composition, bit for bit).

use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::ops::FloatTensor;

use crate::attention::AttentionOps;
use crate::ops::{float, into_prim};
use crate::rotary::rotary;

/// The head layout of a grouped-query attention: `heads` query heads, `kv_heads` K/V heads
/// (dividing `heads`), each of `head_dim` (even) elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// K/V heads; each serves `heads / kv_heads` consecutive query heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// The reference twin of [`AttentionOps::add_rms_norm`]: `sum = x + residual` (`x` when there
/// is none) and Burn's `RmsNorm` of it, `sum / √(mean(sum²) + ε) ⊙ γ`, the mean in f32.
///
/// # Shapes
/// - `x`, `residual`: `[batch, seq, d]`; `gamma`: `[d]`
/// - outputs: `[batch, seq, d]` each
pub fn reference_add_rms_norm<B: Backend>(
    x: Tensor<B, 3>,
    residual: Option<Tensor<B, 3>>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let sum = match residual {
        Some(r) => x + r,
        None => x,
    };
    let dtype = sum.dtype();
    let rms = (sum.clone().cast(DType::F32).square().mean_dim(2) + epsilon).sqrt();
    let normed = (sum.clone() / rms.cast(dtype)) * gamma.unsqueeze();
    (sum, normed)
}

/// The reference twin of [`AttentionOps::rotary_cache_write`]: the projections' biases added
/// (where given), the heads split out, [`rotary`] on queries and keys, the queries scaled by `1/√head_dim` and their
/// `group` heads per K/V head folded into rows, keys and values written by
/// [`AttentionOps::write_positions`].
///
/// # Shapes
/// - `q`: `[batch, seq, heads · head_dim]`; `k`, `v`: `[batch, seq, kv_heads · head_dim]`
/// - `bias`: each `[its projection's width]`
/// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
/// - `k_buffer`, `v_buffer`: `[batch, kv_heads, capacity, head_dim]`, `at + seq ≤ capacity`
/// - outputs: queries `[batch, kv_heads, group · seq, head_dim]`, then the two buffers
#[allow(clippy::too_many_arguments)]
pub fn reference_rotary_cache_write<B: AttentionOps>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    bias: [Option<Tensor<B, 1>>; 3],
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    k_buffer: Tensor<B, 4>,
    v_buffer: Tensor<B, 4>,
    at: usize,
    heads: Heads,
) -> [Tensor<B, 4>; 3] {
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = heads;
    let [batch, seq, _] = q.dims();
    let group = heads / kv_heads;
    let [bq, bk, bv] = bias;
    let add = |x: Tensor<B, 3>, b: Option<Tensor<B, 1>>| match b {
        Some(b) => x + b.unsqueeze(),
        None => x,
    };
    let (q, k, v) = (add(q, bq), add(k, bk), add(v, bv));
    // [batch, seq, n, head_dim] -> [batch, n, seq, head_dim]
    let split = |x: Tensor<B, 3>, n: usize| x.reshape([batch, seq, n, head_dim]).swap_dims(1, 2);
    let q = rotary(split(q, heads), &cos, &sin)
        .mul_scalar((head_dim as f64).powf(-0.5))
        .reshape([batch, kv_heads, group * seq, head_dim]);
    let k = rotary(split(k, kv_heads), &cos, &sin);
    let v = split(v, kv_heads);
    let write = |buffer: Tensor<B, 4>, src: Tensor<B, 4>| {
        float(B::write_positions(into_prim(buffer), into_prim(src), at))
    };
    [q, write(k_buffer, k), write(v_buffer, v)]
}

/// Tensor-level wrapper: [`AttentionOps::add_rms_norm`] on `B`.
///
/// # Shapes
/// As [`reference_add_rms_norm`].
pub fn add_rms_norm<B: AttentionOps>(
    x: Tensor<B, 3>,
    residual: Option<Tensor<B, 3>>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let (sum, normed) = B::add_rms_norm(
        into_prim(x),
        residual.map(into_prim),
        into_prim(gamma),
        epsilon,
    );
    (float(sum), float(normed))
}

/// Tensor-level wrapper: [`AttentionOps::rotary_cache_write`] on `B`.
///
/// # Shapes
/// As [`reference_rotary_cache_write`].
#[allow(clippy::too_many_arguments)]
pub fn rotary_cache_write<B: AttentionOps>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    bias: [Option<Tensor<B, 1>>; 3],
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
    k_buffer: Tensor<B, 4>,
    v_buffer: Tensor<B, 4>,
    at: usize,
    heads: Heads,
) -> [Tensor<B, 4>; 3] {
    B::rotary_cache_write(
        [into_prim(q), into_prim(k), into_prim(v)],
        bias.map(|b| b.map(into_prim)),
        [into_prim(cos.clone()), into_prim(sin.clone())],
        [into_prim(k_buffer), into_prim(v_buffer)],
        at,
        heads,
    )
    .map(float)
}

/// The defaults of the trait's methods: the reference twins on primitives.
pub(crate) fn default_add_rms_norm<B: AttentionOps>(
    x: FloatTensor<B>,
    residual: Option<FloatTensor<B>>,
    gamma: FloatTensor<B>,
    epsilon: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (sum, normed) =
        reference_add_rms_norm::<B>(float(x), residual.map(float), float(gamma), epsilon);
    (into_prim(sum), into_prim(normed))
}

/// See [`default_add_rms_norm`].
pub(crate) fn default_rotary_cache_write<B: AttentionOps>(
    [q, k, v]: [FloatTensor<B>; 3],
    bias: [Option<FloatTensor<B>>; 3],
    [cos, sin]: [FloatTensor<B>; 2],
    [k_buffer, v_buffer]: [FloatTensor<B>; 2],
    at: usize,
    heads: Heads,
) -> [FloatTensor<B>; 3] {
    reference_rotary_cache_write::<B>(
        float(q),
        float(k),
        float(v),
        bias.map(|b| b.map(float)),
        float(cos),
        float(sin),
        float(k_buffer),
        float(v_buffer),
        at,
        heads,
    )
    .map(into_prim)
}
