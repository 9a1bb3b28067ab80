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

use crate::base::config::ModelConfig;
use crate::base::weight_names::Target;
use crate::base::weights::TensorSource;
use crate::error::{Error, Result};
use crate::io::checkpoint::{SafetensorsSource, write_f32_safetensors};
use crate::io::peft_pattern::{Pattern, module_name, read_ordered};
use ndarray::Array2;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

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

    /// Read a PEFT LoRA adapter (`adapter_config.json`, `adapter_model.safetensors`) for `model`.
    /// Per-module ranks and alphas (`rank_pattern` / `alpha_pattern`) load (`io::peft_pattern`).
    /// Refused, with the file and key or tensor named: anything but plain LoRA on linear maps
    /// (DoRA, biases, `fan_in_fan_out`, `modules_to_save`, ...), target
    /// modules outside the seven, MLP targets on a MoE model, unknown tensor names, layers `>= N`,
    /// a `lora_A` without its `lora_B` (or the reverse), ranks other than the module's `r` (or its
    /// `rank_pattern` entry), wrong shapes, non-finite values.
    pub fn read(dir: &Path, model: &ModelConfig) -> Result<Self> {
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let settings = AdapterSettings::read(&config_path, model)?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        let label = weights_path.display().to_string();
        let config_label = config_path.display().to_string();
        let src = SafetensorsSource::open_files(std::slice::from_ref(&weights_path))?;

        let mut halves: BTreeMap<(usize, Target), [Option<Array2<f32>>; 2]> = BTreeMap::new();
        for name in src.names() {
            let Some((l, t, part)) = parse_tensor_name(&name) else {
                return Err(Error::format(
                    &label,
                    format!(
                        "unknown tensor `{name}`: expected LoRA tensors named like \
                         `{}` on {}",
                        peft_tensor_name(0, Target::ALL[0], LoraPart::A),
                        Target::all_modules()
                    ),
                ));
            };
            let bad = |msg: String| Err(Error::format(&label, format!("tensor `{name}`: {msg}")));
            if l >= model.num_hidden_layers {
                return bad(format!(
                    "layer {l} does not exist (the model has {} layers, 0..{})",
                    model.num_hidden_layers, model.num_hidden_layers
                ));
            }
            if !settings.targets.contains(&t) {
                return bad(format!(
                    "`{t}` is not in target_modules of {config_label} ({})",
                    settings.module_list()
                ));
            }
            if let Some(allowed) = &settings.layers_to_transform
                && !allowed.contains(&l)
            {
                return bad(format!(
                    "layer {l} is not in layers_to_transform of {config_label} ({allowed:?})"
                ));
            }
            let raw = src.read(&name)?.expect("listed name");
            let (r, r_source) = match settings.rank_pattern.get(&module_name(l, t)) {
                Some(r) => (r, "its rank_pattern entry"),
                None => (settings.rank, "r"),
            };
            let (out, inp) = t.shape(model);
            let expected = match part {
                LoraPart::A => vec![r, inp],
                LoraPart::B => vec![out, r],
            };
            if raw.shape != expected {
                let rank_axis = usize::from(part == LoraPart::B);
                let other_axis = 1 - rank_axis;
                if raw.shape.len() == 2 && raw.shape[other_axis] == expected[other_axis] {
                    return Err(Error::config(
                        &label,
                        format!(
                            "tensor `{name}` has rank {} (shape {:?}) but {config_label} says \
                             {r_source} = {r} (expected shape {expected:?})",
                            raw.shape[rank_axis], raw.shape
                        ),
                    ));
                }
                return Err(Error::ShapeMismatch {
                    file: label.clone(),
                    tensor: name,
                    expected,
                    actual: raw.shape,
                });
            }
            if let Some(v) = raw.data.iter().find(|v| !v.is_finite()) {
                return bad(format!("holds a non-finite value ({v})"));
            }
            let m = Array2::from_shape_vec((expected[0], expected[1]), raw.data)
                .expect("shape checked");
            let slot = &mut halves.entry((l, t)).or_default()[part as usize];
            if slot.is_some() {
                return bad(format!(
                    "layer {l} {t} {part:?} appears twice (under both name prefixes)"
                ));
            }
            *slot = Some(m);
        }

        let mut pairs = BTreeMap::new();
        for ((l, t), [a, b]) in halves {
            let missing = |part| {
                Err(Error::MissingTensor {
                    file: label.clone(),
                    tensor: peft_tensor_name(l, t, part),
                })
            };
            let alpha = settings
                .alpha_pattern
                .get(&module_name(l, t))
                .unwrap_or(settings.alpha);
            match (a, b) {
                (Some(a), Some(b)) => pairs.insert((l, t), PeftPair { a, b, alpha }),
                (None, _) => return missing(LoraPart::A),
                (_, None) => return missing(LoraPart::B),
            };
        }
        Ok(PeftLora {
            rank: settings.rank,
            alpha: settings.alpha,
            use_rslora: settings.use_rslora,
            targets: settings.targets,
            num_layers: model.num_hidden_layers,
            pairs,
        })
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

/// What this crate takes from a PEFT `adapter_config.json`.
struct AdapterSettings {
    rank: usize,
    alpha: f32,
    rank_pattern: Pattern<usize>,
    alpha_pattern: Pattern<f32>,
    use_rslora: bool,
    /// Canonical order.
    targets: Vec<Target>,
    layers_to_transform: Option<Vec<usize>>,
}

/// `adapter_config.json` keys that must hold their "off" value (null, false, `{}` or `[]`),
/// with what they would ask for.
const MUST_BE_OFF: &[(&str, &str)] = &[
    ("use_dora", "DoRA (weight-decomposed LoRA)"),
    ("fan_in_fan_out", "transposed (Conv1D) base weights"),
    ("modules_to_save", "fully trained copies of base modules"),
    ("lora_bias", "a bias on lora_B"),
    ("layer_replication", "replicated layers"),
    ("exclude_modules", "excluded modules"),
    ("trainable_token_indices", "trained token embeddings"),
    ("target_parameters", "LoRA on raw parameters"),
    ("use_qalora", "QA-LoRA pooling"),
    ("alora_invocation_tokens", "activated LoRA"),
    ("arrow_config", "Arrow routing"),
    ("use_bdlora", "block-diagonal LoRA"),
];

/// `adapter_config.json` keys that do not change inference (initialisation, training and
/// bookkeeping settings).
const IGNORED: &[&str] = &[
    "task_type",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "init_lora_weights",
    "lora_dropout",
    "peft_version",
    "auto_mapping",
    "megatron_config",
    "megatron_core",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "runtime_config",
    "qalora_group_size",
    "ensure_weight_tying",
];

/// The "off" value of an optional PEFT feature.
fn is_off(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

impl AdapterSettings {
    fn read(path: &Path, model: &ModelConfig) -> Result<Self> {
        let label = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let err = |msg: String| Error::config(&label, msg);
        let mut map: Map<String, Value> = match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(err("expected a JSON object".into())),
            Err(e) => return Err(err(format!("not valid JSON: {e}"))),
        };
        let mut take = |key: &str| map.remove(key).filter(|v| !v.is_null());

        match take("peft_type") {
            Some(Value::String(s)) if s == "LORA" => {}
            Some(v) => {
                return Err(err(format!(
                    "peft_type {v} is not supported (only \"LORA\")"
                )));
            }
            None => return Err(err("missing `peft_type` (expected \"LORA\")".into())),
        }
        let rank = match take("r") {
            Some(v) => v
                .as_u64()
                .filter(|&r| r > 0)
                .ok_or_else(|| err(format!("`r` must be a positive integer, got {v}")))?
                as usize,
            None => return Err(err("missing `r`".into())),
        };
        let alpha = match take("lora_alpha") {
            Some(v) => v
                .as_f64()
                .filter(|a| a.is_finite())
                .ok_or_else(|| err(format!("`lora_alpha` must be a number, got {v}")))?
                as f32,
            None => return Err(err("missing `lora_alpha`".into())),
        };
        // Taken out of `map` here, read in file order below.
        take("rank_pattern");
        take("alpha_pattern");
        let (rank_pairs, alpha_pairs) =
            read_ordered(&text).map_err(|e| err(format!("rank_pattern / alpha_pattern: {e}")))?;
        let rank_pattern = Pattern::compile(
            rank_pairs,
            |v| v.as_u64().filter(|&r| r > 0).map(|r| r as usize),
            "a positive integer rank",
        )
        .map_err(|e| err(format!("rank_pattern: {e}")))?;
        let alpha_pattern = Pattern::compile(
            alpha_pairs,
            |v| v.as_f64().filter(|a| a.is_finite()).map(|a| a as f32),
            "a number",
        )
        .map_err(|e| err(format!("alpha_pattern: {e}")))?;
        let use_rslora = match take("use_rslora") {
            None => false,
            Some(Value::Bool(b)) => b,
            Some(v) => return Err(err(format!("`use_rslora` must be true or false, got {v}"))),
        };
        match take("bias") {
            None => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(v) => {
                return Err(err(format!(
                    "bias = {v} is not supported (only \"none\": trained biases are not loaded)"
                )));
            }
        }
        let targets = Self::targets(take("target_modules"), model, &err)?;
        let layers_to_transform = match take("layers_to_transform") {
            None => None,
            Some(v) => {
                let layers: Option<Vec<usize>> = match &v {
                    Value::Number(n) => n.as_u64().map(|l| vec![l as usize]),
                    Value::Array(items) => items
                        .iter()
                        .map(|i| i.as_u64().map(|l| l as usize))
                        .collect(),
                    _ => None,
                };
                let layers = layers.ok_or_else(|| {
                    err(format!(
                        "`layers_to_transform` must be a layer index or a list, got {v}"
                    ))
                })?;
                if let Some(l) = layers.iter().find(|&&l| l >= model.num_hidden_layers) {
                    return Err(err(format!(
                        "layers_to_transform names layer {l}, but the model has {} layers",
                        model.num_hidden_layers
                    )));
                }
                Some(layers)
            }
        };
        match take("layers_pattern") {
            None => {}
            Some(Value::String(s)) if s == "layers" => {}
            Some(Value::Array(a)) if a.iter().all(|v| v.as_str() == Some("layers")) => {}
            Some(v) => {
                return Err(err(format!(
                    "layers_pattern {v} does not match this model (its layers are `layers`)"
                )));
            }
        }
        for &(key, what) in MUST_BE_OFF {
            if let Some(v) = take(key)
                && !is_off(&v)
            {
                return Err(err(format!(
                    "`{key}` = {v} asks for {what}, which is not supported"
                )));
            }
        }
        for key in IGNORED {
            take(key);
        }
        // Newer PEFT versions add keys; one left at its "off" value changes nothing.
        if let Some((key, v)) = map.iter().find(|(_, v)| !is_off(v)) {
            return Err(err(format!(
                "unknown key `{key}` = {v}: it may change the adapter, so it is refused"
            )));
        }
        Ok(AdapterSettings {
            rank,
            alpha,
            rank_pattern,
            alpha_pattern,
            use_rslora,
            targets,
            layers_to_transform,
        })
    }

    /// `target_modules`: a list of the seven module names, or PEFT's `"all-linear"` shorthand
    /// (all seven on dense models).
    fn targets(
        value: Option<Value>,
        model: &ModelConfig,
        err: &dyn Fn(String) -> Error,
    ) -> Result<Vec<Target>> {
        let mut targets: Vec<Target> = match value {
            None => return Err(err("missing `target_modules`".into())),
            Some(Value::String(s)) if s == "all-linear" => {
                if model.moe.is_some() {
                    return Err(err(
                        "target_modules \"all-linear\" includes the experts of the MoE layers; \
                         on MoE models list only q_proj, k_proj, v_proj, o_proj"
                            .into(),
                    ));
                }
                Target::ALL.to_vec()
            }
            Some(Value::String(s)) => {
                return Err(err(format!(
                    "target_modules \"{s}\" is a regular expression, which is not supported: \
                     list module names ({})",
                    Target::all_modules()
                )));
            }
            Some(Value::Array(items)) => {
                let mut ts = Vec::new();
                for item in items {
                    let t = item.as_str().and_then(Target::from_module).ok_or_else(|| {
                        err(format!(
                            "target module {item} is not supported (supported: {})",
                            Target::all_modules()
                        ))
                    })?;
                    if !ts.contains(&t) {
                        ts.push(t);
                    }
                }
                ts
            }
            Some(v) => return Err(err(format!("`target_modules` must be a list, got {v}"))),
        };
        if targets.is_empty() {
            return Err(err("`target_modules` is empty".into()));
        }
        if model.moe.is_some()
            && let Some(t) = targets.iter().find(|t| t.is_mlp())
        {
            return Err(err(format!(
                "target module `{t}` is an MLP projection, but the model's feed-forward is a \
                 sparse MoE block: on MoE models only attention projections carry adapters"
            )));
        }
        targets.sort();
        Ok(targets)
    }

    fn module_list(&self) -> String {
        self.targets
            .iter()
            .map(|t| t.module())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::weight_names::{AttnProj, MlpProj};

    #[test]
    fn tensor_names() {
        let q = Target::Attn(AttnProj::Q);
        let down = Target::Mlp(MlpProj::Down);
        assert_eq!(
            peft_tensor_name(3, q, LoraPart::A),
            "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
        );
        assert_eq!(
            peft_tensor_name(0, down, LoraPart::B),
            "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
        );
        for (l, t, p) in [(3, q, LoraPart::A), (12, down, LoraPart::B)] {
            assert_eq!(
                parse_tensor_name(&peft_tensor_name(l, t, p)),
                Some((l, t, p))
            );
        }
        assert_eq!(
            parse_tensor_name("model.layers.2.self_attn.v_proj.lora_B.weight"),
            Some((2, Target::Attn(AttnProj::V), LoraPart::B))
        );
        for bad in [
            "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.layers.x.self_attn.q_proj.lora_A.weight",
        ] {
            assert_eq!(parse_tensor_name(bad), None, "{bad}");
        }
    }
}
