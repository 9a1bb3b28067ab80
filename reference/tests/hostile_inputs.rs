//! Hostile inputs (issue 16, first slice): valid files of the project's own fixtures, mutated at
//! random (bytes overwritten, bytes set to boundary values, truncated, JSON punctuation injected),
//! fed to the loaders' parsing entry points. Every outcome must be `Ok` or `Err`: a panic fails the
//! case (proptest shrinks it to a small mutation list and saves it in `proptest-regressions/`).
//!
//! A coverage-free mutation harness on proptest (docs/TESTING.md says why). CI runs 64 cases per
//! target; `scripts/fuzz.sh TARGET SECONDS` is not built yet, longer runs: `PROPTEST_CASES=100000
//! cargo test -p m2r2-reference --release --test hostile_inputs TARGET`.

use proptest::prelude::*;
use reference::golden::Golden;
use reference::io::gguf::reader::GgufFile;
use reference::m2r2::weights::M2r2Weights;
use reference::{Model, ModelConfig};
use std::path::{Path, PathBuf};

/// One edit of a file's bytes.
#[derive(Clone, Debug)]
enum Mutation {
    /// Overwrite the byte at `at` (modulo the length) with `value`.
    Set { at: usize, value: u8 },
    /// The same within the first 512 bytes, where headers and counts live.
    SetHead { at: usize, value: u8 },
    /// Cut the file at `at` (modulo the length, at least one byte kept).
    Truncate { at: usize },
    /// Put a JSON punctuation or digit character at `at` (modulo the first 1024 bytes).
    Json { at: usize, which: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        (
            any::<usize>(),
            prop_oneof![Just(0u8), Just(1), Just(0x7f), Just(0x80), Just(0xff)]
        )
            .prop_map(|(at, value)| Mutation::SetHead { at, value }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), any::<usize>()).prop_map(|(at, which)| Mutation::Json { at, which }),
    ]
}

fn mutate(bytes: &[u8], edits: &[Mutation]) -> Vec<u8> {
    const JSON: &[u8] = b"0123456789{}[],:\"-.e";
    let mut b = bytes.to_vec();
    for m in edits {
        let n = b.len();
        match *m {
            Mutation::Set { at, value } => b[at % n] = value,
            Mutation::SetHead { at, value } => b[at % n.min(512)] = value,
            Mutation::Truncate { at } => b.truncate((at % n).max(1)),
            Mutation::Json { at, which } => b[at % n.min(1024)] = JSON[which % JSON.len()],
        }
    }
    b
}

fn edits() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..6)
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(rel)
}

fn tiny() -> Model {
    reference::io::builtin::builtin("tiny").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// GGUF: header, metadata, tensor infos, and every tensor dequantised.
    #[test]
    fn gguf(edits in edits()) {
        let bytes = std::fs::read(fixture("gguf/quant_types.gguf")).unwrap();
        if let Ok(file) = GgufFile::from_bytes("hostile.gguf".into(), mutate(&bytes, &edits)) {
            for name in file.tensor_names() {
                let _ = file.tensor_f32(&name);
            }
        }
    }

    /// Golden files (safetensors with metadata).
    #[test]
    fn golden(edits in edits()) {
        let model = tiny();
        let golden = Golden::record_greedy(&model, "tiny", &[1, 2, 3], 3).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        golden.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, mutate(&bytes, &edits)).unwrap();
        let _ = Golden::read(&path);
    }

    /// HF `config.json` (transformers 4.x layout of a fixture).
    #[test]
    fn hf_config(edits in edits()) {
        let text = std::fs::read(fixture("hf/llama_gqa_tied/config.json")).unwrap();
        let mutated = String::from_utf8_lossy(&mutate(&text, &edits)).into_owned();
        let _ = ModelConfig::from_hf_json(&mutated, "config.json");
    }

    /// M2R2 weights folders: `m2r2_config.json`, the PEFT config and safetensors, ARLA.
    #[test]
    fn m2r2_folder(edits in edits(), which in 0usize..4) {
        let model = tiny();
        let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        weights.save_dir(dir.path()).unwrap();
        let name = ["m2r2_config.json", "adapter_config.json", "adapter_model.safetensors",
            "arla.safetensors"][which];
        let path = dir.path().join(name);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, mutate(&bytes, &edits)).unwrap();
        let _ = M2r2Weights::load_dir(dir.path(), &model.config);
    }
}
