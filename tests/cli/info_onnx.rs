//! `info --onnx` fails on what `run` refuses: a graph whose `m2r2.*` metadata say it belongs to
//! another export (another model config, M2R2 weights, weights dtype or draft gate; a graph
//! listed under another kind), and a manifest that lists no graph, listing every contradiction of
//! a graph; and it never prints the manifest's weights dtype or static cache length as fact when
//! the graphs hold another.

use super::{fails, ok};
use serde_json::Value;
use std::path::Path;

/// Export `model` with `extra` flags into `dir/name`.
fn export(dir: &Path, name: &str, extra: &[&str]) -> String {
    let out = dir.join(name).display().to_string();
    ok(&[&["export", "--out", &out][..], extra].concat());
    out
}

/// A copy of export `from` named `name`, changed by `edit` (given the copy's folder).
fn copy(dir: &Path, from: &str, name: &str, edit: &dyn Fn(&Path)) -> String {
    let out = dir.join(name);
    std::fs::create_dir(&out).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
    }
    edit(&out);
    out.display().to_string()
}

/// Change the manifest of folder `dir`.
fn edit_manifest(dir: &Path, edit: impl Fn(&mut Value)) {
    let path = dir.join("m2r2_export.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, m.to_string()).unwrap();
}

/// `info --onnx dir --json` fails with exit code 1 and every needle in one of its `problems`
/// (stderr repeats the first); returns the JSON description it printed.
fn contradicted(dir: &str, needles: &[&str]) -> Value {
    let run = fails(&["info", "--onnx", dir, "--json"], &["error: ", dir]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let info = run.json();
    let problems = info["problems"].as_array().unwrap();
    for needle in needles {
        assert!(
            problems
                .iter()
                .any(|p| p.as_str().unwrap().contains(needle)),
            "{dir}: no problem says {needle:?}: {problems:#?}"
        );
    }
    info
}

#[test]
fn info_onnx_fails_on_a_graph_of_another_export() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tiny = export(dir, "tiny", &["--model", "tiny"]);
    let sound = ok(&["info", "--onnx", &tiny, "--json"]).json();
    assert_eq!(sound["problems"], serde_json::json!([]), "{sound}");
    assert_eq!(sound["weights_dtype"], "f32");
    for g in sound["graphs"].as_array().unwrap() {
        assert_eq!(g["weights_dtype"], "f32", "{g}");
    }
    // one graph copied in from an export of other config, weights, dtype or draft gate
    let others = [
        (
            "moe",
            &["--model", "tiny-moe"][..],
            "verifier.onnx",
            "model config (hash)",
        ),
        (
            "zero",
            &["--m2r2", "none"][..],
            "draft.onnx",
            "M2R2 weights (hash)",
        ),
        (
            "f16",
            &["--weights-dtype", "f16"][..],
            "feed.onnx",
            "weights dtype is f16",
        ),
        (
            "gate2",
            &["--draft-gate", "2"][..],
            "draft.onnx",
            "draft gate is 2",
        ),
    ];
    for (name, flags, graph, said) in others {
        let other = export(
            dir,
            name,
            &[&["--graphs", "draft,verifier,feed"][..], flags].concat(),
        );
        let mixed = copy(dir, &tiny, &format!("mixed-{name}"), &|d| {
            std::fs::copy(Path::new(&other).join(graph), d.join(graph)).unwrap();
        });
        contradicted(
            &mixed,
            &[&format!(
                "{mixed}/{graph}: this graph is not the one m2r2_export.json describes: its {said}"
            )],
        );
    }
    // the manifest naming another graph under a kind
    let swapped = copy(dir, &tiny, "swapped", &|d| {
        edit_manifest(d, |m| {
            m["graphs"]["draft"] = "verifier.onnx".into();
            m["graphs"]["verifier"] = "draft.onnx".into();
        })
    });
    contradicted(
        &swapped,
        &[
            "verifier.onnx: this graph is not the one m2r2_export.json describes: its graph kind \
             is verifier, the manifest's is draft",
            "draft.onnx: this graph is not the one m2r2_export.json describes: its graph kind is \
             draft, the manifest's is verifier",
        ],
    );
    let model = copy(dir, &tiny, "model-is-draft", &|d| {
        edit_manifest(d, |m| m["graphs"]["model"] = "draft.onnx".into())
    });
    contradicted(
        &model,
        &[
            "its graph kind is draft, the manifest's is model",
            "genai_config.json: onnxruntime-genai loads model.onnx, but",
        ],
    );
}

#[test]
fn info_onnx_fails_on_a_manifest_the_graphs_contradict() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tiny = export(dir, "tiny", &["--model", "tiny"]);
    // weights_dtype edited: the graphs' own dtype is shown, the manifest's is not taken as fact
    let dtype = copy(dir, &tiny, "dtype", &|d| {
        edit_manifest(d, |m| m["weights_dtype"] = "f16".into())
    });
    let info = contradicted(&dtype, &["its weights dtype is f32, the manifest's is f16"]);
    assert_eq!(info["problems"].as_array().unwrap().len(), 4, "{info}");
    assert_eq!(info["weights_dtype"], Value::Null, "{info}");
    assert_eq!(info["manifest_weights_dtype"], "f16", "{info}");
    let text = fails(&["info", "--onnx", &dtype], &["weights dtype is f32"]).stdout;
    assert!(!text.contains("), f16 weights\n"), "{text}");
    assert!(
        text.contains(
            "f16 weights by the manifest, but model.onnx, draft.onnx, verifier.onnx, feed.onnx \
             hold f32"
        ),
        "{text}"
    );
    // no graph at all: nothing could run it, and genai_config.json names a graph it lacks
    let empty = copy(dir, &tiny, "no-graphs", &|d| {
        edit_manifest(d, |m| m["graphs"] = serde_json::json!({}))
    });
    contradicted(
        &empty,
        &[
            "m2r2_export.json: `graphs` lists no graph",
            "onnxruntime-genai loads model.onnx, but",
            "lists no model graph",
        ],
    );
    let text = fails(&["info", "--onnx", &empty], &["problems"]).stdout;
    assert!(
        text.contains("graphs        none (the manifest lists no graph)"),
        "{text}"
    );
}

