//! Per-module ranks and alphas (PEFT's `rank_pattern` / `alpha_pattern`): what we write loads back
//! unchanged, patterns written by hand in PEFT's style give the ranks and scales PEFT's rule gives
//! (checked by hand here), and a disagreement between a pattern and a tensor is an error naming
//! both files' parts.

use ndarray::Array2;
use reference::base::config::ModelConfig;
use reference::base::weight_names::{AttnProj, MlpProj, Target};
use reference::io::builtin::tiny_config;
use reference::io::peft::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
use reference::m2r2::accelerator::Accelerator;
use reference::m2r2::config::M2r2Config;
use reference::m2r2::weights::M2r2Weights;
use serde_json::{Value, json};
use std::path::Path;

const Q: Target = Target::Attn(AttnProj::Q);
const UP: Target = Target::Mlp(MlpProj::Up);

/// The tiny model's M2R2 weights with ranks 32 / 16 / 8 on its three intervals (layers 0-1, 2-3,
/// 4-5), saved to a temporary folder.
fn saved_ranked(model: &ModelConfig) -> (tempfile::TempDir, M2r2Weights) {
    let config = M2r2Config::default_for(model);
    let w = M2r2Weights::random_ranked(model, config, &[32, 16, 8], 42).unwrap();
    let dir = tempfile::tempdir().unwrap();
    w.save_dir(dir.path()).unwrap();
    (dir, w)
}

fn adapter_config(dir: &Path) -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(dir.join(ADAPTER_CONFIG_FILE)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn write_adapter_config(dir: &Path, map: &serde_json::Map<String, Value>) {
    let text = serde_json::to_string_pretty(map).unwrap();
    std::fs::write(dir.join(ADAPTER_CONFIG_FILE), text).unwrap();
}

#[test]
fn mixed_ranks_round_trip_through_peft_patterns() {
    let model = tiny_config();
    let (dir, w) = saved_ranked(&model);
    let cfg = adapter_config(dir.path());
    assert_eq!(cfg["r"], json!(16));
    assert_eq!(cfg["lora_alpha"], json!(32));
    // Layers 0-1 at rank 32 (alpha 64) and 4-5 at rank 8 (alpha 16), named module by module.
    let ranks = cfg["rank_pattern"].as_object().unwrap();
    let alphas = cfg["alpha_pattern"].as_object().unwrap();
    assert_eq!(ranks.len(), 4 * 7);
    assert_eq!(ranks["model.layers.0.self_attn.q_proj"], json!(32));
    assert_eq!(ranks["model.layers.5.mlp.up_proj"], json!(8));
    assert!(!ranks.contains_key("model.layers.2.self_attn.q_proj"));
    assert_eq!(alphas["model.layers.1.mlp.down_proj"], json!(64));
    assert_eq!(alphas["model.layers.4.self_attn.v_proj"], json!(16));

    let back = M2r2Weights::load_dir(dir.path(), &model).unwrap();
    assert_eq!(back, w);
    assert_eq!(back.accelerator.layer_ranks(0), vec![32; 7]);
    assert_eq!(back.accelerator.layer_ranks(4), vec![8; 7]);
}

/// Keys in PEFT's style (a module suffix, a regular expression), first match in file order: ranks
/// and alphas by hand.
#[test]
fn hand_written_patterns() {
    let model = tiny_config();
    let (dir, _) = saved_ranked(&model);
    let mut cfg = adapter_config(dir.path());
    cfg.insert("r".into(), json!(8));
    cfg.insert("lora_alpha".into(), json!(8));
    // File order matters: "layers.0.self_attn.q_proj" must come before "layers\.[01]\..*". A
    // serde_json::Map would sort them, so the object is written as text.
    cfg.remove("rank_pattern");
    cfg.remove("alpha_pattern");
    let mut text = serde_json::to_string_pretty(&cfg).unwrap();
    text.truncate(text.rfind('}').unwrap());
    text.push_str(
        r#", "rank_pattern": {"layers.0.self_attn.q_proj": 32, "layers\\.[01]\\..*": 32,
              "layers\\.[23]\\..*": 16},
           "alpha_pattern": {"q_proj": 2, "layers.1.mlp.up_proj": 128}}"#,
    );
    std::fs::write(dir.path().join(ADAPTER_CONFIG_FILE), text).unwrap();
    let acc = Accelerator::load_peft(dir.path(), &model).unwrap();
    assert_eq!(acc.rank, 8);
    for (l, want) in [(0, 32), (1, 32), (2, 16), (3, 16), (4, 8), (5, 8)] {
        assert_eq!(acc.layer_ranks(l), vec![want; 7], "layer {l}");
    }
    let scale = |l, t| acc.scale(acc.lora(l, t).unwrap());
    assert_eq!(scale(0, Q), 2.0 / 32.0); // alpha_pattern "q_proj"
    assert_eq!(scale(4, Q), 2.0 / 8.0);
    assert_eq!(scale(1, UP), 128.0 / 32.0); // the full name
    assert_eq!(scale(0, UP), 8.0 / 32.0); // lora_alpha
    assert_eq!(scale(2, UP), 8.0 / 16.0);
}

