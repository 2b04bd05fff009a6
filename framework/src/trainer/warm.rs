//! The start of a run: the warm starts of the policy and the judge (through the warm-start
//! cache), and the resume from a checkpoint.

use super::evaluation::JUDGE_POOL_NOISE;
use super::*;

impl<'a, B, M> Run<'a, B, M>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// A fresh run: warm starts, the step-0 evaluation and the first checkpoint.
    pub(super) fn warm_start(
        cfg: Settings,
        seed: u64,
        mut parts: Components<'a, M>,
        device: &'a B::Device,
        opts: &'a TrainOptions,
    ) -> Result<Self, TrainError> {
        let dir = match opts.placement.leads() {
            true => RunDir::create(&opts.run_dir, &cfg.resolved, &opts.meta)?,
            false => RunDir::read_only(&opts.run_dir),
        };
        let mut m = Metrics::new(0);
        // Spread peers all compute their warm starts together (a cache hit on one peer only
        // would leave the others waiting for it).
        let cache = (!opts.placement.is_spread())
            .then_some(opts.warm_cache.as_ref())
            .flatten()
            .map(WarmCache::new);
        let inputs = seeded(&cfg.warm_policy_inputs, seed);
        let (policy, metrics, hit) = through_cache(
            cache.as_ref(),
            &inputs,
            parts.policy.clone(),
            device,
            |fresh| {
                let sft = SftOptions {
                    steps: cfg.warm_start.steps,
                    lr: cfg.warm_start.lr,
                    max_grad_norm: cfg.ppo.max_grad_norm,
                    label: "warm start",
                    progress: opts.progress,
                    kernels: cfg.kernels,
                    spread: Spread {
                        shards: cfg.shards,
                        placement: opts.placement.clone(),
                    },
                };
                let (policy, loss) = warm_start(
                    fresh,
                    parts.env,
                    parts.tok,
                    &cfg.warm_start,
                    &sft,
                    &mut Rng::derive(seed, "warm-start"),
                    device,
                )
                .map_err(non_finite(0, "policy warm-start"))?;
                // A faulted environment's demonstrations are not cached.
                env_ok(parts.env, 0)?;
                let mut metrics = WarmMetrics::new();
                if loss.is_finite() {
                    metrics.insert("warm/policy_loss".to_string(), loss);
                }
                Ok((policy, metrics))
            },
        )?;
        metrics.iter().for_each(|(k, v)| m.set(k, *v));
        let fresh_judge = parts.judge.take();
        parts.policy = policy;
        let mut run = Self::new(cfg, seed, parts, device, opts, dir);
        run.summary.warm_cached = usize::from(hit);
        if let Some(j) = fresh_judge {
            let inputs = seeded(&run.cfg.warm_judge_inputs, seed);
            let (judge, metrics, hit) = through_cache(cache.as_ref(), &inputs, j, device, |j| {
                run.warm_start_judge(j)
            })?;
            metrics.iter().for_each(|(k, v)| m.set(k, *v));
            run.summary.warm_cached += usize::from(hit);
            run.judge = Some(judge);
        }
        let frozen_target = matches!(run.cfg.ppo.kl.target, KlTarget::Reference);
        run.reference = frozen_target.then(|| run.policy.valid());
        if frozen_target && run.cfg.judge.trained() {
            run.judge_reference = run.judge.as_ref().map(|j| j.valid());
        }
        run.judge_pool = run.make_judge_pool();
        let (id, ood) = run.evaluate(&mut m, 0)?;
        run.set_compute(&mut m);
        run.set_env_health(&mut m, 0);
        run.summary.acc_id_start = Some(id);
        run.summary.acc_ood_start = Some(ood);
        run.dir.log(&m)?;
        run.save()?;
        if let Some(o) = &opts.observer {
            (o.0)(0, run.cfg.budget.steps);
        }
        if opts.log_lines {
            eprintln!(
                "[{} seed {seed}] warm start done | eval id {id:.3} ood {ood:.3}",
                run.cfg.name
            );
        }
        Ok(run)
    }

    /// The judge's warm start: supervised on oracle-labelled steps (with label noise) of the
    /// warm-started policy's own rollouts. Returns the judge and its `warm/*` metrics.
    pub(super) fn warm_start_judge(&self, judge: M) -> Result<(M, WarmMetrics), TrainError> {
        let mut m = WarmMetrics::new();
        let Some(spec) = self.cfg.judge.model() else {
            return Ok((judge, m));
        };
        let ws = &spec.warm_start;
        let mut rng = Rng::derive(self.seed, "judge-warm-start");
        let labels = judge::LabelSpec {
            n: ws.labels,
            label_noise: ws.label_noise,
            layout: judge::PromptLayout {
                max_len: judge.max_seq_len(),
                history: spec.history,
            },
            max_env_steps: self.cfg.budget.max_env_steps,
        };
        let pool = match ws.source {
            LabelSource::Policy => judge::labelled_steps(
                &self.policy.valid(),
                self.env,
                self.tok,
                &labels,
                &self.params,
                &mut rng,
            ),
            // Other tasks than the evaluation pool's: its seed is derived apart.
            LabelSource::Expert => judge::labelled_pool(
                self.env,
                self.tok,
                &labels.layout,
                labels.n,
                JUDGE_POOL_NOISE,
                rng.next_u64(),
            )
            .into_iter()
            .map(|p| (p.prompt, p.label ^ rng.bernoulli(labels.label_noise)))
            .collect(),
        };
        m.insert("warm/judge_labels".into(), pool.len() as f64);
        m.insert(
            "warm/judge_pos_rate".into(),
            pool.iter().filter(|(_, l)| *l).count() as f64 / pool.len().max(1) as f64,
        );
        let examples: Vec<(Vec<u32>, Vec<bool>)> = pool
            .iter()
            .map(|(prompt, label)| {
                let mut ids = prompt.clone();
                ids.push(judge::verdict_token(self.tok, *label));
                let mut target = vec![false; prompt.len()];
                target.push(true);
                (ids, target)
            })
            .collect();
        let sft = SftOptions {
            steps: ws.steps,
            lr: ws.lr,
            max_grad_norm: self.cfg.ppo.max_grad_norm,
            label: "judge warm",
            progress: self.opts.progress,
            kernels: self.cfg.kernels,
            spread: self.spread.clone(),
        };
        // Class-balanced batches alternate a right-labelled and a wrong-labelled example
        // (when both classes exist); otherwise examples are drawn uniformly.
        let by_class: [Vec<usize>; 2] =
            [false, true].map(|class| (0..pool.len()).filter(|&i| pool[i].1 == class).collect());
        let balanced = ws.balanced && by_class.iter().all(|c| !c.is_empty());
        let (judge, loss) = supervised(judge, self.tok, &sft, self.device, |_| {
            (0..ws.batch.min(examples.len()))
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
        })
        .map_err(non_finite(0, "judge warm-start"))?;
        env_ok(self.env, 0)?;
        if loss.is_finite() {
            m.insert("warm/judge_loss".into(), loss);
        }
        Ok((judge, m))
    }

    /// A resumed run: everything restored from the latest checkpoint.
    pub(super) fn resume(
        cfg: Settings,
        seed: u64,
        mut parts: Components<'a, M>,
        device: &'a B::Device,
        opts: &'a TrainOptions,
    ) -> Result<Self, TrainError> {
        let mut dir = RunDir::open(&opts.run_dir, &cfg.resolved)?;
        if !opts.placement.leads() {
            dir = RunDir::read_only(&opts.run_dir);
        }
        let ckpt = match &opts.checkpoint {
            Some(name) => checkpoint::Reader::named(&dir.checkpoints(), name)?,
            None => checkpoint::Reader::latest(&dir.checkpoints())?,
        };
        let reference = match cfg.ppo.kl.target {
            KlTarget::Reference => Some(ckpt.module("reference", parts.policy.valid(), device)?),
            KlTarget::Old => None,
        };
        let policy = ckpt.trainable("policy", parts.policy.clone(), device)?;
        let fresh_judge = parts.judge.take();
        parts.policy = policy;
        let mut run = Self::new(cfg, seed, parts, device, opts, dir);
        run.reference = reference;
        run.policy_optim = ckpt.optim("policy_optim", run.policy_optim, device)?;
        if let Some(j) = fresh_judge {
            run.judge_optim = ckpt.optim("judge_optim", run.judge_optim, device)?;
            if matches!(run.cfg.ppo.kl.target, KlTarget::Reference) && run.cfg.judge.trained() {
                run.judge_reference = Some(ckpt.module("judge_reference", j.valid(), device)?);
            }
            run.judge = Some(ckpt.trainable("judge", j, device)?);
        }
        run.judge_pool = run.make_judge_pool();
        run.state = ckpt.state()?;
        run.proposer.load_state(run.state.proposer.clone())?;
        run.dir.truncate_after(run.state.step)?;
        Ok(run)
    }
}

