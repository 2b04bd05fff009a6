//! The crate's error type.

use std::path::PathBuf;

/// Errors while reading run directories or writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line of a JSON-lines file (`metrics.jsonl`, `adaptation.jsonl`, `posterior.jsonl`)
    /// is not what the trainer writes. A cut *last* line is not an error (a killed run leaves
    /// one): it is skipped with a warning instead.
    #[error("{path}:{line}: not a valid line: {message}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A whole JSON file (`suite.json`, a bench file, `meta.json`) is not in the expected shape.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Nothing to report.
    #[error("no run directory (a folder with metrics.jsonl) under {0}")]
    NoRuns(String),
    /// A figure could not be drawn or saved.
    #[error("{path}: drawing failed: {message}")]
    Plot {
        /// The figure file.
        path: PathBuf,
        /// The plotting library's message.
        message: String,
    },
}

/// `ReportError::Io` for `path`, for `map_err`.
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}
