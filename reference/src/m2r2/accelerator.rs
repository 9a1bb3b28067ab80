//! Accelerator adapters (docs/m2r2/accelerator.md): LoRA terms on chosen linear maps of a layer
//! that turn the base layer into a layer of the fast (rate-accelerated) residual stream.
//!
//! ```text
//! y = W x + scale * B (A x)        A: [r, in], B: [out, r]
//! scale = alpha / r                (alpha / sqrt(r) with PEFT's `use_rslora`)
//! ```
//!
//! `r` and `alpha` are the accelerator's defaults; a LoRA pair may have its own (PEFT's
//! `rank_pattern` / `alpha_pattern`), for example a higher rank on the draft gate's interval
//! ([`Accelerator::random_ranked`], [`Accelerator::widen`]).
//!
//! Only the fast rows get the adapter term; `B = 0` makes the fast stream equal to the slow one.
//! Each layer belongs to exactly one interval, so it has at most one adapter. The fast stream runs
//! only in intervals that end at a gate (`0..J`), so [`Accelerator::zeros`] and
//! [`Accelerator::random`] put adapters on layers `0 .. e_J` and none after the last gate \[ours\].
//!
//! Storage is the PEFT LoRA layout (`io::peft`), so adapters trained with PEFT load unchanged.

use crate::base::config::ModelConfig;
use crate::base::layer::FastAdapter;
use crate::base::matmul::linear;
use crate::base::matmul::narrow::{NARROW_MAX_WIDTH, linear_narrow_t};
use crate::base::weight_names::Target;
use crate::error::{Error, Result};
use crate::io::builtin::standard_normal;
use crate::io::peft::{LoraPart, PeftLora, PeftPair};
use crate::m2r2::config::M2r2Config;
use ndarray::{Array2, ArrayView2};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::Path;

/// \[ours\] `Accelerator::random` draws `B ~ N(0, sigma^2)` with `sigma = RANDOM_DELTA_RATIO /
/// (scale * sqrt(r))`. With `A ~ N(0, 1/in)`, an input of unit RMS gives `A x` entries of unit
/// variance, so the adapter term `scale * B A x` has an RMS of about `RANDOM_DELTA_RATIO` times
/// that of the base projection `W x` (whose weights are `N(0, 1/in)` in the built-in models): a
/// quarter. That moves the fast stream clearly away from the slow one while keeping it finite and
/// stable (tested on the built-in models).
pub const RANDOM_DELTA_RATIO: f32 = 0.25;

/// One LoRA pair: `delta(x) = scale * B (A x)`, `scale = alpha / r` with `r` the row count of `A`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    /// `[r, in]`
    a: Array2<f32>,
    /// `[out, r]`
    b: Array2<f32>,
    /// `B^T` (`[r, out]`), kept with `B` for the narrow product (`matmul::narrow`): its 16-output
    /// blocks are then read in place (6 µs instead of 18 µs for SmolLM2's `[1536, 16]`).
    b_t: Array2<f32>,
    alpha: f32,
}

impl Lora {
    /// # Shapes
    /// - `a`: `[r, in]`, `b`: `[out, r]`
    pub fn new(a: Array2<f32>, b: Array2<f32>, alpha: f32) -> Lora {
        let b_t = b.t().as_standard_layout().into_owned();
        Lora { a, b, b_t, alpha }
    }

    /// r, this pair's rank.
    pub fn rank(&self) -> usize {
        self.a.nrows()
    }

    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// The factor on this pair's term: `alpha / r` (`alpha / sqrt(r)` with rsLoRA).
    pub fn scale(&self, use_rslora: bool) -> f32 {
        let r = self.rank() as f32;
        if use_rslora {
            self.alpha / r.sqrt()
        } else {
            self.alpha / r
        }
    }

    /// The same term at a higher rank: `new_a_rows` (`[rank - r, in]`) are appended to `A`, zero
    /// columns to `B`, and alpha grows with the rank so the scale stays (`alpha * rank / r`, or
    /// `* sqrt(rank / r)` with rsLoRA). `B A` gains only zero terms, so the delta is unchanged
    /// while the new directions can be trained.
    ///
    /// # Panics
    /// If `new_a_rows` has the wrong width, or no rows.
    pub fn widened(&self, new_a_rows: Array2<f32>, use_rslora: bool) -> Lora {
        let (r, rank) = (self.rank(), self.rank() + new_a_rows.nrows());
        assert!(rank > r, "Lora::widened: no new rows");
        let a = ndarray::concatenate![ndarray::Axis(0), self.a, new_a_rows];
        let mut b = Array2::zeros((self.b.nrows(), rank));
        b.slice_mut(ndarray::s![.., ..r]).assign(&self.b);
        let growth = rank as f32 / r as f32;
        let alpha = self.alpha * if use_rslora { growth.sqrt() } else { growth };
        Lora::new(a, b, alpha)
    }

