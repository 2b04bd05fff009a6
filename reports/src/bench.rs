//! Backend comparison from `rlany bench --kernels … --json FILE` outputs (and files of the same
//! shape from other backends or a PyTorch anchor): a grouped horizontal bar chart of the median
//! time per workload, one bar per file and variant, and a Markdown table.
//!
//! Accepted shape: `{"backend": "…"?, "results": [{"name": "K1_fwd_V32000_f32", "variant":
//! "fused"?, "median_ms": 1.23 | null, "error": "…"?, "n": 16384?}, …], "n_requested": 16384?}`.
//! `name` may be replaced by `workload`, `median_ms` by `ms`. A file is labelled by its
//! `backend`, else its file name.
//!
//! A kernel row measured on fewer rows than asked for (`n` < the file's `n_requested`: WGPU
//! caps one binding, so `[N, 151936]` f32 runs on N = 3533 there) is not comparable as measured:
//! its time is scaled linearly to the requested N (the kernels are memory-bound, linear in the
//! rows) and marked `†` in the tables, with the measured N in a note.

use crate::error::{ReportError, io};
use crate::plot::{
    FONT, GREY, LABEL_PX, PANEL_TITLE_PX, Render, TICK_PX, TITLE_PX, color, text_width, tick,
};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// One timed row of a bench file.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// Workload name (e.g. `K1_fwd_V32000_f32`): bars of the same name are compared.
    pub name: String,
    /// Implementation variant (`fused`, `reference`, …), if given.
    pub variant: Option<String>,
    /// Median time per call (ms); `None` when the row failed.
    pub ms: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
    /// `Some(n)`: measured on `n` rows, fewer than the file's requested N; `ms` is scaled to it.
    pub scaled_from: Option<usize>,
}

/// One bench file.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchFile {
    /// Its label (its `backend`, else its file name; made unique).
    pub label: String,
    /// The file.
    pub path: PathBuf,
    /// Its rows.
    pub rows: Vec<BenchRow>,
}

/// Reads a bench JSON file.
pub fn read_bench(path: &Path) -> Result<BenchFile, ReportError> {
    let bad = |message: String| ReportError::BadFile {
        path: path.to_path_buf(),
        message,
    };
    let text = fs::read_to_string(path).map_err(io(path))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if v.get("results").is_none() && v.get("torch").is_some() {
        return Ok(BenchFile {
            label: "PyTorch".into(),
            path: path.to_path_buf(),
            rows: torch_anchor_rows(&v),
        });
    }
    let results = v
        .get("results")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"results\" array (not an `rlany bench --json` file?)".into()))?;
    let requested = v.get("n_requested").and_then(Value::as_u64);
    let rows = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let name = ["name", "workload"]
                .iter()
                .find_map(|k| r.get(*k).and_then(Value::as_str))
                .ok_or_else(|| bad(format!("results[{i}]: no \"name\" or \"workload\"")))?;
            let ms = ["median_ms", "ms"].iter().find_map(|k| r.get(*k));
            let ms = match ms {
                None | Some(Value::Null) => None,
                Some(Value::Number(n)) => n.as_f64(),
                Some(_) => return Err(bad(format!("results[{i}].median_ms: not a number"))),
            };
            let n = r.get("n").and_then(Value::as_u64).filter(|&n| n > 0);
            let scaled_from = match (n, requested) {
                (Some(n), Some(req)) if n < req => Some(n as usize),
                _ => None,
            };
            let ms = match (ms, scaled_from, requested) {
                (Some(m), Some(n), Some(req)) => Some(m * req as f64 / n as f64),
                _ => ms,
            };
            Ok(BenchRow {
                name: name.to_string(),
                variant: r.get("variant").and_then(Value::as_str).map(str::to_string),
                ms,
                error: r.get("error").and_then(Value::as_str).map(str::to_string),
                scaled_from,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let label = v
        .get("backend")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| file_stem(path));
    Ok(BenchFile {
        label,
        path: path.to_path_buf(),
        rows,
    })
}

