//! Golden files of the M2R2 modes (format version 2): an early-exit or self-speculative greedy
//! decode with every step's decisions, so a deployment can check its M2R2 behaviour against the
//! reference.
//!
//! Dimensions: `n` emitted tokens, `J` gates, `V` vocabulary, `R` verification rounds, `M` the
//! longest draft (`draft_max`).
//!
//! | mode          | tensor             | dtype | shape      | meaning                                         |
//! |---------------|--------------------|-------|------------|-------------------------------------------------|
//! | both          | `logits`           | F32   | `[n, V]`   | the logits token i was emitted from             |
//! | `early-exit`  | `exit_gate`        | I64   | `[n]`      | gate token i exited at (1-based), 0 = all layers |
//! | `early-exit`  | `gate_scores`      | F32   | `[n, J]`   | gate scores, NaN where a gate was not evaluated |
//! | `speculative` | `round_drafted`    | I64   | `[R, M]`   | drafted tokens, padded with -1                  |
//! | `speculative` | `round_accepted`   | I64   | `[R]`      | drafted tokens accepted                         |
//! | `speculative` | `round_base_token` | I64   | `[R]`      | the base token after them (correction or bonus) |
//! | `speculative` | `round_scores`     | F32   | `[R, M+1]` | draft gate scores (dynamic drafting), NaN pad   |
//! | `speculative` | `verify_logits`    | F32   | `[T, V]`   | every verified row (format 3), see below        |
//! | `speculative` | `draft_logits`     | F32   | `[Q, V]`   | the draft's logits at every proposal (format 3) |
//!
//! The rounds emit the tokens: the first comes from the prompt's row, then round r emits its
//! `accepted[r]` drafts and its base token, all of them but in the last round, which the budget or
//! a stop token may cut (a file whose rounds do not emit its `n` tokens so is refused).
//!
//! `verify_logits` holds the prompt's last row, then round by round every row the verifier
//! finished (the round's first token and each drafted one, accepted or not): `T = 1 + Σ_r
//! (d_r + 1)` with `d_r` the drafts of round r. `draft_logits` holds the draft's exit logits at
//! every proposal, round by round: `Q = Σ_r p_r`, `p_r` the larger of `d_r` and the scores of
//! round r (a dynamic draft stops at a proposal whose score is under the threshold). With a
//! pruned draft head the draft's logits are `-inf` outside its tokens.
//!
//! Metadata of both modes: `m2r2_config` (the [`M2r2Config`](crate::m2r2::config::M2r2Config) as
//! JSON, with its `bridge` entry when the drafts read the verified state), `m2r2_hash`
//! ([`weights_hash`], the bridge's maps included) and, since the drafting defaults were left out
//! of a second hash, `m2r2_weights_hash` ([`weights_hash_without_defaults`]; see [`WeightsId`]).
//! The settings are checked against those hashes where the weights' tensors are at hand
//! (`settings.rs`: [`M2r2Golden::check_settings`]).
//! Early exit: `gate`, `threshold`, `kv_policy`.
//! Speculative: `draft_gate` (1-based), `gate` (scored at each proposal, or `none`),
//! `draft_length` (`fixed` or `dynamic`), `draft_max`, and `draft_threshold` when dynamic.
//!
//! Logits. Early exit: row i is the exit logits `LMHead(FinalNorm(u_g))` of the gate token i exited
//! at, or the final logits when it ran all layers. Speculative: the base model's (verify) logits
//! each token was emitted from (row 0: the prompt's).
//!
//! Speculative goldens that draft a token tree (`draft_length` = `tree`, format version 4; 5 when
//! the tree changes from round to round) record the tree's rounds instead of `round_drafted` and
//! `round_scores`: see [`tree`].
use super::file::GoldenFile;
use crate::decode::early_exit::KvPolicy;
use crate::decode::speculative::DraftLength;
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::exit_threshold::ExitThreshold;
use ndarray::Array2;

mod check;
mod engine;
#[cfg(test)]
mod metadata_tests;
mod mode_file;
mod record;
mod rounds;
mod rounds_compare;
mod settings;
#[cfg(test)]
mod tests;
pub mod tree;
mod tree_compare;
mod tree_file;
#[cfg(test)]
mod tree_grown_tests;
mod tree_replay;
mod tree_rounds;
#[cfg(test)]
mod tree_tests;
mod weights_id;
#[cfg(test)]
mod weights_id_tests;

