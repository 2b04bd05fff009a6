//! The `Gp` proposer (framework/METHOD.md step 7): a Gaussian-process surrogate of the policy's
//! accuracy over (difficulty vector, training step), on egobox-gp.
//!
//! **Data and window.** Every observed group (G rollouts of one task at one difficulty) is
//! stored for [`GpSpec::window`] training steps: once an observation of step `s` arrives, those
//! older than `s − window` are dropped. A fit pools the stored observations of the same
//! (bitwise-equal) difficulty: successes and trials are added, and the time input is the
//! trial-weighted mean step, normalised, `t = step / total_steps` (so a slot that stays at one
//! difficulty gives one point resting on many rollouts, not many points of 8). Beyond
//! [`GpSpec::max_points`] pooled points, the difficulties observed least recently are left
//! out (cost). The target of a pooled point with `s` successes in `n` trials is the empirical
//! logit `ln((s + ½) / (n − s + ½))`.
//!
//! **Model.** egobox Kriging with a Matérn-5/2 correlation on inputs `(d, t)`. The mean is a
//! fixed prior trend `−prior_slope · mean(d)` (harder is harder; it carries the first moves,
//! when the data cannot) plus a linear part fitted by egobox's generalised least squares: a
//! constant and, when the pooled points have at least 3 distinct mean steps, a slope in time
//! (the policy improves), and either no slope in difficulty, one slope along `Σ_j d_j`, or one
//! per dimension, whichever has the highest BIC (profile log-likelihood − ½·ln(n) per
//! coefficient; a richer trend also needs two points per coefficient). Its uncertainty enters
//! the predictive variance. The correlation lengths of the difficulty dims are fitted by
//! maximum likelihood within 0.2 to 10 difficulty units; the one along `t` is fixed at
//! [`GpSpec::time_scale`] (egobox standardises its inputs, so the theta it is given is the
//! column's sd over the length).
//!
//! **Noise.** A target resting on `n` trials has the binomial variance `v = 1/(s + ½) +
//! 1/(n − s + ½)` (Gart), from about 0.03 for a slot observed for 20 steps to 0.4–2 for a
//! single group. egobox has one nugget for all rows, so the weights `w = 1/v` are given by
//! replication: pooled point `i` enters the fit as `c_i = max(1, round(w_i / u))` identical
//! rows, one row standing for `u = max(min_i w_i, Σ_i w_i / 128)` of weight. With the nugget
//! `ν` (noise of a row over the process variance σ²), `c` identical rows are, for the
//! posterior, exactly one point with noise `σ²ν / c` (sufficient statistic), so the model is
//! the heteroscedastic GP with noise `λ · v_i`, `λ = σ²νu`: binomial noise times a fitted
//! dispersion that takes up what is not binomial (tasks of one difficulty differ; the policy
//! drifts). Approximation: when the 128-row budget binds, points lighter than one unit still
//! get one row (they are weighed as if less noisy). The replication is undone where egobox
//! sees it: its maximum-likelihood σ² divides the quadratic form by the `N` rows instead of
//! the `n` points, so predictive variances are multiplied by `N / (n − p)` (`p` mean
//! coefficients); and its likelihood is converted to the pooled points' with
//! `|K_N + νI_N| = ν^(N−n) · Π c_i · |K_n + ν C⁻¹|` (a test checks both).
//!
//! **Nugget.** ν is chosen from [`GpSpec::nuggets`] by that profile log-likelihood of the
//! pooled points, among the values whose dispersion λ is at least 0.25 (binomial noise is a
//! floor; Gart's variance overstates it several-fold at 0 or all successes, hence the
//! margin): the whole grid at a first fit, then a hill-climb on the grid from the previous
//! value (2–3 fits). The top of the grid means "nothing beyond the trend": the GP part is
//! then negligible and the model is the linear trend with quasi-binomial noise.
//!
//! **Fit.** Observations mark the model stale; it is refitted at the next proposal (or
//! [`Gp::refresh`]), so at most once per training step: correlation lengths on the pooled
//! points (one row each, the previous nugget scaled to their mean weight, COBYLA warm-started
//! from the previous lengths; multistart only at a first fit), then the trend (at the
//! previous nugget), then the nugget, on the replicated rows with the lengths fixed. Measured
//! in release: about 6–8 ms with 8 slots and 10–16 ms with 16 slots (≤ 96 points, ≤ ~150
//! rows), 3 to 5 times that in the debug test build.
//!
//! **Predictive distribution of a group.** [`Gp::predictive`] gives the distribution of the
//! successes `k` of a fresh group of `g` rollouts: `k ~ Binomial(g, sigmoid(f + ε))` with the
//! posterior latent logit `f ~ N(μ, s²)` and the group's own effect `ε ~ N(0, τ²)`, `τ²` the
//! noise the model gives a one-group target beyond its binomial variance; the mixture is
//! integrated by quadrature. [`GroupPredictive::interval`] is the conservative central
//! interval (probability ≥ level; with 8 rollouts typically 97–99% for a 95% interval);
//! [`GroupPredictive::pit`] and [`GroupPredictive::covers_randomised`] are the randomised
//! versions whose hit rate is exactly the level under a correct model (calibration checks).
//!
//! **Proposals.** Candidates lie in the trust region: within [`GpSpec::trust_radius`] (L∞)
//! of the slot's current difficulty, on the side of the move (every coordinate ≥ the current
//! one for Harder, ≤ for Easier: difficulty is monotone), inside `[0,1]^k`. Half are uniform
//! there, half are uniform moves along the dimensions the critic flags (all if none), plus
//! the moves by ¼, ½, ¾ and all of the radius along them; all are evaluated at the current
//! step. Only candidates whose predicted accuracy `sigmoid(μ)` moves the right way (below the
//! slot's `acc` for Harder, above for Easier) are kept. [`Acquisition::Nearest`] takes the one
//! whose prediction is nearest `target` on the logit scale; when that one is within 0.4 of
//! it, any within 0.1 more count as ties and the smallest move wins. [`Acquisition::Ucb`]
//! takes the maximum of `p(1−p) + β·sd_p` among those predicted inside `band` (delta method:
//! `sd_p = p(1−p)·s`; Nearest when none is inside). With fewer than 2 pooled points, a failed
//! fit, a difficulty of another dimension, a NaN accuracy, or no candidate moving the right
//! way, it falls back to the [`Threshold`](rlany_contract::adapt::Threshold) move of 0.1.
//!
//! **Determinism and resume.** A fit is a pure function of (observations, warm start):
//! egobox's multistart points come from a fixed LHS seed when `n_start > 1` (from entropy when
//! `n_start == 1`, so 1 is raised to 2), COBYLA is deterministic, and its parallel reduction
//! keeps the leftmost best. [`Proposer::state`] stores the observations, the warm start
//! (lengths and nugget) and the fitted model's spec (theta, nugget, trend), floats as exact
//! bit patterns; [`Proposer::load_state`] rebuilds the identical model, so a resumed run
//! makes identical proposals. A state of the earlier format (`gp-v1`) loads its observations
//! and refits.
//!
//! **Limits.** The binomial likelihood is approximated by a Gaussian on the empirical logit.
//! At 0 or all successes that logit is compressed and grows with the trials (8/8 gives 2.8,
//! 40/40 gives 4.4), so the model is least reliable where proposals start (slots far too easy
//! or too hard); there the prior trend and the trust region carry the moves.

