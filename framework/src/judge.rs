//! The generative step judge (framework/METHOD.md, step 3): a language model that reads the task, the
//! history, one step and the observation that followed it, and writes a verdict token, `+`
//! (the step is good) or `-` (bad). Each step is judged `m` times at a temperature; anything
//! but `+`/`-` is an invalid verdict (0, a format failure).
//!
//! Prompt (one line per field, so a character tokenizer sees clear boundaries):
//! ```text
//! T:<task>
//! H:<earlier steps, joined by '|'>
//! S:<the step>
//! O:<the observation>
//! V:
//! ```
//! An earlier step is its action alone (`history: Actions`, the default) or its action and
//! the observation that followed it, `action>observation` (`history: Steps`): only the
//! latter shows the judge what the judged step answered (the observation before it).

use crate::env::{Environment, Split};
use crate::experiment::JudgeHistory;
use crate::lm::{CausalLm, SampleParams, Tokenizer};
use crate::placement::PlacementError;
use crate::reward::Verdict;
use crate::rng::Rng;
use crate::rollout::{Trajectory, replay_demonstration, rollout};
use crate::sampling::Sampler;
use crate::shard::Spread;
use burn::prelude::*;

/// One judged policy step: the judge's prompt, its `m` sampled tokens and verdicts.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgedStep {
    /// Trajectory index.
    pub traj: usize,
    /// Step index within the trajectory.
    pub step: usize,
    /// BOS + prompt tokens.
    pub prompt: Vec<u32>,
    /// The token sampled by each vote.
    pub tokens: Vec<u32>,
    /// The parsed verdict of each vote.
    pub verdicts: Vec<Verdict>,
}

/// The judge prompt text for one step.
pub fn prompt_text(task: &str, history: &[&str], step: &str, observation: &str) -> String {
    format!(
        "T:{}\nH:{}\nS:{}\nO:{}\nV:",
        task.trim_end(),
        history.join("|"),
        step,
        observation.trim_end()
    )
}

/// The history entries of a prompt: each earlier step's action, or (`Steps`) its action and
/// the observation that followed it as `action>observation`.
fn history_entries(earlier: &[crate::rollout::StepSpan], history: JudgeHistory) -> Vec<String> {
    earlier
        .iter()
        .map(|s| match history {
            JudgeHistory::Actions => s.text.clone(),
            JudgeHistory::Steps => format!("{}>{}", s.text, s.observation.trim_end()),
        })
        .collect()
}

/// How a judge prompt is laid out: its longest length in tokens and what its history holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptLayout {
    /// The judge's context (the prompt gets `max_len − 1` tokens, room for the verdict).
    pub max_len: usize,
    /// What an earlier step shows.
    pub history: JudgeHistory,
}

/// BOS + the tokens of the prompt of step `i` of `t`, fitted into `layout.max_len − 1` tokens
/// (room for the verdict) by dropping the oldest history first, then the start of the text.
pub fn encode_prompt(
    tok: &dyn Tokenizer,
    t: &Trajectory,
    i: usize,
    layout: &PromptLayout,
) -> Vec<u32> {
    let max_len = layout.max_len;
    let step = &t.steps[i];
    let history = history_entries(&t.steps[..i], layout.history);
    let history: Vec<&str> = history.iter().map(String::as_str).collect();
    let budget = max_len.saturating_sub(2).max(1);
    let mut from = 0;
    let mut ids = tok.encode(&prompt_text(
        &t.prompt,
        &history[from..],
        &step.text,
        &step.observation,
    ));
    while ids.len() > budget && from < history.len() {
        from += 1;
        ids = tok.encode(&prompt_text(
            &t.prompt,
            &history[from..],
            &step.text,
            &step.observation,
        ));
    }
    if ids.len() > budget {
        ids.drain(..ids.len() - budget);
    }
    let mut out = Vec::with_capacity(ids.len() + 1);
    out.push(tok.bos());
    out.extend(ids);
    out
}

