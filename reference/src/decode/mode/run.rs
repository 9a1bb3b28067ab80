//! Running a decoding mode on the reference: [`run_mode`] (greedy, early exit, chain
//! speculation) and the token-tree loop ([`tree_speculative_mode_run`], [`tree_run_on`] on any
//! engine), each returning its [`ModeRun`].

use super::report::{greedy_run, greedy_step, speculative_run, tree_speculative_run_with_lookup};
use super::{DecodeRequest, M2r2Settings, Mode, ModeDetails, ModeRun, TokenStep};
use crate::base::generate::{GenerateOptions, generate};
use crate::base::model::Model;
use crate::base::tree::TokenTree;
use crate::base::work::Work;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, early_exit_generate};
use crate::decode::prompt_lookup::{LookupConfig, with_lookup_branch};
use crate::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use crate::decode::timed::Timed;
use crate::decode::tree_backend::{TreeBackend, tree_positions};
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_speculation::{TreeDrafting, tree_speculate_drafting};
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use std::time::Instant;

/// Run `settings.mode`. `on_token` sees every emitted token: as it is chosen in greedy mode, after
/// the loop in the other modes. `record_scores` asks speculative decoding to score every proposal
/// (for `--trace`), which costs the gate's work.
pub fn run_mode(
    model: &Model,
    weights: &M2r2Weights,
    settings: &M2r2Settings,
    request: &DecodeRequest<'_>,
    record_scores: bool,
    on_token: &mut dyn FnMut(u32),
) -> Result<ModeRun> {
    let n = model.config.num_hidden_layers;
    let run = match settings.mode {
        Mode::Greedy => {
            let options = GenerateOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                sampling: request.sampling.clone(),
            };
            let mut steps = Vec::new();
            let generation = generate(model, request.prompt, &options, &mut |token, logits| {
                steps.push(greedy_step(token, logits, n));
                on_token(token);
            })?;
            greedy_run(generation, steps, n)
        }
        Mode::EarlyExit => {
            let options = EarlyExitOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                gate: settings.gate,
                threshold: settings.exit_threshold(),
                kv_policy: settings.kv_policy,
                sampling: request.sampling.clone(),
            };
            let start = Instant::now();
            let out = early_exit_generate(M2r2::new(model, weights), request.prompt, &options)?;
            let seconds = start.elapsed().as_secs_f64();
            let steps = out
                .trace
                .iter()
                .map(|t| TokenStep {
                    exit_gate: t.exit_gate,
                    scores: t.scores.clone(),
                    ..TokenStep::plain(t.token, t.layers_at_emit)
                })
                .collect();
            for &token in &out.tokens {
                on_token(token);
            }
            ModeRun {
                mode: Mode::EarlyExit,
                layers_per_token: out.layers_per_token(),
                details: ModeDetails::EarlyExit {
                    histogram: out.exit_histogram(weights.config.num_gates()),
                    layers_at_emit: {
                        let decoded = &out.trace[out.trace.len().min(1)..];
                        let sum: usize = decoded.iter().map(|t| t.layers_at_emit).sum();
                        sum as f64 / decoded.len().max(1) as f64
                    },
                },
                tokens: out.tokens,
                steps,
                prefill_seconds: None,
                decode_seconds: seconds,
                work: out.work,
                num_layers: n,
            }
        }
        Mode::Speculative => {
            let gate = (record_scores
                || matches!(settings.draft_length, DraftLength::Dynamic { .. }))
            .then_some(settings.gate);
            // a chain of drafts is a tree of drafts + 1 nodes
            let drafts = settings.draft_length.max();
            let capacity = speculative_positions(model.context_length(), request, drafts)?;
            let inner = ReferenceSpeculation::new(
                M2r2::new(model, weights),
                settings.draft_gate,
                gate,
                capacity,
            )?;
            let mut backend = Timed::new(inner);
            let options = SpeculativeOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                draft_length: settings.draft_length.clone(),
                sampling: request.sampling.clone(),
            };
            let start = Instant::now();
            let out = speculative_generate(&mut backend, request.prompt, &options)?;
            let seconds = start.elapsed().as_secs_f64();
            for &token in &out.tokens {
                on_token(token);
            }
            let work = backend.inner.work();
            speculative_run(out, n, backend.times.prefill_seconds, seconds, work)
        }
    };
    Ok(run)
}

