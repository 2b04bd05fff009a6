//! `corridor`: a corridor of doors, one `L`/`R` answer per door, every step judged by a
//! clear oracle. The positive control for step credit: the outcome depends on how many
//! steps were wrong, and the oracle says exactly which.
//!
//! # Task format
//!
//! A task is a corridor of `k` doors. Each door shows a sign, one digit `0`–`9`; the agent
//! answers one line per door, `L` or `R`. The right answer is one global rule: `L` if the
//! digit is below 5, `R` otherwise. The prompt is the rule in a short line, then the first
//! door's digit, each followed by the step delimiter `'\n'`; after every answer that does not
//! end the episode the observation is the next door's digit alone:
//!
//! ```text
//! L if sign<5 else R     (prompt, line 1)
//! 7                      (prompt, line 2: door 1)
//! R
//! 2                      (observation: door 2)
//! L
//! 5                      (observation: door 3)
//! L                      (a wrong step: 5 needs R)
//! ```
//!
//! The horizon is fixed: the episode ends after exactly `k` answers, never earlier, and the
//! last answer is followed by the empty observation; steps after the end are ignored. An
//! answer is right iff, with surrounding whitespace trimmed, it is exactly the right letter
//! (upper case); anything else (the other letter, `l`, `left`, garbage of any length, an
//! empty line) is a wrong step. The task is solved iff the episode is over and at most
//! `slack` of its `k` steps were wrong ([`Episode::outcome`] is `false` until then).
//!
//! # Difficulty space (1 dim, clamped to `[0, 1]`, NaN → 0, missing → 0)
//!
//! | index | name     | meaning (environment units)                                   | lo           | hi           |
//! |-------|----------|---------------------------------------------------------------|--------------|--------------|
//! | 0     | `length` | doors `k = min_length + round(d0 · (max_length − min_length))` | `min_length` | `max_length` |
//!
//! `round` is [`f64::round`], to the nearest integer with halves away from zero: it is
//! deterministic, so a setting gives exactly one horizon (with the defaults `5..=30`:
//! `d0 = 0 → 5`, `0.02 → 6` (`0.5` rounds up), `0.1 → 8`, `0.5 → 18` (`12.5 → 13`),
//! `1 → 30`). With `min_length == max_length` every task has that length.
//!
//! # Rewrites (same seed, another difficulty)
//!
//! The digits come from the stream `Rng::derive(base, "corridor/signs")`, one uniform per
//! door drawn in order, so door `i`'s digit never depends on `k`: a rewrite to another
//! length keeps the common prefix of doors (a longer corridor is the shorter one with doors
//! appended).
//!
//! # Splits
//!
//! `Train` draws from the seed itself (`base = seed`); `Eval` from
//! `base = Rng::derive(seed, "corridor/split/eval").next_u64()`: the same distribution,
//! another task for the same seed (a disjoint seed space). `Ood` (from
//! `base = Rng::derive(seed, "corridor/split/ood").next_u64()`) has corridors 1.5 times as
//! long, `k_ood = round(1.5 k)` (halves up: `5 → 8`, `18 → 27`, `30 → 45`), with the same
//! rule. The in-domain evaluation grid ([`Environment::eval_levels`]) is the default
//! `[0, 0.25, 0.5, 0.75, 1]`.
//!
//! # Oracle
//!
//! A step's [`StepResult`]: `label` is whether it was right (each step on its own; a wrong
//! step does not make later ones wrong); `dims` is `[length]` for every step (each door
//! exists because of the length); `blame` is `[length]` when the step was wrong, else empty;
//! `kind` is `borderline` at a door whose sign the flawed expert confuses (3–6, below) and
//! `clear` at the others, right or wrong.
//!
//! # Flawed expert ([`Environment::demonstration`])
//!
//! `demonstration(d, noise, seed)` answers exactly `sample(d, Train, seed)` (same prompt).
//! The flawed expert confuses the *borderline* signs: at a door showing 3, 4, 5 or 6 it
//! answers the other letter with probability `noise`; at every other door it is right (one
//! uniform per door in order from the stream `Rng::derive(seed, "corridor/noise")`, drawn at
//! every door, so a rewrite keeps the flips of the common doors too). A policy warm-started
//! on it answers a borderline sign wrong with probability ≈ `noise` when it samples, and at
//! `noise > 0.5` its greedy answer there is wrong too — so sampled training success and the
//! greedy evaluation both leave room to learn, and what must be learned is which steps were
//! wrong. A door is borderline with probability 0.4, so a sampled step is wrong with
//! probability ≈ `0.4 · noise`; noise 0 solves every task, noise 1 gets every borderline
//! door wrong.
//!
//! # Length bounds
//!
//! With `H = 18` the characters of the rule line (`L if sign<5 else R`), the expert's
//! episode of `k` doors as the policy's context holds it (prompt, every answer and
//! observation, one delimiter after each) is `(H + 3) + 2k + 2(k − 1) = 4k + H + 1 = 4k + 19`
//! characters ([`Corridor::episode_chars`]): 139 at `k = 30`, 199 at `k = 45`, 379 at the
//! largest OOD corridor (`max_length = 60`, `k_ood = 90`). [`Corridor::max_trajectory_chars`]
//! is the bound over every task of the settings, OOD included; with a character tokenizer the
//! model needs `max_seq_len ≥ 1 (BOS) + max_trajectory_chars + max_step_tokens`, and a step
//! budget (`max_env_steps`) of at least `k_ood` to finish an OOD task. A policy that writes
//! answers of `a` characters takes `(a − 1)·k` more.

