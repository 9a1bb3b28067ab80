//! Bad arguments are refused clearly, `fetch` without python3 says what to install, and a reader
//! that stops reading (`| head`) ends the command without a panic.

use super::fails;
use std::process::{Command, Stdio};

#[test]
fn bad_arguments_are_refused_clearly() {
    fails(&["generate", "--tokens", "1,x"], &["`x`"]);
    // a negative id reaches the parser's message, in every command that takes --tokens
    for command in [
        &["generate"][..],
        &["run", "--onnx", "x"],
        &["golden", "write"],
    ] {
        let args = [command, &["--tokens", "-1"]].concat();
        fails(&args, &["`-1` (item 1 of `-1`) is not a token id"]);
    }
    // a negative number reaches every option's own check (golden.rs: in subcommands too)
    // (clap alone calls `-3` an unexpected argument)
    let train_arla = [
        "train-arla",
        "--m2r2",
        "x",
        "--out",
        "y",
        "--data",
        "z",
        "--dev-data",
        "w",
    ];
    fails(
        &[&train_arla[..], &["--lr", "-3"]].concat(),
        &["--lr must be a finite number > 0, got -3"],
    );
    fails(
        &[&train_arla[..], &["--target-agreement", "-0.5"]].concat(),
        &["--target-agreement must be in (0, 1], got -0.5"],
    );
    // and missing ids are not taken from the next flag
    fails(
        &["generate", "--tokens", "--max-new-tokens", "5"],
        &["a value is required for '--tokens <IDS>'"],
    );
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
    fails(&["generate"], &["<--prompt <TEXT>|--tokens <IDS>>"]);
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
    // a write that fails is an I/O error naming the path, not a "corrupt" file
    let run = fails(
        &["logits", "--tokens", "1,2", "--out", "src"],
        &["cannot write src", "directory"],
    );
    assert!(!run.stderr.contains("corrupt"), "{}", run.stderr);
    // a name another format reads is refused before the work
    fails(
        &["logits", "--tokens", "1,2", "--out", "l.npy"],
        &["--out l.npy", "safetensors, not .npy"],
    );
}

