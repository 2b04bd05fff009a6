//! How plugins enter an experiment file.
//!
//! Every environment and every difficulty proposer other than the method's own rules
//! (`Static`, `Threshold`) is a *plugin*: a typed, serde-deserialised settings struct that
//! lives with the plugin, validates itself and builds the component. The composition root
//! (the `rlany` crate) owns the one list of available plugins as two enums — one variant per
//! plugin — and implements [`EnvironmentChoice`] and [`AdaptationChoice`] for them; the
//! framework's `Experiment` is generic over those two enums, so a whole experiment
//! file is parsed in one typed pass (errors keep their file:line:column) and the framework
//! never names a concrete component.

use crate::adapt::{Proposer, Threshold};
use crate::check::{self, Checked};
use crate::env::{Difficulty, Environment};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// An environment plugin's settings (the body of `environment: Name(...)`).
pub trait EnvironmentPlugin {
    /// Range checks; field paths relative to the settings struct.
    fn validate(&self) -> Checked;
    /// The difficulty every task slot starts at (one value in `[0, 1]` per dimension of the
    /// environment's difficulty space); the in-domain evaluation uses it too.
    fn start_difficulty(&self) -> Difficulty;
    /// The environment these settings describe (called after [`Self::validate`] passed).
    fn build(&self) -> Box<dyn Environment>;
    /// Settings (field names) that change neither the tasks nor the expert's demonstrations —
    /// only what the oracle labels right, say. The policy's warm-start cache key leaves them
    /// out, so runs that differ in them share one warm start (a learned judge's key keeps
    /// them: its warm start reads the labels).
    fn label_only_fields(&self) -> &'static [&'static str] {
        &[]
    }
}

/// What a proposer may need besides its own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposerContext {
    /// Training steps of the run.
    pub total_steps: usize,
    /// Dimensions of the environment's difficulty space.
    pub dims: usize,
}

/// A difficulty proposer's settings (the body of `adaptation: Name(...)`).
pub trait ProposerPlugin {
    /// Range checks; field paths relative to the settings struct.
    fn validate(&self) -> Checked;
    /// `(α_low, α_high)`: below, the slot proposes easier tasks; above, harder (method's gate).
    fn band(&self) -> (f64, f64);
    /// The proposer these settings describe (called after [`Self::validate`] passed).
    fn build(&self, ctx: &ProposerContext) -> Box<dyn Proposer>;
}

/// The composition root's enum of environment plugins.
pub trait EnvironmentChoice:
    Debug + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync
{
    /// The chosen plugin's settings.
    fn plugin(&self) -> &dyn EnvironmentPlugin;
}

/// The composition root's enum of adaptation rules: `Static`, `Threshold` and the proposer
/// plugins.
pub trait AdaptationChoice:
    Debug + Clone + PartialEq + Serialize + DeserializeOwned + Default + Send + Sync
{
    /// The chosen proposer's settings; `None` for `Static` (the difficulty never changes).
    fn plugin(&self) -> Option<&dyn ProposerPlugin>;
}

/// `Threshold` settings: the paper's rule (method: move `±step` along the flagged dimensions).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThresholdSpec {
    /// δ: how far one proposal moves each flagged dimension.
    pub step: f64,
    /// `(α_low, α_high)`.
    pub band: (f64, f64),
}

impl Default for ThresholdSpec {
    fn default() -> Self {
        Self {
            step: 0.1,
            band: (0.2, 0.8),
        }
    }
}

impl ProposerPlugin for ThresholdSpec {
    fn validate(&self) -> Checked {
        check::positive("step", self.step, 1.0)?;
        check::band("band", self.band)
    }

    fn band(&self) -> (f64, f64) {
        self.band
    }

    fn build(&self, _ctx: &ProposerContext) -> Box<dyn Proposer> {
        Box::new(Threshold { step: self.step })
    }
}
