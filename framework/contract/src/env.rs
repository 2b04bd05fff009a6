//! The environment plugin interface. Environments are text in, text out: they never touch
//! tensors. The loop sees only these traits; concrete environments live in `rlany-envs`.

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

impl Dim {
    /// The dimension `name`, whose difficulty 0 means `lo` and 1 means `hi` in the
    /// environment's own units.
    pub fn new(name: &str, lo: f64, hi: f64) -> Self {
        Self {
            name: name.to_string(),
            lo,
            hi,
        }
    }
}

/// A point of the difficulty space, each coordinate in `[0, 1]`.
pub type Difficulty = Vec<f64>;

/// What the environment answers to one action: what the policy sees next, and what the
/// task's author knows about the step (its oracle label, the difficulty dimensions it
/// exercised, the blame of a wrong step). The same fields as the process protocol's `step`
/// reply, so every environment, compiled in or in another process, keeps one contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepResult {
    /// Text appended to the context after the action (may be empty).
    pub observation: String,
    /// The episode is over (answer given, goal reached, or step budget exhausted).
    pub done: bool,
    /// The oracle's label: was the step correct / progressing? Used for metrics and the
    /// judge's warm-start labels, never shown to the judge or the proposer.
    pub label: bool,
    /// Which difficulty dimensions the step *exercises*: a property of the task's structure
    /// that the environment (the task's author) knows without judging correctness, e.g. "the
    /// expected line needs a carry". With the judge's verdicts this is the oracle-free critic
    /// feedback (the judge says which steps failed, the environment what they involved).
    pub dims: Vec<usize>,
    /// The oracle's attribution of a wrong step to difficulty dimensions (ignored on a right
    /// step); only the explicitly named upper-bound critic (`critic: Oracle`) uses it.
    pub blame: Vec<usize>,
    /// What kind of step this was, in the task author's words (empty: not classified), e.g.
    /// household's `progress`, `regained`, `invalid`, `repeated`, `search`, `off_plan`, the corridor's
    /// `borderline` and `clear` doors. Metrics split by it (`env/wrong/<kind>`,
    /// `env/step_acc/<kind>`, the judge's accuracy by kind); never shown to the policy, the
    /// judge or the proposer. A [`valid_kind`]: it names metrics.
    pub kind: String,
}

/// The longest step kind ([`StepResult::kind`]).
pub const MAX_KIND_LEN: usize = 24;

/// Whether `kind` may name a step kind: empty, or 1 to [`MAX_KIND_LEN`] characters of `a-z`,
/// `0-9` and `_` (it becomes part of metric names).
pub fn valid_kind(kind: &str) -> bool {
    kind.len() <= MAX_KIND_LEN
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl StepResult {
    /// The answer to an action taken after the episode ended: nothing happened (no
    /// observation, no label, no dimensions).
    pub fn ended() -> Self {
        Self {
            observation: String::new(),
            done: true,
            label: false,
            dims: Vec::new(),
            blame: Vec::new(),
            kind: String::new(),
        }
    }

    /// The answer to a step taken: `observation` is shown only while the episode goes on
    /// (a step that ends it shows nothing more), `blame` kept only on a wrong step.
    pub fn taken(
        observation: String,
        done: bool,
        label: bool,
        dims: Vec<usize>,
        blame: Vec<usize>,
    ) -> Self {
        Self {
            observation: if done { String::new() } else { observation },
            done,
            label,
            dims,
            blame: if label { Vec::new() } else { blame },
            kind: String::new(),
        }
    }

    /// The same answer with its step classified as `kind` (see [`StepResult::kind`]).
    pub fn with_kind(mut self, kind: &str) -> Self {
        debug_assert!(valid_kind(kind), "step kind {kind:?}");
        self.kind = kind.to_string();
        self
    }
}

/// One task instance, played out one step (one line of text) at a time.
///
/// Implementations must accept any action text (garbage included) without panicking:
/// a malformed action is a wasted step.
pub trait Episode: Send {
    /// The task text shown to the policy before its first step. Ends with the step delimiter.
    fn prompt(&self) -> String;
    /// What a model that has never seen this environment must be told: the action format
    /// and what the observations mean, in plain words. Shown before the task by a chat
    /// prompt format (pretrained models); models trained from scratch learn the format from
    /// the warm start instead and never see it.
    fn instructions(&self) -> Option<String> {
        None
    }
    /// Apply one action (one step of generated text, without the delimiter). After the
    /// episode ended the answer is [`StepResult::ended`].
    fn step(&mut self, action: &str) -> StepResult;
    /// Starts [`Self::step`] with `action` where the work happens elsewhere (another
    /// process): a rollout calls it for every active episode of a turn before it calls
    /// their `step`s with the same actions, so that episodes living in different processes
    /// advance in parallel. The default does nothing.
    fn submit(&mut self, _action: &str) {}
    /// Whether the episode has ended.
    fn done(&self) -> bool;
    /// The verifier: did the trajectory so far solve the task?
    fn outcome(&self) -> bool;
    /// Identifies the task: two episodes with equal keys are the same task (a rewrite that
    /// leaves the key unchanged changed nothing). Defaults to the prompt; an environment
    /// with hidden state must include it.
    fn task_key(&self) -> String {
        self.prompt()
    }
}

/// A boxed episode is an episode (what generic code over episodes, such as the conformance
/// checks, plays).
impl<E: Episode + ?Sized> Episode for Box<E> {
    fn prompt(&self) -> String {
        (**self).prompt()
    }
    fn instructions(&self) -> Option<String> {
        (**self).instructions()
    }
    fn step(&mut self, action: &str) -> StepResult {
        (**self).step(action)
    }
    fn submit(&mut self, action: &str) {
        (**self).submit(action)
    }
    fn done(&self) -> bool {
        (**self).done()
    }
    fn outcome(&self) -> bool {
        (**self).outcome()
    }
    fn task_key(&self) -> String {
        (**self).task_key()
    }
}

/// A family of procedurally generated tasks with a difficulty vector.
pub trait Environment: Send + Sync {
    /// The named dimensions of the difficulty vector.
    fn difficulty_space(&self) -> Vec<Dim>;
    /// The task of difficulty `d` from `split` with seed `seed`: a pure function of its
    /// arguments. Each part of a task is drawn from its own stream derived from `seed`, so a
    /// *rewrite* (same seed, another difficulty) keeps everything the changed dimensions do
    /// not control. `d` is clamped to `[0, 1]` per dimension.
    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode>;
    /// [`Self::sample`] of each `(difficulty, split, seed)`, in order; an environment in
    /// other processes starts them in parallel. The loop draws a step's and an evaluation's
    /// tasks through it.
    fn sample_many(&self, tasks: &[(Difficulty, Split, u64)]) -> Vec<Box<dyn Episode>> {
        tasks
            .iter()
            .map(|(d, split, seed)| self.sample(d, *split, *seed))
            .collect()
    }
    /// The expert's solution of the task `sample(d, Split::Train, seed)` for the supervised
    /// warm start: `(prompt, steps)` where each step is one action line. `noise` is the
    /// environment's own notion of a flawed expert (documented by each environment) so that
    /// the warm-started policy is mid-range; its draws also derive from `seed`.
    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>);
    /// The in-domain evaluation grid: the difficulty levels (one value used on every
    /// dimension) the in-domain eval spreads its tasks over, covering the training range.
    fn eval_levels(&self) -> Vec<f64> {
        vec![0.0, 0.25, 0.5, 0.75, 1.0]
    }
    /// Why the environment can no longer hand out tasks, if it cannot. The trait's calls
    /// are infallible (an in-process environment cannot fail); one that lives elsewhere (a
    /// child process) fails an episode on a lost call and reports here when it gives up.
    /// The loop checks it after the warm starts, each rollout and each evaluation, and stops
    /// the run with this message before the next checkpoint.
    fn fault(&self) -> Option<String> {
        None
    }
    /// Counts of the environment's own failures so far (an environment in another process:
    /// failed calls, timed-out replies, restarted children, episodes it ended), or `None`
    /// for one that cannot fail. The loop writes their per-step increase as `env/*` metrics
    /// and warns when they are not zero.
    fn health(&self) -> Option<EnvHealth> {
        None
    }
    /// What identifies the environment's code when the experiment file does not (an
    /// environment in another process: its name and version); part of the warm-start
    /// cache's key when given; otherwise the key holds the behaviour's [`fingerprint`]
    /// (which plays a few demonstrations: an environment whose tasks are costly to start,
    /// or whose behaviour the fingerprint cannot see, names its code here).
    fn identity(&self) -> Option<String> {
        None
    }
}

