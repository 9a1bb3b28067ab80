//! The graphs of a static-cache export (`m2r2 export --static-cache L`, docs/ONNX.md "Static
//! exports"), in opset 24: each layer's keys and values in a fixed `[B, Hkv, L, Dh]` buffer that
//! `TensorScatter` writes at `write_indices`, so a runner binds one buffer per layer as both the
//! past input and the present output and ONNX Runtime updates it in place, and every step has the
//! same input addresses (what CUDA graph capture needs). The four graphs split the layers as the
//! dynamic ones do (`graphs.rs`), and share one set of buffers: a runner binds layer `i`'s buffers
//! to whichever graph holds layer `i`.
//!
//! | input                         | dtype | shape              | graphs | meaning |
//! |-------------------------------|-------|--------------------|--------|---------|
//! | `input_ids`                   | int64 | `[B, T]`           | model, draft, feed | the step's tokens |
//! | `hidden_states`               | f32   | `[B, T, D]`        | verifier | the slow residual `s_e` of the rows |
//! | `position_ids`                | int64 | `[B, T]`           | all | their positions (`< L`) |
//! | `attn_mask`                   | f32   | `[B, 1, T, L]`     | all | additive: 0 where row `t` sees key `j`, `f32::MIN` elsewhere |
//! | `fast_attn_mask`              | f32   | `[B, 1, T, L + T]` | draft | the fast rows': buffer keys before the row's position, then its own key (column `L + t`) |
//! | `write_indices`               | int64 | `[B]`              | all | where the step's first row goes in the buffers |
//! | `bridge_states`               | f32   | `[B, T, D]`        | draft, with a bridge | as in the dynamic draft.onnx |
//! | `past_key_values.{i}.key/value` | f32 | `[B, Hkv, L, Dh]`  | all | layer `i`'s buffers, for the graph's layers |
//!
//! Outputs: those of the dynamic graph of the same name (`logits`, `draft_logits`, `exit_prob`,
//! `hidden_states`, `exit_states`, `final_states`), and `present.{i}.key/value` `[B, Hkv, L, Dh]`,
//! the buffers with the step's rows written (TensorScatter's outputs). The runner builds the
//! masks: row `t` at position `p` sees keys `0..=p` (and only the last `sliding_window` of them
//! when the config has one); they are explicit rather than `is_causal`, which ONNX aligns to the
//! upper left (row 0 would see key 0 only, whatever the cache holds).

use crate::builder::{Attr, Dim, Elem, GraphBuilder, STATIC_OPSET};
use crate::emit::fast_stream::{Draft, Interval, Rows, draft_intervals, layer_by_layer};
use crate::emit::ops::linear;
use crate::emit::stacked_draft::{stacked_draft_layer, unstack};
use crate::emit::static_draft::static_draft_layer;
use crate::emit::static_layer::{StaticContext, rms_normalization, static_decoder_layer};
use crate::error::{Error, Result};
use crate::graphs::{
    self, BRIDGE_STATES, ExportOptions, FINAL_STATES, GraphKind, HIDDEN_STATES, INPUT_IDS, LOGITS,
    POSITION_IDS, past_names, present_names,
};
use crate::proto::ModelProto;
use reference::base::model::Model;
use reference::base::rope::inverse_frequencies;
use reference::base::weight_names::WeightId;
use reference::m2r2::weights::M2r2Weights;
use std::ops::Range;

/// The additive attention mask input, `[B, 1, T, L]`.
pub const ATTN_MASK: &str = "attn_mask";
/// draft.onnx's additive mask of the fast rows, `[B, 1, T, L + T]`.
pub const FAST_ATTN_MASK: &str = "fast_attn_mask";
/// Where each batch row's step is written in the buffers, `[B]`.
pub const WRITE_INDICES: &str = "write_indices";
/// The mask value of a hidden key (finite, as in the dynamic graphs: see `emit::attention`).
pub const HIDDEN: f32 = f32::MIN;

const BATCH: Dim = Dim::Named("batch");
const SEQ: Dim = Dim::Named("sequence_length");

/// Refuse a buffer length the graph cannot use: at least one position, and no more than the
/// model's context (positions past it have no meaning for the model).
pub fn check_l_max(model: &Model, l_max: usize) -> Result<()> {
    let context = model.config.max_position_embeddings;
    if l_max == 0 || l_max > context {
        return Err(Error::Invalid(format!(
            "--static-cache {l_max}: the buffer length must be 1..={context} (the model's \
             max_position_embeddings)"
        )));
    }
    Ok(())
}

