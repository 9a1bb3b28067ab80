//! One decoder layer of the static `draft.onnx` (`export --static-cache L`): the slow rows exactly
//! as [`static_decoder_layer`](crate::emit::static_layer::static_decoder_layer), and next to them
//! the fast rows of the same tokens with the accelerator adapters (reference
//! `fast_stream::M2r2::run_interval`, the dynamic graph's `layer::decoder_layer` with fast rows).
//!
//! ```text
//! h | h_f  = RMSNormalization(s | f)                        [B, 1, T, D] each
//! q,k,v    = (h ++ h_f) @ W_heads, split; fast: + c (h_f A^T) B_heads
//! K,V      = TensorScatter(past, k|v, write_indices)        slow rows write the buffer
//! y        = Attention(q, K, V, attn_mask)                  slow: keys 0..=p
//! y_f      = Attention(q_f, K ++ k_f, V ++ v_f, fast_attn_mask)
//!                                                           fast: slow keys 0..p, then its own
//! s | f   += o_proj(y ++ y_f), split; fast: + c (y_f A_heads summed over heads) B^T
//! s | f   += FFN(RMSNormalization(.))                       (MoE: fast rows use the slow rows' experts)
//! ```
//!
//! Every base projection runs on both kinds of rows as one `MatMul` over `2T` rows (slow first,
//! joined along the row axis 2), so a draft step reads each weight once. The fast rows' keys and
//! values are never written to the buffer: a `Concat` appends them after the `L` buffer positions
//! for this run only (TensorRT's parser takes `Attention` without past inputs), and `fast_attn_mask` (`[B, 1, T, L + T]`) lets row `t` see buffer positions
//! before its own and, of the appended keys, its own one (column `L + t`).
//!
//! Adapter weights are stored in the layouts the `MatMul`s read: `A^T` under the adapter's name plus
//! [`TRANSPOSED`], and `B` of q/k/v (`[n Dh, r]`) as `[n, r, Dh]`, `A` of o (`[r, H Dh]`) as
//! `[H, Dh, r]`, under the name plus [`HEADS`]; the scale `c` stays a `Mul`, as in the dynamic graph.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::layer::norm_weights;
use crate::emit::moe::moe_block;
use crate::emit::ops::swiglu;
use crate::emit::static_layer::{
    HEADS, StaticContext, TRANSPOSED, attention, proj_heads, project_heads, project_mlp, project_o,
    rms_normalization, rope, scatter, transposed,
};
use ndarray::ArrayD;
use reference::base::config::ModelConfig;
use reference::base::weight_names::{AttnProj, MlpProj, Target};
use reference::base::weights::FeedForward;
use reference::io::peft::LoraPart;
use reference::m2r2::accelerator::{Accelerator, Lora};
use reference::m2r2::weight_names::OnnxInitializer;

/// What a static draft layer produced.
pub struct StaticDraftOutput {
    /// `[B, 1, T, D]` slow and fast residuals
    pub s: String,
    pub f: String,
    /// `[B, Hkv, L, Dh]`: the buffers with the slow rows written
    pub present_key: String,
    pub present_value: String,
}

/// Slow rows then fast rows along the row axis: `[B, n, T, X]` twice -> `[B, n, 2T, X]`.
fn join(b: &mut GraphBuilder, slow: &str, fast: &str) -> String {
    b.node("Concat", &[slow, fast], vec![("axis", Attr::Int(2))])
}

/// The inverse of [`join`]: `(slow, fast)`.
fn halves(b: &mut GraphBuilder, both: &str) -> (String, String) {
    let mut parts = b.node_n(
        "Split",
        &[both],
        2,
        vec![("axis", Attr::Int(2)), ("num_outputs", Attr::Int(2))],
    );
    let fast = parts.pop().expect("two halves");
    (parts.pop().expect("two halves"), fast)
}

/// The adapter of `target` in layer `l`, unless it has none or it is exactly zero (adding it
/// would add exact zeros).
fn adapter(acc: &Accelerator, l: usize, target: Target) -> Option<&Lora> {
    acc.lora(l, target).filter(|lora| !lora.is_zero())
}

/// An adapter matrix stored as an initializer named after its part, plus `suffix`.
fn lora_weight(
    b: &mut GraphBuilder,
    l: usize,
    target: Target,
    part: LoraPart,
    suffix: &str,
    data: ArrayD<f32>,
) -> String {
    let name = OnnxInitializer::Lora {
        layer: l,
        target,
        part,
    }
    .name();
    b.weight(&(name + suffix), data.view())
}

