//! One PPO update phase (framework/METHOD.md, step 6), shared by the policy and the judge: the
//! samples are shuffled, split into minibatches, and each minibatch takes one AdamW step on
//! the PPO-clip + KL loss ([`crate::optimise::step`], which spreads it over row groups).
//!
//! A sample is a token sequence with *units* — the spans that are trained, each with one
//! advantage: a policy step (its tokens) or a judge verdict (one token). Every unit weighs
//! the same: its tokens share `1 / (tokens in the unit) / (units in the minibatch)`.

use crate::batch::{
    TokenBatch, at_positions, entropy_sum, host_tensor, logprobs_at, scored_logprobs,
    scored_positions, token_batch,
};
use crate::experiment::KlEstimator;
use crate::lm::CausalLm;
use crate::optimise::{GroupResult, StepError, StepSpec};
use crate::ppo::loss::{KlTerm, ppo_loss};
use crate::progress;
use crate::rng::Rng;
use crate::shard::Spread;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::prelude::*;
use rlany_kernels::AutodiffLogProbOps;

/// A trained span `[start, end)` of a sample's tokens with its advantage.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// First trained token (index into the sample's tokens; at least 1).
    pub start: usize,
    /// One past the last trained token.
    pub end: usize,
    /// The unit's advantage.
    pub adv: f64,
}

/// A token sequence and the units trained in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// BOS, context and generated tokens.
    pub tokens: Vec<u32>,
    /// What is trained.
    pub units: Vec<Unit>,
}

/// The knobs of one update phase.
#[derive(Debug, Clone)]
pub struct UpdateParams {
    /// Ratio clip ε.
    pub clip: f64,
    /// KL coefficient β.
    pub kl_coef: f64,
    /// KL estimator.
    pub estimator: KlEstimator,
    /// Learning rate.
    pub lr: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Number of minibatches (= optimiser steps).
    pub minibatches: usize,
    /// Padding id.
    pub pad: u32,
    /// Fused kernels or the reference composition for the token log-probs.
    pub kernels: rlany_kernels::KernelChoice,
    /// Where each minibatch's optimiser step runs (passed to [`crate::optimise::step`]): in
    /// `shards` row groups, a thread each, over the peers.
    pub spread: Spread,
    /// Most rows in one forward and backward pass (0: no limit; passed to
    /// [`crate::optimise::step`]).
    pub micro_batch: usize,
    /// The progress bar's label.
    pub label: &'static str,
    /// Show a progress bar.
    pub progress: bool,
}

/// Means over the minibatches of one update phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateStats {
    /// PPO loss.
    pub loss: f64,
    /// KL penalty term (before β).
    pub kl: f64,
    /// Fraction of clipped tokens.
    pub clipfrac: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Policy entropy on the trained tokens of the first minibatch, before the update.
    pub entropy: f64,
    /// Optimiser steps taken.
    pub updates: usize,
    /// Trained tokens.
    pub tokens: usize,
}

