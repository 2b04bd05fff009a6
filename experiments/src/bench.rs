//! `rlany bench --kernels`: the K1/K2 kernel workloads (`--models`: the model workloads,
//! `bench_models.rs`) of `kernels/BENCH.md`, fused and reference,
//! beside a device-to-device copy measured in the same run (the bandwidth ceiling).
//!
//! Timing: warm-up runs first (kernel compilation), the device is synchronised before every
//! clock read, the median of `--reps` (≥ 10 by default) runs is reported; inputs are random
//! normal logits and uniform targets. Effective bandwidth = the bytes kernels/BENCH.md says must move
//! (K1_fwd N·V·elt, K1_fwdbwd 2·N·V·elt, K2_fwd 2·N·V·elt) / median time.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, FloatDType};
use rlany_kernels::{AutodiffLogProbOps, KernelChoice, LogProbOps};

/// Options of `rlany bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// Run the kernel workloads (K1_fwd, K1_fwdbwd, K2_fwd of kernels/BENCH.md).
    #[arg(long)]
    kernels: bool,
    /// Run the model workloads (R_ rollout and T_ PPO step of kernels/BENCH.md, C_tiny_T).
    #[arg(long)]
    models: bool,
    /// The exchange of a spread run: exact gathers of gradient-sized buffers between local
    /// peers, or between MPI ranks (with plain all-reduces beside) when started by mpirun
    /// (reports/perf/NOTES.md §10).
    #[arg(long)]
    exchange: bool,
    /// With --exchange: local peers.
    #[arg(long, default_value_t = 2)]
    peers: usize,
    /// With --exchange: buffer sizes in millions of f32 values (default: the quickstart
    /// policy's gradients, SmolLM2's all-linear r=8 adapters, SmolLM2 whole, the 0.5B shape).
    #[arg(long, value_delimiter = ',', default_values_t = [0.104f64, 2.442, 134.5, 494.0])]
    sizes_m: Vec<f64>,
    /// With --exchange: skip an exchange whose buffer on one peer would pass this many GiB.
    #[arg(long, default_value_t = 2.5)]
    max_buffer_gib: f64,
    /// With --models: the reduced CPU sizes (rows named `…@quick`), about a minute on a CPU.
    #[arg(long)]
    quick: bool,
    /// With --models: the PPO steps' rows in this many groups run forward and backward at
    /// once, as a run's update with `shards: n` (rollouts are one batch).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// With --models: every selected workload with this many rows (rollout or PPO rows; the
    /// lengths kept), named `…@rows<N>` — e.g. a full-size PPO step's time shares at a
    /// fraction of its rows on a slow device.
    #[arg(long, value_name = "N")]
    rows: Option<usize>,
    /// With --models: only workloads whose name starts with one of these (e.g. R_small,T_small).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// With --models on a Cube backend (wgpu, cuda): also count kernel launches — per decoded
    /// token and per layer for the rollouts, per step for the PPO steps, by kernel — in the
    /// table and the JSON (a measure of how launch-bound a workload is that is the same on
    /// any device).
    #[arg(long)]
    launches: bool,
    /// With --models on a Cube backend: --launches, and each counted launch timed (CubeCL's
    /// `basic` profiling: the device waits for every kernel), the time per unit by kernel
    /// in the table and the JSON — where a workload's device time goes after its warm-up,
    /// compilation and autotuning apart. The workloads' own times are then not comparable
    /// with unprofiled ones.
    #[arg(long)]
    profile: bool,
    /// ndarray, flex, wgpu, cuda or cuda:N (flex, wgpu and cuda need the matching cargo
    /// feature).
    #[arg(long, default_value = "ndarray")]
    backend: String,
    /// Also write the results as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Rows (tokens) N of the logits. kernels/BENCH.md uses 16384; reduce it on a CPU (e.g. 512).
    #[arg(long, default_value_t = 16384)]
    n: usize,
    /// Timed repetitions per workload (the median is reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Untimed warm-up runs per workload.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Vocabulary sizes V.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 32768, 151_936])]
    vocab: Vec<usize>,
    /// Kernels: the logit dtypes (f32, bf16, f16); unsupported ones are skipped. Models: one
    /// dtype for every workload (default: each workload's own, BENCH.md's).
    #[arg(long, value_delimiter = ',')]
    dtype: Vec<String>,
    /// Largest single logits tensor in GiB: N is reduced for a V where [N, V] would exceed it
    /// (the effective N is printed). Default: the backend's binding limit (wgpu), else none.
    #[arg(long)]
    max_tensor_gib: Option<f64>,
}

