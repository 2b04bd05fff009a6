//! # rlany-models
//!
//! The language models of RLAnything: a Llama/Qwen2-style decoder-only [`Transformer`]
//! (policy and judge are two instances of it) with batched KV-cache generation, and the
//! character-level [`CharTokenizer`] of the built-in environments. Both implement the
//! traits of [`rlany_framework::lm`] ([`rlany_framework::CausalLm`],
//! [`rlany_framework::Tokenizer`]), generic over the Burn backend.
//!
//! Papers: Llama (arXiv 2302.13971), Qwen2 (arXiv 2407.10671), RoPE (arXiv 2104.09864),
//! grouped-query attention (arXiv 2305.13245), SwiGLU (arXiv 2002.05202), nucleus sampling
//! (arXiv 1904.09751).

mod bpe;
mod checkpoint;
mod decode;
mod error;
pub mod gguf;
pub mod gguf_export;
mod hf;
mod init;
mod kv_cache;
pub mod lora;
pub mod packed;
pub mod peft;
mod pretrained;
#[cfg(test)]
mod test_support;
mod tokenizer;
mod transformer;
mod weights;

pub use bpe::{BpeSpec, BpeTokenizer, PreTokenizer, SpecialIds};
pub use decode::Contexts;
pub use error::ModelError;
pub use hf::{HfArch, load_hf_dir, read_hf_config, save_hf_dir};
pub use kv_cache::KvCache;
pub use packed::PackedWeights;
pub use pretrained::{
    ChatTemplate, Pretrained, Role, is_pretrained_source, load_pretrained, packed_weights,
};
pub use tokenizer::CharTokenizer;
pub use transformer::{Transformer, TransformerConfig};
pub use weights::{HfWeights, HostTensor, transformer_from_hf, transformer_to_hf};
