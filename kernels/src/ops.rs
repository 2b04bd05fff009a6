//! The backend extension trait: fused token log-probs and full-vocabulary KL, with backward.

use burn::backend::NdArray;
use burn::backend::ndarray::{FloatNdArrayElement, IntNdArrayElement, QuantElement};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::attention::AttentionOps;
use crate::reference;

/// Per-row statistics that the KL forward saves for its backward. Every tensor is `[n]`.
///
/// The Cube kernels keep them in `f32` whatever the logits' dtype (so bf16/f16 logits lose no
/// precision in the backward); the default composition keeps them in the logits' dtype.
pub struct KlStats<B: Backend> {
    /// `logsumexp(p_logits)` per row.
    pub lse_p: FloatTensor<B>,
    /// `logsumexp(q_logits)` per row.
    pub lse_q: FloatTensor<B>,
    /// `KL(softmax(p) ‖ softmax(q))` per row.
    pub kl: FloatTensor<B>,
}

impl<B: Backend> Clone for KlStats<B> {
    fn clone(&self) -> Self {
        Self {
            lse_p: self.lse_p.clone(),
            lse_q: self.lse_q.clone(),
            kl: self.kl.clone(),
        }
    }
}

impl<B: Backend> core::fmt::Debug for KlStats<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KlStats")
            .field("lse_p", &self.lse_p)
            .field("lse_q", &self.lse_q)
            .field("kl", &self.kl)
            .finish()
    }
}

/// Fused log-prob and KL ops over `[n, vocab]` logits, as a backend extension.
///
/// Every method has a default body built from ordinary tensor ops (the reference composition),
/// so a backend without kernels implements the trait with an empty `impl`. The Cube backends
/// override the methods with one-pass CubeCL kernels; `Autodiff<B>` overrides `token_logprobs`
/// and `kl_full` with a custom backward node that calls `B::*_backward`.
///
/// Targets must lie in `[0, vocab)`; the Cube kernels do not check them.
pub trait LogProbOps: AttentionOps {
    /// The dtype this backend keeps the saved per-row statistics in (`lse`, [`KlStats`]) for
    /// logits of `logits_dtype`: the logits' own by default, f32 on the Cube backends.
    fn stat_dtype(logits_dtype: burn::tensor::DType) -> burn::tensor::DType {
        logits_dtype
    }

