//! The posterior figures: per run with `posterior.jsonl`, the Gaussian-process proposer's
//! predicted accuracy along each difficulty dimension at up to three eval steps.

use super::{Planned, Section, file_safe};
use crate::plot::{Figure, GREEN, GREY, Layer, LegendEntry, Panel, Shape, Swatch, color};
use crate::runs::{PosteriorSnapshot, Run};
use crate::suite::Suite;

/// The snapshots to show: all if at most 3, else the first, middle and last.
fn pick_snapshots(snaps: &[PosteriorSnapshot]) -> Vec<&PosteriorSnapshot> {
    if snaps.len() <= 3 {
        snaps.iter().collect()
    } else {
        vec![&snaps[0], &snaps[snaps.len() / 2], &snaps[snaps.len() - 1]]
    }
}

pub(super) fn posterior_figures(suite: &Suite) -> Vec<Planned> {
    suite
        .runs()
        .filter_map(|r| {
            let snaps = r.posterior.as_ref().filter(|p| !p.is_empty())?;
            Some(posterior_figure(r, snaps))
        })
        .collect()
}

fn dim_name(run: &Run, snap: &PosteriorSnapshot, d: usize) -> String {
    snap.names
        .get(d)
        .cloned()
        .or_else(|| {
            run.adaptation
                .as_ref()?
                .iter()
                .find_map(|s| s.dims.get(d).cloned())
        })
        .unwrap_or_else(|| format!("dim {d}"))
}

fn posterior_panel(run: &Run, snap: &PosteriorSnapshot, slice_i: usize) -> Panel {
    let blue = color(0);
    let slice = &snap.dims[slice_i];
    let d = slice.dim;
    let mut layers = Vec::new();
    if let Some([a, b]) = snap.band {
        layers.push(Layer::HSpan {
            color: GREEN,
            lo: a,
            hi: b,
        });
    }
    if let Some(t) = snap.target {
        layers.push(Layer::HLine { color: GREEN, y: t });
    }
    if let Some(Some(c)) = snap.center.get(d) {
        layers.push(Layer::VLine { color: GREY, x: *c });
    }
    let pts: Vec<(f64, f64, f64)> = slice
        .grid
        .iter()
        .zip(&slice.mean_acc)
        .zip(&slice.sd_acc)
        .filter_map(|((g, m), s)| Some(((*g)?, (*m)?, (*s)?)))
        .filter(|(g, m, s)| g.is_finite() && m.is_finite() && s.is_finite())
        .collect();
    layers.push(Layer::Band {
        color: blue,
        segments: vec![
            pts.iter()
                .map(|&(g, m, s)| (g, m - 2.0 * s, m + 2.0 * s))
                .collect(),
        ],
    });
    layers.push(Layer::Line {
        color: blue,
        points: pts.iter().map(|&(g, m, _)| (g, m)).collect(),
        dashed: false,
        dots: false,
    });
    let obs: Vec<(f64, f64)> = snap
        .observations
        .iter()
        .filter(|o| o.step.is_none_or(|s| s <= snap.step))
        .filter_map(|o| Some(((*o.difficulty.get(d)?)?, o.acc?)))
        .collect();
    layers.push(Layer::Markers {
        color: GREY,
        shape: Shape::Circle,
        points: obs,
    });
    let name = dim_name(run, snap, d);
    let grid_max = pts.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let grid_min = pts.iter().map(|p| p.0).fold(0.0f64, f64::min);
    Panel {
        title: format!("step {} · {name}", snap.step),
        x_label: format!("{name} (difficulty)"),
        y_label: "predicted accuracy".into(),
        x_range: Some((grid_min, grid_max)),
        y_range: Some((0.0, 1.0)),
        message: pts
            .is_empty()
            .then(|| "no finite prediction in this slice".into()),
        layers,
        ..Panel::default()
    }
}

fn posterior_figure(run: &Run, snaps: &[PosteriorSnapshot]) -> Planned {
    let chosen = pick_snapshots(snaps);
    let cols = chosen
        .iter()
        .map(|s| s.dims.len())
        .max()
        .unwrap_or(1)
        .clamp(1, 3);
    let mut panels = Vec::new();
    for s in &chosen {
        for i in 0..cols {
            panels.push(if i < s.dims.len() {
                posterior_panel(run, s, i)
            } else {
                Panel {
                    title: format!("step {}", s.step),
                    message: Some("no slice for this dimension".into()),
                    ..Panel::default()
                }
            });
        }
    }
    let has_band = chosen.iter().any(|s| s.band.is_some());
    let has_target = chosen.iter().any(|s| s.target.is_some());
    let has_obs = chosen.iter().any(|s| !s.observations.is_empty());
    let mut legend = vec![
        LegendEntry {
            swatch: Swatch::Line(color(0)),
            label: "predicted accuracy".into(),
        },
        LegendEntry {
            swatch: Swatch::Band(color(0)),
            label: "± 2 sd".into(),
        },
    ];
    if has_band {
        legend.push(LegendEntry {
            swatch: Swatch::Band(GREEN),
            label: "target band".into(),
        });
    }
    if has_target {
        legend.push(LegendEntry {
            swatch: Swatch::Dashed(GREEN),
            label: "target".into(),
        });
    }
    if has_obs {
        legend.push(LegendEntry {
            swatch: Swatch::Marker(GREY, Shape::Circle),
            label: "observations".into(),
        });
    }
    legend.push(LegendEntry {
        swatch: Swatch::Dashed(GREY),
        label: "slice position".into(),
    });
    let mut missing = Vec::new();
    if !has_band || !has_target {
        missing.push("no target/band in posterior.jsonl (written before they were logged)");
    }
    if !has_obs {
        missing.push("no observations in posterior.jsonl");
    }
    let mut caption = format!(
        "`{}`: the Gaussian-process proposer's predicted accuracy along each difficulty dimension (the other dimensions fixed at the mean slot difficulty, dashed vertical line), mean ± 2 sd, at {} of {} logged eval steps ({}). Observations are the (difficulty, accuracy) points the model holds, projected onto the dimension.",
        run.label(),
        chosen.len(),
        snaps.len(),
        chosen
            .iter()
            .map(|s| format!("step {}", s.step))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !missing.is_empty() {
        caption += &format!(" Missing: {}.", missing.join("; "));
    }
    let seed = run
        .seed
        .map_or_else(|| "seed-unknown".into(), |s| format!("seed-{s}"));
    Planned {
        section: Section::Posterior,
        stem: format!("posterior_{}_{seed}", file_safe(&run.experiment)),
        figure: Figure {
            title: format!("GP posterior — {}", run.label()),
            cols,
            panel: (330, 300),
            panels,
            legend,
        },
        caption,
        after: None,
    }
}
