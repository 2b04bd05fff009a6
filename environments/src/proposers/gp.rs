//! The `Gp` proposer (framework/METHOD.md step 7): a Gaussian-process surrogate of the policy's accuracy
//! over (difficulty vector, training step), on egobox-gp.
//!
//! **Model.** Kriging with a constant mean and a Matérn-5/2 correlation on `logit(acc)`; the
//! inputs are the difficulty `d ∈ [0,1]^k` and the normalised training step
//! `t = step / total_steps`. Accuracies are clipped to `[0.5/G, 1 − 0.5/G]` before the logit.
//! Observations at the same `(d, step)` are pooled (successes and group sizes added) before
//! fitting. A nugget (a noise-to-signal variance ratio) makes the GP a regression rather than an
//! interpolation of binomial noise.
//!
//! **Prior trend.** A constant-mean GP cannot extrapolate from a cluster of observations at the
//! starting difficulty: away from the data its prediction reverts to the data mean, so it never
//! finds where accuracy drops (measured on the synthetic test: ≈40 proposals to reach the band,
//! 4× worse than `Threshold`). Our difficulty vectors are built so that larger is harder, so the
//! GP models the residual `logit(acc) + prior_slope · mean(d)` (constant mean fitted, Matérn-5/2);
//! the prediction adds the trend back. The data correct a wrong slope: slopes 2 to 8 all beat
//! `Threshold` on synthetic true slopes 3, 6 and 12; [`GpSpec::prior_slope`] = 0 gives the
//! plain constant-mean GP.
//!
//! **Fading.** egobox standardises every input column, so scaling the step input would change
//! nothing. Instead the correlation length along `t` is *fixed* (not fitted) at
//! [`GpSpec::time_scale`] (in units of the run): two observations `time_scale · total_steps`
//! steps apart correlate at ≈ 0.52, at twice that ≈ 0.14, so old observations fade as the
//! policy improves. The correlation lengths along the difficulty dimensions are fitted by
//! maximum likelihood (egobox's multistart COBYLA).
//!
//! **Determinism.** egobox seeds its multistart points with a fixed LHS seed when
//! `n_start > 1` (it draws from entropy when `n_start == 1`, so 1 is raised to 2 here) and
//! COBYLA is deterministic, so a fit is a pure function of (observations, warm-start theta).
//! [`Proposer::state`] stores the observations, the warm-start theta and the fitted theta (all
//! floats as exact bit patterns); [`Proposer::load_state`] rebuilds the same model, so a resumed
//! run makes identical proposals.
//!
//! **Proposals.** `candidates` points drawn from the [`Rng`]: half uniform in `[0,1]^k`, half
//! Gaussian perturbations (sd 0.25) of the current difficulty along the dimensions the critic
//! flags (all if none), evaluated at the current step. Only candidates whose predicted accuracy
//! moves the right way (below `acc` for Harder, above it for Easier) are kept; among them
//! [`Acquisition::Nearest`] takes the one whose prediction is nearest `target` (ties within
//! 0.02 go to the candidate closest to the current difficulty) and [`Acquisition::Ucb`] the
//! maximum of `p(1−p) + β·sd_p` among those predicted inside `band` (delta method:
//! `sd_p = p(1−p)·sd_logit`; Nearest when none is inside). With fewer than 3 observations (or
//! fewer than 2 distinct difficulties), a failed fit, or no candidate moving the right way, it
//! falls back to the [`Threshold`](rlany_framework::adapt::Threshold) move of 0.1.

use egobox_gp::correlation_models::Matern52Corr;
use egobox_gp::mean_models::ConstantMean;
use egobox_gp::{GaussianProcess, ThetaTuning};
use linfa::prelude::{Dataset, Fit};
use ndarray::{Array1, Array2};
use rlany_framework::Rng;
use rlany_framework::adapt::{
    AdaptError, CriticFeedback, Direction, Observation, Posterior, PosteriorSlice, Proposer,
    clamp_unit, threshold_move,
};
use rlany_framework::check::{self, Checked};
use rlany_framework::plugin::{ProposerContext, ProposerPlugin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// How the GP proposer picks among candidates that move the right way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Acquisition {
    /// The candidate whose predicted accuracy is nearest the target.
    Nearest,
    /// Upper confidence bound on the learning signal `p(1−p)`: maximise
    /// `p(1−p) + beta·sd_p` among candidates predicted inside the band.
    Ucb {
        /// Exploration weight (default 2).
        #[serde(default = "default_beta")]
        beta: f64,
    },
}

