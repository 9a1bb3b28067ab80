//! Parsing a Hugging Face `config.json` (transformers 4.x and 5.x) into a [`ModelConfig`].
//!
//! Every field of `config.json` is either understood, known to be irrelevant for inference (listed in
//! [`IGNORED_HF_FIELDS`]), or an error: a field we do not know might change the model, and silently
//! ignoring it would break the "exactly right" promise. `rope_theta` is read at the top level
//! (transformers 4.x) or inside `rope_parameters` (5.x).

use crate::base::config::{Architecture, ModelConfig, MoeConfig, RopeScaling};
use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// `config.json` fields that do not change inference (training knobs, bookkeeping). Anything not in
/// this list and not understood below is rejected.
pub const IGNORED_HF_FIELDS: &[&str] = &[
    "_name_or_path",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_commit_hash",
    "architectures",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "pad_token_id",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "output_router_logits",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "is_llama_config",
    "transformers.js_config",
    "tokenizer_class",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "torchscript",
    "use_bfloat16",
    "tie_encoder_decoder",
    "is_decoder",
    "is_encoder_decoder",
    "add_cross_attention",
    "chunk_size_feed_forward",
    "problem_type",
    "id2label",
    "label2id",
    "task_specific_params",
    "finetuning_task",
    "prefix",
    "sep_token_id",
    "decoder_start_token_id",
    "quantization_config_ignored",
    "max_window_layers",
];

impl ModelConfig {
    /// Parse a HF `config.json`. `file` names the file in error messages.
    pub fn from_hf_json(text: &str, file: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::config(file, format!("not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(Error::config(file, "expected a JSON object"));
        };
        HfFields { map, file }.parse()
    }
}

/// Reads fields out of a HF config map, remembering which were consumed so leftovers can be rejected.
struct HfFields<'a> {
    map: Map<String, Value>,
    file: &'a str,
}

