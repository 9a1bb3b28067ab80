//! `m2r2 tune-drafting` on the built-in `tiny` model: traces every gate, prices chains and token
//! trees on both engines, picks a winner per engine, writes the defaults into
//! an M2R2 folder that then decodes like greedy (a written tree is what `generate --mode
//! speculative` drafts without flags); sampled data, unknown gates and bad family / shape flags
//! are refused.

use super::{fails, generate_json, ids, ok};
use serde_json::Value;
use std::path::Path;

/// `m2r2_config.json` of the folder `dir`.
fn config(dir: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("m2r2_config.json")).unwrap()).unwrap()
}

/// A tree's predicted speed-up from the report's own numbers: every round drafts and verifies the
/// whole tree, so speed-up = tokens per verification x greedy step / (the levels above the leaves
/// proposing + the leaf level + one verification of all nodes).
fn tree_speedup(policy: &Value, costs: &Value) -> f64 {
    let widths = ids(&policy["draft_tree"]);
    let tree = &costs["costs"]["tree"];
    let at = |kind: &str, n: u64| tree[kind][n as usize - 1].as_f64().unwrap();
    let mut levels = vec![1u64];
    for w in &widths {
        levels.push(levels.last().unwrap() * w);
    }
    let (leaves, above) = levels.split_last().unwrap();
    let nodes: u64 = levels.iter().sum();
    assert_eq!(policy["tree_nodes"], nodes, "{policy}");
    let round: f64 = above.iter().map(|&n| at("propose", n)).sum::<f64>()
        + at("leaves", *leaves)
        + at("verify", nodes);
    policy["tokens_per_round"].as_f64().unwrap() * costs["costs"]["greedy"].as_f64().unwrap()
        / round
}

