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
mod tests;
