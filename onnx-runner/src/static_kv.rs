//! The KV cache of a static export (`m2r2 export --static-cache L`): one key and one value buffer
//! per layer, `[1, Hkv, L, Dh]`, allocated once where the provider computes (ONNX Runtime's CPU
//! allocator, or the GPU's memory for CUDA / TensorRT) and zeroed, then bound with IoBinding as
//! both the layer's `past_key_values.{i}.*` input and its `present.{i}.*` output. The graph's
//! `TensorScatter` writes the step's rows into the buffer it was given, so ONNX Runtime updates
//! the cache in place: no per-step copy of the cache and the same addresses every step (without
//! the output binding ONNX Runtime warns "in-place optimization not activated, copying past_cache
//! to present_cache" and copies every buffer each step).
//!
//! Per step the runner feeds `input_ids`, `position_ids`, `write_indices` (the first row's
//! position) and `attn_mask`, additive `[1, 1, T, L]`: row `t` at position `p` sees keys `0..=p`
//! (the last `sliding_window` of them when the config has one), every other key gets
//! [`HIDDEN`]. Positions past the filled ones hold zeros or stale rows of a rolled-back draft and
//! are always hidden, so rollback only moves the length, as in llama2.c.
//!
//! The one-row decode step runs through a [`StepBinding`] created on its first use: its inputs,
//! `logits` and the buffers bound once, each step writing its values into the bound inputs
//! (prefills, `T > 1`, bind per run).
//!
//! With [`StaticKv::enable_cuda_graph`] (the CUDA provider's `enable_cuda_graph`), the one-row
//! decode step runs as a CUDA graph: its inputs and `logits` live in device buffers allocated
//! once and bound once (ONNX Runtime replays a graph on the addresses it captured), each step
//! copies the new ids, position, write index and mask row into those buffers, and the run says
//! `gpu_graph_id` = 1 (ONNX Runtime runs it normally until its warm-up count is reached, one or two
//! runs by version and possibly inside the first call, then captures it and replays it from then
//! on). Every other run (the prefill, `T > 1`) says `gpu_graph_id` = -1: not
//! captured.
//!
//! # Shapes
//! - buffers: `[1, Hkv, L, Dh]` per layer; the first `len` positions are the cache.
//! - decode step on the graph: `input_ids`, `position_ids` `[1, 1]`, `write_indices` `[1]`,
//!   `attn_mask` `[1, 1, 1, L]`, `logits` `[1, 1, V]`.
//!
//! The parts, one concept each: `static_kv/mask.rs` the additive masks, `static_kv/cuda_graph.rs`
//! the one-row decode step as a CUDA graph, `static_kv/run.rs` the runs on the buffers bound in
//! place, `static_kv/copies.rs` the buffers' rows copied to the host and compacted.

use crate::error::{Error, Result};
use crate::kv_store::{past_names, present_names};
use crate::session::{Dim, OnnxSession};
use crate::step_binding::StepBinding;
use ndarray::Array4;
use ort::value::{DynTensor, Tensor};
use reference::ModelConfig;

mod copies;
mod cuda_graph;
mod mask;
mod run;

use cuda_graph::GraphStep;
pub use cuda_graph::{DECODE_GRAPH_ID, GraphRuns, NO_GRAPH_ID};
pub use mask::{HIDDEN, attn_mask, fast_attn_mask};

/// The graph inputs a static model.onnx takes besides ids, positions and the buffers.
pub const ATTN_MASK: &str = "attn_mask";
pub const WRITE_INDICES: &str = "write_indices";
/// A static draft.onnx's mask of its fast rows ([`fast_attn_mask`]).
pub const FAST_ATTN_MASK: &str = "fast_attn_mask";

/// The fixed buffers of every layer of one graph.
pub struct StaticKv {
    l_max: usize,
    kv_heads: usize,
    head_dim: usize,
    sliding_window: Option<usize>,
    past: Vec<(String, String)>,
    present: Vec<(String, String)>,
    /// (key, value) per layer, `[1, Hkv, L, Dh]`, allocated once
    buffers: Vec<(DynTensor, DynTensor)>,
    /// Positions filled.
    len: usize,
    /// The decode step as a CUDA graph, when enabled (boxed: most caches have none).
    graph: Option<Box<GraphStep>>,
    /// The one-row decode step bound once, without a CUDA graph (created on first use).
    step: Option<Box<StepBinding>>,
}

