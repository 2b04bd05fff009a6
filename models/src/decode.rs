//! Batched sampling from a [`Transformer`] over contexts that grow turn by turn.
//!
//! A multi-turn rollout alternates: the policy writes a step, the environment answers, the
//! policy writes the next step. [`Contexts`] keeps the K/V of every position a row has read,
//! so each turn reads only what is new (the observation; the last generated token) instead
//! of the whole context again. One call ([`CausalLm::extend`]):
//!
//! 1. **Rows.** The rows named in the call go on, in the call's order; every other row is
//!    dropped (its K/V are released) and may not be named again. The cache is compacted to
//!    the named rows by one row gather per layer.
//! 2. **Read.** Each row's new tokens (its unread last generated token, then what the call
//!    appends) are left-padded to one chunk and read in one pass over the cache. A pad is a
//!    key masked for every later query, so rows of different lengths share one tensor; each
//!    real token sits at its row's own next rotary position. On fresh contexts whose prompts
//!    all start with the same `SHARED_PREFIX_MIN` = 16 tokens or more (a chat template's system
//!    prompt and instructions; the samples of one task), that prefix is read once, as a
//!    batch of one, and its K/V are copied to every row before the remainders are read: the
//!    same values for a fraction of the arithmetic.
//! 3. **Sample.** One token per row per step with the KV cache: the logits read to the
//!    host once per step for the whole batch and sampled there in row order ([`Sampler`],
//!    f64, one uniform per sampled token from the caller's stream), or with
//!    `SampleParams::on_device` chosen on the device by the same rule with one small read
//!    (`sample_on_device`). A row stops after a stop token or its budget; a stopped row is
//!    fed padding, masked like any pad.
//!
//! A row's budget is `min(max_new_tokens, max_seq_len − its length after reading)`. A row
//! with no budget (nothing to read, or no room for one token) gets an empty generation and
//! is dropped. On a fresh row a prompt of `max_seq_len` tokens or more keeps only its last
//! `max_seq_len − 1` tokens, so at least one token can be generated.
//!
//! The first call on fresh contexts computes exactly what one pass over the left-padded
//! prompts followed by cached decoding computes (the `generate` of earlier versions).

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, FloatDType};
use rlany_framework::sampling::Sampler;
use rlany_framework::{Generation, Rng, SampleParams};
use rlany_kernels::AttentionOps;

use crate::transformer::{
    KvCache, MASKED, PAD_ID, Transformer, causal_bias, combine_bias, shared_prefix_len,
};

/// The contexts of a batch of rows, kept between [`CausalLm::extend`] calls.
///
/// [`CausalLm::extend`]: rlany_framework::CausalLm::extend
#[derive(Debug)]
pub struct Contexts<B: Backend> {
    /// Row ids in cache order (the batch dimension of `cache` and `bias`).
    ids: Vec<usize>,
    /// Per cached row: the next rotary position (the real tokens it has read).
    next_pos: Vec<usize>,
    /// Per cached row: its last generated token, not read yet.
    pending: Vec<Option<u32>>,
    /// Per row id: dropped by an earlier call.
    dropped: Vec<bool>,
    /// K/V of every cached position: `[rows, kv_heads, len, head_dim]` per layer.
    cache: KvCache<B>,
    /// Additive key bias of every cached position, 0 or [`MASKED`]: `[rows, 1, 1, len]`;
    /// `None` while nothing is cached.
    bias: Option<Tensor<B, 4>>,
}

impl<B: AttentionOps> Contexts<B> {
    /// `rows` empty contexts for `model`.
    pub(crate) fn new(model: &Transformer<B>, rows: usize) -> Self {
        Self {
            ids: (0..rows).collect(),
            next_pos: vec![0; rows],
            pending: vec![None; rows],
            dropped: vec![false; rows],
            cache: model.new_cache(),
            bias: None,
        }
    }

    /// Number of cached positions (including padding).
    pub fn cached_len(&self) -> usize {
        self.cache.len()
    }

