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
//!    all start with the same [`SHARED_PREFIX_MIN`] = 16 tokens or more (a chat template's system
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
//! that stopped before the call's last step had its last token read by a later step of
//! that call; named again with nothing appended, it goes on from the hidden state kept
//! after that token (what reading the token in the next call would compute), so whatever
//! a policy writes, a row with room always generates. A row with no budget (nothing
//! read or kept, or no room for one token) gets an empty generation and is dropped. On a
//! fresh row a prompt of `max_seq_len` tokens or more keeps only its last `max_seq_len − 1`
//! tokens, so at least one token can be generated.
//!
//! The first call on fresh contexts computes exactly what one pass over the left-padded
//! prompts followed by cached decoding computes (the `generate` of earlier versions).
//!
//! Below the sampling loop are what the decoder's own forward passes (`transformer.rs`)
//! share with it: the causal and key-padding attention biases ([`causal_bias`],
//! [`combine_bias`]), the shared-prefix rule ([`shared_prefix_len`]), and the LM head as a
//! decode step reads it ([`Transformer::decode_logits`]).

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, FloatDType, TensorPrimitive};
use rlany_framework::ppo::in_f32;
use rlany_framework::sampling::Sampler;
use rlany_framework::{Generation, Rng, SampleParams};
use rlany_kernels::{AttentionOps, packed_matmul};

