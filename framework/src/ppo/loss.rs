//! The PPO-clip objective with a per-token KL penalty (framework/METHOD.md, step 6).
//!
//! Every tensor here is `[batch, seq]` over the target tokens of a right-padded batch;
//! `weight` is zero on tokens that are not trained (prompt, observations, padding, dropped
//! steps) and `1 / (tokens in the step) / (steps in the minibatch)` on the others, so the
//! loss is the per-token surrogate averaged over each step's tokens, then over steps.

use burn::prelude::*;

/// A per-token KL estimator from the log-probs of the sampled token alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampledKl {
    /// `−log r`.
    K1,
    /// `½ (log r)²`.
    K2,
    /// `r − 1 − log r`.
    K3,
}

/// The KL term of the loss: estimated from sampled-token log-probs, or exact.
#[derive(Debug)]
pub enum KlTerm<B: Backend> {
    /// `estimator(new_lp, target_lp)` per token.
    Sampled {
        /// The target's log-probs of the sampled tokens, `[batch, seq]`.
        target_lp: Tensor<B, 2>,
        /// Which estimator.
        estimator: SampledKl,
    },
    /// The exact per-position KL over the vocabulary, already computed, `[batch, seq]`.
    Exact(Tensor<B, 2>),
}

/// Per-token KL estimate of `KL(π ‖ target)` from log-probs of tokens sampled by the
/// rollout policy (Schulman 2020), with `log r = target − new`:
/// k1 = −log r, k2 = ½ (log r)², k3 = exp(log r) − 1 − log r.
///
/// # Shapes
/// - `new_lp`, `target_lp`: `[batch, seq]`
/// - output: `[batch, seq]`
pub fn kl_estimate<B: Backend>(
    estimator: SampledKl,
    new_lp: Tensor<B, 2>,
    target_lp: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let log_r = target_lp - new_lp;
    match estimator {
        SampledKl::K1 => log_r.neg(),
        SampledKl::K2 => log_r.powi_scalar(2).mul_scalar(0.5),
        SampledKl::K3 => log_r.clone().exp() - log_r - 1.0,
    }
}

/// The scalar loss and its diagnostics for one minibatch.
#[derive(Debug)]
pub struct PpoLoss<B: Backend> {
    /// `Σ w · (−surrogate + β · kl)`: the quantity to minimise.
    pub loss: Tensor<B, 1>,
    /// `Σ w · kl`.
    pub kl: Tensor<B, 1>,
    /// Weighted fraction of tokens whose ratio was clipped.
    pub clipfrac: Tensor<B, 1>,
}

/// PPO-clip surrogate plus KL.
///
/// # Shapes
/// - `new_lp`, `old_lp`, `adv`, `weight` and the tensors of `kl`: `[batch, seq]`
/// - outputs: `[1]`
pub fn ppo_loss<B: Backend>(
    new_lp: Tensor<B, 2>,
    old_lp: Tensor<B, 2>,
    kl: KlTerm<B>,
    adv: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    clip: f64,
    kl_coef: f64,
) -> PpoLoss<B> {
    // The loss is taken in f32 whatever the model's dtype: a bf16 model's log-probs meet the
    // f32 old log-probs, advantages and weights made on the host, and a fused backend refuses
    // a binary op between two dtypes (seen on CUDA: `DTypeMismatch` in the first `sub`).
    let new_lp = in_f32(new_lp);
    let old_lp = in_f32(old_lp);
    let adv = in_f32(adv);
    let weight = in_f32(weight);
    let ratio = (new_lp.clone() - old_lp).exp();
    let unclipped = ratio.clone() * adv.clone();
    let clipped = ratio.clone().clamp(1.0 - clip, 1.0 + clip) * adv;
    let surrogate = unclipped.clone().min_pair(clipped.clone());
    let was_clipped = unclipped.not_equal(surrogate.clone()).float();
    let kl = match kl {
        KlTerm::Sampled {
            target_lp,
            estimator,
        } => kl_estimate(estimator, new_lp, in_f32(target_lp)),
        KlTerm::Exact(kl) => in_f32(kl),
    };
    let per_token = surrogate.neg() + kl.clone().mul_scalar(kl_coef);
    PpoLoss {
        loss: (per_token * weight.clone()).sum(),
        kl: (kl * weight.clone()).sum().detach(),
        clipfrac: (was_clipped * weight.clone()).sum().detach()
            / weight.sum().detach().clamp_min(1e-12),
    }
}

