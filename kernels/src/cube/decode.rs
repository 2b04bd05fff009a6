//! Launch planning of the fused decode step ([`crate::decode`]) on `CubeBackend<R, ..>`; the
//! `#[cube]` bodies are in `decode_kernel.rs`.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::decode_kernel as kernel;
use super::{address_type, in_dtype, prev_power_of_two};
use crate::decode::Heads;

/// Units of a cube for a row of `n` elements: the next power of two, within the device's
/// limit and 256.
pub(super) fn units_for<R: CubeRuntime>(client: &ComputeClient<R>, n: usize) -> usize {
    let hw = &client.properties().hardware;
    let max = prev_power_of_two(
        256usize
            .min(hw.max_units_per_cube as usize)
            .min(hw.max_cube_dim.0 as usize)
            .max(1),
    );
    n.next_power_of_two().clamp(1, max)
}

/// The largest head dimension the cached attention serves: one unit per output element.
pub(super) fn attention_serves<R: CubeRuntime>(client: &ComputeClient<R>, head_dim: usize) -> bool {
    units_for(client, head_dim) >= head_dim
}

/// One element of `dtype`, for an argument a kernel variant does not read or write.
pub(super) fn placeholder<R: CubeRuntime>(like: &CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new([1]),
        dtype,
    )
}

pub(super) fn add_rms_norm<R: CubeRuntime>(
    x: CubeTensor<R>,
    residual: Option<CubeTensor<R>>,
    gamma: CubeTensor<R>,
    epsilon: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = into_contiguous(x);
    let shape = x.meta.shape().clone();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d.max(1);
    let client = x.client.clone();
    let empty = || empty_device_dtype(client.clone(), x.device.clone(), shape.clone(), x.dtype);
    let normed = empty();
    let (residual, sum) = match residual {
        Some(r) => {
            let r = into_contiguous(r);
            let r = in_dtype(r, x.dtype);
            (Some(r), empty())
        }
        None => (None, x.clone()),
    };
    if rows == 0 || d == 0 {
        return (sum, normed);
    }
    let gamma = into_contiguous(gamma);
    let has_residual = residual.is_some();
    let residual = residual.unwrap_or_else(|| placeholder(&x, x.dtype));
    let sum_arg = match has_residual {
        true => sum.clone(),
        false => placeholder(&x, x.dtype),
    };
    let units = units_for(&client, d);
    let cube_dim = CubeDim::new_1d(units as u32);
    let cube_count = cubecl::calculate_cube_count_elemwise(&client, rows * units, cube_dim);
    let addr = address_type(&[&x, &residual, &sum_arg, &normed]);
    let dtype = x.dtype.into();
    kernel::add_rms_norm::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        x.into_tensor_arg(),
        residual.into_tensor_arg(),
        gamma.into_tensor_arg(),
        sum_arg.into_tensor_arg(),
        normed.clone().into_tensor_arg(),
        rows,
        d,
        epsilon as f32,
        units as u32,
        has_residual,
        dtype,
    );
    (sum, normed)
}

/// A buffer this launch may write: itself where no other tensor shares its storage, a copy
/// otherwise.
fn writable<R: CubeRuntime>(buffer: CubeTensor<R>) -> CubeTensor<R> {
    match buffer.can_mut() && buffer.is_nonoverlapping() {
        true => buffer,
        false => buffer.copy(),
    }
}