/// The token that means verdict `v` (`+` for a good step, `-` for a bad one).
pub fn verdict_token(tok: &dyn Tokenizer, good: bool) -> u32 {
    tok.encode(if good { "+" } else { "-" })
        .first()
        .copied()
        .unwrap_or(0)
}

/// Parses a sampled verdict token.
pub fn parse_verdict(tok: &dyn Tokenizer, token: u32) -> Verdict {
    match tok.decode(&[token]).as_str() {
        "+" => 1,
        "-" => -1,
        _ => 0,
    }
}

/// How many verdicts each step gets, drawn at which temperature.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Voting {
    /// Verdicts per step (`m`).
    pub votes: usize,
    /// The sampling temperature of each verdict.
    pub temperature: f64,
}

/// Judges every step of `trajs` as `voting` says, in one batched call.
pub fn judge_steps<B: Backend, M: CausalLm<B>>(
    judge: &M,
    tok: &dyn Tokenizer,
    history: JudgeHistory,
    trajs: &[Trajectory],
    voting: Voting,
    rng: &mut Rng,
    spread: &Spread,
) -> Result<Vec<JudgedStep>, PlacementError> {
    let layout = PromptLayout {
        max_len: judge.max_seq_len(),
        history,
    };
    let mut judged: Vec<JudgedStep> = Vec::new();
    for (ti, t) in trajs.iter().enumerate() {
        for si in 0..t.steps.len() {
            judged.push(JudgedStep {
                traj: ti,
                step: si,
                prompt: encode_prompt(tok, t, si, &layout),
                tokens: Vec::with_capacity(voting.votes),
                verdicts: Vec::with_capacity(voting.votes),
            });
        }
    }
    cast_votes(judge, tok, &mut judged, voting, rng, spread)?;
    Ok(judged)
}

/// Fills each judged step's `voting.votes` tokens and verdicts. The logits come from
/// [`for_each_logits`]; the votes are drawn afterwards in prompt order, so the verdicts are
/// those of one thread whatever the shards, and every peer of a placement draws every vote.
fn cast_votes<B: Backend, M: CausalLm<B>>(
    judge: &M,
    tok: &dyn Tokenizer,
    judged: &mut [JudgedStep],
    voting: Voting,
    rng: &mut Rng,
    spread: &Spread,
) -> Result<(), PlacementError> {
    let Voting { votes, temperature } = voting;
    if judged.is_empty() || votes == 0 {
        return Ok(());
    }
    // A verdict is one token: the m votes are m draws from the same next-token distribution,
    // so each prompt is run through the judge once (not once per vote); the draws use the
    // models' own sampler, one uniform per vote.
    let mut sampler = Sampler::default();
    let prompts: Vec<&[u32]> = judged.iter().map(|j| j.prompt.as_slice()).collect();
    let mut rows_of = Vec::with_capacity(judged.len());
    for_each_logits(judge, tok, &prompts, spread, |_, rows| {
        rows_of.push(
            rows.iter()
                .map(|row| {
                    (0..votes)
                        .map(|_| sampler.sample(row, temperature, 1.0, rng).0)
                        .collect::<Vec<u32>>()
                })
                .collect::<Vec<_>>(),
        );
    })?;
    for (j, tokens) in judged.iter_mut().zip(rows_of.into_iter().flatten()) {
        j.verdicts = tokens.iter().map(|&t| parse_verdict(tok, t)).collect();
        j.tokens = tokens;
    }
    Ok(())
}

