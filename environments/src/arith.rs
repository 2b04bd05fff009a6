//! `arith`: long arithmetic chains, one line per step, with a sparse outcome.
//!
//! # Task format
//!
//! A task is a chain of `n` non-negative operands and `n − 1` operators from `{+, -}`,
//! evaluated strictly left to right. The prompt is the chain without spaces followed by
//! `'\n'`, e.g. `"47+5-8+36\n"`. The expert writes one line per operator,
//! `<running><op><operand>=<result>`, then the answer line `A:<value>`; after every line that
//! does not end the episode the environment answers with an observation (see below):
//!
//! ```text
//! 47+5-8+36     (prompt)
//! 47+5=52
//! >-8           (observation)
//! 52-8=44
//! >+36
//! 44+36=80
//! >A
//! A:80
//! ```
//!
//! so an `n`-operand task takes the expert exactly `n` steps. The outcome is sparse: only the
//! answer line decides it. An episode ends at the answer line or after
//! [`ArithEpisode::max_steps`] `= 2n + 2` steps. Actions are trimmed of surrounding
//! whitespace, and the unambiguous spaced forms a chat model writes are accepted too:
//! `52 - 8 = 44` (spaces or tabs around the operator and `=`, never inside a number) and
//! `A: 80`; an action longer than [`Arith::max_action_chars`] is a wasted step, and so is
//! any line that does not parse (garbage, however long, never panics).
//!
//! # Difficulty space (3 dims, each clamped to `[0, 1]`, NaN → 0, missing → 0)
//!
//! Every dimension is continuous and monotone: a count is rounded *stochastically* from its
//! own stream (`⌊x⌋ + [u < frac(x)]`, so its mean is linear in `d`), and raising a
//! coordinate only ever moves a task's draws towards harder (the same uniform `u` is compared
//! with a larger threshold). With `M = max_operands`, `D = max_digits`:
//!
//! | index | name        | meaning (environment units)                             | lo  | hi   |
//! |-------|-------------|---------------------------------------------------------|-----|------|
//! | 0     | `operands`  | chain length `n = 2 + sround(d0 · (M − 2))`, mean `2 + d0·(M − 2)` | 2 | `M` |
//! | 1     | `magnitude` | digits per operand `k = 1 + sround(d1 · (D − 1))`, mean `1 + d1·(D − 1)` | 1 | `D` |
//! | 2     | `carries`   | per-column probability `p = d2 · 0.5` that a line needs a carry/borrow there | 0 | 0.5 |
//!
//! - **operands**: one uniform from the `length` stream decides the rounding.
//! - **magnitude**: each operand rounds its digit count with its own uniform (the `sizes`
//!   stream, one per operand). The *first* operand has one digit more (`k + 1`), so the
//!   running value has at least two digits from the start and a subtraction can borrow even
//!   with one-digit operands; `longer_first: false` draws it like the others (a chain of
//!   one-digit numbers at `D = 1`, for a pretrained model that cannot yet add two-digit
//!   numbers). With `D = 1` this dimension does nothing.
//! - **carries**: the columns of a line are counted the way the flawed expert slips (see
//!   "Flawed expert" below): column `c` of `a + b` *carries* iff `a_c + b_c ≥ 10` (digits,
//!   without the incoming carry), column `c` of `a − b` *borrows* iff `a_c < b_c`; a line *needs a
//!   carry/borrow* iff some column does, which is exactly when the slip changes its result.
//!   Every (line, column) has a coin, true with probability `p` (the `carries` stream, `D`
//!   uniforms per line), and the operand's digits are built from the lowest column up so that
//!   each of its `k` columns carries iff its coin says so, the digit uniform among the digits
//!   that do so given the running value's digit (the `digits` stream, `D + 1` uniforms per
//!   operand). Where no digit can (a carry over a `0` digit, a borrow under a `9`, a borrow
//!   in the top column when the running value has no more digits than the operand, which
//!   would go negative) the column does not carry: realised carries are a subset of the
//!   coins, so at `carries = 0` no line ever needs a carry or borrow. More digits mean more
//!   columns, hence more coins: `magnitude` is monotone for the flawed expert too. At
//!   `carries = 1` (`p = 0.5`) a column carries about as often as with uniformly random
//!   digits (0.45); larger `p` would let the flawed expert's opposite slips cancel so often
//!   that its success rate stopped falling.
//!
//! A 0.1 move therefore changes, in expectation: `n` for a fraction `0.1·(M − 2)` of the seeds
//! (every seed once `M ≥ 12`); each operand's digit count with probability `0.1·(D − 1)`;
//! each (line, column) coin with probability 0.05.
//!
//! An operand's top digit is non-zero where the allowed digits include one (else the operand
//! has fewer digits). A subtraction never takes the running value below 0: its operand has at
//! most as many digits as the running value and, if it still exceeds it, its top digit is
//! lowered by one (which cannot add a borrow). Operators are `+` or `-` with probability
//! 1/2 each (the `ops` stream, one uniform per line); they are not a difficulty dimension.
//!
//! # Rewrites (same seed, another difficulty)
//!
//! Each part of a task is drawn from its own stream derived from the seed
//! (`Rng::derive(seed, "arith/<part>")`) with a fixed number of draws per chain position,
//! independent of the difficulty. Hence:
//!
//! - changing `operands` keeps the chain's prefix: the longer chain is the shorter one with
//!   operands appended (same first operators, operands and lines); raising `d0` only
//!   lengthens it;
//! - changing `carries` keeps the length, the operators and the drawn digit counts; raising
//!   `d2` only turns coins from "no carry" to "carry", never back. Operand values change where
//!   a coin changed and, through the running value, after it;
//! - changing `magnitude` keeps the length, the operators and every (line, column) coin (the
//!   columns it adds bring coins that were already drawn); raising `d1` only adds digits.
//!   Operand values change (the digit uniforms are kept but land in other ranges), so where
//!   the running value makes a coin infeasible the realised pattern can differ.
//!
//! # Splits
//!
//! `Train` draws from the seed itself; `Eval` from `Rng::derive(seed, "arith/split/eval")`:
//! the same distribution, another task for the same seed (a disjoint seed space). `Ood`
//! (from `Rng::derive(seed, "arith/split/ood")`) has `n = M + 1` or `M + 2` operands (1/2 each,
//! the `ood` stream), just beyond the training range, with `magnitude` and `carries` as
//! given by `d`: adaptation that raises `operands` approaches it. The in-domain evaluation
//! grid ([`Environment::eval_levels`]) is the default `[0, 0.25, 0.5, 0.75, 1]`.
//!
//! # Observation
//!
//! After every step that does not end the episode, the environment answers `>` followed by
//! the operator and operand the chain expects next (`>-8`, `>+36`), or `>A` when the answer
//! is due; after the step that ends it, `""`. It tells where the chain stands (a skipped or
//! repeated operand, or an off-chain line, is visible as an unchanged or unexpected
//! expectation) but never a running value, so verifying a step's arithmetic is still the
//! judge's job. The chain position advances on a well-formed line whose operator and operand
//! are the next ones of the chain (even if its numbers are wrong); malformed lines and lines
//! with another operator/operand do not advance it.
//!
//! # Oracle labels ([`OracleMode`])
//!
//! A computation line is parsed as `a<op>b=c` (spaces or tabs allowed around the operator
//! and the `=`, never inside a number; `b` a non-negative integer, `a` and `c` integers with
//! an optional leading `-`, since a running value can go negative after a slip; at most 18
//! digits each, so nothing overflows); an answer line as `A:<value>`, or `A:` followed by a
//! computation line whose `c` is the value (`A: 5 + 2 = 7`). *Locally* it is
//! correct iff `op`/`b` are the next operator/operand of the chain, `a` equals the current
//! value (the first operand, then the `c` of the last well-formed computation line: the
//! policy's own running value, even if wrong) and `c == a op b`. The answer line is locally
//! correct iff its value equals the true chain value. Then:
//!
//! - `Strict` (default): a line is correct iff it and every earlier line are locally correct:
//!   every line from the first error on is wrong (also an answer that is right by luck).
//! - `Local`: the local label (a correct continuation from a wrong value is correct).
//!
//! Outcome: an answer line was given and its value equals the true chain value.
//!
//! # Step dimensions ([`StepResult::dims`]) and oracle blame ([`StepResult::blame`])
//!
//! Step `i`'s `dims` is structural: it describes the line the chain expected when step `i` was
//! taken (position `j`), computed on the true chain, whatever the policy wrote:
//! - `operands` if `j ≥ 1` (the line exists only because the chain is longer than 2);
//! - `magnitude` if its operand has ≥ 2 digits (on line 0 also if the first operand has ≥ 3);
//! - `carries` if it needs a carry or borrow;
//! - when the answer is due, the union over all lines (it is the value the whole chain
//!   computes; it includes `operands` iff `n > 2`).
//!
//! Step `i`'s `blame` is the oracle's attribution of an incorrect step (empty when correct):
//! - `operands`: a wrong `op`/`b`, a wrong `a` (lost the running value), a computation line
//!   after all operators are used, an answer before all operators are used, or a wrong answer
//!   after only correct lines (lost the final value);
//! - `magnitude`: a wrong `c` where the written operand has ≥ 2 digits;
//! - `carries`: a wrong `c` where the written `a op b` needs a carry/borrow;
//! - a wrong answer after all operators, or (in `Strict`) a locally correct line after an
//!   error: the union of the blames of the earlier incorrect lines (the error came from
//!   upstream);
//! - malformed or over-long lines: nothing (a format error says nothing about difficulty).
//!
//! # Flawed expert ([`Environment::demonstration`])
//!
//! `demonstration(d, noise, seed)` solves exactly `sample(d, Train, seed)` (same prompt). It
//! makes the classic slip: on a line whose result (from its own running value) needs a carry
//! or a borrow, with probability `noise` it writes the column-wise result with every
//! carry/borrow dropped (`7+5=2`, `12-3=19`, `38+45=73`) and continues from the slipped value,
//! so later lines and the answer are consistent with the slip. Lines without a carry/borrow
//! are always right. The draws come from the `slip` stream, one uniform per line. An
//! addition slip lowers the value and a borrow slip raises it by `10^(c+1)` per column, so
//! two opposite slips can cancel: the noise-1 expert's success is `P(no carry line)` plus a
//! few percent of such luck (about 8% at `d = 1` with `M = 8`, `D = 2`, where no task is
//! carry-free). Demonstrations are the lines only; replaying them in `sample(d, Train, seed)`
//! gives the observations in between. With `noise > 0.5` a warm-started policy's greedy decoding slips
//! systematically on carry/borrow lines, so its accuracy is mid-range, and RL can discover the
//! correct carry because sampling still produces it with probability about `1 − noise`.
//!
//! # Length bounds
//!
//! With `V` = [`Arith::max_value_chars`] (the longest running value, sign included, of any
//! task incl. OOD and any amount of slipping: `|v| ≤ (10^(D+1) − 1) + (M + 1)·19·(10^D − 1)/9`,
//! as each line moves it by at most an operand plus a slip of `Σ_{c<D} 10^(c+1)`), a line is
//! at most `2V + D + 2` characters and [`Arith::max_action_chars`] is that plus 8. The longest
//! (flawed) expert trajectory, OOD included, as the policy's context holds it (prompt, lines,
//! observations, one delimiter after each) is at most [`Arith::max_trajectory_chars`]
//! `= n(D + 1) + 1 + (n − 1)(2V + 2D + 6) + V + 3` with `n = M + 2`; with a character
//! tokenizer the model needs `max_seq_len ≥ 1 (BOS) + max_trajectory_chars + max_step_tokens`
//! to take every expert step, and a step budget (`max_env_steps`) of at least `M + 2` to
//! finish an OOD task. A policy's own trajectory can be longer (up to `2n + 2` lines).

