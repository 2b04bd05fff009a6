//! Launch planning of the attention's softmax and its backward on `CubeBackend<R, ..>`
//! ([`crate::AttentionOps::attention_softmax`]); the `#[cube]` bodies are in
//! `softmax_kernel.rs`.

use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::decode::{placeholder, units_for};
use super::softmax_kernel as kernel;
use super::{address_type, in_dtype};

/// Units per row: up to a plane-sized 32 (each unit then walks `keys / 32` keys), so the
/// trees are shallow and a row's barriers are few.
fn row_units<R: CubeRuntime>(client: &ComputeClient<R>, keys: usize) -> usize {
    units_for(client, keys).min(32)
}

/// `softmax(scores + bias)` over the last axis in one launch: `scores` `[batch, heads, seq,
/// keys]`, `bias` `[batch or 1, 1, seq, keys]` (cast to the scores' dtype: a mask of 0 and a
/// large negative value, which the cast keeps).
pub(super) fn attention_softmax<R: CubeRuntime>(
    scores: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
) -> CubeTensor<R> {
    let scores = into_contiguous(scores);
    let dtype = scores.dtype;
    let shape = scores.meta.shape().clone();
    let (batch, heads, seq, keys) = (shape[0], shape[1], shape[2], shape[3]);
    let client = scores.client.clone();
    let out = empty_device_dtype(client.clone(), scores.device.clone(), shape, dtype);
    let rows = batch * heads * seq;
    if rows == 0 || keys == 0 {
        return out;
    }
    let has_bias = bias.is_some();
    let (bias, bias_rows) = match bias {
        Some(b) => {
            let b = in_dtype(into_contiguous(b), dtype);
            let bias_rows = b.meta.shape()[0];
            (b, bias_rows)
        }
        None => (placeholder(&scores, dtype), 1),
    };
    let units = row_units(&client, keys);
    let cube_dim = CubeDim::new_1d(units as u32);
    let cube_count = cubecl::calculate_cube_count_elemwise(&client, rows * units, cube_dim);
    let addr = address_type(&[&scores, &bias, &out]);
    kernel::attention_softmax::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        scores.into_tensor_arg(),
        bias.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows,
        keys,
        heads,
        seq,
        bias_rows,
        units as u32,
        has_bias,
        dtype.into(),
    );
    out
}

/// `probs ⊙ (dprobs − rowsum(probs ⊙ dprobs))` over the last axis in one launch, in `probs`'
/// dtype.
pub(super) fn softmax_backward<R: CubeRuntime>(
    probs: CubeTensor<R>,
    dprobs: CubeTensor<R>,
) -> CubeTensor<R> {
    let probs = into_contiguous(probs);
    let dtype = probs.dtype;
    let dprobs = in_dtype(into_contiguous(dprobs), dtype);
    let shape = probs.meta.shape().clone();
    let keys = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / keys.max(1);
    let client = probs.client.clone();
    let out = empty_device_dtype(client.clone(), probs.device.clone(), shape, dtype);
    if rows == 0 || keys == 0 {
        return out;
    }
    let units = row_units(&client, keys);
    let cube_dim = CubeDim::new_1d(units as u32);
    let cube_count = cubecl::calculate_cube_count_elemwise(&client, rows * units, cube_dim);
    let addr = address_type(&[&probs, &dprobs, &out]);
    kernel::softmax_backward::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        probs.into_tensor_arg(),
        dprobs.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows,
        keys,
        units as u32,
        dtype.into(),
    );
    out
}
