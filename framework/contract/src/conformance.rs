//! The contract every environment keeps, checked the same way for every one of them: every
//! environment plugin the `rlany` binary lists (a test runs it on each, built in or a user's),
//! a plugin crate's own tests ([`assert_conforms`]) and an environment in another process
//! (`rlany env process -- CMD`, which adds the protocol's own checks). `rlany env NAME
//! --check` runs it for a user.
//!
//! 1. `space`: the difficulty space has at least one dimension, with distinct non-empty
//!    names, and the evaluation grid is non-empty, inside `[0, 1]` and increasing.
//! 2. `deterministic`: the same `(difficulty, split, seed)` twice gives the same prompt, key,
//!    and — playing the expert's actions — the same answers (observation, done, label,
//!    dimensions, blame).
//! 3. `expert solves`: the expert (noise 0) solves its task at every eval-grid level, for a
//!    few seeds, and the oracle labels every one of its steps right (where labels are
//!    promised: a process environment may leave `label` out; then the share is shown).
//! 4. `step answers`: on the expert's and a fully flawed expert's (noise 1) trajectories,
//!    every step's dimensions and blame name dimensions of the space, its kind is a valid
//!    metric name, a right step carries no blame (compiled in; the loop ignores a process
//!    child's), the answer's `done` is the
//!    episode's, and an action after the end is answered [`StepResult::ended`] (nothing
//!    happens).
//! 5. `any action`: an empty action, 500 characters of junk and non-ASCII text get answers
//!    (wasted steps, not errors).
//! 6. `splits`: the `ood` split gives other tasks than `train` for the same seeds, and
//!    `eval` other tasks than `train`.
//! 7. `oracle labels` (where labels are promised): the oracle is read on steps that are not
//!    the expert's — a flawed expert's (noise 0.5 and 1) and a random policy's (actions drawn
//!    from the experts' own, [`ORACLE_SEEDS`] tasks a grid level) — and must agree with the
//!    expert and the verifier: every kind of action the expert takes (its leading word: `take`,
//!    `click`, `L`) is labelled right on some of those steps once it was taken at least
//!    [`MIN_KIND_STEPS`] times (an oracle that labels every step of one kind wrong fails
//!    here, naming a step that shows it), and a flawed expert's episode that ends with every
//!    step labelled right is solved.
//!
//! Each check names what it saw; the first failure of a check is its detail.

use crate::{Environment, Episode, Split, StepResult};

/// Seeds each check samples.
pub const SEEDS: [u64; 3] = [1, 2, 3];

/// Tasks per eval-grid level that check 7 plays with each policy (seeds 1, 2, …).
pub const ORACLE_SEEDS: u64 = 8;

/// Steps of one action kind check 7 needs before it asks for one labelled right.
pub const MIN_KIND_STEPS: usize = 10;

/// The longest episode check 7's random policy plays (an environment may never end one).
const RANDOM_MAX_STEPS: usize = 200;

/// One check's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// The check's name.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

impl Check {
    /// The check `name` with `result`'s detail.
    pub fn new(name: &'static str, result: Result<String, String>) -> Self {
        let (ok, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        Self { name, ok, detail }
    }
}

/// How the checks reach an environment. An environment compiled in cannot fail a call
/// ([`Compiled`]); one in another process can, and says why (the check then fails with it).
pub trait Subject {
    /// The episodes it hands out.
    type Episode: Episode;
    /// Whether the oracle's fields are promised in full: a label on every step (so the
    /// expert's steps must be labelled right) and no blame on a right step. A process
    /// environment may leave `label` out, and the loop ignores blame sent on a right step.
    const LABELS: bool;
    /// The environment itself.
    fn env(&self) -> &dyn Environment;
    /// [`Environment::sample`], or why it failed.
    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Result<Self::Episode, String>;
    /// [`Episode::step`], or why it failed.
    fn step(&self, ep: &mut Self::Episode, action: &str) -> Result<StepResult, String>;
    /// [`Environment::demonstration`], or why it failed.
    fn demonstration(
        &self,
        d: &[f64],
        noise: f64,
        seed: u64,
    ) -> Result<(String, Vec<String>), String>;
}

/// An environment compiled into this binary: its calls cannot fail.
pub struct Compiled<'a>(pub &'a dyn Environment);

