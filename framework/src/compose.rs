//! An experiment written as a change to another: `base: "quickstart.ron"` (a path relative
//! to the file) plus only the fields that differ.
//!
//! The files are merged as RON text before the typed parse, field by field: a field the
//! change names replaces the base's, except that two structs of the same name (or two
//! unnamed ones, `policy: (...)`) are merged field by field in turn; a choice that names
//! another variant (`judge: Frozen(...)` over `judge: Learned(...)`), a list or a number is
//! replaced whole. Bases may have bases; a chain that loops is refused, named. The merged
//! text is then read and validated like any file, so `resolved.ron` and `rlany check` show
//! the whole experiment, and an error names the file (and line) that holds the field.
//!
//! The values are kept as the files spell them (only their brackets, strings and comments
//! are scanned), so nothing is re-serialised and a merged experiment is exactly what the same
//! fields written in one file would be.

use crate::experiment::ExperimentError;
use std::path::{Path, PathBuf};

fn options() -> ron::Options {
    ron::Options::default()
        .with_default_extension(ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES)
}

/// The index after the comment or string starting at `i`, if one does.
fn skip_literal(b: &[u8], i: usize) -> Option<usize> {
    let at = |k: usize| b.get(k).copied();
    match (at(i)?, at(i + 1)) {
        (b'/', Some(b'/')) => Some(
            b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n + 1),
        ),
        (b'/', Some(b'*')) => Some(
            b[i + 2..]
                .windows(2)
                .position(|w| w == b"*/")
                .map_or(b.len(), |n| i + 2 + n + 2),
        ),
        (b'"', _) => {
            let mut k = i + 1;
            while k < b.len() && b[k] != b'"' {
                k += if b[k] == b'\\' { 2 } else { 1 };
            }
            Some((k + 1).min(b.len()))
        }
        (b'r', Some(b'"' | b'#')) => {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if at(i + 1 + hashes) != Some(b'"') {
                return None;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = i + 2 + hashes;
            Some(
                b[body..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |n| body + n + close.len()),
            )
        }
        _ => None,
    }
}

/// The index of the first token at or after `i` (blanks and comments skipped).
fn skip_blank(b: &[u8], mut i: usize) -> usize {
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        match (b.get(i), b.get(i + 1)) {
            (Some(b'/'), Some(b'/' | b'*')) => i = skip_literal(b, i).unwrap_or(b.len()),
            _ => return i,
        }
    }
}

/// The end of the value starting at `i`: the index after its last token, before the `,` or
/// the closing bracket that ends it (comments after it are not part of it).
fn value_end(b: &[u8], mut i: usize) -> usize {
    let (mut depth, mut last) = (0usize, i);
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if let Some(next) = skip_literal(b, i) {
            if b[i] != b'/' {
                last = next;
            }
            i = next;
            continue;
        }
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => return last,
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => return last,
            _ => {}
        }
        i += 1;
        last = i;
    }
    last
}

fn ident_end(b: &[u8], i: usize) -> usize {
    let mut k = i;
    while k < b.len() && (b[k] == b'_' || b[k].is_ascii_alphanumeric()) {
        k += 1;
    }
    if k > i && b[i].is_ascii_digit() { i } else { k }
}

/// A value that is a struct with named fields: its name (empty when unnamed) and its fields
/// as written, `(name, raw value text)` in order; `None` for anything else (a list, a tuple,
/// `Some(3)`, a number) and for text after the closing bracket.
fn as_struct(raw: &str) -> Option<(String, Vec<(String, String)>)> {
    let b = raw.as_bytes();
    let start = skip_blank(b, 0);
    let name_end = ident_end(b, start);
    let open = skip_blank(b, name_end);
    if b.get(open) != Some(&b'(') {
        return None;
    }
    let name = raw[start..name_end].to_string();
    let mut fields = Vec::new();
    let mut i = skip_blank(b, open + 1);
    loop {
        if b.get(i) == Some(&b')') {
            break;
        }
        let key_end = ident_end(b, i);
        let colon = skip_blank(b, key_end);
        if key_end == i || b.get(colon) != Some(&b':') || b.get(colon + 1) == Some(&b':') {
            return None;
        }
        let value = skip_blank(b, colon + 1);
        let end = value_end(b, value);
        if end == value {
            return None;
        }
        fields.push((raw[i..key_end].to_string(), raw[value..end].to_string()));
        i = skip_blank(b, end);
        if b.get(i) == Some(&b',') {
            i = skip_blank(b, i + 1);
        } else if b.get(i) != Some(&b')') {
            return None;
        }
    }
    (skip_blank(b, i + 1) == b.len()).then_some((name, fields))
}

