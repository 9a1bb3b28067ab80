//! [`WeightsId`]: the second hash leaves out exactly the decoding defaults, so a golden still
//! checks after the drafting policy is chosen again, while goldens from before it keep the first
//! hash's strictness; other tensors are refused either way.

use super::tests::{refused_after, set_meta, setup, spec_options};
use super::*;
use crate::golden::{DEFAULT_ATOL, Golden};
use crate::m2r2::config::{DraftTreeConfig, DynamicDraftConfig, EarlyExitConfig, EngineDrafting};
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;

/// Each decoding default moves `m2r2_hash` and leaves `m2r2_weights_hash` as it was; a setting the
/// weights compute with, or a tensor, moves both.
#[test]
fn the_second_hash_ignores_only_the_decoding_defaults() {
    let (_, weights) = setup("tiny");
    let base = WeightsId::of(&weights);
    let defaults: [fn(&mut M2r2Weights); 9] = [
        |w| w.config.draft_gate = 2,
        |w| w.config.draft_len += 1,
        |w| {
            w.config.dynamic_draft = Some(DynamicDraftConfig {
                gate: GateKind::Confidence,
                threshold: 0.25,
            })
        },
        |w| {
            w.config.draft_tree = Some(DraftTreeConfig {
                draft_gate: 1,
                widths: vec![2, 1],
                dynamic: None,
            })
        },
        |w| w.config.prompt_lookup = Some(4),
        |w| {
            w.config.onnx_drafting = Some(EngineDrafting {
                draft_gate: 1,
                draft_len: 2,
                dynamic_draft: None,
                draft_tree: None,
                prompt_lookup: None,
            })
        },
        |w| {
            w.config.early_exit = Some(EarlyExitConfig {
                gate: GateKind::Entropy,
                thresholds: vec![0.5; 3],
            })
        },
        |w| w.config.arla.threshold += 0.125,
        |w| w.config.seed = Some(12345),
    ];
    for (i, change) in defaults.into_iter().enumerate() {
        let mut changed = weights.clone();
        change(&mut changed);
        let id = WeightsId::of(&changed);
        assert_ne!(id.hash, base.hash, "default {i}");
        assert_eq!(id.without_defaults, base.without_defaults, "default {i}");
        assert!(id.matches(&base), "default {i}");
    }
    let computed: [fn(&mut M2r2Weights); 3] = [
        |w| w.config.alpha *= 2.0,
        |w| w.config.arla.latent += 1,
        |w| {
            let arla = w.arla.as_mut().expect("tiny has ARLA weights");
            arla.bo += 1.0;
        },
    ];
    for (i, change) in computed.into_iter().enumerate() {
        let mut changed = weights.clone();
        change(&mut changed);
        let id = WeightsId::of(&changed);
        assert_ne!(id.hash, base.hash, "setting {i}");
        assert_ne!(id.without_defaults, base.without_defaults, "setting {i}");
        assert!(!id.matches(&base), "setting {i}");
    }
    // without the second hash on either side, the first decides
    let old = WeightsId {
        without_defaults: None,
        ..base.clone()
    };
    assert!(base.matches(&old) && old.matches(&base));
    let mut changed = weights.clone();
    changed.config.draft_len += 1;
    assert!(!WeightsId::of(&changed).matches(&old));
}

/// A speculative golden written, read back and checked after the weights' drafting defaults
/// changed: it passes by its `m2r2_weights_hash`; the same golden without that key (as written
/// before it) is refused, naming both identities; a malformed key is refused on read.
#[test]
fn goldens_check_after_the_drafting_defaults_change() {
    let (model, weights) = setup("tiny");
    let options = spec_options(DraftLength::Fixed(2));
    let g = Golden::record_speculative(
        M2r2::new(&model, &weights),
        "tiny",
        &[1, 2, 3],
        8,
        1,
        None,
        &options,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.golden.safetensors");
    g.write(&path).unwrap();
    let read = Golden::read(&path).unwrap();
    let recorded = read.m2r2.as_ref().unwrap().weights.clone();
    assert_eq!(recorded, WeightsId::of(&weights));

    let mut retuned = weights.clone();
    retuned.config.draft_len = 1;
    retuned.config.prompt_lookup = Some(4);
    let report = read
        .check_m2r2(M2r2::new(&model, &retuned), DEFAULT_ATOL)
        .unwrap();
    assert!(report.ok(), "{report:?}");

    let mut old = read.clone();
    old.m2r2.as_mut().unwrap().weights.without_defaults = None;
    let err = old
        .check_m2r2(M2r2::new(&model, &retuned), DEFAULT_ATOL)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not the ones this golden was recorded with")
            && err.contains(&recorded.hash)
            && err.contains("weights hash"),
        "{err}"
    );
    assert!(
        old.check_m2r2(M2r2::new(&model, &weights), DEFAULT_ATOL)
            .unwrap()
            .ok()
    );
    refused_after(
        &g,
        &path,
        &set_meta("m2r2_weights_hash", "not-a-hash"),
        "metadata `m2r2_weights_hash` = `not-a-hash` is not valid",
    );
}