impl Subject for Compiled<'_> {
    type Episode = Box<dyn Episode>;
    const LABELS: bool = true;
    fn env(&self) -> &dyn Environment {
        self.0
    }
    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Result<Box<dyn Episode>, String> {
        Ok(self.0.sample(d, split, seed))
    }
    fn step(&self, ep: &mut Box<dyn Episode>, action: &str) -> Result<StepResult, String> {
        Ok(ep.step(action))
    }
    fn demonstration(
        &self,
        d: &[f64],
        noise: f64,
        seed: u64,
    ) -> Result<(String, Vec<String>), String> {
        Ok(self.0.demonstration(d, noise, seed))
    }
}

/// One played episode: its prompt, key, every step's answer, and its outcome.
#[derive(Debug, PartialEq)]
struct Played {
    prompt: String,
    key: String,
    steps: Vec<StepResult>,
    done: bool,
    outcome: bool,
}

/// Plays `actions` in the training task `(d, seed)` of an environment compiled in until the
/// episode ends: what [`crate::env::fingerprint`] hashes (`Debug` of the played episode).
pub(crate) fn replay(
    env: &dyn Environment,
    d: &[f64],
    seed: u64,
    actions: &[String],
) -> impl std::fmt::Debug {
    // A compiled-in environment's calls cannot fail.
    play(&Compiled(env), d, Split::Train, seed, actions)
}

/// Plays `actions` in the task `(d, split, seed)` until the episode ends.
fn play<S: Subject>(
    s: &S,
    d: &[f64],
    split: Split,
    seed: u64,
    actions: &[String],
) -> Result<Played, String> {
    let mut ep = s.sample(d, split, seed)?;
    let mut steps = Vec::new();
    for a in actions {
        if ep.done() {
            break;
        }
        steps.push(s.step(&mut ep, a)?);
    }
    Ok(Played {
        prompt: ep.prompt(),
        key: ep.task_key(),
        steps,
        done: ep.done(),
        outcome: ep.outcome(),
    })
}

