//! Grouped-query attention of a few new positions over a KV cache, read where it lies, on
//! the host.
//!
//! A decoded token attends over every cached position of every layer. Composed from tensor
//! ops on a CPU backend that costs more than the arithmetic: the filled part of each layer's
//! K and V buffers is copied out by the `narrow` (NdArray's slice copies), `q kᵀ` copies the
//! transposed keys into a standard layout, and the softmax runs as five passes over the
//! scores. [`cached_attention_host`] reads the buffers in place and does each query row in one
//! pass over the keys (scores, softmax, weighted sum of values); it computes what
//! [`crate::reference_grouped_attention`] of the narrowed buffers computes (its reference
//! twin; they agree to float rounding, the sums running in another order).
//!
//! Only inference calls it (no backward); the transformer uses it on the packed-weight path
//! of `rlany generate`, so a training run's numbers are those of the composition.

use rayon::prelude::*;

/// Fewest multiply-adds of `q kᵀ` (query rows × keys × head width) split over rayon's
/// threads.
const PARALLEL_MIN: usize = 1 << 16;

/// Where the cache's buffers lie: `[batch, kv_heads, capacity, head_dim]`, row-major, of
/// which positions `0..keys` are filled.
#[derive(Debug, Clone, Copy)]
pub struct CacheLayout {
    /// Rows of the batch.
    pub batch: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Positions each buffer has room for.
    pub capacity: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Filled positions (the keys attended over).
    pub keys: usize,
}

/// `softmax(q kᵀ + bias) v` over the first `cache.keys` positions of `k` and `v`.
///
/// # Shapes
/// - `q`: `[batch, kv_heads, rows, head_dim]` row-major, `rows = group · seq` (a K/V head's
///   query heads folded into its rows, head-major), scaled by `1/√head_dim` already
/// - `k`, `v`: `[batch, kv_heads, capacity, head_dim]` row-major ([`CacheLayout`])
/// - `bias`: `(values, bias_batch)`, `[bias_batch, 1, seq, keys]` row-major with `bias_batch`
///   1 (broadcast) or `batch`; query row `r` reads the bias of position `r % seq`
/// - output: `[batch, kv_heads, rows, head_dim]`
///
/// # Panics
/// If a slice is shorter than its shape says (the caller's shapes).
pub fn cached_attention_host(
    q: &[f32],
    rows: usize,
    k: &[f32],
    v: &[f32],
    cache: CacheLayout,
    bias: Option<(&[f32], usize)>,
    seq: usize,
) -> Vec<f32> {
    let CacheLayout {
        batch,
        kv_heads,
        capacity,
        head_dim: hd,
        keys,
    } = cache;
    let mut out = vec![0.0f32; batch * kv_heads * rows * hd];
    // One task per query row (`i = (b·kv_heads + h)·rows + r`, its `head_dim` outputs), its
    // own scores: the same arithmetic on every thread count.
    let row = |scores: &mut Vec<f32>, (i, o): (usize, &mut [f32])| {
        let (bh, r) = (i / rows, i % rows);
        let b = bh / kv_heads;
        let base = bh * capacity * hd;
        let (kh, vh) = (&k[base..base + keys * hd], &v[base..base + keys * hd]);
        let qr = &q[i * hd..(i + 1) * hd];
        let bias_row = bias.map(|(values, bias_batch)| {
            let s = r % seq;
            let from = ((if bias_batch == 1 { 0 } else { b }) * seq + s) * keys;
            &values[from..from + keys]
        });
        let mut max = f32::NEG_INFINITY;
        for (j, score) in scores.iter_mut().enumerate() {
            let mut sc = dot(qr, &kh[j * hd..(j + 1) * hd]);
            if let Some(row) = bias_row {
                sc += row[j];
            }
            *score = sc;
            max = max.max(sc);
        }
        let mut total = 0.0f32;
        for score in scores.iter_mut() {
            *score = (*score - max).exp();
            total += *score;
        }
        for (j, &p) in scores.iter().enumerate() {
            let p = p / total;
            for (o, &x) in o.iter_mut().zip(&vh[j * hd..(j + 1) * hd]) {
                *o += p * x;
            }
        }
    };
    let scores = || vec![0.0f32; keys];
    // Handing rows to the pool costs a wake-up and a wait: short attention stays here.
    if rayon::current_num_threads() > 1 && out.len() * keys >= PARALLEL_MIN {
        out.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(scores, row);
    } else {
        let mut buffer = scores();
        for task in out.chunks_mut(hd).enumerate() {
            row(&mut buffer, task);
        }
    }
    out
}