use crate::draw;
use rlany_contract::check::{self, Checked, FieldError};
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Rng, Split, StepResult};
use serde::{Deserialize, Serialize};

/// Index of the `length` dimension.
pub const LENGTH: usize = 0;
/// The longest Train/Eval corridor `max_length` may ask for.
pub const MAX_LENGTH: usize = 60;
/// The rule line the prompt starts with.
const RULE: &str = "L if sign<5 else R";
/// Digits below this need `L`, the others `R`.
const THRESHOLD: u8 = 5;

/// The `corridor` settings of an experiment file:
/// `environment: Corridor(difficulty: [0.6], min_length: 5, max_length: 30, slack: 2)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorridorSpec {
    /// Starting difficulty of every task slot, one value in `[0, 1]` (`length`).
    pub difficulty: Vec<f64>,
    /// Doors at `length = 0`; in `1..=max_length`.
    pub min_length: usize,
    /// Doors at `length = 1`; in `min_length..=60` (OOD corridors are 1.5 times as long).
    pub max_length: usize,
    /// Wrong steps a solved episode may have; below `min_length`.
    pub slack: usize,
}

impl Default for CorridorSpec {
    fn default() -> Self {
        Self {
            difficulty: vec![0.2],
            min_length: 5,
            max_length: 30,
            slack: 2,
        }
    }
}

impl EnvironmentPlugin for CorridorSpec {
    fn validate(&self) -> Checked {
        check::count("min_length", self.min_length, 1, MAX_LENGTH)?;
        if self.max_length < self.min_length || self.max_length > MAX_LENGTH {
            return Err(FieldError::new(
                "max_length",
                format!(
                    "must be in min_length..={MAX_LENGTH} = {}..={MAX_LENGTH} (got {})",
                    self.min_length, self.max_length
                ),
            ));
        }
        if self.slack >= self.min_length {
            return Err(FieldError::new(
                "slack",
                format!(
                    "must be below min_length ({}), or the shortest corridor is solved without a \
                     right answer (got {})",
                    self.min_length, self.slack
                ),
            ));
        }
        check::difficulty("difficulty", &self.difficulty, &["length"])
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(Corridor::new(self.min_length, self.max_length, self.slack))
    }
}

/// The `corridor` environment (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corridor {
    min_length: usize,
    max_length: usize,
    slack: usize,
}

