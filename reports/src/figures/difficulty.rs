//! The difficulty figures: each experiment's task difficulty per dimension over training, one
//! line per seed, with the proposals accepted and rejected — from `adaptation.jsonl` where a
//! run has it, else from `env/difficulty/<dim>` in its metrics.

use super::{Planned, STEP, Section, file_safe};
use crate::plot::{Figure, GREEN, GREY, Layer, LegendEntry, Panel, RED, Shape, Swatch, color};
use crate::runs::{AdaptationStep, Run, Verdict};
use crate::suite::{Row, Suite};
use plotters::style::RGBColor;
use std::collections::BTreeMap;

/// Seed colours: the palette without green and red (kept for accepted/rejected).
fn seed_color(i: usize) -> RGBColor {
    const IDX: [usize; 8] = [0, 1, 4, 5, 6, 9, 8, 7];
    color(IDX[i % IDX.len()])
}

/// One run's difficulty data, whichever source it comes from.
struct DifficultyData {
    dims: Vec<String>,
    /// Per dim: (step, mean, min, max) over slots.
    curves: Vec<Vec<(f64, f64, f64, f64)>>,
    /// Per dim: accepted (point, shape) and rejected points.
    accepted: Vec<Vec<((f64, f64), Shape)>>,
    rejected: Vec<Vec<(f64, f64)>>,
    from_adaptation: bool,
}

fn difficulty_from_adaptation(steps: &[AdaptationStep]) -> DifficultyData {
    let k = steps
        .iter()
        .map(|s| s.dims.len().max(s.slots.first().map_or(0, Vec::len)))
        .max()
        .unwrap_or(0);
    let named = steps
        .iter()
        .find(|s| !s.dims.is_empty())
        .map(|s| s.dims.clone());
    let dims = (0..k)
        .map(|d| {
            named
                .as_ref()
                .and_then(|n| n.get(d).cloned())
                .unwrap_or_else(|| format!("dim {d}"))
        })
        .collect();
    let mut data = DifficultyData {
        dims,
        curves: vec![Vec::new(); k],
        accepted: vec![Vec::new(); k],
        rejected: vec![Vec::new(); k],
        from_adaptation: true,
    };
    for s in steps {
        let x = s.step as f64;
        for d in 0..k {
            let vals: Vec<f64> = s
                .slots
                .iter()
                .filter_map(|slot| slot.get(d).copied().flatten())
                .filter(|v| v.is_finite())
                .collect();
            if !vals.is_empty() {
                let mean = vals.iter().sum::<f64>() / vals.len() as f64;
                let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                data.curves[d].push((x, mean, lo, hi));
            }
        }
        for p in &s.proposals {
            for d in 0..k {
                let (Some(Some(from)), Some(Some(to))) = (p.from.get(d), p.to.get(d)) else {
                    continue;
                };
                if (to - from).abs() < 1e-12 {
                    continue;
                }
                match p.verdict {
                    Verdict::Accepted => {
                        let shape = if to > from { Shape::Up } else { Shape::Down };
                        data.accepted[d].push(((x, *to), shape));
                    }
                    Verdict::Rejected => data.rejected[d].push((x, *to)),
                    Verdict::Pending => {}
                }
            }
        }
    }
    data
}

/// The environment's dimension order, where some run of the suite records it
/// (`adaptation.jsonl` dims or posterior names); metrics keys alone are alphabetical.
fn dim_order(suite: &Suite) -> Vec<String> {
    let from_adaptation = suite.runs().find_map(|r| {
        r.adaptation
            .as_ref()?
            .iter()
            .find(|s| !s.dims.is_empty())
            .map(|s| s.dims.clone())
    });
    let from_posterior = || {
        suite.runs().find_map(|r| {
            r.posterior
                .as_ref()?
                .iter()
                .find(|s| !s.names.is_empty())
                .map(|s| s.names.clone())
        })
    };
    from_adaptation.or_else(from_posterior).unwrap_or_default()
}