/// The rows of the PyTorch anchor's flat JSON (`torch_anchor.py`): `R_<model>_ms` and
/// `T_<model>_ms` (variant `eager`), `K1_fwd_<eager|compiled>_V<v>_<float32|bfloat16>_ms`
/// and the same for `K1_fwdbwd` and `K2_fwd` (named as ours: `K1_fwd_V<v>_<f32|bf16>`), and
/// `<name>_error` entries as failed rows.
fn torch_anchor_rows(v: &Value) -> Vec<BenchRow> {
    let Some(map) = v.as_object() else {
        return Vec::new();
    };
    let dtype = |d: &str| match d {
        "float32" => "f32".to_string(),
        "bfloat16" => "bf16".to_string(),
        "float16" => "f16".to_string(),
        other => other.to_string(),
    };
    let mut rows = Vec::new();
    for (key, val) in map {
        if let Some(stem) = key.strip_suffix("_ms") {
            let ms = val.as_f64();
            let model = stem
                .strip_prefix("R_")
                .map(|m| ("R_", m))
                .or_else(|| stem.strip_prefix("T_").map(|m| ("T_", m)));
            if let Some((kind, m)) = model {
                rows.push(BenchRow {
                    name: format!("{kind}{m}"),
                    variant: Some("eager".into()),
                    ms,
                    error: None,
                    scaled_from: None,
                });
                continue;
            }
            for workload in ["K1_fwdbwd", "K1_fwd", "K2_fwd"] {
                let Some(rest) = stem
                    .strip_prefix(workload)
                    .and_then(|r| r.strip_prefix('_'))
                else {
                    continue;
                };
                // <eager|compiled>_V<v>_<dtype>
                let mut parts = rest.splitn(3, '_');
                if let (Some(variant), Some(vocab), Some(dt)) =
                    (parts.next(), parts.next(), parts.next())
                {
                    rows.push(BenchRow {
                        name: format!("{workload}_{vocab}_{}", dtype(dt)),
                        variant: Some(variant.to_string()),
                        ms,
                        error: None,
                        scaled_from: None,
                    });
                }
                break;
            }
        } else if let Some(stem) = key.strip_suffix("_error") {
            rows.push(BenchRow {
                name: stem.to_string(),
                variant: Some("eager".into()),
                ms: None,
                error: val.as_str().map(str::to_string),
                scaled_from: None,
            });
        }
    }
    rows
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Reads every file, making labels unique (`label (file)` where two files share one).
pub fn read_benches(paths: &[PathBuf]) -> Result<Vec<BenchFile>, ReportError> {
    let mut files: Vec<BenchFile> = paths
        .iter()
        .map(|p| read_bench(p))
        .collect::<Result<_, _>>()?;
    let labels: Vec<String> = files.iter().map(|f| f.label.clone()).collect();
    for f in &mut files {
        if labels.iter().filter(|l| **l == f.label).count() > 1 {
            f.label = format!("{} ({})", f.label, file_stem(&f.path));
        }
    }
    Ok(files)
}

/// The comparison: workloads (bar groups) × series (file and variant), in first-seen order.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchComparison {
    /// Workload names.
    pub workloads: Vec<String>,
    /// Series labels: `file · variant`.
    pub series: Vec<String>,
    /// `ms[w][s]`: median ms of workload `w` in series `s` (`None`: absent or failed).
    pub ms: Vec<Vec<Option<f64>>>,
    /// Failed rows, as `series / workload: error`.
    pub failures: Vec<String>,
    /// `scaled[w][s]`: the cell's time was scaled from this many measured rows.
    pub scaled: Vec<Vec<Option<usize>>>,
}

impl BenchComparison {
    /// Builds the comparison of `files`.
    pub fn build(files: &[BenchFile]) -> Self {
        let mut workloads: Vec<String> = Vec::new();
        let mut series: Vec<String> = Vec::new();
        let mut cells: Vec<(usize, usize, Option<f64>, Option<usize>)> = Vec::new();
        let mut failures = Vec::new();
        for f in files {
            for r in &f.rows {
                let s = match &r.variant {
                    Some(v) => format!("{} · {v}", f.label),
                    None => f.label.clone(),
                };
                let si = index_of(&mut series, &s);
                let wi = index_of(&mut workloads, &r.name);
                if r.ms.is_none() {
                    failures.push(format!(
                        "{s} / {}: {}",
                        r.name,
                        r.error.as_deref().unwrap_or("no time")
                    ));
                }
                cells.push((
                    wi,
                    si,
                    r.ms.filter(|m| m.is_finite() && *m > 0.0),
                    r.scaled_from,
                ));
            }
        }
        let mut ms = vec![vec![None; series.len()]; workloads.len()];
        let mut scaled = vec![vec![None; series.len()]; workloads.len()];
        for (w, s, v, n) in cells {
            ms[w][s] = v;
            scaled[w][s] = n;
        }
        Self {
            workloads,
            series,
            ms,
            failures,
            scaled,
        }
    }