/// Runs `prompts` through `judge` in passes of a bounded size and hands each pass's
/// next-token logits to `f(first prompt index, rows)`, in prompt order. With `shards > 1` a
/// pass's prompts are split into that many groups whose logits are computed at once; a row's
/// logits do not depend on the rows beside it. Spread over a placement's peers, each computes
/// its groups' logits and every peer receives every row.
pub fn for_each_logits<B: Backend, M: CausalLm<B>>(
    judge: &M,
    tok: &dyn Tokenizer,
    prompts: &[&[u32]],
    spread: &Spread,
    mut f: impl FnMut(usize, &[Vec<f32>]),
) -> Result<(), PlacementError> {
    let Some(device) = judge.devices().into_iter().next() else {
        return Ok(());
    };
    // Rows per pass: VOTE_BATCH, fewer when prompts are long (activations grow with
    // rows × length).
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(1).max(1);
    let rows = (VOTE_TOKENS / longest).clamp(1, VOTE_BATCH);
    for (c, chunk) in prompts.chunks(rows).enumerate() {
        let groups: Vec<_> = crate::shard::ranges(chunk.len(), spread.shards)
            .into_iter()
            .map(|r| (judge.clone(), &chunk[r]))
            .collect();
        let logits = crate::shard::map_placed_rows(
            &spread.placement,
            groups,
            "judge logits",
            |(model, group)| last_logits(&model, group, tok.pad(), &device),
        )?;
        f(c * rows, &logits);
    }
    Ok(())
}

/// Judge prompts run through the model per forward pass, at most.
const VOTE_BATCH: usize = 256;

/// Prompt tokens per forward pass, at most (unless one prompt is longer).
const VOTE_TOKENS: usize = 65_536;

/// Next-token logits after each prompt (host copies, one `Vec` per prompt).
///
/// # Shapes
/// - model input: `[n, longest prompt]`, right-padded; output `[n, vocab]`
fn last_logits<B: Backend, M: CausalLm<B>>(
    model: &M,
    prompts: &[&[u32]],
    pad: u32,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let n = prompts.len();
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(1).max(1);
    let mut ids = vec![i64::from(pad); n * width];
    for (r, p) in prompts.iter().enumerate() {
        for (c, &t) in p.iter().enumerate() {
            ids[r * width + c] = i64::from(t);
        }
    }
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [n, width]), device);
    let lengths: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    // [n, vocab]
    let picked = model.last_logits(tokens, &lengths);
    let vocab = picked.dims()[1];
    let flat: Vec<f32> = picked
        .into_data()
        .convert::<f32>()
        .to_vec()
        .unwrap_or_default();
    flat.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// What a step faced and what it did, as text: the last line of the context before the step
/// (the task's last line for the first step, else the last line of the observation before
/// it) and the step's action, both trimmed. On the corridor, `(after: "6", action: "L")` is
/// an `L` answered at a door showing 6. A labeller's misconception names one
/// (`judge.warm_start.misconceptions`): every step in that situation gets the opposite of the
/// oracle's label, a systematic error that a judge can learn, unlike random label noise.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Situation {
    /// The last line of the context before the step, trimmed.
    pub after: String,
    /// The step's action, trimmed.
    pub action: String,
}

impl Situation {
    /// `after:action`, how metric keys name it (`env/situation/6:L`).
    pub fn key(&self) -> String {
        format!("{}:{}", self.after, self.action)
    }

    /// Whether a file's situation can match a step: `action` non-empty, both fields trimmed
    /// (a step's situation is compared trimmed).
    pub fn is_well_formed(&self) -> bool {
        !self.action.is_empty()
            && self.action == self.action.trim()
            && self.after == self.after.trim()
    }

    /// The situation of step `i` of `t` (`i < t.steps.len()`).
    pub fn of(t: &Trajectory, i: usize) -> Self {
        let before = match i {
            0 => t.prompt.as_str(),
            _ => t.steps[i - 1].observation.as_str(),
        };
        let after = before
            .trim_end()
            .rsplit('\n')
            .next()
            .unwrap_or_default()
            .trim();
        Self {
            after: after.to_string(),
            action: t.steps[i].text.trim().to_string(),
        }
    }
}

/// The label a labeller with `misconceptions` gives a step the oracle labels `oracle`: the
/// opposite in a misconceived situation, the oracle's otherwise.
pub fn misconceived_label(
    oracle: bool,
    situation: &Situation,
    misconceptions: &[Situation],
) -> bool {
    oracle ^ misconceptions.contains(situation)
}

