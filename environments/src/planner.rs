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
//! - Every step has a kind ([`StepResult::kind`]), the first that fits: `progress` (the plan
//!   shrank), `invalid` (not understood or not possible), `search` (one of the expert's
//!   equally good choices given what the agent has seen, that did not shrink the true plan),
//!   `repeated` (the previous step's action again), `off_plan` (anything else valid).
//! - The episode ends when the goal holds or the budget is spent.

use rlany_framework::{Episode, StepResult};

/// A task whose expert planner measures how far a world is from its goal: what an
/// environment writes to be played by [`PlanEpisode`].
pub(crate) trait Plan: Send {
    /// The state the actions change.
    type World: Clone + std::fmt::Debug + Send;
    /// What a pretrained chat model is told before the task ([`Episode::instructions`]).
    const INSTRUCTIONS: &'static str;
    /// The task text shown before the first step.
    fn prompt(&self) -> &str;
    /// Identifies the task ([`Episode::task_key`]).
    fn task_key(&self) -> String;
    /// The expert's remaining number of actions from `world`.
    fn distance(&self, world: &Self::World) -> usize;
    /// Whether `world` satisfies the goal.
    fn satisfied(&self, world: &Self::World) -> bool;
    /// Applies `action` to `world`: the text shown to the agent and whether the action was
    /// understood and possible.
    fn act(&self, world: &mut Self::World, action: &str) -> (String, bool);
    /// The expert's next action from `world` (`None` once the goal holds).
    fn expert(&self, world: &Self::World) -> Option<String>;
    /// The difficulty dimensions a step from `world` exercises.
    fn step_dims(&self, world: &Self::World) -> Vec<usize>;
    /// Whether `action` is one of the expert's equally good search choices from `world`,
    /// given what the agent has seen (a `search` step); none by default.
    fn search_choice(&self, _world: &Self::World, _action: &str) -> bool {
        false
    }
    /// The observation shown after a step, from the world's text (that text by default).
    fn observe(&self, _world: &Self::World, text: String) -> String {
        text
    }
}

/// One step taken: the oracle's label, whether the action was valid, the dimensions it
/// exercised, its kind and the action (words joined by one space).
#[derive(Debug, Clone, PartialEq)]
struct Taken {
    label: bool,
    valid: bool,
    dims: Vec<usize>,
    kind: &'static str,
    action: String,
}

