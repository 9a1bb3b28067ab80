//! Token-tree speculative goldens (docs/GOLDEN.md, docs/m2r2/trees.md): `golden write --mode
//! speculative --draft-tree W1,W2,...` and `golden check` on the reference and on ONNX Runtime
//! (dynamic and static exports), a tampered file and broken graphs reported where they differ,
//! and older goldens (the committed version 1 and 2 fixtures, a version 3 chain) still checking
//! beside a tree golden.

use super::{fails, m2r2, ok};
use m2r2_tests::sabotage::{TINY_TARGETS, sabotage_export};
use safetensors::Dtype;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tree of these tests: 7 nodes, the root and drafts 1..=6 (3 of them propose: 0, 1, 2 and
/// the two at depth 2, 3 and 4, so 5 proposing nodes).
const TREE: &str = "2,1,1";
const NODES: usize = 7;

/// The committed goldens of older format versions: the fuzz seeds of the golden reader, written
/// by m2r2 before format 3 (versions 1 and 2; `scripts/fuzz.sh --seeds` would rewrite them as
/// today's, still older than a tree golden).
fn older_fixtures() -> [PathBuf; 2] {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/golden");
    [
        dir.join("greedy.golden.safetensors"),
        dir.join("speculative.golden.safetensors"),
    ]
}

/// tiny exported twice into `dir`: the default (dynamic) export and a static one of 64 positions.
fn tiny_exports(dir: &Path) -> (String, String) {
    let p = |name: &str| dir.join(name).display().to_string();
    let (onnx, onnx_static) = (p("onnx"), p("onnx-static"));
    ok(&["export", "--model", "tiny", "--out", &onnx]);
    ok(&[
        "export",
        "--model",
        "tiny",
        "--static-cache",
        "64",
        "--out",
        &onnx_static,
    ]);
    (onnx, onnx_static)
}

fn write_tree(out: &str, steps: &str, extra: &[&str]) {
    let mut args = vec![
        "golden",
        "write",
        "--model",
        "tiny",
        "--tokens",
        "1,2,3",
        "--steps",
        steps,
        "--mode",
        "speculative",
        "--draft-tree",
        TREE,
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    ok(&args);
}

/// Set one element of the I64 `tensor`, or move one of the F32 `tensor` by `delta`.
fn edit_i64(path: &str, tensor: &str, index: usize, value: i64) {
    super::golden::edit_tensor(Path::new(path), tensor, |dtype, data| {
        assert_eq!(dtype, Dtype::I64);
        data[8 * index..8 * index + 8].copy_from_slice(&value.to_le_bytes());
    });
}

fn nudge_f32(path: &str, tensor: &str, index: usize, delta: f32) {
    super::golden::edit_tensor(Path::new(path), tensor, |dtype, data| {
        assert_eq!(dtype, Dtype::F32);
        let at = 4 * index;
        let v = f32::from_le_bytes(data[at..at + 4].try_into().unwrap()) + delta;
        data[at..at + 4].copy_from_slice(&v.to_le_bytes());
    });
}

fn read_i64(path: &str, tensor: &str) -> Vec<i64> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor(tensor)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn names(report: &Value, key: &str) -> Vec<String> {
    report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[key].as_str().unwrap().to_string())
        .collect()
}

/// The report line of `graph tensor`.
fn line<'a>(stdout: &'a str, graph: &str, tensor: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(graph) && l.split_whitespace().nth(1) == Some(tensor))
        .unwrap_or_else(|| panic!("no line {graph} {tensor}:\n{stdout}"))
}

