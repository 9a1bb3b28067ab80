//! The [`Feeder`] that runs an ONNX graph chunk by chunk, carrying its presents over as the next
//! chunk's past, and the comparison of its final presents with the reference cache.

use super::compare::{Comparison, compare, kv_layout};
use super::runner_error;
use crate::error::Result;
use crate::graphs::{self, ATTENTION_MASK, HIDDEN_STATES, INPUT_IDS, POSITION_IDS};
use ndarray::{ArrayD, Axis};
use onnx_runner::session::{Input, OnnxSession, Outputs};
use reference::KvCache;
use reference::base::model::Model;

/// Feeds one chunk and carries the presents over as the next chunk's past: growing caches for a
/// dynamic graph, or for a static one (`static_l`) fixed buffers of `L` positions fed as plain
/// inputs (not in place: the check reads the graph, the runner's binding is checked by
/// [`check_static_model`](super::static_model::check_static_model) and the runner's tests) with
/// the masks the runner builds.
pub(super) struct Feeder {
    layers: std::ops::Range<usize>,
    past: Vec<(ArrayD<f32>, ArrayD<f32>)>,
    past_len: usize,
    static_l: Option<usize>,
    sliding_window: Option<usize>,
}

impl Feeder {
    pub(super) fn new(
        model: &Model,
        layers: std::ops::Range<usize>,
        static_l: Option<usize>,
    ) -> Self {
        let c = &model.config;
        let empty = || {
            ArrayD::zeros(vec![
                1,
                c.num_key_value_heads,
                static_l.unwrap_or(0),
                c.head_dim,
            ])
        };
        Feeder {
            past: layers.clone().map(|_| (empty(), empty())).collect(),
            layers,
            past_len: 0,
            static_l,
            sliding_window: c.sliding_window,
        }
    }

    /// Run one chunk: `rows` is `input_ids` (ints) or `hidden_states` (floats); `extra`, another
    /// float input (draft.onnx's `bridge_states`).
    pub(super) fn run(
        &mut self,
        session: &mut OnnxSession,
        rows: Rows<'_>,
        t: usize,
        extra: Option<(&str, &ArrayD<f32>)>,
    ) -> Result<onnx_runner::session::Outputs> {
        use onnx_runner::static_kv::{ATTN_MASK, FAST_ATTN_MASK, WRITE_INDICES};
        let total = self.past_len + t;
        let positions = ArrayD::from_shape_fn(vec![1, t], |i| (self.past_len + i[1]) as i64);
        let names: Vec<(String, String)> = self.layers.clone().map(graphs::past_names).collect();
        let mut inputs: Vec<(&str, Input<'_>)> = vec![(POSITION_IDS, Input::I64(positions.view()))];
        // dynamic: which cache positions are real; static: the masks and where to write
        let (mask, tree_mask, attn_mask, fast_mask, write);
        match self.static_l {
            None => {
                mask = ArrayD::<i64>::ones(vec![1, total]);
                inputs.push((ATTENTION_MASK, Input::I64(mask.view())));
                if session.inputs().iter().any(|i| i.name == graphs::TREE_MASK) {
                    let (p, w) = (self.past_len, self.sliding_window);
                    tree_mask = onnx_runner::tree_mask::causal_visibility(p, t, w).into_dyn();
                    inputs.push((graphs::TREE_MASK, Input::I64(tree_mask.view())));
                }
            }
            Some(l) => {
                let (p, w) = (self.past_len, self.sliding_window);
                attn_mask = onnx_runner::static_kv::attn_mask(p, t, l, w).into_dyn();
                fast_mask = onnx_runner::static_kv::fast_attn_mask(p, t, l, w).into_dyn();
                write = ArrayD::from_elem(vec![1], p as i64);
                inputs.push((ATTN_MASK, Input::F32(attn_mask.view())));
                inputs.push((WRITE_INDICES, Input::I64(write.view())));
                if session.inputs().iter().any(|i| i.name == FAST_ATTN_MASK) {
                    inputs.push((FAST_ATTN_MASK, Input::F32(fast_mask.view())));
                }
            }
        }
        match &rows {
            Rows::Ids(ids) => inputs.push((INPUT_IDS, Input::I64(ids.view()))),
            Rows::Hidden(h) => inputs.push((HIDDEN_STATES, Input::F32(h.view()))),
        }
        if let Some((name, x)) = extra {
            inputs.push((name, Input::F32(x.view())));
        }
        for ((k, v), (pk, pv)) in names.iter().zip(&self.past) {
            inputs.push((k, Input::F32(pk.view())));
            inputs.push((v, Input::F32(pv.view())));
        }
        let mut out = session.run(&inputs).map_err(runner_error)?;
        for (i, l) in self.layers.clone().enumerate() {
            let (k, v) = graphs::present_names(l);
            self.past[i] = (
                out.take(&k).map_err(runner_error)?,
                out.take(&v).map_err(runner_error)?,
            );
        }
        self.past_len = total;
        Ok(out)
    }

    /// Layer `i`'s (index in `layers`) filled positions, `[1, Hkv, past_len, Dh]`.
    fn filled(&self, i: usize) -> (ArrayD<f32>, ArrayD<f32>) {
        let cut = |x: &ArrayD<f32>| x.slice_axis(Axis(2), (0..self.past_len).into()).to_owned();
        (cut(&self.past[i].0), cut(&self.past[i].1))
    }
}

pub(super) enum Rows<'a> {
    Ids(ArrayD<i64>),
    Hidden(&'a ArrayD<f32>),
}

pub(super) fn ids(chunk: &[u32]) -> ArrayD<i64> {
    ArrayD::from_shape_vec(
        vec![1, chunk.len()],
        chunk.iter().map(|&t| t as i64).collect(),
    )
    .expect("[1, T]")
}

pub(super) fn output(out: &Outputs, name: &str) -> Result<ArrayD<f32>> {
    Ok(out.get(name).map_err(runner_error)?.clone())
}

/// Compare the final presents of `layers` with the reference cache.
pub(super) fn compare_presents(
    graph: &str,
    model: &Model,
    feeder: &Feeder,
    cache: &KvCache,
    rows: &mut Vec<Comparison>,
) {
    let c = &model.config;
    for (i, l) in feeder.layers.clone().enumerate() {
        let (k, v) = cache.layer(l, feeder.past_len);
        let (kn, vn) = graphs::present_names(l);
        let (ok, ov) = &feeder.filled(i);
        rows.push(compare(
            graph,
            &kn,
            ok,
            &kv_layout(k, c.num_key_value_heads, c.head_dim),
        ));
        rows.push(compare(
            graph,
            &vn,
            ov,
            &kv_layout(v, c.num_key_value_heads, c.head_dim),
        ));
    }
}
