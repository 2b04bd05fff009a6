//! [`LogProbOps`] for `Fusion<B>` (what Burn's `fusion` feature wraps Wgpu/Cuda in): each op is
//! registered in the fusion stream as one custom operation that, when the stream executes,
//! calls the inner backend's op (the CubeCL kernels for a Cube backend). Real fused dispatch,
//! not a fallback to the composition; the ops act as fusion barriers (Burn's own fusion does
//! not merge them with neighbouring element-wise ops).

use core::marker::PhantomData;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use crate::attention::AttentionOps;
use crate::ops::{KlStats, LogProbOps};

type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

#[derive(Clone, Debug)]
struct TokenFwd<B> {
    desc: CustomOpIr,
    _b: PhantomData<B>,
}

impl<B: FusionBackend + LogProbOps> Operation<B::FusionRuntime> for TokenFwd<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([logits, targets], [out, lse]) = self.desc.as_fixed();
        let logits = handles.get_float_tensor::<B>(logits);
        let targets = handles.get_int_tensor::<B>(targets);
        let (o, l) = B::token_logprobs_with_lse(logits, targets);
        handles.register_float_tensor::<B>(&out.id, o);
        handles.register_float_tensor::<B>(&lse.id, l);
    }
}

#[derive(Clone, Debug)]
struct TokenBwd<B> {
    desc: CustomOpIr,
    _b: PhantomData<B>,
}

impl<B: FusionBackend + LogProbOps> Operation<B::FusionRuntime> for TokenBwd<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([logits, targets, lse, grad], [out]) = self.desc.as_fixed();
        let logits = handles.get_float_tensor::<B>(logits);
        let targets = handles.get_int_tensor::<B>(targets);
        let lse = handles.get_float_tensor::<B>(lse);
        let grad = handles.get_float_tensor::<B>(grad);
        let d = B::token_logprobs_backward(logits, targets, lse, grad);
        handles.register_float_tensor::<B>(&out.id, d);
    }
}

#[derive(Clone, Debug)]
struct KlFwd<B> {
    desc: CustomOpIr,
    _b: PhantomData<B>,
}

impl<B: FusionBackend + LogProbOps> Operation<B::FusionRuntime> for KlFwd<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([p, q], [out, lse_p, lse_q, kl]) = self.desc.as_fixed();
        let p = handles.get_float_tensor::<B>(p);
        let q = handles.get_float_tensor::<B>(q);
        let (o, stats) = B::kl_full_with_stats(p, q);
        handles.register_float_tensor::<B>(&out.id, o);
        handles.register_float_tensor::<B>(&lse_p.id, stats.lse_p);
        handles.register_float_tensor::<B>(&lse_q.id, stats.lse_q);
        handles.register_float_tensor::<B>(&kl.id, stats.kl);
    }
}

#[derive(Clone, Debug)]
struct KlBwd<B> {
    desc: CustomOpIr,
    need_p: bool,
    need_q: bool,
    _b: PhantomData<B>,
}

impl<B: FusionBackend + LogProbOps> Operation<B::FusionRuntime> for KlBwd<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [p, q, lse_p, lse_q, kl, grad] = self.desc.inputs.as_slice() else {
            unreachable!("kl_full_backward takes six inputs")
        };
        let p = handles.get_float_tensor::<B>(p);
        let q = handles.get_float_tensor::<B>(q);
        let stats = KlStats {
            lse_p: handles.get_float_tensor::<B>(lse_p),
            lse_q: handles.get_float_tensor::<B>(lse_q),
            kl: handles.get_float_tensor::<B>(kl),
        };
        let grad = handles.get_float_tensor::<B>(grad);
        let (dp, dq) = B::kl_full_backward(p, q, stats, grad, self.need_p, self.need_q);
        let mut outs = self.desc.outputs.iter();
        for d in [dp, dq].into_iter().flatten() {
            let out = outs.next().expect("one output per requested gradient");
            handles.register_float_tensor::<B>(&out.id, d);
        }
    }
}

/// The default composition, in fused operations.
impl<B: FusionBackend + LogProbOps> AttentionOps for Fusion<B> {}

impl<B: FusionBackend + LogProbOps> LogProbOps for Fusion<B> {
    fn stat_dtype(logits_dtype: DType) -> DType {
        B::stat_dtype(logits_dtype)
    }

    fn max_tensor_bytes(device: &Self::Device) -> Option<u64> {
        B::max_tensor_bytes(device)
    }

    fn device_memory_reserved(device: &Self::Device) -> Option<u64> {
        B::device_memory_reserved(device)
    }

    fn token_logprobs(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        Self::token_logprobs_with_lse(logits, targets).0
    }

