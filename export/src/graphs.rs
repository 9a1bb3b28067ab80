//! The four exported graphs and their interfaces (docs/ONNX.md has a table per graph):
//!
//! | graph           | layers        | inputs                                               | outputs |
//! |-----------------|---------------|------------------------------------------------------|---------|
//! | `model.onnx`    | `0..N`        | `input_ids`, `attention_mask`, `position_ids`, past KV | `logits`, present KV |
//! | `draft.onnx`    | `0..e`        | same, `tree_mask`, past KV of `0..e`                 | `draft_logits`, `exit_prob`, `hidden_states`, present KV |
//! | `verifier.onnx` | `e..N`        | `hidden_states`, `attention_mask`, `position_ids`, `tree_mask`, past KV of `e..N` | `logits`, present KV |
//! | `feed.onnx`     | `0..e`        | as `draft.onnx`                                      | `hidden_states`, present KV |
//!
//! `e = e_{g_d}`, the layer the draft gate sits after. Layer numbers in KV names are global. With a
//! pruned draft head (`draft_head.json` in the M2R2 weights) `draft_logits` is `[B, T, K]`: the
//! scores of the head's `K` token ids (written beside the graphs), not of the whole vocabulary.
//!
//! With a bridge read at the export's draft gate (`bridge.safetensors` in the M2R2 weights,
//! trained at that gate) draft.onnx also takes `bridge_states`
//! `[B, T, D]` and gives `exit_states` `[B, T, D]`, and verifier.onnx also gives `final_states`
//! `[B, T, D]` (what the runner feeds back into `bridge_states`).
//!
//! `feed.onnx` is `draft.onnx` without its fast rows and heads: the slow stream of the draft layers
//! alone, for the positions the speculative loop feeds without proposing from them (the last draft
//! of a round, the prompt). Its outputs are `draft.onnx`'s `hidden_states` and present KV.

use crate::builder::{Dim, Elem, GraphBuilder, WeightsDtype, check_opset};
use crate::emit::attention::visibility;
use crate::emit::fast_stream::{Draft, draft};
use crate::emit::layer::LayerContext;
use crate::emit::model::{embed, logits, slow_layers};
use crate::emit::rope::tables;
use crate::error::{Error, Result};
use crate::proto::ModelProto;
use reference::base::model::Model;
use reference::decode::drafting::check_draft_gate;
use reference::m2r2::weights::M2r2Weights;
use std::ops::Range;

/// The exporter's version, recorded in every graph and the manifest.
pub const EXPORTER_VERSION: &str = env!("CARGO_PKG_VERSION");

pub const INPUT_IDS: &str = "input_ids";
pub const ATTENTION_MASK: &str = "attention_mask";
pub const POSITION_IDS: &str = "position_ids";
/// The speculative graphs' visibility input (int64 `[T, S]`): causal for a chain, a token tree's
/// mask for tree nodes (`emit::attention::visibility`).
pub const TREE_MASK: &str = "tree_mask";
pub const LOGITS: &str = "logits";
pub const DRAFT_LOGITS: &str = "draft_logits";
pub const EXIT_PROB: &str = "exit_prob";
pub const HIDDEN_STATES: &str = "hidden_states";
/// draft.onnx with a bridge: the state before each row (the final slow residual of a verified
/// position, or the previous draft's `exit_states`).
pub const BRIDGE_STATES: &str = "bridge_states";
/// draft.onnx with a bridge: the draft gate's exit state `u_{g_d}` of each row.
pub const EXIT_STATES: &str = "exit_states";
/// verifier.onnx with a bridge: the final slow residual `s_N` (before the final norm) of each row.
pub const FINAL_STATES: &str = "final_states";

/// `past_key_values.{i}.key` / `.value` (global layer index).
pub fn past_names(i: usize) -> (String, String) {
    (
        format!("past_key_values.{i}.key"),
        format!("past_key_values.{i}.value"),
    )
}