/// `cos` / `sin` of `f32(p) * inv_freq` for `p` in `0..l_max` (the reference's angles), row-major
/// `[l_max, Dh/2]` each.
fn rope_caches(model: &Model, l_max: usize) -> (Vec<f32>, Vec<f32>) {
    let c = &model.config;
    let inv = inverse_frequencies(c.head_dim, c.rope_theta, &c.rope_scaling);
    let angles = (0..l_max).flat_map(|p| inv.iter().map(move |f| p as f32 * f));
    (
        angles.clone().map(f32::cos).collect(),
        angles.map(f32::sin).collect(),
    )
}

/// Build the static graph `kind` with buffers of `l_max` positions (after [`graphs::check`]).
pub fn build_static(
    kind: GraphKind,
    model: &Model,
    m2r2: &M2r2Weights,
    options: &ExportOptions,
    l_max: usize,
) -> Result<ModelProto> {
    check_l_max(model, l_max)?;
    let config = &model.config;
    let (n, d, v) = (
        config.num_hidden_layers,
        config.hidden_size,
        config.vocab_size,
    );
    let e = m2r2.config.gate_layer(options.draft_gate);
    let layers = kind.layers(n, e);
    let bridged = kind != GraphKind::Feed && m2r2.bridge_at(options.draft_gate).is_some();
    let mut b = GraphBuilder::new(kind.name(), STATIC_OPSET, options.weights_dtype);

    // inputs
    let rows = match kind {
        GraphKind::Verifier => b.input(HIDDEN_STATES, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]),
        _ => b.input(INPUT_IDS, Elem::I64, &[BATCH, SEQ]),
    };
    let position_ids = b.input(POSITION_IDS, Elem::I64, &[BATCH, SEQ]);
    let attn_mask = b.input(
        ATTN_MASK,
        Elem::F32,
        &[BATCH, Dim::Fixed(1), SEQ, Dim::Fixed(l_max)],
    );
    let fast_attn_mask = (kind == GraphKind::Draft).then(|| {
        let keys = Dim::Named("buffer_plus_sequence_length");
        b.input(
            FAST_ATTN_MASK,
            Elem::F32,
            &[BATCH, Dim::Fixed(1), SEQ, keys],
        )
    });
    let write_indices = b.input(WRITE_INDICES, Elem::I64, &[BATCH]);
    let bridge_states = (kind == GraphKind::Draft && bridged)
        .then(|| b.input(BRIDGE_STATES, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]));
    let kv_dims = [
        BATCH,
        Dim::Fixed(config.num_key_value_heads),
        Dim::Fixed(l_max),
        Dim::Fixed(config.head_dim),
    ];
    let past: Vec<(String, String)> = layers
        .clone()
        .map(|i| {
            let (k, v) = past_names(i);
            (
                b.input(&k, Elem::F32, &kv_dims),
                b.input(&v, Elem::F32, &kv_dims),
            )
        })
        .collect();

    let (cos, sin) = rope_caches(model, l_max);
    let cos_cache = b.const_f32_matrix("rope/cos_cache", l_max, &cos);
    let sin_cache = b.const_f32_matrix("rope/sin_cache", l_max, &sin);
    let cx = StaticContext {
        model,
        cos_cache: &cos_cache,
        sin_cache: &sin_cache,
        position_ids: &position_ids,
        attn_mask: &attn_mask,
        write_indices: &write_indices,
        fast_attn_mask: fast_attn_mask.as_deref(),
        row_gemms: kind == GraphKind::Verifier,
    };

    // the residual stream is [B, 1, T, D] inside (static_layer.rs), [B, T, D] at the interface
    let axis1 = b.const_i64(&[1]);
    let s = match kind {
        GraphKind::Verifier => rows.clone(),
        _ => embed(&mut b, model, &rows),
    };
    let mut s = b.binary("Unsqueeze", &s, &axis1);
    let mut presents = Vec::with_capacity(layers.len());
    match kind {
        GraphKind::Model | GraphKind::Verifier | GraphKind::Feed => {
            for (l, (pk, pv)) in layers.clone().zip(&past) {
                let out = static_decoder_layer(&mut b, &cx, l, &s, pk, pv);
                s = out.s;
                presents.push((out.present_key, out.present_value));
            }
            // back to [B, T, D] before the head: the squeeze moves D values a row, not V
            let h = b.binary("Squeeze", &s, &axis1);
            if kind == GraphKind::Feed {
                b.output(HIDDEN_STATES, &h, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]);
            } else {
                let logits = lm_head(&mut b, model, &h);
                b.output(LOGITS, &logits, Elem::F32, &[BATCH, SEQ, Dim::Fixed(v)]);
                if kind == GraphKind::Verifier && bridged {
                    b.output(FINAL_STATES, &h, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]);
                }
            }
        }
        GraphKind::Draft => {
            let draft = draft(
                &mut b,
                &cx,
                m2r2,
                options.draft_gate,
                options.merge_adapters,
                s,
                &past,
                bridge_states.as_deref(),
            );
            graphs::draft_outputs(&mut b, m2r2, options, config, &draft);
            presents = draft.presents;
        }
    }
    for (i, (k, v)) in layers.zip(&presents) {
        let (kn, vn) = present_names(i);
        b.output(&kn, k, Elem::F32, &kv_dims);
        b.output(&vn, v, Elem::F32, &kv_dims);
    }
    let mut metadata = graphs::metadata(kind, model, m2r2, options);
    metadata.push(("m2r2.static_cache".into(), l_max.to_string()));
    b.try_finish(&metadata)
}

