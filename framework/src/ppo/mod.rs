//! PPO (the method, step 6), in one place: the clipped objective with its KL penalty
//! ([`loss`]), the update phase that shuffles samples into minibatches and takes one AdamW
//! step per minibatch ([`update`], each step a [`crate::optimise::step`]), and the global-norm
//! gradient clipping every optimiser step goes through ([`clip`]).

pub mod clip;
pub mod loss;
pub mod update;

pub use clip::{clip_global_norm, step};
pub use loss::{KlTerm, PpoLoss, SampledKl, in_f32, kl_estimate, ppo_loss};
pub use update::{Sample, Unit, UpdateParams, UpdateStats, ppo_update};
