//! One decoder layer of a static-cache graph (`export --static-cache L`, docs/ONNX.md "Static
//! exports"): the reference's `layer::decoder_layer` on slow rows only, written with the opset-23/24
//! LLM operators so that a step is about 19 nodes per layer and the cache is a fixed buffer written
//! in place.
//!
//! ```text
//! h      = RMSNormalization(s)                               [B, 1, T, D]
//! q,k,v  = Split(h @ W_qkv_heads (+ b))                      [B, H|Hkv, T, Dh]
//!          (verifier.onnx: Split(Transpose(Reshape(h @ W_qkv^T (+ b)))), one GEMM)
//! q,k    = RotaryEmbedding(q|k, cos, sin, position_ids)
//! K,V    = TensorScatter(past, k|v, write_indices)           [B, Hkv, L, Dh]  (the layer's present)
//! y      = Attention(q, K, V, attn_mask)                     [B, H, T, Dh]    (GQA: head i reads i / G)
//! s     += ReduceSum_heads(y @ Wo_heads) (+ b_o)             [B, 1, T, D]
//! s     += FFN(RMSNormalization(s))                          (SwiGLU: g * Sigmoid(g) * u; MoE as moe.rs)
//! ```
//!
//! The residual stream is 4-D, `[B, 1, T, D]`, so each projection broadcasts over the heads of a
//! weight stored head-major (`[H, D, Dh]`; q, k and v stacked as `[H + 2 Hkv, D, Dh]`, one
//! product, then split): no `Reshape` / `Transpose` between the projections and the 4-D
//! `Attention` (the form TensorRT's parser maps onto its attention layer). verifier.onnx, whose
//! chunks have several rows, computes q, k and v as one GEMM instead (`project_qkv`), then
//! reshapes and transposes them head-major. Weights are stored in the layouts the `MatMul`s read,
//! under their name plus a suffix ([`HEADS`], [`QKV_HEADS`], [`TRANSPOSED`]), so the written graph
//! has no weight-side nodes either.
//!
//! SiLU is written `g * Sigmoid(g)` ([`swiglu`]), not opset 24's `Swish`: ONNX Runtime 1.31 has
//! no `Swish` kernel and inlines its function body (`Cast`, `Mul`, `Sigmoid`, `Mul`: four kernels
//! a layer at run time, though one node in the file), while it fuses `g * Sigmoid(g)` into one
//! `QuickGelu` kernel on the CPU and CUDA providers (docs/STATIC.md, "Nodes at run time").

use crate::builder::{Attr, GraphBuilder};
use crate::emit::layer::norm_weights;
use crate::emit::moe::moe_block;
use crate::emit::ops::swiglu;
use ndarray::{Array1, Array2, Array3, ArrayD};
use reference::base::config::ModelConfig;
use reference::base::model::Model;
use reference::base::weight_names::{AttnProj, MlpProj, WeightId};
use reference::base::weights::{FeedForward, Linear};

/// Suffix of a head-major projection weight: q/k/v `[H, D, Dh]`, o `[H, Dh, D]`.
pub const HEADS: &str = ".heads";
/// Suffix of a transposed projection weight `W^T` (`[in, out]`): the MLP's.
pub const TRANSPOSED: &str = ".transposed";

/// What every layer of a static graph shares.
pub struct StaticContext<'a> {
    pub model: &'a Model,
    /// f32 `[L, Dh/2]` each: `cos` / `sin` of `p * inv_freq` for positions `0..L`
    pub cos_cache: &'a str,
    pub sin_cache: &'a str,
    /// int64 `[B, T]`
    pub position_ids: &'a str,
    /// f32 `[B, 1, T, L]`, additive: 0 where a row sees a key, `f32::MIN` elsewhere
    pub attn_mask: &'a str,
    /// int64 `[B]`: the cache position of each batch row's first row in this run
    pub write_indices: &'a str,
    /// f32 `[B, 1, T, L + T]`, additive, draft.onnx only: the fast rows' view of the buffer and of
    /// their own keys (`static_draft`)
    pub fast_attn_mask: Option<&'a str>,
    /// q, k and v, and o, as plain GEMMs over the chunk's rows (`project_qkv`, `project_o_rows`:
    /// verifier.onnx, whose chunks have several rows), else products broadcast over the heads
    /// (`project_qkv_heads`, `project_o`: fewer nodes, as fast for one row)
    pub row_gemms: bool,
}

