//! The KV cache of the speculative loop ([`OnnxSpeculation`](crate::speculation::OnnxSpeculation)):
//! the draft layers `0..e` (draft.onnx and feed.onnx) filled up to the drafted length, the verifier
//! layers `e..N` up to the verified one.
//!
//! - Dynamic exports: two growing caches, one per layer range ([`Kv`]); a rollback truncates them.
//! - Static exports (`export --static-cache`): one set of fixed buffers for every layer
//!   ([`StaticKv`]), each graph bound to its layers' buffers in place; a rollback only moves the
//!   two lengths (the rows past them stay in the buffers, hidden by the masks).
//!
//! Either way a run feeds `T` rows at the next positions of its layer range and the range's
//! length grows by `T`.
//!
//! On a static export the decode-time runs (a draft row, a fed row, a verify chunk of `m` rows:
//! `bound`) go through a [`StepBinding`] per graph and step shape, created on first use, with
//! every input and output bound once; with CUDA graphs (`--cuda-graph`, on by default for static
//! exports on CUDA) each of those shapes is captured as a graph of its own (`gpu_graph_id` = `T`
//! within its session) and replayed. The prefill is never captured (`gpu_graph_id` = -1).

use crate::error::{Error, Result};

/// The speculative graphs' visibility input on a dynamic export (export's `graphs::TREE_MASK`).
pub const TREE_MASK: &str = "tree_mask";
use crate::kv::Kv;
use crate::kv_store::KvStore;
use crate::session::{Input, OnnxSession, Outputs};
use crate::static_kv::{
    ATTN_MASK, FAST_ATTN_MASK, StaticKv, WRITE_INDICES, attn_mask, fast_attn_mask,
};
use crate::static_kv::{GraphRuns, NO_GRAPH_ID};
use crate::step::StepInputs;
use crate::step_binding::StepBinding;
use crate::tree_mask::{causal_visibility, tree_attn_mask, tree_fast_attn_mask, tree_visibility};
use ndarray::{Array1, Array2, ArrayView3};
use ort::session::RunOptions;
use reference::base::tree::TokenTree;
use std::ops::Range;

pub enum SpecCache {
    /// Growing caches of layers `0..e` and `e..N`; the config's sliding window (for the
    /// graphs' `tree_mask`).
    Dynamic {
        lower: Kv,
        upper: Kv,
        sliding_window: Option<usize>,
    },
    /// Fixed buffers of every layer; `lower` / `upper`: positions filled in `0..e` / `e..N`.
    Static {
        kv: StaticKv,
        /// `0..e` and `e..N`
        split: (Range<usize>, Range<usize>),
        lower: usize,
        upper: usize,
        bound: BoundSteps,
    },
}

/// The step bindings of a static export's speculative graphs, and whether they are CUDA graphs.
pub struct BoundSteps {
    /// ((graph file, rows), binding)
    steps: Vec<((String, usize), StepBinding)>,
    /// `gpu_graph_id` = -1 for the unbound runs when the sessions have CUDA graphs
    skip: Option<RunOptions>,
    uncaptured: usize,
}

impl BoundSteps {
    /// No bindings yet; `cuda_graph`: the sessions were built with CUDA graphs.
    pub fn new(cuda_graph: bool) -> Result<Self> {
        let skip = match cuda_graph {
            true => {
                let mut options =
                    RunOptions::new().map_err(|e| crate::error::Error::ort("ONNX Runtime", e))?;
                options
                    .set("gpu_graph_id", NO_GRAPH_ID)
                    .map_err(|e| crate::error::Error::ort("ONNX Runtime", e))?;
                Some(options)
            }
            false => None,
        };
        Ok(BoundSteps {
            steps: Vec::new(),
            skip,
            uncaptured: 0,
        })
    }

    /// Run `inputs` on `session`'s layers `layers` of `kv`: through the step's binding when
    /// `bound` (created on first use), else as a plain in-place run.
    fn run(
        &mut self,
        kv: &mut StaticKv,
        session: &mut OnnxSession,
        layers: Range<usize>,
        inputs: &[(&str, Input<'_>)],
        rows: usize,
        bound: bool,
    ) -> Result<Outputs> {
        if !bound {
            self.uncaptured += 1;
            return kv.run_layers(session, layers, inputs, self.skip.as_ref());
        }
        let key = (session.file().to_string(), rows);
        let at = match self.steps.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let id = rows.to_string();
                let graph_id = self.skip.is_some().then_some(id.as_str());
                let step = kv.bind_step(session, layers, inputs, rows, graph_id)?;
                self.steps.push((key, step));
                self.steps.len() - 1
            }
        };
        self.steps[at].1.run(session, inputs)
    }

