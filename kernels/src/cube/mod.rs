//! [`LogProbOps`] for `CubeBackend<R, ..>`, generic over the runtime: one impl serves wgpu and
//! cuda. Launch planning and buffer allocation here; the `#[cube]` code is in [`kernel`].

pub(crate) mod decode;
mod decode_kernel;
mod kernel;
mod softmax;
mod softmax_kernel;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, FloatDType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::features::Plane;
use cubecl::prelude::*;

use crate::attention::AttentionOps;
use crate::ops::{KlStats, LogProbOps};
use kernel::MAX_CUBE_UNITS;

/// The decode step in one pass per op ([`crate::decode`]); the training ops keep the default
/// composition (Burn's own matmul and softmax kernels).
impl<R, F, I, BT> AttentionOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    const DECODE_KERNELS: bool = true;

    fn rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match x.meta.shape()[3] % 2 {
            0 => decode::rotary(x, cos, sin),
            // The kernel rotates pairs of halves; an odd head dimension has none, so it goes
            // to the composition, which answers it as it always has (the twin's behaviour).
            _ => crate::ops::into_prim(crate::rotary::reference_rotary::<Self>(
                crate::ops::float(x),
                crate::ops::float(cos),
                crate::ops::float(sin),
            )),
        }
    }

    fn attention_softmax(
        scores: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        softmax::attention_softmax(scores, bias)
    }

    fn softmax_backward(probs: FloatTensor<Self>, dprobs: FloatTensor<Self>) -> FloatTensor<Self> {
        softmax::softmax_backward(probs, dprobs)
    }

    fn add_rms_norm(
        x: FloatTensor<Self>,
        residual: Option<FloatTensor<Self>>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        decode::add_rms_norm(x, residual, gamma, epsilon)
    }

    fn rotary_cache_write(
        qkv: [FloatTensor<Self>; 3],
        bias: [Option<FloatTensor<Self>>; 3],
        angles: [FloatTensor<Self>; 2],
        buffers: [FloatTensor<Self>; 2],
        at: usize,
        heads: crate::decode::Heads,
    ) -> [FloatTensor<Self>; 3] {
        decode::rotary_cache_write(qkv, bias, angles, buffers, at, heads)
    }

    fn cached_attention(
        q: FloatTensor<Self>,
        k_buffer: FloatTensor<Self>,
        v_buffer: FloatTensor<Self>,
        keys: usize,
        bias: Option<FloatTensor<Self>>,
        group: usize,
    ) -> Option<FloatTensor<Self>> {
        decode::cached_attention(q, k_buffer, v_buffer, keys, bias, group, None)
    }

    fn sample_rows(
        logits: FloatTensor<Self>,
        uniforms: Option<FloatTensor<Self>>,
        temperature: f64,
    ) -> Option<FloatTensor<Self>> {
        Some(decode::sample_rows(logits, uniforms, temperature))
    }
}

impl<R, F, I, BT> LogProbOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn stat_dtype(_logits_dtype: DType) -> DType {
        DType::F32
    }

    fn max_tensor_bytes(device: &Self::Device) -> Option<u64> {
        Some(R::client(device).properties().memory.max_page_size)
    }

    fn device_memory_reserved(device: &Self::Device) -> Option<u64> {
        R::client(device)
            .memory_usage()
            .ok()
            .map(|m| m.bytes_reserved)
    }

    fn token_logprobs(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        token_logprobs_fwd(logits, targets).0
    }

    fn token_logprobs_with_lse(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        token_logprobs_fwd(logits, targets)
    }

    fn token_logprobs_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        token_logprobs_bwd(logits, targets, f32_stat::<Self>(lse), grad)
    }

    fn kl_full(p_logits: FloatTensor<Self>, q_logits: FloatTensor<Self>) -> FloatTensor<Self> {
        kl_full_fwd(p_logits, q_logits).0
    }

    fn kl_full_with_stats(
        p_logits: FloatTensor<Self>,
        q_logits: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, KlStats<Self>) {
        let (out, lse_p, lse_q, kl) = kl_full_fwd(p_logits, q_logits);
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
        let stats = [
            f32_stat::<Self>(stats.lse_p),
            f32_stat::<Self>(stats.lse_q),
            f32_stat::<Self>(stats.kl),
        ];
        kl_full_bwd(p_logits, q_logits, stats, grad, need_p, need_q)
    }
}