/// What a static layer produced.
pub struct StaticLayerOutput {
    /// `[B, 1, T, D]`
    pub s: String,
    /// `[B, Hkv, L, Dh]`: the past buffers with this run's rows written (TensorScatter's outputs)
    pub present_key: String,
    pub present_value: String,
}

/// `W [n*Dh, D]` (q/k/v) as `[n, D, Dh]`, so `h [B, 1, T, D] @ W` is `[B, n, T, Dh]`.
pub(crate) fn heads_in(w: &Array2<f32>, heads: usize, dh: usize) -> ArrayD<f32> {
    let d = w.ncols();
    let w3: Array3<f32> = w
        .to_owned()
        .into_shape_with_order((heads, dh, d))
        .expect("rows = heads * Dh");
    w3.permuted_axes([0, 2, 1])
        .as_standard_layout()
        .to_owned()
        .into_dyn()
}

/// `[X, Y]` transposed into a standard-layout `[Y, X]`: a `W^T` weight stored under [`TRANSPOSED`].
pub(crate) fn transposed(w: &Array2<f32>) -> ArrayD<f32> {
    w.t().as_standard_layout().to_owned().into_dyn()
}

/// `W_o [D, H*Dh]` as `[H, Dh, D]`, so `y [B, H, T, Dh] @ W` summed over heads is `y W_o^T`.
pub(crate) fn heads_out(w: &Array2<f32>, heads: usize, dh: usize) -> ArrayD<f32> {
    let d = w.nrows();
    w.t()
        .as_standard_layout()
        .to_owned()
        .into_shape_with_order((heads, dh, d))
        .expect("columns = heads * Dh")
        .into_dyn()
}

/// A bias `[n*Dh]` as `[n, 1, Dh]` (added to `[B, n, T, Dh]`).
pub(crate) fn heads_bias(b: &Array1<f32>, heads: usize, dh: usize) -> ArrayD<f32> {
    b.to_owned()
        .into_shape_with_order((heads, 1, dh))
        .expect("length = heads * Dh")
        .into_dyn()
}

/// The heads of a q, k or v projection: the query heads for q, the key/value heads otherwise.
pub(crate) fn proj_heads(config: &ModelConfig, p: AttnProj) -> usize {
    match p {
        AttnProj::Q => config.num_attention_heads,
        _ => config.num_key_value_heads,
    }
}

/// `h @ W_heads (+ b)` for q, k or v of layer `l`: `[B, 1, T, D]` -> `[B, n, T, Dh]`.
pub(crate) fn project_heads(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    l: usize,
    p: AttnProj,
    lin: &Linear,
    h: &str,
) -> String {
    let heads = proj_heads(config, p);
    let w = heads_in(&lin.w, heads, config.head_dim);
    project_heads_with(b, config, l, p, lin, h, (HEADS, w))
}

/// [`project_heads`] with the weight given: `w` stored under the projection's name plus `suffix`
/// (the merged-adapter draft's stacked `[2, n, D, Dh]`); the bias `[n, 1, Dh]` broadcasts over
/// any leading axes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project_heads_with(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    l: usize,
    p: AttnProj,
    lin: &Linear,
    h: &str,
    (suffix, w): (&str, ArrayD<f32>),
) -> String {
    let heads = proj_heads(config, p);
    let dh = config.head_dim;
    b.scoped(p.module(), |b| {
        let name = WeightId::Attn(l, p).onnx_name() + suffix;
        let w = b.weight(&name, w.view());
        let y = b.binary("MatMul", h, &w);
        match &lin.b {
            Some(bias) => {
                let name = WeightId::AttnBias(l, p).onnx_name() + HEADS;
                let bias = b.weight(&name, heads_bias(bias, heads, dh).view());
                b.binary("Add", &y, &bias)
            }
            None => y,
        }
    })
}

/// Suffix of the fused q/k/v weight `[D, (H + 2 Hkv) Dh]` (`W_q^T | W_k^T | W_v^T`).
pub const QKV: &str = ".qkv_fused";
/// Suffix of the stacked head-major q/k/v weight `[H + 2 Hkv, D, Dh]` (q's heads, k's, v's).
pub const QKV_HEADS: &str = ".qkv_heads";

