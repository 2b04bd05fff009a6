//! The `#[cube]` kernels (kept apart: cubecl's `Tensor` is not Burn's).
//!
//! Geometry shared by all four kernels: a cube is `CUBE_DIM_X × CUBE_DIM_Y` units; each of its
//! `CUBE_DIM_Y` rows of units owns one logits row, and the `units` (= `CUBE_DIM_X`, a power of
//! two, comptime) units of a row stride over that row's vectors (`Vector<F, N>`, N lanes, so
//! consecutive units read consecutive vectors: coalesced). `row = CUBE_POS · CUBE_DIM_Y +
//! UNIT_POS_Y`; units of rows past the end do no loads or stores but still join every barrier.
//!
//! Numerics: everything is accumulated in f32 whatever `F` is (f16/bf16 in, f32 inside).
//! The forward passes are one pass over the logits: an online max and rescaled sum-exp
//! (`s ← s·e^{m−m'} + Σ e^{x−m'}`, one rescale check per two loaded vectors, not per element),
//! then one cross-unit combine: `M = max m`, `S = Σ s·e^{m−M}`. The "minus infinity" start
//! value is a large finite number (WGSL has no infinite literals).
//!
//! The kernels are launched with cubecl's checked `launch` (bounds-checked accesses): the
//! workspace forbids `unsafe`, which `launch_unchecked` requires.

use cubecl::prelude::*;

/// Start value of the running maxima (finite: WGSL rejects infinite literals).
const NEG_BIG: f32 = -3.0e38;

/// Reduces `value` over the `units` units that share this unit's `UNIT_POS_Y` and returns the
/// result to all of them. Every unit of the cube must call it (it holds barriers); `smem` may
/// be reused on return. The row kernels of `decode_kernel.rs` and `softmax_kernel.rs` (one row
/// per cube, `UNIT_POS_Y` 0) call it with `plane_size` 0.
///
/// With `plane_size > 0` (plane ops supported, the plane size fixed and dividing `units`), each
/// plane reduces with a plane op and the planes of a row combine through shared memory;
/// otherwise it is a shared-memory tree.
#[cube]
pub(super) fn row_reduce(
    value: f32,
    smem: &mut SharedMemory<f32>,
    #[comptime] units: u32,
    #[comptime] plane_size: u32,
    #[comptime] is_max: bool,
) -> f32 {
    let x = UNIT_POS_X as usize;
    let base = (UNIT_POS_Y * units) as usize;
    let mut result = value;
    if comptime!(units == 1) {
        // Nothing to combine.
    } else if comptime!(plane_size > 0) {
        let planes = comptime!((units / plane_size) as usize);
        let reduced = if is_max {
            plane_max(value)
        } else {
            plane_sum(value)
        };
        if comptime!(planes == 1) {
            result = reduced;
        } else {
            let lane = x % comptime!(plane_size as usize);
            if lane == 0 {
                smem[base + x / comptime!(plane_size as usize)] = reduced;
            }
            sync_cube();
            let mut acc = smem[base];
            for i in 1..planes {
                let other = smem[base + i];
                if is_max {
                    acc = f32::max(acc, other);
                } else {
                    acc += other;
                }
            }
            // Everyone has read before the next reduction overwrites the slots.
            sync_cube();
            result = acc;
        }
    } else {
        smem[base + x] = value;
        sync_cube();
        let mut stride = comptime!(units / 2).runtime() as usize;
        while stride > 0 {
            if x < stride {
                let other = smem[base + x + stride];
                if is_max {
                    smem[base + x] = f32::max(smem[base + x], other);
                } else {
                    smem[base + x] += other;
                }
            }
            sync_cube();
            stride /= 2;
        }
        result = smem[base];
        sync_cube();
    }
    result
}

/// Largest lane of an f32 vector.
#[cube]
fn lanes_max<N: Size>(v: Vector<f32, N>) -> f32 {
    let mut m = v[0];
    #[unroll]
    for k in 1..N::value() {
        m = f32::max(m, v[k]);
    }
    m
}

/// Sum of the lanes of an f32 vector.
#[cube]
fn lanes_sum<N: Size>(v: Vector<f32, N>) -> f32 {
    let mut s = v[0];
    #[unroll]
    for k in 1..N::value() {
        s += v[k];
    }
    s
}

/// Lane `lane` of `v` as f32 (comptime-unrolled select: no dynamic vector indexing).
#[cube]
fn lane_of<F: Float, N: Size>(v: Vector<F, N>, lane: usize) -> f32 {
    let mut out = f32::cast_from(v[0]);
    #[unroll]
    for k in 1..N::value() {
        if lane == k {
            out = f32::cast_from(v[k]);
        }
    }
    out
}

