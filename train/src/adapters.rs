//! The trainable parameters: the LoRA pairs of the accelerator adapters of some layers, converted
//! from and back to the reference's [`Accelerator`] (so checkpoints are the PEFT layout and load
//! through `M2r2Weights::load_dir` unchanged), and the draft gate's bridge maps when it has them
//! ([`crate::bridge`]).

use crate::linear::LoraPair;
use crate::real::{Real, lift};
use ndarray::Array2;
use reference::base::weight_names::Target;
use reference::m2r2::accelerator::{Accelerator, Lora};
use reference::m2r2::bridge::{Bridge, BridgeSite};
use std::collections::BTreeMap;

/// LoRA pairs keyed by (code layer, target); also used for their gradients (same shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct Adapters<F> {
    /// Each pair's `alpha / r` (or rsLoRA's `alpha / sqrt(r)`): pairs may differ in rank and
    /// alpha (PEFT's `rank_pattern` / `alpha_pattern`). Fixed, not trained.
    pub scales: BTreeMap<(usize, Target), F>,
    pub pairs: BTreeMap<(usize, Target), LoraPair<F>>,
    /// The bridge's map per site (`A: [r, D]`, `B: [D, r]`); empty for gates without one.
    pub bridge: BTreeMap<BridgeSite, LoraPair<F>>,
    /// Each bridge site's fixed scale `c`. Not trained.
    pub bridge_scales: BTreeMap<BridgeSite, F>,
}

impl<F: Real> Adapters<F> {
    /// The pairs of `acc` on the layers `keep` accepts.
    pub fn from_accelerator(acc: &Accelerator, keep: impl Fn(usize) -> bool) -> Self {
        let (mut pairs, mut scales) = (BTreeMap::new(), BTreeMap::new());
        for (l, layer) in acc.layers.iter().enumerate() {
            let Some(layer) = layer.as_ref().filter(|_| keep(l)) else {
                continue;
            };
            for (&t, lora) in &layer.loras {
                scales.insert((l, t), F::lift(acc.scale(lora)));
                pairs.insert(
                    (l, t),
                    LoraPair {
                        a: lift(lora.a().view()),
                        b: lift(lora.b().view()),
                    },
                );
            }
        }
        Adapters {
            scales,
            pairs,
            bridge: BTreeMap::new(),
            bridge_scales: BTreeMap::new(),
        }
    }

    /// These pairs plus `bridge`'s maps (trained with them).
    pub fn with_bridge(mut self, bridge: &Bridge) -> Self {
        self.bridge = bridge
            .maps
            .iter()
            .map(|(&site, lora)| {
                let pair = LoraPair {
                    a: lift(lora.a().view()),
                    b: lift(lora.b().view()),
                };
                (site, pair)
            })
            .collect();
        self.bridge_scales = bridge
            .maps
            .iter()
            .map(|(&site, lora)| (site, F::lift(lora.scale(false))))
            .collect();
        self
    }

    /// Write the bridge maps (as f32) into `bridge`.
    ///
    /// # Panics
    /// If `bridge` lacks one of these sites (it was built from the same config).
    pub fn write_bridge(&self, bridge: &mut Bridge) {
        for (site, pair) in &self.bridge {
            bridge
                .maps
                .get_mut(site)
                .expect("bridge built from the same config")
                .set(pair.a.mapv(F::lower), pair.b.mapv(F::lower));
        }
    }

    /// Write these pairs into `acc` (as f32), leaving its other layers as they are.
    ///
    /// # Panics
    /// If `acc` has no pair at one of these keys (it was built from the same config).
    pub fn write_into(&self, acc: &mut Accelerator) {
        for (&(l, t), pair) in &self.pairs {
            let lora: &mut Lora = acc.layers[l]
                .as_mut()
                .and_then(|la| la.loras.get_mut(&t))
                .expect("accelerator built from the same config");
            lora.set(pair.a.mapv(F::lower), pair.b.mapv(F::lower));
        }
    }

    pub fn get(&self, layer: usize, target: Target) -> Option<&LoraPair<F>> {
        self.pairs.get(&(layer, target))
    }

    /// The scale of the pair at (`layer`, `target`); zero where there is none (its term is then
    /// absent anyway).
    pub fn scale(&self, layer: usize, target: Target) -> F {
        self.scales
            .get(&(layer, target))
            .copied()
            .unwrap_or_else(F::zero)
    }

    /// Zeros of the same shapes (a gradient accumulator).
    pub fn zeros_like(&self) -> Self {
        Adapters {
            scales: self.scales.clone(),
            pairs: self
                .pairs
                .iter()
                .map(|(&k, p)| (k, p.zeros_like()))
                .collect(),
            bridge: self
                .bridge
                .iter()
                .map(|(&k, p)| (k, p.zeros_like()))
                .collect(),
            bridge_scales: self.bridge_scales.clone(),
        }
    }

    /// The pairs of the layers `keep` accepts, and the bridge.
    pub fn subset(&self, keep: impl Fn(usize) -> bool) -> Self {
        Adapters {
            scales: self
                .scales
                .iter()
                .filter(|((l, _), _)| keep(*l))
                .map(|(&k, &s)| (k, s))
                .collect(),
            pairs: self
                .pairs
                .iter()
                .filter(|((l, _), _)| keep(*l))
                .map(|(&k, p)| (k, p.clone()))
                .collect(),
            bridge: self.bridge.clone(),
            bridge_scales: self.bridge_scales.clone(),
        }
    }

    /// Every parameter tensor in a fixed order (layer, target, A then B; then the bridge's sites,
    /// A then B).
    pub fn tensors(&self) -> impl Iterator<Item = &Array2<F>> {
        self.pairs
            .values()
            .chain(self.bridge.values())
            .flat_map(|p| [&p.a, &p.b])
    }

    /// Mutable twin of [`tensors`](Self::tensors), same order.
    pub fn tensors_mut(&mut self) -> impl Iterator<Item = &mut Array2<F>> {
        self.pairs
            .values_mut()
            .chain(self.bridge.values_mut())
            .flat_map(|p| [&mut p.a, &mut p.b])
    }

    /// Number of scalar parameters.
    pub fn len(&self) -> usize {
        self.tensors().map(|t| t.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Euclidean norm over all parameters.
    pub fn norm(&self) -> F {
        self.tensors()
            .map(|t| t.iter().map(|&v| v * v).sum::<F>())
            .sum::<F>()
            .sqrt()
    }
}
