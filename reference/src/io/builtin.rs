//! Built-in models that need no download: random weights from a fixed seed, so every command and
//! test runs on a fresh machine. `tiny` is a dense Llama-like model with grouped-query attention,
//! `tiny-moe` a Mixtral-like model with 8 experts, top-2. They exercise every code path; their text
//! is noise.

use crate::base::config::{Architecture, ModelConfig, MoeConfig, RopeScaling};
use crate::base::model::Model;
use crate::base::weight_names::WeightId;
use crate::base::weights::{MemorySource, RawTensor, Weights};
use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Names accepted by [`builtin`].
pub const BUILTIN_NAMES: [&str; 2] = ["tiny", "tiny-moe"];

/// The seed every built-in model is generated from.
pub const BUILTIN_SEED: u64 = 0x6d32_7232; // "m2r2"

/// Vocabulary of the built-in models: 256 byte tokens, a few special tokens, padding.
pub const BUILTIN_VOCAB: usize = 320;

/// `tiny`: dense, Llama-like, GQA (4 query heads over 2 key/value heads), tied embeddings.
pub fn tiny_config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: BUILTIN_VOCAB,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 8,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        max_position_embeddings: 512,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::Default,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        tie_word_embeddings: true,
        sliding_window: None,
        moe: None,
        bos_token_id: None,
        eos_token_ids: vec![],
    }
}

/// `tiny-moe`: Mixtral-like, 8 experts, top-2, untied head.
pub fn tiny_moe_config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Mixtral,
        intermediate_size: 96,
        tie_word_embeddings: false,
        moe: Some(MoeConfig {
            num_local_experts: 8,
            num_experts_per_tok: 2,
        }),
        ..tiny_config()
    }
}

/// The built-in model called `name`.
pub fn builtin(name: &str) -> Result<Model> {
    let config = match name {
        "tiny" => tiny_config(),
        "tiny-moe" => tiny_moe_config(),
        _ => {
            return Err(Error::Invalid(format!(
                "unknown built-in model `{name}` (built-in: {})",
                BUILTIN_NAMES.join(", ")
            )));
        }
    };
    random_model(config, BUILTIN_SEED)
}

/// A model of `config` with the random weights of [`random_source`] drawn from `seed`.
pub fn random_model(config: ModelConfig, seed: u64) -> Result<Model> {
    let weights = Weights::load(&config, &random_source(&config, seed))?;
    Ok(Model::new(config, weights))
}

/// Random tensors for every weight of `config`, drawn in checkpoint order from one seeded stream:
/// norms `1 + 0.1 N(0,1)`, embeddings `N(0,1)`, biases `0.1 N(0,1)`, other matrices
/// `N(0,1) / sqrt(fan_in)`, routers `2 N(0,1) / sqrt(D)` (so routing is decisive).
pub fn random_source(config: &ModelConfig, seed: u64) -> MemorySource {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut src = MemorySource {
        label: format!("<random weights, seed {seed}>"),
        ..Default::default()
    };
    for id in WeightId::all(config) {
        let shape = id.shape(config);
        let n: usize = shape.iter().product();
        let (mean, std) = match id {
            WeightId::FinalNorm | WeightId::AttnNorm(_) | WeightId::MlpNorm(_) => (1.0, 0.1),
            WeightId::Embed => (0.0, 1.0),
            WeightId::AttnBias(..) | WeightId::MlpBias(..) => (0.0, 0.1),
            WeightId::Router(_) => (0.0, 2.0 / (shape[1] as f32).sqrt()),
            _ => (0.0, 1.0 / (shape[1] as f32).sqrt()),
        };
        let data = (0..n)
            .map(|_| mean + std * standard_normal(&mut rng))
            .collect();
        src.tensors.insert(id.hf_name(), RawTensor { shape, data });
    }
    src
}

/// One draw from N(0, 1) by the Box-Muller transform (kept here so the values never change with a
/// distribution crate's version).
pub fn standard_normal(rng: &mut impl Rng) -> f32 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_deterministic_and_valid() {
        for name in BUILTIN_NAMES {
            let a = builtin(name).unwrap();
            let b = builtin(name).unwrap();
            a.config.validate(name).unwrap();
            assert_eq!(a.weights.embed, b.weights.embed);
            assert!(a.weights.embed.iter().all(|v| v.is_finite()));
        }
    }

    #[test]
    fn unknown_name_is_a_clear_error() {
        let err = builtin("huge").unwrap_err().to_string();
        assert!(
            err.contains("unknown built-in model `huge`") && err.contains("tiny-moe"),
            "{err}"
        );
    }

    #[test]
    fn normal_draws_have_unit_moments() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let xs: Vec<f32> = (0..20000).map(|_| standard_normal(&mut rng)).collect();
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / xs.len() as f32;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "mean {mean} var {var}"
        );
    }
}
