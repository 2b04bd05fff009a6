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
//! way, it falls back to the [`Threshold`](rlany_framework::adapt::Threshold) move of 0.1.
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
use rlany_framework::Rng;
use rlany_framework::adapt::{
    AdaptError, CriticFeedback, Direction, Observation, Posterior, PosteriorSlice, Proposer,
    clamp_unit, threshold_move,
};
use rlany_framework::check::{self, Checked, FieldError};
use rlany_framework::plugin::{ProposerContext, ProposerPlugin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
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

/// Most difficulty dimensions a fitted trend handles (beyond: the prior trend only).
const MAX_TREND_DIMS: usize = 16;

/// The linear part of the GP mean in difficulty (on top of the fixed prior trend), fitted by
/// egobox's generalised least squares together with the GP. Every trend also gets a slope in
/// time when the pooled points have at least 3 distinct mean steps ([`TrendMean`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Trend {
    /// A constant: the prior trend alone gives the dependence on difficulty.
    #[default]
    Prior,
    /// A constant and a slope along the summed difficulty `Σ_j d_j`.
    Sum,
    /// A constant and one slope per difficulty dimension.
    Full,
}

impl Trend {
    const ALL: [Trend; 3] = [Trend::Prior, Trend::Sum, Trend::Full];

    fn name(self) -> &'static str {
        match self {
            Trend::Prior => "prior",
            Trend::Sum => "sum",
            Trend::Full => "full",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Trend::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Number of mean coefficients with `k` difficulty dims, without the time slope.
    fn len(self, k: usize) -> usize {
        match self {
            Trend::Prior => 1,
            Trend::Sum => 2,
            Trend::Full => k + 1,
        }
    }

    /// Whether `points` pooled points at the difficulties `x` (rows: difficulty columns,
    /// then time) can support the trend: at least two points per coefficient, spread along
    /// the summed difficulty (for [`Trend::Sum`]); egobox itself rejects a singular design.
    fn fits(self, x: &Array2<f64>, k: usize, points: usize) -> bool {
        match self {
            Trend::Prior => true,
            _ if k == 0 || k > MAX_TREND_DIMS || points < 2 * self.len(k) => false,
            Trend::Sum => {
                let mut sums: Vec<f64> = x
                    .rows()
                    .into_iter()
                    .map(|r| r.iter().take(k).sum())
                    .collect();
                sums.sort_by(f64::total_cmp);
                sums.dedup_by(|a, b| (*a - *b).abs() <= 1e-9);
                sums.len() >= 3
            }
            Trend::Full => true,
        }
    }
}

/// The mean of the GP as egobox sees it ([`Trend`]). egobox hands the mean its standardised
/// inputs `(d_j − mean_j) / scale_j`; `scale` undoes that, so that [`Trend::Sum`] follows the
/// plain sum of the difficulties.
#[derive(Clone, Copy, Debug, Default)]
struct TrendMean {
    trend: Trend,
    /// Whether the mean has a slope in time (the input column after the difficulties).
    time: bool,
    dims: usize,
    scale: [f64; MAX_TREND_DIMS],
}

impl std::fmt::Display for TrendMean {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrendMean({})", self.trend.name())
    }
}

impl TrendMean {
    /// The mean `trend` for the rows `x` (difficulty columns, then time; `k` difficulty
    /// dims), with a time slope when `x` has at least 3 distinct times; the constant alone
    /// when `k` is out of range.
    fn new(x: &Array2<f64>, k: usize, trend: Trend) -> Self {
        let mut mean = Self::default();
        if k > MAX_TREND_DIMS || x.ncols() != k + 1 {
            return mean;
        }
        for (j, s) in col_std(x).iter().take(k).enumerate() {
            mean.scale[j] = *s;
        }
        mean.trend = if k == 0 { Trend::Prior } else { trend };
        mean.dims = k;
        let mut times: Vec<f64> = x.column(k).to_vec();
        times.sort_by(f64::total_cmp);
        times.dedup_by(|a, b| (*a - *b).abs() <= 1e-12);
        mean.time = times.len() >= 3;
        mean
    }

    /// Number of mean coefficients.
    fn len(&self) -> usize {
        self.trend.len(self.dims) + usize::from(self.time)
    }
}

impl RegressionModel<f64> for TrendMean {
    fn coefs(&self, x: &ArrayBase<impl NdData<Elem = f64>, Ix2>) -> Array2<f64> {
        let mut f = Array2::ones((x.nrows(), self.len()));
        let dims = self.dims.min(x.ncols());
        for (i, row) in x.rows().into_iter().enumerate() {
            match self.trend {
                Trend::Prior => {}
                Trend::Sum => f[[i, 1]] = (0..dims).map(|j| row[j] * self.scale[j]).sum(),
                Trend::Full => {
                    for j in 0..dims {
                        f[[i, j + 1]] = row[j] * self.scale[j];
                    }
                }
            }
            if self.time {
                f[[i, self.len() - 1]] = row.get(dims).copied().unwrap_or(0.0);
            }
        }
        f
    }

    fn jac(&self, x: &ArrayBase<impl NdData<Elem = f64>, Ix1>) -> Array2<f64> {
        let mut jac = Array2::zeros((self.len(), x.len()));
        let dims = self.dims.min(x.len());
        for j in 0..dims {
            match self.trend {
                Trend::Prior => {}
                Trend::Sum => jac[[1, j]] = self.scale[j],
                Trend::Full => jac[[j + 1, j]] = self.scale[j],
            }
        }
        if self.time && dims < x.len() {
            jac[[self.len() - 1, dims]] = 1.0;
        }
        jac
    }
}

type Model = GaussianProcess<f64, TrendMean, Matern52Corr>;

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

/// The predictive distribution of the outcome of a fresh group of `group_size` rollouts at one
/// difficulty and step ([`Gp::predictive`]): `k ~ Binomial(group_size, sigmoid(f + ε))` with
/// the latent logit `f ~ N(logit_mean, logit_sd²)` (the GP's posterior) and the group's own
/// effect `ε ~ N(0, group_sd²)` (the overdispersion the fitted nugget found beyond binomial
/// noise).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPredictive {
    /// Rollouts in the group.
    pub group_size: usize,
    /// Posterior mean of the latent logit accuracy.
    pub logit_mean: f64,
    /// Posterior standard deviation of the latent logit accuracy.
    pub logit_sd: f64,
    /// Standard deviation of a single group's own logit effect.
    pub group_sd: f64,
    /// `pmf[k]` = probability of `k` successes, `k = 0..=group_size` (sums to 1).
    pub pmf: Vec<f64>,
}

impl GroupPredictive {
    /// Expected success rate of the group.
    pub fn mean(&self) -> f64 {
        let g = self.group_size.max(1) as f64;
        self.pmf
            .iter()
            .enumerate()
            .map(|(k, p)| p * k as f64 / g)
            .sum()
    }

    /// `P(successes ≤ k)`.
    pub fn cdf(&self, k: usize) -> f64 {
        self.pmf
            .iter()
            .take(k.saturating_add(1))
            .sum::<f64>()
            .min(1.0)
    }

