//! PEFT LoRA adapter files: the storage of the accelerator adapters (docs/m2r2/accelerator.md), so
//! adapters trained with PEFT load unchanged and ours load in PEFT.
//!
//! | file                        | content                                                        |
//! |-----------------------------|----------------------------------------------------------------|
//! | `adapter_config.json`       | `peft_type` "LORA", `r`, `lora_alpha`, `target_modules`, ...   |
//! | `adapter_model.safetensors` | `base_model.model.model.layers.{l}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight` |
//! |                             | `base_model.model.model.layers.{l}.mlp.{gate,up,down}_proj.lora_{A,B}.weight`  |
//!
//! `lora_A.weight` is `[r, in]`, `lora_B.weight` is `[out, r]` (f32 when written; f32, f16 or bf16
//! when read). `{l}` is the 0-based code layer. On load the prefix `model.layers.` (adapters saved
//! through transformers' PEFT integration) is accepted as well. A module's rank and alpha are `r`
//! and `lora_alpha` unless `rank_pattern` / `alpha_pattern` override them (`io::peft_pattern`).
//!
//! This file knows the format only: [`PeftLora`] holds the tensors and settings as stored, and
//! `m2r2::accelerator` turns them into the adapters of the fast stream.

use crate::base::weight_names::Target;
use ndarray::Array2;
use std::collections::BTreeMap;

mod adapter_config;
mod read;
#[cfg(test)]
mod tests;
mod write;

/// PEFT's adapter config file name.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file name.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Prefix of adapter tensor names as PEFT writes them (`PeftModel` over `LlamaForCausalLM`).
const PEFT_PREFIX: &str = "base_model.model.model.layers.";
/// Prefix also accepted on load (transformers' PEFT integration saves without `base_model.model.`).
const BARE_PREFIX: &str = "model.layers.";

/// Which half of a LoRA pair a tensor holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoraPart {
    /// `lora_A`, `[r, in]`
    A,
    /// `lora_B`, `[out, r]`
    B,
}

/// The PEFT tensor name of one half of the LoRA pair on `target` of code layer `layer`.
pub fn peft_tensor_name(layer: usize, target: Target, part: LoraPart) -> String {
    let part = match part {
        LoraPart::A => "lora_A",
        LoraPart::B => "lora_B",
    };
    format!(
        "{PEFT_PREFIX}{layer}.{}.{}.{part}.weight",
        target.parent(),
        target.module()
    )
}

/// `(layer, target, part)` of a PEFT tensor name, or `None` if it is not a LoRA tensor of a
/// decoder-layer linear map we know.
fn parse_tensor_name(name: &str) -> Option<(usize, Target, LoraPart)> {
    let rest = name
        .strip_prefix(PEFT_PREFIX)
        .or_else(|| name.strip_prefix(BARE_PREFIX))?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (parent, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let target = Target::from_module(module).filter(|t| t.parent() == parent)?;
    let part = match rest {
        "lora_A.weight" => LoraPart::A,
        "lora_B.weight" => LoraPart::B,
        _ => return None,
    };
    Some((layer, target, part))
}

/// A plain LoRA adapter as PEFT stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct PeftLora {
    /// `r`: the rank of every module that `rank_pattern` does not name.
    pub rank: usize,
    /// `lora_alpha`: the alpha of every module that `alpha_pattern` does not name.
    pub alpha: f32,
    /// `use_rslora`: scale `alpha / sqrt(r)` instead of `alpha / r`.
    pub use_rslora: bool,
    /// `target_modules`, canonical order.
    pub targets: Vec<Target>,
    /// Layers of the base model (the adapted ones are the keys of `pairs`).
    pub num_layers: usize,
    /// The LoRA pairs by code layer and target.
    pub pairs: BTreeMap<(usize, Target), PeftPair>,
}

/// One module's LoRA pair and its own alpha; its rank is `a`'s row count.
#[derive(Clone, Debug, PartialEq)]
pub struct PeftPair {
    /// `lora_A`, `[r, in]`
    pub a: Array2<f32>,
    /// `lora_B`, `[out, r]`
    pub b: Array2<f32>,
    pub alpha: f32,
}
