//! Fused ops against a float64 CPU reference (plain `Vec<f64>`), forward and gradients, on
//! fresh seeded random inputs, at shapes including N = 1, V = 1, V prime, V below and above a
//! workgroup and V = 151936. Always on NdArray; on wgpu (and `Autodiff<Wgpu>`) with the `wgpu`
//! feature, plus fused-vs-reference agreement and bf16/f16 where the device supports them.

use crate::{AutodiffLogProbOps, LogProbOps, fused, reference};
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
}
