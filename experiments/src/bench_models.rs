//! `rlany bench --models`: the model workloads of kernels/BENCH.md, run through the code the
//! training loop runs — the rollout through `CausalLm::generate` (KV cache; tokens chosen on
//! the device except on the CPU backend, from a seeded stream), the PPO step through the framework's token log-probs, PPO loss,
//! global-norm clip and AdamW.
//!
//! | workload | work |
//! |---|---|
//! | `R_<model>` | rollout: `batch` rows, a prompt of `prompt` random tokens, `sampled` tokens sampled (temperature 1, no stop token); generated tokens/s |
//! | `T_<model>` | one PPO step on `[batch, seq + 1]` random tokens against given old log-probs (clip ε 0.2, 0.01·K3 KL, grad-norm clip 1.0, AdamW); trained tokens/s |
//!
//! Models (Llama-style, QKV bias, untied head, RoPE θ 10⁴, RMSNorm ε 10⁻⁶): `small` (V 4096,
//! d 512, 8 layers, 8/8 heads, FFN 1408, f32), `qwen05b` (V 151936, d 896, 24 layers, 14/2
//! heads, FFN 4864, bf16) and the CPU's `tiny` (V 64, d 128, 4 layers, 4/4 heads, FFN 384).
//! The full sizes are for a GPU. `--quick` runs reduced batches and lengths on `small` and
//! the tiny workloads (`C_tiny_T` at its full size) — a minute on a CPU; its rows are named
//! `…@quick` so they are never set beside full-size numbers.
//!
//! `T_smollm2_lora` is a PPO update of the model `experiments/pretrained/smollm2_arith_lora.ron`
//! trains: SmolLM2-135M's shape (V 49152, d 576, 30 layers, 9/3 heads, FFN 1536, tied head, no
//! QKV bias, RoPE θ 10⁵, RMSNorm ε 10⁻⁵, f32; weights drawn from a seed, which the time does
//! not depend on), frozen, with the file's rank-8 adapters on `q_proj` and `v_proj` — on 8
//! random rows of 128 tokens in one pass, not the file's episodes and micro-batches. Train
//! rows also report GFLOP/s: the dense products' arithmetic ([`Workload::train_flop`]) over
//! the median time.
//!
//! Timing: one warm-up run, the device synchronised before each clock read, the median of
//! the repeats; `device_reserved_bytes` is what the backend's memory pools hold after the
//! workload (their peak), where the backend reports it.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::optim::AdamWConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, FloatDType};
use rlany_framework::batch::{host_tensor, sequence_logprobs, token_batch};
use rlany_framework::ppo::loss::{KlTerm, SampledKl, ppo_loss};
use rlany_framework::{CausalLm, Rng, SampleParams};
use rlany_kernels::{AttentionOps, AutodiffLogProbOps, KernelChoice, LogProbOps};
use rlany_models::{Transformer, TransformerConfig};

/// A model shape of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shape {
    pub name: &'static str,
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    /// The dtype the workload is defined in.
    pub dtype: FloatDType,
    /// The head shares the embedding's weights (SmolLM2) instead of its own (BENCH.md's).
    pub tied: bool,
    /// Biases on the q/k/v projections (BENCH.md's models; not SmolLM2).
    pub qkv_bias: bool,
    pub rope_theta: f32,
    pub norm_eps: f64,
}

pub(crate) const SMALL: Shape = Shape {
    name: "small",
    vocab: 4096,
    d_model: 512,
    layers: 8,
    heads: 8,
    kv_heads: 8,
    ffn: 1408,
    dtype: FloatDType::F32,
    tied: false,
    qkv_bias: true,
    rope_theta: 10_000.0,
    norm_eps: 1e-6,
};

pub(crate) const QWEN05B: Shape = Shape {
    name: "qwen05b",
    vocab: 151_936,
    d_model: 896,
    layers: 24,
    heads: 14,
    kv_heads: 2,
    ffn: 4864,
    dtype: FloatDType::BF16,
    tied: false,
    qkv_bias: true,
    rope_theta: 10_000.0,
    norm_eps: 1e-6,
};

