//! Low-rank adapters (LoRA, Hu et al., arXiv 2106.09685) on a decoder's projections.
//!
//! A targeted projection `y = x·W` (Burn stores `W` as `[d_in, d_out]`) becomes
//! `y = x·W + s · (x·A)·B` with `W` frozen, `A: [d_in, r]`, `B: [r, d_out]` and
//! `s = lora_alpha / r`. As in PEFT, `A` is drawn uniformly in `±1/√d_in` (PyTorch's
//! Kaiming-uniform with `a = √5` on an `r × d_in` weight) and `B` starts at zero, so the
//! adapted model computes exactly what the base does until the first update.
//!
//! [`Transformer::with_lora`] freezes the base and attaches the adapters (it and
//! [`Transformer`]'s other adapter methods — inspect, drop, merge, count — are at the end of
//! this file); only the adapters then receive gradients, so an optimiser keeps state for
//! them alone. The frozen weights are shared, not copied, by every clone of the model
//! (Burn's tensors are reference-counted): a KL reference taken before the first update,
//! or a judge built from the same base, costs the adapters' memory only.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use rlany_framework::Rng;
use rlany_framework::experiment::LoraSpec;
use rlany_kernels::AttentionOps;

use crate::transformer::Transformer;

/// One adapter pair on a projection `[d_in] → [d_out]`.
#[derive(Module, Debug)]
pub struct LoraAdapter<B: Backend> {
    /// `[d_in, r]`, trained.
    a: Param<Tensor<B, 2>>,
    /// `[r, d_out]`, trained; zero at initialisation.
    b: Param<Tensor<B, 2>>,
    /// `lora_alpha / r`.
    scaling: f64,
}

impl<B: Backend> LoraAdapter<B> {
    /// A fresh adapter: `A` uniform in `±1/√d_in` from `rng`, `B` zero.
    pub fn init(
        d_in: usize,
        d_out: usize,
        spec: &LoraSpec,
        rng: &mut Rng,
        device: &B::Device,
    ) -> Self {
        let bound = 1.0 / (d_in as f64).sqrt();
        let a: Vec<f32> = (0..d_in * spec.r)
            .map(|_| ((2.0 * rng.uniform() - 1.0) * bound) as f32)
            .collect();
        Self {
            a: Param::from_tensor(Tensor::from_data(
                TensorData::new(a, [d_in, spec.r]),
                device,
            )),
            b: Param::from_tensor(Tensor::zeros([spec.r, d_out], device)),
            scaling: spec.scaling(),
        }
    }

    /// The low-rank update of `x`: `s · (x·A)·B`.
    ///
    /// # Shapes
    /// - `x`: `[rows, d_in]`
    /// - output: `[rows, d_out]`
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let dtype = x.dtype();
        x.matmul(self.a.val().cast(dtype))
            .matmul(self.b.val().cast(dtype))
            .mul_scalar(self.scaling)
    }

    /// `A` (`[d_in, r]`) and `B` (`[r, d_out]`).
    pub(crate) fn parts(&self) -> (Tensor<B, 2>, Tensor<B, 2>) {
        (self.a.val(), self.b.val())
    }

    /// The same adapter with `A` and `B` replaced (shapes checked by the caller).
    pub(crate) fn with_parts(self, a: Tensor<B, 2>, b: Tensor<B, 2>) -> Self {
        Self {
            a: self.a.map(|_| a),
            b: self.b.map(|_| b),
            scaling: self.scaling,
        }
    }

    /// The dense update `s · A·B` this adapter adds to its projection's weight.
    ///
    /// # Shapes
    /// - output: `[d_in, d_out]`
    pub fn delta(&self) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val()).mul_scalar(self.scaling)
    }
}

/// The adapters of one decoder block, one optional pair per projection, named as in
/// Hugging Face's Llama (`q_proj` … `down_proj`).
#[derive(Module, Debug)]
pub struct BlockLora<B: Backend> {
    pub(crate) q_proj: Option<LoraAdapter<B>>,
    pub(crate) k_proj: Option<LoraAdapter<B>>,
    pub(crate) v_proj: Option<LoraAdapter<B>>,
    pub(crate) o_proj: Option<LoraAdapter<B>>,
    pub(crate) gate_proj: Option<LoraAdapter<B>>,
    pub(crate) up_proj: Option<LoraAdapter<B>>,
    pub(crate) down_proj: Option<LoraAdapter<B>>,
}

