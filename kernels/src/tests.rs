//! Fused ops against a float64 CPU reference (plain `Vec<f64>`), forward and gradients, on
//! fresh seeded random inputs, at shapes including N = 1, V = 1, V prime, V below and above a
//! workgroup and V = 151936. Always on NdArray; on wgpu (and `Autodiff<Wgpu>`) with the `wgpu`
//! feature, plus fused-vs-reference agreement and bf16/f16 where the device supports them.

use crate::{AttentionOps, AutodiffLogProbOps, LogProbOps, fused, reference};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType, TensorData};

/// (rows, vocab). 256 units × 4 lanes is the widest workgroup row pass, so 97 and 7 sit below
/// it, 1031 / 4096 / 151936 above; 97, 1031 and 7 are prime (scalar loads, ragged tails).
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (3, 1),
    (1, 7),
    (5, 97),
    (1, 1031),
    (4, 1031),
    (9, 64),
    (3, 4096),
    (2, 151_936),
];

// ---------------------------------------------------------------------------------------------
// Seeded inputs and the float64 reference.

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi), never exactly 0.
    fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
        let x = (lo + (hi - lo) * self.unit()) as f32;
        if x == 0.0 { 0.125 } else { x }
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    fn logits(&mut self, n: usize, v: usize) -> Vec<f32> {
        // A per-row offset so rows differ in scale, and a spread that makes softmax peaky.
        let mut out = Vec::with_capacity(n * v);
        for _ in 0..n {
            let offset = self.uniform(-20.0, 20.0);
            out.extend((0..v).map(|_| offset + self.uniform(-6.0, 6.0)));
        }
        out
    }
}

fn lse64(row: &[f64]) -> f64 {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Token log-probs and their gradient (`g ⊙ (onehot − softmax)`) in f64.
fn token_ref(x: &[f64], v: usize, t: &[usize], g: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut lp = Vec::new();
    let mut grad = Vec::new();
    for (r, row) in x.chunks(v).enumerate() {
        let l = lse64(row);
        lp.push(row[t[r]] - l);
        grad.extend(
            row.iter()
                .enumerate()
                .map(|(j, xj)| g[r] * (if j == t[r] { 1.0 } else { 0.0 } - (xj - l).exp())),
        );
    }
    (lp, grad)
}

/// KL(softmax p ‖ softmax q) per row and its gradients for p and q, in f64.
#[allow(clippy::type_complexity)]
fn kl_ref(p: &[f64], q: &[f64], v: usize, g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut kl, mut dp, mut dq) = (Vec::new(), Vec::new(), Vec::new());
    for (r, (pr, qr)) in p.chunks(v).zip(q.chunks(v)).enumerate() {
        let (lp, lq) = (lse64(pr), lse64(qr));
        let k: f64 = pr
            .iter()
            .zip(qr)
            .map(|(a, b)| (a - lp).exp() * ((a - lp) - (b - lq)))
            .sum();
        kl.push(k);
        for (a, b) in pr.iter().zip(qr) {
            let (la, lb) = (a - lp, b - lq);
            dp.push(g[r] * la.exp() * (la - lb - k));
            dq.push(g[r] * (lb.exp() - la.exp()));
        }
    }
    (kl, dp, dq)
}

// ---------------------------------------------------------------------------------------------
// Comparison helpers.

#[derive(Clone, Copy, Debug)]
struct Tol {
    atol: f64,
    rtol: f64,
}

fn tol_for(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            atol: 2e-5,
            rtol: 2e-5,
        },
        // One rounding of the output to 8 (bf16) / 11 (f16) significant bits dominates.
        DType::BF16 => Tol {
            atol: 2e-3,
            rtol: 1.6e-2,
        },
        _ => Tol {
            atol: 5e-4,
            rtol: 2e-3,
        },
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: Tol) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let bound = tol.atol + tol.rtol * w.abs();
        assert!(
            err <= bound && g.is_finite(),
            "{what}: element {i}: got {g}, want {w} (err {err:.3e} > {bound:.3e})"
        );
    }
}

fn to_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

/// A float tensor of `dtype` from f32 values, and the values it actually holds (rounded).
fn upload<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    dtype: FloatDType,
    device: &B::Device,
) -> (Tensor<B, D>, Vec<f64>) {
    let t = Tensor::<B, D>::from_data(TensorData::new(values, shape), device);
    let t = if t.dtype() == DType::from(dtype) {
        t
    } else {
        t.cast(dtype)
    };
    let held = to_f32(t.clone()).into_iter().map(f64::from).collect();
    (t, held)
}

fn targets<B: Backend>(
    rng: &mut Rng,
    n: usize,
    v: usize,
    device: &B::Device,
) -> (Tensor<B, 1, Int>, Vec<usize>) {
    let t: Vec<usize> = (0..n).map(|_| rng.below(v)).collect();
    let data = TensorData::new(t.iter().map(|&x| x as i64).collect::<Vec<_>>(), [n]);
    (Tensor::from_data(data.convert::<B::IntElem>(), device), t)
}

// ---------------------------------------------------------------------------------------------
// The checks, generic over the backend.

