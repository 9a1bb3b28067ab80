//! # m2r2 reference
//!
//! A clean, minimal, readable CPU reference of M2R2 (Mixture of Multi-Rate Residuals, arXiv
//! 2502.02040) on `ndarray`: the correctness oracle that the ONNX graphs and runtimes are checked
//! against. f32, one sequence, batch invariant (a row's result never depends on which other rows are
//! computed with it).
//!
//! Dimension legend (used in every `# Shapes` section): `V` vocab, `D` hidden, `I` intermediate,
//! `N` layers, `H` query heads, `Hkv` key/value heads, `Dh` head dim, `E` experts, `k` experts per
//! token, `T` rows (positions) in a chunk, `S` positions in the KV cache.

pub mod accelerator;
pub mod analyze;
pub mod arla;
pub mod attention;
pub mod builtin;
pub mod checkpoint;
pub mod config;
pub mod cost;
pub mod draft_head;
pub mod draft_verify;
pub mod early_exit;
pub mod error;
pub mod exit_gate;
pub mod expert_prefetch;
pub mod fast_stream;
pub mod generate;
pub mod gguf;
pub mod golden;
pub mod hub;
pub mod kv_cache;
pub mod layer;
pub mod load;
pub mod m2r2_config;
pub mod m2r2_weights;
pub mod matmul;
pub mod memory_sim;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod moe_sweep;
pub mod ops;
pub mod rope;
pub mod sampling;
pub mod shipped;
pub mod speculative;
pub mod tokenizer;
pub mod weight_names;
pub mod weights;
pub mod wheel;

pub use config::ModelConfig;
pub use error::{Error, Result};
pub use kv_cache::KvCache;
pub use model::Model;