    /// `A`, `[r, in]`
    pub fn a(&self) -> &Array2<f32> {
        &self.a
    }

    /// `B`, `[out, r]`
    pub fn b(&self) -> &Array2<f32> {
        &self.b
    }

    /// Number of parameters: all entries of `A` and `B`.
    pub fn parameter_count(&self) -> usize {
        self.a.len() + self.b.len()
    }

    /// Replace `A` and `B` (same shapes; the transpose follows, alpha stays).
    ///
    /// # Panics
    /// If a shape differs.
    pub fn set(&mut self, a: Array2<f32>, b: Array2<f32>) {
        assert_eq!(a.dim(), self.a.dim(), "Lora::set: shape of A");
        assert_eq!(b.dim(), self.b.dim(), "Lora::set: shape of B");
        *self = Lora::new(a, b, self.alpha);
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
    /// r: the default rank (PEFT's `r`); a pair may have its own ([`Lora::rank`]).
    pub rank: usize,
    /// The default alpha (PEFT's `lora_alpha`); a pair may have its own ([`Lora::alpha`]).
    pub alpha: f32,
    /// PEFT rank-stabilised LoRA: scale `alpha / sqrt(r)` instead of `alpha / r`.
    pub use_rslora: bool,
    /// Adapted linear maps (canonical order); a layer may carry fewer.
    pub targets: Vec<Target>,
    /// One entry per base layer; `None` where the layer has no adapter.
    pub layers: Vec<Option<LayerAdapter>>,
}

impl Accelerator {
    /// The factor on `lora`'s term: its `alpha / r` (`alpha / sqrt(r)` with rsLoRA).
    pub fn scale(&self, lora: &Lora) -> f32 {
        lora.scale(self.use_rslora)
    }

    /// The ranks of layer `layer`'s pairs (empty where it has none), in canonical target order.
    pub fn layer_ranks(&self, layer: usize) -> Vec<usize> {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .map(|la| la.loras.values().map(Lora::rank).collect())
            .unwrap_or_default()
    }

    /// The LoRA pair on `target` of code layer `layer`, if there is one.
    pub fn lora(&self, layer: usize, target: Target) -> Option<&Lora> {
        self.layers.get(layer)?.as_ref()?.loras.get(&target)
    }

    /// The adapter term `scale * B (A x)` on `target` of code layer `layer`, or `None` where that
    /// map has no adapter (the fast row then uses the base weight alone).
    ///
    /// # Shapes
    /// - `x`: `[T, in]` (the input of the base projection) -> `[T, out]`
    ///
    /// # Panics
    /// If `x` has the wrong width.
    pub fn delta(&self, layer: usize, target: Target, x: ArrayView2<f32>) -> Option<Array2<f32>> {
        let lora = self.lora(layer, target)?;
        Some(lora.delta(x, self.scale(lora)))
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
        self.layers
            .iter()
            .flatten()
            .map(|la| la.loras.values().map(Lora::parameter_count).sum::<usize>())
            .sum()
    }

    /// Adapters with `A = 0`, `B = 0` on every target of layers `0 .. e_J`: the fast stream equals
    /// the slow stream. `config` must be valid for `model` ([`M2r2Config::validate`]).
    pub fn zeros(model: &ModelConfig, config: &M2r2Config) -> Self {
        let ranks = vec![config.rank; config.num_gates()];
        Self::build(model, config, &ranks, |_, rows, cols, _| {
            Array2::zeros((rows, cols))
        })
    }

    /// Seeded random adapters at rank `config.rank`: [`random_ranked`](Self::random_ranked) with
    /// the same rank on every interval.
    pub fn random(model: &ModelConfig, config: &M2r2Config, seed: u64) -> Self {
        let ranks = vec![config.rank; config.num_gates()];
        Self::random_ranked(model, config, &ranks, seed)
    }