use crate::draw;
use rlany_contract::check::{self, Checked};
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Rng, Split, StepResult};
use serde::{Deserialize, Serialize};

/// Index of the `operands` dimension.
pub const OPERANDS: usize = 0;
/// Index of the `magnitude` dimension.
pub const MAGNITUDE: usize = 1;
/// Index of the `carries` dimension.
pub const CARRIES: usize = 2;
/// Per-column carry/borrow probability at `carries = 1`.
pub const MAX_CARRY_RATE: f64 = 0.5;
/// Probability that an operator is `+`.
const PLUS_RATE: f64 = 0.5;
/// Numbers in action lines have at most this many digits (so `i64` never overflows).
const MAX_NUMBER_DIGITS: usize = 18;
/// Range of `max_operands`.
const OPERANDS_RANGE: (usize, usize) = (2, 64);
/// Range of `max_digits`.
const DIGITS_RANGE: (u32, u32) = (1, 3);
/// Digit uniforms drawn per operand (`max_digits + 1` at most).
const DIGIT_DRAWS: usize = DIGITS_RANGE.1 as usize + 1;
/// Characters an action may have beyond the longest expert line.
const ACTION_SLACK: usize = 8;

/// How the oracle labels a line after the first error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OracleMode {
    /// Every line from the first error on is wrong.
    #[default]
    Strict,
    /// Each line on its own: a correct continuation from a wrong value is correct.
    Local,
}

/// Configuration of the `arith` environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArithConfig {
    /// The most operands a Train/Eval task has (at `operands = 1`); in `2..=64`.
    pub max_operands: usize,
    /// The most digits an operand other than the first has (at `magnitude = 1`); in `1..=3`.
    pub max_digits: u32,
    /// How the oracle labels lines after the first error.
    pub oracle: OracleMode,
    /// Whether the first operand has one digit more than the others (the default, so that
    /// a subtraction can borrow even with one-digit operands); `false` draws it like the
    /// others (`3+5-2` at `max_digits: 1`, sums a small pretrained model can do).
    pub longer_first: bool,
}

impl Default for ArithConfig {
    fn default() -> Self {
        Self {
            max_operands: 8,
            max_digits: 2,
            oracle: OracleMode::Strict,
            longer_first: true,
        }
    }
}

impl ArithConfig {
    /// Range checks: `2 <= max_operands <= 64`, `1 <= max_digits <= 3`.
    pub fn validate(&self) -> Checked {
        check::count(
            "max_operands",
            self.max_operands,
            OPERANDS_RANGE.0,
            OPERANDS_RANGE.1,
        )?;
        check::count(
            "max_digits",
            self.max_digits as usize,
            DIGITS_RANGE.0 as usize,
            DIGITS_RANGE.1 as usize,
        )
    }
}

/// The `arith` settings of an experiment file:
/// `environment: Arith(max_operands: 8, max_digits: 2, difficulty: [0.2, 0.2, 0.2])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithSpec {
    /// Longest Train/Eval chain (operands) at `operands = 1`; OOD chains have 1 or 2 more.
    /// In `2..=64`.
    pub max_operands: usize,
    /// Most digits per operand at `magnitude = 1` (`1..=3`; the first operand has one more
    /// unless `longer_first` is `false`).
    pub max_digits: u32,
    /// Starting difficulty of every task slot, one value in `[0, 1]` per dimension
    /// (`operands`, `magnitude`, `carries`).
    pub difficulty: Vec<f64>,
    /// How the oracle labels lines after the first error (`Strict` or `Local`).
    pub oracle: OracleMode,
    /// Whether the first operand has one digit more than the others (default `true`).
    pub longer_first: bool,
}

impl Default for ArithSpec {
    fn default() -> Self {
        let cfg = ArithConfig::default();
        Self {
            max_operands: cfg.max_operands,
            max_digits: cfg.max_digits,
            difficulty: vec![0.2, 0.2, 0.2],
            oracle: cfg.oracle,
            longer_first: cfg.longer_first,
        }
    }
}

impl ArithSpec {
    /// The environment configuration these settings describe.
    pub fn config(&self) -> ArithConfig {
        ArithConfig {
            max_operands: self.max_operands,
            max_digits: self.max_digits,
            oracle: self.oracle,
            longer_first: self.longer_first,
        }
    }
}

impl EnvironmentPlugin for ArithSpec {
    fn validate(&self) -> Checked {
        self.config().validate()?;
        check::difficulty(
            "difficulty",
            &self.difficulty,
            &["operands", "magnitude", "carries"],
        )
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(Arith::new(self.config()))
    }
}

/// The `arith` environment (see the module docs).
#[derive(Debug, Clone)]
pub struct Arith {
    cfg: ArithConfig,
}

impl Arith {
    /// A new environment. Out-of-range settings are clamped into range (use
    /// [`ArithConfig::validate`] first to reject them instead).
    pub fn new(cfg: ArithConfig) -> Self {
        Self {
            cfg: ArithConfig {
                max_operands: cfg.max_operands.clamp(OPERANDS_RANGE.0, OPERANDS_RANGE.1),
                max_digits: cfg.max_digits.clamp(DIGITS_RANGE.0, DIGITS_RANGE.1),
                oracle: cfg.oracle,
                longer_first: cfg.longer_first,
            },
        }
    }

    /// The (clamped) configuration.
    pub fn config(&self) -> ArithConfig {
        self.cfg
    }

    /// Like [`Environment::sample`], but returns the concrete episode type.
    pub fn sample_episode(&self, d: &[f64], split: Split, seed: u64) -> ArithEpisode {
        let (operands, ops) = self.draw_chain(d, split, seed);
        ArithEpisode::new(operands, ops, self.max_action_chars(), self.cfg.oracle)
    }

    /// The longest running value of any task (OOD included) and any amount of slipping, in
    /// characters, a minus sign included (see the module docs).
    pub fn max_value_chars(&self) -> usize {
        let n = (self.cfg.max_operands + 2) as u128;
        let operand = 10u128.pow(self.cfg.max_digits) - 1;
        let first = 10u128.pow(self.cfg.max_digits + 1) - 1;
        let bound = first + (n - 1) * operand * 19 / 9;
        bound.to_string().len() + 1
    }

    /// The longest action line an episode accepts (longer lines are wasted steps): the
    /// longest expert line `2V + D + 2` plus 8.
    pub fn max_action_chars(&self) -> usize {
        2 * self.max_value_chars() + self.cfg.max_digits as usize + 2 + ACTION_SLACK
    }

    /// An upper bound on the characters of the longest (flawed) expert trajectory, OOD
    /// included: prompt, every line and observation, one delimiter after each (see the module
    /// docs); BOS not included.
    pub fn max_trajectory_chars(&self) -> usize {
        let n = self.cfg.max_operands + 2;
        let d = self.cfg.max_digits as usize;
        let v = self.max_value_chars();
        let prompt = n * (d + 1) + 1;
        let line = (2 * v + d + 2) + 1 + (d + 2) + 1;
        prompt + (n - 1) * line + v + 3
    }

    /// `(extra operands, extra digits, per-column carry probability)` for `d`, before
    /// rounding.
    fn params(&self, d: &[f64]) -> (f64, f64, f64) {
        let coord = |i: usize| draw::coord(d, i);
        (
            coord(OPERANDS) * (self.cfg.max_operands - 2) as f64,
            coord(MAGNITUDE) * f64::from(self.cfg.max_digits - 1),
            coord(CARRIES) * MAX_CARRY_RATE,
        )
    }

