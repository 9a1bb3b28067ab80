//! What a golden says about itself, checked: a model config or M2R2 settings edited under the
//! hashes that cover them, tensors and metadata keys its kind does not record, an rtol pinned in
//! an M2R2 golden, and rounds whose own token tensors are off (named before the rows they imply).

use super::tests::{RawGolden, refused_after, set_i64, set_meta, setup, spec_options};
use super::tree::TreeRecipe;
use super::*;
use crate::decode::early_exit::EarlyExitOptions;
use crate::decode::prompt_lookup::LookupConfig;
use crate::golden::{DEFAULT_ATOL, Golden, Tolerance};
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use safetensors::Dtype;
use serde_json::Value;

const PROMPT: [u32; 7] = [1, 2, 3, 4, 1, 2, 3];

/// One golden of each kind of tiny, named as the reader's refusals name its kind.
fn every_kind(m2r2: M2r2<'_>) -> Vec<(&'static str, Golden)> {
    let model = m2r2.model;
    let early_exit = EarlyExitOptions {
        max_new_tokens: 0,
        stop_tokens: vec![],
        gate: GateKind::Confidence,
        threshold: 0.5f32.into(),
        kv_policy: KvPolicy::Exact,
        sampling: None,
    };
    let chain = spec_options(DraftLength::Fixed(3));
    let grown = TreeRecipe {
        grown: Some((GateKind::Confidence, 0.5)),
        lookup: Some(LookupConfig::new(2)),
        ..TreeRecipe::fixed(1, &[2, 1])
    };
    vec![
        (
            "greedy golden",
            Golden::record_greedy(model, "tiny", &PROMPT, 6).unwrap(),
        ),
        (
            "early-exit golden",
            Golden::record_early_exit(m2r2, "tiny", &PROMPT, 6, &early_exit).unwrap(),
        ),
        (
            "speculative golden",
            Golden::record_speculative(m2r2, "tiny", &PROMPT, 10, 1, None, &chain).unwrap(),
        ),
        (
            "token-tree golden (a fixed tree)",
            Golden::record_tree_speculative(m2r2, "tiny", &PROMPT, 10, 1, &[2, 1], &[]).unwrap(),
        ),
        (
            "token-tree golden (trees that change from round to round)",
            Golden::record_tree_drafting(m2r2, "tiny", &PROMPT, 10, &grown, &[]).unwrap(),
        ),
    ]
}

/// A config edited under the recorded hash (another architecture, other sizes), or a hash edited over
/// the config, is refused by the reader naming both keys.
#[test]
fn a_config_edited_under_its_hash_is_refused() {
    let (model, weights) = setup("tiny");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    for (_, g) in every_kind(M2r2::new(&model, &weights)) {
        let mut bigger: Value = serde_json::from_str(&g.config_json).unwrap();
        bigger["num_hidden_layers"] = 4.into();
        bigger["hidden_size"] = 32.into();
        let needle = format!(
            "metadata `config` does not hash to `config_hash` = `{}`",
            g.config_hash
        );
        for edited in [
            r#"{"architecture":"llama"}"#.to_string(),
            bigger.to_string(),
        ] {
            let edit = move |(_, meta): &mut RawGolden| {
                meta.insert("config".into(), edited.clone());
            };
            refused_after(&g, &path, &edit, &needle);
        }
        refused_after(
            &g,
            &path,
            &set_meta("config_hash", "0123456789abcdef"),
            "does not hash to `config_hash` = `0123456789abcdef`",
        );
    }
}