/// How many demonstrations [`fingerprint`] plays.
pub const FINGERPRINT_EPISODES: u64 = 8;

/// What an environment's code does, as 16 hex digits: the hash of [`FINGERPRINT_EPISODES`]
/// flawed-expert demonstrations at `d` (noise 0.5, seeds 0, 1, …) played through the tasks
/// they solve — each prompt, action and what the step answered (observation, `done`, the
/// oracle's label, `dims`, `blame`, `kind`) and the outcome. The warm-start cache keys on it
/// where the environment gives no [`Environment::identity`], so a warm start made by other
/// environment code is not reused: a change of the tasks, the expert or the oracle that
/// shows in these episodes changes it. A change that shows in none of them (a rare task,
/// another difficulty) does not; an environment can then say so through
/// [`Environment::identity`].
pub fn fingerprint(env: &dyn Environment, d: &[f64]) -> String {
    let mut h = crate::fnv::Fnv1a::default();
    for seed in 0..FINGERPRINT_EPISODES {
        let (prompt, actions) = env.demonstration(d, 0.5, seed);
        // The conformance checks' own replay: the prompt, key, every answer and the outcome.
        let played = crate::conformance::replay(env, d, seed, &actions);
        h.write(format!("{prompt:?}{actions:?}{played:?}").as_bytes());
    }
    format!("{:016x}", h.finish())
}

/// Cumulative counts of an environment's own failures ([`Environment::health`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnvHealth {
    /// Calls that failed (a crash, a timeout, garbage, an `error` reply, …).
    pub failed_calls: u64,
    /// Of those, replies that did not come within the time limit.
    pub timeouts: u64,
    /// Children started again after one was lost.
    pub restarts: u64,
    /// Episodes the environment ended (a failed call), scored unsolved like the policy's
    /// failures.
    pub failed_episodes: u64,
}

impl EnvHealth {
    /// The counts since `earlier` (saturating).
    pub fn since(&self, earlier: &EnvHealth) -> EnvHealth {
        EnvHealth {
            failed_calls: self.failed_calls.saturating_sub(earlier.failed_calls),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            restarts: self.restarts.saturating_sub(earlier.restarts),
            failed_episodes: self.failed_episodes.saturating_sub(earlier.failed_episodes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Doors;

    #[test]
    fn the_fingerprint_sees_an_oracle_change_and_nothing_else() {
        let a = fingerprint(&Doors { wrong_r: false }, &[0.5]);
        assert_eq!(a.len(), 16);
        assert_eq!(
            a,
            fingerprint(&Doors { wrong_r: false }, &[0.5]),
            "deterministic"
        );
        // Every `R` labelled wrong: the oracle's code changed.
        assert_ne!(
            a,
            fingerprint(&Doors { wrong_r: true }, &[0.5]),
            "the labels changed"
        );
    }
}
