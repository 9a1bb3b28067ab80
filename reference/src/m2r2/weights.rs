//! Everything M2R2 adds to a frozen base model, as one folder:
//!
//! | file                        | content                                     | required |
//! |-----------------------------|---------------------------------------------|----------|
//! | `m2r2_config.json`          | [`M2r2Config`]: gates, targets, ARLA, draft | yes      |
//! | `adapter_config.json`       | PEFT LoRA config of the accelerator         | yes      |
//! | `adapter_model.safetensors` | PEFT LoRA tensors of the accelerator        | yes      |
//! | `arla.safetensors`          | ARLA weights (see [`crate::m2r2::arla`])          | no       |
//! | `draft_head.json`           | pruned draft head (see [`crate::m2r2::draft_head`]) | no     |
//! | `bridge.safetensors`        | the bridge (see [`crate::m2r2::bridge`]); exactly when the config names one | no |
//!
//! `rank`, `alpha` and `targets` appear in both `m2r2_config.json` and `adapter_config.json`; they
//! must agree. `use_rslora` is taken from `adapter_config.json` alone.

use crate::base::config::ModelConfig;
use crate::error::{Error, Result};
use crate::io::builtin::BUILTIN_NAMES;
use crate::io::folder_kind;
use crate::io::peft::ADAPTER_CONFIG_FILE;
use crate::m2r2::accelerator::Accelerator;
use crate::m2r2::arla::{ARLA_FILE, Arla};
use crate::m2r2::bridge::{BRIDGE_FILE, Bridge, BridgeConfig};
use crate::m2r2::config::{M2R2_CONFIG_FILE, M2r2Config};
use crate::m2r2::draft_head::{DRAFT_HEAD_FILE, DraftHead};
use crate::m2r2::shipped::{ShippedWeights, shipped_for};
use std::path::Path;

/// The seed of the M2R2 weights that ship with the built-in models (`tiny`, `tiny-moe`): adapters
/// from this seed, ARLA from this seed + 1. Different from the base weights' seed, so the streams
/// are unrelated.
pub const BUILTIN_M2R2_SEED: u64 = 0x4d32_5232; // "M2R2"

/// The M2R2 weights of one adapted model.
#[derive(Clone, Debug, PartialEq)]
pub struct M2r2Weights {
    pub config: M2r2Config,
    pub accelerator: Accelerator,
    /// `None` when the folder has no `arla.safetensors` (then only the confidence and entropy
    /// gates are available).
    pub arla: Option<Arla>,
    /// `None` when the folder has no `draft_head.json`: drafts score the whole vocabulary.
    pub draft_head: Option<DraftHead>,
    /// `Some` exactly when `config.bridge` is: drafts read the last verified slow state.
    pub bridge: Option<Bridge>,
}

impl M2r2Weights {
    /// Read an M2R2 weights folder (table in the module docs) for `model`, validating everything.
    pub fn load_dir(dir: &Path, model: &ModelConfig) -> Result<Self> {
        if dir.is_dir()
            && let Some(why) = folder_kind::lacking(dir, M2R2_CONFIG_FILE, "an M2R2 weights folder")
        {
            return Err(Error::Invalid(why));
        }
        let config = M2r2Config::load(dir, model)?;
        let accelerator = Accelerator::load_peft(dir, model)?;
        let m2r2_file = dir.join(M2R2_CONFIG_FILE).display().to_string();
        let peft_file = dir.join(ADAPTER_CONFIG_FILE).display().to_string();
        let mismatch = |what: &str, ours: String, peft: String| {
            Err(Error::config(
                &m2r2_file,
                format!("{what} is {ours} here but {peft} in {peft_file}"),
            ))
        };
        if config.rank != accelerator.rank {
            return mismatch(
                "`rank`",
                config.rank.to_string(),
                format!("r = {}", accelerator.rank),
            );
        }
        if config.alpha != accelerator.alpha {
            return mismatch(
                "`alpha`",
                config.alpha.to_string(),
                format!("lora_alpha = {}", accelerator.alpha),
            );
        }
        let mut targets = config.targets.clone();
        targets.sort();
        if targets != accelerator.targets {
            let names = |ts: &[crate::base::weight_names::Target]| {
                format!("{:?}", ts.iter().map(|t| t.module()).collect::<Vec<_>>())
            };
            return mismatch(
                "`targets`",
                names(&targets),
                format!("target_modules = {}", names(&accelerator.targets)),
            );
        }
        let arla_path = dir.join(ARLA_FILE);
        let arla = if arla_path.is_file() {
            Some(Arla::load(
                &arla_path,
                model.hidden_size,
                config.num_gates(),
                config.arla.latent,
            )?)
        } else {
            None
        };
        let head_path = dir.join(DRAFT_HEAD_FILE);
        let draft_head = if head_path.is_file() {
            Some(DraftHead::load(&head_path, model.vocab_size)?)
        } else {
            None
        };
        let bridge_path = dir.join(BRIDGE_FILE);
        let bridge = match (&config.bridge, bridge_path.is_file()) {
            (Some(b), true) => Some(Bridge::load(&bridge_path, model.hidden_size, b)?),
            (Some(_), false) => {
                return Err(Error::config(
                    &m2r2_file,
                    format!(
                        "names a bridge (`bridge`) but {} does not exist",
                        bridge_path.display()
                    ),
                ));
            }
            (None, true) => {
                return Err(Error::config(
                    &m2r2_file,
                    format!(
                        "names no bridge, but {} exists: add the `bridge` settings it was \
                         trained with, or remove the file",
                        bridge_path.display()
                    ),
                ));
            }
            (None, false) => None,
        };
        Ok(M2r2Weights {
            config,
            accelerator,
            arla,
            draft_head,
            bridge,
        })
    }

