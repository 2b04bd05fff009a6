//! `codegen`: writing a program one line per step, judged by hidden tests.
//!
//! The agent writes a program in a tiny list language of our own ([`lang`], specified
//! there: `keep x>3`, `map x*2+1`, `scan +`, `let a=min`, …, `ret`) for a short
//! specification with visible input/output examples. After each line the environment runs
//! the program so far on the visible examples and shows what it does; `ret` ends the program,
//! and the outcome is whether it passes the visible *and* hidden tests.
//!
//! # Task format
//!
//! A task is a pipeline of `n` *stages* (list → list) and an optional *finisher* (list →
//! one value). The prompt is the specification (one phrase per stage, then the finisher's,
//! separated by `, `) and the visible examples, one per line:
//!
//! ```text
//! keep above 23, times 2 plus 7, pair maxes, sum
//! [31 5 60 24] -> [182]
//! [12 40 7] -> [87]
//! keep x>23                     (the expert's lines; after each, the observation:)
//! [31 60 24] [40]               ← the program so far on each visible example
//! …
//! ret
//! ```
//!
//! | stage (phrase)        | reference lines            | flawed expert's slip        |
//! |-----------------------|----------------------------|-----------------------------|
//! | `keep above k`        | `keep x>k`                 | `keep x>=k` (off by one)    |
//! | `keep below k`        | `keep x<k`                 | `keep x<=k`                 |
//! | `keep even` / `odd`   | `keep x%2==0` / `==1`      | the other parity            |
//! | `times a plus b`      | `map x*a+b`                | `map x*a-b` (wrong operator)|
//! | `add b` / `subtract b`| `map x+b` / `map x-b`      | the other sign              |
//! | `times a`             | `map x*a`                  | `map x+a`                   |
//! | `reverse`, `sort`     | `rev`, `sort`              | —                           |
//! | `first k` / `skip k`  | `take k` / `drop k`        | `k + 1` (off by one)        |
//! | `running sum/max/min` | `scan +` / `max` / `min`   | `+`→`max`, `max`↔`min`      |
//! | `pair sums/maxes/mins`| `pair +` / `max` / `min`   | `+`→`max`, `max`↔`min`      |
//! | `minus min`           | `let v=min`, `map x-v`     | `let v=max`; `map x+v`      |
//! | `minus first`         | `let v=first`, `map x-v`   | `let v=last`; `map x+v`     |
//! | `plus length`         | `let v=len`, `map x+v`     | —; `map x-v`                |
//! | `keep below max`      | `let v=max`, `keep x<v`    | `let v=min`; `keep x<=v`    |
//! | finisher `sum`/`max`/`min`/`count` | `fold +`/`fold max`/`fold min`/`count` | `+`→`max`, `max`↔`min`; — |
//!
//! The last four stages are *variable stages*: they bind a variable (`a`, `b`, … in order
//! of appearance) and use it. The reference program is the stages' lines, the finisher's
//! line, then `ret`.
//!
//! Inputs have 3–4 elements in `[0, R]`. Test outputs are computed by running the reference
//! program; the visible examples are shown as `[input] -> [output]`.
//!
//! # Difficulty space (4 dims, each clamped to `[0, 1]`, NaN → 0, missing → 0)
//!
//! Counts are rounded stochastically from their own stream (`⌊y⌋ + [u < frac(y)]`, mean
//! linear in `d`); raising a coordinate only moves a task's draws towards harder (the same
//! uniform meets a larger threshold or is scaled by a larger range). With `S = max_stages`:
//!
//! | index | name        | meaning                                                         | lo | hi |
//! |-------|-------------|-----------------------------------------------------------------|----|----|
//! | 0     | `length`    | stages `n = 1 + sround(d0 · (S − 1))`                           | 1  | S  |
//! | 1     | `magnitude` | value range `R = 9 + 90 · d1`: inputs in `[0, R]`, constants scale with `R` | 9 | 99 |
//! | 2     | `variables` | each stage is a variable stage with probability `0.5 · d2`      | 0  | 0.5 |
//! | 3     | `examples`  | visible examples `2 − sround(d3)` (fewer is harder)             | 2  | 1  |
//!
//! Constants: `keep above/below k` has `k = 1 + ⌊R · (0.2 + 0.6u)⌋`; `add`/`subtract`/`plus b`
//! has `b = 1 + ⌊u · R/3⌋`; multipliers `a ∈ {2, 3}` and `first`/`skip` counts `k ∈ {1, 2}`
//! do not depend on `R`. More stages are more lines, and so more chances to slip; longer
//! numbers are more characters to copy; a variable stage is two lines that must agree on a
//! name; fewer examples give the agent and the judge less evidence in the observations.
//!
//! # Rewrites (same seed, another difficulty)
//!
//! Every part is drawn from its own stream (`Rng::derive(seed, "codegen/<part>")`) with a
//! fixed number of draws whatever `d` is: the stage kinds (`kinds`, one uniform per position
//! up to `S`), their constants (`params`, two per position), the variable coins and kinds
//! (`vars`, two per position), the finisher (`finish`, two), the length rounding (`length`),
//! the examples rounding (`examples`) and the test inputs (`inputs`, five per test). Hence:
//!
//! - changing `length` keeps the first stages (a longer pipeline is a shorter one with stages
//!   inserted before the finisher), the finisher and the inputs;
//! - changing `magnitude` keeps every stage kind, the finisher, the input lengths and the
//!   uniforms behind every number (the numbers scale with `R`);
//! - changing `variables` keeps the length, the finisher, the inputs and every stage whose
//!   coin did not flip; raising it only turns stages into variable stages;
//! - changing `examples` changes only how many of the two drawn visible examples are shown
//!   (the hidden tests never change).
//!
//! # Splits
//!
//! `Train` draws from the seed, `Eval` from `Rng::derive(seed, "codegen/split/eval")` (the
//! same distribution, a disjoint seed space). Train and Eval never contain two *held-out
//! adjacent pairs*: a keep stage directly followed by a running fold (`keep …, running …`) and
//! a map stage (`times`/`add`/`subtract`) directly followed by a pairwise fold. `Ood`
//! (`Rng::derive(seed, "codegen/split/ood")`) has `n ≥ 2` and starts with one of those pairs
//! (1/2 each); the rest is drawn as in training. Both operators of each pair are trained, in
//! other combinations: the OOD split tests composition, as AlfWorld's unseen split does.
//! The in-domain evaluation grid is the default `[0, 0.25, 0.5, 0.75, 1]`.
//!
//! # Steps, observations, outcome
//!
//! An action is one line (surrounding whitespace ignored). A line that does not parse (see
//! [`lang::parse`]: unknown statement, syntax, too long) is rejected: it is not added to the
//! program and the observation is `error: <reason>`. A parsed line other than `ret` is
//! appended and the observation shows the program so far on every visible example, in
//! order: its list (`[6 7]`) or `error: <reason>` where the run stops. `ret` ends the
//! episode (observation `""`): the outcome is true iff the program returns the expected
//! output on all the tests (the visible examples and five hidden ones). An episode also ends
//! after [`CodegenEpisode::max_steps`] steps (reference lines + 4) without success.
//!
//! # Oracle labels, step dims, blame
//!
//! Line `i` is labelled correct iff it parsed and the program up to it can still be
//! completed correctly by the reference: some suffix of the reference program (from any of
//! its lines, `ret` included) appended to the program passes every test. This is a sound
//! under-approximation of "consistent with some correct completion" (a line that only an
//! exotic completion could rescue is labelled wrong). `ret` is correct iff the outcome is.
//!
//! Step `i`'s `dims` is structural: the dims of the reference line at the program's position
//! when step `i` was taken (`length` for lines of stage 2 onwards, `magnitude` if the line
//! has a constant ≥ 10, `variables` for the lines of a variable stage; `ret` and a
//! position past the reference: the union over the program). `examples` is never listed: it
//! changes the evidence, not the line. Step `i`'s `blame` is step `i`'s `dims` for a wrong
//! parsed line and nothing for a rejected one (a format error says nothing about difficulty).
//!
//! # Flawed expert ([`Environment::demonstration`])
//!
//! `demonstration(d, noise, seed)` writes the reference program of `sample(d, Train, seed)`
//! where each line that has a slip (table above) is replaced by it with probability `noise`
//! (one uniform per line from the `slip` stream): the realistic slips of programmers, off by
//! one at a boundary and the wrong operator. A slip the tests cannot see (`x>=k` where no
//! input equals `k`) still passes, as it would.
//!
//! # Length bounds
//!
//! The prompt is at most [`Codegen::max_prompt_chars`] characters (a test checks sampled
//! prompts against it); lines are at most [`lang::MAX_LINE_CHARS`]. An observation shows at
//! most 2 lists of at most 4 values, or errors. The reference has at most `2S + 2` lines;
//! with the default `S = 3`, 99% of the expert's trajectories (prompt, lines, observations,
//! one delimiter after each) have at most 270 characters at every level of the eval grid and
//! on the OOD split (a test checks it), so a character-level model with `max_seq_len` 288
//! holds them.

