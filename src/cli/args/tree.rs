//! `--draft-tree W1,W2,...`: the token tree of speculative decoding, checked with the library's
//! rules (`TokenTree::parse`), and the flags it cannot be used with. `generate` (the reference)
//! and `run` (ONNX Runtime) share it.

use anyhow::{Result, anyhow, bail};
use reference::base::tree::TokenTree;

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
