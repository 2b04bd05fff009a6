//! Text of the figures: a thin wrapper around plotters' SVG backend that measures text itself
//! with ab_glyph on the bundled font.
//!
//! Why: plotters 0.3.7's ab_glyph text drawing places each glyph at the pen position without
//! its left side bearing, which spaces letters unevenly ("cumul at ive"), and scales by the
//! font's height rather than its em, while its SVG backend writes `font-size = size / 1.24`.
//! Here `size` is pixels per em in both (as CSS `font-size`), glyphs sit on a common baseline
//! at their proper offsets, and the layout box is `ascent − descent` high with the baseline
//! `ascent` below its top.

use ab_glyph::{Font, FontRef, Glyph, PxScale, ScaleFont, point};
use plotters::prelude::SVGBackend;
use plotters_backend::text_anchor::Pos;
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

/// A plotters backend with this module's text: passed on with the size in pixels per em
/// (plotters' SVG writes `size / 1.24`) and DejaVu Sans named first, and measured here, so the
/// layout is the bundled font's whatever font the viewer has.
pub(crate) struct TextFix<B> {
    inner: B,
}

impl<'a> TextFix<SVGBackend<'a>> {
    /// Wraps an SVG backend: text stays text.
    pub(crate) fn svg(inner: SVGBackend<'a>) -> Self {
        Self { inner }
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
        self.inner.draw_text(text, &SvgStyle(style), pos)
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
