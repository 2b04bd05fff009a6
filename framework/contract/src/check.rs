//! Range checks for experiment settings, shared by the framework's schema and by every
//! plugin's settings type, and [`locate`], which finds the line of a nested field in the RON
//! text so that an out-of-range value is reported where it was written.

/// One out-of-range setting: the dotted path of the field (relative to the section that
/// validated it until the caller prefixes it) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted field path, e.g. `budget.group_size`.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl FieldError {
    /// An error on `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error seen from the enclosing section `section` (`"environment"` turns
    /// `max_digits` into `environment.max_digits`).
    pub fn within(mut self, section: &str) -> Self {
        self.field = if self.field.is_empty() {
            section.to_string()
        } else {
            format!("{section}.{}", self.field)
        };
        self
    }
}

/// The result of a validation.
pub type Checked = Result<(), FieldError>;

/// An integer in `lo..=hi`.
pub fn count(field: &str, v: usize, lo: usize, hi: usize) -> Checked {
    if v < lo || v > hi {
        return Err(FieldError::new(
            field,
            format!("must be in {lo}..={hi} (got {v})"),
        ));
    }
    Ok(())
}

/// A difficulty vector: one value in `[0, 1]` per named dimension. The messages name the
/// dimensions when the length is wrong and the index of a value out of range.
pub fn difficulty(field: &str, values: &[f64], dims: &[&str]) -> Checked {
    if values.len() != dims.len() {
        return Err(FieldError::new(
            field,
            format!(
                "must have {} values ({}) (got {})",
                dims.len(),
                dims.join(", "),
                values.len()
            ),
        ));
    }
    for (i, &d) in values.iter().enumerate() {
        real(field, d, 0.0, 1.0)
            .map_err(|e| FieldError::new(e.field, format!("value {i} {}", e.message)))?;
    }
    Ok(())
}

/// A finite number in `[lo, hi]`.
pub fn real(field: &str, v: f64, lo: f64, hi: f64) -> Checked {
    if !v.is_finite() || v < lo || v > hi {
        return Err(FieldError::new(
            field,
            format!("must be a finite number in [{lo}, {hi}] (got {v})"),
        ));
    }
    Ok(())
}

/// A finite number in `(0, hi]`.
pub fn positive(field: &str, v: f64, hi: f64) -> Checked {
    if !v.is_finite() || v <= 0.0 || v > hi {
        return Err(FieldError::new(
            field,
            format!("must be a finite number in (0, {hi}] (got {v})"),
        ));
    }
    Ok(())
}

/// An accuracy band `(low, high)` inside `[0, 1]` with `low <= high`.
pub fn band(field: &str, (lo, hi): (f64, f64)) -> Checked {
    real(field, lo, 0.0, 1.0)?;
    real(field, hi, 0.0, 1.0)?;
    if lo > hi {
        return Err(FieldError::new(
            field,
            format!("must be (low, high) with low <= high (got ({lo}, {hi}))"),
        ));
    }
    Ok(())
}

/// 1-based line of the field `path` (dotted, e.g. `algorithm.kl.coef`) in RON `text`: the
/// key is matched together with the keys of every enclosing group, so `algorithm.lr` is not
/// confused with `policy.warm_start.lr`. Enum variants and the root struct name are not part
/// of a path (`algorithm: Ppo(lr: …)` holds `algorithm.lr`). When the field itself is not
/// written (it took its default), the line of the deepest enclosing field that is.
pub fn locate(text: &str, path: &str) -> Option<usize> {
    let want: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
    let mut best: Option<(usize, usize)> = None; // (matched depth, line)
    // Keys of the enclosing groups; `None` for a group opened without a key (the root,
    // a list element, a tuple).
    let mut stack: Vec<Option<String>> = Vec::new();
    let mut last_key: Option<String> = None;
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut line) = (0usize, 1usize);
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += 2;
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    } else if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' | '[' | '{' => {
                stack.push(last_key.take());
                i += 1;
            }
            ')' | ']' | '}' => {
                stack.pop();
                last_key = None;
                i += 1;
            }
            ',' => {
                last_key = None;
                i += 1;
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let ident: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && (chars[j] == ' ' || chars[j] == '\t') {
                    j += 1;
                }
                if chars.get(j) == Some(&':') && chars.get(j + 1) != Some(&':') {
                    let mut keys: Vec<&str> = stack.iter().flatten().map(String::as_str).collect();
                    keys.push(&ident);
                    let depth = keys.len();
                    if depth <= want.len() && keys[..] == want[..depth] {
                        let better = best.is_none_or(|(d, _)| depth > d);
                        if better {
                            best = Some((depth, line));
                        }
                    }
                    last_key = Some(ident);
                    i = j + 1;
                }
            }
            _ => i += 1,
        }
    }
    best.map(|(_, l)| l)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"Experiment(
    name: "x", // lr: 9
    policy: (
        warm_start: (lr: 3e-3, batch: 8),
    ),
    algorithm: Ppo(
        kl: (coef: 0.01),
        lr: 1e-4,
    ),
    budget: (steps: 2),
)"#;

    #[test]
    fn nested_fields_are_found_at_their_own_line() {
        assert_eq!(locate(TEXT, "algorithm.lr"), Some(8));
        assert_eq!(locate(TEXT, "policy.warm_start.lr"), Some(4));
        assert_eq!(locate(TEXT, "algorithm.kl.coef"), Some(7));
        assert_eq!(locate(TEXT, "budget.steps"), Some(10));
        assert_eq!(locate(TEXT, "name"), Some(2));
    }

    #[test]
    fn a_defaulted_field_points_at_its_section() {
        assert_eq!(locate(TEXT, "budget.group_size"), Some(10));
        assert_eq!(locate(TEXT, "algorithm.clip"), Some(6));
        assert_eq!(locate(TEXT, "reward.lambda"), None);
    }

    #[test]
    fn comments_strings_and_longer_names_do_not_match() {
        let text = "E(\n a: \"lr: 1\",\n /* lr: 2 */ max_lr: 3,\n lr: 4)";
        assert_eq!(locate(text, "lr"), Some(4));
    }

    #[test]
    fn checks_report_the_field() {
        assert!(count("n", 3, 1, 3).is_ok());
        assert_eq!(count("n", 4, 1, 3).expect_err("out").field, "n");
        assert!(real("x", f64::NAN, 0.0, 1.0).is_err());
        assert!(positive("x", 0.0, 1.0).is_err());
        assert!(band("b", (0.8, 0.2)).is_err());
        assert!(difficulty("d", &[0.0, 1.0], &["a", "b"]).is_ok());
        assert_eq!(
            difficulty("d", &[0.5], &["a", "b"])
                .expect_err("length")
                .message,
            "must have 2 values (a, b) (got 1)"
        );
        let e = difficulty("d", &[0.5, 1.5], &["a", "b"]).expect_err("range");
        assert_eq!(e.field, "d");
        assert!(e.message.starts_with("value 1 must be"), "{}", e.message);
        assert_eq!(
            FieldError::new("max_digits", "m")
                .within("environment")
                .field,
            "environment.max_digits"
        );
    }
}