    /// The runs so far, when the steps are CUDA graphs.
    fn graph_runs(&self) -> Option<GraphRuns> {
        self.skip.as_ref().map(|_| GraphRuns {
            uncaptured: self.uncaptured,
            graph: self.steps.iter().map(|(_, s)| s.runs).sum(),
        })
    }
}

/// Rows that are nodes of a token tree: `tree`'s nodes `first..first + T`, the root at position
/// `root` (in the scratch slots `root + i`, at positions `root + depth(i)`; `tree_mask.rs`).
#[derive(Clone, Copy)]
pub struct TreeChunk<'a> {
    pub tree: &'a TokenTree,
    pub first: usize,
    pub root: usize,
}

/// Where a run's rows go.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// The next positions of the graph's layers; `bound`: a decode-time step (see the module
    /// docs), not the prefill.
    Next { bound: bool },
    /// Token tree nodes, in their scratch slots (always a decode-time step).
    Tree(TreeChunk<'a>),
}

impl Rows<'_> {
    /// The position of the first row, `next` being the next position of the layers.
    pub fn first_position(&self, next: usize) -> usize {
        match self {
            Rows::Next { .. } => next,
            Rows::Tree(c) => c.tree.position(c.first, c.root),
        }
    }

    fn bound(&self) -> bool {
        match self {
            Rows::Next { bound } => *bound,
            Rows::Tree(_) => true,
        }
    }
}

/// The inputs a static graph takes besides its rows and buffers, for `t` rows at `pos` (or tree
/// nodes).
struct StaticStep {
    position_ids: Array2<i64>,
    write_indices: Array1<i64>,
    attn_mask: ndarray::Array4<f32>,
    /// draft.onnx only
    fast_attn_mask: Option<ndarray::Array4<f32>>,
}

impl StaticStep {
    fn new(kv: &StaticKv, session: &OnnxSession, pos: usize, t: usize) -> Result<Self> {
        kv.check_fits(session.file(), pos, t)?;
        let (l, w) = (kv.l_max(), kv.sliding_window());
        let fast = session.inputs().iter().any(|i| i.name == FAST_ATTN_MASK);
        Ok(StaticStep {
            position_ids: Array2::from_shape_fn((1, t), |(_, i)| (pos + i) as i64),
            write_indices: Array1::from_elem(1, pos as i64),
            attn_mask: attn_mask(pos, t, l, w),
            fast_attn_mask: fast.then(|| fast_attn_mask(pos, t, l, w)),
        })
    }

    /// `t` rows at `pos` (the layers' next positions) or the tree nodes of `at`.
    fn at(
        kv: &StaticKv,
        session: &OnnxSession,
        at: Rows<'_>,
        pos: usize,
        t: usize,
    ) -> Result<Self> {
        match at {
            Rows::Next { .. } => Self::new(kv, session, pos, t),
            Rows::Tree(chunk) => Self::tree(kv, session, chunk, t),
        }
    }

    /// `t` tree nodes: written to their scratch slots, at their nodes' positions, tree masks.
    fn tree(kv: &StaticKv, session: &OnnxSession, chunk: TreeChunk<'_>, t: usize) -> Result<Self> {
        let TreeChunk { tree, first, root } = chunk;
        kv.check_fits(session.file(), root + first, t)?;
        let (l, w) = (kv.l_max(), kv.sliding_window());
        let fast = session.inputs().iter().any(|i| i.name == FAST_ATTN_MASK);
        Ok(StaticStep {
            position_ids: Array2::from_shape_fn((1, t), |(_, i)| {
                tree.position(first + i, root) as i64
            }),
            write_indices: Array1::from_elem(1, (root + first) as i64),
            attn_mask: tree_attn_mask(tree, first, t, root, l, w),
            fast_attn_mask: fast.then(|| tree_fast_attn_mask(tree, first, t, root, l, w)),
        })
    }