    /// Keeps the cached rows at `slots` (indices into the current cache order), in that
    /// order; every other row is dropped.
    fn compact(&mut self, slots: &[usize], kept_ids: Vec<usize>) {
        for id in &self.ids {
            if !kept_ids.contains(id) {
                self.dropped[*id] = true;
            }
        }
        let identity =
            slots.len() == self.ids.len() && slots.iter().enumerate().all(|(i, &s)| i == s);
        if !identity {
            if slots.is_empty() {
                self.cache = KvCache::new(self.cache.n_layers());
                self.bias = None;
            } else if let Some(bias) = self.bias.take() {
                let device = bias.device();
                let index = Tensor::<B, 1, Int>::from_data(
                    TensorData::new(slots.iter().map(|&s| s as i64).collect(), [slots.len()]),
                    &device,
                );
                self.cache.select_rows(index.clone());
                self.bias = Some(bias.select(0, index));
            }
        }
        self.next_pos = slots.iter().map(|&s| self.next_pos[s]).collect();
        self.pending = slots.iter().map(|&s| self.pending[s]).collect();
        self.ids = kept_ids;
    }

    /// Appends one column per cached row to the key bias: masked where `real` is false.
    ///
    /// # Shapes
    /// - `real`: `[rows * width]`, row-major
    fn push_bias(&mut self, real: &[bool], width: usize, device: &B::Device) {
        let rows = self.ids.len();
        let values: Vec<f32> = real.iter().map(|&r| if r { 0.0 } else { MASKED }).collect();
        // [rows, 1, 1, width]
        let cols = Tensor::<B, 4>::from_data(
            TensorData::new(values, [rows, 1, 1, width]),
            (device, DType::F32),
        );
        self.bias = Some(match self.bias.take() {
            Some(prev) => Tensor::cat(vec![prev, cols], 3),
            None => cols,
        });
    }
}

/// One [`CausalLm::extend`] call on `model` (see the module documentation).
///
/// # Panics
/// If `rows` and `appended` differ in length, a row is out of range, named twice or was
/// dropped, or a token id is `>= vocab_size`.
///
/// [`CausalLm::extend`]: rlany_framework::CausalLm::extend
pub(crate) fn extend<B: AttentionOps>(
    model: &Transformer<B>,
    ctx: &mut Contexts<B>,
    rows: &[usize],
    appended: &[Vec<u32>],
    params: &SampleParams,
    rng: &mut Rng,
) -> Vec<Generation> {
    assert_eq!(rows.len(), appended.len(), "one appended list per row");
    let max_seq_len = model.config().max_seq_len;
    let vocab = model.config().vocab_size;
    let mut out: Vec<Generation> = rows
        .iter()
        .map(|_| Generation {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            stopped: false,
        })
        .collect();

    // 1. Rows: what each reads and may generate; the rows that go on, in call order.
    let mut seen = vec![false; ctx.dropped.len()];
    let (mut slots, mut kept_ids, mut outs, mut chunks, mut budgets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, (&row, app)) in rows.iter().zip(appended).enumerate() {
        assert!(row < ctx.dropped.len(), "row {row} is out of range");
        assert!(
            !ctx.dropped[row],
            "row {row} was dropped by an earlier call"
        );
        assert!(!seen[row], "row {row} is named twice");
        seen[row] = true;
        if let Some(&bad) = app.iter().find(|&&id| id as usize >= vocab) {
            panic!("prompt token id {bad} is outside the vocabulary of size {vocab}");
        }
        let slot = ctx
            .ids
            .iter()
            .position(|&id| id == row)
            .unwrap_or_else(|| panic!("row {row} has no context"));
        let read = ctx.next_pos[slot];
        let mut chunk: Vec<u32> = ctx.pending[slot]
            .into_iter()
            .chain(app.iter().copied())
            .collect();
        if read == 0 && chunk.len() >= max_seq_len {
            chunk.drain(..chunk.len() + 1 - max_seq_len);
        }
        let after = read + chunk.len();
        let budget = if chunk.is_empty() || after >= max_seq_len {
            0
        } else {
            params.max_new_tokens.min(max_seq_len - after)
        };
        if budget > 0 {
            slots.push(slot);
            kept_ids.push(row);
            outs.push(k);
            chunks.push(chunk);
            budgets.push(budget);
        }
    }
    ctx.compact(&slots, kept_ids);
    let batch = slots.len();
    let steps = budgets.iter().copied().max().unwrap_or(0);
    if batch == 0 || steps == 0 {
        return out;
    }
    // 2. Read: every row's new tokens, left-padded to one chunk, in one pass; what was
    // pending is in the chunks now.
    ctx.pending.iter_mut().for_each(|p| *p = None);
    // Only fresh contexts share a prefix: one that holds something reads its own tokens.
    let shared = if ctx.cache.is_empty() {
        shared_prefix_len(&chunks)
    } else {
        0
    };
    if shared > 0 {
        let longest_rest = chunks.iter().map(|c| c.len() - shared).max().unwrap_or(0);
        // The prefix's buffers make room for the remainders and every decoded token.
        ctx.cache.reserve(longest_rest + steps);
        read_shared_prefix(model, ctx, &chunks[0][..shared]);
        chunks.iter_mut().for_each(|c| {
            c.drain(..shared);
        });
    }
    // Buffers that grow now make room for every token this call decodes.
    ctx.cache.reserve(steps);
    let mut hidden = read(model, ctx, &chunks);

    // 3. Sample, one token per row per step.
    let mut sampler = Sampler::default();
    let mut finished = vec![false; batch];
    for step in 0..steps {
        if step > 0 {
            // Feed each row its last sampled token (padding once it has none).
            let fed: Vec<Vec<u32>> = ctx
                .pending
                .iter_mut()
                .map(|p| p.take().into_iter().collect())
                .collect();
            hidden = read(model, ctx, &fed);
        }
        // [batch, 1, vocab] -> [batch, vocab]
        let logits = model
            .decode_logits(hidden.clone())
            .reshape([batch, vocab])
            .cast(FloatDType::F32);
        let drawn: Vec<Option<(u32, f32)>> = if params.on_device && params.top_p >= 1.0 {
            sample_on_device(logits, &finished, params.temperature, rng)
        } else {
            let logits: Vec<f32> = logits.into_data().iter::<f32>().collect();
            (0..batch)
                .map(|r| {
                    (!finished[r]).then(|| {
                        sampler.sample(
                            &logits[r * vocab..(r + 1) * vocab],
                            params.temperature,
                            params.top_p,
                            rng,
                        )
                    })
                })
                .collect()
        };
        for (r, drawn) in drawn.into_iter().enumerate() {
            let Some((id, logprob)) = drawn else {
                continue;
            };
            let g = &mut out[outs[r]];
            g.tokens.push(id);
            g.logprobs.push(logprob);
            ctx.pending[r] = Some(id);
            if params.stop_tokens.contains(&id) {
                g.stopped = true;
                finished[r] = true;
            } else if g.tokens.len() >= budgets[r] {
                finished[r] = true;
            }
        }
        if finished.iter().all(|&f| f) {
            break;
        }
    }
    out
}