/// The q, k and v projections of a layer with their head counts (`H`, `Hkv`, `Hkv`).
fn qkv_parts<'a>(
    config: &ModelConfig,
    attn: &'a reference::base::weights::Attention,
) -> [(&'a Linear, usize); 3] {
    let (h, hkv) = (config.num_attention_heads, config.num_key_value_heads);
    [(&attn.q, h), (&attn.k, hkv), (&attn.v, hkv)]
}

/// q, k and v's biases end to end, `[(H + 2 Hkv) Dh]` (zeros for a projection without one);
/// `None` when none has one.
fn qkv_bias(parts: &[(&Linear, usize); 3], dh: usize) -> Option<Vec<f32>> {
    parts.iter().any(|(lin, _)| lin.b.is_some()).then(|| {
        parts
            .iter()
            .flat_map(|(lin, n)| match &lin.b {
                Some(b) => b.to_vec(),
                None => vec![0.0; n * dh],
            })
            .collect()
    })
}

/// `[B, H + 2 Hkv, T, Dh]` split along the heads into q `[B, H, T, Dh]`, k and v `[B, Hkv, T, Dh]`.
fn split_qkv(b: &mut GraphBuilder, config: &ModelConfig, y: &str) -> (String, String, String) {
    let (h, hkv) = (config.num_attention_heads, config.num_key_value_heads);
    let sizes = b.const_i64(&[h as i64, hkv as i64, hkv as i64]);
    let mut qkv = b.node_n("Split", &[y, &sizes], 3, vec![("axis", Attr::Int(1))]);
    let v = qkv.pop().expect("three parts");
    let k = qkv.pop().expect("three parts");
    (qkv.pop().expect("three parts"), k, v)
}

/// q, k and v of layer `l` as one product: `h @ [W_q; W_k; W_v]^T (+ [b_q; b_k; b_v])` `[B, 1, T,
/// (H + 2 Hkv) Dh]`, reshaped to `[B, T, H + 2 Hkv, Dh]`, transposed to `[B, H + 2 Hkv, T, Dh]`
/// and split into q `[B, H, T, Dh]`, k and v `[B, Hkv, T, Dh]`. One GEMM of `T` rows instead of
/// a product broadcast over the heads: cuBLAS serves the broadcast form badly for 2-16 rows
/// (docs/GPU.md, `scripts/gpu/gemm_shapes.py`: 5.5x the one-row time on an H100, the plain form
/// 1.8x).
pub(crate) fn project_qkv(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    l: usize,
    attn: &reference::base::weights::Attention,
    x: &str,
) -> (String, String, String) {
    let (n, dh) = (
        config.num_attention_heads + 2 * config.num_key_value_heads,
        config.head_dim,
    );
    let parts = qkv_parts(config, attn);
    let w: Vec<ndarray::ArrayView2<f32>> = parts.iter().map(|(lin, _)| lin.w.t()).collect();
    let fused = ndarray::concatenate(ndarray::Axis(1), &w)
        .expect("q, k and v read the same hidden size")
        .as_standard_layout()
        .to_owned()
        .into_dyn();
    let name = WeightId::Attn(l, AttnProj::Q).onnx_name() + QKV;
    let weight = b.weight(&name, fused.view());
    let bias = qkv_bias(&parts, dh).map(|all| {
        let name = WeightId::AttnBias(l, AttnProj::Q).onnx_name() + QKV;
        b.weight(&name, ndarray::Array1::from(all).view().into_dyn())
    });
    b.scoped("qkv_proj", |b| {
        let y = b.binary("MatMul", x, &weight); // [B, 1, T, (H + 2 Hkv) Dh]
        let y = match &bias {
            Some(bias) => b.binary("Add", &y, bias),
            None => y,
        };
        let shape = b.const_i64(&[0, -1, n as i64, dh as i64]);
        let y = b.binary("Reshape", &y, &shape); // [B, T, H + 2 Hkv, Dh]
        let y = b.node(
            "Transpose",
            &[&y],
            vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))],
        ); // [B, H + 2 Hkv, T, Dh]
        split_qkv(b, config, &y)
    })
}