/// The `warm/*` metrics of one warm start.
type WarmMetrics = BTreeMap<String, f64>;

/// A warm start taken from `cache` when one with the same `inputs` was stored before, else
/// computed by `compute` from `fresh` and stored. Returns the model, its `warm/*` metrics and
/// whether it came from the cache.
fn through_cache<B: burn::prelude::Backend, M: burn::module::Module<B>>(
    cache: Option<&WarmCache>,
    inputs: &serde_json::Value,
    fresh: M,
    device: &B::Device,
    compute: impl FnOnce(M) -> Result<(M, WarmMetrics), TrainError>,
) -> Result<(M, WarmMetrics, bool), TrainError> {
    let key = warmcache::key(inputs);
    // Held until the entry is stored: a second thread needing it waits, then loads it.
    let _claim = cache.map(|c| {
        c.claim(&key, || {
            eprintln!(
                "waiting for an identical warm start that another run of this process is \
                 computing (shared through the warm cache)"
            );
        })
    });
    if let Some((model, metrics)) = cache.and_then(|c| c.load(&key, fresh.clone(), device)) {
        return Ok((model, metrics, true));
    }
    let (model, metrics) = compute(fresh)?;
    if let Some(c) = cache {
        c.store(&key, inputs, &model, &metrics)?;
    }
    Ok((model, metrics, false))
}

/// `inputs` with the seed added: the cache key of one run's warm start.
fn seeded(inputs: &serde_json::Value, seed: u64) -> serde_json::Value {
    serde_json::json!({ "seed": seed, "inputs": inputs })
}