pub mod lang;

use crate::draw;
use lang::{FoldOp, Stmt};
use rlany_contract::check::{self, Checked};
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Rng, Split, StepResult};
use serde::{Deserialize, Serialize};

/// Index of the `length` dimension.
pub const LENGTH: usize = 0;
/// Index of the `magnitude` dimension.
pub const MAGNITUDE: usize = 1;
/// Index of the `variables` dimension.
pub const VARIABLES: usize = 2;
/// Index of the `examples` dimension.
pub const EXAMPLES: usize = 3;
/// The value range `R` at `magnitude = 0` and `1`.
const RANGE: (f64, f64) = (9.0, 99.0);
/// The largest probability of a variable stage (at `variables = 1`).
const MAX_VAR_RATE: f64 = 0.5;
/// Visible examples at `examples = 0` (at 1: one).
const MAX_VISIBLE: usize = 2;
/// Hidden tests per task.
const HIDDEN: usize = 5;
/// Input lengths.
const INPUT_LEN: (usize, usize) = (3, 4);
/// Allowed `max_stages`.
const STAGES_RANGE: (usize, usize) = (1, 6);
/// Steps beyond the reference's lines before an episode ends.
const STEP_SLACK: usize = 4;

/// The `codegen` settings of an experiment file:
/// `environment: Codegen(max_stages: 3, difficulty: [0.2, 0.2, 0.2, 0.2])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodegenSpec {
    /// Most pipeline stages of a task (at `length = 1`), in `1..=6` (default 3).
    pub max_stages: usize,
    /// Starting difficulty of every task slot, one value in `[0, 1]` per dimension
    /// (`length`, `magnitude`, `variables`, `examples`).
    pub difficulty: Vec<f64>,
}

