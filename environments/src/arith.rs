//! `arith`: multi-step arithmetic chains, one line per step.
//!
//! # Task format
//!
//! A task is a chain of `n` operands and `n − 1` operators from `{+, -}`, evaluated strictly
//! left to right. The prompt is the chain without spaces followed by `'\n'`, e.g. `"7+5-3\n"`.
//! The first operand is uniform in `[1, 10^digits − 1]`, the others in `[0, 10^digits − 1]`.
//! The running value never goes negative: when a `-` is drawn and the operand would exceed
//! the running value, the operand is redrawn uniformly in `[0, running value]`.
//!
//! The expert writes one line per operator, `<running><op><operand>=<result>`, then the answer
//! line `A:<value>`:
//!
//! ```text
//! 7+5-3        (prompt)
//! 7+5=12
//! 12-3=9
//! A:9
//! ```
//!
//! so an `n`-operand task takes the expert exactly `n` steps. The environment gives no
//! feedback text (every observation is `""`). An episode ends at the answer line or after
//! [`ArithEpisode::max_steps`] `= 2n + 2` steps. Actions are trimmed of surrounding
//! whitespace; an action longer than [`Environment::max_action_chars`] is a wasted step.
//!
//! # Difficulty space (3 dims, each clamped to `[0, 1]`, NaN → 0, missing → 0)
//!
//! | index | name       | meaning                                             | lo | hi             |
//! |-------|------------|-----------------------------------------------------|----|----------------|
//! | 0     | `operands` | `n = 2 + round(d0 · (max_operands − 2))`            | 2  | `max_operands` |
//! | 1     | `digits`   | `digits = 1 + round(d1 · (max_digits − 1))`         | 1  | `max_digits`   |
//! | 2     | `minus`    | probability that each operator is `-`               | 0  | 1              |
//!
//! # Splits
//!
//! `Train` and `Eval` draw from the same distribution (the caller gives them different RNG
//! streams). `Ood` uses `n = max_operands + 1 + (0 or 1)` operands: longer chains than any
//! trained on, with the same digits / minus rule.
//!
//! # Oracle label
//!
//! A computation line is parsed strictly as `a<op>b=c` (no spaces; `b` a non-negative integer,
//! `a` and `c` integers with an optional leading `-`, since the policy's own running value can
//! go negative after a slip; at most 18 digits each, so nothing overflows). It is correct iff
//! `op`/`b` are the next operator/operand of the chain, `a` equals the *current value*, and
//! `c == a op b`. The current value is the first operand before any computation line, then the
//! `c` of the last well-formed computation line: the policy's own running value, even if
//! wrong, so a correct continuation from a wrong value is labelled correct. A well-formed line
//! whose `op`/`b` are the next ones of the chain advances the chain position (even if `a` or
//! `c` is wrong); malformed lines and lines with the wrong `op`/`b` do not. The answer line is
//! correct iff its value equals the true chain value. Outcome: an answer line was given and
//! its value equals the true chain value.
//!
//! # Failure attribution (critic feedback)
//!
//! For an incorrect step, [`Episode::attribute_failure`] blames:
//! - `0` (operands): a wrong `op`/`b`, a wrong `a` (lost the running value), a computation line
//!   after all operators are used, or an answer line before all operators are used;
//! - `1` (digits): a wrong `c` where `a op b` needs a carry/borrow or has more than one digit;
//! - `2` (minus): any error on a `-` step (the written or the expected operator is `-`);
//! - a wrong final answer after all operators: the union of the blames of the earlier
//!   incorrect lines (the error came from upstream);
//! - malformed or over-long lines: nothing (a format error says nothing about difficulty).
//!
//! # Noise model of the flawed expert ([`Environment::demonstration`])
//!
//! The warm-start expert makes the classic slip: on a computation line whose correct result
//! needs a carry (addition) or a borrow (subtraction) in any column, with probability `noise`
//! it writes the column-wise result with the carry/borrow dropped (`7+5=2`, `12-3=19`,
//! `38+45=73`) and continues the chain from the slipped value, so later lines and the answer
//! are consistent with the slip. Lines without a carry/borrow are always correct. With
//! `noise > 0.5` the warm-started policy's greedy decoding makes the slip systematically on
//! carry/borrow steps, so its accuracy is mid-range (tasks without carries are still solved),
//! and RL can discover the correct carry because sampling still produces it with probability
//! about `1 − noise`.