/// A static f16 model.onnx of L = 32 copied into a static f32 export of L = 64: both
/// contradictions are problems (the dtype the model line points at among them), and the table
/// shows the L the graph holds.
#[test]
fn info_onnx_lists_every_contradiction_of_a_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s64 = export(dir, "s64", &["--model", "tiny", "--static-cache", "64"]);
    let s32 = export(
        dir,
        "s32",
        &[
            "--model",
            "tiny",
            "--static-cache",
            "32",
            "--weights-dtype",
            "f16",
            "--graphs",
            "model",
        ],
    );
    let mixed = copy(dir, &s64, "mixed", &|d| {
        std::fs::copy(Path::new(&s32).join("model.onnx"), d.join("model.onnx")).unwrap();
    });
    let info = contradicted(
        &mixed,
        &[
            &format!(
                "{mixed}/model.onnx: m2r2_export.json says static_cache.l_max = 64, but the \
                 graph's `past_key_values.0.key` holds 32 positions"
            ),
            &format!(
                "{mixed}/model.onnx: this graph is not the one m2r2_export.json describes: its \
                 weights dtype is f16, the manifest's is f32"
            ),
        ],
    );
    assert_eq!(info["problems"].as_array().unwrap().len(), 2, "{info}");
    let graphs = info["graphs"].as_array().unwrap();
    assert_eq!(graphs[0]["kv_cache"]["l_max"], 32, "{info}");
    assert_eq!(graphs[1]["kv_cache"]["l_max"], 64, "{info}");
    let text = fails(&["info", "--onnx", &mixed], &["has 2 problems"]).stdout;
    assert!(
        text.contains("f32 weights by the manifest, but model.onnx holds f16 (see the problems)"),
        "{text}"
    );
    let model_row = text
        .lines()
        .find(|l| l.starts_with("model     model.onnx"))
        .unwrap();
    assert!(model_row.ends_with("static, L = 32"), "{text}");
    assert!(
        text.contains(
            "positions, written in place (opset 24) by the manifest, but a graph holds \
             another (see the problems)"
        ),
        "{text}"
    );
}
