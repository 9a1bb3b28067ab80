//! The static `draft.onnx` with merged adapters (`export --static-cache L --merge-adapters`): the
//! same function as [`static_draft_layer`](crate::emit::static_draft::static_draft_layer), in
//! about a third of the nodes, for providers whose step costs one kernel launch per node (ONNX
//! Runtime CUDA with CUDA graphs: docs/GPU.md).
//!
//! The slow and fast rows are stacked along the batch axis, `x = [s; f]` (`[2, 1, T, D]`: stream 0
//! slow, stream 1 fast), and every projection is one `MatMul` over both streams with a stacked
//! weight `[W; W']`, where the fast stream's weight has its adapter merged in:
//!
//! ```text
//! W' = W + c B A                    (computed in f64, rounded once to f32)
//! x  = [s; f]                                              [2, 1, T, D]
//! h  = RMSNormalization(x)                                 both streams, one node
//! q,k,v = h @ [W; W']_heads (+ b)                          [2, n, T, Dh]
//! q,k   = RotaryEmbedding(q|k, cos, sin, [pos; pos])
//! K,V   = TensorScatter(past, k_s|v_s, write_indices)      the slow rows write the buffer
//! y_s   = Attention(q_s, K, V, attn_mask)
//! y_f   = Attention(q_f, K ++ k_f, V ++ v_f, fast_attn_mask)
//! x    += ReduceSum_heads([y_s; y_f] @ [W_o; W_o']_heads)
//! x    += FFN(RMSNormalization(x)) with [W; W'] per projection
//! ```
//!
//! `W' x` differs from the reference's `W x + c B (A x)` only by rounding (the order of the sums),
//! within the runner's tolerance like every other ONNX Runtime result; the dense layers' weights
//! are read twice (once per stream), so on a memory-bound CPU a draft step reads more bytes than
//! the adapter form does. Dense layers only: a mixture-of-experts layer is refused.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::layer::norm_weights;
use crate::emit::ops::swiglu;
use crate::emit::static_draft::fast_attention;
use crate::emit::static_layer::{
    HEADS, StaticContext, TRANSPOSED, attention, heads_in, heads_out, proj_heads,
    project_heads_with, project_mlp_with, project_o_with, rms_normalization, scatter,
};
use ndarray::{Array2, ArrayD, Axis, stack};
use reference::base::config::ModelConfig;
use reference::base::weight_names::{AttnProj, MlpProj, Target};
use reference::base::weights::{FeedForward, Linear};
use reference::m2r2::accelerator::Accelerator;

/// Suffix of a stacked weight `[W; W']` (stream 0 slow, stream 1 with the adapter merged).
pub const STREAMS: &str = ".streams";

/// What a stacked draft layer produced.
pub struct StackedDraftOutput {
    /// `[2, 1, T, D]`: the slow and fast residuals, stacked
    pub x: String,
    /// `[1, Hkv, L, Dh]`: the buffers with the slow rows written
    pub present_key: String,
    pub present_value: String,
}

/// The fast stream's weight of `target` in layer `l`: `W + c B A` (`[out, in]`), in f64 then
/// rounded once; `W` itself where the layer has no adapter there or it is exactly zero.
pub fn merged(acc: &Accelerator, l: usize, target: Target, w: &Array2<f32>) -> Array2<f32> {
    let Some(lora) = acc.lora(l, target).filter(|lora| !lora.is_zero()) else {
        return w.clone();
    };
    let c = f64::from(acc.scale(lora));
    let a = lora.a().mapv(f64::from);
    let b = lora.b().mapv(f64::from);
    let delta = b.dot(&a);
    ndarray::Zip::from(w)
        .and(&delta)
        .map_collect(|&w, &d| (f64::from(w) + c * d) as f32)
}

/// `[slow; fast]` stacked along a new first axis.
fn streams(slow: ArrayD<f32>, fast: ArrayD<f32>) -> ArrayD<f32> {
    stack(Axis(0), &[slow.view(), fast.view()]).expect("the two streams have one shape")
}