pub(crate) const TINY: Shape = Shape {
    name: "tiny",
    vocab: 64,
    d_model: 128,
    layers: 4,
    heads: 4,
    kv_heads: 4,
    ffn: 384,
    dtype: FloatDType::F32,
    tied: false,
    qkv_bias: true,
    rope_theta: 10_000.0,
    norm_eps: 1e-6,
};

/// SmolLM2-135M(-Instruct)'s shape, as its GGUF and Hugging Face configs give it.
pub(crate) const SMOLLM2: Shape = Shape {
    name: "smollm2",
    vocab: 49_152,
    d_model: 576,
    layers: 30,
    heads: 9,
    kv_heads: 3,
    ffn: 1536,
    dtype: FloatDType::F32,
    tied: true,
    qkv_bias: false,
    rope_theta: 100_000.0,
    norm_eps: 1e-5,
};

/// What one workload does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Work {
    /// `batch` rows, `prompt` random tokens, `sampled` tokens sampled each.
    Rollout {
        batch: usize,
        prompt: usize,
        sampled: usize,
    },
    /// One PPO step on `[batch, seq + 1]` tokens.
    Train { batch: usize, seq: usize },
}

/// One named workload.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Workload {
    pub name: String,
    pub shape: Shape,
    pub work: Work,
    /// Rank-8 adapters (α 16) on `q_proj` and `v_proj`, the base frozen (the SmolLM2 LoRA
    /// files' setting); otherwise every weight is trained.
    pub lora: bool,
}

/// The workloads: BENCH.md's full sizes, or the CPU's `--quick` ones.
pub(crate) fn workloads(quick: bool) -> Vec<Workload> {
    let w = |name: &str, shape: Shape, work: Work| Workload {
        name: name.to_string(),
        shape,
        work,
        lora: false,
    };
    // The CPU's PPO update of the SmolLM2 LoRA file, in both lists: its size is the CPU's.
    let smollm2_lora = Workload {
        lora: true,
        ..w(
            "T_smollm2_lora",
            SMOLLM2,
            Work::Train { batch: 8, seq: 128 },
        )
    };
    if quick {
        vec![
            w(
                "R_small@quick",
                SMALL,
                Work::Rollout {
                    batch: 4,
                    prompt: 16,
                    sampled: 16,
                },
            ),
            w("T_small@quick", SMALL, Work::Train { batch: 2, seq: 32 }),
            w(
                "C_tiny_R@quick",
                TINY,
                Work::Rollout {
                    batch: 32,
                    prompt: 32,
                    sampled: 48,
                },
            ),
            w(
                "C_tiny_T",
                TINY,
                Work::Train {
                    batch: 32,
                    seq: 128,
                },
            ),
            smollm2_lora,
        ]
    } else {
        vec![
            w(
                "R_small",
                SMALL,
                Work::Rollout {
                    batch: 256,
                    prompt: 64,
                    sampled: 192,
                },
            ),
            w(
                "T_small",
                SMALL,
                Work::Train {
                    batch: 64,
                    seq: 256,
                },
            ),
            w(
                "R_qwen05b",
                QWEN05B,
                Work::Rollout {
                    batch: 128,
                    prompt: 128,
                    sampled: 128,
                },
            ),
            w(
                "T_qwen05b",
                QWEN05B,
                Work::Train {
                    batch: 16,
                    seq: 512,
                },
            ),
            w(
                "C_tiny_T",
                TINY,
                Work::Train {
                    batch: 32,
                    seq: 128,
                },
            ),
            smollm2_lora,
        ]
    }
}

