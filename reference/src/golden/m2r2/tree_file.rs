//! Token-tree goldens on disk: the tensors and metadata of a [`TreeRecipe`] and its
//! [`TreeRounds`] (layouts in [`tree`](super::tree)), and a reader that refuses a file that does
//! not agree with itself, naming the file, the tensor and the round.

use super::rounds::check_emitted;
use super::tree_rounds::{TreeRecipe, TreeRounds, proposing_in, widths_text};
use super::{GraphOutputs, M2r2Record};
use crate::base::tree::TokenTree;
use crate::decode::prompt_lookup::LookupConfig;
use crate::error::{Error, Result};
use crate::golden::file::{GoldenFile, f32_bytes};
use crate::golden::{GROWN_TREE_FORMAT_VERSION, TREE_FORMAT_VERSION};
use ndarray::Array2;
use safetensors::Dtype;

type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn ints<'a>(name: &str, shape: Vec<usize>, values: impl Iterator<Item = &'a i64>) -> Tensor {
    let bytes = values.flat_map(|x| x.to_le_bytes()).collect();
    (name.into(), Dtype::I64, shape, bytes)
}

/// The tensors of a tree record, `(name, dtype, shape, bytes)` (module docs of `tree`).
pub(super) fn tree_tensors(
    recipe: &TreeRecipe,
    rounds: &TreeRounds,
    graphs: &GraphOutputs,
) -> Vec<Tensor> {
    let r = rounds.len();
    let rows: Vec<i64> = rounds
        .draft_rows()
        .into_iter()
        .flat_map(|(r, i)| [r as i64, i as i64])
        .collect();
    let mut tensors = vec![
        ints(
            "round_tree_tokens",
            rounds.tokens.shape().to_vec(),
            rounds.tokens.iter(),
        ),
        ints("round_node", vec![r], rounds.node.iter()),
        ints("round_accepted", vec![r], rounds.accepted.iter()),
        ints("round_base_token", vec![r], rounds.base_token.iter()),
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
        ints("draft_rows", vec![rows.len() / 2, 2], rows.iter()),
    ];
    if recipe.varies() {
        let width = rounds.tokens.ncols().saturating_sub(1);
        let mut parents = Array2::from_elem((r, width), -1i64);
        for (k, tree) in rounds.trees.iter().enumerate() {
            for i in 1..tree.nodes() {
                parents[[k, i - 1]] = tree.parent(i).map_or(-1, |p| p as i64);
            }
        }
        let branch = rounds.lookup.iter().map(Vec::len).max().unwrap_or(0);
        let mut lookup = Array2::from_elem((r, branch), -1i64);
        for (k, nodes) in rounds.lookup.iter().enumerate() {
            for (j, &i) in nodes.iter().enumerate() {
                lookup[[k, j]] = i as i64;
            }
        }
        tensors.push(ints(
            "round_tree_parents",
            parents.shape().to_vec(),
            parents.iter(),
        ));
        tensors.push(ints("round_lookup", lookup.shape().to_vec(), lookup.iter()));
        tensors.push((
            "round_scores".into(),
            Dtype::F32,
            rounds.scores.shape().to_vec(),
            f32_bytes(rounds.scores.iter()),
        ));
    }
    tensors
}

/// The metadata of a tree record besides `draft_gate` (module docs of `tree`).
pub(super) fn tree_metadata(recipe: &TreeRecipe) -> Vec<(String, String)> {
    let gate = recipe.grown.map_or("none".into(), |g| g.0.to_string());
    let mut meta = vec![
        ("draft_gate".into(), recipe.draft_gate.to_string()),
        ("gate".into(), gate),
        ("draft_max".into(), recipe.widths.len().to_string()),
        ("draft_length".into(), "tree".into()),
        ("draft_tree".into(), widths_text(&recipe.widths)),
    ];
    if let Some((_, threshold)) = recipe.grown {
        // f32's Display is the shortest text that parses back to the same value.
        meta.push(("tree_threshold".into(), threshold.to_string()));
    }
    if let Some(l) = recipe.lookup {
        meta.push(("prompt_lookup".into(), l.max_tokens.to_string()));
        let ngram = format!("{},{}", l.min_ngram, l.max_ngram);
        meta.push(("prompt_lookup_ngram".into(), ngram));
    }
    meta
}