/// Runs one update phase and returns the updated model and its statistics (`None` when no
/// sample carries a unit). `model` as it is passed in produced the samples: it is the "old"
/// policy, whose log-probs are the ratio's denominator. `reference` is what the KL is
/// measured against: a frozen reference model, or `None` for the old policy itself
/// (`KlTarget::Old`).
///
/// The first minibatch reads the old log-probs off the trained forward (detached): no
/// optimiser step has moved the model yet, and nothing in a forward is random (no dropout),
/// so they are the same values, and one forward of the rows is saved. Later minibatches
/// forward a snapshot of the model taken before the first step.
pub fn ppo_update<B, M, O>(
    mut model: M,
    optim: &mut O,
    reference: Option<&M::InnerModule>,
    samples: &[Sample],
    params: &UpdateParams,
    rng: &mut Rng,
    device: &B::Device,
) -> Result<(M, Option<UpdateStats>), StepError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
    O: Optimizer<M, B>,
{
    let mut order: Vec<usize> = (0..samples.len())
        .filter(|&i| !samples[i].units.is_empty())
        .collect();
    if order.is_empty() {
        return Ok((model, None));
    }
    rng.shuffle(&mut order);
    let n_mb = params.minibatches.clamp(1, order.len());
    let mb_size = order.len().div_ceil(n_mb);
    let mut stats = UpdateStats::default();
    let mut entropy = (0.0, 0.0);
    // The old policy for the minibatches after the first optimiser step.
    let snapshot = (n_mb > 1).then(|| model.valid());
    let spec = StepSpec {
        spread: &params.spread,
        micro_batch: params.micro_batch,
        lr: params.lr,
        max_grad_norm: params.max_grad_norm,
    };
    let mut pb = progress::bar(
        order.chunks(mb_size).len() as u64,
        params.label,
        params.progress,
    );
    for (k, mb) in order.chunks(mb_size).enumerate() {
        let mut rows: Vec<&Sample> = mb.iter().map(|&i| &samples[i]).collect();
        // In token order, so the rows a group holds share the longest prefix (a task's
        // samples together), which the model computes once; the loss is a sum over rows, so
        // the grouping changes nothing else.
        rows.sort_by(|a, b| a.tokens.cmp(&b.tokens));
        // Every unit of the minibatch weighs the same, whichever row group holds it.
        let n_units = rows.iter().map(|s| s.units.len()).sum::<usize>();
        let first = k == 0;
        let old = if first { None } else { snapshot.as_ref() };
        let step = crate::optimise::step(
            model,
            optim,
            &spec,
            &rows,
            |rows| (rows, old.cloned(), reference.cloned()),
            |m: &M, (rows, old, reference)| {
                minibatch_loss(
                    m,
                    old.as_ref(),
                    reference.as_ref(),
                    rows,
                    n_units,
                    params,
                    device,
                )
            },
        )?;
        model = step.model;
        let (parts, norm) = (step.parts, step.grad_norm);
        let wsum: f64 = parts.iter().map(|p| p.wsum).sum();
        stats.loss += parts.iter().map(|p| p.loss).sum::<f64>();
        stats.kl += parts.iter().map(|p| p.kl).sum::<f64>();
        stats.clipfrac += match parts.as_slice() {
            [one] => one.clipfrac,
            _ => parts.iter().map(|p| p.clipfrac * p.wsum).sum::<f64>() / wsum.max(1e-12),
        };
        stats.tokens += parts.iter().map(|p| p.tokens).sum::<usize>();
        if first {
            entropy = parts
                .iter()
                .fold((0.0, 0.0), |(s, n), p| (s + p.entropy.0, n + p.entropy.1));
        }
        stats.grad_norm += norm;
        stats.updates += 1;
        pb.inc(1);
    }
    stats.entropy = if entropy.1 == 0.0 {
        0.0
    } else {
        entropy.0 / entropy.1
    };
    pb.finish_and_clear();
    let n = stats.updates as f64;
    stats.loss /= n;
    stats.kl /= n;
    stats.clipfrac /= n;
    stats.grad_norm /= n;
    Ok((model, Some(stats)))
}

/// One minibatch's (or row group's) share of the loss, with its diagnostics.
#[derive(serde::Serialize, serde::Deserialize)]
struct Part {
    /// Its loss.
    loss: f64,
    /// Its `Σ w · kl`.
    kl: f64,
    /// Its weighted fraction of clipped tokens.
    clipfrac: f64,
    /// Its `Σ w` (to weigh `clipfrac` across row groups).
    wsum: f64,
    /// Summed entropy of the rollout model and its token count (first minibatch only).
    entropy: (f64, f64),
    /// Its trained tokens.
    tokens: usize,
}

impl GroupResult for Part {
    fn loss(&self) -> f64 {
        self.loss
    }
}

