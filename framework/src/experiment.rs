//! The experiment schema: one RON file = one experiment = one pairing of components.
//!
//! These are the project's own serde types (not Burn configs): every field is explicit or
//! defaulted here, unknown fields and variants are rejected, and every error names the file
//! and, where it can, the line and column. `Experiment::load` parses and validates;
//! `Experiment::to_ron` writes the resolved form (every default filled in).
//!
//! The schema holds loop-level settings only. The environment and the adaptation rule are
//! type parameters: enums of plugins owned by the composition root (see [`crate::plugin`]),
//! each plugin's settings a typed struct that lives with the plugin.
//!
//! Enum variants that carry a struct are written without the extra parentheses
//! (`Ppo(clip: 0.2)`, `Scratch(d_model: 64)`): the RON extension `unwrap_variant_newtypes`
//! is always on.

use crate::check::{self, Checked, FieldError};
use crate::plugin::{AdaptationChoice, EnvironmentChoice};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// The file could not be read.
    #[error("{path}: cannot read the experiment file: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The RON did not parse into the schema (syntax, unknown field or variant, wrong type).
    #[error("{path}:{line}:{col}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What the parser expected.
        message: String,
    },
    /// A value parsed but is out of range.
    #[error("{path}{location}: `{field}` {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// `:line` where the field's key was found in the file, else empty.
        location: String,
        /// Dotted path of the field, e.g. `budget.group_size`.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
}

/// Which Burn backend runs the experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum BackendKind {
    /// The CPU backend (always compiled in).
    #[default]
    NdArray,
    /// Burn's newer CPU backend (needs the `flex` cargo feature): strided matrix products through the
    /// `gemm` crate, zero-copy views, SIMD element-wise ops, rayon for large tensors.
    Flex,
    /// WGPU (Vulkan/Metal/DX12); needs the `wgpu` cargo feature.
    Wgpu,
    /// CUDA device `n`; needs the `cuda` cargo feature.
    Cuda(usize),
}

impl BackendKind {
    /// Whether the backend computes on the host CPU, where tokens are drawn by the host sampler
    /// (the device is the host: nothing to save by sampling on it).
    pub fn is_cpu(self) -> bool {
        matches!(self, Self::NdArray | Self::Flex)
    }
}

/// The most data-parallel shards an experiment may ask for (one thread each).
pub const MAX_SHARDS: usize = 256;

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// The longest experiment name: it names a directory (`runs/<name>/`), and file systems
/// refuse names over 255 bytes; a margin leaves room for suffixes such as `.tmp`.
pub const MAX_NAME_LEN: usize = 120;

/// The root of an experiment file. `E` is the composition root's enum of environment plugins,
/// `A` its enum of adaptation rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "E: EnvironmentChoice, A: AdaptationChoice")
)]
pub struct Experiment<E, A> {
    /// Names the run directory `runs/<name>/seed-<n>/`.
    pub name: String,
    /// One run per seed; every random stream of a run derives from its seed.
    pub seeds: Vec<u64>,
    /// Backend, overridable with `--backend`.
    #[serde(default)]
    pub backend: BackendKind,
    /// Threads per run (framework/METHOD.md, "Shards"): every training batch (warm starts,
    /// PPO updates) is split into this many row groups run forward and backward on their own
    /// threads, gradients summed in group order; rollouts, evaluations and judge votes run in
    /// as many groups. Meant for CPU backends (a GPU gains nothing from it). Float sums and
    /// sampling streams depend on it, so it is part of the experiment: the same shards and
    /// seed give the same metrics on any machine. 1: one thread, the loop without shards.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub shards: usize,
    /// The environment plugin and its settings.
    pub environment: E,
    /// The policy model, its warm start and its sampling.
    pub policy: PolicySpec,
    /// The step judge (`None`: outcome reward only).
    #[serde(default)]
    pub judge: JudgeSpec,
    /// Reward shaping and data filters.
    #[serde(default)]
    pub reward: RewardSpec,
    /// The policy-gradient algorithm.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// How task difficulty adapts (`Static`: never).
    #[serde(default)]
    pub adaptation: A,
    /// When a task slot may propose: its running accuracy (window, rollouts).
    #[serde(default)]
    pub gate: crate::adapt::GateSpec,
    /// Where the proposer's critic feedback comes from (`Judge`: the method; `Oracle`: an
    /// upper bound).
    #[serde(default)]
    pub critic: crate::adapt::Critic,
    /// Sizes and schedule of the run.
    pub budget: Budget,
    /// Which implementation of the loss-side ops (token log-probs) the updates use.
    #[serde(default)]
    pub kernels: Kernels,
    /// Situations watched ([`crate::judge::Situation`], as a misconception names one): for
    /// each, how often the policy takes it — the share of its training steps after the line
    /// `after` that answer `action` (`env/situation/<after>:<action>`) — and how often the
    /// judge approves it: the share of majority `+` verdicts on the policy's steps in it
    /// (`judge/steps_approve/…`) and on the evaluation pool's (`judge/eval_approve/…`).
    /// Measuring only: nothing else a run does or logs changes. Empty by default (and then
    /// left out of the resolved file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub situations: Vec<crate::judge::Situation>,
    /// In an ablation suite: the experiment (by name) this row is compared with; the row
    /// above when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// In an ablation suite: further experiments (by name) this row is paired with in the
    /// report's paired table, after its baseline (a plan's second comparisons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compare: Vec<String>,
}

/// `Fused`: the backend's fused kernels (CubeCL on wgpu/cuda; the composition elsewhere).
/// `Reference`: the composed reference ops everywhere — for comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Kernels {
    /// The backend's fused kernels.
    #[default]
    Fused,
    /// The composed reference ops.
    Reference,
}

impl Kernels {
    /// The kernel crate's selector.
    pub fn choice(self) -> rlany_kernels::KernelChoice {
        match self {
            Kernels::Fused => rlany_kernels::KernelChoice::Fused,
            Kernels::Reference => rlany_kernels::KernelChoice::Reference,
        }
    }
}

/// Where a model's weights come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ModelSource {
    /// A decoder initialised from the run's seed with this architecture (it reads the
    /// character tokenizer's 100 ids).
    Scratch(ModelSpec),
    /// A pretrained model file, which brings its own architecture, tokenizer and chat
    /// template.
    Pretrained(PretrainedSpec),
}

/// A pretrained model: a GGUF file (llama.cpp's format) or a Hugging Face directory
/// (`config.json`, `*.safetensors`, `tokenizer.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainedSpec {
    /// The file or directory, relative to the directory `rlany` runs in (the repository
    /// root for the shipped experiments).
    pub path: String,
    /// Context to allocate, in tokens (capped by the model's own): the size of the rotary
    /// tables and of every KV cache.
    #[serde(default = "default_pretrained_context")]
    pub max_seq_len: usize,
    /// Train low-rank adapters instead of the weights (`None`: every weight is trained).
    /// Left out of the resolved file when `None`, so warm-start cache keys made before it
    /// stay valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSpec>,
    /// The dtype the pretrained weights are held and computed in. LoRA adapters stay f32
    /// (their products are cast to the activations' dtype), attention scores, softmax, the
    /// logits and the PPO loss are f32 whatever this says. Left out of the resolved file when `F32`, so
    /// warm-start cache keys made before it stay valid.
    #[serde(default, skip_serializing_if = "WeightDType::is_f32")]
    pub dtype: WeightDType,
}

