//! Data-parallel shards: one optimiser step's batch split into row groups, each run forward
//! and backward on its own thread with its own copy of the parameter leaves, the gradients
//! summed in shard order (framework/METHOD.md, "Shards"; rollouts are sharded in
//! [`crate::rollout::rollout_sharded`]).
//!
//! A loss that is a sum over rows (every loss here is: the warm starts' token sum over a
//! count of the whole batch, PPO's weighted sum) has the gradient of the whole batch as the
//! sum of its shards' gradients. The sum runs in shard order, whatever order the threads
//! finish in, so a run is as deterministic with shards as without; but its float sums are
//! grouped differently than one batch's, which is why the number of shards is part of the
//! experiment. Burn's autodiff keeps one graph per connected set of nodes, so each shard gets
//! fresh leaves for the same parameters ([`fork`]): the shards' graphs stay apart and their
//! backward passes run at the same time.

use std::ops::Range;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// `rows` split into at most `shards` contiguous, non-empty ranges whose sizes differ by at
/// most one (the first ones are the longer).
pub fn ranges(rows: usize, shards: usize) -> Vec<Range<usize>> {
    let n = shards.clamp(1, rows.max(1));
    let (base, extra) = (rows / n, rows % n);
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        out.push(start..start + len);
        start += len;
    }
    out
}

struct Fork;

impl<B: AutodiffBackend> ModuleMapper<B> for Fork {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.map(|t| {
            if t.is_require_grad() {
                t.detach().require_grad()
            } else {
                t
            }
        })
    }
}

/// A copy of `model` whose trainable parameters are new graph leaves with the same values
/// and the same [`ParamId`](burn::module::ParamId)s (so its gradients are the model's).
pub fn fork<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> M {
    model.clone().map(&mut Fork)
}

struct Sum<'a> {
    parts: &'a mut [GradientsParams],
    total: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Sum<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let mut sum: Option<Tensor<B::InnerBackend, D>> = None;
        for part in self.parts.iter_mut() {
            if let Some(g) = part.remove::<B::InnerBackend, D>(param.id) {
                sum = Some(match sum {
                    Some(s) => s + g,
                    None => g,
                });
            }
        }
        if let Some(s) = sum {
            self.total.register(param.id, s);
        }
    }
}

