//! The environment plugin interface. Environments are text in, text out: they never touch
//! tensors. The loop sees only these traits; concrete environments live in `rlany-envs`.

use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// Which distribution a task is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Split {
    /// The training distribution.
    Train,
    /// Held-out tasks of the training distribution (a disjoint seed space).
    Eval,
    /// A distribution the policy never trains on.
    Ood,
}

/// One named dimension of an environment's difficulty vector. Difficulties are always
/// normalised to `[0, 1]`; `lo`/`hi` say what 0 and 1 mean in the environment's own units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dim {
    /// Name used in metrics (`env/difficulty/<name>`) and reports.
    pub name: String,
    /// The environment's own value at difficulty 0.
    pub lo: f64,
    /// The environment's own value at difficulty 1.
    pub hi: f64,
}

/// A point of the difficulty space, each coordinate in `[0, 1]`.
pub type Difficulty = Vec<f64>;

/// What the environment answers to one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepResult {
    /// Text appended to the context after the action (may be empty).
    pub observation: String,
    /// The episode is over (answer given, goal reached, or step budget exhausted).
    pub done: bool,
}

/// One task instance, played out one step (one line of text) at a time.
///
/// Implementations must accept any action text (garbage included) without panicking:
/// a malformed action is a wasted step.
pub trait Episode: Send {
    /// The task text shown to the policy before its first step. Ends with the step delimiter.
    fn prompt(&self) -> String;
    /// Apply one action (one step of generated text, without the delimiter).
    fn step(&mut self, action: &str) -> StepResult;
    /// Whether the episode has ended.
    fn done(&self) -> bool;
    /// The verifier: did the trajectory so far solve the task?
    fn outcome(&self) -> bool;
    /// Oracle label of step `i` (0-based): was that step correct / progressing?
    /// `false` for an index that was never taken.
    fn oracle_label(&self, i: usize) -> bool;
    /// Which difficulty dimensions a failure at step `i` can be attributed to
    /// (indices into the difficulty space); used as critic feedback.
    fn attribute_failure(&self, _i: usize) -> Vec<usize> {
        Vec::new()
    }
}

/// A family of procedurally generated tasks with a difficulty vector.
pub trait Environment: Send + Sync {
    /// The named dimensions of the difficulty vector.
    fn difficulty_space(&self) -> Vec<Dim>;
    /// Draw one task of difficulty `d` from `split`. `d` is clamped to `[0, 1]` per dimension.
    fn sample(&self, d: &[f64], split: Split, rng: &mut Rng) -> Box<dyn Episode>;
    /// Expert demonstrations for the supervised warm start: `(prompt, steps)` where each
    /// step is one action line. `noise` is the environment's own notion of a flawed expert
    /// (documented by each environment) so that the warm-started policy is mid-range.
    fn demonstration(&self, d: &[f64], noise: f64, rng: &mut Rng) -> (String, Vec<String>);
}
