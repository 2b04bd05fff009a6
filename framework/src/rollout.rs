//! Multi-turn rollouts: the policy writes one step (one line) at a time, the environment
//! answers with an observation, until the episode ends or the step budget runs out. Every
//! active episode of every task advances together in one batched [`CausalLm::extend`] call per
//! turn, which reads only what is new in each context (the model keeps the rest cached).

use crate::env::{Environment, Episode, Split, StepResult};
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::placement::PlacementError;
use crate::rng::Rng;
use crate::shard::Spread;
use burn::prelude::Backend;
use serde::{Deserialize, Serialize};

/// One step the policy took: where its tokens sit in the trajectory's token sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSpan {
    /// First generated token of the step (index into `Trajectory::tokens`).
    pub start: usize,
    /// One past the last generated token of the step.
    pub end: usize,
    /// The action text the environment received.
    pub text: String,
    /// The environment's oracle label for the step.
    pub oracle: bool,
    /// The observation the environment answered with.
    pub observation: String,
    /// Difficulty dimensions the step exercises ([`StepResult::dims`]: task structure, not
    /// correctness); with the judge's verdicts, the default critic feedback.
    pub dims: Vec<usize>,
    /// The oracle's attribution of the step's failure ([`StepResult::blame`]; empty when
    /// correct); only the upper-bound `critic: Oracle` uses it.
    pub oracle_blame: Vec<usize>,
    /// The environment's kind of step ([`StepResult::kind`]; empty when not classified).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

impl StepSpan {
    /// A test's step: action `text` answered with `observation`, labelled `oracle`, no tokens.
    #[cfg(test)]
    pub(crate) fn of_text(text: &str, observation: &str, oracle: bool) -> Self {
        Self {
            start: 0,
            end: 0,
            text: text.into(),
            oracle,
            observation: observation.into(),
            dims: Vec::new(),
            oracle_blame: Vec::new(),
            kind: String::new(),
        }
    }

    /// The step of tokens `start..end` with action `text`, as the environment answered it.
    fn answered(start: usize, end: usize, text: String, result: StepResult) -> Self {
        Self {
            start,
            end,
            text,
            oracle: result.label,
            observation: result.observation,
            dims: result.dims,
            oracle_blame: if result.label {
                Vec::new()
            } else {
                result.blame
            },
            kind: result.kind,
        }
    }
}

/// One played-out episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Which task (group) of the batch it belongs to.
    pub task: usize,
    /// BOS, prompt, and every step and observation, as the policy saw them.
    pub tokens: Vec<u32>,
    /// The policy's steps, in order.
    pub steps: Vec<StepSpan>,
    /// The verifier's verdict.
    pub outcome: bool,
    /// The task text.
    pub prompt: String,
    /// Whether every generated token had a finite log-probability (a NaN/Inf model is caught
    /// here even when no update would have computed a loss).
    pub finite: bool,
}

impl Trajectory {
    /// Number of tokens the policy generated.
    pub fn generated_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.end - s.start).sum()
    }
}