/// One task being played (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct PlanEpisode<P: Plan> {
    /// The task: its goal, hints and prompt.
    pub(crate) task: P,
    /// The world as the agent's actions left it.
    pub(crate) world: P::World,
    /// Whether a `search` step is right (household's label without foresight).
    pub(crate) search_right: bool,
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
            search_right: false,
            distance,
            max_steps: distance + slack,
            steps: Vec::new(),
            done: false,
        }
    }

    /// The expert's next action from the current state (`None` once the goal holds).
    #[cfg(test)]
    pub(crate) fn expert_action(&self) -> Option<String> {
        self.task.expert(&self.world)
    }

    /// The step budget: the expert's plan length + the environment's slack.
    #[cfg(test)]
    pub(crate) fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// Number of steps taken so far.
    #[cfg(test)]
    pub(crate) fn steps_taken(&self) -> usize {
        self.steps.len()
    }

    /// The expert's remaining number of actions from the current state.
    #[cfg(test)]
    pub(crate) fn distance(&self) -> usize {
        self.distance
    }

    /// Whether the world satisfies the goal (the verifier).
    pub(crate) fn solved(&self) -> bool {
        self.task.satisfied(&self.world)
    }

    /// Plays `action`, which exercises `dims`. `search` says the action is one of the
    /// expert's equally good search choices given what the agent has seen (computed before
    /// the action; `false` where the environment has no such notion); with `search_right`
    /// such a step is right even when the true plan did not shrink. Returns the world's
    /// text; [`PlanEpisode::answer`] then makes the step's answer.
    fn play(&mut self, action: &str, dims: Vec<usize>, search: bool) -> String {
        let before = self.distance;
        let (text, valid) = self.task.act(&mut self.world, action);
        let shrank = valid && {
            self.distance = self.task.distance(&self.world);
            self.distance < before
        };
        let action = action.split_whitespace().collect::<Vec<_>>().join(" ");
        let kind = if shrank {
            "progress"
        } else if !valid {
            "invalid"
        } else if search {
            "search"
        } else if self.steps.last().is_some_and(|s| s.action == action) {
            "repeated"
        } else {
            "off_plan"
        };
        let label = shrank || (valid && search && self.search_right);
        self.steps.push(Taken {
            label,
            valid,
            dims,
            kind,
            action,
        });
        self.done = self.solved() || self.steps.len() >= self.max_steps;
        text
    }

    /// The answer to the step just played, with `observation` shown while the episode goes
    /// on.
    fn answer(&self, observation: String) -> StepResult {
        let Some(s) = self.steps.last() else {
            return StepResult::ended();
        };
        let blame = if s.valid { s.dims.clone() } else { Vec::new() };
        StepResult::taken(observation, self.done, s.label, s.dims.clone(), blame).with_kind(s.kind)
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

impl<P: Plan> Episode for PlanEpisode<P> {
    fn prompt(&self) -> String {
        self.task.prompt().to_string()
    }

    fn instructions(&self) -> Option<String> {
        Some(P::INSTRUCTIONS.to_string())
    }

    fn step(&mut self, action: &str) -> StepResult {
        if self.done {
            return StepResult::ended();
        }
        let dims = self.task.step_dims(&self.world);
        let search = self.task.search_choice(&self.world, action);
        let text = self.play(action, dims, search);
        let observation = self.task.observe(&self.world, text);
        self.answer(observation)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn outcome(&self) -> bool {
        self.solved()
    }

    fn task_key(&self) -> String {
        self.task.task_key()
    }
}

/// A walk to position 3 on a line (`+`, `-`, `wait`; anything else invalid): the planner
/// core's unit-test task.
#[cfg(test)]
struct Walk;

#[cfg(test)]
impl Plan for Walk {
    type World = i32;
    const INSTRUCTIONS: &'static str = "Walk to 3.";
    fn prompt(&self) -> &str {
        "walk to 3\n"
    }
    fn task_key(&self) -> String {
        "walk".into()
    }
    fn expert(&self, w: &i32) -> Option<String> {
        (*w != 3).then(|| if *w < 3 { "+" } else { "-" }.to_string())
    }
    fn step_dims(&self, _w: &i32) -> Vec<usize> {
        vec![0]
    }
    fn distance(&self, w: &i32) -> usize {
        (3 - w).unsigned_abs() as usize
    }
    fn satisfied(&self, w: &i32) -> bool {
        *w == 3
    }
    fn act(&self, w: &mut i32, action: &str) -> (String, bool) {
        match action.trim() {
            "+" => *w += 1,
            "-" => *w -= 1,
            "wait" => {}
            _ => return ("error".into(), false),
        }
        (format!("at {w}"), true)
    }
}

#[cfg(test)]
#[test]
fn kinds_labels_budget_and_blame() {
    // Plan 3, slack 4: a budget of 7 steps.
    let mut ep = PlanEpisode::new(Walk, 0, 4);
    assert_eq!(ep.max_steps(), 7);
    let mut answers = Vec::new();
    // (action, a search choice?, search right?)
    for (a, search, search_right) in [
        ("+", false, false),     // progress
        ("jump", false, false),  // invalid
        ("wait", false, false),  // off plan
        ("wait ", false, false), // the same action again (whitespace aside)
        ("-", true, false),      // valid, no progress, a search choice: wrong (foresight)
        ("-", true, true),       // the same, right by the environment's rule (belief)
        ("+", false, false),     // progress; the budget is spent
    ] {
        ep.search_right = search_right;
        let text = ep.play(a, vec![0], search);
        answers.push(ep.answer(text));
    }
    let kinds: Vec<&str> = answers.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "progress", "invalid", "off_plan", "repeated", "search", "search", "progress"
        ]
    );
    let labels: Vec<bool> = answers.iter().map(|r| r.label).collect();
    assert_eq!(labels, [true, false, false, false, false, true, true]);
    // Blame: the dimensions of a valid wrong step; none on an invalid or right one.
    let blamed: Vec<bool> = answers.iter().map(|r| !r.blame.is_empty()).collect();
    assert_eq!(blamed, [false, false, true, true, true, false, false]);
    assert!(
        answers[6].done && !ep.solved(),
        "7 steps spent, at -1 + 1 = 0"
    );
    assert_eq!(ep.answer(String::new()).observation, "");
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
