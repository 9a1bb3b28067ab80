//! The fuzzers' findings (issue 16), one test each: the crash file (kept in fuzz/regressions/ and
//! replayed by fuzz_replay.rs) and what the loader must say about it now. docs/TESTING.md
//! "Fuzzing" lists them with dates and commands.

use m2r2_tests::hostile::{Target, run};
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
