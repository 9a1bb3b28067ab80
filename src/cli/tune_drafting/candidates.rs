//! What `tune-drafting` tries, from its flags: the tree shapes (and their shallower prefixes,
//! whose steps are timed too) and the prompt-lookup branch lengths.

use super::{Args, Family};
use anyhow::{Result, bail};
use reference::base::tree::TokenTree;
use reference::decode::draft_sim::TREE_SHAPES;

/// The tree shapes tried: `--tree` flags, or the candidate shapes no deeper than `--max-draft`;
/// none without the tree family.
pub(super) fn tree_shapes(args: &Args) -> Result<Vec<Vec<usize>>> {
    if !args.families.contains(&Family::Tree) {
        if !args.trees.is_empty() {
            bail!("--tree shapes need the tree family: add tree to --families");
        }
        return Ok(vec![]);
    }
    if args.trees.is_empty() {
        return Ok(TREE_SHAPES
            .iter()
            .filter(|w| w.len() <= args.max_draft)
            .map(|w| w.to_vec())
            .collect());
    }
    let mut shapes: Vec<Vec<usize>> = Vec::new();
    for spec in &args.trees {
        TokenTree::parse(spec).map_err(|e| anyhow::anyhow!("--tree: {e}"))?;
        let widths: Vec<usize> = spec
            .split(',')
            .map(|w| w.trim().parse().expect("checked by TokenTree::parse"))
            .collect();
        if widths.len() > args.max_draft {
            bail!(
                "--tree {spec} is {} deep, deeper than --max-draft {}: raise --max-draft (the \
                 traces are as deep as it)",
                widths.len(),
                args.max_draft
            );
        }
        if !shapes.contains(&widths) {
            shapes.push(widths);
        }
    }
    Ok(shapes)
}

/// `shapes` and each one's shallower prefixes (`2,1,1`: also `2` and `2,1`), each once.
pub(super) fn with_prefixes(shapes: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut all: Vec<Vec<usize>> = Vec::new();
    for widths in shapes {
        for depth in 1..=widths.len() {
            let prefix = widths[..depth].to_vec();
            if !all.contains(&prefix) {
                all.push(prefix);
            }
        }
    }
    all
}

/// The prompt-lookup branch lengths priced (`--prompt-lookup` without 0), each once, ascending.
///
/// # Errors
/// A length the M2R2 config cannot hold (`prompt_lookup` is at most 63).
pub(super) fn lookup_branches(args: &Args) -> Result<Vec<usize>> {
    let mut branches: Vec<usize> = args
        .prompt_lookup
        .iter()
        .copied()
        .filter(|&n| n > 0)
        .collect();
    for &n in &branches {
        crate::cli::args::tree::check_branch_len(n)?;
    }
    branches.sort_unstable();
    branches.dedup();
    Ok(branches)
}
