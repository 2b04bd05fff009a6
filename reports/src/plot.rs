//! Drawing: a [`Figure`] is a title, a grid of [`Panel`]s (line charts with bands, markers and
//! reference lines, or a message where there is nothing to draw) and a shared legend. Every
//! figure is written as SVG.
//!
//! Text: the bundled DejaVu Sans (`assets/`, Bitstream Vera licence beside it) is registered
//! once as plotters' `sans-serif` (ab_glyph, no system font) and measures every label
//! ([`crate::glyphs`]). Sizes are pixels per em.

use crate::error::ReportError;
use crate::glyphs::{self, TextFix};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The font family every text uses.
pub(crate) const FONT: &str = "sans-serif";

/// Text sizes (px).
pub(crate) const TITLE_PX: u32 = 22;
pub(crate) const PANEL_TITLE_PX: u32 = 17;
pub(crate) const LABEL_PX: u32 = 15;
pub(crate) const TICK_PX: u32 = 14;
const TITLE_H: u32 = 44;
const NOTE_LINE_H: u32 = 18;
const LEGEND_LINE_H: u32 = 30;

/// Colours of the experiments (Tableau 10), by row index.
pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
/// Accepted proposals.
pub(crate) const GREEN: RGBColor = RGBColor(0, 140, 60);
/// Rejected proposals.
pub(crate) const RED: RGBColor = RGBColor(200, 30, 30);
/// Reference lines, observations, notes.
pub(crate) const GREY: RGBColor = RGBColor(90, 90, 90);

/// The colour of row `i`.
pub(crate) fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Registers the bundled font (once per process).
pub(crate) fn ensure_font() -> Result<(), ReportError> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, glyphs::font_bytes()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(ReportError::Plot {
            path: PathBuf::from("reports/assets/DejaVuSans.ttf"),
            message: "the bundled font cannot be parsed".into(),
        })
    }
}

/// Width in pixels of `text` at `px` (an estimate if the font is unavailable).
pub(crate) fn text_width(text: &str, px: u32) -> u32 {
    glyphs::text_size(text, f64::from(px)).0
}

/// Splits `text` into lines no wider than `width` px at `px` (explicit `\n` kept).
pub(crate) fn wrap(text: &str, px: u32, width: u32) -> Vec<String> {
    let mut out = Vec::new();
    for para in text.split('\n') {
        let mut line = String::new();
        for word in para.split_whitespace() {
            let candidate = if line.is_empty() {
                word.to_string()
            } else {
                format!("{line} {word}")
            };
            if !line.is_empty() && text_width(&candidate, px) > width {
                out.push(std::mem::replace(&mut line, word.to_string()));
            } else {
                line = candidate;
            }
        }
        out.push(line);
    }
    out
}

/// Marker shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Filled circle.
    Circle,
    /// Filled triangle pointing up.
    Up,
    /// Filled triangle pointing down.
    Down,
    /// An ✕.
    Cross,
    /// Filled diamond.
    Diamond,
    /// Filled square.
    Square,
}

/// A text label at a data point (the sweep figure's off-line points, a reference line's name).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Label {
    pub x: f64,
    pub y: f64,
    pub text: String,
    /// Whether the text ends at the point (placed to its left) instead of starting there.
    pub left: bool,
    /// Whether the text hangs below the point instead of standing above it.
    pub below: bool,
}

/// One thing drawn in a panel (data coordinates).
#[derive(Debug, Clone)]
pub(crate) enum Layer {
    /// A shaded band between `lo` and `hi`: one polygon per contiguous segment of `(x, lo, hi)`.
    Band {
        color: RGBColor,
        segments: Vec<Vec<(f64, f64, f64)>>,
    },
    /// A polyline, optionally dashed, optionally with a dot at each point.
    Line {
        color: RGBColor,
        points: Vec<(f64, f64)>,
        dashed: bool,
        dots: bool,
    },
    /// Markers.
    Markers {
        color: RGBColor,
        shape: Shape,
        points: Vec<(f64, f64)>,
    },
    /// A horizontal band across the panel (e.g. a target accuracy band).
    HSpan { color: RGBColor, lo: f64, hi: f64 },
    /// A dashed horizontal line across the panel.
    HLine { color: RGBColor, y: f64 },
    /// A dashed vertical line across the panel.
    VLine { color: RGBColor, x: f64 },
    /// Vertical error bars with short caps: `(x, lo, hi)`.
    ErrorBars {
        color: RGBColor,
        bars: Vec<(f64, f64, f64)>,
    },
    /// Text labels beside their points.
    Labels { color: RGBColor, labels: Vec<Label> },
}