    /// Equal-tailed interval of the success *rate* with probability at least `level`: the
    /// `(1−level)/2` and `(1+level)/2` quantiles of the count, divided by the group size.
    /// Conservative (the count is discrete: the mass inside is `≥ level`). A NaN level is
    /// treated as 0.95.
    pub fn interval(&self, level: f64) -> (f64, f64) {
        let level = if level.is_nan() { 0.95 } else { level };
        let a = ((1.0 - level) / 2.0).clamp(0.0, 0.5);
        let g = self.group_size.max(1) as f64;
        let quantile = |q: f64| -> usize {
            let mut c = 0.0;
            for (k, p) in self.pmf.iter().enumerate() {
                c += p;
                // Tolerance for the rounding of the running sum.
                if c >= q - 1e-12 {
                    return k;
                }
            }
            self.group_size
        };
        let lo = if a <= 0.0 { 0 } else { quantile(a) };
        let hi = quantile(1.0 - a);
        (lo as f64 / g, hi as f64 / g)
    }

    /// Whether the observed rate `rate` lies in [`GroupPredictive::interval`]`(level)`.
    pub fn covers(&self, rate: f64, level: f64) -> bool {
        let (lo, hi) = self.interval(level);
        rate >= lo - 1e-12 && rate <= hi + 1e-12
    }

    /// Randomised probability integral transform of an observed count `successes` with
    /// `u ∈ [0, 1]` uniform: `P(K < successes) + u·P(K = successes)`. Uniform on `[0, 1]` when
    /// the predictive distribution is right, whatever its discreteness; `(1−level)/2 ≤ pit ≤
    /// (1+level)/2` is the randomised central interval of probability exactly `level`
    /// (calibration checks, see [`GroupPredictive::covers_randomised`]). Counts above the
    /// group size give 1.
    pub fn pit(&self, successes: usize, u: f64) -> f64 {
        let below = if successes == 0 {
            0.0
        } else {
            self.cdf(successes - 1)
        };
        let at = self.pmf.get(successes).copied().unwrap_or(0.0);
        let u = if u.is_finite() {
            u.clamp(0.0, 1.0)
        } else {
            0.5
        };
        (below + u * at).clamp(0.0, 1.0)
    }