impl StaticKv {
    /// Zeroed buffers for every layer of the model, allocated where `session` computes; its past
    /// inputs must be `[.., L, ..]` with `L = l_max` (the manifest's `static_cache.l_max`), see
    /// [`StaticKv::check_graph`]. The graphs that share the buffers (draft, verifier and feed)
    /// each hold some of the layers.
    pub fn new(session: &OnnxSession, config: &ModelConfig, l_max: usize) -> Result<Self> {
        let layers = config.num_hidden_layers;
        let (kv_heads, head_dim) = (config.num_key_value_heads, config.head_dim);
        Self::check_graph(session, l_max)?;
        let file = session.file().to_string();
        let err = |e: ort::Error| Error::ort(&file, format!("cannot allocate the KV buffers: {e}"));
        let allocator = session.allocator().map_err(err)?;
        let shape = [1, kv_heads, l_max, head_dim];
        let zeros = Tensor::from_array(Array4::<f32>::zeros(shape)).map_err(err)?;
        let buffer = || -> Result<DynTensor> {
            let mut t = Tensor::<f32>::new(&allocator, shape).map_err(err)?;
            // Uninitialised memory could hold NaN, which a hidden key's zero weight would not
            // cancel (0 * NaN): every buffer starts as zeros.
            if t.memory_info().is_cpu_accessible() {
                t.extract_tensor_mut().1.fill(0.0);
            } else {
                zeros.copy_into(&mut t).map_err(err)?;
            }
            Ok(t.upcast())
        };
        let buffers = (0..layers)
            .map(|_| Ok((buffer()?, buffer()?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(StaticKv {
            l_max,
            kv_heads,
            head_dim,
            sliding_window: config.sliding_window,
            past: (0..layers).map(past_names).collect(),
            present: (0..layers).map(present_names).collect(),
            buffers,
            len: 0,
            graph: None,
            step: None,
        })
    }

    /// `session` is a static graph for buffers of `l_max` positions: its past inputs are
    /// `[.., L, ..]` and it takes `attn_mask` and `write_indices`.
    pub fn check_graph(session: &OnnxSession, l_max: usize) -> Result<()> {
        let file = session.file().to_string();
        let first_past = session
            .inputs()
            .iter()
            .find(|i| i.name.starts_with("past_key_values."));
        let fixed = first_past.and_then(|i| i.dims.get(2)).cloned();
        if fixed != Some(Dim::Fixed(l_max)) {
            let name = first_past.map_or("past_key_values.*", |i| i.name.as_str());
            let positions = match fixed {
                Some(dim) => format!("`{dim}` positions"),
                None => "no positions axis".into(),
            };
            return Err(Error::Export {
                file,
                msg: format!(
                    "m2r2_export.json says static_cache.l_max = {l_max}, but the graph's `{name}` \
                     has {positions} (the manifest and the graph disagree: export the \
                     folder again)"
                ),
            });
        }
        for name in [ATTN_MASK, WRITE_INDICES] {
            if !session.inputs().iter().any(|i| i.name == name) {
                return Err(Error::Export {
                    file,
                    msg: format!(
                        "m2r2_export.json says this graph is static, but it has no `{name}` \
                         input (export the folder again)"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `L`, the positions each buffer holds.
    pub fn l_max(&self) -> usize {
        self.l_max
    }

    /// Forget every position from `len` on (they stay in the buffers, hidden by the mask).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// `rows` more positions fit in the buffers, else [`Error::StaticCacheFull`] naming `file`.
    pub fn check_room(&self, file: &str, rows: usize) -> Result<()> {
        self.check_fits(file, self.len, rows)
    }

    /// `rows` positions from `pos` on fit in the buffers, else [`Error::StaticCacheFull`].
    pub fn check_fits(&self, file: &str, pos: usize, rows: usize) -> Result<()> {
        let needed = pos + rows;
        if needed > self.l_max {
            return Err(Error::StaticCacheFull {
                file: file.to_string(),
                l_max: self.l_max,
                needed,
            });
        }
        Ok(())
    }

    /// The masks' sliding window (the config's).
    pub fn sliding_window(&self) -> Option<usize> {
        self.sliding_window
    }
}

#[cfg(test)]
mod tests;