/// `generate --mode speculative` with the M2R2 folder `w`'s defaults emits greedy decoding's 20
/// tokens after `tokens`; returns its report.
fn default_decodes_like_greedy(w: &str, tokens: &str) -> Value {
    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        tokens,
        "--max-new-tokens",
        "20",
    ];
    let greedy = generate_json(&prompt);
    let mut spec = prompt.to_vec();
    spec.extend(["--mode", "speculative", "--m2r2", w]);
    let decoded = generate_json(&spec);
    assert_eq!(decoded["tokens"], greedy["tokens"], "{decoded}");
    decoded
}

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
        "--prompt-lookup",
        "0",
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
    // reference at 3 gates + ONNX Runtime at the export's gate; verify costs for 1..=4 rows; tree
    // steps on both: the shapes no deeper than 3 (3 4 2,1 2,1,1 3,1,1 2,2,1 3,2,1) have proposing
    // levels of 1, 2, 3, 4 and 6 nodes, leaf levels of 2, 3, 4 and 6, and 4, 5, 7, 10, 11 and 16
    // nodes; grown per branch, a round may stop after any depth, so the prefixes' trees (2, 3,
    // 2,2 and 3,2: 3, 4, 7 and 10 nodes) are verified too, and the root alone (1 node: the
    // chain's verification of 1 row)
    let costs = report["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 4, "{report}");
    assert!(
        costs
            .iter()
            .all(|c| c["costs"]["verify"].as_array().unwrap().len() == 4)
    );
    let timed = |v: &Value| -> Vec<u64> {
        let v = v.as_array().unwrap();
        (1..=v.len() as u64)
            .filter(|&n| v[n as usize - 1].is_f64())
            .collect()
    };
    for c in costs {
        let tree = &c["costs"]["tree"];
        assert_eq!(timed(&tree["propose"]), [1, 2, 3, 4, 6], "{c}");
        assert_eq!(timed(&tree["leaves"]), [2, 3, 4, 6], "{c}");
        assert_eq!(timed(&tree["verify"]), [1, 3, 4, 5, 7, 10, 11, 16], "{c}");
        assert_eq!(tree["verify"][0], c["costs"]["verify"][0], "{c}");
    }
    assert!(
        costs[3]["engine"]
            .as_str()
            .unwrap()
            .starts_with("onnxruntime")
    );

    // per gate: fixed 1..=3, 3 gate kinds x 2 thresholds x 3 lengths, and 7 trees, each whole and
    // grown per branch by 2 gate kinds (confidence, entropy) x 2 thresholds
    let policies = report["policies"].as_array().unwrap();
    assert_eq!(
        policies.len(),
        3 * (3 + 3 * 2 * 3 + 7 * (1 + 2 * 2)),
        "{report}"
    );
    let trees: Vec<&Value> = policies.iter().filter(|p| p["family"] == "tree").collect();
    assert_eq!(trees.len(), 105);
    let grown: Vec<&&Value> = trees
        .iter()
        .filter(|t| t["dynamic_draft"].is_object())
        .collect();
    assert_eq!(grown.len(), 84);
    let export_gate = costs[3]["gate"].as_u64().unwrap();
    for t in &grown {
        // the rounds replayed per branch (`simulate_dynamic_tree`, tested against the decoder
        // there); here the report: priced on each engine, named by its gate and threshold
        let d = &t["dynamic_draft"];
        let gate = d["gate"].as_str().unwrap();
        assert!(gate == "confidence" || gate == "entropy", "{t}");
        let shape = ids(&t["draft_tree"]);
        let shape: Vec<String> = shape.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            t["policy"],
            format!(
                "tree {}, dynamic {gate} >= {}",
                shape.join(","),
                d["threshold"]
            ),
        );
        assert!(t["speedup_reference"].as_f64().unwrap() > 0.0, "{t}");
        assert_eq!(
            t["speedup_onnx"].is_f64(),
            t["draft_gate"].as_u64() == Some(export_gate),
            "{t}"
        );
        let tokens = t["tokens_per_round"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&tokens), "{t}");
    }
    for t in trees.iter().filter(|t| t["dynamic_draft"].is_null()) {
        // priced on each engine from its own step costs (ONNX Runtime at the export's gate)
        let gate = t["draft_gate"].as_u64().unwrap() as usize;
        let want = tree_speedup(t, &costs[gate - 1]);
        let got = t["speedup_reference"].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-9 * want, "{t}: {got} != {want}");
        match gate as u64 == export_gate {
            true => {
                let want = tree_speedup(t, &costs[3]);
                let got = t["speedup_onnx"].as_f64().unwrap();
                assert!((got - want).abs() <= 1e-9 * want, "{t}: {got} != {want}");
            }
            false => assert!(t["speedup_onnx"].is_null(), "{t}"),
        }
        assert_eq!(t["draft_len"], ids(&t["draft_tree"]).len(), "{t}");
        assert!(t["policy"].as_str().unwrap().starts_with("tree "), "{t}");
    }
    // best first by the reference's speed-up
    let reference: Vec<f64> = policies
        .iter()
        .map(|p| p["speedup_reference"].as_f64().unwrap())
        .collect();
    assert!(reference.windows(2).all(|w| w[0] >= w[1]), "{reference:?}");
    assert_eq!(report["best_reference"], policies[0]);
    // ONNX Runtime: the chains and trees at the export's gate, its winner the fastest of them
    let onnx_priced: Vec<&Value> = policies
        .iter()
        .filter(|p| p["speedup_onnx"].is_f64())
        .collect();
    assert_eq!(onnx_priced.len(), 21 + 35);
    let onnx_speed = |p: &Value| p["speedup_onnx"].as_f64().unwrap();
    let best_onnx = &report["best_onnx"];
    assert!(
        onnx_priced
            .iter()
            .all(|p| onnx_speed(p) <= onnx_speed(best_onnx))
    );
    // each engine's defaults: its fastest chain, and its fastest tree when that beats the chain
    // there; the reference's at the config's top level, ONNX Runtime's in `onnx_drafting` where
    // they differ
    let on_reference = |p: &Value| p["speedup_reference"].as_f64().unwrap();
    let fastest = |speed: &dyn Fn(&Value) -> f64, pool: &[&Value], family: &str| {
        pool.iter()
            .copied()
            .filter(|p| p["family"] == family)
            .reduce(|a, b| if speed(b) > speed(a) { b } else { a })
            .unwrap()
            .clone()
    };
    let all: Vec<&Value> = policies.iter().collect();
    let chosen = |speed: &dyn Fn(&Value) -> f64, pool: &[&Value], defaults: &Value| {
        let chain = fastest(speed, pool, "chain");
        assert_eq!(defaults["chain"], chain, "{defaults}");
        let tree = fastest(speed, pool, "tree");
        match speed(&tree) > speed(&chain) {
            true => assert_eq!(defaults["tree"], tree, "{defaults}"),
            false => assert!(defaults["tree"].is_null(), "{defaults}"),
        }
    };
    chosen(&on_reference, &all, &report["defaults"]);
    chosen(&onnx_speed, &onnx_priced, &report["onnx_defaults"]);
    // the config's drafting fields written from an engine's defaults
    let drafting = |defaults: &Value| {
        let chain = &defaults["chain"];
        let mut want = serde_json::json!({
            "draft_gate": chain["draft_gate"],
            "draft_len": chain["draft_len"],
        });
        if chain["dynamic_draft"].is_object() {
            want["dynamic_draft"] = chain["dynamic_draft"].clone();
        }
        if defaults["tree"].is_object() {
            let tree = &defaults["tree"];
            want["draft_tree"] = serde_json::json!({
                "draft_gate": tree["draft_gate"],
                "widths": tree["draft_tree"],
            });
            if tree["dynamic_draft"].is_object() {
                want["draft_tree"]["dynamic"] = tree["dynamic_draft"].clone();
            }
        }
        want
    };
    let written = config(&dir.path().join("w"));
    let top = drafting(&report["defaults"]);
    for key in ["draft_gate", "draft_len", "dynamic_draft", "draft_tree"] {
        assert_eq!(
            written.get(key).unwrap_or(&Value::Null),
            &top[key],
            "{key}: {written}"
        );
    }
    let onnx_drafting = drafting(&report["onnx_defaults"]);
    match onnx_drafting == top {
        true => assert!(written.get("onnx_drafting").is_none(), "{written}"),
        false => assert_eq!(written["onnx_drafting"], onnx_drafting, "{written}"),
    }
    // the written default decodes like greedy
    default_decodes_like_greedy(&w, "5,6,7");
    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        "5,6,7",
        "--max-new-tokens",
        "20",
    ];
    let greedy = generate_json(&prompt);

    // trees alone: the winner is a tree, written as the reference's default beside the folder's
    // chain (kept: no chain was priced); generate drafts it without flags, flags still override
    let t = p("t");
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &t]);
    let before = config(&dir.path().join("t"));
    let tuned = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &t,
        "--data",
        &p("data"),
        "--families",
        "tree",
        "--tree",
        "2,1",
        "--tree",
        "3,1,1",
        "--draft-gates",
        "1,2",
        "--repeats",
        "1",
        "--prompt-lookup",
        "0",
        "--json",
        "--write",
        &t,
    ])
    .json();
    let policies = tuned["policies"].as_array().unwrap();
    assert_eq!(
        policies.len(),
        2 * 2 * (1 + 2 * 9),
        "2 shapes at 2 gates, whole and grown by 2 gates x 9 thresholds: {tuned}"
    );
    assert!(policies.iter().all(|p| p["family"] == "tree"));
    assert!(tuned["defaults"]["chain"].is_null() && tuned["best_onnx"].is_null());
    let tree = &tuned["defaults"]["tree"];
    assert_eq!(tree, &tuned["best_reference"]);
    let written = config(&dir.path().join("t"));
    let widths = ids(&tree["draft_tree"]);
    assert!(widths == [2, 1] || widths == [3, 1, 1], "{tree}");
    assert_eq!(written["draft_tree"]["widths"], tree["draft_tree"]);
    assert_eq!(written["draft_tree"]["draft_gate"], tree["draft_gate"]);
    for field in ["draft_gate", "draft_len", "dynamic_draft"] {
        assert_eq!(written.get(field), before.get(field), "{field}");
    }
    let mut spec = prompt.to_vec();
    spec.extend(["--mode", "speculative", "--m2r2", &t]);
    let decoded = generate_json(&spec);
    assert_eq!(decoded["tokens"], greedy["tokens"]);
    assert_eq!(ids(&decoded["draft_tree"]), widths, "{decoded}");
    assert_eq!(
        decoded["dynamic_tree"].is_object(),
        tree["dynamic_draft"].is_object(),
        "{decoded}"
    );
    assert_eq!(
        decoded["m2r2"]["draft_gate"], tree["draft_gate"],
        "{decoded}"
    );
    // --draft-len and --draft-tree choose otherwise; --draft-gate moves the tree; sampling drafts
    // the chain
    let with = |extra: &[&str]| generate_json(&[&spec[..], extra].concat());
    let chain = with(&["--draft-len", "2"]);
    assert!(chain.get("draft_tree").is_none(), "{chain}");
    assert_eq!(chain["m2r2"]["draft_len"], 2);
    assert_eq!(ids(&with(&["--draft-tree", "1,1"])["draft_tree"]), [1, 1]);
    let moved = with(&["--draft-gate", "3"]);
    assert_eq!(ids(&moved["draft_tree"]), widths);
    assert_eq!(moved["m2r2"]["draft_gate"], 3);
    let sampled = with(&["--temperature", "0.8", "--seed", "4"]);
    assert!(sampled.get("draft_tree").is_none(), "{sampled}");
    // ONNX Runtime drafts the written tree by default too, from an export of the folder cut at
    // the tree's gate; --draft-len chooses a chain
    let gate = tree["draft_gate"].to_string();
    let tree_export = p("tree-export");
    ok(&[
        "export",
        "--model",
        "tiny",
        "--m2r2",
        &t,
        "--draft-gate",
        &gate,
        "--out",
        &tree_export,
    ]);
    let run = |extra: &[&str]| {
        let args = [
            &["run", "--onnx", &tree_export, "--json"][..],
            &prompt[2..],
            extra,
        ];
        ok(&args.concat()).json()
    };
    let on_onnx = run(&["--mode", "speculative"]);
    assert_eq!(ids(&on_onnx["draft_tree"]), widths, "{on_onnx}");
    assert_eq!(on_onnx["tokens"], greedy["tokens"]);
    assert!(
        run(&["--mode", "speculative", "--draft-len", "2"])
            .get("draft_tree")
            .is_none()
    );
    // a config tree grown per branch is drafted so by default on both engines
    let mut grown = config(&dir.path().join("t"));
    grown["draft_tree"] = serde_json::json!({
        "draft_gate": 1,
        "widths": [2, 1, 1],
        "dynamic": {"gate": "confidence", "threshold": 0.3},
    });
    std::fs::write(dir.path().join("t/m2r2_config.json"), grown.to_string()).unwrap();
    let info = ok(&["info", "--model", "tiny", "--m2r2", &t]);
    assert!(
        info.stdout.contains(
            "default tree  gate 1, widths 2,1,1, grown per branch while confidence >= 0.3"
        ),
        "{}",
        info.stdout
    );
    let decoded = generate_json(&spec);
    assert_eq!(decoded["tokens"], greedy["tokens"]);
    assert_eq!(ids(&decoded["draft_tree"]), [2, 1, 1], "{decoded}");
    assert_eq!(decoded["dynamic_tree"]["gate"], "confidence", "{decoded}");
    assert_eq!(decoded["m2r2"]["gate"], "confidence", "{decoded}");
    let grown_export = p("grown-export");
    ok(&[
        "export",
        "--model",
        "tiny",
        "--m2r2",
        &t,
        "--out",
        &grown_export,
    ]);
    let args = [
        &[
            "run",
            "--onnx",
            &grown_export,
            "--json",
            "--mode",
            "speculative",
        ][..],
        &prompt[2..],
    ];
    let on_onnx = ok(&args.concat()).json();
    assert_eq!(on_onnx["tokens"], greedy["tokens"]);
    assert_eq!(ids(&on_onnx["draft_tree"]), [2, 1, 1], "{on_onnx}");
    let threshold = on_onnx["dynamic_tree"]["threshold"].as_f64().unwrap();
    assert_eq!(threshold as f32, 0.3, "{on_onnx}");
    assert_eq!(on_onnx["m2r2"]["gate"], "confidence", "{on_onnx}");
    // --gate and --threshold replace the config tree's growth, as they replace dynamic_draft's
    let replace = ["--gate", "entropy", "--threshold", "0.6"];
    let replaced = [
        generate_json(&[&spec[..], &replace].concat()),
        ok(&[&args.concat()[..], &replace].concat()).json(),
    ];
    for report in replaced {
        assert_eq!(report["tokens"], greedy["tokens"]);
        assert_eq!(ids(&report["draft_tree"]), [2, 1, 1], "{report}");
        assert_eq!(report["dynamic_tree"]["gate"], "entropy", "{report}");
        let threshold = report["dynamic_tree"]["threshold"].as_f64().unwrap();
        assert_eq!(threshold as f32, 0.6, "{report}");
    }
    // chains alone: the winner is a chain, and the tree default is dropped
    ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &t,
        "--data",
        &p("data"),
        "--families",
        "chain",
        "--max-draft",
        "2",
        "--thresholds",
        "0.5",
        "--repeats",
        "1",
        "--prompt-lookup",
        "0",
        "--write",
        &t,
    ]);
    assert!(config(&dir.path().join("t")).get("draft_tree").is_none());
    assert!(generate_json(&spec).get("draft_tree").is_none());

    distill("sampled", &["--temperature", "0.8"]);
    fails(
        &["tune-drafting", "--model", "tiny", "--data", &p("sampled")],
        &["sampled responses (temperature 0.8)", "greedy"],
    );
    let refused = |extra: &[&str], needles: &[&str]| {
        let data = p("data");
        let args = [
            &["tune-drafting", "--model", "tiny", "--data", &data][..],
            extra,
        ]
        .concat();
        fails(&args, needles);
    };
    refused(
        &["--draft-gates", "7"],
        &["--draft-gates", "gate 7 does not exist"],
    );
    refused(
        &["--draft-gates", "1,1"],
        &["--draft-gates names gate 1 twice"],
    );
    // nothing to trace, or more drafts than a round verifies: refused before any tracing (a
    // run with no traced sample priced every policy NaN and still wrote one)
    refused(&["--limit", "0"], &["--limit 0 leaves no samples"]);
    refused(
        &["--max-draft", "64"],
        &["--max-draft 64", "at most 63 tokens"],
    );
    refused(
        &["--max-draft", "60", "--prompt-lookup", "4"],
        &["--max-draft 60 with --prompt-lookup 4", "64 nodes"],
    );
    refused(
        &[
            "--max-new-tokens",
            "18446744073709551615",
            "--max-draft",
            "18446744073709551615",
        ],
        &["--max-draft 18446744073709551615"],
    );
    // bench's ONNX Runtime comparisons are refused here, as on `run`
    refused(
        &["--onnx", &onnx, "--ort-compare", "a:threads=1"],
        &["--ort-compare is for `m2r2 bench"],
    );
    refused(
        &["--onnx", &onnx, "--cuda-graph", "both"],
        &["--cuda-graph both is for `bench --onnx`"],
    );
    // trees alone on ONNX Runtime: priced there too (no chain default: nothing to write)
    let trees_only = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--data",
        &p("data"),
        "--families",
        "tree",
        "--tree",
        "2,1",
        "--onnx",
        &onnx,
        "--repeats",
        "1",
        "--prompt-lookup",
        "0",
        "--json",
    ]);
    let report: Value = serde_json::from_str(&trees_only.stdout).unwrap();
    assert_eq!(report["best_onnx"]["family"], "tree", "{report}");
    assert!(report["defaults"]["chain"].is_null(), "{report}");
    refused(
        &["--families", "chain", "--tree", "2,1"],
        &["--tree", "--families"],
    );
    refused(
        &["--tree", "2,1,1", "--max-draft", "2"],
        &["--tree 2,1,1", "deeper than --max-draft 2"],
    );
    refused(&["--tree", "2,0"], &["--tree", "the width at depth 2 is 0"]);
}