impl Corridor {
    /// A new environment. Out-of-range settings are clamped into range (`min_length` into
    /// `1..=60`, `max_length` into `min_length..=60`, `slack` below `min_length`); use
    /// [`CorridorSpec`]'s `validate` first to reject them instead.
    pub fn new(min_length: usize, max_length: usize, slack: usize) -> Self {
        let min_length = min_length.clamp(1, MAX_LENGTH);
        Self {
            min_length,
            max_length: max_length.clamp(min_length, MAX_LENGTH),
            slack: slack.min(min_length - 1),
        }
    }

    /// `(min_length, max_length, slack)` after clamping.
    pub fn settings(&self) -> (usize, usize, usize) {
        (self.min_length, self.max_length, self.slack)
    }

    /// The number of doors of a Train/Eval task of difficulty `d`.
    pub fn length(&self, d: &[f64]) -> usize {
        let span = (self.max_length - self.min_length) as f64;
        self.min_length + (draw::coord(d, LENGTH) * span).round() as usize
    }

    /// The number of doors of an OOD task of difficulty `d`: `round(1.5 k)`, halves up.
    pub fn ood_length(&self, d: &[f64]) -> usize {
        (3 * self.length(d)).div_ceil(2)
    }

    /// Characters of the expert's episode of `k` doors as the policy's context holds it
    /// (prompt, answers, observations, one delimiter after each; BOS not included):
    /// `4k + 19`.
    pub fn episode_chars(k: usize) -> usize {
        (RULE.len() + 3) + 2 * k + 2 * k.saturating_sub(1)
    }

    /// The most characters of any (flawed) expert episode of these settings, OOD included:
    /// [`Self::episode_chars`] of the longest OOD corridor.
    pub fn max_trajectory_chars(&self) -> usize {
        Self::episode_chars(self.ood_length(&[1.0]))
    }

    /// Like [`Environment::sample`], but returns the concrete episode type.
    pub fn sample_episode(&self, d: &[f64], split: Split, seed: u64) -> CorridorEpisode {
        let (base, k) = match split {
            Split::Train => (seed, self.length(d)),
            Split::Eval => (
                Rng::derive(seed, "corridor/split/eval").next_u64(),
                self.length(d),
            ),
            Split::Ood => (
                Rng::derive(seed, "corridor/split/ood").next_u64(),
                self.ood_length(d),
            ),
        };
        let mut rng = Rng::derive(base, "corridor/signs");
        let signs = (0..k)
            .map(|_| draw::index(rng.uniform(), 10) as u8)
            .collect();
        CorridorEpisode::new(signs, self.slack)
    }
}

impl Environment for Corridor {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![Dim::new(
            "length",
            self.min_length as f64,
            self.max_length as f64,
        )]
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.sample_episode(d, split, seed))
    }

    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let ep = self.sample_episode(d, Split::Train, seed);
        let mut flips = Rng::derive(seed, "corridor/noise");
        let steps = ep
            .signs
            .iter()
            .map(|&s| {
                let right = answer(s);
                let slip = flips.uniform() < noise && BORDERLINE.contains(&s);
                let letter = if slip { other(right) } else { right };
                letter.to_string()
            })
            .collect();
        (ep.prompt(), steps)
    }
}

/// The signs the flawed expert confuses (the two on each side of the threshold).
const BORDERLINE: [u8; 4] = [3, 4, 5, 6];

/// The right answer at a door with sign `s`.
fn answer(s: u8) -> char {
    if s < THRESHOLD { 'L' } else { 'R' }
}

/// The other letter.
fn other(c: char) -> char {
    if c == 'L' { 'R' } else { 'L' }
}

/// One corridor being walked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorridorEpisode {
    /// The doors' signs, one digit each.
    signs: Vec<u8>,
    /// Wrong steps a solved episode may have.
    slack: usize,
    /// Whether each step taken so far was right.
    right: Vec<bool>,
}

impl CorridorEpisode {
    fn new(signs: Vec<u8>, slack: usize) -> Self {
        Self {
            right: Vec::with_capacity(signs.len()),
            signs,
            slack,
        }
    }

    /// The doors' signs, one digit `0..=9` each.
    pub fn signs(&self) -> &[u8] {
        &self.signs
    }

    /// The number of doors `k` (the fixed horizon).
    pub fn length(&self) -> usize {
        self.signs.len()
    }

