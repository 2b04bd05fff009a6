//! The `#[cube]` bodies of the fused decode step ([`crate::decode`]); launch planning is in
//! `cube/decode.rs`. Numerics: f32 inside whatever `F` is; each kernel rounds to `F` once per
//! output, where the composition rounds after every operation (equal in f32).

use super::kernel::row_reduce;
use cubecl::prelude::*;

/// Start value of the running maxima (finite: WGSL rejects infinite literals).
const NEG_BIG: f32 = -3.0e38;

/// `sum = x + residual` (when `has_residual`) and `normed = sum / √(mean(sum²) + ε) ⊙ γ`, one
/// cube of `units` units per row of `d` elements (`units` a power of two).
#[cube(launch, address_type = "dynamic")]
pub fn add_rms_norm<F: Float>(
    x: &Tensor<F>,
    residual: &Tensor<F>,
    gamma: &Tensor<F>,
    sum: &mut Tensor<F>,
    normed: &mut Tensor<F>,
    rows: usize,
    d: usize,
    epsilon: f32,
    #[comptime] units: u32,
    #[comptime] has_residual: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(units as usize));
    let row = CUBE_POS;
    // A cube past the last row exits whole (no barrier is split).
    if row < rows {
        let unit = UNIT_POS_X as usize;
        let stride = comptime!(units as usize);
        let base = row * d;
        let mut squares = f32::new(0.0);
        let mut i = unit;
        while i < d {
            let mut v = x[base + i];
            if comptime!(has_residual) {
                v += residual[base + i];
                sum[base + i] = v;
            }
            let f = f32::cast_from(v);
            squares += f * f;
            i += stride;
        }
        let total = row_reduce(squares, &mut smem, units, 0u32, false);
        let rms = F::cast_from((total / f32::cast_from(d) + epsilon).sqrt());
        let mut j = unit;
        while j < d {
            // Each unit reads back only what it wrote itself.
            let v = if comptime!(has_residual) {
                sum[base + j]
            } else {
                x[base + j]
            };
            normed[base + j] = (v / rms) * gamma[j];
            j += stride;
        }
    }
}

/// The projections' biases (`has_bias`: q, k, v), rotary positions on the new queries (then
/// scaled) and keys, and the keys and values written into the KV buffers at positions
/// `at..at + seq`. One unit per rotated pair of a
/// query or key head, or per value element:
/// `[0, nq)` query pairs, `[nq, nq + nk)` key pairs, `[nq + nk, nq + nk + nv)` values.
///
/// `q`: `[batch·seq, heads·head_dim]`; `k`, `v`: `[batch·seq, kv_heads·head_dim]` (rows
/// contiguous); `cos`, `sin`: `[angle_rows·seq, half]` (`angle_rows` 1 or batch);
/// `q_out`: `[batch, kv_heads, group·seq, head_dim]`; buffers `[batch, kv_heads, capacity,
/// head_dim]`, any strides.
#[cube(launch, address_type = "dynamic")]
pub fn rotary_cache_write<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    q_bias: &Tensor<F>,
    k_bias: &Tensor<F>,
    v_bias: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    q_out: &mut Tensor<F>,
    k_buffer: &mut Tensor<F>,
    v_buffer: &mut Tensor<F>,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    shared_angles: u32,
    at: usize,
    scale: f32,
    #[comptime] has_bias: [bool; 3],
    #[define(F)] _dtype: StorageType,
) {
    let half = head_dim / 2;
    let group = heads / kv_heads;
    let tokens = q.len() / (heads * head_dim);
    let nq = tokens * heads * half;
    let nk = tokens * kv_heads * half;
    let nv = tokens * kv_heads * head_dim;
    let pos = ABSOLUTE_POS;
    if pos < nq + nk {
        let is_q = pos < nq;
        let local = if is_q { pos } else { pos - nq };
        let n_heads = if is_q { heads } else { kv_heads };
        let j = local % half;
        let h = (local / half) % n_heads;
        let token = local / (half * n_heads);
        let b = token / seq;
        let s = token % seq;
        let angle_row = if shared_angles == 1 { s } else { token };
        let c = f32::cast_from(cos[angle_row * half + j]);
        let sn = f32::cast_from(sin[angle_row * half + j]);
        let src = token * n_heads * head_dim + h * head_dim + j;
        let col = h * head_dim + j;
        if is_q {
            let mut x1 = f32::cast_from(q[src]);
            let mut x2 = f32::cast_from(q[src + half]);
            if comptime!(has_bias[0]) {
                x1 += f32::cast_from(q_bias[col]);
                x2 += f32::cast_from(q_bias[col + half]);
            }
            let g = h / group;
            let r = (h % group) * seq + s;
            let out = ((b * kv_heads + g) * group * seq + r) * head_dim + j;
            q_out[out] = F::cast_from((x1 * c - x2 * sn) * scale);
            q_out[out + half] = F::cast_from((x2 * c + x1 * sn) * scale);
        } else {
            let mut x1 = f32::cast_from(k[src]);
            let mut x2 = f32::cast_from(k[src + half]);
            if comptime!(has_bias[1]) {
                x1 += f32::cast_from(k_bias[col]);
                x2 += f32::cast_from(k_bias[col + half]);
            }
            let out =
                b * k_buffer.stride(0) + h * k_buffer.stride(1) + (at + s) * k_buffer.stride(2);
            k_buffer[out + j * k_buffer.stride(3)] = F::cast_from(x1 * c - x2 * sn);
            k_buffer[out + (j + half) * k_buffer.stride(3)] = F::cast_from(x2 * c + x1 * sn);
        }
    } else if pos < nq + nk + nv {
        let local = pos - nq - nk;
        let e = local % head_dim;
        let h = (local / head_dim) % kv_heads;
        let token = local / (head_dim * kv_heads);
        let b = token / seq;
        let s = token % seq;
        let out = b * v_buffer.stride(0)
            + h * v_buffer.stride(1)
            + (at + s) * v_buffer.stride(2)
            + e * v_buffer.stride(3);
        let mut x = v[local];
        if comptime!(has_bias[2]) {
            x += v_bias[h * head_dim + e];
        }
        v_buffer[out] = x;
    }
}

