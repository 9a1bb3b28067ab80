//! Token-tree speculative goldens (format version 4): a greedy decode drafting a token tree
//! (`decode/tree_speculation.rs`) with every round's tree, the accepted node, and what the
//! verifier and the draft produced, so each graph is checked on its own.
//!
//! Dimensions: `R` rounds, `T` the tree's nodes (root included), `P` its proposing nodes (those
//! with children: the draft's rows of a round), `V` vocabulary.
//!
//! | tensor             | dtype | shape          | meaning                                            |
//! |--------------------|-------|----------------|----------------------------------------------------|
//! | `round_tree_tokens`| I64   | `[R, T]`       | every node's token, breadth-first; node 0 (the root) is the last emitted token |
//! | `round_node`       | I64   | `[R]`          | the accepted node (its path's drafts were accepted) |
//! | `round_accepted`   | I64   | `[R]`          | drafts accepted: the accepted node's depth         |
//! | `round_base_token` | I64   | `[R]`          | the base token after the accepted path             |
//! | `verify_logits`    | F32   | `[1 + R T, V]` | the prompt's last row, then per round every node's verified row: row `1 + r T + i` is node `i` of round `r` |
//! | `draft_logits`     | F32   | `[R P, V]`     | per round the draft's logits of each proposing node, breadth-first |
//! | `draft_rows`       | I64   | `[R P, 2]`     | `(round, node)` of each row of `draft_logits`      |
//!
//! Every round drafts the whole tree, so both logits tensors are rectangular without padding;
//! `draft_rows` names each draft row's round and node (it follows from the shape, and a reader
//! refuses a file where it does not).
//!
//! Metadata: `draft_length` = `tree`, `draft_tree` (the widths `W1,W2,...`), `draft_max` (the
//! depth), `gate` = `none` (a tree scores no gate), `draft_gate`.

use super::record::m2r2_golden;
use super::{EngineGraphs, GraphOutputs, M2r2Record, step_rounds};
use crate::base::config::ModelConfig;
use crate::base::generate::GreedyBackend;
use crate::base::tree::TokenTree;
use crate::decode::tree_backend::LevelDraft;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_speculation::{
    TreeBackend, TreeRound, TreeSpeculativeOutput, tree_speculate,
};
use crate::error::{Error, Result};
use crate::golden::file::GoldenFile;
use crate::golden::report::{CheckReport, Divergence, TensorCheck, Tolerance, compare_rows};
use crate::golden::{Golden, TREE_FORMAT_VERSION};
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array2, ArrayView1, Axis, s};

/// The rounds of a token-tree speculative decode as tensors (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRounds {
    /// `[R, T]` every node's token, breadth-first (node 0: the root, the last emitted token)
    pub tokens: Array2<i64>,
    /// `[R]` the accepted node
    pub node: Vec<i64>,
    /// `[R]` drafts accepted (the accepted node's depth)
    pub accepted: Vec<i64>,
    /// `[R]` the base model's token after the accepted path (correction or bonus)
    pub base_token: Vec<i64>,
}

impl TreeRounds {
    /// Rounds recorded.
    pub fn len(&self) -> usize {
        self.node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.node.is_empty()
    }

    /// The rounds of a tree decode of `nodes`-node trees.
    pub fn from_rounds(rounds: &[TreeRound], nodes: usize) -> TreeRounds {
        let mut tokens = Array2::from_elem((rounds.len(), nodes), -1i64);
        for (r, round) in rounds.iter().enumerate() {
            for (i, &t) in round.tokens.iter().enumerate().take(nodes) {
                tokens[[r, i]] = i64::from(t);
            }
        }
        TreeRounds {
            tokens,
            node: rounds.iter().map(|r| r.node as i64).collect(),
            accepted: rounds.iter().map(|r| r.accepted as i64).collect(),
            base_token: rounds.iter().map(|r| i64::from(r.base_token)).collect(),
        }
    }

    /// `(round, node)` of each row of `verify_logits` (`None` for the prompt's row).
    pub fn verify_rows(&self, tree: &TokenTree) -> Vec<Option<(usize, usize)>> {
        std::iter::once(None)
            .chain((0..self.len()).flat_map(|r| (0..tree.nodes()).map(move |i| Some((r, i)))))
            .collect()
    }