/// Forward of both fused ops (and their gradients through `Autodiff<B>`) against f64.
fn check_against_f64<B: AutodiffLogProbOps>(
    device: &B::Device,
    dtype: FloatDType,
    shapes: &[(usize, usize)],
    seed: u64,
) {
    let tol = tol_for(dtype.into());
    for &(n, v) in shapes {
        let mut rng = Rng(seed ^ ((n as u64) << 32) ^ v as u64);
        let ctx = format!("{} {dtype:?} [{n}, {v}]", B::name(device));

        // Token log-probs: forward, then d(Σ w·lp)/dlogits = w ⊙ (onehot − softmax).
        let (x, x64) = upload::<B, 2>(rng.logits(n, v), [n, v], dtype, device);
        let (t, t_idx) = targets::<B>(&mut rng, n, v, device);
        let (w, w64) = upload::<B, 1>(
            (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect(),
            [n],
            dtype,
            device,
        );
        let (lp_want, dx_want) = token_ref(&x64, v, &t_idx, &w64);

        let x = x.require_grad();
        let lp = fused::token_logprobs(x.clone(), t.clone());
        assert_eq!(lp.dtype(), DType::from(dtype), "{ctx}: output dtype");
        assert_close(
            &format!("{ctx} token_logprobs"),
            &to_f32(lp.clone()),
            &lp_want,
            tol,
        );
        let grads = (lp * w.clone()).sum().backward();
        let dx = x.grad(&grads).expect("logits grad");
        assert_close(
            &format!("{ctx} d token_logprobs"),
            &to_f32(dx),
            &dx_want,
            tol,
        );

        // Untracked path (no autodiff node) gives the same forward.
        let lp_inner = fused::token_logprobs(x.clone().inner(), t.inner());
        assert_close(
            &format!("{ctx} token_logprobs (inner)"),
            &to_f32(lp_inner),
            &lp_want,
            tol,
        );

        // KL: forward, gradients for both inputs, then for p alone (q detached).
        let (p, p64) = upload::<B, 2>(rng.logits(n, v), [n, v], dtype, device);
        let (q, q64) = upload::<B, 2>(rng.logits(n, v), [n, v], dtype, device);
        let (kl_want, dp_want, dq_want) = kl_ref(&p64, &q64, v, &w64);
        // KL is a difference of O(lse) terms: its absolute error scales with them.
        let kl_tol = Tol {
            atol: tol.atol * 40.0,
            rtol: tol.rtol,
        };

        let (p, q) = (p.require_grad(), q.require_grad());
        let kl = fused::kl_full(p.clone(), q.clone());
        assert_close(
            &format!("{ctx} kl_full"),
            &to_f32(kl.clone()),
            &kl_want,
            kl_tol,
        );
        let grads = (kl * w.clone()).sum().backward();
        let dp = p.grad(&grads).expect("p grad");
        let dq = q.grad(&grads).expect("q grad");
        assert_close(&format!("{ctx} d kl_full / dp"), &to_f32(dp), &dp_want, tol);
        assert_close(&format!("{ctx} d kl_full / dq"), &to_f32(dq), &dq_want, tol);

        let kl = fused::kl_full(p.clone(), q.clone().detach());
        let grads = (kl * w).sum().backward();
        assert!(q.grad(&grads).is_none(), "{ctx}: detached q got a gradient");
        let dp = p.grad(&grads).expect("p grad");
        assert_close(
            &format!("{ctx} d kl_full / dp (q detached)"),
            &to_f32(dp),
            &dp_want,
            tol,
        );
    }
}

/// Fused and reference agree (forward and gradients) on the same inputs.
fn check_fused_vs_reference<B>(device: &B::Device, shapes: &[(usize, usize)], seed: u64)
where
    B: AutodiffBackend + LogProbOps,
    B::InnerBackend: LogProbOps,
{
    let tol = Tol {
        atol: 5e-5,
        rtol: 5e-5,
    };
    for &(n, v) in shapes {
        let mut rng = Rng(seed ^ ((n as u64) << 20) ^ v as u64);
        let ctx = format!("fused vs reference [{n}, {v}]");
        let x = Tensor::<B, 2>::from_data(TensorData::new(rng.logits(n, v), [n, v]), device);
        let q = Tensor::<B, 2>::from_data(TensorData::new(rng.logits(n, v), [n, v]), device);
        let (t, _) = targets::<B>(&mut rng, n, v, device);

        let run = |fused_ops: bool| {
            let (x, q) = (x.clone().require_grad(), q.clone().require_grad());
            let (lp, kl) = if fused_ops {
                (
                    fused::token_logprobs(x.clone(), t.clone()),
                    fused::kl_full(x.clone(), q.clone()),
                )
            } else {
                (
                    reference::token_logprobs(x.clone(), t.clone()),
                    reference::kl_full(x.clone(), q.clone()),
                )
            };
            let (lp_v, kl_v) = (to_f32(lp.clone()), to_f32(kl.clone()));
            let grads = (lp.sum() + kl.sum()).backward();
            let dx = to_f32(x.grad(&grads).expect("x grad"));
            let dq = to_f32(q.grad(&grads).expect("q grad"));
            (lp_v, kl_v, dx, dq)
        };
        let want = run(false);
        let got = run(true);
        let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        assert_close(
            &format!("{ctx} token_logprobs"),
            &got.0,
            &f64s(&want.0),
            tol,
        );
        assert_close(
            &format!("{ctx} kl_full"),
            &got.1,
            &f64s(&want.1),
            Tol {
                atol: 1e-3,
                rtol: 1e-4,
            },
        );
        assert_close(&format!("{ctx} grad logits"), &got.2, &f64s(&want.2), tol);
        assert_close(&format!("{ctx} grad q"), &got.3, &f64s(&want.3), tol);
    }
}

// ---------------------------------------------------------------------------------------------
// Attention that recomputes its probabilities in the backward pass, against its reference twin.

/// `(batch, kv_heads, group, seq, cached keys, head_dim, bias)`: bias 0 none, 1 causal
/// (shared by the rows), 2 causal plus per-row key padding.
const ATTENTION_SHAPES: &[(usize, usize, usize, usize, usize, usize, u8)] = &[
    (1, 1, 1, 1, 0, 1, 0),
    (2, 1, 3, 5, 0, 4, 1),
    (3, 2, 2, 7, 4, 8, 2),
    (1, 3, 3, 16, 9, 64, 2),
    (2, 2, 1, 9, 0, 5, 0),
    // More keys than a cube has units: the softmax kernels' rows in several strides.
    (2, 1, 2, 3, 300, 8, 2),
];

/// An additive f32 bias `[rows, 1, seq, keys]`: key `j` hidden from query `i` when
/// `j > cache + i` (causal) and, with padding, when `j` is among row `r`'s last `r` keys.
fn attention_bias<B: Backend>(
    batch: usize,
    seq: usize,
    cache: usize,
    kind: u8,
    device: &B::Device,
) -> Option<Tensor<B, 4>> {
    let keys = cache + seq;
    let rows = if kind == 2 { batch } else { 1 };
    let mut bias = vec![0f32; rows * seq * keys];
    for r in 0..rows {
        for i in 0..seq {
            for j in 0..keys {
                let future = j > cache + i;
                let padded = kind == 2 && j + r >= keys && j > 0 && j != cache + i;
                if future || padded {
                    bias[(r * seq + i) * keys + j] = -1.0e9;
                }
            }
        }
    }
    (kind != 0).then(|| Tensor::from_data(TensorData::new(bias, [rows, 1, seq, keys]), device))
}

fn check_attention_vs_reference<B>(device: &B::Device, seed: u64)
where
    B: AutodiffBackend<InnerBackend: crate::AttentionOps> + crate::AttentionOps,
{
    use crate::{grouped_attention, reference_grouped_attention};
    let mut rng = Rng(seed);
    let tol = tol_for(DType::F32);
    for &(batch, kv_heads, group, seq, cache, head_dim, kind) in ATTENTION_SHAPES {
        let ctx = format!(
            "attention b{batch} kv{kv_heads} g{group} s{seq} c{cache} d{head_dim} bias{kind}"
        );
        let keys = cache + seq;
        let mut random = |shape: [usize; 4], spread: f64| {
            let n = shape.iter().product();
            let values = (0..n).map(|_| rng.uniform(-spread, spread)).collect();
            Tensor::<B, 4>::from_data(TensorData::new(values, shape), device)
        };
        let q = random([batch, kv_heads, group * seq, head_dim], 2.0);
        let k = random([batch, kv_heads, keys, head_dim], 2.0);
        let v = random([batch, kv_heads, keys, head_dim], 1.0);
        let w = random([batch, kv_heads, group * seq, head_dim], 1.0);
        let bias = attention_bias::<B>(batch, seq, cache, kind, device);

        let run = |fused: bool, detach_k: bool| {
            let (q, k, v) = (
                q.clone().require_grad(),
                k.clone(),
                v.clone().require_grad(),
            );
            let k = if detach_k { k } else { k.require_grad() };
            let out = if fused {
                grouped_attention(q.clone(), k.clone(), v.clone(), bias.clone(), group)
            } else {
                reference_grouped_attention(q.clone(), k.clone(), v.clone(), bias.clone(), group)
            };
            let grads = (out.clone() * w.clone()).sum().backward();
            let grad = |t: &Tensor<B, 4>| t.grad(&grads).map(to_f32);
            (to_f32(out), grad(&q), grad(&k), grad(&v))
        };
        let as64 = |xs: &[f32]| xs.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let want = run(false, false);
        let got = run(true, false);
        assert_close(&format!("{ctx}: forward"), &got.0, &as64(&want.0), tol);
        for (name, g, w) in [
            ("dq", &got.1, &want.1),
            ("dk", &got.2, &want.2),
            ("dv", &got.3, &want.3),
        ] {
            let (g, w) = (g.as_ref().expect(name), w.as_ref().expect(name));
            assert_close(&format!("{ctx}: {name}"), g, &as64(w), tol);
        }
        // A parent that needs no gradient gets none; the others are unchanged.
        let part = run(true, true);
        assert!(part.2.is_none(), "{ctx}: a detached k got a gradient");
        assert_eq!(part.1, got.1, "{ctx}: dq with k detached");
        // The untracked path (no autodiff node) gives the same forward.
        let inner = grouped_attention(
            q.clone().inner(),
            k.clone().inner(),
            v.clone().inner(),
            bias.clone().map(|b| b.inner()),
            group,
        );
        assert_eq!(to_f32(inner), got.0, "{ctx}: untracked forward");
    }
}

/// The attention's softmax and its backward ([`crate::AttentionOps::attention_softmax`],
/// [`crate::AttentionOps::softmax_backward`]) against their reference twins: rows shorter and
/// longer than a cube, no bias, a shared bias and one per row with a fully masked row. (The
/// CPU backends' ops are the twins themselves.)
#[cfg(feature = "wgpu")]
fn check_softmax_ops<B: crate::AttentionOps>(device: &B::Device, seed: u64) {
    use crate::{reference_attention_softmax, reference_softmax_backward};
    let mut rng = Rng(seed);
    for &(batch, heads, seq, keys, bias_rows) in &[
        (2, 3, 4, 5, 0),
        (2, 2, 3, 300, 1),
        (3, 1, 2, 7, 3),
        (1, 2, 1, 513, 1),
    ] {
        let ctx = format!("softmax b{batch} h{heads} s{seq} k{keys} bias{bias_rows}");
        let mut random = |shape: [usize; 4], spread: f64| {
            let n = shape.iter().product();
            let values = (0..n).map(|_| rng.uniform(-spread, spread)).collect();
            Tensor::<B, 4>::from_data(TensorData::new(values, shape), device)
        };
        let scores = random([batch, heads, seq, keys], 8.0);
        let dprobs = random([batch, heads, seq, keys], 1.0);
        let bias = (bias_rows > 0).then(|| {
            let mut values = vec![0f32; bias_rows * seq * keys];
            for (i, v) in values.iter_mut().enumerate() {
                // Every third key masked, and the last bias row's first query wholly.
                let (row, key) = (i / keys, i % keys);
                if key % 3 == 2 || (bias_rows > 1 && row == (bias_rows - 1) * seq) {
                    *v = -1.0e9;
                }
            }
            Tensor::<B, 4>::from_data(TensorData::new(values, [bias_rows, 1, seq, keys]), device)
        });
        let want = to_vec(reference_attention_softmax(scores.clone(), bias.clone()));
        let got: Tensor<B, 4> =
            Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(B::attention_softmax(
                scores.clone().into_primitive().tensor(),
                bias.map(|b| b.into_primitive().tensor()),
            )));
        let probs = got.clone();
        assert_near(&format!("{ctx}: probabilities"), &to_vec(got), &want, 1e-6);
        let want = to_vec(reference_softmax_backward(probs.clone(), dprobs.clone()));
        let got: Tensor<B, 4> =
            Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(B::softmax_backward(
                probs.into_primitive().tensor(),
                dprobs.into_primitive().tensor(),
            )));
        assert_near(&format!("{ctx}: backward"), &to_vec(got), &want, 1e-6);
    }
}