    /// Wrong steps a solved episode may have.
    pub fn slack(&self) -> usize {
        self.slack
    }

    /// Steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.right.len()
    }

    /// Wrong steps so far.
    pub fn wrong_steps(&self) -> usize {
        self.right.iter().filter(|r| !**r).count()
    }

    /// The right answers, one per door.
    pub fn expert_answers(&self) -> Vec<String> {
        self.signs.iter().map(|&s| answer(s).to_string()).collect()
    }
}

impl Episode for CorridorEpisode {
    fn prompt(&self) -> String {
        match self.signs.first() {
            Some(s) => format!("{RULE}\n{s}\n"),
            None => format!("{RULE}\n"),
        }
    }

    fn instructions(&self) -> Option<String> {
        Some(format!(
            "You walk a corridor of {} doors. At each door I show its sign, one digit from 0 to \
             9, and you answer L or R, one letter per reply: L if the digit is below 5, R if it \
             is 5 or more. After each answer I show the next door's digit.",
            self.signs.len()
        ))
    }

    fn step(&mut self, action: &str) -> StepResult {
        let i = self.right.len();
        let Some(&sign) = self.signs.get(i) else {
            return StepResult::ended();
        };
        let mut buf = [0u8; 4];
        let right = action.trim() == answer(sign).encode_utf8(&mut buf);
        self.right.push(right);
        // Every door exercises the corridor's length; a wrong answer is blamed on it.
        let next = self.signs.get(i + 1).map(|s| s.to_string());
        StepResult::taken(
            next.clone().unwrap_or_default(),
            next.is_none(),
            right,
            vec![LENGTH],
            vec![LENGTH],
        )
        .with_kind(if BORDERLINE.contains(&sign) {
            "borderline"
        } else {
            "clear"
        })
    }

    fn done(&self) -> bool {
        self.right.len() >= self.signs.len()
    }

    fn outcome(&self) -> bool {
        self.done() && self.wrong_steps() <= self.slack
    }

    fn task_key(&self) -> String {
        let digits: String = self.signs.iter().map(|s| s.to_string()).collect();
        format!("corridor:{digits}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Corridor {
        Corridor::new(5, 30, 2)
    }

    /// Plays `actions`, returning the observations.
    fn play(ep: &mut CorridorEpisode, actions: &[&str]) -> Vec<String> {
        actions.iter().map(|a| ep.step(a).observation).collect()
    }

    /// The wrong letter at every door.
    fn wrong_answers(ep: &CorridorEpisode) -> Vec<String> {
        ep.signs()
            .iter()
            .map(|&s| other(answer(s)).to_string())
            .collect()
    }

    #[test]
    fn env_is_send_sync_and_episode_is_send() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Corridor>();
        send::<CorridorEpisode>();
    }

    #[test]
    fn the_rule_by_hand() {
        let letters: String = (0..10).map(answer).collect();
        assert_eq!(letters, "LLLLLRRRRR");
    }

    #[test]
    fn length_from_difficulty_by_hand() {
        let env = env();
        // k = 5 + round(d · 25), halves away from zero.
        assert_eq!(env.length(&[0.0]), 5);
        assert_eq!(env.length(&[0.02]), 6); // 0.5 → 1
        assert_eq!(env.length(&[0.1]), 8); // 2.5 → 3
        assert_eq!(env.length(&[0.25]), 11); // 6.25 → 6
        assert_eq!(env.length(&[0.5]), 18); // 12.5 → 13
        assert_eq!(env.length(&[0.6]), 20); // 15
        assert_eq!(env.length(&[1.0]), 30);
        // Clamped, NaN and missing read as 0.
        assert_eq!(env.length(&[1.7]), 30);
        assert_eq!(env.length(&[-1.0]), 5);
        assert_eq!(env.length(&[f64::NAN]), 5);
        assert_eq!(env.length(&[]), 5);
        // One horizon per setting: every seed and split agrees.
        for seed in 0..20 {
            assert_eq!(env.sample_episode(&[0.5], Split::Train, seed).length(), 18);
            assert_eq!(env.sample_episode(&[0.5], Split::Eval, seed).length(), 18);
        }
        // A fixed length.
        let fixed = Corridor::new(7, 7, 1);
        for d in [0.0, 0.3, 1.0] {
            assert_eq!(fixed.sample_episode(&[d], Split::Train, 3).length(), 7);
        }
        let dims = env.difficulty_space();
        assert_eq!(dims.len(), 1);
        assert_eq!(
            (dims[0].name.as_str(), dims[0].lo, dims[0].hi),
            ("length", 5.0, 30.0)
        );
    }