    /// Whether `successes` lies in the randomised central interval of probability exactly
    /// `level` (`u` uniform on `[0, 1]`, see [`GroupPredictive::pit`]). Unlike
    /// [`GroupPredictive::covers`], whose interval holds at least `level` of the mass (for 8
    /// rollouts typically 97–99%), its hit rate is `level` under a correct model, so it can
    /// show intervals that are too wide as well as too narrow.
    pub fn covers_randomised(&self, successes: usize, level: f64, u: f64) -> bool {
        let level = if level.is_nan() {
            0.95
        } else {
            level.clamp(0.0, 1.0)
        };
        let a = (1.0 - level) / 2.0;
        let v = self.pit(successes, u);
        v >= a && v <= 1.0 - a
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)` without overflow.
fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// Empirical logit of `s` successes in `n` trials with the usual ½ continuity correction.
fn empirical_logit(s: f64, n: f64) -> f64 {
    ((s + 0.5) / (n - s + 0.5)).ln()
}

/// Variance of [`empirical_logit`] (Gart's estimate), i.e. the binomial noise of a target.
fn empirical_logit_var(s: f64, n: f64) -> f64 {
    1.0 / (s + 0.5) + 1.0 / (n - s + 0.5)
}

/// Column standard deviations (ddof 1, zero → 1): how egobox standardises its inputs.
fn col_std(x: &Array2<f64>) -> Vec<f64> {
    x.std_axis(Axis(0), 1.0)
        .iter()
        .map(|s| if s.is_finite() && *s > 0.0 { *s } else { 1.0 })
        .collect()
}

/// Sample standard deviation (ddof 1, zero → 1), as egobox standardises its targets.
fn vec_std(y: &Array1<f64>) -> f64 {
    let n = y.len() as f64;
    if n < 2.0 {
        return 1.0;
    }
    let mean = y.sum() / n;
    let var = y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    if var.is_finite() && var > 0.0 {
        var.sqrt()
    } else {
        1.0
    }
}

/// `P(k successes in g)` for `k = 0..=g` when the logit accuracy is `N(mu, sd²)`, by a
/// midpoint quadrature over ±6 sd.
fn group_pmf(mu: f64, sd: f64, g: usize) -> Vec<f64> {
    let mut ln_choose = vec![0.0; g + 1];
    for k in 1..=g {
        ln_choose[k] = ln_choose[k - 1] + ((g - k + 1) as f64).ln() - (k as f64).ln();
    }
    let nodes: Vec<(f64, f64)> = if sd > 1e-9 {
        (0..QUAD_NODES)
            .map(|i| {
                let z =
                    -QUAD_HALF_WIDTH + 2.0 * QUAD_HALF_WIDTH * i as f64 / (QUAD_NODES - 1) as f64;
                (mu + sd * z, (-0.5 * z * z).exp())
            })
            .collect()
    } else {
        vec![(mu, 1.0)]
    };
    let mut pmf = vec![0.0; g + 1];
    let mut total = 0.0;
    for (x, w) in nodes {
        let (lp, lq) = (-softplus(-x), -softplus(x));
        for (k, slot) in pmf.iter_mut().enumerate() {
            *slot += w * (ln_choose[k] + k as f64 * lp + (g - k) as f64 * lq).exp();
        }
        total += w;
    }
    let sum: f64 = pmf.iter().sum();
    let norm = if sum > 0.0 { sum } else { total };
    pmf.iter_mut().for_each(|p| *p /= norm);
    pmf
}

/// One pooled point: every observation in the window at one (bitwise-equal) difficulty.
#[derive(Debug, Clone)]
struct Pool {
    d: Vec<f64>,
    successes: f64,
    trials: f64,
    /// Σ step · trials (for the trial-weighted mean step).
    step_trials: f64,
    last_step: usize,
}

/// The training data of one fit (see the module docs, "Noise").
struct Data {
    /// Replicated rows `(d, t)`: pooled point `i` appears `copies[i]` times.
    x: Array2<f64>,
    /// Targets of the rows: empirical logit minus the prior trend.
    y: Array1<f64>,
    /// One row per pooled point (for the correlation-length fit).
    x_pooled: Array2<f64>,
    /// Targets of the pooled points.
    y_pooled: Array1<f64>,
    copies: Vec<usize>,
    /// Weight (inverse binomial variance, logit units) that one copy stands for.
    unit: f64,
    /// Mean group size of the observations.
    group: f64,
}

impl Data {
    fn points(&self) -> usize {
        self.copies.len()
    }

    fn rows(&self) -> usize {
        self.y.len()
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

    /// The nugget grid, cleaned: finite values clamped into bounds, sorted, deduplicated; the
    /// default when none is left.
    fn nugget_grid(&self) -> Vec<f64> {
        let mut grid: Vec<f64> = self
            .config
            .nuggets
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| v.clamp(NUGGET_BOUNDS.0, NUGGET_BOUNDS.1))
            .collect();
        grid.sort_by(f64::total_cmp);
        grid.dedup();
        if grid.is_empty() {
            DEFAULT_NUGGETS.to_vec()
        } else {
            grid
        }
    }

    /// Rows `(d, t)` for predictions at `step`.
    fn inputs(&self, difficulties: &[Vec<f64>], step: usize) -> Array2<f64> {
        let k = difficulties.first().map_or(0, Vec::len);
        let t = self.time_input(step);
        let mut x = Array2::zeros((difficulties.len(), k + 1));
        for (i, d) in difficulties.iter().enumerate() {
            for (j, v) in d.iter().enumerate().take(k) {
                x[[i, j]] = *v;
            }
            x[[i, k]] = t;
        }
        x
    }

    /// Drop the observations that left the window (and beyond the hard cap).
    fn prune(&mut self) {
        let Some(newest) = self.observations.iter().map(|o| o.step).max() else {
            return;
        };
        let window = self.config.window;
        self.observations
            .retain(|o| o.step.saturating_add(window) >= newest);
        if self.observations.len() > MAX_STORED {
            let excess = self.observations.len() - MAX_STORED;
            self.observations.drain(..excess);
        }
    }

    /// Pool the observations with `k` dimensions by difficulty and build the replicated rows.
    /// `None` with fewer than 2 pooled points.
    fn data(&self, k: usize) -> Option<Data> {
        let mut index: HashMap<Vec<u64>, usize> = HashMap::new();
        let mut pools: Vec<Pool> = Vec::new();
        let (mut groups, mut group_trials) = (0usize, 0.0);
        for o in self.observations.iter().filter(|o| o.difficulty.len() == k) {
            let n = o.group_size as f64;
            let s = o.acc.clamp(0.0, 1.0) * n;
            groups += 1;
            group_trials += n;
            let key: Vec<u64> = o.difficulty.iter().map(|x| x.to_bits()).collect();
            let i = *index.entry(key).or_insert_with(|| {
                pools.push(Pool {
                    d: o.difficulty.clone(),
                    successes: 0.0,
                    trials: 0.0,
                    step_trials: 0.0,
                    last_step: o.step,
                });
                pools.len() - 1
            });
            let p = &mut pools[i];
            p.successes += s;
            p.trials += n;
            p.step_trials += o.step as f64 * n;
            p.last_step = p.last_step.max(o.step);
        }
        let cap = self.config.max_points.max(3);
        if pools.len() > cap {
            // Keep the `cap` most recently observed difficulties (ties: the later-seen one),
            // in their original order.
            let mut order: Vec<usize> = (0..pools.len()).collect();
            order.sort_by(|&a, &b| pools[b].last_step.cmp(&pools[a].last_step).then(b.cmp(&a)));
            let mut keep = vec![false; pools.len()];
            for &i in &order[..cap] {
                keep[i] = true;
            }
            let mut i = 0;
            pools.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        let n = pools.len();
        if n < 2 {
            return None;
        }
        // Weights: inverse binomial variance of each target; one copy per `unit` of weight.
        let weights: Vec<f64> = pools
            .iter()
            .map(|p| 1.0 / empirical_logit_var(p.successes, p.trials))
            .collect();
        let w_min = weights.iter().copied().fold(f64::INFINITY, f64::min);
        let w_sum: f64 = weights.iter().sum();
        let unit = w_min.max(w_sum / ROW_BUDGET as f64);
        if !(unit.is_finite() && unit > 0.0) {
            return None;
        }
        let copies: Vec<usize> = weights
            .iter()
            .map(|w| ((w / unit).round() as usize).max(1))
            .collect();
        let rows: usize = copies.iter().sum();
        let mut x = Array2::zeros((rows, k + 1));
        let mut y = Array1::zeros(rows);
        let mut x_pooled = Array2::zeros((n, k + 1));
        let mut y_pooled = Array1::zeros(n);
        let mut r = 0;
        for (i, p) in pools.iter().enumerate() {
            let t = p.step_trials / p.trials / self.total_steps.max(1) as f64;
            let target = empirical_logit(p.successes, p.trials) - self.prior(&p.d);
            for (j, v) in p.d.iter().enumerate() {
                x_pooled[[i, j]] = *v;
            }
            x_pooled[[i, k]] = t;
            y_pooled[i] = target;
            for _ in 0..copies[i] {
                x.row_mut(r).assign(&x_pooled.row(i));
                y[r] = target;
                r += 1;
            }
        }
        if y.iter().any(|v| !v.is_finite()) || x.iter().any(|v| !v.is_finite()) {
            return None;
        }
        Some(Data {
            x,
            y,
            x_pooled,
            y_pooled,
            copies,
            unit,
            group: group_trials / groups.max(1) as f64,
        })
    }

    fn n_start(&self) -> usize {
        if self.config.n_start == 1 {
            2
        } else {
            self.config.n_start
        }
    }

    /// egobox fit of `x → y` with the given mean, tuning and nugget; `None` when it fails.
    fn egobox_fit(
        &self,
        x: &Array2<f64>,
        y: &Array1<f64>,
        mean: TrendMean,
        tuning: ThetaTuning<f64>,
        nugget: f64,
    ) -> Option<Model> {
        // Multistart only without a warm start (a first fit, or after a failure).
        let n_start = if self.warm.is_some() {
            0
        } else {
            self.n_start()
        };
        let params = GaussianProcess::<f64, TrendMean, Matern52Corr>::params(mean, Matern52Corr())
            .theta_tuning(tuning)
            .n_start(n_start)
            .nugget(nugget);
        let dataset = Dataset::new(x.clone(), y.clone());
        let model = catch_unwind(AssertUnwindSafe(|| params.fit(&dataset)))
            .ok()?
            .ok()?;
        let ok = model.theta().iter().all(|t| t.is_finite() && *t > 0.0)
            && model.variance().is_finite()
            && model.variance() > 0.0
            && model.likelihood().is_finite();
        ok.then_some(model)
    }

    /// Fit the correlation lengths of the difficulty dims by egobox's maximum likelihood on
    /// the pooled points (one row each) with a homoscedastic nugget; returns them as inverse
    /// lengths in difficulty units (egobox's theta over the column's standard deviation).
    fn fit_lengths(&self, data: &Data, k: usize, trend: Trend, nugget: f64) -> Option<Vec<f64>> {
        let sd = col_std(&data.x_pooled);
        let (lo, hi) = INV_LENGTH_BOUNDS;
        let warm = self.warm.as_ref().filter(|(w, _)| w.len() == k);
        let mut init = Vec::with_capacity(k + 1);
        let mut bounds = Vec::with_capacity(k + 1);
        for j in 0..k {
            let v = warm.map_or(INV_LENGTH_INIT, |(w, _)| w[j]);
            let v = if v.is_finite() {
                v.clamp(lo, hi)
            } else {
                INV_LENGTH_INIT
            };
            init.push(v * sd[j]);
            bounds.push((lo * sd[j], hi * sd[j]));
        }
        let t = sd[k] / self.time_scale();
        init.push(t);
        bounds.push((t, t));
        let tuning = ThetaTuning::Partial {
            init: Array1::from(init),
            bounds: Array1::from(bounds),
            active: (0..k).collect(),
        };
        let mean = TrendMean::new(&data.x_pooled, k, trend);
        let model = self.egobox_fit(&data.x_pooled, &data.y_pooled, mean, tuning, nugget)?;
        Some((0..k).map(|j| model.theta()[j] / sd[j]).collect())
    }

    /// The model on the replicated rows with `spec` (fixed theta), and its profile
    /// log-likelihood as a model of the pooled points (see the module docs, "Nugget").
    fn fit_rows(&self, data: &Data, k: usize, spec: &Spec) -> Option<(Fitted, f64)> {
        if spec.theta.len() != k + 1 {
            return None;
        }
        let nugget = spec.nugget;
        let tuning = ThetaTuning::Fixed(Array1::from(spec.theta.clone()));
        let mean = TrendMean::new(&data.x, k, spec.trend);
        let model = self.egobox_fit(&data.x, &data.y, mean, tuning, nugget)?;
        let rows = data.rows() as f64;
        let n = data.points() as f64;
        // egobox: likelihood = −N·(log10 σ̂²_std + log10|R_N| / N), σ̂²_std = Q_std / N, with
        // the targets standardised by their sample sd; variance() = σ̂²_std · sd_y².
        let sd_y = vec_std(&data.y);
        let var_std = model.variance() / (sd_y * sd_y);
        let log10_det_rows = -model.likelihood() - rows * var_std.log10();
        // |K_N + νI_N| = ν^(N−n) · Π c_i · |K_n + ν C⁻¹| for rows replicated c_i times.
        let ln_copies: f64 = data.copies.iter().map(|c| (*c as f64).ln()).sum();
        let ln_det =
            std::f64::consts::LN_10 * log10_det_rows - (rows - n) * nugget.ln() - ln_copies;
        // Q (in target units) is the same quadratic form for rows and pooled points.
        let q = rows * model.variance();
        let loglik = -0.5 * n * (q / n).ln() - 0.5 * ln_det;
        if !loglik.is_finite() {
            return None;
        }
        let var_factor = rows / (n - mean.len() as f64).max(1.0);
        let sigma2 = model.variance() * var_factor;
        let fitted = Fitted {
            k,
            model,
            var_factor,
            dispersion: sigma2 * nugget * data.unit,
            copy_noise: sigma2 * nugget,
            unit: data.unit,
            coefs: mean.len(),
            group: data.group,
        };
        Some((fitted, loglik))
    }

    /// A full fit: the correlation lengths (warm-started), the trend, then the nugget (see the
    /// module docs, "Fit").
    fn fit_new(&self, k: usize) -> Option<(Fitted, Spec, Vec<f64>)> {
        let data = self.data(k)?;
        let grid = self.nugget_grid();
        let warm_nugget = self
            .warm
            .as_ref()
            .map(|(_, nu)| *nu)
            .filter(|nu| nu.is_finite() && *nu > 0.0);
        let nugget_prev = warm_nugget.unwrap_or(grid[grid.len() / 2]);
        // The pooled points have, on average, the noise of 1/mean(1/c) copies.
        let mean_inv_copies =
            data.copies.iter().map(|c| 1.0 / *c as f64).sum::<f64>() / data.points() as f64;
        let nugget_pooled = (nugget_prev * mean_inv_copies).clamp(NUGGET_BOUNDS.0, NUGGET_BOUNDS.1);
        let trends: Vec<Trend> = Trend::ALL
            .into_iter()
            .filter(|t| t.fits(&data.x_pooled, k, data.points()))
            .collect();

        // With the richest trend the design supports (egobox rejects a singular one).
        let lengths = trends
            .iter()
            .rev()
            .find_map(|&t| self.fit_lengths(&data, k, t, nugget_pooled))?;
        let sd = col_std(&data.x);
        let mut theta: Vec<f64> = (0..k).map(|j| lengths[j] * sd[j]).collect();
        theta.push(sd[k] / self.time_scale());
        let spec = |trend: Trend, nugget: f64| Spec {
            theta: theta.clone(),
            nugget,
            trend,
        };
        // The trend of highest BIC (log-likelihood at the previous nugget less ½·ln(n) per
        // coefficient); the first of equals, i.e. the simplest.
        let penalty = 0.5 * (data.points() as f64).ln();
        let mut trend = Trend::Prior;
        let mut trend_fit = None;
        let mut best_bic = f64::NEG_INFINITY;
        for &t in &trends {
            let fit = self.fit_rows(&data, k, &spec(t, nugget_prev));
            let bic = fit
                .as_ref()
                .map_or(f64::NEG_INFINITY, |(f, ll)| ll - penalty * f.coefs as f64);
            if bic > best_bic {
                best_bic = bic;
                trend = t;
                trend_fit = fit;
            }
        }
        // The score of each nugget of the grid, computed on demand: feasible fits (noise at
        // least MIN_DISPERSION × binomial) by their profile log-likelihood, above infeasible
        // ones by their dispersion, above failed fits.
        let mut tried: Vec<Option<Option<(Fitted, f64)>>> = grid.iter().map(|_| None).collect();
        if let Some(i) = grid.iter().position(|nu| *nu == nugget_prev) {
            tried[i] = trend_fit.map(Some);
        }
        let mut score = |i: usize| -> (u8, f64) {
            let entry =
                tried[i].get_or_insert_with(|| self.fit_rows(&data, k, &spec(trend, grid[i])));
            match entry {
                Some((f, ll)) if f.dispersion >= MIN_DISPERSION => (2, *ll),
                Some((f, _)) => (1, f.dispersion),
                None => (0, 0.0),
            }
        };
        let better = |a: (u8, f64), b: (u8, f64)| a.0 > b.0 || (a.0 == b.0 && a.1 > b.1);
        let climbed = warm_nugget.and_then(|prev| {
            // Hill-climb on the grid from the grid value nearest the previous nugget.
            let mut i = (0..grid.len())
                .min_by(|&a, &b| {
                    (grid[a].ln() - prev.ln())
                        .abs()
                        .total_cmp(&(grid[b].ln() - prev.ln()).abs())
                })
                .unwrap_or(0);
            loop {
                let here = score(i);
                let up = (i + 1 < grid.len()).then(|| score(i + 1));
                let down = (i > 0).then(|| score(i - 1));
                match (up, down) {
                    (Some(u), d) if better(u, here) && d.is_none_or(|d| !better(d, u)) => i += 1,
                    (_, Some(d)) if better(d, here) => i -= 1,
                    _ => break,
                }
            }
            Some(i).filter(|&i| score(i).0 == 2)
        });
        let chosen = climbed.unwrap_or_else(|| {
            // No previous nugget, or the climb found no feasible fit: the whole grid.
            let mut best = 0;
            for i in 1..grid.len() {
                if better(score(i), score(best)) {
                    best = i;
                }
            }
            best
        });
        let (fitted, _) = tried[chosen].take().flatten()?;
        Some((fitted, spec(trend, grid[chosen]), lengths))
    }

    /// Rebuild the model of the current observations from a stored spec.
    fn rebuild(&self, k: usize, spec: &Spec) -> Option<Fitted> {
        let data = self.data(k)?;
        self.fit_rows(&data, k, spec).map(|(f, _)| f)
    }

    /// Make sure the cached model matches the observations (refitting if needed).
    fn ensure_model(&mut self, k: usize) -> Option<&Fitted> {
        let cached_ok =
            matches!(&self.model, Some(m) if m.k == k) && matches!(self.status, Status::Fitted(_));
        if !cached_ok {
            self.model = None;
            match &self.status {
                Status::Failed => return None,
                Status::Fitted(spec) => {
                    let spec = spec.clone();
                    match self.rebuild(k, &spec) {
                        Some(m) => self.model = Some(m),
                        None => {
                            self.status = Status::Failed;
                            return None;
                        }
                    }
                }
                Status::Stale => match self.fit_new(k) {
                    Some((m, spec, lengths)) => {
                        self.warm = Some((lengths, spec.nugget));
                        self.status = Status::Fitted(spec);
                        self.model = Some(m);
                    }
                    None => {
                        self.status = Status::Failed;
                        return None;
                    }
                },
            }
        }
        self.model.as_ref()
    }

    /// A freshly fitted model for reports (the one `ensure_model` would build), when the
    /// cache holds none; the cache itself is left alone.
    fn model_for_report(&self, k: usize) -> Option<Fitted> {
        match &self.status {
            Status::Failed => None,
            Status::Fitted(spec) => self.rebuild(k, spec),
            Status::Stale => self.fit_new(k).map(|(m, ..)| m),
        }
    }

    /// `f` on the model for `k` dimensions: the cached one when it matches, else one built
    /// for the occasion ([`Self::model_for_report`]); the cache is left alone.
    fn with_model<R>(&self, k: usize, f: impl FnOnce(&Fitted) -> Option<R>) -> Option<R> {
        match &self.model {
            Some(m) if m.k == k => f(m),
            _ => f(&self.model_for_report(k)?),
        }
    }

    /// The number of difficulty dimensions of the stored observations (of the newest one).
    fn dims(&self) -> Option<usize> {
        self.observations.last().map(|o| o.difficulty.len())
    }

    /// Posterior `(mean, sd)` of the latent logit accuracy at the rows of `x` (difficulty,
    /// then `t`); NaN where it fails.
    fn latent(&self, fitted: &Fitted, x: &Array2<f64>) -> Vec<(f64, f64)> {
        let k = x.ncols().saturating_sub(1);
        let out = catch_unwind(AssertUnwindSafe(|| fitted.model.predict_valvar(x)));
        match out {
            Ok(Ok((mu, var))) => mu
                .iter()
                .zip(var.iter())
                .zip(x.rows())
                .map(|((m, v), row)| {
                    let d: Vec<f64> = row.iter().take(k).copied().collect();
                    (m + self.prior(&d), (v.max(0.0) * fitted.var_factor).sqrt())
                })
                .collect(),
            _ => vec![(f64::NAN, f64::NAN); x.nrows()],
        }
    }

    /// Predicted `(p, sd_p)` of the latent accuracy at the rows of `x` (delta method:
    /// `sd_p = p(1−p)·sd_logit`); NaN where it fails.
    fn predict(&self, fitted: &Fitted, x: &Array2<f64>) -> Vec<(f64, f64)> {
        self.latent(fitted, x)
            .into_iter()
            .map(|(m, s)| {
                let p = sigmoid(m);
                (p, p * (1.0 - p) * s)
            })
            .collect()
    }

    fn trust_radius(&self) -> f64 {
        let r = self.config.trust_radius;
        if r.is_finite() && r > 0.0 {
            r.min(1.0)
        } else {
            0.2
        }
    }

    /// Candidates inside the trust region: the part of the L∞ box of radius `trust_radius`
    /// around `current` (within `[0,1]^k`) on the side of `direction` (every coordinate at
    /// least the current one for Harder, at most for Easier; difficulty is monotone). Half
    /// uniform in it, half moves of `current` along the dimensions the critic flags (all if
    /// none) by independent uniform amounts up to the radius, and the moves by ¼, ½, ¾ and
    /// all of the radius along all flagged dimensions (not random).
    fn candidates(
        &self,
        current: &[f64],
        direction: Direction,
        feedback: &CriticFeedback,
        rng: &mut Rng,
    ) -> Vec<Vec<f64>> {
        let k = current.len();
        let r = self.trust_radius();
        let (lo, hi): (Vec<f64>, Vec<f64>) = match direction {
            Direction::Harder => current.iter().map(|c| (*c, (c + r).min(1.0))).unzip(),
            Direction::Easier => current.iter().map(|c| ((c - r).max(0.0), *c)).unzip(),
        };
        let sign = match direction {
            Direction::Harder => 1.0,
            Direction::Easier => -1.0,
        };
        let n = self.config.candidates.max(2);
        let flagged = feedback.flagged_dims(k);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n / 2 {
            out.push(
                (0..k)
                    .map(|j| lo[j] + (hi[j] - lo[j]) * rng.uniform())
                    .collect(),
            );
        }
        for _ in n / 2..n {
            let mut d = current.to_vec();
            for &j in &flagged {
                d[j] = (d[j] + sign * r * rng.uniform()).clamp(lo[j], hi[j]);
            }
            out.push(d);
        }
        for f in [0.25, 0.5, 0.75, 1.0] {
            let mut d = current.to_vec();
            for &j in &flagged {
                d[j] = (d[j] + sign * r * f).clamp(lo[j], hi[j]);
            }
            out.push(d);
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
                    && cands[i].as_slice() != current
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
            self.config.target.clamp(1e-6, 1.0 - 1e-6)
        } else {
            0.5
        };
        let logit = |p: f64| (p / (1.0 - p)).ln();
        // Distance of a prediction from the target on the logit scale.
        let gap = |i: usize| (logit(preds[i].0.clamp(1e-12, 1.0 - 1e-12)) - logit(target)).abs();
        let dist = |i: usize| -> f64 {
            cands[i]
                .iter()
                .zip(current)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
        };
        let nearest = |set: &[usize]| -> Option<usize> {
            let best = set.iter().map(|&i| gap(i)).fold(f64::INFINITY, f64::min);
            // Target in reach: the smallest move that gets (about) there; out of reach: the
            // move predicted to get closest.
            let tol = if best <= REACH_TOL { NEAREST_TOL } else { 0.0 };
            set.iter()
                .copied()
                .filter(|&i| gap(i) <= best + tol)
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
            Status::Fitted(spec) => json!({
                "theta": f64s_to_bits(&spec.theta),
                "nugget": spec.nugget.to_bits(),
                "trend": spec.trend.name(),
            }),
        };
        let warm = self.warm.as_ref().map(|(lengths, nugget)| {
            json!({ "lengths": f64s_to_bits(lengths), "nugget": nugget.to_bits() })
        });
        json!({
            "format": "gp-v2 (floats as IEEE-754 bit patterns)",
            "config": serde_json::to_value(&self.config).unwrap_or(Value::Null),
            "total_steps": self.total_steps,
            "observations": observations,
            "warm": warm,
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
        let v2 = state
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| f.starts_with("gp-v2"));
        // A state of the first format (a different model) restarts from a fresh fit.
        let warm = match state.get("warm") {
            None | Some(Value::Null) => None,
            Some(_) if !v2 => None,
            Some(w) => {
                let lengths = w.get("lengths").and_then(bits_to_f64s);
                let nugget = w.get("nugget").and_then(Value::as_u64).map(f64::from_bits);
                Some(lengths.zip(nugget).ok_or_else(|| err("bad `warm`"))?)
            }
        };
        let status = match state.get("status") {
            Some(Value::String(s)) if s == "stale" => Status::Stale,
            Some(Value::String(s)) if s == "failed" => Status::Failed,
            Some(_) if !v2 => Status::Stale,
            Some(v) => {
                let theta = v.get("theta").and_then(bits_to_f64s);
                let nugget = v.get("nugget").and_then(Value::as_u64).map(f64::from_bits);
                let trend = v
                    .get("trend")
                    .and_then(Value::as_str)
                    .and_then(Trend::from_name);
                match (theta, nugget, trend) {
                    (Some(theta), Some(nugget), Some(trend)) => Status::Fitted(Spec {
                        theta,
                        nugget,
                        trend,
                    }),
                    _ => return Err(err("bad `status`")),
                }
            }
            None => return Err(err("missing `status`")),
        };
        self.observations = observations;
        self.warm = warm;
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
mod tests {
    use super::*;
    use rlany_framework::adapt::{
        AdaptCounts, AdaptSlot, GateSpec, ProposeContext, Threshold, accept, direction,
    };

    const BAND: (f64, f64) = (0.2, 0.8);
    const G: usize = 8;

    fn true_acc(d: &[f64]) -> f64 {
        let m = d.iter().sum::<f64>() / d.len() as f64;
        sigmoid(6.0 * (0.6 - m))
    }

    /// The success rate of one group of `G` rollouts at accuracy `p`.
    fn group_rate(p: f64, rng: &mut Rng) -> f64 {
        (0..G).filter(|_| rng.bernoulli(p)).count() as f64 / G as f64
    }

    fn measure(d: &[f64], rng: &mut Rng) -> f64 {
        group_rate(true_acc(d), rng)
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

    /// A misspelt field of an acquisition is refused, as everywhere else in a file.
    #[test]
    fn an_acquisition_refuses_unknown_fields() {
        let ucb: Acquisition =
            serde_json::from_str(r#"{"Ucb": {"beta": 5.0}}"#).expect("a valid Ucb");
        assert_eq!(ucb, Acquisition::Ucb { beta: 5.0 });
        let err =
            serde_json::from_str::<Acquisition>(r#"{"Ucb": {"betta": 5.0}}"#).expect_err("a typo");
        assert!(err.to_string().contains("betta"), "{err}");
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
        // The trust region (0.2) needs at least 3 accepted moves from [0, 0] to the band.
        assert!(
            gp_counts.iter().all(|&c| c <= 10),
            "gp needed more than 10 proposals: {gp_counts:?}"
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
        assert!(counts.iter().all(|&c| c <= 12), "{counts:?}");
    }

    /// The known accuracy of the 3-dimensional synthetic environment: logistic in a weighted
    /// sum of the difficulties, improving slowly with training.
    #[derive(Clone, Copy)]
    struct Env3 {
        /// A logit quadratic (not linear) in the weighted difficulty.
        curved: bool,
        /// Sd of each group's own task effect on the logit (0: pure binomial groups).
        task_sd: f64,
    }

    impl Env3 {
        fn logit(&self, d: &[f64], step: usize, total: usize) -> f64 {
            let z = 0.5 * d[0] + 0.3 * d[1] + 0.2 * d[2];
            let t = step as f64 / total as f64;
            if self.curved {
                3.0 + t - 8.0 * z + 4.0 * z * z
            } else {
                2.5 + t - 6.0 * z
            }
        }

        /// The success rate of one group (one task, `G` rollouts).
        fn group(&self, d: &[f64], step: usize, total: usize, rng: &mut Rng) -> f64 {
            let task = if self.task_sd > 0.0 {
                self.task_sd * rng.normal()
            } else {
                0.0
            };
            group_rate(sigmoid(self.logit(d, step, total) + task), rng)
        }
    }

    /// Runs the training loop's adaptation (framework/src/step.rs: observe every group, gate
    /// the pending proposals, then let the slots that are out of the band propose) with
    /// `slots` slots on the 3-dimensional environment for `steps` steps. Before the rollouts of
    /// every third step from step 9 on, for each slot, two held-out difficulties drawn
    /// uniformly in the trust region around the slot's current difficulty get a fresh group
    /// whose outcome is compared with the GP's 95% predictive interval (the group is *not*
    /// observed). Returns (held-out points, covered by the randomised 95% interval, covered by
    /// the conservative one, proposals, accepted, mean fit time).
    fn coverage_run(
        env3: Env3,
        seed: u64,
        slots_n: usize,
        steps: usize,
    ) -> (usize, usize, usize, usize, usize, f64) {
        let total = steps;
        let spec = gp_config();
        let r = spec.trust_radius;
        let mut gp = Gp::new(spec, total);
        let mut env = Rng::derive(seed, "env3");
        let mut held = Rng::derive(seed, "held-out");
        let mut rng = Rng::derive(seed, "propose3");
        let mut slots: Vec<AdaptSlot> = (0..slots_n)
            .map(|_| AdaptSlot::new((0..3).map(|_| 0.3 * env.uniform()).collect()))
            .collect();
        let mut counts = AdaptCounts::default();
        let fb = CriticFeedback::default();
        let (mut points, mut covered, mut covered_wide) = (0usize, 0usize, 0usize);
        let (mut fit_time, mut fits) = (0.0f64, 0usize);
        for step in 0..steps {
            if step >= 9 && step % 3 == 0 {
                let t0 = std::time::Instant::now();
                assert!(gp.refresh(), "no model at step {step}");
                fit_time += t0.elapsed().as_secs_f64();
                fits += 1;
                for slot in &slots {
                    let ds: Vec<Vec<f64>> = (0..2)
                        .map(|_| {
                            slot.difficulty
                                .iter()
                                .map(|c| (c + r * (2.0 * held.uniform() - 1.0)).clamp(0.0, 1.0))
                                .collect()
                        })
                        .collect();
                    let preds = gp.predictive(&ds, step, G).expect("predictive");
                    for (d, pred) in ds.iter().zip(&preds) {
                        let rate = env3.group(d, step, total, &mut held);
                        let successes = (rate * G as f64).round() as usize;
                        points += 1;
                        let u = held.uniform();
                        covered += usize::from(pred.covers_randomised(successes, 0.95, u));
                        covered_wide += usize::from(pred.covers(rate, 0.95));
                    }
                }
            }
            // Rollouts: every slot's own group, then its pending proposal's group.
            let mut slot_acc = vec![0.0; slots_n];
            let mut pending_acc = vec![None; slots_n];
            for (i, slot) in slots.iter().enumerate() {
                let acc = env3.group(&slot.difficulty, step, total, &mut env);
                gp.observe(Observation {
                    difficulty: slot.difficulty.clone(),
                    step,
                    acc,
                    group_size: G,
                });
                slot_acc[i] = acc;
                if let Some(p) = &slot.pending {
                    let acc = env3.group(&p.difficulty, step, total, &mut env);
                    gp.observe(Observation {
                        difficulty: p.difficulty.clone(),
                        step,
                        acc,
                        group_size: G,
                    });
                    pending_acc[i] = Some(acc);
                }
            }
            // The loop's slot machine: the own group joins the running accuracy (one group,
            // as the trigger here), the proposal is gated against the same step's own group.
            let gate = GateSpec {
                window: 1,
                min_rollouts: G,
            };
            let successes = |acc: f64| (acc * G as f64).round() as usize;
            for ((slot, acc), own) in slots.iter_mut().zip(&pending_acc).zip(&slot_acc) {
                slot.record(successes(*own), G, &gate);
                if let Some(a) = acc {
                    slot.resolve(*own, (successes(*a), G), BAND, &mut counts);
                }
            }
            let t0 = std::time::Instant::now();
            let before = gp.theta().is_some();
            let ctx = ProposeContext {
                band: BAND,
                gate: &gate,
                feedback: &fb,
                step,
            };
            for slot in slots.iter_mut() {
                slot.maybe_propose(&ctx, &mut gp, &mut rng, &mut counts, |_| true);
            }
            if !before && gp.theta().is_some() {
                fit_time += t0.elapsed().as_secs_f64();
                fits += 1;
            }
        }
        (
            points,
            covered,
            covered_wide,
            counts.proposals,
            counts.accepted,
            fit_time / fits.max(1) as f64,
        )
    }

    /// Calibration on the 3-dimensional environment with a logit quadratic in the weighted
    /// difficulty, a slow improvement over training and a task effect of sd 0.5 per group
    /// (8 slots, 45 steps, 2 seeds; 384 held-out groups). Held-out difficulties: uniform in
    /// the L∞ box of the trust radius around each slot's current difficulty (both sides),
    /// at the current step, before that step's rollouts, i.e. where the next proposals and
    /// rollouts will be. The hit rate of the randomised 95% interval (exactly 95% under a
    /// correct model) must lie in [0.85, 0.99]; the conservative interval covers at least as
    /// often.
    #[test]
    fn gp_predictive_intervals_cover_held_out_groups() {
        let started = std::time::Instant::now();
        let (mut points, mut covered, mut covered_wide) = (0, 0, 0);
        let mut fit_ms = Vec::new();
        for seed in 0..2u64 {
            let env3 = Env3 {
                curved: true,
                task_sd: 0.5,
            };
            let (p, c, w, proposals, accepted, fit) = coverage_run(env3, seed, 8, 45);
            eprintln!(
                "seed {seed}: {c}/{p} covered ({w} by the conservative interval), \
                 {proposals} proposals, {accepted} accepted, {:.1} ms per fit",
                1e3 * fit
            );
            points += p;
            covered += c;
            covered_wide += w;
            fit_ms.push(1e3 * fit);
        }
        let rate = covered as f64 / points as f64;
        let rate_wide = covered_wide as f64 / points as f64;
        eprintln!(
            "95% predictive intervals over {points} held-out groups: coverage {rate:.3} \
             (randomised), {rate_wide:.3} (conservative); fit {fit_ms:.1?} ms; {:.2?}",
            started.elapsed()
        );
        assert!(points >= 200, "{points}");
        assert!((0.85..=0.99).contains(&rate), "coverage {rate}");
        assert!(
            rate_wide >= rate && rate_wide >= 0.9,
            "{rate_wide} vs {rate}"
        );
    }

    /// The calibration sweep behind the coverage figures of the report: four environments
    /// (logit linear or quadratic in the weighted difficulty; pure binomial groups or a task
    /// effect of sd 0.5 / 0.7), 8 slots × 45 steps × 6 seeds and 16 slots × 60 steps × 3 seeds.
    /// Slow in the debug build: `cargo test --release -p rlany-envs --lib gp_calibration_sweep
    /// -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn gp_calibration_sweep() {
        for (slots, steps, seeds) in [(8, 45, 6u64), (16, 60, 3)] {
            for (curved, task_sd) in [(false, 0.0), (true, 0.0), (true, 0.5), (true, 0.7)] {
                let env3 = Env3 { curved, task_sd };
                let (mut points, mut covered, mut covered_wide, mut fit) = (0, 0, 0, 0.0);
                let mut per_seed = Vec::new();
                for seed in 0..seeds {
                    let (p, c, w, _, _, f) = coverage_run(env3, seed, slots, steps);
                    points += p;
                    covered += c;
                    covered_wide += w;
                    fit += f;
                    per_seed.push(format!("{:.3}", c as f64 / p as f64));
                }
                let rate = covered as f64 / points as f64;
                eprintln!(
                    "{slots} slots, curved {curved}, task sd {task_sd}: coverage {rate:.3} \
                     (randomised; per seed {per_seed:?}), {:.3} (conservative) over {points}; \
                     {:.1} ms per fit",
                    covered_wide as f64 / points as f64,
                    1e3 * fit / seeds as f64
                );
                assert!((0.85..=0.99).contains(&rate), "coverage {rate}");
            }
        }
    }

    /// One group of `group` rollouts at each difficulty of a 6×6 grid, on an accuracy curve
    /// whose logit is not linear: `1 − 3·mean(d) + 2·sin(2π·d₀)`.
    fn grid_gp(group: usize, seed: u64) -> Gp {
        let mut gp = Gp::new(gp_config(), 100);
        let mut env = Rng::derive(seed, "grid-noise");
        for i in 0..6 {
            for j in 0..6 {
                let d = vec![i as f64 / 5.0, j as f64 / 5.0];
                let m = (d[0] + d[1]) / 2.0;
                let p = sigmoid(1.0 - 3.0 * m + 2.0 * (std::f64::consts::TAU * d[0]).sin());
                let k = (0..group).filter(|_| env.bernoulli(p)).count();
                gp.observe(Observation {
                    difficulty: d,
                    step: 10,
                    acc: k as f64 / group as f64,
                    group_size: group,
                });
            }
        }
        gp
    }

    #[test]
    fn gp_nugget_grows_with_binomial_noise() {
        // 36 difficulties, one group each: 8 rollouts (logit noise sd ≈ 0.7 to 1.5 against a
        // wave of amplitude 2 beyond the linear trend) versus 20 000 rollouts (sd ≈ 0.03):
        // the noisy data must get the larger nugget, the nearly noiseless ones one of the
        // smallest of the grid.
        let mut noisy = grid_gp(8, 1);
        let mut clean = grid_gp(20_000, 1);
        assert!(noisy.refresh() && clean.refresh());
        let (nn, nc) = (noisy.nugget().expect("fit"), clean.nugget().expect("fit"));
        eprintln!(
            "nugget: noisy {nn} (dispersion {:?}), clean {nc} (dispersion {:?})",
            noisy.dispersion(),
            clean.dispersion()
        );
        assert!(nn > nc, "noisy {nn} vs clean {nc}");
        assert!(nc <= 0.01, "clean {nc}");
    }

    /// Hand-made data with every pooled point replicated `copies` times.
    fn hand_data(copies: usize) -> Data {
        let pts: [(f64, f64, f64); 5] = [
            (0.0, 0.1, 1.9),
            (0.25, 0.2, 1.1),
            (0.5, 0.15, 0.2),
            (0.75, 0.3, -0.7),
            (1.0, 0.25, -1.2),
        ];
        let n = pts.len();
        let mut x = Array2::zeros((n * copies, 2));
        let mut y = Array1::zeros(n * copies);
        let mut x_pooled = Array2::zeros((n, 2));
        let mut y_pooled = Array1::zeros(n);
        for (i, (d, t, v)) in pts.iter().enumerate() {
            x_pooled[[i, 0]] = *d;
            x_pooled[[i, 1]] = *t;
            y_pooled[i] = *v;
            for c in 0..copies {
                x[[i * copies + c, 0]] = *d;
                x[[i * copies + c, 1]] = *t;
                y[i * copies + c] = *v;
            }
        }
        Data {
            x,
            y,
            x_pooled,
            y_pooled,
            copies: vec![copies; n],
            unit: 1.0,
            group: 8.0,
        }
    }

    #[test]
    fn replicated_rows_are_the_heteroscedastic_model_of_the_pooled_points() {
        // Points replicated 3 times with nugget ν are the pooled points with noise ν/3: same
        // likelihood, same predictions (the egobox variance corrected by N / (n − 1)).
        let gp = Gp::new(gp_config(), 100);
        let (a, b) = (hand_data(3), hand_data(1));
        for trend in Trend::ALL {
            let spec = |data: &Data, nugget: f64| {
                let sd = col_std(&data.x);
                Spec {
                    theta: vec![2.0 * sd[0], sd[1] / 0.25],
                    nugget,
                    trend,
                }
            };
            let (fa, la) = gp.fit_rows(&a, 1, &spec(&a, 0.3)).expect("fit a");
            let (fb, lb) = gp.fit_rows(&b, 1, &spec(&b, 0.1)).expect("fit b");
            assert!((la - lb).abs() < 1e-6, "loglik {la} vs {lb}");
            let x = gp.inputs(&[vec![0.1], vec![0.6], vec![0.95]], 20);
            for ((ma, sa), (mb, sb)) in gp.latent(&fa, &x).into_iter().zip(gp.latent(&fb, &x)) {
                assert!(
                    (ma - mb).abs() < 1e-6 && (sa - sb).abs() < 1e-6,
                    "{ma} {sa} vs {mb} {sb}"
                );
            }
        }
    }

    #[test]
    fn gp_window_drops_old_observations() {
        let mut gp = Gp::new(
            GpSpec {
                window: 5,
                ..gp_config()
            },
            100,
        );
        for step in 0..30 {
            for j in 0..2 {
                gp.observe(Observation {
                    difficulty: vec![0.1 * j as f64, 0.2],
                    step,
                    acc: 0.5,
                    group_size: G,
                });
            }
        }
        // Steps 24..=29 remain (step ≥ 29 − 5), two observations each.
        let steps: Vec<usize> = gp.observations().iter().map(|o| o.step).collect();
        assert_eq!(steps.len(), 12);
        assert!(steps.iter().all(|&s| s >= 24), "{steps:?}");
        // A late observation of an old step is dropped at once; one far ahead prunes the rest.
        gp.observe(Observation {
            difficulty: vec![0.3, 0.3],
            step: 3,
            acc: 0.5,
            group_size: G,
        });
        assert_eq!(gp.observations().len(), 12);
        gp.observe(Observation {
            difficulty: vec![0.3, 0.3],
            step: 100,
            acc: 0.5,
            group_size: G,
        });
        assert_eq!(gp.observations().len(), 1);
        // The pooled data: identical difficulties pooled, old ones gone.
        let mut gp = Gp::new(
            GpSpec {
                window: 5,
                ..gp_config()
            },
            100,
        );
        for step in 0..30 {
            gp.observe(Observation {
                difficulty: vec![0.1, 0.1],
                step,
                acc: 1.0,
                group_size: G,
            });
            gp.observe(Observation {
                difficulty: vec![(step % 3) as f64 / 3.0, 0.5],
                step,
                acc: 0.0,
                group_size: G,
            });
        }
        let data = gp.data(2).expect("data");
        assert_eq!(data.points(), 4);
        // [0.1, 0.1] pooled over steps 24..=29: 48 trials, 48 successes, mean step 26.5.
        assert!(
            (data.y_pooled[0] - (empirical_logit(48.0, 48.0) - gp.prior(&[0.1, 0.1]))).abs()
                < 1e-12
        );
        assert!((data.x_pooled[[0, 2]] - 0.265).abs() < 1e-12);
    }

    #[test]
    fn group_predictive_is_a_distribution() {
        for (mu, sd) in [(0.0, 0.0), (1.5, 0.3), (-3.0, 2.0), (8.0, 0.5)] {
            let pmf = group_pmf(mu, sd, G);
            assert_eq!(pmf.len(), G + 1);
            assert!((pmf.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            assert!(pmf.iter().all(|p| p.is_finite() && *p >= 0.0));
        }
        // No latent uncertainty: the binomial itself.
        let p = GroupPredictive {
            group_size: 8,
            logit_mean: 0.0,
            logit_sd: 0.0,
            group_sd: 0.0,
            pmf: group_pmf(0.0, 0.0, 8),
        };
        assert!((p.pmf[4] - 70.0 / 256.0).abs() < 1e-12);
        assert!((p.mean() - 0.5).abs() < 1e-12);
        // Binomial(8, ½): P(K ≤ 0) = 1/256 < 2.5% ≤ P(K ≤ 1) = 9/256, P(K ≤ 6) = 247/256.
        assert_eq!(p.interval(0.95), (1.0 / 8.0, 7.0 / 8.0));
        assert!(p.covers(0.125, 0.95) && !p.covers(0.0, 0.95) && !p.covers(1.0, 0.95));
        assert_eq!(p.interval(1.0), (0.0, 1.0));
        assert_eq!(p.interval(f64::NAN), p.interval(0.95));
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
                assert_eq!(a.nugget(), b.nugget());
                let pa = a.propose(&[0.9, 0.8], 0.1, Direction::Easier, &fb, step, &mut rng_a);
                let pb = b.propose(&[0.9, 0.8], 0.1, Direction::Easier, &fb, step, &mut rng_b);
                assert_eq!(pa, pb, "round {round} step {step}");
                let pred_a = a
                    .predictive(std::slice::from_ref(&pa), step, G)
                    .expect("predictive");
                let pred_b = b
                    .predictive(std::slice::from_ref(&pb), step, G)
                    .expect("predictive");
                assert_eq!(pred_a, pred_b);
            }
            assert_eq!(rng_a, rng_b);
            assert!(a.theta().is_some(), "the model was fitted");
            assert_eq!(a.state(), b.state());
            // A new observation: both refit from the same warm start.
            for gp in [&mut a, &mut b] {
                gp.observe(Observation {
                    difficulty: vec![0.4, 0.4],
                    step: 15 + round,
                    acc: 0.625,
                    group_size: G,
                });
            }
        }
        assert!(Gp::new(gp_config(), 100).load_state(Value::Null).is_err());
    }

    #[test]
    fn gp_proposals_stay_in_the_trust_region() {
        let (mut gp, mut rng) = trained_gp(4);
        let fb = CriticFeedback::default();
        let r = gp.config().trust_radius;
        for (i, current) in [[0.1, 0.1], [0.5, 0.2], [0.9, 0.95]].iter().enumerate() {
            for (acc, dir) in [(1.0, Direction::Harder), (0.0, Direction::Easier)] {
                let d = gp.propose(current, acc, dir, &fb, 12 + i, &mut rng);
                assert!(
                    d.iter()
                        .zip(current)
                        .all(|(a, b)| (a - b).abs() <= r + 1e-12),
                    "{current:?} -> {d:?}"
                );
            }
        }
        assert!(gp.theta().is_some());
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
        assert!(empty.predictive(&[vec![0.5, 0.5]], 0, G).is_none());
        assert!(gp.predictive(&[vec![0.5]], 12, G).is_none());
        assert!(gp.predictive(&[vec![0.5, f64::NAN]], 12, G).is_none());
        assert!(gp.predictive(&[vec![0.5, 0.5]], 12, 0).is_none());
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
        // Garbage in: NaN observations and empty groups are dropped, NaN acc falls back.
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
        gp.observe(Observation {
            difficulty: vec![0.9, 0.9],
            step: 6,
            acc: 0.5,
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
        // Odd settings: empty or non-finite nugget grid, zero trust radius; still no panic.
        let mut odd = Gp::new(
            GpSpec {
                nuggets: vec![f64::NAN],
                trust_radius: 0.0,
                max_points: 0,
                ..gp_config()
            },
            0,
        );
        let mut env = Rng::new(1);
        for step in 0..4 {
            let d = vec![0.2 * step as f64, 0.1];
            let acc = measure(&d, &mut env);
            odd.observe(Observation {
                difficulty: d,
                step,
                acc,
                group_size: G,
            });
        }
        let d = odd.propose(&[0.2, 0.1], 1.0, Direction::Harder, &fb, 4, &mut rng);
        assert_eq!(d.len(), 2);
        assert!(GpSpec::default().validate().is_ok());
        assert!(
            GpSpec {
                nuggets: vec![],
                ..gp_config()
            }
            .validate()
            .is_err()
        );
        assert!(
            GpSpec {
                trust_radius: 0.0,
                ..gp_config()
            }
            .validate()
            .is_err()
        );
    }
}