/// The dtype of a pretrained model's weights and activations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum WeightDType {
    /// 32-bit floats (every backend).
    #[default]
    F32,
    /// bfloat16 (CUDA; Flex on the CPU, slowly; not NdArray or WGPU, which say so at start-up).
    Bf16,
}

impl WeightDType {
    fn is_f32(&self) -> bool {
        *self == WeightDType::F32
    }
}

fn default_pretrained_context() -> usize {
    1024
}

/// The projections of a Llama/Qwen2 block, by their Hugging Face module names (the names
/// PEFT's `target_modules` uses).
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// Low-rank adapters (LoRA, Hu et al., arXiv 2106.09685), with PEFT's field names and
/// defaults: each targeted projection `W` becomes `W + (lora_alpha / r) · A·B` with `W`
/// frozen, `A` (`d_in × r`) drawn uniformly in `±1/√d_in` and `B` (`r × d_out`) zero, so the
/// adapted model starts exactly at the base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    /// Rank of every adapter.
    #[serde(default = "default_lora_r")]
    pub r: usize,
    /// Scale numerator: the update is multiplied by `lora_alpha / r`.
    #[serde(default = "default_lora_alpha")]
    pub lora_alpha: f64,
    /// Dropout on an adapter's input while training. Only 0 for now: a dropout mask would
    /// come from the backend's global RNG, which neither the run's seed nor a checkpoint
    /// controls (the same seed would not give the same metrics, nor a resume the same run).
    #[serde(default)]
    pub lora_dropout: f64,
    /// The projections that get adapters (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `gate_proj`, `up_proj`, `down_proj`, or `all-linear` for all seven), in every block.
    #[serde(default = "default_lora_targets")]
    pub target_modules: Vec<String>,
}

fn default_lora_r() -> usize {
    8
}

fn default_lora_alpha() -> f64 {
    8.0
}

fn default_lora_targets() -> Vec<String> {
    vec!["q_proj".into(), "v_proj".into()]
}

impl Default for LoraSpec {
    fn default() -> Self {
        Self {
            r: default_lora_r(),
            lora_alpha: default_lora_alpha(),
            lora_dropout: 0.0,
            target_modules: default_lora_targets(),
        }
    }
}