/// The PPO loss of `rows` (a minibatch, or one row group of it whose units weigh `1 / n_units`
/// each, `n_units` counted over the whole minibatch) and its diagnostics. `old` produced the
/// samples (`None`: `model` itself, not yet stepped); `reference` is the KL's (`None`: the
/// old policy).
fn minibatch_loss<B, M>(
    model: &M,
    old: Option<&M::InnerModule>,
    reference: Option<&M::InnerModule>,
    rows: &[&Sample],
    n_units: usize,
    params: &UpdateParams,
    device: &B::Device,
) -> (Tensor<B, 1>, Part)
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let seqs: Vec<&[u32]> = rows.iter().map(|s| s.tokens.as_slice()).collect();
    let batch = token_batch::<B>(&seqs, params.pad, model.max_seq_len(), device);
    let (adv, weight, tokens) = unit_targets(rows, n_units, batch.batch, batch.seq);
    // Every model runs its LM head at the trained positions only: the loss reads nothing else.
    let positions = scored_positions(&weight);
    let n = positions.len();
    let (adv, weight) = (
        at_positions(&adv, &positions),
        at_positions(&weight, &positions),
    );
    let wsum = weight.iter().map(|&w| f64::from(w)).sum();
    let inner = TokenBatch::<B::InnerBackend> {
        inputs: batch.inputs.clone().inner(),
        targets: batch.targets.clone().inner(),
        batch: batch.batch,
        seq: batch.seq,
    };
    let new_logits = model.logits_at(batch.inputs.clone(), &positions);
    // The rollout model's logits serve its log-probs and (first minibatch) entropy: its own
    // forward, or the trained forward's values where the model still is the rollout model.
    let old_logits = match old {
        Some(old) => old.logits_at(inner.inputs.clone(), &positions),
        None => new_logits.clone().inner(),
    };
    // The first minibatch's (`old` is `None` there alone) entropy, before any step.
    let entropy = if old.is_none() {
        entropy_sum(old_logits.clone(), &weight)
    } else {
        (0.0, 0.0)
    };
    // [n] → [1, n]: the loss's `[batch, seq]` layout with the scored positions as one row.
    let row = |t: Tensor<B, 1>| t.reshape([1, n]);
    let (new_lp, old_lp, kl) = match params.estimator.sampled() {
        Some(estimator) => {
            let old_lp = logprobs_at(old_logits, &inner, &positions, params.kernels);
            let target_lp = match reference {
                None => old_lp.clone(),
                Some(r) => scored_logprobs(r, &inner, &positions, params.kernels),
            };
            let new_lp = logprobs_at(new_logits, &batch, &positions, params.kernels);
            let kl = KlTerm::Sampled {
                target_lp: row(Tensor::from_inner(target_lp)),
                estimator,
            };
            (row(new_lp), old_lp, kl)
        }
        None => {
            // The exact KL needs the target's whole distribution at every scored position.
            let target_logits = match reference {
                None => old_logits.clone(),
                Some(r) => r.logits_at(inner.inputs.clone(), &positions),
            };
            let old_lp = logprobs_at(old_logits, &inner, &positions, params.kernels);
            let new_lp = logprobs_at(new_logits.clone(), &batch, &positions, params.kernels);
            let kl = full_kl(
                new_logits,
                Tensor::from_inner(target_logits),
                params.kernels,
            );
            (row(new_lp), old_lp, KlTerm::Exact(row(kl)))
        }
    };
    let out = ppo_loss(
        new_lp,
        row(Tensor::from_inner(old_lp)),
        kl,
        host_tensor::<B>(adv, 1, n, device),
        host_tensor::<B>(weight, 1, n, device),
        params.clip,
        params.kl_coef,
    );
    let part = Part {
        loss: out.loss.clone().into_scalar().elem::<f64>(),
        kl: out.kl.into_scalar().elem::<f64>(),
        clipfrac: out.clipfrac.into_scalar().elem::<f64>(),
        wsum,
        entropy,
        tokens,
    };
    (out.loss, part)
}

/// The exact `KL(π ‖ target)` over the vocabulary at every row (gradients flow into `π`
/// only: `target_logits` come from a model outside the graph).
///
/// # Shapes
/// - `logits`, `target_logits`: `[n, vocab]`
/// - output: `[n]`
fn full_kl<B: rlany_kernels::LogProbOps>(
    logits: Tensor<B, 2>,
    target_logits: Tensor<B, 2>,
    kernels: rlany_kernels::KernelChoice,
) -> Tensor<B, 1> {
    kernels.kl_full(logits, target_logits)
}