use rlany_framework::check::{self, Checked, FieldError};
use rlany_framework::plugin::EnvironmentPlugin;
use rlany_framework::{Difficulty, Dim, Environment, Episode, Rng, Split, StepResult};
use serde::{Deserialize, Serialize};

/// Numbers in action lines have at most this many digits (so `i64` never overflows).
const MAX_NUMBER_DIGITS: usize = 18;
/// Upper bound accepted for `max_operands` (larger values are clamped by [`Arith::new`]).
const MAX_OPERANDS_LIMIT: usize = 1000;

/// Configuration of the `arith` environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArithConfig {
    /// The most operands a Train/Eval task has (at difficulty 1); at least 2.
    pub max_operands: usize,
    /// The most digits an operand has (at difficulty 1); in `1..=3`.
    pub max_digits: u32,
}

impl Default for ArithConfig {
    fn default() -> Self {
        Self {
            max_operands: 4,
            max_digits: 1,
        }
    }
}

impl ArithConfig {
    /// Checks the ranges: `2 <= max_operands <= 1000`, `1 <= max_digits <= 3`.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=MAX_OPERANDS_LIMIT).contains(&self.max_operands) {
            return Err(format!(
                "arith: max_operands must be in 2..={MAX_OPERANDS_LIMIT}, got {}",
                self.max_operands
            ));
        }
        if !(1..=3).contains(&self.max_digits) {
            return Err(format!(
                "arith: max_digits must be in 1..=3, got {}",
                self.max_digits
            ));
        }
        Ok(())
    }
}

/// The `arith` settings of an experiment file: `environment: Arith(max_operands: 5, ...)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithSpec {
    /// Longest chain (operands) at difficulty 1; OOD tasks are longer. In `2..=64`.
    pub max_operands: usize,
    /// Most digits per operand at difficulty 1 (`1..=3`).
    pub max_digits: u32,
    /// Starting difficulty of every task slot, one value in `[0, 1]` per dimension
    /// (`operands`, `digits`, `minus`). Evaluation uses it too.
    pub difficulty: Vec<f64>,
}

impl Default for ArithSpec {
    fn default() -> Self {
        Self {
            max_operands: 4,
            max_digits: 1,
            difficulty: vec![0.5, 0.0, 0.5],
        }
    }
}

