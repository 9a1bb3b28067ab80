//! The pruned draft head (`draft_head.json`, `reference::m2r2::draft_head`: drafts score `K` tokens
//! instead of the whole vocabulary) on the command line: `--draft-head on|off` in `generate`,
//! `export`, `run` and `bench`; the reports say which head drafted; the output stays the greedy
//! tokens; a corrupt file or a mismatched choice is a clear error.

use super::{fails, ids, ok};
use serde_json::Value;
use std::path::Path;

const PROMPT: &str = "84,104,101";

/// Even token ids of tiny's 320-token vocabulary: K = 160.
fn write_head(dir: &Path) -> usize {
    let tokens: Vec<u32> = (0..320).step_by(2).collect();
    let text = serde_json::json!({ "tokens": tokens }).to_string();
    std::fs::write(dir.join("draft_head.json"), text).unwrap();
    tokens.len()
}

fn generate(m2r2: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "generate",
        "--json",
        "--model",
        "tiny",
        "--tokens",
        PROMPT,
        "--max-new-tokens",
        "16",
        "--m2r2",
        m2r2,
    ];
    args.extend_from_slice(extra);
    ok(&args).json()
}

/// generate / export / run / bench with and without the pruned head, on one weights folder.
#[test]
fn pruned_draft_head_drafts_everywhere_and_stays_lossless() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w");
    let w = weights.to_str().unwrap();
    ok(&["init-m2r2", "--model", "tiny", "--out", w]);
    let k = write_head(&weights);

    // generate: the folder's head by default, the full head with --draft-head off; greedy tokens.
    let greedy = ok(&[
        "generate",
        "--json",
        "--tokens",
        PROMPT,
        "--max-new-tokens",
        "16",
    ])
    .json();
    let greedy = ids(&greedy["tokens"]);
    let pruned = generate(w, &["--mode", "speculative"]);
    assert_eq!(ids(&pruned["tokens"]), greedy);
    assert_eq!(pruned["m2r2"]["draft_head_tokens"], k);
    let traced = generate(w, &["--mode", "speculative", "--dynamic-draft"]);
    assert_eq!(ids(&traced["tokens"]), greedy);
    let full = generate(w, &["--mode", "speculative", "--draft-head", "off"]);
    assert_eq!(ids(&full["tokens"]), greedy);
    assert_eq!(full["m2r2"]["draft_head_tokens"], Value::Null);
    // greedy decoding reads no M2R2 weights, and says so
    let args = ["generate", "--tokens", PROMPT, "--m2r2", w];
    fails(
        &args,
        &["--m2r2 is for --mode early-exit or --mode speculative"],
    );
    fails(
        &[
            "generate",
            "--model",
            "tiny",
            "--tokens",
            PROMPT,
            "--m2r2",
            "none",
            "--mode",
            "speculative",
            "--draft-head",
            "on",
        ],
        &[
            "--draft-head on needs a pruned draft head",
            "draft_head.json",
        ],
    );

    // export: draft.onnx with the pruned head, checked against the reference; run on ORT.
    let pruned_export = dir.path().join("pruned");
    let pe = pruned_export.to_str().unwrap();
    let out = ok(&[
        "export", "--model", "tiny", "--m2r2", w, "--out", pe, "--check",
    ]);
    assert!(
        out.stderr
            .contains(&format!("pruned draft head of {k} tokens")),
        "{}",
        out.stderr
    );
    assert!(pruned_export.join("draft_head.json").is_file());
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(pruned_export.join("m2r2_export.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["draft_head_tokens"], k);
    let run = |export: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            "--onnx",
            export,
            "--tokens",
            PROMPT,
            "--max-new-tokens",
            "16",
            "--mode",
            "speculative",
            "--json",
        ];
        args.extend_from_slice(extra);
        ok(&args).json()
    };
    let on_ort = run(pe, &[]);
    assert_eq!(ids(&on_ort["tokens"]), greedy);
    assert_eq!(on_ort["m2r2"]["draft_head_tokens"], k);
    assert_eq!(
        on_ort["mean_accepted_tokens"],
        pruned["mean_accepted_tokens"]
    );
    fails(
        &[
            "run",
            "--onnx",
            pe,
            "--tokens",
            PROMPT,
            "--mode",
            "speculative",
            "--draft-head",
            "off",
        ],
        &[
            "pruned draft head of 160 tokens",
            "m2r2 export --draft-head off",
        ],
    );
    let full_export = dir.path().join("full");
    let fe = full_export.to_str().unwrap();
    ok(&[
        "export",
        "--model",
        "tiny",
        "--m2r2",
        w,
        "--out",
        fe,
        "--draft-head",
        "off",
    ]);
    assert!(!full_export.join("draft_head.json").exists());
    assert_eq!(run(fe, &[])["m2r2"]["draft_head_tokens"], Value::Null);
    fails(
        &[
            "run",
            "--onnx",
            fe,
            "--tokens",
            PROMPT,
            "--mode",
            "speculative",
            "--draft-head",
            "on",
        ],
        &["has no pruned draft head"],
    );

    // bench: the reference alone (--speculative) and against ORT, with and without the head.
    let sizes = [
        "--prompt-len",
        "4",
        "--decode-tokens",
        "6",
        "--repeats",
        "1",
        "--json",
    ];
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--model", "tiny", "--m2r2", w];
        args.extend_from_slice(extra);
        args.extend_from_slice(&sizes);
        ok(&args).json()
    };
    let spec = bench(&["--speculative"]);
    assert_eq!(spec["draft_head_tokens"], k);
    assert_eq!(spec["engine"]["speculative_equals_greedy"], true);
    assert!(spec["engine"]["ms_per_draft_step"].as_f64().unwrap() > 0.0);
    let spec_full = bench(&["--speculative", "--draft-head", "off"]);
    assert_eq!(spec_full["draft_head_tokens"], Value::Null);
    assert_eq!(spec_full["engine"]["speculative_equals_greedy"], true);
    let against_ort = bench(&["--onnx", pe]);
    assert_eq!(against_ort["draft_head_tokens"], k);
    assert_eq!(against_ort["tokens_equal_reference"], true);
    let engines = against_ort["engines"].as_array().unwrap();
    assert_eq!(
        engines[0]["mean_accepted_length"],
        engines[1]["mean_accepted_length"]
    );
    fails(
        &[
            "bench",
            "--model",
            "tiny",
            "--m2r2",
            w,
            "--onnx",
            fe,
            "--repeats",
            "1",
        ],
        &["different draft heads"],
    );
}

