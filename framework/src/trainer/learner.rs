//! A learner: one model the loop trains by PPO — the policy, or a judge — with everything its
//! updates read and its checkpoint holds: the optimiser's state, the frozen KL target, the
//! minibatch stream, its learning rate and minibatch count. The policy and the judge are
//! updated, saved, resumed and checked across replicas by the same code.

use super::*;

/// Which of the loop's models a learner trains: it names the checkpoint files, the minibatch
/// stream, the progress bar and the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The policy.
    Policy,
    /// The judge.
    Judge,
}

impl Role {
    /// The name in messages (a non-finite loss, a replica check).
    pub(super) fn name(self) -> &'static str {
        match self {
            Role::Policy => "policy",
            Role::Judge => "judge",
        }
    }

    /// The checkpoint's names of the model, its optimiser state and its frozen reference
    /// (those of the checkpoints written before learners existed).
    fn files(self) -> [&'static str; 3] {
        match self {
            Role::Policy => ["policy", "policy_optim", "reference"],
            Role::Judge => ["judge", "judge_optim", "judge_reference"],
        }
    }

    /// The name of the minibatch stream derived from the seed.
    pub(super) fn stream(self) -> &'static str {
        match self {
            Role::Policy => "policy-minibatches",
            Role::Judge => "judge-minibatches",
        }
    }

    /// The update's progress-bar label.
    fn label(self) -> &'static str {
        match self {
            Role::Policy => "update",
            Role::Judge => "judge update",
        }
    }
}

/// One trained model with its optimiser, frozen KL target and minibatch stream.
pub(super) struct Learner<B: AutodiffLogProbOps, M: AutodiffModule<B>> {
    /// The model being trained.
    pub(super) model: M,
    optim: Optim<B, M>,
    /// The frozen KL target (`KlTarget::Reference`); `None`: the pre-update model.
    reference: Option<M::InnerModule>,
    /// Shuffles the samples into minibatches.
    rng: Rng,
    /// Learning rate.
    lr: f64,
    /// Minibatches (optimiser steps) per update.
    minibatches: usize,
    role: Role,
}

impl<B, M> Learner<B, M>
where
    B: AutodiffLogProbOps,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The learner `role` of run `seed` under `cfg`: `model` with a fresh AdamW state, the
    /// role's learning rate, minibatch count and minibatch stream; with a frozen KL target
    /// (`KlTarget::Reference`; for a judge, one that learns) `model` as it is now is the
    /// reference.
    pub(super) fn new(role: Role, model: M, cfg: &Settings, seed: u64) -> Self {
        let ppo = &cfg.ppo;
        let frozen = matches!(ppo.kl.target, KlTarget::Reference);
        let (lr, minibatches, frozen) = match role {
            Role::Policy => (ppo.lr, ppo.policy_updates, frozen),
            Role::Judge => (
                cfg.judge.model().map_or(ppo.lr, |j| j.lr),
                ppo.judge_updates,
                frozen && cfg.judge.trained(),
            ),
        };
        let adamw = AdamWConfig::new().with_weight_decay(ppo.weight_decay as f32);
        Self {
            reference: frozen.then(|| model.valid()),
            model,
            optim: adamw.init::<B, M>(),
            rng: Rng::derive(seed, role.stream()),
            lr,
            minibatches,
            role,
        }
    }

    /// Which model this is.
    pub(super) fn role(&self) -> Role {
        self.role
    }

    /// The minibatch stream (saved in the checkpoint's state).
    pub(super) fn rng(&self) -> &Rng {
        &self.rng
    }

    /// One PPO update phase on `samples` ([`ppo_update`]) with this learner's learning rate,
    /// minibatches, KL target and stream, and `ppo`'s other settings; returns its statistics
    /// (`None`: no sample carries a unit).
    pub(super) fn update(
        &mut self,
        samples: &[Sample],
        ppo: &UpdateParams,
        device: &B::Device,
    ) -> Result<Option<UpdateStats>, StepError> {
        let params = UpdateParams {
            lr: self.lr,
            minibatches: self.minibatches,
            label: self.role.label(),
            ..ppo.clone()
        };
        let (model, stats) = ppo_update(
            self.model.clone(),
            &mut self.optim,
            self.reference.as_ref(),
            samples,
            &params,
            &mut self.rng,
            device,
        )?;
        self.model = model;
        Ok(stats)
    }

    /// Writes the model's trainable weights, the optimiser's state and the frozen reference
    /// (if any) into `w` under the role's names; the minibatch stream goes into the state
    /// ([`Learner::rng`]).
    pub(super) fn save(&self, w: &checkpoint::Writer) -> Result<(), CheckpointError> {
        let [model, optim, reference] = self.role.files();
        w.trainable(model, &self.model)?;
        w.optim::<B, M, Optim<B, M>>(optim, &self.optim)?;
        if let Some(r) = &self.reference {
            w.module::<B::InnerBackend, M::InnerModule>(reference, r)?;
        }
        Ok(())
    }

    /// The learner as [`Learner::save`] wrote it into `ckpt` (weights, optimiser state and
    /// frozen reference; this learner's own model gives their structure and its frozen
    /// parameters), with the minibatch stream `rng` from the checkpoint's state.
    pub(super) fn resume(
        mut self,
        ckpt: &checkpoint::Reader,
        rng: Rng,
        device: &B::Device,
    ) -> Result<Self, CheckpointError> {
        let [model, optim, reference] = self.role.files();
        if let Some(r) = self.reference.take() {
            self.reference = Some(ckpt.module(reference, r, device)?);
        }
        self.model = ckpt.trainable(model, self.model, device)?;
        self.optim = ckpt.optim(optim, self.optim, device)?;
        self.rng = rng;
        Ok(self)
    }

    /// The checksum of the trainable weights, which every replica of a spread run must share.
    pub(super) fn checksum(&self) -> u64 {
        checksum(&self.model)
    }
}