pub(super) use check::{Against, DraftTies, compare_graph_outputs, compare_rounds, compare_scores};
pub use check::{EngineGraphs, REFERENCE, SpeculativeEngine};
pub use record::early_exit_logits;
pub use rounds::RoundTensors;
pub use tree::{TreeEngine, TreeRecipe, TreeRounds};
pub(super) use tree_compare::{compare_tree_graph_outputs, compare_tree_rounds};
pub use weights_id::{WeightsId, weights_hash, weights_hash_without_defaults};

/// What an M2R2 golden records besides the greedy fields.
#[derive(Clone, Debug, PartialEq)]
pub struct M2r2Golden {
    /// `m2r2_config`: the M2R2 settings as JSON
    pub config_json: String,
    /// `m2r2_hash` and `m2r2_weights_hash`: the M2R2 weights recorded with.
    pub weights: WeightsId,
    pub record: M2r2Record,
}

#[derive(Clone, Debug, PartialEq)]
pub enum M2r2Record {
    EarlyExit {
        gate: GateKind,
        /// Shared, or per gate (metadata `threshold` = `A,B,...`, written since per-gate
        /// thresholds; older readers refuse such files by name).
        threshold: ExitThreshold,
        kv_policy: KvPolicy,
        /// `[n]` 1-based exit gate, 0 = all layers
        exit_gate: Vec<i64>,
        /// `[n, J]` NaN where not evaluated
        gate_scores: Array2<f32>,
    },
    Speculative {
        /// 1-based
        draft_gate: usize,
        /// The gate scored at each proposal (needed by dynamic drafting).
        gate: Option<GateKind>,
        draft_length: DraftLength,
        rounds: RoundTensors,
        /// What the verifier and the draft produced along the rounds; `None` in files before
        /// format version 3.
        graphs: Option<Box<GraphOutputs>>,
    },
    /// Speculative decoding with a token tree (format version 4; 5 when rounds grow or carry a
    /// lookup branch: [`tree`]).
    SpeculativeTree {
        /// The shape, the draft gate, and how each round's tree is chosen.
        recipe: TreeRecipe,
        rounds: TreeRounds,
        /// `verify_logits`: the prompt's row, then every node of every round; `draft_logits`:
        /// every proposing node of every round
        graphs: Box<GraphOutputs>,
    },
}

/// What each graph of a speculative deployment produced along the recorded rounds (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphOutputs {
    /// `[T, V]`: the prompt's last row, then every verified row, round by round
    pub verify_logits: Array2<f32>,
    /// `[Q, V]`: the draft's logits at every proposal, round by round
    pub draft_logits: Array2<f32>,
}

impl M2r2Golden {
    /// Whether this records a token tree (format version 4).
    pub fn is_tree(&self) -> bool {
        matches!(self.record, M2r2Record::SpeculativeTree { .. })
    }

    /// The draft head the drafts were scored with, read off the recorded draft logits (a pruned
    /// head's are `-inf` outside its tokens): `Some(None)` the full head, `Some(Some(ids))` a
    /// pruned head over the token ids `ids`; `None` when the golden cannot say (not speculative,
    /// written before format 3, or no proposal recorded).
    pub fn recorded_draft_head(&self) -> Option<Option<Vec<u32>>> {
        let graphs = match &self.record {
            M2r2Record::Speculative { graphs, .. } => graphs.as_deref()?,
            M2r2Record::SpeculativeTree { graphs, .. } => graphs,
            M2r2Record::EarlyExit { .. } => return None,
        };
        let row = graphs.draft_logits.rows().into_iter().next()?;
        let ids: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| row[i as usize].is_finite())
            .collect();
        Some((ids.len() < row.len()).then_some(ids))
    }

    /// Whether this records token trees that change from round to round (format version 5).
    pub fn is_varying_tree(&self) -> bool {
        matches!(&self.record, M2r2Record::SpeculativeTree { recipe, .. } if recipe.varies())
    }
}

/// An F32 tensor `name` of `rows` rows of logits, read from `file` (any width: a logits tensor's
/// width is checked against the golden's `logits` where it is compared).
fn logits_rows(file: &GoldenFile<'_>, name: &str, rows: usize) -> Result<Array2<f32>> {
    let (shape, values) = file.f32s(name)?;
    let width = shape.get(1).copied().unwrap_or(0);
    file.expect_shape(name, &shape, &[rows, width])?;
    Array2::from_shape_vec((rows, width), values).map_err(|e| {
        Error::format(
            &file.label,
            format!("tensor `{name}` of shape {shape:?}: {e}"),
        )
    })
}