/// Rotary positions in one pass (the composition is two narrowed halves, four products, a
/// sum, a difference and a concatenation — the concatenation a slice-assign per half on the
/// Cube backends): `x` `[batch, heads, seq, head_dim]` and the angles `[1 or batch, 1, seq,
/// head_dim / 2]` read through their strides (the training path's heads are a transposed
/// view), `out` contiguous; one unit per pair `(i, i + head_dim / 2)`.
#[cube(launch, address_type = "dynamic")]
pub fn rotary<F: Float>(
    x: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    out: &mut Tensor<F>,
    heads: usize,
    seq: usize,
    half: usize,
    #[define(F)] _dtype: StorageType,
) {
    let pairs = out.len() / 2;
    let pos = ABSOLUTE_POS;
    if pos < pairs {
        let j = pos % half;
        let s = (pos / half) % seq;
        let h = (pos / (half * seq)) % heads;
        let b = pos / (half * seq * heads);
        let row = b * x.stride(0) + h * x.stride(1) + s * x.stride(2);
        let x1 = f32::cast_from(x[row + j * x.stride(3)]);
        let x2 = f32::cast_from(x[row + (j + half) * x.stride(3)]);
        // One angle row shared by the batch, or one per row.
        let angle_row = b % cos.shape(0);
        let c =
            f32::cast_from(cos[angle_row * cos.stride(0) + s * cos.stride(2) + j * cos.stride(3)]);
        let sn =
            f32::cast_from(sin[angle_row * sin.stride(0) + s * sin.stride(2) + j * sin.stride(3)]);
        let o = ((b * heads + h) * seq + s) * (2 * half) + j;
        out[o] = F::cast_from(x1 * c - x2 * sn);
        out[o + half] = F::cast_from(x2 * c + x1 * sn);
    }
}