/// `--write` changes only the drafting defaults it chose: with `--prompt-lookup 0` a hand-set
/// prompt-lookup branch stays as it was (the report says it was not priced), and so does the
/// early-exit default.
#[test]
fn tune_drafting_keeps_what_it_does_not_price() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    super::train::distill_tiny(dir.path(), &[("prompts.jsonl", "a", 1, "data")]);
    let (data, w) = (p("data"), p("w"));
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &w]);
    let path = dir.path().join("w").join("m2r2_config.json");
    let mut c = config(&dir.path().join("w"));
    let j = c["gates"].as_array().unwrap().len();
    let early_exit = serde_json::json!({"gate": "confidence", "thresholds": vec![0.5; j]});
    c["prompt_lookup"] = serde_json::json!(2);
    c["early_exit"] = early_exit.clone();
    std::fs::write(&path, serde_json::to_string_pretty(&c).unwrap()).unwrap();
    let run = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &w,
        "--data",
        &data,
        "--draft-gates",
        "1",
        "--families",
        "chain",
        "--max-draft",
        "1",
        "--repeats",
        "1",
        "--prompt-lookup",
        "0",
        "--json",
        "--write",
        &w,
    ]);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let notes = report["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .unwrap()
            .contains("prompt-lookup branch (up to 2 tokens) is not priced")),
        "{report}"
    );
    let written = config(&dir.path().join("w"));
    assert_eq!(written["prompt_lookup"], 2);
    assert_eq!(written["early_exit"], early_exit);
}

