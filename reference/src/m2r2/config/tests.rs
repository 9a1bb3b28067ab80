//! Tests of the M2R2 config (`m2r2/config.rs`).

use super::*;
use crate::base::weight_names::{AttnProj, MlpProj};
use crate::io::builtin::{tiny_config, tiny_moe_config};

/// Save `c` into `dir` and read the file back as text.
fn saved(c: &M2r2Config, dir: &Path) -> String {
    c.save(dir).unwrap();
    std::fs::read_to_string(dir.join(M2R2_CONFIG_FILE)).unwrap()
}

fn with_layers(n: usize) -> ModelConfig {
    ModelConfig {
        num_hidden_layers: n,
        ..tiny_config()
    }
}

#[test]
fn default_gates_hand_values() {
    assert_eq!(default_gates(30, 3), vec![7, 15, 22]); // SmolLM2-135M
    assert_eq!(default_gates(8, 3), vec![2, 4, 6]); // tiny
    assert_eq!(default_gates(3, 3), vec![1, 2]); // floor(3/4) = 0 dropped
    assert_eq!(default_gates(2, 3), vec![1]);
    assert_eq!(default_gates(1, 3), Vec::<usize>::new());
    let tiny = M2r2Config::default_for(&tiny_config());
    assert_eq!(tiny.gates, vec![2, 4, 6]);
    tiny.validate(&tiny_config(), "t").unwrap();
    assert_eq!(tiny.targets.len(), 7);
    let moe = M2r2Config::default_for(&tiny_moe_config());
    assert_eq!(moe.targets.len(), 4);
    moe.validate(&tiny_moe_config(), "t").unwrap();
}

#[test]
fn intervals_and_gates() {
    let c = M2r2Config::default_for(&with_layers(30));
    assert_eq!(c.num_gates(), 3);
    assert_eq!(c.interval_layers(0), 0..7);
    assert_eq!(c.interval_layers(1), 7..15);
    assert_eq!(c.interval_layers(3), 22..30);
    assert_eq!(c.gate_layer(1), 7);
    assert_eq!(c.gate_layer(3), 22);
    assert_eq!(c.interval_of_layer(0), 0);
    assert_eq!(c.interval_of_layer(6), 0);
    assert_eq!(c.interval_of_layer(7), 1);
    assert_eq!(c.interval_of_layer(29), 3);
    for j in 0..c.num_intervals() {
        for l in c.interval_layers(j) {
            assert_eq!(c.interval_of_layer(l), j);
        }
    }
}

#[test]
fn aligned_depth_hand_values() {
    let c = M2r2Config::default_for(&with_layers(30));
    // Interval 0: e = 0, k = 7, N - e = 30: 30/7 = 4.29 -> 4, 60/7 = 8.57 -> 9.
    assert_eq!(c.aligned_depth(0, 0), 0);
    assert_eq!(c.aligned_depth(0, 1), 4);
    assert_eq!(c.aligned_depth(0, 2), 9);
    assert_eq!(c.aligned_depth(0, 7), 30);
    // Interval 1: e = 7, k = 8, N - e = 23: 23/8 = 2.875 -> 3; 92/8 = 11.5 -> 12 (half up).
    assert_eq!(c.aligned_depth(1, 1), 10);
    assert_eq!(c.aligned_depth(1, 4), 19);
    assert_eq!(c.aligned_depth(1, 8), 30);
    // Interval 3 (after the last gate): rate 1, d = e + i.
    assert_eq!(c.aligned_depth(3, 5), 27);
    // tiny: gates [2, 4, 6]; interval 0 runs at rate 4, interval 1 at rate 3.
    let t = M2r2Config::default_for(&tiny_config());
    assert_eq!(t.aligned_depth(0, 1), 4);
    assert_eq!(t.aligned_depth(1, 1), 5);
    assert_eq!(t.aligned_depth(2, 1), 6);
}

#[test]
fn parse_gates_cases() {
    assert_eq!(parse_gates("7,15,22").unwrap(), vec![7, 15, 22]);
    assert_eq!(parse_gates(" 3 , 5 ").unwrap(), vec![3, 5]);
    for (text, want) in [
        ("", "expected a comma-separated list"),
        ("7,,9", "empty entry"),
        ("7,x", "`x` is not a layer count"),
        ("-1", "`-1` is not a layer count"),
    ] {
        let err = parse_gates(text).unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    }
}