/// Every kind of golden reads back; a tensor or metadata key it does not record is refused, all
/// of them named, and so is one another kind (or a later version) records.
#[test]
fn unknown_tensors_and_metadata_keys_are_refused_by_name() {
    let (model, weights) = setup("tiny");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let junk = |(tensors, meta): &mut RawGolden| {
        meta.insert("foo".into(), "bar".into());
        tensors.push(("junk".into(), Dtype::F32, vec![1], vec![0; 4]));
    };
    for (kind, g) in every_kind(M2r2::new(&model, &weights)) {
        g.write(&path).unwrap();
        Golden::read(&path).unwrap();
        let needle = format!("holds metadata `foo`, tensor `junk`, which no {kind} of format");
        refused_after(&g, &path, &junk, &needle);
        // a tensor of another kind
        let other = match kind {
            "greedy golden" => "exit_gate",
            "speculative golden" => "draft_rows",
            "token-tree golden (a fixed tree)" => "round_lookup",
            _ => "round_drafted",
        };
        let borrowed = move |(tensors, _): &mut RawGolden| {
            tensors.push((other.into(), Dtype::I64, vec![0], vec![]));
        };
        refused_after(&g, &path, &borrowed, &format!("holds tensor `{other}`"));
    }
    // version 3's keys in a version-1 file
    let mut g = Golden::record_greedy(&model, "tiny", &PROMPT, 6).unwrap();
    g.version = 1;
    g.write(&path).unwrap();
    Golden::read(&path).unwrap();
    refused_after(
        &g,
        &path,
        &set_meta("atol", "0.1"),
        "holds metadata `atol`, which no greedy golden of format version 1 records",
    );
}

/// `golden check` takes atol alone for an M2R2 golden on the reference, while `compare` would
/// apply a pinned rtol: the writer refuses to pin one and the reader refuses a file that does,
/// naming the key; a greedy golden pins one as before.
#[test]
fn an_rtol_pinned_in_an_m2r2_golden_is_refused() {
    let (model, weights) = setup("tiny");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    for (kind, g) in every_kind(M2r2::new(&model, &weights)) {
        let mut pinned = g.clone();
        pinned.pins.rtol = Some(0.1);
        if kind == "greedy golden" {
            pinned.write(&path).unwrap();
            assert_eq!(Golden::read(&path).unwrap().pins.rtol, Some(0.1));
            continue;
        }
        let err = pinned.write(&path).unwrap_err().to_string();
        assert!(err.contains("cannot pin rtol"), "{err}");
        let needle = format!(
            "metadata `rtol` = `0.1` is pinned in an M2R2 golden (mode `{}`)",
            g.mode
        );
        refused_after(&g, &path, &set_meta("rtol", "0.1"), &needle);
    }
}

/// `m2r2_config` edited under the hashes (other gates and rank; a decoding default under
/// `m2r2_hash` alone): the reference's check hashes the golden's settings with the weights'
/// tensors and refuses them naming what differs, `compare` refuses two goldens of one hash and
/// other settings, and an export's settings are compared outside the decoding defaults.
#[test]
fn settings_edited_under_their_hashes_are_refused() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let edited = |g: &Golden, edit: &dyn Fn(&mut Value)| {
        let mut bad = g.clone();
        let settings = &mut bad.m2r2.as_mut().unwrap().config_json;
        let mut value: Value = serde_json::from_str(settings).unwrap();
        edit(&mut value);
        *settings = value.to_string();
        bad
    };
    let no_text = |_: i64| None;
    for (kind, g) in every_kind(m2r2).into_iter().skip(1) {
        let recorded = g.m2r2.as_ref().unwrap();
        recorded.check_settings(&weights).unwrap();
        recorded
            .check_settings_against(&weights.config, "x")
            .unwrap();
        let bad = edited(&g, &|c| {
            c["gates"] = serde_json::json!([1, 3, 5]);
            c["rank"] = 4.into();
        });
        let err = bad.check_m2r2(m2r2, DEFAULT_ATOL).unwrap_err().to_string();
        for needle in [
            "metadata `m2r2_config` is not the settings its `m2r2_weights_hash`",
            "`gates` ([1,3,5] vs [",
            "`rank` (4 vs ",
        ] {
            assert!(err.contains(needle), "{kind}: {needle}: {err}");
        }
        let tol = Tolerance::absolute(DEFAULT_ATOL);
        let err = g.compare_to(&bad, tol, &no_text).unwrap_err().to_string();
        assert!(
            err.contains("the same `m2r2_weights_hash`") && err.contains("`rank` ("),
            "{kind}: {err}"
        );
        let settings = bad.m2r2.as_ref().unwrap();
        let err = settings.check_settings_against(&weights.config, "export x");
        let err = err.unwrap_err().to_string();
        assert!(
            err.contains("settings of export x in `gates`"),
            "{kind}: {err}"
        );
        // a decoding default: covered by `m2r2_hash` alone
        let bad = edited(&g, &|c| c["draft_len"] = 9.into());
        let err = bad.check_m2r2(m2r2, DEFAULT_ATOL).unwrap_err().to_string();
        assert!(
            err.contains("its `m2r2_hash`") && err.contains("`draft_len` (9 vs "),
            "{kind}: {err}"
        );
        let err = g.compare_to(&bad, tol, &no_text).unwrap_err().to_string();
        assert!(err.contains("the same `m2r2_hash`"), "{kind}: {err}");
        let settings = bad.m2r2.as_ref().unwrap();
        settings
            .check_settings_against(&weights.config, "x")
            .unwrap();
        // a golden from before `m2r2_weights_hash`: its `m2r2_hash` covers the gates
        let mut old = edited(&g, &|c| c["gates"] = serde_json::json!([1, 3, 5]));
        old.m2r2.as_mut().unwrap().weights.without_defaults = None;
        let err = old.check_m2r2(m2r2, DEFAULT_ATOL).unwrap_err().to_string();
        assert!(err.contains("its `m2r2_hash`"), "{kind}: {err}");
    }
    // other weights are refused as such, before their settings are compared
    let mut other = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    other.config.rank += 1;
    let chain = every_kind(m2r2).remove(2).1;
    let err = chain.check_m2r2(M2r2::new(&model, &other), DEFAULT_ATOL);
    let err = err.unwrap_err().to_string();
    assert!(
        err.contains("are not the ones this golden was recorded with"),
        "{err}"
    );
}

