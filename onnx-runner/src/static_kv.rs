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

use crate::device_kv::host_array;
use crate::error::{Error, Result};
use crate::kv_store::{KvStore, past_names, present_names};
use crate::session::{Dim, Input, OnnxSession, Outputs, host_outputs};
use crate::step_binding::{StepBinding, bind_in_place};
use ndarray::{Array1, Array2, Array4, ArrayViewMutD, s};
use ort::memory::{AllocationDevice, Allocator};
use ort::session::{IoBinding, RunOptions};
use ort::value::{DynTensor, Tensor};
use reference::ModelConfig;
use std::ops::Range;

/// The mask value of a hidden key (the exporter's `static_graph::HIDDEN`).
pub const HIDDEN: f32 = f32::MIN;
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
struct GraphStep {
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
    skip: RunOptions,
    runs: GraphRuns,
}

/// The additive mask of `rows` rows at positions `pos0..pos0 + rows` over `l_max` keys.
///
/// # Shapes
/// - returns `[1, 1, rows, l_max]`
pub fn attn_mask(
    pos0: usize,
    rows: usize,
    l_max: usize,
    sliding_window: Option<usize>,
) -> Array4<f32> {
    Array4::from_shape_fn((1, 1, rows, l_max), |(_, _, t, j)| {
        let p = pos0 + t;
        let visible = j <= p && sliding_window.is_none_or(|w| p - j < w);
        if visible { 0.0 } else { HIDDEN }
    })
}

