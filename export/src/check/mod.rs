//! The oracle check of an export folder: run its graphs with ONNX Runtime (CPU) on a probe sequence
//! and compare every output with the reference (`m2r2 export --check` and the tests).
//!
//! The probe is fed in two chunks, so the second chunk reads the first one's cache through
//! `past_key_values` (empty past, then a non-empty past):
//!
//! | graph           | compared with the reference                                          |
//! |-----------------|----------------------------------------------------------------------|
//! | `model.onnx`    | `logits` of each chunk (`Model::forward`), final `present.*` (`KvCache`) |
//! | `draft.onnx`    | `draft_logits` (a pruned draft head: its `[T, K]` `subset_logits`), `exit_prob`, `hidden_states` of each chunk (`M2r2::run_interval` with a fast row per position, `Arla::exit_prob`), final `present.*`; with a bridge, fed the reference's final residual of each row's previous position as `bridge_states`, also `exit_states` |
//! | `verifier.onnx` | `logits` of each chunk from the reference `hidden_states`, final `present.*`; with a bridge, `final_states` |
//! | draft -> verifier | `logits` of `verifier.onnx` fed with `draft.onnx`'s `hidden_states` vs `model.onnx`'s |
//!
//! A static `model.onnx` (`--static-cache`) is run by the runner's own loop
//! ([`onnx_runner::greedy::OnnxModel`], buffers bound in place): the first chunk as a prefill, then
//! the second one token per step, each step's `logits` against the reference's step, then the
//! filled positions of every layer's buffers against the reference's cache.
//!
//! Tolerance ([`TOLERANCE`]): f32 on the CPU, the same operations in a different summation order
//! (ORT's blocked GEMMs and vectorised exp / sigmoid against the reference's sequential sums), so
//! differences are rounding: about 1e-6 relative per operation, accumulated over the layers. A
//! tensor passes when `max |onnx - ref| <= TOLERANCE * max(1, max |ref|)`: 1e-4 absolute for
//! values of order one (KV, hidden states, probabilities), scaled for logits of order ten. A NaN
//! or infinite value in either tensor fails it whatever the differences
//! ([`Comparison::non_finite`]): an infinite reference would make the tolerance infinite.
//!
//! One exception ([`MERGED_F16_TOLERANCE`]): a static `--merge-adapters` draft in f16 stores the
//! fast stream's merged weight `W' = W + c B A` rounded once to f16, which the reference's
//! separately rounded `W`, `A` and `B` ([`rounded_to_f16`]) cannot reproduce: each weight differs
//! by up to half an f16 unit in the last place (2^-11, about 4.9e-4, relative), and the fast
//! outputs follow it: up to 5.0e-4 of their largest value on SmolLM2's probe, 2.6e-4 on tiny's.
//! The draft's fast-stream outputs (`draft_logits`, `exit_prob`, `exit_states`) are checked at
//! 2e-3 there, four such rounding steps: still far below what a wrong weight or wiring gives
//! (order one). They only choose what to draft; the slow rows, the verifier and the model keep
//! 1e-4.

mod compare;
mod f16_rounding;
mod feeder;
mod probe;
mod static_model;

pub use compare::Comparison;
pub use f16_rounding::rounded_to_f16;
pub use probe::probe_tokens;

use crate::error::{Error, Result};
use crate::graphs::{
    BRIDGE_STATES, DRAFT_LOGITS, EXIT_PROB, EXIT_STATES, FINAL_STATES, GraphKind, HIDDEN_STATES,
    LOGITS,
};
use compare::{batch1, compare};
use feeder::{Feeder, Rows, compare_presents, ids, output};
use ndarray::ArrayD;
use onnx_runner::ep::EpConfig;
use onnx_runner::session::{OnnxSession, Outputs};
use probe::reference_run;
use reference::base::model::Model;
use reference::m2r2::weights::M2r2Weights;
use static_model::check_static_model;
use std::path::Path;

/// Relative tolerance, see the module docs.
pub const TOLERANCE: f32 = 1e-4;
/// Relative tolerance of a merged f16 draft's fast-stream outputs, see the module docs.
pub const MERGED_F16_TOLERANCE: f32 = 2e-3;