impl Default for CodegenSpec {
    fn default() -> Self {
        Self {
            max_stages: 3,
            difficulty: vec![0.2; 4],
        }
    }
}

impl EnvironmentPlugin for CodegenSpec {
    fn validate(&self) -> Checked {
        check::count(
            "max_stages",
            self.max_stages,
            STAGES_RANGE.0,
            STAGES_RANGE.1,
        )?;
        check::difficulty(
            "difficulty",
            &self.difficulty,
            &["length", "magnitude", "variables", "examples"],
        )
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(Codegen::new(self.max_stages))
    }
}

/// A pipeline stage (see the module docs' table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    KeepAbove(i64),
    KeepBelow(i64),
    KeepEven,
    KeepOdd,
    Affine(i64, i64),
    Add(i64),
    Subtract(i64),
    Times(i64),
    Reverse,
    Sort,
    First(i64),
    Skip(i64),
    Running(FoldOp),
    Pairwise(FoldOp),
    MinusMin,
    MinusFirst,
    PlusLength,
    BelowMax,
}

/// The classes the held-out pairs are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Keep,
    Map,
    Scan,
    Pair,
    Other,
}

/// Number of plain (non-variable) stage kinds.
const PLAIN_KINDS: usize = 14;
/// Number of variable stage kinds.
const VAR_KINDS: usize = 4;

impl Stage {
    fn class(self) -> Class {
        match self {
            Self::KeepAbove(_) | Self::KeepBelow(_) | Self::KeepEven | Self::KeepOdd => Class::Keep,
            Self::Affine(..) | Self::Add(_) | Self::Subtract(_) | Self::Times(_) => Class::Map,
            Self::Running(_) => Class::Scan,
            Self::Pairwise(_) => Class::Pair,
            _ => Class::Other,
        }
    }