/// How many labelled steps to collect for the judge's warm start, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelSpec {
    /// Labelled steps collected.
    pub n: usize,
    /// Probability that a label is flipped.
    pub label_noise: f64,
    /// Situations whose label the labeller inverts (before the noise), [`Situation`].
    pub misconceptions: Vec<Situation>,
    /// How the prompts are laid out (fitted into the judge's context).
    pub layout: PromptLayout,
    /// Most policy steps per episode.
    pub max_env_steps: usize,
}

/// One labelled example of the judge's supervised fit: its prompt, the label it is trained
/// on (the oracle's, flipped when label noise struck) and what is known only to a study of
/// the fit — the oracle's own label and the environment's kind of step.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledStep {
    /// BOS + the judge's prompt tokens.
    pub prompt: Vec<u32>,
    /// The label the judge is trained on.
    pub label: bool,
    /// The oracle's label (`label` unless noise flipped it).
    pub oracle: bool,
    /// [`crate::StepResult::kind`] (empty when not classified).
    pub kind: String,
}

/// Oracle-labelled judge examples for the judge's warm start: `spec.n` steps of `policy`'s
/// own rollouts (sampled with `params`, random difficulties) in episode order, each label
/// inverted in a misconceived situation and then flipped with probability `spec.label_noise`.
pub fn labelled_steps<B: Backend, P: CausalLm<B>>(
    policy: &P,
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    spec: &LabelSpec,
    params: &SampleParams,
    rng: &mut Rng,
) -> Vec<LabelledStep> {
    let LabelSpec {
        n,
        label_noise,
        ref misconceptions,
        layout,
        max_env_steps,
    } = *spec;
    let dims = env.difficulty_space().len();
    let mut out = Vec::with_capacity(n);
    // A bounded number of rounds: an environment whose episodes take no step cannot loop forever.
    for _round in 0..1000 {
        if out.len() >= n {
            break;
        }
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let d: Vec<f64> = (0..dims).map(|_| rng.uniform()).collect();
                (d, Split::Train, rng.next_u64())
            })
            .collect();
        let episodes = (0..32).zip(env.sample_many(&tasks)).collect();
        let trajs = rollout(policy, tok, episodes, params, max_env_steps, rng);
        for t in &trajs {
            for i in 0..t.steps.len() {
                if out.len() < n {
                    let oracle = t.steps[i].oracle;
                    let believed = misconceived_label(oracle, &Situation::of(t, i), misconceptions);
                    out.push(LabelledStep {
                        prompt: encode_prompt(tok, t, i, &layout),
                        label: believed ^ rng.bernoulli(label_noise),
                        oracle,
                        kind: t.steps[i].kind.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Verdicts regrouped as `[trajectory][step] → m verdicts`.
pub fn by_trajectory(judged: &[JudgedStep], trajs: &[Trajectory]) -> Vec<Vec<Vec<Verdict>>> {
    let mut out: Vec<Vec<Vec<Verdict>>> = trajs
        .iter()
        .map(|t| vec![Vec::new(); t.steps.len()])
        .collect();
    for j in judged {
        out[j.traj][j.step] = j.verdicts.clone();
    }
    out
}

/// One step of the judge's evaluation pool: its prompt, the oracle's label and the
/// environment's kind of step (empty when not classified).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStep {
    /// The judge's prompt tokens for the step.
    pub prompt: Vec<u32>,
    /// The oracle's label.
    pub label: bool,
    /// [`crate::StepResult::kind`].
    pub kind: String,
    /// What the step faced and did.
    pub situation: Situation,
}

/// A balanced, fixed pool of oracle-labelled steps on which every evaluation measures the
/// judge (the same pool for every row of an ablation: it depends only on the environment,
/// the seed and the judge's prompt layout, never on a policy). Steps come from the flawed
/// expert's solutions (slip probability `noise`) of tasks spread over the in-domain eval
/// grid, replayed through the environment for their observations and oracle labels; half
/// are labelled correct, half wrong (fewer of one kind only if the environment cannot
/// produce them).
pub fn labelled_pool(
    env: &dyn Environment,
    tok: &dyn Tokenizer,
    layout: &PromptLayout,
    n: usize,
    noise: f64,
    seed: u64,
) -> Vec<PoolStep> {
    let dims = env.difficulty_space().len();
    let levels = env.eval_levels();
    let mut rng = Rng::derive(seed, "judge-pool");
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    let half = n / 2;
    for i in 0..n.saturating_mul(50).max(1) {
        if pos.len() >= half && neg.len() >= n - half {
            break;
        }
        let level = levels.get(i % levels.len().max(1)).copied().unwrap_or(0.5);
        let d = vec![level; dims];
        let task_seed = rng.next_u64();
        let t = replay_demonstration(env, &d, noise, task_seed);
        for (j, step) in t.steps.iter().enumerate() {
            let (bucket, cap) = if step.oracle {
                (&mut pos, half)
            } else {
                (&mut neg, n - half)
            };
            if bucket.len() < cap {
                bucket.push(PoolStep {
                    prompt: encode_prompt(tok, &t, j, layout),
                    label: step.oracle,
                    kind: step.kind.clone(),
                    situation: Situation::of(&t, j),
                });
            }
        }
    }
    pos.into_iter().chain(neg).collect()
}

/// The judge's majority verdicts on the pool's prompts (one entry per pool step).
pub fn judge_prompts<B: Backend, M: CausalLm<B>>(
    judge: &M,
    tok: &dyn Tokenizer,
    prompts: &[PoolStep],
    voting: Voting,
    rng: &mut Rng,
    spread: &Spread,
) -> Result<Vec<JudgedStep>, PlacementError> {
    let mut judged: Vec<JudgedStep> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| JudgedStep {
            traj: i,
            step: 0,
            prompt: p.prompt.clone(),
            tokens: Vec::with_capacity(voting.votes),
            verdicts: Vec::with_capacity(voting.votes),
        })
        .collect();
    cast_votes(judge, tok, &mut judged, voting, rng, spread)?;
    Ok(judged)
}

/// The judge's accuracy against oracle labels, by label (framework/METHOD.md, "What the paper
/// measures"): its majority verdict is right on a correct step when it is `+`, on a wrong
/// step when it is `−` (ties and format failures are wrong on both).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JudgeQuality {
    /// Accuracy on steps the oracle labels correct (p⁺); `None` without such steps.
    pub pos_acc: Option<f64>,
    /// Accuracy on steps the oracle labels wrong (p⁻); `None` without such steps.
    pub neg_acc: Option<f64>,
}

impl JudgeQuality {
    /// `(p⁺ + p⁻) / 2`, when both are defined: what a judge that always says `+` cannot fake.
    pub fn balanced(&self) -> Option<f64> {
        Some((self.pos_acc? + self.neg_acc?) / 2.0)
    }

    /// Writes `<prefix>_pos_acc`, `<prefix>_neg_acc` and `<prefix>_bal_acc` (those defined).
    pub fn set(&self, m: &mut crate::rundir::Metrics, prefix: &str) {
        self.set_suffixed(m, prefix, "");
    }

    /// The same for the steps of one kind: `<prefix>_pos_acc/<kind>`, and so on.
    pub fn set_for_kind(&self, m: &mut crate::rundir::Metrics, prefix: &str, kind: &str) {
        self.set_suffixed(m, prefix, &format!("/{kind}"));
    }

    fn set_suffixed(&self, m: &mut crate::rundir::Metrics, prefix: &str, suffix: &str) {
        for (name, v) in [
            ("pos_acc", self.pos_acc),
            ("neg_acc", self.neg_acc),
            ("bal_acc", self.balanced()),
        ] {
            if let Some(v) = v {
                m.set(&format!("{prefix}_{name}{suffix}"), v);
            }
        }
    }
}

/// Scores majority verdicts against oracle labels: `(oracle label, verdicts)` per step.
pub fn quality<'a>(steps: impl IntoIterator<Item = (bool, &'a [Verdict])>) -> JudgeQuality {
    score(
        steps
            .into_iter()
            .map(|(oracle, verdicts)| (oracle, crate::reward::majority(verdicts))),
    )
}

