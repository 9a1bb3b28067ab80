//! One decode of an export folder, greedy or speculative, reported as the reference's modes report
//! (`reference::decode::mode::ModeRun`): the loop `m2r2 run` drives, for library users too.
//!
//! - greedy: model.onnx, one token per run after the prompt's prefill ([`OnnxModel`]);
//! - speculative: draft.onnx proposes and verifier.onnx verifies through the reference's own loop
//!   ([`speculative_generate`] over [`OnnxSpeculation`], timed by [`Timed`]).
//!
//! - speculative with a token tree ([`decode_tree`]): the reference's tree loop
//!   ([`tree_speculate`](reference::decode::tree_speculation::tree_speculate)) over the same graphs of a static export.
//!
//! The drafting settings come from the export's M2R2 settings and the request, by the library's
//! one policy ([`resolve_drafting`]).

use crate::ep::{Ep, EpConfig};
use crate::error::Result;
use crate::greedy::OnnxModel;
use crate::manifest::{ExportDir, GraphKind};
use crate::speculation::OnnxSpeculation;
use crate::static_kv::GraphRuns;
use reference::base::generate::GenerateOptions;
use reference::base::tree::TokenTree;
use reference::base::work::Work;
use reference::decode::drafting::{Drafting, DraftingRequest, resolve_drafting};
use reference::decode::early_exit::KvPolicy;
use reference::decode::mode::{
    DecodeRequest, M2r2Settings, Mode, ModeRun, greedy_run, greedy_step, speculative_run,
};
use reference::decode::mode::{speculative_positions, tree_run_on};
use reference::decode::prompt_lookup::{LookupConfig, with_lookup_branch};
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::decode::timed::Timed;
use reference::decode::tree_backend::tree_positions;
use reference::m2r2::exit_gate::GateKind;
use std::time::Instant;

/// One decode on ONNX Runtime, and the provider that really ran it.
pub struct OnnxRun {
    pub run: ModeRun,
    pub ep_used: Ep,
    /// How the runs went when the decode-time steps were CUDA graphs (`--cuda-graph`).
    pub cuda_graph: Option<GraphRuns>,
}

/// The settings of a decode of `export` in `request`'s mode (greedy or speculative): the gate,
/// threshold and draft length [`resolve_drafting`] gives for the export's M2R2 settings.
pub fn settings(export: &ExportDir, request: DraftingRequest) -> Result<M2r2Settings> {
    let m = &export.manifest;
    let speculative = request.speculative;
    let Drafting {
        gate,
        threshold,
        draft_length,
        ..
    } = resolve_drafting(
        &m.m2r2,
        request,
        m.has_arla,
        "this export has none (draft.onnx has no exit_prob)",
    )?;
    Ok(M2r2Settings {
        mode: match speculative {
            true => Mode::Speculative,
            false => Mode::Greedy,
        },
        source: format!("export {}", export.dir.display()),
        gates: m.m2r2.gates.clone(),
        gate,
        threshold,
        gate_thresholds: None,
        kv_policy: KvPolicy::Exact,
        draft_gate: m.draft_gate,
        draft_length,
        draft_head_tokens: m.draft_head_tokens.filter(|_| speculative),
    })
}

/// Decode `request` on `export` in `settings.mode` on `ep`; `record_scores` scores every proposal
/// (for `--trace`). Early exit is not exported: an error. A budget a static export's buffers may
/// not hold is refused before anything loads (`check_room`, by `tree_positions`).
pub fn decode(
    export: &ExportDir,
    ep: &EpConfig,
    settings: &M2r2Settings,
    request: &DecodeRequest<'_>,
    record_scores: bool,
) -> Result<OnnxRun> {
    let n = export.manifest.config.num_hidden_layers;
    match settings.mode {
        Mode::Greedy => {
            check_room(export, GraphKind::Model, request, 0)?;
            let mut model = OnnxModel::load(export, ep)?;
            let options = GenerateOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                sampling: None,
            };
            let mut steps = Vec::new();
            let generation = model.generate(request.prompt, &options, &mut |token, logits| {
                steps.push(greedy_step(token, logits, n));
            })?;
            Ok(OnnxRun {
                run: greedy_run(generation, steps, n),
                ep_used: model.session().ep_used(),
                cuda_graph: model.cuda_graph_runs(),
            })
        }
        Mode::Speculative => {
            let gate = (record_scores
                || matches!(settings.draft_length, DraftLength::Dynamic { .. }))
            .then_some(settings.gate);
            let drafts = settings.draft_length.max();
            check_room(export, GraphKind::Verifier, request, drafts)?;
            let mut backend = OnnxSpeculation::load(export, ep, gate)?;
            let options = SpeculativeOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                draft_length: settings.draft_length.clone(),
                sampling: None,
            };
            let mut timed = Timed::new(&mut backend);
            let start = Instant::now();
            let out = speculative_generate(&mut timed, request.prompt, &options)?;
            let seconds = start.elapsed().as_secs_f64();
            let prefill = timed.times.prefill_seconds;
            Ok(OnnxRun {
                run: speculative_run(out, n, prefill, seconds, Work::default()),
                ep_used: ep_used(&backend),
                cuda_graph: backend.cuda_graph_runs(),
            })
        }
        Mode::EarlyExit => Err(reference::Error::Invalid(
            "early exit is not exported; use greedy or speculative".into(),
        )
        .into()),
    }
}

