//! Kernel launches per decoded token on WGPU (in CI, the CPU's Vulkan driver): a count, not
//! a timing, so a change that adds launches to the decode shows here on any machine. The GPU
//! path was launch-bound (issue 61: ≈ 46 launches per layer per decoded token on the H200).
//! With the fused decode step (rlany-kernels `decode`: add + RMSNorm, rotary with the QKV
//! biases and the KV write, the cached attention, the sampling, one launch each) a layer
//! launches 12 kernels per decoded token: its seven products, two norms, the rotary and
//! write, the attention and the gated product — on 2026-12-06 the tiny workload counts 56 per
//! decoded token, 12.0 per layer and 8.0 outside the layers (embedding, final norm, head,
//! mask, sampling; `rlany bench --models --quick --launches --backend wgpu`); before, 200
//! per token (50 per layer, then measured as the whole token's launches over the layers).
//! The bound below is the target.
//!
//! Its own test binary: CubeCL reads its configuration once per process, and the counter
//! must set it before the first device exists.
#![cfg(feature = "wgpu")]

/// Launches per layer per decoded token that the tiny rollout may not exceed.
const BOUND_PER_LAYER: f64 = 12.0;

#[test]
fn decoding_launches_at_most_the_stated_kernels_per_layer_and_token() {
    let dir = std::env::temp_dir().join(format!("rlany-launches-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let json = dir.join("bench.json");
    let json_s = json.to_string_lossy().into_owned();
    let args = [
        "rlany",
        "bench",
        "--models",
        "--quick",
        "--only",
        "C_tiny_R",
        "--backend",
        "wgpu",
        "--launches",
        "--reps",
        "1",
        "--json",
        &json_s,
    ];
    assert_eq!(rlany::cli_main(args.to_vec()), 0, "rlany bench failed");
    let text = std::fs::read_to_string(&json).expect("the bench JSON");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let row = &v["results"][0];
    assert_eq!(row["name"], "C_tiny_R@quick", "{row}");
    let launches = &row["launches"];
    let per_layer = launches["per_layer_per_token"]
        .as_f64()
        .unwrap_or_else(|| panic!("no launch count: {row}"));
    let kinds = launches["by_kernel"].as_object().map_or(0, |m| m.len());
    eprintln!(
        "C_tiny_R@quick on wgpu: {per_layer:.1} launches per layer per decoded token, {kinds} kernels: {}",
        launches["by_kernel"]
    );
    // The counter sees the decode at all (every layer launches several kernels per token)…
    assert!(per_layer >= 4.0 && kinds >= 3, "{launches}");
    // …and the decode launches no more than the stated bound.
    assert!(
        per_layer <= BOUND_PER_LAYER,
        "{per_layer:.1} launches per layer per decoded token, above the bound of {BOUND_PER_LAYER}: {launches}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