    /// `(round, node)` of each row of `draft_logits`.
    pub fn draft_rows(&self, tree: &TokenTree) -> Vec<(usize, usize)> {
        let proposing = proposing_nodes(tree);
        (0..self.len())
            .flat_map(|r| proposing.iter().map(move |&i| (r, i)))
            .collect()
    }

    /// The round that emitted each of `n` tokens (`None` for the first, from the prompt's row).
    pub fn step_rounds(&self, n: usize) -> Vec<Option<usize>> {
        step_rounds(&self.accepted, n)
    }
}

/// The nodes of `tree` that propose (have children), breadth-first: the draft's rows of a round.
pub fn proposing_nodes(tree: &TokenTree) -> Vec<usize> {
    (0..tree.nodes())
        .filter(|&i| !tree.children(i).is_empty())
        .collect()
}

/// The tree of recorded widths.
pub(super) fn tree_of(widths: &[usize]) -> Result<TokenTree> {
    TokenTree::from_widths(widths)
}

/// The widths as the metadata writes them: `2,1,1`.
pub fn widths_text(widths: &[usize]) -> String {
    widths
        .iter()
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl Golden {
    /// Record up to `steps` greedy tokens after `prompt` by token-tree speculation on the
    /// reference (`decode/tree_speculation.rs`), drafting the tree of `widths` from `draft_gate`
    /// (1-based) every round and stopping after the first of `stop_tokens`. `logits` holds the
    /// verify logits each token was emitted from; `verify_logits` every node's verified row and
    /// `draft_logits` every proposing node's draft logits, round by round. Written as format
    /// version 4.
    ///
    /// # Errors
    /// A tree shape `TokenTree::from_widths` refuses, and what [`ReferenceTreeSpeculation::new`]
    /// and [`tree_speculate`] refuse.
    pub fn record_tree_speculative(
        m2r2: M2r2<'_>,
        name: &str,
        prompt: &[u32],
        steps: usize,
        draft_gate: usize,
        widths: &[usize],
        stop_tokens: &[u32],
    ) -> Result<Golden> {
        let tree = tree_of(widths)?;
        let capacity = prompt.len() + steps + tree.nodes();
        let mut backend = ReferenceTreeSpeculation::new(m2r2, draft_gate, capacity)?;
        let run = run_tree_on(&mut backend, &tree, prompt, steps, stop_tokens)?;
        let rounds = TreeRounds::from_rounds(&run.out.rounds, tree.nodes());
        let mut golden = m2r2_golden(
            m2r2,
            name,
            "speculative",
            prompt,
            run.out.tokens,
            run.logits,
            M2r2Record::SpeculativeTree {
                draft_gate,
                widths: widths.to_vec(),
                rounds,
                graphs: Box::new(run.graphs),
            },
        );
        golden.stop_tokens = Some(stop_tokens.to_vec());
        golden.max_steps = Some(steps);
        golden.version = TREE_FORMAT_VERSION;
        Ok(golden)
    }

    /// The token tree's widths of a token-tree speculative golden (`None` for other goldens).
    pub fn draft_tree(&self) -> Option<&[usize]> {
        match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::SpeculativeTree { widths, .. }) => Some(widths),
            _ => None,
        }
    }

    /// Replay this token-tree golden on `engine` (the reference, or an export's graphs through
    /// ONNX Runtime) and check every graph on its own:
    /// - `tokens`, `stop` and `rounds`: the engine's own tree loop ([`tree_speculate`]) for the
    ///   recorded tree, budget and stop tokens; the first round whose node tokens, accepted node
    ///   or base token differ is reported once, naming the node;
    /// - `logits`: the base model recomputed on `engine.greedy` along the recorded tokens;
    /// - `verify_logits`, `draft_logits`: the recorded rounds replayed with the recorded node
    ///   tokens fed (each depth drafted, the tree verified, the recorded path kept), so every
    ///   node's verified row and every proposing node's draft logits are compared with the
    ///   recording even after the engine's own decode has parted from it.
    ///
    /// Floats within `tol`, integers exactly.
    ///
    /// # Errors
    /// Not a token-tree golden; another model config, other M2R2 weights (or an engine that
    /// cannot say which it runs) or another draft gate than recorded; an engine error (a tree
    /// the engine cannot hold is refused by it, naming its limits).
    pub fn check_tree_on(&self, engine: TreeEngine<'_>, tol: Tolerance) -> Result<CheckReport> {
        let Some((
            recorded,
            M2r2Record::SpeculativeTree {
                draft_gate,
                widths,
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
            engine.weights_hash,
            *draft_gate,
            engine.draft_gate,
        )?;
        let tree = tree_of(widths)?;
        let graphs = engine.graphs;
        let n = self.tokens.len();

        // the engine's own decode
        engine.speculation.reset();
        let run = run_tree_on(
            engine.speculation,
            &tree,
            &self.prompt_tokens,
            n,
            self.stops(),
        )?;
        let got = TreeRounds::from_rounds(&run.out.rounds, tree.nodes());
        let step_rounds = rounds.step_rounds(n);
        let mut entries = self.decoded_checks(graphs.decode, &run.out.tokens, &step_rounds);
        entries.push(compare_tree_rounds(graphs.decode, &tree, rounds, &got));
        // the base model along the recorded tokens
        entries.push(self.base_logits_check(engine.greedy, graphs.greedy, &step_rounds, tol)?);

        // the verifier and the draft along the recorded rounds
        engine.speculation.reset();
        let replayed = replay_tree_rounds(
            engine.speculation,
            &tree,
            &self.prompt_tokens,
            &self.tokens,
            rounds,
        )?;
        entries.extend(compare_tree_graph_outputs(
            (graphs.verify, graphs.draft),
            want,
            &replayed,
            &tree,
            rounds,
            rounds.len(),
            tol,
        ));
        Ok(CheckReport { entries })
    }
}

/// An engine a token-tree golden is replayed on, and what it was built from (checked against
/// the golden before anything runs).
pub struct TreeEngine<'a> {
    /// Runs the tree loop: drafts depth by depth, verifies the tree, keeps the accepted path.
    pub speculation: &'a mut dyn TreeBackend,
    /// Recomputes the logits along the recorded tokens.
    pub greedy: &'a mut dyn GreedyBackend,
    pub config: &'a ModelConfig,
    /// `weights_hash` of the M2R2 weights the engine runs (`None`: unknown, refused).
    pub weights_hash: Option<&'a str>,
    /// The gate it drafts at, 1-based.
    pub draft_gate: usize,
    /// What the engine calls the parts that recompute each tensor.
    pub graphs: EngineGraphs<'a>,
}