    /// The operands and operators of the task `(d, split, seed)` (see the module docs).
    fn draw_chain(&self, d: &[f64], split: Split, seed: u64) -> (Vec<i64>, Vec<Op>) {
        let base = match split {
            Split::Train => seed,
            Split::Eval => Rng::derive(seed, "arith/split/eval").next_u64(),
            Split::Ood => Rng::derive(seed, "arith/split/ood").next_u64(),
        };
        let (extra_operands, extra_digits, carry_rate) = self.params(d);
        let n = match split {
            Split::Ood => {
                self.cfg.max_operands
                    + 1
                    + usize::from(Rng::derive(base, "arith/ood").bernoulli(0.5))
            }
            Split::Train | Split::Eval => {
                2 + draw::stochastic_round(
                    extra_operands,
                    Rng::derive(base, "arith/length").uniform(),
                )
            }
        };
        let cols = self.cfg.max_digits as usize;
        let mut op_rng = Rng::derive(base, "arith/ops");
        let mut size_rng = Rng::derive(base, "arith/sizes");
        let mut carry_rng = Rng::derive(base, "arith/carries");
        let mut digit_rng = Rng::derive(base, "arith/digits");
        let mut digit_draws = || {
            let mut u = [0.0; DIGIT_DRAWS];
            for x in u.iter_mut().take(cols + 1) {
                *x = digit_rng.uniform();
            }
            u
        };
        let k0 = 1
            + usize::from(self.cfg.longer_first)
            + draw::stochastic_round(extra_digits, size_rng.uniform());
        let mut value = first_operand(k0, &digit_draws());
        let mut operands = Vec::with_capacity(n);
        let mut ops = Vec::with_capacity(n - 1);
        operands.push(value);
        for _ in 1..n {
            let op = if op_rng.bernoulli(PLUS_RATE) {
                Op::Add
            } else {
                Op::Sub
            };
            let k = 1 + draw::stochastic_round(extra_digits, size_rng.uniform());
            let mut coins = [false; DIGITS_RANGE.1 as usize];
            for c in coins.iter_mut().take(cols) {
                *c = carry_rng.uniform() < carry_rate;
            }
            let b = operand(value, op, k, &coins[..cols], &digit_draws());
            value = apply(value, op, b).unwrap_or(value);
            operands.push(b);
            ops.push(op);
        }
        (operands, ops)
    }
}

impl Environment for Arith {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![
            Dim::new("operands", 2.0, self.cfg.max_operands as f64),
            Dim::new("magnitude", 1.0, f64::from(self.cfg.max_digits)),
            Dim::new("carries", 0.0, MAX_CARRY_RATE),
        ]
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.sample_episode(d, split, seed))
    }

    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let (operands, ops) = self.draw_chain(d, Split::Train, seed);
        let mut slips = Rng::derive(seed, "arith/slip");
        let steps = flawed_solution(&operands, &ops, noise, &mut slips);
        (chain_text(&operands, &ops), steps)
    }
}

/// `10^k`.
fn pow10(k: usize) -> i64 {
    10i64.pow(k as u32)
}

/// Digit `c` (0 = units) of `v >= 0`.
fn digit(v: i64, c: usize) -> i64 {
    (v / pow10(c)) % 10
}

/// Number of decimal digits of `v >= 0` (1 for 0).
fn digit_count(v: i64) -> usize {
    let mut n = 1;
    while n < 19 && v >= pow10(n) {
        n += 1;
    }
    n
}

/// Index `u ∈ [0, 1)` into `lo..=hi`.
fn pick(lo: i64, hi: i64, u: f64) -> i64 {
    let span = hi - lo + 1;
    lo + ((u * span as f64) as i64).clamp(0, span - 1)
}

/// A `k`-digit first operand (top digit non-zero).
fn first_operand(k: usize, u: &[f64]) -> i64 {
    (0..k)
        .map(|c| {
            let d = if c + 1 == k {
                pick(1, 9, u[c])
            } else {
                pick(0, 9, u[c])
            };
            d * pow10(c)
        })
        .sum()
}

/// The operand of a line `value op b` with `k` digits whose column `c` carries (addition) or
/// borrows (subtraction) iff `carry[c]`, where a digit can do so (see the module docs);
/// `u[c]` picks the digit among the allowed ones. `value >= 0`; the result keeps
/// `value op b >= 0`.
fn operand(value: i64, op: Op, k: usize, carry: &[bool], u: &[f64]) -> i64 {
    let k = match op {
        Op::Add => k,
        Op::Sub => k.min(digit_count(value)),
    }
    .min(carry.len());
    let mut b = 0;
    for c in 0..k {
        let x = digit(value, c);
        let top = c + 1 == k;
        // Digits of `b` that make the column carry / not carry.
        let (carry_lo, keep_hi) = match op {
            Op::Add => (10 - x, 9 - x),
            Op::Sub => (x + 1, x),
        };
        // A borrow out of the top column of a value with no more digits would go negative.
        let feasible = carry_lo <= 9 && !(op == Op::Sub && top && value < pow10(k));
        let (lo, hi) = if carry[c] && feasible {
            (carry_lo, 9)
        } else {
            (0, keep_hi)
        };
        // A k-digit operand has a non-zero top digit where that is allowed.
        let lo = if top && k > 1 && hi >= 1 {
            lo.max(1)
        } else {
            lo
        };
        b += pick(lo, hi, u[c]) * pow10(c);
    }
    if op == Op::Sub && b > value {
        // Only the top digit can make it exceed: lowering it keeps that column borrow-free.
        b -= pow10(k - 1);
    }
    b
}

/// The flawed expert's lines for a chain (see the module docs): one `slips` uniform per line.
fn flawed_solution(operands: &[i64], ops: &[Op], noise: f64, slips: &mut Rng) -> Vec<String> {
    let noise = if noise.is_nan() {
        0.0
    } else {
        noise.clamp(0.0, 1.0)
    };
    let mut steps = Vec::with_capacity(operands.len());
    let mut cur = operands[0];
    for (&op, &b) in ops.iter().zip(&operands[1..]) {
        let slipping = slips.uniform() < noise;
        let correct = apply(cur, op, b).unwrap_or(cur);
        let c = match slip(cur, op, b) {
            Some(s) if s != correct && slipping => s,
            _ => correct,
        };
        steps.push(format_line(cur, op, b, c));
        cur = c;
    }
    steps.push(format!("A:{cur}"));
    steps
}

/// An operator of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
}

impl Op {
    fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
        }
    }
}

/// `a op b`, `None` on overflow.
fn apply(a: i64, op: Op, b: i64) -> Option<i64> {
    match op {
        Op::Add => a.checked_add(b),
        Op::Sub => a.checked_sub(b),
    }
}

/// The carry/borrow slip: the column-wise result of `a op b` with every carry (addition) or
/// borrow (subtraction) dropped, e.g. `7+5 → 2`, `12-3 → 19`, `38+45 → 73`. `None` where the
/// slip is not defined (a negative operand, or a subtraction with `a < b`).
fn slip(a: i64, op: Op, b: i64) -> Option<i64> {
    if a < 0 || b < 0 || (op == Op::Sub && a < b) {
        return None;
    }
    let (mut x, mut y) = (i128::from(a), i128::from(b));
    let (mut out, mut place) = (0i128, 1i128);
    while x > 0 || y > 0 {
        let (dx, dy) = (x % 10, y % 10);
        let digit = match op {
            Op::Add => (dx + dy) % 10,
            Op::Sub => (dx + 10 - dy) % 10,
        };
        out += digit * place;
        place *= 10;
        x /= 10;
        y /= 10;
    }
    i64::try_from(out).ok()
}

/// Whether the correct `a op b` needs a carry/borrow in some column (i.e. the slip differs).
fn needs_carry_or_borrow(a: i64, op: Op, b: i64) -> bool {
    slip(a, op, b).is_some_and(|s| Some(s) != apply(a, op, b))
}

fn format_line(a: i64, op: Op, b: i64, c: i64) -> String {
    format!("{a}{}{b}={c}", op.symbol())
}

fn chain_text(operands: &[i64], ops: &[Op]) -> String {
    let mut s = operands[0].to_string();
    for (op, b) in ops.iter().zip(&operands[1..]) {
        s.push(op.symbol());
        s.push_str(&b.to_string());
    }
    s.push('\n');
    s
}

/// Parses `1..=18` ASCII digits at `bytes[*i..]`, advancing `*i`.
fn parse_digits(bytes: &[u8], i: &mut usize) -> Option<i64> {
    let start = *i;
    let mut v: i64 = 0;
    while let Some(&ch) = bytes.get(*i) {
        if !ch.is_ascii_digit() {
            break;
        }
        if *i - start >= MAX_NUMBER_DIGITS {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(i64::from(ch - b'0'))?;
        *i += 1;
    }
    (*i > start).then_some(v)
}

/// Parses an integer with an optional leading `-` at `bytes[*i..]`, advancing `*i`.
fn parse_signed(bytes: &[u8], i: &mut usize) -> Option<i64> {
    let negative = bytes.get(*i) == Some(&b'-');
    if negative {
        *i += 1;
    }
    let v = parse_digits(bytes, i)?;
    Some(if negative { -v } else { v })
}

/// The whole of `s` as an integer with an optional leading `-`.
fn parse_int(s: &str) -> Option<i64> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let v = parse_signed(bytes, &mut i)?;
    (i == bytes.len()).then_some(v)
}

