//! The defaults `tune-drafting` chooses for each engine from the priced policies (the fastest
//! chain, the fastest tree when it beats it, the prompt-lookup branch length whose defaults are
//! fastest), what `--write` makes of them in an engine's drafting, and the defaults in words.

use super::{Family, PolicyResult};
use reference::m2r2::config::{DraftTreeConfig, EngineDrafting};
use serde::Serialize;

/// What `--write` stores (or would store): one engine's defaults of `--mode speculative`, the
/// reference's at the top level of the config, ONNX Runtime's in `onnx_drafting`.
#[derive(Serialize)]
pub(super) struct Defaults {
    /// `draft_gate`, `draft_len`, `dynamic_draft`: the engine's fastest chain, drafted when it has
    /// no tree or samples; `None` when no chain was priced (the folder's is kept).
    chain: Option<PolicyResult>,
    /// `draft_tree`: the engine's fastest tree when it beats the chain default there; `None`: the
    /// engine drafts the chain default.
    tree: Option<PolicyResult>,
    /// `prompt_lookup`: the branch beside the chain and the tree above (chosen with them: the
    /// branch length whose defaults are fastest), `None` for no branch; `None` too when no branch
    /// was priced (the folder's is kept).
    prompt_lookup: Option<usize>,
}

/// The fastest of `results` by `speedup`, the first of equals (unpriced ones never win).
pub(super) fn fastest<'a>(
    results: impl Iterator<Item = &'a PolicyResult>,
    speedup: impl Fn(&PolicyResult) -> Option<f64>,
) -> Option<&'a PolicyResult> {
    results.fold(None, |best, r| match (best, speedup(r)) {
        (_, None) => best,
        (Some(b), Some(s)) if speedup(b).is_some_and(|bs| bs >= s) => Some(b),
        (_, Some(_)) => Some(r),
    })
}

/// One engine's defaults (ONNX Runtime's when `onnx`, else the reference's): a chain, at most one
/// tree and a prompt-lookup branch beside them. For each branch length (none included) the chain
/// and tree of [`defaults_of`], then the length whose default (the tree when there is one, else
/// the chain) is fastest by the engine's predictions.
pub(super) fn defaults(results: &[PolicyResult], onnx: bool) -> Defaults {
    let speedup = |r: &PolicyResult| match onnx {
        true => r.speedup_onnx,
        false => r.speedup_reference,
    };
    let mut lengths: Vec<Option<usize>> = vec![None];
    for r in results {
        if !lengths.contains(&r.prompt_lookup) {
            lengths.push(r.prompt_lookup);
        }
    }
    let mut best: Option<(Defaults, f64)> = None;
    for length in lengths {
        let same: Vec<&PolicyResult> = results
            .iter()
            .filter(|r| r.prompt_lookup == length)
            .collect();
        let d = defaults_of(&same, onnx);
        let Some(s) = d.tree.as_ref().or(d.chain.as_ref()).and_then(speedup) else {
            continue;
        };
        if best.as_ref().is_none_or(|(_, b)| s > *b) {
            best = Some((
                Defaults {
                    prompt_lookup: length,
                    ..d
                },
                s,
            ));
        }
    }
    best.map_or_else(|| defaults_of(&[], onnx), |(d, _)| d)
}

/// One engine's defaults among `results` of one branch length: the fastest chain, and the fastest
/// tree when it beats that chain.
fn defaults_of(results: &[&PolicyResult], onnx: bool) -> Defaults {
    let speedup = |r: &PolicyResult| match onnx {
        true => r.speedup_onnx,
        false => r.speedup_reference,
    };
    let chain = fastest(
        results
            .iter()
            .copied()
            .filter(|r| r.family == Family::Chain),
        speedup,
    );
    let tree = fastest(
        results.iter().copied().filter(|r| r.family == Family::Tree),
        speedup,
    )
    .filter(|t| chain.is_none_or(|c| speedup(t) > speedup(c)));
    Defaults {
        chain: chain.cloned(),
        tree: tree.cloned(),
        prompt_lookup: chain.and_then(|c| c.prompt_lookup),
    }
}

/// `base` (an engine's drafting in the folder) with the chain, tree and branch `d` chose; what
/// was not priced (no chain, no branch length) stays as it was.
pub(super) fn applied(
    d: &Defaults,
    mut base: EngineDrafting,
    priced_lookup: bool,
) -> EngineDrafting {
    if let Some(c) = &d.chain {
        base.draft_gate = c.draft_gate;
        base.draft_len = c.draft_len;
        base.dynamic_draft = c.dynamic_draft.clone();
    }
    base.draft_tree = d.tree.as_ref().map(|t| DraftTreeConfig {
        draft_gate: t.draft_gate,
        widths: t.draft_tree.clone().expect("a tree's widths"),
        dynamic: t.dynamic_draft.clone(),
    });
    if priced_lookup {
        base.prompt_lookup = d.prompt_lookup;
    }
    base
}

/// The defaults in words: "chain: draft gate 1, fixed 2; tree: draft gate 1, tree 2,1; ...".
pub(super) fn describe_defaults(d: &Defaults) -> String {
    let chain = match &d.chain {
        Some(c) => format!("chain: draft gate {}, {}", c.draft_gate, c.policy),
        None => "chain: unchanged (no chain priced)".into(),
    };
    let tree = match &d.tree {
        Some(t) => format!("tree: draft gate {}, {}", t.draft_gate, t.policy),
        None => "tree: none (the chain)".into(),
    };
    let lookup = match d.prompt_lookup {
        Some(n) => format!("prompt lookup: up to {n} tokens"),
        None => "prompt lookup: none".into(),
    };
    format!("{chain}; {tree}; {lookup}")
}
