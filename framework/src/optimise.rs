//! One data-parallel optimiser step, the one every update takes (PPO's minibatches in
//! [`crate::ppo::update`], the supervised warm starts in [`crate::warmstart`]):
//!
//! 1. the batch's rows are cut into contiguous groups — one per shard, or more when
//!    `micro_batch` caps a group's rows ([`crate::shard::ranges`]);
//! 2. every group's loss is run forward and backward, `shards` groups at a time on threads of
//!    their own, over the peers of the placement ([`crate::shard::grads_in_waves`]), and the
//!    groups' gradients are summed in group order;
//! 3. every group's loss must be finite;
//! 4. the summed gradients are clipped to the global norm and the optimiser steps
//!    ([`crate::ppo::clip::apply`]);
//! 5. the norm (before clipping) must be finite.
//!
//! A loss that is a sum over rows (each group's loss weighs its rows against the whole batch)
//! has the whole batch's gradient as the sum of its groups' gradients, so the groups change
//! only how the float sums are grouped (framework/METHOD.md, "Shards").

use std::ops::Range;

use crate::placement::PlacementError;
use crate::shard::Spread;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How one optimiser step runs.
#[derive(Debug, Clone, Copy)]
pub struct StepSpec<'a> {
    /// Where the groups run: `shards` at a time, a thread each, over the peers.
    pub spread: &'a Spread,
    /// Most rows in one forward and backward pass (0: no limit); a batch with more is cut
    /// into more groups than shards, accumulated `shards` at a time.
    pub micro_batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
}

/// What one group's loss closure reports besides the loss tensor: at least the loss's value,
/// which the step checks is finite.
pub trait GroupResult {
    /// The group's loss value.
    fn loss(&self) -> f64;
}

impl GroupResult for f64 {
    fn loss(&self) -> f64 {
        *self
    }
}

/// The outcome of one optimiser step.
#[derive(Debug)]
pub struct Stepped<M, R> {
    /// The stepped model.
    pub model: M,
    /// Every group's result, in row order.
    pub parts: Vec<R>,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
}

