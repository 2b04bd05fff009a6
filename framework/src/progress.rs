//! Progress bars for every phase longer than a few seconds. Bars draw on stderr when it is a
//! terminal and stay silent otherwise; the trainer also prints one plain line per step, so
//! runs in CI and pipes still show progress.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` units labelled `label`, or a hidden one when `enabled` is false.
pub fn bar(len: u64, label: &str, enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>12.bold} [{bar:32.cyan/blue}] {pos:>5}/{len:<5} {msg} ({elapsed} < {eta})",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(label.to_string());
    pb
}