/// Per-token advantages and weights of `rows` in the batch's `[row, j]` layout (token `k` is
/// predicted at target position `k − 1`); each unit weighs `1 / n_units`. Returns
/// `(adv, weight, tokens)`.
fn unit_targets(
    rows: &[&Sample],
    n_units: usize,
    batch: usize,
    seq: usize,
) -> (Vec<f32>, Vec<f32>, usize) {
    let mut adv = vec![0f32; batch * seq];
    let mut weight = vec![0f32; batch * seq];
    let mut n_tok = 0;
    for (r, sample) in rows.iter().enumerate() {
        for u in &sample.units {
            let positions: Vec<usize> = (u.start.max(1)..u.end)
                .map(|k| k - 1)
                .filter(|&j| j < seq)
                .collect();
            let w = 1.0 / positions.len().max(1) as f64 / n_units.max(1) as f64;
            for j in positions {
                adv[r * seq + j] = u.adv as f32;
                weight[r * seq + j] = w as f32;
                n_tok += 1;
            }
        }
    }
    (adv, weight, n_tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_kl_hand_computed_and_zero_against_itself() {
        use burn::backend::NdArray;
        type B = NdArray<f32>;
        let dev = Default::default();
        // Position 0: P = softmax([0, ln 2]) = (1/3, 2/3), Q = (1/2, 1/2);
        // KL = 1/3·ln(2/3) + 2/3·ln(4/3) = 0.0566330.
        let p = Tensor::<B, 1>::from_floats([0.0, 2f32.ln(), 1.0, 3.0], &dev).reshape([2, 2]);
        let q = Tensor::<B, 1>::from_floats([0.0, 0.0, 1.0, 3.0], &dev).reshape([2, 2]);
        for kernels in [
            rlany_kernels::KernelChoice::Fused,
            rlany_kernels::KernelChoice::Reference,
        ] {
            let kl: Vec<f32> = full_kl(p.clone(), q.clone(), kernels)
                .into_data()
                .to_vec()
                .expect("f32");
            let want = (1.0f64 / 3.0) * (2.0f64 / 3.0).ln() + (2.0 / 3.0) * (4.0f64 / 3.0).ln();
            assert!((f64::from(kl[0]) - want).abs() < 1e-6, "{kl:?} vs {want}");
            assert!(kl[1].abs() < 1e-6, "identical rows: {kl:?}");
        }
    }

    /// One update on two samples after the same context — `L` with advantage +1, `R` with
    /// −1 — moves probability from `R` to `L` there and nowhere else, and reports finite
    /// statistics with no KL at the first minibatch.
    #[test]
    fn an_update_moves_probability_towards_the_positive_unit() {
        use crate::testing::{Bigram, EOS, L, NL, R, V, digit_line};
        use burn::backend::{Autodiff, NdArray};
        type B = Autodiff<NdArray<f32>>;
        let dev = Default::default();
        let model = Bigram::<B>::preferring(&[], 0.0, &dev);
        let sample = |answer: u32, adv: f64| Sample {
            tokens: vec![0, digit_line(3), answer, NL],
            units: vec![Unit {
                start: 2,
                end: 3,
                adv,
            }],
        };
        let samples = [sample(L, 1.0), sample(R, -1.0)];
        let params = UpdateParams {
            clip: 0.2,
            kl_coef: 0.0,
            estimator: crate::experiment::KlEstimator::K3,
            lr: 0.05,
            max_grad_norm: 1.0,
            minibatches: 1,
            pad: EOS,
            kernels: rlany_kernels::KernelChoice::Reference,
            spread: Spread::default(),
            micro_batch: 0,
            label: "test",
            progress: false,
        };
        let mut optim = burn::optim::AdamWConfig::new().init();
        let (model, stats) = ppo_update(
            model,
            &mut optim,
            None,
            &samples,
            &params,
            &mut Rng::new(3),
            &dev,
        )
        .expect("update");
        let stats = stats.expect("units to train");
        assert!(stats.loss.is_finite() && stats.grad_norm > 0.0, "{stats:?}");
        assert_eq!(stats.clipfrac, 0.0);
        // After door 3: L up, R down, the others the same as each other.
        let after_nl = model.row(digit_line(3));
        assert!(after_nl[L as usize] > 0.0, "{after_nl:?}");
        assert!(after_nl[R as usize] < 0.0, "{after_nl:?}");
        let rest: Vec<f32> = (0..V)
            .filter(|&i| i != L as usize && i != R as usize)
            .map(|i| after_nl[i])
            .collect();
        assert!(rest.iter().all(|&x| (x - rest[0]).abs() < 1e-6), "{rest:?}");
        // A context no unit reads is untouched.
        assert!(model.row(NL).iter().all(|&x| x == 0.0));
    }

    #[test]
    fn units_weigh_the_same_whatever_their_length() {
        let samples = [
            Sample {
                tokens: vec![1, 2, 3, 4, 5],
                units: vec![
                    Unit {
                        start: 1,
                        end: 3,
                        adv: 0.5,
                    },
                    Unit {
                        start: 4,
                        end: 5,
                        adv: -1.0,
                    },
                ],
            },
            Sample {
                tokens: vec![1, 2, 3],
                units: vec![Unit {
                    start: 2,
                    end: 3,
                    adv: 2.0,
                }],
            },
        ];
        let (adv, w, n) = unit_targets(&[&samples[0], &samples[1]], 3, 2, 4);
        assert_eq!(n, 4);
        // Row 0: unit (1..3) → positions 0,1 with 1/2/3 each; unit (4..5) → position 3 with 1/3.
        let third = 1.0f32 / 3.0;
        assert_eq!(w[0..4], [third / 2.0, third / 2.0, 0.0, third]);
        assert_eq!(adv[0..4], [0.5, 0.5, 0.0, -1.0]);
        // Row 1: unit (2..3) → position 1.
        assert_eq!(w[4..8], [0.0, third, 0.0, 0.0]);
        let total: f32 = w.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