    /// Seeded random adapters on every target of layers `0 .. e_J`, rank `ranks[j]` on interval
    /// `j` (one entry per gate), with alpha `config.alpha * ranks[j] / config.rank` so every
    /// interval has the scale `s = config.alpha / config.rank`: `A ~ N(0, 1) / sqrt(in)`,
    /// `B ~ N(0, 1) * sigma` with `sigma = RANDOM_DELTA_RATIO / (s * sqrt(r_j))` (see
    /// [`RANDOM_DELTA_RATIO`]). One ChaCha8 stream from `seed`, drawn layer by layer, target by
    /// target in canonical order, `A` then `B`, each row-major. `config` must be valid for `model`.
    ///
    /// # Panics
    /// If `ranks` does not have one positive entry per gate.
    pub fn random_ranked(
        model: &ModelConfig,
        config: &M2r2Config,
        ranks: &[usize],
        seed: u64,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scale = config.alpha / config.rank as f32;
        Self::build(model, config, ranks, |part, rows, cols, r| {
            let std = match part {
                LoraPart::A => a_std(cols),
                LoraPart::B if scale == 0.0 => 0.0,
                LoraPart::B => RANDOM_DELTA_RATIO / (scale.abs() * (r as f32).sqrt()),
            };
            normal(rows, cols, std, &mut rng)
        })
    }

    /// Adapters on `config.targets` of layers `0 .. e_J`, rank `ranks[j]` on interval `j`,
    /// tensors made by `make(part, rows, cols, r)` in the documented order.
    fn build(
        model: &ModelConfig,
        config: &M2r2Config,
        ranks: &[usize],
        mut make: impl FnMut(LoraPart, usize, usize, usize) -> Array2<f32>,
    ) -> Self {
        assert_eq!(ranks.len(), config.num_gates(), "one rank per gate");
        assert!(ranks.iter().all(|&r| r > 0), "ranks are positive");
        let mut targets = config.targets.clone();
        targets.sort();
        let layers = (0..model.num_hidden_layers)
            .map(|l| {
                let j = config.gates.iter().position(|&e| l < e)?;
                let r = ranks[j];
                let alpha = config.alpha * r as f32 / config.rank as f32;
                Some(LayerAdapter {
                    loras: targets
                        .iter()
                        .map(|&t| {
                            let (out, inp) = t.shape(model);
                            let a = make(LoraPart::A, r, inp, r); // [r, in]
                            let b = make(LoraPart::B, out, r, r); // [out, r]
                            (t, Lora::new(a, b, alpha))
                        })
                        .collect(),
                })
            })
            .collect();
        Accelerator {
            rank: config.rank,
            alpha: config.alpha,
            use_rslora: false,
            targets,
            layers,
        }
    }