impl LoraSpec {
    /// Range checks; every target must be a known projection name.
    pub fn validate(&self) -> Checked {
        check::count("r", self.r, 1, 4096)?;
        check::positive("lora_alpha", self.lora_alpha, 1.0e6)?;
        if self.lora_dropout != 0.0 {
            return Err(FieldError::new(
                "lora_dropout",
                format!(
                    "must be 0 (got {}): adapter dropout would draw from the backend's global \
                     RNG, which the run's seed and its checkpoints do not control",
                    self.lora_dropout
                ),
            ));
        }
        if self.target_modules.is_empty() {
            return Err(FieldError::new(
                "target_modules",
                "must name at least one projection",
            ));
        }
        for t in &self.target_modules {
            if t != "all-linear" && !LORA_TARGETS.contains(&t.as_str()) {
                return Err(FieldError::new(
                    "target_modules",
                    format!(
                        "unknown projection {t:?}: expected all-linear or one of {}",
                        LORA_TARGETS.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether the projection `name` (one of [`LORA_TARGETS`]) gets an adapter.
    pub fn targets(&self, name: &str) -> bool {
        self.target_modules
            .iter()
            .any(|t| t == name || t == "all-linear")
    }

    /// `lora_alpha / r`.
    pub fn scaling(&self) -> f64 {
        self.lora_alpha / self.r as f64
    }
}

impl Default for ModelSource {
    fn default() -> Self {
        Self::Scratch(ModelSpec::default())
    }
}

impl ModelSource {
    /// The architecture, when the experiment file states it.
    pub fn spec(&self) -> Option<&ModelSpec> {
        match self {
            ModelSource::Scratch(s) => Some(s),
            ModelSource::Pretrained(_) => None,
        }
    }

    /// The context the experiment allocates (a pretrained model's own may be shorter).
    pub fn max_seq_len(&self) -> usize {
        match self {
            ModelSource::Scratch(s) => s.max_seq_len,
            ModelSource::Pretrained(p) => p.max_seq_len,
        }
    }

    /// Range checks of the source (whether a pretrained file exists is checked where the
    /// model is built, by `rlany check` and `rlany run`).
    pub fn validate(&self) -> Checked {
        match self {
            ModelSource::Scratch(s) => s.validate(),
            ModelSource::Pretrained(p) => {
                if p.path.trim().is_empty() {
                    return Err(FieldError::new(
                        "path",
                        "must name a GGUF file or a directory",
                    ));
                }
                check::count("max_seq_len", p.max_seq_len, 8, MAX_SEQ)?;
                match &p.lora {
                    Some(l) => l.validate().map_err(|e| e.within("lora")),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A decoder-only transformer's architecture (Llama/Qwen2 family: RMSNorm, RoPE, grouped-query
/// attention, SwiGLU), shared by the policy and the judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSpec {
    /// Model width.
    pub d_model: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention); divides `heads`.
    pub kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub ffn: usize,
    /// Longest context in tokens (a judge's longer histories are cut, oldest first).
    pub max_seq_len: usize,
    /// Bias on the q/k/v projections (Qwen2 style).
    pub qkv_bias: bool,
}

impl Default for ModelSpec {
    fn default() -> Self {
        Self {
            d_model: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 192,
            max_seq_len: 128,
            qkv_bias: false,
        }
    }
}

impl ModelSpec {
    /// Range checks (field paths relative to the spec).
    pub fn validate(&self) -> Checked {
        check::count("d_model", self.d_model, 2, MAX_WIDTH)?;
        check::count("layers", self.layers, 1, MAX_LAYERS)?;
        check::count("heads", self.heads, 1, 256)?;
        check::count("kv_heads", self.kv_heads, 1, 256)?;
        check::count("ffn", self.ffn, 1, 4 * MAX_WIDTH)?;
        check::count("max_seq_len", self.max_seq_len, 8, MAX_SEQ)?;
        let (d, h, kv) = (self.d_model, self.heads, self.kv_heads);
        if d % h != 0 || (d / h) % 2 != 0 {
            return Err(FieldError::new(
                "heads",
                format!("must divide d_model into an even head size (d_model {d} / heads {h})"),
            ));
        }
        if h % kv != 0 {
            return Err(FieldError::new(
                "kv_heads",
                format!("must divide heads ({h} % {kv} != 0)"),
            ));
        }
        Ok(())
    }
}

/// The policy: its model, how it is prepared and how it samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySpec {
    /// The model.
    pub model: ModelSource,
    /// Supervised warm start on expert demonstrations.
    pub warm_start: WarmStart,
    /// How rollouts are sampled.
    pub sampling: Sampling,
}

/// Supervised warm start of the policy on (noisy) expert demonstrations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmStart {
    /// Optimiser steps (0 skips the warm start).
    pub steps: usize,
    /// Demonstrations per step.
    pub batch: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// The environment's flawed-expert noise in [0, 1] (each environment documents what its
    /// expert gets wrong), so that the warm-started policy starts mid-range.
    pub noise: f64,
    /// The range `(low, high)` in [0, 1] the demonstrations' difficulties are drawn from,
    /// uniformly and independently on every axis of the environment's difficulty space. The
    /// default (0, 1) covers the whole space; a range below the training difficulty makes the
    /// training tasks harder than anything demonstrated (a sparse start). Left out of the
    /// resolved file when (0, 1).
    #[serde(skip_serializing_if = "WarmStart::is_full_range")]
    pub difficulty: (f64, f64),
}

impl WarmStart {
    fn is_full_range(range: &(f64, f64)) -> bool {
        *range == (0.0, 1.0)
    }
}

impl Default for WarmStart {
    fn default() -> Self {
        Self {
            steps: 300,
            batch: 32,
            lr: 3e-3,
            noise: 0.6,
            difficulty: (0.0, 1.0),
        }
    }
}

/// Rollout sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// Softmax temperature for training rollouts (evaluation is always greedy).
    pub temperature: f64,
    /// Nucleus mass in (0, 1].
    pub top_p: f64,
    /// Most tokens in one step (one line).
    pub max_step_tokens: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            max_step_tokens: 16,
        }
    }
}

/// The step judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub enum JudgeSpec {
    /// No judge: the policy is trained on the outcome reward alone.
    #[default]
    None,
    /// A warm-started judge whose verdicts shape the policy's reward but which is not trained.
    Frozen(JudgeModelSpec),
    /// A judge trained by the consistency reward (framework/METHOD.md, step 5).
    Learned(JudgeModelSpec),
    /// A calibrated synthetic judge — an instrument, not part of the method
    /// (framework/METHOD.md, "The synthetic judge"): each vote is the environment's oracle
    /// label, flipped at random so that the judge's measured accuracy is `p_pos` on right
    /// steps and `p_neg` on wrong ones. No model, never trained.
    Oracle(OracleJudgeSpec),
}

impl JudgeSpec {
    /// The judge's settings, if there is a judge.
    pub fn model(&self) -> Option<&JudgeModelSpec> {
        match self {
            JudgeSpec::None | JudgeSpec::Oracle(_) => None,
            JudgeSpec::Frozen(m) | JudgeSpec::Learned(m) => Some(m),
        }
    }

    /// The judge's model settings, mutable (`None` without a judge).
    pub fn model_mut(&mut self) -> Option<&mut JudgeModelSpec> {
        match self {
            JudgeSpec::None | JudgeSpec::Oracle(_) => None,
            JudgeSpec::Frozen(m) | JudgeSpec::Learned(m) => Some(m),
        }
    }

    /// Whether the judge is trained.
    pub fn trained(&self) -> bool {
        matches!(self, JudgeSpec::Learned(_))
    }

    /// The synthetic judge's settings, if the judge is the synthetic one.
    pub fn oracle(&self) -> Option<&OracleJudgeSpec> {
        match self {
            JudgeSpec::Oracle(o) => Some(o),
            _ => None,
        }
    }

    /// Whether steps get verdicts (any judge but `None`).
    pub fn has_verdicts(&self) -> bool {
        !matches!(self, JudgeSpec::None)
    }
}

/// The synthetic judge's accuracies, as the judge's evaluation measures them: the share of
/// right steps whose majority verdict is `+` (`p_pos`, p⁺) and of wrong steps whose majority
/// verdict is `−` (`p_neg`, p⁻). Each of the `m` votes is drawn on its own, right with the
/// per-vote probability that makes the majority of `m` right with exactly that probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OracleJudgeSpec {
    /// p⁺: accuracy of the majority verdict on steps the oracle labels right, in [0, 1].
    pub p_pos: f64,
    /// p⁻: accuracy of the majority verdict on steps the oracle labels wrong, in [0, 1].
    pub p_neg: f64,
    /// Accuracies of their own for steps of some kinds (`StepResult::kind`): kind →
    /// `(p_pos, p_neg)`, e.g. `{"borderline": (0.8, 0.7)}`; steps of other kinds, and
    /// unclassified ones, get `p_pos`/`p_neg`. The twin of a learned judge whose accuracy
    /// differs by kind of step. Left out of the resolved file when empty.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub by_kind: std::collections::BTreeMap<String, (f64, f64)>,
}

impl Default for OracleJudgeSpec {
    fn default() -> Self {
        Self {
            p_pos: 0.85,
            p_neg: 0.85,
            by_kind: Default::default(),
        }
    }
}

/// The judge: its own model, warm start, sampling and optimiser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeModelSpec {
    /// The model (its own weights; the same kind of decoder as the policy).
    pub model: ModelSource,
    /// Supervised warm start on oracle-labelled steps.
    pub warm_start: JudgeWarmStart,
    /// Sampling temperature of the verdicts.
    pub temperature: f64,
    /// AdamW learning rate of the consistency training.
    pub lr: f64,
    /// What the prompt's history holds (`Actions`: the earlier steps' actions only, so the
    /// observation a step answered is missing after the first; `Steps`: each earlier action
    /// with the observation that followed it). Left out of the resolved file when `Actions`,
    /// so warm-start cache keys made before it stay valid.
    #[serde(skip_serializing_if = "JudgeHistory::is_default")]
    pub history: JudgeHistory,
    /// A range the warm-started judge must reach before the run trains (`None`: no gate).
    /// Not a warm-start input: changing it keeps the warm-start cache's entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<JudgeGate>,
}

/// A gate on the warm-started judge: its balanced accuracy on the evaluation pool at step 0
/// (the majority of `reward.votes` sampled votes, the logged `judge/eval_bal_acc`, or
/// `judge/eval_bal_acc/<kind>` on the steps of one kind) must lie in `[min, max]`, or the run
/// stops after its step-0 evaluation, before its first training step, with an error that
/// names the value. Set before any policy row runs, it is what makes a judge of stated
/// quality a checked precondition rather than a hope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeGate {
    /// The kind of step read (`""`: all the pool's steps).
    #[serde(default)]
    pub kind: String,
    /// Lowest balanced accuracy accepted.
    pub min: f64,
    /// Highest balanced accuracy accepted.
    pub max: f64,
}

impl JudgeGate {
    /// The metric the gate reads.
    pub fn metric(&self) -> String {
        match self.kind.as_str() {
            "" => "judge/eval_bal_acc".to_string(),
            k => format!("judge/eval_bal_acc/{k}"),
        }
    }
}

/// Every situation of `list` (the field `field`) well formed
/// ([`crate::judge::Situation::is_well_formed`]).
fn situations_checked(field: &str, list: &[crate::judge::Situation]) -> Checked {
    match list.iter().position(|s| !s.is_well_formed()) {
        Some(i) => Err(FieldError::new(
            format!("{field}[{i}]"),
            "`action` must be non-empty and both fields trimmed (a step's situation is compared trimmed)",
        )),
        None => Ok(()),
    }
}