/// A tree decode and what each graph produced along it.
pub(super) struct TreeRun {
    pub(super) out: TreeSpeculativeOutput,
    /// `[n, V]` the logits each token was emitted from
    pub(super) logits: Array2<f32>,
    pub(super) graphs: GraphOutputs,
}

/// Greedy token-tree speculation on any engine for up to `steps` tokens (stopping after the
/// first of `stops`), collecting the logits each token was emitted from (the prompt's last row,
/// then per round the verified rows of the accepted path), every node's verified row and every
/// proposing node's draft logits.
pub(super) fn run_tree_on(
    backend: &mut dyn TreeBackend,
    tree: &TokenTree,
    prompt: &[u32],
    steps: usize,
    stops: &[u32],
) -> Result<TreeRun> {
    let vocab = backend.vocab_size();
    let mut recording = TreeRecording::new(backend);
    let out = tree_speculate(&mut recording, tree, prompt, steps, stops, None)?;
    let mut logits = Array2::zeros((out.tokens.len(), vocab));
    if !out.tokens.is_empty() {
        logits
            .row_mut(0)
            .assign(&ArrayView1::from(&recording.prefill[..]));
    }
    // Round r emits the drafts on its accepted path, then the base token (cut at the budget or a
    // stop token): token k of the round from the verified row of the path's node at depth k.
    let mut row = 1;
    for (round, verified) in out.rounds.iter().zip(&recording.verified) {
        let path = tree.path(round.node);
        let emitted = (round.accepted + 1).min(out.tokens.len() - row);
        for (k, &node) in path.iter().enumerate().take(emitted) {
            logits.row_mut(row + k).assign(&verified.row(node));
        }
        row += emitted;
    }
    debug_assert_eq!(row, out.tokens.len().max(1));
    let graphs = recording.graph_outputs(vocab)?;
    Ok(TreeRun {
        out,
        logits,
        graphs,
    })
}