/// `Σ a_i b_i` in 8 running sums (which the compiler keeps in one vector register).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::prelude::*;
    use burn::tensor::TensorData;

    type B = NdArray<f32>;

    #[test]
    fn one_key_returns_its_value_and_equal_scores_average() {
        // One head, one row, head_dim 2: with one key the output is that key's value.
        let cache = CacheLayout {
            batch: 1,
            kv_heads: 1,
            capacity: 3,
            head_dim: 2,
            keys: 1,
        };
        let (k, v) = (
            [1.0, 2.0, 9.0, 9.0, 9.0, 9.0],
            [5.0, -1.0, 7.0, 7.0, 7.0, 7.0],
        );
        let y = cached_attention_host(&[0.3, 0.4], 1, &k, &v, cache, None, 1);
        assert_eq!(y, vec![5.0, -1.0]);
        // Two keys of equal score (q ⟂ both): the mean of their values; the third position
        // is beyond `keys` and never read.
        let cache = CacheLayout { keys: 2, ..cache };
        let k = [1.0, 0.0, 1.0, 0.0, 9.0, 9.0];
        let y = cached_attention_host(&[0.0, 1.0], 1, &k, &v, cache, None, 1);
        assert_eq!(y, vec![6.0, 3.0]);
        // A bias of −∞-like size on the first key leaves the second alone.
        let bias = [-1e9f32, 0.0];
        let y = cached_attention_host(&[0.0, 1.0], 1, &k, &v, cache, Some((&bias, 1)), 1);
        assert_eq!(y, vec![7.0, 7.0]);
    }

    /// Queries of `rows` per K/V head and the cache's K and V buffers, filled with sines.
    fn waves(cache: CacheLayout, rows: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin()).collect() };
        let heads = cache.batch * cache.kv_heads;
        let buffer = heads * cache.capacity * cache.head_dim;
        (
            wave(heads * rows * cache.head_dim, 0.37),
            wave(buffer, 0.11),
            wave(buffer, 0.23),
        )
    }

    /// Above the threshold the rows are split over the threads: the same bits as one thread.
    #[test]
    fn threads_give_the_bits_of_one_thread() {
        let (batch, kv_heads, rows, capacity, hd, keys) = (2, 3, 6, 80, 64, 70);
        assert!(batch * kv_heads * rows * hd * keys >= PARALLEL_MIN);
        let cache = CacheLayout {
            batch,
            kv_heads,
            capacity,
            head_dim: hd,
            keys,
        };
        let (q, k, v) = waves(cache, rows);
        let on = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("pool")
                .install(|| cached_attention_host(&q, rows, &k, &v, cache, None, 1))
        };
        let one = on(1);
        assert_eq!(one.len(), batch * kv_heads * rows * hd);
        assert_eq!(on(2), one);
        assert_eq!(on(3), one);
    }

    /// Against the reference twin on the narrowed buffers: several rows of the batch, two
    /// K/V heads of three query heads each, two new positions with a causal bias per row.
    #[test]
    fn matches_the_reference_on_the_narrowed_cache() {
        let device = Default::default();
        let (batch, kv_heads, group, seq, capacity, hd, keys) = (2, 2, 3, 2, 9, 16, 7);
        let rows = group * seq;
        let cache = CacheLayout {
            batch,
            kv_heads,
            capacity,
            head_dim: hd,
            keys,
        };
        let (q, k, v) = waves(cache, rows);
        // Row 0 sees every key but the last; row 1 also masks key 2.
        let mut bias = vec![0.0f32; batch * seq * keys];
        bias[keys - 1] = -1e9;
        bias[seq * keys + 2] = -1e9;
        let got = cached_attention_host(&q, rows, &k, &v, cache, Some((&bias, batch)), seq);
        let t = |x: &[f32], shape: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(x.to_vec(), shape), &device)
        };
        let want = crate::reference_grouped_attention(
            t(&q, [batch, kv_heads, rows, hd]),
            t(&k, [batch, kv_heads, capacity, hd]).narrow(2, 0, keys),
            t(&v, [batch, kv_heads, capacity, hd]).narrow(2, 0, keys),
            Some(t(&bias, [batch, 1, seq, keys])),
            group,
        )
        .into_data()
        .into_vec::<f32>()
        .expect("f32");
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-5, "element {i}: {a} vs {b}");
        }
    }
}
