//! `--draft-tree W1,W2,...`: the token tree of speculative decoding, checked with the library's
//! rules (`TokenTree::parse`), `--prompt-lookup N`'s branch, and the flags they cannot be used
//! with. `generate` (the reference) and `run` (ONNX Runtime) share them.

use anyhow::{Result, anyhow, bail};
use reference::base::tree::{MAX_TREE_NODES, TokenTree};
use reference::decode::mode::{M2r2Settings, Mode};
use reference::decode::prompt_lookup::LookupConfig;
use reference::decode::speculative::DraftLength;
use reference::m2r2::config::DraftTreeConfig;
use reference::m2r2::exit_gate::GateKind;

/// What the command was asked besides the tree.
pub struct TreeRequest<'a> {
    /// `--draft-tree`, as written
    pub spec: Option<&'a str>,
    pub speculative: bool,
    pub draft_len: Option<usize>,
}

/// The tree's widths, or `None` without `--draft-tree`.
///
/// # Errors
/// A tree outside speculative decoding, with `--draft-len`, and the shapes `TokenTree::parse`
/// refuses, each naming `--draft-tree`. (With `--dynamic-draft` the tree is the largest shape a
/// round grows, a node getting children while the gate's score passes.)
pub fn tree_widths(request: &TreeRequest<'_>) -> Result<Option<Vec<usize>>> {
    let Some(spec) = request.spec else {
        return Ok(None);
    };
    if !request.speculative {
        bail!("--draft-tree drafts token trees for speculative decoding: add --mode speculative");
    }
    if request.draft_len.is_some() {
        bail!(
            "--draft-tree and --draft-len both set the drafts: give one (--draft-len N is the \
             tree 1,1,... of N ones)"
        );
    }
    TokenTree::parse(spec).map_err(|e| anyhow!("--draft-tree: {e}"))?;
    let widths = spec
        .split(',')
        .map(|w| w.trim().parse().expect("checked by TokenTree::parse"))
        .collect();
    Ok(Some(widths))
}

/// `--prompt-lookup N`'s branch (`None` for 0).
///
/// # Errors
/// A branch outside speculative decoding, or longer than a round verifies, named.
pub fn prompt_lookup(tokens: usize, speculative: bool) -> Result<Option<LookupConfig>> {
    if tokens == 0 {
        return Ok(None);
    }
    check_branch_len(tokens)?;
    if !speculative {
        bail!("--prompt-lookup adds a branch to speculative drafts: add --mode speculative");
    }
    Ok(Some(LookupConfig::new(tokens)))
}

/// Refuse a `--prompt-lookup` branch longer than a round verifies (the M2R2 config's range).
pub fn check_branch_len(tokens: usize) -> Result<()> {
    if tokens >= MAX_TREE_NODES {
        bail!(
            "--prompt-lookup {tokens}: a branch has at most {} tokens (a round verifies at most \
             {MAX_TREE_NODES} nodes, the M2R2 config's range)",
            MAX_TREE_NODES - 1
        );
    }
    Ok(())
}

/// `--prompt-lookup` when given (`flag`: `explicit`, already checked by [`prompt_lookup`]), else
/// the M2R2 config's `prompt_lookup` (`config`) in greedy speculative decoding when nothing asks
/// for other drafting (`chooses_drafting`: `--draft-tree`, `--draft-len` or `--dynamic-draft`).
pub fn lookup_or_default(
    (flag, explicit): (Option<usize>, Option<LookupConfig>),
    (speculative, sampling, chooses_drafting): (bool, bool, bool),
    config: Option<usize>,
) -> Option<LookupConfig> {
    match flag {
        Some(_) => explicit,
        None => config
            .filter(|_| speculative && !sampling && !chooses_drafting)
            .map(LookupConfig::new),
    }
}

/// The tree a lookup branch hangs beside when no tree is asked for: the chain `1,1,...` of the
/// settings' draft length, grown per branch (`grown`) when their drafting is dynamic (the
/// config's `dynamic_draft` or `--dynamic-draft`), so the branch joins the drafting the run
/// would have without it.
pub fn lookup_chain(settings: &M2r2Settings, grown: &mut Option<(GateKind, f32)>) -> Vec<usize> {
    if let DraftLength::Dynamic {
        gate, threshold, ..
    } = settings.draft_length
    {
        *grown = Some((gate, threshold));
    }
    vec![1; settings.draft_length.max()]
}

/// Make `settings` draft the tree of shape `widths`: up to its depth every round, or grown per
/// branch while `grown`'s gate scores at least its threshold (`--dynamic-draft`, or the config
/// tree's `dynamic`), which is then the gate the report names.
pub fn draft_tree_settings(
    settings: &mut M2r2Settings,
    widths: &[usize],
    grown: Option<(GateKind, f32)>,
) {
    settings.draft_length = match grown {
        Some((gate, threshold)) => {
            (settings.gate, settings.threshold) = (gate, threshold);
            DraftLength::Dynamic {
                max: widths.len(),
                gate,
                threshold,
            }
        }
        None => DraftLength::Fixed(widths.len()),
    };
}

/// How the M2R2 config's default tree grows: per branch with its `dynamic` gate and threshold,
/// `--gate` (`gate`) and `--threshold` (`threshold`) replacing them as they replace
/// `dynamic_draft`'s; `None`: the whole shape every round.
pub fn config_tree_growth(
    tree: &DraftTreeConfig,
    gate: Option<GateKind>,
    threshold: Option<f32>,
) -> Option<(GateKind, f32)> {
    let d = tree.dynamic.as_ref()?;
    Some((gate.unwrap_or(d.gate), threshold.unwrap_or(d.threshold)))
}

/// Refuse `--gate` and `--threshold` (whether each was given) where no gate score is computed or
/// compared: speculative decoding whose drafts, chain or tree, have a fixed length (`settings` as
/// the run will use them, the tree's applied).
///
/// # Errors
/// The flag, the fixed drafting named, and the flag that makes it dynamic.
pub fn check_gate_flags_read(gate: bool, threshold: bool, settings: &M2r2Settings) -> Result<()> {
    let flag = match (gate, threshold) {
        (true, true) => "--gate and --threshold are",
        (true, false) => "--gate is",
        (false, true) => "--threshold is",
        (false, false) => return Ok(()),
    };
    if let (Mode::Speculative, DraftLength::Fixed(n)) = (settings.mode, &settings.draft_length) {
        bail!(
            "{flag} read by dynamic drafting, and this speculative run drafts a fixed {n} \
             token(s) deep every round: add --dynamic-draft (draft while the gate score is >= \
             the threshold), or drop {}",
            flag.trim_end_matches(" are").trim_end_matches(" is")
        );
    }
    Ok(())
}