    /// The largest single tensor (bytes) this backend can bind on `device`, if it has a known
    /// limit (wgpu: the storage-binding size). Benchmarks size their inputs by it.
    fn max_tensor_bytes(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// Bytes the backend's memory pools hold on `device` now, if it reports them (the Cube
    /// backends). Pools grow to the peak and are kept, so after a workload this is its peak
    /// reservation. Benchmarks report it.
    fn device_memory_reserved(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// `log_softmax(logits)[n, targets[n]]`: `[n, vocab]`, `[n]` → `[n]`.
    fn token_logprobs(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        into_prim(reference::token_logprobs(
            float::<Self, 2>(logits),
            int(targets),
        ))
    }

    /// Forward that also returns `logsumexp(logits)` per row (`[n]`), saved for the backward.
    fn token_logprobs_with_lse(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let logits = float::<Self, 2>(logits);
        let [n, _] = logits.dims();
        let lse = logsumexp_rows(logits.clone());
        let picked = logits.gather(1, int(targets).reshape([n, 1])).reshape([n]);
        (into_prim(picked - lse.clone()), into_prim(lse))
    }

    /// Backward of [`token_logprobs`](Self::token_logprobs):
    /// `dlogits[n, j] = grad[n] · ([j = targets[n]] − softmax(logits)[n, j])`
    /// (the gradient of `+log p`; the familiar `softmax − onehot` is that of `−log p`).
    fn token_logprobs_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let logits = float::<Self, 2>(logits);
        let dtype = logits.dtype();
        let [n, v] = logits.dims();
        let lse = float::<Self, 1>(lse).cast(dtype).reshape([n, 1]);
        let grad = float::<Self, 1>(grad).cast(dtype).reshape([n, 1]);
        let soft = (logits - lse).exp();
        let onehot = onehot(int(targets), v, &soft);
        into_prim((onehot - soft) * grad)
    }

    /// Full-vocabulary `KL(softmax(p) ‖ softmax(q))` per row: `[n, vocab]` ×2 → `[n]`.
    fn kl_full(p_logits: FloatTensor<Self>, q_logits: FloatTensor<Self>) -> FloatTensor<Self> {
        into_prim(reference::kl_full(
            float::<Self, 2>(p_logits),
            float::<Self, 2>(q_logits),
        ))
    }

    /// Forward that also returns the per-row statistics saved for the backward.
    fn kl_full_with_stats(
        p_logits: FloatTensor<Self>,
        q_logits: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, KlStats<Self>) {
        let p = float::<Self, 2>(p_logits);
        let q = float::<Self, 2>(q_logits);
        let [n, _] = p.dims();
        let lse_p = logsumexp_rows(p.clone());
        let lse_q = logsumexp_rows(q.clone());
        let logp = p - lse_p.clone().reshape([n, 1]);
        let logq = q - lse_q.clone().reshape([n, 1]);
        let kl = (logp.clone().exp() * (logp - logq)).sum_dim(1).reshape([n]);
        let stats = KlStats {
            lse_p: into_prim(lse_p),
            lse_q: into_prim(lse_q),
            kl: into_prim(kl.clone()),
        };
        (into_prim(kl), stats)
    }

    /// Backward of [`kl_full`](Self::kl_full), for the inputs that need it:
    /// `dp = g · P ⊙ (log P − log Q − KL)`, `dq = g · (Q − P)` with `P = softmax(p)`,
    /// `Q = softmax(q)`.
    fn kl_full_backward(
        p_logits: FloatTensor<Self>,
        q_logits: FloatTensor<Self>,
        stats: KlStats<Self>,
        grad: FloatTensor<Self>,
        need_p: bool,
        need_q: bool,
    ) -> (Option<FloatTensor<Self>>, Option<FloatTensor<Self>>) {
        let p = float::<Self, 2>(p_logits);
        let q = float::<Self, 2>(q_logits);
        let dtype = p.dtype();
        let [n, _] = p.dims();
        let col = |t: FloatTensor<Self>| float::<Self, 1>(t).cast(dtype).reshape([n, 1]);
        let (lse_p, lse_q, kl, grad) =
            (col(stats.lse_p), col(stats.lse_q), col(stats.kl), col(grad));
        let logp = p - lse_p;
        let logq = q - lse_q;
        let prob_p = logp.clone().exp();
        let dq = need_q.then(|| into_prim((logq.clone().exp() - prob_p.clone()) * grad.clone()));
        let dp = need_p.then(|| into_prim(prob_p * (logp - logq - kl) * grad));
        (dp, dq)
    }
}

/// One bound for a training loop: an autodiff backend whose inner backend has the ops too
/// (`B: AutodiffLogProbOps` implies `B::InnerBackend: LogProbOps`). Blanket-implemented.
pub trait AutodiffLogProbOps:
    burn::tensor::backend::AutodiffBackend<InnerBackend: LogProbOps> + LogProbOps
{
}

impl<B> AutodiffLogProbOps for B
where
    B: burn::tensor::backend::AutodiffBackend + LogProbOps,
    B::InnerBackend: LogProbOps,
{
}

/// NdArray: the default (reference) composition.
impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> LogProbOps for NdArray<E, I, Q>
where
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
}

impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> AttentionOps
    for NdArray<E, I, Q>
