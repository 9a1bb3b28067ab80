//! What a speculative golden is replayed on: the engine ([`SpeculativeEngine`]) and what it
//! calls the parts that recompute each tensor ([`EngineGraphs`]), [`REFERENCE`] for the reference.

use super::WeightsId;
use crate::base::config::ModelConfig;
use crate::base::generate::GreedyBackend;
use crate::decode::speculative::SpeculativeBackend;

/// The name the reference goes by in reports.
pub const REFERENCE: &str = "reference";

/// An engine a speculative golden is replayed on, and what it was built from (checked against
/// the golden before anything runs).
pub struct SpeculativeEngine<'a> {
    /// Runs the speculative loop: drafts and verifies.
    pub speculation: &'a mut dyn SpeculativeBackend,
    /// Recomputes the logits along the recorded tokens.
    pub greedy: &'a mut dyn GreedyBackend,
    pub config: &'a ModelConfig,
    /// The M2R2 weights the engine runs ([`WeightsId`]; `None`: unknown, refused).
    pub weights: Option<&'a WeightsId>,
    /// The gate it drafts at, 1-based.
    pub draft_gate: usize,
    /// What the engine calls the parts that recompute each tensor.
    pub graphs: EngineGraphs<'a>,
}

/// What an engine calls the parts that recompute a golden's tensors, named on every report line
/// (an export: its graph files).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineGraphs<'a> {
    /// The base model alone (greedy logits).
    pub greedy: &'a str,
    /// The draft (its logits and gate scores).
    pub draft: &'a str,
    /// The verifier (verified rows, and the prompt's row).
    pub verify: &'a str,
    /// The whole speculative loop (tokens, rounds).
    pub decode: &'a str,
}

impl EngineGraphs<'static> {
    pub const REFERENCE: EngineGraphs<'static> = EngineGraphs {
        greedy: REFERENCE,
        draft: REFERENCE,
        verify: REFERENCE,
        decode: REFERENCE,
    };
}