/// Replay recorded tree rounds on `backend` with the recorded tokens fed (teacher forcing): the
/// prompt, then per round the root (the last emitted token) and the recorded node tokens depth by
/// depth, the tree verified, and the recorded path kept as far as the round emitted. What the
/// engine's graphs produce is comparable with the recording even after its own decode has
/// parted from it.
///
/// # Errors
/// An engine error (a tree the engine cannot hold, named by it); an engine that returns another
/// number of rows than the tree's nodes or proposing nodes; a recorded node token outside the
/// vocabulary.
pub(super) fn replay_tree_rounds(
    backend: &mut dyn TreeBackend,
    tree: &TokenTree,
    prompt: &[u32],
    tokens: &[u32],
    rounds: &TreeRounds,
) -> Result<GraphOutputs> {
    let vocab = backend.vocab_size();
    backend.check_tree(
        tree,
        backend.len() + prompt.len() + tokens.len() + tree.nodes(),
    )?;
    let mut recording = TreeRecording::new(backend);
    recording.prefill(prompt)?;
    let (mut last, mut row) = (tokens.first().copied(), 1);
    for r in 0..rounds.len() {
        let Some(root) = last else { break };
        let mut fed = rounds
            .tokens
            .row(r)
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < vocab)
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "round {r}: node {i} holds token {t}, not an id of the vocabulary of \
                             {vocab}"
                        ))
                    })
            })
            .collect::<Result<Vec<u32>>>()?;
        if fed.len() != tree.nodes() {
            return Err(Error::Invalid(format!(
                "round {r} records {} node tokens for a tree of {} nodes",
                fed.len(),
                tree.nodes()
            )));
        }
        fed[0] = root;
        for d in 0..=tree.max_depth() {
            let level = tree.level(d);
            let proposing: Vec<usize> = level
                .clone()
                .filter(|&i| !tree.children(i).is_empty())
                .map(|i| i - level.start)
                .collect();
            let drafted = recording.draft_level(tree, d, &fed[level], &proposing)?;
            if drafted.logits.nrows() != proposing.len() {
                return Err(Error::Invalid(format!(
                    "round {r}, depth {d}: the engine drafted {} rows for {} proposing nodes",
                    drafted.logits.nrows(),
                    proposing.len()
                )));
            }
        }
        let verified = recording.verify_tree(tree)?.nrows();
        if verified != tree.nodes() {
            return Err(Error::Invalid(format!(
                "round {r}: the engine verified {verified} rows for a tree of {} nodes",
                tree.nodes()
            )));
        }
        let node = usize::try_from(rounds.node[r])
            .ok()
            .filter(|&i| i < tree.nodes())
            .ok_or_else(|| Error::Invalid(format!("round {r} accepts node {}", rounds.node[r])))?;
        let path = tree.path(node);
        let emitted = (rounds.accepted[r].max(0) as usize + 1)
            .min(path.len())
            .min(tokens.len() - row);
        if emitted == 0 {
            break;
        }
        recording.accept(&path[..emitted])?;
        last = tokens.get(row + emitted - 1).copied();
        row += emitted;
    }
    recording.graph_outputs(vocab)
}

