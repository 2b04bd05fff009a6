//! Fitting: the observations pooled into weighted rows ("Noise" in the module docs), the
//! correlation lengths and nugget chosen, egobox's GP fitted, and its latent predictions.

use super::*;

/// One pooled point: every observation in the window at one (bitwise-equal) difficulty.
#[derive(Debug, Clone)]
pub(super) struct Pool {
    pub(super) d: Vec<f64>,
    pub(super) successes: f64,
    pub(super) trials: f64,
    /// Σ step · trials (for the trial-weighted mean step).
    pub(super) step_trials: f64,
    pub(super) last_step: usize,
}

/// The training data of one fit (see the module docs, "Noise").
pub(super) struct Data {
    /// Replicated rows `(d, t)`: pooled point `i` appears `copies[i]` times.
    pub(super) x: Array2<f64>,
    /// Targets of the rows: empirical logit minus the prior trend.
    pub(super) y: Array1<f64>,
    /// One row per pooled point (for the correlation-length fit).
    pub(super) x_pooled: Array2<f64>,
    /// Targets of the pooled points.
    pub(super) y_pooled: Array1<f64>,
    pub(super) copies: Vec<usize>,
    /// Weight (inverse binomial variance, logit units) that one copy stands for.
    pub(super) unit: f64,
    /// Mean group size of the observations.
    pub(super) group: f64,
}

impl Data {
    pub(super) fn points(&self) -> usize {
        self.copies.len()
    }

    pub(super) fn rows(&self) -> usize {
        self.y.len()
    }
}

impl Gp {
    pub(super) fn time_input(&self, step: usize) -> f64 {
        step as f64 / self.total_steps.max(1) as f64
    }

    /// The fixed prior trend at difficulty `d` (on the logit scale).
    pub(super) fn prior(&self, d: &[f64]) -> f64 {
        let s = self.config.prior_slope;
        if d.is_empty() || !s.is_finite() {
            return 0.0;
        }
        -s * d.iter().sum::<f64>() / d.len() as f64
    }

    pub(super) fn time_scale(&self) -> f64 {
        let s = self.config.time_scale;
        if s.is_finite() && s > 0.0 { s } else { 1e6 }
    }

    /// The nugget grid, cleaned: finite values clamped into bounds, sorted, deduplicated; the
    /// default when none is left.
    pub(super) fn nugget_grid(&self) -> Vec<f64> {
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
    pub(super) fn inputs(&self, difficulties: &[Vec<f64>], step: usize) -> Array2<f64> {
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
    pub(super) fn prune(&mut self) {
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
    pub(super) fn data(&self, k: usize) -> Option<Data> {
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

    pub(super) fn n_start(&self) -> usize {
        if self.config.n_start == 1 {
            2
        } else {
            self.config.n_start
        }
    }

    /// egobox fit of `x → y` with the given mean, tuning and nugget; `None` when it fails.
    pub(super) fn egobox_fit(
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
    pub(super) fn fit_lengths(
        &self,
        data: &Data,
        k: usize,
        trend: Trend,
        nugget: f64,
    ) -> Option<Vec<f64>> {
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
    pub(super) fn fit_rows(&self, data: &Data, k: usize, spec: &Spec) -> Option<(Fitted, f64)> {
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
    pub(super) fn fit_new(&self, k: usize) -> Option<(Fitted, Spec, Vec<f64>)> {
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
    pub(super) fn rebuild(&self, k: usize, spec: &Spec) -> Option<Fitted> {
        let data = self.data(k)?;
        self.fit_rows(&data, k, spec).map(|(f, _)| f)
    }

    /// Make sure the cached model matches the observations (refitting if needed).
    pub(super) fn ensure_model(&mut self, k: usize) -> Option<&Fitted> {
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
    pub(super) fn model_for_report(&self, k: usize) -> Option<Fitted> {
        match &self.status {
            Status::Failed => None,
            Status::Fitted(spec) => self.rebuild(k, spec),
            Status::Stale => self.fit_new(k).map(|(m, ..)| m),
        }
    }

    /// `f` on the model for `k` dimensions: the cached one when it matches, else one built
    /// for the occasion ([`Self::model_for_report`]); the cache is left alone.
    pub(super) fn with_model<R>(
        &self,
        k: usize,
        f: impl FnOnce(&Fitted) -> Option<R>,
    ) -> Option<R> {
        match &self.model {
            Some(m) if m.k == k => f(m),
            _ => f(&self.model_for_report(k)?),
        }
    }

    /// The number of difficulty dimensions of the stored observations (of the newest one).
    pub(super) fn dims(&self) -> Option<usize> {
        self.observations.last().map(|o| o.difficulty.len())
    }

    /// Posterior `(mean, sd)` of the latent logit accuracy at the rows of `x` (difficulty,
    /// then `t`); NaN where it fails.
    pub(super) fn latent(&self, fitted: &Fitted, x: &Array2<f64>) -> Vec<(f64, f64)> {
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
    pub(super) fn predict(&self, fitted: &Fitted, x: &Array2<f64>) -> Vec<(f64, f64)> {
        self.latent(fitted, x)
            .into_iter()
            .map(|(m, s)| {
                let p = sigmoid(m);
                (p, p * (1.0 - p) * s)
            })
            .collect()
    }
}