    /// The Markdown table: one row per workload, one column per series (ms), fastest in bold.
    pub fn markdown(&self) -> String {
        let mut out = String::from("| workload |");
        let mut rule = String::from("|---|");
        for s in &self.series {
            out += &format!(" {s} (ms) |");
            rule += "---:|";
        }
        out = out + "\n" + &rule + "\n";
        for ((w, row), scaled) in self.workloads.iter().zip(&self.ms).zip(&self.scaled) {
            let best = row.iter().flatten().copied().fold(f64::INFINITY, f64::min);
            out += &format!("| {w} |");
            for (v, n) in row.iter().zip(scaled) {
                let mark = if n.is_some() { "†" } else { "" };
                out += &match v {
                    Some(m) if (*m - best).abs() < 1e-12 && row.iter().flatten().count() > 1 => {
                        format!(" **{}**{mark} |", fmt_ms(*m))
                    }
                    Some(m) => format!(" {}{mark} |", fmt_ms(*m)),
                    None => " – |".into(),
                };
            }
            out += "\n";
        }
        out += &self.scaled_note();
        out
    }

    /// The note under a table with scaled cells (empty without).
    pub fn scaled_note(&self) -> String {
        let mut notes: Vec<String> = Vec::new();
        for (w, row) in self.scaled.iter().enumerate() {
            for (s, n) in row.iter().enumerate() {
                if let Some(n) = n {
                    notes.push(format!(
                        "{} / {}: N = {n}",
                        self.series[s], self.workloads[w]
                    ));
                }
            }
        }
        if notes.is_empty() {
            return String::new();
        }
        format!(
            "\n† measured on fewer rows than the file asked for, the time scaled linearly to the asked N: {}.\n",
            notes.join("; ")
        )
    }
}

impl BenchComparison {
    /// Speed-ups against the series whose label starts with `reference` (e.g. `PyTorch ·
    /// eager`): `reference ms / series ms` per workload and series (> 1: faster than the
    /// reference). `None` when no series matches.
    pub fn speedups_markdown(&self, reference: &str) -> Option<String> {
        let refs: Vec<usize> = (0..self.series.len())
            .filter(|&s| self.series[s].starts_with(reference))
            .collect();
        if refs.is_empty() {
            return None;
        }
        let others: Vec<usize> = (0..self.series.len())
            .filter(|s| !refs.contains(s))
            .collect();
        let mut out = String::from("| workload |");
        let mut rule = String::from("|---|");
        for &o in &others {
            for &r in &refs {
                out += &format!(" {} vs {} |", self.series[o], self.series[r]);
                rule += "---:|";
            }
        }
        out = out + "\n" + &rule + "\n";
        for (w_i, (w, row)) in self.workloads.iter().zip(&self.ms).enumerate() {
            if refs.iter().all(|&r| row[r].is_none()) {
                continue;
            }
            out += &format!("| {w} |");
            for &o in &others {
                for &r in &refs {
                    let mark = if self.scaled[w_i][o].is_some() || self.scaled[w_i][r].is_some() {
                        "†"
                    } else {
                        ""
                    };
                    out += &match (row[r], row[o]) {
                        (Some(a), Some(b)) => format!(" {:.2}×{mark} |", a / b),
                        _ => " – |".into(),
                    };
                }
            }
            out += "\n";
        }
        out += &self.scaled_note();
        Some(out)
    }
}

fn index_of(v: &mut Vec<String>, s: &str) -> usize {
    v.iter().position(|x| x == s).unwrap_or_else(|| {
        v.push(s.to_string());
        v.len() - 1
    })
}

