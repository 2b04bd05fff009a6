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
use crate::decode::Heads;
use crate::ops::float;
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

/// Which decode op a [`DecodeOp`] runs, with its non-tensor arguments.
#[derive(Clone, Debug)]
enum DecodeKind {
    /// Inputs `[x, (residual,) gamma]`; outputs `[(sum,) normed]`.
    Norm { residual: bool, epsilon: f64 },
    /// Inputs `[q, k, v, (bias q, k, v where given), cos, sin, k_buffer, v_buffer]`; outputs
    /// the same three as the op.
    Rotary {
        at: usize,
        heads: Heads,
        bias: [bool; 3],
    },
    /// Inputs `[q, k_buffer, v_buffer, (bias)]`; output the attention's.
    Attention { keys: usize, group: usize },
    /// Inputs `[logits, (uniforms)]`; output `[rows, 2]`.
    Sample { temperature: f64 },
    /// Inputs `[x, cos, sin]`; output the rotated `x` (training's rotary too).
    Rotate,
    /// Inputs `[scores, (bias)]`; output the probabilities (training's attention).
    Softmax,
    /// Inputs `[probs, dprobs]`; output the scores' gradient (training's attention).
    SoftmaxBackward,
}

/// One op of the fused decode step ([`crate::decode`]), or the rotary that training shares
/// with it, in the fusion stream, run by the inner backend's kernels when the stream executes.
#[derive(Clone, Debug)]
struct DecodeOp<B> {
    desc: CustomOpIr,
    kind: DecodeKind,
    _b: PhantomData<B>,
}

impl<B: FusionBackend + LogProbOps> Operation<B::FusionRuntime> for DecodeOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let mut inputs: Vec<FloatTensor<B>> = self
            .desc
            .inputs
            .iter()
            .map(|t| handles.get_float_tensor::<B>(t))
            .collect();
        let outputs: Vec<FloatTensor<B>> = match self.kind {
            DecodeKind::Norm { residual, epsilon } => {
                let gamma = inputs.pop().expect("gamma");
                let r = residual.then(|| inputs.pop().expect("residual"));
                let x = inputs.pop().expect("x");
                let (sum, normed) = B::add_rms_norm(x, r, gamma, epsilon);
                if residual {
                    vec![sum, normed]
                } else {
                    vec![normed]
                }
            }
            DecodeKind::Rotary { at, heads, bias } => {
                let mut inputs = inputs.into_iter();
                let mut next = || inputs.next().expect("an input per tensor of the op");
                let qkv = [next(), next(), next()];
                let bias = bias.map(|given| given.then(&mut next));
                let angles = [next(), next()];
                let buffers = [next(), next()];
                B::rotary_cache_write(qkv, bias, angles, buffers, at, heads).into()
            }
            DecodeKind::Attention { keys, group } => {
                let bias = (inputs.len() == 4).then(|| inputs.pop().expect("bias"));
                let [q, kb, vb]: [FloatTensor<B>; 3] = inputs
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("three inputs"));
                let out = B::cached_attention(
                    q.clone(),
                    kb.clone(),
                    vb.clone(),
                    keys,
                    bias.clone(),
                    group,
                )
                .unwrap_or_else(|| {
                    // The kernel does not serve this shape: the composition over the filled
                    // positions.
                    let narrow = |t| crate::ops::into_prim(float::<B, 4>(t).narrow(2, 0, keys));
                    B::grouped_attention(q, narrow(kb), narrow(vb), bias, group)
                });
                vec![out]
            }
            DecodeKind::Softmax => {
                let bias = (inputs.len() == 2).then(|| inputs.pop().expect("bias"));
                let scores = inputs.pop().expect("scores");
                vec![B::attention_softmax(scores, bias)]
            }
            DecodeKind::SoftmaxBackward => {
                let dprobs = inputs.pop().expect("dprobs");
                let probs = inputs.pop().expect("probs");
                vec![B::softmax_backward(probs, dprobs)]
            }
            DecodeKind::Rotate => {
                let [x, cos, sin]: [FloatTensor<B>; 3] = inputs
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("three inputs"));
                vec![B::rotary(x, cos, sin)]
            }
            DecodeKind::Sample { temperature } => {
                let uniforms = (inputs.len() == 2).then(|| inputs.pop().expect("uniforms"));
                let logits = inputs.pop().expect("logits");
                vec![
                    B::sample_rows(logits, uniforms, temperature)
                        .expect("a backend with decode kernels samples on the device"),
                ]
            }
        };
        for (ir, t) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<B>(&ir.id, t);
        }
    }
}

/// Registers a decode op: `outputs` are `(shape, dtype)` of each output.
fn decode_op<B: FusionBackend + LogProbOps>(
    name: &'static str,
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: &[(Shape, DType)],
    kind: DecodeKind,
) -> Vec<FloatTensor<Fusion<B>>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outs: Vec<TensorIr> = outputs
        .iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype))
        .collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outs);
    let op = DecodeOp::<B> {
        desc: desc.clone(),
        kind,
        _b: PhantomData,
    };
    client.register(streams, OperationIr::Custom(desc), op)
}

/// The decode step's ops as custom operations that run the inner backend's kernels; the
/// training ops keep the default composition, in fused operations.
impl<B: FusionBackend + LogProbOps> AttentionOps for Fusion<B> {
    const DECODE_KERNELS: bool = B::DECODE_KERNELS;