    #[test]
    fn ood_is_one_and_a_half_times_longer() {
        let env = env();
        for (d, k, k_ood) in [(0.0, 5, 8), (0.25, 11, 17), (0.5, 18, 27), (1.0, 30, 45)] {
            assert_eq!(env.length(&[d]), k);
            assert_eq!(env.ood_length(&[d]), k_ood);
            for seed in 0..5 {
                let ep = env.sample_episode(&[d], Split::Ood, seed);
                assert_eq!(ep.length(), k_ood);
                // Same rule: the expert solves it.
                let mut ep = ep;
                let answers = ep.expert_answers();
                for a in &answers {
                    ep.step(a);
                }
                assert!(ep.done() && ep.outcome() && ep.wrong_steps() == 0);
            }
        }
    }

    #[test]
    fn noise_free_expert_solves_every_task() {
        let env = env();
        for d in [0.0, 0.1, 0.5, 0.6, 1.0] {
            for seed in [0, 1, 2, 17, 12345, u64::MAX] {
                let (prompt, steps) = env.demonstration(&[d], 0.0, seed);
                let mut ep = env.sample_episode(&[d], Split::Train, seed);
                assert_eq!(prompt, ep.prompt());
                assert_eq!(steps.len(), env.length(&[d]));
                assert_eq!(steps, ep.expert_answers());
                for (i, s) in steps.iter().enumerate() {
                    assert!(!ep.done());
                    assert!(!ep.outcome());
                    let r = ep.step(s);
                    assert_eq!(r.done, i + 1 == steps.len());
                    assert!(r.label);
                    assert_eq!(r.dims, vec![LENGTH]);
                    assert!(r.blame.is_empty());
                }
                assert!(ep.done() && ep.outcome());
            }
        }
    }

    #[test]
    fn noise_one_expert_gets_exactly_the_borderline_doors_wrong() {
        let env = env();
        for seed in 0..10 {
            let (_, steps) = env.demonstration(&[0.5], 1.0, seed);
            let mut ep = env.sample_episode(&[0.5], Split::Train, seed);
            let borderline: Vec<bool> = ep.signs().iter().map(|s| (3..=6).contains(s)).collect();
            let (right, wrong) = (ep.expert_answers(), wrong_answers(&ep));
            let mut results = Vec::new();
            for (i, s) in steps.iter().enumerate() {
                assert_eq!(s, if borderline[i] { &wrong[i] } else { &right[i] });
                results.push(ep.step(s));
            }
            let n = borderline.iter().filter(|b| **b).count();
            assert_eq!(ep.wrong_steps(), n);
            assert_eq!(results.len(), 18);
            assert!(results.iter().zip(&borderline).all(|(r, b)| r.label != *b));
            assert!(
                results
                    .iter()
                    .zip(&borderline)
                    .all(|(r, b)| (r.blame == vec![LENGTH]) == *b)
            );
            assert_eq!(ep.done() && ep.outcome(), n <= 2);
        }
    }

    #[test]
    fn noisy_expert_flips_about_noise_of_its_borderline_answers() {
        let env = env();
        let (mut flipped, mut total) = (0, 0);
        for seed in 0..200 {
            let (_, steps) = env.demonstration(&[1.0], 0.3, seed);
            let ep = env.sample_episode(&[1.0], Split::Train, seed);
            let right = ep.expert_answers();
            // Flips only at borderline doors, about 30% of them.
            for ((a, b), sign) in steps.iter().zip(&right).zip(ep.signs()) {
                if (3..=6).contains(sign) {
                    flipped += usize::from(a != b);
                    total += 1;
                } else {
                    assert_eq!(a, b);
                }
            }
            // Only letters, and flips keep the rest: a rewrite keeps the prefix of flips.
            let (_, short) = env.demonstration(&[0.0], 0.3, seed);
            assert_eq!(short[..], steps[..5]);
        }
        let rate = flipped as f64 / total as f64;
        assert!((0.27..0.33).contains(&rate), "{rate}");
    }

