//! Bad arguments are refused clearly, and `fetch` without python3 says what to install.

use super::fails;
use std::process::Command;

#[test]
fn bad_arguments_are_refused_clearly() {
    fails(&["generate", "--tokens", "1,x"], &["`x`"]);
    fails(
        &["generate", "--tokens", "99999"],
        &["99999", "out of range", "320"],
    );
    fails(
        &[
            "logits",
            "--tokens",
            "1,400",
            "--out",
            "/nonexistent/x.safetensors",
        ],
        &["400", "out of range"],
    );
    fails(
        &["generate", "--model", "nope", "--tokens", "1"],
        &["unknown model `nope`"],
    );
    fails(
        &["generate", "--tokens", "1", "--top-p", "1.5"],
        &["--top-p", "1.5"],
    );
    fails(
        &[
            "generate",
            "--tokens",
            "1",
            "--top-k",
            "0",
            "--temperature",
            "1",
        ],
        &["--top-k"],
    );
    fails(
        &["generate", "--tokens", "1", "--temperature", "-1"],
        &["--temperature must be"],
    );
    fails(
        &["generate", "--tokens", "1", "--top-p", "-0.5"],
        &["--top-p must be in (0, 1]"],
    );
    fails(
        &["generate", "--tokens", "1", "--prompt", "a"],
        &["cannot be used with"],
    );
    fails(&["generate"], &["--prompt"]);
    let long: Vec<String> = (0..600).map(|i| (i % 256).to_string()).collect();
    fails(
        &[
            "generate",
            "--tokens",
            &long.join(","),
            "--max-new-tokens",
            "0",
        ],
        &["600", "512", "context"],
    );
    fails(
        &["golden", "check", "/nonexistent/golden.safetensors"],
        &["/nonexistent/golden.safetensors"],
    );
    fails(&["bench", "--decode-tokens", "1"], &["--decode-tokens"]);
}

/// Without python3 on PATH, `fetch` says what to install (and touches no network).
#[test]
fn fetch_without_python_says_what_to_do() {
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_m2r2"))
        .args(["fetch", "smollm2"])
        .env("M2R2_CACHE", cache.path())
        .env("PATH", cache.path().join("no-such-bin"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("python3 is not installed") && stderr.contains("pip"),
        "{stderr}"
    );
    assert!(!cache.path().join("smollm2").exists());
}
