//! Reference twins: composed Burn ops, differentiable on any autodiff backend.

use burn::prelude::*;
use burn::tensor::activation::log_softmax;

/// Log-probability of each row's target id: `log_softmax(logits)[n, targets[n]]`.
///
/// # Shapes
/// - `logits`: `[n, vocab]`
/// - `targets`: `[n]`
/// - output: `[n]`
pub fn token_logprobs<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let [n, _vocab] = logits.dims();
    let logp = log_softmax(logits, 1);
    // [n, 1]
    logp.gather(1, targets.reshape([n, 1])).reshape([n])
}

/// Full-vocabulary `KL(softmax(p) ‖ softmax(q))` per row.
///
/// # Shapes
/// - `p_logits`, `q_logits`: `[n, vocab]`
/// - output: `[n]`
pub fn kl_full<B: Backend>(p_logits: Tensor<B, 2>, q_logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let [n, _vocab] = p_logits.dims();
    let logp = log_softmax(p_logits, 1);
    let logq = log_softmax(q_logits, 1);
    // [n, 1]
    (logp.clone().exp() * (logp - logq)).sum_dim(1).reshape([n])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type B = NdArray<f32>;

    #[test]
    fn token_logprobs_hand_computed() {
        let dev = Default::default();
        // Row 0: logits [0, ln 3] → probs [1/4, 3/4]; target 1 → ln 0.75.
        // Row 1: logits [2, 2] → probs [1/2, 1/2]; target 0 → ln 0.5.
        let logits = Tensor::<B, 2>::from_floats([[0.0, 3.0f32.ln()], [2.0, 2.0]], &dev);
        let targets = Tensor::<B, 1, Int>::from_ints([1, 0], &dev);
        let lp = token_logprobs(logits, targets)
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        assert!((lp[0] - 0.75f32.ln()).abs() < 1e-6);
        assert!((lp[1] - 0.5f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn kl_full_hand_computed() {
        let dev = Default::default();
        // p = [1/4, 3/4], q = [1/2, 1/2]: KL = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.130812
        let p = Tensor::<B, 2>::from_floats([[0.0, 3.0f32.ln()]], &dev);
        let q = Tensor::<B, 2>::from_floats([[1.0, 1.0]], &dev);
        let kl = kl_full(p.clone(), q).into_scalar();
        assert!((kl - 0.130_812).abs() < 1e-5, "{kl}");
        assert!(kl_full(p.clone(), p).into_scalar().abs() < 1e-7);
    }
}
