//! `m2r2 analyze` end to end on the built-in models: the JSON schema, the SVG, the M2R2 weight
//! choices and the failure cases.

use super::{fails, ok};
use reference::io::builtin::tiny_config;
use reference::m2r2::weights::M2r2Weights;
use serde_json::Value;

const TOKENS: &str = "3,1,4,1,5,9,2,6";

fn stats_ok(s: &Value) -> bool {
    let (mean, min, max) = (s["mean"].as_f64(), s["min"].as_f64(), s["max"].as_f64());
    matches!((mean, min, max), (Some(mean), Some(min), Some(max))
        if -1.0 <= min && min <= mean + 1e-12 && mean <= max + 1e-12 && max <= 1.0)
}

#[test]
fn analyze_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    // the plot's folder is created, as `logits --out`'s
    let svg = dir.path().join("plots/out.svg");
    let run = ok(&[
        "analyze",
        "--model",
        "tiny",
        "--tokens",
        TOKENS,
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let a = run.json();
    assert_eq!(a["model"], "tiny");
    assert_eq!(a["positions"], 8);
    assert_eq!(a["num_layers"], 8);
    assert_eq!(a["tokens"], serde_json::json!([3, 1, 4, 1, 5, 9, 2, 6]));
    assert_eq!(a["final_tokens"].as_array().unwrap().len(), 8);
    assert_eq!(a["m2r2"]["gates"], serde_json::json!([2, 4, 6]));
    assert_eq!(a["m2r2"]["zero_adapters"], false);

    let layers = a["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 8);
    for (i, row) in layers.iter().enumerate() {
        assert_eq!(row["layer"], i + 1);
        for key in ["cos_prev", "cos_final", "cos_final_normed"] {
            assert!(stats_ok(&row[key]), "layer {} {key}: {row}", i + 1);
        }
        let agreement = row["exit_agreement"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&agreement));
    }
    // At layer N the residual is the final one.
    assert_eq!(layers[7]["cos_final"]["min"], 1.0);
    assert_eq!(layers[7]["exit_agreement"], 1.0);

    let gates = a["gates"].as_array().unwrap();
    assert_eq!(gates.len(), 3);
    for (i, g) in gates.iter().enumerate() {
        assert_eq!(g["gate"], i + 1);
        let layer = g["layer"].as_u64().unwrap() as usize;
        for key in [
            "slow_cos_final",
            "fast_cos_final",
            "slow_cos_final_normed",
            "fast_cos_final_normed",
            "cos_fast_slow",
        ] {
            assert!(stats_ok(&g[key]), "gate {} {key}: {g}", i + 1);
        }
        // The slow columns repeat the layer row at the gate.
        assert_eq!(g["slow_cos_final"], layers[layer - 1]["cos_final"]);
        assert_eq!(
            g["slow_exit_agreement"],
            layers[layer - 1]["exit_agreement"]
        );
        assert!(g["fast_exit_agreement"].as_f64().is_some());
    }
    let saturation = &a["saturation_layer"];
    assert_eq!(saturation["per_position"].as_array().unwrap().len(), 8);
    assert!((1.0..=8.0).contains(&saturation["mean"].as_f64().unwrap()));

    if cfg!(feature = "linalg") {
        assert!(a["pca_unavailable"].is_null());
        for view in ["last_position", "mean_over_positions"] {
            let v = &a["pca"][view];
            assert_eq!(v["slow"].as_array().unwrap().len(), 9, "{view}");
            let fast = v["fast"].as_array().unwrap();
            assert_eq!(fast.len(), 3);
            assert_eq!(fast[0]["gate"], 1);
            assert_eq!(fast[0]["xy"].as_array().unwrap().len(), 2);
            let r: Vec<f64> = v["explained_variance_ratio"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert!(
                r[0] >= r[1] && r[1] >= 0.0 && r[0] + r[1] <= 1.0 + 1e-9,
                "{r:?}"
            );
        }
    } else {
        assert!(a["pca"].is_null());
        let reason = a["pca_unavailable"].as_str().unwrap();
        assert!(reason.contains("--features linalg"), "{reason}");
        assert!(run.stderr.contains("--features linalg"), "{}", run.stderr);
    }

    assert_eq!(a["plot"], svg.to_str().unwrap());
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.trim_start().starts_with("<svg"), "{}", &text[..80]);
    assert!(text.trim_end().ends_with("</svg>"));
    assert!(text.contains("residual dynamics over depth"));
}

#[test]
fn analyze_prints_tables() {
    let run = ok(&["analyze", "--model", "tiny-moe", "--prompt", "Hello"]);
    for needle in [
        "slow stream, per layer",
        "exit agr.",
        "fast stream at the gates",
        "first layer from which the exit token stays the final one",
        "PCA",
    ] {
        assert!(run.stdout.contains(needle), "{needle}:\n{}", run.stdout);
    }
    // Layers 1..=8, then the gate rows.
    assert!(run.stdout.contains("\n    8  "), "{}", run.stdout);
}

#[test]
fn analyze_m2r2_weight_choices() {
    let json = |extra: &[&str]| {
        let mut args = vec!["analyze", "--tokens", TOKENS, "--json"];
        args.extend_from_slice(extra);
        ok(&args).json()
    };
    // `none`: zero adapters, so the fast stream sits exactly on the slow one.
    let zeros = json(&["--m2r2", "none"]);
    assert_eq!(zeros["m2r2"]["zero_adapters"], true);
    for g in zeros["gates"].as_array().unwrap() {
        assert_eq!(g["fast_cos_final"], g["slow_cos_final"]);
        assert_eq!(g["fast_exit_agreement"], g["slow_exit_agreement"]);
        assert_eq!(g["cos_fast_slow"]["min"], 1.0);
    }
    // A folder holding the built-in weights gives the built-in numbers.
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config();
    M2r2Weights::builtin_for("tiny", &config)
        .unwrap()
        .save_dir(dir.path())
        .unwrap();
    let builtin = json(&[]);
    let loaded = json(&["--m2r2", dir.path().to_str().unwrap()]);
    assert_eq!(loaded["gates"], builtin["gates"]);
    assert_eq!(loaded["layers"], builtin["layers"]);
    assert_eq!(loaded["m2r2"]["weights"], dir.path().to_str().unwrap());
}

#[test]
fn analyze_failures_are_clear() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("no-such-dir");
    fails(
        &[
            "analyze",
            "--tokens",
            TOKENS,
            "--m2r2",
            missing.to_str().unwrap(),
        ],
        &["cannot load the M2R2 weights folder", "no-such-dir"],
    );
    // A folder without the M2R2 files.
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails(
        &[
            "analyze",
            "--tokens",
            TOKENS,
            "--m2r2",
            empty.to_str().unwrap(),
        ],
        &["cannot load the M2R2 weights folder", "m2r2_config.json"],
    );
    // The tiny model's adapters (on MLP maps) do not fit tiny-moe.
    let weights = root.path().join("tiny-weights");
    M2r2Weights::builtin_for("tiny", &tiny_config())
        .unwrap()
        .save_dir(&weights)
        .unwrap();
    fails(
        &[
            "analyze",
            "--model",
            "tiny-moe",
            "--tokens",
            TOKENS,
            "--m2r2",
            weights.to_str().unwrap(),
        ],
        &["cannot load the M2R2 weights folder"],
    );
    fails(&["analyze", "--tokens", "1,99999"], &["token id 99999"]);
    // a plot below a file: refused before the work, naming the folder it cannot create
    let file = root.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let bad_plot = file.join("out.svg");
    let run = fails(
        &[
            "analyze",
            "--tokens",
            TOKENS,
            "--plot",
            bad_plot.to_str().unwrap(),
        ],
        &["cannot create", "a-file is a file, not a folder"],
    );
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    // plots are SVG: another name, or a folder, is refused before the work
    for plot in ["out.png", "plots.svg"] {
        std::fs::create_dir_all(root.path().join("plots.svg")).unwrap();
        let path = root.path().join(plot);
        let run = fails(
            &[
                "analyze",
                "--tokens",
                TOKENS,
                "--plot",
                path.to_str().unwrap(),
            ],
            &["give a file name ending in .svg"],
        );
        assert!(!run.stderr.contains("analysed"), "{}", run.stderr);
    }
    // a prompt past the context: no advice about new tokens, which analyze decodes none of
    let long = vec!["1"; 513].join(",");
    fails(
        &["analyze", "--tokens", &long],
        &["the prompt has 513 tokens but the context holds 512: shorten the prompt"],
    );
}
