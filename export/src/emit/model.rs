//! The base model (reference `model.rs`): embedding, a range of decoder layers, final norm and LM
//! head. `model.onnx` runs all layers; `verifier.onnx` runs layers `e..N` from a hidden state.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::layer::{LayerContext, LayerInput, decoder_layer};
use crate::emit::ops::{linear, rms_norm};
use ndarray::Axis;
use reference::base::model::Model;
use reference::base::weight_names::WeightId;
use reference::m2r2::draft_head::DraftHead;

/// Initializer of the pruned draft head's rows in draft.onnx (`[K, D]`, the LM head's rows of the
/// subset, in the subset's ascending order).
pub const DRAFT_HEAD_WEIGHT: &str = "draft_head.weight";
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
pub fn logits(b: &mut GraphBuilder, model: &Model, s: &str) -> String {
    let h = final_norm(b, model, s);
    b.scoped("lm_head", |b| {
        let id = if model.config.tie_word_embeddings {
            WeightId::Embed
        } else {
            WeightId::LmHead
        };
        let head = b.weight(&id.onnx_name(), model.weights.lm_head().view().into_dyn());
        linear(b, &h, &head, None)
    })
}

/// The pruned draft head (reference `draft_head::DraftHead::subset_logits`):
/// `RMSNorm_final(s) . W_head[subset]^T`, the head rows of the subset stored as the initializer
/// [`DRAFT_HEAD_WEIGHT`] `[K, D]`.
///
/// # Shapes
/// - `s`: `[B, T, D]` -> `[B, T, K]`
pub fn pruned_logits(b: &mut GraphBuilder, model: &Model, s: &str, head: &DraftHead) -> String {
    let h = final_norm(b, model, s);
    b.scoped("draft_head", |b| {
        let rows: Vec<usize> = head.tokens.iter().map(|&t| t as usize).collect();
        let w = model.weights.lm_head().select(Axis(0), &rows); // [K, D]
        let w = b.weight(DRAFT_HEAD_WEIGHT, w.view().into_dyn());
        linear(b, &h, &w, None)
    })
}

/// `RMSNorm_final(s)`.
///
/// # Shapes
/// - `s`: `[B, T, D]` -> `[B, T, D]`
pub fn final_norm(b: &mut GraphBuilder, model: &Model, s: &str) -> String {
    let config = &model.config;
    let norm = b.weight(
        &WeightId::FinalNorm.onnx_name(),
        model.weights.final_norm.view().into_dyn(),
    );
    b.scoped("norm", |b| {
        rms_norm(b, s, &norm, config.rms_norm_eps as f32)
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
