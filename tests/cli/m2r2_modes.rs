//! `generate --mode greedy|early-exit|speculative`, its JSON and `--trace`, and `init-m2r2`, on the
//! built-in models. The invariants: speculative greedy decoding equals greedy (fixed or dynamic
//! drafts, every draft gate), and early exit with a gate that never fires equals greedy.

use super::{fails, generate_json, ids, m2r2, ok};
use serde_json::Value;

const PROMPT: &str = "84,104,101";
const NEW: &str = "12";

fn run(model: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "--model",
        model,
        "--tokens",
        PROMPT,
        "--max-new-tokens",
        NEW,
    ];
    args.extend_from_slice(extra);
    generate_json(&args)
}

fn num_gates(v: &Value) -> usize {
    v["m2r2"]["gates"].as_array().expect("gates").len()
}

/// Every mode against greedy on `model`. `thorough` adds the gate kinds, both KV policies and a
/// draft length of 1 (the MoE model, slower to build, runs the core set only).
fn modes_equal_greedy(model: &str, thorough: bool) {
    let greedy = run(model, &[]);
    let expected = ids(&greedy["tokens"]);
    assert_eq!(expected.len(), 12, "{model}: {expected:?}");
    assert_eq!(greedy["mode"], "greedy");
    assert!(greedy["layers_per_token"].as_f64().unwrap() >= 1.0);
    assert!(greedy["flops_per_token"].as_f64().unwrap() > 0.0);
    assert!(greedy["bytes_per_token"].as_f64().unwrap() > 0.0);
    for key in [
        "gates",
        "draft_gate",
        "draft_len",
        "dynamic_draft",
        "gate",
        "threshold",
    ] {
        assert!(
            !greedy["m2r2"][key].is_null(),
            "{model}: m2r2.{key} missing"
        );
    }
    assert_eq!(greedy["m2r2"]["kv_policy"], "exact");
    assert!(greedy["m2r2"]["source"].is_string());
    let j = num_gates(&greedy);
    assert!(j >= 1);
    for g in 1..=j {
        let g = g.to_string();
        let fixed = run(model, &["--mode", "speculative", "--draft-gate", &g]);
        assert_eq!(
            ids(&fixed["tokens"]),
            expected,
            "{model} fixed, draft gate {g}"
        );
        assert_eq!(fixed["mode"], "speculative");
        assert!(fixed["mean_accepted_tokens"].as_f64().unwrap() >= 1.0);
        assert!(fixed["acceptance_by_position"].is_array());
        let rate = fixed["acceptance_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&rate), "{rate}");
        assert!(fixed["flops_per_token"].as_f64().unwrap() > 0.0);
        assert!(fixed["bytes_per_token"].as_f64().unwrap() > 0.0);
        assert!(fixed["tokens_per_second"].is_number());
        let dynamic = run(
            model,
            &[
                "--mode",
                "speculative",
                "--draft-gate",
                &g,
                "--dynamic-draft",
            ],
        );
        assert_eq!(
            ids(&dynamic["tokens"]),
            expected,
            "{model} dynamic, draft gate {g}"
        );
        assert_eq!(dynamic["m2r2"]["dynamic_draft"], true);
    }
    let gates: &[&str] = if thorough {
        &["arla", "confidence", "entropy"]
    } else {
        &["arla"]
    };
    for gate in gates {
        let never = run(
            model,
            &["--mode", "early-exit", "--gate", gate, "--threshold", "2"],
        );
        assert_eq!(
            ids(&never["tokens"]),
            expected,
            "{model} early exit, {gate}"
        );
        assert_eq!(never["mode"], "early-exit");
        let hist = ids(&never["exit_histogram"]);
        assert_eq!(hist.len(), j + 1);
        assert_eq!(
            hist[j] as usize,
            expected.len(),
            "{model}: nothing exits: {hist:?}"
        );
        assert!(never["layers_per_token"].as_f64().unwrap() > 0.0);
    }
    // A gate that always fires still generates the requested tokens, with either KV policy.
    let policies: &[&str] = if thorough {
        &["exact", "fast-kv"]
    } else {
        &["fast-kv"]
    };
    for policy in policies {
        let always = run(
            model,
            &[
                "--mode",
                "early-exit",
                "--gate",
                "confidence",
                "--threshold",
                "0",
                "--kv-policy",
                policy,
            ],
        );
        let hist = ids(&always["exit_histogram"]);
        assert_eq!(
            hist[0] as usize,
            expected.len() - 1,
            "{model} {policy}: {hist:?}"
        );
        assert_eq!(always["m2r2"]["kv_policy"], *policy);
    }
    // Zero adapters and no ARLA (`--m2r2 none`): the default gate falls back to confidence.
    let none = run(model, &["--m2r2", "none", "--mode", "speculative"]);
    assert_eq!(ids(&none["tokens"]), expected, "{model} --m2r2 none");
    assert_eq!(none["m2r2"]["gate"], "confidence");
    if thorough {
        let short = run(model, &["--mode", "speculative", "--draft-len", "1"]);
        assert_eq!(ids(&short["tokens"]), expected, "{model} draft length 1");
        let ee = run(
            model,
            &["--m2r2", "none", "--mode", "early-exit", "--threshold", "2"],
        );
        assert_eq!(
            ids(&ee["tokens"]),
            expected,
            "{model} --m2r2 none, early exit"
        );
    }
}

#[test]
fn every_mode_equals_greedy_on_tiny() {
    modes_equal_greedy("tiny", true);
}

#[test]
fn every_mode_equals_greedy_on_tiny_moe() {
    modes_equal_greedy("tiny-moe", false);
}

#[test]
fn sampling_applies_to_every_mode() {
    let sampled = ["--temperature", "1.5", "--seed", "7"];
    for mode in ["greedy", "early-exit", "speculative"] {
        let mut args = vec!["--mode", mode];
        args.extend_from_slice(&sampled);
        let a = run("tiny", &args);
        assert_eq!(ids(&a["tokens"]).len(), 12, "{mode}");
        if mode == "speculative" {
            let b = run("tiny", &args);
            assert_eq!(a["tokens"], b["tokens"], "{mode}: same seed, same tokens");
        }
    }
}

#[test]
fn init_m2r2_writes_a_folder_generate_uses() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m2r2");
    let out_s = out.to_str().unwrap();
    let init = ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--gates",
        "1,2,3",
        "--rank",
        "4",
        "--seed",
        "5",
        "--draft-gate",
        "2",
        "--draft-len",
        "3",
        "--arla-latent",
        "8",
        "--threshold",
        "0.7",
        "--out",
        out_s,
    ]);
    assert!(init.stdout.contains("parameters"), "{}", init.stdout);
    // alpha defaults to 2 r, as `train`'s
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("m2r2_config.json")).unwrap())
            .unwrap();
    assert_eq!(written["alpha"], 8.0);
    for file in [
        "m2r2_config.json",
        "adapter_config.json",
        "adapter_model.safetensors",
        "arla.safetensors",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let expected = ids(&run("tiny", &[])["tokens"]);
    let spec = run("tiny", &["--m2r2", out_s, "--mode", "speculative"]);
    assert_eq!(ids(&spec["tokens"]), expected);
    assert_eq!(spec["m2r2"]["gates"], serde_json::json!([1, 2, 3]));
    assert_eq!(spec["m2r2"]["draft_gate"], 2);
    assert_eq!(spec["m2r2"]["draft_len"], 3);
    assert_eq!(spec["m2r2"]["gate"], "arla");
    assert_eq!(spec["m2r2"]["threshold"], 0.7);
    let dynamic = run(
        "tiny",
        &["--m2r2", out_s, "--mode", "speculative", "--dynamic-draft"],
    );
    assert_eq!(ids(&dynamic["tokens"]), expected);

    // Refuses a non-empty folder without --force, and validates against the model.
    fails(
        &["init-m2r2", "--model", "tiny", "--out", out_s],
        &["not empty", "--force"],
    );
    ok(&["init-m2r2", "--model", "tiny", "--out", out_s, "--force"]);
    let other = dir.path().join("other");
    let other_s = other.to_str().unwrap();
    fails(
        &[
            "init-m2r2",
            "--model",
            "tiny",
            "--gates",
            "2,1",
            "--out",
            other_s,
        ],
        &["strictly increasing"],
    );
    fails(
        &[
            "init-m2r2",
            "--model",
            "tiny-moe",
            "--targets",
            "q_proj,up_proj",
            "--out",
            other_s,
        ],
        &["up_proj", "MoE"],
    );
    fails(
        &[
            "init-m2r2",
            "--model",
            "tiny",
            "--targets",
            "nope",
            "--out",
            other_s,
        ],
        &["unknown module `nope`"],
    );

    // A corrupt folder is refused naming the problem.
    std::fs::write(out.join("m2r2_config.json"), "{ not json").unwrap();
    fails(
        &[
            "generate",
            "--tokens",
            PROMPT,
            "--m2r2",
            out_s,
            "--mode",
            "speculative",
        ],
        &["--m2r2", "m2r2_config.json"],
    );
}