/// Run the graphs `kinds` of the folder `dir` on `tokens` (split into two chunks at `split`) and
/// compare with the reference. `draft_gate` must be the one the folder was exported with.
pub fn check_folder(
    dir: &Path,
    model: &Model,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    kinds: &[GraphKind],
    tokens: &[u32],
    split: usize,
) -> Result<Vec<Comparison>> {
    if split == 0 || split >= tokens.len() {
        return Err(Error::Invalid(format!(
            "probe of {} tokens cannot be split at {split}",
            tokens.len()
        )));
    }
    onnx_runner::runtime::init().map_err(runner_error)?;
    let chunks = [&tokens[..split], &tokens[split..]];
    let reference = reference_run(model, m2r2, draft_gate, &chunks)?;
    let n = model.config.num_hidden_layers;
    let e = m2r2.config.gate_layer(draft_gate);
    let ep = EpConfig::cpu();
    let load =
        |k: GraphKind| OnnxSession::load(&dir.join(k.file_name()), &ep).map_err(runner_error);
    let mut rows = Vec::new();
    let mut model_logits = Vec::new();
    let mut draft_hidden = Vec::new();
    let mut feed_hidden = Vec::new();
    let export = onnx_runner::manifest::ExportDir::open(dir).map_err(runner_error)?;
    let static_model = export
        .static_l_max(onnx_runner::manifest::GraphKind::Model)
        .is_some()
        && kinds.contains(&GraphKind::Model);
    if static_model {
        model_logits = check_static_model(&export, model, &chunks, &mut rows)?;
    }
    let manifest = &export.manifest;
    let merged = manifest
        .static_cache
        .as_ref()
        .is_some_and(|s| s.merged_adapters);
    let fast_tolerance = match merged && manifest.weights_dtype == "f16" {
        true => MERGED_F16_TOLERANCE,
        false => TOLERANCE,
    };
    let fast_outputs = [DRAFT_LOGITS, EXIT_PROB, EXIT_STATES];
    for &kind in kinds
        .iter()
        .filter(|&&k| !(static_model && k == GraphKind::Model))
    {
        let mut session = load(kind)?;
        let name = kind.file_name();
        let mut feeder = Feeder::new(
            model,
            kind.layers(n, e),
            export.static_l_max(runner_kind(kind)),
        );
        for (c, chunk) in chunks.iter().enumerate() {
            // Output `tensor` of this chunk's run against `want`: the row is kept, the output
            // returned.
            let mut checked = |out: &Outputs, tensor: &str, want: &ArrayD<f32>| {
                let got = output(out, tensor)?;
                let tag = format!("{tensor} (chunk {})", c + 1);
                let mut row = compare(&name, &tag, &got, want);
                if kind == GraphKind::Draft && fast_outputs.contains(&tensor) {
                    row.tolerance = fast_tolerance;
                }
                rows.push(row);
                Ok::<_, Error>(got)
            };
            let hidden = batch1(reference.hidden[c].view());
            let logits = batch1(reference.logits[c].view());
            match kind {
                GraphKind::Model => {
                    let out = feeder.run(&mut session, Rows::Ids(ids(chunk)), chunk.len(), None)?;
                    model_logits.push(checked(&out, LOGITS, &logits)?);
                }
                GraphKind::Draft => {
                    let bridge = batch1(reference.bridge_states[c].view());
                    let bridged = m2r2.bridge_at(draft_gate).is_some();
                    let extra = bridged.then_some((BRIDGE_STATES, &bridge));
                    let out =
                        feeder.run(&mut session, Rows::Ids(ids(chunk)), chunk.len(), extra)?;
                    if bridged {
                        checked(&out, EXIT_STATES, &batch1(reference.exit_states[c].view()))?;
                    }
                    let draft_logits = batch1(reference.draft_logits[c].view());
                    checked(&out, DRAFT_LOGITS, &draft_logits)?;
                    if let Some(p) = &reference.exit_prob[c] {
                        let want =
                            ArrayD::from_shape_vec(vec![1, p.len()], p.clone()).expect("[1, T]");
                        checked(&out, EXIT_PROB, &want)?;
                    }
                    draft_hidden.push(checked(&out, HIDDEN_STATES, &hidden)?);
                }
                GraphKind::Feed => {
                    let out = feeder.run(&mut session, Rows::Ids(ids(chunk)), chunk.len(), None)?;
                    feed_hidden.push(checked(&out, HIDDEN_STATES, &hidden)?);
                }
                GraphKind::Verifier => {
                    let out = feeder.run(&mut session, Rows::Hidden(&hidden), chunk.len(), None)?;
                    checked(&out, LOGITS, &logits)?;
                    if m2r2.bridge_at(draft_gate).is_some() {
                        checked(&out, FINAL_STATES, &batch1(reference.finals[c].view()))?;
                    }
                }
            }
        }
        let cache = match kind {
            GraphKind::Draft | GraphKind::Feed => &reference.draft_cache,
            _ => &reference.cache,
        };
        compare_presents(&name, model, &feeder, cache, &mut rows);
    }
    // draft (or feed) -> verifier on ONNX Runtime alone reproduces model.onnx
    for (chain, hidden) in [
        ("draft.onnx -> verifier.onnx", &draft_hidden),
        ("feed.onnx -> verifier.onnx", &feed_hidden),
    ] {
        if !kinds.contains(&GraphKind::Verifier) || model_logits.is_empty() || hidden.is_empty() {
            continue;
        }
        let mut session = load(GraphKind::Verifier)?;
        let mut feeder = Feeder::new(
            model,
            GraphKind::Verifier.layers(n, e),
            export.static_l_max(runner_kind(GraphKind::Verifier)),
        );
        for (c, chunk) in chunks.iter().enumerate() {
            let out = feeder.run(&mut session, Rows::Hidden(&hidden[c]), chunk.len(), None)?;
            rows.push(compare(
                chain,
                &format!("logits vs model.onnx (chunk {})", c + 1),
                &output(&out, LOGITS)?,
                &model_logits[c],
            ));
        }
    }
    Ok(rows)
}

/// The runner's name for graph `kind`.
fn runner_kind(kind: GraphKind) -> onnx_runner::manifest::GraphKind {
    use onnx_runner::manifest::GraphKind as Runner;
    match kind {
        GraphKind::Model => Runner::Model,
        GraphKind::Draft => Runner::Draft,
        GraphKind::Verifier => Runner::Verifier,
        GraphKind::Feed => Runner::Feed,
    }
}

fn runner_error(e: onnx_runner::Error) -> Error {
    Error::Invalid(format!("ONNX Runtime: {e}"))
}
