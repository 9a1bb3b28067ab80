//! # m2r2-export
//!
//! Turns a base model with its M2R2 weights into ONNX graphs that ONNX Runtime (and TensorRT)
//! deployments run (docs/ONNX.md; checked against the reference, docs/EQUIVALENCE.md):
//! `model.onnx` (the base model, Optimum / onnxruntime-genai I/O), `draft.onnx` (layers
//! `0..e_{g_d}`, slow and fast rows, draft logits, ARLA exit probability, the hidden state for the
//! verifier), `verifier.onnx` (layers `e_{g_d}..N` from that hidden state) and `feed.onnx` (the
//! draft layers' slow stream alone). The reference crate is the oracle for every graph.
//!
//! Layout: [`proto`] (generated protobuf types, apart), [`builder`] (a small graph builder),
//! [`emit`] (one emitter per reference module, same file names), [`graphs`] (the four graphs and
//! their interfaces), [`static_graph`] (the same four with fixed KV buffers written in place,
//! `--static-cache`, docs/STATIC.md), [`write`](mod@write) (protobuf files, external data), [`folder`] (the
//! export folder: manifest, onnxruntime-genai config, tokenizer files; [`stale`]: what stopped
//! exports left), [`summary`] (per-graph
//! statistics), [`check`] (the graphs under ONNX Runtime against the reference).

pub mod builder;
pub mod check;
pub mod emit;
pub mod error;
pub mod folder;
pub mod graphs;
pub mod proto;
pub mod stale;
pub mod static_graph;
pub mod summary;
pub mod write;

pub use error::{Error, Result};