/// `m` with `sig` significant digits (`0.4000`, `13.00`, `1234`).
fn fmt_sig(m: f64, sig: i32) -> String {
    if !m.is_finite() || m <= 0.0 {
        return format!("{m}");
    }
    let decimals = (sig - 1 - m.log10().floor() as i32).max(0) as usize;
    format!("{m:.decimals$}")
}

fn fmt_ms(m: f64) -> String {
    fmt_sig(m, 4)
}

/// Layout constants of the bar chart (px).
const WIDTH: u32 = 960;
const TOP: u32 = 76;
const BAR_H: u32 = 19;
const GROUP_GAP: u32 = 14;
const AXIS_H: u32 = 56;
const LEGEND_LINE: u32 = 28;

/// The grouped horizontal bar chart (log time axis).
#[derive(Debug, Clone)]
pub(crate) struct BenchChart<'a> {
    pub cmp: &'a BenchComparison,
}

impl BenchChart<'_> {
    fn group_h(&self) -> u32 {
        self.cmp.series.len().max(1) as u32 * BAR_H + GROUP_GAP
    }

    fn label_w(&self) -> u32 {
        self.cmp
            .workloads
            .iter()
            .map(|w| text_width(w, TICK_PX))
            .max()
            .unwrap_or(0)
            .clamp(60, 360)
            + 16
    }

    fn legend_lines(&self) -> Vec<Vec<(usize, u32)>> {
        let mut lines: Vec<Vec<(usize, u32)>> = Vec::new();
        let mut used = 0;
        for (i, s) in self.cmp.series.iter().enumerate() {
            let w = 30 + text_width(s, LABEL_PX);
            match lines.last_mut() {
                Some(l) if used + 24 + w <= WIDTH - 40 => {
                    l.push((i, w));
                    used += 24 + w;
                }
                _ => {
                    lines.push(vec![(i, w)]);
                    used = w;
                }
            }
        }
        lines
    }

    fn range(&self) -> (f64, f64) {
        let vals: Vec<f64> = self.cmp.ms.iter().flatten().flatten().copied().collect();
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo > hi {
            return (0.01, 100.0);
        }
        let lo = 10f64.powf(lo.log10().floor());
        // Room right of the longest bar for its value label.
        let hi = 10f64.powf((hi * 3.0).log10().ceil()).max(lo * 10.0);
        (lo, hi)
    }
}

