//! # m2r2 ONNX runner
//!
//! Runs the graphs written by `m2r2 export` (model.onnx, draft.onnx, verifier.onnx; the folder
//! contract is docs/ONNX.md) with ONNX Runtime through the `ort` crate, on the CPU, CUDA or TensorRT
//! execution provider, and decodes exactly like the reference: greedy over model.onnx
//! ([`greedy::OnnxModel`]), and self-speculative decoding through the reference's own loop
//! ([`reference::decode::speculative::speculative_generate`]) over draft.onnx / verifier.onnx
//! ([`speculation::OnnxSpeculation`]).
//!
//! - [`runtime`]: find, provision ([`provision`]) and load libonnxruntime (once per process).
//! - [`ep`]: which execution provider, registered fail-fast.
//! - [`session`]: one graph, inputs checked by name, dtype and rank ([`tensor_info`]: what its
//!   inputs and outputs are).
//! - [`decode`]: one decode of an export, greedy or speculative, reported as the reference's modes
//!   report (what `m2r2 run` drives).
//! - [`manifest`]: the export folder; [`kv`]: the KV cache of one graph, on the host
//!   ([`kv_store`]) or in ONNX Runtime values ([`device_kv`]); [`static_kv`]: the fixed buffers of a
//!   static export (`export --static-cache`), written in place.
//!
//! Dimension legend as in the reference: `V` vocab, `D` hidden, `Hkv` key/value heads, `Dh` head
//! dim, `T` rows fed in one run, `S` cached positions.

pub mod decode;
pub mod device_kv;
pub mod ep;
pub mod error;
pub mod greedy;
pub mod kv;
pub mod kv_store;
pub mod manifest;
pub mod provision;
pub mod runtime;
pub mod session;
pub mod spec_cache;
pub mod speculation;
pub mod static_kv;
pub mod step;
pub mod step_binding;
pub mod tensor_info;
pub mod tree_mask;

pub use error::{Error, Result};