/// `--threshold X1,X2,...`: early exit's threshold per gate. Gate 1 closed and the others open:
/// every decoded token exits at gate 2, and the report says which thresholds ran. Outside early
/// exit, or with a count that is not one per gate, it is refused.
#[test]
fn early_exit_takes_a_threshold_per_gate() {
    let j = num_gates(&run("tiny", &[]));
    assert!(j >= 2, "tiny has several gates");
    let mut per_gate = vec!["2"];
    per_gate.extend(std::iter::repeat_n("0", j - 1));
    let per_gate = per_gate.join(",");
    let v = run(
        "tiny",
        &[
            "--mode",
            "early-exit",
            "--gate",
            "confidence",
            "--threshold",
            &per_gate,
        ],
    );
    let hist = ids(&v["exit_histogram"]);
    let decoded = ids(&v["tokens"]).len() - 1;
    assert_eq!((hist[0], hist[1] as usize), (0, decoded), "{hist:?}");
    let mut want = vec![2.0];
    want.extend(std::iter::repeat_n(0.0, j - 1));
    assert_eq!(v["m2r2"]["gate_thresholds"], serde_json::json!(want));
    assert_eq!(
        v["m2r2"]["threshold"],
        Value::Null,
        "replaced by gate_thresholds"
    );
    // one number: shared, as before
    let shared = run("tiny", &["--mode", "early-exit", "--threshold", "2"]);
    assert_eq!(shared["m2r2"]["gate_thresholds"], Value::Null);
    assert_eq!(shared["m2r2"]["threshold"], 2.0);

    let base = [
        "generate",
        "--model",
        "tiny",
        "--tokens",
        PROMPT,
        "--max-new-tokens",
        "4",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let two_too_many = vec!["0.5"; j + 2].join(",");
    for (args, want) in [
        (
            with(&["--mode", "speculative", "--threshold", &per_gate]),
            "one threshold per gate is for --mode early-exit".to_string(),
        ),
        (
            with(&["--mode", "early-exit", "--threshold", &two_too_many]),
            format!(
                "--threshold has {} thresholds ({two_too_many}) for {j} exit gates",
                j + 2
            ),
        ),
        (
            with(&["--mode", "early-exit", "--threshold", "0.5;0.6"]),
            "threshold `0.5;0.6` is not a number".to_string(),
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, &[&want]);
    }
}

#[test]
fn bad_flags_are_refused_clearly() {
    let base = ["generate", "--tokens", PROMPT, "--max-new-tokens", "4"];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        a
    };
    fails(
        &with(&["--mode", "speculative", "--draft-gate", "9"]),
        &["--draft-gate 9", "1..="],
    );
    fails(
        &with(&["--mode", "early-exit", "--gate", "arla", "--m2r2", "none"]),
        &["--gate arla", "ARLA"],
    );
    fails(
        &with(&["--mode", "speculative", "--draft-len", "0"]),
        &["--draft-len"],
    );
    fails(
        &with(&["--mode", "early-exit", "--kv-policy", "nope"]),
        &["nope", "fast-kv"],
    );
    fails(&with(&["--gate", "nope"]), &["nope", "confidence"]);
    fails(&with(&["--mode", "nope"]), &["nope", "early-exit"]);
    fails(
        &with(&["--draft-len", "2", "--dynamic-draft"]),
        &["--dynamic-draft"],
    );
    fails(
        &with(&["--m2r2", "/definitely/not/here"]),
        &["/definitely/not/here"],
    );
}

#[test]
fn trace_explains_each_mode() {
    let base = [
        "generate",
        "--tokens",
        PROMPT,
        "--max-new-tokens",
        "6",
        "--trace",
    ];
    let traced = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        let r = m2r2(&a);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        r.stderr
    };
    let greedy = traced(&[]);
    assert!(
        greedy.contains("trace: greedy") && greedy.contains("logit"),
        "{greedy}"
    );
    let ee = traced(&[
        "--mode",
        "early-exit",
        "--gate",
        "confidence",
        "--threshold",
        "0",
    ]);
    assert!(ee.contains("exit at gate 1"), "{ee}");
    let all = traced(&["--mode", "early-exit", "--threshold", "2"]);
    assert!(all.contains("ran all"), "{all}");
    let spec = traced(&["--mode", "speculative"]);
    assert!(
        spec.contains("round") && spec.contains("accepted"),
        "{spec}"
    );
}
