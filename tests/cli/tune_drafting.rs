//! `m2r2 tune-drafting` on the built-in `tiny` model: traces every gate, prices every policy on
//! both engines, ranks them, writes the best into an M2R2 folder that then decodes like greedy;
//! sampled data and unknown gates are refused.

use super::{fails, generate_json, ok};
use serde_json::Value;

#[test]
fn tune_drafting_ranks_writes_and_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        dir.path().join("prompts.jsonl"),
        "{\"id\": \"a\", \"prompt\": \"Count to 3.\"}\n{\"id\": \"b\", \"prompt\": \"Name a color.\"}\n",
    )
    .unwrap();
    let distill = |out: &str, extra: &[&str]| {
        let mut args = vec!["distill-data", "--model", "tiny", "--prompts"];
        let (prompts, out) = (p("prompts.jsonl"), p(out));
        args.extend([
            prompts.as_str(),
            "--out",
            out.as_str(),
            "--max-new-tokens",
            "24",
        ]);
        args.extend(extra);
        ok(&args);
    };
    distill("data", &[]);
    let (w, onnx) = (p("w"), p("onnx"));
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &w]);
    ok(&["export", "--model", "tiny", "--m2r2", &w, "--out", &onnx]);
    let run = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &w,
        "--data",
        &p("data"),
        "--max-draft",
        "3",
        "--thresholds",
        "0.5,0.9",
        "--onnx",
        &onnx,
        "--repeats",
        "1",
        "--json",
        "--write",
        &w,
    ]);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let traces = report["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 3, "{report}");
    for t in traces {
        // 2 samples of 24 response tokens: 23 drafts each
        assert_eq!(t["points"].as_u64(), Some(46), "{t}");
        let a = t["agreement"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&a), "{t}");
    }
    // reference at 3 gates + ONNX Runtime at the export's gate; verify costs for 1..=4 rows
    let costs = report["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 4, "{report}");
    assert!(
        costs
            .iter()
            .all(|c| c["costs"]["verify"].as_array().unwrap().len() == 4)
    );
    // per gate: fixed 1..=3, and 3 gate kinds x 2 thresholds x 3 lengths
    let policies = report["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 3 * (3 + 3 * 2 * 3), "{report}");
    let onnx_priced: Vec<&Value> = policies
        .iter()
        .filter(|p| p["speedup_onnx"].is_f64())
        .collect();
    assert_eq!(onnx_priced.len(), 21);
    let best = &report["best"];
    assert!(best["speedup_onnx"].is_f64() && best["speedup_reference"].is_f64());
    // the best is the first policy priced on both engines
    assert_eq!(best, onnx_priced[0]);
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("w/m2r2_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["draft_gate"], best["draft_gate"]);
    assert_eq!(config["draft_len"], best["draft_len"]);
    assert_eq!(
        config.get("dynamic_draft").unwrap_or(&Value::Null),
        &best["dynamic_draft"]
    );
    // the written default decodes like greedy
    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        "5,6,7",
        "--max-new-tokens",
        "20",
    ];
    let greedy = generate_json(&prompt);
    let mut spec = prompt.to_vec();
    spec.extend(["--mode", "speculative", "--m2r2", &w]);
    assert_eq!(generate_json(&spec)["tokens"], greedy["tokens"]);

    distill("sampled", &["--temperature", "0.8"]);
    fails(
        &["tune-drafting", "--model", "tiny", "--data", &p("sampled")],
        &["sampled responses", "greedy"],
    );
    fails(
        &[
            "tune-drafting",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--draft-gates",
            "7",
        ],
        &["--draft-gates", "gate 7 does not exist"],
    );
}
