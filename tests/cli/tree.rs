//! `generate --mode speculative --draft-tree W1,W2,...` (tree speculation on the reference): greedy,
//! the tokens of `--mode greedy` on tiny and on SmolLM2 with its shipped weights (a bridge at gate
//! 1); sampled (`--temperature`), seeded, a chain tree the chain loop's tokens and top-k 1 greedy's;
//! the tree's JSON fields, one trace line per round, and bad shapes and flag combinations refused
//! naming `--draft-tree`; the same with a `--prompt-lookup N` branch beside a tree or a chain.

use super::{fails, generate_json, ids, ok};
use serde_json::Value;

/// The tree fields of a `--json` report, checked against each other.
fn check_tree_report(report: &Value, widths: &[u64]) {
    assert_eq!(report["mode"], "speculative");
    assert_eq!(ids(&report["draft_tree"]), widths, "{report}");
    let mut nodes = 1;
    let mut level = 1;
    for w in widths {
        level *= w;
        nodes += level;
    }
    assert_eq!(report["tree_nodes"], nodes, "{report}");
    let rounds = report["rounds"].as_u64().unwrap();
    assert!(rounds >= 1, "{report}");
    let mean = report["mean_accepted_tokens"].as_f64().unwrap();
    assert!(
        (1.0..=(widths.len() + 1) as f64).contains(&mean),
        "{report}"
    );
    let by_depth: Vec<f64> = report["acceptance_by_depth"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_f64().unwrap())
        .collect();
    assert_eq!(by_depth.len(), widths.len(), "{report}");
    assert!(by_depth.iter().all(|a| (0.0..=1.0).contains(a)), "{report}");
    assert!(by_depth.windows(2).all(|w| w[0] >= w[1]), "{report}");
    // tokens emitted per verification = the tokens after the prefill's over the rounds, at most
    // 1 + the mean accepted depth = 1 + the sum over depths (less when the budget cut the last
    // round: its accepted drafts past the budget count in the depths, not in the tokens)
    let tokens = report["tokens"].as_array().unwrap().len() as f64;
    assert!(
        (mean - (tokens - 1.0) / rounds as f64).abs() < 1e-9,
        "{report}"
    );
    let sum: f64 = by_depth.iter().sum();
    assert!(mean <= 1.0 + sum + 1e-9, "{report}");
    assert_eq!(report["m2r2"]["draft_len"], widths.len(), "{report}");
    assert_eq!(report["m2r2"]["dynamic_draft"], false, "{report}");
    // the reference counts a tree's work as a chain's (equal for chain trees: a library test)
    assert!(
        report["flops_per_token"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["bytes_per_token"].as_f64().unwrap() > 0.0,
        "{report}"
    );
}

#[test]
fn tiny_trees_decode_like_greedy() {
    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        "5,9,14,3",
        "--max-new-tokens",
        "24",
    ];
    let greedy = generate_json(&[&prompt[..], &["--mode", "greedy"]].concat());
    assert!(greedy.get("draft_tree").is_none());
    let chain =
        generate_json(&[&prompt[..], &["--mode", "speculative", "--draft-len", "2"]].concat());
    assert!(chain.get("draft_tree").is_none() && chain.get("acceptance_by_depth").is_none());
    for (spec, widths) in [("2,1,1", &[2u64, 1, 1][..]), ("3,2", &[3, 2]), ("4", &[4])] {
        for gate in ["1", "2"] {
            let args = [
                "--mode",
                "speculative",
                "--draft-tree",
                spec,
                "--draft-gate",
                gate,
            ];
            let tree = generate_json(&[&prompt[..], &args].concat());
            assert_eq!(
                ids(&tree["tokens"]),
                ids(&greedy["tokens"]),
                "{spec} gate {gate}"
            );
            check_tree_report(&tree, widths);
        }
    }
    // --trace: one line per round, the drafts of each depth and the accepted node
    let mut args = vec!["generate"];
    args.extend_from_slice(&prompt);
    args.extend_from_slice(&[
        "--mode",
        "speculative",
        "--draft-tree",
        "2,1",
        "--trace",
        "--json",
    ]);
    let run = ok(&args);
    let rounds = run.json()["rounds"].as_u64().unwrap() as usize;
    assert!(
        run.stderr.contains("draft tree 2,1 (5 nodes)"),
        "{}",
        run.stderr
    );
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(" round "))
        .collect();
    assert_eq!(lines.len(), rounds, "{}", run.stderr);
    assert!(
        lines
            .iter()
            .all(|l| l.contains("d1 [") && l.contains("d2 [") && l.contains("accepted node")),
        "{}",
        run.stderr
    );
}