/// The next token of every unfinished row, chosen on the device with one small read for
/// the whole batch (ids and log-probs, `[batch, 2]`), instead of reading `[batch, vocab]`
/// logits to the host.
///
/// The rule is the host sampler's: greedy is the argmax (no draw); otherwise one uniform
/// `u` per unfinished row, in row order from `rng`, and the id is the first whose running
/// sum of `exp((logit − max) / T)` exceeds `u` times the total. The host sums in f64, the
/// device in f32, so a draw within rounding of a boundary can pick the neighbouring id. The
/// log-probability is `log_softmax(logits)[id]`, untempered.
///
/// # Shapes
/// - `logits`: `[batch, vocab]` (f32)
fn sample_on_device<B: Backend>(
    logits: Tensor<B, 2>,
    finished: &[bool],
    temperature: f64,
    rng: &mut Rng,
) -> Vec<Option<(u32, f32)>> {
    let [batch, _] = logits.dims();
    let device = logits.device();
    // [batch, 1]
    let ids = if temperature > 0.0 {
        let uniforms: Vec<f32> = finished
            .iter()
            .map(|&f| if f { 0.0 } else { rng.uniform() as f32 })
            .collect();
        let u = Tensor::<B, 2>::from_data(TensorData::new(uniforms, [batch, 1]), &device);
        let max = logits.clone().max_dim(1);
        // [batch, vocab]: the tempered, unnormalised probabilities.
        let p = (logits.clone() - max).div_scalar(temperature).exp();
        inverse_cdf_in_blocks(p, u)
    } else {
        logits.clone().argmax(1)
    };
    let logprobs = log_softmax(logits, 1).gather(1, ids.clone());
    // [batch, 2]: id (exact in f32 below 2^24) and log-probability.
    let packed: Vec<f32> = Tensor::cat(vec![ids.float(), logprobs], 1)
        .into_data()
        .iter::<f32>()
        .collect();
    (0..batch)
        .map(|r| (!finished[r]).then(|| (packed[2 * r] as u32, packed[2 * r + 1])))
        .collect()
}

