//! `run --onnx DIR --mode speculative --draft-tree W1,W2,...` (token trees on ONNX Runtime's CPU
//! provider): on a dynamic and a static export (also with `--merge-adapters`), the tokens of `run --mode greedy` and of the
//! reference's `generate --draft-tree` with the same rounds, and the tree's JSON fields; a tree the
//! static buffers cannot hold refused with the limits.

use super::{fails, generate_json, ids, ok};
use serde_json::Value;

#[test]
fn exports_run_trees_like_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["dynamic", "static", "merged"] {
        let out = dir.path().join(kind);
        let o = out.to_str().unwrap();
        let cache: &[&str] = match kind {
            "static" => &["--static-cache", "64"],
            "merged" => &["--static-cache", "64", "--merge-adapters"],
            _ => &[],
        };
        ok(&[&["export", "--model", "tiny", "--out", o][..], cache].concat());
        let info = ok(&["info", "--onnx", o, "--json"]).json();
        assert_eq!(
            info["static_cache"]["merged_adapters"].as_bool(),
            (kind != "dynamic").then_some(kind == "merged"),
            "{kind}"
        );
        check_run_trees(o);
    }
}

fn check_run_trees(o: &str) {
    let prompt = ["--tokens", "5,9,14,3", "--max-new-tokens", "20"];
    let run =
        |extra: &[&str]| ok(&[&["run", "--onnx", o, "--json"][..], &prompt, extra].concat()).json();
    let greedy = run(&["--mode", "greedy"]);
    for spec in ["2,1,1", "3,2"] {
        let tree = run(&["--mode", "speculative", "--draft-tree", spec]);
        assert_eq!(ids(&tree["tokens"]), ids(&greedy["tokens"]), "{spec}");
        let widths: Vec<u64> = spec.split(',').map(|w| w.parse().unwrap()).collect();
        assert_eq!(ids(&tree["draft_tree"]), widths);
        assert_eq!(tree["ep_used"], "cpu");
        // the reference engine drafts and accepts the same: the same rounds and acceptance
        let reference = generate_json(
            &[
                &["--model", "tiny"][..],
                &prompt,
                &["--mode", "speculative", "--draft-tree", spec],
            ]
            .concat(),
        );
        for field in ["tokens", "rounds", "tree_nodes", "acceptance_by_depth"] {
            assert_eq!(tree[field], reference[field], "{spec}: {field}");
        }
    }
}

#[test]
fn trees_need_room_and_speculative_mode() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    let s = small.to_str().unwrap();
    ok(&[
        "export",
        "--model",
        "tiny",
        "--out",
        s,
        "--static-cache",
        "16",
    ]);
    let tree = [
        "--mode",
        "speculative",
        "--draft-tree",
        "2,1",
        "--tokens",
        "1,2,3",
    ];
    // 3 prompt tokens, 10 new ones and 4 nodes below the root: 3 + 9 + 4 = 16 fit, 17 do not
    ok(&[
        &["run", "--onnx", s][..],
        &tree,
        &["--max-new-tokens", "10"],
    ]
    .concat());
    fails(
        &[
            &["run", "--onnx", s][..],
            &tree,
            &["--max-new-tokens", "11"],
        ]
        .concat(),
        &[
            "5 nodes",
            "need 17 positions",
            "(L = 16)",
            "1 more than the static KV buffers hold",
        ],
    );
    fails(
        &[
            &["run", "--onnx", s][..],
            &tree[2..],
            &["--max-new-tokens", "4"],
        ]
        .concat(),
        &["--draft-tree", "--mode speculative"],
    );
    // a chain with a lookup branch is a tree too: the message names the branch's flag
    let lookup = [
        "--mode",
        "speculative",
        "--prompt-lookup",
        "8",
        "--tokens",
        "1,2,3",
    ];
    fails(
        &[
            &["run", "--onnx", s][..],
            &lookup,
            &["--max-new-tokens", "6"],
        ]
        .concat(),
        &["any --prompt-lookup branch", "a shorter --prompt-lookup"],
    );
}