impl EnvironmentPlugin for ArithSpec {
    fn validate(&self) -> Checked {
        check::count("max_operands", self.max_operands, 2, 64)?;
        check::count("max_digits", self.max_digits as usize, 1, 3)?;
        if self.difficulty.len() != 3 {
            return Err(FieldError::new(
                "difficulty",
                format!(
                    "must have 3 values (operands, digits, minus) (got {})",
                    self.difficulty.len()
                ),
            ));
        }
        for &d in &self.difficulty {
            check::real("difficulty", d, 0.0, 1.0)?;
        }
        Ok(())
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(Arith::new(ArithConfig {
            max_operands: self.max_operands,
            max_digits: self.max_digits,
        }))
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
                max_operands: cfg.max_operands.clamp(2, MAX_OPERANDS_LIMIT),
                max_digits: cfg.max_digits.clamp(1, 3),
            },
        }
    }

    /// The (clamped) configuration.
    pub fn config(&self) -> ArithConfig {
        self.cfg
    }

    /// Like [`Environment::sample`], but returns the concrete episode type.
    pub fn sample_episode(&self, d: &[f64], split: Split, rng: &mut Rng) -> ArithEpisode {
        let (operands, ops) = self.draw_chain(d, split, rng);
        ArithEpisode::new(operands, ops, self.max_action_chars())
    }

    /// Draws the operands and operators of one task.
    fn draw_chain(&self, d: &[f64], split: Split, rng: &mut Rng) -> (Vec<i64>, Vec<Op>) {
        let (n_train, digits, p_minus) = self.params(d);
        let n = match split {
            Split::Train | Split::Eval => n_train,
            Split::Ood => self.cfg.max_operands + 1 + rng.below(2),
        };
        let hi = 10i64.pow(digits) - 1;
        let mut operands = Vec::with_capacity(n);
        let mut ops = Vec::with_capacity(n - 1);
        let mut value = rng.range_inclusive(1, hi);
        operands.push(value);
        for _ in 1..n {
            let op = if rng.bernoulli(p_minus) {
                Op::Sub
            } else {
                Op::Add
            };
            let mut b = rng.range_inclusive(0, hi);
            if op == Op::Sub && b > value {
                b = rng.range_inclusive(0, value);
            }
            value = match op {
                Op::Add => value + b,
                Op::Sub => value - b,
            };
            operands.push(b);
            ops.push(op);
        }
        (operands, ops)
    }

    /// `(operand count, digits, P(-))` for a difficulty vector.
    fn params(&self, d: &[f64]) -> (usize, u32, f64) {
        let coord = |i: usize| {
            let x = d.get(i).copied().unwrap_or(0.0);
            if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
        };
        let n = 2 + (coord(0) * (self.cfg.max_operands - 2) as f64).round() as usize;
        let digits = 1 + (coord(1) * f64::from(self.cfg.max_digits - 1)).round() as u32;
        (n, digits, coord(2))
    }
}

impl Environment for Arith {
    fn difficulty_space(&self) -> Vec<Dim> {
        let dim = |name: &str, lo: f64, hi: f64| Dim {
            name: name.to_string(),
            lo,
            hi,
        };
        vec![
            dim("operands", 2.0, self.cfg.max_operands as f64),
            dim("digits", 1.0, f64::from(self.cfg.max_digits)),
            dim("minus", 0.0, 1.0),
        ]
    }

    fn sample(&self, d: &[f64], split: Split, rng: &mut Rng) -> Box<dyn Episode> {
        Box::new(self.sample_episode(d, split, rng))
    }

    fn demonstration(&self, d: &[f64], noise: f64, rng: &mut Rng) -> (String, Vec<String>) {
        let noise = if noise.is_nan() {
            0.0
        } else {
            noise.clamp(0.0, 1.0)
        };
        let (operands, ops) = self.draw_chain(d, Split::Train, rng);
        let mut steps = Vec::with_capacity(operands.len());
        let mut cur = operands[0];
        for (&op, &b) in ops.iter().zip(&operands[1..]) {
            let correct = apply(cur, op, b).unwrap_or(cur);
            let c = match slip(cur, op, b) {
                Some(s) if s != correct && rng.bernoulli(noise) => s,
                _ => correct,
            };
            steps.push(format_line(cur, op, b, c));
            cur = c;
        }
        steps.push(format!("A:{cur}"));
        (chain_text(&operands, &ops), steps)
    }
}

impl Arith {
    /// The longest action line an episode accepts (longer lines are wasted steps).
    pub fn max_action_chars(&self) -> usize {
        max_action_chars_for(self.cfg.max_operands + 2, self.cfg.max_digits)
    }
}

/// A safe bound on one line's length: `4 · digits + 16`, widened if the chain's largest
/// possible value has more digits than that allows.
fn max_action_chars_for(n_operands: usize, digits: u32) -> usize {
    let largest = (n_operands as u128) * (10u128.pow(digits) - 1);
    let value_digits = largest.to_string().len();
    (4 * digits as usize + 16).max(2 * value_digits + digits as usize + 8)
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

fn parse_line(s: &str) -> Option<Line> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let a = parse_signed(bytes, &mut i)?;
    let op = match bytes.get(i) {
        Some(b'+') => Op::Add,
        Some(b'-') => Op::Sub,
        _ => return None,
    };
    i += 1;
    let b = parse_digits(bytes, &mut i)?;
    if bytes.get(i) != Some(&b'=') {
        return None;
    }
    i += 1;
    let c = parse_signed(bytes, &mut i)?;
    (i == bytes.len()).then_some(Line { a, op, b, c })
}

