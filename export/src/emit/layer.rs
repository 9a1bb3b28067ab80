//! One decoder layer over slow rows and optional fast rows (reference `layer::decoder_layer`).
//!
//! ```text
//! h      = RMSNorm(s)                (fast: RMSNorm(f))
//! q,k,v  = h W^T                     (fast: + scale * h A^T B^T where the layer has an adapter)
//! s     += o_proj(attn(q_s | cache + this chunk))          writes present K/V
//! f     += o_proj(attn(q_f | slow K/V before p, own k_f/v_f))
//! s, f  += FFN(RMSNorm(.))           (MoE: fast rows use the slow rows' experts)
//! ```
//!
//! Slow and fast rows are separate tensors reading the same initializers (one copy of each weight);
//! every base projection runs on both together as one `MatMul` over `[B, 2T, in]`, so a draft step
//! reads each weight once, not once per kind of row.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::accelerator::delta;
use crate::emit::attention::{Visibility, fast_attention, slow_attention};
use crate::emit::mlp::mlp;
use crate::emit::moe::moe_block;
use crate::emit::ops::{linear, rms_norm, swiglu};
use crate::emit::rope::RopeTables;
use reference::base::model::Model;
use reference::base::weight_names::Target;
use reference::base::weight_names::{AttnProj, MlpProj, WeightId};
use reference::base::weights::{FeedForward, Layer, Linear};
use reference::m2r2::accelerator::Accelerator;

/// What is shared by every layer of a graph.
pub struct LayerContext<'a> {
    pub model: &'a Model,
    pub rope: &'a RopeTables,
    pub visibility: &'a Visibility,
}

/// The rows entering a layer.
pub struct LayerInput<'a> {
    /// `[B, T, D]` slow residual
    pub s: &'a str,
    /// `[B, T, D]` fast residual of the same tokens, with the adapters of the fast stream
    pub fast: Option<(&'a str, &'a Accelerator)>,
    /// `[B, Hkv, P, Dh]` cached keys / values of this layer
    pub past_key: &'a str,
    pub past_value: &'a str,
}

/// What a layer produced.
pub struct LayerOutput {
    pub s: String,
    pub f: Option<String>,
    /// `[B, Hkv, P+T, Dh]`
    pub present_key: String,
    pub present_value: String,
}

/// The weight and bias names of one base projection of layer `l`.
/// Layer `l`'s two RMSNorm weights as initializers: `(input_layernorm, post_attention_layernorm)`.
pub fn norm_weights(b: &mut GraphBuilder, l: usize, layer: &Layer) -> (String, String) {
    let attn_norm = b.weight(
        &WeightId::AttnNorm(l).onnx_name(),
        layer.attn_norm.view().into_dyn(),
    );
    let mlp_norm = b.weight(
        &WeightId::MlpNorm(l).onnx_name(),
        layer.mlp_norm.view().into_dyn(),
    );
    (attn_norm, mlp_norm)
}

fn weight_ids(l: usize, target: Target) -> (WeightId, WeightId) {
    match target {
        Target::Attn(p) => (WeightId::Attn(l, p), WeightId::AttnBias(l, p)),
        Target::Mlp(p) => (WeightId::Mlp(l, p), WeightId::MlpBias(l, p)),
    }
}

/// The weight and optional bias of one base projection, as graph values.
fn projection_weights(
    b: &mut GraphBuilder,
    l: usize,
    target: Target,
    lin: &Linear,
) -> (String, Option<String>) {
    let (w_id, b_id) = weight_ids(l, target);
    let w = b.weight(&w_id.onnx_name(), lin.w.view().into_dyn());
    let bias = lin
        .b
        .as_ref()
        .map(|bias| b.weight(&b_id.onnx_name(), bias.view().into_dyn()));
    (w, bias)
}

/// `x W^T + b` for one base projection of layer `l`, plus the adapter term when `adapter` is given.
pub fn project(
    b: &mut GraphBuilder,
    l: usize,
    target: Target,
    lin: &Linear,
    x: &str,
    adapter: Option<&Accelerator>,
) -> String {
    b.scoped(target.module(), |b| {
        let (w, bias) = projection_weights(b, l, target, lin);
        let y = linear(b, x, &w, bias.as_deref());
        match adapter.and_then(|acc| delta(b, acc, l, target, x)) {
            Some(d) => b.binary("Add", &y, &d),
            None => y,
        }
    })
}

/// Slow rows `x_s` and fast rows `x_f` through one base projection of layer `l` as ONE `MatMul`
/// over `[B, 2T, in]` (slow rows first), so the weight is read once for both kinds of rows
/// instead of once each; `split` (`[T, T]`) separates them again and the fast rows add their
/// adapter term. Each row's product is the same as in a projection of its own.
///
/// # Shapes
/// - `x_s`, `x_f`: `[B, T, in]` -> `[B, T, out]` each
#[allow(clippy::too_many_arguments)]
pub fn project_pair(
    b: &mut GraphBuilder,
    l: usize,
    target: Target,
    lin: &Linear,
    x_s: &str,
    x_f: &str,
    adapter: &Accelerator,
    split: &str,
) -> (String, String) {
    b.scoped(target.module(), |b| {
        let (w, bias) = projection_weights(b, l, target, lin);
        let both = b.node("Concat", &[x_s, x_f], vec![("axis", Attr::Int(1))]);
        let y = linear(b, &both, &w, bias.as_deref());
        let mut halves = b.node_n("Split", &[&y, split], 2, vec![("axis", Attr::Int(1))]);
        let y_f = halves.pop().expect("two halves");
        let y_s = halves.pop().expect("two halves");
        let y_f = b.scoped("fast", |b| match delta(b, adapter, l, target, x_f) {
            Some(d) => b.binary("Add", &y_f, &d),
            None => y_f,
        });
        (y_s, y_f)
    })
}