/// The kernels read saved statistics as f32; the kernels' own forward already writes f32.
fn f32_stat<B: burn::tensor::backend::Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    use burn::tensor::TensorMetadata;
    if t.dtype() == DType::F32 {
        t
    } else {
        B::float_cast(t, FloatDType::F32)
    }
}

/// How a `[rows, vocab]` problem maps onto cubes.
#[derive(Debug, Clone)]
struct Plan {
    /// Lanes per load (divides `vocab`).
    vector_size: usize,
    vecs_per_row: usize,
    /// Units per row (power of two).
    units: u32,
    /// Plane size to reduce with, or 0 for the shared-memory tree.
    plane_size: u32,
    cube_dim: CubeDim,
    cube_count: CubeCount,
}

impl Plan {
    fn new<R: Runtime>(
        client: &ComputeClient<R>,
        rows: usize,
        vocab: usize,
        elem_size: usize,
    ) -> Self {
        let vector_size = client
            .io_optimized_vector_sizes(elem_size)
            .filter(|s| vocab.is_multiple_of(*s))
            .max()
            .unwrap_or(1);
        let vecs_per_row = vocab / vector_size;
        let hw = &client.properties().hardware;
        let max_units = prev_power_of_two(
            (MAX_CUBE_UNITS as usize)
                .min(hw.max_units_per_cube as usize)
                .min(hw.max_cube_dim.0 as usize)
                .max(1),
        );
        // Units per row: about `VECTORS_PER_UNIT` loads each (enough bytes in flight per unit,
        // few idle units on short rows), at most a full cube; then pack rows into the cube.
        let per_unit = env_flags().vectors_per_unit;
        let units = vecs_per_row
            .div_ceil(per_unit)
            .next_power_of_two()
            .clamp(1, max_units);
        let rows_per_cube = (max_units / units)
            .min(rows.next_power_of_two())
            .min(hw.max_cube_dim.1.max(1) as usize)
            .max(1);
        let cube_dim = CubeDim::new_2d(units as u32, rows_per_cube as u32);
        let cubes = rows.div_ceil(rows_per_cube);
        let cube_count = cubecl::calculate_cube_count_elemwise(
            client,
            cubes * cube_dim.num_elems() as usize,
            cube_dim,
        );

        let plane_ok = client.properties().features.plane.contains(Plane::Ops)
            && hw.plane_size_min == hw.plane_size_max
            && hw.plane_size_min > 1
            && (units as u32).is_multiple_of(hw.plane_size_min)
            && env_flags().plane;
        let plane_size = if plane_ok { hw.plane_size_min } else { 0 };
        let plan = Plan {
            vector_size,
            vecs_per_row,
            units: units as u32,
            plane_size,
            cube_dim,
            cube_count,
        };
        if env_flags().debug {
            eprintln!(
                "rlany-kernels: [{rows}, {vocab}] x{elem_size}B -> {plan:?} (planes: {:?}, size {}..{})",
                client.properties().features.plane,
                hw.plane_size_min,
                hw.plane_size_max
            );
        }
        plan
    }
}

/// Switches read once from the environment: `RLANY_KERNELS_PLANE=0` forces the shared-memory
/// reductions (to test that path where planes exist); `RLANY_KERNELS_DEBUG=1` prints each plan;
/// `RLANY_KERNELS_VPU=k` sets the vector loads per unit the plan aims for (tuning).
struct EnvFlags {
    plane: bool,
    debug: bool,
    vectors_per_unit: usize,
}

/// Target number of vector loads per unit and row (`RLANY_KERNELS_VPU` overrides it).
const VECTORS_PER_UNIT: usize = 8;