/// The additive mask of the fast rows of a static draft.onnx (`fast_attn_mask`): `rows` rows at
/// positions `pos0..pos0 + rows` over the `l_max` buffer keys then the rows' own `rows` keys. Row
/// `t` at position `p` sees buffer keys `0..p` (not its own position: the slow row's key there
/// is not the fast row's), the last `sliding_window - 1` of them when the config has one, and
/// its own key at column `l_max + t`, never another row's.
///
/// # Shapes
/// - returns `[1, 1, rows, l_max + rows]`
pub fn fast_attn_mask(
    pos0: usize,
    rows: usize,
    l_max: usize,
    sliding_window: Option<usize>,
) -> Array4<f32> {
    Array4::from_shape_fn((1, 1, rows, l_max + rows), |(_, _, t, j)| {
        let p = pos0 + t;
        let visible = match j.checked_sub(l_max) {
            Some(own) => own == t,
            None => j < p && sliding_window.is_none_or(|w| p - j < w),
        };
        if visible { 0.0 } else { HIDDEN }
    })
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

    /// Feed `tokens` at positions `len..len + T`; the buffers then hold them. Returns the
    /// graph's other outputs (`logits`) on the host. A step past `L` is refused before running.
    pub fn run(&mut self, session: &mut OnnxSession, tokens: &[u32]) -> Result<Outputs> {
        self.check_room(session.file(), tokens.len())?;
        let t = tokens.len();
        let needed = self.len + t;
        if t == 1 && self.graph.is_some() {
            let outputs = self.run_graph(session, tokens[0])?;
            self.len = needed;
            return Ok(outputs);
        }
        let input_ids = Array2::from_shape_fn((1, t), |(_, i)| i64::from(tokens[i]));
        let position_ids = Array2::from_shape_fn((1, t), |(_, i)| (self.len + i) as i64);
        let write_indices = Array1::from_elem(1, self.len as i64);
        let mask = attn_mask(self.len, t, self.l_max, self.sliding_window);
        let host = [
            ("input_ids", Input::I64(input_ids.view().into_dyn())),
            ("position_ids", Input::I64(position_ids.view().into_dyn())),
            (ATTN_MASK, Input::F32(mask.view().into_dyn())),
            (WRITE_INDICES, Input::I64(write_indices.view().into_dyn())),
        ];
        let outputs = if t == 1 {
            // the one-row decode step: bound once, its tensors reused every step
            if self.step.is_none() {
                let layers = 0..self.buffers.len();
                self.step = Some(Box::new(self.bind_step(session, layers, &host, 1, None)?));
            }
            let step = self.step.as_mut().expect("bound above");
            step.run(session, &host)?
        } else {
            let skip = self.graph.as_ref().map(|g| &g.skip);
            let outputs =
                session.run_in_place(&host, &self.past, &self.present, &mut self.buffers, skip)?;
            if let Some(graph) = &mut self.graph {
                graph.runs.uncaptured += 1;
            }
            outputs
        };
        self.len = needed;
        Ok(outputs)
    }

    /// The one-row step at position `len` on the graph: the new values copied into the bound
    /// device inputs, the run with `gpu_graph_id` = 1, `logits` copied back.
    fn run_graph(&mut self, session: &mut OnnxSession, token: u32) -> Result<Outputs> {
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

    /// Run `session`, a graph of `layers`, on `host` inputs (which say where it writes) with those
    /// layers' buffers bound in place; no length is kept (the caller keeps its own: the draft and
    /// verifier layers of a speculative loop fill up to different positions).
    ///
    /// `options`: the run's (`gpu_graph_id` = -1 in a session with CUDA graphs).
    pub fn run_layers(
        &mut self,
        session: &mut OnnxSession,
        layers: Range<usize>,
        host: &[(&str, Input<'_>)],
        options: Option<&RunOptions>,
    ) -> Result<Outputs> {
        let (past, present) = (&self.past[layers.clone()], &self.present[layers.clone()]);
        session.run_in_place(host, past, present, &mut self.buffers[layers], options)
    }

    /// A [`StepBinding`] of `rows` rows of `session`, a graph of `layers`, with inputs shaped as
    /// `host` and those layers' buffers bound in place; `graph_id`: captured as that CUDA graph.
    pub fn bind_step(
        &mut self,
        session: &OnnxSession,
        layers: Range<usize>,
        host: &[(&str, Input<'_>)],
        rows: usize,
        graph_id: Option<&str>,
    ) -> Result<StepBinding> {
        let kv = (
            &self.past[layers.clone()],
            &self.present[layers.clone()],
            &mut self.buffers[layers],
        );
        StepBinding::new(session, host, rows, kv, graph_id)
    }

    /// The filled positions of every layer, copied to the host.
    pub fn to_host(&self) -> Result<KvStore> {
        self.layers_to_host(0..self.buffers.len(), self.len)
    }

    /// The first `len` positions of `layers`, copied to the host.
    pub fn layers_to_host(&self, layers: Range<usize>, len: usize) -> Result<KvStore> {
        let mut store = KvStore::new(layers.clone(), self.kv_heads, self.head_dim);
        let kept = self.buffers[layers]
            .iter()
            .map(|(k, v)| Ok((host_array(k, Some(len))?, host_array(v, Some(len))?)))
            .collect::<Result<Vec<_>>>()?;
        store.replace(kept);
        Ok(store)
    }

    /// Move a token tree's accepted path into place in every layer: the scratch slot `root +
    /// path[i]` of the path's node at depth `i` to position `root + i` (the reference's
    /// `KvCache::compact`; each row was computed for that position, so the copy is exact).
    /// Buffers in device memory go through the host (a copy of every layer each round).
    pub fn compact(&mut self, root: usize, path: &[usize]) -> Result<()> {
        // (from, to), to increasing and each from >= its to: no move overwrites a later source
        let moves: Vec<(usize, usize)> = (0..path.len())
            .filter(|&i| path[i] != i)
            .map(|i| (root + path[i], root + i))
            .collect();
        if moves.is_empty() {
            return Ok(());
        }
        if let Some(&(from, _)) = moves.iter().find(|(from, _)| *from >= self.l_max) {
            return Err(Error::Runtime(format!(
                "a token tree's accepted row sits at slot {from}, past the static KV buffers' \
                 {} positions",
                self.l_max
            )));
        }
        let err = |e: ort::Error| {
            Error::Runtime(format!(
                "cannot move a token tree's accepted rows in the static KV buffers: {e}"
            ))
        };
        let move_rows = |a: &mut ArrayViewMutD<f32>| {
            for &(from, to) in &moves {
                let row = a.slice(s![.., .., from, ..]).to_owned();
                a.slice_mut(s![.., .., to, ..]).assign(&row);
            }
        };
        for (k, v) in &mut self.buffers {
            for t in [k, v] {
                if t.memory_info().is_cpu_accessible() {
                    move_rows(&mut t.try_extract_array_mut::<f32>().map_err(err)?);
                } else {
                    let mut host = t.to(AllocationDevice::CPU, 0).map_err(err)?;
                    move_rows(&mut host.try_extract_array_mut::<f32>().map_err(err)?);
                    host.copy_into(&mut *t).map_err(err)?;
                }
            }
        }
        Ok(())
    }

    /// The masks' sliding window (the config's).
    pub fn sliding_window(&self) -> Option<usize> {
        self.sliding_window
    }
}

impl OnnxSession {
    /// Run with IoBinding, each of `buffers` bound as the input named in `past` AND the output
    /// named in `present` (the graph writes it in place); `host` inputs are checked and copied in,
    /// every other f32 output comes back to the host.
    pub fn run_in_place(
        &mut self,
        host: &[(&str, Input<'_>)],
        past: &[(String, String)],
        present: &[(String, String)],
        buffers: &mut [(DynTensor, DynTensor)],
        options: Option<&RunOptions>,
    ) -> Result<Outputs> {
        let file = self.file.clone();
        let err = |e: ort::Error| Error::ort(&file, e);
        self.check_host_inputs(host)?;
        let given = |name: &str| {
            host.iter().any(|(n, _)| *n == name) || past.iter().any(|(k, v)| k == name || v == name)
        };
        if let Some(missing) = self.inputs.iter().find(|i| !given(&i.name)) {
            return Err(Error::MissingInput {
                file,
                name: missing.name.clone(),
            });
        }
        let host_memory = OnnxSession::host_output_memory().map_err(err)?;
        let mut binding = self.session.create_binding().map_err(err)?;
        for (name, input) in host {
            binding
                .bind_input(*name, &input.to_tensor().map_err(err)?)
                .map_err(err)?;
        }
        bind_in_place(&mut binding, (past, present, buffers)).map_err(err)?;
        let bound = |name: &str| present.iter().any(|(k, v)| k == name || v == name);
        for info in self.outputs.iter().filter(|o| !bound(&o.name)) {
            binding
                .bind_output_to_device(info.name.as_str(), &host_memory)
                .map_err(err)?;
        }
        let outputs = match options {
            Some(options) => self.session.run_binding_with_options(&binding, options),
            None => self.session.run_binding(&binding),
        }
        .map_err(err)?;
        let tensors = host_outputs(&file, &self.outputs, &outputs, |o| !bound(&o.name))?;
        Ok(Outputs { file, tensors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows at positions 2 and 3 of a buffer of 5; with a window of 2, position 3 no longer sees
    /// key 1.
    #[test]
    fn mask_is_causal_from_the_rows_positions_and_slides() {
        let m = attn_mask(2, 2, 5, None);
        let seen = |m: &Array4<f32>, t: usize| -> Vec<bool> {
            (0..5).map(|j| m[[0, 0, t, j]] == 0.0).collect()
        };
        assert_eq!(seen(&m, 0), [true, true, true, false, false]);
        assert_eq!(seen(&m, 1), [true, true, true, true, false]);
        let w = attn_mask(2, 2, 5, Some(2));
        assert_eq!(seen(&w, 0), [false, true, true, false, false]);
        assert_eq!(seen(&w, 1), [false, false, true, true, false]);
        assert_eq!(w[[0, 0, 0, 0]], HIDDEN);
    }

    /// Fast rows at positions 2 and 3 of a buffer of 5: buffer keys before their position, then
    /// their own key among the two appended; with a window of 2, position 3 sees key 2 only.
    #[test]
    fn fast_mask_sees_earlier_buffer_keys_and_its_own_key() {
        let seen = |m: &Array4<f32>, t: usize| -> Vec<bool> {
            (0..7).map(|j| m[[0, 0, t, j]] == 0.0).collect()
        };
        let m = fast_attn_mask(2, 2, 5, None);
        assert_eq!(m.shape(), [1, 1, 2, 7]);
        assert_eq!(seen(&m, 0), [true, true, false, false, false, true, false]);
        assert_eq!(seen(&m, 1), [true, true, true, false, false, false, true]);
        let w = fast_attn_mask(2, 2, 5, Some(2));
        assert_eq!(seen(&w, 0), [false, true, false, false, false, true, false]);
        assert_eq!(seen(&w, 1), [false, false, true, false, false, false, true]);
    }
}
