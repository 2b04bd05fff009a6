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
    /// How an episode's text becomes one token sequence (plain lines unless the model brings
    /// a chat template).
    fn prompt_format(&self) -> PromptFormat {
        PromptFormat::Lines
    }
}

/// How an episode — the task, the agent's actions (one line each) and the environment's
/// observations — is laid out as one token sequence. The environment only writes text; the
/// model that reads it decides the layout, so the same environment serves a character-level
/// model and a pretrained chat model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptFormat {
    /// BOS, the task, then each action as a line and the observation after it (as a line).
    Lines,
    /// A chat: the environment's instructions and the task as the first user message (after
    /// the system prompt, if any), each action an assistant message, each observation a
    /// user message.
    Chat(ChatMarkup),
}

/// The literal text of a chat template (ChatML: `<|im_start|>user\n` … `<|im_end|>\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMarkup {
    /// The whole system message, or empty.
    pub system: String,
    /// Opens a user message.
    pub user: String,
    /// Opens an assistant message.
    pub assistant: String,
    /// Closes a message. Its first token must be the tokenizer's EOS (the model ends a reply
    /// with it); a newline follows it.
    pub end: String,
}

impl PromptFormat {
    /// Tokens of the episode's start: the task (and for a chat, the instructions of the
    /// environment, which a model that has never seen it needs), up to where the first
    /// action begins.
    pub fn start(&self, tok: &dyn Tokenizer, task: &str, instructions: Option<&str>) -> Vec<u32> {
        match self {
            PromptFormat::Lines => {
                let mut ids = vec![tok.bos()];
                ids.extend(tok.encode(task));
                ids
            }
            PromptFormat::Chat(m) => {
                let body = match instructions {
                    Some(i) => format!("{}\n\n{}", i.trim_end(), task.trim_end()),
                    None => task.trim_end().to_string(),
                };
                tok.encode(&format!(
                    "{}{}{body}{}\n{}",
                    m.system, m.user, m.end, m.assistant
                ))
            }
        }
    }

    /// The ids that end an action: every id whose text holds a newline, and EOS.
    pub fn stop_tokens(&self, tok: &dyn Tokenizer) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| tok.decode(&[id]).contains('\n'))
            .collect();
        if !ids.contains(&tok.eos()) {
            ids.push(tok.eos());
        }
        ids
    }

    /// The action written by `generated`: its text up to the first newline.
    pub fn action_text(&self, tok: &dyn Tokenizer, generated: &[u32]) -> String {
        let text = tok.decode(generated);
        match text.split_once('\n') {
            Some((line, _)) => line.to_string(),
            None => text,
        }
    }

    /// Tokens that close an action in the context after `generated` (not trained on):
    /// a newline when the action did not end with one (lines); the end of the assistant
    /// message (chat).
    pub fn close_action(&self, tok: &dyn Tokenizer, generated: &[u32]) -> Vec<u32> {
        let last = generated.last().copied();
        match self {
            PromptFormat::Lines => {
                let ends_line = last.is_some_and(|t| tok.decode(&[t]).ends_with('\n'));
                if ends_line {
                    Vec::new()
                } else {
                    tok.encode("\n")
                }
            }
            PromptFormat::Chat(m) => {
                if last == Some(tok.eos()) {
                    tok.encode("\n")
                } else {
                    tok.encode(&format!("{}\n", m.end))
                }
            }
        }
    }

    /// Tokens of an observation, up to where the next action begins.
    pub fn observation(&self, tok: &dyn Tokenizer, observation: &str) -> Vec<u32> {
        match self {
            PromptFormat::Lines => {
                if observation.is_empty() {
                    return Vec::new();
                }
                let mut ids = tok.encode(observation);
                if !observation.ends_with('\n') {
                    ids.extend(tok.encode("\n"));
                }
                ids
            }
            PromptFormat::Chat(m) => {
                let text = if observation.trim().is_empty() {
                    "(no change)"
                } else {
                    observation.trim_end()
                };
                tok.encode(&format!("{}{text}{}\n{}", m.user, m.end, m.assistant))
            }
        }
    }

    /// A demonstrated action as `(trained, context)` tokens: the action and what ends it
    /// (its newline, or the end of the assistant message), then untrained tokens that close
    /// it in the context.
    pub fn demonstrated_action(&self, tok: &dyn Tokenizer, text: &str) -> (Vec<u32>, Vec<u32>) {
        match self {
            PromptFormat::Lines => {
                let mut ids = tok.encode(text);
                ids.extend(tok.encode("\n"));
                (ids, Vec::new())
            }
            PromptFormat::Chat(m) => {
                let mut ids = tok.encode(text);
                ids.extend(tok.encode(&m.end));
                (ids, tok.encode("\n"))
            }
        }
    }
}

/// Each row's last real position as a flat position `row · seq + j` (`lengths[r]` clamped
/// to `1..=seq`), for [`CausalLm::logits_at`] or [`select_positions`].
pub fn last_token_positions(lengths: &[usize], seq: usize) -> Vec<usize> {
    lengths
        .iter()
        .enumerate()
        .map(|(r, &len)| r * seq + len.clamp(1, seq) - 1)
        .collect()
}