/// One chart of a figure.
#[derive(Debug, Clone, Default)]
pub(crate) struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Fixed x range; else from the data.
    pub x_range: Option<(f64, f64)>,
    /// Fixed y range; else from the data.
    pub y_range: Option<(f64, f64)>,
    pub layers: Vec<Layer>,
    /// A grey remark shown under the title (what is missing, what was assumed).
    pub note: Option<String>,
    /// When set, nothing is plotted: the panel shows this message (why it is empty).
    pub message: Option<String>,
}

/// How a legend entry's swatch looks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Swatch {
    Line(RGBColor),
    Dashed(RGBColor),
    Band(RGBColor),
    Marker(RGBColor, Shape),
}

/// One legend entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LegendEntry {
    pub swatch: Swatch,
    pub label: String,
}

/// A figure: title, panels in a grid, a legend below.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub title: String,
    pub cols: usize,
    /// Size of one panel (px).
    pub panel: (u32, u32),
    pub panels: Vec<Panel>,
    pub legend: Vec<LegendEntry>,
}

impl Figure {
    fn rows(&self) -> usize {
        self.panels.len().div_ceil(self.cols.max(1)).max(1)
    }

    fn width(&self) -> u32 {
        self.panel.0 * self.cols.max(1) as u32
    }

    /// Note lines reserved in every panel (the most any panel needs).
    fn note_lines(&self) -> u32 {
        self.panels
            .iter()
            .filter_map(|p| p.note.as_ref())
            .map(|n| wrap(n, TICK_PX, self.panel.0.saturating_sub(24)).len() as u32)
            .max()
            .unwrap_or(0)
    }

    /// The legend laid out in lines that fit the figure's width.
    fn legend_lines(&self) -> Vec<Vec<(&LegendEntry, u32)>> {
        let max = self.width().saturating_sub(32);
        let mut lines: Vec<Vec<(&LegendEntry, u32)>> = Vec::new();
        let mut used = 0;
        for e in &self.legend {
            let w = 36 + text_width(&e.label, LABEL_PX);
            match lines.last_mut() {
                Some(l) if used + 28 + w <= max => {
                    l.push((e, w));
                    used += 28 + w;
                }
                _ => {
                    lines.push(vec![(e, w)]);
                    used = w;
                }
            }
        }
        lines
    }

    fn legend_height(&self) -> u32 {
        let n = self.legend_lines().len() as u32;
        if n == 0 { 8 } else { n * LEGEND_LINE_H + 12 }
    }
}

/// Something that draws itself on any plotters backend.
pub(crate) trait Render {
    /// Title (alt text in the report).
    fn title(&self) -> &str;
    /// Size in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws on `root` (the whole canvas).
    fn render<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>;
}

impl Render for Figure {
    fn title(&self) -> &str {
        &self.title
    }

    fn size(&self) -> (u32, u32) {
        let panel_h = self.panel.1 + self.note_lines() * NOTE_LINE_H;
        (
            self.width(),
            TITLE_H + panel_h * self.rows() as u32 + self.legend_height(),
        )
    }

    fn render<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let (w, _) = self.size();
        let title = (FONT, TITLE_PX)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(self.title.clone(), (w as i32 / 2, 10), title))?;
        let body = root.margin(TITLE_H, self.legend_height(), 0, 0);
        let areas = body.split_evenly((self.rows(), self.cols.max(1)));
        let note_lines = self.note_lines();
        for (area, panel) in areas.iter().zip(&self.panels) {
            draw_panel(area, panel, note_lines)?;
        }
        let (_, h) = self.size();
        let top = (h - self.legend_height()) as i32 + 4;
        draw_legend(root, &self.legend_lines(), w, top)
    }
}

