//! `Autodiff<B>`: one custom backward node per fused op, calling the inner backend's backward
//! (a CubeCL kernel on Cube backends, the composed default elsewhere).

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::attention::AttentionOps;
use crate::ops::{KlStats, LogProbOps};

#[derive(Debug)]
struct TokenLogprobsBackward;

impl<B: LogProbOps> Backward<B, 1> for TokenLogprobsBackward {
    /// (logits checkpoint, targets, logsumexp per row)
    type State = (NodeId, IntTensor<B>, FloatTensor<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let Some(parent) = parent else { return };
        let (logits_id, targets, lse) = ops.state;
        let logits: FloatTensor<B> = checkpointer.retrieve_node_output(logits_id);
        let dlogits = B::token_logprobs_backward(logits, targets, lse, grad);
        grads.register::<B>(parent.id, dlogits);
    }
}

#[derive(Debug)]
struct KlFullBackward;

impl<B: LogProbOps> Backward<B, 2> for KlFullBackward {
    /// (p checkpoint, q checkpoint, per-row stats)
    type State = (NodeId, NodeId, KlStats<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_p, node_q] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (p_id, q_id, stats) = ops.state;
        let p: FloatTensor<B> = checkpointer.retrieve_node_output(p_id);
        let q: FloatTensor<B> = checkpointer.retrieve_node_output(q_id);
        let (dp, dq) = B::kl_full_backward(p, q, stats, grad, node_p.is_some(), node_q.is_some());
        if let (Some(node), Some(dp)) = (node_p, dp) {
            grads.register::<B>(node.id, dp);
        }
        if let (Some(node), Some(dq)) = (node_q, dq) {
            grads.register::<B>(node.id, dq);
        }
    }
}

#[derive(Debug)]
struct GroupedAttentionBackward;

impl<B: AttentionOps> Backward<B, 3> for GroupedAttentionBackward {
    /// (q, k, v checkpoints, the constant bias, group)
    type State = (NodeId, NodeId, NodeId, Option<FloatTensor<B>>, usize);

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (q_id, k_id, v_id, bias, group) = ops.state;
        let q: FloatTensor<B> = checkpointer.retrieve_node_output(q_id);
        let k: FloatTensor<B> = checkpointer.retrieve_node_output(k_id);
        let v: FloatTensor<B> = checkpointer.retrieve_node_output(v_id);
        let [dq, dk, dv] = B::grouped_attention_backward(q, k, v, bias, group, grad);
        for (node, d) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, d);
            }
        }
    }
}

#[derive(Debug)]
struct RotaryBackward;

impl<B: AttentionOps> Backward<B, 1> for RotaryBackward {
    /// (cos, sin): constants (tables of angles).
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let Some(parent) = parent else { return };
        let (cos, sin) = ops.state;
        // The rotation is orthogonal: its transpose is the rotation by the opposite angles.
        grads.register::<B>(parent.id, B::rotary(grad, cos, B::float_neg(sin)));
    }
}

/// The probabilities are not kept: the backward node holds the inputs and recomputes them.
impl<B: AttentionOps, C: CheckpointStrategy> AttentionOps for Autodiff<B, C> {
    fn grouped_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        group: usize,
    ) -> FloatTensor<Self> {
        // The bias is a mask built from data: a constant, whatever its node says.
        let bias = bias.map(|b| b.primitive);
        let out = B::grouped_attention(
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
            bias.clone(),
            group,
        );
        match GroupedAttentionBackward
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (
                    prep.checkpoint(&q),
                    prep.checkpoint(&k),
                    prep.checkpoint(&v),
                    bias,
                    group,
                );
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        // The angles are tables built from positions: constants, whatever their nodes say.
        let (cos, sin) = (cos.primitive, sin.primitive);
        let out = B::rotary(x.primitive.clone(), cos.clone(), sin.clone());
        match RotaryBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((cos, sin), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

impl<B: LogProbOps, C: CheckpointStrategy> LogProbOps for Autodiff<B, C> {
    fn stat_dtype(logits_dtype: burn::tensor::DType) -> burn::tensor::DType {
        B::stat_dtype(logits_dtype)
    }

    fn max_tensor_bytes(device: &Self::Device) -> Option<u64> {
        B::max_tensor_bytes(device)
    }

    fn device_memory_reserved(device: &Self::Device) -> Option<u64> {
        B::device_memory_reserved(device)
    }

    fn token_logprobs(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        match TokenLogprobsBackward
            .prepare::<C>([logits.node.clone()])
            // Saves its state (lse) rather than being recomputed under checkpointing.
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let logits_id = prep.checkpoint(&logits);
                let (out, lse) = B::token_logprobs_with_lse(logits.primitive, targets.clone());
                prep.finish((logits_id, targets, lse), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::token_logprobs(logits.primitive, targets)),
        }
    }

    fn kl_full(p_logits: FloatTensor<Self>, q_logits: FloatTensor<Self>) -> FloatTensor<Self> {
        match KlFullBackward
            .prepare::<C>([p_logits.node.clone(), q_logits.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let p_id = prep.checkpoint(&p_logits);
                let q_id = prep.checkpoint(&q_logits);
                let (kl, stats) = B::kl_full_with_stats(p_logits.primitive, q_logits.primitive);
                prep.finish((p_id, q_id, stats), kl)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::kl_full(p_logits.primitive, q_logits.primitive))
            }
        }
    }

    // The `*_with_lse` / `*_with_stats` / `*_backward` methods keep their default bodies here:
    // on an autodiff backend they are only reached through a second-order use, where the
    // composed (differentiable) default is the right answer.
}