/// `--draft-tree W --dynamic-draft`: the tree is the largest shape and grows per branch while the
/// gate's score passes. On tiny with ARLA at 0.3 the trees are pruned in some rounds, not all:
/// `generate` decodes greedy's tokens and reports the gate; `run` on a dynamic and a static
/// export grows the same trees (tokens, rounds, nodes per round).
#[test]
fn dynamic_trees_on_both_engines() {
    let prompt = ["--tokens", "5,9,14,3", "--max-new-tokens", "24"];
    let tree = [
        "--mode",
        "speculative",
        "--draft-tree",
        "2,2,1",
        "--dynamic-draft",
        "--gate",
        "arla",
        "--threshold",
        "0.3",
    ];
    let greedy = generate_json(&[&["--model", "tiny"][..], &prompt].concat());
    let reference = generate_json(&[&["--model", "tiny"][..], &prompt, &tree].concat());
    assert_eq!(ids(&reference["tokens"]), ids(&greedy["tokens"]));
    assert_eq!(reference["dynamic_tree"]["gate"], "arla", "{reference}");
    let threshold = reference["dynamic_tree"]["threshold"].as_f64().unwrap();
    assert!((threshold - 0.3).abs() < 1e-6, "{reference}");
    let mean_nodes = reference["mean_tree_nodes"].as_f64().unwrap();
    assert!(mean_nodes > 1.0 && mean_nodes < 11.0, "{reference}");
    let dir = tempfile::tempdir().unwrap();
    for cache in [&[][..], &["--static-cache", "64"][..]] {
        let out = dir.path().join(format!("e{}", cache.len()));
        let o = out.to_str().unwrap();
        ok(&[&["export", "--model", "tiny", "--out", o][..], cache].concat());
        let got = ok(&[&["run", "--onnx", o, "--json"][..], &prompt, &tree].concat()).json();
        for field in [
            "tokens",
            "rounds",
            "mean_tree_nodes",
            "acceptance_by_depth",
            "dynamic_tree",
        ] {
            assert_eq!(got[field], reference[field], "{cache:?}: {field}");
        }
    }
}

