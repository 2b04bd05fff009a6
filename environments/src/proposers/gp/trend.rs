//! The GP mean's linear part in difficulty (and time), fitted with the GP.

use super::*;

/// Most difficulty dimensions a fitted trend handles (beyond: the prior trend only).
pub(super) const MAX_TREND_DIMS: usize = 16;

/// The linear part of the GP mean in difficulty (on top of the fixed prior trend), fitted by
/// egobox's generalised least squares together with the GP. Every trend also gets a slope in
/// time when the pooled points have at least 3 distinct mean steps ([`TrendMean`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Trend {
    /// A constant: the prior trend alone gives the dependence on difficulty.
    #[default]
    Prior,
    /// A constant and a slope along the summed difficulty `Σ_j d_j`.
    Sum,
    /// A constant and one slope per difficulty dimension.
    Full,
}

impl Trend {
    pub(super) const ALL: [Trend; 3] = [Trend::Prior, Trend::Sum, Trend::Full];

    pub(super) fn name(self) -> &'static str {
        match self {
            Trend::Prior => "prior",
            Trend::Sum => "sum",
            Trend::Full => "full",
        }
    }

    pub(super) fn from_name(name: &str) -> Option<Self> {
        Trend::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Number of mean coefficients with `k` difficulty dims, without the time slope.
    pub(super) fn len(self, k: usize) -> usize {
        match self {
            Trend::Prior => 1,
            Trend::Sum => 2,
            Trend::Full => k + 1,
        }
    }

    /// Whether `points` pooled points at the difficulties `x` (rows: difficulty columns,
    /// then time) can support the trend: at least two points per coefficient, spread along
    /// the summed difficulty (for [`Trend::Sum`]); egobox itself rejects a singular design.
    pub(super) fn fits(self, x: &Array2<f64>, k: usize, points: usize) -> bool {
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
pub(super) struct TrendMean {
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
    pub(super) fn new(x: &Array2<f64>, k: usize, trend: Trend) -> Self {
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
    pub(super) fn len(&self) -> usize {
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

pub(super) type Model = GaussianProcess<f64, TrendMean, Matern52Corr>;
