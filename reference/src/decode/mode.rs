//! The decoding modes behind one call: [`run_mode`] runs greedy, early-exit or self-speculative
//! decoding on the reference and returns a mode-independent [`ModeRun`] (tokens, per-token steps,
//! timings, work, the mode's own figures). The command line only parses flags into
//! [`M2r2Settings`] and prints the run; the ONNX runner builds the same [`ModeRun`] from its own
//! loops with [`greedy_run`] and [`speculative_run`].
//!
//! | mode          | what runs                                                | docs/m2r2/     |
//! |---------------|----------------------------------------------------------|----------------|
//! | `greedy`      | the base model alone (M2R2 weights unused)               | streams.md     |
//! | `early-exit`  | exit at the first gate whose score reaches the threshold | early_exit.md  |
//! | `speculative` | draft with the fast stream at the draft gate, verify     | speculative.md |
//!
//! Per-token figures (`layers_per_token`, work per token) are per decoded token: the work after
//! the prompt divided by `tokens.len() - 1`, because the first generated token comes from the
//! prompt's prefill in every mode.

use crate::base::generate::{GenerateOptions, Generation, generate};
use crate::base::model::Model;
use crate::base::sampling::SamplingParams;
use crate::base::tree::TokenTree;
use crate::base::work::Work;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
use crate::decode::prompt_lookup::{LookupConfig, with_lookup_branch};
use crate::decode::speculative::{
    DraftLength, Round, SpeculativeOptions, SpeculativeOutput, speculative_generate,
};
use crate::decode::timed::Timed;
use crate::decode::tree_backend::{TreeBackend, tree_positions};
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_speculation::{
    TreeDrafting, TreeRound, TreeSpeculativeOutput, tree_speculate_drafting,
};
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::exit_threshold::ExitThreshold;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use std::time::Instant;

/// Which decoding loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The base model, one token per forward
    Greedy,
    /// Emit a token at the first exit gate whose score reaches --threshold
    /// (docs/m2r2/early_exit.md)
    EarlyExit,
    /// Lossless self-speculation: draft at --draft-gate, verify with the full model
    /// (docs/m2r2/speculative.md)
    Speculative,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Greedy => "greedy",
            Mode::EarlyExit => "early-exit",
            Mode::Speculative => "speculative",
        }
    }
}

/// The M2R2 settings of one run, every default resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct M2r2Settings {
    pub mode: Mode,
    /// Where the weights came from, for reports.
    pub source: String,
    pub gates: Vec<usize>,
    pub gate: GateKind,
    pub threshold: f32,
    /// Early exit only: one threshold per gate in place of `threshold` (`--threshold A,B,...`, or
    /// the config's `early_exit`); `None`: `threshold` at every gate.
    pub gate_thresholds: Option<Vec<f32>>,
    pub kv_policy: KvPolicy,
    pub draft_gate: usize,
    pub draft_length: DraftLength,
    /// `K` of the pruned draft head the speculative drafts use; `None`: the full head (or not
    /// speculative).
    pub draft_head_tokens: Option<usize>,
}

impl M2r2Settings {
    /// The early-exit threshold: per gate when set, else `threshold` at every gate.
    pub fn exit_threshold(&self) -> ExitThreshold {
        match &self.gate_thresholds {
            Some(t) => ExitThreshold::PerGate(t.clone()),
            None => ExitThreshold::Shared(self.threshold),
        }
    }
}

/// One emitted token, whatever the mode.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenStep {
    pub token: u32,
    /// Slow-stream layers this token had computed when it was emitted (N unless it exited early).
    pub layers: usize,
    /// early-exit: the gate it exited at (1-based), `None` when it ran all layers.
    pub exit_gate: Option<usize>,
    /// early-exit: the gate scores evaluated for this token.
    pub scores: Vec<f32>,
    /// greedy: the chosen token's logit and softmax probability.
    pub logit: Option<f32>,
    pub probability: Option<f32>,
    /// speculative: the round that emitted it (`None` for the prompt's token) and whether it was an
    /// accepted draft (`false`: the base model's correction or bonus token).
    pub round: Option<usize>,
    pub accepted_draft: bool,
}

impl TokenStep {
    pub fn plain(token: u32, layers: usize) -> Self {
        TokenStep {
            token,
            layers,
            exit_gate: None,
            scores: Vec::new(),
            logit: None,
            probability: None,
            round: None,
            accepted_draft: false,
        }
    }
}

