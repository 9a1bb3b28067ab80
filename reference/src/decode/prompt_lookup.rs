//! Prompt lookup: a draft branch copied from the text so far, at no draft step (Saxena, "Prompt
//! Lookup Decoding", 2023; Spec-Bench measures it at 1.64x alone on Vicuna-7B, 2.46x on
//! summarization). When the last `k` tokens of the context (the prompt and the tokens emitted so
//! far, the round's root last) occurred earlier, the tokens that followed that occurrence are a
//! guess at what follows now: answers quote their prompt, code repeats names, a small model
//! repeats itself.
//!
//! ```text
//! context  c[0 .. L]                       (c[L-1] = the root of the round)
//! for k = max_ngram down to min_ngram:     (longest suffix first)
//!     s = the largest s < L - k with c[s .. s+k] = c[L-k .. L]   (the latest earlier occurrence)
//!     if found: guess[j] = e[s + k + j], j = 0 .. len            (e = c ++ guess: a copy that
//!                                                                 runs into the suffix goes on
//!                                                                 copying its own output)
//! ```
//!
//! The continuation is copied like an LZ77 match: where it reaches the end of the context it keeps
//! copying the tokens it has just guessed, so a loop of period `p` (`s = L - k - p`) is guessed
//! past its last `p` tokens.
//!
//! In a round the guess becomes a chain attached at the root of the drafted tree
//! ([`with_lookup_branch`]): its nodes carry fixed tokens, run only their slow rows through the
//! draft layers (they propose nothing) and are verified with the rest of the tree, so greedy
//! acceptance keeps them exactly when greedy decoding would have emitted them. **\[ours\]**: the
//! branch beside a self-speculative tree, and the root's drafted children skipping the guessed
//! token (`decode/tree_speculation.rs`).

use crate::base::tree::{MAX_TREE_NODES, TokenTree};
use crate::error::{Error, Result};

/// The longest suffix looked up, in tokens (the `max_ngram_size` of the reference
/// implementation of prompt lookup decoding).
pub const DEFAULT_MAX_NGRAM: usize = 3;

/// The shortest suffix looked up: a single token matches often, and most such matches guess
/// wrong, each guess costing verify rows; two tokens are the shortest match tried.
pub const DEFAULT_MIN_NGRAM: usize = 2;

/// How a round looks its branch up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupConfig {
    /// The most tokens of the branch (0: no branch).
    pub max_tokens: usize,
    /// The longest suffix of the context tried.
    pub max_ngram: usize,
    /// The shortest suffix of the context tried (at least 1).
    pub min_ngram: usize,
}

impl LookupConfig {
    /// A branch of up to `max_tokens` tokens, with the default suffix lengths.
    pub fn new(max_tokens: usize) -> Self {
        LookupConfig {
            max_tokens,
            max_ngram: DEFAULT_MAX_NGRAM,
            min_ngram: DEFAULT_MIN_NGRAM,
        }
    }

    /// Refuse suffix lengths that cannot match (`1 <= min_ngram <= max_ngram`).
    ///
    /// # Errors
    /// A minimum of 0 or above the maximum.
    pub fn check(&self) -> Result<()> {
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(Error::Invalid(format!(
                "prompt lookup: suffix lengths {}..={} (the shortest is at least 1 and at most \
                 the longest)",
                self.min_ngram, self.max_ngram
            )));
        }
        Ok(())
    }

    /// The branch this config guesses after `context` ([`lookup`]).
    pub fn guess(&self, context: &[u32]) -> Vec<u32> {
        lookup(context, self.max_ngram, self.min_ngram, self.max_tokens)
    }
}

/// The continuation, up to `len` tokens, of the latest earlier occurrence of the last `k` tokens
/// of `context`, for `k = max_ngram` down to `min_ngram` (the first `k` that occurs wins); empty
/// when none occurs. A continuation that reaches the end of `context` copies on from its own
/// tokens (module docs).
pub fn lookup(context: &[u32], max_ngram: usize, min_ngram: usize, len: usize) -> Vec<u32> {
    let total = context.len();
    if len == 0 {
        return vec![];
    }
    for k in (min_ngram.max(1)..=max_ngram).rev() {
        // an earlier occurrence starts before the suffix itself: s + k < total
        if k >= total {
            continue;
        }
        let suffix = &context[total - k..];
        let Some(s) = (0..total - k).rev().find(|&s| &context[s..s + k] == suffix) else {
            continue;
        };
        let mut guess = Vec::with_capacity(len);
        for j in 0..len {
            let i = s + k + j; // < total + j: in the context or already guessed
            guess.push(if i < total {
                context[i]
            } else {
                guess[i - total]
            });
        }
        return guess;
    }
    vec![]
}