pub(super) fn rotary_cache_write<R: CubeRuntime>(
    [q, k, v]: [CubeTensor<R>; 3],
    bias: [Option<CubeTensor<R>>; 3],
    [cos, sin]: [CubeTensor<R>; 2],
    [k_buffer, v_buffer]: [CubeTensor<R>; 2],
    at: usize,
    heads: Heads,
) -> [CubeTensor<R>; 3] {
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = heads;
    let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
    let dtype = q.dtype;
    let same = |t: CubeTensor<R>| in_dtype(into_contiguous(t), dtype);
    let (cos, sin) = (same(cos), same(sin));
    let has_bias = bias.each_ref().map(Option::is_some);
    let [bq, bk, bv] = bias.map(|b| match b {
        Some(b) => same(b),
        None => placeholder(&q, dtype),
    });
    let q_shape = q.meta.shape().clone();
    let (batch, seq) = (q_shape[0], q_shape[1]);
    let group = heads / kv_heads;
    let client = q.client.clone();
    let q_out = empty_device_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([batch, kv_heads, group * seq, head_dim]),
        dtype,
    );
    let (k_buffer, v_buffer) = (writable(k_buffer), writable(v_buffer));
    let tokens = batch * seq;
    let half = head_dim / 2;
    let work = tokens * (heads * half + kv_heads * half + kv_heads * head_dim);
    if work == 0 {
        return [q_out, k_buffer, v_buffer];
    }
    let shared_angles = u32::from(cos.meta.shape()[0] == 1);
    let cube_dim = CubeDim::new(&client, work);
    let cube_count = cubecl::calculate_cube_count_elemwise(&client, work, cube_dim);
    let addr = address_type(&[&q, &k, &v, &q_out, &k_buffer, &v_buffer]);
    kernel::rotary_cache_write::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        bq.into_tensor_arg(),
        bk.into_tensor_arg(),
        bv.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        q_out.clone().into_tensor_arg(),
        k_buffer.clone().into_tensor_arg(),
        v_buffer.clone().into_tensor_arg(),
        seq,
        heads,
        kv_heads,
        head_dim,
        shared_angles,
        at,
        (head_dim as f64).powf(-0.5) as f32,
        has_bias,
        dtype.into(),
    );
    [q_out, k_buffer, v_buffer]
}

/// Rotary positions in one launch ([`kernel::rotary`]); `x` may be a strided view.
pub(super) fn rotary<R: CubeRuntime>(
    x: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
) -> CubeTensor<R> {
    let dtype = x.dtype;
    let (cos, sin) = (in_dtype(cos, dtype), in_dtype(sin, dtype));
    let shape = x.meta.shape().clone();
    let (heads, seq, head_dim) = (shape[1], shape[2], shape[3]);
    let client = x.client.clone();
    let out = empty_device_dtype(client.clone(), x.device.clone(), shape.clone(), dtype);
    let pairs = shape.num_elements() / 2;
    if pairs == 0 {
        return out;
    }
    let cube_dim = CubeDim::new(&client, pairs);
    let cube_count = cubecl::calculate_cube_count_elemwise(&client, pairs, cube_dim);
    let addr = address_type(&[&x, &cos, &sin, &out]);
    kernel::rotary::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        x.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        heads,
        seq,
        head_dim / 2,
        dtype.into(),
    );
    out
}

/// How many parts the cached attention splits each row's keys into (flash-decoding): enough
/// cubes to give every multiprocessor of the device two (its count from the device, else its
/// CPU cores, else no split), each part at least two chunks of `units` keys, at most 64 parts.
/// A long cache at batch 1 has few rows and many keys: one cube per row would leave most of a
/// GPU idle while each walks the whole cache.
pub(crate) fn key_splits(
    processors: Option<u32>,
    cubes: usize,
    keys: usize,
    units: usize,
) -> usize {
    let target = 2 * processors.unwrap_or(0) as usize;
    if cubes == 0 || cubes >= target {
        return 1;
    }
    target
        .div_ceil(cubes)
        .min(keys / (2 * units).max(1))
        .clamp(1, 64)
}

