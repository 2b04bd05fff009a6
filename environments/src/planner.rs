//! The episode the two planner environments play (household's house, desktop's editor): a
//! world, a task whose expert planner measures the remaining plan, and steps labelled by
//! that plan. Each environment wraps it with what is its own (the observation's extras, the
//! dimensions a step exercises, household's belief label).
//!
//! - The step budget is the expert's plan length at the start plus the environment's slack.
//! - A step is right when it was valid and the expert's remaining plan shrank, or when the
//!   environment says it is right anyway (household's `Label::Belief`: one of the expert's
//!   equally good search choices); `blame` is the step's dimensions on a valid step that was
//!   not right, nothing on an invalid one.
//! - The episode ends when the goal holds or the budget is spent.

use rlany_framework::StepResult;

/// A task whose expert planner measures how far a world is from its goal.
pub(crate) trait Plan {
    /// The state the actions change.
    type World: Clone + std::fmt::Debug;
    /// The expert's remaining number of actions from `world`.
    fn distance(&self, world: &Self::World) -> usize;
    /// Whether `world` satisfies the goal.
    fn satisfied(&self, world: &Self::World) -> bool;
    /// Applies `action` to `world`: the text shown to the agent and whether the action was
    /// understood and possible.
    fn act(&self, world: &mut Self::World, action: &str) -> (String, bool);
}

/// One step taken: the oracle's label, whether the action was valid, the dimensions it
/// exercised.
#[derive(Debug, Clone, PartialEq)]
struct Taken {
    label: bool,
    valid: bool,
    dims: Vec<usize>,
}

/// One task being played (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct PlanEpisode<P: Plan> {
    /// The task: its goal, hints and prompt.
    pub(crate) task: P,
    /// The world as the agent's actions left it.
    pub(crate) world: P::World,
    /// The expert's distance from the current state.
    distance: usize,
    max_steps: usize,
    steps: Vec<Taken>,
    done: bool,
}

impl<P: Plan> PlanEpisode<P> {
    /// `task` played from `world`, with `slack` steps beyond the expert's plan.
    pub(crate) fn new(task: P, world: P::World, slack: usize) -> Self {
        let distance = task.distance(&world);
        Self {
            task,
            world,
            distance,
            max_steps: distance + slack,
            steps: Vec::new(),
            done: false,
        }
    }

    /// The step budget: the expert's plan length + the environment's slack.
    pub(crate) fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// Number of steps taken so far.
    pub(crate) fn steps_taken(&self) -> usize {
        self.steps.len()
    }

    /// The expert's remaining number of actions from the current state.
    pub(crate) fn distance(&self) -> usize {
        self.distance
    }

    /// Whether the episode has ended.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Whether the world satisfies the goal (the verifier).
    pub(crate) fn solved(&self) -> bool {
        self.task.satisfied(&self.world)
    }

    /// Plays `action`, which exercises `dims`; `also_right` makes a valid step right even
    /// when the plan did not shrink. Returns the world's text; [`PlanEpisode::answer`] then
    /// makes the step's answer.
    pub(crate) fn play(&mut self, action: &str, dims: Vec<usize>, also_right: bool) -> String {
        let before = self.distance;
        let (text, valid) = self.task.act(&mut self.world, action);
        let label = valid && {
            self.distance = self.task.distance(&self.world);
            self.distance < before || also_right
        };
        self.steps.push(Taken { label, valid, dims });
        self.done = self.solved() || self.steps.len() >= self.max_steps;
        text
    }

    /// The answer to the step just played, with `observation` shown while the episode goes
    /// on.
    pub(crate) fn answer(&self, observation: String) -> StepResult {
        let Some(s) = self.steps.last() else {
            return StepResult::ended();
        };
        let blame = if s.valid { s.dims.clone() } else { Vec::new() };
        StepResult::taken(observation, self.done, s.label, s.dims.clone(), blame)
    }

    /// The oracle's label of step `i` (`false` for a step not taken).
    #[cfg(test)]
    pub(crate) fn label_of(&self, i: usize) -> bool {
        self.steps.get(i).is_some_and(|s| s.label)
    }

    /// The dimensions step `i` exercised (none for a step not taken).
    #[cfg(test)]
    pub(crate) fn dims_of(&self, i: usize) -> Vec<usize> {
        self.steps
            .get(i)
            .map(|s| s.dims.clone())
            .unwrap_or_default()
    }

    /// The oracle's blame of step `i`: its dimensions when it was valid and wrong.
    #[cfg(test)]
    pub(crate) fn blame_of(&self, i: usize) -> Vec<usize> {
        match self.steps.get(i) {
            Some(s) if s.valid && !s.label => s.dims.clone(),
            _ => Vec::new(),
        }
    }
}

/// Property shared by the planner environments' task draws (a test helper): raising one of the
/// four difficulty coordinates by 0.1 never lowers its structural count and leaves the
/// other three counts alone, and it moves its own count often enough (1500 draws).
#[cfg(test)]
pub(crate) fn assert_structurally_monotone<T>(
    draw: impl Fn(&[f64], u64) -> T,
    counts: impl Fn(&T) -> [usize; 4],
) {
    let mut rng = rlany_framework::Rng::new(11);
    let mut moved = [0usize; 4];
    for seed in 0..1500 {
        let base: Vec<f64> = (0..4).map(|_| rng.uniform() * 0.9).collect();
        let k = seed as usize % 4;
        let mut up = base.clone();
        up[k] += 0.1;
        let (a, b) = (counts(&draw(&base, seed)), counts(&draw(&up, seed)));
        assert!(b[k] >= a[k], "dim {k}, seed {seed}: {a:?} -> {b:?}");
        for j in (0..4).filter(|&j| j != k) {
            assert_eq!(a[j], b[j], "dim {k} moved dim {j}");
        }
        moved[k] += usize::from(b[k] > a[k]);
    }
    // A 0.1 move changes the count in expectation (0.1·range per task of 375 per dim).
    assert!(moved.iter().all(|&m| m >= 15), "{moved:?}");
}
