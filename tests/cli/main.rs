//! End-to-end tests of the `m2r2` binary on the built-in models and on small checkpoint folders
//! written here (no network, no downloaded files). Every failure case must exit non-zero with a
//! helpful message on stderr and never panic.

use serde_json::Value;
use std::process::Command;

/// One finished run of the binary.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", self.stdout))
    }
}

fn m2r2(args: &[&str]) -> Run {
    m2r2_env(args, &[])
}

/// [`m2r2`] with extra environment variables (later ones override earlier ones).
fn m2r2_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Run {
    // An empty cache, so nothing on this machine changes what the tests see.
    let cache = std::env::temp_dir().join("m2r2-cli-tests-empty-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_m2r2"))
        .args(args)
        .env("M2R2_CACHE", &cache)
        // ONNX Runtime from the real cache (the empty one would make the binary download it).
        .env("ORT_DYLIB_PATH", run::onnxruntime())
        .env("RAYON_NUM_THREADS", "2")
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "m2r2 {args:?} panicked:\n{}",
        run.stderr
    );
    run
}

/// Run and require success.
fn ok(args: &[&str]) -> Run {
    let run = m2r2(args);
    assert_eq!(run.code, Some(0), "m2r2 {args:?} failed:\n{}", run.stderr);
    run
}

/// Run and require failure with every `needle` in stderr.
fn fails(args: &[&str], needles: &[&str]) -> Run {
    let run = m2r2(args);
    assert!(
        matches!(run.code, Some(c) if c != 0),
        "m2r2 {args:?} should fail:\n{}",
        run.stdout
    );
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "m2r2 {args:?}: stderr should contain {needle:?}:\n{}",
            run.stderr
        );
    }
    run
}

/// Run with the real m2r2 cache (SmolLM2 and its shipped weights, where scripts/test.sh fetched
/// them) and require success.
fn smollm2_ok(args: &[&str]) -> Run {
    let cache = reference::io::hub::cache_dir();
    let run = m2r2_env(args, &[("M2R2_CACHE", cache.as_os_str())]);
    assert_eq!(
        run.code,
        Some(0),
        "m2r2 {args:?} failed (run `m2r2 fetch smollm2` first):\n{}",
        run.stderr
    );
    run
}

fn generate_json(args: &[&str]) -> Value {
    let mut all = vec!["generate", "--json"];
    all.extend_from_slice(args);
    ok(&all).json()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

mod analyze;
mod arguments;
mod bridge;
mod distill;
mod draft_head;
mod export;
mod generate;
mod golden;
mod golden_deploy;
mod golden_m2r2;
mod golden_m2r2_onnx;
mod golden_python;
mod golden_sabotage;
mod golden_tree;
mod gpu_script;
mod graph_identity;
mod info_bench;
mod info_onnx;
mod m2r2_modes;
mod models;
mod moe_sim;
mod prompts;
mod replace_weights;
mod run;
mod static_python;
mod train;
mod train_checkpoints;
mod train_ranks;
mod tree;
mod tree_onnx;
mod tune_drafting;