/// One measured row.
#[derive(Debug, Clone)]
struct Row {
    name: String,
    workload: &'static str,
    vocab: usize,
    dtype: String,
    variant: &'static str,
    n: usize,
    bytes: f64,
    ms: Option<f64>,
    error: Option<String>,
}

pub(crate) fn run(args: BenchArgs) -> Result<()> {
    if args.exchange {
        return crate::distributed::bench_exchange(&crate::distributed::ExchangeBench {
            peers: args.peers,
            sizes: args.sizes_m.iter().map(|m| (m * 1e6) as usize).collect(),
            reps: args.reps,
            max_buffer_bytes: (args.max_buffer_gib * (1u64 << 30) as f64) as usize,
            json: args.json.clone(),
        });
    }
    if !args.kernels && !args.models {
        bail!(super::UsageError(
            "rlany bench: pass --kernels, --models, --exchange or a combination".into()
        ));
    }
    if args.models && args.dtype.len() > 1 {
        bail!(super::UsageError(
            "rlany bench --models: give one --dtype (or none for each workload's own)".into()
        ));
    }
    if args.n == 0 || args.reps == 0 || args.vocab.contains(&0) || args.rows == Some(0) {
        bail!(super::UsageError(
            "rlany bench: --n, --reps, --rows and every --vocab must be positive".into()
        ));
    }
    for d in &args.dtype {
        parse_dtype(d)?;
    }
    let backend = super::parse_backend(&args.backend)?;
    if (args.launches || args.profile) && (!args.models || backend.is_cpu()) {
        bail!(super::UsageError(
            "rlany bench --launches and --profile count the model workloads' kernels on a \
             Cube backend: pass --models and --backend wgpu or cuda"
                .into()
        ));
    }
    // Before the device exists: CubeCL reads its configuration once.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if args.profile {
        rlany_kernels::launches::profile_launches()?;
    } else if args.launches {
        rlany_kernels::launches::count_launches()?;
    }
    match backend {
        rlany_framework::BackendKind::NdArray => {
            type B = burn::backend::Autodiff<burn::backend::NdArray<f32>>;
            bench_backend::<B>(&args, &Default::default())
        }
        rlany_framework::BackendKind::Flex => {
            #[cfg(feature = "flex")]
            {
                type B = burn::backend::Autodiff<burn::backend::Flex>;
                bench_backend::<B>(&args, &Default::default())
            }
            #[cfg(not(feature = "flex"))]
            bail!(super::UsageError(
                "backend flex is not compiled in: rebuild with `--features flex`".into()
            ))
        }
        rlany_framework::BackendKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                type B = burn::backend::Autodiff<burn::backend::Wgpu>;
                super::device::probe::<B>("wgpu", &Default::default())?;
                bench_backend::<B>(&args, &Default::default())
            }
            #[cfg(not(feature = "wgpu"))]
            bail!(super::UsageError(
                "backend wgpu is not compiled in: rebuild with `--features wgpu`".into()
            ))
        }
        rlany_framework::BackendKind::Cuda(index) => {
            #[cfg(feature = "cuda")]
            {
                type B = burn::backend::Autodiff<burn::backend::Cuda>;
                let device = burn::backend::cuda::CudaDevice::new(index);
                super::device::probe::<B>(&format!("cuda:{index}"), &device)?;
                bench_backend::<B>(&args, &device)
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = index;
                bail!(super::UsageError(
                    "backend cuda is not compiled in: rebuild with `--features cuda`".into()
                ))
            }
        }
    }
}