/// [`quality`] for each kind of step apart: `(kind, oracle label, verdicts)` per step;
/// unclassified steps (empty kind) are left out. Kinds in name order.
pub fn quality_by_kind<'a>(
    steps: impl IntoIterator<Item = (&'a str, bool, &'a [Verdict])>,
) -> Vec<(String, JudgeQuality)> {
    let mut by_kind: std::collections::BTreeMap<&str, Vec<(bool, &[Verdict])>> = Default::default();
    for (kind, label, verdicts) in steps {
        if !kind.is_empty() {
            by_kind.entry(kind).or_default().push((label, verdicts));
        }
    }
    by_kind
        .into_iter()
        .map(|(kind, steps)| (kind.to_string(), quality(steps)))
        .collect()
}

/// Scores single votes against oracle labels (every vote counts on its own, no majority):
/// the per-vote p⁺ and p⁻. With `m` votes per step drawn from one distribution this is the
/// judge's accuracy before the majority sharpens (or blurs) it.
pub fn vote_quality<'a>(steps: impl IntoIterator<Item = (bool, &'a [Verdict])>) -> JudgeQuality {
    score(
        steps
            .into_iter()
            .flat_map(|(oracle, verdicts)| verdicts.iter().map(move |&v| (oracle, v))),
    )
}