/// `s_0 = Embed[input_ids]`: `[B, T]` -> `[B, T, D]`.
fn embed(b: &mut GraphBuilder, model: &Model, input_ids: &str) -> String {
    b.scoped("embed_tokens", |b| {
        let table = b.weight(
            &WeightId::Embed.onnx_name(),
            model.weights.embed.view().into_dyn(),
        );
        b.node("Gather", &[&table, input_ids], vec![("axis", Attr::Int(0))])
    })
}

/// `LMHead(RMSNormalization_final(h))`: `[B, T, D]` -> `[B, T, V]`.
fn lm_head(b: &mut GraphBuilder, model: &Model, h: &str) -> String {
    let config = &model.config;
    let norm = b.weight(
        &WeightId::FinalNorm.onnx_name(),
        model.weights.final_norm.view().into_dyn(),
    );
    let h = b.scoped("norm", |b| {
        rms_normalization(b, h, &norm, config.rms_norm_eps as f32)
    });
    b.scoped("lm_head", |b| {
        let id = if config.tie_word_embeddings {
            WeightId::Embed
        } else {
            WeightId::LmHead
        };
        let head = b.weight(&id.onnx_name(), model.weights.lm_head().view().into_dyn());
        linear(b, &h, &head, None)
    })
}

/// The fast stream of `draft.onnx` on static layers: the dynamic graph's interval loop
/// ([`draft_intervals`]) with [`static_draft_layer`]s, or with `merge_adapters` each interval's
/// layers as [`stacked_draft_layer`]s on both streams stacked (one `Concat` in, one `Split` out);
/// the residual `[B, 1, T, D]` inside and `[B, T, D]` at the heads, ARLA and the bridge.
#[allow(clippy::too_many_arguments)]
fn draft(
    b: &mut GraphBuilder,
    cx: &StaticContext<'_>,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    merge_adapters: bool,
    s: String,
    past: &[(String, String)],
    bridge_states: Option<&str>,
) -> Draft {
    let axis1 = b.const_i64(&[1]);
    let into = |b: &mut GraphBuilder, x: &str| b.binary("Unsqueeze", x, &axis1);
    let out_of = |b: &mut GraphBuilder, x: &str| b.binary("Squeeze", x, &axis1);
    let rows = Rows {
        into: &into,
        out_of: &out_of,
    };
    let acc = &m2r2.accelerator;
    type IntervalFn<'a> =
        Box<dyn FnMut(&mut GraphBuilder, Range<usize>, String, String) -> Interval + 'a>;
    let interval: IntervalFn<'_> = match merge_adapters {
        false => Box::new(layer_by_layer(
            |b: &mut GraphBuilder, l: usize, s: &str, f: &str| {
                let (pk, pv) = &past[l];
                let out = static_draft_layer(b, cx, l, (s, f), acc, (pk, pv));
                (out.s, out.f, (out.present_key, out.present_value))
            },
        )),
        true => {
            // both streams stacked along the batch axis for the interval's layers
            let axis0 = || vec![("axis", Attr::Int(0))];
            let positions = b.scoped("streams", |b| {
                b.node("Concat", &[cx.position_ids, cx.position_ids], axis0())
            });
            Box::new(
                move |b: &mut GraphBuilder, layers: Range<usize>, s: String, f: String| {
                    let mut x = b.scoped("streams", |b| b.node("Concat", &[&s, &f], axis0()));
                    let mut presents = Vec::with_capacity(layers.len());
                    for l in layers {
                        let (pk, pv) = &past[l];
                        let out = stacked_draft_layer(b, cx, l, &x, &positions, acc, (pk, pv));
                        x = out.x;
                        presents.push((out.present_key, out.present_value));
                    }
                    let (s, f) = b.scoped("streams", |b| unstack(b, &x));
                    (s, f, presents)
                },
            )
        }
    };
    draft_intervals(
        b,
        cx.model,
        m2r2,
        draft_gate,
        s,
        bridge_states,
        rows,
        interval,
    )
}
