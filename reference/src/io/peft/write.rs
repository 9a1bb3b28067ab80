//! Writing a [`PeftLora`] as PEFT stores it: `adapter_config.json` and
//! `adapter_model.safetensors`.

use super::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LoraPart, PeftLora, peft_tensor_name};
use crate::error::{Error, Result};
use crate::io::checkpoint::write_f32_safetensors;
use crate::io::peft_pattern::module_name;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::path::Path;

impl PeftLora {
    /// Write `dir/adapter_config.json` and `dir/adapter_model.safetensors` (f32 tensors).
    /// `layers_to_transform` lists the layers that carry adapters, so PEFT builds exactly these.
    /// `dir` must exist.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let adapted: Vec<usize> = (0..self.num_layers)
            .filter(|&l| self.pairs.keys().any(|&(pl, _)| pl == l))
            .collect();
        let layers_to_transform = if adapted.is_empty() || adapted.len() == self.num_layers {
            Value::Null
        } else {
            json!(adapted)
        };
        // Modules whose rank or alpha differs from `r` / `lora_alpha`, by full name.
        let (mut rank_pattern, mut alpha_pattern) = (Map::new(), Map::new());
        for (&(l, t), pair) in &self.pairs {
            if pair.a.nrows() != self.rank {
                rank_pattern.insert(module_name(l, t), json!(pair.a.nrows()));
            }
            if pair.alpha != self.alpha {
                alpha_pattern.insert(module_name(l, t), alpha_json(pair.alpha));
            }
        }
        let config = json!({
            "alpha_pattern": alpha_pattern,
            "auto_mapping": null,
            "base_model_name_or_path": null,
            "bias": "none",
            "exclude_modules": null,
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "layer_replication": null,
            "layers_pattern": null,
            "layers_to_transform": layers_to_transform,
            "loftq_config": {},
            "lora_alpha": alpha_json(self.alpha),
            "lora_bias": false,
            "lora_dropout": 0.0,
            "megatron_config": null,
            "megatron_core": "megatron.core",
            "modules_to_save": null,
            "peft_type": "LORA",
            "r": self.rank,
            "rank_pattern": rank_pattern,
            "revision": null,
            "target_modules": self.targets.iter().map(|t| t.module()).collect::<Vec<_>>(),
            "task_type": "CAUSAL_LM",
            "use_dora": false,
            "use_rslora": self.use_rslora,
        });
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let text = serde_json::to_string_pretty(&config).expect("JSON value serialises");
        std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))?;

        let mut tensors = Vec::new();
        for (&(l, t), pair) in &self.pairs {
            for (part, m) in [(LoraPart::A, &pair.a), (LoraPart::B, &pair.b)] {
                let data = m.as_standard_layout().iter().copied().collect();
                tensors.push((peft_tensor_name(l, t, part), m.shape().to_vec(), data));
            }
        }
        // PEFT and transformers expect the `format: pt` metadata of torch-written files.
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_f32_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors, Some(metadata))
    }
}

/// An integral alpha is written as an integer, as PEFT users write it.
fn alpha_json(alpha: f32) -> Value {
    if alpha.fract() == 0.0 && alpha.abs() < 1e9 {
        json!(alpha as i64)
    } else {
        json!(alpha)
    }
}