/// The rounds of two tree decodes, round by round: the first round whose node tokens, accepted
/// node or base token differ is the divergence (naming the node); every later round follows from
/// it and is not reported again.
pub(in crate::golden) fn compare_tree_rounds(
    graph: &str,
    tree: &TokenTree,
    want: &TreeRounds,
    got: &TreeRounds,
) -> TensorCheck {
    let common = want.len().min(got.len());
    let mut first: Option<Divergence> = None;
    let mut rows_over = 0;
    for r in 0..common {
        let (tw, tg) = (want.tokens.row(r), got.tokens.row(r));
        let node_token = (0..tw.len().max(tg.len())).find(|&i| tw.get(i) != tg.get(i));
        let differs = if let Some(i) = node_token {
            let depth = (i < tree.nodes()).then(|| tree.depth(i));
            Some((
                match depth {
                    Some(d) => format!("node {i} (depth {d}) token"),
                    None => format!("node {i} token"),
                },
                tw.get(i).into_iter().copied().collect(),
                tg.get(i).into_iter().copied().collect(),
                true,
            ))
        } else if want.node[r] != got.node[r] {
            Some((
                "accepted node".to_string(),
                vec![want.node[r]],
                vec![got.node[r]],
                false,
            ))
        } else if want.base_token[r] != got.base_token[r] {
            Some((
                "base token".to_string(),
                vec![want.base_token[r]],
                vec![got.base_token[r]],
                true,
            ))
        } else {
            None
        };
        let Some((what, golden, recomputed, tokens)) = differs else {
            continue;
        };
        rows_over += 1;
        first.get_or_insert(Divergence {
            row: r,
            what,
            golden,
            recomputed,
            tokens,
        });
    }
    if first.is_none() && want.len() != got.len() {
        // the same rounds as far as both go, then one decode has more
        let extra = |t: &TreeRounds| match common < t.len() {
            true => t.tokens.row(common).to_vec(),
            false => vec![],
        };
        first = Some(Divergence {
            row: common,
            what: "node tokens".into(),
            golden: extra(want),
            recomputed: extra(got),
            tokens: true,
        });
        rows_over = 1;
    }
    let note = if first.is_none() {
        format!("{} rounds equal", want.len())
    } else {
        format!("golden {} rounds, recomputed {}", want.len(), got.len())
    };
    TensorCheck::exact("rounds", graph, "round", first, rows_over, note)
}

/// `verify_logits` (recomputed by `graphs.0`) and `draft_logits` (by `graphs.1`) of a tree
/// golden over the rows of the first `rounds_compared` recorded rounds (the prompt's verified
/// row included), each row named by its round and node.
pub(in crate::golden) fn compare_tree_graph_outputs(
    graphs: (&str, &str),
    want: &GraphOutputs,
    got: &GraphOutputs,
    tree: &TokenTree,
    rounds: &TreeRounds,
    rounds_compared: usize,
    tol: Tolerance,
) -> [TensorCheck; 2] {
    let compare = |name,
                   graph,
                   row_name,
                   of_row: Vec<Option<(usize, usize)>>,
                   w: &Array2<f32>,
                   g: &Array2<f32>| {
        let rows = of_row
            .iter()
            .take_while(|r| r.is_none_or(|(r, _)| r < rounds_compared))
            .count();
        let head = |x: &Array2<f32>| x.slice(s![..rows.min(x.nrows()), ..]).to_owned();
        compare_rows(name, graph, head(w).view(), head(g).view(), tol, false)
            .in_tree_rounds(row_name, &of_row)
    };
    let draft_rows = rounds.draft_rows(tree).into_iter().map(Some).collect();
    [
        compare(
            "verify_logits",
            graphs.0,
            "verified row",
            rounds.verify_rows(tree),
            &want.verify_logits,
            &got.verify_logits,
        ),
        compare(
            "draft_logits",
            graphs.1,
            "proposal",
            draft_rows,
            &want.draft_logits,
            &got.draft_logits,
        ),
    ]
}

/// The tensors of a tree record, `(name, dtype, shape, bytes)` (module docs).
pub(super) fn tree_tensors(
    widths: &[usize],
    rounds: &TreeRounds,
    graphs: &GraphOutputs,
) -> Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    use crate::golden::file::f32_bytes;
    use safetensors::Dtype;
    let ints = |v: &mut dyn Iterator<Item = &i64>| -> Vec<u8> {
        v.flat_map(|x| x.to_le_bytes()).collect()
    };
    let rows: Vec<i64> = match tree_of(widths) {
        Ok(tree) => rounds
            .draft_rows(&tree)
            .into_iter()
            .flat_map(|(r, i)| [r as i64, i as i64])
            .collect(),
        Err(_) => vec![],
    };
    vec![
        (
            "round_tree_tokens".into(),
            Dtype::I64,
            rounds.tokens.shape().to_vec(),
            ints(&mut rounds.tokens.iter()),
        ),
        (
            "round_node".into(),
            Dtype::I64,
            vec![rounds.node.len()],
            ints(&mut rounds.node.iter()),
        ),
        (
            "round_accepted".into(),
            Dtype::I64,
            vec![rounds.accepted.len()],
            ints(&mut rounds.accepted.iter()),
        ),
        (
            "round_base_token".into(),
            Dtype::I64,
            vec![rounds.base_token.len()],
            ints(&mut rounds.base_token.iter()),
        ),
        (
            "verify_logits".into(),
            Dtype::F32,
            graphs.verify_logits.shape().to_vec(),
            f32_bytes(graphs.verify_logits.iter()),
        ),
        (
            "draft_logits".into(),
            Dtype::F32,
            graphs.draft_logits.shape().to_vec(),
            f32_bytes(graphs.draft_logits.iter()),
        ),
        (
            "draft_rows".into(),
            Dtype::I64,
            vec![rows.len() / 2, 2],
            ints(&mut rows.iter()),
        ),
    ]
}