/// `present.{i}.key` / `.value` (global layer index).
pub fn present_names(i: usize) -> (String, String) {
    (format!("present.{i}.key"), format!("present.{i}.value"))
}

const BATCH: Dim = Dim::Named("batch");
const SEQ: Dim = Dim::Named("sequence_length");
const PAST: Dim = Dim::Named("past_sequence_length");
const TOTAL: Dim = Dim::Named("total_sequence_length");

/// Which graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphKind {
    Model,
    Draft,
    Verifier,
    /// The slow stream of the draft layers (`draft.onnx` without fast rows and heads).
    Feed,
}

impl GraphKind {
    pub const ALL: [GraphKind; 4] = [
        GraphKind::Model,
        GraphKind::Draft,
        GraphKind::Verifier,
        GraphKind::Feed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GraphKind::Model => "model",
            GraphKind::Draft => "draft",
            GraphKind::Verifier => "verifier",
            GraphKind::Feed => "feed",
        }
    }

    pub fn file_name(self) -> String {
        format!("{}.onnx", self.name())
    }

    /// Global layer indices the graph holds, for a draft split after `e` layers.
    pub fn layers(self, n: usize, e: usize) -> Range<usize> {
        match self {
            GraphKind::Model => 0..n,
            GraphKind::Draft | GraphKind::Feed => 0..e,
            GraphKind::Verifier => e..n,
        }
    }
}

impl std::str::FromStr for GraphKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        GraphKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown graph `{s}`: expected model, draft, verifier or feed"
                ))
            })
    }
}

/// Settings of one export.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// Written into `metadata_props` and the manifest.
    pub model_name: String,
    pub opset: i64,
    pub weights_dtype: WeightsDtype,
    /// `g_d` (1-based) the draft / verifier split is made at.
    pub draft_gate: usize,
    /// `Some(L)`: every graph keeps its KV cache in fixed buffers of `L` positions updated in
    /// place (opset 24, built by `static_graph`, which [`crate::folder::export`] picks).
    pub static_cache: Option<usize>,
    /// Static exports: draft.onnx with the adapters merged into the fast stream's weights and the
    /// two streams stacked, about a third of the nodes (`emit::stacked_draft`; dense layers only).
    pub merge_adapters: bool,
}

/// Refuse what the graphs cannot express, before building anything.
pub fn check(model: &Model, m2r2: &M2r2Weights, options: &ExportOptions) -> Result<()> {
    check_opset(options.opset)?;
    let config = &model.config;
    m2r2.config.validate(config, "M2R2 settings")?;
    check_draft_gate(&m2r2.config, options.draft_gate, "--draft-gate")?;
    if !config.head_dim.is_multiple_of(2) {
        return Err(Error::Unsupported(format!(
            "head_dim {} is odd: rotate-half RoPE needs an even head dimension",
            config.head_dim
        )));
    }
    if !config
        .num_attention_heads
        .is_multiple_of(config.num_key_value_heads)
    {
        return Err(Error::Unsupported(format!(
            "{} attention heads are not a multiple of {} key/value heads",
            config.num_attention_heads, config.num_key_value_heads
        )));
    }
    if let Some(head) = &m2r2.draft_head
        && head.tokens.iter().any(|&t| t as usize >= config.vocab_size)
    {
        return Err(Error::Invalid(format!(
            "the draft head names token ids beyond the vocabulary of {}",
            config.vocab_size
        )));
    }
    if let Some(arla) = &m2r2.arla
        && arla.d_model() != config.hidden_size
    {
        return Err(Error::Unsupported(format!(
            "ARLA weights are for hidden size {}, the model has {}",
            arla.d_model(),
            config.hidden_size
        )));
    }
    if options.merge_adapters {
        check_merge_adapters(model, m2r2, options)?;
    }
    Ok(())
}

