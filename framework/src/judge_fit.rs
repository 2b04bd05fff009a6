//! The judge's supervised fit (framework/METHOD.md, "Warm starts"): a held-out validation
//! split of the labelled steps, the judge measured on it every `eval_every` optimiser steps,
//! and the best checkpoint kept — a supervised fit as a practitioner runs one, instead of
//! whatever the last step left (which, on noisy labels, is a judge that has memorised them).
//!
//! A verdict is read here from the two verdict tokens' logits (`+` when its logit is the
//! larger): deterministic, and what the judge *would* say. The loop reads a judge by sampling
//! `m` votes at a temperature; [`majority_right`] gives the chance that such a majority is
//! right from the same logits, exactly, so a study can report both readings without
//! sampling noise.

use crate::judge::{JudgeQuality, LabelledStep, for_each_logits, verdict_token};
use crate::lm::{CausalLm, Tokenizer};
use crate::optimise::StepError;
use crate::placement::PlacementError;
use crate::rng::Rng;
use crate::shard::Spread;
use crate::warmstart::{SftOptions, supervised};
use burn::module::AutodiffModule;
use rlany_kernels::AutodiffLogProbOps;
use std::collections::BTreeMap;

/// `steps` split into a training part and a validation part, stratified by label: of each
/// label's steps (as given), the last `fraction` (rounded; at least one, and never all of
/// them, when the label has two or more) are held out; both parts keep `steps`' order. Steps
/// of the policy's rollouts come in episode order, so the held-out ones are mostly whole
/// episodes; the expert's come right ones first, so a plain tail would hold no right step.
pub fn split_validation(
    steps: Vec<LabelledStep>,
    fraction: f64,
) -> (Vec<LabelledStep>, Vec<LabelledStep>) {
    if fraction <= 0.0 {
        return (steps, Vec::new());
    }
    let mut held = vec![false; steps.len()];
    for class in [false, true] {
        let idx: Vec<usize> = (0..steps.len())
            .filter(|&i| steps[i].label == class)
            .collect();
        let n = idx.len();
        if n < 2 {
            continue;
        }
        let k = ((fraction * n as f64).round() as usize).clamp(1, n - 1);
        idx[n - k..].iter().for_each(|&i| held[i] = true);
    }
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (s, h) in steps.into_iter().zip(held) {
        if h { val.push(s) } else { train.push(s) }
    }
    (train, val)
}

/// What the judge says after one prompt, from its next-token logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerdictProbs {
    /// `logit(+) − logit(−)`: the logit readout says `+` when it is positive.
    pub margin: f64,
    /// Probability of sampling `+` at the temperature asked for.
    pub plus: f64,
    /// Probability of sampling `−` at that temperature.
    pub minus: f64,
}

impl VerdictProbs {
    /// From one row of logits, at sampling temperature `temperature` (0: the argmax).
    pub fn of(row: &[f32], plus: u32, minus: u32, temperature: f64) -> Self {
        let at = |t: u32| {
            row.get(t as usize)
                .map_or(f64::NEG_INFINITY, |&x| f64::from(x))
        };
        let (lp, lm) = (at(plus), at(minus));
        let margin = lp - lm;
        if temperature <= 0.0 {
            let max = row
                .iter()
                .map(|&x| f64::from(x))
                .fold(f64::NEG_INFINITY, f64::max);
            let top = |l: f64| if l >= max && l.is_finite() { 1.0 } else { 0.0 };
            return Self {
                margin,
                plus: top(lp),
                minus: if top(lp) > 0.0 { 0.0 } else { top(lm) },
            };
        }
        let max = row
            .iter()
            .map(|&x| f64::from(x))
            .filter(|x| x.is_finite())
            .fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row
            .iter()
            .map(|&x| f64::from(x))
            .filter(|x| x.is_finite())
            .map(|x| ((x - max) / temperature).exp())
            .sum();
        let p = |l: f64| {
            if l.is_finite() && z > 0.0 {
                ((l - max) / temperature).exp() / z
            } else {
                0.0
            }
        };
        Self {
            margin,
            plus: p(lp),
            minus: p(lm),
        }
    }

    /// Whether the logit readout is right on a step whose label is `label`.
    pub fn logit_right(&self, label: bool) -> bool {
        (self.margin > 0.0) == label
    }
}