use egobox_gp::correlation_models::Matern52Corr;
use egobox_gp::mean_models::RegressionModel;
use egobox_gp::{GaussianProcess, ThetaTuning};
use linfa::prelude::{Dataset, Fit};
use ndarray::{Array1, Array2, ArrayBase, Axis, Data as NdData, Ix1, Ix2};
use rlany_contract::Rng;
use rlany_contract::adapt::{
    AdaptError, CriticFeedback, Direction, Observation, Posterior, PosteriorSlice, ProposalRequest,
    Proposer, clamp_unit, threshold_move,
};
use rlany_contract::check::{self, Checked, FieldError};
use rlany_contract::plugin::{ProposerContext, ProposerPlugin};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// How the GP proposer picks among candidates that move the right way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// How long an observation stays in the model, in training steps: once an observation of
    /// step `s_new` has arrived, those with `step < s_new − window` are dropped.
    pub window: usize,
    /// Cap on the pooled points (distinct difficulties) of one fit, for cost: beyond it the
    /// difficulties observed least recently are left out of the fit.
    pub max_points: usize,
    /// Trust region: candidates lie within this L∞ distance of the slot's current difficulty.
    pub trust_radius: f64,
    /// The nugget grid (noise variance of one replicated row as a fraction of the process
    /// variance, see the module docs): each fit takes the value of highest marginal
    /// likelihood. A single value fixes the nugget.
    pub nuggets: Vec<f64>,
    /// Correlation length along the normalised step `step / total_steps` (fixed, not fitted):
    /// how fast the GP part forgets within the window (the trend's time slope is fitted).
    /// Non-positive or non-finite: effectively no fading (1e6).
    pub time_scale: f64,
    /// Prior trend of the GP mean, `−prior_slope · mean(d)` on the logit scale; the fitted
    /// trend and the GP model what it leaves. 0: no prior trend. See the module docs.
    pub prior_slope: f64,
    /// Extra multistart points of egobox's correlation-length optimisation at a first fit
    /// (later fits start from the previous lengths only); 1 is raised to 2 because egobox
    /// seeds a single extra start from entropy.
    pub n_start: usize,
}

