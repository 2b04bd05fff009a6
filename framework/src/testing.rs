//! Small stand-ins for the framework's own unit tests (compiled for tests only): a model,
//! a tokenizer and an environment small enough that a test can say by hand what the
//! rollout, the update and the judge must do with them. The framework never names a real
//! model or environment, so its phases are tested against these.
//!
//! - [`Letters`]: one id per symbol of `<s> </s> \n L R 0 … 9`, and of a digit with its
//!   newline (greedy longest match).
//! - [`Bigram`]: next-token logits from the previous token alone (a `[vocab, vocab]`
//!   table, a trainable parameter); it samples with the same host-side rule as the real
//!   models ([`crate::sampling::Sampler`]).
//! - [`Doors`]: `k` doors, each showing a digit; the answer is `L` below 5 and `R`
//!   otherwise; solved iff every answer is right; kinds `borderline` (3–6) and `clear`;
//!   the flawed expert confuses borderline doors. With [`TestEnvironment`] and
//!   [`TestAdaptation`] an experiment's text can name it, so a test can run the loop.

use crate::env::{Dim, Environment, Episode, Split, StepResult};
use crate::lm::{CausalLm, Generation, SampleParams, Tokenizer};
use crate::rng::Rng;
use crate::sampling::Sampler;
use burn::module::{Module, Param};
use burn::prelude::*;

/// The symbols of [`Letters`], in id order: a digit and the newline after it are one
/// symbol too (as BPE merges a newline into the text before it), so that a bigram sees the
/// digit of the door it answers.
pub const SYMBOLS: [&str; V] = [
    "<s>", "</s>", "\n", "L", "R", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "0\n", "1\n",
    "2\n", "3\n", "4\n", "5\n", "6\n", "7\n", "8\n", "9\n",
];
/// The vocabulary's size.
pub const V: usize = 25;
/// The id of a digit followed by its newline.
pub fn digit_line(d: u8) -> u32 {
    15 + u32::from(d)
}
/// Ids of [`Letters`].
pub const BOS: u32 = 0;
/// End of sequence.
pub const EOS: u32 = 1;
/// The newline: ends a step.
pub const NL: u32 = 2;
/// `L`.
pub const L: u32 = 3;
/// `R`.
pub const R: u32 = 4;

/// A tokenizer with one id per symbol of [`SYMBOLS`], longest match first; an unknown
/// character encodes as EOS.
pub struct Letters;

impl Tokenizer for Letters {
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let (id, len) = SYMBOLS
                .iter()
                .enumerate()
                .skip(2)
                .filter(|(_, p)| rest.starts_with(**p))
                .max_by_key(|(_, p)| p.len())
                .map_or((EOS, c.len_utf8()), |(i, p)| (i as u32, p.len()));
            ids.push(id);
            rest = &rest[len..];
        }
        ids
    }
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .filter(|&&i| i >= NL)
            .map(|&i| SYMBOLS.get(i as usize).copied().unwrap_or("?"))
            .collect()
    }
    fn vocab_size(&self) -> usize {
        SYMBOLS.len()
    }
    fn bos(&self) -> u32 {
        BOS
    }
    fn eos(&self) -> u32 {
        EOS
    }
    fn pad(&self) -> u32 {
        EOS
    }
}

/// Next-token logits from the previous token alone.
#[derive(Module, Debug)]
pub struct Bigram<B: Backend> {
    /// `[vocab, vocab]`: row `a` is the logits after token `a`.
    pub table: Param<Tensor<B, 2>>,
    max_seq_len: usize,
}

impl<B: Backend> Bigram<B> {
    /// The model whose logits after token `a` are `rows[a]` (a square table over
    /// [`SYMBOLS`]).
    pub fn new(rows: &[[f32; V]; V], max_seq_len: usize, device: &B::Device) -> Self {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let table = Tensor::<B, 1>::from_floats(flat.as_slice(), device).reshape([V, V]);
        Self {
            table: Param::from_tensor(table),
            max_seq_len,
        }
    }

    /// Uniform logits everywhere but after the tokens `after`, where `next` gets `logit`.
    pub fn preferring(after: &[(u32, u32)], logit: f32, device: &B::Device) -> Self {
        let mut rows = [[0.0f32; V]; V];
        for &(a, next) in after {
            rows[a as usize][next as usize] = logit;
        }
        Self::new(&rows, 256, device)
    }

    /// The host copy of the logits after token `a`.
    pub fn row(&self, a: u32) -> Vec<f32> {
        let t = self.table.val().slice([a as usize..a as usize + 1, 0..V]);
        t.into_data().to_vec().unwrap_or_default()
    }
}

