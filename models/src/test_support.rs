//! What the crate's unit tests share, written once: the tiny configuration most of them use,
//! models whose every weight is drawn from our own [`Rng`] (not Burn's global seed, which
//! tests running in parallel share), and logits read back to the host.

use burn::backend::NdArray;
use burn::module::Param;
use burn::prelude::*;
use rlany_framework::{CausalLm, Rng};

use crate::transformer::{Transformer, TransformerConfig};

/// The backend of the unit tests.
pub(crate) type B = NdArray;

/// Vocabulary 100, `d_model` 32, 2 layers, 4 query heads over 2 K/V heads, MLP 64, context 64.
pub(crate) fn tiny() -> TransformerConfig {
    TransformerConfig::new(100, 32, 2, 4, 2, 64, 64)
}

/// Replaces every float parameter with values drawn from our own [`Rng`], so test
/// models do not depend on Burn's global seed (shared by tests running in parallel).
struct Reseed(Rng);
impl<BB: Backend> burn::module::ModuleMapper<BB> for Reseed {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<BB, D>>) -> Param<Tensor<BB, D>> {
        param.map(|t| {
            let shape = t.shape();
            let dims = shape.as_slice().to_vec();
            let n: usize = dims.iter().product();
            let values: Vec<f32> = if dims.len() == 1 {
                // Norm gains and biases.
                (0..n)
                    .map(|_| (1.0 + 0.1 * self.0.normal()) as f32)
                    .collect()
            } else {
                let a = 1.0 / (dims[0] as f64).sqrt();
                (0..n)
                    .map(|_| (a * (2.0 * self.0.uniform() - 1.0)) as f32)
                    .collect()
            };
            Tensor::from_data(TensorData::new(values, shape), &t.device())
                .set_require_grad(t.is_require_grad())
        })
    }
}

/// `config` with every weight drawn from `Rng::new(seed)` (on any backend).
pub(crate) fn seeded<BB: Backend>(config: &TransformerConfig, seed: u64) -> Transformer<BB> {
    let model = config
        .init::<BB>(&Default::default())
        .expect("valid config");
    model.map(&mut Reseed(Rng::new(seed)))
}

/// `config` on the tests' backend, seeded as [`seeded`].
pub(crate) fn model(config: &TransformerConfig, seed: u64) -> Transformer<B> {
    seeded::<B>(config, seed)
}

pub(crate) fn int_tensor(rows: &[Vec<i64>]) -> Tensor<B, 2, Int> {
    let width = rows[0].len();
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(
        TensorData::new(flat, [rows.len(), width]),
        &Default::default(),
    )
}

pub(crate) fn to_vec(t: Tensor<B, 3>) -> (Vec<f32>, [usize; 3]) {
    let dims = t.dims();
    (t.into_data().iter::<f32>().collect(), dims)
}

/// `[seq, vocab]` logits of one unpadded row through `CausalLm::forward`.
pub(crate) fn row_logits(model: &Transformer<B>, row: &[u32]) -> Vec<Vec<f32>> {
    let ids: Vec<i64> = row.iter().map(|&t| i64::from(t)).collect();
    let (flat, [_, seq, vocab]) = to_vec(CausalLm::forward(model, int_tensor(&[ids])));
    (0..seq)
        .map(|i| flat[i * vocab..(i + 1) * vocab].to_vec())
        .collect()
}

pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub(crate) fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}
