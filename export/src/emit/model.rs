//! The base model (reference `model.rs`): embedding, a range of decoder layers, final norm and LM
//! head. `model.onnx` runs all layers; `verifier.onnx` runs layers `e..N` from a hidden state.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::layer::{LayerContext, LayerInput, decoder_layer};
use crate::emit::ops::{linear, rms_norm};
use reference::weight_names::WeightId;
use std::ops::Range;

/// `s_0 = Embed[input_ids]`.
///
/// # Shapes
/// - `input_ids`: int64 `[B, T]` -> `[B, T, D]`
pub fn embed(b: &mut GraphBuilder, cx: &LayerContext<'_>, input_ids: &str) -> String {
    b.scoped("embed_tokens", |b| {
        let table = b.weight(
            &WeightId::Embed.onnx_name(),
            cx.model.weights.embed.view().into_dyn(),
        );
        b.node("Gather", &[&table, input_ids], vec![("axis", Attr::Int(0))])
    })
}

/// `LMHead(RMSNorm_final(s))` (the embedding matrix when tied).
///
/// # Shapes
/// - `s`: `[B, T, D]` -> `[B, T, V]`
pub fn logits(b: &mut GraphBuilder, cx: &LayerContext<'_>, s: &str) -> String {
    let model = cx.model;
    let config = &model.config;
    let norm = b.weight(
        &WeightId::FinalNorm.onnx_name(),
        model.weights.final_norm.view().into_dyn(),
    );
    let h = b.scoped("norm", |b| {
        rms_norm(b, s, &norm, config.hidden_size, config.rms_norm_eps as f32)
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

/// The slow stream through `layers`; `past[i]` is the cache of layer `layers.start + i`. Returns
/// the residual after the last layer and each layer's present key / value.
pub fn slow_layers(
    b: &mut GraphBuilder,
    cx: &LayerContext<'_>,
    layers: Range<usize>,
    mut s: String,
    past: &[(String, String)],
) -> (String, Vec<(String, String)>) {
    let mut presents = Vec::with_capacity(layers.len());
    for (i, l) in layers.enumerate() {
        let out = decoder_layer(
            b,
            cx,
            l,
            LayerInput {
                s: &s,
                fast: None,
                past_key: &past[i].0,
                past_value: &past[i].1,
            },
        );
        s = out.s;
        presents.push((out.present_key, out.present_value));
    }
    (s, presents)
}