/// `--prompt-lookup N,...` prices every chain and tree again beside a branch of each length (on
/// the tree loop's step costs, both engines), and `--write` stores the branch length whose
/// defaults are fastest with them; the written default decodes like greedy.
#[test]
fn tune_drafting_prices_lookup_branches() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    super::train::distill_tiny(dir.path(), &[("prompts.jsonl", "a", 2, "data")]);
    let (data, w, onnx) = (p("data"), p("w"), p("onnx"));
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &w]);
    ok(&["export", "--model", "tiny", "--m2r2", &w, "--out", &onnx]);
    let report = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &w,
        "--data",
        &data,
        "--max-draft",
        "2",
        "--thresholds",
        "0.5",
        "--tree",
        "2,1",
        "--prompt-lookup",
        "0,2,4",
        "--onnx",
        &onnx,
        "--repeats",
        "1",
        "--json",
        "--write",
        &w,
    ])
    .json();
    let policies = report["policies"].as_array().unwrap();
    // per gate (3): without a branch, fixed 1..=2, 3 gate kinds x 1 threshold x 2 lengths, the
    // tree whole and grown by 2 gate kinds; beside each branch (2) the same but ARLA's chains
    let with = |n: Option<u64>| -> Vec<&Value> {
        policies
            .iter()
            .filter(|p| p["prompt_lookup"].as_u64() == n)
            .collect()
    };
    assert_eq!(with(None).len(), 3 * (2 + 6 + 3), "{report}");
    for n in [2, 4] {
        let beside = with(Some(n));
        assert_eq!(beside.len(), 3 * (2 + 4 + 3), "{report}");
        for q in &beside {
            let policy = q["policy"].as_str().unwrap();
            assert!(policy.ends_with(&format!(", lookup {n}")), "{q}");
            assert!(q["speedup_reference"].as_f64().unwrap() > 0.0, "{q}");
            // priced on ONNX Runtime at the export's gate (its tree steps were timed with the
            // branches' rows)
            assert_eq!(q["speedup_onnx"].is_f64(), q["draft_gate"] == 1, "{q}");
        }
    }
    // each engine's default beats every chain there, its branch the one written for it (ONNX
    // Runtime's in `onnx_drafting` when its defaults differ from the reference's)
    let written = config(&dir.path().join("w"));
    let engines = [
        ("defaults", "speedup_reference", &written),
        (
            "onnx_defaults",
            "speedup_onnx",
            written.get("onnx_drafting").unwrap_or(&written),
        ),
    ];
    for (key, speedup, drafting) in engines {
        let defaults = &report[key];
        let default = match defaults["tree"].is_null() {
            true => &defaults["chain"],
            false => &defaults["tree"],
        };
        let speed = |p: &Value| p[speedup].as_f64().unwrap_or(0.0);
        for q in policies.iter().filter(|p| p["family"] == "chain") {
            assert!(speed(q) <= speed(default), "{key}: {q} beats {default}");
        }
        assert_eq!(
            defaults["prompt_lookup"], default["prompt_lookup"],
            "{defaults}"
        );
        assert_eq!(
            drafting.get("prompt_lookup").unwrap_or(&Value::Null),
            &defaults["prompt_lookup"],
            "{key}: {written}"
        );
    }
    let defaults = &report["defaults"];
    let decoded = default_decodes_like_greedy(&w, "5,6,7,5,6");
    assert_eq!(
        decoded["prompt_lookup"], defaults["prompt_lookup"],
        "{decoded}"
    );

    fails(
        &[
            "tune-drafting",
            "--model",
            "tiny",
            "--data",
            &data,
            "--prompt-lookup",
            "2,64",
        ],
        &["--prompt-lookup 64", "at most 63"],
    );
}