/// `run --prompt-lookup N` on ONNX Runtime: beside a tree, beside a chain of `--draft-len` and
/// beside dynamic drafting, on a dynamic and a static export, the lookup rounds of `generate
/// --prompt-lookup N` (the same tokens, rounds, branch counts and nodes) on a repetitive prompt
/// where branches are found and accepted.
#[test]
fn prompt_lookup_on_onnx_runtime() {
    let prompt = [
        "--tokens",
        "5,9,14,3,5,9,14,3,5,9",
        "--max-new-tokens",
        "32",
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut found = 0;
    for cache in [&[][..], &["--static-cache", "96"][..]] {
        let out = dir.path().join(format!("e{}", cache.len()));
        let o = out.to_str().unwrap();
        ok(&[&["export", "--model", "tiny", "--out", o][..], cache].concat());
        for flags in [
            &["--draft-tree", "2,1"][..],
            &["--draft-len", "2"],
            &[
                "--dynamic-draft",
                "--gate",
                "confidence",
                "--threshold",
                "0.05",
            ],
        ] {
            let spec = [
                &["--mode", "speculative", "--prompt-lookup", "3"][..],
                flags,
            ]
            .concat();
            let reference = generate_json(&[&["--model", "tiny"][..], &prompt, &spec].concat());
            let got = ok(&[&["run", "--onnx", o, "--json"][..], &prompt, &spec].concat()).json();
            for field in [
                "tokens",
                "rounds",
                "draft_tree",
                "prompt_lookup",
                "lookup_rounds",
                "lookup_nodes",
                "lookup_accepted",
                "mean_tree_nodes",
                "dynamic_tree",
            ] {
                assert_eq!(got[field], reference[field], "{cache:?} {flags:?}: {field}");
            }
            found += got["lookup_accepted"].as_u64().unwrap();
        }
    }
    assert!(found > 0, "no lookup token accepted");
}

/// A config's `onnx_drafting` (ONNX Runtime's own defaults, written by `tune-drafting --write
/// --onnx` when its winner differs) is what a plain export is cut at and what `run` drafts without
/// flags; `generate` drafts the top level; `info` shows both.
#[test]
fn onnx_drafting_is_what_exports_and_runs_draft() {
    let dir = tempfile::tempdir().unwrap();
    let (w, e) = (dir.path().join("w"), dir.path().join("e"));
    let (ws, es) = (w.to_str().unwrap(), e.to_str().unwrap());
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", ws]);
    let path = w.join("m2r2_config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["draft_len"] = 1.into();
    c["onnx_drafting"] = serde_json::json!({
        "draft_gate": 2,
        "draft_len": 1,
        "draft_tree": {"draft_gate": 2, "widths": [2, 1]},
        "prompt_lookup": 3,
    });
    std::fs::write(&path, c.to_string()).unwrap();
    let prompt = [
        "--tokens",
        "5,9,14,3,5,9,14,3,5,9",
        "--max-new-tokens",
        "24",
    ];
    let spec = [&["--mode", "speculative"][..], &prompt].concat();
    // the reference: the top level, a chain of one draft at gate 1 and no branch
    let reference = generate_json(&[&["--model", "tiny", "--m2r2", ws][..], &spec].concat());
    assert_eq!(reference["m2r2"]["draft_gate"], 1, "{reference}");
    assert!(reference["draft_tree"].is_null(), "{reference}");
    // ONNX Runtime: the export is cut at gate 2, and run drafts the tree 2,1 there with a branch
    ok(&["export", "--model", "tiny", "--m2r2", ws, "--out", es]);
    let got = ok(&[&["run", "--onnx", es, "--json"][..], &spec].concat()).json();
    assert_eq!(got["m2r2"]["draft_gate"], 2, "{got}");
    assert_eq!(got["draft_tree"], serde_json::json!([2, 1]), "{got}");
    assert_eq!(got["prompt_lookup"], 3, "{got}");
    // the same rounds as the reference drafting those settings by flags
    let flags = [
        "--draft-tree",
        "2,1",
        "--draft-gate",
        "2",
        "--prompt-lookup",
        "3",
    ];
    let asked = generate_json(&[&["--model", "tiny", "--m2r2", ws][..], &spec, &flags].concat());
    for field in ["tokens", "rounds", "lookup_rounds", "mean_tree_nodes"] {
        assert_eq!(got[field], asked[field], "{field}");
    }
    assert_eq!(got["tokens"], reference["tokens"]);
    let info = ok(&["info", "--model", "tiny", "--m2r2", ws, "--json"]).json();
    assert_eq!(info["m2r2"]["draft"]["gate"], 1, "{info}");
    assert_eq!(info["m2r2"]["onnx_draft"]["gate"], 2, "{info}");
    assert_eq!(info["m2r2"]["onnx_draft"]["prompt_lookup"], 3, "{info}");
    let text = ok(&["info", "--model", "tiny", "--m2r2", ws]).stdout;
    assert!(
        text.contains("ONNX Runtime  its own drafting defaults"),
        "{text}"
    );
    // and `info --onnx` says what the export drafts by default
    let export_info = ok(&["info", "--onnx", es, "--json"]).json();
    let drafting = &export_info["drafting"];
    assert_eq!(drafting["gate"], 2, "{export_info}");
    assert_eq!(drafting["draft_tree"]["widths"], serde_json::json!([2, 1]));
    assert_eq!(drafting["prompt_lookup"], 3, "{export_info}");
    assert!(
        export_info["m2r2_weights_hash"].is_string(),
        "{export_info}"
    );
    // a bad value in the section is refused at load, naming the file and the section
    c["onnx_drafting"]["draft_gate"] = 9.into();
    std::fs::write(&path, c.to_string()).unwrap();
    fails(
        &["generate", "--model", "tiny", "--m2r2", ws, "--tokens", "5"],
        &["m2r2_config.json", "`onnx_drafting`: `draft_gate` = 9"],
    );
}
