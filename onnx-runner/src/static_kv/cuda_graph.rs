//! The one-row decode step of a [`StaticKv`] as a CUDA graph: its device buffers bound once, the
//! `gpu_graph_id` of each run, and the counts of the runs ([`GraphRuns`]).

use super::{ATTN_MASK, StaticKv, WRITE_INDICES, attn_mask};
use crate::error::{Error, Result};
use crate::session::{OnnxSession, Outputs};
use crate::step_binding::bind_in_place;
use ort::memory::Allocator;
use ort::session::{IoBinding, RunOptions};
use ort::value::Tensor;

/// The `gpu_graph_id` of the captured one-row decode step.
pub const DECODE_GRAPH_ID: &str = "1";
/// The `gpu_graph_id` of runs ONNX Runtime must not capture.
pub const NO_GRAPH_ID: &str = "-1";

/// How the runs of a CUDA-graph session went, counted after ONNX Runtime returned success: what
/// this runner asked for, not an observation of the GPU. ONNX Runtime's CUDA provider runs the
/// first `gpu_graph_id` = 1 runs normally (one or two by version), then captures and replays from
/// then on (read from its source); `ORT_LOG=info` makes ONNX Runtime log each replay ("Replaying
/// the captured ... CUDA Graph"), the observation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphRuns {
    /// Runs with `gpu_graph_id` = -1 (prefills): never captured.
    pub uncaptured: usize,
    /// One-row decode steps with `gpu_graph_id` = 1 on the persistent device buffers.
    pub graph: usize,
}

/// The persistent device buffers and binding of the decode step (one row).
pub(super) struct GraphStep {
    /// `[1, 1]`, `[1, 1]`, `[1]`, `[1, 1, 1, L]` on the device, bound once
    input_ids: Tensor<i64>,
    position_ids: Tensor<i64>,
    write_indices: Tensor<i64>,
    attn_mask: Tensor<f32>,
    /// `[1, 1, V]` on the device, bound once as the output
    logits: Tensor<f32>,
    /// host staging of the same shapes, rewritten every step
    host_ids: Tensor<i64>,
    host_positions: Tensor<i64>,
    host_write: Tensor<i64>,
    host_mask: Tensor<f32>,
    host_logits: Tensor<f32>,
    /// every input, output and KV buffer bound once
    binding: IoBinding,
    /// `gpu_graph_id` = 1
    capture: RunOptions,
    /// `gpu_graph_id` = -1, for every other run of the session
    pub(super) skip: RunOptions,
    pub(super) runs: GraphRuns,
}

impl StaticKv {
    /// Run the one-row decode step as a CUDA graph from now on (the session must have been built
    /// with the CUDA provider's `enable_cuda_graph`): allocate its inputs and `logits` (`V` =
    /// `vocab` wide) on the device and bind them, with every KV buffer, once.
    pub fn enable_cuda_graph(&mut self, session: &OnnxSession, vocab: usize) -> Result<()> {
        let file = session.file().to_string();
        let err = |e: ort::Error| Error::CudaGraph {
            file: file.clone(),
            reason: format!("cannot set up the decode step's device buffers: {e}"),
        };
        if !session.ep_used().is_gpu() {
            return Err(Error::CudaGraph {
                file,
                reason: format!("the session runs on {}, not a GPU", session.ep_used()),
            });
        }
        let device = session.allocator().map_err(err)?;
        let host = Allocator::default();
        let l = self.l_max;
        let mut binding = session.session.create_binding().map_err(err)?;
        let input_ids = Tensor::<i64>::new(&device, [1usize, 1]).map_err(err)?;
        let position_ids = Tensor::<i64>::new(&device, [1usize, 1]).map_err(err)?;
        let write_indices = Tensor::<i64>::new(&device, [1usize]).map_err(err)?;
        let attn_mask = Tensor::<f32>::new(&device, [1usize, 1, 1, l]).map_err(err)?;
        let mut logits = Tensor::<f32>::new(&device, [1usize, 1, vocab]).map_err(err)?;
        binding.bind_input("input_ids", &input_ids).map_err(err)?;
        binding
            .bind_input("position_ids", &position_ids)
            .map_err(err)?;
        binding
            .bind_input(WRITE_INDICES, &write_indices)
            .map_err(err)?;
        binding.bind_input(ATTN_MASK, &attn_mask).map_err(err)?;
        binding.bind_output("logits", &mut logits).map_err(err)?;
        bind_in_place(&mut binding, (&self.past, &self.present, &mut self.buffers)).map_err(err)?;
        let graph_id = |id: &str| -> Result<RunOptions> {
            let mut options = RunOptions::new().map_err(err)?;
            options.set("gpu_graph_id", id).map_err(err)?;
            Ok(options)
        };
        self.graph = Some(Box::new(GraphStep {
            input_ids,
            position_ids,
            write_indices,
            attn_mask,
            logits,
            host_ids: Tensor::<i64>::new(&host, [1usize, 1]).map_err(err)?,
            host_positions: Tensor::<i64>::new(&host, [1usize, 1]).map_err(err)?,
            host_write: Tensor::<i64>::new(&host, [1usize]).map_err(err)?,
            host_mask: Tensor::<f32>::new(&host, [1usize, 1, 1, l]).map_err(err)?,
            host_logits: Tensor::<f32>::new(&host, [1usize, 1, vocab]).map_err(err)?,
            binding,
            capture: graph_id(DECODE_GRAPH_ID)?,
            skip: graph_id(NO_GRAPH_ID)?,
            runs: GraphRuns::default(),
        }));
        Ok(())
    }

