//! Token sequences → right-padded tensors, and per-token log-probs of a batch.
//!
//! A sequence `s` of length `n` becomes inputs `s[..n−1]` and targets `s[1..]`: target
//! position `j` predicts token `j + 1`. Host-side per-token arrays (advantages, weights,
//! old log-probs) use the same `[row, j]` layout, flattened row-major.

use crate::lm::CausalLm;
use burn::prelude::*;
use rlany_kernels::{KernelChoice, LogProbOps};

/// A right-padded batch of next-token prediction targets.
#[derive(Debug, Clone)]
pub struct TokenBatch<B: Backend> {
    /// `[batch, seq]` input ids.
    pub inputs: Tensor<B, 2, Int>,
    /// `[batch, seq]` target ids (padding where a row is shorter).
    pub targets: Tensor<B, 2, Int>,
    /// Rows.
    pub batch: usize,
    /// Target positions per row (longest sequence − 1).
    pub seq: usize,
}

/// Builds a batch from sequences (each at least 2 tokens long), truncated to `max_len` tokens.
pub fn token_batch<B: Backend>(
    seqs: &[&[u32]],
    pad: u32,
    max_len: usize,
    device: &B::Device,
) -> TokenBatch<B> {
    let batch = seqs.len();
    let seq = seqs
        .iter()
        .map(|s| s.len().min(max_len).saturating_sub(1))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut inputs = vec![i64::from(pad); batch * seq];
    let mut targets = vec![i64::from(pad); batch * seq];
    for (r, s) in seqs.iter().enumerate() {
        let s = &s[..s.len().min(max_len)];
        for j in 0..s.len().saturating_sub(1) {
            inputs[r * seq + j] = i64::from(s[j]);
            targets[r * seq + j] = i64::from(s[j + 1]);
        }
    }
    TokenBatch {
        inputs: Tensor::from_data(TensorData::new(inputs, [batch, seq]), device),
        targets: Tensor::from_data(TensorData::new(targets, [batch, seq]), device),
        batch,
        seq,
    }
}

/// Log-probability of every target token under `model`, computed by `kernels` (the fused
/// one-pass kernel or the composed reference).
///
/// # Shapes
/// - output: `[batch, seq]`
pub fn sequence_logprobs<B: LogProbOps, M: CausalLm<B>>(
    model: &M,
    batch: &TokenBatch<B>,
    kernels: KernelChoice,
) -> Tensor<B, 2> {
    target_logprobs(model.forward(batch.inputs.clone()), batch, kernels)
}

/// Log-probability of every target token from already computed logits.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`
/// - output: `[batch, seq]`
pub fn target_logprobs<B: LogProbOps>(
    logits: Tensor<B, 3>,
    batch: &TokenBatch<B>,
    kernels: KernelChoice,
) -> Tensor<B, 2> {
    let [b, t, v] = logits.dims();
    // [b·t, v] → [b·t] → [b, t]
    kernels
        .token_logprobs(
            logits.reshape([b * t, v]),
            batch.targets.clone().reshape([b * t]),
        )
        .reshape([b, t])
}

/// Mean per-token entropy of the distribution given by `logits` over the positions where
/// `weight > 0`.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`
/// - `weight`: `[batch, seq]`
pub fn weighted_entropy<B: Backend>(logits: Tensor<B, 3>, weight: Tensor<B, 2>) -> f64 {
    let (sum, n) = entropy_sum(logits, weight);
    if n == 0.0 {
        return 0.0;
    }
    sum / n
}

/// The summed per-token entropy over the positions where `weight > 0`, and their count
/// (what [`weighted_entropy`] divides; shards add these up).
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`
/// - `weight`: `[batch, seq]`
pub fn entropy_sum<B: Backend>(logits: Tensor<B, 3>, weight: Tensor<B, 2>) -> (f64, f64) {
    let logp = burn::tensor::activation::log_softmax(logits, 2);
    // [b, t, 1] → [b, t]
    let ent = (logp.clone().exp() * logp)
        .sum_dim(2)
        .neg()
        .squeeze_dim::<2>(2);
    let mask = weight.greater_elem(0.0).float();
    let n = mask.clone().sum().into_scalar().elem::<f64>();
    if n == 0.0 {
        return (0.0, 0.0);
    }
    ((ent * mask).sum().into_scalar().elem::<f64>(), n)
}

/// A host array `[batch, seq]` as a float tensor.
pub fn host_tensor<B: Backend>(
    values: Vec<f32>,
    batch: usize,
    seq: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [batch, seq]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    #[test]
    fn shifted_and_right_padded() {
        let a = [1u32, 5, 6, 7];
        let b = [1u32, 9];
        let tb = token_batch::<NdArray<f32>>(&[&a, &b], 0, 100, &Default::default());
        assert_eq!((tb.batch, tb.seq), (2, 3));
        let inp = tb.inputs.into_data().to_vec::<i64>().expect("i64");
        let tgt = tb.targets.into_data().to_vec::<i64>().expect("i64");
        assert_eq!(inp, vec![1, 5, 6, 1, 0, 0]);
        assert_eq!(tgt, vec![5, 6, 7, 9, 0, 0]);
    }
}