/// The top-level fields of an experiment file (`Experiment(...)`).
struct Fields;

impl Fields {
    fn of(text: &str) -> Option<Vec<(String, String)>> {
        as_struct(text)
            .filter(|(name, _)| name.is_empty() || name == "Experiment")
            .map(|(_, f)| f)
    }
}

/// `child` over `base`: structs of one name merged field by field, anything else replaced.
fn merge(base: &str, child: &str) -> String {
    match (as_struct(base), as_struct(child)) {
        (Some((bn, bf)), Some((cn, cf))) if bn == cn => render(&bn, &merge_fields(bf, cf), 1),
        _ => child[skip_blank(child.as_bytes(), 0)..]
            .trim_end()
            .to_string(),
    }
}

fn merge_fields(
    base: Vec<(String, String)>,
    child: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = base
        .into_iter()
        .map(|(k, b)| match child.iter().find(|(ck, _)| *ck == k) {
            Some((_, c)) => {
                let merged = merge(&b, c);
                (k, merged)
            }
            None => (k, b),
        })
        .collect();
    for (k, c) in child {
        if !out.iter().any(|(ok, _)| *ok == k) {
            out.push((k, c));
        }
    }
    out
}

/// `name(` one field per line `)`, nested values indented by `depth`.
fn render(name: &str, fields: &[(String, String)], depth: usize) -> String {
    let pad = "    ".repeat(depth);
    let mut s = format!("{name}(\n");
    for (k, v) in fields {
        s.push_str(&format!("{pad}{k}: {v},\n"));
    }
    s.push_str(&"    ".repeat(depth - 1));
    s.push(')');
    s
}

/// A file merged with its chain of bases.
#[derive(Debug, Clone)]
pub(crate) struct Composed {
    /// The merged experiment, as RON.
    pub text: String,
    /// The files of the chain with their text, the change first, then its base, and so on.
    pub files: Vec<(PathBuf, String)>,
    /// Each top-level field of `text` with its first and last line (1-based).
    spans: Vec<(String, usize, usize)>,
}

impl Composed {
    /// The file holding `field` (a dotted path) and the line of its key there: the nearest
    /// file of the chain that writes the field, else the nearest that writes its top-level
    /// field, else the change itself.
    pub fn locate(&self, field: &str) -> (PathBuf, Option<usize>) {
        let top = field.split(['.', '[']).next().unwrap_or(field);
        for wanted in [field, top] {
            for (path, text) in &self.files {
                if let Some(line) = crate::check::locate(text, wanted) {
                    let writes = wanted != top
                        || Fields::of(text).is_some_and(|f| f.iter().any(|(k, _)| k == top));
                    if writes {
                        return (path.clone(), Some(line));
                    }
                }
            }
        }
        (self.files[0].0.clone(), None)
    }

    /// The top-level field whose text holds line `line` of the merged text.
    pub fn field_at(&self, line: usize) -> Option<&str> {
        self.spans
            .iter()
            .find(|(_, a, b)| (*a..=*b).contains(&line))
            .map(|(k, _, _)| k.as_str())
    }