#[test]
fn tree_goldens_write_and_check_on_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let golden = p("tree.golden.safetensors");
    write_tree(&golden, "12", &[]);

    let run = ok(&["golden", "check", &golden]);
    assert!(
        run.stdout.contains("token tree 2,1,1 (7 nodes)") && run.stdout.contains("format 4"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("overall: OK") && !run.stdout.contains("NOT OK"),
        "{}",
        run.stdout
    );
    let report = ok(&["golden", "check", &golden, "--json"]).json();
    assert_eq!(
        (&report["ok"], &report["format_version"]),
        (&Value::from(true), &Value::from(4))
    );
    assert_eq!(report["draft_tree"], serde_json::json!([2, 1, 1]));
    assert_eq!(
        names(&report, "name"),
        [
            "tokens",
            "rounds",
            "logits",
            "verify_logits",
            "draft_logits"
        ]
    );

    // refused before anything is written: a tree outside speculative decoding, beside a draft
    // length, a shape that is no tree
    let refused = p("refused.safetensors");
    let base = [
        "golden", "write", "--tokens", "1,2", "--steps", "4", "--out", &refused,
    ];
    for (extra, needle) in [
        (
            &["--draft-tree", "2,1"][..],
            "--draft-tree drafts token trees for speculative decoding: add --mode speculative",
        ),
        (
            &[
                "--mode",
                "speculative",
                "--draft-tree",
                "2,1",
                "--draft-len",
                "2",
            ],
            "--draft-tree and --draft-len both set the drafts",
        ),
        (
            &["--mode", "speculative", "--draft-tree", "2,0"],
            "--draft-tree: token tree 2,0: the width at depth 2 is 0",
        ),
    ] {
        fails(&[&base[..], extra].concat(), &[needle]);
        assert!(!Path::new(&refused).exists(), "nothing is written");
    }

    // a verified row of round 1, node 5 (off or on the accepted path: every node is checked)
    let tampered = p("logits.golden.safetensors");
    std::fs::copy(&golden, &tampered).unwrap();
    let row = 1 + NODES + 5;
    nudge_f32(&tampered, "verify_logits", row * 320 + 9, 0.5);
    let run = fails(&["golden", "check", &tampered], &["NOT OK"]);
    let verify = line(&run.stdout, "reference", "verify_logits");
    assert!(
        verify.contains("NOT OK")
            && verify.contains(&format!(
                "first over tolerance at verified row {row} (round 1, node 5)"
            )),
        "{}",
        run.stdout
    );
    for tensor in ["tokens", "rounds", "logits", "draft_logits"] {
        assert!(
            line(&run.stdout, "reference", tensor).contains(" OK "),
            "{tensor}:\n{}",
            run.stdout
        );
    }
    let report = m2r2(&["golden", "check", &tampered, "--json"]).json();
    let e = &report["entries"][3];
    assert_eq!(
        (&e["first_round"], &e["first_node"]),
        (&1.into(), &5.into())
    );

    // an edited round: one line, at the round, naming what differs
    let tampered = p("rounds.golden.safetensors");
    std::fs::copy(&golden, &tampered).unwrap();
    let leaf = read_i64(&tampered, "round_tree_tokens")[NODES + 6];
    edit_i64(&tampered, "round_tree_tokens", NODES + 6, (leaf + 1) % 320);
    let run = fails(&["golden", "check", &tampered], &["NOT OK"]);
    let rounds = line(&run.stdout, "reference", "rounds");
    assert!(
        rounds.contains("first divergence at round 1: node 6 (depth 3) token golden")
            && rounds.contains(&format!("({}) vs recomputed", (leaf + 1) % 320))
            && rounds.contains(&format!("({leaf})")),
        "{}",
        run.stdout
    );

    // a file that does not agree with its tree: not checked (exit 2), naming the tensor
    let bad = p("bad.golden.safetensors");
    std::fs::copy(&golden, &bad).unwrap();
    edit_i64(&bad, "round_node", 0, NODES as i64);
    let run = m2r2(&["golden", "check", &bad]);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("tensor `round_node`: round 0 accepts node 7, the tree has nodes 0..7"),
        "{}",
        run.stderr
    );

    // older goldens still check, beside the tree golden, in one suite
    let suite = p("suite");
    std::fs::create_dir(&suite).unwrap();
    std::fs::copy(&golden, format!("{suite}/tree.golden.safetensors")).unwrap();
    for old in older_fixtures() {
        std::fs::copy(&old, Path::new(&suite).join(old.file_name().unwrap())).unwrap();
    }
    ok(&[
        "golden",
        "write",
        "--tokens",
        "1,2,3",
        "--steps",
        "12",
        "--mode",
        "speculative",
        "--draft-len",
        "3",
        "--out",
        &format!("{suite}/chain.golden.safetensors"),
    ]);
    let report = ok(&["golden", "check", &suite, "--json"]).json();
    let versions: Vec<(String, u64)> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert_eq!(f["ok"], true, "{f}");
            let file = f["file"].as_str().unwrap();
            let name = Path::new(file).file_name().unwrap().to_string_lossy();
            (name.into_owned(), f["format_version"].as_u64().unwrap())
        })
        .collect();
    let names: Vec<&str> = versions.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "chain.golden.safetensors",
            "greedy.golden.safetensors",
            "speculative.golden.safetensors",
            "tree.golden.safetensors"
        ]
    );
    // a chain is still written as version 3, the fixtures are older, the tree is version 4
    assert_eq!((versions[0].1, versions[3].1), (3, 4));
    assert!(versions[1].1 < 3 && versions[2].1 < 4, "{versions:?}");
}

