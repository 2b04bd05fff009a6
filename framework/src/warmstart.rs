//! Supervised warm start of the policy on expert demonstrations (design.md, "Warm start").
//!
//! The environment writes demonstrations with its own flawed-expert noise, so the
//! warm-started policy starts mid-range, as a pretrained LLM does in the paper. Loss: mean
//! cross-entropy over the demonstrated step tokens (the prompt is context, not target).

use crate::batch::{host_tensor, sequence_logprobs, token_batch};
use crate::env::Environment;
use crate::experiment::WarmStart;
use crate::lm::{CausalLm, Tokenizer};
use crate::optim;
use crate::progress;
use crate::rng::Rng;
use burn::module::AutodiffModule;
use burn::optim::AdamWConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// A demonstration as tokens, with a 0/1 target mask in the batch's `[row, j]` layout.
fn demo_tokens(tok: &dyn Tokenizer, prompt: &str, steps: &[String]) -> (Vec<u32>, Vec<bool>) {
    let mut ids = vec![tok.bos()];
    ids.extend(tok.encode(prompt));
    let mut trained = vec![false; ids.len()];
    for s in steps {
        for t in tok.encode(s).into_iter().chain([tok.step_delimiter()]) {
            ids.push(t);
            trained.push(true);
        }
    }
    (ids, trained)
}

/// Runs `spec.steps` AdamW steps of supervised fine-tuning and returns the model and the
/// final loss. Demonstrations are drawn at uniformly random difficulties so the policy sees
/// the whole training range.
pub fn warm_start<B, M>(
    mut model: M,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    spec: &WarmStart,
    max_grad_norm: f64,
    rng: &mut Rng,
    show_progress: bool,
    device: &B::Device,
) -> Result<(M, f64), crate::trainer::TrainError>
where
    B: AutodiffBackend,
    M: CausalLm<B> + AutodiffModule<B>,
{
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init::<B, M>();
    let dims = env.difficulty_space().len();
    let pb = progress::bar(spec.steps as u64, "warm start", show_progress);
    let mut last = f64::NAN;
    for step in 0..spec.steps {
        let demos: Vec<(Vec<u32>, Vec<bool>)> = (0..spec.batch)
            .map(|_| {
                let d: Vec<f64> = (0..dims).map(|_| rng.uniform()).collect();
                let (prompt, steps) = env.demonstration(&d, spec.noise, rng);
                demo_tokens(tok, &prompt, &steps)
            })
            .collect();
        let seqs: Vec<&[u32]> = demos.iter().map(|(ids, _)| ids.as_slice()).collect();
        let batch = token_batch::<B>(&seqs, tok.pad(), model.max_seq_len(), device);
        let mut mask = vec![0f32; batch.batch * batch.seq];
        for (r, (_, trained)) in demos.iter().enumerate() {
            for j in 0..batch.seq.min(trained.len().saturating_sub(1)) {
                mask[r * batch.seq + j] = if trained[j + 1] { 1.0 } else { 0.0 };
            }
        }
        let n: f32 = mask.iter().sum();
        let mask = host_tensor::<B>(mask, batch.batch, batch.seq, device);
        let lp = sequence_logprobs(&model, &batch);
        let loss = (lp * mask).sum().neg().div_scalar(n.max(1.0));
        last = loss.clone().into_scalar().elem::<f64>();
        if !last.is_finite() {
            return Err(crate::trainer::TrainError::NonFinite {
                step: 0,
                what: format!("warm-start loss at warm-start step {step}"),
            });
        }
        // Linear decay to 10% keeps the end of the warm start stable.
        let lr = spec.lr * (1.0 - 0.9 * step as f64 / spec.steps.max(1) as f64);
        (model, _) = optim::step(model, &mut optim, loss, lr, max_grad_norm);
        pb.set_message(format!("loss {last:.3}"));
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok((model, last))
}