/// What `save` wrote: one figure's SVG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FigureFile {
    /// What the figure shows.
    pub title: String,
    /// The SVG.
    pub svg: PathBuf,
    /// Width (px).
    pub width: u32,
    /// Height (px).
    pub height: u32,
}

/// Writes `fig` as `dir/stem.svg`, compacted ([`crate::svg`]): one format, text stays text,
/// and every page that shows a figure embeds it.
pub(crate) fn save<F: Render>(fig: &F, dir: &Path, stem: &str) -> Result<FigureFile, ReportError> {
    ensure_font()?;
    let (width, height) = fig.size();
    let svg = dir.join(format!("{stem}.svg"));
    let err = |e: String| ReportError::Plot {
        path: svg.clone(),
        message: e,
    };
    let mut drawn = String::new();
    {
        let root =
            TextFix::svg(SVGBackend::with_string(&mut drawn, (width, height))).into_drawing_area();
        fig.render(&root).map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    let text = crate::svg::compact(&drawn).map_err(|e| err(e.to_string()))?;
    std::fs::write(&svg, text).map_err(|e| err(e.to_string()))?;
    Ok(FigureFile {
        title: fig.title().to_string(),
        svg,
        width,
        height,
    })
}

/// A tick label: integers without decimals, others with up to 3 significant decimals,
/// thousands as `k`/`M`; a float residue of 0 (|v| < 1e-12, as plotters' ticks of a range
/// across 0 produce: −5.6e-17) is `0`.
pub(crate) fn tick(v: &f64) -> String {
    let a = v.abs();
    if a < 1e-12 {
        "0".to_string()
    } else if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 100.0 || (v.fract() == 0.0) {
        format!("{v:.0}")
    } else if a >= 1e-3 || a == 0.0 {
        trim(format!("{v:.3}"))
    } else {
        format!("{v:.1e}")
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    note_lines: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, _) = area.dim_in_pixel();
    let title = (FONT, PANEL_TITLE_PX)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    area.draw(&Text::new(p.title.clone(), (w as i32 / 2, 4), title))?;
    let note_style = (FONT, TICK_PX).into_font().color(&GREY);
    if let Some(note) = &p.note {
        for (i, line) in wrap(note, TICK_PX, w.saturating_sub(24)).iter().enumerate() {
            let y = 4 + PANEL_TITLE_PX as i32 + 6 + i as i32 * NOTE_LINE_H as i32;
            area.draw(&Text::new(line.clone(), (12, y), note_style.clone()))?;
        }
    }
    let top = 4 + PANEL_TITLE_PX + 10 + note_lines * NOTE_LINE_H;
    let plot = area.margin(top, 0, 0, 0);
    if let Some(msg) = &p.message {
        return draw_message(&plot, msg);
    }
    let (x0, x1) = p.x_range.unwrap_or_else(|| auto_range(p, true));
    let (y0, y1) = p.y_range.unwrap_or_else(|| auto_range(p, false));
    let mut chart = ChartBuilder::on(&plot)
        .margin(6)
        .margin_right(18)
        .x_label_area_size(54)
        .y_label_area_size(62)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .label_style((FONT, TICK_PX))
        .axis_desc_style((FONT, LABEL_PX))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(TRANSPARENT)
        .x_labels(6)
        .y_labels(6)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    let clamp = Clamp {
        x: (x0, x1),
        y: (y0, y1),
    };
    for layer in &p.layers {
        draw_layer(&mut chart, layer, &clamp)?;
    }
    Ok(())
}

/// An empty frame with a centred, wrapped message.
fn draw_message<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    msg: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let frame = area.margin(6, 50, 66, 20);
    let (fw, fh) = frame.dim_in_pixel();
    frame.draw(&Rectangle::new(
        [(0, 0), (fw as i32 - 1, fh as i32 - 1)],
        RGBColor(200, 200, 200).stroke_width(1),
    ))?;
    let lines = wrap(msg, LABEL_PX, fw.saturating_sub(24));
    let style = (FONT, LABEL_PX)
        .into_font()
        .color(&GREY)
        .pos(Pos::new(HPos::Center, VPos::Center));
    let y0 = (fh as i32 - lines.len() as i32 * 20) / 2 + 10;
    for (i, l) in lines.iter().enumerate() {
        frame.draw(&Text::new(
            l.clone(),
            (fw as i32 / 2, y0 + 20 * i as i32),
            style.clone(),
        ))?;
    }
    Ok(())
}