/// By hand: with `q = 0` every visible key scores the same, so each query's output is the mean
/// of the values it sees (causal: query `i` sees values `0..=i`).
fn check_attention_by_hand<B: crate::AttentionOps>(device: &B::Device) {
    let q = Tensor::<B, 4>::zeros([1, 1, 3, 2], device);
    let k = Tensor::<B, 4>::ones([1, 1, 3, 2], device);
    let v = Tensor::<B, 4>::from_data(
        TensorData::new(vec![3.0f32, 0.0, 6.0, 3.0, 0.0, 9.0], [1, 1, 3, 2]),
        device,
    );
    let bias = attention_bias::<B>(1, 3, 0, 1, device);
    let out = to_f32(crate::grouped_attention(q, k, v, bias, 1));
    let want = [3.0, 0.0, 4.5, 1.5, 3.0, 4.0];
    assert_close("attention by hand", &out, &want, tol_for(DType::F32));
}

/// (batch, heads, seq, head_dim, angle rows, x a swapped view): a decode step (seq 1, angles
/// per row), a prompt (angles shared), per-row angles over several positions, odd sizes.
const ROTARY_SHAPES: &[(usize, usize, usize, usize, usize, bool)] = &[
    (3, 9, 1, 64, 3, true),
    (1, 3, 5, 8, 1, true),
    (2, 2, 4, 6, 2, false),
    (2, 3, 7, 2, 1, false),
];

