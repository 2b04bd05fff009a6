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
//!   shrank below anything the episode had reached), `regained` (it shrank back to a length
//!   the episode had already reached: progress undone and made again; right all the same),
//!   `invalid` (not understood or not possible), `search` (one of the expert's equally good
//!   choices given what the agent has seen, that did not shrink the true plan), `repeated`
//!   (the previous step's action again), `off_plan` (anything else valid).
//! - The episode ends when the goal holds or the budget is spent.

use rlany_contract::Rng;
use rlany_contract::{Episode, StepResult};

/// Steps beyond the expert's plan before an episode ends, by default (`slack`).
pub const STEP_SLACK: usize = 4;
/// The most `slack` a file may set.
const MAX_SLACK: usize = 40;

/// The checks a planner environment's settings share: `slack` in `0..=MAX_SLACK`, and one
/// starting difficulty in `[0, 1]` per dimension, named by `dims`.
pub(crate) fn check_settings(
    slack: usize,
    difficulty: &[f64],
    dims: &[&str],
) -> rlany_contract::check::Checked {
    rlany_contract::check::count("slack", slack, 0, MAX_SLACK)?;
    rlany_contract::check::difficulty("difficulty", difficulty, dims)
}

/// Whether `slack` is the default (a written file leaves it out then).
pub(crate) fn is_default_slack(slack: &usize) -> bool {
    *slack == STEP_SLACK
}

/// The flawed expert's slip stream and noise for one demonstration: `Rng::derive(seed,
/// stream)`, and `noise` with NaN read as 0 (no slips).
pub(crate) fn slips(seed: u64, stream: &str, noise: f64) -> (Rng, f64) {
    let noise = if noise.is_nan() { 0.0 } else { noise };
    (Rng::derive(seed, stream), noise)
}

