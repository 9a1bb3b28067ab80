//! Token-tree speculative goldens: a greedy decode drafting a token tree
//! (`decode/tree_speculation.rs`) with every round's tree, the accepted node, and what the
//! verifier and the draft produced, so each graph is checked on its own.
//!
//! Two layouts (`tree_file.rs` reads and writes them):
//! - **format version 4**, a fixed tree: every round drafts the whole shape `W1,W2,...`, so every
//!   round's tree is the same and both logits tensors are rectangular;
//! - **format version 5**, trees that change from round to round: grown per branch while the
//!   draft gate's score passes a threshold (dynamic drafting), and/or with a prompt-lookup branch
//!   at the root. Each round's tree, its lookup nodes and its gate scores are recorded too, and
//!   the check reruns the same drafting policy.
//!
//! Dimensions: `R` rounds, `T` the largest round's nodes (root included), `P_r` round `r`'s
//! proposing nodes (the draft's rows of the round), `V` vocabulary.
//!
//! | tensor              | dtype | shape            | meaning                                           |
//! |---------------------|-------|------------------|---------------------------------------------------|
//! | `round_tree_tokens` | I64   | `[R, T]`         | every node's token, breadth-first, -1 past the round's tree; node 0 (the root) is the last emitted token |
//! | `round_node`        | I64   | `[R]`            | the accepted node (its path's drafts were accepted) |
//! | `round_accepted`    | I64   | `[R]`            | drafts accepted: the accepted node's depth        |
//! | `round_base_token`  | I64   | `[R]`            | the base token after the accepted path            |
//! | `verify_logits`     | F32   | `[1 + Σ T_r, V]` | the prompt's last row, then per round every node's verified row, node by node |
//! | `draft_logits`      | F32   | `[Σ P_r, V]`     | per round the draft's logits of each proposing node, breadth-first |
//! | `draft_rows`        | I64   | `[Σ P_r, 2]`     | `(round, node)` of each row of `draft_logits`     |
//! | `round_tree_parents`| I64   | `[R, T - 1]`     | (version 5) the parent of nodes `1..T_r`, -1 past the round's tree |
//! | `round_lookup`      | I64   | `[R, L]`         | (version 5) the lookup branch's nodes by depth, -1 past them |
//! | `round_scores`      | F32   | `[R, S]`         | (version 5) the draft gate's score of each proposing node of a grown round, breadth-first, NaN past them |
//!
//! The proposing nodes follow from the round's tree: in a fixed tree the nodes with a drafted
//! (not looked-up) child; in a grown round every node above the shape's depth that is not on the
//! lookup branch (each runs the draft and is scored; those under the threshold got no children).
//! A reader refuses a file whose `draft_rows` or scores disagree with that.
//!
//! Metadata: `draft_length` = `tree`, `draft_tree` (the shape's widths `W1,W2,...`), `draft_max`
//! (its depth), `draft_gate`, `gate` (`none`, or the gate a grown tree scores with). Version 5
//! adds `tree_threshold` (grown trees) and `prompt_lookup`, `prompt_lookup_ngram` (`MIN,MAX`) for
//! a lookup branch.

use super::M2r2Record;
use super::check::Against;
use super::check::DraftTies;
use super::record::m2r2_golden;
use super::tree_compare::{compare_tree_graph_outputs, compare_tree_rounds};
pub use super::tree_replay::TreeEngine;
use super::tree_replay::{replay_tree_rounds, run_tree_on};
pub use super::tree_rounds::{TreeRecipe, TreeRounds, proposing_nodes, widths_text};
use crate::decode::tree_backend::tree_positions;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::error::{Error, Result};
use crate::golden::report::{CheckReport, Tolerance};
use crate::golden::{GROWN_TREE_FORMAT_VERSION, Golden, TREE_FORMAT_VERSION};
use crate::m2r2::fast_stream::M2r2;

impl Golden {
    /// Record up to `steps` greedy tokens after `prompt` by token-tree speculation on the
    /// reference (`decode/tree_speculation.rs`), drafting the tree of `widths` from `draft_gate`
    /// (1-based) every round and stopping after the first of `stop_tokens`: a fixed tree
    /// ([`Golden::record_tree_drafting`] records the other drafting policies). Written as format
    /// version 4.
    ///
    /// # Errors
    /// [`Golden::record_tree_drafting`]'s.
    pub fn record_tree_speculative(
        m2r2: M2r2<'_>,
        name: &str,
        prompt: &[u32],
        steps: usize,
        draft_gate: usize,
        widths: &[usize],
        stop_tokens: &[u32],
    ) -> Result<Golden> {
        let recipe = TreeRecipe::fixed(draft_gate, widths);
        Golden::record_tree_drafting(m2r2, name, prompt, steps, &recipe, stop_tokens)
    }