/// Forward of token log-probs: `out[r] = x[r, t_r] − lse_r`, `lse[r] = logsumexp(x[r, :])`.
#[cube(launch, address_type = "dynamic")]
pub fn token_logprobs_fwd<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    rows: usize,
    vecs_per_row: usize,
    #[comptime] units: u32,
    #[comptime] plane_size: u32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(MAX_CUBE_UNITS as usize));
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let valid = row < rows;
    let x = UNIT_POS_X as usize;
    let stride = comptime!(units as usize);

    let mut m = f32::new(NEG_BIG);
    let mut s = f32::new(0.0);
    if valid {
        let base = row * vecs_per_row;
        let mut i = x;
        // Two independent loads per step (more bytes in flight per unit), one rescale check.
        while i + stride < vecs_per_row {
            let a = Vector::<f32, N>::cast_from(logits[base + i]);
            let b = Vector::<f32, N>::cast_from(logits[base + i + stride]);
            let vm = f32::max(lanes_max::<N>(a), lanes_max::<N>(b));
            if vm > m {
                s *= (m - vm).exp();
                m = vm;
            }
            let mv = Vector::new(m);
            s += lanes_sum::<N>((a - mv).exp()) + lanes_sum::<N>((b - mv).exp());
            i += 2 * stride;
        }
        if i < vecs_per_row {
            let a = Vector::<f32, N>::cast_from(logits[base + i]);
            let vm = lanes_max::<N>(a);
            if vm > m {
                s *= (m - vm).exp();
                m = vm;
            }
            s += lanes_sum::<N>((a - Vector::new(m)).exp());
        }
    }

    let m_row = row_reduce(m, &mut smem, units, plane_size, true);
    let s_row = row_reduce(s * (m - m_row).exp(), &mut smem, units, plane_size, false);

    if valid && x == 0 {
        let l = m_row + s_row.ln();
        let t = u32::cast_from(targets[row]) as usize;
        let n = N::value();
        let picked = lane_of::<F, N>(logits[row * vecs_per_row + t / n], t % n);
        out[row] = F::cast_from(picked - l);
        lse[row] = l;
    }
}

/// Backward of token log-probs: `d[r, j] = g_r · ([j = t_r] − e^{x[r, j] − lse_r})`.
#[cube(launch, address_type = "dynamic")]
pub fn token_logprobs_bwd<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    lse: &Tensor<f32>,
    grad: &Tensor<F>,
    out: &mut Tensor<Vector<F, N>>,
    rows: usize,
    vecs_per_row: usize,
    #[comptime] units: u32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    if row >= rows {
        terminate!();
    }
    let x = UNIT_POS_X as usize;
    let stride = comptime!(units as usize);
    let n = N::value();
    let base = row * vecs_per_row;
    let l = Vector::<f32, N>::new(lse[row]);
    let g = f32::cast_from(grad[row]);
    let neg_g = Vector::<f32, N>::new(-g);
    let t = u32::cast_from(targets[row]) as usize;
    let t_vec = t / n;
    let t_lane = t % n;

    let mut i = x;
    while i < vecs_per_row {
        let v = Vector::<f32, N>::cast_from(logits[base + i]);
        let d = (v - l).exp() * neg_g;
        if i == t_vec {
            let mut cell = RuntimeCell::<Vector<f32, N>>::new(d);
            #[unroll]
            for k in 0..N::value() {
                if t_lane == k {
                    cell.store_at(k, d[k] + g);
                }
            }
            out[base + i] = Vector::cast_from(cell.consume());
        } else {
            out[base + i] = Vector::cast_from(d);
        }
        i += stride;
    }
}