/// `c (x A^T) B_heads` of q, k or v: `x` `[B, 1, T, D]` -> `[B, n, T, Dh]`.
fn delta_heads(
    b: &mut GraphBuilder,
    acc: &Accelerator,
    config: &ModelConfig,
    l: usize,
    p: AttnProj,
    x: &str,
) -> Option<String> {
    let target = Target::Attn(p);
    let lora = adapter(acc, l, target)?;
    let heads = proj_heads(config, p);
    let (dh, r) = (config.head_dim, lora.rank());
    Some(b.scoped("lora", |b| {
        let at = lora_weight(b, l, target, LoraPart::A, TRANSPOSED, transposed(lora.a()));
        let bh = lora
            .b()
            .to_owned()
            .into_shape_with_order((heads, dh, r))
            .expect("rows = heads * Dh")
            .permuted_axes([0, 2, 1])
            .as_standard_layout()
            .to_owned()
            .into_dyn();
        let bh = lora_weight(b, l, target, LoraPart::B, HEADS, bh);
        let h = b.binary("MatMul", x, &at); // [B, 1, T, r]
        let y = b.binary("MatMul", &h, &bh); // [B, n, T, Dh]
        let c = b.scalar_f32(acc.scale(lora));
        b.binary("Mul", &c, &y)
    }))
}

/// `c (A y) B^T` of o with `A` per head: `y` `[B, H, T, Dh]` -> `[B, 1, T, D]`.
fn delta_o(
    b: &mut GraphBuilder,
    acc: &Accelerator,
    config: &ModelConfig,
    l: usize,
    y: &str,
) -> Option<String> {
    let target = Target::Attn(AttnProj::O);
    let lora = adapter(acc, l, target)?;
    let (heads, dh, r) = (config.num_attention_heads, config.head_dim, lora.rank());
    Some(b.scoped("lora", |b| {
        let ah = lora
            .a()
            .t()
            .as_standard_layout()
            .to_owned()
            .into_shape_with_order((heads, dh, r))
            .expect("columns = heads * Dh")
            .into_dyn();
        let ah = lora_weight(b, l, target, LoraPart::A, HEADS, ah);
        let bt = lora_weight(b, l, target, LoraPart::B, TRANSPOSED, transposed(lora.b()));
        let per_head = b.binary("MatMul", y, &ah); // [B, H, T, r]
        let axis1 = b.const_i64(&[1]);
        let h = b.node(
            "ReduceSum",
            &[&per_head, &axis1],
            vec![("keepdims", Attr::Int(1))],
        ); // [B, 1, T, r]
        let out = b.binary("MatMul", &h, &bt); // [B, 1, T, D]
        let c = b.scalar_f32(acc.scale(lora));
        b.binary("Mul", &c, &out)
    }))
}

/// `c (x A^T) B^T` of an MLP projection: `[..., in]` -> `[..., out]`.
fn delta_mlp(
    b: &mut GraphBuilder,
    acc: &Accelerator,
    l: usize,
    p: MlpProj,
    x: &str,
) -> Option<String> {
    let target = Target::Mlp(p);
    let lora = adapter(acc, l, target)?;
    Some(b.scoped("lora", |b| {
        let at = lora_weight(b, l, target, LoraPart::A, TRANSPOSED, transposed(lora.a()));
        let bt = lora_weight(b, l, target, LoraPart::B, TRANSPOSED, transposed(lora.b()));
        let h = b.binary("MatMul", x, &at);
        let y = b.binary("MatMul", &h, &bt);
        let c = b.scalar_f32(acc.scale(lora));
        b.binary("Mul", &c, &y)
    }))
}

/// The fast rows' attention (in the `fast` scope): their keys are the buffer's `L`, then their own
/// `T` (a `Concat`, not `Attention`'s past inputs: TensorRT's parser takes `Attention` without
/// them), masked by `fast_mask`.
///
/// # Shapes
/// - `q_f` `[B, H, T, Dh]`, buffers `[B, Hkv, L, Dh]`, own `[B, Hkv, T, Dh]` -> `[B, H, T, Dh]`
pub(crate) fn fast_attention(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    q_f: &str,
    (present_key, present_value): (&str, &str),
    (k_f, v_f): (&str, &str),
    fast_mask: &str,
) -> String {
    b.scoped("fast", |b| {
        let axis2 = || vec![("axis", Attr::Int(2))];
        let keys = b.node("Concat", &[present_key, k_f], axis2());
        let values = b.node("Concat", &[present_value, v_f], axis2());
        attention(b, config, q_f, &keys, &values, fast_mask)
    })
}

/// `y + delta` where there is a delta (in the `fast` scope).
fn plus(b: &mut GraphBuilder, y: String, delta: Option<String>) -> String {
    match delta {
        Some(d) => b.scoped("fast", |b| b.binary("Add", &y, &d)),
        None => y,
    }
}

