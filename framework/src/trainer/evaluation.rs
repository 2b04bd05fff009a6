//! The evaluation phase: the greedy evaluations (and the sampled one at the starting
//! difficulty, where asked for), the judge's quality on its fixed pool and the proposer's
//! posterior log.

use super::*;

impl<'a, B, M> Run<'a, B, M>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The judge's fixed evaluation pool (empty without a judge). The synthetic judge reads
    /// only its labels; its prompts are fitted to the policy's context.
    pub(super) fn make_judge_pool(&self) -> Vec<judge::PoolStep> {
        let max_len = match (&self.judge, &self.synthetic) {
            (Some(j), _) => Some(j.model.max_seq_len()),
            (None, Some(_)) => Some(self.policy.model.max_seq_len()),
            (None, None) => None,
        };
        // The history layout of a learned judge's prompts (the synthetic judge reads labels).
        let history = self
            .cfg
            .judge
            .model()
            .map(|j| j.history)
            .unwrap_or_default();
        match max_len {
            Some(max_len) => judge::labelled_pool(
                self.env,
                self.tok,
                &judge::PromptLayout { max_len, history },
                JUDGE_POOL.min(self.cfg.budget.eval_tasks),
                JUDGE_POOL_NOISE,
                self.seed,
            ),
            None => Vec::new(),
        }
    }

    /// Greedy evaluation on both splits into `m` (with the accuracy at each level of the
    /// eval grid), and the judge's quality on its fixed pool; also writes a few decoded
    /// samples and the proposer's posterior.
    pub(super) fn evaluate(&self, m: &mut Metrics, step: usize) -> Result<(f64, f64), TrainError> {
        let (b, seed) = (&self.cfg.budget, self.seed);
        let mst = self.cfg.sampling.max_step_tokens;
        let policy = self.policy.model.valid();
        let levels = self.env.eval_levels();
        let grid = crate::eval::grid(&levels, self.dims.len());
        let start = [self.cfg.start.clone()];
        let starts = u64::from(b.eval_start_tasks > 0) + u64::from(b.eval_start_sampled_tasks > 0);
        let mut pb = progress::bar(3 + starts, "eval", self.opts.progress);
        let run_split = |split, points: &[Difficulty], stream, tasks, sampling| {
            let spec = EvalSpec {
                split,
                points,
                stream,
                tasks,
                seed,
                max_step_tokens: mst,
                max_env_steps: b.max_env_steps,
                on_device: self.cfg.sample_on_device,
                spread: &self.spread,
                sampling,
            };
            evaluate(&policy, self.env, self.tok, &spec)
        };
        let grid_split = |split| {
            run_split(
                split,
                &grid,
                crate::eval::grid_stream(split),
                b.eval_tasks,
                None,
            )
        };
        let id = grid_split(Split::Eval)?;
        pb.inc(1);
        let ood = grid_split(Split::Ood)?;
        pb.inc(1);
        // Held-out tasks at the training difficulty itself (their own seed stream), greedy and,
        // where asked for, sampled (the first `eval_start_sampled_tasks` of the same tasks);
        // `None` where the budget asks for none.
        let mut at_start = |tasks, sampling| {
            (tasks > 0)
                .then(|| {
                    let r = run_split(Split::Eval, &start, "eval-start", tasks, sampling);
                    pb.inc(1);
                    r
                })
                .transpose()
        };
        let greedy_start = at_start(b.eval_start_tasks, None)?;
        // Sampled at the training temperature: the policy's remaining step errors, which greedy
        // decoding hides once the right answer is the likeliest, cost it tasks here (and show
        // in `eval/step_acc_start_sampled`). Its draws come from a stream of their own per
        // evaluation step.
        let sampled = at_start(
            b.eval_start_sampled_tasks,
            Some(EvalSampling {
                temperature: self.cfg.sampling.temperature,
                top_p: self.cfg.sampling.top_p,
                draws: Rng::derive(seed, &format!("eval-start-sampled/{step}")).next_u64(),
            }),
        )?;
        env_ok(self.env, step)?;
        m.set("eval/acc_id", id.accuracy);
        m.set("eval/acc_ood", ood.accuracy);
        m.set("eval/step_acc_id", id.step_accuracy);
        m.set("eval/step_acc_ood", ood.step_accuracy);
        for (name, r) in [("start", &greedy_start), ("start_sampled", &sampled)] {
            if let Some(r) = r {
                m.set(&format!("eval/acc_{name}"), r.accuracy);
                m.set(&format!("eval/step_acc_{name}"), r.step_accuracy);
            }
        }
        for (level, acc) in levels.iter().zip(&id.by_point) {
            m.set(&format!("eval/acc_grid/{level:.2}"), *acc);
        }
        // The two in-domain trajectories written to samples.jsonl, with the judge's verdicts.
        let shown = &id.trajectories[..id.trajectories.len().min(2)];
        let mut judged_id = Vec::new();
        if let (Some(j), Some(spec)) = (&self.judge, self.cfg.judge.model()) {
            // A stream per evaluation step: evaluations never disturb the training streams.
            let mut rng = Rng::derive(seed ^ step as u64, "judge-eval");
            let judge = j.model.valid();
            let voting = Voting {
                votes: self.cfg.reward.votes,
                temperature: spec.temperature,
            };
            let pool = judge::judge_prompts(
                &judge,
                self.tok,
                &self.judge_pool,
                voting,
                &mut rng,
                &self.spread,
            )?;
            self.judge_quality(m, &pool);
            // Verdicts on the two in-domain samples written below.
            judged_id = judge::judge_steps(
                &judge,
                self.tok,
                spec.history,
                shown,
                voting,
                &mut rng,
                &self.spread,
            )?;
        } else if let Some(s) = &self.synthetic {
            let mut rng = Rng::derive(seed ^ step as u64, "judge-eval");
            let pool = s.judge_labels(
                self.judge_pool.iter().map(|p| (p.label, p.kind.as_str())),
                &mut rng,
            );
            self.judge_quality(m, &pool);
            judged_id = s.judge_steps(shown, &mut rng);
        }
        pb.finish_and_clear();
        let verdicts = judge::by_trajectory(&judged_id, shown);
        for (split, r) in [("id", &id), ("ood", &ood)] {
            for (ti, t) in r.trajectories.iter().enumerate().take(2) {
                let steps: Vec<serde_json::Value> = t
                    .steps
                    .iter()
                    .enumerate()
                    .map(|(si, s)| {
                        let v = if split == "id" {
                            verdicts[ti].get(si).cloned().unwrap_or_default()
                        } else {
                            Vec::new()
                        };
                        serde_json::json!({"text": s.text, "oracle": s.oracle, "kind": s.kind, "observation": s.observation, "verdicts": v})
                    })
                    .collect();
                self.dir.sample(&serde_json::json!({
                    "step": step, "split": split, "prompt": t.prompt, "steps": steps, "outcome": t.outcome,
                }))?;
            }
        }
        self.log_posterior(step)?;
        Ok((id.accuracy, ood.accuracy))
    }

    /// The judge's quality on its pool (`judged[i]` judges pool entry `i`): majority verdicts
    /// (`judge/eval_*`, and by the environment's kind of step `judge/eval_*/<kind>`), single
    /// votes (`judge/eval_vote_*`), the share of votes that are a `+` or a `-` at all
    /// (`judge/eval_format_ok`) and the approval in each watched situation
    /// (`judge/eval_approve/<after>:<action>`).
    pub(super) fn judge_quality(&self, m: &mut Metrics, judged: &[judge::JudgedStep]) {
        let labelled = || {
            judged
                .iter()
                .map(|js| (self.judge_pool[js.traj].label, js.verdicts.as_slice()))
        };
        judge::quality(labelled()).set(m, "judge/eval");
        judge::vote_quality(labelled()).set(m, "judge/eval_vote");
        let by_kind = judge::quality_by_kind(judged.iter().map(|js| {
            let p = &self.judge_pool[js.traj];
            (p.kind.as_str(), p.label, js.verdicts.as_slice())
        }));
        for (kind, q) in by_kind {
            q.set_for_kind(m, "judge/eval", &kind);
        }
        if let Some(ok) = judge::format_ok(judged.iter().map(|js| js.verdicts.as_slice())) {
            m.set("judge/eval_format_ok", ok);
        }
        // The watched situations: the share of the pool's steps there that the judge approves.
        for s in &self.cfg.situations {
            let approved: Vec<bool> = judged
                .iter()
                .filter(|js| self.judge_pool[js.traj].situation == *s)
                .map(|js| crate::reward::majority(&js.verdicts) == 1)
                .collect();
            if !approved.is_empty() {
                m.set(
                    &format!("judge/eval_approve/{}", s.key()),
                    crate::advantage::accuracy(&approved),
                );
            }
        }
    }

    /// Appends the proposer's posterior (if it has a model) to `posterior.jsonl`.
    pub(super) fn log_posterior(&self, step: usize) -> Result<(), TrainError> {
        let center = step::mean_difficulty(&self.state.slots);
        if center.is_empty() {
            return Ok(());
        }
        if let Some(p) = self.proposer.posterior(&center, step, 11) {
            let mut v = serde_json::to_value(&p).unwrap_or_default();
            if let serde_json::Value::Object(o) = &mut v {
                o.insert("step".into(), step.into());
                o.insert("center".into(), serde_json::json!(center));
                o.insert("names".into(), serde_json::json!(self.dims));
                o.insert("band".into(), serde_json::json!(self.cfg.band));
            }
            self.dir.append("posterior.jsonl", &v)?;
        }
        Ok(())
    }
}

/// Labelled steps in the judge's evaluation pool (half correct, half wrong), at most: the
/// pool is no larger than the experiment's `eval_tasks`, so a small evaluation budget (a
/// smoke run, a pretrained model on the CPU) keeps the judge's evaluation small too.
const JUDGE_POOL: usize = 256;
/// The flawed expert's noise for the judge's pool (both labels must occur).
pub(super) const JUDGE_POOL_NOISE: f64 = 0.5;