impl Default for GpSpec {
    fn default() -> Self {
        Self {
            target: 0.5,
            band: (0.2, 0.8),
            acquisition: Acquisition::Nearest,
            candidates: 256,
            window: 20,
            max_points: 96,
            trust_radius: 0.2,
            nuggets: DEFAULT_NUGGETS.to_vec(),
            time_scale: 0.25,
            prior_slope: 4.0,
            n_start: 2,
        }
    }
}

/// The default nugget grid (see [`GpSpec::nuggets`]).
const DEFAULT_NUGGETS: [f64; 10] = [1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0];
/// Bounds of a nugget of the grid.
const NUGGET_BOUNDS: (f64, f64) = (1e-8, 1e3);

impl ProposerPlugin for GpSpec {
    fn validate(&self) -> Checked {
        check::real("target", self.target, 0.0, 1.0)?;
        check::band("band", self.band)?;
        check::count("candidates", self.candidates, 1, 1 << 16)?;
        check::count("window", self.window, 1, 1_000_000)?;
        check::count("max_points", self.max_points, 3, 1_000)?;
        check::positive("trust_radius", self.trust_radius, 1.0)?;
        if let Acquisition::Ucb { beta } = self.acquisition {
            check::real("acquisition.beta", beta, 0.0, 1e3)?;
        }
        if self.nuggets.is_empty() || self.nuggets.len() > 32 {
            return Err(FieldError::new(
                "nuggets",
                format!("must hold 1 to 32 values (got {})", self.nuggets.len()),
            ));
        }
        for &nu in &self.nuggets {
            check::real("nuggets", nu, NUGGET_BOUNDS.0, NUGGET_BOUNDS.1)?;
        }
        check::real("time_scale", self.time_scale, 0.0, 1e6)?;
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
/// When the best candidate's |logit p − logit target| is at most [`REACH_TOL`], candidates
/// within this of it count as ties (the one closest to the current difficulty wins).
const NEAREST_TOL: f64 = 0.1;
/// See [`NEAREST_TOL`] (0.4 on the logit scale: p within about ±0.1 of ½).
const REACH_TOL: f64 = 0.4;
/// Initial inverse correlation length of the difficulty dims (in difficulty units).
const INV_LENGTH_INIT: f64 = 1.0;
/// Bounds of the fitted inverse correlation lengths of the difficulty dims (in difficulty
/// units): correlation lengths from 0.2 to 10.
const INV_LENGTH_BOUNDS: (f64, f64) = (0.1, 5.0);
/// Least fitted noise of a target, relative to its binomial variance (Gart's estimate, which
/// overstates the variance of the empirical logit at 0 or all successes several-fold): a
/// nugget that fits less noise is only taken when no nugget of the grid fits enough.
const MIN_DISPERSION: f64 = 0.25;
/// Cap on the replicated rows of one fit (see the module docs, "Noise").
const ROW_BUDGET: usize = 128;
/// Hard cap on stored observations (whatever the window), oldest dropped first.
const MAX_STORED: usize = 20_000;
/// Largest group size [`Gp::predictive`] answers for.
const MAX_GROUP: usize = 100_000;
/// Nodes of the quadrature over the latent logit in [`Gp::predictive`].
const QUAD_NODES: usize = 81;
/// Half-width (in standard deviations) of that quadrature.
const QUAD_HALF_WIDTH: f64 = 6.0;

mod fit;
mod predictive;
mod proposal;
mod trend;

pub use predictive::GroupPredictive;
use predictive::*;
use trend::*;

/// Where the model stands with respect to the stored observations.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    /// Observations arrived since the last fit (or none yet).
    Stale,
    /// The fit on the current observations failed (or there were too few of them).
    Failed,
    /// The model for the current observations.
    Fitted(Spec),
}

/// What fixes a model given the observations.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    /// egobox's correlation parameters on the replicated rows (difficulty dims, then time).
    theta: Vec<f64>,
    /// The nugget chosen from the grid.
    nugget: f64,
    /// The fitted linear part of the mean.
    trend: Trend,
}

