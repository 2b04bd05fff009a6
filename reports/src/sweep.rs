//! The sweep figure: each row's paired difference to its baseline against the one numeric
//! setting the rows sweep — a dose–response curve, e.g. in-domain and OOD accuracy gained over
//! outcome-only training against the synthetic judge's accuracy `judge.p_pos = judge.p_neg`.
//! Drawn only when such a setting exists; needs no configuration.
//!
//! **Settings.** Each run's `resolved.ron` (the experiment as run, written by ron with struct
//! names) is read as an untyped `ron::Value` ([`parse_settings`]) into its numeric leaves under
//! dotted paths: struct fields and map keys by name (`judge.p_pos`, `reward.lambda`,
//! `budget.steps`), tuple and list elements by index (`reward.policy_band.0`). Enum variant and
//! struct names are not part of a path; `Some(x)` and a variant or struct holding one unnamed
//! value are `x` itself; strings, booleans and unit variants are not numbers and are left out,
//! and so are the top-level `name` and `seeds`. A row's settings are its first run's (a warning
//! when its runs differ).
//!
//! **Detection** ([`detect`]), over the rows that have a baseline:
//! 1. A path *varies* when at least two of those rows have it and its values there are not all
//!    equal.
//! 2. Two varying paths are *grouped* (drawn as one axis) when the same rows have them, they are
//!    equal on more than half of those rows, and those equal rows take at least two different
//!    values (`judge.p_pos` and `judge.p_neg` on the diagonal rows `Oracle(p_pos: 0.7,
//!    p_neg: 0.7)`, …, though not on `Oracle(p_pos: 0.69, p_neg: 0.44)`). Groups are the
//!    connected sets of that relation; a path grouped with no other is a group of one.
//! 3. The sweep is the group holding `suite.json`'s `"sweep": "<path>"` when given (a path that
//!    does not vary: no figure, a warning). Else the group whose value (the mean of its paths)
//!    takes the most distinct values over the rows, then the one present on the most rows; a tie
//!    on both is ambiguous: no figure, and a warning naming the candidates and how to choose.
//!    Nothing varies: no figure, no warning.
//!
//! **Points** ([`points`]). Every row that has the sweep's paths is a point at x = the mean of
//! their values. A row whose grouped values differ (p_pos 0.69, p_neg 0.44: at 0.565, for these
//! two the judge's balanced accuracy) has its own marker and is labelled with its values; a row
//! that differs from the sweep rows' most common value of another varying path (`reward.lambda =
//! 2`) is drawn apart and labelled with it. The other rows are joined by a line in x order. y is
//! the ablation table's paired difference ([`crate::table`], not recomputed here) of
//! `eval/acc_id` (left panel) and `eval/acc_ood` (right): mean ± 95% CI over the seeds both rows
//! have; the dashed line at 0 is the baseline. A table of the same numbers follows the figure.

use crate::figures::{Planned, Section};
use crate::plot::{Figure, GREY, Label, Layer, LegendEntry, Panel, Shape, Swatch, color};
use crate::stats::MeanCi;
use crate::suite::{Row, Suite};
use crate::table::{Table, diff_text};

/// A run's numeric settings: `(dotted path, value)` in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings(pub Vec<(String, f64)>);

impl Settings {
    /// The value at `path`.
    pub fn get(&self, path: &str) -> Option<f64> {
        self.0.iter().find(|(p, _)| p == path).map(|(_, v)| *v)
    }
}

/// Whether two settings' values are the same number (up to rounding in the last digits).
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Number of different values among `vals`.
fn distinct(vals: impl IntoIterator<Item = f64>) -> usize {
    let mut v: Vec<f64> = vals.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v.dedup_by(|a, b| same(*a, *b));
    v.len()
}

/// A value as written in a label or the table: 7 significant digits, no trailing zeros
/// (`0.69`, `2`, `0.565`).
pub fn num(v: f64) -> String {
    let rounded: f64 = format!("{v:.6e}").parse().unwrap_or(v);
    format!("{rounded}")
}

// ---------------------------------------------------------------------------------------------
// resolved.ron → settings

fn flatten(v: &ron::Value, path: &str, out: &mut Vec<(String, f64)>) {
    use ron::Value;
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Number(n) => {
            let x = n.into_f64();
            if !path.is_empty() && x.is_finite() {
                out.push((path.to_string(), x));
            }
        }
        Value::Option(Some(inner)) => flatten(inner, path, out),
        Value::Seq(items) => {
            for (i, it) in items.iter().enumerate() {
                flatten(it, &join(&i.to_string()), out);
            }
        }
        Value::Map(fields) => {
            for (k, it) in fields.iter() {
                if let Value::String(k) = k {
                    flatten(it, &join(k), out);
                }
            }
        }
        _ => {}
    }
}