/// The inverse-CDF draw of [`sample_on_device`] without a running sum over the whole
/// vocabulary: Burn 0.21's `cumsum` on a Cube backend reads every earlier element for each
/// output (O(V²) per row), which at V = 151936 took the H200 over 90 s for a 128-token
/// rollout. Here the vocabulary is cut into about √V blocks of about √V ids: the block sums'
/// running sum picks the block the target falls in, and that block's own running sum (plus
/// the mass before it) picks the id — the same rule, "the first id whose running sum exceeds
/// `u` times the total", in O(V) reads. Padding ids (zero mass) go after the vocabulary.
///
/// # Shapes
/// - `p`: `[batch, vocab]`, non-negative; `u`: `[batch, 1]` in `[0, 1)`
/// - output: `[batch, 1]` ids
pub(crate) fn inverse_cdf_in_blocks<B: Backend>(
    p: Tensor<B, 2>,
    u: Tensor<B, 2>,
) -> Tensor<B, 2, Int> {
    let [batch, vocab] = p.dims();
    let bs = ((vocab as f64).sqrt().ceil() as usize).max(1);
    let nb = vocab.div_ceil(bs);
    let p = if nb * bs > vocab {
        let pad = Tensor::<B, 2>::zeros([batch, nb * bs - vocab], &p.device());
        Tensor::cat(vec![p, pad], 1)
    } else {
        p
    };
    let blocks = p.reshape([batch, nb, bs]);
    // [batch, nb]: each block's mass and their running sum.
    let mass = blocks.clone().sum_dim(2).reshape([batch, nb]);
    let cdf = mass.clone().cumsum(1);
    let target = cdf.clone().narrow(1, nb - 1, 1) * u;
    // Blocks whose running sum does not pass the target: the draw lies after them.
    let before = cdf.lower_equal(target.clone());
    let k = before.clone().int().sum_dim(1).clamp_max(nb as i64 - 1);
    let prior = (mass * before.float()).sum_dim(1);
    // [batch, bs]: block k of each row, its running sum from the mass before it.
    let index = k.clone().reshape([batch, 1, 1]).repeat_dim(2, bs);
    let inner = blocks.gather(1, index).reshape([batch, bs]).cumsum(1) + prior;
    let j = inner
        .lower_equal(target)
        .int()
        .sum_dim(1)
        .clamp_max(bs as i64 - 1);
    (k.mul_scalar(bs as i64) + j).clamp_max(vocab as i64 - 1)
}

/// Reads `prefix` into every row of fresh contexts: once, as a batch of one (positions
/// `0..prefix.len()`, causal mask only), then its K/V copied to each cached row; every row's
/// next position is then `prefix.len()`.
fn read_shared_prefix<B: AttentionOps>(
    model: &Transformer<B>,
    ctx: &mut Contexts<B>,
    prefix: &[u32],
) {
    let device = model.device();
    let (rows, len) = (ctx.ids.len(), prefix.len());
    debug_assert!(ctx.cache.is_empty() && ctx.bias.is_none(), "fresh contexts");
    let ids: Vec<i64> = prefix.iter().map(|&id| i64::from(id)).collect();
    // [1, len]
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, len]), &device);
    let (cos, sin) = model.rotary_range(0, len);
    let bias = causal_bias::<B>(0, len, &device);
    // Only the K/V it writes are kept: [1, kv_heads, len, head_dim] per layer.
    let _ = model.forward_hidden(tokens, &cos, &sin, bias.as_ref(), Some(&mut ctx.cache));
    // [1, kv_heads, capacity, head_dim] -> [rows, kv_heads, capacity, head_dim]
    ctx.cache.select_rows(Tensor::zeros([rows], &device));
    ctx.push_bias(&vec![true; rows * len], len, &device);
    ctx.next_pos.iter_mut().for_each(|p| *p = len);
}