/// A fitted model with what predictions need besides egobox's own output.
struct Fitted {
    /// Number of difficulty dimensions.
    k: usize,
    model: Model,
    /// egobox's variance estimate divides by the replicated rows `N`; the pooled points `n`
    /// are the real data: predictive variances are multiplied by `N / max(n − p, 1)` (`p`
    /// mean coefficients).
    var_factor: f64,
    /// Fitted noise of a pooled point over its binomial variance (quasi-binomial dispersion)
    /// for points of at least one unit of weight.
    dispersion: f64,
    /// Fitted noise variance of one copy (logit units).
    copy_noise: f64,
    /// Weight one copy stands for.
    unit: f64,
    /// Number of coefficients of the mean.
    coefs: usize,
    /// Mean group size of the observations behind the fit.
    group: f64,
}

/// Gaussian-process proposer (see the module docs).
pub struct Gp {
    config: GpSpec,
    /// Training steps of the run (normalises the step input).
    total_steps: usize,
    observations: Vec<Observation>,
    /// Warm start of the next fit: the inverse correlation lengths of the difficulty dims (in
    /// difficulty units) and the nugget of the last successful fit.
    warm: Option<(Vec<f64>, f64)>,
    status: Status,
    /// Cache of the model for `status == Fitted` (rebuilt from its spec after a resume).
    model: Option<Fitted>,
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

    /// The stored observations (those inside the window), oldest first.
    pub fn observations(&self) -> &[Observation] {
        &self.observations
    }

    /// The correlation parameters of the current fit (egobox's, on its standardised inputs:
    /// difficulty dims, then time), if any.
    pub fn theta(&self) -> Option<&[f64]> {
        match &self.status {
            Status::Fitted(spec) => Some(&spec.theta),
            _ => None,
        }
    }

    /// The nugget the current fit chose from [`GpSpec::nuggets`], if any.
    pub fn nugget(&self) -> Option<f64> {
        match &self.status {
            Status::Fitted(spec) => Some(spec.nugget),
            _ => None,
        }
    }

    /// The fitted quasi-binomial dispersion of the cached model (noise of a pooled point over
    /// its binomial variance; ≈ 1 for purely binomial data), if a model is cached.
    pub fn dispersion(&self) -> Option<f64> {
        self.model.as_ref().map(|m| m.dispersion)
    }