/// A well-formed computation line `a<op>b=c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line {
    a: i64,
    op: Op,
    b: i64,
    c: i64,
}

/// Advances `*i` past ASCII spaces and tabs.
fn skip_spaces(bytes: &[u8], i: &mut usize) {
    while matches!(bytes.get(*i), Some(b' ' | b'\t')) {
        *i += 1;
    }
}

/// `a<op>b=c`, with optional spaces or tabs around the operator and the `=` (the form a chat
/// model writes, `36 + 1 = 37`). A number is never split: `3 6+1=37` does not parse, and a
/// negative number's `-` touches its digits.
fn parse_line(s: &str) -> Option<Line> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let a = parse_signed(bytes, &mut i)?;
    skip_spaces(bytes, &mut i);
    let op = match bytes.get(i) {
        Some(b'+') => Op::Add,
        Some(b'-') => Op::Sub,
        _ => return None,
    };
    i += 1;
    skip_spaces(bytes, &mut i);
    let b = parse_digits(bytes, &mut i)?;
    skip_spaces(bytes, &mut i);
    if bytes.get(i) != Some(&b'=') {
        return None;
    }
    i += 1;
    skip_spaces(bytes, &mut i);
    let c = parse_signed(bytes, &mut i)?;
    (i == bytes.len()).then_some(Line { a, op, b, c })
}

/// The value of an answer line `A:<value>` (spaces allowed after `A`, after `:`: `A: 80`),
/// or of `A:` followed by a computation line, whose result is the value (`A: 5 + 2 = 7`, a
/// chat model restating its last line); `Some(None)` for any other text after `A:`.
fn parse_answer(s: &str) -> Option<Option<i64>> {
    let rest = s.strip_prefix('A')?.trim_start_matches([' ', '\t']);
    let rest = rest.strip_prefix(':')?.trim_start_matches([' ', '\t']);
    Some(parse_int(rest).or_else(|| parse_line(rest).map(|line| line.c)))
}

/// Sorted, deduplicated.
fn normalised(mut dims: Vec<usize>) -> Vec<usize> {
    dims.sort_unstable();
    dims.dedup();
    dims
}

/// What was recorded for one step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepRecord {
    /// The local label (see the module docs).
    local: bool,
    /// Dims the oracle blames if the step is locally wrong (empty when locally correct).
    blame: Vec<usize>,
    /// The chain position (index of the expected operator, `n − 1` = answer due) when the
    /// step was taken.
    pos: usize,
}

/// One `arith` task being played out.
#[derive(Debug, Clone)]
pub struct ArithEpisode {
    operands: Vec<i64>,
    ops: Vec<Op>,
    /// The true chain value.
    value: i64,
    /// The dims each expected line exercises (index = chain position), then the answer's.
    dims: Vec<Vec<usize>>,
    oracle: OracleMode,
    /// Operators of the chain consumed so far (index of the next operator).
    pos: usize,
    /// The policy's own running value (see the module docs).
    cur: i64,
    steps: Vec<StepRecord>,
    /// The parsed answer, if an answer line was given and parsed.
    answer: Option<i64>,
    done: bool,
    max_action_chars: usize,
}

impl ArithEpisode {
    /// `operands.len() == ops.len() + 1 >= 2`, values non-negative along the chain.
    fn new(operands: Vec<i64>, ops: Vec<Op>, max_action_chars: usize, oracle: OracleMode) -> Self {
        let mut dims = Vec::with_capacity(operands.len());
        let mut v = operands[0];
        for (j, (&op, &b)) in ops.iter().zip(&operands[1..]).enumerate() {
            let mut d = Vec::new();
            if j >= 1 {
                d.push(OPERANDS);
            }
            if b >= 10 || (j == 0 && v >= 100) {
                d.push(MAGNITUDE);
            }
            if needs_carry_or_borrow(v, op, b) {
                d.push(CARRIES);
            }
            dims.push(d);
            v = apply(v, op, b).unwrap_or(v);
        }
        dims.push(normalised(dims.concat()));
        Self {
            cur: operands[0],
            operands,
            ops,
            value: v,
            dims,
            oracle,
            pos: 0,
            steps: Vec::new(),
            answer: None,
            done: false,
            max_action_chars,
        }
    }

    /// The step budget: `2n + 2` for an `n`-operand chain.
    pub fn max_steps(&self) -> usize {
        2 * self.operands.len() + 2
    }

    /// The number of operands `n` (the expert solves the task in exactly `n` steps).
    pub fn n_operands(&self) -> usize {
        self.operands.len()
    }

    /// The true value of the chain.
    pub fn value(&self) -> i64 {
        self.value
    }

    /// How the oracle labels lines.
    pub fn oracle_mode(&self) -> OracleMode {
        self.oracle
    }

    /// Number of steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.steps.len()
    }

    /// The expert's next line from the current state (the running value the episode holds,
    /// even after a slip); `None` once the episode is over.
    pub fn expert_action(&self) -> Option<String> {
        if self.done {
            return None;
        }
        match self
            .expected()
            .and_then(|(op, b)| Some((op, b, apply(self.cur, op, b)?)))
        {
            Some((op, b, c)) => Some(format_line(self.cur, op, b, c)),
            None => Some(format!("A:{}", self.value)),
        }
    }

    /// The next operator and operand of the chain; `None` when the answer is due.
    fn expected(&self) -> Option<(Op, i64)> {
        self.ops
            .get(self.pos)
            .map(|&op| (op, self.operands[self.pos + 1]))
    }

    /// The observation after a step (see the module docs).
    fn observation(&self) -> String {
        if self.done {
            return String::new();
        }
        match self.expected() {
            Some((op, b)) => format!(">{}{b}", op.symbol()),
            None => ">A".to_string(),
        }
    }

    /// Union of the blames of the locally wrong steps before `i`; `None` if there are none.
    fn upstream_blame(&self, i: usize) -> Option<Vec<usize>> {
        let wrong: Vec<&StepRecord> = self.steps[..i].iter().filter(|s| !s.local).collect();
        (!wrong.is_empty())
            .then(|| normalised(wrong.iter().flat_map(|s| s.blame.clone()).collect()))
    }

    fn answer_step(&mut self, parsed: Option<i64>) -> StepRecord {
        self.answer = parsed;
        self.done = true;
        let pos = self.pos;
        if parsed == Some(self.value) {
            return StepRecord {
                local: true,
                blame: Vec::new(),
                pos,
            };
        }
        let blame = if self.pos < self.ops.len() {
            vec![OPERANDS]
        } else {
            self.upstream_blame(self.steps.len())
                .unwrap_or_else(|| vec![OPERANDS])
        };
        StepRecord {
            local: false,
            blame,
            pos,
        }
    }

    fn computation_step(&mut self, text: &str) -> StepRecord {
        let pos = self.pos;
        let Some(line) = parse_line(text) else {
            return StepRecord {
                local: false,
                blame: Vec::new(),
                pos,
            };
        };
        let follows = self.expected() == Some((line.op, line.b));
        let a_ok = line.a == self.cur;
        let c_ok = apply(line.a, line.op, line.b) == Some(line.c);
        if follows {
            self.pos += 1;
        }
        self.cur = line.c;
        let mut blame = Vec::new();
        if !follows || !a_ok {
            blame.push(OPERANDS);
        }
        if !c_ok {
            if line.b >= 10 {
                blame.push(MAGNITUDE);
            }
            if needs_carry_or_borrow(line.a, line.op, line.b) {
                blame.push(CARRIES);
            }
        }
        StepRecord {
            local: follows && a_ok && c_ok,
            blame,
            pos,
        }
    }
}

/// What a pretrained chat model is told before the chain (see [`Episode::instructions`]).
/// The worked example teaches the form (without one, SmolLM2-135M answers `A + 1`); the
/// last sentence is there because it otherwise copies the example's `A: 44`
/// (docs/pretrained.md has the phrasings measured).
const INSTRUCTIONS: &str = "Evaluate the chain of additions and subtractions below strictly \
from left to right, one operation per reply. Each reply is one line `<running> <op> <operand> = <result>`. \
After each line I answer `>` followed by the next operation to do, or `>A` when none is left; then reply \
`A: <value>` with the final value. For example, for the chain `47+5-8` you reply `47 + 5 = 52`, I answer \
`>-8`, you reply `52 - 8 = 44`, I answer `>A`, and you reply `A: 44`. The final value is the result \
of your own last line.";

impl ArithEpisode {
    fn label_of(&self, i: usize) -> bool {
        match self.oracle {
            OracleMode::Local => self.steps.get(i).is_some_and(|s| s.local),
            OracleMode::Strict => i < self.steps.len() && self.steps[..=i].iter().all(|s| s.local),
        }
    }

    fn dims_of(&self, i: usize) -> Vec<usize> {
        self.steps
            .get(i)
            .and_then(|s| self.dims.get(s.pos))
            .cloned()
            .unwrap_or_default()
    }

    fn blame_of(&self, i: usize) -> Vec<usize> {
        let Some(s) = self.steps.get(i) else {
            return Vec::new();
        };
        if !s.local {
            return s.blame.clone();
        }
        match self.oracle {
            OracleMode::Local => Vec::new(),
            OracleMode::Strict => self.upstream_blame(i).unwrap_or_default(),
        }
    }
}

impl Episode for ArithEpisode {
    fn prompt(&self) -> String {
        chain_text(&self.operands, &self.ops)
    }

    fn instructions(&self) -> Option<String> {
        Some(INSTRUCTIONS.to_string())
    }

