//! The KV cache of decoding: each layer's rotated keys and values in preallocated buffers
//! written in place, grown as a context extends, its rows selected as episodes end.

use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use rlany_kernels::AttentionOps;

/// Keys and values of one layer, already rotated, in preallocated buffers written in place.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv<B: Backend> {
    /// `[batch, kv_heads, capacity, head_dim]`; positions `0..len` are filled.
    key: Tensor<B, 4>,
    /// `[batch, kv_heads, capacity, head_dim]`; positions `0..len` are filled.
    value: Tensor<B, 4>,
    /// Filled positions.
    len: usize,
}

/// `buffer` with `src` written at positions `at..` of the third axis (in place where the
/// backend can: [`AttentionOps::write_positions`]).
fn write<B: AttentionOps>(buffer: Tensor<B, 4>, src: Tensor<B, 4>, at: usize) -> Tensor<B, 4> {
    let written = B::write_positions(
        buffer.into_primitive().tensor(),
        src.into_primitive().tensor(),
        at,
    );
    Tensor::from_primitive(TensorPrimitive::Float(written))
}

impl<B: AttentionOps> LayerKv<B> {
    /// Takes the layer's buffers out of `slot` with room for `seq` more positions (allocating
    /// them, or growing them first when full) and returns them with the position the new keys
    /// and values go at. Put them back with [`LayerKv::filled`] once written.
    ///
    /// # Shapes
    /// - `dims`: `[batch, kv_heads, seq, head_dim]` of the new keys
    /// - outputs: `[batch, kv_heads, capacity, head_dim]`, `capacity ≥ at + seq`
    pub(crate) fn make_room(
        slot: &mut Option<Self>,
        [batch, kv_heads, seq, head_dim]: [usize; 4],
        reserve: usize,
        like: &Tensor<B, 3>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, usize) {
        let buffer = |positions: usize| {
            Tensor::<B, 4>::zeros(
                [batch, kv_heads, positions, head_dim],
                (&like.device(), like.dtype()),
            )
        };
        let mut kv = match slot.take() {
            Some(kv) => kv,
            None => Self {
                key: buffer(seq + reserve),
                value: buffer(seq + reserve),
                len: 0,
            },
        };
        let capacity = kv.key.dims()[2];
        let needed = kv.len + seq;
        if needed > capacity {
            // One copy of the filled part into buffers with room for `reserve` more
            // positions (at least doubled, so repeated growth costs amortised O(1)).
            let grown = (needed + reserve).max(2 * capacity);
            kv.key = write(buffer(grown), kv.key.narrow(2, 0, kv.len), 0);
            kv.value = write(buffer(grown), kv.value.narrow(2, 0, kv.len), 0);
        }
        (kv.key, kv.value, kv.len)
    }

    /// Puts written buffers back into `slot`, `len` positions filled, and returns them
    /// (sharing the cache's storage: drop them before the next write, which is then in
    /// place).
    pub(crate) fn filled(
        slot: &mut Option<Self>,
        key: Tensor<B, 4>,
        value: Tensor<B, 4>,
        len: usize,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        *slot = Some(Self {
            key: key.clone(),
            value: value.clone(),
            len,
        });
        (key, value)
    }
}

