//! # rlany-kernels
//!
//! The loss-side hot spot of LLM RL: log-softmax, gather and KL over the `[tokens, vocab]`
//! logits. This crate holds the reference implementations, built from ordinary Burn tensor
//! ops so that every backend (and autodiff) runs them. Fused CubeCL kernels for the Cube
//! backends (wgpu, cuda) are the next step (see the project's issues); each will be tested
//! against the twin here.

pub mod reference;

pub use reference::{kl_full, token_logprobs};
