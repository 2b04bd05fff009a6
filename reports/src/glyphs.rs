//! Text of the figures: a thin wrapper around plotters' backends that measures text itself and,
//! for bitmaps, rasterises it with ab_glyph.
//!
//! Why: plotters 0.3.7's ab_glyph text drawing places each glyph at the pen position without
//! its left side bearing, which spaces letters unevenly ("cumul at ive"), and scales by the
//! font's height rather than its em, while its SVG backend writes `font-size = size / 1.24`.
//! Here `size` is pixels per em in both (as CSS `font-size`), glyphs sit on a common baseline
//! at their proper offsets, and the layout box is `ascent − descent` high with the baseline
//! `ascent` below its top.

use ab_glyph::{Font, FontRef, Glyph, PxScale, ScaleFont, point};
use plotters::prelude::{BitMapBackend, SVGBackend};
use plotters_backend::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontFamily, FontStyle, FontTransform,
};
use std::sync::OnceLock;

static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// The bundled font, parsed once; `None` if it does not parse.
pub(crate) fn font_bytes() -> &'static [u8] {
    FONT_BYTES
}

fn font() -> Option<&'static FontRef<'static>> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(FONT_BYTES).ok())
        .as_ref()
}

/// The ab_glyph scale for `px` pixels per em.
fn scale(f: &FontRef<'_>, px: f64) -> PxScale {
    let upem = f.units_per_em().unwrap_or(2048.0);
    PxScale::from(px as f32 * f.height_unscaled() / upem)
}

/// Glyphs of `text` laid out on a baseline at `y = ascent`, and the box `(width, height)`.
fn layout(text: &str, px: f64) -> Option<(Vec<Glyph>, (u32, u32))> {
    let f = font()?;
    let sf = f.as_scaled(scale(f, px));
    let mut caret = 0.0f32;
    let mut prev = None;
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            caret += sf.kern(p, id);
        }
        glyphs.push(id.with_scale_and_position(sf.scale(), point(caret, sf.ascent())));
        caret += sf.h_advance(id);
        prev = Some(id);
    }
    let height = (sf.ascent() - sf.descent()).ceil() as u32;
    Some((glyphs, (caret.ceil() as u32, height)))
}

/// Width and height of `text` at `px` pixels per em (an estimate if the font is unusable).
pub(crate) fn text_size(text: &str, px: f64) -> (u32, u32) {
    layout(text, px).map_or_else(
        || {
            let n = text.chars().count() as f64;
            ((n * px * 0.6).ceil() as u32, (px * 1.2).ceil() as u32)
        },
        |(_, size)| size,
    )
}

/// A plotters backend with this module's text: rasterised here for bitmaps; for SVG, passed on
/// with the size in pixels per em (plotters' SVG writes `size / 1.24`) and DejaVu Sans named
/// first. Text is measured here for both, so PNG and SVG have the same layout.
pub(crate) struct TextFix<B> {
    inner: B,
    raster: bool,
}

impl<'a> TextFix<BitMapBackend<'a>> {
    /// Wraps a bitmap backend: text is rasterised here.
    pub(crate) fn bitmap(inner: BitMapBackend<'a>) -> Self {
        Self {
            inner,
            raster: true,
        }
    }
}

impl<'a> TextFix<SVGBackend<'a>> {
    /// Wraps an SVG backend: text stays text.
    pub(crate) fn svg(inner: SVGBackend<'a>) -> Self {
        Self {
            inner,
            raster: false,
        }
    }
}

/// A text style as plotters gave it, with the size and family an SVG viewer needs.
struct SvgStyle<'s, T>(&'s T);

impl<T: BackendTextStyle> BackendTextStyle for SvgStyle<'_, T> {
    type FontError = T::FontError;

    fn color(&self) -> BackendColor {
        self.0.color()
    }

    fn size(&self) -> f64 {
        // plotters' SVG backend writes font-size = size / 1.24.
        self.0.size() * 1.24
    }

    fn transform(&self) -> FontTransform {
        self.0.transform()
    }

    fn style(&self) -> FontStyle {
        self.0.style()
    }

    fn anchor(&self) -> Pos {
        self.0.anchor()
    }

    fn family(&self) -> FontFamily<'_> {
        FontFamily::Name("DejaVu Sans, Verdana, sans-serif")
    }

    fn layout_box(&self, text: &str) -> Result<((i32, i32), (i32, i32)), Self::FontError> {
        self.0.layout_box(text)
    }

    fn draw<E, F: FnMut(i32, i32, BackendColor) -> Result<(), E>>(
        &self,
        text: &str,
        pos: BackendCoord,
        draw: F,
    ) -> Result<Result<(), E>, Self::FontError> {
        self.0.draw(text, pos, draw)
    }
}

type Err<B> = DrawingErrorKind<<B as DrawingBackend>::ErrorType>;

impl<B: DrawingBackend> DrawingBackend for TextFix<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), Err<B>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), Err<B>> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), Err<B>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), Err<B>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), Err<B>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), Err<B>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), Err<B>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), Err<B>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), Err<B>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<TStyle: BackendTextStyle>(
        &self,
        text: &str,
        style: &TStyle,
    ) -> Result<(u32, u32), Err<B>> {
        Ok(text_size(text, style.size()))
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), Err<B>> {
        if !self.raster {
            return self.inner.draw_text(text, &SvgStyle(style), pos);
        }
        let color = style.color();
        let (Some(f), Some((glyphs, (w, h)))) = (font(), layout(text, style.size())) else {
            // No usable font: plotters' own drawing.
            return self.inner.draw_text(text, style, pos);
        };
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (w, h) = (w as i32, h as i32);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -w,
            HPos::Center => -w / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -h / 2,
            VPos::Bottom => -h,
        };
        let trans = style.transform();
        let (cw, ch) = self.get_size();
        let mut pixels: Vec<(i32, i32, f32)> = Vec::new();
        for g in glyphs {
            if let Some(o) = f.outline_glyph(g) {
                let b = o.px_bounds();
                let (bx, by) = (b.min.x as i32, b.min.y as i32);
                o.draw(|x, y, c| pixels.push((bx + x as i32, by + y as i32, c)));
            }
        }
        for (x, y, c) in pixels.into_iter().filter(|p| p.2 > 0.0) {
            let (x, y) = trans.transform(x + dx, y + dy);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && y >= 0 && x < cw as i32 && y < ch as i32 {
                let c = BackendColor {
                    alpha: color.alpha * f64::from(c.min(1.0)),
                    rgb: color.rgb,
                };
                self.inner.draw_pixel((x, y), c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_em_based_and_monotone() {
        let (w1, h1) = text_size("cumulative", 14.0);
        let (w2, h2) = text_size("cumulative", 28.0);
        // DejaVu Sans: ascent − descent ≈ 1.16 em.
        assert!((16..=17).contains(&h1), "{h1}");
        assert!(w2 >= 2 * w1 - 2 && h2 >= 2 * h1 - 2);
        assert!(text_size("ab", 14.0).0 < text_size("abc", 14.0).0);
        assert_eq!(text_size("", 14.0).0, 0);
    }
}
