//! Supervised warm start of the policy on expert demonstrations (framework/METHOD.md, "Warm starts").
//!
//! The environment writes demonstrations with its own flawed-expert noise, so the
//! warm-started policy starts mid-range, as a pretrained LLM does in the paper. Loss: mean
//! cross-entropy over the demonstrated step tokens (the prompt is context, not target).

use crate::batch::{at_positions, scored_logprobs, scored_positions, token_batch};
use crate::env::Environment;
use crate::experiment::WarmStart;
use crate::lm::{CausalLm, Tokenizer};
use crate::optimise::{StepError, StepSpec};
use crate::progress;
use crate::rng::Rng;
use crate::rollout::replay_demonstration;
use crate::shard::Spread;
use burn::module::AutodiffModule;
use burn::optim::AdamWConfig;
use burn::prelude::*;
use rlany_kernels::{AutodiffLogProbOps, KernelChoice};

/// A demonstration as tokens (prompt, then each step and the observation that followed it),
/// with a 0/1 target mask (only the steps are targets).
fn demo_tokens(
    tok: &dyn Tokenizer,
    env: &dyn Environment,
    d: &[f64],
    noise: f64,
    seed: u64,
) -> (Vec<u32>, Vec<bool>) {
    // Replayed in the task it solves, so the sequence holds the environment's observations
    // exactly where a rollout puts them (not trained on).
    let demo = replay_demonstration(env, d, noise, seed);
    let format = tok.prompt_format();
    // Only a chat prompt shows the environment's instructions (see `PromptFormat::start`).
    let instructions = match format {
        crate::lm::PromptFormat::Lines => None,
        crate::lm::PromptFormat::Chat(_) => {
            env.sample(d, crate::env::Split::Train, seed).instructions()
        }
    };
    let mut ids = format.start(tok, &demo.prompt, instructions.as_deref());
    let mut trained = vec![false; ids.len()];
    for (i, s) in demo.steps.iter().enumerate() {
        let (action, close) = format.demonstrated_action(tok, &s.text);
        trained.extend(std::iter::repeat_n(true, action.len()));
        ids.extend(action);
        trained.extend(std::iter::repeat_n(false, close.len()));
        ids.extend(close);
        let last = i + 1 == demo.steps.len();
        if !last || !s.observation.is_empty() {
            let obs = format.observation(tok, &s.observation);
            trained.extend(std::iter::repeat_n(false, obs.len()));
            ids.extend(obs);
        }
    }
    (ids, trained)
}

/// How one supervised fine-tuning runs.
#[derive(Debug, Clone)]
pub struct SftOptions {
    /// AdamW steps.
    pub steps: usize,
    /// Initial learning rate (decays linearly to 10%).
    pub lr: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Progress-bar label.
    pub label: &'static str,
    /// Draw a progress bar.
    pub progress: bool,
    /// Fused kernels or the reference composition for the token log-probs.
    pub kernels: KernelChoice,
    /// Where each batch runs: in `shards` row groups, a thread each, over the peers.
    pub spread: Spread,
    /// Most rows in one forward and backward pass (0: no limit); a batch with more is cut
    /// into more row groups than shards, accumulated `shards` at a time.
    pub micro_batch: usize,
}

/// Runs `spec.steps` AdamW steps of supervised fine-tuning on fresh demonstrations and returns
/// the model and the final loss. Demonstrations are drawn at uniformly random difficulties in
/// `spec.difficulty` (by default the whole space, so the policy sees the whole training
/// range). `opts.steps` and `opts.lr` are `spec`'s.
pub fn warm_start<B, M>(
    model: M,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    spec: &WarmStart,
    opts: &SftOptions,
    rng: &mut Rng,
    device: &B::Device,
) -> Result<(M, f64), StepError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
{
    let dims = env.difficulty_space().len();
    supervised(
        model,
        tok,
        opts,
        device,
        |_| {
            (0..spec.batch)
                .map(|_| {
                    let d = demo_difficulty(dims, spec.difficulty, rng);
                    demo_tokens(tok, env, &d, spec.noise, rng.next_u64())
                })
                .collect()
        },
        |_, _, _| Ok(()),
    )
}

/// One demonstration's difficulty: each of the `dims` axes uniform in `range`.
fn demo_difficulty(dims: usize, range: (f64, f64), rng: &mut Rng) -> Vec<f64> {
    let (low, high) = range;
    (0..dims)
        .map(|_| low + (high - low) * rng.uniform())
        .collect()
}

/// Supervised fine-tuning: `steps` AdamW steps (learning rate decaying linearly to 10%) of
/// mean cross-entropy over the target tokens of the batches `next_batch(step)` returns —
/// `(tokens, is_target)` pairs, each step one [`crate::optimise::step`];
/// `after_step(steps done, model, loss)` is called after every step (a fit measures its model
/// there). Returns the model and the last loss.
pub fn supervised<B, M>(
    mut model: M,
    tok: &dyn Tokenizer,
    opts: &SftOptions,
    device: &B::Device,
    mut next_batch: impl FnMut(usize) -> Vec<(Vec<u32>, Vec<bool>)>,
    mut after_step: impl FnMut(usize, &M, f64) -> Result<(), StepError>,
) -> Result<(M, f64), StepError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
{
    let SftOptions {
        steps,
        lr,
        max_grad_norm,
        label,
        progress: show_progress,
        kernels,
        ref spread,
        micro_batch,
    } = *opts;
    let pad = tok.pad();
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init::<B, M>();
    let mut pb = progress::bar(steps as u64, label, show_progress);
    let mut last = f64::NAN;
    for step in 0..steps {
        let mut examples = next_batch(step);
        // In token order, so each row group's rows share the longest prefix (computed once by
        // the model); the loss is a sum over rows, so the grouping changes nothing else.
        examples.sort();
        // Every target token of the batch weighs 1/n, whichever row group holds it.
        let n = examples
            .iter()
            .map(|(ids, target)| {
                let seq = ids.len().min(model.max_seq_len()).saturating_sub(1);
                (0..seq)
                    .filter(|&j| target.get(j + 1) == Some(&true))
                    .count()
            })
            .sum::<usize>()
            .max(1) as f32;
        let spec = StepSpec {
            spread,
            micro_batch,
            lr: lr * (1.0 - 0.9 * step as f64 / steps.max(1) as f64),
            max_grad_norm,
        };
        let stepped = crate::optimise::step(
            model,
            &mut optim,
            &spec,
            &examples,
            |rows| rows,
            |m: &M, rows| sft_loss(m, rows, n, pad, kernels, device),
        )?;
        model = stepped.model;
        last = stepped.parts.iter().sum();
        pb.set_message(format!("loss {last:.3}"));
        pb.inc(1);
        after_step(step + 1, &model, last)?;
    }
    pb.finish_and_clear();
    Ok((model, last))
}

