//! Tensor-level entry points: the fused ops of [`LogProbOps`], and [`KernelChoice`] to pick
//! fused or reference explicitly.

use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use crate::ops::LogProbOps;
use crate::reference;

/// Fused `log_softmax(logits)[n, targets[n]]`: `[n, vocab]`, `[n]` → `[n]`. Differentiable on
/// `Autodiff<B>` (custom backward).
pub fn token_logprobs<B: LogProbOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let out = B::token_logprobs(logits.into_primitive().tensor(), targets.into_primitive());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Fused full-vocabulary `KL(softmax(p) ‖ softmax(q))` per row: `[n, vocab]` ×2 → `[n]`.
/// Differentiable in both arguments on `Autodiff<B>` (custom backward).
pub fn kl_full<B: LogProbOps>(p_logits: Tensor<B, 2>, q_logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let out = B::kl_full(
        p_logits.into_primitive().tensor(),
        q_logits.into_primitive().tensor(),
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Which implementation of the loss-side ops to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelChoice {
    /// The backend's [`LogProbOps`] (CubeCL kernels on Cube backends, the composition elsewhere).
    #[default]
    Fused,
    /// The composed reference twins ([`crate::reference`]), on any backend.
    Reference,
}

impl KernelChoice {
    /// Lower-case name (`fused` / `reference`).
    pub fn name(self) -> &'static str {
        match self {
            KernelChoice::Fused => "fused",
            KernelChoice::Reference => "reference",
        }
    }

    /// [`token_logprobs`] or [`reference::token_logprobs`].
    pub fn token_logprobs<B: LogProbOps>(
        self,
        logits: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
    ) -> Tensor<B, 1> {
        match self {
            KernelChoice::Fused => token_logprobs(logits, targets),
            KernelChoice::Reference => reference::token_logprobs(logits, targets),
        }
    }

    /// [`kl_full`] or [`reference::kl_full`].
    pub fn kl_full<B: LogProbOps>(
        self,
        p_logits: Tensor<B, 2>,
        q_logits: Tensor<B, 2>,
    ) -> Tensor<B, 1> {
        match self {
            KernelChoice::Fused => kl_full(p_logits, q_logits),
            KernelChoice::Reference => reference::kl_full(p_logits, q_logits),
        }
    }
}

impl core::fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for KernelChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fused" => Ok(KernelChoice::Fused),
            "reference" | "ref" => Ok(KernelChoice::Reference),
            other => Err(format!(
                "unknown kernel choice `{other}` (fused | reference)"
            )),
        }
    }
}