/// [`crate::rotary`] against its reference twin: the forward and `dx` bit for bit (the one pass
/// rounds as the composition does), the untracked forward equal too.
fn check_rotary_vs_reference<B>(device: &B::Device, seed: u64)
where
    B: AutodiffBackend<InnerBackend: crate::AttentionOps> + crate::AttentionOps,
{
    use crate::{reference_rotary, rotary};
    let mut rng = Rng(seed);
    for &(batch, heads, seq, head_dim, angle_rows, swapped) in ROTARY_SHAPES {
        let ctx = format!("rotary b{batch} h{heads} s{seq} d{head_dim} angles{angle_rows}");
        let mut random = |shape: [usize; 4], spread: f64| {
            let n = shape.iter().product();
            let values = (0..n).map(|_| rng.uniform(-spread, spread)).collect();
            Tensor::<B, 4>::from_data(TensorData::new(values, shape), device)
        };
        // As the attention's q and k arrive: [batch, seq, heads, head_dim] swapped.
        let x = if swapped {
            random([batch, seq, heads, head_dim], 2.0).swap_dims(1, 2)
        } else {
            random([batch, heads, seq, head_dim], 2.0)
        };
        let cos = random([angle_rows, 1, seq, head_dim / 2], 1.0);
        let sin = random([angle_rows, 1, seq, head_dim / 2], 1.0);
        let w = random([batch, heads, seq, head_dim], 1.0);
        let run = |fused: bool| {
            let x = x.clone().require_grad();
            let out = if fused {
                rotary(x.clone(), &cos, &sin)
            } else {
                reference_rotary(x.clone(), cos.clone(), sin.clone())
            };
            let grads = (out.clone() * w.clone()).sum().backward();
            (to_f32(out), x.grad(&grads).map(to_f32))
        };
        let (want, want_dx) = run(false);
        let (got, got_dx) = run(true);
        assert_eq!(got, want, "{ctx}: forward");
        // Bit for bit too: the inverse rotation's two products and one sum are the terms the
        // composition's backward adds.
        let (got_dx, want_dx) = (got_dx.expect("dx"), want_dx.expect("dx"));
        assert_eq!(got_dx, want_dx, "{ctx}: dx");
        let inner = rotary(
            x.clone().inner(),
            &cos.clone().inner(),
            &sin.clone().inner(),
        );
        assert_eq!(to_f32(inner), want, "{ctx}: untracked forward");
    }
}

// ---------------------------------------------------------------------------------------------
// The fused decode step (`crate::decode`): each op against its reference twin on NdArray.

type Host = burn::backend::NdArray<f32>;

fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

fn tensor<B: Backend, const D: usize>(
    data: &[f32],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect()
}

fn assert_near(what: &str, got: &[f32], want: &[f32], atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= atol + atol * w.abs(),
            "{what}[{i}]: {g} against {w}"
        );
    }
}

/// `add_rms_norm` by hand: x = (1, 3), residual (2, 1) → sum (3, 4); mean of squares 12.5,
/// rms √12.5 = 3.5355339; γ = (1, 2) → (3/3.5355339, 2·4/3.5355339) = (0.8485281, 2.2627417).
fn check_add_rms_norm_by_hand<B: AttentionOps>(device: &B::Device) {
    let x = tensor::<B, 3>(&[1.0, 3.0], [1, 1, 2], device);
    let r = tensor::<B, 3>(&[2.0, 1.0], [1, 1, 2], device);
    let gamma = tensor::<B, 1>(&[1.0, 2.0], [2], device);
    let (sum, normed) = crate::add_rms_norm(x, Some(r), gamma, 0.0);
    assert_near("sum", &to_vec(sum), &[3.0, 4.0], 0.0);
    assert_near("normed", &to_vec(normed), &[0.848_528_1, 2.262_741_7], 1e-6);
}

