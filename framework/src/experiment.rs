//! The experiment schema: one RON file = one experiment = one pairing of components.
//!
//! These are the project's own serde types (not Burn configs): every field is explicit or
//! defaulted here, unknown fields and variants are rejected, and every error names the file
//! and, where it can, the line and column. `Experiment::load` parses and validates;
//! `Experiment::to_ron` writes the resolved form (every default filled in).
//!
//! Enum variants that carry a struct are written without the extra parentheses
//! (`Arith(max_operands: 4)`, `Ppo(clip: 0.2)`): the RON extension `unwrap_variant_newtypes`
//! is always on.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Everything that can be wrong with an experiment file.
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
    /// WGPU (Vulkan/Metal/DX12); needs the `wgpu` cargo feature.
    Wgpu,
    /// CUDA device `n`; needs the `cuda` cargo feature.
    Cuda(usize),
}

/// The root of an experiment file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Names the run directory `runs/<name>/seed-<n>/`.
    pub name: String,
    /// One run per seed; every random stream of a run derives from its seed.
    pub seeds: Vec<u64>,
    /// Backend, overridable with `--backend`.
    #[serde(default)]
    pub backend: BackendKind,
    /// The environment plugin and its settings.
    pub environment: EnvironmentSpec,
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
    pub adaptation: Adaptation,
    /// Sizes and schedule of the run.
    pub budget: Budget,
    /// Which implementation of the loss-side ops (token log-probs) the updates use.
    #[serde(default)]
    pub kernels: Kernels,
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

/// The environment plugins that ship with the project.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EnvironmentSpec {
    /// Multi-step arithmetic chains (see `rlany-envs`).
    Arith(ArithSpec),
}

/// Settings of the `arith` environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithSpec {
    /// Longest chain (operands) at difficulty 1; OOD tasks are longer. At least 2.
    pub max_operands: usize,
    /// Most digits per operand at difficulty 1 (1..=3).
    pub max_digits: u32,
    /// Starting difficulty of every task slot, one value in [0, 1] per dimension
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

/// A decoder transformer (policy or judge) and how it is prepared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySpec {
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
    /// Longest context in tokens.
    pub max_seq_len: usize,
    /// Bias on the q/k/v projections (Qwen2 style).
    pub qkv_bias: bool,
    /// Supervised warm start on expert demonstrations.
    pub warm_start: WarmStart,
    /// How rollouts are sampled.
    pub sampling: Sampling,
}

impl Default for PolicySpec {
    fn default() -> Self {
        Self {
            d_model: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 192,
            max_seq_len: 128,
            qkv_bias: false,
            warm_start: WarmStart::default(),
            sampling: Sampling::default(),
        }
    }
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
    /// The environment's flawed-expert noise in [0, 1] (arith: probability of dropping a
    /// carry/borrow), so that the warm-started policy starts mid-range.
    pub noise: f64,
}