/// `h @ [W; W']_heads (+ b)` for q, k or v: `[2, 1, T, D]` -> `[2, n, T, Dh]` (the same bias on
/// both streams).
fn project_heads(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    acc: &Accelerator,
    l: usize,
    p: AttnProj,
    lin: &Linear,
    h: &str,
) -> String {
    let heads = proj_heads(config, p);
    let dh = config.head_dim;
    let fast = merged(acc, l, Target::Attn(p), &lin.w);
    let w = streams(heads_in(&lin.w, heads, dh), heads_in(&fast, heads, dh));
    project_heads_with(b, config, l, p, lin, h, (&format!("{HEADS}{STREAMS}"), w))
}

/// `o_proj` of both streams: `[2, H, T, Dh]` -> `[2, 1, T, D]`.
fn project_o(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    acc: &Accelerator,
    l: usize,
    o: &Linear,
    y: &str,
) -> String {
    let (heads, dh) = (config.num_attention_heads, config.head_dim);
    let fast = merged(acc, l, Target::Attn(AttnProj::O), &o.w);
    let w = streams(heads_out(&o.w, heads, dh), heads_out(&fast, heads, dh));
    project_o_with(b, l, o, y, (&format!("{HEADS}{STREAMS}"), w))
}

/// An MLP projection of both streams, `[W^T; W'^T]` stored `[2, 1, in, out]`: `[2, 1, T, in]` ->
/// `[2, 1, T, out]`.
fn project_mlp(
    b: &mut GraphBuilder,
    acc: &Accelerator,
    l: usize,
    p: MlpProj,
    lin: &Linear,
    x: &str,
) -> String {
    let fast = merged(acc, l, Target::Mlp(p), &lin.w);
    let t = |w: &Array2<f32>| w.t().as_standard_layout().to_owned().insert_axis(Axis(0));
    let w = streams(t(&lin.w).into_dyn(), t(&fast).into_dyn());
    project_mlp_with(b, l, p, lin, x, (&format!("{TRANSPOSED}{STREAMS}"), w))
}

/// `(slow, fast)` halves of a stacked `[2, ...]`.
pub(crate) fn unstack(b: &mut GraphBuilder, x: &str) -> (String, String) {
    let mut parts = b.node_n(
        "Split",
        &[x],
        2,
        vec![("axis", Attr::Int(0)), ("num_outputs", Attr::Int(2))],
    );
    let fast = parts.pop().expect("two streams");
    (parts.pop().expect("two streams"), fast)
}

