//! # rlany-envs
//!
//! Procedural text environments for RLAnything. Each environment implements
//! [`rlany_framework::Environment`] (a task family with a difficulty vector in `[0, 1]^k`)
//! and hands out [`rlany_framework::Episode`]s (text in, text out, one line per step) with a
//! verifier, oracle step labels, an expert and an out-of-distribution split.
//!
//! Environments never touch tensors and have no Burn dependency. Any action text, garbage
//! included, is accepted without panicking: a malformed action is a wasted step.
//!
//! - [`arith`]: multi-step arithmetic chains (`7+5=12`, `12-3=9`, `A:9`).

pub mod arith;
pub mod gp;

pub use arith::{Arith, ArithConfig, ArithEpisode};