/// The cache positions a speculative decode of `request` needs when its rounds draft up to
/// `drafts` positions past the last token (a chain's length, a tree's nodes below its root):
/// [`tree_positions`], refused beyond the model's `context` with the drafts named. Both engines
/// count so (the ONNX runner for dynamic exports, whose cache grows to the context).
pub fn speculative_positions(
    context: usize,
    request: &DecodeRequest<'_>,
    drafts: usize,
) -> Result<usize> {
    let (prompt, new_tokens) = (request.prompt.len(), request.max_new_tokens);
    let needed = tree_positions(0, prompt, new_tokens, drafts + 1);
    if needed > context {
        return Err(Error::Invalid(format!(
            "sequence needs {needed} positions but the context holds {context}: a prompt of \
             {prompt} token(s), {new_tokens} new token(s) and rounds that draft up to {drafts} \
             position(s) past the last token (shorten the prompt, lower --max-new-tokens or draft \
             fewer tokens)"
        )));
    }
    Ok(needed)
}

/// Speculative decoding with the token tree of shape `widths` (`W1,W2,...`), drafting at
/// `settings.draft_gate` (`decode/tree_speculation.rs`): greedy, or speculative sampling with
/// `request.sampling` (`decode/tree_sampling.rs`); with `lookup`, a prompt-lookup branch at the
/// root of the rounds that find one (`decode/prompt_lookup.rs`; sampled, its tokens are verified
/// as deterministic proposals). `on_token` sees
/// every emitted token after the loop. The draft and verify steps' work is counted
/// (`ReferenceTreeSpeculation::work`).
///
/// # Errors
/// A shape [`TokenTree::from_widths`] refuses, a draft gate outside `1..=J`, and
/// [`tree_speculate_drafting`]'s.
pub fn tree_speculative_mode_run(
    model: &Model,
    weights: &M2r2Weights,
    settings: &M2r2Settings,
    request: &DecodeRequest<'_>,
    widths: &[usize],
    lookup: Option<LookupConfig>,
    on_token: &mut dyn FnMut(u32),
) -> Result<ModeRun> {
    let tree = TokenTree::from_widths(widths)?;
    let n = model.config.num_hidden_layers;
    // the last round's tree (a lookup branch included) may reach past the budget
    let largest = with_lookup_branch(&tree, lookup.map_or(0, |l| l.max_tokens)).tree;
    let capacity = speculative_positions(model.context_length(), request, largest.nodes() - 1)?;
    let m2r2 = M2r2::new(model, weights);
    // dynamic drafting per branch: the settings' gate scores each node, its threshold prunes
    let dynamic = match settings.draft_length {
        DraftLength::Dynamic {
            gate, threshold, ..
        } => Some((gate, threshold)),
        DraftLength::Fixed(_) => None,
    };
    let mut backend = ReferenceTreeSpeculation::new(m2r2, settings.draft_gate, capacity)?
        .with_gate(dynamic.map(|d| d.0));
    let run = tree_run_on(
        &mut backend,
        (&tree, widths),
        (dynamic, lookup),
        request,
        n,
        |b| b.work(),
    )?;
    for &token in &run.tokens {
        on_token(token);
    }
    Ok(run)
}

/// The tree loop ([`tree_speculate_drafting`]) of `request` on any engine's `backend`, timed from
/// the prefill on, and its report: the tree `tree` of shape `widths`, grown per branch while
/// `dynamic`'s gate scores at least its threshold, or whole, with an optional `lookup` branch; `n`
/// layers; `work` reads the backend's counted work after the run.
///
/// # Errors
/// The loop's.
pub fn tree_run_on<B: TreeBackend>(
    backend: &mut B,
    (tree, widths): (&TokenTree, &[usize]),
    (dynamic, lookup): (Option<(GateKind, f32)>, Option<LookupConfig>),
    request: &DecodeRequest<'_>,
    n: usize,
    work: impl FnOnce(&B) -> Work,
) -> Result<ModeRun> {
    let drafting = TreeDrafting {
        threshold: dynamic.map(|d| d.1),
        lookup,
    };
    let request_tuple = (
        request.prompt,
        request.max_new_tokens,
        &request.stop_tokens[..],
    );
    let start = Instant::now();
    let out = tree_speculate_drafting(
        backend,
        tree,
        drafting,
        request_tuple,
        request.sampling.clone(),
    )?;
    let seconds = start.elapsed().as_secs_f64();
    let work = work(backend);
    let mut run = tree_speculative_run_with_lookup(out, tree, widths, lookup, n, seconds, work);
    run.set_dynamic_tree(dynamic);
    Ok(run)
}