/// What a judge prompt's history `H:` holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum JudgeHistory {
    /// The earlier steps' actions, `a1|a2|…` (every study before 2026-12-04 used it).
    #[default]
    Actions,
    /// Each earlier action with the observation that followed it, `a1>o1|a2>o2|…`: the
    /// judge sees what the judged step answered.
    Steps,
}

impl JudgeHistory {
    fn is_default(&self) -> bool {
        *self == JudgeHistory::Actions
    }
}

impl Default for JudgeModelSpec {
    fn default() -> Self {
        Self {
            model: ModelSource::Scratch(ModelSpec {
                max_seq_len: 96,
                ..ModelSpec::default()
            }),
            warm_start: JudgeWarmStart::default(),
            temperature: 0.8,
            lr: 1e-4,
            history: JudgeHistory::Actions,
            gate: None,
        }
    }
}

/// The judge's warm start: supervised on a few oracle-labelled steps of the warm-started
/// policy's own rollouts, with label noise, so that it starts mediocre (as a pretrained LLM
/// judge does in the paper).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeWarmStart {
    /// Labelled steps collected.
    pub labels: usize,
    /// Probability that a label is flipped.
    pub label_noise: f64,
    /// Optimiser steps.
    pub steps: usize,
    /// Labelled steps per optimiser step.
    pub batch: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Class-balanced batches: half of each batch from steps labelled right, half from steps
    /// labelled wrong (as the labels say, noise included), so the judge does not learn the
    /// label prior; `false` draws from all labels alike.
    pub balanced: bool,
    /// Whose steps are labelled: the warm-started policy's rollouts (`Policy`, the default)
    /// or the environment's flawed expert (`Expert`: half right, half wrong, spread over the
    /// eval grid, as the judge's evaluation pool but from other tasks). A pretrained policy
    /// that solves nothing at step 0 gives `Policy` no step labelled right to learn from.
    #[serde(skip_serializing_if = "LabelSource::is_policy")]
    pub source: LabelSource,
    /// The share of the labelled steps held out as a validation split (the last ones of each
    /// label, so both are measured): the judge is measured on it every `eval_every` steps and the checkpoint with
    /// the best balanced accuracy there is kept. In `[0, 0.9]`; `0` trains on every label and
    /// keeps the last checkpoint.
    pub validation: f64,
    /// Optimiser steps between two measurements on the validation split; `0`: a tenth of
    /// `steps` (rounded up), so eleven measurements in all.
    pub eval_every: usize,
    /// Situations the labeller gets wrong every time (`[(after: "6", action: "L")]`: an `L`
    /// after the line `6` is labelled the opposite of the oracle's label), applied before the
    /// label noise: a systematic error the judge can learn, for judges of controlled quality
    /// ([`crate::judge::Situation`]). Empty by default (and then left out of the resolved
    /// file, so warm-start cache keys made before it stay valid).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub misconceptions: Vec<crate::judge::Situation>,
}

impl JudgeWarmStart {
    /// Optimiser steps between two measurements on the validation split (never 0).
    pub fn eval_interval(&self) -> usize {
        match self.eval_every {
            0 => self.steps.div_ceil(10).max(1),
            n => n,
        }
    }
}

/// Whose steps the judge's warm start labels (see [`JudgeWarmStart::source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum LabelSource {
    /// The warm-started policy's own rollouts at random difficulties.
    #[default]
    Policy,
    /// The environment's flawed expert (slip probability 0.5), balanced right/wrong.
    Expert,
}

impl LabelSource {
    fn is_policy(&self) -> bool {
        *self == LabelSource::Policy
    }
}

impl Default for JudgeWarmStart {
    fn default() -> Self {
        Self {
            labels: 300,
            label_noise: 0.25,
            steps: 150,
            batch: 32,
            lr: 3e-3,
            balanced: false,
            source: LabelSource::Policy,
            validation: 0.2,
            eval_every: 0,
            misconceptions: Vec::new(),
        }
    }
}

/// Reward shaping and the data filters of framework/METHOD.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSpec {
    /// The outcome's values `O` (`PlusMinus`: ±1, `ZeroOne`: 1/0).
    pub outcome: crate::reward::OutcomeScale,
    /// λ of the integrated reward `R = O + (λ/m) Σ S`.
    pub lambda: f64,
    /// m: judge verdicts per step.
    pub votes: usize,
    /// Policy data is kept only from tasks whose group accuracy lies in this closed band.
    pub policy_band: (f64, f64),
    /// Judge data is kept only from tasks whose group accuracy lies in this closed band.
    pub judge_band: (f64, f64),
    /// How the consistency samples are weighed across episode outcomes (`Paper`: the
    /// paper's `R·S`; `Balanced`: steps of successful and failed episodes weigh the same).
    pub consistency: crate::reward::Consistency,
    /// How step rewards become advantages (`PerIndex`: the integrated reward z-scored per
    /// group and step index; `Decomposed`: the outcome's and the verdicts' z-scores apart).
    #[serde(skip_serializing_if = "crate::reward::Advantage::is_default")]
    pub advantage: crate::reward::Advantage,
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            outcome: crate::reward::OutcomeScale::PlusMinus,
            lambda: 1.0,
            votes: 3,
            policy_band: (0.125, 0.875),
            judge_band: (0.2, 0.8),
            consistency: crate::reward::Consistency::Paper,
            advantage: crate::reward::Advantage::PerIndex,
        }
    }
}

/// The policy-gradient algorithm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Algorithm {
    /// PPO-clip with a KL penalty.
    Ppo(PpoSpec),
}

impl Default for Algorithm {
    fn default() -> Self {
        Self::Ppo(PpoSpec::default())
    }
}

/// PPO-clip settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoSpec {
    /// Ratio clip ε.
    pub clip: f64,
    /// The KL penalty.
    pub kl: KlSpec,
    /// AdamW learning rate of the policy.
    pub lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Policy minibatch updates per training step (the batch is split into this many).
    pub policy_updates: usize,
    /// Judge minibatch updates per training step.
    pub judge_updates: usize,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Most rows (episodes for the policy, judged steps for the judge) in one forward and
    /// backward pass; a minibatch with more is split into row groups whose gradients are
    /// accumulated, at most `shards` groups at a time (gradient accumulation: the same
    /// update, summed in another order, at the memory of one group). 0: no limit, one group
    /// per shard.
    #[serde(skip_serializing_if = "is_zero")]
    pub micro_batch: usize,
}

impl Default for PpoSpec {
    fn default() -> Self {
        Self {
            clip: 0.2,
            kl: KlSpec::default(),
            lr: 1e-3,
            weight_decay: 0.0,
            policy_updates: 4,
            judge_updates: 2,
            max_grad_norm: 1.0,
            micro_batch: 0,
        }
    }
}

/// KL penalty: `coef · KL(π ‖ target)` per token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KlSpec {
    /// β.
    pub coef: f64,
    /// Which per-token estimator.
    pub estimator: KlEstimator,
    /// Against which distribution.
    pub target: KlTarget,
}