/// The data range of a panel along x or y, padded; a unit range when empty or flat.
fn auto_range(p: &Panel, x_axis: bool) -> (f64, f64) {
    let mut vals: Vec<f64> = Vec::new();
    for l in &p.layers {
        match l {
            Layer::Band { segments, .. } => {
                for &(x, lo, hi) in segments.iter().flatten() {
                    if x_axis {
                        vals.push(x);
                    } else {
                        vals.extend([lo, hi]);
                    }
                }
            }
            Layer::Line { points, .. } | Layer::Markers { points, .. } => {
                vals.extend(points.iter().map(|&(x, y)| if x_axis { x } else { y }));
            }
            Layer::HSpan { lo, hi, .. } if !x_axis => vals.extend([*lo, *hi]),
            Layer::HLine { y, .. } if !x_axis => vals.push(*y),
            Layer::VLine { x, .. } if x_axis => vals.push(*x),
            Layer::ErrorBars { bars, .. } => {
                for &(x, lo, hi) in bars {
                    if x_axis {
                        vals.push(x);
                    } else {
                        vals.extend([lo, hi]);
                    }
                }
            }
            Layer::Labels { labels, .. } => {
                vals.extend(labels.iter().map(|l| if x_axis { l.x } else { l.y }));
            }
            _ => {}
        }
    }
    let finite = vals.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if lo > hi {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        let pad = (lo.abs() * 0.1).max(0.5);
        return (lo - pad, hi + pad);
    }
    if x_axis {
        (lo, hi)
    } else {
        let pad = (hi - lo) * 0.06;
        (lo - pad, hi + pad)
    }
}

/// Keeps drawing inside the plotting area (plotters does not clip polygons).
struct Clamp {
    x: (f64, f64),
    y: (f64, f64),
}

impl Clamp {
    fn p(&self, (x, y): (f64, f64)) -> (f64, f64) {
        (x.clamp(self.x.0, self.x.1), y.clamp(self.y.0, self.y.1))
    }
    fn inside(&self, (x, y): (f64, f64)) -> bool {
        (self.x.0..=self.x.1).contains(&x) && (self.y.0..=self.y.1).contains(&y)
    }
}

