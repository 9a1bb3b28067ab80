//! `model.onnx` with a static KV cache (`m2r2 export --static-cache L`, docs/ONNX.md "Static
//! exports"): the greedy base model in opset 24, each layer's keys and values in a fixed
//! `[B, Hkv, L, Dh]` buffer that `TensorScatter` writes at `write_indices`, so a runner binds one
//! buffer per layer as both the past input and the present output and ONNX Runtime updates it in
//! place, and every step has the same input addresses (what CUDA graph capture needs).
//!
//! | input                         | dtype | shape                      | meaning |
//! |-------------------------------|-------|----------------------------|---------|
//! | `input_ids`                   | int64 | `[B, T]`                   | the step's tokens |
//! | `position_ids`                | int64 | `[B, T]`                   | their positions (`< L`) |
//! | `attn_mask`                   | f32   | `[B, 1, T, L]`             | additive: 0 where row `t` sees key `j`, `f32::MIN` elsewhere |
//! | `write_indices`               | int64 | `[B]`                      | where the step's first row goes in the buffers |
//! | `past_key_values.{i}.key/value` | f32 | `[B, Hkv, L, Dh]`          | layer `i`'s buffers |
//!
//! Outputs: `logits` `[B, T, V]` and `present.{i}.key/value` `[B, Hkv, L, Dh]`, the buffers with the
//! step's rows written (TensorScatter's outputs). The runner builds the mask: row `t` at position
//! `p` sees keys `0..=p` (and only the last `sliding_window` of them when the config has one); it
//! is explicit rather than `is_causal`, which ONNX aligns to the upper left (row 0 would see key 0
//! only, whatever the cache holds).

use crate::builder::{Attr, Dim, Elem, GraphBuilder, STATIC_OPSET};
use crate::emit::ops::linear;
use crate::emit::static_layer::{StaticContext, rms_normalization, static_decoder_layer};
use crate::error::{Error, Result};
use crate::graphs::{
    self, ExportOptions, GraphKind, INPUT_IDS, LOGITS, POSITION_IDS, past_names, present_names,
};
use crate::proto::ModelProto;
use reference::base::model::Model;
use reference::base::rope::inverse_frequencies;
use reference::base::weight_names::WeightId;
use reference::m2r2::weights::M2r2Weights;

/// The additive attention mask input, `[B, 1, T, L]`.
pub const ATTN_MASK: &str = "attn_mask";
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

/// Build the static `model.onnx` with buffers of `l_max` positions (after [`graphs::check`]).
pub fn build_static_model(
    model: &Model,
    m2r2: &M2r2Weights,
    options: &ExportOptions,
    l_max: usize,
) -> Result<ModelProto> {
    check_l_max(model, l_max)?;
    let config = &model.config;
    let (n, v) = (config.num_hidden_layers, config.vocab_size);
    let mut b = GraphBuilder::new("model", STATIC_OPSET, options.weights_dtype);

    let input_ids = b.input(INPUT_IDS, Elem::I64, &[BATCH, SEQ]);
    let position_ids = b.input(POSITION_IDS, Elem::I64, &[BATCH, SEQ]);
    let attn_mask = b.input(
        ATTN_MASK,
        Elem::F32,
        &[BATCH, Dim::Fixed(1), SEQ, Dim::Fixed(l_max)],
    );
    let write_indices = b.input(WRITE_INDICES, Elem::I64, &[BATCH]);
    let kv_dims = [
        BATCH,
        Dim::Fixed(config.num_key_value_heads),
        Dim::Fixed(l_max),
        Dim::Fixed(config.head_dim),
    ];
    let past: Vec<(String, String)> = (0..n)
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
    };

    let s = b.scoped("embed_tokens", |b| {
        let table = b.weight(
            &WeightId::Embed.onnx_name(),
            model.weights.embed.view().into_dyn(),
        );
        b.node(
            "Gather",
            &[&table, &input_ids],
            vec![("axis", Attr::Int(0))],
        )
    }); // [B, T, D]
    let axis1 = b.const_i64(&[1]);
    let mut s = b.binary("Unsqueeze", &s, &axis1); // [B, 1, T, D]
    let mut presents = Vec::with_capacity(n);
    for (l, (pk, pv)) in past.iter().enumerate() {
        let out = static_decoder_layer(&mut b, &cx, l, &s, pk, pv);
        s = out.s;
        presents.push((out.present_key, out.present_value));
    }
    let h = {
        let norm = b.weight(
            &WeightId::FinalNorm.onnx_name(),
            model.weights.final_norm.view().into_dyn(),
        );
        b.scoped("norm", |b| {
            rms_normalization(b, &s, &norm, config.rms_norm_eps as f32)
        })
    };
    let logits = b.scoped("lm_head", |b| {
        let id = if config.tie_word_embeddings {
            WeightId::Embed
        } else {
            WeightId::LmHead
        };
        let head = b.weight(&id.onnx_name(), model.weights.lm_head().view().into_dyn());
        let y = linear(b, &h, &head, None); // [B, 1, T, V]
        b.binary("Squeeze", &y, &axis1)
    });
    b.output(LOGITS, &logits, Elem::F32, &[BATCH, SEQ, Dim::Fixed(v)]);
    for (i, (k, v)) in presents.iter().enumerate() {
        let (kn, vn) = present_names(i);
        b.output(&kn, k, Elem::F32, &kv_dims);
        b.output(&vn, v, Elem::F32, &kv_dims);
    }
    let mut metadata = graphs::metadata(GraphKind::Model, model, m2r2, options);
    metadata.push(("m2r2.static_cache".into(), l_max.to_string()));
    Ok(b.finish(&metadata))
}