    /// The runs so far when the decode step is a CUDA graph; `None` otherwise.
    pub fn graph_runs(&self) -> Option<GraphRuns> {
        self.graph.as_ref().map(|g| g.runs)
    }
    /// The one-row step at position `len` on the graph: the new values copied into the bound
    /// device inputs, the run with `gpu_graph_id` = 1, `logits` copied back.
    pub(super) fn run_graph(&mut self, session: &mut OnnxSession, token: u32) -> Result<Outputs> {
        let file = session.file().to_string();
        let err = |what: &'static str| {
            let file = file.clone();
            move |e: ort::Error| Error::CudaGraph {
                file,
                reason: format!("{what}: {e}"),
            }
        };
        let mask = attn_mask(self.len, 1, self.l_max, self.sliding_window);
        let pos = self.len as i64;
        let Some(g) = &mut self.graph else {
            return Err(Error::CudaGraph {
                file,
                reason: "the decode step has no CUDA graph set up".into(),
            });
        };
        let copy_in = "cannot copy the step's inputs to the device";
        g.host_ids.try_extract_tensor_mut().map_err(err(copy_in))?.1[0] = i64::from(token);
        g.host_positions
            .try_extract_tensor_mut()
            .map_err(err(copy_in))?
            .1[0] = pos;
        g.host_write
            .try_extract_tensor_mut()
            .map_err(err(copy_in))?
            .1[0] = pos;
        let host_mask = g
            .host_mask
            .try_extract_tensor_mut()
            .map_err(err(copy_in))?
            .1;
        for (dst, src) in host_mask.iter_mut().zip(mask.iter()) {
            *dst = *src;
        }
        g.host_ids
            .copy_into(&mut g.input_ids)
            .map_err(err(copy_in))?;
        g.host_positions
            .copy_into(&mut g.position_ids)
            .map_err(err(copy_in))?;
        g.host_write
            .copy_into(&mut g.write_indices)
            .map_err(err(copy_in))?;
        g.host_mask
            .copy_into(&mut g.attn_mask)
            .map_err(err(copy_in))?;
        let replay = "ONNX Runtime failed the decode step with gpu_graph_id 1 (capture or replay; \
                      `--cuda-graph off` runs without)";
        drop(
            session
                .session
                .run_binding_with_options(&g.binding, &g.capture)
                .map_err(err(replay))?,
        );
        g.binding.synchronize_outputs().map_err(err(replay))?;
        g.runs.graph += 1;
        let copy_out = "cannot copy the logits back to the host";
        g.logits
            .copy_into(&mut g.host_logits)
            .map_err(err(copy_out))?;
        let logits = g.host_logits.try_extract_array().map_err(err(copy_out))?;
        Ok(Outputs {
            file,
            tensors: vec![("logits".to_string(), logits.to_owned())],
        })
    }
}
