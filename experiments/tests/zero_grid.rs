//! No kernel launch of an empty grid on the path that broke CUDA (issue 61, item 6).
//!
//! The second H200 lease found SmolLM2 + LoRA failing on CUDA with `CUDA_ERROR_INVALID_VALUE`:
//! saving the model wrote each frozen weight as a tensor of no elements, and filling it, then
//! reading it back, launched kernels of zero cubes — which the CUDA driver refuses and the CPU
//! backends and the Vulkan driver never notice. CubeCL's `full` profiling level logs each
//! launch's grid; `rlany_kernels::launches::watch_grids` reads it, so this test sees such a
//! launch on WGPU (the CPU's Vulkan driver in CI). It first shows that it would: an empty
//! tensor made and read on WGPU launches kernels of empty grids (the control); then it saves,
//! loads and reads a LoRA model with frozen weights, as a run's checkpoint does, and asserts
//! that none of that launches one.
//!
//! Its own test binary: CubeCL reads its configuration once per process.
#![cfg(feature = "wgpu")]

use burn::backend::{Autodiff, Wgpu};
use burn::prelude::*;
use rlany_framework::checkpoint::{Reader, Writer};
use rlany_framework::experiment::LoraSpec;
use rlany_framework::{CausalLm, Rng, SampleParams};
use rlany_kernels::launches::{empty_grids, watch_grids};
use rlany_models::TransformerConfig;

type B = Autodiff<Wgpu>;

#[test]
fn saving_loading_and_reading_a_lora_model_launches_no_empty_grid() {
    watch_grids().expect("the grid watch starts before any device");
    let device = Default::default();

    // The control: a tensor of no elements, filled and read back, is the old placeholder's
    // path; its launches are seen with their empty grids.
    let empty = Tensor::<Wgpu, 2>::zeros([0, 4], &device);
    drop(empty.into_data());
    let control = empty_grids();
    assert!(
        !control.is_empty(),
        "an empty tensor filled and read launched no empty grid: the watch does not see them"
    );

    // A LoRA model with frozen base weights: saved as a run's checkpoint saves it (the frozen
    // weights as placeholders), loaded into a fresh copy, and read (a forward pass and a
    // short generation).
    let config = TransformerConfig::new(61, 32, 2, 4, 2, 64, 64);
    let lora = LoraSpec {
        r: 4,
        lora_alpha: 8.0,
        ..Default::default()
    };
    let fresh = || {
        config
            .init_seeded::<B>(&device, &mut Rng::new(3))
            .expect("model")
            .with_lora(&lora, &mut Rng::new(4))
    };
    let dir = std::env::temp_dir().join(format!("rlany-zero-grid-{}", std::process::id()));
    let writer = Writer::begin(&dir, 1).expect("checkpoint");
    writer.trainable("policy", &fresh()).expect("save");
    writer.state(&0u32).expect("state");
    writer.commit(1).expect("commit");
    let reader = Reader::latest(&dir).expect("the checkpoint");
    let model = reader.trainable("policy", fresh(), &device).expect("load");
    let tokens =
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![1i64, 5, 9, 2], [1, 4]), &device);
    let logits = model.forward(tokens);
    drop(logits.into_data());
    let params = SampleParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 4,
        stop_tokens: Vec::new(),
        on_device: true,
    };
    let _ = model.generate(&[vec![1, 2, 3]], &params, &mut Rng::new(5));
    let _ = std::fs::remove_dir_all(&dir);

    let after = empty_grids();
    let new: Vec<_> = after
        .iter()
        .filter(|(k, n)| control.get(*k).copied().unwrap_or(0) < **n)
        .collect();
    assert!(
        new.is_empty(),
        "saving, loading or reading the LoRA model launched empty grids: {new:?}"
    );
}
