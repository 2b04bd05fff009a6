//! What the loop needs from a language model (policy or judge) and its tokenizer.
//! Implemented in `rlany-models` on Burn modules; the loop is written once against these
//! traits, generic over the backend.

use crate::rng::Rng;
use burn::prelude::*;

/// Text ↔ token ids. Special tokens are part of the vocabulary.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text` (no BOS/EOS added). Unknown characters map to an `unk` id.
    fn encode(&self, text: &str) -> Vec<u32>;
    /// Text of `ids`; special tokens decode to nothing.
    fn decode(&self, ids: &[u32]) -> String;
    /// Number of ids.
    fn vocab_size(&self) -> usize;
    /// Beginning-of-sequence id (every context starts with it).
    fn bos(&self) -> u32;
    /// End-of-sequence id.
    fn eos(&self) -> u32;
    /// Padding id.
    fn pad(&self) -> u32;
    /// The id that ends one step (one line): the step delimiter `'\n'`.
    fn step_delimiter(&self) -> u32;
}

/// How to sample in [`CausalLm::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct SampleParams {
    /// Softmax temperature; `0.0` means greedy (argmax).
    pub temperature: f64,
    /// Nucleus sampling mass in `(0, 1]`; `1.0` disables it.
    pub top_p: f64,
    /// Most tokens generated per row.
    pub max_new_tokens: usize,
    /// A row stops after generating any of these ids (which are kept in its output).
    pub stop_tokens: Vec<u32>,
    /// Choose the tokens on the device (one small read per step: ids and log-probs) rather
    /// than reading every row's logits to the host. Same rule and the same uniforms from
    /// the same stream, summed in f32 instead of f64, so a draw within rounding of a
    /// boundary may differ; `top_p < 1` always samples on the host. The trainer sets it on
    /// every backend but the CPU's (where the host is the device).
    pub on_device: bool,
}

/// One row's generated continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated ids, including the stop token when one ended the row.
    pub tokens: Vec<u32>,
    /// Log-probability of each generated id under the model's untempered distribution
    /// `log_softmax(logits)`.
    pub logprobs: Vec<f32>,
    /// Whether a stop token ended the row (rather than `max_new_tokens`).
    pub stopped: bool,
}

/// A decoder-only language model, generic over the backend.
pub trait CausalLm<B: Backend>: Module<B> + Clone + Send + 'static {
    /// What a batch of contexts keeps between [`CausalLm::extend`] calls (a KV cache), so
    /// that a multi-turn rollout reads each token once.
    type Contexts;

    /// Next-token logits at every position.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, right-padded (row r is real for its first tokens, padding
    ///   after; positions are `0..seq` in every row, so causal attention alone keeps padding
    ///   out of every real position)
    /// - output: `[batch, seq, vocab]`
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3>;

    /// `rows` empty contexts (rows `0..rows`).
    fn contexts(&self, rows: usize) -> Self::Contexts;

    /// Appends `appended[i]` to the context of row `rows[i]`, then samples a continuation of
    /// every named row, batched, with a KV cache; the generated tokens become part of the
    /// row's context. All randomness comes from `rng`.
    ///
    /// - Rows not named are dropped for good (a later call may not name them).
    /// - A row's budget is `min(max_new_tokens, max_seq_len − its context length)`; a row
    ///   with nothing in its context or no room left gets an empty generation and is dropped.
    /// - On a fresh row, a prompt of `max_seq_len` tokens or more keeps its last
    ///   `max_seq_len − 1` tokens.
    fn extend(
        &self,
        contexts: &mut Self::Contexts,
        rows: &[usize],
        appended: &[Vec<u32>],
        params: &SampleParams,
        rng: &mut Rng,
    ) -> Vec<Generation>;

    /// Batched generation from fresh prompts (each must be non-empty to generate anything):
    /// [`CausalLm::extend`] on fresh contexts.
    fn generate(
        &self,
        prompts: &[Vec<u32>],
        params: &SampleParams,
        rng: &mut Rng,
    ) -> Vec<Generation> {
        let rows: Vec<usize> = (0..prompts.len()).collect();
        let mut contexts = self.contexts(prompts.len());
        self.extend(&mut contexts, &rows, prompts, params, rng)
    }

    /// Longest context (prompt + generation) the model accepts.
    fn max_seq_len(&self) -> usize;
}