    /// Fit the model now if the observations changed since the last fit. `true` when a model
    /// is available afterwards.
    pub fn refresh(&mut self) -> bool {
        match self.dims() {
            Some(k) if k > 0 => self.ensure_model(k).is_some(),
            _ => false,
        }
    }

    /// The predictive distribution of the outcome of a fresh group of `group_size` rollouts
    /// at each of `difficulties` at training step `step` (latent uncertainty, the group's own
    /// effect, binomial noise; see [`GroupPredictive`]). Uses the cached model, or fits one
    /// for the occasion (call [`Gp::refresh`] first to keep it). `None` without a model, for a
    /// difficulty of the wrong dimension or with a non-finite coordinate, or for a group size
    /// of 0 or above 100 000.
    pub fn predictive(
        &self,
        difficulties: &[Vec<f64>],
        step: usize,
        group_size: usize,
    ) -> Option<Vec<GroupPredictive>> {
        let k = self.dims()?;
        if k == 0 || group_size == 0 || group_size > MAX_GROUP {
            return None;
        }
        if difficulties.is_empty() {
            return Some(Vec::new());
        }
        if difficulties
            .iter()
            .any(|d| d.len() != k || d.iter().any(|v| !v.is_finite()))
        {
            return None;
        }
        let x = self.inputs(difficulties, step);
        self.with_model(k, |fitted| {
            self.latent(fitted, &x)
                .into_iter()
                .map(|(mu, sd)| {
                    if !mu.is_finite() || !sd.is_finite() {
                        return None;
                    }
                    let group_sd = fitted.group_sd(sigmoid(mu));
                    let total_sd = (sd * sd + group_sd * group_sd).sqrt();
                    Some(GroupPredictive {
                        group_size,
                        logit_mean: mu,
                        logit_sd: sd,
                        group_sd,
                        pmf: group_pmf(mu, total_sd, group_size),
                    })
                })
                .collect()
        })
    }
}

impl Fitted {
    /// Standard deviation of one fresh group's own logit effect at accuracy `p`: the noise
    /// the model gives a target resting on one group (the copy noise over its copies, as
    /// [`Gp::data`] would weigh it, at least one) beyond that group's binomial variance.
    fn group_sd(&self, p: f64) -> f64 {
        if !p.is_finite() {
            return 0.0;
        }
        let g = self.group.max(1.0);
        let v = empirical_logit_var(g * p, g);
        let copies = (1.0 / (v * self.unit)).max(1.0);
        let excess = self.copy_noise / copies - v;
        if excess.is_finite() && excess > 0.0 {
            excess.sqrt()
        } else {
            0.0
        }
    }
}

/// The GP's state in a checkpoint, by serde (serde_json's `float_roundtrip` writes every
/// `f64` so that it reads back bit for bit): the observations, the last fit's
/// hyper-parameters the next fit starts from, and the fit's status. `config` and
/// `total_steps` are written for a reader; on resume the experiment's own are used.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedState {
    format: String,
    config: Value,
    total_steps: usize,
    observations: Vec<Observation>,
    warm: Option<(Vec<f64>, f64)>,
    status: SavedStatus,
}

/// [`Status`] as saved.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum SavedStatus {
    Stale,
    Failed,
    Fitted {
        theta: Vec<f64>,
        nugget: f64,
        trend: String,
    },
}

/// The `format` of a saved state this version writes and reads (`gp-v2`, floats as bit
/// patterns, and the first format were written before 2026-12-06 and are refused by name).
const STATE_FORMAT: &str = "gp-v3";

impl Proposer for Gp {
    fn observe(&mut self, obs: Observation) {
        if !obs.acc.is_finite()
            || obs.group_size == 0
            || obs.difficulty.iter().any(|x| !x.is_finite())
        {
            return;
        }
        self.observations.push(obs);
        self.prune();
        self.status = Status::Stale;
        self.model = None;
    }