/// A `resolved.ron` text as the `ron` crate's untyped [`ron::Value`] (newtype variants
/// unwrapped, as the experiment files write them); an error names the line and column where
/// the text stops being RON.
pub(crate) fn parse_resolved(text: &str) -> Result<ron::Value, String> {
    ron::Options::default()
        .with_default_extension(ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES)
        .from_str(text)
        .map_err(|e| {
            format!(
                "line {}, column {}: {}",
                e.position.line, e.position.col, e.code
            )
        })
}

/// The numeric settings of a `resolved.ron` text (see the module docs for the paths), read
/// with `parse_resolved`.
pub fn parse_settings(text: &str) -> Result<Settings, String> {
    let v = parse_resolved(text)?;
    let mut out = Vec::new();
    match &v {
        ron::Value::Map(fields) => {
            for (k, it) in fields.iter() {
                if let ron::Value::String(k) = k
                    && k != "name"
                    && k != "seeds"
                {
                    flatten(it, k, &mut out);
                }
            }
        }
        other => flatten(other, "", &mut out),
    }
    Ok(Settings(out))
}

// ---------------------------------------------------------------------------------------------
// Detection

/// What [`detect`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    /// Paths whose values differ among the rows, in file order.
    pub varying: Vec<String>,
    /// The varying paths grouped into co-varying sets (each path in exactly one).
    pub groups: Vec<Vec<String>>,
    /// The sweep's group, when one is chosen.
    pub sweep: Option<Vec<String>>,
    /// Why there is no sweep although settings vary (ambiguous, or a `"sweep"` that does not
    /// vary).
    pub warning: Option<String>,
}

/// The mean of `group`'s values on `row`, when it has all of them.
pub fn group_value(row: &Settings, group: &[String]) -> Option<f64> {
    let vs: Option<Vec<f64>> = group.iter().map(|p| row.get(p)).collect();
    let vs = vs?;
    (!vs.is_empty()).then(|| vs.iter().sum::<f64>() / vs.len() as f64)
}

/// Whether two varying paths (their values per row) move together: present on the same rows,
/// equal on more than half of them, the equal rows taking at least two values.
fn linked(a: &[Option<f64>], b: &[Option<f64>]) -> bool {
    if a.iter().zip(b).any(|(x, y)| x.is_some() != y.is_some()) {
        return false;
    }
    let present: Vec<(f64, f64)> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| Some(((*x)?, (*y)?)))
        .collect();
    let equal: Vec<f64> = present
        .iter()
        .filter(|(x, y)| same(*x, *y))
        .map(|(x, _)| *x)
        .collect();
    2 * equal.len() > present.len() && distinct(equal) >= 2
}

fn find(parent: &mut [usize], i: usize) -> usize {
    let mut r = i;
    while parent[r] != r {
        r = parent[r];
    }
    parent[i] = r;
    r
}

/// `a = b (k values on n rows)` of a group.
fn describe(rows: &[Settings], g: &[String]) -> String {
    let xs: Vec<f64> = rows.iter().filter_map(|r| group_value(r, g)).collect();
    format!(
        "`{}` ({} values on {} rows)",
        g.join(" = "),
        distinct(xs.iter().copied()),
        xs.len()
    )
}