/// Reads `chunks[r]` into cached row `r` — all rows in one pass, each chunk left-padded to
/// the longest (an empty chunk is all padding), real tokens at the row's next positions,
/// pads masked for every later query — and returns the hidden state of the last position.
///
/// # Shapes
/// - output: `[rows, 1, d_model]`
fn read<B: AttentionOps>(
    model: &Transformer<B>,
    ctx: &mut Contexts<B>,
    chunks: &[Vec<u32>],
) -> Tensor<B, 3> {
    let device = model.device();
    let pos_cap = model.config().max_seq_len - 1;
    let rows = chunks.len();
    let width = chunks.iter().map(Vec::len).max().unwrap_or(0);
    debug_assert!(width > 0, "something to read");
    let cache_len = ctx.cache.len();
    let mut tokens = Vec::with_capacity(rows * width);
    let mut positions = Vec::with_capacity(rows * width);
    let mut real = Vec::with_capacity(rows * width);
    for (chunk, next_pos) in chunks.iter().zip(ctx.next_pos.iter_mut()) {
        let pads = width - chunk.len();
        tokens.extend(std::iter::repeat_n(PAD_ID, pads));
        positions.extend(std::iter::repeat_n(0, pads));
        real.extend(std::iter::repeat_n(false, pads));
        for (i, &id) in chunk.iter().enumerate() {
            tokens.push(i64::from(id));
            positions.push((*next_pos + i).min(pos_cap) as i64);
            real.push(true);
        }
        *next_pos += chunk.len();
    }
    ctx.push_bias(&real, width, &device);
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [rows, width]), &device);
    let positions =
        Tensor::<B, 2, Int>::from_data(TensorData::new(positions, [rows, width]), &device);
    let (cos, sin) = model.rotary_at(positions);
    let bias = combine_bias(
        causal_bias::<B>(cache_len, width, &device),
        ctx.bias.clone(),
    );
    model
        .forward_hidden(tokens, &cos, &sin, bias.as_ref(), Some(&mut ctx.cache))
        .narrow(1, width - 1, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type B = NdArray<f32>;

    /// The host rule in f64: the first id whose running sum exceeds `u` times the total.
    fn host_rule(p: &[f32], u: f64) -> (usize, bool) {
        let total: f64 = p.iter().map(|&x| x as f64).sum();
        let target = u * total;
        let mut run = 0.0;
        for (i, &x) in p.iter().enumerate() {
            run += x as f64;
            if run > target {
                // Near a boundary f32 sums may fall either side.
                let close = (run - target).abs() < 1e-5 * total
                    || (run - x as f64 - target).abs() < 1e-5 * total;
                return (i, close);
            }
        }
        (p.len() - 1, true)
    }

    /// The blockwise draw picks the id of the flat inverse-CDF rule, for vocabularies that
    /// fill their blocks or not (1, 2, 7, 64, 100, 1000 ids), uniforms from 0 to just below
    /// 1, and mass spread over many orders of magnitude.
    #[test]
    fn the_blockwise_draw_is_the_flat_inverse_cdf() {
        let device = Default::default();
        let mut rng = Rng::new(5);
        let mut checked = 0;
        for vocab in [1usize, 2, 7, 64, 100, 1000] {
            let rows = 10;
            let p: Vec<f32> = (0..rows * vocab)
                .map(|_| (rng.uniform() * 12.0 - 10.0).exp() as f32)
                .collect();
            let us: Vec<f32> = (0..rows)
                .map(|r| match r {
                    0 => 0.0,
                    1 => 0.999_999,
                    _ => rng.uniform() as f32,
                })
                .collect();
            let ids = inverse_cdf_in_blocks(
                Tensor::<B, 2>::from_data(TensorData::new(p.clone(), [rows, vocab]), &device),
                Tensor::<B, 2>::from_data(TensorData::new(us.clone(), [rows, 1]), &device),
            );
            let ids: Vec<i64> = ids.into_data().iter::<i64>().collect();
            for r in 0..rows {
                let (want, close) = host_rule(&p[r * vocab..(r + 1) * vocab], us[r] as f64);
                if !close {
                    assert_eq!(ids[r] as usize, want, "vocab {vocab}, row {r}, u {}", us[r]);
                    checked += 1;
                }
            }
        }
        assert!(checked >= 40, "{checked} rows away from a boundary");
    }
}