impl<B: Backend> BlockLora<B> {
    /// Each projection's adapter with its module path in a Hugging Face Llama block
    /// (`self_attn.q_proj`, …, `mlp.down_proj`).
    pub(crate) fn named(&self) -> [(&'static str, Option<&LoraAdapter<B>>); 7] {
        [
            ("self_attn.q_proj", self.q_proj.as_ref()),
            ("self_attn.k_proj", self.k_proj.as_ref()),
            ("self_attn.v_proj", self.v_proj.as_ref()),
            ("self_attn.o_proj", self.o_proj.as_ref()),
            ("mlp.gate_proj", self.gate_proj.as_ref()),
            ("mlp.up_proj", self.up_proj.as_ref()),
            ("mlp.down_proj", self.down_proj.as_ref()),
        ]
    }

    /// [`BlockLora::named`], to change.
    pub(crate) fn named_mut(&mut self) -> [(&'static str, &mut Option<LoraAdapter<B>>); 7] {
        [
            ("self_attn.q_proj", &mut self.q_proj),
            ("self_attn.k_proj", &mut self.k_proj),
            ("self_attn.v_proj", &mut self.v_proj),
            ("self_attn.o_proj", &mut self.o_proj),
            ("mlp.gate_proj", &mut self.gate_proj),
            ("mlp.up_proj", &mut self.up_proj),
            ("mlp.down_proj", &mut self.down_proj),
        ]
    }
}

/// The adapters' side of [`Transformer`]: attach, inspect, drop, fold in.
impl<B: AttentionOps> Transformer<B> {
    /// The model with low-rank adapters ([`crate::lora`]) on the projections `spec` targets,
    /// in every block: every existing weight is frozen (no gradient, so no optimiser state),
    /// each adapter's `A` is drawn from `rng` and its `B` is zero, so the result computes
    /// exactly what `self` does until it is trained. Adapters already present are replaced.
    pub fn with_lora(self, spec: &LoraSpec, rng: &mut Rng) -> Self {
        let device = self.device();
        let mut model = self.without_lora().no_grad();
        let c = &model.config;
        let (d, ffn, hd) = (c.d_model, c.ffn_hidden, c.head_dim());
        let (q, kv) = (c.n_heads * hd, c.n_kv_heads * hd);
        for block in &mut model.blocks {
            let mut make = |name: &str, d_in: usize, d_out: usize| {
                spec.targets(name)
                    .then(|| LoraAdapter::init(d_in, d_out, spec, rng, &device))
            };
            block.lora = Some(BlockLora {
                q_proj: make("q_proj", d, q),
                k_proj: make("k_proj", d, kv),
                v_proj: make("v_proj", d, kv),
                o_proj: make("o_proj", q, d),
                gate_proj: make("gate_proj", d, ffn),
                up_proj: make("up_proj", d, ffn),
                down_proj: make("down_proj", ffn, d),
            });
        }
        model
    }

    /// Each block's adapters (`None` for a block without), in layer order.
    pub(crate) fn lora_blocks(&self) -> impl Iterator<Item = Option<&BlockLora<B>>> {
        self.blocks.iter().map(|b| b.lora.as_ref())
    }

    /// [`Transformer::lora_blocks`], to change.
    pub(crate) fn lora_blocks_mut(&mut self) -> impl Iterator<Item = &mut Option<BlockLora<B>>> {
        self.blocks.iter_mut().map(|b| &mut b.lora)
    }

    /// Whether any block has adapters.
    pub fn has_lora(&self) -> bool {
        self.blocks.iter().any(|b| b.lora.is_some())
    }

    /// The base model: the adapters dropped, the (shared, frozen) weights kept.
    pub fn without_lora(mut self) -> Self {
        for block in &mut self.blocks {
            block.lora = None;
        }
        self
    }

    /// Every adapter folded into its projection (`W + s·A·B`), the adapters dropped: a plain
    /// model computing what the adapted one does (to float rounding), e.g. to save in
    /// Hugging Face's format. A model without adapters is returned unchanged.
    pub fn merge_lora(mut self) -> Self {
        if self.has_lora() {
            // The merged projections are no longer the packed blocks' weights.
            self.packed = None;
        }
        for block in &mut self.blocks {
            let Some(lora) = block.lora.take() else {
                continue;
            };
            let a = &mut block.attention;
            let m = &mut block.mlp;
            let targets: [(&mut Linear<B>, Option<LoraAdapter<B>>); 7] = [
                (&mut a.query, lora.q_proj),
                (&mut a.key, lora.k_proj),
                (&mut a.value, lora.v_proj),
                (&mut a.output, lora.o_proj),
                (&mut m.gate, lora.gate_proj),
                (&mut m.up, lora.up_proj),
                (&mut m.down, lora.down_proj),
            ];
            for (linear, adapter) in targets {
                if let Some(adapter) = adapter {
                    let delta = adapter.delta();
                    let weight = linear.weight.val();
                    let merged = weight.clone() + delta.cast(weight.dtype());
                    linear.weight = Param::initialized(
                        linear.weight.id,
                        merged.set_require_grad(weight.is_require_grad()),
                    );
                }
            }
        }
        self
    }

    /// The adapters of block `i`, if it has any.
    #[cfg(test)]
    pub(crate) fn blocks_lora(&self, i: usize) -> Option<&BlockLora<B>> {
        self.blocks.get(i).and_then(|b| b.lora.as_ref())
    }

    /// Parameters of the adapters (0 without).
    pub fn lora_params(&self) -> usize {
        self.blocks
            .iter()
            .filter_map(|b| b.lora.as_ref())
            .map(|l| l.num_params())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use burn::backend::{Autodiff, NdArray};
    use burn::module::{AutodiffModule, ModuleVisitor, ParamId};
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::activation::log_softmax;
    use rlany_framework::CausalLm;

    use crate::{Transformer, load_hf_dir, save_hf_dir};

    use super::*;

    type A = Autodiff<NdArray>;

    /// The committed 2-layer Llama fixture (random weights made by `fixtures/make_tiny.py`).
    fn fixture<BB: rlany_kernels::AttentionOps>() -> Transformer<BB> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-llama");
        load_hf_dir::<BB>(&dir, None, &Default::default()).expect("the tiny-llama fixture")
    }

    fn spec(targets: &[&str], r: usize) -> LoraSpec {
        LoraSpec {
            r,
            lora_alpha: 16.0,
            target_modules: targets.iter().map(|t| t.to_string()).collect(),
            ..LoraSpec::default()
        }
    }

    fn tokens<BB: Backend>() -> Tensor<BB, 2, Int> {
        Tensor::from_data(
            TensorData::new(vec![1i64, 7, 30, 31, 2, 1, 50, 51, 52, 53], [2, 5]),
            &Default::default(),
        )
    }

    fn values<BB: Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().to_vec::<f32>().expect("f32")
    }

    /// Cross-entropy of predicting each next token of [`tokens`].
    fn loss(model: &Transformer<A>) -> Tensor<A, 1> {
        let targets: Tensor<A, 2, Int> = Tensor::from_data(
            TensorData::new(vec![7i64, 30, 31, 2, 0, 50, 51, 52, 53, 9], [2, 5]),
            &Default::default(),
        );
        log_softmax(CausalLm::forward(model, tokens()), 2)
            .gather(2, targets.reshape([2, 5, 1]))
            .mean()
            .neg()
    }

    /// Ids of the parameters that require a gradient, and of all parameters.
    fn trainable(model: &Transformer<A>) -> (Vec<ParamId>, usize) {
        struct Ids(Vec<ParamId>, usize);
        impl ModuleVisitor<A> for Ids {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
                self.1 += 1;
                if param.is_require_grad() {
                    self.0.push(param.id);
                }
            }
        }
        let mut ids = Ids(Vec::new(), 0);
        model.visit(&mut ids);
        (ids.0, ids.1)
    }