    fn token_logprobs_with_lse(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let client = logits.client.clone();
        let n = logits.shape[0];
        let dtype = logits.dtype;
        let streams = OperationStreams::with_inputs([&logits, &targets]);
        let out = TensorIr::uninit(client.create_empty_handle(), Shape::new([n]), dtype);
        let lse = TensorIr::uninit(
            client.create_empty_handle(),
            Shape::new([n]),
            B::stat_dtype(dtype),
        );
        let desc = CustomOpIr::new(
            "rlany_token_logprobs_fwd",
            &[logits.into_ir(), targets.into_ir()],
            &[out, lse],
        );
        let op = TokenFwd::<B> {
            desc: desc.clone(),
            _b: PhantomData,
        };
        let [out, lse]: [_; 2] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .expect("two outputs");
        (out, lse)
    }

    fn token_logprobs_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let client = logits.client.clone();
        let shape = logits.shape.clone();
        let dtype = logits.dtype;
        let streams = OperationStreams::with_inputs([&logits, &targets, &lse, &grad]);
        let out = TensorIr::uninit(client.create_empty_handle(), shape, dtype);
        let desc = CustomOpIr::new(
            "rlany_token_logprobs_bwd",
            &[
                logits.into_ir(),
                targets.into_ir(),
                lse.into_ir(),
                grad.into_ir(),
            ],
            &[out],
        );
        let op = TokenBwd::<B> {
            desc: desc.clone(),
            _b: PhantomData,
        };
        client
            .register(streams, OperationIr::Custom(desc), op)
            .remove(0)
    }

    fn kl_full(p_logits: FloatTensor<Self>, q_logits: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::kl_full_with_stats(p_logits, q_logits).0
    }

    fn kl_full_with_stats(
        p_logits: FloatTensor<Self>,
        q_logits: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, KlStats<Self>) {
        let client = p_logits.client.clone();
        let n = p_logits.shape[0];
        let dtype = p_logits.dtype;
        let stat = B::stat_dtype(dtype);
        let streams = OperationStreams::with_inputs([&p_logits, &q_logits]);
        let row = |dt| TensorIr::uninit(client.create_empty_handle(), Shape::new([n]), dt);
        let outs = [row(dtype), row(stat), row(stat), row(stat)];
        let desc = CustomOpIr::new(
            "rlany_kl_full_fwd",
            &[p_logits.into_ir(), q_logits.into_ir()],
            &outs,
        );
        let op = KlFwd::<B> {
            desc: desc.clone(),
            _b: PhantomData,
        };
        let [out, lse_p, lse_q, kl]: [_; 4] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .expect("four outputs");
        (out, KlStats { lse_p, lse_q, kl })
    }

    fn kl_full_backward(
        p_logits: FloatTensor<Self>,
        q_logits: FloatTensor<Self>,
        stats: KlStats<Self>,
        grad: FloatTensor<Self>,
        need_p: bool,
        need_q: bool,
    ) -> (Option<FloatTensor<Self>>, Option<FloatTensor<Self>>) {
        if !need_p && !need_q {
            return (None, None);
        }
        let client = p_logits.client.clone();
        let shape = p_logits.shape.clone();
        let (p_dtype, q_dtype) = (p_logits.dtype, q_logits.dtype);
        let streams = OperationStreams::with_inputs([
            &p_logits,
            &q_logits,
            &stats.lse_p,
            &stats.lse_q,
            &stats.kl,
            &grad,
        ]);
        let mut outs = Vec::new();
        if need_p {
            outs.push(TensorIr::uninit(
                client.create_empty_handle(),
                shape.clone(),
                p_dtype,
            ));
        }
        if need_q {
            outs.push(TensorIr::uninit(
                client.create_empty_handle(),
                shape,
                q_dtype,
            ));
        }
        let id = match (need_p, need_q) {
            (true, true) => "rlany_kl_full_bwd_pq",
            (true, false) => "rlany_kl_full_bwd_p",
            _ => "rlany_kl_full_bwd_q",
        };
        let desc = CustomOpIr::new(
            id,
            &[
                p_logits.into_ir(),
                q_logits.into_ir(),
                stats.lse_p.into_ir(),
                stats.lse_q.into_ir(),
                stats.kl.into_ir(),
                grad.into_ir(),
            ],
            &outs,
        );
        let op = KlBwd::<B> {
            desc: desc.clone(),
            need_p,
            need_q,
            _b: PhantomData,
        };
        let mut results = client
            .register(streams, OperationIr::Custom(desc), op)
            .into_iter();
        let dp = need_p.then(|| results.next().expect("dp"));
        let dq = need_q.then(|| results.next().expect("dq"));
        (dp, dq)
    }
}
