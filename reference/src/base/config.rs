//! The base model's configuration: what the reference needs to know about a base model. The loaders
//! build it from a Hugging Face `config.json` (`io::hf_config`), GGUF metadata (`io::gguf`) or the
//! built-in generators (`io::builtin`).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Which HF class the weights and semantics follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// `LlamaForCausalLM`
    Llama,
    /// `MistralForCausalLM` (Llama plus an optional sliding window)
    Mistral,
    /// `Qwen2ForCausalLM` (Llama plus q/k/v biases)
    Qwen2,
    /// `MixtralForCausalLM` (Mistral attention, sparse MoE feed-forward)
    Mixtral,
}

impl Architecture {
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        Some(match model_type {
            "llama" => Architecture::Llama,
            "mistral" => Architecture::Mistral,
            "qwen2" => Architecture::Qwen2,
            "mixtral" => Architecture::Mixtral,
            _ => return None,
        })
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Mixtral => "mixtral",
        }
    }
}

/// RoPE frequency scaling (HF `rope_scaling` / `rope_parameters.rope_type`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq_i = theta^(-2i/d)`.
    Default,
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1 wavelength-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// Sparse mixture-of-experts feed-forward (Mixtral).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// E: experts per layer
    pub num_local_experts: usize,
    /// k: experts used per token
    pub num_experts_per_tok: usize,
}