/// What was recorded for one step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepRecord {
    correct: bool,
    /// Difficulty dims blamed for the step (empty when correct).
    blame: Vec<usize>,
}

impl StepRecord {
    fn wrong(mut blame: Vec<usize>) -> Self {
        blame.sort_unstable();
        blame.dedup();
        Self {
            correct: false,
            blame,
        }
    }
}

/// One `arith` task being played out.
#[derive(Debug, Clone)]
pub struct ArithEpisode {
    operands: Vec<i64>,
    ops: Vec<Op>,
    /// The true chain value.
    value: i64,
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
    fn new(operands: Vec<i64>, ops: Vec<Op>, max_action_chars: usize) -> Self {
        let value = ops
            .iter()
            .zip(&operands[1..])
            .fold(operands[0], |v, (&op, &b)| apply(v, op, b).unwrap_or(v));
        Self {
            cur: operands[0],
            operands,
            ops,
            value,
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

    fn answer_step(&mut self, rest: &str) -> StepRecord {
        let parsed = parse_int(rest);
        self.answer = parsed;
        self.done = true;
        if parsed == Some(self.value) {
            return StepRecord {
                correct: true,
                blame: Vec::new(),
            };
        }
        if self.pos < self.ops.len() {
            StepRecord::wrong(vec![0])
        } else {
            StepRecord::wrong(
                self.steps
                    .iter()
                    .flat_map(|s| s.blame.iter().copied())
                    .collect(),
            )
        }
    }

    fn computation_step(&mut self, text: &str) -> StepRecord {
        let Some(line) = parse_line(text) else {
            return StepRecord::wrong(Vec::new());
        };
        let expected = self
            .ops
            .get(self.pos)
            .map(|&op| (op, self.operands[self.pos + 1]));
        let follows = expected == Some((line.op, line.b));
        let a_ok = line.a == self.cur;
        let true_c = apply(line.a, line.op, line.b);
        let c_ok = true_c == Some(line.c);
        if follows {
            self.pos += 1;
        }
        self.cur = line.c;
        if follows && a_ok && c_ok {
            return StepRecord {
                correct: true,
                blame: Vec::new(),
            };
        }
        let mut blame = Vec::new();
        if !follows || !a_ok {
            blame.push(0);
        }
        if !c_ok {
            let multi_digit = true_c.is_none_or(|c| c.unsigned_abs() >= 10);
            if multi_digit || needs_carry_or_borrow(line.a, line.op, line.b) {
                blame.push(1);
            }
        }
        if line.op == Op::Sub || expected.is_some_and(|(op, _)| op == Op::Sub) {
            blame.push(2);
        }
        StepRecord::wrong(blame)
    }
}

impl Episode for ArithEpisode {
    fn prompt(&self) -> String {
        chain_text(&self.operands, &self.ops)
    }

    fn step(&mut self, action: &str) -> StepResult {
        if self.done {
            return StepResult {
                observation: String::new(),
                done: true,
            };
        }
        let text = action.trim();
        let record = if text.chars().count() > self.max_action_chars {
            StepRecord::wrong(Vec::new())
        } else if let Some(rest) = text.strip_prefix("A:") {
            self.answer_step(rest)
        } else {
            self.computation_step(text)
        };
        self.steps.push(record);
        if self.steps.len() >= self.max_steps() {
            self.done = true;
        }
        StepResult {
            observation: String::new(),
            done: self.done,
        }
    }

    fn done(&self) -> bool {
        self.done
    }

    fn outcome(&self) -> bool {
        self.answer == Some(self.value)
    }

    fn oracle_label(&self, i: usize) -> bool {
        self.steps.get(i).is_some_and(|s| s.correct)
    }

    fn attribute_failure(&self, i: usize) -> Vec<usize> {
        self.steps
            .get(i)
            .map(|s| s.blame.clone())
            .unwrap_or_default()
    }
}

impl ArithEpisode {
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
        let next = self
            .ops
            .get(self.pos)
            .map(|&op| (op, self.operands[self.pos + 1]));
        match next.and_then(|(op, b)| Some((op, b, apply(self.cur, op, b)?))) {
            Some((op, b, c)) => Some(format_line(self.cur, op, b, c)),
            None => Some(format!("A:{}", self.value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An episode from a chain text like `"7+5-3"` (test helper; the text must be valid).
    fn episode(chain: &str) -> ArithEpisode {
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
        ArithEpisode::new(operands, ops, max_action_chars_for(6, 3))
    }

    fn play(ep: &mut ArithEpisode, lines: &[&str]) -> Vec<bool> {
        for l in lines {
            ep.step(l);
        }
        (0..lines.len()).map(|i| ep.oracle_label(i)).collect()
    }

    fn random_difficulty(rng: &mut Rng) -> Vec<f64> {
        (0..3).map(|_| rng.uniform()).collect()
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
        let env = Arith::new(ArithConfig {
            max_operands: 6,
            max_digits: 3,
        });
        let mut rng = Rng::new(11);
        for split in [Split::Train, Split::Eval, Split::Ood] {
            for _ in 0..500 {
                let d = random_difficulty(&mut rng);
                let mut ep = env.sample_episode(&d, split, &mut rng);
                let n = ep.n_operands();
                while let Some(a) = ep.expert_action() {
                    assert!(a.chars().count() <= env.max_action_chars());
                    ep.step(&a);
                    assert!(ep.steps_taken() <= n);
                }
                assert!(ep.done() && ep.outcome());
                assert_eq!(ep.steps_taken(), n);
                assert!((0..n).all(|i| ep.oracle_label(i)));
                assert!((0..n).all(|i| ep.attribute_failure(i).is_empty()));
                assert!(!ep.oracle_label(n));
            }
        }
    }

    #[test]
    fn hand_computed_prompt_and_expert_steps() {
        let mut ep = episode("7+5-3");
        assert_eq!(ep.prompt(), "7+5-3\n");
        assert_eq!(ep.value(), 9);
        assert_eq!(ep.max_steps(), 8);
        let mut steps = Vec::new();
        while let Some(a) = ep.expert_action() {
            ep.step(&a);
            steps.push(a);
        }
        assert_eq!(steps, ["7+5=12", "12-3=9", "A:9"]);
        assert!(ep.outcome());
        assert_eq!(
            ep.step("A:9"),
            StepResult {
                observation: String::new(),
                done: true
            }
        );
        assert_eq!(ep.steps_taken(), 3);
    }

    #[test]
    fn error_then_correct_continuation_from_the_wrong_value() {
        let mut ep = episode("7+5-3");
        assert_eq!(play(&mut ep, &["7+5=13"]), [false]);
        assert!(!ep.done());
        assert_eq!(ep.expert_action().as_deref(), Some("13-3=10"));
        ep.step("13-3=10");
        assert_eq!(
            ep.step("A:10"),
            StepResult {
                observation: String::new(),
                done: true
            }
        );
        let labels: Vec<bool> = (0..3).map(|i| ep.oracle_label(i)).collect();
        assert_eq!(labels, [false, true, false]);
        assert!(ep.done() && !ep.outcome());
        assert_eq!(ep.attribute_failure(0), [1]); // 7+5 needs a carry
        assert!(ep.attribute_failure(1).is_empty());
        assert_eq!(ep.attribute_failure(2), [1]); // inherited from step 0
        assert!(!ep.oracle_label(3) && ep.attribute_failure(99).is_empty());
    }

    #[test]
    fn malformed_and_off_chain_lines_do_not_advance() {
        let mut ep = episode("7+5-3");
        let labels = play(
            &mut ep,
            &[
                "7 + 5 = 12",
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
        assert_eq!(labels, [false, false, false, true, false, true, true]);
        assert!(ep.outcome());
        assert!(ep.attribute_failure(0).is_empty()); // malformed
        assert_eq!(ep.attribute_failure(2), [0, 2]);
        // Premature answer.
        let mut ep = episode("7+5-3");
        assert_eq!(play(&mut ep, &["A:12"]), [false]);
        assert_eq!(ep.attribute_failure(0), [0]);
        // Unparsable answer ends the episode, wrong.
        let mut ep = episode("7+5");
        assert_eq!(play(&mut ep, &["7+5=12", "A:twelve"]), [true, false]);
        assert!(ep.done() && !ep.outcome());
    }

    #[test]
    fn budget_ends_the_episode() {
        let mut ep = episode("1+1");
        for i in 0..ep.max_steps() {
            assert!(!ep.done());
            let r = ep.step("x");
            assert_eq!(r.done, i + 1 == ep.max_steps());
        }
        assert_eq!(ep.steps_taken(), 6);
        assert!(ep.step("A:2").done);
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
    fn demonstrations_with_and_without_noise() {
        let env = Arith::new(ArithConfig {
            max_operands: 5,
            max_digits: 2,
        });
        let mut rng = Rng::new(3);
        let (mut slipped, mut carry_lines) = (0, 0);
        for _ in 0..300 {
            let d = random_difficulty(&mut rng);
            // noise 0: the demonstration is exactly the expert's play.
            let (prompt, steps) = env.demonstration(&d, 0.0, &mut rng);
            let chain = prompt.trim_end();
            let mut ep = episode(chain);
            assert_eq!(steps.len(), ep.n_operands());
            for s in &steps {
                assert_eq!(ep.expert_action().as_deref(), Some(s.as_str()));
                ep.step(s);
            }
            assert!(ep.outcome());
            // noise 1: every carry/borrow line slips, others stay correct, and the chain
            // stays consistent with the slipped values.
            let (prompt, steps) = env.demonstration(&d, 1.0, &mut rng);
            let mut ep = episode(prompt.trim_end());
            let mut running = ep.operands[0];
            for (i, s) in steps.iter().enumerate() {
                let expert = ep.expert_action().expect("not done");
                ep.step(s);
                if let Some(l) = parse_line(s) {
                    assert_eq!(l.a, running);
                    let carry = needs_carry_or_borrow(l.a, l.op, l.b);
                    carry_lines += usize::from(carry);
                    assert_eq!(ep.oracle_label(i), !carry);
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
        }
        assert!(carry_lines > 50 && slipped == carry_lines);
    }

    #[test]
    fn difficulty_mapping() {
        let env = Arith::new(ArithConfig {
            max_operands: 6,
            max_digits: 2,
        });
        let mut rng = Rng::new(5);
        let mut saw_two_digit = false;
        for _ in 0..200 {
            let ep = env.sample_episode(&[0.0, 0.0, 0.0], Split::Train, &mut rng);
            assert_eq!(ep.n_operands(), 2);
            assert!(ep.operands.iter().all(|&x| x <= 9) && ep.operands[0] >= 1);
            assert!(ep.ops.iter().all(|&op| op == Op::Add));
            let ep = env.sample_episode(&[1.0, 1.0, 1.0], Split::Eval, &mut rng);
            assert_eq!(ep.n_operands(), 6);
            assert!(ep.ops.iter().all(|&op| op == Op::Sub));
            assert!(ep.operands.iter().all(|&x| x <= 99));
            saw_two_digit |= ep.operands.iter().any(|&x| x >= 10);
            let mut v = ep.operands[0];
            for b in &ep.operands[1..] {
                v -= b;
                assert!(v >= 0);
            }
            // Out-of-range and NaN coordinates are clamped / zeroed; missing ones are 0.
            let ep = env.sample_episode(&[f64::NAN, 7.0], Split::Train, &mut rng);
            assert_eq!(ep.n_operands(), 2);
            assert!(ep.ops.iter().all(|&op| op == Op::Add));
        }
        assert!(saw_two_digit);
        let space = env.difficulty_space();
        let names: Vec<&str> = space.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["operands", "digits", "minus"]);
        assert_eq!((space[0].lo, space[0].hi, space[1].hi), (2.0, 6.0, 2.0));
    }

    #[test]
    fn ood_tasks_are_longer_than_training() {
        let env = Arith::new(ArithConfig::default());
        let mut rng = Rng::new(9);
        let mut seen = [false; 2];
        for _ in 0..200 {
            let d = random_difficulty(&mut rng);
            let n = env.sample_episode(&d, Split::Ood, &mut rng).n_operands();
            assert!(n == 5 || n == 6);
            seen[n - 5] = true;
            assert!(env.sample_episode(&d, Split::Train, &mut rng).n_operands() <= 4);
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn config_validation_and_clamping() {
        assert!(ArithConfig::default().validate().is_ok());
        assert!(
            ArithConfig {
                max_operands: 1,
                max_digits: 1
            }
            .validate()
            .is_err()
        );
        assert!(
            ArithConfig {
                max_operands: 4,
                max_digits: 4
            }
            .validate()
            .is_err()
        );
        let env = Arith::new(ArithConfig {
            max_operands: 0,
            max_digits: 9,
        });
        assert_eq!(
            env.config(),
            ArithConfig {
                max_operands: 2,
                max_digits: 3
            }
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
        assert!(!ep.step(&format!("A:{nines}")).done);
        assert!(!ep.oracle_label(1));
        // Fits the line limit but overflows i64: an unparsable (wrong) answer.
        assert!(ep.step(&format!("A:{}", "9".repeat(20))).done);
        assert!(!ep.outcome() && !ep.oracle_label(2));
    }

    #[test]
    fn random_garbage_never_panics() {
        const POOL: &[&str] = &[
            "0", "1", "2", "5", "7", "9", "+", "-", "=", "A", ":", "A:", "\n", " ", "\t", "é",
            "中", "🦀", "\u{0}", "\u{202e}", "x", "-1",
        ];
        let mut rng = Rng::new(2024);
        let mut actions = 0;
        while actions < 20_000 {
            let cfg = ArithConfig {
                max_operands: 2 + rng.below(6),
                max_digits: 1 + rng.below(3) as u32,
            };
            let env = Arith::new(cfg);
            let split = [Split::Train, Split::Eval, Split::Ood][rng.below(3)];
            let d = random_difficulty(&mut rng);
            let mut ep = env.sample_episode(&d, split, &mut rng);
            let max_steps = ep.max_steps();
            let mut taken = 0;
            while !ep.done() {
                let action = match rng.below(4) {
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
                let r = ep.step(&action);
                taken += 1;
                actions += 1;
                assert_eq!(r.done, ep.done());
                assert!(r.observation.is_empty());
                assert_eq!(ep.steps_taken(), taken);
                assert!(ep.steps_taken() <= max_steps);
                let _ = (ep.outcome(), ep.expert_action());
            }
            assert!(ep.steps_taken() <= max_steps);
            assert!(ep.expert_action().is_none());
            for i in 0..max_steps + 3 {
                let _ = ep.oracle_label(i);
                let blame = ep.attribute_failure(i);
                assert!(blame.iter().all(|&k| k < 3));
                if ep.oracle_label(i) {
                    assert!(blame.is_empty());
                }
            }
            assert!(!ep.oracle_label(ep.steps_taken()));
            let before = ep.steps_taken();
            assert!(ep.step("A:0").done);
            assert_eq!(ep.steps_taken(), before);
        }
    }
}