/// The recipe of a tree record's metadata.
fn read_recipe(file: &GoldenFile<'_>, version: u32) -> Result<TreeRecipe> {
    let format = |msg: String| Error::format(&file.label, msg);
    let draft_gate = file.field("draft_gate")?;
    let draft_gate: usize = draft_gate
        .parse()
        .map_err(|_| file.bad("draft_gate", &draft_gate))?;
    let spec = file.field("draft_tree")?;
    TokenTree::parse(&spec).map_err(|e| {
        format(format!(
            "metadata `draft_tree` = `{}`: {e}",
            crate::golden::shown(&spec)
        ))
    })?;
    let widths: Vec<usize> = spec
        .split(',')
        .map(|w| w.trim().parse().expect("checked by TokenTree::parse"))
        .collect();
    if file.count("draft_max")? != widths.len() {
        return Err(file.bad("draft_max", &file.field("draft_max")?));
    }
    let newer = |key: &str| {
        format(format!(
            "metadata `{key}`: trees that change from round to round are format version \
             {GROWN_TREE_FORMAT_VERSION}, this file says {version}"
        ))
    };
    let gate = file.field("gate")?;
    let grown = match file.meta.get("tree_threshold") {
        None if gate == "none" => None,
        None => return Err(file.bad("gate", &gate)),
        Some(_) if version < GROWN_TREE_FORMAT_VERSION => return Err(newer("tree_threshold")),
        Some(t) => {
            let threshold: f32 = t
                .parse()
                .ok()
                .filter(|x: &f32| x.is_finite())
                .ok_or_else(|| file.bad("tree_threshold", t))?;
            let kind = gate.parse().map_err(|_| file.bad("gate", &gate))?;
            Some((kind, threshold))
        }
    };
    let lookup = match file.meta.get("prompt_lookup") {
        None => None,
        Some(_) if version < GROWN_TREE_FORMAT_VERSION => return Err(newer("prompt_lookup")),
        Some(_) => {
            let max_tokens = file.count("prompt_lookup")?;
            let ngram = file.field("prompt_lookup_ngram")?;
            let parsed: Option<Vec<usize>> = ngram.split(',').map(|x| x.parse().ok()).collect();
            let config = match parsed.as_deref() {
                Some(&[min_ngram, max_ngram]) if max_tokens > 0 => LookupConfig {
                    max_tokens,
                    max_ngram,
                    min_ngram,
                },
                _ => return Err(file.bad("prompt_lookup_ngram", &ngram)),
            };
            config
                .check()
                .map_err(|_| file.bad("prompt_lookup_ngram", &ngram))?;
            Some(config)
        }
    };
    Ok(TreeRecipe {
        draft_gate,
        widths,
        grown,
        lookup,
    })
}