    fn is_var(self) -> bool {
        matches!(
            self,
            Self::MinusMin | Self::MinusFirst | Self::PlusLength | Self::BelowMax
        )
    }

    /// Plain kind `kind` (`< PLAIN_KINDS`) with its numbers from the uniforms `u`, `w` and
    /// the value range `r`.
    fn plain(kind: usize, u: f64, w: f64, r: f64) -> Self {
        let keep_k = 1 + (r * (0.2 + 0.6 * u)).floor() as i64;
        let add_b = 1 + (u * r / 3.0).floor() as i64;
        let mult = 2 + (w * 2.0).floor() as i64;
        let count = 1 + (u * 2.0).floor() as i64;
        let fold = [FoldOp::Add, FoldOp::Max, FoldOp::Min][((w * 3.0) as usize).min(2)];
        match kind {
            0 => Self::KeepAbove(keep_k),
            1 => Self::KeepBelow(keep_k),
            2 => Self::KeepEven,
            3 => Self::KeepOdd,
            4 => Self::Affine(mult, add_b),
            5 => Self::Add(add_b),
            6 => Self::Subtract(add_b),
            7 => Self::Times(mult),
            8 => Self::Reverse,
            9 => Self::Sort,
            10 => Self::First(count),
            11 => Self::Skip(count),
            12 => Self::Running(fold),
            _ => Self::Pairwise(fold),
        }
    }

    fn variable(kind: usize) -> Self {
        [
            Self::MinusMin,
            Self::MinusFirst,
            Self::PlusLength,
            Self::BelowMax,
        ][kind.min(3)]
    }

    fn phrase(self) -> String {
        let fold = |f: FoldOp, sum: &str, max: &str, min: &str| match f {
            FoldOp::Max => max.to_string(),
            FoldOp::Min => min.to_string(),
            _ => sum.to_string(),
        };
        match self {
            Self::KeepAbove(k) => format!("keep above {k}"),
            Self::KeepBelow(k) => format!("keep below {k}"),
            Self::KeepEven => "keep even".into(),
            Self::KeepOdd => "keep odd".into(),
            Self::Affine(a, b) => format!("times {a} plus {b}"),
            Self::Add(b) => format!("add {b}"),
            Self::Subtract(b) => format!("subtract {b}"),
            Self::Times(a) => format!("times {a}"),
            Self::Reverse => "reverse".into(),
            Self::Sort => "sort".into(),
            Self::First(k) => format!("first {k}"),
            Self::Skip(k) => format!("skip {k}"),
            Self::Running(f) => fold(f, "running sum", "running max", "running min"),
            Self::Pairwise(f) => fold(f, "pair sums", "pair maxes", "pair mins"),
            Self::MinusMin => "minus min".into(),
            Self::MinusFirst => "minus first".into(),
            Self::PlusLength => "plus length".into(),
            Self::BelowMax => "keep below max".into(),
        }
    }

    /// The reference lines with their slips; `v` names the stage's variable.
    fn lines(self, v: char) -> Vec<(String, Option<String>)> {
        let slip_fold = |f: FoldOp| match f {
            FoldOp::Max => FoldOp::Min,
            _ => FoldOp::Max,
        };
        let one = |a: String, b: Option<String>| vec![(a, b)];
        match self {
            Self::KeepAbove(k) => one(format!("keep x>{k}"), Some(format!("keep x>={k}"))),
            Self::KeepBelow(k) => one(format!("keep x<{k}"), Some(format!("keep x<={k}"))),
            Self::KeepEven => one("keep x%2==0".into(), Some("keep x%2==1".into())),
            Self::KeepOdd => one("keep x%2==1".into(), Some("keep x%2==0".into())),
            Self::Affine(a, b) => one(format!("map x*{a}+{b}"), Some(format!("map x*{a}-{b}"))),
            Self::Add(b) => one(format!("map x+{b}"), Some(format!("map x-{b}"))),
            Self::Subtract(b) => one(format!("map x-{b}"), Some(format!("map x+{b}"))),
            Self::Times(a) => one(format!("map x*{a}"), Some(format!("map x+{a}"))),
            Self::Reverse => one("rev".into(), None),
            Self::Sort => one("sort".into(), None),
            Self::First(k) => one(format!("take {k}"), Some(format!("take {}", k + 1))),
            Self::Skip(k) => one(format!("drop {k}"), Some(format!("drop {}", k + 1))),
            Self::Running(f) => one(
                format!("scan {}", f.symbol()),
                Some(format!("scan {}", slip_fold(f).symbol())),
            ),
            Self::Pairwise(f) => one(
                format!("pair {}", f.symbol()),
                Some(format!("pair {}", slip_fold(f).symbol())),
            ),
            Self::MinusMin => vec![
                (format!("let {v}=min"), Some(format!("let {v}=max"))),
                (format!("map x-{v}"), Some(format!("map x+{v}"))),
            ],
            Self::MinusFirst => vec![
                (format!("let {v}=first"), Some(format!("let {v}=last"))),
                (format!("map x-{v}"), Some(format!("map x+{v}"))),
            ],
            Self::PlusLength => vec![
                (format!("let {v}=len"), None),
                (format!("map x+{v}"), Some(format!("map x-{v}"))),
            ],
            Self::BelowMax => vec![
                (format!("let {v}=max"), Some(format!("let {v}=min"))),
                (format!("keep x<{v}"), Some(format!("keep x<={v}"))),
            ],
        }
    }