/// Sampling with a tree (`--temperature`, `--seed`): the same seed gives the same tokens, other
/// seeds others; the chain tree `1,1` is `--draft-len 2` with the same seed, token for token (the
/// same rule and random stream); with `--top-k 1` every tree decodes like greedy. The report says
/// it sampled and keeps the tree's fields.
#[test]
fn tiny_trees_sample() {
    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        "5,9,14,3",
        "--max-new-tokens",
        "24",
        "--mode",
        "speculative",
    ];
    let sample = |extra: &[&str]| generate_json(&[&prompt[..], extra].concat());
    let tree = |seed| {
        sample(&[
            "--draft-tree",
            "2,1,1",
            "--temperature",
            "1.5",
            "--seed",
            seed,
        ])
    };
    let a = tree("7");
    assert_eq!(a["sampling"], "sample", "{a}");
    assert_eq!(a["temperature"], 1.5, "{a}");
    assert_eq!(a["seed"], 7, "{a}");
    assert_eq!(ids(&a["tokens"]).len(), 24, "{a}");
    check_tree_report(&a, &[2, 1, 1]);
    assert_eq!(a["tokens"], tree("7")["tokens"], "same seed, same tokens");
    let others = ["1", "2", "3"].map(|s| tree(s)["tokens"].clone());
    assert!(
        others.iter().any(|o| *o != a["tokens"]),
        "every seed gave {}",
        a["tokens"]
    );

    let sampled = ["--temperature", "2", "--top-p", "0.9", "--seed", "3"];
    let chain_tree = sample(&[&["--draft-tree", "1,1"][..], &sampled].concat());
    let chain = sample(&[&["--draft-len", "2"][..], &sampled].concat());
    assert_eq!(chain_tree["tokens"], chain["tokens"]);
    assert_eq!(chain_tree["rounds"], chain["rounds"]);

    let greedy = generate_json(&[&prompt[..6], &["--mode", "greedy"]].concat());
    for spec in ["3,2", "2,2,1"] {
        let top1 = sample(&[
            "--draft-tree",
            spec,
            "--temperature",
            "0.7",
            "--top-k",
            "1",
            "--seed",
            "5",
        ]);
        assert_eq!(ids(&top1["tokens"]), ids(&greedy["tokens"]), "{spec}");
    }
}

/// SmolLM2 with its shipped weights (the real m2r2 cache, where scripts/test.sh fetched it): the
/// bridge at gate 1 is read per branch, and trees decode like greedy.
#[test]
fn smollm2_trees_decode_like_greedy() {
    let real = |args: &[&str]| super::smollm2_ok(&[&["generate", "--json"], args].concat()).json();
    let prompt = [
        "--model",
        "smollm2",
        "--prompt",
        "The capital of France is",
        "--max-new-tokens",
        "20",
    ];
    let greedy = real(&[&prompt[..], &["--mode", "greedy"]].concat());
    for (spec, widths) in [("2,1,1", &[2u64, 1, 1][..]), ("3,2", &[3, 2])] {
        let tree = real(
            &[
                &prompt[..],
                &["--mode", "speculative", "--draft-tree", spec],
            ]
            .concat(),
        );
        assert_eq!(ids(&tree["tokens"]), ids(&greedy["tokens"]), "{spec}");
        check_tree_report(&tree, widths);
    }
}

