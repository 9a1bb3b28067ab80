//! `m2r2 train --rank` per gate on the built-in `tiny` model: fresh adapters with one rank per gate,
//! `--init` with the trained gate widened, the folders written as PEFT rank / alpha patterns that
//! `generate` and `export` use (speculative output equal to greedy), and the refusals.

use super::train::distill_tiny;
use super::{fails, generate_json, ok};
use serde_json::Value;
use std::path::Path;

fn adapter_config(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("adapter_config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn train_with_ranks_per_gate_then_widen_gate_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    distill_tiny(dir.path(), &[("train.jsonl", "t", 4, "data")]);
    let data = p("data");
    let train = |extra: &[&str], out: &str| {
        let mut args = vec![
            "train",
            "--data",
            &data,
            "--steps",
            "4",
            "--batch-rows",
            "8",
        ];
        args.extend_from_slice(extra);
        let out = p(out);
        args.extend(["--out", &out]);
        ok(&args)
    };
    // Fresh: ranks 8 / 4 / 4 on the intervals of layers 0-1, 2-3, 4-5. The default r is the
    // common 4 (alpha 8); layers 0-1 are named with rank 8 and alpha 16 (the same scale 2).
    train(&["--rank", "8,4,4"], "fresh");
    let cfg = adapter_config(&dir.path().join("fresh"));
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 8);
    let ranks = cfg["rank_pattern"].as_object().unwrap();
    assert_eq!(ranks.len(), 2 * 7, "{ranks:?}");
    assert_eq!(ranks["model.layers.1.mlp.down_proj"], 8);
    assert_eq!(cfg["alpha_pattern"]["model.layers.0.self_attn.q_proj"], 16);

    // --init: gate 1 widened to rank 12 and trained; gates 2-3 kept at 4.
    train(
        &["--init", &p("fresh"), "--train-gates", "1", "--rank", "12"],
        "wide",
    );
    let cfg = adapter_config(&dir.path().join("wide"));
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["rank_pattern"]["model.layers.0.self_attn.k_proj"], 12);
    assert_eq!(cfg["alpha_pattern"]["model.layers.0.self_attn.k_proj"], 24);
    assert!(
        cfg["rank_pattern"]
            .get("model.layers.2.self_attn.k_proj")
            .is_none()
    );

    // Both folders drive speculative decoding (equal to greedy) and export.
    let prompt = ["--tokens", "84,104,101", "--max-new-tokens", "12"];
    let greedy = generate_json(&prompt);
    for folder in ["fresh", "wide"] {
        let mut spec = prompt.to_vec();
        let m2r2 = p(folder);
        spec.extend(["--mode", "speculative", "--m2r2", &m2r2]);
        assert_eq!(generate_json(&spec)["tokens"], greedy["tokens"], "{folder}");
    }
    ok(&["export", "--m2r2", &p("wide"), "--out", &p("exp")]);

    // `info` shows each gate's ranks, alphas and scales as written above. tiny: D = 64, 4 heads
    // of 16 with 2 KV heads (q, o: 64 x 64; k, v: 32 x 64), I = 128 (gate, up: 128 x 64; down:
    // 64 x 128), so a rank-r pair on a `[out, in]` map has r (in + out) entries and a layer's seven
    // have r (128 + 96 + 96 + 128 + 192 + 192 + 192) = 1024 r.
    let info = ok(&["info", "--m2r2", &p("wide"), "--json"]).json();
    let gates = info["m2r2"]["gates"].as_array().unwrap();
    let want = [
        (2, [0, 2], 12u64, 24.0),
        (4, [2, 4], 4, 8.0),
        (6, [4, 6], 4, 8.0),
    ];
    for (g, (after, layers, rank, alpha)) in gates.iter().zip(want) {
        assert_eq!(g["after_layer"], after, "{g}");
        assert_eq!(g["layers"], serde_json::json!(layers), "{g}");
        assert_eq!(g["adapted_maps"], 14, "{g}");
        assert_eq!(g["ranks"], serde_json::json!([rank]), "{g}");
        assert_eq!(g["alphas"], serde_json::json!([alpha]), "{g}");
        assert_eq!(g["scales"], serde_json::json!([2.0]), "{g}");
        assert_eq!(g["adapter_parameters"], 2 * 1024 * rank, "{g}");
    }
    assert_eq!(info["m2r2"]["adapter_parameters"], 2 * 1024 * (12 + 4 + 4));
    assert_eq!(info["m2r2"]["source"], p("wide"));
    let text = ok(&["info", "--m2r2", &p("wide")]).stdout;
    assert!(
        text.contains("M2R2 weights") && text.contains("after layer"),
        "{text}"
    );

    // Refusals: lowering a trained gate's rank, changing an untrained gate's, a list of the wrong
    // length.
    let (init, x) = (p("wide"), p("x"));
    let widen_refused = |rank: &str, needles: &[&str]| {
        let args = [
            "train",
            "--data",
            &data,
            "--init",
            &init,
            "--train-gates",
            "1",
            "--rank",
            rank,
            "--out",
            &x,
        ];
        fails(&args, needles);
    };
    widen_refused(
        "8",
        &["--rank 8 for gate 1", "cannot lower the rank of layer 0"],
    );
    widen_refused(
        "12,8,4",
        &["gate 2 is not trained", "give that rank or train the gate"],
    );
    fails(
        &[
            "train",
            "--data",
            &p("data"),
            "--rank",
            "8,4",
            "--out",
            &p("x"),
        ],
        &["--rank has 2 values, but there are 3 gates"],
    );
}
