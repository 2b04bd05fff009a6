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
    /// Writes `k` and `v` after the filled positions (growing the buffers first when they
    /// are full) and returns the buffers (sharing the cache's storage: drop them before the
    /// next write, which is then in place) and how many positions are filled.
    ///
    /// # Shapes
    /// - `k`, `v`: `[batch, kv_heads, seq, head_dim]`
    /// - outputs: `[batch, kv_heads, capacity, head_dim]`, filled `0..len + seq`
    pub(crate) fn append(
        slot: &mut Option<Self>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        reserve: usize,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, usize) {
        let [batch, kv_heads, seq, head_dim] = k.dims();
        let buffer = |positions: usize, like: &Tensor<B, 4>| {
            Tensor::<B, 4>::zeros(
                [batch, kv_heads, positions, head_dim],
                (&like.device(), like.dtype()),
            )
        };
        let mut kv = match slot.take() {
            Some(kv) => kv,
            None => Self {
                key: buffer(seq + reserve, &k),
                value: buffer(seq + reserve, &v),
                len: 0,
            },
        };
        let capacity = kv.key.dims()[2];
        let needed = kv.len + seq;
        if needed > capacity {
            // One copy of the filled part into buffers with room for `reserve` more
            // positions (at least doubled, so repeated growth costs amortised O(1)).
            let grown = (needed + reserve).max(2 * capacity);
            kv.key = write(buffer(grown, &k), kv.key.narrow(2, 0, kv.len), 0);
            kv.value = write(buffer(grown, &v), kv.value.narrow(2, 0, kv.len), 0);
        }
        kv.key = write(kv.key, k, kv.len);
        kv.value = write(kv.value, v, kv.len);
        kv.len = needed;
        let buffers = (kv.key.clone(), kv.value.clone(), needed);
        *slot = Some(kv);
        buffers
    }
}

/// Keys and values of the positions seen so far, per layer, for incremental decoding.
///
/// Each layer holds K and V in buffers of shape `[batch, kv_heads, capacity, head_dim]` (K
/// after the rotation); every [`Transformer::forward_with`] call that is given the cache
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
