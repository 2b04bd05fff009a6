//! # rlany-contract
//!
//! What an environment or a difficulty proposer of RLAnything implements, and nothing more:
//! no Burn, no tensors, so a plugin crate compiles in seconds.
//!
//! - [`mod@env`]: the [`Environment`] and [`Episode`] traits and what a step answers
//!   ([`StepResult`]), the difficulty space ([`Dim`]), splits and an environment's health;
//! - [`rng`]: the one random number generator ([`Rng`]), streams derived by name;
//! - [`check`]: range checks for a plugin's settings, with field paths;
//! - [`plugin`]: how a plugin's settings enter an experiment file ([`plugin::EnvironmentPlugin`],
//!   [`plugin::ProposerPlugin`]);
//! - [`conformance`]: the checks every environment must pass (`rlany env NAME --check` runs
//!   them; a plugin crate's tests call [`conformance::assert_conforms`]);
//! - [`adapt`]: the difficulty proposer interface ([`adapt::Proposer`]) and the per-slot
//!   state machine the loop drives, with the method's own rules (`Static`, `Threshold`).
//!
//! The framework (`rlany-framework`) re-exports every module under the same path, so
//! `rlany_framework::env::Environment` and `rlany_contract::env::Environment` are one trait.

pub mod adapt;
pub mod check;
pub mod conformance;
pub mod env;
pub mod fnv;
pub mod plugin;
pub mod rng;
#[cfg(test)]
mod testing;

pub use env::{Difficulty, Dim, EnvHealth, Environment, Episode, Split, StepResult};
pub use rng::Rng;
