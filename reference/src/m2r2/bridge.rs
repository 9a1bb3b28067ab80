//! The bridge \[ours\]: the draft reads the last verified slow state (docs/m2r2/bridge.md).
//!
//! Every verification computes the final slow residual `s_N` of each verified position; the draft
//! of the next position throws it away in plain M2R2. The bridge feeds it back in. For the draft
//! row at position `p` (its token `x_p`, drafting `x_{p+1}`):
//!
//! ```text
//! h_{p-1} = s_N[p-1]            when position p-1 is verified (the first draft of a round)
//!         = u_gd[p-1]           otherwise: the draft's own estimate of s_N there (its exit state)
//! x̂       = FinalNorm(h_{p-1})                       [D]   the state the LM head reads, no weight of its own
//! entry:  f[p] <- s_{e_{gd-1}}[p] + c_e B_e A_e x̂    the fast stream of the draft gate's interval starts shifted
//! gate:   u_gd[p] <- f[p] + c_g B_g A_g x̂             added to the exit state at the draft gate
//! ```
//!
//! `A: [r, D]`, `B: [D, r]`, `c` a fixed scale per site (`"scales"` in the config, 1 when not
//! given): `x̂` is about 20 times the size of SmolLM2's token embeddings, so the entry's term is
//! scaled down to the size of the state it joins (what `train --bridge-rank` sets, see
//! [`BridgeConfig::matched_scales`]). With `B = 0` the bridge changes nothing.
//! At position 0 there is no earlier state and the bridge adds nothing. The bridge acts only
//! in speculative drafting at the draft gate it was trained at (`gate` in its config): early exit,
//! the other gates and drafting at another gate never read it.
//!
//! Weights: `bridge.safetensors` in the M2R2 folder, present exactly when `m2r2_config.json` has a
//! `"bridge"` entry:
//!
//! | tensor                        | shape    | symbol |
//! |-------------------------------|----------|--------|
//! | `bridge.entry.lora_A.weight`  | `[r, D]` | `A_e`  |
//! | `bridge.entry.lora_B.weight`  | `[D, r]` | `B_e`  |
//! | `bridge.gate.lora_A.weight`   | `[r, D]` | `A_g`  |
//! | `bridge.gate.lora_B.weight`   | `[D, r]` | `B_g`  |
//!
//! (only the sites the config lists).

use crate::base::weights::TensorSource;
use crate::base::work::Work;
use crate::error::{Error, Result};
use crate::io::builtin::standard_normal;
use crate::io::checkpoint::{SafetensorsSource, write_f32_safetensors};
use crate::m2r2::accelerator::Lora;
pub use crate::m2r2::bridge_config::{BridgeConfig, BridgeSite};
use ndarray::{Array2, ArrayView2};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// File name of the bridge weights inside an M2R2 weights folder.
pub const BRIDGE_FILE: &str = "bridge.safetensors";

/// The bridge's weights: one low-rank map `B A` per site.
#[derive(Clone, Debug, PartialEq)]
pub struct Bridge {
    pub maps: BTreeMap<BridgeSite, Lora>,
}

impl Bridge {
    /// `c` of `site` (its map's `alpha / r`).
    pub fn scale(&self, site: BridgeSite) -> Option<f32> {
        self.maps.get(&site).map(|l| l.scale(false))
    }

    /// `A ~ N(0, 1/D)` from `seed` (sites in [`BridgeSite::ALL`] order, one ChaCha8 stream) and
    /// `B = 0`: a bridge that changes nothing until trained.
    pub fn initial(d: usize, config: &BridgeConfig, seed: u64) -> Self {
        Self::drawn(d, config, seed, 0.0)
    }