/// A drafted tree with a lookup branch at its root, renumbered breadth-first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupTree {
    /// The merged tree.
    pub tree: TokenTree,
    /// `drafted[i]`: where node `i` of the drafted tree landed (the root stays 0).
    pub drafted: Vec<usize>,
    /// `lookup[j]`: where the branch's token `j` landed (depth `j + 1`).
    pub lookup: Vec<usize>,
}

/// `tree` with a chain of `branch` nodes hung from its root, as many as fit in
/// [`MAX_TREE_NODES`]: at every depth the drafted nodes keep their order and the branch's node
/// comes last (its parent, the branch's node one depth up, is the last of its depth), so parents
/// stay breadth-first and every drafted node keeps its path.
pub fn with_lookup_branch(tree: &TokenTree, branch: usize) -> LookupTree {
    let branch = branch.min(MAX_TREE_NODES - tree.nodes());
    let depth = tree.max_depth().max(branch);
    let mut drafted = vec![0; tree.nodes()];
    let mut lookup = Vec::with_capacity(branch);
    // parents of the nodes 1.. of the merged tree
    let mut parents = Vec::with_capacity(tree.nodes() + branch - 1);
    let mut next = 1;
    for d in 1..=depth {
        for i in tree.level(d) {
            drafted[i] = next;
            parents.push(drafted[tree.parent(i).expect("below the root")]);
            next += 1;
        }
        if d <= branch {
            parents.push(lookup.last().copied().unwrap_or(0));
            lookup.push(next);
            next += 1;
        }
    }
    let tree = TokenTree::from_parents(&parents).expect("breadth-first, within MAX_TREE_NODES");
    LookupTree {
        tree,
        drafted,
        lookup,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_match_guesses_nothing() {
        assert_eq!(lookup(&[1, 2, 3, 4, 5], 3, 1, 4), Vec::<u32>::new());
        // the suffix alone is no earlier occurrence
        assert_eq!(lookup(&[7], 3, 1, 4), Vec::<u32>::new());
        assert_eq!(lookup(&[], 3, 1, 4), Vec::<u32>::new());
        // 2, 5 occurred only as 5 after 3: a 1-token match is not tried with min 2
        assert_eq!(lookup(&[5, 9, 3, 5], 3, 2, 4), Vec::<u32>::new());
        assert_eq!(lookup(&[5, 9, 3, 5], 3, 1, 4), [9, 3, 5, 9]);
        assert_eq!(lookup(&[5, 9, 3, 5], 3, 1, 0), Vec::<u32>::new());
    }

    #[test]
    fn the_latest_occurrence_wins() {
        // 1, 2 occurs at 0 (then 3) and at 4 (then 8)
        let c = [1, 2, 3, 0, 1, 2, 8, 9, 1, 2];
        assert_eq!(lookup(&c, 2, 2, 2), [8, 9]);
        assert_eq!(lookup(&c, 2, 2, 3), [8, 9, 1]);
        // a guess longer than what follows the occurrence copies on from its own tokens
        assert_eq!(lookup(&c, 2, 2, 6), [8, 9, 1, 2, 8, 9]);
    }

    #[test]
    fn longer_suffixes_come_first() {
        // the last 3 (4, 1, 2) occur at 0, then 7; the last 2 (1, 2) latest at 5, then 6
        let c = [4, 1, 2, 7, 0, 1, 2, 6, 4, 1, 2];
        assert_eq!(lookup(&c, 3, 1, 2), [7, 0]);
        assert_eq!(lookup(&c, 2, 1, 2), [6, 4]);
        // 1 token (2): latest at 6
        assert_eq!(lookup(&c, 1, 1, 1), [6]);
        // a suffix longer than the context is skipped, not an error
        assert_eq!(lookup(&[3, 3], 5, 1, 2), [3, 3]);
    }

    /// An occurrence that overlaps the suffix: the copy runs into the suffix and on into its own
    /// guesses, continuing the period.
    #[test]
    fn overlaps_at_the_end_continue_the_period() {
        // a a a a: the latest earlier a a starts at 1, continued by a, then copies of itself
        assert_eq!(lookup(&[5, 5, 5, 5], 2, 2, 4), [5, 5, 5, 5]);
        // period 3: (1 2 3)(1 2 3)(1 2): 1 2 latest at 3, then 3, 1, 2, 3, ...
        let c = [1, 2, 3, 1, 2, 3, 1, 2];
        assert_eq!(lookup(&c, 2, 2, 5), [3, 1, 2, 3, 1]);
        // period 2 with a 3-token suffix (7 8 7) latest at 1: 8, then its own copies
        assert_eq!(lookup(&[9, 7, 8, 7, 8, 7], 3, 3, 4), [8, 7, 8, 7]);
    }

    #[test]
    fn short_contexts() {
        assert_eq!(lookup(&[4, 4], 3, 1, 3), [4, 4, 4]);
        assert_eq!(lookup(&[4, 5], 3, 1, 3), Vec::<u32>::new());
        assert_eq!(lookup(&[4, 5, 4], 3, 1, 3), [5, 4, 5]);
        // min_ngram 0 reads as 1
        assert_eq!(lookup(&[4, 5, 4], 1, 0, 1), [5]);
    }

    #[test]
    fn configs_check_their_suffix_lengths() {
        assert!(LookupConfig::new(4).check().is_ok());
        let bad = LookupConfig {
            min_ngram: 0,
            ..LookupConfig::new(4)
        };
        assert!(bad.check().unwrap_err().to_string().contains("0..=3"));
        let bad = LookupConfig {
            min_ngram: 4,
            ..LookupConfig::new(4)
        };
        assert!(bad.check().is_err());
        assert_eq!(LookupConfig::new(2).guess(&[1, 2, 3, 1, 2]), [3, 1]);
    }

    #[test]
    fn a_branch_beside_two_chains() {
        // 2,1: root; 1, 2; 3 (of 1), 4 (of 2). With a branch of 3: the branch's node last at
        // every depth
        let tree = TokenTree::parse("2,1").unwrap();
        let merged = with_lookup_branch(&tree, 3);
        // depth 1: 1, 2 (drafted), 3 (lookup); depth 2: 4, 5, 6 (lookup); depth 3: 7 (lookup)
        assert_eq!(
            merged.tree,
            TokenTree::from_parents(&[0, 0, 0, 1, 2, 3, 6]).unwrap()
        );
        assert_eq!(merged.drafted, [0, 1, 2, 4, 5]);
        assert_eq!(merged.lookup, [3, 6, 7]);
        // no branch: the tree itself
        let same = with_lookup_branch(&tree, 0);
        assert_eq!(same.tree, tree);
        assert_eq!(same.drafted, [0, 1, 2, 3, 4]);
        assert!(same.lookup.is_empty());
        // a branch is cut to MAX_TREE_NODES
        let wide = TokenTree::from_widths(&[60]).unwrap();
        let merged = with_lookup_branch(&wide, 10);
        assert_eq!(merged.tree.nodes(), MAX_TREE_NODES);
        assert_eq!(merged.lookup, [61, 62, 63]);
    }

    proptest! {
        /// Any breadth-first tree, any branch: the merged tree is breadth-first (from_parents
        /// accepts it), every drafted node keeps its path, the branch is a chain at the root, and
        /// nothing else is in the tree.
        #[test]
        fn merging_keeps_paths(
            choices in prop::collection::vec(any::<usize>(), 0..40),
            branch in 0usize..30,
        ) {
            let mut previous = 0;
            let parents: Vec<usize> = (1..=choices.len())
                .map(|i| {
                    previous += choices[i - 1] % (i - previous);
                    previous
                })
                .collect();
            let tree = TokenTree::from_parents(&parents).unwrap();
            let merged = with_lookup_branch(&tree, branch);
            let fits = branch.min(MAX_TREE_NODES - tree.nodes());
            prop_assert_eq!(merged.tree.nodes(), tree.nodes() + fits);
            prop_assert_eq!(merged.lookup.len(), fits);
            let new = &merged.tree;
            // breadth-first: rebuilding from the parents is accepted
            let rebuilt: Vec<usize> = (1..new.nodes()).map(|i| new.parent(i).unwrap()).collect();
            prop_assert!(TokenTree::from_parents(&rebuilt).is_ok());
            for i in 0..tree.nodes() {
                let path: Vec<usize> = tree.path(i).iter().map(|&a| merged.drafted[a]).collect();
                prop_assert_eq!(new.path(merged.drafted[i]), path);
                // the children of a drafted node are drafted, in order
                let children: Vec<usize> =
                    tree.children(i).map(|c| merged.drafted[c]).collect();
                let mut kept: Vec<usize> = new.children(merged.drafted[i]).collect();
                if i == 0 && fits > 0 {
                    prop_assert_eq!(kept.pop(), Some(merged.lookup[0]));
                }
                prop_assert_eq!(kept, children);
            }
            for (j, &node) in merged.lookup.iter().enumerate() {
                let mut path = vec![0];
                path.extend_from_slice(&merged.lookup[..=j]);
                prop_assert_eq!(new.path(node), path);
            }
            let mut all: Vec<usize> = merged.drafted.iter().chain(&merged.lookup).copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..new.nodes()).collect::<Vec<_>>());
        }
    }
}