/// The share of votes that parse as a verdict (`+` or `-`; 0 marks a format failure), over
/// every vote of `steps`; `None` without votes.
pub fn format_ok<'a>(steps: impl IntoIterator<Item = &'a [Verdict]>) -> Option<f64> {
    let (mut ok, mut n) = (0usize, 0usize);
    for v in steps.into_iter().flatten() {
        n += 1;
        ok += usize::from(*v != 0);
    }
    (n > 0).then(|| ok as f64 / n as f64)
}

/// p⁺ and p⁻ of `(oracle label, verdict)` pairs: a verdict is right when it is `+` on a
/// correct step and `−` on a wrong one (anything else is wrong on both).
fn score(pairs: impl Iterator<Item = (bool, Verdict)>) -> JudgeQuality {
    let (mut hit_pos, mut n_pos, mut hit_neg, mut n_neg) = (0usize, 0usize, 0usize, 0usize);
    for (oracle, v) in pairs {
        if oracle {
            n_pos += 1;
            hit_pos += usize::from(v == 1);
        } else {
            n_neg += 1;
            hit_neg += usize::from(v == -1);
        }
    }
    let frac = |a: usize, b: usize| (b > 0).then(|| a as f64 / b as f64);
    JudgeQuality {
        pos_acc: frac(hit_pos, n_pos),
        neg_acc: frac(hit_neg, n_neg),
    }
}

#[cfg(test)]
mod tests {
    use crate::sampling::Sampler;

    fn sample_token(logits: &[f32], t: f64, rng: &mut crate::rng::Rng) -> u32 {
        Sampler::default().sample(logits, t, 1.0, rng).0
    }

    fn span(text: &str, observation: &str, oracle: bool) -> crate::rollout::StepSpan {
        crate::rollout::StepSpan::of_text(text, observation, oracle)
    }