fn default_beta() -> f64 {
    2.0
}

/// The `Gp` settings of an experiment file (`adaptation: Gp(target: 0.5, ...)`): the
/// hyperparameters of the [`Gp`] proposer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpSpec {
    /// Accuracy the proposer aims for (band centre).
    pub target: f64,
    /// `(α_low, α_high)`: the UCB acquisition only considers candidates predicted inside it.
    pub band: (f64, f64),
    /// Candidate selection rule.
    pub acquisition: Acquisition,
    /// Candidates drawn per proposal.
    pub candidates: usize,
    /// Correlation length along the normalised step `step / total_steps` (fixed, not fitted):
    /// how fast old observations fade. Non-positive or non-finite: effectively no fading (1e6).
    pub time_scale: f64,
    /// Cap on stored observations; the oldest are dropped first.
    pub max_observations: usize,
    /// Nugget: noise variance as a fraction of the process variance (≥ 1e-8).
    pub nugget: f64,
    /// Prior trend of the GP mean: `logit(acc) ≈ β − prior_slope · mean(d)`, the GP models the
    /// residual (constant mean β fitted). 0 gives a plain constant-mean GP. See the module docs.
    pub prior_slope: f64,
    /// Extra multistart points of egobox's hyperparameter optimisation (0 = only the warm start;
    /// 1 is raised to 2 because egobox seeds a single extra start from entropy).
    pub n_start: usize,
}

impl Default for GpSpec {
    fn default() -> Self {
        Self {
            target: 0.5,
            band: (0.2, 0.8),
            acquisition: Acquisition::Nearest,
            candidates: 256,
            time_scale: 0.25,
            max_observations: 200,
            nugget: 0.1,
            prior_slope: 4.0,
            n_start: 4,
        }
    }
}

impl ProposerPlugin for GpSpec {
    fn validate(&self) -> Checked {
        check::real("target", self.target, 0.0, 1.0)?;
        check::band("band", self.band)?;
        check::count("candidates", self.candidates, 1, 1 << 16)?;
        check::count("max_observations", self.max_observations, 3, 10_000)?;
        if let Acquisition::Ucb { beta } = self.acquisition {
            check::real("acquisition.beta", beta, 0.0, 1e3)?;
        }
        check::real("time_scale", self.time_scale, 0.0, 1e6)?;
        check::real("nugget", self.nugget, 1e-8, 1e3)?;
        check::real("prior_slope", self.prior_slope, 0.0, 100.0)?;
        check::count("n_start", self.n_start, 0, 64)
    }

    fn band(&self) -> (f64, f64) {
        self.band
    }

    fn build(&self, ctx: &ProposerContext) -> Box<dyn Proposer> {
        Box::new(Gp::new(self.clone(), ctx.total_steps))
    }
}

/// The fallback move (a Threshold step) when the model cannot answer.
const FALLBACK_STEP: f64 = 0.1;
/// Scale of the local perturbations of the current difficulty.
const LOCAL_SD: f64 = 0.25;
/// Predictions within this of the best |p − target| count as ties (closest to current wins).
const NEAREST_TOL: f64 = 0.02;
/// Default initial correlation parameter (egobox's own default) for the difficulty dims.
const THETA_INIT: f64 = 0.1;
/// Bounds of the fitted correlation parameters (egobox's defaults, in standardised units).
const THETA_BOUNDS: (f64, f64) = (1e-2, 1e1);

type Model = GaussianProcess<f64, ConstantMean, Matern52Corr>;

/// Where the model stands with respect to the stored observations.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    /// Observations arrived since the last fit (or none yet).
    Stale,
    /// The fit on the current observations failed (or there were too few of them).
    Failed,
    /// The model for the current observations has this (full, `k + 1`) theta.
    Fitted(Vec<f64>),
}

/// Gaussian-process proposer (see the module docs).
pub struct Gp {
    config: GpSpec,
    /// Training steps of the run (normalises the step input).
    total_steps: usize,
    observations: Vec<Observation>,
    /// Warm start of the next fit: the difficulty thetas of the last successful fit.
    warm: Option<Vec<f64>>,
    status: Status,
    /// Cache of the model for `status == Fitted` (rebuilt from the theta after a resume).
    model: Option<(usize, Model)>,
}