#[test]
fn tree_goldens_on_onnx_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (onnx, onnx_static) = tiny_exports(dir.path());
    let golden = p("tree.golden.safetensors");
    write_tree(&golden, "12", &["--expect-dtype", "f32"]);

    // dynamic and static exports: every line OK, each naming the graph that recomputed it
    for export in [&onnx, &onnx_static] {
        let report = ok(&["golden", "check", &golden, "--onnx", export, "--json"]).json();
        assert_eq!(report["ok"], true, "{report}");
        assert_eq!(
            names(&report, "name"),
            [
                "tokens",
                "rounds",
                "logits",
                "verify_logits",
                "draft_logits"
            ]
        );
        assert_eq!(
            names(&report, "graph"),
            [
                "feed+draft+verifier.onnx",
                "feed+draft+verifier.onnx",
                "model.onnx",
                "verifier.onnx",
                "draft.onnx"
            ]
        );
    }
    // a tree the static buffers cannot hold: not checked, the limits named
    let long = p("long.golden.safetensors");
    write_tree(&long, "80", &["--ignore-eos"]);
    let run = m2r2(&["golden", "check", &long, "--onnx", &onnx_static]);
    assert_eq!(run.code, Some(2), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("need 88 positions, 24 more than the static KV buffers hold (L = 64)"),
        "{}",
        run.stderr
    );

    // a broken graph fails its own line, never passes: model.onnx's logits, the verifier's
    // rows of every node, the draft's proposals
    let caught = ["logits", "verify_logits", "draft_logits"];
    for (target, tensor) in TINY_TARGETS.iter().zip(caught) {
        let broken = p(&format!("broken-{}", target.graph));
        sabotage_export(
            Path::new(&onnx),
            Path::new(&broken),
            target.graph,
            target.initializer,
            target.how,
        )
        .unwrap();
        let run = m2r2(&["golden", "check", &golden, "--onnx", &broken, "--json"]);
        assert_eq!(
            run.code,
            Some(1),
            "{} sabotaged: {}",
            target.graph,
            run.stdout
        );
        let report = run.json();
        let entries = report["entries"].as_array().unwrap();
        let e = entries
            .iter()
            .find(|e| e["graph"] == target.graph && e["name"] == tensor)
            .unwrap_or_else(|| panic!("no {} {tensor}: {report}", target.graph));
        assert_eq!(e["status"], "NOT OK", "{e}");
        assert!(e["max_abs"].as_f64().unwrap() > 1e-3, "{e}");
        let first = e["first"].as_str().unwrap();
        assert!(
            e["description"]
                .as_str()
                .unwrap()
                .starts_with(&format!("first over tolerance at {first}")),
            "{e}"
        );
        if tensor != "logits" {
            // the row names its round and node (the prompt's verified row has neither)
            assert!(
                first.contains(", node ") || first == "verified row 0 (the prompt's)",
                "{e}"
            );
        }
        // every NOT OK line is the sabotaged graph's, or the decode it takes part in
        for e in entries.iter().filter(|e| e["status"] == "NOT OK") {
            let graph = e["graph"].as_str().unwrap();
            assert!(
                graph == target.graph || graph == "feed+draft+verifier.onnx",
                "{} sabotaged: {e}",
                target.graph
            );
        }
        std::fs::remove_dir_all(&broken).unwrap();
    }

    // older goldens on the same export, beside the tree golden
    let suite = p("suite");
    std::fs::create_dir(&suite).unwrap();
    std::fs::copy(&golden, format!("{suite}/tree.golden.safetensors")).unwrap();
    for old in older_fixtures() {
        std::fs::copy(&old, Path::new(&suite).join(old.file_name().unwrap())).unwrap();
    }
    let run = ok(&["golden", "check", &suite, "--onnx", &onnx]);
    assert!(
        run.stdout.contains("suite: 3 of 3 files OK"),
        "{}",
        run.stdout
    );
    // the header says once what an older file lacks
    assert!(
        run.stdout
            .contains("format 2, ran the whole budget (stop tokens recorded from version 3 on)"),
        "{}",
        run.stdout
    );
}

