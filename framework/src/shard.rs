//! Data-parallel shards: one optimiser step's batch split into row groups, each run forward
//! and backward as a task of the CPU pool ([`map`]) with its own copy of the parameter
//! leaves, the gradients summed in shard order (framework/METHOD.md, "Shards"; the step
//! itself is [`crate::optimise::step`]; rollouts are sharded in
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
//!
//! The `_placed` forms spread the shards over the peers of a [`Placement`]: each peer runs its
//! share and the results are gathered, so that every peer holds exactly what one process
//! running all shards would.

use std::ops::Range;

use crate::placement::{Placement, PlacementError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// Where a phase's work runs: `shards` row groups, each on its own thread, spread over the
/// peers of `placement`. One value per run, passed whole to every phase that splits work
/// (rollouts, judging, evaluation, the updates).
#[derive(Debug, Clone)]
pub struct Spread {
    /// Row groups, each on its own thread (1: one group, one thread).
    pub shards: usize,
    /// Which peers compute the groups (the default: this process alone).
    pub placement: Placement,
}

impl Default for Spread {
    fn default() -> Self {
        Self {
            shards: 1,
            placement: Placement::default(),
        }
    }
}

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

/// `f(input)` for every input, each as a task of the shards' thread pool (as many threads as
/// rayon's global pool: one per core, or `RAYON_NUM_THREADS`); a single input runs on this
/// thread. The results in input order; a panic in one is re-raised here. In the pool, a
/// shard's own parallel matrix products (rayon's, from inside the pool) share its threads with
/// the other shards instead of adding threads of their own (two shards on two cores: two
/// threads, not four; reports/perf/NOTES.md §9j). What each shard computes does not depend on
/// which thread runs it.
///
/// Why a pool of its own and not the global one: a shard ends its backward pass in Burn
/// 0.21's autodiff cleanup, which locks every autodiff graph of the process in turn. If the
/// shards ran on the global pool's threads, a training elsewhere in the process (another job
/// of `rlany ablate --jobs`, another test) that holds its graph's lock during its backward
/// pass while waiting for the global pool (Flex's matrix products) would wait for threads
/// that wait for its lock: a deadlock, seen in a test run. With the shards on their own
/// threads, the global pool's threads never take an autodiff lock.
pub fn map<T: Send, R: Send>(inputs: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    use rayon::prelude::*;
    if inputs.len() <= 1 {
        return inputs.into_iter().map(f).collect();
    }
    let f = &f;
    let run = || inputs.into_par_iter().with_max_len(1).map(f).collect();
    match shard_pool() {
        Some(pool) => pool.install(run),
        None => run(),
    }
}

/// The shards' pool, made on first use; `None` (the global pool is used) if the threads
/// cannot be started.
fn shard_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|i| format!("rlany-shard-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// [`map`] with the inputs spread over `placement`'s peers: each peer maps its share (on its
/// own threads) and every peer gets every result, in input order; `what` names the exchange.
/// A single input is mapped by every peer alone.
pub fn map_placed<T: Send, R: Send + Serialize + DeserializeOwned>(
    placement: &Placement,
    inputs: Vec<T>,
    what: &str,
    f: impl Fn(T) -> R + Sync,
) -> Result<Vec<R>, PlacementError> {
    if !placement.is_spread() || inputs.len() <= 1 {
        return Ok(map(inputs, f));
    }
    let owned = placement.owned(inputs.len());
    let mine: Vec<T> = own(inputs, &owned);
    let gathered = placement.gather(map(mine, f), what)?;
    Ok(gathered.into_iter().flatten().collect())
}

/// [`map_placed`] for work whose results are rows of floats (logits, say): exchanged as the
/// floats themselves rather than serialised, one row per result row, in input order.
pub fn map_placed_rows<T: Send>(
    placement: &Placement,
    inputs: Vec<T>,
    what: &str,
    f: impl Fn(T) -> Vec<Vec<f32>> + Sync,
) -> Result<Vec<Vec<f32>>, PlacementError> {
    if !placement.is_spread() || inputs.len() <= 1 {
        return Ok(map(inputs, f).into_iter().flatten().collect());
    }
    let owned = placement.owned(inputs.len());
    let rows: Vec<Vec<f32>> = map(own(inputs, &owned), f).into_iter().flatten().collect();
    // Row count and row lengths as 16-bit halves, then the rows.
    let halves = |n: usize| [(n >> 16) as f32, (n & 0xffff) as f32];
    let mut flat: Vec<f32> = halves(rows.len()).to_vec();
    rows.iter().for_each(|r| flat.extend(halves(r.len())));
    rows.iter().for_each(|r| flat.extend_from_slice(r));
    drop(rows);
    let mut out = Vec::new();
    for (peer, row) in placement.gather_rows(flat, what)?.iter().enumerate() {
        let bad = || PlacementError::Codec {
            peer,
            what: what.to_string(),
            message: "bad row framing".into(),
        };
        let word = |i: usize| -> Result<usize, PlacementError> {
            let h = row.get(2 * i..2 * i + 2).ok_or_else(bad)?;
            Ok(((h[0] as usize) << 16) | h[1] as usize)
        };
        let n = word(0)?;
        let mut pos = 2 * (n + 1);
        for i in 0..n {
            let len = word(i + 1)?;
            out.push(row.get(pos..pos + len).ok_or_else(bad)?.to_vec());
            pos += len;
        }
    }
    Ok(out)
}

/// The inputs at the positions `owned`.
fn own<T>(inputs: Vec<T>, owned: &Range<usize>) -> Vec<T> {
    let skip = owned.start;
    inputs.into_iter().skip(skip).take(owned.len()).collect()
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

/// [`grads`] with the inputs spread over `placement`'s peers: each peer runs its share's
/// backward passes, the per-input gradients are gathered (flattened in the model's parameter
/// order), and every peer sums all of them in input order exactly as [`grads`] does. A single
/// input is run by every peer alone.
pub fn grads_placed<B, M, T, R, F>(
    placement: &Placement,
    model: &M,
    inputs: Vec<T>,
    loss: F,
) -> Result<(GradientsParams, Vec<R>), PlacementError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    T: Send,
    R: Send + Serialize + DeserializeOwned,
    F: Fn(&M, T) -> (Tensor<B, 1>, R) + Sync,
{
    if !placement.is_spread() || inputs.len() <= 1 {
        return Ok(grads(model, inputs, loss));
    }
    let n = inputs.len();
    let owned = placement.owned(n);
    let mine: Vec<(M, T)> = own(inputs, &owned)
        .into_iter()
        .map(|t| (fork(model), t))
        .collect();
    let results = map(mine, |(copy, input)| {
        let (value, extra) = loss(&copy, input);
        (GradientsParams::from_grads(value.backward(), &copy), extra)
    });
    let (mine, extras): (Vec<_>, Vec<_>) = results.into_iter().unzip();
    let mut flat = Vec::new();
    for g in &mine {
        model.visit::<Flatten<'_>>(&mut Flatten {
            grads: g,
            out: &mut flat,
        });
    }
    drop(mine);
    let rows = placement.gather_rows(flat, "gradients")?;
    let mut parts: Vec<GradientsParams> = Vec::with_capacity(n);
    for (peer, row) in rows.iter().enumerate() {
        let mut pos = 0;
        for _ in crate::placement::share(n, placement.peers(), peer) {
            let mut un = Unflatten {
                src: row,
                pos,
                out: GradientsParams::new(),
                bad: false,
            };
            model.visit::<Unflatten<'_>>(&mut un);
            if un.bad {
                return Err(PlacementError::Codec {
                    peer,
                    what: "gradients".into(),
                    message: "fewer values than the model has parameters".into(),
                });
            }
            pos = un.pos;
            parts.push(un.out);
        }
    }
    let mut sum = Sum {
        parts: &mut parts,
        total: GradientsParams::new(),
    };
    model.visit::<Sum<'_>>(&mut sum);
    let extras = placement.gather(extras, "loss values")?;
    Ok((sum.total, extras.into_iter().flatten().collect()))
}

/// Appends one input's gradients to `out` in the model's parameter order: per parameter a
/// presence flag (1 or 0), then its values when present.
struct Flatten<'a> {
    grads: &'a GradientsParams,
    out: &'a mut Vec<f32>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        match self.grads.get::<B::InnerBackend, D>(param.id) {
            Some(g) => {
                self.out.push(1.0);
                let data = g.into_data().convert::<f32>();
                self.out
                    .extend_from_slice(data.as_slice::<f32>().unwrap_or(&[]));
            }
            None => self.out.push(0.0),
        }
    }
}