/// What a mode-specific loop reports beyond tokens.
#[derive(Clone, Debug)]
pub enum ModeDetails {
    Greedy,
    EarlyExit {
        /// Tokens that exited at gate g (index g-1), last entry: no exit.
        histogram: Vec<usize>,
        /// Mean slow layers a decoded token had computed when it was emitted (under `exact` the
        /// skipped ones run later, so `layers_per_token` stays N).
        layers_at_emit: f64,
    },
    Speculative {
        rounds: Vec<Round>,
        mean_accepted_tokens: f64,
        acceptance_by_position: Vec<f64>,
        acceptance_rate: f64,
    },
    /// Speculation with a token tree (`decode/tree_speculation.rs`), greedy or sampled.
    TreeSpeculative {
        /// The shape `W1,W2,...`.
        widths: Vec<usize>,
        /// Nodes of the tree, the root included.
        nodes: usize,
        /// The prompt-lookup branch each round may add at the root (`None`: off).
        prompt_lookup: Option<LookupConfig>,
        /// Dynamic drafting per branch: the gate and its threshold (`None`: the whole shape
        /// every round).
        dynamic: Option<(GateKind, f32)>,
        /// Each round's tree (a lookup branch included) and its nodes' tokens.
        rounds: Vec<TreeRound>,
        /// Tokens emitted per verification (accepted drafts plus the base token).
        mean_accepted_tokens: f64,
        /// Per depth `d = 1..=D` (`D` of the largest round tree, a lookup branch included): the
        /// fraction of rounds that accepted at least `d` drafts.
        acceptance_by_depth: Vec<f64>,
    },
}

/// The result of one decode in any mode.
#[derive(Clone, Debug)]
pub struct ModeRun {
    pub mode: Mode,
    pub tokens: Vec<u32>,
    pub steps: Vec<TokenStep>,
    /// Prefill time; `None` when the loop does not separate it (early-exit).
    pub prefill_seconds: Option<f64>,
    /// Decode time (early-exit: prefill included).
    pub decode_seconds: f64,
    /// Work after the prompt's prefill.
    pub work: Work,
    /// Slow layer-rows computed per decoded token (speculative: rejected drafts included).
    pub layers_per_token: f64,
    pub num_layers: usize,
    pub details: ModeDetails,
}

impl ModeRun {
    /// Record that a tree run drafted dynamically per branch with this gate and threshold (a
    /// no-op for other runs).
    pub fn set_dynamic_tree(&mut self, gate: Option<(GateKind, f32)>) {
        if let ModeDetails::TreeSpeculative { dynamic, .. } = &mut self.details {
            *dynamic = gate;
        }
    }

    /// Tokens decoded after the prompt's prefill produced the first.
    pub fn decoded(&self) -> usize {
        self.tokens.len().saturating_sub(1)
    }

    pub fn tokens_per_second(&self) -> f64 {
        if self.decode_seconds > 0.0 {
            self.decoded() as f64 / self.decode_seconds
        } else {
            0.0
        }
    }
}

