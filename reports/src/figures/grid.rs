//! The difficulty-grid figure: in-domain accuracy per level of the fixed evaluation grid
//! ([`GridTable`]), at the first and the last evaluation, one panel per experiment.

use super::{ACC, Planned, Section, curve_layers, legend_for};
use crate::grid::{GridTable, steps_text};
use crate::plot::{Figure, GREY, Layer, LegendEntry, Panel, Swatch, color};
use crate::stats::{Aggregate, MeanCi};
use crate::suite::Suite;
use plotters::style::RGBColor;
use std::collections::BTreeSet;

/// Line (dashed or not) with dots and CI band of one evaluation over the grid levels; levels
/// without a value are skipped.
fn grid_layers(c: RGBColor, levels: &[f64], cells: &[Option<MeanCi>], dashed: bool) -> Vec<Layer> {
    let agg: Vec<Aggregate> = levels
        .iter()
        .zip(cells)
        .enumerate()
        .filter_map(|(i, (&x, cell))| {
            Some(Aggregate {
                step: i as u64,
                x,
                y: (*cell)?,
            })
        })
        .collect();
    let mut layers = curve_layers(c, &agg, &BTreeSet::new(), true, (0.0, 1.0));
    for l in &mut layers {
        if let Layer::Line { dashed: d, .. } = l {
            *d = dashed;
        }
    }
    layers
}

/// One panel per experiment with grid accuracies: the first evaluation (dashed, grey) and the
/// last (solid, the experiment's colour) over the grid levels.
pub(super) fn grid_figure(suite: &Suite, g: &GridTable) -> Planned {
    let xs: Vec<f64> = g.levels.iter().map(|l| l.value).collect();
    let (lo, hi) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min).min(0.0),
        xs.iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
            .max(1.0),
    );
    let pad = 0.04 * (hi - lo);
    let panels: Vec<Panel> = g
        .rows
        .iter()
        .map(|r| {
            let c = color(r.index);
            let mut layers = grid_layers(GREY, &xs, &r.start.cells, true);
            layers.extend(grid_layers(c, &xs, &r.last.cells, false));
            Panel {
                title: r.experiment.clone(),
                x_label: "grid level (difficulty on every dim.)".into(),
                y_label: ACC.into(),
                x_range: Some((lo - pad, hi + pad)),
                y_range: Some((-0.02, 1.02)),
                layers,
                note: Some(format!("last eval: {}", steps_text(&r.last.steps))),
                message: None,
            }
        })
        .collect();
    let shown: Vec<usize> = g.rows.iter().map(|r| r.index).collect();
    let mut legend = vec![LegendEntry {
        swatch: Swatch::Dashed(GREY),
        label: g.start_label().into(),
    }];
    legend.extend(legend_for(suite, &shown, true));
    let start = if g.starts_at_zero() {
        "at step 0 (the warm-started policy, dashed grey)"
    } else {
        "at each run's first evaluation with grid keys (dashed grey; not step 0 in every run)"
    };
    let mut caption = format!(
        "In-domain accuracy per level of the fixed evaluation grid (`eval/acc_grid/<level>`: the eval tasks whose difficulty coordinate is that level on every dimension, 0 = easiest, 1 = hardest; `eval/acc_id` is the mean over the levels), per experiment: {start} and at each run's last evaluation (solid). Lines: mean over seeds; bands: 95% CI of the mean (Student t) clipped to [0, 1]; no band where one seed has the value."
    );
    if !g.without.is_empty() {
        caption += &format!(" Missing: no `eval/acc_grid/*`: {}.", g.without.join(", "));
    }
    Planned {
        section: Section::Eval,
        stem: "eval_acc_grid".into(),
        figure: Figure {
            title: "In-domain accuracy over the difficulty grid".into(),
            cols: g.rows.len().clamp(1, 3),
            panel: (330, 330),
            panels,
            legend,
        },
        caption,
        after: Some(g.markdown()),
    }
}
