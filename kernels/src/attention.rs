//! Attention whose backward pass recomputes the probabilities instead of keeping them.
//!
//! Composed from ordinary tensor ops, autodiff keeps every `[heads, seq, keys]` intermediate
//! of every layer's softmax until the backward pass reaches it: at 1000 tokens and 30 layers,
//! about 2 GB a row. [`AttentionOps::grouped_attention`] on `Autodiff<B>` keeps only its
//! inputs (which the projections' own backward keeps anyway) and recomputes one layer's
//! probabilities when the backward pass reaches that layer, so the attention's memory is one
//! layer's, not all of them. The forward values are those of the composition
//! ([`reference_grouped_attention`], the reference twin); the gradients agree with autodiff's
//! to rounding (tested in `tests.rs`).

use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::softmax;
use burn::tensor::ops::FloatTensor;

use crate::ops::{float, into_prim};

/// Grouped-query attention as a backend extension: `softmax(q kᵀ + bias) v`, one K/V head
/// serving `group` consecutive query heads. `q` comes scaled (`1/√head_dim` applied by the
/// caller); the bias is a constant (a mask) and gets no gradient. The scores and their
/// softmax are computed in f32 whatever the inputs' dtype.
///
/// Every method has a default body built from ordinary tensor ops, so a backend implements the
/// trait with an empty `impl`; `Autodiff<B>` overrides [`grouped_attention`](Self::grouped_attention)
/// with a backward node that calls [`grouped_attention_backward`](Self::grouped_attention_backward).
///
/// # Shapes
/// - `q`: `[batch, kv_heads, group * seq, head_dim]` (a K/V head's `group` query heads folded
///   into its rows, head-major)
/// - `k`, `v`: `[batch, kv_heads, keys, head_dim]`
/// - `bias`: `[batch or 1, 1, seq, keys]` (f32), broadcast over the heads
/// - output: `[batch, kv_heads, group * seq, head_dim]`
pub trait AttentionOps: Backend {
    /// The attention's output (see the trait's docs for the shapes).
    fn grouped_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        group: usize,
    ) -> FloatTensor<Self> {
        let probs = probabilities_with::<Self>(float(q), float(k), bias.map(float), group);
        into_prim(probs.matmul(float(v)))
    }

    /// `(dq, dk, dv)` for the output gradient `grad`, the probabilities `P` recomputed:
    /// `dv = Pᵀ g`, `dP = g vᵀ`, `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dq = dS k`, `dk = dSᵀ q`.
    fn grouped_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        group: usize,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let (q, k, v) = (
            float::<Self, 4>(q),
            float::<Self, 4>(k),
            float::<Self, 4>(v),
        );
        let grad = float::<Self, 4>(grad);
        let dtype = v.dtype();
        let probs = probabilities_with::<Self>(q.clone(), k.clone(), bias.map(float), group);
        // [batch, kv_heads, keys, group * seq] x [batch, kv_heads, group * seq, head_dim]
        let dv = probs.clone().swap_dims(2, 3).matmul(grad.clone());
        // [batch, kv_heads, group * seq, keys]
        let dprobs = grad.matmul(v.swap_dims(2, 3));
        let dscores = float::<Self, 4>(Self::softmax_backward(into_prim(probs), into_prim(dprobs)));
        debug_assert_eq!(dscores.dtype(), dtype);
        let dq = dscores.clone().matmul(k);
        let dk = dscores.swap_dims(2, 3).matmul(q);
        [into_prim(dq), into_prim(dk), into_prim(dv)]
    }

    /// `softmax(scores + bias)` over the last axis, in f32 whatever the scores' dtype, returned
    /// in it: the attention's probabilities. The Cube backends do it in one pass per row
    /// (`cube/softmax_kernel.rs`); the default is the composition (a cast, the bias's add, a
    /// max, a difference, an exponential, a sum and a division, each a pass over
    /// `[heads, seq, keys]`).
    ///
    /// # Shapes
    /// - `scores`: `[batch, heads, seq, keys]`
    /// - `bias`: `[batch or 1, 1, seq, keys]` (f32)
    /// - output: `[batch, heads, seq, keys]`
    fn attention_softmax(
        scores: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        into_prim(reference_attention_softmax::<Self>(
            float(scores),
            bias.map(float),
        ))
    }

    /// The softmax's backward: `P ⊙ (dP − rowsum(P ⊙ dP))` over the last axis, in f32,
    /// returned in `P`'s dtype. One pass per row on the Cube backends; the composition by
    /// default.
    ///
    /// # Shapes
    /// - `probs`, `dprobs`: `[batch, heads, rows, keys]`
    /// - output: `[batch, heads, rows, keys]`
    fn softmax_backward(probs: FloatTensor<Self>, dprobs: FloatTensor<Self>) -> FloatTensor<Self> {
        into_prim(reference_softmax_backward::<Self>(
            float(probs),
            float(dprobs),
        ))
    }

    /// [`grouped_attention`](Self::grouped_attention) over the first `keys` positions of a
    /// KV cache's buffers, read where they lie, for inference (no backward); `None` where the
    /// backend has no such path (the default; `Autodiff`), and the caller narrows the buffers
    /// and calls `grouped_attention`. The CPU backends override it with
    /// [`crate::cached_attention::cached_attention_host`], the Cube backends with one kernel
    /// ([`crate::decode`]).
    ///
    /// # Shapes
    /// - `q`: `[batch, kv_heads, group * seq, head_dim]`, scaled
    /// - `k_buffer`, `v_buffer`: `[batch, kv_heads, capacity, head_dim]`, `keys <= capacity`
    /// - `bias`: `[batch or 1, 1, seq, keys]` (f32)
    /// - output: `[batch, kv_heads, group * seq, head_dim]`
    fn cached_attention(
        _q: FloatTensor<Self>,
        _k_buffer: FloatTensor<Self>,
        _v_buffer: FloatTensor<Self>,
        _keys: usize,
        _bias: Option<FloatTensor<Self>>,
        _group: usize,
    ) -> Option<FloatTensor<Self>> {
        None
    }

    /// `buffer` with `src` written at positions `at..at + seq` of its third axis: the KV
    /// cache's write of new keys or values after the filled positions. By default a
    /// `slice_assign`; a backend whose `slice_assign` copies the whole destination overrides it
    /// with a write in place (Flex).
    ///
    /// # Shapes
    /// - `buffer`: `[batch, kv_heads, capacity, head_dim]`
    /// - `src`: `[batch, kv_heads, seq, head_dim]`, `at + seq <= capacity`
    /// - output: `[batch, kv_heads, capacity, head_dim]`
    fn write_positions(
        buffer: FloatTensor<Self>,
        src: FloatTensor<Self>,
        at: usize,
    ) -> FloatTensor<Self> {
        reference_write_positions::<Self>(buffer, src, at)
    }
    /// Rotary positions ([`mod@crate::rotary`]): `[x1, x2] ↦ [x1·cos − x2·sin, x2·cos + x1·sin]`
    /// over the halves of the head dimension. By default the composition
    /// ([`crate::rotary::reference_rotary`]); a backend may do it in one pass (Flex), and
    /// `Autodiff<B>` adds the backward (the rotation by `−sin`).
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`
    /// - `cos`, `sin`: `[batch or 1, 1, seq, head_dim / 2]`
    /// - output: `[batch, heads, seq, head_dim]`
    fn rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        into_prim(crate::rotary::reference_rotary::<Self>(
            float(x),
            float(cos),
            float(sin),
        ))
    }
    /// Whether [`cached_attention`](Self::cached_attention) serves every decode step's
    /// attention (one new position per row), not only the packed-weight path of `rlany
    /// generate`: true on the Cube backends, whose decode step is launch-bound; false on the
    /// CPU backends, where a run's numbers stay the composition's.
    const DECODE_KERNELS: bool = false;

    /// The residual add and the RMSNorm after it ([`crate::decode`]): `(sum, normed)` with
    /// `sum = x + residual` (`x` when there is none) and `normed = sum / √(mean(sum²) + ε) ⊙
    /// γ`. By default the composition ([`crate::decode::reference_add_rms_norm`], Burn's
    /// `RmsNorm` op for op); one pass on the Cube backends (no backward there: `Autodiff<B>`
    /// keeps the default).
    ///
    /// # Shapes
    /// - `x`, `residual`: `[batch, seq, d]`; `gamma`: `[d]`
    /// - outputs: `[batch, seq, d]` each
    fn add_rms_norm(
        x: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        crate::decode::default_add_rms_norm::<Self>(x, residual, gamma, epsilon)
    }

    /// The projections' biases (where given), rotary positions on new queries (then scaled by
    /// `1/√head_dim`, their heads folded into rows per K/V head) and keys, and the keys and
    /// values written into the KV cache's buffers at positions `at..` ([`crate::decode`]). By default the composition
    /// ([`crate::decode::reference_rotary_cache_write`]); one pass on the Cube backends,
    /// writing the buffers in place where they are not shared (inference only).
    ///
    /// # Shapes
    /// - `[q, k, v]`: `[batch, seq, heads · head_dim]`, `[batch, seq, kv_heads · head_dim]` ×2
    /// - `bias`: each `[its projection's width]`
    /// - `[cos, sin]`: `[batch or 1, 1, seq, head_dim / 2]`
    /// - `[k_buffer, v_buffer]`: `[batch, kv_heads, capacity, head_dim]`, `at + seq ≤ capacity`
    /// - outputs: queries `[batch, kv_heads, group · seq, head_dim]`, then the two buffers
    fn rotary_cache_write(
        qkv: [FloatTensor<Self>; 3],
        bias: [Option<FloatTensor<Self>>; 3],
        angles: [FloatTensor<Self>; 2],
        buffers: [FloatTensor<Self>; 2],
        at: usize,
        heads: crate::decode::Heads,
    ) -> [FloatTensor<Self>; 3] {
        crate::decode::default_rotary_cache_write::<Self>(qkv, bias, angles, buffers, at, heads)
    }

    /// One token per row drawn from `[rows, vocab]` logits, and its log-probability, on the
    /// device without a running sum over the whole vocabulary ([`crate::decode`]): greedy
    /// (no `uniforms`, or `temperature` 0) the first id of the largest logit; otherwise the
    /// first id whose running sum of `exp((x − max) / temperature)` exceeds `uniforms[row]`
    /// times the total. Returns `[rows, 2]` f32 (id, `log_softmax(x)[id]` untempered), or
    /// `None` where the backend has no such kernel (the default: the caller composes it).
    ///
    /// # Shapes
    /// - `logits`: `[rows, vocab]`; `uniforms`: `[rows]` in `[0, 1)`
    /// - output: `[rows, 2]`
    fn sample_rows(
        _logits: FloatTensor<Self>,
        _uniforms: Option<FloatTensor<Self>>,
        _temperature: f64,
    ) -> Option<FloatTensor<Self>> {
        None
    }

    /// `x · wᵀ` with `w` in quantized blocks ([`crate::packed`]), or `None` where this
    /// backend has no such product (the caller then multiplies by the dense weights, the
    /// reference twin). CPU backends compute it on the host (`packed_matmul_host`);
    /// the GPU backends and `Autodiff<B>` (no backward: the weights are frozen, and the
    /// input's gradient goes through the dense product) return `None`.
    ///
    /// # Shapes
    /// - `x`: `[m, w.cols()]`, `m ≤ PACKED_MAX_ROWS`
    /// - output: `[m, w.rows()]`
    fn packed_matmul(_x: FloatTensor<Self>, _w: &crate::PackedMatrix) -> Option<FloatTensor<Self>> {
        None
    }
}