impl HfFields<'_> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::config(self.file, msg)
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn usize(&mut self, key: &str) -> Result<Option<usize>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.err(format!("`{key}` must be a non-negative integer, got {v}"))
            }),
        }
    }

    fn required_usize(&mut self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| self.err(format!("missing required field `{key}`")))
    }

    fn f64(&mut self, key: &str) -> Result<Option<f64>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{key}` must be a number, got {v}"))),
        }
    }

    fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{key}` must be true or false, got {v}"))),
        }
    }

    fn str(&mut self, key: &str) -> Result<Option<String>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!("`{key}` must be a string, got {v}"))),
        }
    }

    /// `eos_token_id` may be one id or a list of ids.
    fn token_ids(&mut self, key: &str) -> Result<Vec<u32>> {
        match self.take(key) {
            None => Ok(vec![]),
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(|n| vec![n])
                .ok_or_else(|| self.err(format!("`{key}` must be a token id"))),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| self.err(format!("`{key}` must hold token ids")))
                })
                .collect(),
            Some(v) => Err(self.err(format!("`{key}` must be a token id or a list, got {v}"))),
        }
    }

    fn parse(mut self) -> Result<ModelConfig> {
        let model_type = self
            .str("model_type")?
            .ok_or_else(|| self.err("missing `model_type`"))?;
        let architecture = Architecture::from_model_type(&model_type).ok_or_else(|| {
            self.err(format!(
                "unsupported model_type `{model_type}` (supported: llama, mistral, qwen2, mixtral)"
            ))
        })?;

        if let Some(act) = self.str("hidden_act")?
            && act != "silu"
        {
            return Err(self.err(format!("hidden_act `{act}` is not supported (only `silu`)")));
        }
        if let Some(tp) = self.usize("pretraining_tp")?
            && tp != 1
        {
            return Err(self.err(format!("pretraining_tp = {tp} is not supported (only 1)")));
        }
        if self.bool("rope_interleaved")? == Some(true) {
            return Err(self.err("rope_interleaved = true is not supported (HF rotate-half only)"));
        }
        if self.take("quantization_config").is_some() {
            return Err(self.err(
                "quantized HF checkpoints (`quantization_config`) are not supported; \
                 use f32/f16/bf16 safetensors or a GGUF file",
            ));
        }

        let vocab_size = self.required_usize("vocab_size")?;
        let hidden_size = self.required_usize("hidden_size")?;
        let intermediate_size = self.required_usize("intermediate_size")?;
        let num_hidden_layers = self.required_usize("num_hidden_layers")?;
        let num_attention_heads = self.required_usize("num_attention_heads")?;
        // absent fields take transformers' defaults for the architecture (`LlamaConfig`,
        // `MistralConfig`, `Qwen2Config`, `MixtralConfig`); an explicit null key/value head
        // count is the query head count in all four
        let kv_heads_absent = !self.map.contains_key("num_key_value_heads");
        let num_key_value_heads = match self.usize("num_key_value_heads")? {
            Some(n) => n,
            None if kv_heads_absent => match architecture {
                Architecture::Mistral | Architecture::Mixtral => 8,
                Architecture::Qwen2 => 32,
                Architecture::Llama => num_attention_heads,
            },
            None => num_attention_heads,
        };
        let head_dim = match self.usize("head_dim")? {
            Some(h) => h,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let max_position_embeddings =
            self.usize("max_position_embeddings")?
                .unwrap_or(match architecture {
                    Architecture::Mistral | Architecture::Mixtral => 4096 * 32,
                    Architecture::Qwen2 => 32768,
                    _ => 2048,
                });
        let rms_norm_eps = self.f64("rms_norm_eps")?.unwrap_or(match architecture {
            Architecture::Mixtral => 1e-5,
            _ => 1e-6,
        });
        let (rope_theta, rope_scaling) = self.rope(architecture)?;

        let attention_bias = self.llama_only_bias("attention_bias", architecture, &model_type)?;
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let mlp_bias = self.llama_only_bias("mlp_bias", architecture, &model_type)?;
        let tie_word_embeddings = self.bool("tie_word_embeddings")?.unwrap_or(false);

        // `MistralConfig`'s default window is 4096; an explicit null is none
        let window_absent = !self.map.contains_key("sliding_window");
        let window = match self.usize("sliding_window")? {
            None if window_absent && architecture == Architecture::Mistral => Some(4096),
            w => w,
        };
        let use_sliding_window = self.bool("use_sliding_window")?;
        let layer_types = self.take("layer_types");
        let sliding_window = match architecture {
            Architecture::Mistral | Architecture::Mixtral => window,
            Architecture::Qwen2 if use_sliding_window == Some(true) => {
                return Err(self.err(
                    "qwen2 with use_sliding_window = true is not supported \
                     (per-layer windows from max_window_layers)",
                ));
            }
            _ => None,
        };
        if let Some(types) = layer_types {
            self.check_layer_types(types, num_hidden_layers, sliding_window)?;
        }

        let moe = if architecture == Architecture::Mixtral {
            Some(MoeConfig {
                num_local_experts: self.required_usize("num_local_experts")?,
                num_experts_per_tok: self.required_usize("num_experts_per_tok")?,
            })
        } else {
            None
        };

        let bos_token_id = self.token_ids("bos_token_id")?.first().copied();
        let eos_token_ids = self.token_ids("eos_token_id")?;

        for key in IGNORED_HF_FIELDS {
            self.map.remove(*key);
        }
        if let Some(key) = self.map.keys().next() {
            let all: Vec<&String> = self.map.keys().collect();
            return Err(self.err(format!(
                "unknown field `{key}` for model_type `{model_type}` (unknown: {all:?}); m2r2 refuses \
                 fields it does not understand because they might change the model"
            )));
        }

        let config = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            qkv_bias,
            o_bias,
            mlp_bias,
            tie_word_embeddings,
            sliding_window,
            moe,
            bos_token_id,
            eos_token_ids,
        };
        config.validate(self.file)?;
        Ok(config)
    }

    /// `attention_bias` or `mlp_bias` (`key`): Llama's switches for biases on every attention
    /// projection and on the MLP. Mistral and Mixtral build every projection with `bias=False`
    /// whatever the config says, and Qwen2 its MLP and `o_proj` (its q/k/v biases are always
    /// there), so for them a true flag asks for biases transformers would not use: refused rather
    /// than honoured (another model than transformers runs) or ignored (the config says biases).
    fn llama_only_bias(
        &mut self,
        key: &str,
        architecture: Architecture,
        model_type: &str,
    ) -> Result<bool> {
        let value = self.bool(key)?.unwrap_or(false);
        if value && architecture != Architecture::Llama {
            let biases = match architecture {
                Architecture::Qwen2 => "its only biases are on q, k and v, and always there",
                _ => "none of its projections has a bias",
            };
            return Err(self.err(format!(
                "`{key}` is true, but transformers' `{model_type}` does not read it: {biases}; \
                 only model_type `llama` honours `{key}` (set it false, or null)"
            )));
        }
        Ok(value)
    }

    /// `layer_types` (transformers 5): one entry per layer, `"full_attention"` or
    /// `"sliding_attention"`. Every layer here runs the same attention, windowed when the config
    /// has a window, so each entry must say that attention: a list that differs (per-layer
    /// windows, or a full layer beside a window) describes another model and is refused.
    fn check_layer_types(&self, types: Value, layers: usize, window: Option<usize>) -> Result<()> {
        const KNOWN: [&str; 2] = ["full_attention", "sliding_attention"];
        let list = match &types {
            Value::Array(items) => items.iter().map(Value::as_str).collect::<Option<Vec<_>>>(),
            _ => None,
        };
        let Some(list) = list else {
            return Err(self.err(format!(
                "`layer_types` must be a list of strings (one per layer: {KNOWN:?}), got {types}"
            )));
        };
        if list.len() != layers {
            return Err(self.err(format!(
                "`layer_types` has {} entries, expected one per layer: num_hidden_layers = {layers}",
                list.len()
            )));
        }
        let want = if window.is_some() { KNOWN[1] } else { KNOWN[0] };
        match list.iter().enumerate().find(|(_, t)| **t != want) {
            None => Ok(()),
            Some((i, t)) if !KNOWN.contains(t) => Err(self.err(format!(
                "`layer_types[{i}]` is `{t}`: expected one of {KNOWN:?}"
            ))),
            Some((i, t)) => Err(self.err(format!(
                "`layer_types[{i}]` is `{t}`, but {}: every layer must be `{want}` (per-layer \
                 attention types are not supported)",
                match window {
                    Some(w) => format!("the config has a sliding window of {w} for every layer"),
                    None => "the config has no sliding window".to_string(),
                }
            ))),
        }
    }

    /// RoPE settings: transformers 4.x writes `rope_theta` and `rope_scaling` at the top level,
    /// transformers 5.x writes `rope_parameters = {rope_type, rope_theta, ...}`.
    fn rope(&mut self, architecture: Architecture) -> Result<(f64, RopeScaling)> {
        let top_theta = self.f64("rope_theta")?;
        let scaling = self.take("rope_scaling");
        let parameters = self.take("rope_parameters");
        let spec = match (scaling, parameters) {
            (Some(_), Some(_)) => {
                return Err(self.err("both `rope_scaling` and `rope_parameters` are set"));
            }
            (Some(v), None) | (None, Some(v)) => Some(v),
            (None, None) => None,
        };
        // transformers' defaults: `MixtralConfig` 1e6, the others 10000
        let default_theta = match architecture {
            Architecture::Mixtral => 1e6,
            _ => 10000.0,
        };
        let Some(spec) = spec else {
            return Ok((top_theta.unwrap_or(default_theta), RopeScaling::Default));
        };
        let Value::Object(mut p) = spec else {
            return Err(self.err(format!("`rope_parameters` must be an object, got {spec}")));
        };
        let file = self.file;
        let num = |p: &mut Map<String, Value>, key: &str| -> Result<f64> {
            p.remove(key).and_then(|v| v.as_f64()).ok_or_else(|| {
                Error::config(file, format!("rope parameters need a numeric `{key}`"))
            })
        };
        let theta = match p.remove("rope_theta").filter(|v| !v.is_null()) {
            None => top_theta.unwrap_or(default_theta),
            Some(v) => {
                let t = v.as_f64().ok_or_else(|| {
                    self.err(format!(
                        "`rope_theta` in the rope parameters must be a number, got {v}"
                    ))
                })?;
                if let Some(top) = top_theta
                    && top != t
                {
                    return Err(self.err(format!(
                        "`rope_theta` is {top} at the top level and {t} in the rope parameters: \
                         give one"
                    )));
                }
                t
            }
        };
        // transformers 4.x writes `type`, later versions `rope_type` (and a 4.x re-save both)
        let mut kind_of = |key: &str| -> Result<Option<String>> {
            match p.remove(key).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(Value::String(k)) => Ok(Some(k)),
                Some(v) => Err(Error::config(
                    file,
                    format!("`{key}` in the rope parameters must be a string, got {v}"),
                )),
            }
        };
        let kind = match (kind_of("rope_type")?, kind_of("type")?) {
            (Some(a), Some(b)) if a != b => {
                return Err(self.err(format!(
                    "the rope parameters say `rope_type` {a} and `type` {b}: give one"
                )));
            }
            (Some(k), _) | (None, Some(k)) => k,
            (None, None) => "default".into(),
        };
        let scaling = match kind.as_str() {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: num(&mut p, "factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: num(&mut p, "factor")?,
                low_freq_factor: num(&mut p, "low_freq_factor")?,
                high_freq_factor: num(&mut p, "high_freq_factor")?,
                original_max_position_embeddings: positive_integer(
                    file,
                    p.remove("original_max_position_embeddings"),
                    "original_max_position_embeddings",
                )?,
            },
            other => {
                return Err(self.err(format!(
                    "rope type `{other}` is not implemented (supported: default, linear, llama3)"
                )));
            }
        };
        if let Some(key) = p.keys().next() {
            return Err(self.err(format!(
                "unknown rope parameter `{key}` for rope type `{kind}`"
            )));
        }
        Ok((theta, scaling))
    }
}