    /// Write the folder (created if needed). Without ARLA weights or a draft head, a stale
    /// `arla.safetensors` / `draft_head.json` in `dir` is removed, so the folder always loads back
    /// as these weights.
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        self.config.save(dir)?;
        self.accelerator.save_peft(dir)?;
        let arla_path = dir.join(ARLA_FILE);
        match &self.arla {
            Some(arla) => arla.save(&arla_path)?,
            None => remove_stale(&arla_path)?,
        }
        match &self.draft_head {
            Some(head) => head.save(dir)?,
            None => remove_stale(&dir.join(DRAFT_HEAD_FILE))?,
        }
        match &self.bridge {
            Some(bridge) => bridge.save(&dir.join(BRIDGE_FILE)),
            None => remove_stale(&dir.join(BRIDGE_FILE)),
        }
    }

    /// The default settings ([`M2r2Config::default_for`]) with zero adapters (`A = B = 0`) and no
    /// ARLA: the fast stream equals the slow stream.
    pub fn zeros(model: &ModelConfig) -> Self {
        let config = M2r2Config::default_for(model);
        let accelerator = Accelerator::zeros(model, &config);
        M2r2Weights {
            config,
            accelerator,
            arla: None,
            draft_head: None,
            bridge: None,
        }
    }

    /// Seeded random weights for `config` (what `m2r2 init-m2r2 --seed S` writes): adapters from
    /// [`Accelerator::random`] with `seed`, ARLA from [`Arla::random`] with `seed + 1` (wrapping).
    /// `config.seed` is set to `Some(seed)`.
    pub fn random(model: &ModelConfig, config: M2r2Config, seed: u64) -> Result<Self> {
        let ranks = vec![config.rank; config.num_gates()];
        Self::random_ranked(model, config, &ranks, seed)
    }

    /// [`random`](Self::random) with rank `ranks[j]` on interval `j`
    /// ([`Accelerator::random_ranked`]); one positive rank per gate, else an error.
    pub fn random_ranked(
        model: &ModelConfig,
        mut config: M2r2Config,
        ranks: &[usize],
        seed: u64,
    ) -> Result<Self> {
        config.validate(model, "M2R2 settings")?;
        if ranks.len() != config.num_gates() || ranks.contains(&0) {
            return Err(Error::Invalid(format!(
                "{} ranks for {} gates: give one positive rank per gate",
                ranks.len(),
                config.num_gates()
            )));
        }
        config.seed = Some(seed);
        let accelerator = Accelerator::random_ranked(model, &config, ranks, seed);
        let arla = Arla::random(
            model.hidden_size,
            config.num_gates(),
            config.arla.latent,
            seed.wrapping_add(1),
        );
        Ok(M2r2Weights {
            config,
            accelerator,
            arla: Some(arla),
            draft_head: None,
            bridge: None,
        })
    }

    /// The M2R2 weights that ship with a model: for the built-in models (`tiny`, `tiny-moe`)
    /// random weights with the default settings and [`BUILTIN_M2R2_SEED`]; for a model with trained
    /// weights in the crate (`smollm2`, see [`crate::m2r2::shipped`]) those; for any other model
    /// [`M2r2Weights::zeros`] (load trained weights with [`M2r2Weights::load_dir`]).
    pub fn builtin_for(model_name: &str, model: &ModelConfig) -> Result<Self> {
        if BUILTIN_NAMES.contains(&model_name) {
            Self::random(model, M2r2Config::default_for(model), BUILTIN_M2R2_SEED)
        } else if let Some(shipped) = shipped_for(model_name) {
            M2r2Weights::load_shipped(shipped, model)
        } else {
            Ok(Self::zeros(model))
        }
    }
}

impl M2r2Weights {
    /// The bridge, when drafting at `draft_gate` reads it (the gate it was trained at).
    pub fn bridge_at(&self, draft_gate: usize) -> Option<&Bridge> {
        let gate = self.config.bridge.as_ref().map(|b| b.gate);
        self.bridge.as_ref().filter(|_| gate == Some(draft_gate))
    }

    /// These weights with a bridge of `config` (replacing any), its maps from
    /// [`Bridge::drawn`] with `seed` and `B ~ N(0, b_std^2)`: `b_std = 0` is the untrained bridge,
    /// which changes nothing.
    pub fn with_bridge(
        mut self,
        model: &ModelConfig,
        config: BridgeConfig,
        seed: u64,
        b_std: f32,
    ) -> Result<Self> {
        // the M2R2 settings' own check (the bridge's rank, sites, scales and gate) before drawing
        self.config.bridge = Some(config);
        self.config.validate(model, "M2R2 settings with a bridge")?;
        let config = self.config.bridge.as_ref().expect("just set");
        self.bridge = Some(Bridge::drawn(model.hidden_size, config, seed, b_std));
        Ok(self)
    }
}

/// Remove `path` if it exists.
fn remove_stale(path: &Path) -> Result<()> {
    if path.exists() {
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}

impl M2r2Weights {
    /// Load a shipped folder for `model` (validated like any M2R2 weights folder).
    pub fn load_shipped(shipped: &ShippedWeights, model: &ModelConfig) -> Result<M2r2Weights> {
        let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
        for file in shipped.files {
            let path = dir.path().join(file.name);
            std::fs::write(&path, file.bytes).map_err(|e| Error::io(&path, e))?;
        }
        M2r2Weights::load_dir(dir.path(), model).map_err(|e| {
            Error::Invalid(format!(
                "the shipped M2R2 weights of `{}` ({}) do not fit this model: {e}",
                shipped.model, shipped.path
            ))
        })
    }
}

#[cfg(test)]
mod tests;