impl Shape {
    /// Our decoder with this shape, context `max_seq_len`.
    pub(crate) fn config(&self, max_seq_len: usize) -> TransformerConfig {
        TransformerConfig::new(
            self.vocab,
            self.d_model,
            self.layers,
            self.heads,
            self.kv_heads,
            self.ffn,
            max_seq_len,
        )
        .with_qkv_bias(self.qkv_bias)
        .with_tie_embeddings(self.tied)
        .with_norm_eps(self.norm_eps)
        .with_rope_theta(self.rope_theta)
    }

    /// Multiply-adds of one token's dense products: every layer's q, k, v, o and MLP
    /// projections, and the head.
    pub(crate) fn product_weights(&self) -> usize {
        let head_dim = self.d_model / self.heads;
        let (q, kv) = (self.heads * head_dim, self.kv_heads * head_dim);
        let per_layer =
            self.d_model * (q + 2 * kv) + q * self.d_model + 3 * self.d_model * self.ffn;
        self.layers * per_layer + self.vocab * self.d_model
    }
}

impl Workload {
    /// This workload with `rows` rows (rollout rows or PPO rows), named `<name>@rows<rows>` so
    /// that it is never set beside the workload's own size: the shares of a PPO step's time
    /// at a fraction of its rows on a slow device.
    pub(crate) fn with_rows(&self, rows: usize) -> Self {
        let work = match self.work {
            Work::Rollout {
                prompt, sampled, ..
            } => Work::Rollout {
                batch: rows,
                prompt,
                sampled,
            },
            Work::Train { seq, .. } => Work::Train { batch: rows, seq },
        };
        Self {
            name: format!("{}@rows{rows}", self.name),
            work,
            ..self.clone()
        }
    }

    /// FLOPs of one PPO step's dense products (`None` for a rollout): per trained token, the
    /// forward's `2·W` (W = [`Shape::product_weights`]), the backward's input gradients `2·W`
    /// and, where the weights train, their gradients `2·W` more. A frozen base with adapters
    /// (`lora`) has no weight gradients to compute; the adapters' own products (< 0.5% at
    /// rank 8) and the attention's scores (≈ 2% at 128 tokens) are left out, so the rate is
    /// a slight underestimate.
    pub(crate) fn train_flop(&self) -> Option<f64> {
        match self.work {
            Work::Train { batch, seq } => {
                let passes = if self.lora { 2.0 } else { 3.0 };
                Some(2.0 * passes * self.shape.product_weights() as f64 * (batch * seq) as f64)
            }
            Work::Rollout { .. } => None,
        }
    }
}

impl Work {
    /// Tokens the workload produces (rollout: generated) or trains on.
    pub(crate) fn tokens(&self) -> usize {
        match *self {
            Work::Rollout { batch, sampled, .. } => batch * sampled,
            Work::Train { batch, seq } => batch * seq,
        }
    }

    /// The context the model needs.
    fn max_seq_len(&self) -> usize {
        match *self {
            Work::Rollout {
                prompt, sampled, ..
            } => prompt + sampled,
            Work::Train { seq, .. } => seq + 1,
        }
    }
}

/// One measured workload.
#[derive(Debug, Clone)]
pub(crate) struct ModelRow {
    pub name: String,
    pub dtype: &'static str,
    pub ms: Option<f64>,
    pub tokens: usize,
    /// The dense products' FLOPs of one run ([`Workload::train_flop`]; train rows only).
    pub flop: Option<f64>,
    pub reserved: Option<u64>,
    pub error: Option<String>,
    /// Kernel launches (`--launches`, Cube backends).
    pub launches: Option<Launches>,
}

/// A workload's kernel launches (Cube backends, `rlany bench --models --launches`): per
/// decoded token for a rollout — the difference between rollouts of `sampled` and
/// `sampled / 2` tokens, both after a warm-up, over the tokens between them, so the prompt's
/// prefill and the per-call setup cancel — or per PPO step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Launches {
    /// Launches per decoded token (rollouts) or per step (PPO steps).
    pub per_unit: f64,
    /// Rollouts: what one layer launches per decoded token — the difference between this
    /// model and a one-layer model of the same shape over the layers between them (so the
    /// embedding, the final norm, the head and the sampling are not in it).
    pub per_layer: Option<f64>,
    /// Rollouts: what a decoded token launches outside the layers (`per_unit − layers ·
    /// per_layer`).
    pub outside_layers: Option<f64>,
    /// By kernel name, per unit, most launched first.
    pub by_kernel: Vec<(String, f64)>,
    /// With `--profile`: milliseconds in each kernel per unit, the most time first (empty
    /// when launches are only counted).
    pub ms_by_kernel: Vec<(String, f64)>,
}