    fn inputs(&self) -> Vec<(&'static str, Input<'_>)> {
        let mut inputs = vec![
            (
                "position_ids",
                Input::I64(self.position_ids.view().into_dyn()),
            ),
            (
                WRITE_INDICES,
                Input::I64(self.write_indices.view().into_dyn()),
            ),
            (ATTN_MASK, Input::F32(self.attn_mask.view().into_dyn())),
        ];
        if let Some(m) = &self.fast_attn_mask {
            inputs.push((FAST_ATTN_MASK, Input::F32(m.view().into_dyn())));
        }
        inputs
    }
}

impl SpecCache {
    /// Positions filled in the draft layers.
    pub fn lower_len(&self) -> usize {
        match self {
            SpecCache::Dynamic { lower, .. } => lower.len(),
            SpecCache::Static { lower, .. } => *lower,
        }
    }

    /// Positions filled in the verifier layers.
    pub fn upper_len(&self) -> usize {
        match self {
            SpecCache::Dynamic { upper, .. } => upper.len(),
            SpecCache::Static { upper, .. } => *upper,
        }
    }

    /// Run `session` (draft.onnx or feed.onnx) on `tokens` in the draft layers, with `extra`
    /// inputs (`bridge_states`), at the next positions (the draft layers' length grows by `T`)
    /// or as token tree nodes (`Rows::Tree`: their K/V go to their scratch slots `root + i` of a
    /// static export's buffers, or are appended to a dynamic export's caches, which then hold the
    /// nodes before them in the same rows; see [`compact`](Self::compact)).
    pub fn run_lower(
        &mut self,
        session: &mut OnnxSession,
        tokens: &[u32],
        extra: &[(&str, Input<'_>)],
        at: Rows<'_>,
    ) -> Result<Outputs> {
        let t = tokens.len();
        let ids = Array2::from_shape_fn((1, t), |(_, i)| i64::from(tokens[i]));
        let ids = ("input_ids", Input::I64(ids.view().into_dyn()));
        match self {
            SpecCache::Dynamic {
                lower,
                sliding_window,
                ..
            } => {
                let step = DynamicStep::new(session, at, t, lower.len(), *sliding_window)?;
                let mut inputs = step.inputs();
                inputs.push(ids);
                inputs.extend(extra.iter().map(|(n, i)| (*n, i.reborrow())));
                lower.run(session, &inputs, t)
            }
            SpecCache::Static {
                kv,
                split,
                lower,
                bound: steps,
                ..
            } => {
                let step = StaticStep::at(kv, session, at, *lower, t)?;
                let mut inputs = step.inputs();
                inputs.push(ids);
                inputs.extend(extra.iter().map(|(n, i)| (*n, i.reborrow())));
                let out = steps.run(kv, session, split.0.clone(), &inputs, t, at.bound())?;
                if let Rows::Next { .. } = at {
                    *lower += t;
                }
                Ok(out)
            }
        }
    }

    /// Run verifier.onnx on slow residuals `hidden` (`[1, m, D]`) in the verifier layers, at the
    /// next positions or as token tree nodes, as [`run_lower`](Self::run_lower).
    pub fn run_upper(
        &mut self,
        session: &mut OnnxSession,
        hidden: ArrayView3<'_, f32>,
        at: Rows<'_>,
    ) -> Result<Outputs> {
        let m = hidden.shape()[1];
        let rows = ("hidden_states", Input::F32(hidden.into_dyn()));
        match self {
            SpecCache::Dynamic {
                upper,
                sliding_window,
                ..
            } => {
                let step = DynamicStep::new(session, at, m, upper.len(), *sliding_window)?;
                let mut inputs = step.inputs();
                inputs.push(rows);
                upper.run(session, &inputs, m)
            }
            SpecCache::Static {
                kv,
                split,
                upper,
                bound: steps,
                ..
            } => {
                let step = StaticStep::at(kv, session, at, *upper, m)?;
                let mut inputs = step.inputs();
                inputs.push(rows);
                let out = steps.run(kv, session, split.1.clone(), &inputs, m, at.bound())?;
                if let Rows::Next { .. } = at {
                    *upper += m;
                }
                Ok(out)
            }
        }
    }

    /// Keep a token tree's accepted `path` (root at `root`) at positions `root..` in every layer
    /// (the rows move from their scratch slots, the rest of the round is dropped); both lengths
    /// become `root + path.len()`.
    pub fn compact(&mut self, root: usize, path: &[usize]) -> Result<()> {
        match self {
            SpecCache::Static {
                kv, lower, upper, ..
            } => {
                kv.compact(root, path)?;
                (*lower, *upper) = (root + path.len(), root + path.len());
                Ok(())
            }
            SpecCache::Dynamic { lower, upper, .. } => {
                lower.compact(root, path)?;
                upper.compact(root, path)
            }
        }
    }

    /// The runs so far when the static steps are CUDA graphs; `None` otherwise.
    pub fn graph_runs(&self) -> Option<GraphRuns> {
        match self {
            SpecCache::Static { bound, .. } => bound.graph_runs(),
            SpecCache::Dynamic { .. } => None,
        }
    }

    /// Keep the first `len` drafted and `verified` verified positions.
    pub fn truncate(&mut self, len: usize, verified: usize) {
        match self {
            SpecCache::Dynamic { lower, upper, .. } => {
                lower.truncate(len);
                upper.truncate(verified);
            }
            SpecCache::Static { lower, upper, .. } => {
                *lower = (*lower).min(len);
                *upper = (*upper).min(verified);
            }
        }
    }

    /// The draft layers' and the verifier layers' filled positions on the host.
    pub fn to_host(&mut self) -> Result<(KvStore, KvStore)> {
        match self {
            SpecCache::Dynamic { lower, upper, .. } => Ok((lower.to_host()?, upper.to_host()?)),
            SpecCache::Static {
                kv,
                split,
                lower,
                upper,
                ..
            } => Ok((
                kv.layers_to_host(split.0.clone(), *lower)?,
                kv.layers_to_host(split.1.clone(), *upper)?,
            )),
        }
    }
}

/// Whether a dynamic speculative graph takes `tree_mask` (exports written before it did not).
fn takes_tree_mask(session: &OnnxSession) -> bool {
    session.inputs().iter().any(|i| i.name == TREE_MASK)
}

/// The int64 inputs of a dynamic speculative graph for `t` rows after `past` cached positions:
/// an all-ones `attention_mask`, and at the next positions their positions and a causal
/// `tree_mask` (when the graph takes one), or for token tree nodes their positions by depth and
/// the tree's `tree_mask`.
struct DynamicStep {
    step: StepInputs,
    mask: Option<Array2<i64>>,
}

impl DynamicStep {
    fn new(
        session: &OnnxSession,
        at: Rows<'_>,
        t: usize,
        past: usize,
        sliding_window: Option<usize>,
    ) -> Result<Self> {
        let mut step = StepInputs::rows(t, past);
        let Rows::Tree(TreeChunk { tree, first, root }) = at else {
            let mask = takes_tree_mask(session).then(|| causal_visibility(past, t, sliding_window));
            return Ok(DynamicStep { step, mask });
        };
        if !takes_tree_mask(session) {
            return Err(Error::Export {
                file: session.file().to_string(),
                msg: format!(
                    "token trees need the graph's `{TREE_MASK}` input, which exports written \
                     before trees do not have: export the folder again"
                ),
            });
        }
        // the nodes before these are the cache rows root..root + first, breadth-first
        debug_assert_eq!(
            past,
            root + first,
            "tree rows appended in breadth-first order"
        );
        step.position_ids =
            Array2::from_shape_fn((1, t), |(_, i)| tree.position(first + i, root) as i64);
        Ok(DynamicStep {
            step,
            mask: Some(tree_visibility(tree, first, t, root, sliding_window)),
        })
    }

    /// Every input but the rows (`input_ids` or `hidden_states`).
    fn inputs(&self) -> Vec<(&'static str, Input<'_>)> {
        vec![
            (
                "attention_mask",
                Input::I64(self.step.attention_mask.view().into_dyn()),
            ),
            (
                "position_ids",
                Input::I64(self.step.position_ids.view().into_dyn()),
            ),
        ]
        .into_iter()
        .chain(
            self.mask
                .iter()
                .map(|m| (TREE_MASK, Input::I64(m.view().into_dyn()))),
        )
        .collect()
    }
}