    /// Whether the stage writes a constant ≥ 10.
    fn big_constant(self) -> bool {
        match self {
            Self::KeepAbove(k) | Self::KeepBelow(k) | Self::Add(k) | Self::Subtract(k) => k >= 10,
            Self::Affine(a, b) => a >= 10 || b >= 10,
            _ => false,
        }
    }
}

/// The optional last stage (list → one value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finisher {
    Sum,
    Max,
    Min,
    Count,
}

impl Finisher {
    fn phrase(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Max => "max",
            Self::Min => "min",
            Self::Count => "count",
        }
    }

    fn line(self) -> (String, Option<String>) {
        let (l, s) = match self {
            Self::Sum => ("fold +", Some("fold max")),
            Self::Max => ("fold max", Some("fold min")),
            Self::Min => ("fold min", Some("fold max")),
            Self::Count => ("count", None),
        };
        (l.to_string(), s.map(str::to_string))
    }
}

/// One drawn task, before it becomes an episode.
#[derive(Debug, Clone, PartialEq)]
struct Task {
    stages: Vec<Stage>,
    finisher: Option<Finisher>,
    /// Visible examples `(input, output)`.
    visible: Vec<(Vec<i64>, Vec<i64>)>,
    /// Hidden tests.
    hidden: Vec<(Vec<i64>, Vec<i64>)>,
    /// Reference lines (`ret` last) with their slips.
    lines: Vec<(String, Option<String>)>,
    /// The dims each reference line exercises.
    dims: Vec<Vec<usize>>,
    /// The reference lines parsed (`ret` included).
    reference: Vec<Stmt>,
}

impl Task {
    fn spec(&self) -> String {
        let mut phrases: Vec<String> = self.stages.iter().map(|s| s.phrase()).collect();
        if let Some(f) = self.finisher {
            phrases.push(f.phrase().to_string());
        }
        phrases.join(", ")
    }

    fn prompt(&self) -> String {
        let mut p = self.spec();
        p.push('\n');
        for (input, output) in &self.visible {
            p.push_str(&format!(
                "{} -> {}\n",
                lang::show(input),
                lang::show(output)
            ));
        }
        p
    }
}

/// The `codegen` environment (see the module docs).
#[derive(Debug, Clone)]
pub struct Codegen {
    max_stages: usize,
}

impl Codegen {
    /// A new environment; `max_stages` is clamped into `1..=6`.
    pub fn new(max_stages: usize) -> Self {
        Self {
            max_stages: max_stages.clamp(STAGES_RANGE.0, STAGES_RANGE.1),
        }
    }

    /// The (clamped) most stages of a Train/Eval task.
    pub fn max_stages(&self) -> usize {
        self.max_stages
    }

    /// Like [`Environment::sample`], but returns the concrete episode type.
    pub fn sample_episode(&self, d: &[f64], split: Split, seed: u64) -> CodegenEpisode {
        CodegenEpisode::new(self.draw(d, split, seed))
    }