#[test]
fn validation_rejects_with_clear_messages() {
    let model = tiny_config();
    let ok = M2r2Config::default_for(&model);
    type Edit = Box<dyn Fn(&mut M2r2Config)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|c| c.gates = vec![]), "`gates` is empty"),
        (Box::new(|c| c.gates = vec![0, 4]), "out of range"),
        (
            Box::new(|c| c.gates = vec![2, 8]),
            "gate after layer 8 is out of range",
        ),
        (Box::new(|c| c.gates = vec![4, 2]), "strictly increasing"),
        (Box::new(|c| c.gates = vec![2, 2]), "strictly increasing"),
        (Box::new(|c| c.draft_gate = 0), "`draft_gate` = 0"),
        (Box::new(|c| c.draft_gate = 4), "numbered 1..=3"),
        (Box::new(|c| c.draft_len = 0), "`draft_len`"),
        (
            Box::new(|c| c.draft_len = 513),
            "`draft_len` = 513 is longer than the model's context of 512",
        ),
        (Box::new(|c| c.rank = 0), "`rank` must be positive"),
        (Box::new(|c| c.alpha = f32::NAN), "`alpha`"),
        (Box::new(|c| c.targets.clear()), "`targets` is empty"),
        (
            Box::new(|c| c.targets.push(Target::Attn(AttnProj::Q))),
            "`q_proj` is listed twice",
        ),
        (
            Box::new(|c| c.num_layers = 30),
            "made for a model with 30 layers",
        ),
        (Box::new(|c| c.arla.latent = 0), "`arla.latent`"),
        (
            Box::new(|c| c.arla.latent = 1 << 17),
            "`arla.latent` must be in 1..=65536",
        ),
    ];
    for (edit, want) in cases {
        let mut c = ok.clone();
        edit(&mut c);
        let err = c
            .validate(&model, "dir/m2r2_config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
        assert!(err.starts_with("dir/m2r2_config.json: "), "{err}");
    }
    // MLP targets on a MoE model.
    let moe = tiny_moe_config();
    let mut c = M2r2Config::default_for(&moe);
    c.targets.push(Target::Mlp(MlpProj::Up));
    let err = c.validate(&moe, "m").unwrap_err().to_string();
    assert!(
        err.contains("`up_proj` is an MLP projection") && err.contains("MoE"),
        "{err}"
    );
}

#[test]
fn json_round_trip_and_strictness() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_config();
    let mut c = M2r2Config::default_for(&model);
    c.seed = Some(7);
    let text = saved(&c, dir.path());
    assert!(
        text.contains("\"q_proj\"") && text.contains("\"down_proj\""),
        "{text}"
    );
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);

    // each edited text is refused naming the file and what is wrong
    let refused = |cases: &[(String, &str)]| {
        for (bad, want) in cases {
            std::fs::write(dir.path().join(M2R2_CONFIG_FILE), bad).unwrap();
            let err = M2r2Config::load(dir.path(), &model)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(err.contains(M2R2_CONFIG_FILE), "{err}");
        }
    };
    let cases = [
        (
            text.replace("\"draft_len\"", "\"draft_length\""),
            "unknown field `draft_length`",
        ),
        (
            text.replace("\"q_proj\"", "\"qkv_proj\""),
            "unknown target module `qkv_proj`",
        ),
        (
            text.replace("\"latent\"", "\"latnet\""),
            "unknown field `latnet`",
        ),
        (
            text.replace("\"draft_len\": 4", "\"draft_len\": 18446744073709551615"),
            "`draft_len` = 18446744073709551615 is longer than the model's context",
        ),
    ];
    refused(&cases);

    // dynamic_draft: absent by default (not written), round-trips, checked strictly
    assert!(!text.contains("dynamic_draft"), "{text}");
    c.dynamic_draft = Some(DynamicDraftConfig {
        gate: GateKind::Confidence,
        threshold: 0.5,
    });
    let text = saved(&c, dir.path());
    assert!(text.contains("\"gate\": \"confidence\""), "{text}");
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
    let cases = [
        (
            text.replace("\"confidence\"", "\"certainty\""),
            "unknown gate `certainty`",
        ),
        (
            text.replace("\"threshold\": 0.5", "\"treshold\": 0.5"),
            "unknown field `treshold`",
        ),
        (
            text.replace("\"threshold\": 0.5", "\"threshold\": 1e999"),
            "",
        ),
    ];
    refused(&cases);
    c.dynamic_draft = Some(DynamicDraftConfig {
        gate: GateKind::Entropy,
        threshold: f32::NAN,
    });
    let err = c.validate(&model, "m").unwrap_err().to_string();
    assert!(err.contains("`dynamic_draft.threshold`"), "{err}");
}

