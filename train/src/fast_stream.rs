//! One interval of the fast stream (docs/m2r2/streams.md) on a batch of independent fast rows,
//! forward with saved activations and its hand-written backward.
//!
//! Row `r` is (sample, position `p`). In interval `j` its state starts at the detached slow residual
//! `s_{e_j}[p]` and runs the interval's layers with base weights plus adapters; it attends to the
//! detached slow K/V of positions `< p` plus its own K/V (exactly `reference::base::layer::decoder_layer`
//! for a fast row). Per layer:
//! ```text
//! h1 = RMSNorm(x)                 q,k,v = LoRALinear(h1)      q,k = RoPE(q,k at p)
//! c  = Attn(q | cache[lo..p] + own k,v)     x1 = x + LoRALinear_o(c)
//! h2 = RMSNorm(x1)                a = silu(LoRALinear_gate(h2)) * LoRALinear_up(h2)
//! x2 = x1 + LoRALinear_down(a)
//! ```
//! Dense (SwiGLU) layers only: the trainer refuses MoE models.

use crate::adapters::Adapters;
use crate::attention::{self, Heads, Visible};
use crate::error::{Error, Result};
use crate::head::Head;
use crate::linear::{self, Frozen};
use crate::real::{Real, lift};
use crate::rmsnorm;
use crate::rope::RopeTable;
use crate::slow_stream::SlowSample;
use crate::swiglu;
use ndarray::{Array1, Array2, ArrayView2, Axis, s};
use rayon::prelude::*;
use reference::Model;
use reference::base::attention::window_start;
use reference::base::config::ModelConfig;
use reference::base::weight_names::Target;
use reference::base::weight_names::{AttnProj, MlpProj};
use reference::base::weights::FeedForward;
use std::collections::BTreeMap;
use std::ops::Range;

const Q: Target = Target::Attn(AttnProj::Q);
const K: Target = Target::Attn(AttnProj::K);
const V: Target = Target::Attn(AttnProj::V);
const O: Target = Target::Attn(AttnProj::O);
const GATE: Target = Target::Mlp(MlpProj::Gate);
const UP: Target = Target::Mlp(MlpProj::Up);
const DOWN: Target = Target::Mlp(MlpProj::Down);

/// The frozen base weights of one dense layer.
#[derive(Clone, Debug)]
pub struct FrozenLayer<F> {
    /// `[D]`
    pub attn_norm: Array1<F>,
    /// `[D]`
    pub mlp_norm: Array1<F>,
    /// q, k, v, o, gate, up, down in [`Target::ALL`] order
    pub proj: BTreeMap<Target, Frozen<F>>,
}

/// The frozen parts of the base model a fast interval needs.
#[derive(Clone, Debug)]
pub struct FrozenBase<F> {
    pub config: ModelConfig,
    /// Per code layer: `Some` for the layers being trained.
    pub layers: Vec<Option<FrozenLayer<F>>>,
    pub head: Head<F>,
    pub rope: RopeTable<F>,
    pub heads: Heads,
    pub eps: F,
}

impl<F: Real> FrozenBase<F> {
    /// Copy (as `F`) the weights of `layers`, the final norm and the head. MoE layers are refused.
    pub fn new(model: &Model, layers: impl IntoIterator<Item = usize>) -> Result<Self> {
        let config = &model.config;
        let mut out = vec![None; config.num_hidden_layers];
        for l in layers {
            let layer = &model.weights.layers[l];
            let FeedForward::Dense(mlp) = &layer.ffn else {
                return Err(Error::Unsupported(format!(
                    "layer {l} is a sparse MoE block: training adapters is implemented for dense \
                     (SwiGLU) models only"
                )));
            };
            let a = &layer.attn;
            let proj = [
                (Q, &a.q),
                (K, &a.k),
                (V, &a.v),
                (O, &a.o),
                (GATE, &mlp.gate),
                (UP, &mlp.up),
                (DOWN, &mlp.down),
            ]
            .into_iter()
            .map(|(t, lin)| (t, Frozen::from_reference(lin)))
            .collect();
            out[l] = Some(FrozenLayer {
                attn_norm: lift(layer.attn_norm.view()),
                mlp_norm: lift(layer.mlp_norm.view()),
                proj,
            });
        }
        Ok(FrozenBase {
            config: config.clone(),
            layers: out,
            head: Head::from_model(model),
            rope: RopeTable::new(config),
            heads: Heads::of(config),
            eps: F::c(config.rms_norm_eps),
        })
    }
}

/// One fast row: a position of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub sample: usize,
    pub pos: usize,
}

/// The rows of a batch and the samples they come from.
#[derive(Clone, Copy)]
pub struct Batch<'a, F> {
    pub samples: &'a [SlowSample<F>],
    pub rows: &'a [Row],
}