impl Render for BenchChart<'_> {
    fn title(&self) -> &str {
        "Backend comparison: median time per workload"
    }

    fn size(&self) -> (u32, u32) {
        let groups = self.cmp.workloads.len().max(1) as u32;
        let legend = self.legend_lines().len() as u32 * LEGEND_LINE + 16;
        (WIDTH, TOP + groups * self.group_h() + AXIS_H + legend)
    }

    fn render<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let (w, h) = self.size();
        let center = Pos::new(HPos::Center, VPos::Top);
        root.draw(&Text::new(
            self.title().to_string(),
            (w as i32 / 2, 10),
            (FONT, TITLE_PX).into_font().color(&BLACK).pos(center),
        ))?;
        root.draw(&Text::new(
            "median ms per call, log scale — shorter is faster".to_string(),
            (w as i32 / 2, 10 + TITLE_PX as i32 + 8),
            (FONT, PANEL_TITLE_PX - 2)
                .into_font()
                .color(&GREY)
                .pos(center),
        ))?;
        let legend_h = self.legend_lines().len() as u32 * LEGEND_LINE + 16;
        let area = root.margin(TOP - 10, legend_h, 0, 24);
        if self.cmp.workloads.is_empty() || self.cmp.ms.iter().flatten().all(Option::is_none) {
            area.draw(&Text::new(
                "no timed row in the bench files".to_string(),
                (w as i32 / 2, 40),
                (FONT, LABEL_PX).into_font().color(&GREY).pos(center),
            ))?;
            return Ok(());
        }
        let groups = self.cmp.workloads.len() as f64;
        let (lo, hi) = self.range();
        let mut chart = ChartBuilder::on(&area)
            .margin(6)
            .x_label_area_size(AXIS_H - 6)
            .y_label_area_size(self.label_w())
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..groups)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(12)
            .x_desc("median time per call (ms, log scale)")
            .label_style((FONT, TICK_PX))
            .axis_desc_style((FONT, LABEL_PX))
            .bold_line_style(RGBColor(222, 222, 222))
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|v| tick(v))
            .draw()?;
        let value_style = (FONT, TICK_PX)
            .into_font()
            .color(&GREY)
            .pos(Pos::new(HPos::Left, VPos::Center));
        let k = self.cmp.series.len() as f64;
        let pad = GROUP_GAP as f64 / self.group_h() as f64;
        let bar = (1.0 - pad) / k;
        for (g, row) in self.cmp.ms.iter().enumerate() {
            // Group g occupies y ∈ [groups−g−1, groups−g) so the first workload is on top.
            let top = groups - g as f64 - pad / 2.0;
            for (s, v) in row.iter().enumerate() {
                let Some(ms) = v else { continue };
                let y1 = top - s as f64 * bar;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(lo, y1 - bar * 0.9), (*ms, y1)],
                    color(s).filled(),
                )))?;
                chart.draw_series(std::iter::once(
                    EmptyElement::at((*ms, y1 - bar * 0.45))
                        + Text::new(fmt_sig(*ms, 3), (5, 0), value_style.clone()),
                ))?;
            }
        }
        // Workload names left of their group.
        let plot = chart.plotting_area();
        let (px, _) = plot.get_pixel_range();
        let base = root.get_base_pixel();
        let label = (FONT, TICK_PX)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Right, VPos::Center));
        for (g, name) in self.cmp.workloads.iter().enumerate() {
            let (_, y) = chart.backend_coord(&(lo, groups - g as f64 - 0.5));
            root.draw(&Text::new(
                name.clone(),
                (px.start - base.0 - 8, y - base.1),
                label.clone(),
            ))?;
        }
        // Legend.
        let style = (FONT, LABEL_PX)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        let top = (h - legend_h) as i32 + 6;
        for (r, line) in self.legend_lines().iter().enumerate() {
            let total: u32 =
                line.iter().map(|(_, w)| w).sum::<u32>() + 24 * (line.len() as u32 - 1);
            let mut x = (w.saturating_sub(total) / 2) as i32;
            let y = top + r as i32 * LEGEND_LINE as i32 + LEGEND_LINE as i32 / 2;
            for &(i, lw) in line {
                root.draw(&Rectangle::new(
                    [(x, y - 7), (x + 22, y + 7)],
                    color(i).filled(),
                ))?;
                root.draw(&Text::new(
                    self.cmp.series[i].clone(),
                    (x + 30, y),
                    style.clone(),
                ))?;
                x += lw as i32 + 24;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::tests::temp_dir;

    #[test]
    fn a_row_measured_on_fewer_rows_is_scaled_and_marked() {
        // WGPU measured [3533, V] instead of [16384, V] in 1.099 ms: 1.099 · 16384 / 3533
        // = 5.0965 ms at the asked N; a CUDA row on the full N stays as measured.
        let d = temp_dir("bench-scaled");
        let a = d.join("wgpu.json");
        fs::write(
            &a,
            r#"{"backend":"wgpu","n_requested":16384,"results":[
              {"name":"K1_fwd_V151936_f32","variant":"fused","n":3533,"median_ms":1.099}]}"#,
        )
        .expect("write");
        let b = d.join("cuda.json");
        fs::write(
            &b,
            r#"{"backend":"cuda","n_requested":16384,"results":[
              {"name":"K1_fwd_V151936_f32","variant":"fused","n":16384,"median_ms":2.214}]}"#,
        )
        .expect("write");
        let files = read_benches(&[a, b]).expect("read");
        assert_eq!(files[0].rows[0].scaled_from, Some(3533));
        assert_eq!(files[1].rows[0].scaled_from, None);
        let cmp = BenchComparison::build(&files);
        let w = cmp.ms[0][0].expect("scaled time");
        assert!((w - 5.0965).abs() < 1e-3, "{w}");
        assert_eq!(cmp.ms[0][1], Some(2.214));
        let md = cmp.markdown();
        assert!(
            md.contains("| K1_fwd_V151936_f32 | 5.097† | **2.214** |"),
            "{md}"
        );
        assert!(
            md.contains("wgpu · fused / K1_fwd_V151936_f32: N = 3533"),
            "{md}"
        );
    }

    #[test]
    fn reads_bench_json_and_other_shapes() {
        let d = temp_dir("bench");
        let a = d.join("cuda.json");
        fs::write(
            &a,
            r#"{"backend":"cuda","results":[
              {"name":"K1_fwd_V32000_f32","workload":"K1_fwd","vocab":32000,"dtype":"f32","variant":"fused","n":4096,"bytes":1.0,"median_ms":0.5,"gbps":1.0,"frac_copy":0.5,"error":null},
              {"name":"K1_fwd_V32000_f32","workload":"K1_fwd","variant":"reference","median_ms":1.5,"error":null},
              {"name":"K2_fwd_V32000_f32","workload":"K2_fwd","variant":"fused","median_ms":null,"error":"out of memory"}]}"#,
        )
        .expect("write");
        let b = d.join("torch.json");
        fs::write(
            &b,
            r#"{"results":[{"name":"K1_fwd_V32000_f32","ms":0.75}]}"#,
        )
        .expect("write");
        let files = read_benches(&[a, b]).expect("read");
        assert_eq!(files[1].label, "torch");
        let cmp = BenchComparison::build(&files);
        assert_eq!(cmp.workloads, ["K1_fwd_V32000_f32", "K2_fwd_V32000_f32"]);
        assert_eq!(cmp.series, ["cuda · fused", "cuda · reference", "torch"]);
        assert_eq!(cmp.ms[0], vec![Some(0.5), Some(1.5), Some(0.75)]);
        assert_eq!(cmp.ms[1], vec![None, None, None]);
        assert_eq!(
            cmp.failures,
            ["cuda · fused / K2_fwd_V32000_f32: out of memory"]
        );
        let md = cmp.markdown();
        assert!(
            md.contains("| K1_fwd_V32000_f32 | **0.5000** | 1.500 | 0.7500 |"),
            "{md}"
        );
        // The PyTorch anchor's flat file, named as ours, with speed-ups against it.
        let t = d.join("torch_anchor.json");
        fs::write(
            &t,
            r#"{"torch":"2.9","gpu":"H200","R_small_ms":1200.0,"R_small_gen_tok_per_s":40960.0,
                "K1_fwd_eager_V32000_float32_ms":1.0,"K1_fwd_compiled_V32000_float32_ms":0.25,
                "K1_fwdbwd_eager_V32000_bfloat16_ms":2.0,"qwen05b_error":"OOM"}"#,
        )
        .expect("write");
        let torch = read_bench(&t).expect("anchor");
        assert_eq!(torch.label, "PyTorch");
        let mut names: Vec<(String, Option<String>, Option<f64>)> = torch
            .rows
            .iter()
            .map(|r| (r.name.clone(), r.variant.clone(), r.ms))
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let s = |x: &str| Some(x.to_string());
        assert_eq!(
            names,
            vec![
                ("K1_fwd_V32000_f32".into(), s("compiled"), Some(0.25)),
                ("K1_fwd_V32000_f32".into(), s("eager"), Some(1.0)),
                ("K1_fwdbwd_V32000_bf16".into(), s("eager"), Some(2.0)),
                ("R_small".into(), s("eager"), Some(1200.0)),
                ("qwen05b".into(), s("eager"), None),
            ]
        );
        let ours = d.join("ours.json");
        fs::write(
            &ours,
            r#"{"backend":"cuda","results":[{"name":"K1_fwd_V32000_f32","variant":"fused","median_ms":0.5},
                {"name":"R_small","variant":"rlany","median_ms":600.0}]}"#,
        )
        .expect("write");
        let cmp = BenchComparison::build(&read_benches(&[ours, t]).expect("read"));
        let sp = cmp.speedups_markdown("PyTorch").expect("reference present");
        assert!(
            sp.contains("| K1_fwd_V32000_f32 | 0.50× | 2.00× | – | – |"),
            "{sp}"
        );
        assert!(sp.contains("| R_small | – | – | – | 2.00× |"), "{sp}");
        assert!(cmp.speedups_markdown("nobody").is_none());
        let bad = d.join("bad.json");
        fs::write(&bad, r#"{"rows":[]}"#).expect("write");
        assert!(
            read_bench(&bad)
                .expect_err("bad")
                .to_string()
                .contains("results")
        );
        let _ = fs::remove_dir_all(d);
    }
}