/// q, k and v of layer `l` as one product broadcast over the heads of all three: `h [B, 1, T, D]
/// @ [W_q; W_k; W_v]_heads [H + 2 Hkv, D, Dh] (+ b)` is `[B, H + 2 Hkv, T, Dh]`, split into q, k
/// and v. Two nodes (three with biases) where three separate products took three: model.onnx and
/// feed.onnx, whose steps are one row (the form cuBLAS serves well there, [`project_qkv`]).
pub(crate) fn project_qkv_heads(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    l: usize,
    attn: &reference::base::weights::Attention,
    x: &str,
) -> (String, String, String) {
    let dh = config.head_dim;
    let parts = qkv_parts(config, attn);
    let w: Vec<ArrayD<f32>> = parts
        .iter()
        .map(|(lin, n)| heads_in(&lin.w, *n, dh))
        .collect();
    let views: Vec<_> = w.iter().map(|w| w.view()).collect();
    let stacked = ndarray::concatenate(ndarray::Axis(0), &views)
        .expect("q, k and v read the same hidden size");
    let name = WeightId::Attn(l, AttnProj::Q).onnx_name() + QKV_HEADS;
    let weight = b.weight(&name, stacked.view());
    let bias = qkv_bias(&parts, dh).map(|all| {
        let heads = all.len() / dh;
        let name = WeightId::AttnBias(l, AttnProj::Q).onnx_name() + QKV_HEADS;
        let bias = heads_bias(&ndarray::Array1::from(all), heads, dh);
        b.weight(&name, bias.view())
    });
    b.scoped("qkv_proj", |b| {
        let y = b.binary("MatMul", x, &weight); // [B, H + 2 Hkv, T, Dh]
        let y = match &bias {
            Some(bias) => b.binary("Add", &y, bias),
            None => y,
        };
        split_qkv(b, config, &y)
    })
}

/// `x W^T (+ b)` with `W^T` stored transposed (no `Transpose` node): `[..., in]` -> `[..., out]`.
pub(crate) fn project_mlp(
    b: &mut GraphBuilder,
    l: usize,
    p: MlpProj,
    lin: &Linear,
    x: &str,
) -> String {
    project_mlp_with(b, l, p, lin, x, (TRANSPOSED, transposed(&lin.w)))
}

/// [`project_mlp`] with the weight given: `w` stored under the projection's name plus `suffix`.
pub(crate) fn project_mlp_with(
    b: &mut GraphBuilder,
    l: usize,
    p: MlpProj,
    lin: &Linear,
    x: &str,
    (suffix, w): (&str, ArrayD<f32>),
) -> String {
    b.scoped(p.module(), |b| {
        let name = WeightId::Mlp(l, p).onnx_name() + suffix;
        let w = b.weight(&name, w.view());
        let y = b.binary("MatMul", x, &w);
        match &lin.b {
            Some(bias) => {
                let bias = b.weight(&WeightId::MlpBias(l, p).onnx_name(), bias.view().into_dyn());
                b.binary("Add", &y, &bias)
            }
            None => y,
        }
    })
}

/// `RMSNormalization` (opset 23) over the last axis: `w * x / sqrt(mean(x^2) + eps)`.
///
/// # Shapes
/// - `x`: `[..., D]`, `w`: `[D]` -> `[..., D]`
pub fn rms_normalization(b: &mut GraphBuilder, x: &str, w: &str, eps: f32) -> String {
    b.node(
        "RMSNormalization",
        &[x, w],
        vec![("axis", Attr::Int(-1)), ("epsilon", Attr::Float(eps))],
    )
}

/// `RotaryEmbedding` (opset 23, rotate-half) of `x` `[B, n, T, Dh]` at the graph's `position_ids`.
pub(crate) fn rope(b: &mut GraphBuilder, cx: &StaticContext<'_>, x: &str) -> String {
    b.scoped("rope", |b| {
        b.node(
            "RotaryEmbedding",
            &[x, cx.cos_cache, cx.sin_cache, cx.position_ids],
            vec![("interleaved", Attr::Int(0))],
        )
    })
}