/// Plays `episodes` (paired with their task index) to the end with `model`.
///
/// A step is at most `params.max_new_tokens` tokens and ends at the step delimiter; an
/// episode ends when the environment says so, after `max_env_steps` steps, or when its
/// context would no longer fit in the model.
pub fn rollout<B: Backend, M: CausalLm<B>>(
    model: &M,
    tok: &dyn Tokenizer,
    episodes: Vec<(usize, Box<dyn Episode>)>,
    params: &SampleParams,
    max_env_steps: usize,
    rng: &mut Rng,
) -> Vec<Trajectory> {
    let format = tok.prompt_format();
    let mut finite = vec![true; episodes.len()];
    // The model keeps what each episode has read; a turn appends only what is new.
    let mut contexts = model.contexts(episodes.len());
    // Per episode: how many of its context tokens the model has read or generated.
    let mut known = vec![0usize; episodes.len()];
    // (task, episode, context tokens, steps taken) per episode.
    type Live = (usize, Box<dyn Episode>, Vec<u32>, Vec<StepSpan>);
    let mut eps: Vec<Live> = episodes
        .into_iter()
        .map(|(task, ep)| {
            let ctx = format.start(tok, &ep.prompt(), ep.instructions().as_deref());
            (task, ep, ctx, Vec::new())
        })
        .collect();

    for _turn in 0..max_env_steps {
        let active: Vec<usize> = (0..eps.len())
            .filter(|&i| {
                let (_, ep, ctx, _) = &eps[i];
                !ep.done() && ctx.len() + params.max_new_tokens < model.max_seq_len()
            })
            .collect();
        if active.is_empty() {
            break;
        }
        let appended: Vec<Vec<u32>> = active
            .iter()
            .map(|&i| eps[i].2[known[i]..].to_vec())
            .collect();
        let gens = model.extend(&mut contexts, &active, &appended, params, rng);
        let texts: Vec<String> = gens
            .iter()
            .map(|g| format.action_text(tok, &g.tokens))
            .collect();
        // Every episode's step starts before any is awaited (environments in other
        // processes advance in parallel).
        for (&i, text) in active.iter().zip(&texts) {
            eps[i].1.submit(text);
        }
        for ((&i, g), text) in active.iter().zip(gens).zip(texts) {
            finite[i] &= g.logprobs.iter().all(|l| l.is_finite());
            let (_, ep, ctx, steps) = &mut eps[i];
            let start = ctx.len();
            ctx.extend_from_slice(&g.tokens);
            let end = ctx.len();
            known[i] = end;
            // A step cut short still ends its line (or message) in the context, untrained.
            ctx.extend(format.close_action(tok, &g.tokens));
            let result = ep.step(&text);
            if !ep.done() || !result.observation.is_empty() {
                ctx.extend(format.observation(tok, &result.observation));
            }
            steps.push(StepSpan::answered(start, end, text, result));
        }
    }

    eps.into_iter()
        .zip(finite)
        .map(|((task, ep, tokens, steps), finite)| Trajectory {
            task,
            finite,
            outcome: ep.outcome(),
            prompt: ep.prompt(),
            tokens,
            steps,
        })
        .collect()
}

/// [`rollout`] in `shards` contiguous groups of the episodes, each on its own thread with
/// its own copy of the model and its own sampling stream, seeded from `rng` in group order;
/// the trajectories come back in the episodes' order (framework/METHOD.md, "Shards"). One
/// shard is [`rollout`] itself, drawing from `rng` directly. Spread over a placement's peers,
/// each peer plays its share of the groups (the others' episodes are never stepped) and every
/// peer gets every trajectory.
pub fn rollout_sharded<B: Backend, M: CausalLm<B>>(
    model: &M,
    tok: &dyn Tokenizer,
    episodes: Vec<(usize, Box<dyn Episode>)>,
    params: &SampleParams,
    max_env_steps: usize,
    rng: &mut Rng,
    spread: &Spread,
) -> Result<Vec<Trajectory>, PlacementError> {
    let shards = spread.shards;
    if shards <= 1 || episodes.len() < 2 {
        return Ok(rollout(model, tok, episodes, params, max_env_steps, rng));
    }
    // (model copy, episodes, seed of its sampling stream) per group.
    type Group<M> = (M, Vec<(usize, Box<dyn Episode>)>, u64);
    let mut rest = episodes.into_iter();
    let groups: Vec<Group<M>> = crate::shard::ranges(rest.len(), shards)
        .into_iter()
        .map(|r| {
            let episodes = rest.by_ref().take(r.len()).collect();
            (model.clone(), episodes, rng.next_u64())
        })
        .collect();
    let played = crate::shard::map_placed(
        &spread.placement,
        groups,
        "trajectories",
        |(model, episodes, seed)| {
            rollout(
                &model,
                tok,
                episodes,
                params,
                max_env_steps,
                &mut Rng::new(seed),
            )
        },
    )?;
    Ok(played.into_iter().flatten().collect())
}

