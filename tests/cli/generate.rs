//! `generate`: the JSON fields, determinism, prompt encoding, streamed text, seeded sampling.

use super::{fails, generate_json, ids, ok};

#[test]
fn generate_json_has_the_required_fields() {
    let g = generate_json(&["--tokens", "1,2,3", "--max-new-tokens", "5"]);
    assert_eq!(ids(&g["prompt_tokens"]), vec![1, 2, 3]);
    let tokens = ids(&g["tokens"]);
    assert!(!tokens.is_empty() && tokens.len() <= 5, "{tokens:?}");
    assert!(g["text"].is_string());
    assert!(g["timings"]["prefill_seconds"].as_f64().unwrap() >= 0.0);
    assert!(g["timings"]["decode_seconds"].as_f64().unwrap() >= 0.0);
    assert!(g["tokens_per_second"].is_number());
    assert_eq!(g["model"], "tiny");
    assert_eq!(g["mode"], "greedy");
}

#[test]
fn greedy_is_deterministic_and_prompts_encode() {
    let a = generate_json(&["--prompt", "Hello", "--max-new-tokens", "8"]);
    let b = generate_json(&["--prompt", "Hello", "--max-new-tokens", "8"]);
    assert_eq!(a["tokens"], b["tokens"]);
    // The built-in tokenizer is byte level: "Hello" is its bytes.
    assert_eq!(
        ids(&a["prompt_tokens"]),
        b"Hello".iter().map(|&b| b as u64).collect::<Vec<_>>()
    );
    let chat = generate_json(&["--prompt", "Hello", "--chat", "--max-new-tokens", "2"]);
    assert!(
        ids(&chat["prompt_tokens"]).len() > 5,
        "the chat template adds tokens: {chat}"
    );
    let moe = generate_json(&[
        "--model",
        "tiny-moe",
        "--tokens",
        "5,6",
        "--max-new-tokens",
        "3",
    ]);
    assert_eq!(moe["model"], "tiny-moe");
    let none = generate_json(&["--tokens", "1", "--max-new-tokens", "0"]);
    assert_eq!(ids(&none["tokens"]), Vec::<u64>::new());
}

#[test]
fn plain_generate_streams_text_to_stdout() {
    let run = ok(&["generate", "--prompt", "Hi", "--max-new-tokens", "4"]);
    assert!(run.stdout.ends_with('\n'));
    assert!(run.stderr.contains("tokens/s"), "{}", run.stderr);
    // with no token past the prefill's there is no decode rate to print (not "0.0 tokens/s")
    for (n, mode) in [("0", "greedy"), ("1", "greedy"), ("1", "speculative")] {
        let run = ok(&[
            "generate",
            "--tokens",
            "1,2",
            "--max-new-tokens",
            n,
            "--mode",
            mode,
        ]);
        assert!(
            run.stderr.contains(&format!("{n} generated")) && run.stderr.contains("no decode step"),
            "{}",
            run.stderr
        );
        assert!(!run.stderr.contains("layers per token"), "{}", run.stderr);
    }
}

#[test]
fn sampling_follows_the_seed() {
    let sample = |seed: &str| {
        generate_json(&[
            "--tokens",
            "84,104,101",
            "--max-new-tokens",
            "12",
            "--temperature",
            "5",
            "--top-k",
            "100",
            "--top-p",
            "0.99",
            "--seed",
            seed,
        ])
    };
    let a = sample("1");
    assert_eq!(a["mode"], "greedy");
    assert_eq!(a["sampling"], "sample");
    assert_eq!(a["seed"], 1);
    assert_eq!(a["tokens"], sample("1")["tokens"]);
    let others = ["2", "3", "4"].map(|s| sample(s)["tokens"].clone());
    assert!(
        others.iter().any(|o| *o != a["tokens"]),
        "every seed gave {}",
        a["tokens"]
    );
    // the summary line says the tokens were sampled
    let run = super::ok(&[
        "generate",
        "--tokens",
        "84",
        "--max-new-tokens",
        "2",
        "--temperature",
        "5",
    ]);
    assert!(
        run.stderr
            .contains("[greedy mode, sampled at temperature 5: 1 prompt tokens, 2 generated"),
        "{}",
        run.stderr
    );
}