/// Why an optimiser step (and the update it belongs to) stopped.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A quantity went NaN or infinite: which one (`loss`, `gradient norm`).
    #[error("the {0} is not finite")]
    NonFinite(&'static str),
    /// Exchanging the groups' results between peers failed.
    #[error(transparent)]
    Placement(#[from] PlacementError),
}

/// One optimiser step of `model` on the batch `rows` (see the module docs): `group` makes a
/// group's input from its rows, `loss` returns the group's loss (a sum over its rows, weighed
/// against the whole batch) and its result. A single group runs on `model` itself, on this
/// thread.
///
/// # Shapes
/// - `loss`'s tensor: `[1]` (a scalar)
pub fn step<'r, B, M, O, T, G, R>(
    model: M,
    optim: &mut O,
    spec: &StepSpec<'_>,
    rows: &'r [T],
    group: impl FnMut(&'r [T]) -> G,
    loss: impl Fn(&M, G) -> (Tensor<B, 1>, R) + Sync,
) -> Result<Stepped<M, R>, StepError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    G: Send,
    R: GroupResult + Send + Serialize + DeserializeOwned,
{
    let inputs: Vec<G> = groups(rows.len(), spec)
        .into_iter()
        .map(|r| &rows[r])
        .map(group)
        .collect();
    let threads = spec.spread.shards;
    let (grads, parts) =
        crate::shard::grads_in_waves(&spec.spread.placement, &model, inputs, threads, loss)?;
    if !parts.iter().all(|p| p.loss().is_finite()) {
        return Err(StepError::NonFinite("loss"));
    }
    let (model, grad_norm) =
        crate::ppo::clip::apply(model, optim, grads, spec.lr, spec.max_grad_norm);
    if !grad_norm.is_finite() {
        return Err(StepError::NonFinite("gradient norm"));
    }
    Ok(Stepped {
        model,
        parts,
        grad_norm,
    })
}

/// The row ranges of a batch of `rows`: one group per shard, or more when `micro_batch` caps
/// a group's rows.
fn groups(rows: usize, spec: &StepSpec<'_>) -> Vec<Range<usize>> {
    let shards = spec.spread.shards;
    let n = match spec.micro_batch {
        0 => shards,
        m => shards.max(rows.div_ceil(m)),
    };
    crate::shard::ranges(rows, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(shards: usize, micro_batch: usize) -> (Spread, usize) {
        (
            Spread {
                shards,
                ..Spread::default()
            },
            micro_batch,
        )
    }

    #[test]
    fn groups_are_one_per_shard_unless_micro_batches_need_more() {
        let at = |(spread, micro_batch): (Spread, usize), rows| {
            groups(
                rows,
                &StepSpec {
                    spread: &spread,
                    micro_batch,
                    lr: 0.0,
                    max_grad_norm: 1.0,
                },
            )
        };
        assert_eq!(at(spec(1, 0), 7), vec![0..7]);
        assert_eq!(at(spec(2, 0), 7), vec![0..4, 4..7]);
        // Micro-batches of 3 rows: 3 groups, on one shard or two.
        assert_eq!(at(spec(1, 3), 7), vec![0..3, 3..5, 5..7]);
        assert_eq!(at(spec(2, 3), 7), vec![0..3, 3..5, 5..7]);
        // A cap the shards already meet changes nothing.
        assert_eq!(at(spec(2, 4), 7), vec![0..4, 4..7]);
    }

    /// A step in micro-batches of one row reports every row's loss in row order and the one
    /// batch's gradient norm; a non-finite loss in any row group stops the step.
    #[test]
    fn a_step_reports_its_groups_and_stops_on_a_non_finite_loss() {
        use burn::backend::{Autodiff, NdArray};
        use burn::nn::{Linear, LinearConfig};
        use burn::optim::AdamWConfig;
        type B = Autodiff<NdArray<f32>>;
        let device = Default::default();
        let layer: Linear<B> = LinearConfig::new(1, 1)
            .with_initializer(burn::nn::Initializer::Constant { value: 0.5 })
            .init(&device);
        // Each row group's loss: the sum of its rows' outputs.
        let loss = |m: &Linear<B>, xs: &[f32]| {
            let x = Tensor::<B, 1>::from_floats(xs, &device).reshape([xs.len(), 1]);
            let loss = m.forward(x).sum();
            let value = loss.clone().into_scalar().elem::<f64>();
            (loss, value)
        };
        let run = |rows: &[f32], micro_batch| {
            let spread = Spread::default();
            let spec = StepSpec {
                spread: &spread,
                micro_batch,
                lr: 0.1,
                max_grad_norm: 100.0,
            };
            let mut optim = AdamWConfig::new().init();
            step(layer.clone(), &mut optim, &spec, rows, |r| r, loss)
        };
        let whole = run(&[1.0, 2.0, 3.0], 0).expect("finite");
        let rows = run(&[1.0, 2.0, 3.0], 1).expect("finite");
        assert_eq!((whole.parts.len(), rows.parts.len()), (1, 3));
        let sum: f64 = rows.parts.iter().sum();
        assert!(
            (sum - whole.parts[0]).abs() < 1e-5,
            "{sum} vs {}",
            whole.parts[0]
        );
        // d/dw Σ (w x + b) = Σ x = 6, d/db = 3: the norm √45 whatever the grouping.
        for s in [&whole, &rows] {
            assert!((s.grad_norm - 45f64.sqrt()).abs() < 1e-5, "{}", s.grad_norm);
        }
        let bad = run(&[1.0, f32::NAN, 3.0], 1);
        assert!(matches!(bad, Err(StepError::NonFinite("loss"))), "{bad:?}");
    }
}