/// `None` where the head dimension is wider than a cube (the caller composes). The keys are
/// split over `splits` cubes per row, or as many as [`key_splits`] says (`None`).
pub(crate) fn cached_attention<R: CubeRuntime>(
    q: CubeTensor<R>,
    k_buffer: CubeTensor<R>,
    v_buffer: CubeTensor<R>,
    keys: usize,
    bias: Option<CubeTensor<R>>,
    group: usize,
    splits: Option<usize>,
) -> Option<CubeTensor<R>> {
    let q = into_contiguous(q);
    let shape = q.meta.shape().clone();
    let (kv_heads, rows, head_dim) = (shape[1], shape[2], shape[3]);
    let client = q.client.clone();
    if !attention_serves(&client, head_dim) || keys == 0 {
        return None;
    }
    let seq = rows / group.max(1);
    let dtype = q.dtype;
    let same = |t: CubeTensor<R>| in_dtype(t, dtype);
    let (k_buffer, v_buffer) = (same(k_buffer), same(v_buffer));
    let out = empty_device_dtype(client.clone(), q.device.clone(), shape.clone(), dtype);
    let cubes = shape.num_elements() / head_dim.max(1);
    if cubes == 0 {
        return Some(out);
    }
    let has_bias = bias.is_some();
    let (bias, shared_bias) = match bias {
        Some(b) => {
            let b = in_dtype(into_contiguous(b), DType::F32);
            if b.meta.shape()[3] != keys {
                return None;
            }
            let shared = u32::from(b.meta.shape()[0] == 1);
            (b, shared)
        }
        None => (placeholder(&q, DType::F32), 1),
    };
    let units = units_for(&client, head_dim);
    let hw = &client.properties().hardware;
    let processors = hw.num_streaming_multiprocessors.or(hw.num_cpu_cores);
    let splits = splits
        .unwrap_or_else(|| key_splits(processors, cubes, keys, units))
        .clamp(1, keys);
    // Every part the same whole number of chunks, the last one shorter.
    let split_keys = keys.div_ceil(splits).div_ceil(units) * units;
    let split = splits > 1;
    let partial = if split {
        empty_device_dtype(
            client.clone(),
            q.device.clone(),
            Shape::new([cubes * splits, head_dim + 2]),
            DType::F32,
        )
    } else {
        placeholder(&q, DType::F32)
    };
    let cube_dim = CubeDim::new_1d(units as u32);
    let cube_count =
        cubecl::calculate_cube_count_elemwise(&client, cubes * splits * units, cube_dim);
    let addr = address_type(&[&q, &k_buffer, &v_buffer, &bias, &out, &partial]);
    kernel::cached_attention::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        q.into_tensor_arg(),
        k_buffer.into_tensor_arg(),
        v_buffer.into_tensor_arg(),
        bias.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        kv_heads,
        rows,
        seq,
        head_dim,
        keys,
        shared_bias,
        if split { splits } else { 1 },
        if split { split_keys } else { keys },
        units as u32,
        has_bias,
        split,
        dtype.into(),
    );
    if split {
        let cube_count = cubecl::calculate_cube_count_elemwise(&client, cubes * units, cube_dim);
        let addr = address_type(&[&partial, &out]);
        kernel::combine_splits::launch::<R>(
            &client,
            cube_count,
            cube_dim,
            addr,
            partial.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            cubes,
            splits,
            head_dim,
            dtype.into(),
        );
    }
    Some(out)
}

/// `[rows, 2]` f32: each row's drawn id and its log-probability ([`crate::decode`]).
pub(super) fn sample_rows<R: CubeRuntime>(
    logits: CubeTensor<R>,
    uniforms: Option<CubeTensor<R>>,
    temperature: f64,
) -> CubeTensor<R> {
    let f32_of = |t: CubeTensor<R>| in_dtype(into_contiguous(t), DType::F32);
    let logits = f32_of(logits);
    let shape = logits.meta.shape().clone();
    let (rows, vocab) = (shape[0], shape[1]);
    let client = logits.client.clone();
    let out = empty_device_dtype(
        client.clone(),
        logits.device.clone(),
        Shape::new([rows, 2]),
        DType::F32,
    );
    if rows == 0 || vocab == 0 {
        return out;
    }
    let greedy = uniforms.is_none() || temperature <= 0.0;
    let uniforms = match uniforms {
        Some(u) if !greedy => f32_of(u),
        _ => placeholder(&logits, DType::F32),
    };
    let units = units_for(&client, vocab);
    let chunk = vocab.div_ceil(units);
    let cube_dim = CubeDim::new_1d(units as u32);
    let cube_count = cubecl::calculate_cube_count_elemwise(&client, rows * units, cube_dim);
    let addr = address_type(&[&logits, &uniforms, &out]);
    let inv_temperature = if greedy {
        1.0
    } else {
        (1.0 / temperature) as f32
    };
    kernel::sample_rows::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        addr,
        logits.into_tensor_arg(),
        uniforms.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows,
        vocab,
        chunk,
        inv_temperature,
        units as u32,
        greedy,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::key_splits;

    #[test]
    fn key_splits_fill_the_device_with_parts_of_two_chunks_at_least() {
        // No device size known, or enough rows already: one part.
        assert_eq!(key_splits(None, 4, 4096, 64), 1);
        assert_eq!(key_splits(Some(132), 264, 4096, 64), 1);
        // An H100 (132 multiprocessors) at batch 1, 9 KV-head rows: 264 / 9 → 30 parts, and
        // 4096 keys allow 32 parts of two 64-key chunks: 30.
        assert_eq!(key_splits(Some(132), 9, 4096, 64), 30);
        // A short cache caps it: 300 keys hold two parts of 128 keys.
        assert_eq!(key_splits(Some(132), 9, 300, 64), 2);
        // Fewer keys than two chunks: no split; never more than 64 parts.
        assert_eq!(key_splits(Some(132), 1, 100, 64), 1);
        assert_eq!(key_splits(Some(1000), 1, 1 << 20, 64), 64);
    }
}