/// Read a tree record (metadata `draft_length` = `tree`); `n` is the number of tokens. Every
/// tensor is checked against the recipe and the rounds' trees (trees that fit the largest one
/// the recipe verifies, accepted nodes that exist, accepted counts that are their depths and
/// emit the tokens, node tokens that are ids, lookup nodes on a chain from the root, the draft's rows and scores of
/// the proposing nodes).
pub(super) fn read_tree(
    file: &GoldenFile<'_>,
    n: usize,
    version: u32,
    vocab: Option<u64>,
) -> Result<M2r2Record> {
    let format = |msg: String| Error::format(&file.label, msg);
    if version < TREE_FORMAT_VERSION {
        return Err(format(format!(
            "metadata `draft_length` = `tree`: token-tree goldens are format version \
             {TREE_FORMAT_VERSION}, this file says {version}"
        )));
    }
    let recipe = read_recipe(file, version)?;
    let spec = widths_text(&recipe.widths);
    let shape = recipe.shape()?;
    let largest = recipe.largest()?;
    let (dims, node) = file.i64s("round_node")?;
    let r = node.len();
    file.expect_shape("round_node", &dims, &[r])?;
    if r == 0 && n > 1 {
        return Err(format(format!(
            "tensor `round_node` has no rounds for {n} tokens"
        )));
    }
    let (dims, accepted) = file.i64s("round_accepted")?;
    file.expect_shape("round_accepted", &dims, &[r])?;
    let (dims, base_token) = file.i64s("round_base_token")?;
    file.expect_shape("round_base_token", &dims, &[r])?;
    let (dims, tokens) = file.i64s("round_tree_tokens")?;
    // every round's tree, its lookup nodes and its scores
    let (trees, lookup, scores, width) = if recipe.varies() {
        let width = dims.get(1).copied().unwrap_or(0);
        file.expect_shape("round_tree_tokens", &dims, &[r, width])?;
        let (trees, lookup, scores) = read_round_trees(file, r, width, &largest)?;
        (trees, lookup, scores, width)
    } else {
        let nodes = shape.nodes();
        file.expect_shape("round_tree_tokens", &dims, &[r, nodes])?;
        let none = Array2::from_elem((r, 0), f32::NAN);
        (vec![shape.clone(); r], vec![vec![]; r], none, nodes)
    };
    for (round, (&a, &i)) in accepted.iter().zip(&node).enumerate() {
        let nodes = trees[round].nodes();
        let Some(i) = usize::try_from(i).ok().filter(|&i| i < nodes) else {
            return Err(format(format!(
                "tensor `round_node`: round {round} accepts node {i}, the tree has nodes 0..{nodes}"
            )));
        };
        if a != trees[round].depth(i) as i64 {
            return Err(format(format!(
                "tensor `round_accepted`: round {round} accepted {a} drafts, but its node {i} \
                 is at depth {}",
                trees[round].depth(i)
            )));
        }
    }
    check_emitted(file, &accepted, n)?;
    // a token id: within u32 and, when the config says, below its vocabulary
    let outside = |t: i64| match vocab {
        Some(v) if u64::try_from(t).is_ok_and(|t| t >= v) => Some(format!(
            ", outside the vocabulary of {v} tokens (metadata `config`)"
        )),
        _ if u32::try_from(t).is_err() => Some(String::new()),
        _ => None,
    };
    for (k, &t) in tokens.iter().enumerate() {
        let (round, i) = (k / width, k % width);
        let inside = i < trees[round].nodes();
        let why = match inside {
            true => outside(t),
            false => (t != -1).then(String::new),
        };
        if let Some(why) = why {
            return Err(format(format!(
                "tensor `round_tree_tokens`: round {round} node {i} holds token id {t}{why}"
            )));
        }
    }
    if let Some((round, t, why)) = base_token
        .iter()
        .enumerate()
        .find_map(|(r, &t)| outside(t).map(|why| (r, t, why)))
    {
        return Err(format(format!(
            "tensor `round_base_token`: round {round} holds token id {t}{why}"
        )));
    }
    let grown_depth = recipe.grown.map(|_| recipe.widths.len());
    let proposing: Vec<Vec<usize>> = trees
        .iter()
        .zip(&lookup)
        .map(|(t, l)| proposing_in(t, l, grown_depth))
        .collect();
    if recipe.grown.is_some() {
        for (round, p) in proposing.iter().enumerate() {
            let count = scores.row(round).iter().take_while(|x| !x.is_nan()).count();
            let rest = scores.row(round).iter().skip(count).all(|x| x.is_nan());
            if count != p.len() || !rest {
                return Err(format(format!(
                    "tensor `round_scores`: round {round} holds {count} scores, its tree has {} \
                     proposing nodes",
                    p.len()
                )));
            }
        }
    }
    let rounds = TreeRounds {
        trees,
        tokens: Array2::from_shape_vec((r, width), tokens).expect("shape checked"),
        node,
        accepted,
        base_token,
        lookup,
        proposing,
        scores,
    };
    let want: Vec<i64> = rounds
        .draft_rows()
        .into_iter()
        .flat_map(|(r, i)| [r as i64, i as i64])
        .collect();
    let proposals = want.len() / 2;
    let verified = 1 + rounds.trees.iter().map(TokenTree::nodes).sum::<usize>();
    let (dims, rows) = file.i64s("draft_rows")?;
    file.expect_shape("draft_rows", &dims, &[proposals, 2])?;
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
        recipe,
        rounds,
        graphs: Box::new(graphs),
    })
}

