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
//!
//! # The teaching core
//!
//! One token through the base model and M2R2, read in this order. Each `*_naive` file is the
//! method's equations for one token of one sequence (no chunks, threads, SIMD or work counting);
//! its fast twin beside it is what the decoding modes run, and a test next to the naive code checks
//! that the two agree: bit for bit for the numbers (logits, hidden states, KV cache, exit states,
//! ARLA and gate scores), token for token for the decoders.
//!
//! |  # | the equations                                       | the fast twin                       |
//! |----|-----------------------------------------------------|-------------------------------------|
//! |  1 | `base/config.rs`, `base/weights.rs` (shapes)        | (loaded and checked once)           |
//! |  2 | `base/matmul.rs`: `dot`, `linear_naive`             | `linear` (SIMD tiles, threads)      |
//! |  3 | `base/ops.rs`, `base/rope.rs`, `base/kv_cache.rs`   |                                     |
//! |  4 | `base/attention.rs`: `attend_naive`                 | `attend`                            |
//! |  5 | `base/layer_naive.rs`: one decoder layer            | `base/layer.rs` (chunks, fast rows) |
//! |  6 | `base/model_naive.rs`: embed, N layers, head        | `base/model.rs`                     |
//! |  7 | `m2r2/accelerator.rs`, `m2r2/fast_stream_naive.rs`  | `m2r2/fast_stream.rs`               |
//! |  8 | `m2r2/arla.rs`: `exit_prob_naive`; `exit_gate.rs`   | `exit_prob`                         |
//! |  9 | `decode/early_exit_naive.rs`                        | `decode/early_exit.rs`              |
//! | 10 | `decode/speculative_naive.rs`                       | `speculative.rs`, `draft_verify.rs` |
//! | 11 | `m2r2/cost.rs`: the cost model (predicted work)     | `base/layer_work.rs` (counted work) |
//!
//! Around the core, not inside it: loaders (`io`), the SIMD kernels (`base/matmul/`), batching
//! (`base/batch.rs`), the bridge and the draft head (`m2r2/bridge.rs`, `m2r2/draft_head.rs`), and
//! tooling (`golden`, `analyze`, `moe_aot`).

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