impl Default for KlSpec {
    fn default() -> Self {
        Self {
            coef: 0.01,
            estimator: KlEstimator::K3,
            target: KlTarget::Old,
        }
    }
}

/// Per-token KL estimators (Schulman, "Approximating KL divergence", 2020), with
/// `r = π_target(x) / π(x)` for a token `x` sampled from the rollout policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlEstimator {
    /// `−log r`.
    K1,
    /// `½ (log r)²`.
    K2,
    /// `r − 1 − log r` (unbiased, always ≥ 0).
    K3,
    /// The exact `KL(π ‖ target)` summed over the whole vocabulary at every trained position
    /// (needs the target's full distribution: one more forward of the target model when it
    /// is a frozen reference; the fused kernel on wgpu/cuda).
    Full,
}

impl KlEstimator {
    /// The estimator from the sampled token's log-probs alone (`None` for [`KlEstimator::Full`]).
    pub fn sampled(self) -> Option<crate::ppo::SampledKl> {
        use crate::ppo::SampledKl;
        match self {
            KlEstimator::K1 => Some(SampledKl::K1),
            KlEstimator::K2 => Some(SampledKl::K2),
            KlEstimator::K3 => Some(SampledKl::K3),
            KlEstimator::Full => None,
        }
    }
}

/// What the KL is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlTarget {
    /// The pre-update policy that sampled the batch (as the paper's reference code).
    Old,
    /// A frozen copy of the warm-started model (kept in checkpoints).
    Reference,
}

/// Sizes and schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Training steps.
    pub steps: usize,
    /// Task slots rolled out per step.
    pub tasks_per_step: usize,
    /// Rollouts per task (G).
    pub group_size: usize,
    /// Most policy steps (lines) per episode.
    pub max_env_steps: usize,
    /// Evaluate every this many steps (and after the warm start, and at the end).
    pub eval_every: usize,
    /// Held-out tasks per evaluation split.
    pub eval_tasks: usize,
    /// Write a checkpoint every this many steps (and at the end).
    pub checkpoint_every: usize,
    /// Held-out tasks of a third evaluation, at the difficulty the task slots start at (the
    /// training difficulty of a static run; `eval/acc_start`); 0 leaves it out.
    #[serde(skip_serializing_if = "is_zero")]
    pub eval_start_tasks: usize,
    /// Held-out tasks of a sampled evaluation at the starting difficulty: the first this many
    /// of `eval_start_tasks`' task set, the policy sampled at its training temperature and
    /// top-p (`eval/acc_start_sampled`, and its right-step share `eval/step_acc_start_sampled`:
    /// the step errors that greedy decoding hides once the right answer is the likeliest);
    /// 0 leaves it out. Measuring only: its draws have a stream of their own.
    #[serde(skip_serializing_if = "is_zero")]
    pub eval_start_sampled_tasks: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            steps: 100,
            tasks_per_step: 16,
            group_size: 8,
            max_env_steps: 8,
            eval_every: 10,
            eval_tasks: 64,
            checkpoint_every: 10,
            eval_start_tasks: 0,
            eval_start_sampled_tasks: 0,
        }
    }
}

fn ron_options() -> ron::Options {
    ron::Options::default()
        .with_default_extension(ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES)
}

/// Upper bounds that catch absurd sizes before they allocate anything.
const MAX_WIDTH: usize = 8192;
const MAX_LAYERS: usize = 128;
const MAX_SEQ: usize = 32_768;
const MAX_COUNT: usize = 1_000_000;
impl<E: EnvironmentChoice, A: AdaptationChoice> Experiment<E, A> {
    /// Reads, parses and validates an experiment file.
    pub fn load(path: &Path) -> Result<Self, ExperimentError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates experiment text; `path` is where it was read from (a `base:`
    /// is relative to it) and is named in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ExperimentError> {
        let composed = crate::compose::compose(text, path)?;
        let Some(c) = composed else {
            let exp: Self = ron_options()
                .from_str(text)
                .map_err(|e| ExperimentError::Parse {
                    path: path.to_path_buf(),
                    line: e.position.line,
                    col: e.position.col,
                    message: e.code.to_string(),
                })?;
            exp.validate().map_err(|e| ExperimentError::Invalid {
                path: path.to_path_buf(),
                location: check::locate(text, &e.field)
                    .map(|l| format!(":{l}"))
                    .unwrap_or_default(),
                field: e.field,
                message: e.message,
            })?;
            return Ok(exp);
        };
        // A change to a base: errors name the file of the chain that writes the field.
        let exp: Self = ron_options().from_str(&c.text).map_err(|e| {
            let field = c.field_at(e.position.line).unwrap_or("?").to_string();
            let (file, line) = c.locate(&field);
            ExperimentError::Parse {
                path: file,
                line: line.unwrap_or(1),
                col: 1,
                message: format!(
                    "{} (in `{field}`, of the experiment composed as {})",
                    e.code,
                    c.chain()
                ),
            }
        })?;
        exp.validate().map_err(|e| {
            let (file, line) = c.locate(&e.field);
            ExperimentError::Invalid {
                path: file,
                location: line.map(|l| format!(":{l}")).unwrap_or_default(),
                field: e.field,
                message: e.message,
            }
        })?;
        Ok(exp)
    }

    /// The resolved experiment as RON, every default filled in.
    pub fn to_ron(&self) -> String {
        let pretty = ron::ser::PrettyConfig::new()
            .struct_names(true)
            .extensions(ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES);
        // Serialising plain data into a String cannot fail.
        ron_options()
            .to_string_pretty(self, pretty)
            .unwrap_or_else(|e| format!("// could not serialise: {e}"))
    }

    /// The PPO settings.
    pub fn ppo(&self) -> &PpoSpec {
        match &self.algorithm {
            Algorithm::Ppo(p) => p,
        }
    }

    /// The PPO settings, to change.
    pub fn ppo_mut(&mut self) -> &mut PpoSpec {
        match &mut self.algorithm {
            Algorithm::Ppo(p) => p,
        }
    }