/// Greedy data of `n` prompts (12 response tokens each) in `dir/data`, and seeded random weights
/// of `tiny` in `dir/w`; returns both paths.
fn tiny_data_and_weights(dir: &std::path::Path, n: usize) -> (String, String) {
    let lines: Vec<String> = (0..n)
        .map(|i| format!("{{\"id\": \"q{i}\", \"prompt\": \"Count to {i}.\"}}\n"))
        .collect();
    std::fs::write(dir.join("prompts.jsonl"), lines.concat()).unwrap();
    let p = |name: &str| dir.join(name).display().to_string();
    let (prompts, data, w) = (p("prompts.jsonl"), p("data"), p("w"));
    ok(&[
        "distill-data",
        "--model",
        "tiny",
        "--prompts",
        &prompts,
        "--out",
        &data,
        "--max-new-tokens",
        "12",
    ]);
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &w]);
    (data, w)
}

/// Greedy decoding does not depend on the draft gate, so it is timed once, beside every gate's
/// steps, and every gate's policies are priced against that one step: the report's greedy cost is
/// the same at every gate, and a fixed chain of `k` drafts (each round `k` proposing steps, a
/// feeding step and a verification of `k + 1` rows) predicts tokens per round x that greedy step
/// / its round's cost.
#[test]
fn tune_drafting_prices_every_gate_against_one_greedy_step() {
    let dir = tempfile::tempdir().unwrap();
    let (data, w) = tiny_data_and_weights(dir.path(), 2);
    let report = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &w,
        "--data",
        &data,
        "--families",
        "chain",
        "--max-draft",
        "2",
        "--thresholds",
        "0.5",
        "--prompt-lookup",
        "0",
        "--repeats",
        "3",
        "--json",
    ])
    .json();
    let costs = report["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 3, "{report}");
    let greedy = costs[0]["costs"]["greedy"].as_f64().unwrap();
    for c in costs {
        assert_eq!(c["engine"], "reference", "{c}");
        assert_eq!(c["costs"]["greedy"].as_f64(), Some(greedy), "{report}");
    }
    let fixed: Vec<&Value> = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["family"] == "chain" && p["dynamic_draft"].is_null())
        .collect();
    assert_eq!(fixed.len(), 3 * 2, "{report}");
    for p in fixed {
        let k = p["draft_len"].as_u64().unwrap() as usize;
        let c = &costs[p["draft_gate"].as_u64().unwrap() as usize - 1]["costs"];
        let at = |key: &str| c[key].as_f64().unwrap();
        let round = k as f64 * at("propose") + at("feed") + c["verify"][k].as_f64().unwrap();
        let want = p["tokens_per_round"].as_f64().unwrap() * greedy / round;
        let got = p["speedup_reference"].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-9 * want, "{p}: {got} != {want}");
    }
}