    #[test]
    fn the_adapted_model_starts_exactly_at_the_base() {
        let base = fixture::<NdArray>();
        let adapted = base
            .clone()
            .with_lora(&spec(&["all-linear"], 4), &mut Rng::new(3));
        assert!(adapted.has_lora() && !base.has_lora());
        assert_eq!(
            CausalLm::forward(&base, tokens()).into_data(),
            CausalLm::forward(&adapted, tokens()).into_data(),
            "B = 0: identical logits"
        );
        assert_eq!(
            CausalLm::forward(&adapted.without_lora(), tokens()).into_data(),
            CausalLm::forward(&base, tokens()).into_data()
        );
    }

    #[test]
    fn peft_defaults_target_q_and_v_with_the_hand_counted_parameters() {
        let base = fixture::<NdArray>();
        let c = base.config().clone();
        let s = LoraSpec::default();
        assert_eq!((s.r, s.lora_alpha, s.lora_dropout), (8, 8.0, 0.0));
        assert_eq!(s.scaling(), 1.0);
        let adapted = base.with_lora(&s, &mut Rng::new(1));
        let (q, kv) = (c.n_heads * c.head_dim(), c.n_kv_heads * c.head_dim());
        // q_proj: d·r + r·q; v_proj: d·r + r·kv; per layer.
        let want = c.n_layers * (c.d_model * 8 + 8 * q + c.d_model * 8 + 8 * kv);
        assert_eq!(adapted.lora_params(), want);
    }