    #[test]
    fn exactly_slack_wrong_is_solved_and_one_more_is_not() {
        let env = env();
        for seed in 0..5 {
            let base = env.sample_episode(&[0.0], Split::Train, seed);
            let right = base.expert_answers();
            let wrong = wrong_answers(&base);
            for n_wrong in 0..=5 {
                let mut ep = base.clone();
                // Wrong at the first `n_wrong` doors... and at the last ones, too.
                for (i, (r, w)) in right.iter().zip(&wrong).enumerate() {
                    ep.step(if i < n_wrong { w } else { r });
                }
                assert_eq!(ep.wrong_steps(), n_wrong);
                assert_eq!(ep.outcome(), n_wrong <= 2, "{n_wrong}");
                let mut ep = base.clone();
                for (i, (r, w)) in right.iter().zip(&wrong).enumerate() {
                    ep.step(if i >= 5 - n_wrong { w } else { r });
                }
                assert_eq!(ep.outcome(), n_wrong <= 2, "{n_wrong}");
            }
        }
        // Slack 0: one mistake fails.
        let strict = Corridor::new(3, 3, 0);
        let mut ep = strict.sample_episode(&[0.0], Split::Train, 4);
        let mut answers = ep.expert_answers();
        answers[1] = other(answers[1].chars().next().expect("letter")).to_string();
        for a in &answers {
            ep.step(a);
        }
        assert!(ep.done() && !ep.outcome());
    }

    #[test]
    fn any_text_is_a_step_and_only_the_exact_letter_is_right() {
        let mut ep = CorridorEpisode::new(vec![2, 7, 4, 5, 0, 9, 3, 8, 1, 6, 5, 5], 2);
        let long = "L".repeat(100_000);
        // Door by door: 2 right (whitespace trimmed), 7 empty, 4 lower case, 5 right,
        // 0 garbage, 9 non-ASCII, 3 only whitespace, 8 doubled letter, 1 a 100k-character
        // line, 6 right, 5 a NUL (not whitespace), 5 right (the last door).
        let actions = [
            " L\t",
            "",
            "l",
            "R",
            "L R",
            "ünïcødé🙂",
            "\n\n",
            "RR",
            long.as_str(),
            "R",
            "\0",
            "R",
        ];
        let mut results = Vec::new();
        for (i, a) in actions.iter().enumerate() {
            assert!(!ep.done());
            results.push(ep.step(a));
            assert_eq!(results[i].done, i == 11);
        }
        let labels: Vec<bool> = results.iter().map(|r| r.label).collect();
        assert_eq!(
            labels,
            [
                true, false, false, true, false, false, false, false, false, true, false, true
            ]
        );
        assert_eq!(ep.wrong_steps(), 8);
        assert!(ep.done() && !ep.outcome());
        assert_eq!(results[1].blame, vec![LENGTH]);
        assert!(results[0].blame.is_empty());
        assert_eq!(results[1].dims, vec![LENGTH]);
        assert_eq!(results[0].dims, vec![LENGTH]);
    }

