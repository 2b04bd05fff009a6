//! Progress for every phase longer than a few seconds. On a terminal: an indicatif bar on
//! stderr. Elsewhere (CI logs, pipes): a plain line at every tenth of the way, so long phases
//! still show life. The trainer also prints one plain line per step.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A phase's progress: a bar, plain lines, or nothing.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    plain: Option<(String, u64, u64)>,
    message: String,
}

/// Progress over `len` units labelled `label`; silent when `enabled` is false.
pub fn bar(len: u64, label: &str, enabled: bool) -> Progress {
    let (bar, plain) = match (enabled, std::io::stderr().is_terminal()) {
        (false, _) => (None, None),
        (true, true) => {
            let pb = ProgressBar::new(len);
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix:>12.bold} [{bar:32.cyan/blue}] {pos:>5}/{len:<5} {msg} ({elapsed} < {eta})",
            ) {
                pb.set_style(style.progress_chars("=> "));
            }
            pb.set_prefix(label.to_string());
            (Some(pb), None)
        }
        // Plain lines only for phases long enough to need them.
        (true, false) if len >= 50 => (None, Some((label.to_string(), len, 0))),
        (true, false) => (None, None),
    };
    Progress {
        bar,
        plain,
        message: String::new(),
    }
}

impl Progress {
    /// Advances by `n` units.
    pub fn inc(&mut self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
        if let Some((label, len, pos)) = &mut self.plain {
            let before = *pos * 10 / (*len).max(1);
            *pos += n;
            let after = *pos * 10 / (*len).max(1);
            if after > before {
                eprintln!("{label}: {pos}/{len} {}", self.message);
            }
        }
    }

    /// Moves to position `pos` (plain lines: printed when a tenth of the way is crossed).
    pub fn set_position(&mut self, pos: u64) {
        if let Some(b) = &self.bar {
            b.set_position(pos);
        }
        if let Some((_, _, cur)) = &self.plain {
            let n = pos.saturating_sub(*cur);
            if n > 0 {
                self.inc(n);
            }
        }
    }

    /// Prints a line above the bar (plain: on stdout).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => println!("{line}"),
        }
    }

    /// Sets the text shown beside the bar (and on plain lines).
    pub fn set_message(&mut self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg.clone());
        }
        self.message = msg;
    }

    /// Removes the bar.
    pub fn finish_and_clear(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