/// Speculative decoding of `request` on `export` with the token tree of shape `widths`, drafting at
/// the export's draft gate: greedy, or sampled with `request.sampling` (the reference's rule).
/// `dynamic`: the tree is the largest shape, grown per branch while the gate's score is at least
/// the threshold (the reference's `tree_speculate_dynamic`); `lookup`: greedy, each round also
/// verifies a prompt-lookup branch at the root when it finds one (`tree_speculate_with_lookup`).
///
/// # Errors
/// A shape `TokenTree::from_widths` refuses, an export without `tree_mask`, a budget its static
/// buffers may not hold with this tree (the tree loop's own check, before the prefill:
/// `reference::decode::tree_backend::tree_positions`), and the runs' errors.
pub fn decode_tree(
    export: &ExportDir,
    ep: &EpConfig,
    request: &DecodeRequest<'_>,
    widths: &[usize],
    dynamic: Option<(GateKind, f32)>,
    lookup: Option<LookupConfig>,
) -> Result<OnnxRun> {
    let tree = TokenTree::from_widths(widths)?;
    let n = export.manifest.config.num_hidden_layers;
    if export.static_l_max(GraphKind::Verifier).is_none() {
        // a dynamic export's cache grows to the context: the reference's count and refusal for
        // the largest tree a round drafts (a static one is the tree loop's own check)
        let largest = with_lookup_branch(&tree, lookup.map_or(0, |l| l.max_tokens)).tree;
        let context = export.manifest.config.max_position_embeddings;
        speculative_positions(context, request, largest.nodes() - 1)?;
    }
    let mut backend = OnnxSpeculation::load(export, ep, dynamic.map(|d| d.0))?;
    let run = tree_run_on(
        &mut backend,
        (&tree, widths),
        (dynamic, lookup),
        request,
        n,
        |_| Work::default(),
    )?;
    Ok(OnnxRun {
        run,
        ep_used: ep_used(&backend),
        cuda_graph: backend.cuda_graph_runs(),
    })
}

/// Refuse, before anything loads, a request whose prompt and token budget may not fit a static
/// export's buffers in graph `kind`. Greedy needs `prompt + max_new_tokens - 1` positions (the
/// last token is chosen, never fed). A speculative round writes its `drafts` rows (the chain's
/// draft length) past its last token, and a round that starts one token before the budget still
/// drafts in full, so speculation needs `drafts` more: the count of
/// [`tree_positions`] (token trees: the tree loop's own check, by the same count).
fn check_room(
    export: &ExportDir,
    kind: GraphKind,
    request: &DecodeRequest<'_>,
    drafts: usize,
) -> Result<()> {
    let Some(l) = export.static_l_max(kind) else {
        // a dynamic export's cache grows to the context: speculation counts its drafts there as
        // the reference does (greedy meets the context at the step that passes it)
        if drafts > 0 {
            let context = export.manifest.config.max_position_embeddings;
            speculative_positions(context, request, drafts)?;
        }
        return Ok(());
    };
    let (prompt, max_new) = (request.prompt.len(), request.max_new_tokens);
    let noun = if prompt == 1 { "token" } else { "tokens" };
    let mut why = format!("a prompt of {prompt} {noun} with --max-new-tokens {max_new}");
    if drafts > 0 {
        why = format!("{why} (its rounds draft up to {drafts} positions past the last token)");
    }
    // the largest budget that fits; without one, the longest prompt that leaves one new token
    let fix = match l.checked_sub(prompt + drafts) {
        Some(0) => "ask for at most 1 new token".to_string(),
        Some(room) => format!("ask for at most {} new tokens", room + 1),
        None if l == drafts + 1 => "shorten the prompt to 1 token".to_string(),
        None if l > drafts => format!("shorten the prompt to at most {} tokens", l - drafts),
        None => "draft fewer tokens a round (--draft-len)".to_string(),
    };
    // greedy steps are trees of one node, a chain of `drafts` one of `drafts + 1`
    let needed = tree_positions(0, prompt, max_new, drafts + 1);
    export.check_room(kind, needed, &why, &fix)
}

/// The provider the speculative graphs ran on: they load with the same provider config; the
/// weaker (the CPU) if they differ.
fn ep_used(backend: &OnnxSpeculation) -> Ep {
    let (draft, verifier) = backend.sessions();
    let same = draft.ep_used() == verifier.ep_used()
        && backend
            .feed_session()
            .is_none_or(|f| f.ep_used() == draft.ep_used());
    if same { draft.ep_used() } else { Ep::Cpu }
}