/// A context length in the rope parameters: a JSON integer of 1 or more. transformers asks for an
/// integer too (`_validate_llama3_parameters`); a fraction or a negative number would otherwise be
/// cut to another length (16.7 to 16, -16 to 0) and give other frequencies than the file says.
fn positive_integer(file: &str, value: Option<Value>, key: &str) -> Result<usize> {
    let n = value.as_ref().and_then(Value::as_u64).filter(|&n| n > 0);
    n.and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
        let got = value.map_or("nothing".to_string(), |v| v.to_string());
        Error::config(
            file,
            format!("rope parameters need `{key}` as a positive integer, got {got}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2_LIKE: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05, "rope_theta": 100000, "rope_scaling": null, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16", "is_llama_config": true,
        "rope_interleaved": false, "pretraining_tp": 1, "attention_bias": false, "mlp_bias": false,
        "transformers_version": "4.42.3", "use_cache": true, "initializer_range": 0.02
    }"#;

    #[test]
    fn transformers_4_config() {
        let c = ModelConfig::from_hf_json(SMOLLM2_LIKE, "config.json").unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.rope_theta, 100000.0);
        assert_eq!(c.rope_scaling, RopeScaling::Default);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![2]);
        // SmolLM2-135M: 134.5M parameters.
        assert_eq!(c.parameter_count(), 134_515_008);
    }

    #[test]
    fn transformers_5_rope_parameters() {
        let text = SMOLLM2_LIKE
            .replace(r#""rope_theta": 100000, "rope_scaling": null,"#, "")
            .replace(
                r#""model_type": "llama","#,
                r#""model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},"#,
            );
        let c5 = ModelConfig::from_hf_json(&text, "config.json").unwrap();
        let c4 = ModelConfig::from_hf_json(SMOLLM2_LIKE, "config.json").unwrap();
        assert_eq!(c4, c5);
    }

    /// What transformers writes beside the math: bookkeeping fields, and a 4.x re-save of a
    /// `type`-style `rope_scaling` (both `type` and `rope_type`); rope values of the wrong type
    /// or two thetas that disagree are refused rather than read as defaults.
    #[test]
    fn transformers_bookkeeping_and_rope_value_checks() {
        let with = |from: &str, to: &str| {
            let text = SMOLLM2_LIKE.replace(from, to);
            assert_ne!(text, SMOLLM2_LIKE, "{from}");
            ModelConfig::from_hf_json(&text, "config.json")
        };
        let model_type = r#""model_type": "llama","#;
        let autoset = r#""model_type": "llama", "_attn_implementation_autoset": true,"#;
        assert!(with(model_type, autoset).is_ok());
        let scaling = r#""rope_scaling": null"#;
        let both = r#""rope_scaling": {"factor": 4.0, "rope_type": "linear", "type": "linear"}"#;
        let c = with(scaling, both).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        let differ = r#""rope_scaling": {"factor": 4.0, "rope_type": "linear", "type": "default"}"#;
        let e = with(scaling, differ).unwrap_err().to_string();
        assert!(e.contains("`rope_type` linear and `type` default"), "{e}");
        let numeric = r#""rope_scaling": {"rope_type": 3}"#;
        let e = with(scaling, numeric).unwrap_err().to_string();
        assert!(
            e.contains("`rope_type` in the rope parameters must be a string"),
            "{e}"
        );
        // a theta in the parameters: a number, and the top level's when both are given
        let theta =
            |t: &str| format!(r#""rope_scaling": {{"rope_type": "default", "rope_theta": {t}}}"#);
        assert_eq!(
            with(scaling, &theta("100000")).unwrap().rope_theta,
            100000.0
        );
        let e = with(scaling, &theta("500")).unwrap_err().to_string();
        assert!(
            e.contains("`rope_theta` is 100000 at the top level and 500"),
            "{e}"
        );
        let e = with(scaling, &theta("\"500\"")).unwrap_err().to_string();
        assert!(
            e.contains("`rope_theta` in the rope parameters must be a number"),
            "{e}"
        );
    }

    /// Fields a hand-written config leaves out take transformers' defaults for its architecture:
    /// `MistralConfig` (rope theta 10000, a 4096-token window unless null, 131072 positions, 8
    /// key/value heads), `MixtralConfig` (theta 1e6, eps 1e-5, no window, 8 key/value heads),
    /// `Qwen2Config` (32768 positions, 32 key/value heads); an explicit null head count is the
    /// query head count, as in transformers.
    #[test]
    fn absent_fields_take_the_architectures_defaults() {
        let bare = |model_type: &str, extra: &str| {
            let text = format!(
                r#"{{"model_type": "{model_type}", "vocab_size": 64, "hidden_size": 128,
                "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 64
                {extra}}}"#
            );
            ModelConfig::from_hf_json(&text, "config.json").unwrap()
        };
        let mistral = bare("mistral", "");
        assert_eq!(
            (
                mistral.rope_theta,
                mistral.sliding_window,
                mistral.max_position_embeddings
            ),
            (10000.0, Some(4096), 131072)
        );
        let kv_heads = |model_type: &str, extra: &str| {
            let extra = if model_type == "mixtral" {
                format!(r#"{extra}, "num_local_experts": 4, "num_experts_per_tok": 2"#)
            } else {
                extra.to_string()
            };
            bare(model_type, &extra).num_key_value_heads
        };
        for (model_type, default) in [("mistral", 8), ("mixtral", 8), ("qwen2", 32), ("llama", 64)]
        {
            assert_eq!(kv_heads(model_type, ""), default, "{model_type}");
            let null = r#", "num_key_value_heads": null"#;
            assert_eq!(kv_heads(model_type, null), 64, "{model_type}");
        }
        assert_eq!(
            bare("mistral", r#", "sliding_window": null"#).sliding_window,
            None
        );
        let mixtral = bare(
            "mixtral",
            r#", "num_local_experts": 4, "num_experts_per_tok": 2"#,
        );
        assert_eq!(
            (
                mixtral.rope_theta,
                mixtral.rms_norm_eps,
                mixtral.sliding_window
            ),
            (1e6, 1e-5, None)
        );
        assert_eq!(bare("qwen2", "").max_position_embeddings, 32768);
        let llama = bare("llama", "");
        assert_eq!(
            (llama.rope_theta, llama.max_position_embeddings),
            (10000.0, 2048)
        );
    }

    #[test]
    fn llama3_scaling() {
        let text = SMOLLM2_LIKE.replace(
            r#""rope_scaling": null"#,
            r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        );
        let c = ModelConfig::from_hf_json(&text, "config.json").unwrap();
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Llama3 { factor: 8.0, .. }
        ));
    }

    #[test]
    fn rejections_name_the_problem() {
        let cases = [
            (
                SMOLLM2_LIKE.replace("\"llama\"", "\"gpt2\""),
                "unsupported model_type `gpt2`",
            ),
            (
                SMOLLM2_LIKE.replace("\"use_cache\": true", "\"magic\": 3"),
                "unknown field `magic`",
            ),
            (
                SMOLLM2_LIKE.replace(
                    r#""rope_scaling": null"#,
                    r#""rope_scaling": {"type": "yarn", "factor": 4.0}"#,
                ),
                "rope type `yarn` is not implemented",
            ),
            (
                SMOLLM2_LIKE.replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4"),
                "not a multiple",
            ),
            (
                SMOLLM2_LIKE.replace("\"silu\"", "\"gelu\""),
                "hidden_act `gelu`",
            ),
            (SMOLLM2_LIKE[..40].to_string(), "not valid JSON"),
            (
                SMOLLM2_LIKE.replace(
                    "\"max_position_embeddings\": 8192",
                    "\"max_position_embeddings\": 1099511627776",
                ),
                "is more than the 4294967296 positions",
            ),
            (
                SMOLLM2_LIKE
                    .replace(
                        "\"num_attention_heads\": 9",
                        "\"num_attention_heads\": 4294967296",
                    )
                    .replace(
                        "\"num_key_value_heads\": 3",
                        "\"num_key_value_heads\": 4294967296",
                    )
                    .replace(
                        "\"hidden_size\": 576",
                        "\"hidden_size\": 576, \"head_dim\": 4294967296",
                    ),
                "x head_dim (4294967296) overflows",
            ),
            (
                SMOLLM2_LIKE.replace("\"vocab_size\": 49152,", ""),
                "missing required field `vocab_size`",
            ),
            // settings that would load and give NaN logits
            (
                SMOLLM2_LIKE.replace("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1e-05"),
                "`rms_norm_eps` is -0.00001: it must be a finite number 0 or more",
            ),
            (
                SMOLLM2_LIKE.replace("\"rope_theta\": 100000", "\"rope_theta\": 0"),
                "`rope_theta` is 0: it must be a finite number more than 0",
            ),
            (
                SMOLLM2_LIKE.replace("\"rope_theta\": 100000", "\"rope_theta\": -10000"),
                "`rope_theta` is -10000",
            ),
            (
                SMOLLM2_LIKE.replace(
                    r#""rope_scaling": null"#,
                    r#""rope_scaling": {"type": "linear", "factor": 0}"#,
                ),
                "the rope scaling `factor` is 0",
            ),
            (
                SMOLLM2_LIKE.replace("\"eos_token_id\": 2", "\"eos_token_id\": 4294967298"),
                "`eos_token_id` must be a token id",
            ),
            (
                SMOLLM2_LIKE.replace("\"eos_token_id\": 2", "\"eos_token_id\": [2, 4294967296]"),
                "`eos_token_id` must hold token ids",
            ),
        ];
        for (text, want) in cases {
            let err = ModelConfig::from_hf_json(&text, "dir/config.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(err.starts_with("dir/config.json"), "{err}");
        }
    }
}
