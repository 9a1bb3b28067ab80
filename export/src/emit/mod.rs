//! One emitter per reference module, with the same file name: each writes into a
//! [`GraphBuilder`](crate::builder::GraphBuilder) the ONNX nodes that compute what the reference
//! function of the same name computes, so a graph can be read next to the reference line by line.
//!
//! Tensors inside the graphs keep a batch axis in front: `[B, T, D]` where the reference has
//! `[T, D]`; rows never mix across the batch.

pub mod accelerator;
pub mod arla;
pub mod attention;
pub mod bridge;
pub mod fast_stream;
pub mod layer;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod ops;
pub mod rope;
pub mod stacked_draft;
pub mod static_draft;
pub mod static_layer;