#[test]
fn pattern_disagreements_are_errors() {
    let model = tiny_config();
    let err = |edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let (dir, _) = saved_ranked(&model);
        let mut cfg = adapter_config(dir.path());
        edit(&mut cfg);
        write_adapter_config(dir.path(), &cfg);
        format!(
            "{:#}",
            M2r2Weights::load_dir(dir.path(), &model).unwrap_err()
        )
    };
    // Without the pattern, layer 0 (rank 32) disagrees with r = 16.
    let e = err(&|c| {
        c.insert("rank_pattern".into(), json!({}));
    });
    assert!(
        e.contains("layers.0.") && e.contains("has rank 32") && e.contains("says r = 16"),
        "{e}"
    );
    assert!(e.contains(ADAPTER_WEIGHTS_FILE), "{e}");
    // A pattern that gives layer 4 rank 16 while its tensors have 8.
    let e = err(&|c| {
        c["rank_pattern"]
            .as_object_mut()
            .unwrap()
            .insert("model.layers.4.self_attn.q_proj".into(), json!(16));
    });
    assert!(
        e.contains("layers.4.self_attn.q_proj") && e.contains("its rank_pattern entry = 16"),
        "{e}"
    );
    for (key, value, want) in [
        (
            "rank_pattern",
            json!({"q_proj": 0}),
            "key `q_proj`: expected a positive integer",
        ),
        (
            "rank_pattern",
            json!({"q_proj(": 8}),
            "is not a regular expression",
        ),
        (
            "alpha_pattern",
            json!({"q_proj": "x"}),
            "key `q_proj`: expected a number",
        ),
        ("rank_pattern", json!([8]), "rank_pattern / alpha_pattern"),
    ] {
        let e = err(&|c| {
            c.insert(key.into(), value.clone());
        });
        assert!(
            e.contains(want) && e.contains(ADAPTER_CONFIG_FILE),
            "{key}: {e}"
        );
    }
}

/// Widening the draft interval's pairs keeps every fast-stream term (checked on the reference's
/// own `delta`) and saves as patterns that load back.
#[test]
fn widened_weights_save_and_load() {
    let model = tiny_config();
    let config = M2r2Config::default_for(&model);
    let mut w = M2r2Weights::random(&model, config.clone(), 3).unwrap();
    let before = w.accelerator.clone();
    w.accelerator
        .widen(config.interval_layers(0), 24, 5)
        .unwrap();
    let x = Array2::from_shape_fn((2, 64), |(i, j)| ((i * 64 + j) as f32 * 0.37).sin());
    for l in config.interval_layers(0) {
        for t in [Q, Target::Attn(AttnProj::K)] {
            let (d0, d1) = (
                before.delta(l, t, x.view()),
                w.accelerator.delta(l, t, x.view()),
            );
            approx::assert_abs_diff_eq!(d0.unwrap(), d1.unwrap(), epsilon = 1e-6);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    w.save_dir(dir.path()).unwrap();
    assert_eq!(M2r2Weights::load_dir(dir.path(), &model).unwrap(), w);
}