    fn step(&mut self, action: &str) -> StepResult {
        if self.done {
            return StepResult::ended();
        }
        let text = action.trim();
        let record = if text.chars().nth(self.max_action_chars).is_some() {
            StepRecord {
                local: false,
                blame: Vec::new(),
                pos: self.pos,
            }
        } else if let Some(answer) = parse_answer(text) {
            self.answer_step(answer)
        } else {
            self.computation_step(text)
        };
        self.steps.push(record);
        if self.steps.len() >= self.max_steps() {
            self.done = true;
        }
        let i = self.steps.len() - 1;
        StepResult::taken(
            self.observation(),
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
        self.answer == Some(self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An episode from a chain text like `"47+5-8"` (test helper; the text must be valid).
    fn episode_in(chain: &str, oracle: OracleMode) -> ArithEpisode {
        let mut operands = Vec::new();
        let mut ops = Vec::new();
        let mut num = String::new();
        for ch in chain.chars() {
            match ch {
                '+' | '-' => {
                    operands.push(num.parse().expect("operand"));
                    num.clear();
                    ops.push(if ch == '+' { Op::Add } else { Op::Sub });
                }
                _ => num.push(ch),
            }
        }
        operands.push(num.parse().expect("operand"));
        let env = Arith::new(ArithConfig {
            max_operands: 6,
            max_digits: 3,
            oracle,
            longer_first: true,
        });
        ArithEpisode::new(operands, ops, env.max_action_chars(), oracle)
    }

    fn episode(chain: &str) -> ArithEpisode {
        episode_in(chain, OracleMode::Local)
    }

    /// Plays `lines`, returning the observations.
    fn play(ep: &mut ArithEpisode, lines: &[&str]) -> Vec<String> {
        lines.iter().map(|l| ep.step(l).observation).collect()
    }

    fn labels(ep: &ArithEpisode) -> Vec<bool> {
        (0..ep.steps_taken()).map(|i| ep.label_of(i)).collect()
    }

    fn new_env(max_operands: usize, max_digits: u32) -> Arith {
        Arith::new(ArithConfig {
            max_operands,
            max_digits,
            oracle: OracleMode::Strict,
            longer_first: true,
        })
    }

    fn random_difficulty(rng: &mut Rng) -> Vec<f64> {
        (0..3).map(|_| rng.uniform()).collect()
    }

    /// Whether the noise-`noise` flawed expert's answer to `sample(d, Train, seed)` is right.
    fn flawed_succeeds(env: &Arith, d: &[f64], noise: f64, seed: u64) -> bool {
        let (_, steps) = env.demonstration(d, noise, seed);
        let ep = env.sample_episode(d, Split::Train, seed);
        steps
            .last()
            .and_then(|a| a.strip_prefix("A:"))
            .and_then(parse_int)
            == Some(ep.value())
    }

    /// Whether no line of the true chain needs a carry/borrow (the noise-1 expert never slips).
    fn carry_free(ep: &ArithEpisode) -> bool {
        ep.dims[..ep.n_operands() - 1]
            .iter()
            .all(|d| !d.contains(&CARRIES))
    }

    /// The (line, column) pairs of the true chain whose column carries/borrows.
    fn carry_columns(ep: &ArithEpisode) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut v = ep.operands[0];
        for (j, (&op, &b)) in ep.ops.iter().zip(&ep.operands[1..]).enumerate() {
            for c in 0..digit_count(b) {
                let carries = match op {
                    Op::Add => digit(v, c) + digit(b, c) >= 10,
                    Op::Sub => digit(v, c) < digit(b, c),
                };
                if carries {
                    out.push((j, c));
                }
            }
            v = apply(v, op, b).expect("small");
        }
        out
    }

    #[test]
    fn env_is_send_sync_and_episode_is_send() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Arith>();
        send::<ArithEpisode>();
        send::<Box<dyn Episode>>();
    }

    #[test]
    fn expert_solves_every_task_in_n_steps() {
        let mut rng = Rng::new(11);
        for (m, digits) in [(2, 1), (6, 3), (8, 2), (16, 2)] {
            let env = new_env(m, digits);
            for split in [Split::Train, Split::Eval, Split::Ood] {
                for _ in 0..300 {
                    let d = random_difficulty(&mut rng);
                    let mut ep = env.sample_episode(&d, split, rng.next_u64());
                    let n = ep.n_operands();
                    assert!(ep.operands.iter().all(|&x| x >= 0));
                    while let Some(a) = ep.expert_action() {
                        assert!(a.chars().count() <= env.max_action_chars() - ACTION_SLACK);
                        let r = ep.step(&a);
                        assert_eq!(r.done, ep.steps_taken() == n);
                    }
                    assert!(ep.done() && ep.outcome());
                    assert_eq!(ep.steps_taken(), n);
                    assert!((0..n).all(|i| ep.label_of(i)));
                    assert!((0..n).all(|i| ep.blame_of(i).is_empty()));
                    assert!(!ep.label_of(n) && ep.dims_of(n).is_empty());
                    // The answer exercises every dim some line does.
                    assert_eq!(ep.dims_of(n - 1), normalised(ep.dims[..n - 1].concat()));
                }
            }
        }
    }

    #[test]
    fn sampling_is_a_pure_function_of_difficulty_split_and_seed() {
        let env = new_env(8, 2);
        let mut rng = Rng::new(4);
        let (mut eval_differs, mut ood_differs) = (0, 0);
        for _ in 0..200 {
            let d = random_difficulty(&mut rng);
            let seed = rng.next_u64();
            for split in [Split::Train, Split::Eval, Split::Ood] {
                let a = env.sample(&d, split, seed);
                let b = env.sample(&d, split, seed);
                assert_eq!(a.prompt(), b.prompt());
                assert_eq!(a.task_key(), a.prompt());
            }
            let train = env.sample(&d, Split::Train, seed).prompt();
            eval_differs += usize::from(env.sample(&d, Split::Eval, seed).prompt() != train);
            ood_differs += usize::from(env.sample(&d, Split::Ood, seed).prompt() != train);
            // Clamping: out-of-range coordinates act like the nearest bound, NaN and missing
            // ones like 0.
            assert_eq!(
                env.sample(&[7.0, -1.0, f64::NAN], Split::Train, seed)
                    .prompt(),
                env.sample(&[1.0], Split::Train, seed).prompt()
            );
        }
        assert!(eval_differs > 190 && ood_differs == 200);
    }

    #[test]
    fn hand_computed_prompt_expert_steps_and_observations() {
        let mut ep = episode("47+5-8+36");
        assert_eq!(ep.prompt(), "47+5-8+36\n");
        assert_eq!(ep.value(), 80);
        assert_eq!(ep.max_steps(), 10);
        let mut steps = Vec::new();
        let mut observations = Vec::new();
        while let Some(a) = ep.expert_action() {
            observations.push(ep.step(&a).observation);
            steps.push(a);
        }
        assert_eq!(steps, ["47+5=52", "52-8=44", "44+36=80", "A:80"]);
        assert_eq!(observations, [">-8", ">+36", ">A", ""]);
        assert!(ep.outcome());
        // Step dims: 47+5 carries; 52-8 borrows and is the 2nd line; 44+36 carries, has a
        // 2-digit operand; the answer is the union.
        let dims: Vec<Vec<usize>> = (0..4).map(|i| ep.dims_of(i)).collect();
        assert_eq!(
            dims,
            [
                vec![CARRIES],
                vec![OPERANDS, CARRIES],
                vec![OPERANDS, MAGNITUDE, CARRIES],
                vec![OPERANDS, MAGNITUDE, CARRIES]
            ]
        );
        // A carry-free 2-operand chain with a 3-digit first operand.
        let mut ep = episode("123+4");
        assert_eq!(play(&mut ep, &["123+4=127", "A:127"]), [">A", ""]);
        assert_eq!(ep.dims_of(0), [MAGNITUDE]);
        assert_eq!(ep.dims_of(1), [MAGNITUDE]);
        let mut ep = episode("23+4");
        assert_eq!(play(&mut ep, &["23+4=27"]), [">A"]);
        assert!(ep.dims_of(0).is_empty());
    }

    #[test]
    fn strict_oracle_labels_every_line_after_the_first_error_wrong() {
        // The flawed expert's noise-1 play: 47+5 drops the carry (42 instead of 52), 42-8
        // drops the borrow (44 instead of 34): the two slips cancel and the answer is right.
        let lines = ["47+5=42", "42-8=44", "44+36=80", "A:80"];
        let mut strict = episode_in("47+5-8+36", OracleMode::Strict);
        let mut local = episode_in("47+5-8+36", OracleMode::Local);
        play(&mut strict, &lines);
        play(&mut local, &lines);
        assert!(strict.outcome() && local.outcome());
        assert_eq!(labels(&local), [false, false, true, true]);
        assert_eq!(labels(&strict), [false, false, false, false]);
        let blame = |ep: &ArithEpisode| (0..4).map(|i| ep.blame_of(i)).collect::<Vec<_>>();
        assert_eq!(
            blame(&local),
            [vec![CARRIES], vec![CARRIES], vec![], vec![]]
        );
        assert_eq!(blame(&strict), vec![vec![CARRIES]; 4]);
        // One slip, then correct continuations from the wrong value.
        let lines = ["47+5=42", "42-8=34", "34+36=70", "A:70"];
        let mut strict = episode_in("47+5-8+36", OracleMode::Strict);
        let mut local = episode_in("47+5-8+36", OracleMode::Local);
        play(&mut strict, &lines);
        play(&mut local, &lines);
        assert!(!strict.outcome() && !local.outcome());
        assert_eq!(labels(&local), [false, true, true, false]);
        assert_eq!(labels(&strict), [false; 4]);
        assert_eq!(local.blame_of(3), [CARRIES]); // inherited from line 0
        // A format error also counts: nothing after it is right in Strict mode.
        let lines = ["47 plus 5 = 52", "47+5=52", "52-8=44", "44+36=80", "A:80"];
        let mut strict = episode_in("47+5-8+36", OracleMode::Strict);
        let mut local = episode_in("47+5-8+36", OracleMode::Local);
        play(&mut strict, &lines);
        play(&mut local, &lines);
        assert!(strict.outcome());
        assert_eq!(labels(&local), [false, true, true, true, true]);
        assert_eq!(labels(&strict), [false; 5]);
        assert!((0..5).all(|i| strict.blame_of(i).is_empty()));
        // Without errors both modes agree.
        let mut strict = episode_in("47+5-8+36", OracleMode::Strict);
        play(&mut strict, &["47+5=52", "52-8=44", "44+36=80", "A:80"]);
        assert_eq!(labels(&strict), [true; 4]);
    }

    #[test]
    fn malformed_and_off_chain_lines_do_not_advance() {
        let mut ep = episode("7+5-3");
        let obs = play(
            &mut ep,
            &[
                "7 plus 5 = 12",
                "hello",
                "7-5=2",
                "2+5=7",
                "  7+5=12\n",
                "12-3=9",
                "A:9",
            ],
        );
        // "7-5=2": wrong operator → no advance, but its c=2 becomes the running value;
        // "2+5=7" then continues correctly from it; "7+5=12" continues from 7.
        assert_eq!(labels(&ep), [false, false, false, true, false, true, true]);
        assert_eq!(obs, [">+5", ">+5", ">+5", ">-3", ">-3", ">A", ""]);
        assert!(ep.outcome());
        assert!(ep.blame_of(0).is_empty()); // malformed
        assert_eq!(ep.blame_of(2), [OPERANDS]);
        assert_eq!(ep.blame_of(4), [OPERANDS]); // "+5" again where "-3" is due
        // Step dims follow the expected line, whatever was written.
        assert_eq!(ep.dims_of(1), [CARRIES]);
        assert_eq!(ep.dims_of(5), [OPERANDS, CARRIES]);
        // A repeated line does not advance and says so.
        let mut ep = episode("7+5-3");
        assert_eq!(play(&mut ep, &["7+5=12", "12+5=17"]), [">-3", ">-3"]);
        assert_eq!(ep.blame_of(1), [OPERANDS]);
        // Premature answer.
        let mut ep = episode("7+5-3");
        assert_eq!(play(&mut ep, &["A:12"]), [""]);
        assert_eq!(labels(&ep), [false]);
        assert_eq!(ep.blame_of(0), [OPERANDS]);
        assert_eq!(ep.dims_of(0), [CARRIES]);
        // A wrong answer after correct lines: the final value was lost.
        let mut ep = episode("7+5");
        play(&mut ep, &["7+5=12", "A:13"]);
        assert_eq!(ep.blame_of(1), [OPERANDS]);
        // A wrong c on a 2-digit operand that needs a carry.
        let mut ep = episode("38+45");
        play(&mut ep, &["38+45=73"]);
        assert_eq!(ep.blame_of(0), [MAGNITUDE, CARRIES]);
        // Unparsable answer ends the episode, wrong.
        let mut ep = episode("7+5");
        play(&mut ep, &["7+5=12", "A:twelve"]);
        assert!(ep.done() && !ep.outcome());
        assert_eq!(labels(&ep), [true, false]);
    }

    #[test]
    fn budget_ends_the_episode() {
        let mut ep = episode("11+1");
        for i in 0..ep.max_steps() {
            assert!(!ep.done());
            let r = ep.step("x");
            assert_eq!(r.done, i + 1 == ep.max_steps());
            assert_eq!(r.observation, if r.done { "" } else { ">+1" });
        }
        assert_eq!(ep.steps_taken(), 6);
        assert!(ep.step("A:12").done);
        assert_eq!(ep.steps_taken(), 6);
        assert!(!ep.outcome() && ep.expert_action().is_none());
    }

    #[test]
    fn slip_drops_carries_and_borrows() {
        assert_eq!(slip(7, Op::Add, 5), Some(2));
        assert_eq!(slip(12, Op::Sub, 3), Some(19));
        assert_eq!(slip(38, Op::Add, 45), Some(73));
        assert_eq!(slip(95, Op::Add, 5), Some(90));
        assert_eq!(slip(100, Op::Sub, 1), Some(109));
        assert_eq!(slip(503, Op::Sub, 78), Some(535));
        assert_eq!(slip(23, Op::Add, 45), Some(68)); // no carry: unchanged
        assert_eq!(slip(2, Op::Sub, 3), None);
        assert!(needs_carry_or_borrow(7, Op::Add, 5));
        assert!(needs_carry_or_borrow(12, Op::Sub, 3));
        assert!(!needs_carry_or_borrow(23, Op::Add, 45));
        assert!(!needs_carry_or_borrow(19, Op::Sub, 7));
    }

    #[test]
    fn demonstration_solves_exactly_the_sampled_task() {
        let env = new_env(8, 2);
        let mut rng = Rng::new(3);
        let (mut slipped, mut carry_lines) = (0, 0);
        for _ in 0..300 {
            let d = random_difficulty(&mut rng);
            let seed = rng.next_u64();
            // noise 0: the demonstration is the expert's play of sample(d, Train, seed).
            let (prompt, steps) = env.demonstration(&d, 0.0, seed);
            let mut ep = env.sample_episode(&d, Split::Train, seed);
            assert_eq!(prompt, ep.prompt());
            assert_eq!(steps.len(), ep.n_operands());
            for s in &steps {
                assert_eq!(ep.expert_action().as_deref(), Some(s.as_str()));
                ep.step(s);
            }
            assert!(ep.outcome());
            assert_eq!(env.demonstration(&d, 0.0, seed), (prompt.clone(), steps));
            // noise 1: same task; every carry/borrow line slips, others stay correct, and
            // the chain stays consistent with the slipped values.
            let (prompt1, steps) = env.demonstration(&d, 1.0, seed);
            assert_eq!(prompt1, prompt);
            let mut ep = env.sample_episode(&d, Split::Train, seed);
            let mut running = ep.operands[0];
            for (i, s) in steps.iter().enumerate() {
                let expert = ep.expert_action().expect("not done");
                ep.step(s);
                if let Some(l) = parse_line(s) {
                    assert_eq!(l.a, running);
                    let carry = needs_carry_or_borrow(l.a, l.op, l.b);
                    carry_lines += usize::from(carry);
                    if carry {
                        assert_eq!(Some(l.c), slip(l.a, l.op, l.b));
                        slipped += 1;
                    } else {
                        assert_eq!(s, &expert);
                    }
                    running = l.c;
                } else {
                    assert_eq!(i + 1, steps.len());
                    assert_eq!(s, &format!("A:{running}"));
                }
            }
            // NaN noise is no noise.
            assert_eq!(
                env.demonstration(&d, f64::NAN, seed).1,
                env.demonstration(&d, 0.0, seed).1
            );
        }
        assert!(carry_lines > 100 && slipped == carry_lines);
    }

    #[test]
    fn a_first_operand_as_short_as_the_others() {
        let env = Arith::new(ArithConfig {
            max_operands: 2,
            max_digits: 1,
            longer_first: false,
            ..ArithConfig::default()
        });
        let mut subtractions = 0;
        for seed in 0..500 {
            for split in [Split::Train, Split::Eval, Split::Ood] {
                let ep = env.sample_episode(&[1.0; 3], split, seed);
                // One-digit operands only, the first included; OOD chains are 3–4 long.
                assert!(ep.operands.iter().all(|&x| (0..=9).contains(&x)));
                assert!((1..=9).contains(&ep.operands[0]));
                let n = ep.n_operands();
                assert!(if split == Split::Ood {
                    n == 3 || n == 4
                } else {
                    n == 2
                });
                // The running value never goes negative.
                let mut v = ep.operands[0];
                for (&op, &b) in ep.ops.iter().zip(&ep.operands[1..]) {
                    v = apply(v, op, b).expect("small");
                    assert!(v >= 0);
                    subtractions += usize::from(op == Op::Sub);
                }
            }
        }
        assert!(subtractions > 500);
        // The other draws are the default's: only the first operand changes.
        let longer = new_env(2, 1);
        let (a, b) = (
            env.sample_episode(&[0.0; 3], Split::Train, 7),
            longer.sample_episode(&[0.0; 3], Split::Train, 7),
        );
        assert_eq!(a.ops, b.ops);
        assert!((10..=99).contains(&b.operands[0]));
    }

    #[test]
    fn difficulty_mapping() {
        let env = new_env(6, 2);
        let mut saw = [false; 2];
        for seed in 0..300 {
            // d = 0: two operands, a 2-digit first operand, a 1-digit second, no carry.
            let ep = env.sample_episode(&[0.0; 3], Split::Train, seed);
            assert_eq!(ep.n_operands(), 2);
            assert!((10..=99).contains(&ep.operands[0]) && ep.operands[1] <= 9);
            assert!(carry_columns(&ep).is_empty());
            // d = 1: max_operands operands of 2 digits (3 for the first), carries.
            let ep = env.sample_episode(&[1.0; 3], Split::Train, seed);
            assert_eq!(ep.n_operands(), 6);
            assert!((100..=999).contains(&ep.operands[0]));
            assert!(ep.operands[1..].iter().all(|&x| x <= 99));
            saw[0] |= ep.operands[1..].iter().any(|&x| x >= 10);
            saw[1] |= !carry_columns(&ep).is_empty();
            // The running value never goes negative.
            let mut v = ep.operands[0];
            for (&op, &b) in ep.ops.iter().zip(&ep.operands[1..]) {
                v = apply(v, op, b).expect("small");
                assert!(v >= 0);
            }
        }
        assert!(saw.iter().all(|s| *s));
        // Means: operands 2 + d0·(M − 2), digits 1 + d1·(D − 1), carry columns ∝ d2.
        let env = new_env(8, 3);
        let (mut n, mut k, mut columns) = (0.0, 0.0, 0.0);
        let seeds = 2000;
        for seed in 0..seeds {
            n += env
                .sample_episode(&[0.25, 0.0, 0.0], Split::Train, seed)
                .n_operands() as f64;
            // 1 + 0.25·2 = 1.5 digits drawn; a subtraction may cap it.
            let ep = env.sample_episode(&[0.0, 0.25, 0.0], Split::Train, seed);
            k += digit_count(ep.operands[1]) as f64;
            columns += carry_columns(&env.sample_episode(&[0.0, 0.0, 1.0], Split::Train, seed))
                .len() as f64;
        }
        let seeds = seeds as f64;
        assert!((n / seeds - 3.5).abs() < 0.05, "{}", n / seeds);
        assert!((k / seeds - 1.45).abs() < 0.1, "{}", k / seeds);
        // One line with one column: at most p = 0.5, less where infeasible.
        assert!(
            (0.35..=0.5).contains(&(columns / seeds)),
            "{}",
            columns / seeds
        );
        let space = env.difficulty_space();
        let names: Vec<&str> = space.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["operands", "magnitude", "carries"]);
        assert_eq!(
            (
                space[0].lo,
                space[0].hi,
                space[1].lo,
                space[1].hi,
                space[2].hi
            ),
            (2.0, 8.0, 1.0, 3.0, MAX_CARRY_RATE)
        );
        assert_eq!(env.eval_levels(), [0.0, 0.25, 0.5, 0.75, 1.0]);
    }