/// A demonstration played from `world`: at most the expert's plan + [`STEP_SLACK`] actions,
/// each what `next` picks given the world and two fresh uniforms from `slip` (`None` ends the
/// demonstration; `(action, true)` makes it the last), until `task`'s goal holds.
pub(crate) fn demonstrate<P: Plan>(
    task: &P,
    world: &P::World,
    slip: &mut Rng,
    mut next: impl FnMut(&P::World, f64, f64) -> Option<(String, bool)>,
) -> Vec<String> {
    let limit = task.distance(world) + STEP_SLACK;
    let mut w = world.clone();
    let mut steps = Vec::new();
    while steps.len() < limit {
        let (u, v) = (slip.uniform(), slip.uniform());
        let Some((action, last)) = next(&w, u, v) else {
            break;
        };
        task.act(&mut w, &action);
        steps.push(action);
        if last || task.satisfied(&w) {
            break;
        }
    }
    steps
}

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
    /// Whether the action `said` (its words joined by one space) is one of the expert's
    /// equally good search choices from `world`, given what the agent has seen (a `search`
    /// step); none by default.
    fn search_choice(&self, _world: &Self::World, _said: &str) -> bool {
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
    /// The least distance any state of the episode so far has had.
    best: usize,
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
            best: distance,
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

    /// Plays `action`, which exercises `dims`: whether it is a search choice is asked of the
    /// task before the action changes the world; with `search_right` such a step is right
    /// even when the true plan did not shrink. Returns the world's text;
    /// [`PlanEpisode::answer`] then makes the step's answer.
    fn play(&mut self, action: &str, dims: Vec<usize>) -> String {
        let said = action.split_whitespace().collect::<Vec<_>>().join(" ");
        let search = self.task.search_choice(&self.world, &said);
        let before = self.distance;
        let (text, valid) = self.task.act(&mut self.world, action);
        let shrank = valid && {
            self.distance = self.task.distance(&self.world);
            self.distance < before
        };
        let action = said;
        let kind = if shrank && self.distance < self.best {
            "progress"
        } else if shrank {
            "regained"
        } else if !valid {
            "invalid"
        } else if search {
            "search"
        } else if self.steps.last().is_some_and(|s| s.action == action) {
            "repeated"
        } else {
            "off_plan"
        };
        self.best = self.best.min(self.distance);
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
        let text = self.play(action, dims);
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
    /// A step back is a search choice (the unit test's stand-in for household's).
    fn search_choice(&self, _w: &i32, said: &str) -> bool {
        said == "-"
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
    // (action, search right?)
    for (a, search_right) in [
        ("+", false),     // progress
        ("jump", false),  // invalid
        ("wait", false),  // off plan
        ("wait ", false), // the same action again (whitespace aside)
        ("-", false),     // valid, no progress, a search choice: wrong (foresight)
        ("-", true),      // the same, right by the environment's rule (belief)
        ("+", false),     // the plan shrank back to where it was: regained; the budget is spent
    ] {
        ep.search_right = search_right;
        let text = ep.play(a, vec![0]);
        answers.push(ep.answer(text));
    }
    let kinds: Vec<&str> = answers.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "progress", "invalid", "off_plan", "repeated", "search", "search", "regained"
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

/// What the planner environments' tests share: properties every planner task must have,
/// each a function of a way to sample episodes (household's and desktop's tests call them
/// with their own environment and its own bounds).
#[cfg(test)]
pub(crate) mod testing {
    use super::{Plan, PlanEpisode};
    use rlany_contract::{Environment, Episode, Rng, Split};

    /// Plays the expert on `ep` to the end; returns the whole text the model would read.
    pub(crate) fn play_expert<P: Plan>(ep: &mut PlanEpisode<P>) -> String {
        let mut text = ep.prompt();
        while !ep.done() {
            let Some(a) = ep.expert_action() else { break };
            let r = ep.step(&a);
            text.push_str(&a);
            text.push('\n');
            text.push_str(&r.observation);
            text.push('\n');
        }
        text
    }

    /// The expert solves at least 99% of 3000 tasks over random difficulties and all
    /// splits, and the oracle labels every one of its steps progress.
    pub(crate) fn assert_expert_solves_with_progress<P: Plan>(
        sample: impl Fn(&[f64], Split, u64) -> PlanEpisode<P>,
    ) {
        let mut rng = Rng::new(7);
        let n = 3000;
        let mut solved = 0;
        for i in 0..n {
            let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
            let split = [Split::Train, Split::Eval, Split::Ood][i % 3];
            let mut ep = sample(&d, split, i as u64);
            play_expert(&mut ep);
            solved += usize::from(ep.outcome());
            for s in 0..ep.steps_taken() {
                assert!(ep.label_of(s), "task {i} step {s} not progress");
            }
        }
        assert!(solved * 100 >= n * 99, "expert solved {solved}/{n}");
    }

    /// The flawed expert's (noise 0.5) success rate at each level (400 tasks each), its
    /// demonstrations replayed through `sample`'s episodes; and without noise it is the
    /// expert: the same prompt, every task solved (200 tasks at 0.6).
    pub(crate) fn flawed_expert_success<P: Plan>(
        env: &dyn Environment,
        sample: impl Fn(&[f64], Split, u64) -> PlanEpisode<P>,
        levels: &[f64],
    ) -> Vec<f64> {
        let replay = |d: &[f64], noise: f64, seed: u64| {
            let (prompt, acts) = env.demonstration(d, noise, seed);
            let mut ep = sample(d, Split::Train, seed);
            assert_eq!(prompt, ep.prompt());
            for a in acts {
                ep.step(&a);
            }
            ep.outcome()
        };
        for seed in 0..200 {
            assert!(replay(&[0.6; 4], 0.0, seed), "seed {seed}");
        }
        levels
            .iter()
            .map(|&level| {
                let ok = (0..400)
                    .filter(|&seed| replay(&[level; 4], 0.5, seed))
                    .count();
                ok as f64 / 400.0
            })
            .collect()
    }

    /// 20 000 episodes of junk: a quarter `garbage` in turn, a quarter random Unicode, half
    /// from `near_miss` (environment-specific almost-actions); every answer's observation is
    /// at most `max_observation` bytes and no episode outruns its budget.
    pub(crate) fn assert_junk_is_harmless<P: Plan>(
        sample: impl Fn(&[f64], Split, u64) -> PlanEpisode<P>,
        garbage: &[&str],
        mut near_miss: impl FnMut(&mut Rng, u64) -> String,
        max_observation: usize,
    ) {
        let mut rng = Rng::new(99);
        for i in 0..20_000u64 {
            let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
            let mut ep = sample(&d, Split::Train, i % 97);
            let action: String = match i % 4 {
                0 => garbage[(i / 4) as usize % garbage.len()].to_string(),
                1 => (0..rng.below(64))
                    .map(|_| char::from_u32(rng.below(0x3000) as u32).unwrap_or('?'))
                    .collect(),
                _ => near_miss(&mut rng, i),
            };
            for _ in 0..3 {
                let r = ep.step(&action);
                assert!(r.observation.len() <= max_observation, "{}", r.observation);
            }
            assert!(ep.steps_taken() <= ep.max_steps());
        }
    }

    /// Calls `check(a, b, k)` on 600 pairs of task draws with the same seed whose
    /// difficulties differ in coordinate `k` only (k = seed mod 4; a rewrite): what `k` does
    /// not control must be the same in both.
    pub(crate) fn for_each_rewrite<T>(
        draw: impl Fn(&[f64], u64) -> T,
        mut check: impl FnMut(&T, &T, usize),
    ) {
        let mut rng = Rng::new(5);
        for seed in 0..600 {
            let base: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
            let k = seed as usize % 4;
            let mut other = base.clone();
            other[k] = rng.uniform();
            check(&draw(&base, seed), &draw(&other, seed), k);
        }
    }

    /// No prompt of 20 000 tasks (random difficulties, all splits) is over `max` characters.
    pub(crate) fn assert_prompts_bounded<P: Plan>(
        sample: impl Fn(&[f64], Split, u64) -> PlanEpisode<P>,
        max: usize,
    ) {
        let mut rng = Rng::new(21);
        let longest = (0..20_000u64)
            .map(|seed| {
                let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
                let split = [Split::Train, Split::Eval, Split::Ood][seed as usize % 3];
                sample(&d, split, seed).prompt().chars().count()
            })
            .max();
        assert!(longest.is_some_and(|l| l <= max), "{longest:?}");
    }

    /// `slack` sets the horizon with the tasks and the demonstrations fixed: two
    /// environments of `slack` `tight` and `wide` (and the default's demonstrations) at
    /// difficulty `d`, 20 seeds.
    pub(crate) fn assert_slack_sets_the_horizon<P: Plan>(
        (tight, wide): (usize, usize),
        d: &[f64],
        build: impl Fn(usize) -> Box<dyn Environment>,
        sample: impl Fn(usize, &[f64], Split, u64) -> PlanEpisode<P>,
    ) {
        let default = build(super::STEP_SLACK);
        for seed in 0..20u64 {
            let (a, b) = (
                sample(tight, d, Split::Train, seed),
                sample(wide, d, Split::Train, seed),
            );
            assert_eq!(a.prompt(), b.prompt());
            assert_eq!(a.max_steps(), a.distance() + tight);
            assert_eq!(b.max_steps(), a.distance() + wide);
            for slack in [tight, wide] {
                assert_eq!(
                    build(slack).demonstration(d, 0.5, seed),
                    default.demonstration(d, 0.5, seed)
                );
            }
        }
    }

    /// The tests every planner environment runs, written once: the expert solves every sampled
    /// task with every step progress; the flawed expert's success per level passes
    /// `flawed(&accs)`; tasks are pure functions of difficulty, split and seed (out-of-range
    /// coordinates clamped, missing ones 0); every dimension is structurally monotone under
    /// `counts`; no prompt is over `max_prompt` characters. `env` builds the environment (an
    /// expression evaluated in each test); the environment's own tests stay in its module.
    macro_rules! planner_env_tests {
        (
            env: $env:expr,
            levels: $levels:expr,
            flawed: $flawed:expr,
            counts: $counts:expr,
            max_prompt: $max_prompt:expr $(,)?
        ) => {
            #[test]
            fn the_expert_solves_every_sampled_task_with_every_step_progress() {
                let env = $env;
                $crate::planner::testing::assert_expert_solves_with_progress(|d, split, seed| {
                    env.sample_episode(d, split, seed)
                });
            }

            #[test]
            fn the_flawed_expert_is_mid_range() {
                let env = $env;
                let sample = |d: &[f64], split, seed| env.sample_episode(d, split, seed);
                let accs = $crate::planner::testing::flawed_expert_success(&env, sample, &$levels);
                let check = $flawed;
                check(&accs);
            }

            #[test]
            fn tasks_are_pure_functions_of_difficulty_split_and_seed() {
                use rlany_contract::Split;
                let env = $env;
                for seed in 0..200 {
                    let d = [0.3, 0.9, 0.6, 0.1];
                    for split in [Split::Train, Split::Eval, Split::Ood] {
                        assert_eq!(env.draw(&d, split, seed), env.draw(&d, split, seed));
                    }
                }
                assert_eq!(
                    env.draw(&[f64::NAN, 2.0, -1.0], Split::Train, 3),
                    env.draw(&[0.0, 1.0, 0.0, 0.0], Split::Train, 3)
                );
            }

            #[test]
            fn every_dimension_is_structurally_monotone() {
                let env = $env;
                let draw = |d: &[f64], seed| env.draw(d, rlany_contract::Split::Train, seed);
                $crate::planner::testing::assert_structurally_monotone(draw, $counts);
            }

            #[test]
            fn prompts_are_bounded() {
                let env = $env;
                $crate::planner::testing::assert_prompts_bounded(
                    |d, split, seed| env.sample_episode(d, split, seed),
                    $max_prompt,
                );
            }
        };
    }
    pub(crate) use planner_env_tests;

    /// Property shared by the planner environments' task draws (a test helper): raising one of the
    /// four difficulty coordinates by 0.1 never lowers its structural count and leaves the
    /// other three counts alone, and it moves its own count often enough (1500 draws).
    pub(crate) fn assert_structurally_monotone<T>(
        draw: impl Fn(&[f64], u64) -> T,
        counts: impl Fn(&T) -> [usize; 4],
    ) {
        let mut rng = rlany_contract::Rng::new(11);
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
}