#[test]
fn bad_trees_and_conflicts_are_refused() {
    let base = [
        "generate",
        "--model",
        "tiny",
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "4",
    ];
    let spec = |extra: &[&'static str]| [&base[..], &["--mode", "speculative"], extra].concat();
    fails(
        &spec(&["--draft-tree", "0,1"]),
        &["--draft-tree", "the width at depth 1 is 0"],
    );
    fails(
        &spec(&["--draft-tree", "x"]),
        &["--draft-tree", "`x` is not a width"],
    );
    fails(
        &spec(&["--draft-tree", "4,4,4"]),
        &["--draft-tree", "85 nodes", "at most 64"],
    );
    fails(
        &spec(&["--draft-tree", "2,1", "--draft-len", "2"]),
        &["--draft-tree", "--draft-len"],
    );
    fails(
        &[&base[..], &["--draft-tree", "2,1"]].concat(),
        &["--draft-tree", "--mode speculative"],
    );
    // --threshold is read only by dynamic drafting: refused beside fixed chains and trees, the
    // built-in config's default chain of 4 included
    for (drafting, depth) in [
        (&["--draft-tree", "2,1"][..], "2"),
        (&["--draft-len", "2"], "2"),
        (&[], "4"),
    ] {
        let fixed = format!("a fixed {depth} token(s) deep");
        fails(
            &spec(&[drafting, &["--threshold", "0.5"]].concat()),
            &["--threshold", &fixed, "add --dynamic-draft"],
        );
    }
    ok(&spec(&[
        "--draft-tree",
        "2,1",
        "--dynamic-draft",
        "--threshold",
        "0.5",
    ]));
}

/// The lookup fields of a `--json` report, checked against each other and the tree's (`dynamic`:
/// grown per branch, so a round verifies at most the tree's nodes).
fn check_lookup_report(report: &Value, widths: &[u64], branch: u64, dynamic: bool) {
    assert_eq!(report["mode"], "speculative");
    assert_eq!(ids(&report["draft_tree"]), widths, "{report}");
    assert_eq!(report["prompt_lookup"], branch, "{report}");
    let nodes = report["tree_nodes"].as_u64().unwrap();
    let rounds = report["rounds"].as_u64().unwrap();
    let with_branch = report["lookup_rounds"].as_u64().unwrap();
    let branch_nodes = report["lookup_nodes"].as_u64().unwrap();
    let accepted = report["lookup_accepted"].as_u64().unwrap();
    assert!(
        with_branch <= rounds && branch_nodes <= with_branch * branch,
        "{report}"
    );
    assert!(branch_nodes >= with_branch, "{report}");
    // nodes per round: the tree's (at most, grown per branch), and the branch in the rounds that
    // found one
    let mean_nodes = report["mean_tree_nodes"].as_f64().unwrap();
    let want = (rounds * nodes + branch_nodes) as f64 / rounds as f64;
    match dynamic {
        false => assert!((mean_nodes - want).abs() < 1e-9, "{report}"),
        true => {
            let least = (rounds + branch_nodes) as f64 / rounds as f64;
            assert!(
                least - 1e-9 <= mean_nodes && mean_nodes <= want + 1e-9,
                "{report}"
            );
        }
    }
    // the accepted lookup tokens are accepted drafts
    let mean = report["mean_accepted_tokens"].as_f64().unwrap();
    assert!(
        accepted as f64 <= (mean - 1.0) * rounds as f64 + 1e-9,
        "{report}"
    );
    let by_depth = report["acceptance_by_depth"].as_array().unwrap();
    assert_eq!(by_depth.len() as u64, (widths.len() as u64).max(branch));
    assert_eq!(report["m2r2"]["dynamic_draft"], dynamic, "{report}");
    assert_eq!(report["dynamic_tree"].is_null(), !dynamic, "{report}");
}

/// A repetitive prompt on tiny: a lookup branch beside a tree, beside the chain of `--draft-len`,
/// beside the config's chain and beside dynamic drafting decodes like greedy; its branches are
/// found and accepted; the trace shows them.
#[test]
fn tiny_lookup_branches_decode_like_greedy() {
    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        "5,9,14,3,5,9,14,3,5,9",
        "--max-new-tokens",
        "32",
    ];
    let greedy = generate_json(&[&prompt[..], &["--mode", "greedy"]].concat());
    let off = generate_json(
        &[
            &prompt[..],
            &["--mode", "speculative", "--draft-tree", "2,1"],
        ]
        .concat(),
    );
    assert_eq!(off["prompt_lookup"], 0, "{off}");
    assert_eq!(off["lookup_rounds"], 0, "{off}");
    let mut accepted = 0;
    for (flags, widths, dynamic) in [
        (&["--draft-tree", "2,1"][..], &[2u64, 1][..], false),
        (&["--draft-len", "2"], &[1, 1], false),
        (&[], &[1, 1, 1, 1], false), // tiny's config drafts 4
        (
            &[
                "--dynamic-draft",
                "--gate",
                "confidence",
                "--threshold",
                "0.05",
            ],
            &[1, 1, 1, 1],
            true,
        ),
        (&["--dynamic-draft", "--draft-tree", "2,1"], &[2, 1], true),
    ] {
        let args = [
            &["--mode", "speculative", "--prompt-lookup", "3"][..],
            flags,
        ]
        .concat();
        let run = generate_json(&[&prompt[..], &args].concat());
        assert_eq!(ids(&run["tokens"]), ids(&greedy["tokens"]), "{flags:?}");
        check_lookup_report(&run, widths, 3, dynamic);
        assert!(run["lookup_rounds"].as_u64().unwrap() > 0, "{run}");
        accepted += run["lookup_accepted"].as_u64().unwrap();
    }
    assert!(accepted > 0, "no lookup token accepted");
    let mut args = vec!["generate"];
    args.extend_from_slice(&prompt);
    args.extend_from_slice(&[
        "--mode",
        "speculative",
        "--draft-tree",
        "2,1",
        "--prompt-lookup",
        "3",
        "--trace",
        "--json",
    ]);
    let run = ok(&args);
    assert!(
        run.stderr
            .contains("draft tree 2,1 (5 nodes, a lookup branch of up to 3 tokens)"),
        "{}",
        run.stderr
    );
    let rounds = run.json()["lookup_rounds"].as_u64().unwrap() as usize;
    let lines = run
        .stderr
        .lines()
        .filter(|l| l.contains(" lookup ["))
        .count();
    assert_eq!(lines, rounds, "{}", run.stderr);
}