    #[test]
    fn rewrites_keep_what_the_changed_dimension_does_not_control() {
        let env = new_env(8, 2);
        let mut rng = Rng::new(17);
        let mut pattern_kept = 0;
        let trials = 500;
        for _ in 0..trials {
            let d = random_difficulty(&mut rng);
            let seed = rng.next_u64();
            let ep = env.sample_episode(&d, Split::Train, seed);
            let up = |dim: usize, to: f64| {
                let mut e = d.clone();
                e[dim] = to;
                env.sample_episode(&e, Split::Train, seed)
            };
            // operands: the shorter chain is a prefix of the longer one.
            let (lo, hi) = (
                up(OPERANDS, d[0] * 0.5),
                up(OPERANDS, (d[0] + 0.3).min(1.0)),
            );
            assert!(lo.n_operands() <= ep.n_operands() && ep.n_operands() <= hi.n_operands());
            for longer in [&ep, &hi] {
                let m = lo.n_operands();
                assert_eq!(lo.operands[..], longer.operands[..m]);
                assert_eq!(lo.ops[..], longer.ops[..m - 1]);
            }
            // carries: same length and operators; carry columns only get added (up to the
            // feasibility of the new running values).
            for to in [0.0, 1.0, (d[2] + 0.1).min(1.0)] {
                let other = up(CARRIES, to);
                assert_eq!((other.n_operands(), &other.ops), (ep.n_operands(), &ep.ops));
            }
            assert!(carry_columns(&up(CARRIES, 0.0)).is_empty());
            // magnitude: same length, operators and, mostly, carry pattern on shared columns.
            for to in [0.0, 1.0, (d[1] + 0.1).min(1.0)] {
                let other = up(MAGNITUDE, to);
                assert_eq!((other.n_operands(), &other.ops), (ep.n_operands(), &ep.ops));
            }
            let (small, big) = (up(MAGNITUDE, 0.0), up(MAGNITUDE, 1.0));
            let units = |ep: &ArithEpisode| -> Vec<usize> {
                carry_columns(ep)
                    .into_iter()
                    .filter(|&(_, c)| c == 0)
                    .map(|(j, _)| j)
                    .collect()
            };
            pattern_kept += usize::from(units(&small) == units(&big));
        }
        // The units-column carry pattern survives a full magnitude change for most tasks
        // (it differs only where a coin became infeasible for the new running value).
        assert!(pattern_kept * 100 >= trials * 95, "{pattern_kept}/{trials}");
    }