    /// Seeded random `A` and `B` (`B ~ N(0, b_std^2)`): for tests that need a bridge that acts.
    pub fn drawn(d: usize, config: &BridgeConfig, seed: u64, b_std: f32) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let r = config.rank;
        let a_std = 1.0 / (d as f32).sqrt();
        let mut maps = BTreeMap::new();
        for site in BridgeSite::ALL {
            let a = Array2::from_shape_simple_fn((r, d), || a_std * standard_normal(&mut rng));
            let b = Array2::from_shape_simple_fn((d, r), || b_std * standard_normal(&mut rng));
            if config.sites.contains(&site) {
                maps.insert(site, Lora::new(a, b, config.scale(site) * r as f32));
            }
        }
        Bridge { maps }
    }

    /// The term `c x̂ A^T B^T` of `site` (`None` when the bridge has no map there).
    ///
    /// # Shapes
    /// - `xhat`: `[T, D]` (`FinalNorm` of the states read) -> `[T, D]`
    pub fn term(&self, site: BridgeSite, xhat: ArrayView2<f32>) -> Option<Array2<f32>> {
        self.maps
            .get(&site)
            .map(|lora| lora.delta(xhat, lora.scale(false)))
    }

    /// Work of the bridge for one draft row: the final norm's weight and each site's two
    /// products (counted where the draft computes it, predicted by the cost model).
    pub fn work(&self, d: usize) -> Work {
        let r = self.rank();
        Work::read(d)
            + self
                .maps
                .values()
                .map(|_| Work::matmul(1, r, d, false) + Work::matmul(1, d, r, false))
                .sum::<Work>()
    }

    /// r
    pub fn rank(&self) -> usize {
        self.maps.values().next().map_or(0, Lora::rank)
    }

    /// Number of parameters over all sites.
    pub fn parameter_count(&self) -> usize {
        self.maps.values().map(Lora::parameter_count).sum()
    }

    /// Read `path` (a `bridge.safetensors`) for `config` on a model of width `d`: every site's
    /// `A` and `B` present with its shape and finite, and no other tensor.
    pub fn load(path: &Path, d: usize, config: &BridgeConfig) -> Result<Self> {
        let label = path.display().to_string();
        let src = SafetensorsSource::open_files(&[path.to_path_buf()])?;
        let expected: Vec<(String, Vec<usize>)> = config
            .sites
            .iter()
            .flat_map(|s| {
                let [a, b] = s.tensor_names();
                [(a, vec![config.rank, d]), (b, vec![d, config.rank])]
            })
            .collect();
        if let Some(name) = src
            .names()
            .into_iter()
            .find(|n| !expected.iter().any(|(e, _)| e == n))
        {
            return Err(Error::format(
                &label,
                format!(
                    "unknown tensor `{name}` (the config's bridge has: {})",
                    expected
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let read = |name: &str, shape: &[usize]| -> Result<Array2<f32>> {
            let t = src.read(name)?.ok_or_else(|| Error::MissingTensor {
                file: label.clone(),
                tensor: name.into(),
            })?;
            if t.shape != shape {
                return Err(Error::ShapeMismatch {
                    file: label.clone(),
                    tensor: name.into(),
                    expected: shape.to_vec(),
                    actual: t.shape,
                });
            }
            if let Some(v) = t.data.iter().find(|v| !v.is_finite()) {
                return Err(Error::format(
                    &label,
                    format!("tensor `{name}` holds a non-finite value ({v})"),
                ));
            }
            Ok(Array2::from_shape_vec((shape[0], shape[1]), t.data).expect("shape checked"))
        };
        let mut maps = BTreeMap::new();
        for &site in &config.sites {
            let [a_name, b_name] = site.tensor_names();
            let a = read(&a_name, &[config.rank, d])?;
            let b = read(&b_name, &[d, config.rank])?;
            maps.insert(
                site,
                Lora::new(a, b, config.scale(site) * config.rank as f32),
            );
        }
        Ok(Bridge { maps })
    }

    /// Write every site's `A` and `B` to `path` as f32 safetensors.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = Vec::new();
        for (site, lora) in &self.maps {
            let [a_name, b_name] = site.tensor_names();
            for (name, m) in [(a_name, lora.a()), (b_name, lora.b())] {
                tensors.push((name, m.shape().to_vec(), m.iter().copied().collect()));
            }
        }
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_f32_safetensors(path, &tensors, Some(metadata))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// `c x̂ A^T B^T` by hand: A = [1, 2], B = [3; -1], x̂ = [1, 1], c = 0.5 ->
    /// 0.5 (1 + 2) [3, -1] = [4.5, -1.5].
    #[test]
    fn term_hand_computed() {
        let mut c = BridgeConfig::new(1, 1, vec![BridgeSite::Gate]);
        c.scales.insert(BridgeSite::Gate, 0.5);
        let mut bridge = Bridge::initial(2, &c, 0);
        let lora = bridge.maps.get_mut(&BridgeSite::Gate).unwrap();
        lora.set(array![[1.0, 2.0]], array![[3.0], [-1.0]]);
        let t = bridge
            .term(BridgeSite::Gate, array![[1.0f32, 1.0]].view())
            .unwrap();
        assert_eq!(t, array![[4.5, -1.5]]);
        assert!(
            bridge
                .term(BridgeSite::Entry, array![[1.0f32, 1.0]].view())
                .is_none()
        );
    }

    #[test]
    fn initial_bridge_is_zero_and_round_trips() {
        let c = BridgeConfig::new(1, 1, vec![BridgeSite::Entry, BridgeSite::Gate]);
        let zero = Bridge::initial(8, &c, 3);
        assert!(zero.maps.values().all(Lora::is_zero));
        let drawn = Bridge::drawn(8, &c, 3, 0.5);
        let dir = std::env::temp_dir().join(format!("m2r2-bridge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(BRIDGE_FILE);
        drawn.save(&path).unwrap();
        assert_eq!(Bridge::load(&path, 8, &c).unwrap(), drawn);
        // wrong width: the error names the file and the tensor
        let err = Bridge::load(&path, 4, &c).unwrap_err().to_string();
        assert!(err.contains("bridge.entry.lora_A.weight") && err.contains(BRIDGE_FILE));
        // a config with one site: the other site's tensors are unknown
        let err = Bridge::load(&path, 8, &BridgeConfig::new(1, 1, vec![BridgeSite::Entry]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown tensor `bridge.gate"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
