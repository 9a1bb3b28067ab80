//! The fast stream (reference `fast_stream::M2r2::run_interval`) as it runs in `draft.onnx`: for
//! each interval `j < g_d` the fast rows restart from the slow residual `s_{e_j}` and run the
//! interval's layers with the adapters, next to the slow rows; `u_{j+1}` is their value at the
//! interval end. Every row of the chunk gets a fast row. With a pruned draft head (reference
//! `draft_head`) the draft logits are its `K` rows only; the verifier keeps the full head.

use crate::builder::GraphBuilder;
use crate::emit::arla::exit_prob;
use crate::emit::bridge;
use crate::emit::layer::{LayerContext, LayerInput, decoder_layer};
use crate::emit::model::{logits, pruned_logits};
use reference::base::model::Model;
use reference::m2r2::bridge::BridgeSite;
use reference::m2r2::weights::M2r2Weights;
use std::ops::Range;

/// What the draft graph computes.
pub struct Draft {
    /// `[B, T, V]` `LMHead(FinalNorm(u_{g_d}))`, or `[B, T, K]` with a pruned draft head (its
    /// subset's rows only)
    pub draft_logits: String,
    /// `[B, T]` ARLA `p_exit` at gate `g_d` (when ARLA weights exist)
    pub exit_prob: Option<String>,
    /// `[B, T, D]` slow residual `s_{e_{g_d}}`
    pub hidden_states: String,
    /// `[B, T, D]` the exit state `u_{g_d}` (with the bridge's gate term), what the bridge reads
    /// for the next draft row
    pub exit_state: String,
    /// present key / value of layers `0..e_{g_d}`
    pub presents: Vec<(String, String)>,
}

/// Intervals `0..draft_gate` on the embedded rows `s` with caches `past` (layer `i` at index `i`).
/// With a bridge, `bridge_states` (`[B, T, D]`, the state before each row) feeds its terms into
/// the draft gate's interval.
pub fn draft(
    b: &mut GraphBuilder,
    cx: &LayerContext<'_>,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    s: String,
    past: &[(String, String)],
    bridge_states: Option<&str>,
) -> Draft {
    let rows = Rows {
        into: &|_: &mut GraphBuilder, x: &str| x.to_string(),
        out_of: &|_: &mut GraphBuilder, x: &str| x.to_string(),
    };
    let layer = |b: &mut GraphBuilder, l: usize, s: &str, f: &str| {
        let out = decoder_layer(
            b,
            cx,
            l,
            LayerInput {
                s,
                fast: Some((f, &m2r2.accelerator)),
                past_key: &past[l].0,
                past_value: &past[l].1,
            },
        );
        let f = out.f.expect("fast rows were given");
        (out.s, f, (out.present_key, out.present_value))
    };
    let interval = layer_by_layer(layer);
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

/// How a graph's residual rows relate to the `[B, T, D]` interface of the heads, ARLA and the
/// bridge: `into` turns an interface tensor into the residual's layout, `out_of` back (the
/// dynamic graphs: as they are; the static ones: `[B, 1, T, D]`, an `Unsqueeze` / `Squeeze`).
pub struct Rows<'a> {
    pub into: &'a dyn Fn(&mut GraphBuilder, &str) -> String,
    pub out_of: &'a dyn Fn(&mut GraphBuilder, &str) -> String,
}

/// An interval's layers run one after the other through `layer` (slow and fast rows in, both out
/// with the layer's present key / value): the `interval` of [`draft_intervals`].
pub fn layer_by_layer<'a>(
    mut layer: impl FnMut(&mut GraphBuilder, usize, &str, &str) -> (String, String, (String, String))
    + 'a,
) -> impl FnMut(&mut GraphBuilder, Range<usize>, String, String) -> Interval + 'a {
    move |b, layers, mut s, mut f| {
        let mut presents = Vec::with_capacity(layers.len());
        for l in layers {
            let present;
            (s, f, present) = layer(b, l, &s, &f);
            presents.push(present);
        }
        (s, f, presents)
    }
}

/// What an interval's layers produced: the slow and fast rows, each layer's present key / value.
pub type Interval = (String, String, Vec<(String, String)>);

/// The draft's interval loop, for the dynamic and the static graphs alike: for each interval
/// `j < g_d` the fast rows restart from the slow residual `s_{e_j}` (plus the bridge's entry term
/// in the draft gate's interval) and run the interval's layers through `interval` (slow and fast
/// rows in, both out with the layers' present keys / values: [`layer_by_layer`], or the stacked
/// streams of `static_graph`); `u_{j+1}` is the fast rows' value at the interval end (plus the
/// bridge's gate term at the draft gate). Then the draft head and ARLA on the `[B, T, D]` exit
/// states.
#[allow(clippy::too_many_arguments)]
pub fn draft_intervals(
    b: &mut GraphBuilder,
    model: &Model,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    mut s: String,
    bridge_states: Option<&str>,
    rows: Rows<'_>,
    mut interval: impl FnMut(&mut GraphBuilder, Range<usize>, String, String) -> Interval,
) -> Draft {
    let eps = model.config.rms_norm_eps as f32;
    let mut presents = Vec::new();
    let mut exit_states = Vec::with_capacity(draft_gate);
    let bridge = m2r2.bridge_at(draft_gate).zip(bridge_states);
    let xhat = bridge.map(|(_, h)| bridge::input(b, model, h)); // [B, T, D]
    let term = |b: &mut GraphBuilder, site: BridgeSite| {
        let t = bridge
            .zip(xhat.as_ref())
            .and_then(|((bridge, _), x)| bridge::term(b, bridge, site, x))?;
        Some((rows.into)(b, &t))
    };
    for j in 0..draft_gate {
        let at_gate = j + 1 == draft_gate;
        // f <- s_{e_j} (+ the bridge's entry term in the draft gate's interval)
        let mut f = s.clone();
        if at_gate && let Some(t) = term(b, BridgeSite::Entry) {
            f = b.binary("Add", &f, &t);
        }
        let present;
        (s, f, present) = interval(b, m2r2.config.interval_layers(j), s, f);
        presents.extend(present);
        if at_gate && let Some(t) = term(b, BridgeSite::Gate) {
            f = b.binary("Add", &f, &t);
        }
        exit_states.push((rows.out_of)(b, &f)); // u_{j+1}, [B, T, D]
    }
    let u = exit_states.last().expect("draft_gate >= 1").clone();
    let draft_logits = b.scoped("draft", |b| match &m2r2.draft_head {
        Some(head) => pruned_logits(b, model, &u, head),
        None => logits(b, model, &u),
    });
    let exit_prob = m2r2
        .arla
        .as_ref()
        .map(|arla| exit_prob(b, arla, eps, &exit_states));
    Draft {
        draft_logits,
        exit_prob,
        hidden_states: (rows.out_of)(b, &s),
        exit_state: u,
        presents,
    }
}