impl Default for WarmStart {
    fn default() -> Self {
        Self {
            steps: 300,
            batch: 32,
            lr: 3e-3,
            noise: 0.6,
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
    /// A judge trained by the consistency reward (method.md, step 5).
    Learned(JudgeModelSpec),
}

impl JudgeSpec {
    /// The judge's settings, if there is a judge.
    pub fn model(&self) -> Option<&JudgeModelSpec> {
        match self {
            JudgeSpec::None => None,
            JudgeSpec::Frozen(m) | JudgeSpec::Learned(m) => Some(m),
        }
    }

    /// Whether the judge is trained.
    pub fn trained(&self) -> bool {
        matches!(self, JudgeSpec::Learned(_))
    }
}

/// The judge: its own transformer, warm start, sampling and optimiser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeModelSpec {
    /// Model width.
    pub d_model: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads`.
    pub kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub ffn: usize,
    /// Longest judge prompt + verdict in tokens (longer histories are cut, oldest first).
    pub max_seq_len: usize,
    /// Bias on the q/k/v projections.
    pub qkv_bias: bool,
    /// Supervised warm start on oracle-labelled steps.
    pub warm_start: JudgeWarmStart,
    /// Sampling temperature of the verdicts.
    pub temperature: f64,
    /// AdamW learning rate of the consistency training.
    pub lr: f64,
}

impl Default for JudgeModelSpec {
    fn default() -> Self {
        Self {
            d_model: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 192,
            max_seq_len: 96,
            qkv_bias: false,
            warm_start: JudgeWarmStart::default(),
            temperature: 0.8,
            lr: 1e-4,
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
}

impl Default for JudgeWarmStart {
    fn default() -> Self {
        Self {
            labels: 300,
            label_noise: 0.25,
            steps: 150,
            batch: 32,
            lr: 3e-3,
        }
    }
}

/// Reward shaping and the data filters of method.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSpec {
    /// λ of the integrated reward `R = O + (λ/m) Σ S`.
    pub lambda: f64,
    /// m: judge verdicts per step.
    pub votes: usize,
    /// Policy data is kept only from tasks whose group accuracy lies in this closed band.
    pub policy_band: (f64, f64),
    /// Judge data is kept only from tasks whose group accuracy lies in this closed band.
    pub judge_band: (f64, f64),
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            lambda: 1.0,
            votes: 3,
            policy_band: (0.125, 0.875),
            judge_band: (0.2, 0.8),
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
}

/// What the KL is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlTarget {
    /// The pre-update policy that sampled the batch (as the paper's reference code).
    Old,
    /// A frozen copy of the warm-started model (kept in checkpoints).
    Reference,
}

/// How task difficulty adapts (method.md, step 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub enum Adaptation {
    /// Difficulty never changes.
    #[default]
    Static,
    /// The paper's rule: move the difficulty by a fixed step along the flagged dimensions.
    Threshold(ThresholdSpec),
    /// Our Gaussian-process proposer.
    Gp(GpSpec),
}

impl Adaptation {
    /// `(α_low, α_high)`: below, propose easier; above, harder.
    pub fn band(&self) -> (f64, f64) {
        match self {
            Adaptation::Static => (0.2, 0.8),
            Adaptation::Threshold(t) => t.band,
            Adaptation::Gp(g) => g.band,
        }
    }
}

/// `Threshold` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThresholdSpec {
    /// δ: how far one proposal moves each flagged dimension.
    pub step: f64,
    /// `(α_low, α_high)`.
    pub band: (f64, f64),
}

impl Default for ThresholdSpec {
    fn default() -> Self {
        Self {
            step: 0.1,
            band: (0.2, 0.8),
        }
    }
}

/// `Gp` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpSpec {
    /// Accuracy the proposals aim at.
    pub target: f64,
    /// `(α_low, α_high)`.
    pub band: (f64, f64),
    /// How a proposal is chosen among the candidates.
    pub acquisition: Acquisition,
    /// Candidates scored per proposal.
    pub candidates: usize,
    /// Observations kept (newest first).
    pub max_observations: usize,
}

impl Default for GpSpec {
    fn default() -> Self {
        Self {
            target: 0.5,
            band: (0.2, 0.8),
            acquisition: Acquisition::Nearest,
            candidates: 256,
            max_observations: 200,
        }
    }
}

/// The GP proposer's choice rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Acquisition {
    /// The candidate whose predicted accuracy is nearest the target.
    Nearest,
    /// Upper confidence bound on p(1−p): `p(1−p) + β·sd_p`.
    Ucb(UcbSpec),
}

/// UCB settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UcbSpec {
    /// Exploration weight β.
    pub beta: f64,
}

impl Default for UcbSpec {
    fn default() -> Self {
        Self { beta: 2.0 }
    }
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

impl Experiment {
    /// Reads, parses and validates an experiment file.
    pub fn load(path: &Path) -> Result<Self, ExperimentError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates experiment text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ExperimentError> {
        let exp: Experiment = ron_options()
            .from_str(text)
            .map_err(|e| ExperimentError::Parse {
                path: path.to_path_buf(),
                line: e.position.line,
                col: e.position.col,
                message: e.code.to_string(),
            })?;
        exp.validate().map_err(|(field, message)| {
            let key = field.rsplit('.').next().unwrap_or(&field).to_string();
            ExperimentError::Invalid {
                path: path.to_path_buf(),
                location: find_key_line(text, &key)
                    .map(|l| format!(":{l}"))
                    .unwrap_or_default(),
                field,
                message,
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

    /// The arith settings (the only environment so far).
    pub fn arith(&self) -> &ArithSpec {
        match &self.environment {
            EnvironmentSpec::Arith(a) => a,
        }
    }

    /// The PPO settings.
    pub fn ppo(&self) -> &PpoSpec {
        match &self.algorithm {
            Algorithm::Ppo(p) => p,
        }
    }

    /// Checks every range; returns `(dotted field, message)` for the first violation.
    pub fn validate(&self) -> Result<(), (String, String)> {
        fn err<T>(field: &str, msg: impl Into<String>) -> Result<T, (String, String)> {
            Err((field.to_string(), msg.into()))
        }
        fn count(field: &str, v: usize, lo: usize, hi: usize) -> Result<(), (String, String)> {
            if v < lo || v > hi {
                return err(field, format!("must be in {lo}..={hi} (got {v})"));
            }
            Ok(())
        }
        fn real(field: &str, v: f64, lo: f64, hi: f64) -> Result<(), (String, String)> {
            if !v.is_finite() || v < lo || v > hi {
                return err(
                    field,
                    format!("must be a finite number in [{lo}, {hi}] (got {v})"),
                );
            }
            Ok(())
        }
        fn positive(field: &str, v: f64, hi: f64) -> Result<(), (String, String)> {
            if !v.is_finite() || v <= 0.0 || v > hi {
                return err(
                    field,
                    format!("must be a finite number in (0, {hi}] (got {v})"),
                );
            }
            Ok(())
        }
        fn band(field: &str, (lo, hi): (f64, f64)) -> Result<(), (String, String)> {
            real(field, lo, 0.0, 1.0)?;
            real(field, hi, 0.0, 1.0)?;
            if lo > hi {
                return err(
                    field,
                    format!("must be (low, high) with low <= high (got ({lo}, {hi}))"),
                );
            }
            Ok(())
        }

        if self.name.trim().is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            || self.name.starts_with('.')
        {
            return err(
                "name",
                format!(
                    "must be non-empty and use only letters, digits, '_', '-', '.' (got {:?})",
                    self.name
                ),
            );
        }
        if self.seeds.is_empty() {
            return err("seeds", "must list at least one seed");
        }
        let mut sorted = self.seeds.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.seeds.len() {
            return err("seeds", "must not repeat a seed");
        }

        let a = self.arith();
        count("environment.max_operands", a.max_operands, 2, 64)?;
        count("environment.max_digits", a.max_digits as usize, 1, 3)?;
        if a.difficulty.len() != 3 {
            return err(
                "environment.difficulty",
                format!(
                    "must have 3 values (operands, digits, minus) (got {})",
                    a.difficulty.len()
                ),
            );
        }
        for &d in &a.difficulty {
            real("environment.difficulty", d, 0.0, 1.0)?;
        }

        fn model(
            at: &str,
            (d_model, layers, heads, kv_heads, ffn, max_seq_len): (
                usize,
                usize,
                usize,
                usize,
                usize,
                usize,
            ),
        ) -> Result<(), (String, String)> {
            count(&format!("{at}.d_model"), d_model, 2, MAX_WIDTH)?;
            count(&format!("{at}.layers"), layers, 1, MAX_LAYERS)?;
            count(&format!("{at}.heads"), heads, 1, 256)?;
            count(&format!("{at}.kv_heads"), kv_heads, 1, 256)?;
            count(&format!("{at}.ffn"), ffn, 1, 4 * MAX_WIDTH)?;
            count(&format!("{at}.max_seq_len"), max_seq_len, 8, MAX_SEQ)?;
            if d_model % heads != 0 || (d_model / heads) % 2 != 0 {
                return err(
                    &format!("{at}.heads"),
                    format!(
                        "must divide d_model into an even head size (d_model {d_model} / heads {heads})"
                    ),
                );
            }
            if heads % kv_heads != 0 {
                return err(
                    &format!("{at}.kv_heads"),
                    format!("must divide heads ({heads} % {kv_heads} != 0)"),
                );
            }
            Ok(())
        }

        let p = &self.policy;
        model(
            "policy",
            (
                p.d_model,
                p.layers,
                p.heads,
                p.kv_heads,
                p.ffn,
                p.max_seq_len,
            ),
        )?;
        count("policy.warm_start.steps", p.warm_start.steps, 0, MAX_COUNT)?;
        count("policy.warm_start.batch", p.warm_start.batch, 1, 65_536)?;
        positive("policy.warm_start.lr", p.warm_start.lr, 1.0)?;
        real("policy.warm_start.noise", p.warm_start.noise, 0.0, 1.0)?;
        real(
            "policy.sampling.temperature",
            p.sampling.temperature,
            0.0,
            100.0,
        )?;
        positive("policy.sampling.top_p", p.sampling.top_p, 1.0)?;
        count(
            "policy.sampling.max_step_tokens",
            p.sampling.max_step_tokens,
            1,
            MAX_SEQ,
        )?;

        if let Some(j) = self.judge.model() {
            model(
                "judge",
                (
                    j.d_model,
                    j.layers,
                    j.heads,
                    j.kv_heads,
                    j.ffn,
                    j.max_seq_len,
                ),
            )?;
            count("judge.warm_start.labels", j.warm_start.labels, 1, MAX_COUNT)?;
            real(
                "judge.warm_start.label_noise",
                j.warm_start.label_noise,
                0.0,
                1.0,
            )?;
            count("judge.warm_start.steps", j.warm_start.steps, 0, MAX_COUNT)?;
            count("judge.warm_start.batch", j.warm_start.batch, 1, 65_536)?;
            positive("judge.warm_start.lr", j.warm_start.lr, 1.0)?;
            real("judge.temperature", j.temperature, 0.0, 100.0)?;
            positive("judge.lr", j.lr, 1.0)?;
        }

        let r = &self.reward;
        real("reward.lambda", r.lambda, 0.0, 1e3)?;
        count("reward.votes", r.votes, 1, 64)?;
        band("reward.policy_band", r.policy_band)?;
        band("reward.judge_band", r.judge_band)?;

        match &self.adaptation {
            Adaptation::Static => {}
            Adaptation::Threshold(t) => {
                positive("adaptation.step", t.step, 1.0)?;
                band("adaptation.band", t.band)?;
            }
            Adaptation::Gp(g) => {
                real("adaptation.target", g.target, 0.0, 1.0)?;
                band("adaptation.band", g.band)?;
                count("adaptation.candidates", g.candidates, 1, 1 << 16)?;
                count("adaptation.max_observations", g.max_observations, 3, 10_000)?;
                if let Acquisition::Ucb(u) = &g.acquisition {
                    real("adaptation.beta", u.beta, 0.0, 1e3)?;
                }
            }
        }

        let ppo = self.ppo();
        real("algorithm.clip", ppo.clip, 0.0, 10.0)?;
        real("algorithm.kl.coef", ppo.kl.coef, 0.0, 1e6)?;
        positive("algorithm.lr", ppo.lr, 1.0)?;
        real("algorithm.weight_decay", ppo.weight_decay, 0.0, 10.0)?;
        count("algorithm.policy_updates", ppo.policy_updates, 1, 1024)?;
        count("algorithm.judge_updates", ppo.judge_updates, 1, 1024)?;
        positive("algorithm.max_grad_norm", ppo.max_grad_norm, 1e9)?;

        let b = &self.budget;
        count("budget.steps", b.steps, 1, MAX_COUNT)?;
        count("budget.tasks_per_step", b.tasks_per_step, 1, 65_536)?;
        count("budget.group_size", b.group_size, 2, 4096)?;
        count("budget.max_env_steps", b.max_env_steps, 1, 4096)?;
        count("budget.eval_every", b.eval_every, 1, MAX_COUNT)?;
        count("budget.eval_tasks", b.eval_tasks, 1, 65_536)?;
        count("budget.checkpoint_every", b.checkpoint_every, 1, MAX_COUNT)?;
        if b.tasks_per_step * b.group_size > 1 << 20 {
            return err(
                "budget.group_size",
                "tasks_per_step × group_size must be at most 1048576 rollouts per step",
            );
        }
        if p.sampling.max_step_tokens >= p.max_seq_len {
            return err(
                "policy.sampling.max_step_tokens",
                format!("must be below policy.max_seq_len ({})", p.max_seq_len),
            );
        }
        Ok(())
    }
}

/// 1-based line of the first `key:` in `text` outside comments, for error locations.
fn find_key_line(text: &str, key: &str) -> Option<usize> {
    let pat = format!("{key}:");
    text.lines().enumerate().find_map(|(i, line)| {
        let code = line.split("//").next().unwrap_or("");
        let pos = code.find(&pat)?;
        let before = code[..pos].chars().last();
        let starts_word = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        starts_word.then_some(i + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
Experiment(
    name: "t",
    seeds: [1],
    environment: Arith(max_operands: 3),
    policy: (d_model: 32),
    budget: (steps: 2, group_size: 4),
)
"#;

    fn parse(text: &str) -> Result<Experiment, ExperimentError> {
        Experiment::parse(text, Path::new("x.ron"))
    }

    #[test]
    fn minimal_file_gets_defaults_and_round_trips() {
        let e = parse(MINIMAL).expect("parses");
        assert_eq!(e.arith().max_operands, 3);
        assert_eq!(e.arith().max_digits, 1);
        assert_eq!(e.policy.d_model, 32);
        assert_eq!(e.budget.group_size, 4);
        assert_eq!(e.ppo().kl.estimator, KlEstimator::K3);
        let again = parse(&e.to_ron()).expect("resolved form parses");
        assert_eq!(e, again);
    }

    #[test]
    fn unknown_field_is_a_located_parse_error() {
        let text = MINIMAL.replace("policy: (d_model: 32)", "policy: (d_model: 32, dmodel: 3)");
        let msg = parse(&text).expect_err("rejected").to_string();
        assert!(msg.starts_with("x.ron:6:"), "{msg}");
        assert!(msg.contains("dmodel"), "{msg}");
    }

    #[test]
    fn unknown_variant_and_bad_syntax_are_rejected() {
        let text = MINIMAL.replace("Arith(", "Arithm(");
        assert!(
            parse(&text)
                .expect_err("variant")
                .to_string()
                .contains("Arithm")
        );
        let text = MINIMAL.replace("seeds: [1],", "seeds: [1,");
        assert!(matches!(parse(&text), Err(ExperimentError::Parse { .. })));
    }

    #[test]
    fn out_of_range_values_name_field_and_line() {
        let cases = [
            (
                "budget: (steps: 2, group_size: 4)",
                "budget: (steps: 2, group_size: 0)",
                "budget.group_size",
            ),
            ("seeds: [1]", "seeds: []", "seeds"),
            (
                "policy: (d_model: 32)",
                "policy: (d_model: 32, warm_start: (lr: -1.0))",
                "policy.warm_start.lr",
            ),
            (
                "policy: (d_model: 32)",
                "policy: (d_model: 32, sampling: (temperature: NaN))",
                "policy.sampling.temperature",
            ),
            (
                "policy: (d_model: 32)",
                "policy: (d_model: 100000000)",
                "policy.d_model",
            ),
        ];
        for (from, to, field) in cases {
            let text = MINIMAL.replace(from, to);
            match parse(&text) {
                Err(ExperimentError::Invalid {
                    field: f, location, ..
                }) => {
                    assert_eq!(f, field);
                    assert!(location.starts_with(':'), "{field}: no line");
                }
                other => panic!("{field}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn key_line_skips_comments_and_longer_names() {
        let text = "a: 1\n// group_size: 3\nmax_group_size: 2\n group_size: 4";
        assert_eq!(find_key_line(text, "group_size"), Some(4));
    }
}
