//! # m2r2 reference
//!
//! A clean, minimal, readable CPU reference of M2R2 (Mixture of Multi-Rate Residuals, arXiv
//! 2502.02040) on `ndarray`: the correctness oracle that the ONNX graphs and runtimes are checked
//! against. f32 and batch invariant (a row's result never depends on which other rows are
//! computed with it).
//!
//! Dimension legend (used in every `# Shapes` section): `V` vocab, `D` hidden, `I` intermediate,
//! `N` layers, `H` query heads, `Hkv` key/value heads, `Dh` head dim, `E` experts, `k` experts per
//! token, `T` rows (positions) in a chunk, `S` positions in the KV cache.

//! Reading order: `base` is the exact HF base model (M2R2's slow stream) and needs nothing else;
//! `io` reads checkpoints, GGUF and tokenizers into it; `m2r2` adds the method (fast stream,
//! accelerator adapters, ARLA, exit gates, draft head, cost model); `decode` runs the decoding modes
//! (greedy, early exit, self-speculation) on both; `golden`, `analyze` and `moe_aot` use all of it.
//! A folder imports only from folders before it (`tests/tests/layering.rs` checks this).

pub mod error;

// The exact HF base model: M2R2's slow stream.
pub mod base;

// Reading models in: HF folders and configs, GGUF, tokenizers, built-in models, downloads.
pub mod io;

// The method: fast stream, accelerator adapters, ARLA, exit gates, draft head, cost model.
pub mod m2r2;

// The decoding modes: greedy, early exit, self-speculation, and the dispatcher.
pub mod decode;

// Golden files: recording and checking decodes.
pub mod golden;

// Where the fast stream's exit states sit relative to the slow stream's (`m2r2 analyze`).
pub mod analyze;

// Ahead-of-time MoE expert loading: prediction, memory simulation, sweeps.
pub mod moe_aot;

pub use base::config::ModelConfig;
pub use base::kv_cache::KvCache;
pub use base::model::Model;
pub use error::{Error, Result};
