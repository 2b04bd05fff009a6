//! The one error type of the crate.

use std::path::PathBuf;

/// What can go wrong when building, saving or loading a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A [`TransformerConfig`](crate::TransformerConfig) that cannot describe a model.
    #[error("invalid transformer config: {0}")]
    InvalidConfig(String),
    /// Writing the weights or the config file failed.
    #[error("cannot save the model to {}: {message}", path.display())]
    Save {
        /// The file that could not be written.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Reading the weights failed (missing, unreadable or corrupt file).
    #[error("cannot load the model from {}: {message}", path.display())]
    Load {
        /// The file that could not be read.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The weights were read but their shapes do not fit the given config.
    #[error("the weights in {} do not match the config: {message}", path.display())]
    Mismatch {
        /// The weights file.
        path: PathBuf,
        /// The first difference found.
        message: String,
    },
    /// A tokenizer description that cannot be used (bad vocabulary, merges or ids, or an
    /// unsupported pre-tokenizer).
    #[error("invalid tokenizer: {0}")]
    Tokenizer(String),
    /// Reading a tokenizer file failed (missing, unreadable, unsupported or invalid).
    #[error("cannot load the tokenizer from {}: {message}", path.display())]
    TokenizerFile {
        /// The tokenizer file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}