    #[test]
    fn a_situation_is_the_line_before_the_step_and_its_action() {
        let t = super::Trajectory {
            task: 0,
            tokens: vec![],
            steps: vec![span(" L ", "2\n", false), span("R", "", true)],
            outcome: false,
            prompt: "L if sign<5 else R\n7\n".into(),
            finite: true,
        };
        let at = |after: &str, action: &str| super::Situation {
            after: after.into(),
            action: action.into(),
        };
        // The first step answers the prompt's last line; the second the observation before it.
        assert_eq!(super::Situation::of(&t, 0), at("7", "L"));
        assert_eq!(super::Situation::of(&t, 1), at("2", "R"));
        let wrong_l_at_6 = [at("6", "L")];
        assert!(super::misconceived_label(
            false,
            &at("6", "L"),
            &wrong_l_at_6
        ));
        assert!(!super::misconceived_label(
            true,
            &at("6", "L"),
            &wrong_l_at_6
        ));
        assert!(!super::misconceived_label(
            false,
            &at("6", "R"),
            &wrong_l_at_6
        ));
        assert!(super::misconceived_label(true, &at("7", "R"), &[]));
    }

    #[test]
    fn pool_situations_name_the_sign_each_step_answers() {
        use crate::testing::{Doors, DoorsEpisode, Letters};
        let layout = super::PromptLayout {
            max_len: 64,
            history: crate::experiment::JudgeHistory::Steps,
        };
        let pool = super::labelled_pool(&Doors { k: 6 }, &Letters, &layout, 200, 0.5, 3);
        assert_eq!(pool.len(), 200);
        let mut misconceived = 0;
        for p in &pool {
            // The situation reads the sign and the answer; the oracle's label follows from them.
            let sign: u8 = p.situation.after.parse().expect("a digit");
            assert_eq!(
                p.label,
                p.situation.action == DoorsEpisode::answer(sign),
                "{p:?}"
            );
            let wrong_l_at_6 = [super::Situation {
                after: "6".into(),
                action: "L".into(),
            }];
            let believed = super::misconceived_label(p.label, &p.situation, &wrong_l_at_6);
            if believed != p.label {
                misconceived += 1;
                assert_eq!(
                    (sign, p.situation.action.as_str(), believed),
                    (6, "L", true)
                );
            }
        }
        assert!(misconceived > 0);
    }

    #[test]
    fn format_ok_counts_every_vote_that_is_a_verdict() {
        let steps: [&[i8]; 3] = [&[1, 0, -1], &[0, 0, 0], &[1]];
        // 4 of the 7 votes are format failures (one in the first step, three in the second).
        assert_eq!(super::format_ok(steps), Some(3.0 / 7.0));
        assert_eq!(super::format_ok(std::iter::empty::<&[i8]>()), None);
    }

    #[test]
    fn votes_are_draws_from_the_tempered_softmax() {
        let mut rng = crate::rng::Rng::new(5);
        // Temperature 0: the argmax; non-finite logits are never drawn.
        assert_eq!(sample_token(&[0.1, 2.0, f32::NAN], 0.0, &mut rng), 1);
        assert_eq!(sample_token(&[f32::NEG_INFINITY, -1.0], 1.0, &mut rng), 1);
        // softmax([0, ln 3]) = (1/4, 3/4); at temperature 2: (1/(1+√3), √3/(1+√3)) = (0.366, 0.634).
        for (t, p1) in [(1.0, 0.75), (2.0, 3f64.sqrt() / (1.0 + 3f64.sqrt()))] {
            let n = 20_000;
            let ones = (0..n)
                .filter(|_| sample_token(&[0.0, 3f32.ln()], t, &mut rng) == 1)
                .count();
            let freq = ones as f64 / n as f64;
            assert!((freq - p1).abs() < 0.015, "T {t}: {freq} vs {p1}");
        }
    }
    use super::*;

    #[test]
    fn prompt_layout() {
        assert_eq!(
            prompt_text("7+5-3\n", &["7+5=12"], "12-3=9", ""),
            "T:7+5-3\nH:7+5=12\nS:12-3=9\nO:\nV:"
        );
    }