impl std::fmt::Debug for Gp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gp")
            .field("config", &self.config)
            .field("observations", &self.observations.len())
            .field("status", &self.status)
            .finish()
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn logit_clipped(acc: f64, group: usize) -> f64 {
    let g = group.max(1) as f64;
    let p = acc.clamp(0.5 / g, 1.0 - 0.5 / g);
    (p / (1.0 - p)).ln()
}

/// The training data of one fit: rows `(d, t)`, targets `logit(acc)`; `(d, step)` duplicates
/// pooled. Only observations with `k` dimensions count.
struct Data {
    x: Array2<f64>,
    y: Array1<f64>,
    distinct_d: usize,
}

impl Gp {
    /// A proposer with no observations yet, for a run of `total_steps` training steps.
    pub fn new(config: GpSpec, total_steps: usize) -> Self {
        Self {
            config,
            total_steps,
            observations: Vec::new(),
            warm: None,
            status: Status::Stale,
            model: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &GpSpec {
        &self.config
    }

    /// The stored observations, oldest first.
    pub fn observations(&self) -> &[Observation] {
        &self.observations
    }

    /// The correlation parameters of the current fit (difficulty dims, then time), if any.
    pub fn theta(&self) -> Option<&[f64]> {
        match &self.status {
            Status::Fitted(t) => Some(t),
            _ => None,
        }
    }

    fn time_input(&self, step: usize) -> f64 {
        step as f64 / self.total_steps.max(1) as f64
    }

    /// The fixed prior trend at difficulty `d` (on the logit scale).
    fn prior(&self, d: &[f64]) -> f64 {
        let s = self.config.prior_slope;
        if d.is_empty() || !s.is_finite() {
            return 0.0;
        }
        -s * d.iter().sum::<f64>() / d.len() as f64
    }

    fn time_scale(&self) -> f64 {
        let s = self.config.time_scale;
        if s.is_finite() && s > 0.0 { s } else { 1e6 }
    }

    fn data(&self, k: usize) -> Data {
        // Pool identical (d, step) observations: (d bits, step) -> (successes, trials).
        let mut pooled: Vec<(Vec<u64>, usize, f64, usize)> = Vec::new();
        for o in self.observations.iter().filter(|o| o.difficulty.len() == k) {
            let key: Vec<u64> = o.difficulty.iter().map(|x| x.to_bits()).collect();
            let g = o.group_size.max(1);
            match pooled
                .iter_mut()
                .find(|(kd, ks, _, _)| *kd == key && *ks == o.step)
            {
                Some(entry) => {
                    entry.2 += o.acc * g as f64;
                    entry.3 += g;
                }
                None => pooled.push((key, o.step, o.acc * g as f64, g)),
            }
        }
        let n = pooled.len();
        let mut x = Array2::zeros((n, k + 1));
        let mut y = Array1::zeros(n);
        let mut distinct: Vec<&Vec<u64>> = Vec::new();
        for (i, (key, step, succ, g)) in pooled.iter().enumerate() {
            for (j, b) in key.iter().enumerate() {
                x[[i, j]] = f64::from_bits(*b);
            }
            x[[i, k]] = self.time_input(*step);
            y[i] = logit_clipped(succ / *g as f64, *g) - self.prior(&x.row(i).to_vec()[..k]);
            if !distinct.contains(&key) {
                distinct.push(key);
            }
        }
        Data {
            x,
            y,
            distinct_d: distinct.len(),
        }
    }

    /// Fit on the current observations: from scratch (warm-started from `warm`) when `theta`
    /// is `None`, else rebuild the model with that fixed theta. `None` when it cannot.
    fn fit(&self, k: usize, theta: Option<&[f64]>) -> Option<Model> {
        let data = self.data(k);
        if data.y.len() < 3 || data.distinct_d < 2 {
            return None;
        }
        let tuning = match theta {
            Some(t) if t.len() == k + 1 => ThetaTuning::Fixed(Array1::from(t.to_vec())),
            Some(_) => return None,
            None => {
                // egobox standardises columns with the sample std (ddof 1; 1 when zero), so the
                // fixed time theta is std_t / time_scale to give the length `time_scale` in `t`.
                let t_col = data.x.column(k);
                let n = t_col.len() as f64;
                let mean = t_col.sum() / n;
                let var = t_col.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
                let std_t = if var > 0.0 { var.sqrt() } else { 1.0 };
                let mut init = vec![THETA_INIT; k + 1];
                if let Some(w) = self.warm.as_ref().filter(|w| w.len() == k) {
                    for (i, v) in w.iter().enumerate() {
                        init[i] = v.clamp(THETA_BOUNDS.0, THETA_BOUNDS.1);
                    }
                }
                init[k] = std_t / self.time_scale();
                ThetaTuning::Partial {
                    init: Array1::from(init),
                    bounds: Array1::from(vec![THETA_BOUNDS; k + 1]),
                    active: (0..k).collect(),
                }
            }
        };
        let n_start = if self.config.n_start == 1 {
            2
        } else {
            self.config.n_start
        };
        let nugget = if self.config.nugget.is_finite() {
            self.config.nugget.max(1e-8)
        } else {
            0.1
        };
        let params = GaussianProcess::<f64, ConstantMean, Matern52Corr>::params(
            ConstantMean(),
            Matern52Corr(),
        )
        .theta_tuning(tuning)
        .n_start(n_start)
        .nugget(nugget);
        let dataset = Dataset::new(data.x, data.y);
        let model = catch_unwind(AssertUnwindSafe(|| params.fit(&dataset)))
            .ok()?
            .ok()?;
        model
            .theta()
            .iter()
            .all(|t| t.is_finite() && *t > 0.0)
            .then_some(model)
    }

    /// Make sure the cached model matches the observations (refitting if needed).
    fn ensure_model(&mut self, k: usize) -> Option<&Model> {
        let cached_ok = matches!(&self.model, Some((mk, _)) if *mk == k)
            && matches!(self.status, Status::Fitted(_));
        if !cached_ok {
            self.model = None;
            match &self.status {
                Status::Failed => return None,
                Status::Fitted(theta) => {
                    let theta = theta.clone();
                    match self.fit(k, Some(&theta)) {
                        Some(m) => self.model = Some((k, m)),
                        None => {
                            self.status = Status::Failed;
                            return None;
                        }
                    }
                }
                Status::Stale => match self.fit(k, None) {
                    Some(m) => {
                        let theta = m.theta().to_vec();
                        self.warm = Some(theta[..k].to_vec());
                        self.status = Status::Fitted(theta);
                        self.model = Some((k, m));
                    }
                    None => {
                        self.status = Status::Failed;
                        return None;
                    }
                },
            }
        }
        self.model.as_ref().map(|(_, m)| m)
    }

    /// A freshly fitted model for reports (the one `ensure_model` would build), when the
    /// cache holds none; the cache itself is left alone.
    fn model_for_report(&self, k: usize) -> Option<Model> {
        match &self.status {
            Status::Failed => None,
            Status::Fitted(theta) => self.fit(k, Some(theta)),
            Status::Stale => self.fit(k, None),
        }
    }

    /// The number of difficulty dimensions of the stored observations (of the newest one).
    fn dims(&self) -> Option<usize> {
        self.observations.last().map(|o| o.difficulty.len())
    }

    /// Predicted `(p, sd_p)` at the rows of `x` (difficulty, then `t`); NaN where it fails.
    fn predict(&self, model: &Model, x: &Array2<f64>) -> Vec<(f64, f64)> {
        let k = x.ncols().saturating_sub(1);
        let out = catch_unwind(AssertUnwindSafe(|| model.predict_valvar(x)));
        match out {
            Ok(Ok((mu, var))) => mu
                .iter()
                .zip(var.iter())
                .zip(x.rows())
                .map(|((m, v), row)| {
                    let d: Vec<f64> = row.iter().take(k).copied().collect();
                    let p = sigmoid(*m + self.prior(&d));
                    let sd = p * (1.0 - p) * v.max(0.0).sqrt();
                    (p, sd)
                })
                .collect(),
            _ => vec![(f64::NAN, f64::NAN); x.nrows()],
        }
    }

    fn candidates(
        &self,
        current: &[f64],
        feedback: &CriticFeedback,
        rng: &mut Rng,
    ) -> Vec<Vec<f64>> {
        let k = current.len();
        let n = self.config.candidates.max(2);
        let flagged = feedback.flagged_dims(k);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n / 2 {
            out.push((0..k).map(|_| rng.uniform()).collect());
        }
        for _ in n / 2..n {
            let mut d = current.to_vec();
            for &j in &flagged {
                d[j] += LOCAL_SD * rng.normal();
            }
            out.push(clamp_unit(&d));
        }
        out
    }

    fn select(
        &self,
        current: &[f64],
        acc: f64,
        direction: Direction,
        cands: &[Vec<f64>],
        preds: &[(f64, f64)],
    ) -> Option<usize> {
        let ok: Vec<usize> = (0..cands.len())
            .filter(|&i| {
                let (p, sd) = preds[i];
                p.is_finite()
                    && sd.is_finite()
                    && match direction {
                        Direction::Harder => p < acc,
                        Direction::Easier => p > acc,
                    }
            })
            .collect();
        if ok.is_empty() {
            return None;
        }
        let target = if self.config.target.is_finite() {
            self.config.target
        } else {
            0.5
        };
        let dist = |i: usize| -> f64 {
            cands[i]
                .iter()
                .zip(current)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
        };
        let nearest = |set: &[usize]| -> Option<usize> {
            let best = set
                .iter()
                .map(|&i| (preds[i].0 - target).abs())
                .fold(f64::INFINITY, f64::min);
            set.iter()
                .copied()
                .filter(|&i| (preds[i].0 - target).abs() <= best + NEAREST_TOL)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
        };
        match self.config.acquisition {
            Acquisition::Nearest => nearest(&ok),
            Acquisition::Ucb { beta } => {
                let beta = if beta.is_finite() { beta } else { 0.0 };
                let (lo, hi) = self.config.band;
                let inside: Vec<usize> = ok
                    .iter()
                    .copied()
                    .filter(|&i| preds[i].0 >= lo && preds[i].0 <= hi)
                    .collect();
                if inside.is_empty() {
                    return nearest(&ok);
                }
                let score = |i: usize| {
                    let (p, sd) = preds[i];
                    p * (1.0 - p) + beta * sd
                };
                // First maximum wins (deterministic).
                let mut best = inside[0];
                for &i in &inside[1..] {
                    if score(i) > score(best) {
                        best = i;
                    }
                }
                Some(best)
            }
        }
    }
}

fn f64s_to_bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bits_to_f64s(v: &Value) -> Option<Vec<f64>> {
    v.as_array()?
        .iter()
        .map(|b| b.as_u64().map(f64::from_bits))
        .collect()
}

impl Proposer for Gp {
    fn observe(&mut self, obs: Observation) {
        if !obs.acc.is_finite() || obs.difficulty.iter().any(|x| !x.is_finite()) {
            return;
        }
        self.observations.push(obs);
        let cap = self.config.max_observations.max(3);
        if self.observations.len() > cap {
            let excess = self.observations.len() - cap;
            self.observations.drain(..excess);
        }
        self.status = Status::Stale;
        self.model = None;
    }

    fn propose(
        &mut self,
        current: &[f64],
        acc: f64,
        direction: Direction,
        feedback: &CriticFeedback,
        step: usize,
        rng: &mut Rng,
    ) -> Vec<f64> {
        let k = current.len();
        let current = clamp_unit(current);
        let fallback = threshold_move(&current, direction, feedback, FALLBACK_STEP);
        if k == 0 || acc.is_nan() || self.dims() != Some(k) {
            return fallback;
        }
        // Draw the candidates first so the rng advances the same way whatever the model does.
        let cands = self.candidates(&current, feedback, rng);
        let t = self.time_input(step);
        if self.ensure_model(k).is_none() {
            return fallback;
        }
        let Some((_, model)) = self.model.as_ref() else {
            return fallback;
        };
        let mut x = Array2::zeros((cands.len(), k + 1));
        for (i, c) in cands.iter().enumerate() {
            for (j, v) in c.iter().enumerate() {
                x[[i, j]] = *v;
            }
            x[[i, k]] = t;
        }
        let preds = self.predict(model, &x);
        match self.select(&current, acc, direction, &cands, &preds) {
            Some(i) => cands[i].clone(),
            None => fallback,
        }
    }

    fn state(&self) -> Value {
        let observations: Vec<Value> = self
            .observations
            .iter()
            .map(|o| {
                json!({
                    "d": f64s_to_bits(&o.difficulty),
                    "step": o.step,
                    "acc": o.acc.to_bits(),
                    "g": o.group_size,
                })
            })
            .collect();
        let status = match &self.status {
            Status::Stale => json!("stale"),
            Status::Failed => json!("failed"),
            Status::Fitted(t) => json!({ "fitted": f64s_to_bits(t) }),
        };
        json!({
            "format": "gp-v1 (floats as IEEE-754 bit patterns)",
            "config": serde_json::to_value(&self.config).unwrap_or(Value::Null),
            "total_steps": self.total_steps,
            "observations": observations,
            "warm": self.warm.as_deref().map(f64s_to_bits),
            "status": status,
        })
    }

    fn load_state(&mut self, state: Value) -> Result<(), AdaptError> {
        let err = |r: &str| AdaptError::state("gp", r);
        let obs = state
            .get("observations")
            .and_then(Value::as_array)
            .ok_or_else(|| err("missing `observations`"))?;
        let mut observations = Vec::with_capacity(obs.len());
        for o in obs {
            let difficulty = o
                .get("d")
                .and_then(bits_to_f64s)
                .ok_or_else(|| err("bad observation `d`"))?;
            let step = o
                .get("step")
                .and_then(Value::as_u64)
                .ok_or_else(|| err("bad observation `step`"))? as usize;
            let acc = o
                .get("acc")
                .and_then(Value::as_u64)
                .map(f64::from_bits)
                .ok_or_else(|| err("bad observation `acc`"))?;
            let group_size = o
                .get("g")
                .and_then(Value::as_u64)
                .ok_or_else(|| err("bad observation `g`"))? as usize;
            observations.push(Observation {
                difficulty,
                step,
                acc,
                group_size,
            });
        }
        let warm = match state.get("warm") {
            None | Some(Value::Null) => None,
            Some(w) => Some(bits_to_f64s(w).ok_or_else(|| err("bad `warm`"))?),
        };
        let status = match state.get("status") {
            Some(Value::String(s)) if s == "stale" => Status::Stale,
            Some(Value::String(s)) if s == "failed" => Status::Failed,
            Some(v) => Status::Fitted(
                v.get("fitted")
                    .and_then(bits_to_f64s)
                    .ok_or_else(|| err("bad `status`"))?,
            ),
            None => return Err(err("missing `status`")),
        };
        self.observations = observations;
        self.warm = warm;
        self.status = status;
        self.model = None;
        Ok(())
    }

    fn posterior(&self, center: &[f64], step: usize, points: usize) -> Option<Posterior> {
        let k = center.len();
        if k == 0 || points == 0 {
            return None;
        }
        let center = clamp_unit(center);
        if self.dims() != Some(k) {
            return None;
        }
        let owned;
        let model: &Model = match (&self.model, &self.status) {
            (Some((mk, m)), Status::Fitted(_)) if *mk == k => m,
            _ => {
                owned = self.model_for_report(k)?;
                &owned
            }
        };
        let grid: Vec<f64> = if points == 1 {
            vec![0.5]
        } else {
            (0..points)
                .map(|i| i as f64 / (points - 1) as f64)
                .collect()
        };
        let t = self.time_input(step);
        let mut dims = Vec::with_capacity(k);
        for dim in 0..k {
            let mut x = Array2::zeros((points, k + 1));
            for (i, g) in grid.iter().enumerate() {
                for j in 0..k {
                    x[[i, j]] = if j == dim { *g } else { center[j] };
                }
                x[[i, k]] = t;
            }
            let preds = self.predict(model, &x);
            if preds.iter().any(|(p, s)| !p.is_finite() || !s.is_finite()) {
                return None;
            }
            dims.push(PosteriorSlice {
                dim,
                grid: grid.clone(),
                mean_acc: preds.iter().map(|p| p.0).collect(),
                sd_acc: preds.iter().map(|p| p.1).collect(),
            });
        }
        Some(Posterior {
            step,
            dims,
            target: Some(self.config.target),
            observations: self.observations.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlany_framework::adapt::{Threshold, accept, direction};

    const BAND: (f64, f64) = (0.2, 0.8);
    const G: usize = 8;

    fn true_acc(d: &[f64]) -> f64 {
        let m = d.iter().sum::<f64>() / d.len() as f64;
        sigmoid(6.0 * (0.6 - m))
    }

    fn measure(d: &[f64], rng: &mut Rng) -> f64 {
        let p = true_acc(d);
        (0..G).filter(|_| rng.bernoulli(p)).count() as f64 / G as f64
    }

    fn in_target_band(d: &[f64]) -> bool {
        (true_acc(d) - 0.5).abs() <= 0.15
    }

    /// The adaptation loop of framework/METHOD.md for one slot starting at d = [0, 0]; returns the number
    /// of proposals made until the slot's (true) accuracy is in the target band, if reached
    /// within `max_steps` training steps.
    fn simulate(proposer: &mut dyn Proposer, seed: u64, max_steps: usize) -> Option<usize> {
        let mut env_rng = Rng::derive(seed, "env");
        let mut rng = Rng::derive(seed, "propose");
        let mut current = vec![0.0, 0.0];
        let mut proposals = 0;
        let fb = CriticFeedback::default();
        let mut step = 0;
        while step < max_steps {
            if in_target_band(&current) {
                return Some(proposals);
            }
            let acc = measure(&current, &mut env_rng);
            proposer.observe(Observation {
                difficulty: current.clone(),
                step,
                acc,
                group_size: G,
            });
            if let Some(dir) = direction(acc, BAND) {
                let new = proposer.propose(&current, acc, dir, &fb, step, &mut rng);
                proposals += 1;
                // The pending proposal is rolled out at the next step.
                step += 1;
                let new_acc = measure(&new, &mut env_rng);
                proposer.observe(Observation {
                    difficulty: new.clone(),
                    step,
                    acc: new_acc,
                    group_size: G,
                });
                if accept(dir, acc, new_acc, BAND) {
                    current = new;
                }
            } else {
                step += 1;
            }
        }
        in_target_band(&current).then_some(proposals)
    }

    fn gp_config() -> GpSpec {
        GpSpec::default()
    }

    #[test]
    fn gp_reaches_target_band_faster_than_threshold() {
        let seeds = 10u64;
        let max_steps = 60;
        let (mut gp_total, mut th_total) = (0usize, 0usize);
        let mut gp_counts = Vec::new();
        let mut th_counts = Vec::new();
        let started = std::time::Instant::now();
        for seed in 0..seeds {
            let mut gp = Gp::new(gp_config(), 100);
            let g = simulate(&mut gp, seed, max_steps);
            let mut th = Threshold { step: 0.1 };
            let t = simulate(&mut th, seed, max_steps);
            // Unreached counts as one more than the most proposals possible.
            let g = g.unwrap_or(max_steps + 1);
            let t = t.unwrap_or(max_steps + 1);
            gp_counts.push(g);
            th_counts.push(t);
            gp_total += g;
            th_total += t;
        }
        let gp_mean = gp_total as f64 / seeds as f64;
        let th_mean = th_total as f64 / seeds as f64;
        eprintln!(
            "proposals to reach |acc-0.5|<=0.15: gp {gp_counts:?} (mean {gp_mean:.2}), \
             threshold(0.1) {th_counts:?} (mean {th_mean:.2}); {:.2?}",
            started.elapsed()
        );
        assert!(
            gp_counts.iter().all(|&c| c <= 6),
            "gp needed more than 6 proposals: {gp_counts:?}"
        );
        assert!(gp_mean < th_mean, "gp {gp_mean} vs threshold {th_mean}");
    }

    #[test]
    fn gp_ucb_reaches_target_band() {
        let mut counts = Vec::new();
        for seed in 0..5u64 {
            let mut gp = Gp::new(
                GpSpec {
                    acquisition: Acquisition::Ucb { beta: 2.0 },
                    ..gp_config()
                },
                100,
            );
            counts.push(simulate(&mut gp, 100 + seed, 60).unwrap_or(61));
        }
        eprintln!("gp ucb proposals: {counts:?}");
        assert!(counts.iter().all(|&c| c <= 8), "{counts:?}");
    }

    /// A Gp with some history on the synthetic function (several difficulties, 12 steps).
    fn trained_gp(seed: u64) -> (Gp, Rng) {
        let mut gp = Gp::new(gp_config(), 100);
        let mut env = Rng::derive(seed, "env");
        for step in 0..12 {
            let d = vec![step as f64 / 11.0, (step % 4) as f64 / 3.0];
            let acc = measure(&d, &mut env);
            gp.observe(Observation {
                difficulty: d,
                step,
                acc,
                group_size: G,
            });
        }
        (gp, Rng::derive(seed, "propose"))
    }

    #[test]
    fn gp_state_round_trip_gives_identical_proposals() {
        let fb = CriticFeedback::default();
        // Stale state (observations, no fit yet) and fitted state (after a proposal).
        let (mut a, mut rng_a) = trained_gp(3);
        for round in 0..2 {
            let json = serde_json::to_string(&a.state()).expect("serialise");
            let mut b = Gp::new(gp_config(), 100);
            b.load_state(serde_json::from_str(&json).expect("parse"))
                .expect("load");
            let mut rng_b = rng_a.clone();
            for step in 12..15 {
                let pa = a.propose(&[0.2, 0.1], 0.9, Direction::Harder, &fb, step, &mut rng_a);
                let pb = b.propose(&[0.2, 0.1], 0.9, Direction::Harder, &fb, step, &mut rng_b);
                assert_eq!(pa, pb, "round {round} step {step}");
                assert_eq!(a.theta(), b.theta());
                let pa = a.propose(&[0.9, 0.8], 0.1, Direction::Easier, &fb, step, &mut rng_a);
                let pb = b.propose(&[0.9, 0.8], 0.1, Direction::Easier, &fb, step, &mut rng_b);
                assert_eq!(pa, pb, "round {round} step {step}");
            }
            assert_eq!(rng_a, rng_b);
            assert!(a.theta().is_some(), "the model was fitted");
            assert_eq!(a.state(), b.state());
        }
        assert!(Gp::new(gp_config(), 100).load_state(Value::Null).is_err());
    }

    #[test]
    fn gp_posterior_is_finite_and_decreasing_in_difficulty() {
        let (gp, _) = trained_gp(5);
        // Richer data for a clear slope: a grid of difficulties.
        let mut gp = gp;
        let mut env = Rng::derive(5, "grid");
        for i in 0..5 {
            for j in 0..5 {
                let d = vec![i as f64 / 4.0, j as f64 / 4.0];
                let acc = measure(&d, &mut env);
                gp.observe(Observation {
                    difficulty: d,
                    step: 12,
                    acc,
                    group_size: G,
                });
            }
        }
        let post = gp.posterior(&[0.5, 0.5], 12, 6).expect("posterior");
        assert_eq!(post.dims.len(), 2);
        for s in &post.dims {
            assert_eq!(s.grid.len(), 6);
            assert!(
                s.mean_acc
                    .iter()
                    .all(|p| p.is_finite() && (0.0..=1.0).contains(p))
            );
            assert!(s.sd_acc.iter().all(|v| v.is_finite() && *v >= 0.0));
            let first = s.mean_acc[0];
            let last = s.mean_acc[5];
            assert!(
                first > last + 0.2,
                "dim {}: mean not decreasing: {:?}",
                s.dim,
                s.mean_acc
            );
            for w in s.mean_acc.windows(2) {
                assert!(w[1] < w[0] + 0.05, "dim {}: {:?}", s.dim, s.mean_acc);
            }
        }
        // No model yet: no posterior; no panic on degenerate input.
        let empty = Gp::new(gp_config(), 100);
        assert!(empty.posterior(&[0.5, 0.5], 0, 5).is_none());
    }

    #[test]
    fn gp_falls_back_without_data_and_never_panics() {
        let fb = CriticFeedback::default();
        let mut rng = Rng::new(9);
        let mut gp = Gp::new(gp_config(), 100);
        let d = gp.propose(&[0.3, 0.3], 1.0, Direction::Harder, &fb, 0, &mut rng);
        assert!((d[0] - 0.4).abs() < 1e-12 && (d[1] - 0.4).abs() < 1e-12);
        // Same difficulty observed many times: fewer than 2 distinct points -> fallback.
        for s in 0..5 {
            gp.observe(Observation {
                difficulty: vec![0.3, 0.3],
                step: s,
                acc: 1.0,
                group_size: G,
            });
        }
        let d = gp.propose(&[0.3, 0.3], 0.0, Direction::Easier, &fb, 5, &mut rng);
        assert!((d[0] - 0.2).abs() < 1e-12 && (d[1] - 0.2).abs() < 1e-12);
        // Garbage in: NaN accuracy observations are dropped, NaN acc falls back.
        gp.observe(Observation {
            difficulty: vec![f64::NAN, 0.1],
            step: 6,
            acc: 0.5,
            group_size: 0,
        });
        gp.observe(Observation {
            difficulty: vec![0.9, 0.9],
            step: 6,
            acc: f64::NAN,
            group_size: 0,
        });
        assert_eq!(gp.observations().len(), 5);
        let d = gp.propose(&[0.3, 0.3], f64::NAN, Direction::Easier, &fb, 6, &mut rng);
        assert_eq!(d.len(), 2);
        // Mismatched dimensionality: fallback, no panic.
        let d = gp.propose(&[0.5], 1.0, Direction::Harder, &fb, 7, &mut rng);
        assert!((d[0] - 0.6).abs() < 1e-12);
        // Critic feedback restricts the fallback move to the flagged dimension.
        let fb1 = CriticFeedback {
            blame: vec![0.0, 1.0],
            flagged_steps: 1,
            steps: 3,
        };
        let d = Gp::new(gp_config(), 100).propose(
            &[0.5, 0.5],
            1.0,
            Direction::Harder,
            &fb1,
            0,
            &mut rng,
        );
        assert_eq!(d, vec![0.5, 0.6]);
    }
}