/// Activations of one layer kept for the backward.
pub struct LayerTape<F> {
    x: Array2<F>,
    inv1: Array1<F>,
    h1: Array2<F>,
    /// `x A^T` of each adapted projection
    xa: BTreeMap<Target, Array2<F>>,
    /// rotated
    q: Array2<F>,
    k: Array2<F>,
    v: Array2<F>,
    /// per row `[H, S+1]`
    probs: Vec<Array2<F>>,
    ctx: Array2<F>,
    x1: Array2<F>,
    inv2: Array2<F>,
    h2: Array2<F>,
    g: Array2<F>,
    u: Array2<F>,
    act: Array2<F>,
}

/// The saved activations of an interval forward.
pub struct IntervalTape<F> {
    layers: Vec<LayerTape<F>>,
}

impl<F> IntervalTape<F> {
    /// The fast states after each of the interval's layers but the last (`k_j - 1` of them,
    /// `[R, D]` each): what the intermediate alignment targets `s_{d_j(i)}` compare with.
    pub fn inner_states(&self) -> impl Iterator<Item = &Array2<F>> {
        self.layers.iter().skip(1).map(|t| &t.x)
    }
}

/// The visible slow K/V of `row` at layer `l`, plus its own key/value.
fn visible<'a, F: Real>(
    config: &ModelConfig,
    samples: &'a [SlowSample<F>],
    row: Row,
    l: usize,
    own_k: ndarray::ArrayView1<'a, F>,
    own_v: ndarray::ArrayView1<'a, F>,
) -> Visible<'a, F> {
    let (keys, values) = samples[row.sample].kv[l]
        .as_ref()
        .expect("the sample keeps the K/V of trained layers");
    let lo = window_start(config, row.pos);
    Visible {
        keys: keys.slice(s![lo..row.pos, ..]),
        values: values.slice(s![lo..row.pos, ..]),
        own_k,
        own_v,
    }
}

/// A per-position slow quantity (`[T, D]` of each sample, picked by `of`) at each row of the batch.
///
/// # Shapes
/// -> `[R, D]`
pub fn gather<'a, F: Real>(
    batch: Batch<'a, F>,
    of: impl Fn(&'a SlowSample<F>) -> &'a Array2<F>,
) -> Array2<F> {
    let Batch { samples, rows } = batch;
    let d = samples[0].last.ncols();
    let mut out = Array2::zeros((rows.len(), d));
    for (mut dst, row) in out.rows_mut().into_iter().zip(rows) {
        dst.assign(&of(&samples[row.sample]).row(row.pos));
    }
    out
}

/// The fast state entering interval `j`: `s_{e_j}` at each row.
///
/// # Shapes
/// -> `[R, D]`
pub fn start_states<F: Real>(batch: Batch<'_, F>, j: usize) -> Array2<F> {
    gather(batch, |s| {
        s.starts[j]
            .as_ref()
            .expect("the sample keeps the start of trained intervals")
    })
}

/// Run the layers `layers` (one interval) on the fast rows starting at `f`: the exit states
/// `u_{j+1}` and the tape for [`backward`].
///
/// # Shapes
/// - `f`: `[R, D]` -> `[R, D]`
pub fn forward<F: Real>(
    base: &FrozenBase<F>,
    adapters: &Adapters<F>,
    layers: Range<usize>,
    batch: Batch<'_, F>,
    mut f: Array2<F>,
) -> (Array2<F>, IntervalTape<F>) {
    let Batch { samples, rows } = batch;
    let positions: Vec<usize> = rows.iter().map(|r| r.pos).collect();
    let mut tapes = Vec::new();
    for l in layers {
        let w = base.layers[l].as_ref().expect("trained layer");
        let mut xa = BTreeMap::new();
        let mut project = |t: Target, x: ArrayView2<F>| {
            let (y, a) = linear::forward(x, &w.proj[&t], adapters.get(l, t), adapters.scale(l, t));
            if let Some(a) = a {
                xa.insert(t, a);
            }
            y
        };
        // attention rmsnorm, qkv, rope
        let (h1, inv1) = rmsnorm::forward(f.view(), w.attn_norm.view(), base.eps);
        let mut q = project(Q, h1.view());
        let mut k = project(K, h1.view());
        let v = project(V, h1.view());
        base.rope.forward(q.view_mut(), &positions);
        base.rope.forward(k.view_mut(), &positions);
        // attention over the slow cache plus the own row
        let per_row: Vec<(Array1<F>, Array2<F>)> = (0..rows.len())
            .into_par_iter()
            .map(|r| {
                let vis = visible(&base.config, samples, rows[r], l, k.row(r), v.row(r));
                attention::forward(base.heads, q.row(r), &vis)
            })
            .collect();
        let mut ctx = Array2::zeros(q.raw_dim());
        let mut probs = Vec::with_capacity(rows.len());
        for (r, (c, p)) in per_row.into_iter().enumerate() {
            ctx.row_mut(r).assign(&c);
            probs.push(p);
        }
        let x1 = &f + &project(O, ctx.view());
        // mlp rmsnorm, swiglu
        let (h2, inv2) = rmsnorm::forward(x1.view(), w.mlp_norm.view(), base.eps);
        let g = project(GATE, h2.view());
        let u = project(UP, h2.view());
        let act = swiglu::forward(g.view(), u.view());
        let x2 = &x1 + &project(DOWN, act.view());
        tapes.push(LayerTape {
            x: std::mem::replace(&mut f, x2),
            inv1,
            h1,
            xa,
            q,
            k,
            v,
            probs,
            ctx,
            x1,
            inv2: inv2.insert_axis(Axis(1)),
            h2,
            g,
            u,
            act,
        });
    }
    (f, IntervalTape { layers: tapes })
}

