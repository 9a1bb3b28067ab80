//! Accelerator adapters (spec section 1): LoRA terms on chosen linear maps of a layer that turn the
//! base layer into a layer of the fast (rate-accelerated) residual stream.
//!
//! ```text
//! y = W x + scale * B (A x)        A: [r, in], B: [out, r]
//! scale = alpha / r                (alpha / sqrt(r) with PEFT's `use_rslora`)
//! ```
//!
//! Only the fast rows get the adapter term; `B = 0` makes the fast stream equal to the slow one.
//! Each layer belongs to exactly one interval, so it has at most one adapter. The fast stream runs
//! only in intervals that end at a gate (`0..J`), so [`Accelerator::zeros`] and
//! [`Accelerator::random`] put adapters on layers `0 .. e_J` and none after the last gate [ours].
//!
//! Storage is the PEFT LoRA layout (`io::peft`), so adapters trained with PEFT load unchanged.

use crate::base::config::ModelConfig;
use crate::base::layer::FastAdapter;
use crate::base::matmul::linear;
use crate::base::matmul::narrow::{NARROW_MAX_WIDTH, linear_narrow_t};
use crate::base::weight_names::Target;
use crate::base::work::Work;
use crate::error::Result;
use crate::io::builtin::standard_normal;
use crate::io::peft::{LoraPart, PeftLora};
use crate::m2r2::config::M2r2Config;
use ndarray::{Array2, ArrayView2};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::Path;

/// [ours] `Accelerator::random` draws `B ~ N(0, sigma^2)` with `sigma = RANDOM_DELTA_RATIO /
/// (scale * sqrt(r))`. With `A ~ N(0, 1/in)`, an input of unit RMS gives `A x` entries of unit
/// variance, so the adapter term `scale * B A x` has an RMS of about `RANDOM_DELTA_RATIO` times
/// that of the base projection `W x` (whose weights are `N(0, 1/in)` in the built-in models): a
/// quarter. That moves the fast stream clearly away from the slow one while keeping it finite and
/// stable (tested on the built-in models).
pub const RANDOM_DELTA_RATIO: f32 = 0.25;

/// One LoRA pair: `delta(x) = scale * B (A x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    /// `[r, in]`
    a: Array2<f32>,
    /// `[out, r]`
    b: Array2<f32>,
    /// `B^T` (`[r, out]`), kept with `B` for the narrow product (`matmul::narrow`): its 16-output
    /// blocks are then read in place (6 µs instead of 18 µs for SmolLM2's `[1536, 16]`).
    b_t: Array2<f32>,
}

impl Lora {
    /// # Shapes
    /// - `a`: `[r, in]`, `b`: `[out, r]`
    pub fn new(a: Array2<f32>, b: Array2<f32>) -> Lora {
        let b_t = b.t().as_standard_layout().into_owned();
        Lora { a, b, b_t }
    }

    /// `A`, `[r, in]`
    pub fn a(&self) -> &Array2<f32> {
        &self.a
    }

    /// `B`, `[out, r]`
    pub fn b(&self) -> &Array2<f32> {
        &self.b
    }

    /// Replace `A` and `B` (same shapes; the transpose follows).
    ///
    /// # Panics
    /// If a shape differs.
    pub fn set(&mut self, a: Array2<f32>, b: Array2<f32>) {
        assert_eq!(a.dim(), self.a.dim(), "Lora::set: shape of A");
        assert_eq!(b.dim(), self.b.dim(), "Lora::set: shape of B");
        *self = Lora::new(a, b);
    }

    /// `scale * (x A^T) B^T` with two batch-invariant [`linear`] calls.
    ///
    /// # Shapes
    /// - `x`: `[T, in]` -> `[T, out]`
    ///
    /// # Panics
    /// If `x` has a width other than `in` (shapes are validated at load, so this is a bug).
    pub fn delta(&self, x: ArrayView2<f32>, scale: f32) -> Array2<f32> {
        let h = linear(x, self.a.view(), None); // [T, r]
        let mut y = if self.b.ncols() <= NARROW_MAX_WIDTH {
            linear_narrow_t(h.view(), self.b_t.view(), None) // bitwise linear(h, B)
        } else {
            linear(h.view(), self.b.view(), None)
        }; // [T, out]
        y.mapv_inplace(|v| scale * v);
        y
    }

