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
//!
//! This file holds the types; `mode/run.rs` runs the modes on the reference, `mode/report.rs`
//! builds a [`ModeRun`] from a decoding loop's output.

use crate::base::sampling::SamplingParams;
use crate::base::work::Work;
use crate::decode::early_exit::KvPolicy;
use crate::decode::prompt_lookup::LookupConfig;
use crate::decode::speculative::{DraftLength, Round};
use crate::decode::tree_speculation::TreeRound;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::exit_threshold::ExitThreshold;

mod report;
mod run;

pub use report::{
    greedy_run, greedy_step, speculative_run, tree_speculative_run,
    tree_speculative_run_with_lookup,
};
pub use run::{run_mode, speculative_positions, tree_run_on, tree_speculative_mode_run};

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