/// [`AttentionOps::write_positions`] as a `slice_assign`: the default, and the fallback of an
/// override that writes in place only where it can.
pub(crate) fn reference_write_positions<B: Backend>(
    buffer: FloatTensor<B>,
    src: FloatTensor<B>,
    at: usize,
) -> FloatTensor<B> {
    let (buffer, src) = (float::<B, 4>(buffer), float::<B, 4>(src));
    let [batch, kv_heads, seq, head_dim] = src.dims();
    let range = [0..batch, 0..kv_heads, at..at + seq, 0..head_dim];
    into_prim(buffer.slice_assign(range, src))
}

/// The reference twin: the composition of ordinary (differentiable) tensor ops.
///
/// # Shapes
/// As [`AttentionOps`].
pub fn reference_grouped_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    group: usize,
) -> Tensor<B, 4> {
    probabilities(q, k, bias, group).matmul(v)
}

/// `softmax(q kᵀ + bias)` in f32, returned in `q`'s dtype: the composition (the reference
/// twin's).
///
/// # Shapes
/// - `q`: `[batch, kv_heads, group * seq, head_dim]`; `k`: `[batch, kv_heads, keys, head_dim]`
/// - `bias`: `[batch or 1, 1, seq, keys]`
/// - output: `[batch, kv_heads, group * seq, keys]`
fn probabilities<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    group: usize,
) -> Tensor<B, 4> {
    scores_then(q, k, group, |scores| {
        reference_attention_softmax(scores, bias)
    })
}