/// A flag the run would not read is refused, never dropped silently: decoding flags of another
/// mode (`generate`, `golden write`, `run`), `--chat` with token ids, and `golden check
/// --expect-dtype` (which is about an export) beside `--model`, ONNX Runtime's flags in a `bench`
/// without `--onnx`. clap waives `requires` for an
/// argument that conflicts with one given, which had let the last two through.
#[test]
fn flags_the_run_would_not_read_are_refused() {
    let prompt = ["--tokens", "1,2"];
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &["generate", "--m2r2", "none"],
            &["--m2r2 is for --mode early-exit or --mode speculative"],
        ),
        (
            &["generate", "--draft-len", "3"],
            &[
                "--draft-len is for --mode speculative",
                "this run is --mode greedy",
            ],
        ),
        (
            &["generate", "--threshold", "0.5"],
            &["--threshold is for --mode early-exit or --mode speculative"],
        ),
        (
            &["generate", "--mode", "speculative", "--kv-policy", "exact"],
            &["--kv-policy is for --mode early-exit"],
        ),
        (
            &["generate", "--mode", "early-exit", "--dynamic-draft"],
            &["--dynamic-draft is for --mode speculative"],
        ),
        (
            &[
                "golden",
                "write",
                "--out",
                "/nonexistent/never-written.safetensors",
                "--draft-gate",
                "2",
            ],
            &["--draft-gate is for --mode speculative"],
        ),
        (
            &["run", "--onnx", "no-such-export", "--draft-head", "off"],
            &["--draft-head is for --mode speculative"],
        ),
    ];
    for (command, needles) in cases {
        fails(&[command, &prompt[..]].concat(), needles);
    }
    // ONNX Runtime reads 0 intra-op threads as its default, not as a pool of N
    fails(
        &["run", "--onnx", "x", "--ort-threads", "0"],
        &["--ort-threads", "0 threads: give 1 or more"],
    );
    // bench without --onnx times the reference on the CPU: ONNX Runtime's flags have no session
    for flag in [
        &["--ep", "cuda"][..],
        &["--cuda-graph", "on"],
        &["--ort-threads", "2"],
    ] {
        fails(
            &[&["bench", "--repeats", "1"], flag].concat(),
            &[flag[0], "runs only with --onnx DIR"],
        );
    }
    fails(
        &["tune-drafting", "--data", "no-such-data", "--ep", "cuda"],
        &[
            "--ep sets up ONNX Runtime",
            "tune-drafting runs the reference",
        ],
    );
    fails(
        &["generate", "--tokens", "1", "--chat"],
        &["'--tokens <IDS>' cannot be used with '--chat'"],
    );
    fails(
        &[
            "golden",
            "check",
            "g.safetensors",
            "--model",
            "tiny",
            "--expect-dtype",
            "f16",
        ],
        &["'--model <MODEL>' cannot be used with '--expect-dtype <DTYPE>'"],
    );
    // the modes that read them still take them
    for flags in [
        &[
            "--mode",
            "early-exit",
            "--kv-policy",
            "fast-kv",
            "--threshold",
            "0.5",
        ][..],
        &[
            "--mode",
            "speculative",
            "--draft-len",
            "2",
            "--gate",
            "confidence",
            "--trace",
        ],
    ] {
        super::ok(&[&["generate", "--max-new-tokens", "2"], &prompt[..], flags].concat());
    }
    // sampling flags without --temperature decode greedily and say so
    let greedy = super::ok(&[
        "generate",
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "2",
        "--json",
    ]);
    let seeded = super::ok(&[
        "generate",
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "2",
        "--json",
        "--seed",
        "7",
        "--top-k",
        "3",
    ]);
    assert!(
        seeded
            .stderr
            .contains("note: --top-k/--seed: read only when sampling (--temperature > 0)"),
        "{}",
        seeded.stderr
    );
    assert!(!greedy.stderr.contains("note:"), "{}", greedy.stderr);
    assert_eq!(
        super::ids(&greedy.json()["tokens"]),
        super::ids(&seeded.json()["tokens"])
    );
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

/// `m2r2 info --json | head -c 0`: the pipe closes before the first write; the command ends on the
/// default SIGPIPE disposition (as `cat` does), not in a panic of `println!`.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_the_command_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_m2r2"))
        .args(["info", "--model", "tiny", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // the only read end: closed before the command can write
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("the binary ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}

/// The demo prints text: a model without a tokenizer is told so, without advice to pass
/// `--tokens`, which the demo does not take.
#[test]
fn demo_needs_a_tokenizer() {
    let dir = m2r2_tests::fixture_dir().join("hf").join("llama_gqa_tied");
    let run = fails(
        &["demo", "--model", dir.to_str().unwrap()],
        &["has no tokenizer", "the demo prints text"],
    );
    assert!(!run.stderr.contains("pass --tokens"), "{}", run.stderr);
}

/// Only commands that take `--tokens` advise it for a model without a tokenizer: `generate` does,
/// `distill-data` (chat prompts alone) says why it needs one instead.
#[test]
fn no_tokenizer_advice_fits_the_command() {
    let dir = m2r2_tests::fixture_dir().join("hf").join("llama_gqa_tied");
    let model = dir.to_str().unwrap();
    fails(
        &["generate", "--model", model, "--prompt", "hi"],
        &["has no tokenizer (no tokenizer.json in the folder); pass --tokens instead of --prompt"],
    );
    let out = tempfile::tempdir().unwrap();
    let prompts = out.path().join("p.jsonl");
    std::fs::write(&prompts, "{\"id\": \"a\", \"prompt\": \"hi\"}\n").unwrap();
    let run = fails(
        &[
            "distill-data",
            "--model",
            model,
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            out.path().join("d").to_str().unwrap(),
        ],
        &[
            "distill-data renders each prompt with the model's chat template: ",
            "has no tokenizer",
        ],
    );
    assert!(!run.stderr.contains("--tokens"), "{}", run.stderr);
}