fn difficulty_from_metrics(run: &Run, order: &[String]) -> Option<DifficultyData> {
    const PREFIX: &str = "env/difficulty/";
    let mut names: Vec<String> = Vec::new();
    for l in &run.lines {
        for k in l.values.keys() {
            if let Some(n) = k.strip_prefix(PREFIX)
                && !names.iter().any(|x| x == n)
            {
                names.push(n.to_string());
            }
        }
    }
    if names.is_empty() {
        return None;
    }
    // Known dimensions in the environment's order, then any other alphabetically.
    names.sort_by_key(|n| order.iter().position(|o| o == n).unwrap_or(usize::MAX));
    let k = names.len();
    let mut data = DifficultyData {
        dims: names.clone(),
        curves: vec![Vec::new(); k],
        accepted: vec![Vec::new(); k],
        rejected: vec![Vec::new(); k],
        from_adaptation: false,
    };
    let rises = |key: &str| -> Vec<u64> {
        run.series(key)
            .windows(2)
            .filter(|w| w[1].1 > w[0].1)
            .map(|w| w[1].0)
            .collect()
    };
    let (acc, rej) = (rises("env/accepted"), rises("env/rejected"));
    for (d, name) in names.iter().enumerate() {
        let series: BTreeMap<u64, f64> =
            run.series(&format!("{PREFIX}{name}")).into_iter().collect();
        data.curves[d] = series.iter().map(|(&s, &v)| (s as f64, v, v, v)).collect();
        // An accepted proposal moves a slot, so the mean moves on the dimension(s) it changed:
        // mark it there only. A rejected one moves nothing: its dimension is unknown, so it is
        // marked on every dimension.
        let moved = |s: &u64| {
            let now = series.get(s)?;
            let before = series.range(..*s).next_back()?.1;
            ((now - before).abs() > 1e-12).then_some(*now)
        };
        data.accepted[d] = acc
            .iter()
            .filter_map(|s| Some(((*s as f64, moved(s)?), Shape::Circle)))
            .collect();
        data.rejected[d] = rej
            .iter()
            .filter_map(|s| Some((*s as f64, *series.get(s)?)))
            .collect();
    }
    Some(data)
}

pub(super) fn difficulty_figures(suite: &Suite) -> Vec<Planned> {
    let order = dim_order(suite);
    let mut out = Vec::new();
    for row in &suite.rows {
        let data: Vec<(&Run, DifficultyData)> = row
            .runs
            .iter()
            .filter_map(|r| {
                let d = match &r.adaptation {
                    Some(a) if !a.is_empty() => Some(difficulty_from_adaptation(a)),
                    _ => difficulty_from_metrics(r, &order),
                }?;
                Some((r, d))
            })
            .collect();
        if let Some(p) = difficulty_figure(row, &data) {
            out.push(p);
        }
    }
    if out.is_empty() {
        out.push(Planned {
            section: Section::Difficulty,
            stem: "difficulty".into(),
            figure: Figure {
                title: "Difficulty over training".into(),
                cols: 1,
                panel: (900, 300),
                panels: vec![Panel {
                    title: "difficulty".into(),
                    message: Some(
                        "no run has adaptation.jsonl or env/difficulty/<dim> in metrics.jsonl"
                            .into(),
                    ),
                    ..Panel::default()
                }],
                legend: vec![],
            },
            caption: "No difficulty was logged by any run.".into(),
            after: None,
        });
    }
    out
}