    #[test]
    fn each_dimension_is_structurally_monotone() {
        // Noise-1 flawed expert over 1000 seeds per point: moving one dimension up by 0.1
        // never raises its success rate (beyond cancelling slips, see the module docs), and
        // lowers it overall; the carry-free rate (no slip at all) likewise. A 0.1 move changes
        // a substantial fraction of tasks.
        const TOL: f64 = 0.015;
        let env = new_env(8, 2);
        let seeds: Vec<u64> = (0..1000).collect();
        let rate = |f: &dyn Fn(u64) -> bool| {
            seeds.iter().filter(|&&s| f(s)).count() as f64 / seeds.len() as f64
        };
        for base in [0.0, 0.5, 1.0] {
            for dim in 0..3 {
                let at = |x: f64| {
                    let mut d = vec![base; 3];
                    d[dim] = x;
                    d
                };
                let mut success = Vec::new();
                let mut clean = Vec::new();
                for i in 0..=10 {
                    let d = at(f64::from(i) / 10.0);
                    success.push(rate(&|s| flawed_succeeds(&env, &d, 1.0, s)));
                    clean.push(rate(&|s| {
                        carry_free(&env.sample_episode(&d, Split::Train, s))
                    }));
                    if i > 0 {
                        let prev = at(f64::from(i - 1) / 10.0);
                        let changed = rate(&|s| {
                            env.sample_episode(&prev, Split::Train, s).prompt()
                                != env.sample_episode(&d, Split::Train, s).prompt()
                        });
                        let least = match (dim, base > 0.0) {
                            (OPERANDS, _) => 0.5,      // expected 0.6
                            (MAGNITUDE, false) => 0.1, // 2 operands: 0.19
                            (MAGNITUDE, true) => 0.25,
                            (_, false) => 0.02, // 1 column: 0.05
                            (_, true) => 0.15,
                        };
                        assert!(
                            changed >= least,
                            "base {base} dim {dim} step {i}: {changed}"
                        );
                    }
                }
                for i in 1..=10 {
                    assert!(
                        success[i] <= success[i - 1] + TOL,
                        "{base} {dim}: {success:?}"
                    );
                    assert!(clean[i] <= clean[i - 1] + TOL, "{base} {dim}: {clean:?}");
                }
                if base == 0.0 && dim != CARRIES {
                    // No carry coin is ever set: the flawed expert never slips.
                    assert!(success.iter().chain(&clean).all(|&r| r == 1.0));
                } else {
                    // Lowered by 0.1, or (near the floor) halved.
                    let lowered = |r: &[f64]| r[10] < (r[0] - 0.1).max(r[0] * 0.5);
                    assert!(lowered(&success), "{base} {dim}: {success:?}");
                    assert!(lowered(&clean), "{base} {dim}: {clean:?}");
                }
            }
        }
    }

    #[test]
    fn ood_tasks_are_one_or_two_operands_longer_and_within_the_length_bounds() {
        for (m, digits) in [(2, 1), (8, 2), (6, 3), (64, 3)] {
            let env = new_env(m, digits);
            let mut rng = Rng::new(9);
            let mut seen = [false; 2];
            for _ in 0..200 {
                let d = random_difficulty(&mut rng);
                let seed = rng.next_u64();
                let ep = env.sample_episode(&d, Split::Ood, seed);
                let n = ep.n_operands();
                assert!(n == m + 1 || n == m + 2);
                seen[n - m - 1] = true;
                assert!(env.sample_episode(&d, Split::Train, seed).n_operands() <= m);
                // The flawed expert's trajectory (any noise), as the context holds it.
                for noise in [0.0, 0.5, 1.0] {
                    let lines = flawed_solution(&ep.operands, &ep.ops, noise, &mut Rng::new(seed));
                    let mut play = ep.clone();
                    let mut text = play.prompt();
                    for l in &lines {
                        assert!(l.chars().count() + ACTION_SLACK <= env.max_action_chars());
                        let obs = play.step(l).observation;
                        text.push_str(l);
                        text.push('\n');
                        if !obs.is_empty() {
                            text.push_str(&obs);
                            text.push('\n');
                        }
                    }
                    assert!(play.done());
                    assert!(text.chars().count() <= env.max_trajectory_chars());
                }
            }
            assert!(seen.iter().all(|s| *s));
        }
        // Hand-computed for the defaults (M = 8, D = 2, n = 10): |v| ≤ 999 + 9·99·19/9 = 2880,
        // so V = 4 digits + a sign.
        let env = new_env(8, 2);
        assert_eq!(env.max_value_chars(), 5);
        assert_eq!(env.max_action_chars(), 2 * 5 + 2 + 2 + 8);
        assert_eq!(
            env.max_trajectory_chars(),
            10 * 3 + 1 + 9 * (10 + 4 + 6) + 5 + 3
        );
    }