/// Minus the summed log-probs of `rows`' target tokens over `n` (the whole batch's target
/// count, so that the row groups' losses add up to the batch's), and its value.
fn sft_loss<B, M>(
    model: &M,
    rows: &[(Vec<u32>, Vec<bool>)],
    n: f32,
    pad: u32,
    kernels: KernelChoice,
    device: &B::Device,
) -> (Tensor<B, 1>, f64)
where
    B: AutodiffLogProbOps,
    M: CausalLm<B>,
{
    let seqs: Vec<&[u32]> = rows.iter().map(|(ids, _)| ids.as_slice()).collect();
    let batch = token_batch::<B>(&seqs, pad, model.max_seq_len(), device);
    let mut mask = vec![0f32; batch.batch * batch.seq];
    for (r, (_, target)) in rows.iter().enumerate() {
        for j in 0..batch.seq.min(target.len().saturating_sub(1)) {
            mask[r * batch.seq + j] = if target[j + 1] { 1.0 } else { 0.0 };
        }
    }
    // The LM head runs at the target positions only.
    let positions = scored_positions(&mask);
    let weight = at_positions(&mask, &positions);
    let weight = Tensor::<B, 1>::from_data(TensorData::new(weight, [positions.len()]), device);
    let lp = scored_logprobs(model, &batch, &positions, kernels);
    let loss = (lp * weight).sum().neg().div_scalar(n);
    let value = loss.clone().into_scalar().elem::<f64>();
    (loss, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_range_draws_exactly_the_uniforms_of_before() {
        // The default (0, 1) must not move a single draw: low + (high - low) * u == u.
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let d = demo_difficulty(4, (0.0, 1.0), &mut a);
        let u: Vec<f64> = (0..4).map(|_| b.uniform()).collect();
        assert_eq!(d, u);
    }

    #[test]
    fn a_restricted_range_keeps_every_axis_inside_it() {
        let mut rng = Rng::new(3);
        let draws: Vec<f64> = (0..200)
            .flat_map(|_| demo_difficulty(3, (0.1, 0.25), &mut rng))
            .collect();
        assert!(draws.iter().all(|&x| (0.1..=0.25).contains(&x)));
        // Spread over the range, not stuck at one end: both halves are drawn.
        assert!(draws.iter().any(|&x| x < 0.175) && draws.iter().any(|&x| x > 0.175));
        // A point range is that point.
        assert_eq!(demo_difficulty(2, (0.5, 0.5), &mut rng), vec![0.5, 0.5]);
    }

    /// Micro-batches of one or two rows (on one thread and on two) take the steps one batch
    /// does: the same weights and losses, within float rounding.
    #[test]
    fn micro_batches_step_as_one_batch_does() {
        use crate::testing::{BOS, Bigram, L, Letters, NL, R, V, digit_line};
        use burn::backend::{Autodiff, NdArray};
        type B = Autodiff<NdArray<f32>>;
        let dev = Default::default();
        let examples: Vec<(Vec<u32>, Vec<bool>)> = (0..5u8)
            .map(|d| {
                let answer = if d % 2 == 0 { L } else { R };
                let ids = vec![BOS, digit_line(d), answer, NL];
                (ids, vec![false, false, true, d < 3])
            })
            .collect();
        let run = |shards, micro_batch| {
            let opts = SftOptions {
                steps: 3,
                lr: 0.1,
                max_grad_norm: 1.0,
                label: "test",
                progress: false,
                kernels: KernelChoice::Reference,
                spread: Spread {
                    shards,
                    ..Spread::default()
                },
                micro_batch,
            };
            let mut losses = Vec::new();
            let (model, _) = supervised(
                Bigram::<B>::preferring(&[], 0.0, &dev),
                &Letters,
                &opts,
                &dev,
                |_| examples.clone(),
                |_, _, loss| {
                    losses.push(loss);
                    Ok(())
                },
            )
            .expect("finite");
            let weights: Vec<f32> = (0..V as u32).flat_map(|a| model.row(a)).collect();
            (weights, losses)
        };
        let (w, l) = run(1, 0);
        assert!(w.iter().any(|&x| x != 0.0), "the steps moved nothing");
        for (shards, micro_batch) in [(1, 1), (2, 1), (1, 2)] {
            let (w2, l2) = run(shards, micro_batch);
            let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| (a - b).abs() < 1e-6);
            assert!(close(&w, &w2), "shards {shards}, micro_batch {micro_batch}");
            assert!(
                l.iter().zip(&l2).all(|(a, b)| (a - b).abs() < 1e-6),
                "{l:?} vs {l2:?}"
            );
        }
    }
}