/// Read a tree record (metadata `draft_length` = `tree`); `n` is the number of tokens. Every
/// tensor is checked against the tree's shape and the rounds against the tree (accepted nodes
/// that exist, accepted counts that are their depths, node tokens that are ids).
pub(super) fn read_tree(file: &GoldenFile<'_>, n: usize, version: u32) -> Result<M2r2Record> {
    let format = |msg: String| Error::format(&file.label, msg);
    if version < TREE_FORMAT_VERSION {
        return Err(format(format!(
            "metadata `draft_length` = `tree`: token-tree goldens are format version \
             {TREE_FORMAT_VERSION}, this file says {version}"
        )));
    }
    let draft_gate = file.field("draft_gate")?;
    let draft_gate: usize = draft_gate
        .parse()
        .map_err(|_| file.bad("draft_gate", &draft_gate))?;
    let spec = file.field("draft_tree")?;
    let tree = TokenTree::parse(&spec)
        .map_err(|e| format(format!("metadata `draft_tree` = `{spec}`: {e}")))?;
    let widths: Vec<usize> = spec
        .split(',')
        .map(|w| w.trim().parse().expect("checked by TokenTree::parse"))
        .collect();
    if file.count("draft_max")? != widths.len() {
        return Err(file.bad("draft_max", &file.field("draft_max")?));
    }
    if file.field("gate")? != "none" {
        return Err(file.bad("gate", &file.field("gate")?));
    }
    let nodes = tree.nodes();
    let (shape, node) = file.i64s("round_node")?;
    let r = node.len();
    file.expect_shape("round_node", &shape, &[r])?;
    if r == 0 && n > 1 {
        return Err(format(format!(
            "tensor `round_node` has no rounds for {n} tokens"
        )));
    }
    let (shape, accepted) = file.i64s("round_accepted")?;
    file.expect_shape("round_accepted", &shape, &[r])?;
    let (shape, base_token) = file.i64s("round_base_token")?;
    file.expect_shape("round_base_token", &shape, &[r])?;
    let (shape, tokens) = file.i64s("round_tree_tokens")?;
    file.expect_shape("round_tree_tokens", &shape, &[r, nodes])?;
    for (round, (&a, &i)) in accepted.iter().zip(&node).enumerate() {
        let Some(i) = usize::try_from(i).ok().filter(|&i| i < nodes) else {
            return Err(format(format!(
                "tensor `round_node`: round {round} accepts node {i}, the tree has nodes 0..{nodes}"
            )));
        };
        if a != tree.depth(i) as i64 {
            return Err(format(format!(
                "tensor `round_accepted`: round {round} accepted {a} drafts, but its node {i} \
                 is at depth {}",
                tree.depth(i)
            )));
        }
    }
    if let Some(k) = tokens.iter().position(|&t| u32::try_from(t).is_err()) {
        return Err(format(format!(
            "tensor `round_tree_tokens`: round {} node {} holds token id {}",
            k / nodes,
            k % nodes,
            tokens[k]
        )));
    }
    let rounds = TreeRounds {
        tokens: Array2::from_shape_vec((r, nodes), tokens).expect("shape checked"),
        node,
        accepted,
        base_token,
    };
    let proposals = r
        .checked_mul(proposing_nodes(&tree).len())
        .ok_or_else(|| format("too many rounds".into()))?;
    let verified = r
        .checked_mul(nodes)
        .and_then(|x| x.checked_add(1))
        .ok_or_else(|| format("too many rounds".into()))?;
    let (shape, rows) = file.i64s("draft_rows")?;
    file.expect_shape("draft_rows", &shape, &[proposals, 2])?;
    let want: Vec<i64> = rounds
        .draft_rows(&tree)
        .into_iter()
        .flat_map(|(r, i)| [r as i64, i as i64])
        .collect();
    if rows != want {
        let k = rows
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(0)
            / 2;
        return Err(format(format!(
            "tensor `draft_rows`: row {k} is (round {}, node {}), but tree {spec} proposes from \
             (round {}, node {}) there",
            rows[2 * k],
            rows[2 * k + 1],
            want[2 * k],
            want[2 * k + 1]
        )));
    }
    let graphs = GraphOutputs {
        verify_logits: super::logits_rows(file, "verify_logits", verified)?,
        draft_logits: super::logits_rows(file, "draft_logits", proposals)?,
    };
    Ok(M2r2Record::SpeculativeTree {
        draft_gate,
        widths,
        rounds,
        graphs: Box::new(graphs),
    })
}