/// The chance that the majority of `m` independent votes is right on a step whose right
/// verdict is drawn with probability `right` and the wrong one with `wrong` (the rest are
/// format failures): more right votes than wrong ones, as `reward::majority` reads them
/// (ties are not right).
pub fn majority_right(right: f64, wrong: f64, m: usize) -> f64 {
    let other = (1.0 - right - wrong).max(0.0);
    // Σ over (r right, w wrong, m − r − w other) with r > w of the multinomial probability.
    let mut total = 0.0;
    for r in 0..=m {
        for w in 0..=(m - r) {
            if r > w {
                let o = m - r - w;
                let ways = binom(m, r) * binom(m - r, w);
                total += ways * right.powi(r as i32) * wrong.powi(w as i32) * other.powi(o as i32);
            }
        }
    }
    total
}

fn binom(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// p⁺, p⁻ of `(label, chance the reading is right)` pairs (a 0/1 chance for a deterministic
/// reading): the expected accuracies on right and on wrong steps.
pub fn expected_quality(pairs: impl IntoIterator<Item = (bool, f64)>) -> JudgeQuality {
    let (mut hit_pos, mut n_pos, mut hit_neg, mut n_neg) = (0.0, 0usize, 0.0, 0usize);
    for (label, p) in pairs {
        if label {
            n_pos += 1;
            hit_pos += p;
        } else {
            n_neg += 1;
            hit_neg += p;
        }
    }
    let frac = |a: f64, b: usize| (b > 0).then(|| a / b as f64);
    JudgeQuality {
        pos_acc: frac(hit_pos, n_pos),
        neg_acc: frac(hit_neg, n_neg),
    }
}

/// The judge's verdict probabilities after each of `steps`' prompts.
pub fn verdict_probs<B: burn::prelude::Backend, M: CausalLm<B>>(
    judge: &M,
    tok: &dyn Tokenizer,
    steps: &[LabelledStep],
    temperature: f64,
    spread: &Spread,
) -> Result<Vec<VerdictProbs>, PlacementError> {
    let (plus, minus) = (verdict_token(tok, true), verdict_token(tok, false));
    let prompts: Vec<&[u32]> = steps.iter().map(|s| s.prompt.as_slice()).collect();
    let mut out = Vec::with_capacity(steps.len());
    for_each_logits(judge, tok, &prompts, spread, |_, rows| {
        out.extend(
            rows.iter()
                .map(|r| VerdictProbs::of(r, plus, minus, temperature)),
        );
    })?;
    Ok(out)
}

/// The labelled steps of a fit: those it trains on and those it is measured on.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    /// Trained on.
    pub train: &'a [LabelledStep],
    /// Held out: the validation split.
    pub val: &'a [LabelledStep],
}

/// How the judge's supervised fit runs.
#[derive(Debug, Clone)]
pub struct FitSpec {
    /// Optimiser steps, learning rate, clip, kernels and where the batches run.
    pub sft: SftOptions,
    /// Labelled steps per optimiser step.
    pub batch: usize,
    /// Class-balanced batches (a step labelled right, then one labelled wrong, …).
    pub balanced: bool,
    /// Measure on the validation split after every this many optimiser steps (and after the
    /// last; before the first too).
    pub eval_every: usize,
}

/// One measurement of the fit.
#[derive(Debug, Clone, PartialEq)]
pub struct FitPoint {
    /// Optimiser steps done.
    pub step: usize,
    /// The last step's loss (NaN before the first).
    pub loss: f64,
    /// Balanced accuracy of the logit readout on the validation split, against its labels
    /// as given (noise included: all a practitioner has); `None` without both labels there.
    pub val_bal_acc: Option<f64>,
    /// What the caller's probe measured at this point.
    pub probe: BTreeMap<String, f64>,
}

/// The fitted judge: the trained checkpoint with the best validation accuracy (the latest of
/// equals), or the last one without a validation split; every measurement on the way.
#[derive(Debug, Clone)]
pub struct Fit<M> {
    /// The judge kept.
    pub model: M,
    /// The optimiser step of the judge kept.
    pub best_step: usize,
    /// Every measurement, in step order.
    pub points: Vec<FitPoint>,
    /// The last step's loss.
    pub loss: f64,
}