/// `--write DIR` must hold the weights tuned (the --m2r2 folder, or a copy of it): other weights
/// are refused before any tracing, naming both folders, and left as they were; a copy is written.
#[test]
fn tune_drafting_writes_only_the_weights_it_tuned() {
    let dir = tempfile::tempdir().unwrap();
    let (data, w) = tiny_data_and_weights(dir.path(), 1);
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (other, one_gate, copy) = (p("other"), p("one-gate"), p("copy"));
    ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        "2",
        "--out",
        &other,
    ]);
    ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        "1",
        "--gates",
        "4",
        "--out",
        &one_gate,
    ]);
    let tune = |write: &str| {
        let args = [
            "tune-drafting",
            "--model",
            "tiny",
            "--m2r2",
            &w,
            "--data",
            &data,
            "--families",
            "chain",
            "--max-draft",
            "1",
            "--thresholds",
            "0.5",
            "--prompt-lookup",
            "0",
            "--repeats",
            "1",
            "--write",
            write,
        ];
        super::m2r2(&args)
    };
    for target in [&other, &one_gate] {
        let before = std::fs::read(Path::new(target).join("m2r2_config.json")).unwrap();
        let run = tune(target);
        assert_eq!(run.code, Some(1), "{}", run.stderr);
        for needle in [
            format!("--write {target} holds other M2R2 weights"),
            format!("--m2r2 {w}"),
        ] {
            assert!(run.stderr.contains(&needle), "{needle}: {}", run.stderr);
        }
        // refused before the traces
        assert!(!run.stderr.contains("trace gate"), "{}", run.stderr);
        let after = std::fs::read(Path::new(target).join("m2r2_config.json")).unwrap();
        assert_eq!(before, after, "{target} was changed");
    }
    // a copy of the tuned weights, and the tuned folder itself under another spelling
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&w).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), Path::new(&copy).join(entry.file_name())).unwrap();
    }
    for target in [copy, format!("{}/./w", dir.path().display())] {
        let run = tune(&target);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(
            run.stderr.contains("wrote chain: draft gate"),
            "{}",
            run.stderr
        );
    }
}