/// A tree engine that keeps the prefill, draft and verify logits it returns.
struct TreeRecording<'a> {
    inner: &'a mut dyn TreeBackend,
    /// `[V]`
    prefill: Vec<f32>,
    /// One `[T, V]` per round.
    verified: Vec<Array2<f32>>,
    /// One `[P_d, V]` per drafted depth.
    drafts: Vec<Array2<f32>>,
}

impl<'a> TreeRecording<'a> {
    fn new(inner: &'a mut dyn TreeBackend) -> Self {
        TreeRecording {
            inner,
            prefill: vec![],
            verified: vec![],
            drafts: vec![],
        }
    }

    /// Everything recorded, as [`GraphOutputs`] of `vocab` columns.
    fn graph_outputs(&self, vocab: usize) -> Result<GraphOutputs> {
        let stacked = |rows: Vec<ArrayView1<f32>>, what: &str| -> Result<Array2<f32>> {
            if rows.is_empty() {
                return Ok(Array2::zeros((0, vocab)));
            }
            if rows.iter().any(|r| r.len() != vocab) {
                return Err(Error::Invalid(format!(
                    "the engine's {what} rows are not all {vocab} wide"
                )));
            }
            Ok(ndarray::stack(Axis(0), &rows).expect("rows of one width"))
        };
        let verified = std::iter::once(ArrayView1::from(&self.prefill[..]))
            .chain(self.verified.iter().flat_map(|v| v.rows()))
            .collect();
        let drafts = self.drafts.iter().flat_map(|d| d.rows()).collect();
        Ok(GraphOutputs {
            verify_logits: stacked(verified, "verify logits")?,
            draft_logits: stacked(drafts, "draft logits")?,
        })
    }
}

impl TreeBackend for TreeRecording<'_> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn check_tree(&self, tree: &TokenTree, positions: usize) -> Result<()> {
        self.inner.check_tree(tree, positions)
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.prefill = self.inner.prefill(tokens)?;
        Ok(self.prefill.clone())
    }

    fn draft_level(
        &mut self,
        tree: &TokenTree,
        depth: usize,
        tokens: &[u32],
        proposing: &[usize],
    ) -> Result<LevelDraft> {
        let drafted = self.inner.draft_level(tree, depth, tokens, proposing)?;
        self.drafts.push(drafted.logits.clone());
        Ok(drafted)
    }

    fn verify_tree(&mut self, tree: &TokenTree) -> Result<Array2<f32>> {
        let logits = self.inner.verify_tree(tree)?;
        self.verified.push(logits.clone());
        Ok(logits)
    }

    fn accept(&mut self, path: &[usize]) -> Result<()> {
        self.inner.accept(path)
    }

    fn abandon_round(&mut self) -> Result<()> {
        self.inner.abandon_round()
    }

    fn reset(&mut self) {
        self.inner.reset();
        (self.prefill, self.verified, self.drafts) = (vec![], vec![], vec![]);
    }
}