impl<B: Backend> CausalLm<B> for Bigram<B> {
    /// The tokens of each row so far.
    type Contexts = Vec<Vec<u32>>;

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let flat = tokens.reshape([batch * seq]);
        self.table.val().select(0, flat).reshape([batch, seq, V])
    }

    fn contexts(&self, rows: usize) -> Vec<Vec<u32>> {
        vec![Vec::new(); rows]
    }

    fn extend(
        &self,
        contexts: &mut Vec<Vec<u32>>,
        rows: &[usize],
        appended: &[Vec<u32>],
        params: &SampleParams,
        rng: &mut Rng,
    ) -> Vec<Generation> {
        let table: Vec<f32> = self.table.val().into_data().to_vec().unwrap_or_default();
        let mut sampler = Sampler::default();
        rows.iter()
            .zip(appended)
            .map(|(&r, more)| {
                let ctx = &mut contexts[r];
                ctx.extend_from_slice(more);
                let budget = params
                    .max_new_tokens
                    .min(self.max_seq_len.saturating_sub(ctx.len()));
                let mut g = Generation {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    stopped: false,
                };
                for _ in 0..budget {
                    let Some(&last) = ctx.last() else { break };
                    let logits = &table[last as usize * V..(last as usize + 1) * V];
                    let (id, lp) = sampler.sample(logits, params.temperature, params.top_p, rng);
                    ctx.push(id);
                    g.tokens.push(id);
                    g.logprobs.push(lp);
                    if params.stop_tokens.contains(&id) {
                        g.stopped = true;
                        break;
                    }
                }
                g
            })
            .collect()
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }
}

/// `k` doors (see the module docs); the signs of a task are drawn from its seed.
pub struct Doors {
    /// Number of doors.
    pub k: usize,
}

/// One [`Doors`] task being played.
pub struct DoorsEpisode {
    signs: Vec<u8>,
    answers: Vec<bool>,
}

impl DoorsEpisode {
    /// The right answer at a door showing `sign`.
    pub fn answer(sign: u8) -> &'static str {
        if sign < 5 { "L" } else { "R" }
    }

    /// The task's signs.
    pub fn signs(&self) -> &[u8] {
        &self.signs
    }
}

impl Episode for DoorsEpisode {
    fn prompt(&self) -> String {
        format!("{}\n", self.signs[0])
    }
    fn step(&mut self, action: &str) -> StepResult {
        let i = self.answers.len();
        let Some(&sign) = self.signs.get(i) else {
            return StepResult::ended();
        };
        let right = action == Self::answer(sign);
        self.answers.push(right);
        // The observation ends its line, so that the digit and its newline are one token.
        let next = self.signs.get(i + 1).map(|s| format!("{s}\n"));
        let kind = if (3..=6).contains(&sign) {
            "borderline"
        } else {
            "clear"
        };
        StepResult::taken(
            next.clone().unwrap_or_default(),
            next.is_none(),
            right,
            vec![0],
            vec![0],
        )
        .with_kind(kind)
    }
    fn done(&self) -> bool {
        self.answers.len() >= self.signs.len()
    }
    fn outcome(&self) -> bool {
        self.done() && self.answers.iter().all(|&a| a)
    }
}

impl Doors {
    /// A task: `k` signs from `seed`.
    pub fn episode(&self, seed: u64) -> DoorsEpisode {
        let mut rng = Rng::new(seed);
        DoorsEpisode {
            signs: (0..self.k).map(|_| rng.below(10) as u8).collect(),
            answers: Vec::new(),
        }
    }
}

impl Environment for Doors {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![Dim::new("doors", self.k as f64, self.k as f64)]
    }
    fn sample(&self, _d: &[f64], _split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.episode(seed))
    }
    /// The flawed expert answers a borderline door (3–6) wrong with probability `noise`.
    fn demonstration(&self, _d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let ep = self.episode(seed);
        let mut slips = Rng::derive(seed, "doors/noise");
        let actions = ep
            .signs
            .iter()
            .map(|&s| {
                let slip = slips.uniform() < noise && (3..=6).contains(&s);
                let right = DoorsEpisode::answer(s);
                let wrong = if right == "L" { "R" } else { "L" };
                if slip { wrong } else { right }.to_string()
            })
            .collect();
        (ep.prompt(), actions)
    }
}

/// `environment: Doors(k: 6)` in a test's experiment text.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorsSpec {
    /// Number of doors.
    pub k: usize,
}

impl crate::plugin::EnvironmentPlugin for DoorsSpec {
    fn validate(&self) -> crate::check::Checked {
        crate::check::count("k", self.k, 1, 12)
    }
    fn start_difficulty(&self) -> crate::env::Difficulty {
        vec![0.0]
    }
    fn build(&self) -> Box<dyn Environment> {
        Box::new(Doors { k: self.k })
    }
}

/// The environments a test's experiment may name.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum TestEnvironment {
    /// [`Doors`].
    Doors(DoorsSpec),
}

impl crate::plugin::EnvironmentChoice for TestEnvironment {
    fn plugin(&self) -> &dyn crate::plugin::EnvironmentPlugin {
        match self {
            Self::Doors(s) => s,
        }
    }
}

/// The adaptation a test's experiment may name: `Static` only.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Default)]
pub enum TestAdaptation {
    /// Difficulty never changes.
    #[default]
    Static,
}

impl crate::plugin::AdaptationChoice for TestAdaptation {
    fn plugin(&self) -> Option<&dyn crate::plugin::ProposerPlugin> {
        None
    }
}