/// Flags out of range are refused before the model's work: `--repeats` beyond the model's context
/// (no overflow, no message from deep inside the timings), `--thresholds` outside [0, 1],
/// `--top 0`; `--top N` limits every table of policies.
#[test]
fn tune_drafting_checks_flags_and_limits_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let (data, w) = tiny_data_and_weights(dir.path(), 1);
    let tune = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "tune-drafting",
            "--model",
            "tiny",
            "--m2r2",
            &w,
            "--data",
            &data,
            "--max-draft",
            "2",
            "--prompt-lookup",
            "0,2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let refused = |extra: &[&str], needles: &[&str]| {
        let args = tune(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = fails(&args, needles);
        assert!(!run.stderr.contains("trace gate"), "{}", run.stderr);
    };
    for repeats in ["18446744073709551615", "1000000000"] {
        refused(
            &["--repeats", repeats],
            &[&format!("--repeats {repeats}"), "context of"],
        );
    }
    refused(
        &["--thresholds=-1"],
        &["--thresholds must lie in [0, 1]", "-1"],
    );
    refused(
        &["--thresholds", "0.5,2"],
        &["--thresholds must lie in [0, 1]", "2"],
    );
    refused(&["--top", "0"], &["--top must be at least 1"]);

    let args = tune(&["--thresholds", "0.5", "--repeats", "1", "--top", "2"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = ok(&args);
    // each table of policies: its header row, then at most --top rows
    let tables: Vec<usize> = run
        .stdout
        .split("| draft gate | drafting |")
        .skip(1)
        .map(|table| {
            table
                .lines()
                .skip(2)
                .take_while(|l| l.starts_with('|'))
                .count()
        })
        .collect();
    assert_eq!(tables, [2, 2], "{}", run.stdout);
    assert!(
        run.stdout.contains("by family") && run.stdout.contains("(the best 2 of "),
        "{}",
        run.stdout
    );
}
