//! The base model: M2R2's slow residual stream, exactly HF's Llama / Mistral / Qwen2 / Mixtral in f32
//! (docs/m2r2/streams.md). Nothing here knows about M2R2, decoding modes or files.

pub mod attention;
pub mod bandwidth;
pub mod batch;
pub mod config;
pub mod generate;
pub mod kv_cache;
pub mod layer;
pub mod layer_naive;
pub mod layer_work;
pub mod matmul;
pub mod mlp;
pub mod model;
pub mod model_naive;
pub mod moe;
pub mod ops;
pub mod rope;
pub mod sampling;
pub mod tree;
pub mod weight_names;
pub mod weights;
pub mod work;