    /// Checks every range; the first violation, with its dotted field path.
    pub fn validate(&self) -> Checked {
        use check::{band, count, positive, real};
        count("shards", self.shards, 1, MAX_SHARDS)?;
        let name_ok = !self.name.trim().is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            && !self.name.starts_with('.');
        if !name_ok {
            return Err(FieldError::new(
                "name",
                format!(
                    "must be non-empty and use only letters, digits, '_', '-', '.' (got {:?})",
                    self.name
                ),
            ));
        }
        if self.name.len() > MAX_NAME_LEN {
            return Err(FieldError::new(
                "name",
                format!(
                    "names a directory and must be at most {MAX_NAME_LEN} characters (got {})",
                    self.name.len()
                ),
            ));
        }
        if self.seeds.is_empty() {
            return Err(FieldError::new("seeds", "must list at least one seed"));
        }
        let mut sorted = self.seeds.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.seeds.len() {
            return Err(FieldError::new("seeds", "must not repeat a seed"));
        }

        self.environment
            .plugin()
            .validate()
            .map_err(|e| e.within("environment"))?;

        let p = &self.policy;
        p.model.validate().map_err(|e| e.within("policy.model"))?;
        count("policy.warm_start.steps", p.warm_start.steps, 0, MAX_COUNT)?;
        count("policy.warm_start.batch", p.warm_start.batch, 1, 65_536)?;
        positive("policy.warm_start.lr", p.warm_start.lr, 1.0)?;
        real("policy.warm_start.noise", p.warm_start.noise, 0.0, 1.0)?;
        let (low, high) = p.warm_start.difficulty;
        real("policy.warm_start.difficulty", low, 0.0, 1.0)?;
        real("policy.warm_start.difficulty", high, low, 1.0)?;
        let s = &p.sampling;
        real("policy.sampling.temperature", s.temperature, 0.0, 100.0)?;
        positive("policy.sampling.top_p", s.top_p, 1.0)?;
        count(
            "policy.sampling.max_step_tokens",
            s.max_step_tokens,
            1,
            MAX_SEQ,
        )?;
        if s.max_step_tokens >= p.model.max_seq_len() {
            return Err(FieldError::new(
                "policy.sampling.max_step_tokens",
                format!(
                    "must be below policy.model.max_seq_len ({})",
                    p.model.max_seq_len()
                ),
            ));
        }

        situations_checked("situations", &self.situations)?;
        if let Some(j) = self.judge.model() {
            j.model.validate().map_err(|e| e.within("judge.model"))?;
            let w = &j.warm_start;
            count("judge.warm_start.labels", w.labels, 1, MAX_COUNT)?;
            real("judge.warm_start.label_noise", w.label_noise, 0.0, 1.0)?;
            count("judge.warm_start.steps", w.steps, 0, MAX_COUNT)?;
            count("judge.warm_start.batch", w.batch, 1, 65_536)?;
            positive("judge.warm_start.lr", w.lr, 1.0)?;
            real("judge.warm_start.validation", w.validation, 0.0, 0.9)?;
            count("judge.warm_start.eval_every", w.eval_every, 0, MAX_COUNT)?;
            situations_checked("judge.warm_start.misconceptions", &w.misconceptions)?;
            if let Some(g) = &j.gate {
                if !g.kind.is_empty() && !crate::env::valid_kind(&g.kind) {
                    return Err(FieldError::new(
                        "judge.gate.kind",
                        format!(
                            "{:?} is not a kind of step (1 to {} characters of a-z, 0-9 and _, or empty for every step)",
                            g.kind,
                            crate::env::MAX_KIND_LEN
                        ),
                    ));
                }
                real("judge.gate.min", g.min, 0.0, 1.0)?;
                real("judge.gate.max", g.max, g.min, 1.0)?;
            }
            real("judge.temperature", j.temperature, 0.0, 100.0)?;
            positive("judge.lr", j.lr, 1.0)?;
        }
        if let Some(o) = self.judge.oracle() {
            real("judge.p_pos", o.p_pos, 0.0, 1.0)?;
            real("judge.p_neg", o.p_neg, 0.0, 1.0)?;
            for (kind, &(p, n)) in &o.by_kind {
                if kind.is_empty() || !crate::env::valid_kind(kind) {
                    return Err(FieldError::new(
                        "judge.by_kind",
                        format!(
                            "{kind:?} is not a kind of step (1 to {} characters of a-z, 0-9 and _)",
                            crate::env::MAX_KIND_LEN
                        ),
                    ));
                }
                real(&format!("judge.by_kind.{kind}.p_pos"), p, 0.0, 1.0)?;
                real(&format!("judge.by_kind.{kind}.p_neg"), n, 0.0, 1.0)?;
            }
        }

        let r = &self.reward;
        real("reward.lambda", r.lambda, 0.0, 1e3)?;
        count("reward.votes", r.votes, 1, 64)?;
        band("reward.policy_band", r.policy_band)?;
        band("reward.judge_band", r.judge_band)?;

        if let Some(a) = self.adaptation.plugin() {
            a.validate().map_err(|e| e.within("adaptation"))?;
        }
        count("gate.window", self.gate.window, 1, 10_000)?;
        count("gate.min_rollouts", self.gate.min_rollouts, 1, MAX_COUNT)?;

        let ppo = self.ppo();
        real("algorithm.clip", ppo.clip, 0.0, 10.0)?;
        real("algorithm.kl.coef", ppo.kl.coef, 0.0, 1e6)?;
        positive("algorithm.lr", ppo.lr, 1.0)?;
        real("algorithm.weight_decay", ppo.weight_decay, 0.0, 10.0)?;
        count("algorithm.policy_updates", ppo.policy_updates, 1, 1024)?;
        count("algorithm.judge_updates", ppo.judge_updates, 1, 1024)?;
        if ppo.micro_batch != 0 {
            count("algorithm.micro_batch", ppo.micro_batch, 1, 4096)?;
        }
        positive("algorithm.max_grad_norm", ppo.max_grad_norm, 1e9)?;

        let b = &self.budget;
        count("budget.steps", b.steps, 1, MAX_COUNT)?;
        count("budget.tasks_per_step", b.tasks_per_step, 1, 65_536)?;
        count("budget.group_size", b.group_size, 2, 4096)?;
        count("budget.max_env_steps", b.max_env_steps, 1, 4096)?;
        count("budget.eval_every", b.eval_every, 1, MAX_COUNT)?;
        count("budget.eval_tasks", b.eval_tasks, 1, 65_536)?;
        count("budget.eval_start_tasks", b.eval_start_tasks, 0, 65_536)?;
        count(
            "budget.eval_start_sampled_tasks",
            b.eval_start_sampled_tasks,
            0,
            65_536,
        )?;
        count("budget.checkpoint_every", b.checkpoint_every, 1, MAX_COUNT)?;
        if b.tasks_per_step * b.group_size > 1 << 20 {
            return Err(FieldError::new(
                "budget.group_size",
                "tasks_per_step × group_size must be at most 1048576 rollouts per step",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::{EnvironmentPlugin, ProposerPlugin, ThresholdSpec};

    /// A stand-in environment plugin: the schema tests never build it.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct ToySpec {
        size: usize,
        difficulty: Vec<f64>,
    }

    impl Default for ToySpec {
        fn default() -> Self {
            Self {
                size: 2,
                difficulty: vec![0.5],
            }
        }
    }

    impl EnvironmentPlugin for ToySpec {
        fn validate(&self) -> Checked {
            check::count("size", self.size, 1, 9)
        }
        fn start_difficulty(&self) -> Vec<f64> {
            self.difficulty.clone()
        }
        fn build(&self) -> Box<dyn crate::Environment> {
            panic!("the schema tests never build an environment")
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Envs {
        Toy(ToySpec),
    }

    impl EnvironmentChoice for Envs {
        fn plugin(&self) -> &dyn EnvironmentPlugin {
            match self {
                Envs::Toy(t) => t,
            }
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
    enum Adapt {
        #[default]
        Static,
        Threshold(ThresholdSpec),
    }

    impl AdaptationChoice for Adapt {
        fn plugin(&self) -> Option<&dyn ProposerPlugin> {
            match self {
                Adapt::Static => None,
                Adapt::Threshold(t) => Some(t),
            }
        }
    }

    type Exp = Experiment<Envs, Adapt>;

    const MINIMAL: &str = r#"
Experiment(
    name: "t",
    seeds: [1],
    environment: Toy(size: 3),
    policy: (model: Scratch(d_model: 32)),
    budget: (steps: 2, group_size: 4),
)
"#;

    fn parse(text: &str) -> Result<Exp, ExperimentError> {
        Exp::parse(text, Path::new("x.ron"))
    }

    #[test]
    fn minimal_file_gets_defaults_and_round_trips() {
        let e = parse(MINIMAL).expect("parses");
        assert_eq!(
            e.environment,
            Envs::Toy(ToySpec {
                size: 3,
                difficulty: vec![0.5]
            })
        );
        let m = e.policy.model.spec().expect("scratch");
        assert_eq!((m.d_model, m.max_seq_len), (32, 128));
        assert_eq!(e.budget.group_size, 4);
        assert_eq!(e.ppo().kl.estimator, KlEstimator::K3);
        assert_eq!(e.adaptation, Adapt::Static);
        let again = parse(&e.to_ron()).expect("resolved form parses");
        assert_eq!(e, again);
    }

    #[test]
    fn the_warm_start_difficulty_range_defaults_to_the_whole_space_and_stays_out_of_sight() {
        let e = parse(MINIMAL).expect("parses");
        assert_eq!(e.policy.warm_start.difficulty, (0.0, 1.0));
        // The default is not written, so resolved files and warm-start cache keys of every
        // existing experiment stay what they were.
        let json = serde_json::to_string(&e.policy.warm_start).expect("serialises");
        assert!(!json.contains("difficulty"), "{json}");
        let narrow = MINIMAL.replace(
            "model: Scratch(d_model: 32)",
            "model: Scratch(d_model: 32), warm_start: (difficulty: (0.0, 0.25))",
        );
        let e = parse(&narrow).expect("parses");
        assert_eq!(e.policy.warm_start.difficulty, (0.0, 0.25));
        assert!(e.to_ron().contains("difficulty: (0.0, 0.25)"));
        assert_eq!(parse(&e.to_ron()).expect("resolved form parses"), e);
    }

    #[test]
    fn judge_warm_start_labels_the_policy_unless_told_the_expert() {
        let with = |ws: &str| {
            MINIMAL.replace(
                "budget:",
                &format!(
                    "judge: Learned(model: Scratch(d_model: 16), warm_start: ({ws})),\n    budget:"
                ),
            )
        };
        let source = |e: &Exp| e.judge.model().map(|j| j.warm_start.source);
        let default = parse(&with("steps: 3")).expect("parses");
        assert_eq!(source(&default), Some(LabelSource::Policy));
        // The default is not written out, so resolved files of older runs stay as they were.
        assert!(!default.to_ron().contains("source"));
        let expert = parse(&with("steps: 3, source: Expert")).expect("parses");
        assert_eq!(source(&expert), Some(LabelSource::Expert));
        assert_eq!(parse(&expert.to_ron()).expect("round trip"), expert);
        assert!(parse(&with("source: Oracle")).is_err());
    }

    #[test]
    fn misconceptions_and_the_judge_gate_parse_round_trip_and_are_checked() {
        let with =
            |judge: &str| MINIMAL.replace("budget:", &format!("judge: {judge},\n    budget:"));
        let judge = |ws: &str, gate: &str| {
            with(&format!(
                "Learned(model: Scratch(d_model: 16), warm_start: ({ws}){gate})"
            ))
        };
        let plain = parse(&judge("steps: 3", "")).expect("parses");
        // Neither is written out when unset: older resolved files and cache keys stay as they were.
        let ron = plain.to_ron();
        assert!(
            !ron.contains("misconceptions") && !ron.contains("JudgeGate"),
            "{ron}"
        );
        let e = parse(&judge(
            r#"misconceptions: [(after: "6", action: "L"), (after: "3", action: "R")]"#,
            r#", gate: Some(kind: "borderline", min: 0.8, max: 0.95)"#,
        ))
        .expect("parses");
        let j = e.judge.model().expect("a judge");
        let m = &j.warm_start.misconceptions;
        assert_eq!(
            (m.len(), m[0].after.as_str(), m[1].action.as_str()),
            (2, "6", "R")
        );
        let g = j.gate.as_ref().expect("a gate");
        assert_eq!(
            (g.metric().as_str(), g.min, g.max),
            ("judge/eval_bal_acc/borderline", 0.8, 0.95)
        );
        assert_eq!(parse(&e.to_ron()).expect("round trip"), e);
        // Without a kind the gate reads every step.
        let all = parse(&judge("", ", gate: Some(min: 0.6, max: 1.0)")).expect("parses");
        let metric = all
            .judge
            .model()
            .and_then(|j| j.gate.as_ref())
            .map(JudgeGate::metric);
        assert_eq!(metric.as_deref(), Some("judge/eval_bal_acc"));
        for (ws, gate, field) in [
            (
                r#"misconceptions: [(after: "6", action: "")]"#,
                "",
                "judge.warm_start.misconceptions[0]",
            ),
            (
                r#"misconceptions: [(after: " 6", action: "L")]"#,
                "",
                "judge.warm_start.misconceptions[0]",
            ),
            ("", ", gate: Some(min: 0.9, max: 0.8)", "judge.gate.max"),
            ("", ", gate: Some(min: -0.1, max: 0.8)", "judge.gate.min"),
            (
                "",
                r#", gate: Some(kind: "Border", min: 0.1, max: 0.8)"#,
                "judge.gate.kind",
            ),
        ] {
            let err = parse(&judge(ws, gate)).expect_err(ws).to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn watched_situations_parse_round_trip_and_are_checked() {
        let with =
            |list: &str| MINIMAL.replace("budget:", &format!("situations: {list},\n    budget:"));
        // Unset, not written out: older resolved files and cache keys stay as they were.
        assert!(
            !parse(MINIMAL)
                .expect("parses")
                .to_ron()
                .contains("situations")
        );
        let e = parse(&with(
            r#"[(after: "6", action: "L"), (after: "", action: "R")]"#,
        ))
        .expect("parses");
        let keys: Vec<String> = e.situations.iter().map(|s| s.key()).collect();
        assert_eq!(keys, ["6:L", ":R"]);
        assert_eq!(parse(&e.to_ron()).expect("round trip"), e);
        let err = parse(&with(
            r#"[(after: "6", action: "L"), (after: "6 ", action: "L")]"#,
        ))
        .expect_err("untrimmed")
        .to_string();
        assert!(err.contains("situations[1]"), "{err}");
    }

    #[test]
    fn the_judge_fit_and_the_synthetic_judges_kinds_are_checked() {
        let with =
            |judge: &str| MINIMAL.replace("budget:", &format!("judge: {judge},\n    budget:"));
        let e = parse(&with("Learned(model: Scratch(d_model: 16))")).expect("parses");
        let ws = &e.judge.model().expect("a judge").warm_start;
        // A fifth held out and a tenth of the steps between measurements, by default.
        assert_eq!(
            (ws.validation, ws.eval_every, ws.eval_interval()),
            (0.2, 0, 15)
        );
        assert!(
            parse(&with(
                "Learned(model: Scratch(d_model: 16), warm_start: (validation: 0.95))"
            ))
            .is_err()
        );
        let e = parse(&with(
            r#"Oracle(p_pos: 0.9, p_neg: 0.8, by_kind: {"borderline": (0.7, 0.6)})"#,
        ))
        .expect("parses");
        let o = e.judge.oracle().expect("oracle");
        assert_eq!(o.by_kind.get("borderline"), Some(&(0.7, 0.6)));
        assert_eq!(parse(&e.to_ron()).expect("round trip"), e);
        // Without kinds the resolved form is what it was.
        let plain = parse(&with("Oracle(p_pos: 0.9, p_neg: 0.8)")).expect("parses");
        assert!(!plain.to_ron().contains("by_kind"));
        for bad in [
            r#"{"Border line": (0.7, 0.6)}"#,
            r#"{"": (0.7, 0.6)}"#,
            r#"{"clear": (1.5, 0.6)}"#,
        ] {
            assert!(
                parse(&with(&format!(
                    "Oracle(p_pos: 0.9, p_neg: 0.8, by_kind: {bad})"
                )))
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn policy_and_judge_share_one_model_spec() {
        let text = MINIMAL.replace(
            "budget:",
            "judge: Learned(model: Scratch(d_model: 16, heads: 2, kv_heads: 3)),\n    budget:",
        );
        match parse(&text) {
            Err(ExperimentError::Invalid {
                field, location, ..
            }) => {
                assert_eq!(field, "judge.model.kv_heads");
                assert_eq!(location, ":7");
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        let judge = JudgeModelSpec::default();
        assert_eq!(judge.model.spec().map(|m| m.max_seq_len), Some(96));
    }

    #[test]
    fn lora_takes_peft_names_and_defaults_and_refuses_what_it_cannot_honour() {
        let with = |lora: &str| {
            MINIMAL.replace(
                "Scratch(d_model: 32)",
                &format!("Pretrained(path: \"m.gguf\", lora: Some{lora})"),
            )
        };
        let e = parse(&with("(r: 8)")).expect("parses");
        let ModelSource::Pretrained(p) = &e.policy.model else {
            panic!("pretrained")
        };
        let l = p.lora.as_ref().expect("lora");
        assert_eq!((l.r, l.lora_alpha, l.lora_dropout), (8, 8.0, 0.0));
        assert_eq!(l.target_modules, ["q_proj", "v_proj"]);
        assert!(l.targets("v_proj") && !l.targets("up_proj"));
        let e = parse(&with(
            "(r: 4, lora_alpha: 32, target_modules: [\"all-linear\"])",
        ))
        .expect("parses");
        let ModelSource::Pretrained(p) = &e.policy.model else {
            panic!("pretrained")
        };
        let l = p.lora.as_ref().expect("lora");
        assert_eq!(l.scaling(), 8.0);
        assert!(LORA_TARGETS.iter().all(|t| l.targets(t)));
        assert_eq!(parse(&e.to_ron()).expect("round trip"), e);
        for (bad, field) in [
            ("(r: 0)", "policy.model.lora.r"),
            ("(lora_dropout: 0.1)", "policy.model.lora.lora_dropout"),
            (
                "(target_modules: [\"qproj\"])",
                "policy.model.lora.target_modules",
            ),
            ("(target_modules: [])", "policy.model.lora.target_modules"),
        ] {
            match parse(&with(bad)) {
                Err(ExperimentError::Invalid {
                    field: f, location, ..
                }) => {
                    assert_eq!(f, field, "{bad}");
                    assert_eq!(location, ":6", "{bad}");
                }
                other => panic!("{bad}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_field_is_a_located_parse_error() {
        let text = MINIMAL.replace("Scratch(d_model: 32)", "Scratch(d_model: 32, dmodel: 3)");
        let msg = parse(&text).expect_err("rejected").to_string();
        assert!(msg.starts_with("x.ron:6:"), "{msg}");
        assert!(msg.contains("dmodel"), "{msg}");
    }

    #[test]
    fn unknown_variant_and_bad_syntax_are_rejected() {
        let text = MINIMAL.replace("Toy(", "Toyy(");
        assert!(
            parse(&text)
                .expect_err("variant")
                .to_string()
                .contains("Toyy")
        );
        let text = MINIMAL.replace("seeds: [1],", "seeds: [1,");
        assert!(matches!(parse(&text), Err(ExperimentError::Parse { .. })));
    }

    #[test]
    fn out_of_range_values_name_field_and_their_own_line() {
        // Two `lr` keys: the error must point at the one of `algorithm`, not the first.
        let nested = r#"
Experiment(
    name: "t",
    seeds: [1],
    environment: Toy(size: 3),
    policy: (
        model: Scratch(d_model: 32),
        warm_start: (lr: 0.1),
        sampling: (temperature: 1.0),
    ),
    algorithm: Ppo(
        clip: 0.2,
        lr: LR,
    ),
    budget: (steps: 2, group_size: 4),
)
"#;
        let cases = [
            (
                MINIMAL.replace("group_size: 4", "group_size: 0"),
                "budget.group_size",
                7,
            ),
            (MINIMAL.replace("seeds: [1]", "seeds: []"), "seeds", 4),
            (
                MINIMAL.replace("size: 3", "size: 30"),
                "environment.size",
                5,
            ),
            (
                MINIMAL.replace("d_model: 32", "d_model: 100000000"),
                "policy.model.d_model",
                6,
            ),
            (nested.replace("LR", "-1.0"), "algorithm.lr", 13),
            (
                nested
                    .replace("LR", "1e-4")
                    .replace("temperature: 1.0", "temperature: NaN"),
                "policy.sampling.temperature",
                9,
            ),
            (
                nested.replace("LR", "1e-4").replace("steps: 2", "steps: 0"),
                "budget.steps",
                15,
            ),
            (
                nested
                    .replace("LR", "1e-4")
                    .replace("lr: 0.1", "lr: 0.1, difficulty: (0.5, 0.2)"),
                "policy.warm_start.difficulty",
                8,
            ),
        ];
        for (text, field, line) in cases {
            match parse(&text) {
                Err(ExperimentError::Invalid {
                    field: f, location, ..
                }) => {
                    assert_eq!(f, field, "{text}");
                    assert_eq!(location, format!(":{line}"), "{field}: {text}");
                }
                other => panic!("{field}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_name_too_long_for_a_directory_is_refused() {
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let text = MINIMAL.replace("name: \"t\"", &format!("name: \"{long}\""));
        match parse(&text) {
            Err(ExperimentError::Invalid { field, .. }) => assert_eq!(field, "name"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        let ok = MINIMAL.replace(
            "name: \"t\"",
            &format!("name: \"{}\"", "n".repeat(MAX_NAME_LEN)),
        );
        assert!(parse(&ok).is_ok());
    }
}