    /// Raise the rank of every pair on `layers` to `rank` ([`Lora::widened`]: the adapter terms
    /// stay the same), the new rows of `A` drawn `N(0, 1) / sqrt(in)` from one ChaCha8 stream of
    /// `seed`, layer by layer, target by target. Pairs already at `rank` stay; a pair of higher
    /// rank is an error (lowering a trained rank would change its term).
    pub fn widen(
        &mut self,
        layers: impl IntoIterator<Item = usize>,
        rank: usize,
        seed: u64,
    ) -> Result<()> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let use_rslora = self.use_rslora;
        for l in layers {
            let Some(la) = self.layers.get_mut(l).and_then(Option::as_mut) else {
                continue;
            };
            for (t, lora) in la.loras.iter_mut() {
                if lora.rank() > rank {
                    return Err(Error::Invalid(format!(
                        "cannot lower the rank of layer {l} {t} from {} to {rank}: a trained \
                         pair keeps its rank or grows",
                        lora.rank()
                    )));
                }
                if lora.rank() < rank {
                    let inp = lora.a.ncols();
                    let rows = normal(rank - lora.rank(), inp, a_std(inp), &mut rng);
                    *lora = lora.widened(rows, use_rslora);
                }
            }
        }
        Ok(())
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
            .map(|(key, lora)| {
                let (a, b, alpha) = (lora.a.clone(), lora.b.clone(), lora.alpha);
                (key, PeftPair { a, b, alpha })
            })
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
        for ((l, t), PeftPair { a, b, alpha }) in peft.pairs {
            layers[l]
                .get_or_insert_with(LayerAdapter::default)
                .loras
                .insert(t, Lora::new(a, b, alpha));
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

/// The standard deviation of `A`'s entries, fresh or widened: `1 / sqrt(in)`.
fn a_std(inp: usize) -> f32 {
    1.0 / (inp as f32).sqrt()
}

/// A `[rows, cols]` matrix of `N(0, std^2)` draws from `rng`, row-major.
fn normal(rows: usize, cols: usize, std: f32, rng: &mut ChaCha8Rng) -> Array2<f32> {
    Array2::from_shape_simple_fn((rows, cols), || std * standard_normal(rng))
}

/// The fast rows of a decoder layer get the adapter term.
impl FastAdapter for Accelerator {
    fn delta(&self, layer: usize, target: Target, x: ArrayView2<f32>) -> Option<Array2<f32>> {
        Accelerator::delta(self, layer, target, x)
    }

    fn rank(&self, layer: usize, target: Target) -> Option<usize> {
        self.lora(layer, target).map(Lora::rank)
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
        // A = [[1, 0], [0, 2]] (r = 2, in = 2), B = [[1, 1]] (out = 1), alpha 1: scale = 0.5.
        // x = [3, 4]: A x = [3, 8], B (A x) = 11, scaled: 5.5.
        let lora = Lora::new(array![[1.0, 0.0], [0.0, 2.0]], array![[1.0, 1.0]], 1.0);
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
                loras: BTreeMap::from([(Target::Attn(AttnProj::Q), lora.clone())]),
            })],
        };
        assert_eq!(acc.scale(&lora), 0.5);
        let x = array![[3.0f32, 4.0], [1.0, 1.0]];
        assert_eq!(
            acc.delta(0, Target::Attn(AttnProj::Q), x.view()).unwrap(),
            array![[5.5f32], [1.5]]
        );
        assert!(acc.delta(0, Target::Attn(AttnProj::K), x.view()).is_none());
        assert!(acc.delta(1, Target::Attn(AttnProj::Q), x.view()).is_none());
        // rsLoRA: alpha / sqrt(r); r = 4, alpha = 4: 2.
        let lora4 = Lora::new(Array2::zeros((4, 2)), Array2::zeros((1, 4)), 4.0);
        assert_eq!(lora4.scale(true), 2.0);
        assert_eq!(lora4.scale(false), 1.0);
    }

    /// Widening appends rows to A and zero columns to B and keeps the scale (alpha 1 at r = 2 is
    /// alpha 2 at r = 4), so the hand-computed delta above is unchanged; rsLoRA grows alpha by
    /// sqrt(2).
    #[test]
    fn widening_keeps_the_term() {
        let lora = Lora::new(array![[1.0, 0.0], [0.0, 2.0]], array![[1.0, 1.0]], 1.0);
        let wide = lora.widened(array![[5.0, -1.0], [0.5, 3.0]], false);
        assert_eq!(wide.rank(), 4);
        assert_eq!(wide.alpha(), 2.0);
        assert_eq!(wide.b(), &array![[1.0f32, 1.0, 0.0, 0.0]]);
        assert_eq!(wide.a().row(2), array![5.0f32, -1.0]);
        let x = array![[3.0f32, 4.0]];
        assert_eq!(wide.delta(x.view(), wide.scale(false)), array![[5.5f32]]);
        let rs = lora.widened(array![[5.0, -1.0], [0.5, 3.0]], true);
        assert_eq!(rs.scale(true), lora.scale(true));
    }

    /// `random_ranked` puts each interval's rank on its layers with alpha growing with the rank
    /// (one scale); `widen` raises one interval to a higher rank with the same terms, and refuses
    /// to lower one.
    #[test]
    fn per_interval_ranks() {
        let model = tiny_config();
        let config = M2r2Config::default_for(&model);
        assert_eq!(config.gates, vec![2, 4, 6]);
        let acc = Accelerator::random_ranked(&model, &config, &[32, 16, 8], 4);
        let scale = config.alpha / config.rank as f32;
        for (l, want) in [(0, 32), (1, 32), (2, 16), (3, 16), (4, 8), (5, 8)] {
            assert_eq!(
                acc.layer_ranks(l),
                vec![want; config.targets.len()],
                "layer {l}"
            );
            for lora in acc.layers[l].as_ref().unwrap().loras.values() {
                assert_eq!(acc.scale(lora), scale);
            }
        }
        assert!(acc.layer_ranks(6).is_empty());
        assert_eq!(
            Accelerator::random_ranked(&model, &config, &[16; 3], 4),
            Accelerator::random(&model, &config, 4)
        );

        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let x = Array2::from_shape_simple_fn((3, 64), || standard_normal(&mut rng));
        let q = Target::Attn(AttnProj::Q);
        let before = acc.delta(2, q, x.view()).unwrap();
        let mut wide = acc.clone();
        wide.widen(2..4, 24, 9).unwrap();
        assert_eq!(wide.layer_ranks(2), vec![24; config.targets.len()]);
        assert_eq!(wide.layer_ranks(0), acc.layer_ranks(0));
        let after = wide.delta(2, q, x.view()).unwrap();
        approx::assert_abs_diff_eq!(before, after, epsilon = 1e-6);
        let e = wide.widen(0..2, 16, 9).unwrap_err().to_string();
        assert!(e.contains("cannot lower the rank of layer 0"), "{e}");
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
                assert_eq!(lora.alpha(), config.alpha);
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