/// Gradients of the interval's adapters from `du` (the gradient of the exit states) and
/// `d_inner` (gradients of the [inner states](IntervalTape::inner_states), in their order, or
/// none), accumulated into `grads` (which holds zeros or earlier gradients for every trained pair).
/// Returns the gradient of the interval's starting states (what the bridge's entry term gets).
///
/// # Shapes
/// - `du`: `[R, D]`, `d_inner`: `k_j - 1` or 0 of `[R, D]` -> `[R, D]`
#[allow(clippy::too_many_arguments)]
pub fn backward<F: Real>(
    base: &FrozenBase<F>,
    adapters: &Adapters<F>,
    layers: Range<usize>,
    batch: Batch<'_, F>,
    tape: &IntervalTape<F>,
    du: Array2<F>,
    d_inner: &[Array2<F>],
    grads: &mut Adapters<F>,
) -> Array2<F> {
    let Batch { samples, rows } = batch;
    let positions: Vec<usize> = rows.iter().map(|r| r.pos).collect();
    assert!(
        d_inner.is_empty() || d_inner.len() + 1 == tape.layers.len(),
        "one gradient per inner state"
    );
    let mut dx = du;
    for (i, (l, t)) in layers.zip(&tape.layers).enumerate().rev() {
        // dx is the gradient of this layer's output; an inner state's own term joins it here (the
        // last layer's output is the exit state, whose gradient is `du`)
        if let Some(d) = d_inner.get(i) {
            dx += d;
        }
        let w = base.layers[l].as_ref().expect("trained layer");
        let mut back = |target: Target, dy: ArrayView2<F>, x: ArrayView2<F>| {
            let lora = adapters.get(l, target);
            let (d_in, g) = linear::backward(
                dy,
                x,
                t.xa.get(&target),
                &w.proj[&target],
                lora,
                adapters.scale(l, target),
            );
            if let Some(g) = g {
                let acc = grads.pairs.get_mut(&(l, target)).expect("gradient slot");
                acc.a += &g.a;
                acc.b += &g.b;
            }
            d_in
        };
        // x2 = x1 + down(silu(gate(h2)) * up(h2))
        let d_act = back(DOWN, dx.view(), t.act.view());
        let (dg, d_up) = swiglu::backward(d_act.view(), t.g.view(), t.u.view());
        let dh2 = back(GATE, dg.view(), t.h2.view()) + back(UP, d_up.view(), t.h2.view());
        let inv2 = t.inv2.column(0);
        let dx1 = &dx + &rmsnorm::backward(dh2.view(), t.x1.view(), w.mlp_norm.view(), inv2).0;
        // x1 = x + o(attn(q, k, v))
        let d_ctx = back(O, dx1.view(), t.ctx.view());
        let grads_rows: Vec<attention::RowGrad<F>> = (0..rows.len())
            .into_par_iter()
            .map(|r| {
                let vis = visible(&base.config, samples, rows[r], l, t.k.row(r), t.v.row(r));
                attention::backward(
                    base.heads,
                    d_ctx.row(r),
                    t.q.row(r),
                    &vis,
                    t.probs[r].view(),
                )
            })
            .collect();
        let mut dq = Array2::zeros(t.q.raw_dim());
        let mut dk = Array2::zeros(t.k.raw_dim());
        let mut dv = Array2::zeros(t.v.raw_dim());
        for (r, g) in grads_rows.into_iter().enumerate() {
            dq.row_mut(r).assign(&g.dq);
            dk.row_mut(r).assign(&g.dk_own);
            dv.row_mut(r).assign(&g.dv_own);
        }
        base.rope.backward(dq.view_mut(), &positions);
        base.rope.backward(dk.view_mut(), &positions);
        let dh1 = back(Q, dq.view(), t.h1.view())
            + back(K, dk.view(), t.h1.view())
            + back(V, dv.view(), t.h1.view());
        dx = &dx1 + &rmsnorm::backward(dh1.view(), t.x.view(), w.attn_norm.view(), t.inv1.view()).0;
    }
    dx
}