where
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
    /// On the host ([`crate::packed`]), reading the input where it lies when its layout is
    /// row-major: `into_data` would copy it element by element through a dynamic-rank
    /// iterator whenever the tensor is shared, which the caller's clone always makes it —
    /// 17% of a SmolLM2 single-stream token on the 2-core Xeon (reports/perf/NOTES.md §9l).
    fn packed_matmul(x: FloatTensor<Self>, w: &crate::PackedMatrix) -> Option<FloatTensor<Self>> {
        use burn::backend::ndarray::NdArrayTensor;
        let NdArrayTensor::F32(storage) = &x else {
            return crate::packed::packed_matmul_via_host::<Self>(x, w);
        };
        let view = storage.view();
        let m = *view.shape().first()?;
        // Borrowed where the layout is row-major already (always, on the decode path).
        let x = view.as_standard_layout();
        let y = crate::packed::packed_matmul_host(x.as_slice()?, m, w);
        Some(NdArrayTensor::from_data(burn::tensor::TensorData::new(
            y,
            [m, w.rows()],
        )))
    }

    /// On the host, the buffers read where they lie ([`crate::cached_attention`]); `None`
    /// (the composition) for other dtypes or a buffer not in row-major layout.
    fn cached_attention(
        q: FloatTensor<Self>,
        k_buffer: FloatTensor<Self>,
        v_buffer: FloatTensor<Self>,
        keys: usize,
        bias: Option<FloatTensor<Self>>,
        group: usize,
    ) -> Option<FloatTensor<Self>> {
        use crate::cached_attention::{CacheLayout, cached_attention_host};
        use burn::backend::ndarray::NdArrayTensor;
        let (NdArrayTensor::F32(q), NdArrayTensor::F32(k), NdArrayTensor::F32(v)) =
            (&q, &k_buffer, &v_buffer)
        else {
            return None;
        };
        let (q, k, v) = (q.view(), k.view(), v.view());
        let (&[batch, kv_heads, rows, head_dim], &[_, _, capacity, _]) = (q.shape(), k.shape())
        else {
            return None;
        };
        let seq = rows / group.max(1);
        let (k, v) = (k.as_slice()?, v.as_slice()?);
        // Borrowed where the layout is row-major already, copied once otherwise.
        let q = q.as_standard_layout();
        let bias = match &bias {
            Some(NdArrayTensor::F32(b)) => Some(b.view()),
            Some(_) => return None,
            None => None,
        };
        let bias = bias
            .as_ref()
            .map(|b| (b.as_standard_layout(), b.shape()[0]));
        let bias = match &bias {
            Some((values, bias_batch)) => Some((values.as_slice()?, *bias_batch)),
            None => None,
        };
        let cache = CacheLayout {
            batch,
            kv_heads,
            capacity,
            head_dim,
            keys,
        };
        let y = cached_attention_host(q.as_slice()?, rows, k, v, cache, bias, seq);
        Some(NdArrayTensor::from_data(burn::tensor::TensorData::new(
            y,
            [batch, kv_heads, rows, head_dim],
        )))
    }
}

/// Flex (Burn's newer CPU backend, feature `flex`): the default composition too.
#[cfg(feature = "flex")]
impl LogProbOps for burn::backend::Flex {}

