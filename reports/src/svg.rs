//! Compact SVG: the same drawing as plotters' SVG backend writes, in about a third of the
//! bytes.
//!
//! Why: plotters writes every element with its full style (`opacity="1" fill="#1F77B4"
//! stroke="none" stroke-width="1"` on each of a scatter's thousands of dots) and each
//! two-point segment of a marker as a `<polyline>` of its own; the committed reports' figures
//! were 17.6 MB of SVG, mostly that. Here each distinct style becomes one CSS class, runs of
//! elements with the same opaque style share a `<g>`, consecutive opaque strokes of one style
//! become one `<path>` (relative coordinates), polygons become paths, and a dot drawn twice at
//! the same place in one opaque run is written once. Measured on the committed figures:
//! 17.6 MB → 5.8 MB (`reports/perf/NOTES.md`, §17).
//!
//! What makes it the same drawing: an element's own `opacity` applies to that element alone,
//! so a translucent style is never grouped or merged (a `<g opacity>` would composite its
//! children once, and a merged path would not darken where its parts overlap); an opaque
//! run's union is the same pixels in any order; text keeps its position, anchor, `dy` and
//! `transform`, and its content is plotters' escaped text with the surrounding newlines (which
//! SVG's whitespace rules drop) removed. Anything else (an element this module does not know)
//! is written as it came, in place, and ends the run around it.

use std::collections::HashSet;
use std::fmt::Write as _;

/// What a compact file starts its body with; a file that has it is left as it is.
const MARK: &str = "<style>";

/// Attributes that place an element; every other one is style.
const GEOMETRY: [&str; 14] = [
    "x",
    "y",
    "x1",
    "y1",
    "x2",
    "y2",
    "cx",
    "cy",
    "r",
    "points",
    "width",
    "height",
    "transform",
    "dy",
];

/// Why an SVG could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SVG at byte {at}: {what}")]
pub struct SvgError {
    /// Byte offset into the input.
    pub at: usize,
    /// What was expected there.
    pub what: &'static str,
}

/// One element as plotters wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Element<'a> {
    tag: &'a str,
    geometry: Vec<(&'a str, &'a str)>,
    style: Vec<(&'a str, &'a str)>,
    /// Text content (trimmed), for elements with a closing tag.
    text: Option<&'a str>,
    /// The element's source, written as it came when it cannot be rewritten.
    source: &'a str,
}

/// Rewrites plotters' SVG as the same drawing in fewer bytes; an SVG already compact (it has a
/// `<style>` block, which plotters never writes) comes back unchanged.
///
/// # Errors
/// [`SvgError`] where the input is not a `<svg …>` element of `name="value"` attributes and
/// child elements.
pub fn compact(svg: &str) -> Result<String, SvgError> {
    if svg.contains(MARK) {
        return Ok(svg.to_string());
    }
    let open_end = svg
        .find('>')
        .filter(|_| svg.trim_start().starts_with("<svg"))
        .ok_or(SvgError {
            at: 0,
            what: "an opening <svg …> tag",
        })?;
    let head = &svg[..=open_end];
    let elements = parse_children(svg, open_end + 1)?;

    let mut classes: Vec<&[(&str, &str)]> = Vec::new();
    let mut body = String::with_capacity(svg.len() / 3);
    let mut i = 0;
    while i < elements.len() {
        if !known(elements[i].tag) {
            body.push_str(elements[i].source);
            body.push('\n');
            i += 1;
            continue;
        }
        let style = &elements[i].style;
        let mut j = i + 1;
        while j < elements.len() && known(elements[j].tag) && elements[j].style == *style {
            j += 1;
        }
        let class = match classes.iter().position(|c| *c == style.as_slice()) {
            Some(n) => n,
            None => {
                classes.push(style);
                classes.len() - 1
            }
        };
        write_run(&mut body, &elements[i..j], class);
        i = j;
    }

    let mut out = String::with_capacity(body.len() + 64 * classes.len() + head.len() + 32);
    out.push_str(head);
    out.push('\n');
    out.push_str(MARK);
    out.push('\n');
    for (n, style) in classes.iter().enumerate() {
        let _ = write!(out, ".c{n}{{");
        for (k, (name, value)) in style.iter().enumerate() {
            let sep = if k == 0 { "" } else { ";" };
            let unit = if matches!(*name, "font-size" | "stroke-width") && is_number(value) {
                "px"
            } else {
                ""
            };
            let _ = write!(out, "{sep}{name}:{value}{unit}");
        }
        out.push_str("}\n");
    }
    out.push_str("</style>\n");
    out.push_str(&body);
    out.push_str("</svg>\n");
    Ok(out)
}