/// A chain round's drafted tokens, padding and base token, and a tree round's node and base
/// tokens, are checked before the rows of `verify_logits` they imply: the refusal names the
/// tensor that was edited, its round and the rule.
#[test]
fn round_tokens_are_refused_before_the_rows_they_imply() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let mut goldens = every_kind(m2r2);
    let chain = goldens.remove(2).1;
    let M2r2Record::Speculative { rounds, .. } = &chain.m2r2.as_ref().unwrap().record else {
        unreachable!()
    };
    assert!(rounds.len() >= 2);
    // round 1's last draft made padding: 2 of 3 drafts, whatever it accepted
    for (edit, needle) in [
        (
            set_i64("round_drafted", 5, -1),
            "tensor `round_drafted`: round 1 drafted 2 tokens, but a fixed draft length drafts \
             `draft_max` = 3 every round",
        ),
        (
            set_i64("round_drafted", 4, -1),
            "tensor `round_drafted`: round 1 holds ",
        ),
        (
            set_i64("round_drafted", 3, -2),
            "tensor `round_drafted`: round 1 holds -2 at draft 0, after its 0 drafts",
        ),
        (
            set_i64("round_drafted", 3, 320),
            "tensor `round_drafted`: round 1 holds token id 320 at draft 0, outside the \
             vocabulary of 320 tokens (metadata `config`)",
        ),
        (
            set_i64("round_base_token", 1, 320),
            "tensor `round_base_token`: round 1 holds token id 320, outside the vocabulary",
        ),
        (
            set_i64("round_base_token", 0, -1),
            "tensor `round_base_token`: round 0 holds token id -1",
        ),
    ] {
        refused_after(&chain, &path, &edit, needle);
    }
    // a dynamic draft stops early: padding after its drafts reads
    let dynamic = spec_options(DraftLength::Dynamic {
        max: 4,
        gate: GateKind::Confidence,
        threshold: 2.0,
    });
    let g = Golden::record_speculative(
        m2r2,
        "tiny",
        &PROMPT,
        6,
        1,
        Some(GateKind::Confidence),
        &dynamic,
    )
    .unwrap();
    g.write(&path).unwrap();
    Golden::read(&path).unwrap();
    for (_, tree) in goldens.into_iter().skip(2) {
        refused_after(
            &tree,
            &path,
            &set_i64("round_tree_tokens", 1, 320),
            "tensor `round_tree_tokens`: round 0 node 1 holds token id 320, outside the \
             vocabulary of 320 tokens",
        );
        refused_after(
            &tree,
            &path,
            &set_i64("round_base_token", 0, 320),
            "tensor `round_base_token`: round 0 holds token id 320, outside the vocabulary",
        );
    }
}
