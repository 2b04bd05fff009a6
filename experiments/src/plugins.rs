//! The one list of available plugins. Adding an environment or a proposer is one line here
//! (plus its module): the macro turns the list into the enums an experiment file names
//! (`environment: Arith(...)`, `adaptation: Gp(...)`) and into the dispatch the framework
//! calls through [`EnvironmentChoice`] and [`AdaptationChoice`].

use rlany_framework::plugin::{
    AdaptationChoice, EnvironmentChoice, EnvironmentPlugin, ProposerPlugin, ThresholdSpec,
};
use serde::{Deserialize, Serialize};

macro_rules! plugins {
    (
        environments { $( $(#[$em:meta])* $env:ident($env_ty:ty), )+ }
        proposers { $( $(#[$pm:meta])* $prop:ident($prop_ty:ty), )* }
    ) => {
        /// The environment plugins an experiment file can name.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub enum EnvironmentSpec {
            $( $(#[$em])* $env($env_ty), )+
        }

        /// The names of the environment plugins, as experiment files spell them.
        pub const ENVIRONMENTS: &[&str] = &[ $( stringify!($env), )+ ];

        impl EnvironmentChoice for EnvironmentSpec {
            fn plugin(&self) -> &dyn EnvironmentPlugin {
                match self {
                    $( Self::$env(s) => s, )+
                }
            }
        }

        /// How task difficulty adapts: the method's own rules and the proposer plugins.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
        pub enum AdaptationSpec {
            /// Difficulty never changes.
            #[default]
            Static,
            /// The paper's rule: move the difficulty by a fixed step along the flagged
            /// dimensions.
            Threshold(ThresholdSpec),
            $( $(#[$pm])* $prop($prop_ty), )*
        }

        impl AdaptationChoice for AdaptationSpec {
            fn plugin(&self) -> Option<&dyn ProposerPlugin> {
                match self {
                    Self::Static => None,
                    Self::Threshold(s) => Some(s),
                    $( Self::$prop(s) => Some(s), )*
                }
            }
        }
    };
}

plugins! {
    environments {
        /// Multi-step arithmetic chains (`rlany_envs::arith`).
        Arith(rlany_envs::ArithSpec),
        /// Programs in a tiny list language judged by hidden tests (`rlany_envs::codegen`).
        Codegen(rlany_envs::CodegenSpec),
        /// Doors answered `L` or `R` by a digit sign, the positive control for step credit
        /// (`rlany_envs::corridor`).
        Corridor(rlany_envs::CorridorSpec),
        /// A text household game like AlfWorld (`rlany_envs::household`).
        Household(rlany_envs::HouseholdSpec),
        /// Computer control on a simulated editor, like OSWorld (`rlany_envs::desktop`).
        Desktop(rlany_envs::DesktopSpec),
        /// An environment in another process, spoken to in JSON lines (`rlany_envs::process`).
        Process(rlany_envs::ProcessSpec),
    }
    proposers {
        /// Our Gaussian-process proposer (`rlany_envs::proposers::gp`).
        Gp(rlany_envs::proposers::GpSpec),
    }
}

/// An experiment file of this build: the framework's schema over this list of plugins.
pub type Experiment = rlany_framework::Experiment<EnvironmentSpec, AdaptationSpec>;
