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
//! Slow and fast rows are separate tensors reading the same initializers (one copy of each weight).

use crate::builder::GraphBuilder;
use crate::emit::accelerator::delta;
use crate::emit::attention::{Visibility, fast_attention, slow_attention};
use crate::emit::mlp::mlp;
use crate::emit::moe::moe_block;
use crate::emit::ops::{linear, rms_norm};
use crate::emit::rope::RopeTables;
use reference::base::model::Model;
use reference::base::weight_names::Target;
use reference::base::weight_names::{AttnProj, MlpProj, WeightId};
use reference::base::weights::{FeedForward, Linear};
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

/// `x W^T + b` for one base projection of layer `l`, plus the adapter term when `adapter` is given.
pub fn project(
    b: &mut GraphBuilder,
    l: usize,
    target: Target,
    lin: &Linear,
    x: &str,
    adapter: Option<&Accelerator>,
) -> String {
    let (w_id, b_id) = match target {
        Target::Attn(p) => (WeightId::Attn(l, p), WeightId::AttnBias(l, p)),
        Target::Mlp(p) => (WeightId::Mlp(l, p), WeightId::MlpBias(l, p)),
    };
    b.scoped(target.module(), |b| {
        let w = b.weight(&w_id.onnx_name(), lin.w.view().into_dyn());
        let bias = lin
            .b
            .as_ref()
            .map(|bias| b.weight(&b_id.onnx_name(), bias.view().into_dyn()));
        let y = linear(b, x, &w, bias.as_deref());
        match adapter.and_then(|acc| delta(b, acc, l, target, x)) {
            Some(d) => b.binary("Add", &y, &d),
            None => y,
        }
    })
}

/// Layer `l`, in the scope `layers.{l}` (fast-row nodes under `layers.{l}/fast`).
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
    b.scoped(&format!("layers.{l}"), |b| {
        let attn_norm = b.weight(
            &WeightId::AttnNorm(l).onnx_name(),
            layer.attn_norm.view().into_dyn(),
        );
        let mlp_norm = b.weight(
            &WeightId::MlpNorm(l).onnx_name(),
            layer.mlp_norm.view().into_dyn(),
        );
        let a = &layer.attn;
        let lin = |p: AttnProj| match p {
            AttnProj::Q => &a.q,
            AttnProj::K => &a.k,
            AttnProj::V => &a.v,
            AttnProj::O => &a.o,
        };
        let qkv = |b: &mut GraphBuilder, h: &str, acc: Option<&Accelerator>| {
            [AttnProj::Q, AttnProj::K, AttnProj::V]
                .map(|p| project(b, l, Target::Attn(p), lin(p), h, acc))
        };

        // attention, slow rows: write the cache
        let slow = b.scoped("attn", |b| {
            let h = b.scoped("input_layernorm", |b| {
                rms_norm(b, input.s, &attn_norm, d, eps)
            });
            let [q, k, v] = qkv(b, &h, None);
            let out = slow_attention(
                b,
                config,
                cx.rope,
                &q,
                &k,
                &v,
                input.past_key,
                input.past_value,
                &cx.visibility.slow,
            );
            let o = project(b, l, Target::Attn(AttnProj::O), &a.o, &out.ctx, None);
            (b.binary("Add", input.s, &o), out)
        });
        let (s, attn) = slow;

        // attention, fast rows: read the slow cache, never write it
        let fast = input.fast.map(|(f, acc)| {
            let mask = cx
                .visibility
                .fast
                .as_deref()
                .expect("fast rows come with a fast mask");
            let f = b.scoped("fast", |b| {
                b.scoped("attn", |b| {
                    let h = b.scoped("input_layernorm", |b| rms_norm(b, f, &attn_norm, d, eps));
                    let [q, k, v] = qkv(b, &h, Some(acc));
                    let ctx = fast_attention(
                        b,
                        config,
                        cx.rope,
                        &q,
                        &k,
                        &v,
                        &attn.present_key,
                        &attn.present_value,
                        mask,
                    );
                    let o = project(b, l, Target::Attn(AttnProj::O), &a.o, &ctx, Some(acc));
                    b.binary("Add", f, &o)
                })
            });
            (f, acc)
        });

        // feed-forward
        let h = b.scoped("post_attention_layernorm", |b| {
            rms_norm(b, &s, &mlp_norm, d, eps)
        });
        let h_fast = fast.as_ref().map(|(f, _)| {
            b.scoped("fast", |b| {
                b.scoped("post_attention_layernorm", |b| {
                    rms_norm(b, f, &mlp_norm, d, eps)
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
                let y = mlp(b, &h, &mut |b, p, x| {
                    project(b, l, Target::Mlp(p), lin(p), x, None)
                });
                let y_fast = h_fast.as_ref().zip(fast.as_ref()).map(|(hf, (_, acc))| {
                    b.scoped("fast", |b| {
                        mlp(b, hf, &mut |b, p, x| {
                            project(b, l, Target::Mlp(p), lin(p), x, Some(acc))
                        })
                    })
                });
                (y, y_fast)
            }
            FeedForward::Moe(moe) => moe_block(b, moe, l, d, &h, h_fast.as_deref()),
        };
        let s = b.binary("Add", &s, &y);
        let f = fast
            .zip(y_fast)
            .map(|((f, _), yf)| b.scoped("fast", |b| b.binary("Add", &f, &yf)));
        LayerOutput {
            s,
            f,
            present_key: attn.present_key,
            present_value: attn.present_value,
        }
    })
}