fn env_flags() -> &'static EnvFlags {
    static FLAGS: std::sync::OnceLock<EnvFlags> = std::sync::OnceLock::new();
    FLAGS.get_or_init(|| EnvFlags {
        plane: std::env::var("RLANY_KERNELS_PLANE").map_or(true, |v| v != "0"),
        debug: std::env::var("RLANY_KERNELS_DEBUG").is_ok_and(|v| v != "0"),
        vectors_per_unit: std::env::var("RLANY_KERNELS_VPU")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v: &usize| v > 0)
            .unwrap_or(VECTORS_PER_UNIT),
    })
}

/// `t` in `dtype`: itself where it already is, cast otherwise.
fn in_dtype<R: CubeRuntime>(t: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    match t.dtype == dtype {
        true => t,
        false => burn_cubecl::kernel::cast(t, dtype),
    }
}

fn prev_power_of_two(x: usize) -> usize {
    if x.is_power_of_two() {
        x
    } else {
        x.next_power_of_two() / 2
    }
}

fn dims2<R: CubeRuntime>(t: &CubeTensor<R>, what: &str) -> (usize, usize) {
    let shape = t.meta.shape();
    assert_eq!(
        shape.num_dims(),
        2,
        "{what}: expected [rows, vocab], got {shape:?}"
    );
    (shape[0], shape[1])
}

fn address_type<R: CubeRuntime>(tensors: &[&CubeTensor<R>]) -> AddressType {
    tensors
        .iter()
        .map(|t| t.required_address_type())
        .max()
        .unwrap_or_default()
}

fn token_logprobs_fwd<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let logits = into_contiguous(logits);
    let targets = into_contiguous(targets);
    let (rows, vocab) = dims2(&logits, "token_logprobs");
    assert_eq!(
        targets.meta.shape()[0],
        rows,
        "token_logprobs: targets must be [rows]"
    );
    let client = logits.client.clone();
    let device = logits.device.clone();
    let out = empty_device_dtype(
        client.clone(),
        device.clone(),
        Shape::new([rows]),
        logits.dtype,
    );
    let lse = empty_device_dtype(client.clone(), device, Shape::new([rows]), DType::F32);
    if rows == 0 {
        return (out, lse);
    }
    assert!(vocab > 0, "token_logprobs: empty vocabulary");
    let plan = Plan::new(&client, rows, vocab, logits.dtype.size());
    let dtypes = [logits.dtype.into(), targets.dtype.into()];
    let addr = address_type(&[&logits, &targets, &out, &lse]);
    {
        kernel::token_logprobs_fwd::launch::<R>(
            &client,
            plan.cube_count,
            plan.cube_dim,
            addr,
            plan.vector_size,
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            rows,
            plan.vecs_per_row,
            plan.units,
            plan.plane_size,
            dtypes,
        );
    }
    (out, lse)
}

fn token_logprobs_bwd<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
    lse: CubeTensor<R>,
    grad: CubeTensor<R>,
) -> CubeTensor<R> {
    let logits = into_contiguous(logits);
    let targets = into_contiguous(targets);
    let lse = into_contiguous(lse);
    let grad = into_contiguous(grad);
    let (rows, vocab) = dims2(&logits, "token_logprobs_backward");
    let client = logits.client.clone();
    let out = empty_device_dtype(
        client.clone(),
        logits.device.clone(),
        Shape::new([rows, vocab]),
        logits.dtype,
    );
    if rows == 0 || vocab == 0 {
        return out;
    }
    let grad = in_dtype(grad, logits.dtype);
    let plan = Plan::new(&client, rows, vocab, logits.dtype.size());
    let dtypes = [logits.dtype.into(), targets.dtype.into()];
    let addr = address_type(&[&logits, &targets, &lse, &grad, &out]);
    {
        kernel::token_logprobs_bwd::launch::<R>(
            &client,
            plan.cube_count,
            plan.cube_dim,
            addr,
            plan.vector_size,
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            lse.into_tensor_arg(),
            grad.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows,
            plan.vecs_per_row,
            plan.units,
            dtypes,
        );
    }
    out
}