/// The launch counter's totals at one moment: launches and (profiled) milliseconds by kernel.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tally {
    pub counts: BTreeMap<String, u64>,
    pub ms: BTreeMap<String, f64>,
}

impl Tally {
    /// What happened between `self` and a later tally `b`.
    fn since(&self, b: Tally) -> Tally {
        Tally {
            counts: b
                .counts
                .into_iter()
                .map(|(k, n)| {
                    let before = self.counts.get(&k).copied().unwrap_or(0).min(n);
                    (k, n - before)
                })
                .collect(),
            ms: b
                .ms
                .into_iter()
                .map(|(k, t)| {
                    (
                        k.clone(),
                        (t - self.ms.get(&k).copied().unwrap_or(0.0)).max(0.0),
                    )
                })
                .collect(),
        }
    }
}

impl Launches {
    /// From tallies `a` and `b` (later): the difference per unit.
    fn between(a: &Tally, b: &Tally, units: f64) -> Self {
        let per_unit_sorted = |diff: Vec<(String, f64)>| {
            let mut v: Vec<(String, f64)> = diff
                .into_iter()
                .map(|(k, x)| (k, x / units))
                .filter(|(_, x)| *x != 0.0)
                .collect();
            v.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
            v
        };
        let d = a.since(b.clone());
        let by_kernel = per_unit_sorted(d.counts.into_iter().map(|(k, n)| (k, n as f64)).collect());
        let ms_by_kernel = per_unit_sorted(d.ms.into_iter().collect());
        let per_unit = by_kernel.iter().map(|(_, n)| n).sum::<f64>();
        Self {
            per_unit,
            per_layer: None,
            outside_layers: None,
            by_kernel,
            ms_by_kernel,
        }
    }

    /// These per-token counts of a `layers`-layer model split with those of a one-layer
    /// model of the same shape (`one`): per layer and outside the layers.
    fn with_layers(self, one: &Self, layers: usize) -> Self {
        let per_layer = match layers {
            0 | 1 => self.per_unit,
            l => (self.per_unit - one.per_unit) / (l - 1) as f64,
        };
        Self {
            per_layer: Some(per_layer),
            outside_layers: Some(self.per_unit - layers as f64 * per_layer),
            ..self
        }
    }
}

/// Reads the launch counter after synchronising the device (empty where nothing counts).
fn launch_counts<B: Backend>(device: &B::Device) -> Result<Tally> {
    B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e}"))?;
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let (counts, ms) = rlany_kernels::launches::tally();
        Ok(Tally { counts, ms })
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        Ok(Tally::default())
    }
}

impl ModelRow {
    /// The dense products' rate: FLOPs over the median time (train rows that were timed).
    pub(crate) fn gflop_per_s(&self) -> Option<f64> {
        self.ms.zip(self.flop).map(|(ms, f)| f / (ms * 1e-3) / 1e9)
    }
}