/// What to decode.
pub struct DecodeRequest<'a> {
    pub prompt: &'a [u32],
    pub max_new_tokens: usize,
    pub stop_tokens: Vec<u32>,
    pub sampling: Option<SamplingParams>,
}

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
            let capacity = speculative_positions(model, request, drafts)?;
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
/// [`tree_positions`], refused beyond the context with the drafts named.
fn speculative_positions(
    model: &Model,
    request: &DecodeRequest<'_>,
    drafts: usize,
) -> Result<usize> {
    let (prompt, new_tokens) = (request.prompt.len(), request.max_new_tokens);
    let needed = tree_positions(0, prompt, new_tokens, drafts + 1);
    let context = model.context_length();
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
    let capacity = speculative_positions(model, request, largest.nodes() - 1)?;
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

/// The report of a tree speculation run `out` of `tree` (shape `widths`) on a model of `n`
/// layers that took `seconds` in all (prefill included), with the `work` of its draft and verify
/// steps (`Work::default()` where the engine does not count it).
pub fn tree_speculative_run(
    out: TreeSpeculativeOutput,
    tree: &TokenTree,
    widths: &[usize],
    n: usize,
    seconds: f64,
    work: Work,
) -> ModeRun {
    tree_speculative_run_with_lookup(out, tree, widths, None, n, seconds, work)
}

/// [`tree_speculative_run`] of a run whose rounds may have had a `lookup` branch.
pub fn tree_speculative_run_with_lookup(
    out: TreeSpeculativeOutput,
    tree: &TokenTree,
    widths: &[usize],
    lookup: Option<LookupConfig>,
    n: usize,
    seconds: f64,
    work: Work,
) -> ModeRun {
    let accepted: Vec<usize> = out.rounds.iter().map(|r| r.accepted).collect();
    let steps = speculative_steps(&out.tokens, &accepted, n);
    let rows = out.verified_nodes();
    let depth = with_lookup_branch(tree, lookup.map_or(0, |l| l.max_tokens))
        .tree
        .max_depth();
    ModeRun {
        mode: Mode::Speculative,
        layers_per_token: (rows * n) as f64 / out.tokens.len().saturating_sub(1).max(1) as f64,
        details: ModeDetails::TreeSpeculative {
            widths: widths.to_vec(),
            nodes: tree.nodes(),
            prompt_lookup: lookup,
            dynamic: None,
            mean_accepted_tokens: out.mean_accepted_length(),
            acceptance_by_depth: out.acceptance_by_depth(depth),
            rounds: out.rounds,
        },
        tokens: out.tokens,
        steps,
        prefill_seconds: Some(out.prefill_seconds),
        decode_seconds: (seconds - out.prefill_seconds).max(0.0),
        work,
        num_layers: n,
    }
}

/// A greedy step: the token with its logit and probability under `logits`.
pub fn greedy_step(token: u32, logits: &[f32], n: usize) -> TokenStep {
    let mut step = TokenStep::plain(token, n);
    let (logit, probability) = logit_and_probability(logits, token);
    step.logit = Some(logit);
    step.probability = Some(probability);
    step
}

/// The [`ModeRun`] of a greedy generation over an `n`-layer model, its steps from [`greedy_step`].
pub fn greedy_run(generation: Generation, steps: Vec<TokenStep>, n: usize) -> ModeRun {
    ModeRun {
        mode: Mode::Greedy,
        layers_per_token: n as f64,
        tokens: generation.tokens,
        steps,
        prefill_seconds: Some(generation.prefill_seconds),
        decode_seconds: generation.decode_seconds,
        work: generation.work,
        num_layers: n,
        details: ModeDetails::Greedy,
    }
}

/// The [`ModeRun`] of a speculative decode over an `n`-layer model that took `seconds` in all,
/// `prefill_seconds` of them in the prompt's prefill.
pub fn speculative_run(
    out: SpeculativeOutput,
    n: usize,
    prefill_seconds: f64,
    seconds: f64,
    work: Work,
) -> ModeRun {
    let accepted: Vec<usize> = out.rounds.iter().map(|r| r.accepted).collect();
    let steps = speculative_steps(&out.tokens, &accepted, n);
    let fed: usize = out.rounds.iter().map(|r| r.drafted.len() + 1).sum();
    ModeRun {
        mode: Mode::Speculative,
        layers_per_token: (fed * n) as f64 / out.tokens.len().saturating_sub(1).max(1) as f64,
        details: ModeDetails::Speculative {
            mean_accepted_tokens: out.mean_accepted_length(),
            acceptance_by_position: out.acceptance_by_position(),
            acceptance_rate: out.acceptance_rate(),
            rounds: out.rounds,
        },
        tokens: out.tokens,
        steps,
        prefill_seconds: Some(prefill_seconds),
        decode_seconds: (seconds - prefill_seconds).max(0.0),
        work,
        num_layers: n,
    }
}

/// The emitted tokens of speculative decoding, attributed to their rounds (`accepted[r]`: the
/// drafts round `r` accepted). The output may stop inside a round (a stop token or
/// `max_new_tokens`), so tokens lead and rounds follow.
fn speculative_steps(tokens: &[u32], accepted: &[usize], n: usize) -> Vec<TokenStep> {
    let mut steps: Vec<TokenStep> = tokens
        .first()
        .map(|&t| TokenStep::plain(t, n))
        .into_iter()
        .collect();
    let mut rest = tokens.iter().skip(1);
    'rounds: for (r, &round_accepted) in accepted.iter().enumerate() {
        for i in 0..=round_accepted {
            let Some(&token) = rest.next() else {
                break 'rounds;
            };
            steps.push(TokenStep {
                round: Some(r),
                accepted_draft: i < round_accepted,
                ..TokenStep::plain(token, n)
            });
        }
    }
    steps
}

/// The chosen token's logit and its probability under `softmax(logits)`.
fn logit_and_probability(logits: &[f32], token: u32) -> (f32, f32) {
    let logit = logits[token as usize];
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (logit, (logit - max).exp() / sum)
}