impl<M> Fit<M> {
    /// The measurement of the judge kept.
    pub fn best(&self) -> Option<&FitPoint> {
        self.points.iter().find(|p| p.step == self.best_step)
    }
}

/// A probe: more measurements of the judge at each of the fit's measurement points.
pub type Probe<'p, I> = dyn FnMut(&I) -> Result<BTreeMap<String, f64>, PlacementError> + 'p;

/// Fits `judge` to `labels.train` (`train` below) (`spec.sft.steps` AdamW steps on batches drawn with
/// `rng`, class-balanced or uniform), measuring it on `val` before the first step, every
/// `spec.eval_every` steps and after the last; keeps the trained checkpoint with the best
/// balanced validation accuracy (the latest of equals). Measuring draws nothing from `rng`: with an empty `val` the fit is
/// step for step the plain supervised fit and returns its last checkpoint.
pub fn fit<B, M>(
    judge: M,
    tok: &dyn Tokenizer,
    Labels { train, val }: Labels<'_>,
    spec: &FitSpec,
    rng: &mut Rng,
    device: &B::Device,
    probe: &mut Probe<'_, M::InnerModule>,
) -> Result<Fit<M>, StepError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    let examples: Vec<(Vec<u32>, Vec<bool>)> = train
        .iter()
        .map(|s| {
            let mut ids = s.prompt.clone();
            ids.push(verdict_token(tok, s.label));
            let mut target = vec![false; s.prompt.len()];
            target.push(true);
            (ids, target)
        })
        .collect();
    let by_class: [Vec<usize>; 2] = [false, true].map(|class| {
        (0..train.len())
            .filter(|&i| train[i].label == class)
            .collect()
    });
    let balanced = spec.balanced && by_class.iter().all(|c| !c.is_empty());
    let steps = spec.sft.steps;
    let every = spec.eval_every.max(1);
    let spread = spec.sft.spread.clone();
    let mut points = Vec::new();
    let mut best: Option<(usize, f64, M)> = None;
    let mut measure = |step: usize, loss: f64, model: &M| -> Result<(), StepError> {
        let inner = model.valid();
        let val_bal_acc = if val.is_empty() {
            None
        } else {
            let probs = verdict_probs(&inner, tok, val, 0.0, &spread)?;
            expected_quality(
                val.iter()
                    .zip(&probs)
                    .map(|(s, p)| (s.label, f64::from(u8::from(p.logit_right(s.label))))),
            )
            .balanced()
        };
        // A trained checkpoint only (step 0 is measured for the curve), the latest of equals:
        // a judge that says `+` to everything scores 0.5 before training and after.
        if let Some(acc) = val_bal_acc
            && step > 0
            && best.as_ref().is_none_or(|(_, b, _)| acc >= *b)
        {
            best = Some((step, acc, model.clone()));
        }
        points.push(FitPoint {
            step,
            loss,
            val_bal_acc,
            probe: probe(&inner)?,
        });
        Ok(())
    };
    measure(0, f64::NAN, &judge)?;
    let (last, loss) = supervised(
        judge,
        tok,
        &spec.sft,
        device,
        |_| {
            (0..spec.batch.min(examples.len()))
                .map(|k| {
                    let i = if balanced {
                        let class = &by_class[k % 2];
                        class[rng.below(class.len())]
                    } else {
                        rng.below(examples.len())
                    };
                    examples[i].clone()
                })
                .collect()
        },
        |done, model, loss| {
            if done % every == 0 || done == steps {
                measure(done, loss, model)?;
            }
            Ok(())
        },
    )?;
    let (model, best_step) = match best {
        Some((step, _, model)) => (model, step),
        None => (last, steps),
    };
    Ok(Fit {
        model,
        best_step,
        points,
        loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(label: bool) -> LabelledStep {
        LabelledStep {
            prompt: vec![1],
            label,
            oracle: label,
            kind: String::new(),
        }
    }

    #[test]
    fn the_validation_split_is_each_labels_tail_rounded_and_never_all() {
        // Labels + − + − …: 5 of each; 0.2 holds out the last one of each.
        let steps: Vec<_> = (0..10).map(|i| step(i % 2 == 0)).collect();
        let (t, v) = split_validation(steps.clone(), 0.2);
        assert_eq!((t.len(), v.len()), (8, 2));
        assert_eq!(v, steps[8..].to_vec());
        // 0.5 of 5 = 2.5 rounds to 3 of each (halves away from zero): steps 4..10.
        assert_eq!(split_validation(steps.clone(), 0.5).1, steps[4..].to_vec());
        // At least one of each held out, never all of one.
        assert_eq!(split_validation(steps.clone(), 0.01).1.len(), 2);
        assert_eq!(split_validation(steps.clone(), 0.9).0.len(), 2);
        assert_eq!(split_validation(steps.clone(), 0.0).1.len(), 0);
        // Right ones first (the expert's order): a plain tail would hold no right step.
        let sorted: Vec<_> = (0..10).map(|i| step(i < 5)).collect();
        let (t, v) = split_validation(sorted.clone(), 0.2);
        assert_eq!(v, vec![sorted[4].clone(), sorted[9].clone()]);
        assert_eq!(t.len(), 8);
        // A label with one step stays in training.
        let (t, v) = split_validation(vec![step(true), step(false), step(false)], 0.5);
        assert_eq!((t.len(), v.len()), (2, 1));
        assert!(!v[0].label);
    }

    #[test]
    fn majority_of_votes_hand_computed() {
        // m = 1: the vote itself.
        assert!((majority_right(0.7, 0.3, 1) - 0.7).abs() < 1e-12);
        // m = 3, no format failures: p³ + 3p²(1 − p) = 0.343 + 0.441 = 0.784 at p = 0.7.
        assert!((majority_right(0.7, 0.3, 3) - 0.784).abs() < 1e-12);
        // m = 3 with failures (right 0.5, wrong 0.3, other 0.2): r > w happens for
        // (3,0,0) 0.125; (2,0,1) 3·0.25·0.2 = 0.15; (2,1,0) 3·0.25·0.3 = 0.225;
        // (1,0,2) 3·0.5·0.04 = 0.06: total 0.56.
        assert!((majority_right(0.5, 0.3, 3) - 0.56).abs() < 1e-12);
        // m = 2: a tie is not right: only (2,0) and (1,0,1) count: 0.25 + 2·0.5·0.2 = 0.45.
        assert!((majority_right(0.5, 0.3, 2) - 0.45).abs() < 1e-12);
    }

    #[test]
    fn verdict_probs_hand_computed() {
        // Tokens: 0 = '+', 1 = '-', 2 = other. Logits (ln 2, 0, 0): softmax (1/2, 1/4, 1/4).
        let row = [2f32.ln(), 0.0, 0.0];
        let p = VerdictProbs::of(&row, 0, 1, 1.0);
        assert!((p.plus - 0.5).abs() < 1e-7 && (p.minus - 0.25).abs() < 1e-7);
        assert!((p.margin - 2f64.ln()).abs() < 1e-7);
        assert!(p.logit_right(true) && !p.logit_right(false));
        // Temperature 0.5 squares the odds: (4, 1, 1)/6.
        let p = VerdictProbs::of(&row, 0, 1, 0.5);
        assert!((p.plus - 4.0 / 6.0).abs() < 1e-6 && (p.minus - 1.0 / 6.0).abs() < 1e-6);
        // Temperature 0: the argmax, all or nothing.
        let p = VerdictProbs::of(&[0.0, 1.0, 3.0], 0, 1, 0.0);
        assert_eq!((p.plus, p.minus), (0.0, 0.0));
        // A tie of margins is read as `−`.
        assert!(VerdictProbs::of(&[1.0, 1.0], 0, 1, 1.0).logit_right(false));
    }

    /// Verdicts `+`/`-` as the bigram's `L`/`R` ids, digits as theirs.
    struct Verdicts;

    impl Tokenizer for Verdicts {
        fn encode(&self, text: &str) -> Vec<u32> {
            text.chars()
                .map(|c| match c {
                    '+' => crate::testing::L,
                    '-' => crate::testing::R,
                    d @ '0'..='9' => 5 + d as u32 - '0' as u32,
                    _ => crate::testing::EOS,
                })
                .collect()
        }
        fn decode(&self, ids: &[u32]) -> String {
            crate::testing::Letters.decode(ids)
        }
        fn vocab_size(&self) -> usize {
            crate::testing::V
        }
        fn bos(&self) -> u32 {
            crate::testing::BOS
        }
        fn eos(&self) -> u32 {
            crate::testing::EOS
        }
        fn pad(&self) -> u32 {
            crate::testing::EOS
        }
    }

    /// A judge right on its validation split from the start, trained on the opposite labels:
    /// every step makes it worse there, so the fit must hand back an early checkpoint (the
    /// best measured), not the last one; without a validation split it hands back the last.
    #[test]
    fn the_fit_keeps_the_best_checkpoint_on_the_validation_split() {
        use crate::testing::{BOS, Bigram, L, R};
        use burn::backend::{Autodiff, NdArray};
        type B = Autodiff<NdArray<f32>>;
        let dev = Default::default();
        let (x, y) = (5u32, 6u32); // the digits 0 and 1
        let at = |t: u32, label: bool| LabelledStep {
            prompt: vec![BOS, t],
            label,
            oracle: label,
            kind: String::new(),
        };
        // Right after x is `+`, after y `-`: the initial judge reads both right.
        let val = vec![at(x, true), at(y, false)];
        let train = vec![at(x, false), at(y, true)];
        let judge = || Bigram::<B>::preferring(&[(x, L), (y, R)], 2.0, &dev);
        let spec = FitSpec {
            sft: SftOptions {
                steps: 12,
                lr: 0.5,
                max_grad_norm: 100.0,
                label: "test",
                progress: false,
                kernels: rlany_kernels::KernelChoice::Reference,
                spread: Spread::default(),
                micro_batch: 0,
            },
            batch: 2,
            balanced: true,
            eval_every: 1,
        };
        let mut none = |_: &Bigram<NdArray<f32>>| Ok(BTreeMap::new());
        let labels = Labels {
            train: &train,
            val: &val,
        };
        let fit = fit(
            judge(),
            &Verdicts,
            labels,
            &spec,
            &mut Rng::new(1),
            &dev,
            &mut none,
        )
        .expect("finite");
        assert_eq!(
            fit.points.len(),
            13,
            "before the first step and after each of 12"
        );
        let accs: Vec<f64> = fit.points.iter().filter_map(|p| p.val_bal_acc).collect();
        assert_eq!(accs[0], 1.0);
        assert_eq!(*accs.last().expect("points"), 0.0, "{accs:?}");
        // The latest trained checkpoint still at the best accuracy, 1.0.
        let best = accs.iter().skip(1).cloned().fold(f64::MIN, f64::max);
        assert_eq!(best, 1.0, "{accs:?}");
        let expected = accs.iter().rposition(|&a| a == best).expect("best");
        assert_eq!(fit.best_step, expected);
        assert!(fit.best_step > 0 && fit.best_step < 12);
        // The model handed back is that checkpoint: right on both validation steps again.
        let probs = verdict_probs(&fit.model.valid(), &Verdicts, &val, 0.0, &Spread::default())
            .expect("local");
        assert!(val.iter().zip(&probs).all(|(s, p)| p.logit_right(s.label)));
        // Without a validation split: no selection, the last checkpoint (wrong on both).
        let fit = fit_last(judge(), &train, &spec);
        assert_eq!(fit.best_step, 12);
        assert!(fit.points.iter().all(|p| p.val_bal_acc.is_none()));
        let probs = verdict_probs(&fit.model.valid(), &Verdicts, &val, 0.0, &Spread::default())
            .expect("local");
        assert!(val.iter().zip(&probs).all(|(s, p)| !p.logit_right(s.label)));

        fn fit_last(judge: Bigram<B>, train: &[LabelledStep], spec: &FitSpec) -> Fit<Bigram<B>> {
            let mut none = |_: &Bigram<NdArray<f32>>| Ok(BTreeMap::new());
            super::fit(
                judge,
                &Verdicts,
                Labels { train, val: &[] },
                spec,
                &mut Rng::new(1),
                &Default::default(),
                &mut none,
            )
            .expect("finite")
        }
    }

    #[test]
    fn expected_quality_averages_chances_by_label() {
        let q = expected_quality([(true, 1.0), (true, 0.5), (false, 0.25)]);
        assert_eq!((q.pos_acc, q.neg_acc), (Some(0.75), Some(0.25)));
        assert_eq!(q.balanced(), Some(0.5));
    }
}
