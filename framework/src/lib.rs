//! # rlany-framework
//!
//! The traits, the experiment schema and the closed loop of RLAnything
//! (arXiv 2602.02488, "Forge Environment, Policy, and Reward Model in Completely Dynamic RL
//! System"). This crate never names a concrete model, environment or proposer: those are
//! plugins (see [`plugin`]) that the composition root pairs in an experiment file.

pub mod advantage;
// The environment and proposer contract lives in `rlany-contract` (no Burn); its modules are
// re-exported here under the same paths.
pub use rlany_contract::{adapt, check, env, plugin, rng};
pub mod batch;
pub mod checkpoint;
mod compose;
pub mod digest;
pub mod eval;
pub mod experiment;
pub mod host_group;
pub mod judge;
pub mod judge_fit;
pub mod lm;
pub mod optimise;
pub mod placement;
pub mod ppo;
pub mod progress;
pub mod reward;
pub mod rollout;
pub mod rundir;
pub mod sampling;
pub mod shard;
pub mod step;
pub mod synthetic_judge;
pub mod tensorboard;
#[cfg(test)]
pub(crate) mod testing;
pub mod trainer;
pub mod warmcache;
pub mod warmstart;

pub use env::{Difficulty, Dim, EnvHealth, Environment, Episode, Split, StepResult};
pub use experiment::{BackendKind, Experiment, ExperimentError};
pub use host_group::{HostGroup, HostPeer};
pub use lm::{
    CausalLm, ChatMarkup, Generation, PromptFormat, SampleParams, Tokenizer, last_token_positions,
    select_positions,
};
pub use placement::{Collective, Placement, PlacementError};
pub use rng::Rng;
pub use rollout::{StepSpan, Trajectory, rollout};
pub use trainer::{Components, RunSummary, StepObserver, TrainError, TrainOptions, train};
