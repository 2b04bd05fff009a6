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

/// The flat positions `row · seq + j` whose weight is positive: the targets a loss scores,
/// where [`CausalLm::logits_at`] runs the LM head. When none is, position 0 (which then
/// weighs 0), so that a shard with nothing to score still builds a graph of the batch's
/// shape.
pub fn scored_positions(weight: &[f32]) -> Vec<usize> {
    let picked: Vec<usize> = (0..weight.len()).filter(|&i| weight[i] > 0.0).collect();
    if picked.is_empty() { vec![0] } else { picked }
}

/// `values` (a host `[batch, seq]` array, flattened) at `positions`, in their order.
pub fn at_positions(values: &[f32], positions: &[usize]) -> Vec<f32> {
    positions.iter().map(|&p| values[p]).collect()
}

/// Log-probability of the target token at each flat position `row · seq + j` of `positions`
/// under `model`, the LM head run at those positions only, computed by `kernels`.
///
/// # Shapes
/// - output: `[positions.len()]`
pub fn scored_logprobs<B: LogProbOps, M: CausalLm<B>>(
    model: &M,
    batch: &TokenBatch<B>,
    positions: &[usize],
    kernels: KernelChoice,
) -> Tensor<B, 1> {
    logprobs_at(
        model.logits_at(batch.inputs.clone(), positions),
        batch,
        positions,
        kernels,
    )
}

/// Log-probability of the target tokens at `positions` from logits already computed there.
///
/// # Shapes
/// - `logits`: `[positions.len(), vocab]` (from [`CausalLm::logits_at`])
/// - output: `[positions.len()]`
pub fn logprobs_at<B: LogProbOps>(
    logits: Tensor<B, 2>,
    batch: &TokenBatch<B>,
    positions: &[usize],
    kernels: KernelChoice,
) -> Tensor<B, 1> {
    let index: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
    let index =
        Tensor::<B, 1, Int>::from_data(TensorData::new(index, [positions.len()]), &logits.device());
    // [batch, seq] → [batch·seq] → the scored positions → [n]
    let targets = batch
        .targets
        .clone()
        .reshape([batch.batch * batch.seq])
        .select(0, index);
    kernels.token_logprobs(logits, targets)
}

/// The summed entropy of the distributions given by `logits` over the rows whose weight is
/// positive, and their count (shards add these up before dividing).
///
/// # Shapes
/// - `logits`: `[n, vocab]`
/// - `weight`: `n` values
pub fn entropy_sum<B: Backend>(logits: Tensor<B, 2>, weight: &[f32]) -> (f64, f64) {
    let n = logits.dims()[0];
    let mask: Vec<f32> = weight
        .iter()
        .map(|&w| if w > 0.0 { 1.0 } else { 0.0 })
        .collect();
    let count = mask.iter().map(|&m| f64::from(m)).sum::<f64>();
    if count == 0.0 {
        return (0.0, 0.0);
    }
    let logp = burn::tensor::activation::log_softmax(logits, 1);
    // [n, vocab] → [n, 1] → [n]
    let ent = (logp.clone().exp() * logp).sum_dim(1).neg().reshape([n]);
    let mask = Tensor::<B, 1>::from_data(TensorData::new(mask, [n]), &ent.device());
    ((ent * mask).sum().into_scalar().elem::<f64>(), count)
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
    fn scored_positions_are_the_positive_weights_or_one_empty_slot() {
        assert_eq!(scored_positions(&[0.0, 0.5, 0.0, 0.25, -1.0]), vec![1, 3]);
        assert_eq!(scored_positions(&[0.0, 0.0]), vec![0]);
        assert_eq!(at_positions(&[4.0, 5.0, 6.0, 7.0], &[3, 1]), vec![7.0, 5.0]);
    }

    /// Hand-computed: the targets at positions 1 and 3 of a 2 × 2 batch, with logits
    /// `[0, ln 3]` (p = 1/4, 3/4) and `[ln 2, 0]` (p = 2/3, 1/3); the entropy of the first.
    #[test]
    fn logprobs_and_entropy_at_positions_by_hand() {
        type B = NdArray<f32>;
        let dev = Default::default();
        let a = [1u32, 5, 1];
        let b = [1u32, 0, 1];
        let tb = token_batch::<B>(&[&a, &b], 0, 100, &dev);
        // targets: [5, 1, 0, 1]; positions 1 and 3 both predict token 1.
        let off = -1e9f32; // tokens 2..6: probability 0
        let (l3, l2) = (3f32.ln(), 2f32.ln());
        let logits = Tensor::<B, 1>::from_floats(
            [0.0, l3, off, off, off, off, l2, 0.0, off, off, off, off],
            &dev,
        )
        .reshape([2, 6]);
        for kernels in [KernelChoice::Fused, KernelChoice::Reference] {
            let lp = logprobs_at(logits.clone(), &tb, &[1, 3], kernels)
                .into_data()
                .to_vec::<f32>()
                .expect("f32");
            assert!((lp[0] - 0.75f32.ln()).abs() < 1e-5, "{lp:?}");
            assert!((lp[1] - (1.0f32 / 3.0).ln()).abs() < 1e-5, "{lp:?}");
        }
        let (sum, n) = entropy_sum(logits, &[1.0, 0.0]);
        let want = -(0.25f64 * 0.25f64.ln() + 0.75 * 0.75f64.ln());
        assert_eq!(n, 1.0);
        assert!((sum - want).abs() < 1e-5, "{sum} vs {want}");
    }

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