/// The vectors at flat positions `row · seq + j`, in the order given.
///
/// # Shapes
/// - `t`: `[batch, seq, width]`
/// - output: `[positions.len(), width]`
///
/// # Panics
/// If a position is `>= batch · seq`.
pub fn select_positions<B: Backend>(t: Tensor<B, 3>, positions: &[usize]) -> Tensor<B, 2> {
    let [batch, seq, width] = t.dims();
    let index: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
    let index =
        Tensor::<B, 1, Int>::from_data(TensorData::new(index, [positions.len()]), &t.device());
    // [batch, seq, width] -> [batch·seq, width] -> the named rows -> [n, width]
    t.reshape([batch * seq, width]).select(0, index)
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

    /// Next-token logits after the last real token of each row only (a judge's verdict): a
    /// model can skip the LM head everywhere else, which for a large vocabulary is most of
    /// the work.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, right-padded; row `r` has `lengths[r]` real tokens
    ///   (clamped to `1..=seq`)
    /// - output: `[batch, vocab]`
    fn last_logits(&self, tokens: Tensor<B, 2, Int>, lengths: &[usize]) -> Tensor<B, 2> {
        let seq = tokens.dims()[1];
        self.logits_at(tokens, &last_token_positions(lengths, seq))
    }

    /// Next-token logits at the flat positions `row · seq + j` only (the tokens a loss
    /// scores: a policy's actions are a tenth of its context), in the order given: a model
    /// can skip the LM head everywhere else, and the `[batch, seq, vocab]` logits and their
    /// gradient are never held.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, right-padded
    /// - output: `[positions.len(), vocab]`, row `i` equal to [`CausalLm::forward`]'s
    ///   position `positions[i]`
    fn logits_at(&self, tokens: Tensor<B, 2, Int>, positions: &[usize]) -> Tensor<B, 2> {
        select_positions(self.forward(tokens), positions)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-piece tokenizer whose vocabulary merges a newline into other text, as BPE does:
    /// ids are indices into `VOCAB`, encoding is greedy longest match (`<s>` is never
    /// produced, an unknown character is `<e>`), decoding drops `<s>` and `</s>`.
    struct Merging;

    const VOCAB: [&str; 10] = [
        "<s>", "</s>", "x", "=5", "=5\n", "\n", "\n\n", ">", "ok", "<e>",
    ];

    impl Tokenizer for Merging {
        fn encode(&self, text: &str) -> Vec<u32> {
            let mut ids = Vec::new();
            let mut rest = text;
            while !rest.is_empty() {
                let (id, piece) = VOCAB
                    .iter()
                    .enumerate()
                    .skip(1)
                    .filter(|(_, p)| rest.starts_with(**p))
                    .max_by_key(|(_, p)| p.len())
                    .map(|(i, p)| (i as u32, *p))
                    .unwrap_or((9, &rest[..rest.chars().next().map_or(1, char::len_utf8)]));
                ids.push(id);
                rest = &rest[piece.len()..];
            }
            ids
        }
        fn decode(&self, ids: &[u32]) -> String {
            ids.iter()
                .filter(|&&i| i >= 2)
                .map(|&i| VOCAB.get(i as usize).copied().unwrap_or("?"))
                .collect()
        }
        fn vocab_size(&self) -> usize {
            VOCAB.len()
        }
        fn bos(&self) -> u32 {
            0
        }
        fn eos(&self) -> u32 {
            1
        }
        fn pad(&self) -> u32 {
            1
        }
    }

    #[test]
    fn a_step_ends_at_a_token_that_merges_the_newline() {
        let tok = Merging;
        let f = PromptFormat::Lines;
        // Every id whose text holds a newline stops a step, and EOS.
        assert_eq!(f.stop_tokens(&tok), vec![4, 5, 6, 1]);
        // "x=5\n" is generated as [x, "=5\n"]: the action is the text before the newline and
        // nothing more closes the line; a step cut short ("x=5") gets a newline.
        let generated = tok.encode("x=5\n");
        assert_eq!(generated, vec![2, 4]);
        assert_eq!(f.action_text(&tok, &generated), "x=5");
        assert!(f.close_action(&tok, &generated).is_empty());
        assert_eq!(f.close_action(&tok, &[2, 3]), vec![5]);
        assert_eq!(f.close_action(&tok, &[2, 1]), vec![5]);
        // Text after the newline inside the stopping token is not part of the action.
        assert_eq!(f.action_text(&tok, &[2, 3, 6]), "x=5");
        // Observations end their line; the task starts with BOS.
        assert_eq!(f.observation(&tok, ">ok"), vec![7, 8, 5]);
        assert_eq!(f.observation(&tok, ""), Vec::<u32>::new());
        assert_eq!(f.start(&tok, "x", Some("ignored by Lines")), vec![0, 2]);
        // A demonstrated action trains on its text and its newline.
        assert_eq!(f.demonstrated_action(&tok, "x=5"), (vec![2, 3, 5], vec![]));
    }

    #[test]
    fn chat_layout_of_an_episode() {
        let tok = Merging;
        let f = PromptFormat::Chat(ChatMarkup {
            system: String::new(),
            user: ">".into(),
            assistant: "ok".into(),
            end: "</s>".into(),
        });
        // Instructions, a blank line and the task as the user message, then the assistant's.
        assert_eq!(f.start(&tok, "x\n", Some("x")), vec![7, 2, 6, 2, 1, 5, 8]);
        // An action that ended with EOS (the end of a message) gets its newline; one cut
        // short gets the whole end of the message.
        assert_eq!(f.close_action(&tok, &[2, 1]), vec![5]);
        assert_eq!(f.close_action(&tok, &[2, 3]), vec![1, 5]);
        assert_eq!(f.observation(&tok, "x"), vec![7, 2, 1, 5, 8]);
        // The model learns to end its message: the end token is trained, the newline not.
        assert_eq!(f.demonstrated_action(&tok, "x=5"), (vec![2, 3, 1], vec![5]));
    }
}