fn parse_dtype(s: &str) -> Result<FloatDType> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => FloatDType::F32,
        "bf16" | "bfloat16" => FloatDType::BF16,
        "f16" | "float16" => FloatDType::F16,
        other => bail!(super::UsageError(format!(
            "--dtype {other:?}: expected f32, bf16 or f16"
        ))),
    })
}

pub(crate) fn dtype_name(d: FloatDType) -> &'static str {
    match d {
        FloatDType::F32 => "f32",
        FloatDType::BF16 => "bf16",
        FloatDType::F16 => "f16",
        FloatDType::F64 => "f64",
        FloatDType::Flex32 => "flex32",
    }
}

fn elt_size(d: FloatDType) -> usize {
    match d {
        FloatDType::F64 => 8,
        FloatDType::F32 | FloatDType::Flex32 => 4,
        FloatDType::F16 | FloatDType::BF16 => 2,
    }
}

/// Warm up, then time `reps` runs of `f` (device synchronised before each clock read);
/// returns the median in ms.
pub(crate) fn median_ms<B: Backend, R>(
    device: &B::Device,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> R,
) -> Result<f64> {
    for _ in 0..warmup {
        let out = f();
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e}"))?;
        drop(out);
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e}"))?;
        let start = Instant::now();
        let out = f();
        B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e}"))?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        drop(out);
    }
    times.sort_by(f64::total_cmp);
    let mid = times.len() / 2;
    Ok(if times.len() % 2 == 1 {
        times[mid]
    } else {
        0.5 * (times[mid - 1] + times[mid])
    })
}

/// Runs `f`, turning a panic (device out of memory, binding limits) into an error.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            bail!("{}", msg.lines().next().unwrap_or("panic"))
        }
    }
}