/// Layer `l`, in the scope `layers.{l}` (fast-row nodes under a `fast` scope). With fast rows,
/// every base projection runs on slow and fast rows together ([`project_pair`]).
pub fn decoder_layer(
    b: &mut GraphBuilder,
    cx: &LayerContext<'_>,
    l: usize,
    input: LayerInput<'_>,
) -> LayerOutput {
    let config = &cx.model.config;
    let layer = &cx.model.weights.layers[l];
    let eps = config.rms_norm_eps as f32;
    let d = config.hidden_size;
    // fast rows: their residual, adapters, the slow / fast split sizes and the fast mask
    let fast = input.fast.map(|(f, acc)| {
        let split = cx
            .visibility
            .pair_split
            .as_deref()
            .expect("fast rows come with split sizes");
        let mask = cx
            .visibility
            .fast
            .as_deref()
            .expect("fast rows come with a fast mask");
        (f, acc, split, mask)
    });
    b.scoped(&format!("layers.{l}"), |b| {
        let (attn_norm, mlp_norm) = norm_weights(b, l, layer);
        let a = &layer.attn;
        let lin = |p: AttnProj| match p {
            AttnProj::Q => &a.q,
            AttnProj::K => &a.k,
            AttnProj::V => &a.v,
            AttnProj::O => &a.o,
        };

        // attention: slow rows write the cache, fast rows read it and never write it
        let (s, attn, f) = b.scoped("attn", |b| {
            let h = b.scoped("input_layernorm", |b| rms_norm(b, input.s, &attn_norm, eps));
            let h_f = fast.map(|(f, ..)| {
                b.scoped("fast", |b| {
                    b.scoped("input_layernorm", |b| rms_norm(b, f, &attn_norm, eps))
                })
            });
            let (qkv, qkv_f) = match (&h_f, fast) {
                (Some(h_f), Some((_, acc, split, _))) => {
                    let [q, k, v] = [AttnProj::Q, AttnProj::K, AttnProj::V]
                        .map(|p| project_pair(b, l, Target::Attn(p), lin(p), &h, h_f, acc, split));
                    ([q.0, k.0, v.0], Some([q.1, k.1, v.1]))
                }
                _ => (
                    [AttnProj::Q, AttnProj::K, AttnProj::V]
                        .map(|p| project(b, l, Target::Attn(p), lin(p), &h, None)),
                    None,
                ),
            };
            let [q, k, v] = &qkv;
            let out = slow_attention(
                b,
                config,
                cx.rope,
                q,
                k,
                v,
                input.past_key,
                input.past_value,
                &cx.visibility.slow,
            );
            let (s, f) = match (qkv_f, fast) {
                (Some([q, k, v]), Some((f, acc, split, mask))) => {
                    let ctx = b.scoped("fast", |b| {
                        fast_attention(
                            b,
                            config,
                            cx.rope,
                            &q,
                            &k,
                            &v,
                            &out.present_key,
                            &out.present_value,
                            mask,
                        )
                    });
                    let (o, o_f) = project_pair(
                        b,
                        l,
                        Target::Attn(AttnProj::O),
                        &a.o,
                        &out.ctx,
                        &ctx,
                        acc,
                        split,
                    );
                    let f = b.scoped("fast", |b| b.binary("Add", f, &o_f));
                    (b.binary("Add", input.s, &o), Some(f))
                }
                _ => {
                    let o = project(b, l, Target::Attn(AttnProj::O), &a.o, &out.ctx, None);
                    (b.binary("Add", input.s, &o), None)
                }
            };
            (s, out, f)
        });

        // feed-forward
        let h = b.scoped("post_attention_layernorm", |b| {
            rms_norm(b, &s, &mlp_norm, eps)
        });
        let h_fast = f.as_ref().map(|f| {
            b.scoped("fast", |b| {
                b.scoped("post_attention_layernorm", |b| {
                    rms_norm(b, f, &mlp_norm, eps)
                })
            })
        });
        let (y, y_fast) = match &layer.ffn {
            FeedForward::Dense(m) => {
                let lin = |p: MlpProj| match p {
                    MlpProj::Gate => &m.gate,
                    MlpProj::Up => &m.up,
                    MlpProj::Down => &m.down,
                };
                match (&h_fast, fast) {
                    (Some(h_f), Some((_, acc, split, _))) => b.scoped("mlp", |b| {
                        let pair = |b: &mut GraphBuilder, p: MlpProj, x: &str, x_f: &str| {
                            project_pair(b, l, Target::Mlp(p), lin(p), x, x_f, acc, split)
                        };
                        let (gate, gate_f) = pair(b, MlpProj::Gate, &h, h_f);
                        let (up, up_f) = pair(b, MlpProj::Up, &h, h_f);
                        let act = swiglu(b, &gate, &up);
                        let act_f = b.scoped("fast", |b| swiglu(b, &gate_f, &up_f));
                        let (y, y_f) = pair(b, MlpProj::Down, &act, &act_f);
                        (y, Some(y_f))
                    }),
                    _ => {
                        let y = mlp(b, &h, &mut |b, p, x| {
                            project(b, l, Target::Mlp(p), lin(p), x, None)
                        });
                        (y, None)
                    }
                }
            }
            FeedForward::Moe(moe) => moe_block(b, moe, l, d, &h, h_fast.as_deref()),
        };
        let s = b.binary("Add", &s, &y);
        let f = f
            .zip(y_fast)
            .map(|(f, yf)| b.scoped("fast", |b| b.binary("Add", &f, &yf)));
        LayerOutput {
            s,
            f,
            present_key: attn.present_key,
            present_value: attn.present_value,
        }
    })
}