    #[test]
    fn only_the_adapters_learn_and_the_merged_model_computes_the_same() {
        let s = spec(&["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"], 2);
        let base = fixture::<A>();
        let model = base.clone().with_lora(&s, &mut Rng::new(9));
        let (ids, all) = trainable(&model);
        // Two per adapter: 5 targets in each of the 2 layers.
        assert_eq!(ids.len(), 2 * 5 * 2, "of {all} parameters");
        let grads = loss(&model).backward();
        let grads = GradientsParams::from_grads(grads, &model);
        assert_eq!(grads.len(), ids.len(), "gradients in the adapters only");
        let mut optim = AdamConfig::new().init::<A, Transformer<A>>();
        let mut model = optim.step(1e-2, model, grads);
        for _ in 0..3 {
            let grads = GradientsParams::from_grads(loss(&model).backward(), &model);
            model = optim.step(1e-2, model, grads);
        }
        assert_eq!(
            optim.to_record().len(),
            ids.len(),
            "optimiser state for the adapters only"
        );
        // The base weights did not move; the adapted model did.
        let frozen = model.clone().without_lora();
        assert_eq!(
            CausalLm::forward(&frozen, tokens()).into_data(),
            CausalLm::forward(&base, tokens()).into_data()
        );
        let adapted = values(CausalLm::forward(&model.valid(), tokens::<NdArray>()));
        let start = values(CausalLm::forward(&base.valid(), tokens::<NdArray>()));
        let moved = adapted
            .iter()
            .zip(&start)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            moved > 1e-3,
            "the adapters changed the logits by only {moved}"
        );
        // Merged in memory, and saved merged to Hugging Face safetensors and read back.
        let merged = model.valid().merge_lora();
        assert!(!merged.has_lora());
        let dir = std::env::temp_dir().join(format!("rlany-lora-merged-{}", std::process::id()));
        save_hf_dir(&model.valid(), &dir).expect("save merged");
        let reloaded = load_hf_dir::<NdArray>(&dir, None, &Default::default()).expect("reload");
        let _ = std::fs::remove_dir_all(&dir);
        for other in [merged, reloaded] {
            let got = values(CausalLm::forward(&other, tokens::<NdArray>()));
            let worst = got
                .iter()
                .zip(&adapted)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "merged logits differ by {worst}");
        }
    }

    #[test]
    fn the_same_rng_draws_the_same_adapters() {
        let s = spec(&["all-linear"], 3);
        let a = fixture::<NdArray>().with_lora(&s, &mut Rng::new(4));
        let b = fixture::<NdArray>().with_lora(&s, &mut Rng::new(4));
        let c = fixture::<NdArray>().with_lora(&s, &mut Rng::new(5));
        let first = |m: &Transformer<NdArray>| {
            let lora = m.blocks_lora(0).expect("adapters");
            values(lora.q_proj.as_ref().expect("q").a.val())
        };
        assert_eq!(first(&a), first(&b));
        assert_ne!(first(&a), first(&c));
        let bound = 1.0 / (a.config().d_model as f32).sqrt();
        assert!(first(&a).iter().all(|v| v.abs() <= bound));
    }
}