type Chart<'a, 'b, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn draw_layer<DB: DrawingBackend>(
    chart: &mut Chart<'_, '_, DB>,
    layer: &Layer,
    c: &Clamp,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let area = chart.plotting_area();
    match layer {
        Layer::Band { color, segments } => {
            for seg in segments.iter().filter(|s| !s.is_empty()) {
                if seg.len() == 1 {
                    let (x, lo, hi) = seg[0];
                    area.draw(&PathElement::new(
                        vec![c.p((x, lo)), c.p((x, hi))],
                        color.mix(0.5).stroke_width(3),
                    ))?;
                    continue;
                }
                let mut pts: Vec<(f64, f64)> = seg.iter().map(|&(x, _, hi)| c.p((x, hi))).collect();
                pts.extend(seg.iter().rev().map(|&(x, lo, _)| c.p((x, lo))));
                area.draw(&Polygon::new(pts, color.mix(0.18).filled()))?;
            }
        }
        Layer::Line {
            color,
            points,
            dashed,
            dots,
        } => {
            let pts: Vec<(f64, f64)> = points.iter().map(|&p| c.p(p)).collect();
            let style = color.stroke_width(2);
            if *dashed {
                area.draw(&DashedPathElement::new(pts.clone(), 7, 5, style))?;
            } else {
                area.draw(&PathElement::new(pts.clone(), style))?;
            }
            if *dots || pts.len() == 1 {
                for p in pts {
                    area.draw(&Circle::new(p, 3, color.filled()))?;
                }
            }
        }
        Layer::Markers {
            color,
            shape,
            points,
        } => {
            for p in last_per_pixel(points.iter().filter(|&&p| c.inside(p)), |p| {
                chart.backend_coord(p)
            }) {
                draw_marker(area, p, *shape, *color)?;
            }
        }
        Layer::HSpan { color, lo, hi } => {
            let (a, b) = (c.p((c.x.0, *lo)), c.p((c.x.1, *hi)));
            area.draw(&Rectangle::new([a, b], color.mix(0.14).filled()))?;
        }
        Layer::HLine { color, y } => {
            let pts = vec![c.p((c.x.0, *y)), c.p((c.x.1, *y))];
            area.draw(&DashedPathElement::new(pts, 7, 5, color.stroke_width(1)))?;
        }
        Layer::VLine { color, x } => {
            let pts = vec![c.p((*x, c.y.0)), c.p((*x, c.y.1))];
            area.draw(&DashedPathElement::new(pts, 5, 5, color.stroke_width(1)))?;
        }
        Layer::ErrorBars { color, bars } => {
            let st = color.stroke_width(2);
            for &(x, lo, hi) in bars.iter().filter(|b| (c.x.0..=c.x.1).contains(&b.0)) {
                let (a, b) = (c.p((x, lo)), c.p((x, hi)));
                area.draw(&PathElement::new(vec![a, b], st))?;
                for end in [(x, lo), (x, hi)].into_iter().filter(|&e| c.inside(e)) {
                    area.draw(
                        &(EmptyElement::at(end) + PathElement::new(vec![(-5, 0), (5, 0)], st)),
                    )?;
                }
            }
        }
        Layer::Labels { color, labels } => {
            for l in labels.iter().filter(|l| c.inside((l.x, l.y))) {
                let (h, dx) = if l.left {
                    (HPos::Right, -8)
                } else {
                    (HPos::Left, 8)
                };
                let (v, dy) = if l.below {
                    (VPos::Top, 6)
                } else {
                    (VPos::Bottom, -6)
                };
                let style = (FONT, TICK_PX).into_font().color(color).pos(Pos::new(h, v));
                // A pale box under the text keeps it legible over lines and bars.
                let w = text_width(&l.text, TICK_PX) as i32 + 4;
                let th = TICK_PX as i32 + 4;
                let x0 = if l.left { dx - w + 2 } else { dx - 2 };
                let y0 = if l.below { dy - 1 } else { dy - th + 1 };
                area.draw(
                    &(EmptyElement::at((l.x, l.y))
                        + Rectangle::new([(x0, y0), (x0 + w, y0 + th)], WHITE.mix(0.8).filled())
                        + Text::new(l.text.clone(), (dx, dy), style)),
                )?;
            }
        }
    }
    Ok(())
}

/// The points of one marker layer without those that a later point of the layer draws over
/// exactly (the same pixel: the same opaque marker), in drawing order. Keeping each pixel's
/// last point leaves the picture as it was — whatever covers a pixel last still does — while
/// a figure of many runs' proposals (mostly at the same step and value) shrinks severalfold.
fn last_per_pixel<'a>(
    points: impl Iterator<Item = &'a (f64, f64)>,
    pixel: impl Fn(&(f64, f64)) -> (i32, i32),
) -> Vec<(f64, f64)> {
    let points: Vec<(f64, f64)> = points.copied().collect();
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<(f64, f64)> = points
        .iter()
        .rev()
        .filter(|p| seen.insert(pixel(p)))
        .copied()
        .collect();
    kept.reverse();
    kept
}