    #[test]
    fn the_episode_ends_after_exactly_k_steps_and_ignores_more() {
        let mut ep = CorridorEpisode::new(vec![3, 8, 5], 1);
        assert_eq!(ep.prompt(), "L if sign<5 else R\n3\n");
        assert!(!ep.done() && !ep.outcome());
        let step = |observation: &str, done, label, blame: &[usize], kind: &str| StepResult {
            observation: observation.into(),
            done,
            label,
            dims: vec![LENGTH],
            blame: blame.to_vec(),
            kind: kind.into(),
        };
        assert_eq!(ep.step("L"), step("8", false, true, &[], "borderline"));
        assert!(!ep.outcome());
        assert_eq!(
            ep.step("garbage"),
            step("5", false, false, &[LENGTH], "clear")
        );
        assert!(!ep.done() && !ep.outcome());
        assert_eq!(ep.step("R"), step("", true, true, &[], "borderline"));
        assert!(ep.done() && ep.outcome());
        // Actions after the end: nothing happens (no label, no dims, no blame).
        for a in ["L", "R", "", "x"] {
            assert_eq!(ep.step(a), StepResult::ended());
        }
        assert_eq!(ep.steps_taken(), 3);
        assert!(ep.outcome());
    }

    #[test]
    fn observations_and_context_length_by_hand() {
        let env = env();
        let mut ep = env.sample_episode(&[0.0], Split::Train, 9);
        let signs = ep.signs().to_vec();
        assert!(signs.iter().all(|&s| s <= 9));
        assert_eq!(ep.prompt(), format!("L if sign<5 else R\n{}\n", signs[0]));
        // The context as the policy sees it: prompt, each answer and non-empty observation
        // with a delimiter after it.
        let mut context = ep.prompt();
        for (i, a) in ep.expert_answers().iter().enumerate() {
            let r = ep.step(a);
            context.push_str(a);
            context.push('\n');
            if i + 1 < signs.len() {
                assert_eq!(r.observation, signs[i + 1].to_string());
                context.push_str(&r.observation);
                context.push('\n');
            } else {
                assert_eq!(r.observation, "");
            }
        }
        assert_eq!(context.len(), Corridor::episode_chars(5));
        assert_eq!(Corridor::episode_chars(5), 39);
        assert_eq!(Corridor::episode_chars(30), 139);
        assert_eq!(Corridor::episode_chars(45), 199);
        assert_eq!(env.max_trajectory_chars(), 199);
        assert_eq!(Corridor::new(1, 60, 0).max_trajectory_chars(), 379);
        // A hand-made corridor: the full context text.
        let mut ep = CorridorEpisode::new(vec![7, 2, 5], 0);
        let mut text = ep.prompt();
        for a in ["R", "L", "L"] {
            let obs = ep.step(a).observation;
            text.push_str(a);
            text.push('\n');
            if !obs.is_empty() {
                text.push_str(&obs);
                text.push('\n');
            }
        }
        assert_eq!(text, "L if sign<5 else R\n7\nR\n2\nL\n5\nL\n");
        assert!(ep.done() && !ep.outcome());
        let mut again = CorridorEpisode::new(vec![7, 2, 5], 1);
        assert_eq!(play(&mut again, &["R", "L", "L"]), ["2", "5", ""]);
        assert!(again.done() && again.outcome());
        let instructions = ep.instructions().expect("instructions");
        assert!(instructions.contains("answer L or R"));
        assert!(instructions.contains("3 doors"));
        assert!(instructions.len() < 800 && !instructions.contains('\n'));
    }

    #[test]
    fn sampling_is_deterministic_and_rewrites_keep_the_prefix() {
        let env = env();
        for seed in [0, 5, 99, u64::MAX] {
            for split in [Split::Train, Split::Eval, Split::Ood] {
                let a = env.sample_episode(&[0.4], split, seed);
                let b = env.sample_episode(&[0.4], split, seed);
                assert_eq!(a, b);
                assert_eq!(a.task_key(), b.task_key());
                let short = env.sample_episode(&[0.0], split, seed);
                let long = env.sample_episode(&[1.0], split, seed);
                assert_eq!(short.signs(), &long.signs()[..short.length()]);
                assert_eq!(a.signs(), &long.signs()[..a.length()]);
                assert_ne!(short.task_key(), long.task_key());
            }
        }
        // Different seeds, different tasks (30 digits colliding is out of the question).
        let tasks: std::collections::HashSet<String> = (0..50)
            .map(|s| env.sample_episode(&[1.0], Split::Train, s).task_key())
            .collect();
        assert_eq!(tasks.len(), 50);
        // The key sees the hidden doors: same first digit, same prompt, other key.
        let a = CorridorEpisode::new(vec![3, 1], 2);
        let b = CorridorEpisode::new(vec![3, 9], 2);
        assert_eq!(a.prompt(), b.prompt());
        assert_ne!(a.task_key(), b.task_key());
        assert_eq!(a.task_key(), "corridor:31");
    }