/// Finds the swept setting among `rows` (the settings of the rows that have a baseline), or the
/// one `choice` names (`suite.json`'s `"sweep"`). The rule is in the module docs.
pub fn detect(rows: &[Settings], choice: Option<&str>) -> Detection {
    let mut paths: Vec<&str> = Vec::new();
    for r in rows {
        for (p, _) in &r.0 {
            if !paths.contains(&p.as_str()) {
                paths.push(p);
            }
        }
    }
    let column = |p: &str| -> Vec<Option<f64>> { rows.iter().map(|r| r.get(p)).collect() };
    let (varying, cols): (Vec<String>, Vec<Vec<Option<f64>>>) = paths
        .iter()
        .map(|p| (p.to_string(), column(p)))
        .filter(|(_, c)| {
            let vs: Vec<f64> = c.iter().flatten().copied().collect();
            vs.len() >= 2 && distinct(vs) >= 2
        })
        .unzip();
    let n = varying.len();
    let mut parent: Vec<usize> = (0..n).collect();
    for a in 0..n {
        for b in a + 1..n {
            if linked(&cols[a], &cols[b]) {
                let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                parent[ra.max(rb)] = ra.min(rb);
            }
        }
    }
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for (i, path) in varying.iter().enumerate() {
        let r = find(&mut parent, i);
        match roots.iter().position(|&x| x == r) {
            Some(k) => groups[k].push(path.clone()),
            None => {
                roots.push(r);
                groups.push(vec![path.clone()]);
            }
        }
    }
    let (sweep, warning) = match choice {
        Some(c) => match groups.iter().find(|g| g.iter().any(|p| p == c)) {
            Some(g) => (Some(g.clone()), None),
            None => (
                None,
                Some(format!(
                    "no sweep figure: suite.json's \"sweep\": \"{c}\" is not a numeric setting whose value differs among the rows that have a baseline (those that do: {})",
                    if varying.is_empty() {
                        "none".to_string()
                    } else {
                        varying
                            .iter()
                            .map(|p| format!("`{p}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )),
            ),
        },
        None if groups.is_empty() => (None, None),
        None => {
            let score = |g: &Vec<String>| {
                let xs: Vec<f64> = rows.iter().filter_map(|r| group_value(r, g)).collect();
                (distinct(xs.iter().copied()), xs.len())
            };
            let scores: Vec<(usize, usize)> = groups.iter().map(score).collect();
            let best = scores.iter().copied().max().unwrap_or_default();
            let top: Vec<usize> = (0..groups.len()).filter(|&i| scores[i] == best).collect();
            if let [one] = top[..] {
                (Some(groups[one].clone()), None)
            } else {
                let named: Vec<String> = top.iter().map(|&i| describe(rows, &groups[i])).collect();
                (
                    None,
                    Some(format!(
                        "no sweep figure: several numeric settings vary across the rows that have a baseline and none takes more values on more rows: {}; name the one to plot against in suite.json, e.g. \"sweep\": \"{}\"",
                        named.join(", "),
                        groups[top[0]][0]
                    )),
                )
            }
        }
    };
    Detection {
        varying,
        groups,
        sweep,
        warning,
    }
}

// ---------------------------------------------------------------------------------------------
// Points

/// One row on the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    /// Index of the row in the settings given to [`points`].
    pub row: usize,
    /// Where it is drawn: the mean of the sweep's paths' values.
    pub x: f64,
    /// The sweep's paths' values on this row, in the group's order.
    pub values: Vec<f64>,
    /// Whether those values differ (so x is their mean, not their common value).
    pub grouped_differ: bool,
    /// The other varying settings in which this row differs from most sweep rows
    /// (`reward.lambda = 2`, or `path unset`).
    pub others: Vec<String>,
}

impl SweepPoint {
    /// Whether the point is on the line (differs from the others in the swept setting alone).
    pub fn on_line(&self) -> bool {
        !self.grouped_differ && self.others.is_empty()
    }

    /// What sets it apart: `judge.p_pos = 0.69, judge.p_neg = 0.44; reward.lambda = 2`; empty
    /// for a point on the line.
    pub fn label(&self, group: &[String]) -> String {
        let mut parts = Vec::new();
        if self.grouped_differ {
            parts.push(
                group
                    .iter()
                    .zip(&self.values)
                    .map(|(p, v)| format!("{p} = {}", num(*v)))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
        parts.extend(self.others.iter().cloned());
        parts.join("; ")
    }
}

/// The most common of `vals` (earliest on ties; absent counts as a value).
fn mode(vals: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut counts: Vec<(Option<f64>, usize)> = Vec::new();
    for v in vals {
        let hit = counts.iter_mut().find(|(c, _)| match (c, v) {
            (Some(a), Some(b)) => same(*a, b),
            (None, None) => true,
            _ => false,
        });
        match hit {
            Some(e) => e.1 += 1,
            None => counts.push((v, 1)),
        }
    }
    let mut best: Option<(Option<f64>, usize)> = None;
    for (v, n) in counts {
        if best.is_none_or(|(_, b)| n > b) {
            best = Some((v, n));
        }
    }
    best.and_then(|(v, _)| v)
}

/// The points of the rows that have every path of `group`, with what sets each apart among the
/// `varying` paths outside the group.
pub fn points(rows: &[Settings], group: &[String], varying: &[String]) -> Vec<SweepPoint> {
    let on: Vec<usize> = (0..rows.len())
        .filter(|&i| group_value(&rows[i], group).is_some())
        .collect();
    let others: Vec<&String> = varying.iter().filter(|p| !group.contains(p)).collect();
    let modes: Vec<Option<f64>> = others
        .iter()
        .map(|p| mode(on.iter().map(|&i| rows[i].get(p))))
        .collect();
    on.iter()
        .filter_map(|&i| {
            let values: Vec<f64> = group.iter().filter_map(|p| rows[i].get(p)).collect();
            let x = group_value(&rows[i], group)?;
            let grouped_differ = values.iter().any(|v| !same(*v, values[0]));
            let others = others
                .iter()
                .zip(&modes)
                .filter_map(|(p, m)| {
                    let v = rows[i].get(p);
                    let differs = match (v, m) {
                        (Some(a), Some(b)) => !same(a, *b),
                        (None, None) => false,
                        _ => true,
                    };
                    differs.then(|| match v {
                        Some(a) => format!("{p} = {}", num(a)),
                        None => format!("{p} unset"),
                    })
                })
                .collect();
            Some(SweepPoint {
                row: i,
                x,
                values,
                grouped_differ,
                others,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The figure

/// The sweep figure of a suite (if it sweeps a setting) and what the report should warn about.
pub(crate) struct SweepPlan {
    pub figure: Option<Planned>,
    pub warnings: Vec<String>,
}

/// A row's settings: its first run's readable `resolved.ron`; unreadable files and runs that
/// differ are warned about.
fn row_settings(row: &Row, warnings: &mut Vec<String>) -> Option<Settings> {
    let mut first: Option<(Settings, String)> = None;
    let mut differ_warned = false;
    for r in &row.runs {
        let Some(text) = &r.resolved else {
            continue;
        };
        match parse_settings(text) {
            Ok(s) => match &first {
                None => first = Some((s, r.label())),
                Some((f, label)) if *f != s && !differ_warned => {
                    let diff: Vec<String> =
                        s.0.iter()
                            .filter(|(p, v)| f.get(p).is_none_or(|w| !same(w, *v)))
                            .map(|(p, _)| format!("`{p}`"))
                            .take(3)
                            .collect();
                    warnings.push(format!(
                        "`{}`: {} and {label} have different settings in resolved.ron ({}); the sweep figure uses {label}'s",
                        row.experiment,
                        r.label(),
                        if diff.is_empty() {
                            "paths".to_string()
                        } else {
                            diff.join(", ")
                        }
                    ));
                    differ_warned = true;
                }
                Some(_) => {}
            },
            Err(e) => warnings.push(format!(
                "{}: not readable as RON ({e}); this run is left out of the sweep figure",
                r.dir.join("resolved.ron").display()
            )),
        }
    }
    first.map(|(s, _)| s)
}

/// The sweep figure of `suite`, if its rows sweep one setting (module docs).
pub(crate) fn plan(suite: &Suite) -> SweepPlan {
    let mut warnings = Vec::new();
    let all: Vec<Option<Settings>> = suite
        .rows
        .iter()
        .map(|r| row_settings(r, &mut warnings))
        .collect();
    let has_base = |r: &Row| r.baseline.as_deref().and_then(|b| suite.row(b)).is_some();
    let (idx, settings): (Vec<usize>, Vec<Settings>) = suite
        .rows
        .iter()
        .enumerate()
        .filter(|(_, r)| has_base(r))
        .filter_map(|(i, _)| Some((i, all[i].clone()?)))
        .unzip();
    let d = detect(&settings, suite.sweep.as_deref());
    warnings.extend(d.warning.clone());
    let Some(group) = d.sweep.clone() else {
        return SweepPlan {
            figure: None,
            warnings,
        };
    };
    let pts = points(&settings, &group, &d.varying);
    let ctx = Ctx {
        suite,
        table: Table::build(suite),
        group,
        // Suite row index of each point.
        rows: pts.iter().map(|p| idx[p.row]).collect(),
        pts,
        all,
        named: suite.sweep.is_some(),
    };
    SweepPlan {
        figure: Some(ctx.planned()),
        warnings,
    }
}

/// Everything the figure is drawn from.
struct Ctx<'a> {
    suite: &'a Suite,
    table: Table,
    group: Vec<String>,
    pts: Vec<SweepPoint>,
    /// Suite row index of each point.
    rows: Vec<usize>,
    /// Every suite row's settings.
    all: Vec<Option<Settings>>,
    /// Whether suite.json named the sweep.
    named: bool,
}

/// How a point is drawn: on the line, grouped values differ, another setting differs.
fn style(p: &SweepPoint) -> (RgbKind, Shape) {
    if p.grouped_differ {
        (RgbKind::Grouped, Shape::Diamond)
    } else if !p.others.is_empty() {
        (RgbKind::Other, Shape::Square)
    } else {
        (RgbKind::Line, Shape::Circle)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RgbKind {
    Line,
    Grouped,
    Other,
}

impl RgbKind {
    fn color(self) -> plotters::style::RGBColor {
        match self {
            RgbKind::Line => color(0),
            RgbKind::Grouped => color(1),
            RgbKind::Other => color(4),
        }
    }
}

/// The two panels' metric keys and titles.
const PANELS: [(&str, &str); 2] = [
    ("eval/acc_id", "in-domain: Δ eval/acc_id"),
    ("eval/acc_ood", "out-of-domain: Δ eval/acc_ood"),
];

impl Ctx<'_> {
    fn label(&self) -> String {
        self.group.join(" = ")
    }

    fn column(&self, key: &str) -> Option<usize> {
        self.table
            .columns
            .iter()
            .position(|c| c.keys.contains(&key))
    }

    /// The paired difference of point `k` in column `col`.
    fn diff(&self, k: usize, col: Option<usize>) -> Option<MeanCi> {
        self.table.rows[self.rows[k]].diffs[col?]
    }

    fn baselines(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for &r in &self.rows {
            if let Some(b) = &self.suite.rows[r].baseline
                && !out.contains(b)
            {
                out.push(b.clone());
            }
        }
        out
    }

    fn baseline_text(&self) -> String {
        match &self.baselines()[..] {
            [one] => format!("`{one}`"),
            many => format!(
                "each row's own baseline ({})",
                many.iter()
                    .map(|b| format!("`{b}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn x_range(&self) -> (f64, f64) {
        let lo = self.pts.iter().map(|p| p.x).fold(f64::INFINITY, f64::min);
        let hi = self
            .pts
            .iter()
            .map(|p| p.x)
            .fold(f64::NEG_INFINITY, f64::max);
        let pad = if hi > lo {
            0.08 * (hi - lo)
        } else {
            0.1 * lo.abs().max(1.0)
        };
        (lo - pad, hi + pad)
    }

    fn panel(&self, key: &str, title: &str) -> Panel {
        let col = self.column(key);
        let (x0, x1) = self.x_range();
        let mid = 0.5 * (x0 + x1);
        let mut layers = vec![Layer::HLine {
            color: GREY,
            y: 0.0,
        }];
        let data: Vec<(&SweepPoint, MeanCi)> = self
            .pts
            .iter()
            .enumerate()
            .filter_map(|(k, p)| Some((p, self.diff(k, col)?)))
            .collect();
        // A point set apart at the x of another is drawn a little to its right.
        let dodge = 0.015 * (x1 - x0);
        let mut xs: Vec<f64> = Vec::new();
        let data: Vec<(SweepPoint, MeanCi)> = data
            .into_iter()
            .map(|(p, d)| {
                let mut p = p.clone();
                if !p.on_line() {
                    let taken = |x: f64| {
                        xs.iter().any(|&o| same(o, x))
                            || self.pts.iter().any(|q| q.on_line() && same(q.x, x))
                    };
                    while taken(p.x) {
                        p.x += dodge;
                    }
                }
                xs.push(p.x);
                (p, d)
            })
            .collect();
        let mut line: Vec<(f64, f64)> = data
            .iter()
            .filter(|(p, _)| p.on_line())
            .map(|(p, d)| (p.x, d.mean))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        if line.len() > 1 {
            layers.push(Layer::Line {
                color: RgbKind::Line.color(),
                points: line,
                dashed: false,
                dots: false,
            });
        }
        for kind in [RgbKind::Line, RgbKind::Grouped, RgbKind::Other] {
            let mine: Vec<&(SweepPoint, MeanCi)> =
                data.iter().filter(|(p, _)| style(p).0 == kind).collect();
            if mine.is_empty() {
                continue;
            }
            let c = kind.color();
            layers.push(Layer::ErrorBars {
                color: c,
                bars: mine
                    .iter()
                    .filter_map(|(p, d)| {
                        Some((p.x, d.mean - d.half_width?, d.mean + d.half_width?))
                    })
                    .collect(),
            });
            layers.push(Layer::Markers {
                color: c,
                shape: style(&mine[0].0).1,
                points: mine.iter().map(|(p, d)| (p.x, d.mean)).collect(),
            });
            if kind != RgbKind::Line {
                layers.push(Layer::Labels {
                    color: c,
                    labels: mine
                        .iter()
                        .map(|(p, d)| Label {
                            x: p.x,
                            y: d.mean,
                            text: p.label(&self.group),
                            left: p.x > mid,
                            below: false,
                        })
                        .collect(),
                });
            }
        }
        let missing: Vec<String> = self
            .pts
            .iter()
            .enumerate()
            .filter(|(k, _)| self.diff(*k, col).is_none())
            .map(|(k, _)| self.suite.rows[self.rows[k]].experiment.clone())
            .collect();
        Panel {
            title: title.to_string(),
            x_label: self.label(),
            y_label: "Δ accuracy (row − baseline)".into(),
            x_range: Some((x0, x1)),
            y_range: None,
            message: data.is_empty().then(|| {
                format!("no paired difference of {key} (no row and baseline both log it)")
            }),
            note: (!missing.is_empty() && !data.is_empty())
                .then(|| format!("no paired {key}: {}", missing.join(", "))),
            layers,
        }
    }

    fn legend(&self) -> Vec<LegendEntry> {
        let has = |k: RgbKind| self.pts.iter().any(|p| style(p).0 == k);
        let mut l = Vec::new();
        if has(RgbKind::Line) {
            l.push(LegendEntry {
                swatch: Swatch::Line(RgbKind::Line.color()),
                label: "differs in this setting only (joined in x order)".into(),
            });
        }
        if has(RgbKind::Grouped) {
            l.push(LegendEntry {
                swatch: Swatch::Marker(RgbKind::Grouped.color(), Shape::Diamond),
                label: "grouped settings differ: at their mean".into(),
            });
        }
        if has(RgbKind::Other) {
            l.push(LegendEntry {
                swatch: Swatch::Marker(RgbKind::Other.color(), Shape::Square),
                label: "another setting differs".into(),
            });
        }
        l.push(LegendEntry {
            swatch: Swatch::Dashed(GREY),
            label: format!("0 = baseline: {}", self.baseline_text().replace('`', "")),
        });
        l
    }

    fn caption(&self) -> String {
        let label = self.label();
        let how = if self.named {
            "named by suite.json's `\"sweep\"`".to_string()
        } else {
            "found as the numeric setting in the runs' resolved.ron that varies across the rows with a baseline; another can be named in suite.json as `\"sweep\": \"<path>\"`".to_string()
        };
        let mut c = format!(
            "Sweep of `{label}` ({how}): each row's paired difference to its baseline (row − baseline: each run's final evaluation, over the seeds both rows have, as in the ablation table's paired differences) of in-domain (`eval/acc_id`, left) and out-of-domain (`eval/acc_ood`, right) accuracy. Points: mean over the paired seeds; bars: 95% CI of the mean (Student t; no bar where a single seed is paired). The dashed line at 0 is the baseline, {}.",
            self.baseline_text()
        );
        if self.group.len() > 1 {
            c += &format!(
                " {} take equal values on most rows and are drawn as one axis.",
                self.group
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            );
        }
        c += " Circles joined by the line: rows that differ from the others in this setting only, in x order.";
        if self.pts.iter().any(|p| p.grouped_differ) {
            c += " Rows whose grouped settings differ are drawn at their mean, marked (◆) and labelled with their values";
            if self.group.len() == 2
                && self.group.iter().any(|p| p.ends_with("p_pos"))
                && self.group.iter().any(|p| p.ends_with("p_neg"))
            {
                c += " (for p⁺ and p⁻ the mean is the judge's balanced accuracy)";
            }
            c += ".";
        }
        if self
            .pts
            .iter()
            .any(|p| !p.grouped_differ && !p.others.is_empty())
        {
            c += " Rows that also differ from the others in another setting are drawn apart (■), labelled with it, and not joined; a point set apart at the x of another is drawn slightly to its right.";
        }
        let on_sweep: Vec<String> = self
            .rows
            .iter()
            .filter_map(|&r| {
                let row = &self.suite.rows[r];
                let b = row.baseline.as_deref()?;
                let bi = self.suite.rows.iter().position(|x| x.experiment == b)?;
                let bs = self.all[bi].as_ref()?;
                group_value(bs, &self.group).map(|_| format!("`{}` (to `{b}`)", row.experiment))
            })
            .collect();
        if !on_sweep.is_empty() {
            c += &format!(
                " Careful: these rows' baseline is itself on the sweep, so their difference is between two settings: {}; a common baseline can be named per row in suite.json.",
                on_sweep.join(", ")
            );
        }
        c
    }

    /// The figure's numbers, one row per point in x order.
    fn markdown(&self) -> String {
        let label = self.label();
        let mut md = format!(
            "| experiment | baseline | `{label}` | what else differs | seeds paired | Δ acc ID | Δ acc OOD |\n|---|---|---:|---|---|---:|---:|\n"
        );
        let mut order: Vec<usize> = (0..self.pts.len()).collect();
        order.sort_by(|&a, &b| {
            self.pts[a]
                .x
                .total_cmp(&self.pts[b].x)
                .then(self.rows[a].cmp(&self.rows[b]))
        });
        for k in order {
            let p = &self.pts[k];
            let t = &self.table.rows[self.rows[k]];
            let seeds = if t.shared_seeds.is_empty() {
                "none".to_string()
            } else {
                t.shared_seeds
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let cell = |key: &str| {
                let Some(col) = self.column(key) else {
                    return "–".to_string();
                };
                t.diffs[col].map_or_else(
                    || "–".to_string(),
                    |d| diff_text(&d, &self.table.columns[col], t.shared_seeds.len()),
                )
            };
            let other = p.label(&self.group);
            md += &format!(
                "| {} | {} | {} | {} | {seeds} | {} | {} |\n",
                t.experiment,
                t.baseline.as_deref().unwrap_or("–"),
                num(p.x),
                if other.is_empty() { "–" } else { &other },
                cell(PANELS[0].0),
                cell(PANELS[1].0),
            );
        }
        md += "\nΔ: mean ± half-width of the 95% confidence interval over the paired seeds (as in the ablation table's paired differences); the x value of a row whose grouped settings differ is their mean.\n";
        md
    }

    fn planned(&self) -> Planned {
        let label = self.label();
        Planned {
            section: Section::Eval,
            stem: "sweep".into(),
            figure: Figure {
                title: format!("Sweep: Δ evaluation accuracy against {label}"),
                cols: 2,
                panel: (480, 400),
                panels: PANELS.iter().map(|(k, t)| self.panel(k, t)).collect(),
                legend: self.legend(),
            },
            caption: self.caption(),
            after: Some(self.markdown()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pairs: &[(&str, f64)]) -> Settings {
        Settings(pairs.iter().map(|(p, v)| (p.to_string(), *v)).collect())
    }

    /// A household-like experiment as the trainer writes it (ron 0.10, struct names, newtype
    /// variants unwrapped).
    fn resolved(judge: &str, lambda: &str) -> String {
        format!(
            r#"#![enable(unwrap_variant_newtypes)]
Experiment(
    name: "household_oracle",
    seeds: [
        1,
        2,
    ],
    backend: NdArray,
    environment: Household(
        difficulty: [
            0.35,
            0.35,
        ],
        note: "a (string) with: colons, [brackets]",
    ),
    policy: PolicySpec(
        model: Scratch(
            d_model: 64,
            layers: 2,
        ),
        warm_start: WarmStartSpec(
            steps: 600,
            lr: 3e-3,
        ),
    ),
    judge: {judge},
    reward: RewardSpec(
        outcome: PlusMinus,
        lambda: {lambda},
        policy_band: (0.125, 0.875),
    ),
    baseline: Some("household_outcome_only"), // a comment
    tags: {{"k": 7}},
    budget: BudgetSpec(steps: 40, max_env_steps: 0x10),
)
"#
        )
    }

    #[test]
    fn flattening_reads_realistic_ron() {
        let got = parse_settings(&resolved(
            "Oracle(\n        p_pos: 0.69,\n        p_neg: 0.44,\n    )",
            "1.0",
        ))
        .expect("parses");
        let paths: Vec<(&str, f64)> = got.0.iter().map(|(p, v)| (p.as_str(), *v)).collect();
        assert_eq!(
            paths,
            [
                ("environment.difficulty.0", 0.35),
                ("environment.difficulty.1", 0.35),
                ("policy.model.d_model", 64.0),
                ("policy.model.layers", 2.0),
                ("policy.warm_start.steps", 600.0),
                ("policy.warm_start.lr", 0.003),
                ("judge.p_pos", 0.69),
                ("judge.p_neg", 0.44),
                ("reward.lambda", 1.0),
                ("reward.policy_band.0", 0.125),
                ("reward.policy_band.1", 0.875),
                ("tags.k", 7.0),
                ("budget.steps", 40.0),
                ("budget.max_env_steps", 16.0),
            ]
        );
        // No judge: no judge path; `name` and `seeds` are never settings.
        let none = parse_settings(&resolved("None", "2.0")).expect("parses");
        assert!(none.get("judge.p_pos").is_none());
        assert_eq!(none.get("reward.lambda"), Some(2.0));
        assert!(none.0.iter().all(|(p, _)| !p.starts_with("seeds")));
        // Broken text names its line.
        let e = parse_settings("Experiment(\n  judge: Oracle(p_pos 0.5),\n)").expect_err("bad");
        assert!(e.starts_with("line 2,"), "{e}");
        assert!(parse_settings("Experiment(a: [1, 2").is_err());
    }

    /// The household sweep: four diagonal rows, one off-diagonal, two λ rows at p = 1.
    fn household() -> Vec<Settings> {
        let row = |p: f64, n: f64, l: f64| {
            s(&[
                ("judge.p_pos", p),
                ("judge.p_neg", n),
                ("reward.lambda", l),
                ("budget.steps", 40.0),
            ])
        };
        vec![
            row(0.55, 0.55, 1.0),
            row(0.7, 0.7, 1.0),
            row(0.85, 0.85, 1.0),
            row(1.0, 1.0, 1.0),
            row(0.69, 0.44, 1.0),
            row(1.0, 1.0, 0.5),
            row(1.0, 1.0, 2.0),
        ]
    }

    #[test]
    fn co_varying_paths_are_one_axis_and_off_rows_are_set_apart() {
        let rows = household();
        let d = detect(&rows, None);
        assert_eq!(d.varying, ["judge.p_pos", "judge.p_neg", "reward.lambda"]);
        assert_eq!(
            d.groups,
            vec![
                vec!["judge.p_pos".to_string(), "judge.p_neg".to_string()],
                vec!["reward.lambda".to_string()],
            ]
        );
        // p: 5 values (0.55, 0.565, 0.7, 0.85, 1) on 7 rows beats λ: 3 values on 7 rows.
        let group = d.sweep.clone().expect("a sweep");
        assert_eq!(group, ["judge.p_pos", "judge.p_neg"]);
        assert_eq!(d.warning, None);
        let pts = points(&rows, &group, &d.varying);
        assert_eq!(pts.len(), 7);
        // The off-diagonal row is at the mean, (0.69 + 0.44) / 2 = 0.565.
        let off = &pts[4];
        assert!((off.x - 0.565).abs() < 1e-12 && off.grouped_differ && !off.on_line());
        assert_eq!(off.label(&group), "judge.p_pos = 0.69, judge.p_neg = 0.44");
        // λ = 0.5 and 2 differ from the sweep rows' usual λ = 1: apart, labelled.
        assert_eq!(pts[5].others, ["reward.lambda = 0.5"]);
        assert_eq!(pts[6].label(&group), "reward.lambda = 2");
        assert!(!pts[6].on_line() && !pts[6].grouped_differ);
        let line: Vec<f64> = pts.iter().filter(|p| p.on_line()).map(|p| p.x).collect();
        assert_eq!(line, [0.55, 0.7, 0.85, 1.0]);
    }

    #[test]
    fn detection_with_no_variation_ambiguity_and_the_override() {
        // Nothing varies: no sweep, no warning.
        let flat = vec![s(&[("a", 1.0)]), s(&[("a", 1.0)])];
        let d = detect(&flat, None);
        assert!(d.varying.is_empty() && d.sweep.is_none() && d.warning.is_none());
        // Two independent settings, each 3 values on 3 rows: ambiguous.
        let rows = vec![
            s(&[("x.a", 1.0), ("y.b", 5.0)]),
            s(&[("x.a", 2.0), ("y.b", 7.0)]),
            s(&[("x.a", 3.0), ("y.b", 6.0)]),
        ];
        let d = detect(&rows, None);
        assert_eq!(d.groups.len(), 2, "{:?}", d.groups);
        assert_eq!(d.sweep, None);
        let w = d.warning.expect("ambiguity is said");
        assert!(
            w.contains("`x.a` (3 values on 3 rows), `y.b` (3 values on 3 rows)")
                && w.contains("\"sweep\": \"x.a\""),
            "{w}"
        );
        // suite.json's "sweep" picks one; a path of a group picks the whole group.
        assert_eq!(
            detect(&rows, Some("y.b")).sweep,
            Some(vec!["y.b".to_string()])
        );
        let d = detect(&household(), Some("judge.p_neg"));
        assert_eq!(
            d.sweep,
            Some(vec!["judge.p_pos".to_string(), "judge.p_neg".to_string()])
        );
        let d = detect(&household(), Some("reward.lambda"));
        assert_eq!(d.sweep, Some(vec!["reward.lambda".to_string()]));
        // A path that does not vary: no figure, a warning naming what varies.
        let d = detect(&household(), Some("budget.steps"));
        assert_eq!(d.sweep, None);
        let w = d.warning.expect("warned");
        assert!(
            w.contains("\"budget.steps\"") && w.contains("`reward.lambda`"),
            "{w}"
        );
    }

    #[test]
    fn equal_on_one_value_only_is_not_co_varying() {
        // a = b on 3 of 4 rows, but only ever at 1: coincidence, not a group.
        let rows = vec![
            s(&[("a", 1.0), ("b", 1.0)]),
            s(&[("a", 1.0), ("b", 1.0)]),
            s(&[("a", 1.0), ("b", 1.0)]),
            s(&[("a", 3.0), ("b", 2.0)]),
        ];
        let d = detect(&rows, None);
        assert_eq!(d.groups, vec![vec!["a".to_string()], vec!["b".to_string()]]);
        // Both take 2 values on 4 rows: ambiguous.
        assert!(d.sweep.is_none() && d.warning.is_some());
        // Equal on 2 of 4 rows is not more than half.
        let rows = vec![
            s(&[("a", 1.0), ("b", 1.0)]),
            s(&[("a", 2.0), ("b", 2.0)]),
            s(&[("a", 3.0), ("b", 1.0)]),
            s(&[("a", 4.0), ("b", 2.0)]),
        ];
        let d = detect(&rows, None);
        assert_eq!(d.groups.len(), 2);
        // a: 4 values beats b: 2 values.
        assert_eq!(d.sweep, Some(vec!["a".to_string()]));
        assert_eq!(num(0.5650000000000001), "0.565");
        assert_eq!(num(2.0), "2");
    }
}