/// SmolLM2 with its shipped weights: the default chain (drafted dynamically, as the config says)
/// with a lookup branch decodes like greedy on a prompt that its answer quotes.
#[test]
fn smollm2_lookup_decodes_like_greedy() {
    let real = |args: &[&str]| super::smollm2_ok(&[&["generate", "--json"], args].concat()).json();
    let prompt = [
        "--model",
        "smollm2",
        "--prompt",
        "Repeat after me: the quick brown fox jumps over the lazy dog.",
        "--chat",
        "--max-new-tokens",
        "24",
    ];
    let greedy = real(&[&prompt[..], &["--mode", "greedy"]].concat());
    let run = real(
        &[
            &prompt[..],
            &["--mode", "speculative", "--prompt-lookup", "4"],
        ]
        .concat(),
    );
    assert_eq!(ids(&run["tokens"]), ids(&greedy["tokens"]));
    check_lookup_report(&run, &[1], 4, true);
    assert!(run["lookup_accepted"].as_u64().unwrap() > 0, "{run}");
}

/// The M2R2 config's `prompt_lookup` is greedy speculative decoding's default branch on both
/// engines: used when nothing asks for other drafting, off with `--prompt-lookup 0`, with
/// `--draft-len`, and when sampling.
#[test]
fn the_config_prompt_lookup_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("m2r2");
    let f = folder.to_str().unwrap();
    ok(&["init-m2r2", "--model", "tiny", "--seed", "3", "--out", f]);
    let path = folder.join("m2r2_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["prompt_lookup"] = serde_json::json!(3);
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let prompt = [
        "--model",
        "tiny",
        "--m2r2",
        f,
        "--tokens",
        "5,9,14,3,5,9,14,3,5,9",
        "--max-new-tokens",
        "24",
    ];
    // (greedy decoding reads no M2R2 weights)
    let greedy = generate_json(&[&prompt[..2], &prompt[4..], &["--mode", "greedy"]].concat());
    let run =
        |extra: &[&str]| generate_json(&[&prompt[..], &["--mode", "speculative"], extra].concat());
    let default = run(&[]);
    assert_eq!(ids(&default["tokens"]), ids(&greedy["tokens"]));
    check_lookup_report(&default, &[1, 1, 1, 1], 3, false);
    assert!(default["lookup_rounds"].as_u64().unwrap() > 0, "{default}");
    let branch = |r: &Value| r["prompt_lookup"].as_u64().unwrap_or(0);
    for extra in [
        &["--prompt-lookup", "0"][..],
        &["--draft-len", "2"],
        &["--temperature", "0.8", "--seed", "1"],
    ] {
        assert_eq!(branch(&run(extra)), 0, "{extra:?}");
    }
    // ONNX Runtime reads it from the export's manifest
    let out = dir.path().join("export");
    let o = out.to_str().unwrap();
    ok(&["export", "--model", "tiny", "--m2r2", f, "--out", o]);
    let onnx = ok(&[
        &["run", "--onnx", o, "--json", "--mode", "speculative"][..],
        &prompt[4..],
    ]
    .concat())
    .json();
    for field in [
        "tokens",
        "rounds",
        "prompt_lookup",
        "lookup_rounds",
        "lookup_accepted",
    ] {
        assert_eq!(onnx[field], default[field], "{field}");
    }
}

