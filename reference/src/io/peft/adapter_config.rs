//! The settings this crate takes from a PEFT `adapter_config.json` ([`AdapterSettings`]), and the
//! keys it refuses or ignores.

use crate::base::config::ModelConfig;
use crate::base::weight_names::Target;
use crate::error::{Error, Result};
use crate::io::peft_pattern::{Pattern, read_ordered};
use serde_json::{Map, Value};
use std::path::Path;

/// What this crate takes from a PEFT `adapter_config.json`.
pub(super) struct AdapterSettings {
    pub(super) rank: usize,
    pub(super) alpha: f32,
    pub(super) rank_pattern: Pattern<usize>,
    pub(super) alpha_pattern: Pattern<f32>,
    pub(super) use_rslora: bool,
    /// Canonical order.
    pub(super) targets: Vec<Target>,
    pub(super) layers_to_transform: Option<Vec<usize>>,
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
    pub(super) fn read(path: &Path, model: &ModelConfig) -> Result<Self> {
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

    pub(super) fn module_list(&self) -> String {
        self.targets
            .iter()
            .map(|t| t.module())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