    #[test]
    fn digits_are_spread_over_all_ten_values() {
        let env = env();
        let mut counts = [0usize; 10];
        for seed in 0..200 {
            for &s in env.sample_episode(&[1.0], Split::Train, seed).signs() {
                counts[s as usize] += 1;
            }
        }
        // 6000 digits: about 600 each.
        assert!(
            counts.iter().all(|&c| (500..700).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn eval_and_ood_are_other_tasks_than_train() {
        let env = env();
        for seed in 0..20 {
            let train = env.sample_episode(&[1.0], Split::Train, seed);
            let eval = env.sample_episode(&[1.0], Split::Eval, seed);
            let ood = env.sample_episode(&[1.0], Split::Ood, seed);
            assert_ne!(train.signs(), eval.signs());
            assert_ne!(train.signs(), &ood.signs()[..30]);
            assert_ne!(eval.signs(), &ood.signs()[..30]);
        }
    }

    #[test]
    fn settings_validate_with_field_paths() {
        let ok = CorridorSpec::default();
        assert!(ok.validate().is_ok());
        assert_eq!(ok.start_difficulty(), vec![0.2]);
        let field = |spec: CorridorSpec| spec.validate().expect_err("invalid").field;
        let with = |f: fn(&mut CorridorSpec)| {
            let mut s = CorridorSpec::default();
            f(&mut s);
            s
        };
        assert_eq!(field(with(|s| s.min_length = 0)), "min_length");
        assert_eq!(field(with(|s| s.min_length = 61)), "min_length");
        assert_eq!(field(with(|s| s.max_length = 4)), "max_length");
        assert_eq!(field(with(|s| s.max_length = 61)), "max_length");
        assert_eq!(field(with(|s| s.slack = 5)), "slack");
        assert_eq!(field(with(|s| s.difficulty = vec![])), "difficulty");
        assert_eq!(field(with(|s| s.difficulty = vec![0.5, 0.5])), "difficulty");
        assert_eq!(field(with(|s| s.difficulty = vec![1.5])), "difficulty");
        assert_eq!(field(with(|s| s.difficulty = vec![f64::NAN])), "difficulty");
        assert_eq!(
            with(|s| s.max_length = 4)
                .validate()
                .expect_err("invalid")
                .message,
            "must be in min_length..=60 = 5..=60 (got 4)"
        );
        // The edges are allowed.
        for spec in [
            with(|s| {
                s.min_length = 1;
                s.max_length = 1;
                s.slack = 0;
            }),
            with(|s| {
                s.max_length = 60;
                s.slack = 4;
                s.difficulty = vec![1.0];
            }),
            with(|s| s.max_length = 5),
        ] {
            assert!(spec.validate().is_ok(), "{spec:?}");
        }
        // The settings build the environment they describe.
        let built = with(|s| {
            s.min_length = 3;
            s.max_length = 9;
        })
        .build();
        let dims = built.difficulty_space();
        assert_eq!((dims[0].lo, dims[0].hi), (3.0, 9.0));
        // Out-of-range settings are clamped by `new`.
        assert_eq!(Corridor::new(0, 100, 7).settings(), (1, 60, 0));
        assert_eq!(Corridor::new(10, 4, 3).settings(), (10, 10, 3));
    }

    #[test]
    fn settings_read_from_text_with_defaults_and_no_unknown_fields() {
        let spec: CorridorSpec =
            serde_json::from_str(r#"{"difficulty": [0.6], "max_length": 20}"#).expect("parse");
        assert_eq!(
            spec,
            CorridorSpec {
                difficulty: vec![0.6],
                min_length: 5,
                max_length: 20,
                slack: 2,
            }
        );
        assert!(serde_json::from_str::<CorridorSpec>(r#"{"lenght": 3}"#).is_err());
    }
}