fn known(tag: &str) -> bool {
    matches!(
        tag,
        "rect" | "text" | "circle" | "line" | "polyline" | "polygon"
    )
}

fn is_number(v: &str) -> bool {
    v.parse::<f64>().is_ok()
}

fn opaque(style: &[(&str, &str)]) -> bool {
    !style
        .iter()
        .any(|(k, _)| matches!(*k, "opacity" | "fill-opacity" | "stroke-opacity"))
}

/// Writes one run of elements that share `class`'s style.
fn write_run(out: &mut String, run: &[Element<'_>], class: usize) {
    let shared = opaque(&run[0].style);
    let mut parts: Vec<String> = Vec::with_capacity(run.len());
    let mut strokes = String::new();
    let mut seen_dots: HashSet<&[(&str, &str)]> = HashSet::new();
    let flush = |strokes: &mut String, parts: &mut Vec<String>| {
        if !strokes.is_empty() {
            parts.push(format!("<path d=\"{strokes}\"/>"));
            strokes.clear();
        }
    };
    for e in run {
        let path = match e.tag {
            "line" => ["x1", "y1", "x2", "y2"]
                .iter()
                .map(|k| attr(&e.geometry, k).and_then(int))
                .collect::<Option<Vec<i64>>>()
                .map(|v| relative(&[(v[0], v[1]), (v[2], v[3])])),
            "polyline" | "polygon" => attr(&e.geometry, "points")
                .and_then(points)
                .filter(|p| !p.is_empty())
                .map(|p| relative(&p)),
            _ => None,
        };
        match (e.tag, path) {
            ("line" | "polyline", Some(d)) => {
                strokes.push_str(&d);
                if !shared {
                    flush(&mut strokes, &mut parts);
                }
            }
            ("polygon", Some(d)) => {
                flush(&mut strokes, &mut parts);
                parts.push(format!("<path d=\"{d}z\"/>"));
            }
            _ => {
                flush(&mut strokes, &mut parts);
                if shared && e.tag == "circle" && !seen_dots.insert(&e.geometry) {
                    continue;
                }
                let mut s = format!("<{}", e.tag);
                for (k, v) in &e.geometry {
                    let _ = write!(s, " {k}=\"{v}\"");
                }
                match e.text {
                    Some(t) => {
                        let _ = write!(s, ">{t}</{}>", e.tag);
                    }
                    None => s.push_str("/>"),
                }
                parts.push(s);
            }
        }
    }
    flush(&mut strokes, &mut parts);
    if shared && parts.len() > 1 {
        let _ = writeln!(out, "<g class=\"c{class}\">");
        for p in &parts {
            out.push_str(p);
            out.push('\n');
        }
        out.push_str("</g>\n");
    } else {
        for p in &parts {
            // `<tag …` → `<tag class="cN" …`
            let at = p.find([' ', '/', '>']).unwrap_or(p.len());
            out.push_str(&p[..at]);
            let _ = write!(out, " class=\"c{class}\"");
            out.push_str(&p[at..]);
            out.push('\n');
        }
    }
}

fn attr<'a>(list: &[(&str, &'a str)], name: &str) -> Option<&'a str> {
    list.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

fn int(v: &str) -> Option<i64> {
    v.parse().ok()
}

/// `"1,2 3,4 "` → `[(1, 2), (3, 4)]`; `None` unless every point is two integers.
fn points(list: &str) -> Option<Vec<(i64, i64)>> {
    list.split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',')?;
            Some((int(x)?, int(y)?))
        })
        .collect()
}