    #[test]
    fn settings_validate_with_field_paths_and_build() {
        let spec = ArithSpec::default();
        assert!(spec.validate().is_ok());
        assert_eq!(
            (spec.max_operands, spec.max_digits, spec.oracle),
            (8, 2, OracleMode::Strict)
        );
        assert_eq!(spec.start_difficulty(), [0.2, 0.2, 0.2]);
        assert_eq!(spec.build().difficulty_space().len(), 3);
        let err = |s: ArithSpec| s.validate().expect_err("invalid").field;
        assert_eq!(
            err(ArithSpec {
                max_operands: 1,
                ..ArithSpec::default()
            }),
            "max_operands"
        );
        assert_eq!(
            err(ArithSpec {
                max_operands: 65,
                ..ArithSpec::default()
            }),
            "max_operands"
        );
        assert_eq!(
            err(ArithSpec {
                max_digits: 0,
                ..ArithSpec::default()
            }),
            "max_digits"
        );
        assert_eq!(
            err(ArithSpec {
                max_digits: 4,
                ..ArithSpec::default()
            }),
            "max_digits"
        );
        assert_eq!(
            err(ArithSpec {
                difficulty: vec![0.5],
                ..ArithSpec::default()
            }),
            "difficulty"
        );
        let e = ArithSpec {
            difficulty: vec![0.5, f64::NAN, 0.5],
            ..ArithSpec::default()
        }
        .validate()
        .expect_err("NaN");
        assert_eq!(e.field, "difficulty");
        assert!(e.message.starts_with("value 1 "), "{}", e.message);
        assert!(
            ArithSpec {
                difficulty: vec![0.0, 1.0, 1.1],
                ..ArithSpec::default()
            }
            .validate()
            .is_err()
        );
        // Serde: missing fields take defaults, unknown fields are rejected.
        let s: ArithSpec =
            serde_json::from_str(r#"{"max_operands": 5, "oracle": "Local"}"#).expect("parses");
        assert_eq!(
            (s.max_operands, s.max_digits, s.oracle),
            (5, 2, OracleMode::Local)
        );
        assert!(serde_json::from_str::<ArithSpec>(r#"{"digits": 2}"#).is_err());
        // Out-of-range configs are clamped by Arith::new.
        let env = Arith::new(ArithConfig {
            max_operands: 0,
            max_digits: 9,
            oracle: OracleMode::Local,
            longer_first: false,
        });
        assert_eq!(
            env.config(),
            ArithConfig {
                max_operands: 2,
                max_digits: 3,
                oracle: OracleMode::Local,
                longer_first: false,
            }
        );
        assert_eq!(
            env.sample_episode(&[0.0; 3], Split::Train, 1).oracle_mode(),
            OracleMode::Local
        );
    }

    #[test]
    fn parsing_never_overflows() {
        let nines = "9".repeat(40);
        assert_eq!(parse_int(&nines), None);
        assert_eq!(parse_int(&"9".repeat(18)), Some(999_999_999_999_999_999));
        assert_eq!(parse_int("-0"), Some(0));
        assert_eq!(parse_int("+5"), None);
        assert_eq!(parse_int(""), None);
        assert_eq!(parse_int("-"), None);
        assert_eq!(parse_line(&format!("{nines}+1={nines}")), None);
        assert_eq!(
            parse_line("-1-3=-4"),
            Some(Line {
                a: -1,
                op: Op::Sub,
                b: 3,
                c: -4
            })
        );
        assert_eq!(parse_line("7--3=10"), None);
        assert_eq!(parse_line("7+5=12="), None);
        let big = "9".repeat(18);
        let mut ep = episode("7+5");
        ep.step(&format!("7+5={big}"));
        // The expert continues from the huge value without overflowing.
        assert_eq!(ep.expert_action(), Some("A:12".to_string()));
        // Over-long: a wasted step, not an answer.
        assert!(!ep.step(&format!("A:{}", "9".repeat(200))).done);
        assert!(!ep.label_of(1));
        // Fits the line limit but overflows i64: an unparsable (wrong) answer.
        assert!(ep.step(&format!("A:{}", "9".repeat(20))).done);
        assert!(!ep.outcome() && !ep.label_of(2));
    }

    #[test]
    fn the_spaced_forms_a_chat_model_writes_parse_and_split_numbers_do_not() {
        let line = |a, op, b, c| Some(Line { a, op, b, c });
        assert_eq!(parse_line("36 + 1 = 37"), line(36, Op::Add, 1, 37));
        assert_eq!(parse_line("36+1 =37"), line(36, Op::Add, 1, 37));
        assert_eq!(parse_line("52\t-  8 = -4"), line(52, Op::Sub, 8, -4));
        assert_eq!(parse_line("-1 - 3 = -4"), line(-1, Op::Sub, 3, -4));
        // A number is never split, and a negative sign touches its digits.
        assert_eq!(parse_line("3 6+1=37"), None);
        assert_eq!(parse_line("36+1=3 7"), None);
        assert_eq!(parse_line("36+1=- 37"), None);
        assert_eq!(parse_line("36 + - 1 = 35"), None);
        assert_eq!(parse_answer("A:80"), Some(Some(80)));
        assert_eq!(parse_answer("A: 80"), Some(Some(80)));
        assert_eq!(parse_answer("A : -7"), Some(Some(-7)));
        assert_eq!(parse_answer("A: 8 0"), Some(None));
        // A restated computation line: its result is the answer, right or wrong.
        assert_eq!(parse_answer("A: 5 + 2 = 7"), Some(Some(7)));
        assert_eq!(parse_answer("A:12-5=8"), Some(Some(8)));
        assert_eq!(parse_answer("A: 5 + 2 = 7, done"), Some(None));
        assert_eq!(parse_answer("A: 5 + 2"), Some(None));
        assert_eq!(parse_answer("Answer: 80"), None);
        // Played through an episode: the spaced lines score exactly like the compact ones.
        let mut ep = episode("47+5-8");
        assert!(!ep.step(" 47 + 5 = 52 ").done);
        assert!(!ep.step("52 - 8 = 44").done);
        assert!(ep.step("A: 44").done);
        assert!(ep.outcome());
        assert!((0..3).all(|i| ep.label_of(i)));
    }

    #[test]
    fn random_garbage_never_panics() {
        const POOL: &[&str] = &[
            "0", "1", "2", "5", "7", "9", "+", "-", "=", "A", ":", "A:", "\n", " ", "\t", "é",
            "中", "🦀", "\u{0}", "\u{202e}", "x", "-1", ">",
        ];
        let mut rng = Rng::new(2024);
        let mut actions = 0;
        while actions < 20_000 {
            let env = Arith::new(ArithConfig {
                max_operands: 2 + rng.below(8),
                max_digits: 1 + rng.below(3) as u32,
                oracle: if rng.bernoulli(0.5) {
                    OracleMode::Strict
                } else {
                    OracleMode::Local
                },
                longer_first: rng.bernoulli(0.5),
            });
            let split = [Split::Train, Split::Eval, Split::Ood][rng.below(3)];
            let d = random_difficulty(&mut rng);
            let mut ep = env.sample_episode(&d, split, rng.next_u64());
            let max_steps = ep.max_steps();
            let mut taken = 0;
            while !ep.done() {
                let action = match rng.below(5) {
                    // Near-valid: the expert's line, possibly with one character changed.
                    0 => {
                        let mut a: Vec<char> =
                            ep.expert_action().expect("not done").chars().collect();
                        if rng.bernoulli(0.5) && !a.is_empty() {
                            let k = rng.below(a.len());
                            a[k] = POOL[rng.below(POOL.len())].chars().next().unwrap_or('x');
                        }
                        a.into_iter().collect()
                    }
                    1 => format!("A:{}", "9".repeat(40)),
                    // Random bytes, lossily decoded; sometimes huge.
                    2 => {
                        let len = if rng.bernoulli(0.05) {
                            1 << 16
                        } else {
                            rng.below(64)
                        };
                        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    }
                    _ => {
                        let len = rng.below(200);
                        let mut s = String::new();
                        while s.chars().count() < len {
                            if rng.bernoulli(0.02) {
                                s.push_str(&"9".repeat(40));
                            } else {
                                s.push_str(POOL[rng.below(POOL.len())]);
                            }
                        }
                        s
                    }
                };
                let pos = ep.pos;
                let r = ep.step(&action);
                taken += 1;
                actions += 1;
                assert_eq!(r.done, ep.done());
                assert!(r.observation.is_empty() == r.done);
                assert!(r.observation.chars().count() <= env.config().max_digits as usize + 2);
                assert_eq!(ep.steps_taken(), taken);
                assert!(ep.steps_taken() <= max_steps);
                // An unparsable line is a wasted step.
                if parse_line(action.trim()).is_none() && parse_answer(action.trim()).is_none() {
                    assert_eq!(ep.pos, pos);
                    assert!(!ep.label_of(taken - 1));
                }
                let _ = (ep.outcome(), ep.expert_action());
            }
            assert!(ep.steps_taken() <= max_steps);
            assert!(ep.expert_action().is_none());
            for i in 0..max_steps + 3 {
                let _ = ep.label_of(i);
                let blame = ep.blame_of(i);
                let dims = ep.dims_of(i);
                assert!(blame.iter().chain(&dims).all(|&k| k < 3));
                if i >= ep.steps_taken() {
                    assert!(dims.is_empty() && blame.is_empty());
                }
                if ep.label_of(i) {
                    assert!(blame.is_empty());
                }
            }
            assert!(!ep.label_of(ep.steps_taken()));
            let before = ep.steps_taken();
            assert!(ep.step("A:0").done);
            assert_eq!(ep.steps_taken(), before);
        }
    }
}