/// `t` in f32: itself when it already is, else a (differentiable) cast. The model's logits
/// leave it through this, and the loss takes its inputs through it.
pub fn in_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    if t.dtype() == burn::tensor::DType::F32 {
        t
    } else {
        t.cast(burn::tensor::DType::F32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type B = NdArray<f32>;

    fn t(v: &[f32]) -> Tensor<B, 2> {
        Tensor::<B, 1>::from_floats(v, &Default::default()).reshape([1, v.len()])
    }

    fn host(x: Tensor<B, 2>) -> Vec<f32> {
        x.into_data().to_vec::<f32>().expect("f32")
    }

    #[test]
    fn kl_estimators_hand_computed() {
        // new = ln 0.5, target = ln 0.25: log r = ln 0.5 = −0.693147
        let new = t(&[0.5f32.ln(), 0.3f32.ln()]);
        let tgt = t(&[0.25f32.ln(), 0.3f32.ln()]);
        let k1 = host(kl_estimate(SampledKl::K1, new.clone(), tgt.clone()));
        let k2 = host(kl_estimate(SampledKl::K2, new.clone(), tgt.clone()));
        let k3 = host(kl_estimate(SampledKl::K3, new, tgt));
        let ln2 = std::f32::consts::LN_2;
        assert!((k1[0] - ln2).abs() < 1e-5);
        assert!((k2[0] - 0.5 * ln2 * ln2).abs() < 1e-5); // 0.240227
        assert!((k3[0] - (0.5 - 1.0 + ln2)).abs() < 1e-5); // 0.193147
        for k in [k1[1], k2[1], k3[1]] {
            assert!(k.abs() < 1e-7, "equal log-probs give zero KL");
        }
    }

    /// The hand-computed minibatch: the loss of `new` (the model's log-probs, in any dtype)
    /// against zero old log-probs, K3 KL to them at coefficient 0, clip 0.2.
    /// Token 0: ratio 1.5, A = +1 → clipped to 1.2 (surrogate 1.2).
    /// Token 1: ratio 0.5, A = +1 → min(0.5, 0.8) = 0.5, not clipped.
    /// Token 2: ratio 0.5, A = −2 → min(−1.0, −1.6) = −1.6, clipped.
    /// Token 3: weight 0 (ignored).
    /// Loss −(0.25·1.2 + 0.25·0.5 + 0.5·(−1.6)) = −(0.3 + 0.125 − 0.8) = 0.375; clipfrac 0.75.
    fn hand_computed(new: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>) -> PpoLoss<B> {
        let old = t(&[0.0, 0.0, 0.0, 0.0]);
        let new = new(t(&[1.5f32.ln(), 0.5f32.ln(), 0.5f32.ln(), 3.0]));
        let adv = t(&[1.0, 1.0, -2.0, 5.0]);
        let w = t(&[0.25, 0.25, 0.5, 0.0]);
        let kl = KlTerm::Sampled {
            target_lp: old.clone(),
            estimator: SampledKl::K3,
        };
        ppo_loss(new, old, kl, adv, w, 0.2, 0.0)
    }

    #[test]
    fn clipped_surrogate_hand_computed() {
        let out = hand_computed(|new| new);
        let loss = out.loss.into_scalar();
        assert!((loss - 0.375).abs() < 1e-5, "{loss}");
        let cf = out.clipfrac.into_scalar();
        assert!((cf - 0.75).abs() < 1e-6, "{cf}");
    }

    #[test]
    fn log_probs_in_another_dtype_give_the_same_f32_loss() {
        // The model's log-probs in f64 (standing in for a bf16 model's), everything else f32:
        // the loss is computed in f32 and equals the all-f32 one (0.375).
        let out = hand_computed(|new| {
            let new = new.cast(burn::tensor::DType::F64);
            assert_eq!(new.dtype(), burn::tensor::DType::F64);
            new
        });
        assert_eq!(out.loss.dtype(), burn::tensor::DType::F32);
        let loss = out.loss.into_scalar();
        assert!((loss - 0.375).abs() < 1e-5, "{loss}");
    }
}