    /// Record up to `steps` greedy tokens after `prompt` by token-tree speculation on the
    /// reference drafting as `recipe` says, stopping after the first of `stop_tokens`. `logits`
    /// holds the verify logits each token was emitted from; `verify_logits` every node's verified
    /// row and `draft_logits` every proposing node's draft logits, round by round; a grown tree
    /// also its gate scores. Written as format version 4 for a fixed tree, 5 otherwise.
    ///
    /// # Errors
    /// A tree shape `TokenTree::from_widths` refuses, and what [`ReferenceTreeSpeculation::new`]
    /// and [`tree_speculate_drafting`](crate::decode::tree_speculation::tree_speculate_drafting) refuse (a grown tree's gate without its weights).
    pub fn record_tree_drafting(
        m2r2: M2r2<'_>,
        name: &str,
        prompt: &[u32],
        steps: usize,
        recipe: &TreeRecipe,
        stop_tokens: &[u32],
    ) -> Result<Golden> {
        let shape = recipe.shape()?;
        let capacity = tree_positions(0, prompt.len(), steps, recipe.largest()?.nodes());
        let mut backend = ReferenceTreeSpeculation::new(m2r2, recipe.draft_gate, capacity)?
            .with_gate(recipe.grown.map(|g| g.0));
        let run = run_tree_on(&mut backend, recipe, prompt, steps, stop_tokens)?;
        let rounds = TreeRounds::from_rounds(&run.out.rounds, shape.nodes(), recipe.grown_depth());
        let mut golden = m2r2_golden(
            m2r2,
            name,
            "speculative",
            prompt,
            run.out.tokens,
            run.logits,
            M2r2Record::SpeculativeTree {
                recipe: recipe.clone(),
                rounds,
                graphs: Box::new(run.graphs),
            },
        );
        golden.stop_tokens = Some(stop_tokens.to_vec());
        golden.max_steps = Some(steps);
        golden.version = match recipe.varies() {
            true => GROWN_TREE_FORMAT_VERSION,
            false => TREE_FORMAT_VERSION,
        };
        Ok(golden)
    }

    /// The token tree's widths of a token-tree speculative golden (`None` for other goldens).
    pub fn draft_tree(&self) -> Option<&[usize]> {
        self.tree_recipe().map(|r| &r.widths[..])
    }

    /// How a token-tree speculative golden drafts (`None` for other goldens).
    pub fn tree_recipe(&self) -> Option<&TreeRecipe> {
        match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::SpeculativeTree { recipe, .. }) => Some(recipe),
            _ => None,
        }
    }

    /// Replay this token-tree golden on `engine` (the reference, or an export's graphs through
    /// ONNX Runtime) and check every graph on its own:
    /// - `tokens`, `stop` and `rounds`: the engine's own tree loop ([`tree_speculate_drafting`](crate::decode::tree_speculation::tree_speculate_drafting))
    ///   with the recorded drafting (shape, growth, lookup branch), budget and stop tokens; the
    ///   first round whose tree, node tokens, accepted node or base token differ is reported
    ///   once, naming the node;
    /// - `logits`: the base model recomputed on `engine.greedy` along the recorded tokens;
    /// - `verify_logits`, `draft_logits` (and `round_scores` of a grown tree): the recorded
    ///   rounds replayed with the recorded trees and node tokens fed (each depth drafted, the
    ///   tree verified, the recorded path kept), so every node's verified row and every proposing
    ///   node's draft logits are compared with the recording even after the engine's own decode
    ///   has parted from it.
    ///
    /// Floats within `tol`, integers exactly.
    ///
    /// # Errors
    /// Not a token-tree golden; another model config, other M2R2 weights (or an engine that
    /// cannot say which it runs) or another draft gate than recorded; an engine error (a tree
    /// the engine cannot hold is refused by it, naming its limits; a grown tree on an engine
    /// without the recorded gate).
    pub fn check_tree_on(&self, engine: TreeEngine<'_>, tol: Tolerance) -> Result<CheckReport> {
        let Some((
            recorded,
            M2r2Record::SpeculativeTree {
                recipe,
                rounds,
                graphs: want,
            },
        )) = self.m2r2.as_ref().map(|m| (m, &m.record))
        else {
            return Err(Error::Invalid(format!(
                "this golden records mode `{}` without a token tree (check it as a chain or \
                 greedy golden)",
                self.mode
            )));
        };
        self.check_engine(
            recorded,
            engine.config,
            engine.weights,
            recipe.draft_gate,
            engine.draft_gate,
        )?;
        let shape = recipe.shape()?;
        let graphs = engine.graphs;
        let n = self.tokens.len();

        // the engine's own decode
        engine.speculation.reset();
        let run = run_tree_on(
            engine.speculation,
            recipe,
            &self.prompt_tokens,
            n,
            self.stops(),
        )?;
        let got = TreeRounds::from_rounds(&run.out.rounds, shape.nodes(), recipe.grown_depth());
        let step_rounds = rounds.step_rounds(n);
        let mut entries = self.decoded_checks(graphs.decode, &run.out.tokens, &step_rounds);
        let ties = DraftTies {
            draft_logits: &want.draft_logits,
            tol,
        };
        entries.push(compare_tree_rounds(
            graphs.decode,
            rounds,
            &got,
            Some(&ties),
            Against::Recomputed,
        ));
        // the base model along the recorded tokens
        entries.push(self.base_logits_check(engine.greedy, graphs.greedy, &step_rounds, tol)?);

        // the verifier and the draft along the recorded rounds
        engine.speculation.reset();
        let replayed = replay_tree_rounds(
            engine.speculation,
            &recipe.largest()?,
            &self.prompt_tokens,
            &self.tokens,
            rounds,
        )?;
        entries.extend(compare_tree_graph_outputs(
            (graphs.verify, graphs.draft),
            want,
            &replayed.graphs,
            rounds,
            rounds.len(),
            tol,
        ));
        if recipe.grown.is_some() {
            let scores = replayed.scores_like(&rounds.scores);
            entries.push(super::compare_scores(
                graphs.draft,
                &rounds.scores,
                &scores,
                tol,
            ));
        }
        Ok(CheckReport { entries })
    }
}
