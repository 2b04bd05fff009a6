//! # rlany-kernels
//!
//! The custom operations of RLAnything, each a backend extension with a reference twin: the
//! loss-side hot spot of LLM RL (log-softmax, gather and KL over the `[tokens, vocab]`
//! logits), the transformer's attention, and the decode path's fused steps and quantized
//! products.
//!
//! - [`mod@reference`]: the reference twins, composed from ordinary Burn tensor ops; every backend
//!   (and autodiff) runs them. [`token_logprobs`] and [`kl_full`] at the crate root are these.
//! - [`LogProbOps`]: a backend extension trait with the fused ops and their backward passes.
//!   Its default method bodies are the reference composition, so `NdArray` (and any backend
//!   given an empty impl) works; the Cube backends (`wgpu`, `cuda` features) override them with
//!   one-pass CubeCL kernels; `Autodiff<B>` wires the backward passes in (one custom backward
//!   node per op, written once: `dlogits = g ⊙ (onehot − softmax)`, the gradient of `log p`).
//! - [`fused`]: tensor-level wrappers over the trait, and [`KernelChoice`] to pick fused or
//!   reference explicitly (for comparisons).
//! - [`mod@attention`]: [`AttentionOps`], the transformer's grouped-query attention as a
//!   backend extension whose autodiff backward recomputes the probabilities instead of keeping
//!   them ([`reference_grouped_attention`] is its twin).
//! - [`mod@packed`]: products with weights kept in llama.cpp's quantized blocks
//!   ([`PackedMatrix`]), for decoding a few rows on the CPU; the dense product of the same
//!   weights is the twin.
//! - `launches` (Cube backends): kernel launches counted by name through CubeCL's execution
//!   log, the device-independent measure of a launch-bound workload.
//! - [`mod@cached_attention`]: the attention of new positions over a KV cache read in place,
//!   on the host (the CPU backend's [`AttentionOps::cached_attention`]); the composition is
//!   the twin.
//! - [`mod@decode`]: the decode step's residual add and RMSNorm, rotary positions with the KV
//!   cache's write, and (on the Cube backends) the cached attention, one pass each
//!   ([`AttentionOps::add_rms_norm`], [`AttentionOps::rotary_cache_write`]); the compositions
//!   are the twins.

pub mod attention;
mod autodiff;
pub mod cached_attention;
#[cfg(feature = "cube")]
mod cube;
pub mod decode;
pub mod fused;
#[cfg(feature = "fusion")]
mod fusion;
#[cfg(feature = "cube")]
pub mod launches;
mod ops;
pub mod packed;
pub mod reference;
pub mod rotary;

pub use attention::{
    AttentionOps, grouped_attention, reference_attention_softmax, reference_grouped_attention,
    reference_softmax_backward,
};
pub use decode::{Heads, add_rms_norm, rotary_cache_write};
pub use fused::KernelChoice;
pub use ops::{AutodiffLogProbOps, KlStats, LogProbOps};
pub use packed::{
    BlockFormat, PACKED_MAX_ROWS, PackedError, PackedMatrix, packed_matmul, packed_matmul_supported,
};
pub use reference::{kl_full, token_logprobs};
pub use rotary::{reference_rotary, rotary};

#[cfg(test)]
mod tests;
