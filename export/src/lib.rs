//! # m2r2-export
//!
//! Turns a base model with its M2R2 weights into ONNX graphs that ONNX Runtime (and TensorRT)
//! deployments run (spec section 8; docs/ONNX.md): `model.onnx` (the base model, Optimum /
//! onnxruntime-genai I/O), `draft.onnx` (layers `0..e_{g_d}`, slow and fast rows, draft logits,
//! ARLA exit probability, the hidden state for the verifier) and `verifier.onnx` (layers
//! `e_{g_d}..N` from that hidden state). The reference crate is the oracle for every graph.
//!
//! Layout: [`proto`] (generated protobuf types, apart), [`builder`] (a small graph builder),
//! [`emit`] (one emitter per reference module, same file names), [`graphs`] (the three graphs and
//! their interfaces), [`write`] (protobuf files, external data), [`folder`] (the export folder:
//! manifest, onnxruntime-genai config, tokenizer files), [`static_graph`] (`model.onnx` with a
//! fixed KV buffer updated in place, `--static-cache`), [`summary`] (per-graph statistics), [`check`] (the graphs under ONNX Runtime against the
//! reference).

pub mod builder;
pub mod check;
pub mod emit;
pub mod error;
pub mod folder;
pub mod graphs;
pub mod proto;
pub mod static_graph;
pub mod summary;
pub mod write;

pub use error::{Error, Result};