/// A branch outside speculative decoding is refused; with sampling it runs (seeded); 0 is off.
#[test]
fn bad_lookups_are_refused() {
    let base = [
        "generate",
        "--model",
        "tiny",
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "4",
        "--prompt-lookup",
        "2",
    ];
    fails(&base, &["--prompt-lookup", "--mode speculative"]);
    // a branch longer than a round verifies is refused, as in the M2R2 config
    let spec = [&base[..7], &["--mode", "speculative", "--prompt-lookup"]].concat();
    fails(
        &[&spec[..], &["64"]].concat(),
        &["--prompt-lookup 64: a branch has at most 63 tokens"],
    );
    // sampled: the branch's tokens are verified as deterministic proposals (lossless: the
    // chi-square test in decode/tree_sampling.rs); the same seed gives the same tokens
    let sampled = |seed: &'static str| {
        generate_json(&[
            "--model",
            "tiny",
            "--tokens",
            "1,2,1,2",
            "--max-new-tokens",
            "16",
            "--mode",
            "speculative",
            "--prompt-lookup",
            "2",
            "--temperature",
            "0.8",
            "--seed",
            seed,
        ])
    };
    let (a, b) = (sampled("3"), sampled("3"));
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["prompt_lookup"], 2, "{a}");
    assert!(a["lookup_rounds"].as_u64().is_some(), "{a}");
    // 0 is off: the chain loop as without the flag
    let off = generate_json(&[
        "--model",
        "tiny",
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "4",
        "--mode",
        "speculative",
        "--prompt-lookup",
        "0",
    ]);
    assert!(off.get("draft_tree").is_none(), "{off}");
}