use crate::transformer::{KvCache, MASKED, PAD_ID, Transformer};

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
    /// Per cached row: the hidden state after its last read token, kept when that token was
    /// read by a decoding step after the row had stopped (`[1, 1, d_model]`), so that a
    /// next call with nothing new for the row can still sample from it.
    last_hidden: Vec<Option<Tensor<B, 3>>>,
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
            last_hidden: vec![None; rows],
            dropped: vec![false; rows],
            cache: model.new_cache(),
            bias: None,
        }
    }

    /// Number of cached positions (including padding).
    pub fn cached_len(&self) -> usize {
        self.cache.len()
    }

    /// The cache slot of row `id`.
    #[cfg(test)]
    fn slot(&self, id: usize) -> usize {
        self.ids
            .iter()
            .position(|&i| i == id)
            .expect("a cached row")
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
        self.last_hidden = slots.iter().map(|&s| self.last_hidden[s].take()).collect();
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
        // Nothing new to read: the row goes on from its kept hidden state, if it has one.
        let nothing = chunk.is_empty() && ctx.last_hidden[slot].is_none();
        let budget = if nothing || after >= max_seq_len {
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
    // pending is in the chunks now. A row with nothing to read takes its kept hidden state.
    ctx.pending.iter_mut().for_each(|p| *p = None);
    let kept: Vec<Option<Tensor<B, 3>>> = ctx
        .last_hidden
        .iter_mut()
        .zip(&chunks)
        .map(|(h, c)| h.take().filter(|_| c.is_empty()))
        .collect();
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
    let mut hidden = if kept.iter().all(Option::is_none) {
        read(model, ctx, &chunks)
    } else {
        with_kept(model, ctx, &chunks, kept)
    };

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
            // A stopped row's last token was read now: keep the state after it.
            for (r, f) in fed.iter().enumerate() {
                if finished[r] && !f.is_empty() {
                    ctx.last_hidden[r] = Some(hidden.clone().narrow(0, r, 1));
                }
            }
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
fn sample_on_device<B: AttentionOps>(
    logits: Tensor<B, 2>,
    finished: &[bool],
    temperature: f64,
    rng: &mut Rng,
) -> Vec<Option<(u32, f32)>> {
    let [batch, _] = logits.dims();
    let device = logits.device();
    // One uniform per unfinished row, in row order, whichever path draws.
    let u = (temperature > 0.0).then(|| {
        let uniforms: Vec<f32> = finished
            .iter()
            .map(|&f| if f { 0.0 } else { rng.uniform() as f32 })
            .collect();
        Tensor::<B, 1>::from_data(TensorData::new(uniforms, [batch]), &device)
    });
    // [batch, 2]: id (exact in f32 below 2^24) and log-probability — one kernel where the
    // backend has it ([`AttentionOps::sample_rows`]), else composed.
    let drawn = B::sample_rows(
        logits.clone().into_primitive().tensor(),
        u.clone().map(|u| u.into_primitive().tensor()),
        temperature,
    )
    .map(|t| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)))
    .unwrap_or_else(|| {
        // [batch, 1]
        let ids = match u {
            Some(u) => {
                let max = logits.clone().max_dim(1);
                // [batch, vocab]: the tempered, unnormalised probabilities.
                let p = (logits.clone() - max).div_scalar(temperature).exp();
                inverse_cdf_in_blocks(p, u.reshape([batch, 1]))
            }
            None => logits.clone().argmax(1),
        };
        let logprobs = log_softmax(logits, 1).gather(1, ids.clone());
        Tensor::cat(vec![ids.float(), logprobs], 1)
    });
    let packed: Vec<f32> = drawn.into_data().iter::<f32>().collect();
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

/// [`read`] for a batch where the rows with `kept` hidden states have nothing to read: the
/// others are read in one pass (those rows padded through it, when any row reads), and each
/// row's hidden state is its kept one or what the pass computed.
///
/// # Shapes
/// - `kept`: per row, `None` or `[1, 1, d_model]`
/// - output: `[rows, 1, d_model]`
fn with_kept<B: AttentionOps>(
    model: &Transformer<B>,
    ctx: &mut Contexts<B>,
    chunks: &[Vec<u32>],
    kept: Vec<Option<Tensor<B, 3>>>,
) -> Tensor<B, 3> {
    let fresh = chunks
        .iter()
        .any(|c| !c.is_empty())
        .then(|| read(model, ctx, chunks));
    let rows: Vec<Tensor<B, 3>> = kept
        .into_iter()
        .enumerate()
        .map(|(r, k)| match (k, &fresh) {
            (Some(k), _) => k,
            (None, Some(f)) => f.clone().narrow(0, r, 1),
            (None, None) => unreachable!("a row without a kept state reads something"),
        })
        .collect();
    Tensor::cat(rows, 0)
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

/// The shortest common prefix of a batch's rows that [`Transformer::hidden_at`] computes
/// once instead of once per row (below it, the second pass costs more than it saves).
pub const SHARED_PREFIX_MIN: usize = 16;

/// How many leading tokens every row shares, when two rows or more share
/// [`SHARED_PREFIX_MIN`] or more; 0 otherwise. At most the shortest row's length − 1, so that
/// every row keeps a position of its own after the prefix (the one whose hidden state is read
/// last). The one rule for the training forward ([`Transformer::hidden_at`]) and generation
/// ([`extend`]).
pub(crate) fn shared_prefix_len<T: PartialEq, R: AsRef<[T]>>(rows: &[R]) -> usize {
    let Some((first, others)) = rows.split_first() else {
        return 0;
    };
    if others.is_empty() {
        return 0;
    }
    let first = first.as_ref();
    let shortest = rows.iter().map(|r| r.as_ref().len()).min().unwrap_or(0);
    let common = (0..shortest)
        .take_while(|&j| others.iter().all(|r| r.as_ref()[j] == first[j]))
        .count()
        .min(shortest.saturating_sub(1));
    if common >= SHARED_PREFIX_MIN {
        common
    } else {
        0
    }
}

/// [`shared_prefix_len`] of the rows of `tokens` (their ids read to the host).
///
/// # Shapes
/// - `tokens`: `[batch, seq]`, `seq > 0`
pub(crate) fn tokens_shared_prefix<B: Backend>(tokens: &Tensor<B, 2, Int>) -> usize {
    let [_, seq] = tokens.dims();
    let ids = tokens.clone().into_data().convert::<i64>();
    let Ok(ids) = ids.to_vec::<i64>() else {
        return 0;
    };
    // [batch * seq] -> batch rows of seq
    let rows: Vec<&[i64]> = ids.chunks(seq).collect();
    shared_prefix_len(&rows)
}

/// Additive causal bias: query `i` (absolute position `cache_len + i`) sees keys
/// `j <= cache_len + i`. `None` when `seq == 1` (a single new query sees every key).
///
/// # Shapes
/// - output: `[1, 1, seq, cache_len + seq]` (f32)
pub(crate) fn causal_bias<B: Backend>(
    cache_len: usize,
    seq: usize,
    device: &B::Device,
) -> Option<Tensor<B, 4>> {
    if seq <= 1 {
        return None;
    }
    let keys = cache_len + seq;
    let mut bias = vec![0.0f32; seq * keys];
    for i in 0..seq {
        for j in (cache_len + i + 1)..keys {
            bias[i * keys + j] = MASKED;
        }
    }
    Some(Tensor::from_data(
        TensorData::new(bias, [1, 1, seq, keys]),
        (device, DType::F32),
    ))
}

/// Sum of the optional causal and key-padding biases.
pub(crate) fn combine_bias<B: Backend>(
    causal: Option<Tensor<B, 4>>,
    keys: Option<Tensor<B, 4>>,
) -> Option<Tensor<B, 4>> {
    match (causal, keys) {
        (Some(c), Some(k)) => Some(c + k),
        (c, k) => c.or(k),
    }
}

/// Elements of the embedding in one slice of the tied LM head while decoding (4 MiB in f32;
/// see [`Transformer::decode_logits`]).
const HEAD_SLICE: usize = 1 << 20;

impl<B: AttentionOps> Transformer<B> {
    /// [`Transformer::logits`] for decoding: the same logits, bit for bit on NdArray, with a
    /// tied head computed one slice of the vocabulary at a time.
    ///
    /// Burn's NdArray backend copies both operands of every matrix product into fresh
    /// row-major buffers, so `hidden · embeddingᵀ` gathers the whole transposed embedding
    /// element by element on every decode step (SmolLM2: 28M strided reads, ~2/3 of a decode
    /// step). Here each slice of [`HEAD_SLICE`] embedding elements, a contiguous view, is the
    /// left operand of `embedding[slice] · hiddenᵀ`: a contiguous copy small enough to stay
    /// in cache. Each logit is still one dot product over `d_model` in the same order
    /// (`a·b = b·a`; the product is blocked along `d_model` alone, never along the vocabulary
    /// or the rows; the test `sliced_tied_head_is_bit_identical` checks it). A GPU backend may
    /// tile the slices differently from the whole product (not checked bit for bit there).
    /// [`Transformer::logits`] itself, used by training, keeps the single product; an untied
    /// head (the models trained from scratch) goes through it unchanged.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab]`
    pub(crate) fn decode_logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        if let Some(head) = self.packed.as_ref().and_then(|p| p.head.as_deref()) {
            let [batch, seq, d_model] = hidden.dims();
            // [batch * seq, d_model] -> [batch * seq, vocab] -> [batch, seq, vocab]
            let flat = hidden.clone().reshape([batch * seq, d_model]);
            if let Some(logits) = packed_matmul(&flat, head) {
                return logits.reshape([batch, seq, self.config.vocab_size]);
            }
        }
        let rows = HEAD_SLICE / self.config.d_model;
        in_f32(self.sliced_logits(hidden, rows))
    }

    /// [`Transformer::decode_logits`] with slices of `rows` vocabulary entries (the last one
    /// shorter); the untied head is one product as in [`Transformer::logits`].
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab]`
    fn sliced_logits(&self, hidden: Tensor<B, 3>, rows: usize) -> Tensor<B, 3> {
        if self.lm_head.is_some() {
            return self.logits(hidden);
        }
        let [batch, seq, d_model] = hidden.dims();
        let (device, dtype) = (hidden.device(), hidden.dtype());
        let vocab = self.config.vocab_size;
        let rows = rows.clamp(1, vocab);
        // [batch * seq, d_model] -> [d_model, batch * seq]
        let columns = hidden.reshape([batch * seq, d_model]).transpose();
        let embedding = self.embedding.weight.val();
        // [rows, d_model] x [d_model, batch * seq] per slice -> [vocab, batch * seq]
        let slices = (0..vocab)
            .step_by(rows)
            .map(|start| {
                embedding
                    .clone()
                    .narrow(0, start, rows.min(vocab - start))
                    .matmul(columns.clone())
            })
            .collect();
        // [vocab, batch * seq] -> [batch * seq, vocab] -> [batch, seq, vocab]
        let logits = Tensor::cat(slices, 0)
            .transpose()
            .reshape([batch, seq, vocab]);
        // Copied into a fresh buffer: NdArray reads a tensor to the host in one copy only when
        // its strides are exactly row-major, and the reshape gives a length-1 axis stride 1
        // (read element by element, the SmolLM2 logits take ~1.5 ms more per step).
        Tensor::zeros([batch, seq, vocab], (&device, dtype))
            .slice_assign([0..batch, 0..seq, 0..vocab], logits)
    }
}

#[cfg(test)]
mod tests {
    use rlany_framework::CausalLm;

    use super::*;
    use crate::test_support::{
        B, argmax, int_tensor, max_abs_diff, model, row_logits, tiny, to_vec,
    };
    use crate::transformer::TransformerConfig;

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

    fn params(temperature: f64, top_p: f64, max_new_tokens: usize, stop: Vec<u32>) -> SampleParams {
        SampleParams {
            temperature,
            top_p,
            max_new_tokens,
            stop_tokens: stop,
            on_device: false,
        }
    }

    #[test]
    fn sampling_on_the_device_follows_the_host_rule() {
        let model = model(&tiny(), 29);
        for (temperature, stop) in [(0.0, vec![]), (1.0, vec![4, 9]), (0.7, vec![])] {
            let host = params(temperature, 1.0, 10, stop);
            let device = SampleParams {
                on_device: true,
                ..host.clone()
            };
            let (mut rh, mut rd) = (Rng::new(31), Rng::new(31));
            let a = model.generate(&prompts(), &host, &mut rh);
            let b = model.generate(&prompts(), &device, &mut rd);
            assert_eq!(rh, rd, "the same uniforms are drawn");
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.tokens, y.tokens, "T = {temperature}");
                assert_eq!(x.stopped, y.stopped);
                assert!(max_abs_diff(&x.logprobs, &y.logprobs) <= 1e-4);
            }
        }
    }

    fn prompts() -> Vec<Vec<u32>> {
        vec![
            vec![1, 40, 41, 42, 43, 44],
            vec![1, 50],
            vec![1, 60, 61, 62],
            vec![1],
        ]
    }

    #[test]
    fn greedy_generation_is_the_argmax_of_forward() {
        let model = model(&tiny(), 21);
        let p = params(0.0, 1.0, 8, vec![]);
        let a = model.generate(&prompts(), &p, &mut Rng::new(1));
        let b = model.generate(&prompts(), &p, &mut Rng::new(2));
        assert_eq!(a, b);
        for (prompt, g) in prompts().iter().zip(&a) {
            assert_eq!(g.tokens.len(), 8);
            assert!(!g.stopped);
            let mut context = prompt.clone();
            for (&tok, &lp) in g.tokens.iter().zip(&g.logprobs) {
                let logits = row_logits(&model, &context);
                let last = &logits[logits.len() - 1];
                assert_eq!(tok, argmax(last));
                let lse = last.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
                assert!((lp as f64 - (last[tok as usize] as f64 - lse)).abs() < 1e-4);
                context.push(tok);
            }
        }
    }

    #[test]
    fn sampling_is_reproducible_per_seed() {
        let model = model(&tiny(), 22);
        let p = params(1.0, 1.0, 12, vec![]);
        let a = model.generate(&prompts(), &p, &mut Rng::new(7));
        let b = model.generate(&prompts(), &p, &mut Rng::new(7));
        let c = model.generate(&prompts(), &p, &mut Rng::new(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The rng advanced by exactly one draw per sampled token.
        let mut rng = Rng::new(7);
        model.generate(&prompts(), &p, &mut rng);
        let mut expect = Rng::new(7);
        for _ in 0..a.iter().map(|g| g.tokens.len()).sum::<usize>() {
            expect.uniform();
        }
        assert_eq!(rng, expect);
    }

    #[test]
    fn sampled_logprobs_match_log_softmax_of_forward() {
        let model = model(&tiny(), 23);
        let p = params(0.8, 0.9, 10, vec![]);
        let gens = model.generate(&prompts(), &p, &mut Rng::new(3));
        for (prompt, g) in prompts().iter().zip(&gens) {
            let full: Vec<u32> = prompt.iter().chain(&g.tokens).copied().collect();
            let ids: Vec<i64> = full.iter().map(|&t| i64::from(t)).collect();
            let logp = log_softmax(CausalLm::forward(&model, int_tensor(&[ids])), 2);
            let (flat, [_, _, vocab]) = to_vec(logp);
            for (k, (&tok, &lp)) in g.tokens.iter().zip(&g.logprobs).enumerate() {
                assert!(lp <= 0.0);
                let at = prompt.len() - 1 + k;
                let want = flat[at * vocab + tok as usize];
                assert!((lp - want).abs() <= 1e-4, "{lp} vs {want}");
            }
        }
    }

    #[test]
    fn stop_tokens_end_rows_at_their_own_length() {
        let model = model(&tiny(), 24);
        // A third of the vocabulary stops a row: rows stop early, at different steps.
        let stop: Vec<u32> = (0..100).filter(|t| t % 3 == 0).collect();
        let p = params(1.0, 1.0, 20, stop.clone());
        let gens = model.generate(&prompts(), &p, &mut Rng::new(4));
        let mut lengths = Vec::new();
        for g in &gens {
            assert_eq!(g.tokens.len(), g.logprobs.len());
            assert!(!g.tokens.is_empty() && g.tokens.len() <= 20);
            let (last, body) = g.tokens.split_last().expect("non-empty");
            assert!(body.iter().all(|t| !stop.contains(t)));
            assert_eq!(g.stopped, stop.contains(last));
            if !g.stopped {
                assert_eq!(g.tokens.len(), 20);
            }
            lengths.push(g.tokens.len());
        }
        assert!(gens.iter().any(|g| g.stopped));
        lengths.sort_unstable();
        lengths.dedup();
        assert!(lengths.len() > 1, "all rows stopped at the same length");
    }

    #[test]
    fn budgets_respect_max_new_tokens_and_max_seq_len() {
        let config = TransformerConfig {
            max_seq_len: 10,
            ..tiny()
        };
        let model = model(&config, 25);
        let long: Vec<u32> = (0..15).map(|i| 5 + i).collect();
        let prompts = vec![vec![1, 5, 6], long.clone(), vec![1, 5, 6, 7, 8, 9, 10, 11]];
        let gens = model.generate(&prompts, &params(1.0, 1.0, 5, vec![]), &mut Rng::new(1));
        // 3 + 5 <= 10; the long prompt keeps its last 9 tokens -> 1 new; 8 + 2 = 10.
        let lens: Vec<usize> = gens.iter().map(|g| g.tokens.len()).collect();
        assert_eq!(lens, vec![5, 1, 2]);
        // The truncated prompt behaves as its last 9 tokens alone.
        let greedy = params(0.0, 1.0, 5, vec![]);
        let a = model.generate(std::slice::from_ref(&long), &greedy, &mut Rng::new(1));
        let b = model.generate(&[long[6..].to_vec()], &greedy, &mut Rng::new(1));
        assert_eq!(a, b);
        // No new tokens, no prompts, an empty prompt.
        assert!(
            model
                .generate(&prompts, &params(1.0, 1.0, 0, vec![]), &mut Rng::new(1))
                .iter()
                .all(|g| g.tokens.is_empty() && !g.stopped)
        );
        assert!(model.generate(&[], &greedy, &mut Rng::new(1)).is_empty());
        let mixed = model.generate(&[vec![], vec![1, 5]], &greedy, &mut Rng::new(1));
        assert!(mixed[0].tokens.is_empty());
        assert_eq!(mixed[1].tokens.len(), 5);
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let model = model(&tiny(), 26);
        let greedy = model.generate(&prompts(), &params(0.0, 1.0, 8, vec![]), &mut Rng::new(1));
        let nucleus = model.generate(&prompts(), &params(1.5, 1e-6, 8, vec![]), &mut Rng::new(9));
        assert_eq!(greedy, nucleus);
    }

    #[test]
    fn batched_generation_equals_one_row_at_a_time() {
        let model = model(&tiny(), 27);
        let p = params(0.0, 1.0, 6, vec![4]);
        let batched = model.generate(&prompts(), &p, &mut Rng::new(1));
        for (prompt, g) in prompts().iter().zip(&batched) {
            let alone = model.generate(std::slice::from_ref(prompt), &p, &mut Rng::new(1));
            assert_eq!(alone[0].tokens, g.tokens);
            assert!(max_abs_diff(&alone[0].logprobs, &g.logprobs) <= 1e-4);
        }
    }

    #[test]
    fn a_prefix_is_shared_from_sixteen_common_tokens() {
        let head: Vec<u32> = (0..20).collect();
        let with = |rest: &[u32]| -> Vec<u32> { head.iter().chain(rest).copied().collect() };
        let len = |rows: &[Vec<u32>]| shared_prefix_len(rows);
        // 20 common tokens, then the rows differ.
        assert_eq!(len(&[with(&[1]), with(&[2, 3])]), 20);
        // A row that is the prefix itself keeps its last token: 19.
        assert_eq!(len(&[head.clone(), with(&[2, 3])]), 19);
        // Identical rows: all but the last token.
        assert_eq!(len(&[with(&[9]), with(&[9])]), 20);
        // Rows that differ at token 15 share too little; one row, or none, shares nothing.
        let mut early = with(&[1]);
        early[15] = 99;
        assert_eq!(len(&[with(&[1]), early]), 0);
        assert_eq!(len(&[with(&[1])]), 0);
        assert_eq!(len(&[]), 0);
    }

    #[test]
    fn a_prefix_read_once_gives_every_row_its_own_generation() {
        // 20 shared tokens (the path that reads them once), then remainders of 1, 4 and 9
        // tokens and one prompt that is the prefix plus a single token.
        let prefix: Vec<u32> = (0..20).map(|i| 10 + (i * 7) % 80).collect();
        let prompts: Vec<Vec<u32>> = [vec![5], vec![6, 7, 8, 9], vec![3; 9], vec![11]]
            .into_iter()
            .map(|rest| prefix.iter().copied().chain(rest).collect())
            .collect();
        for config in [tiny(), tiny().with_qkv_bias(true)] {
            let model = model(&config, 31);
            let p = params(0.0, 1.0, 6, vec![4]);
            let mut contexts = model.contexts(prompts.len());
            let rows: Vec<usize> = (0..prompts.len()).collect();
            let first = model.extend(&mut contexts, &rows, &prompts, &p, &mut Rng::new(1));
            // A second turn on the kept contexts: the rows' positions and masks after the
            // shared read are right.
            let appended: Vec<Vec<u32>> = vec![vec![70, 71], vec![72], vec![73, 74, 75], vec![76]];
            let second = model.extend(&mut contexts, &rows, &appended, &p, &mut Rng::new(1));
            for r in rows {
                let alone = model.generate(std::slice::from_ref(&prompts[r]), &p, &mut Rng::new(1));
                assert_eq!(alone[0].tokens, first[r].tokens, "row {r}");
                assert!(max_abs_diff(&alone[0].logprobs, &first[r].logprobs) <= 1e-4);
                let whole: Vec<u32> = prompts[r]
                    .iter()
                    .chain(&first[r].tokens)
                    .chain(&appended[r])
                    .copied()
                    .collect();
                let alone = model.generate(std::slice::from_ref(&whole), &p, &mut Rng::new(1));
                assert_eq!(alone[0].tokens, second[r].tokens, "row {r}, second turn");
                assert!(max_abs_diff(&alone[0].logprobs, &second[r].logprobs) <= 1e-4);
            }
        }
    }

    #[test]
    fn turns_on_kept_contexts_equal_generation_from_the_whole_context() {
        for (config, temperature) in [(tiny(), 0.0), (tiny().with_qkv_bias(true), 1.0)] {
            let model = model(&config, 28);
            // Rows stop at different steps; row 2 leaves after the first turn. Turns 3 and 4
            // append nothing to some rows (an environment whose observation is empty after
            // a step that ended its line): a row that stopped before the call's last step
            // had its last token read already, and must go on from there, not be dropped.
            let stop: Vec<u32> = (0..100).filter(|t| t % 3 == 0).collect();
            let p = params(temperature, 1.0, 6, stop);
            let appends: [Vec<Vec<u32>>; 5] = [
                prompts(),
                vec![vec![30, 31, 32], vec![33], vec![], vec![34, 35, 36, 37, 38]],
                vec![vec![40], vec![41, 42, 43, 44, 45, 46, 47], vec![], vec![48]],
                vec![vec![], vec![], vec![], vec![]],
                vec![vec![], vec![50, 51], vec![], vec![]],
            ];
            let turn_rows: [Vec<usize>; 5] = [
                vec![0, 1, 2, 3],
                vec![0, 1, 3],
                vec![3, 0, 1],
                vec![0, 1, 3],
                vec![1, 3, 0],
            ];
            let mut some_row_had_read_its_last_token = false;
            let mut contexts = model.contexts(4);
            let mut whole: Vec<Vec<u32>> = vec![Vec::new(); 4];
            let mut rng = Rng::new(5);
            for (turn, rows) in turn_rows.iter().enumerate() {
                let appended: Vec<Vec<u32>> =
                    rows.iter().map(|&r| appends[turn][r].clone()).collect();
                // The reference: each row alone, from its whole context, with the draws it
                // takes in the batched call (rows draw in call order, one per sampled token).
                let before = rng.clone();
                if turn >= 3 {
                    some_row_had_read_its_last_token |= rows
                        .iter()
                        .any(|&r| contexts.last_hidden[contexts.slot(r)].is_some());
                }
                let gens = model.extend(&mut contexts, rows, &appended, &p, &mut rng);
                assert!(contexts.cached_len() > 0);
                let mut replay = before;
                let mut draws: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
                let longest = gens.iter().map(|g| g.tokens.len()).max().unwrap_or(0);
                for step in 0..longest {
                    for (k, g) in gens.iter().enumerate() {
                        if step < g.tokens.len() && temperature > 0.0 {
                            draws[k].push(replay.uniform());
                        }
                    }
                }
                assert_eq!(replay, rng, "one draw per sampled token");
                for (k, (&r, g)) in rows.iter().zip(&gens).enumerate() {
                    whole[r].extend(&appended[k]);
                    let alone = if temperature > 0.0 {
                        // Replays row k's own uniforms through a stream that yields them.
                        let mut fake = FixedUniforms(draws[k].clone());
                        fake.generate(&model, &whole[r], &p)
                    } else {
                        model
                            .generate(std::slice::from_ref(&whole[r]), &p, &mut Rng::new(0))
                            .remove(0)
                    };
                    assert!(
                        !g.tokens.is_empty(),
                        "turn {turn} row {r}: nothing generated"
                    );
                    assert_eq!(alone.tokens, g.tokens, "turn {turn} row {r}");
                    assert_eq!(alone.stopped, g.stopped);
                    assert!(max_abs_diff(&alone.logprobs, &g.logprobs) <= 1e-4);
                    whole[r].extend(&g.tokens);
                }
            }
            assert!(
                some_row_had_read_its_last_token,
                "the turns never met a row whose last token was read"
            );
            assert!(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    model.extend(&mut contexts, &[2], &[vec![5]], &p, &mut Rng::new(1))
                }))
                .is_err(),
                "a dropped row cannot come back"
            );
        }
    }

    /// Counts down one line a step and shows nothing between steps: after a step that ended
    /// its line, nothing is new for the policy to read.
    struct Countdown(usize);
    impl rlany_framework::Episode for Countdown {
        fn prompt(&self) -> String {
            format!("count down from {}\n", self.0)
        }
        fn step(&mut self, action: &str) -> rlany_framework::StepResult {
            let right = action.trim() == (self.0 - 1).to_string();
            self.0 -= 1;
            rlany_framework::StepResult::taken(String::new(), self.0 == 0, right, vec![], vec![])
        }
        fn done(&self) -> bool {
            self.0 == 0
        }
        fn outcome(&self) -> bool {
            false
        }
    }

    /// The run that panicked ("row 1 was dropped by an earlier call"): an environment whose
    /// observation is empty mid-episode, a policy sampled at `top_p: 1.0` whose rows end
    /// their lines at different steps. Every episode now plays all its steps.
    #[test]
    fn a_rollout_with_empty_observations_plays_every_step() {
        let model = model(&tiny(), 31);
        let tok = crate::tokenizer::CharTokenizer::new();
        // Stop at the newline or at end-of-sequence, as a rollout of the character model does.
        let p = params(1.0, 1.0, 4, vec![4, 2]);
        for seed in 0..4 {
            let episodes: Vec<(usize, Box<dyn rlany_framework::Episode>)> = (0..16)
                .map(|i| {
                    (
                        i,
                        Box::new(Countdown(6)) as Box<dyn rlany_framework::Episode>,
                    )
                })
                .collect();
            let trajs = rlany_framework::rollout::rollout(
                &model,
                &tok,
                episodes,
                &p,
                8,
                &mut Rng::new(seed),
            );
            for t in &trajs {
                assert_eq!(t.steps.len(), 6, "seed {seed} task {}", t.task);
            }
        }
    }

    /// Sampling one row with given uniforms: token by token through full forwards, by the
    /// same inverse-CDF rule as the sampler.
    struct FixedUniforms(Vec<f64>);
    impl FixedUniforms {
        fn generate(
            &mut self,
            model: &Transformer<B>,
            context: &[u32],
            p: &SampleParams,
        ) -> Generation {
            let mut ctx = context.to_vec();
            let mut g = Generation {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                stopped: false,
            };
            for u in self.0.drain(..) {
                let logits = row_logits(model, &ctx);
                let last = &logits[logits.len() - 1];
                let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let probs: Vec<f64> = last
                    .iter()
                    .map(|&l| ((l as f64 - max) / p.temperature).exp())
                    .collect();
                let total: f64 = probs.iter().sum();
                let (mut acc, mut id) = (0.0, probs.len() - 1);
                for (i, q) in probs.iter().enumerate() {
                    acc += q;
                    if acc > u * total {
                        id = i;
                        break;
                    }
                }
                let lse = last
                    .iter()
                    .map(|&l| (l as f64 - max).exp())
                    .sum::<f64>()
                    .ln()
                    + max;
                g.tokens.push(id as u32);
                g.logprobs.push((last[id] as f64 - lse) as f32);
                ctx.push(id as u32);
                if p.stop_tokens.contains(&(id as u32)) {
                    g.stopped = true;
                }
            }
            g
        }
    }

    #[test]
    fn sliced_tied_head_is_bit_identical() {
        // d_model 600 > 2 x the 256-long blocks of the CPU product, so the partial last block
        // along d_model is exercised; slices of 7 and 64 rows, with a short last slice.
        let config = TransformerConfig::new(1000, 600, 1, 4, 2, 16, 8).with_tie_embeddings(true);
        let model = model(&config, 30);
        let mut rng = Rng::new(31);
        for (batch, seq) in [(1, 1), (3, 1), (2, 7)] {
            let values: Vec<f32> = (0..batch * seq * 600)
                .map(|_| (3.0 * rng.normal()) as f32)
                .collect();
            let hidden = Tensor::<B, 3>::from_data(
                TensorData::new(values, [batch, seq, 600]),
                &Default::default(),
            );
            let want = to_vec(model.logits(hidden.clone())).0;
            for rows in [7, 64, 1000] {
                let got = to_vec(model.sliced_logits(hidden.clone(), rows)).0;
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "batch {batch}, seq {seq}, {rows} rows per slice");
            }
            assert_eq!(to_vec(model.decode_logits(hidden)).0, want);
        }
    }
}
