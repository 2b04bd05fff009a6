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
        let (policy, metrics, hit) =
            Self::warm_policy(&cfg, seed, &parts, device, opts, cache.as_ref())?;
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
            run.judge = Some(Learner::new(Role::Judge, judge, &run.cfg, seed));
        }
        run.judge_pool = run.make_judge_pool();
        let (id, ood) = run.evaluate(&mut m, 0)?;
        run.set_compute(&mut m);
        run.set_env_health(&mut m, 0);
        run.summary.acc_id_start = Some(id);
        run.summary.acc_ood_start = Some(ood);
        run.dir.log(&m)?;
        run.judge_gate(&m)?;
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

    /// The judge's gate (`judge.gate`), read on the step-0 evaluation `m`: the run stops
    /// here, its step-0 metrics logged, when the warm-started judge's balanced accuracy is
    /// outside the gate's range or was not measured.
    fn judge_gate(&self, m: &Metrics) -> Result<(), TrainError> {
        let Some(gate) = self.cfg.judge.model().and_then(|j| j.gate.as_ref()) else {
            return Ok(());
        };
        let metric = gate.metric();
        let value = m.get(&metric);
        match value {
            Some(v) if (gate.min..=gate.max).contains(&v) => Ok(()),
            _ => Err(TrainError::JudgeGate {
                metric,
                value,
                min: gate.min,
                max: gate.max,
            }),
        }
    }

    /// The policy's warm start for `seed`, from `cache` when an identical one was stored
    /// there: the model, its `warm/*` metrics and whether it came from the cache.
    pub(super) fn warm_policy(
        cfg: &Settings,
        seed: u64,
        parts: &Components<'a, M>,
        device: &B::Device,
        opts: &TrainOptions,
        cache: Option<&WarmCache>,
    ) -> Result<(M, WarmMetrics, bool), TrainError> {
        let inputs = seeded(&cfg.warm_policy_inputs, seed);
        through_cache(cache, &inputs, parts.policy.clone(), device, |fresh| {
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
                micro_batch: 0,
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
        })
    }

    /// The judge's warm start: a supervised fit (`judge_fit`) on oracle-labelled steps (with
    /// label noise) of the warm-started policy's own rollouts, the best checkpoint on a
    /// held-out validation split kept. Returns the judge and its `warm/*` metrics.
    pub(super) fn warm_start_judge(&self, judge: M) -> Result<(M, WarmMetrics), TrainError> {
        let mut m = WarmMetrics::new();
        let Some(spec) = self.cfg.judge.model() else {
            return Ok((judge, m));
        };
        let mut rng = Rng::derive(self.seed, "judge-warm-start");
        let labelled = self.judge_labels(judge.max_seq_len(), &mut rng);
        m.insert("warm/judge_labels".into(), labelled.len() as f64);
        m.insert(
            "warm/judge_pos_rate".into(),
            labelled.iter().filter(|s| s.label).count() as f64 / labelled.len().max(1) as f64,
        );
        let (train, val) = judge_fit::split_validation(labelled, spec.warm_start.validation);
        m.insert("warm/judge_val_labels".into(), val.len() as f64);
        let fit = self.fit_judge(judge, &train, &val, &mut rng, &mut |_| Ok(BTreeMap::new()))?;
        if fit.loss.is_finite() {
            m.insert("warm/judge_loss".into(), fit.loss);
        }
        if let Some(acc) = fit.best().and_then(|p| p.val_bal_acc) {
            m.insert("warm/judge_val_bal_acc".into(), acc);
            m.insert("warm/judge_best_step".into(), fit.best_step as f64);
        }
        // The validation curve, one key per measurement (`warm/judge_val_curve/<step>`).
        for p in &fit.points {
            if let Some(acc) = p.val_bal_acc {
                m.insert(format!("warm/judge_val_curve/{:06}", p.step), acc);
            }
        }
        Ok((fit.model, m))
    }

    /// The judge's warm-start labels, `judge.warm_start.labels` of them, drawn with `rng`
    /// (the warm start's own stream): the policy's rollouts or the flawed expert's, as the
    /// experiment says, each label inverted in a misconceived situation and then flipped with
    /// probability `label_noise`, in episode order.
    pub(super) fn judge_labels(&self, max_len: usize, rng: &mut Rng) -> Vec<judge::LabelledStep> {
        let Some(spec) = self.cfg.judge.model() else {
            return Vec::new();
        };
        let ws = &spec.warm_start;
        let labels = judge::LabelSpec {
            n: ws.labels,
            label_noise: ws.label_noise,
            misconceptions: ws.misconceptions.clone(),
            layout: judge::PromptLayout {
                max_len,
                history: spec.history,
            },
            max_env_steps: self.cfg.budget.max_env_steps,
        };
        match ws.source {
            LabelSource::Policy => judge::labelled_steps(
                &self.policy.model.valid(),
                self.env,
                self.tok,
                &labels,
                &self.params,
                rng,
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
            .map(|p| judge::LabelledStep {
                label: judge::misconceived_label(p.label, &p.situation, &labels.misconceptions)
                    ^ rng.bernoulli(labels.label_noise),
                oracle: p.label,
                prompt: p.prompt,
                kind: p.kind,
            })
            .collect(),
        }
    }

    /// The judge's supervised fit on `train`, measured on `val` (and by `probe`) as the
    /// experiment's `judge.warm_start` says; batches drawn with `rng`.
    pub(super) fn fit_judge(
        &self,
        judge: M,
        train: &[judge::LabelledStep],
        val: &[judge::LabelledStep],
        rng: &mut Rng,
        probe: &mut judge_fit::Probe<'_, M::InnerModule>,
    ) -> Result<judge_fit::Fit<M>, TrainError> {
        let Some(spec) = self.cfg.judge.model() else {
            let points = Vec::new();
            return Ok(judge_fit::Fit {
                model: judge,
                best_step: 0,
                points,
                loss: f64::NAN,
            });
        };
        let ws = &spec.warm_start;
        let fit_spec = judge_fit::FitSpec {
            sft: SftOptions {
                steps: ws.steps,
                lr: ws.lr,
                max_grad_norm: self.cfg.ppo.max_grad_norm,
                label: "judge warm",
                progress: self.opts.progress,
                kernels: self.cfg.kernels,
                spread: self.spread.clone(),
                micro_batch: 0,
            },
            batch: ws.batch,
            balanced: ws.balanced,
            eval_every: ws.eval_interval(),
        };
        let fit = judge_fit::fit(
            judge,
            self.tok,
            judge_fit::Labels { train, val },
            &fit_spec,
            rng,
            self.device,
            probe,
        )
        .map_err(non_finite(0, "judge warm-start"))?;
        env_ok(self.env, 0)?;
        Ok(fit)
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
        let saved: SavedState<TrainerState, Rng> = ckpt.state()?;
        let fresh_judge = parts.judge.take();
        let mut run = Self::new(cfg, seed, parts, device, opts, dir);
        run.policy = run.policy.resume(&ckpt, saved.policy_mb_rng, device)?;
        if let Some(j) = fresh_judge {
            let judge = Learner::new(Role::Judge, j, &run.cfg, seed);
            run.judge = Some(judge.resume(&ckpt, saved.judge_mb_rng, device)?);
        }
        run.judge_pool = run.make_judge_pool();
        run.state = saved.state;
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