    /// True when `B A = 0` for certain (`A` or `B` all zero).
    pub fn is_zero(&self) -> bool {
        self.a.iter().all(|&v| v == 0.0) || self.b.iter().all(|&v| v == 0.0)
    }
}

/// The adapter of one layer: one LoRA pair per adapted linear map.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerAdapter {
    /// Iterates in canonical order (q, k, v, o, gate, up, down).
    pub loras: BTreeMap<Target, Lora>,
}

/// The accelerator adapters of every layer of the base model.
#[derive(Clone, Debug, PartialEq)]
pub struct Accelerator {
    /// r
    pub rank: usize,
    pub alpha: f32,
    /// PEFT rank-stabilised LoRA: scale `alpha / sqrt(r)` instead of `alpha / r`.
    pub use_rslora: bool,
    /// Adapted linear maps (canonical order); a layer may carry fewer.
    pub targets: Vec<Target>,
    /// One entry per base layer; `None` where the layer has no adapter.
    pub layers: Vec<Option<LayerAdapter>>,
}

impl Accelerator {
    /// The factor on the adapter term: `alpha / r` (`alpha / sqrt(r)` with rsLoRA).
    pub fn scale(&self) -> f32 {
        if self.use_rslora {
            self.alpha / (self.rank as f32).sqrt()
        } else {
            self.alpha / self.rank as f32
        }
    }

    /// The LoRA pair on `target` of code layer `layer`, if there is one.
    pub fn lora(&self, layer: usize, target: Target) -> Option<&Lora> {
        self.layers.get(layer)?.as_ref()?.loras.get(&target)
    }

    /// The adapter term `scale * B (A x)` on `target` of code layer `layer`, or `None` where that
    /// map has no adapter (the fast row then uses the base weight alone). Spec section 1.
    ///
    /// # Shapes
    /// - `x`: `[T, in]` (the input of the base projection) -> `[T, out]`
    ///
    /// # Panics
    /// If `x` has the wrong width.
    pub fn delta(&self, layer: usize, target: Target, x: ArrayView2<f32>) -> Option<Array2<f32>> {
        Some(self.lora(layer, target)?.delta(x, self.scale()))
    }

    /// True when every adapter term is zero, so the fast stream equals the slow one.
    pub fn is_zero(&self) -> bool {
        self.layers
            .iter()
            .flatten()
            .all(|la| la.loras.values().all(Lora::is_zero))
    }

    /// Number of adapter parameters (all A and B entries).
    pub fn parameter_count(&self) -> usize {
        let per_lora = |l: &Lora| l.a.len() + l.b.len();
        self.layers
            .iter()
            .flatten()
            .map(|la| la.loras.values().map(per_lora).sum::<usize>())
            .sum()
    }

    /// Adapters with `A = 0`, `B = 0` on every target of layers `0 .. e_J`: the fast stream equals
    /// the slow stream. `config` must be valid for `model` ([`M2r2Config::validate`]).
    pub fn zeros(model: &ModelConfig, config: &M2r2Config) -> Self {
        Self::build(model, config, |_, rows, cols| Array2::zeros((rows, cols)))
    }

    /// Seeded random adapters on every target of layers `0 .. e_J`: `A ~ N(0, 1) / sqrt(in)`,
    /// `B ~ N(0, 1) * sigma` with `sigma = RANDOM_DELTA_RATIO / (scale * sqrt(r))` (see
    /// [`RANDOM_DELTA_RATIO`]). One ChaCha8 stream from `seed`, drawn layer by layer, target by
    /// target in canonical order, `A` then `B`, each row-major. `config` must be valid for `model`.
    pub fn random(model: &ModelConfig, config: &M2r2Config, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scale = config.alpha / config.rank as f32;
        let sigma_b = if scale == 0.0 {
            0.0
        } else {
            RANDOM_DELTA_RATIO / (scale.abs() * (config.rank as f32).sqrt())
        };
        Self::build(model, config, |part, rows, cols| {
            let std = match part {
                LoraPart::A => 1.0 / (cols as f32).sqrt(),
                LoraPart::B => sigma_b,
            };
            Array2::from_shape_simple_fn((rows, cols), || std * standard_normal(&mut rng))
        })
    }