/// A path's data for a polyline through `pts`: the first point absolute, the rest relative.
fn relative(pts: &[(i64, i64)]) -> String {
    let mut d = format!("M{} {}", pts[0].0, pts[0].1);
    if pts.len() > 1 {
        d.push('l');
        for (k, w) in pts.windows(2).enumerate() {
            if k > 0 {
                d.push(' ');
            }
            let _ = write!(d, "{} {}", w[1].0 - w[0].0, w[1].1 - w[0].1);
        }
    }
    d
}

/// The children of the root element, from byte `from` to `</svg>`.
fn parse_children(s: &str, mut at: usize) -> Result<Vec<Element<'_>>, SvgError> {
    let mut out = Vec::new();
    loop {
        let rest = &s[at..];
        let skip = rest.len() - rest.trim_start().len();
        at += skip;
        let rest = &s[at..];
        if rest.starts_with("</svg>") {
            return Ok(out);
        }
        if !rest.starts_with('<') {
            return Err(SvgError {
                at,
                what: "an element or </svg>",
            });
        }
        let (element, next) = parse_element(s, at)?;
        out.push(element);
        at = next;
    }
}

/// One element starting at `s[start] == '<'`; returns it and the byte after it.
fn parse_element(s: &str, start: usize) -> Result<(Element<'_>, usize), SvgError> {
    let err = |at, what| SvgError { at, what };
    let bytes = s.as_bytes();
    let mut at = start + 1;
    while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'-') {
        at += 1;
    }
    let tag = &s[start + 1..at];
    if tag.is_empty() {
        return Err(err(at, "a tag name"));
    }
    let mut geometry = Vec::new();
    let mut style = Vec::new();
    let attrs = loop {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if s[at..].starts_with("/>") {
            break (at + 2, None);
        }
        if s[at..].starts_with('>') {
            let close = format!("</{tag}>");
            let end = s[at + 1..]
                .find(&close)
                .ok_or(err(at, "the element's closing tag"))?;
            let text = s[at + 1..at + 1 + end].trim();
            break (at + 1 + end + close.len(), Some(text));
        }
        let name_start = at;
        while at < bytes.len() && bytes[at] != b'=' && !bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        let name = &s[name_start..at];
        if name.is_empty() || !s[at..].starts_with("=\"") {
            return Err(err(at, "name=\"value\""));
        }
        at += 2;
        let len = s[at..].find('"').ok_or(err(at, "a closing quote"))?;
        let value = &s[at..at + len];
        at += len + 1;
        if GEOMETRY.contains(&name) {
            geometry.push((name, value));
        } else {
            style.push((name, value));
        }
    };
    let (next, text) = attrs;
    // Defaults that change nothing: full opacity; a stroke width where there is no stroke.
    style.retain(|(k, v)| !(*k == "opacity" && *v == "1"));
    if style.contains(&("stroke", "none")) {
        style.retain(|(k, _)| *k != "stroke-width");
    }
    // A line has no fill in SVG, a path does: say so, as plotters' polylines do.
    if tag == "line" && attr(&style, "fill").is_none() {
        style.push(("fill", "none"));
    }
    Ok((
        Element {
            tag,
            geometry,
            style,
            text,
            source: &s[start..next],
        },
        next,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str =
        r#"<svg width="10" height="10" viewBox="0 0 10 10" xmlns="http://www.w3.org/2000/svg">"#;

    fn svg(body: &str) -> String {
        format!("{HEAD}\n{body}</svg>\n")
    }

    #[test]
    fn opaque_strokes_of_one_style_become_one_path_in_a_group() {
        let input = svg(concat!(
            "<polyline fill=\"none\" opacity=\"1\" stroke=\"#C81E1E\" stroke-width=\"3\" points=\"93,235 103,245 \"/>\n",
            "<polyline fill=\"none\" opacity=\"1\" stroke=\"#C81E1E\" stroke-width=\"3\" points=\"93,245 103,235 \"/>\n",
            "<line opacity=\"1\" stroke=\"#E1E1E1\" stroke-width=\"1\" x1=\"126\" y1=\"313\" x2=\"126\" y2=\"81\"/>\n",
        ));
        let want = format!(
            "{HEAD}\n<style>\n.c0{{fill:none;stroke:#C81E1E;stroke-width:3px}}\n\
             .c1{{stroke:#E1E1E1;stroke-width:1px;fill:none}}\n</style>\n\
             <path class=\"c0\" d=\"M93 235l10 10M93 245l10 -10\"/>\n\
             <path class=\"c1\" d=\"M126 313l0 -232\"/>\n</svg>\n"
        );
        assert_eq!(compact(&input).expect("compact"), want);
    }

    #[test]
    fn translucent_shapes_stay_apart_and_opaque_dots_are_written_once() {
        let input = svg(concat!(
            "<polygon opacity=\"0.18\" fill=\"#1F77B4\" points=\"0,0 4,0 4,3 \"/>\n",
            "<polygon opacity=\"0.18\" fill=\"#1F77B4\" points=\"1,1 2,2 \"/>\n",
            "<circle cx=\"5\" cy=\"6\" r=\"4\" opacity=\"1\" fill=\"#5A5A5A\" stroke=\"none\" stroke-width=\"1\"/>\n",
            "<circle cx=\"7\" cy=\"6\" r=\"4\" opacity=\"1\" fill=\"#5A5A5A\" stroke=\"none\" stroke-width=\"1\"/>\n",
            "<circle cx=\"5\" cy=\"6\" r=\"4\" opacity=\"1\" fill=\"#5A5A5A\" stroke=\"none\" stroke-width=\"1\"/>\n",
            "<circle cx=\"5\" cy=\"6\" r=\"4\" opacity=\"0.5\" fill=\"#5A5A5A\" stroke=\"none\"/>\n",
            "<circle cx=\"5\" cy=\"6\" r=\"4\" opacity=\"0.5\" fill=\"#5A5A5A\" stroke=\"none\"/>\n",
        ));
        let out = compact(&input).expect("compact");
        let want = format!(
            "{HEAD}\n<style>\n.c0{{opacity:0.18;fill:#1F77B4}}\n\
             .c1{{fill:#5A5A5A;stroke:none}}\n.c2{{opacity:0.5;fill:#5A5A5A;stroke:none}}\n</style>\n\
             <path class=\"c0\" d=\"M0 0l4 0 0 3z\"/>\n<path class=\"c0\" d=\"M1 1l1 1z\"/>\n\
             <g class=\"c1\">\n<circle cx=\"5\" cy=\"6\" r=\"4\"/>\n<circle cx=\"7\" cy=\"6\" r=\"4\"/>\n</g>\n\
             <circle class=\"c2\" cx=\"5\" cy=\"6\" r=\"4\"/>\n<circle class=\"c2\" cx=\"5\" cy=\"6\" r=\"4\"/>\n</svg>\n"
        );
        assert_eq!(out, want);
    }

    #[test]
    fn text_keeps_its_place_and_unknown_elements_pass_through() {
        let input = svg(concat!(
            "<text x=\"6\" y=\"197\" dy=\"0.76em\" text-anchor=\"middle\" font-family=\"DejaVu Sans, sans-serif\" ",
            "font-size=\"15\" opacity=\"1\" fill=\"#000000\" transform=\"rotate(270, 6, 197)\">\nA &lt; B\n</text>\n",
            "<image x=\"0\" y=\"0\" href=\"a.png\"/>\n",
        ));
        let want = format!(
            "{HEAD}\n<style>\n.c0{{text-anchor:middle;font-family:DejaVu Sans, sans-serif;font-size:15px;fill:#000000}}\n</style>\n\
             <text class=\"c0\" x=\"6\" y=\"197\" dy=\"0.76em\" transform=\"rotate(270, 6, 197)\">A &lt; B</text>\n\
             <image x=\"0\" y=\"0\" href=\"a.png\"/>\n</svg>\n"
        );
        let out = compact(&input).expect("compact");
        assert_eq!(out, want);
        assert_eq!(
            compact(&out).expect("again"),
            out,
            "a compact file is left as it is"
        );
    }

    #[test]
    fn malformed_input_says_where() {
        let e = compact(&svg("<rect x=1/>\n")).expect_err("unquoted");
        assert_eq!(e.what, "name=\"value\"");
        assert_eq!(e.at, HEAD.len() + 1 + 7);
        assert!(compact("<html>").is_err());
        assert!(compact(&svg("<text x=\"1\">no end")).is_err());
    }
}