/// Layer `l` on the stacked residual `x` (`[2, 1, T, D]`) in the scope `layers.{l}`; `positions`:
/// the graph's `position_ids` stacked for both streams (`[2, T]`).
///
/// # Panics
/// If layer `l` is a mixture of experts (`graphs::check` refuses that first).
pub fn stacked_draft_layer(
    b: &mut GraphBuilder,
    cx: &StaticContext<'_>,
    l: usize,
    x: &str,
    positions: &str,
    acc: &Accelerator,
    (past_key, past_value): (&str, &str),
) -> StackedDraftOutput {
    let config = &cx.model.config;
    let layer = &cx.model.weights.layers[l];
    let eps = config.rms_norm_eps as f32;
    let fast_mask = cx
        .fast_attn_mask
        .expect("a draft layer's context has the fast rows' mask");
    let FeedForward::Dense(m) = &layer.ffn else {
        panic!("stacked_draft_layer: layer {l} is a mixture of experts");
    };
    let rope = |b: &mut GraphBuilder, y: &str| {
        b.scoped("rope", |b| {
            b.node(
                "RotaryEmbedding",
                &[y, cx.cos_cache, cx.sin_cache, positions],
                vec![("interleaved", Attr::Int(0))],
            )
        })
    };
    b.scoped(&format!("layers.{l}"), |b| {
        let (attn_norm, mlp_norm) = norm_weights(b, l, layer);
        let a = &layer.attn;
        let (x, present_key, present_value) = b.scoped("attn", |b| {
            let h = b.scoped("input_layernorm", |b| {
                rms_normalization(b, x, &attn_norm, eps)
            });
            let q = project_heads(b, config, acc, l, AttnProj::Q, &a.q, &h);
            let k = project_heads(b, config, acc, l, AttnProj::K, &a.k, &h);
            let v = project_heads(b, config, acc, l, AttnProj::V, &a.v, &h);
            let (q, k) = (rope(b, &q), rope(b, &k));
            let [(q_s, q_f), (k_s, k_f), (v_s, v_f)] = [&q, &k, &v].map(|y| unstack(b, y));
            let present_key = scatter(b, cx, past_key, &k_s);
            let present_value = scatter(b, cx, past_value, &v_s);
            let y_s = attention(b, config, &q_s, &present_key, &present_value, cx.attn_mask);
            let y_f = fast_attention(
                b,
                config,
                &q_f,
                (&present_key, &present_value),
                (&k_f, &v_f),
                fast_mask,
            );
            let y = b.node("Concat", &[&y_s, &y_f], vec![("axis", Attr::Int(0))]);
            let o = project_o(b, config, acc, l, &a.o, &y);
            (b.binary("Add", x, &o), present_key, present_value)
        });
        let h = b.scoped("post_attention_layernorm", |b| {
            rms_normalization(b, &x, &mlp_norm, eps)
        });
        let y = b.scoped("mlp", |b| {
            let gate = project_mlp(b, acc, l, MlpProj::Gate, &m.gate, &h);
            let up = project_mlp(b, acc, l, MlpProj::Up, &m.up, &h);
            let act = swiglu(b, &gate, &up);
            project_mlp(b, acc, l, MlpProj::Down, &m.down, &act)
        });
        StackedDraftOutput {
            x: b.binary("Add", &x, &y),
            present_key,
            present_value,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array;
    use reference::m2r2::accelerator::{LayerAdapter, Lora};

    /// `W' x` equals the reference's `W x + c B (A x)` (an independent product order) to f32
    /// rounding, and a missing adapter leaves `W` bitwise.
    #[test]
    fn merged_weights_compute_the_adapted_projection() {
        let (out, inp, r) = (5, 7, 3);
        let w = Array::from_shape_fn((out, inp), |(i, j)| {
            ((i * 7 + j * 3) % 11) as f32 / 5.0 - 1.0
        });
        let a = Array::from_shape_fn((r, inp), |(i, j)| ((i * 5 + j) % 7) as f32 / 7.0 - 0.4);
        let bm = Array::from_shape_fn((out, r), |(i, j)| ((i + 3 * j) % 5) as f32 / 4.0 - 0.5);
        let x = Array::from_shape_fn((2, inp), |(t, j)| (t as f32 + 1.0) * (j as f32 - 3.0) / 4.0);
        let lora = Lora::new(a.clone(), bm.clone(), 6.0); // c = 6 / 3 = 2
        let target = Target::Mlp(MlpProj::Up);
        let acc = Accelerator {
            rank: r,
            alpha: 6.0,
            use_rslora: false,
            targets: vec![target],
            layers: vec![Some(LayerAdapter {
                loras: [(target, lora)].into_iter().collect(),
            })],
        };
        let wm = merged(&acc, 0, Target::Mlp(MlpProj::Up), &w);
        let got = x.dot(&wm.t());
        let want = x.dot(&w.t()) + 2.0 * x.dot(&a.t()).dot(&bm.t());
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() <= 1e-5 * e.abs().max(1.0), "{g} vs {e}");
        }
        assert_eq!(merged(&acc, 0, Target::Mlp(MlpProj::Gate), &w), w);
        assert_eq!(merged(&acc, 1, Target::Mlp(MlpProj::Up), &w), w);
    }
}