/// The three decode ops of `B` against their reference twins on NdArray, on seeded inputs:
/// rows wider than a cube's units, keys over several chunks of the attention, shared and
/// per-row angles and biases, masked keys, a head dimension that is not a power of two.
fn check_decode_ops<B: AttentionOps>(device: &B::Device, seed: u64) {
    use crate::decode::{Heads, reference_add_rms_norm, reference_rotary_cache_write};
    let host = Default::default();
    let mut rng = Rng(seed);
    check_add_rms_norm_by_hand::<B>(device);

    // add_rms_norm: d = 300 (more than 256 units), with and without a residual.
    let (b, s, d) = (2, 3, 300);
    let (x, r, g) = (
        random(&mut rng, b * s * d),
        random(&mut rng, b * s * d),
        random(&mut rng, d),
    );
    for with_residual in [true, false] {
        let (sum, normed) = crate::add_rms_norm(
            tensor::<B, 3>(&x, [b, s, d], device),
            with_residual.then(|| tensor::<B, 3>(&r, [b, s, d], device)),
            tensor::<B, 1>(&g, [d], device),
            1e-5,
        );
        let (want_sum, want_normed) = reference_add_rms_norm::<Host>(
            tensor(&x, [b, s, d], &host),
            with_residual.then(|| tensor(&r, [b, s, d], &host)),
            tensor(&g, [d], &host),
            1e-5,
        );
        assert_near("sum", &to_vec(sum), &to_vec(want_sum), 1e-6);
        assert_near("normed", &to_vec(normed), &to_vec(want_normed), 1e-5);
    }

    // rotary_cache_write: 4 query heads over 2 K/V heads of 6, written at 5 of 12 positions.
    let heads = Heads {
        heads: 4,
        kv_heads: 2,
        head_dim: 6,
    };
    let (cap, at, half) = (12, 5, 3);
    for (seq, angle_rows) in [(1, 2), (3, 1), (3, 2)] {
        let q = random(&mut rng, b * seq * 4 * 6);
        let k = random(&mut rng, b * seq * 2 * 6);
        let v = random(&mut rng, b * seq * 2 * 6);
        // Biases on the queries and values only (per-projection flags).
        let (bq, bv) = (random(&mut rng, 24), random(&mut rng, 12));
        let with_bias = angle_rows == 2;
        let cos = random(&mut rng, angle_rows * seq * half);
        let sin = random(&mut rng, angle_rows * seq * half);
        let kb = random(&mut rng, b * 2 * cap * 6);
        let vb = random(&mut rng, b * 2 * cap * 6);
        let angles = [angle_rows, 1, seq, half];
        let k_buffer = tensor::<B, 4>(&kb, [b, 2, cap, 6], device);
        // A second handle on the key buffer: the op must not write through it.
        let shared = k_buffer.clone();
        let got = crate::rotary_cache_write(
            tensor::<B, 3>(&q, [b, seq, 24], device),
            tensor::<B, 3>(&k, [b, seq, 12], device),
            tensor::<B, 3>(&v, [b, seq, 12], device),
            [
                with_bias.then(|| tensor::<B, 1>(&bq, [24], device)),
                None,
                with_bias.then(|| tensor::<B, 1>(&bv, [12], device)),
            ],
            &tensor::<B, 4>(&cos, angles, device),
            &tensor::<B, 4>(&sin, angles, device),
            k_buffer,
            tensor::<B, 4>(&vb, [b, 2, cap, 6], device),
            at,
            heads,
        );
        let want = reference_rotary_cache_write::<Host>(
            tensor(&q, [b, seq, 24], &host),
            tensor(&k, [b, seq, 12], &host),
            tensor(&v, [b, seq, 12], &host),
            [
                with_bias.then(|| tensor(&bq, [24], &host)),
                None,
                with_bias.then(|| tensor(&bv, [12], &host)),
            ],
            tensor(&cos, angles, &host),
            tensor(&sin, angles, &host),
            tensor(&kb, [b, 2, cap, 6], &host),
            tensor(&vb, [b, 2, cap, 6], &host),
            at,
            heads,
        );
        for (name, (got, want)) in ["queries", "keys", "values"]
            .iter()
            .zip(got.into_iter().zip(want))
        {
            assert_eq!(got.dims(), want.dims(), "{name}: shape");
            assert_near(name, &to_vec(got), &to_vec(want), 1e-6);
        }
        assert_eq!(to_vec(shared), kb, "a shared buffer was written through");
    }

    // cached_attention: keys 21 over a capacity of 30 (four chunks of 8 units at head_dim 6).
    let (group, keys, cap) = (2, 21, 30);
    for (bias_rows, masked) in [(0, 0), (1, 4), (2, 7)] {
        let q = random(&mut rng, b * 2 * group * 6);
        let kb = random(&mut rng, b * 2 * cap * 6);
        let vb = random(&mut rng, b * 2 * cap * 6);
        let bias: Vec<f32> = (0..bias_rows.max(1) * keys)
            .map(|i| {
                if i % keys < masked {
                    -1.0e9
                } else {
                    rng.uniform(-1.0, 1.0)
                }
            })
            .collect();
        let bias_shape = [bias_rows.max(1), 1, 1, keys];
        let served = B::cached_attention(
            tensor::<B, 4>(&q, [b, 2, group, 6], device)
                .into_primitive()
                .tensor(),
            tensor::<B, 4>(&kb, [b, 2, cap, 6], device)
                .into_primitive()
                .tensor(),
            tensor::<B, 4>(&vb, [b, 2, cap, 6], device)
                .into_primitive()
                .tensor(),
            keys,
            (bias_rows > 0).then(|| {
                tensor::<B, 4>(&bias, bias_shape, device)
                    .into_primitive()
                    .tensor()
            }),
            group,
        );
        let Some(got) = served else {
            assert!(
                !B::DECODE_KERNELS,
                "a backend with decode kernels did not serve"
            );
            continue;
        };
        let got = to_vec(Tensor::<B, 4>::from_primitive(
            burn::tensor::TensorPrimitive::Float(got),
        ));
        let narrow =
            |data: &[f32]| tensor::<Host, 4>(data, [b, 2, cap, 6], &host).narrow(2, 0, keys);
        let want = crate::reference_grouped_attention::<Host>(
            tensor(&q, [b, 2, group, 6], &host),
            narrow(&kb),
            narrow(&vb),
            (bias_rows > 0).then(|| tensor(&bias, bias_shape, &host)),
            group,
        );
        assert_near("attention", &got, &to_vec(want), 1e-5);
    }
}

