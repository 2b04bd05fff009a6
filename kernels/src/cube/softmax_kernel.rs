//! The `#[cube]` bodies of the attention's softmax and its backward, one cube per row of
//! keys ([`crate::AttentionOps::attention_softmax`], [`crate::AttentionOps::softmax_backward`]);
//! launch planning is in `cube/softmax.rs`. f32 inside whatever `F` is, one rounding to `F`
//! per output.

use super::kernel::row_reduce;
use cubecl::prelude::*;

/// Start value of the running maxima (finite: WGSL rejects infinite literals).
const NEG_BIG: f32 = -3.0e38;

/// `out = softmax(scores + bias)` over each row of `keys`: one cube of `units` units per row
/// (`units` a power of two), three passes over the row — its maximum, the sum of
/// exponentials, the probabilities written — each unit over a strided share, the first two
/// merged by `row_reduce`'s shared-memory tree. `scores`, `out`: `[rows, keys]` contiguous, rows ordered
/// `(batch, heads, seq)`; `bias`: `[bias_rows, seq, keys]` contiguous (`bias_rows` 1 or
/// batch; read when `has_bias`).
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub fn attention_softmax<F: Float>(
    scores: &Tensor<F>,
    bias: &Tensor<F>,
    out: &mut Tensor<F>,
    rows: usize,
    keys: usize,
    heads: usize,
    seq: usize,
    bias_rows: usize,
    #[comptime] units: u32,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(units as usize));
    let row = CUBE_POS;
    // A cube past the last row exits whole (no barrier is split).
    if row < rows {
        let unit = UNIT_POS_X as usize;
        let stride = comptime!(units as usize);
        let base = row * keys;
        let s = row % seq;
        let b = row / (seq * heads);
        let bias_base = ((b % bias_rows) * seq + s) * keys;
        let mut m = f32::new(NEG_BIG);
        let mut i = unit;
        while i < keys {
            let mut x = f32::cast_from(scores[base + i]);
            if comptime!(has_bias) {
                x += f32::cast_from(bias[bias_base + i]);
            }
            m = f32::max(m, x);
            i += stride;
        }
        let m_row = row_reduce(m, &mut smem, units, 0u32, true);
        let mut l = f32::new(0.0);
        let mut j = unit;
        while j < keys {
            let mut x = f32::cast_from(scores[base + j]);
            if comptime!(has_bias) {
                x += f32::cast_from(bias[bias_base + j]);
            }
            l += (x - m_row).exp();
            j += stride;
        }
        let l_row = row_reduce(l, &mut smem, units, 0u32, false);
        let mut k = unit;
        while k < keys {
            let mut x = f32::cast_from(scores[base + k]);
            if comptime!(has_bias) {
                x += f32::cast_from(bias[bias_base + k]);
            }
            out[base + k] = F::cast_from((x - m_row).exp() / l_row);
            k += stride;
        }
    }
}

/// `out = probs ⊙ (dprobs − Σ probs ⊙ dprobs)` over each row of `keys`: one cube of `units`
/// units per row; the row's sum by `row_reduce`'s shared-memory tree. All `[rows, keys]` contiguous.
#[cube(launch, address_type = "dynamic")]
pub fn softmax_backward<F: Float>(
    probs: &Tensor<F>,
    dprobs: &Tensor<F>,
    out: &mut Tensor<F>,
    rows: usize,
    keys: usize,
    #[comptime] units: u32,
    #[define(F)] _dtype: StorageType,
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(units as usize));
    let row = CUBE_POS;
    if row < rows {
        let unit = UNIT_POS_X as usize;
        let stride = comptime!(units as usize);
        let base = row * keys;
        let mut dot = f32::new(0.0);
        let mut i = unit;
        while i < keys {
            dot += f32::cast_from(probs[base + i]) * f32::cast_from(dprobs[base + i]);
            i += stride;
        }
        let centre = row_reduce(dot, &mut smem, units, 0u32, false);
        let mut j = unit;
        while j < keys {
            let p = f32::cast_from(probs[base + j]);
            out[base + j] = F::cast_from(p * (f32::cast_from(dprobs[base + j]) - centre));
            j += stride;
        }
    }
}
