//! The fuzzers' findings, one test each: the crash file (kept in fuzz/regressions/ and replayed by
//! fuzz_replay.rs) and what the loader must say about it now. docs/TESTING.md "Hostile inputs and
//! fuzzing" lists them with dates and commands.

use m2r2_tests::hostile::{Target, run, write_valid_folder};
use std::path::{Path, PathBuf};

fn regression(target: Target, name: &str) -> Vec<u8> {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target.name())
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// gguf_model, 2026-11-25: `llama.block_count` = 50 331 649 in a 12 KB file; the weights loader
/// preallocated a `Vec` of that many layers (out of memory, 2.7 GB at the fuzzer's limit). Now the
/// layers grow as their tensors are found, and the first missing one is named.
#[test]
fn gguf_layer_count_beyond_the_tensors() {
    let input = regression(Target::GgufModel, "oom-block-count-50331649");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &input[1..]).unwrap();
    let Err(err) = reference::io::load::load_gguf(&path) else {
        panic!("a 1-layer file claiming 50 331 649 layers loads");
    };
    let err = err.to_string();
    assert!(
        err.contains("model.gguf")
            && err.contains("num_hidden_layers = 50331649")
            && err.contains("the weights have 11"),
        "{err}"
    );
    assert!(!run(Target::GgufModel, &input));
}

/// A HF folder whose `config.json` (a few hundred bytes) claims 2^40 layers or experts beside
/// real weights: refused before anything is sized by the counts, naming the file and the count.
/// A context of 2^32 positions (the most accepted, `MAX_CONTEXT`) loads: nothing is sized by it
/// any more (the RoPE table stops at `ROPE_TABLE_POSITIONS`); 2^40 is refused by name.
#[test]
fn hf_config_counts_are_bounded_by_the_weights() {
    let fixture = m2r2_tests::fixture_dir().join("hf/llama_gqa_tied");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    let with = |key: &str, value: serde_json::Value| {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config.clone();
        c[key] = value;
        std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
        std::fs::copy(
            fixture.join("model.safetensors"),
            dir.path().join("model.safetensors"),
        )
        .unwrap();
        let loaded = reference::io::checkpoint::load_hf_dir(dir.path());
        (dir, loaded)
    };
    let (_dir, loaded) = with("num_hidden_layers", serde_json::json!(1u64 << 40));
    let err = loaded.expect_err("refused").to_string();
    assert!(
        err.contains("config.json") && err.contains("num_hidden_layers = 1099511627776"),
        "{err}"
    );
    let (_dir, loaded) = with("max_position_embeddings", serde_json::json!(1u64 << 40));
    let err = loaded.expect_err("refused").to_string();
    assert!(
        err.contains("config.json") && err.contains("more than the 4294967296 positions"),
        "{err}"
    );
    let (_dir, loaded) = with("max_position_embeddings", serde_json::json!(1u64 << 32));
    let model = loaded.expect("the longest context loads");
    assert_eq!(model.context_length(), 1 << 32);
    let mut cache = model.new_cache(8).unwrap();
    let out = model.forward(&[1, 2, 3], &mut cache).unwrap();
    assert_eq!(out.logits.nrows(), 3);
}

/// export_folder, 2026-11-25: a `tokenizer.json` with a control character inside a string of its
/// `decoder` section made the tokenizers crate (0.23.2) panic (`expect("Helper")` in its decoder
/// deserialiser; upstream huggingface/tokenizers#2151 lists more such panics). Now JSON syntax is
/// checked first, and every call into tokenizers that parses or runs a file-made pipeline turns
/// a panic inside it into an error naming the file.
#[test]
fn tokenizers_crate_panic_on_a_malformed_decoder() {
    let input = regression(
        Target::ExportFolder,
        "crash-tokenizers-decoder-expect-helper",
    );
    assert!(!run(Target::ExportFolder, &input));
    // the file it replaces is tokenizer.json (index 2 of m2r2_export.json, draft_head.json,
    // tokenizer.json, tokenizer_config.json, sorted)
    let seeds = m2r2_tests::hostile::seeds(Target::ExportFolder);
    assert_eq!(
        seeds[usize::from(input[0]) % seeds.len()].0,
        "tokenizer.json"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, &input[1..]).unwrap();
    let err = reference::io::tokenizer::Tokenizer::from_file(&path)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("tokenizer.json: not valid JSON"), "{err}");
}

/// The guard itself, on a panic of tokenizers 0.23 behind valid JSON (from upstream
/// huggingface/tokenizers#2156: a `Precompiled` normalizer with an invalid charsmap hits
/// `.expect("Precompiled")`): an error naming the file, no panic.
#[test]
fn tokenizers_crate_panic_behind_valid_json() {
    let tok = reference::io::tokenizer::Tokenizer::byte_level_builtin(320).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&tok.backend().to_string(false).unwrap()).unwrap();
    json["normalizer"] =
        serde_json::json!({"type": "Precompiled", "precompiled_charsmap": "not base64 !"});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let err = reference::io::tokenizer::Tokenizer::from_file(&path)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("a panic inside it: Precompiled"),
        "{err}"
    );
}

/// Review, 2026-11-26: file names that one file gives for its siblings (a sharded checkpoint's
/// `weight_map`, an export manifest's `graphs` and `draft_head_file`) were joined to the folder
/// unchecked, so `../x` or `/etc/x` read outside the folder the user named. Now each must be a
/// plain name in the folder; anything else is refused, naming the file and the field.
#[test]
fn sibling_file_names_stay_in_the_folder() {
    let edit_json = |path: &Path, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(path, v.to_string()).unwrap();
    };
    for bad in [
        "../model-00001-of-00002.safetensors",
        "/etc/passwd",
        "sub/x",
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_valid_folder(Target::HfSharded, dir.path());
        let index = dir.path().join("model.safetensors.index.json");
        edit_json(&index, &|v| {
            let map = v["weight_map"].as_object_mut().unwrap();
            let first = map.keys().next().unwrap().clone();
            map[&first] = bad.into();
        });
        let Err(err) = reference::io::checkpoint::load_hf_dir(dir.path()) else {
            panic!("weight_map entry {bad:?} loads");
        };
        let err = err.to_string();
        assert!(
            err.contains("model.safetensors.index.json")
                && err.contains("weight_map entry of")
                && err.contains("not a file name"),
            "{err}"
        );
    }
    let export = |edit: &dyn Fn(&mut serde_json::Value)| {
        let dir = tempfile::tempdir().unwrap();
        write_valid_folder(Target::ExportFolder, dir.path());
        edit_json(&dir.path().join("m2r2_export.json"), edit);
        let err = onnx_runner::manifest::ExportDir::open(dir.path())
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("m2r2_export.json") && err.contains("not a file name"),
            "{err}"
        );
        err
    };
    let err = export(&|v| v["graphs"]["model"] = "../model.onnx".into());
    assert!(err.contains("graphs.model"), "{err}");
    let err = export(&|v| v["draft_head_file"] = "/tmp/draft_head.json".into());
    assert!(err.contains("draft_head_file"), "{err}");
    // the valid folders still load
    let dir = tempfile::tempdir().unwrap();
    write_valid_folder(Target::ExportFolder, dir.path());
    onnx_runner::manifest::ExportDir::open(dir.path()).expect("the valid export opens");
    let dir = tempfile::tempdir().unwrap();
    write_valid_folder(Target::HfSharded, dir.path());
    reference::io::checkpoint::load_hf_dir(dir.path()).expect("the valid shards load");
}