/// This run's rows `[B, Hkv, T, Dh]` written into the fixed buffer `past` `[B, Hkv, L, Dh]` at
/// `write_indices`, along `L`: axis -2 (= 2 here; written -2, the only axis TensorRT's parser
/// takes). The result is the layer's present.
pub(crate) fn scatter(
    b: &mut GraphBuilder,
    cx: &StaticContext<'_>,
    past: &str,
    rows: &str,
) -> String {
    b.node(
        "TensorScatter",
        &[past, rows, cx.write_indices],
        vec![("axis", Attr::Int(-2)), ("mode", Attr::Str("linear"))],
    )
}

/// `Attention` (opset 23/24) with grouped-query heads (head `i` reads `i / G`) and an additive
/// mask, 4-D, no past inputs (the form TensorRT's parser takes).
///
/// # Shapes
/// - `q` `[B, H, T, Dh]`, `k`, `v` `[B, Hkv, S, Dh]`, `mask` `[B, 1, T, S]` -> `[B, H, T, Dh]`
pub(crate) fn attention(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    q: &str,
    k: &str,
    v: &str,
    mask: &str,
) -> String {
    b.node(
        "Attention",
        &[q, k, v, mask],
        vec![
            ("q_num_heads", Attr::Int(config.num_attention_heads as i64)),
            ("kv_num_heads", Attr::Int(config.num_key_value_heads as i64)),
        ],
    )
}

/// `o_proj`: each head's `y @ W_o[head]` summed over the heads (+ bias).
///
/// # Shapes
/// - `y`: `[B, H, T, Dh]` -> `[B, 1, T, D]`
pub(crate) fn project_o(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    l: usize,
    o: &Linear,
    y: &str,
) -> String {
    let w = heads_out(&o.w, config.num_attention_heads, config.head_dim);
    project_o_with(b, l, o, y, (HEADS, w))
}

/// [`project_o`] with the weight given: `w` stored under o's name plus `suffix` (the
/// merged-adapter draft's stacked `[2, H, Dh, D]`).
pub(crate) fn project_o_with(
    b: &mut GraphBuilder,
    l: usize,
    o: &Linear,
    y: &str,
    (suffix, w): (&str, ArrayD<f32>),
) -> String {
    b.scoped(AttnProj::O.module(), |b| {
        let name = WeightId::Attn(l, AttnProj::O).onnx_name() + suffix;
        let w = b.weight(&name, w.view());
        let per_head = b.binary("MatMul", y, &w); // [B, H, T, D]
        let axis1 = b.const_i64(&[1]);
        let summed = b.node(
            "ReduceSum",
            &[&per_head, &axis1],
            vec![("keepdims", Attr::Int(1))],
        ); // [B, 1, T, D]
        add_o_bias(b, l, o, summed)
    })
}

/// `x + b_o` where o has a bias, else `x`.
fn add_o_bias(b: &mut GraphBuilder, l: usize, o: &Linear, x: String) -> String {
    match &o.b {
        Some(bias) => {
            let name = WeightId::AttnBias(l, AttnProj::O).onnx_name();
            let bias = b.weight(&name, bias.view().into_dyn());
            b.binary("Add", &x, &bias)
        }
        None => x,
    }
}

/// `o_proj` as one GEMM of the chunk's rows: `y` transposed to `[B, T, H, Dh]`, reshaped to `[B,
/// 1, T, H Dh]` and multiplied by `W_o^T` (stored transposed) (+ bias). Two nodes more than
/// [`project_o`], for verifier.onnx: with several rows the head-broadcast product and its
/// `ReduceSum` cost ONNX Runtime's CPU provider about twice the GEMM (docs/STATIC.md), and cuBLAS
/// serves the broadcast form badly there ([`project_qkv`]).
///
/// # Shapes
/// - `y`: `[B, H, T, Dh]` -> `[B, 1, T, D]`
pub(crate) fn project_o_rows(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    l: usize,
    o: &Linear,
    y: &str,
) -> String {
    let wt = transposed(&o.w);
    let width = (config.num_attention_heads * config.head_dim) as i64;
    b.scoped(AttnProj::O.module(), |b| {
        let name = WeightId::Attn(l, AttnProj::O).onnx_name() + TRANSPOSED;
        let w = b.weight(&name, wt.view());
        let rows = b.node(
            "Transpose",
            &[y],
            vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))],
        ); // [B, T, H, Dh]
        let shape = b.const_i64(&[0, 1, -1, width]);
        let rows = b.binary("Reshape", &rows, &shape); // [B, 1, T, H Dh]
        let out = b.binary("MatMul", &rows, &w); // [B, 1, T, D]
        add_o_bias(b, l, o, out)
    })
}