/// [`probabilities`] with the backend's [`AttentionOps::attention_softmax`].
fn probabilities_with<B: AttentionOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    group: usize,
) -> Tensor<B, 4> {
    scores_then(q, k, group, |scores| {
        float(B::attention_softmax(into_prim(scores), bias.map(into_prim)))
    })
}

/// `q kᵀ` as `[batch, heads, seq, keys]`, `softmax` applied, back in `q`'s row layout.
fn scores_then<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    group: usize,
    softmax: impl FnOnce(Tensor<B, 4>) -> Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [batch, kv_heads, rows, _] = q.dims();
    let keys = k.dims()[2];
    let seq = rows / group.max(1);
    // [batch, kv_heads, group * seq, keys] -> [batch, heads, seq, keys]
    let scores = q
        .matmul(k.swap_dims(2, 3))
        .reshape([batch, kv_heads * group, seq, keys]);
    // [batch, heads, seq, keys] -> [batch, kv_heads, group * seq, keys]
    softmax(scores).reshape([batch, kv_heads, rows, keys])
}

/// The reference twin of [`AttentionOps::attention_softmax`]: cast to f32, add the bias,
/// softmax over the last axis, cast back.
///
/// # Shapes
/// As [`AttentionOps::attention_softmax`].
pub fn reference_attention_softmax<B: Backend>(
    scores: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
) -> Tensor<B, 4> {
    let dtype = scores.dtype();
    let mut scores = scores.cast(DType::F32);
    if let Some(bias) = bias {
        scores = scores + bias;
    }
    softmax(scores, 3).cast(dtype)
}

/// The reference twin of [`AttentionOps::softmax_backward`]: `P ⊙ (dP − rowsum(P ⊙ dP))` in
/// f32, cast to `P`'s dtype.
///
/// # Shapes
/// As [`AttentionOps::softmax_backward`].
pub fn reference_softmax_backward<B: Backend>(
    probs: Tensor<B, 4>,
    dprobs: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let dtype = probs.dtype();
    let (probs, dprobs) = (probs.cast(DType::F32), dprobs.cast(DType::F32));
    // [batch, heads, rows, 1]
    let centre = (probs.clone() * dprobs.clone()).sum_dim(3);
    (probs * (dprobs - centre)).cast(dtype)
}

/// Tensor-level wrapper: [`AttentionOps::grouped_attention`] on `B` (the backward-recomputing
/// node on an autodiff backend).
///
/// # Shapes
/// As [`AttentionOps`].
pub fn grouped_attention<B: AttentionOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    group: usize,
) -> Tensor<B, 4> {
    float(B::grouped_attention(
        into_prim(q),
        into_prim(k),
        into_prim(v),
        bias.map(into_prim),
        group,
    ))
}