/// Runs the model workloads on backend `B` and returns their rows; `count` also counts
/// their kernel launches (the caller started the counter: Cube backends only).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<B>(
    device: &B::Device,
    quick: bool,
    dtype: Option<FloatDType>,
    reps: usize,
    only: &[String],
    on_device: bool,
    shards: usize,
    count: bool,
    batch_rows: Option<usize>,
) -> Result<Vec<ModelRow>>
where
    B: AutodiffBackend + AutodiffLogProbOps,
    B::InnerBackend: LogProbOps,
{
    let mut rows = Vec::new();
    for wl in workloads(quick) {
        if !only.is_empty() && !only.iter().any(|o| wl.name.starts_with(o.as_str())) {
            continue;
        }
        let wl = match batch_rows {
            Some(n) => wl.with_rows(n),
            None => wl,
        };
        let dt = dtype.unwrap_or(wl.shape.dtype);
        let dname = super::bench::dtype_name(dt);
        if !<B::InnerBackend as Backend>::supports_dtype(device, dt.into()) {
            eprintln!(
                "skipped {} {dname}: dtype not supported by {}",
                wl.name,
                B::name(device)
            );
            continue;
        }
        eprintln!("{} ({dname}) …", wl.name);
        let result = super::bench::guarded(|| match wl.work {
            Work::Rollout {
                batch,
                prompt,
                sampled,
            } => {
                let shape = (batch, prompt, sampled);
                rollout::<B::InnerBackend>(device, &wl, dt, shape, reps, on_device, count)
            }
            Work::Train { batch, seq } => {
                train::<B>(device, &wl, dt, (batch, seq), shards, reps, count)
            }
        });
        let (ms, launches, error) = match result {
            Ok((ms, launches)) => (Some(ms), launches, None),
            Err(e) => (None, None, Some(format!("{e:#}"))),
        };
        rows.push(ModelRow {
            name: wl.name.clone(),
            dtype: dname,
            ms,
            tokens: wl.work.tokens(),
            flop: wl.train_flop(),
            reserved: B::device_memory_reserved(device),
            error,
            launches,
        });
    }
    Ok(rows)
}

/// A model of `wl`'s shape, its weights from a fixed seed.
fn model<B: AttentionOps>(
    device: &B::Device,
    wl: &Workload,
    dtype: FloatDType,
) -> Result<Transformer<B>> {
    let model = wl
        .shape
        .config(wl.work.max_seq_len())
        .init_seeded::<B>(device, &mut Rng::new(7))
        .with_context(|| format!("model of {}", wl.name))?;
    let model = if dtype == FloatDType::F32 {
        model
    } else {
        model.with_dtype(dtype)
    };
    Ok(if wl.lora {
        let spec = rlany_framework::experiment::LoraSpec {
            r: 8,
            lora_alpha: 16.0,
            ..Default::default()
        };
        model.with_lora(&spec, &mut Rng::new(9))
    } else {
        model
    })
}

/// Median ms of `reps` rollouts (one warm-up first), and with `count` their launches per
/// decoded token ([`Launches`]).
fn rollout<B: AttentionOps>(
    device: &B::Device,
    wl: &Workload,
    dtype: FloatDType,
    (batch, prompt, sampled): (usize, usize, usize),
    reps: usize,
    on_device: bool,
    count: bool,
) -> Result<(f64, Option<Launches>)> {
    let model = model::<B>(device, wl, dtype)?;
    let mut rng = Rng::new(11);
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            (0..prompt)
                .map(|_| rng.below(wl.shape.vocab) as u32)
                .collect()
        })
        .collect();
    let params = SampleParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: sampled,
        stop_tokens: Vec::new(),
        on_device,
    };
    let ms = super::bench::median_ms::<B, _>(device, 1, reps, || {
        let gens = model.generate(&prompts, &params, &mut rng);
        debug_assert!(gens.iter().all(|g| g.tokens.len() == sampled));
        gens
    })?;
    if !count || sampled < 2 {
        return Ok((ms, None));
    }
    // Launches per decoded token: rollouts of `half` and `sampled` tokens, each once untimed
    // (its own shapes' first launches and autotuning), then counted; the difference is what
    // the tokens between them launched.
    let half = sampled / 2;
    let per_token = |model: &Transformer<B>, rng: &mut Rng| -> Result<Launches> {
        let mut launched = |n: usize| -> Result<Tally> {
            let params = SampleParams {
                max_new_tokens: n,
                ..params.clone()
            };
            drop(model.generate(&prompts, &params, rng));
            let before = launch_counts::<B>(device)?;
            drop(model.generate(&prompts, &params, rng));
            Ok(before.since(launch_counts::<B>(device)?))
        };
        let (short, long) = (launched(half)?, launched(sampled)?);
        Ok(Launches::between(&short, &long, (sampled - half) as f64))
    };
    let full = per_token(&model, &mut rng)?;
    // The same count on one layer of the same shape separates the layers' launches from
    // the embedding's, the head's and the sampling's.
    let one_layer = Workload {
        shape: Shape {
            layers: 1,
            ..wl.shape
        },
        ..wl.clone()
    };
    let one = per_token(&self::model::<B>(device, &one_layer, dtype)?, &mut rng)?;
    Ok((ms, Some(full.with_layers(&one, wl.shape.layers))))
}

