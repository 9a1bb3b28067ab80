//! What a golden file may hold besides what it records: the model config must be the one its
//! `config_hash` names, and every tensor and metadata key must be one that golden's kind records.
//!
//! A check compares `config_hash` with the engine's and never reads `config` again, so a `config`
//! edited under the recorded hash (another architecture, other sizes) would be reported as the
//! model the golden is of, by `golden check` and by any reader that trusts it; and a tensor or key
//! that no writer records (`junk`, `foo`) is either a hand edit or a newer writer's field this
//! reader would silently ignore. Both are refused by name, as the Python reader
//! (`python/src/m2r2_golden/reader.py`) refuses them.

use super::{M2r2Golden, M2r2Record, shown};
use crate::base::config::hash_of_json;
use crate::error::{Error, Result};
use std::collections::HashMap;

/// Refuse a `config` that does not hash to the recorded `config_hash` (edited after recording).
pub(in crate::golden) fn check_config_hash(label: &str, json: &str, recorded: &str) -> Result<()> {
    let hash = hash_of_json(json);
    if hash == recorded {
        return Ok(());
    }
    Err(Error::format(
        label,
        format!(
            "metadata `config` does not hash to `config_hash` = `{}` (it hashes to `{hash}`): \
             the config was edited after recording, or the hash was; record the golden again",
            shown(recorded)
        ),
    ))
}

/// Metadata keys of every golden.
const COMMON_KEYS: [&str; 7] = [
    "format",
    "format_version",
    "model",
    "config_hash",
    "config",
    "mode",
    "m2r2_version",
];
/// Keys format version 3 added (stops, budget, pins).
const VERSION_3_KEYS: [&str; 5] = ["stop_tokens", "max_steps", "atol", "rtol", "expect_dtype"];
/// Keys of both M2R2 modes.
const M2R2_KEYS: [&str; 3] = ["m2r2_config", "m2r2_hash", "m2r2_weights_hash"];
const EARLY_EXIT_KEYS: [&str; 3] = ["gate", "threshold", "kv_policy"];
const CHAIN_KEYS: [&str; 5] = [
    "draft_gate",
    "gate",
    "draft_length",
    "draft_max",
    "draft_threshold",
];
const TREE_KEYS: [&str; 8] = [
    "draft_gate",
    "gate",
    "draft_length",
    "draft_max",
    "draft_tree",
    "tree_threshold",
    "prompt_lookup",
    "prompt_lookup_ngram",
];

const GREEDY_TENSORS: [&str; 3] = ["prompt_tokens", "tokens", "logits"];
const EARLY_EXIT_TENSORS: [&str; 2] = ["exit_gate", "gate_scores"];
const CHAIN_TENSORS: [&str; 4] = [
    "round_drafted",
    "round_accepted",
    "round_base_token",
    "round_scores",
];
/// What the verifier and the draft produced (chains from format version 3; every tree).
const GRAPH_TENSORS: [&str; 2] = ["verify_logits", "draft_logits"];
const TREE_TENSORS: [&str; 5] = [
    "round_tree_tokens",
    "round_node",
    "round_accepted",
    "round_base_token",
    "draft_rows",
];
/// A tree that changes from round to round (format version 5).
const VARYING_TREE_TENSORS: [&str; 3] = ["round_tree_parents", "round_lookup", "round_scores"];

/// Refuse a tensor (of `tensor_names`) or a metadata key (of `meta`) that a golden of this kind
/// (mode, format `version`, chain or tree) does not record, naming every one (`label`: the file).
pub(in crate::golden) fn check_known(
    label: &str,
    meta: &HashMap<String, String>,
    tensor_names: Vec<&str>,
    version: u32,
    m2r2: Option<&M2r2Golden>,
) -> Result<()> {
    let mut keys: Vec<&str> = COMMON_KEYS.to_vec();
    let mut tensors: Vec<&str> = GREEDY_TENSORS.to_vec();
    if version >= 3 {
        keys.extend(VERSION_3_KEYS);
    }
    let kind = match m2r2.map(|m| &m.record) {
        None => "greedy golden",
        Some(record) => {
            keys.extend(M2R2_KEYS);
            match record {
                M2r2Record::EarlyExit { .. } => {
                    keys.extend(EARLY_EXIT_KEYS);
                    tensors.extend(EARLY_EXIT_TENSORS);
                    "early-exit golden"
                }
                M2r2Record::Speculative { .. } => {
                    keys.extend(CHAIN_KEYS);
                    tensors.extend(CHAIN_TENSORS);
                    if version >= 3 {
                        tensors.extend(GRAPH_TENSORS);
                    }
                    "speculative golden"
                }
                M2r2Record::SpeculativeTree { recipe, .. } => {
                    keys.extend(TREE_KEYS);
                    tensors.extend(TREE_TENSORS);
                    tensors.extend(GRAPH_TENSORS);
                    if recipe.varies() {
                        tensors.extend(VARYING_TREE_TENSORS);
                        "token-tree golden (trees that change from round to round)"
                    } else {
                        "token-tree golden (a fixed tree)"
                    }
                }
            }
        }
    };
    let mut unknown: Vec<String> = meta
        .keys()
        .filter(|k| !keys.contains(&k.as_str()))
        .map(|k| format!("metadata `{}`", shown(k)))
        .collect();
    unknown.sort();
    let mut names: Vec<String> = tensor_names
        .into_iter()
        .filter(|n| !tensors.contains(n))
        .map(|n| format!("tensor `{}`", shown(n)))
        .collect();
    names.sort();
    unknown.extend(names);
    if unknown.is_empty() {
        return Ok(());
    }
    Err(Error::format(
        label,
        format!(
            "holds {}, which no {kind} of format version {version} records (edited after \
             recording, or written by another tool?)",
            unknown.join(", ")
        ),
    ))
}