    fn rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if !B::DECODE_KERNELS {
            return crate::ops::into_prim(crate::rotary::reference_rotary::<Self>(
                float(x),
                float(cos),
                float(sin),
            ));
        }
        let out = (x.shape.clone(), x.dtype);
        decode_op::<B>(
            "rlany_rotary",
            vec![x, cos, sin],
            &[out],
            DecodeKind::Rotate,
        )
        .remove(0)
    }

    fn attention_softmax(
        scores: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        if !B::DECODE_KERNELS {
            return crate::ops::into_prim(crate::attention::reference_attention_softmax::<Self>(
                float(scores),
                bias.map(float),
            ));
        }
        let out = (scores.shape.clone(), scores.dtype);
        let inputs: Vec<_> = [scores].into_iter().chain(bias).collect();
        decode_op::<B>(
            "rlany_attention_softmax",
            inputs,
            &[out],
            DecodeKind::Softmax,
        )
        .remove(0)
    }

    fn softmax_backward(probs: FloatTensor<Self>, dprobs: FloatTensor<Self>) -> FloatTensor<Self> {
        if !B::DECODE_KERNELS {
            return crate::ops::into_prim(crate::attention::reference_softmax_backward::<Self>(
                float(probs),
                float(dprobs),
            ));
        }
        let out = (probs.shape.clone(), probs.dtype);
        decode_op::<B>(
            "rlany_softmax_backward",
            vec![probs, dprobs],
            &[out],
            DecodeKind::SoftmaxBackward,
        )
        .remove(0)
    }

    fn add_rms_norm(
        x: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !B::DECODE_KERNELS {
            return crate::decode::default_add_rms_norm::<Self>(x, residual, gamma, epsilon);
        }
        let out = (x.shape.clone(), x.dtype);
        match residual {
            Some(r) => {
                let mut outs = decode_op::<B>(
                    "rlany_add_rms_norm",
                    vec![x, r, gamma],
                    &[out.clone(), out],
                    DecodeKind::Norm {
                        residual: true,
                        epsilon,
                    },
                );
                let normed = outs.pop().expect("normed");
                (outs.pop().expect("sum"), normed)
            }
            None => {
                let normed = decode_op::<B>(
                    "rlany_rms_norm",
                    vec![x.clone(), gamma],
                    &[out],
                    DecodeKind::Norm {
                        residual: false,
                        epsilon,
                    },
                )
                .remove(0);
                (x, normed)
            }
        }
    }

    fn rotary_cache_write(
        qkv: [FloatTensor<Self>; 3],
        bias: [Option<FloatTensor<Self>>; 3],
        angles: [FloatTensor<Self>; 2],
        buffers: [FloatTensor<Self>; 2],
        at: usize,
        heads: Heads,
    ) -> [FloatTensor<Self>; 3] {
        if !B::DECODE_KERNELS {
            return crate::decode::default_rotary_cache_write::<Self>(
                qkv, bias, angles, buffers, at, heads,
            );
        }
        let [batch, seq] = [qkv[0].shape[0], qkv[0].shape[1]];
        let group = heads.heads / heads.kv_heads;
        let q_shape = Shape::new([batch, heads.kv_heads, group * seq, heads.head_dim]);
        let outputs = [
            (q_shape, qkv[0].dtype),
            (buffers[0].shape.clone(), buffers[0].dtype),
            (buffers[1].shape.clone(), buffers[1].dtype),
        ];
        let given = bias.each_ref().map(Option::is_some);
        let inputs: Vec<_> = qkv
            .into_iter()
            .chain(bias.into_iter().flatten())
            .chain(angles)
            .chain(buffers)
            .collect();
        decode_op::<B>(
            "rlany_rotary_cache_write",
            inputs,
            &outputs,
            DecodeKind::Rotary {
                at,
                heads,
                bias: given,
            },
        )
        .try_into()
        .unwrap_or_else(|_| unreachable!("three outputs"))
    }

    fn cached_attention(
        q: FloatTensor<Self>,
        k_buffer: FloatTensor<Self>,
        v_buffer: FloatTensor<Self>,
        keys: usize,
        bias: Option<FloatTensor<Self>>,
        group: usize,
    ) -> Option<FloatTensor<Self>> {
        if !B::DECODE_KERNELS {
            return None;
        }
        let out = (q.shape.clone(), q.dtype);
        let inputs: Vec<_> = [q, k_buffer, v_buffer].into_iter().chain(bias).collect();
        Some(
            decode_op::<B>(
                "rlany_cached_attention",
                inputs,
                &[out],
                DecodeKind::Attention { keys, group },
            )
            .remove(0),
        )
    }

    fn sample_rows(
        logits: FloatTensor<Self>,
        uniforms: Option<FloatTensor<Self>>,
        temperature: f64,
    ) -> Option<FloatTensor<Self>> {
        if !B::DECODE_KERNELS {
            return None;
        }
        let out = (Shape::new([logits.shape[0], 2]), DType::F32);
        let inputs: Vec<_> = [logits].into_iter().chain(uniforms).collect();
        Some(
            decode_op::<B>(
                "rlany_sample_rows",
                inputs,
                &[out],
                DecodeKind::Sample { temperature },
            )
            .remove(0),
        )
    }
}

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