    /// Adapters on `config.targets` of layers `0 .. e_J`, tensors made by `make(part, rows, cols)`
    /// in the documented order.
    fn build(
        model: &ModelConfig,
        config: &M2r2Config,
        mut make: impl FnMut(LoraPart, usize, usize) -> Array2<f32>,
    ) -> Self {
        let mut targets = config.targets.clone();
        targets.sort();
        let last_gate = config.gates.last().copied().unwrap_or(0);
        let r = config.rank;
        let layers = (0..model.num_hidden_layers)
            .map(|l| {
                (l < last_gate).then(|| LayerAdapter {
                    loras: targets
                        .iter()
                        .map(|&t| {
                            let (out, inp) = t.shape(model);
                            let a = make(LoraPart::A, r, inp); // [r, in]
                            let b = make(LoraPart::B, out, r); // [out, r]
                            (t, Lora::new(a, b))
                        })
                        .collect(),
                })
            })
            .collect();
        Accelerator {
            rank: r,
            alpha: config.alpha,
            use_rslora: false,
            targets,
            layers,
        }
    }

    /// Write the adapters in PEFT's LoRA layout (`adapter_config.json`,
    /// `adapter_model.safetensors`, f32). `dir` must exist.
    pub fn save_peft(&self, dir: &Path) -> Result<()> {
        let pairs = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(l, adapter)| {
                adapter
                    .iter()
                    .flat_map(move |a| a.loras.iter().map(move |(&t, lora)| ((l, t), lora)))
            })
            .map(|(key, lora)| (key, (lora.a.clone(), lora.b.clone())))
            .collect();
        PeftLora {
            rank: self.rank,
            alpha: self.alpha,
            use_rslora: self.use_rslora,
            targets: self.targets.clone(),
            num_layers: self.layers.len(),
            pairs,
        }
        .write(dir)
    }

    /// Read a PEFT LoRA adapter for `model` ([`PeftLora::read`] says what is refused). Layers
    /// without tensors get no adapter.
    pub fn load_peft(dir: &Path, model: &ModelConfig) -> Result<Self> {
        let peft = PeftLora::read(dir, model)?;
        let mut layers: Vec<Option<LayerAdapter>> = vec![None; model.num_hidden_layers];
        for ((l, t), (a, b)) in peft.pairs {
            layers[l]
                .get_or_insert_with(LayerAdapter::default)
                .loras
                .insert(t, Lora::new(a, b));
        }
        Ok(Accelerator {
            rank: peft.rank,
            alpha: peft.alpha,
            use_rslora: peft.use_rslora,
            targets: peft.targets,
            layers,
        })
    }
}