/// Returns `(kl in p's dtype, lse_p, lse_q, kl in f32)`.
fn kl_full_fwd<R: CubeRuntime>(
    p: CubeTensor<R>,
    q: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let p = into_contiguous(p);
    let q = into_contiguous(q);
    let (rows, vocab) = dims2(&p, "kl_full");
    assert_eq!(
        dims2(&q, "kl_full"),
        (rows, vocab),
        "kl_full: p and q shapes differ"
    );
    let q = in_dtype(q, p.dtype);
    let client = p.client.clone();
    let device = p.device.clone();
    let row_f32 = || {
        empty_device_dtype(
            client.clone(),
            device.clone(),
            Shape::new([rows]),
            DType::F32,
        )
    };
    let (lse_p, lse_q, kl) = (row_f32(), row_f32(), row_f32());
    let out = empty_device_dtype(client.clone(), device.clone(), Shape::new([rows]), p.dtype);
    if rows > 0 {
        assert!(vocab > 0, "kl_full: empty vocabulary");
        let plan = Plan::new(&client, rows, vocab, p.dtype.size());
        let addr = address_type(&[&p, &q, &out, &lse_p]);
        let dtype = p.dtype.into();
        {
            kernel::kl_full_fwd::launch::<R>(
                &client,
                plan.cube_count,
                plan.cube_dim,
                addr,
                plan.vector_size,
                p.into_tensor_arg(),
                q.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                lse_p.clone().into_tensor_arg(),
                lse_q.clone().into_tensor_arg(),
                kl.clone().into_tensor_arg(),
                rows,
                plan.vecs_per_row,
                plan.units,
                plan.plane_size,
                dtype,
            );
        }
    }
    (out, lse_p, lse_q, kl)
}

/// `stats` are `(lse_p, lse_q, kl)`, f32.
fn kl_full_bwd<R: CubeRuntime>(
    p: CubeTensor<R>,
    q: CubeTensor<R>,
    stats: [CubeTensor<R>; 3],
    grad: CubeTensor<R>,
    need_p: bool,
    need_q: bool,
) -> (Option<CubeTensor<R>>, Option<CubeTensor<R>>) {
    if !need_p && !need_q {
        return (None, None);
    }
    let p = into_contiguous(p);
    let q = into_contiguous(q);
    let (rows, vocab) = dims2(&p, "kl_full_backward");
    let client = p.client.clone();
    let device = p.device.clone();
    let (p_dtype, q_dtype) = (p.dtype, q.dtype);
    let q = in_dtype(q, p.dtype);
    let grad = into_contiguous(grad);
    let grad = in_dtype(grad, p.dtype);
    let [lse_p, lse_q, kl] = stats;
    let full = || {
        empty_device_dtype(
            client.clone(),
            device.clone(),
            Shape::new([rows, vocab]),
            p_dtype,
        )
    };
    let plan = Plan::new(&client, rows, vocab, p_dtype.size());
    // A one-vector stand-in for the output that is not wanted (never written).
    let dummy = || {
        empty_device_dtype(
            client.clone(),
            device.clone(),
            Shape::new([1, plan.vector_size]),
            p_dtype,
        )
    };
    let dp = if need_p { full() } else { dummy() };
    let dq = if need_q { full() } else { dummy() };
    if rows > 0 && vocab > 0 {
        let addr = address_type(&[&p, &q, &dp, &dq]);
        {
            kernel::kl_full_bwd::launch::<R>(
                &client,
                plan.cube_count,
                plan.cube_dim,
                addr,
                plan.vector_size,
                p.into_tensor_arg(),
                q.into_tensor_arg(),
                into_contiguous(lse_p).into_tensor_arg(),
                into_contiguous(lse_q).into_tensor_arg(),
                into_contiguous(kl).into_tensor_arg(),
                grad.into_tensor_arg(),
                dp.clone().into_tensor_arg(),
                dq.clone().into_tensor_arg(),
                rows,
                plan.vecs_per_row,
                plan.units,
                need_p,
                need_q,
                p_dtype.into(),
            );
        }
    }
    let dq = match (need_q, q_dtype == p_dtype) {
        (false, _) => None,
        (true, true) => Some(dq),
        (true, false) => Some(burn_cubecl::kernel::cast(dq, q_dtype)),
    };
    (need_p.then_some(dp), dq)
}