/// A corrupt draft_head.json is an error naming the file, exit 1, in every command that loads it.
#[test]
fn corrupt_draft_head_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().to_str().unwrap();
    ok(&["init-m2r2", "--model", "tiny", "--out", w, "--force"]);
    for (text, want) in [
        ("not json", "not a draft head"),
        ("{\"tokens\": []}", "empty"),
        ("{\"tokens\": [5, 3]}", "not sorted"),
        ("{\"tokens\": [3, 3]}", "repeats"),
        ("{\"tokens\": [1, 320]}", "the vocabulary has 320 tokens"),
    ] {
        std::fs::write(dir.path().join("draft_head.json"), text).unwrap();
        let run = fails(
            &[
                "generate",
                "--model",
                "tiny",
                "--tokens",
                PROMPT,
                "--m2r2",
                w,
                "--mode",
                "speculative",
            ],
            &["draft_head.json", want],
        );
        assert_eq!(run.code, Some(1), "{text}: {}", run.stderr);
    }
}

/// A speculative golden recorded with `--draft-head off` checks on the reference with the same
/// weights folder (the head dropped, and said), as one recorded with the head does.
#[test]
fn goldens_with_and_without_the_head_check_on_one_folder() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w");
    let w = weights.to_str().unwrap();
    ok(&["init-m2r2", "--model", "tiny", "--out", w]);
    write_head(&weights);
    for head in ["on", "off"] {
        let golden = dir.path().join(format!("{head}.golden.safetensors"));
        let g = golden.to_str().unwrap();
        ok(&[
            "golden",
            "write",
            "--tokens",
            PROMPT,
            "--steps",
            "6",
            "--mode",
            "speculative",
            "--m2r2",
            w,
            "--draft-head",
            head,
            "--out",
            g,
        ]);
        let run = ok(&["golden", "check", g, "--m2r2", w]);
        assert!(run.stdout.contains("overall: OK"), "{}", run.stdout);
        let said = run
            .stdout
            .contains("recorded without the pruned draft head");
        assert_eq!(said, head == "off", "{}", run.stdout);
    }
}

/// `m2r2 draft-head`'s draft step MMACs count what an MoE layer runs: per row the router and
/// `k` experts, not one dense MLP. tiny-moe by hand: D = 64, q 64 / kv 32 wide, I = 96, E = 8,
/// k = 2, V = 320, and the seeded weights' draft gate after layer 2. Per layer and row:
/// attention 2 * 64 * 64 + 2 * 64 * 32 = 12288, experts 2 * 3 * 64 * 96 = 36864, router 512;
/// two rows (slow and fast) through two layers, then the head 320 * 64 = 20480:
/// 4 * 49664 + 20480 = 219136 MACs, printed 0.22 (a dense count said 0.14).
#[test]
fn draft_step_macs_count_the_experts() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    ok(&["init-m2r2", "--model", "tiny-moe", "--out", &p("m2r2")]);
    for (name, prompt) in [("data", "Hello there"), ("dev", "Tell me a joke")] {
        let prompts = dir.path().join(format!("{name}.jsonl"));
        let line = serde_json::json!({ "id": name, "prompt": prompt }).to_string();
        std::fs::write(&prompts, line + "\n").unwrap();
        ok(&[
            "distill-data",
            "--model",
            "tiny-moe",
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            &p(name),
            "--max-new-tokens",
            "8",
        ]);
    }
    let run = ok(&[
        "draft-head",
        "--model",
        "tiny-moe",
        "--m2r2",
        &p("m2r2"),
        "--data",
        &p("data"),
        "--dev-data",
        &p("dev"),
        "--sizes",
        "64",
    ]);
    assert!(
        run.stdout.contains("layers 1..2 on a slow and a fast row"),
        "{}",
        run.stdout
    );
    let full = run
        .stdout
        .lines()
        .find(|l| l.starts_with("| full |"))
        .unwrap();
    assert!(full.ends_with("| 0.02 | 0.22 |"), "{full}");
}