/// The flawed expert's solution of the task `env.sample(d, Split::Train, seed)` (slip
/// probability `noise`), replayed in that task: each line with the observation the
/// environment answered, its oracle label and the dimensions it exercises, until the episode
/// ends. A trajectory without tokens (`tokens` empty, every span `0..0`): for the warm start's
/// demonstrations, the judge's labelled pool and `rlany env`.
pub fn replay_demonstration(env: &dyn Environment, d: &[f64], noise: f64, seed: u64) -> Trajectory {
    let (_, lines) = env.demonstration(d, noise, seed);
    let mut ep = env.sample(d, Split::Train, seed);
    let mut steps: Vec<StepSpan> = Vec::with_capacity(lines.len());
    for text in lines {
        if ep.done() {
            break;
        }
        let result = ep.step(&text);
        steps.push(StepSpan::answered(0, 0, text, result));
    }
    Trajectory {
        task: 0,
        tokens: Vec::new(),
        steps,
        outcome: ep.outcome(),
        prompt: ep.prompt(),
        finite: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Bigram, Doors, L, Letters, NL, R, digit_line};
    use burn::backend::NdArray;

    type B = NdArray<f32>;

    fn params(tok: &Letters, temperature: f64) -> SampleParams {
        SampleParams {
            temperature,
            top_p: 1.0,
            max_new_tokens: 4,
            stop_tokens: tok.prompt_format().stop_tokens(tok),
            on_device: false,
        }
    }

    /// A model that always answers `R` (then ends its line) plays four doors: every step is
    /// recorded with the environment's answer, at the tokens it generated, and the context
    /// reads task, action, observation, action, … with nothing after the last step.
    #[test]
    fn every_step_is_recorded_as_the_environment_answered_it() {
        let tok = Letters;
        let after_door: Vec<(u32, u32)> = (0..10).map(|d| (digit_line(d), R)).collect();
        let prefer = [after_door.as_slice(), &[(R, NL)]].concat();
        let model = Bigram::<B>::preferring(&prefer, 30.0, &Default::default());
        let env = Doors { k: 4 };
        let seeds = [1u64, 2, 3, 4, 5, 6];
        let episodes = seeds
            .iter()
            .enumerate()
            .map(|(i, &s)| (i, Box::new(env.episode(s)) as Box<dyn Episode>))
            .collect();
        let trajs = rollout(
            &model,
            &tok,
            episodes,
            &params(&tok, 0.0),
            10,
            &mut Rng::new(1),
        );
        assert_eq!(trajs.len(), seeds.len());
        for (t, &seed) in trajs.iter().zip(&seeds) {
            let signs = env.episode(seed).signs().to_vec();
            let mut want = vec![tok.bos(), digit_line(signs[0])];
            for i in 0..signs.len() {
                want.extend([R, NL]);
                if i + 1 < signs.len() {
                    want.push(digit_line(signs[i + 1]));
                }
            }
            assert_eq!(t.tokens, want, "seed {seed}");
            assert_eq!(t.steps.len(), 4);
            for (i, (step, &s)) in t.steps.iter().zip(&signs).enumerate() {
                assert_eq!((step.start, step.end), (2 + 3 * i, 4 + 3 * i));
                assert_eq!(step.text, "R");
                assert_eq!(step.oracle, s >= 5, "seed {seed} door {i}");
                let kind = if (3..=6).contains(&s) {
                    "borderline"
                } else {
                    "clear"
                };
                assert_eq!(step.kind, kind);
                assert_eq!(step.oracle_blame.is_empty(), step.oracle);
            }
            assert_eq!(t.outcome, signs.iter().all(|&s| s >= 5));
            assert!(t.finite);
        }
    }

    /// Sampled rollouts are a function of the stream: the same seed plays the same
    /// trajectories, another seed other ones.
    #[test]
    fn sampled_rollouts_are_a_function_of_the_seed() {
        let tok = Letters;
        let answers: Vec<(u32, u32)> = (0..10)
            .flat_map(|d| [(digit_line(d), L), (digit_line(d), R)])
            .chain([(L, NL), (R, NL)])
            .collect();
        let model = Bigram::<B>::preferring(&answers, 5.0, &Default::default());
        let env = Doors { k: 6 };
        let play = |seed: u64| {
            let episodes = (0..8)
                .map(|i| (i, Box::new(env.episode(i as u64)) as Box<dyn Episode>))
                .collect();
            rollout(
                &model,
                &tok,
                episodes,
                &params(&tok, 1.0),
                10,
                &mut Rng::new(seed),
            )
        };
        assert_eq!(play(7), play(7));
        assert_ne!(play(7), play(8));
        // Both answers occur: the model's two preferred tokens are equally likely.
        let texts: Vec<String> = play(7)
            .iter()
            .flat_map(|t| t.steps.iter().map(|s| s.text.clone()))
            .collect();
        assert!(texts.iter().any(|t| t == "L") && texts.iter().any(|t| t == "R"));
    }
}