/// Median ms of `reps` PPO steps (one warm-up first), the rows split into `shards` groups
/// run forward and backward at once and their gradients summed, as a run's
/// update does with `shards: n` (`rlany_framework::shard::grads`; 1: one batch); with
/// `count`, the launches of one more step ([`Launches`], per step).
fn train<B>(
    device: &B::Device,
    wl: &Workload,
    dtype: FloatDType,
    (batch, seq): (usize, usize),
    shards: usize,
    reps: usize,
    count: bool,
) -> Result<(f64, Option<Launches>)>
where
    B: AutodiffBackend + AutodiffLogProbOps,
{
    let mut model = Some(model::<B>(device, wl, dtype)?);
    let mut optim = AdamWConfig::new().init::<B, Transformer<B>>();
    let mut rng = Rng::new(13);
    let seqs: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            (0..=seq)
                .map(|_| rng.below(wl.shape.vocab) as u32)
                .collect()
        })
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    // Old log-probs in (−5, 0], one advantage per row, every token weighted 1 / (B·T) (so
    // the shards' losses sum to the batch's).
    let old = Tensor::<B, 2>::random([batch, seq], Distribution::Uniform(-5.0, 0.0), device);
    let adv_rows: Vec<f32> = (0..batch).map(|_| rng.normal() as f32).collect();
    let adv: Vec<f32> = adv_rows
        .iter()
        .flat_map(|&a| std::iter::repeat_n(a, seq))
        .collect();
    let adv = host_tensor::<B>(adv, batch, seq, device);
    let weight = host_tensor::<B>(
        vec![1.0 / (batch * seq) as f32; batch * seq],
        batch,
        seq,
        device,
    );
    // One input per shard: its rows' tokens, old log-probs, advantages and weights.
    let inputs: Vec<_> = rlany_framework::shard::ranges(batch, shards)
        .into_iter()
        .map(|r| {
            let rows = || r.clone();
            (
                token_batch::<B>(&refs[rows()], 0, seq + 1, device),
                old.clone().slice([rows(), 0..seq]),
                adv.clone().slice([rows(), 0..seq]),
                weight.clone().slice([rows(), 0..seq]),
            )
        })
        .collect();
    let mut times = Vec::with_capacity(reps);
    let mut counted = None;
    // The warm-up step, the timed steps, and (with `count`) one counted step.
    for i in 0..=reps + usize::from(count) {
        let counting = i > reps;
        let before = if counting {
            Some(launch_counts::<B>(device)?)
        } else {
            None
        };
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e}"))?;
        let start = Instant::now();
        let m = model.take().context("model")?;
        let (grads, _) = rlany_framework::shard::grads(
            &m,
            inputs.clone(),
            |m: &Transformer<B>, (tokens, old, adv, weight)| {
                let new_lp = sequence_logprobs(m, &tokens, KernelChoice::Fused);
                let kl = KlTerm::Sampled {
                    target_lp: old.clone(),
                    estimator: SampledKl::K3,
                };
                (ppo_loss(new_lp, old, kl, adv, weight, 0.2, 0.01).loss, ())
            },
        );
        let (m, _norm) = rlany_framework::ppo::clip::apply(m, &mut optim, grads, 1e-5, 1.0);
        model = Some(m);
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e}"))?;
        if let Some(before) = before {
            let after = launch_counts::<B>(device)?;
            counted = Some(Launches::between(&before, &after, 1.0));
        } else if i > 0 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], counted))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Launches by hand: kernel `a` 2 → 10 and `b` 0 → 4 over 2 tokens is 4 + 2 = 6 per
    /// token; against a one-layer model's 2 per token, a 3-layer model launches
    /// (6 − 2) / (3 − 1) = 2 per layer and 6 − 3·2 = 0 outside the layers.
    #[test]
    fn launches_split_into_layers_by_hand() {
        let counts = |pairs: &[(&str, u64)]| Tally {
            counts: pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            ms: BTreeMap::new(),
        };
        let full = Launches::between(&counts(&[("a", 2)]), &counts(&[("a", 10), ("b", 4)]), 2.0);
        assert_eq!(full.per_unit, 6.0);
        assert_eq!(
            full.by_kernel,
            vec![("a".to_string(), 4.0), ("b".to_string(), 2.0)]
        );
        assert!(full.ms_by_kernel.is_empty(), "counted, not profiled");
        let one = Launches::between(&counts(&[]), &counts(&[("a", 2)]), 1.0);
        let split = full.with_layers(&one, 3);
        assert_eq!(
            (split.per_layer, split.outside_layers),
            (Some(2.0), Some(0.0))
        );
        // One layer: everything is the layer's, nothing outside it.
        let single = one.clone().with_layers(&one, 1);
        assert_eq!(
            (single.per_layer, single.outside_layers),
            (Some(2.0), Some(0.0))
        );
    }

    /// Profiled times by hand: `a` 1.0 → 7.0 ms and `b` 0 → 2.0 ms over 2 steps is 3.0 and
    /// 1.0 ms a step, the most time first; a kernel with no time since is left out.
    #[test]
    fn profiled_times_are_per_unit_by_hand() {
        let tally = |pairs: &[(&str, f64)]| Tally {
            counts: pairs.iter().map(|(k, _)| (k.to_string(), 1)).collect(),
            ms: pairs.iter().map(|(k, t)| (k.to_string(), *t)).collect(),
        };
        let l = Launches::between(
            &tally(&[("a", 1.0), ("c", 5.0)]),
            &tally(&[("a", 7.0), ("b", 2.0), ("c", 5.0)]),
            2.0,
        );
        assert_eq!(
            l.ms_by_kernel,
            vec![("a".to_string(), 3.0), ("b".to_string(), 1.0)]
        );
    }

    #[test]
    fn fewer_rows_rename_the_workload_and_keep_its_lengths() {
        let full = workloads(false);
        let t = full.iter().find(|w| w.name == "T_small").expect("T_small");
        let t8 = t.with_rows(8);
        assert_eq!(t8.name, "T_small@rows8");
        assert_eq!(t8.work, Work::Train { batch: 8, seq: 256 });
        assert_eq!(t8.work.tokens(), 8 * 256);
        let r = full.iter().find(|w| w.name == "R_small").expect("R_small");
        assert_eq!(
            r.with_rows(2).work,
            Work::Rollout {
                batch: 2,
                prompt: 64,
                sampled: 192
            }
        );
    }

    #[test]
    fn the_full_workloads_are_bench_md_s() {
        let full = workloads(false);
        let get = |n: &str| full.iter().find(|w| w.name == n).expect(n).clone();
        let small = get("R_small");
        assert_eq!(
            (
                small.shape.vocab,
                small.shape.d_model,
                small.shape.layers,
                small.shape.heads,
                small.shape.kv_heads,
                small.shape.ffn,
                small.shape.dtype
            ),
            (4096, 512, 8, 8, 8, 1408, FloatDType::F32)
        );
        assert_eq!(
            small.work,
            Work::Rollout {
                batch: 256,
                prompt: 64,
                sampled: 192
            }
        );
        assert_eq!(
            get("T_small").work,
            Work::Train {
                batch: 64,
                seq: 256
            }
        );
        let q = get("R_qwen05b");
        assert_eq!(
            (
                q.shape.vocab,
                q.shape.d_model,
                q.shape.layers,
                q.shape.heads,
                q.shape.kv_heads,
                q.shape.ffn,
                q.shape.dtype
            ),
            (151_936, 896, 24, 14, 2, 4864, FloatDType::BF16)
        );
        assert_eq!(
            q.work,
            Work::Rollout {
                batch: 128,
                prompt: 128,
                sampled: 128
            }
        );
        assert_eq!(
            get("T_qwen05b").work,
            Work::Train {
                batch: 16,
                seq: 512
            }
        );
        let tiny = get("C_tiny_T");
        assert_eq!(
            (
                tiny.shape.vocab,
                tiny.shape.d_model,
                tiny.shape.layers,
                tiny.shape.heads,
                tiny.shape.ffn
            ),
            (64, 128, 4, 4, 384)
        );
        assert_eq!(
            tiny.work,
            Work::Train {
                batch: 32,
                seq: 128
            }
        );
        // Quick rows never share a name with a full-size row (C_tiny_T and T_smollm2_lora
        // are the same work in both).
        for w in workloads(true) {
            assert!(
                w.name.ends_with("@quick") || full.contains(&w),
                "{}",
                w.name
            );
        }
        // The models are the decoder BENCH.md describes: QKV bias, untied head.
        let c = SMALL.config(256);
        assert!(c.qkv_bias && !c.tie_embeddings && c.norm_eps == 1e-6 && c.rope_theta == 10_000.0);
        // Our decoder at `small`'s shape has the parameters of PyTorch's anchor model:
        // per layer q/k/v (d² + d each), o (d²), gate/up/down (3·d·ffn), two norms (2·d);
        // embedding and head (2·V·d); the final norm (d).
        let d = 512;
        let per_layer = 3 * (d * d + d) + d * d + 3 * d * 1408 + 2 * d;
        let hand = 8 * per_layer + 2 * 4096 * d + d;
        assert_eq!(hand, 29_905_408);
        let built = SMALL
            .config(256)
            .init::<burn::backend::NdArray>(&Default::default());
        assert_eq!(built.expect("valid").num_params(), hand);
    }

    #[test]
    fn the_smollm2_workload_is_the_lora_file_s_update_with_its_flops_by_hand() {
        let w = workloads(true)
            .into_iter()
            .find(|w| w.name == "T_smollm2_lora")
            .expect("in the quick list");
        assert!(workloads(false).contains(&w), "the same row in both lists");
        assert!(w.lora);
        // SmolLM2-135M: 30 × (q 576², k and v 576 × 192, o 576², MLP 3 × 576 × 1536, two
        // norms) + the tied embedding 49152 × 576 + the final norm: 134,515,008 parameters,
        // the count its model card gives.
        let c = SMOLLM2.config(129);
        assert!(c.tie_embeddings && !c.qkv_bias);
        let built = c.init::<burn::backend::NdArray>(&Default::default());
        assert_eq!(built.expect("valid").num_params(), 134_515_008);
        // Dense products per token: 30 × 3,538,944 + 28,311,552 (the head) = 134,479,872;
        // a LoRA step (forward + input gradients) on 8 × 128 tokens: 4 × that × 1024.
        assert_eq!(SMOLLM2.product_weights(), 134_479_872);
        assert_eq!(w.train_flop(), Some(4.0 * 134_479_872.0 * 1024.0));
        let full = Workload {
            lora: false,
            ..w.clone()
        };
        assert_eq!(full.train_flop(), Some(6.0 * 134_479_872.0 * 1024.0));
        let rollout = workloads(true)
            .into_iter()
            .find(|w| w.name == "R_small@quick");
        assert_eq!(rollout.and_then(|w| w.train_flop()), None);
    }
}