fn difficulty_figure(row: &Row, data: &[(&Run, DifficultyData)]) -> Option<Planned> {
    let dims = data.first()?.1.dims.clone();
    let any_adaptation = data.iter().any(|(_, d)| d.from_adaptation);
    let all_adaptation = data.iter().all(|(_, d)| d.from_adaptation);
    let mut panels = Vec::new();
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for (di, name) in dims.iter().enumerate() {
        let mut layers = Vec::new();
        // Every seed's proposals in one layer per kind of marker, drawn over all the seeds'
        // lines: markers of one kind are the same whatever the seed, so one drawn over
        // another at the same pixel is drawn once (a suite of five adapted seeds proposes
        // the same value at the same step over and over).
        let mut accepted: Vec<(Shape, Vec<(f64, f64)>)> = [Shape::Up, Shape::Down, Shape::Circle]
            .map(|s| (s, Vec::new()))
            .into();
        let mut rejected = Vec::new();
        for (si, (_, d)) in data.iter().enumerate() {
            let Some(j) = d.dims.iter().position(|n| n == name) else {
                continue;
            };
            let c = seed_color(si);
            let curve = &d.curves[j];
            for &(_, m, a, b) in curve {
                lo = lo.min(a).min(m);
                hi = hi.max(b).max(m);
            }
            if d.from_adaptation {
                layers.push(Layer::Band {
                    color: c,
                    segments: vec![curve.iter().map(|&(x, _, a, b)| (x, a, b)).collect()],
                });
            }
            layers.push(Layer::Line {
                color: c,
                points: curve.iter().map(|&(x, m, _, _)| (x, m)).collect(),
                dashed: false,
                dots: false,
            });
            for (shape, pts) in &mut accepted {
                pts.extend(
                    d.accepted[j]
                        .iter()
                        .filter(|(_, s)| s == shape)
                        .map(|(p, _)| *p),
                );
            }
            rejected.extend_from_slice(&d.rejected[j]);
        }
        for (shape, points) in accepted.into_iter().filter(|(_, p)| !p.is_empty()) {
            layers.push(Layer::Markers {
                color: GREEN,
                shape,
                points,
            });
        }
        layers.push(Layer::Markers {
            color: RED,
            shape: Shape::Cross,
            points: rejected,
        });
        panels.push(Panel {
            title: name.clone(),
            x_label: STEP.into(),
            y_label: "difficulty (0 easy – 1 hard)".into(),
            layers,
            note: (di == 0 && !all_adaptation)
                .then(|| "from env/difficulty/* (no adaptation.jsonl): slot mean only".into()),
            ..Panel::default()
        });
    }
    for p in &mut panels {
        // A little room so that lines at exactly 0 or 1 are not hidden by the axes.
        p.y_range = Some((lo.min(0.0) - 0.04, hi.max(1.0) + 0.04));
    }
    let mut legend: Vec<LegendEntry> = data
        .iter()
        .enumerate()
        .map(|(si, (r, _))| LegendEntry {
            swatch: Swatch::Line(seed_color(si)),
            label: r.seed.map_or_else(|| r.label(), |s| format!("seed {s}")),
        })
        .collect();
    let any_accepted = |pred: fn(&DifficultyData) -> bool| {
        data.iter()
            .any(|(_, d)| pred(d) && d.accepted.iter().any(|a| !a.is_empty()))
    };
    if any_adaptation {
        legend.push(LegendEntry {
            swatch: Swatch::Band(GREY),
            label: "slot min–max".into(),
        });
    }
    if any_accepted(|d| d.from_adaptation) {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(GREEN, Shape::Up),
            label: "accepted ▲ harder ▼ easier".into(),
        });
    }
    if any_accepted(|d| !d.from_adaptation) {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(GREEN, Shape::Circle),
            label: "accepted (env/accepted rose)".into(),
        });
    }
    if data
        .iter()
        .any(|(_, d)| d.rejected.iter().any(|r| !r.is_empty()))
    {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(RED, Shape::Cross),
            label: "rejected".into(),
        });
    }
    let source = if all_adaptation {
        "from adaptation.jsonl: line = mean over the task slots, band = min–max over slots; markers at the step a proposal was resolved, at the proposed value, on each dimension it changed"
    } else if any_adaptation {
        "from adaptation.jsonl where a run has it, else from env/difficulty/<dim> (mean over slots only, markers at the steps where env/accepted or env/rejected rose)"
    } else {
        "from env/difficulty/<dim> in metrics.jsonl (adaptation.jsonl absent): the mean over slots only, no spread; markers at the steps where the cumulative env/accepted or env/rejected count rose, an acceptance on the dimension(s) whose mean moved, a rejection (dimension unknown) on every dimension"
    };
    let cols = dims.len().clamp(1, 3);
    Some(Planned {
        section: Section::Difficulty,
        stem: format!("difficulty_{}", file_safe(&row.experiment)),
        figure: Figure {
            title: format!("Difficulty over training — {}", row.experiment),
            cols,
            panel: (330, 330),
            panels,
            legend,
        },
        caption: format!(
            "`{}`: task difficulty per dimension (0 = easiest, 1 = hardest), one line per seed (identical seeds draw over each other), {source}; the markers of every seed drawn over the lines.",
            row.experiment
        ),
        after: None,
    })
}