    /// An upper bound on the prompt's characters, OOD included (see the module docs).
    pub fn max_prompt_chars(&self) -> usize {
        // The longest phrase is `times 3 plus 34` / `keep below max` (15 characters).
        let spec = (self.max_stages + 1) * (15 + 2);
        // Values: inputs ≤ 99; a stage at most multiplies a magnitude by 5 and adds 34
        // (a running sum of five values, `times 3 plus 34`, `minus min` doubles it), and a
        // sum finisher multiplies it by 5.
        let mut v: u64 = 99;
        for _ in 0..self.max_stages {
            v = v * 5 + 34;
        }
        let value_chars = (v * 5).to_string().len() + 1;
        let example = 1 + INPUT_LEN.1 * 3 + 5 + INPUT_LEN.1 * (value_chars + 1) + 2;
        spec + MAX_VISIBLE * example
    }

    /// The value range `R` for a clamped `magnitude`.
    fn range(d1: f64) -> f64 {
        RANGE.0 + (RANGE.1 - RANGE.0) * d1
    }

    fn draw(&self, d: &[f64], split: Split, seed: u64) -> Task {
        let coord = |i: usize| draw::coord(d, i);
        let base = match split {
            Split::Train => seed,
            Split::Eval => Rng::derive(seed, "codegen/split/eval").next_u64(),
            Split::Ood => Rng::derive(seed, "codegen/split/ood").next_u64(),
        };
        let s = self.max_stages;
        let r = Self::range(coord(MAGNITUDE));
        let mut n = 1 + draw::stochastic_round(
            coord(LENGTH) * (s - 1) as f64,
            Rng::derive(base, "codegen/length").uniform(),
        );
        // The plain kinds, each avoiding a held-out pair with the one before.
        let mut kind_rng = Rng::derive(base, "codegen/kinds");
        let mut param_rng = Rng::derive(base, "codegen/params");
        let mut var_rng = Rng::derive(base, "codegen/vars");
        let ood_pair = (split == Split::Ood).then(|| {
            n = n.max(2);
            Rng::derive(base, "codegen/ood").bernoulli(0.5)
        });
        let var_rate = coord(VARIABLES) * MAX_VAR_RATE;
        let mut stages = Vec::with_capacity(s.max(2));
        let mut prev: Option<Stage> = None;
        for i in 0..s.max(2) {
            let (u, pu, pw) = (kind_rng.uniform(), param_rng.uniform(), param_rng.uniform());
            let (coin, vk) = (var_rng.uniform(), var_rng.uniform());
            let candidates: Vec<usize> = match (ood_pair, i) {
                // OOD: keep then running, or map then pairwise.
                (Some(true), 0) => (0..4).collect(),
                (Some(true), 1) => vec![12],
                (Some(false), 0) => (4..8).collect(),
                (Some(false), 1) => vec![13],
                _ => (0..PLAIN_KINDS)
                    .filter(|&k| {
                        let next = Stage::plain(k, 0.0, 0.0, r).class();
                        !prev.is_some_and(|p| held_out(p.class(), next))
                    })
                    .collect(),
            };
            let kind =
                candidates[((u * candidates.len() as f64) as usize).min(candidates.len() - 1)];
            let plain = Stage::plain(kind, pu, pw, r);
            prev = Some(plain);
            let forced = ood_pair.is_some() && i < 2;
            stages.push(if !forced && coin < var_rate {
                Stage::variable((vk * VAR_KINDS as f64) as usize)
            } else {
                plain
            });
        }
        stages.truncate(n);
        let mut finish_rng = Rng::derive(base, "codegen/finish");
        let (has, which) = (finish_rng.uniform(), finish_rng.uniform());
        let finisher = (has < 0.5).then(|| {
            [Finisher::Sum, Finisher::Max, Finisher::Min, Finisher::Count]
                [((which * 4.0) as usize).min(3)]
        });
        let visible = MAX_VISIBLE
            - draw::stochastic_round(
                coord(EXAMPLES) * (MAX_VISIBLE - 1) as f64,
                Rng::derive(base, "codegen/examples").uniform(),
            );

        // Reference lines and the dims each exercises.
        let mut lines = Vec::new();
        let mut dims = Vec::new();
        let mut var = b'a';
        for (i, st) in stages.iter().enumerate() {
            let v = var as char;
            if st.is_var() {
                var += 1;
            }
            for line in st.lines(v) {
                let mut d = Vec::new();
                if i >= 1 {
                    d.push(LENGTH);
                }
                if st.big_constant() {
                    d.push(MAGNITUDE);
                }
                if st.is_var() {
                    d.push(VARIABLES);
                }
                lines.push(line);
                dims.push(d);
            }
        }
        if let Some(f) = finisher {
            lines.push(f.line());
            dims.push(Vec::new());
        }
        lines.push(("ret".to_string(), None));
        let all = normalised(dims.concat());
        dims.push(all);

        // Tests: inputs drawn with a fixed number of uniforms each; outputs by the reference.
        let reference: Vec<Stmt> = lines
            .iter()
            .filter_map(|(l, _)| lang::parse(l).ok())
            .collect();
        let mut input_rng = Rng::derive(base, "codegen/inputs");
        let mut tests: Vec<(Vec<i64>, Vec<i64>)> = (0..MAX_VISIBLE + HIDDEN)
            .map(|_| {
                let span = (INPUT_LEN.1 - INPUT_LEN.0 + 1) as f64;
                let len = INPUT_LEN.0
                    + ((input_rng.uniform() * span) as usize).min(INPUT_LEN.1 - INPUT_LEN.0);
                let values: Vec<i64> = (0..INPUT_LEN.1)
                    .map(|_| (input_rng.uniform() * (r.floor() + 1.0)).floor() as i64)
                    .collect();
                let input = values[..len].to_vec();
                let output = lang::run(&reference, &input).unwrap_or_default();
                (input, output)
            })
            .collect();
        let hidden = tests.split_off(MAX_VISIBLE);
        tests.truncate(visible);
        Task {
            stages,
            finisher,
            visible: tests,
            hidden,
            lines,
            dims,
            reference,
        }
    }
}

