//! `countdown`: count down from `n` to 0, one number a line — an environment written in a
//! crate of its own, against the environment contract alone (`rlany-contract`: no Burn).
//!
//! The task's prompt is `count down from 12`; the policy answers `11`, `10`, …, `0`, one
//! line a step, and sees nothing in between (an empty observation). A step is right iff its
//! line is the next number; the task is solved iff every step is right.
//!
//! # Difficulty (1 dimension)
//! `start`: `n = min_start + round(d · (max_start − min_start))`.
//!
//! # The flawed expert
//! It skips the sevens: where the next number ends in 7 it writes the one below it, with
//! probability `noise`. The slip is systematic — always the same situation, always the same
//! wrong answer — so at `noise > 0.5` the warm-started policy's greedy answer there is wrong
//! too, and the greedy evaluation starts mid-range (tasks without a 7 solved, tasks with one
//! failed). Random slips at every step would average away under greedy decoding, and the
//! greedy evaluation would start at 1.0, leaving nothing to learn.

use rlany_contract::check::{self, Checked, FieldError};
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Rng, Split, StepResult};
use serde::{Deserialize, Serialize};

/// `environment: Countdown(difficulty: [0.5], min_start: 3, max_start: 20)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CountdownSpec {
    /// Starting difficulty of every task slot: one value in `[0, 1]` (`start`).
    pub difficulty: Vec<f64>,
    /// The number counted down from at difficulty 0; at least 1.
    pub min_start: usize,
    /// The number counted down from at difficulty 1; in `min_start..=99`.
    pub max_start: usize,
}

impl Default for CountdownSpec {
    fn default() -> Self {
        Self {
            difficulty: vec![0.5],
            min_start: 3,
            max_start: 20,
        }
    }
}

impl EnvironmentPlugin for CountdownSpec {
    fn validate(&self) -> Checked {
        check::count("min_start", self.min_start, 1, 99)?;
        if self.max_start < self.min_start || self.max_start > 99 {
            return Err(FieldError::new(
                "max_start",
                format!(
                    "must be in min_start..=99 = {}..=99 (got {})",
                    self.min_start, self.max_start
                ),
            ));
        }
        check::difficulty("difficulty", &self.difficulty, &["start"])
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(Countdown {
            min_start: self.min_start,
            max_start: self.max_start,
        })
    }
}

/// The environment.
#[derive(Debug, Clone)]
pub struct Countdown {
    min_start: usize,
    max_start: usize,
}

impl Countdown {
    /// The number a task of difficulty `d` counts down from (OOD tasks: 1.5 times as far).
    fn start(&self, d: &[f64], split: Split) -> usize {
        let d = d.first().copied().unwrap_or(0.0);
        let d = if d.is_nan() { 0.0 } else { d.clamp(0.0, 1.0) };
        let span = (self.max_start - self.min_start) as f64;
        let n = self.min_start + (d * span).round() as usize;
        match split {
            Split::Ood => (n * 3).div_ceil(2),
            _ => n,
        }
    }
}

impl Environment for Countdown {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![Dim::new(
            "start",
            self.min_start as f64,
            self.max_start as f64,
        )]
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        // The task is its number; the seed only picks among the same difficulty's neighbours
        // so that two seeds give two tasks (and eval/OOD others than train).
        let n = self.start(d, split);
        let shift = Rng::derive(seed, &format!("countdown/{split:?}")).below(3);
        Box::new(CountdownEpisode::new(n + shift))
    }

    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let ep = self.sample(d, Split::Train, seed);
        let n = ep.task_key().parse::<usize>().unwrap_or(0);
        let mut slips = Rng::derive(seed, "countdown/slips");
        let steps = (0..n)
            .rev()
            .map(|k| {
                // Drawn at every step, so a slip never shifts the later draws.
                let slip = slips.uniform() < noise;
                if k % 10 == 7 && slip { k - 1 } else { k }.to_string()
            })
            .collect();
        (ep.prompt(), steps)
    }
}

/// One task: the numbers still to say.
#[derive(Debug, Clone)]
pub struct CountdownEpisode {
    from: usize,
    said: Vec<bool>,
}

impl CountdownEpisode {
    fn new(from: usize) -> Self {
        Self {
            from,
            said: Vec::new(),
        }
    }
}

impl Episode for CountdownEpisode {
    fn prompt(&self) -> String {
        format!("count down from {}\n", self.from)
    }

    fn step(&mut self, action: &str) -> StepResult {
        if self.done() {
            return StepResult::ended();
        }
        let want = self.from - 1 - self.said.len();
        let right = action.trim() == want.to_string();
        self.said.push(right);
        let kind = if want % 10 == 7 { "seven" } else { "other" };
        StepResult::taken(String::new(), self.done(), right, vec![0], vec![0]).with_kind(kind)
    }

    fn done(&self) -> bool {
        self.said.len() >= self.from
    }

    fn outcome(&self) -> bool {
        self.done() && self.said.iter().all(|&r| r)
    }

    fn task_key(&self) -> String {
        self.from.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The environment keeps the contract every environment keeps (the same checks as
    /// `countdown env countdown --check`).
    #[test]
    fn countdown_keeps_the_contract() {
        rlany_contract::conformance::assert_conforms(CountdownSpec::default().build().as_ref());
    }

    #[test]
    fn a_task_counts_down_and_the_expert_skips_sevens() {
        let env = CountdownSpec::default().build();
        // Difficulty 1: from 20 (+ 0–2 by seed), so the task passes 17 and 7.
        let (_, steps) = env.demonstration(&[1.0], 1.0, 1);
        let mut ep = env.sample(&[1.0], Split::Train, 1);
        let n = steps.len();
        assert!(n >= 20, "{n}");
        for (i, s) in steps.iter().enumerate() {
            let want = n - 1 - i;
            // At noise 1 every seven is written as the number below it, and labelled wrong.
            let seven = want % 10 == 7;
            assert_eq!(*s, if seven { want - 1 } else { want }.to_string());
            assert_eq!(ep.step(s).label, !seven, "step {i}: {s}");
        }
        assert!(ep.done() && !ep.outcome());
        // The noise-free expert solves it.
        let (_, right) = env.demonstration(&[1.0], 0.0, 1);
        let mut ep = env.sample(&[1.0], Split::Train, 1);
        right.iter().for_each(|s| assert!(ep.step(s).label));
        assert!(ep.outcome());
    }
}