/// Runs checks 1–7 on `s` (7 only where labels are promised).
pub fn run<S: Subject>(s: &S) -> Vec<Check> {
    let dims = s.env().difficulty_space();
    let levels = s.env().eval_levels();
    let space = space(&dims, &levels);
    let ok = space.is_ok();
    let mut out = vec![Check::new("space", space)];
    if !ok {
        return out;
    }
    let grid = |level: f64| vec![level; dims.len()];
    let (first, last, middle) = (
        levels[0],
        levels[levels.len() - 1],
        levels[levels.len() / 2],
    );
    out.push(Check::new(
        "deterministic",
        (|| {
            for level in [first, last] {
                for split in [Split::Train, Split::Ood] {
                    let seed = SEEDS[0];
                    let (_, actions) = s.demonstration(&grid(level), 0.0, seed)?;
                    let a = play(s, &grid(level), split, seed, &actions)?;
                    let b = play(s, &grid(level), split, seed, &actions)?;
                    if a != b {
                        return Err(format!(
                            "level {level}, {split:?}, seed {seed}: two resets differ:\n{a:?}\n{b:?}"
                        ));
                    }
                }
            }
            Ok("the same task twice gives the same prompt and answers".into())
        })(),
    ));
    out.push(Check::new(
        "expert solves",
        (|| {
            let (mut solved, mut n, mut steps, mut right) = (0, 0, 0, 0);
            let mut first_fail = None;
            for &level in &levels {
                for seed in SEEDS {
                    let (_, actions) = s.demonstration(&grid(level), 0.0, seed)?;
                    let p = play(s, &grid(level), Split::Train, seed, &actions)?;
                    n += 1;
                    steps += p.steps.len();
                    right += p.steps.iter().filter(|r| r.label).count();
                    let wrong = p.steps.iter().position(|r| !r.label).filter(|_| S::LABELS);
                    if p.outcome && wrong.is_none() {
                        solved += 1;
                    } else if first_fail.is_none() {
                        let why = match wrong {
                            Some(i) => {
                                format!("its step {} ({:?}) is labelled wrong", i + 1, actions[i])
                            }
                            None => "unsolved".to_string(),
                        };
                        first_fail =
                            Some(format!("level {level}, seed {seed}: {why}; {actions:?}"));
                    }
                }
            }
            match first_fail {
                None => Ok(format!(
                    "{solved} of {n} tasks, {right} of {steps} steps labelled right, {:.1} \
                     steps on average",
                    steps as f64 / n as f64
                )),
                Some(f) => Err(format!("{solved} of {n} tasks; the first failure: {f}")),
            }
        })(),
    ));
    out.push(Check::new(
        "step answers",
        (|| {
            let mut n = 0;
            for noise in [0.0, 1.0] {
                for &level in &[first, last] {
                    for seed in SEEDS {
                        let at = format!("level {level}, noise {noise}, seed {seed}");
                        let (_, actions) = s.demonstration(&grid(level), noise, seed)?;
                        let mut ep = s.sample(&grid(level), Split::Train, seed)?;
                        for (i, a) in actions.iter().enumerate() {
                            if ep.done() {
                                break;
                            }
                            let r = s.step(&mut ep, a)?;
                            n += 1;
                            answer_ok(&r, dims.len(), S::LABELS)
                                .map_err(|e| format!("{at}, step {} ({a:?}): {e}", i + 1))?;
                            if r.done != ep.done() {
                                return Err(format!(
                                    "{at}, step {}: the answer says done = {}, the episode {}",
                                    i + 1,
                                    r.done,
                                    ep.done()
                                ));
                            }
                        }
                        if ep.done() {
                            let after = s.step(&mut ep, "x")?;
                            if after != StepResult::ended() || !ep.done() {
                                return Err(format!(
                                    "{at}: an action after the end was answered {after:?}"
                                ));
                            }
                        }
                    }
                }
            }
            let blamed = if S::LABELS {
                "no right step is blamed, "
            } else {
                ""
            };
            Ok(format!(
                "{n} answers name known dimensions, {blamed}an ended episode stays ended"
            ))
        })(),
    ));
    out.push(Check::new(
        "any action",
        (|| {
            let junk = [
                "".to_string(),
                "#".repeat(500),
                "é ☃ \u{7f} \"quoted\" \\".to_string(),
            ];
            let mut ep = s.sample(&grid(first), Split::Train, SEEDS[0])?;
            for a in &junk {
                if ep.done() {
                    break;
                }
                s.step(&mut ep, a)
                    .map_err(|e| format!("action {:.20?}: {e}", a))?;
            }
            Ok("an empty, a 500-character and a non-ASCII action were answered".into())
        })(),
    ));
    if S::LABELS {
        out.push(Check::new(
            "oracle labels",
            oracle_labels(s, &levels, &grid),
        ));
    }
    out.push(Check::new(
        "splits",
        (|| {
            let mut differ = [0; 2];
            for seed in SEEDS {
                let key = |split| s.sample(&grid(middle), split, seed).map(|e| e.task_key());
                let train = key(Split::Train)?;
                differ[0] += usize::from(key(Split::Eval)? != train);
                differ[1] += usize::from(key(Split::Ood)? != train);
            }
            if differ.contains(&0) {
                Err(format!(
                    "for seeds {SEEDS:?}, eval differs from train {} times, ood {} times",
                    differ[0], differ[1]
                ))
            } else {
                Ok(format!(
                    "eval differs from train on {} of {n} seeds, ood on {} of {n}",
                    differ[0],
                    differ[1],
                    n = SEEDS.len()
                ))
            }
        })(),
    ));
    out
}

/// What kind of action `a` is: its leading word (ASCII letters and `_`), or `None` when it
/// starts otherwise (`7+5=12`).
pub fn action_kind(a: &str) -> Option<&str> {
    let a = a.trim_start();
    let end = a
        .find(|c: char| !(c.is_ascii_alphabetic() || c == '_'))
        .unwrap_or(a.len());
    (end > 0).then(|| &a[..end])
}

/// One step seen by check 7: where it was, what was done, what the oracle said.
struct Seen {
    at: String,
    action: String,
    label: bool,
}