/// Trees that change from round to round (format version 5): `--draft-tree` grown per branch
/// (`--dynamic-draft`) with a `--prompt-lookup` branch, and a lookup branch beside the chain of
/// the draft length. Each checks on the reference and on ONNX Runtime (dynamic and static
/// exports) with the gate's scores; a broken verifier fails its own line; a lookup branch outside
/// speculative decoding is refused before anything is written.
#[test]
fn varying_tree_goldens_on_both_engines() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (onnx, onnx_static) = tiny_exports(dir.path());
    let write = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "golden",
            "write",
            "--model",
            "tiny",
            "--tokens",
            "1,2,3,4,1,2,3",
            "--steps",
            "20",
            "--mode",
            "speculative",
            "--json",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        ok(&args).json()
    };
    let grown = p("grown.golden.safetensors");
    let written = write(
        &grown,
        &[
            "--draft-tree",
            TREE,
            "--dynamic-draft",
            "--prompt-lookup",
            "3",
        ],
    );
    assert_eq!(written["format_version"], 5, "{written}");
    assert_eq!(written["prompt_lookup"], 3, "{written}");
    assert_eq!(written["tree_grown"]["gate"], "arla", "{written}");
    let chain = p("chain.golden.safetensors");
    let written = write(&chain, &["--draft-len", "2", "--prompt-lookup", "2"]);
    assert_eq!(
        (&written["draft_tree"], &written["tree_grown"]),
        (&serde_json::json!([1, 1]), &Value::Null),
        "{written}"
    );
    // the recorded rounds carry lookup branches and trees of more than one shape
    let parents = read_i64(&grown, "round_tree_parents");
    let lookup = read_i64(&grown, "round_lookup");
    assert!(lookup.iter().any(|&i| i > 0), "{lookup:?}");
    let rounds = read_i64(&grown, "round_node").len();
    let width = parents.len() / rounds;
    assert!(
        parents.chunks(width).any(|row| row != &parents[..width]),
        "every round grew the same tree: {parents:?}"
    );

    for golden in [&grown, &chain] {
        let run = ok(&["golden", "check", golden]);
        assert!(run.stdout.contains("format 5"), "{}", run.stdout);
        for export in [&onnx, &onnx_static] {
            let report = ok(&["golden", "check", golden, "--onnx", export, "--json"]).json();
            assert_eq!(report["ok"], true, "{report}");
            let mut want = vec![
                "tokens",
                "rounds",
                "logits",
                "verify_logits",
                "draft_logits",
            ];
            if golden == &grown {
                want.push("round_scores");
            }
            assert_eq!(names(&report, "name"), want, "{report}");
        }
    }
    let run = ok(&["golden", "check", &grown, "--onnx", &onnx]);
    assert!(
        run.stdout
            .contains("grown while arla >= 0.5, a lookup branch of up to 3 tokens"),
        "{}",
        run.stdout
    );
    assert!(
        line(&run.stdout, "draft.onnx", "round_scores").contains(" OK "),
        "{}",
        run.stdout
    );

    // a broken verifier: its rows of every node, lookup nodes included, fail its own line
    let target = &TINY_TARGETS[1];
    let broken = p("broken");
    sabotage_export(
        Path::new(&onnx),
        Path::new(&broken),
        target.graph,
        target.initializer,
        target.how,
    )
    .unwrap();
    let run = m2r2(&["golden", "check", &grown, "--onnx", &broken]);
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    let verify = line(&run.stdout, "verifier.onnx", "verify_logits");
    assert!(verify.contains("NOT OK"), "{}", run.stdout);
    // the line says which graphs it starts from (the export has feed.onnx)
    assert!(
        verify.contains("slow states (the hidden_states of draft.onnx or feed.onnx)"),
        "{verify}"
    );

    fails(
        &[
            "golden",
            "write",
            "--tokens",
            "1,2",
            "--prompt-lookup",
            "2",
            "--out",
            &p("refused.safetensors"),
        ],
        &["--prompt-lookup adds a branch to speculative drafts: add --mode speculative"],
    );
    assert!(!Path::new(&p("refused.safetensors")).exists());
}