/// Reads back what [`Flatten`] wrote, from `src[pos..]`, as gradients on the parameters'
/// devices; `bad` when `src` ends early.
struct Unflatten<'a> {
    src: &'a [f32],
    pos: usize,
    out: GradientsParams,
    bad: bool,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&flag) = self.src.get(self.pos) else {
            self.bad = true;
            return;
        };
        self.pos += 1;
        if flag == 0.0 {
            return;
        }
        let p = param.val();
        let (shape, device) = (p.shape(), p.device());
        let len = shape.num_elements();
        let Some(values) = self.src.get(self.pos..self.pos + len) else {
            self.bad = true;
            return;
        };
        self.pos += len;
        let g = Tensor::<B::InnerBackend, D>::from_data(
            TensorData::new(values.to_vec(), shape),
            &device,
        );
        self.out.register(param.id, g);
    }
}

/// [`grads`] with at most `threads` inputs in flight: the inputs run in waves of `threads`
/// (each wave as [`grads_placed`], in input order), and the waves' gradients are summed in wave
/// order. Peak memory is that of one wave, so a batch larger than memory can be split into
/// many small row groups (gradient accumulation). One wave is exactly [`grads_placed`].
pub fn grads_in_waves<B, M, T, R, F>(
    placement: &Placement,
    model: &M,
    inputs: Vec<T>,
    threads: usize,
    loss: F,
) -> Result<(GradientsParams, Vec<R>), PlacementError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    T: Send,
    R: Send + Serialize + DeserializeOwned,
    F: Fn(&M, T) -> (Tensor<B, 1>, R) + Sync,
{
    let threads = threads.max(1);
    if inputs.len() <= threads {
        return grads_placed(placement, model, inputs, loss);
    }
    let mut waves: Vec<GradientsParams> = Vec::new();
    let mut extras = Vec::with_capacity(inputs.len());
    let mut rest = inputs.into_iter().peekable();
    while rest.peek().is_some() {
        let wave: Vec<T> = rest.by_ref().take(threads).collect();
        let (g, e) = grads_placed(placement, model, wave, &loss)?;
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
    let total = waves.pop().unwrap_or_default();
    Ok((total, extras))
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
        let single = Placement::default();
        let (waved, extras) =
            grads_in_waves(&single, &layer, row_groups(&x, 5), 2, |m: &Linear<B>, x| {
                let rows = x.dims()[0];
                (row_loss(m, x), rows)
            })
            .expect("one peer");
        assert_eq!(extras, vec![2, 2, 1, 1, 1]);
        assert_whole_batch_gradient(&layer, x, &waved);
    }

    /// Flattened weight and bias gradients of `layer` in `g`.
    fn flat(layer: &Linear<B>, g: &GradientsParams) -> Vec<f32> {
        let mut out = Vec::new();
        layer.visit::<Flatten<'_>>(&mut Flatten {
            grads: g,
            out: &mut out,
        });
        out
    }

    /// Four shards spread over 2 or 3 peers give every peer, bit for bit, the gradients and
    /// loss values one process computes from the same four shards (3 peers: shares 2, 1, 1).
    #[test]
    fn placed_gradients_equal_one_process_bit_for_bit() {
        let (layer, x) = fixture(5, 9);
        let loss = |m: &Linear<B>, x: Tensor<B, 2>| {
            let l = row_loss(m, x);
            let v = l.clone().into_scalar();
            (l, v)
        };
        let (alone, values) = grads(&layer, row_groups(&x, 4), loss);
        let alone = flat(&layer, &alone);
        for peers in [2, 3] {
            let out = crate::placement::tests::on_peers(peers, |p| {
                let (g, v) = grads_placed(&p, &layer, row_groups(&x, 4), loss).expect("placed");
                (flat(&layer, &g), v)
            });
            for (g, v) in out {
                assert_eq!(g, alone, "{peers} peers");
                assert_eq!(v, values);
            }
        }
        let mapped = crate::placement::tests::on_peers(3, |p| {
            map_placed(&p, (0..5).collect(), "squares", |i: u32| (i * i, p.rank())).expect("map")
        });
        // Every peer sees every result, each computed by its owner (shares 2, 2, 1).
        for m in mapped {
            assert_eq!(m, vec![(0, 0), (1, 0), (4, 1), (9, 1), (16, 2)]);
        }
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
