//! # rlany-envs
//!
//! The plugins of RLAnything: procedural text environments and difficulty proposers. Each
//! plugin brings its own typed settings struct (what its section of an experiment file
//! holds), which validates itself and builds the component; the composition root (`rlany`)
//! lists the plugins.
//!
//! Environments implement [`rlany_contract::Environment`] (a task family with a difficulty
//! vector in `[0, 1]^k`) and hand out [`rlany_contract::Episode`]s (text in, text out, one
//! line per step) with a verifier, oracle step labels, an expert and an out-of-distribution
//! split. They never touch tensors and have no Burn dependency. Any action text, garbage
//! included, is accepted without panicking: a malformed action is a wasted step.
//!
//! - [`arith`]: multi-step arithmetic chains (`7+5=12`, `12-3=9`, `A:9`).
//! - [`corridor`]: a corridor of doors, each with a digit sign, answered `L` (below 5) or `R`
//!   one door per step; solved with at most `slack` wrong steps (the positive control for
//!   step credit).
//! - [`codegen`]: programs in a tiny list language, one line per step, judged by hidden
//!   tests (`keep x>3`, `map x*2+1`, `fold +`, `ret`).
//! - [`household`]: a text household game like AlfWorld: rooms, cupboards, devices, goals
//!   such as `put hot egg in fridge` (`go bath`, `open cabinet`, `take egg`, `heat`, `put fridge`).
//! - [`desktop`]: computer control on a simulated document editor (menus, dialogs, tabs,
//!   check boxes, drop-downs, fields) seen as an accessibility text with element ids
//!   (`click(4)`, `type(9, "Budget")`, `key(ctrl+s)`, `scroll(17, 3)`).
//! - [`process`]: an environment in another process (Python, say), spoken to in JSON lines
//!   (`environments/process/PROTOCOL.md`); the reference environment and the TextWorld
//!   adapter live in `environments/process/`.
//!
//! Proposers implement [`rlany_contract::adapt::Proposer`]:
//!
//! - [`proposers::gp`]: a Gaussian-process model of the policy's accuracy over difficulty and
//!   time (egobox-gp).

pub mod arith;
pub mod codegen;
pub mod corridor;
pub mod desktop;
mod draw;
pub mod household;
mod planner;
pub mod process;
pub mod proposers;

pub use arith::{Arith, ArithConfig, ArithEpisode, ArithSpec};
pub use codegen::{Codegen, CodegenEpisode, CodegenSpec};
pub use corridor::{Corridor, CorridorEpisode, CorridorSpec};
pub use desktop::{Desktop, DesktopSpec};
pub use household::{Household, HouseholdSpec};
pub use process::{ProcessEnv, ProcessEpisode, ProcessSpec};
/// The environment contract's conformance checks (they live with the contract, so a plugin
/// crate's own tests call them: `rlany_contract::conformance`).
pub use rlany_contract::conformance;

/// Every compiled-in environment, at its default settings and at the settings that change
/// its oracle, named for test messages.
#[cfg(test)]
pub(crate) fn plugins_for_tests() -> Vec<(&'static str, Box<dyn rlany_contract::Environment>)> {
    use rlany_contract::plugin::EnvironmentPlugin;
    vec![
        ("arith", ArithSpec::default().build()),
        (
            "arith, local oracle",
            ArithSpec {
                oracle: arith::OracleMode::Local,
                ..ArithSpec::default()
            }
            .build(),
        ),
        ("codegen", CodegenSpec::default().build()),
        ("corridor", CorridorSpec::default().build()),
        ("household", HouseholdSpec::default().build()),
        (
            "household, belief labels, actions listed",
            HouseholdSpec {
                label: household::Label::Belief,
                list_actions: true,
                ..HouseholdSpec::default()
            }
            .build(),
        ),
        ("desktop", DesktopSpec::default().build()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlany_contract::Split;
    use rlany_contract::plugin::EnvironmentPlugin;

    /// Every compiled-in environment keeps the contract, at its default settings and at the
    /// settings that change its oracle.
    #[test]
    fn every_compiled_in_environment_passes_the_checks() {
        for (name, env) in plugins_for_tests() {
            let checks = conformance::run(&conformance::Compiled(env.as_ref()));
            assert_eq!(checks.len(), 7, "{name}");
            for c in &checks {
                assert!(c.ok, "{name}: {} failed: {}", c.name, c.detail);
            }
        }
    }

    /// A pretrained chat model, which has never seen these environments, is told each one's
    /// action format (a from-scratch model learns it from the warm start instead).
    #[test]
    fn every_environment_tells_a_chat_model_its_action_format() {
        let envs: [(Box<dyn rlany_contract::Environment>, &str); 5] = [
            (ArithSpec::default().build(), "A: <value>"),
            (CodegenSpec::default().build(), "ret"),
            (CorridorSpec::default().build(), "answer L or R"),
            (HouseholdSpec::default().build(), "take OBJECT"),
            (DesktopSpec::default().build(), "click(ID)"),
        ];
        for (env, action) in envs {
            let d = vec![0.5; env.difficulty_space().len()];
            let text = env
                .sample(&d, Split::Train, 1)
                .instructions()
                .expect("instructions");
            assert!(text.contains(action), "{text}");
            assert!(text.len() < 800 && !text.contains('\n'), "{text}");
        }
    }
}
