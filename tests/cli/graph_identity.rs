//! The runner checks each graph it loads against the export's manifest, and stops where `generate`
//! does without the tokenizer (docs/ONNX.md, "Folder layout").

use super::{fails, ok};
use std::path::Path;

fn export(out: &Path, extra: &[&str]) {
    let out = out.to_str().unwrap();
    ok(&[
        &["export", "--out", out, "--graphs", "model,draft,verifier"],
        extra,
    ]
    .concat());
}

/// `run` on export `dir` in `mode`.
fn decode<'a>(dir: &'a Path, mode: &'a str) -> Vec<&'a str> {
    let dir = dir.to_str().unwrap();
    let prompt = ["--tokens", "100,200,300", "--max-new-tokens", "5"];
    [&["run", "--onnx", dir, "--mode", mode], &prompt[..]].concat()
}

/// A draft.onnx copied from an export of equal shapes ran and decoded wrong tokens: another
/// model's (tiny into tiny-moe: same widths, other weights) or other M2R2 weights.
#[test]
fn a_graph_from_another_export_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    export(&p("moe"), &["--model", "tiny-moe"]);
    export(&p("tiny"), &["--model", "tiny"]);
    export(&p("zero"), &["--model", "tiny", "--m2r2", "none"]);
    let (moe, tiny, zero) = (p("moe"), p("tiny"), p("zero"));
    ok(&decode(&moe, "speculative"));

    std::fs::copy(p("tiny/draft.onnx"), p("moe/draft.onnx")).unwrap();
    fails(
        &decode(&moe, "speculative"),
        &[
            "moe/draft.onnx",
            "not the one m2r2_export.json describes",
            "model config",
        ],
    );
    std::fs::copy(p("zero/draft.onnx"), p("tiny/draft.onnx")).unwrap();
    fails(
        &decode(&tiny, "speculative"),
        &["tiny/draft.onnx", "M2R2 weights", "m2r2.m2r2_hash"],
    );
    // a verifier is checked too, and greedy decoding's model.onnx
    std::fs::copy(p("zero/verifier.onnx"), p("zero/model.onnx")).unwrap();
    fails(
        &decode(&zero, "greedy"),
        &["zero/model.onnx", "graph kind is verifier"],
    );
}

/// A static export whose manifest lost its `static_cache` entry is refused by name, not with
/// ONNX Runtime's "input attn_mask was not given".
#[test]
fn a_static_graph_under_a_dynamic_manifest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    export(&out, &["--static-cache", "32"]);
    let path = out.join("m2r2_export.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest.as_object_mut().unwrap().remove("static_cache");
    std::fs::write(&path, manifest.to_string()).unwrap();
    fails(
        &decode(&out, "greedy"),
        &[
            "s/model.onnx",
            "static cache length is 32",
            "the manifest's is none",
        ],
    );
}

/// The manifest records the end tokens, so `run` stops where `generate` does without the
/// tokenizer (tiny-moe's end tokens are only in its tokenizer).
#[test]
fn run_stops_at_end_tokens_without_the_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("e");
    export(&out, &["--model", "tiny-moe"]);
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    let prompt = [
        "--tokens",
        "5,77,200,13,99,150,310",
        "--max-new-tokens",
        "30",
        "--json",
    ];
    let generated = ok(&[&["generate", "--model", "tiny-moe"], &prompt[..]].concat()).json();
    let run = ok(&[&["run", "--onnx", out.to_str().unwrap()], &prompt[..]].concat()).json();
    assert_eq!(generated["tokens"], run["tokens"]);
    let n = generated["tokens"].as_array().unwrap().len();
    assert!(
        n < 30,
        "the prompt must reach an end token before the budget ({n})"
    );
}