/// Draws one marker centred at data point `p` (any coordinate system).
fn draw_marker<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    p: CT::From,
    shape: Shape,
    color: RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let fill = color.filled();
    match shape {
        Shape::Circle => {
            area.draw(&(EmptyElement::at(p) + Circle::new((0, 0), 4, fill)))?;
        }
        Shape::Up | Shape::Down => {
            let s = if shape == Shape::Up { 1 } else { -1 };
            let tri = vec![(0, -7 * s), (7, 5 * s), (-7, 5 * s)];
            area.draw(&(EmptyElement::at(p) + Polygon::new(tri, fill)))?;
        }
        Shape::Diamond => {
            let d = vec![(0, -7), (7, 0), (0, 7), (-7, 0)];
            area.draw(&(EmptyElement::at(p) + Polygon::new(d, fill)))?;
        }
        Shape::Square => {
            area.draw(&(EmptyElement::at(p) + Rectangle::new([(-5, -5), (5, 5)], fill)))?;
        }
        Shape::Cross => {
            let st = color.stroke_width(3);
            area.draw(
                &(EmptyElement::at(p)
                    + PathElement::new(vec![(-5, -5), (5, 5)], st)
                    + PathElement::new(vec![(-5, 5), (5, -5)], st)),
            )?;
        }
    }
    Ok(())
}

fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    lines: &[Vec<(&LegendEntry, u32)>],
    width: u32,
    top: i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let style = (FONT, LABEL_PX)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (row, line) in lines.iter().enumerate() {
        let total: u32 = line.iter().map(|(_, w)| w).sum::<u32>() + 28 * (line.len() as u32 - 1);
        let mut x = (width.saturating_sub(total) / 2) as i32;
        let y = top + row as i32 * LEGEND_LINE_H as i32 + LEGEND_LINE_H as i32 / 2;
        for (e, w) in line {
            draw_swatch(root, e.swatch, x, y)?;
            root.draw(&Text::new(e.label.clone(), (x + 36, y), style.clone()))?;
            x += *w as i32 + 28;
        }
    }
    Ok(())
}

fn draw_swatch<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: Swatch,
    x: i32,
    y: i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    match s {
        Swatch::Line(c) => {
            root.draw(&PathElement::new(
                vec![(x, y), (x + 28, y)],
                c.stroke_width(3),
            ))?;
        }
        Swatch::Dashed(c) => {
            root.draw(&DashedPathElement::new(
                vec![(x, y), (x + 28, y)],
                6,
                4,
                c.stroke_width(2),
            ))?;
        }
        Swatch::Band(c) => {
            root.draw(&Rectangle::new(
                [(x, y - 7), (x + 28, y + 7)],
                c.mix(0.25).filled(),
            ))?;
        }
        Swatch::Marker(c, shape) => draw_marker(root, (x + 14, y), shape, c)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(&0.30000000000000004), "0.3");
        assert_eq!(tick(&5.0), "5");
        assert_eq!(tick(&1234.0), "1234");
        assert_eq!(tick(&25_000.0), "25k");
        assert_eq!(tick(&2_500_000.0), "2.5M");
        assert_eq!(tick(&0.0), "0");
        assert_eq!(tick(&-5.551115123125783e-17), "0");
        assert_eq!(tick(&2.5e-4), "2.5e-4");
    }

    #[test]
    fn a_marker_drawn_over_by_the_same_pixel_is_left_out() {
        // Pixels at a tenth of a unit: (1.01, 2) and (1.04, 2) share (10, 20).
        let px = |p: &(f64, f64)| ((p.0 * 10.0).round() as i32, (p.1 * 10.0).round() as i32);
        let pts = [(1.01, 2.0), (3.0, 4.0), (1.04, 2.0), (3.0, 4.0), (5.0, 6.0)];
        // The last point of each pixel stays, in drawing order: (1.04, 2) replaces (1.01, 2),
        // the second (3, 4) the first.
        assert_eq!(
            last_per_pixel(pts.iter(), px),
            vec![(1.04, 2.0), (3.0, 4.0), (5.0, 6.0)]
        );
        assert!(last_per_pixel([].iter(), px).is_empty());
    }

    #[test]
    fn wrapping_respects_the_width() {
        ensure_font().expect("font");
        let lines = wrap("one two three four five six seven eight nine ten", 14, 120);
        assert!(lines.len() > 1);
        assert!(
            lines
                .iter()
                .all(|l| text_width(l, 14) <= 120 || !l.contains(' '))
        );
    }
}