/// The fast rows of a decoder layer get the adapter term, and the work of its two products.
impl FastAdapter for Accelerator {
    fn delta(
        &self,
        layer: usize,
        target: Target,
        x: ArrayView2<f32>,
    ) -> Option<(Array2<f32>, Work)> {
        let lora = self.lora(layer, target)?;
        let work = Work::matmul(x.nrows(), lora.a.nrows(), lora.a.ncols(), false)
            + Work::matmul(x.nrows(), lora.b.nrows(), lora.b.ncols(), false);
        Some((lora.delta(x, self.scale()), work))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::weight_names::{AttnProj, MlpProj, WeightId};
    use crate::io::builtin::{BUILTIN_SEED, random_source, tiny_config, tiny_moe_config};
    use ndarray::{array, s};

    #[test]
    fn delta_hand_computed() {
        // A = [[1, 0], [0, 2]] (r = 2, in = 2), B = [[1, 1]] (out = 1), scale = 0.5.
        // x = [3, 4]: A x = [3, 8], B (A x) = 11, scaled: 5.5.
        let lora = Lora::new(array![[1.0, 0.0], [0.0, 2.0]], array![[1.0, 1.0]]);
        assert_eq!(
            lora.delta(array![[3.0f32, 4.0]].view(), 0.5),
            array![[5.5f32]]
        );
        let acc = Accelerator {
            rank: 2,
            alpha: 1.0,
            use_rslora: false,
            targets: vec![Target::Attn(AttnProj::Q)],
            layers: vec![Some(LayerAdapter {
                loras: BTreeMap::from([(Target::Attn(AttnProj::Q), lora)]),
            })],
        };
        assert_eq!(acc.scale(), 0.5);
        let x = array![[3.0f32, 4.0], [1.0, 1.0]];
        assert_eq!(
            acc.delta(0, Target::Attn(AttnProj::Q), x.view()).unwrap(),
            array![[5.5f32], [1.5]]
        );
        assert!(acc.delta(0, Target::Attn(AttnProj::K), x.view()).is_none());
        assert!(acc.delta(1, Target::Attn(AttnProj::Q), x.view()).is_none());
        // rsLoRA: alpha / sqrt(r).
        let rs = Accelerator {
            use_rslora: true,
            alpha: 4.0,
            rank: 4,
            ..acc
        };
        assert_eq!(rs.scale(), 2.0);
    }

    #[test]
    fn delta_is_batch_invariant() {
        let model = tiny_config();
        let config = M2r2Config::default_for(&model);
        let acc = Accelerator::random(&model, &config, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let x = Array2::from_shape_simple_fn((5, 64), || standard_normal(&mut rng));
        for t in Target::ALL.into_iter().filter(|t| !t.is_mlp()) {
            let all = acc.delta(1, t, x.view()).unwrap();
            for row in 0..5 {
                let one = acc.delta(1, t, x.slice(s![row..row + 1, ..])).unwrap();
                assert_eq!(one.row(0), all.row(row), "{t} row {row}");
            }
        }
    }

    #[test]
    fn zeros_and_random_layout() {
        for model in [tiny_config(), tiny_moe_config()] {
            let config = M2r2Config::default_for(&model);
            let z = Accelerator::zeros(&model, &config);
            assert!(z.is_zero());
            let r = Accelerator::random(&model, &config, 5);
            assert!(!r.is_zero());
            assert_eq!(r, Accelerator::random(&model, &config, 5));
            assert_ne!(r, Accelerator::random(&model, &config, 6));
            // Layers 0..e_J = 0..6 carry adapters; the last interval (6..8) none.
            for (l, la) in r.layers.iter().enumerate() {
                assert_eq!(la.is_some(), l < 6, "layer {l}");
            }
            let la = r.layers[0].as_ref().unwrap();
            assert_eq!(la.loras.len(), config.targets.len());
            for (&t, lora) in &la.loras {
                let (out, inp) = t.shape(&model);
                assert_eq!(lora.a.dim(), (16, inp));
                assert_eq!(lora.b.dim(), (out, 16));
            }
        }
    }

    /// The documented sigma: on the built-in `tiny` weights and unit-RMS inputs, the adapter term
    /// is about a quarter of the base projection (RMS over rows), for every target.
    #[test]
    fn random_delta_is_a_quarter_of_the_base_projection() {
        let model = tiny_config();
        let config = M2r2Config::default_for(&model);
        let acc = Accelerator::random(&model, &config, 11);
        let base = random_source(&model, BUILTIN_SEED);
        let rms = |m: &Array2<f32>| (m.iter().map(|v| v * v).sum::<f32>() / m.len() as f32).sqrt();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for t in Target::ALL {
            let (_, inp) = t.shape(&model);
            let x = Array2::from_shape_simple_fn((32, inp), || standard_normal(&mut rng));
            let id = match t {
                Target::Attn(p) => WeightId::Attn(2, p),
                Target::Mlp(p) => WeightId::Mlp(2, p),
            };
            let w = &base.tensors[&id.hf_name()];
            let w = Array2::from_shape_vec((w.shape[0], w.shape[1]), w.data.clone()).unwrap();
            let wx = linear(x.view(), w.view(), None);
            let d = acc.delta(2, t, x.view()).unwrap();
            let ratio = rms(&d) / rms(&wx);
            assert!((0.15..0.4).contains(&ratio), "{t}: ratio {ratio}");
        }
        let _ = MlpProj::Gate;
    }
}