/// Everything the reference needs to know about a base model. Dimension legend used in shape comments
/// across the crate: `V` vocab, `D` hidden, `I` intermediate, `H` query heads, `Hkv` key/value heads,
/// `Dh` head dim, `E` experts, `T` positions in a chunk, `S` cached positions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// V
    pub vocab_size: usize,
    /// D
    pub hidden_size: usize,
    /// I
    pub intermediate_size: usize,
    /// N
    pub num_hidden_layers: usize,
    /// H
    pub num_attention_heads: usize,
    /// Hkv (H must be a multiple of Hkv: grouped-query attention)
    pub num_key_value_heads: usize,
    /// Dh (HF default: D / H)
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Biases on q, k, v projections (Qwen2, Llama `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama `attention_bias` only).
    pub o_bias: bool,
    /// Biases on gate/up/down (Llama `mlp_bias`).
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    /// Attend only to the last `w` positions (Mistral / Mixtral / Qwen2 with `use_sliding_window`).
    pub sliding_window: Option<usize>,
    /// `Some` for Mixtral: every layer is a sparse MoE block.
    pub moe: Option<MoeConfig>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// The longest context a config may declare: 2^32 positions (the longest in use are about 10^7).
/// Capacities are sums of the context, a request's tokens and a draft length; this keeps them
/// far from overflowing (a file may claim any size; nothing is sized by a claim alone).
pub const MAX_CONTEXT: usize = 1 << 32;

/// Refuse a float setting that the model's arithmetic cannot use: an RMSNorm epsilon below 0, a
/// RoPE base or scaling factor of 0 or below, or any of them NaN or infinite, would turn every
/// logit NaN (or every hidden state 0) while the model still loads. `what` names the setting as
/// the file does (`` `rms_norm_eps` ``, `` `llama.rope.freq_base` ``, ...); `zero_ok` admits 0.
pub fn check_float(file: &str, what: &str, value: f64, zero_ok: bool) -> Result<()> {
    if value.is_finite() && (value > 0.0 || zero_ok && value == 0.0) {
        return Ok(());
    }
    let want = if zero_ok { "0 or more" } else { "more than 0" };
    Err(Error::config(
        file,
        format!("{what} is {value}: it must be a finite number {want}"),
    ))
}

/// Refuse llama3 RoPE settings its formula cannot use (`rope.rs`, HF
/// `_compute_llama3_parameters`): it divides the original context by `low_freq_factor` and by
/// `high_freq_factor` to get the band edges and by `high_freq_factor - low_freq_factor` to
/// interpolate between them, so both must be finite and positive and high more than low (the
/// ordering transformers' `_validate_llama3_parameters` asks for); a context of 0 puts every
/// frequency in the long-wavelength band.
fn check_llama3(file: &str, low: f64, high: f64, original_context: usize) -> Result<()> {
    check_float(file, "the rope scaling `low_freq_factor`", low, false)?;
    check_float(file, "the rope scaling `high_freq_factor`", high, false)?;
    if high <= low {
        return Err(Error::config(
            file,
            format!(
                "the rope scaling `high_freq_factor` ({high}) must be more than `low_freq_factor` \
                 ({low}): the llama3 formula divides by their difference"
            ),
        ));
    }
    if original_context == 0 {
        return Err(Error::config(
            file,
            "the rope scaling `original_max_position_embeddings` is 0: it must be positive",
        ));
    }
    Ok(())
}

/// [`ModelConfig::hash`] of a config serialised as `json`: taken over the text as it is, so a
/// golden's stored `config` can be checked against its recorded hash without serialising it again
/// (another writer's JSON, Python's, would not reproduce the bytes).
pub fn hash_of_json(json: &str) -> String {
    let digest = Sha256::digest(json.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl ModelConfig {
    /// Query dim `H * Dh`.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Key/value dim `Hkv * Dh`.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Reject configs whose numbers cannot describe a model (zero sizes, a window of 0, heads that
    /// do not divide, an epsilon or RoPE setting that makes the logits NaN: [`check_float`],
    /// `check_llama3`).
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::config(file, msg));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        if let Some(moe) = &self.moe
            && (moe.num_experts_per_tok == 0 || moe.num_experts_per_tok > moe.num_local_experts)
        {
            return bad(format!(
                "num_experts_per_tok ({}) must be in 1..={} (num_local_experts)",
                moe.num_experts_per_tok, moe.num_local_experts
            ));
        }
        if self.vocab_size > u32::MAX as usize {
            return bad("vocab_size does not fit token ids of 32 bits".into());
        }
        // Sizes are products and sums of these, and a file may claim anything: bound them.
        if self
            .num_attention_heads
            .checked_mul(self.head_dim)
            .is_none()
        {
            return bad(format!(
                "num_attention_heads ({}) x head_dim ({}) overflows",
                self.num_attention_heads, self.head_dim
            ));
        }
        if self.max_position_embeddings > MAX_CONTEXT {
            return bad(format!(
                "max_position_embeddings ({}) is more than the {MAX_CONTEXT} positions m2r2 supports",
                self.max_position_embeddings
            ));
        }
        check_float(file, "`rms_norm_eps`", self.rms_norm_eps, true)?;
        check_float(file, "`rope_theta`", self.rope_theta, false)?;
        if let RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. } =
            self.rope_scaling
        {
            check_float(file, "the rope scaling `factor`", factor, false)?;
        }
        if let RopeScaling::Llama3 {
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
            ..
        } = self.rope_scaling
        {
            check_llama3(
                file,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            )?;
        }
        // a window of 0 would hide every key, the query's own included: no attention at all
        if self.sliding_window == Some(0) {
            return bad(
                "`sliding_window` is 0: it must be positive (or null for no window)".into(),
            );
        }
        Ok(())
    }

    /// A short stable identity of the config: the first 16 hex digits of SHA-256 over its canonical
    /// JSON. Goldens record it so that a check against a different model is refused.
    pub fn hash(&self) -> String {
        hash_of_json(&serde_json::to_string(self).expect("config serialises"))
    }

    /// Parameters of the base model (embedding and head counted once when tied).
    pub fn parameter_count(&self) -> usize {
        let (d, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let attn = d * self.q_dim() * 2 + d * self.kv_dim() * 2;
        let attn_bias = if self.qkv_bias {
            self.q_dim() + 2 * self.kv_dim()
        } else {
            0
        } + if self.o_bias { d } else { 0 };
        let mlp = 3 * d * i + if self.mlp_bias { 2 * i + d } else { 0 };
        let ffn = match &self.moe {
            None => mlp,
            Some(moe) => moe.num_local_experts * mlp + moe.num_local_experts * d,
        };
        let per_layer = attn + attn_bias + ffn + 2 * d;
        let head = if self.tie_word_embeddings { 0 } else { v * d };
        v * d + self.num_hidden_layers * per_layer + d + head
    }
}