/// Forward of the full-vocabulary KL: per row, `lse_p`, `lse_q` and
/// `KL = Σ_j P_j (p_j − q_j) − lse_p + lse_q`, one pass over both logit rows.
#[cube(launch, address_type = "dynamic")]
pub fn kl_full_fwd<F: Float, N: Size>(
    p: &Tensor<Vector<F, N>>,
    q: &Tensor<Vector<F, N>>,
    out: &mut Tensor<F>,
    lse_p: &mut Tensor<f32>,
    lse_q: &mut Tensor<f32>,
    kl: &mut Tensor<f32>,
    rows: usize,
    vecs_per_row: usize,
    #[comptime] units: u32,
    #[comptime] plane_size: u32,
    #[define(F)] _dtype: StorageType,
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(MAX_CUBE_UNITS as usize));
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let valid = row < rows;
    let x = UNIT_POS_X as usize;
    let stride = comptime!(units as usize);

    // Running max of p, Σ e^{p−mp}, Σ e^{p−mp}(p−q); running max of q, Σ e^{q−mq}.
    let mut mp = f32::new(NEG_BIG);
    let mut sp = f32::new(0.0);
    let mut a = f32::new(0.0);
    let mut mq = f32::new(NEG_BIG);
    let mut sq = f32::new(0.0);
    if valid {
        let base = row * vecs_per_row;
        let mut i = x;
        // Two vectors of each input per step (four independent loads), one rescale check each.
        while i + stride < vecs_per_row {
            let vp0 = Vector::<f32, N>::cast_from(p[base + i]);
            let vq0 = Vector::<f32, N>::cast_from(q[base + i]);
            let vp1 = Vector::<f32, N>::cast_from(p[base + i + stride]);
            let vq1 = Vector::<f32, N>::cast_from(q[base + i + stride]);
            let vmp = f32::max(lanes_max::<N>(vp0), lanes_max::<N>(vp1));
            if vmp > mp {
                let r = (mp - vmp).exp();
                sp *= r;
                a *= r;
                mp = vmp;
            }
            let vmq = f32::max(lanes_max::<N>(vq0), lanes_max::<N>(vq1));
            if vmq > mq {
                sq *= (mq - vmq).exp();
                mq = vmq;
            }
            let mpv = Vector::new(mp);
            let mqv = Vector::new(mq);
            let ep0 = (vp0 - mpv).exp();
            let ep1 = (vp1 - mpv).exp();
            sp += lanes_sum::<N>(ep0 + ep1);
            a += lanes_sum::<N>(ep0 * (vp0 - vq0) + ep1 * (vp1 - vq1));
            sq += lanes_sum::<N>((vq0 - mqv).exp() + (vq1 - mqv).exp());
            i += 2 * stride;
        }
        if i < vecs_per_row {
            let vp = Vector::<f32, N>::cast_from(p[base + i]);
            let vq = Vector::<f32, N>::cast_from(q[base + i]);
            let vmp = lanes_max::<N>(vp);
            if vmp > mp {
                let r = (mp - vmp).exp();
                sp *= r;
                a *= r;
                mp = vmp;
            }
            let vmq = lanes_max::<N>(vq);
            if vmq > mq {
                sq *= (mq - vmq).exp();
                mq = vmq;
            }
            let ep = (vp - Vector::new(mp)).exp();
            sp += lanes_sum::<N>(ep);
            a += lanes_sum::<N>(ep * (vp - vq));
            sq += lanes_sum::<N>((vq - Vector::new(mq)).exp());
        }
    }

    let mp_row = row_reduce(mp, &mut smem, units, plane_size, true);
    let rp = (mp - mp_row).exp();
    let sp_row = row_reduce(sp * rp, &mut smem, units, plane_size, false);
    let a_row = row_reduce(a * rp, &mut smem, units, plane_size, false);
    let mq_row = row_reduce(mq, &mut smem, units, plane_size, true);
    let sq_row = row_reduce(
        sq * (mq - mq_row).exp(),
        &mut smem,
        units,
        plane_size,
        false,
    );

    if valid && x == 0 {
        let lp = mp_row + sp_row.ln();
        let lq = mq_row + sq_row.ln();
        let k = a_row / sp_row - lp + lq;
        out[row] = F::cast_from(k);
        lse_p[row] = lp;
        lse_q[row] = lq;
        kl[row] = k;
    }
}

/// Backward of the full-vocabulary KL: `dp = g·P⊙(log P − log Q − KL)`, `dq = g·(Q − P)`.
/// `with_p` / `with_q` pick the outputs written (the other argument may be a dummy).
#[cube(launch, address_type = "dynamic")]
pub fn kl_full_bwd<F: Float, N: Size>(
    p: &Tensor<Vector<F, N>>,
    q: &Tensor<Vector<F, N>>,
    lse_p: &Tensor<f32>,
    lse_q: &Tensor<f32>,
    kl: &Tensor<f32>,
    grad: &Tensor<F>,
    dp: &mut Tensor<Vector<F, N>>,
    dq: &mut Tensor<Vector<F, N>>,
    rows: usize,
    vecs_per_row: usize,
    #[comptime] units: u32,
    #[comptime] with_p: bool,
    #[comptime] with_q: bool,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    if row >= rows {
        terminate!();
    }
    let x = UNIT_POS_X as usize;
    let stride = comptime!(units as usize);
    let base = row * vecs_per_row;
    let lp = Vector::<f32, N>::new(lse_p[row]);
    let lq = Vector::<f32, N>::new(lse_q[row]);
    let k = Vector::<f32, N>::new(kl[row]);
    let g = Vector::<f32, N>::new(f32::cast_from(grad[row]));

    let mut i = x;
    while i < vecs_per_row {
        let log_p = Vector::<f32, N>::cast_from(p[base + i]) - lp;
        let log_q = Vector::<f32, N>::cast_from(q[base + i]) - lq;
        let prob_p = log_p.exp();
        if with_p {
            dp[base + i] = Vector::cast_from(g * prob_p * (log_p - log_q - k));
        }
        if with_q {
            dq[base + i] = Vector::cast_from(g * (log_q.exp() - prob_p));
        }
        i += stride;
    }
}

/// Most units in one cube (the launch never exceeds it); sizes the shared scratch (1 KiB).
pub const MAX_CUBE_UNITS: u32 = 256;