/// Layer `l` on slow rows `s` and fast rows `f` (both `[B, 1, T, D]`) in the scope `layers.{l}`,
/// fast-only nodes under a `fast` scope; `cx.fast_attn_mask` must be set.
pub fn static_draft_layer(
    b: &mut GraphBuilder,
    cx: &StaticContext<'_>,
    l: usize,
    (s, f): (&str, &str),
    acc: &Accelerator,
    (past_key, past_value): (&str, &str),
) -> StaticDraftOutput {
    let config = &cx.model.config;
    let layer = &cx.model.weights.layers[l];
    let eps = config.rms_norm_eps as f32;
    let fast_mask = cx
        .fast_attn_mask
        .expect("a draft layer's context has the fast rows' mask");
    b.scoped(&format!("layers.{l}"), |b| {
        let (attn_norm, mlp_norm) = norm_weights(b, l, layer);
        let a = &layer.attn;

        // attention: the slow rows write the buffers, the fast rows read them and never write
        let (s, f, present_key, present_value) = b.scoped("attn", |b| {
            let h = b.scoped("input_layernorm", |b| {
                rms_normalization(b, s, &attn_norm, eps)
            });
            let h_f = b.scoped("fast", |b| {
                b.scoped("input_layernorm", |b| {
                    rms_normalization(b, f, &attn_norm, eps)
                })
            });
            let both = join(b, &h, &h_f);
            let [(q, q_f), (k, k_f), (v, v_f)] = [
                (AttnProj::Q, &a.q),
                (AttnProj::K, &a.k),
                (AttnProj::V, &a.v),
            ]
            .map(|(p, lin)| {
                let y = project_heads(b, config, l, p, lin, &both);
                let (y, y_f) = halves(b, &y);
                let d = delta_heads(b, acc, config, l, p, &h_f);
                (y, plus(b, y_f, d))
            });
            let (q, k) = (rope(b, cx, &q), rope(b, cx, &k));
            let (q_f, k_f) = b.scoped("fast", |b| (rope(b, cx, &q_f), rope(b, cx, &k_f)));
            let present_key = scatter(b, cx, past_key, &k);
            let present_value = scatter(b, cx, past_value, &v);
            let y = attention(b, config, &q, &present_key, &present_value, cx.attn_mask);
            let y_f = fast_attention(
                b,
                config,
                &q_f,
                (&present_key, &present_value),
                (&k_f, &v_f),
                fast_mask,
            );
            let ys = join(b, &y, &y_f);
            let o = project_o(b, config, l, &a.o, &ys);
            let (o, o_f) = halves(b, &o);
            let d = delta_o(b, acc, config, l, &y_f);
            let o_f = plus(b, o_f, d);
            let f = b.scoped("fast", |b| b.binary("Add", f, &o_f));
            (b.binary("Add", s, &o), f, present_key, present_value)
        });

        // feed-forward
        let h = b.scoped("post_attention_layernorm", |b| {
            rms_normalization(b, &s, &mlp_norm, eps)
        });
        let h_f = b.scoped("fast", |b| {
            b.scoped("post_attention_layernorm", |b| {
                rms_normalization(b, &f, &mlp_norm, eps)
            })
        });
        let (y, y_f) = match &layer.ffn {
            FeedForward::Dense(m) => b.scoped("mlp", |b| {
                let pair = |b: &mut GraphBuilder, p: MlpProj, x: &str, x_f: &str| {
                    let lin = match p {
                        MlpProj::Gate => &m.gate,
                        MlpProj::Up => &m.up,
                        MlpProj::Down => &m.down,
                    };
                    let both = join(b, x, x_f);
                    let y = project_mlp(b, l, p, lin, &both);
                    let (y, y_f) = halves(b, &y);
                    let d = delta_mlp(b, acc, l, p, x_f);
                    (y, plus(b, y_f, d))
                };
                let (gate, gate_f) = pair(b, MlpProj::Gate, &h, &h_f);
                let (up, up_f) = pair(b, MlpProj::Up, &h, &h_f);
                // silu(gate) * up as g * Sigmoid(g) * u (static_layer.rs: not Swish)
                let a = swiglu(b, &gate, &up);
                let a_f = b.scoped("fast", |b| swiglu(b, &gate_f, &up_f));
                pair(b, MlpProj::Down, &a, &a_f)
            }),
            FeedForward::Moe(moe) => {
                let (y, y_f) = moe_block(b, moe, l, config.hidden_size, &h, Some(&h_f));
                (y, y_f.expect("fast rows were given"))
            }
        };
        StaticDraftOutput {
            s: b.binary("Add", &s, &y),
            f: b.scoped("fast", |b| b.binary("Add", &f, &y_f)),
            present_key,
            present_value,
        }
    })
}