/// Flex's `slice_assign` (burn-flex 0.21, `ops/slice.rs`) copies the whole destination on
/// every call: it makes the destination contiguous by cloning its handle while the original
/// is still alive, so the copy-on-write that follows always finds the storage shared. For the
/// KV cache, which writes one position per decoded token into a buffer of every position,
/// that was 3% of a 32-row SmolLM2 decode on the main thread (reports/perf/NOTES.md §9i).
/// [`AttentionOps::write_positions`] here writes in place when the buffer is a contiguous f32
/// tensor that owns its storage alone and something is written, and falls back to the
/// composition otherwise.
#[cfg(feature = "flex")]
impl AttentionOps for burn::backend::Flex {
    fn write_positions(
        mut buffer: burn_flex::FlexTensor,
        src: burn_flex::FlexTensor,
        at: usize,
    ) -> burn_flex::FlexTensor {
        use burn::tensor::DType;
        let dims = buffer.layout().shape().to_vec();
        let src_dims = src.layout().shape().to_vec();
        let fits = dims.len() == 4
            && src_dims.len() == 4
            && src_dims[..2] == dims[..2]
            && src_dims[3] == dims[3]
            && at + src_dims[2] <= dims[2]
            && src_dims[2] * dims[3] > 0;
        let whole = buffer.layout().contiguous_offsets() == Some((0, dims.iter().product()));
        if !(fits && whole && buffer.is_unique())
            || buffer.dtype() != DType::F32
            || src.dtype() != DType::F32
        {
            return crate::attention::reference_write_positions::<Self>(buffer, src, at);
        }
        // Contiguous from offset 0 over its whole storage after this (Flex's own guarantee).
        let src = src.to_contiguous();
        let start = src
            .layout()
            .contiguous_offsets()
            .map_or(0, |(start, _)| start);
        let (capacity, head_dim) = (dims[2], dims[3]);
        let run = src_dims[2] * head_dim;
        let from = &src.storage::<f32>()[start..];
        let to = buffer.storage_mut::<f32>();
        for (i, chunk) in from.chunks_exact(run).take(dims[0] * dims[1]).enumerate() {
            let offset = (i * capacity + at) * head_dim;
            to[offset..offset + run].copy_from_slice(chunk);
        }
        buffer
    }
    /// On the host ([`crate::packed`]).
    fn packed_matmul(
        x: burn_flex::FlexTensor,
        w: &crate::PackedMatrix,
    ) -> Option<burn_flex::FlexTensor> {
        crate::packed::packed_matmul_via_host::<Self>(x, w)
    }
    /// One pass over contiguous f32 copies of the inputs ([`crate::rotary`]; the composition
    /// runs seven of Flex's strided passes); other dtypes and shapes take the composition.
    fn rotary(
        x: burn_flex::FlexTensor,
        cos: burn_flex::FlexTensor,
        sin: burn_flex::FlexTensor,
    ) -> burn_flex::FlexTensor {
        use burn::tensor::{DType, TensorData};
        let dims = x.layout().shape().to_vec();
        let angle_dims = cos.layout().shape().to_vec();
        let fits = dims.len() == 4
            && dims[3].is_multiple_of(2)
            && angle_dims.len() == 4
            && sin.layout().shape().to_vec() == angle_dims
            && (angle_dims[0] == 1 || angle_dims[0] == dims[0])
            && angle_dims[1] == 1
            && angle_dims[2] == dims[2]
            && angle_dims[3] == dims[3] / 2;
        let composed = |x, cos, sin| {
            into_prim(crate::rotary::reference_rotary::<Self>(
                float(x),
                float(cos),
                float(sin),
            ))
        };
        if !fits
            || [x.dtype(), cos.dtype(), sin.dtype()]
                .iter()
                .any(|d| *d != DType::F32)
        {
            return composed(x, cos, sin);
        }
        let (xc, cc, sc) = (x.to_contiguous(), cos.to_contiguous(), sin.to_contiguous());
        let (Some(xs), Some(cs), Some(ss)) = (
            xc.as_slice::<f32>(),
            cc.as_slice::<f32>(),
            sc.as_slice::<f32>(),
        ) else {
            return composed(x, cos, sin);
        };
        let shape = [dims[0], dims[1], dims[2], dims[3]];
        let out = crate::rotary::rotary_host(xs, cs, ss, shape, angle_dims[0]);
        burn_flex::FlexTensor::from_data(TensorData::new(out, shape))
    }
}

pub(crate) fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

pub(crate) fn int<B: Backend>(t: IntTensor<B>) -> Tensor<B, 1, Int> {
    Tensor::from_primitive(t)
}

pub(crate) fn into_prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// `logsumexp` over dim 1 of `[n, v]` → `[n]` (max-shifted).
fn logsumexp_rows<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 1> {
    let [n, _] = x.dims();
    let max = x.clone().max_dim(1).detach();
    ((x - max.clone()).exp().sum_dim(1).log() + max).reshape([n])
}

/// `[n]` int targets → `[n, v]` float one-hot, in `like`'s dtype (lazy: no host sync).
fn onehot<B: Backend>(targets: Tensor<B, 1, Int>, v: usize, like: &Tensor<B, 2>) -> Tensor<B, 2> {
    let [n] = targets.dims();
    let device = targets.device();
    let cols = Tensor::<B, 1, Int>::arange(0..v as i64, &device)
        .reshape([1, v])
        .expand([n, v]);
    let hits = cols.equal(targets.reshape([n, 1]).expand([n, v]));
    hits.float().cast(like.dtype())
}