/// Keys and values of the positions seen so far, per layer, for incremental decoding.
///
/// Each layer holds K and V in buffers of shape `[batch, kv_heads, capacity, head_dim]` (K
/// after the rotation); every `Transformer::forward_with` call that is given the cache
/// writes its positions in place after the filled ones (no copy of the cache per token).
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    pub(crate) layers: Vec<Option<LayerKv<B>>>,
    /// Positions to allocate beyond what the next write needs when a buffer grows.
    pub(crate) reserve: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for a model with `n_layers` blocks.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![None; n_layers],
            reserve: 0,
        }
    }

    /// When a buffer next has to grow, make room for `positions` more than the write needs
    /// (a caller that knows how many tokens it will decode sizes the buffers once).
    pub fn reserve(&mut self, positions: usize) {
        self.reserve = positions;
    }

    /// Number of cached positions (0 when empty).
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map_or(0, |l| l.len)
    }

    /// Whether no position is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of layers the cache was built for.
    pub(crate) fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Keeps the batch rows at `index`, in that order (a gather along the batch dimension).
    ///
    /// # Shapes
    /// - `index`: `[rows kept]`
    pub(crate) fn select_rows(&mut self, index: Tensor<B, 1, Int>) {
        for kv in self.layers.iter_mut().flatten() {
            kv.key = kv.key.clone().select(0, index.clone());
            kv.value = kv.value.clone().select(0, index.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;

    use crate::test_support::{B, int_tensor, max_abs_diff, model, row_logits, tiny, to_vec};

    /// Decoding with the cache (a prefill, then one token per step) gives the logits of one
    /// uncached pass over the left-padded rows and of each row alone, unpadded.
    #[test]
    fn cached_decoding_matches_uncached_and_unpadded_rows() {
        for config in [tiny(), tiny().with_qkv_bias(true).with_tie_embeddings(true)] {
            let model = model(&config, 7);
            let device = Default::default();
            let prompts: Vec<Vec<u32>> = vec![
                vec![1, 40, 41, 42, 43, 44],
                vec![1, 50],
                vec![1, 60, 61, 62],
            ];
            // Continuations fed one at a time after the prompt.
            let cont: Vec<Vec<u32>> =
                vec![vec![5, 6, 7, 8], vec![9, 10, 11, 12], vec![13, 14, 15, 16]];
            let batch = prompts.len();
            let plen = prompts.iter().map(Vec::len).max().unwrap_or(0);
            let steps = cont[0].len();
            let total = plen + steps;
            let pads: Vec<usize> = prompts.iter().map(|p| plen - p.len()).collect();
            let full: Vec<Vec<i64>> = (0..batch)
                .map(|r| {
                    let mut row = vec![0i64; pads[r]];
                    row.extend(prompts[r].iter().chain(&cont[r]).map(|&t| i64::from(t)));
                    row
                })
                .collect();
            let pos: Vec<Vec<i64>> = (0..batch)
                .map(|r| {
                    (0..total)
                        .map(|i| i.saturating_sub(pads[r]) as i64)
                        .collect()
                })
                .collect();
            let mask_rows: Vec<bool> = (0..batch)
                .flat_map(|r| (0..total).map(|i| i < pads[r]).collect::<Vec<_>>())
                .collect();
            let mask = Tensor::<B, 2, Bool>::from_data(
                TensorData::new(mask_rows, [batch, total]),
                &device,
            );
            let vocab = config.vocab_size;

            // Uncached: one pass over the whole padded sequence.
            let hidden = model.forward_with(
                int_tensor(&full),
                int_tensor(&pos),
                Some(mask.clone()),
                None,
            );
            let (uncached, _) = to_vec(model.logits(hidden));
            let uncached_at = |r: usize, i: usize| {
                uncached[(r * total + i) * vocab..(r * total + i + 1) * vocab].to_vec()
            };

            // Cached: prefill the prompts, then one token per step.
            let mut cache = model.new_cache();
            let take = |rows: &Vec<Vec<i64>>, from: usize, len: usize| -> Vec<Vec<i64>> {
                rows.iter().map(|r| r[from..from + len].to_vec()).collect()
            };
            let hidden = model.forward_with(
                int_tensor(&take(&full, 0, plen)),
                int_tensor(&take(&pos, 0, plen)),
                Some(mask.clone().narrow(1, 0, plen)),
                Some(&mut cache),
            );
            assert_eq!(cache.len(), plen);
            let (prefill, _) = to_vec(model.logits(hidden));
            let mut cached: Vec<Vec<Vec<f32>>> = (0..batch)
                .map(|r| {
                    (0..plen)
                        .map(|i| {
                            prefill[(r * plen + i) * vocab..(r * plen + i + 1) * vocab].to_vec()
                        })
                        .collect()
                })
                .collect();
            for s in 0..steps {
                let at = plen + s;
                let hidden = model.forward_with(
                    int_tensor(&take(&full, at, 1)),
                    int_tensor(&take(&pos, at, 1)),
                    Some(mask.clone().narrow(1, 0, at + 1)),
                    Some(&mut cache),
                );
                let (step, _) = to_vec(model.logits(hidden));
                for (r, rows) in cached.iter_mut().enumerate() {
                    rows.push(step[r * vocab..(r + 1) * vocab].to_vec());
                }
            }
            assert_eq!(cache.len(), total);

            for r in 0..batch {
                // Unpadded single-row forward of prompt + continuation.
                let row: Vec<u32> = prompts[r].iter().chain(&cont[r]).copied().collect();
                let alone = row_logits(&model, &row);
                for i in pads[r]..total {
                    let c = &cached[r][i];
                    let u = uncached_at(r, i);
                    let a = &alone[i - pads[r]];
                    assert!(
                        max_abs_diff(c, &u) <= 1e-4,
                        "cached vs uncached row {r} pos {i}"
                    );
                    assert!(
                        max_abs_diff(c, a) <= 1e-4,
                        "cached vs alone row {r} pos {i}"
                    );
                }
            }
        }
    }
}