/// Attention of each query row over the first `keys` positions of the KV buffers, read where
/// they lie: one cube per `(batch, kv_head, row)`, `units ≥ head_dim` units (a power of two).
/// The keys go by in chunks of `units`, one score per unit, with an online softmax
/// (`acc ← acc·e^{m−m'} + Σ p·v`); unit `u < head_dim` owns output element `u`.
///
/// Split over the keys (`split`, flash-decoding: a long cache and few rows): `splits` cubes
/// per row, split `s` taking keys `[s·split_keys, (s + 1)·split_keys)`, each writing its
/// unnormalised `acc` and its `(m, l)` to `partial` (`[rows·splits, head_dim + 2]`, f32) for
/// [`combine_splits`] instead of `out`. Unsplit, the cube is the whole row (`splits` 1).
///
/// `q`, `out`: `[batch, kv_heads, rows, head_dim]` contiguous, `q` scaled; buffers `[batch,
/// kv_heads, capacity, head_dim]`, any strides; `bias`: `[bias_rows·seq, keys]` f32
/// (`bias_rows` 1 or batch), read when `has_bias`.
#[cube(launch, address_type = "dynamic")]
pub fn cached_attention<F: Float>(
    q: &Tensor<F>,
    k_buffer: &Tensor<F>,
    v_buffer: &Tensor<F>,
    bias: &Tensor<f32>,
    out: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    kv_heads: usize,
    rows: usize,
    seq: usize,
    head_dim: usize,
    keys: usize,
    shared_bias: u32,
    splits: usize,
    split_keys: usize,
    #[comptime] units: u32,
    #[comptime] has_bias: bool,
    #[comptime] split: bool,
    #[define(F)] _dtype: StorageType,
) {
    let stride = comptime!(units as usize);
    let mut q_row = SharedMemory::<f32>::new(comptime!(units as usize));
    let mut p = SharedMemory::<f32>::new(comptime!(units as usize));
    let total = q.len() / head_dim;
    // The query row this cube serves and its share of the keys.
    let cube = CUBE_POS % total;
    let part = CUBE_POS / total;
    let first = part * split_keys;
    let mut end = first + split_keys;
    if end > keys {
        end = keys;
    }
    if part < splits {
        let unit = UNIT_POS_X as usize;
        let r = cube % rows;
        let g = (cube / rows) % kv_heads;
        let b = cube / (rows * kv_heads);
        let s = r % seq;
        let bias_row = if shared_bias == 1 { s } else { b * seq + s };
        let kb = b * k_buffer.stride(0) + g * k_buffer.stride(1);
        let vb = b * v_buffer.stride(0) + g * v_buffer.stride(1);
        if unit < head_dim {
            q_row[unit] = f32::cast_from(q[cube * head_dim + unit]);
        }
        sync_cube();

        let mut m = f32::new(NEG_BIG);
        let mut l = f32::new(0.0);
        let mut acc = f32::new(0.0);
        let mut start = first;
        while start < end {
            // This unit's key of the chunk: its score, or nothing past the end.
            let t = start + unit;
            let mut score = f32::new(NEG_BIG);
            if t < end {
                let mut dot = f32::new(0.0);
                let row = kb + t * k_buffer.stride(2);
                for e in 0..head_dim {
                    dot += q_row[e] * f32::cast_from(k_buffer[row + e * k_buffer.stride(3)]);
                }
                score = dot;
                if comptime!(has_bias) {
                    score += bias[bias_row * keys + t];
                }
            }
            p[unit] = score;
            sync_cube();
            let mut n = end - start;
            if n > stride {
                n = stride;
            }
            let mut chunk_max = f32::new(NEG_BIG);
            for i in 0..n {
                chunk_max = f32::max(chunk_max, p[i]);
            }
            let m_new = f32::max(m, chunk_max);
            let rescale = (m - m_new).exp();
            sync_cube();
            p[unit] = (score - m_new).exp();
            sync_cube();
            let mut chunk_sum = f32::new(0.0);
            let mut chunk_acc = f32::new(0.0);
            for i in 0..n {
                let w = p[i];
                chunk_sum += w;
                if unit < head_dim {
                    let row = vb + (start + i) * v_buffer.stride(2);
                    chunk_acc += w * f32::cast_from(v_buffer[row + unit * v_buffer.stride(3)]);
                }
            }
            l = l * rescale + chunk_sum;
            acc = acc * rescale + chunk_acc;
            m = m_new;
            // Everyone has read the chunk before the next one overwrites it.
            sync_cube();
            start += stride;
        }
        if comptime!(split) {
            let at = (cube * splits + part) * (head_dim + 2);
            if unit < head_dim {
                partial[at + unit] = acc;
            }
            if unit == 0 {
                partial[at + head_dim] = m;
                partial[at + head_dim + 1] = l;
            }
        } else if unit < head_dim {
            out[cube * head_dim + unit] = F::cast_from(acc / l);
        }
    }
}