/// Check 7 (see the module documentation).
fn oracle_labels<S: Subject>(
    s: &S,
    levels: &[f64],
    grid: &dyn Fn(f64) -> Vec<f64>,
) -> Result<String, String> {
    // The experts' actions over every level and task: what the random policy draws from,
    // and the kinds the (noise-free) expert takes.
    let mut vocabulary: Vec<String> = Vec::new();
    let mut expert_kinds: Vec<String> = Vec::new();
    for &level in levels {
        for seed in 1..=ORACLE_SEEDS {
            for noise in [0.0, 1.0] {
                let (_, actions) = s.demonstration(&grid(level), noise, seed)?;
                for a in actions {
                    if noise == 0.0
                        && let Some(k) = action_kind(&a)
                        && !expert_kinds.iter().any(|e| e == k)
                    {
                        expert_kinds.push(k.to_string());
                    }
                    if !vocabulary.contains(&a) {
                        vocabulary.push(a);
                    }
                }
            }
        }
    }
    if vocabulary.is_empty() {
        return Err("the expert takes no action on any task".into());
    }
    let mut rng = crate::Rng::new(7);
    let mut seen: Vec<Seen> = Vec::new();
    let mut episodes = 0;
    for &level in levels {
        for seed in 1..=ORACLE_SEEDS {
            // The flawed experts: an episode they end with every step labelled right is solved.
            for noise in [0.5, 1.0] {
                let (_, actions) = s.demonstration(&grid(level), noise, seed)?;
                let p = play(s, &grid(level), Split::Train, seed, &actions)?;
                episodes += 1;
                let all_right = p.steps.iter().all(|r| r.label);
                if all_right && p.done && !p.outcome {
                    return Err(format!(
                        "level {level}, seed {seed}, the flawed expert (noise {noise}): every \
                         step is labelled right, yet the episode ended unsolved; actions \
                         {actions:?}"
                    ));
                }
                for (i, (a, r)) in actions.iter().zip(&p.steps).enumerate() {
                    seen.push(Seen {
                        at: format!(
                            "level {level}, seed {seed}, flawed expert {noise}, step {}",
                            i + 1
                        ),
                        action: a.clone(),
                        label: r.label,
                    });
                }
            }
            // The random policy.
            let mut ep = s.sample(&grid(level), Split::Train, seed)?;
            episodes += 1;
            for i in 0..RANDOM_MAX_STEPS {
                if ep.done() {
                    break;
                }
                let a = vocabulary[rng.below(vocabulary.len())].clone();
                let r = s.step(&mut ep, &a)?;
                seen.push(Seen {
                    at: format!("level {level}, seed {seed}, random policy, step {}", i + 1),
                    action: a,
                    label: r.label,
                });
            }
        }
    }
    for kind in &expert_kinds {
        let of_kind: Vec<&Seen> = seen
            .iter()
            .filter(|x| action_kind(&x.action) == Some(kind.as_str()))
            .collect();
        if of_kind.len() >= MIN_KIND_STEPS && of_kind.iter().all(|x| !x.label) {
            let x = of_kind[0];
            return Err(format!(
                "`{kind}`: none of {} steps of this kind by a flawed expert or a random policy \
                 is labelled right, though the expert takes it; e.g. {}: {:?} labelled wrong",
                of_kind.len(),
                x.at,
                x.action
            ));
        }
    }
    let right = seen.iter().filter(|x| x.label).count();
    Ok(format!(
        "{} steps of {episodes} flawed-expert and random episodes, {right} labelled right; \
         every kind the expert takes ({}) is labelled right somewhere",
        seen.len(),
        expert_kinds.join(", ")
    ))
}