/// Layer `l` in the scope `layers.{l}`.
///
/// # Shapes
/// - `s`: `[B, 1, T, D]`, `past_*`: `[B, Hkv, L, Dh]` -> `s` `[B, 1, T, D]`, presents `[B, Hkv, L, Dh]`
pub fn static_decoder_layer(
    b: &mut GraphBuilder,
    cx: &StaticContext<'_>,
    l: usize,
    s: &str,
    past_key: &str,
    past_value: &str,
) -> StaticLayerOutput {
    let config = &cx.model.config;
    let layer = &cx.model.weights.layers[l];
    let eps = config.rms_norm_eps as f32;
    b.scoped(&format!("layers.{l}"), |b| {
        let (attn_norm, mlp_norm) = norm_weights(b, l, layer);
        let a = &layer.attn;

        // attention
        let (s, present_key, present_value) = b.scoped("attn", |b| {
            let h = b.scoped("input_layernorm", |b| {
                rms_normalization(b, s, &attn_norm, eps)
            });
            // [B, H, T, Dh], [B, Hkv, T, Dh] twice
            let (q, k, v) = match cx.row_gemms {
                true => project_qkv(b, config, l, a, &h),
                false => project_qkv_heads(b, config, l, a, &h),
            };
            let q = rope(b, cx, &q);
            let k = rope(b, cx, &k);
            let present_key = scatter(b, cx, past_key, &k);
            let present_value = scatter(b, cx, past_value, &v);
            let y = attention(b, config, &q, &present_key, &present_value, cx.attn_mask);
            let o = match cx.row_gemms {
                true => project_o_rows(b, config, l, &a.o, &y),
                false => project_o(b, config, l, &a.o, &y),
            };
            (b.binary("Add", s, &o), present_key, present_value)
        });

        // feed-forward
        let h = b.scoped("post_attention_layernorm", |b| {
            rms_normalization(b, &s, &mlp_norm, eps)
        });
        let y = match &layer.ffn {
            FeedForward::Dense(m) => b.scoped("mlp", |b| {
                let gate = project_mlp(b, l, MlpProj::Gate, &m.gate, &h);
                let up = project_mlp(b, l, MlpProj::Up, &m.up, &h);
                let act = swiglu(b, &gate, &up);
                project_mlp(b, l, MlpProj::Down, &m.down, &act)
            }),
            FeedForward::Moe(moe) => moe_block(b, moe, l, config.hidden_size, &h, None).0,
        };
        StaticLayerOutput {
            s: b.binary("Add", &s, &y),
            present_key,
            present_value,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array, arr1};

    /// `h @ heads_in(W)` per head equals the head's slice of `h W^T`.
    #[test]
    fn head_major_layouts_compute_the_same_products() {
        let (heads, dh, d) = (2, 3, 4);
        let w = Array::from_shape_fn((heads * dh, d), |(i, j)| (i * 7 + j * 3) as f32 % 5.0 - 2.0);
        let h = arr1(&[1.0f32, -2.0, 0.5, 3.0]);
        let full = w.dot(&h); // [heads * dh]
        let wh = heads_in(&w, heads, dh);
        for n in 0..heads {
            for k in 0..dh {
                let got: f32 = (0..d).map(|j| h[j] * wh[[n, j, k]]).sum();
                assert_eq!(got, full[n * dh + k]);
            }
        }
        // o: y [heads * dh] -> W_o y, summed over heads of y_n @ heads_out(W_o)[n]
        let wo = Array::from_shape_fn((d, heads * dh), |(i, j)| (i + 2 * j) as f32 % 3.0 - 1.0);
        let y = Array::from_shape_fn(heads * dh, |i| i as f32 - 2.5);
        let want = wo.dot(&y);
        let who = heads_out(&wo, heads, dh);
        for out in 0..d {
            let got: f32 = (0..heads)
                .map(|n| {
                    (0..dh)
                        .map(|k| y[n * dh + k] * who[[n, k, out]])
                        .sum::<f32>()
                })
                .sum();
            assert_eq!(got, want[out]);
        }
    }
}