    fn propose(&mut self, request: &ProposalRequest<'_>, rng: &mut Rng) -> Vec<f64> {
        let ProposalRequest {
            current,
            acc,
            direction,
            feedback,
            step,
        } = *request;
        let k = current.len();
        let current = clamp_unit(current);
        let fallback = threshold_move(&current, direction, feedback, FALLBACK_STEP);
        if k == 0 || acc.is_nan() || self.dims() != Some(k) {
            return fallback;
        }
        // Draw the candidates first so the rng advances the same way whatever the model does.
        let cands = self.candidates(&current, direction, feedback, rng);
        if self.ensure_model(k).is_none() {
            return fallback;
        }
        let Some(fitted) = self.model.as_ref() else {
            return fallback;
        };
        let x = self.inputs(&cands, step);
        let preds = self.predict(fitted, &x);
        match self.select(&current, acc, direction, &cands, &preds) {
            Some(i) => cands[i].clone(),
            None => fallback,
        }
    }

    fn state(&self) -> Value {
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        let status = match &self.status {
            Status::Stale => SavedStatus::Stale,
            Status::Failed => SavedStatus::Failed,
            // JSON has no NaN: a fit with non-finite hyper-parameters is saved as stale (the
            // resumed run refits it from the same observations).
            Status::Fitted(spec) if !finite(&spec.theta) || !spec.nugget.is_finite() => {
                SavedStatus::Stale
            }
            Status::Fitted(spec) => SavedStatus::Fitted {
                theta: spec.theta.clone(),
                nugget: spec.nugget,
                trend: spec.trend.name().to_string(),
            },
        };
        let warm = self
            .warm
            .clone()
            .filter(|(lengths, nugget)| finite(lengths) && nugget.is_finite());
        let saved = SavedState {
            format: STATE_FORMAT.to_string(),
            config: serde_json::to_value(&self.config).unwrap_or(Value::Null),
            total_steps: self.total_steps,
            observations: self.observations.clone(),
            warm,
            status,
        };
        serde_json::to_value(&saved).unwrap_or(Value::Null)
    }

    fn load_state(&mut self, state: Value) -> Result<(), AdaptError> {
        let err = |r: String| AdaptError::state("gp", r);
        match state.get("format").and_then(Value::as_str) {
            Some(STATE_FORMAT) => {}
            Some(other) => {
                return Err(err(format!(
                    "the checkpoint's GP state is of format {other:?}, written by an older rlany; \
                     this version reads {STATE_FORMAT:?} (resume with the version that wrote it, \
                     or start the run again)"
                )));
            }
            None => return Err(err("the state names no `format`".into())),
        }
        let saved: SavedState = serde_json::from_value(state).map_err(|e| err(e.to_string()))?;
        let status = match saved.status {
            SavedStatus::Stale => Status::Stale,
            SavedStatus::Failed => Status::Failed,
            SavedStatus::Fitted {
                theta,
                nugget,
                trend,
            } => Status::Fitted(Spec {
                theta,
                nugget,
                trend: Trend::from_name(&trend)
                    .ok_or_else(|| err(format!("unknown trend {trend:?}")))?,
            }),
        };
        self.observations = saved.observations;
        self.warm = saved.warm;
        self.status = status;
        self.model = None;
        let before = self.observations.len();
        self.prune();
        if self.observations.len() != before {
            // The window of this config is shorter than the saved one's: refit.
            self.status = Status::Stale;
        }
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
        let grid: Vec<f64> = if points == 1 {
            vec![0.5]
        } else {
            (0..points)
                .map(|i| i as f64 / (points - 1) as f64)
                .collect()
        };
        let dims = self.with_model(k, |fitted| {
            let mut dims = Vec::with_capacity(k);
            for dim in 0..k {
                let rows: Vec<Vec<f64>> = grid
                    .iter()
                    .map(|g| {
                        let mut d = center.clone();
                        d[dim] = *g;
                        d
                    })
                    .collect();
                let preds = self.predict(fitted, &self.inputs(&rows, step));
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
            Some(dims)
        })?;
        Some(Posterior {
            step,
            dims,
            target: Some(self.config.target),
            observations: self.observations.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