/// `early_exit`: absent by default (and from older files), round-trips, and its thresholds are
/// one finite number per gate, else an error naming the field and the file.
#[test]
fn early_exit_round_trips_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_config();
    let mut c = M2r2Config::default_for(&model);
    assert!(c.early_exit.is_none());
    let old = saved(&c, dir.path());
    assert!(!old.contains("early_exit"), "{old}");
    let j = c.num_gates();
    c.early_exit = Some(EarlyExitConfig {
        gate: GateKind::Entropy,
        thresholds: vec![0.75; j],
    });
    let text = saved(&c, dir.path());
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json["early_exit"],
        serde_json::json!({"gate": "entropy", "thresholds": vec![0.75; j]})
    );
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
    for (thresholds, want) in [
        (vec![0.75; j + 1], format!("has {} thresholds", j + 1)),
        (vec![], format!("has 0 thresholds () for {j} exit gates")),
        (
            vec![f32::NAN; j],
            "must be finite numbers, got NaN".to_string(),
        ),
    ] {
        let mut bad = c.clone();
        bad.early_exit.as_mut().unwrap().thresholds = thresholds;
        let err = bad.validate(&model, "cfg.json").unwrap_err().to_string();
        assert!(
            err.contains("cfg.json")
                && err.contains("`early_exit.thresholds`")
                && err.contains(&want),
            "{err}"
        );
    }
    std::fs::write(
        dir.path().join(M2R2_CONFIG_FILE),
        text.replace("\"thresholds\"", "\"threshold\""),
    )
    .unwrap();
    let err = M2r2Config::load(dir.path(), &model)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `threshold`"), "{err}");
}

/// `prompt_lookup`: absent by default (and from older files), round-trips, and is refused
/// outside 1..=63 naming the field and the file.
#[test]
fn prompt_lookup_round_trips_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_config();
    let mut c = M2r2Config::default_for(&model);
    assert!(c.prompt_lookup.is_none());
    let old = saved(&c, dir.path());
    assert!(!old.contains("prompt_lookup"), "{old}");
    c.prompt_lookup = Some(4);
    let text = saved(&c, dir.path());
    assert!(text.contains("\"prompt_lookup\": 4"), "{text}");
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
    for n in [0, MAX_TREE_NODES] {
        let mut bad = c.clone();
        bad.prompt_lookup = Some(n);
        let err = bad.validate(&model, "cfg.json").unwrap_err().to_string();
        assert!(
            err.contains("cfg.json") && err.contains(&format!("`prompt_lookup` = {n}")),
            "{err}"
        );
    }
}

/// `onnx_drafting`: absent by default (and from older files); `for_onnx` swaps in its fields
/// and nothing else; it round-trips, and its fields are checked as the top level's are, the
/// message naming the section.
#[test]
fn onnx_drafting_replaces_the_drafting_defaults_for_onnx_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_config();
    let mut c = M2r2Config::default_for(&model);
    assert!(c.onnx_drafting.is_none());
    assert!(!saved(&c, dir.path()).contains("onnx_drafting"));
    assert!(matches!(c.for_onnx(), Cow::Borrowed(b) if *b == c));
    c.prompt_lookup = Some(4);
    let onnx = EngineDrafting {
        draft_gate: 2,
        draft_len: 2,
        dynamic_draft: Some(DynamicDraftConfig {
            gate: GateKind::Entropy,
            threshold: 0.5,
        }),
        draft_tree: Some(DraftTreeConfig {
            draft_gate: 2,
            widths: vec![2, 1],
            dynamic: None,
        }),
        prompt_lookup: None,
    };
    c.onnx_drafting = Some(onnx.clone());
    let text = saved(&c, dir.path());
    assert!(text.contains("\"onnx_drafting\""), "{text}");
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);

    let for_onnx = c.for_onnx().into_owned();
    assert_eq!(for_onnx.drafting(), onnx);
    assert!(for_onnx.onnx_drafting.is_none());
    // everything but the drafting is the config's own
    assert_eq!(
        for_onnx.with_drafting(&c.drafting()),
        M2r2Config {
            onnx_drafting: None,
            ..c.clone()
        }
    );
    // the reference's defaults are the top level's
    assert_eq!(c.drafting().draft_gate, 1);
    assert_eq!(c.drafting().prompt_lookup, Some(4));

    type Spoil = fn(&mut EngineDrafting);
    let cases: [(Spoil, &str); 4] = [
        (|d| d.draft_len = 0, "`draft_len` must be at least 1"),
        (|d| d.draft_gate = 9, "`draft_gate` = 9 is out of range"),
        (|d| d.prompt_lookup = Some(0), "`prompt_lookup` = 0"),
        (
            |d| d.draft_tree.as_mut().unwrap().widths = vec![],
            "`draft_tree.widths`",
        ),
    ];
    for (spoil, said) in cases {
        let mut bad = c.clone();
        spoil(bad.onnx_drafting.as_mut().unwrap());
        let err = bad.validate(&model, "cfg.json").unwrap_err().to_string();
        assert!(
            err.contains("cfg.json") && err.contains("`onnx_drafting`: ") && err.contains(said),
            "{err}"
        );
    }
    // an unknown field inside the section is refused by name
    let text = text.replace("\"draft_len\": 2", "\"draft_len\": 2, \"depth\": 3");
    std::fs::write(dir.path().join(M2R2_CONFIG_FILE), text).unwrap();
    let err = M2r2Config::load(dir.path(), &model)
        .unwrap_err()
        .to_string();
    assert!(err.contains("depth"), "{err}");
}