    /// With `Steps`, the judge sees the observation each earlier step got, so the one the
    /// judged step answered (a corridor's sign) is in its prompt; `Actions` leaves it out.
    #[test]
    fn the_history_holds_observations_only_with_steps() {
        let step = |text: &str, observation: &str| span(text, observation, true);
        let earlier = [step("L", "9\n"), step("R", "3\n")];
        assert_eq!(
            history_entries(&earlier, JudgeHistory::Actions),
            vec!["L", "R"]
        );
        assert_eq!(
            history_entries(&earlier, JudgeHistory::Steps),
            vec!["L>9", "R>3"]
        );
        let h = history_entries(&earlier, JudgeHistory::Steps);
        let h: Vec<&str> = h.iter().map(String::as_str).collect();
        assert_eq!(
            prompt_text("L if sign<5 else R\n1\n", &h, "L", "7"),
            "T:L if sign<5 else R\n1\nH:L>9|R>3\nS:L\nO:7\nV:"
        );
    }

    #[test]
    fn quality_by_kind_splits_and_leaves_unclassified_steps_out() {
        let (plus, minus): (&[Verdict], &[Verdict]) = (&[1, 1, -1], &[-1, -1, 1]);
        let steps = [
            ("borderline", true, plus),   // right
            ("borderline", true, minus),  // wrong
            ("borderline", false, minus), // right
            ("clear", true, plus),        // right
            ("", false, plus),            // unclassified: left out
        ];
        let q = quality_by_kind(steps);
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].0, "borderline");
        assert_eq!((q[0].1.pos_acc, q[0].1.neg_acc), (Some(0.5), Some(1.0)));
        assert_eq!(q[0].1.balanced(), Some(0.75));
        assert_eq!(q[1].0, "clear");
        assert_eq!((q[1].1.pos_acc, q[1].1.neg_acc), (Some(1.0), None));
        let mut m = crate::rundir::Metrics::new(0);
        q[0].1.set_for_kind(&mut m, "judge/eval", &q[0].0);
        assert_eq!(m.get("judge/eval_bal_acc/borderline"), Some(0.75));
        assert_eq!(m.get("judge/eval_pos_acc/borderline"), Some(0.5));
    }

    #[test]
    fn quality_hand_computed() {
        // Correct steps judged (+,+,−) right, (+,0,+) right, (−,−,+) wrong: p⁺ = 2/3.
        // Wrong steps judged (−,−,−) right, (+,−,0) tie → wrong: p⁻ = 1/2. Balanced 7/12.
        let steps: Vec<(bool, Vec<i8>)> = vec![
            (true, vec![1, 1, -1]),
            (true, vec![1, 0, 1]),
            (true, vec![-1, -1, 1]),
            (false, vec![-1, -1, -1]),
            (false, vec![1, -1, 0]),
        ];
        let q = quality(steps.iter().map(|(o, v)| (*o, v.as_slice())));
        assert!((q.pos_acc.unwrap_or(0.0) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(q.neg_acc, Some(0.5));
        assert!((q.balanced().unwrap_or(0.0) - 7.0 / 12.0).abs() < 1e-12);
        // Only correct steps: p⁻ and the balanced accuracy are undefined, not 0.
        let q = quality([(true, [1i8].as_slice())]);
        assert_eq!(
            (q.pos_acc, q.neg_acc, q.balanced()),
            (Some(1.0), None, None)
        );
        // Single votes of the five steps above: right steps 5 of 9 are `+`; wrong steps 4 of 6
        // are `−` (the format failure counts as wrong).
        let v = vote_quality(steps.iter().map(|(o, v)| (*o, v.as_slice())));
        assert!((v.pos_acc.unwrap_or(0.0) - 5.0 / 9.0).abs() < 1e-12);
        assert!((v.neg_acc.unwrap_or(0.0) - 4.0 / 6.0).abs() < 1e-12);
        let mut m = crate::rundir::Metrics::new(1);
        q.set(&mut m, "judge/eval");
        assert_eq!(m.get("judge/eval_pos_acc"), Some(1.0));
        assert_eq!(m.get("judge/eval_bal_acc"), None);
    }
}