/// `--merge-adapters` builds the static draft graph's stacked streams: a static export, and dense
/// layers below the draft gate.
fn check_merge_adapters(model: &Model, m2r2: &M2r2Weights, options: &ExportOptions) -> Result<()> {
    if options.static_cache.is_none() {
        return Err(Error::Invalid(
            "--merge-adapters builds the static draft graph: add --static-cache L".into(),
        ));
    }
    let e = m2r2.config.gate_layer(options.draft_gate);
    let moe = (0..e).find(|&l| {
        matches!(
            model.weights.layers[l].ffn,
            reference::base::weights::FeedForward::Moe(_)
        )
    });
    match moe {
        Some(l) => Err(Error::Unsupported(format!(
            "--merge-adapters: layer {l} (below the draft gate, layer {e}) is a mixture of \
             experts; merged fast-stream weights need dense layers (export without it)"
        ))),
        None => Ok(()),
    }
}

/// `metadata_props` of a graph (the contract's keys).
pub fn metadata(
    kind: GraphKind,
    model: &Model,
    m2r2: &M2r2Weights,
    options: &ExportOptions,
) -> Vec<(String, String)> {
    let n = model.config.num_hidden_layers;
    let e = m2r2.config.gate_layer(options.draft_gate);
    let layers = kind.layers(n, e);
    [
        ("m2r2.graph", kind.name().to_string()),
        ("m2r2.exporter_version", EXPORTER_VERSION.to_string()),
        ("m2r2.model_name", options.model_name.clone()),
        (
            "m2r2.config",
            serde_json::to_string(&model.config).expect("config serialises"),
        ),
        (
            "m2r2.m2r2",
            serde_json::to_string(&m2r2.config).expect("M2R2 config serialises"),
        ),
        ("m2r2.draft_gate", options.draft_gate.to_string()),
        // the runner refuses a draft, verifier or feed graph of other M2R2 weights than the
        // manifest's (`ExportDir::check_identity`)
        ("m2r2.m2r2_hash", reference::golden::weights_hash(m2r2)),
        (
            "m2r2.draft_head_tokens",
            m2r2.draft_head
                .as_ref()
                .map_or("none".into(), |h| h.len().to_string()),
        ),
        ("m2r2.layers", format!("{}..{}", layers.start, layers.end)),
        (
            "m2r2.weights_dtype",
            options.weights_dtype.name().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Declare draft.onnx's outputs (the dynamic graph's and the static one's): `draft_logits`
/// `[B, T, V]` (`[B, T, K]` with a pruned draft head, its token ids in draft_head.json beside the
/// graphs), `exit_prob` with ARLA, `hidden_states`, and `exit_states` with a bridge at the draft
/// gate.
pub(crate) fn draft_outputs(
    b: &mut GraphBuilder,
    m2r2: &M2r2Weights,
    options: &ExportOptions,
    config: &reference::base::config::ModelConfig,
    out: &Draft,
) {
    let (d, v) = (config.hidden_size, config.vocab_size);
    let scored = m2r2.draft_head.as_ref().map_or(v, |h| h.len());
    b.output(
        DRAFT_LOGITS,
        &out.draft_logits,
        Elem::F32,
        &[BATCH, SEQ, Dim::Fixed(scored)],
    );
    if let Some(p) = &out.exit_prob {
        b.output(EXIT_PROB, p, Elem::F32, &[BATCH, SEQ]);
    }
    let rows = [BATCH, SEQ, Dim::Fixed(d)];
    b.output(HIDDEN_STATES, &out.hidden_states, Elem::F32, &rows);
    if m2r2.bridge_at(options.draft_gate).is_some() {
        b.output(EXIT_STATES, &out.exit_state, Elem::F32, &rows);
    }
}

/// Build graph `kind` (after [`check`]).
pub fn build(
    kind: GraphKind,
    model: &Model,
    m2r2: &M2r2Weights,
    options: &ExportOptions,
) -> Result<ModelProto> {
    check(model, m2r2, options)?;
    if options.static_cache.is_some() {
        // Static graphs have their own builder, which builds on this module's names.
        return Err(Error::Invalid(
            "static graphs are built by static_graph::build_static (folder::export picks the \
             builder)"
                .into(),
        ));
    }
    let config = &model.config;
    let (n, d, v) = (
        config.num_hidden_layers,
        config.hidden_size,
        config.vocab_size,
    );
    let e = m2r2.config.gate_layer(options.draft_gate);
    let layers = kind.layers(n, e);
    let mut b = GraphBuilder::new(kind.name(), options.opset, options.weights_dtype);

    // inputs
    let rows_input = match kind {
        GraphKind::Verifier => b.input(HIDDEN_STATES, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]),
        _ => b.input(INPUT_IDS, Elem::I64, &[BATCH, SEQ]),
    };
    let mask = b.input(ATTENTION_MASK, Elem::I64, &[BATCH, TOTAL]);
    let positions = b.input(POSITION_IDS, Elem::I64, &[BATCH, SEQ]);
    // model.onnx keeps onnxruntime-genai's inputs; the speculative graphs take their masks
    let tree_mask =
        (kind != GraphKind::Model).then(|| b.input(TREE_MASK, Elem::I64, &[SEQ, TOTAL]));
    let kv_dims = |len: Dim| {
        [
            BATCH,
            Dim::Fixed(config.num_key_value_heads),
            len,
            Dim::Fixed(config.head_dim),
        ]
    };
    let past: Vec<(String, String)> = layers
        .clone()
        .map(|i| {
            let (k, v) = past_names(i);
            (
                b.input(&k, Elem::F32, &kv_dims(PAST)),
                b.input(&v, Elem::F32, &kv_dims(PAST)),
            )
        })
        .collect();

    let rope = tables(&mut b, config, &positions);
    let vis = visibility(
        &mut b,
        config,
        &rows_input,
        &past[0].0,
        &mask,
        tree_mask.as_deref(),
        kind == GraphKind::Draft,
    );
    let cx = LayerContext {
        model,
        rope: &rope,
        visibility: &vis,
    };

    let presents = match kind {
        GraphKind::Model | GraphKind::Verifier => {
            let s = match kind {
                GraphKind::Model => embed(&mut b, &cx, &rows_input),
                _ => rows_input.clone(),
            };
            let (s, presents) = slow_layers(&mut b, &cx, layers.clone(), s, &past);
            let logits = logits(&mut b, model, &s);
            b.output(LOGITS, &logits, Elem::F32, &[BATCH, SEQ, Dim::Fixed(v)]);
            if kind == GraphKind::Verifier && m2r2.bridge_at(options.draft_gate).is_some() {
                b.output(FINAL_STATES, &s, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]);
            }
            presents
        }
        GraphKind::Draft => {
            let s = embed(&mut b, &cx, &rows_input);
            // only a bridge trained at this draft gate is read (drafting elsewhere ignores it)
            let bridge_states = m2r2
                .bridge_at(options.draft_gate)
                .map(|_| b.input(BRIDGE_STATES, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]));
            let out = draft(
                &mut b,
                &cx,
                m2r2,
                options.draft_gate,
                s,
                &past,
                bridge_states.as_deref(),
            );
            draft_outputs(&mut b, m2r2, options, config, &out);
            out.presents
        }
        GraphKind::Feed => {
            let s = embed(&mut b, &cx, &rows_input);
            let (s, presents) = slow_layers(&mut b, &cx, layers.clone(), s, &past);
            b.output(HIDDEN_STATES, &s, Elem::F32, &[BATCH, SEQ, Dim::Fixed(d)]);
            presents
        }
    };
    for (i, (k, v)) in layers.zip(&presents) {
        let (kn, vn) = present_names(i);
        b.output(&kn, k, Elem::F32, &kv_dims(TOTAL));
        b.output(&vn, v, Elem::F32, &kv_dims(TOTAL));
    }
    b.try_finish(&metadata(kind, model, m2r2, options))
}