/// Whether `a` directly followed by `b` is a held-out pair (OOD only).
fn held_out(a: Class, b: Class) -> bool {
    matches!(
        (a, b),
        (Class::Keep, Class::Scan) | (Class::Map, Class::Pair)
    )
}

fn normalised(mut dims: Vec<usize>) -> Vec<usize> {
    dims.sort_unstable();
    dims.dedup();
    dims
}

impl Environment for Codegen {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![
            Dim::new("length", 1.0, self.max_stages as f64),
            Dim::new("magnitude", RANGE.0, RANGE.1),
            Dim::new("variables", 0.0, MAX_VAR_RATE),
            Dim::new("examples", MAX_VISIBLE as f64, 1.0),
        ]
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.sample_episode(d, split, seed))
    }

    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let task = self.draw(d, Split::Train, seed);
        let noise = if noise.is_nan() { 0.0 } else { noise };
        let mut slips = Rng::derive(seed, "codegen/slip");
        let steps = task
            .lines
            .iter()
            .map(|(line, slip)| {
                let u = slips.uniform();
                match slip {
                    Some(s) if u < noise => s.clone(),
                    _ => line.clone(),
                }
            })
            .collect();
        (task.prompt(), steps)
    }
}

/// What the episode remembers of one step.
#[derive(Debug, Clone)]
struct StepRecord {
    /// The oracle label.
    label: bool,
    /// The line parsed (was appended, or was `ret`).
    parsed: bool,
    /// The program's length (reference position) when the step was taken.
    pos: usize,
}

/// One `codegen` task being played (see the module docs).
#[derive(Debug, Clone)]
pub struct CodegenEpisode {
    task: Task,
    prompt: String,
    /// The agent's program so far (parsed lines, `ret` excluded).
    program: Vec<Stmt>,
    steps: Vec<StepRecord>,
    returned: bool,
    passed: bool,
    done: bool,
}

impl CodegenEpisode {
    fn new(task: Task) -> Self {
        Self {
            prompt: task.prompt(),
            task,
            program: Vec::new(),
            steps: Vec::new(),
            returned: false,
            passed: false,
            done: false,
        }
    }

    /// The step budget: the reference's lines + 4.
    pub fn max_steps(&self) -> usize {
        self.task.lines.len() + STEP_SLACK
    }