/// The checks on `env` (compiled in), or a panic naming every check that failed with what
/// it saw: what a plugin crate's tests call.
///
/// ```ignore
/// #[test]
/// fn countdown_keeps_the_contract() {
///     rlany_contract::conformance::assert_conforms(CountdownSpec::default().build().as_ref());
/// }
/// ```
pub fn assert_conforms(env: &dyn Environment) {
    let failed: Vec<String> = run(&Compiled(env))
        .into_iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(
        failed.is_empty(),
        "the environment fails {} of the contract's checks:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Check 1: the space and the grid.
fn space(dims: &[crate::Dim], levels: &[f64]) -> Result<String, String> {
    if dims.is_empty() {
        return Err("the difficulty space has no dimension".into());
    }
    for (i, d) in dims.iter().enumerate() {
        if d.name.trim().is_empty() {
            return Err(format!("dimension {i} has no name"));
        }
        if dims[..i].iter().any(|e| e.name == d.name) {
            return Err(format!("two dimensions are named `{}`", d.name));
        }
    }
    if levels.is_empty()
        || levels.iter().any(|l| !(0.0..=1.0).contains(l))
        || levels.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(format!(
            "the eval grid {levels:?} must be non-empty, in [0, 1] and increasing"
        ));
    }
    let names: Vec<&str> = dims.iter().map(|d| d.name.as_str()).collect();
    Ok(format!(
        "{} dims ({}), eval grid {levels:?}",
        dims.len(),
        names.join(", ")
    ))
}

/// Check 4 on one answer: dimensions inside the space, a valid kind, no blame on a right step
/// (`strict`).
fn answer_ok(r: &StepResult, n_dims: usize, strict: bool) -> Result<(), String> {
    if let Some(d) = r.dims.iter().chain(&r.blame).find(|&&d| d >= n_dims) {
        return Err(format!(
            "names dimension {d}; the space has {n_dims} ({r:?})"
        ));
    }
    if !crate::env::valid_kind(&r.kind) {
        return Err(format!("kind {:?} is not a step kind", r.kind));
    }
    if strict && r.label && !r.blame.is_empty() {
        return Err(format!("a right step carries blame {:?}", r.blame));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Doors;

    #[test]
    fn a_sound_environment_passes_and_a_planted_oracle_bug_is_named() {
        let checks = run(&Compiled(&Doors { wrong_r: false }));
        assert_eq!(checks.len(), 7);
        for c in &checks {
            assert!(c.ok, "{}: {}", c.name, c.detail);
        }
        assert_conforms(&Doors { wrong_r: false });
        // Every `R` labelled wrong: the oracle check names the kind and a step.
        let checks = run(&Compiled(&Doors { wrong_r: true }));
        let oracle = checks
            .iter()
            .find(|c| c.name == "oracle labels")
            .expect("the oracle check");
        assert!(!oracle.ok);
        assert!(
            oracle.detail.starts_with("`R`: none of"),
            "{}",
            oracle.detail
        );
        assert!(oracle.detail.contains("step "), "{}", oracle.detail);
        let panic = std::panic::catch_unwind(|| assert_conforms(&Doors { wrong_r: true }))
            .expect_err("refused");
        let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("oracle labels: `R`"), "{text}");
    }

    #[test]
    fn an_action_s_kind_is_its_leading_word() {
        assert_eq!(action_kind("take egg"), Some("take"));
        assert_eq!(action_kind("click(4)"), Some("click"));
        assert_eq!(action_kind(" L"), Some("L"));
        assert_eq!(action_kind("7+5=12"), None);
        assert_eq!(action_kind(""), None);
    }

    /// An environment that breaks the contract fails the check that says so.
    #[test]
    fn a_blamed_right_step_and_an_unknown_dimension_fail_step_answers() {
        let mut r = StepResult::taken("o".into(), false, true, vec![0], Vec::new());
        assert!(answer_ok(&r, 1, true).is_ok());
        r.blame = vec![0];
        assert!(
            answer_ok(&r, 1, true)
                .expect_err("refused")
                .contains("right step carries blame")
        );
        assert!(
            answer_ok(&r, 1, false).is_ok(),
            "a process child's is ignored"
        );
        r.blame.clear();
        r.kind = "Not a kind".into();
        assert!(
            answer_ok(&r, 1, true)
                .expect_err("refused")
                .contains("not a step kind")
        );
        r.kind = "off_plan".into();
        r.dims = vec![3];
        assert!(
            answer_ok(&r, 2, false)
                .expect_err("refused")
                .contains("names dimension 3")
        );
    }
}
