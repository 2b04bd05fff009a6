//! The judge's learnability, measured apart from RL: the judge's own warm start — its prompt,
//! tokenizer, model, labels and supervised fit, exactly as a run computes them — repeated
//! for a grid of label counts and label noises on one warm-started policy, with the judge
//! measured at every point of the fit on what a run cannot see: held-out steps by kind
//! (the run's evaluation pool and fresh rollouts of the same policy, oracle labels), and its
//! own training labels (does it learn the rule or memorise the flips?).
//!
//! A cell `(labels, noise)` is the judge a run with `judge.warm_start.labels = labels` and
//! `label_noise = noise` starts from (the same stream draws the same episodes, and a flip is
//! drawn for every step whatever the noise, so cells share their episodes and a label
//! flipped at noise 0.1 is flipped at 0.25 too).

use super::evaluation::JUDGE_POOL_NOISE;
use super::*;
use crate::judge::LabelledStep;
use crate::judge_fit::{FitPoint, VerdictProbs, expected_quality, majority_right, verdict_probs};

/// One cell of the grid: how many labels, at what noise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LearnCell {
    /// `judge.warm_start.labels`.
    pub labels: usize,
    /// `judge.warm_start.label_noise`.
    pub noise: f64,
}

/// What one cell's fit measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    /// The cell.
    pub cell: LearnCell,
    /// The seed.
    pub seed: u64,
    /// Labelled steps trained on and held out for validation.
    pub train: usize,
    /// Held out.
    pub val: usize,
    /// Labelled steps per optimiser step (epochs = step × batch / train).
    pub batch: usize,
    /// The step of the checkpoint the fit kept.
    pub best_step: usize,
    /// Every measurement: `step`, `loss`, `val_bal_acc` and the probe's keys.
    pub points: Vec<BTreeMap<String, f64>>,
}

/// Held-out steps the probe measures on (never trained on, oracle labels).
const HELD_OUT: usize = 512;
/// Training steps the memorisation probe reads (the first ones).
const TRAIN_PROBE: usize = 512;

/// Warm-starts the policy of `exp` for `seed` (through the warm cache, as a run does), then
/// for every cell of `cells` fits a fresh judge as the run's warm start would and hands the
/// result to `on_cell`.
pub fn judge_learnability<B, M, E, A>(
    exp: &Experiment<E, A>,
    seed: u64,
    parts: Components<'_, M>,
    device: &B::Device,
    opts: &TrainOptions,
    cells: &[LearnCell],
    mut on_cell: impl FnMut(CellResult) -> Result<(), TrainError>,
) -> Result<(), TrainError>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
    E: EnvironmentChoice,
    A: AdaptationChoice,
{
    let cfg = Settings::for_env(exp, parts.env);
    let Some(spec) = cfg.judge.model().cloned() else {
        return Ok(());
    };
    let mut parts = parts;
    let Some(fresh) = parts.judge.take() else {
        return Ok(());
    };
    let cache = opts.warm_cache.as_ref().map(WarmCache::new);
    let (policy, _, _) =
        Run::<B, M>::warm_policy(&cfg, seed, &parts, device, opts, cache.as_ref())?;
    parts.policy = policy;
    let dir = RunDir::read_only(&opts.run_dir);
    let mut run = Run::new(cfg, seed, parts, device, opts, dir);
    let max_len = fresh.max_seq_len();
    let layout = judge::PromptLayout {
        max_len,
        history: spec.history,
    };
    // The run's own evaluation pool (the flawed expert, balanced), and fresh rollouts of the
    // policy (its own mix of kinds and labels), both with oracle labels.
    let pool: Vec<LabelledStep> = judge::labelled_pool(
        run.env,
        run.tok,
        &layout,
        HELD_OUT.min(run.cfg.budget.eval_tasks),
        JUDGE_POOL_NOISE,
        seed,
    )
    .into_iter()
    .map(|p| LabelledStep {
        label: p.label,
        oracle: p.label,
        prompt: p.prompt,
        kind: p.kind,
    })
    .collect();
    let held_out = judge::labelled_steps(
        &run.policy.model.valid(),
        run.env,
        run.tok,
        &judge::LabelSpec {
            n: HELD_OUT,
            label_noise: 0.0,
            misconceptions: Vec::new(),
            layout,
            max_env_steps: run.cfg.budget.max_env_steps,
        },
        &run.params,
        &mut Rng::derive(seed, "learnability/held-out"),
    );
    let votes = run.cfg.reward.votes;
    for &cell in cells {
        if let Some(j) = run.cfg.judge.model_mut() {
            j.warm_start.labels = cell.labels;
            j.warm_start.label_noise = cell.noise;
        }
        let mut rng = Rng::derive(seed, "judge-warm-start");
        let labelled = run.judge_labels(max_len, &mut rng);
        let (train, val) = judge_fit::split_validation(labelled, spec.warm_start.validation);
        let memo = &train[..train.len().min(TRAIN_PROBE)];
        let (tok, spread, temperature) = (run.tok, run.spread.clone(), spec.temperature);
        // With plain lines (no progress bars), one line a measurement: a fit runs for minutes.
        let (every, steps) = (spec.warm_start.eval_interval(), spec.warm_start.steps);
        let mut measured = 0usize;
        let mut probe = |judge: &M::InnerModule| {
            let mut m = BTreeMap::new();
            for (name, steps) in [("pool", &pool[..]), ("policy", &held_out[..])] {
                let probs = verdict_probs(judge, tok, steps, temperature, &spread)?;
                readings(&mut m, name, steps, &probs, votes);
            }
            let probs = verdict_probs(judge, tok, memo, temperature, &spread)?;
            memorisation(&mut m, "train", memo, &probs);
            let probs = verdict_probs(judge, tok, &val, temperature, &spread)?;
            memorisation(&mut m, "val", &val, &probs);
            if opts.log_lines {
                let at = |k: &str| m.get(k).map_or("-".into(), |v| format!("{v:.3}"));
                eprintln!(
                    "[seed {seed} labels {} noise {}] step {}/{steps}: pool borderline {}, pool {}",
                    cell.labels,
                    cell.noise,
                    (measured * every).min(steps),
                    at("pool/logit_bal_acc/borderline"),
                    at("pool/logit_bal_acc"),
                );
            }
            measured += 1;
            Ok(m)
        };
        let fit = run.fit_judge(fresh.clone(), &train, &val, &mut rng, &mut probe)?;
        let batch = spec.warm_start.batch;
        on_cell(CellResult {
            cell,
            seed,
            train: train.len(),
            val: val.len(),
            batch,
            best_step: fit.best_step,
            points: fit.points.iter().map(flatten).collect(),
        })?;
    }
    Ok(())
}