    /// Number of steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.steps.len()
    }

    /// The reference program's lines, `ret` last.
    pub fn reference_lines(&self) -> Vec<String> {
        self.task.lines.iter().map(|(l, _)| l.clone()).collect()
    }

    /// Every test `(input, expected output)`: the visible examples, then the hidden tests.
    fn tests(&self) -> impl Iterator<Item = &(Vec<i64>, Vec<i64>)> {
        self.task.visible.iter().chain(&self.task.hidden)
    }

    fn passes(&self, program: &[Stmt]) -> bool {
        self.tests()
            .all(|(input, output)| lang::run(program, input).as_ref() == Ok(output))
    }

    /// Whether some suffix of the reference completes the program correctly.
    fn completable(&self) -> bool {
        let mut candidate = self.program.clone();
        let base = candidate.len();
        let reference = &self.task.reference;
        (0..reference.len()).any(|j| {
            candidate.truncate(base);
            candidate.extend_from_slice(&reference[j..]);
            self.passes(&candidate)
        })
    }

    fn show_run(&self) -> String {
        let shown: Vec<String> = self
            .task
            .visible
            .iter()
            .map(|(input, _)| match lang::run(&self.program, input) {
                Ok(xs) => lang::show(&xs),
                Err(e) => format!("error: {e}"),
            })
            .collect();
        shown.join(" ")
    }
}

/// What a pretrained chat model is told before the task (see [`Episode::instructions`]).
const INSTRUCTIONS: &str = "Write a program in a small list language that turns each input list below into its \
output, one statement per message. Statements: `keep COND` (e.g. `keep x>3`, \
`keep x%2==0`), `map EXPR` (e.g. `map x*2+1`), `rev`, `sort`, `take K`, `drop K`, \
`scan +|max|min` (running), `pair +|max|min` (adjacent pairs), `let NAME=min|max|first|\
last|len` (then use NAME in an expression), `fold +|max|min`, `count`, and `ret` to finish. \
After each statement I show what the program so far gives on each example.";

impl CodegenEpisode {
    fn label_of(&self, i: usize) -> bool {
        self.steps.get(i).is_some_and(|s| s.label)
    }

    fn dims_of(&self, i: usize) -> Vec<usize> {
        let Some(s) = self.steps.get(i) else {
            return Vec::new();
        };
        let last = self.task.dims.len() - 1;
        self.task.dims[s.pos.min(last)].clone()
    }

    fn blame_of(&self, i: usize) -> Vec<usize> {
        match self.steps.get(i) {
            Some(s) if s.parsed && !s.label => self.dims_of(i),
            _ => Vec::new(),
        }
    }
}

impl Episode for CodegenEpisode {
    fn prompt(&self) -> String {
        self.prompt.clone()
    }

    fn instructions(&self) -> Option<String> {
        Some(INSTRUCTIONS.to_string())
    }

    fn step(&mut self, action: &str) -> StepResult {
        if self.done {
            return StepResult::ended();
        }
        let pos = self.program.len();
        let (record, observation) = match lang::parse(action) {
            Err(e) => (
                StepRecord {
                    label: false,
                    parsed: false,
                    pos,
                },
                format!("error: {e}"),
            ),
            Ok(stmt) if stmt.is_ret() => {
                self.returned = true;
                self.passed = self.passes(&self.program);
                self.done = true;
                (
                    StepRecord {
                        label: self.passed,
                        parsed: true,
                        pos,
                    },
                    String::new(),
                )
            }
            Ok(stmt) => {
                self.program.push(stmt);
                let label = self.completable();
                (
                    StepRecord {
                        label,
                        parsed: true,
                        pos,
                    },
                    self.show_run(),
                )
            }
        };
        self.steps.push(record);
        if self.steps.len() >= self.max_steps() {
            self.done = true;
        }
        let i = self.steps.len() - 1;
        StepResult::taken(
            observation,
            self.done,
            self.label_of(i),
            self.dims_of(i),
            self.blame_of(i),
        )
    }

    fn done(&self) -> bool {
        self.done
    }

    fn outcome(&self) -> bool {
        self.returned && self.passed
    }

    fn task_key(&self) -> String {
        let hidden: Vec<String> = self
            .task
            .hidden
            .iter()
            .map(|(i, o)| format!("{}{}", lang::show(i), lang::show(o)))
            .collect();
        format!("{}|{}", self.prompt, hidden.join(""))
    }
}

#[cfg(test)]
mod tests;