/// Every round's tree, lookup nodes and `[R, S]` scores.
type RoundTrees = (Vec<TokenTree>, Vec<Vec<usize>>, Array2<f32>);

/// The per-round trees (`round_tree_parents`, within `largest`), lookup nodes (`round_lookup`: a
/// chain from the root, node `j` at depth `j + 1`) and scores (`round_scores`) of `r` rounds
/// whose tokens are `width` wide.
fn read_round_trees(
    file: &GoldenFile<'_>,
    r: usize,
    width: usize,
    largest: &TokenTree,
) -> Result<RoundTrees> {
    let format = |msg: String| Error::format(&file.label, msg);
    if r > 0 && width == 0 {
        return Err(format(
            "tensor `round_tree_tokens` has no column for the rounds' roots".into(),
        ));
    }
    let (dims, parents) = file.i64s("round_tree_parents")?;
    file.expect_shape("round_tree_parents", &dims, &[r, width.saturating_sub(1)])?;
    let (dims, lookup) = file.i64s("round_lookup")?;
    let branch = dims.get(1).copied().unwrap_or(0);
    file.expect_shape("round_lookup", &dims, &[r, branch])?;
    let (dims, scores) = file.f32s("round_scores")?;
    let s = dims.get(1).copied().unwrap_or(0);
    file.expect_shape("round_scores", &dims, &[r, s])?;
    let mut trees = Vec::with_capacity(r);
    let mut nodes_of = Vec::with_capacity(r);
    for round in 0..r {
        let row = &parents[round * width.saturating_sub(1)..(round + 1) * width.saturating_sub(1)];
        let k = row.iter().take_while(|&&p| p >= 0).count();
        let bad = |what: String| {
            format(format!(
                "tensor `round_tree_parents`: round {round}: {what}"
            ))
        };
        if row[k..].iter().any(|&p| p != -1) {
            return Err(bad("a parent after the tree's last node".into()));
        }
        let row: Vec<usize> = row[..k].iter().map(|&p| p as usize).collect();
        let tree = TokenTree::from_parents(&row).map_err(|e| bad(e.to_string()))?;
        if tree.nodes() > largest.nodes() || tree.max_depth() > largest.max_depth() {
            return Err(bad(format!(
                "a tree of {} nodes and depth {}, larger than the recipe's largest ({} nodes, \
                 depth {})",
                tree.nodes(),
                tree.max_depth(),
                largest.nodes(),
                largest.max_depth()
            )));
        }
        let branch_row = &lookup[round * branch..(round + 1) * branch];
        let j = branch_row.iter().take_while(|&&i| i >= 0).count();
        let mut nodes = Vec::with_capacity(j);
        for (d, &i) in branch_row[..j].iter().enumerate() {
            let i = i as usize;
            let parent = match d {
                0 => Some(0),
                _ => nodes.last().copied(),
            };
            if i >= tree.nodes() || tree.parent(i) != parent {
                return Err(format(format!(
                    "tensor `round_lookup`: round {round}: node {i} is not the branch's node of \
                     depth {}",
                    d + 1
                )));
            }
            nodes.push(i);
        }
        if branch_row[j..].iter().any(|&i| i != -1) {
            return Err(format(format!(
                "tensor `round_lookup`: round {round}: a node after the branch's last"
            )));
        }
        trees.push(tree);
        nodes_of.push(nodes);
    }
    let scores = Array2::from_shape_vec((r, s), scores).expect("shape checked");
    Ok((trees, nodes_of, scores))
}