/// A measurement as one map: `step`, `loss` (when finite), `val_bal_acc` and the probe's keys.
fn flatten(p: &FitPoint) -> BTreeMap<String, f64> {
    let mut m = p.probe.clone();
    m.insert("step".into(), p.step as f64);
    if p.loss.is_finite() {
        m.insert("loss".into(), p.loss);
    }
    if let Some(v) = p.val_bal_acc {
        m.insert("val_bal_acc".into(), v);
    }
    m
}

/// The judge's quality on `steps` (oracle labels) read two ways — the logit readout
/// (`<name>/logit_*`) and the loop's majority of `votes` sampled votes, its expected accuracy
/// (`<name>/vote_*`) — over all steps and by kind (`…/<kind>`).
fn readings(
    m: &mut BTreeMap<String, f64>,
    name: &str,
    steps: &[LabelledStep],
    probs: &[VerdictProbs],
    votes: usize,
) {
    let mut kinds: Vec<&str> = steps.iter().map(|s| s.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let scopes = std::iter::once(None).chain(kinds.into_iter().filter(|k| !k.is_empty()).map(Some));
    for scope in scopes {
        let chosen = || {
            steps
                .iter()
                .zip(probs)
                .filter(move |(s, _)| scope.is_none_or(|k| s.kind == k))
        };
        let logit = expected_quality(
            chosen().map(|(s, p)| (s.oracle, f64::from(u8::from(p.logit_right(s.oracle))))),
        );
        let vote = expected_quality(chosen().map(|(s, p)| {
            let (right, wrong) = if s.oracle {
                (p.plus, p.minus)
            } else {
                (p.minus, p.plus)
            };
            (s.oracle, majority_right(right, wrong, votes))
        }));
        let suffix = scope.map(|k| format!("/{k}")).unwrap_or_default();
        for (reading, q) in [("logit", logit), ("vote", vote)] {
            for (what, v) in [
                ("pos_acc", q.pos_acc),
                ("neg_acc", q.neg_acc),
                ("bal_acc", q.balanced()),
            ] {
                if let Some(v) = v {
                    m.insert(format!("{name}/{reading}_{what}{suffix}"), v);
                }
            }
        }
        m.insert(format!("{name}/n{suffix}"), chosen().count() as f64);
    }
}

/// On labelled steps whose given labels may be flipped: the logit readout's agreement with
/// the given labels (`<name>/agree_given`), with the flipped ones alone (`agree_flipped`: a
/// judge that learned the rule disagrees with them, one that memorised them agrees) and its
/// balanced accuracy against the oracle (`oracle_bal_acc`).
fn memorisation(
    m: &mut BTreeMap<String, f64>,
    name: &str,
    steps: &[LabelledStep],
    probs: &[VerdictProbs],
) {
    let share = |pairs: Vec<bool>| {
        (!pairs.is_empty())
            .then(|| pairs.iter().filter(|&&b| b).count() as f64 / pairs.len() as f64)
    };
    let pairs = || steps.iter().zip(probs);
    if let Some(v) = share(pairs().map(|(s, p)| p.logit_right(s.label)).collect()) {
        m.insert(format!("{name}/agree_given"), v);
    }
    if let Some(v) = share(
        pairs()
            .filter(|(s, _)| s.label != s.oracle)
            .map(|(s, p)| p.logit_right(s.label))
            .collect(),
    ) {
        m.insert(format!("{name}/agree_flipped"), v);
    }
    let q = expected_quality(
        pairs().map(|(s, p)| (s.oracle, f64::from(u8::from(p.logit_right(s.oracle))))),
    );
    if let Some(v) = q.balanced() {
        m.insert(format!("{name}/oracle_bal_acc"), v);
    }
}