fn bench_backend<B>(args: &BenchArgs, device: &B::Device) -> Result<()>
where
    B: AutodiffBackend + AutodiffLogProbOps,
    B::InnerBackend: LogProbOps,
{
    let mut json = serde_json::Map::new();
    json.insert("backend".into(), B::name(device).into());
    json.insert("reps".into(), args.reps.into());
    let mut results: Vec<serde_json::Value> = Vec::new();
    if args.kernels {
        let (copy, kernel_rows) = bench_kernels::<B>(args, device)?;
        json.insert("n_requested".into(), args.n.into());
        json.insert("warmup".into(), args.warmup.into());
        json.insert("copy".into(), copy);
        results.extend(kernel_rows);
    }
    if args.models {
        let dtype = args.dtype.first().map(|d| parse_dtype(d)).transpose()?;
        println!(
            "rlany bench --models on {}{}",
            B::name(device),
            if args.quick { " (--quick sizes)" } else { "" }
        );
        // Tokens are chosen on the device everywhere but on the CPU backend, as in training.
        let on_device = !super::parse_backend(&args.backend)?.is_cpu();
        let rows = crate::bench_models::run::<B>(
            device,
            args.quick,
            dtype,
            args.reps,
            &args.only,
            on_device,
            args.shards,
            args.launches || args.profile,
            args.rows,
        )?;
        print_model_table(&rows);
        print_launches(&rows);
        results.extend(rows.iter().map(|r| {
            let launches = r.launches.as_ref().map(|l| {
                let by_kernel: serde_json::Map<String, serde_json::Value> = l
                    .by_kernel
                    .iter()
                    .map(|(k, n)| (k.clone(), (*n).into()))
                    .collect();
                let ms_by_kernel: serde_json::Map<String, serde_json::Value> = l
                    .ms_by_kernel
                    .iter()
                    .map(|(k, ms)| (k.clone(), (*ms).into()))
                    .collect();
                let profiled = !l.ms_by_kernel.is_empty();
                serde_json::json!({
                    "per_unit": l.per_unit,
                    "profiled_ms_per_unit": profiled
                        .then(|| l.ms_by_kernel.iter().map(|(_, ms)| ms).sum::<f64>()),
                    "ms_by_kernel": profiled.then_some(ms_by_kernel),
                    "unit": if l.per_layer.is_some() { "decoded token" } else { "step" },
                    "per_layer_per_token": l.per_layer,
                    "outside_layers_per_token": l.outside_layers,
                    "by_kernel": by_kernel,
                })
            });
            serde_json::json!({
                "name": r.name, "workload": r.name, "variant": "rlany", "dtype": r.dtype,
                "shards": args.shards,
                "median_ms": r.ms, "tokens": r.tokens,
                "tokens_per_s": r.ms.map(|ms| r.tokens as f64 / (ms * 1e-3)),
                "gflop_per_s": r.gflop_per_s(),
                "device_reserved_bytes": r.reserved, "error": r.error,
                "launches": launches,
            })
        }));
    }
    json.insert("results".into(), results.into());
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(
            path,
            serde_json::to_string_pretty(&serde_json::Value::Object(json))?,
        )
        .with_context(|| format!("write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn print_model_table(rows: &[crate::bench_models::ModelRow]) {
    println!(
        "{:<18} {:<6} {:>12} {:>10} {:>14} {:>10} {:>12}",
        "name", "dtype", "median ms", "tokens", "tokens/s", "GFLOP/s", "reserved"
    );
    for r in rows {
        let reserved = r.reserved.map_or("-".to_string(), |b| {
            format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
        });
        match r.ms {
            Some(ms) => println!(
                "{:<18} {:<6} {:>12.1} {:>10} {:>14.0} {:>10} {:>12}",
                r.name,
                r.dtype,
                ms,
                r.tokens,
                r.tokens as f64 / (ms * 1e-3),
                r.gflop_per_s()
                    .map_or("-".to_string(), |g| format!("{g:.1}")),
                reserved
            ),
            None => println!(
                "{:<18} {:<6} failed: {}",
                r.name,
                r.dtype,
                r.error.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// The launch counts of `--launches`: per unit and per layer, and each workload's five
/// most launched kernels.
fn print_launches(rows: &[crate::bench_models::ModelRow]) {
    let counted: Vec<_> = rows
        .iter()
        .filter_map(|r| r.launches.as_ref().map(|l| (r, l)))
        .collect();
    if counted.is_empty() {
        return;
    }
    println!("\nkernel launches");
    for (r, l) in counted {
        match l.per_layer {
            Some(per_layer) => println!(
                "{:<18} {:>8.1} per decoded token: {:.1} per layer, {:.1} outside the layers",
                r.name,
                l.per_unit,
                per_layer,
                l.outside_layers.unwrap_or(0.0)
            ),
            None => println!("{:<18} {:>8.0} per PPO step", r.name, l.per_unit),
        }
        for (kernel, n) in l.by_kernel.iter().take(5) {
            let short: String = kernel.chars().take(90).collect();
            println!("{:<18} {n:>8.1}  {short}", "");
        }
        if l.ms_by_kernel.is_empty() {
            continue;
        }
        // Profiled: where the device's time goes, by kernel, with each one's launches.
        let total: f64 = l.ms_by_kernel.iter().map(|(_, ms)| ms).sum();
        let unit = if l.per_layer.is_some() {
            "decoded token"
        } else {
            "PPO step"
        };
        println!(
            "{:<18} {total:>8.2} ms of kernels per {unit} (profiled), the most time first:",
            r.name
        );
        let launched: BTreeMap<&str, f64> =
            l.by_kernel.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        for (kernel, ms) in l.ms_by_kernel.iter().take(12) {
            let short: String = kernel.chars().take(80).collect();
            let n = launched.get(kernel.as_str()).copied().unwrap_or(0.0);
            println!(
                "{:<18} {ms:>8.2} ms {:>5.1}% {n:>7.1}x  {short}",
                "",
                100.0 * ms / total
            );
        }
    }
}

/// The kernel workloads: the copy ceiling (JSON) and one JSON row per measurement.
fn bench_kernels<B>(
    args: &BenchArgs,
    device: &B::Device,
) -> Result<(serde_json::Value, Vec<serde_json::Value>)>
where
    B: AutodiffBackend + LogProbOps,
    B::InnerBackend: LogProbOps,
{
    type Inner<B> = <B as AutodiffBackend>::InnerBackend;
    let backend_name = B::name(device);
    let cap_bytes = args
        .max_tensor_gib
        .map(|g| g * (1u64 << 30) as f64)
        .or_else(|| B::max_tensor_bytes(device).map(|b| b as f64));
    let rows_for = |v: usize, elt: usize| -> usize {
        match cap_bytes {
            Some(cap) => args.n.min(((cap / (v * elt) as f64) as usize).max(1)),
            None => args.n,
        }
    };
    let dtypes: Vec<FloatDType> = if args.dtype.is_empty() {
        vec![FloatDType::F32, FloatDType::BF16]
    } else {
        args.dtype
            .iter()
            .map(|d| parse_dtype(d))
            .collect::<Result<_>>()?
    };
    <Inner<B> as Backend>::seed(device, 20_240_601);
    if args.reps < 10 {
        eprintln!("note: --reps {} is below BENCH.md's 10", args.reps);
    }

    // The ceiling: an element-wise read+write pass (`x·1` into a fresh buffer) over the
    // largest f32 logits tensor of the run.
    let v_max = *args.vocab.iter().max().context("no --vocab")?;
    let copy_n = rows_for(v_max, 4);
    let copy_bytes = 2.0 * (copy_n * v_max * 4) as f64;
    let copy_ms = guarded(|| {
        let x =
            Tensor::<Inner<B>, 2>::random([copy_n, v_max], Distribution::Normal(0.0, 1.0), device);
        median_ms::<Inner<B>, _>(device, args.warmup.max(1), args.reps, || {
            x.clone().mul_scalar(1.0)
        })
    })
    .context("copy ceiling")?;
    let copy_gbps = copy_bytes / (copy_ms * 1e-3) / 1e9;
    println!(
        "rlany bench --kernels on {backend_name}: copy ceiling {copy_gbps:.1} GB/s ({copy_ms:.3} ms for [{copy_n}, {v_max}] f32 read+write)"
    );

    let mut rows: Vec<Row> = Vec::new();
    for &v in &args.vocab {
        for &dtype in &dtypes {
            let dname = dtype_name(dtype);
            let n = rows_for(v, elt_size(dtype));
            if !<Inner<B> as Backend>::supports_dtype(device, dtype.into()) {
                eprintln!("skipped V={v} {dname}: dtype not supported by {backend_name}");
                continue;
            }
            let nv_bytes = (n * v * elt_size(dtype)) as f64;
            let suffix = format!("V{v}_{dname}");
            let logits = |seed_shift: f64| {
                Tensor::<Inner<B>, 2>::random([n, v], Distribution::Normal(seed_shift, 1.0), device)
                    .cast(dtype)
            };
            let x = logits(0.0);
            let y = logits(0.5);
            let t = Tensor::<Inner<B>, 1, Int>::random(
                [n],
                Distribution::Uniform(0.0, v as f64),
                device,
            );
            let g = Tensor::<Inner<B>, 1>::random([n], Distribution::Normal(0.0, 1.0), device)
                .cast(dtype);
            for choice in [KernelChoice::Fused, KernelChoice::Reference] {
                let mut push = |workload: &'static str, bytes: f64, r: Result<f64>| {
                    let (ms, error) = match r {
                        Ok(ms) => (Some(ms), None),
                        Err(e) => (None, Some(format!("{e:#}"))),
                    };
                    rows.push(Row {
                        name: format!("{workload}_{suffix}"),
                        workload,
                        vocab: v,
                        dtype: dname.into(),
                        variant: choice.name(),
                        n,
                        bytes,
                        ms,
                        error,
                    });
                };
                let k1 = guarded(|| {
                    median_ms::<Inner<B>, _>(device, args.warmup, args.reps, || {
                        choice.token_logprobs(x.clone(), t.clone())
                    })
                });
                push("K1_fwd", nv_bytes, k1);

                let xa = Tensor::<B, 2>::from_inner(x.clone());
                let ta = Tensor::<B, 1, Int>::from_inner(t.clone());
                let ga = Tensor::<B, 1>::from_inner(g.clone());
                let k1b = guarded(|| {
                    median_ms::<B, _>(device, args.warmup, args.reps, || {
                        let xg = xa.clone().require_grad();
                        let lp = choice.token_logprobs(xg.clone(), ta.clone());
                        let grads = (lp * ga.clone()).sum().backward();
                        xg.grad(&grads)
                    })
                });
                push("K1_fwdbwd", 2.0 * nv_bytes, k1b);

                let k2 = guarded(|| {
                    median_ms::<Inner<B>, _>(device, args.warmup, args.reps, || {
                        choice.kl_full(x.clone(), y.clone())
                    })
                });
                push("K2_fwd", 2.0 * nv_bytes, k2);
            }
        }
    }

    print_table(&rows, copy_gbps);
    let copy = serde_json::json!({ "ms": copy_ms, "bytes": copy_bytes, "gbps": copy_gbps, "n": copy_n, "vocab": v_max,
                                   "how": "element-wise x*1 into a fresh buffer, f32 read+write" });
    let results = rows
        .iter()
        .map(|r| {
            let gbps = r.ms.map(|ms| r.bytes / (ms * 1e-3) / 1e9);
            serde_json::json!({
                "name": r.name, "workload": r.workload, "vocab": r.vocab, "dtype": r.dtype,
                "variant": r.variant, "n": r.n, "bytes": r.bytes, "median_ms": r.ms,
                "gbps": gbps, "frac_copy": gbps.map(|g| g / copy_gbps), "error": r.error,
            })
        })
        .collect();
    Ok((copy, results))
}

fn print_table(rows: &[Row], copy_gbps: f64) {
    println!(
        "{:<26} {:<10} {:>6} {:>11} {:>9} {:>7} {:>8}",
        "name", "variant", "N", "median ms", "GB/s", "/copy", "speedup"
    );
    for r in rows {
        match r.ms {
            Some(ms) => {
                let gbps = r.bytes / (ms * 1e-3) / 1e9;
                // Fused rows: reference time / fused time for the same workload.
                let speedup = (r.variant == "fused")
                    .then(|| {
                        rows.iter()
                            .find(|o| o.name == r.name && o.variant == "reference")
                            .and_then(|o| o.ms)
                            .map(|ref_ms| format!("{:.2}x", ref_ms / ms))
                    })
                    .flatten()
                    .unwrap_or_default();
                println!(
                    "{:<26} {:<10} {:>6} {:>11.3} {:>9.1} {:>6.1}% {:>8}",
                    r.name,
                    r.variant,
                    r.n,
                    ms,
                    gbps,
                    100.0 * gbps / copy_gbps,
                    speedup
                );
            }
            None => println!(
                "{:<26} {:<10} {:>6} failed: {}",
                r.name,
                r.variant,
                r.n,
                r.error.as_deref().unwrap_or("?")
            ),
        }
    }
}