/// `AttentionOps::sample_rows` against the host's rule in f64 (the first id whose running
/// sum of `exp((x − max) / T)` exceeds `u` times the total; greedy: the first largest logit),
/// and `log_softmax(x)[id]`: rows wider than a cube (1031 ids, prime: ragged runs), `u` near
/// 0 and near 1, temperatures 1 and 0.7, and greedy. A backend without the kernel says so.
fn check_sample_rows<B: AttentionOps>(device: &B::Device, seed: u64) {
    let mut rng = Rng(seed);
    let (rows, vocab) = (6, 1031);
    let logits = rng.logits(rows, vocab);
    let mut uniforms: Vec<f32> = (0..rows).map(|_| rng.uniform(0.0, 1.0)).collect();
    (uniforms[0], uniforms[1]) = (1e-6, 0.999_999);
    let host = |row: &[f32], u: Option<f64>, t: f64| -> (usize, f64) {
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let id = match u {
            None => row.iter().position(|&x| x as f64 == max).unwrap_or(0),
            Some(u) => {
                let p: Vec<f64> = row.iter().map(|&x| ((x as f64 - max) / t).exp()).collect();
                let target = u * p.iter().sum::<f64>();
                let mut acc = 0.0;
                p.iter()
                    .position(|&q| {
                        acc += q;
                        acc > target
                    })
                    .unwrap_or(row.len() - 1)
            }
        };
        (id, row[id] as f64 - lse)
    };
    for (temperature, greedy) in [(1.0, false), (0.7, false), (0.0, true)] {
        let drawn = B::sample_rows(
            tensor::<B, 2>(&logits, [rows, vocab], device)
                .into_primitive()
                .tensor(),
            (!greedy).then(|| {
                tensor::<B, 1>(&uniforms, [rows], device)
                    .into_primitive()
                    .tensor()
            }),
            temperature,
        );
        let Some(drawn) = drawn else {
            assert!(
                !B::DECODE_KERNELS,
                "a backend with decode kernels did not sample"
            );
            return;
        };
        let got = to_vec(Tensor::<B, 2>::from_primitive(
            burn::tensor::TensorPrimitive::Float(drawn),
        ));
        for r in 0..rows {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let u = (!greedy).then(|| f64::from(uniforms[r]));
            let (id, logprob) = host(row, u, temperature);
            assert_eq!(got[2 * r] as usize, id, "T {temperature}, row {r}: id");
            assert!(
                (f64::from(got[2 * r + 1]) - logprob).abs() < 1e-4,
                "T {temperature}, row {r}: log-prob {} against {logprob}",
                got[2 * r + 1]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NdArray (always).

mod ndarray {
    use super::*;
    use burn::backend::{Autodiff, NdArray};

    type B = Autodiff<NdArray<f32>>;

    #[test]
    fn fused_ops_match_f64_reference() {
        check_against_f64::<B>(&Default::default(), FloatDType::F32, SHAPES, 1);
    }

    #[test]
    fn fused_and_reference_agree() {
        check_fused_vs_reference::<B>(&Default::default(), &[(5, 97), (3, 4096)], 2);
    }

    #[test]
    fn recomputing_attention_matches_its_reference_twin() {
        check_attention_vs_reference::<B>(&Default::default(), 5);
        check_attention_by_hand::<B>(&Default::default());
    }

    #[test]
    fn rotary_matches_its_reference_twin_and_its_backward_is_the_inverse_rotation() {
        check_rotary_vs_reference::<B>(&Default::default(), 8);
    }

    #[test]
    fn decode_ops_match_their_reference_twins() {
        check_decode_ops::<NdArray<f32>>(&Default::default(), 31);
        check_sample_rows::<NdArray<f32>>(&Default::default(), 34);
    }

    /// On NdArray both arms run the same composed code (NdArray has no kernels), so this only
    /// checks the names; `wgpu::kernel_choice_dispatches` checks the dispatch itself.
    #[test]
    fn kernel_choice_names_parse() {
        use crate::KernelChoice;
        assert_eq!(
            "reference".parse::<KernelChoice>(),
            Ok(KernelChoice::Reference)
        );
        assert_eq!("fused".parse::<KernelChoice>(), Ok(KernelChoice::Fused));
        assert!("nope".parse::<KernelChoice>().is_err());
        assert_eq!(KernelChoice::Fused.to_string(), "fused");
    }
}

// ---------------------------------------------------------------------------------------------
// wgpu (CubeCL kernels), over the CPU Vulkan driver in CI.

/// `KernelChoice::Fused` must reach the backend's kernel and `Reference` the composition: the
/// fused result equals the direct kernel call bit for bit, and differs from the composition in
/// at least one bit (one-pass online softmax vs two passes round differently) while agreeing
/// within tolerance.
#[cfg(feature = "wgpu")]
fn check_kernel_choice_dispatches<B: LogProbOps>(device: &B::Device) {
    use crate::KernelChoice;
    let mut rng = Rng(3);
    let (n, v) = (16, 4096);
    let x = Tensor::<B, 2>::from_data(TensorData::new(rng.logits(n, v), [n, v]), device);
    let (t, _) = targets::<B>(&mut rng, n, v, device);
    let direct = to_f32(fused::token_logprobs(x.clone(), t.clone()));
    let fused_arm = to_f32(KernelChoice::Fused.token_logprobs(x.clone(), t.clone()));
    let reference_arm = to_f32(KernelChoice::Reference.token_logprobs(x.clone(), t.clone()));
    assert_eq!(fused_arm, direct, "Fused did not run the backend's kernel");
    assert!(
        fused_arm
            .iter()
            .zip(&reference_arm)
            .any(|(a, b)| a.to_bits() != b.to_bits()),
        "Fused and Reference gave bit-identical results: one arm is not what it claims"
    );
    let want: Vec<f64> = reference_arm.iter().map(|&x| f64::from(x)).collect();
    assert_close(
        "choice",
        &fused_arm,
        &want,
        Tol {
            atol: 1e-4,
            rtol: 1e-4,
        },
    );
    let y = Tensor::<B, 2>::from_data(TensorData::new(rng.logits(n, v), [n, v]), device);
    let kl_direct = to_f32(fused::kl_full(x.clone(), y.clone()));
    let kl_fused = to_f32(KernelChoice::Fused.kl_full(x, y));
    assert_eq!(
        kl_fused, kl_direct,
        "Fused KL did not run the backend's kernel"
    );
}

/// bf16/f16 against the float64 reference for every low-precision dtype the device supports;
/// says which it skipped.
#[cfg(feature = "wgpu")]
fn check_low_precision<B: AutodiffLogProbOps>(device: &B::Device, seed: u64) -> usize
where
    B::InnerBackend: Backend<Device = B::Device>,
{
    let shapes = &[(1, 1), (5, 97), (4, 1031), (3, 4096), (2, 151_936)];
    let mut ran = 0;
    for (dtype, name) in [(FloatDType::BF16, "bf16"), (FloatDType::F16, "f16")] {
        if !<B::InnerBackend as Backend>::supports_dtype(device, dtype.into()) {
            eprintln!("SKIPPED: {name} is not supported by this device");
            continue;
        }
        check_against_f64::<B>(device, dtype, shapes, seed);
        ran += 1;
    }
    eprintln!("low precision: {ran} of 2 dtypes checked");
    ran
}

// ---------------------------------------------------------------------------------------------
// wgpu (CubeCL kernels), over the CPU Vulkan driver in CI. `burn::backend::Wgpu` is
// `Fusion<CubeBackend<..>>` when Burn's `fusion` feature is on (every shipped GPU build): the
// custom ops then go through the fusion stream. The raw Cube backend is tested as well.

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;
    use burn::backend::{Autodiff, Wgpu};

    type B = Autodiff<Wgpu>;

    /// The shipped wgpu/cuda builds turn Burn's fusion on; then this module tests that path.
    #[cfg(feature = "fusion")]
    #[test]
    fn fusion_is_on_in_gpu_builds() {
        let name = std::any::type_name::<Wgpu>();
        assert!(name.contains("Fusion"), "{name}");
    }

    #[test]
    fn fused_ops_match_f64_reference() {
        check_against_f64::<B>(&Default::default(), FloatDType::F32, SHAPES, 11);
    }

    #[test]
    fn fused_and_reference_agree() {
        check_fused_vs_reference::<B>(
            &Default::default(),
            &[(1, 1), (5, 97), (4, 1031), (3, 4096)],
            12,
        );
    }

    #[test]
    fn kernel_choice_dispatches() {
        check_kernel_choice_dispatches::<Wgpu>(&Default::default());
    }

    #[test]
    fn recomputing_attention_matches_its_reference_twin() {
        check_attention_vs_reference::<B>(&Default::default(), 14);
        check_attention_by_hand::<B>(&Default::default());
        check_softmax_ops::<Wgpu>(&Default::default(), 18);
    }

    /// The one-pass rotary through the fusion stream, and its backward node.
    #[test]
    fn rotary_matches_its_reference_twin() {
        check_rotary_vs_reference::<B>(&Default::default(), 16);
    }

    /// Through the fusion stream (custom ops that run the Cube kernels).
    #[test]
    fn decode_kernels_match_their_reference_twins() {
        check_decode_ops::<Wgpu>(&Default::default(), 32);
        check_sample_rows::<Wgpu>(&Default::default(), 35);
    }

    #[test]
    fn low_precision_matches_f64_reference() {
        let ran = check_low_precision::<B>(&Default::default(), 13);
        // llvmpipe (CI) supports f16; a device with neither dtype skips, and says so above.
        if std::env::var_os("CI").is_some() {
            assert!(
                ran >= 1,
                "CI's Vulkan driver supports f16: nothing was checked"
            );
        }
    }
}

#[cfg(all(feature = "wgpu", feature = "fusion"))]
mod wgpu_cube {
    use super::*;
    use burn::backend::Autodiff;
    use burn::backend::wgpu::{CubeBackend, WgpuRuntime};

    type Raw = CubeBackend<WgpuRuntime, f32, i32, u32>;
    type B = Autodiff<Raw>;

    #[test]
    fn fused_ops_match_f64_reference() {
        check_against_f64::<B>(&Default::default(), FloatDType::F32, SHAPES, 21);
    }

    #[test]
    fn kernel_choice_dispatches() {
        check_kernel_choice_dispatches::<Raw>(&Default::default());
    }

    #[test]
    fn rotary_matches_its_reference_twin() {
        check_rotary_vs_reference::<B>(&Default::default(), 17);
    }

    #[test]
    fn recomputing_attention_matches_its_reference_twin() {
        check_attention_vs_reference::<B>(&Default::default(), 19);
        check_softmax_ops::<Raw>(&Default::default(), 20);
    }

    #[test]
    fn decode_kernels_match_their_reference_twins() {
        check_decode_ops::<Raw>(&Default::default(), 33);
        check_sample_rows::<Raw>(&Default::default(), 36);
    }

    /// The cached attention split over the keys (flash-decoding) against the composition:
    /// 61 keys over a capacity of 70 at head_dim 6 (chunks of 8), split into 1, 2, 3, 8 and 64
    /// parts (the last ones empty), with a per-row bias that masks the first keys — so that
    /// some parts see only masked keys.
    #[test]
    fn cached_attention_split_over_the_keys_matches_its_twin() {
        let device = Default::default();
        let host = Default::default();
        let mut rng = Rng(41);
        let (b, group, keys, cap) = (2, 2, 61, 70);
        let q = random(&mut rng, b * 2 * group * 6);
        let kb = random(&mut rng, b * 2 * cap * 6);
        let vb = random(&mut rng, b * 2 * cap * 6);
        let bias: Vec<f32> = (0..b * keys)
            .map(|i| {
                if i % keys < 9 * (i / keys + 1) {
                    -1.0e9
                } else {
                    rng.uniform(-1.0, 1.0)
                }
            })
            .collect();
        let bias_shape = [b, 1, 1, keys];
        let narrow =
            |data: &[f32]| tensor::<Host, 4>(data, [b, 2, cap, 6], &host).narrow(2, 0, keys);
        let want = to_vec(crate::reference_grouped_attention::<Host>(
            tensor(&q, [b, 2, group, 6], &host),
            narrow(&kb),
            narrow(&vb),
            Some(tensor(&bias, bias_shape, &host)),
            group,
        ));
        for splits in [1, 2, 3, 8, 64] {
            let prim = |data: &[f32], dims: [usize; 4]| {
                tensor::<Raw, 4>(data, dims, &device)
                    .into_primitive()
                    .tensor()
            };
            let got = crate::cube::decode::cached_attention(
                prim(&q, [b, 2, group, 6]),
                prim(&kb, [b, 2, cap, 6]),
                prim(&vb, [b, 2, cap, 6]),
                keys,
                Some(prim(&bias, bias_shape)),
                group,
                Some(splits),
            )
            .expect("head_dim 6 is served");
            let got = to_vec(Tensor::<Raw, 4>::from_primitive(
                burn::tensor::TensorPrimitive::Float(got),
            ));
            assert_near(&format!("{splits} parts"), &got, &want, 1e-5);
        }
    }
}

/// The KV cache's write (`AttentionOps::write_positions`): Flex's in-place override gives the
/// composition's values, and writes into the buffer it was given instead of a copy of it.
/// Flex's one-pass rotary ([`crate::AttentionOps::rotary`]) and its backward node.
#[cfg(feature = "flex")]
#[test]
fn flex_rotary_matches_its_reference_twin() {
    check_rotary_vs_reference::<burn::backend::Autodiff<burn::backend::Flex>>(
        &Default::default(),
        9,
    );
}

#[cfg(feature = "flex")]
mod flex_write_positions {
    use crate::AttentionOps;
    use burn::backend::Flex;
    use burn::prelude::*;
    use burn::tensor::{TensorData, TensorPrimitive};

    fn tensor(dims: [usize; 4], first: f32) -> Tensor<Flex, 4> {
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n).map(|i| first + i as f32).collect();
        Tensor::from_data(TensorData::new(values, dims), &Default::default())
    }

    fn write(buffer: Tensor<Flex, 4>, src: Tensor<Flex, 4>, at: usize) -> Tensor<Flex, 4> {
        let out = Flex::write_positions(
            buffer.into_primitive().tensor(),
            src.into_primitive().tensor(),
            at,
        );
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    #[test]
    fn equals_the_slice_assign_and_writes_in_place() {
        // Buffer [2, 3, 5, 4]; two positions written at 2, from a source that is not
        // contiguous (a swapped view), as the attention's rotated keys are.
        let buffer = tensor([2, 3, 5, 4], 0.0);
        let src = tensor([2, 2, 3, 4], 1000.0).swap_dims(1, 2);
        let expected = buffer
            .clone()
            .slice_assign([0..2, 0..3, 2..4, 0..4], src.clone())
            .into_data();
        let fresh = tensor([2, 3, 5, 4], 0.0);
        let before = fresh
            .clone()
            .into_primitive()
            .tensor()
            .storage::<f32>()
            .as_ptr();
        let out = write(fresh, src, 2);
        let after = out
            .clone()
            .into_primitive()
            .tensor()
            .storage::<f32>()
            .as_ptr();
        assert_eq!(out.into_data(), expected);
        assert_eq!(before, after, "written in place, not into a copy");
        // A spot value by hand: batch 1, head 2, position 3 (source position 1), element 0
        // is source [1, 1, 2, 0] of the [2, 2, 3, 4] source: 1000 + ((1*2 + 1)*3 + 2)*4.
        let got = write(
            tensor([2, 3, 5, 4], 0.0),
            tensor([2, 2, 3, 4], 1000.0).swap_dims(1, 2),
            2,
        )
        .slice([1..2, 2..3, 3..4, 0..1])
        .into_scalar();
        assert_eq!(got, 1000.0 + ((2 + 1) * 3 + 2) as f32 * 4.0);
    }

    #[test]
    fn an_empty_write_leaves_the_buffer_as_it_was() {
        // No position to write (the in-place path's chunk length would be 0).
        let out = write(tensor([1, 2, 3, 2], 0.0), tensor([1, 2, 0, 2], 9.0), 1);
        assert_eq!(out.into_data(), tensor([1, 2, 3, 2], 0.0).into_data());
    }

    #[test]
    fn a_shared_buffer_is_left_untouched() {
        // The cache's buffer must not change under a view someone else still holds.
        let buffer = tensor([1, 1, 3, 2], 0.0);
        let held = buffer.clone();
        let out = write(buffer, tensor([1, 1, 1, 2], 50.0), 1);
        assert_eq!(
            held.into_data().to_vec::<f32>().expect("f32"),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(
            out.into_data().to_vec::<f32>().expect("f32"),
            vec![0.0, 1.0, 50.0, 51.0, 4.0, 5.0]
        );
    }
}