/// The splits of [`cached_attention`] merged: for each query row (one cube, unit `u <
/// head_dim` owning output element `u`), `out = Σ_s acc_s·e^{m_s−M} / Σ_s l_s·e^{m_s−M}` with
/// `M = max_s m_s`, the online softmax's merge. `partial`: `[rows·splits, head_dim + 2]` f32;
/// `out`: `[rows, head_dim]` contiguous.
#[cube(launch, address_type = "dynamic")]
pub fn combine_splits<F: Float>(
    partial: &Tensor<f32>,
    out: &mut Tensor<F>,
    rows: usize,
    splits: usize,
    head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS;
    let unit = UNIT_POS_X as usize;
    if row < rows && unit < head_dim {
        let base = row * splits * (head_dim + 2);
        let mut top = f32::new(NEG_BIG);
        for s in 0..splits {
            top = f32::max(top, partial[base + s * (head_dim + 2) + head_dim]);
        }
        let mut num = f32::new(0.0);
        let mut den = f32::new(0.0);
        for s in 0..splits {
            let at = base + s * (head_dim + 2);
            let w = (partial[at + head_dim] - top).exp();
            num += partial[at + unit] * w;
            den += partial[at + head_dim + 1] * w;
        }
        out[row * head_dim + unit] = F::cast_from(num / den);
    }
}

/// One token per row drawn from `[rows, vocab]` f32 logits, and its log-probability: one cube
/// of `units` units per row, each unit owning a contiguous run of `chunk` ids (so that the
/// running sum over the vocabulary is a sum over units, then over one unit's run, never a
/// scan of the whole row). Greedy (`greedy`): the first id of the largest logit. Otherwise
/// the first id whose running sum of `exp((x − max) / temperature)` exceeds `u[row]` times
/// the total (the host sampler's rule, in f32). `out[row] = (id, x[id] − logsumexp(x))`.
#[cube(launch, address_type = "dynamic")]
pub fn sample_rows(
    logits: &Tensor<f32>,
    uniforms: &Tensor<f32>,
    out: &mut Tensor<f32>,
    rows: usize,
    vocab: usize,
    chunk: usize,
    inv_temperature: f32,
    #[comptime] units: u32,
    #[comptime] greedy: bool,
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(units as usize));
    let mut sidx = SharedMemory::<u32>::new(comptime!(units as usize));
    let row = CUBE_POS;
    if row < rows {
        let unit = UNIT_POS_X as usize;
        let n_units = comptime!(units as usize);
        let base = row * vocab;
        let start = unit * chunk;
        let mut end = start + chunk;
        if end > vocab {
            end = vocab;
        }
        // 1. The row's largest logit (first id on ties), through the units' own.
        let mut m = f32::new(NEG_BIG);
        let mut arg = u32::new(0);
        let mut i = start;
        while i < end {
            let x = logits[base + i];
            if x > m {
                m = x;
                arg = i as u32;
            }
            i += 1;
        }
        smem[unit] = m;
        sidx[unit] = arg;
        sync_cube();
        let mut row_max = smem[0];
        let mut row_arg = sidx[0];
        for k in 1..n_units {
            if smem[k] > row_max {
                row_max = smem[k];
                row_arg = sidx[k];
            }
        }
        sync_cube();
        // 2. Σ e^{x − M} (the log-softmax's) and this unit's tempered mass.
        let mut s = f32::new(0.0);
        let mut mass = f32::new(0.0);
        let mut j = start;
        while j < end {
            let x = logits[base + j] - row_max;
            s += x.exp();
            mass += (x * inv_temperature).exp();
            j += 1;
        }
        smem[unit] = s;
        sync_cube();
        let mut total_s = f32::new(0.0);
        for k in 0..n_units {
            total_s += smem[k];
        }
        sync_cube();
        let lse = row_max + total_s.ln();
        let mut id = row_arg;
        if comptime!(!greedy) {
            // 3. The unit whose run holds the target walks it.
            smem[unit] = mass;
            sync_cube();
            let mut total = f32::new(0.0);
            let mut before = f32::new(0.0);
            for k in 0..n_units {
                let v = smem[k];
                if k < unit {
                    before += v;
                }
                total += v;
            }
            let target = uniforms[row] * total;
            // The last unit also takes a target that rounding put past the total.
            let last = unit == n_units - 1;
            if before <= target && (target < before + mass || last) {
                let mut acc = before;
                let mut found = vocab;
                let mut t = start;
                while t < end {
                    acc += ((logits[base + t] - row_max) * inv_temperature).exp();
                    if acc > target && found == vocab {
                        found = t;
                    }
                    t += 1;
                }
                if found == vocab {
                    found = vocab - 1;
                }
                sidx[0] = found as u32;
            }
            sync_cube();
            id = sidx[0];
        }
        if unit == 0 {
            out[row * 2] = f32::cast_from(id);
            out[row * 2 + 1] = logits[base + id as usize] - lse;
        }
    }
}
