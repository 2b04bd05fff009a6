//! Seeded initialisation: a fresh [`Transformer`] whose every weight is drawn from the run's
//! [`Rng`] ([`TransformerConfig::init_seeded`]) instead of the backend's global RNG, so that
//! the same `rng` state gives the same model on every backend.

use burn::module::{ModuleMapper, Param};
use burn::prelude::*;
use rlany_framework::Rng;

use crate::error::ModelError;
use crate::transformer::{Transformer, TransformerConfig};

impl TransformerConfig {
    /// Builds a freshly initialised model whose every weight is drawn from `rng` (not from
    /// the backend's global RNG, which is shared by everything in the process): embedding
    /// ~ N(0, 0.02²), linear weights ~ U(±1/√fan_in) (Burn's default Kaiming-uniform bound),
    /// biases 0, norm gains 1. The same `rng` state gives the same model on every backend.
    pub fn init_seeded<B: Backend>(
        &self,
        device: &B::Device,
        rng: &mut Rng,
    ) -> Result<Transformer<B>, ModelError> {
        Ok(self.build::<B>(device)?.map(&mut SeededInit {
            rng,
            path: Vec::new(),
        }))
    }
}

/// Draws every float parameter from the run's [`Rng`]; the leaf field name (`weight`,
/// `bias`, `gamma`) and whether the path passes through `embedding` pick the scheme.
struct SeededInit<'a> {
    rng: &'a mut Rng,
    path: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for SeededInit<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let leaf = self.path.last().cloned().unwrap_or_default();
        let in_embedding = self.path.iter().any(|p| p == "embedding");
        let rng = &mut *self.rng;
        param.map(|t| {
            let shape = t.shape();
            let dims = shape.as_slice().to_vec();
            let n: usize = dims.iter().product();
            let values: Vec<f32> = match leaf.as_str() {
                "gamma" => vec![1.0; n],
                "bias" => vec![0.0; n],
                _ if in_embedding => (0..n).map(|_| (0.02 * rng.normal()) as f32).collect(),
                _ => {
                    // Burn's Linear stores weights as [d_in, d_out]: fan_in = dims[0].
                    let bound = 1.0 / (dims.first().copied().unwrap_or(1).max(1) as f64).sqrt();
                    (0..n)
                        .map(|_| (bound * (2.0 * rng.uniform() - 1.0)) as f32)
                        .collect()
                }
            };
            Tensor::from_data(TensorData::new(values, shape), &t.device())
                .set_require_grad(t.is_require_grad())
        })
    }
}

#[cfg(test)]
mod tests {
    use rlany_framework::CausalLm;

    use super::*;
    use crate::test_support::{B, tiny};

    #[test]
    fn seeded_init_is_reproducible_and_follows_the_scheme() {
        let dev = Default::default();
        let a: Transformer<B> = tiny().init_seeded(&dev, &mut Rng::new(5)).expect("init");
        let b: Transformer<B> = tiny().init_seeded(&dev, &mut Rng::new(5)).expect("init");
        let c: Transformer<B> = tiny().init_seeded(&dev, &mut Rng::new(6)).expect("init");
        let x = Tensor::<B, 2, Int>::from_ints([[1, 5, 9, 4]], &dev);
        let (la, lb, lc) = (a.forward(x.clone()), b.forward(x.clone()), c.forward(x));
        assert_eq!(la.to_data(), lb.to_data());
        assert_ne!(la.to_data(), lc.to_data());
        let gamma = a.norm.gamma.val().into_data().to_vec::<f32>().expect("f32");
        assert!(gamma.iter().all(|g| *g == 1.0));
        let emb = a
            .embedding
            .weight
            .val()
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        let std = (emb.iter().map(|v| v * v).sum::<f32>() / emb.len() as f32).sqrt();
        assert!((std - 0.02).abs() < 0.003, "{std}");
    }
}