/// `f(input)` for every input, each on its own thread (a single input on this one); the
/// results in input order. A panic in one is re-raised here.
pub fn map<T: Send, R: Send>(inputs: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    if inputs.len() <= 1 {
        return inputs.into_iter().map(f).collect();
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .into_iter()
            .map(|input| scope.spawn(move || f(input)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Runs `loss(model copy, input)` for every input on its own thread, backward included, and
/// returns the summed gradients (keyed by `model`'s parameters) with each shard's extra
/// result, in input order. A panic in a shard is re-raised here. A single input runs on
/// `model` itself, on this thread: exactly one batch's backward, as without shards.
pub fn grads<B, M, T, R, F>(model: &M, inputs: Vec<T>, loss: F) -> (GradientsParams, Vec<R>)
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    T: Send,
    R: Send,
    F: Fn(&M, T) -> (Tensor<B, 1>, R) + Sync,
{
    let results: Vec<(GradientsParams, R)> = if inputs.len() <= 1 {
        let results = inputs.into_iter().map(|input| {
            let (value, extra) = loss(model, input);
            (GradientsParams::from_grads(value.backward(), model), extra)
        });
        results.collect()
    } else {
        let shards: Vec<(M, T)> = inputs.into_iter().map(|t| (fork(model), t)).collect();
        map(shards, |(copy, input)| {
            let (value, extra) = loss(&copy, input);
            (GradientsParams::from_grads(value.backward(), &copy), extra)
        })
    };
    let (mut parts, extras): (Vec<_>, Vec<_>) = results.into_iter().unzip();
    let mut sum = Sum {
        parts: &mut parts,
        total: GradientsParams::new(),
    };
    model.visit::<Sum<'_>>(&mut sum);
    (sum.total, extras)
}

/// [`grads`] with at most `threads` inputs in flight: the inputs run in waves of `threads`
/// (each wave as [`grads`], in input order), and the waves' gradients are summed in wave order.
/// Peak memory is that of one wave, so a batch larger than memory can be split into many
/// small row groups (gradient accumulation). One wave is exactly [`grads`].
pub fn grads_in_waves<B, M, T, R, F>(
    model: &M,
    inputs: Vec<T>,
    threads: usize,
    loss: F,
) -> (GradientsParams, Vec<R>)
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    T: Send,
    R: Send,
    F: Fn(&M, T) -> (Tensor<B, 1>, R) + Sync,
{
    let threads = threads.max(1);
    if inputs.len() <= threads {
        return grads(model, inputs, loss);
    }
    let mut waves: Vec<GradientsParams> = Vec::new();
    let mut extras = Vec::with_capacity(inputs.len());
    let mut rest = inputs.into_iter().peekable();
    while rest.peek().is_some() {
        let wave: Vec<T> = rest.by_ref().take(threads).collect();
        let (g, e) = grads(model, wave, &loss);
        extras.extend(e);
        waves.push(g);
        // Fold as we go, so that only two waves' gradients are held at once.
        if waves.len() == 2 {
            let mut sum = Sum {
                parts: &mut waves,
                total: GradientsParams::new(),
            };
            model.visit::<Sum<'_>>(&mut sum);
            waves = vec![sum.total];
        }
    }
    let total = waves.pop().unwrap_or_else(GradientsParams::new);
    (total, extras)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::{Linear, LinearConfig};

    type B = Autodiff<NdArray<f32>>;

    #[test]
    fn ranges_are_even_contiguous_and_cover_the_rows() {
        assert_eq!(ranges(5, 2), vec![0..3, 3..5]);
        assert_eq!(ranges(6, 3), vec![0..2, 2..4, 4..6]);
        assert_eq!(ranges(2, 4), vec![0..1, 1..2]);
        assert_eq!(ranges(7, 1), vec![0..7]);
        assert_eq!(ranges(0, 3), vec![0..0]);
    }

    /// A 3 → 2 linear layer with random weights, `rows` random inputs, and the row-sum loss
    /// every shard test differentiates.
    fn fixture(seed: u64, rows: usize) -> (Linear<B>, Tensor<B, 2>) {
        let device = Default::default();
        let mut rng = crate::Rng::derive(seed, "shard-test");
        let layer: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let layer = layer.map(&mut Fill(&mut rng));
        let x: Vec<f32> = (0..rows * 3).map(|_| rng.uniform() as f32 - 0.5).collect();
        let x = Tensor::<B, 2>::from_data(TensorData::new(x, [rows, 3]), &device);
        (layer, x)
    }

    fn row_loss(m: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 1> {
        m.forward(x).powi_scalar(2).sum()
    }

    /// `x`'s rows cut into `groups` contiguous groups (see [`ranges`]).
    fn row_groups(x: &Tensor<B, 2>, groups: usize) -> Vec<Tensor<B, 2>> {
        ranges(x.dims()[0], groups)
            .into_iter()
            .map(|r| x.clone().slice([r, 0..3]))
            .collect()
    }

    /// Asserts that `g` holds the gradient of the whole batch `x`, weight and bias, to 1e-5.
    fn assert_whole_batch_gradient(layer: &Linear<B>, x: Tensor<B, 2>, g: &GradientsParams) {
        let whole = GradientsParams::from_grads(row_loss(layer, x).backward(), layer);
        let flat = |g: &GradientsParams| {
            let w = g
                .get::<NdArray<f32>, 2>(layer.weight.id)
                .expect("weight grad");
            let b = g
                .get::<NdArray<f32>, 1>(layer.bias.as_ref().expect("bias").id)
                .expect("bias grad");
            let mut v = w.into_data().to_vec::<f32>().expect("f32");
            v.extend(b.into_data().to_vec::<f32>().expect("f32"));
            v
        };
        let (a, b) = (flat(&whole), flat(g));
        assert_eq!((a.len(), b.len()), (8, 8));
        for (a, s) in a.iter().zip(&b) {
            assert!((a - s).abs() < 1e-5, "{a} vs {s}");
        }
    }

    /// Row groups run in waves of two threads sum to the whole batch's gradient too.
    #[test]
    fn gradients_accumulated_in_waves_sum_to_the_whole_batch_gradient() {
        let (layer, x) = fixture(11, 7);
        // Five groups of rows (2, 2, 1, 1, 1) in waves of two: three waves.
        let (waved, extras) = grads_in_waves(&layer, row_groups(&x, 5), 2, |m: &Linear<B>, x| {
            let rows = x.dims()[0];
            (row_loss(m, x), rows)
        });
        assert_eq!(extras, vec![2, 2, 1, 1, 1]);
        assert_whole_batch_gradient(&layer, x, &waved);
    }

    /// The shards' summed gradient of a row-sum loss is the whole batch's gradient.
    #[test]
    fn sharded_gradients_sum_to_the_whole_batch_gradient() {
        let (layer, x) = fixture(7, 5);
        let (sharded, values) = grads(&layer, row_groups(&x, 2), |m, x| {
            let l = row_loss(m, x);
            let v = l.clone().into_scalar();
            (l, v)
        });
        assert_eq!(values.len(), 2);
        assert_whole_batch_gradient(&layer, x, &sharded);
    }

    struct Fill<'a>(&'a mut crate::Rng);

    impl ModuleMapper<B> for Fill<'_> {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            p.map(|t| {
                let shape = t.shape();
                let v: Vec<f32> = (0..shape.num_elements())
                    .map(|_| self.0.uniform() as f32 - 0.5)
                    .collect();
                Tensor::<B, D>::from_data(TensorData::new(v, shape), &t.device()).require_grad()
            })
        }
    }
}