    /// The chain as `a.ron → b.ron`.
    pub fn chain(&self) -> String {
        self.files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

fn invalid(path: &Path, text: &str, message: String) -> ExperimentError {
    ExperimentError::Invalid {
        path: path.to_path_buf(),
        location: crate::check::locate(text, "base")
            .map(|l| format!(":{l}"))
            .unwrap_or_default(),
        field: "base".into(),
        message,
    }
}

/// `text` (the file `path`) merged with its chain of bases, or `None` when it names no base
/// (or does not parse as a struct: the typed parse then reports why).
pub(crate) fn compose(text: &str, path: &Path) -> Result<Option<Composed>, ExperimentError> {
    compose_chain(text, path, &mut Vec::new())
}

fn compose_chain(
    text: &str,
    path: &Path,
    seen: &mut Vec<PathBuf>,
) -> Result<Option<Composed>, ExperimentError> {
    let Some(mut fields) = Fields::of(text) else {
        return Ok(None);
    };
    let Some(i) = fields.iter().position(|(k, _)| k == "base") else {
        return Ok(None);
    };
    let (_, raw) = fields.remove(i);
    let base: String = options().from_str(&raw).map_err(|_| {
        invalid(
            path,
            text,
            format!("expected a file name in quotes, found {raw}"),
        )
    })?;
    let here = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    seen.push(here);
    let base_path = path.parent().unwrap_or(Path::new(".")).join(&base);
    let canonical = base_path
        .canonicalize()
        .unwrap_or_else(|_| base_path.clone());
    if seen.contains(&canonical) {
        let mut names: Vec<String> = seen.iter().map(|p| p.display().to_string()).collect();
        names.push(canonical.display().to_string());
        return Err(invalid(
            path,
            text,
            format!("closes a loop of bases: {}", names.join(" → ")),
        ));
    }
    let base_text = std::fs::read_to_string(&base_path).map_err(|source| {
        invalid(
            path,
            text,
            format!("cannot read {}: {source}", base_path.display()),
        )
    })?;
    let (base_merged, mut files) = match compose_chain(&base_text, &base_path, seen)? {
        Some(c) => (c.text, c.files),
        None => (
            base_text.clone(),
            vec![(base_path.clone(), base_text.clone())],
        ),
    };
    let Some(base_fields) = Fields::of(&base_merged) else {
        // The base does not parse: read alone, it reports its own error.
        return Err(invalid(
            path,
            text,
            format!(
                "its base {} is not a valid experiment file",
                base_path.display()
            ),
        ));
    };
    let merged = merge_fields(base_fields, fields);
    let mut out = String::from("Experiment(\n");
    let mut spans = Vec::new();
    for (k, v) in &merged {
        let first = out.lines().count() + 1;
        out.push_str(&format!("    {k}: {v},\n"));
        spans.push((k.clone(), first, out.lines().count()));
    }
    out.push_str(")\n");
    files.insert(0, (path.to_path_buf(), text.to_string()));
    Ok(Some(Composed {
        text: out,
        files,
        spans,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_end_at_their_own_comma_whatever_their_strings_and_comments_hold() {
        let text = "// head (\nExperiment(\n    command: [\"a,b)\", r#\"x\"y\"#], // tail, )\n    \
                    n: 3 /* ) */\n)\n// after\n";
        let f = Fields::of(text).expect("fields");
        assert_eq!(
            f,
            [
                ("command".into(), "[\"a,b)\", r#\"x\"y\"#]".into()),
                ("n".into(), "3".into())
            ]
        );
        assert_eq!(Fields::of("Experiment(n: 3) extra"), None);
        assert_eq!(as_struct("(1, 2)"), None);
        assert_eq!(as_struct("[(a: 1)]"), None);
    }

    #[test]
    fn structs_of_one_name_merge_and_other_values_are_replaced() {
        let base = "Experiment(name: \"a\", policy: (warm_start: (steps: 300, lr: 3e-3), \
                    sampling: (top_p: 1.0)), judge: Learned(lr: 1e-4, temperature: 0.8), \
                    seeds: [1, 2])";
        let child = "Experiment(\n  // a change\n  policy: (warm_start: (steps: 10)),\n  \
                     judge: Frozen(temperature: 0.5),\n  seeds: [3],\n  name: \"b\",\n)";
        let b = Fields::of(base).expect("base");
        let c = Fields::of(child).expect("child");
        let m = merge_fields(b, c);
        let get = |k: &str| m.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
        assert_eq!(get("name").as_deref(), Some("\"b\""));
        assert_eq!(get("seeds").as_deref(), Some("[3]"));
        // Another variant: replaced whole (no `lr` carried over from Learned).
        assert_eq!(get("judge").as_deref(), Some("Frozen(temperature: 0.5)"));
        // Unnamed structs: merged to any depth.
        let policy = get("policy").expect("policy");
        let p = as_struct(&policy).expect("struct").1;
        let ws = as_struct(&p[0].1).expect("warm_start").1;
        assert_eq!(
            ws,
            [("steps".into(), "10".into()), ("lr".into(), "3e-3".into())]
        );
        assert_eq!(p[1], ("sampling".into(), "(top_p: 1.0)".into()));
    }

    #[test]
    fn same_variants_merge_field_by_field_and_comments_before_a_value_are_skipped() {
        let merged = merge(
            "Learned(lr: 1e-4, temperature: 0.8)",
            "// warmer\n Learned(temperature: 1.0)",
        );
        assert_eq!(merged, "Learned(\n    lr: 1e-4,\n    temperature: 1.0,\n)");
        assert_eq!(merge("Some(3)", "None"), "None");
        assert_eq!(
            merge("Some(r: 8, alpha: 16)", "Some(r: 4)"),
            "Some(\n    r: 4,\n    alpha: 16,\n)"
        );
        assert_eq!(merge("[1, 2]", "[3]"), "[3]");
    }
}
