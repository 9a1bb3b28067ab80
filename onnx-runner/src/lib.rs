//! # m2r2 ONNX runner
//!
//! Runs the graphs written by `m2r2 export` (model.onnx, draft.onnx, verifier.onnx; the folder
//! contract is docs/ONNX.md) with ONNX Runtime through the `ort` crate, on the CPU, CUDA or TensorRT
//! execution provider, and decodes exactly like the reference: greedy over model.onnx, and
//! self-speculative decoding through the reference's own loop
//! ([`reference::speculative::speculative_generate`]) over draft.onnx / verifier.onnx.
//!
//! - [`runtime`]: find, provision and load libonnxruntime (once per process).
//! - [`ep`]: which execution provider, registered fail-fast.
//! - [`session`]: one graph, inputs checked by name, dtype and rank.

pub mod ep;
pub mod error;
pub mod provision;
pub mod runtime;
pub mod session;

pub use error::{Error, Result};