/// The context's edge is exact in every mode: a decode writes the prompt and every emitted token
/// but the newest, and a speculative round one draft (chain) or one tree's nodes below the root
/// past its start. tiny holds 512 positions; with 3 prompt tokens greedy and early exit fill it
/// with 510 new tokens, a chain of 3 drafts with 507, the tree `2,1` (5 nodes) with 506. One more
/// token is refused before decoding, naming what it needs (the drafts, when they do).
#[test]
fn the_context_edge_is_exact_in_every_mode() {
    let chain = "draft up to 3 position(s) past the last token";
    let tree = "draft up to 4 position(s) past the last token";
    let cases: [(&[&str], usize, &str); 4] = [
        (&["--mode", "greedy"], 510, "--max-new-tokens"),
        (&["--mode", "early-exit"], 510, "--max-new-tokens"),
        (&["--mode", "speculative", "--draft-len", "3"], 507, chain),
        (&["--mode", "speculative", "--draft-tree", "2,1"], 506, tree),
    ];
    for (mode, fits, why) in cases {
        let (at_edge, past_it) = (fits.to_string(), (fits + 1).to_string());
        let g = generate_json(
            &[
                &["--tokens", "1,2,3"],
                mode,
                &["--max-new-tokens", &at_edge],
            ]
            .concat(),
        );
        assert_eq!(ids(&g["tokens"]).len(), fits, "{mode:?}: no stop token");
        fails(
            &[
                &["generate", "--tokens", "1,2,3"],
                mode,
                &["--max-new-tokens", &past_it],
            ]
            .concat(),
            &["needs 513 positions but the context holds 512", why],
        );
    }
}

/// A one-layer checkpoint has no room for an exit gate: greedy decoding runs, the M2R2 modes are
/// refused saying why (they asked for a draft gate that does not exist).
#[test]
fn a_model_without_a_gate_decodes_greedily() {
    use reference::io::checkpoint::write_f32_safetensors;
    let src = m2r2_tests::fixture_dir().join("hf").join("llama_gqa_tied");
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = 1.into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut kept = m2r2_tests::checkpoint_tensors(&src);
    kept.retain(|(n, _, _)| !n.starts_with("model.layers.1."));
    write_f32_safetensors(&dir.path().join("model.safetensors"), &kept, None).unwrap();
    let model = dir.path().to_str().unwrap();
    let run = |mode: &'static str| {
        let args = [
            "generate",
            "--model",
            model,
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "4",
        ];
        [&args[..], &["--mode", mode]].concat()
    };
    ok(&run("greedy"));
    for mode in ["early-exit", "speculative"] {
        fails(
            &run(mode),
            &[mode, "need an exit gate", "--mode greedy runs"],
        );
    }
    // its graphs carry M2R2 settings, which need a gate: said plainly, not as a range `1..=0`
    let out = dir.path().join("onnx");
    fails(
        &["export", "--model", model, "--out", out.to_str().unwrap()],
        &["the model has 1 layer", "at least 2 layers"],
    );
}

/// A mean over nothing is null in `--json`, not 0: per decoded token when the budget decodes none
/// (the one token comes from the prompt's prefill), per round when no round ran.
#[test]
fn means_over_nothing_are_null() {
    for mode in ["greedy", "early-exit", "speculative"] {
        let args = [
            "generate",
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "1",
            "--json",
        ];
        let v = ok(&[&args[..], &["--mode", mode]].concat()).json();
        assert_eq!(v["tokens"].as_array().unwrap().len(), 1, "{v}");
        for field in [
            "layers_per_token",
            "flops_per_token",
            "bytes_per_token",
            "tokens_per_second",
        ] {
            assert_eq!(v[field], serde_json::Value::Null, "{mode} {field}: {v}");
        }
        if mode == "speculative" {
            assert_eq!(v["rounds"], 0, "{v}");
            assert_eq!(v["mean_accepted_tokens"], serde_json::Value::Null, "{v}");
        }
    }
    let v = ok(&[
        "generate",
        "--tokens",
        "1,2,3",
        "--max-new-tokens",
        "3",
        "--json",
    ])
    .json();
    assert!(v["layers_per_token"].as_f64().is_some(), "{v}");
}

/// Tokens per verification count the tokens the rounds emitted: a last round cut short by
/// `--max-new-tokens` counts what it let out, not the drafts it accepted past the budget (a
/// budget of 2 is one round emitting one token, however many drafts it accepted).
#[test]
fn tokens_per_verification_count_emitted_tokens() {
    for tree in [&[][..], &["--draft-tree", "2,1,1"]] {
        for budget in ["2", "5", "16"] {
            let args = [
                "generate",
                "--tokens",
                "5,17,200,33",
                "--mode",
                "speculative",
                "--max-new-tokens",
                budget,
                "--json",
            ];
            let v = ok(&[&args[..], tree].concat()).json();
            let tokens = v["tokens"].as_array().unwrap().len() as f64;
            let rounds = v["rounds"].as_u64().unwrap() as f64;
            let mean = v["mean_accepted_tokens"].as_f64().unwrap();
            assert!(
                (mean * rounds - (tokens - 1.0)).abs() < 1e-9,
                "{tree:?} budget {budget}: {v}"
            );
        }
    }
}