#[test]
fn draft_tree_round_trips_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_config();
    let mut c = M2r2Config::default_for(&model);
    // absent by default, and a file without it (written before trees) loads
    assert!(c.draft_tree.is_none());
    let old = saved(&c, dir.path());
    assert!(!old.contains("draft_tree"), "{old}");
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
    c.draft_tree = Some(DraftTreeConfig {
        draft_gate: 2,
        widths: vec![2, 1, 1],
        dynamic: None,
    });
    let text = saved(&c, dir.path());
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json["draft_tree"],
        serde_json::json!({"draft_gate": 2, "widths": [2, 1, 1]})
    );
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
    // grown per branch
    let mut grown = c.clone();
    grown.draft_tree.as_mut().unwrap().dynamic = Some(DynamicDraftConfig {
        gate: GateKind::Confidence,
        threshold: 0.25,
    });
    grown.save(dir.path()).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(M2R2_CONFIG_FILE)).unwrap())
            .unwrap();
    assert_eq!(
        json["draft_tree"]["dynamic"],
        serde_json::json!({"gate": "confidence", "threshold": 0.25})
    );
    assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), grown);
    let mut bad = grown.clone();
    bad.draft_tree
        .as_mut()
        .unwrap()
        .dynamic
        .as_mut()
        .unwrap()
        .threshold = f32::NAN;
    let err = bad.validate(&model, "m").unwrap_err().to_string();
    assert!(
        err.contains("`draft_tree.dynamic.threshold` must be a finite number"),
        "{err}"
    );
    c.save(dir.path()).unwrap();
    // unknown fields inside it are refused like everywhere else
    std::fs::write(
        dir.path().join(M2R2_CONFIG_FILE),
        text.replace("\"widths\"", "\"width\""),
    )
    .unwrap();
    let err = M2r2Config::load(dir.path(), &model)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `width`"), "{err}");
    // gate, widths and size checked against the model (tiny: 3 gates, 512 positions)
    for (draft_gate, widths, want) in [
        (4, vec![2, 1], "`draft_tree.draft_gate` = 4 is out of range"),
        (0, vec![2, 1], "`draft_tree.draft_gate` = 0"),
        (1, vec![], "`draft_tree.widths` is empty"),
        (
            1,
            vec![2, 0],
            "`draft_tree.widths`: token tree 2,0: the width at depth 2 is 0",
        ),
        (1, vec![9, 9], "at most 64"),
    ] {
        let mut bad = c.clone();
        bad.draft_tree = Some(DraftTreeConfig {
            draft_gate,
            widths,
            dynamic: None,
        });
        let err = bad.validate(&model, "m").unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    }
    let short = ModelConfig {
        max_position_embeddings: 6,
        ..tiny_config()
    };
    let mut bad = M2r2Config::default_for(&short);
    bad.draft_len = 2;
    bad.draft_tree = Some(DraftTreeConfig {
        draft_gate: 1,
        widths: vec![3, 1],
        dynamic: None,
    });
    let err = bad.validate(&short, "m").unwrap_err().to_string();
    assert!(
        err.contains("`draft_tree` has 7 nodes, more than the model's context of 6"),
        "{err}"
    );
}

#[test]
fn targets_order_and_names() {
    for (i, t) in Target::ALL.into_iter().enumerate() {
        assert_eq!(Target::from_module(t.module()), Some(t));
        assert_eq!(t.index(), i);
    }
    assert_eq!(Target::from_module("w1"), None);
    assert!(Target::Attn(AttnProj::O) < Target::Mlp(MlpProj::Gate));
    let model = tiny_config();
    assert_eq!(Target::Attn(AttnProj::K).shape(&model), (32, 64));
    assert_eq!(Target::Mlp(MlpProj::Down).shape(&model), (64, 128));
}

#[test]
fn gates_are_one_based_up_to_the_number_of_gates() {
    let config = M2r2Config::default_for(&tiny_config());
    let j = config.num_gates();
    for g in 1..=j {
        assert!(config.has_gate(g));
        config.check_gate(g, "--draft-gate").unwrap();
    }
    for g in [0, j + 1] {
        assert!(!config.has_gate(g));
        let err = config
            .check_gate(g, "--draft-gate")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "--draft-gate {g} does not exist: the gates are 1..={j} (after layers {:?})",
                config.gates
            )
        );
    }
    let err = config
        .check_gate(0, "--draft-gates: gate")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("--draft-gates: gate 0 does not exist"),
        "{err}"
    );
}
